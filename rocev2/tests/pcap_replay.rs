//! Our engine stands in for the server of the reference captures (real rxe
//! traffic between two Linux guests): the client's captured request frames
//! are fed to it in capture order, and its responses must match what the rxe
//! server sent, field for field — opcode, PSN, DestQP, AckReq, AETH syndrome
//! and MSN, atomic original value, payload (and the UDP source port, which
//! Linux derives from the QPNs). IP identification and other header bytes
//! are not compared.
//!
//! Setup per QP session of a capture: an engine whose QP number is the
//! captured server QPN, `rq_psn` from the first captured request, `sq_psn`
//! from the server's first request (rc_pingpong also sends), memory regions at
//! the captured remote addresses with the captured rkeys, pre-filled from the
//! capture itself (READ response payloads tell what the server's memory held,
//! atomic ACKs the original values), and receives for the client's SENDs.
//! Where the server also sends (rc_pingpong), the same SEND is posted when the
//! capture shows its first packet, and the client's captured ACKs are fed
//! back, so our requester's frames are compared too.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use rocev2::psn::Psn;
use rocev2::sim::rc::{bring_up_rc_from_init, HostAddr, RcParams};
use rocev2::time::Instant;
use rocev2::transport::attr::{AddressVector, Mtu, QpAttr, QpAttrMask, QpCaps, QpInitAttr, QpState, QpType};
use rocev2::transport::engine::{Engine, EngineConfig};
use rocev2::transport::memory::{Access, MemoryTable, PdId};
use rocev2::transport::wr::{CqId, Payload, RecvWr, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus};
use rocev2::wire::{parse_frame, IpRepr, Opcode, ParsedFrame, Segment};

const SERVER_IP: [u8; 4] = [10, 99, 0, 1];
const CLIENT_IP: [u8; 4] = [10, 99, 0, 2];
const PD: PdId = PdId(1);
const ACCESS: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ).union(Access::REMOTE_ATOMIC);

/// One captured RoCE frame.
#[derive(Clone)]
struct Cap {
    index: usize,
    ts: u64,
    from_server: bool,
    data: Vec<u8>,
}

impl Cap {
    fn parsed(&self) -> ParsedFrame<'_> {
        parse_frame(&self.data).unwrap_or_else(|e| panic!("capture frame #{} does not parse: {e:?}", self.index))
    }
}

fn src_ip(p: &ParsedFrame<'_>) -> [u8; 4] {
    match p.repr.ip {
        IpRepr::V4(v4) => v4.src,
        IpRepr::V6(_) => panic!("the reference captures are IPv4"),
    }
}

fn load(name: &str) -> Vec<Cap> {
    let path = common::shared_dir().join("pcaps").join(name);
    let mut out = Vec::new();
    for rec in common::pcap::read(&path).expect("read pcap") {
        let Ok(p) = parse_frame(&rec.data) else { continue };
        let ip = src_ip(&p);
        assert!(ip == SERVER_IP || ip == CLIENT_IP, "{name}#{}: unexpected source {ip:?}", rec.index);
        out.push(Cap { index: rec.index, ts: rec.ts_nanos, from_server: ip == SERVER_IP, data: rec.data });
    }
    assert!(!out.is_empty(), "{name}: no RoCE frames");
    out
}

/// The frames of one QP pair, keyed by the UDP source port that Linux
/// derives from the two QPNs (both directions use the same one).
struct Session {
    server_qpn: u32,
    client_qpn: u32,
    frames: Vec<Cap>,
}

fn sessions(caps: &[Cap]) -> Vec<Session> {
    let mut by_port: BTreeMap<u16, Vec<Cap>> = BTreeMap::new();
    let mut order = Vec::new();
    for c in caps {
        let port = c.parsed().repr.udp.src_port;
        if !by_port.contains_key(&port) {
            order.push(port);
        }
        by_port.entry(port).or_default().push(c.clone());
    }
    order
        .into_iter()
        .map(|port| {
            let frames = by_port.remove(&port).unwrap();
            let dq = |server: bool| {
                let set: std::collections::BTreeSet<u32> =
                    frames.iter().filter(|c| c.from_server == server).map(|c| c.parsed().repr.transport.bth.dest_qp).collect();
                assert_eq!(set.len(), 1, "port {port}: one QPN per direction expected, got {set:?}");
                *set.iter().next().unwrap()
            };
            Session { server_qpn: dq(false), client_qpn: dq(true), frames }
        })
        .collect()
}

