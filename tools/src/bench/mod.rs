//! `urnic bench`: urnic against the baselines a user would pick, on the same
//! veth between two namespaces, in one run, with medians over several runs
//! and the ratios.
//!
//! urnic runs with one core (both devices run-to-completion on the
//! application's thread) and with two (device A on the application's thread,
//! device B polled by a second thread). Its baselines, measured on the same
//! veth in the same run:
//! - the raw AF_XDP ceiling: MTU-sized RoCE frames from one AF_XDP socket to
//!   the other through the same XDP program, doing nothing else — with one
//!   thread sending and receiving (the one-core budget) and with a sender and
//!   a receiver thread (two cores); and its ping-pong: one frame of an
//!   8-byte SEND's length bounced between the two sockets (the latency
//!   floor of any AF_XDP stack here);
//! - kernel TCP: single-stream throughput and 64-byte-write message rate
//!   (iperf3), 8-byte ping-pong latency (our echo over TCP_NODELAY);
//! - kernel UDP: 8-byte ping-pong latency.
//!
//! And the C path's cost: Debian's unmodified `ib_write_bw` / `ib_send_lat`
//! on urnic's libibverbs.so.1 against `urnic perf` with the same parameters
//! ([`c_path`]; `--c-path` runs only these). Without the library (or
//! perftest) those rows say why they were not measured.
//!
//! Bandwidth against the ceiling is measured at the same footing on both
//! sides: each after a 200 ms warm-up, for about a second, and next to each
//! other in the order urnic, ceiling, ceiling, urnic (the host's speed drifts
//! over seconds; the bracket cancels a steady drift).
//!
//! `--report DIR` adds bandwidth sweeps (WRITE, READ, SEND; 64 B..1 MiB; MTU
//! 1024 and 4096; one and two cores) and writes report.md, sweep.csv,
//! bandwidth_{write,read,send}.png and latency.png (distributions).
//!
//! Modules: [`c_path`] (the C library against `urnic perf`), [`urnic_runs`] (urnic's measurements), [`raw_xdp`] (the raw
//! AF_XDP ceiling and ping-pong), [`baselines`] (kernel TCP and UDP),
//! [`metrics`] (/proc, getrusage, quantiles), [`report`](mod@report) (table, markdown,
//! plots).

mod baselines;
mod c_path;
mod latency;
mod metrics;
mod rate;
mod raw_xdp;
mod report;
mod urnic_runs;

use std::time::Instant;

use anyhow::{Context as _, Result};
use urnic_datapath::netns::VethPair;

use self::baselines::{iperf3, tcp_pingpong, udp_pingpong};
pub use self::c_path::run_only as c_path_only;
use self::c_path::CPathRun;
use self::metrics::median;
pub use self::rate::run_only as rate_only;
use self::raw_xdp::{raw_afxdp, raw_afxdp_reading, write_frame_len, WRITE64_FRAME};
use self::report::summarize;
use self::urnic_runs::{many_qps, sweep, urnic_small, urnic_write_64k, Sweep};
use crate::perf::BwOp;
use crate::progress::Progress;

/// How many cores urnic gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cores {
    /// Both devices run-to-completion on the application's thread.
    One,
    /// Device A on the application's thread, device B on its own thread.
    Two,
}

impl Cores {
    fn label(self) -> &'static str {
        match self {
            Cores::One => "1 core",
            Cores::Two => "2 cores",
        }
    }
}

/// What one urnic configuration measured.
#[derive(Default)]
struct UrnicRun {
    /// 64 KiB WRITE MB/s at MTU 1024 and at MTU 4096.
    write_64k: f64,
    write_64k_mtu4096: f64,
    /// 64 B WRITE messages per second.
    msg_rate: f64,
    /// CPU seconds per GB in the 64 KiB WRITE run at MTU 1024.
    cpu_per_gb: f64,
    /// 8 B one-way latency samples, µs.
    send_lat: Vec<f64>,
    write_lat: Vec<f64>,
}

/// Measure urnic and its raw ceiling next to each other, in the order
/// urnic, ceiling, ceiling, urnic: the host's speed drifts over seconds,
/// and the bracket cancels a steady drift. Returns the two means.
fn bracketed(mut urnic: impl FnMut() -> Result<f64>, mut ceiling: impl FnMut() -> Result<f64>) -> Result<(f64, f64)> {
    let u1 = urnic()?;
    let c1 = ceiling()?;
    let c2 = ceiling()?;
    let u2 = urnic()?;
    Ok(((u1 + u2) / 2.0, (c1 + c2) / 2.0))
}

