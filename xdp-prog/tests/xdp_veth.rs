//! urnic's XDP program on a real veth pair between two network namespaces:
//! namespace A (`10.77.0.1`, the program on its veth end) and namespace B
//! (`10.77.0.2`, the sender). Traffic comes from kernel UDP sockets, from
//! `ping`, from hand-made frames on an AF_PACKET socket (VLAN tags,
//! fragments, truncated and malformed headers) and lands in kernel sockets or
//! in a minimal AF_XDP socket; the program's per-reason counters must move by
//! exactly the expected amounts.
//!
//! Needs root (namespaces, veth, BPF). Without it every test FAILS — they do
//! not skip. Each test has its own namespaces (`urnxdp-{a,b}-<tag>-<pid>`),
//! deleted by a guard even when the test fails. In-process work enters a
//! namespace with `setns` on a scoped thread (sockets stay in the namespace
//! they were created in; the XDP link stays on its interface).

use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use urnic_xdp::{ifindex_of, AttachMode, Faults, Impairments, XdpConfig, XdpCounters, XdpError, XdpProgram, DEFAULT_UDP_PORT};

const IF_A: &str = "uxa";
const IF_B: &str = "uxb";
const IP_A: [u8; 4] = [10, 77, 0, 1];
const IP_B: [u8; 4] = [10, 77, 0, 2];
/// On the link, routed by B to A's MAC, but not an address of A.
const IP_STRANGER: [u8; 4] = [10, 77, 0, 99];
const IP6_A: [u8; 16] = [0xfd, 0x77, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
const IP6_B: [u8; 16] = [0xfd, 0x77, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
const MAC_A: [u8; 6] = [0x02, 0x77, 0, 0, 0, 0x01];
const MAC_B: [u8; 6] = [0x02, 0x77, 0, 0, 0, 0x02];
const PORT: u16 = DEFAULT_UDP_PORT;
const OTHER_PORT: u16 = 5000;

/// Counters that end a frame's journey through the program: exactly one of
/// them counts each frame, so their sum is `seen`.
const TERMINAL: [&str; 8] =
    ["redirected", "pass_not_ip", "pass_not_udp", "pass_other_port", "pass_not_ours", "pass_malformed", "pass_no_socket", "impair_dropped"];

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "urnic-xdp's veth tests need root (network namespaces, veth, BPF, AF_XDP): run them as root. They fail rather than skip.");
}

/// Run a command, panic with its output if it fails; its stdout.
fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("running {cmd}: {e}"));
    assert!(
        out.status.success(),
        "`{cmd} {}` failed: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Run `f` on a new thread that has entered the network namespace `ns`
/// (`setns` on its `/var/run/netns` file); panics propagate.
fn in_ns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    let path = format!("/var/run/netns/{ns}");
    std::thread::scope(|s| {
        let h = s.spawn(move || {
            let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            // SAFETY: a network namespace fd; only this thread moves.
            let r = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(r, 0, "setns({path}): {}", std::io::Error::last_os_error());
            f()
        });
        match h.join() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        }
    })
}

/// Two namespaces joined by a veth pair; both deleted on drop.
struct Topo {
    a: String,
    b: String,
}

#[derive(Clone, Copy)]
struct TopoOpts {
    /// IPv6 addresses (fd77::1, fd77::2); otherwise IPv6 is disabled, so no
    /// neighbour discovery or MLD frames disturb the counters.
    ipv6: bool,
    /// Permanent neighbour entries both ways, so no ARP either.
    static_neigh: bool,
}

impl Topo {
    fn new(tag: &str, opts: TopoOpts) -> Topo {
        require_root();
        let pid = std::process::id();
        sweep_stale_namespaces();
        let t = Topo { a: format!("urnxdp-a-{tag}-{pid}"), b: format!("urnxdp-b-{tag}-{pid}") };
        for ns in [&t.a, &t.b] {
            // Leftovers of a crashed run that had the same pid.
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
            run("ip", &["netns", "add", ns]);
            let ipv6_off = if opts.ipv6 { "0" } else { "1" };
            in_ns(ns, || {
                for (k, v) in [
                    ("net/ipv6/conf/all/disable_ipv6", ipv6_off),
                    ("net/ipv6/conf/default/disable_ipv6", ipv6_off),
                    ("net/ipv6/conf/all/router_solicitations", "0"),
                    ("net/ipv6/conf/default/router_solicitations", "0"),
                ] {
                    let p = format!("/proc/sys/{k}");
                    std::fs::write(&p, v).unwrap_or_else(|e| panic!("{p}: {e}"));
                }
            });
        }
        let mac = |m: [u8; 6]| m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":");
        let (mac_a, mac_b) = (mac(MAC_A), mac(MAC_B));
        run("ip", &["-n", &t.a, "link", "add", IF_A, "address", &mac_a, "type", "veth", "peer", "name", IF_B, "address", &mac_b, "netns", &t.b]);
        for (ns, ifname, v4, v6) in [(&t.a, IF_A, "10.77.0.1/24", "fd77::1/64"), (&t.b, IF_B, "10.77.0.2/24", "fd77::2/64")] {
            run("ip", &["-n", ns, "addr", "add", v4, "dev", ifname]);
            if opts.ipv6 {
                run("ip", &["-n", ns, "-6", "addr", "add", v6, "dev", ifname, "nodad"]);
            }
            run("ip", &["-n", ns, "link", "set", "lo", "up"]);
            run("ip", &["-n", ns, "link", "set", ifname, "up"]);
        }
        let neigh = |ns: &str, ip: &str, lladdr: &str, dev: &str| {
            run("ip", &["-n", ns, "neigh", "replace", ip, "lladdr", lladdr, "dev", dev, "nud", "permanent"]);
        };
        // The stranger is always resolved: B sends to it through A's MAC.
        neigh(&t.b, "10.77.0.99", &mac_a, IF_B);
        if opts.static_neigh {
            neigh(&t.b, "10.77.0.1", &mac_a, IF_B);
            neigh(&t.a, "10.77.0.2", &mac_b, IF_A);
            if opts.ipv6 {
                neigh(&t.b, "fd77::1", &mac_a, IF_B);
                neigh(&t.a, "fd77::2", &mac_b, IF_A);
            }
        }
        t
    }

    fn a<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        in_ns(&self.a, f)
    }

    fn b<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        in_ns(&self.b, f)
    }

    /// Load and attach the program to A's veth end.
    fn attach(&self, cfg: &XdpConfig) -> Result<XdpProgram, XdpError> {
        self.a(|| XdpProgram::attach(ifindex_of(IF_A)?, cfg))
    }

    /// The XDP mode `ip link` reports on A's veth end, if any.
    fn link_xdp(&self) -> Option<String> {
        let out = run("ip", &["-n", &self.a, "link", "show", IF_A]);
        let first = out.lines().next().unwrap_or_default().to_string();
        first.split_whitespace().find(|w| w.starts_with("xdp")).map(str::to_string)
    }
}

impl Drop for Topo {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

/// Delete the namespaces of earlier runs that were killed before their
/// guards ran (`urnxdp-*-<pid>` whose process is gone).
fn sweep_stale_namespaces() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else { return };
    for name in String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(pid) = name.strip_prefix("urnxdp-").and_then(|n| n.rsplit('-').next()) else { continue };
        if pid.parse::<u32>().is_ok() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("ip").args(["netns", "del", name]).output();
        }
    }
}

fn quiet() -> TopoOpts {
    TopoOpts { ipv6: false, static_neigh: true }
}

// ---------------------------------------------------------------- counters --

