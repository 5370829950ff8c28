//! Receive queues: a QP's own receive queue, or a shared receive queue (SRQ).
//!
//! A FIFO of posted receive WQEs ([`RecvWqe`]) with a depth and an SGE limit. The responder
//! takes the head WQE when a SEND (or RDMA WRITE with immediate) starts.
//!
//! SRQs also have a limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): once armed
//! with a nonzero limit, the first time the number of posted WQEs drops below
//! it (when the responder consumes one) an `IBV_EVENT_SRQ_LIMIT_REACHED` is
//! due and the SRQ disarms itself (limit back to 0), exactly once per arming
//! (rxe_resp.c `get_srq_wqe`: `if (srq->limit && count < srq->limit) { srq->limit = 0; event }`).
//! The queue records the event; whoever consumed the WQE collects it with
//! [`RecvQueue::take_limit_event`] and raises the async event.
//!
//! Depth is fixed at creation (storage is allocated once: posting never allocates;
//! a WQE holds its SGEs in place up to [`RECV_WQE_SGES`](crate::transport::wqe::RECV_WQE_SGES)).
//!
//! The queue counts the WQEs it retires ([`RetiredCount`]) for the post path,
//! which refuses a post into a full queue itself: a WQE is retired when a
//! message takes it, when it is flushed or dropped by a reset.

use std::borrow::Borrow;
use std::collections::VecDeque;
use std::sync::Arc;

use crate::transport::ids::{PdId, SrqId};
use crate::transport::retired::RetiredCount;
use crate::transport::wqe::RecvWqe;

/// Why a receive-queue operation was refused (nothing was changed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum RecvQueueError {
    /// The queue holds `max_wr` WRs already (`ibv_post_recv`: ENOMEM).
    #[error("receive queue full")]
    Full,
    /// The WR has more SGEs than the queue's `max_sge` (EINVAL).
    #[error("too many scatter/gather elements")]
    TooManySge,
    /// An SRQ limit above the SRQ's depth (`ibv_modify_srq`: EINVAL).
    #[error("SRQ limit exceeds the SRQ depth")]
    InvalidLimit,
    /// A limit on a queue that is not an SRQ.
    #[error("not a shared receive queue")]
    NotSrq,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SrqLimit {
    id: SrqId,
    /// 0 = disarmed.
    limit: u32,
    /// A limit event fired and was not taken yet.
    event: bool,
}

/// A receive queue or a shared receive queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecvQueue {
    pd: PdId,
    max_wr: u32,
    max_sge: u32,
    wrs: VecDeque<RecvWqe>,
    srq: Option<SrqLimit>,
    /// WQEs retired (taken by a message, flushed); see [`RecvQueue::retired`].
    retired: Arc<RetiredCount>,
    /// WQEs put back by [`RecvQueue::requeue_front`]: counted as retired when
    /// first taken, so not counted again when taken again, and allowed in the
    /// queue beyond `max_wr` (their slots may have been posted into since).
    requeued: usize,
}

impl RecvQueue {
    /// A QP's own receive queue (`ibv_qp_cap.max_recv_wr` / `max_recv_sge`).
    pub fn new(pd: PdId, max_wr: u32, max_sge: u32) -> RecvQueue {
        RecvQueue { pd, max_wr, max_sge, wrs: VecDeque::with_capacity(max_wr as usize), srq: None, retired: Arc::default(), requeued: 0 }
    }

    /// A shared receive queue (`ibv_create_srq`), initially disarmed.
    pub fn new_srq(id: SrqId, pd: PdId, max_wr: u32, max_sge: u32) -> RecvQueue {
        RecvQueue { srq: Some(SrqLimit { id, limit: 0, event: false }), ..RecvQueue::new(pd, max_wr, max_sge) }
    }

    /// The protection domain receive SGEs are checked against.
    pub fn pd(&self) -> PdId {
        self.pd
    }

    /// The SRQ's id, `None` for a QP's own queue.
    pub fn srq_id(&self) -> Option<SrqId> {
        self.srq.map(|s| s.id)
    }

    /// Whether this is a shared receive queue.
    pub fn is_srq(&self) -> bool {
        self.srq.is_some()
    }

    /// The count of WQEs this queue has retired, shared with the post path
    /// (see [`RetiredCount`]). Whoever refuses a WR after it was posted
    /// adds it too.
    pub fn retired(&self) -> &Arc<RetiredCount> {
        &self.retired
    }

