//! The order in which one engine's QPs send: round robin among the QPs
//! that have something to send, one frame each per turn; a QP alone on the
//! ready list sends frame after frame (the engine keeps a lone QP at the
//! list's head instead of taking it off and putting it back: the same
//! order as the general path, pinned here frame by frame).

use std::time::Duration;

use rocev2::psn::Psn;
use rocev2::sim::pair::{Dir, Pair, PairConfig};
use rocev2::sim::rc::{bring_up_rc, RcParams};
use rocev2::transport::attr::Mtu;
use rocev2::transport::engine::DEFAULT_ACK_HOLD;
use rocev2::transport::wr::*;
use rocev2::wire::{parse_frame, Opcode};

const MTU: usize = 1024;

/// Every frame `a`'s engine sends now, as (destination QPN, PSN), until it
/// has nothing more.
fn drain(p: &mut Pair, max: usize) -> Vec<(u32, u32)> {
    let mut buf = vec![0u8; 9000];
    let mut out = Vec::new();
    for _ in 0..max {
        let Some(n) = p.a.engine.poll_transmit(p.now, &mut buf) else { break };
        let f = parse_frame(&buf[..n]).expect("the engine's frames parse");
        out.push((f.repr.transport.bth.dest_qp, f.repr.transport.bth.psn.value()));
    }
    out
}

fn write(p: &Pair, id: u64, packets: usize) -> SendWr {
    let len = (packets * MTU) as u32;
    SendWr {
        wr_id: id,
        op: SendOp::Write { remote: p.b.remote(0) },
        payload: Payload::Sgl(vec![p.a.sge(0, len)]),
        flags: SendFlags::SIGNALED,
        ud: None,
    }
}

/// Two engines with an RC QP each (a's 0x10, b's 0x40), IB MTU 1024,
/// first PSNs 0, `buf_len` bytes of buffer each; and their configuration.
fn pair(buf_len: usize) -> (Pair, PairConfig) {
    let params = RcParams { mtu: Mtu::Mtu1024, sq_psn: Psn::new(0), ..RcParams::default() };
    let mut cfg = PairConfig { buf_len, params: [params; 2], ..PairConfig::default() };
    cfg.engines[0].first_qpn = 0x10;
    cfg.engines[1].first_qpn = 0x40;
    (Pair::new(&cfg).unwrap(), cfg)
}

#[test]
fn lone_qp_sends_in_a_row_and_several_take_turns() {
    let (mut p, cfg) = pair(64 * 1024);
    let params = cfg.params[0];
    let (a_addr, b_addr) = (p.a.addr, p.b.addr);
    let q0 = p.a.qpn;
    let d0 = p.b.qpn;
    // Two more QPs of a's, connected to QPNs b does not have (their frames
    // are only looked at here, never delivered): destinations 0x100, 0x101.
    let mut qps = vec![(q0, d0)];
    for (i, dest) in [0x100u32, 0x101].into_iter().enumerate() {
        let q = p.a.engine.create_qp(&cfg.qp).unwrap();
        let qp_params = RcParams { sq_psn: Psn::new(1000 * (i as u32 + 1)), ..params };
        bring_up_rc(&mut p.a.engine, q, &a_addr, &b_addr, dest, Psn::new(0), &qp_params).unwrap();
        qps.push((q, dest));
    }
    let (d1, d2) = (0x100, 0x101);
    let d = [d0, d1, d2];

    // QP 0 alone: two of its four frames, one after the other.
    p.a.engine.post_send(q0, write(&p, 1, 4)).unwrap();
    assert_eq!(drain(&mut p, 2), vec![(d0, 0), (d0, 1)]);
    // Two more join (in this order): round robin, each sent frame puts its
    // QP at the end of the line; a QP with nothing left drops out.
    p.a.engine.post_send(qps[1].0, write(&p, 2, 4)).unwrap();
    p.a.engine.post_send(qps[2].0, write(&p, 3, 3)).unwrap();
    let want = vec![(d[0], 2), (d[1], 1000), (d[2], 2000), (d[0], 3), (d[1], 1001), (d[2], 2001), (d[1], 1002), (d[2], 2002), (d[1], 1003)];
    assert_eq!(drain(&mut p, 100), want);
    assert_eq!(drain(&mut p, 100), vec![], "nothing left to send");
    // QP 2 alone again, then QP 0 joins while QP 2 is under way.
    p.a.engine.post_send(qps[2].0, write(&p, 4, 3)).unwrap();
    assert_eq!(drain(&mut p, 1), vec![(d2, 2003)]);
    p.a.engine.post_send(q0, write(&p, 5, 1)).unwrap();
    assert_eq!(drain(&mut p, 100), vec![(d2, 2004), (d0, 4), (d2, 2005)]);
    // A lone QP with nothing to send left the list: a new WR puts it back.
    p.a.engine.post_send(qps[1].0, write(&p, 6, 2)).unwrap();
    assert_eq!(drain(&mut p, 100), vec![(d1, 1004), (d1, 1005)]);
    assert_eq!(drain(&mut p, 100), vec![]);
}

