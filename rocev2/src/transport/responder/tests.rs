//! Responder tests: requests are hand-built with the wire `Repr`s, emitted as
//! real frames, parsed back, and fed to the responder; its responses are
//! emitted by `poll_transmit` and parsed again.

use super::*;
use crate::transport::attr::AddressVector;
use crate::transport::attr::SrqId;
use crate::transport::memory::AccessError;
use crate::transport::memory::{MrKeys, MwType};
use crate::transport::path::PathHeaders;
use crate::transport::wr::{RecvWr, Sge};
use crate::wire::parse_frame;
use crate::wire::{AethRepr, BthRepr, TransportRepr};
use crate::wire::{AtomicEthRepr, DethRepr, RethRepr};

const PD: PdId = PdId(3);

/// The creation attributes a responder test's QP has (service type, PD,
/// receive CQ).
pub(super) fn qp_init(qp_type: QpType, pd: PdId, recv_cq: CqId) -> QpInitAttr {
    QpInitAttr { qp_type, pd, send_cq: recv_cq, recv_cq, srq: None, cap: Default::default(), sq_sig_all: false }
}

/// The attributes a responder test's QP has.
pub(super) fn qp_attr(access: Access, pmtu: Mtu, qkey: u32, min_rnr_timer: u8, max_dest_rd_atomic: u8) -> QpAttr {
    QpAttr { qp_access_flags: access, path_mtu: pmtu, qkey, min_rnr_timer, max_dest_rd_atomic, ..QpAttr::default() }
}
const QPN: u32 = 0x11;
const PEER_QPN: u32 = 0x22;
const IOVA: u64 = 0x10_000;
const REGION: usize = 64 * 1024;
const QKEY: u32 = 0x1111_1111;
const ALL: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ).union(Access::REMOTE_ATOMIC).union(Access::MW_BIND);

/// A parsed response.
#[derive(Debug)]
struct Resp {
    t: TransportRepr,
    payload: Vec<u8>,
}

impl Resp {
    fn op(&self) -> Opcode {
        self.t.bth.opcode
    }
    fn psn(&self) -> u32 {
        self.t.bth.psn.value()
    }
    fn syndrome(&self) -> Option<AckSyndrome> {
        self.t.aeth.map(|a| a.syndrome)
    }
    fn msn(&self) -> u32 {
        self.t.aeth.map_or(u32::MAX, |a| a.msn)
    }
}

struct Harness {
    mem: MemoryTable,
    region: Box<[u64]>,
    mr: MrKeys,
    rq: RecvQueue,
    completions: VecDeque<Completion>,
    events: VecDeque<AsyncEvent>,
    stats: QpStats,
    resp: Responder,
    qp_type: QpType,
    access: Access,
    pmtu: Mtu,
    min_rnr_timer: u8,
    max_dest_rd_atomic: u8,
    /// Frames towards us (requests) and from us (responses).
    to_us: PathHeaders,
    to_peer: PathHeaders,
}

fn av(ipv6: bool) -> AddressVector {
    let (sgid, dgid) = if ipv6 {
        let mut a = [0u8; 16];
        a[0] = 0xfd;
        a[15] = 1;
        let mut b = a;
        b[15] = 2;
        (a, b)
    } else {
        (AddressVector::ipv4_gid([10, 0, 0, 1]), AddressVector::ipv4_gid([10, 0, 0, 2]))
    };
    AddressVector {
        dmac: [2, 0, 0, 0, 0, 2],
        smac: [2, 0, 0, 0, 0, 1],
        vlan: None,
        sgid,
        dgid,
        traffic_class: 0x68,
        hop_limit: 64,
        flow_label: 0x12345,
        udp_sport: None,
    }
}

impl Harness {
    fn new(qp_type: QpType, rq_psn: u32) -> Harness {
        Harness::with_path(qp_type, rq_psn, false)
    }

    fn with_path(qp_type: QpType, rq_psn: u32, ipv6: bool) -> Harness {
        let mem = MemoryTable::new();
        let mut region = vec![0u64; REGION / 8].into_boxed_slice();
        // SAFETY: the region lives in the harness as long as the table.
        let mr = unsafe { mem.register(PD, region.as_mut_ptr().cast(), REGION, IOVA, ALL) }.unwrap();
        let peer = av(ipv6);
        let mut back = peer;
        std::mem::swap(&mut back.sgid, &mut back.dgid);
        std::mem::swap(&mut back.smac, &mut back.dmac);
        Harness {
            mem,
            region,
            mr,
            rq: RecvQueue::new(PD, 64, 4),
            completions: VecDeque::new(),
            events: VecDeque::new(),
            stats: QpStats::default(),
            resp: Responder::new(Psn::new(rq_psn)),
            qp_type,
            access: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            pmtu: Mtu::Mtu256,
            min_rnr_timer: 12,
            max_dest_rd_atomic: 4,
            to_us: PathHeaders::new(&peer, 0xc000),
            to_peer: PathHeaders::new(&back, 0xc000),
        }
    }

