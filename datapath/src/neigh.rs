//! Neighbour resolution from the kernel's neighbour table (rtnetlink
//! `RTM_GETNEIGH`), triggering ARP/ND when the peer is not there yet.
//!
//! The kernel keeps answering ARP and neighbour solicitation for us (the XDP
//! program passes everything that is not RoCEv2 to it), so its table is the
//! source of truth, as for a hardware RoCE NIC's driver: rxe resolves a
//! RoCEv2 destination GID through the IP stack too (`ib_resolve_eth_dmac` →
//! `rdma_addr_find_l2_eth_by_grh`), link-local ones (fe80::/10, the GID at
//! index 0) included, scoped to the netdev of the source GID.
//!
//! The messages are built and parsed by `netlink-packet-route`, the socket
//! is `netlink-sys`'s (synchronous, with a receive timeout).

use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV6, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST};
use netlink_packet_route::neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr as NetlinkAddr};

/// NUD states with a usable link-layer address: REACHABLE, STALE, DELAY,
/// PROBE, NOARP, PERMANENT (not INCOMPLETE or FAILED).
const NUD_USABLE: u16 = 0x02 | 0x04 | 0x08 | 0x10 | 0x40 | 0x80;
/// Receive buffer for one dump datagram: the kernel fills at most 32 KiB
/// per datagram (`netlink_dump`, `max_recvmsg_len`).
const RECV_BUF: usize = 64 * 1024;
/// How often an unanswered ARP/ND is triggered again while resolving.
const RETRIGGER: Duration = Duration::from_millis(250);

/// Why the neighbour table could not be read.
#[derive(Debug, thiserror::Error)]
pub enum NeighError {
    /// A reply that does not parse as rtnetlink messages (never a panic).
    #[error("malformed rtnetlink neighbour reply: {0}")]
    Malformed(String),
    /// The kernel answered the dump with an error (`NLMSG_ERROR`).
    #[error("the kernel refused the neighbour dump: {0}")]
    Kernel(io::Error),
    /// The netlink socket failed (send, receive, or the receive timeout).
    #[error("rtnetlink socket: {0}")]
    Io(#[from] io::Error),
}

impl From<NeighError> for io::Error {
    fn from(e: NeighError) -> io::Error {
        match e {
            NeighError::Malformed(_) => io::Error::new(io::ErrorKind::InvalidData, e),
            NeighError::Kernel(err) | NeighError::Io(err) => err,
        }
    }
}

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

    /// The entry of one `RTM_NEWNEIGH` message: `None` for one without an
    /// IPv4/IPv6 destination (another family's table).
    fn from_message(msg: &NeighbourMessage) -> Option<Neighbour> {
        let mut ip = None;
        let mut mac = None;
        for attr in &msg.attributes {
            match attr {
                NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => ip = Some(IpAddr::V4(*a)),
                NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => ip = Some(IpAddr::V6(*a)),
                // Ethernet entries only: other link layers have other lengths.
                NeighbourAttribute::LinkLayerAddress(l) => mac = <[u8; 6]>::try_from(l.as_slice()).ok(),
                _ => {}
            }
        }
        Some(Neighbour { ip: ip?, mac, state: u16::from(msg.header.state), ifindex: msg.header.ifindex })
    }
}

/// The `RTM_GETNEIGH` dump request with sequence number `seq`, for both
/// families (`AF_UNSPEC`: the ARP and the ND table).
pub fn dump_request(seq: u32) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    header.sequence_number = seq;
    let mut get = NeighbourMessage::default();
    get.header.family = AddressFamily::Unspec;
    let mut msg = NetlinkMessage::new(header, NetlinkPayload::from(RouteNetlinkMessage::GetNeighbour(get)));
    msg.finalize();
    let mut buf = vec![0; msg.buffer_len()];
    msg.serialize(&mut buf);
    buf
}

