//! What `urnic bench` reads about itself and its samples: this process's
//! resident memory (/proc/self/statm), CPU time (getrusage) of the process
//! and of its finished children, a thread's exact user CPU time
//! ([`UserClock`]), and quantiles of latency samples.

/// Median (sorts `v`); NaN if empty.
pub(super) fn median(v: &mut [f64]) -> f64 {
    pct(v, 0.5)
}

/// The lowest and the highest of `v` (infinities if empty).
pub(super) fn spread(v: &[f64]) -> (f64, f64) {
    (v.iter().copied().fold(f64::INFINITY, f64::min), v.iter().copied().fold(f64::NEG_INFINITY, f64::max))
}

/// The `p` quantile (nearest rank; sorts `v`); NaN if empty.
pub(super) fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len().max(1)) - 1;
    v.get(i).copied().unwrap_or(f64::NAN)
}

/// Resident memory of this process, bytes.
pub(super) fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()))
        .map_or(0, |pages| pages * 4096)
}

/// (user, system) CPU seconds of `who` (getrusage).
fn rusage(who: i32) -> (f64, f64) {
    // SAFETY: getrusage fills the struct we pass.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(who, &mut ru);
        ru
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (secs(ru.ru_utime), secs(ru.ru_stime))
}

fn cpu(who: i32) -> f64 {
    let (user, sys) = rusage(who);
    user + sys
}

/// A markdown table of per-run ratios: a row per `(what, per-run ratios,
/// target)` with the median and the range over the runs (`runs` of them).
pub(super) fn ratio_table<'a>(runs: usize, rows: impl IntoIterator<Item = (&'a str, Vec<f64>, &'a str)>) -> String {
    let mut t = vec![format!("| ratio (per run, {runs} runs) | median | range | target |"), "|---|---|---|---|".to_string()];
    for (what, mut v, target) in rows {
        let (lo, hi) = spread(&v);
        t.push(format!("| {what} | {:.2} | {lo:.2}–{hi:.2} | {target} |", median(&mut v)));
    }
    t.join("\n")
}

/// This thread's run time so far (user + system, exact: the scheduler's
/// `CLOCK_THREAD_CPUTIME_ID`), s.
fn thread_cpu() -> f64 {
    // SAFETY: clock_gettime fills the timespec we pass.
    let ts = unsafe {
        let mut ts: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts);
        ts
    };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// Context switches of the calling thread so far, voluntary and not
/// (getrusage, `RUSAGE_THREAD`).
fn thread_switches() -> i64 {
    // SAFETY: getrusage fills the struct we pass.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut ru);
        ru
    };
    ru.ru_nvcsw + ru.ru_nivcsw
}

/// What [`UserClock`] reads at each lap's end.
#[derive(Clone, Copy)]
struct Reading {
    /// The wall clock.
    wall: std::time::Instant,
    /// The thread's run time, s.
    run: f64,
    /// Its time inside timed system calls, ns.
    kernel: u64,
    /// Its context switches.
    switches: i64,
}

impl Reading {
    fn now() -> Reading {
        Reading {
            wall: std::time::Instant::now(),
            run: thread_cpu(),
            kernel: urnic_datapath::kernel_time::this_thread_ns(),
            switches: thread_switches(),
        }
    }
}

/// One lap as [`UserClock`] judges it: seconds of wall clock, of the
/// thread's run time and of its time inside timed system calls, and its
/// context switches.
#[derive(Clone, Copy, Debug)]
struct Lap {
    wall: f64,
    run: f64,
    kernel: f64,
    switches: i64,
}

/// Why a lap is left out of [`UserClock`]'s count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LeftOut {
    /// The thread was switched out: a wait inside a system call would be
    /// taken off a run time that never had it.
    Switched,
    /// The wall clock ran ahead of the thread's run time with no switch:
    /// the hypervisor ran something else on this vCPU (steal time, which
    /// the kernel keeps out of a thread's run time). Inside a system call
    /// that time would be taken off the user time too.
    Stolen,
}

/// Wall-clock time a lap may have beyond its run time and still count:
/// 50 µs and 0.1% of the lap (clock reads and their rounding take a few
/// µs; a 40 ms lap of urnic's CPU row measured 1-4 µs when nothing else ran).
fn steal_bound(wall: f64) -> f64 {
    50e-6 + wall * 1e-3
}

impl Lap {
    /// The lap's user time if it counts (never negative), or why not.
    fn user(&self) -> Result<f64, LeftOut> {
        if self.switches != 0 {
            return Err(LeftOut::Switched);
        }
        if self.wall - self.run > steal_bound(self.wall) {
            return Err(LeftOut::Stolen);
        }
        Ok((self.run - self.kernel).max(0.0))
    }
}

