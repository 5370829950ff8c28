//! The RDMA-CM cases (`urnic::cm`), run on the in-memory hub by
//! verbs-api's tests/cm.rs and over veth and AF_XDP by loopback-test's
//! veth_cm.rs: each connection moves data both ways after the CM brought
//! its QPs up, and is released on both sides.

use super::common::*;

use std::net::SocketAddr;
use std::time::Duration;

use urnic::cm::{CmChannel, CmEvent, ConnParam, PortSpace};
use urnic::*;

const PORT: u16 = 7174;

/// The next event (a hang fails after a generous deadline, not a timing check).
fn next(ch: &CmChannel) -> CmEvent {
    for _ in 0..120 {
        if let Some(ev) = ch.get_event(Some(Duration::from_secs(1))).unwrap() {
            return ev;
        }
    }
    panic!("no CM event within 120 s");
}

fn addr(ctx: &Context) -> SocketAddr {
    let g = ctx.query_gid(1, 1).unwrap();
    SocketAddr::new(std::net::Ipv4Addr::new(g[12], g[13], g[14], g[15]).into(), PORT)
}

/// Post a receive on `qp` for `len` bytes at `off` of `s.mr`.
fn post_recv(s: &Side, qp: &Qp, id: u64, off: usize, len: u32) {
    qp.post_recv(&RecvWr { wr_id: id, sgl: vec![s.mr.sge(off, len)] }).unwrap();
}

fn send(s: &mut Side, qp: &Qp, id: u64, off: usize, len: usize, seed: u8) {
    fill(&mut s.mr, off, len, seed);
    qp.post_send(&send_wr(id, SendOp::Send, vec![s.mr.sge(off, len as u32)])).unwrap();
}

/// Connect `a` to `b` through the CM; returns both QPs and ids, established.
fn connect(chs: (&CmChannel, &CmChannel), sides: (&Side, &Side), private: &[u8]) -> (Qp, Qp, u32, u32) {
    let (cha, chb) = chs;
    let (a, b) = sides;
    let qa = rc_qp(a, None);
    let qb = rc_qp(b, None);
    let ia = cha.connect(&qa, addr(&b.ctx), &ConnParam { private_data: private.to_vec(), ..ConnParam::default() }).unwrap();
    let CmEvent::ConnectRequest(req) = next(chb) else { panic!("expected a connect request") };
    assert_eq!(req.dst, addr(&b.ctx));
    assert_eq!(req.src.ip(), addr(&a.ctx).ip());
    assert_eq!(&req.private_data[..private.len()], private);
    assert_eq!(req.remote_qpn, qa.qp_num());
    if let Some(e) = cha.get_event(None).unwrap() {
        panic!("unexpected {e:?}");
    }
    chb.accept(&req, &qb, &ConnParam { private_data: b"welcome".to_vec(), ..ConnParam::default() }).unwrap();
    let CmEvent::ConnectResponse(rep) = next(cha) else { panic!("expected the connect response") };
    assert_eq!(&rep.private_data[..7], b"welcome");
    assert_eq!(rep.remote_qpn, qb.qp_num());
    cha.complete_connect(&rep, &qa).unwrap();
    assert_eq!(next(cha), CmEvent::Established { id: ia });
    let ib = req.id;
    assert_eq!(next(chb), CmEvent::Established { id: ib });
    assert_eq!(qa.query().unwrap().qp_state, QpState::Rts);
    assert_eq!(qb.query().unwrap().qp_state, QpState::Rts);
    assert_eq!(qa.query().unwrap().dest_qp_num, qb.qp_num());
    (qa, qb, ia, ib)
}

fn exchange(a: &mut Side, qa: &Qp, b: &mut Side, qb: &Qp) {
    post_recv(b, qb, 1, 4096, 4096);
    post_recv(a, qa, 2, 4096, 4096);
    send(a, qa, 10, 0, 3000, 1);
    send(b, qb, 20, 0, 2000, 2);
    let wa = wait(&a.cq, 2);
    let wb = wait(&b.cq, 2);
    for w in wa.iter().chain(&wb) {
        assert_eq!(w.status, WcStatus::Success, "{w:?}");
    }
    assert_eq!(bytes(&b.mr, 4096..4096 + 3000), expected(3000, 1));
    assert_eq!(bytes(&a.mr, 4096..4096 + 2000), expected(2000, 2));
    // A READ: the READ depth the CM negotiated (1 each way) works.
    fill(&mut b.mr, 16384, 512, 9);
    let wr = SendWr {
        wr_id: 30,
        op: SendOp::Read { remote: RemoteAddr { addr: b.mr.addr() + 16384, rkey: b.mr.rkey() } },
        payload: Payload::Sgl(vec![a.mr.sge(20000, 512)]),
        flags: SendFlags::SIGNALED,
        ud: None,
    };
    qa.post_send(&wr).unwrap();
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::Success);
    assert_eq!(bytes(&a.mr, 20000..20512), expected(512, 9));
}

