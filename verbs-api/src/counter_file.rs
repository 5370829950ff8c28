//! The counter files devices publish for `urnic stat`
//! (`DIR/<device>.<pid>.stat`, see `Context::publish_counters`): writing
//! one, removing it as its device closes, and removing those of processes
//! that are gone.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A counter file a device publishes. Its device removes it as it closes
/// ([`CounterFile::remove`]); the publisher rewrites it only while holding
/// `closed` and finding it false, so that no write comes after the removal.
#[derive(Debug)]
pub(crate) struct CounterFile {
    path: PathBuf,
    closed: Mutex<bool>,
}

impl CounterFile {
    /// Write `text` to `path` (atomically, through `<path>.tmp`).
    pub(crate) fn create(path: PathBuf, text: &str) -> std::io::Result<CounterFile> {
        write_atomically(&path, text)?;
        Ok(CounterFile { path, closed: Mutex::new(false) })
    }

    /// Replace the file's text, unless its device has closed; `false` once
    /// it has, or when the write fails (then the publisher stops).
    pub(crate) fn rewrite(&self, text: &str) -> bool {
        let Ok(closed) = self.closed.lock() else { return false };
        !*closed && write_atomically(&self.path, text).is_ok()
    }

    /// The device closes: remove the file, and keep the publisher from
    /// writing it again.
    pub(crate) fn remove(&self) {
        let mut closed = self.closed.lock().unwrap_or_else(|p| p.into_inner());
        *closed = true;
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_file(self.path.with_extension("stat.tmp"));
    }
}

/// The PID in a counter file's name (`<device>.<pid>.stat`, or its
/// `.stat.tmp` while being rewritten); `None` for other files.
pub fn counter_file_pid(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".stat").or_else(|| name.strip_suffix(".stat.tmp"))?;
    stem.rsplit('.').next()?.parse().ok()
}

/// Remove the counter files in `dir` of processes that no longer run
/// (killed before they could remove them, or C programs that exited
/// without closing their devices). Returns the files removed.
pub fn sweep_counter_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut removed = Vec::new();
    for p in entries.flatten().map(|e| e.path()) {
        let Some(pid) = counter_file_pid(&p) else { continue };
        if !Path::new(&format!("/proc/{pid}")).exists() && std::fs::remove_file(&p).is_ok() {
            removed.push(p);
        }
    }
    removed
}

fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("stat.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_from_file_names() {
        assert_eq!(counter_file_pid(Path::new("/run/urnic/urnic-eth0.1234.stat")), Some(1234));
        assert_eq!(counter_file_pid(Path::new("/run/urnic/urnic-eth0.100.77.stat")), Some(77));
        assert_eq!(counter_file_pid(Path::new("/run/urnic/urnic-eth0.77.stat.tmp")), Some(77));
        assert_eq!(counter_file_pid(Path::new("/run/urnic/notes.txt")), None);
        assert_eq!(counter_file_pid(Path::new("/run/urnic/x.stat")), None);
    }

    #[test]
    fn a_removed_file_is_not_written_again_and_only_files_of_gone_processes_are_swept() {
        let dir = std::env::temp_dir().join(format!("urnic-counter-file-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mine = dir.join(format!("urnic-u0.{}.stat", std::process::id()));
        let f = CounterFile::create(mine.clone(), "device urnic-u0\n").unwrap();
        assert!(f.rewrite("device urnic-u0\ndatapath.polls 1\n"));
        assert_eq!(std::fs::read_to_string(&mine).unwrap(), "device urnic-u0\ndatapath.polls 1\n");
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        gone.wait().unwrap();
        let left = dir.join(format!("urnic-u1.{}.stat", gone.id()));
        let left_tmp = dir.join(format!("urnic-u1.{}.stat.tmp", gone.id()));
        let other = dir.join("notes.txt");
        for p in [&left, &left_tmp, &other] {
            std::fs::write(p, "x").unwrap();
        }
        let mut swept = sweep_counter_files(&dir);
        swept.sort();
        assert_eq!(swept, [left, left_tmp]);
        assert!(mine.exists() && other.exists());
        f.remove();
        assert!(!mine.exists());
        assert!(!f.rewrite("late"), "no write after the device closed");
        assert!(!mine.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
