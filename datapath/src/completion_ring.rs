//! A completion queue's ring: the datapath's shards push completions in,
//! application threads poll them out, each side claiming a whole batch with
//! one compare-and-swap.
//!
//! A CQ can have several producers (the completions of QPs on different
//! shards go to one CQ, each shard delivering from its own thread) and
//! several consumers (`ibv_poll_cq` may be called from any number of threads
//! at once), so neither side can go without a read-modify-write. What a
//! per-element queue (crossbeam's `ArrayQueue`) pays per completion, a
//! compare-and-swap on each side, this ring pays per batch: a shard's poll
//! iteration pushes the completions it made for one CQ with one claim
//! ([`CompletionRing::push_slice`]), and a poll takes every completion it
//! asks for and finds with one claim ([`CompletionRing::pop_with`]). With one
//! core running both ends of a 64 B WRITE stream, the two locked
//! instructions were most of the old push's and pop's samples (`perf
//! annotate`: 65% and 75% on the branch after the `lock cmpxchg`).
//!
//! The stamps follow D. Vyukov's bounded queue, as [`crate::send_ring`]'s
//! do: a position is a lap number plus an index (`lap + index`, the lap a
//! multiple of a power of two above the capacity), and a slot's stamp says
//! what the slot is ready for: `pos` free for a push at `pos`, `pos + 1`
//! holding the completion pushed at `pos` (free for a pop at `pos`). Then:
//!
//! - a push reads the tail and counts the slots from it that are free for
//!   their positions (`stamp == pos`), up to what it has; a compare-and-swap
//!   of the tail from where it read it to after those slots makes them its
//!   own (it succeeds for one producer only, and no other producer can
//!   write a slot before the tail has passed it); it writes each slot, then
//!   publishes it with a release store of `pos + 1`, first to last;
//! - a pop reads the head and counts the slots from it that are published
//!   (`stamp == pos + 1`), up to what it wants; a compare-and-swap of the
//!   head to after them makes them its own (no other consumer reads a slot
//!   the head has passed); it copies each out and frees it for the next lap
//!   with a release store of `pos + one_lap`.
//!
//! A slot's stamp changes only from the thread that owns the slot (a
//! producer between its claim and its publish, a consumer between its claim
//! and its free), and the claims are the compare-and-swaps of positions
//! that never repeat (a `usize` of laps does not wrap in practice), so a
//! stamp a claimer saw before its successful compare-and-swap still holds
//! after it: the slots it counted are the ones it gets, in order. Per
//! producer the completions come out in the order pushed (one contiguous
//! range per claim, claims in the producer's order); a push never overtakes
//! a slot not yet freed (the ring is full there) and a pop never passes a
//! slot not yet published (a completion claimed by a producer and not
//! written yet is not there yet: the poll returns what came before it).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};

use rocev2::transport::wr::WorkCompletion;

use crate::wq_ring::{next_position, Padded};

struct Slot {
    /// The position this slot is ready for (see the module docs).
    stamp: AtomicUsize,
    /// Written by the one producer that claimed the slot, read by the one
    /// consumer that claimed it after the producer published it.
    wc: UnsafeCell<WorkCompletion>,
}

/// A bounded multi-producer, multi-consumer ring of work completions, each
/// side claiming a batch at a time (see the module docs).
pub struct CompletionRing {
    slots: Box<[Slot]>,
    /// The lap step: the smallest power of two above the capacity.
    one_lap: usize,
    /// The next position a push claims.
    tail: Padded<AtomicUsize>,
    /// The next position a pop claims.
    head: Padded<AtomicUsize>,
}

// SAFETY: a slot's completion is written only by the producer whose
// compare-and-swap of the tail claimed the slot, and read only by the
// consumer whose compare-and-swap of the head claimed it after the
// producer's release store of the stamp (acquired by the consumer's load);
// the producer of the next lap writes only after the consumer's release
// store that frees the slot (acquired by that producer's load). Every other
// field is atomic or immutable. `WorkCompletion` is `Copy` and `Send`.
unsafe impl Sync for CompletionRing {}

/// Iterations a producer spins on a slot a consumer has claimed but not yet
/// freed before it yields its core.
const SPINS_BEFORE_YIELD: u32 = 64;

