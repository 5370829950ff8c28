//! Hostile peers: frames forged by a third party on the segment, each with a
//! correct ICRC, against two engines connected by RC (and UC) QPs. Every
//! forged frame must change nothing but a drop counter; the real traffic
//! around it must still complete with its data.
//!
//! One test per rule; each failed on the engine before the rule existed.

use std::time::Duration;

use rocev2::psn::Psn;
use rocev2::sim::pair::{Dir, Pair, PairConfig};
use rocev2::sim::rc::{HostAddr, RcParams};
use rocev2::time::Instant;
use rocev2::transport::attr::{QpCaps, QpInitAttr, QpState, QpType};
use rocev2::transport::memory::{Access, MemoryTable, PdId};
use rocev2::transport::path::PathHeaders;
use rocev2::transport::wr::*;
use rocev2::wire::{parse_frame, AckSyndrome, AethRepr, BthRepr, NakCode, Opcode, RethRepr, TransportRepr};

const PD: PdId = PdId(1);
const BUF: usize = 64 * 1024;

const A_PSN: u32 = 100;
const B_PSN: u32 = 5000;

/// Hosts 1 (first QPN 0x11) and 2 (0x40) on IPv4 or IPv6 with 64 KiB
/// buffers and one QP of type `ty` each, connected with the default
/// parameters (every access right, MTU 1024) and first PSNs 100 and 5000.
fn pair(ty: QpType, ipv6: bool) -> Pair {
    let host = |n| if ipv6 { HostAddr::ipv6(n) } else { HostAddr::ipv4(n) };
    let mut cfg = PairConfig { hosts: [host(1), host(2)], buf_len: BUF, ..PairConfig::default() };
    cfg.engines[0].first_qpn = 0x11;
    cfg.engines[1].first_qpn = 0x40;
    cfg.qp.qp_type = ty;
    cfg.params = [A_PSN, B_PSN].map(|psn| RcParams { sq_psn: Psn::new(psn), retry_cnt: 7, ..RcParams::default() });
    Pair::new(&cfg).unwrap()
}

/// A well-formed frame with a correct ICRC from `from` to `to`.
fn forge(from: &HostAddr, to: &HostAddr, t: TransportRepr, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; 9000];
    let n = PathHeaders::new(&from.path_to(to), 0xc000).frame(t).emit(payload, &mut buf).unwrap();
    buf.truncate(n);
    parse_frame(&buf).expect("forged frames are valid RoCEv2");
    buf
}

fn stranger(ipv6: bool) -> HostAddr {
    if ipv6 {
        HostAddr::ipv6(66)
    } else {
        HostAddr::ipv4(66)
    }
}

fn write_only(dest_qp: u32, psn: Psn, remote: RemoteAddr, len: u32) -> TransportRepr {
    TransportRepr {
        reth: Some(RethRepr { va: remote.addr, rkey: remote.rkey, dma_len: len }),
        ..TransportRepr::bth_only(BthRepr { ack_req: true, ..BthRepr::new(Opcode::RC_WRITE_ONLY, dest_qp, psn) })
    }
}

fn ack(dest_qp: u32, psn: Psn, syndrome: AckSyndrome) -> TransportRepr {
    TransportRepr { aeth: Some(AethRepr { syndrome, msn: 1 }), ..TransportRepr::bth_only(BthRepr::new(Opcode::RC_ACK, dest_qp, psn)) }
}

fn send_wr(id: u64, op: SendOp, sgl: Vec<Sge>) -> SendWr {
    SendWr { wr_id: id, op, payload: Payload::Sgl(sgl), flags: SendFlags::SIGNALED, ud: None }
}

