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
/// closes, when this process exits or is interrupted, and by `urnic stat`
/// once the process is gone.
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

/// The PID in a published file's name (`<device>.<pid>.stat`, or its
/// `.stat.tmp` while being rewritten).
fn pid_of(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".stat").or_else(|| name.strip_suffix(".stat.tmp"))?;
    stem.rsplit('.').next()?.parse().ok()
}

fn running(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Print the counters of the devices that run now, from `dir`. Files of
/// processes that no longer run (killed before they could remove them) are
/// left out and deleted.
pub fn run(dir: &Path, all: bool) -> Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!("no urnic device is running ({} does not exist)", dir.display()),
        Err(e) => return Err(e).with_context(|| dir.display().to_string()),
    };
    let mut files = Vec::new();
    for p in entries.flatten().map(|e| e.path()) {
        let Some(pid) = pid_of(&p) else { continue };
        if !running(pid) {
            match std::fs::remove_file(&p) {
                Ok(()) => tracing::debug!("removed {} (process {pid} is gone)", p.display()),
                Err(e) => tracing::debug!("{} (process {pid} is gone): not removed: {e}", p.display()),
            }
            continue;
        }
        if p.extension().is_some_and(|x| x == "stat") {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_from_file_names() {
        assert_eq!(pid_of(Path::new("/run/urnic/urnic-eth0.1234.stat")), Some(1234));
        assert_eq!(pid_of(Path::new("/run/urnic/urnic-eth0.100.77.stat")), Some(77));
        assert_eq!(pid_of(Path::new("/run/urnic/urnic-eth0.77.stat.tmp")), Some(77));
        assert_eq!(pid_of(Path::new("/run/urnic/notes.txt")), None);
        assert_eq!(pid_of(Path::new("/run/urnic/x.stat")), None);
    }
}
