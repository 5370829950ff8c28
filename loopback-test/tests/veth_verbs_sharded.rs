//! The verbs integration cases of `verbs-api/tests/cases` over a real link,
//! with two shards per device: two queues on each veth end, one AF_XDP
//! socket and one pinned polling thread per queue, QPs spread over the
//! shards, and frames that arrive on the queue of a shard that does not own
//! their QP handed over to the owner. Each test
//! makes its own namespaces; they are removed at exit (also after a failed
//! test) and by `VethPair::sweep_stale` if a run was killed.

#[path = "../../verbs-api/tests/cases/mod.rs"]
mod cases;
#[path = "../../verbs-api/tests/common.rs"]
mod common;
mod veth;
#[macro_use]
#[path = "veth/verbs_cases.rs"]
mod verbs_cases;

fn setup() {
    veth::require_root();
    common::use_fabric(veth::devices_sharded);
}

verbs_cases!(setup);

/// QPs land on both shards; a QP whose peer lives on the other shard gets
/// its frames on the "wrong" queue, and they are handed over, none lost.
#[test]
fn qps_spread_over_shards_and_frames_are_handed_over() {
    use common::*;
    use std::sync::atomic::Ordering::Relaxed;
    use urnic::*;
    veth::require_root();
    let (_pair, ca, cb) = veth::pair_sharded(Impairments::default(), 1500, 2);
    assert_eq!((ca.nic().shard_count(), cb.nic().shard_count()), (2, 2));
    let mut a = side(&ca, 1 << 20);
    let b = side(&cb, 1 << 20);
    // One extra QP on b puts each b QP on the other shard than its a peer.
    let _offset = rc_qp(&b, None);
    let pairs: Vec<(Qp, Qp)> = (0..4).map(|_| (rc_qp(&a, None), rc_qp(&b, None))).collect();
    let shards: std::collections::HashSet<u32> = pairs.iter().map(|(qa, _)| qa.qp_num() % 2).collect();
    assert_eq!(shards.len(), 2, "a's QPs on both shards");
    for (k, (qa, qb)) in pairs.iter().enumerate() {
        assert_ne!(qa.qp_num() % 2, qb.qp_num() % 2);
        bring_up(qa, &ca, qb.qp_num(), &cb, 10 + k as u32, 1000 + k as u32);
        bring_up(qb, &cb, qa.qp_num(), &ca, 1000 + k as u32, 10 + k as u32);
    }
    for (k, (qa, qb)) in pairs.iter().enumerate() {
        let len = 50_000 + k * 1000;
        fill(&mut a.mr, 0, len, k as u8);
        let off = (k * 120_000) as u64;
        let remote = RemoteAddr { addr: b.mr.addr() + off, rkey: b.mr.rkey() };
        qb.post_recv(&RecvWr { wr_id: k as u64, sgl: vec![b.mr.sge(600_000, 100_000)] }).unwrap();
        qa.post_send(&send_wr(1, SendOp::Write { remote }, vec![a.mr.sge(0, len as u32)])).unwrap();
        qa.post_send(&send_wr(2, SendOp::Send, vec![a.mr.sge(0, 1000)])).unwrap();
        let c = wait(&a.cq, 2);
        assert!(c.iter().all(|c| c.status == WcStatus::Success), "{c:?}");
        let r = wait(&b.cq, 1);
        assert_eq!((r[0].wr_id, r[0].status, r[0].byte_len), (k as u64, WcStatus::Success, 1000));
        assert_eq!(bytes(&b.mr, off as usize..off as usize + len), &expected(len, k as u8)[..]);
    }
    for ctx in [&ca, &cb] {
        let s = &ctx.nic().stats;
        assert!(s.rx_handoffs.load(Relaxed) > 0, "{}: {}", ctx.name(), ctx.counters());
        assert_eq!(s.rx_handoff_drops.load(Relaxed), 0);
    }
}