    fn with<R>(&mut self, f: impl FnOnce(&mut Responder, &mut ResponderCtx<'_>, &PathHeaders) -> R) -> R {
        let init = qp_init(self.qp_type, PD, CqId(9));
        let attr = qp_attr(self.access, self.pmtu, QKEY, self.min_rnr_timer, self.max_dest_rd_atomic);
        let mut ctx = ResponderCtx {
            memory: &self.mem,
            qpn: QPN,
            init: &init,
            attr: &attr,
            recv_queue: &mut self.rq,
            completions: &mut self.completions,
            events: &mut self.events,
            stats: &mut self.stats,
        };
        f(&mut self.resp, &mut ctx, &self.to_peer)
    }

    /// Emit a request frame, parse it, hand it to the responder.
    fn req(&mut self, t: TransportRepr, payload: &[u8]) -> ResponderOutcome {
        let mut buf = vec![0u8; 9000];
        let n = self.to_us.frame(t).emit(payload, &mut buf).unwrap();
        let frame = parse_frame(&buf[..n]).unwrap();
        self.with(|r, ctx, _| r.handle_request(Instant::ZERO, ctx, &frame))
    }

    fn poll_one(&mut self) -> Option<Resp> {
        let mut buf = vec![0u8; 9000];
        let n = self.with(|r, ctx, path| r.poll_transmit(ctx, path, PEER_QPN, &mut buf))?;
        let f = parse_frame(&buf[..n]).unwrap();
        assert_eq!(f.repr.transport.bth.dest_qp, PEER_QPN);
        assert_eq!(f.repr.transport.bth.pkey, 0xffff);
        Some(Resp { t: f.repr.transport, payload: f.payload.to_vec() })
    }

    /// Every queued response.
    fn responses(&mut self) -> Vec<Resp> {
        let mut v = Vec::new();
        while let Some(r) = self.poll_one() {
            v.push(r);
            assert!(v.len() < 10_000, "responder never runs dry");
        }
        assert!(!self.resp.has_pending());
        v
    }

    fn post(&mut self, wr_id: u64, sgl: &[(u64, u32)]) {
        let lkey = self.mr.lkey;
        let sgl = sgl.iter().map(|&(addr, length)| Sge { addr, length, lkey }).collect();
        self.rq.post(RecvWr { wr_id, sgl }).unwrap();
    }

    fn bytes(&self, va: u64, len: usize) -> Vec<u8> {
        let all: Vec<u8> = self.region.iter().flat_map(|w| w.to_ne_bytes()).collect();
        let off = (va - IOVA) as usize;
        all[off..off + len].to_vec()
    }

    fn fill(&mut self, va: u64, data: &[u8]) {
        self.mem.remote_write(PD, QPN, self.mr.rkey, va, data).unwrap();
    }

    fn word(&self, va: u64) -> u64 {
        self.region[((va - IOVA) / 8) as usize]
    }

    fn all_zero(&self) -> bool {
        self.region.iter().all(|&w| w == 0)
    }
}

fn tr(op: Opcode, psn: u32, ack_req: bool) -> TransportRepr {
    TransportRepr::bth_only(BthRepr { ack_req, ..BthRepr::new(op, QPN, Psn::new(psn)) })
}

fn with_reth(mut t: TransportRepr, va: u64, rkey: u32, dma_len: u32) -> TransportRepr {
    t.reth = Some(RethRepr { va, rkey, dma_len });
    t
}

fn atomic(op: Opcode, psn: u32, va: u64, rkey: u32, swap_add: u64, compare: u64) -> TransportRepr {
    let mut t = tr(op, psn, true);
    t.atomic_eth = Some(AtomicEthRepr { va, rkey, swap_add, compare });
    t
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

const ACK: AckSyndrome = AckSyndrome::Ack { credits: 31 };
const NAK_SEQ: AckSyndrome = AckSyndrome::Nak(NakCode::PsnSequenceError);
const NAK_INV: AckSyndrome = AckSyndrome::Nak(NakCode::InvalidRequest);
const NAK_ACC: AckSyndrome = AckSyndrome::Nak(NakCode::RemoteAccessError);
const NAK_OP: AckSyndrome = AckSyndrome::Nak(NakCode::RemoteOperationalError);

// ---------------------------------------------------------------- SEND

#[test]
fn send_only_places_data_completes_and_acks() {
    let mut h = Harness::new(QpType::Rc, 100);
    h.post(7, &[(IOVA + 0x100, 64)]);
    let data = pattern(40, 1);
    assert_eq!(h.req(tr(Opcode::RC_SEND_ONLY, 100, true), &data), ResponderOutcome::Ok);
    assert_eq!(h.bytes(IOVA + 0x100, 40), data);
    let c = h.completions.pop_front().unwrap();
    assert_eq!(c.cq, CqId(9));
    assert_eq!(c.wc.wr_id, 7);
    assert_eq!(c.wc.status, WcStatus::Success);
    assert_eq!(c.wc.opcode, WcOpcode::Recv);
    assert_eq!(c.wc.byte_len, 40);
    assert_eq!(c.wc.qp_num, QPN);
    assert_eq!(c.wc.imm_data, None);
    assert!(!c.solicited);
    let r = h.responses();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].op(), Opcode::RC_ACK);
    assert_eq!(r[0].psn(), 100);
    assert_eq!(r[0].syndrome(), Some(ACK));
    assert_eq!(r[0].msn(), 1);
    assert_eq!(h.resp.expected_psn(), Psn::new(101));
    assert_eq!(h.stats.resp_acks_sent, 1);
}

#[test]
fn multi_packet_send_scatters_across_sges_with_imm_and_se() {
    let mut h = Harness::new(QpType::Rc, 0);
    // Two SGEs: 300 + 400 bytes, message 256 + 256 + 100 = 612 bytes.
    h.post(1, &[(IOVA, 300), (IOVA + 0x1000, 400)]);
    let data = pattern(612, 9);
    h.req(tr(Opcode::RC_SEND_FIRST, 0, false), &data[..256]);
    h.req(tr(Opcode::RC_SEND_MIDDLE, 1, false), &data[256..512]);
    assert!(h.completions.is_empty(), "no completion before LAST");
    let mut last = tr(Opcode::RC_SEND_LAST_IMM, 2, true);
    last.immediate = Some(0xdead_beef);
    last.bth.solicited = true;
    h.req(last, &data[512..]);
    assert_eq!(h.bytes(IOVA, 300), data[..300]);
    assert_eq!(h.bytes(IOVA + 0x1000, 312), data[300..]);
    let c = h.completions.pop_front().unwrap();
    assert_eq!((c.wc.byte_len, c.wc.imm_data, c.solicited), (612, Some(0xdead_beef), true));
    let r = h.responses();
    assert_eq!(r.len(), 1, "only the AckReq packet is acknowledged");
    assert_eq!((r[0].psn(), r[0].msn()), (2, 1));
}

#[test]
fn acks_coalesce_while_not_polled() {
    let mut h = Harness::new(QpType::Rc, 0);
    for i in 0..3 {
        h.post(i, &[(IOVA, 64)]);
        h.req(tr(Opcode::RC_SEND_ONLY, i as u32, true), b"x");
    }
    let r = h.responses();
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].psn(), r[0].msn(), r[0].syndrome()), (2, 3, Some(ACK)));
    assert_eq!(h.completions.len(), 3);
}

#[test]
fn rnr_nak_without_wqe_then_retry_succeeds() {
    let mut h = Harness::new(QpType::Rc, 50);
    assert_eq!(h.req(tr(Opcode::RC_SEND_FIRST, 50, false), &pattern(256, 0)), ResponderOutcome::Ok);
    // The requester had already sent the rest: dropped silently, no sequence NAK.
    h.req(tr(Opcode::RC_SEND_LAST, 51, true), b"tail");
    let r = h.responses();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].syndrome(), Some(AckSyndrome::RnrNak { timer: 12 }));
    assert_eq!((r[0].psn(), r[0].msn()), (50, 0));
    assert_eq!(h.resp.expected_psn(), Psn::new(50), "no state change");
    assert!(h.completions.is_empty());
    assert_eq!(h.stats.resp_rnr_naks_sent, 1);
    assert_eq!(h.stats.resp_out_of_seq_dropped, 1);
    // Retry after posting.
    h.post(5, &[(IOVA, 512)]);
    h.req(tr(Opcode::RC_SEND_FIRST, 50, false), &pattern(256, 0));
    h.req(tr(Opcode::RC_SEND_LAST, 51, true), b"tail");
    let c = h.completions.pop_front().unwrap();
    assert_eq!((c.wc.wr_id, c.wc.byte_len), (5, 260));
    let r = h.responses();
    assert_eq!((r[0].psn(), r[0].msn(), r[0].syndrome()), (51, 1, Some(ACK)));
}

#[test]
fn send_longer_than_wqe_is_a_length_error() {
    let mut h = Harness::new(QpType::Rc, 0);
    h.post(3, &[(IOVA, 16)]);
    h.post(4, &[(IOVA + 64, 16)]);
    let out = h.req(tr(Opcode::RC_SEND_ONLY, 0, true), &pattern(17, 0));
    assert_eq!(out, ResponderOutcome::QpError(WcStatus::LocLenErr));
    let c = h.completions.pop_front().unwrap();
    assert_eq!((c.wc.wr_id, c.wc.status, c.wc.opcode), (3, WcStatus::LocLenErr, WcOpcode::Recv));
    let r = h.responses();
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].psn(), r[0].syndrome()), (0, Some(NAK_INV)));
    assert!(h.all_zero(), "nothing placed");
    // In error: further requests are dropped.
    h.req(tr(Opcode::RC_SEND_ONLY, 1, true), b"x");
    assert!(h.responses().is_empty());
    assert_eq!(h.stats.resp_dropped_in_error, 1);
    // Flush completes the rest of the RQ.
    h.with(|r, ctx, _| r.flush(ctx));
    let c = h.completions.pop_front().unwrap();
    assert_eq!((c.wc.wr_id, c.wc.status), (4, WcStatus::WrFlushErr));
}

