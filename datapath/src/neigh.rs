//! Neighbour resolution from the kernel's neighbour table (rtnetlink
//! `RTM_GETNEIGH`), triggering ARP/ND when the peer is not there yet.
//!
//! The kernel keeps answering ARP and neighbour solicitation for us (the XDP
//! program passes everything that is not RoCEv2 to it), so its table is the
//! source of truth, as for a hardware RoCE NIC's driver.

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const RTM_NEWNEIGH: u16 = 28;
const RTM_GETNEIGH: u16 = 30;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;
/// NUD states with a usable link-layer address: REACHABLE, STALE, DELAY,
/// PROBE, NOARP, PERMANENT (not INCOMPLETE or FAILED).
const NUD_USABLE: u16 = 0x02 | 0x04 | 0x08 | 0x10 | 0x40 | 0x80;
const NLMSG_HDR: usize = 16;
const NDMSG: usize = 12;

/// One neighbour entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Neighbour {
    /// The peer's IP address.
    pub ip: IpAddr,
    /// Its MAC, if the entry has one.
    pub mac: Option<[u8; 6]>,
    /// NUD state bits (`NUD_*`).
    pub state: u16,
    /// Interface index.
    pub ifindex: u32,
}

impl Neighbour {
    /// The MAC, if the entry is in a usable state.
    pub fn usable_mac(&self) -> Option<[u8; 6]> {
        (self.state & NUD_USABLE != 0).then_some(self.mac).flatten()
    }
}

/// Parse the messages of one `RTM_GETNEIGH` dump reply buffer. Returns the
/// entries and whether the dump is complete (`NLMSG_DONE` seen). Malformed
/// messages end the parse (counted as done) rather than panic.
pub fn parse_neigh_dump(buf: &[u8], out: &mut Vec<Neighbour>) -> Result<bool, i32> {
    let mut off = 0;
    while off + NLMSG_HDR <= buf.len() {
        let len = u32::from_ne_bytes([buf[off], buf[off + 1], buf[off + 2], buf[off + 3]]) as usize;
        let ty = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
        if len < NLMSG_HDR || off + len > buf.len() {
            return Ok(true);
        }
        let msg = &buf[off..off + len];
        match ty {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let code = msg.get(16..20).map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]])).unwrap_or(-1);
                if code != 0 {
                    return Err(-code);
                }
            }
            RTM_NEWNEIGH if msg.len() >= NLMSG_HDR + NDMSG => {
                let nd = &msg[NLMSG_HDR..];
                let family = i32::from(nd[0]);
                let ifindex = i32::from_ne_bytes([nd[4], nd[5], nd[6], nd[7]]) as u32;
                let state = u16::from_ne_bytes([nd[8], nd[9]]);
                let mut ip = None;
                let mut mac = None;
                let mut a = NLMSG_HDR + NDMSG;
                while a + 4 <= msg.len() {
                    let alen = usize::from(u16::from_ne_bytes([msg[a], msg[a + 1]]));
                    let aty = u16::from_ne_bytes([msg[a + 2], msg[a + 3]]);
                    if alen < 4 || a + alen > msg.len() {
                        break;
                    }
                    let data = &msg[a + 4..a + alen];
                    match (aty, family, data.len()) {
                        (NDA_DST, libc::AF_INET, 4) => ip = Some(IpAddr::from(<[u8; 4]>::try_from(data).unwrap_or_default())),
                        (NDA_DST, libc::AF_INET6, 16) => ip = Some(IpAddr::from(<[u8; 16]>::try_from(data).unwrap_or_default())),
                        (NDA_LLADDR, _, 6) => mac = <[u8; 6]>::try_from(data).ok(),
                        _ => {}
                    }
                    a += (alen + 3) & !3;
                }
                if let Some(ip) = ip {
                    out.push(Neighbour { ip, mac, state, ifindex });
                }
            }
            _ => {}
        }
        off += (len + 3) & !3;
    }
    Ok(false)
}

/// A resolver bound to one interface of the namespace it was created in.
pub struct Neighbours {
    ifindex: u32,
    inner: Mutex<Sockets>,
    timeout: Duration,
}

struct Sockets {
    netlink: OwnedFd,
    udp4: Option<UdpSocket>,
    udp6: Option<UdpSocket>,
    seq: u32,
}

