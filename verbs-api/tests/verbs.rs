//! Integration tests through the public verbs API only, over the in-memory
//! port: every operation, sizes from 0 B to MiBs, data verified.

mod cases;
mod common;

use common::*;
use urnic::*;

const MIB: usize = 1 << 20;

#[test]
fn send_recv_across_sizes_with_imm() {
    cases::send_recv_across_sizes_with_imm();
}

#[test]
fn write_and_write_with_imm() {
    cases::write_and_write_with_imm();
}

#[test]
fn read_across_sizes_and_sges() {
    cases::read_across_sizes_and_sges();
}

#[test]
fn atomics() {
    cases::atomics();
}

#[test]
fn srq_feeds_two_qps() {
    cases::srq_feeds_two_qps();
}

#[test]
fn ud_send_with_address_handle() {
    cases::ud_send_with_address_handle();
}

#[test]
fn memory_windows_bind_use_and_invalidate() {
    cases::memory_windows_bind_use_and_invalidate();
}

#[test]
fn dereg_with_a_bound_window_is_busy_and_changes_nothing() {
    cases::dereg_with_a_bound_window_is_busy_and_changes_nothing();
}

#[test]
fn dropping_a_region_with_bound_windows_defers_its_release() {
    cases::dropping_a_region_with_bound_windows_defers_its_release();
}

#[test]
fn type2_window_bound_by_wr_and_invalidated_by_send() {
    cases::type2_window_bound_by_wr_and_invalidated_by_send();
}

#[test]
fn many_threads_post_on_many_qps() {
    cases::many_threads_post_on_many_qps();
}

#[test]
fn error_state_flushes_everything_once() {
    cases::error_state_flushes_everything_once();
}

#[test]
fn bad_arguments_are_refused_without_queueing() {
    cases::bad_arguments_are_refused_without_queueing();
}

#[test]
fn completion_channel_wakes_a_waiter_and_cq_resize_keeps_entries() {
    cases::completion_channel_wakes_a_waiter_and_cq_resize_keeps_entries();
}

#[test]
fn uc_write_and_send() {
    cases::uc_write_and_send();
}

#[test]
fn link_down_raises_port_events_and_rc_recovers_after_it() {
    let hub = MemHub::new(11);
    let (ca, cb) = devices_on(&hub, Impairments::default());
    let mut a = side(&ca, 65536);
    let b = side(&cb, 65536);
    let qa = rc_qp(&a, None);
    let qb = rc_qp(&b, None);
    // timeout 16 = 268 ms; with retry_cnt 7 the QP outlasts a 2 s outage,
    // far more than the one below even on a loaded machine.
    bring_up_with_timeout(&qa, &ca, qb.qp_num(), &cb, 1, 2, 16);
    bring_up_with_timeout(&qb, &cb, qa.qp_num(), &ca, 2, 1, 16);
    let wait_event = |want: AsyncEvent| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            match ca.poll_async_event() {
                Some(e) if e == want => return,
                Some(_) => {}
                None => assert!(std::time::Instant::now() < deadline, "no {want:?}"),
            }
            std::thread::yield_now();
        }
    };
    assert!(hub.set_link(MAC_A, false));
    wait_event(AsyncEvent::PortError);
    assert_eq!(ca.query_port(1).unwrap().state, PortState::Down);
    fill(&mut a.mr, 0, 3000, 21);
    let remote = RemoteAddr { addr: b.mr.addr(), rkey: b.mr.rkey() };
    qa.post_send(&send_wr(1, SendOp::Write { remote }, vec![a.mr.sge(0, 3000)])).unwrap();
    // Keep the link down until the WRITE has gone into it (on a loaded
    // machine the datapath thread may not run within any fixed sleep).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while hub.stats.link_down.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        assert!(std::time::Instant::now() < deadline, "the WRITE never reached the dead link");
        std::thread::yield_now();
    }
    assert!(hub.set_link(MAC_A, true));
    wait_event(AsyncEvent::PortActive);
    assert_eq!(ca.query_port(1).unwrap().state, PortState::Active);
    // The WRITE sent into the dead link is retransmitted after the timeout.
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::Success);
    assert_eq!(bytes(&b.mr, 0..3000), &expected(3000, 21)[..]);
}