#[test]
fn bad_receive_sge_is_a_remote_operational_error() {
    let mut h = Harness::new(QpType::Rc, 0);
    h.rq.post(RecvWr { wr_id: 1, sgl: vec![Sge { addr: IOVA, length: 64, lkey: h.mr.lkey ^ 0x80 }] }).unwrap();
    let out = h.req(tr(Opcode::RC_SEND_ONLY, 0, true), b"data");
    assert_eq!(out, ResponderOutcome::QpError(WcStatus::LocProtErr));
    assert_eq!(h.completions.pop_front().unwrap().wc.status, WcStatus::LocProtErr);
    assert_eq!(h.responses()[0].syndrome(), Some(NAK_OP));
}

#[test]
fn send_with_invalidate_invalidates_the_window() {
    let mut h = Harness::new(QpType::Rc, 0);
    let mw = h.mem.alloc_mw(PD, MwType::Type2).unwrap();
    let rkey = h.mem.bind_mw(PD, QPN, mw, 0x33, h.mr.lkey, IOVA, 64, Access::REMOTE_READ).unwrap();
    h.post(1, &[(IOVA + 0x100, 16)]);
    let mut t = tr(Opcode::RC_SEND_ONLY_INV, 0, true);
    t.invalidate_rkey = Some(rkey);
    assert_eq!(h.req(t, b"bye"), ResponderOutcome::Ok);
    let c = h.completions.pop_front().unwrap();
    assert_eq!((c.wc.status, c.wc.invalidated_rkey, c.wc.byte_len), (WcStatus::Success, Some(rkey), 3));
    assert_eq!(h.mem.remote_check(PD, QPN, rkey, IOVA, 1, Access::REMOTE_READ), Err(AccessError::Invalidated));
    // Invalidating it again fails: invalid request, QP error.
    h.post(2, &[(IOVA + 0x100, 16)]);
    let mut t = tr(Opcode::RC_SEND_ONLY_INV, 1, true);
    t.invalidate_rkey = Some(rkey);
    assert_eq!(h.req(t, b"again"), ResponderOutcome::QpError(WcStatus::RemInvReqErr));
    assert_eq!(h.completions.pop_front().unwrap().wc.status, WcStatus::RemInvReqErr);
    let r = h.responses();
    assert_eq!(r.last().unwrap().syndrome(), Some(NAK_INV));
    assert_eq!(r.last().unwrap().psn(), 1);
}

// ---------------------------------------------------------------- WRITE

#[test]
fn write_first_middle_last_places_at_running_va() {
    let mut h = Harness::new(QpType::Rc, 0);
    let data = pattern(600, 3);
    let rkey = h.mr.rkey;
    h.req(with_reth(tr(Opcode::RC_WRITE_FIRST, 0, false), IOVA + 0x2000, rkey, 600), &data[..256]);
    h.req(tr(Opcode::RC_WRITE_MIDDLE, 1, false), &data[256..512]);
    h.req(tr(Opcode::RC_WRITE_LAST, 2, true), &data[512..]);
    assert_eq!(h.bytes(IOVA + 0x2000, 600), data);
    assert!(h.completions.is_empty(), "WRITE without imm completes nothing at the responder");
    let r = h.responses();
    assert_eq!((r.len(), r[0].psn(), r[0].msn()), (1, 2, 1));
    assert_eq!(h.stats.resp_bytes_placed, 600);
}

/// A WRITE's packets after FIRST are placed through the R_Key's resolution
/// made at FIRST only while the memory table is unchanged: a MIDDLE after
/// the target's deregistration is a remote access error (as when every
/// packet resolved the key), and one after the key was registered again
/// over other memory lands in that memory, never in the old.
#[test]
fn write_target_changed_mid_message_is_resolved_again() {
    let data = pattern(768, 5);
    // A 768-byte WRITE's FIRST placed, then its target deregistered.
    let first_then_deregistered = || {
        let mut h = Harness::new(QpType::Rc, 0);
        let rkey = h.mr.rkey;
        h.req(with_reth(tr(Opcode::RC_WRITE_FIRST, 0, false), IOVA + 0x2000, rkey, 768), &data[..256]);
        h.mem.deregister(h.mr.lkey).unwrap();
        (h, rkey)
    };

    let (mut h, _) = first_then_deregistered();
    let out = h.req(tr(Opcode::RC_WRITE_MIDDLE, 1, false), &data[256..512]);
    assert_eq!(out, ResponderOutcome::QpError(WcStatus::RemAccessErr));
    let r = h.responses();
    assert_eq!((r.len(), r[0].psn(), r[0].syndrome()), (1, 1, Some(NAK_ACC)));
    assert_eq!(h.bytes(IOVA + 0x2000 + 256, 256), vec![0; 256], "the MIDDLE was placed");

    let (mut h, rkey) = first_then_deregistered();
    let mut other = vec![0u64; REGION / 8].into_boxed_slice();
    // SAFETY: `other` stays alive until after its deregistration below.
    let k = unsafe { h.mem.register_with_key(PD, other.as_mut_ptr().cast(), REGION, IOVA, ALL, h.mr.lkey) }.unwrap();
    assert_eq!(k.rkey, rkey);
    assert_eq!(h.req(tr(Opcode::RC_WRITE_MIDDLE, 1, false), &data[256..512]), ResponderOutcome::Ok);
    assert_eq!(h.req(tr(Opcode::RC_WRITE_LAST, 2, true), &data[512..]), ResponderOutcome::Ok);
    let mut placed = vec![0u8; 512];
    h.mem.remote_read(PD, QPN, rkey, IOVA + 0x2000 + 256, &mut placed).unwrap();
    assert_eq!(placed, data[256..], "not in the memory registered now");
    assert_eq!(h.bytes(IOVA + 0x2000, 768), [&data[..256], &[0; 512]].concat(), "the old memory was written after its deregistration");
    h.mem.deregister(k.lkey).unwrap();
    drop(other);
}