/// [`bracketed`] with two ceilings, in the order urnic, ceiling, reading,
/// reading, ceiling, urnic: each pair's mean is centred on the same moment,
/// so a steady drift cancels in both ratios. Returns the three means.
fn bracketed_two(
    mut urnic: impl FnMut() -> Result<f64>,
    mut ceiling: impl FnMut() -> Result<f64>,
    mut reading: impl FnMut() -> Result<f64>,
) -> Result<(f64, f64, f64)> {
    let u1 = urnic()?;
    let c1 = ceiling()?;
    let r1 = reading()?;
    let r2 = reading()?;
    let c2 = ceiling()?;
    let u2 = urnic()?;
    Ok(((u1 + u2) / 2.0, (c1 + c2) / 2.0, (r1 + r2) / 2.0))
}

/// Ping-pong rounds left out of the samples (caches, neighbours, the peer's
/// first wakeups).
const WARMUP_ROUNDS: usize = 100;

/// Run `round` (one round trip) `WARMUP_ROUNDS + iters` times and return the
/// one-way µs (RTT/2) of the last `iters`.
fn timed_rounds(iters: usize, mut round: impl FnMut() -> Result<()>) -> Result<Vec<f64>> {
    let mut samples = Vec::with_capacity(iters);
    for i in 0..WARMUP_ROUNDS + iters {
        let t = Instant::now();
        round()?;
        if i >= WARMUP_ROUNDS {
            samples.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
        }
    }
    Ok(samples)
}

/// Everything one run measures.
#[derive(Default)]
struct Run {
    urnic: [UrnicRun; 2],
    /// Raw ceiling pps, `[cores]` at 1082-byte, 4154-byte and 138-byte frames.
    raw_1k: [f64; 2],
    raw_4k: [f64; 2],
    /// The two-core ceilings whose receiver reads every byte
    /// ([`raw_afxdp_reading`]), pps at 1082-byte and 4154-byte frames.
    raw_1k_read: f64,
    raw_4k_read: f64,
    raw_small: [f64; 2],
    tcp_mbps: f64,
    tcp_mbps_9k: f64,
    tcp_cpu_per_gb: f64,
    tcp_msgs: f64,
    one_qp: f64,
    many_qp: f64,
    mem_per_qp: f64,
    udp_lat: Vec<f64>,
    tcp_lat: Vec<f64>,
    /// Raw AF_XDP ping-pong one-way µs, `[cores]` (all windows of `latency`).
    raw_lat: [Vec<f64>; 2],
    /// urnic's user CPU µs per 4154-byte frame, one core, 64 KiB WRITEs at
    /// MTU 4096 ([`rate::cpu_row`]; not with two cores, where device B's
    /// thread spins between frames and its user time is not work).
    user_per_frame_4k: f64,
    /// The mandatory user CPU per 4154-byte frame (see `rate`).
    cpu_floor: rate::CpuFloor,
    /// urnic's 8 B SEND and WRITE interleaved with the raw ping-pong, in
    /// windows labelled by the phase probe ([`latency`]).
    latency: latency::LatencyRun,
    /// The C library against `urnic perf` (None: not measured, see
    /// `c_path_skipped`).
    c_path: Option<CPathRun>,
    /// Why the C path was not measured.
    c_path_skipped: Option<String>,
}

/// Progress steps in one [`one_run`].
const RUN_STEPS: u64 = BANDWIDTH_ROW_STEPS + 2 * 3 + 8 + c_path::STEPS;

/// Fresh namespaces joined by a 1500-byte and by a 9000-byte veth (stale
/// ones of earlier, interrupted runs removed first).
fn veth_pairs(tag: &str) -> Result<(VethPair, VethPair)> {
    let _ = VethPair::sweep_stale();
    let pair = VethPair::create(tag, 1500).context("namespaces (root)")?;
    let pair9k = VethPair::create(tag, 9000).context("namespaces (root)")?;
    Ok((pair, pair9k))
}