fn release(chs: (&CmChannel, &CmChannel), qps: (&Qp, &Qp), ids: (u32, u32)) {
    let (cha, chb) = chs;
    cha.disconnect(ids.0, Some(qps.0)).unwrap();
    assert_eq!(next(chb), CmEvent::Disconnected { id: ids.1 });
    chb.disconnect(ids.1, Some(qps.1)).unwrap();
    assert_eq!(next(cha), CmEvent::Disconnected { id: ids.0 });
    assert_eq!(qps.0.query().unwrap().qp_state, QpState::Err);
    assert_eq!(qps.1.query().unwrap().qp_state, QpState::Err);
    // Both ids leave timewait (1 s).
    let mut exits = vec![next(cha), next(chb)];
    exits.sort_by_key(|e| format!("{e:?}"));
    let mut want = vec![CmEvent::TimewaitExit { id: ids.0 }, CmEvent::TimewaitExit { id: ids.1 }];
    want.sort_by_key(|e| format!("{e:?}"));
    assert_eq!(exits, want);
}

pub fn connect_move_data_disconnect() {
    let (ca, cb) = devices(Impairments::default());
    let (mut a, mut b) = (side(&ca, 1 << 16), side(&cb, 1 << 16));
    let (cha, chb) = (CmChannel::new(&ca).unwrap(), CmChannel::new(&cb).unwrap());
    chb.listen(PortSpace::Tcp, PORT, 8).unwrap();
    let (qa, qb, ia, ib) = connect((&cha, &chb), (&a, &b), b"hello from a");
    exchange(&mut a, &qa, &mut b, &qb);
    release((&cha, &chb), (&qa, &qb), (ia, ib));
    // A second connection on the same listener after the first is gone.
    let (qa, qb, ia, ib) = connect((&cha, &chb), (&a, &b), b"again");
    exchange(&mut a, &qa, &mut b, &qb);
    release((&cha, &chb), (&qa, &qb), (ia, ib));
}

pub fn reject_and_no_listener() {
    let (ca, cb) = devices(Impairments::default());
    let (a, b) = (side(&ca, 4096), side(&cb, 4096));
    let (cha, chb) = (CmChannel::new(&ca).unwrap(), CmChannel::new(&cb).unwrap());
    // Nobody listens: REJ reason 8, invalid service ID.
    let qa = rc_qp(&a, None);
    let id = cha.connect(&qa, addr(&cb), &ConnParam::default()).unwrap();
    let CmEvent::Rejected { id: rid, reason, .. } = next(&cha) else { panic!("expected a reject") };
    assert_eq!((rid, reason), (id, 8));
    // The consumer rejects, with private data.
    chb.listen(PortSpace::Tcp, PORT, 8).unwrap();
    assert_eq!(chb.listen(PortSpace::Tcp, PORT, 8).unwrap_err().kind(), ErrorKind::Busy);
    let qa = rc_qp(&a, None);
    let id = cha.connect(&qa, addr(&cb), &ConnParam::default()).unwrap();
    let CmEvent::ConnectRequest(req) = next(&chb) else { panic!("expected a connect request") };
    chb.reject(req.id, b"not today").unwrap();
    let CmEvent::Rejected { id: rid, reason, private_data } = next(&cha) else { panic!("expected a reject") };
    assert_eq!((rid, reason, &private_data[..9]), (id, 28, &b"not today"[..]));
    // Bad arguments.
    let big = ConnParam { private_data: vec![0; 57], ..ConnParam::default() };
    assert_eq!(cha.connect(&qa, addr(&cb), &big).unwrap_err().kind(), ErrorKind::InvalidArgument);
    drop(b);
}

pub fn a_device_connects_to_itself() {
    let (ca, _cb) = devices(Impairments::default());
    let (mut a, mut b) = (side(&ca, 1 << 16), side(&ca, 1 << 16));
    let ch = CmChannel::new(&ca).unwrap();
    ch.listen(PortSpace::Tcp, PORT, 8).unwrap();
    let qa = rc_qp(&a, None);
    let qb = rc_qp(&b, None);
    let ia = ch.connect(&qa, addr(&ca), &ConnParam::default()).unwrap();
    let CmEvent::ConnectRequest(req) = next(&ch) else { panic!("expected a connect request") };
    ch.accept(&req, &qb, &ConnParam::default()).unwrap();
    let CmEvent::ConnectResponse(rep) = next(&ch) else { panic!("expected the connect response") };
    ch.complete_connect(&rep, &qa).unwrap();
    let mut est = vec![next(&ch), next(&ch)];
    est.sort_by_key(|e| format!("{e:?}"));
    let mut want = vec![CmEvent::Established { id: ia }, CmEvent::Established { id: req.id }];
    want.sort_by_key(|e| format!("{e:?}"));
    assert_eq!(est, want);
    exchange(&mut a, &qa, &mut b, &qb);
    ch.disconnect(ia, Some(&qa)).unwrap();
    assert_eq!(next(&ch), CmEvent::Disconnected { id: req.id });
    ch.disconnect(req.id, Some(&qb)).unwrap();
    assert_eq!(next(&ch), CmEvent::Disconnected { id: ia });
}