/// Parse the messages of one `RTM_GETNEIGH` dump reply datagram, appending
/// the entries to `out`. Messages of another sequence number than `seq` (a
/// late reply to an earlier dump that timed out) are skipped. Returns
/// whether the dump is complete (`NLMSG_DONE` seen).
///
/// A message that does not parse is an error ([`NeighError::Malformed`]),
/// as is an `NLMSG_ERROR` with a non-zero code ([`NeighError::Kernel`]).
pub fn parse_neigh_dump(buf: &[u8], seq: u32, out: &mut Vec<Neighbour>) -> Result<bool, NeighError> {
    let mut off = 0;
    while off < buf.len() {
        let rest = &buf[off..];
        let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(rest).map_err(|e| NeighError::Malformed(format!("at byte {off}: {e}")))?;
        // `deserialize` checked 16 <= length <= rest.len(); messages are
        // 4-byte aligned (NLMSG_ALIGN), the last one maybe without padding.
        let len = msg.header.length as usize;
        off += len.next_multiple_of(4).min(rest.len());
        if msg.header.sequence_number != seq {
            continue;
        }
        match msg.payload {
            NetlinkPayload::Done(_) => return Ok(true),
            NetlinkPayload::Error(e) if e.code.is_some() => return Err(NeighError::Kernel(e.to_io())),
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewNeighbour(n)) => out.extend(Neighbour::from_message(&n)),
            _ => {}
        }
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
    netlink: Socket,
    udp4: Option<UdpSocket>,
    udp6: Option<UdpSocket>,
    seq: u32,
    buf: Vec<u8>,
}

