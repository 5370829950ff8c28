//! Queues shared between application threads and the datapath: the urnic
//! equivalent of the rings a hardware NIC shares with its driver.
//!
//! Posting and polling are lock-free (a QP's send ring is [`SendRing`], a
//! receive queue's or an SRQ's [`RecvRing`], a CQ's [`CompletionRing`]) and
//! touch only the queue of the QP or CQ concerned.
//!
//! A work queue's depth bounds the WRs posted and not yet retired, those the
//! datapath took and the engine still holds included, as on an HCA: a post
//! beyond it is refused at once (`ENOMEM`), never queued to fail later. The
//! engine counts what it retires ([`RetiredCount`]); the rings compare.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;

use crossbeam_queue::ArrayQueue;
use rocev2::transport::attr::SrqId;
use rocev2::transport::retired::RetiredCount;
use rocev2::transport::wqe::SendWrRef;

pub use crate::completion_ring::CompletionRing;
pub use crate::recv_ring::{RecvConsumer, RecvRing};
pub use crate::send_ring::{SendConsumer, SendRing};
use rocev2::transport::wr::{CqId, WcStatus, WorkCompletion};

/// A QP's send and receive rings plus its doorbell flag.
pub struct QpRings {
    /// Local QPN.
    pub qpn: u32,
    /// CQ of send completions.
    pub send_cq: CqId,
    /// CQ of receive completions.
    pub recv_cq: CqId,
    /// Send WRs posted by the application, not yet taken by the datapath:
    /// each WQE is written once, into the box of its ring slot; the box moves
    /// on to the engine's send queue and comes back as a spare once the WQE
    /// is reaped ([`SendRing`]).
    pub send: SendRing,
    /// Receive WRs posted by the application (QPs without an SRQ), each
    /// written once, in place, into its ring slot ([`RecvRing`]).
    pub recv: RecvRing,
    /// Set while the QP's QPN sits in the device doorbell queue.
    pub(crate) rung: AtomicBool,
}

/// A work queue's depth and the engine's count of the WQEs it retired (see
/// the module docs).
#[derive(Clone, Debug)]
pub struct WqBound {
    /// `max_wr` (at least 1).
    pub depth: usize,
    /// The engine's count for this queue
    /// ([`Engine::qp_retired_counts`](rocev2::transport::engine::Engine::qp_retired_counts)).
    pub retired: Arc<RetiredCount>,
}

impl WqBound {
    /// A queue of `depth` WRs with a count of its own (a queue the engine
    /// does not hold: tests, benchmarks).
    pub fn unshared(depth: usize) -> WqBound {
        WqBound { depth, retired: Arc::default() }
    }
}

impl QpRings {
    /// Rings for `qpn`, bounded by its send and receive queues.
    pub fn new(qpn: u32, send_cq: CqId, recv_cq: CqId, send: WqBound, recv: WqBound) -> QpRings {
        QpRings {
            qpn,
            send_cq,
            recv_cq,
            send: SendRing::new(send.depth, send.retired),
            recv: RecvRing::new(recv.depth, recv.retired),
            rung: AtomicBool::new(false),
        }
    }

    /// Queue a send WR for the datapath, written in place into its ring slot
    /// (only the fields, SGEs and inline bytes it has). `false` if the ring
    /// is full (nothing queued).
    #[inline]
    pub fn push_send(&self, wr: &SendWrRef<'_>) -> bool {
        self.send.push(wr)
    }
}

/// An SRQ's receive ring plus its doorbell flag.
pub struct SrqRing {
    /// The SRQ.
    pub id: SrqId,
    /// Receive WRs posted by the application.
    pub recv: RecvRing,
    pub(crate) rung: AtomicBool,
}

impl SrqRing {
    /// The ring of an SRQ bounded by `bound`.
    pub fn new(id: SrqId, bound: WqBound) -> SrqRing {
        SrqRing { id, recv: RecvRing::new(bound.depth, bound.retired), rung: AtomicBool::new(false) }
    }
}