/// Rule 1 (rxe `check_addr`): a SEND and a WRITE at the expected PSN, with a
/// valid rkey and VA, from a stranger's address (or to an address that is
/// not the QP's) place nothing, complete nothing, move no PSN. The real
/// peer's SEND at that same PSN then succeeds. RC and UC, IPv4 and IPv6.
#[test]
fn requests_from_a_stranger_change_nothing() {
    for ty in [QpType::Rc, QpType::Uc] {
        for ipv6 in [false, true] {
            let mut p = pair(ty, ipv6);
            let (a_addr, b_addr, x) = (p.a.addr, p.b.addr, stranger(ipv6));
            let (send_op, write_op) =
                if ty == QpType::Rc { (Opcode::RC_SEND_ONLY, Opcode::RC_WRITE_ONLY) } else { (Opcode::UC_SEND_ONLY, Opcode::UC_WRITE_ONLY) };
            p.b.engine.post_recv(p.b.qpn, RecvWr { wr_id: 7, sgl: vec![p.b.sge(0, 4096)] }).unwrap();
            let psn = p.b.rq_psn();
            let bad = [0xeeu8; 512];
            let send = TransportRepr::bth_only(BthRepr { ack_req: true, ..BthRepr::new(send_op, p.b.qpn, psn) });
            let mut write = write_only(p.b.qpn, psn, p.b.remote(8192), 512);
            write.bth.opcode = write_op;
            // From a stranger.
            p.b.engine.handle_frame(p.now, &forge(&x, &b_addr, send, &bad));
            p.b.engine.handle_frame(p.now, &forge(&x, &b_addr, write, &bad));
            // From the peer's address but to an address that is not B's.
            p.b.engine.handle_frame(p.now, &forge(&a_addr, &x, send, &bad));
            // From the stranger, spoofing B's own address as destination and
            // A's MAC: only the IP source tells it apart.
            let mut spoof = forge(&x, &b_addr, write, &bad);
            spoof[6..12].copy_from_slice(&a_addr.mac);
            rocev2::wire::icrc::fill_frame(&mut spoof).unwrap();
            p.b.engine.handle_frame(p.now, &spoof);
            assert_eq!(p.b.engine.stats().rx_wrong_peer, 4, "{ty:?} ipv6={ipv6}");
            assert!(p.b.mem().iter().all(|&b| b == 0), "{ty:?} ipv6={ipv6}: no byte placed");
            assert!(p.b.completions().is_empty(), "{ty:?} ipv6={ipv6}: no completion");
            assert_eq!(p.b.rq_psn(), psn, "the expected PSN did not move");
            assert_eq!(p.b.qp_state(), QpState::Rts);
            assert_eq!(p.b.engine.qp_stats(p.b.qpn).unwrap().rx_packets, 0, "refused before the QP saw it");
            // The real SEND at the same PSN goes through.
            p.a.mem_mut()[..300].fill(0x5a);
            let sge = p.a.sge(0, 300);
            p.a.engine.post_send(p.a.qpn, send_wr(1, SendOp::Send, vec![sge])).unwrap();
            p.run();
            let c = p.b.completions();
            assert_eq!(c.len(), 1, "{ty:?} ipv6={ipv6}: {c:?}");
            assert_eq!((c[0].wr_id, c[0].status, c[0].byte_len), (7, WcStatus::Success, 300));
            assert!(p.b.mem()[..300].iter().all(|&b| b == 0x5a));
            assert!(p.b.mem()[300..].iter().all(|&b| b == 0));
            assert_eq!(p.b.engine.stats().rx_wrong_peer, 4, "real traffic is never refused");
        }
    }
}

