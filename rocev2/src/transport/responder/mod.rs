//! The responder: executes incoming requests against registered memory and
//! answers them (RC), or just places them (UC, UD).
//!
//! Structured as rxe's `rxe_resp.c` state machine, in the same order of checks:
//! PSN → opcode sequence → QP access (op valid) → resources (receive WQE,
//! READ/atomic resources) → length → R_Key → execute → complete → acknowledge.
//! Responses (ACK, NAK, RNR NAK, READ responses, atomic ACKs) go into one FIFO
//! so they leave in request order; READ responses are produced one packet per
//! [`Responder::poll_transmit`] call, read from the registered memory straight
//! into the frame (nothing is buffered).
//!
//! Error classes (IBTA 9.9.3 "Responder error behavior", as rxe implements them):
//! - class B (PSN sequence error): one NAK, then silent drop until the expected
//!   PSN arrives (`sent_psn_nak` in rxe `check_psn`);
//! - RNR: RNR NAK with the packet's PSN, no state change;
//! - class C (invalid request, remote access error) and class A (remote
//!   operational error): NAK with the packet's PSN, the receive WQE in progress
//!   completes in error, and the QP goes to the error state
//!   ([`ResponderOutcome::QpError`]);
//! - class D (duplicate READ/atomic without a saved resource): silent drop.

use std::collections::VecDeque;

use crate::psn::Psn;
use crate::time::Instant;
use crate::transport::attr::{Mtu, QpType};
use crate::transport::events::AsyncEvent;
use crate::transport::ids::{Access, CqId, PdId};
use crate::transport::memory::{sgl_len, AccessError, AtomicOp, MemoryTable};
use crate::transport::packet::PathHeaders;
use crate::transport::recv::RecvQueue;
use crate::transport::stats::QpStats;
use crate::transport::wr::{Completion, RecvWr, WcOpcode, WcStatus, WorkCompletion};
use crate::wire::repr::{AckSyndrome, AethRepr, BthRepr, IpRepr, NakCode, TransportRepr};
use crate::wire::{Opcode, ParsedFrame, Segment, Service};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod rxe_captures;


/// MSN is 24 bits (IBTA 9.7.5.1.1).
const MSN_MASK: u32 = 0x00ff_ffff;
/// AETH credit count 31: "invalid"/no end-to-end credits, as rxe sends
/// (`AETH_ACK_UNLIMITED` = 0x1f).
const CREDITS_INVALID: u8 = 31;
/// The GRH placed before UD receive data (IBTA 11.4.1.2, `IBV_WC_GRH`).
pub const GRH_LEN: usize = 40;
/// Largest RDMA length (IBTA: 2^31; rxe `check_length`: `dmalen > (1 << 31)` is a length error).
const MAX_DMA_LEN: u32 = 1 << 31;
/// Responses that may wait for transmission. One request adds at most one
/// entry and positive ACKs coalesce, so this is only reached when the caller
/// stops polling; further responses are then dropped (counted) and the
/// requester's retry recovers them.
const PENDING_CAP: usize = 128;
/// P_Key of every response (rxe `IB_DEFAULT_PKEY_FULL`).
const DEFAULT_PKEY: u16 = 0xffff;

/// What the responder needs from its QP for one call. Built by the QP/engine.
pub(crate) struct ResponderCtx<'a> {
    /// The device's registered memory.
    pub memory: &'a MemoryTable,
    /// The QP's protection domain.
    pub pd: PdId,
    /// This QP's number.
    pub qpn: u32,
    /// Service type.
    pub qp_type: QpType,
    /// `qp_access_flags`: which remote operations the QP accepts.
    pub access: Access,
    /// Path MTU.
    pub pmtu: Mtu,
    /// Q_Key (UD).
    pub qkey: u32,
    /// The QP's receive queue, or its SRQ.
    pub recv_queue: &'a mut RecvQueue,
    /// CQ for receive completions.
    pub recv_cq: CqId,
    /// Where completions go.
    pub completions: &'a mut VecDeque<Completion>,
    /// Where async events go (SRQ limit reached).
    pub events: &'a mut VecDeque<AsyncEvent>,
    /// RNR NAK timer code this responder advertises.
    pub min_rnr_timer: u8,
    /// Saved READ/atomic responder resources (`max_dest_rd_atomic`).
    pub max_dest_rd_atomic: u8,
    /// Per-QP counters.
    pub stats: &'a mut QpStats,
}

/// Result of [`Responder::handle_request`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ResponderOutcome {
    /// Processed, dropped (counted), or answered; the QP stays as it is.
    Ok,
    /// A fatal responder error (IBTA class A/C): a NAK is queued (transmit it
    /// with `poll_transmit` before or while flushing), the receive WQE in
    /// progress was completed with this status, and the QP must go to ERR.
    QpError(WcStatus),
}

/// The message in progress (multi-packet SEND or RDMA WRITE).
#[derive(Debug)]
enum MsgState {
    Idle,
    /// A SEND: its receive WQE (taken at FIRST) and the bytes placed so far.
    Send { wr: RecvWr, offset: u64 },
    /// An RDMA WRITE: target checked at FIRST for the whole DMA length.
    Write { rkey: u32, va: u64, remaining: u64, dma_len: u32 },
}

/// A saved READ/atomic responder resource (rxe `struct resp_res`,
/// IBTA 9.7.5.1.? "responder resources"), for duplicate replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Resource {
    first: Psn,
    last: Psn,
    kind: ResKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ResKind {
    Read { rkey: u32, va: u64, len: u32 },
    Atomic { orig: u64 },
}

