//! One test per transport rule, with two engines joined by the simulator's
//! two-engine harness (`rocev2::sim::pair`) in virtual time, dropping
//! chosen frames.

use std::sync::Arc;
use std::time::Duration;

use rocev2::psn::Psn;
use rocev2::sim::pair::{Dir, Host, Pair, PairConfig, RUN_LIMIT};
use rocev2::sim::rc::RcParams;
use rocev2::time::Instant;
use rocev2::transport::attr::*;
use rocev2::transport::engine::{Engine, EngineConfig, EngineError};
use rocev2::transport::memory::{Access, MemoryTable, PdId};
use rocev2::transport::wqe::{OwnedRecvs, RecvWqe};
use rocev2::transport::wr::*;
use rocev2::wire::Opcode;

const PD: PdId = PdId(1);
const BUF: usize = 1 << 20;

struct Opts {
    mtu: Mtu,
    a_psn: u32,
    b_psn: u32,
    retry_cnt: u8,
    rnr_retry: u8,
    max_rd_atomic: u8,
    sig_all: bool,
}

impl Default for Opts {
    fn default() -> Self {
        Opts { mtu: Mtu::Mtu1024, a_psn: 100, b_psn: 5000, retry_cnt: 7, rnr_retry: 7, max_rd_atomic: 4, sig_all: true }
    }
}

/// Hosts 10.0.0.1 (first QPN 0x12) and 10.0.0.2 (0x13) with 1 MiB buffers
/// and one RC QP each, connected with a 1 ms ACK timeout (4.096 µs × 2^8); every
/// frame is recorded in `p.log()`.
fn pair(o: Opts) -> Pair {
    let mut cfg = PairConfig::default();
    cfg.engines[0].first_qpn = 0x12;
    cfg.engines[1].first_qpn = 0x13;
    cfg.qp.sq_sig_all = o.sig_all;
    cfg.buf_len = BUF;
    let params = |sq_psn| RcParams {
        mtu: o.mtu,
        sq_psn: Psn::new(sq_psn),
        access: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        timeout: 8,
        retry_cnt: o.retry_cnt,
        rnr_retry: o.rnr_retry,
        min_rnr_timer: 1,
        max_rd_atomic: o.max_rd_atomic,
        max_dest_rd_atomic: 16,
    };
    cfg.params = [params(o.a_psn), params(o.b_psn)];
    let mut p = Pair::new(&cfg).unwrap();
    p.record();
    p
}

fn wr(id: u64, op: SendOp, sgl: Vec<Sge>) -> SendWr {
    SendWr { wr_id: id, op, payload: Payload::Sgl(sgl), flags: SendFlags::SIGNALED, ud: None }
}

fn pattern(s: &mut Host, off: usize, len: usize, seed: u8) {
    for (i, b) in s.mem_mut()[off..off + len].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(7).wrapping_add(seed);
    }
}

#[test]
fn segmentation_at_every_mtu_with_correct_pad_and_ackreq() {
    for mtu in [Mtu::Mtu256, Mtu::Mtu512, Mtu::Mtu1024, Mtu::Mtu2048, Mtu::Mtu4096] {
        for len in [0usize, 1, 3, mtu.bytes() as usize, mtu.bytes() as usize + 1, 3 * mtu.bytes() as usize + 2] {
            let mut p = pair(Opts { mtu, ..Opts::default() });
            pattern(&mut p.a, 0, len, 1);
            let remote = p.b.remote(4096);
            let sge = p.a.sge(0, len as u32);
            p.a.engine.post_send(p.a.qpn, wr(1, SendOp::Write { remote }, vec![sge])).unwrap();
            p.run();
            let c = p.a.completions();
            assert_eq!(c.len(), 1);
            assert_eq!(c[0].status, WcStatus::Success, "mtu {mtu:?} len {len}");
            assert_eq!(&p.b.mem()[4096..4096 + len], &p.a.mem()[..len]);
            let data: Vec<_> = p.log().iter().filter(|s| s.dir == Dir::AtoB).map(|s| s.transport).collect();
            let want = len.div_ceil(mtu.bytes() as usize).max(1);
            assert_eq!(data.len(), want, "packets for {len} at {mtu:?}");
            for (i, t) in data.iter().enumerate() {
                let last = i + 1 == want;
                assert_eq!(t.bth.ack_req, last || (i + 1) % 64 == 0);
                assert_eq!(t.reth.is_some(), i == 0, "RETH only on FIRST/ONLY");
                assert_eq!(t.bth.psn, Psn::new(100 + i as u32));
                let expect_op = match (i == 0, last) {
                    (true, true) => Opcode::RC_WRITE_ONLY,
                    (true, false) => Opcode::RC_WRITE_FIRST,
                    (false, false) => Opcode::RC_WRITE_MIDDLE,
                    (false, true) => Opcode::RC_WRITE_LAST,
                };
                assert_eq!(t.bth.opcode, expect_op);
                if !last {
                    assert_eq!(t.bth.pad_count, 0);
                }
            }
        }
    }
}

