//! 8-byte latency by host phase: urnic's SEND and WRITE ping-pongs
//! interleaved round by round with the raw AF_XDP ping-pong, in windows
//! labelled by a phase probe.
//!
//! The host's vCPU alternates between a fast and a slow state (every 5 ms to
//! over a second; in the slow one L1D/L2 capacity collapses: a pointer chase
//! over 128 KiB takes about twice as long). The mode flips inside a process,
//! and everything memory-bound swings with it, the raw ping-pong too, so
//! urnic and its floor are only comparable when measured at the same moment.
//! Each iteration here runs one raw round trip, one urnic SEND round trip
//! and one urnic WRITE round trip; [`ROUNDS_PER_WINDOW`] iterations (a few
//! ms) make a window, timed between two runs of the probe (a dependent-load
//! chase over 128 KiB, ns per load). The probes of all windows of all runs
//! are split into a fast and a slow cluster ([`split`]); a window whose two
//! probes fall on different sides is left out (the phase flipped inside
//! it). Per run and phase, the p50 and p99 of urnic's and raw's one-way
//! latencies and their ratios; over runs, the medians and ranges.
//!
//! urnic's SEND ping-pong, its WRITE ping-pong and the raw sockets run on
//! three veth pairs made alike in the same run (one AF_XDP owner per
//! interface: urnic's devices hold the interface lock; and each urnic
//! ping-pong carries only its own ACKs, as it would alone). With two cores,
//! each side of every ping-pong runs on a core of its own, as the two ends
//! of a perftest run (two processes) do: the application's thread pings
//! and runs urnic's A devices; a second thread runs the B devices, answers
//! urnic's SENDs and WRITEs as their application would (byte for byte, the
//! pinger checks them) and answers the raw pings, so both stacks see the
//! same second core. Each two-core urnic round ends, untimed, when the ping
//! itself has completed (the echo's ACK, which leaves behind the answer):
//! every round then starts with nothing in flight, as the raw ping-pong's
//! do, and as a ping-pong running alone finds its ACK handled while its next
//! ping's kick is in the kernel (`SendPingPong::round_echoed`).

use anyhow::{Context as _, Result};
use std::fmt::Write as _;
use urnic_datapath::netns::VethPair;

use super::metrics::{median, pct, spread};
use super::raw_xdp::{RawPingPong, SEND8_FRAME};
use super::urnic_runs::{rig, Poller, Rig};
use super::Cores;
use crate::perf::{SendPingPong, WritePingPong};
use std::sync::{Arc, Mutex};

/// Iterations (one round trip of each kind) per window: 2-4 ms here.
pub(super) const ROUNDS_PER_WINDOW: usize = 50;

/// Windows per configuration and run.
pub(super) const WINDOWS: usize = 400;

/// Untimed iterations before the first window.
const WARMUP_ROUNDS: usize = 200;

/// Bytes the phase probe chases through: L2-resident in the fast phase,
/// not in the slow one.
const PROBE_BYTES: usize = 128 * 1024;

/// Timed passes over [`PROBE_BYTES`] per probe (one load per 64-byte line,
/// 2048 loads, about 8-15 µs each).
const PROBE_PARTS: usize = 4;

/// The two clusters' centres must differ by at least this factor for the
/// windows to be split into two phases; below it every window is "fast"
/// (one phase seen).
const MIN_SEPARATION: f64 = 1.2;

/// One window: the probe before and after it (ns per load) and the
/// one-way µs of each kind of round trip in it.
#[derive(Clone, Debug, Default)]
pub(super) struct Window {
    pub(super) probe: [f64; 2],
    pub(super) send: Vec<f64>,
    pub(super) write: Vec<f64>,
    pub(super) raw: Vec<f64>,
    /// The raw ping-pong with an ACK-length frame before each ping and pong.
    pub(super) raw_ack: Vec<f64>,
}

/// The host phase of a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    Fast,
    Slow,
}

impl Phase {
    fn label(self) -> &'static str {
        match self {
            Phase::Fast => "fast phase",
            Phase::Slow => "slow phase",
        }
    }
}

