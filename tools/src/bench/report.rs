//! What `urnic bench` prints and writes: the table of medians and ratios
//! against the baselines, and for `--report` the markdown, sweep.csv and the
//! PNG plots (bandwidth by message size, latency CDFs).

use std::fmt::Write as _;

use super::c_path::{c_path_rows, CPathRun};
use super::metrics::{median, pct, spread};
use super::raw_xdp::{write_frame_len, WRITE64_FRAME};
use super::urnic_runs::Sweep;
use super::{Cores, Run};
use crate::perf::BwOp;
use crate::plot::{self, nice_max, Chart, Line, COLORS};
use anyhow::{Context as _, Result};
use plotters::prelude::{SeriesLabelPosition, BLACK};

/// What the rows against the reading ceiling are (no target of their own).
const READING: &str = "context: each frame summed once, as any receiver that uses its data reads it; \
                       the host's slow mode for two cores hits this ceiling too, and not the plain one";

/// The measurements of several runs: medians, ratios, pooled latency samples.
pub(super) struct Summary {
    pub(super) table: String,
    /// (label, pooled one-way µs samples) for the latency plot.
    pub(super) latency: Vec<(String, Vec<f64>)>,
}

pub(super) fn summarize(runs: &[Run]) -> Summary {
    let med = |f: &dyn Fn(&Run) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>());
    let lat = |f: &dyn Fn(&Run) -> &Vec<f64>, p: f64| median(&mut runs.iter().map(|r| pct(&mut f(r).clone(), p)).collect::<Vec<_>>());
    let lat_of = |v: &Vec<f64>, p: f64| pct(&mut v.clone(), p);
    // The ratio column pairs urnic with its baseline within each run
    // (measured seconds apart) and takes the median of those ratios: the
    // host's load drifts between runs, and a ratio of medians can pair a
    // fast run's urnic with a slow run's baseline.
    let mut t = String::new();
    let _ = writeln!(
        t,
        "| measure (medians of {} runs, same veth; ratio: median of the per-run ratios) | urnic | baseline | urnic / baseline |",
        runs.len()
    );
    t.push_str("|---|---|---|---|\n");
    // One row: what is compared, urnic's figure, the baseline's, the median
    // of the per-run ratios with their range (and issue 20's target, if the
    // row has one).
    let row = |t: &mut String, measure: String, urnic: String, baseline: String, ratios: Vec<f64>, target: Option<&str>| {
        let _ = writeln!(t, "| {measure} | {urnic} | {baseline} | {} |", ratio_cell(median(&mut ratios.clone()), spread(&ratios), target));
    };
    // The per-run values of `f`.
    let per = |f: &dyn Fn(&Run) -> f64| runs.iter().map(f).collect::<Vec<_>>();
    let mbs = |v: f64| format!("{v:.0} MB/s");
    let mps = |v: f64| format!("{:.2} M/s", v / 1e6);
    let us = |v: f64| format!("{v:.1} us");
    let tcp = med(&|r| r.tcp_mbps) / 8.0;
    let tcp9k = med(&|r| r.tcp_mbps_9k) / 8.0;
    let (frame1k, frame4k) = (write_frame_len(1024), write_frame_len(4096));
    // A two-core 64 KiB row at IB MTU `mtu` against the ceiling whose
    // receiver reads every byte: urnic's MB/s and that ceiling's pps per run.
    let reading_row = |t: &mut String, mtu: f64, urnic: &dyn Fn(&Run) -> f64, reading: &dyn Fn(&Run) -> f64| {
        row(
            t,
            format!("64 KiB WRITE, MTU {mtu}, 2 cores vs the raw ceiling whose receiver reads every byte ({READING})"),
            mbs(med(urnic)),
            mbs(med(reading) * mtu / 1e6),
            per(&|r| urnic(r) / (reading(r) * mtu / 1e6)),
            None,
        )
    };
    for (i, cores) in [Cores::One, Cores::Two].into_iter().enumerate() {
        let c = cores.label();
        let threads = if cores == Cores::One { "1 thread sending and receiving" } else { "a sender and a receiver thread" };
        let bw_target = if cores == Cores::One { ">= 0.85" } else { ">= 0.95 in every run" };
        let w = med(&|r| r.urnic[i].write_64k);
        let raw = med(&|r| r.raw_1k[i]) * 1024.0 / 1e6;
        row(
            &mut t,
            format!("64 KiB WRITE, MTU 1024, {c} vs raw AF_XDP ceiling ({frame1k}-byte frames, {threads}; payload bytes)"),
            mbs(w),
            mbs(raw),
            per(&|r| r.urnic[i].write_64k / (r.raw_1k[i] * 1024.0 / 1e6)),
            Some(bw_target),
        );
        if cores == Cores::Two {
            reading_row(&mut t, 1024.0, &|r| r.urnic[1].write_64k, &|r| r.raw_1k_read);
        }
        let w4 = med(&|r| r.urnic[i].write_64k_mtu4096);
        let raw4 = med(&|r| r.raw_4k[i]) * 4096.0 / 1e6;
        row(
            &mut t,
            format!("64 KiB WRITE, MTU 4096 (9000-byte veth), {c} vs raw AF_XDP ceiling ({frame4k}-byte frames, {threads})"),
            mbs(w4),
            mbs(raw4),
            per(&|r| r.urnic[i].write_64k_mtu4096 / (r.raw_4k[i] * 4096.0 / 1e6)),
            Some(bw_target),
        );
        if cores == Cores::Two {
            reading_row(&mut t, 4096.0, &|r| r.urnic[1].write_64k_mtu4096, &|r| r.raw_4k_read);
        }
        row(
            &mut t,
            format!("64 KiB WRITE, MTU 1024, {c} vs kernel TCP single stream (iperf3, 1500-byte veth)"),
            mbs(w),
            mbs(tcp),
            per(&|r| r.urnic[i].write_64k / (r.tcp_mbps / 8.0)),
            None,
        );
        row(
            &mut t,
            format!("64 KiB WRITE, MTU 4096, {c} vs kernel TCP single stream (iperf3, 9000-byte veth)"),
            mbs(w4),
            mbs(tcp9k),
            per(&|r| r.urnic[i].write_64k_mtu4096 / (r.tcp_mbps_9k / 8.0)),
            None,
        );
        let m = med(&|r| r.urnic[i].msg_rate);
        row(
            &mut t,
            format!("64 B WRITE message rate, {c} vs raw AF_XDP ceiling ({WRITE64_FRAME}-byte frames, {threads})"),
            mps(m),
            mps(med(&|r| r.raw_small[i])),
            per(&|r| r.urnic[i].msg_rate / r.raw_small[i]),
            Some(">= 0.85"),
        );
        row(
            &mut t,
            format!("64 B WRITE message rate, {c} vs kernel TCP 64-byte writes (iperf3 -l 64 -N)"),
            mps(m),
            mps(med(&|r| r.tcp_msgs)),
            per(&|r| r.urnic[i].msg_rate / r.tcp_msgs),
            None,
        );
        let send: fn(&Run, usize) -> &Vec<f64> = |r, i| &r.urnic[i].send_lat;
        let write: fn(&Run, usize) -> &Vec<f64> = |r, i| &r.urnic[i].write_lat;
        for (name, f) in [("SEND", send), ("WRITE", write)] {
            for (p, pl) in [(0.5, "p50"), (0.99, "p99")] {
                let u = lat(&|r| f(r, i), p);
                // Against each baseline: its figure and the per-run ratios.
                let vs = |base: &dyn Fn(&Run) -> &Vec<f64>| (lat(base, p), per(&|r| lat_of(f(r, i), p) / lat_of(base(r), p)));
                let (k, ru) = vs(&|r| &r.udp_lat);
                let (kt, rt) = vs(&|r| &r.tcp_lat);
                let what = format!("8 B {name} latency {pl}, {c} vs");
                row(&mut t, format!("{what} kernel UDP ping-pong {pl} (one-way)"), us(u), us(k), ru, None);
                row(&mut t, format!("{what} kernel TCP ping-pong {pl} (one-way, TCP_NODELAY)"), us(u), us(kt), rt, None);
            }
        }
        row(
            &mut t,
            format!("CPU seconds per GB moved, {c} (urnic: whole process; TCP: both iperf3 processes)"),
            format!("{:.2} s/GB", med(&|r| r.urnic[i].cpu_per_gb)),
            format!("{:.2} s/GB", med(&|r| r.tcp_cpu_per_gb)),
            per(&|r| r.urnic[i].cpu_per_gb / r.tcp_cpu_per_gb),
            None,
        );
        // One core only: with two, device B's thread spins between frames
        // and its user time is not work.
        if cores == Cores::One {
            row(
                &mut t,
                format!(
                    "user CPU per {frame4k}-byte frame, 64 KiB WRITE MTU 4096, {c} vs the floor (raw ceiling's ring handling {:.2} + \
                     send copy with ICRC {:.2} + ICRC check {:.2} + placement copy {:.2} us)",
                    med(&|r| r.cpu_floor.rings),
                    med(&|r| r.cpu_floor.send),
                    med(&|r| r.cpu_floor.check),
                    med(&|r| r.cpu_floor.place)
                ),
                format!("{:.2} us", med(&|r| r.user_per_frame_4k)),
                format!("{:.2} us", med(&|r| r.cpu_floor.total())),
                per(&|r| r.user_per_frame_4k / r.cpu_floor.total()),
                Some("<= 1.25"),
            );
        }
    }
    // Against the raw ping-pong: interleaved, per host phase.
    t.push_str(&super::latency::rows(&runs.iter().map(|r| &r.latency).collect::<Vec<_>>()));
    row(
        &mut t,
        "1000 connected QPs sharing one device vs 1 QP, 64 KiB WRITE aggregate, 1 core".into(),
        mbs(med(&|r| r.many_qp)),
        mbs(med(&|r| r.one_qp)),
        per(&|r| r.many_qp / r.one_qp),
        None,
    );
    let mem = med(&|r| r.mem_per_qp);
    let _ = writeln!(t, "| memory per QP (RSS growth / QPs created, 16-deep send queue) | {:.1} KiB | | |", mem / 1024.0);
    let c_runs: Vec<CPathRun> = runs.iter().filter_map(|r| r.c_path).collect();
    if c_runs.len() == runs.len() && !runs.is_empty() {
        for r in c_path_rows(&c_runs) {
            let _ = writeln!(t, "| {} | {} | {} | {} |", r.measure, r.c, r.rust, ratio_cell(r.ratio, r.range, r.target));
        }
    } else {
        let why = runs.iter().find_map(|r| r.c_path_skipped.clone()).unwrap_or_else(|| "not measured in every run".into());
        let _ = writeln!(
            t,
            "| C path (Debian's ib_write_bw / ib_send_lat / ib_write_lat on urnic's libibverbs.so.1 vs urnic perf) | not measured: {why} | | |"
        );
    }
    let pool = |f: &dyn Fn(&Run) -> &Vec<f64>| runs.iter().flat_map(|r| f(r).iter().copied()).collect::<Vec<_>>();
    let latency = vec![
        ("URNIC SEND, 1 CORE".to_string(), pool(&|r| &r.urnic[0].send_lat)),
        ("URNIC SEND, 2 CORES".to_string(), pool(&|r| &r.urnic[1].send_lat)),
        ("URNIC WRITE, 1 CORE".to_string(), pool(&|r| &r.urnic[0].write_lat)),
        ("URNIC WRITE, 2 CORES".to_string(), pool(&|r| &r.urnic[1].write_lat)),
        ("RAW AF_XDP, 1 CORE".to_string(), pool(&|r| &r.raw_lat[0])),
        ("RAW AF_XDP, 2 CORES".to_string(), pool(&|r| &r.raw_lat[1])),
        ("KERNEL UDP".to_string(), pool(&|r| &r.udp_lat)),
        ("KERNEL TCP".to_string(), pool(&|r| &r.tcp_lat)),
    ];
    Summary { table: t, latency }
}

