//! Claiming an interface for an AF_XDP port: one urnic device per interface.
//!
//! Before it attaches its XDP program, [`XskPort::open_queues`] makes sure
//! that
//! 1. the calling thread has the privileges the open needs (root, or
//!    `CAP_NET_ADMIN`, `CAP_NET_RAW` and `CAP_BPF`), so that a missing one
//!    is reported as such instead of as whichever system call fails first;
//! 2. no other urnic device holds the interface: an exclusive `flock(2)` on
//!    `/run/urnic/net-<netns inode>-<interface>.lock`, one file per
//!    (network namespace, interface name), held by the ports for as long as
//!    they live. The kernel releases it when the holder closes the device or
//!    dies. A closing holder removes its file while it still holds the lock
//!    (a locker that opened the file before finds it gone after its flock
//!    and starts over). A file left behind by a process that died, or by a
//!    C program that exited without closing its device, is harmless, and
//!    the next claim removes it the same way ([`sweep_stale`]): files of
//!    namespaces that no longer exist would otherwise pile up. A sweep
//!    holds the lock of a file it removes for a moment, as a closing holder
//!    does, so a refused claim tries again for about a quarter second
//!    before it names the holder.
//!    The lock belongs to the open file description, so a second device in
//!    the same process is refused too. Who holds it comes from `/proc/locks`;
//! 3. no XDP program other than urnic's is attached to the interface (the
//!    kernel would refuse ours with a bare "Device or resource busy" or
//!    "File exists").
//!
//! [`XskPort::open_queues`]: super::XskPort::open_queues

use std::ffi::CStr;
use std::fs::{DirBuilder, File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::XskError;

/// Where the interface locks live.
pub const LOCK_DIR: &str = "/run/urnic";

/// The longest single wait of a claim whose lock file is locked, before it
/// names the holder (the waits double from 1 ms: 255 ms in all).
const CLAIM_PATIENCE: Duration = Duration::from_millis(128);

/// Most files a claim opens (each time the one at the path was replaced
/// under it, or locked and waited for).
const MAX_CLAIM_TRIES: u32 = 16;

/// The name urnic's XDP program has in the kernel (`urnic_xdp` in
/// `xdp-prog/src/bpf/urnic.bpf.c`).
const URNIC_PROG_NAME: &str = "urnic_xdp";

// Capability numbers (linux/capability.h).
const CAP_NET_ADMIN: u32 = 12;
const CAP_NET_RAW: u32 = 13;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_BPF: u32 = 39;

/// The privileges an AF_XDP device needs that the calling thread's
/// effective capability set `cap_eff` lacks: `CAP_NET_ADMIN` (attach XDP),
/// `CAP_NET_RAW` (AF_XDP socket), `CAP_BPF` or the older `CAP_SYS_ADMIN`
/// (load the program, create its maps).
fn missing_caps(cap_eff: u64) -> Vec<&'static str> {
    let has = |c: u32| cap_eff & (1u64 << c) != 0;
    let mut missing = Vec::new();
    if !has(CAP_NET_ADMIN) {
        missing.push("CAP_NET_ADMIN");
    }
    if !has(CAP_NET_RAW) {
        missing.push("CAP_NET_RAW");
    }
    if !has(CAP_BPF) && !has(CAP_SYS_ADMIN) {
        missing.push("CAP_BPF");
    }
    missing
}

/// The calling thread's effective capabilities (`CapEff` of
/// `/proc/thread-self/status`; capabilities are per thread).
fn effective_caps() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/thread-self/status").ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?.trim();
    u64::from_str_radix(hex, 16).ok()
}

/// Fail with [`XskError::Permission`] if the calling thread cannot open an
/// AF_XDP device on `ifname`. (Where `/proc` cannot tell, the system calls
/// that follow will.)
pub fn check_privileges(ifname: &str) -> Result<(), XskError> {
    let Some(caps) = effective_caps() else { return Ok(()) };
    let missing = missing_caps(caps);
    if missing.is_empty() {
        return Ok(());
    }
    Err(XskError::Permission(format!(
        "opening an AF_XDP device on {ifname} needs root, or CAP_NET_ADMIN, CAP_NET_RAW and CAP_BPF: this thread lacks {}",
        missing.join(", ")
    )))
}