impl CompletionRing {
    /// A ring of `capacity` completions (at least 1).
    pub fn new(capacity: usize) -> CompletionRing {
        let capacity = capacity.max(1);
        let one_lap = (capacity + 1).next_power_of_two();
        let slots = (0..capacity).map(|i| Slot { stamp: AtomicUsize::new(i), wc: UnsafeCell::new(WorkCompletion::default()) }).collect();
        CompletionRing { slots, one_lap, tail: Padded(AtomicUsize::new(0)), head: Padded(AtomicUsize::new(0)) }
    }

    /// How many completions the ring holds.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// The position after `pos`.
    #[inline]
    fn next(&self, pos: usize) -> usize {
        next_position(pos, self.one_lap, self.slots.len())
    }

    #[inline]
    fn slot(&self, pos: usize) -> &Slot {
        &self.slots[pos & (self.one_lap - 1)]
    }

    /// Up to `n` slots from `pos` on with their positions, in ring order:
    /// from `pos`'s index to the end, then from the start one lap on (no
    /// division per step, as [`next`](Self::next) has; one compare).
    #[inline]
    fn from(&self, pos: usize, n: usize) -> Walk<'_> {
        Walk { slots: &self.slots, index: pos & (self.one_lap - 1), pos, one_lap: self.one_lap, left: n.min(self.slots.len()) }
    }

    /// Completions pushed (or being pushed) and not yet claimed by a pop.
    pub fn len(&self) -> usize {
        // The head first: the tail read after it is at or past it (a pop
        // claims only slots the tail has passed).
        let head = self.head.0.load(Ordering::SeqCst);
        let tail = self.tail.0.load(Ordering::SeqCst);
        let lap = |p: usize| p & !(self.one_lap - 1);
        let index = |p: usize| p & (self.one_lap - 1);
        let laps = lap(tail).wrapping_sub(lap(head)) / self.one_lap;
        (laps * self.slots.len() + index(tail)).wrapping_sub(index(head))
    }

    /// Whether no completion waits (see [`len`](Self::len)).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Push `wcs` in order, as many as fit: returns how many were pushed (a
    /// prefix of `wcs`; the rest found the ring full). Usually one claim for
    /// all of them; more when a consumer is still freeing the slots ahead.
    /// Any number of threads may push at once.
    pub fn push_slice(&self, wcs: &[WorkCompletion]) -> usize {
        let mut done = 0;
        while done < wcs.len() {
            match self.push_some(&wcs[done..]) {
                0 => break,
                n => done += n,
            }
        }
        done
    }

    /// One claim of the free slots at the tail, up to `wcs.len()` (at least
    /// one), filled and published in order: how many, or 0 if the ring is
    /// full.
    fn push_some(&self, wcs: &[WorkCompletion]) -> usize {
        let mut spins = 0u32;
        let mut tail = self.tail.0.load(Ordering::Relaxed);
        loop {
            // Count the slots from `tail` free for their positions.
            let (mut n, mut end) = (0, tail);
            for (pos, slot) in self.from(tail, wcs.len()) {
                // Acquire: the consumer that freed this slot (its release
                // store of `pos`) read the completion before; we may
                // overwrite it once claimed.
                if slot.stamp.load(Ordering::Acquire) != pos {
                    break;
                }
                n += 1;
                end = pos;
            }
            if n > 0 {
                end = self.next(end);
                // Claim `tail..end`: succeeds for one producer only, and no
                // producer writes a slot the tail has not passed, so the
                // slots counted stay free until we publish them.
                match self.tail.0.compare_exchange_weak(tail, end, Ordering::SeqCst, Ordering::Relaxed) {
                    Ok(_) => {
                        for ((pos, slot), wc) in self.from(tail, n).zip(&wcs[..n]) {
                            // SAFETY: the claim above made `pos` ours and its
                            // stamp said no consumer holds it; no one reads
                            // the slot before the release store below.
                            unsafe { *slot.wc.get() = *wc };
                            slot.stamp.store(pos.wrapping_add(1), Ordering::Release);
                        }
                        return n;
                    }
                    Err(now) => {
                        tail = now;
                        continue;
                    }
                }
            }
            let stamp = self.slot(tail).stamp.load(Ordering::Acquire);
            if stamp.wrapping_add(self.one_lap) == tail.wrapping_add(1) {
                // The slot still holds the completion pushed one lap ago: the
                // ring is full unless a consumer has claimed that one and is
                // freeing it (its head is then past it: wait for the store).
                std::sync::atomic::fence(Ordering::SeqCst);
                let head = self.head.0.load(Ordering::Relaxed);
                if head.wrapping_add(self.one_lap) == tail {
                    return 0;
                }
                spins += 1;
                if spins < SPINS_BEFORE_YIELD {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            // Otherwise another producer claimed `tail` first.
            tail = self.tail.0.load(Ordering::Relaxed);
        }
    }

    /// Take up to `max` completions, oldest first, handing each to `f(index,
    /// completion)`; returns how many. One claim for all it finds published
    /// at the head (a completion claimed by a producer but not yet written
    /// ends the batch: it and those after it are for the next poll). Any
    /// number of threads may poll at once.
    pub fn pop_with(&self, max: usize, mut f: impl FnMut(usize, &WorkCompletion)) -> usize {
        let mut head = self.head.0.load(Ordering::Relaxed);
        // An empty ring (an application spinning on its CQ, most polls):
        // nothing published at the head, which no other consumer moved,
        // answered from one slot, without the ring-order iterator below.
        // The same answer the loop gives (its first slot fails the same test).
        if max == 0 {
            return 0;
        }
        if self.slot(head).stamp.load(Ordering::Acquire) != head.wrapping_add(1) {
            let now = self.head.0.load(Ordering::Relaxed);
            if now == head {
                return 0;
            }
            head = now;
        }
        let n = loop {
            // Count the slots from `head` holding a published completion.
            let (mut n, mut end) = (0, head);
            for (pos, slot) in self.from(head, max) {
                // Acquire: pairs with the producer's release store (its write
                // of the completion).
                if slot.stamp.load(Ordering::Acquire) != pos.wrapping_add(1) {
                    break;
                }
                n += 1;
                end = pos;
            }
            if n > 0 {
                end = self.next(end);
            }
            if n == 0 {
                // Nothing published at `head`, unless another consumer moved
                // the head meanwhile: then look again from where it is.
                let now = self.head.0.load(Ordering::Relaxed);
                if now == head {
                    return 0;
                }
                head = now;
                continue;
            }
            // Claim `head..end`: succeeds for one consumer only, and no
            // consumer reads or frees a slot the head has not passed, so the
            // slots counted stay published until we free them.
            match self.head.0.compare_exchange_weak(head, end, Ordering::SeqCst, Ordering::Relaxed) {
                Ok(_) => break n,
                Err(now) => head = now,
            }
        };
        // Free each slot as soon as its completion is copied out, before
        // handing it on; `Taking` frees the rest if `f` unwinds.
        let mut taking = Taking { one_lap: self.one_lap, slots: self.from(head, n) };
        let mut i = 0;
        while let Some(wc) = taking.take() {
            f(i, &wc);
            i += 1;
        }
        n
    }
}

/// [`CompletionRing::from`]'s walk over the slots in ring order: `left`
/// more from `index` (whose position is `pos`), wrapping once to index 0 of
/// the next lap. A slot index is always below the capacity (positions wrap
/// at it), so the slot is always there.
struct Walk<'a> {
    slots: &'a [Slot],
    index: usize,
    pos: usize,
    one_lap: usize,
    left: usize,
}