/// A response waiting for `poll_transmit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pending {
    /// ACK, NAK or RNR NAK.
    Ack { psn: Psn, syndrome: AckSyndrome, msn: u32 },
    /// ATOMIC ACKNOWLEDGE with the original value.
    AtomicAck { psn: Psn, msn: u32, orig: u64 },
    /// READ response packets still to send, from `psn` on.
    Read { rkey: u32, va: u64, remaining: u32, psn: Psn, first: bool, msn: u32 },
}

/// Why a request failed (mapped to NAKs / drops per service).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// No receive WQE: RNR NAK (RC), drop (UC).
    Rnr,
    /// Invalid request (opcode sequence, length, QP access flags, misaligned atomic, ...).
    InvalidRequest,
    /// R_Key violation.
    RemoteAccess,
    /// The SEND is longer than the receive WQE: responder length error.
    RecvTooLong,
    /// The receive WQE's SGEs are invalid (local protection error).
    LocalProtection,
    /// SEND with invalidate named a key that cannot be invalidated.
    Invalidate,
}

/// The responder half of a QP.
#[derive(Debug)]
pub(crate) struct Responder {
    /// Expected PSN of the next request.
    epsn: Psn,
    /// Completed messages (24 bits).
    msn: u32,
    /// A PSN sequence error NAK (or RNR NAK) was sent and the expected PSN has
    /// not arrived since: drop ahead-of-sequence packets silently.
    nak_outstanding: bool,
    /// PSN of the last SEND/WRITE packet executed: re-ACKed for duplicates
    /// (rxe `duplicate_request`: `ack_psn - 1`).
    last_ack_psn: Psn,
    msg: MsgState,
    /// UC: drop packets until the next FIRST/ONLY (rxe `drop_msg`).
    uc_drop: bool,
    resources: Vec<Option<Resource>>,
    res_head: usize,
    pending: VecDeque<Pending>,
    /// A fatal error happened; everything is dropped.
    error: bool,
    /// A fatal error found while transmitting (READ source became invalid).
    fatal: Option<WcStatus>,
}

impl Responder {
    /// A responder expecting `rq_psn` first (`ibv_qp_attr.rq_psn`).
    pub(crate) fn new(rq_psn: Psn) -> Responder {
        Responder {
            epsn: rq_psn,
            msn: 0,
            nak_outstanding: false,
            last_ack_psn: rq_psn.sub(1),
            msg: MsgState::Idle,
            uc_drop: false,
            resources: Vec::new(),
            res_head: 0,
            pending: VecDeque::with_capacity(PENDING_CAP),
            error: false,
            fatal: None,
        }
    }

    /// The next expected request PSN.
    pub(crate) fn expected_psn(&self) -> Psn {
        self.epsn
    }

    /// Whether a response waits for `poll_transmit`.
    pub(crate) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The current MSN (tests).
    #[cfg(test)]
    pub(crate) fn msn(&self) -> u32 {
        self.msn
    }

    /// A fatal error found by `poll_transmit` (the source of a READ response
    /// became invalid mid-stream: a remote access error NAK was sent in its
    /// place). The QP must go to ERR. Returns it once.
    pub(crate) fn take_fatal(&mut self) -> Option<WcStatus> {
        self.fatal.take()
    }

    /// The QP entered ERR: complete the receive WQE in progress and every WQE
    /// of the QP's own receive queue with `WR_FLUSH_ERR` (an SRQ keeps its
    /// WQEs: they belong to every QP using it; rxe `rxe_drain_req_pkts`), and
    /// drop queued responses.
    pub(crate) fn flush(&mut self, ctx: &mut ResponderCtx<'_>) {
        if let MsgState::Send { wr, .. } = std::mem::replace(&mut self.msg, MsgState::Idle) {
            push_recv_error(ctx, wr.wr_id, WcStatus::WrFlushErr);
        }
        if !ctx.recv_queue.is_srq() {
            let (qpn, cq) = (ctx.qpn, ctx.recv_cq);
            for wr in ctx.recv_queue.flush() {
                ctx.completions.push_back(error_completion(cq, qpn, wr.wr_id, WcStatus::WrFlushErr));
            }
        }
        self.pending.clear();
        self.error = true;
    }

    /// A request for this QP (already ICRC-checked and dispatched by DestQP).
    pub(crate) fn handle_request(
        &mut self,
        _now: Instant,
        ctx: &mut ResponderCtx<'_>,
        frame: &ParsedFrame<'_>,
    ) -> ResponderOutcome {
        if self.error {
            ctx.stats.resp_dropped_in_error += 1;
            return ResponderOutcome::Ok;
        }
        match ctx.qp_type {
            QpType::Rc => self.rc(ctx, frame),
            QpType::Uc => self.uc(ctx, frame),
            QpType::Ud => self.ud(ctx, frame),
        }
    }

    // ------------------------------------------------------------------ RC

