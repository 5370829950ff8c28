//! Shared set-up for the verbs integration tests: two devices on an
//! in-memory hub, RC/UD QPs brought up as an application would.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use urnic::*;

pub struct Side {
    pub ctx: Context,
    pub pd: Pd,
    pub cq: Cq,
    pub mr: Mr,
}

pub const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 1];

/// Makes the two devices a case runs on.
pub type Fabric = fn(Impairments) -> (Context, Context);

static FABRIC: std::sync::OnceLock<Fabric> = std::sync::OnceLock::new();

/// Run this test binary's cases on `f` instead of the in-memory hub (the
/// veth suite in loopback-test sets its namespaces-and-AF_XDP fabric).
pub fn use_fabric(f: Fabric) {
    let _ = FABRIC.set(f);
}

/// Two devices that can reach each other, on the binary's fabric.
pub fn devices(impair: Impairments) -> (Context, Context) {
    match FABRIC.get() {
        Some(f) => f(impair),
        None => devices_on(&MemHub::new(7), impair),
    }
}

pub fn devices_on(hub: &std::sync::Arc<MemHub>, impair: Impairments) -> (Context, Context) {
    let hub = hub.clone();
    let mut a = DeviceConfig::memory(&hub, "urnic0", MAC_A, [10, 0, 0, 1]);
    let mut b = DeviceConfig::memory(&hub, "urnic1", [2, 0, 0, 0, 0, 2], [10, 0, 0, 2]);
    if let PortConfig::Memory { impairments, .. } = &mut a.port {
        *impairments = impair;
    }
    if let PortConfig::Memory { impairments, .. } = &mut b.port {
        *impairments = impair;
    }
    a.datapath = DatapathMode::Thread { core: None, idle: IdlePolicy::default() };
    b.datapath = DatapathMode::Thread { core: None, idle: IdlePolicy::default() };
    (open_device(a).unwrap(), open_device(b).unwrap())
}

pub const ALL: Access =
    Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ).union(Access::REMOTE_ATOMIC).union(Access::MW_BIND);

pub fn side(ctx: &Context, buf: usize) -> Side {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4096, None).unwrap();
    let mr = pd.alloc_mr(buf, ALL).unwrap();
    Side { ctx: ctx.clone(), pd, cq, mr }
}

pub fn caps() -> QpCaps {
    QpCaps { max_send_wr: 512, max_recv_wr: 512, max_send_sge: 4, max_recv_sge: 4, max_inline_data: 256 }
}

pub fn rc_qp(s: &Side, srq: Option<&Srq>) -> Qp {
    s.pd.create_qp(&QpInit { qp_type: QpType::Rc, send_cq: &s.cq, recv_cq: &s.cq, srq, cap: caps(), sq_sig_all: false }).unwrap()
}

/// Connect with ACK timeout 14 (67 ms, perftest's default): with 7 retries a
/// QP outlasts half a second without its peer's datapath thread running,
/// which a loaded 2-core machine (CI's qemu guests) does produce; timeout
/// 10 (4 ms) ran out of retries there.
pub fn bring_up(qp: &Qp, local: &Context, remote_qpn: u32, remote: &Context, lpsn: u32, rpsn: u32) {
    bring_up_with_timeout(qp, local, remote_qpn, remote, lpsn, rpsn, 14)
}

/// `bring_up` with a chosen local ACK timeout exponent (4.096 µs × 2^timeout).
pub fn bring_up_with_timeout(qp: &Qp, local: &Context, remote_qpn: u32, remote: &Context, lpsn: u32, rpsn: u32, timeout: u8) {
    let _ = local;
    let c = Connect { timeout, min_rnr_timer: 1, ..Connect::new(remote_qpn, remote.query_gid(1, 1).unwrap(), lpsn, rpsn) };
    qp.connect(&c).unwrap();
}

/// A connected RC pair: (a side, a qp, b side, b qp).
pub fn rc_pair(impair: Impairments, buf: usize) -> (Side, Qp, Side, Qp) {
    let (ca, cb) = devices(impair);
    let a = side(&ca, buf);
    let b = side(&cb, buf);
    let qa = rc_qp(&a, None);
    let qb = rc_qp(&b, None);
    bring_up(&qa, &ca, qb.qp_num(), &cb, 100, 0xff_fff0);
    bring_up(&qb, &cb, qa.qp_num(), &ca, 0xff_fff0, 100);
    (a, qa, b, qb)
}

/// Poll `cq` until `n` completions arrived (generous deadline: a hang is a
/// failure, not a timing assertion).
pub fn wait(cq: &Cq, n: usize) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut out = Vec::new();
    let mut buf = vec![WorkCompletion::default(); 64];
    while out.len() < n {
        let k = cq.poll(&mut buf).unwrap();
        out.extend_from_slice(&buf[..k]);
        if k == 0 {
            assert!(Instant::now() < deadline, "only {} of {n} completions arrived: {out:?}", out.len());
            std::thread::yield_now();
        }
    }
    out
}

/// Assert no further completion shows up for a while.
pub fn assert_quiet(cq: &Cq) {
    std::thread::sleep(Duration::from_millis(50));
    let mut buf = vec![WorkCompletion::default(); 8];
    let k = cq.poll(&mut buf).unwrap();
    assert_eq!(k, 0, "unexpected completions: {:?}", &buf[..k]);
}

pub fn send_wr(id: u64, op: SendOp, sgl: Vec<Sge>) -> SendWr {
    SendWr { wr_id: id, op, payload: Payload::Sgl(sgl), flags: SendFlags::SIGNALED, ud: None }
}

pub fn fill(mr: &mut Mr, off: usize, len: usize, seed: u8) {
    mr.write_at(off, &expected(len, seed)).unwrap();
}

/// A copy of the region's bytes in `range` (`Mr::read_at`).
pub fn bytes(mr: &Mr, range: std::ops::Range<usize>) -> Vec<u8> {
    mr.read_vec(range.start, range.len()).unwrap()
}

pub fn expected(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| seed.wrapping_add((i % 251) as u8).wrapping_mul(3)).collect()
}

/// A UD QP on `s`'s CQ, moved INIT → RTR → RTS with `qkey`.
pub fn ud_qp(s: &Side, qkey: u32) -> Qp {
    let qp = s.pd.create_qp(&QpInit { qp_type: QpType::Ud, send_cq: &s.cq, recv_cq: &s.cq, srq: None, cap: caps(), sq_sig_all: true }).unwrap();
    let mut at = QpAttr { qp_state: QpState::Init, qkey, ..QpAttr::default() };
    qp.modify(&at, QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY).unwrap();
    at.qp_state = QpState::Rtr;
    qp.modify(&at, QpAttrMask::STATE).unwrap();
    at.qp_state = QpState::Rts;
    at.sq_psn = Psn::new(7);
    qp.modify(&at, QpAttrMask::STATE | QpAttrMask::SQ_PSN).unwrap();
    qp
}
