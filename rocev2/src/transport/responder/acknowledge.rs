//! The responses a responder sends (rxe_resp.c `acknowledge`, `read_reply`):
//! ACKs, NAKs and RNR NAKs queued in request order, READ responses read from
//! registered memory straight into the frame, atomic ACKs.
//!
//! # Held ACKs
//!
//! An RC ping-pong moves two frames each way: the reply and the ACK of the
//! peer's message. The ACK of a completed SEND or WRITE (the application is
//! likely to answer it: a receive completed, or memory it may be spinning
//! on changed) is therefore held while it is the only response queued,
//! until this QP's requester sends its next frame (the reply: the ACK then
//! leaves right behind it, in the same kick) or until a deadline the engine
//! sets from [`EngineConfig::ack_hold`](crate::transport::engine::EngineConfig)
//! and its timer queue, whichever comes first. This is allowed because one
//! ACK acknowledges every PSN up to its own (IBTA 9.7.5.1.1, coalesced
//! acknowledges; rxe merges them the same way), and the requester only
//! needs it before its local ACK timeout (IBTA 9.7.6.1.3, 4.096 µs ×
//! 2^timeout: 8 µs at the smallest setting, 67 ms at the usual 14), which
//! the hold's bound stays far below. Held ACKs coalesce: further requests
//! update the held ACK's PSN and MSN and keep its first deadline. Nothing
//! else is ever held: NAKs, RNR NAKs, re-ACKs of duplicates (C9-105), ACKs
//! asked for in the middle of a message, READ responses and atomic ACKs
//! leave at once, and any of them queued behind a held ACK releases it
//! (the queue stays in request order).

use crate::psn::Psn;
use crate::transport::path::PathHeaders;
use crate::transport::wr::WcStatus;
use crate::wire::{crc, Opcode, PayloadFill};
use crate::wire::{AckSyndrome, AethRepr, BthRepr, NakCode, TransportRepr};

use super::*;

impl Responder {
    pub(super) fn push(&mut self, ctx: &mut ResponderCtx<'_>, p: Pending) -> bool {
        // Whatever follows a held ACK must not wait: release it.
        self.release_hold();
        if self.pending.len() >= PENDING_CAP {
            ctx.stats.resp_responses_dropped += 1;
            return false;
        }
        self.pending.push_back(p);
        true
    }

    /// Queue a positive ACK for `psn` to leave at once, merged into a
    /// positive ACK at the tail of the queue (one ACK may cover several
    /// packets, IBTA 9.7.5.1.1); a held one is released.
    pub(super) fn queue_ack(&mut self, ctx: &mut ResponderCtx<'_>, psn: Psn) {
        self.release_hold();
        self.merge_or_push_ack(ctx, psn);
    }

    /// Queue the positive ACK of a whole SEND or WRITE, which may be held
    /// for the application's answer (module docs, "Held ACKs"): if nothing
    /// else is queued, or only an ACK already held (merged into it, keeping
    /// its deadline).
    pub(super) fn queue_reply_ack(&mut self, ctx: &mut ResponderCtx<'_>, psn: Psn) {
        let may_hold = self.pending.is_empty() || self.held_until.is_some() || self.hold_wanted;
        self.merge_or_push_ack(ctx, psn);
        if may_hold && self.held_until.is_none() && self.pending.len() == 1 {
            self.hold_wanted = true;
        }
    }

    /// The engine's half of a hold: if the last request queued an ACK that
    /// may be held, hold it until `now + hold` (a zero `hold` sends it at
    /// once). Returns the deadline, for the engine's timer queue, if a new
    /// hold began.
    ///
    /// Inline: every request frame asks, and most have queued no ACK that
    /// may be held (`hold_wanted` unset); the rest is out of line.
    #[inline(always)]
    pub(crate) fn start_hold(&mut self, now: Instant, hold: core::time::Duration) -> Option<Instant> {
        if !self.hold_wanted {
            return None;
        }
        self.start_wanted_hold(now, hold)
    }

    /// [`start_hold`](Self::start_hold) once an ACK that may be held was queued.
    #[inline(never)]
    fn start_wanted_hold(&mut self, now: Instant, hold: core::time::Duration) -> Option<Instant> {
        self.hold_wanted = false;
        if hold.is_zero() || self.pending.len() != 1 {
            return None;
        }
        let until = now + hold;
        self.held_until = Some(until);
        self.hold_expired = false;
        Some(until)
    }

    /// Whether an ACK is held (before or after its deadline): this QP's
    /// next request frame goes before it.
    pub(crate) fn has_held_ack(&self) -> bool {
        self.held_until.is_some()
    }

    /// Whether the held ACK still waits at `now` (its deadline has not
    /// passed).
    pub(crate) fn holding(&self, now: Instant) -> bool {
        self.held_until.is_some_and(|t| now < t) && !self.hold_expired
    }

    /// The held ACK's deadline, while it waits for it (for the engine's
    /// timer queue).
    pub(crate) fn hold_deadline(&self) -> Option<Instant> {
        self.held_until.filter(|_| !self.hold_expired)
    }

