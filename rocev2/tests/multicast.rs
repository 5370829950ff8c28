//! UD multicast in the sans-IO engine: a sender engine and a receiver
//! engine with several UD QPs attached to a group, frames carried by hand.
//! Delivery to every member (each its own completion), Q_Key per QP (IBTA
//! C10-15), detach stops delivery at once, no member → counted drop,
//! limits, and hostile frames (connected opcodes to the multicast QPN, another
//! partition, a member not ready to receive).

use rocev2::psn::Psn;
use rocev2::sim::pair::Mr;
use rocev2::time::Instant;
use rocev2::transport::attr::*;
use rocev2::transport::engine::{Engine, EngineConfig, EngineError};
use rocev2::transport::mcast::{multicast_mac, McastLimits, MULTICAST_QPN};
use rocev2::transport::memory::{Access, MemoryTable, PdId};
use rocev2::transport::wr::*;
use rocev2::wire::{parse_frame, Opcode};
use std::sync::Arc;

const PD: PdId = PdId(1);
const CQ: CqId = CqId(1);
const QKEY: u32 = 0x1111_0001;
const A_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const A_IP: [u8; 4] = [10, 0, 0, 1];
const B_IP: [u8; 4] = [10, 0, 0, 2];
const GROUP: [u8; 4] = [239, 1, 2, 3];
const SLOT: usize = 4096;

struct Host {
    engine: Engine,
    mr: Mr,
}

impl Host {
    fn new(first_qpn: u32, mcast: McastLimits) -> Host {
        let table = Arc::new(MemoryTable::new());
        let mr = Mr::new(&table, PD, 64 * SLOT, 0x10_0000, Access::LOCAL_WRITE).unwrap();
        Host { engine: Engine::new(EngineConfig { first_qpn, mcast, ..EngineConfig::default() }, table), mr }
    }

    fn qp(&mut self, qp_type: QpType, qkey: u32) -> u32 {
        let cap = QpCaps { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
        let init = QpInitAttr { qp_type, pd: PD, send_cq: CQ, recv_cq: CQ, srq: None, cap, sq_sig_all: true };
        let qpn = self.engine.create_qp(&init).unwrap();
        let e = &mut self.engine;
        let mut a = QpAttr { qp_state: QpState::Init, qkey, port_num: 1, ..QpAttr::default() };
        match qp_type {
            QpType::Ud => {
                e.modify_qp(qpn, &a, QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY).unwrap();
                a.qp_state = QpState::Rtr;
                e.modify_qp(qpn, &a, QpAttrMask::STATE).unwrap();
            }
            _ => {
                a.qp_access_flags = Access::empty();
                e.modify_qp(qpn, &a, QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS).unwrap();
                // A connected QP "to the group": its frames carry DestQP
                // 0xFFFFFF and the group's addresses (a forger's frames).
                a.qp_state = QpState::Rtr;
                a.path_mtu = Mtu::Mtu1024;
                a.dest_qp_num = MULTICAST_QPN;
                a.rq_psn = Psn::new(0);
                a.ah_attr = Some(group_av());
                let mut m = QpAttrMask::STATE | QpAttrMask::AV | QpAttrMask::PATH_MTU | QpAttrMask::DEST_QPN | QpAttrMask::RQ_PSN;
                if qp_type == QpType::Rc {
                    a.max_dest_rd_atomic = 1;
                    m |= QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER;
                }
                e.modify_qp(qpn, &a, m).unwrap();
                a.qp_state = QpState::Rts;
                let mut m = QpAttrMask::STATE | QpAttrMask::SQ_PSN;
                if qp_type == QpType::Rc {
                    a.timeout = 14;
                    a.retry_cnt = 7;
                    a.rnr_retry = 7;
                    a.max_rd_atomic = 1;
                    m |= QpAttrMask::TIMEOUT | QpAttrMask::RETRY_CNT | QpAttrMask::RNR_RETRY | QpAttrMask::MAX_QP_RD_ATOMIC;
                }
                e.modify_qp(qpn, &a, m).unwrap();
                return qpn;
            }
        }
        a.qp_state = QpState::Rts;
        e.modify_qp(qpn, &a, QpAttrMask::STATE | QpAttrMask::SQ_PSN).unwrap();
        qpn
    }

    /// Post one receive of a slot (GRH + payload) per QP.
    fn post_recv(&mut self, qpn: u32, slot: usize) {
        let sge = self.mr.sge(slot * SLOT, SLOT as u32);
        self.engine.post_recv(qpn, RecvWr { wr_id: slot as u64, sgl: vec![sge] }).unwrap();
    }

    fn frames(&mut self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 9000];
        while let Some(n) = self.engine.poll_transmit(Instant::ZERO, &mut buf) {
            out.push(buf[..n].to_vec());
        }
        out
    }

