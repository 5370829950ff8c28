//! The responder's held ACKs (`rocev2::transport::responder`, "held ACKs";
//! `EngineConfig::ack_hold`): the ACK of a whole SEND or WRITE waits for the
//! QP's next request frame (the application's reply) and leaves right
//! behind it, or alone at the bound; it is never lost, and nothing else
//! (NAKs, RNR NAKs, re-ACKs of duplicates, READ responses, atomic ACKs) is
//! held. Two engines in the simulator's pair harness, in virtual time.

use std::time::Duration;

use rocev2::psn::Psn;
use rocev2::sim::pair::{Dir, Pair, PairConfig, Sent, RUN_LIMIT};
use rocev2::sim::rc::RcParams;
use rocev2::sim::{LinkConfig, RunOutcome};
use rocev2::transport::engine::DEFAULT_ACK_HOLD;
use rocev2::transport::memory::Access;
use rocev2::transport::wr::*;
use rocev2::wire::{parse_frame, AckSyndrome, Opcode};

/// A pair with a 1 ms ACK timeout (4.096 µs × 2^8) and the default hold;
/// every frame recorded.
fn pair() -> Pair {
    let mut cfg = PairConfig::default();
    let params = |sq_psn| RcParams {
        sq_psn: Psn::new(sq_psn),
        access: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        timeout: 8,
        min_rnr_timer: 1,
        ..RcParams::default()
    };
    cfg.params = [params(100), params(5000)];
    let mut p = Pair::new(&cfg).unwrap();
    p.record();
    p
}

fn wr(id: u64, op: SendOp, sgl: Vec<Sge>) -> SendWr {
    SendWr { wr_id: id, op, payload: Payload::Sgl(sgl), flags: SendFlags::SIGNALED, ud: None }
}

fn is_ack(s: &Sent) -> bool {
    s.transport.bth.opcode == Opcode::RC_ACK && matches!(s.transport.aeth.map(|a| a.syndrome), Some(AckSyndrome::Ack { .. }))
}

/// The frames B sent, in order.
fn from_b(p: &Pair) -> Vec<Sent> {
    p.log().iter().filter(|s| s.dir == Dir::BtoA).cloned().collect()
}

/// A pair where A's ping (a SEND, wr_id 1) has reached B's receive
/// (wr_id 7, taken) and B holds its ACK, half the hold later.
fn ping_held() -> Pair {
    let mut p = pair();
    let recv = RecvWr { wr_id: 7, sgl: vec![p.b.sge(0, 64)] };
    p.b.engine.post_recv(p.b.qpn, recv).unwrap();
    let sge = p.a.sge(0, 8);
    p.a.engine.post_send(p.a.qpn, wr(1, SendOp::Send, vec![sge])).unwrap();
    // Less than the hold: B has received the ping but sends nothing yet.
    p.run_for(DEFAULT_ACK_HOLD / 2);
    assert_eq!(p.b.completions().len(), 1, "the ping arrived");
    assert!(from_b(&p).is_empty(), "the ACK is held for the reply: {:?}", from_b(&p));
    p
}

#[test]
fn the_ack_waits_for_the_reply_and_leaves_right_behind_it() {
    let mut p = ping_held();
    assert!(p.a.completions().is_empty());
    // B's application answers: the pong, then the ACK behind it, in one go.
    let recv = RecvWr { wr_id: 8, sgl: vec![p.a.sge(4096, 64)] };
    p.a.engine.post_recv(p.a.qpn, recv).unwrap();
    let sge = p.b.sge(4096, 8);
    p.b.engine.post_send(p.b.qpn, wr(2, SendOp::Send, vec![sge])).unwrap();
    p.run();
    let b = from_b(&p);
    assert_eq!(b[0].transport.bth.opcode, Opcode::RC_SEND_ONLY, "the reply first");
    assert!(is_ack(&b[1]) && b[1].transport.bth.psn == Psn::new(100), "the ping's ACK right behind it: {:?}", b[1].transport);
    assert!(b[1].at.saturating_duration_since(b[0].at) < DEFAULT_ACK_HOLD / 4, "in the same transmit burst");
    // A gets the pong first, then its ping's ACK.
    let c = p.a.completions();
    assert_eq!(c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), vec![(8, WcStatus::Success), (1, WcStatus::Success)]);
    assert_eq!(p.b.completions()[0].wr_id, 2);
    let s = p.b.engine.qp_stats(p.b.qpn).unwrap();
    assert_eq!((s.resp_acks_held, s.resp_acks_hold_expired), (1, 0));
    assert_eq!(p.a.engine.qp_stats(p.a.qpn).unwrap().req_timeouts, 0);
}

