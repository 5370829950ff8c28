//! The verbs integration cases, written against `common::devices` so they
//! run over any fabric: the in-memory hub (`verbs-api/tests/verbs.rs`) and
//! real AF_XDP devices in two network namespaces over veth
//! (`loopback-test/tests/veth_verbs.rs`).

#![allow(dead_code)]

use super::common::*;
use urnic::*;

const MIB: usize = 1 << 20;

/// Shared case (in-memory hub and veth).
pub fn send_recv_across_sizes_with_imm() {
    let (mut a, qa, b, qb) = rc_pair(Impairments::default(), 8 * MIB);
    for (i, &len) in [0usize, 1, 7, 1024, 1025, 4097, 65536, 3 * MIB + 5].iter().enumerate() {
        fill(&mut a.mr, 0, len, i as u8);
        qb.post_recv(&RecvWr { wr_id: 1000 + i as u64, sgl: vec![b.mr.sge(0, (4 * MIB) as u32)] }).unwrap();
        let op = if i % 2 == 0 { SendOp::Send } else { SendOp::SendWithImm { imm: 0xabc0 + i as u32 } };
        qa.post_send(&send_wr(i as u64, op, vec![a.mr.sge(0, len as u32)])).unwrap();
        let s = wait(&a.cq, 1);
        assert_eq!((s[0].wr_id, s[0].status, s[0].opcode), (i as u64, WcStatus::Success, WcOpcode::Send));
        let r = wait(&b.cq, 1);
        assert_eq!(r[0].status, WcStatus::Success, "len {len}");
        assert_eq!((r[0].wr_id, r[0].opcode, r[0].byte_len as usize), (1000 + i as u64, WcOpcode::Recv, len));
        assert_eq!(r[0].imm_data, if i % 2 == 0 { None } else { Some(0xabc0 + i as u32) });
        assert_eq!(bytes(&b.mr, 0..len), &expected(len, i as u8)[..], "payload of {len} bytes");
    }
}

/// Shared case (in-memory hub and veth).
pub fn write_and_write_with_imm() {
    let (mut a, qa, b, qb) = rc_pair(Impairments::default(), 8 * MIB);
    for (i, &len) in [0usize, 1, 1024, 1500, 65536, 5 * MIB].iter().enumerate() {
        fill(&mut a.mr, 0, len, 40 + i as u8);
        let off = 4096 * i;
        let remote = RemoteAddr { addr: b.mr.addr() + off as u64, rkey: b.mr.rkey() };
        qa.post_send(&send_wr(i as u64, SendOp::Write { remote }, vec![a.mr.sge(0, len as u32)])).unwrap();
        assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::Success);
        assert_eq!(bytes(&b.mr, off..off + len), &expected(len, 40 + i as u8)[..]);
    }
    // WRITE with immediate consumes a receive and reports the DMA length.
    qb.post_recv(&RecvWr { wr_id: 77, sgl: vec![] }).unwrap();
    fill(&mut a.mr, 0, 3000, 9);
    let remote = RemoteAddr { addr: b.mr.addr() + 100, rkey: b.mr.rkey() };
    qa.post_send(&send_wr(9, SendOp::WriteWithImm { remote, imm: 0x1234_5678 }, vec![a.mr.sge(0, 3000)])).unwrap();
    let r = wait(&b.cq, 1);
    assert_eq!((r[0].wr_id, r[0].opcode, r[0].byte_len, r[0].imm_data), (77, WcOpcode::RecvRdmaWithImm, 3000, Some(0x1234_5678)));
    assert_eq!(bytes(&b.mr, 100..3100), &expected(3000, 9)[..]);
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::Success);
}

/// Shared case (in-memory hub and veth).
pub fn read_across_sizes_and_sges() {
    let (a, qa, mut b, _qb) = rc_pair(Impairments::default(), 8 * MIB);
    for (i, &len) in [0usize, 8, 1024, 1025, 70_000, 2 * MIB].iter().enumerate() {
        fill(&mut b.mr, 0, len, 80 + i as u8);
        let remote = RemoteAddr { addr: b.mr.addr(), rkey: b.mr.rkey() };
        // split the destination over three SGEs
        let l1 = len / 3;
        let l2 = len / 3;
        let l3 = len - l1 - l2;
        let base = 4 * MIB;
        let sgl = vec![a.mr.sge(base, l1 as u32), a.mr.sge(base + l1 + 64, l2 as u32), a.mr.sge(base + l1 + l2 + 128, l3 as u32)];
        qa.post_send(&send_wr(i as u64, SendOp::Read { remote }, sgl)).unwrap();
        let c = wait(&a.cq, 1);
        assert_eq!((c[0].status, c[0].opcode), (WcStatus::Success, WcOpcode::RdmaRead), "len {len}");
        let want = expected(len, 80 + i as u8);
        let mut got = bytes(&a.mr, base..base + l1);
        got.extend_from_slice(&bytes(&a.mr, base + l1 + 64..base + l1 + 64 + l2));
        got.extend_from_slice(&bytes(&a.mr, base + l1 + l2 + 128..base + l1 + l2 + 128 + l3));
        assert_eq!(got, want, "read of {len} bytes");
    }
}

