//! How many WQEs a work queue has retired, shared with the post path.
//!
//! A hardware send or receive queue has `max_wr` slots, and `ibv_post_send` /
//! `ibv_post_recv` / `ibv_post_srq_recv` return `ENOMEM` at once, queueing
//! nothing, when every slot holds a WQE not yet retired (ibv_post_send(3);
//! rxe `post_one_send` and `post_one_recv`: `queue_full` is `-ENOMEM`). A WQE
//! frees its slot when the transport is done with it: a send WQE when it is
//! reaped (completed, with a completion or, unsignaled, without), a receive
//! WQE when a message takes it, either kind when it is flushed, refused after
//! it was posted, or dropped by a reset.
//!
//! The engine owns the queues, but the post path runs on the application's
//! threads and must not wait for the engine. So each queue has a
//! [`RetiredCount`]: the engine adds the WQEs it retires, *before* it emits
//! their completions, and a post compares the WRs it has accepted with it.
//! An application that polls a completion and posts again therefore always
//! finds the slot that completion freed (the completion's release by the CQ
//! ring and the count's release store both precede it).

use std::sync::atomic::{AtomicUsize, Ordering};

/// WQEs retired by a work queue since it was created (wrapping; see the
/// module docs). Written by the engine, read by the post path.
#[derive(Debug, Default)]
pub struct RetiredCount(AtomicUsize);

impl RetiredCount {
    /// WQEs retired so far. Acquire: pairs with [`RetiredCount::add`], so a
    /// post that sees a slot freed also sees everything the engine did
    /// before freeing it.
    #[inline]
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }

    /// `n` more WQEs retired. The engine calls this before it emits their
    /// completions (a test standing in for the engine may call it too).
    #[inline]
    pub fn add(&self, n: usize) {
        if n != 0 {
            self.0.fetch_add(n, Ordering::Release);
        }
    }
}

/// Two counts are equal when they have counted the same (a queue's derived
/// equality compares its state, not where its count lives).
impl PartialEq for RetiredCount {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Eq for RetiredCount {}