    /// Depth.
    pub fn max_wr(&self) -> u32 {
        self.max_wr
    }

    /// SGEs per WR.
    pub fn max_sge(&self) -> u32 {
        self.max_sge
    }

    /// Posted WRs.
    pub fn len(&self) -> usize {
        self.wrs.len()
    }

    /// No WR posted.
    pub fn is_empty(&self) -> bool {
        self.wrs.is_empty()
    }

    /// Post a WR at the tail. On error nothing is queued.
    /// Takes a [`RecvWr`](crate::transport::wr::RecvWr) or a ready [`RecvWqe`].
    pub fn post(&mut self, wr: impl Into<RecvWqe>) -> Result<(), RecvQueueError> {
        self.post_wqe(wr.into())
    }

    /// [`RecvQueue::post`] of a WQE lent (`&RecvWqe`: copied in once, a
    /// doorbell's drain from the post ring) or owned (moved in).
    pub fn post_wqe<W: Borrow<RecvWqe> + Into<RecvWqe>>(&mut self, wr: W) -> Result<(), RecvQueueError> {
        if wr.borrow().sgl.len() > self.max_sge as usize {
            return Err(RecvQueueError::TooManySge);
        }
        if self.wrs.len() >= self.max_wr as usize + self.requeued {
            return Err(RecvQueueError::Full);
        }
        self.wrs.push_back(wr.into());
        Ok(())
    }

    /// The WR the next message will consume.
    pub fn front(&self) -> Option<&RecvWqe> {
        self.wrs.front()
    }

    /// Consume the head WR. For an armed SRQ whose count drops below the
    /// limit, records a limit event and disarms.
    pub fn pop(&mut self) -> Option<RecvWqe> {
        let wr = self.wrs.pop_front()?;
        if self.requeued > 0 {
            self.requeued -= 1;
        } else {
            self.retired.add(1);
        }
        let count = self.wrs.len();
        if let Some(s) = self.srq.as_mut() {
            if s.limit != 0 && count < s.limit as usize {
                s.limit = 0;
                s.event = true;
            }
        }
        Some(wr)
    }

    /// Put back a WR taken by [`RecvQueue::pop`] whose message was abandoned
    /// (UC: a PSN gap dropped the rest of the message; the WQE is reused for
    /// the next one, as rxe's class D1 handling resets it). It goes back to the
    /// head, so completion order is unchanged.
    #[allow(dead_code)] // used by the responder, which the engine drives
    pub(crate) fn requeue_front(&mut self, wr: RecvWqe) {
        self.requeued += 1;
        self.wrs.push_front(wr);
    }

    /// Arm (nonzero) or disarm (0) the SRQ limit (`ibv_modify_srq` with
    /// `IBV_SRQ_LIMIT`). rxe `rxe_srq_chk_attr`: a limit above the depth is EINVAL.
    pub fn set_limit(&mut self, limit: u32) -> Result<(), RecvQueueError> {
        let max_wr = self.max_wr;
        let s = self.srq.as_mut().ok_or(RecvQueueError::NotSrq)?;
        if limit > max_wr {
            return Err(RecvQueueError::InvalidLimit);
        }
        s.limit = limit;
        Ok(())
    }

    /// The armed limit (0 = disarmed, and always 0 for a QP's own queue).
    pub fn limit(&self) -> u32 {
        self.srq.map_or(0, |s| s.limit)
    }

    /// Collect a pending limit event (returns `true` once per event).
    pub fn take_limit_event(&mut self) -> bool {
        match self.srq.as_mut() {
            Some(s) if s.event => {
                s.event = false;
                true
            }
            _ => false,
        }
    }

    /// Change the depth (`ibv_modify_srq` with `IBV_SRQ_MAX_WR`); it cannot
    /// drop below the number of posted WRs or the armed limit.
    pub fn resize(&mut self, max_wr: u32) -> Result<(), RecvQueueError> {
        if (max_wr as usize) < self.wrs.len() || max_wr < self.limit() {
            return Err(RecvQueueError::InvalidLimit);
        }
        self.max_wr = max_wr;
        self.wrs.reserve((max_wr as usize).saturating_sub(self.wrs.len()));
        Ok(())
    }

    /// Remove every posted WR, oldest first (the QP entered ERR: each becomes
    /// a `WR_FLUSH_ERR` completion; or RESET: they are dropped). They count
    /// as retired at once, before their completions exist.
    pub fn flush(&mut self) -> std::collections::vec_deque::Drain<'_, RecvWqe> {
        self.retired.add(self.wrs.len().saturating_sub(self.requeued));
        self.requeued = 0;
        self.wrs.drain(..)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::wr::{RecvWr, Sge};