fn size_label(s: usize) -> String {
    match s {
        s if s >= 1 << 20 => format!("{}M", s >> 20),
        s if s >= 1 << 10 => format!("{}K", s >> 10),
        s => s.to_string(),
    }
}

/// Bandwidth vs message size (log2 x axis), one line per series, dashed
/// horizontal lines for the ceilings.
fn plot_bandwidth(title: &str, sizes: &[usize], series: &[(String, Vec<f64>)], ceilings: &[(String, f64)], path: &std::path::Path) -> Result<()> {
    let top = series.iter().flat_map(|s| s.1.iter().copied()).chain(ceilings.iter().map(|c| c.1)).fold(0.0, f64::max);
    let log2 = |s: usize| (s as f64).log2();
    let (lo, hi) = (log2(sizes[0]), log2(*sizes.last().unwrap_or(&1)));
    let mut lines: Vec<Line> = series
        .iter()
        .enumerate()
        .map(|(k, (label, v))| Line {
            label,
            points: sizes.iter().zip(v).map(|(&s, &y)| (log2(s), y)).collect(),
            color: COLORS[k % COLORS.len()],
            dashed: false,
        })
        .collect();
    for (k, (label, y)) in ceilings.iter().enumerate() {
        lines.push(Line { label, points: vec![(lo, *y), (hi, *y)], color: if k == 0 { BLACK } else { COLORS[7] }, dashed: true });
    }
    plot::save(
        path,
        &Chart {
            title,
            xdesc: "message size (bytes)",
            ydesc: "MB/s",
            x: lo..hi,
            ymax: nice_max(top * 1.05),
            xticks: sizes.iter().map(|&s| log2(s)).collect(),
            xlabel: &|v| size_label(v.exp2().round() as usize),
            ylabel: &|v| format!("{v:.0}"),
            legend: SeriesLabelPosition::UpperLeft,
            lines,
        },
    )
}

