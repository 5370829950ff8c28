//! Datapath threads: a polling loop per NIC, optionally pinned to a core,
//! with a configurable idle policy.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::nic::Nic;

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
/// thread drives the datapath (it looks again after each).
const DRIVEN_PARK: Duration = Duration::from_micros(100);

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
            while !flag.load(Ordering::Relaxed) {
                // An application thread is driving the datapath itself
                // (`Nic::drive`): stand back, off the cores it needs, until
                // it stops (`Nic::stop_driving` unparks us) or goes quiet.
                if nic.app_driving() {
                    std::thread::park_timeout(DRIVEN_PARK);
                    continue;
                }
                let work = match shard {
                    Some(i) => nic.poll_shard(i),
                    None => nic.poll(),
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