    /// Send the held ACK at the next `poll_transmit` (the requester has just
    /// sent the reply it waited for, or something else was queued behind
    /// it).
    pub(crate) fn release_hold(&mut self) {
        self.held_until = None;
        self.hold_wanted = false;
        self.hold_expired = false;
    }

    /// The held ACK's deadline is at or before `now`: it leaves behind the
    /// next frames the engine sends (alone if there are none). Returns
    /// whether it expired now.
    pub(crate) fn expire_hold(&mut self, now: Instant) -> bool {
        let due = self.held_until.is_some_and(|t| t <= now) && !self.hold_expired;
        self.hold_expired |= due;
        due
    }

    fn merge_or_push_ack(&mut self, ctx: &mut ResponderCtx<'_>, psn: Psn) {
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

    pub(super) fn queue_nak(&mut self, ctx: &mut ResponderCtx<'_>, code: NakCode, psn: Psn) {
        tracing::debug!(qpn = ctx.qpn, psn = psn.value(), ?code, "sending NAK");
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
    pub(crate) fn poll_transmit(&mut self, ctx: &mut ResponderCtx<'_>, path: &PathHeaders, dest_qpn: u32, buf: &mut [u8]) -> Option<usize> {
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
    pub(super) fn read_response(
        &mut self,
        ctx: &mut ResponderCtx<'_>,
        path: &PathHeaders,
        dest_qpn: u32,
        buf: &mut [u8],
        (rkey, va, remaining, psn, first, msn): (u32, u64, u32, Psn, bool, u32),
    ) -> Option<usize> {
        let mtu = ctx.attr.path_mtu.bytes();
        let n = remaining.min(mtu);
        let opcode = match (first, remaining <= mtu) {
            (true, true) => Opcode::RC_READ_RESPONSE_ONLY,
            (true, false) => Opcode::RC_READ_RESPONSE_FIRST,
            (false, false) => Opcode::RC_READ_RESPONSE_MIDDLE,
            (false, true) => Opcode::RC_READ_RESPONSE_LAST,
        };
        // AETH on FIRST, LAST and ONLY (IBTA 9.3.4 table 36).
        let aeth = (opcode != Opcode::RC_READ_RESPONSE_MIDDLE).then_some(AethRepr { syndrome: AckSyndrome::Ack { credits: CREDITS_INVALID }, msn });
        let tr = response(opcode, dest_qpn, psn, aeth, None);
        let mut failed = false;
        let source = ReadSource { memory: ctx.memory, pd: ctx.init.pd, qpn: ctx.qpn, rkey, va, failed: &mut failed };
        let emitted = path.emit_with_crc(tr, n as usize, buf, source);
        let len = match emitted {
            Ok(len) => len,
            Err(_) => {
                self.pending.pop_front();
                ctx.stats.resp_responses_dropped += 1;
                return None;
            }
        };
        if failed {
            // rxe read_reply → RESPST_ERR_RKEY_VIOLATION: class C, remote
            // access error NAK in place of the response; the QP goes to ERR.
            self.pending.clear();
            self.release_hold();
            self.error = true;
            self.fatal = Some(WcStatus::RemAccessErr);
            ctx.stats.resp_naks_rem_access_sent += 1;
            tracing::debug!(qpn = ctx.qpn, psn = psn.value(), "sending NAK: remote access error (READ source)");
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

/// One READ response packet's payload, read from the responder's region
/// straight into the frame. The key is checked again for every packet (rxe
/// `rxe_recheck_mr`): the region may have been deregistered or invalidated
/// since. A failed read sets `failed` (the frame is then not sent). As a
/// [`PayloadFill`] it can copy without the CRC, so a small response takes its
/// ICRC in one run over headers and payload, as a small WRITE does.
struct ReadSource<'a> {
    memory: &'a MemoryTable,
    pd: PdId,
    qpn: u32,
    rkey: u32,
    va: u64,
    failed: &'a mut bool,
}

impl PayloadFill for ReadSource<'_> {
    const COPIES: bool = true;

    fn copy_crc(self, dst: &mut [u8], crc: u32) -> u32 {
        // A zero-length READ's response reads nothing: no key to check.
        if dst.is_empty() {
            return crc;
        }
        self.memory.remote_read_crc(self.pd, self.qpn, self.rkey, self.va, dst, crc).unwrap_or_else(|_| {
            *self.failed = true;
            crc
        })
    }

    fn copy_crc_lane(self, dst: &mut [u8], lane: crc::CrcLane) -> u32 {
        // The headers' lane goes into the fused copy unreduced, as a
        // requester's frame's does (`Gather`): one final reduction a frame.
        if dst.is_empty() {
            return lane.finish();
        }
        self.memory.remote_read_crc_lane(self.pd, self.qpn, self.rkey, self.va, dst, lane).unwrap_or_else(|_| {
            *self.failed = true;
            lane.finish()
        })
    }

    fn copy(self, dst: &mut [u8]) {
        if !dst.is_empty() && self.memory.remote_read(self.pd, self.qpn, self.rkey, self.va, dst).is_err() {
            *self.failed = true;
        }
    }
}

pub(super) fn response(opcode: Opcode, dest_qpn: u32, psn: Psn, aeth: Option<AethRepr>, atomic_ack: Option<u64>) -> TransportRepr {
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
