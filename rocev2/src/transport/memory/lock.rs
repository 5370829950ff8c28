//! The memory table's lock: a reader-writer lock whose readers on one
//! thread can stay in for a whole batch of work ([`MemoryBatch`]), so that
//! a datapath iteration moving the data of 64 frames enters it once instead
//! of once per copy.
//!
//! Why: `std`'s `RwLock` costs two atomic read-modify-writes per read guard
//! (a compare-and-swap in, a subtraction out), and a 64 B WRITE took two
//! guards, the requester's gather and the responder's placement: four locked
//! instructions per WRITE, about as much as the rest of a WRITE's atomics.
//!
//! The protocol: one word, `state`, counts the readers inside and carries a
//! `WRITER` bit. A reader adds one; if the word it replaced had `WRITER`, it
//! takes its one back and waits for the writer (on the writers' mutex, which
//! the writer holds until it has cleared the bit). A writer takes the
//! writers' mutex, sets `WRITER`, and waits until the count is zero. All of
//! it is read-modify-writes of one word, so they are totally ordered: a
//! reader whose addition came before the writer's bit is counted and waited
//! for; one after it sees the bit and backs off before touching the table.
//! A reader's leaving (Release) is what the writer's wait reads (Acquire),
//! and the writer's clearing of the bit (Release) heads the release sequence
//! every later reader's addition (Acquire) reads from.
//!
//! Batches: [`MemoryTable::batch`] marks the table in a thread-local as this
//! thread's batch table. The first reader of the batch enters as any reader
//! does and stays counted until the batch ends; the readers after it find
//! the mark and enter nothing (a thread-local read). A writer on the same
//! thread (the requester's LOCAL_INV or BIND_MW, a SEND with Invalidate at
//! the responder, inside the iteration that holds the batch) first lets go
//! of its batch's entry, so it never waits for itself, nor for another
//! thread's batch that waits for it (two batch holders each wanting to write
//! would otherwise wait for each other); the next reader of the batch enters
//! again. A nested read never blocks behind a waiting writer (which a nested
//! read of `std`'s `RwLock` may): it is already counted.
//!
//! Tables are told apart by an id drawn once per table from a process-wide
//! counter, not by address: a batch forgotten with `mem::forget` leaves its
//! id in the thread-local and its entry counted (writers of that table then
//! wait forever, as they would behind a forgotten `std` guard), never a mark
//! that a later table at the same address could take for its own.

use std::cell::{Cell, UnsafeCell};
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// The writer's bit in `state`; the bits below count readers.
const WRITER: usize = 1 << (usize::BITS - 1);

/// Ids of tables; 0 means "no batch" in the thread-local.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// This thread's open batch, in one word: the table's id shifted left by
/// one (0: none), with `HELD` set once the batch has entered (its first
/// reader came). One word, so the readers' test is one compare.
const HELD: u64 = 1;

thread_local! {
    static BATCH: Cell<u64> = const { Cell::new(0) };
}

/// A reader-writer lock over `T` with batched readers (module documentation).
pub(super) struct TableLock<T> {
    state: AtomicUsize,
    /// Serialises writers; a reader that met a writer waits on it.
    writers: Mutex<()>,
    /// The table's id, shifted left by one (the thread-local's form).
    id: u64,
    data: UnsafeCell<T>,
}

// SAFETY: the lock hands out `&T` only to counted readers and `&mut T` only
// to the one writer that saw the count at zero with its bit set (module
// documentation), as `std::sync::RwLock` does: `Sync` needs `T: Send + Sync`.
unsafe impl<T: Send + Sync> Sync for TableLock<T> {}

impl<T: std::fmt::Debug> std::fmt::Debug for TableLock<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("TableLock");
        d.field("id", &self.id).field("readers", &(self.state.load(Ordering::Relaxed) & !WRITER));
        d.finish_non_exhaustive()
    }
}

