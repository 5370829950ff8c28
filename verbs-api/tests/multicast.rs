//! `Qp::attach_mcast` / `detach_mcast` arguments and the device's limits
//! (`DeviceLimits::max_mcast_*`, reported as `ibv_query_device` does) on an
//! in-memory device: the errors an RDMA user gets and their errno (rxe's).
//! Delivery over a real link: loopback-test's `veth_multicast`.

mod common;

use common::*;
use urnic::*;

fn group(x: u8) -> Gid {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&[239, 0, 0, x]);
    g
}

fn ud(s: &Side) -> Qp {
    s.pd.create_qp(&QpInit { qp_type: QpType::Ud, send_cq: &s.cq, recv_cq: &s.cq, srq: None, cap: caps(), sq_sig_all: true }).unwrap()
}

#[test]
fn attach_limits_are_enforced_with_clear_errors() {
    let hub = MemHub::new(3);
    let mut cfg = DeviceConfig::memory(&hub, "urnic0", MAC_A, [10, 0, 0, 1]);
    cfg.limits.max_mcast_grp = 2;
    cfg.limits.max_mcast_qp_attach = 2;
    cfg.limits.max_total_mcast_qp_attach = 3;
    let ctx = open_device(cfg).unwrap();
    assert_eq!(ctx.query_device().limits.max_mcast_qp_attach, 2);
    let s = side(&ctx, 4096);
    let (q1, q2, q3) = (ud(&s), ud(&s), ud(&s));
    let rc = rc_qp(&s, None);

    let e = rc.attach_mcast(&group(1)).unwrap_err();
    assert_eq!((e.kind(), e.errno()), (ErrorKind::InvalidArgument, libc::EINVAL), "{e}");
    assert!(e.to_string().contains("UD"), "{e}");
    let e = q1.attach_mcast(&ctx.query_gid(1, 1).unwrap()).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    assert!(e.to_string().contains("not a multicast GID"), "{e}");

    q1.attach_mcast(&group(1)).unwrap();
    q1.attach_mcast(&group(1)).unwrap();
    q2.attach_mcast(&group(1)).unwrap();
    let e = q3.attach_mcast(&group(1)).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "rxe: a full group is EINVAL ({e})");
    assert!(e.to_string().contains("max_mcast_qp_attach"), "{e}");
    q3.attach_mcast(&group(2)).unwrap();
    let e = q3.attach_mcast(&group(3)).unwrap_err();
    assert_eq!((e.kind(), e.errno()), (ErrorKind::NoResources, libc::ENOMEM), "rxe: no more groups is ENOMEM ({e})");
    assert!(e.to_string().contains("max_mcast_grp"), "{e}");
    let e = q2.attach_mcast(&group(2)).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    assert!(e.to_string().contains("max_total_mcast_qp_attach"), "{e}");

    // Detach frees room at once; destroying a QP detaches it.
    q1.detach_mcast(&group(1)).unwrap();
    assert_eq!(q1.detach_mcast(&group(1)).unwrap_err().errno(), libc::EINVAL, "not attached");
    q3.attach_mcast(&group(1)).unwrap();
    drop(q2);
    q1.attach_mcast(&group(1)).unwrap();
    assert_eq!(q1.mcast_groups(), vec![group(1)]);
    assert_eq!(q3.mcast_groups(), vec![group(2), group(1)]);
}