/// Shared case (in-memory hub and veth).
pub fn atomics() {
    let (a, qa, mut b, _qb) = rc_pair(Impairments::default(), 64 * 1024);
    b.mr.write_at(64, &10u64.to_ne_bytes()).unwrap();
    let remote = RemoteAddr { addr: b.mr.addr() + 64, rkey: b.mr.rkey() };
    qa.post_send(&send_wr(1, SendOp::FetchAdd { remote, add: 5 }, vec![a.mr.sge(0, 8)])).unwrap();
    qa.post_send(&send_wr(2, SendOp::CmpSwap { remote, compare: 15, swap: 99 }, vec![a.mr.sge(8, 8)])).unwrap();
    qa.post_send(&send_wr(3, SendOp::CmpSwap { remote, compare: 15, swap: 1 }, vec![a.mr.sge(16, 8)])).unwrap();
    let c = wait(&a.cq, 3);
    assert!(c.iter().all(|c| c.status == WcStatus::Success), "{c:?}");
    assert_eq!(c.iter().map(|c| c.wr_id).collect::<Vec<_>>(), vec![1, 2, 3]);
    let v = |o: usize| u64::from_ne_bytes(bytes(&a.mr, o..o + 8).try_into().unwrap());
    assert_eq!((v(0), v(8), v(16)), (10, 15, 99));
    assert_eq!(u64::from_ne_bytes(bytes(&b.mr, 64..72).try_into().unwrap()), 99);
}

/// Shared case (in-memory hub and veth).
pub fn srq_feeds_two_qps() {
    let (ca, cb) = devices(Impairments::default());
    let mut a = side(&ca, MIB);
    let b = side(&cb, MIB);
    let srq = b.pd.create_srq(64, 2).unwrap();
    let qa1 = rc_qp(&a, None);
    let qa2 = rc_qp(&a, None);
    let qb1 = rc_qp(&b, Some(&srq));
    let qb2 = rc_qp(&b, Some(&srq));
    bring_up(&qa1, &ca, qb1.qp_num(), &cb, 1, 2);
    bring_up(&qb1, &cb, qa1.qp_num(), &ca, 2, 1);
    bring_up(&qa2, &ca, qb2.qp_num(), &cb, 3, 4);
    bring_up(&qb2, &cb, qa2.qp_num(), &ca, 4, 3);
    let e = qb1.post_recv(&RecvWr { wr_id: 1, sgl: vec![] }).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "QPs on an SRQ take no receives: {e}");
    assert!(e.message().contains("SRQ"), "{e}");
    for i in 0..4u64 {
        srq.post_recv(&RecvWr { wr_id: 500 + i, sgl: vec![b.mr.sge(i as usize * 4096, 4096)] }).unwrap();
    }
    fill(&mut a.mr, 0, 2000, 5);
    qa1.post_send(&send_wr(1, SendOp::Send, vec![a.mr.sge(0, 2000)])).unwrap();
    qa2.post_send(&send_wr(2, SendOp::Send, vec![a.mr.sge(0, 1000)])).unwrap();
    let mut r = wait(&b.cq, 2);
    r.sort_by_key(|c| c.qp_num);
    assert!(r.iter().all(|c| c.status == WcStatus::Success && c.opcode == WcOpcode::Recv));
    let mut qpns = [qb1.qp_num(), qb2.qp_num()];
    qpns.sort();
    assert_eq!([r[0].qp_num, r[1].qp_num], qpns);
    let mut ids: Vec<u64> = r.iter().map(|c| c.wr_id).collect();
    ids.sort();
    assert_eq!(ids, vec![500, 501], "SRQ WQEs consumed in order");
    wait(&a.cq, 2);
}

/// Shared case (in-memory hub and veth).
pub fn ud_send_with_address_handle() {
    let (ca, cb) = devices(Impairments::default());
    let mut a = side(&ca, 65536);
    let b = side(&cb, 65536);
    let (qa, qb) = (ud_qp(&a, 0x1111_1111), ud_qp(&b, 0x1111_1111));
    qb.post_recv(&RecvWr { wr_id: 9, sgl: vec![b.mr.sge(0, 40 + 1024)] }).unwrap();
    let ah = a.pd.create_ah(&AhAttr { dgid: cb.query_gid(1, 1).unwrap(), sgid_index: 1, port_num: 1, ..AhAttr::default() }).unwrap();
    fill(&mut a.mr, 0, 512, 3);
    let wr = SendWr {
        wr_id: 1,
        op: SendOp::SendWithImm { imm: 42 },
        payload: Payload::Sgl(vec![a.mr.sge(0, 512)]),
        flags: SendFlags::SIGNALED,
        ud: Some(UdDest { av: *ah.address_vector(), remote_qpn: qb.qp_num(), remote_qkey: 0x1111_1111 }),
    };
    qa.post_send(&wr).unwrap();
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::Success);
    let r = wait(&b.cq, 1);
    assert_eq!((r[0].status, r[0].byte_len, r[0].src_qp, r[0].grh, r[0].imm_data), (WcStatus::Success, 512 + 40, qa.qp_num(), true, Some(42)));
    assert_eq!(bytes(&b.mr, 40..552), &expected(512, 3)[..]);
    // a UD QP refuses RDMA operations at post time
    let bad = SendWr { op: SendOp::Write { remote: RemoteAddr::default() }, ..wr };
    assert_eq!(qa.post_send(&bad).unwrap_err().kind(), ErrorKind::InvalidArgument);
}