#[test]
fn write_access_violations_nak_and_leave_memory_untouched() {
    let ro = |h: &mut Harness| {
        let p = h.region.as_mut_ptr().cast::<u8>();
        // SAFETY: same region, alive as long as the harness.
        unsafe { h.mem.register(PD, p, 4096, 0x90_000, Access::REMOTE_READ) }.unwrap().rkey
    };
    let other_pd = |h: &mut Harness| {
        let p = h.region.as_mut_ptr().cast::<u8>();
        // SAFETY: as above.
        unsafe { h.mem.register(PdId(99), p, 4096, IOVA, ALL) }.unwrap().rkey
    };
    type Case = (&'static str, fn(&mut Harness) -> (u64, u32, u32));
    let cases: [Case; 5] = [
        ("bad key", |h| (IOVA, h.mr.rkey ^ 0x40, 8)),
        ("stale key byte", |h| (IOVA, h.mr.rkey.wrapping_add(1), 8)),
        ("out of bounds", |h| (IOVA + REGION as u64 - 4, h.mr.rkey, 8)),
        ("below region", |h| (IOVA - 8, h.mr.rkey, 8)),
        ("va overflow", |h| (u64::MAX - 2, h.mr.rkey, 8)),
    ];
    for (name, case) in cases {
        let mut h = Harness::new(QpType::Rc, 7);
        let (va, rkey, len) = case(&mut h);
        let out = h.req(with_reth(tr(Opcode::RC_WRITE_ONLY, 7, true), va, rkey, len), &[0xaa; 8]);
        assert_eq!(out, ResponderOutcome::QpError(WcStatus::RemAccessErr), "{name}");
        let r = h.responses();
        assert_eq!((r.len(), r[0].psn(), r[0].syndrome()), (1, 7, Some(NAK_ACC)), "{name}");
        assert!(h.all_zero(), "{name}: target untouched");
    }
    // No REMOTE_WRITE on the MR; another PD's key.
    for which in 0..2 {
        let mut h = Harness::new(QpType::Rc, 0);
        let (va, rkey) = if which == 0 { (0x90_000, ro(&mut h)) } else { (IOVA, other_pd(&mut h)) };
        let out = h.req(with_reth(tr(Opcode::RC_WRITE_ONLY, 0, true), va, rkey, 4), &[1; 4]);
        assert_eq!(out, ResponderOutcome::QpError(WcStatus::RemAccessErr));
        assert!(h.all_zero());
    }
    // The whole DMA length is checked at FIRST: a first packet that would fit is not written.
    let mut h = Harness::new(QpType::Rc, 0);
    let rkey = h.mr.rkey;
    let va = IOVA + REGION as u64 - 300;
    let out = h.req(with_reth(tr(Opcode::RC_WRITE_FIRST, 0, false), va, rkey, 600), &[0x55; 256]);
    assert_eq!(out, ResponderOutcome::QpError(WcStatus::RemAccessErr));
    assert!(h.all_zero());
}

#[test]
fn write_to_qp_without_remote_write_is_an_invalid_request() {
    let mut h = Harness::new(QpType::Rc, 0);
    h.access = Access::REMOTE_READ;
    let rkey = h.mr.rkey;
    let out = h.req(with_reth(tr(Opcode::RC_WRITE_ONLY, 0, true), IOVA, rkey, 4), b"abcd");
    assert_eq!(out, ResponderOutcome::QpError(WcStatus::RemInvReqErr));
    assert_eq!(h.responses()[0].syndrome(), Some(NAK_INV));
    assert!(h.all_zero());
    assert_eq!(h.stats.resp_naks_inv_req_sent, 1);
}

#[test]
fn write_with_imm_consumes_a_wqe_or_rnr() {
    let mut h = Harness::new(QpType::Rc, 0);
    let rkey = h.mr.rkey;
    let mut t = with_reth(tr(Opcode::RC_WRITE_ONLY_IMM, 0, true), IOVA + 8, rkey, 5);
    t.immediate = Some(77);
    // No WQE: RNR, target untouched.
    h.req(t, b"hello");
    let r = h.responses();
    assert_eq!(r[0].syndrome(), Some(AckSyndrome::RnrNak { timer: 12 }));
    assert!(h.all_zero());
    h.post(11, &[]);
    h.req(t, b"hello");
    assert_eq!(h.bytes(IOVA + 8, 5), b"hello");
    let c = h.completions.pop_front().unwrap();
    assert_eq!((c.wc.wr_id, c.wc.opcode, c.wc.byte_len, c.wc.imm_data), (11, WcOpcode::RecvRdmaWithImm, 5, Some(77)));
    assert_eq!(h.responses()[0].syndrome(), Some(ACK));
}

#[test]
fn write_last_imm_rnr_keeps_state_and_retry_completes() {
    let mut h = Harness::new(QpType::Rc, 0);
    let rkey = h.mr.rkey;
    let data = pattern(300, 5);
    h.req(with_reth(tr(Opcode::RC_WRITE_FIRST, 0, false), IOVA, rkey, 300), &data[..256]);
    let mut last = tr(Opcode::RC_WRITE_LAST_IMM, 1, true);
    last.immediate = Some(5);
    h.req(last, &data[256..]);
    let r = h.responses();
    assert_eq!((r[0].psn(), r[0].syndrome()), (1, Some(AckSyndrome::RnrNak { timer: 12 })));
    assert_eq!(h.bytes(IOVA + 256, 44), vec![0; 44], "LAST not placed");
    h.post(1, &[]);
    h.req(last, &data[256..]);
    assert_eq!(h.bytes(IOVA, 300), data);
    let c = h.completions.pop_front().unwrap();
    assert_eq!((c.wc.opcode, c.wc.byte_len), (WcOpcode::RecvRdmaWithImm, 300));
}

#[test]
fn zero_length_write_needs_no_key() {
    let mut h = Harness::new(QpType::Rc, 0);
    assert_eq!(h.req(with_reth(tr(Opcode::RC_WRITE_ONLY, 0, true), 0, 0xdead_0000, 0), &[]), ResponderOutcome::Ok);
    assert_eq!(h.responses()[0].syndrome(), Some(ACK));
}

// ---------------------------------------------------------------- sequence and length rules

#[test]
fn opcode_sequence_and_length_errors_are_invalid_requests() {
    let rkey_of = |h: &Harness| h.mr.rkey;
    type Case = (&'static str, fn(&mut Harness, u32) -> ResponderOutcome);
    let cases: [Case; 9] = [
        ("MIDDLE without FIRST", |h, _| h.req(tr(Opcode::RC_SEND_MIDDLE, 0, false), &[0; 256])),
        ("LAST without FIRST", |h, _| h.req(tr(Opcode::RC_WRITE_LAST, 0, true), &[0; 4])),
        ("FIRST inside a message", |h, _| {
            h.post(1, &[(IOVA, 4096)]);
            h.req(tr(Opcode::RC_SEND_FIRST, 0, false), &[0; 256]);
            h.req(tr(Opcode::RC_SEND_FIRST, 1, false), &[0; 256])
        }),
        ("READ inside a SEND", |h, k| {
            h.post(1, &[(IOVA, 4096)]);
            h.req(tr(Opcode::RC_SEND_FIRST, 0, false), &[0; 256]);
            h.req(with_reth(tr(Opcode::RC_READ_REQUEST, 1, false), IOVA, k, 4), &[])
        }),
        ("WRITE MIDDLE inside a SEND", |h, _| {
            h.post(1, &[(IOVA, 4096)]);
            h.req(tr(Opcode::RC_SEND_FIRST, 0, false), &[0; 256]);
            h.req(tr(Opcode::RC_WRITE_MIDDLE, 1, false), &[0; 256])
        }),
        ("short FIRST", |h, _| {
            h.post(1, &[(IOVA, 4096)]);
            h.req(tr(Opcode::RC_SEND_FIRST, 0, false), &[0; 252])
        }),
        ("long ONLY", |h, _| {
            h.post(1, &[(IOVA, 4096)]);
            h.req(tr(Opcode::RC_SEND_ONLY, 0, false), &[0; 260])
        }),
        ("WRITE ONLY shorter than its RETH", |h, k| h.req(with_reth(tr(Opcode::RC_WRITE_ONLY, 0, true), IOVA, k, 8), &[0; 4])),
        ("WRITE LAST past the RETH length", |h, k| {
            h.req(with_reth(tr(Opcode::RC_WRITE_FIRST, 0, false), IOVA, k, 300), &[0; 256]);
            h.req(tr(Opcode::RC_WRITE_LAST, 1, true), &[0; 48])
        }),
    ];
    for (name, case) in cases {
        let mut h = Harness::new(QpType::Rc, 0);
        let k = rkey_of(&h);
        let out = case(&mut h, k);
        assert_eq!(out, ResponderOutcome::QpError(WcStatus::RemInvReqErr), "{name}");
        let r = h.responses();
        assert_eq!(r.last().unwrap().syndrome(), Some(NAK_INV), "{name}");
        // A SEND in progress completes in error.
        if let Some(c) = h.completions.pop_front() {
            assert_eq!(c.wc.status, WcStatus::RemInvReqErr, "{name}");
        }
    }
}

// ---------------------------------------------------------------- PSN rules

#[test]
fn psn_ahead_gets_one_nak_then_silence() {
    let mut h = Harness::new(QpType::Rc, 10);
    for i in 0..4 {
        h.post(i, &[(IOVA, 64)]);
    }
    h.req(tr(Opcode::RC_SEND_ONLY, 12, true), b"a");
    h.req(tr(Opcode::RC_SEND_ONLY, 13, true), b"b");
    h.req(tr(Opcode::RC_SEND_ONLY, 14, true), b"c");
    let r = h.responses();
    assert_eq!(r.len(), 1, "exactly one NAK");
    assert_eq!((r[0].psn(), r[0].syndrome(), r[0].msn()), (10, Some(NAK_SEQ), 0));
    assert_eq!(h.stats.resp_out_of_seq_dropped, 2);
    assert!(h.completions.is_empty());
    // The expected PSN arrives: processed, and the NAK is re-armed.
    h.req(tr(Opcode::RC_SEND_ONLY, 10, true), b"x");
    h.req(tr(Opcode::RC_SEND_ONLY, 12, true), b"y");
    let r = h.responses();
    assert_eq!(r.len(), 2);
    assert_eq!((r[0].psn(), r[0].syndrome()), (10, Some(ACK)));
    assert_eq!((r[1].psn(), r[1].syndrome()), (11, Some(NAK_SEQ)));
    assert_eq!(h.completions.len(), 1);
    assert_eq!(h.stats.resp_naks_psn_seq_sent, 2);
}

#[test]
fn duplicate_send_is_reacked_not_executed() {
    let mut h = Harness::new(QpType::Rc, 0);
    h.post(1, &[(IOVA, 64)]);
    h.post(2, &[(IOVA + 64, 64)]);
    h.post(3, &[(IOVA + 128, 64)]);
    h.req(tr(Opcode::RC_SEND_ONLY, 0, true), b"one");
    h.req(tr(Opcode::RC_SEND_ONLY, 1, true), b"two");
    h.responses();
    h.req(tr(Opcode::RC_SEND_ONLY, 0, true), b"DUP");
    let r = h.responses();
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].psn(), r[0].syndrome(), r[0].msn()), (1, Some(ACK), 2), "re-ACK of the last executed PSN");
    assert_eq!(h.completions.len(), 2);
    assert_eq!(h.rq.len(), 1, "no WQE consumed by the duplicate");
    assert_eq!(h.bytes(IOVA, 3), b"one");
    assert_eq!(h.stats.resp_duplicates, 1);
    // A duplicate WRITE neither writes again.
    let rkey = h.mr.rkey;
    h.req(with_reth(tr(Opcode::RC_WRITE_ONLY, 1, true), IOVA + 0x800, rkey, 3), b"zzz");
    assert_eq!(h.bytes(IOVA + 0x800, 3), vec![0; 3]);
    assert_eq!(h.responses()[0].psn(), 1);
}

