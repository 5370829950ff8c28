//! The `urnic` CLI run as a user runs it (issue 19; `urnic exec` from issue
//! 16): the built binary, inside network namespaces joined by veth that each
//! test makes and removes (never another address). Piped output whose
//! reader is gone, an unresolvable server and a server that is not up yet,
//! mismatched -n between perf's client and server, bad sizes and counts,
//! device names as devinfo prints them, SIGINT and SIGTERM (namespaces and
//! counter files gone afterwards), a second process on one interface,
//! `urnic stat` with dead and live processes, -e on the pingpongs, `urnic
//! exec`, the pingpongs over the link-local GID (-g 0). Needs root.
//!
//! No test measures time: waits for a process are hang guards that fail
//! loudly (kill the process and panic) far beyond what the step needs.

use std::io::{BufRead, BufReader, Read};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use urnic_datapath::netns::VethPair;

const URNIC: &str = env!("CARGO_BIN_EXE_urnic");

/// A hang guard: far longer than any step here takes on a slow machine.
const HANG: Duration = Duration::from_secs(180);

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "these tests create network namespaces and attach XDP programs: run them as root");
}

fn veth(tag: &str) -> VethPair {
    require_root();
    let _ = VethPair::sweep_stale();
    VethPair::create(tag, 1500).expect("create namespaces and veth (root, iproute2)")
}

/// A fresh directory for counter files (`URNIC_STATS`), so tests do not see
/// each other's devices in /run/urnic.
fn stat_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("urnic-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `urnic ARGS` inside namespace `ns` (`ip netns exec` execs it: the child's
/// PID is urnic's).
fn urnic_in(ns: &str, stats: &Path, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, URNIC]).args(args).env("URNIC_STATS", stats).env_remove("RUST_LOG");
    c
}

fn urnic(args: &[&str]) -> Command {
    let mut c = Command::new(URNIC);
    c.args(args).env_remove("RUST_LOG");
    c
}