#[test]
fn everything_completes_over_an_impaired_link() {
    let imp = Impairments::from(Faults { loss: 0.03, duplicate: 0.01, reorder: 0.02, corrupt: 0.01, ..Faults::NONE });
    let (mut a, qa, mut b, qb) = rc_pair(imp, 4 * MIB);
    fill(&mut a.mr, 0, MIB, 1);
    fill(&mut b.mr, 2 * MIB, MIB, 2);
    let rb = |off: usize| RemoteAddr { addr: b.mr.addr() + off as u64, rkey: b.mr.rkey() };
    qb.post_recv(&RecvWr { wr_id: 50, sgl: vec![b.mr.sge(3 * MIB, MIB as u32)] }).unwrap();
    qa.post_send(&send_wr(1, SendOp::Write { remote: rb(0) }, vec![a.mr.sge(0, MIB as u32)])).unwrap();
    qa.post_send(&send_wr(2, SendOp::Read { remote: rb(2 * MIB) }, vec![a.mr.sge(MIB, MIB as u32)])).unwrap();
    qa.post_send(&send_wr(3, SendOp::Send, vec![a.mr.sge(0, 300_000)])).unwrap();
    qa.post_send(&send_wr(4, SendOp::FetchAdd { remote: rb(8), add: 3 }, vec![a.mr.sge(2 * MIB, 8)])).unwrap();
    let c = wait(&a.cq, 4);
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success), (2, WcStatus::Success), (3, WcStatus::Success), (4, WcStatus::Success)]
    );
    let r = wait(&b.cq, 1);
    assert_eq!((r[0].wr_id, r[0].byte_len), (50, 300_000));
    // WRITE landed, then the atomic added 3 to bytes 8..16 of it
    let mut want = expected(MIB, 1);
    let v = u64::from_ne_bytes(want[8..16].try_into().unwrap()).wrapping_add(3);
    want[8..16].copy_from_slice(&v.to_ne_bytes());
    assert_eq!(bytes(&b.mr, 0..MIB), &want[..]);
    assert_eq!(bytes(&a.mr, MIB..2 * MIB), &expected(MIB, 2)[..]);
    assert_eq!(bytes(&b.mr, 3 * MIB..3 * MIB + 300_000), &expected(300_000, 1)[..]);
    let s = qa.stats().unwrap();
    assert!(s.req_retransmits > 0, "losses were recovered by retransmission: {s:?}");
    // Corrupted frames were caught by the ICRC and counted, not delivered.
    let bad = |c: &Context| c.engine_stats().rx_bad_frame.values().sum::<u64>();
    let corrupted = bad(&a.ctx) + bad(&b.ctx) > 0;
    assert!(corrupted, "1% corruption over thousands of frames produced no ICRC drop");
    // A replayed READ supersedes its queued stream: responses stay within a
    // multiple of the 1024 packets the READ needs (about 5x on an idle
    // machine; a core lost to another process makes timeouts, and so
    // re-requests, more frequent — seen up to 45x).
    let responses = qb.stats().unwrap().resp_read_responses_sent;
    assert!(responses < 100 * 1024, "{responses} READ responses for a 1024-packet READ");
}

/// ZERO_BASED regions (`IBV_ACCESS_ZERO_BASED`) are addressed by offsets,
/// locally and remotely: SGEs with offsets post and move data, SGEs with the
/// host address are refused at post time, as the datapath would refuse them.
#[test]
fn zero_based_regions_work_by_offset_end_to_end() {
    const LEN: usize = 64 * 1024;
    let (a, qa, b, qb) = rc_pair(Impairments::default(), 4096);
    let zb = Access::ZERO_BASED | (ALL - Access::MW_BIND);
    let mut za = a.pd.alloc_mr(LEN, zb).unwrap();
    let zr = b.pd.alloc_mr(LEN, zb).unwrap();
    assert_eq!((za.iova(), zr.iova()), (0, 0));
    za.write_at(0, &expected(LEN, 9)).unwrap();

    // SEND from offset 1000 into a receive at offset 5000.
    qb.post_recv(&RecvWr { wr_id: 1, sgl: vec![zr.sge(5000, 3000)] }).unwrap();
    qa.post_send(&send_wr(2, SendOp::Send, vec![za.sge(1000, 3000)])).unwrap();
    assert_eq!(wait(&b.cq, 1)[0].status, WcStatus::Success);
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::Success);
    assert_eq!(bytes(&zr, 5000..8000), &expected(LEN, 9)[1000..4000]);

    // WRITE to remote offset 20000, READ it back into local offset 40000.
    let remote = RemoteAddr { addr: 20_000, rkey: zr.rkey() };
    qa.post_send(&send_wr(3, SendOp::Write { remote }, vec![za.sge(0, 10_000)])).unwrap();
    qa.post_send(&send_wr(4, SendOp::Read { remote }, vec![za.sge(40_000, 10_000)])).unwrap();
    let wcs = wait(&a.cq, 2);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    assert_eq!(bytes(&zr, 20_000..30_000), &expected(LEN, 9)[..10_000]);
    assert_eq!(bytes(&za, 40_000..50_000), &expected(LEN, 9)[..10_000]);

    // The last byte posts; one past it, or the host address, does not.
    qb.post_recv(&RecvWr { wr_id: 5, sgl: vec![zr.sge(LEN - 1, 1)] }).unwrap();
    for bad in [zr.sge(LEN - 1, 2), Sge { addr: zr.addr(), length: 8, lkey: zr.lkey() }] {
        let e = qb.post_recv(&RecvWr { wr_id: 6, sgl: vec![bad] }).unwrap_err();
        assert_eq!((e.kind(), e.errno()), (ErrorKind::InvalidArgument, libc::EINVAL), "{e}");
        assert!(e.message().starts_with("sge[0] "), "{e}");
    }
    let e = qa.post_send(&send_wr(7, SendOp::Send, vec![za.sge(0, 8), za.sge(LEN, 8)])).unwrap_err();
    assert!(e.message().starts_with("sge[1] "), "{e}");
}

