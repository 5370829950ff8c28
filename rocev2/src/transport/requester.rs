//! The requester of a QP's send queue (its completer is in `completer.rs`).
//!
//! The requester turns send WQEs into request packets (segmentation by path
//! MTU, PSN assignment, AckReq, READ/ATOMIC limits, fences); the completer
//! matches responses (ACK, NAK, RNR NAK, READ responses, atomic ACKs) to the
//! outstanding WQEs, places READ data and atomic results, retransmits
//! (go-back-N) on sequence NAKs and timeouts, and completes WQEs exactly once,
//! in order — the split rxe makes between `rxe_req.c` and `rxe_comp.c`.
//!
//! Every WQE keeps the PSNs it was first given, so a retransmission carries
//! the same PSNs (IBTA 9.7.4.1.1). PSNs of a WQE: SEND/WRITE one per packet,
//! READ one per expected response packet (`ceil(len / pmtu)`, at least one),
//! ATOMIC one.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use crate::psn::Psn;
use crate::time::Instant;
use crate::transport::attr::{QpAttr, QpInitAttr, QpType};
use crate::transport::ids::{Access, PdId};
use crate::transport::memory::{GatherMemo, MemoryTable};
use crate::transport::path::PathHeaders;
use crate::transport::retired::RetiredCount;
use crate::transport::stats::QpStats;
use crate::transport::wqe::{SendWqe, WqePayload};
use crate::transport::wr::{Completion, SendFlags, SendOp, WcStatus, WorkCompletion};
use crate::wire::{crc, sport, Opcode, PayloadFill};
use crate::wire::{AtomicEthRepr, BthRepr, DethRepr, RethRepr, TransportRepr};

/// AckReq at least every this many packets of a long message (rxe: 64 unacked packets).
pub const ACK_REQ_EVERY: u32 = 64;
/// Most PSNs sent but not yet acknowledged (rxe: `RXE_MAX_UNACKED_PSNS`, 128):
/// bounds what is in flight, so a loss costs at most this much go-back-N.
pub const MAX_UNACKED_PSNS: i32 = 128;
/// The P_Key urnic sends (the default partition).
const PKEY: u16 = 0xffff;

/// What a WQE does on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Send,
    Write,
    Read,
    Atomic,
    /// LOCAL_INV, BIND_MW: executed locally, no packets, no PSN.
    Local,
}

#[derive(Debug)]
pub(super) struct Wqe {
    /// The posted WQE, boxed: the box travels from the poster's ring to here
    /// and back to the poster through [`Requester::take_spent`], so the
    /// several hundred bytes of a WQE are written once, when posted.
    pub(super) wr: Box<SendWqe>,
    pub(super) kind: Kind,
    pub(super) len: u64,
    /// PSN of the first packet; `None` until the requester first sends it.
    pub(super) first_psn: Option<Psn>,
    /// PSNs it consumes.
    pub(super) npsn: u32,
    /// Bytes of READ response placed so far.
    pub(super) read_done: u64,
    /// Completed, with this status.
    pub(super) done: Option<WcStatus>,
    pub(super) signaled: bool,
}

impl Wqe {
    pub(super) fn last_psn(&self) -> Option<Psn> {
        self.first_psn.map(|p| p.add(self.npsn - 1))
    }
    pub(super) fn is_remote(&self) -> bool {
        self.kind != Kind::Local
    }
    pub(super) fn is_rd_atomic(&self) -> bool {
        matches!(self.kind, Kind::Read | Kind::Atomic)
    }
}

/// What the requester needs from its QP for one call. The QP's attributes
/// are borrowed in place, not copied field by field for every frame.
pub(crate) struct RequesterCtx<'a> {
    pub memory: &'a MemoryTable,
    /// The QP's creation attributes (PD, type, send CQ).
    pub init: &'a QpInitAttr,
    /// The QP's current attributes: destination QPN, path MTU, Q_Key,
    /// `timeout` (4.096 µs × 2^timeout, 0 = infinite), `retry_cnt`,
    /// `rnr_retry`, `max_rd_atomic`.
    pub attr: &'a QpAttr,
    pub qpn: u32,
    pub completions: &'a mut VecDeque<Completion>,
    pub stats: &'a mut QpStats,
    /// SQD: finish what was started, start nothing new.
    pub draining: bool,
}

