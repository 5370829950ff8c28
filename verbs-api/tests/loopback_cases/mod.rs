//! Loopback cases: QPs of one device talking to each other through the
//! device itself (a destination GID that is the device's own), written
//! against one `Context` so they run on any port: the in-memory hub
//! (`verbs-api/tests/loopback.rs`) and an AF_XDP device on veth
//! (`loopback-test/tests/veth_loopback.rs`).
//!
//! Each case uses two sets of resources (PD, CQ, MR), as a server and a
//! client in one process would, checks every byte, and checks the counters:
//! every frame the QPs sent was looped back inside the NIC, none reached
//! the port, none was lost or retransmitted.

#![allow(dead_code)]

use super::common::*;
use urnic::*;

const MIB: usize = 1 << 20;

/// The counters a loopback case compares before and after.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// Frames looped back inside the NIC.
    pub loopback_frames: u64,
    /// Looped-back frames dropped (queue full).
    pub loopback_drops: u64,
    /// Frames handed to the port.
    pub port_tx: u64,
    /// Frames received from the port.
    pub port_rx: u64,
    /// Frames the engines built.
    pub engine_tx: u64,
    /// Frames the engines were handed.
    pub engine_rx: u64,
}

impl Snapshot {
    pub fn of(ctx: &Context) -> Snapshot {
        let nic = ctx.nic();
        let g = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        let e = ctx.engine_stats();
        Snapshot {
            loopback_frames: g(&nic.stats.loopback_frames),
            loopback_drops: g(&nic.stats.loopback_drops),
            port_tx: g(&nic.stats.tx_frames),
            port_rx: g(&nic.stats.rx_frames),
            engine_tx: e.tx_frames,
            engine_rx: e.rx_frames,
        }
    }

    /// What happened since `before`, counter by counter.
    pub fn since(&self, before: &Snapshot) -> Snapshot {
        Snapshot {
            loopback_frames: self.loopback_frames - before.loopback_frames,
            loopback_drops: self.loopback_drops - before.loopback_drops,
            port_tx: self.port_tx - before.port_tx,
            port_rx: self.port_rx - before.port_rx,
            engine_tx: self.engine_tx - before.engine_tx,
            engine_rx: self.engine_rx - before.engine_rx,
        }
    }

    /// Only loopback traffic happened, and all of it arrived: every frame
    /// the engines built was looped back and handed to an engine, nothing
    /// went to or came from the port, nothing was dropped. At least `min`
    /// frames.
    pub fn assert_only_loopback(&self, min: u64) {
        assert_eq!((self.port_tx, self.port_rx), (0, 0), "frames on the wire during loopback traffic: {self:?}");
        assert_eq!(self.loopback_drops, 0, "{self:?}");
        assert_eq!(self.loopback_frames, self.engine_tx, "every frame built was looped back: {self:?}");
        assert_eq!(self.engine_rx, self.engine_tx, "every looped frame reached an engine: {self:?}");
        assert!(self.loopback_frames >= min, "at least {min} frames looped back: {self:?}");
    }
}

/// Every packet `a` sent reached `b` and the other way round: each QP's
/// `tx_packets` (retransmissions included, if a stalled thread made any)
/// equals its peer's `rx_packets`. Waits for frames still in flight, so a
/// lost frame shows as a hang (panics after a generous deadline), not as a
/// timing-dependent count.
pub fn assert_lossless(a: &Qp, b: &Qp) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (sa, sb) = (a.stats().unwrap(), b.stats().unwrap());
        if sa.tx_packets == sb.rx_packets && sb.tx_packets == sa.rx_packets {
            assert!(sa.tx_packets > 0 && sb.tx_packets > 0);
            return;
        }
        assert!(std::time::Instant::now() < deadline, "frames lost between QP {:#x} and {:#x}: {sa:?}\n{sb:?}", a.qp_num(), b.qp_num());
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Two RC QPs of `ctx` (each with its own PD, CQ and MR) connected to each
/// other through our own GID at `sgid_index`.
pub fn rc_self_pair(ctx: &Context, sgid_index: u8, buf: usize) -> (Side, Qp, Side, Qp) {
    let gid = ctx.query_gid(1, sgid_index as u32).unwrap();
    let a = side(ctx, buf);
    let b = side(ctx, buf);
    let qa = rc_qp(&a, None);
    let qb = rc_qp(&b, None);
    let connect = |qp: &Qp, remote: u32, lpsn: u32, rpsn: u32| {
        let c = Connect { sgid_index, min_rnr_timer: 1, ..Connect::new(remote, gid, lpsn, rpsn) };
        qp.connect(&c).unwrap();
    };
    connect(&qa, qb.qp_num(), 100, 0xff_fff0);
    connect(&qb, qa.qp_num(), 0xff_fff0, 100);
    (a, qa, b, qb)
}

