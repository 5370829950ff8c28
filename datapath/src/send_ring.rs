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
//! The stamps follow D. Vyukov's bounded queue (as `crossbeam`'s `ArrayQueue`
//! does): a position is a lap number and an index (`lap + index`, the lap a
//! multiple of a power of two above the capacity, so no division), and a slot's
//! stamp says which position it is ready for: `pos` free for a post at `pos`,
//! `pos + 1` holding the WR posted at `pos`. A full ring refuses a post without
//! touching any slot; a post claimed but not yet published holds the consumer
//! back (the ring stays in order), never a later post's slot.
//!
//! The ring is also the send queue's bound: a post is refused while `depth`
//! WRs it accepted are not yet retired by the engine — taken out but still in
//! flight count too, as on an HCA, whose send queue slot stays busy until the
//! WQE completes ([`RetiredCount`]). The claim reads that count once (a
//! load, no read-modify-write) and compares it with the number of WRs
//! accepted, which the claimed position itself encodes (`lap` times the depth
//! plus `index`: exact while positions do not wrap, after 2^64 / `one_lap`
//! laps).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use rocev2::transport::retired::RetiredCount;
use rocev2::transport::wqe::{SendSource, SendWqe, SendWrRef};

/// Keeps what producers write (the tail) and what the consumer writes (the
/// head) on separate cache lines.
#[repr(align(128))]
pub(crate) struct Padded<T>(pub(crate) T);

/// The position after `pos` in a ring of `capacity` slots whose positions
/// are a lap (a multiple of `one_lap`, the smallest power of two above the
/// capacity) plus an index (see the module docs).
#[inline]
pub(crate) fn next_position(pos: usize, one_lap: usize, capacity: usize) -> usize {
    let index = pos & (one_lap - 1);
    if index + 1 < capacity {
        pos + 1
    } else {
        (pos & !(one_lap - 1)).wrapping_add(one_lap)
    }
}

struct Slot {
    /// The position this slot is ready for (see the module docs).
    stamp: AtomicUsize,
    /// Written by the one post that claimed the slot, between its claim and
    /// its publishing store; read and exchanged by the consumer after it saw
    /// the slot published, before it frees it.
    wqe: UnsafeCell<Box<SendWqe>>,
}

/// A bounded multi-producer, single-consumer ring of send WQEs, the boxes kept
/// in its slots (see the module docs).
pub struct SendRing {
    slots: Box<[Slot]>,
    /// The lap step: the smallest power of two above the capacity.
    one_lap: usize,
    /// `one_lap`'s exponent.
    lap_shift: u32,
    /// WRs the engine has retired (see the module docs).
    retired: Arc<RetiredCount>,
    /// The next position a post claims.
    tail: Padded<AtomicUsize>,
    /// What the consumer writes, on a line of its own (posts read only the
    /// slots, `one_lap` and `tail`).
    consumer: Padded<ConsumerSide>,
}

struct ConsumerSide {
    /// The next position the consumer takes (stored when a drain ends; read
    /// by [`SendRing::len`] and [`SendRing::is_empty`]).
    head: AtomicUsize,
    /// Set while a [`SendConsumer`] exists: at most one at a time.
    consuming: AtomicBool,
    /// Boxes waiting to replace the ones taken out (the consumer's only).
    #[allow(clippy::vec_box)] // the boxes, not the WQEs, are what moves
    spares: UnsafeCell<Vec<Box<SendWqe>>>,
}

// SAFETY: the slots' boxes are written by the one post that claimed the slot
// (a successful compare-and-swap of `tail` from that position: unique) and
// handed between threads by the stamps' release stores and acquire loads; the
// spares are touched only by the one `SendConsumer` (the `consuming` flag).
// Every other field is atomic. `Box<SendWqe>` is `Send`.
unsafe impl Sync for SendRing {}