#[test]
fn one_ack_covers_many_messages() {
    let mut p = pair(Opts::default());
    for i in 0..10 {
        let remote = p.b.remote(i * 100);
        let sge = p.a.sge(0, 100);
        p.a.engine.post_send(p.a.qpn, wr(i as u64, SendOp::Write { remote }, vec![sge])).unwrap();
    }
    // Deliver requests, but drop every ACK except the one for the last message.
    let last = Psn::new(100 + 9);
    p.run_filtered(RUN_LIMIT, |f| {
        let t = &f.repr.transport;
        !(f.dir == Dir::BtoA && t.bth.opcode == Opcode::RC_ACK && t.bth.psn != last)
    });
    let c = p.a.completions();
    assert_eq!(c.iter().map(|c| c.wr_id).collect::<Vec<_>>(), (0..10).collect::<Vec<_>>());
    assert!(c.iter().all(|c| c.status == WcStatus::Success));
    assert_eq!(p.a.engine.qp_stats(p.a.qpn).unwrap().req_timeouts, 0, "the last ACK covered all ten");
}

#[test]
fn dropped_packet_gets_one_nak_and_go_back_n() {
    let mut p = pair(Opts::default());
    pattern(&mut p.a, 0, 10 * 1024, 3);
    let (remote, sge) = (p.b.remote(0), p.a.sge(0, 10 * 1024));
    p.a.engine.post_send(p.a.qpn, wr(1, SendOp::Write { remote }, vec![sge])).unwrap();
    p.run_filtered(RUN_LIMIT, |f| !(f.dir == Dir::AtoB && f.index == 3));
    let c = p.a.completions();
    assert_eq!((c.len(), c[0].status), (1, WcStatus::Success));
    assert_eq!(&p.b.mem()[..10 * 1024], &p.a.mem()[..10 * 1024]);
    let naks = p
        .log()
        .iter()
        .filter(|s| {
            s.dir == Dir::BtoA
                && s.transport.aeth.is_some_and(|a| a.syndrome == rocev2::wire::AckSyndrome::Nak(rocev2::wire::NakCode::PsnSequenceError))
        })
        .count();
    assert_eq!(naks, 1, "one PSN sequence NAK, then silence until in order");
    let s = p.a.engine.qp_stats(p.a.qpn).unwrap();
    assert_eq!(s.req_naks_seq_received, 1);
    assert!(s.req_retransmits >= 1);
}

#[test]
fn timeouts_exhaust_retries_then_flush() {
    let mut p = pair(Opts { retry_cnt: 3, ..Opts::default() });
    for i in 0..4 {
        let (remote, sge) = (p.b.remote(0), p.a.sge(0, 64));
        p.a.engine.post_send(p.a.qpn, wr(i, SendOp::Write { remote }, vec![sge])).unwrap();
    }
    // A link that loses everything from A to B.
    p.run_filtered(RUN_LIMIT, |f| f.dir != Dir::AtoB);
    let c = p.a.completions();
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(0, WcStatus::RetryExcErr), (1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr), (3, WcStatus::WrFlushErr)]
    );
    assert_eq!(p.a.engine.qp_stats(p.a.qpn).unwrap().req_timeouts, 4, "retry_cnt 3: the 4th timeout fails");
    assert_eq!(p.a.engine.qp_state(p.a.qpn).unwrap(), QpState::Err);
    assert!(matches!(p.a.engine.poll_event(), Some(rocev2::transport::engine::AsyncEvent::QpFatal(_))));
    // Posting in ERR completes at once with a flush error.
    p.a.engine.post_send(p.a.qpn, wr(9, SendOp::Send, vec![])).unwrap();
    assert_eq!(p.a.completions()[0].status, WcStatus::WrFlushErr);
}

#[test]
fn rnr_waits_and_retries_until_a_receive_is_posted() {
    let mut p = pair(Opts::default());
    let sge = p.a.sge(0, 200);
    p.a.engine.post_send(p.a.qpn, wr(1, SendOp::Send, vec![sge])).unwrap();
    let mut rnrs = 0;
    let recv = RecvWr { wr_id: 77, sgl: vec![p.b.sge(0, 4096)] };
    // First 2 ms: no receive posted, the responder RNR-NAKs (timer code 1 = 10 µs).
    p.run_filtered(Duration::from_millis(2), |f| {
        if f.dir == Dir::BtoA && matches!(f.repr.transport.aeth.map(|a| a.syndrome), Some(rocev2::wire::AckSyndrome::RnrNak { .. })) {
            rnrs += 1;
        }
        true
    });
    assert!(rnrs >= 2, "rnr_retry 7 retries forever: {rnrs} RNR NAKs until the run ended");
    assert!(p.a.completions().is_empty());
    p.b.engine.post_recv(p.b.qpn, recv).unwrap();
    p.run();
    let c = p.a.completions();
    assert_eq!((c.len(), c[0].status), (1, WcStatus::Success));
    let r = p.b.completions();
    assert_eq!((r[0].wr_id, r[0].byte_len), (77, 200));
    assert!(p.a.engine.qp_stats(p.a.qpn).unwrap().req_rnr_naks_received >= 2);
}