fn as_map(c: &XdpCounters) -> BTreeMap<&'static str, u64> {
    c.iter().collect()
}

/// Wait until the program has seen the frames `expected` accounts for, then
/// check that every counter moved by exactly the expected amount (`seen` by
/// the sum of the terminal ones); counters named in `noise` may move freely
/// (e.g. ARP, MLD), `seen` with them. Returns the new counters.
fn expect_moves(prog: &XdpProgram, before: &XdpCounters, expected: &[(&str, u64)], noise: &[&str]) -> XdpCounters {
    expect_moves_in("", prog, before, expected, noise)
}

/// [`expect_moves`], naming the case `what` when it fails.
fn expect_moves_in(what: &str, prog: &XdpProgram, before: &XdpCounters, expected: &[(&str, u64)], noise: &[&str]) -> XdpCounters {
    let want_seen: u64 = expected.iter().filter(|(k, _)| TERMINAL.contains(k)).map(|(_, v)| v).sum();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let c = prog.counters().expect("reading counters");
        if c.seen - before.seen >= want_seen || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // Anything unexpected arrives meanwhile too.
    std::thread::sleep(Duration::from_millis(60));
    let after = prog.counters().expect("reading counters");
    let (b, a) = (as_map(before), as_map(&after));
    let got: BTreeMap<&str, u64> = a.iter().map(|(k, v)| (*k, v - b[k])).collect();
    let mut want: BTreeMap<&str, u64> = got.keys().map(|k| (*k, 0)).collect();
    for (k, v) in expected {
        *want.get_mut(k).unwrap_or_else(|| panic!("no counter named {k}")) = *v;
    }
    for k in noise {
        want.insert(k, got[k]);
    }
    let seen = TERMINAL.iter().map(|k| want[k]).sum();
    want.insert("seen", seen);
    let nonzero = |m: &BTreeMap<&str, u64>| m.iter().filter(|(_, v)| **v != 0).map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>();
    assert_eq!(got, want, "{what}: counter deltas: got {:?}, want {:?} (free: {noise:?})", nonzero(&got), nonzero(&want));
    after
}

// ------------------------------------------------------------- UDP sockets --

fn setopt(fd: RawFd, level: libc::c_int, name: libc::c_int, val: libc::c_int) {
    // SAFETY: an int option of the given size.
    let r = unsafe { libc::setsockopt(fd, level, name, &val as *const libc::c_int as *const libc::c_void, 4) };
    assert_eq!(r, 0, "setsockopt({level}, {name}, {val}): {}", std::io::Error::last_os_error());
}

/// A kernel UDP socket in A on `port` (IPv4 or IPv6), reporting the TOS /
/// traffic class of what it receives.
fn receiver(t: &Topo, port: u16, v6: bool) -> UdpSocket {
    t.a(|| {
        let s = if v6 { UdpSocket::bind(("::", port)) } else { UdpSocket::bind(("0.0.0.0", port)) }.unwrap_or_else(|e| panic!("bind {port}: {e}"));
        s.set_read_timeout(Some(Duration::from_millis(250))).expect("read timeout");
        setopt(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 8 << 20);
        if v6 {
            setopt(s.as_raw_fd(), libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, 1);
        } else {
            setopt(s.as_raw_fd(), libc::IPPROTO_IP, libc::IP_RECVTOS, 1);
        }
        s
    })
}

/// A kernel UDP socket in B sending with TOS / traffic class `tos`; with
/// `no_check`, IPv4 datagrams carry no UDP checksum (so a corrupted payload
/// still reaches the receiving socket).
fn sender(t: &Topo, tos: u8, no_check: bool, v6: bool) -> UdpSocket {
    t.b(|| {
        let s = if v6 { UdpSocket::bind("[::]:0") } else { UdpSocket::bind("0.0.0.0:0") }.expect("bind sender");
        if v6 {
            setopt(s.as_raw_fd(), libc::IPPROTO_IPV6, libc::IPV6_TCLASS, tos.into());
        } else {
            setopt(s.as_raw_fd(), libc::IPPROTO_IP, libc::IP_TOS, tos.into());
        }
        if no_check {
            setopt(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_NO_CHECK, 1);
        }
        s
    })
}

fn send_n(s: &UdpSocket, to: SocketAddr, payload: &[u8], n: usize) {
    for _ in 0..n {
        let sent = s.send_to(payload, to).unwrap_or_else(|e| panic!("send to {to}: {e}"));
        assert_eq!(sent, payload.len());
    }
}

fn v4(ip: [u8; 4], port: u16) -> SocketAddr {
    SocketAddr::from((ip, port))
}

fn v6(ip: [u8; 16], port: u16) -> SocketAddr {
    SocketAddr::from((ip, port))
}

/// One datagram and its TOS (IPv4) or traffic class (IPv6), or None after
/// the read timeout.
fn recv_tos(s: &UdpSocket) -> Option<(Vec<u8>, u8)> {
    let mut buf = vec![0u8; 65536];
    let mut cmsg = [0u64; 16];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr() as *mut libc::c_void, iov_len: buf.len() };
    // SAFETY: msghdr is plain data; recvmsg writes only into the buffers it
    // is given; the CMSG macros walk the control buffer the kernel filled.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cmsg.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = std::mem::size_of_val(&cmsg);
        let n = libc::recvmsg(s.as_raw_fd(), &mut msg, 0);
        if n < 0 {
            return None;
        }
        let mut tos = None;
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            match ((*c).cmsg_level, (*c).cmsg_type) {
                (libc::IPPROTO_IP, libc::IP_TOS) => tos = Some(*libc::CMSG_DATA(c)),
                (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => tos = Some(std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int) as u8),
                _ => {}
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
        buf.truncate(n as usize);
        Some((buf, tos.expect("no TOS / traffic class control message")))
    }
}

/// Everything the socket receives until it has been quiet for its timeout.
fn drain(s: &UdpSocket) -> Vec<(Vec<u8>, u8)> {
    std::iter::from_fn(|| recv_tos(s)).collect()
}

fn bits_differing(a: &[u8], b: &[u8]) -> u32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x ^ y).count_ones()).sum()
}

fn ping_from_b(t: &Topo) -> std::process::Output {
    Command::new("ip").args(["netns", "exec", &t.b, "ping", "-c", "2", "-W", "1", "10.77.0.1"]).output().expect("running ping")
}

// ------------------------------------------------------------------ frames --

