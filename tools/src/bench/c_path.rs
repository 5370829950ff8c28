//! What the C path costs: Debian's unmodified perftest (`ib_write_bw`,
//! `ib_send_lat`) on urnic's `libibverbs.so.1` against `urnic perf` with the
//! same parameters, between the same two namespaces, in one run. Each side
//! is a server process in one namespace and a client in the other, each
//! with its own urnic device; the figures are the programs' own result rows
//! (the same perftest format from both). The C and Rust runs of each
//! measure are bracketed C, Rust, Rust, C, so the host's fast and slow
//! phases (PLATFORM.md) weigh on both alike; the ratio is C / Rust.
//!
//! Parameters: 64-byte WRITEs (message rate) and 64 KiB WRITEs (bandwidth),
//! `-x 1`, perftest's default depth (128) and one QP on both sides;
//! `ib_send_lat -s 8` as users run it (perftest inlines an 8-byte SEND)
//! against `urnic perf send-lat -s 8`; `ib_write_lat -s 8` (whose program
//! spins on memory between its CQ polls, so the library's datapath thread
//! must place the peer's WRITE) against `urnic perf write-lat -s 8`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use urnic_datapath::netns::VethPair;

use super::metrics::{median, spread};
use crate::progress::Progress;

/// 64-byte WRITEs per message-rate measurement (about a second here).
const RATE_ITERS: &str = "200000";
/// 64 KiB WRITEs per bandwidth measurement (about a second here).
const BW_ITERS: &str = "10000";
/// Ping-pongs per latency measurement.
const LAT_ITERS: &str = "10000";
/// The perftest exchange's TCP port.
const PORT: u16 = 18515;

/// One run's figures, each (C, Rust) as the bracket's means.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct CPathRun {
    /// 64 B WRITE message rate, messages per second.
    pub(super) rate: (f64, f64),
    /// 64 KiB WRITE bandwidth, MiB/s (perftest's "MB/sec", which `urnic
    /// perf` prints in the same unit).
    pub(super) bw: (f64, f64),
    /// 8 B SEND latency p50 (perftest's t_typical), µs one-way.
    pub(super) lat_p50: (f64, f64),
    /// 8 B WRITE latency p50 (t_typical), µs one-way.
    pub(super) write_lat_p50: (f64, f64),
}

/// Progress steps of one [`c_path`] (four bracketed measures of four).
pub(super) const STEPS: u64 = 16;

/// Why the C-path rows cannot be measured here, if they cannot: urnic's
/// library not built, or perftest missing. `Ok(lib_dir)` otherwise.
pub(super) fn ready() -> Result<PathBuf> {
    let lib = crate::exec::lib_dir()?;
    for prog in ["ib_write_bw", "ib_send_lat", "ib_write_lat"] {
        let found = Command::new("sh").arg("-c").arg(format!("command -v {prog}")).output().is_ok_and(|o| o.status.success());
        if !found {
            bail!("{prog} is missing: apt-get install perftest (deploy/deps.sh test installs it)");
        }
    }
    Ok(lib)
}

/// Which implementation runs a measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    /// Debian's perftest program on urnic's libibverbs.so.1.
    C,
    /// `urnic perf` (this executable).
    Rust,
}

/// The numbers of perftest's result rows (`#bytes #iterations ...`): lines
/// made only of numbers, at least four.
pub(super) fn perftest_rows(out: &str) -> Vec<Vec<f64>> {
    out.lines()
        .filter_map(|l| {
            let nums: Result<Vec<f64>, _> = l.split_whitespace().map(str::parse::<f64>).collect();
            nums.ok().filter(|n| n.len() >= 4)
        })
        .collect()
}

/// Column `col` of the single result row of `size`-byte messages.
fn figure(out: &str, size: f64, col: usize, what: &str) -> Result<f64> {
    let rows = perftest_rows(out);
    let row = rows.iter().find(|r| r[0] == size).with_context(|| format!("{what}: no result row for {size} bytes in:\n{out}"))?;
    row.get(col).copied().with_context(|| format!("{what}: result row without column {col}: {row:?}"))
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// The two namespaces and how to start each side's programs in them.
struct Lab<'a> {
    pair: &'a VethPair,
    lib: &'a Path,
    urnic: PathBuf,
    p: &'a Progress,
}