/// An eventfd: a counter the datapath bumps and a waiter can block on.
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// A new, non-blocking-write eventfd.
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd takes no pointers; a negative return is an error.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor we own.
        Ok(EventFd { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// Add one to the counter, waking a blocked `wait`.
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our own descriptor.
        let _ = unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Block until the counter is non-zero, then reset it; returns its value.
    ///
    /// One `read(2)`, so a signal interrupts it as it interrupts libibverbs'
    /// read of the kernel's channel: with a handler installed without
    /// `SA_RESTART` the wait fails with [`io::ErrorKind::Interrupted`]
    /// (programs such as qperf end a test from SIGALRM and rely on the
    /// blocked `ibv_get_cq_event` returning EINTR); with `SA_RESTART` the
    /// kernel restarts the read.
    pub fn wait(&self) -> io::Result<u64> {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64 from our own descriptor.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        if n == 8 {
            Ok(v)
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// A completion channel (`ibv_comp_channel`): CQs armed with
/// `req_notify` report here when a completion arrives.
pub struct CompletionChannel {
    fd: EventFd,
    ready: ArrayQueue<CqId>,
}

impl CompletionChannel {
    /// A new channel able to hold `capacity` pending CQ events.
    pub fn new(capacity: usize) -> io::Result<CompletionChannel> {
        Ok(CompletionChannel { fd: EventFd::new()?, ready: ArrayQueue::new(capacity.max(1)) })
    }

    fn notify(&self, cq: CqId) {
        let _ = self.ready.push(cq);
        self.fd.signal();
    }

    /// Block until some CQ has an event (`ibv_get_cq_event`); returns its id.
    /// A signal interrupts the wait as [`EventFd::wait`] says (an error of
    /// kind [`io::ErrorKind::Interrupted`]).
    pub fn get_event(&self) -> io::Result<CqId> {
        loop {
            if let Some(cq) = self.ready.pop() {
                return Ok(cq);
            }
            self.fd.wait()?;
        }
    }

    /// A CQ event if one is pending, without blocking.
    pub fn try_get_event(&self) -> Option<CqId> {
        self.ready.pop()
    }

    /// The eventfd, for use with poll/epoll.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

const ARM_NONE: u8 = 0;
const ARM_ANY: u8 = 1;
const ARM_SOLICITED: u8 = 2;

/// A completion queue's ring.
pub struct CqRing {
    /// The CQ's id.
    pub id: CqId,
    ring: CompletionRing,
    armed: AtomicU8,
    overflowed: AtomicBool,
    channel: Option<std::sync::Arc<CompletionChannel>>,
}

impl CqRing {
    /// A CQ ring of `depth` entries, optionally reporting to `channel`.
    pub fn new(id: CqId, depth: usize, channel: Option<std::sync::Arc<CompletionChannel>>) -> CqRing {
        CqRing { id, ring: CompletionRing::new(depth), armed: AtomicU8::new(ARM_NONE), overflowed: AtomicBool::new(false), channel }
    }

    /// A ring of `depth` entries with this ring's id, channel and arming,
    /// holding (moved, in order) the completions waiting here
    /// (`ibv_resize_cq`). `None` if they do not fit. Call with the datapath
    /// stopped from delivering (the engine lock), so nothing lands in between.
    pub fn resized(&self, depth: usize) -> Option<CqRing> {
        if depth < self.ring.len() || depth == 0 {
            return None;
        }
        let new = CqRing {
            id: self.id,
            ring: CompletionRing::new(depth),
            armed: AtomicU8::new(self.armed.load(Ordering::Acquire)),
            overflowed: AtomicBool::new(self.overflowed()),
            channel: self.channel.clone(),
        };
        self.ring.pop_with(usize::MAX, |_, wc| {
            // Cannot fail: depth >= len was checked and only we push here.
            new.ring.push_slice(std::slice::from_ref(wc));
        });
        Some(new)
    }

    /// Capacity in completions.
    pub fn capacity(&self) -> usize {
        self.ring.capacity()
    }

    /// Completions waiting to be polled.
    pub fn len(&self) -> usize {
        self.ring.len()
    }

    /// Whether no completion is waiting.
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// Whether a completion was lost because the ring was full (a CQ overrun,
    /// reported as an async error as ibverbs does).
    #[inline]
    pub fn overflowed(&self) -> bool {
        self.overflowed.load(Ordering::Acquire)
    }

    /// Datapath side: deliver a completion. Returns false on overrun.
    /// One claim and one fence per call: a batch of completions goes through
    /// [`CqSignals`] instead, which claims once per run of completions to
    /// one CQ and fences once for the batch.
    pub fn push(&self, wc: WorkCompletion, solicited: bool) -> bool {
        let mut batch = CqSignals::new();
        batch.push(self, wc, solicited);
        batch.finish() == 0
    }

    /// Put `wcs` into the ring, in order, without looking at the arming
    /// (the caller's [`Wake`] and [`CqRing::signal_fenced`] do): how many
    /// found the ring full (lost, and the ring marked overflowed).
    fn push_run(&self, wcs: &[WorkCompletion]) -> usize {
        let lost = wcs.len() - self.ring.push_slice(wcs);
        if lost > 0 {
            self.overflowed.store(true, Ordering::Release);
        }
        lost
    }

    /// Signal the channel if the CQ is armed for what `wake` says was
    /// pushed (once per arm). The caller has fenced (SeqCst) since its pushes.
    fn signal_fenced(&self, wake: Wake) {
        let fire = match self.armed.load(Ordering::Acquire) {
            ARM_ANY => wake.any,
            ARM_SOLICITED => wake.solicited,
            _ => false,
        };
        if fire && self.armed.swap(ARM_NONE, Ordering::AcqRel) != ARM_NONE {
            if let Some(ch) = &self.channel {
                ch.notify(self.id);
            }
        }
    }

    /// Application side: take up to `out.len()` completions (`ibv_poll_cq`).
    pub fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        self.poll_with(out.len(), |i, wc| out[i] = *wc)
    }

    /// Application side: hand up to `max` completions, oldest first, to
    /// `f(index, completion)` without an intermediate buffer (the C
    /// `ibv_poll_cq` writes each straight into the caller's `ibv_wc` array).
    /// Returns how many.
    /// One claim of the ring's head for all of them ([`CompletionRing`]).
    pub fn poll_with(&self, max: usize, f: impl FnMut(usize, &WorkCompletion)) -> usize {
        self.ring.pop_with(max, f)
    }

    /// Application side: arm the CQ (`ibv_req_notify_cq`): the next completion
    /// (or the next solicited/error one) signals the channel once.
    pub fn req_notify(&self, solicited_only: bool) {
        self.armed.store(if solicited_only { ARM_SOLICITED } else { ARM_ANY }, Ordering::Release);
        // Pairs with the fence in `push`: a completion pushed before this
        // point is seen by the caller's next poll, or the push sees us armed.
        std::sync::atomic::fence(Ordering::SeqCst);
    }
}

/// What the completions pushed into one CQ ask of its arming.
#[derive(Clone, Copy, Debug, Default)]
struct Wake {
    /// Any completion (wakes `ARM_ANY`).
    any: bool,
    /// A solicited or unsuccessful one (wakes `ARM_SOLICITED` too).
    solicited: bool,
}

/// CQs a [`CqSignals`] batch tracks before it signals them early.
const SIGNAL_SLOTS: usize = 4;

/// Completions to one CQ a [`CqSignals`] batch holds before it pushes them
/// (one claim of the ring for the run).
const RUN: usize = 16;

/// The datapath's delivery of a batch of completions: the completions to
/// one CQ that come one after another (a run, up to `RUN`) go into its
/// ring together, with one claim of the ring ([`CompletionRing`]), when
/// the next completion is for another CQ, the run is full, or the batch
/// ends — the application may poll them as soon as they are pushed, and a
/// batch is one poll iteration's completions, pushed right after the
/// engine made them. The CQs' arming is looked at once for the batch, after
/// one full fence, when the batch ends (dropped, or [`CqSignals::finish`])
/// — instead of one fence per completion. A CQ armed before the batch ends
/// is signalled once if the batch brought it what it was armed for (any
/// completion, or a solicited or unsuccessful one).
///
/// Why one fence is enough (the Dekker-style handshake with
/// [`CqRing::req_notify`], which stores `armed`, fences, then polls): our
/// pushes come before our fence and our loads of `armed` after it, so
/// either the application's poll after arming sees the completions, or we
/// see it armed and signal; without the fence each could miss the other's
/// store (store buffering) and the application would sleep on a CQ that
/// has completions. More than `SIGNAL_SLOTS` CQs in one batch: the
/// tracked ones are signalled (run pushed and fence included) when a new
/// one comes.
pub struct CqSignals<'a> {
    pending: [Option<(&'a CqRing, Wake)>; SIGNAL_SLOTS],
    /// The completions not yet pushed, the first `len` of them (written),
    /// all to `to`. Uninitialised beyond `len`: a batch is made every poll
    /// iteration, and zero-filling the run (about 900 bytes) cost about 74
    /// instructions a batch.
    run: [MaybeUninit<WorkCompletion>; RUN],
    len: usize,
    to: Option<&'a CqRing>,
    /// Completions lost to full rings so far.
    lost: usize,
}

impl Default for CqSignals<'_> {
    fn default() -> Self {
        CqSignals { pending: [None; SIGNAL_SLOTS], run: [const { MaybeUninit::uninit() }; RUN], len: 0, to: None, lost: 0 }
    }
}

impl<'a> CqSignals<'a> {
    /// An empty batch.
    pub fn new() -> CqSignals<'a> {
        CqSignals::default()
    }

    /// Deliver a completion into `ring` (pushed with its run, its arming
    /// looked at when the batch ends). A completion that finds the ring
    /// full is lost, the ring marked overflowed (as [`CqRing::push`]), and
    /// counted in what [`CqSignals::finish`] returns.
    pub fn push(&mut self, ring: &'a CqRing, wc: WorkCompletion, solicited: bool) {
        let slot = match self.pending.iter().position(|p| p.is_none_or(|(r, _)| std::ptr::eq(r, ring))) {
            Some(i) => i,
            None => {
                self.signal_all();
                0
            }
        };
        let wake = &mut self.pending[slot].get_or_insert((ring, Wake::default())).1;
        wake.any = true;
        // IBV_CQ_SOLICITED: a solicited completion, or any unsuccessful one
        // (ibv_req_notify_cq(3): "or an error completion").
        wake.solicited |= solicited || wc.status != WcStatus::Success;
        if self.len == RUN || self.to.is_some_and(|to| !std::ptr::eq(to, ring)) {
            self.push_run();
        }
        // `len < RUN` here: a full run was pushed just above.
        if let Some(w) = self.run.get_mut(self.len) {
            w.write(wc);
            self.len += 1;
            self.to = Some(ring);
        }
    }

    /// The ring whose run is being gathered (the last completion's), if
    /// any: a caller that looks rings up by id can skip the lookup for the
    /// same CQ again.
    #[inline]
    pub fn gathering(&self) -> Option<&'a CqRing> {
        self.to
    }

    /// Push the run held so far into its ring.
    fn push_run(&mut self) {
        if let Some(to) = self.to.take() {
            let len = self.len.min(RUN);
            // SAFETY: `push` wrote the first `len` slots (it raises `len`
            // only after writing its slot, and never past `RUN`), and
            // `MaybeUninit<T>` has `T`'s layout.
            let run = unsafe { std::slice::from_raw_parts(self.run.as_ptr().cast::<WorkCompletion>(), len) };
            self.lost += to.push_run(run);
            self.len = 0;
        }
    }

    /// End the batch: the last run pushed, one fence, then every CQ it
    /// touched is signalled if armed for what it got. (Dropping the batch
    /// does the same.) Returns how many of the batch's completions were
    /// lost to full rings (CQ overruns). By reference: a batch moved in by
    /// value is a copy of its run buffer (about 900 bytes, a `memcpy` of
    /// about 100 instructions per batch); the drop after it has nothing left
    /// to do.
    pub fn finish(&mut self) -> usize {
        self.signal_all();
        std::mem::take(&mut self.lost)
    }

    fn signal_all(&mut self) {
        self.push_run();
        if self.pending[0].is_none() {
            return;
        }
        // Pairs with the fence in `req_notify` (see the type's documentation).
        std::sync::atomic::fence(Ordering::SeqCst);
        for (ring, wake) in self.pending.iter_mut().map_while(Option::take) {
            ring.signal_fenced(wake);
        }
    }
}

impl Drop for CqSignals<'_> {
    fn drop(&mut self) {
        self.signal_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rocev2::transport::wr::WcOpcode;
    use std::sync::Arc;

    fn wc(id: u64, status: WcStatus) -> WorkCompletion {
        WorkCompletion {
            wr_id: id,
            status,
            opcode: WcOpcode::Recv,
            qp_num: 1,
            byte_len: 0,
            imm_data: None,
            invalidated_rkey: None,
            src_qp: 0,
            grh: false,
        }
    }

    #[test]
    fn arm_fires_once() {
        let ch = Arc::new(CompletionChannel::new(4).unwrap());
        let cq = CqRing::new(CqId(7), 2, Some(ch.clone()));
        cq.push(wc(1, WcStatus::Success), false);
        assert!(ch.try_get_event().is_none(), "not armed");
        cq.req_notify(false);
        cq.push(wc(2, WcStatus::Success), false);
        cq.push(wc(3, WcStatus::Success), false);
        assert_eq!(ch.get_event().unwrap(), CqId(7));
        assert!(ch.try_get_event().is_none(), "one event per arm");
        assert!(cq.overflowed(), "third completion overran a 2-entry CQ");
        let mut out = [wc(0, WcStatus::Success); 4];
        assert_eq!(cq.poll(&mut out), 2);
        assert_eq!((out[0].wr_id, out[1].wr_id), (1, 2));
    }

    #[test]
    fn solicited_arm_ignores_plain_success() {
        let ch = Arc::new(CompletionChannel::new(4).unwrap());
        let cq = CqRing::new(CqId(1), 8, Some(ch.clone()));
        cq.req_notify(true);
        cq.push(wc(1, WcStatus::Success), false);
        assert!(ch.try_get_event().is_none());
        cq.push(wc(2, WcStatus::WrFlushErr), false);
        assert_eq!(ch.try_get_event(), Some(CqId(1)));
        cq.req_notify(true);
        cq.push(wc(3, WcStatus::Success), true);
        assert_eq!(ch.try_get_event(), Some(CqId(1)));
    }

    #[test]
    fn eventfd_wakes_a_blocked_thread() {
        let ch = Arc::new(CompletionChannel::new(4).unwrap());
        let cq = Arc::new(CqRing::new(CqId(2), 8, Some(ch.clone())));
        cq.req_notify(false);
        let t = {
            let ch = ch.clone();
            std::thread::spawn(move || ch.get_event().unwrap())
        };
        cq.push(wc(1, WcStatus::Success), false);
        assert_eq!(t.join().unwrap(), CqId(2));
    }

    /// A channel and a CQ of `depth` reporting to it, armed (for solicited
    /// or unsuccessful completions only if `solicited_only`).
    fn armed_cq(id: u32, depth: usize, solicited_only: bool) -> (Arc<CompletionChannel>, CqRing) {
        let ch = Arc::new(CompletionChannel::new(4).unwrap());
        let cq = CqRing::new(CqId(id), depth, Some(ch.clone()));
        cq.req_notify(solicited_only);
        (ch, cq)
    }

    /// A batch, not yet ended, of plain successful completions `ids` into `cq`.
    fn successes(cq: &CqRing, ids: std::ops::Range<u64>) -> CqSignals<'_> {
        let mut batch = CqSignals::new();
        for id in ids {
            batch.push(cq, wc(id, WcStatus::Success), false);
        }
        batch
    }

    /// A batch's completions are in the ring at once; the armed CQ is
    /// signalled once, when the batch ends (dropped or finished), not before.
    #[test]
    fn a_batch_signals_once_at_its_end() {
        let (ch, cq) = armed_cq(3, 8, false);
        let other = CqRing::new(CqId(4), 8, None);
        let mut batch = successes(&cq, 0..3);
        assert_eq!(cq.len(), 0, "a run is held until it ends");
        batch.push(&other, wc(100, WcStatus::Success), false);
        assert_eq!(cq.len(), 3, "pushed when a completion for another CQ comes");
        assert!(ch.try_get_event().is_none(), "signalled at the batch's end");
        assert_eq!(batch.finish(), 0);
        assert_eq!(other.len(), 1, "the last run pushed at the batch's end");
        assert_eq!(ch.try_get_event(), Some(CqId(3)));
        assert!(ch.try_get_event().is_none(), "one event per arm");
        // Dropped without `finish`: signalled all the same.
        cq.req_notify(false);
        {
            let mut batch = CqSignals::new();
            batch.push(&cq, wc(4, WcStatus::Success), false);
        }
        assert_eq!(ch.try_get_event(), Some(CqId(3)));
        // Not armed: nothing, and the next arm is not fired by the old batch.
        let mut batch = CqSignals::new();
        batch.push(&cq, wc(5, WcStatus::Success), false);
        batch.finish();
        assert!(ch.try_get_event().is_none());
        // A finished batch (ended by reference) has nothing left: neither a
        // second end nor its drop signals an arm made after it.
        cq.req_notify(false);
        assert_eq!(batch.finish(), 0);
        drop(batch);
        assert!(ch.try_get_event().is_none(), "a finished batch signals nothing more");
        let mut out = [wc(0, WcStatus::Success); 8];
        assert_eq!(cq.poll(&mut out), 5);
        assert_eq!(out[..5].iter().map(|w| w.wr_id).collect::<Vec<_>>(), [0, 1, 2, 4, 5]);
    }

    /// A run longer than `RUN` is pushed `RUN` at a time, in order; what
    /// does not fit is lost, counted and marked, as `CqRing::push` does.
    #[test]
    fn long_runs_are_pushed_in_order_and_overruns_counted() {
        let cq = CqRing::new(CqId(1), 3 * RUN, None);
        let mut batch = successes(&cq, 0..RUN as u64 + 1);
        assert_eq!(cq.len(), RUN, "a full run is pushed when the next completion comes");
        for id in RUN as u64 + 1..4 * RUN as u64 {
            batch.push(&cq, wc(id, WcStatus::Success), false);
        }
        assert_eq!(batch.finish(), RUN, "a fourth run does not fit a ring of three");
        assert!(cq.overflowed());
        let mut out = [wc(0, WcStatus::Success); 4 * RUN];
        assert_eq!(cq.poll(&mut out), 3 * RUN);
        assert!(out[..3 * RUN].iter().map(|w| w.wr_id).eq(0..3 * RUN as u64), "in order, the first ones kept");
    }

    /// The run buffer is not initialised beyond what was pushed: runs of
    /// every length, alternating between two CQs (each switch pushes the
    /// run gathered so far), reach their rings whole and in order.
    #[test]
    fn alternating_runs_reach_each_ring_whole() {
        let (a, b) = (CqRing::new(CqId(1), 4 * RUN, None), CqRing::new(CqId(2), 4 * RUN, None));
        let mut batch = CqSignals::new();
        let (mut next, mut want_a, mut want_b) = (0u64, Vec::new(), Vec::new());
        for (i, n) in [1, RUN, 2, RUN + 3, 1, 5].into_iter().enumerate() {
            let (ring, want) = if i % 2 == 0 { (&a, &mut want_a) } else { (&b, &mut want_b) };
            for _ in 0..n {
                let status = if next % 3 == 0 { WcStatus::WrFlushErr } else { WcStatus::Success };
                batch.push(ring, WorkCompletion { byte_len: next as u32 * 7, ..wc(next, status) }, false);
                want.push((next, status));
                next += 1;
            }
        }
        assert_eq!(batch.finish(), 0);
        for (ring, want) in [(&a, want_a), (&b, want_b)] {
            let mut out = [wc(u64::MAX, WcStatus::Success); 4 * RUN];
            let n = ring.poll(&mut out);
            let got: Vec<(u64, WcStatus)> = out[..n].iter().map(|w| (w.wr_id, w.status)).collect();
            assert_eq!(got, want, "CQ {:?}", ring.id);
            assert!(out[..n].iter().all(|w| w.byte_len == w.wr_id as u32 * 7 && w.qp_num == 1));
        }
    }

    /// Armed for solicited completions: a batch fires it when any of its
    /// completions is solicited or unsuccessful, wherever it lies in the
    /// batch; a batch of plain successes does not.
    #[test]
    fn a_solicited_arm_looks_at_every_completion_of_the_batch() {
        let (ch, cq) = armed_cq(9, 16, true);
        successes(&cq, 0..3).finish();
        assert!(ch.try_get_event().is_none(), "plain successes only");
        for (status, solicited) in [(WcStatus::WrFlushErr, false), (WcStatus::Success, true)] {
            let mut batch = CqSignals::new();
            batch.push(&cq, wc(10, WcStatus::Success), false);
            batch.push(&cq, wc(11, status), solicited);
            batch.push(&cq, wc(12, WcStatus::Success), false);
            batch.finish();
            assert_eq!(ch.try_get_event(), Some(CqId(9)), "{status:?}, solicited {solicited}");
            cq.req_notify(true);
        }
    }

    /// A batch over more CQs than it tracks signals every armed one once,
    /// and an overrun is reported and marked as by `CqRing::push`.
    #[test]
    fn a_batch_over_many_cqs_signals_each_armed_one() {
        let ch = Arc::new(CompletionChannel::new(16).unwrap());
        let cqs: Vec<CqRing> = (0..SIGNAL_SLOTS as u32 + 3).map(|i| CqRing::new(CqId(i), 2, Some(ch.clone()))).collect();
        for cq in cqs.iter().filter(|c| c.id.0 != 1) {
            cq.req_notify(false);
        }
        let mut batch = CqSignals::new();
        for round in 0..3 {
            for cq in cqs.iter().chain(cqs.iter().rev()) {
                batch.push(cq, wc(round, WcStatus::Success), false);
            }
        }
        assert_eq!(batch.finish(), cqs.len() * 4, "2 of 6 fit each 2-entry ring");
        assert!(cqs.iter().all(CqRing::overflowed));
        let mut events: Vec<u32> = std::iter::from_fn(|| ch.try_get_event()).map(|c| c.0).collect();
        events.sort_unstable();
        let expected: Vec<u32> = (0..cqs.len() as u32).filter(|&i| i != 1).collect();
        assert_eq!(events, expected, "each armed CQ once, the unarmed one not");
    }
}