/// The inode of the calling thread's network namespace.
fn netns_inode() -> io::Result<u64> {
    std::fs::metadata("/proc/thread-self/ns/net").or_else(|_| std::fs::metadata("/proc/self/ns/net")).map(|m| m.ino())
}

/// An exclusive claim on one interface of one network namespace, held until
/// dropped (or the process dies).
#[derive(Debug)]
pub struct InterfaceLock {
    /// Closing it (after `Drop::drop`) releases the flock.
    _file: File,
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl Drop for InterfaceLock {
    /// Remove the lock file while still holding the lock (only if `path`
    /// is still our file), then release it by closing. A locker that opened
    /// the file before the removal finds it gone after its flock and
    /// starts over; a process that dies leaves its (harmless) file behind.
    fn drop(&mut self) {
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == (self.dev, self.ino)) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Open (creating) the lock file. The directory is writable by everyone
/// (as `/run/lock`): never follow a symlink, never block on a FIFO, never
/// write into the file.
fn open_lock_file(path: &Path) -> io::Result<File> {
    let flags = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
    OpenOptions::new().read(true).write(true).create(true).mode(0o644).custom_flags(flags).open(path).or_else(|e| match e.raw_os_error() {
        // Made by another user: opening it to read is enough to lock it.
        Some(libc::EACCES) => OpenOptions::new().read(true).custom_flags(flags).open(path),
        _ => Err(e),
    })
}

/// Whether `path` (not followed) is the file `meta` describes.
fn same_file(path: &Path, meta: &std::fs::Metadata) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == (meta.dev(), meta.ino()))
}

impl InterfaceLock {
    /// Claim `ifname` of the calling thread's network namespace (lock file
    /// under [`LOCK_DIR`]). Fails with [`XskError::InUse`] naming the
    /// holder's PID if another device (of any process, this one included)
    /// holds it.
    pub fn acquire(ifname: &str) -> Result<InterfaceLock, XskError> {
        let ino = netns_inode().map_err(|source| XskError::Io { what: "network namespace of this thread".into(), source })?;
        InterfaceLock::acquire_in(Path::new(LOCK_DIR), ino, ifname)
    }

