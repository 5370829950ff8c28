//! The slots, stamps and bound shared by a QP's send ring
//! ([`crate::send_ring`]) and a receive queue's ring ([`crate::recv_ring`]):
//! a bounded multi-producer, single-consumer ring whose slots each hold a
//! `T` at all times, written in place by the post that claimed the slot and
//! handed to the consumer by reference.
//!
//! A post claims the slot at the ring's tail (one compare-and-swap, the only
//! read-modify-write of a post), writes its WR into that slot's `T` in place
//! and publishes the slot with a plain store of its stamp. The consumer, one
//! at a time, takes what it needs from the published `T` (the send ring
//! exchanges its box for a spare, the receive ring lends the WQE to the
//! engine, which copies it), then frees the slot with a plain store.
//!
//! The stamps follow D. Vyukov's bounded queue (as `crossbeam`'s `ArrayQueue`
//! does): a position is a lap number and an index (`lap + index`, the lap a
//! multiple of a power of two above the capacity, so no division), and a slot's
//! stamp says which position it is ready for: `pos` free for a post at `pos`,
//! `pos + 1` holding the WR posted at `pos`. A full ring refuses a post without
//! touching any slot; a post claimed but not yet published holds the consumer
//! back (the ring stays in order), never a later post's slot.
//!
//! The ring is also the work queue's bound: a post is refused while `depth`
//! WRs it accepted are not yet retired by the engine — taken out but still in
//! flight count too, as on an HCA, whose queue slot stays busy until the WQE
//! completes ([`RetiredCount`]). The claim reads that count once (a load, no
//! read-modify-write) and compares it with the number of WRs accepted, which
//! the claimed position itself encodes (`lap` times the depth plus `index`:
//! exact while positions do not wrap, after 2^64 / `one_lap` laps). A count
//! larger than that number means the post was held up and its position
//! went stale meanwhile: it looks at the tail again (`WqRing::outstanding`).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use rocev2::transport::retired::RetiredCount;

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

struct Slot<T> {
    /// The position this slot is ready for (see the module docs).
    stamp: AtomicUsize,
    /// Written by the one post that claimed the slot, between its claim and
    /// its publishing store; read (and written) by the consumer after it saw
    /// the slot published, before it frees it.
    item: UnsafeCell<T>,
}

/// A bounded MPSC ring of `T`s written in place (see the module docs), with
/// `C`, state of the consumer's own (the send ring's spare boxes).
pub(crate) struct WqRing<T, C> {
    slots: Box<[Slot<T>]>,
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
    consumer: Padded<ConsumerSide<C>>,
}

struct ConsumerSide<C> {
    /// The next position the consumer takes (stored when a drain ends; read
    /// by [`WqRing::len`] and [`WqRing::is_empty`]).
    head: AtomicUsize,
    /// Set while a [`WqConsumer`] exists: at most one at a time.
    consuming: AtomicBool,
    /// The consumer's own state.
    own: UnsafeCell<C>,
}

// SAFETY: a slot's `T` is written by the one post that claimed the slot (a
// successful compare-and-swap of `tail` from that position: unique) and
// handed between threads by the stamps' release stores and acquire loads;
// the consumer's state is touched only by the one `WqConsumer` (the
// `consuming` flag). Every other field is atomic.
unsafe impl<T: Send, C: Send> Sync for WqRing<T, C> {}

impl<T, C> WqRing<T, C> {
    /// A ring of `depth` slots (at least 1), each holding what `make` makes,
    /// bounded by `retired` (the engine's count for the queue).
    pub(crate) fn new(depth: usize, retired: Arc<RetiredCount>, mut make: impl FnMut() -> T, own: C) -> WqRing<T, C> {
        let depth = depth.max(1);
        let one_lap = (depth + 1).next_power_of_two();
        let slots = (0..depth).map(|i| Slot { stamp: AtomicUsize::new(i), item: UnsafeCell::new(make()) }).collect();
        WqRing {
            slots,
            one_lap,
            lap_shift: one_lap.trailing_zeros(),
            retired,
            tail: Padded(AtomicUsize::new(0)),
            consumer: Padded(ConsumerSide { head: AtomicUsize::new(0), consuming: AtomicBool::new(false), own: UnsafeCell::new(own) }),
        }
    }