/// The transport fields compared between a captured response and ours.
#[derive(Debug, PartialEq, Eq)]
struct Fields {
    opcode: Opcode,
    psn: Psn,
    dest_qp: u32,
    ack_req: bool,
    solicited: bool,
    aeth: Option<(u8, u32)>,
    atomic_orig: Option<u64>,
    reth: Option<(u64, u32, u32)>,
    immediate: Option<u32>,
    udp_sport: u16,
    payload_len: usize,
}

fn fields(p: &ParsedFrame<'_>) -> Fields {
    let t = &p.repr.transport;
    Fields {
        opcode: t.bth.opcode,
        psn: t.bth.psn,
        dest_qp: t.bth.dest_qp,
        ack_req: t.bth.ack_req,
        solicited: t.bth.solicited,
        aeth: t.aeth.map(|a| (a.syndrome.to_byte(), a.msn)),
        atomic_orig: t.atomic_ack,
        reth: t.reth.map(|r| (r.va, r.rkey, r.dma_len)),
        immediate: t.immediate,
        udp_sport: p.repr.udp.src_port,
        payload_len: p.payload.len(),
    }
}

/// A registered buffer at a chosen address, with a chosen key.
struct Buf {
    mem: Box<[u64]>,
    iova: u64,
}

impl Buf {
    fn new(iova: u64, len: usize) -> Buf {
        Buf { mem: vec![0u64; len.div_ceil(8) + 1].into_boxed_slice(), iova }
    }
    fn ptr(&mut self) -> *mut u8 {
        self.mem.as_mut_ptr() as *mut u8
    }
    fn len(&self) -> usize {
        self.mem.len() * 8
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: plain bytes of a live u64 buffer.
        unsafe { std::slice::from_raw_parts(self.mem.as_ptr() as *const u8, self.len()) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.mem.as_mut_ptr() as *mut u8, self.len()) }
    }
    fn at(&self, va: u64, len: usize) -> &[u8] {
        let off = (va - self.iova) as usize;
        &self.bytes()[off..off + len]
    }
}

/// What a session replay found.
struct Report {
    compared: usize,
    requests_fed: usize,
}