/// Internet checksum (RFC 1071) of `data`.
fn csum(data: &[u8]) -> u16 {
    let mut sum: u32 = data.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn eth(ethertype: u16) -> Vec<u8> {
    let mut f = Vec::with_capacity(128);
    f.extend_from_slice(&MAC_A);
    f.extend_from_slice(&MAC_B);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f
}

/// A VLAN tag (its TPID goes where the ethertype was) then `inner`.
fn vlan_tag(f: &mut Vec<u8>, vid: u16, inner: u16) {
    f.extend_from_slice(&vid.to_be_bytes());
    f.extend_from_slice(&inner.to_be_bytes());
}

struct Ip4 {
    ihl: u8,
    proto: u8,
    frag: u16,
    dst: [u8; 4],
}

impl Default for Ip4 {
    fn default() -> Self {
        Ip4 { ihl: 5, proto: libc::IPPROTO_UDP as u8, frag: 0, dst: IP_A }
    }
}

/// An IPv4 header (options: NOPs up to `ihl`) with a valid checksum, then
/// `l4` (length fields as if nothing were truncated).
fn ipv4(f: &mut Vec<u8>, h: &Ip4, l4: &[u8]) {
    let hlen = usize::from(h.ihl.max(5)) * 4;
    let mut ip = vec![0u8; hlen];
    ip[0] = 0x40 | h.ihl;
    ip[2..4].copy_from_slice(&((hlen + l4.len()) as u16).to_be_bytes());
    ip[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
    ip[6..8].copy_from_slice(&h.frag.to_be_bytes());
    ip[8] = 64;
    ip[9] = h.proto;
    ip[12..16].copy_from_slice(&IP_B);
    ip[16..20].copy_from_slice(&h.dst);
    for b in &mut ip[20..] {
        *b = 1; // NOP
    }
    let c = csum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(l4);
}

fn ipv6(f: &mut Vec<u8>, next: u8, dst: [u8; 16], l4: &[u8]) {
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&(l4.len() as u16).to_be_bytes());
    f.extend_from_slice(&[next, 64]);
    f.extend_from_slice(&IP6_B);
    f.extend_from_slice(&dst);
    f.extend_from_slice(l4);
}

/// A UDP header (no checksum) and payload.
fn udp(dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut u = Vec::with_capacity(8 + payload.len());
    u.extend_from_slice(&40000u16.to_be_bytes());
    u.extend_from_slice(&dport.to_be_bytes());
    u.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(payload);
    u
}

/// An AF_PACKET socket in B sending whole frames out of B's veth end.
struct RawTx {
    fd: OwnedFd,
    ifindex: i32,
}

impl RawTx {
    fn open(t: &Topo) -> RawTx {
        t.b(|| {
            // SAFETY: plain socket creation.
            let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
            assert!(fd >= 0, "AF_PACKET socket: {}", std::io::Error::last_os_error());
            // SAFETY: a fresh fd we own.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            RawTx { fd, ifindex: ifindex_of(IF_B).expect("B's veth end") as i32 }
        })
    }

    fn send(&self, frame: &[u8]) {
        // SAFETY: sockaddr_ll is plain data.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = u16::from_ne_bytes([frame[12], frame[13]]);
        sll.sll_ifindex = self.ifindex;
        sll.sll_halen = 6;
        sll.sll_addr[..6].copy_from_slice(&MAC_A);
        // SAFETY: the frame and address are valid for the lengths given.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                frame.as_ptr() as *const libc::c_void,
                frame.len(),
                0,
                &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(n, frame.len() as isize, "AF_PACKET send: {}", std::io::Error::last_os_error());
    }
}

// ------------------------------------------------------- a tiny AF_XDP rx --

const XSK_FRAMES: u32 = 64;
const XSK_FRAME: u32 = 4096;

/// One mmapped AF_XDP ring.
struct Ring {
    map: *mut libc::c_void,
    len: usize,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    desc: *mut u8,
}

impl Ring {
    /// # Safety
    /// `fd` is an AF_XDP socket whose ring at `pgoff` has `XSK_FRAMES`
    /// entries of `desc_size` bytes, laid out as `off` says.
    unsafe fn map(fd: RawFd, off: &libc::xdp_ring_offset, pgoff: libc::off_t, desc_size: usize) -> Ring {
        let len = off.desc as usize + XSK_FRAMES as usize * desc_size;
        let map = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_POPULATE, fd, pgoff);
        assert_ne!(map, libc::MAP_FAILED, "mmap AF_XDP ring: {}", std::io::Error::last_os_error());
        let at = |o: u64| (map as *mut u8).add(o as usize);
        Ring { map, len, producer: at(off.producer) as *const AtomicU32, consumer: at(off.consumer) as *const AtomicU32, desc: at(off.desc) }
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: an aligned u32 in the mapping, which lives as long as self.
        unsafe { &*self.producer }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as for producer.
        unsafe { &*self.consumer }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: our own mapping.
        unsafe { libc::munmap(self.map, self.len) };
    }
}

/// A receive-only AF_XDP socket in copy mode, with its own UMEM: just
/// enough to see what the program redirects.
struct Xsk {
    fd: OwnedFd,
    umem: *mut u8,
    fill: Ring,
    rx: Ring,
}

// SAFETY: the raw pointers are private mappings used by one thread at a time.
unsafe impl Send for Xsk {}