/// A WRITE makes no completion at the responder, yet its application may
/// answer it at once (ib_write_lat spins on the written bytes): its ACK
/// waits for that answer — held by the responder for the QP's next request
/// frame (`resp_acks_held`), or a bare ACK batch left for one poll by the
/// datapath (`acks_deferred`) — and still leaves when none comes (the
/// hold's bound, `resp_acks_hold_expired`): every WRITE completes.
#[test]
fn write_acks_wait_for_an_answer_and_still_arrive() {
    let (mut a, qa, b, _qb) = rc_pair(Impairments::default(), 4096);
    fill(&mut a.mr, 0, 64, 3);
    let remote = RemoteAddr { addr: b.mr.addr(), rkey: b.mr.rkey() };
    for i in 0..20 {
        qa.post_send(&send_wr(i, SendOp::Write { remote }, vec![a.mr.sge(0, 64)])).unwrap();
        let wc = wait(&a.cq, 1);
        assert_eq!((wc[0].wr_id, wc[0].status), (i, WcStatus::Success));
    }
    assert_eq!(bytes(&b.mr, 0..64), expected(64, 3));
    let counters = b.ctx.counters();
    let deferred = counters.get("acks_deferred").expect("acks_deferred counter");
    let held: u64 = counters.qps.iter().map(|(_, s)| s.resp_acks_held).sum();
    let expired: u64 = counters.qps.iter().map(|(_, s)| s.resp_acks_hold_expired).sum();
    assert!(deferred + held >= 1, "the responder never held or deferred a WRITE's ACK");
    assert!(expired <= held);
    assert_quiet(&b.cq);
}

/// Posts from several threads at once against a polling datapath thread:
/// every WR leaves and completes, each burst's last ones too. A post rings
/// the doorbell with a read-modify-write only when it reads the QP's flag
/// clear (`Nic::ring_qp`); one that reads it set relies on the drain's check
/// of the ring's tail after clearing it. A WR stranded by a wrong order
/// there would never complete: the burst's last posts have no later post to
/// ring for them (`wait` fails).
#[test]
fn concurrent_posts_all_leave_and_complete() {
    const THREADS: u64 = 4;
    const BURST: u64 = 100;
    let (a, qa, b, _qb) = rc_pair(Impairments::default(), 4096);
    let remote = RemoteAddr { addr: b.mr.addr(), rkey: b.mr.rkey() };
    for round in 0..100u64 {
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (qa, a) = (&qa, &a);
                s.spawn(move || {
                    for i in 0..BURST {
                        let id = (round * THREADS + t) * BURST + i;
                        qa.post_send(&send_wr(id, SendOp::Write { remote }, vec![a.mr.sge(0, 8)])).unwrap();
                    }
                });
            }
        });
        let mut ids: Vec<u64> = wait(&a.cq, (THREADS * BURST) as usize)
            .iter()
            .map(|w| {
                assert_eq!(w.status, WcStatus::Success, "{w:?}");
                w.wr_id
            })
            .collect();
        ids.sort_unstable();
        assert_eq!(ids, (round * THREADS * BURST..(round + 1) * THREADS * BURST).collect::<Vec<_>>(), "round {round}");
    }
}

#[test]
fn a_full_queue_refuses_posts_at_once() {
    cases::a_full_queue_refuses_posts_at_once();
}

/// That `ids` (completions' `wr_id`s, thread `t` posting `t * per ..
/// (t + 1) * per`) hold each WR once, each thread's in the order it posted.
fn per_thread_in_order(ids: &[u64], threads: u64, per: u64) {
    let mut next: Vec<u64> = (0..threads).map(|t| t * per).collect();
    for &id in ids {
        let t = (id / per) as usize;
        assert_eq!(id, next[t], "thread {t}'s WRs once each, in order");
        next[t] += 1;
    }
    assert!(next.iter().enumerate().all(|(t, &n)| n == (t as u64 + 1) * per), "all arrived: {next:?}");
}