#[allow(clippy::too_many_lines)]
fn replay_session(name: &str, s: &Session, mtu: Mtu) -> Report {
    let tag = format!("{name} QP {:#x}", s.server_qpn);
    let parsed: Vec<ParsedFrame<'_>> = s.frames.iter().map(|c| c.parsed()).collect();
    let from_client = |i: usize| !s.frames[i].from_server;
    let is_req = |i: usize| parsed[i].repr.transport.bth.opcode.is_request();

    // Addresses from the capture.
    let (server, client) = {
        let i = (0..parsed.len()).find(|&i| from_client(i)).expect("a client frame");
        let e = &parsed[i].repr.eth;
        (HostAddr { mac: e.dst, gid: AddressVector::ipv4_gid(SERVER_IP) }, HostAddr { mac: e.src, gid: AddressVector::ipv4_gid(CLIENT_IP) })
    };
    let first_client_req = (0..parsed.len()).find(|&i| from_client(i) && is_req(i)).expect("a client request");
    let rq_psn = parsed[first_client_req].repr.transport.bth.psn;
    let sq_psn = (0..parsed.len()).find(|&i| !from_client(i) && is_req(i)).map(|i| parsed[i].repr.transport.bth.psn).unwrap_or(Psn::new(0));

    // Remote memory the client targets, by rkey: [lowest VA, highest end).
    let mut ranges: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for (i, p) in parsed.iter().enumerate() {
        if !from_client(i) {
            continue;
        }
        let t = &p.repr.transport;
        let span = t.reth.map(|r| (r.rkey, r.va, u64::from(r.dma_len))).or(t.atomic_eth.map(|a| (a.rkey, a.va, 8)));
        if let Some((rkey, va, len)) = span {
            let e = ranges.entry(rkey).or_insert((va, va + len));
            e.0 = e.0.min(va);
            e.1 = e.1.max(va + len);
        }
    }
    let table = Arc::new(MemoryTable::new());
    let mut bufs: BTreeMap<u32, Buf> = BTreeMap::new();
    for (&rkey, &(lo, hi)) in &ranges {
        let iova = lo & !0xfff;
        let mut b = Buf::new(iova, (hi - iova) as usize);
        let (ptr, len) = (b.ptr(), b.len());
        // SAFETY: `bufs` outlives the engine (dropped at the end of this function, after it).
        let keys = unsafe { table.register_with_key(PD, ptr, len, iova, ACCESS, rkey) }
            .unwrap_or_else(|e| panic!("{tag}: cannot register rkey {rkey:#x}: {e:?}"));
        assert_eq!(keys.rkey, rkey);
        bufs.insert(rkey, b);
    }
    let buf_for = |bufs: &mut BTreeMap<u32, Buf>, rkey: u32| -> *mut Buf { bufs.get_mut(&rkey).expect("rkey") as *mut Buf };

    // Pre-fill: READ responses say what the server's memory held; atomic ACKs
    // give the original values. Responses are matched to requests by PSN.
    let mut filled: BTreeMap<(u32, u64), ()> = BTreeMap::new();
    let responses: Vec<usize> = (0..parsed.len()).filter(|&i| !from_client(i) && parsed[i].repr.transport.bth.opcode.is_response()).collect();
    for (i, p) in parsed.iter().enumerate() {
        if !from_client(i) {
            continue;
        }
        let t = &p.repr.transport;
        if t.bth.opcode == Opcode::RC_READ_REQUEST {
            let r = t.reth.unwrap();
            let pkts = (r.dma_len as usize).div_ceil(mtu.bytes() as usize).max(1) as u32;
            for &j in &responses {
                let rt = &parsed[j].repr.transport;
                if !rt.bth.opcode.is_read_response() {
                    continue;
                }
                let d = rt.bth.psn.distance(t.bth.psn);
                if d < 0 || d as u32 >= pkts {
                    continue;
                }
                let va = r.va + u64::from(d as u32) * u64::from(mtu.bytes());
                if filled.insert((r.rkey, va), ()).is_none() {
                    // SAFETY: pointer into `bufs`, no other borrow alive.
                    let b = unsafe { &mut *buf_for(&mut bufs, r.rkey) };
                    let off = (va - b.iova) as usize;
                    let pl = parsed[j].payload;
                    b.bytes_mut()[off..off + pl.len()].copy_from_slice(pl);
                }
            }
        }
        if let Some(a) = t.atomic_eth {
            let resp = responses.iter().find(|&&j| {
                let rt = &parsed[j].repr.transport;
                rt.bth.opcode == Opcode::RC_ATOMIC_ACK && rt.bth.psn == t.bth.psn
            });
            if let Some(&j) = resp {
                if filled.insert((a.rkey, a.va), ()).is_none() {
                    let orig = parsed[j].repr.transport.atomic_ack.unwrap();
                    // SAFETY: as above.
                    let b = unsafe { &mut *buf_for(&mut bufs, a.rkey) };
                    let off = (a.va - b.iova) as usize;
                    // The responder's memory is in host byte order (as rxe's).
                    b.bytes_mut()[off..off + 8].copy_from_slice(&orig.to_ne_bytes());
                }
            }
        }
    }

    // Receives for the client's SENDs, and buffers for the server's own SENDs.
    let mut send_msgs: Vec<Vec<u8>> = Vec::new(); // client → server messages
    let mut cur = Vec::new();
    for (i, p) in parsed.iter().enumerate() {
        let op = p.repr.transport.bth.opcode;
        if from_client(i) && op.is_send() {
            cur.extend_from_slice(p.payload);
            if matches!(op.segment(), Segment::Last | Segment::Only) {
                send_msgs.push(std::mem::take(&mut cur));
            }
        }
    }
    let recv_size = send_msgs.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let mut recv_buf = Buf::new(0x10_0000, recv_size * send_msgs.len().max(1));
    let (rp, rl) = (recv_buf.ptr(), recv_buf.len());
    // SAFETY: `recv_buf` outlives the engine.
    let recv_keys = unsafe { table.register(PD, rp, rl, recv_buf.iova, Access::LOCAL_WRITE) }.expect("register recv");
    let mut server_msgs: Vec<Vec<u8>> = Vec::new();
    let mut cur = Vec::new();
    for (i, p) in parsed.iter().enumerate() {
        let op = p.repr.transport.bth.opcode;
        if !from_client(i) && op.is_send() {
            cur.extend_from_slice(p.payload);
            if matches!(op.segment(), Segment::Last | Segment::Only) {
                server_msgs.push(std::mem::take(&mut cur));
            }
        }
    }
    let mut send_buf = Buf::new(0x20_0000, server_msgs.iter().map(Vec::len).sum::<usize>().max(1));
    {
        let mut off = 0;
        let bytes = send_buf.bytes_mut();
        for m in &server_msgs {
            bytes[off..off + m.len()].copy_from_slice(m);
            off += m.len();
        }
    }
    let (sp, sl) = (send_buf.ptr(), send_buf.len());
    // SAFETY: `send_buf` outlives the engine.
    let send_keys = unsafe { table.register(PD, sp, sl, send_buf.iova, Access::LOCAL_WRITE) }.expect("register send");

    // The engine and its QP, numbered as the captured server's. rxe sends
    // each ACK at once (it holds none for a reply), so the replay does too:
    // frame for frame, the held ACKs would coalesce what rxe sent apart.
    let config = EngineConfig { first_qpn: s.server_qpn, ack_hold: std::time::Duration::ZERO, ..EngineConfig::default() };
    let mut engine = Engine::new(config, table.clone());
    let init = QpInitAttr {
        qp_type: QpType::Rc,
        pd: PD,
        send_cq: CqId(1),
        recv_cq: CqId(2),
        srq: None,
        cap: QpCaps { max_send_wr: 512, max_recv_wr: 512, ..QpCaps::default() },
        sq_sig_all: true,
    };
    let qpn = engine.create_qp(&init).expect("create_qp");
    assert_eq!(qpn, s.server_qpn, "{tag}: the engine must give the QP the captured QPN");
    engine
        .modify_qp(
            qpn,
            &QpAttr { qp_state: QpState::Init, qp_access_flags: ACCESS, ..QpAttr::default() },
            QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
        )
        .expect("INIT");
    for (k, _) in send_msgs.iter().enumerate() {
        let sge = Sge { addr: recv_buf.iova + (k * recv_size) as u64, length: recv_size as u32, lkey: recv_keys.lkey };
        engine.post_recv(qpn, RecvWr { wr_id: 100 + k as u64, sgl: vec![sge] }).expect("post_recv");
    }
    let params = RcParams { mtu, sq_psn, access: ACCESS, max_rd_atomic: 16, max_dest_rd_atomic: 128, ..RcParams::default() };
    bring_up_rc_from_init(&mut engine, qpn, &server, &client, s.client_qpn, rq_psn, &params).expect("RTR/RTS");

    // Replay in capture order.
    let t0 = s.frames[0].ts;
    let mut ours: Vec<Vec<u8>> = Vec::new();
    let mut buf = vec![0u8; 9216];
    let mut fed = 0;
    let mut next_send = 0;
    let mut send_off = 0usize;
    for (i, c) in s.frames.iter().enumerate() {
        let now = Instant::from_nanos(c.ts - t0 + 1_000_000_000);
        while engine.next_timeout().is_some_and(|t| t <= now) {
            engine.handle_timeout(now);
        }
        if from_client(i) {
            engine.handle_frame(now, &c.data);
            fed += usize::from(is_req(i));
        } else {
            let op = parsed[i].repr.transport.bth.opcode;
            if op.is_send() && matches!(op.segment(), Segment::First | Segment::Only) {
                let m = &server_msgs[next_send];
                let sge = Sge { addr: send_buf.iova + send_off as u64, length: m.len() as u32, lkey: send_keys.lkey };
                engine
                    .post_send(
                        qpn,
                        SendWr {
                            wr_id: 200 + next_send as u64,
                            op: SendOp::Send,
                            payload: Payload::Sgl(vec![sge]),
                            flags: SendFlags::SIGNALED,
                            ud: None,
                        },
                    )
                    .expect("post_send");
                send_off += m.len();
                next_send += 1;
            }
        }
        while let Some(n) = engine.poll_transmit(now, &mut buf) {
            ours.push(buf[..n].to_vec());
        }
    }

    // Compare every frame the server sent with ours, in order.
    let theirs: Vec<usize> = (0..parsed.len()).filter(|&i| !from_client(i)).collect();
    for (k, &i) in theirs.iter().enumerate() {
        let Some(mine) = ours.get(k) else {
            panic!("{tag}: we sent {} frames, rxe sent {}; missing the answer to capture #{}", ours.len(), theirs.len(), s.frames[i].index)
        };
        let mp = parse_frame(mine).unwrap_or_else(|e| panic!("{tag}: our frame {k} does not parse: {e:?}"));
        let want = fields(&parsed[i]);
        let got = fields(&mp);
        assert_eq!(got, want, "{tag}: frame {k} (capture #{}) differs", s.frames[i].index);
        assert!(mp.payload == parsed[i].payload, "{tag}: frame {k} (capture #{}): payload differs", s.frames[i].index);
        assert_eq!(mp.repr.eth.dst, client.mac);
        assert_eq!(mp.repr.eth.src, server.mac);
        match mp.repr.ip {
            IpRepr::V4(v4) => {
                assert_eq!((v4.src, v4.dst), (SERVER_IP, CLIENT_IP));
                assert!(v4.dont_frag);
                assert_eq!(v4.ttl, 64);
            }
            IpRepr::V6(_) => panic!("{tag}: IPv6 frame on an IPv4 path"),
        }
    }
    assert_eq!(ours.len(), theirs.len(), "{tag}: we sent {} frames, rxe sent {}", ours.len(), theirs.len());

    // Completions: one receive per client SEND with its data, one send
    // completion per server SEND; nothing else.
    let mut recv_done = Vec::new();
    let mut send_done = Vec::new();
    while let Some(c) = engine.poll_completion() {
        assert_eq!(c.wc.status, WcStatus::Success, "{tag}: {c:?}");
        match c.cq {
            CqId(2) => recv_done.push(c),
            CqId(1) => send_done.push(c),
            other => panic!("{tag}: completion on {other:?}"),
        }
    }
    assert_eq!(recv_done.len(), send_msgs.len(), "{tag}: receive completions");
    for (k, (c, m)) in recv_done.iter().zip(&send_msgs).enumerate() {
        assert_eq!(c.wc.wr_id, 100 + k as u64);
        assert_eq!(c.wc.opcode, WcOpcode::Recv);
        assert_eq!(c.wc.byte_len as usize, m.len());
        assert_eq!(c.wc.qp_num, qpn);
        assert_eq!(recv_buf.at(recv_buf.iova + (k * recv_size) as u64, m.len()), &m[..], "{tag}: received data");
    }
    assert_eq!(
        send_done.iter().map(|c| (c.wc.wr_id, c.wc.opcode)).collect::<Vec<_>>(),
        (0..server_msgs.len()).map(|k| (200 + k as u64, WcOpcode::Send)).collect::<Vec<_>>()
    );
    assert!(engine.poll_event().is_none());

    // Memory after the requests: WRITE payloads landed, atomics applied.
    let mut wva = None;
    for (i, p) in parsed.iter().enumerate() {
        if !from_client(i) {
            continue;
        }
        let t = &p.repr.transport;
        let op = t.bth.opcode;
        if op.is_write() {
            if let Some(r) = t.reth {
                wva = Some((r.rkey, r.va));
            }
            let (rkey, va) = wva.expect("WRITE FIRST/ONLY before MIDDLE/LAST");
            let b = &bufs[&rkey];
            assert_eq!(b.at(va, p.payload.len()), p.payload, "{tag}: WRITE payload at {va:#x} (capture #{})", s.frames[i].index);
            wva = Some((rkey, va + p.payload.len() as u64));
        }
    }
    // Atomics: every slot holds the value the last atomic on it left.
    let mut last: BTreeMap<(u32, u64), u64> = BTreeMap::new();
    for (i, p) in parsed.iter().enumerate() {
        let t = &p.repr.transport;
        if !from_client(i) || t.atomic_eth.is_none() {
            continue;
        }
        let a = t.atomic_eth.unwrap();
        let orig = responses
            .iter()
            .map(|&j| &parsed[j].repr.transport)
            .find(|rt| rt.bth.opcode == Opcode::RC_ATOMIC_ACK && rt.bth.psn == t.bth.psn)
            .and_then(|rt| rt.atomic_ack)
            .expect("atomic ACK in the capture");
        let new = if t.bth.opcode == Opcode::RC_FETCH_ADD {
            orig.wrapping_add(a.swap_add)
        } else if orig == a.compare {
            a.swap_add
        } else {
            orig
        };
        last.insert((a.rkey, a.va), new);
    }
    for ((rkey, va), v) in last {
        let got = u64::from_ne_bytes(bufs[&rkey].at(va, 8).try_into().unwrap());
        assert_eq!(got, v, "{tag}: atomic slot {va:#x}");
    }
    drop(engine);
    drop(table);
    Report { compared: theirs.len(), requests_fed: fed }
}

