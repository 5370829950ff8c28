//! A live urnic device over veth takes fire from a raw sender in the peer
//! namespace — malformed, truncated, bad-ICRC, unknown-opcode, wrong-QPN,
//! wrong-rkey and random frames — while real RC traffic runs between the
//! two devices. The traffic completes with correct data, every bad frame is
//! counted under its reason, and nothing panics.

#[path = "../../verbs-api/tests/common.rs"]
mod common;
mod veth;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::*;
use rand::{Rng, SeedableRng};
use rocev2::psn::Psn;
use rocev2::transport::engine::WireErrorKind;
use rocev2::wire::*;
use urnic::*;

/// An AF_PACKET socket on `ifname` of the calling thread's namespace.
fn raw_socket(ifname: &str) -> OwnedFd {
    // SAFETY: plain socket(2).
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, (libc::ETH_P_ALL as u16).to_be() as i32) };
    assert!(fd >= 0, "AF_PACKET socket: {}", std::io::Error::last_os_error());
    // SAFETY: fresh fd.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let name = std::ffi::CString::new(ifname).unwrap();
    // SAFETY: NUL-terminated name.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    assert!(ifindex > 0, "no {ifname}");
    // SAFETY: sockaddr_ll is plain data; bind reads exactly its size.
    unsafe {
        let mut sll: libc::sockaddr_ll = std::mem::zeroed();
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sll.sll_ifindex = ifindex as i32;
        let r = libc::bind(fd.as_raw_fd(), &sll as *const _ as *const libc::sockaddr, std::mem::size_of::<libc::sockaddr_ll>() as u32);
        assert_eq!(r, 0, "bind AF_PACKET: {}", std::io::Error::last_os_error());
    }
    fd
}

fn send_raw(fd: &OwnedFd, frame: &[u8]) {
    // SAFETY: sends frame.len() bytes from frame.
    let n = unsafe { libc::send(fd.as_raw_fd(), frame.as_ptr() as *const libc::c_void, frame.len(), 0) };
    assert_eq!(n, frame.len() as isize, "raw send: {}", std::io::Error::last_os_error());
}

struct Target {
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    dst_ip: [u8; 4],
    src_ip: [u8; 4],
}

impl Target {
    fn frame(&self, op: Opcode, qpn: u32, psn: u32, reth: Option<RethRepr>, payload: &[u8]) -> Vec<u8> {
        let l = op.layout().unwrap();
        let repr = FrameRepr {
            eth: EthernetRepr { dst: self.dst_mac, src: self.src_mac, vlan: None, ethertype: 0x0800 },
            ip: IpRepr::V4(Ipv4Repr { src: self.src_ip, dst: self.dst_ip, dscp: 0, ecn: 2, ident: 1, dont_frag: true, ttl: 64, protocol: 17, payload_len: 0 }),
            udp: UdpRepr { src_port: 50000, dst_port: ROCEV2_UDP_PORT, length: 0, checksum: 0 },
            transport: TransportRepr {
                bth: BthRepr { ack_req: true, ..BthRepr::new(op, qpn, Psn::new(psn)) },
                deth: l.deth.then_some(DethRepr { qkey: 0x1111_1111, resv8: 0, src_qp: 0x99 }),
                reth: if l.reth { reth } else { None },
                atomic_eth: None,
                aeth: None,
                atomic_ack: None,
                immediate: None,
                invalidate_rkey: None,
            },
        };
        let mut f = vec![0u8; repr.frame_len(payload.len())];
        repr.emit(payload, &mut f).unwrap();
        f
    }
}

fn bad(ctx: &Context, kind: WireErrorKind) -> u64 {
    ctx.engine_stats().rx_bad_frame.get(&kind).copied().unwrap_or(0)
}

