//! The CM agent against hostile input: malformed MADs, unknown comm IDs, a
//! REJ or DREQ from a stranger naming someone else's connection, stale and
//! duplicate REQs, REQ floods. Each is a counted drop (or the answer the
//! spec owes), never a panic, and no connection is torn down that belongs
//! to someone else.

use proptest::prelude::*;
use rocev2::cm::msg::{attr, reason, sidr_status, Dreq, MsgRef, Rej, Req, ReqPath};
use rocev2::cm::{AcceptParams, Cm, CmConfig, CmEvent, CmId, CmMad, CmMessage, CmStats, ConnectParams, Drop, Gid, MadError, PortSpace};
use rocev2::Instant;

const A: Gid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1];
const B: Gid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2];
const STRANGER: Gid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 66];
const T0: Instant = Instant::from_nanos(1_000);

fn service() -> u64 {
    PortSpace::Tcp.service_id(7174)
}

fn agent(guid: u64) -> Cm {
    Cm::with_seed(CmConfig { local_ca_guid: guid, max_ids: 64, ..CmConfig::default() }, guid)
}

fn connect_params(qpn: u32) -> ConnectParams {
    ConnectParams { starting_psn: 1, ..ConnectParams::rc(service(), A, B, qpn) }
}

fn accept_params(qpn: u32) -> AcceptParams {
    AcceptParams {
        qpn,
        starting_psn: 2,
        responder_resources: 1,
        initiator_depth: 1,
        target_ack_delay: 15,
        rnr_retry_count: 7,
        srq: false,
        private_data: vec![],
    }
}

/// Move every MAD between the two agents until both are quiet.
fn pump(a: &mut Cm, b: &mut Cm) {
    loop {
        let mut moved = false;
        while let Some(t) = a.poll_transmit() {
            let _ = b.handle_mad(T0, t.src_gid, t.dst_gid, &t.mad);
            moved = true;
        }
        while let Some(t) = b.poll_transmit() {
            let _ = a.handle_mad(T0, t.src_gid, t.dst_gid, &t.mad);
            moved = true;
        }
        if !moved {
            return;
        }
    }
}

/// An established connection: (A, B, A's id, B's id).
fn established(qpn: u32) -> (Cm, Cm, CmId, CmId) {
    let (mut a, mut b) = (agent(1), agent(2));
    b.listen(service(), 16).unwrap();
    let ia = a.connect(T0, &connect_params(qpn)).unwrap();
    pump(&mut a, &mut b);
    let Some(CmEvent::ConnectRequest { id: ib, .. }) = b.poll_event() else { panic!("no request") };
    b.accept(T0, ib, &accept_params(qpn + 1)).unwrap();
    pump(&mut a, &mut b);
    assert!(matches!(a.poll_event(), Some(CmEvent::ConnectReply { .. })));
    a.ready_to_use(T0, ia, &[]).unwrap();
    pump(&mut a, &mut b);
    assert_eq!(a.poll_event(), Some(CmEvent::Established { id: ia }));
    assert_eq!(b.poll_event(), Some(CmEvent::Established { id: ib }));
    (a, b, ia, ib)
}

fn mad(tid: u64, msg: CmMessage) -> [u8; 256] {
    CmMad { tid, msg }.emit()
}

fn stale_counts(s: CmStats) -> (u64, u64, u64) {
    (s.rx_wrong_peer, s.rx_unknown_id, s.rx_malformed)
}