/// Rule 2 (rxe_comp.c `check_psn`): responses for PSNs that are not
/// outstanding — stale ones, copies of old ones, or any while the QP is idle
/// — are dropped and counted. One InvalidRequest NAK naming an old PSN used
/// to move a QP that had finished its work to ERR.
#[test]
fn stale_and_ghost_responses_do_not_touch_the_send_queue() {
    for ipv6 in [false, true] {
        let mut p = pair(QpType::Rc, ipv6);
        let (a_addr, b_addr) = (p.a.addr, p.b.addr);
        let remote = p.b.remote(0);
        let sge = p.a.sge(0, 100);
        p.a.engine.post_send(p.a.qpn, send_wr(1, SendOp::Write { remote }, vec![sge])).unwrap();
        p.run();
        assert_eq!(p.a.completions().len(), 1);
        let qa = p.a.qpn;
        // Idle: an error NAK for the PSN just acknowledged, and one far back,
        // both from the peer's (spoofed) address.
        let old = Psn::new(A_PSN);
        for (psn, code) in [(old, NakCode::InvalidRequest), (old.add(0xff_0000), NakCode::RemoteAccessError)] {
            p.a.engine.handle_frame(p.now, &forge(&b_addr, &a_addr, ack(qa, psn, AckSyndrome::Nak(code)), &[]));
        }
        // A positive ACK and a READ response for an old PSN.
        p.a.engine.handle_frame(p.now, &forge(&b_addr, &a_addr, ack(qa, old, AckSyndrome::Ack { credits: 31 }), &[]));
        let rr = TransportRepr {
            aeth: Some(AethRepr { syndrome: AckSyndrome::Ack { credits: 31 }, msn: 1 }),
            ..TransportRepr::bth_only(BthRepr::new(Opcode::RC_READ_RESPONSE_ONLY, qa, old))
        };
        p.a.engine.handle_frame(p.now, &forge(&b_addr, &a_addr, rr, &[1; 64]));
        let s = *p.a.engine.qp_stats(qa).unwrap();
        assert_eq!(s.req_stale_responses, 4, "{s:?}");
        assert_eq!(s.req_naks_error_received, 0, "stale NAKs are not acted on");
        assert_eq!(p.a.qp_state(), QpState::Rts);
        assert!(p.a.completions().is_empty());
        // A ghost: beyond anything sent.
        let ghost = p.a.sq_psn().add(10);
        p.a.engine.handle_frame(p.now, &forge(&b_addr, &a_addr, ack(qa, ghost, AckSyndrome::Nak(NakCode::InvalidRequest)), &[]));
        assert_eq!(p.a.engine.qp_stats(qa).unwrap().req_ghost_responses, 1);
        assert_eq!(p.a.qp_state(), QpState::Rts);
        // With work outstanding, a stale error NAK does not fail the WQE in
        // flight: hold B's answers back, inject, then let them through.
        let remote = p.b.remote(4096);
        let sge = p.a.sge(0, 3000);
        p.a.mem_mut()[..3000].fill(0x33);
        p.a.engine.post_send(p.a.qpn, send_wr(2, SendOp::Write { remote }, vec![sge])).unwrap();
        let held = p.run_filtered(Duration::from_millis(1), |f| f.dir == Dir::AtoB);
        assert!(!held.is_empty());
        p.a.engine.handle_frame(p.now, &forge(&b_addr, &a_addr, ack(qa, old, AckSyndrome::Nak(NakCode::RemoteOperationalError)), &[]));
        assert_eq!(p.a.engine.qp_stats(qa).unwrap().req_stale_responses, 5);
        for f in held {
            p.a.engine.handle_frame(p.now, &f);
        }
        p.run();
        let c = p.a.completions();
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!((c[0].wr_id, c[0].status), (2, WcStatus::Success));
        assert!(p.b.mem()[4096..4096 + 3000].iter().all(|&b| b == 0x33));
        assert_eq!(p.a.qp_state(), QpState::Rts);
    }
}

/// Rule 3 (rxe `comp.started_retry`): copies of a PSN sequence error NAK
/// that make no progress neither rewind again nor use up retry_cnt. Eight
/// copies of the peer's own NAK used to put a QP with retry_cnt 7 in ERR; a
/// link that duplicates packets does this with no attacker.
#[test]
fn duplicated_sequence_naks_do_not_use_up_the_retry_budget() {
    let mut p = pair(QpType::Rc, false);
    let remote = p.b.remote(0);
    for (i, b) in p.a.mem_mut()[..3000].iter_mut().enumerate() {
        *b = i as u8;
    }
    let sge = p.a.sge(0, 3000);
    p.a.engine.post_send(p.a.qpn, send_wr(1, SendOp::Write { remote }, vec![sge])).unwrap();
    // Lose the first of the three packets: B answers the second with a NAK.
    let mut first = true;
    let mut nak = None;
    // Well before the retransmission timer (4.096 µs × 2^14 = 67 ms).
    p.run_filtered(Duration::from_millis(1), |f| {
        let (from_a, t) = (f.dir == Dir::AtoB, &f.repr.transport);
        if from_a && first {
            first = false;
            return false;
        }
        if !from_a && matches!(t.aeth.map(|a| a.syndrome), Some(AckSyndrome::Nak(NakCode::PsnSequenceError))) && nak.is_none() {
            nak = Some(*t);
            // Delivered below, with its copies.
            return false;
        }
        true
    });
    let nak = nak.expect("B sent a sequence NAK");
    let f = forge(&p.b.addr, &p.a.addr, nak, &[]);
    for _ in 0..10 {
        p.a.engine.handle_frame(p.now, &f);
    }
    let s = *p.a.engine.qp_stats(p.a.qpn).unwrap();
    assert_eq!(s.req_naks_seq_received, 10);
    assert_eq!(s.req_duplicate_naks, 9, "{s:?}");
    assert_eq!(p.a.qp_state(), QpState::Rts);
    p.run();
    let c = p.a.completions();
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].status, WcStatus::Success);
    assert_eq!(&p.b.mem()[..3000], &p.a.mem()[..3000]);
}

