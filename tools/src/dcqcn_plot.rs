//! `urnic dcqcn-sim`: the DCQCN simulations (rocev2::sim::dcqcn) with their
//! time series as CSV and PNG plots: per-flow rate (top) and bottleneck
//! queue (bottom) over time.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use rocev2::sim::dcqcn::{run, FlowSpec, Outcome, Scenario};

use plotters::prelude::{RGBColor, SeriesLabelPosition, BLACK};

use crate::plot::{nice_max, save_stacked, Chart, Line, COLORS};

fn plot(name: &str, out: &Outcome, sc: &Scenario, path: &Path) -> anyhow::Result<()> {
    let tmax = sc.duration.as_secs_f64() * 1e6;
    let qmax = out.samples.iter().map(|s| s.queue).max().unwrap_or(1).max(sc.red.kmax) as f64 * 1.1;
    let flows = out.samples.first().map_or(0, |s| s.rate_mbps.len());
    // One legend entry per colour: flows whose colour repeats share it
    // ("flows 1, 9"), the rest of them unlabelled.
    let names: Vec<String> = (0..flows)
        .map(|f| match f {
            f if f >= COLORS.len() => String::new(),
            f if flows > COLORS.len() => {
                let same: Vec<String> = (f..flows).step_by(COLORS.len()).map(|g| (g + 1).to_string()).collect();
                format!("flows {}", same.join(", "))
            }
            f => format!("flow {}", f + 1),
        })
        .collect();
    let rates = (0..flows)
        .map(|f| Line {
            label: &names[f],
            points: out.samples.iter().map(|s| (s.t_us, s.rate_mbps[f])).collect(),
            color: COLORS[f % COLORS.len()],
            dashed: false,
        })
        .collect();
    let queue_points = out.samples.iter().map(|s| (s.t_us, s.queue as f64)).collect();
    let mut queue = vec![Line { label: "queue", points: queue_points, color: BLACK, dashed: false }];
    for (label, k) in [("RED marking: Kmin, Kmax", sc.red.kmin), ("", sc.red.kmax)] {
        queue.push(Line { label, points: vec![(0.0, k as f64), (tmax, k as f64)], color: RGBColor(200, 0, 0), dashed: true });
    }
    let ms = |v: f64| format!("{:.0}", v / 1e3);
    let top = Chart {
        title: &format!("{name}: rate of each flow"),
        xdesc: "time (ms)",
        ydesc: "rate (Gbit/s)",
        x: 0.0..tmax,
        ymax: nice_max(sc.link_mbps * 1.05),
        xticks: Vec::new(),
        xlabel: &ms,
        ylabel: &|v| format!("{:.0}", v / 1e3),
        legend: SeriesLabelPosition::UpperRight,
        lines: rates,
    };
    // The legend where the queue is not: it stays high without DCQCN.
    let late_high = out.samples.iter().filter(|s| s.t_us > tmax * 0.6).any(|s| s.queue as f64 > nice_max(qmax) * 0.6);
    let bottom = Chart {
        title: &format!("{name}: bottleneck queue"),
        xdesc: "time (ms)",
        ydesc: "queue (KB)",
        x: 0.0..tmax,
        ymax: nice_max(qmax),
        xticks: Vec::new(),
        xlabel: &ms,
        ylabel: &|v| format!("{:.0}", v / 1e3),
        legend: if late_high { SeriesLabelPosition::LowerRight } else { SeriesLabelPosition::UpperRight },
        lines: queue,
    };
    save_stacked(path, &[top, bottom])
}

fn csv(out: &Outcome, path: &Path) -> anyhow::Result<()> {
    let mut s = String::from("t_us,queue_bytes");
    let n = out.samples.first().map_or(0, |x| x.rate_mbps.len());
    for i in 0..n {
        s.push_str(&format!(",rate{i}_mbps,goodput{i}_mbps"));
    }
    s.push('\n');
    for x in &out.samples {
        s.push_str(&format!("{:.1},{}", x.t_us, x.queue));
        for i in 0..n {
            s.push_str(&format!(",{:.1},{:.1}", x.rate_mbps[i], x.goodput_mbps[i]));
        }
        s.push('\n');
    }
    std::fs::write(path, s).with_context(|| path.display().to_string())
}

/// Run every scenario, write `DIR/<name>.png` and `.csv`, print a summary.
pub fn run_all(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    let mut scenarios: Vec<(String, Scenario)> = Vec::new();
    for n in [2usize, 4, 8, 16] {
        scenarios.push((format!("incast-{n}"), Scenario::incast(n)));
    }
    let mut jl = Scenario::incast(2);
    jl.duration = Duration::from_millis(120);
    jl.flows =
        vec![FlowSpec { start: Duration::ZERO, stop: None }, FlowSpec { start: Duration::from_millis(30), stop: Some(Duration::from_millis(80)) }];
    scenarios.push(("join-leave".into(), jl));
    let mut off = Scenario::incast(4);
    off.params.enabled = false;
    off.buffer = 2 << 20;
    scenarios.push(("incast-4-dcqcn-off".into(), off));
    crate::out::outln!("{:<20} {:>12} {:>10} {:>12} {:>12} {:>8} {:>8}", "scenario", "goodput", "Jain", "queue max", "queue mean", "drops", "CNPs")?;
    for (name, sc) in &scenarios {
        let out = run(sc);
        let end = sc.duration.as_secs_f64() * 1e6;
        let g = out.mean_goodput(end / 2.0, end);
        let total: f64 = g.iter().sum();
        let active: Vec<f64> = g.iter().copied().filter(|v| *v > 0.0).collect();
        let jain = active.iter().sum::<f64>().powi(2) / (active.len() as f64 * active.iter().map(|v| v * v).sum::<f64>());
        let (qmax, qmean) = out.queue_stats(end / 2.0, end);
        crate::out::outln!("{name:<20} {:>9.0} Mb/s {jain:>10.3} {:>10} B {:>10.0} B {:>8} {:>8}", total, qmax, qmean, out.drops, out.cnps)?;
        plot(name, &out, sc, &dir.join(format!("{name}.png")))?;
        csv(&out, &dir.join(format!("{name}.csv")))?;
    }
    let d = dir.display();
    crate::out::outln!("plots and time series in {d} (top: each flow's rate, 0..line rate; bottom: bottleneck queue, red: Kmin and Kmax)")?;
    Ok(())
}