    fn completions(&mut self) -> Vec<WorkCompletion> {
        std::iter::from_fn(|| self.engine.poll_completion()).map(|c| c.wc).collect()
    }
}

fn group_gid() -> [u8; 16] {
    AddressVector::ipv4_gid(GROUP)
}

fn group_av() -> AddressVector {
    AddressVector {
        dmac: multicast_mac(&group_gid()).unwrap(),
        smac: A_MAC,
        vlan: None,
        sgid: AddressVector::ipv4_gid(A_IP),
        dgid: group_gid(),
        traffic_class: 0,
        hop_limit: 1,
        flow_label: 0,
        udp_sport: None,
    }
}

/// Send `data` from UD QP `qpn` of `a` to the group with `qkey`; the frames.
fn send_to_group(a: &mut Host, qpn: u32, qkey: u32, data: &[u8], wr_id: u64) -> Vec<Vec<u8>> {
    let ud = UdDest { av: group_av(), remote_qpn: MULTICAST_QPN, remote_qkey: qkey };
    let wr =
        SendWr { wr_id, op: SendOp::Send, payload: Payload::Inline(data.to_vec()), flags: SendFlags::SIGNALED | SendFlags::INLINE, ud: Some(ud) };
    a.engine.post_send(qpn, wr).unwrap();
    a.frames()
}

fn deliver(b: &mut Host, frames: &[Vec<u8>]) {
    for f in frames {
        b.engine.handle_frame(Instant::ZERO, f);
    }
}

#[test]
fn a_group_frame_reaches_every_attached_qp_with_its_own_completion() {
    let mut a = Host::new(0x20, McastLimits::default());
    let mut b = Host::new(0x40, McastLimits::default());
    let tx = a.qp(QpType::Ud, QKEY);
    let members: Vec<u32> = (0..3).map(|_| b.qp(QpType::Ud, QKEY)).collect();
    let outsider = b.qp(QpType::Ud, QKEY);
    for (i, &q) in members.iter().enumerate() {
        assert_eq!(b.engine.attach_mcast(q, group_gid()), Ok(true));
        b.post_recv(q, i);
    }
    b.post_recv(outsider, 10);

    let frames = send_to_group(&mut a, tx, QKEY, b"hello group", 7);
    assert_eq!(frames.len(), 1);
    // On the wire: the group's MAC and IP, DestQP 0xFFFFFF, our TTL.
    let f = &frames[0];
    assert_eq!(&f[..6], &[0x01, 0x00, 0x5e, 0x01, 0x02, 0x03], "RFC 1112 MAC of 239.1.2.3");
    let p = parse_frame(f).unwrap();
    assert_eq!(p.repr.transport.bth.dest_qp, MULTICAST_QPN);
    assert_eq!(p.repr.transport.bth.opcode, Opcode::UD_SEND_ONLY);
    match p.repr.ip {
        rocev2::wire::IpRepr::V4(v4) => assert_eq!((v4.dst, v4.ttl), (GROUP, 1)),
        _ => panic!("IPv4 expected"),
    }
    assert_eq!(a.completions().iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), vec![(7, WcStatus::Success)]);

    deliver(&mut b, &frames);
    let mut got = b.completions();
    got.sort_by_key(|c| c.qp_num);
    assert_eq!(got.len(), 3, "one completion per member, none for the outsider");
    for (c, (i, &q)) in got.iter().zip(members.iter().enumerate()) {
        assert_eq!((c.qp_num, c.wr_id, c.status, c.src_qp, c.byte_len), (q, i as u64, WcStatus::Success, tx, 40 + 11));
        let slot = &b.mr.bytes()[i * SLOT..i * SLOT + 51];
        assert_eq!(&slot[40..], b"hello group");
        assert_eq!(&slot[20 + 16..20 + 20], &GROUP, "the GRH's destination is the group");
    }
    assert_eq!(b.engine.stats().mcast_frames, 1);
    assert_eq!(b.engine.stats().rx_unknown_qpn, 0);
    assert_eq!(b.engine.qp_stats(outsider).unwrap().rx_packets, 0);
}