/// Shared case (in-memory hub and veth): both window types bound, used by
/// remote WRITE and READ (data checked at both ends), then invalidated
/// (type 2, LOCAL_INV on the binding QP) and unbound (type 1, a bind of
/// length 0); afterwards their rkeys are refused with a remote access error
/// and the memory behind them stays untouched.
pub fn memory_windows_bind_use_and_invalidate() {
    let (mut a, qa, mut b, qb) = rc_pair(Impairments::default(), 65536);
    // Each refused access below moves its requester QP to ERR: two more
    // connections between the same sides for the later ones.
    let connect = |lpsn: u32, rpsn: u32| {
        let (x, y) = (rc_qp(&a, None), rc_qp(&b, None));
        bring_up(&x, &a.ctx, y.qp_num(), &b.ctx, lpsn, rpsn);
        bring_up(&y, &b.ctx, x.qp_num(), &a.ctx, rpsn, lpsn);
        (x, y)
    };
    let (qa2, _qb2) = connect(300, 400);
    let (qa3, _qb3) = connect(500, 600);
    let rw = Access::REMOTE_WRITE | Access::REMOTE_READ;
    let base = b.mr.addr();

    // Type 1, bound through the verbs call to [4096, 8192) of b's region.
    let mut mw1 = b.pd.alloc_mw(MwType::Type1).unwrap();
    let rkey1 = mw1.bind(&b.mr, base + 4096, 4096, rw).unwrap();
    assert_ne!(rkey1, b.mr.rkey());
    let in1 = RemoteAddr { addr: base + 4096 + 8, rkey: rkey1 };
    fill(&mut a.mr, 0, 100, 1);
    qa.post_send(&send_wr(1, SendOp::Write { remote: in1 }, vec![a.mr.sge(0, 100)])).unwrap();
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::Success);
    assert_eq!(bytes(&b.mr, 4096 + 8..4096 + 108), expected(100, 1), "WRITE through the type-1 window");
    fill(&mut b.mr, 4096 + 1000, 200, 2);
    let at1 = RemoteAddr { addr: base + 4096 + 1000, rkey: rkey1 };
    qa.post_send(&send_wr(2, SendOp::Read { remote: at1 }, vec![a.mr.sge(8192, 200)])).unwrap();
    let c = wait(&a.cq, 1);
    assert_eq!((c[0].wr_id, c[0].status, c[0].opcode), (2, WcStatus::Success, WcOpcode::RdmaRead));
    assert_eq!(bytes(&a.mr, 8192..8392), expected(200, 2), "READ through the type-1 window");

    // Type 2, bound by b's QP with a BIND_MW work request to [16384, 20480).
    let mut mw2 = b.pd.alloc_mw(MwType::Type2).unwrap();
    let new_key = (mw2.rkey() as u8).wrapping_add(0x11);
    let bind = SendOp::BindMw { mw_rkey: mw2.rkey(), new_key, mr_lkey: b.mr.lkey(), addr: base + 16384, length: 4096, access: rw };
    qb.post_send(&SendWr { wr_id: 10, op: bind, payload: Payload::Sgl(vec![]), flags: SendFlags::SIGNALED, ud: None }).unwrap();
    let c = wait(&b.cq, 1);
    assert_eq!((c[0].wr_id, c[0].status, c[0].opcode), (10, WcStatus::Success, WcOpcode::BindMw));
    let rkey2 = (mw2.rkey() & !0xff) | u32::from(new_key);
    mw2.set_rkey(rkey2);
    let in2 = RemoteAddr { addr: base + 16384 + 64, rkey: rkey2 };
    fill(&mut a.mr, 0, 300, 3);
    qa.post_send(&send_wr(3, SendOp::Write { remote: in2 }, vec![a.mr.sge(0, 300)])).unwrap();
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::Success);
    assert_eq!(bytes(&b.mr, 16384 + 64..16384 + 364), expected(300, 3), "WRITE through the type-2 window");
    fill(&mut b.mr, 16384 + 2000, 300, 4);
    let at2 = RemoteAddr { addr: base + 16384 + 2000, rkey: rkey2 };
    qa.post_send(&send_wr(4, SendOp::Read { remote: at2 }, vec![a.mr.sge(12288, 300)])).unwrap();
    let c = wait(&a.cq, 1);
    assert_eq!((c[0].wr_id, c[0].status, c[0].opcode), (4, WcStatus::Success, WcOpcode::RdmaRead));
    assert_eq!(bytes(&a.mr, 12288..12588), expected(300, 4), "READ through the type-2 window");

    // Invalidate the type-2 window (LOCAL_INV on the QP it is bound to) and
    // unbind the type-1 window.
    qb.post_send(&send_wr(11, SendOp::LocalInv { rkey: rkey2 }, vec![])).unwrap();
    let c = wait(&b.cq, 1);
    assert_eq!((c[0].wr_id, c[0].status, c[0].opcode), (11, WcStatus::Success, WcOpcode::LocalInv));
    let unbound = mw1.bind(&b.mr, 0, 0, Access::empty()).unwrap();
    assert_ne!(unbound, rkey1, "unbinding changes the key");

    // Use after invalidation / unbinding: NAK remote access error (IBTA
    // 9.7.5.2.4, rxe check_rkey), and not one byte moves.
    let before = bytes(&b.mr, 0..b.mr.len());
    fill(&mut a.mr, 0, 64, 5);
    qa.post_send(&send_wr(5, SendOp::Write { remote: in2 }, vec![a.mr.sge(0, 64)])).unwrap();
    let c = wait(&a.cq, 1);
    assert_eq!((c[0].wr_id, c[0].status), (5, WcStatus::RemAccessErr), "WRITE through the invalidated type-2 window");
    qa2.post_send(&send_wr(6, SendOp::Write { remote: in1 }, vec![a.mr.sge(0, 64)])).unwrap();
    let c = wait(&a.cq, 1);
    assert_eq!((c[0].wr_id, c[0].status), (6, WcStatus::RemAccessErr), "WRITE through the unbound type-1 window");
    // A window bound again refuses what lies outside it.
    let rkey1b = mw1.bind(&b.mr, base + 4096, 4096, rw).unwrap();
    let outside = RemoteAddr { addr: base + 8192, rkey: rkey1b };
    qa3.post_send(&send_wr(7, SendOp::Write { remote: outside }, vec![a.mr.sge(0, 64)])).unwrap();
    let c = wait(&a.cq, 1);
    assert_eq!((c[0].wr_id, c[0].status), (7, WcStatus::RemAccessErr), "WRITE past the end of the window");
    assert!(bytes(&b.mr, 0..b.mr.len()) == before, "a refused access changed the target memory");
}

