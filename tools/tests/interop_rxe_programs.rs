//! Debian's unmodified verbs programs (ibverbs-utils, perftest) on urnic's
//! libibverbs.so.1 against the same programs on Linux rxe, in both roles.
//!
//! urnic's side runs in our namespace on the rxe lab's bridge (rxe_lab:
//! deploy/rxe-peer/peer.sh's guests under qemu) with LD_LIBRARY_PATH at
//! urnic's library, the device `urnic-eth0`; the guest runs the same program
//! on rxe0. One guest boot per direction runs every case in sequence (a
//! script over 9p), its tap captured; every RoCE frame of the capture must
//! pass our parser (ICRC included) and tshark's dissection.
//!
//! The cases (CASES): ibv_rc_pingpong (-c, -e), ibv_uc_pingpong,
//! ibv_ud_pingpong, ibv_srq_pingpong; ib_write_bw (--report_gbits, -a, -b,
//! -q 4 -D 2), ib_read_bw, ib_send_bw (and -I 64), ib_atomic_bw -A
//! FETCH_AND_ADD and CMP_AND_SWAP, ib_send_lat, ib_write_lat, ib_read_lat.
//!
//! Not here, and why:
//! - ibv_devices, ibv_devinfo: local, no peer (loopback-test's
//!   verbs_programs runs them).
//! - qperf: its verbs tests address the peer by LID alone unless `-cm1`
//!   (RDMA-CM) is given, and a RoCE port refuses a path without a GRH (the
//!   kernel's rdma_check_ah_attr: rxe fails them at RTR too), so its RC tests
//!   need `-cm1` (RDMA-CM: loopback-test's rdmacm_programs runs them between
//!   urnic processes) and `ud_lat` (never RDMA-CM) cannot run on any RoCE
//!   device. The guest image has no qperf either.
//! - perftest `-R`, rping and the other RDMA-CM programs: interop_rxe_rdmacm.rs.
//!
//! The library is built by `ibverbs-abi/link.sh release` (deploy/test.sh
//! does it first); `URNIC_LIB_DIR` points elsewhere. The guests run under
//! software emulation: sizes and counts are modest and nothing is timed
//! (the loops below have hang guards that fail loudly).

mod rxe_lab;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rxe_lab::{check_capture, guest_rc, roce_frames_link_local, text, Lab, GUEST_IP, OUR_IP};