/// A UD QP in RTS with RDMA-CM's Q_Key, as `rdma_create_qp` leaves one.
fn cm_ud_qp(s: &Side) -> Qp {
    let qp = s.pd.create_qp(&QpInit { qp_type: QpType::Ud, send_cq: &s.cq, recv_cq: &s.cq, srq: None, cap: caps(), sq_sig_all: true }).unwrap();
    let mut at = QpAttr { qp_state: QpState::Init, qkey: rocev2::cm::cma::RDMA_UDP_QKEY, ..QpAttr::default() };
    qp.modify(&at, QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY).unwrap();
    at.qp_state = QpState::Rtr;
    qp.modify(&at, QpAttrMask::STATE).unwrap();
    at.qp_state = QpState::Rts;
    qp.modify(&at, QpAttrMask::STATE | QpAttrMask::SQ_PSN).unwrap();
    qp
}

/// UD ids (`RDMA_PS_UDP`): a SIDR_REQ resolves the listener's UD QPN and
/// Q_Key (with private data both ways), a datagram goes through an AH made
/// from what the resolution reported; a rejected resolution and one
/// without listener come back as Rejected with the SIDR status (2, 1).
pub fn ud_resolution_through_sidr() {
    let (ca, cb) = devices(Impairments::default());
    let (mut a, b) = (side(&ca, 1 << 16), side(&cb, 1 << 16));
    let (cha, chb) = (CmChannel::new(&ca).unwrap(), CmChannel::new(&cb).unwrap());
    chb.listen(PortSpace::Udp, PORT, 8).unwrap();
    let (qa, qb) = (cm_ud_qp(&a), cm_ud_qp(&b));
    let ia = cha.resolve_ud(Some(40000), addr(&b.ctx), b"who is there").unwrap();
    let CmEvent::UdRequest(req) = next(&chb) else { panic!("expected a UD request") };
    assert_eq!(req.dst, addr(&b.ctx));
    assert_eq!(req.src, SocketAddr::new(addr(&a.ctx).ip(), 40000));
    assert_eq!(&req.private_data[..12], b"who is there");
    chb.accept_ud(&req, qb.qp_num(), rocev2::cm::cma::RDMA_UDP_QKEY, b"me").unwrap();
    let CmEvent::UdResolved(r) = next(&cha) else { panic!("expected the UD resolution") };
    assert_eq!((r.id, r.qpn, r.qkey), (ia, qb.qp_num(), rocev2::cm::cma::RDMA_UDP_QKEY));
    assert_eq!(&r.private_data[..2], b"me");
    assert_eq!(r.ah.dgid, b.ctx.query_gid(1, 1).unwrap());
    // A datagram through what the resolution reported.
    post_recv(&b, &qb, 5, 0, 40 + 1024);
    let ah = a.pd.create_ah(&r.ah).unwrap();
    fill(&mut a.mr, 0, 256, 4);
    let wr = SendWr {
        wr_id: 6,
        op: SendOp::Send,
        payload: Payload::Sgl(vec![a.mr.sge(0, 256)]),
        flags: SendFlags::SIGNALED,
        ud: Some(UdDest { av: *ah.address_vector(), remote_qpn: r.qpn, remote_qkey: r.qkey }),
    };
    qa.post_send(&wr).unwrap();
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::Success);
    let w = wait(&b.cq, 1);
    assert_eq!((w[0].status, w[0].byte_len, w[0].src_qp), (WcStatus::Success, 256 + 40, qa.qp_num()));
    assert_eq!(bytes(&b.mr, 40..296), expected(256, 4));
    // Rejected by the listener: SIDR status 2.
    let ib = cha.resolve_ud(None, addr(&b.ctx), &[]).unwrap();
    let CmEvent::UdRequest(req) = next(&chb) else { panic!("expected a UD request") };
    chb.reject_ud(req.id, b"no").unwrap();
    match next(&cha) {
        CmEvent::Rejected { id, reason, .. } => assert_eq!((id, reason), (ib, u16::from(rocev2::cm::msg::sidr_status::REJECTED))),
        e => panic!("expected Rejected, got {e:?}"),
    }
    // Nobody listens on the port: SIDR status 1.
    let mut other = addr(&b.ctx);
    other.set_port(PORT + 1);
    let ic = cha.resolve_ud(None, other, &[]).unwrap();
    match next(&cha) {
        CmEvent::Rejected { id, reason, .. } => assert_eq!((id, reason), (ic, u16::from(rocev2::cm::msg::sidr_status::SID_NOT_SUPPORTED))),
        e => panic!("expected Rejected, got {e:?}"),
    }
    // Private data over the SIDR_REQ's room is refused before sending.
    let big = vec![0u8; urnic::cm::MAX_UD_PRIVATE_DATA + 1];
    assert_eq!(cha.resolve_ud(None, addr(&b.ctx), &big).unwrap_err().kind(), ErrorKind::InvalidArgument);
}