/// A dependent-load chase over [`PROBE_BYTES`]: one load per 64-byte line,
/// in a random single cycle (Sattolo), so the prefetcher cannot help.
struct Probe {
    next: Vec<usize>,
}

impl Probe {
    fn new() -> Probe {
        const WORDS_PER_LINE: usize = 64 / std::mem::size_of::<usize>();
        let lines = PROBE_BYTES / 64;
        let mut order: Vec<usize> = (0..lines).collect();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for i in (1..lines).rev() {
            // xorshift64: any fixed sequence does.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let j = (x % i as u64) as usize;
            order.swap(i, j);
        }
        let mut next = vec![0usize; lines * WORDS_PER_LINE];
        for k in 0..lines {
            next[order[k] * WORDS_PER_LINE] = order[(k + 1) % lines] * WORDS_PER_LINE;
        }
        Probe { next }
    }

    /// ns per dependent load: the fastest of [`PROBE_PARTS`] timed passes,
    /// after one untimed pass that brings the lines back into the caches
    /// (the round trips in between evict some of them; the probe measures
    /// the caches' speed, not what was evicted). The minimum leaves out a
    /// pass that an interrupt or another thread's time slice lengthened;
    /// the host's phase lengthens all of them.
    fn measure(&self) -> f64 {
        let lines = PROBE_BYTES / 64;
        let mut i = 0usize;
        for _ in 0..lines {
            i = self.next[std::hint::black_box(i)];
        }
        let mut best = f64::INFINITY;
        for _ in 0..PROBE_PARTS {
            let t = std::time::Instant::now();
            for _ in 0..lines {
                i = self.next[std::hint::black_box(i)];
            }
            best = best.min(t.elapsed().as_secs_f64() * 1e9 / lines as f64);
        }
        std::hint::black_box(i);
        best
    }
}

/// A probe above this multiple of the 10th percentile of all probes was
/// interrupted (preempted, an interrupt): the slow phase is about twice the
/// fast one, never this much.
const OUTLIER: f64 = 3.0;

/// The bounds of the two phases from `probes`: the threshold between the
/// fast and the slow cluster (None: one phase seen) and the outlier bound.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Split {
    pub(super) threshold: Option<f64>,
    pub(super) outlier: f64,
}

/// Where `probes` split (1-D two-means over the probes below the outlier
/// bound: the split of the sorted values with the least within-cluster
/// squared deviation); no threshold when fewer than two values remain or
/// the clusters' means differ by less than [`MIN_SEPARATION`].
pub(super) fn split(probes: &[f64]) -> Split {
    let mut v: Vec<f64> = probes.iter().copied().filter(|p| p.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    let outlier = OUTLIER * pct(&mut v.clone(), 0.1);
    v.retain(|&p| p <= outlier);
    Split { threshold: two_means(&v), outlier }
}

/// The threshold of [`split`] over sorted, outlier-free `v`.
fn two_means(v: &[f64]) -> Option<f64> {
    if v.len() < 2 {
        return None;
    }
    // Prefix sums for O(n) cost per split.
    let (mut s, mut s2) = (vec![0.0; v.len() + 1], vec![0.0; v.len() + 1]);
    for (i, x) in v.iter().enumerate() {
        s[i + 1] = s[i] + x;
        s2[i + 1] = s2[i] + x * x;
    }
    let sse = |a: usize, b: usize| {
        let n = (b - a) as f64;
        let sum = s[b] - s[a];
        (s2[b] - s2[a]) - sum * sum / n
    };
    let n = v.len();
    let k = (1..n).min_by(|&a, &b| (sse(0, a) + sse(a, n)).total_cmp(&(sse(0, b) + sse(b, n))))?;
    let (lo, hi) = (s[k] / k as f64, (s[n] - s[k]) / (n - k) as f64);
    (hi >= lo * MIN_SEPARATION).then(|| (v[k - 1] + v[k]) / 2.0)
}

/// The phase of a window by its two probes (None: the phase changed inside
/// the window, or a probe was interrupted).
pub(super) fn classify(w: &Window, split: Split) -> Option<Phase> {
    if w.probe.iter().any(|&p| p.is_nan() || p > split.outlier) {
        return None;
    }
    let Some(t) = split.threshold else { return Some(Phase::Fast) };
    let of = |p: f64| if p > t { Phase::Slow } else { Phase::Fast };
    let (a, b) = (of(w.probe[0]), of(w.probe[1]));
    (a == b).then_some(a)
}

/// What one phase of one run measured: windows, the probe's median, and
/// the p50 and p99 of each kind of round trip (one-way µs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct PhaseStats {
    pub(super) windows: usize,
    pub(super) probe_ns: f64,
    /// [p50, p99] of urnic SEND, urnic WRITE, raw, raw with ACKs.
    pub(super) send: [f64; 2],
    pub(super) write: [f64; 2],
    pub(super) raw: [f64; 2],
    pub(super) raw_ack: [f64; 2],
}