#[test]
fn psn_wraps_at_2_pow_24() {
    let mut h = Harness::new(QpType::Rc, 0xff_fffe);
    for i in 0..3 {
        h.post(i, &[(IOVA, 64)]);
    }
    for psn in [0xff_fffe, 0xff_ffff, 0] {
        assert_eq!(h.req(tr(Opcode::RC_SEND_ONLY, psn, true), b"w"), ResponderOutcome::Ok);
    }
    assert_eq!(h.completions.len(), 3);
    assert_eq!(h.resp.expected_psn(), Psn::new(1));
    assert_eq!(h.responses()[0].psn(), 0);
    // A READ straddling the wrap: PSNs 1.. are fine; start one at 0xffffff via a fresh responder.
    let mut h = Harness::new(QpType::Rc, 0xff_ffff);
    let rkey = h.mr.rkey;
    h.fill(IOVA, &pattern(600, 2));
    h.req(with_reth(tr(Opcode::RC_READ_REQUEST, 0xff_ffff, true), IOVA, rkey, 600), &[]);
    let r = h.responses();
    assert_eq!(r.iter().map(Resp::psn).collect::<Vec<_>>(), vec![0xff_ffff, 0, 1]);
    assert_eq!(h.resp.expected_psn(), Psn::new(2));
    // 0xffffff is now behind: a duplicate (replayed), not a sequence error.
    h.req(with_reth(tr(Opcode::RC_READ_REQUEST, 0xff_ffff, true), IOVA, rkey, 600), &[]);
    let r = h.responses();
    assert_eq!(r.len(), 3);
    assert_eq!(r[0].op(), Opcode::RC_READ_RESPONSE_FIRST);
    assert_eq!(h.stats.resp_naks_psn_seq_sent, 0);
}

#[test]
fn msn_wraps_at_24_bits() {
    let mut h = Harness::new(QpType::Rc, 0);
    h.resp.msn = MSN_MASK;
    h.post(1, &[(IOVA, 8)]);
    h.req(tr(Opcode::RC_SEND_ONLY, 0, true), b"m");
    assert_eq!(h.responses()[0].msn(), 0);
    assert_eq!(h.resp.msn(), 0);
}

// ---------------------------------------------------------------- READ

#[test]
fn read_is_answered_packet_by_packet_from_memory() {
    let mut h = Harness::new(QpType::Rc, 20);
    let data = pattern(640, 4);
    h.fill(IOVA + 0x400, &data);
    let rkey = h.mr.rkey;
    assert_eq!(h.req(with_reth(tr(Opcode::RC_READ_REQUEST, 20, true), IOVA + 0x400, rkey, 640), &[]), ResponderOutcome::Ok);
    assert_eq!(h.resp.expected_psn(), Psn::new(23), "a READ uses one PSN per response");
    let first = h.poll_one().unwrap();
    assert_eq!((first.op(), first.psn(), first.msn()), (Opcode::RC_READ_RESPONSE_FIRST, 20, 1));
    assert_eq!(first.syndrome(), Some(ACK));
    assert_eq!(first.payload, data[..256]);
    assert!(h.resp.has_pending());
    // Responses are read lazily: a change now shows in the next packets.
    h.fill(IOVA + 0x400 + 256, b"LIVE");
    let mid = h.poll_one().unwrap();
    assert_eq!((mid.op(), mid.psn(), mid.t.aeth), (Opcode::RC_READ_RESPONSE_MIDDLE, 21, None));
    assert_eq!(&mid.payload[..4], b"LIVE");
    assert_eq!(mid.payload[4..], data[260..512]);
    let last = h.poll_one().unwrap();
    assert_eq!((last.op(), last.psn(), last.msn()), (Opcode::RC_READ_RESPONSE_LAST, 22, 1));
    assert_eq!(last.payload, data[512..]);
    assert!(h.poll_one().is_none());
    assert_eq!(h.stats.resp_read_responses_sent, 3);
}

#[test]
fn read_only_and_zero_length_read() {
    let mut h = Harness::new(QpType::Rc, 0);
    h.fill(IOVA, b"0123456789");
    let rkey = h.mr.rkey;
    h.req(with_reth(tr(Opcode::RC_READ_REQUEST, 0, true), IOVA + 1, rkey, 7), &[]);
    // Zero-length: one RESPONSE ONLY without payload, no key needed.
    h.req(with_reth(tr(Opcode::RC_READ_REQUEST, 1, true), 0, 0, 0), &[]);
    let r = h.responses();
    assert_eq!(r.len(), 2);
    assert_eq!((r[0].op(), r[0].psn(), r[0].msn(), &r[0].payload[..]), (Opcode::RC_READ_RESPONSE_ONLY, 0, 1, &b"1234567"[..]));
    assert_eq!((r[1].op(), r[1].psn(), r[1].msn(), r[1].payload.len()), (Opcode::RC_READ_RESPONSE_ONLY, 1, 2, 0));
    assert_eq!(h.resp.expected_psn(), Psn::new(2));
}