impl SendRing {
    /// A ring of `depth` WQEs (at least 1), with as many spare boxes: posting
    /// and a consumer that hands reaped boxes back allocate nothing. A post
    /// is refused while `depth` WRs accepted are not yet counted in
    /// `retired` (the engine's count for this send queue).
    pub fn new(depth: usize, retired: Arc<RetiredCount>) -> SendRing {
        let depth = depth.max(1);
        let one_lap = (depth + 1).next_power_of_two();
        let slots = (0..depth).map(|i| Slot { stamp: AtomicUsize::new(i), wqe: UnsafeCell::new(Box::new(SendWqe::empty())) }).collect();
        // The engine holds at most `depth` WQEs taken from here (its send
        // queue's depth); each one took a spare. Room for twice as many, so
        // boxes handed back late never make the vector grow.
        let mut spares = Vec::with_capacity(2 * depth);
        spares.extend((0..depth).map(|_| Box::new(SendWqe::empty())));
        SendRing {
            slots,
            one_lap,
            lap_shift: one_lap.trailing_zeros(),
            retired,
            tail: Padded(AtomicUsize::new(0)),
            consumer: Padded(ConsumerSide { head: AtomicUsize::new(0), consuming: AtomicBool::new(false), spares: UnsafeCell::new(spares) }),
        }
    }

    /// How many WRs the ring holds.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// The position after `pos`.
    #[inline]
    fn next(&self, pos: usize) -> usize {
        next_position(pos, self.one_lap, self.slots.len())
    }

    /// How many posts came before the one at `pos` (see the module docs).
    #[inline]
    fn accepted_before(&self, pos: usize) -> usize {
        (pos >> self.lap_shift).wrapping_mul(self.slots.len()).wrapping_add(pos & (self.one_lap - 1))
    }

    #[inline]
    fn slot(&self, pos: usize) -> &Slot {
        &self.slots[pos & (self.one_lap - 1)]
    }

    /// Post `wr`: written in place into the box of the slot at the tail (only
    /// the fields, SGEs and inline bytes it has). `false`, and nothing
    /// written, if the send queue is full: `depth` WRs posted and not yet
    /// retired. Any number of threads may post at once.
    #[inline]
    pub fn push(&self, wr: &SendWrRef<'_>) -> bool {
        let Some(pos) = self.claim() else { return false };
        // SAFETY: `pos` was just claimed by this post and is not published.
        unsafe { self.publish(pos, wr) };
        true
    }

    /// Claim the slot at the tail for one post: its position, or `None` if
    /// the send queue is full. [`SendRing::publish`] must follow.
    #[inline]
    pub(crate) fn claim(&self) -> Option<usize> {
        let mut pos = self.tail.0.load(Ordering::Relaxed);
        loop {
            let slot = self.slot(pos);
            // Acquire: the consumer's exchange of this slot's box happened
            // before its store of the stamp that frees the slot for `pos`.
            let stamp = slot.stamp.load(Ordering::Acquire);
            let ahead = stamp.wrapping_sub(pos) as isize;
            if ahead == 0 {
                // The slot is free, but the queue is full while `depth` WRs
                // accepted are not retired (taken out, still in flight). The
                // CAS below fixes `pos`, hence the count compared here; a
                // count read late only refuses, never over-admits.
                if self.accepted_before(pos).wrapping_sub(self.retired.get()) >= self.slots.len() {
                    return None;
                }
                // Free for `pos`: claim it. The CAS succeeds for one post only.
                // SeqCst: the doorbell's protocol orders this claim before
                // the poster's read of the QP's doorbell flag (`Nic::ring_qp`).
                match self.tail.0.compare_exchange_weak(pos, self.next(pos), Ordering::SeqCst, Ordering::Relaxed) {
                    Ok(_) => return Some(pos),
                    Err(now) => pos = now,
                }
            } else if ahead < 0 {
                // The slot still holds (or is about to hold) the WR posted one
                // lap earlier, not yet taken: the ring is full.
                return None;
            } else {
                // Another post claimed `pos` first: try the tail it left.
                std::hint::spin_loop();
                pos = self.tail.0.load(Ordering::Relaxed);
            }
        }
    }

    /// Write `wr` into the box of the slot claimed at `pos` and publish it.
    ///
    /// # Safety
    /// `pos` came from [`SendRing::claim`] on this ring and was not
    /// published yet.
    #[inline]
    pub(crate) unsafe fn publish(&self, pos: usize, wr: &SendWrRef<'_>) {
        let slot = self.slot(pos);
        // SAFETY: the caller's post alone claimed `pos` (the CAS in `claim`),
        // and the slot's stamp said the consumer was done with it: nobody
        // else reads or writes the box until the release store below
        // publishes it.
        unsafe { (*slot.wqe.get()).fill_from(wr) };
        slot.stamp.store(pos.wrapping_add(1), Ordering::Release);
    }

