//! The rxe lab shared by the interop tests: a bridge namespace with Linux
//! rxe guests (deploy/rxe-peer/peer.sh under qemu) and our namespace on it,
//! the guests' console logs and tap captures, and the capture check every
//! interop run ends with. Each test binary uses part of it.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

// The same lookup as loopback-test's runs of Debian's programs.
#[path = "../../../loopback-test/tests/programs/common.rs"]
mod common;
#[allow(unused_imports)] // Not every test binary of the lab runs programs.
pub use common::{lib_dir, perftest_rows};

/// The rxe guest's address (rxe0 on its eth0).
pub const GUEST_IP: &str = "10.99.0.1";
/// Our namespace's eth0.
pub const OUR_IP: &str = "10.99.0.100";

/// deploy/rxe-peer/peer.sh.
pub fn peer_sh() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/rxe-peer/peer.sh")
}

/// A bridge namespace with our namespace on it; both removed on drop, and
/// the directory of guest logs and captures too unless the test failed.
pub struct Lab {
    /// The bridge namespace (`URNIC_PEER_NS` for peer.sh).
    pub bridge_ns: String,
    /// Our namespace: eth0 on the bridge with OUR_IP.
    pub ours: String,
    /// Guest logs and captures.
    pub dir: PathBuf,
    /// The link MTU (guests and our eth0).
    pub mtu: u32,
    /// IPv6 on in our namespace and the guests (peer.sh `--ipv6`): their
    /// link-local addresses, the GIDs at index 0, past DAD.
    pub ipv6: bool,
}

impl Lab {
    /// A lab with IPv6 off everywhere (IPv4-mapped GIDs only).
    pub fn new(tag: &str, mtu: u32) -> Lab {
        Lab::create(tag, mtu, false)
    }

    /// A lab with IPv6 on in our namespace and the guests, for the
    /// link-local GIDs (index 0 on rxe and urnic alike). Our eth0's
    /// link-local address has passed DAD when this returns.
    pub fn new_ipv6(tag: &str, mtu: u32) -> Lab {
        let lab = Lab::create(tag, mtu, true);
        urnic_datapath::netns::wait_link_local(&lab.ours, "eth0", std::time::Duration::from_secs(120)).expect("our eth0's link-local address");
        lab
    }

    fn create(tag: &str, mtu: u32, ipv6: bool) -> Lab {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(unsafe { libc::geteuid() }, 0, "the rxe interop tests need root (namespaces, taps, qemu)");
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        if n == 0 {
            sweep_stale_labs();
        }
        let pid = std::process::id();
        let lab = Lab {
            bridge_ns: format!("urnic-rxe-{tag}-{pid}-{n}"),
            ours: format!("urnic-ours-{tag}-{pid}-{n}"),
            dir: std::env::temp_dir().join(format!("urnic-interop-{tag}-{pid}-{n}")),
            mtu,
            ipv6,
        };
        std::fs::create_dir_all(&lab.dir).unwrap();
        // Builds the guest the first time (minutes), then reuses the cache.
        let b = lab.peer(&["build"]).output().expect("bash");
        assert!(b.status.success(), "building the rxe guest failed (qemu, debootstrap from apt: deploy/deps.sh peer):\n{}", text(&b));
        let mut veth = vec!["veth".to_string(), lab.ours.clone(), format!("{OUR_IP}/24"), "--mtu".into(), mtu.to_string()];
        if ipv6 {
            veth.push("--ipv6".into());
        }
        let v = lab.peer(&veth.iter().map(String::as_str).collect::<Vec<_>>()).output().unwrap();
        assert!(v.status.success(), "peer.sh veth: {}", text(&v));
        lab
    }

    pub fn peer(&self, args: &[&str]) -> Command {
        let mut c = Command::new("bash");
        c.arg(peer_sh()).args(args).env("URNIC_PEER_NS", &self.bridge_ns);
        c
    }

    /// Boot a guest running `cmd`, capturing its tap into `name.pcap`.
    pub fn guest(&self, name: &str, cmd: &str) -> (Child, PathBuf, PathBuf) {
        self.run_guest(name, 400, &["--".as_ref(), cmd.as_ref()])
    }