/// Small READ responses take their ICRC in one run over headers and payload
/// (the source can copy without the CRC): every frame, across the one-run
/// limit, is byte for byte the frame whose ICRC runs over the headers and is
/// continued over the payload as it is copied.
#[test]
fn small_read_responses_are_the_two_run_frames() {
    let mut h = Harness::new(QpType::Rc, 0);
    let data = pattern(200, 9);
    h.fill(IOVA, &data);
    let rkey = h.mr.rkey;
    for (psn, len) in (0..=100u32).enumerate() {
        h.req(with_reth(tr(Opcode::RC_READ_REQUEST, psn as u32, true), IOVA + 3, rkey, len), &[]);
        let mut got = vec![0u8; 9000];
        let n = h.with(|r, ctx, path| r.poll_transmit(ctx, path, PEER_QPN, &mut got)).expect("a response");
        let f = parse_frame(&got[..n]).expect("a valid frame, ICRC included");
        assert_eq!((f.repr.transport.bth.opcode, f.payload), (Opcode::RC_READ_RESPONSE_ONLY, &data[3..3 + len as usize]));
        let mut want = vec![0u8; 9000];
        let src = &data[3..3 + len as usize];
        let m = h
            .to_peer
            .emit_with_crc(f.repr.transport, len as usize, &mut want, |dst: &mut [u8], crc: u32| {
                dst.copy_from_slice(src);
                crate::wire::crc::update(crc, dst)
            })
            .unwrap();
        assert_eq!(got[..n], want[..m], "{len}-byte READ response");
    }
}

#[test]
fn read_access_violations_nak() {
    for (name, qp_access, va, key_delta, expect) in [
        ("QP without REMOTE_READ", Access::REMOTE_WRITE, IOVA, 0u32, NAK_INV),
        ("bad key", Access::REMOTE_READ, IOVA, 0x80, NAK_ACC),
        ("out of bounds", Access::REMOTE_READ, IOVA + REGION as u64 - 10, 0, NAK_ACC),
    ] {
        let mut h = Harness::new(QpType::Rc, 0);
        h.access = qp_access;
        let rkey = h.mr.rkey ^ key_delta;
        let out = h.req(with_reth(tr(Opcode::RC_READ_REQUEST, 0, true), va, rkey, 64), &[]);
        assert!(matches!(out, ResponderOutcome::QpError(_)), "{name}");
        let r = h.responses();
        assert_eq!(r.len(), 1, "{name}: only the NAK");
        assert_eq!((r[0].op(), r[0].syndrome()), (Opcode::RC_ACK, Some(expect)), "{name}");
    }
    // max_dest_rd_atomic 0: no READs accepted.
    let mut h = Harness::new(QpType::Rc, 0);
    h.max_dest_rd_atomic = 0;
    let rkey = h.mr.rkey;
    let out = h.req(with_reth(tr(Opcode::RC_READ_REQUEST, 0, true), IOVA, rkey, 8), &[]);
    assert_eq!(out, ResponderOutcome::QpError(WcStatus::RemInvReqErr));
}

#[test]
fn duplicate_read_replays_mid_message() {
    let mut h = Harness::new(QpType::Rc, 100);
    let data = pattern(700, 8);
    h.fill(IOVA, &data);
    let rkey = h.mr.rkey;
    h.req(with_reth(tr(Opcode::RC_READ_REQUEST, 100, true), IOVA, rkey, 700), &[]);
    assert_eq!(h.responses().len(), 3);
    // The requester lost the FIRST response only and asks again for everything.
    h.req(with_reth(tr(Opcode::RC_READ_REQUEST, 100, true), IOVA, rkey, 700), &[]);
    let r = h.responses();
    assert_eq!(
        r.iter().map(|x| (x.op(), x.psn())).collect::<Vec<_>>(),
        vec![(Opcode::RC_READ_RESPONSE_FIRST, 100), (Opcode::RC_READ_RESPONSE_MIDDLE, 101), (Opcode::RC_READ_RESPONSE_LAST, 102)]
    );
    assert_eq!(r.iter().flat_map(|x| x.payload.clone()).collect::<Vec<_>>(), data);
    // It lost the MIDDLE and LAST: re-issues from PSN 101 at the matching offset.
    h.req(with_reth(tr(Opcode::RC_READ_REQUEST, 101, true), IOVA + 256, rkey, 444), &[]);
    let r = h.responses();
    assert_eq!(
        r.iter().map(|x| (x.op(), x.psn())).collect::<Vec<_>>(),
        vec![(Opcode::RC_READ_RESPONSE_MIDDLE, 101), (Opcode::RC_READ_RESPONSE_LAST, 102)]
    );
    assert_eq!(r[0].payload, data[256..512]);
    assert_eq!(r[1].payload, data[512..]);
    assert_eq!(r[1].msn(), 1);
    // Only the LAST: a single LAST response.
    h.req(with_reth(tr(Opcode::RC_READ_REQUEST, 102, true), IOVA + 512, rkey, 188), &[]);
    let r = h.responses();
    assert_eq!((r.len(), r[0].op(), r[0].psn()), (1, Opcode::RC_READ_RESPONSE_LAST, 102));
    assert_eq!(r[0].payload, data[512..]);
    assert_eq!(h.stats.resp_read_replays, 3);
    assert_eq!(h.resp.expected_psn(), Psn::new(103), "replays do not move the expected PSN");
    // Not a subset of the original, another key, responses past its PSN range: dropped.
    h.req(with_reth(tr(Opcode::RC_READ_REQUEST, 101, true), IOVA + 256, rkey, 445), &[]);
    h.req(with_reth(tr(Opcode::RC_READ_REQUEST, 100, true), IOVA, rkey ^ 0x100, 700), &[]);
    h.req(with_reth(tr(Opcode::RC_READ_REQUEST, 102, true), IOVA + 256, rkey, 444), &[]);
    assert!(h.responses().is_empty());
    assert_eq!(h.stats.resp_dup_no_resource_dropped, 3);
}

#[test]
fn oldest_resource_is_reused() {
    let mut h = Harness::new(QpType::Rc, 0);
    h.max_dest_rd_atomic = 2;
    let rkey = h.mr.rkey;
    for psn in 0..3 {
        h.req(with_reth(tr(Opcode::RC_READ_REQUEST, psn, true), IOVA, rkey, 8), &[]);
    }
    assert_eq!(h.responses().len(), 3);
    h.req(with_reth(tr(Opcode::RC_READ_REQUEST, 0, true), IOVA, rkey, 8), &[]);
    assert!(h.responses().is_empty(), "resource of PSN 0 was reused");
    h.req(with_reth(tr(Opcode::RC_READ_REQUEST, 2, true), IOVA, rkey, 8), &[]);
    assert_eq!(h.responses().len(), 1);
}

