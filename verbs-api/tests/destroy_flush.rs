//! Send WRs posted before a QP is destroyed leave before it goes, as on an
//! HCA (and rxe, whose `post_send` runs its requester at once): a program
//! that posts unsignaled UD sends and destroys the QP right away (Debian's
//! `mckey` sender does) has them on the wire. The sender's device runs no
//! datapath thread (`DatapathMode::Manual`), so only the destroy can send.

mod common;

use common::*;
use urnic::*;

#[test]
fn posted_ud_sends_leave_before_the_qp_is_destroyed() {
    let hub = MemHub::new(5);
    let mut cfg = DeviceConfig::memory(&hub, "urnic0", MAC_A, [10, 0, 0, 1]);
    cfg.datapath = DatapathMode::Manual;
    let a = open_device(cfg).unwrap();
    let mut cfg = DeviceConfig::memory(&hub, "urnic1", [2, 0, 0, 0, 0, 2], [10, 0, 0, 2]);
    cfg.datapath = DatapathMode::Thread { core: None, idle: IdlePolicy::default() };
    let b = open_device(cfg).unwrap();
    let (sa, sb) = (side(&a, 4096), side(&b, 16 * 4096));
    let (sender, receiver) = (ud_qp(&sa, 7), ud_qp(&sb, 7));
    for i in 0..8 {
        receiver.post_recv(&RecvWr { wr_id: i, sgl: vec![sb.mr.sge(i as usize * 4096, 4096)] }).unwrap();
    }
    let ah = sa.pd.create_ah(&AhAttr { dgid: b.query_gid(1, 1).unwrap(), sgid_index: 1, port_num: 1, ..AhAttr::default() }).unwrap();
    let dest = UdDest { av: *ah.address_vector(), remote_qpn: receiver.qp_num(), remote_qkey: 7 };
    for i in 0..8u8 {
        let payload = Payload::Inline(vec![i; 16]);
        sender.post_send(&SendWr { wr_id: u64::from(i), op: SendOp::Send, payload, flags: SendFlags::INLINE, ud: Some(dest) }).unwrap();
    }
    let src_qp = sender.qp_num();
    drop(sender);
    let wc = wait(&sb.cq, 8);
    for (i, w) in wc.iter().enumerate() {
        assert_eq!((w.status, w.src_qp, w.byte_len), (WcStatus::Success, src_qp, 40 + 16), "message {i}");
        assert_eq!(bytes(&sb.mr, i * 4096 + 40..i * 4096 + 56), vec![i as u8; 16], "message {i} in order");
    }
}
