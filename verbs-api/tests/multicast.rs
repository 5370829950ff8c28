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

/// RDMA-CM's join in the Rust API (`CmChannel::join_multicast`, what
/// `rdma_join_multicast` does on RoCE): the group's GID, address vector,
/// QPN and Q_Key; a member's QP attached, a send-only join's not; a send
/// to the group from the other device reaches the member; leave detaches.
#[test]
fn rdma_cm_join_gives_the_group_and_attaches_the_member() {
    use urnic::cm::{CmChannel, MCAST_QPN};
    let (a, b) = devices_on(&MemHub::new(3), Impairments::default());
    let (ch_a, ch_b) = (CmChannel::new(&a).unwrap(), CmChannel::new(&b).unwrap());
    let (sa, sb) = (side(&a, 4096), side(&b, 4096));
    let (sender, member) = (ud_qp(&sa, rocev2::cm::RDMA_UDP_QKEY), ud_qp(&sb, rocev2::cm::RDMA_UDP_QKEY));
    let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();

    let e = ch_b.join_multicast(ip("10.0.0.9"), ip("10.0.0.2"), Some(&member)).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "not a group: {e}");
    let e = ch_b.join_multicast(ip("239.0.0.3"), ip("10.0.0.1"), Some(&member)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "not our address: {e}");

    let g = ch_b.join_multicast(ip("239.0.0.3"), ip("10.0.0.2"), Some(&member)).unwrap();
    assert_eq!(g.gid, group(3));
    assert_eq!((g.qpn, g.qkey), (MCAST_QPN, 0x0123_4567));
    assert_eq!((g.ah.dgid, g.ah.sgid_index, g.ah.hop_limit, g.ah.port_num), (g.gid, 1, 64, 1));
    assert_eq!(member.mcast_groups(), vec![g.gid]);
    let to = ch_a.join_multicast(ip("239.0.0.3"), ip("0.0.0.0"), None).unwrap();
    assert_eq!((to.gid, to.ah.sgid_index), (g.gid, 1), "a send-only join from the wildcard: the IPv4 GID");
    assert!(sender.mcast_groups().is_empty(), "a send-only join attaches nothing");

    member.post_recv(&RecvWr { wr_id: 1, sgl: vec![sb.mr.sge(0, 4096)] }).unwrap();
    let ah = sa.pd.create_ah(&to.ah).unwrap();
    let dest = UdDest { av: *ah.address_vector(), remote_qpn: to.qpn, remote_qkey: to.qkey };
    let payload = Payload::Inline(b"to the group".to_vec());
    sender.post_send(&SendWr { wr_id: 2, op: SendOp::Send, payload, flags: SendFlags::SIGNALED | SendFlags::INLINE, ud: Some(dest) }).unwrap();
    let wc = wait(&sb.cq, 1);
    assert_eq!((wc[0].status, wc[0].src_qp, wc[0].byte_len), (WcStatus::Success, sender.qp_num(), 40 + 12));
    assert_eq!(bytes(&sb.mr, 40..52), b"to the group");

    ch_b.leave_multicast(&g, Some(&member)).unwrap();
    assert!(member.mcast_groups().is_empty());
    assert_eq!(ch_b.leave_multicast(&g, Some(&member)).unwrap_err().errno(), libc::EINVAL, "left already");
}