    fn rc(&mut self, ctx: &mut ResponderCtx<'_>, f: &ParsedFrame<'_>) -> ResponderOutcome {
        let bth = f.repr.transport.bth;
        let op = bth.opcode;
        let psn = bth.psn;
        if op.service() != Service::Rc || !op.is_request() {
            ctx.stats.resp_bad_opcode_dropped += 1;
            return ResponderOutcome::Ok;
        }

        // PSN check (rxe check_psn; IBTA C9-? class B): ahead → one NAK, then
        // silence until the expected PSN arrives; behind → duplicate.
        let d = psn.distance(self.epsn);
        if d > 0 {
            if self.nak_outstanding {
                ctx.stats.resp_out_of_seq_dropped += 1;
            } else {
                self.nak_outstanding = true;
                let epsn = self.epsn;
                self.queue_nak(ctx, NakCode::PsnSequenceError, epsn);
            }
            return ResponderOutcome::Ok;
        }
        if d < 0 {
            return self.duplicate(ctx, f);
        }
        self.nak_outstanding = false;

        // Opcode sequence (rxe check_op_seq, RC: MISSING_OPCODE_FIRST /
        // MISSING_OPCODE_LAST_C are class C invalid requests).
        if !self.sequence_ok(op) {
            return self.rc_fault(ctx, psn, Fault::InvalidRequest);
        }
        // The QP must accept the operation (rxe check_op_valid →
        // ERR_UNSUPPORTED_OPCODE → invalid request NAK; hfi1/qib `goto nack_inv`).
        if !ctx.access.contains(needed_qp_access(op)) {
            return self.rc_fault(ctx, psn, Fault::InvalidRequest);
        }
        // READ/atomic need responder resources (rxe check_resource:
        // max_dest_rd_atomic == 0 → ERR_TOO_MANY_RDMA_ATM_REQ, class C).
        if (op == Opcode::RC_READ_REQUEST || op.is_atomic()) && ctx.max_dest_rd_atomic == 0 {
            return self.rc_fault(ctx, psn, Fault::InvalidRequest);
        }
        // Packet length (rxe check_length; IBTA C9-?: FIRST/MIDDLE carry
        // exactly the path MTU with pad 0, LAST 1..=MTU, ONLY 0..=MTU).
        if !length_ok(op.segment(), f.payload.len(), bth.pad_count, ctx.pmtu) {
            return self.rc_fault(ctx, psn, Fault::InvalidRequest);
        }

        let result = if op.is_send() {
            self.exec_send(ctx, f)
        } else if op.is_write() {
            self.exec_write(ctx, f)
        } else if op == Opcode::RC_READ_REQUEST {
            return self.rc_read(ctx, f);
        } else {
            return self.rc_atomic(ctx, f);
        };
        match result {
            Ok(()) => {
                self.epsn = psn.next();
                self.last_ack_psn = psn;
                // ACK when asked (rxe acknowledge: `bth_ack(pkt)`); coalesced.
                if bth.ack_req {
                    self.queue_ack(ctx, psn);
                }
                ResponderOutcome::Ok
            }
            Err(Fault::Rnr) => {
                // RC RNR: class B, NAK with the packet's PSN, nothing changes
                // (rxe RESPST_ERR_RNR). Packets the requester already sent
                // after it are dropped silently like after a sequence NAK: the
                // RNR NAK already tells the requester where to resume, a
                // following sequence NAK would make it retransmit before the
                // RNR timer expires.
                ctx.stats.resp_rnr_naks_sent += 1;
                let syndrome = AckSyndrome::RnrNak { timer: ctx.min_rnr_timer & 0x1f };
                self.push(ctx, Pending::Ack { psn, syndrome, msn: self.msn });
                self.nak_outstanding = true;
                ResponderOutcome::Ok
            }
            Err(fault) => self.rc_fault(ctx, psn, fault),
        }
    }

    /// Whether `op` may come now (IBTA 9.8.3 / rxe check_op_seq).
    fn sequence_ok(&self, op: Opcode) -> bool {
        let seg = op.segment();
        let starts = matches!(seg, Segment::First | Segment::Only);
        match self.msg {
            MsgState::Idle => starts || !(op.is_send() || op.is_write()),
            MsgState::Send { .. } => op.is_send() && !starts,
            MsgState::Write { .. } => op.is_write() && !starts,
        }
    }

    /// Class A/C error: NAK, complete the receive WQE in progress in error,
    /// QP to ERR (rxe do_class_ac_error + do_complete).
    fn rc_fault(&mut self, ctx: &mut ResponderCtx<'_>, psn: Psn, fault: Fault) -> ResponderOutcome {
        let (code, status) = match fault {
            // Rnr is handled by the caller; kept total for safety.
            Fault::Rnr | Fault::InvalidRequest | Fault::Invalidate => (NakCode::InvalidRequest, WcStatus::RemInvReqErr),
            Fault::RemoteAccess => (NakCode::RemoteAccessError, WcStatus::RemAccessErr),
            // IBTA: a responder length error is an invalid request for the
            // requester; the receive WQE completes with a local length error.
            Fault::RecvTooLong => (NakCode::InvalidRequest, WcStatus::LocLenErr),
            // rxe ERR_MALFORMED_WQE: class A, remote operational error NAK.
            Fault::LocalProtection => (NakCode::RemoteOperationalError, WcStatus::LocProtErr),
        };
        self.queue_nak(ctx, code, psn);
        self.fail(ctx, status)
    }

    /// Complete the WQE in progress with `status` and stop.
    fn fail(&mut self, ctx: &mut ResponderCtx<'_>, status: WcStatus) -> ResponderOutcome {
        if let MsgState::Send { wr, .. } = std::mem::replace(&mut self.msg, MsgState::Idle) {
            push_recv_error(ctx, wr.wr_id, status);
        }
        self.error = true;
        ResponderOutcome::QpError(status)
    }

    fn rc_read(&mut self, ctx: &mut ResponderCtx<'_>, f: &ParsedFrame<'_>) -> ResponderOutcome {
        let psn = f.repr.transport.bth.psn;
        let Some(reth) = f.repr.transport.reth else {
            return self.rc_fault(ctx, psn, Fault::InvalidRequest);
        };
        if reth.dma_len > MAX_DMA_LEN {
            return self.rc_fault(ctx, psn, Fault::InvalidRequest);
        }
        // R_Key, PD, REMOTE_READ and bounds for the whole length, before any
        // response (rxe check_rkey). A zero-length READ needs no valid key
        // (rxe: "A zero-byte op is not required to set an addr or rkey").
        if reth.dma_len > 0
            && ctx
                .memory
                .remote_check(ctx.pd, ctx.qpn, reth.rkey, reth.va, u64::from(reth.dma_len), Access::REMOTE_READ)
                .is_err()
        {
            return self.rc_fault(ctx, psn, Fault::RemoteAccess);
        }
        let npkts = packets_for(reth.dma_len, ctx.pmtu);
        let last = psn.add(npkts - 1);
        // IBTA C9-148: the MSN of an RDMA READ advances when it is accepted.
        self.msn = (self.msn + 1) & MSN_MASK;
        ctx.stats.resp_messages += 1;
        self.save_resource(
            ctx,
            Resource { first: psn, last, kind: ResKind::Read { rkey: reth.rkey, va: reth.va, len: reth.dma_len } },
        );
        let msn = self.msn;
        self.push(
            ctx,
            Pending::Read { rkey: reth.rkey, va: reth.va, remaining: reth.dma_len, psn, first: true, msn },
        );
        // The READ consumed one PSN per response packet (rxe read_reply: resp.psn = cur_psn).
        self.epsn = last.next();
        ResponderOutcome::Ok
    }