#[test]
fn rnr_retry_count_is_honoured() {
    let mut p = pair(Opts { rnr_retry: 2, ..Opts::default() });
    let sge = p.a.sge(0, 8);
    p.a.engine.post_send(p.a.qpn, wr(1, SendOp::Send, vec![sge])).unwrap();
    p.run();
    let c = p.a.completions();
    assert_eq!(c[0].status, WcStatus::RnrRetryExcErr);
    assert_eq!(p.a.engine.qp_stats(p.a.qpn).unwrap().req_rnr_naks_received, 3, "initial try + 2 retries");
}

#[test]
fn psn_wraps_around_2_pow_24() {
    let mut p = pair(Opts { a_psn: 0xff_fff0, b_psn: 0xff_fffe, ..Opts::default() });
    pattern(&mut p.a, 0, 40 * 1024, 9);
    let (remote, sge) = (p.b.remote(0), p.a.sge(0, 40 * 1024));
    p.a.engine.post_send(p.a.qpn, wr(1, SendOp::Write { remote }, vec![sge])).unwrap();
    let (r2, s2) = (p.a.remote(100_000), p.b.sge(50_000, 3000));
    p.b.engine.post_send(p.b.qpn, wr(2, SendOp::Read { remote: r2 }, vec![s2])).unwrap();
    p.run_filtered(RUN_LIMIT, |f| !(f.dir == Dir::AtoB && f.index == 20));
    assert_eq!(p.a.completions()[0].status, WcStatus::Success);
    assert_eq!(p.b.completions()[0].status, WcStatus::Success);
    assert_eq!(&p.b.mem()[..40 * 1024], &p.a.mem()[..40 * 1024]);
    assert!(p.log().iter().any(|s| s.transport.bth.psn == Psn::new(0)), "PSN 0 was crossed");
}

#[test]
fn lost_read_response_is_requested_again() {
    let mut p = pair(Opts::default());
    pattern(&mut p.b, 0, 5000, 4);
    let (remote, sge) = (p.b.remote(0), p.a.sge(8192, 5000));
    p.a.engine.post_send(p.a.qpn, wr(1, SendOp::Read { remote }, vec![sge])).unwrap();
    assert!(p.run_losing_first(RUN_LIMIT, Dir::BtoA, |f| f.repr.transport.bth.opcode == Opcode::RC_READ_RESPONSE_MIDDLE));
    let c = p.a.completions();
    assert_eq!((c[0].status, c[0].opcode), (WcStatus::Success, WcOpcode::RdmaRead));
    assert_eq!(&p.a.mem()[8192..8192 + 5000], &p.b.mem()[..5000]);
    let reqs = p.log().iter().filter(|s| s.dir == Dir::AtoB && s.transport.bth.opcode == Opcode::RC_READ_REQUEST).count();
    assert_eq!(reqs, 2, "the READ was re-requested from the first missing byte");
}

#[test]
fn lost_atomic_ack_is_replayed_not_executed_twice() {
    let mut p = pair(Opts::default());
    p.b.mem_mut()[64..72].copy_from_slice(&41u64.to_ne_bytes());
    let (remote, sge) = (p.b.remote(64), p.a.sge(0, 8));
    p.a.engine.post_send(p.a.qpn, wr(1, SendOp::FetchAdd { remote, add: 1 }, vec![sge])).unwrap();
    assert!(p.run_losing_first(RUN_LIMIT, Dir::BtoA, |f| f.repr.transport.bth.opcode == Opcode::RC_ATOMIC_ACK));
    let c = p.a.completions();
    assert_eq!((c[0].status, c[0].opcode), (WcStatus::Success, WcOpcode::FetchAdd));
    assert_eq!(u64::from_ne_bytes(p.a.mem()[..8].try_into().unwrap()), 41);
    assert_eq!(u64::from_ne_bytes(p.b.mem()[64..72].try_into().unwrap()), 42, "executed once");
}

#[test]
fn remote_access_error_fails_the_wr_and_flushes_the_rest() {
    let mut p = pair(Opts::default());
    let bad = RemoteAddr { addr: p.b.va(BUF - 4), rkey: p.b.mr.key() };
    let sge = p.a.sge(0, 64);
    p.a.engine.post_send(p.a.qpn, wr(1, SendOp::Write { remote: bad }, vec![sge])).unwrap();
    p.a.engine.post_send(p.a.qpn, wr(2, SendOp::Write { remote: p.b.remote(0) }, vec![sge])).unwrap();
    p.run();
    let c = p.a.completions();
    assert_eq!(c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), vec![(1, WcStatus::RemAccessErr), (2, WcStatus::WrFlushErr)]);
    assert!(p.b.mem()[BUF - 4..].iter().all(|&x| x == 0));
}