/// The send queue is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QueueFull;

/// A fatal send-queue error: the QP must enter ERR (the failing WQE has
/// already been completed with its status).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SqFatal(pub WcStatus);

/// A QP's send queue: requester plus completer.
#[derive(Debug)]
pub(crate) struct Requester {
    pub(super) wqes: VecDeque<Wqe>,
    pub(super) max_wr: usize,
    /// Index in `wqes` of the WQE being sent.
    pub(super) cur: usize,
    /// Bytes of `wqes[cur]` already sent in this pass (READ: unused).
    pub(super) cur_off: u64,
    pub(super) next_psn: Psn,
    /// Oldest PSN not yet acknowledged.
    pub(super) una: Psn,
    pub(super) retry_left: u8,
    pub(super) rnr_left: u8,
    /// Retransmit (local ACK timeout) deadline.
    pub(super) timer: Option<Instant>,
    /// No transmission before this (RNR back-off).
    pub(super) rnr_until: Option<Instant>,
    pub(super) pkts_since_ack_req: u32,
    /// The PSN a READ was last re-requested from because of a gap in its
    /// responses: later out-of-order responses of the old stream must not
    /// re-request it again (each would start one more full response stream).
    pub(super) read_retry_from: Option<Psn>,
    /// A go-back-N retry started by a PSN sequence error NAK is under way
    /// and nothing was acknowledged since: a repeat of that NAK (a duplicate
    /// on the link, or a copy forged from a capture) neither rewinds again
    /// nor uses up `retry_cnt` (rxe `comp.started_retry`).
    pub(super) seq_retry_started: bool,
    pub(super) ident: u16,
    /// Boxes of reaped WQEs, for the poster to reuse (at most `max_wr`).
    #[allow(clippy::vec_box)] // the boxes, not the WQEs, are what goes back
    spent: Vec<Box<SendWqe>>,
    /// WQEs this send queue has retired, for the post path's full check
    /// (kept across a reset: see [`Requester::reset`]).
    retired: Arc<RetiredCount>,
    /// The local key of the message being sent, resolved at its first frame
    /// and kept while the memory table is unchanged (a one-SGE message's
    /// later frames copy without resolving it again).
    gather_memo: GatherMemo,
}

pub(super) fn local_timeout(code: u8) -> Option<Duration> {
    // IBTA 9.7.6.1.3: 4.096 µs × 2^timeout; 0 disables the timer.
    (code != 0).then(|| Duration::from_nanos(4096u64 << u32::from(code.min(31))))
}

impl Requester {
    pub(crate) fn new(max_wr: u32, sq_psn: Psn, retired: Arc<RetiredCount>) -> Requester {
        Requester {
            wqes: VecDeque::new(),
            max_wr: max_wr.max(1) as usize,
            cur: 0,
            cur_off: 0,
            next_psn: sq_psn,
            una: sq_psn,
            retry_left: 7,
            rnr_left: 7,
            timer: None,
            rnr_until: None,
            pkts_since_ack_req: 0,
            read_retry_from: None,
            seq_retry_started: false,
            ident: 0,
            spent: Vec::new(),
            retired,
            gather_memo: GatherMemo::default(),
        }
    }

    /// The QP went to RESET: a fresh send queue, its WQEs discarded without
    /// completions (IBTA 10.3.1: RESET empties the queues) and counted as
    /// retired, so posting after the next RTS finds every slot free.
    pub(crate) fn reset(&mut self) {
        let retired = self.retired.clone();
        retired.add(self.wqes.len());
        *self = Requester::new(self.max_wr as u32, Psn::new(0), retired);
    }

    /// The count of WQEs this send queue has retired (see [`RetiredCount`]).
    pub(crate) fn retired(&self) -> &Arc<RetiredCount> {
        &self.retired
    }

