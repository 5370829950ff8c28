//! The host's membership of a device's multicast groups: the kernel must
//! let a group's frames in on a NIC with a multicast filter and tell the
//! switches (IGMP / MLD). urnic asks the kernel for it with UDP sockets
//! joined to the group (`IP_ADD_MEMBERSHIP` / `IPV6_JOIN_GROUP` on the
//! device's interface) for as long as a QP of the device is attached
//! ([`crate::mcast`]). The sockets are made in the network namespace the
//! device was opened in, whichever thread attaches.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::net::{Ipv6Addr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;

use rocev2::transport::attr::AddressVector;
use rocev2::transport::mcast::Gid;

/// The host side of a device's groups: UDP sockets holding the
/// memberships, several groups per socket (the kernel allows
/// `igmp_max_memberships`, 20 by default, per IPv4 socket; a full socket
/// answers ENOBUFS and the next group goes to a new one).
pub(crate) struct HostGroups {
    ifindex: u32,
    /// The namespace the device was opened in.
    netns: File,
    /// Sockets (closed once they hold no group) and how many groups each holds.
    sockets: Vec<Option<(UdpSocket, usize)>>,
    /// Group → index of the socket holding it.
    joined: HashMap<Gid, usize>,
}

impl HostGroups {
    /// Memberships on interface `ifindex` of the calling thread's namespace.
    pub(crate) fn new(ifindex: u32) -> io::Result<HostGroups> {
        Ok(HostGroups { ifindex, netns: File::open("/proc/thread-self/ns/net")?, sockets: Vec::new(), joined: HashMap::new() })
    }

    /// Join `gid` on the interface (no-op if joined).
    pub(crate) fn join(&mut self, gid: &Gid) -> io::Result<()> {
        if self.joined.contains_key(gid) {
            return Ok(());
        }
        let v4 = AddressVector::is_ipv4_mapped(gid);
        for (i, slot) in self.sockets.iter_mut().enumerate() {
            let Some((sock, n)) = slot else { continue };
            if is_v4(sock) != v4 {
                continue;
            }
            match membership(sock, self.ifindex, gid, true) {
                Ok(()) => {
                    *n += 1;
                    self.joined.insert(*gid, i);
                    return Ok(());
                }
                // This socket holds as many groups as the kernel allows.
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => continue,
                Err(e) => return Err(e),
            }
        }
        let sock = self.new_socket(v4)?;
        membership(&sock, self.ifindex, gid, true)?;
        let i = match self.sockets.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.sockets.push(None);
                self.sockets.len() - 1
            }
        };
        self.sockets[i] = Some((sock, 1));
        self.joined.insert(*gid, i);
        Ok(())
    }

    /// Leave `gid` (IGMP / MLD leave); a socket left without a group closes.
    pub(crate) fn leave(&mut self, gid: &Gid) {
        let Some(i) = self.joined.remove(gid) else { return };
        let Some(Some((sock, n))) = self.sockets.get_mut(i) else { return };
        if let Err(e) = membership(sock, self.ifindex, gid, false) {
            tracing::debug!(group = %crate::gid_to_string(gid), error = %e, "leaving a multicast group on the host");
        }
        *n -= 1;
        if *n == 0 {
            self.sockets[i] = None;
        }
    }

    /// A UDP socket of the family in the device's namespace, whichever
    /// thread asks: another namespace's caller has a thread of our own
    /// enter the device's and make it there (a socket keeps its namespace).
    fn new_socket(&self, v4: bool) -> io::Result<UdpSocket> {
        let here = std::fs::metadata("/proc/thread-self/ns/net")?;
        let ours = self.netns.metadata()?;
        if (here.dev(), here.ino()) == (ours.dev(), ours.ino()) {
            return udp_socket(v4);
        }
        let fd = self.netns.as_fd().try_clone_to_owned()?;
        std::thread::scope(|s| {
            s.spawn(move || {
                // SAFETY: a valid namespace fd; setns affects only this thread.
                if unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                udp_socket(v4)
            })
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the namespace thread panicked")))
        })
    }
}

fn is_v4(s: &UdpSocket) -> bool {
    s.local_addr().map(|a| a.is_ipv4()).unwrap_or(false)
}

/// An unbound-port UDP socket of the family (it receives nothing: the XDP
/// program steers the group's RoCE frames to urnic before the stack).
fn udp_socket(v4: bool) -> io::Result<UdpSocket> {
    UdpSocket::bind(if v4 { "0.0.0.0:0" } else { "[::]:0" })
}

/// Join (`add`) or leave group `gid` on interface `ifindex` through `sock`:
/// `IP_ADD_MEMBERSHIP` / `IP_DROP_MEMBERSHIP` with an `ip_mreqn`, or
/// `IPV6_JOIN_GROUP` / `IPV6_LEAVE_GROUP`.
fn membership(sock: &UdpSocket, ifindex: u32, gid: &Gid, add: bool) -> io::Result<()> {
    if AddressVector::is_ipv4_mapped(gid) {
        let mreq = libc::ip_mreqn {
            imr_multiaddr: libc::in_addr { s_addr: u32::from_ne_bytes([gid[12], gid[13], gid[14], gid[15]]) },
            imr_address: libc::in_addr { s_addr: 0 },
            imr_ifindex: ifindex as i32,
        };
        let opt = if add { libc::IP_ADD_MEMBERSHIP } else { libc::IP_DROP_MEMBERSHIP };
        // SAFETY: a valid socket and a correctly sized ip_mreqn.
        let r = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::IPPROTO_IP,
                opt,
                (&mreq as *const libc::ip_mreqn).cast(),
                std::mem::size_of::<libc::ip_mreqn>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    } else if add {
        sock.join_multicast_v6(&Ipv6Addr::from(*gid), ifindex)
    } else {
        sock.leave_multicast_v6(&Ipv6Addr::from(*gid), ifindex)
    }
}