/// [p50, p99] of one kind of round trip.
type Quantiles = fn(&PhaseStats) -> [f64; 2];

impl PhaseStats {
    fn send(&self) -> [f64; 2] {
        self.send
    }

    fn write(&self) -> [f64; 2] {
        self.write
    }

    fn raw(&self) -> [f64; 2] {
        self.raw
    }

    fn raw_ack(&self) -> [f64; 2] {
        self.raw_ack
    }
}

/// Windows in a phase below which its quantiles are not reported (the p99
/// needs a few hundred samples).
const MIN_WINDOWS: usize = 6;

/// The statistics of the windows of `windows` in `phase`, or None when
/// fewer than [`MIN_WINDOWS`] were.
pub(super) fn phase_stats(windows: &[Window], split: Split, phase: Phase) -> Option<PhaseStats> {
    let mine: Vec<&Window> = windows.iter().filter(|w| classify(w, split) == Some(phase)).collect();
    if mine.len() < MIN_WINDOWS {
        return None;
    }
    let pool = |f: fn(&Window) -> &Vec<f64>| {
        let mut v: Vec<f64> = mine.iter().flat_map(|w| f(w).iter().copied()).collect();
        [pct(&mut v, 0.5), pct(&mut v, 0.99)]
    };
    let mut probes: Vec<f64> = mine.iter().flat_map(|w| w.probe).collect();
    Some(PhaseStats {
        windows: mine.len(),
        probe_ns: median(&mut probes),
        send: pool(|w| &w.send),
        write: pool(|w| &w.write),
        raw: pool(|w| &w.raw),
        raw_ack: pool(|w| &w.raw_ack),
    })
}