#[test]
fn strangers_cannot_reject_or_disconnect_a_connection() {
    let (mut a, mut b, ia, ib) = established(0x10);
    let rej = |local, remote| {
        mad(
            9,
            CmMessage::Rej(Rej {
                local_comm_id: local,
                remote_comm_id: remote,
                msg_rejected: MsgRef::Req,
                reject_info_len: 0,
                reason: reason::CONSUMER_DEFINED,
                ari: [0; 72],
                private_data: vec![],
            }),
        )
    };
    let dreq =
        |local, remote, qpn| mad(9, CmMessage::Dreq(Dreq { local_comm_id: local, remote_comm_id: remote, remote_qpn: qpn, private_data: vec![] }));
    // From a stranger's address, with the right IDs.
    assert_eq!(a.handle_mad(T0, STRANGER, A, &dreq(ib, ia, 0x10)), Err(Drop::WrongPeer));
    assert_eq!(b.handle_mad(T0, STRANGER, B, &dreq(ia, ib, 0x11)), Err(Drop::WrongPeer));
    assert_eq!(a.handle_mad(T0, STRANGER, A, &rej(ib, ia)), Err(Drop::WrongPeer));
    // Spoofing the peer's address, but guessing the peer's comm ID wrong.
    assert_eq!(a.handle_mad(T0, B, A, &dreq(ib ^ 1, ia, 0x10)), Err(Drop::WrongPeer));
    assert_eq!(a.handle_mad(T0, B, A, &dreq(0, ia, 0x10)), Err(Drop::WrongPeer));
    // ... or naming another QP.
    assert_eq!(a.handle_mad(T0, B, A, &dreq(ib, ia, 0x99)), Err(Drop::WrongPeer));
    // A REJ to an established connection is not for it (IBTA 12.9.6).
    assert_eq!(a.handle_mad(T0, B, A, &rej(ib, ia)), Err(Drop::BadState));
    // An ID nobody holds.
    assert_eq!(a.handle_mad(T0, B, A, &dreq(ib, ia ^ 0x8000, 0x10)), Err(Drop::UnknownId));
    assert_eq!(stale_counts(a.stats()), (5, 1, 0));
    assert_eq!(a.stats().rx_bad_state, 1);
    assert_eq!((a.poll_event(), b.poll_event()), (None, None));
    assert_eq!((a.state_name(ia), b.state_name(ib)), (Some("ESTABLISHED"), Some("ESTABLISHED")));
    assert!(a.poll_transmit().is_none() && b.poll_transmit().is_none(), "nothing answered to a stranger");
    // The real peer still can.
    a.disconnect(T0, ia, &[]).unwrap();
    pump(&mut a, &mut b);
    assert_eq!(b.poll_event(), Some(CmEvent::Disconnected { id: ib }));
}

#[test]
fn malformed_mads_are_counted() {
    let mut b = agent(2);
    b.listen(service(), 16).unwrap();
    let (_, _, _, _) = established(0x10);
    let good = {
        let mut a = agent(1);
        a.connect(T0, &connect_params(0x10)).unwrap();
        a.poll_transmit().unwrap().mad
    };
    let cases: Vec<(Vec<u8>, MadError)> = vec![
        (good[..200].to_vec(), MadError::Length(200)),
        (
            {
                let mut m = good;
                m[1] = 0x81;
                m.to_vec()
            },
            MadError::Class(0x81),
        ),
        (
            {
                let mut m = good;
                m[2] = 3;
                m.to_vec()
            },
            MadError::ClassVersion(3),
        ),
        (
            {
                let mut m = good;
                m[3] = 0x01;
                m.to_vec()
            },
            MadError::Method(1),
        ),
        (
            {
                let mut m = good;
                m[17] = 0x19;
                m.to_vec()
            },
            MadError::Attribute(0x19),
        ), // LAP
        (
            {
                let mut m = good;
                m[24 + 43] |= 0x06;
                m.to_vec()
            },
            MadError::Field("transport service type"),
        ),
    ];
    for (m, e) in &cases {
        assert_eq!(b.handle_mad(T0, A, B, m), Err(Drop::Malformed(*e)));
    }
    // An MRA whose "message MRAed" is the reserved value 3.
    let mut mra = mad(
        1,
        CmMessage::Mra(rocev2::cm::msg::Mra {
            local_comm_id: 1,
            remote_comm_id: 2,
            msg_mraed: MsgRef::Req,
            service_timeout: 1,
            private_data: vec![],
        }),
    );
    mra[24 + 8] = 0xC0;
    assert!(matches!(b.handle_mad(T0, A, B, &mra), Err(Drop::Malformed(_))));
    assert_eq!(b.stats().rx_malformed, cases.len() as u64 + 1);
    assert_eq!(b.live_ids(), 0);
    assert!(b.poll_event().is_none() && b.poll_transmit().is_none());
}