/// Where urnic's libibverbs.so.1 is, or a loud failure saying how to make it.
fn lib_dir() -> PathBuf {
    if let Ok(d) = std::env::var("URNIC_LIB_DIR") {
        return PathBuf::from(d);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for profile in ["release", "debug"] {
        let d = root.join("target").join(profile).join("urnic-lib");
        if d.join("libibverbs.so.1").exists() {
            return d;
        }
    }
    panic!("urnic's libibverbs.so.1 is not built: run `bash ibverbs-abi/link.sh release` (deploy/test.sh does)");
}

/// One program run on both sides with the same arguments, as people run
/// them; the device options are added per side (`-d`, and the GID index:
/// `-g` for the pingpongs, `-x` for perftest; 1 is the IPv4-mapped RoCEv2
/// GID on rxe and urnic alike).
struct Case {
    /// A name for messages and output files.
    name: &'static str,
    program: &'static str,
    args: &'static str,
}

impl Case {
    fn is_pingpong(&self) -> bool {
        self.program.starts_with("ibv_")
    }

    /// The argument list on one side: `dev` and the GID index, then `args`.
    fn argv(&self, dev: &str) -> Vec<String> {
        let gid = if self.is_pingpong() { "-g" } else { "-x" };
        let mut v = vec![self.program.to_string(), "-d".into(), dev.into(), gid.into(), "1".into()];
        v.extend(self.args.split_whitespace().map(str::to_string));
        v
    }

    /// The client's output shows the case ran: the pingpongs' iteration
    /// line without a data mismatch, perftest's result rows with non-zero
    /// figures (bandwidth or latency). Returns the line that says so.
    fn check_client_output(&self, out: &str, side: &str) -> String {
        if self.is_pingpong() {
            let n = self.args.split_whitespace().skip_while(|a| *a != "-n").nth(1).expect("pingpong cases give -n");
            assert!(out.contains(&format!("{n} iters in")), "{}: the {side} client did not finish its {n} iterations:\n{out}", self.name);
            // rdma-core's -c check prints this for a buffer that differs.
            assert!(!out.contains("invalid data"), "{}: {side} client saw corrupted data:\n{out}", self.name);
            return out.lines().find(|l| l.contains("iters in")).unwrap_or_default().trim().to_string();
        }
        let rows = perftest_rows(out);
        assert!(!rows.is_empty(), "{}: no result rows from the {side} client:\n{out}", self.name);
        let lat = self.program.ends_with("_lat");
        for r in &rows {
            // bw: #bytes #iterations BW-peak BW-average MsgRate;
            // lat: #bytes #iterations t_min t_max t_typical ...
            // (A bandwidth column rounds to 0.00 MB/s for 2-byte messages
            // under emulation; the message rate then still shows.)
            let ok = if lat { r[2] > 0.0 && r[4] > 0.0 } else { r[3] > 0.0 || r[4] > 0.0 };
            assert!(ok, "{}: a zero result from the {side} client: {r:?}\n{out}", self.name);
        }
        if self.args.split_whitespace().any(|a| a == "-a") {
            // -a: every power of two from 2 bytes to 8 MiB.
            assert_eq!(rows.len(), 23, "{}: -a gives 23 sizes:\n{out}", self.name);
        }
        let last = rows.last().expect("rows");
        let figures: Vec<String> = last.iter().map(|x| x.to_string()).collect();
        figures.join(" ")
    }
}

/// The numbers of perftest's result lines (`#bytes #iterations ...`).
fn perftest_rows(out: &str) -> Vec<Vec<f64>> {
    out.lines()
        .filter_map(|l| {
            let nums: Result<Vec<f64>, _> = l.split_whitespace().map(str::parse::<f64>).collect();
            nums.ok().filter(|n| n.len() >= 4)
        })
        .collect()
}

/// Every case, run in both directions. `-F` keeps perftest from refusing to
/// run when it finds the CPU frequency scaled (the emulated guest).
const CASES: &[Case] = &[
    // 4 KiB messages at the guest's active MTU 1024: SEND FIRST/MIDDLE/LAST.
    Case { name: "rc_pingpong", program: "ibv_rc_pingpong", args: "-n 50 -s 4096 -c" },
    Case { name: "rc_pingpong_events", program: "ibv_rc_pingpong", args: "-n 50 -s 1024 -e" },
    Case { name: "uc_pingpong", program: "ibv_uc_pingpong", args: "-n 50 -s 4096 -c" },
    Case { name: "ud_pingpong", program: "ibv_ud_pingpong", args: "-n 50 -s 1000 -c" },
    // Four RC QPs sharing one SRQ on each side.
    Case { name: "srq_pingpong", program: "ibv_srq_pingpong", args: "-n 20 -q 4 -s 1000 -c" },
    Case { name: "write_bw", program: "ib_write_bw", args: "-F -n 50 -s 65536 --report_gbits" },
    Case { name: "write_bw_all_sizes", program: "ib_write_bw", args: "-F -a -n 5" },
    Case { name: "write_bw_bidir", program: "ib_write_bw", args: "-F -b -n 20 -s 16384" },
    Case { name: "write_bw_4qps_duration", program: "ib_write_bw", args: "-F -q 4 -D 2 -s 4096" },
    Case { name: "read_bw", program: "ib_read_bw", args: "-F -n 50 -s 65536" },
    Case { name: "send_bw", program: "ib_send_bw", args: "-F -n 50 -s 16384" },
    Case { name: "send_bw_inline", program: "ib_send_bw", args: "-F -n 50 -s 64 -I 64" },
    Case { name: "atomic_fadd", program: "ib_atomic_bw", args: "-F -n 50 -A FETCH_AND_ADD" },
    Case { name: "atomic_cswap", program: "ib_atomic_bw", args: "-F -n 50 -A CMP_AND_SWAP" },
    Case { name: "send_lat", program: "ib_send_lat", args: "-F -n 50 -s 64" },
    Case { name: "write_lat", program: "ib_write_lat", args: "-F -n 50 -s 64" },
    Case { name: "read_lat", program: "ib_read_lat", args: "-F -n 50 -s 64" },
];

/// A guest run (peer.sh run as a child), stopped on drop if it still runs,
/// so a failed test does not leave qemu running until its timeout. peer.sh
/// waits for its qemu pipeline before its TERM trap runs (and `timeout`
/// keeps qemu in a process group of its own): the run's descendants are
/// stopped by pid, then peer.sh, whose trap deletes the tap.
struct GuestRun(Child);

/// The descendants of `pid` (children first-level first), from
/// /proc/PID/task/TID/children.
fn descendants(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else { continue };
        for t in tasks.flatten() {
            let kids = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            for k in kids.split_whitespace().filter_map(|k| k.parse::<u32>().ok()) {
                out.push(k);
                todo.push(k);
            }
        }
    }
    out
}