impl Neighbours {
    /// Open the netlink and trigger sockets in the calling thread's network
    /// namespace, for interface `ifindex`. `timeout` bounds how long
    /// [`Neighbours::resolve`] waits for ARP/ND.
    pub fn new(ifindex: u32, timeout: Duration) -> io::Result<Neighbours> {
        let mut netlink = Socket::new(NETLINK_ROUTE)?;
        netlink.bind_auto()?;
        // Port 0: the kernel.
        netlink.connect(&NetlinkAddr::new(0, 0))?;
        // Receive timeout so a lost reply cannot hang the caller.
        let tv = libc::timeval { tv_sec: 1, tv_usec: 0 };
        // SAFETY: SO_RCVTIMEO takes a timeval of the given size; the fd is
        // the socket's, open for the duration of the call.
        let rc = unsafe {
            libc::setsockopt(
                netlink.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const libc::timeval as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // Either may be missing (a kernel without IPv6): triggering that
        // family then fails with a clear error, lookups still work.
        let udp4 = UdpSocket::bind("0.0.0.0:0").ok();
        let udp6 = UdpSocket::bind("[::]:0").ok();
        let buf = Vec::with_capacity(RECV_BUF);
        Ok(Neighbours { ifindex, inner: Mutex::new(Sockets { netlink, udp4, udp6, seq: 1, buf }), timeout })
    }

    /// Every entry of the kernel's neighbour table on our interface.
    pub fn dump(&self) -> io::Result<Vec<Neighbour>> {
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let s = &mut *guard;
        s.seq = s.seq.wrapping_add(1);
        let seq = s.seq;
        s.netlink.send(&dump_request(seq), 0)?;
        let mut all = Vec::new();
        loop {
            s.buf.clear();
            let n = s.netlink.recv(&mut s.buf, 0)?;
            if n > s.buf.len() {
                return Err(NeighError::Malformed(format!("a {n}-byte datagram does not fit the {RECV_BUF}-byte buffer")).into());
            }
            if parse_neigh_dump(&s.buf, seq, &mut all)? {
                break;
            }
        }
        all.retain(|n| n.ifindex == self.ifindex);
        Ok(all)
    }

    /// The MAC of `ip` on our interface if the kernel knows it now. Entries
    /// are matched on interface and address: a link-local address (fe80::/10)
    /// names a different host on each link.
    pub fn lookup(&self, ip: IpAddr) -> io::Result<Option<[u8; 6]>> {
        Ok(self.dump()?.iter().find(|n| n.ifindex == self.ifindex && n.ip == ip).and_then(Neighbour::usable_mac))
    }

    /// Make the kernel resolve `ip`: an empty UDP datagram to its discard
    /// port (9) makes it send ARP or a neighbour solicitation. A link-local
    /// IPv6 address goes out with our interface as its scope (as
    /// `fe80::1%eth0`), otherwise the kernel could not route it.
    pub fn trigger(&self, ip: IpAddr) -> io::Result<()> {
        let s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let sock = match ip {
            IpAddr::V4(_) => s.udp4.as_ref(),
            IpAddr::V6(_) => s.udp6.as_ref(),
        };
        let sock = sock.ok_or_else(|| io::Error::new(io::ErrorKind::Unsupported, format!("no UDP socket for {ip}'s address family")))?;
        sock.send_to(&[], self.trigger_addr(ip)).map(|_| ())
    }

    /// Where [`Neighbours::trigger`] sends its datagram.
    fn trigger_addr(&self, ip: IpAddr) -> SocketAddr {
        match ip {
            IpAddr::V6(v6) if is_link_local(&v6) => SocketAddr::V6(SocketAddrV6::new(v6, 9, 0, self.ifindex)),
            _ => SocketAddr::new(ip, 9),
        }
    }

    /// The MAC of `ip`: from the table, or after ARP/ND within the timeout.
    pub fn resolve(&self, ip: IpAddr) -> Option<[u8; 6]> {
        if let Ok(Some(mac)) = self.lookup(ip) {
            return Some(mac);
        }
        let start = Instant::now();
        let deadline = start + self.timeout;
        let mut next_trigger = start;
        let mut last_err: Option<String> = None;
        while Instant::now() < deadline {
            if Instant::now() >= next_trigger {
                // A failed trigger (IPv6 disabled on the interface, no
                // route, our own link-local address still tentative) is
                // retried: the last reason is logged if nothing answers.
                match self.trigger(ip) {
                    Ok(()) => last_err = None,
                    Err(e) => last_err = Some(e.to_string()),
                }
                next_trigger = Instant::now() + RETRIGGER;
            }
            std::thread::sleep(Duration::from_millis(5));
            match self.lookup(ip) {
                Ok(Some(mac)) => return Some(mac),
                Ok(None) => {}
                Err(e) => last_err = Some(format!("reading the neighbour table: {e}")),
            }
        }
        let what = if ip.is_ipv4() { "ARP" } else { "neighbour discovery" };
        match last_err {
            Some(err) => tracing::debug!(%ip, ifindex = self.ifindex, timeout = ?self.timeout, %err, "{what} failed"),
            None => tracing::debug!(%ip, ifindex = self.ifindex, timeout = ?self.timeout, "{what} got no answer"),
        }
        None
    }
}

/// fe80::/10 (RFC 4291 2.5.6).
fn is_link_local(a: &Ipv6Addr) -> bool {
    a.segments()[0] & 0xffc0 == 0xfe80
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    const NLMSG_ERROR: u16 = 2;
    const NLMSG_DONE: u16 = 3;
    const RTM_NEWNEIGH: u16 = 28;
    const NDA_DST: u16 = 1;
    const NDA_LLADDR: u16 = 2;
    const HDR: usize = 16;
    const NDMSG: usize = 12;

    // The replies are built by hand, byte by byte as the kernel lays them
    // out (netlink(7), rtnetlink(7)), so the parser is checked against the
    // format rather than against itself.
    fn msg(ty: u16, seq: u32, body: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&((HDR + body.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&ty.to_ne_bytes());
        m.extend_from_slice(&0x2u16.to_ne_bytes()); // NLM_F_MULTI
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&[0; 4]);
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

    fn neigh(seq: u32, family: u8, ifindex: i32, state: u16, dst: &[u8], mac: Option<[u8; 6]>) -> Vec<u8> {
        let mut b = vec![family, 0, 0, 0];
        b.extend_from_slice(&ifindex.to_ne_bytes());
        b.extend_from_slice(&state.to_ne_bytes());
        b.extend_from_slice(&[0, 0]);
        b.extend(attr(NDA_DST, dst));
        if let Some(m) = mac {
            b.extend(attr(NDA_LLADDR, &m));
        }
        msg(RTM_NEWNEIGH, seq, &b)
    }

    const LL: [u8; 16] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0x75, 0x72, 0xff, 0xfe, 0, 0, 2];

    #[test]
    fn parses_ipv4_and_ipv6_entries_and_done() {
        let mac = [2, 0, 0, 0, 0, 7];
        let mut buf = neigh(5, libc::AF_INET as u8, 3, 0x02, &[10, 0, 0, 2], Some(mac));
        buf.extend(neigh(5, libc::AF_INET6 as u8, 3, 0x01, &[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9], None));
        buf.extend(neigh(5, libc::AF_INET6 as u8, 4, 0x04, &LL, Some(mac)));
        let mut out = Vec::new();
        assert!(!parse_neigh_dump(&buf, 5, &mut out).unwrap(), "no NLMSG_DONE yet");
        assert!(parse_neigh_dump(&msg(NLMSG_DONE, 5, &[0; 4]), 5, &mut out).unwrap());
        assert_eq!(out.len(), 3);
        assert_eq!(out[0].usable_mac(), Some(mac));
        assert_eq!(out[0].ip, IpAddr::from([10, 0, 0, 2]));
        assert_eq!(out[0].ifindex, 3);
        assert_eq!(out[1].usable_mac(), None, "INCOMPLETE has no usable MAC");
        assert_eq!(out[2], Neighbour { ip: IpAddr::from(LL), mac: Some(mac), state: 0x04, ifindex: 4 }, "a STALE link-local entry");
        assert_eq!(out[2].usable_mac(), Some(mac));
    }

    #[test]
    fn replies_to_another_dump_are_skipped() {
        let mut buf = neigh(4, libc::AF_INET as u8, 3, 0x02, &[10, 0, 0, 2], Some([1; 6]));
        buf.extend(msg(NLMSG_DONE, 4, &[0; 4]));
        buf.extend(neigh(5, libc::AF_INET as u8, 3, 0x02, &[10, 0, 0, 3], Some([2; 6])));
        let mut out = Vec::new();
        assert!(!parse_neigh_dump(&buf, 5, &mut out).unwrap(), "the DONE was the earlier dump's");
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].ip, IpAddr::from([10, 0, 0, 3]));
    }