fn one_run(p: &Progress, lib: &std::result::Result<std::path::PathBuf, String>) -> Result<Run> {
    let (pair, pair9k) = veth_pairs("bench")?;
    let mut r = Run::default();
    for (i, cores) in [Cores::One, Cores::Two].into_iter().enumerate() {
        let c = cores.label();
        bandwidth_rows(p, (&pair, &pair9k), cores, &mut r, i)?;
        p.step(format_args!("urnic, {c}: 64 B WRITE message rate, 8 B SEND and WRITE latency"));
        (r.urnic[i].msg_rate, r.urnic[i].send_lat, r.urnic[i].write_lat) = urnic_small(&pair, cores)?;
        p.step(format_args!("raw AF_XDP, {c}: small-frame rate"));
        r.raw_small[i] = raw_afxdp(&pair, WRITE64_FRAME, cores, 1.0)?;
        p.step(format_args!("urnic and raw AF_XDP, {c}: 8 B latency interleaved, by host phase"));
        r.latency[i] = latency::interleaved(cores)?;
        r.raw_lat[i] = latency::raw_samples(&r.latency, i);
    }
    p.step("urnic, 1 core: user CPU per 4154-byte frame over 2 s; the floor: ring handling, copies, ICRC passes");
    (r.user_per_frame_4k, r.cpu_floor) = rate::cpu_row(&pair9k, 2.0)?;
    p.step("kernel TCP (iperf3): bandwidth, MTU 1500");
    (r.tcp_mbps, r.tcp_cpu_per_gb) = iperf3(&pair, 2, &[])?;
    p.step("kernel TCP (iperf3): bandwidth, MTU 9000");
    r.tcp_mbps_9k = iperf3(&pair9k, 2, &[])?.0;
    p.step("kernel TCP (iperf3): 64-byte message rate");
    r.tcp_msgs = iperf3(&pair, 2, &["-l", "64", "-N"])?.0 * 1e6 / 8.0 / 64.0;
    p.step("urnic: one RC QP, 64 KiB WRITEs");
    r.one_qp = many_qps(&pair, 1, 2000)?.0;
    p.step("urnic: 1000 RC QPs, 64 KiB WRITEs, memory per QP");
    (r.many_qp, r.mem_per_qp) = many_qps(&pair, 1000, 4000)?;
    p.step("kernel UDP: 8-byte ping-pong latency");
    r.udp_lat = udp_pingpong(&pair, 3000)?;
    p.step("kernel TCP: 8-byte ping-pong latency");
    r.tcp_lat = tcp_pingpong(&pair, 3000)?;
    match lib {
        Ok(lib) => r.c_path = Some(c_path::c_path(&pair, lib, p)?),
        Err(why) => {
            for _ in 0..c_path::STEPS {
                p.step("C path: not measured");
            }
            r.c_path_skipped = Some(why.clone());
        }
    }
    Ok(r)
}

/// The 64 KiB WRITE rows of one run for `cores` (index `i` of [`Run::urnic`]
/// and the ceilings): each bandwidth next to its raw ceiling (see
/// [`bracketed`]), at MTU 1024 on `pairs.0` and MTU 4096 on `pairs.1`, with
/// the CPU figures of urnic's runs.
fn bandwidth_rows(p: &Progress, pairs: (&VethPair, &VethPair), cores: Cores, r: &mut Run, i: usize) -> Result<()> {
    let (pair, pair9k) = pairs;
    let c = cores.label();
    let mut cpu = Vec::new();
    // One MTU's bracket: urnic's MB/s, the ceiling's pps and (two cores) the
    // reading ceiling's pps.
    let mut rows = |mtu: usize, pair: &VethPair, tag: &str| -> Result<(f64, f64, f64)> {
        let frame = write_frame_len(mtu);
        let mut urnic = || {
            p.step(format_args!("urnic, {c}: 64 KiB WRITE bandwidth, MTU {mtu}"));
            urnic_write_64k(pair, cores, tag).map(|w| {
                if mtu == 1024 {
                    cpu.push(w.cpu_per_gb);
                }
                w.mbs
            })
        };
        let ceiling = || {
            p.step(format_args!("raw AF_XDP ceiling, {c}, MTU {mtu}"));
            raw_afxdp(pair, frame, cores, 1.0)
        };
        match cores {
            Cores::One => bracketed(&mut urnic, ceiling).map(|(w, raw)| (w, raw, 0.0)),
            Cores::Two => bracketed_two(&mut urnic, ceiling, || {
                p.step(format_args!("raw AF_XDP ceiling whose receiver reads every byte, {c}, MTU {mtu}"));
                raw_afxdp_reading(pair, frame, 1.0)
            }),
        }
    };
    let (w1, raw1, read1) = rows(1024, pair, "bn")?;
    let (w4, raw4, read4) = rows(4096, pair9k, "bj")?;
    (r.urnic[i].write_64k, r.raw_1k[i], r.urnic[i].write_64k_mtu4096, r.raw_4k[i]) = (w1, raw1, w4, raw4);
    if cores == Cores::Two {
        (r.raw_1k_read, r.raw_4k_read) = (read1, read4);
    }
    r.urnic[i].cpu_per_gb = cpu.iter().sum::<f64>() / cpu.len().max(1) as f64;
    Ok(())
}

