//! A receive queue's ring (a QP's own or an SRQ's): application threads post
//! receive WRs into it, the datapath takes them out, in order, into the
//! engine's receive queue.
//!
//! Each slot holds a [`RecvWqe`] in place. A post claims the slot at the
//! ring's tail (one compare-and-swap, the only read-modify-write of a post),
//! writes the WR's `wr_id` and only the SGEs it has into that slot
//! ([`RecvWqe::fill_from`]) and publishes it with a plain store of its stamp.
//! The datapath, the one consumer at a time, hands the published WQE by
//! reference to the engine (which copies it once, into its receive queue),
//! then frees the slot with a plain store. Before, a post built a new WQE
//! (its eight SGEs zero-filled, then copied), counted itself with one
//! compare-and-swap, moved the WQE into a `crossbeam` `ArrayQueue` (a second
//! compare-and-swap and a copy of the whole WQE), and the drain moved it out
//! again (a third, and two more copies) before the engine's copy.
//!
//! The stamps and the bound are [`crate::send_ring`]'s: a position is a lap
//! number plus an index, a slot's stamp is `pos` when it is free for a post at
//! `pos` and `pos + 1` when it holds the WR posted at `pos`; a post is refused
//! while `depth` WRs the ring accepted are not retired by the engine (taken
//! out and still in the engine's receive queue count too: `ibv_post_recv`
//! returns ENOMEM at once, [`RetiredCount`]), the count of WRs accepted being
//! what the claimed position encodes.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use rocev2::transport::retired::RetiredCount;
use rocev2::transport::wqe::{RecvSource, RecvWqe, RecvWrRef};

use crate::send_ring::{next_position, Padded};

struct Slot {
    /// The position this slot is ready for (see the module docs).
    stamp: AtomicUsize,
    /// Written by the one post that claimed the slot, between its claim and
    /// its publishing store; read by the consumer after it saw the slot
    /// published, before it frees it.
    wqe: UnsafeCell<RecvWqe>,
}

/// A bounded multi-producer, single-consumer ring of receive WQEs written in
/// place (see the module docs).
pub struct RecvRing {
    slots: Box<[Slot]>,
    /// The lap step: the smallest power of two above the capacity.
    one_lap: usize,
    /// `one_lap`'s exponent.
    lap_shift: u32,
    /// WRs the engine has retired (see the module docs).
    retired: Arc<RetiredCount>,
    /// The next position a post claims.
    tail: Padded<AtomicUsize>,
    /// What the consumer writes, on a line of its own.
    consumer: Padded<ConsumerSide>,
}

struct ConsumerSide {
    /// The next position the consumer takes (stored when a drain ends).
    head: AtomicUsize,
    /// Set while a [`RecvConsumer`] exists: at most one at a time.
    consuming: AtomicBool,
}

// SAFETY: a slot's WQE is written by the one post that claimed the slot (a
// successful compare-and-swap of `tail` from that position: unique) and read
// by the one consumer (the `consuming` flag) after the stamp's release store
// published it and before the consumer's release store frees it; every other
// field is atomic. `RecvWqe` is `Send`.
unsafe impl Sync for RecvRing {}

impl RecvRing {
    /// A ring of `depth` WQEs (at least 1). A post is refused while `depth`
    /// WRs accepted are not yet counted in `retired` (the engine's count for
    /// this receive queue or SRQ).
    pub fn new(depth: usize, retired: Arc<RetiredCount>) -> RecvRing {
        let depth = depth.max(1);
        let one_lap = (depth + 1).next_power_of_two();
        let slots = (0..depth).map(|i| Slot { stamp: AtomicUsize::new(i), wqe: UnsafeCell::new(RecvWqe::default()) }).collect();
        RecvRing {
            slots,
            one_lap,
            lap_shift: one_lap.trailing_zeros(),
            retired,
            tail: Padded(AtomicUsize::new(0)),
            consumer: Padded(ConsumerSide { head: AtomicUsize::new(0), consuming: AtomicBool::new(false) }),
        }
    }

    /// How many WRs the ring holds.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    #[inline]
    fn slot(&self, pos: usize) -> &Slot {
        &self.slots[pos & (self.one_lap - 1)]
    }

    /// How many posts came before the one at `pos` (see [`crate::send_ring`]).
    #[inline]
    fn accepted_before(&self, pos: usize) -> usize {
        (pos >> self.lap_shift).wrapping_mul(self.slots.len()).wrapping_add(pos & (self.one_lap - 1))
    }

