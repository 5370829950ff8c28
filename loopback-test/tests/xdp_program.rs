//! urnic's XDP program on a real veth, driven by kernel sockets: what it
//! passes to the kernel (ARP, ICMP, other ports, other addresses, our port
//! with no AF_XDP socket), its counters, its attach modes, and its test
//! impairments (loss, CE marking with a correct IPv4 checksum, corruption),
//! and one `Faults` value meaning the same to the simulator, the in-memory hub
//! and the program.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use urnic_datapath::netns::{in_netns, VethPair};
use urnic_datapath::xdp::{ifindex_of, AttachMode, Faults, Impairments, XdpConfig, XdpCounters, XdpError, XdpProgram};

mod veth;

const OURS: [u8; 4] = [10, 99, 0, 1];

fn attach(pair: &VethPair, mode: AttachMode) -> Result<Arc<XdpProgram>, XdpError> {
    let cfg = XdpConfig { ipv4: vec![OURS], mode, ..XdpConfig::default() };
    in_netns(Some(&pair.ns[0]), move || XdpProgram::attach(ifindex_of("u0")?, &cfg).map(Arc::new)).unwrap()
}

/// A kernel UDP socket in namespace a, on `port`, receiving the TOS byte.
fn receiver(pair: &VethPair, port: u16) -> UdpSocket {
    in_netns(Some(&pair.ns[0]), move || {
        let s = UdpSocket::bind(("0.0.0.0", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        let on: libc::c_int = 1;
        // SAFETY: IP_RECVTOS takes an int flag.
        unsafe {
            libc::setsockopt(s.as_raw_fd(), libc::IPPROTO_IP, libc::IP_RECVTOS, &on as *const _ as *const libc::c_void, 4);
        }
        s
    })
    .unwrap()
}

/// A sender in namespace b: ECT(0), and no UDP checksum (so a corrupted
/// payload still reaches the receiving socket).
fn sender(pair: &VethPair) -> UdpSocket {
    in_netns(Some(&pair.ns[1]), || {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        let tos: libc::c_int = 2;
        let one: libc::c_int = 1;
        // SAFETY: IP_TOS and SO_NO_CHECK take an int.
        unsafe {
            libc::setsockopt(s.as_raw_fd(), libc::IPPROTO_IP, libc::IP_TOS, &tos as *const _ as *const libc::c_void, 4);
            libc::setsockopt(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_NO_CHECK, &one as *const _ as *const libc::c_void, 4);
        }
        s
    })
    .unwrap()
}

/// Receive one datagram: (payload, TOS byte), or None after the timeout.
fn recv_tos(s: &UdpSocket) -> Option<(Vec<u8>, u8)> {
    let mut buf = [0u8; 2048];
    let mut cmsg = [0u8; 64];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr() as *mut libc::c_void, iov_len: buf.len() };
    // SAFETY: msghdr is plain data; recvmsg writes within the given buffers.
    let (n, tos) = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cmsg.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = cmsg.len();
        let n = libc::recvmsg(s.as_raw_fd(), &mut msg, 0);
        if n < 0 {
            return None;
        }
        let mut tos = None;
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::IPPROTO_IP && (*c).cmsg_type == libc::IP_TOS {
                tos = Some(*libc::CMSG_DATA(c));
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
        (n as usize, tos.unwrap_or(0xff))
    };
    Some((buf[..n].to_vec(), tos))
}

fn send(s: &UdpSocket, port: u16, payload: &[u8], n: usize) {
    let to = SocketAddr::from((OURS, port));
    for _ in 0..n {
        s.send_to(payload, to).unwrap();
    }
    std::thread::sleep(Duration::from_millis(50));
}

fn drain(s: &UdpSocket) -> Vec<(Vec<u8>, u8)> {
    std::iter::from_fn(|| recv_tos(s)).collect()
}

fn diff(before: XdpCounters, after: XdpCounters) -> Vec<(&'static str, u64)> {
    before.iter().zip(after.iter()).map(|((k, a), (_, b))| (k, b - a)).filter(|(_, d)| *d != 0).collect()
}

#[test]
fn passes_everything_but_ours_and_counts_why() {
    veth::require_root();
    let pair = VethPair::create("xdp", 1500).unwrap();
    let prog = attach(&pair, AttachMode::Generic).unwrap();
    assert_eq!(prog.mode(), AttachMode::Generic);
    let (rx4791, rx5000) = (receiver(&pair, 4791), receiver(&pair, 5000));
    let tx = sender(&pair);

    // ARP + ICMP echo both ways reach the kernel: ping works.
    let ping = std::process::Command::new("ip").args(["netns", "exec", &pair.ns[1], "ping", "-c", "2", "-W", "2", "10.99.0.1"]).output().unwrap();
    assert!(ping.status.success(), "ping through the XDP program: {}", String::from_utf8_lossy(&ping.stdout));
    let c0 = prog.counters().unwrap();
    assert!(c0.pass_not_ip >= 1, "ARP passed: {c0:?}");
    assert!(c0.pass_not_udp >= 2, "ICMP passed: {c0:?}");

    // Our port with no AF_XDP socket on the queue: to the kernel, counted.
    send(&tx, 4791, b"roce?", 5);
    send(&tx, 5000, b"other", 4);
    let c1 = prog.counters().unwrap();
    assert_eq!(c1.pass_no_socket - c0.pass_no_socket, 5, "{:?}", diff(c0, c1));
    assert_eq!(c1.pass_other_port - c0.pass_other_port, 4, "{:?}", diff(c0, c1));
    assert_eq!(drain(&rx4791).len(), 5);
    assert_eq!(drain(&rx5000).len(), 4);

    // Not addressed to one of our IPs: passed, counted as such.
    prog.set_addresses(&[[10, 99, 0, 77]], &[]).unwrap();
    send(&tx, 4791, b"not ours", 3);
    let c2 = prog.counters().unwrap();
    // (Neighbour discovery and MLD may add pass_not_udp frames meanwhile.)
    assert_eq!(c2.pass_not_ours - c1.pass_not_ours, 3, "{:?}", diff(c1, c2));
    assert_eq!(c2.pass_no_socket, c1.pass_no_socket, "{:?}", diff(c1, c2));
    assert_eq!(drain(&rx4791).len(), 3);
    prog.set_addresses(&[OURS], &[]).unwrap();

    // Loss: ours vanish; other ports are untouched.
    prog.set_impairments(&Impairments::from(Faults { loss: 1.0, ..Faults::NONE })).unwrap();
    send(&tx, 4791, b"drop me", 6);
    send(&tx, 5000, b"keep me", 2);
    let c3 = prog.counters().unwrap();
    assert_eq!(c3.impair_dropped - c2.impair_dropped, 6, "{:?}", diff(c2, c3));
    assert!(drain(&rx4791).is_empty(), "dropped datagrams arrived");
    assert_eq!(drain(&rx5000).len(), 2);

    // CE marking: ECT(0) becomes CE and the IPv4 checksum stays valid (the
    // kernel would drop the datagram otherwise).
    prog.set_impairments(&Impairments::from(Faults { ecn_mark: 1.0, ..Faults::NONE })).unwrap();
    send(&tx, 4791, b"mark me", 4);
    let got = drain(&rx4791);
    let c4 = prog.counters().unwrap();
    assert_eq!(c4.impair_ce_marked - c3.impair_ce_marked, 4, "{:?}", diff(c3, c4));
    assert_eq!(got.len(), 4, "CE-marked datagrams must still pass the IPv4 checksum");
    assert!(got.iter().all(|(_, tos)| tos & 3 == 3), "TOS bytes: {:?}", got.iter().map(|g| g.1).collect::<Vec<_>>());

    // Corruption: one bit of the payload flips.
    prog.set_impairments(&Impairments::from(Faults { corrupt: 1.0, ..Faults::NONE })).unwrap();
    let payload = [0x5au8; 200];
    send(&tx, 4791, &payload, 5);
    let got = drain(&rx4791);
    let c5 = prog.counters().unwrap();
    assert_eq!(c5.impair_corrupted - c4.impair_corrupted, 5);
    assert_eq!(got.len(), 5);
    for (p, _) in &got {
        let flipped: u32 = p.iter().zip(payload.iter()).map(|(a, b)| (a ^ b).count_ones()).sum();
        assert_eq!(flipped, 1, "exactly one bit flipped");
    }

    // Impairments off again: clean delivery.
    prog.set_impairments(&Impairments::default()).unwrap();
    send(&tx, 4791, &payload, 2);
    assert!(drain(&rx4791).iter().all(|(p, tos)| p[..] == payload[..] && tos & 3 == 2));
    // Bad impairments are refused, the program keeps the old ones.
    assert!(matches!(prog.set_impairments(&Impairments::from(Faults { loss: 2.0, ..Faults::NONE })), Err(XdpError::Config(_))));
}

#[test]
fn attach_modes_native_generic_auto_and_exclusive() {
    veth::require_root();
    let pair = VethPair::create("xdpm", 1500).unwrap();
    for mode in [AttachMode::Native, AttachMode::Generic, AttachMode::Auto] {
        let prog = attach(&pair, mode).unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        match mode {
            AttachMode::Auto => assert_eq!(prog.mode(), AttachMode::Native, "veth supports native XDP"),
            m => assert_eq!(prog.mode(), m),
        }
        // One program per interface: a second attach is refused, typed.
        let second = attach(&pair, prog.mode());
        assert!(matches!(second, Err(XdpError::Attach(_))), "second attach in {mode:?}");
        drop(prog);
    }
    // Detached on drop: attaching works again.
    assert!(attach(&pair, AttachMode::Generic).is_ok());
    // No such interface: typed error from the calling namespace.
    assert!(matches!(ifindex_of("no-such-if0"), Err(XdpError::NoInterface(_))));
}

/// A valid RoCEv2 frame (IPv4, ECT(0)) from `src` to `dst`.
fn roce_ect0(dst: [u8; 6], src: [u8; 6]) -> Vec<u8> {
    use rocev2::wire::*;
    let repr = FrameRepr {
        eth: EthernetRepr { dst, src, vlan: None, ethertype: ETHERTYPE_IPV4 },
        ip: IpRepr::V4(Ipv4Repr {
            src: [10, 0, 0, 1],
            dst: [10, 0, 0, 2],
            dscp: 0,
            ecn: 2,
            ident: 1,
            dont_frag: true,
            ttl: 64,
            protocol: IPPROTO_UDP,
            payload_len: 0,
        }),
        udp: UdpRepr { src_port: 0xc000, dst_port: ROCEV2_UDP_PORT, length: 0, checksum: 0 },
        transport: TransportRepr::bth_only(BthRepr::new(Opcode::RC_SEND_ONLY, 0x11, rocev2::Psn::new(1))),
    };
    let mut f = vec![0u8; 128];
    let n = repr.emit(&[7u8; 16], &mut f).unwrap();
    f.truncate(n);
    f
}

/// One `Faults` value, said to all three backends that impair frames: half
/// the frames lost, every surviving ECN-capable one marked CE. The
/// simulator's link and the in-memory hub are seeded; the XDP program draws
/// from the kernel, so its loss is checked against wide binomial bounds
/// (400 frames at p = 0.5: sigma 10, bounds 6 sigma).
#[test]
fn one_faults_value_means_the_same_to_the_simulator_the_hub_and_the_xdp_program() {
    use rocev2::sim::{Link, LinkConfig};
    use rocev2::Instant;
    use urnic_datapath::{MemHub, Port};

    const N: u64 = 400;
    let faults = Faults { loss: 0.5, ecn_mark: 1.0, ..Faults::NONE };
    let lost_ok = |what: &str, lost: u64| assert!((140..=260).contains(&lost), "{what}: lost {lost} of {N} at loss 0.5");
    let (a, b) = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
    let frame = roce_ect0(b, a);
    assert_eq!(frame[15] & 3, 2);

    // The simulator's virtual link.
    let mut link = Link::new(LinkConfig::default().with_faults(faults), 5);
    for _ in 0..N {
        link.send(Instant::ZERO, &frame);
    }
    let mut got = Vec::new();
    while let Some(f) = link.pop_due(Instant::from_nanos(u64::MAX)) {
        got.push(f);
    }
    lost_ok("sim", link.stats().lost);
    assert_eq!(got.len() as u64 + link.stats().lost, N);
    assert!(got.iter().all(|f| f[15] & 3 == 3), "sim: a surviving frame is not CE");

    // The in-memory hub.
    let hub = MemHub::new(5);
    let mut pa = hub.attach(a, 1500, faults.into());
    let mut pb = hub.attach(b, 1500, urnic_datapath::Impairments::default());
    for _ in 0..N {
        pa.transmit_with(&mut |buf| {
            buf[..frame.len()].copy_from_slice(&frame);
            Some(frame.len())
        })
        .unwrap();
    }
    let mut got = Vec::new();
    pb.receive(usize::MAX, &mut |f| got.push(f.to_vec())).unwrap();
    let lost = hub.stats.dropped.load(std::sync::atomic::Ordering::Relaxed);
    lost_ok("memport", lost);
    assert_eq!(got.len() as u64 + lost, N);
    assert!(got.iter().all(|f| f[15] & 3 == 3), "memport: a surviving frame is not CE");

    // The XDP program, on frames arriving at a veth (passed on to a kernel
    // socket, as no AF_XDP socket is registered).
    veth::require_root();
    let pair = VethPair::create("xf", 1500).unwrap();
    let prog = attach(&pair, AttachMode::Generic).unwrap();
    prog.set_impairments(&faults.into()).unwrap();
    let rx = receiver(&pair, 4791);
    let tx = sender(&pair);
    let c0 = prog.counters().unwrap();
    let mut got = Vec::new();
    for _ in 0..N / 50 {
        send(&tx, 4791, b"faults", 50);
        got.extend(drain(&rx));
    }
    let c1 = prog.counters().unwrap();
    let (lost, passed) = (c1.impair_dropped - c0.impair_dropped, c1.pass_no_socket - c0.pass_no_socket);
    assert_eq!(lost + passed, N, "{:?}", diff(c0, c1));
    lost_ok("xdp", lost);
    assert_eq!(c1.impair_ce_marked - c0.impair_ce_marked, passed, "{:?}", diff(c0, c1));
    assert_eq!(got.len() as u64, passed, "every frame the program passed reaches the socket");
    assert!(got.iter().all(|(_, tos)| tos & 3 == 3), "xdp: a surviving datagram is not CE");
}