#[test]
fn unsignaled_wrs_complete_silently_and_in_order() {
    let mut p = pair(Opts { sig_all: false, ..Opts::default() });
    for i in 0..6u64 {
        let flags = if i % 3 == 2 { SendFlags::SIGNALED } else { SendFlags::empty() };
        let (remote, sge) = (p.b.remote(0), p.a.sge(0, 16));
        p.a.engine.post_send(p.a.qpn, SendWr { wr_id: i, op: SendOp::Write { remote }, payload: Payload::Sgl(vec![sge]), flags, ud: None }).unwrap();
    }
    p.run();
    assert_eq!(p.a.completions().iter().map(|c| c.wr_id).collect::<Vec<_>>(), vec![2, 5]);
}

#[test]
fn max_rd_atomic_limits_outstanding_reads() {
    let mut p = pair(Opts { max_rd_atomic: 1, ..Opts::default() });
    for i in 0..3 {
        let (remote, sge) = (p.b.remote(0), p.a.sge(4096 * i, 3000));
        p.a.engine.post_send(p.a.qpn, wr(i as u64, SendOp::Read { remote }, vec![sge])).unwrap();
    }
    p.run();
    assert_eq!(p.a.completions().len(), 3);
    // A READ request is only sent after the previous READ's last response.
    let mut outstanding = 0;
    for s in p.log() {
        match (s.dir, s.transport.bth.opcode) {
            (Dir::AtoB, Opcode::RC_READ_REQUEST) => {
                outstanding += 1;
                assert!(outstanding <= 1, "two READs outstanding with max_rd_atomic = 1");
            }
            (Dir::BtoA, Opcode::RC_READ_RESPONSE_LAST) => outstanding -= 1,
            _ => {}
        }
    }
}

#[test]
fn modify_qp_checks_masks_and_changes_nothing_on_error() {
    let mut e = Engine::new(EngineConfig::default(), Arc::new(MemoryTable::new()));
    let init = QpInitAttr { qp_type: QpType::Rc, pd: PD, send_cq: CqId(1), recv_cq: CqId(1), srq: None, cap: QpCaps::default(), sq_sig_all: true };
    let q = e.create_qp(&init).unwrap();
    let a = QpAttr { qp_state: QpState::Init, ..QpAttr::default() };
    assert!(matches!(e.modify_qp(q, &a, QpAttrMask::STATE | QpAttrMask::PORT), Err(EngineError::MissingAttr(_))));
    assert!(matches!(
        e.modify_qp(q, &a, QpAttrMask::STATE | QpAttrMask::PORT | QpAttrMask::PKEY_INDEX | QpAttrMask::ACCESS_FLAGS | QpAttrMask::QKEY),
        Err(EngineError::ExtraAttr(_))
    ));
    let rts = QpAttr { qp_state: QpState::Rts, ..QpAttr::default() };
    assert!(matches!(e.modify_qp(q, &rts, QpAttrMask::STATE), Err(EngineError::BadTransition { .. })));
    assert_eq!(e.qp_state(q).unwrap(), QpState::Reset);
    let bad_port = QpAttr { port_num: 2, ..a };
    assert!(matches!(
        e.modify_qp(q, &bad_port, QpAttrMask::STATE | QpAttrMask::PORT | QpAttrMask::PKEY_INDEX | QpAttrMask::ACCESS_FLAGS),
        Err(EngineError::BadValue(_))
    ));
    e.modify_qp(q, &a, QpAttrMask::STATE | QpAttrMask::PORT | QpAttrMask::PKEY_INDEX | QpAttrMask::ACCESS_FLAGS).unwrap();
    assert_eq!(e.qp_state(q).unwrap(), QpState::Init);
    assert!(matches!(e.post_send(q, wr(1, SendOp::Send, vec![])), Err(EngineError::WrongState(QpState::Init))));
    // ERR flushes posted receives exactly once.
    e.post_recv(q, RecvWr { wr_id: 5, sgl: vec![] }).unwrap();
    e.modify_qp(q, &QpAttr { qp_state: QpState::Err, ..QpAttr::default() }, QpAttrMask::STATE).unwrap();
    let c: Vec<_> = std::iter::from_fn(|| e.poll_completion()).collect();
    assert_eq!(c.len(), 1);
    assert_eq!((c[0].wc.wr_id, c[0].wc.status), (5, WcStatus::WrFlushErr));
    e.modify_qp(q, &QpAttr { qp_state: QpState::Err, ..QpAttr::default() }, QpAttrMask::STATE).unwrap();
    assert!(e.poll_completion().is_none(), "no second flush");
}