impl<'a> Iterator for Walk<'a> {
    type Item = (usize, &'a Slot);

    #[inline]
    fn next(&mut self) -> Option<(usize, &'a Slot)> {
        if self.left == 0 {
            return None;
        }
        let slot = self.slots.get(self.index)?;
        let pos = self.pos;
        self.left -= 1;
        self.index += 1;
        self.pos = pos.wrapping_add(1);
        if self.index == self.slots.len() {
            self.index = 0;
            self.pos = (pos & !(self.one_lap - 1)).wrapping_add(self.one_lap);
        }
        Some((pos, slot))
    }
}

/// The slots a pop claimed and has not yet freed: freed in order by
/// [`Taking::take`], the rest by `drop` (if the caller's closure unwinds, so
/// that producers never wait on a slot no one will free).
struct Taking<'a, I: Iterator<Item = (usize, &'a Slot)>> {
    one_lap: usize,
    slots: I,
}

impl<'a, I: Iterator<Item = (usize, &'a Slot)>> Taking<'a, I> {
    /// Copy out the completion at the next claimed slot and free the slot.
    #[inline]
    fn take(&mut self) -> Option<WorkCompletion> {
        let (pos, slot) = self.slots.next()?;
        // SAFETY: the pop's claim made the slot ours, and its stamp (loaded
        // with acquire before the claim) said the producer had written it.
        let wc = unsafe { *slot.wc.get() };
        // Free the slot for a push at the same index one lap on.
        slot.stamp.store(pos.wrapping_add(self.one_lap), Ordering::Release);
        Some(wc)
    }
}

