//! A small PNG plotter for the reports (`urnic bench --report`, `urnic
//! dcqcn-sim`): an RGB canvas with lines, a 5×7 bitmap font for labels, and
//! panels with tick labels, axis titles and a legend. No plotting crate: the
//! figures need lines and text, nothing more.

use std::path::Path;

use anyhow::Context as _;

/// Canvas width, pixels.
pub(crate) const W: usize = 1000;
/// Canvas height, pixels.
pub(crate) const H: usize = 600;
/// Series colours (matplotlib's tab10).
pub(crate) const COLORS: [[u8; 3]; 8] =
    [[31, 119, 180], [255, 127, 14], [44, 160, 44], [214, 39, 40], [148, 103, 189], [140, 86, 75], [227, 119, 194], [127, 127, 127]];
/// Black.
pub(crate) const BLACK: [u8; 3] = [0, 0, 0];

/// An RGB image, white to start with.
pub(crate) struct Canvas {
    px: Vec<u8>,
}

/// Font scale: each font pixel is SCALE×SCALE canvas pixels.
const SCALE: i64 = 2;
/// Horizontal advance per character, canvas pixels.
pub(crate) const CHAR_W: i64 = 6 * SCALE;
/// Line height, canvas pixels.
pub(crate) const CHAR_H: i64 = 8 * SCALE;

/// 5×7 glyph rows, top to bottom, bit 4 the leftmost column.
fn glyph(c: char) -> [u8; 7] {
    match c.to_ascii_uppercase() {
        '0' => [0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E],
        '1' => [0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E],
        '2' => [0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F],
        '3' => [0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E],
        '4' => [0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02],
        '5' => [0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E],
        '6' => [0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E],
        '7' => [0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08],
        '8' => [0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E],
        '9' => [0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C],
        'A' => [0x0E, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11],
        'B' => [0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E],
        'C' => [0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E],
        'D' => [0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C],
        'E' => [0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F],
        'F' => [0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10],
        'G' => [0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F],
        'H' => [0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11],
        'I' => [0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E],
        'J' => [0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C],
        'K' => [0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11],
        'L' => [0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F],
        'M' => [0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11],
        'N' => [0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11],
        'O' => [0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E],
        'P' => [0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10],
        'Q' => [0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D],
        'R' => [0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11],
        'S' => [0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E],
        'T' => [0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04],
        'U' => [0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E],
        'V' => [0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04],
        'W' => [0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A],
        'X' => [0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11],
        'Y' => [0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04],
        'Z' => [0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F],
        'µ' => [0x00, 0x11, 0x11, 0x11, 0x13, 0x1D, 0x10],
        '.' => [0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C],
        ',' => [0x00, 0x00, 0x00, 0x00, 0x0C, 0x04, 0x08],
        '-' => [0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00],
        '+' => [0x00, 0x04, 0x04, 0x1F, 0x04, 0x04, 0x00],
        '=' => [0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00],
        '/' => [0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00],
        '(' => [0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02],
        ')' => [0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08],
        ':' => [0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00],
        '%' => [0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03],
        '_' => [0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1F],
        // Space, and anything the font lacks, prints blank.
        _ => [0; 7],
    }
}

impl Canvas {
    /// A white canvas of W×H.
    pub(crate) fn new() -> Canvas {
        Canvas { px: vec![255; W * H * 3] }
    }

    fn dot(&mut self, x: i64, y: i64, c: [u8; 3]) {
        if (0..W as i64).contains(&x) && (0..H as i64).contains(&y) {
            let i = (y as usize * W + x as usize) * 3;
            self.px[i..i + 3].copy_from_slice(&c);
        }
    }