/// Rule 4 (rxe `invalidate_rkey`): SEND with Invalidate naming an ordinary
/// registered MR is an invalid request; the MR stays usable.
#[test]
fn send_with_invalidate_cannot_revoke_an_ordinary_mr() {
    let mut p = pair(QpType::Rc, false);
    let rkey = p.b.mr.key();
    p.b.engine.post_recv(p.b.qpn, RecvWr { wr_id: 9, sgl: vec![p.b.sge(0, 1024)] }).unwrap();
    let sge = p.a.sge(0, 16);
    p.a.engine.post_send(p.a.qpn, send_wr(1, SendOp::SendWithInv { rkey }, vec![sge])).unwrap();
    p.run();
    let c = p.a.completions();
    assert_eq!(c[0].status, WcStatus::RemInvReqErr, "{c:?}");
    let c = p.b.completions();
    assert_eq!((c[0].wr_id, c[0].status), (9, WcStatus::RemInvReqErr), "{c:?}");
    assert_eq!(p.b.engine.qp_stats(p.b.qpn).unwrap().resp_naks_inv_req_sent, 1);
    // The MR still serves remote access.
    let va = p.b.va(0);
    p.b.engine.memory().remote_check(PD, p.b.qpn, rkey, va, 8, Access::REMOTE_WRITE).unwrap();
}

/// Rule 5 (rxe `rxe_get_next_key`): the key byte is random per
/// registration, seeded from the OS per table: two devices do not hand out
/// the same keys, a re-registered or reused slot never gets its old key
/// back, and only `with_seed` repeats a sequence.
#[test]
fn keys_are_not_predictable() {
    let mut buf = vec![0u8; 4096];
    let keys = |t: &MemoryTable, buf: &mut Vec<u8>| -> Vec<u32> {
        (0..8)
            // SAFETY: `buf` outlives the table's use in this test (nothing moves data).
            .map(|i| unsafe { t.register(PD, buf.as_mut_ptr().add(i * 16), 16, 0, Access::LOCAL_WRITE) }.unwrap().rkey)
            .collect()
    };
    let (t1, t2) = (MemoryTable::new(), MemoryTable::new());
    let (k1, k2) = (keys(&t1, &mut buf), keys(&t2, &mut buf));
    // Equal by chance with probability 2^-64.
    assert_ne!(k1, k2, "two devices must not hand out the same key sequence");
    assert_ne!(
        k1.iter().map(|k| k & 0xff).collect::<Vec<_>>(),
        (1..=8u32).map(|i| (i as u8).wrapping_mul(0x9d).wrapping_add(1) as u32).collect::<Vec<_>>()
    );
    // A freed slot reused (the only free one: first in, first out) and a
    // re-registration never give the slot's previous key.
    let mut prev = k1[0];
    t1.deregister(prev).unwrap();
    for _ in 0..200 {
        // SAFETY: as above.
        let again = unsafe { t1.register(PD, buf.as_mut_ptr(), 16, 0, Access::LOCAL_WRITE) }.unwrap().rkey;
        assert_eq!(again >> 8, prev >> 8, "the freed index is reused");
        assert_ne!(again, prev, "with a new key byte");
        t1.deregister(again).unwrap();
        prev = again;
    }
    let mut k = k2[2];
    for _ in 0..200 {
        // SAFETY: as above.
        let n = unsafe { t2.reregister(k, PD, buf.as_mut_ptr(), 16, 0, Access::LOCAL_WRITE) }.unwrap().rkey;
        assert_eq!(n >> 8, k >> 8, "same index");
        assert_ne!(n, k, "a new key byte");
        k = n;
    }
    let (s1, s2) = (MemoryTable::with_seed(7), MemoryTable::with_seed(7));
    assert_eq!(keys(&s1, &mut buf), keys(&s2, &mut buf), "with_seed repeats");
}

