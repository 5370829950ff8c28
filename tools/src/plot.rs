//! PNG figures of the reports (`urnic bench --report`, `urnic dcqcn-sim`),
//! drawn with plotters: axes with tick labels and titles inside the image,
//! a legend per panel.
//!
//! Text needs a TrueType font, read at run time (plotters' `ab_glyph`
//! backend, no C libraries): DejaVu Sans (Debian's fonts-dejavu-core) or
//! whatever `fc-match sans-serif` names; `URNIC_FONT=FILE.ttf` picks one.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{anyhow, bail, Context as _, Result};
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::{FontStyle, RGBColor};

/// Image size, pixels.
pub const SIZE: (u32, u32) = (1000, 600);

/// Series colours (matplotlib's tab10).
pub const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// The font family the charts ask for (registered by [`fonts`]).
pub const FONT: &str = "sans-serif";

fn font_file() -> Option<PathBuf> {
    if let Some(f) = std::env::var_os("URNIC_FONT") {
        return Some(PathBuf::from(f));
    }
    let known = ["/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", "/usr/share/fonts/TTF/DejaVuSans.ttf", "/usr/share/fonts/dejavu/DejaVuSans.ttf"];
    if let Some(p) = known.iter().map(PathBuf::from).find(|p| p.is_file()) {
        return Some(p);
    }
    let out = std::process::Command::new("fc-match").args(["-f", "%{file}", "sans-serif:fontformat=TrueType"]).output().ok()?;
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    p.is_file().then_some(p)
}

/// Register the font once per process.
pub fn fonts() -> Result<()> {
    static DONE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let file = font_file().ok_or("no TrueType font found for the plots: install fonts-dejavu-core, or set URNIC_FONT=FILE.ttf")?;
        let bytes = std::fs::read(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        // plotters keeps the font for the life of the process.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font(FONT, FontStyle::Normal, bytes).map_err(|_| format!("{}: not a usable TrueType font", file.display()))
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

/// A "nice" axis maximum at or above `v`: 1, 2, 2.5 or 5 times a power of ten.
pub fn nice_max(v: f64) -> f64 {
    if !(v.is_finite() && v > 0.0) {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * p).find(|m| *m >= v).unwrap_or(10.0 * p)
}

/// A drawing error as anyhow (plotters' errors borrow the backend's).
pub fn err<E: std::fmt::Debug>(path: &Path) -> impl Fn(E) -> anyhow::Error + '_ {
    move |e| anyhow!("{}: drawing: {e:?}", path.display())
}

/// One line of a chart: label, points, colour, dashed.
pub struct Line<'a> {
    /// Legend text (empty: not in the legend).
    pub label: &'a str,
    /// (x, y) in data units.
    pub points: Vec<(f64, f64)>,
    /// Colour.
    pub color: RGBColor,
    /// Dashed (reference lines: ceilings, thresholds).
    pub dashed: bool,
}

/// A single-panel chart: title, axis titles, x ticks at `xticks` labelled
/// by `xlabel` (nice ticks when none are given), y from 0 to `ymax`,
/// legend at `legend`.
pub struct Chart<'a> {
    /// Title above the panel.
    pub title: &'a str,
    /// X axis title.
    pub xdesc: &'a str,
    /// Y axis title.
    pub ydesc: &'a str,
    /// X range.
    pub x: std::ops::Range<f64>,
    /// Y maximum.
    pub ymax: f64,
    /// Ticks to label on x (empty: automatic).
    pub xticks: Vec<f64>,
    /// X tick labels.
    pub xlabel: &'a dyn Fn(f64) -> String,
    /// Y tick labels.
    pub ylabel: &'a dyn Fn(f64) -> String,
    /// Where the legend goes.
    pub legend: SeriesLabelPosition,
    /// The lines.
    pub lines: Vec<Line<'a>>,
}

/// Ticks at a "nice" step (1, 2, 2.5 or 5 times a power of ten) covering
/// `range`, about `n` of them.
pub fn nice_ticks(range: &std::ops::Range<f64>, n: usize) -> Vec<f64> {
    let span = range.end - range.start;
    if !(span.is_finite() && span > 0.0) || n == 0 {
        return vec![range.start];
    }
    let step = nice_max(span / n as f64);
    let first = (range.start / step).ceil() as i64;
    let last = (range.end / step + 1e-9).floor() as i64;
    (first..=last).map(|k| k as f64 * step).collect()
}

/// An f64 axis with its ticks where we say (plotters' own key points
/// land between a log2 axis' sizes).
#[derive(Clone)]
struct Ticked {
    range: std::ops::Range<f64>,
    ticks: Vec<f64>,
}

impl Ranged for Ticked {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        RangedCoordf64::from(self.range.clone()).map(v, limit)
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        // Every tick if they fit, else every k-th.
        let k = self.ticks.len().div_ceil(hint.max_num_points().max(1)).max(1);
        self.ticks.iter().copied().step_by(k).collect()
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.range.clone()
    }
}

