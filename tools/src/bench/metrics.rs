//! What `urnic bench` reads about itself and its samples: this process's
//! resident memory (/proc/self/statm), CPU time (getrusage) of the process
//! and of its finished children, and quantiles of latency samples.

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

/// User CPU time of this process so far (all its threads), s: urnic's own
/// work, without the kernel's AF_XDP and veth work done on its behalf.
pub(super) fn user_self() -> f64 {
    rusage(libc::RUSAGE_SELF).0
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
