//! The responder against real rxe traffic (`../shared/pcaps`): the client's
//! captured requests to each server QP are fed to a `Responder` (after each
//! one, every response is polled, as rxe answers at once), and our responses
//! must equal the rxe server's field for field: opcode, PSN, AckReq, AETH
//! (syndrome, credits, MSN), AtomicAckETH, payload.
//!
//! Memory: one region per captured rkey spans every address the requests
//! touch (R_Keys in the requests are rewritten to ours); READ sources are
//! pre-filled from the captured READ responses, each atomic target from its
//! captured atomic ACK (perftest buffers hold arbitrary bytes).

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::*;
use crate::transport::attr::AddressVector;
use crate::transport::path::PathHeaders;
use crate::transport::wr::{RecvWr, Sge};
use crate::wire::parse_frame;
use crate::wire::{AethRepr, TransportRepr};

const SERVER: [u8; 4] = [10, 99, 0, 1];
const PD: PdId = PdId(1);

/// The rocev2 tests' pcap helper (`pcap-file`, a dev-dependency).
#[allow(dead_code)]
#[path = "../../../tests/common/pcap.rs"]
mod pcap;

/// Link-layer frames of a classic (µs or ns) pcap file.
fn read_pcap(name: &str) -> Vec<Vec<u8>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/pcaps").join(name);
    pcap::frames(&path).unwrap_or_else(|e| panic!("{e}"))
}

fn from_server(f: &ParsedFrame<'_>) -> bool {
    matches!(f.repr.ip, IpRepr::V4(v4) if v4.src == SERVER)
}

type Fields = (Opcode, u32, bool, Option<AethRepr>, Option<u64>, Vec<u8>);

fn fields(t: &TransportRepr, payload: &[u8]) -> Fields {
    (t.bth.opcode, t.bth.psn.value(), t.bth.ack_req, t.aeth, t.atomic_ack, payload.to_vec())
}