    /// Set the starting PSN and the retry budgets (on RTR→RTS).
    pub(crate) fn start(&mut self, sq_psn: Psn, retry_cnt: u8, rnr_retry: u8) {
        if self.wqes.iter().all(|w| w.first_psn.is_none()) {
            self.next_psn = sq_psn;
            self.una = sq_psn;
        }
        self.retry_left = retry_cnt;
        self.rnr_left = rnr_retry;
    }

    /// The next PSN the requester will use (query_qp's `sq_psn`).
    pub(crate) fn next_psn(&self) -> Psn {
        self.next_psn
    }

    /// WQEs not yet completed.
    pub(crate) fn outstanding(&self) -> usize {
        self.wqes.len()
    }

    /// Whether a WQE has packets left to send (the cursor has not passed
    /// the queue's end). `false` means [`Requester::poll_transmit`] has
    /// nothing to give until something moves the cursor back (a
    /// retransmission) or a WR is posted.
    #[inline]
    pub(crate) fn has_unsent(&self) -> bool {
        self.cur < self.wqes.len()
    }

    /// Queue a WR. `Err` when the send queue is full (nothing queued).
    pub(crate) fn post(&mut self, wr: Box<SendWqe>, qp_type: QpType, sq_sig_all: bool) -> Result<(), QueueFull> {
        if self.wqes.len() >= self.max_wr {
            return Err(QueueFull);
        }
        let kind = match wr.op {
            SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => Kind::Send,
            SendOp::Write { .. } | SendOp::WriteWithImm { .. } => Kind::Write,
            SendOp::Read { .. } => Kind::Read,
            SendOp::CmpSwap { .. } | SendOp::FetchAdd { .. } => Kind::Atomic,
            SendOp::LocalInv { .. } | SendOp::BindMw { .. } => Kind::Local,
        };
        let _ = qp_type;
        let len = wr.payload.len();
        let signaled = sq_sig_all || wr.flags.contains(SendFlags::SIGNALED);
        self.wqes.push_back(Wqe { wr, kind, len, first_psn: None, npsn: 0, read_done: 0, done: None, signaled });
        Ok(())
    }

