//! A QP's send ring: application threads post send WRs into it, the datapath
//! takes them out, in order.
//!
//! Each slot holds a boxed [`SendWqe`] at all times. A post claims the slot at
//! the ring's tail (one compare-and-swap, the only read-modify-write of a
//! post), writes the WR into that slot's box in place and publishes the slot
//! with a plain store of its stamp. The datapath, the one consumer, takes the
//! published box out and leaves a spare one in its place (a box the engine
//! handed back once its WQE was reaped), then frees the slot with a plain
//! store: so a WR costs one atomic read-modify-write, where a pair of
//! lock-free queues (a free list of boxes and the ring itself) took four.
//! Only pointers travel between the threads (a WQE is several hundred bytes:
//! SGEs and inline data live in it), and the WQE is written once.
//!
//! The slots, their stamps and the send queue's bound (a post is refused
//! while `depth` WRs accepted are not retired by the engine, those taken out
//! and still in flight included) are the work-queue ring's
//! (`crate::wq_ring`), shared with the receive ring.

use std::sync::Arc;

use rocev2::transport::retired::RetiredCount;
use rocev2::transport::wqe::{SendSource, SendWqe, SendWrRef};

use crate::wq_ring::{WqConsumer, WqRing};

/// Boxes waiting to replace the ones taken out (the consumer's only).
#[allow(clippy::vec_box)] // the boxes, not the WQEs, are what moves
type Spares = Vec<Box<SendWqe>>;

/// A bounded multi-producer, single-consumer ring of send WQEs, the boxes kept
/// in its slots (see the module docs).
pub struct SendRing {
    ring: WqRing<Box<SendWqe>, Spares>,
}

impl SendRing {
    /// A ring of `depth` WQEs (at least 1), with as many spare boxes: posting
    /// and a consumer that hands reaped boxes back allocate nothing. A post
    /// is refused while `depth` WRs accepted are not yet counted in
    /// `retired` (the engine's count for this send queue).
    pub fn new(depth: usize, retired: Arc<RetiredCount>) -> SendRing {
        let depth = depth.max(1);
        // The engine holds at most `depth` WQEs taken from here (its send
        // queue's depth); each one took a spare. Room for twice as many, so
        // boxes handed back late never make the vector grow.
        let mut spares = Vec::with_capacity(2 * depth);
        spares.extend((0..depth).map(|_| Box::new(SendWqe::empty())));
        SendRing { ring: WqRing::new(depth, retired, || Box::new(SendWqe::empty()), spares) }
    }

    /// How many WRs the ring holds.
    pub fn capacity(&self) -> usize {
        self.ring.capacity()
    }

    /// Post `wr`: written in place into the box of the slot at the tail (only
    /// the fields, SGEs and inline bytes it has). `false`, and nothing
    /// written, if the send queue is full: `depth` WRs posted and not yet
    /// retired. Any number of threads may post at once.
    #[inline]
    pub fn push(&self, wr: &SendWrRef<'_>) -> bool {
        self.ring.push(|wqe| wqe.fill_from(wr))
    }

    /// Claim the slot at the tail for one post: its position, or `None` if
    /// the send queue is full. [`SendRing::publish`] must follow.
    /// (Tests: a post held up between its claim and its publishing.)
    #[cfg(test)]
    pub(crate) fn claim(&self) -> Option<usize> {
        self.ring.claim()
    }

    /// Write `wr` into the box of the slot claimed at `pos` and publish it.
    ///
    /// # Safety
    /// `pos` came from [`SendRing::claim`] on this ring and was not
    /// published yet.
    #[cfg(test)]
    pub(crate) unsafe fn publish(&self, pos: usize, wr: &SendWrRef<'_>) {
        // SAFETY: the caller's contract is the ring's.
        unsafe { self.ring.publish(pos, |wqe| wqe.fill_from(wr)) };
    }

    /// WRs posted (or being posted) and not yet taken by a finished drain.
    pub fn len(&self) -> usize {
        self.ring.len()
    }

    /// Whether no WR waits (see [`len`](Self::len)): a WR claimed and not
    /// yet published counts as waiting.
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// The ring's consumer, or `None` while another one exists (the
    /// datapath drains a QP's ring under its shard's engine lock, so this
    /// does not happen; the check keeps the ring sound regardless).
    pub fn consumer(&self) -> Option<SendConsumer<'_>> {
        self.ring.consumer().map(|c| SendConsumer { c })
    }
}