/// SEND (with and without immediate, 0 B to over a MiB, both ways), WRITE,
/// WRITE with immediate, READ into three SGEs, FETCH_ADD and CMP_SWAP
/// between two RC QPs of one device through its GID at `sgid_index`; every
/// byte and every completion checked; every frame looped back. Returns
/// the two QPNs.
pub fn rc_to_itself(ctx: &Context, sgid_index: u8) -> (u32, u32) {
    let (mut a, qa, mut b, qb) = rc_self_pair(ctx, sgid_index, 4 * MIB);
    let before = Snapshot::of(ctx);

    // SEND a → b, sizes across the MTU and many packets; PSNs wrap on a.
    for (i, &len) in [0usize, 1, 1025, 4097, 65536, MIB + 3].iter().enumerate() {
        fill(&mut a.mr, 0, len, i as u8);
        qb.post_recv(&RecvWr { wr_id: 1000 + i as u64, sgl: vec![b.mr.sge(0, (2 * MIB) as u32)] }).unwrap();
        let op = if i % 2 == 0 { SendOp::Send } else { SendOp::SendWithImm { imm: 0xabc0 + i as u32 } };
        qa.post_send(&send_wr(i as u64, op, vec![a.mr.sge(0, len as u32)])).unwrap();
        let s = wait(&a.cq, 1);
        assert_eq!((s[0].wr_id, s[0].status, s[0].opcode, s[0].qp_num), (i as u64, WcStatus::Success, WcOpcode::Send, qa.qp_num()));
        let r = wait(&b.cq, 1);
        assert_eq!((r[0].wr_id, r[0].status, r[0].opcode, r[0].byte_len as usize), (1000 + i as u64, WcStatus::Success, WcOpcode::Recv, len));
        assert_eq!((r[0].qp_num, r[0].imm_data), (qb.qp_num(), if i % 2 == 0 { None } else { Some(0xabc0 + i as u32) }));
        assert_eq!(bytes(&b.mr, 0..len), &expected(len, i as u8)[..], "SEND of {len} bytes");
    }
    // SEND b → a.
    fill(&mut b.mr, 0, 3000, 77);
    qa.post_recv(&RecvWr { wr_id: 5, sgl: vec![a.mr.sge(MIB, 4096)] }).unwrap();
    qb.post_send(&send_wr(6, SendOp::Send, vec![b.mr.sge(0, 3000)])).unwrap();
    assert_eq!(wait(&b.cq, 1)[0].status, WcStatus::Success);
    let r = wait(&a.cq, 1);
    assert_eq!((r[0].wr_id, r[0].status, r[0].byte_len), (5, WcStatus::Success, 3000));
    assert_eq!(bytes(&a.mr, MIB..MIB + 3000), &expected(3000, 77)[..]);

    // WRITE a → b.
    for (i, &len) in [0usize, 1, 1024, 1500, 70_000, MIB].iter().enumerate() {
        fill(&mut a.mr, 0, len, 40 + i as u8);
        let off = 2 * MIB + 4096 * i;
        let remote = RemoteAddr { addr: b.mr.addr() + off as u64, rkey: b.mr.rkey() };
        qa.post_send(&send_wr(20 + i as u64, SendOp::Write { remote }, vec![a.mr.sge(0, len as u32)])).unwrap();
        let c = wait(&a.cq, 1);
        assert_eq!((c[0].wr_id, c[0].status, c[0].opcode), (20 + i as u64, WcStatus::Success, WcOpcode::RdmaWrite));
        assert_eq!(bytes(&b.mr, off..off + len), &expected(len, 40 + i as u8)[..], "WRITE of {len} bytes");
    }
    // WRITE with immediate consumes a receive of b.
    qb.post_recv(&RecvWr { wr_id: 77, sgl: vec![] }).unwrap();
    fill(&mut a.mr, 0, 3000, 9);
    let remote = RemoteAddr { addr: b.mr.addr() + 100, rkey: b.mr.rkey() };
    qa.post_send(&send_wr(9, SendOp::WriteWithImm { remote, imm: 0x1234_5678 }, vec![a.mr.sge(0, 3000)])).unwrap();
    let r = wait(&b.cq, 1);
    assert_eq!((r[0].wr_id, r[0].opcode, r[0].byte_len, r[0].imm_data), (77, WcOpcode::RecvRdmaWithImm, 3000, Some(0x1234_5678)));
    assert_eq!(bytes(&b.mr, 100..3100), &expected(3000, 9)[..]);
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::Success);

    // READ: a reads b's memory into three SGEs, then b reads a's.
    for (i, &len) in [0usize, 8, 1025, 300_000].iter().enumerate() {
        fill(&mut b.mr, 0, len, 80 + i as u8);
        let remote = RemoteAddr { addr: b.mr.addr(), rkey: b.mr.rkey() };
        let (l1, l2) = (len / 3, len / 3);
        let l3 = len - l1 - l2;
        let base = 2 * MIB;
        let sgl = vec![a.mr.sge(base, l1 as u32), a.mr.sge(base + l1 + 64, l2 as u32), a.mr.sge(base + l1 + l2 + 128, l3 as u32)];
        qa.post_send(&send_wr(40 + i as u64, SendOp::Read { remote }, sgl)).unwrap();
        let c = wait(&a.cq, 1);
        assert_eq!((c[0].wr_id, c[0].status, c[0].opcode, c[0].byte_len as usize), (40 + i as u64, WcStatus::Success, WcOpcode::RdmaRead, len));
        let mut got = bytes(&a.mr, base..base + l1);
        got.extend_from_slice(&bytes(&a.mr, base + l1 + 64..base + l1 + 64 + l2));
        got.extend_from_slice(&bytes(&a.mr, base + l1 + l2 + 128..base + l1 + l2 + 128 + l3));
        assert_eq!(got, expected(len, 80 + i as u8), "READ of {len} bytes");
    }
    fill(&mut a.mr, 3 * MIB, 5000, 11);
    let remote = RemoteAddr { addr: a.mr.addr() + (3 * MIB) as u64, rkey: a.mr.rkey() };
    qb.post_send(&send_wr(50, SendOp::Read { remote }, vec![b.mr.sge(3 * MIB, 5000)])).unwrap();
    assert_eq!(wait(&b.cq, 1)[0].status, WcStatus::Success);
    assert_eq!(bytes(&b.mr, 3 * MIB..3 * MIB + 5000), &expected(5000, 11)[..]);

    // Atomics on b's memory.
    b.mr.write_at(64, &10u64.to_ne_bytes()).unwrap();
    let remote = RemoteAddr { addr: b.mr.addr() + 64, rkey: b.mr.rkey() };
    qa.post_send(&send_wr(61, SendOp::FetchAdd { remote, add: 5 }, vec![a.mr.sge(0, 8)])).unwrap();
    qa.post_send(&send_wr(62, SendOp::CmpSwap { remote, compare: 15, swap: 99 }, vec![a.mr.sge(8, 8)])).unwrap();
    qa.post_send(&send_wr(63, SendOp::CmpSwap { remote, compare: 15, swap: 1 }, vec![a.mr.sge(16, 8)])).unwrap();
    let c = wait(&a.cq, 3);
    assert!(c.iter().all(|c| c.status == WcStatus::Success), "{c:?}");
    let ops: Vec<_> = c.iter().map(|c| (c.wr_id, c.opcode)).collect();
    assert_eq!(ops, [(61, WcOpcode::FetchAdd), (62, WcOpcode::CompSwap), (63, WcOpcode::CompSwap)]);
    let v = |o: usize| u64::from_ne_bytes(bytes(&a.mr, o..o + 8).try_into().unwrap());
    assert_eq!((v(0), v(8), v(16)), (10, 15, 99));
    assert_eq!(u64::from_ne_bytes(bytes(&b.mr, 64..72).try_into().unwrap()), 99);

    // A MiB and more of SENDs and WRITEs went one way: well over 2000
    // request packets, plus the READ responses.
    assert_lossless(&qa, &qb);
    Snapshot::of(ctx).since(&before).assert_only_loopback(2000);
    assert_quiet(&a.cq);
    assert_quiet(&b.cq);
    (qa.qp_num(), qb.qp_num())
}