/// Receive posts from several threads racing the QP's move to ERR: those
/// drained before it are flushed by the move, those after it complete at
/// once with a flush error; a post refused while the queue holds its depth
/// (ENOMEM) is retried. Every WR posted completes once, in each thread's order.
#[test]
fn receive_posts_racing_the_move_to_err_complete_once() {
    const THREADS: u64 = 4;
    const PER: u64 = 300;
    let (_a, _qa, b, qb) = rc_pair(Impairments::default(), 65536);
    let posted = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (qb, b, posted) = (&qb, &b, &posted);
            s.spawn(move || {
                for i in 0..PER {
                    let sgl: Vec<Sge> = (0..=i % 4).map(|k| b.mr.sge(k as usize * 64, 64)).collect();
                    let wr = RecvWr { wr_id: t * PER + i, sgl };
                    loop {
                        match qb.post_recv(&wr) {
                            Ok(()) => break,
                            Err(e) if e.kind() == ErrorKind::NoResources => std::thread::yield_now(),
                            Err(e) => panic!("post_recv: {e}"),
                        }
                    }
                    posted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
        while posted.load(std::sync::atomic::Ordering::Relaxed) < 200 {
            std::thread::yield_now();
        }
        qb.modify(&QpAttr { qp_state: QpState::Err, ..QpAttr::default() }, QpAttrMask::STATE).unwrap();
    });
    let r = wait(&b.cq, (THREADS * PER) as usize);
    assert!(r.iter().all(|c| c.status == WcStatus::WrFlushErr && c.opcode == WcOpcode::Recv), "flushed");
    per_thread_in_order(&r.iter().map(|c| c.wr_id).collect::<Vec<_>>(), THREADS, PER);
    assert_quiet(&b.cq);
}

/// Several threads post into an SRQ while the datapath drains it, a round
/// at a time, then SENDs on two QPs consume the round: every WR once, the
/// SGEs each WR posted being where its message lands.
#[test]
fn srq_posts_from_many_threads_are_consumed_once() {
    const THREADS: u64 = 3;
    const PER: u64 = 20;
    let (ca, cb) = devices(Impairments::default());
    let mut a = side(&ca, 65536);
    let b = side(&cb, 65536);
    let srq = b.pd.create_srq(64, 2).unwrap();
    let (qa1, qa2, qb1, qb2) = (rc_qp(&a, None), rc_qp(&a, None), rc_qp(&b, Some(&srq)), rc_qp(&b, Some(&srq)));
    bring_up(&qa1, &ca, qb1.qp_num(), &cb, 1, 2);
    bring_up(&qb1, &cb, qa1.qp_num(), &ca, 2, 1);
    bring_up(&qa2, &ca, qb2.qp_num(), &cb, 3, 4);
    bring_up(&qb2, &cb, qa2.qp_num(), &ca, 4, 3);
    fill(&mut a.mr, 0, 64, 9);
    for round in 0..10u64 {
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (srq, b) = (&srq, &b);
                s.spawn(move || {
                    for i in 0..PER {
                        let slot = (t * PER + i) as usize;
                        // A one-byte SGE first (a WR of two SGEs), so a slot
                        // left with another WR's SGEs would place elsewhere.
                        let sgl = vec![b.mr.sge(slot * 512, 1), b.mr.sge(slot * 512 + 256, 63)];
                        srq.post_recv(&RecvWr { wr_id: t * PER + i, sgl }).unwrap();
                    }
                });
            }
        });
        for k in 0..THREADS * PER {
            let qa = if k % 2 == 0 { &qa1 } else { &qa2 };
            qa.post_send(&send_wr(round * 1000 + k, SendOp::Send, vec![a.mr.sge(0, 64)])).unwrap();
        }
        let r = wait(&b.cq, (THREADS * PER) as usize);
        assert!(r.iter().all(|c| c.status == WcStatus::Success && c.byte_len == 64), "round {round}");
        let mut ids: Vec<u64> = r.iter().map(|c| c.wr_id).collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..THREADS * PER).collect::<Vec<_>>(), "round {round}: each WR once");
        for id in ids {
            let at = id as usize * 512;
            assert_eq!(bytes(&b.mr, at..at + 1), &expected(64, 9)[..1], "WR {id}'s first SGE");
            assert_eq!(bytes(&b.mr, at + 256..at + 319), &expected(64, 9)[1..], "WR {id}'s second SGE");
        }
        wait(&a.cq, (THREADS * PER) as usize);
    }
    assert_quiet(&b.cq);
}
