//! A receive queue's ring (a QP's own or an SRQ's): application threads post
//! receive WRs into it, the datapath takes them out, in order, into the
//! engine's receive queue.
//!
//! Each slot holds a [`RecvWqe`] in place. A post claims the slot at the
//! ring's tail (one compare-and-swap, the only read-modify-write of a post),
//! writes the WR's `wr_id` and only the SGEs it has into that slot
//! ([`RecvWqe::fill_from`]) and publishes it with a plain store of its stamp.
//! The datapath, the one consumer at a time, lends the published WQE to the
//! engine (which copies it once, into its receive queue), then frees the
//! slot with a plain store. Before, a post built a new WQE (its eight SGEs
//! zero-filled, then copied), counted itself with one compare-and-swap,
//! moved the WQE into a `crossbeam` `ArrayQueue` (a second compare-and-swap
//! and a copy of the whole WQE), and the drain moved it out again (a third,
//! and two more copies) before the engine's copy.
//!
//! The slots, their stamps and the queue's bound (a post is refused while
//! `depth` WRs accepted are not retired by the engine, those taken out and
//! still in its receive queue included: `ibv_post_recv` returns ENOMEM at
//! once) are the work-queue ring's (`crate::wq_ring`), shared with the
//! send ring.

use std::sync::Arc;

use rocev2::transport::retired::RetiredCount;
use rocev2::transport::wqe::{RecvSource, RecvWqe, RecvWrRef};

use crate::wq_ring::{WqConsumer, WqRing};

/// A bounded multi-producer, single-consumer ring of receive WQEs written in
/// place (see the module docs).
pub struct RecvRing {
    ring: WqRing<RecvWqe, ()>,
}

impl RecvRing {
    /// A ring of `depth` WQEs (at least 1). A post is refused while `depth`
    /// WRs accepted are not yet counted in `retired` (the engine's count for
    /// this receive queue or SRQ).
    pub fn new(depth: usize, retired: Arc<RetiredCount>) -> RecvRing {
        RecvRing { ring: WqRing::new(depth, retired, RecvWqe::default, ()) }
    }

    /// How many WRs the ring holds.
    pub fn capacity(&self) -> usize {
        self.ring.capacity()
    }

    /// Post `wr`, written in place into the slot at the tail (its `wr_id`
    /// and the SGEs it has). `false`, nothing written, if the queue holds
    /// its depth of WRs posted and not yet retired. Any number of threads
    /// may post at once.
    #[inline]
    pub fn push(&self, wr: &RecvWrRef<'_>) -> bool {
        self.ring.push(|wqe| wqe.fill_from(wr))
    }

    /// Claim the slot at the tail for one post: its position, or `None` if
    /// the queue is full. [`RecvRing::publish`] must follow.
    /// (Tests: a post held up between its claim and its publishing.)
    #[cfg(test)]
    pub(crate) fn claim(&self) -> Option<usize> {
        self.ring.claim()
    }

    /// Write `wr` into the slot claimed at `pos` and publish it.
    ///
    /// # Safety
    /// `pos` came from [`RecvRing::claim`] on this ring and was not
    /// published yet.
    #[cfg(test)]
    pub(crate) unsafe fn publish(&self, pos: usize, wr: &RecvWrRef<'_>) {
        // SAFETY: the caller's contract is the ring's.
        unsafe { self.ring.publish(pos, |wqe| wqe.fill_from(wr)) };
    }

    /// Whether no WR waits: a WR claimed and not yet published counts as
    /// waiting.
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// The ring's consumer, or `None` while another one exists (the
    /// datapath drains a ring under its shard's engine lock, so this does not
    /// happen; the check keeps the ring sound regardless).
    pub fn consumer(&self) -> Option<RecvConsumer<'_>> {
        self.ring.consumer().map(|c| RecvConsumer { c })
    }
}

/// The one consumer of a [`RecvRing`] at a time: lends posted WQEs in order.
/// Stores how far it went when dropped.
pub struct RecvConsumer<'a> {
    c: WqConsumer<'a, RecvWqe, ()>,
}

impl RecvConsumer<'_> {
    /// Hand the oldest posted WQE, if its post is complete, to `f`, then free
    /// its slot; `None` (and `f` not called) if there is none.
    #[inline]
    pub fn take<R>(&mut self, f: impl FnOnce(&RecvWqe) -> R) -> Option<R> {
        self.c.take(|wqe, ()| f(wqe))
    }
}

