//! `urnic dcqcn-sim`: the DCQCN simulations (rocev2::sim::dcqcn) with their
//! time series as CSV and PNG plots: per-flow rate (top) and bottleneck
//! queue (bottom) over time.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use rocev2::sim::dcqcn::{run, FlowSpec, Outcome, Scenario};

use crate::plot::{linear_ticks, nice_max, Canvas, Panel, BLACK, COLORS, H, W};

fn plot(out: &Outcome, sc: &Scenario, path: &Path) -> anyhow::Result<()> {
    let mut c = Canvas::new();
    let tmax = sc.duration.as_secs_f64() * 1e6;
    let top = Panel { area: (90, 30, W as i64 - 20, 300), xmax: tmax, ymax: nice_max(sc.link_mbps * 1.05) };
    let qmax = out.samples.iter().map(|s| s.queue).max().unwrap_or(1).max(sc.red.kmax) as f64 * 1.1;
    let bottom = Panel { area: (90, 360, W as i64 - 20, H as i64 - 50), xmax: tmax, ymax: nice_max(qmax) };
    top.frame(&mut c);
    bottom.frame(&mut c);
    let ms = |v: f64| format!("{:.0}", v / 1e3);
    top.label(&mut c, &linear_ticks(tmax, 5, ms), &linear_ticks(top.ymax, 4, |v| format!("{:.0}", v / 1e3)), "", "GBIT/S", "RATE OF EACH FLOW");
    bottom.label(
        &mut c,
        &linear_ticks(tmax, 5, ms),
        &linear_ticks(bottom.ymax, 4, |v| format!("{:.0}", v / 1e3)),
        "TIME (MS)",
        "KB",
        "BOTTLENECK QUEUE, RED DASHED: KMIN, KMAX",
    );
    // Kmin and Kmax as dashed red lines.
    for k in [sc.red.kmin, sc.red.kmax] {
        c.dashed_line(bottom.at(0.0, k as f64), bottom.at(tmax, k as f64), [200, 0, 0]);
    }
    let flows = out.samples.first().map_or(0, |s| s.rate_mbps.len());
    for f in 0..flows {
        let col = COLORS[f % COLORS.len()];
        for w in out.samples.windows(2) {
            c.line(top.at(w[0].t_us, w[0].rate_mbps[f]), top.at(w[1].t_us, w[1].rate_mbps[f]), col);
        }
    }
    for w in out.samples.windows(2) {
        c.line(bottom.at(w[0].t_us, w[0].queue as f64), bottom.at(w[1].t_us, w[1].queue as f64), BLACK);
    }
    c.save(path)
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
        plot(&out, sc, &dir.join(format!("{name}.png")))?;
        csv(&out, &dir.join(format!("{name}.csv")))?;
    }
    let d = dir.display();
    crate::out::outln!("plots and time series in {d} (top: each flow's rate, 0..line rate; bottom: bottleneck queue, red: Kmin and Kmax)")?;
    Ok(())
}
