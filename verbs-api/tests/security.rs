//! Remote protection: each violation gives the requester the right error
//! completion and leaves target memory untouched.

mod common;

use common::*;
use urnic::*;

fn check_refused(make_remote: impl FnOnce(&Side) -> RemoteAddr, op: &str) {
    let (mut a, qa, b, _qb) = rc_pair(Impairments::default(), 65536);
    let before = bytes(&b.mr, 0..b.mr.len());
    let remote = make_remote(&b);
    fill(&mut a.mr, 0, 4096, 77);
    let wr = match op {
        "write" => send_wr(1, SendOp::Write { remote }, vec![a.mr.sge(0, 4096)]),
        "read" => send_wr(1, SendOp::Read { remote }, vec![a.mr.sge(0, 4096)]),
        _ => send_wr(1, SendOp::FetchAdd { remote, add: 1 }, vec![a.mr.sge(0, 8)]),
    };
    qa.post_send(&wr).unwrap();
    // a second WR behind it must be flushed (the QP goes to error)
    qa.post_send(&send_wr(2, SendOp::Write { remote }, vec![a.mr.sge(0, 8)])).unwrap();
    let c = wait(&a.cq, 2);
    assert_eq!((c[0].wr_id, c[0].status), (1, WcStatus::RemAccessErr), "{op}: {c:?}");
    assert_eq!((c[1].wr_id, c[1].status), (2, WcStatus::WrFlushErr));
    assert_quiet(&a.cq);
    assert_eq!(bytes(&b.mr, 0..b.mr.len()), before, "{op}: target memory changed");
}

#[test]
fn wrong_rkey() {
    for op in ["write", "read", "atomic"] {
        check_refused(|b| RemoteAddr { addr: b.mr.addr(), rkey: b.mr.rkey() ^ 0x5500 }, op);
    }
}

#[test]
fn rkey_from_another_pd() {
    let (mut a, qa, b, _qb) = rc_pair(Impairments::default(), 65536);
    let pd2 = b.ctx.alloc_pd().unwrap();
    let mr2 = pd2.alloc_mr(65536, ALL).unwrap();
    let before = bytes(&mr2, 0..mr2.len());
    fill(&mut a.mr, 0, 64, 1);
    qa.post_send(&send_wr(1, SendOp::Write { remote: RemoteAddr { addr: mr2.addr(), rkey: mr2.rkey() } }, vec![a.mr.sge(0, 64)])).unwrap();
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::RemAccessErr);
    assert_eq!(bytes(&mr2, 0..mr2.len()), before);
}

#[test]
fn missing_access_flag() {
    let (mut a, qa, b, _qb) = rc_pair(Impairments::default(), 65536);
    let ro = b.pd.alloc_mr(65536, Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
    fill(&mut a.mr, 0, 64, 1);
    qa.post_send(&send_wr(1, SendOp::Write { remote: RemoteAddr { addr: ro.addr(), rkey: ro.rkey() } }, vec![a.mr.sge(0, 64)])).unwrap();
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::RemAccessErr);
    assert!(bytes(&ro, 0..ro.len()).iter().all(|&x| x == 0));
}

#[test]
fn out_of_bounds_va() {
    for op in ["write", "read", "atomic"] {
        check_refused(|b| RemoteAddr { addr: b.mr.addr() + 65536 - 8 + if op == "atomic" { 8 } else { 0 }, rkey: b.mr.rkey() }, op);
    }
}

#[test]
fn deregistered_mr() {
    let (mut a, qa, b, _qb) = rc_pair(Impairments::default(), 65536);
    let victim = b.pd.alloc_mr(65536, ALL).unwrap();
    let remote = RemoteAddr { addr: victim.addr(), rkey: victim.rkey() };
    drop(victim);
    fill(&mut a.mr, 0, 64, 1);
    qa.post_send(&send_wr(1, SendOp::Write { remote }, vec![a.mr.sge(0, 64)])).unwrap();
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::RemAccessErr);
    let _ = b;
}

#[test]
fn stale_key_after_rereg() {
    let (mut a, qa, mut b, _qb) = rc_pair(Impairments::default(), 65536);
    let old = b.mr.rkey();
    b.mr.rereg_access(ALL).unwrap();
    assert_ne!(old, b.mr.rkey());
    fill(&mut a.mr, 0, 64, 1);
    qa.post_send(&send_wr(1, SendOp::Write { remote: RemoteAddr { addr: b.mr.addr(), rkey: old } }, vec![a.mr.sge(0, 64)])).unwrap();
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::RemAccessErr);
}