/// Progress steps of the bandwidth rows of one run: two bracketed rows of
/// four steps on one core, two of six (the reading ceiling too) on two.
const BANDWIDTH_ROW_STEPS: u64 = 2 * 4 + 2 * 6;

/// Progress steps of one [`bandwidth_only`] run: the bandwidth rows and the
/// CPU floor.
const BANDWIDTH_STEPS: u64 = BANDWIDTH_ROW_STEPS + 1;

/// Only the 64 KiB WRITE rows (`urnic bench --bandwidth`), `n` runs: MTU 1024
/// and 4096, one and two cores, each bracketed with its raw ceiling, and the
/// user CPU per 4154-byte frame (1 core) against the floor measured in the
/// same run: a quick A/B of per-frame changes (issue 20, targets 3 and 4).
pub fn bandwidth_only(n: usize) -> Result<()> {
    let p = Progress::new("bench", BANDWIDTH_STEPS * n.max(1) as u64);
    let mut all = Vec::new();
    for k in 0..n.max(1) {
        let (pair, pair9k) = veth_pairs("bw")?;
        let mut r = Run::default();
        for (i, cores) in [Cores::One, Cores::Two].into_iter().enumerate() {
            bandwidth_rows(&p, (&pair, &pair9k), cores, &mut r, i)?;
        }
        p.step("urnic, 1 core: user CPU per 4154-byte frame over 2 s; the floor: ring handling, copies, ICRC passes");
        (r.user_per_frame_4k, r.cpu_floor) = rate::cpu_row(&pair9k, 2.0)?;
        let ratios = bandwidth_ratios(&r);
        p.println(format!(
            "run {}: 64 KiB WRITE / raw ceiling: MTU 1024 {:.2}/{:.2}, MTU 4096 {:.2}/{:.2} (1/2 cores; urnic {:.0}/{:.0} and {:.0}/{:.0} MB/s); \
             2 cores / the ceiling whose receiver reads: {:.2}, {:.2}; user CPU per 4154-byte frame {:.2} us vs floor {:.2}: {:.2}",
            k + 1,
            ratios[0],
            ratios[2],
            ratios[1],
            ratios[3],
            r.urnic[0].write_64k,
            r.urnic[1].write_64k,
            r.urnic[0].write_64k_mtu4096,
            r.urnic[1].write_64k_mtu4096,
            ratios[5],
            ratios[6],
            r.user_per_frame_4k,
            r.cpu_floor.total(),
            ratios[4]
        ));
        all.push(r);
    }
    drop(p);
    let rows = [
        "64 KiB WRITE / raw ceiling, MTU 1024, 1 core",
        "64 KiB WRITE / raw ceiling, MTU 4096, 1 core",
        "64 KiB WRITE / raw ceiling, MTU 1024, 2 cores",
        "64 KiB WRITE / raw ceiling, MTU 4096, 2 cores",
        "user CPU per 4154-byte frame / floor, 1 core",
        "64 KiB WRITE / the ceiling whose receiver reads every byte, MTU 1024, 2 cores",
        "64 KiB WRITE / the ceiling whose receiver reads every byte, MTU 4096, 2 cores",
    ];
    let targets = ["≥ 0.85", "≥ 0.85", "≥ 0.95 in every run", "≥ 0.95 in every run", "≤ 1.25", "(context)", "(context)"];
    let table = rows.iter().zip(targets).enumerate().map(|(j, (what, target))| (*what, all.iter().map(|r| bandwidth_ratios(r)[j]).collect(), target));
    crate::out::outln!("{}", metrics::ratio_table(all.len(), table))?;
    Ok(())
}