#[test]
fn each_member_checks_its_own_qkey() {
    let mut a = Host::new(0x20, McastLimits::default());
    let mut b = Host::new(0x40, McastLimits::default());
    let tx = a.qp(QpType::Ud, QKEY);
    let right = b.qp(QpType::Ud, QKEY);
    let other = b.qp(QpType::Ud, QKEY + 1);
    for (i, q) in [right, other].into_iter().enumerate() {
        b.engine.attach_mcast(q, group_gid()).unwrap();
        b.post_recv(q, i);
    }
    deliver(&mut b, &send_to_group(&mut a, tx, QKEY, b"k", 1));
    let got = b.completions();
    assert_eq!(got.iter().map(|c| c.qp_num).collect::<Vec<_>>(), vec![right]);
    assert_eq!(b.engine.qp_stats(other).unwrap().resp_ud_qkey_dropped, 1);
    assert_eq!(b.engine.qp_stats(right).unwrap().resp_ud_qkey_dropped, 0);
    // The other Q_Key reaches the other QP only.
    deliver(&mut b, &send_to_group(&mut a, tx, QKEY + 1, b"k", 2));
    assert_eq!(b.completions().iter().map(|c| c.qp_num).collect::<Vec<_>>(), vec![other]);
}

#[test]
fn detach_stops_delivery_at_once_and_no_member_is_a_counted_drop() {
    let mut a = Host::new(0x20, McastLimits::default());
    let mut b = Host::new(0x40, McastLimits::default());
    let tx = a.qp(QpType::Ud, QKEY);
    let (q1, q2) = (b.qp(QpType::Ud, QKEY), b.qp(QpType::Ud, QKEY));
    for q in [q1, q2] {
        b.engine.attach_mcast(q, group_gid()).unwrap();
        for s in 0..3 {
            b.post_recv(q, s + 4 * (q as usize & 1));
        }
    }
    // Nobody of a never-joined group: dropped, counted, no completion.
    let mut other = group_av();
    other.dgid = AddressVector::ipv4_gid([239, 9, 9, 9]);
    other.dmac = multicast_mac(&other.dgid).unwrap();
    let wr = SendWr {
        wr_id: 1,
        op: SendOp::Send,
        payload: Payload::Inline(b"x".to_vec()),
        flags: SendFlags::SIGNALED | SendFlags::INLINE,
        ud: Some(UdDest { av: other, remote_qpn: MULTICAST_QPN, remote_qkey: QKEY }),
    };
    a.engine.post_send(tx, wr).unwrap();
    let f = a.frames();
    deliver(&mut b, &f);
    assert_eq!(b.engine.stats().rx_mcast_no_member, 1);
    assert!(b.completions().is_empty());

    deliver(&mut b, &send_to_group(&mut a, tx, QKEY, b"one", 2));
    assert_eq!(b.completions().len(), 2);
    b.engine.detach_mcast(q1, &group_gid()).unwrap();
    // The very next frame reaches q2 only.
    deliver(&mut b, &send_to_group(&mut a, tx, QKEY, b"two", 3));
    assert_eq!(b.completions().iter().map(|c| c.qp_num).collect::<Vec<_>>(), vec![q2]);
    assert!(matches!(b.engine.detach_mcast(q1, &group_gid()), Err(EngineError::BadValue(_))), "detached twice");
    // Destroying the last member leaves the group: its frames are now drops.
    b.engine.destroy_qp(q2).unwrap();
    assert!(b.engine.mcast().members(&group_gid()).is_empty());
    deliver(&mut b, &send_to_group(&mut a, tx, QKEY, b"three", 4));
    assert_eq!(b.engine.stats().rx_mcast_no_member, 2);
    assert!(b.completions().is_empty());
    assert_eq!(b.engine.stats().mcast_frames, 2);
}