#[test]
fn without_a_reply_the_ack_leaves_alone_at_the_bound() {
    let mut p = pair();
    let (remote, sge) = (p.b.remote(0), p.a.sge(0, 8));
    p.a.engine.post_send(p.a.qpn, wr(1, SendOp::Write { remote }, vec![sge])).unwrap();
    p.run();
    let write = p.log().iter().find(|s| s.dir == Dir::AtoB).unwrap().at;
    let b = from_b(&p);
    assert_eq!(b.len(), 1);
    assert!(is_ack(&b[0]));
    let waited = b[0].at.saturating_duration_since(write);
    assert!(waited >= DEFAULT_ACK_HOLD && waited <= DEFAULT_ACK_HOLD + Duration::from_micros(1), "held for the bound, no longer: {waited:?}");
    assert_eq!(p.a.completions()[0].status, WcStatus::Success);
    let s = p.b.engine.qp_stats(p.b.qpn).unwrap();
    assert_eq!((s.resp_acks_held, s.resp_acks_hold_expired), (1, 1));
    assert_eq!(p.a.engine.qp_stats(p.a.qpn).unwrap().req_timeouts, 0, "far below the ACK timeout");
}

#[test]
fn an_expired_held_ack_still_leaves_behind_a_reply_of_the_same_round() {
    let mut p = ping_held();
    // The deadline passes (the timer fires) and the reply is posted before
    // B transmits again: the reply still goes first.
    let t = p.now + DEFAULT_ACK_HOLD;
    assert!(p.b.engine.next_timeout().is_some_and(|d| d <= t));
    p.b.engine.handle_timeout(t);
    let sge = p.b.sge(4096, 8);
    p.b.engine.post_send(p.b.qpn, wr(2, SendOp::Send, vec![sge])).unwrap();
    let mut buf = vec![0u8; 4096];
    let mut sent = Vec::new();
    while let Some(n) = p.b.engine.poll_transmit(t, &mut buf) {
        sent.push(parse_frame(&buf[..n]).unwrap().repr.transport.bth.opcode);
    }
    assert_eq!(sent, vec![Opcode::RC_SEND_ONLY, Opcode::RC_ACK]);
    assert_eq!(p.b.engine.qp_stats(p.b.qpn).unwrap().resp_acks_hold_expired, 1);
}

#[test]
fn held_acks_coalesce_and_keep_the_first_deadline() {
    let mut p = pair();
    for i in 0..5u64 {
        let (remote, sge) = (p.b.remote(i as usize * 64), p.a.sge(0, 64));
        p.a.engine.post_send(p.a.qpn, wr(i, SendOp::Write { remote }, vec![sge])).unwrap();
    }
    p.run();
    let first = p.log().iter().find(|s| s.dir == Dir::AtoB).unwrap().at;
    let b = from_b(&p);
    assert_eq!(b.len(), 1, "one ACK for five WRITEs (IBTA 9.7.5.1.1): {b:?}");
    assert_eq!(b[0].transport.bth.psn, Psn::new(104));
    assert_eq!(b[0].transport.aeth.unwrap().msn, 5);
    assert!(b[0].at.saturating_duration_since(first) <= DEFAULT_ACK_HOLD + Duration::from_micros(1), "the first WRITE's deadline");
    assert_eq!(p.a.completions().len(), 5);
}

#[test]
fn a_lost_held_ack_is_recovered_and_duplicates_are_reacked_at_once() {
    let mut p = pair();
    let (remote, sge) = (p.b.remote(0), p.a.sge(0, 8));
    p.a.engine.post_send(p.a.qpn, wr(1, SendOp::Write { remote }, vec![sge])).unwrap();
    assert!(p.run_losing_first(RUN_LIMIT, Dir::BtoA, |_| true));
    assert_eq!(p.a.completions()[0].status, WcStatus::Success);
    let sa = p.a.engine.qp_stats(p.a.qpn).unwrap();
    assert_eq!((sa.req_timeouts, sa.req_retransmits), (1, 1));
    assert_eq!(p.b.engine.qp_stats(p.b.qpn).unwrap().resp_duplicates, 1);
    // The retransmitted WRITE (a duplicate) is re-ACKed at once (C9-105), not held.
    let log = p.log();
    let retx = log.iter().filter(|s| s.dir == Dir::AtoB).nth(1).unwrap().at;
    let reack = log.iter().rfind(|s| s.dir == Dir::BtoA).unwrap();
    assert!(is_ack(reack) && reack.delivered);
    assert!(reack.at.saturating_duration_since(retx) < DEFAULT_ACK_HOLD / 4, "re-ACK not held");
}