/// A run's bandwidth ratios (urnic / raw ceiling in payload bytes): MTU 1024
/// and 4096 with one core, the same with two, then the CPU row (user CPU per
/// 4154-byte frame / floor), then the two-core rows against the ceiling whose
/// receiver reads every byte (MTU 1024, 4096).
fn bandwidth_ratios(r: &Run) -> [f64; 7] {
    let at = |mbs: f64, pps: f64, mtu: f64| mbs / (pps * mtu / 1e6);
    [
        at(r.urnic[0].write_64k, r.raw_1k[0], 1024.0),
        at(r.urnic[0].write_64k_mtu4096, r.raw_4k[0], 4096.0),
        at(r.urnic[1].write_64k, r.raw_1k[1], 1024.0),
        at(r.urnic[1].write_64k_mtu4096, r.raw_4k[1], 4096.0),
        r.user_per_frame_4k / r.cpu_floor.total(),
        at(r.urnic[1].write_64k, r.raw_1k_read, 1024.0),
        at(r.urnic[1].write_64k_mtu4096, r.raw_4k_read, 4096.0),
    ]
}

fn runs(n: usize, p: &Progress) -> Result<Vec<Run>> {
    let lib = c_path::ready().map_err(|e| format!("{e:#}"));
    if let Err(why) = &lib {
        p.println(format!("C path rows not measured: {why}"));
    }
    let mut out = Vec::new();
    for i in 0..n.max(1) {
        let r = one_run(p, &lib)?;
        p.println(format!(
            "run {}: urnic 64 KiB WRITE {:.0}/{:.0} MB/s (1/2 cores), raw {:.0}/{:.0} kpps; 8 B SEND p50 {:.1}/{:.1} us; \
             TCP {:.0} MB/s; UDP p50 {:.1} us; {}",
            i + 1,
            r.urnic[0].write_64k,
            r.urnic[1].write_64k,
            r.raw_1k[0] / 1e3,
            r.raw_1k[1] / 1e3,
            median(&mut r.urnic[0].send_lat.clone()),
            median(&mut r.urnic[1].send_lat.clone()),
            r.tcp_mbps / 8.0,
            median(&mut r.udp_lat.clone()),
            r.cpu_floor.against(r.user_per_frame_4k)
        ));
        out.push(r);
    }
    Ok(out)
}

/// The raw AF_XDP ceiling alone at IB MTU `mtu`'s frame length (64: a
/// 64 B WRITE ONLY's 138 bytes, the message rate's ceiling), one thread,
/// 8 s (`urnic bench --ceiling-only MTU`, for profiling).
pub fn ceiling_only(mtu: usize) -> Result<()> {
    let _ = VethPair::sweep_stale();
    let pair = VethPair::create("ceil", if mtu > 1024 { 9000 } else { 1500 }).context("namespaces (root)")?;
    let frame = if mtu == 64 { WRITE64_FRAME } else { write_frame_len(mtu) };
    let pps = raw_afxdp(&pair, frame, Cores::One, 8.0)?;
    let (kfps, mbs) = (pps / 1e3, pps * mtu as f64 / 1e6);
    crate::out::outln!("raw AF_XDP ceiling, {frame}-byte frames, one thread: {kfps:.0} kframes/s, {mbs:.0} MB/s of payload")?;
    Ok(())
}

/// Only the interleaved latency by host phase (`urnic bench --latency`),
/// `n` runs: the per-phase rows of the table.
pub fn latency_only(n: usize) -> Result<()> {
    let _ = VethPair::sweep_stale();
    let p = Progress::new("bench", 2 * n.max(1) as u64);
    let mut all = Vec::new();
    for _ in 0..n.max(1) {
        let mut r = latency::LatencyRun::default();
        for (i, cores) in [Cores::One, Cores::Two].into_iter().enumerate() {
            p.step(format_args!("urnic and raw AF_XDP, {}: 8 B latency interleaved, by host phase", cores.label()));
            r[i] = latency::interleaved(cores)?;
        }
        all.push(r);
    }
    drop(p);
    let runs: Vec<&latency::LatencyRun> = all.iter().collect();
    crate::out::outln!("| measure ({} runs; ratio: median of the per-run ratios) | urnic | raw AF_XDP | urnic / raw |\n|---|---|---|---|", n.max(1))?;
    crate::out::outln!("{}", latency::rows(&runs))?;
    Ok(())
}

/// Run everything `n` times and print medians and ratios.
pub fn run(n: usize) -> Result<()> {
    let p = Progress::new("bench", RUN_STEPS * n.max(1) as u64);
    let all = runs(n, &p)?;
    drop(p);
    crate::out::outln!("{}", summarize(&all).table)?;
    Ok(())
}