/// A lone QP stopped by the window of unacknowledged PSNs (rxe's 128)
/// leaves the list; the ACKs that open the window put it back (delivered:
/// every PSN once, in order), or, with nothing delivered, the timeout does
/// (the go-back-N from the first unacknowledged PSN).
#[test]
fn lone_qp_stopped_by_the_window_resumes() {
    let (mut p, _) = pair(256 * 1024);
    let qa = p.a.qpn;
    let d0 = p.b.qpn;
    for (i, b) in p.a.mem_mut()[..200 * MTU].iter_mut().enumerate() {
        *b = (i % 253) as u8;
    }
    // Delivered: the ACKs reopen the window.
    p.record();
    p.a.engine.post_send(qa, write(&p, 1, 200)).unwrap();
    p.run();
    let psns: Vec<u32> = p.log().iter().filter(|s| s.dir == Dir::AtoB).map(|s| s.transport.bth.psn.value()).collect();
    assert_eq!(psns, (0..200).collect::<Vec<_>>());
    let wcs = p.a.completions();
    assert_eq!((wcs.len(), wcs[0].status), (1, WcStatus::Success));
    assert_eq!(p.b.mem()[..200 * MTU], p.a.mem()[..200 * MTU]);
    // Not delivered: 128 frames, then nothing (the QP off the list) until
    // the timeout re-sends from PSN 200.
    p.b.mem_mut()[..200 * MTU].fill(0);
    p.a.engine.post_send(qa, write(&p, 2, 200)).unwrap();
    assert_eq!(drain(&mut p, 1000), (200..328).map(|psn| (d0, psn)).collect::<Vec<_>>());
    assert_eq!(drain(&mut p, 10), vec![]);
    p.run();
    let wcs = p.a.completions();
    assert_eq!((wcs.len(), wcs[0].status), (1, WcStatus::Success));
    assert_eq!(p.b.mem()[..200 * MTU], p.a.mem()[..200 * MTU]);
}

/// A held ACK released by its reply leaves no timer behind that puts its
/// QP on the ready list at the hold's deadline with nothing to send (the
/// engine's held ACKs, `release_replied_hold`). What that changes between
/// QPs, pinned here: a QP takes its turn from the event that gave it work,
/// as every QP does. Before, the hold's stale timer had already queued the
/// replying QP at the deadline, so a WR posted to it later went ahead of
/// another QP's WR posted before it; now they leave in the order they were
/// posted, the round robin's order.
#[test]
fn a_released_hold_leaves_no_timer_that_queues_its_qp() {
    let (mut p, cfg) = pair(64 * 1024);
    let (a_addr, b_addr) = (p.a.addr, p.b.addr);
    let (q0, d0) = (p.a.qpn, p.b.qpn);
    // A second QP of a's, connected to a QPN b does not have (its frames
    // are only looked at here).
    let q1 = p.a.engine.create_qp(&cfg.qp).unwrap();
    let params = RcParams { sq_psn: Psn::new(1000), ..cfg.params[0] };
    bring_up_rc(&mut p.a.engine, q1, &a_addr, &b_addr, 0x100, Psn::new(0), &params).unwrap();
    // b's SEND reaches a's QP 0, whose ACK is held for the reply.
    p.record();
    p.a.engine.post_recv(q0, RecvWr { wr_id: 7, sgl: vec![p.a.sge(0, 64)] }).unwrap();
    let send = SendWr { wr_id: 1, op: SendOp::Send, payload: Payload::Sgl(vec![p.b.sge(0, 8)]), flags: SendFlags::SIGNALED, ud: None };
    p.b.engine.post_send(p.b.qpn, send).unwrap();
    p.run_for(DEFAULT_ACK_HOLD / 2);
    assert_eq!(p.a.completions().len(), 1, "the SEND arrived");
    assert!(!p.log().iter().any(|s| s.dir == Dir::AtoB), "its ACK is held");
    // The reply (a WRITE of one frame), the ACK right behind it.
    p.a.engine.post_send(q0, write(&p, 2, 1)).unwrap();
    let mut buf = vec![0u8; 9000];
    let mut sent = Vec::new();
    while let Some(n) = p.a.engine.poll_transmit(p.now, &mut buf) {
        let f = parse_frame(&buf[..n]).unwrap();
        sent.push((f.repr.transport.bth.opcode, f.repr.transport.bth.dest_qp));
    }
    assert_eq!(sent, vec![(Opcode::RC_WRITE_ONLY, d0), (Opcode::RC_ACK, d0)]);
    // No entry for the hold's deadline is left at the timer queue's head:
    // the next timeout is the reply's (4.096 µs × 2^14).
    assert!(p.a.engine.next_timeout().is_some_and(|t| t > p.now + Duration::from_millis(60)), "{:?}", p.a.engine.next_timeout());
    // The hold's deadline passes with nothing due, then both QPs get a WR,
    // QP 1 first: QP 1's frame leaves first.
    let t = p.now + DEFAULT_ACK_HOLD;
    p.now = t;
    p.a.engine.handle_timeout(t);
    p.a.engine.post_send(q1, write(&p, 3, 1)).unwrap();
    p.a.engine.post_send(q0, write(&p, 4, 1)).unwrap();
    assert_eq!(drain(&mut p, 100), vec![(0x100, 1000), (d0, 1)]);
    assert_eq!(drain(&mut p, 100), vec![]);
    let s = p.a.engine.qp_stats(q0).unwrap();
    assert_eq!((s.resp_acks_held, s.resp_acks_hold_expired), (1, 0));
}