/// Latency distributions as CDFs: x one-way µs (up to the largest p99),
/// y fraction of round trips at or below.
fn plot_latency(series: &[(String, Vec<f64>)], path: &std::path::Path) -> Result<()> {
    // Up to the largest p99, in steps of 5 µs (or 10 "nice" steps beyond
    // 50 µs): the slower tail would squeeze the curves into a corner.
    let p99 = series.iter().map(|(_, v)| pct(&mut v.clone(), 0.99)).filter(|v| v.is_finite()).fold(1.0, f64::max);
    let (xmax, steps) = match (p99 / 5.0).ceil() as usize {
        n @ 1..=10 => (n as f64 * 5.0, n),
        _ => (nice_max(p99), 10),
    };
    let lines = series
        .iter()
        .enumerate()
        .map(|(k, (label, v))| {
            let mut s = v.clone();
            s.sort_by(|a, b| a.total_cmp(b));
            let n = s.len().max(1) as f64;
            // At most ~1000 points per curve, cut at the axis' end.
            let step = (s.len() / 1000).max(1);
            let points = s.iter().enumerate().step_by(step).map(|(i, x)| (x.min(xmax), (i + 1) as f64 / n)).collect();
            Line { label, points, color: COLORS[k % COLORS.len()], dashed: false }
        })
        .collect();
    plot::save(
        path,
        &Chart {
            title: "latency distribution",
            xdesc: "one-way latency (µs), 8 bytes",
            ydesc: "fraction of round trips at or below",
            x: 0.0..xmax,
            ymax: 1.0,
            xticks: (0..=steps).map(|k| xmax * k as f64 / steps as f64).collect(),
            xlabel: &|v| format!("{v:.0}"),
            ylabel: &|v| format!("{v:.1}"),
            legend: SeriesLabelPosition::LowerRight,
            lines,
        },
    )
}