type Coords = Cartesian2d<Ticked, RangedCoordf64>;

impl Chart<'_> {
    /// Draw into `area`.
    pub fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, plotters::coord::Shift>) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing {}: {e:?}", self.title);
        let xticks = if self.xticks.is_empty() { nice_ticks(&self.x, 8) } else { self.xticks.clone() };
        let mut c: ChartContext<'_, DB, Coords> = ChartBuilder::on(area)
            .caption(self.title, (FONT, 20))
            .margin(12)
            .margin_right(36)
            .x_label_area_size(48)
            .y_label_area_size(80)
            .build_cartesian_2d(Ticked { range: self.x.clone(), ticks: xticks.clone() }, 0f64..self.ymax)
            .map_err(e)?;
        c.configure_mesh()
            .x_desc(self.xdesc)
            .y_desc(self.ydesc)
            .x_labels(xticks.len())
            .x_label_formatter(&|v| (self.xlabel)(*v))
            .y_label_formatter(&|v| (self.ylabel)(*v))
            .label_style((FONT, 15))
            .axis_desc_style((FONT, 16))
            .light_line_style(WHITE)
            .draw()
            .map_err(e)?;
        for l in &self.lines {
            let (color, dashed) = (l.color, l.dashed);
            let style = color.stroke_width(2);
            let ann = if dashed {
                c.draw_series(DashedLineSeries::new(l.points.iter().copied(), 8, 6, style)).map_err(e)?
            } else {
                c.draw_series(LineSeries::new(l.points.iter().copied(), style)).map_err(e)?
            };
            if l.label.is_empty() {
                continue;
            }
            ann.label(l.label).legend(move |(x, y)| {
                // Two segments, with a gap if dashed.
                let s = color.stroke_width(2);
                let gap = if dashed { 5 } else { 0 };
                EmptyElement::at((x, y)) + PathElement::new(vec![(0, 0), (8, 0)], s) + PathElement::new(vec![(8 + gap, 0), (20, 0)], s)
            });
        }
        c.configure_series_labels()
            .position(self.legend.clone())
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(180, 180, 180))
            .label_font((FONT, 15))
            .draw()
            .map_err(e)
    }
}

/// Draw `chart` alone into a PNG at `path`.
pub fn save(path: &Path, chart: &Chart) -> Result<()> {
    fonts()?;
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err(path))?;
    chart.draw(&root)?;
    root.present().map_err(err(path)).with_context(|| format!("writing {}", path.display()))
}

/// Draw `charts` stacked top to bottom into one PNG at `path`.
pub fn save_stacked(path: &Path, charts: &[Chart]) -> Result<()> {
    fonts()?;
    if charts.is_empty() {
        bail!("{}: nothing to draw", path.display());
    }
    let root = BitMapBackend::new(path, (SIZE.0, SIZE.1 + 150 * (charts.len() as u32 - 1))).into_drawing_area();
    root.fill(&WHITE).map_err(err(path))?;
    for (area, chart) in root.split_evenly((charts.len(), 1)).iter().zip(charts) {
        chart.draw(area)?;
    }
    root.present().map_err(err(path)).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_maxima() {
        assert_eq!(nice_max(0.0), 1.0);
        assert_eq!(nice_max(3.2), 5.0);
        assert_eq!(nice_max(1000.0), 1000.0);
        assert_eq!(nice_max(1001.0), 2000.0);
        assert_eq!(nice_max(2062.0), 2500.0);
        assert_eq!(nice_max(0.07), 0.1);
    }

    #[test]
    fn ticks_at_nice_steps() {
        // 120 ms / 8 = 15 ms, rounded up to a nice 20 ms.
        assert_eq!(nice_ticks(&(0.0..120_000.0), 8), (0..=6).map(|k| f64::from(k) * 20_000.0).collect::<Vec<_>>());
        assert_eq!(nice_ticks(&(0.0..10.0), 5), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
    }

    #[test]
    fn a_chart_is_a_png_with_ink() {
        let dir = std::env::temp_dir().join(format!("urnic-plot-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("chart.png");
        let chart = Chart {
            title: "test",
            xdesc: "x",
            ydesc: "y",
            x: 0.0..10.0,
            ymax: 10.0,
            xticks: vec![0.0, 5.0, 10.0],
            xlabel: &|v| format!("{v:.0}"),
            ylabel: &|v| format!("{v:.0}"),
            legend: SeriesLabelPosition::UpperLeft,
            lines: vec![Line { label: "a", points: vec![(0.0, 0.0), (10.0, 10.0)], color: COLORS[0], dashed: false }],
        };
        save(&path, &chart).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        // The series' colour is in the image (decoded: not all white).
        let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).unwrap();
        let px = &buf[..info.buffer_size()];
        assert!(px.chunks(3).any(|p| p == [31, 119, 180]), "no pixel of the series colour");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