    fn rc_atomic(&mut self, ctx: &mut ResponderCtx<'_>, f: &ParsedFrame<'_>) -> ResponderOutcome {
        let bth = f.repr.transport.bth;
        let psn = bth.psn;
        let Some(a) = f.repr.transport.atomic_eth else {
            return self.rc_fault(ctx, psn, Fault::InvalidRequest);
        };
        let op = if bth.opcode == Opcode::RC_CMP_SWAP {
            AtomicOp::CmpSwap { compare: a.compare, swap: a.swap_add }
        } else {
            AtomicOp::FetchAdd { add: a.swap_add }
        };
        // Checks (key, PD, REMOTE_ATOMIC, bounds, then alignment) precede the
        // operation; executed exactly once, the result saved for replays.
        let orig = match ctx.memory.remote_atomic(ctx.pd, ctx.qpn, a.rkey, a.va, op) {
            Ok(v) => v,
            // rxe atomic_reply: RESPST_ERR_MISALIGNED_ATOMIC is class C
            // AETH_NAK_INVALID_REQ (not a remote access error).
            Err(AccessError::Misaligned) => return self.rc_fault(ctx, psn, Fault::InvalidRequest),
            Err(_) => return self.rc_fault(ctx, psn, Fault::RemoteAccess),
        };
        self.msn = (self.msn + 1) & MSN_MASK;
        ctx.stats.resp_messages += 1;
        self.save_resource(ctx, Resource { first: psn, last: psn, kind: ResKind::Atomic { orig } });
        let msn = self.msn;
        // Atomic ACKs are always sent, AckReq or not (rxe acknowledge).
        self.push(ctx, Pending::AtomicAck { psn, msn, orig });
        self.epsn = psn.next();
        ResponderOutcome::Ok
    }

    /// A request behind the expected PSN (rxe duplicate_request).
    fn duplicate(&mut self, ctx: &mut ResponderCtx<'_>, f: &ParsedFrame<'_>) -> ResponderOutcome {
        let t = &f.repr.transport;
        let op = t.bth.opcode;
        let psn = t.bth.psn;
        ctx.stats.resp_duplicates += 1;
        if op.is_send() || op.is_write() {
            // IBTA C9-105: a duplicate SEND/WRITE is not executed again but
            // acknowledged, with the PSN of the last executed SEND/WRITE packet.
            let ack = self.last_ack_psn;
            self.queue_ack(ctx, ack);
            return ResponderOutcome::Ok;
        }
        let mtu = ctx.pmtu;
        let found = self.resources.iter().flatten().copied().find(|r| {
            !psn.is_before(r.first)
                && !psn.is_after(r.last)
                && matches!((r.kind, op == Opcode::RC_READ_REQUEST), (ResKind::Read { .. }, true) | (ResKind::Atomic { .. }, false))
        });
        match (found, op == Opcode::RC_READ_REQUEST) {
            (Some(Resource { first, last, kind: ResKind::Read { rkey, va, len } }), true) => {
                // Replay from `psn` (possibly mid-message): the request must
                // name the same key and a part of the original range, and its
                // responses must fit the original PSN range (rxe checks the
                // first two; the third keeps our expected PSN consistent).
                let Some(reth) = t.reth else {
                    ctx.stats.resp_dup_no_resource_dropped += 1;
                    return ResponderOutcome::Ok;
                };
                let within = reth.rkey == rkey
                    && reth.va >= va
                    && reth.va.checked_add(u64::from(reth.dma_len)).is_some_and(|e| e <= va.saturating_add(u64::from(len)))
                    && !psn.add(packets_for(reth.dma_len, mtu) - 1).is_after(last);
                if !within {
                    ctx.stats.resp_dup_no_resource_dropped += 1;
                    return ResponderOutcome::Ok;
                }
                ctx.stats.resp_read_replays += 1;
                let msn = self.msn;
                let replay = Pending::Read { rkey, va: reth.va, remaining: reth.dma_len, psn, first: psn == first, msn };
                // The replay supersedes a stream of the same resource still
                // queued (rxe restarts the resource in place): otherwise every
                // re-request would add a whole stream and a lossy link would
                // multiply READ responses. It takes that stream's place in the
                // queue, so responses stay in PSN order.
                let same = |p: &Pending| {
                    matches!(*p, Pending::Read { rkey: k, psn: q, .. } if k == rkey && !q.is_before(first) && !q.is_after(last))
                };
                match self.pending.iter().position(same) {
                    Some(i) => {
                        self.pending[i] = replay;
                        let mut j = i + 1;
                        while j < self.pending.len() {
                            if same(&self.pending[j]) {
                                self.pending.remove(j);
                            } else {
                                j += 1;
                            }
                        }
                    }
                    None => {
                        self.push(ctx, replay);
                    }
                }
            }
            (Some(Resource { first, kind: ResKind::Atomic { orig }, .. }), false) if first == psn => {
                // Never execute an atomic twice: answer with the saved value.
                ctx.stats.resp_atomic_replays += 1;
                let msn = self.msn;
                self.push(ctx, Pending::AtomicAck { psn, msn, orig });
            }
            _ => {
                // Class D: no resource covers it (too old, or never executed): drop.
                ctx.stats.resp_dup_no_resource_dropped += 1;
            }
        }
        ResponderOutcome::Ok
    }

