//! Ctrl-C (SIGINT) and SIGTERM: clean up what this process made, then exit
//! with 130 or 143 as a shell reports a process killed by them.
//!
//! The two signals are blocked in the main thread before any other thread
//! starts (threads inherit the mask; `Command` resets it in children), and
//! one thread waits for them with `sigwait`. It runs in ordinary thread
//! context, so it may take locks, run `ip` and exit: it removes the
//! counter files this process publishes for `urnic stat`, stops whatever
//! runs inside the network namespaces this process made (iperf3 servers of
//! `urnic bench`) and deletes those namespaces, then exits. The kernel
//! releases the rest at exit (AF_XDP sockets, the XDP programs' BPF links).
//! `urnic soak` handles the two signals itself (it stops, drains and prints
//! its summary) and does not use this module's handler.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Set when a signal's cleanup has begun: from then on the main thread's
/// failures are its consequences (a namespace deleted under a command that
/// was still using it), and the signal thread decides the exit status.
static CLEANING_UP: AtomicBool = AtomicBool::new(false);

/// Whether a SIGINT/SIGTERM cleanup is under way (the handler will exit the
/// process with 130/143).
pub fn cleaning_up() -> bool {
    CLEANING_UP.load(Ordering::SeqCst)
}

/// Wait for the signal thread to finish its cleanup and exit the process.
pub fn wait_for_signal_exit() -> ! {
    loop {
        std::thread::park();
    }
}

/// Counter files this process publishes (removed on exit and on signals).
static STAT_FILES: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Remember a published counter file, to remove it at exit.
pub fn remember_stat_file(path: PathBuf) {
    if let Ok(mut v) = STAT_FILES.lock() {
        v.push(path);
    }
}

/// Remove the counter files this process published. The publisher removes
/// a file when its device closes, but only on its next tick (250 ms): a
/// process that exits right after closing its device would leave it.
pub fn remove_stat_files() {
    let files: Vec<PathBuf> = STAT_FILES.lock().map(|mut v| std::mem::take(&mut *v)).unwrap_or_default();
    for f in files {
        let _ = std::fs::remove_file(&f);
    }
}

fn signal_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        set
    }
}

/// Block SIGINT and SIGTERM and start the thread that handles them. Call
/// from the main thread before any other thread exists.
pub fn install() -> std::io::Result<()> {
    let set = signal_set();
    // SAFETY: `set` is a valid, initialised signal set.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    std::thread::Builder::new().name("urnic-signals".into()).spawn(move || loop {
        let mut sig: libc::c_int = 0;
        // SAFETY: `set` is initialised, `sig` is a valid out-pointer.
        if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
            continue;
        }
        let name = if sig == libc::SIGINT { "SIGINT" } else { "SIGTERM" };
        CLEANING_UP.store(true, Ordering::SeqCst);
        tracing::debug!("{name}: cleaning up");
        let files: Vec<PathBuf> = STAT_FILES.lock().map(|v| v.clone()).unwrap_or_default();
        let remove = |files: &[PathBuf]| {
            for f in files {
                let _ = std::fs::remove_file(f);
            }
        };
        remove(&files);
        let removed = remove_own_namespaces();
        if !removed.is_empty() {
            tracing::debug!("{name}: deleted network namespaces {}", removed.join(", "));
        }
        // A publisher thread may have rewritten a file while the
        // namespaces were being deleted (it ticks every 250 ms): again,
        // right before exit.
        remove(&files);
        std::process::exit(128 + sig);
    })?;
    Ok(())
}

/// Stop the processes inside this process's `urnic-<tag>-<pid>-<n>-<x>`
/// namespaces (`VethPair`, `Segment`) and delete the namespaces.
fn remove_own_namespaces() -> Vec<String> {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/run/netns") else { return Vec::new() };
    let mut removed = Vec::new();
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        // The PID is third from the end, as netns::VethPair names them.
        let owner = name.strip_prefix("urnic-").and_then(|r| r.rsplit('-').nth(2)).and_then(|p| p.parse::<u32>().ok());
        if owner != Some(me) {
            continue;
        }
        if let Ok(o) = std::process::Command::new("ip").args(["netns", "pids", &name]).output() {
            for p in String::from_utf8_lossy(&o.stdout).split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
                if p as u32 != me {
                    // SAFETY: kill has no memory preconditions; p runs in our namespace.
                    unsafe { libc::kill(p, libc::SIGTERM) };
                }
            }
        }
        let ok = std::process::Command::new("ip").args(["netns", "del", &name]).output().is_ok_and(|o| o.status.success());
        if ok {
            removed.push(name);
        }
    }
    removed
}