/// Returns the number of responses compared.
fn replay(name: &str, pmtu: Mtu) -> usize {
    let frames = read_pcap(name);
    let parsed: Vec<ParsedFrame<'_>> = frames.iter().filter_map(|f| parse_frame(f).ok()).collect();
    // Requests by server QPN, responses by client QPN; both directions of a
    // QP pair share the UDP source port (Linux derives it from both QPNs).
    let mut requests: BTreeMap<u32, Vec<&ParsedFrame<'_>>> = BTreeMap::new();
    let mut responses: BTreeMap<u32, Vec<&ParsedFrame<'_>>> = BTreeMap::new();
    let mut client_of: BTreeMap<u32, u32> = BTreeMap::new();
    for p in &parsed {
        let bth = p.repr.transport.bth;
        if !from_server(p) && bth.opcode.is_request() {
            requests.entry(bth.dest_qp).or_default().push(p);
        }
        if from_server(p) && bth.opcode.is_response() {
            responses.entry(bth.dest_qp).or_default().push(p);
            if let Some(q) =
                parsed.iter().find(|q| !from_server(q) && q.repr.udp.src_port == p.repr.udp.src_port && q.repr.transport.bth.opcode.is_request())
            {
                client_of.insert(q.repr.transport.bth.dest_qp, bth.dest_qp);
            }
        }
    }
    let mut compared = 0;
    for (&server_qpn, reqs) in &requests {
        let Some(&client_qpn) = client_of.get(&server_qpn) else { continue };
        let expected = &responses[&client_qpn];
        let mem = MemoryTable::new();
        // One region per captured rkey.
        let mut spans: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        for p in reqs {
            let t = &p.repr.transport;
            let (va, rkey, len) = match (t.reth, t.atomic_eth) {
                (Some(r), _) => (r.va, r.rkey, u64::from(r.dma_len)),
                (_, Some(a)) => (a.va, a.rkey, 8),
                _ => continue,
            };
            if len > 0 {
                let s = spans.entry(rkey).or_insert((va, va + len));
                s.0 = s.0.min(va);
                s.1 = s.1.max(va + len);
            }
        }
        let mut regions = Vec::new();
        let mut our_key = BTreeMap::new();
        for (&rkey, &(lo, hi)) in &spans {
            let lo = lo & !7;
            let len = (hi - lo) as usize;
            let mut r = vec![0u64; len.div_ceil(8)].into_boxed_slice();
            // SAFETY: `regions` outlives every use of `mem` below.
            let k = unsafe { mem.register(PD, r.as_mut_ptr().cast(), len, lo, Access::all() - Access::ZERO_BASED) }.unwrap();
            our_key.insert(rkey, k.rkey);
            regions.push(r);
        }
        // READ sources from the captured responses.
        let reads: Vec<(Psn, u64, u32)> = reqs
            .iter()
            .filter(|p| p.repr.transport.bth.opcode == Opcode::RC_READ_REQUEST)
            .filter_map(|p| p.repr.transport.reth.map(|r| (p.repr.transport.bth.psn, r.va, r.rkey)))
            .collect();
        for e in expected.iter().filter(|e| e.repr.transport.bth.opcode.is_read_response()) {
            let psn = e.repr.transport.bth.psn;
            if let Some(&(p0, va, rkey)) = reads.iter().rev().find(|(p0, _, _)| (0..4096).contains(&psn.distance(*p0))) {
                let at = va + psn.distance(p0) as u64 * u64::from(pmtu.bytes());
                mem.remote_write(PD, server_qpn, our_key[&rkey], at, e.payload).unwrap();
            }
        }
        // Receive buffers for the client's SENDs.
        let mut rbuf = vec![0u64; 1 << 14].into_boxed_slice();
        // SAFETY: `rbuf` outlives every use of `mem` below.
        let rk = unsafe { mem.register(PD, rbuf.as_mut_ptr().cast(), 1 << 17, 0x7000_0000, Access::LOCAL_WRITE) }.unwrap();
        let mut rq = RecvQueue::new(PD, 4096, 1);
        for i in 0..4096 {
            rq.post(RecvWr { wr_id: i, sgl: vec![Sge { addr: 0x7000_0000, length: 1 << 17, lkey: rk.lkey }] }).unwrap();
        }
        let (mut completions, mut events, mut stats) = (VecDeque::new(), VecDeque::new(), QpStats::default());
        let back = AddressVector {
            dmac: [0; 6],
            smac: [0; 6],
            vlan: None,
            sgid: AddressVector::ipv4_gid(SERVER),
            dgid: AddressVector::ipv4_gid([10, 99, 0, 2]),
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
            udp_sport: None,
        };
        let path = PathHeaders::new(&back, 0xc000);
        let mut resp = Responder::new(reqs[0].repr.transport.bth.psn);
        let mut got = Vec::new();
        let mut buf = vec![0u8; 9000];
        for p in reqs {
            let mut f = **p;
            if let Some(r) = f.repr.transport.reth.as_mut() {
                r.rkey = our_key.get(&r.rkey).copied().unwrap_or(r.rkey);
            }
            if let Some(a) = f.repr.transport.atomic_eth.as_mut() {
                a.rkey = our_key[&a.rkey];
                let psn = f.repr.transport.bth.psn;
                if let Some(v) = expected.iter().find(|e| e.repr.transport.bth.psn == psn).and_then(|e| e.repr.transport.atomic_ack) {
                    mem.remote_write(PD, server_qpn, a.rkey, a.va, &v.to_ne_bytes()).unwrap();
                }
            }
            let init = super::tests::qp_init(QpType::Rc, PD, CqId(0));
            let attr = super::tests::qp_attr(Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC, pmtu, 0, 12, 16);
            let mut ctx = ResponderCtx {
                memory: &mem,
                qpn: server_qpn,
                init: &init,
                attr: &attr,
                recv_queue: &mut rq,
                completions: &mut completions,
                events: &mut events,
                stats: &mut stats,
            };
            assert_eq!(resp.handle_request(Instant::ZERO, &mut ctx, &f), ResponderOutcome::Ok, "{name}");
            while let Some(n) = resp.poll_transmit(&mut ctx, &path, client_qpn, &mut buf) {
                let g = parse_frame(&buf[..n]).unwrap();
                got.push(fields(&g.repr.transport, g.payload));
            }
        }
        let want: Vec<Fields> = expected.iter().map(|e| fields(&e.repr.transport, e.payload)).collect();
        assert_eq!(got.len(), want.len(), "{name} QP {server_qpn:#x}: number of responses");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "{name} QP {server_qpn:#x}: response #{i}");
        }
        compared += want.len();
    }
    compared
}

#[test]
fn write_bw_acks_match_rxe() {
    assert_eq!(replay("write_bw.pcap", Mtu::Mtu1024), 15);
}

#[test]
fn read_bw_responses_match_rxe() {
    assert_eq!(replay("read_bw.pcap", Mtu::Mtu1024), 345);
}

#[test]
fn atomic_bw_acks_match_rxe() {
    assert_eq!(replay("atomic_bw.pcap", Mtu::Mtu1024), 10);
}

#[test]
fn send_acks_match_rxe() {
    assert_eq!(replay("rc_pingpong.pcap", Mtu::Mtu1024), 6);
    assert_eq!(replay("rc_pingpong_mtu4096.pcap", Mtu::Mtu4096), 3);
    assert_eq!(replay("send_lat.pcap", Mtu::Mtu1024), 10);
}

#[test]
fn rping_responses_match_rxe() {
    assert_eq!(replay("rping.pcap", Mtu::Mtu1024), 6);
}