/// Measure [`WINDOWS`] windows of interleaved round trips with `cores`
/// (two: the answering side on the second thread, see the module's doc)
/// on three fresh veth pairs: the SEND ping-pong, the WRITE ping-pong and
/// the raw sockets each on a pair of its own, so that each urnic ping-pong
/// carries only its own ACKs, as it would alone (a held ACK of one QP rides
/// behind that QP's next frame or leaves at the next poll of its device
/// once its bound has passed: on shared devices the WRITE QP's held ACKs
/// left in the SEND round's first kick, and the SEND rows paid for them).
pub(super) fn interleaved(cores: Cores) -> Result<Vec<Window>> {
    let [send_pair, write_pair, raw_pair] = [(); 3].map(|()| VethPair::create("lat", 1500).context("namespaces (root)"));
    let (send_pair, write_pair, raw_pair) = (send_pair?, write_pair?, raw_pair?);
    let Rig { ea: mut sa, eb: mut sb, .. } = rig(&send_pair, Cores::One, 16384, "bl")?;
    let Rig { ea: mut wa, eb: mut wb, .. } = rig(&write_pair, Cores::One, 16384, "bm")?;
    let mut raw = RawPingPong::new(&raw_pair)?;
    let mut send = SendPingPong::new(&mut sa, &mut sb, 8)?;
    let mut write = WritePingPong::new(&mut wa, &mut wb, 8)?;
    match cores {
        Cores::One => {
            let mut one = || -> Result<[f64; 2]> {
                Ok([send.round(&mut sa, &mut sb).context("SEND ping-pong")?, write.round(&mut wa, &mut wb).context("WRITE ping-pong")?])
            };
            let out = windows(&mut raw, &mut one)?;
            write.finish(&mut wa, &mut wb)?;
            Ok(out)
        }
        Cores::Two => {
            // Each side on a core of its own, as the raw ping-pong's two
            // ends are and as perftest's client and server processes are:
            // the application's thread pings and runs the A devices, a
            // second thread runs the B devices, answers urnic's pings as
            // their applications would and answers the raw pings.
            for (a, b) in [(&mut sa, &mut sb), (&mut wa, &mut wb)] {
                a.drive = vec![a.ctx.clone()];
                b.drive = vec![b.ctx.clone()];
            }
            let (mut send_echo, mut write_echo) = (send.echo(), write.echo());
            let echo_done = write_echo.done.clone();
            let mut raw_echo = raw.split_echo().context("raw echo end")?;
            // A failed echo stops answering urnic's pings (the pinger's wait
            // then fails) and leaves its reason here. The loop itself only
            // tests its own flag: no lock on the path both stacks' pings
            // wait on.
            let failed: Arc<Mutex<Option<String>>> = Arc::default();
            let report = failed.clone();
            let mut stopped = false;
            let second = Poller::spawn_loop(move || {
                if !stopped {
                    let stepped = send_echo.step(&mut sb).context("SEND echo").and_then(|()| write_echo.step(&mut wb).context("WRITE echo"));
                    if let Err(e) = stepped {
                        stopped = true;
                        if let Ok(mut f) = report.lock() {
                            *f = Some(format!("{e:#}"));
                        }
                    }
                }
                raw_echo.poll();
            });
            let mut one = || -> Result<[f64; 2]> {
                Ok([send.round_echoed(&mut sa).context("SEND ping-pong")?, write.round_echoed(&mut wa).context("WRITE ping-pong")?])
            };
            let out = windows(&mut raw, &mut one).and_then(|w| write.finish_echoed(&mut wa, &echo_done).map(|()| w));
            drop(second);
            match (out, failed.lock().ok().and_then(|mut f| f.take())) {
                (Err(e), Some(why)) => Err(e.context(format!("the answering thread failed: {why}"))),
                (out, _) => out,
            }
        }
    }
}

/// [`WINDOWS`] windows, each of [`ROUNDS_PER_WINDOW`] iterations of one raw
/// round trip, one raw round trip with ACKs and `urnic_round` (urnic's SEND
/// and WRITE round trips), between two probes.
fn windows(raw: &mut RawPingPong, urnic_round: &mut dyn FnMut() -> Result<[f64; 2]>) -> Result<Vec<Window>> {
    let probe = Probe::new();
    let raw_round = |raw: &mut RawPingPong, with_ack: bool| -> Result<f64> {
        let t = std::time::Instant::now();
        raw.round(with_ack)?;
        Ok(t.elapsed().as_secs_f64() * 1e6 / 2.0)
    };
    for _ in 0..WARMUP_ROUNDS {
        raw_round(raw, false)?;
        raw_round(raw, true)?;
        urnic_round()?;
    }
    let mut out = Vec::with_capacity(WINDOWS);
    for _ in 0..WINDOWS {
        let mut w = Window { probe: [probe.measure(), 0.0], ..Window::default() };
        for _ in 0..ROUNDS_PER_WINDOW {
            w.raw.push(raw_round(raw, false)?);
            w.raw_ack.push(raw_round(raw, true)?);
            let [send, write] = urnic_round()?;
            w.send.push(send);
            w.write.push(write);
        }
        w.probe[1] = probe.measure();
        out.push(w);
    }
    Ok(out)
}

/// One run's interleaved windows, `[cores]`.
pub(super) type LatencyRun = [Vec<Window>; 2];