    fn save_resource(&mut self, ctx: &mut ResponderCtx<'_>, r: Resource) {
        // rxe: `max_dest_rd_atomic` resources, the oldest is reused
        // ("it is the requester's job to not send too many").
        let n = usize::from(ctx.max_dest_rd_atomic.max(1));
        if self.resources.len() != n {
            // Only when max_dest_rd_atomic changed (modify_qp), not per packet.
            self.resources.resize(n, None);
            self.res_head %= n;
        }
        self.resources[self.res_head] = Some(r);
        self.res_head = (self.res_head + 1) % n;
    }

    // ---------------------------------------------------- SEND / WRITE (RC, UC)

    /// Execute a SEND packet (sequence, access and length already checked).
    fn exec_send(&mut self, ctx: &mut ResponderCtx<'_>, f: &ParsedFrame<'_>) -> Result<(), Fault> {
        let t = &f.repr.transport;
        let seg = t.bth.opcode.segment();
        let (wr, offset) = match std::mem::replace(&mut self.msg, MsgState::Idle) {
            MsgState::Send { wr, offset } => (wr, offset),
            _ => {
                // FIRST/ONLY: take a receive WQE (IBTA 9.7.5.2.8: RNR NAK if none).
                let Some(wr) = ctx.recv_queue.pop() else {
                    return Err(Fault::Rnr);
                };
                srq_event(ctx);
                (wr, 0)
            }
        };
        let end = offset + f.payload.len() as u64;
        if end > sgl_len(&wr.sgl) {
            self.msg = MsgState::Send { wr, offset };
            return Err(Fault::RecvTooLong);
        }
        if ctx.memory.local_scatter(ctx.recv_queue.pd(), &wr.sgl, offset, f.payload).is_err() {
            self.msg = MsgState::Send { wr, offset };
            return Err(Fault::LocalProtection);
        }
        ctx.stats.resp_bytes_placed += f.payload.len() as u64;
        if !matches!(seg, Segment::Last | Segment::Only) {
            self.msg = MsgState::Send { wr, offset: end };
            return Ok(());
        }
        let mut invalidated = None;
        if let Some(rkey) = t.invalidate_rkey {
            // SEND with Invalidate (IBTA 9.4.4 IETH, rxe `invalidate_rkey`):
            // only a memory window may be invalidated remotely; an MR key or
            // any other failure is an invalid request (rxe
            // RESPST_ERR_INVALIDATE_RKEY: REM_INV_REQ_ERR, class J).
            if ctx.memory.invalidate_remote(ctx.pd, ctx.qpn, rkey).is_err() {
                self.msg = MsgState::Send { wr, offset: end };
                return Err(Fault::Invalidate);
            }
            invalidated = Some(rkey);
        }
        self.msn = (self.msn + 1) & MSN_MASK;
        ctx.stats.resp_messages += 1;
        let wc = WorkCompletion {
            wr_id: wr.wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            qp_num: ctx.qpn,
            byte_len: end as u32,
            imm_data: t.immediate,
            invalidated_rkey: invalidated,
            src_qp: 0,
            grh: false,
        };
        ctx.completions.push_back(Completion { cq: ctx.recv_cq, wc, solicited: t.bth.solicited });
        Ok(())
    }

    /// Execute an RDMA WRITE packet (sequence, access and length already checked).
    fn exec_write(&mut self, ctx: &mut ResponderCtx<'_>, f: &ParsedFrame<'_>) -> Result<(), Fault> {
        let t = &f.repr.transport;
        let op = t.bth.opcode;
        let seg = op.segment();
        let len = f.payload.len() as u64;
        let mtu = u64::from(ctx.pmtu.bytes());
        let (rkey, va, remaining, dma_len) = match self.msg {
            MsgState::Write { rkey, va, remaining, dma_len } => (rkey, va, remaining, dma_len),
            _ => {
                let reth = t.reth.ok_or(Fault::InvalidRequest)?;
                let dma = u64::from(reth.dma_len);
                // rxe check_length/check_rkey: the RETH length must match the packets.
                if reth.dma_len > MAX_DMA_LEN
                    || (seg == Segment::Only && len != dma)
                    || (seg == Segment::First && dma <= mtu)
                {
                    return Err(Fault::InvalidRequest);
                }
                // WRITE ONLY with immediate consumes a WQE: RNR comes before the
                // R_Key check (rxe check_resource precedes check_rkey).
                if op.has_immediate() && ctx.recv_queue.is_empty() {
                    return Err(Fault::Rnr);
                }
                // The whole DMA range is checked at FIRST/ONLY, before any byte
                // is written; a zero-length WRITE needs no valid key (rxe check_rkey).
                if dma > 0
                    && ctx
                        .memory
                        .remote_check(ctx.pd, ctx.qpn, reth.rkey, reth.va, dma, Access::REMOTE_WRITE)
                        .is_err()
                {
                    return Err(Fault::RemoteAccess);
                }
                (reth.rkey, reth.va, dma, reth.dma_len)
            }
        };
        // Every packet must fit the announced length: MIDDLE leaves bytes for
        // a LAST, LAST ends exactly on it.
        let fits = match seg {
            Segment::First | Segment::Middle => len < remaining,
            Segment::Last | Segment::Only => len == remaining,
        };
        if !fits {
            return Err(Fault::InvalidRequest);
        }
        if op.has_immediate() && ctx.recv_queue.is_empty() {
            // LAST with immediate and no WQE: RNR; the state is untouched, so
            // the retried LAST is placed normally.
            return Err(Fault::Rnr);
        }
        if len > 0 {
            ctx.memory.remote_write(ctx.pd, ctx.qpn, rkey, va, f.payload).map_err(|_| Fault::RemoteAccess)?;
            ctx.stats.resp_bytes_placed += len;
        }
        if matches!(seg, Segment::First | Segment::Middle) {
            self.msg = MsgState::Write { rkey, va: va.wrapping_add(len), remaining: remaining - len, dma_len };
            return Ok(());
        }
        self.msg = MsgState::Idle;
        self.msn = (self.msn + 1) & MSN_MASK;
        ctx.stats.resp_messages += 1;
        if op.has_immediate() {
            if let Some(wr) = ctx.recv_queue.pop() {
                srq_event(ctx);
                // ibverbs: RECV_RDMA_WITH_IMM, byte_len = the RDMA length (rxe do_complete).
                let wc = WorkCompletion {
                    wr_id: wr.wr_id,
                    status: WcStatus::Success,
                    opcode: WcOpcode::RecvRdmaWithImm,
                    qp_num: ctx.qpn,
                    byte_len: dma_len,
                    imm_data: t.immediate,
                    invalidated_rkey: None,
                    src_qp: 0,
                    grh: false,
                };
                ctx.completions.push_back(Completion { cq: ctx.recv_cq, wc, solicited: t.bth.solicited });
            }
        }
        Ok(())
    }