/// The sweeps and the baselines, written to `dir`: report.md, sweep.csv,
/// bandwidth_{write,read,send}.png, latency.png.
pub fn report(dir: &std::path::Path, n: usize) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    let sizes = [64usize, 256, 1024, 4096, 16384, 65536, 262_144, 1 << 20];
    // [(mtu label, cores, per-op series)]
    let configs = [(1500u32, "MTU 1024", Cores::One), (1500, "MTU 1024", Cores::Two), (9000, "MTU 4096", Cores::One), (9000, "MTU 4096", Cores::Two)];
    // Whole passes over every configuration, `n` times, then the median of
    // each point: the host's load drifts over minutes, so repeating a point
    // back to back would share one moment's noise.
    let mut passes: Vec<Vec<Sweep>> = Vec::new();
    let mut ceiling_samples = (Vec::new(), Vec::new());
    // Per pass: each configuration's three operations, then four ceilings.
    let pass_steps = (configs.len() * BwOp::ALL.len()) as u64 + 4;
    let p = Progress::new("bench", (pass_steps + RUN_STEPS) * n.max(1) as u64);
    for pass in 0..n.max(1) {
        let mut this = Vec::new();
        for &(link, label, cores) in &configs {
            let c = cores.label();
            let s = sweep(link, cores, &sizes, &|op| {
                p.step(format_args!("sweep {}/{}: {label}, {c}, {} bandwidth, 64 B..1 MiB", pass + 1, n.max(1), op.name()))
            })?;
            for (op, v) in &s {
                let mbs: Vec<i64> = v.iter().map(|x| *x as i64).collect();
                p.println(format!("pass {}: {label}, {c}, {}: {mbs:?}", pass + 1, op.name()));
            }
            this.push(s);
        }
        passes.push(this);
        // Ceilings in payload MB/s at both frame sizes: the better of one
        // thread and two (on two cores, two threads plus the kernel's
        // softirq work can do worse than one).
        let p1 = VethPair::create("ceil", 1500).context("namespaces (root)")?;
        let p9 = VethPair::create("ceil", 9000).context("namespaces (root)")?;
        let best = |pair: &VethPair, mtu: usize| -> Result<f64> {
            p.step(format_args!("raw AF_XDP ceiling, one thread, MTU {mtu}"));
            let one = raw_afxdp(pair, write_frame_len(mtu), Cores::One, 1.0)?;
            p.step(format_args!("raw AF_XDP ceiling, two threads, MTU {mtu}"));
            let two = raw_afxdp(pair, write_frame_len(mtu), Cores::Two, 1.0)?;
            Ok(one.max(two) * mtu as f64 / 1e6)
        };
        ceiling_samples.0.push(best(&p1, 1024)?);
        ceiling_samples.1.push(best(&p9, 4096)?);
    }
    let results: Vec<(&str, Cores, Sweep)> = configs
        .iter()
        .enumerate()
        .map(|(c, &(_, label, cores))| {
            let per_op = BwOp::ALL
                .iter()
                .enumerate()
                .map(|(o, &op)| {
                    let points = (0..sizes.len()).map(|i| median(&mut passes.iter().map(|p| p[c][o].1[i]).collect::<Vec<_>>())).collect();
                    (op, points)
                })
                .collect();
            (label, cores, per_op)
        })
        .collect();
    let (c1k, c4k) = (median(&mut ceiling_samples.0), median(&mut ceiling_samples.1));
    let md = report::sweep_section(dir, n.max(1), &sizes, &results, (c1k, c4k))?;
    let all = runs(n, &p)?;
    drop(p);
    report::finish(dir, md, &summarize(&all))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[test]
    fn two_ceilings_are_bracketed_symmetrically() {
        let order = RefCell::new(Vec::new());
        let m = |who: &'static str, values: [f64; 2]| {
            let order = &order;
            let mut k = 0;
            move || {
                order.borrow_mut().push(who);
                k += 1;
                Ok(values[k - 1])
            }
        };
        let (u, c, r) = bracketed_two(m("urnic", [10.0, 20.0]), m("ceiling", [30.0, 50.0]), m("reading", [6.0, 8.0])).unwrap();
        assert_eq!((u, c, r), (15.0, 40.0, 7.0));
        assert_eq!(*order.borrow(), ["urnic", "ceiling", "reading", "reading", "ceiling", "urnic"]);
    }
}