/// The one consumer of a [`SendRing`] at a time: takes posted WQEs in order
/// and takes back reaped boxes as spares. Frees its claim when dropped.
pub struct SendConsumer<'a> {
    c: WqConsumer<'a, Box<SendWqe>, Spares>,
}

impl SendConsumer<'_> {
    /// Keep the box of a reaped WQE for the next slot taken out (dropped if
    /// the ring holds enough already).
    #[inline]
    pub fn recycle(&mut self, wqe: Box<SendWqe>) {
        let spares = self.c.own();
        if spares.len() < spares.capacity() {
            spares.push(wqe);
        }
    }

    /// The oldest posted WQE, if its post is complete; a spare box takes its
    /// place in the ring (a new one only if none is left: the engine kept or
    /// dropped more boxes than it was given, as when it refuses a WR).
    #[inline]
    pub fn pop(&mut self) -> Option<Box<SendWqe>> {
        self.c.take(|slot, spares| {
            let spare = spares.pop().unwrap_or_else(|| Box::new(SendWqe::empty()));
            std::mem::replace(slot, spare)
        })
    }
}

impl SendSource for SendConsumer<'_> {
    #[inline]
    fn recycle(&mut self, wqe: Box<SendWqe>) {
        SendConsumer::recycle(self, wqe);
    }

    #[inline]
    fn next_wqe(&mut self) -> Option<Box<SendWqe>> {
        self.pop()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rocev2::transport::wqe::{PayloadRef, WqePayload};
    use rocev2::transport::wr::{SendFlags, SendOp, Sge};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    fn wr(id: u64, sge: &[Sge]) -> SendWrRef<'_> {
        SendWrRef { wr_id: id, op: SendOp::Send, payload: PayloadRef::Sgl(sge), flags: SendFlags::SIGNALED, ud: None }
    }

    fn ring(depth: usize) -> (SendRing, Arc<RetiredCount>) {
        let retired = Arc::new(RetiredCount::default());
        (SendRing::new(depth, retired.clone()), retired)
    }

    #[test]
    fn fifo_full_and_wrap() {
        let (ring, retired) = ring(3);
        let sge = [Sge { addr: 1, length: 2, lkey: 3 }];
        for lap in 0..5u64 {
            for i in 0..3 {
                assert!(ring.push(&wr(lap * 10 + i, &sge)));
            }
            assert!(!ring.push(&wr(99, &sge)), "a full ring refuses");
            assert_eq!(ring.len(), 3);
            let mut c = ring.consumer().unwrap();
            assert!(ring.consumer().is_none(), "one consumer at a time");
            for i in 0..3 {
                let w = c.pop().unwrap();
                assert_eq!(w.wr_id, lap * 10 + i);
                assert!(matches!(&w.payload, WqePayload::Sgl(s) if s[..] == sge[..]));
                c.recycle(w);
                retired.add(1);
            }
            assert!(c.pop().is_none());
            drop(c);
            assert!(ring.is_empty());
            assert_eq!(ring.len(), 0);
        }
    }

    /// The ring bounds the send queue, not only itself: WRs taken out but
    /// not yet retired by the engine keep their slots, and each one retired
    /// frees exactly one (`ibv_post_send`: ENOMEM while `max_send_wr` WRs
    /// are outstanding).
    #[test]
    fn a_wr_taken_but_not_retired_keeps_its_slot() {
        let (ring, retired) = ring(3);
        for lap in 0..4u64 {
            for i in 0..3 {
                assert!(ring.push(&wr(lap * 10 + i, &[])));
            }
            let mut c = ring.consumer().unwrap();
            let taken: Vec<_> = std::iter::from_fn(|| c.pop()).collect();
            drop(c);
            assert_eq!(taken.len(), 3);
            assert!(ring.is_empty(), "the ring itself is empty");
            assert!(!ring.push(&wr(99, &[])), "three WRs in flight fill a queue of three");
            retired.add(1);
            assert!(ring.push(&wr(lap * 10 + 3, &[])), "one retired, one slot");
            assert!(!ring.push(&wr(99, &[])));
            retired.add(2);
            let mut c = ring.consumer().unwrap();
            assert_eq!(c.pop().map(|w| w.wr_id), Some(lap * 10 + 3));
            assert!(c.pop().is_none(), "a refused post left nothing behind");
            drop(c);
            retired.add(1);
        }
    }

    #[test]
    fn partial_drains_keep_order() {
        let (ring, retired) = ring(5);
        let mut next = 0u64;
        let mut want = 0u64;
        for round in 0..50 {
            let n = round % 6;
            for _ in 0..n {
                if ring.push(&wr(next, &[])) {
                    next += 1;
                }
            }
            let mut c = ring.consumer().unwrap();
            for _ in 0..(round % 4) {
                match c.pop() {
                    Some(w) => {
                        assert_eq!(w.wr_id, want);
                        want += 1;
                        // Kept by the "engine": the ring makes up spares.
                        retired.add(1);
                    }
                    None => break,
                }
            }
        }
        assert!(next > 20);
    }

    /// `producers` threads post `per` WRs each through a ring of `depth`
    /// against one consumer: every WR arrives exactly once, whole (its SGE
    /// repeats its id, so two posts in one box show), each thread's in
    /// order; a refused post (full ring) is counted and retried. Returns the
    /// refusals.
    fn hammer(depth: usize, producers: u64, per: u64) -> usize {
        let retired = Arc::new(RetiredCount::default());
        let ring = Arc::new(SendRing::new(depth, retired.clone()));
        let refusals = Arc::new(AtomicUsize::new(0));
        let finished = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..producers)
            .map(|p| {
                let (ring, refusals, finished) = (ring.clone(), refusals.clone(), finished.clone());
                std::thread::spawn(move || {
                    for i in 0..per {
                        let sge = [Sge { addr: p << 32 | i, length: i as u32, lkey: p as u32 }];
                        while !ring.push(&wr(p << 32 | i, &sge)) {
                            refusals.fetch_add(1, Ordering::Relaxed);
                            std::thread::yield_now();
                        }
                    }
                    finished.fetch_add(1, Ordering::Release);
                })
            })
            .collect();
        let mut next = vec![0u64; producers as usize];
        let mut kept = Vec::new();
        // A small ring: let the posters fill it first, so refusals surely happen.
        while depth < 64 && refusals.load(Ordering::Relaxed) == 0 {
            std::thread::yield_now();
        }
        loop {
            // Read before the drain: if every poster was done, this drain
            // sees all that will ever be posted.
            let all_posted = finished.load(Ordering::Acquire) == producers as usize;
            let Some(mut c) = ring.consumer() else { panic!("one consumer") };
            while let Some(w) = c.pop() {
                let (p, i) = (w.wr_id >> 32, w.wr_id & 0xffff_ffff);
                assert_eq!(i, next[p as usize], "poster {p}: each WR once, in order");
                let WqePayload::Sgl(s) = &w.payload else { panic!("payload kind") };
                assert_eq!((s.len(), s[0].addr, s[0].length, s[0].lkey), (1, w.wr_id, i as u32, p as u32), "the WR whole");
                next[p as usize] += 1;
                // Hold some boxes a while, as the engine does until reaped
                // (their slots stay busy until then).
                kept.push(w);
                if kept.len() > depth / 2 {
                    for b in kept.drain(..depth / 4 + 1) {
                        c.recycle(b);
                        retired.add(1);
                    }
                }
            }
            drop(c);
            if all_posted {
                break;
            }
            std::thread::yield_now();
        }
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(next, vec![per; producers as usize], "every WR delivered");
        assert!(ring.is_empty());
        assert!(ring.consumer().unwrap().pop().is_none(), "nothing duplicated");
        refusals.load(Ordering::Relaxed)
    }

    /// A small ring, full most of the time: refusals and retries.
    #[test]
    fn hammer_small_ring() {
        let refused = hammer(8, 4, crate::stress_rounds(50_000));
        assert!(refused > 0, "the posters filled the ring first");
    }

    /// A ring the posters rarely fill: they race each other for the tail.
    #[test]
    fn hammer_large_ring() {
        hammer(1024, 3, crate::stress_rounds(300_000));
    }
}