impl Xsk {
    /// Bind to `queue` of `ifindex` in the calling thread's namespace.
    fn open(ifindex: u32, queue: u32) -> Xsk {
        let umem_len = (XSK_FRAMES * XSK_FRAME) as usize;
        // SAFETY: socket, mmap, setsockopt and bind with buffers and sizes
        // that match the kernel's structures (libc's if_xdp.h mirrors).
        unsafe {
            let fd = libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0);
            assert!(fd >= 0, "AF_XDP socket: {}", std::io::Error::last_os_error());
            let fd = OwnedFd::from_raw_fd(fd);
            let raw = fd.as_raw_fd();
            let umem = libc::mmap(
                std::ptr::null_mut(),
                umem_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            );
            assert_ne!(umem, libc::MAP_FAILED, "mmap UMEM: {}", std::io::Error::last_os_error());
            let reg =
                libc::xdp_umem_reg { addr: umem as u64, len: umem_len as u64, chunk_size: XSK_FRAME, headroom: 0, flags: 0, tx_metadata_len: 0 };
            let r = libc::setsockopt(
                raw,
                libc::SOL_XDP,
                libc::XDP_UMEM_REG,
                &reg as *const libc::xdp_umem_reg as *const libc::c_void,
                std::mem::size_of::<libc::xdp_umem_reg>() as u32,
            );
            assert_eq!(r, 0, "XDP_UMEM_REG: {}", std::io::Error::last_os_error());
            for opt in [libc::XDP_UMEM_FILL_RING, libc::XDP_UMEM_COMPLETION_RING, libc::XDP_RX_RING] {
                setopt(raw, libc::SOL_XDP, opt, XSK_FRAMES as libc::c_int);
            }
            let mut off: libc::xdp_mmap_offsets = std::mem::zeroed();
            let mut optlen = std::mem::size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
            let r = libc::getsockopt(
                raw,
                libc::SOL_XDP,
                libc::XDP_MMAP_OFFSETS,
                &mut off as *mut libc::xdp_mmap_offsets as *mut libc::c_void,
                &mut optlen,
            );
            assert_eq!(r, 0, "XDP_MMAP_OFFSETS: {}", std::io::Error::last_os_error());
            let fill = Ring::map(raw, &off.fr, libc::XDP_UMEM_PGOFF_FILL_RING as libc::off_t, 8);
            let rx = Ring::map(raw, &off.rx, libc::XDP_PGOFF_RX_RING, std::mem::size_of::<libc::xdp_desc>());
            for i in 0..XSK_FRAMES {
                std::ptr::write_unaligned((fill.desc as *mut u64).add(i as usize), u64::from(i * XSK_FRAME));
            }
            fill.producer().store(XSK_FRAMES, Ordering::Release);
            let sxdp = libc::sockaddr_xdp {
                sxdp_family: libc::AF_XDP as u16,
                sxdp_flags: libc::XDP_COPY,
                sxdp_ifindex: ifindex,
                sxdp_queue_id: queue,
                sxdp_shared_umem_fd: 0,
            };
            let r = libc::bind(raw, &sxdp as *const libc::sockaddr_xdp as *const libc::sockaddr, std::mem::size_of::<libc::sockaddr_xdp>() as u32);
            assert_eq!(r, 0, "bind AF_XDP socket to ifindex {ifindex} queue {queue}: {}", std::io::Error::last_os_error());
            Xsk { fd, umem: umem as *mut u8, fill, rx }
        }
    }

    fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Frames received until `want` have arrived or `timeout` passed.
    fn recv(&mut self, want: usize, timeout: Duration) -> Vec<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        let mut out = Vec::new();
        loop {
            let prod = self.rx.producer().load(Ordering::Acquire);
            let mut cons = self.rx.consumer().load(Ordering::Relaxed);
            while cons != prod {
                // SAFETY: descriptors between consumer and producer are
                // ours to read; their frames lie inside the UMEM.
                unsafe {
                    let d = std::ptr::read_unaligned((self.rx.desc as *const libc::xdp_desc).add((cons % XSK_FRAMES) as usize));
                    assert!(d.addr + u64::from(d.len) <= u64::from(XSK_FRAMES * XSK_FRAME), "descriptor outside the UMEM");
                    out.push(std::slice::from_raw_parts(self.umem.add(d.addr as usize), d.len as usize).to_vec());
                    // Give the frame back to the kernel.
                    let fp = self.fill.producer().load(Ordering::Relaxed);
                    std::ptr::write_unaligned((self.fill.desc as *mut u64).add((fp % XSK_FRAMES) as usize), d.addr & !u64::from(XSK_FRAME - 1));
                    self.fill.producer().store(fp.wrapping_add(1), Ordering::Release);
                }
                cons = cons.wrapping_add(1);
            }
            self.rx.consumer().store(cons, Ordering::Release);
            if out.len() >= want || Instant::now() > deadline {
                return out;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Xsk {
    fn drop(&mut self) {
        // SAFETY: our own mapping (the kernel keeps its pages pinned until
        // the socket closes, right after this).
        unsafe { libc::munmap(self.umem as *mut libc::c_void, (XSK_FRAMES * XSK_FRAME) as usize) };
    }
}

/// (TOS, IPv4 header checksum valid, UDP destination port, UDP payload) of
/// an untagged IPv4/UDP frame.
fn parse_v4_udp(f: &[u8]) -> (u8, bool, u16, Vec<u8>) {
    assert!(f.len() >= 14 + 20 + 8, "short frame: {f:02x?}");
    assert_eq!(&f[0..6], &MAC_A);
    assert_eq!(u16::from_be_bytes([f[12], f[13]]), 0x0800);
    let ip = &f[14..];
    let hlen = usize::from(ip[0] & 0xf) * 4;
    assert_eq!(ip[9], libc::IPPROTO_UDP as u8);
    assert_eq!(&ip[16..20], &IP_A);
    let csum_ok = csum(&ip[..hlen]) == 0;
    let u = &ip[hlen..];
    let ulen = usize::from(u16::from_be_bytes([u[4], u[5]]));
    (ip[1], csum_ok, u16::from_be_bytes([u[2], u[3]]), u[8..ulen].to_vec())
}

// ------------------------------------------------------------------- tests --

#[test]
fn kernel_keeps_arp_icmp_and_other_traffic_and_each_reason_is_counted() {
    // Neighbours resolved by ARP here, to see it pass.
    let t = Topo::new("pass", TopoOpts { ipv6: false, static_neigh: false });
    let prog = t.attach(&XdpConfig { ipv4: vec![IP_A], mode: AttachMode::Generic, ..XdpConfig::default() }).expect("attach");
    assert_eq!(prog.mode(), AttachMode::Generic);
    assert_eq!(prog.ifindex(), t.a(|| ifindex_of(IF_A)).expect("ifindex"));
    let c0 = prog.counters().expect("counters");
    assert_eq!(c0, XdpCounters::default(), "fresh program, fresh counters");

    // ARP and ICMP echo pass to the kernel: ping works through the program.
    let ping = ping_from_b(&t);
    assert!(ping.status.success(), "ping through the XDP program failed: {}", String::from_utf8_lossy(&ping.stdout));
    let c1 = expect_moves(&prog, &c0, &[("pass_not_udp", 2)], &["pass_not_ip"]);
    assert!(c1.pass_not_ip >= 1, "B's ARP request passed through the program: {c1:?}");

    // Our port, no AF_XDP socket on the queue: to the kernel, counted.
    let (rx, rx_other) = (receiver(&t, PORT, false), receiver(&t, OTHER_PORT, false));
    let tx = sender(&t, 0, false, false);
    send_n(&tx, v4(IP_A, PORT), b"roce?", 5);
    let c2 = expect_moves(&prog, &c1, &[("pass_no_socket", 5)], &["pass_not_ip"]);
    assert_eq!(drain(&rx).len(), 5, "the kernel socket gets our port's datagrams");

    // Another UDP port.
    send_n(&tx, v4(IP_A, OTHER_PORT), b"other", 4);
    let c3 = expect_moves(&prog, &c2, &[("pass_other_port", 4)], &["pass_not_ip"]);
    assert_eq!(drain(&rx_other).len(), 4);

    // Our port to an address on the link that is not ours (the kernel of A
    // drops it: not a local address, no forwarding).
    send_n(&tx, v4(IP_STRANGER, PORT), b"whose?", 3);
    let c4 = expect_moves(&prog, &c3, &[("pass_not_ours", 3)], &["pass_not_ip"]);
    assert!(drain(&rx).is_empty());

    // Our own address dropped from the list: not ours any more, still the
    // kernel's.
    prog.set_addresses(&[[10, 77, 0, 50], [192, 168, 1, 1]], &[]).expect("set_addresses");
    send_n(&tx, v4(IP_A, PORT), b"not ours now", 3);
    let c5 = expect_moves(&prog, &c4, &[("pass_not_ours", 3)], &["pass_not_ip"]);
    assert_eq!(drain(&rx).len(), 3);

    // One of eight again (the last slot), and with no addresses: any.
    let mut eight = vec![[10, 77, 1, 0]; 7];
    eight.push(IP_A);
    prog.set_addresses(&eight, &[]).expect("set_addresses");
    send_n(&tx, v4(IP_A, PORT), b"ours", 2);
    let c6 = expect_moves(&prog, &c5, &[("pass_no_socket", 2)], &["pass_not_ip"]);
    prog.set_addresses(&[], &[]).expect("set_addresses");
    send_n(&tx, v4(IP_STRANGER, PORT), b"anyone's", 2);
    expect_moves(&prog, &c6, &[("pass_no_socket", 2)], &["pass_not_ip"]);
    assert_eq!(drain(&rx).len(), 2);

    // Still pingable at the end.
    assert!(ping_from_b(&t).status.success());
    // The names are the struct's, in order.
    let names: Vec<_> = prog.counters().expect("counters").iter().map(|(k, _)| k).collect();
    assert_eq!(
        names,
        [
            "seen",
            "redirected",
            "pass_not_ip",
            "pass_not_udp",
            "pass_other_port",
            "pass_not_ours",
            "pass_malformed",
            "pass_no_socket",
            "impair_dropped",
            "impair_ce_marked",
            "impair_corrupted"
        ]
    );
}

#[test]
fn attach_modes_native_generic_auto_detach_on_drop() {
    let t = Topo::new("modes", quiet());
    let rx = receiver(&t, PORT, false);
    let tx = sender(&t, 0, false, false);
    assert_eq!(t.link_xdp(), None, "no program before");
    for mode in [AttachMode::Native, AttachMode::Generic, AttachMode::Auto] {
        let prog = t.attach(&XdpConfig { mode, ..XdpConfig::default() }).unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        let want = if mode == AttachMode::Generic { AttachMode::Generic } else { AttachMode::Native };
        assert_eq!(prog.mode(), want, "{mode:?} (veth supports native XDP)");
        let shown = t.link_xdp();
        let want_shown = if want == AttachMode::Native { "xdp" } else { "xdpgeneric" };
        assert_eq!(shown.as_deref(), Some(want_shown), "ip link after attaching in {mode:?}");

        // It runs in that mode: our datagrams are counted, and pass.
        let c0 = prog.counters().expect("counters");
        send_n(&tx, v4(IP_A, PORT), b"mode", 3);
        expect_moves(&prog, &c0, &[("pass_no_socket", 3)], &[]);
        assert_eq!(drain(&rx).len(), 3);

        // One program per interface: a second one is refused, naming the
        // modes it tried.
        match t.attach(&XdpConfig::default()) {
            Err(XdpError::Attach(m)) => assert!(m.contains("Native") && m.contains("Generic"), "{m}"),
            Err(e) => panic!("second attach in {mode:?}: wrong error {e}"),
            Ok(p) => panic!("second attach in {mode:?} succeeded in {:?}", p.mode()),
        }
        // Dropped on this (root namespace) thread: detached from A's veth.
        drop(prog);
        assert_eq!(t.link_xdp(), None, "still attached after dropping the {mode:?} program");
    }
    // Without a program the kernel gets everything as before.
    send_n(&tx, v4(IP_A, PORT), b"bare", 2);
    assert_eq!(drain(&rx).len(), 2);
}

fn impairments(mode: AttachMode, tag: &str) {
    let t = Topo::new(tag, quiet());
    let prog = t.attach(&XdpConfig { ipv4: vec![IP_A], mode, ..XdpConfig::default() }).expect("attach");
    assert_eq!(prog.mode(), mode);
    let rx = receiver(&t, PORT, false);
    let rx_other = receiver(&t, OTHER_PORT, false);
    let tx = sender(&t, 2, false, false); // ECT(0)
    let tx_not_ect = sender(&t, 0, false, false);
    let tx_ect1 = sender(&t, 1, false, false);
    let tx_nocsum = sender(&t, 0, true, false);
    let mut c = prog.counters().expect("counters");

    // Drop everything of ours; other ports untouched.
    prog.set_impairments(&Impairments::from(Faults { loss: 1.0, ..Faults::NONE })).expect("impairments");
    send_n(&tx, v4(IP_A, PORT), b"drop me", 20);
    send_n(&tx, v4(IP_A, OTHER_PORT), b"keep me", 2);
    c = expect_moves(&prog, &c, &[("impair_dropped", 20), ("pass_other_port", 2)], &[]);
    assert!(drain(&rx).is_empty(), "dropped datagrams reached the kernel socket");
    assert_eq!(drain(&rx_other).len(), 2);

    // Drop nothing: all delivered (no AF_XDP socket: to the kernel).
    prog.set_impairments(&Impairments::from(Faults { loss: 0.0, ..Faults::NONE })).expect("impairments");
    send_n(&tx, v4(IP_A, PORT), b"keep me", 20);
    c = expect_moves(&prog, &c, &[("pass_no_socket", 20)], &[]);
    assert_eq!(drain(&rx).len(), 20);

    // Half: about half (400 tries; 10 standard deviations either side).
    prog.set_impairments(&Impairments::from(Faults { loss: 0.5, ..Faults::NONE })).expect("impairments");
    let before = c;
    send_n(&tx, v4(IP_A, PORT), b"maybe", 400);
    let deadline = Instant::now() + Duration::from_secs(5);
    while prog.counters().expect("counters").seen - before.seen < 400 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(60));
    c = prog.counters().expect("counters");
    let dropped = c.impair_dropped - before.impair_dropped;
    assert_eq!(dropped + c.pass_no_socket - before.pass_no_socket, 400, "{c:?}");
    assert!((100..=300).contains(&dropped), "loss 0.5 dropped {dropped} of 400");
    assert_eq!(drain(&rx).len() as u64, 400 - dropped);

    // CE marking of ECN-capable datagrams, with a valid IPv4 header checksum
    // afterwards (the kernel drops datagrams whose header checksum fails).
    prog.set_impairments(&Impairments::from(Faults { ecn_mark: 1.0, ..Faults::NONE })).expect("impairments");
    send_n(&tx, v4(IP_A, PORT), b"mark me", 5);
    c = expect_moves(&prog, &c, &[("pass_no_socket", 5), ("impair_ce_marked", 5)], &[]);
    let got = drain(&rx);
    assert_eq!(got.len(), 5, "CE-marked datagrams must arrive (IPv4 header checksum updated)");
    assert!(got.iter().all(|(p, tos)| p == b"mark me" && *tos == 3), "TOS: {:?}", got.iter().map(|g| g.1).collect::<Vec<_>>());
    // ECT(1) too.
    send_n(&tx_ect1, v4(IP_A, PORT), b"ect1", 2);
    c = expect_moves(&prog, &c, &[("pass_no_socket", 2), ("impair_ce_marked", 2)], &[]);
    assert!(drain(&rx).iter().all(|(_, tos)| *tos == 3));
    // Not ECN-capable: left alone.
    send_n(&tx_not_ect, v4(IP_A, PORT), b"not-ect", 3);
    c = expect_moves(&prog, &c, &[("pass_no_socket", 3)], &[]);
    let got = drain(&rx);
    assert_eq!(got.len(), 3);
    assert!(got.iter().all(|(_, tos)| *tos == 0), "Not-ECT must not be marked");

    // Corruption: exactly one bit of the UDP payload flips (the sender puts
    // no UDP checksum on, so the kernel still delivers).
    prog.set_impairments(&Impairments::from(Faults { corrupt: 1.0, ..Faults::NONE })).expect("impairments");
    let payload: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
    send_n(&tx_nocsum, v4(IP_A, PORT), &payload, 10);
    c = expect_moves(&prog, &c, &[("pass_no_socket", 10), ("impair_corrupted", 10)], &[]);
    let got = drain(&rx);
    assert_eq!(got.len(), 10);
    for (p, _) in &got {
        assert_eq!(bits_differing(p, &payload), 1, "exactly one payload bit flipped");
    }
    // An empty payload has nothing to corrupt.
    send_n(&tx_nocsum, v4(IP_A, PORT), b"", 2);
    c = expect_moves(&prog, &c, &[("pass_no_socket", 2)], &[]);
    assert_eq!(drain(&rx).len(), 2);

    // All at once: drop wins, nothing else is counted for dropped frames.
    prog.set_impairments(&Impairments { faults: Faults { loss: 1.0, ecn_mark: 1.0, corrupt: 1.0, ..Faults::NONE }, ecn_mark_above_pps: 1 })
        .expect("impairments");
    send_n(&tx, v4(IP_A, PORT), b"gone", 3);
    c = expect_moves(&prog, &c, &[("impair_dropped", 3)], &[]);

    // Off again: clean delivery.
    prog.set_impairments(&Impairments::default()).expect("impairments");
    send_n(&tx, v4(IP_A, PORT), &payload, 3);
    expect_moves(&prog, &c, &[("pass_no_socket", 3)], &[]);
    let got = drain(&rx);
    assert_eq!(got.len(), 3);
    assert!(got.iter().all(|(p, tos)| *p == payload && *tos == 2));
}

#[test]
fn impairments_generic() {
    impairments(AttachMode::Generic, "impg");
}

#[test]
fn impairments_native() {
    impairments(AttachMode::Native, "impn");
}

#[test]
fn ce_above_a_packet_rate() {
    let t = Topo::new("rate", quiet());
    let prog = t.attach(&XdpConfig { ipv4: vec![IP_A], mode: AttachMode::Generic, ..XdpConfig::default() }).expect("attach");
    let rx = receiver(&t, PORT, false);
    let tx = sender(&t, 2, false, false);
    let tx_not_ect = sender(&t, 0, false, false);
    let mut c = prog.counters().expect("counters");

    // Limit 100 packets/s (an interval of 10 ms, as much burst tolerance).
    prog.set_impairments(&Impairments { ecn_mark_above_pps: 100, ..Default::default() }).expect("impairments");
    // Slower than that: nothing marked.
    for _ in 0..8 {
        send_n(&tx, v4(IP_A, PORT), b"slow", 1);
        std::thread::sleep(Duration::from_millis(30));
    }
    c = expect_moves(&prog, &c, &[("pass_no_socket", 8)], &[]);
    assert!(drain(&rx).iter().all(|(_, tos)| *tos == 2));

    // A burst far above it: all but the allowance are marked.
    std::thread::sleep(Duration::from_millis(50));
    let n = 300u64;
    let start = Instant::now();
    send_n(&tx, v4(IP_A, PORT), b"fast", n as usize);
    let before = c;
    c = expect_moves(&prog, &before, &[("pass_no_socket", n)], &["impair_ce_marked"]);
    let elapsed_ms = start.elapsed().as_millis() as u64;
    let marked = c.impair_ce_marked - before.impair_ce_marked;
    // Conforming: the burst tolerance (2) plus one per 10 ms of the burst
    // (measured generously, up to the counters' check).
    let allowance = 2 + elapsed_ms / 10 + 2;
    assert!(n - marked <= allowance, "{marked} of {n} marked in {elapsed_ms} ms at 100 pps (allowed unmarked: {allowance})");
    assert!(marked < n, "the first frame conforms");
    let got = drain(&rx);
    assert_eq!(got.len() as u64, n);
    assert_eq!(got.iter().filter(|(_, tos)| *tos == 3).count() as u64, marked, "marked frames arrive with CE");

    // Not ECN-capable: measured but never marked.
    std::thread::sleep(Duration::from_millis(50));
    send_n(&tx_not_ect, v4(IP_A, PORT), b"fast, not ECT", 100);
    c = expect_moves(&prog, &c, &[("pass_no_socket", 100)], &[]);
    assert!(drain(&rx).iter().all(|(_, tos)| *tos == 0));

    // A limit of 1 packet/s (an interval of 1 s, as much tolerance): of a
    // quick burst of 5, two conform and three are marked; the meter then
    // runs two seconds ahead.
    prog.set_impairments(&Impairments { ecn_mark_above_pps: 1, ..Default::default() }).expect("impairments");
    send_n(&tx, v4(IP_A, PORT), b"fast", 5);
    c = expect_moves(&prog, &c, &[("pass_no_socket", 5), ("impair_ce_marked", 3)], &[]);
    assert_eq!(drain(&rx).iter().filter(|(_, tos)| *tos == 3).count(), 3);

    // A limit far above the burst's rate: nothing marked — the meter
    // restarted when the limit changed (no debt carried over).
    prog.set_impairments(&Impairments { ecn_mark_above_pps: 100_000_000, ..Default::default() }).expect("impairments");
    send_n(&tx, v4(IP_A, PORT), b"fast", 200);
    expect_moves(&prog, &c, &[("pass_no_socket", 200)], &[]);
    let got = drain(&rx);
    assert_eq!(got.len(), 200);
    assert!(got.iter().all(|(_, tos)| *tos == 2));
}

fn parsing(mode: AttachMode, tag: &str) {
    let t = Topo::new(tag, quiet());
    let prog = t.attach(&XdpConfig { ipv4: vec![IP_A], mode, ..XdpConfig::default() }).expect("attach");
    assert_eq!(prog.mode(), mode);
    let raw = RawTx::open(&t);
    let ours = udp(PORT, b"roce");
    let other = udp(OTHER_PORT, b"other");

    let mut cases: Vec<(&str, Vec<u8>, &str)> = Vec::new();
    let mut f = eth(0x0800);
    ipv4(&mut f, &Ip4::default(), &ours);
    cases.push(("plain IPv4/UDP to our port", f, "pass_no_socket"));
    let mut f = eth(0x8100);
    vlan_tag(&mut f, 5, 0x0800);
    ipv4(&mut f, &Ip4::default(), &ours);
    cases.push(("802.1Q tag", f, "pass_no_socket"));
    let mut f = eth(0x88a8);
    vlan_tag(&mut f, 6, 0x0800);
    ipv4(&mut f, &Ip4::default(), &ours);
    cases.push(("802.1ad tag", f, "pass_no_socket"));
    let mut f = eth(0x8100);
    vlan_tag(&mut f, 5, 0x0800);
    ipv4(&mut f, &Ip4::default(), &other);
    cases.push(("802.1Q tag, other port", f, "pass_other_port"));
    let mut f = eth(0x88a8);
    vlan_tag(&mut f, 6, 0x8100);
    vlan_tag(&mut f, 7, 0x0800);
    ipv4(&mut f, &Ip4::default(), &ours);
    cases.push(("two tags (only one is skipped)", f, "pass_not_ip"));
    let mut f = eth(0x8100);
    f.extend_from_slice(&[0, 5]);
    cases.push(("truncated VLAN tag", f, "pass_malformed"));
    let mut f = eth(0x0800);
    ipv4(&mut f, &Ip4 { ihl: 6, ..Ip4::default() }, &ours);
    cases.push(("IPv4 options (IHL 6)", f, "pass_no_socket"));
    let mut f = eth(0x0800);
    ipv4(&mut f, &Ip4 { ihl: 15, ..Ip4::default() }, &ours);
    cases.push(("IPv4 options (IHL 15)", f, "pass_no_socket"));
    let mut f = eth(0x0800);
    ipv4(&mut f, &Ip4::default(), &ours);
    f[14] = 0x44;
    cases.push(("IHL 4", f, "pass_malformed"));
    let mut f = eth(0x0800);
    ipv4(&mut f, &Ip4::default(), &ours);
    f.truncate(14 + 12);
    cases.push(("truncated IPv4 header", f, "pass_malformed"));
    let mut f = eth(0x0800);
    ipv4(&mut f, &Ip4::default(), &ours);
    f.truncate(14 + 20 + 6);
    cases.push(("truncated UDP header", f, "pass_malformed"));
    let mut f = eth(0x0800);
    ipv4(&mut f, &Ip4 { ihl: 15, ..Ip4::default() }, &[]);
    f.truncate(14 + 40);
    cases.push(("IHL beyond the frame", f, "pass_malformed"));
    let mut f = eth(0x0800);
    ipv4(&mut f, &Ip4 { frag: 0x2000, ..Ip4::default() }, &ours);
    cases.push(("first fragment (MF, offset 0)", f, "pass_no_socket"));
    let mut f = eth(0x0800);
    ipv4(&mut f, &Ip4 { frag: 100, ..Ip4::default() }, &ours);
    cases.push(("later fragment (offset 800)", f, "pass_other_port"));
    let mut f = eth(0x0800);
    ipv4(&mut f, &Ip4 { proto: libc::IPPROTO_TCP as u8, ..Ip4::default() }, &[0u8; 20]);
    cases.push(("TCP", f, "pass_not_udp"));
    let mut f = eth(0x0800);
    ipv4(&mut f, &Ip4 { dst: IP_STRANGER, ..Ip4::default() }, &ours);
    cases.push(("IPv4 to another address", f, "pass_not_ours"));
    // RoCEv2 multicast (UD to QP 0xFFFFFF) to any IP group is ours: the
    // engine delivers it to the group's QPs or counts a group without one.
    let mut f = eth(0x0800);
    ipv4(&mut f, &Ip4 { dst: [239, 1, 2, 3], ..Ip4::default() }, &ours);
    cases.push(("IPv4 to a multicast group", f, "pass_no_socket"));
    let mut f = eth(0x0800);
    ipv4(&mut f, &Ip4 { dst: [224, 0, 0, 1], ..Ip4::default() }, &ours);
    cases.push(("IPv4 to 224.0.0.1", f, "pass_no_socket"));
    let mut f = eth(0x0800);
    ipv4(&mut f, &Ip4 { dst: [240, 0, 0, 1], ..Ip4::default() }, &ours);
    cases.push(("IPv4 to 240.0.0.1 (class E, not multicast)", f, "pass_not_ours"));
    let mut f = eth(0x86dd);
    let mut group6 = [0u8; 16];
    group6[0] = 0xff;
    group6[1] = 0x0e;
    group6[15] = 1;
    ipv6(&mut f, libc::IPPROTO_UDP as u8, group6, &ours);
    cases.push(("IPv6 to the group ff0e::1, only IPv4 addresses configured", f, "pass_no_socket"));
    let mut f = eth(0x88b5);
    f.extend_from_slice(&[0u8; 46]);
    cases.push(("local experimental ethertype", f, "pass_not_ip"));
    let mut f = eth(0x0806);
    f.extend_from_slice(&[0u8; 28]);
    cases.push(("ARP", f, "pass_not_ip"));
    let mut f = eth(0x86dd);
    ipv6(&mut f, libc::IPPROTO_UDP as u8, IP6_A, &ours);
    cases.push(("IPv6/UDP, only IPv4 addresses configured", f, "pass_not_ours"));
    let mut f = eth(0x86dd);
    ipv6(&mut f, 0, IP6_A, &[17, 0, 1, 4, 0, 0, 0, 0]);
    cases.push(("IPv6 extension header (hop-by-hop)", f, "pass_not_udp"));
    let mut f = eth(0x86dd);
    ipv6(&mut f, libc::IPPROTO_UDP as u8, IP6_A, &ours);
    f.truncate(14 + 30);
    cases.push(("truncated IPv6 header", f, "pass_malformed"));
    let mut f = eth(0x86dd);
    ipv6(&mut f, libc::IPPROTO_UDP as u8, IP6_A, &ours);
    f.truncate(14 + 40 + 4);
    cases.push(("IPv6, truncated UDP header", f, "pass_malformed"));
    let mut f = eth(0x8100);
    vlan_tag(&mut f, 9, 0x86dd);
    ipv6(&mut f, libc::IPPROTO_UDP as u8, IP6_A, &other);
    cases.push(("802.1Q, IPv6, other port", f, "pass_other_port"));

    let mut c = prog.counters().expect("counters");
    for (what, frame, reason) in &cases {
        raw.send(frame);
        raw.send(frame);
        let before = c;
        c = expect_moves_in(&format!("{what} ({mode:?} mode)"), &prog, &before, &[(*reason, 2)], &[]);
    }

    // IPv6 addresses configured: IPv6 to ours matches, IPv4 to IP_A does
    // not any more (addresses configured, none of them IPv4).
    prog.set_addresses(&[], &[IP6_B, IP6_A]).expect("set_addresses");
    let mut f6 = eth(0x86dd);
    ipv6(&mut f6, libc::IPPROTO_UDP as u8, IP6_A, &ours);
    let mut f4 = eth(0x0800);
    ipv4(&mut f4, &Ip4::default(), &ours);
    raw.send(&f6);
    raw.send(&f4);
    expect_moves(&prog, &c, &[("pass_no_socket", 1), ("pass_not_ours", 1)], &[]);
}

#[test]
fn parsing_generic() {
    parsing(AttachMode::Generic, "parseg");
}

#[test]
fn parsing_native() {
    parsing(AttachMode::Native, "parsen");
}

#[test]
fn ipv6_our_port_addresses_and_ce() {
    let t = Topo::new("v6", TopoOpts { ipv6: true, static_neigh: true });
    let prog = t.attach(&XdpConfig { ipv4: vec![IP_A], ipv6: vec![IP6_A], mode: AttachMode::Generic, ..XdpConfig::default() }).expect("attach");
    let rx = receiver(&t, PORT, true);
    let rx_other = receiver(&t, OTHER_PORT, true);
    let tx = sender(&t, 2, false, true);
    // MLD reports and the like (ICMPv6 behind a hop-by-hop header) may come.
    let noise = ["pass_not_udp"];
    let mut c = prog.counters().expect("counters");

    send_n(&tx, v6(IP6_A, PORT), b"roce6", 3);
    c = expect_moves(&prog, &c, &[("pass_no_socket", 3)], &noise);
    let got = drain(&rx);
    assert_eq!(got.len(), 3);
    assert!(got.iter().all(|(_, tc)| *tc == 2));
    send_n(&tx, v6(IP6_A, OTHER_PORT), b"other6", 2);
    c = expect_moves(&prog, &c, &[("pass_other_port", 2)], &noise);
    assert_eq!(drain(&rx_other).len(), 2);

    // IPv4 only configured: our IPv6 address is not ours for the program.
    prog.set_addresses(&[IP_A], &[]).expect("set_addresses");
    send_n(&tx, v6(IP6_A, PORT), b"v6 not ours", 2);
    c = expect_moves(&prog, &c, &[("pass_not_ours", 2)], &noise);
    assert_eq!(drain(&rx).len(), 2);
    prog.set_addresses(&[IP_A], &[IP6_B, IP6_A]).expect("set_addresses");

    // CE marking in the traffic class (no header checksum in IPv6).
    prog.set_impairments(&Impairments::from(Faults { ecn_mark: 1.0, ..Faults::NONE })).expect("impairments");
    send_n(&tx, v6(IP6_A, PORT), b"mark6", 4);
    c = expect_moves(&prog, &c, &[("pass_no_socket", 4), ("impair_ce_marked", 4)], &noise);
    let got = drain(&rx);
    assert_eq!(got.len(), 4);
    assert!(got.iter().all(|(p, tc)| p == b"mark6" && *tc == 3), "traffic classes {:?}", got.iter().map(|g| g.1).collect::<Vec<_>>());

    prog.set_impairments(&Impairments::from(Faults { loss: 1.0, ..Faults::NONE })).expect("impairments");
    send_n(&tx, v6(IP6_A, PORT), b"drop6", 3);
    c = expect_moves(&prog, &c, &[("impair_dropped", 3)], &noise);
    assert!(drain(&rx).is_empty());

    prog.set_impairments(&Impairments::from(Faults { corrupt: 1.0, ..Faults::NONE })).expect("impairments");
    send_n(&tx, v6(IP6_A, PORT), &[0x55; 100], 3);
    expect_moves(&prog, &c, &[("pass_no_socket", 3), ("impair_corrupted", 3)], &noise);
    drain(&rx);
}

fn redirect(mode: AttachMode, tag: &str) {
    let t = Topo::new(tag, quiet());
    let prog = t.attach(&XdpConfig { ipv4: vec![IP_A], mode, ..XdpConfig::default() }).expect("attach");
    let mut xsk = t.a(|| Xsk::open(ifindex_of(IF_A).expect("ifindex"), 0));
    let rx = receiver(&t, PORT, false);
    let rx_other = receiver(&t, OTHER_PORT, false);
    let tx = sender(&t, 2, false, false);
    let mut c = prog.counters().expect("counters");

    prog.register_socket(0, xsk.fd()).expect("register_socket");
    for i in 0..4u8 {
        send_n(&tx, v4(IP_A, PORT), &[b'x', i], 1);
    }
    c = expect_moves(&prog, &c, &[("redirected", 4)], &[]);
    let frames = xsk.recv(4, Duration::from_secs(2));
    assert_eq!(frames.len(), 4, "frames on the AF_XDP socket");
    for (i, f) in frames.iter().enumerate() {
        let (tos, csum_ok, port, payload) = parse_v4_udp(f);
        assert_eq!((tos, csum_ok, port, payload), (2, true, PORT, vec![b'x', i as u8]));
    }
    assert!(drain(&rx).is_empty(), "redirected datagrams must not reach the kernel");

    // Other ports still go to the kernel.
    send_n(&tx, v4(IP_A, OTHER_PORT), b"kernel", 2);
    c = expect_moves(&prog, &c, &[("pass_other_port", 2)], &[]);
    assert_eq!(drain(&rx_other).len(), 2);

    // CE marking, seen on the wire image: TOS 3 and a correct IPv4 header
    // checksum (RFC 1624 incremental update).
    prog.set_impairments(&Impairments::from(Faults { ecn_mark: 1.0, ..Faults::NONE })).expect("impairments");
    send_n(&tx, v4(IP_A, PORT), b"ce", 3);
    c = expect_moves(&prog, &c, &[("redirected", 3), ("impair_ce_marked", 3)], &[]);
    for f in xsk.recv(3, Duration::from_secs(2)) {
        let (tos, csum_ok, _, payload) = parse_v4_udp(&f);
        assert_eq!((tos, csum_ok, payload.as_slice()), (3, true, &b"ce"[..]));
    }

    // Corruption: one bit of the UDP payload, headers intact.
    prog.set_impairments(&Impairments::from(Faults { corrupt: 1.0, ..Faults::NONE })).expect("impairments");
    let payload = [0xa5u8; 1000];
    send_n(&tx, v4(IP_A, PORT), &payload, 3);
    c = expect_moves(&prog, &c, &[("redirected", 3), ("impair_corrupted", 3)], &[]);
    let frames = xsk.recv(3, Duration::from_secs(2));
    assert_eq!(frames.len(), 3);
    for f in frames {
        let (tos, csum_ok, port, p) = parse_v4_udp(&f);
        assert_eq!((tos, csum_ok, port), (2, true, PORT));
        assert_eq!(bits_differing(&p, &payload), 1);
    }
    prog.set_impairments(&Impairments::default()).expect("impairments");

    // Unregistered: back to the kernel.
    prog.unregister_socket(0).expect("unregister_socket");
    send_n(&tx, v4(IP_A, PORT), b"kernel again", 2);
    expect_moves(&prog, &c, &[("pass_no_socket", 2)], &[]);
    assert_eq!(drain(&rx).len(), 2);
    assert!(xsk.recv(1, Duration::from_millis(100)).is_empty());

    // Not an AF_XDP socket, or a queue beyond the map: typed errors.
    match prog.register_socket(0, rx.as_raw_fd()) {
        Err(e @ XdpError::Map(_)) => assert!(e.to_string().contains("xsks[0]"), "{e}"),
        other => panic!("a UDP socket in the XSKMAP: {other:?}"),
    }
    assert!(matches!(prog.register_socket(64, xsk.fd()), Err(XdpError::Map(_))));
}

#[test]
fn redirect_to_af_xdp_socket_generic() {
    redirect(AttachMode::Generic, "xskg");
}

#[test]
fn redirect_to_af_xdp_socket_native() {
    redirect(AttachMode::Native, "xskn");
}

#[test]
fn configuration_errors_are_typed_and_explained() {
    let bad = |cfg: XdpConfig, needle: &str| match XdpProgram::attach(1, &cfg) {
        Err(e @ XdpError::Config(_)) => {
            let m = e.to_string();
            assert!(m.contains(needle), "{m:?} should mention {needle:?}");
            let _: &dyn std::error::Error = &e;
        }
        Err(e) => panic!("wrong error for a bad configuration: {e}"),
        Ok(_) => panic!("a bad configuration was accepted"),
    };
    let imp = |i: Impairments| XdpConfig { impairments: i, ..XdpConfig::default() };
    bad(imp(Impairments::from(Faults { loss: 1.5, ..Faults::NONE })), "1.5");
    bad(imp(Impairments::from(Faults { ecn_mark: -0.1, ..Faults::NONE })), "-0.1");
    bad(imp(Impairments::from(Faults { corrupt: f64::NAN, ..Faults::NONE })), "NaN");
    // Faults the program cannot apply are refused, not ignored.
    bad(imp(Impairments::from(Faults { duplicate: 0.5, ..Faults::NONE })), "cannot duplicate or reorder");
    bad(imp(Impairments::from(Faults { reorder: 0.01, ..Faults::NONE })), "cannot duplicate or reorder");
    bad(XdpConfig { ipv4: vec![[10, 0, 0, 1]; 9], ..XdpConfig::default() }, "at most 8");
    bad(XdpConfig { ipv6: vec![IP6_A; 9], ..XdpConfig::default() }, "at most 8");
    bad(XdpConfig { udp_port: 0, ..XdpConfig::default() }, "port 0");

    let t = Topo::new("cfg", quiet());
    // Interfaces are looked up in the calling thread's namespace.
    assert!(matches!(ifindex_of(IF_A), Err(XdpError::NoInterface(_))), "A's veth is not in the test's namespace");
    let e = t.a(|| ifindex_of("no-such-if0")).expect_err("no such interface");
    assert!(e.to_string().contains("no-such-if0"), "{e}");
    assert!(matches!(ifindex_of("a\0b"), Err(XdpError::NoInterface(_))));
    // An interface that does not exist: both modes tried and named.
    match t.a(|| XdpProgram::attach(0x7fff_fff0, &XdpConfig::default())) {
        Err(e @ XdpError::Attach(_)) => {
            let m = e.to_string();
            assert!(m.contains("Native") && m.contains("Generic"), "{m}");
        }
        other => panic!("attach to a missing interface: {:?}", other.map(|p| p.mode())),
    }

    // Refused live changes leave the running configuration alone.
    let prog = t.attach(&XdpConfig { ipv4: vec![IP_A], mode: AttachMode::Generic, ..XdpConfig::default() }).expect("attach");
    let tx = sender(&t, 2, false, false);
    let _rx = receiver(&t, PORT, false);
    assert!(matches!(prog.set_impairments(&Impairments::from(Faults { loss: 1.5, ..Faults::NONE })), Err(XdpError::Config(_))));
    assert!(matches!(prog.set_impairments(&Impairments::from(Faults { loss: 1.0, ecn_mark: 2.0, ..Faults::NONE })), Err(XdpError::Config(_))));
    assert!(matches!(prog.set_impairments(&Impairments::from(Faults { loss: 1.0, reorder: 0.5, ..Faults::NONE })), Err(XdpError::Config(_))));
    assert!(matches!(prog.set_addresses(&[[10, 0, 0, 1]; 9], &[]), Err(XdpError::Config(_))));
    assert!(matches!(prog.set_addresses(&[], &[IP6_A; 9]), Err(XdpError::Config(_))));
    let c = prog.counters().expect("counters");
    send_n(&tx, v4(IP_A, PORT), b"unchanged", 3);
    expect_moves(&prog, &c, &[("pass_no_socket", 3)], &[]);
}