#[test]
fn read_source_invalidated_mid_stream_naks_and_fails() {
    let mut h = Harness::new(QpType::Rc, 0);
    let rkey = h.mr.rkey;
    h.req(with_reth(tr(Opcode::RC_READ_REQUEST, 0, true), IOVA, rkey, 600), &[]);
    assert_eq!(h.poll_one().unwrap().op(), Opcode::RC_READ_RESPONSE_FIRST);
    h.mem.deregister(h.mr.lkey).unwrap();
    let r = h.poll_one().unwrap();
    assert_eq!((r.op(), r.psn(), r.syndrome()), (Opcode::RC_ACK, 1, Some(NAK_ACC)));
    assert!(h.poll_one().is_none());
    assert_eq!(h.resp.take_fatal(), Some(WcStatus::RemAccessErr));
    assert_eq!(h.resp.take_fatal(), None);
}

// ---------------------------------------------------------------- ATOMIC

#[test]
fn atomics_execute_once_and_replay_the_saved_value() {
    let mut h = Harness::new(QpType::Rc, 0);
    let rkey = h.mr.rkey;
    let va = IOVA + 0x40;
    h.fill(va, &10u64.to_ne_bytes());
    h.req(atomic(Opcode::RC_FETCH_ADD, 0, va, rkey, 5, 0), &[]);
    h.req(atomic(Opcode::RC_CMP_SWAP, 1, va, rkey, 99, 15), &[]);
    h.req(atomic(Opcode::RC_CMP_SWAP, 2, va, rkey, 7, 15), &[]); // compare fails
    let r = h.responses();
    assert_eq!(
        r.iter().map(|x| (x.op(), x.psn(), x.msn(), x.t.atomic_ack)).collect::<Vec<_>>(),
        vec![(Opcode::RC_ATOMIC_ACK, 0, 1, Some(10)), (Opcode::RC_ATOMIC_ACK, 1, 2, Some(15)), (Opcode::RC_ATOMIC_ACK, 2, 3, Some(99))]
    );
    assert_eq!(r[0].syndrome(), Some(ACK));
    assert_eq!(h.word(va), 99);
    // Duplicates replay the saved original values; memory is not touched again.
    h.req(atomic(Opcode::RC_FETCH_ADD, 0, va, rkey, 5, 0), &[]);
    h.req(atomic(Opcode::RC_CMP_SWAP, 1, va, rkey, 99, 15), &[]);
    let r = h.responses();
    assert_eq!(r.iter().map(|x| (x.psn(), x.t.atomic_ack, x.msn())).collect::<Vec<_>>(), vec![(0, Some(10), 3), (1, Some(15), 3)]);
    assert_eq!(h.word(va), 99, "never executed twice");
    assert_eq!(h.stats.resp_atomic_replays, 2);
    // A duplicate atomic whose resource is gone is dropped.
    h.max_dest_rd_atomic = 1;
    h.req(atomic(Opcode::RC_FETCH_ADD, 3, va, rkey, 1, 0), &[]);
    h.responses();
    h.req(atomic(Opcode::RC_FETCH_ADD, 0, va, rkey, 5, 0), &[]);
    assert!(h.responses().is_empty());
    assert_eq!(h.word(va), 100);
}

#[test]
fn atomic_errors() {
    // Misaligned: invalid request (rxe RESPST_ERR_MISALIGNED_ATOMIC).
    let mut h = Harness::new(QpType::Rc, 0);
    let rkey = h.mr.rkey;
    let out = h.req(atomic(Opcode::RC_FETCH_ADD, 0, IOVA + 4, rkey, 1, 0), &[]);
    assert_eq!(out, ResponderOutcome::QpError(WcStatus::RemInvReqErr));
    assert_eq!(h.responses()[0].syndrome(), Some(NAK_INV));
    assert!(h.all_zero());
    // Region without REMOTE_ATOMIC: remote access error.
    let mut h = Harness::new(QpType::Rc, 0);
    let p = h.region.as_mut_ptr().cast::<u8>();
    // SAFETY: same region, alive as long as the harness.
    let k = unsafe { h.mem.register(PD, p, 64, 0x80_000, Access::LOCAL_WRITE | Access::REMOTE_WRITE) }.unwrap();
    let out = h.req(atomic(Opcode::RC_CMP_SWAP, 0, 0x80_000, k.rkey, 1, 0), &[]);
    assert_eq!(out, ResponderOutcome::QpError(WcStatus::RemAccessErr));
    assert_eq!(h.responses()[0].syndrome(), Some(NAK_ACC));
    assert!(h.all_zero());
    // QP without REMOTE_ATOMIC: invalid request.
    let mut h = Harness::new(QpType::Rc, 0);
    h.access = Access::REMOTE_READ | Access::REMOTE_WRITE;
    let rkey = h.mr.rkey;
    let out = h.req(atomic(Opcode::RC_FETCH_ADD, 0, IOVA, rkey, 1, 0), &[]);
    assert_eq!(out, ResponderOutcome::QpError(WcStatus::RemInvReqErr));
    assert!(h.all_zero());
}

#[test]
fn responses_leave_in_request_order() {
    let mut h = Harness::new(QpType::Rc, 0);
    let rkey = h.mr.rkey;
    h.post(1, &[(IOVA + 0x1000, 64)]);
    h.req(with_reth(tr(Opcode::RC_WRITE_ONLY, 0, true), IOVA, rkey, 4), b"wwww");
    h.req(with_reth(tr(Opcode::RC_READ_REQUEST, 1, true), IOVA, rkey, 300), &[]);
    h.req(atomic(Opcode::RC_FETCH_ADD, 3, IOVA + 8, rkey, 1, 0), &[]);
    h.req(tr(Opcode::RC_SEND_ONLY, 4, true), b"s");
    let r = h.responses();
    assert_eq!(
        r.iter().map(|x| (x.op(), x.psn(), x.msn())).collect::<Vec<_>>(),
        vec![
            (Opcode::RC_ACK, 0, 1),
            (Opcode::RC_READ_RESPONSE_FIRST, 1, 2),
            (Opcode::RC_READ_RESPONSE_LAST, 2, 2),
            (Opcode::RC_ATOMIC_ACK, 3, 3),
            (Opcode::RC_ACK, 4, 4)
        ]
    );
    assert_eq!(&r[1].payload[..4], b"wwww");
}

// ---------------------------------------------------------------- UC

#[test]
fn uc_places_without_responses_and_drops_a_message_with_a_gap() {
    let mut h = Harness::new(QpType::Uc, 0);
    h.post(1, &[(IOVA, 1024)]);
    h.post(2, &[(IOVA + 0x1000, 1024)]);
    let a = pattern(300, 1);
    h.req(tr(Opcode::UC_SEND_FIRST, 0, false), &a[..256]);
    // PSN 1 lost: the LAST (PSN 2) is dropped with the rest of the message.
    h.req(tr(Opcode::UC_SEND_LAST, 2, false), &a[256..]);
    assert!(h.completions.is_empty());
    // The next message reuses WQE 1 (same order), PSN resynchronised.
    let b = pattern(10, 2);
    h.req(tr(Opcode::UC_SEND_ONLY, 3, false), &b);
    let c = h.completions.pop_front().unwrap();
    assert_eq!((c.wc.wr_id, c.wc.byte_len), (1, 10));
    assert_eq!(h.bytes(IOVA, 10), b);
    // A MIDDLE without FIRST is dropped; a WRITE too, with a bad key, silently.
    h.req(tr(Opcode::UC_SEND_MIDDLE, 4, false), &[0; 256]);
    let bad = h.mr.rkey ^ 0x40;
    h.req(with_reth(tr(Opcode::UC_WRITE_ONLY, 5, false), IOVA + 0x3000, bad, 4), b"nope");
    let rkey = h.mr.rkey;
    h.req(with_reth(tr(Opcode::UC_WRITE_ONLY, 6, false), IOVA + 0x3000, rkey, 4), b"yes!");
    assert_eq!(h.bytes(IOVA + 0x3000, 4), b"yes!");
    assert!(h.responses().is_empty(), "UC never answers");
    assert_eq!(h.stats.resp_uc_dropped, 3);
    assert_eq!(h.rq.len(), 1);
}