/// UD SENDs between two UD QPs of one device, both ways, through an
/// address handle on our own GID at `sgid_index`: payload, immediate,
/// source QPN and GRH checked; every frame looped back.
pub fn ud_to_itself(ctx: &Context, sgid_index: u8) {
    let gid = ctx.query_gid(1, sgid_index as u32).unwrap();
    let mtu = ctx.query_port(1).unwrap().active_mtu.bytes() as usize;
    let (mut a, mut b) = (side(ctx, 65536), side(ctx, 65536));
    let (qa, qb) = (ud_qp(&a, 0x1111_1111), ud_qp(&b, 0x2222_2222));
    let before = Snapshot::of(ctx);
    let ah = a.pd.create_ah(&AhAttr { dgid: gid, sgid_index, port_num: 1, ..AhAttr::default() }).unwrap();
    assert_eq!(ah.address_vector().dmac, ctx.mac(), "our own GID resolves to our own MAC");
    let sizes = [0usize, 1, 512, mtu];
    for (i, &len) in sizes.iter().enumerate() {
        for dir in 0..2 {
            let (from, to, qfrom, qto, qkey) =
                if dir == 0 { (&mut a, &mut b, &qa, &qb, 0x2222_2222) } else { (&mut b, &mut a, &qb, &qa, 0x1111_1111) };
            let seed = 7 * i as u8 + qkey as u8;
            qto.post_recv(&RecvWr { wr_id: 100 + i as u64, sgl: vec![to.mr.sge(4096, (40 + mtu) as u32)] }).unwrap();
            fill(&mut from.mr, 0, len, seed);
            let wr = SendWr {
                wr_id: i as u64,
                op: SendOp::SendWithImm { imm: 42 + i as u32 },
                payload: Payload::Sgl(vec![from.mr.sge(0, len as u32)]),
                flags: SendFlags::SIGNALED,
                ud: Some(UdDest { av: *ah.address_vector(), remote_qpn: qto.qp_num(), remote_qkey: qkey }),
            };
            qfrom.post_send(&wr).unwrap();
            let s = wait(&from.cq, 1);
            assert_eq!((s[0].wr_id, s[0].status), (i as u64, WcStatus::Success));
            let r = wait(&to.cq, 1);
            assert_eq!(
                (r[0].wr_id, r[0].status, r[0].byte_len as usize, r[0].src_qp, r[0].grh, r[0].imm_data),
                (100 + i as u64, WcStatus::Success, 40 + len, qfrom.qp_num(), true, Some(42 + i as u32)),
                "UD SEND of {len} bytes"
            );
            assert_eq!(bytes(&to.mr, 4096 + 40..4096 + 40 + len), &expected(len, seed)[..]);
        }
    }
    assert_lossless(&qa, &qb);
    Snapshot::of(ctx).since(&before).assert_only_loopback(2 * sizes.len() as u64);
    assert_quiet(&a.cq);
    assert_quiet(&b.cq);
}