/// Shared case (in-memory hub and veth): `ibv_dereg_mr` on a region with a
/// window bound fails with EBUSY and changes nothing: the region keeps its
/// keys and stays usable remotely (by rkey and through the window) and
/// locally (a receive lands in it); so does `ibv_rereg_mr`. Once the window
/// is unbound the deregistration goes through and the rkey is refused.
pub fn dereg_with_a_bound_window_is_busy_and_changes_nothing() {
    let (mut a, qa, b, qb) = rc_pair(Impairments::default(), 65536);
    let mr = b.pd.alloc_mr(65536, ALL).unwrap();
    let mut mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let wkey = mw.bind(&mr, mr.addr() + 4096, 4096, Access::REMOTE_WRITE).unwrap();
    let (lkey, rkey) = (mr.lkey(), mr.rkey());
    let err = mr.dereg().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Busy, "{err}");
    let mut mr = err.into_mr();
    assert_eq!((mr.lkey(), mr.rkey()), (lkey, rkey));
    assert_eq!(mr.rereg_access(ALL).unwrap_err().kind(), ErrorKind::Busy);
    assert_eq!((mr.lkey(), mr.rkey()), (lkey, rkey), "a refused rereg keeps the keys");
    // Remotely, by rkey and through the window.
    fill(&mut a.mr, 0, 256, 7);
    qa.post_send(&send_wr(1, SendOp::Write { remote: RemoteAddr { addr: mr.addr(), rkey } }, vec![a.mr.sge(0, 256)])).unwrap();
    qa.post_send(&send_wr(2, SendOp::Write { remote: RemoteAddr { addr: mr.addr() + 4096, rkey: wkey } }, vec![a.mr.sge(0, 256)])).unwrap();
    let c = wait(&a.cq, 2);
    assert_eq!([c[0].status, c[1].status], [WcStatus::Success; 2], "{c:?}");
    assert_eq!(bytes(&mr, 0..256), expected(256, 7));
    assert_eq!(bytes(&mr, 4096..4096 + 256), expected(256, 7));
    // Locally: its lkey still passes the post-time check and a SEND lands.
    qb.post_recv(&RecvWr { wr_id: 9, sgl: vec![mr.sge(8192, 512)] }).unwrap();
    fill(&mut a.mr, 0, 512, 8);
    qa.post_send(&send_wr(3, SendOp::Send, vec![a.mr.sge(0, 512)])).unwrap();
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::Success);
    let r = wait(&b.cq, 1);
    assert_eq!((r[0].wr_id, r[0].status, r[0].byte_len), (9, WcStatus::Success, 512));
    assert_eq!(bytes(&mr, 8192..8192 + 512), expected(512, 8));
    // Unbound, the region goes; its rkey is refused.
    mw.bind(&mr, 0, 0, Access::empty()).unwrap();
    let addr = mr.addr();
    assert_eq!(mr.dereg().map_err(|e| e.kind()), Ok(None));
    qa.post_send(&send_wr(4, SendOp::Write { remote: RemoteAddr { addr, rkey } }, vec![a.mr.sge(0, 8)])).unwrap();
    let c = wait(&a.cq, 1);
    assert_eq!((c[0].wr_id, c[0].status), (4, WcStatus::RemAccessErr), "WRITE with the rkey of a deregistered region");
}