/// The path MTU of a capture: the payload of any FIRST/MIDDLE packet (they
/// carry exactly one MTU), else rxe's default for a 1500-byte netdev.
fn capture_mtu(caps: &[Cap]) -> Mtu {
    let mut mtu = None;
    for c in caps {
        let p = c.parsed();
        if matches!(p.repr.transport.bth.opcode.segment(), Segment::First | Segment::Middle) {
            let m = p.payload.len() as u32;
            assert!(mtu.is_none() || mtu == Some(m), "mixed MTUs in one capture");
            mtu = Some(m);
        }
    }
    let bytes = mtu.unwrap_or(1024);
    [Mtu::Mtu256, Mtu::Mtu512, Mtu::Mtu1024, Mtu::Mtu2048, Mtu::Mtu4096].into_iter().find(|m| m.bytes() == bytes).expect("a valid MTU")
}

fn replay(name: &str, expect_sessions: usize, expect_compared: usize) {
    let caps = load(name);
    assert!(
        caps.iter().any(|c| c.from_server && c.parsed().repr.transport.bth.opcode.is_response()),
        "{name}: the server (10.99.0.1) must be the responder"
    );
    let mtu = capture_mtu(&caps);
    let ss = sessions(&caps);
    assert_eq!(ss.len(), expect_sessions, "{name}: QP sessions");
    let mut compared = 0;
    for s in &ss {
        let r = replay_session(name, s, mtu);
        assert!(r.requests_fed > 0);
        compared += r.compared;
    }
    assert_eq!(compared, expect_compared, "{name}: server frames compared");
}