/// The start of report.md: the median bandwidth of every configuration
/// (`results`: MTU label, cores, MB/s per operation and size) over `passes`
/// passes and the ceilings (`c1k`, `c4k`, payload MB/s); writes sweep.csv
/// and bandwidth_{write,read,send}.png into `dir`.
pub(super) fn sweep_section(
    dir: &std::path::Path,
    passes: usize,
    sizes: &[usize],
    results: &[(&str, Cores, Sweep)],
    (c1k, c4k): (f64, f64),
) -> Result<String> {
    let ceilings = vec![("raw AF_XDP ceiling, MTU 1024 frames".to_string(), c1k), ("raw AF_XDP ceiling, MTU 4096 frames".to_string(), c4k)];
    let mut md = String::from("# urnic benchmark report\n\n");
    let _ = writeln!(
        md,
        "Bandwidth (MB/s, 10^6 bytes per second) between two namespaces over veth, by message size, median of {passes} passes \
         over every point (each pass runs every configuration once); 200..20,000 iterations per point (about 64 MiB), 128 \
         outstanding. 1 core: both devices run-to-completion on one thread; 2 cores: device A on the application's thread, \
         device B on a second thread.\n"
    );
    let mut csv = String::from("op,mtu,cores,size,mbps\n");
    for op in BwOp::ALL {
        let _ = writeln!(md, "## {} bandwidth\n", op.name().to_uppercase());
        let series: Vec<(String, Vec<f64>)> = results
            .iter()
            .map(|(l, c, s)| (format!("{l}, {}", c.label()), s.iter().find(|(o, _)| *o == op).map(|x| x.1.clone()).unwrap_or_default()))
            .collect();
        md.push_str("| size |");
        for (l, _) in &series {
            let _ = write!(md, " {l} |");
        }
        md.push_str("\n|---|");
        md.push_str(&"---|".repeat(series.len()));
        md.push('\n');
        for (i, s) in sizes.iter().enumerate() {
            let _ = write!(md, "| {} |", size_label(*s));
            for (_, v) in &series {
                let _ = write!(md, " {:.0} |", v[i]);
            }
            md.push('\n');
        }
        md.push('\n');
        for (l, c, s) in results {
            if let Some((_, v)) = s.iter().find(|(o, _)| *o == op) {
                for (i, size) in sizes.iter().enumerate() {
                    let _ = writeln!(csv, "{},{},{},{size},{:.1}", op.name(), &l[4..], if *c == Cores::One { 1 } else { 2 }, v[i]);
                }
            }
        }
        let title = format!("RDMA {} bandwidth", op.name().to_uppercase());
        plot_bandwidth(&title, sizes, &series, &ceilings, &dir.join(format!("bandwidth_{}.png", op.name())))?;
    }
    let _ = writeln!(
        md,
        "Raw AF_XDP ceilings (payload MB/s, the better of one thread sending and receiving and a sender plus a receiver thread, \
         median of the passes): {c1k:.0} at MTU 1024 frames, {c4k:.0} at MTU 4096 frames (dashed lines in the plots).\n"
    );
    std::fs::write(dir.join("sweep.csv"), csv).with_context(|| format!("{}/sweep.csv", dir.display()))?;
    Ok(md)
}