impl<'a, I: Iterator<Item = (usize, &'a Slot)>> Drop for Taking<'a, I> {
    fn drop(&mut self) {
        while self.take().is_some() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    /// A completion carrying `id` (producer in the high 16 bits, its
    /// sequence number below).
    fn wc(id: u64) -> WorkCompletion {
        WorkCompletion { wr_id: id, ..WorkCompletion::default() }
    }

    fn pop_all(ring: &CompletionRing, max: usize) -> Vec<u64> {
        let mut out = Vec::new();
        ring.pop_with(max, |i, w| {
            assert_eq!(i, out.len(), "indices count up from 0");
            out.push(w.wr_id);
        });
        out
    }

    /// One thread: a full ring takes a prefix and refuses the rest; polls
    /// take up to what they ask, oldest first; positions wrap over laps.
    #[test]
    fn fifo_full_ring_and_wrap() {
        let ring = CompletionRing::new(5);
        assert_eq!(ring.capacity(), 5);
        let mut next = 0u64;
        let mut expect = 0u64;
        for round in 0..200usize {
            // Fill: some rounds offer more than fits.
            let offer: Vec<WorkCompletion> = (next..next + 1 + (round % 7) as u64).map(wc).collect();
            let room = 5 - ring.len();
            let pushed = ring.push_slice(&offer);
            assert_eq!(pushed, offer.len().min(room), "round {round}: a prefix, as much as fits");
            next += pushed as u64;
            assert_eq!(ring.len(), 5 - room + pushed);
            let held = ring.len();
            let got = pop_all(&ring, 1 + round % 4);
            assert_eq!(got.len(), (1 + round % 4).min(held), "as many as asked for and there");
            for id in got {
                assert_eq!(id, expect, "oldest first");
                expect += 1;
            }
        }
        let rest = pop_all(&ring, usize::MAX);
        assert!(rest.iter().copied().eq(expect..next));
        assert!(ring.is_empty());
        assert_eq!(pop_all(&ring, 4), Vec::<u64>::new());
        assert_eq!(ring.push_slice(&[]), 0);
        assert_eq!(pop_all(&ring, 0), Vec::<u64>::new());
    }

    /// The empty poll's shortcut (one slot's stamp) answers as the full
    /// loop: nothing at every index and lap of the ring, a poll of zero
    /// takes nothing from a ring that holds some, and neither disturbs what
    /// is pushed next (a stamp left one lap behind, the last index before
    /// the wrap, the first after it).
    #[test]
    fn empty_polls_take_nothing_at_every_position() {
        let ring = CompletionRing::new(3);
        let mut next = 0u64;
        for round in 0..20usize {
            assert_eq!(pop_all(&ring, 4), Vec::<u64>::new(), "round {round}: empty");
            let n = 1 + round % 3;
            assert_eq!(ring.push_slice(&(next..next + n as u64).map(wc).collect::<Vec<_>>()), n);
            assert_eq!(pop_all(&ring, 0), Vec::<u64>::new(), "round {round}: a poll of zero");
            assert_eq!(ring.len(), n);
            assert!(pop_all(&ring, usize::MAX).into_iter().eq(next..next + n as u64), "round {round}: all, in order");
            next += n as u64;
            assert_eq!(pop_all(&ring, 1), Vec::<u64>::new(), "round {round}: empty again");
        }
    }

    /// A closure that unwinds mid-poll frees every slot the poll claimed:
    /// the completions it had not handed on are lost to that poll, but the
    /// ring takes a whole capacity again (no producer waits on them).
    #[test]
    fn an_unwinding_poll_frees_its_slots() {
        let ring = CompletionRing::new(4);
        assert_eq!(ring.push_slice(&(0..4).map(wc).collect::<Vec<_>>()), 4);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            ring.pop_with(3, |i, _| assert!(i < 1, "unwinds at the second"));
        }));
        assert!(r.is_err());
        assert_eq!(ring.len(), 1);
        assert_eq!(ring.push_slice(&(4..7).map(wc).collect::<Vec<_>>()), 3, "the three claimed slots are free");
        assert_eq!(pop_all(&ring, 9), vec![3, 4, 5, 6]);
    }

    const PRODUCERS: u64 = 3;
    const PER_PRODUCER: u64 = crate::stress_rounds(30_000);

    /// Several producers pushing batches of 1-7 (retrying what a full ring
    /// refused), several consumers polling 1-9 at a time, on a small ring:
    /// every completion comes out exactly once, and each consumer sees each
    /// producer's completions in the order pushed.
    fn hammer(capacity: usize, consumers: usize) {
        let ring = Arc::new(CompletionRing::new(capacity));
        let done = Arc::new(AtomicBool::new(false));
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let ring = ring.clone();
                std::thread::spawn(move || {
                    let mut seq = 0u64;
                    let mut fulls = 0u64;
                    while seq < PER_PRODUCER {
                        let k = (1 + (seq * 7 + p) % 7).min(PER_PRODUCER - seq);
                        let batch: Vec<WorkCompletion> = (seq..seq + k).map(|s| wc(p << 48 | s)).collect();
                        let mut at = 0;
                        while at < batch.len() {
                            let n = ring.push_slice(&batch[at..]);
                            if n < batch.len() - at {
                                fulls += 1;
                                std::thread::yield_now();
                            }
                            at += n;
                        }
                        seq += k;
                    }
                    fulls
                })
            })
            .collect();
        let takers: Vec<_> = (0..consumers)
            .map(|c| {
                let (ring, done) = (ring.clone(), done.clone());
                std::thread::spawn(move || {
                    let mut seen = Vec::new();
                    let mut last = [None::<u64>; PRODUCERS as usize];
                    let mut max = 1 + c;
                    loop {
                        let finished = done.load(Ordering::Acquire);
                        let n = ring.pop_with(max, |_, w| {
                            let (p, s) = ((w.wr_id >> 48) as usize, w.wr_id & 0xffff_ffff_ffff);
                            assert!(last[p].is_none_or(|l| s > l), "producer {p}: {s} after {:?}", last[p]);
                            last[p] = Some(s);
                            seen.push(w.wr_id);
                        });
                        if n == 0 {
                            if finished {
                                return seen;
                            }
                            std::thread::yield_now();
                        }
                        max = 1 + (max + 4) % 9;
                    }
                })
            })
            .collect();
        let fulls: u64 = producers.into_iter().map(|t| t.join().unwrap()).sum();
        done.store(true, Ordering::Release);
        let mut all: Vec<u64> = takers.into_iter().flat_map(|t| t.join().unwrap()).collect();
        assert_eq!(all.len() as u64, PRODUCERS * PER_PRODUCER, "none lost, none twice");
        all.sort_unstable();
        let expected = (0..PRODUCERS).flat_map(|p| (0..PER_PRODUCER).map(move |s| p << 48 | s));
        assert!(all.into_iter().eq(expected), "exactly once each");
        assert!(ring.is_empty());
        eprintln!("capacity {capacity}, {consumers} consumers: producers found the ring full {fulls} times");
    }

    #[test]
    fn many_producers_one_consumer_small_ring() {
        hammer(5, 1);
    }

    #[test]
    fn many_producers_many_consumers_small_ring() {
        hammer(7, 3);
    }

    #[test]
    fn many_producers_many_consumers_roomy_ring() {
        hammer(256, 2);
    }

    /// A producer that pushes only what the ring has room for (counted
    /// after each poll has freed its slots) is never told the ring is full,
    /// however the pops interleave with its claims: a consumer between its
    /// claim and its frees is waited for, not taken for a full ring.
    #[test]
    fn a_ring_with_room_never_refuses() {
        const CAP: usize = 6;
        let ring = Arc::new(CompletionRing::new(CAP));
        let held = Arc::new(AtomicUsize::new(0));
        let total = crate::stress_rounds(200_000);
        let consumer = {
            let (ring, held) = (ring.clone(), held.clone());
            std::thread::spawn(move || {
                let mut next = 0u64;
                while next < total {
                    let n = ring.pop_with(1 + (next % 4) as usize, |_, w| {
                        assert_eq!(w.wr_id, next);
                        next += 1;
                    });
                    held.fetch_sub(n, Ordering::AcqRel);
                }
            })
        };
        let mut seq = 0u64;
        while seq < total {
            let k = (1 + seq % 5).min(total - seq) as usize;
            if held.load(Ordering::Acquire) + k > CAP {
                std::hint::spin_loop();
                continue;
            }
            held.fetch_add(k, Ordering::AcqRel);
            let batch: Vec<WorkCompletion> = (seq..seq + k as u64).map(wc).collect();
            assert_eq!(ring.push_slice(&batch), k, "refused with room at {seq}");
            seq += k as u64;
        }
        consumer.join().unwrap();
    }
}