#[test]
fn attach_arguments_and_limits() {
    let limits = McastLimits { max_groups: 2, max_qps_per_group: 2, max_total_attach: 3 };
    let mut b = Host::new(0x40, limits);
    let (q1, q2, q3) = (b.qp(QpType::Ud, QKEY), b.qp(QpType::Ud, QKEY), b.qp(QpType::Ud, QKEY));
    let rc = b.qp(QpType::Rc, 0);
    let g = |x| AddressVector::ipv4_gid([239, 0, 0, x]);
    let e = &mut b.engine;
    assert_eq!(e.attach_mcast(rc, g(1)), Err(EngineError::BadValue("multicast needs a UD QP")));
    assert!(matches!(e.attach_mcast(q1, AddressVector::ipv4_gid(B_IP)), Err(EngineError::BadValue(m)) if m.contains("not a multicast GID")));
    assert_eq!(e.attach_mcast(0x999, g(1)), Err(EngineError::NoSuchQp(0x999)));
    assert_eq!(e.attach_mcast(q1, g(1)), Ok(true));
    assert_eq!(e.attach_mcast(q1, g(1)), Ok(false), "attaching twice is a no-op (rxe, uverbs)");
    assert_eq!(e.attach_mcast(q2, g(1)), Ok(true));
    let full = e.attach_mcast(q3, g(1)).unwrap_err();
    assert!(full.to_string().contains("max_mcast_qp_attach"), "{full}");
    assert_eq!(e.attach_mcast(q3, g(2)), Ok(true));
    let full = e.attach_mcast(q3, g(3)).unwrap_err();
    assert!(full.to_string().contains("max_mcast_grp"), "{full}");
    let full = e.attach_mcast(q2, g(2)).unwrap_err();
    assert!(full.to_string().contains("max_total_mcast_qp_attach"), "{full}");
    // IPv6 groups too (ff0e::…).
    e.detach_mcast(q3, &g(2)).unwrap();
    let mut v6 = [0u8; 16];
    v6[0] = 0xff;
    v6[1] = 0x0e;
    v6[15] = 7;
    assert_eq!(e.attach_mcast(q3, v6), Ok(true));
    assert_eq!(e.mcast().groups_of(q3), &[v6]);
    assert!(matches!(e.detach_mcast(q3, &AddressVector::ipv4_gid(B_IP)), Err(EngineError::BadValue(_))));
}

#[test]
fn connected_opcodes_to_the_multicast_qpn_are_refused_by_every_member() {
    let mut a = Host::new(0x20, McastLimits::default());
    let mut b = Host::new(0x40, McastLimits::default());
    let rc = a.qp(QpType::Rc, 0);
    let uc = a.qp(QpType::Uc, 0);
    let members: Vec<u32> = (0..2).map(|_| b.qp(QpType::Ud, QKEY)).collect();
    for (i, &q) in members.iter().enumerate() {
        b.engine.attach_mcast(q, group_gid()).unwrap();
        b.post_recv(q, i);
    }
    for qpn in [rc, uc] {
        let wr = SendWr { wr_id: 1, op: SendOp::Send, payload: Payload::Inline(b"forged".to_vec()), flags: SendFlags::INLINE, ud: None };
        a.engine.post_send(qpn, wr).unwrap();
    }
    let frames = a.frames();
    assert_eq!(frames.len(), 2);
    for f in &frames {
        assert_eq!(parse_frame(f).unwrap().repr.transport.bth.dest_qp, MULTICAST_QPN);
    }
    deliver(&mut b, &frames);
    assert!(b.completions().is_empty());
    assert_eq!(b.engine.stats().rx_wrong_service, 4, "each member refuses each frame (rxe check_type_state per QP)");
    for &q in &members {
        assert_eq!(b.engine.qp_stats(q).unwrap().rx_packets, 0);
    }
    // A garbled multicast frame never reaches the group.
    let mut bad = send_to_group(&mut Host::new(0x60, McastLimits::default()).tap(), 0x60, QKEY, b"x", 1);
    let last = bad[0].len() - 1;
    bad[0][last] ^= 1;
    deliver(&mut b, &bad);
    assert!(b.completions().is_empty());
    assert_eq!(b.engine.stats().mcast_frames, 2);
}

trait Tap {
    fn tap(self) -> Self;
}

impl Tap for Host {
    /// A host whose first UD QP (0x60) is ready to send.
    fn tap(mut self) -> Host {
        assert_eq!(self.qp(QpType::Ud, QKEY), 0x60);
        self
    }
}

#[test]
fn the_sender_attached_to_its_own_group_is_just_another_member() {
    // The engine does not filter by source: whether a device hears its own
    // multicast is the datapath's loopback decision (Nic), as on an HCA.
    let mut a = Host::new(0x20, McastLimits::default());
    let tx = a.qp(QpType::Ud, QKEY);
    a.engine.attach_mcast(tx, group_gid()).unwrap();
    a.post_recv(tx, 0);
    let frames = send_to_group(&mut a, tx, QKEY, b"me", 1);
    assert_eq!(a.completions().len(), 1, "the send completion");
    deliver(&mut a, &frames);
    let got = a.completions();
    assert_eq!(got.iter().map(|c| (c.qp_num, c.src_qp, c.opcode)).collect::<Vec<_>>(), vec![(tx, tx, WcOpcode::Recv)]);
}