    /// When the requester wants `handle_timeout`.
    pub(crate) fn next_timeout(&self) -> Option<Instant> {
        match (self.timer, self.rnr_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn npsn_for(&self, kind: Kind, len: u64, pmtu: u64) -> u32 {
        match kind {
            Kind::Send | Kind::Write | Kind::Read => len.div_ceil(pmtu).max(1) as u32,
            Kind::Atomic => 1,
            Kind::Local => 0,
        }
    }

    /// Complete WQE `i` with `status` (it will be reported in order).
    pub(super) fn finish(&mut self, i: usize, status: WcStatus) {
        if let Some(w) = self.wqes.get_mut(i) {
            if w.done.is_none() {
                w.done = Some(status);
            }
        }
    }

    /// Report finished WQEs at the head, in order, exactly once.
    pub(crate) fn reap(&mut self, ctx: &mut RequesterCtx<'_>) {
        let mut reaped = 0;
        while let Some(w) = self.wqes.front() {
            let Some(status) = w.done else { break };
            if w.signaled || status != WcStatus::Success {
                let byte_len = match w.kind {
                    Kind::Atomic => 8,
                    _ => u32::try_from(w.len).unwrap_or(u32::MAX),
                };
                ctx.completions.push_back(Completion {
                    cq: ctx.init.send_cq,
                    wc: WorkCompletion {
                        wr_id: w.wr.wr_id,
                        status,
                        opcode: w.wr.op.wc_opcode(),
                        qp_num: ctx.qpn,
                        byte_len,
                        imm_data: None,
                        invalidated_rkey: None,
                        src_qp: 0,
                        grh: false,
                    },
                    solicited: false,
                });
            }
            // Only the box moves (its WQE stays where the poster wrote it):
            // kept for the poster to reuse, up to one queue's worth.
            if let Some(w) = self.wqes.pop_front() {
                self.keep_spent(w.wr);
                reaped += 1;
            }
            // `cur` indexes the WQE being sent. Removing the head shifts it
            // down; if the head *was* the one being sent (a rewind into a
            // message the same instant an ACK covered all of it), the next
            // WQE starts from its beginning, not from the old offset.
            if self.cur == 0 {
                self.cur_off = 0;
            } else {
                self.cur -= 1;
            }
        }
        // Their slots are free before their completions leave the engine.
        self.retired.add(reaped);
        if !self.wqes.iter().any(|w| w.done.is_none() && w.first_psn.is_some() && w.is_remote()) {
            self.timer = None;
        }
    }

    /// Keep the box of a WQE done with (reaped, or flushed as it was
    /// posted) for [`take_spent`](Self::take_spent), up to one queue's worth.
    pub(crate) fn keep_spent(&mut self, wr: Box<SendWqe>) {
        if self.spent.len() < self.max_wr {
            self.spent.push(wr);
        }
    }

    /// The boxes of WQEs reaped since the last call, for the poster to fill
    /// again (posting then allocates nothing).
    pub(crate) fn take_spent(&mut self) -> std::vec::Drain<'_, Box<SendWqe>> {
        self.spent.drain(..)
    }

    /// The QP entered ERR: every WQE not yet complete is flushed, in order.
    pub(crate) fn flush(&mut self, ctx: &mut RequesterCtx<'_>) {
        for i in 0..self.wqes.len() {
            self.finish(i, WcStatus::WrFlushErr);
        }
        self.timer = None;
        self.rnr_until = None;
        self.reap(ctx);
        self.cur = 0;
        self.cur_off = 0;
    }

    /// Fail WQE `i` fatally: complete it with `status`; the caller moves the QP to ERR.
    pub(super) fn fatal(&mut self, i: usize, status: WcStatus, ctx: &mut RequesterCtx<'_>) -> SqFatal {
        self.finish(i, status);
        self.reap(ctx);
        SqFatal(status)
    }

    /// Build the next request packet into `buf`, if any is due, along
    /// `path` (the QP's own, used in place; UD sends carry theirs per WR and
    /// ignore it; a connected QP without one sends nothing).
    pub(crate) fn poll_transmit(
        &mut self,
        now: Instant,
        ctx: &mut RequesterCtx<'_>,
        path: Option<&mut PathHeaders>,
        buf: &mut [u8],
    ) -> Result<Option<usize>, SqFatal> {
        if path.is_none() && ctx.init.qp_type != QpType::Ud {
            return Ok(None);
        }
        if self.rnr_until.is_some_and(|t| now < t) {
            return Ok(None);
        }
        self.rnr_until = None;
        let pmtu = u64::from(ctx.attr.path_mtu.bytes());
        // The path MTU is a power of two (256-4096): a packet's index in its
        // message is a shift of its offset, not a 64-bit division.
        let pmtu_shift = ctx.attr.path_mtu.bytes().trailing_zeros();
        loop {
            let Some(w) = self.wqes.get(self.cur) else { return Ok(None) };
            // A message under way (every frame but a message's first): its
            // PSN, the window and the frame from this one look-up of the WQE.
            if let (None, Some(first)) = (w.done, w.first_psn) {
                let psn = match w.kind {
                    Kind::Send | Kind::Write => first.add((self.cur_off >> pmtu_shift) as u32),
                    Kind::Read => first.add((w.read_done >> pmtu_shift) as u32),
                    _ => first,
                };
                // Flow control: stay within MAX_UNACKED_PSNS of the oldest unacked PSN.
                if ctx.init.qp_type == QpType::Rc && psn.distance(self.una) >= MAX_UNACKED_PSNS {
                    return Ok(None);
                }
                return self.emit(now, ctx, path, buf, pmtu, psn).map(Some);
            }
            if w.done.is_some() {
                self.cur += 1;
                self.cur_off = 0;
                continue;
            }
            if w.first_psn.is_none() {
                // Starting a new WQE: ordering rules first.
                if ctx.draining {
                    return Ok(None);
                }
                // Only a fenced WQE or a READ/ATOMIC looks back at the WQEs
                // in flight (a scan of up to the queue's depth): a plain
                // SEND or WRITE starts at once, whatever is outstanding.
                let fenced = w.wr.flags.contains(SendFlags::FENCE);
                if fenced || w.is_rd_atomic() {
                    let earlier_rd_atomic = self.wqes.iter().take(self.cur).filter(|x| x.is_rd_atomic() && x.done.is_none()).count();
                    // IBTA 10.8.3.3 / ibv_post_send(3): IBV_SEND_FENCE waits for prior READ/ATOMIC.
                    if fenced && earlier_rd_atomic > 0 {
                        return Ok(None);
                    }
                    // IBTA C9-?: at most max_rd_atomic outstanding READ/ATOMIC as requester.
                    if w.is_rd_atomic() && earlier_rd_atomic >= usize::from(ctx.attr.max_rd_atomic.max(1)) {
                        return Ok(None);
                    }
                }
                if w.kind == Kind::Local {
                    let i = self.cur;
                    let status = self.execute_local(i, ctx);
                    self.finish(i, status);
                    self.cur += 1;
                    self.reap(ctx);
                    if status != WcStatus::Success {
                        return Err(SqFatal(status));
                    }
                    continue;
                }
                // Local checks before the first packet (ConnectX/rxe: a bad lkey
                // completes with LOC_PROT_ERR and the QP enters ERR).
                // A SEND or WRITE that fits one packet skips it: that packet's
                // gather checks the same SGEs (every one of non-zero length)
                // before it copies a byte, and fails with the same status.
                let needed = if w.is_rd_atomic() { Access::LOCAL_WRITE } else { Access::empty() };
                let gathered_at_once = matches!(w.kind, Kind::Send | Kind::Write) && w.len <= pmtu;
                if let (WqePayload::Sgl(sgl), false) = (&w.wr.payload, gathered_at_once) {
                    if ctx.memory.local_check(ctx.init.pd, sgl, needed).is_err() {
                        let i = self.cur;
                        return Err(self.fatal(i, WcStatus::LocProtErr, ctx));
                    }
                }
                if w.kind == Kind::Atomic && w.len != 8 {
                    let i = self.cur;
                    return Err(self.fatal(i, WcStatus::LocLenErr, ctx));
                }
                if ctx.init.qp_type == QpType::Ud && w.len > pmtu {
                    let i = self.cur;
                    return Err(self.fatal(i, WcStatus::LocLenErr, ctx));
                }
                let npsn = self.npsn_for(w.kind, w.len, pmtu);
                let first = self.next_psn;
                let w = &mut self.wqes[self.cur];
                w.first_psn = Some(first);
                w.npsn = npsn;
                self.next_psn = first.add(npsn);
                self.cur_off = 0;
                // Its first frame goes as every other: the loop finds it under way.
            }
        }
    }

    fn execute_local(&mut self, i: usize, ctx: &mut RequesterCtx<'_>) -> WcStatus {
        match self.wqes[i].wr.op {
            SendOp::LocalInv { rkey } => match ctx.memory.invalidate(ctx.init.pd, ctx.qpn, rkey) {
                Ok(()) => WcStatus::Success,
                Err(_) => WcStatus::LocProtErr,
            },
            SendOp::BindMw { mw_rkey, new_key, mr_lkey, addr, length, access } => {
                match ctx.memory.bind_mw(ctx.init.pd, ctx.qpn, mw_rkey, new_key, mr_lkey, addr, length, access) {
                    Ok(_) => WcStatus::Success,
                    Err(_) => WcStatus::MwBindErr,
                }
            }
            _ => WcStatus::LocQpOpErr,
        }
    }

    /// Emit the packet at the cursor, PSN `psn` (from the cursor:
    /// [`poll_transmit`](Self::poll_transmit) has just computed it for its
    /// window check), and advance the cursor.
    fn emit(
        &mut self,
        now: Instant,
        ctx: &mut RequesterCtx<'_>,
        path: Option<&mut PathHeaders>,
        buf: &mut [u8],
        pmtu: u64,
        psn: Psn,
    ) -> Result<usize, SqFatal> {
        let i = self.cur;
        let w = &self.wqes[i];
        let kind = w.kind;
        // The headers are built where they are emitted from (no BTH built
        // beside them and copied in).
        let mut t = TransportRepr::bth_only(BthRepr { pkey: PKEY, ..BthRepr::new(Opcode::RC_SEND_ONLY, ctx.attr.dest_qp_num, psn) });
        let bth = &mut t.bth;
        let (payload_off, payload_len, last) = match kind {
            Kind::Send | Kind::Write => {
                let off = self.cur_off;
                let n = (w.len - off.min(w.len)).min(pmtu);
                let first = off == 0;
                let last = off + n >= w.len;
                // A middle frame (most of a long message's) from the WQE's
                // kind alone, not `data_opcode`'s match on the operation.
                bth.opcode = if first || last { data_opcode(ctx.init.qp_type, &w.wr.op, first, last) } else { middle_opcode(ctx.init.qp_type, kind) };
                bth.solicited = last && w.wr.flags.contains(SendFlags::SOLICITED);
                if let SendOp::Write { remote } | SendOp::WriteWithImm { remote, .. } = w.wr.op {
                    if first {
                        t.reth = Some(RethRepr { va: remote.addr, rkey: remote.rkey, dma_len: u32::try_from(w.len).unwrap_or(u32::MAX) });
                    }
                }
                if last {
                    match w.wr.op {
                        SendOp::SendWithImm { imm } | SendOp::WriteWithImm { imm, .. } => t.immediate = Some(imm),
                        SendOp::SendWithInv { rkey } => t.invalidate_rkey = Some(rkey),
                        _ => {}
                    }
                }
                if ctx.init.qp_type == QpType::Ud {
                    let ud = w.wr.ud.as_ref();
                    let remote_qkey = ud.map_or(0, |u| u.remote_qkey);
                    // IBTA 10.2.5: a Q_Key with the high bit set means "use the QP's Q_Key".
                    let qkey = if remote_qkey & 0x8000_0000 != 0 { ctx.attr.qkey } else { remote_qkey };
                    t.deth = Some(DethRepr { qkey, resv8: 0, src_qp: ctx.qpn });
                    bth.dest_qp = ud.map_or(0, |u| u.remote_qpn);
                }
                (off, n as usize, last)
            }
            Kind::Read => {
                let SendOp::Read { remote } = w.wr.op else { unreachable!("kind Read") };
                let done = w.read_done;
                bth.opcode = Opcode::RC_READ_REQUEST;
                t.reth = Some(RethRepr {
                    va: remote.addr.wrapping_add(done),
                    rkey: remote.rkey,
                    dma_len: u32::try_from(w.len - done).unwrap_or(u32::MAX),
                });
                (0, 0, true)
            }
            Kind::Atomic => {
                let (remote, swap_add, compare) = match w.wr.op {
                    SendOp::CmpSwap { remote, compare, swap } => (remote, swap, compare),
                    SendOp::FetchAdd { remote, add } => (remote, add, 0),
                    _ => unreachable!("kind Atomic"),
                };
                bth.opcode = if matches!(w.wr.op, SendOp::CmpSwap { .. }) { Opcode::RC_CMP_SWAP } else { Opcode::RC_FETCH_ADD };
                t.atomic_eth = Some(AtomicEthRepr { va: remote.addr, rkey: remote.rkey, swap_add, compare });
                (0, 0, true)
            }
            Kind::Local => unreachable!("local WQEs send nothing"),
        };
        // IBTA 9.7.2 / rxe: AckReq on the last packet of a message, and
        // periodically within long messages.
        self.pkts_since_ack_req += 1;
        if last || self.pkts_since_ack_req >= ACK_REQ_EVERY {
            bth.ack_req = ctx.init.qp_type == QpType::Rc;
            self.pkts_since_ack_req = 0;
        }

        // UD sends carry their own path.
        let mut ud_path;
        let path: &mut PathHeaders = if ctx.init.qp_type == QpType::Ud {
            let Some(ud) = w.wr.ud.as_ref() else {
                return Err(self.fatal(i, WcStatus::LocQpOpErr, ctx));
            };
            ud_path = PathHeaders::new(&ud.av, ud.av.udp_sport.unwrap_or_else(|| sport::ud_sport(ctx.qpn)));
            &mut ud_path
        } else {
            // `poll_transmit` sends nothing on a connected QP without a path.
            let Some(path) = path else { return Err(self.fatal(i, WcStatus::LocQpOpErr, ctx)) };
            path
        };
        self.ident = self.ident.wrapping_add(1);
        path.set_ident(self.ident);
        let mut gather_failed = false;
        // The payload is copied and the ICRC continued over it in one pass
        // (or, in a small frame, copied and then covered with the headers).
        let fill = Gather {
            memory: ctx.memory,
            memo: &mut self.gather_memo,
            pd: ctx.init.pd,
            payload: &w.wr.payload,
            offset: payload_off,
            failed: &mut gather_failed,
        };
        let res = path.emit_with_crc(t, payload_len, buf, fill);
        let n = match res {
            Ok(n) => n,
            Err(_) => return Err(self.fatal(i, WcStatus::LocLenErr, ctx)),
        };
        if gather_failed {
            // The source region went away between the check and the copy.
            return Err(self.fatal(i, WcStatus::LocProtErr, ctx));
        }
        ctx.stats.tx_packets += 1;
        ctx.stats.tx_bytes += n as u64;
        // Advance the cursor.
        if let Kind::Send | Kind::Write = kind {
            self.cur_off = payload_off + payload_len as u64;
        }
        if last {
            self.cur += 1;
            self.cur_off = 0;
            if ctx.init.qp_type != QpType::Rc {
                // UC and UD complete on transmission (no acknowledgements).
                self.finish(i, WcStatus::Success);
                self.reap(ctx);
            }
        }
        if ctx.init.qp_type == QpType::Rc && self.timer.is_none() {
            if let Some(d) = local_timeout(ctx.attr.timeout) {
                self.timer = Some(now + d);
            }
        }
        Ok(n)
    }
}

/// One packet's payload from a send WQE, from byte `offset` of its message:
/// inline bytes, or gathered from its SGEs (checked as they are read; a
/// failed gather zeroes the payload and sets `failed`).
struct Gather<'a> {
    memory: &'a MemoryTable,
    /// The send queue's resolved key ([`MemoryTable::local_gather_crc_lane_memo`]).
    memo: &'a mut GatherMemo,
    pd: PdId,
    payload: &'a WqePayload,
    offset: u64,
    failed: &'a mut bool,
}