    /// [`InterfaceLock::acquire`] with the lock directory and the namespace
    /// inode given.
    pub fn acquire_in(dir: &Path, netns_inode: u64, ifname: &str) -> Result<InterfaceLock, XskError> {
        if ifname.is_empty() || ifname.contains(['/', '\0']) || ifname == "." || ifname == ".." {
            return Err(XskError::Config(format!("{ifname:?} is not an interface name")));
        }
        lock_dir(dir)?;
        sweep_stale(dir);
        let path = dir.join(format!("net-{netns_inode}-{ifname}.lock"));
        let io_err = |what: &str, source: io::Error| {
            let what = format!("{what} {}", path.display());
            match source.raw_os_error() {
                Some(libc::EACCES | libc::EPERM) => XskError::Permission(format!("{what}: {source}")),
                _ => XskError::Io { what, source },
            }
        };
        // A refused flock is not yet a holder: another claim's sweep holds
        // a file left behind for the moment it takes to remove it, and a
        // closing holder removes its file before letting go. Try again,
        // waiting 1, 2, 4, ... 128 ms (about a quarter second in all),
        // before naming the holder. A file replaced between our open and
        // flock (its holder closed) is simply opened again.
        let mut wait = Duration::from_millis(1);
        for _ in 0..MAX_CLAIM_TRIES {
            let file = open_lock_file(&path).map_err(|e| io_err("opening lock file", e))?;
            let meta = file.metadata().map_err(|e| io_err("lock file", e))?;
            if !meta.is_file() {
                return Err(XskError::Io { what: format!("lock file {}", path.display()), source: io::Error::other("not a regular file") });
            }
            // SAFETY: flock on a file descriptor we own; no memory involved.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                // Locked, but is it still the file at `path`? Its last
                // holder may have removed it between our open and flock;
                // then whoever opens `path` now makes a new one.
                if same_file(&path, &meta) {
                    return Ok(InterfaceLock { _file: file, path, dev: meta.dev(), ino: meta.ino() });
                }
                continue;
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(io_err("locking", e));
            }
            if wait <= CLAIM_PATIENCE {
                std::thread::sleep(wait);
                wait *= 2;
                continue;
            }
            // The lock may change hands between the refused flock and the
            // look at /proc/locks: then no one is named.
            let pid = lock_holder(meta.dev(), meta.ino());
            let holder = pid.map_or_else(|| format!("lock {}", path.display()), describe);
            return Err(XskError::InUse { ifname: ifname.to_string(), pid, holder });
        }
        Err(XskError::InUse { ifname: ifname.to_string(), pid: None, holder: format!("lock {}", path.display()) })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Remove the lock files in `dir` that no one holds (their holders died or
/// exited without closing their devices), each while holding its lock, as a
/// closing holder does: a claimer that opened such a file just before finds
/// it gone after its own flock and starts over. Files held, of other users
/// (the sticky directory refuses), or not lock files are left alone;
/// nothing here fails a claim. Returns how many were removed.
pub fn sweep_stale(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !(name.starts_with("net-") && name.ends_with(".lock")) {
            continue;
        }
        let path = entry.path();
        let flags = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
        let Ok(file) = OpenOptions::new().read(true).custom_flags(flags).open(&path) else { continue };
        let Ok(meta) = file.metadata() else { continue };
        // SAFETY: flock on a file descriptor we own; no memory involved.
        if !meta.is_file() || unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            continue;
        }
        if same_file(&path, &meta) && std::fs::remove_file(&path).is_ok() {
            removed += 1;
        }
        // Closing `file` releases the lock.
    }
    removed
}

/// Make the lock directory if needed: sticky and writable by everyone like
/// `/run/lock`, so that devices of every user exclude each other.
fn lock_dir(dir: &Path) -> Result<(), XskError> {
    let io_err = |source: io::Error| match source.raw_os_error() {
        Some(libc::EACCES | libc::EPERM | libc::EROFS) => {
            XskError::Permission(format!("creating the interface lock directory {}: {source}", dir.display()))
        }
        _ => XskError::Io { what: format!("interface lock directory {}", dir.display()), source },
    };
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => return Ok(()),
        Ok(_) => return Err(io_err(io::Error::other("exists and is not a directory"))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(e)),
    }
    match DirBuilder::new().recursive(true).mode(0o1777).create(dir) {
        Ok(()) => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777)).map_err(io_err),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(io_err(e)),
    }
}

/// The PID holding a `flock` on the file `(dev, ino)`, from `/proc/locks`
/// (`1: FLOCK  ADVISORY  WRITE 1234 00:1a:5678 0 EOF`; device numbers in hex).
fn lock_holder(dev: u64, ino: u64) -> Option<u32> {
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let want = (u64::from(libc::major(dev)), u64::from(libc::minor(dev)), ino);
    parse_lock_holder(&locks, want)
}

fn parse_lock_holder(locks: &str, (major, minor, ino): (u64, u64, u64)) -> Option<u32> {
    locks.lines().find_map(|line| {
        let t: Vec<&str> = line.split_whitespace().collect();
        // Waiters ("1: -> FLOCK ...") hold nothing.
        if t.get(1) != Some(&"FLOCK") {
            return None;
        }
        let pid: u32 = t.get(4)?.parse().ok()?;
        let mut id = t.get(5)?.split(':');
        let ma = u64::from_str_radix(id.next()?, 16).ok()?;
        let mi = u64::from_str_radix(id.next()?, 16).ok()?;
        let i: u64 = id.next()?.parse().ok()?;
        ((ma, mi, i) == (major, minor, ino) && pid != 0).then_some(pid)
    })
}