impl<T> TableLock<T> {
    pub(super) fn new(data: T) -> TableLock<T> {
        TableLock {
            state: AtomicUsize::new(0),
            writers: Mutex::new(()),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed) << 1,
            data: UnsafeCell::new(data),
        }
    }

    fn writers(&self) -> MutexGuard<'_, ()> {
        // The mutex guards nothing but its own holding: poisoning means nothing.
        self.writers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Enter as a reader: counted, and no writer inside or waiting to be.
    fn enter(&self) {
        loop {
            if self.state.fetch_add(1, Ordering::Acquire) & WRITER == 0 {
                return;
            }
            self.state.fetch_sub(1, Ordering::Release);
            // The writer holds the mutex until it has cleared its bit.
            drop(self.writers());
        }
    }

    fn leave(&self) {
        self.state.fetch_sub(1, Ordering::Release);
    }

    /// Read access: free inside this thread's batch on this table once the
    /// batch has entered, else one entry and one leave.
    #[inline]
    pub(super) fn read(&self) -> ReadGuard<'_, T> {
        if BATCH.get() == self.id | HELD {
            return ReadGuard { lock: self, leave: false, _not_send: PhantomData };
        }
        self.read_entering()
    }

    /// [`read`](Self::read) that enters: outside a batch (left when the
    /// guard drops), or as the batch's first reader (left when it ends).
    #[inline(never)]
    fn read_entering(&self) -> ReadGuard<'_, T> {
        self.enter();
        if BATCH.get() == self.id {
            BATCH.set(self.id | HELD);
            return ReadGuard { lock: self, leave: false, _not_send: PhantomData };
        }
        ReadGuard { lock: self, leave: true, _not_send: PhantomData }
    }

    /// Exclusive access, once every reader has left (this thread's batch
    /// entry let go first).
    pub(super) fn write(&self) -> WriteGuard<'_, T> {
        if BATCH.get() == self.id | HELD {
            self.leave();
            BATCH.set(self.id);
        }
        let writers = self.writers();
        self.state.fetch_or(WRITER, Ordering::Acquire);
        let mut spins = 0u32;
        while self.state.load(Ordering::Acquire) & !WRITER != 0 {
            // Readers copy a frame's worth of bytes, or hold a batch for one
            // poll iteration: spin a little, then let them run.
            if spins < 64 {
                std::hint::spin_loop();
                spins += 1;
            } else {
                std::thread::yield_now();
            }
        }
        WriteGuard { lock: self, _writers: writers }
    }

    /// Start a batch of reads on this thread (see [`MemoryBatch`]).
    pub(super) fn batch(&self) -> Batch<'_, T> {
        let owner = BATCH.get() == 0;
        if owner {
            BATCH.set(self.id);
        }
        Batch { lock: self, owner, _not_send: PhantomData }
    }
}

/// Shared access to the table (a mover's, for one check-then-copy).
pub(super) struct ReadGuard<'a, T> {
    lock: &'a TableLock<T>,
    /// Whether dropping it leaves (false inside a batch: the batch does).
    leave: bool,
    _not_send: PhantomData<*const ()>,
}

impl<T> Deref for ReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this thread is counted as a reader (by this guard, or by
        // its batch, which outlives every guard made inside it: guards live
        // within one mover call and batches are opened around those calls),
        // so no writer is inside until it leaves.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T> Drop for ReadGuard<'_, T> {
    fn drop(&mut self) {
        if self.leave {
            self.lock.leave();
        }
    }
}

/// Exclusive access to the table.
pub(super) struct WriteGuard<'a, T> {
    lock: &'a TableLock<T>,
    _writers: MutexGuard<'a, ()>,
}

impl<T> Deref for WriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the writer's bit is set and no reader is counted (see `write`).
        unsafe { &*self.lock.data.get() }
    }
}

impl<T> DerefMut for WriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and this guard is the only writer (the mutex).
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<T> Drop for WriteGuard<'_, T> {
    fn drop(&mut self) {
        // Before the mutex is released (a field, dropped after this).
        self.lock.state.fetch_and(!WRITER, Ordering::Release);
    }
}

/// An open batch of reads on one thread (module documentation).
pub(super) struct Batch<'a, T> {
    lock: &'a TableLock<T>,
    /// Whether this batch set the thread's mark (a batch opened while
    /// another is open, on this table or another, is inert).
    owner: bool,
    _not_send: PhantomData<*const ()>,
}