proptest! {
    /// Any bytes, any attribute: a drop or an event, never a panic, and the
    /// agent's state stays bounded.
    #[test]
    fn random_mads_never_panic(body in proptest::collection::vec(any::<u8>(), 232), attr_id in 0x0010u16..0x001b, tid in any::<u64>(), from_peer in any::<bool>()) {
        let (mut a, mut b, _, _) = established(0x10);
        let mut m = [0u8; 256];
        m[..4].copy_from_slice(&[1, 7, 2, 3]);
        m[8..16].copy_from_slice(&tid.to_be_bytes());
        m[16..18].copy_from_slice(&attr_id.to_be_bytes());
        m[24..].copy_from_slice(&body);
        let src = if from_peer { B } else { STRANGER };
        let _ = a.handle_mad(T0, src, A, &m);
        let _ = b.handle_mad(T0, if from_peer { A } else { STRANGER }, B, &m);
        a.handle_timeout(T0);
        prop_assert!(a.live_ids() <= 64 && b.live_ids() <= 64);
        while a.poll_transmit().is_some() {}
        while b.poll_event().is_some() {}
    }

    #[test]
    fn random_lengths_never_panic(m in proptest::collection::vec(any::<u8>(), 0..300)) {
        let mut b = agent(2);
        b.listen(service(), 4).unwrap();
        let _ = b.handle_mad(T0, A, B, &m);
    }
}

#[test]
fn req_flood_is_bounded_and_refused() {
    let mut b = agent(2);
    b.listen(service(), 16).unwrap();
    let mut requests = 0;
    for i in 0..10_000u32 {
        let mut src = STRANGER;
        src[12..16].copy_from_slice(&i.to_be_bytes());
        let req = Req {
            local_comm_id: i.wrapping_mul(2_654_435_761) | 1,
            service_id: service(),
            local_ca_guid: 1,
            local_qkey: 0,
            local_qpn: 0x100 + i,
            responder_resources: 1,
            local_eecn: 0,
            initiator_depth: 1,
            remote_eecn: 0,
            remote_cm_response_timeout: 20,
            transport_service_type: 0,
            end_to_end_flow_control: false,
            starting_psn: 0,
            local_cm_response_timeout: 20,
            retry_count: 7,
            partition_key: 0xFFFF,
            path_mtu: 3,
            rdc_exists: false,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            srq: false,
            extended_transport_type: 0,
            primary: ReqPath { local_gid: src, remote_gid: B, ..Default::default() },
            alternate: ReqPath::default(),
            private_data: vec![],
        };
        let _ = b.handle_mad(T0, src, B, &mad(i as u64, CmMessage::Req(req)));
        while let Some(ev) = b.poll_event() {
            assert!(matches!(ev, CmEvent::ConnectRequest { .. }));
            requests += 1;
        }
    }
    assert_eq!(requests, 16, "the backlog bounds pending requests");
    assert_eq!(b.live_ids(), 16);
    assert_eq!(b.stats().rx_over_limit, 10_000 - 16);
    let mut rejs = 0;
    while let Some(t) = b.poll_transmit() {
        let CmMessage::Rej(r) = CmMad::parse(&t.mad).unwrap().msg else { panic!("not a REJ") };
        assert_eq!(r.reason, reason::NO_RESOURCES);
        rejs += 1;
    }
    assert_eq!(rejs, 10_000 - 16);
}

