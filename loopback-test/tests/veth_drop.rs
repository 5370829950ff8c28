//! RC over veth with the XDP program dropping 1% and 10% of the frames each
//! device receives: every WR completes exactly once, in order, with the right
//! data, and the retransmit counters show the recovery.

#[path = "../../verbs-api/tests/common.rs"]
mod common;
mod veth;

use common::*;
use urnic::*;

const KIB: usize = 1024;

fn counter(ctx: &Context, name: &str) -> u64 {
    ctx.nic().with_port(|p| p.counters()).into_iter().find(|(k, _)| k == name).map(|(_, v)| v).unwrap_or(0)
}

fn run_with_drop(drop: f64, big: usize, small_msgs: u64) {
    veth::require_root();
    let (_pair, ca, cb) = veth::pair(Impairments::from(Faults { loss: drop, ..Faults::NONE }), 1500);
    let mut a = side(&ca, 8 * big);
    let mut b = side(&cb, 8 * big);
    let qa = rc_qp(&a, None);
    let qb = rc_qp(&b, None);
    // ACK timeout 2^14 × 4.096 µs ≈ 67 ms (perftest's), retry_cnt 7: a
    // loaded machine (two cores, four datapath threads, other tests) cannot
    // starve a QP of ACKs for seven timeouts in a row.
    bring_up_with_timeout(&qa, &ca, qb.qp_num(), &cb, 0xff_ff00, 77, 14);
    bring_up_with_timeout(&qb, &cb, qa.qp_num(), &ca, 77, 0xff_ff00, 14);
    fill(&mut a.mr, 0, big, 1);
    fill(&mut b.mr, 2 * big, big, 2);
    let rb = |off: usize| RemoteAddr { addr: b.mr.addr() + off as u64, rkey: b.mr.rkey() };
    qb.post_recv(&RecvWr { wr_id: 50, sgl: vec![b.mr.sge(3 * big, big as u32)] }).unwrap();
    qa.post_send(&send_wr(1, SendOp::Write { remote: rb(0) }, vec![a.mr.sge(0, big as u32)])).unwrap();
    qa.post_send(&send_wr(2, SendOp::Read { remote: rb(2 * big) }, vec![a.mr.sge(big, big as u32)])).unwrap();
    qa.post_send(&send_wr(3, SendOp::Send, vec![a.mr.sge(0, big as u32)])).unwrap();
    qa.post_send(&send_wr(4, SendOp::FetchAdd { remote: rb(8), add: 3 }, vec![a.mr.sge(2 * big, 8)])).unwrap();
    let c = wait(&a.cq, 4);
    assert_eq!(c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), [1, 2, 3, 4].map(|i| (i, WcStatus::Success)));
    let r = wait(&b.cq, 1);
    assert_eq!((r[0].wr_id, r[0].status, r[0].byte_len as usize), (50, WcStatus::Success, big));
    // Many small SENDs with immediate, in batches that fit the queues.
    let mut next = 0u64;
    while next < small_msgs {
        let batch = (small_msgs - next).min(256);
        for i in next..next + batch {
            qb.post_recv(&RecvWr { wr_id: 1000 + i, sgl: vec![b.mr.sge(4 * big + (i as usize % 16) * 64, 64)] }).unwrap();
        }
        for i in next..next + batch {
            qa.post_send(&send_wr(100 + i, SendOp::SendWithImm { imm: i as u32 }, vec![a.mr.sge(i as usize % 1000, 64)])).unwrap();
        }
        let c = wait(&a.cq, batch as usize);
        assert_eq!(c.iter().map(|c| c.wr_id).collect::<Vec<_>>(), (100 + next..100 + next + batch).collect::<Vec<_>>(), "every WR once, in order");
        assert!(c.iter().all(|c| c.status == WcStatus::Success), "{:?}", c.iter().find(|c| c.status != WcStatus::Success));
        let r = wait(&b.cq, batch as usize);
        // Receives complete in order too, each with its immediate and data.
        for (k, rc) in r.iter().enumerate() {
            let i = next + k as u64;
            assert_eq!((rc.wr_id, rc.status, rc.imm_data, rc.byte_len), (1000 + i, WcStatus::Success, Some(i as u32), 64));
        }
        next += batch;
    }
    assert_quiet(&a.cq);
    assert_quiet(&b.cq);
    // The WRITE landed, then the atomic added 3 to bytes 8..16 of it.
    let mut w = expected(big, 1);
    let v = u64::from_ne_bytes(w[8..16].try_into().unwrap()).wrapping_add(3);
    w[8..16].copy_from_slice(&v.to_ne_bytes());
    assert!(bytes(&b.mr, 0..big) == w[..], "WRITE payload");
    assert!(bytes(&a.mr, big..2 * big) == expected(big, 2)[..], "READ payload");
    assert!(bytes(&b.mr, 3 * big..4 * big) == expected(big, 1)[..], "SEND payload");
    let _ = &mut b;
    let sa = qa.stats().unwrap();
    let dropped = counter(&ca, "xdp_impair_dropped") + counter(&cb, "xdp_impair_dropped");
    eprintln!("drop {drop}: {dropped} frames dropped by XDP; requester: {sa:?}");
    assert!(dropped > 0, "the XDP program dropped nothing");
    assert!(sa.req_retransmits > 0, "losses were recovered by retransmission: {sa:?}");
}

#[test]
fn one_percent_drop() {
    run_with_drop(0.01, 1 << 20, 2000);
}

#[test]
fn ten_percent_drop() {
    run_with_drop(0.10, 256 * KIB, 500);
}