    /// How many WRs the ring holds.
    pub(crate) fn capacity(&self) -> usize {
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

    /// WRs accepted before `pos` and not counted in `retired` (read after
    /// `pos`'s stamp), as an unsigned difference. A `retired` that counts
    /// more WRs than were accepted before `pos` wraps it round above
    /// `isize::MAX`: that happens only when `pos` went stale while the count
    /// was read (the post was held up after it saw the slot free, and
    /// meanwhile `pos` and later posts were claimed, taken and retired), and
    /// the claim must look at the tail again, not report a full queue.
    ///
    /// A count read late is otherwise safe: it only grows, so it can admit
    /// no more than the CAS of `pos` itself allows, and a `pos` gone stale
    /// with the count still saying full means the queue is full now too.
    #[inline]
    fn outstanding(&self, pos: usize, retired: usize) -> usize {
        self.accepted_before(pos).wrapping_sub(retired)
    }

    #[inline]
    fn slot(&self, pos: usize) -> &Slot<T> {
        &self.slots[pos & (self.one_lap - 1)]
    }

    /// One post: the slot at the tail claimed, written with `write`, and
    /// published. `false`, and nothing written, if the queue is full.
    #[inline]
    pub(crate) fn push(&self, write: impl FnOnce(&mut T)) -> bool {
        let Some(pos) = self.claim() else { return false };
        // SAFETY: `pos` was just claimed by this post and is not published.
        unsafe { self.publish(pos, write) };
        true
    }

    /// Claim the slot at the tail for one post: its position, or `None` if
    /// the queue is full. [`WqRing::publish`] must follow.
    #[inline]
    pub(crate) fn claim(&self) -> Option<usize> {
        let mut pos = self.tail.0.load(Ordering::Relaxed);
        loop {
            let slot = self.slot(pos);
            // Acquire: the consumer's last use of this slot's `T` happened
            // before its store of the stamp that frees the slot for `pos`.
            let stamp = slot.stamp.load(Ordering::Acquire);
            let ahead = stamp.wrapping_sub(pos) as isize;
            if ahead == 0 {
                // The slot is free, but the queue is full while `depth` WRs
                // accepted are not retired (taken out, still in flight). The
                // CAS below fixes `pos`, hence the count compared here.
                #[cfg(test)]
                tests::held_up_here();
                let outstanding = self.outstanding(pos, self.retired.get());
                if outstanding >= self.slots.len() {
                    // Wrapped round: `pos` went stale between the stamp's
                    // load and the count's. Look at the tail again.
                    if outstanding > isize::MAX as usize {
                        pos = self.tail.0.load(Ordering::Relaxed);
                        continue;
                    }
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

    /// Write the slot claimed at `pos` with `write`, then publish it.
    ///
    /// # Safety
    /// `pos` came from [`WqRing::claim`] on this ring and was not published
    /// yet.
    #[inline]
    pub(crate) unsafe fn publish(&self, pos: usize, write: impl FnOnce(&mut T)) {
        let slot = self.slot(pos);
        // SAFETY: the caller's post alone claimed `pos` (the CAS in `claim`),
        // and the slot's stamp said the consumer was done with it: nobody
        // else reads or writes the `T` until the release store below
        // publishes it.
        write(unsafe { &mut *slot.item.get() });
        slot.stamp.store(pos.wrapping_add(1), Ordering::Release);
    }

    /// WRs posted (or being posted) and not yet taken by a finished drain.
    pub(crate) fn len(&self) -> usize {
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
    pub(crate) fn is_empty(&self) -> bool {
        self.consumer.0.head.load(Ordering::SeqCst) == self.tail.0.load(Ordering::SeqCst)
    }

    /// The ring's consumer, or `None` while another one exists (the
    /// datapath drains a ring under its shard's engine lock, so this does
    /// not happen; the check keeps the ring sound regardless).
    pub(crate) fn consumer(&self) -> Option<WqConsumer<'_, T, C>> {
        if self.consumer.0.consuming.swap(true, Ordering::Acquire) {
            return None;
        }
        Some(WqConsumer { ring: self, head: self.consumer.0.head.load(Ordering::Relaxed) })
    }
}

/// The one consumer of a [`WqRing`] at a time: takes published slots in
/// order. Stores how far it went, and frees its claim, when dropped.
pub(crate) struct WqConsumer<'a, T, C> {
    ring: &'a WqRing<T, C>,
    head: usize,
}

impl<T, C> WqConsumer<'_, T, C> {
    /// The consumer's own state.
    #[inline]
    pub(crate) fn own(&mut self) -> &mut C {
        // SAFETY: only a `WqConsumer` touches it, and `consuming` admits one
        // at a time; `&mut self` keeps this borrow unique.
        unsafe { &mut *self.ring.consumer.0.own.get() }
    }

    /// Hand the oldest slot, if its post is complete, to `f` with the
    /// consumer's own state, then free the slot; `None` (and `f` not
    /// called) if there is none.
    #[inline]
    pub(crate) fn take<R>(&mut self, f: impl FnOnce(&mut T, &mut C) -> R) -> Option<R> {
        let ring = self.ring;
        let pos = self.head;
        let slot = ring.slot(pos);
        // Acquire: pairs with the post's publishing store (its writes to the slot).
        if slot.stamp.load(Ordering::Acquire) != pos.wrapping_add(1) {
            return None;
        }
        // SAFETY: the stamp says the slot holds a published WR and no post
        // may touch it until the store below frees it; `consuming` makes this
        // the only consumer.
        let r = f(unsafe { &mut *slot.item.get() }, self.own());
        // Free the slot for the same index one lap on.
        slot.stamp.store(pos.wrapping_add(ring.one_lap), Ordering::Release);
        self.head = ring.next(pos);
        Some(r)
    }
}

impl<T, C> Drop for WqConsumer<'_, T, C> {
    fn drop(&mut self) {
        self.ring.consumer.0.head.store(self.head, Ordering::Release);
        self.ring.consumer.0.consuming.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::sync::atomic::AtomicU64;

    thread_local! {
        /// What this thread's next claim waits for between the slot's stamp
        /// and the retired count (tests only).
        static HOLD_UP: RefCell<Option<Box<dyn FnOnce()>>> = const { RefCell::new(None) };
    }

    /// Called by [`WqRing::claim`] in tests between its load of the slot's
    /// stamp and its load of the retired count: runs what this thread asked
    /// to wait for there, as a post preempted at that point would.
    pub(super) fn held_up_here() {
        if let Some(wait) = HOLD_UP.with(|h| h.borrow_mut().take()) {
            wait();
        }
    }

    fn ring(depth: usize) -> (WqRing<usize, ()>, Arc<RetiredCount>) {
        let retired = Arc::new(RetiredCount::default());
        (WqRing::new(depth, retired.clone(), || 0, ()), retired)
    }

    fn post(r: &WqRing<usize, ()>) -> usize {
        let pos = r.claim().expect("room");
        // SAFETY: just claimed.
        unsafe { r.publish(pos, |v| *v = pos) };
        pos
    }

    fn take_all(r: &WqRing<usize, ()>) -> usize {
        let mut c = r.consumer().expect("one consumer");
        let mut n = 0;
        while c.take(|_, _| ()).is_some() {
            n += 1;
        }
        n
    }

    /// A post held up after it saw its slot free, while that position and
    /// later ones were posted, taken and retired, reads a count larger than
    /// the WRs accepted before its position. That is a stale position, not
    /// a full queue: the claim must look at the tail again. (Compared as an
    /// unsigned difference, the count wrapped round and a post found "the
    /// send queue full" with nothing outstanding: `verbs::concurrent_posts_
    /// all_leave_and_complete` failed so, once in 20,000 rounds of a stress
    /// loop on a loaded machine.)
    #[test]
    fn a_count_newer_than_the_position_is_stale_not_full() {
        let (r, retired) = ring(3);
        let old: Vec<usize> = (0..3).map(|_| post(&r)).collect();
        assert_eq!(take_all(&r), 3);
        retired.add(3);
        let stale = |pos: usize| r.outstanding(pos, retired.get()) > isize::MAX as usize;
        for &pos in &old {
            assert!(stale(pos), "position {pos} is stale");
        }
        let tail = r.tail.0.load(Ordering::Relaxed);
        assert_eq!(r.outstanding(tail, retired.get()), 0);

        // Three more posted and taken, none retired: full by the count.
        for _ in 0..3 {
            post(&r);
        }
        assert_eq!(take_all(&r), 3);
        let tail = r.tail.0.load(Ordering::Relaxed);
        assert_eq!(r.outstanding(tail, retired.get()), 3);
        assert!(r.claim().is_none(), "depth WRs in flight");
        retired.add(1);
        assert_eq!(r.outstanding(tail, retired.get()), 2);
        post(&r);
        assert!(r.claim().is_none(), "full again");
    }

    /// The interleaving itself: a post held up after it saw its slot free,
    /// while another thread posts through that position and a consumer
    /// takes and retires each WR at once (never more than one in flight, in
    /// a ring of 8: the queue is never full). The held-up claim must
    /// succeed. With the count compared unsigned it was refused every time.
    #[test]
    fn a_post_held_up_while_others_go_through_is_not_refused() {
        let retired = Arc::new(RetiredCount::default());
        let r = Arc::new(WqRing::new(8, retired.clone(), || 0usize, ()));
        let stop = Arc::new(AtomicBool::new(false));
        let posted = Arc::new(AtomicU64::new(0));
        let consumer = {
            let (r, retired, stop) = (r.clone(), retired.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    retired.add(take_all(&r));
                    std::hint::spin_loop();
                }
            })
        };
        let other = {
            let (r, retired, stop, posted) = (r.clone(), retired.clone(), stop.clone(), posted.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    // One in flight at a time: post, then wait for it to be retired.
                    let Some(pos) = r.claim() else { continue };
                    // SAFETY: just claimed.
                    unsafe { r.publish(pos, |v| *v = pos) };
                    posted.fetch_add(1, Ordering::Relaxed);
                    while retired.get() <= r.accepted_before(pos) && !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                }
            })
        };
        for _ in 0..20 {
            // Held up until the other thread has posted twice more, the
            // first of them (at least) at the position this claim saw free,
            // and the consumer has retired both.
            let (posted2, retired2) = (posted.clone(), retired.clone());
            let target = posted.load(Ordering::Relaxed) + 2;
            HOLD_UP.with(|h| {
                *h.borrow_mut() = Some(Box::new(move || {
                    while posted2.load(Ordering::Relaxed) < target || retired2.get() < target as usize {
                        std::hint::spin_loop();
                    }
                }))
            });
            let pos = r.claim().expect("a held-up post refused with at most two WRs in flight in a ring of 8");
            // SAFETY: just claimed.
            unsafe { r.publish(pos, |v| *v = 0) };
            posted.fetch_add(1, Ordering::Relaxed);
            while retired.get() <= r.accepted_before(pos) {
                std::hint::spin_loop();
            }
        }
        stop.store(true, Ordering::Relaxed);
        consumer.join().unwrap();
        other.join().unwrap();
    }
}
