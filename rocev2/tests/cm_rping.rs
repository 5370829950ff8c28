//! The CM messages of a real rxe rping session (`../shared/pcaps/rping.pcap`:
//! REQ, REP, RTU, then DREQ, DREP) parse to the values tshark shows and
//! re-emit to the same 256 bytes; the REQ's RDMA-CM IP header names the two
//! hosts; and our agent, fed the client's REQ, answers with a REP that
//! parses back, and takes the client's RTU and DREQ as rxe's server did.

mod common;

use std::net::IpAddr;

use rocev2::cm::cma::roce_flow_label;
use rocev2::cm::msg::{attr, reason, CmMessage};
use rocev2::cm::{gsi, AcceptParams, Cm, CmConfig, CmEvent, CmMad, CmaHeader, PortSpace, GSI_QPN};
use rocev2::wire::{parse_frame, sport, DethRepr, Opcode, ParsedFrame};
use rocev2::Instant;

fn frames() -> Vec<Vec<u8>> {
    let path = common::shared_dir().join("pcaps/rping.pcap");
    common::pcap::frames(&path).unwrap_or_else(|e| panic!("{e}"))
}

/// The CM MADs of the capture, in order: (source GID, destination GID, MAD).
fn cm_mads(frames: &[Vec<u8>]) -> Vec<([u8; 16], [u8; 16], Vec<u8>)> {
    let mut out = Vec::new();
    for f in frames {
        let Ok(p) = parse_frame(f) else { continue };
        if p.repr.transport.bth.dest_qp != GSI_QPN {
            continue;
        }
        check_gsi(&p);
        out.push((p.repr.ip.src_gid(), p.repr.ip.dst_gid(), p.payload.to_vec()));
    }
    out
}

/// What QP1 traffic looks like on the wire (IBTA 13.5.1; rxe as captured):
/// our GSI headers equal rxe's but for the PSN, and the MAD passes our checks.
fn check_gsi(p: &ParsedFrame<'_>) {
    let t = &p.repr.transport;
    assert_eq!(*t, gsi::transport(t.bth.psn));
    assert_eq!(p.repr.udp.src_port, gsi::GSI_UDP_SPORT);
    assert_eq!(gsi::mad(t, p.payload), Ok(p.payload));
    let mut other = *t;
    other.deth = Some(DethRepr { qkey: 0x1234, ..t.deth.unwrap() });
    assert_eq!(gsi::mad(&other, p.payload), Err(gsi::GsiError::QKey(0x1234)));
    other.deth = Some(DethRepr { src_qp: 5, ..t.deth.unwrap() });
    assert_eq!(gsi::mad(&other, p.payload), Err(gsi::GsiError::SourceQp(5)));
    other.bth.opcode = Opcode::RC_SEND_ONLY;
    assert!(gsi::mad(&other, p.payload).is_err());
    assert_eq!(gsi::mad(t, &p.payload[..255]), Err(gsi::GsiError::Length(255)));
}

#[test]
fn every_cm_mad_parses_and_re_emits_byte_for_byte() {
    let mads = cm_mads(&frames());
    let names: Vec<&str> = mads.iter().map(|(_, _, m)| CmMad::parse(m).unwrap().msg.name()).collect();
    assert_eq!(names, ["REQ", "REP", "RTU", "DREQ", "DREP"]);
    for (_, _, m) in &mads {
        let parsed = CmMad::parse(m).unwrap();
        assert_eq!(&parsed.emit()[..], &m[..], "{} re-emitted differs", parsed.msg.name());
        // Linux keeps one transaction ID for the whole session here.
        assert_eq!(parsed.tid, 0x0000_0002_0885_a4a5);
    }
}

