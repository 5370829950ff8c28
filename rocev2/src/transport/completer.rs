//! The completer (rxe_comp.c): matches responses — ACKs, NAKs, RNR NAKs,
//! READ responses, atomic ACKs — to the outstanding WQEs of a QP's send
//! queue, places READ data and atomic results, decides retransmission
//! (go-back-N on sequence NAKs, implicit NAKs and timeouts, RNR back-off)
//! and completes WQEs exactly once, in order. Responses for PSNs that are
//! not outstanding change nothing.

use std::time::Duration;

use crate::psn::Psn;
use crate::time::Instant;
use crate::transport::requester::{local_timeout, Kind, Requester, RequesterCtx, SqFatal};
use crate::transport::wqe::WqePayload;
use crate::transport::wr::WcStatus;
use crate::wire::rnr_timer_nanos;
use crate::wire::{AckSyndrome, NakCode};
use crate::wire::{Opcode, ParsedFrame};

impl Requester {
    /// Go back to `psn`: the WQE containing it (or the first unfinished one
    /// after it) is sent again from there, with the same PSNs.
    fn rewind(&mut self, psn: Psn, pmtu: u64) {
        let Some(i) = self
            .wqes
            .iter()
            .position(|w| w.done.is_none() && w.is_remote() && w.first_psn.is_some() && w.last_psn().is_some_and(|l| !l.is_before(psn)))
        else {
            return;
        };
        let w = &self.wqes[i];
        let first = w.first_psn.expect("filtered");
        self.cur = i;
        self.cur_off = match w.kind {
            Kind::Send | Kind::Write => {
                let idx = if psn.is_after(first) { psn.distance(first) as u64 } else { 0 };
                (idx * pmtu).min(w.len)
            }
            _ => 0,
        };
        self.pkts_since_ack_req = 0;
    }

    /// Complete every SEND/WRITE whose last PSN is before `psn` (an ACK or NAK
    /// for `psn` implicitly acknowledges them, IBTA 9.7.5.1.2). Returns the
    /// index of the first WQE not finished by this — a covered READ/ATOMIC
    /// whose response is missing, else the first WQE not covered — and whether
    /// anything progressed.
    ///
    /// SEND/WRITEs after such a READ/ATOMIC are completed too (the responder
    /// executed them: it acknowledges only what it received in order); `reap`
    /// still reports them after the READ/ATOMIC. Leaving them pending while
    /// `una` moves past them would strand them: a later timeout resumes at
    /// `una` and would find nothing to send.
    fn ack_before(&mut self, psn: Psn, inclusive: bool) -> (bool, Option<usize>) {
        let mut progressed = false;
        let mut stuck = None;
        for i in 0..self.wqes.len() {
            let w = &self.wqes[i];
            if w.done.is_some() || !w.is_remote() {
                continue;
            }
            let Some(last) = w.last_psn() else { return (progressed, stuck.or(Some(i))) };
            let covered = if inclusive { !last.is_after(psn) } else { last.is_before(psn) };
            if !covered {
                return (progressed, stuck.or(Some(i)));
            }
            match w.kind {
                Kind::Send | Kind::Write => {
                    // The responder acknowledges only what it received in order.
                    self.wqes[i].done = Some(WcStatus::Success);
                    progressed = true;
                }
                // An ACK beyond a READ/ATOMIC means its response was lost.
                _ => {
                    stuck = stuck.or(Some(i));
                }
            }
        }
        (progressed, stuck)
    }

    fn progress(&mut self, now: Instant, ctx: &RequesterCtx<'_>) {
        self.seq_retry_started = false;
        self.retry_left = ctx.attr.retry_cnt;
        self.rnr_left = ctx.attr.rnr_retry;
        self.timer = local_timeout(ctx.attr.timeout).map(|d| now + d);
    }