/// Shared case (in-memory hub and veth): a region dropped while windows are
/// bound to it stays registered, its memory held by the device (reachable
/// through the windows and its rkey, data intact) until the last window is
/// deallocated (type 1) or invalidated (type 2, noticed when the LOCAL_INV
/// completion is polled); then it is freed and its rkey refused.
pub fn dropping_a_region_with_bound_windows_defers_its_release() {
    let (mut a, qa, b, qb) = rc_pair(Impairments::default(), 65536);
    let counter = |name: &str| b.ctx.counters().get(name).unwrap();
    let mr = b.pd.alloc_mr(65536, ALL).unwrap();
    let (addr, rkey) = (mr.addr(), mr.rkey());
    let mut mw1 = b.pd.alloc_mw(MwType::Type1).unwrap();
    let wkey1 = mw1.bind(&mr, addr, 4096, Access::REMOTE_WRITE | Access::REMOTE_READ).unwrap();
    let mw2 = b.pd.alloc_mw(MwType::Type2).unwrap();
    let new_key = (mw2.rkey() as u8).wrapping_add(1);
    let bind = SendOp::BindMw { mw_rkey: mw2.rkey(), new_key, mr_lkey: mr.lkey(), addr: addr + 8192, length: 4096, access: Access::REMOTE_READ };
    qb.post_send(&SendWr { wr_id: 10, op: bind, payload: Payload::Sgl(vec![]), flags: SendFlags::SIGNALED, ud: None }).unwrap();
    assert_eq!(wait(&b.cq, 1)[0].status, WcStatus::Success);
    // mw2's handle keeps its old rkey on purpose: dropping it must still
    // deallocate the window.
    let wkey2 = (mw2.rkey() & !0xff) | u32::from(new_key);

    drop(mr);
    assert_eq!(b.ctx.deferred_deregistrations(), 1);
    assert_eq!((counter("mr_dereg_deferred"), counter("mr_dereg_pending"), counter("mr_deferred_freed")), (1, 1, 0));
    // The memory is still there: WRITE through window 1, READ it back by the
    // region's own rkey.
    fill(&mut a.mr, 0, 1000, 9);
    qa.post_send(&send_wr(1, SendOp::Write { remote: RemoteAddr { addr: addr + 24, rkey: wkey1 } }, vec![a.mr.sge(0, 1000)])).unwrap();
    qa.post_send(&send_wr(2, SendOp::Read { remote: RemoteAddr { addr: addr + 24, rkey } }, vec![a.mr.sge(4096, 1000)])).unwrap();
    let c = wait(&a.cq, 2);
    assert_eq!([c[0].status, c[1].status], [WcStatus::Success; 2], "{c:?}");
    assert_eq!(bytes(&a.mr, 4096..5096), expected(1000, 9));

    // Window 1 deallocated: window 2 still holds the region.
    drop(mw1);
    assert_eq!(b.ctx.deferred_deregistrations(), 1);
    // Window 2 invalidated by LOCAL_INV: polling its completion lets the region go.
    qb.post_send(&send_wr(11, SendOp::LocalInv { rkey: wkey2 }, vec![])).unwrap();
    let c = wait(&b.cq, 1);
    assert_eq!((c[0].wr_id, c[0].status), (11, WcStatus::Success));
    assert_eq!((counter("mr_dereg_deferred"), counter("mr_dereg_pending"), counter("mr_deferred_freed")), (1, 0, 1));
    qa.post_send(&send_wr(3, SendOp::Write { remote: RemoteAddr { addr, rkey } }, vec![a.mr.sge(0, 8)])).unwrap();
    let c = wait(&a.cq, 1);
    assert_eq!((c[0].wr_id, c[0].status), (3, WcStatus::RemAccessErr), "WRITE into a freed region");
    drop(mw2);
}

/// Shared case (in-memory hub and veth).
pub fn type2_window_bound_by_wr_and_invalidated_by_send() {
    let (mut a, qa, b, qb) = rc_pair(Impairments::default(), 65536);
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    // b binds the window on its own QP with a BIND_MW work request
    let new_key = 0x5a;
    qb.post_send(&SendWr {
        wr_id: 10,
        op: SendOp::BindMw { mw_rkey: mw.rkey(), new_key, mr_lkey: b.mr.lkey(), addr: b.mr.addr(), length: 8192, access: Access::REMOTE_WRITE },
        payload: Payload::Sgl(vec![]),
        flags: SendFlags::SIGNALED,
        ud: None,
    })
    .unwrap();
    let c = wait(&b.cq, 1);
    assert_eq!((c[0].status, c[0].opcode), (WcStatus::Success, WcOpcode::BindMw));
    let rkey = (mw.rkey() & !0xff) | new_key as u32;
    fill(&mut a.mr, 0, 64, 1);
    let remote = RemoteAddr { addr: b.mr.addr(), rkey };
    qa.post_send(&send_wr(1, SendOp::Write { remote }, vec![a.mr.sge(0, 64)])).unwrap();
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::Success);
    // a SEND with invalidate kills the window's rkey
    qb.post_recv(&RecvWr { wr_id: 2, sgl: vec![b.mr.sge(16384, 64)] }).unwrap();
    qa.post_send(&send_wr(3, SendOp::SendWithInv { rkey }, vec![a.mr.sge(0, 8)])).unwrap();
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::Success);
    let r = wait(&b.cq, 1);
    assert_eq!((r[0].status, r[0].invalidated_rkey), (WcStatus::Success, Some(rkey)));
    // now the window refuses access, and the target stays untouched
    let before = bytes(&b.mr, 0..64);
    fill(&mut a.mr, 0, 64, 200);
    qa.post_send(&send_wr(4, SendOp::Write { remote }, vec![a.mr.sge(0, 64)])).unwrap();
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::RemAccessErr);
    assert_eq!(bytes(&b.mr, 0..64), &before[..]);
}