impl Neighbours {
    /// Open the netlink and trigger sockets in the calling thread's network
    /// namespace, for interface `ifindex`. `timeout` bounds how long
    /// [`Neighbours::resolve`] waits for ARP/ND.
    pub fn new(ifindex: u32, timeout: Duration) -> io::Result<Neighbours> {
        // SAFETY: plain socket(2); the fd is owned below.
        let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_ROUTE) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor we own.
        let netlink = unsafe { OwnedFd::from_raw_fd(fd) };
        // Receive timeout so a lost reply cannot hang the caller.
        let tv = libc::timeval { tv_sec: 1, tv_usec: 0 };
        // SAFETY: SO_RCVTIMEO takes a timeval of the given size.
        unsafe {
            libc::setsockopt(
                netlink.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const libc::timeval as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            );
        }
        let udp4 = UdpSocket::bind("0.0.0.0:0").ok();
        let udp6 = UdpSocket::bind("[::]:0").ok();
        Ok(Neighbours { ifindex, inner: Mutex::new(Sockets { netlink, udp4, udp6, seq: 1 }), timeout })
    }

    /// Every entry of the kernel's neighbour table on our interface.
    pub fn dump(&self) -> io::Result<Vec<Neighbour>> {
        let mut s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        s.seq = s.seq.wrapping_add(1);
        let mut req = [0u8; NLMSG_HDR + NDMSG];
        req[0..4].copy_from_slice(&((NLMSG_HDR + NDMSG) as u32).to_ne_bytes());
        req[4..6].copy_from_slice(&RTM_GETNEIGH.to_ne_bytes());
        req[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
        req[8..12].copy_from_slice(&s.seq.to_ne_bytes());
        // ndmsg: family AF_UNSPEC (both), rest zero.
        // SAFETY: sends `req.len()` bytes from `req` on our netlink socket
        // (destination: the kernel, the default for an unbound send).
        let n = unsafe { libc::send(s.netlink.as_raw_fd(), req.as_ptr() as *const libc::c_void, req.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut all = Vec::new();
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            // SAFETY: receives at most buf.len() bytes into buf.
            let n = unsafe { libc::recv(s.netlink.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            match parse_neigh_dump(&buf[..n as usize], &mut all) {
                Ok(true) => break,
                Ok(false) => {}
                Err(errno) => return Err(io::Error::from_raw_os_error(errno)),
            }
        }
        all.retain(|n| n.ifindex == self.ifindex);
        Ok(all)
    }

    /// The MAC of `ip` if the kernel knows it now.
    pub fn lookup(&self, ip: IpAddr) -> io::Result<Option<[u8; 6]>> {
        Ok(self.dump()?.iter().find(|n| n.ip == ip).and_then(Neighbour::usable_mac))
    }

    /// Make the kernel resolve `ip`: an empty UDP datagram to its discard
    /// port (9) makes it send ARP or a neighbour solicitation.
    pub fn trigger(&self, ip: IpAddr) -> io::Result<()> {
        let s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let sock = match ip {
            IpAddr::V4(_) => s.udp4.as_ref(),
            IpAddr::V6(_) => s.udp6.as_ref(),
        };
        let sock = sock.ok_or_else(|| io::Error::new(io::ErrorKind::Unsupported, "no UDP socket for this address family"))?;
        let dst = match ip {
            IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80 => SocketAddr::V6(std::net::SocketAddrV6::new(v6, 9, 0, self.ifindex)),
            _ => SocketAddr::new(ip, 9),
        };
        sock.send_to(&[], dst).map(|_| ())
    }

    /// The MAC of `ip`: from the table, or after ARP/ND within the timeout.
    pub fn resolve(&self, ip: IpAddr) -> Option<[u8; 6]> {
        if let Ok(Some(mac)) = self.lookup(ip) {
            return Some(mac);
        }
        let deadline = Instant::now() + self.timeout;
        let mut next_trigger = Instant::now();
        while Instant::now() < deadline {
            if Instant::now() >= next_trigger {
                let _ = self.trigger(ip);
                next_trigger = Instant::now() + Duration::from_millis(250);
            }
            std::thread::sleep(Duration::from_millis(5));
            if let Ok(Some(mac)) = self.lookup(ip) {
                return Some(mac);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(ty: u16, body: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&((NLMSG_HDR + body.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&ty.to_ne_bytes());
        m.extend_from_slice(&[0; 10]);
        m.extend_from_slice(body);
        while m.len() % 4 != 0 {
            m.push(0);
        }
        m
    }

    fn attr(ty: u16, data: &[u8]) -> Vec<u8> {
        let mut a = Vec::new();
        a.extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
        a.extend_from_slice(&ty.to_ne_bytes());
        a.extend_from_slice(data);
        while a.len() % 4 != 0 {
            a.push(0);
        }
        a
    }

    fn neigh(family: u8, ifindex: i32, state: u16, dst: &[u8], mac: Option<[u8; 6]>) -> Vec<u8> {
        let mut b = vec![family, 0, 0, 0];
        b.extend_from_slice(&ifindex.to_ne_bytes());
        b.extend_from_slice(&state.to_ne_bytes());
        b.extend_from_slice(&[0, 0]);
        b.extend(attr(NDA_DST, dst));
        if let Some(m) = mac {
            b.extend(attr(NDA_LLADDR, &m));
        }
        msg(RTM_NEWNEIGH, &b)
    }

    #[test]
    fn parses_ipv4_and_ipv6_entries_and_done() {
        let mac = [2, 0, 0, 0, 0, 7];
        let mut buf = neigh(libc::AF_INET as u8, 3, 0x02, &[10, 0, 0, 2], Some(mac));
        buf.extend(neigh(libc::AF_INET6 as u8, 3, 0x01, &[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9], None));
        buf.extend(msg(NLMSG_DONE, &[0; 4]));
        let mut out = Vec::new();
        assert_eq!(parse_neigh_dump(&buf, &mut out), Ok(true));
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].usable_mac(), Some(mac));
        assert_eq!(out[0].ip, IpAddr::from([10, 0, 0, 2]));
        assert_eq!(out[1].usable_mac(), None, "INCOMPLETE has no usable MAC");
    }

    #[test]
    fn malformed_replies_do_not_panic() {
        let good = neigh(libc::AF_INET as u8, 3, 0x02, &[10, 0, 0, 2], Some([1; 6]));
        for cut in 0..good.len() {
            let mut out = Vec::new();
            let _ = parse_neigh_dump(&good[..cut], &mut out);
        }
        let mut bad = good.clone();
        bad[NLMSG_HDR + NDMSG] = 2; // attribute length 2 < 4
        let mut out = Vec::new();
        let _ = parse_neigh_dump(&bad, &mut out);
        let err = msg(NLMSG_ERROR, &(-libc::EPERM).to_ne_bytes());
        assert_eq!(parse_neigh_dump(&err, &mut Vec::new()), Err(libc::EPERM));
    }
}
