//! `urnic stat`, and the publishing side every tool that opens a device
//! uses: `DIR/<device>.<pid>.stat`, rewritten by the device's publisher
//! every 250 ms while it is open (`urnic::Context::publish_counters`; urnic's
//! libibverbs.so.1 publishes the same files for C programs).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};

use crate::out::outln;

/// Where devices publish by default.
pub const STAT_DIR: &str = "/run/urnic";

/// The directory to publish in: `$URNIC_STATS` (as urnic's libibverbs.so.1
/// reads it; `0` turns publishing off), else [`STAT_DIR`].
pub fn publish_dir() -> Option<PathBuf> {
    match std::env::var_os("URNIC_STATS") {
        Some(v) if v == "0" => None,
        Some(v) if !v.is_empty() => Some(PathBuf::from(v)),
        _ => Some(PathBuf::from(STAT_DIR)),
    }
}

/// Publish `ctx`'s counters for `urnic stat` (best effort: a read-only
/// /run does not stop a benchmark); the file is removed when the device
/// closes, when this process exits or is interrupted, and, once the process
/// is gone, by `urnic stat` or the next device that publishes.
pub fn publish(ctx: &urnic::Context) {
    let Some(dir) = publish_dir() else { return };
    match ctx.publish_counters(&dir) {
        Ok(path) => {
            tracing::debug!(device = ctx.name(), path = %path.display(), "publishing counters");
            crate::signals::remember_stat_file(path);
        }
        Err(e) => tracing::debug!(device = ctx.name(), dir = %dir.display(), "not publishing counters: {e}"),
    }
}

/// Print the counters of the devices that run now, from `dir`. Files of
/// processes that no longer run (killed before they could remove them) are
/// left out and deleted.
pub fn run(dir: &Path, all: bool) -> Result<()> {
    for p in urnic::sweep_counter_files(dir) {
        tracing::debug!("removed {} (its process is gone)", p.display());
    }
    // Listed after the sweep: what is left is of processes that run.
    let entries = match std::fs::read_dir(dir) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!("no urnic device is running ({} does not exist)", dir.display()),
        Err(e) => return Err(e).with_context(|| dir.display().to_string()),
    };
    let mut files = Vec::new();
    for p in entries.flatten().map(|e| e.path()) {
        if urnic::counter_file_pid(&p).is_some() && p.extension().is_some_and(|x| x == "stat") {
            files.push(p);
        }
    }
    files.sort();
    if files.is_empty() {
        bail!("no urnic device is running (nothing in {})", dir.display());
    }
    let mut shown = 0;
    for f in files {
        // The device may close between the listing and the read.
        let Ok(text) = std::fs::read_to_string(&f) else { continue };
        outln!("# {}", f.display())?;
        for line in text.lines() {
            if all || !line.ends_with(" 0") {
                outln!("{line}")?;
            }
        }
        shown += 1;
    }
    if shown == 0 {
        bail!("no urnic device is running (the devices in {} closed while being read)", dir.display());
    }
    Ok(())
}