/// What process `pid` is: its command line (program name without its
/// directory; or its `comm` name), and whether it is this process.
fn describe(pid: u32) -> String {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok().filter(|c| !c.is_empty());
    let mut what = match cmdline {
        Some(c) => {
            let mut args: Vec<String> = c.split(|&b| b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
            // The program's name without its directory.
            if let Some(exe) = args.first_mut() {
                *exe = exe.rsplit('/').next().unwrap_or_default().to_string();
            }
            args.join(" ")
        }
        None => std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|c| c.trim().to_string()).unwrap_or_else(|_| "exited".into()),
    };
    if what.chars().count() > 120 {
        what = what.chars().take(117).collect::<String>() + "...";
    }
    if pid == std::process::id() {
        what.push_str("; this process");
    }
    what
}

/// The XDP program attached to interface `ifindex` of the calling thread's
/// namespace, if any: `(id, name)`; the name is `None` where the kernel
/// would not show the program (that takes `CAP_SYS_ADMIN`).
fn attached_xdp(ifindex: u32) -> io::Result<Option<(u32, Option<String>)>> {
    use libbpf_rs::libbpf_sys as sys;
    // SAFETY: zeroed is the options struct's default; `sz` says its size.
    let mut q: sys::bpf_xdp_query_opts = unsafe { std::mem::zeroed() };
    q.sz = std::mem::size_of::<sys::bpf_xdp_query_opts>() as _;
    // SAFETY: a valid options struct of the declared size, written by libbpf.
    let r = unsafe { sys::bpf_xdp_query(ifindex as i32, 0, &mut q) };
    if r < 0 {
        return Err(io::Error::from_raw_os_error(-r));
    }
    let id = [q.prog_id, q.drv_prog_id, q.skb_prog_id, q.hw_prog_id].into_iter().find(|&i| i != 0);
    let Some(id) = id else { return Ok(None) };
    // SAFETY: no memory involved; a negative return is an error.
    let fd = unsafe { sys::bpf_prog_get_fd_by_id(id) };
    if fd < 0 {
        return Ok(Some((id, None)));
    }
    // SAFETY: a fresh program fd that we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: zeroed is a valid bpf_prog_info (plain integers and arrays).
    let mut info: sys::bpf_prog_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<sys::bpf_prog_info>() as u32;
    // SAFETY: `info` is writable for `len` bytes; the fd is a program's.
    if unsafe { sys::bpf_prog_get_info_by_fd(fd.as_raw_fd(), &mut info, &mut len) } != 0 {
        return Ok(Some((id, None)));
    }
    let bytes: Vec<u8> = info.name.iter().map(|&c| c as u8).chain(std::iter::once(0)).collect();
    let name = CStr::from_bytes_until_nul(&bytes).ok().map(|s| s.to_string_lossy().into_owned());
    Ok(Some((id, name)))
}

/// Processes that hold the BPF program `prog_id` open (a link or program
/// file descriptor whose fdinfo has the line `prog_id:` TAB `<id>`).
fn program_holders(prog_id: u32) -> Vec<u32> {
    let want = format!("prog_id:\t{prog_id}");
    let Ok(procs) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut pids = Vec::new();
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(fds) = std::fs::read_dir(p.path().join("fdinfo")) else { continue };
        if fds.flatten().any(|f| std::fs::read_to_string(f.path()).is_ok_and(|s| s.lines().any(|l| l == want))) {
            pids.push(pid);
        }
    }
    pids
}

