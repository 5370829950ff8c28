//! The time a thread spends inside the AF_XDP sockets' system calls (the
//! TX kick and the fill ring's wakeup), for measurements that need a
//! thread's user CPU time exactly.
//!
//! A kernel with tick-based CPU accounting (`CONFIG_TICK_CPU_ACCOUNTING`,
//! no `VIRT_CPU_ACCOUNTING_GEN`) splits a thread's exactly measured run time
//! into user and system by sampling it at each tick (4 ms at HZ 250), so
//! `getrusage`'s user time is a sample, good to a few percent only over
//! seconds. A thread that polls its sockets enters the kernel only through
//! these calls (the veth transmit, the peer's XDP program and the copy into
//! its UMEM run inside the TX kick), so its run time
//! (`CLOCK_THREAD_CPUTIME_ID`, exact) less the time measured around them
//! is its user time, exactly up to interrupts that land in user code.
//!
//! Off unless a [`Timing`] is alive: then each such call costs two clock
//! reads; otherwise one relaxed load.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// Live [`Timing`] guards.
static ON: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Nanoseconds this thread spent in timed calls.
    static IN_KERNEL_NS: Cell<u64> = const { Cell::new(0) };
}

/// While alive, every thread's AF_XDP system calls are timed.
#[must_use = "timing stops when the guard is dropped"]
pub struct Timing(());

impl Timing {
    /// Start timing (guards nest).
    pub fn start() -> Timing {
        ON.fetch_add(1, Ordering::Relaxed);
        Timing(())
    }
}

impl Drop for Timing {
    fn drop(&mut self) {
        ON.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Nanoseconds the calling thread has spent in timed system calls so far.
pub fn this_thread_ns() -> u64 {
    IN_KERNEL_NS.with(Cell::get)
}

/// Run the system call `f`, adding its time to the calling thread's
/// total when timing is on.
#[inline]
pub(crate) fn syscall<R>(f: impl FnOnce() -> R) -> R {
    if ON.load(Ordering::Relaxed) == 0 {
        return f();
    }
    let t = Instant::now();
    let r = f();
    let ns = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
    IN_KERNEL_NS.with(|c| c.set(c.get().saturating_add(ns)));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_timed_only_while_a_guard_lives() {
        let before = this_thread_ns();
        syscall(|| std::thread::sleep(std::time::Duration::from_millis(2)));
        assert_eq!(this_thread_ns(), before, "timed with no guard");
        let g = Timing::start();
        syscall(|| std::thread::sleep(std::time::Duration::from_millis(2)));
        drop(g);
        assert!(this_thread_ns() - before >= 2_000_000, "{}", this_thread_ns() - before);
        // Another thread's calls are its own.
        let other = std::thread::spawn(this_thread_ns).join().unwrap();
        assert_eq!(other, 0);
    }
}