    // ------------------------------------------------------------------ UC

    fn uc(&mut self, ctx: &mut ResponderCtx<'_>, f: &ParsedFrame<'_>) -> ResponderOutcome {
        let bth = f.repr.transport.bth;
        let op = bth.opcode;
        if op.service() != Service::Uc || !(op.is_send() || op.is_write()) {
            ctx.stats.resp_bad_opcode_dropped += 1;
            return ResponderOutcome::Ok;
        }
        let starts = matches!(op.segment(), Segment::First | Segment::Only);
        // IBTA 9.8.4 (UC): a PSN gap loses the rest of the current message;
        // the next FIRST/ONLY starts over (rxe check_psn UC / drop_msg).
        if self.uc_drop || bth.psn != self.epsn {
            self.abandon(ctx);
            if !starts {
                self.uc_drop = true;
                ctx.stats.resp_uc_dropped += 1;
                return ResponderOutcome::Ok;
            }
            self.uc_drop = false;
        }
        // Opcode sequence (rxe check_op_seq UC, class D1/E): a FIRST/ONLY
        // inside a message abandons the old one and starts anew; a MIDDLE/LAST
        // of the wrong kind or outside a message is dropped with the rest.
        if starts {
            self.abandon(ctx);
        } else if !self.sequence_ok(op) {
            self.abandon(ctx);
            return self.uc_drop_msg(ctx);
        }
        // rxe check_op_valid UC: WRITE to a QP without REMOTE_WRITE drops the message.
        if !ctx.access.contains(needed_qp_access(op)) || !length_ok(op.segment(), f.payload.len(), bth.pad_count, ctx.pmtu)
        {
            self.abandon(ctx);
            return self.uc_drop_msg(ctx);
        }
        let result = if op.is_send() { self.exec_send(ctx, f) } else { self.exec_write(ctx, f) };
        match result {
            Ok(()) => {
                self.epsn = bth.psn.next();
                ResponderOutcome::Ok
            }
            // A broken receive WQE is class A for every service (rxe ERR_MALFORMED_WQE).
            Err(Fault::LocalProtection) => self.fail(ctx, WcStatus::LocProtErr),
            Err(_) => {
                // UC class D: no WQE, bad R_Key, length: drop the message.
                self.abandon(ctx);
                self.uc_drop_msg(ctx)
            }
        }
    }

    fn uc_drop_msg(&mut self, ctx: &mut ResponderCtx<'_>) -> ResponderOutcome {
        self.uc_drop = true;
        ctx.stats.resp_uc_dropped += 1;
        ResponderOutcome::Ok
    }

    /// Forget the message in progress; a receive WQE it had taken goes back
    /// to the head of its queue for the next message (rxe class D1).
    fn abandon(&mut self, ctx: &mut ResponderCtx<'_>) {
        if let MsgState::Send { wr, .. } = std::mem::replace(&mut self.msg, MsgState::Idle) {
            ctx.recv_queue.requeue_front(wr);
        }
    }

    // ------------------------------------------------------------------ UD