    /// A response for this QP (ACK, NAK, READ response, atomic ACK).
    pub(crate) fn handle_response(&mut self, now: Instant, ctx: &mut RequesterCtx<'_>, frame: &ParsedFrame<'_>) -> Result<(), SqFatal> {
        let t = &frame.repr.transport;
        let psn = t.bth.psn;
        let op = t.bth.opcode;
        let pmtu = u64::from(ctx.attr.path_mtu.bytes());
        // A response for a PSN we never sent is a ghost (IBTA 9.7.5.1.6): ignore.
        if !psn.is_before(self.next_psn) {
            ctx.stats.req_ghost_responses += 1;
            return Ok(());
        }
        // A response is valid only for a PSN still outstanding; anything
        // older is a duplicate or a stale (or forged) copy and changes
        // nothing (rxe_comp.c `check_psn`: a PSN before `comp.psn` is
        // dropped, except a READ response restarting the current READ,
        // which `oldest_outstanding` covers). Without this an old error NAK
        // would fail whatever WQE came later, or an idle QP.
        match self.oldest_outstanding(pmtu) {
            Some(oldest) if !psn.is_before(oldest) => {}
            _ => {
                ctx.stats.req_stale_responses += 1;
                return Ok(());
            }
        }
        let result = if op == Opcode::RC_ACK {
            let aeth = t.aeth.expect("ACK carries an AETH");
            match aeth.syndrome {
                AckSyndrome::Ack { .. } => {
                    ctx.stats.req_acks_received += 1;
                    let advanced = self.advance_una(psn.next());
                    let (progressed, stuck) = self.ack_before(psn, true);
                    // Progress includes an ACK in the middle of a long message.
                    if progressed || advanced {
                        self.progress(now, ctx);
                    } else {
                        ctx.stats.req_duplicate_acks += 1;
                    }
                    if let Some(i) = stuck {
                        let w = &self.wqes[i];
                        // Implicit NAK: the ACK covers a READ/ATOMIC whose response never came.
                        if w.is_rd_atomic() && w.first_psn.is_some_and(|f| !f.is_after(psn)) && self.cur > i {
                            let resume = w.first_psn.expect("checked").add((w.read_done / pmtu) as u32);
                            self.rewind(resume, pmtu);
                        }
                    }
                    Ok(())
                }
                AckSyndrome::RnrNak { timer } => {
                    ctx.stats.req_rnr_naks_received += 1;
                    tracing::debug!(qpn = ctx.qpn, psn = psn.value(), timer, rnr_left = self.rnr_left, "RNR NAK received");
                    self.ack_before(psn, false);
                    self.advance_una(psn);
                    // IBTA 9.7.5.2.8: rnr_retry 7 means retry forever.
                    if ctx.attr.rnr_retry != 7 {
                        if self.rnr_left == 0 {
                            let i = self.index_of(psn);
                            return self.fail_at(i, WcStatus::RnrRetryExcErr, ctx);
                        }
                        self.rnr_left -= 1;
                    }
                    self.rnr_until = Some(now + Duration::from_nanos(rnr_timer_nanos(timer)));
                    self.rewind(psn, pmtu);
                    self.timer = None;
                    Ok(())
                }
                AckSyndrome::Nak(NakCode::PsnSequenceError) => {
                    ctx.stats.req_naks_seq_received += 1;
                    tracing::debug!(qpn = ctx.qpn, psn = psn.value(), retry_left = self.retry_left, "sequence NAK received");
                    let (progressed, _) = self.ack_before(psn, false);
                    let advanced = self.advance_una(psn);
                    // The NAK implicitly acknowledges everything before its PSN
                    // (IBTA 9.7.5.1.2): that is progress, also inside a long
                    // message, and resets the retry budget and the timer.
                    if progressed || advanced {
                        self.progress(now, ctx);
                    } else if self.seq_retry_started {
                        // The same NAK again with nothing acknowledged since:
                        // the retry it asks for is already under way (rxe
                        // `started_retry`: ignored). Only timeouts and NAKs
                        // that rewind work count against retry_cnt.
                        ctx.stats.req_duplicate_naks += 1;
                        self.reap(ctx);
                        return Ok(());
                    }
                    // IBTA 9.7.5.2.1: go back to the NAKed PSN; counts against retry_cnt.
                    if self.retry_left == 0 {
                        let i = self.index_of(psn);
                        return self.fail_at(i, WcStatus::RetryExcErr, ctx);
                    }
                    self.retry_left -= 1;
                    self.seq_retry_started = true;
                    ctx.stats.req_retransmits += 1;
                    tracing::debug!(qpn = ctx.qpn, from = psn.value(), "retransmitting after a sequence NAK");
                    self.rewind(psn, pmtu);
                    Ok(())
                }
                AckSyndrome::Nak(code) => {
                    ctx.stats.req_naks_error_received += 1;
                    tracing::debug!(qpn = ctx.qpn, psn = psn.value(), ?code, "NAK received: the WR fails");
                    self.ack_before(psn, false);
                    let status = match code {
                        NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                        NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                        NakCode::RemoteOperationalError => WcStatus::RemOpErr,
                        _ => WcStatus::BadRespErr,
                    };
                    let i = self.index_of(psn);
                    self.fail_at(i, status, ctx)
                }
                AckSyndrome::Reserved(_) => {
                    ctx.stats.req_bad_responses += 1;
                    Ok(())
                }
            }
        } else if op.is_read_response() {
            self.handle_read_response(now, ctx, frame, pmtu)
        } else if op == Opcode::RC_ATOMIC_ACK {
            self.handle_atomic_ack(now, ctx, frame)
        } else {
            ctx.stats.req_bad_responses += 1;
            Ok(())
        };
        self.reap(ctx);
        result
    }