    /// A one-pixel line (Bresenham).
    pub(crate) fn line(&mut self, (x0, y0): (i64, i64), (x1, y1): (i64, i64), c: [u8; 3]) {
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

    /// A two-pixel-wide line, for data series.
    pub(crate) fn thick_line(&mut self, a: (i64, i64), b: (i64, i64), c: [u8; 3]) {
        self.line(a, b, c);
        self.line((a.0, a.1 + 1), (b.0, b.1 + 1), c);
    }

    /// A dashed horizontal or sloped line.
    pub(crate) fn dashed_line(&mut self, (x0, y0): (i64, i64), (x1, y1): (i64, i64), c: [u8; 3]) {
        let len = (((x1 - x0).pow(2) + (y1 - y0).pow(2)) as f64).sqrt().max(1.0);
        let mut t = 0.0;
        while t < len {
            let t2 = (t + 6.0).min(len);
            let p = |t: f64| (x0 + ((x1 - x0) as f64 * t / len).round() as i64, y0 + ((y1 - y0) as f64 * t / len).round() as i64);
            self.line(p(t), p(t2), c);
            t += 12.0;
        }
    }

    /// Text with its top-left corner at (x, y).
    pub(crate) fn text(&mut self, x: i64, y: i64, s: &str, c: [u8; 3]) {
        for (i, ch) in s.chars().enumerate() {
            let g = glyph(ch);
            let ox = x + i as i64 * CHAR_W;
            for (row, bits) in g.iter().enumerate() {
                for col in 0..5 {
                    if bits & (0x10 >> col) != 0 {
                        for dy in 0..SCALE {
                            for dx in 0..SCALE {
                                self.dot(ox + col * SCALE + dx, y + row as i64 * SCALE + dy, c);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Width of `s` in canvas pixels.
    pub(crate) fn text_width(s: &str) -> i64 {
        s.chars().count() as i64 * CHAR_W
    }

    /// Write the canvas as an 8-bit RGB PNG.
    pub(crate) fn save(&self, path: &Path) -> anyhow::Result<()> {
        let f = std::fs::File::create(path).with_context(|| path.display().to_string())?;
        let mut enc = png::Encoder::new(std::io::BufWriter::new(f), W as u32, H as u32);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc.write_header().with_context(|| format!("{}: PNG header", path.display()))?;
        w.write_image_data(&self.px).with_context(|| format!("{}: PNG data", path.display()))
    }
}

/// A panel: area (x0, y0, x1, y1) in pixels, data ranges from 0 to
/// (xmax, ymax), light grid.
pub(crate) struct Panel {
    pub(crate) area: (i64, i64, i64, i64),
    pub(crate) xmax: f64,
    pub(crate) ymax: f64,
}

impl Panel {
    /// Grid (tenths) and the two axes.
    pub(crate) fn frame(&self, c: &mut Canvas) {
        let (x0, y0, x1, y1) = self.area;
        for k in 0..=10 {
            let gx = x0 + (x1 - x0) * k / 10;
            let gy = y0 + (y1 - y0) * k / 10;
            c.line((gx, y0), (gx, y1), [230, 230, 230]);
            c.line((x0, gy), (x1, gy), [230, 230, 230]);
        }
        c.line((x0, y1), (x1, y1), BLACK);
        c.line((x0, y0), (x0, y1), BLACK);
    }

    /// Pixel of data point (x, y), clamped to the panel.
    pub(crate) fn at(&self, x: f64, y: f64) -> (i64, i64) {
        let (x0, y0, x1, y1) = self.area;
        let px = x0 as f64 + (x / self.xmax).clamp(0.0, 1.0) * (x1 - x0) as f64;
        let py = y1 as f64 - (y / self.ymax).clamp(0.0, 1.0) * (y1 - y0) as f64;
        (px.round() as i64, py.round() as i64)
    }

    /// Tick labels on both axes (data value, label), the axis titles (x
    /// below, y above the axis) and a title above the panel.
    pub(crate) fn label(&self, c: &mut Canvas, xticks: &[(f64, String)], yticks: &[(f64, String)], xtitle: &str, ytitle: &str, title: &str) {
        let (x0, y0, x1, y1) = self.area;
        for (v, l) in xticks {
            let (px, _) = self.at(*v, 0.0);
            c.line((px, y1), (px, y1 + 4), BLACK);
            c.text(px - Canvas::text_width(l) / 2, y1 + 7, l, BLACK);
        }
        for (v, l) in yticks {
            let (_, py) = self.at(0.0, *v);
            c.line((x0 - 4, py), (x0, py), BLACK);
            c.text(x0 - 7 - Canvas::text_width(l), py - CHAR_H / 2 + 1, l, BLACK);
        }
        c.text((x0 + x1) / 2 - Canvas::text_width(xtitle) / 2, y1 + 8 + CHAR_H, xtitle, BLACK);
        c.text(x0 - 40, y0 - 2 * CHAR_H - 2, ytitle, BLACK);
        c.text(x1 - Canvas::text_width(title), y0 - CHAR_H - 4, title, BLACK);
    }

    /// A legend box at the panel's top-left (inside): one line per entry,
    /// a colour sample (dashed if the flag is set) and the label.
    pub(crate) fn legend(&self, c: &mut Canvas, entries: &[(String, [u8; 3], bool)]) {
        let (x0, y0, _, _) = self.area;
        Self::legend_at(c, entries, x0 + 12, y0 + 8);
    }

    /// The legend in the panel's bottom-right corner (where rising curves,
    /// such as CDFs, leave room).
    pub(crate) fn legend_bottom_right(&self, c: &mut Canvas, entries: &[(String, [u8; 3], bool)]) {
        let (_, _, x1, y1) = self.area;
        let width = entries.iter().map(|(l, _, _)| Canvas::text_width(l)).max().unwrap_or(0) + 38;
        let height = entries.len() as i64 * (CHAR_H + 4);
        Self::legend_at(c, entries, x1 - width - 12, y1 - height - 8);
    }

    fn legend_at(c: &mut Canvas, entries: &[(String, [u8; 3], bool)], x: i64, y: i64) {
        let mut y = y;
        for (label, col, dashed) in entries {
            let mid = y + CHAR_H / 2 - 2;
            if *dashed {
                c.dashed_line((x, mid), (x + 30, mid), *col);
            } else {
                c.thick_line((x, mid), (x + 30, mid), *col);
            }
            c.text(x + 38, y, label, *col);
            y += CHAR_H + 4;
        }
    }
}

/// Evenly spaced ticks 0..=max with `n` steps, labelled with `fmt`.
pub(crate) fn linear_ticks(max: f64, n: usize, fmt: impl Fn(f64) -> String) -> Vec<(f64, String)> {
    (0..=n).map(|k| max * k as f64 / n as f64).map(|v| (v, fmt(v))).collect()
}

/// A "nice" axis maximum at or above `v`: 1, 2, 2.5 or 5 times a power of ten.
pub(crate) fn nice_max(v: f64) -> f64 {
    if !(v.is_finite() && v > 0.0) {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * p).find(|m| *m >= v).unwrap_or(10.0 * p)
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
    fn text_sets_pixels_inside_the_glyph_box_only() {
        let mut c = Canvas::new();
        c.text(10, 10, "8", BLACK);
        let dark = |x: usize, y: usize| c.px[(y * W + x) * 3] == 0;
        // The top bar of an 8 (columns 1..=3 of row 0) is set, its corners are not.
        assert!(dark(10 + SCALE as usize, 10));
        assert!(!dark(10, 10));
        let inked = (0..H).flat_map(|y| (0..W).map(move |x| (x, y))).filter(|&(x, y)| dark(x, y)).count();
        assert!(inked > 0);
        assert!((0..H).all(|y| (0..W).all(|x| !dark(x, y) || ((10..10 + CHAR_W as usize).contains(&x) && (10..10 + CHAR_H as usize).contains(&y)))));
    }
}
