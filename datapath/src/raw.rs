//! Raw Ethernet frames sent as they are out of one interface (an
//! `AF_PACKET`/`SOCK_RAW` socket): what an attacker, or a test playing one,
//! puts on a segment — forged RoCEv2 frames, malformed or random bytes.
//!
//! Nothing is added to or checked in the frame: the caller writes the
//! Ethernet header and everything after it (see `rocev2::wire` to build and
//! seal RoCEv2 frames). The socket belongs to the network namespace of the
//! thread that opened it ([`RawSender::open_in`] opens it in a named one)
//! and can be used from any thread afterwards, like the AF_XDP sockets (see
//! [`crate::netns`]). Needs `CAP_NET_RAW`.
//!
//! ```no_run
//! use urnic_datapath::raw::RawSender;
//! let tx = RawSender::open_in(Some("urnic-lab-1234-0-c"), "u2")?;
//! let mut frame = vec![0u8; 60];
//! frame[..6].copy_from_slice(&[0x02, 0x75, 0x72, 0, 0, 2]); // destination MAC
//! frame[6..12].copy_from_slice(&tx.mac()); // source MAC
//! tx.send(&frame)?;
//! # Ok::<(), urnic_datapath::raw::RawError>(())
//! ```

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::netdev::Interface;

/// Shortest frame the sender accepts: an Ethernet header (the kernel pads
/// frames shorter than the 60-byte minimum itself).
pub const MIN_FRAME: usize = 14;

