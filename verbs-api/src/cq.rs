//! Completion queues and completion channels: `ibv_create_cq`, `ibv_poll_cq`,
//! `ibv_req_notify_cq`, `ibv_create_comp_channel`, `ibv_get_cq_event`.

use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock, RwLockReadGuard};

use rocev2::transport::wr::{CqId, WorkCompletion};
use urnic_datapath::queues::{CompletionChannel, CqRing};

use crate::device::Context;
use crate::error::{Error, ErrorKind, Result};

/// A completion channel (`struct ibv_comp_channel`), backed by an eventfd.
#[derive(Clone)]
pub struct CompChannel {
    pub(crate) inner: Arc<CompletionChannel>,
}

impl CompChannel {
    /// Block until a CQ armed with [`Cq::req_notify`] has a completion
    /// (`ibv_get_cq_event`); returns that CQ's number. Like `read(2)` and
    /// libibverbs, a signal whose handler was installed without
    /// `SA_RESTART` ends the wait with an error of kind
    /// [`ErrorKind::Io`] whose errno is EINTR (see [`Error::errno`]).
    pub fn get_cq_event(&self) -> Result<u32> {
        Ok(self.inner.get_event()?.0)
    }

    /// A pending CQ event, without blocking.
    pub fn try_get_cq_event(&self) -> Option<u32> {
        self.inner.try_get_event().map(|c| c.0)
    }

    /// The eventfd to wait on with poll/epoll.
    pub fn fd(&self) -> std::os::fd::RawFd {
        self.inner.raw_fd()
    }
}

/// A completion queue (`struct ibv_cq`). Destroyed on drop.
pub struct Cq {
    pub(crate) ctx: Context,
    /// The CQ's number (its ring's id, the same across resizes).
    id: CqId,
    /// The ring, replaced only by [`Cq::resize`]: read-locked by each poll
    /// (one compare-and-swap and one add, about 15 instructions; the
    /// `arc_swap::ArcSwap` this was cost a poll about 100, most of an empty
    /// poll's work), write-locked only while a resize swaps it.
    ring: RwLock<Arc<CqRing>>,
}

impl Context {
    /// `ibv_create_comp_channel`.
    pub fn create_comp_channel(&self) -> Result<CompChannel> {
        Ok(CompChannel { inner: Arc::new(CompletionChannel::new(self.inner.limits.max_cq as usize)?) })
    }

    /// `ibv_create_cq` with room for `cqe` completions.
    pub fn create_cq(&self, cqe: u32, channel: Option<&CompChannel>) -> Result<Cq> {
        let lim = self.inner.limits;
        if cqe == 0 || cqe > lim.max_cqe {
            return Err(Error::invalid(format!("cqe {cqe} outside 1..={}", lim.max_cqe)));
        }
        if self.inner.cq_count.fetch_add(1, Ordering::AcqRel) >= lim.max_cq {
            self.inner.cq_count.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::new(ErrorKind::NoResources, format!("device has its maximum of {} CQs", lim.max_cq)));
        }
        let id = CqId(self.inner.alloc_id());
        let ring = Arc::new(CqRing::new(id, cqe as usize, channel.map(|c| c.inner.clone())));
        self.inner.nic.attach_cq(ring.clone());
        Ok(Cq { ctx: self.clone(), id, ring: RwLock::new(ring) })
    }
}

impl Cq {
    /// The current ring. A read guard does not poison: a poll's closure that
    /// unwinds leaves the lock usable.
    fn ring(&self) -> RwLockReadGuard<'_, Arc<CqRing>> {
        self.ring.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The CQ's number (what [`CompChannel::get_cq_event`] returns).
    pub fn id(&self) -> u32 {
        self.id.0
    }

    pub(crate) fn cq_id(&self) -> CqId {
        self.id
    }

    /// Capacity.
    pub fn capacity(&self) -> usize {
        self.ring().capacity()
    }

    /// Take up to `wc.len()` completions (`ibv_poll_cq`). Returns how many.
    /// An overrun CQ (more completions than capacity) reports an error, as a
    /// hardware CQ in error state would.
    pub fn poll(&self, wc: &mut [WorkCompletion]) -> Result<usize> {
        self.poll_with(wc.len(), |i, w| wc[i] = *w)
    }

    /// [`Cq::poll`] handing each completion, oldest first, to `f(index,
    /// completion)` instead of filling a slice: no buffer to initialise
    /// (the C `ibv_poll_cq` converts each straight into the caller's array).
    pub fn poll_with(&self, max: usize, f: impl FnMut(usize, &WorkCompletion)) -> Result<usize> {
        let n = {
            let ring = self.ring();
            let n = ring.poll_with(max, f);
            if n == 0 && ring.overflowed() {
                return Err(Error::new(ErrorKind::NoResources, format!("CQ {} overran: completions were lost", self.id())));
            }
            n
        };
        if n > 0 {
            // A completion may report a window's invalidation (LOCAL_INV,
            // SEND with invalidate) that lets a dropped region go.
            self.ctx.inner.reclaim_deferred();
        }
        Ok(n)
    }

    /// Arm the CQ (`ibv_req_notify_cq`): the next completion (or next solicited
    /// or error completion if `solicited_only`) signals the channel once.
    pub fn req_notify(&self, solicited_only: bool) {
        // The application is about to sleep on the channel: if it was
        // driving the datapath (`Context::drive`), the datapath threads
        // take over now.
        self.ctx.inner.nic.stop_driving();
        self.ring().req_notify(solicited_only);
    }

    /// Change the capacity (`ibv_resize_cq`). Completions waiting in the CQ
    /// stay, in order; fails if `cqe` cannot hold them or exceeds the limit.
    pub fn resize(&self, cqe: u32) -> Result<()> {
        let lim = self.ctx.inner.limits;
        if cqe == 0 || cqe > lim.max_cqe {
            return Err(Error::invalid(format!("cqe {cqe} outside 1..={}", lim.max_cqe)));
        }
        let nic = &self.ctx.inner.nic;
        // The engine lock keeps the datapath from delivering while entries move.
        nic.with_all_engines_locked(|| {
            // Write-locked: no poll takes from the old ring while its
            // completions move, nor from the new one before it is ours.
            let mut ring = self.ring.write().unwrap_or_else(|e| e.into_inner());
            let new = Arc::new(
                ring.resized(cqe as usize).ok_or_else(|| Error::invalid(format!("{} completions are waiting: more than {cqe}", ring.len())))?,
            );
            nic.attach_cq(new.clone());
            *ring = new;
            Ok(())
        })
    }

    /// The context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        self.ctx.inner.nic.detach_cq(self.id);
        self.ctx.inner.cq_count.fetch_sub(1, Ordering::AcqRel);
    }
}