    /// Post `wr`, written in place into the slot at the tail (its `wr_id`
    /// and the SGEs it has). `false`, nothing written, if the queue holds
    /// its depth of WRs posted and not yet retired. Any number of threads
    /// may post at once.
    #[inline]
    pub fn push(&self, wr: &RecvWrRef<'_>) -> bool {
        let mut pos = self.tail.0.load(Ordering::Relaxed);
        loop {
            let slot = self.slot(pos);
            // Acquire: the consumer's read of this slot's WQE happened before
            // its store of the stamp that frees the slot for `pos`.
            let ahead = slot.stamp.load(Ordering::Acquire).wrapping_sub(pos) as isize;
            if ahead == 0 {
                // Free, but the queue is full while `depth` WRs accepted are
                // not retired; a count read late only refuses.
                if self.accepted_before(pos).wrapping_sub(self.retired.get()) >= self.slots.len() {
                    return false;
                }
                // SeqCst: the doorbell's protocol orders this claim before
                // the poster's read of the doorbell flag (`Nic::ring_qp`).
                match self.tail.0.compare_exchange_weak(pos, next_position(pos, self.one_lap, self.slots.len()), Ordering::SeqCst, Ordering::Relaxed)
                {
                    Ok(_) => break,
                    Err(now) => pos = now,
                }
            } else if ahead < 0 {
                // The WR posted one lap earlier is not taken yet: full.
                return false;
            } else {
                // Another post claimed `pos` first.
                std::hint::spin_loop();
                pos = self.tail.0.load(Ordering::Relaxed);
            }
        }
        let slot = self.slot(pos);
        // SAFETY: this post alone claimed `pos` (the CAS above) and the stamp
        // said the consumer was done with the slot: nobody else touches the
        // WQE until the release store below publishes it.
        unsafe { (*slot.wqe.get()).fill_from(wr) };
        slot.stamp.store(pos.wrapping_add(1), Ordering::Release);
        true
    }

    /// Whether no WR waits: a WR claimed and not yet published counts as
    /// waiting. SeqCst: the doorbell's check after a drain (`Nic::drain_qp`)
    /// must see every claim made before its swap.
    pub fn is_empty(&self) -> bool {
        self.consumer.0.head.load(Ordering::SeqCst) == self.tail.0.load(Ordering::SeqCst)
    }

    /// The ring's consumer, or `None` while another one exists (the
    /// datapath drains a ring under its shard's engine lock, so this does not
    /// happen; the check keeps the ring sound regardless).
    pub fn consumer(&self) -> Option<RecvConsumer<'_>> {
        if self.consumer.0.consuming.swap(true, Ordering::Acquire) {
            return None;
        }
        Some(RecvConsumer { ring: self, head: self.consumer.0.head.load(Ordering::Relaxed) })
    }
}

/// The one consumer of a [`RecvRing`] at a time: hands posted WQEs out in
/// order, by reference. Stores how far it went when dropped.
pub struct RecvConsumer<'a> {
    ring: &'a RecvRing,
    head: usize,
}

impl RecvConsumer<'_> {
    /// Hand the oldest posted WQE, if its post is complete, to `f`, then free
    /// its slot; `None` (and `f` not called) if there is none.
    #[inline]
    pub fn take<R>(&mut self, f: impl FnOnce(&RecvWqe) -> R) -> Option<R> {
        let ring = self.ring;
        let pos = self.head;
        let slot = ring.slot(pos);
        // Acquire: pairs with the post's publishing store (its writes to the WQE).
        if slot.stamp.load(Ordering::Acquire) != pos.wrapping_add(1) {
            return None;
        }
        // SAFETY: the stamp says the slot holds a published WR and no post
        // may touch it until the store below frees it; `consuming` makes this
        // the only consumer.
        let r = f(unsafe { &*slot.wqe.get() });
        // Free the slot for the same index one lap on.
        slot.stamp.store(pos.wrapping_add(ring.one_lap), Ordering::Release);
        self.head = next_position(pos, ring.one_lap, ring.slots.len());
        Some(r)
    }
}

impl RecvSource for RecvConsumer<'_> {
    #[inline]
    fn next_recv<R>(&mut self, f: impl FnOnce(&RecvWqe) -> R) -> Option<R> {
        self.take(f)
    }
}

impl Drop for RecvConsumer<'_> {
    fn drop(&mut self) {
        self.ring.consumer.0.head.store(self.head, Ordering::Release);
        self.ring.consumer.0.consuming.store(false, Ordering::Release);
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
        hammer(2, 4, 3000);
    }

    #[test]
    fn hammer_large_ring() {
        hammer(64, 3, 5000);
    }
}