#[test]
fn a_member_not_ready_to_receive_or_in_another_partition_refuses_its_copy_alone() {
    let mut a = Host::new(0x20, McastLimits::default());
    let mut b = Host::new(0x40, McastLimits::default());
    let tx = a.qp(QpType::Ud, QKEY);
    let ready = b.qp(QpType::Ud, QKEY);
    // A member still in INIT (attaching is allowed in any state, as on rxe).
    let cap = QpCaps { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let init = b.engine.create_qp(&QpInitAttr { qp_type: QpType::Ud, pd: PD, send_cq: CQ, recv_cq: CQ, srq: None, cap, sq_sig_all: true }).unwrap();
    let a_init = QpAttr { qp_state: QpState::Init, qkey: QKEY, port_num: 1, ..QpAttr::default() };
    b.engine.modify_qp(init, &a_init, QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY).unwrap();
    for (i, q) in [ready, init].into_iter().enumerate() {
        b.engine.attach_mcast(q, group_gid()).unwrap();
        b.post_recv(q, i);
    }
    deliver(&mut b, &send_to_group(&mut a, tx, QKEY, b"s", 1));
    assert_eq!(b.completions().iter().map(|c| c.qp_num).collect::<Vec<_>>(), vec![ready]);
    assert_eq!(b.engine.stats().rx_wrong_state, 1, "the INIT member refused its copy (rxe check_type_state)");
    // A frame of another partition (P_Key 0x7ffe): every member refuses it.
    let mut f = send_to_group(&mut a, tx, QKEY, b"p", 2).remove(0);
    let bth = 14 + 20 + 8; // Ethernet, IPv4, UDP
    f[bth + 2..bth + 4].copy_from_slice(&0x7ffeu16.to_be_bytes());
    rocev2::wire::icrc::fill_frame(&mut f).unwrap();
    b.post_recv(ready, 5);
    deliver(&mut b, &[f]);
    assert!(b.completions().is_empty());
    assert_eq!(b.engine.stats().rx_bad_pkey, 1, "refused by the ready member (the INIT one stops at its state)");
}

#[test]
fn members_sharing_an_srq_each_take_one_of_its_receives() {
    let mut a = Host::new(0x20, McastLimits::default());
    let mut b = Host::new(0x40, McastLimits::default());
    let tx = a.qp(QpType::Ud, QKEY);
    let srq = b.engine.create_srq(PD, 8, 1).unwrap();
    let cap = QpCaps { max_send_wr: 4, max_recv_wr: 0, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let mut members = Vec::new();
    for _ in 0..2 {
        let q =
            b.engine.create_qp(&QpInitAttr { qp_type: QpType::Ud, pd: PD, send_cq: CQ, recv_cq: CQ, srq: Some(srq), cap, sq_sig_all: true }).unwrap();
        let mut at = QpAttr { qp_state: QpState::Init, qkey: QKEY, port_num: 1, ..QpAttr::default() };
        b.engine.modify_qp(q, &at, QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY).unwrap();
        at.qp_state = QpState::Rtr;
        b.engine.modify_qp(q, &at, QpAttrMask::STATE).unwrap();
        b.engine.attach_mcast(q, group_gid()).unwrap();
        members.push(q);
    }
    for slot in 0..3 {
        let sge = b.mr.sge(slot * SLOT, SLOT as u32);
        b.engine.post_srq_recv(srq, RecvWr { wr_id: slot as u64, sgl: vec![sge] }).unwrap();
    }
    deliver(&mut b, &send_to_group(&mut a, tx, QKEY, b"shared", 1));
    let got = b.completions();
    assert_eq!(got.iter().map(|c| (c.qp_num, c.wr_id)).collect::<Vec<_>>(), vec![(members[0], 0), (members[1], 1)]);
    // One receive left: the next frame reaches the first member only; the
    // second finds the SRQ empty (UD: dropped, counted, no RNR).
    deliver(&mut b, &send_to_group(&mut a, tx, QKEY, b"again", 2));
    assert_eq!(b.completions().iter().map(|c| (c.qp_num, c.wr_id)).collect::<Vec<_>>(), vec![(members[0], 2)]);
    assert_eq!(b.engine.qp_stats(members[1]).unwrap().resp_ud_no_wqe_dropped, 1);
}