#[test]
fn hostile_frames_are_counted_by_reason_while_traffic_completes() {
    veth::require_root();
    let (pair, ca, cb) = veth::pair(Impairments::default(), 1500);
    let mut a = side(&ca, 4 << 20);
    let b = side(&cb, 4 << 20);
    let qa = rc_qp(&a, None);
    let qb = rc_qp(&b, None);
    // perftest's ACK timeout (14: 67 ms): on a loaded two-core machine veth
    // itself drops bursts when the receiving side is descheduled.
    bring_up_with_timeout(&qa, &ca, qb.qp_num(), &cb, 1, 1000, 14);
    bring_up_with_timeout(&qb, &cb, qa.qp_num(), &ca, 1000, 1, 14);
    // The victim: a QP of device b in RTR expecting PSN 500 from nobody real.
    let victim = rc_qp(&b, None);
    victim.connect(&Connect::new(0x777, ca.query_gid(1, 1).unwrap(), 9, 500)).unwrap();

    // Fire at device b from namespace a (raw frames leave u0 and reach u1).
    let t = Target { dst_mac: pair.mac[1], src_mac: pair.mac[0], dst_ip: pair.ipv4[1], src_ip: pair.ipv4[0] };
    let ns_a = pair.ns[0].clone();
    let victim_qpn = victim.qp_num();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    const N: u64 = 200;
    let before_unknown = cb.engine_stats().rx_unknown_qpn;
    let shooter = std::thread::spawn(move || {
        urnic_datapath::netns::enter_netns(&ns_a).unwrap();
        let fd = raw_socket("u0");
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x5eed);
        let good = t.frame(Opcode::RC_SEND_ONLY, 0xab_cdef, 3, None, &[7u8; 64]);
        for i in 0..N {
            // Unknown QPN, valid in every other way.
            send_raw(&fd, &good);
            // Bad ICRC.
            let mut f = good.clone();
            let n = f.len();
            f[n - 1] ^= 0x5a;
            send_raw(&fd, &f);
            // Truncated: the IP and UDP lengths say less than a BTH + ICRC.
            let mut f = good.clone();
            f.truncate(14 + 20 + 8 + 10);
            f[14 + 2..14 + 4].copy_from_slice(&(20u16 + 8 + 10).to_be_bytes());
            f[14 + 10..14 + 12].copy_from_slice(&[0, 0]);
            let csum = ipv4_checksum(&f[14..34]);
            f[24..26].copy_from_slice(&csum.to_be_bytes());
            f[14 + 20 + 4..14 + 20 + 6].copy_from_slice(&18u16.to_be_bytes());
            send_raw(&fd, &f);
            // Unknown opcode (a reserved RC opcode), ICRC resealed.
            let mut f = good.clone();
            f[14 + 20 + 8] = 0x1f;
            icrc::fill_frame(&mut f).unwrap();
            send_raw(&fd, &f);
            // Wrong rkey: a WRITE at the victim's expected PSN (first round only
            // — it moves the victim to the error state, as the spec says).
            if i == 0 {
                let reth = RethRepr { va: 0x1000, rkey: 0xdead_beef, dma_len: 64 };
                send_raw(&fd, &t.frame(Opcode::RC_WRITE_ONLY, victim_qpn, 500, Some(reth), &[1u8; 64]));
            }
            // Random bytes behind valid Ethernet/IPv4/UDP(4791) headers.
            let mut f = good.clone();
            let len = rng.gen_range(42..f.len());
            for byte in &mut f[42..len] {
                *byte = rng.gen();
            }
            f.truncate(len);
            send_raw(&fd, &f);
            // Entirely random frames to b's MAC (the XDP program passes most
            // to the kernel; whatever it redirects, the engine refuses).
            let mut f: Vec<u8> = (0..rng.gen_range(14..200)).map(|_| rng.gen()).collect();
            f[..6].copy_from_slice(&t.dst_mac);
            send_raw(&fd, &f);
            if i % 20 == 0 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        stop2.store(true, Ordering::Release);
    });

    // Real traffic while the shooter runs: WRITEs and SENDs with checks.
    let mut rounds = 0u64;
    while !stop.load(Ordering::Acquire) || rounds < 20 {
        let len = 1 + (rounds as usize * 7919) % 200_000;
        fill(&mut a.mr, 0, len, rounds as u8);
        let remote = RemoteAddr { addr: b.mr.addr() + (1 << 20), rkey: b.mr.rkey() };
        qb.post_recv(&RecvWr { wr_id: rounds, sgl: vec![b.mr.sge(0, 1 << 20)] }).unwrap();
        qa.post_send(&send_wr(2 * rounds, SendOp::Write { remote }, vec![a.mr.sge(0, len as u32)])).unwrap();
        qa.post_send(&send_wr(2 * rounds + 1, SendOp::Send, vec![a.mr.sge(0, len as u32)])).unwrap();
        let c = wait(&a.cq, 2);
        assert_eq!(
            c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
            vec![(2 * rounds, WcStatus::Success), (2 * rounds + 1, WcStatus::Success)],
            "round {rounds}, {len} bytes; requester {:?}; responder {:?}; a: {}; b: {}",
            qa.stats(),
            qb.stats(),
            ca.counters(),
            cb.counters()
        );
        let r = wait(&b.cq, 1);
        assert_eq!((r[0].wr_id, r[0].status, r[0].byte_len as usize), (rounds, WcStatus::Success, len));
        assert_eq!(bytes(&b.mr, 0..len), &expected(len, rounds as u8)[..]);
        assert_eq!(bytes(&b.mr, 1 << 20..(1 << 20) + len), &expected(len, rounds as u8)[..]);
        rounds += 1;
    }
    shooter.join().expect("the raw sender");
    // Let the last frames land.
    std::thread::sleep(std::time::Duration::from_millis(200));

    let s = cb.engine_stats();
    assert!(s.rx_unknown_qpn - before_unknown >= N, "unknown QPN frames counted: {s:?}");
    assert!(bad(&cb, WireErrorKind::BadIcrc) >= N, "bad ICRC counted: {s:?}");
    assert!(bad(&cb, WireErrorKind::Truncated) >= N, "truncated counted: {s:?}");
    assert!(bad(&cb, WireErrorKind::BadOpcode) >= N, "unknown opcodes counted: {s:?}");
    // The real traffic produced no bad frame of its own: the bad-frame
    // counters hold the shooter's frames (and its random ones) only.
    let total_bad: u64 = s.rx_bad_frame.values().sum();
    assert!(total_bad >= 4 * N - N, "{s:?}");
    // The wrong rkey drew a remote access NAK from the victim.
    let v = victim.stats().unwrap();
    assert_eq!(v.resp_naks_rem_access_sent, 1, "{v:?}");
    assert_eq!(victim.query().unwrap().qp_state, QpState::Err);
    // The real QPs never saw any of it.
    assert_eq!(qa.query().unwrap().qp_state, QpState::Rts);
    assert_eq!(qb.query().unwrap().qp_state, QpState::Rts);
    let xdp = port_counters(&cb);
    assert!(xdp.iter().any(|(k, v)| k == "xdp_redirected" && *v > 0), "{xdp:?}");
    eprintln!("traffic rounds: {rounds}; device b engine stats: {s:?}; port: {xdp:?}");
}

/// IPv4 header checksum of a 20-byte header.
fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut sum = 0u32;
    for (i, w) in h.chunks(2).enumerate() {
        if i != 5 {
            sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn port_counters(ctx: &Context) -> Vec<(String, u64)> {
    ctx.nic().with_port(|p| p.counters())
}