    fn ud(&mut self, ctx: &mut ResponderCtx<'_>, f: &ParsedFrame<'_>) -> ResponderOutcome {
        let t = &f.repr.transport;
        let op = t.bth.opcode;
        let deth = match t.deth {
            Some(d) if op == Opcode::UD_SEND_ONLY || op == Opcode::UD_SEND_ONLY_IMM => d,
            _ => {
                ctx.stats.resp_bad_opcode_dropped += 1;
                return ResponderOutcome::Ok;
            }
        };
        // IBTA C10-15 / 10.2.5: a datagram whose Q_Key differs from the QP's is dropped.
        if deth.qkey != ctx.qkey {
            ctx.stats.resp_ud_qkey_dropped += 1;
            return ResponderOutcome::Ok;
        }
        let len = f.payload.len();
        if len > ctx.pmtu.bytes() as usize {
            ctx.stats.resp_ud_len_dropped += 1;
            return ResponderOutcome::Ok;
        }
        // UD has no RNR: no WQE → drop (IBTA 9.7.5.2.8 applies to RC only).
        let Some(front) = ctx.recv_queue.front() else {
            ctx.stats.resp_ud_no_wqe_dropped += 1;
            return ResponderOutcome::Ok;
        };
        // Too small for GRH + payload: drop, the WQE stays (rxe class D).
        if sgl_len(&front.sgl) < (GRH_LEN + len) as u64 {
            ctx.stats.resp_ud_len_dropped += 1;
            return ResponderOutcome::Ok;
        }
        let Some(wr) = ctx.recv_queue.pop() else {
            return ResponderOutcome::Ok;
        };
        srq_event(ctx);
        let grh = grh_bytes(&f.repr.ip);
        let pd = ctx.recv_queue.pd();
        let placed = ctx
            .memory
            .local_scatter(pd, &wr.sgl, 0, &grh)
            .and_then(|()| ctx.memory.local_scatter(pd, &wr.sgl, GRH_LEN as u64, f.payload));
        if placed.is_err() {
            push_recv_error(ctx, wr.wr_id, WcStatus::LocProtErr);
            self.error = true;
            return ResponderOutcome::QpError(WcStatus::LocProtErr);
        }
        ctx.stats.resp_bytes_placed += len as u64;
        ctx.stats.resp_messages += 1;
        self.epsn = t.bth.psn.next();
        let wc = WorkCompletion {
            wr_id: wr.wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            qp_num: ctx.qpn,
            byte_len: (GRH_LEN + len) as u32,
            imm_data: t.immediate,
            invalidated_rkey: None,
            src_qp: deth.src_qp,
            grh: true,
        };
        ctx.completions.push_back(Completion { cq: ctx.recv_cq, wc, solicited: t.bth.solicited });
        ResponderOutcome::Ok
    }

    // ------------------------------------------------------------ responses

    fn push(&mut self, ctx: &mut ResponderCtx<'_>, p: Pending) -> bool {
        if self.pending.len() >= PENDING_CAP {
            ctx.stats.resp_responses_dropped += 1;
            return false;
        }
        self.pending.push_back(p);
        true
    }

    /// Queue a positive ACK for `psn`, merged into a positive ACK at the tail
    /// of the queue (one ACK may cover several packets, IBTA 9.7.5.1.?).
    fn queue_ack(&mut self, ctx: &mut ResponderCtx<'_>, psn: Psn) {
        let msn = self.msn;
        if let Some(Pending::Ack { psn: p, syndrome: AckSyndrome::Ack { .. }, msn: m }) = self.pending.back_mut() {
            *p = psn;
            *m = msn;
            return;
        }
        let syndrome = AckSyndrome::Ack { credits: CREDITS_INVALID };
        if self.push(ctx, Pending::Ack { psn, syndrome, msn }) {
            ctx.stats.resp_acks_sent += 1;
        }
    }

    fn queue_nak(&mut self, ctx: &mut ResponderCtx<'_>, code: NakCode, psn: Psn) {
        let s = &mut *ctx.stats;
        match code {
            NakCode::PsnSequenceError => s.resp_naks_psn_seq_sent += 1,
            NakCode::InvalidRequest => s.resp_naks_inv_req_sent += 1,
            NakCode::RemoteAccessError => s.resp_naks_rem_access_sent += 1,
            _ => s.resp_naks_rem_op_sent += 1,
        }
        let msn = self.msn;
        self.push(ctx, Pending::Ack { psn, syndrome: AckSyndrome::Nak(code), msn });
    }

    /// Next ACK / NAK / READ response / atomic ACK, framed along `path`, into `buf`.
    pub(crate) fn poll_transmit(
        &mut self,
        ctx: &mut ResponderCtx<'_>,
        path: &PathHeaders,
        dest_qpn: u32,
        buf: &mut [u8],
    ) -> Option<usize> {
        loop {
            let front = *self.pending.front()?;
            let out = match front {
                Pending::Ack { psn, syndrome, msn } => {
                    let tr = response(Opcode::RC_ACK, dest_qpn, psn, Some(AethRepr { syndrome, msn }), None);
                    self.pending.pop_front();
                    path.emit_with(tr, 0, buf, |_| {})
                }
                Pending::AtomicAck { psn, msn, orig } => {
                    let aeth = AethRepr { syndrome: AckSyndrome::Ack { credits: CREDITS_INVALID }, msn };
                    let tr = response(Opcode::RC_ATOMIC_ACK, dest_qpn, psn, Some(aeth), Some(orig));
                    self.pending.pop_front();
                    ctx.stats.resp_atomic_acks_sent += 1;
                    path.emit_with(tr, 0, buf, |_| {})
                }
                Pending::Read { rkey, va, remaining, psn, first, msn } => {
                    return self.read_response(ctx, path, dest_qpn, buf, (rkey, va, remaining, psn, first, msn));
                }
            };
            match out {
                Ok(n) => return Some(n),
                // The caller's buffer cannot hold a response: drop it (counted)
                // rather than stall; the requester's retry recovers.
                Err(_) => ctx.stats.resp_responses_dropped += 1,
            }
        }
    }