    /// A guest that runs DIR/cmd.sh (shared over 9p).
    pub fn guest_shared(&self, name: &str, share: &Path) -> (Child, PathBuf, PathBuf) {
        self.run_guest(name, 900, &["--share".as_ref(), share.as_os_str()])
    }

    /// `peer.sh run` with the lab's address, MTU and IPv6 setting, killed
    /// after `timeout` s, its console into `name.log` and its tap captured
    /// into `name.pcap`, then `tail`; returns the run, the log and the
    /// capture.
    fn run_guest(&self, name: &str, timeout: u32, tail: &[&OsStr]) -> (Child, PathBuf, PathBuf) {
        let log = self.dir.join(format!("{name}.log"));
        let pcap = self.dir.join(format!("{name}.pcap"));
        let _ = std::fs::remove_file(&log);
        let child = self
            .peer(&["run", "--ip", &format!("{GUEST_IP}/24"), "--mtu", &self.mtu.to_string(), "--timeout", &timeout.to_string()])
            .args(self.ipv6.then_some("--ipv6"))
            .arg("--log")
            .arg(&log)
            .arg("--pcap")
            .arg(&pcap)
            .args(tail)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("peer.sh run");
        (child, log, pcap)
    }

    pub fn wait_ready(&self, log: &Path) {
        let o = self.peer(&["wait-ready"]).arg(log).arg("240").output().unwrap();
        assert!(o.status.success(), "the rxe guest did not come up: {}\n{}", text(&o), std::fs::read_to_string(log).unwrap_or_default());
    }

    /// `urnic ARGS` inside our namespace.
    pub fn urnic(&self, args: &[String]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ours, env!("CARGO_BIN_EXE_urnic")]).args(args);
        c
    }
}