impl RecvSource for RecvConsumer<'_> {
    #[inline]
    fn next_recv<R>(&mut self, f: impl FnOnce(&RecvWqe) -> R) -> Option<R> {
        self.take(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rocev2::transport::wqe::RECV_WQE_SGES;
    use rocev2::transport::wr::Sge;

    fn ring(depth: usize) -> (RecvRing, Arc<RetiredCount>) {
        let retired = Arc::new(RetiredCount::default());
        (RecvRing::new(depth, retired.clone()), retired)
    }

    fn sges(id: u64, n: usize) -> Vec<Sge> {
        (0..n as u64).map(|i| Sge { addr: id * 0x1000 + i, length: id as u32, lkey: i as u32 }).collect()
    }

    /// Everything the ring holds, oldest first, as owned WQEs.
    fn drain(ring: &RecvRing) -> Vec<RecvWqe> {
        let mut c = ring.consumer().unwrap();
        std::iter::from_fn(|| c.take(RecvWqe::clone)).collect()
    }

    /// Slots reused by WRs of every SGE count (none, in place, on the heap,
    /// back in place) read as new WQEs made from the WRs, in order; a full
    /// ring refuses; one consumer at a time.
    #[test]
    fn slots_reused_read_as_new_wqes() {
        let (ring, retired) = ring(3);
        let counts = [2, 0, RECV_WQE_SGES, RECV_WQE_SGES + 3, 1, 5, RECV_WQE_SGES + 1, 0, 3];
        for (lap, chunk) in counts.chunks(3).enumerate() {
            let lists: Vec<Vec<Sge>> = chunk.iter().enumerate().map(|(i, &n)| sges((lap * 3 + i) as u64, n)).collect();
            let wrs: Vec<RecvWrRef<'_>> = lists.iter().enumerate().map(|(i, s)| RecvWrRef { wr_id: (lap * 3 + i) as u64, sgl: s }).collect();
            for w in &wrs {
                assert!(ring.push(w));
            }
            assert!(!ring.push(&wrs[0]), "a full ring refuses");
            assert!(!ring.is_empty());
            let c = ring.consumer().unwrap();
            assert!(ring.consumer().is_none(), "one consumer at a time");
            drop(c);
            let got = drain(&ring);
            assert_eq!(got, wrs.iter().map(RecvWqe::from).collect::<Vec<_>>(), "lap {lap}");
            assert!(ring.is_empty());
            retired.add(3);
        }
    }

    /// The ring bounds the receive queue, not only itself: WRs taken out
    /// but not yet retired by the engine keep their slots, each one retired
    /// frees exactly one (`ibv_post_recv`: ENOMEM while `max_recv_wr` WRs
    /// are outstanding), and a refused post leaves nothing behind.
    #[test]
    fn a_wr_taken_but_not_retired_keeps_its_slot() {
        let (ring, retired) = ring(3);
        let wr = |id| RecvWrRef { wr_id: id, sgl: &[] };
        for lap in 0..4u64 {
            for i in 0..3 {
                assert!(ring.push(&wr(lap * 10 + i)));
            }
            assert_eq!(drain(&ring).len(), 3);
            assert!(ring.is_empty(), "the ring itself is empty");
            assert!(!ring.push(&wr(99)), "three WRs in flight fill a queue of three");
            retired.add(1);
            assert!(ring.push(&wr(lap * 10 + 3)), "one retired, one slot");
            assert!(!ring.push(&wr(99)));
            retired.add(2);
            assert_eq!(drain(&ring).iter().map(|w| w.wr_id).collect::<Vec<_>>(), [lap * 10 + 3], "a refused post left nothing behind");
            retired.add(1);
        }
    }

    /// `producers` threads post `per` WRs each through a ring of `depth`
    /// against one consumer that retires what it takes: every WR arrives
    /// exactly once, whole (its SGEs repeat its id, so two posts in one slot
    /// show), each thread's in order; a refused post is retried.
    fn hammer(depth: usize, producers: u64, per: u64) {
        let retired = Arc::new(RetiredCount::default());
        let ring = Arc::new(RecvRing::new(depth, retired.clone()));
        let threads: Vec<_> = (0..producers)
            .map(|p| {
                let ring = ring.clone();
                std::thread::spawn(move || {
                    for i in 0..per {
                        let id = p << 32 | i;
                        let sgl = sges(id, (i % (RECV_WQE_SGES as u64 + 2)) as usize);
                        while !ring.push(&RecvWrRef { wr_id: id, sgl: &sgl }) {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let mut next = vec![0u64; producers as usize];
        let mut seen = 0;
        while seen < producers * per {
            let mut c = ring.consumer().unwrap();
            while let Some(w) = c.take(RecvWqe::clone) {
                let (p, i) = ((w.wr_id >> 32) as usize, w.wr_id & 0xffff_ffff);
                assert_eq!(i, next[p], "producer {p} in order, once each");
                assert_eq!(&w.sgl[..], &sges(w.wr_id, (i % (RECV_WQE_SGES as u64 + 2)) as usize)[..], "WR {:#x} whole", w.wr_id);
                next[p] += 1;
                seen += 1;
                retired.add(1);
            }
            drop(c);
            std::thread::yield_now();
        }
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert!(ring.is_empty());
    }

    #[test]
    fn hammer_small_ring() {
        hammer(2, 4, crate::stress_rounds(3000));
    }

    #[test]
    fn hammer_large_ring() {
        hammer(64, 3, crate::stress_rounds(5000));
    }
}