/// Loopback beside traffic on a lossy link: `a` (whose link drops frames)
/// runs RC WRITEs and SENDs to `b` over the wire while two of its own QPs
/// exchange WRITEs and READs through its GID at `sgid_index`. The wire
/// loses frames, loopback none; all data arrives.
pub fn loopback_beside_a_lossy_link(ca: &Context, cb: &Context, sgid_index: u8) {
    // Over the wire: a → b.
    let mut wa = side(ca, 4 * MIB);
    let wb = side(cb, 4 * MIB);
    let (qwa, qwb) = (rc_qp(&wa, None), rc_qp(&wb, None));
    let connect = |qp: &Qp, remote: u32, gid: Gid, lpsn: u32, rpsn: u32| {
        let c = Connect { sgid_index, min_rnr_timer: 1, ..Connect::new(remote, gid, lpsn, rpsn) };
        qp.connect(&c).unwrap();
    };
    connect(&qwa, qwb.qp_num(), cb.query_gid(1, sgid_index as u32).unwrap(), 1, 2);
    connect(&qwb, qwa.qp_num(), ca.query_gid(1, sgid_index as u32).unwrap(), 2, 1);
    // Through a itself.
    let (mut la, qla, lb, qlb) = rc_self_pair(ca, sgid_index, 4 * MIB);

    let rounds = 16;
    for round in 0..rounds {
        let len = 64 * 1024 + round * 1000;
        let seed = round as u8;
        // Post both, then wait for both: they run at the same time.
        fill(&mut wa.mr, 0, len, seed);
        let remote = RemoteAddr { addr: wb.mr.addr() + (round * 128 * 1024) as u64 % (2 * MIB) as u64, rkey: wb.mr.rkey() };
        qwa.post_send(&send_wr(round as u64, SendOp::Write { remote }, vec![wa.mr.sge(0, len as u32)])).unwrap();
        fill(&mut la.mr, 0, len, seed.wrapping_add(100));
        let lremote = RemoteAddr { addr: lb.mr.addr() + (MIB + round * 128 * 1024 % MIB) as u64, rkey: lb.mr.rkey() };
        qla.post_send(&send_wr(round as u64, SendOp::Write { remote: lremote }, vec![la.mr.sge(0, len as u32)])).unwrap();
        let c = wait(&la.cq, 1);
        assert_eq!((c[0].wr_id, c[0].status), (round as u64, WcStatus::Success), "loopback WRITE");
        let off = (lremote.addr - lb.mr.addr()) as usize;
        assert_eq!(bytes(&lb.mr, off..off + len), &expected(len, seed.wrapping_add(100))[..]);
        // And b of the loopback pair reads back what a sent from.
        let rremote = RemoteAddr { addr: la.mr.addr(), rkey: la.mr.rkey() };
        qlb.post_send(&send_wr(round as u64, SendOp::Read { remote: rremote }, vec![lb.mr.sge(3 * MIB, len as u32)])).unwrap();
        let c = wait(&lb.cq, 1);
        assert_eq!((c[0].wr_id, c[0].status), (round as u64, WcStatus::Success), "loopback READ");
        assert_eq!(bytes(&lb.mr, 3 * MIB..3 * MIB + len), &expected(len, seed.wrapping_add(100))[..]);
        let c = wait(&wa.cq, 1);
        assert_eq!((c[0].wr_id, c[0].status), (round as u64, WcStatus::Success), "WRITE over the lossy link");
        let off = (remote.addr - wb.mr.addr()) as usize;
        assert_eq!(bytes(&wb.mr, off..off + len), &expected(len, seed)[..]);
    }
    // The link lost some of a's frames (requests on the in-memory hub,
    // requests or ACKs on veth, where each end's XDP program drops): what
    // one QP sent and the other received differ, in one direction or both.
    let (sa, sb) = (qwa.stats().unwrap(), qwb.stats().unwrap());
    assert!(sa.tx_packets > sb.rx_packets || sb.tx_packets > sa.rx_packets, "the link lost nothing: is the impairment on?\n{sa:?}\n{sb:?}");
    assert_lossless(&qla, &qlb);
    assert_eq!(Snapshot::of(ca).loopback_drops, 0);
}