#[test]
fn a_duplicate_releases_a_held_ack() {
    let mut p = pair();
    let (remote, sge) = (p.b.remote(0), p.a.sge(0, 8));
    p.a.engine.post_send(p.a.qpn, wr(1, SendOp::Write { remote }, vec![sge])).unwrap();
    let mut copy = None;
    p.run_filtered(DEFAULT_ACK_HOLD / 2, |f| {
        copy.get_or_insert_with(|| f.bytes.to_vec());
        true
    });
    assert!(from_b(&p).is_empty(), "held");
    // The same request again (the link duplicated it): answered at once.
    let now = p.now;
    p.b.engine.handle_frame(now, &copy.unwrap());
    p.run_for(Duration::from_nanos(1));
    let b = from_b(&p);
    assert_eq!(b.len(), 1, "{b:?}");
    assert!(is_ack(&b[0]) && b[0].at == now);
}

#[test]
fn naks_and_rnr_naks_are_never_held() {
    // No receive posted: the SEND gets an RNR NAK at once.
    let mut p = pair();
    let sge = p.a.sge(0, 8);
    p.a.engine.post_send(p.a.qpn, wr(1, SendOp::Send, vec![sge])).unwrap();
    p.run_for(Duration::from_micros(1));
    let b = from_b(&p);
    assert!(matches!(b[0].transport.aeth.map(|a| a.syndrome), Some(AckSyndrome::RnrNak { .. })), "{b:?}");

    // A held ACK, then an out-of-sequence request: the sequence NAK leaves
    // at once, with the held ACK before it (request order).
    let mut p = pair();
    for i in 0..3u64 {
        let (remote, sge) = (p.b.remote(0), p.a.sge(0, 8));
        p.a.engine.post_send(p.a.qpn, wr(i, SendOp::Write { remote }, vec![sge])).unwrap();
    }
    let start = p.now;
    p.run_filtered(Duration::from_micros(1), |f| !(f.dir == Dir::AtoB && f.index == 1));
    let b = from_b(&p);
    assert!(b.len() >= 2, "{b:?}");
    assert!(is_ack(&b[0]) && b[0].transport.bth.psn == Psn::new(100));
    assert_eq!(b[1].transport.aeth.unwrap().syndrome, AckSyndrome::Nak(rocev2::wire::NakCode::PsnSequenceError));
    assert!(b[1].at.saturating_duration_since(start) < Duration::from_micros(1));
    p.run();
    assert_eq!(p.a.completions().len(), 3);
}

#[test]
fn read_responses_and_atomic_acks_are_not_delayed() {
    let mut p = pair();
    p.b.mem_mut()[64..72].copy_from_slice(&41u64.to_ne_bytes());
    let (remote, sge) = (p.b.remote(0), p.a.sge(0, 8));
    p.a.engine.post_send(p.a.qpn, wr(1, SendOp::Write { remote }, vec![sge])).unwrap();
    let (remote, sge) = (p.b.remote(1024), p.a.sge(2048, 100));
    p.a.engine.post_send(p.a.qpn, wr(2, SendOp::Read { remote }, vec![sge])).unwrap();
    let (remote, sge) = (p.b.remote(64), p.a.sge(4096, 8));
    p.a.engine.post_send(p.a.qpn, wr(3, SendOp::FetchAdd { remote, add: 1 }, vec![sge])).unwrap();
    p.run_for(Duration::from_micros(2));
    let b = from_b(&p);
    let ops: Vec<Opcode> = b.iter().map(|s| s.transport.bth.opcode).collect();
    assert_eq!(ops, vec![Opcode::RC_ACK, Opcode::RC_READ_RESPONSE_ONLY, Opcode::RC_ATOMIC_ACK], "the WRITE's ACK first, nothing waits");
    let c = p.a.completions();
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success), (2, WcStatus::Success), (3, WcStatus::Success)]
    );
    assert_eq!(p.b.engine.qp_stats(p.b.qpn).unwrap().resp_acks_hold_expired, 0);
}