    #[test]
    fn the_request_is_an_rtm_getneigh_dump() {
        let req = dump_request(0x1234);
        assert_eq!(req.len(), HDR + NDMSG);
        assert_eq!(u32::from_ne_bytes(req[0..4].try_into().unwrap()) as usize, req.len());
        assert_eq!(u16::from_ne_bytes([req[4], req[5]]), 30, "RTM_GETNEIGH");
        assert_eq!(u16::from_ne_bytes([req[6], req[7]]), 0x301, "NLM_F_REQUEST | NLM_F_DUMP");
        assert_eq!(u32::from_ne_bytes(req[8..12].try_into().unwrap()), 0x1234);
        assert_eq!(req[HDR], 0, "AF_UNSPEC: both tables");
    }

    #[test]
    fn malformed_replies_are_errors_not_panics() {
        let good = neigh(1, libc::AF_INET as u8, 3, 0x02, &[10, 0, 0, 2], Some([1; 6]));
        // Every truncation is an error (none is a complete message).
        for cut in 1..good.len() {
            let r = parse_neigh_dump(&good[..cut], 1, &mut Vec::new());
            assert!(matches!(r, Err(NeighError::Malformed(_))), "cut at {cut}: {r:?}");
        }
        // Attribute length 2 < 4 (its header alone is 4).
        let mut bad = good.clone();
        bad[HDR + NDMSG] = 2;
        assert!(matches!(parse_neigh_dump(&bad, 1, &mut Vec::new()), Err(NeighError::Malformed(_))));
        // An IPv4 destination of 3 bytes.
        let short = neigh(1, libc::AF_INET as u8, 3, 0x02, &[10, 0, 2], None);
        assert!(matches!(parse_neigh_dump(&short, 1, &mut Vec::new()), Err(NeighError::Malformed(_))));
        // A message length beyond the datagram.
        let mut long = good.clone();
        long[0..4].copy_from_slice(&(good.len() as u32 + 4).to_ne_bytes());
        assert!(matches!(parse_neigh_dump(&long, 1, &mut Vec::new()), Err(NeighError::Malformed(_))));
        // NLMSG_ERROR with -EPERM.
        let mut err = (-libc::EPERM).to_ne_bytes().to_vec();
        err.extend_from_slice(&dump_request(1));
        match parse_neigh_dump(&msg(NLMSG_ERROR, 1, &err), 1, &mut Vec::new()) {
            Err(NeighError::Kernel(e)) => assert_eq!(e.raw_os_error(), Some(libc::EPERM)),
            other => panic!("{other:?}"),
        }
        // Random corruption of a valid reply: any result but a panic.
        let mut reply = good.clone();
        reply.extend(neigh(1, libc::AF_INET6 as u8, 3, 0x04, &LL, Some([2; 6])));
        reply.extend(msg(NLMSG_DONE, 1, &[0; 4]));
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(19);
        for _ in 0..20_000 {
            let mut b = reply.clone();
            for _ in 0..rng.gen_range(1..4) {
                let i = rng.gen_range(0..b.len());
                b[i] = rng.gen();
            }
            let cut = rng.gen_range(0..=b.len());
            let _ = parse_neigh_dump(&b[..cut], 1, &mut Vec::new());
        }
    }

    #[test]
    fn link_local_triggers_carry_the_interface_as_scope() {
        let n = Neighbours::new(7, Duration::from_millis(1)).unwrap();
        let ll = IpAddr::from(LL);
        assert_eq!(n.trigger_addr(ll), SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(LL), 9, 0, 7)));
        let ula = IpAddr::from(Ipv6Addr::new(0xfd75, 0, 0, 0, 0, 0, 0, 2));
        assert_eq!(n.trigger_addr(ula), SocketAddr::new(ula, 9));
        assert_eq!(n.trigger_addr(IpAddr::from([10, 0, 0, 2])), SocketAddr::new(IpAddr::from([10, 0, 0, 2]), 9));
        assert!(is_link_local(&Ipv6Addr::new(0xfebf, 0, 0, 0, 0, 0, 0, 1)), "fe80::/10 reaches febf::");
        assert!(!is_link_local(&Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 1)));
    }
}
