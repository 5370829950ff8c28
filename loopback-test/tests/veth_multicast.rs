//! UD multicast over a real link (issue 18): four AF_XDP urnic devices in
//! four namespaces on one bridge. `a` sends to a group through the Rust
//! verbs API; `b` (two QPs) and `c` (one) are attached and each QP gets its
//! own copy; `a`'s own attached QP gets one through the device's loopback;
//! `d` has no member and counts every group frame as a drop. The kernel
//! holds the group on each member's interface (`ip maddr`, IGMP) while a
//! QP is attached; detach stops delivery at once.

#[path = "../../verbs-api/tests/common.rs"]
mod common;
mod veth;

use std::process::Command;

use common::*;
use rocev2::transport::mcast::MULTICAST_QPN;
use urnic::*;
use urnic_datapath::netns::{Segment, VethPair};

const QKEY: u32 = 0x0bad_cafe;
const GROUP: [u8; 4] = [239, 77, 0, 1];
const EMPTY_GROUP: [u8; 4] = [239, 77, 0, 2];
const SLOT: usize = 4096;

fn gid(ip: [u8; 4]) -> Gid {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&ip);
    g
}

/// The IPv4 groups the kernel holds on `ifname` in namespace `ns`.
fn kernel_groups(ns: &str, ifname: &str) -> String {
    let o = Command::new("ip").args(["-n", ns, "maddr", "show", "dev", ifname]).output().expect("ip maddr");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn recv_one(qp: &Qp, s: &Side, slot: usize) {
    qp.post_recv(&RecvWr { wr_id: slot as u64, sgl: vec![s.mr.sge(slot * SLOT, SLOT as u32)] }).unwrap();
}

/// Poll until the counter reaches `want` (the datapath runs on its own thread).
fn counter_reaches(ctx: &Context, name: &str, want: u64) {
    let mut spins = 0u64;
    while ctx.counters().get(name).unwrap() < want {
        spins += 1;
        assert!(spins < 1_000_000, "{name} stays at {} (< {want})", ctx.counters().get(name).unwrap());
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
}

#[test]
fn one_sender_several_receivers_on_a_bridge() {
    veth::require_root();
    let _ = VethPair::sweep_stale();
    let _ = Segment::sweep_stale();
    let seg = Segment::create("mc", 4, 1500).expect("create the segment (needs root and iproute2)");
    let open = |i: usize| {
        let mode = DatapathMode::Thread { core: None, idle: IdlePolicy::default() };
        open_af_xdp(Some(&seg.ns[i]), &format!("urnic{i}"), &XskConfig::new(&seg.ifname[i]), mode).expect("AF_XDP device")
    };
    let (ca, cb, cc, cd) = (open(0), open(1), open(2), open(3));
    let l = ca.query_device().limits;
    assert_eq!((l.max_mcast_grp, l.max_mcast_qp_attach, l.max_total_mcast_qp_attach), (8192, 56, 0x70000), "rxe's limits");

    let g = gid(GROUP);
    let sa = side(&ca, 64 * SLOT);
    let sender = ud_qp(&sa, QKEY);
    let self_side = side(&ca, 64 * SLOT);
    let a_self = ud_qp(&self_side, QKEY);
    let (sb1, sb2, sc) = (side(&cb, 64 * SLOT), side(&cb, 64 * SLOT), side(&cc, 64 * SLOT));
    let (b1, b2, c1) = (ud_qp(&sb1, QKEY), ud_qp(&sb2, QKEY), ud_qp(&sc, QKEY));
    let sd = side(&cd, 64 * SLOT);
    let d1 = ud_qp(&sd, QKEY);
    assert!(!kernel_groups(&seg.ns[1], &seg.ifname[1]).contains("239.77.0.1"));
    let members: [(&Qp, &Side); 4] = [(&b1, &sb1), (&b2, &sb2), (&c1, &sc), (&a_self, &self_side)];
    for (qp, s) in members {
        qp.attach_mcast(&g).unwrap();
        qp.attach_mcast(&g).unwrap(); // twice: a no-op, as on rxe
        for slot in 0..8 {
            recv_one(qp, s, slot);
        }
    }
    recv_one(&d1, &sd, 0);
    assert_eq!(b1.mcast_groups(), vec![g]);
    for i in 0..3 {
        assert!(kernel_groups(&seg.ns[i], &seg.ifname[i]).contains("239.77.0.1"), "the kernel joined the group in {}", seg.ns[i]);
    }

    // Three datagrams from a to the group.
    let ah = sa.pd.create_ah(&AhAttr { dgid: g, sgid_index: 1, port_num: 1, hop_limit: 1, ..AhAttr::default() }).unwrap();
    assert_eq!(ah.address_vector().dmac, [0x01, 0x00, 0x5e, 0x4d, 0x00, 0x01], "the group's MAC, no ARP");
    let mut sa = sa;
    let send = |sa: &mut Side, i: usize, to: &Ah| {
        fill(&mut sa.mr, i * SLOT, 100 + i, i as u8);
        let wr = SendWr {
            wr_id: i as u64,
            op: SendOp::SendWithImm { imm: 0x100 + i as u32 },
            payload: Payload::Sgl(vec![sa.mr.sge(i * SLOT, 100 + i as u32)]),
            flags: SendFlags::SIGNALED,
            ud: Some(UdDest { av: *to.address_vector(), remote_qpn: MULTICAST_QPN, remote_qkey: QKEY }),
        };
        sender.post_send(&wr).unwrap();
        let c = wait(&sa.cq, 1);
        assert_eq!((c[0].wr_id, c[0].status), (i as u64, WcStatus::Success));
    };
    for i in 0..3 {
        send(&mut sa, i, &ah);
    }
    for (qp, s) in members {
        let got = wait(&s.cq, 3);
        for (i, c) in got.iter().enumerate() {
            assert_eq!(
                (c.qp_num, c.status, c.wr_id, c.src_qp, c.byte_len as usize, c.imm_data),
                (qp.qp_num(), WcStatus::Success, i as u64, sender.qp_num(), 40 + 100 + i, Some(0x100 + i as u32)),
                "copy {i} at QP {:#x}",
                qp.qp_num()
            );
            let slot = bytes(&s.mr, i * SLOT..i * SLOT + 40 + 100 + i);
            assert_eq!(&slot[36..40], &GROUP, "the GRH names the group as destination");
            assert_eq!(&slot[40..], &expected(100 + i, i as u8)[..]);
        }
    }
    // d has no member: each group frame is a counted drop, no completion.
    counter_reaches(&cd, "rx_mcast_no_member", 3);
    assert_eq!(cd.counters().get("mcast_frames"), Some(0));
    assert_eq!(cb.counters().get("mcast_frames"), Some(3), "one frame, two copies");

    // Detach b1: the next datagram reaches b2 but not b1 (same engine,
    // same frame: b1's queue is final once b2's completion is there).
    b1.detach_mcast(&g).unwrap();
    assert_eq!(b1.detach_mcast(&g).unwrap_err().kind(), ErrorKind::InvalidArgument, "detached twice");
    send(&mut sa, 3, &ah);
    assert_eq!(wait(&sb2.cq, 1)[0].wr_id, 3);
    assert_eq!(wait(&sc.cq, 1)[0].wr_id, 3);
    let mut buf = vec![WorkCompletion::default(); 4];
    assert_eq!(sb1.cq.poll(&mut buf).unwrap(), 0, "no delivery after detach");
    assert!(kernel_groups(&seg.ns[1], &seg.ifname[1]).contains("239.77.0.1"), "b2 still holds the group");
    // The last member of b leaving leaves the group on the host.
    b2.detach_mcast(&g).unwrap();
    assert!(!kernel_groups(&seg.ns[1], &seg.ifname[1]).contains("239.77.0.1"), "left after the last detach");

    // A group nobody joined: dropped and counted everywhere it arrives.
    let empty = sa.pd.create_ah(&AhAttr { dgid: gid(EMPTY_GROUP), sgid_index: 1, port_num: 1, ..AhAttr::default() }).unwrap();
    send(&mut sa, 4, &empty);
    counter_reaches(&cc, "rx_mcast_no_member", 1);
    counter_reaches(&cd, "rx_mcast_no_member", 5);
    assert_eq!(sc.cq.poll(&mut buf).unwrap(), 0);
    assert_eq!(sd.cq.poll(&mut buf).unwrap(), 0);

    // Destroying an attached QP leaves its groups (and the host's, if last).
    drop(c1);
    assert!(!kernel_groups(&seg.ns[2], &seg.ifname[2]).contains("239.77.0.1"));
    drop(seg);
}

/// Send `n` datagrams of `len + i` bytes from `sender` to the group behind
/// `ah` (Q_Key `QKEY`), each waited for.
fn send_n(s: &mut Side, sender: &Qp, ah: &Ah, first: usize, n: usize) {
    for i in first..first + n {
        fill(&mut s.mr, i * SLOT, 64 + i, i as u8);
        let wr = SendWr {
            wr_id: i as u64,
            op: SendOp::Send,
            payload: Payload::Sgl(vec![s.mr.sge(i * SLOT, 64 + i as u32)]),
            flags: SendFlags::SIGNALED,
            ud: Some(UdDest { av: *ah.address_vector(), remote_qpn: MULTICAST_QPN, remote_qkey: QKEY }),
        };
        sender.post_send(&wr).unwrap();
        let c = wait(&s.cq, 1);
        assert_eq!((c[0].wr_id, c[0].status), (i as u64, WcStatus::Success));
    }
}

/// Every member's copies of datagrams `first..first + n`, in order, bytes checked.
fn check_copies(qp: &Qp, s: &Side, sender: &Qp, first: usize, n: usize) {
    let got = wait(&s.cq, n);
    for (k, c) in got.iter().enumerate() {
        let i = first + k;
        assert_eq!(
            (c.qp_num, c.status, c.src_qp, c.byte_len as usize),
            (qp.qp_num(), WcStatus::Success, sender.qp_num(), 40 + 64 + i),
            "copy {i} at QP {:#x}",
            qp.qp_num()
        );
        let slot = c.wr_id as usize;
        assert_eq!(bytes(&s.mr, slot * SLOT + 40..slot * SLOT + 40 + 64 + i), expected(64 + i, i as u8));
    }
}

#[test]
fn members_on_every_shard_of_both_devices_each_get_a_copy() {
    veth::require_root();
    let (_pair, ca, cb) = veth::pair_sharded(Impairments::default(), 1500, 2);
    let g = gid([239, 77, 1, 1]);
    let mut sa = side(&ca, 64 * SLOT);
    let sender = ud_qp(&sa, QKEY);
    // QPs go to the shards in turn: these land on both shards of each device.
    let sides: Vec<(Context, Side)> = (0..6).map(|i| if i < 2 { ca.clone() } else { cb.clone() }).map(|c| (c.clone(), side(&c, 64 * SLOT))).collect();
    let qps: Vec<Qp> = sides.iter().map(|(_, s)| ud_qp(s, QKEY)).collect();
    let shards = |ctx: &Context| qps.iter().zip(&sides).filter(|(_, (c, _))| c.name() == ctx.name()).map(|(q, _)| q.qp_num() % 2).collect::<Vec<_>>();
    for ctx in [&ca, &cb] {
        let s = shards(ctx);
        assert!(s.contains(&0) && s.contains(&1), "members on both shards of {}: {s:?}", ctx.name());
    }
    for (qp, (_, s)) in qps.iter().zip(&sides) {
        qp.attach_mcast(&g).unwrap();
        for slot in 0..4 {
            recv_one(qp, s, slot);
        }
    }
    let ah = sa.pd.create_ah(&AhAttr { dgid: g, sgid_index: 1, port_num: 1, ..AhAttr::default() }).unwrap();
    send_n(&mut sa, &sender, &ah, 0, 4);
    for (qp, (_, s)) in qps.iter().zip(&sides) {
        check_copies(qp, s, &sender, 0, 4);
    }
    assert_eq!(cb.counters().get("mcast_frames"), Some(8), "each frame taken by both of b's shards");
    assert_eq!(cb.counters().get("rx_mcast_no_member"), Some(0));
    assert!(ca.counters().get("loopback_frames").unwrap() >= 4, "a's own members got theirs inside the device");
}

#[test]
fn an_ipv6_group_joins_with_mld_and_delivers() {
    veth::require_root();
    let _ = Segment::sweep_stale();
    let seg = Segment::create("mc6", 3, 1500).expect("create the segment (needs root and iproute2)");
    let open = |i: usize| {
        let mode = DatapathMode::Thread { core: None, idle: IdlePolicy::default() };
        open_af_xdp(Some(&seg.ns[i]), &format!("urnic{i}"), &XskConfig::new(&seg.ifname[i]), mode).expect("AF_XDP device")
    };
    let (ca, cb, cc) = (open(0), open(1), open(2));
    let g: Gid = "ff0e::77:1".parse::<std::net::Ipv6Addr>().unwrap().octets();
    let v6_groups = |i: usize| {
        let o = Command::new("ip").args(["-n", &seg.ns[i], "-6", "maddr", "show", "dev", &seg.ifname[i]]).output().expect("ip maddr");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let mut sa = side(&ca, 64 * SLOT);
    let sender = ud_qp(&sa, QKEY);
    let (sb, sc) = (side(&cb, 64 * SLOT), side(&cc, 64 * SLOT));
    let (qb, qc) = (ud_qp(&sb, QKEY), ud_qp(&sc, QKEY));
    for (qp, s) in [(&qb, &sb), (&qc, &sc)] {
        qp.attach_mcast(&g).unwrap();
        for slot in 0..4 {
            recv_one(qp, s, slot);
        }
    }
    assert!(v6_groups(1).contains("ff0e::77:1"), "MLD join on b: {}", v6_groups(1));
    // GID index 2 is our IPv6 address (fd75::1): IPv6 framing.
    let ah = sa.pd.create_ah(&AhAttr { dgid: g, sgid_index: 2, port_num: 1, ..AhAttr::default() }).unwrap();
    assert_eq!(ah.address_vector().dmac, [0x33, 0x33, 0, 0x77, 0, 1], "RFC 2464 MAC");
    send_n(&mut sa, &sender, &ah, 0, 3);
    check_copies(&qb, &sb, &sender, 0, 3);
    check_copies(&qc, &sc, &sender, 0, 3);
    let grh = bytes(&sb.mr, 0..40);
    assert_eq!(grh[0] >> 4, 6, "an IPv6 GRH");
    assert_eq!(&grh[24..40], &g, "destination: the group");
    drop(qb);
    assert!(!v6_groups(1).contains("ff0e::77:1"), "left with the QP");
    drop(seg);
}

#[test]
fn more_groups_than_one_socket_holds_are_all_joined_and_left() {
    veth::require_root();
    let _ = VethPair::sweep_stale();
    let pair = VethPair::create("mcn", 1500).expect("veth pair (needs root and iproute2)");
    let mode = DatapathMode::Thread { core: None, idle: IdlePolicy::default() };
    let ctx = open_af_xdp(Some(&pair.ns[0]), "urnic0", &XskConfig::new(&pair.ifname[0]), mode).expect("AF_XDP device");
    let s = side(&ctx, 4 * SLOT);
    let (q1, q2) = (ud_qp(&s, QKEY), ud_qp(&s, QKEY));
    // igmp_max_memberships is 20 per socket by default: 45 groups need three.
    let groups: Vec<Gid> = (1..=45).map(|i| gid([239, 78, 0, i])).collect();
    for g in &groups {
        q1.attach_mcast(g).unwrap();
    }
    q2.attach_mcast(&groups[0]).unwrap();
    let held = |s: &str| s.lines().filter_map(|l| l.trim().strip_prefix("inet ")).filter(|a| a.trim().starts_with("239.78.0.")).count();
    assert_eq!(held(&kernel_groups(&pair.ns[0], &pair.ifname[0])), 45, "{}", kernel_groups(&pair.ns[0], &pair.ifname[0]));
    for g in &groups {
        q1.detach_mcast(g).unwrap();
    }
    assert_eq!(held(&kernel_groups(&pair.ns[0], &pair.ifname[0])), 1, "q2 still holds the first group");
    // Rejoining reuses the sockets' room.
    for g in &groups[1..25] {
        q2.attach_mcast(g).unwrap();
    }
    assert_eq!(held(&kernel_groups(&pair.ns[0], &pair.ifname[0])), 25);
    drop(q2);
    assert_eq!(held(&kernel_groups(&pair.ns[0], &pair.ifname[0])), 0);
}