/// The table rows for `runs`: per cores, phase and operation, urnic's p50 /
/// p99 against the raw ping-pong's in the same windows, the median of the
/// per-run ratios and their range; and how the windows split.
pub(super) fn rows(runs: &[&LatencyRun]) -> String {
    let mut t = String::new();
    let all: Vec<f64> = runs.iter().flat_map(|r| r.iter()).flatten().flat_map(|w| w.probe).collect();
    let sp = split(&all);
    let windows: usize = runs.iter().flat_map(|r| r.iter()).map(Vec::len).sum();
    let mixed = runs.iter().flat_map(|r| r.iter()).flatten().filter(|w| classify(w, sp).is_none()).count();
    let _ = writeln!(
        t,
        "| phase probe (128 KiB pointer chase, ns per load): threshold {}; {windows} windows of {ROUNDS_PER_WINDOW} interleaved \
         round trips, {mixed} left out (phase changed inside, or a probe above {:.1} ns: interrupted) | | | |",
        sp.threshold.map_or("none (one phase seen)".into(), |v| format!("{v:.2} ns")),
        sp.outlier
    );
    let range = |v: &[f64]| {
        let (lo, hi) = spread(v);
        format!("{lo:.2}..{hi:.2}")
    };
    for (i, cores) in [Cores::One, Cores::Two].into_iter().enumerate() {
        for phase in [Phase::Fast, Phase::Slow] {
            let stats: Vec<PhaseStats> = runs.iter().filter_map(|r| phase_stats(&r[i], sp, phase)).collect();
            let (c, p) = (cores.label(), phase.label());
            if stats.is_empty() {
                let _ = writeln!(t, "| 8 B latency, {c}, {p}: not seen in any run (fewer than {MIN_WINDOWS} windows) | | | |");
                continue;
            }
            let med = |f: &dyn Fn(&PhaseStats) -> f64| median(&mut stats.iter().map(f).collect::<Vec<_>>());
            let probe = med(&|s| s.probe_ns);
            let nwin: usize = stats.iter().map(|s| s.windows).sum();
            let floors: [(&str, Quantiles, &str); 2] = [
                ("raw AF_XDP ping-pong", PhaseStats::raw, "target <= 1.5 / 2"),
                (
                    "raw AF_XDP ping-pong with an ACK-length frame before each ping and pong (two frames a kick, as RC needs)",
                    PhaseStats::raw_ack,
                    "no target",
                ),
            ];
            for (op, f) in [("SEND", PhaseStats::send as Quantiles), ("WRITE", PhaseStats::write)] {
                for (floor, base, target) in floors {
                    let r50: Vec<f64> = stats.iter().map(|s| f(s)[0] / base(s)[0]).collect();
                    let r99: Vec<f64> = stats.iter().map(|s| f(s)[1] / base(s)[1]).collect();
                    let _ = writeln!(
                        t,
                        "| 8 B {op} latency p50 / p99, {c}, {p} (probe {probe:.1} ns; {nwin} windows in {} of {} runs) vs {floor} \
                         interleaved ({SEND8_FRAME}-byte frames; one-way) | {:.1} / {:.1} us | {:.1} / {:.1} us | {:.2} / {:.2} (runs {} / {}; \
                         {target}) |",
                        stats.len(),
                        runs.len(),
                        med(&|s| f(s)[0]),
                        med(&|s| f(s)[1]),
                        med(&|s| base(s)[0]),
                        med(&|s| base(s)[1]),
                        median(&mut r50.clone()),
                        median(&mut r99.clone()),
                        range(&r50),
                        range(&r99),
                    );
                }
            }
        }
    }
    t
}