    fn index_of(&self, psn: Psn) -> Option<usize> {
        self.wqes.iter().position(|w| w.done.is_none() && w.is_remote() && w.last_psn().is_some_and(|l| !l.is_before(psn)))
    }

    /// Fail the WQE `i` fatally. `None` (no outstanding WQE holds the PSN;
    /// `handle_response` lets only outstanding PSNs this far, so this is a
    /// safety net) fails nothing: the response is counted as stale.
    fn fail_at(&mut self, i: Option<usize>, status: WcStatus, ctx: &mut RequesterCtx<'_>) -> Result<(), SqFatal> {
        match i {
            Some(i) => Err(self.fatal(i, status, ctx)),
            None => {
                ctx.stats.req_stale_responses += 1;
                Ok(())
            }
        }
    }

    /// The oldest PSN a response may still name, `None` when nothing is
    /// outstanding (no WQE sent and not yet complete): the oldest
    /// unacknowledged PSN, or, when a later ACK covered a READ/ATOMIC whose
    /// response never came, where that READ/ATOMIC resumes.
    fn oldest_outstanding(&self, pmtu: u64) -> Option<Psn> {
        let w = self.wqes.iter().find(|w| w.done.is_none() && w.is_remote() && w.first_psn.is_some())?;
        let first = w.first_psn?;
        let resume = match w.kind {
            Kind::Read => first.add((w.read_done / pmtu) as u32),
            Kind::Atomic => first,
            _ => self.una,
        };
        Some(if self.una.is_before(resume) { self.una } else { resume })
    }

    fn handle_read_response(&mut self, now: Instant, ctx: &mut RequesterCtx<'_>, frame: &ParsedFrame<'_>, pmtu: u64) -> Result<(), SqFatal> {
        let psn = frame.repr.transport.bth.psn;
        // Responses before the READ acknowledge earlier SEND/WRITEs.
        let (_, at) = self.ack_before(psn, false);
        let Some(i) = at else {
            ctx.stats.req_duplicate_acks += 1;
            return Ok(());
        };
        let w = &self.wqes[i];
        if w.kind != Kind::Read || w.first_psn.is_none() {
            ctx.stats.req_bad_responses += 1;
            return Ok(());
        }
        let first = w.first_psn.expect("checked");
        let expected = first.add((w.read_done / pmtu) as u32);
        if psn != expected {
            if psn.is_after(expected) {
                // A response went missing: ask again from the first missing
                // byte, once per gap (the rest of the stream that skipped it is
                // still arriving; the timeout covers a lost re-request).
                if self.read_retry_from != Some(expected) {
                    self.read_retry_from = Some(expected);
                    ctx.stats.req_retransmits += 1;
                    tracing::debug!(qpn = ctx.qpn, from = expected.value(), got = psn.value(), "READ response missing: requesting again");
                    self.rewind(expected, pmtu);
                }
            } else {
                ctx.stats.req_duplicate_acks += 1;
            }
            return Ok(());
        }
        let payload = frame.payload;
        let remaining = w.len - w.read_done;
        let op = frame.repr.transport.bth.opcode;
        let is_last = op == Opcode::RC_READ_RESPONSE_LAST || op == Opcode::RC_READ_RESPONSE_ONLY;
        // IBTA 9.7.5.1.3: FIRST/MIDDLE carry exactly a path MTU; the whole response matches the request.
        let bad_len =
            payload.len() as u64 > remaining || (!is_last && payload.len() as u64 != pmtu) || (is_last && payload.len() as u64 != remaining);
        if bad_len {
            ctx.stats.req_bad_responses += 1;
            return self.fail_at(Some(i), WcStatus::BadRespErr, ctx);
        }
        if let WqePayload::Sgl(sgl) = &w.wr.payload {
            if ctx.memory.local_scatter(ctx.init.pd, sgl, w.read_done, payload).is_err() {
                return self.fail_at(Some(i), WcStatus::LocProtErr, ctx);
            }
        }
        self.advance_una(psn.next());
        let w = &mut self.wqes[i];
        w.read_done += payload.len() as u64;
        if is_last {
            w.done = Some(WcStatus::Success);
        }
        self.progress(now, ctx);
        Ok(())
    }

