//! Loopback on the in-memory port: QPs of one device talking to each other
//! through the device's own GIDs (RC and UD, SEND/WRITE/READ/atomics). The
//! device's port drops every frame it sends, so anything that left through
//! the port would be lost: loopback must never touch it.

mod common;
mod loopback_cases;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use loopback_cases::*;
use urnic::*;

const MIB: usize = 1 << 20;
const IPV6: [u8; 16] = [0xfd, 0x75, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

/// A device alone on a hub (IPv4 10.0.0.1, IPv6 fd75::1), its port
/// impaired with `impair`.
fn device_alone(hub: &Arc<MemHub>, impair: Impairments) -> Context {
    let mut cfg = DeviceConfig::memory(hub, "urnic0", MAC_A, [10, 0, 0, 1]);
    cfg.ipv6 = vec![IPV6];
    if let PortConfig::Memory { impairments, .. } = &mut cfg.port {
        *impairments = impair;
    }
    open_device(cfg).unwrap()
}

/// A port that loses everything it is given.
fn black_hole() -> Impairments {
    Impairments::from(Faults { loss: 1.0, ..Faults::NONE })
}

/// Nothing reached the hub: no frame delivered, none dropped by the port's
/// impairment.
fn assert_hub_untouched(hub: &MemHub) {
    let s = &hub.stats;
    let g = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!((g(&s.delivered), g(&s.dropped), g(&s.unknown_dst)), (0, 0, 0), "frames reached the hub");
}

#[test]
fn rc_through_the_ipv4_mapped_gid() {
    let hub = MemHub::new(1);
    let ctx = device_alone(&hub, black_hole());
    assert_eq!(ctx.query_gid(1, 1).unwrap(), [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1]);
    rc_to_itself(&ctx, 1);
    assert_hub_untouched(&hub);
}

#[test]
fn rc_through_the_ipv6_gid() {
    let hub = MemHub::new(2);
    let ctx = device_alone(&hub, black_hole());
    assert_eq!(ctx.query_gid(1, 2).unwrap(), IPV6);
    rc_to_itself(&ctx, 2);
    assert_hub_untouched(&hub);
}

#[test]
fn ud_through_the_ipv4_mapped_gid() {
    let hub = MemHub::new(3);
    let ctx = device_alone(&hub, black_hole());
    ud_to_itself(&ctx, 1);
    assert_hub_untouched(&hub);
}

#[test]
fn ud_through_the_ipv6_gid() {
    let hub = MemHub::new(4);
    let ctx = device_alone(&hub, black_hole());
    ud_to_itself(&ctx, 2);
    assert_hub_untouched(&hub);
}

#[test]
fn own_gids_resolve_to_own_mac_and_others_need_a_neighbour() {
    let hub = MemHub::new(5);
    let ctx = device_alone(&hub, Impairments::default());
    for g in ctx.gids().to_vec() {
        assert_eq!(ctx.resolve_mac(&g).unwrap(), MAC_A);
        let pd = ctx.alloc_pd().unwrap();
        // From the GID of the same IP version (2 = fd75::1 for IPv6 ones).
        let sgid_index = if g[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff] { 1 } else { 2 };
        let ah = pd.create_ah(&AhAttr { dgid: g, sgid_index, port_num: 1, ..AhAttr::default() }).unwrap();
        assert_eq!(ah.address_vector().dmac, MAC_A);
    }
    let stranger = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 9];
    let e = ctx.resolve_mac(&stranger).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert!(e.to_string().contains("no neighbour entry for GID ::ffff:10.0.0.9") && !e.to_string().contains("link-local"), "{e}");
    // A stranger's link-local GID: the message says what it takes.
    let e = ctx.resolve_mac(&link_local_gid([2, 0, 0, 0, 0, 9])).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert!(e.to_string().contains("fe80::") && e.to_string().contains("IPv6 on at both ends"), "{e}");
}

#[test]
fn loopback_beside_a_lossy_link_ipv4() {
    let hub = MemHub::new(6);
    // Only a's port loses frames (5 %): the WRITEs a sends to b.
    let mut ca = DeviceConfig::memory(&hub, "urnic0", MAC_A, [10, 0, 0, 1]);
    if let PortConfig::Memory { impairments, .. } = &mut ca.port {
        impairments.faults.loss = 0.05;
    }
    let ca = open_device(ca).unwrap();
    let cb = open_device(DeviceConfig::memory(&hub, "urnic1", [2, 0, 0, 0, 0, 2], [10, 0, 0, 2])).unwrap();
    loopback_cases::loopback_beside_a_lossy_link(&ca, &cb, 1);
    let dropped = hub.stats.dropped.load(std::sync::atomic::Ordering::Relaxed);
    assert!(dropped > 0);
}

/// Poll every shard of `ctx` (a manual datapath) until `cq` has `n`
/// completions; a hang detector after a generous deadline.
fn poll_until(ctx: &Context, cq: &Cq, n: usize) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut out = Vec::new();
    let mut buf = vec![WorkCompletion::default(); 16];
    while out.len() < n {
        ctx.poll();
        let k = cq.poll(&mut buf).unwrap();
        out.extend_from_slice(&buf[..k]);
        assert!(Instant::now() < deadline, "only {} of {n} completions: {out:?}", out.len());
    }
    out
}