    fn wr(id: u64, sges: usize) -> RecvWr {
        RecvWr { wr_id: id, sgl: vec![Sge { addr: 0, length: 8, lkey: 0x100 }; sges] }
    }

    #[test]
    fn fifo_depth_and_sge_limit() {
        let mut q = RecvQueue::new(PdId(1), 2, 2);
        assert_eq!(q.post(wr(1, 3)), Err(RecvQueueError::TooManySge));
        q.post(wr(1, 2)).unwrap();
        q.post(wr(2, 0)).unwrap();
        assert_eq!(q.post(wr(3, 1)), Err(RecvQueueError::Full));
        assert_eq!(q.len(), 2);
        assert_eq!(q.front().map(|w| w.wr_id), Some(1));
        assert_eq!(q.pop().map(|w| w.wr_id), Some(1));
        assert_eq!(q.pop().map(|w| w.wr_id), Some(2));
        assert_eq!(q.pop(), None);
        assert!(q.is_empty());
        assert_eq!(q.set_limit(1), Err(RecvQueueError::NotSrq));
        assert!(!q.take_limit_event());
    }

    #[test]
    fn srq_limit_fires_once_per_arming() {
        let mut q = RecvQueue::new_srq(SrqId(7), PdId(1), 8, 1);
        assert_eq!(q.srq_id(), Some(SrqId(7)));
        assert_eq!(q.set_limit(9), Err(RecvQueueError::InvalidLimit));
        for i in 0..5 {
            q.post(wr(i, 1)).unwrap();
        }
        q.set_limit(3).unwrap();
        q.pop(); // 4 left
        assert!(!q.take_limit_event());
        q.pop(); // 3 left: not below 3
        assert!(!q.take_limit_event());
        q.pop(); // 2 left: below 3 -> event, disarmed
        assert_eq!(q.limit(), 0);
        assert!(q.take_limit_event());
        assert!(!q.take_limit_event());
        q.pop(); // 1 left: disarmed, no event
        assert!(!q.take_limit_event());
        // Re-arm: fires on the next consumption below the limit.
        q.post(wr(10, 1)).unwrap();
        q.set_limit(2).unwrap();
        q.pop();
        assert!(q.take_limit_event());
    }

    /// The count the post path bounds the queue with: one per WQE a message
    /// takes, one per WQE flushed, none again for a WQE put back and taken
    /// again (which may sit beyond the depth meanwhile: its slot was free).
    #[test]
    fn retired_counts_each_wqe_once() {
        let mut q = RecvQueue::new(PdId(1), 2, 1);
        let retired = q.retired().clone();
        q.post(wr(1, 1)).unwrap();
        q.post(wr(2, 1)).unwrap();
        assert_eq!(q.post(wr(3, 1)), Err(RecvQueueError::Full));
        let w = q.pop().unwrap();
        assert_eq!(retired.get(), 1, "a message took one");
        // UC: the message was abandoned, its WQE goes back to the head; the
        // post path already reused its slot.
        q.post(wr(3, 1)).unwrap();
        q.requeue_front(w);
        assert_eq!(q.len(), 3);
        assert_eq!(q.pop().map(|w| w.wr_id), Some(1));
        assert_eq!(retired.get(), 1, "taken again, not counted again");
        assert_eq!(q.post(wr(4, 1)), Err(RecvQueueError::Full), "back to the depth");
        let w = q.pop().unwrap();
        q.requeue_front(w);
        assert_eq!(q.flush().map(|w| w.wr_id).collect::<Vec<_>>(), [2, 3]);
        assert_eq!(retired.get(), 3, "a flush counts what it removes, the requeued one once");
    }

    #[test]
    fn flush_drains_in_order_and_resize_rules() {
        let mut q = RecvQueue::new_srq(SrqId(1), PdId(1), 4, 1);
        for i in 0..3 {
            q.post(wr(i, 1)).unwrap();
        }
        assert_eq!(q.resize(2), Err(RecvQueueError::InvalidLimit));
        q.resize(5).unwrap();
        assert_eq!(q.max_wr(), 5);
        let ids: Vec<u64> = q.flush().map(|w| w.wr_id).collect();
        assert_eq!(ids, vec![0, 1, 2]);
        assert!(q.is_empty());
    }
}