#[test]
fn rc_pingpong_server() {
    // 2 sessions (4096 B x3, 100 B x3), the server both answers and sends:
    // 6 ACKs + 12 + 3 SEND packets.
    replay("rc_pingpong.pcap", 2, 21);
}

#[test]
fn write_bw_server() {
    // 64 B, 4 KiB, 64 KiB sessions: 5 ACKs each.
    replay("write_bw.pcap", 3, 15);
}

#[test]
fn read_bw_server() {
    // 5 READ RESPONSE ONLY, 5 x 4, 5 x 64 packets.
    replay("read_bw.pcap", 3, 5 + 20 + 320);
}

#[test]
fn atomic_bw_server() {
    // 5 FETCH_ADD and 5 CMP_SWAP atomic ACKs.
    replay("atomic_bw.pcap", 2, 10);
}

#[test]
fn send_lat_server() {
    // ib_send_lat ping-pong: 5 x 64 B (SEND ONLY) and 5 x 2048 B (FIRST/LAST)
    // each way; the server answers every SEND with an ACK and sends its own.
    replay("send_lat.pcap", 2, 10 + 15);
}

#[test]
fn rc_pingpong_mtu4096_server() {
    // MTU 4096: 3 x 8192 B SENDs each way (FIRST/LAST) plus ACKs.
    replay("rc_pingpong_mtu4096.pcap", 1, 9);
}