/// The rest of report.md: the baselines' table `s` after the sweeps' `md`;
/// writes latency.png and report.md into `dir` and prints the report.
pub(super) fn finish(dir: &std::path::Path, mut md: String, s: &Summary) -> Result<()> {
    md.push_str("## Against the baselines (same veth, same run, medians)\n\n");
    md.push_str(&s.table);
    md.push_str("\nlatency.png: distribution (CDF) of the 8-byte one-way latencies of all runs.\n");
    plot_latency(&s.latency, &dir.join("latency.png"))?;
    std::fs::write(dir.join("report.md"), &md).with_context(|| format!("{}/report.md", dir.display()))?;
    crate::out::outln!("{md}")?;
    crate::out::outln!("written: {}", dir.display())?;
    Ok(())
}
/// A ratio cell: the median `m` of the per-run ratios, their range, and the
/// target if the row has one (the issue's, in the same words as the README).
fn ratio_cell(m: f64, (lo, hi): (f64, f64), target: Option<&str>) -> String {
    match target {
        Some(t) => format!("{m:.2} (runs {lo:.2}..{hi:.2}; target {t})"),
        None => format!("{m:.2} (runs {lo:.2}..{hi:.2})"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::c_path::c_path_table;
    use super::*;

    #[test]
    fn c_path_rows_pair_c_with_rust_run_by_run_or_say_why_they_are_missing() {
        // C / Rust per run: 0.9, 1.0, 0.5 -> median 0.9, range 0.50..1.00.
        let mk = |c: f64, rust: f64| CPathRun {
            rate: (c * 1e6, rust * 1e6),
            bw: (c * 100.0, rust * 100.0),
            lat_p50: (2.0 * c, 2.0 * rust),
            write_lat_p50: (3.0 * c, 3.0 * rust),
        };
        let t = c_path_table(&[mk(0.9, 1.0), mk(1.0, 1.0), mk(0.5, 1.0)]);
        let rate = t.lines().find(|l| l.contains("message rate")).expect("rate row");
        assert!(rate.ends_with("| 0.900 M/s | 1.000 M/s | 0.90 | 0.50..1.00 | >= 0.9 |"), "{rate}");
        let lat = t.lines().find(|l| l.contains("ib_send_lat")).expect("latency row");
        assert!(lat.ends_with("| 1.80 us | 2.00 us | 0.90 | 0.50..1.00 | <= 1.1 |"), "{lat}");
        let wlat = t.lines().find(|l| l.contains("ib_write_lat")).expect("WRITE latency row");
        assert!(wlat.ends_with("| 2.70 us | 3.00 us | 0.90 | 0.50..1.00 | - |"), "{wlat}");
        let with = Run { c_path: Some(mk(1.0, 1.0)), ..Run::default() };
        assert!(summarize(&[with])
            .table
            .contains("| C path: ib_write_bw -s 65536 vs urnic perf write-bw -s 65536, bandwidth | 100 MiB/s | 100 MiB/s | 1.00 (runs 1.00..1.00; target >= 0.9) |"));
        let without = Run { c_path_skipped: Some("libibverbs.so.1 is not built".into()), ..Run::default() };
        assert!(summarize(&[without]).table.contains("not measured: libibverbs.so.1 is not built"));
    }

    #[test]
    fn two_core_rows_also_face_the_reading_ceiling() {
        let mut r = Run::default();
        r.urnic[1].write_64k = 600.0;
        r.raw_1k[1] = 800e6 / 1024.0;
        r.raw_1k_read = 640e6 / 1024.0;
        r.urnic[1].write_64k_mtu4096 = 1000.0;
        r.raw_4k[1] = 1600e6 / 4096.0;
        r.raw_4k_read = 1000e6 / 4096.0;
        let s = summarize(&[r]);
        let row = |start: &str| s.table.lines().find(|l| l.starts_with(start)).unwrap_or_else(|| panic!("no row {start}:\n{}", s.table)).to_string();
        let r1 = row("| 64 KiB WRITE, MTU 1024, 2 cores vs the raw ceiling whose receiver reads every byte");
        assert!(r1.ends_with("| 600 MB/s | 640 MB/s | 0.94 (runs 0.94..0.94) |"), "{r1}");
        let r4 = row("| 64 KiB WRITE, MTU 4096, 2 cores vs the raw ceiling whose receiver reads every byte");
        assert!(r4.ends_with("| 1000 MB/s | 1000 MB/s | 1.00 (runs 1.00..1.00) |"), "{r4}");
        let plain = row("| 64 KiB WRITE, MTU 4096 (9000-byte veth), 2 cores vs raw AF_XDP ceiling");
        assert!(plain.ends_with("| 1000 MB/s | 1600 MB/s | 0.62 (runs 0.62..0.62; target >= 0.95 in every run) |"), "{plain}");
        assert!(!s.table.contains("1 core vs the raw ceiling whose receiver reads"), "one core has no reading ceiling");
    }

    #[test]
    fn ratios_pair_urnic_with_its_baseline_run_by_run() {
        // urnic/raw per run: 100/200, 300/400, 50/50 -> ratios 0.5, 0.75, 1.0
        // (median 0.75), while the ratio of the medians would be 100/200.
        let mk = |urnic: f64, raw_mbs: f64| {
            let mut r = Run::default();
            r.urnic[0].write_64k = urnic;
            r.raw_1k[0] = raw_mbs * 1e6 / 1024.0;
            r
        };
        let s = summarize(&[mk(100.0, 200.0), mk(300.0, 400.0), mk(50.0, 50.0)]);
        let row = s.table.lines().find(|l| l.starts_with("| 64 KiB WRITE, MTU 1024, 1 core vs raw")).expect("row");
        assert!(row.ends_with("| 100 MB/s | 200 MB/s | 0.75 (runs 0.50..1.00; target >= 0.85) |"), "{row}");
    }

    #[test]
    fn report_figures_are_drawn() {
        // URNIC_PLOT_DIR keeps them to look at.
        let keep = std::env::var_os("URNIC_PLOT_DIR").map(std::path::PathBuf::from);
        let dir = keep.clone().unwrap_or_else(|| std::env::temp_dir().join(format!("urnic-report-plot-test-{}", std::process::id())));
        std::fs::create_dir_all(&dir).unwrap();
        let sizes = [64usize, 256, 1024, 4096, 16384, 65536, 262_144, 1 << 20];
        let series: Vec<(String, Vec<f64>)> =
            (1..=4).map(|k| (format!("MTU 1024, {k} cores"), sizes.iter().map(|&s| 500.0 * k as f64 * (s as f64).log2() / 20.0).collect())).collect();
        let ceilings = vec![("raw AF_XDP ceiling, MTU 1024 frames".to_string(), 2500.0), ("raw AF_XDP ceiling, MTU 4096 frames".to_string(), 4100.0)];
        plot_bandwidth("RDMA WRITE bandwidth", &sizes, &series, &ceilings, &dir.join("bandwidth.png")).unwrap();
        let lat: Vec<(String, Vec<f64>)> =
            (1..=3).map(|k| (format!("series {k}"), (0..3000).map(|i| 5.0 * k as f64 + (i % 100) as f64 / 10.0).collect())).collect();
        plot_latency(&lat, &dir.join("latency.png")).unwrap();
        for f in ["bandwidth.png", "latency.png"] {
            let bytes = std::fs::read(dir.join(f)).unwrap();
            assert!(bytes.len() > 10_000 && &bytes[1..4] == b"PNG", "{f}: {} bytes", bytes.len());
        }
        if keep.is_none() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    #[test]
    fn size_labels() {
        assert_eq!(size_label(64), "64");
        assert_eq!(size_label(65536), "64K");
        assert_eq!(size_label(1 << 20), "1M");
    }
}