    /// One READ response packet (rxe read_reply), read from memory straight
    /// into the frame.
    fn read_response(
        &mut self,
        ctx: &mut ResponderCtx<'_>,
        path: &PathHeaders,
        dest_qpn: u32,
        buf: &mut [u8],
        (rkey, va, remaining, psn, first, msn): (u32, u64, u32, Psn, bool, u32),
    ) -> Option<usize> {
        let mtu = ctx.pmtu.bytes();
        let n = remaining.min(mtu);
        let opcode = match (first, remaining <= mtu) {
            (true, true) => Opcode::RC_READ_RESPONSE_ONLY,
            (true, false) => Opcode::RC_READ_RESPONSE_FIRST,
            (false, false) => Opcode::RC_READ_RESPONSE_MIDDLE,
            (false, true) => Opcode::RC_READ_RESPONSE_LAST,
        };
        // AETH on FIRST, LAST and ONLY (IBTA 9.3.4 table 36).
        let aeth = (opcode != Opcode::RC_READ_RESPONSE_MIDDLE)
            .then_some(AethRepr { syndrome: AckSyndrome::Ack { credits: CREDITS_INVALID }, msn });
        let tr = response(opcode, dest_qpn, psn, aeth, None);
        let mut read = Ok(());
        let (memory, pd, qpn) = (ctx.memory, ctx.pd, ctx.qpn);
        let emitted = path.emit_with_crc(tr, n as usize, buf, |dst, crc| {
            if dst.is_empty() {
                return crc;
            }
            // The key is checked again for every packet (rxe rxe_recheck_mr):
            // the region may have been deregistered or invalidated since. The
            // copy continues the ICRC in the same pass.
            match memory.remote_read_crc(pd, qpn, rkey, va, dst, crc) {
                Ok(crc) => crc,
                Err(e) => {
                    read = Err(e);
                    crc
                }
            }
        });
        let len = match emitted {
            Ok(len) => len,
            Err(_) => {
                self.pending.pop_front();
                ctx.stats.resp_responses_dropped += 1;
                return None;
            }
        };
        if read.is_err() {
            // rxe read_reply → RESPST_ERR_RKEY_VIOLATION: class C, remote
            // access error NAK in place of the response; the QP goes to ERR.
            self.pending.clear();
            self.error = true;
            self.fatal = Some(WcStatus::RemAccessErr);
            ctx.stats.resp_naks_rem_access_sent += 1;
            let aeth = AethRepr { syndrome: AckSyndrome::Nak(NakCode::RemoteAccessError), msn: self.msn };
            let tr = response(Opcode::RC_ACK, dest_qpn, psn, Some(aeth), None);
            return path.emit_with(tr, 0, buf, |_| {}).ok();
        }
        ctx.stats.resp_read_responses_sent += 1;
        if let Some(Pending::Read { va: v, remaining: r, psn: p, first: f1, .. }) = self.pending.front_mut() {
            *v = va.wrapping_add(u64::from(n));
            *r = remaining - n;
            *p = psn.next();
            *f1 = false;
            if *r == 0 {
                self.pending.pop_front();
            }
        }
        Some(len)
    }
}

/// Rights the QP's `qp_access_flags` must grant for `op`.
fn needed_qp_access(op: Opcode) -> Access {
    if op.is_write() {
        Access::REMOTE_WRITE
    } else if op == Opcode::RC_READ_REQUEST {
        Access::REMOTE_READ
    } else if op.is_atomic() {
        Access::REMOTE_ATOMIC
    } else {
        Access::empty()
    }
}

/// rxe check_length / IBTA C9-?: packet payload against the path MTU.
fn length_ok(seg: Segment, len: usize, pad: u8, pmtu: Mtu) -> bool {
    let mtu = pmtu.bytes() as usize;
    match seg {
        Segment::Only => len <= mtu,
        Segment::First | Segment::Middle => len == mtu && pad == 0,
        Segment::Last => len >= 1 && len <= mtu,
    }
}

/// READ response packets for `len` bytes (at least one: a zero-length READ
/// gets one RESPONSE ONLY without payload).
fn packets_for(len: u32, pmtu: Mtu) -> u32 {
    len.div_ceil(pmtu.bytes()).max(1)
}

fn response(opcode: Opcode, dest_qpn: u32, psn: Psn, aeth: Option<AethRepr>, atomic_ack: Option<u64>) -> TransportRepr {
    TransportRepr {
        bth: BthRepr { pkey: DEFAULT_PKEY, ..BthRepr::new(opcode, dest_qpn & 0x00ff_ffff, psn) },
        deth: None,
        reth: None,
        atomic_eth: None,
        aeth,
        atomic_ack,
        immediate: None,
        invalidate_rkey: None,
    }
}

fn error_completion(cq: CqId, qpn: u32, wr_id: u64, status: WcStatus) -> Completion {
    Completion::error(cq, qpn, wr_id, WcOpcode::Recv, status)
}

fn push_recv_error(ctx: &mut ResponderCtx<'_>, wr_id: u64, status: WcStatus) {
    ctx.completions.push_back(error_completion(ctx.recv_cq, ctx.qpn, wr_id, status));
}

/// Raise `IBV_EVENT_SRQ_LIMIT_REACHED` if taking a WQE crossed an armed SRQ limit.
fn srq_event(ctx: &mut ResponderCtx<'_>) {
    if ctx.recv_queue.take_limit_event() {
        if let Some(id) = ctx.recv_queue.srq_id() {
            ctx.events.push_back(AsyncEvent::SrqLimitReached(id));
        }
    }
}

/// The 40-byte GRH area of a UD receive buffer, built from the received IP
/// header. IPv6: the IPv6 header itself (a GRH has the IPv6 layout). IPv4:
/// 20 zero bytes, then the 20-byte IPv4 header — Linux `union
/// rdma_network_hdr { struct ib_grh ibgrh; struct { u8 reserved[20]; struct
/// iphdr roce4grh; }; }` (include/rdma/ib_verbs.h), filled that way by rxe
/// (rxe_resp.c execute: `memset(&hdr.reserved, 0, ...); memcpy(&hdr.roce4grh,
/// ip_hdr(skb), ...)`) and mlx5; `ibv_get_rdma_header_version` tells them
/// apart by the version nibble at offset 20.
pub fn grh_bytes(ip: &IpRepr) -> [u8; GRH_LEN] {
    let mut grh = [0u8; GRH_LEN];
    // The emitters only fail on a short buffer; both targets are exactly sized.
    match ip {
        IpRepr::V4(v4) => {
            let _ = v4.emit(&mut grh[20..]);
        }
        IpRepr::V6(v6) => {
            let _ = v6.emit(&mut grh);
        }
    }
    grh
}