/// Wait for `child` (hang guard: kill it and panic after [`HANG`]).
fn finish(mut child: Child, what: &str) -> Output {
    let deadline = Instant::now() + HANG;
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("collect output");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("collect output");
            panic!("{what} hung; stdout:\n{}\nstderr:\n{}", text(&out.stdout), text(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Start a command with its stdout and stderr piped to us.
trait SpawnPiped {
    fn spawn_piped(&mut self) -> Child;
}

impl SpawnPiped for Command {
    fn spawn_piped(&mut self) -> Child {
        self.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start urnic")
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn both(out: &Output) -> String {
    format!("status {:?}\nstdout:\n{}\nstderr:\n{}", out.status, text(&out.stdout), text(&out.stderr))
}

/// Lines of a child's pipe, as they come, on a channel.
fn lines(r: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

/// Read lines until one satisfies `want` (hang guard); returns all read.
fn wait_line(rx: &mpsc::Receiver<String>, what: &str, want: impl Fn(&str) -> bool) -> Vec<String> {
    let deadline = Instant::now() + HANG;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => {
                let hit = want(&l);
                seen.push(l);
                if hit {
                    return seen;
                }
            }
            Err(_) => panic!("{what}: no such line; got:\n{}", seen.join("\n")),
        }
    }
}

/// The rest of a line channel (after the child exited).
fn drain(rx: mpsc::Receiver<String>) -> String {
    rx.iter().collect::<Vec<_>>().join("\n")
}

/// Namespaces whose name contains `part`.
fn namespaces_with(part: &str) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().expect("ip netns list");
    text(&out.stdout).lines().filter_map(|l| l.split_whitespace().next()).filter(|n| n.contains(part)).map(String::from).collect()
}

/// Until `f` holds (hang guard).
fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + HANG;
    while !f() {
        assert!(Instant::now() < deadline, "{what}: never happened");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill has no memory preconditions; the child is ours and not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}

/// A pipe whose reader is already closed: the write end, for a child's stdout.
fn closed_pipe() -> Stdio {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors are fresh and ours; the read end closes now.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(r);
    Stdio::from(w)
}

/// No panic, no message: killed by SIGPIPE as `yes | head -1` is.
fn assert_quiet_sigpipe(out: &Output) {
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{}", both(out));
    assert!(out.stderr.is_empty(), "{}", both(out));
}

#[test]
fn a_closed_stdout_ends_quietly_and_cleans_up() {
    let pair = veth("clipipe");
    let stats = stat_dir("pipe");
    // devinfo -v (the namespace has an interface to list).
    let out = finish(urnic_in(&pair.ns[0], &stats, &["devinfo", "-v"]).stdout(closed_pipe()).stderr(Stdio::piped()).spawn().unwrap(), "devinfo");
    assert_quiet_sigpipe(&out);
    // stat: a live device's file (this process's PID is alive).
    std::fs::write(stats.join(format!("urnic-u9.{}.stat", std::process::id())), "device urnic-u9\ndatapath.polls 7\n").unwrap();
    let out = finish(urnic(&["stat", "--dir"]).arg(&stats).stdout(closed_pipe()).stderr(Stdio::piped()).spawn().unwrap(), "stat");
    assert_quiet_sigpipe(&out);
    // demo in memory, and on veth: its namespaces go before it dies.
    let demo = ["demo", "-n", "20", "--sizes", "64", "--lat-iters", "5"];
    let out = finish(urnic(&demo).args(["--link", "memory"]).stdout(closed_pipe()).stderr(Stdio::piped()).spawn().unwrap(), "demo memory");
    assert_quiet_sigpipe(&out);
    let child = urnic(&demo).env("URNIC_STATS", &stats).stdout(closed_pipe()).stderr(Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    let out = finish(child, "demo veth");
    assert_quiet_sigpipe(&out);
    assert_eq!(namespaces_with(&format!("urnic-demo-{pid}-")), Vec::<String>::new(), "the demo's namespaces are left");
    let _ = std::fs::remove_dir_all(&stats);
}

#[test]
fn an_unresolvable_server_fails_at_once_and_a_refused_one_is_waited_for() {
    let pair = veth("clires");
    let stats = stat_dir("res");
    // Inside the namespace nothing routes to a name server: resolution
    // fails, and must end the run without retrying (or opening the device).
    let out = finish(urnic_in(&pair.ns[1], &stats, &["perf", "write-bw", "-d", "eth0", "999.1.1.1"]).spawn_piped(), "perf to an unresolvable host");
    assert_eq!(out.status.code(), Some(1), "{}", both(&out));
    let err = text(&out.stderr);
    assert!(err.contains("Couldn't resolve 999.1.1.1"), "{}", both(&out));
    assert!(!err.contains("waiting for server") && !err.contains("panicked"), "{}", both(&out));
    // The client first: it says it waits, then runs once the server is up.
    let server = pair.ipv4[0].map(|b| b.to_string()).join(".");
    let mut client = urnic_in(&pair.ns[1], &stats, &["perf", "send-lat", "-n", "20", "-d", &pair.ifname[1], &server]).spawn_piped();
    let errs = lines(client.stderr.take().unwrap());
    wait_line(&errs, "client waiting", |l| l.contains(&format!("waiting for server {server}:18515")));
    let srv = urnic_in(&pair.ns[0], &stats, &["perf", "send-lat", "-n", "20", "-d", &pair.ifname[0]]).spawn_piped();
    let c = finish(client, "perf client");
    let s = finish(srv, "perf server");
    assert!(c.status.success(), "{}\n{}", both(&c), drain(errs));
    assert!(s.status.success(), "{}", both(&s));
    assert!(text(&c.stdout).contains("t_typical"), "{}", both(&c));
    let _ = std::fs::remove_dir_all(&stats);
}

#[test]
fn perf_client_and_server_with_different_iterations_both_end() {
    let pair = veth("clin");
    let stats = stat_dir("n");
    let server = pair.ipv4[0].map(|b| b.to_string()).join(".");
    for (test, server_n, client_n) in [("send-lat", None, "500"), ("send-bw", Some("300"), "100")] {
        let mut sargs = vec!["perf", test, "-d", &pair.ifname[0]];
        if let Some(n) = server_n {
            sargs.extend(["-n", n]);
        }
        let srv = urnic_in(&pair.ns[0], &stats, &sargs).spawn_piped();
        let cli = urnic_in(&pair.ns[1], &stats, &["perf", test, "-n", client_n, "-d", &pair.ifname[1], &server]).spawn_piped();
        let c = finish(cli, "perf client");
        let s = finish(srv, "perf server with more iterations");
        // The client measured its iterations; the server saw it finish early.
        assert!(text(&c.stdout).contains(client_n), "{test}: {}", both(&c));
        assert_eq!(s.status.code(), Some(1), "{test}: {}", both(&s));
        assert!(text(&s.stderr).contains("same -n"), "{test}: {}", both(&s));
        assert!(!text(&s.stderr).contains("panicked") && !text(&c.stderr).contains("panicked"), "{test}: {}\n{}", both(&s), both(&c));
    }
    let _ = std::fs::remove_dir_all(&stats);
}

#[test]
fn bad_sizes_and_counts_are_refused_before_anything_runs() {
    let cases: &[(&[&str], &str)] = &[
        (&["demo", "--link", "memory", "-n", "0"], "--iters"),
        (&["demo", "--link", "memory", "--sizes", "4294967296"], "a message is 1 to 8388608 bytes"),
        (&["demo", "--link", "memory", "--sizes", "0"], "a message is 1 to"),
        (&["demo", "--link", "memory", "--sizes", "64,9000000"], "a message is 1 to"),
        (&["demo", "--link", "memory", "--lat-iters", "0"], "--lat-iters"),
        (&["demo", "--link", "memory", "-t", "0"], "--tx-depth"),
        (&["perf", "write-bw", "-s", "0"], "a message is 1 to"),
        (&["perf", "write-bw", "-n", "0"], "--iters"),
        (&["perf", "send-bw", "-r", "0"], "--rx-depth"),
        (&["perf", "write-bw", "--drop", "1.5"], "probability"),
        (&["rc-pingpong", "-s", "0"], "a message is 1 to"),
        (&["ud-pingpong", "-n", "0"], "--iters"),
        (&["bench", "--runs", "0"], "--runs"),
    ];
    for (args, says) in cases {
        let out = urnic(args).output().unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", both(&out));
        assert!(err.contains("invalid value") && err.contains(says), "{args:?}: {}", both(&out));
        assert!(out.stdout.is_empty(), "{args:?} printed before refusing: {}", both(&out));
        assert!(!err.contains("data check failed") && !err.contains("no samples"), "{args:?}: {}", both(&out));
    }
    // In range, the same runs go through.
    let out = urnic(&["demo", "--link", "memory", "-n", "1", "--sizes", "1,8388608", "--lat-iters", "1"]).output().unwrap();
    assert!(out.status.success(), "{}", both(&out));
    assert!(text(&out.stdout).lines().any(|l| l.trim_start().starts_with("8388608 ")), "{}", both(&out));
}

#[test]
fn device_names_from_devinfo_are_accepted() {
    let pair = veth("cliname");
    let stats = stat_dir("name");
    let out = urnic_in(&pair.ns[0], &stats, &["devinfo"]).output().unwrap();
    assert!(out.status.success(), "{}", both(&out));
    let hca = text(&out.stdout).lines().find_map(|l| l.strip_prefix("hca_id:\t").map(String::from)).expect("an hca_id line");
    assert_eq!(hca, format!("urnic-{}", pair.ifname[0]));
    for name in [hca.as_str(), pair.ifname[0].as_str()] {
        let out = urnic_in(&pair.ns[0], &stats, &["devinfo", "-d", name]).output().unwrap();
        assert!(out.status.success() && text(&out.stdout).starts_with(&format!("hca_id:\t{hca}\n")), "-d {name}: {}", both(&out));
    }
    let out = urnic_in(&pair.ns[0], &stats, &["devinfo", "-d", "urnic-nosuch"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", both(&out));
    assert!(text(&out.stderr).contains(&format!("wasn't found: the devices here are {hca}")), "{}", both(&out));
    // A run with the device name on one side and the interface on the other.
    let server = pair.ipv4[0].map(|b| b.to_string()).join(".");
    let srv = urnic_in(&pair.ns[0], &stats, &["perf", "write-bw", "-n", "200", "-d", &hca]).spawn_piped();
    let peer_dev = format!("urnic-{}", pair.ifname[1]);
    let cli = urnic_in(&pair.ns[1], &stats, &["perf", "write-bw", "-n", "200", "-d", &peer_dev, &server]).spawn_piped();
    let c = finish(cli, "perf client");
    let s = finish(srv, "perf server");
    assert!(c.status.success() && s.status.success(), "{}\n{}", both(&c), both(&s));
    let _ = std::fs::remove_dir_all(&stats);
}

#[test]
fn sigint_and_sigterm_remove_namespaces_and_counter_files() {
    require_root();
    let stats = stat_dir("sig");
    // demo on veth, interrupted in its bandwidth test.
    let mut demo = urnic(&["demo", "-n", "100000000", "--sizes", "65536"]).env("URNIC_STATS", &stats).spawn_piped();
    let pid = demo.id();
    let out = lines(demo.stdout.take().unwrap());
    wait_line(&out, "demo's bandwidth table", |l| l.contains("#bytes"));
    assert_eq!(namespaces_with(&format!("urnic-demo-{pid}-")).len(), 2);
    let files = || std::fs::read_dir(&stats).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().contains(&format!(".{pid}.stat"))).count();
    until("the demo publishes counters", || files() == 2);
    signal(&demo, libc::SIGINT);
    let o = finish(demo, "interrupted demo");
    assert_eq!(o.status.code(), Some(130), "{}", both(&o));
    assert_eq!(namespaces_with(&format!("urnic-demo-{pid}-")), Vec::<String>::new(), "SIGINT left the demo's namespaces");
    assert_eq!(files(), 0, "SIGINT left counter files");
    // bench, terminated while it measures: progress lines said what.
    let mut bench = urnic(&["bench", "--runs", "1"]).spawn_piped();
    let pid = bench.id();
    let errs = lines(bench.stderr.take().unwrap());
    let seen = wait_line(&errs, "bench's first progress line", |l| l.starts_with("bench [1/"));
    assert!(seen.last().is_some_and(|l| l.contains("WRITE")), "{seen:?}");
    until("bench's namespaces", || namespaces_with(&format!("urnic-bench-{pid}-")).len() == 4);
    signal(&bench, libc::SIGTERM);
    let o = finish(bench, "terminated bench");
    assert_eq!(o.status.code(), Some(143), "{}\n{}", both(&o), drain(errs));
    assert_eq!(namespaces_with(&format!("urnic-bench-{pid}-")), Vec::<String>::new(), "SIGTERM left bench's namespaces");
    let _ = std::fs::remove_dir_all(&stats);
}

#[test]
fn a_second_process_on_an_interface_is_told_who_holds_it_and_stat_shows_only_live_ones() {
    let pair = veth("clibusy");
    let stats = stat_dir("busy");
    // A counter file of a process that is gone.
    let dead = Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    let _ = finish(dead, "true");
    let dead_file = stats.join(format!("urnic-u7.{dead_pid}.stat"));
    std::fs::write(&dead_file, "device urnic-u7\ndatapath.polls 1\n").unwrap();
    // The first: a perf server waiting for its client, device open.
    let first = urnic_in(&pair.ns[0], &stats, &["perf", "write-bw", "-d", &pair.ifname[0]]).spawn_piped();
    let live_file = stats.join(format!("urnic-{}.{}.stat", pair.ifname[0], first.id()));
    until("the first process publishes its counters", || live_file.exists());
    // The second on the same interface, by its device name.
    let out = urnic_in(&pair.ns[0], &stats, &["perf", "write-bw", "-p", "18600", "-d", &format!("urnic-{}", pair.ifname[0])]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", both(&out));
    let want = format!("interface {} is in use by urnic process {}", pair.ifname[0], first.id());
    assert!(text(&out.stderr).contains(&want), "{}", both(&out));
    assert_eq!(text(&out.stderr).matches(&want).count(), 1, "the cause is printed once: {}", both(&out));
    // urnic stat: the live device, not the dead one, whose file goes.
    let out = urnic(&["stat", "--dir"]).arg(&stats).output().unwrap();
    assert!(out.status.success(), "{}", both(&out));
    let shown = text(&out.stdout);
    assert!(shown.contains(&format!("# {}", live_file.display())) && shown.contains(&format!("device urnic-{}", pair.ifname[0])), "{shown}");
    assert!(!shown.contains("urnic-u7"), "a dead process's counters are shown: {shown}");
    assert!(!dead_file.exists(), "the dead process's file is left");
    // Terminated, the first removes its file; stat says nothing runs.
    signal(&first, libc::SIGTERM);
    let o = finish(first, "perf server");
    assert_eq!(o.status.code(), Some(143), "{}", both(&o));
    assert!(!live_file.exists());
    let out = urnic(&["stat", "--dir"]).arg(&stats).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", both(&out));
    assert!(text(&out.stderr).contains("no urnic device is running"), "{}", both(&out));
    let _ = std::fs::remove_dir_all(&stats);
}

#[test]
fn pingpongs_sleep_on_completion_events_with_e() {
    let pair = veth("clievt");
    let stats = stat_dir("evt");
    let server = pair.ipv4[0].map(|b| b.to_string()).join(".");
    // UD messages fit the port's MTU (1024 on a 1500-byte veth).
    for (tool, size) in [("rc-pingpong", "4096"), ("ud-pingpong", "1024")] {
        let common = ["-v", tool, "-e", "-n", "200", "-s", size, "-d"];
        let srv = urnic_in(&pair.ns[0], &stats, &[&common[..], &[&pair.ifname[0]]].concat()).spawn_piped();
        let cli = urnic_in(&pair.ns[1], &stats, &[&common[..], &[&pair.ifname[1], &server]].concat()).spawn_piped();
        let c = finish(cli, "pingpong client");
        let s = finish(srv, "pingpong server");
        for o in [&c, &s] {
            assert!(o.status.success(), "{tool}: {}", both(o));
            assert!(text(&o.stdout).contains("200 iters in"), "{tool}: {}", both(o));
            // Each wakeup was a completion event on the channel.
            let err = text(&o.stderr);
            let line = err.lines().find(|l| l.contains("slept on completion events"));
            let events = line.and_then(|l| l.rsplit("events=").next()?.trim().parse::<u64>().ok());
            assert!(events.is_some_and(|n| n > 0), "{tool}: {}", both(o));
        }
    }
    let _ = std::fs::remove_dir_all(&stats);
}

/// Where libibverbs.so.1 is, or a loud failure saying how to make it.
fn lib_dir() -> PathBuf {
    if let Ok(d) = std::env::var("URNIC_LIB_DIR") {
        return PathBuf::from(d);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    for profile in ["release", "debug"] {
        let d = root.join("target").join(profile).join("urnic-lib");
        if d.join("libibverbs.so.1").exists() {
            return d;
        }
    }
    panic!("urnic's libibverbs.so.1 is not built: run `bash ibverbs-abi/link.sh release` (deploy/test.sh does)");
}

#[test]
fn exec_runs_an_ibverbs_program_on_urnic() {
    let pair = veth("cliexec");
    let stats = stat_dir("exec");
    let lib = lib_dir();
    let out = urnic_in(&pair.ns[0], &stats, &["exec", "--", "ibv_devices"]).env("URNIC_LIB_DIR", &lib).output().unwrap();
    assert!(out.status.success(), "{}", both(&out));
    assert!(text(&out.stdout).contains(&format!("urnic-{}", pair.ifname[0])), "{}", both(&out));
    // The options arrive as the library's variables, the path first.
    let show = "echo $LD_LIBRARY_PATH; echo $URNIC_PCAP; echo $URNIC_DROP; echo $URNIC_STATS";
    let out = urnic_in(&pair.ns[0], &stats, &["exec", "--pcap", "cap.pcap", "--drop", "0.25", "--stats=/tmp/x", "--", "sh", "-c", show])
        .env("URNIC_LIB_DIR", &lib)
        .env("LD_LIBRARY_PATH", "/opt/other")
        .current_dir(&stats)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", both(&out));
    let want = format!("{}:/opt/other\n{}\n0.25\n/tmp/x\n", lib.canonicalize().unwrap().display(), stats.join("cap.pcap").display());
    assert_eq!(text(&out.stdout), want, "{}", both(&out));
    // The program's exit code is urnic's.
    let out = urnic(&["exec", "--", "sh", "-c", "exit 7"]).env("URNIC_LIB_DIR", &lib).output().unwrap();
    assert_eq!(out.status.code(), Some(7), "{}", both(&out));
    // No library: say how to build it.
    let out = urnic(&["exec", "--", "ibv_devices"]).env("URNIC_LIB_DIR", stats.join("nothing")).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", both(&out));
    assert!(text(&out.stderr).contains("ibverbs-abi/link.sh"), "{}", both(&out));
    let _ = std::fs::remove_dir_all(&stats);
}

/// The link-local GID (index 0, fe80:: from the MAC's EUI-64, as rxe's) on
/// both ends (issue 19): each side finds the other's MAC by neighbour
/// discovery scoped to its interface, RC with -c checking the data and UD
/// through an address handle.
#[test]
fn pingpongs_over_link_local_gids() {
    let pair = veth("clill");
    // Until DAD is done the kernel answers no neighbour solicitation for the
    // address (RFC 4862 5.4): a user's interface is long past that.
    pair.wait_link_local(HANG).expect("link-local addresses past DAD");
    let stats = stat_dir("ll");
    let server = pair.ipv4[0].map(|b| b.to_string()).join(".");
    let gid = |mac: [u8; 6]| std::net::Ipv6Addr::from(urnic::link_local_gid(mac)).to_string();
    let (gid_a, gid_b) = (gid(pair.mac[0]), gid(pair.mac[1]));
    for (tool, size, check) in [("rc-pingpong", "4096", Some("-c")), ("ud-pingpong", "1000", None)] {
        let common: Vec<&str> = ["-v", tool, "-g", "0", "-n", "50", "-s", size].into_iter().chain(check).chain(["-d"]).collect();
        let srv = urnic_in(&pair.ns[0], &stats, &[&common[..], &[&pair.ifname[0]]].concat()).spawn_piped();
        let cli = urnic_in(&pair.ns[1], &stats, &[&common[..], &[&pair.ifname[1], &server]].concat()).spawn_piped();
        let c = finish(cli, "pingpong client");
        let s = finish(srv, "pingpong server");
        for (o, me, peer) in [(&c, &gid_b, &gid_a), (&s, &gid_a, &gid_b)] {
            let out = text(&o.stdout);
            assert!(o.status.success(), "{tool}: {}", both(o));
            assert!(out.contains("50 iters in") && !out.contains("invalid data"), "{tool}: {}", both(o));
            let line = |what: &str| out.lines().find(|l| l.contains(what)).unwrap_or_default().to_string();
            assert!(line("local address").ends_with(&format!("GID {me}")), "{tool}: {}", both(o));
            assert!(line("remote address").ends_with(&format!("GID {peer}")), "{tool}: {}", both(o));
            // -v: the peer's link-local GID was resolved to its MAC.
            let resolved = text(&o.stderr).lines().any(|l| l.contains("neighbour resolved") && l.contains(&format!("gid={peer} ")));
            assert!(resolved, "{tool}: {}", both(o));
        }
    }
    let _ = std::fs::remove_dir_all(&stats);
}