impl Drop for GuestRun {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            for pid in descendants(self.0.id()).into_iter().chain([self.0.id()]) {
                // SAFETY: kill(2) on a process this test started (its
                // guest run and what that run started).
                unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            }
        }
        let _ = self.0.wait();
    }
}

/// A program on urnic in our namespace (device urnic-eth0).
fn ours(lab: &Lab, lib: &Path, argv: &[String]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &lab.ours, "env"])
        .arg(format!("LD_LIBRARY_PATH={}", lib.display()))
        .arg("URNIC_DEVICES=eth0")
        .args(argv)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Whether a client failed only because nothing listened yet (the guest's
/// next server still starting): nothing was exchanged, it may run again.
fn refused_before_connecting(out: &str) -> bool {
    out.contains("Couldn't connect to") || out.contains("Unable to open file descriptor for socket connection")
}

/// Until the guest's log shows `marker` (hang guard: the guest's own
/// timeout, and 600 s here).
fn wait_for_marker(log: &Path, marker: &str, guest: &mut GuestRun) {
    let start = Instant::now();
    loop {
        let g = std::fs::read_to_string(log).unwrap_or_default();
        if g.lines().any(|l| l.trim_end() == marker) {
            return;
        }
        if let Ok(Some(_)) = guest.0.try_wait() {
            panic!("the guest ended before `{marker}`:\n{g}");
        }
        assert!(start.elapsed() < Duration::from_secs(600), "the guest never reached `{marker}`:\n{g}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The guest's script: each case prefixed by a marker line, its output kept
/// in /host/NAME.out (the 9p share) and echoed to the console; the first
/// failure ends the script with its status.
fn guest_script(clients: bool) -> String {
    let mut s = String::from("retry() { for i in $(seq 60); do \"$@\" && return 0; sleep 1; done; return 1; }\n");
    for c in CASES {
        let mut argv = c.argv("rxe0");
        if clients {
            argv.push(OUR_IP.to_string());
        }
        let cmd = argv.join(" ");
        // A client retries until urnic's server listens (a refused connection
        // exchanges nothing; a failure after connecting fails the case there
        // and then on urnic's side).
        let cmd = if clients { format!("retry {cmd}") } else { cmd };
        s.push_str(&format!(
            "echo URNIC-CASE-{name}\n{cmd} >/host/{name}.out 2>&1; rc=$?\ncat /host/{name}.out\n\
             [ $rc = 0 ] || {{ echo \"URNIC-CASE-FAILED {name} rc=$rc\"; exit $rc; }}\n",
            name = c.name
        ));
    }
    s
}

/// Boot the guest with `script`; returns the run, its log and capture.
fn boot(lab: &Lab, name: &str, script: &str) -> (GuestRun, PathBuf, PathBuf, PathBuf) {
    let share = lab.dir.join(format!("{name}-share"));
    std::fs::create_dir_all(&share).unwrap();
    std::fs::write(share.join("cmd.sh"), script).unwrap();
    let (child, log, pcap) = lab.guest_shared(name, &share);
    (GuestRun(child), log, pcap, share)
}

/// rxe runs the servers (one after the other in one guest), urnic's
/// library the clients.
#[test]
fn debian_programs_rxe_servers_urnic_clients() {
    let lab = Lab::new("progs1", 1500);
    let lib = lib_dir();
    let (mut guest, log, pcap, share) = boot(&lab, "progs-rxe-servers", &guest_script(false));
    lab.wait_ready(&log);
    let mut ran = Vec::new();
    for c in CASES {
        wait_for_marker(&log, &format!("URNIC-CASE-{}", c.name), &mut guest);
        let mut argv = c.argv("urnic-eth0");
        argv.push(GUEST_IP.to_string());
        let start = Instant::now();
        let out = loop {
            let o: Output = ours(&lab, &lib, &argv).output().expect("ip netns exec");
            let t = text(&o);
            if o.status.success() || !refused_before_connecting(&t) {
                break o;
            }
            // Hang guard: a server that never listens has failed.
            assert!(start.elapsed() < Duration::from_secs(300), "{}: rxe's server never listened:\n{t}", c.name);
            std::thread::sleep(Duration::from_millis(500));
        };
        let t = text(&out);
        assert!(
            out.status.success(),
            "{}: urnic's client failed ({}):\n{t}\n--- rxe guest ---\n{}",
            c.name,
            out.status,
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        eprintln!("{}: urnic client: {}", c.name, c.check_client_output(&t, "urnic"));
        ran.push(c.name);
    }
    let _ = guest.0.wait();
    let g = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(guest_rc(&log), Some(0), "rxe's servers:\n{g}");
    for c in CASES.iter().filter(|c| c.is_pingpong()) {
        // The pingpong servers check the buffers too (-c).
        let out = std::fs::read_to_string(share.join(format!("{}.out", c.name))).unwrap_or_default();
        c.check_client_output(&out, "rxe (server)");
    }
    let frames = check_capture(&pcap);
    assert!(frames > 1000, "only {frames} RoCE frames captured for {ran:?}");
    eprintln!("{frames} RoCE frames captured, every one parsed (ICRC checked) and dissected");
}

/// urnic's library runs the servers (one after the other), rxe the clients
/// (one guest, retrying each until urnic's server listens).
#[test]
fn debian_programs_urnic_servers_rxe_clients() {
    let lab = Lab::new("progs2", 1500);
    let lib = lib_dir();
    let (mut guest, log, pcap, share) = boot(&lab, "progs-urnic-servers", &guest_script(true));
    for c in CASES {
        let server = ours(&lab, &lib, &c.argv("urnic-eth0")).spawn().expect("ip netns exec");
        let out = wait_server(server, &mut guest, c.name, &log);
        let t = text(&out);
        assert!(
            out.status.success(),
            "{}: urnic's server failed ({}):\n{t}\n--- rxe guest ---\n{}",
            c.name,
            out.status,
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        if c.is_pingpong() {
            c.check_client_output(&t, "urnic (server)");
        }
        // The guest wrote its client's output before starting the next case.
        wait_for_marker_or_end(&log, c, &mut guest);
        let theirs = std::fs::read_to_string(share.join(format!("{}.out", c.name))).unwrap_or_default();
        eprintln!("{}: rxe client: {}", c.name, c.check_client_output(&theirs, "rxe"));
    }
    let _ = guest.0.wait();
    let g = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(guest_rc(&log), Some(0), "rxe's clients:\n{g}");
    let frames = check_capture(&pcap);
    assert!(frames > 1000, "only {frames} RoCE frames captured");
    eprintln!("{frames} RoCE frames captured, every one parsed (ICRC checked) and dissected");
}

/// Wait for urnic's server to finish; fail loudly if the guest's client
/// gave up (the guest logs `URNIC-CASE-FAILED`) or the server hangs.
fn wait_server(mut server: Child, guest: &mut GuestRun, name: &str, log: &Path) -> Output {
    let start = Instant::now();
    loop {
        if let Ok(Some(_)) = server.try_wait() {
            return server.wait_with_output().expect("server output");
        }
        let g = std::fs::read_to_string(log).unwrap_or_default();
        let guest_done = g.contains("URNIC-CASE-FAILED") || matches!(guest.0.try_wait(), Ok(Some(_)));
        if guest_done || start.elapsed() > Duration::from_secs(600) {
            // Give the server a moment to finish on its own after its client.
            std::thread::sleep(Duration::from_secs(5));
            if let Ok(Some(_)) = server.try_wait() {
                return server.wait_with_output().expect("server output");
            }
            let _ = server.kill();
            let o = server.wait_with_output().expect("server output");
            panic!("{name}: urnic's server did not finish (guest done: {guest_done}):\n{}\n--- rxe guest ---\n{g}", text(&o));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// After case `c` on the guest: the next case's marker, or the script's end.
fn wait_for_marker_or_end(log: &Path, c: &Case, guest: &mut GuestRun) {
    let idx = CASES.iter().position(|x| x.name == c.name).expect("a listed case");
    match CASES.get(idx + 1) {
        Some(next) => wait_for_marker(log, &format!("URNIC-CASE-{}", next.name), guest),
        None => {
            let _ = guest.0.wait();
        }
    }
}

/// Debian's ibv_rc_pingpong on urnic's library against the same program on
/// rxe over the link-local GIDs (`-g 0` on urnic, rxe's link-local index on
/// the guest; IPv6 on in our namespace and the guest), in both roles within
/// one guest boot: rxe serves first, then rxe is the client (issue 19).
/// -c checks the data on both sides; every RoCE frame goes between the two
/// fe80:: addresses.
#[test]
fn debian_rc_pingpong_over_link_local_gids_both_roles() {
    let lab = Lab::new_ipv6("progsll", 1500);
    let lib = lib_dir();
    let pp = "ibv_rc_pingpong -n 50 -s 4096 -c";
    let script = format!(
        "retry() {{ for i in $(seq 60); do \"$@\" && return 0; sleep 1; done; return 1; }}\n\
         echo URNIC-CASE-ll_rxe_server\n\
         {pp} -d rxe0 -g $RXE_GID_LL >/host/server.out 2>&1; rc=$?\ncat /host/server.out\n\
         [ $rc = 0 ] || {{ echo \"URNIC-CASE-FAILED ll_rxe_server rc=$rc\"; exit $rc; }}\n\
         echo URNIC-CASE-ll_rxe_client\n\
         retry {pp} -d rxe0 -g $RXE_GID_LL {OUR_IP} >/host/client.out 2>&1; rc=$?\ncat /host/client.out\n\
         [ $rc = 0 ] || {{ echo \"URNIC-CASE-FAILED ll_rxe_client rc=$rc\"; exit $rc; }}\n"
    );
    let (mut guest, log, pcap, share) = boot(&lab, "progs-ll", &script);
    lab.wait_ready(&log);
    let argv = |server: Option<&str>| -> Vec<String> {
        let mut v: Vec<String> = pp.split_whitespace().map(str::to_string).collect();
        v.extend(["-d", "urnic-eth0", "-g", "0"].map(String::from));
        v.extend(server.map(String::from));
        v
    };
    let link_local = |out: &str, side: &str| {
        for what in ["local address", "remote address"] {
            let line = out.lines().find(|l| l.contains(what)).unwrap_or_default();
            assert!(line.contains("GID fe80:"), "{side}: the {what} is not a link-local GID:\n{out}");
        }
    };
    let case = Case { name: "rc_pingpong_link_local", program: "ibv_rc_pingpong", args: "-n 50 -s 4096 -c" };

    // rxe serves, urnic's library is the client (retrying until rxe listens).
    wait_for_marker(&log, "URNIC-CASE-ll_rxe_server", &mut guest);
    let start = Instant::now();
    let out = loop {
        let o: Output = ours(&lab, &lib, &argv(Some(GUEST_IP))).output().expect("ip netns exec");
        let t = text(&o);
        if o.status.success() || !refused_before_connecting(&t) {
            break o;
        }
        // Hang guard: a server that never listens has failed.
        assert!(start.elapsed() < Duration::from_secs(300), "rxe's server never listened:\n{t}");
        std::thread::sleep(Duration::from_millis(500));
    };
    let t = text(&out);
    let g = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(out.status.success(), "urnic's client failed ({}):\n{t}\n--- rxe guest ---\n{}", out.status, g());
    eprintln!("urnic client: {}", case.check_client_output(&t, "urnic"));
    link_local(&t, "urnic client");

    // urnic's library serves, rxe is the client.
    wait_for_marker(&log, "URNIC-CASE-ll_rxe_client", &mut guest);
    let server = ours(&lab, &lib, &argv(None)).spawn().expect("ip netns exec");
    let out = wait_server(server, &mut guest, case.name, &log);
    let t = text(&out);
    assert!(out.status.success(), "urnic's server failed ({}):\n{t}\n--- rxe guest ---\n{}", out.status, g());
    case.check_client_output(&t, "urnic (server)");
    link_local(&t, "urnic server");

    let _ = guest.0.wait();
    assert_eq!(guest_rc(&log), Some(0), "rxe's side:\n{}", g());
    for (f, side) in [("server.out", "rxe (server)"), ("client.out", "rxe (client)")] {
        let theirs = std::fs::read_to_string(share.join(f)).unwrap_or_default();
        eprintln!("{side}: {}", case.check_client_output(&theirs, side));
        link_local(&theirs, side);
    }
    let frames = check_capture(&pcap);
    let (roce, link_local) = roce_frames_link_local(&pcap);
    assert_eq!(roce, frames);
    // 50 messages of 4 packets each way, twice, and their ACKs.
    assert!(frames >= 800, "only {frames} RoCE frames captured");
    assert_eq!(link_local, frames, "RoCE frames not between the link-local addresses");
    eprintln!("{frames} RoCE frames captured between the link-local GIDs, every one parsed (ICRC checked) and dissected");
}
