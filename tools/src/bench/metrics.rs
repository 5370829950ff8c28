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

/// The calling thread's user CPU time from now on, exactly: its run time
/// less the time it spends inside the AF_XDP sockets' system calls
/// (`urnic_datapath::kernel_time`, timed while this lives). For a thread
/// that does all of a measurement's work and enters the kernel only
/// through its sockets (one core: urnic's devices in run-to-completion
/// mode, the raw ceiling's one thread). `getrusage`'s user time is a
/// sample on this kernel (one per 4 ms tick), not a measurement.
pub(super) struct UserClock {
    _timing: urnic_datapath::kernel_time::Timing,
    run0: f64,
    kernel0: u64,
}

impl UserClock {
    /// Start on the calling thread.
    pub(super) fn start() -> UserClock {
        let timing = urnic_datapath::kernel_time::Timing::start();
        UserClock { _timing: timing, run0: thread_cpu(), kernel0: urnic_datapath::kernel_time::this_thread_ns() }
    }

    /// User CPU seconds of the calling thread (the one that started it)
    /// since the start.
    pub(super) fn user(&self) -> f64 {
        let kernel = (urnic_datapath::kernel_time::this_thread_ns() - self.kernel0) as f64 / 1e9;
        (thread_cpu() - self.run0 - kernel).max(0.0)
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
    fn quantiles() {
        let mut v = vec![5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!(median(&mut v), 3.0);
        assert_eq!(pct(&mut v, 0.99), 5.0);
        assert_eq!(pct(&mut v, 0.2), 1.0);
        assert!(median(&mut []).is_nan());
    }
}
