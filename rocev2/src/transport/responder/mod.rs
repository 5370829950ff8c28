//! The responder: executes incoming requests against registered memory and
//! answers them (RC), or just places them (UC, UD).
//!
//! Structured as rxe's `rxe_resp.c` state machine, in the same order of checks:
//! PSN → opcode sequence → QP access (op valid) → resources (receive WQE,
//! READ/atomic resources) → length → R_Key → execute → complete → acknowledge.
//! Responses (ACK, NAK, RNR NAK, READ responses, atomic ACKs) go into one FIFO
//! so they leave in request order; READ responses are produced one packet per
//! `Responder::poll_transmit` call, read from the registered memory straight
//! into the frame (nothing is buffered).
//!
//! Error classes (IBTA 9.9.3 "Responder error behavior", as rxe implements them):
//! - class B (PSN sequence error): one NAK, then silent drop until the expected
//!   PSN arrives (`sent_psn_nak` in rxe `check_psn`);
//! - RNR: RNR NAK with the packet's PSN, no state change;
//! - class C (invalid request, remote access error) and class A (remote
//!   operational error): NAK with the packet's PSN, the receive WQE in progress
//!   completes in error, and the QP goes to the error state
//!   (`ResponderOutcome::QpError`);
//! - class D (duplicate READ/atomic without a saved resource): silent drop.

use std::collections::VecDeque;

use crate::psn::Psn;
use crate::time::Instant;
use crate::transport::attr::{Mtu, QpAttr, QpInitAttr, QpType};
use crate::transport::events::AsyncEvent;
use crate::transport::ids::{Access, CqId, PdId};
use crate::transport::memory::{MemoryTable, WriteMemo};
use crate::transport::recv::RecvQueue;
use crate::transport::stats::QpStats;
use crate::transport::wqe::RecvWqe;
use crate::transport::wr::{Completion, WcOpcode, WcStatus};
use crate::wire::{AckSyndrome, IpRepr, NakCode};
use crate::wire::{Opcode, ParsedFrame, Segment, Service};

mod acknowledge;
mod execute;
mod placed;
mod unreliable;

pub(crate) use placed::{Placed, Placement};

#[cfg(test)]
mod rxe_captures;
#[cfg(test)]
mod tests;

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

