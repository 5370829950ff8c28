//! `urnic dcqcn-sim`: the DCQCN simulations (rocev2::sim::dcqcn) with their
//! time series as CSV and PNG plots: per-flow rate (top) and bottleneck
//! queue (bottom) over time.

use std::path::Path;
use std::time::Duration;

use rocev2::sim::dcqcn::{run, FlowSpec, Outcome, Scenario};

pub(crate) const W: usize = 1000;
pub(crate) const H: usize = 600;
pub(crate) const COLORS: [[u8; 3]; 8] = [[31, 119, 180], [255, 127, 14], [44, 160, 44], [214, 39, 40], [148, 103, 189], [140, 86, 75], [227, 119, 194], [127, 127, 127]];

pub(crate) struct Canvas {
    px: Vec<u8>,
}

impl Canvas {
    pub(crate) fn new() -> Canvas {
        Canvas { px: vec![255; W * H * 3] }
    }

    fn dot(&mut self, x: i64, y: i64, c: [u8; 3]) {
        if (0..W as i64).contains(&x) && (0..H as i64).contains(&y) {
            let i = (y as usize * W + x as usize) * 3;
            self.px[i..i + 3].copy_from_slice(&c);
        }
    }

    pub(crate) fn line(&mut self, (x0, y0): (i64, i64), (x1, y1): (i64, i64), c: [u8; 3]) {
        // Bresenham.
        let (dx, dy) = ((x1 - x0).abs(), -(y1 - y0).abs());
        let (sx, sy) = (if x0 < x1 { 1 } else { -1 }, if y0 < y1 { 1 } else { -1 });
        let (mut x, mut y, mut err) = (x0, y0, dx + dy);
        loop {
            self.dot(x, y, c);
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    pub(crate) fn save(&self, path: &Path) -> Result<(), String> {
        let f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut enc = png::Encoder::new(std::io::BufWriter::new(f), W as u32, H as u32);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc.write_header().map_err(|e| e.to_string())?;
        w.write_image_data(&self.px).map_err(|e| e.to_string())
    }
}

/// A panel: area (x0, y0, x1, y1) in pixels, data ranges, light grid.
pub(crate) struct Panel {
    pub(crate) area: (i64, i64, i64, i64),
    pub(crate) xmax: f64,
    pub(crate) ymax: f64,
}

impl Panel {
    pub(crate) fn frame(&self, c: &mut Canvas) {
        let (x0, y0, x1, y1) = self.area;
        for k in 0..=10 {
            let gx = x0 + (x1 - x0) * k / 10;
            let gy = y0 + (y1 - y0) * k / 10;
            c.line((gx, y0), (gx, y1), [230, 230, 230]);
            c.line((x0, gy), (x1, gy), [230, 230, 230]);
        }
        c.line((x0, y1), (x1, y1), [0, 0, 0]);
        c.line((x0, y0), (x0, y1), [0, 0, 0]);
    }

    pub(crate) fn at(&self, x: f64, y: f64) -> (i64, i64) {
        let (x0, y0, x1, y1) = self.area;
        let px = x0 as f64 + (x / self.xmax).clamp(0.0, 1.0) * (x1 - x0) as f64;
        let py = y1 as f64 - (y / self.ymax).clamp(0.0, 1.0) * (y1 - y0) as f64;
        (px.round() as i64, py.round() as i64)
    }
}

fn plot(out: &Outcome, sc: &Scenario, path: &Path) -> Result<(), String> {
    let mut c = Canvas::new();
    let tmax = sc.duration.as_secs_f64() * 1e6;
    let top = Panel { area: (50, 20, W as i64 - 20, 360), xmax: tmax, ymax: sc.link_mbps * 1.05 };
    let qmax = out.samples.iter().map(|s| s.queue).max().unwrap_or(1).max(sc.red.kmax) as f64 * 1.1;
    let bottom = Panel { area: (50, 400, W as i64 - 20, H as i64 - 20), xmax: tmax, ymax: qmax };
    top.frame(&mut c);
    bottom.frame(&mut c);
    // Kmin and Kmax as dashed-ish red lines.
    for k in [sc.red.kmin, sc.red.kmax] {
        let (xa, y) = bottom.at(0.0, k as f64);
        let (xb, _) = bottom.at(tmax, k as f64);
        let mut x = xa;
        while x < xb {
            c.line((x, y), ((x + 6).min(xb), y), [200, 0, 0]);
            x += 12;
        }
    }
    let flows = out.samples.first().map_or(0, |s| s.rate_mbps.len());
    for f in 0..flows {
        let col = COLORS[f % COLORS.len()];
        for w in out.samples.windows(2) {
            c.line(top.at(w[0].t_us, w[0].rate_mbps[f]), top.at(w[1].t_us, w[1].rate_mbps[f]), col);
        }
    }
    for w in out.samples.windows(2) {
        c.line(bottom.at(w[0].t_us, w[0].queue as f64), bottom.at(w[1].t_us, w[1].queue as f64), [0, 0, 0]);
    }
    c.save(path)
}

fn csv(out: &Outcome, path: &Path) -> Result<(), String> {
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
    std::fs::write(path, s).map_err(|e| format!("{}: {e}", path.display()))
}

/// Run every scenario, write `DIR/<name>.png` and `.csv`, print a summary.
pub fn run_all(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut scenarios: Vec<(String, Scenario)> = Vec::new();
    for n in [2usize, 4, 8, 16] {
        scenarios.push((format!("incast-{n}"), Scenario::incast(n)));
    }
    let mut jl = Scenario::incast(2);
    jl.duration = Duration::from_millis(120);
    jl.flows = vec![FlowSpec { start: Duration::ZERO, stop: None }, FlowSpec { start: Duration::from_millis(30), stop: Some(Duration::from_millis(80)) }];
    scenarios.push(("join-leave".into(), jl));
    let mut off = Scenario::incast(4);
    off.params.enabled = false;
    off.buffer = 2 << 20;
    scenarios.push(("incast-4-dcqcn-off".into(), off));
    println!("{:<20} {:>12} {:>10} {:>12} {:>12} {:>8} {:>8}", "scenario", "goodput", "Jain", "queue max", "queue mean", "drops", "CNPs");
    for (name, sc) in &scenarios {
        let out = run(sc);
        let end = sc.duration.as_secs_f64() * 1e6;
        let g = out.mean_goodput(end / 2.0, end);
        let total: f64 = g.iter().sum();
        let active: Vec<f64> = g.iter().copied().filter(|v| *v > 0.0).collect();
        let jain = active.iter().sum::<f64>().powi(2) / (active.len() as f64 * active.iter().map(|v| v * v).sum::<f64>());
        let (qmax, qmean) = out.queue_stats(end / 2.0, end);
        println!("{name:<20} {:>9.0} Mb/s {jain:>10.3} {:>10} B {:>10.0} B {:>8} {:>8}", total, qmax, qmean, out.drops, out.cnps);
        plot(&out, sc, &dir.join(format!("{name}.png")))?;
        csv(&out, &dir.join(format!("{name}.csv")))?;
    }
    println!("plots and time series in {} (top: each flow's rate, 0..line rate; bottom: bottleneck queue, red: Kmin and Kmax)", dir.display());
    Ok(())
}