    fn handle_atomic_ack(&mut self, now: Instant, ctx: &mut RequesterCtx<'_>, frame: &ParsedFrame<'_>) -> Result<(), SqFatal> {
        let psn = frame.repr.transport.bth.psn;
        let (_, at) = self.ack_before(psn, false);
        let Some(i) = at else {
            ctx.stats.req_duplicate_acks += 1;
            return Ok(());
        };
        let w = &self.wqes[i];
        if w.kind != Kind::Atomic || w.first_psn != Some(psn) {
            ctx.stats.req_duplicate_acks += 1;
            return Ok(());
        }
        let orig = frame.repr.transport.atomic_ack.unwrap_or(0);
        // The result lands in host byte order, as the target's atomics are.
        if let WqePayload::Sgl(sgl) = &w.wr.payload {
            if ctx.memory.local_scatter(ctx.init.pd, sgl, 0, &orig.to_ne_bytes()).is_err() {
                return self.fail_at(Some(i), WcStatus::LocProtErr, ctx);
            }
        }
        self.wqes[i].done = Some(WcStatus::Success);
        self.advance_una(psn.next());
        self.progress(now, ctx);
        Ok(())
    }

    /// Move the oldest-unacknowledged PSN forward; whether it moved.
    fn advance_una(&mut self, psn: Psn) -> bool {
        if psn.is_after(self.una) && !psn.is_after(self.next_psn) {
            self.una = psn;
            true
        } else {
            false
        }
    }

    /// Timers: RNR back-off ends, or the local ACK timeout fires.
    pub(crate) fn handle_timeout(&mut self, now: Instant, ctx: &mut RequesterCtx<'_>) -> Result<(), SqFatal> {
        if self.rnr_until.is_some_and(|t| t <= now) {
            self.rnr_until = None;
        }
        let Some(t) = self.timer else { return Ok(()) };
        if now < t {
            return Ok(());
        }
        self.timer = None;
        self.read_retry_from = None;
        self.seq_retry_started = false;
        let Some(i) = self.wqes.iter().position(|w| w.done.is_none() && w.is_remote() && w.first_psn.is_some()) else {
            return Ok(());
        };
        ctx.stats.req_timeouts += 1;
        tracing::debug!(qpn = ctx.qpn, retry_left = self.retry_left, "local ACK timeout");
        // IBTA 9.7.6.1.3: retry_cnt counts timeouts; exhausted → RETRY_EXC_ERR.
        if self.retry_left == 0 {
            return Err(self.fatal(i, WcStatus::RetryExcErr, ctx));
        }
        self.retry_left -= 1;
        ctx.stats.req_retransmits += 1;
        let w = &self.wqes[i];
        let pmtu = u64::from(ctx.attr.path_mtu.bytes());
        let first = w.first_psn.expect("filtered");
        // Resume at the oldest unacknowledged PSN (inside this WQE or at its start).
        // `una` can be past a READ/ATOMIC whose response was lost (a later ACK
        // covered it): those resume from their own progress, never from `una`.
        let resume = match w.kind {
            Kind::Read => first.add((w.read_done / pmtu) as u32),
            Kind::Atomic => first,
            _ if self.una.is_after(first) => self.una,
            _ => first,
        };
        self.rewind(resume, pmtu);
        Ok(())
    }
}