#[test]
fn duplicate_req_gets_the_same_rep_and_stale_req_is_refused() {
    let (mut a, mut b) = (agent(1), agent(2));
    b.listen(service(), 16).unwrap();
    let ia = a.connect(T0, &connect_params(0x10)).unwrap();
    let req = a.poll_transmit().unwrap();
    b.handle_mad(T0, A, B, &req.mad).unwrap();
    let Some(CmEvent::ConnectRequest { id: ib, .. }) = b.poll_event() else { panic!() };
    // A duplicate before the consumer answered: an MRA, the same one again.
    assert_eq!(b.handle_mad(T0, A, B, &req.mad), Err(Drop::Duplicate));
    let mra = b.poll_transmit().unwrap();
    assert_eq!(CmMad::parse(&mra.mad).unwrap().msg.attr_id(), attr::MRA);
    assert_eq!(b.handle_mad(T0, A, B, &req.mad), Err(Drop::Duplicate));
    assert_eq!(b.poll_transmit().unwrap().mad, mra.mad);
    b.accept(T0, ib, &accept_params(0x11)).unwrap();
    let rep = b.poll_transmit().unwrap();
    assert_eq!(b.handle_mad(T0, A, B, &req.mad), Err(Drop::Duplicate));
    assert_eq!(b.poll_transmit().unwrap().mad, rep.mad, "a repeated REQ gets the same REP");
    a.handle_mad(T0, B, A, &rep.mad).unwrap();
    a.poll_event().unwrap();
    a.ready_to_use(T0, ia, &[]).unwrap();
    pump(&mut a, &mut b);
    assert_eq!(b.poll_event(), Some(CmEvent::Established { id: ib }));
    assert_eq!(b.poll_event(), None);

    // A new REQ from the same peer for the same QPN, another comm ID: stale.
    let mut a2 = Cm::with_seed(CmConfig { local_ca_guid: 1, ..CmConfig::default() }, 99);
    a2.connect(T0, &connect_params(0x10)).unwrap();
    let stale = a2.poll_transmit().unwrap();
    assert_eq!(b.handle_mad(T0, A, B, &stale.mad), Err(Drop::Stale));
    let CmMessage::Rej(r) = CmMad::parse(&b.poll_transmit().unwrap().mad).unwrap().msg else { panic!() };
    assert_eq!(r.reason, reason::STALE_CONN);
    // ... and the old connection is disconnected (IBTA 12.9.8.3.1).
    assert_eq!(CmMad::parse(&b.poll_transmit().unwrap().mad).unwrap().msg.attr_id(), attr::DREQ);
    assert_eq!(b.state_name(ib), Some("DREQ_SENT"));
    // The same stale REQ from a stranger's address is a new, harmless request.
    let _ = b.handle_mad(T0, STRANGER, B, &stale.mad);
    assert_eq!(b.stats().rx_stale, 1);
}

#[test]
fn no_listener_answers() {
    let (mut a, mut b) = (agent(1), agent(2));
    let id = a.connect(T0, &connect_params(0x10)).unwrap();
    pump(&mut a, &mut b);
    assert_eq!(a.poll_event(), Some(CmEvent::Rejected { id, reason: reason::INVALID_SERVICE_ID, private_data: vec![0; 148] }));
    assert_eq!(a.live_ids(), 0);
    let sid = a.sidr_request(T0, PortSpace::Udp.service_id(1), A, B, &[]).unwrap();
    pump(&mut a, &mut b);
    let Some(CmEvent::SidrReply { id, rep }) = a.poll_event() else { panic!() };
    assert_eq!((id, rep.status), (sid, sidr_status::SID_NOT_SUPPORTED));
    assert_eq!(b.stats().rx_no_listener, 2);
    assert_eq!(b.live_ids(), 0);
}

#[test]
fn consumer_reject_carries_private_data_and_answers_retransmissions() {
    let (mut a, mut b) = (agent(1), agent(2));
    b.listen(service(), 16).unwrap();
    let ia = a.connect(T0, &connect_params(0x10)).unwrap();
    let req = a.poll_transmit().unwrap();
    b.handle_mad(T0, A, B, &req.mad).unwrap();
    let Some(CmEvent::ConnectRequest { id: ib, .. }) = b.poll_event() else { panic!() };
    b.reject(T0, ib, b"busy").unwrap();
    let rej = b.poll_transmit().unwrap();
    // The REJ was lost; the retransmitted REQ gets it again, not a new request.
    assert_eq!(b.handle_mad(T0, A, B, &req.mad), Err(Drop::Duplicate));
    assert_eq!(b.poll_transmit().unwrap().mad, rej.mad);
    assert_eq!(b.poll_event(), None);
    a.handle_mad(T0, B, A, &rej.mad).unwrap();
    let Some(CmEvent::Rejected { id, reason: why, private_data }) = a.poll_event() else { panic!() };
    assert_eq!((id, why, &private_data[..4]), (ia, reason::CONSUMER_DEFINED, &b"busy"[..]));
    // Private data longer than the message carries is refused up front.
    let mut p = connect_params(0x20);
    p.private_data = vec![0; 93];
    assert!(a.connect(T0, &p).is_err());
}