#[test]
fn hostile_frames_are_counted_not_fatal() {
    let mut p = pair(Opts::default());
    let mut junk = [0u8; 100];
    for i in 0..2000u32 {
        for (k, b) in junk.iter_mut().enumerate() {
            *b = (i.wrapping_mul(2654435761).wrapping_add(k as u32 * 40503) >> 13) as u8;
        }
        p.b.engine.handle_frame(p.now, &junk[..(i as usize % 100)]);
    }
    let s = p.b.engine.stats();
    assert_eq!(s.rx_frames, 2000);
    assert_eq!(s.rx_bad_frame.values().sum::<u64>(), 2000);
    // and the QP still works
    pattern(&mut p.a, 0, 100, 1);
    let (remote, sge) = (p.b.remote(0), p.a.sge(0, 100));
    p.a.engine.post_send(p.a.qpn, wr(1, SendOp::Write { remote }, vec![sge])).unwrap();
    p.run();
    assert_eq!(p.a.completions()[0].status, WcStatus::Success);
}

#[test]
fn sharded_engines_hand_out_only_their_qpns_and_srq_ids() {
    let mem = Arc::new(MemoryTable::new());
    for (i, n) in [(0u32, 3u32), (1, 3), (2, 3)] {
        let mut e = Engine::new(EngineConfig { shard: (i, n), ..EngineConfig::default() }, mem.clone());
        let init =
            QpInitAttr { qp_type: QpType::Rc, pd: PdId(1), send_cq: CqId(1), recv_cq: CqId(1), srq: None, cap: QpCaps::default(), sq_sig_all: false };
        for _ in 0..10 {
            let q = e.create_qp(&init).unwrap();
            assert_eq!(q % n, i, "QPN {q:#x} outside shard {i}/{n}");
            assert!(q >= 0x11);
            let s = e.create_srq(PdId(1), 4, 1).unwrap();
            assert_eq!(s.0 % n, i, "SRQ {} outside shard {i}/{n}", s.0);
        }
    }
}

/// Set the ECN bits of a frame to CE (as a switch would); `FrameView` fixes
/// the IPv4 header checksum (the ICRC masks the TOS byte, so it stays valid).
fn mark_ce(frame: &mut [u8]) {
    rocev2::wire::FrameView::new_checked(frame).expect("the engine sends valid frames").set_ecn(3);
}

#[test]
fn dcqcn_ce_marks_become_cnps_that_slow_the_sender() {
    let mut p = pair(Opts::default());
    let (qa, qb) = (p.a.qpn, p.b.qpn);
    pattern(&mut p.a, 0, 64 * 1024, 3);
    for i in 0..48u64 {
        let (remote, sge) = (p.b.remote((i % 16) as usize * 4096), p.a.sge(0, 4096));
        p.a.engine.post_send(qa, wr(i, SendOp::Write { remote }, vec![sge])).unwrap();
    }
    let (mut data_ecn, mut cnps, mut a_departures) = (Vec::new(), Vec::new(), Vec::new());
    let mut first_cnp_at = None;
    p.run_filtered(RUN_LIMIT, |f| {
        match f.dir {
            Dir::AtoB => {
                if let rocev2::wire::IpRepr::V4(v4) = f.repr.ip {
                    data_ecn.push(v4.ecn);
                }
                a_departures.push((f.at, f.bytes.len()));
                // The congestion point marks every data packet CE.
                mark_ce(f.bytes);
            }
            Dir::BtoA => {
                if f.repr.transport.bth.opcode == Opcode::CNP {
                    cnps.push(f.repr);
                    first_cnp_at.get_or_insert(f.at);
                }
            }
        }
        true
    });
    let done = p.a.completions();
    assert_eq!(done.iter().filter(|c| c.status == WcStatus::Success).count(), 48, "{done:?}");
    // Our data leaves ECN-capable, ECT(0).
    assert!(data_ecn.iter().all(|&e| e == 2), "{data_ecn:?}");
    // The NP answered with CNPs shaped like ConnectX's.
    assert!(!cnps.is_empty());
    for c in &cnps {
        assert_eq!(c.transport.bth.dest_qp, qa);
        assert!(c.transport.bth.becn);
        assert_eq!(c.udp.src_port, 0);
        assert!(matches!(c.ip, rocev2::wire::IpRepr::V4(v) if v.dscp == 48 && v.ecn == 2));
    }
    let sb = *p.b.engine.qp_stats(qb).unwrap();
    let sa = *p.a.engine.qp_stats(qa).unwrap();
    assert_eq!(sb.np_cnps_sent, cnps.len() as u64);
    assert!(sb.np_ce_received > sb.np_cnps_sent, "one CNP per interval, not per marked packet: {sb:?}");
    assert_eq!(sa.rp_cnps_received, cnps.len() as u64);
    // The reaction point cut the rate and paced: after the first CNP, data
    // packets leave spaced at the cut rate (about 5 Gb/s: 1.7 µs per 1078-byte
    // frame), not back to back (0.1 µs here).
    let rp = p.a.engine.qp_dcqcn(qa).unwrap();
    assert!(rp.stats.cuts > 0, "{:?}", rp.stats);
    let t0 = first_cnp_at.unwrap();
    let after: Vec<_> = a_departures.iter().filter(|d| d.0 > t0 && d.1 > 1000).collect();
    assert!(after.len() > 20, "{} data frames after the CNP", after.len());
    let min_gap = after.windows(2).map(|w| w[1].0.saturating_duration_since(w[0].0)).min().unwrap();
    assert!(min_gap >= Duration::from_nanos(1500), "paced: smallest gap {min_gap:?}");
}