/// The calling thread's user CPU time per unit of work, exactly, over laps
/// of work: a lap's user time is the thread's run time less the time it
/// spent inside the AF_XDP sockets' system calls (`urnic_datapath::
/// kernel_time`, timed while this lives). For a thread that does all of a
/// measurement's work and enters the kernel only through its sockets (one
/// core: urnic's devices in run-to-completion mode, the raw ceiling's one
/// thread). A system call is timed by the wall clock, so a lap in which the
/// thread was switched out (preempted inside a call, that wait would be
/// taken off a run time that never had it) is left out, as is the other
/// process's mark on the caches; so is a lap whose wall clock ran ahead of
/// its run time with no switch (the vCPU's steal time, [`LeftOut::Stolen`]).
/// `getrusage`'s user time is a sample on this kernel (one per 4 ms tick),
/// not a measurement.
pub(super) struct UserClock {
    _timing: urnic_datapath::kernel_time::Timing,
    last: Reading,
    /// The counted laps' user CPU seconds, run seconds and units of work.
    user: f64,
    run: f64,
    units: f64,
    /// Laps counted, left out as switched, left out as stolen.
    laps: [usize; 3],
}

impl UserClock {
    /// Start the first lap on the calling thread.
    pub(super) fn start() -> UserClock {
        let timing = urnic_datapath::kernel_time::Timing::start();
        UserClock { _timing: timing, last: Reading::now(), user: 0.0, run: 0.0, units: 0.0, laps: [0; 3] }
    }

    /// End the lap in which the calling thread (the one that started the
    /// clock) did `units` of work, and start the next.
    pub(super) fn lap(&mut self, units: f64) {
        let now = Reading::now();
        let lap = Lap {
            wall: now.wall.duration_since(self.last.wall).as_secs_f64(),
            run: now.run - self.last.run,
            kernel: now.kernel.saturating_sub(self.last.kernel) as f64 / 1e9,
            switches: now.switches - self.last.switches,
        };
        match lap.user() {
            Ok(user) => {
                self.user += user;
                self.run += lap.run;
                self.units += units;
                self.laps[0] += 1;
            }
            Err(LeftOut::Switched) => self.laps[1] += 1,
            Err(LeftOut::Stolen) => self.laps[2] += 1,
        }
        self.last = Reading::now();
    }

    /// Run seconds of the counted laps.
    pub(super) fn counted_run(&self) -> f64 {
        self.run
    }

    /// User CPU seconds per unit of work over the counted laps; an error
    /// saying so if the thread was switched out in every lap.
    pub(super) fn per_unit(&self) -> anyhow::Result<f64> {
        anyhow::ensure!(
            self.units > 0.0,
            "user CPU: no lap counted: the measuring thread was switched out in {} laps and lost time to the \
             hypervisor (steal) in {} (the host is too busy for this row)",
            self.laps[1],
            self.laps[2]
        );
        Ok(self.user / self.units)
    }
}

/// CPU time (user + system) of this process so far (all its threads), s.
pub(super) fn cpu_self() -> f64 {
    cpu(libc::RUSAGE_SELF)
}

/// CPU time of finished children (iperf3), seconds.
pub(super) fn cpu_children() -> f64 {
    cpu(libc::RUSAGE_CHILDREN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ratio_table_gives_each_rows_median_and_range() {
        let t = ratio_table(3, [("a", vec![0.9, 0.8, 1.0], "≥ 0.85"), ("b", vec![1.3, 1.2, 1.25], "≤ 1.25")]);
        let want = "| ratio (per run, 3 runs) | median | range | target |\n|---|---|---|---|\n\
                    | a | 0.90 | 0.80–1.00 | ≥ 0.85 |\n| b | 1.25 | 1.20–1.30 | ≤ 1.25 |";
        assert_eq!(t, want);
    }

    #[test]
    fn a_lap_counts_only_when_the_thread_ran_it_alone() {
        let lap = |wall: f64, run: f64, kernel: f64, switches: i64| Lap { wall, run, kernel, switches }.user();
        // Run time less the time inside system calls.
        let u = lap(0.040, 0.039_998, 0.030, 0).unwrap();
        assert!((u - 0.009_998).abs() < 1e-12, "{u}");
        // A wall-clock call longer than the run time (rounding) gives 0, not less.
        assert_eq!(lap(0.010, 0.009_99, 0.010, 0), Ok(0.0));
        assert_eq!(lap(0.040, 0.039_9, 0.03, 1), Err(LeftOut::Switched));
        // 40 ms of wall clock, 39.8 of run time, no switch: 200 µs stolen, over the bound (90 µs).
        assert_eq!(lap(0.040, 0.039_8, 0.03, 0), Err(LeftOut::Stolen));
        assert!(lap(0.040, 0.039_92, 0.03, 0).is_ok(), "80 µs is within the bound");
        // A switched lap is a switch, whatever the clocks say.
        assert_eq!(lap(0.040, 0.02, 0.01, 3), Err(LeftOut::Switched));
    }

    #[test]
    fn quantiles() {
        let mut v = vec![5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!(median(&mut v), 3.0);
        assert_eq!(pct(&mut v, 0.99), 5.0);
        assert_eq!(pct(&mut v, 0.2), 1.0);
        assert!(median(&mut []).is_nan());
    }
}