/// Attempts per measurement: on this shared host a run can fail (a QP
/// exceeding its retries while the cores are taken by others); such a run
/// is repeated, and said so, rather than ending the bench.
const ATTEMPTS: usize = 3;

impl Lab<'_> {
    /// `args` of `side`'s program in namespace `end` (0 client, 1 server).
    fn command(&self, side: Side, end: usize, prog: &str, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.pair.ns[end]]);
        match side {
            Side::C => {
                c.arg("env")
                    .arg(format!("LD_LIBRARY_PATH={}", self.lib.display()))
                    .arg(format!("URNIC_DEVICES={}", self.pair.ifname[end]))
                    .arg(prog)
                    .args(["-x", "1", "-p", &PORT.to_string()]);
            }
            Side::Rust => {
                let test = match prog {
                    "ib_write_bw" => "write-bw",
                    "ib_write_lat" => "write-lat",
                    _ => "send-lat",
                };
                c.arg(&self.urnic).args(["perf", test, "-d", &self.pair.ifname[end], "-x", "1", "-p", &PORT.to_string()]);
            }
        }
        c.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    }

    /// Wait until the server listens on the exchange port (bounded: a
    /// server that never listens has failed).
    fn wait_listening(&self, server: &mut Child) -> Result<()> {
        let start = Instant::now();
        loop {
            let out = Command::new("ip")
                .args(["netns", "exec", &self.pair.ns[1], "ss", "-Hltn", &format!("sport = :{PORT}")])
                .output()
                .context("ss (iproute2)")?;
            if !String::from_utf8_lossy(&out.stdout).trim().is_empty() {
                return Ok(());
            }
            if let Some(st) = server.try_wait()? {
                bail!("the server exited ({st}) before listening on port {PORT}");
            }
            if start.elapsed() > Duration::from_secs(60) {
                bail!("the server did not listen on port {PORT} within 60 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Run a server and its client with `args` on `side` (up to
    /// [`ATTEMPTS`] times, each failure reported); the client's output.
    fn run(&self, side: Side, prog: &str, args: &[&str]) -> Result<String> {
        let mut attempt = 1;
        loop {
            match self.run_once(side, prog, args) {
                Ok(out) => return Ok(out),
                Err(e) if attempt < ATTEMPTS => {
                    let first =
                        format!("{e:#}").lines().find(|l| l.contains("Failed status") || l.contains("failed")).unwrap_or("").trim().to_string();
                    self.p.println(format!("C path: {side:?} {prog} {} failed (attempt {attempt} of {ATTEMPTS}), repeated: {first}", args.join(" ")));
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn run_once(&self, side: Side, prog: &str, args: &[&str]) -> Result<String> {
        let what = format!("{side:?} {prog} {}", args.join(" "));
        let mut server = self.command(side, 1, prog, args).spawn().with_context(|| format!("{what}: starting the server"))?;
        if let Err(e) = self.wait_listening(&mut server) {
            let _ = server.kill();
            let o = server.wait_with_output();
            return Err(e).with_context(|| format!("{what}: {}", o.map(|o| text(&o)).unwrap_or_default()));
        }
        let ip = self.pair.ipv4[1].map(|b| b.to_string()).join(".");
        let client = self.command(side, 0, prog, &[args, &[ip.as_str()]].concat()).output().with_context(|| format!("{what}: the client"));
        // The server ends with its client; a hung one is stopped.
        let start = Instant::now();
        while server.try_wait()?.is_none() && start.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if server.try_wait()?.is_none() {
            let _ = server.kill();
        }
        let so = server.wait_with_output().with_context(|| format!("{what}: the server"))?;
        let co = client?;
        if !co.status.success() || !so.status.success() {
            bail!("{what} failed (client {}, server {}):\n{}\n--- server:\n{}", co.status, so.status, text(&co), text(&so));
        }
        Ok(text(&co))
    }
}

/// The veth's ends must be up (carrier) before a library device lists them.
fn wait_carrier(pair: &VethPair) -> Result<()> {
    for end in 0..2 {
        let start = Instant::now();
        loop {
            let out = Command::new("ip").args(["-n", &pair.ns[end], "-o", "link", "show", &pair.ifname[end]]).output().context("ip link")?;
            if String::from_utf8_lossy(&out.stdout).contains("state UP") {
                break;
            }
            if start.elapsed() > Duration::from_secs(30) {
                bail!("{} never came up", pair.ifname[end]);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(())
}

/// Measure C then Rust then Rust then C; the two means.
fn bracketed(p: &Progress, label: &str, mut measure: impl FnMut(Side) -> Result<f64>) -> Result<(f64, f64)> {
    let mut c = 0.0;
    let mut r = 0.0;
    for side in [Side::C, Side::Rust, Side::Rust, Side::C] {
        let who = if side == Side::C { "perftest on urnic's libibverbs" } else { "urnic perf" };
        p.step(format_args!("C path: {label}, {who}"));
        let v = measure(side)?;
        if side == Side::C {
            c += v / 2.0;
        } else {
            r += v / 2.0;
        }
    }
    Ok((c, r))
}

/// One run of the three measures on `pair` with the library in `lib`.
pub(super) fn c_path(pair: &VethPair, lib: &Path, p: &Progress) -> Result<CPathRun> {
    wait_carrier(pair)?;
    let urnic = std::env::current_exe().context("finding the urnic executable")?;
    let lab = Lab { pair, lib, urnic, p };
    // Result rows: #bytes #iterations BW-peak BW-average[MB/s] MsgRate[Mpps].
    let rate = bracketed(p, "64 B WRITE message rate", |s| {
        Ok(figure(&lab.run(s, "ib_write_bw", &["-s", "64", "-n", RATE_ITERS])?, 64.0, 4, "64 B WRITE")? * 1e6)
    })?;
    let bw = bracketed(p, "64 KiB WRITE bandwidth", |s| {
        figure(&lab.run(s, "ib_write_bw", &["-s", "65536", "-n", BW_ITERS])?, 65536.0, 3, "64 KiB WRITE")
    })?;
    // #bytes #iterations t_min t_max t_typical ...: t_typical is the median.
    let lat_p50 =
        bracketed(p, "8 B SEND latency", |s| figure(&lab.run(s, "ib_send_lat", &["-s", "8", "-n", LAT_ITERS])?, 8.0, 4, "8 B SEND latency"))?;
    let write_lat_p50 =
        bracketed(p, "8 B WRITE latency", |s| figure(&lab.run(s, "ib_write_lat", &["-s", "8", "-n", LAT_ITERS])?, 8.0, 4, "8 B WRITE latency"))?;
    Ok(CPathRun { rate, bw, lat_p50, write_lat_p50 })
}

/// `urnic bench --c-path`: only these measures, `n` runs, each on fresh
/// namespaces; per-run ratios, their median and range.
pub fn run_only(n: usize) -> Result<()> {
    let lib = ready()?;
    let p = Progress::new("bench", STEPS * n.max(1) as u64);
    let mut all = Vec::new();
    for i in 0..n.max(1) {
        let _ = VethPair::sweep_stale();
        let pair = VethPair::create("cpath", 1500).context("namespaces (root)")?;
        let r = c_path(&pair, &lib, &p)?;
        p.println(format!(
            "run {}: 64 B WRITE {:.3}/{:.3} Mpps, 64 KiB WRITE {:.0}/{:.0} MiB/s, 8 B SEND p50 {:.2}/{:.2} us, 8 B WRITE p50 {:.2}/{:.2} us (C/Rust)",
            i + 1,
            r.rate.0 / 1e6,
            r.rate.1 / 1e6,
            r.bw.0,
            r.bw.1,
            r.lat_p50.0,
            r.lat_p50.1,
            r.write_lat_p50.0,
            r.write_lat_p50.1
        ));
        all.push(r);
    }
    drop(p);
    crate::out::outln!("{}", c_path_table(&all))?;
    Ok(())
}

/// One C-path row: the C program's figure, urnic perf's, and the per-run
/// C / Rust ratios (median, lowest, highest).
pub(super) struct CPathRow {
    pub(super) measure: String,
    pub(super) c: String,
    pub(super) rust: String,
    pub(super) ratio: f64,
    pub(super) range: (f64, f64),
    /// The target: at least (bandwidth) or at most (latency);
    /// `None` where the issue sets none.
    pub(super) target: Option<&'static str>,
}

/// The three C-path rows over `runs` (medians; ratios paired run by run).
pub(super) fn c_path_rows(runs: &[CPathRun]) -> Vec<CPathRow> {
    let med = |f: &dyn Fn(&CPathRun) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>());
    let range = |f: &dyn Fn(&CPathRun) -> f64| spread(&runs.iter().map(f).collect::<Vec<_>>());
    let mk = |measure: &str, f: &dyn Fn(&CPathRun) -> (f64, f64), fmt: &dyn Fn(f64) -> String, target| {
        let ratio = |r: &CPathRun| f(r).0 / f(r).1;
        CPathRow {
            measure: measure.to_string(),
            c: fmt(med(&|r| f(r).0)),
            rust: fmt(med(&|r| f(r).1)),
            ratio: med(&ratio),
            range: range(&ratio),
            target,
        }
    };
    vec![
        mk(
            "C path: ib_write_bw -s 64 (Debian's perftest on urnic's libibverbs.so.1) vs urnic perf write-bw -s 64, message rate",
            &|r| r.rate,
            &|v| format!("{:.3} M/s", v / 1e6),
            Some(">= 0.9"),
        ),
        mk("C path: ib_write_bw -s 65536 vs urnic perf write-bw -s 65536, bandwidth", &|r| r.bw, &|v| format!("{v:.0} MiB/s"), Some(">= 0.9")),
        mk(
            "C path: ib_send_lat -s 8 vs urnic perf send-lat -s 8, p50 (t_typical, one-way)",
            &|r| r.lat_p50,
            &|v| format!("{v:.2} us"),
            Some("<= 1.1"),
        ),
        mk("C path: ib_write_lat -s 8 vs urnic perf write-lat -s 8, p50 (t_typical, one-way)", &|r| r.write_lat_p50, &|v| format!("{v:.2} us"), None),
    ]
}

/// The table of `urnic bench --c-path`.
pub(super) fn c_path_table(runs: &[CPathRun]) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "| measure (medians of {} runs, same veth, C and Rust bracketed C-R-R-C) | C (perftest) | Rust (urnic perf) | C / Rust (median of per-run ratios) | range | target |",
        runs.len()
    );
    t.push_str("|---|---|---|---|---|---|\n");
    for r in c_path_rows(runs) {
        let _ = writeln!(
            t,
            "| {} | {} | {} | {:.2} | {:.2}..{:.2} | {} |",
            r.measure,
            r.c,
            r.rust,
            r.ratio,
            r.range.0,
            r.range.1,
            r.target.unwrap_or("-")
        );
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    const WRITE_BW: &str = "\
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 64         200000           16.10              15.87  \t\t   0.247969
---------------------------------------------------------------------------------------
";
    const SEND_LAT: &str = "\
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] 
 8       10000          4.21           61.02        5.13     \t       5.30    \t0.91   \t\t8.40    \t\t20.13   
";

    #[test]
    fn reads_perftest_result_rows() {
        assert_eq!(figure(WRITE_BW, 64.0, 4, "rate").unwrap(), 0.247969);
        assert_eq!(figure(WRITE_BW, 64.0, 3, "bw").unwrap(), 15.87);
        assert_eq!(figure(SEND_LAT, 8.0, 4, "lat").unwrap(), 5.13);
        assert!(figure(WRITE_BW, 65536.0, 3, "bw").is_err(), "no row of that size");
        assert!(figure("no numbers here\n 1 2\n", 1.0, 3, "x").is_err());
    }
}