impl<T> Drop for Batch<'_, T> {
    fn drop(&mut self) {
        if !self.owner {
            return;
        }
        let open = BATCH.get();
        if open & !HELD == self.lock.id {
            if open & HELD != 0 {
                self.lock.leave();
            }
            BATCH.set(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    fn readers(l: &TableLock<u64>) -> usize {
        l.state.load(Ordering::SeqCst) & !WRITER
    }

    /// A batch enters at its first read, stays counted through the reads
    /// after it and leaves at its end; reads outside a batch leave at once.
    #[test]
    fn a_batch_enters_once_and_leaves_at_its_end() {
        let l = TableLock::new(7u64);
        assert_eq!(*l.read(), 7);
        assert_eq!(readers(&l), 0, "a read outside a batch leaves");
        let b = l.batch();
        assert_eq!(readers(&l), 0, "entered lazily, at the first read");
        for _ in 0..3 {
            assert_eq!(*l.read(), 7);
            assert_eq!(readers(&l), 1, "one entry for the batch");
        }
        drop(b);
        assert_eq!(readers(&l), 0);
        assert_eq!(BATCH.get(), 0);
    }

    /// A write inside the batch's thread lets go of the batch's entry (it
    /// would otherwise wait for itself) and the next read enters again.
    #[test]
    fn a_write_inside_a_batch_does_not_wait_for_it() {
        let l = TableLock::new(1u64);
        let _b = l.batch();
        assert_eq!(*l.read(), 1);
        *l.write() = 2;
        assert_eq!(readers(&l), 0);
        assert_eq!(*l.read(), 2);
        assert_eq!(readers(&l), 1);
    }

    /// A second batch opened on the thread (same table or another) is
    /// inert: the other table's reads lock as outside a batch, and ending
    /// the batches in either order leaves nothing counted.
    #[test]
    fn nested_batches_are_inert() {
        let (a, c) = (TableLock::new(1u64), TableLock::new(2u64));
        let outer = a.batch();
        let inner_same = a.batch();
        let inner_other = c.batch();
        assert_eq!((*a.read(), *c.read()), (1, 2));
        assert_eq!((readers(&a), readers(&c)), (1, 0));
        drop(outer);
        assert_eq!(readers(&a), 0);
        assert_eq!(*a.read(), 1);
        assert_eq!(readers(&a), 0, "outside any batch now");
        drop(inner_same);
        drop(inner_other);
        assert_eq!((readers(&a), readers(&c), BATCH.get()), (0, 0, 0));
    }

    /// A writer waits for a batch another thread holds, and the batch's
    /// reads after the writer came see either the old or the new value,
    /// never a torn one; the writer gets in once the batch ends.
    #[test]
    fn a_writer_waits_for_another_threads_batch() {
        let l = Arc::new(TableLock::new([0u64; 8]));
        let b = l.batch();
        assert_eq!(l.read()[0], 0);
        let wrote = Arc::new(AtomicBool::new(false));
        let writer = {
            let (l, wrote) = (l.clone(), wrote.clone());
            std::thread::spawn(move || {
                *l.write() = [1; 8];
                wrote.store(true, Ordering::SeqCst);
            })
        };
        // The writer cannot get in while the batch is held: wait until it
        // is waiting (its bit set), then read on within the batch.
        while l.state.load(Ordering::SeqCst) & WRITER == 0 && !wrote.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        assert!(!wrote.load(Ordering::SeqCst), "the writer got in while the batch held the table");
        assert_eq!(*l.read(), [0; 8], "the batch still reads the old table");
        drop(b);
        writer.join().unwrap();
        assert_eq!(*l.read(), [1; 8]);
    }

    /// Two threads each holding a batch, each writing inside it: neither
    /// waits for the other's batch while it writes (each lets its own go),
    /// so both finish.
    #[test]
    fn two_batch_holders_writing_do_not_deadlock() {
        let l = Arc::new(TableLock::new(0u64));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for _ in 0..2000 {
                        let _b = l.batch();
                        let _ = *l.read();
                        *l.write() += 1;
                        let _ = *l.read();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*l.read(), 4000);
        assert_eq!(readers(&l), 0);
    }

    /// Readers in batches and outside them against a writer that changes
    /// the whole value: every read sees one writer's value whole (the
    /// writer writes it in two halves with a yield between), and every
    /// reader reads while the writer writes.
    #[test]
    fn readers_never_see_a_write_in_progress() {
        const READERS: usize = 3;
        let l = Arc::new(TableLock::new((0u64, 0u64)));
        let stop = Arc::new(AtomicBool::new(false));
        let started = Arc::new(AtomicUsize::new(0));
        let readers: Vec<_> = (0..READERS)
            .map(|r| {
                let (l, stop, started) = (l.clone(), stop.clone(), started.clone());
                std::thread::spawn(move || {
                    let mut reads = 0u64;
                    started.fetch_add(1, Ordering::SeqCst);
                    while !stop.load(Ordering::Relaxed) {
                        let _b = (r != 0).then(|| l.batch());
                        for _ in 0..16 {
                            let (a, b) = *l.read();
                            assert_eq!(a, b, "torn read");
                            reads += 1;
                        }
                    }
                    reads
                })
            })
            .collect();
        while started.load(Ordering::SeqCst) < READERS {
            std::thread::yield_now();
        }
        for i in 1..=500u64 {
            let mut w = l.write();
            w.0 = i;
            std::thread::yield_now();
            w.1 = i;
        }
        stop.store(true, Ordering::Relaxed);
        for t in readers {
            assert!(t.join().unwrap() > 0);
        }
        assert_eq!(*l.read(), (500, 500));
    }
}