#[test]
fn fields_are_what_tshark_shows() {
    let mads = cm_mads(&frames());
    let msg = |i: usize| CmMad::parse(&mads[i].2).unwrap().msg;
    let CmMessage::Req(req) = msg(0) else { panic!("first is not a REQ") };
    assert_eq!(req.local_comm_id, 0xa5a4_8508);
    assert_eq!(req.service_id, PortSpace::Tcp.service_id(0x1c06));
    assert_eq!(PortSpace::from_service_id(req.service_id), Some((PortSpace::Tcp, 7174)));
    assert_eq!(req.local_ca_guid, 0x5054_00ff_fe63_0002);
    assert_eq!((req.local_qpn, req.responder_resources, req.initiator_depth), (0x11, 1, 1));
    assert_eq!((req.remote_cm_response_timeout, req.transport_service_type, req.end_to_end_flow_control), (0x14, 0, false));
    assert_eq!((req.starting_psn, req.local_cm_response_timeout, req.retry_count), (0x90fba4, 0x14, 7));
    assert_eq!((req.partition_key, req.path_mtu, req.rdc_exists, req.rnr_retry_count), (0xFFFF, 3, false, 7));
    assert_eq!((req.max_cm_retries, req.srq, req.extended_transport_type), (15, false, 0));
    let p = req.primary;
    assert_eq!((p.local_lid, p.remote_lid), (0xFFFF, 0xFFFF));
    assert_eq!(p.local_gid, mads[0].0, "REQ's local GID is the packet's source");
    assert_eq!(p.remote_gid, mads[0].1);
    // tshark shows flow label 0x1c and rate 1 here: it reads the word from
    // the wrong offset. The bytes are 01 c4 30 00: flow label 0x01c43, as
    // Linux computes it from the ports (cma_get_roce_udp_flow_label).
    assert_eq!((p.flow_label, p.packet_rate, p.traffic_class, p.hop_limit, p.sl, p.local_ack_timeout), (0x1c43, 0, 0, 0x40, 0, 0x13));
    assert_eq!(req.alternate, Default::default());
    let cma = CmaHeader::parse(&req.private_data).unwrap();
    assert_eq!(cma.src_port, 0x8423);
    assert_eq!(cma.src, "10.99.0.2".parse::<IpAddr>().unwrap());
    assert_eq!(cma.dst, "10.99.0.1".parse::<IpAddr>().unwrap());
    assert_eq!(&cma.emit()[..], &req.private_data[..36]);
    assert_eq!(roce_flow_label(cma.src_port, 7174), p.flow_label);
    // ... and that flow label picks the RC data's UDP source port.
    let data =
        frames().iter().filter_map(|f| parse_frame(f).ok().map(|p| (p.repr.udp.src_port, p.repr.transport.bth.dest_qp))).find(|(_, qp)| *qp == 0x11);
    assert_eq!(data.map(|d| d.0), Some(sport::flow_label_to_sport(p.flow_label)));

    let CmMessage::Rep(rep) = msg(1) else { panic!("second is not a REP") };
    assert_eq!((rep.local_comm_id, rep.remote_comm_id), (0xe7bc_43e6, 0xa5a4_8508));
    assert_eq!((rep.local_qpn, rep.starting_psn, rep.responder_resources, rep.initiator_depth), (0x11, 0xb49047, 1, 1));
    assert_eq!((rep.target_ack_delay, rep.failover_accepted, rep.rnr_retry_count, rep.srq), (0x0f, 0, 7, false));
    assert_eq!(rep.local_ca_guid, 0x5054_00ff_fe63_0001);

    // What the two Starting PSNs mean, from the data that follows: the
    // client (active) sends from the REP's, the server from the REQ's.
    let first_psn_from = |ip: [u8; 4]| {
        frames()
            .iter()
            .filter_map(|f| parse_frame(f).ok().map(|p| p.repr))
            .find(|r| r.transport.bth.dest_qp == 0x11 && r.transport.bth.opcode.is_request() && r.ip.src_gid() == rocev2::wire::ipv4_mapped(ip))
            .map(|r| r.transport.bth.psn.value())
    };
    assert_eq!(first_psn_from([10, 99, 0, 2]), Some(rep.starting_psn));
    assert_eq!(first_psn_from([10, 99, 0, 1]), Some(req.starting_psn));

    let CmMessage::Rtu(rtu) = msg(2) else { panic!("third is not an RTU") };
    assert_eq!((rtu.local_comm_id, rtu.remote_comm_id), (0xa5a4_8508, 0xe7bc_43e6));
    let CmMessage::Dreq(dreq) = msg(3) else { panic!("fourth is not a DREQ") };
    assert_eq!((dreq.local_comm_id, dreq.remote_comm_id, dreq.remote_qpn), (0xa5a4_8508, 0xe7bc_43e6, 0x11));
    let CmMessage::Drep(drep) = msg(4) else { panic!("fifth is not a DREP") };
    assert_eq!((drep.local_comm_id, drep.remote_comm_id), (0xe7bc_43e6, 0xa5a4_8508));
}