#[test]
fn a_zero_hold_acks_at_once() {
    let mut cfg = PairConfig::default();
    cfg.engines[1].ack_hold = Duration::ZERO;
    let mut p = Pair::new(&cfg).unwrap();
    p.record();
    let (remote, sge) = (p.b.remote(0), p.a.sge(0, 8));
    p.a.engine.post_send(p.a.qpn, wr(1, SendOp::Write { remote }, vec![sge])).unwrap();
    p.run_for(Duration::from_micros(1));
    assert!(is_ack(&from_b(&p)[0]));
    assert_eq!(p.b.engine.qp_stats(p.b.qpn).unwrap().resp_acks_held, 0);
}

/// Ping-pongs of SENDs over a lossy, duplicating, reordering link: every
/// message arrives once, every send completes, whatever the held ACKs meet.
#[test]
fn ping_pongs_over_a_lossy_link_lose_nothing() {
    const ROUNDS: u64 = 40;
    for seed in 0..8u64 {
        let mut p = pair();
        for i in 0..ROUNDS {
            p.b.engine.post_recv(p.b.qpn, RecvWr { wr_id: 1000 + i, sgl: vec![p.b.sge(0, 64)] }).unwrap();
            p.a.engine.post_recv(p.a.qpn, RecvWr { wr_id: 2000 + i, sgl: vec![p.a.sge(0, 64)] }).unwrap();
        }
        let faults = rocev2::impair::Faults { loss: 0.1, duplicate: 0.05, reorder: 0.05, ..rocev2::impair::Faults::NONE };
        let link = LinkConfig { faults, reorder_max: Duration::from_micros(5), ..LinkConfig::ideal(Duration::from_micros(1)) };
        let mut net = p.into_network(link, seed);
        let sge = [net.mr[0].sge(512, 8), net.mr[1].sge(512, 8)];
        let qpn = net.qpn;
        net.engine(0).post_send(qpn[0], wr(0, SendOp::Send, vec![sge[0]])).unwrap();
        let mut sends = [1u64, 0];
        let mut done = [[0u64; 2]; 2];
        let end = net.net.now() + Duration::from_secs(30);
        loop {
            let mut posted = false;
            for i in 0..2 {
                while let Some(c) = net.engine(i).poll_completion() {
                    let c = c.wc;
                    assert_eq!(c.status, WcStatus::Success, "seed {seed}: {c:?}");
                    let recv = c.opcode == WcOpcode::Recv;
                    done[i][usize::from(recv)] += 1;
                    // A answers B's pong with the next ping, B each ping with a pong.
                    if recv && sends[i] < ROUNDS {
                        net.engine(i).post_send(qpn[i], wr(sends[i], SendOp::Send, vec![sge[i]])).unwrap();
                        sends[i] += 1;
                        posted = true;
                    }
                }
            }
            match net.net.step(end) {
                Some(RunOutcome::Idle) if !posted => break,
                Some(RunOutcome::Deadline | RunOutcome::Stalled | RunOutcome::Stopped) => break,
                _ => {}
            }
        }
        assert_eq!(done, [[ROUNDS; 2]; 2], "seed {seed}: every send and receive completed once");
        assert_eq!(net.engine(1).qp_stats(qpn[1]).unwrap().resp_messages, ROUNDS, "seed {seed}: each ping executed once");
    }
}

/// The responder's application is done (ib_write_lat's server after its
/// last WRITE) and destroys its QP, or moves it to ERR, while an ACK is
/// held: the ACK still leaves, so the peer's last message completes.
#[test]
fn a_held_ack_leaves_when_its_qp_is_destroyed_or_fails() {
    for destroy in [true, false] {
        let mut p = pair();
        let (remote, sge) = (p.b.remote(0), p.a.sge(0, 8));
        p.a.engine.post_send(p.a.qpn, wr(1, SendOp::Write { remote }, vec![sge])).unwrap();
        p.run_for(DEFAULT_ACK_HOLD / 2);
        assert!(from_b(&p).is_empty(), "held");
        if destroy {
            p.b.engine.destroy_qp(p.b.qpn).unwrap();
        } else {
            let attr = rocev2::transport::attr::QpAttr { qp_state: rocev2::transport::attr::QpState::Err, ..Default::default() };
            p.b.engine.modify_qp(p.b.qpn, &attr, rocev2::transport::attr::QpAttrMask::STATE).unwrap();
        }
        p.run_for(Duration::from_micros(1));
        let b = from_b(&p);
        assert!(!b.is_empty() && is_ack(&b[0]), "destroy {destroy}: {b:?}");
        assert_eq!(p.a.completions()[0].status, WcStatus::Success, "destroy {destroy}");
    }
}