#[test]
fn uc_no_wqe_drops_the_message() {
    let mut h = Harness::new(QpType::Uc, 0);
    h.req(tr(Opcode::UC_SEND_ONLY, 0, false), b"lost");
    assert!(h.responses().is_empty());
    assert_eq!(h.stats.resp_uc_dropped, 1);
    h.post(1, &[(IOVA, 8)]);
    h.req(tr(Opcode::UC_SEND_ONLY, 1, false), b"kept");
    assert_eq!(h.completions.len(), 1);
}

// ---------------------------------------------------------------- UD

fn ud_send(psn: u32, qkey: u32, src_qp: u32) -> TransportRepr {
    let mut t = tr(Opcode::UD_SEND_ONLY, psn, false);
    t.deth = Some(DethRepr { qkey, resv8: 0, src_qp });
    t
}

#[test]
fn ud_places_ipv4_grh_then_payload() {
    let mut h = Harness::new(QpType::Ud, 0);
    h.post(1, &[(IOVA, 20), (IOVA + 0x100, 100)]);
    let mut t = ud_send(0, QKEY, 0x77);
    t.bth.opcode = Opcode::UD_SEND_ONLY_IMM;
    t.immediate = Some(0x1234);
    t.bth.solicited = true;
    let data = pattern(60, 7);
    assert_eq!(h.req(t, &data), ResponderOutcome::Ok);
    let c = h.completions.pop_front().unwrap();
    assert_eq!((c.wc.byte_len, c.wc.src_qp, c.wc.grh, c.wc.imm_data, c.solicited), (100, 0x77, true, Some(0x1234), true));
    let mut placed = h.bytes(IOVA, 20);
    placed.extend(h.bytes(IOVA + 0x100, 80));
    assert_eq!(&placed[..20], &[0u8; 20], "first 20 bytes of the GRH area are zero");
    let ip = &placed[20..40];
    assert_eq!(ip[0], 0x45);
    assert_eq!(ip[1], 0x68, "TOS = traffic class");
    assert_eq!(u16::from_be_bytes([ip[2], ip[3]]) as usize, 20 + 8 + 12 + 8 + 4 + 60 + 4, "total length");
    assert_eq!(ip[8], 64);
    assert_eq!(ip[9], 17);
    assert_eq!(&ip[12..16], &[10, 0, 0, 1]);
    assert_eq!(&ip[16..20], &[10, 0, 0, 2]);
    assert_eq!(crate::wire::internet_checksum(ip), 0, "a valid IPv4 header");
    assert_eq!(&placed[40..], &data[..]);
    assert!(h.responses().is_empty());
}

#[test]
fn ud_places_ipv6_grh() {
    let mut h = Harness::with_path(QpType::Ud, 0, true);
    h.post(1, &[(IOVA, 128)]);
    h.req(ud_send(0, QKEY, 5), b"six");
    let g = h.bytes(IOVA, 43);
    assert_eq!(g[0] >> 4, 6);
    assert_eq!(((g[0] & 0xf) << 4) | (g[1] >> 4), 0x68, "traffic class");
    assert_eq!(u32::from_be_bytes([0, g[1] & 0xf, g[2], g[3]]), 0x12345, "flow label");
    assert_eq!(g[6], 17);
    assert_eq!(g[8], 0xfd);
    assert_eq!(g[23], 1);
    assert_eq!(g[39], 2);
    assert_eq!(&g[40..], b"six");
    assert_eq!(h.completions.pop_front().unwrap().wc.byte_len, 43);
}

#[test]
fn ud_drops_on_qkey_missing_wqe_and_size() {
    let mut h = Harness::new(QpType::Ud, 0);
    h.req(ud_send(0, QKEY + 1, 5), b"x");
    assert_eq!(h.stats.resp_ud_qkey_dropped, 1);
    h.req(ud_send(1, QKEY, 5), b"x");
    assert_eq!(h.stats.resp_ud_no_wqe_dropped, 1);
    h.post(1, &[(IOVA, 41)]);
    h.req(ud_send(2, QKEY, 5), b"xy");
    assert_eq!(h.stats.resp_ud_len_dropped, 1);
    assert_eq!(h.rq.len(), 1, "the WQE stays");
    h.req(ud_send(3, QKEY, 5), b"z");
    assert_eq!(h.completions.len(), 1);
    assert!(h.responses().is_empty(), "UD has no RNR or NAK");
    assert!(!h.all_zero(), "the accepted datagram was placed");
}

// ---------------------------------------------------------------- SRQ, flush

#[test]
fn srq_limit_event_is_raised_once() {
    let mut h = Harness::new(QpType::Rc, 0);
    h.rq = RecvQueue::new_srq(SrqId(4), PD, 16, 2);
    for i in 0..3 {
        h.post(i, &[(IOVA, 16)]);
    }
    h.rq.set_limit(2).unwrap();
    h.req(tr(Opcode::RC_SEND_ONLY, 0, true), b"a"); // 2 left: not below 2
    assert!(h.events.is_empty());
    h.req(tr(Opcode::RC_SEND_ONLY, 1, true), b"b"); // 1 left
    assert_eq!(h.events.pop_front(), Some(AsyncEvent::SrqLimitReached(SrqId(4))));
    h.req(tr(Opcode::RC_SEND_ONLY, 2, true), b"c");
    assert!(h.events.is_empty(), "disarmed after firing");
    // Flushing a QP on an SRQ leaves the SRQ's WQEs alone.
    h.post(9, &[(IOVA, 16)]);
    h.with(|r, ctx, _| r.flush(ctx));
    assert_eq!(h.rq.len(), 1);
}

#[test]
fn flush_completes_the_wqe_in_progress_first() {
    let mut h = Harness::new(QpType::Rc, 0);
    h.post(1, &[(IOVA, 1024)]);
    h.post(2, &[(IOVA, 1024)]);
    h.post(3, &[(IOVA, 1024)]);
    h.req(tr(Opcode::RC_SEND_FIRST, 0, true), &[1; 256]);
    assert!(h.resp.has_pending());
    h.with(|r, ctx, _| r.flush(ctx));
    let got: Vec<_> = h.completions.iter().map(|c| (c.wc.wr_id, c.wc.status, c.cq)).collect();
    assert_eq!(got, vec![(1, WcStatus::WrFlushErr, CqId(9)), (2, WcStatus::WrFlushErr, CqId(9)), (3, WcStatus::WrFlushErr, CqId(9))]);
    assert!(!h.resp.has_pending());
}

#[test]
fn wrong_service_opcodes_are_dropped() {
    let mut h = Harness::new(QpType::Rc, 0);
    h.post(1, &[(IOVA, 16)]);
    h.req(tr(Opcode::UC_SEND_ONLY, 0, true), b"uc");
    let mut ack = tr(Opcode::RC_ACK, 0, false);
    ack.aeth = Some(AethRepr { syndrome: ACK, msn: 0 });
    h.req(ack, &[]);
    assert_eq!(h.stats.resp_bad_opcode_dropped, 2);
    assert!(h.responses().is_empty());
    assert!(h.completions.is_empty());
    assert_eq!(h.rq.len(), 1);
}