impl Gather<'_> {
    /// The inline bytes from `offset` on.
    fn inline(data: &[u8], offset: u64) -> &[u8] {
        data.get(offset as usize..).unwrap_or_default()
    }
}

impl PayloadFill for Gather<'_> {
    const COPIES: bool = true;

    fn copy_crc(self, dst: &mut [u8], crc: u32) -> u32 {
        match self.payload {
            WqePayload::Inline(data) => crc::copy_update(crc, Self::inline(data, self.offset), dst),
            WqePayload::Sgl(sgl) => self.memory.local_gather_crc(self.pd, sgl, self.offset, dst, crc).unwrap_or_else(|_| {
                dst.fill(0);
                *self.failed = true;
                crc
            }),
        }
    }

    fn copy_crc_lane(self, dst: &mut [u8], lane: crc::CrcLane) -> u32 {
        match self.payload {
            WqePayload::Inline(data) => crc::copy_update_lane(lane, Self::inline(data, self.offset), dst),
            WqePayload::Sgl(sgl) => self.memory.local_gather_crc_lane_memo(self.memo, self.pd, sgl, self.offset, dst, lane).unwrap_or_else(|_| {
                dst.fill(0);
                *self.failed = true;
                lane.finish()
            }),
        }
    }

    fn copy(self, dst: &mut [u8]) {
        match self.payload {
            WqePayload::Inline(data) => {
                let src = Self::inline(data, self.offset);
                let n = src.len().min(dst.len());
                dst[..n].copy_from_slice(&src[..n]);
            }
            WqePayload::Sgl(sgl) => {
                if self.memory.local_gather(self.pd, sgl, self.offset, dst).is_err() {
                    dst.fill(0);
                    *self.failed = true;
                }
            }
        }
    }
}