/// Fail with [`XskError::ForeignXdp`] if an XDP program other than urnic's
/// is attached to `ifname` (index `ifindex`), or with [`XskError::InUse`]
/// if urnic's is, attached by a process that holds no interface lock (one
/// without it, or under another `/run`). A failed query passes: attaching
/// will tell.
pub fn check_no_xdp_program(ifname: &str, ifindex: u32) -> Result<(), XskError> {
    let Ok(Some((id, name))) = attached_xdp(ifindex) else { return Ok(()) };
    let holders = program_holders(id);
    let held_by = holders.iter().map(|&p| format!("process {p} ({})", describe(p))).collect::<Vec<_>>().join(", ");
    if name.as_deref() == Some(URNIC_PROG_NAME) {
        return Err(XskError::InUse {
            ifname: ifname.to_string(),
            pid: holders.first().copied(),
            holder: format!("urnic's XDP program id {id} is attached by a process that does not hold {LOCK_DIR}'s lock"),
        });
    }
    let mut program = match name {
        Some(n) => format!("{n:?}, id {id}"),
        None => format!("id {id}"),
    };
    if !held_by.is_empty() {
        program.push_str(&format!(", held by {held_by}"));
    }
    Err(XskError::ForeignXdp { ifname: ifname.to_string(), program })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_capabilities_are_named() {
        let all = (1u64 << CAP_NET_ADMIN) | (1 << CAP_NET_RAW) | (1 << CAP_BPF);
        assert!(missing_caps(all).is_empty());
        assert!(missing_caps(all - (1 << CAP_BPF) + (1 << CAP_SYS_ADMIN)).is_empty(), "CAP_SYS_ADMIN covers BPF");
        assert_eq!(missing_caps(all - (1 << CAP_NET_ADMIN)), ["CAP_NET_ADMIN"]);
        assert_eq!(missing_caps(0), ["CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_BPF"]);
    }

    #[test]
    fn proc_locks_lines_give_the_holder() {
        let locks = "1: POSIX  ADVISORY  WRITE 10 00:1a:77 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 0 fe:00:77 0 EOF\n\
                     3: FLOCK  ADVISORY  WRITE 22157 fe:00:10010795 0 EOF\n\
                     3: -> FLOCK  ADVISORY  WRITE 999 fe:00:10010795 0 EOF\n";
        assert_eq!(parse_lock_holder(locks, (0xfe, 0, 10010795)), Some(22157));
        assert_eq!(parse_lock_holder(locks, (0, 0x1a, 77)), None, "POSIX locks are not ours");
        assert_eq!(parse_lock_holder(locks, (0xfe, 0, 77)), None, "PID 0: not visible here");
        assert_eq!(parse_lock_holder("garbage\n\n1: FLOCK", (0, 0, 0)), None);
    }

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("urnic-lock-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_claim_removes_the_lock_files_no_one_holds_and_only_those() {
        let dir = temp_dir("sweep").join("run-urnic");
        let held = InterfaceLock::acquire_in(&dir, 4026531840, "held0").unwrap();
        // Left behind by processes that died: no one holds them.
        for f in ["net-4026532177-u0.lock", "net-4026532178-u1.lock"] {
            std::fs::write(dir.join(f), b"").unwrap();
        }
        // Not lock files: counters of `urnic stat`, anything else.
        for f in ["bn0.16714.stat", "notes.txt"] {
            std::fs::write(dir.join(f), b"x").unwrap();
        }
        let mine = InterfaceLock::acquire_in(&dir, 4026531840, "new0").unwrap();
        let mut left: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        assert_eq!(left, ["bn0.16714.stat", "net-4026531840-held0.lock", "net-4026531840-new0.lock", "notes.txt"]);
        // The held claim still excludes others.
        assert!(matches!(InterfaceLock::acquire_in(&dir, 4026531840, "held0"), Err(XskError::InUse { .. })));
        assert_eq!(sweep_stale(&dir), 0, "both claims are held");
        drop((held, mine));
        let _ = std::fs::remove_dir_all(dir.parent().unwrap());
    }

    /// Every claim sweeps, and a sweep holds each unheld file's lock for
    /// the moment it takes to remove it: a claimer of that file meanwhile
    /// must wait that moment out, not name the sweeper as the interface's
    /// holder. (Seen in CI: a test that opened a device 30 times in a row
    /// made a qperf in another namespace fail with "in use by" that test's
    /// process; the qperf before it had left its file behind.) A holder
    /// that keeps its lock is still refused.
    #[test]
    fn a_claim_waits_out_a_sweep_of_its_file_but_not_a_holder() {
        let dir = temp_dir("sweeping").join("run-urnic");
        lock_dir(&dir).unwrap();
        let path = dir.join("net-4026532177-u0.lock");
        // A sweep in the middle of removing the file left behind.
        std::fs::write(&path, b"").unwrap();
        let swept = File::open(&path).unwrap();
        // SAFETY: flock on a file descriptor we own.
        assert_eq!(unsafe { libc::flock(swept.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, 0);
        let sweep = {
            let path = path.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(50));
                std::fs::remove_file(&path).unwrap();
                drop(swept);
            })
        };
        let lock = InterfaceLock::acquire_in(&dir, 4026532177, "u0").expect("the sweep lets go at once");
        sweep.join().unwrap();
        assert!(same_file(&path, &lock._file.metadata().unwrap()), "the claim holds the file now at the path");
        // A holder that does not let go is named.
        let e = InterfaceLock::acquire_in(&dir, 4026532177, "u0").unwrap_err();
        assert!(matches!(e, XskError::InUse { pid: Some(p), .. } if p == std::process::id()), "{e:?}");
        drop(lock);
        let _ = std::fs::remove_dir_all(dir.parent().unwrap());
    }

    #[test]
    fn a_second_claim_is_refused_naming_the_holder_until_the_first_is_dropped() {
        let dir = temp_dir("claim").join("run-urnic");
        let first = InterfaceLock::acquire_in(&dir, 4026531840, "veth0").unwrap();
        assert_eq!(first.path(), dir.join("net-4026531840-veth0.lock"));
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777, 0o1777);
        // Same interface name in another namespace: another lock.
        let other_ns = InterfaceLock::acquire_in(&dir, 4026531841, "veth0").unwrap();
        let e = InterfaceLock::acquire_in(&dir, 4026531840, "veth0").unwrap_err();
        let me = std::process::id();
        assert!(matches!(e, XskError::InUse { pid: Some(p), .. } if p == me), "{e:?}");
        let msg = e.to_string();
        assert!(msg.starts_with(&format!("interface veth0 is in use by urnic process {me} (")), "{msg}");
        assert!(msg.ends_with("; this process)"), "{msg}");
        let path = first.path().to_path_buf();
        drop(first);
        assert!(!path.exists(), "a released lock's file is removed");
        let again = InterfaceLock::acquire_in(&dir, 4026531840, "veth0").unwrap();
        drop((again, other_ns));
        // A file left behind by a holder that died is simply locked again.
        std::fs::write(&path, b"").unwrap();
        let after_crash = InterfaceLock::acquire_in(&dir, 4026531840, "veth0").unwrap();
        assert_eq!(after_crash.path(), path);
        drop(after_crash);
        assert!(matches!(InterfaceLock::acquire_in(&dir, 1, "a/b"), Err(XskError::Config(_))));
        let _ = std::fs::remove_dir_all(dir.parent().unwrap());
    }

    /// Load a two-instruction XDP program (`return XDP_PASS`) named
    /// `name` and attach it to `ifindex` in generic mode through a BPF link
    /// (detached when the returned fd closes). Calling thread's namespace.
    fn attach_pass_program(name: &CStr, ifindex: u32) -> io::Result<(OwnedFd, OwnedFd)> {
        use libbpf_rs::libbpf_sys as sys;
        // SAFETY: bpf_insn is plain data; zeroed registers are r0.
        let mut insns: [sys::bpf_insn; 2] = unsafe { std::mem::zeroed() };
        insns[0].code = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K: r0 = imm
        insns[0].imm = 2; // XDP_PASS
        insns[1].code = 0x95; // BPF_JMP | BPF_EXIT
                              // SAFETY: valid NUL-terminated strings and two instructions; NULL options are allowed.
        let prog = unsafe { sys::bpf_prog_load(sys::BPF_PROG_TYPE_XDP, name.as_ptr(), c"GPL".as_ptr(), insns.as_ptr(), 2, std::ptr::null_mut()) };
        if prog < 0 {
            return Err(io::Error::from_raw_os_error(-prog));
        }
        // SAFETY: a fresh fd we own.
        let prog = unsafe { OwnedFd::from_raw_fd(prog) };
        // SAFETY: zeroed is the options' default; `sz` gives their size.
        let mut opts: sys::bpf_link_create_opts = unsafe { std::mem::zeroed() };
        opts.sz = std::mem::size_of::<sys::bpf_link_create_opts>() as _;
        opts.flags = sys::XDP_FLAGS_SKB_MODE;
        // SAFETY: a program fd, an interface index and options of the declared size.
        let link = unsafe { sys::bpf_link_create(prog.as_raw_fd(), ifindex as i32, sys::BPF_XDP, &opts) };
        if link < 0 {
            return Err(io::Error::from_raw_os_error(-link));
        }
        // SAFETY: a fresh fd we own.
        Ok((prog, unsafe { OwnedFd::from_raw_fd(link) }))
    }

    /// On a veth end of a namespace the test makes: a foreign XDP program
    /// is named instead of the kernel's EBUSY/EEXIST; once it is gone the
    /// port opens, and a second open of the same interface is refused with
    /// this process's PID until the first port is dropped.
    #[test]
    fn foreign_programs_and_second_opens_are_refused_by_name() {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(unsafe { libc::geteuid() }, 0, "this test makes a network namespace and attaches XDP programs: run it as root");
        let _ = crate::netns::VethPair::sweep_stale();
        let pair = crate::netns::VethPair::create("claim", 1500).expect("namespaces and veth");
        let ifname = pair.ifname[0].clone();
        crate::netns::in_netns(Some(&pair.ns[0]), move || {
            let cfg = crate::xsk::XskConfig::new(&ifname);
            let iface = crate::netdev::Interface::query(&ifname).unwrap();
            let (prog, link) = attach_pass_program(c"not_urnic", iface.index).expect("attach a foreign XDP program");
            let e = crate::xsk::XskPort::open(&cfg).err().expect("a foreign program is in the way");
            let msg = e.to_string();
            assert!(matches!(e, XskError::ForeignXdp { .. }), "{e:?}");
            assert_eq!(e.errno(), libc::EBUSY);
            let me = std::process::id();
            assert!(msg.contains("\"not_urnic\"") && msg.contains(&format!("held by process {me} (")), "{msg}");
            assert!(!msg.contains("File exists") && !msg.contains("resource busy"), "{msg}");
            drop((link, prog));

            let port = crate::xsk::XskPort::open(&cfg).expect("the interface is free again");
            let e = crate::xsk::XskPort::open(&cfg).err().expect("the interface is held");
            assert!(matches!(e, XskError::InUse { pid: Some(p), .. } if p == me), "{e:?}");
            assert_eq!(e.errno(), libc::EBUSY);
            assert!(e.to_string().starts_with(&format!("interface {ifname} is in use by urnic process {me} (")), "{e}");
            let io: io::Error = e.into();
            assert_eq!(io.raw_os_error(), None);
            assert_eq!(io.kind(), io::ErrorKind::ResourceBusy);
            drop(port);
            drop(crate::xsk::XskPort::open(&cfg).expect("released with the port"));
        })
        .unwrap();
    }

    #[test]
    fn a_symlink_in_place_of_the_lock_file_is_not_followed() {
        let dir = temp_dir("symlink");
        std::fs::create_dir_all(&dir).unwrap();
        let target = dir.join("precious");
        std::fs::write(&target, b"keep").unwrap();
        std::os::unix::fs::symlink(&target, dir.join("net-7-u0.lock")).unwrap();
        let e = InterfaceLock::acquire_in(&dir, 7, "u0").unwrap_err();
        assert!(matches!(&e, XskError::Io { source, .. } if source.raw_os_error() == Some(libc::ELOOP)), "{e:?}");
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