#[test]
fn dcqcn_off_for_a_qp_counts_cnps_without_limiting() {
    let mut p = pair(Opts::default());
    let qa = p.a.qpn;
    p.a.engine.set_qp_dcqcn(qa, false).unwrap();
    // A hardware CNP (ConnectX-4 Lx, ../shared/vectors) re-addressed to our QP.
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/vectors/cnp_vectors.txt")).unwrap();
    let hex = text.lines().find(|l| l.starts_with("cx4lx_cnp")).unwrap().split_whitespace().nth(2).unwrap().to_string();
    let mut cnp: Vec<u8> = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
    p.a.engine.handle_frame(Instant::ZERO, &cnp);
    assert_eq!(p.a.engine.stats().rx_unknown_qpn, 1, "the hardware CNP parses (QP 0x118 is not ours)");
    assert_eq!(p.a.engine.stats().rx_cnps, 0);
    // Point it at our QP, from our peer's address (rxe check_addr: a CNP
    // from anyone else is refused), and reseal the checksums.
    let at = 14 + 20 + 8 + 5;
    cnp[at..at + 3].copy_from_slice(&qa.to_be_bytes()[1..]);
    cnp[14 + 12..14 + 16].copy_from_slice(&[10, 0, 0, 2]);
    cnp[14 + 16..14 + 20].copy_from_slice(&[10, 0, 0, 1]);
    rocev2::wire::Ipv4Packet::new_unchecked(&mut cnp[14..34]).fill_checksum();
    rocev2::wire::icrc::fill_frame(&mut cnp).unwrap();
    p.a.engine.handle_frame(Instant::from_nanos(10_000), &cnp);
    let s = *p.a.engine.qp_stats(qa).unwrap();
    assert_eq!(s.rp_cnps_received, 1);
    let rp = p.a.engine.qp_dcqcn(qa).unwrap();
    assert_eq!(rp.stats.cnps, 1);
    assert!(!rp.is_limited(), "DCQCN is off for this QP");
    // On again: the same CNP cuts the rate.
    p.a.engine.set_qp_dcqcn(qa, true).unwrap();
    p.a.engine.handle_frame(Instant::from_nanos(20_000), &cnp);
    assert!(p.a.engine.qp_dcqcn(qa).unwrap().is_limited());
}

/// A SEND or WRITE whose SGE list has a bad local key anywhere (rxe/ConnectX:
/// LOC_PROT_ERR, the QP enters ERR) sends no request frame and leaves the
/// peer's memory untouched, whether the message fits one packet (whose gather
/// is the check) or spans several (checked whole before the first); WRs of
/// one packet over several good SGEs move their bytes in order.
#[test]
fn bad_local_key_fails_before_any_request_frame() {
    let mtu = Mtu::Mtu1024;
    for len in [1usize, 100, mtu.bytes() as usize, 3 * mtu.bytes() as usize] {
        for bad_at in 0..3 {
            for send in [false, true] {
                let mut p = pair(Opts { mtu, ..Opts::default() });
                pattern(&mut p.a, 0, len, 3);
                // Three SGEs cover `len`: 1 byte, the rest but one, 1 byte (or fewer for tiny messages).
                let parts = [1.min(len), len.saturating_sub(2), len.saturating_sub(1 + len.saturating_sub(2))];
                let mut off = 0;
                let mut sgl = Vec::new();
                for (i, n) in parts.into_iter().enumerate() {
                    let mut sge = p.a.sge(off, n as u32);
                    if i == bad_at && n > 0 {
                        sge.lkey ^= 0x80;
                    }
                    sgl.push(sge);
                    off += n;
                }
                let bad = parts[bad_at] > 0;
                let op = if send { SendOp::Send } else { SendOp::Write { remote: p.b.remote(8192) } };
                if send {
                    p.b.engine.post_recv(p.b.qpn, RecvWr { wr_id: 5, sgl: vec![p.b.sge(8192, BUF as u32 - 8192)] }).unwrap();
                }
                p.a.engine.post_send(p.a.qpn, wr(1, op, sgl)).unwrap();
                p.run();
                let c = p.a.completions();
                let at = format!("len {len}, bad SGE {bad_at}, send {send}");
                assert_eq!(c.len(), 1, "{at}");
                let requests = p.log().iter().filter(|s| s.dir == Dir::AtoB).count();
                if bad {
                    assert_eq!(c[0].status, WcStatus::LocProtErr, "{at}");
                    assert_eq!(p.a.qp_state(), QpState::Err, "{at}");
                    assert_eq!(requests, 0, "{at}");
                    assert!(p.b.mem()[8192..8192 + len].iter().all(|&b| b == 0), "{at}");
                } else {
                    assert_eq!(c[0].status, WcStatus::Success, "{at}");
                    assert_eq!(&p.b.mem()[8192..8192 + len], &p.a.mem()[..len], "{at}");
                }
            }
        }
    }
}