#[test]
fn our_agent_serves_rxes_client() {
    let mads = cm_mads(&frames());
    let (client, server, _) = mads[0];
    let mut cm = Cm::with_seed(CmConfig { local_ca_guid: 0x5054_00ff_fe63_0001, ..CmConfig::default() }, 7);
    let t0 = Instant::from_nanos(1_000_000);
    // No listener yet: REJ reason 8, as Linux's CM answers.
    assert!(cm.handle_mad(t0, client, server, &mads[0].2).is_err());
    let rej = CmMad::parse(&cm.poll_transmit().unwrap().mad).unwrap();
    let CmMessage::Rej(rej_msg) = rej.msg else { panic!("expected REJ") };
    assert_eq!((rej_msg.reason, rej_msg.remote_comm_id, rej.tid), (reason::INVALID_SERVICE_ID, 0xa5a4_8508, 0x0000_0002_0885_a4a5));

    // The REQ names the client's comm ID; our duplicate check keys on it, so
    // the REQ is new again once we listen.
    cm.listen(PortSpace::Tcp.service_id(7174), 8).unwrap();
    cm.handle_mad(t0, client, server, &mads[0].2).unwrap();
    let Some(CmEvent::ConnectRequest { id, req, .. }) = cm.poll_event() else { panic!("no ConnectRequest") };
    assert_eq!(req.local_qpn, 0x11);
    let accept = AcceptParams {
        qpn: 0x11,
        starting_psn: 0xb49047,
        responder_resources: 1,
        initiator_depth: 1,
        target_ack_delay: 0x0f,
        rnr_retry_count: 7,
        srq: false,
        private_data: vec![],
    };
    cm.accept(t0, id, &accept).unwrap();
    let tx = cm.poll_transmit().unwrap();
    assert_eq!((tx.src_gid, tx.dst_gid), (server, client));
    let ours = CmMad::parse(&tx.mad).unwrap();
    assert_eq!(ours.tid, 0x0000_0002_0885_a4a5, "a REP echoes the REQ's transaction ID");
    let CmMessage::Rep(our_rep) = ours.msg else { panic!("expected REP") };
    let CmMessage::Rep(rxe_rep) = CmMad::parse(&mads[1].2).unwrap().msg else { panic!() };
    // Field for field as rxe's server answered, but for our own comm ID.
    assert_eq!(our_rep.local_comm_id, id);
    assert_eq!(rocev2::cm::msg::Rep { local_comm_id: rxe_rep.local_comm_id, ..our_rep }, rxe_rep);

    // The client's RTU and DREQ name rxe's server comm ID: rewrite it to ours,
    // as the client would have sent to us.
    let renamed = |m: &[u8]| {
        let mut m = m.to_vec();
        m[24 + 4..24 + 8].copy_from_slice(&id.to_be_bytes());
        m
    };
    cm.handle_mad(t0, client, server, &renamed(&mads[2].2)).unwrap();
    assert_eq!(cm.poll_event(), Some(CmEvent::Established { id }));
    cm.handle_mad(t0, client, server, &renamed(&mads[3].2)).unwrap();
    assert_eq!(cm.poll_event(), Some(CmEvent::Disconnected { id }));
    cm.disconnect(t0, id, &[]).unwrap();
    let drep = CmMad::parse(&cm.poll_transmit().unwrap().mad).unwrap();
    assert_eq!(drep.msg.attr_id(), attr::DREP);
    assert_eq!(cm.state_name(id), Some("TIMEWAIT"));
    let stats = cm.stats();
    assert_eq!((stats.rx_mads, stats.rx_no_listener, stats.tx_mads), (4, 1, 3));
}