    /// WRs posted (or being posted) and not yet taken by a finished drain.
    pub fn len(&self) -> usize {
        let head = self.consumer.0.head.load(Ordering::Acquire);
        let tail = self.tail.0.load(Ordering::Acquire);
        let lap = |p: usize| p & !(self.one_lap - 1);
        let index = |p: usize| p & (self.one_lap - 1);
        let laps = lap(tail).wrapping_sub(lap(head)) / self.one_lap;
        (laps * self.slots.len() + index(tail)).wrapping_sub(index(head))
    }

    /// Whether no WR waits (see [`len`](Self::len)): a WR claimed and not
    /// yet published counts as waiting. SeqCst: the doorbell's check after a
    /// drain (`Nic::drain_qp`) must see every claim made before its swap.
    pub fn is_empty(&self) -> bool {
        self.consumer.0.head.load(Ordering::SeqCst) == self.tail.0.load(Ordering::SeqCst)
    }

    /// The ring's consumer, or `None` while another one exists (the
    /// datapath drains a QP's ring under its shard's engine lock, so this
    /// does not happen; the check keeps the ring sound regardless).
    pub fn consumer(&self) -> Option<SendConsumer<'_>> {
        if self.consumer.0.consuming.swap(true, Ordering::Acquire) {
            return None;
        }
        Some(SendConsumer { ring: self, head: self.consumer.0.head.load(Ordering::Relaxed) })
    }
}

/// The one consumer of a [`SendRing`] at a time: takes posted WQEs in order
/// and takes back reaped boxes as spares. Frees its claim when dropped.
pub struct SendConsumer<'a> {
    ring: &'a SendRing,
    head: usize,
}

impl SendConsumer<'_> {
    #[allow(clippy::vec_box)] // as `ConsumerSide::spares`
    fn spares(&mut self) -> &mut Vec<Box<SendWqe>> {
        // SAFETY: only a `SendConsumer` touches the spares, and `consuming`
        // admits one at a time; `&mut self` keeps this borrow unique.
        unsafe { &mut *self.ring.consumer.0.spares.get() }
    }

    /// Keep the box of a reaped WQE for the next slot taken out (dropped if
    /// the ring holds enough already).
    #[inline]
    pub fn recycle(&mut self, wqe: Box<SendWqe>) {
        let spares = self.spares();
        if spares.len() < spares.capacity() {
            spares.push(wqe);
        }
    }

    /// The oldest posted WQE, if its post is complete; a spare box takes its
    /// place in the ring (a new one only if none is left: the engine kept or
    /// dropped more boxes than it was given, as when it refuses a WR).
    #[inline]
    pub fn pop(&mut self) -> Option<Box<SendWqe>> {
        let ring = self.ring;
        let slot = ring.slot(self.head);
        // Acquire: pairs with the post's publishing store (its writes to the box).
        if slot.stamp.load(Ordering::Acquire) != self.head.wrapping_add(1) {
            return None;
        }
        let spare = self.spares().pop().unwrap_or_else(|| Box::new(SendWqe::empty()));
        // SAFETY: the stamp says the slot holds a published WR and no post may
        // touch it until the store below frees it; `consuming` makes this the
        // only consumer.
        let wqe = unsafe { std::mem::replace(&mut *slot.wqe.get(), spare) };
        // Free the slot for the same index one lap on.
        let pos = self.head;
        slot.stamp.store(pos.wrapping_add(ring.one_lap), Ordering::Release);
        self.head = ring.next(pos);
        Some(wqe)
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

impl Drop for SendConsumer<'_> {
    fn drop(&mut self) {
        self.ring.consumer.0.head.store(self.head, Ordering::Release);
        self.ring.consumer.0.consuming.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rocev2::transport::wqe::{PayloadRef, WqePayload};
    use rocev2::transport::wr::{SendFlags, SendOp, Sge};
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
        let refused = hammer(8, 4, 50_000);
        assert!(refused > 0, "the posters filled the ring first");
    }

    /// A ring the posters rarely fill: they race each other for the tail.
    #[test]
    fn hammer_large_ring() {
        hammer(1024, 3, 300_000);
    }
}