/// Shared case (in-memory hub and veth).
pub fn many_threads_post_on_many_qps() {
    let (ca, cb) = devices(Impairments::default());
    let a = side(&ca, 4 * MIB);
    let b = side(&cb, 4 * MIB);
    let n_qps = 4;
    let mut pairs = Vec::new();
    for i in 0..n_qps {
        let qa = rc_qp(&a, None);
        let qb = rc_qp(&b, None);
        bring_up(&qa, &ca, qb.qp_num(), &cb, 10 * i, 20 * i);
        bring_up(&qb, &cb, qa.qp_num(), &ca, 20 * i, 10 * i);
        pairs.push((qa, qb));
    }
    let per_thread = 300u64;
    let base = b.mr.addr();
    let rkey = b.mr.rkey();
    let sge_a = a.mr.sge(0, 1000);
    std::thread::scope(|s| {
        for (t, (qa, _)) in pairs.iter().enumerate() {
            s.spawn(move || {
                for k in 0..per_thread {
                    let off = ((t as u64 * per_thread + k) % 1000) * 4096;
                    let remote = RemoteAddr { addr: base + off, rkey };
                    loop {
                        match qa.post_send(&send_wr(t as u64 * 1_000_000 + k, SendOp::Write { remote }, vec![sge_a])) {
                            Ok(()) => break,
                            Err(e) if e.kind() == ErrorKind::NoResources => std::thread::yield_now(),
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
            });
        }
    });
    let c = wait(&a.cq, n_qps as usize * per_thread as usize);
    let failed: Vec<_> = c.iter().filter(|c| c.status != WcStatus::Success).collect();
    assert!(failed.is_empty(), "{} of {} failed, first {:?}; device a: {:?}", failed.len(), c.len(), failed.first(), a.ctx.counters());
    // per QP, completions arrive in posting order
    for (qa, _) in &pairs {
        let ids: Vec<u64> = c.iter().filter(|c| c.qp_num == qa.qp_num()).map(|c| c.wr_id % 1_000_000).collect();
        assert_eq!(ids, (0..per_thread).collect::<Vec<_>>());
    }
}

/// Shared case (in-memory hub and veth).
pub fn error_state_flushes_everything_once() {
    let (a, qa, b, qb) = rc_pair(Impairments::default(), 65536);
    for i in 0..5 {
        qb.post_recv(&RecvWr { wr_id: i, sgl: vec![b.mr.sge(0, 64)] }).unwrap();
    }
    let at = QpAttr { qp_state: QpState::Err, ..QpAttr::default() };
    qb.modify(&at, QpAttrMask::STATE).unwrap();
    let r = wait(&b.cq, 5);
    assert!(r.iter().all(|c| c.status == WcStatus::WrFlushErr));
    assert_eq!(r.iter().map(|c| c.wr_id).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
    // posting in ERR completes with a flush error, never silently
    qb.post_recv(&RecvWr { wr_id: 9, sgl: vec![] }).unwrap();
    assert_eq!(wait(&b.cq, 1)[0].status, WcStatus::WrFlushErr);
    assert_quiet(&b.cq);
    let _ = (a, qa);
}

/// Shared case (in-memory hub and veth).
pub fn bad_arguments_are_refused_without_queueing() {
    let (a, qa, b, _qb) = rc_pair(Impairments::default(), 65536);
    let remote = RemoteAddr { addr: b.mr.addr(), rkey: b.mr.rkey() };
    let bad_lkey = Sge { addr: a.mr.addr(), length: 8, lkey: a.mr.lkey() ^ 0x100 };
    assert_eq!(qa.post_send(&send_wr(1, SendOp::Write { remote }, vec![bad_lkey])).unwrap_err().kind(), ErrorKind::InvalidArgument);
    // Each refusal is EINVAL for the reason given (the message says which).
    let refused = |r: urnic::Result<()>, why: &str| {
        let e = r.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{why}: {e}");
        assert!(e.message().contains(why), "expected '{why}', got: {e}");
    };
    let oob = Sge { addr: a.mr.addr() + 65530, length: 16, lkey: a.mr.lkey() };
    refused(qa.post_send(&send_wr(2, SendOp::Write { remote }, vec![oob])), "lies outside the region");
    let too_many = vec![a.mr.sge(0, 1); 5];
    refused(qa.post_send(&send_wr(3, SendOp::Write { remote }, too_many)), "5 SGEs > max_send_sge 4");
    let big_inline = SendWr { payload: Payload::Inline(vec![0; 300]), ..send_wr(4, SendOp::Send, vec![]) };
    refused(qa.post_send(&big_inline), "300 inline bytes > max_inline_data 256");
    let unaligned = RemoteAddr { addr: b.mr.addr() + 4, rkey: b.mr.rkey() };
    refused(qa.post_send(&send_wr(5, SendOp::FetchAdd { remote: unaligned, add: 1 }, vec![a.mr.sge(0, 8)])), "not 8-byte aligned");
    // another PD's key
    let pd2 = a.ctx.alloc_pd().unwrap();
    let mr2 = pd2.alloc_mr(4096, ALL).unwrap();
    refused(qa.post_send(&send_wr(6, SendOp::Write { remote }, vec![mr2.sge(0, 8)])), "belongs to another protection domain");
    // a QP in INIT refuses sends
    let q = rc_qp(&a, None);
    assert_eq!(q.post_send(&send_wr(7, SendOp::Send, vec![])).unwrap_err().kind(), ErrorKind::InvalidState);
    // nothing was queued: nothing completes
    assert_quiet(&a.cq);
}

/// Shared case (in-memory hub and veth).
pub fn completion_channel_wakes_a_waiter_and_cq_resize_keeps_entries() {
    let (ca, cb) = devices(Impairments::default());
    let ch = ca.create_comp_channel().unwrap();
    let a = side(&ca, 65536);
    let b = side(&cb, 65536);
    let cq = ca.create_cq(4, Some(&ch)).unwrap();
    let qa = a.pd.create_qp(&QpInit { qp_type: QpType::Rc, send_cq: &cq, recv_cq: &cq, srq: None, cap: caps(), sq_sig_all: true }).unwrap();
    let qb = rc_qp(&b, None);
    bring_up(&qa, &ca, qb.qp_num(), &cb, 1, 2);
    bring_up(&qb, &cb, qa.qp_num(), &ca, 2, 1);
    cq.req_notify(false);
    let remote = RemoteAddr { addr: b.mr.addr(), rkey: b.mr.rkey() };
    qa.post_send(&send_wr(1, SendOp::Write { remote }, vec![a.mr.sge(0, 8)])).unwrap();
    assert_eq!(ch.get_cq_event().unwrap(), cq.id(), "the armed CQ signalled its channel");
    // Three more completions, then grow the CQ with them waiting.
    for i in 2..5 {
        qa.post_send(&send_wr(i, SendOp::Write { remote }, vec![a.mr.sge(0, 8)])).unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while cq.capacity() == 4 && std::time::Instant::now() < deadline {
        // wait until all 4 are in the ring (1 from before + 3)
        if a.ctx.nic().stats.completions.load(std::sync::atomic::Ordering::Relaxed) >= 4 {
            break;
        }
        std::thread::yield_now();
    }
    let e = cq.resize(2).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "4 waiting completions do not fit 2: {e}");
    assert!(e.message().contains("4 completions are waiting"), "{e}");
    cq.resize(64).unwrap();
    assert_eq!(cq.capacity(), 64);
    let c = wait(&cq, 4);
    assert_eq!(c.iter().map(|c| c.wr_id).collect::<Vec<_>>(), vec![1, 2, 3, 4]);
}

/// Shared case (in-memory hub and veth).
pub fn uc_write_and_send() {
    let (ca, cb) = devices(Impairments::default());
    let mut a = side(&ca, 1 << 20);
    let b = side(&cb, 1 << 20);
    let mk =
        |s: &Side| s.pd.create_qp(&QpInit { qp_type: QpType::Uc, send_cq: &s.cq, recv_cq: &s.cq, srq: None, cap: caps(), sq_sig_all: true }).unwrap();
    let (qa, qb) = (mk(&a), mk(&b));
    for (qp, me, peer, remote_qpn, sq, rq) in [(&qa, &ca, &cb, qb.qp_num(), 10, 20), (&qb, &cb, &ca, qa.qp_num(), 20, 10)] {
        let mut at = QpAttr { qp_state: QpState::Init, qp_access_flags: Access::REMOTE_WRITE, ..QpAttr::default() };
        qp.modify(&at, QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS).unwrap();
        at.qp_state = QpState::Rtr;
        at.path_mtu = me.query_port(1).unwrap().active_mtu;
        at.dest_qp_num = remote_qpn;
        at.rq_psn = Psn::new(rq);
        at.ah_attr = Some(AhAttr { dgid: peer.query_gid(1, 1).unwrap(), sgid_index: 1, port_num: 1, ..AhAttr::default() });
        qp.modify(&at, QpAttrMask::STATE | QpAttrMask::AV | QpAttrMask::PATH_MTU | QpAttrMask::DEST_QPN | QpAttrMask::RQ_PSN).unwrap();
        at.qp_state = QpState::Rts;
        at.sq_psn = Psn::new(sq);
        qp.modify(&at, QpAttrMask::STATE | QpAttrMask::SQ_PSN).unwrap();
    }
    // UC refuses READ/atomics at post time
    let remote = RemoteAddr { addr: b.mr.addr(), rkey: b.mr.rkey() };
    let e = qa.post_send(&send_wr(0, SendOp::Read { remote }, vec![a.mr.sge(0, 8)])).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.message().contains("not allowed on a UC QP"), "{e}");
    fill(&mut a.mr, 0, 5000, 11);
    qa.post_send(&send_wr(1, SendOp::Write { remote }, vec![a.mr.sge(0, 5000)])).unwrap();
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::Success, "UC completes on transmission");
    qb.post_recv(&RecvWr { wr_id: 9, sgl: vec![b.mr.sge(65536, 8192)] }).unwrap();
    qa.post_send(&send_wr(2, SendOp::SendWithImm { imm: 5 }, vec![a.mr.sge(0, 3000)])).unwrap();
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::Success);
    let r = wait(&b.cq, 1);
    assert_eq!((r[0].wr_id, r[0].byte_len, r[0].imm_data), (9, 3000, Some(5)));
    assert_eq!(bytes(&b.mr, 0..5000), &expected(5000, 11)[..]);
    assert_eq!(bytes(&b.mr, 65536..65536 + 3000), &expected(3000, 11)[..]);
}

/// `err` is the refusal of a post into a full queue: ENOMEM, nothing queued.
fn assert_full(r: urnic::Result<()>, what: &str) {
    let e = r.expect_err(what);
    assert_eq!((e.kind(), e.errno()), (ErrorKind::NoResources, libc::ENOMEM), "{what}: {e}");
}

/// Exactly `n` completions from `cq` (polled at most `n` at a time; a hang
/// is a failure after the same generous deadline as [`wait`]).
fn take(cq: &Cq, n: usize) -> Vec<WorkCompletion> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let mut out = vec![WorkCompletion::default(); n];
    let mut got = 0;
    while got < n {
        let k = cq.poll(&mut out[got..]).unwrap();
        got += k;
        if k == 0 {
            assert!(std::time::Instant::now() < deadline, "only {got} of {n} completions arrived: {:?}", &out[..got]);
            std::thread::yield_now();
        }
    }
    out
}