/// A doorbell's drain posts its WQEs as one batch (`post_send_batch`: one
/// lookup, one timer arming and wake-up): each WQE gets what a post of its
/// own would give it. A bad one in the middle (more SGEs than
/// `max_send_sge`) is refused with its wr_id and opcode and the rest go out
/// and complete in order; on an unknown QP every WQE is refused.
#[test]
fn a_batch_of_posts_is_each_post_alone() {
    let mut p = pair(Opts::default());
    pattern(&mut p.a, 0, 500, 3);
    let mut wqes: Vec<Box<rocev2::transport::wqe::SendWqe>> = (0..5u64)
        .map(|i| {
            let remote = p.b.remote(i as usize * 100);
            let sgl = if i == 2 { vec![p.a.sge(0, 1); 5] } else { vec![p.a.sge(i as usize * 100, 100)] };
            Box::new(wr(i, SendOp::Write { remote }, sgl).into())
        })
        .collect();
    wqes.reverse();
    let mut refused = Vec::new();
    let qpn = p.a.qpn;
    let n = p.a.engine.post_send_batch(qpn, || wqes.pop(), |wr_id, op, e| refused.push((wr_id, op, e)));
    assert_eq!(n, 5);
    assert!(matches!(refused[..], [(2, WcOpcode::RdmaWrite, EngineError::BadWr(_))]), "{refused:?}");
    p.run();
    let c = p.a.completions();
    assert_eq!(c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), [0, 1, 3, 4].map(|i| (i, WcStatus::Success)));
    for i in [0usize, 1, 3, 4] {
        assert_eq!(p.b.mem()[i * 100..i * 100 + 100], p.a.mem()[i * 100..i * 100 + 100], "WRITE {i}");
    }
    assert!(p.b.mem()[200..300].iter().all(|&b| b == 0), "the refused WRITE wrote nothing");

    let mut wqes: Vec<Box<rocev2::transport::wqe::SendWqe>> = (7..9).map(|i| Box::new(wr(i, SendOp::Send, vec![]).into())).collect();
    let mut refused = Vec::new();
    assert_eq!(p.a.engine.post_send_batch(0x999, || wqes.pop(), |wr_id, op, e| refused.push((wr_id, op, e))), 2);
    assert!(
        matches!(refused[..], [(8, WcOpcode::Send, EngineError::NoSuchQp(0x999)), (7, WcOpcode::Send, EngineError::NoSuchQp(0x999))]),
        "{refused:?}"
    );
}

/// A send ring's consumer in a test: WQEs handed out in order, the boxes
/// given back counted.
struct VecSource {
    wqes: std::collections::VecDeque<Box<rocev2::transport::wqe::SendWqe>>,
    recycled: usize,
}

impl rocev2::transport::wqe::SendSource for VecSource {
    fn recycle(&mut self, _wqe: Box<rocev2::transport::wqe::SendWqe>) {
        self.recycled += 1;
    }

    fn next_wqe(&mut self) -> Option<Box<rocev2::transport::wqe::SendWqe>> {
        self.wqes.pop_front()
    }
}

/// A drain's receive source with nothing to lend.
fn no_recvs() -> OwnedRecvs<std::iter::Empty<RecvWqe>> {
    OwnedRecvs(std::iter::empty())
}