/// Two shards (a manual datapath polled by the test): nine QPs of shard 0
/// each SEND 256 KiB to their own QP of shard 1 through our own GID while
/// shard 1 is not polled. Each sender has at most 128 packets unacked, so
/// 1152 frames head for shard 1: its loopback queue takes 1024 and the
/// rest are dropped and counted, not buffered. Once shard 1 polls again,
/// RC retransmits what was dropped and every message arrives whole.
#[test]
fn a_full_loopback_queue_drops_and_rc_recovers() {
    let hub = MemHub::new(7);
    let ports: Vec<Box<dyn urnic_datapath::Port>> =
        (0..2).map(|_| Box::new(hub.attach(MAC_A, 1500, black_hole())) as Box<dyn urnic_datapath::Port>).collect();
    let mut cfg = DeviceConfig::memory(&hub, "urnic0", MAC_A, [10, 0, 0, 1]);
    cfg.port = PortConfig::Custom { ports, resolve: Box::new(|_| None) };
    cfg.datapath = DatapathMode::Manual;
    let ctx = open_device(cfg).unwrap();
    let nic = ctx.nic().clone();
    assert_eq!(nic.shard_count(), 2);
    let gid = ctx.query_gid(1, 1).unwrap();
    let (mut s, r) = (side(&ctx, 4 * MIB), side(&ctx, 4 * MIB));
    const PAIRS: usize = 9;
    const LEN: usize = 256 * 1024;
    let mut pairs = Vec::new();
    for i in 0..PAIRS {
        // New QPs go to the shards in turn: senders on 0, receivers on 1.
        let (qs, qr) = (rc_qp(&s, None), rc_qp(&r, None));
        assert_eq!((nic.shard_of(qs.qp_num()), nic.shard_of(qr.qp_num())), (0, 1), "pair {i} across the shards");
        qs.connect(&Connect::new(qr.qp_num(), gid, 1, 2)).unwrap();
        qr.connect(&Connect::new(qs.qp_num(), gid, 2, 1)).unwrap();
        fill(&mut s.mr, i * LEN, LEN, i as u8);
        qr.post_recv(&RecvWr { wr_id: 100 + i as u64, sgl: vec![r.mr.sge(i * LEN, LEN as u32)] }).unwrap();
        pairs.push((qs, qr));
    }
    let before = Snapshot::of(&ctx);
    for (i, (qs, _)) in pairs.iter().enumerate() {
        qs.post_send(&send_wr(i as u64, SendOp::Send, vec![s.mr.sge(i * LEN, LEN as u32)])).unwrap();
    }
    // Only shard 0 runs.
    let deadline = Instant::now() + Duration::from_secs(120);
    while Snapshot::of(&ctx).since(&before).loopback_drops == 0 {
        nic.poll_shard(0);
        assert!(Instant::now() < deadline, "the loopback queue never filled: {:?}", Snapshot::of(&ctx).since(&before));
    }
    let full = Snapshot::of(&ctx).since(&before);
    assert_eq!((full.loopback_frames, full.engine_rx), (1024, 0), "the queue holds 1024 frames, no more: {full:?}");

    let mut sent = poll_until(&ctx, &s.cq, PAIRS);
    sent.sort_by_key(|c| c.wr_id);
    assert!(sent.iter().enumerate().all(|(i, c)| c.wr_id == i as u64 && c.status == WcStatus::Success), "{sent:?}");
    let mut got = poll_until(&ctx, &r.cq, PAIRS);
    got.sort_by_key(|c| c.wr_id);
    for (i, c) in got.iter().enumerate() {
        assert_eq!((c.wr_id, c.status, c.byte_len as usize), (100 + i as u64, WcStatus::Success, LEN));
        assert_eq!(bytes(&r.mr, i * LEN..(i + 1) * LEN), expected(LEN, i as u8), "message {i}");
    }
    let d = Snapshot::of(&ctx).since(&before);
    let retransmits: u64 = pairs.iter().map(|(qs, _)| qs.stats().unwrap().req_retransmits).sum();
    assert!(d.loopback_drops > 0 && retransmits > 0, "{d:?}, {retransmits} retransmissions");
    assert_eq!(d.loopback_frames + d.loopback_drops, d.engine_tx, "every frame built was looped or dropped: {d:?}");
    assert_eq!(d.loopback_frames, d.engine_rx, "every frame queued reached its engine: {d:?}");
    assert_eq!((d.port_tx, d.port_rx), (0, 0), "{d:?}");
    assert_hub_untouched(&hub);
}

/// A capture holds each looped-back frame once, as the engine built it.
#[test]
fn loopback_frames_are_captured_once() {
    let hub = MemHub::new(8);
    let ctx = device_alone(&hub, black_hole());
    let path = std::env::temp_dir().join(format!("urnic-loopback-{}.pcap", std::process::id()));
    ctx.nic().set_capture(Some(&path)).unwrap();
    let before = Snapshot::of(&ctx);
    ud_to_itself(&ctx, 1);
    let d = Snapshot::of(&ctx).since(&before);
    ctx.nic().set_capture(None).unwrap();
    let frames = urnic_datapath::capture::read_frames(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!(frames.len() as u64, d.loopback_frames, "{d:?}");
    for f in &frames {
        assert_eq!((&f[..6], &f[6..12]), (&MAC_A[..], &MAC_A[..]), "to and from our own MAC");
        assert!(rocev2::wire::parse_frame(f).is_ok(), "a whole RoCEv2 frame with its ICRC");
    }
}

#[test]
fn a_memory_port_with_a_fault_probability_outside_0_to_1_is_refused() {
    let hub = MemHub::new(1);
    for faults in [Faults { loss: 1.5, ..Faults::NONE }, Faults { reorder: f64::NAN, ..Faults::NONE }] {
        let mut cfg = DeviceConfig::memory(&hub, "urnic0", MAC_A, [10, 0, 0, 1]);
        if let PortConfig::Memory { impairments, .. } = &mut cfg.port {
            *impairments = faults.into();
        }
        let e = open_device(cfg).err().expect("bad impairments accepted");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("probability"), "{e}");
    }
    assert_eq!(hub.stats.delivered.load(std::sync::atomic::Ordering::Relaxed), 0);
}