/// Run a poll of `qpn`'s shard from this thread: every WR posted before is
/// then in the engine (the drain takes the whole ring under the engine lock).
fn drained(ctx: &Context, qpn: u32) {
    let nic = ctx.nic();
    nic.poll_shard(nic.shard_of(qpn));
}

/// Shared case: a work queue holds at most its depth of WRs not yet retired —
/// those the datapath took out of its ring and the engine holds included — and
/// a post beyond it is refused at once with ENOMEM (ibv_post_send(3); rxe
/// `post_one_send`/`post_one_recv`: a full queue is -ENOMEM), never accepted
/// only to complete with an error later; a completion polled frees its slot
/// for the next post. Send queue, receive queue and SRQ.
pub fn a_full_queue_refuses_posts_at_once() {
    let (ca, cb) = devices(Impairments::default());
    let a = side(&ca, 65536);
    let b = side(&cb, 65536);
    let cap = QpCaps { max_send_wr: 4, max_recv_wr: 2, ..caps() };
    let qp = |s: &Side, srq: Option<&Srq>| {
        s.pd.create_qp(&QpInit { qp_type: QpType::Rc, send_cq: &s.cq, recv_cq: &s.cq, srq, cap, sq_sig_all: false }).unwrap()
    };
    let remote = RemoteAddr { addr: b.mr.addr(), rkey: b.mr.rkey() };
    let write = |id| send_wr(id, SendOp::Write { remote }, vec![a.mr.sge(0, 64)]);
    let recv = |id| RecvWr { wr_id: id, sgl: vec![b.mr.sge(0, 64)] };
    let (qa, qb) = (qp(&a, None), qp(&b, None));
    bring_up(&qa, &ca, qb.qp_num(), &cb, 1, 2);
    bring_up(&qb, &cb, qa.qp_num(), &ca, 2, 1);

    // A receive queue of two (`post` into it, `id` its shard's QP or SRQ):
    // two fit; a third is refused while the engine holds both; a message
    // takes one, and once its completion is polled one post fits again.
    let receive_bound = |post: &dyn Fn(u64) -> urnic::Result<()>, id: u32, sender: &Qp, what: &str| {
        post(100).unwrap();
        post(101).unwrap();
        drained(&cb, id);
        assert_full(post(102), &format!("a third receive into {what} of two"));
        sender.post_send(&send_wr(1, SendOp::Send, vec![a.mr.sge(0, 8)])).unwrap();
        assert_eq!(take(&b.cq, 1).iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), [(100, WcStatus::Success)], "{what}");
        post(103).unwrap();
        assert_full(post(104), &format!("the freed slot of {what} taken again"));
        assert_eq!(take(&a.cq, 1)[0].status, WcStatus::Success);
    };
    receive_bound(&|id| qb.post_recv(&recv(id)), qb.qp_num(), &qa, "a receive queue");

    // Send queue, every WR signalled. An application that keeps fewer than
    // four WRs unpolled (as perftest counts) is never refused: a slot is free
    // before its completion can be polled. Beyond that a post may be refused
    // (ENOMEM, the queue full), never accepted into a fifth slot.
    let (mut posted, mut polled) = (0u64, 0u64);
    while posted < 1200 {
        let r = qa.post_send(&write(10 + posted));
        if posted - polled < 4 {
            r.unwrap_or_else(|e| panic!("a post with {} WRs unpolled: {e}", posted - polled));
            posted += 1;
            continue;
        }
        match r {
            Ok(()) => posted += 1,
            Err(e) => {
                assert_full(Err(e), "a fifth WRITE outstanding");
                let c = take(&a.cq, 1)[0];
                assert_eq!((c.wr_id, c.status), (10 + polled, WcStatus::Success), "in order, once");
                polled += 1;
            }
        }
    }
    for (i, c) in take(&a.cq, (posted - polled) as usize).iter().enumerate() {
        assert_eq!((c.wr_id, c.status), (10 + polled + i as u64, WcStatus::Success), "in order, once");
    }

    // WRs taken by the engine and still in flight hold their slots: a QP
    // whose peer never answers (no QP there; a 4.3 s ACK timeout) takes
    // four WRITEs and refuses a fifth; moving it to ERR flushes the four
    // and frees their slots.
    let qd = qp(&a, None);
    bring_up_with_timeout(&qd, &ca, 0xabcde, &cb, 1, 2, 20);
    for id in 1..=4 {
        qd.post_send(&write(id)).unwrap();
    }
    drained(&ca, qd.qp_num());
    assert_full(qd.post_send(&write(5)), "a fifth WRITE while four are in flight");
    qd.modify(&QpAttr { qp_state: QpState::Err, ..QpAttr::default() }, QpAttrMask::STATE).unwrap();
    let flushed = wait(&a.cq, 4);
    assert_eq!(flushed.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), (1..=4).map(|i| (i, WcStatus::WrFlushErr)).collect::<Vec<_>>());
    qd.post_send(&write(6)).unwrap();
    assert_eq!(wait(&a.cq, 1)[0].wr_id, 6);

    // SRQ of two: the same bound.
    let srq = b.pd.create_srq(2, 1).unwrap();
    let (qs, qt) = (qp(&b, Some(&srq)), qp(&a, None));
    bring_up(&qs, &cb, qt.qp_num(), &ca, 3, 4);
    bring_up(&qt, &ca, qs.qp_num(), &cb, 4, 3);
    receive_bound(&|id| srq.post_recv(&recv(id)), srq.id(), &qt, "an SRQ");
    assert_eq!(ca.nic().stats.posts_refused.load(std::sync::atomic::Ordering::Relaxed), 0, "no WR was accepted and refused later");
    assert_eq!(cb.nic().stats.posts_refused.load(std::sync::atomic::Ordering::Relaxed), 0);
}