/// A reply that releases a held ACK and is then lost is retransmitted one
/// ACK timeout after it left, exactly: its timer is queued when the hold
/// ends (the engine forgets the hold's deadline there instead of letting
/// it fire for nothing and queue the ACK timeout then), at the same
/// instant as ever. The ping's ACK, right behind the reply, arrives.
#[test]
fn a_lost_reply_behind_a_released_hold_is_retransmitted_at_its_ack_timeout() {
    let mut p = ping_held();
    let recv = RecvWr { wr_id: 8, sgl: vec![p.a.sge(4096, 64)] };
    p.a.engine.post_recv(p.a.qpn, recv).unwrap();
    let sge = p.b.sge(4096, 8);
    p.b.engine.post_send(p.b.qpn, wr(2, SendOp::Send, vec![sge])).unwrap();
    assert!(p.run_losing_first(RUN_LIMIT, Dir::BtoA, |f| f.repr.transport.bth.opcode == Opcode::RC_SEND_ONLY));
    let b = from_b(&p);
    let sends: Vec<_> = b.iter().filter(|s| s.transport.bth.opcode == Opcode::RC_SEND_ONLY).collect();
    assert_eq!(sends.len(), 2, "the reply and its retransmission: {b:?}");
    assert!(!sends[0].delivered && sends[1].delivered);
    // 4.096 µs × 2^8, from the reply's departure.
    let timeout = Duration::from_nanos(4096 << 8);
    assert_eq!(sends[1].at.saturating_duration_since(sends[0].at), timeout);
    assert!(is_ack(&b[1]) && b[1].delivered, "the ping's ACK right behind the lost reply: {:?}", b[1].transport);
    let c = p.a.completions();
    assert_eq!(c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), vec![(1, WcStatus::Success), (8, WcStatus::Success)]);
    let s = p.b.engine.qp_stats(p.b.qpn).unwrap();
    assert_eq!((s.req_timeouts, s.req_retransmits, s.resp_acks_held, s.resp_acks_hold_expired), (1, 1, 1, 0));
}

/// A QP whose only answer is a held ACK is not on the ready list: the
/// engine says it has nothing to transmit (so a datapath lends it no
/// buffer), and the ACK still leaves behind the reply. After that ACK, with
/// nothing left, the QP is not put back on the list either. Frames are
/// handed over one by one here (the pair's `run` would hide a visit that
/// finds nothing).
#[test]
fn a_held_ack_alone_is_nothing_to_transmit_until_the_reply() {
    let mut p = pair();
    let now = p.now;
    let mut buf = vec![0u8; 4096];
    let recv = RecvWr { wr_id: 7, sgl: vec![p.b.sge(0, 64)] };
    p.b.engine.post_recv(p.b.qpn, recv).unwrap();
    // B idle, as its datapath's polls leave it.
    assert_eq!(p.b.engine.poll_transmit(now, &mut buf), None);
    assert!(!p.b.engine.may_transmit(now));
    let sge = p.a.sge(0, 8);
    p.a.engine.post_send(p.a.qpn, wr(1, SendOp::Send, vec![sge])).unwrap();
    let n = p.a.engine.poll_transmit(now, &mut buf).expect("the ping");
    p.b.engine.handle_frame(now, &buf[..n]);
    assert_eq!(p.b.completions().len(), 1, "the ping arrived");
    assert!(!p.b.engine.may_transmit(now), "B holds the ping's ACK and has nothing else to send");
    assert_eq!(p.b.engine.poll_transmit(now, &mut buf), None);
    // B's application answers: the reply, then the held ACK, then nothing.
    let sge = p.b.sge(4096, 8);
    p.b.engine.post_send(p.b.qpn, wr(2, SendOp::Send, vec![sge])).unwrap();
    assert!(p.b.engine.may_transmit(now), "the reply is posted");
    let n = p.b.engine.poll_transmit(now, &mut buf).expect("the reply");
    assert_eq!(parse_frame(&buf[..n]).unwrap().repr.transport.bth.opcode, Opcode::RC_SEND_ONLY);
    assert!(p.b.engine.may_transmit_more(), "the released ACK follows");
    let n = p.b.engine.poll_transmit(now, &mut buf).expect("the ACK");
    let ack = parse_frame(&buf[..n]).unwrap().repr.transport;
    assert!(ack.bth.opcode == Opcode::RC_ACK && ack.bth.psn == Psn::new(100), "{ack:?}");
    assert!(!p.b.engine.may_transmit_more(), "nothing left after the ACK");
    assert_eq!(p.b.engine.poll_transmit(now, &mut buf), None);
}