/// The BTH opcode of a SEND/WRITE packet that is neither its message's
/// first nor its last (IBTA 9.2, table 35: SEND_MIDDLE 0x01, RDMA_WRITE_MIDDLE
/// 0x07, in the RC (0x00) or UC (0x20) range): what [`data_opcode`] answers
/// for it, from the WQE's kind (every SEND variant has the one middle
/// opcode, every WRITE variant the other). A UD message is one packet: it
/// has no middle.
#[inline]
fn middle_opcode(qp_type: QpType, kind: Kind) -> Opcode {
    let base = if qp_type == QpType::Uc { 0x20 } else { 0x00 };
    Opcode(base | if kind == Kind::Send { 0x01 } else { 0x07 })
}

/// The BTH opcode of a SEND/WRITE packet (IBTA 9.2, table 35).
fn data_opcode(qp_type: QpType, op: &SendOp, first: bool, last: bool) -> Opcode {
    let base = match qp_type {
        QpType::Ud => {
            return if matches!(op, SendOp::SendWithImm { .. }) { Opcode::UD_SEND_ONLY_IMM } else { Opcode::UD_SEND_ONLY };
        }
        QpType::Uc => 0x20,
        QpType::Rc => 0x00,
    };
    let low = match (op, first, last) {
        (SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. }, true, false) => 0x00,
        (SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. }, false, false) => 0x01,
        (SendOp::Send, false, true) => 0x02,
        (SendOp::SendWithImm { .. }, false, true) => 0x03,
        (SendOp::Send, true, true) => 0x04,
        (SendOp::SendWithImm { .. }, true, true) => 0x05,
        (SendOp::SendWithInv { .. }, false, true) => 0x16,
        (SendOp::SendWithInv { .. }, true, true) => 0x17,
        (_, true, false) => 0x06,
        (_, false, false) => 0x07,
        (SendOp::WriteWithImm { .. }, false, true) => 0x09,
        (_, false, true) => 0x08,
        (SendOp::WriteWithImm { .. }, true, true) => 0x0b,
        (_, true, true) => 0x0a,
    };
    Opcode(base | low)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::wr::RemoteAddr;

    /// A middle frame's opcode from the WQE's kind is `data_opcode`'s for
    /// every SEND and WRITE variant on RC and UC; the two differ in the
    /// table's rows (so a wrong constant fails).
    #[test]
    fn middle_opcode_is_data_opcodes_middle() {
        let remote = RemoteAddr { addr: 0x1000, rkey: 7 };
        let ops = [
            (SendOp::Send, Kind::Send),
            (SendOp::SendWithImm { imm: 1 }, Kind::Send),
            (SendOp::SendWithInv { rkey: 2 }, Kind::Send),
            (SendOp::Write { remote }, Kind::Write),
            (SendOp::WriteWithImm { remote, imm: 3 }, Kind::Write),
        ];
        for qp_type in [QpType::Rc, QpType::Uc] {
            for (op, kind) in &ops {
                assert_eq!(middle_opcode(qp_type, *kind), data_opcode(qp_type, op, false, false), "{qp_type:?} {op:?}");
            }
        }
        assert_eq!(middle_opcode(QpType::Rc, Kind::Send), Opcode::RC_SEND_MIDDLE);
        assert_eq!(middle_opcode(QpType::Uc, Kind::Write), Opcode::UC_WRITE_MIDDLE);
    }
}
