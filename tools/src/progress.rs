//! Progress of long work (`urnic bench`) on stderr: what is being measured
//! now and how far the whole is. On a terminal an indicatif bar (position,
//! elapsed time, estimate of the rest, the current step); otherwise one
//! plain line per step (`bench [3/58] urnic, 1 core: 64 KiB WRITE, MTU 1024`),
//! which logs and CI keep.

use std::cell::Cell;
use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Steps of known number.
pub struct Progress {
    what: &'static str,
    total: u64,
    done: Cell<u64>,
    bar: Option<ProgressBar>,
}

impl Progress {
    /// `total` steps of `what` (the line prefix).
    pub fn new(what: &'static str, total: u64) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template("{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} (about {eta} left)\n  {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar.set_prefix(what);
            bar
        });
        Progress { what, total, done: Cell::new(0), bar }
    }

    /// The next step begins: say what it measures.
    pub fn step(&self, label: impl std::fmt::Display) {
        let n = self.done.get() + 1;
        self.done.set(n);
        match &self.bar {
            Some(bar) => {
                bar.set_position(n - 1);
                bar.set_message(label.to_string());
            }
            None => eprintln!("{} [{n}/{}] {label}", self.what, self.total),
        }
    }

    /// A line of results between the steps (above the bar on a terminal).
    pub fn println(&self, line: impl AsRef<str>) {
        match &self.bar {
            Some(bar) => bar.println(line.as_ref()),
            None => eprintln!("{}", line.as_ref()),
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}
