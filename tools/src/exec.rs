//! `urnic exec [--pcap FILE] [--drop P] [--stats[=DIR]] -- PROGRAM ARGS…`:
//! run an ibverbs program on urnic. urnic's libibverbs.so.1 (built by
//! `bash ibverbs-abi/link.sh release` into `target/release/urnic-lib`) goes
//! first on `LD_LIBRARY_PATH`, so the program's libibverbs is urnic's and
//! its devices are `urnic-<ifname>`; the options travel as the environment
//! variables the library reads when the program opens a device
//! (`URNIC_PCAP`, `URNIC_DROP`, `URNIC_STATS`). Then urnic becomes the
//! program (`execvp`): its signals, its exit code.
//!
//! Counters: the library publishes every device's counters while it is
//! open, into /run/urnic by default; `urnic stat` (in another terminal)
//! shows them live. `--stats=DIR` publishes into DIR instead (then `urnic
//! stat --dir DIR`); `URNIC_STATS=0` in the environment turns it off.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};

/// Options of `urnic exec`.
#[derive(clap::Args, Debug)]
pub struct ExecArgs {
    /// Capture every frame of the program's urnic device into FILE (pcap);
    /// a second device of the program gets `FILE.<device>`.
    #[arg(long, value_name = "FILE")]
    pcap: Option<PathBuf>,
    /// Test impairment: the XDP program drops this share (0..1) of the RoCE
    /// frames the program's devices receive.
    #[arg(long, value_name = "P", value_parser = crate::probability)]
    drop: Option<f64>,
    /// Publish the devices' live counters into DIR (default /run/urnic,
    /// where the library publishes anyway) and say how to watch them
    /// (`urnic stat`).
    #[arg(long, value_name = "DIR", num_args = 0..=1, require_equals = true, default_missing_value = crate::stat::STAT_DIR)]
    stats: Option<PathBuf>,
    /// The program and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "PROGRAM")]
    program: Vec<OsString>,
}

/// The directory holding urnic's libibverbs.so.1: `$URNIC_LIB_DIR`, or
/// `urnic-lib` next to this executable (`target/<profile>/urnic-lib` beside
/// `target/<profile>/urnic`).
pub(crate) fn lib_dir() -> Result<PathBuf> {
    let (dir, how) = match std::env::var_os("URNIC_LIB_DIR").filter(|v| !v.is_empty()) {
        Some(d) => (PathBuf::from(d), "URNIC_LIB_DIR"),
        None => {
            let exe = std::env::current_exe().context("finding the urnic executable")?;
            let exe = exe.canonicalize().unwrap_or(exe);
            (exe.parent().map(|p| p.join("urnic-lib")).context("the urnic executable has no directory")?, "next to the urnic executable")
        }
    };
    if dir.join("libibverbs.so.1").is_file() {
        return Ok(dir.canonicalize().unwrap_or(dir));
    }
    // The profile is the executable's directory's name (target/release/urnic).
    let profile = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()))
        .filter(|p| p == "release" || p == "debug")
        .unwrap_or_else(|| "release".into());
    bail!(
        "urnic's libibverbs.so.1 is not in {} ({how}): build it with `bash ibverbs-abi/link.sh {profile}` in the urnic tree, \
         or set URNIC_LIB_DIR to the directory holding it",
        dir.display()
    )
}

/// `dir` in front of `old` (a `:`-separated path list), once.
fn prepend(dir: &Path, old: Option<OsString>) -> OsString {
    let mut v = OsString::from(dir);
    if let Some(old) = old.filter(|o| !o.is_empty()) {
        v.push(":");
        v.push(old);
    }
    v
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Become the program. Returns only on failure.
pub fn run(a: &ExecArgs) -> Result<()> {
    let lib = lib_dir()?;
    let (program, args) = a.program.split_first().context("no program to run")?;
    let mut cmd = std::process::Command::new(program);
    cmd.args(args);
    cmd.env("LD_LIBRARY_PATH", prepend(&lib, std::env::var_os("LD_LIBRARY_PATH")));
    // Absolute paths: the program may change directory before it opens a device.
    if let Some(f) = &a.pcap {
        cmd.env("URNIC_PCAP", absolute(f));
    }
    if let Some(p) = a.drop {
        cmd.env("URNIC_DROP", p.to_string());
    }
    if let Some(d) = &a.stats {
        let d = absolute(d);
        eprintln!("urnic exec: live counters in {}: watch them with `urnic stat --dir {}`", d.display(), d.display());
        cmd.env("URNIC_STATS", d);
    }
    tracing::debug!(lib = %lib.display(), program = ?program, "exec");
    let e = cmd.exec();
    let code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
    eprintln!("urnic exec: {}: {e}", program.to_string_lossy());
    std::process::exit(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_path_goes_first() {
        let d = Path::new("/opt/urnic-lib");
        assert_eq!(prepend(d, None), OsString::from("/opt/urnic-lib"));
        assert_eq!(prepend(d, Some("".into())), OsString::from("/opt/urnic-lib"));
        assert_eq!(prepend(d, Some("/a:/b".into())), OsString::from("/opt/urnic-lib:/a:/b"));
    }
}