/// Remove the namespaces of labs whose test process is gone (killed before
/// its `Drop` ran): `urnic-rxe-TAG-PID-N` and `urnic-ours-TAG-PID-N`, after
/// stopping what still runs in them (a guest's qemu). Returns how many were
/// removed.
pub fn sweep_stale_labs() -> usize {
    let removed = urnic_datapath::netns::sweep_orphaned(|name| {
        let rest = name.strip_prefix("urnic-rxe-").or_else(|| name.strip_prefix("urnic-ours-"))?;
        rest.rsplit('-').nth(1)?.parse().ok()
    });
    for name in &removed {
        eprintln!("removed the stale interop namespace {name} (its test process is gone)");
    }
    removed.len()
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = self.peer(&["veth-del", &self.ours]).output();
        let _ = self.peer(&["down"]).output();
        // Guest logs and captures stay for a failed test (its message
        // names them); a passing one removes them.
        if std::thread::panicking() {
            eprintln!("kept the guest logs and captures in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The UDP destination port of an untagged Ethernet frame carrying IPv4
/// (without options, as every RoCEv2 sender here) or IPv6 (no extension
/// headers), if it carries UDP.
pub fn udp_dst_port(frame: &[u8]) -> Option<u16> {
    let port_at = match frame.get(12..14)? {
        [0x08, 0x00] if frame.get(14) == Some(&0x45) && frame.get(23) == Some(&17) => 14 + 20 + 2,
        [0x86, 0xdd] if frame.get(20) == Some(&17) => 14 + 40 + 2,
        _ => return None,
    };
    frame.get(port_at..port_at + 2).map(|p| u16::from_be_bytes([p[0], p[1]]))
}

/// The RoCEv2 frames of a capture (UDP port 4791), and how many of them
/// have link-local (fe80::/10) IPv6 source and destination addresses:
/// traffic between GIDs at index 0.
pub fn roce_frames_link_local(pcap: &Path) -> (usize, usize) {
    let frames = urnic_datapath::capture::read_frames(pcap).unwrap_or_else(|e| panic!("{}: {e}", pcap.display()));
    let roce: Vec<&Vec<u8>> = frames.iter().filter(|f| udp_dst_port(f) == Some(4791)).collect();
    // udp_dst_port found an IPv6 frame's port at bytes 56..58: the
    // addresses (22..38, 38..54) are there.
    let ll = |a: &[u8]| a[0] == 0xfe && a[1] & 0xc0 == 0x80;
    let link_local = roce.iter().filter(|f| f[12..14] == [0x86, 0xdd] && ll(&f[22..38]) && ll(&f[38..54])).count();
    (roce.len(), link_local)
}

pub fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

pub fn guest_rc(log: &Path) -> Option<i32> {
    let t = std::fs::read_to_string(log).ok()?;
    t.lines().rev().find_map(|l| l.strip_prefix("PEER-EXIT rc=")).and_then(|v| v.trim().parse().ok())
}

/// Every RoCE frame of the capture has a correct ICRC and tshark finds no
/// malformed or erroneous packet. Returns the number of RoCE frames.
pub fn check_capture(pcap: &Path) -> usize {
    let frames = urnic_datapath::capture::read_frames(pcap).unwrap_or_else(|e| panic!("{}: {e}", pcap.display()));
    let (mut roce, mut bad) = (0, Vec::new());
    for frame in &frames {
        if rocev2::wire::peek_dest_qpn(frame).is_some() && udp_dst_port(frame) == Some(4791) {
            roce += 1;
            if let Err(e) = rocev2::wire::parse_frame(frame) {
                bad.push(format!("frame {roce}: {e}"));
            }
        }
    }
    assert!(bad.is_empty(), "{}: frames our parser refuses (bad ICRC or layout): {bad:?}", pcap.display());
    // tshark's payload heuristics (RPC-over-RDMA, SMB Direct, EoIB, ...) try
    // to read the tools' arbitrary test data as an upper protocol and call
    // it malformed — rxe's frames as much as ours. They are about the
    // payload, not RoCE, so they are off; every header is still dissected.
    let mut tshark_opts = Vec::new();
    for h in [
        "rpcrdma_infiniband",
        "smb_direct_infiniband",
        "smcr_infiniband",
        "iser_infiniband",
        "sdp_infiniband",
        "fc_infiniband",
        "lnet_ib",
        "mellanox_eoib",
        "eth_over_ib",
        "nvme_rdma",
    ] {
        tshark_opts.push("--disable-heuristic".to_string());
        tshark_opts.push(h.to_string());
    }
    // Only RoCE frames (UDP port 4791) are judged. perftest's out-of-band
    // TCP exchange shares the capture, and its 8-byte messages are read by
    // whatever dissector owns one of the connection's ports: a kernel-chosen
    // ephemeral port of 34980 (0x88A4, EtherCAT's) made tshark call them
    // malformed TC-NV packets (fixture perftest_tcp_on_the_ethercat_port).
    // Frames that reach a namespace after its urnic process has exited (the
    // peer's last message or a retransmission racing the exit) are answered
    // by the kernel with ICMP port unreachable, which quotes the start of the
    // RoCE packet: tshark dissects the quoted headers as InfiniBand too. Those
    // are the kernel's frames, not a RoCE sender's, and are left out.
    let roce_only = "udp.port == 4791 && !icmp && !icmpv6";
    // RoCEv2 over IPv6 carries a zero UDP checksum too, rxe's frames as ours
    // (rxe_net.c prepare_udp_hdr: check = 0; the ICRC covers the packet;
    // RFC 6935/6936 allow zero for such protocols). tshark calls a zero
    // IPv6 UDP checksum illegal unless told to accept it.
    tshark_opts.push("-o".to_string());
    tshark_opts.push("udp.ignore_ipv6_zero_checksum:TRUE".to_string());
    let o = Command::new("tshark")
        .arg("-r")
        .arg(pcap)
        .args(&tshark_opts)
        .args(["-Y", &format!("({roce_only}) && (_ws.malformed || _ws.expert.severity >= \"error\")")])
        .output()
        .expect("tshark (deploy/deps.sh test)");
    assert!(o.status.success(), "tshark: {}", text(&o));
    let complaints = String::from_utf8_lossy(&o.stdout);
    assert!(complaints.trim().is_empty(), "tshark flags frames in {}:\n{complaints}", pcap.display());
    let o = Command::new("tshark").arg("-r").arg(pcap).args(&tshark_opts).args(["-Y", &format!("infiniband && {roce_only}")]).output().unwrap();
    let dissected = String::from_utf8_lossy(&o.stdout).lines().count();
    assert_eq!(dissected, roce, "tshark dissects every RoCE frame of {}", pcap.display());
    roce
}

/// A guest run (peer.sh run as a child), stopped on drop if it still runs,
/// so a failed test does not leave qemu running until its timeout. peer.sh
/// waits for its qemu pipeline before its TERM trap runs (and `timeout`
/// keeps qemu in a process group of its own): the run's descendants are
/// stopped by pid, then peer.sh, whose trap deletes the tap.
pub struct GuestRun {
    child: Child,
    /// Its console log.
    pub log: PathBuf,
    /// Its tap's capture.
    pub pcap: PathBuf,
    /// The 9p share (/host in the guest): cmd.sh and the cases' output.
    pub share: PathBuf,
}

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
        if let Ok(None) = self.child.try_wait() {
            for pid in descendants(self.child.id()).into_iter().chain([self.child.id()]) {
                // SAFETY: kill(2) on a process this test started (its
                // guest run and what that run started).
                unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            }
        }
        let _ = self.child.wait();
    }
}

impl GuestRun {
    /// The console log so far.
    pub fn console(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// What the guest's case `name` wrote to /host/NAME.out.
    pub fn case_output(&self, name: &str) -> String {
        std::fs::read_to_string(self.share.join(format!("{name}.out"))).unwrap_or_default()
    }

    /// Until the console shows the line `marker`; a guest that ends first
    /// or reports `URNIC-CASE-FAILED` fails the test (hang guard: the
    /// guest's own timeout, and 600 s here).
    pub fn wait_for_marker(&mut self, marker: &str) {
        let start = Instant::now();
        loop {
            let g = self.console();
            if g.lines().any(|l| l.trim_end() == marker) {
                return;
            }
            if g.contains("URNIC-CASE-FAILED") || matches!(self.child.try_wait(), Ok(Some(_))) {
                panic!("the guest ended before `{marker}`:\n{g}");
            }
            assert!(start.elapsed() < Duration::from_secs(600), "the guest never reached `{marker}`:\n{g}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Until case `next` begins (its marker), or with `None` the script's
    /// end.
    pub fn wait_for_case(&mut self, next: Option<&str>) {
        match next {
            Some(name) => self.wait_for_marker(&case_marker(name)),
            None => {
                let _ = self.child.wait();
            }
        }
    }

    /// Whether the guest's script gave up on a case or the guest is gone.
    pub fn done(&mut self) -> bool {
        self.console().contains("URNIC-CASE-FAILED") || matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Wait for the guest to end; its script must have exited 0 (`what`
    /// names its side in the message).
    pub fn finish(&mut self, what: &str) {
        let _ = self.child.wait();
        assert_eq!(guest_rc(&self.log), Some(0), "{what}:\n{}", self.console());
    }
}

/// The console line that starts a guest script's case.
pub fn case_marker(name: &str) -> String {
    format!("URNIC-CASE-{name}")
}

/// The guest script's lines after case `name` ran into /host/NAME.out with
/// status `$rc`: the output to the console, and the first failure ends the
/// script with its status.
pub fn case_epilogue(name: &str) -> String {
    format!("cat /host/{name}.out\n[ $rc = 0 ] || {{ echo \"URNIC-CASE-FAILED {name} rc=$rc\"; exit $rc; }}\n")
}

impl Lab {
    /// Boot a guest running `script` (DIR/cmd.sh on its 9p share).
    pub fn boot(&self, name: &str, script: &str) -> GuestRun {
        let share = self.dir.join(format!("{name}-share"));
        std::fs::create_dir_all(&share).unwrap();
        std::fs::write(share.join("cmd.sh"), script).unwrap();
        let (child, log, pcap) = self.guest_shared(name, &share);
        GuestRun { child, log, pcap, share }
    }

    /// A program on urnic's library `lib` in our namespace (device
    /// urnic-eth0), its output piped.
    pub fn ours(&self, lib: &Path, argv: &[String]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ours, "env"])
            .arg(format!("LD_LIBRARY_PATH={}", lib.display()))
            .arg("URNIC_DEVICES=eth0")
            .arg("URNIC_STATS=0")
            .args(argv)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// Run urnic's client `argv` against the guest's server of case `name`
    /// (the guest's console `log` and 9p `share`),
    /// again while `again` says so for its output (a server that did not
    /// listen yet: nothing was exchanged); it must then succeed. Returns its
    /// output. A failure shows the guest's console and its server's own
    /// output so far (/host/NAME.out). Hang guards: a client still running
    /// after 300 s, or 300 s of runs again, fail the case.
    pub fn urnic_client(&self, lib: &Path, argv: &[String], name: &str, (log, share): (&Path, &Path), again: &mut dyn FnMut(&str) -> bool) -> String {
        let start = Instant::now();
        let out = loop {
            let o = bounded(self.ours(lib, argv), name);
            let t = text(&o);
            if o.status.success() || !again(&t) {
                break o;
            }
            assert!(start.elapsed() < Duration::from_secs(300), "{name}: rxe's server never listened:\n{t}");
            std::thread::sleep(Duration::from_millis(500));
        };
        let t = text(&out);
        if !out.status.success() {
            let console = std::fs::read_to_string(log).unwrap_or_default();
            let server = std::fs::read_to_string(share.join(format!("{name}.out"))).unwrap_or_default();
            panic!("{name}: urnic's client failed ({}):\n{t}\n--- rxe's server ---\n{server}\n--- rxe guest ---\n{console}", out.status);
        }
        t
    }

    /// Run urnic's server `argv` of case `name` until it ends on its own;
    /// it must succeed. Returns its output. It fails loudly if the guest's
    /// client gave up (the guest logs `URNIC-CASE-FAILED`) or the server
    /// hangs (600 s).
    pub fn urnic_server(&self, lib: &Path, argv: &[String], name: &str, guest: &mut GuestRun) -> String {
        self.urnic_server_with(lib, argv, name, guest, &mut |_, _| {})
    }

    /// [`urnic_server`](Self::urnic_server), calling `tick(guest, restart)`
    /// every 100 ms while the server runs: `restart()` kills the server and
    /// starts it again (for a program's own race that leaves it stuck).
    pub fn urnic_server_with(
        &self,
        lib: &Path,
        argv: &[String],
        name: &str,
        guest: &mut GuestRun,
        tick: &mut dyn FnMut(&mut GuestRun, &mut dyn FnMut()),
    ) -> String {
        let spawn = || Serving(Some(self.ours(lib, argv).spawn().expect("ip netns exec")));
        let mut server = spawn();
        let start = Instant::now();
        let out = loop {
            if let Ok(Some(_)) = server.child().try_wait() {
                break server.take().wait_with_output().expect("server output");
            }
            tick(guest, &mut || {
                // The old one first: it holds the interface.
                server.stop();
                server = spawn();
            });
            let guest_done = guest.done();
            if guest_done || start.elapsed() > Duration::from_secs(600) {
                // Give the server a moment to finish on its own after its client.
                std::thread::sleep(Duration::from_secs(5));
                if let Ok(Some(_)) = server.child().try_wait() {
                    break server.take().wait_with_output().expect("server output");
                }
                let mut server = server.take();
                let _ = server.kill();
                let o = server.wait_with_output().expect("server output");
                panic!("{name}: urnic's server did not finish (guest done: {guest_done}):\n{}\n--- rxe guest ---\n{}", text(&o), guest.console());
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let t = text(&out);
        assert!(out.status.success(), "{name}: urnic's server failed ({}):\n{t}\n--- rxe guest ---\n{}", out.status, guest.console());
        t
    }
}

/// A urnic server, killed and reaped on drop (a failed case does not leave
/// it running).
pub struct Serving(pub Option<Child>);

impl Serving {
    /// The running server.
    pub fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("the server")
    }

    /// The server, no longer killed on drop.
    pub fn take(&mut self) -> Child {
        self.0.take().expect("the server")
    }

    /// Kill the server and reap it (nothing if it is taken already).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Run a urnic client to its end; a client still running after 300 s is
/// killed and fails the case (a hang guard, not a timing check).
pub fn bounded(mut cmd: Command, name: &str) -> Output {
    let child = cmd.spawn().expect("ip netns exec");
    // `ip netns exec` and `env` exec the program: this is its pid.
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    // Its output is read while it runs (a full pipe would stall it).
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(300)) {
        Ok(o) => o.expect("client output"),
        Err(_) => {
            // SAFETY: kill(2) on the client this test started.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            let o = rx.recv().expect("client reaped").expect("client output");
            panic!("{name}: urnic's client did not finish:\n{}", text(&o));
        }
    }
}