/// Why a raw sender could not be opened or a frame not sent.
#[derive(Debug, thiserror::Error)]
pub enum RawError {
    /// Entering the named network namespace failed (no such namespace, or
    /// no `CAP_SYS_ADMIN`).
    #[error("raw sender: {0}")]
    Netns(#[source] io::Error),
    /// `socket(AF_PACKET, SOCK_RAW)` failed: typically `EPERM` without
    /// `CAP_NET_RAW`.
    #[error("raw sender: AF_PACKET socket (needs CAP_NET_RAW): {0}")]
    Socket(#[source] io::Error),
    /// The interface is not in the namespace, is not Ethernet, or its name
    /// is invalid.
    #[error("raw sender: interface {ifname}: {source}")]
    Interface {
        /// Interface name asked for.
        ifname: String,
        /// What the lookup said.
        source: io::Error,
    },
    /// Binding the socket to the interface failed.
    #[error("raw sender: bind to {ifname}: {source}")]
    Bind {
        /// Interface name.
        ifname: String,
        /// The `bind(2)` error.
        source: io::Error,
    },
    /// The frame is shorter than an Ethernet header.
    #[error("raw sender: a {len}-byte frame has no Ethernet header")]
    TooShort {
        /// Its length.
        len: usize,
    },
    /// The frame is longer than the interface carries (`EMSGSIZE`).
    #[error("raw sender: a {len}-byte frame exceeds the interface's MTU {mtu}")]
    TooLong {
        /// Its length.
        len: usize,
        /// The interface's MTU (bytes of IP packet; the frame may have 14,
        /// or 18 with a VLAN tag, more).
        mtu: u32,
    },
    /// The kernel refused the frame (`ENOBUFS`: the interface's queue or its
    /// peer's ring is full and the frame was dropped; `ENETDOWN`: the link is
    /// down; ...).
    #[error("raw sender: send: {0}")]
    Send(#[source] io::Error),
    /// The kernel took only part of the frame (does not happen on Linux
    /// `AF_PACKET`; reported rather than assumed away).
    #[error("raw sender: only {sent} of {len} bytes sent")]
    Short {
        /// Bytes the kernel reported sent.
        sent: usize,
        /// Frame length.
        len: usize,
    },
}

impl RawError {
    /// Whether sending the same frame again later may succeed (`ENOBUFS`,
    /// `EAGAIN`): the frame was dropped for lack of room, not refused.
    pub fn is_transient(&self) -> bool {
        match self {
            RawError::Send(e) => matches!(e.raw_os_error(), Some(libc::ENOBUFS) | Some(libc::EAGAIN)),
            _ => false,
        }
    }
}

/// An `AF_PACKET` socket bound to one interface that sends whole Ethernet
/// frames as given. It receives nothing (protocol 0: no frame is queued to
/// it). Closed on drop.
#[derive(Debug)]
pub struct RawSender {
    fd: OwnedFd,
    iface: Interface,
}

impl RawSender {
    /// Open a sender on `ifname` in the calling thread's network namespace.
    pub fn open(ifname: &str) -> Result<RawSender, RawError> {
        let iface = Interface::query(ifname).map_err(|source| RawError::Interface { ifname: ifname.to_string(), source })?;
        // Protocol 0: the socket is bound for sending only and never has
        // frames queued to it (ETH_P_ALL would copy every frame of the
        // interface into a receive queue nobody reads).
        // SAFETY: plain socket(2); the fd is owned below.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(RawError::Socket(io::Error::last_os_error()));
        }
        // SAFETY: fd is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = 0;
        sll.sll_ifindex = iface.index as i32;
        // SAFETY: bind reads exactly size_of::<sockaddr_ll>() bytes of `sll`.
        let r = unsafe {
            libc::bind(fd.as_raw_fd(), &sll as *const libc::sockaddr_ll as *const libc::sockaddr, std::mem::size_of::<libc::sockaddr_ll>() as u32)
        };
        if r != 0 {
            return Err(RawError::Bind { ifname: ifname.to_string(), source: io::Error::last_os_error() });
        }
        Ok(RawSender { fd, iface })
    }

    /// Open a sender on `ifname` in network namespace `netns` (`None`: the
    /// caller's), from a short-lived thread that enters it.
    pub fn open_in(netns: Option<&str>, ifname: &str) -> Result<RawSender, RawError> {
        let ifname = ifname.to_string();
        crate::netns::in_netns(netns, move || RawSender::open(&ifname)).map_err(RawError::Netns)?
    }

    /// Send one frame (Ethernet header first, no FCS). Returns once the
    /// kernel has taken it; whether it reaches anyone is up to the segment.
    pub fn send(&self, frame: &[u8]) -> Result<(), RawError> {
        if frame.len() < MIN_FRAME {
            return Err(RawError::TooShort { len: frame.len() });
        }
        loop {
            // SAFETY: reads frame.len() bytes from frame.
            let n = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr() as *const libc::c_void, frame.len(), 0) };
            if n >= 0 {
                let sent = n as usize;
                return if sent == frame.len() { Ok(()) } else { Err(RawError::Short { sent, len: frame.len() }) };
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EMSGSIZE) => return Err(RawError::TooLong { len: frame.len(), mtu: self.iface.mtu }),
                _ => return Err(RawError::Send(e)),
            }
        }
    }

    /// The interface's MAC address (the natural Ethernet source of frames
    /// sent from it; a bridge learns whatever source it sees).
    pub fn mac(&self) -> [u8; 6] {
        self.iface.mac
    }

    /// The interface's name.
    pub fn ifname(&self) -> &str {
        &self.iface.name
    }

    /// The interface's index in its namespace.
    pub fn ifindex(&self) -> u32 {
        self.iface.index
    }

    /// The interface's MTU (bytes of IP packet).
    pub fn mtu(&self) -> u32 {
        self.iface.mtu
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_interface_or_namespace_is_a_typed_error() {
        match RawSender::open("urnic-none0") {
            Err(RawError::Interface { ifname, .. }) => assert_eq!(ifname, "urnic-none0"),
            other => panic!("{other:?}"),
        }
        match RawSender::open("") {
            Err(RawError::Interface { .. }) => {}
            other => panic!("{other:?}"),
        }
        match RawSender::open_in(Some("urnic-no-such-namespace"), "u0") {
            Err(RawError::Netns(e)) => assert!(e.to_string().contains("urnic-no-such-namespace"), "{e}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn only_a_full_send_queue_is_transient() {
        assert!(RawError::Send(io::Error::from_raw_os_error(libc::ENOBUFS)).is_transient());
        assert!(RawError::Send(io::Error::from_raw_os_error(libc::EAGAIN)).is_transient());
        assert!(!RawError::Send(io::Error::from_raw_os_error(libc::ENETDOWN)).is_transient());
        assert!(!RawError::TooShort { len: 3 }.is_transient());
        assert_eq!(RawError::TooLong { len: 9000, mtu: 1500 }.to_string(), "raw sender: a 9000-byte frame exceeds the interface's MTU 1500");
    }
}