/// All raw ping-pong samples of a run with `cores` (for the latency plot).
pub(super) fn raw_samples(run: &LatencyRun, cores: usize) -> Vec<f64> {
    run[cores].iter().flat_map(|w| w.raw.iter().copied()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(probe: [f64; 2], urnic: f64, raw: f64) -> Window {
        Window { probe, send: vec![urnic; 10], write: vec![urnic * 1.1; 10], raw: vec![raw; 10], raw_ack: vec![raw * 1.25; 10] }
    }

    #[test]
    fn two_clusters_are_split_between_them() {
        let probes = [4.6, 4.7, 4.65, 8.5, 8.6, 4.8, 8.4, 9.0];
        let t = split(&probes).threshold.expect("two phases");
        assert!(t > 4.8 && t < 8.4, "{t}");
    }

    #[test]
    fn one_cluster_is_not_split() {
        assert_eq!(split(&[4.6, 4.7, 4.65, 4.9, 5.0, 4.8]).threshold, None);
        assert_eq!(split(&[4.6]).threshold, None);
        assert_eq!(split(&[]).threshold, None);
        // An interrupted probe is an outlier, not a phase.
        let s = split(&[4.6, 4.7, 4.65, 4.9, 5.0, 4.8, 25.7]);
        assert_eq!(s.threshold, None);
        assert!(s.outlier > 5.0 && s.outlier < 25.7, "{s:?}");
    }

    #[test]
    fn windows_whose_probes_disagree_are_left_out() {
        let t = Split { threshold: Some(6.0), outlier: 14.0 };
        assert_eq!(classify(&window([4.6, 4.7], 7.0, 3.5), t), Some(Phase::Fast));
        assert_eq!(classify(&window([8.6, 8.7], 7.0, 3.5), t), Some(Phase::Slow));
        assert_eq!(classify(&window([4.6, 8.7], 7.0, 3.5), t), None);
        assert_eq!(classify(&window([4.6, 25.0], 7.0, 3.5), t), None);
        assert_eq!(classify(&window([8.6, 4.7], 7.0, 3.5), Split { threshold: None, outlier: 14.0 }), Some(Phase::Fast));
    }

    #[test]
    fn phase_statistics_pool_only_that_phases_windows() {
        let mut w: Vec<Window> = (0..8).map(|_| window([4.6, 4.6], 7.0, 3.5)).collect();
        w.extend((0..7).map(|_| window([8.6, 8.6], 12.0, 5.0)));
        w.push(window([4.6, 8.6], 100.0, 1.0));
        let t = split(&w.iter().flat_map(|w| w.probe).collect::<Vec<_>>());
        let fast = phase_stats(&w, t, Phase::Fast).expect("fast");
        assert_eq!((fast.windows, fast.send, fast.raw, fast.probe_ns), (8, [7.0, 7.0], [3.5, 3.5], 4.6));
        let slow = phase_stats(&w, t, Phase::Slow).expect("slow");
        assert_eq!((slow.windows, slow.send, slow.raw), (7, [12.0, 12.0], [5.0, 5.0]));
        // Too few windows: no figures.
        assert_eq!(phase_stats(&w[..5], t, Phase::Fast), None);
    }

    #[test]
    fn rows_give_per_phase_ratios_and_their_range() {
        let run = |urnic_fast: f64| -> LatencyRun {
            let mut w: Vec<Window> = (0..8).map(|_| window([4.6, 4.6], urnic_fast, 4.0)).collect();
            w.extend((0..8).map(|_| window([8.6, 8.6], 15.0, 5.0)));
            [w.clone(), w]
        };
        let (a, b, c) = (run(6.0), run(8.0), run(10.0));
        let t = rows(&[&a, &b, &c]);
        let fast = t.lines().find(|l| l.contains("8 B SEND latency p50 / p99, 1 core, fast phase")).expect("fast row");
        // Ratios 1.5, 2.0, 2.5: median 2.0, range 1.50..2.50.
        assert!(fast.ends_with("| 8.0 / 8.0 us | 4.0 / 4.0 us | 2.00 / 2.00 (runs 1.50..2.50 / 1.50..2.50; target <= 1.5 / 2) |"), "{fast}");
        let ack =
            t.lines().find(|l| l.contains("8 B SEND latency p50 / p99, 1 core, fast phase") && l.contains("ACK-length")).expect("ACK floor row");
        assert!(ack.ends_with("| 8.0 / 8.0 us | 5.0 / 5.0 us | 1.60 / 1.60 (runs 1.20..2.00 / 1.20..2.00; no target) |"), "{ack}");
        let slow = t.lines().find(|l| l.contains("8 B WRITE latency p50 / p99, 2 cores, slow phase")).expect("slow row");
        assert!(slow.contains("24 windows in 3 of 3 runs"), "{slow}");
        assert!(slow.ends_with("| 3.30 / 3.30 (runs 3.30..3.30 / 3.30..3.30; target <= 1.5 / 2) |"), "{slow}");
        assert!(t.contains("0 left out"), "{t}");
    }
}