/// What the responder needs from its QP for one call. Built by the QP/engine
/// for every request frame: the QP's attributes by reference, not copied
/// field by field (fifteen fields loaded and stored per frame were about
/// 30 instructions), as [`RequesterCtx`](crate::transport::requester::RequesterCtx) does.
pub(crate) struct ResponderCtx<'a> {
    /// The device's registered memory.
    pub memory: &'a MemoryTable,
    /// This QP's number.
    pub qpn: u32,
    /// The QP's creation attributes (service type, PD, receive CQ).
    pub init: &'a QpInitAttr,
    /// The QP's attributes (access flags, path MTU, Q_Key, RNR timer,
    /// responder resources).
    pub attr: &'a QpAttr,
    /// The QP's receive queue, or its SRQ.
    pub recv_queue: &'a mut RecvQueue,
    /// Where completions go.
    pub completions: &'a mut VecDeque<Completion>,
    /// Where async events go (SRQ limit reached).
    pub events: &'a mut VecDeque<AsyncEvent>,
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
///
/// With a tag of its own (`repr(u8)`): kept in a niche of the SEND's WQE,
/// every test of the state (`sequence_ok`, `exec_write`, the drop of the
/// state a packet replaces) decoded the niche first.
#[derive(Debug)]
#[repr(u8)]
enum MsgState {
    Idle,
    /// A SEND: its receive WQE (taken at FIRST) and the bytes placed so far.
    Send {
        wr: RecvWqe,
        offset: u64,
    },
    /// An RDMA WRITE: target checked at FIRST for the whole DMA length.
    Write {
        rkey: u32,
        va: u64,
        remaining: u64,
        dma_len: u32,
    },
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
    /// The R_Key's resolution for the whole range of the last RDMA WRITE of
    /// several packets, made at its FIRST: its packets are placed through
    /// it while the memory table has not changed since
    /// ([`MemoryTable::remote_write_memo`]). Kept beside `msg`, not in it,
    /// so that a packet does not copy it out and back.
    write_memo: WriteMemo,
    /// UC: drop packets until the next FIRST/ONLY (rxe `drop_msg`).
    uc_drop: bool,
    resources: Vec<Option<Resource>>,
    res_head: usize,
    pending: VecDeque<Pending>,
    /// A fatal error happened; everything is dropped.
    error: bool,
    /// A fatal error found while transmitting (READ source became invalid).
    fatal: Option<WcStatus>,
    /// The positive ACK that is `pending`'s only entry waits until then for
    /// this QP's next request frame (the application's reply), to leave
    /// right behind it (`acknowledge.rs`, "held ACKs").
    held_until: Option<Instant>,
    /// The last request queued an ACK that may be held: the engine turns
    /// this into `held_until` ([`Responder::start_hold`]).
    hold_wanted: bool,
    /// The held ACK's deadline has passed: it leaves after the engine's
    /// other frames.
    hold_expired: bool,
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
            write_memo: WriteMemo::default(),
            uc_drop: false,
            resources: Vec::new(),
            res_head: 0,
            pending: VecDeque::with_capacity(PENDING_CAP),
            error: false,
            fatal: None,
            held_until: None,
            hold_wanted: false,
            hold_expired: false,
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
            let (qpn, cq) = (ctx.qpn, ctx.init.recv_cq);
            for wr in ctx.recv_queue.flush() {
                ctx.completions.push_back(error_completion(cq, qpn, wr.wr_id, WcStatus::WrFlushErr));
            }
        }
        self.pending.clear();
        self.release_hold();
        self.error = true;
    }

    /// A request for this QP (already ICRC-checked and dispatched by
    /// DestQP), its payload still to place (the unit tests' entry; the
    /// engine calls [`handle_request_placed`](Self::handle_request_placed)).
    #[cfg(test)]
    pub(crate) fn handle_request(&mut self, now: Instant, ctx: &mut ResponderCtx<'_>, frame: &ParsedFrame<'_>) -> ResponderOutcome {
        self.handle_request_placed(now, ctx, frame, Placement::ToDo)
    }

    /// [`handle_request`](Self::handle_request) for a frame whose payload
    /// may already be in place ([`Placement::Done`]: an RC WRITE
    /// continuation that [`Responder::place_write_continuation`] placed and
    /// checked; every check runs as for any frame, the copy is skipped).
    pub(crate) fn handle_request_placed(
        &mut self,
        _now: Instant,
        ctx: &mut ResponderCtx<'_>,
        frame: &ParsedFrame<'_>,
        placement: Placement,
    ) -> ResponderOutcome {
        if self.error {
            ctx.stats.resp_dropped_in_error += 1;
            return ResponderOutcome::Ok;
        }
        match ctx.init.qp_type {
            QpType::Rc => self.rc(ctx, frame, placement),
            QpType::Uc => self.uc(ctx, frame),
            QpType::Ud => self.ud(ctx, frame),
        }
    }

    // ------------------------------------------------------------------ RC

    fn rc(&mut self, ctx: &mut ResponderCtx<'_>, f: &ParsedFrame<'_>, placement: Placement) -> ResponderOutcome {
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
        if !ctx.attr.qp_access_flags.contains(needed_qp_access(op)) {
            return self.rc_fault(ctx, psn, Fault::InvalidRequest);
        }
        // READ/atomic need responder resources (rxe check_resource:
        // max_dest_rd_atomic == 0 → ERR_TOO_MANY_RDMA_ATM_REQ, class C).
        if (op == Opcode::RC_READ_REQUEST || op.is_atomic()) && ctx.attr.max_dest_rd_atomic == 0 {
            return self.rc_fault(ctx, psn, Fault::InvalidRequest);
        }
        // Packet length (rxe check_length; IBTA C9-?: FIRST/MIDDLE carry
        // exactly the path MTU with pad 0, LAST 1..=MTU, ONLY 0..=MTU).
        if !length_ok(op.segment(), f.payload.len(), bth.pad_count, ctx.attr.path_mtu) {
            return self.rc_fault(ctx, psn, Fault::InvalidRequest);
        }

        let result = if op.is_send() {
            self.exec_send(ctx, f)
        } else if op.is_write() {
            self.exec_write(ctx, f, placement)
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
                // The ACK of a whole SEND or WRITE may wait for the
                // application's answer (`queue_reply_ack`); an AckReq in the
                // middle of a message is answered at once.
                if bth.ack_req {
                    if matches!(op.segment(), Segment::Last | Segment::Only) {
                        self.queue_reply_ack(ctx, psn);
                    } else {
                        self.queue_ack(ctx, psn);
                    }
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
                tracing::debug!(qpn = ctx.qpn, psn = psn.value(), "sending RNR NAK: no receive posted");
                let syndrome = AckSyndrome::RnrNak { timer: ctx.attr.min_rnr_timer & 0x1f };
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

fn error_completion(cq: CqId, qpn: u32, wr_id: u64, status: WcStatus) -> Completion {
    Completion::error(cq, qpn, wr_id, WcOpcode::Recv, status)
}

fn push_recv_error(ctx: &mut ResponderCtx<'_>, wr_id: u64, status: WcStatus) {
    ctx.completions.push_back(error_completion(ctx.init.recv_cq, ctx.qpn, wr_id, status));
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