/// Rule 6: a CNP counts only from the QP's peer, with a valid P_Key, for a
/// QP in RTR or later; anyone else's CNP used to cut the QP's rate.
#[test]
fn cnps_only_from_the_peer() {
    let mut p = pair(QpType::Rc, false);
    let (a_addr, b_addr, x) = (p.a.addr, p.b.addr, stranger(false));
    let qa = p.a.qpn;
    let cnp = |qpn: u32, pkey: u16| TransportRepr::bth_only(BthRepr { becn: true, pkey, ..BthRepr::new(Opcode::CNP, qpn, Psn::new(0)) });
    let t = Instant::from_nanos(1000);
    p.a.engine.handle_frame(t, &forge(&x, &a_addr, cnp(qa, 0xffff), &[]));
    assert_eq!(p.a.engine.stats().rx_wrong_peer, 1);
    p.a.engine.handle_frame(t, &forge(&b_addr, &a_addr, cnp(qa, 0x1234), &[]));
    assert_eq!(p.a.engine.stats().rx_bad_pkey, 1);
    // A second QP of A's, still in RESET.
    let cap = QpCaps { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let init = QpInitAttr { qp_type: QpType::Rc, pd: PD, send_cq: CqId(1), recv_cq: CqId(2), srq: None, cap, sq_sig_all: true };
    let idle = p.a.engine.create_qp(&init).unwrap();
    p.a.engine.handle_frame(t, &forge(&b_addr, &a_addr, cnp(idle, 0xffff), &[]));
    assert_eq!(p.a.engine.stats().rx_wrong_state, 1);
    assert_eq!(p.a.engine.stats().rx_cnps, 0);
    assert_eq!(p.a.engine.qp_stats(qa).unwrap().rp_cnps_received, 0);
    assert!(!p.a.engine.qp_dcqcn(qa).unwrap().is_limited(), "no stranger slows the QP down");
    // The peer's CNP does.
    p.a.engine.handle_frame(t, &forge(&b_addr, &a_addr, cnp(qa, 0xffff), &[]));
    assert_eq!(p.a.engine.stats().rx_cnps, 1);
    assert!(p.a.engine.qp_dcqcn(qa).unwrap().is_limited());
}

/// Found by the adversarial simulation (sim_random seed 8, far-ahead
/// requests): a sequence NAK rewinds into the middle of a multi-packet
/// SEND, and an ACK covering the whole SEND arrives before the
/// retransmission leaves. The next WR must then start at its own first
/// byte; it used to inherit the old offset (a short WR failed with
/// LOC_PROT_ERR, a long one went out at a wrong PSN).
#[test]
fn an_ack_covering_the_message_being_resent_restarts_the_next_wr_at_its_start() {
    let mut p = pair(QpType::Rc, false);
    let (a_addr, b_addr, qa) = (p.a.addr, p.b.addr, p.a.qpn);
    for (i, b) in p.a.mem_mut()[..4096].iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    p.b.engine.post_recv(p.b.qpn, RecvWr { wr_id: 100, sgl: vec![p.b.sge(0, 4096)] }).unwrap();
    p.b.engine.post_recv(p.b.qpn, RecvWr { wr_id: 101, sgl: vec![p.b.sge(8192, 4096)] }).unwrap();
    let first = p.a.sq_psn();
    // A three-packet SEND, then a 100-byte one, both sent.
    let (s1, s2) = (p.a.sge(0, 2049), p.a.sge(3000, 100));
    p.a.engine.post_send(qa, send_wr(1, SendOp::Send, vec![s1])).unwrap();
    p.a.engine.post_send(qa, send_wr(2, SendOp::Send, vec![s2])).unwrap();
    // B loses the second packet: it NAKs PSN first+1 (once).
    let mut n = 0;
    let mut nak = None;
    p.run_filtered(Duration::from_micros(20), |f| {
        let (from_a, t) = (f.dir == Dir::AtoB, &f.repr.transport);
        if from_a {
            n += 1;
            return n != 2;
        }
        if matches!(t.aeth.map(|a| a.syndrome), Some(AckSyndrome::Nak(NakCode::PsnSequenceError))) {
            nak = Some(*t);
            return false;
        }
        true
    });
    let nak = nak.expect("B NAKed the gap");
    assert_eq!(nak.bth.psn, first.add(1));
    // The NAK rewinds A to the second packet (offset 1024)...
    p.a.engine.handle_frame(p.now, &forge(&b_addr, &a_addr, nak, &[]));
    // ...and before anything leaves, an ACK covering the first SEND's three
    // packets arrives (the late second packet did reach B).
    p.a.engine.handle_frame(p.now, &forge(&b_addr, &a_addr, ack(qa, first.add(2), AckSyndrome::Ack { credits: 31 }), &[]));
    let c = p.a.completions();
    assert_eq!((c.len(), c[0].wr_id, c[0].status), (1, 1, WcStatus::Success), "{c:?}");
    // A goes back to what is still unacknowledged: the second WR's only
    // packet, at its PSN first+3, with its data from its first byte.
    let mut buf = vec![0u8; 9000];
    let len = p.a.engine.poll_transmit(p.now, &mut buf).expect("the second WR leaves");
    let f = parse_frame(&buf[..len]).unwrap();
    assert_eq!(f.repr.transport.bth.psn, first.add(3));
    assert_eq!(f.repr.transport.bth.opcode, Opcode::RC_SEND_ONLY);
    assert_eq!(f.payload, &p.a.mem()[3000..3100]);
    assert_eq!(p.a.qp_state(), QpState::Rts);
}
