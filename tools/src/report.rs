//! perftest-style result tables.

/// The dashed rule perftest prints.
pub const RULE: &str = "---------------------------------------------------------------------------------------";

/// Header of a bandwidth table.
pub fn bw_header() -> String {
    " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]".to_string()
}

/// One bandwidth row: `bytes` per message, `iters` messages, peak and average
/// bandwidth in the caller's megabytes (`urnic demo`: 10^6 bytes; `urnic
/// perf`: perftest's 2^20), message rate in millions per second.
pub fn bw_row(bytes: usize, iters: usize, peak: f64, avg: f64, mpps: f64) -> String {
    format!(" {:<10} {:<10}       {:<10.2}         {:<10.2}\t   {:.6}", bytes, iters, peak, avg, mpps)
}

/// Header of a latency table.
pub fn lat_header() -> String {
    " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ".to_string()
}

/// Latency statistics over samples in microseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatStats {
    /// Minimum.
    pub min: f64,
    /// Maximum.
    pub max: f64,
    /// Median (perftest's "typical").
    pub typical: f64,
    /// Mean.
    pub avg: f64,
    /// Standard deviation.
    pub stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
}

impl LatStats {
    /// Statistics of `samples` (sorted in place). `None` if empty.
    pub fn from_samples(samples: &mut [f64]) -> Option<LatStats> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_by(|a, b| a.total_cmp(b));
        let n = samples.len();
        let pct = |p: f64| samples[(((n as f64) * p).ceil() as usize).clamp(1, n) - 1];
        let avg = samples.iter().sum::<f64>() / n as f64;
        let var = samples.iter().map(|s| (s - avg) * (s - avg)).sum::<f64>() / n as f64;
        Some(LatStats { min: samples[0], max: samples[n - 1], typical: pct(0.5), avg, stdev: var.sqrt(), p99: pct(0.99), p999: pct(0.999) })
    }
}

/// One latency row.
pub fn lat_row(bytes: usize, iters: usize, s: &LatStats) -> String {
    format!(
        " {:<7} {:<10} {:<14.2} {:<12.2} {:<8.2}   \t       {:<8.2}    \t{:<6.2} \t\t{:<8.2} \t\t{:<8.2}",
        bytes, iters, s.min, s.max, s.typical, s.avg, s.stdev, s.p99, s.p999
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_known_samples() {
        let mut v: Vec<f64> = (1..=1000).rev().map(f64::from).collect();
        let s = LatStats::from_samples(&mut v).unwrap();
        assert_eq!((s.min, s.max, s.typical, s.p99, s.p999), (1.0, 1000.0, 500.0, 990.0, 999.0));
        assert!((s.avg - 500.5).abs() < 1e-9);
        assert!(LatStats::from_samples(&mut []).is_none());
    }

    #[test]
    fn rows_have_perftest_columns() {
        assert!(bw_row(65536, 2000, 1.0, 2.0, 0.5).trim_start().starts_with("65536"));
        let s = LatStats { min: 1.0, max: 2.0, typical: 1.5, avg: 1.5, stdev: 0.1, p99: 2.0, p999: 2.0 };
        assert_eq!(lat_row(8, 10, &s).split_whitespace().count(), 9);
    }
}
