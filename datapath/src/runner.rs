//! Datapath threads: a polling loop per NIC, optionally pinned to a core,
//! with a configurable idle policy.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::nic::{Nic, DRIVE_QUIET, DRIVE_WINDOW};

/// What the poller does when a poll found no work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdlePolicy {
    /// Spin: lowest latency, one core at 100%.
    BusyPoll,
    /// Spin for `spins` idle polls, then yield the CPU between polls, then
    /// sleep `sleep` between polls (for shared machines).
    Backoff {
        /// Idle polls before yielding.
        spins: u32,
        /// Idle polls (after spinning) before sleeping.
        yields: u32,
        /// Sleep between polls once idle for long.
        sleep: Duration,
    },
}

impl Default for IdlePolicy {
    fn default() -> Self {
        IdlePolicy::Backoff { spins: 2_000, yields: 2_000, sleep: Duration::from_micros(50) }
    }
}

/// How long a datapath thread sleeps at a time while an application
/// thread drives the datapath (it looks again after each), at first.
const DRIVEN_PARK: Duration = Duration::from_micros(100);

/// The longest it sleeps at a time: each look that finds the application
/// driving busily (in a drive, or it drove within `DRIVE_QUIET`) doubles
/// the sleep up to this; a look that finds it quiet, work served or a
/// takeover starts again at `DRIVEN_PARK`. A wake-up costs 10-14 us of a
/// core on the 2-core VM (`finish_task_switch`): with looks every 25-100 us
/// that was 11% of a core, taken from the program or its peer, all through
/// `ib_write_bw -s 65536` on a quiet host.
const DRIVEN_PARK_MAX: Duration = Duration::from_millis(1);

/// How long it sleeps at a time while it watches for work the application
/// leaves waiting (`Nic::serve`): once the application has left the
/// datapath alone for `DRIVE_QUIET`, and through a `WATCH_SPELL` after it
/// last found such work. (A park overruns by about 15 us on the 2-core
/// VM, so it looks about every 25 us.)
const WATCH_PARK: Duration = Duration::from_micros(10);

/// How long a datapath thread keeps watching closely after it last found
/// work the application left waiting: a program that leaves the datapath
/// alone between its CQ polls (ib_write_lat spins on memory for the peer's
/// WRITE) does it every iteration, one that drives it all the time never
/// does, and pays no extra wakeups.
const WATCH_SPELL: Duration = Duration::from_millis(2);

/// Within a `WATCH_SPELL`, how long the application must have left the
/// datapath alone before the thread serves what waits (instead of
/// `DRIVE_QUIET`): a program spinning on memory is found within a look.
const WATCH_QUIET: Duration = Duration::from_micros(3);

/// A running datapath thread. Stops (and joins) on drop.
pub struct Runner {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Pin the calling thread to `core`. Errors are reported, not fatal.
pub fn pin_current_thread(core: usize) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET write inside it;
    // sched_setaffinity reads `size_of::<cpu_set_t>()` bytes from it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(core, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

impl Runner {
    /// Start polling every shard of `nic` on one new thread, pinned to
    /// `core` if given.
    pub fn spawn(nic: Arc<Nic>, core: Option<usize>, idle: IdlePolicy) -> std::io::Result<Runner> {
        Runner::spawn_with(nic, None, core, idle)
    }

    /// Start polling shard `shard` of `nic` on a new thread, pinned to
    /// `core` if given: one per shard makes one polling core per shard.
    pub fn spawn_shard(nic: Arc<Nic>, shard: usize, core: Option<usize>, idle: IdlePolicy) -> std::io::Result<Runner> {
        Runner::spawn_with(nic, Some(shard), core, idle)
    }

    fn spawn_with(nic: Arc<Nic>, shard: Option<usize>, core: Option<usize>, idle: IdlePolicy) -> std::io::Result<Runner> {
        let owner = nic.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let name = match shard {
            Some(i) => format!("urnic-dp{i}"),
            None => "urnic-datapath".into(),
        };
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            if let Some(c) = core {
                // Not fatal: the loop works unpinned, only slower.
                let _ = pin_current_thread(c);
            }
            // Short sleeps (standing back, idle backoff) wake on time, not
            // up to the default 50 us of timer slack later.
            // SAFETY: PR_SET_TIMERSLACK takes an integer, no pointers.
            let _ = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong) };
            let mut idle_polls: u32 = 0;
            let shards = match shard {
                Some(i) => i..i + 1,
                None => 0..nic.shard_count(),
            };
            // Until when (`Nic::now`) it watches closely (a `WATCH_SPELL`).
            let mut watch_until: Option<rocev2::Instant> = None;
            // The next sleep while the application drives busily.
            let mut driven_park = DRIVEN_PARK;
            while !flag.load(Ordering::Relaxed) {
                // An application thread is driving the datapath itself
                // (`Nic::drive`): stand back, off the cores it needs, until
                // it stops (`Nic::stop_driving` unparks us) or has not
                // driven for `DRIVE_WINDOW`. Meanwhile, once it has left
                // the datapath alone for a while (a program spinning on
                // memory between its CQ polls), serve what waits, as an
                // HCA would; having found such work, watch closely for a
                // spell. Looking costs no syscall (`Nic::work_pending`).
                // One clock read per look, and only if the look needs it:
                // how long ago it drove, the watch and the timers share it.
                let mut read = None;
                let mut now = || *read.get_or_insert_with(|| nic.now());
                let driven = nic.since_driven_with(&mut now);
                if let Some(since) = driven.filter(|d| *d < DRIVE_WINDOW) {
                    // An ended spell is forgotten: no read to look at it again.
                    watch_until = watch_until.filter(|&t| t > now());
                    let watching = watch_until.is_some();
                    let quiet = if watching { WATCH_QUIET } else { DRIVE_QUIET };
                    if since >= quiet && nic.serve_with(shards.clone(), &mut now) > 0 {
                        watch_until = Some(nic.now() + WATCH_SPELL);
                        driven_park = DRIVEN_PARK;
                        continue;
                    }
                    let park = if watching || since >= DRIVE_QUIET {
                        driven_park = DRIVEN_PARK;
                        WATCH_PARK
                    } else {
                        let p = driven_park;
                        driven_park = (driven_park * 2).min(DRIVEN_PARK_MAX);
                        p
                    };
                    std::thread::park_timeout(park);
                    continue;
                }
                driven_park = DRIVEN_PARK;
                let work = if driven.is_some() {
                    // It has not driven for `DRIVE_WINDOW` (preempted, or
                    // it stopped polling without arming a CQ): take over,
                    // but never wait for an iteration it is still in.
                    match nic.take_over(shards.clone()) {
                        Some(work) => work,
                        None => {
                            std::thread::park_timeout(WATCH_PARK);
                            continue;
                        }
                    }
                } else {
                    match shard {
                        Some(i) => nic.poll_shard(i),
                        None => nic.poll(),
                    }
                };
                if work > 0 {
                    idle_polls = 0;
                    continue;
                }
                idle_polls = idle_polls.saturating_add(1);
                match idle {
                    IdlePolicy::BusyPoll => std::hint::spin_loop(),
                    IdlePolicy::Backoff { spins, yields, sleep } => {
                        if idle_polls <= spins {
                            std::hint::spin_loop();
                        } else if idle_polls <= spins.saturating_add(yields) {
                            std::thread::yield_now();
                        } else {
                            std::thread::sleep(sleep);
                        }
                    }
                }
            }
        })?;
        owner.add_runner(thread.thread().clone());
        Ok(Runner { stop, thread: Some(thread) })
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}