/// A doorbell's drain with one lookup of the QP (`drain_posts`) is a
/// `post_recv` of each receive WQE, then `recycle_send_wqes`, then
/// `post_send_batch`: receive WQEs queued in order (one for a QP in RESET
/// refused, as `post_recv` refuses it), a bad send WQE in the middle refused
/// with its wr_id and opcode and the rest sent and completed in order, the
/// boxes of the reaped WQEs handed back by the next drain, and on an unknown
/// QP every WQE of both kinds refused.
#[test]
fn a_drain_is_each_post_alone() {
    let mut p = pair(Opts::default());
    pattern(&mut p.a, 0, 300, 5);
    let recvs: Vec<RecvWqe> = (10..13u64).map(|i| RecvWr { wr_id: i, sgl: vec![p.b.sge(8192 + i as usize * 100, 100)] }.into()).collect();
    let (qa, qb) = (p.a.qpn, p.b.qpn);
    let mut refused = Vec::new();
    let none: Option<&mut VecSource> = None;
    let n = p.b.engine.drain_posts(qb, OwnedRecvs(recvs.into_iter()), |wr_id, e| refused.push((wr_id, e)), none, |_, _, _| unreachable!("no sends"));
    assert_eq!((n, refused.len()), (3, 0));

    let wqes = (0..3u64)
        .map(|i| {
            let sgl = if i == 1 { vec![p.a.sge(0, 1); 5] } else { vec![p.a.sge(i as usize * 100, 100)] };
            Box::new(wr(i, SendOp::Send, sgl).into())
        })
        .collect();
    let mut src = VecSource { wqes, recycled: 0 };
    let mut send_refused = Vec::new();
    let n =
        p.a.engine.drain_posts(qa, no_recvs(), |_, _| unreachable!("no receives"), Some(&mut src), |wr_id, op, e| send_refused.push((wr_id, op, e)));
    assert_eq!(n, 3);
    assert!(matches!(send_refused[..], [(1, WcOpcode::Send, EngineError::BadWr(_))]), "{send_refused:?}");
    p.run();
    let c = p.a.completions();
    assert_eq!(c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), [(0, WcStatus::Success), (2, WcStatus::Success)]);
    let r = p.b.completions();
    assert_eq!(r.iter().map(|c| (c.wr_id, c.status, c.byte_len)).collect::<Vec<_>>(), [10, 11].map(|i| (i, WcStatus::Success, 100)));
    assert_eq!(p.b.mem()[9192..9292], p.a.mem()[..100], "SEND 0 into the first receive");
    assert_eq!(p.b.mem()[9292..9392], p.a.mem()[200..300], "SEND 2 into the second");
    assert_eq!(src.recycled, 0, "boxes come back at the next drain");
    let n = p.a.engine.drain_posts(qa, no_recvs(), |_, _| unreachable!(), Some(&mut src), |_, _, _| unreachable!());
    assert_eq!((n, src.recycled), (0, 2), "the two reaped WQEs' boxes");

    // A QP in RESET refuses a receive WQE, as `post_recv` does.
    let mut e = Engine::new(EngineConfig::default(), Arc::new(MemoryTable::new()));
    let init = QpInitAttr { qp_type: QpType::Rc, pd: PD, send_cq: CqId(1), recv_cq: CqId(1), srq: None, cap: QpCaps::default(), sq_sig_all: true };
    let q = e.create_qp(&init).unwrap();
    assert!(matches!(e.post_recv(q, RecvWr { wr_id: 30, sgl: vec![] }), Err(EngineError::WrongState(QpState::Reset))));
    let recvs: Vec<RecvWqe> = vec![RecvWr { wr_id: 31, sgl: vec![] }.into()];
    let mut refused = Vec::new();
    let none: Option<&mut VecSource> = None;
    assert_eq!(e.drain_posts(q, OwnedRecvs(recvs.into_iter()), |wr_id, e| refused.push((wr_id, e)), none, |_, _, _| unreachable!()), 1);
    assert!(matches!(refused[..], [(31, EngineError::WrongState(QpState::Reset))]), "{refused:?}");

    // An unknown QP: every WQE of both kinds refused.
    let recvs: Vec<RecvWqe> = vec![RecvWr { wr_id: 20, sgl: vec![] }.into()];
    let mut refused = Vec::new();
    let mut src = VecSource { wqes: (7..9).map(|i| Box::new(wr(i, SendOp::Send, vec![]).into())).collect(), recycled: 0 };
    let mut send_refused = Vec::new();
    let n = p.a.engine.drain_posts(
        0x999,
        OwnedRecvs(recvs.into_iter()),
        |wr_id, e| refused.push((wr_id, e)),
        Some(&mut src),
        |wr_id, op, e| send_refused.push((wr_id, op, e)),
    );
    assert_eq!(n, 3);
    assert!(matches!(refused[..], [(20, EngineError::NoSuchQp(0x999))]), "{refused:?}");
    assert!(
        matches!(send_refused[..], [(7, WcOpcode::Send, EngineError::NoSuchQp(0x999)), (8, WcOpcode::Send, EngineError::NoSuchQp(0x999))]),
        "{send_refused:?}"
    );
}

/// A responder error that moves the QP to ERR (a WRITE outside the region:
/// a remote access error NAK, as rxe's responder answers an R_Key
/// violation, `RESPST_ERR_RKEY_VIOLATION`) sends its NAK first and then
/// flushes the receive queue: every posted receive completes once, with
/// `WR_FLUSH_ERR`, though nothing else is left for the QP to send.
#[test]
fn a_responder_error_flushes_the_receive_queue_after_its_nak() {
    let mut p = pair(Opts::default());
    for id in [70, 71] {
        let recv = RecvWr { wr_id: id, sgl: vec![p.b.sge(0, 64)] };
        p.b.engine.post_recv(p.b.qpn, recv).unwrap();
    }
    let bad = RemoteAddr { addr: p.b.va(BUF - 4), rkey: p.b.mr.key() };
    let sge = p.a.sge(0, 64);
    p.a.engine.post_send(p.a.qpn, wr(1, SendOp::Write { remote: bad }, vec![sge])).unwrap();
    p.run();
    let a = p.a.completions();
    assert_eq!(a.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), vec![(1, WcStatus::RemAccessErr)]);
    assert_eq!(p.b.engine.qp_state(p.b.qpn).unwrap(), QpState::Err);
    let b = p.b.completions();
    assert_eq!(b.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), vec![(70, WcStatus::WrFlushErr), (71, WcStatus::WrFlushErr)]);
}
