//! Interoperability with Linux Soft-RoCE (rxe) on the wire.
//!
//! Each test boots rxe guests (deploy/rxe-peer/peer.sh: Debian's kernel with
//! rdma_rxe, rdma-core and perftest, under qemu) on a bridge in a namespace
//! of its own, and runs the `urnic` tools in another namespace on the same
//! bridge, in both roles: rdma-core's ibv_rc_pingpong / ibv_ud_pingpong and
//! perftest's ib_*_bw / ib_*_lat against `urnic rc-pingpong`,
//! `ud-pingpong` and `urnic perf`. Every run is captured on the guest's tap;
//! every RoCE frame in it must carry a correct ICRC (our parser recomputes
//! it) and tshark must dissect all of it without errors.
//!
//! The guests run under software emulation here: sizes and counts are
//! modest, and nothing is timed. Needs root and qemu (deploy/deps.sh peer);
//! the guest image is built once into /var/cache/urnic/rxe-peer.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

const GUEST_IP: &str = "10.99.0.1";
const OUR_IP: &str = "10.99.0.100";

fn peer_sh() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/rxe-peer/peer.sh")
}

/// A bridge namespace with our namespace on it; both removed on drop, and
/// the directory of guest logs and captures too unless the test failed.
struct Lab {
    bridge_ns: String,
    ours: String,
    dir: PathBuf,
    mtu: u32,
}

impl Lab {
    fn new(tag: &str, mtu: u32) -> Lab {
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
        };
        std::fs::create_dir_all(&lab.dir).unwrap();
        // Builds the guest the first time (minutes), then reuses the cache.
        let b = lab.peer(&["build"]).output().expect("bash");
        assert!(b.status.success(), "building the rxe guest failed (qemu, debootstrap from apt: deploy/deps.sh peer):\n{}", text(&b));
        let v = lab.peer(&["veth", &lab.ours, &format!("{OUR_IP}/24"), "--mtu", &mtu.to_string()]).output().unwrap();
        assert!(v.status.success(), "peer.sh veth: {}", text(&v));
        lab
    }

    fn peer(&self, args: &[&str]) -> Command {
        let mut c = Command::new("bash");
        c.arg(peer_sh()).args(args).env("URNIC_PEER_NS", &self.bridge_ns);
        c
    }

    /// Boot a guest running `cmd`, capturing its tap into `name.pcap`.
    fn guest(&self, name: &str, cmd: &str) -> (Child, PathBuf, PathBuf) {
        let log = self.dir.join(format!("{name}.log"));
        let pcap = self.dir.join(format!("{name}.pcap"));
        let _ = std::fs::remove_file(&log);
        let child = self
            .peer(&["run", "--ip", &format!("{GUEST_IP}/24"), "--mtu", &self.mtu.to_string(), "--timeout", "400"])
            .arg("--log")
            .arg(&log)
            .arg("--pcap")
            .arg(&pcap)
            .arg("--")
            .arg(cmd)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("peer.sh run");
        (child, log, pcap)
    }

    fn wait_ready(&self, log: &Path) {
        let o = self.peer(&["wait-ready"]).arg(log).arg("240").output().unwrap();
        assert!(o.status.success(), "the rxe guest did not come up: {}\n{}", text(&o), std::fs::read_to_string(log).unwrap_or_default());
    }

    /// `urnic ARGS` inside our namespace.
    fn urnic(&self, args: &[String]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ours, env!("CARGO_BIN_EXE_urnic")]).args(args);
        c
    }
}

/// Remove the namespaces of labs whose test process is gone (killed before
/// its `Drop` ran): `urnic-rxe-TAG-PID-N` and `urnic-ours-TAG-PID-N`, after
/// stopping what still runs in them (a guest's qemu). Returns how many were
/// removed.
fn sweep_stale_labs() -> usize {
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

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn guest_rc(log: &Path) -> Option<i32> {
    let t = std::fs::read_to_string(log).ok()?;
    t.lines().rev().find_map(|l| l.strip_prefix("PEER-EXIT rc=")).and_then(|v| v.trim().parse().ok())
}

/// Every RoCE frame of the capture has a correct ICRC and tshark finds no
/// malformed or erroneous packet. Returns the number of RoCE frames.
fn check_capture(pcap: &Path) -> usize {
    let frames = urnic_datapath::capture::read_frames(pcap).unwrap_or_else(|e| panic!("{}: {e}", pcap.display()));
    let (mut roce, mut bad) = (0, Vec::new());
    for frame in &frames {
        if rocev2::wire::peek_dest_qpn(frame).is_some() && frame.len() > 42 && frame[36..38] == [0x12, 0xb7] {
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
    let mut no_heur = Vec::new();
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
        no_heur.push("--disable-heuristic".to_string());
        no_heur.push(h.to_string());
    }
    // Frames that reach a namespace after its urnic process has exited (the
    // peer's last message or a retransmission racing the exit) are answered
    // by the kernel with ICMP port unreachable, which quotes the start of the
    // RoCE packet: tshark dissects the quoted headers as InfiniBand too. Those
    // are the kernel's frames, not a RoCE sender's, and are left out.
    let roce_only = "!icmp && !icmpv6";
    let o = Command::new("tshark")
        .arg("-r")
        .arg(pcap)
        .args(&no_heur)
        .args(["-Y", &format!("({roce_only}) && (_ws.malformed || _ws.expert.severity >= \"error\")")])
        .output()
        .expect("tshark (deploy/deps.sh test)");
    assert!(o.status.success(), "tshark: {}", text(&o));
    let complaints = String::from_utf8_lossy(&o.stdout);
    assert!(complaints.trim().is_empty(), "tshark flags frames in {}:\n{complaints}", pcap.display());
    let o = Command::new("tshark").arg("-r").arg(pcap).args(&no_heur).args(["-Y", &format!("infiniband && {roce_only}")]).output().unwrap();
    let dissected = String::from_utf8_lossy(&o.stdout).lines().count();
    assert_eq!(dissected, roce, "tshark dissects every RoCE frame of {}", pcap.display());
    roce
}

/// rxe is the server (booted first), urnic the client.
fn rxe_server(lab: &Lab, name: &str, guest_cmd: &str, ours: &[String]) -> (String, String) {
    let (mut child, log, pcap) = lab.guest(name, guest_cmd);
    lab.wait_ready(&log);
    let out = lab.urnic(ours).output().unwrap();
    let _ = child.wait();
    let g = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(out.status.success(), "{name}: urnic client failed:\n{}\n--- rxe guest ---\n{g}", text(&out));
    assert_eq!(guest_rc(&log), Some(0), "{name}: rxe server failed:\n{g}\n--- urnic ---\n{}", text(&out));
    let n = check_capture(&pcap);
    assert!(n > 0, "{name}: no RoCE frame captured");
    (text(&out), g)
}

/// urnic is the server (started first), rxe the client (retrying until it
/// can connect).
fn urnic_server(lab: &Lab, name: &str, guest_cmd: &str, ours: &[String]) -> (String, String) {
    let server = lab.urnic(ours).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let retry = format!("for i in $(seq 60); do {guest_cmd} && exit 0; sleep 1; done; exit 1");
    let (mut child, log, pcap) = lab.guest(name, &retry);
    let _ = child.wait();
    let out = server.wait_with_output().unwrap();
    let g = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(out.status.success(), "{name}: urnic server failed:\n{}\n--- rxe guest ---\n{g}", text(&out));
    assert_eq!(guest_rc(&log), Some(0), "{name}: rxe client failed:\n{g}\n--- urnic ---\n{}", text(&out));
    let n = check_capture(&pcap);
    assert!(n > 0, "{name}: no RoCE frame captured");
    (text(&out), g)
}

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}

#[test]
fn rc_pingpong_both_ways_multi_packet() {
    let lab = Lab::new("rcpp", 1500);
    // 4 KiB messages at MTU 1024: SEND FIRST/MIDDLE/LAST each way.
    let (ours, theirs) = rxe_server(&lab, "rc-rxe-server", "ibv_rc_pingpong -d rxe0 -g 1 -n 20 -s 4096 -c", &args(&format!("rc-pingpong -d eth0 -g 1 -n 20 -s 4096 -c {GUEST_IP}")));
    assert!(ours.contains("20 iters in"), "{ours}");
    assert!(theirs.contains("20 iters in") && !theirs.contains("invalid data"), "{theirs}");
    let (ours, theirs) = urnic_server(&lab, "rc-urnic-server", &format!("ibv_rc_pingpong -d rxe0 -g 1 -n 20 -s 10000 -c {OUR_IP}"), &args("rc-pingpong -d eth0 -g 1 -n 20 -s 10000 -c"));
    assert!(ours.contains("20 iters in") && !ours.contains("invalid data"), "{ours}");
    assert!(theirs.contains("20 iters in"), "{theirs}");
}

#[test]
fn rc_pingpong_at_mtu_4096_over_a_9000_byte_link() {
    // IB MTU 4096 frames (4154 bytes) span two 4 KiB UMEM frames: AF_XDP
    // multi-buffer on our side. SEND FIRST/MIDDLE/LAST of 4096 B each.
    let lab = Lab::new("rcmtu", 9000);
    let (ours, _) = rxe_server(&lab, "rc-mtu4096", "ibv_rc_pingpong -d rxe0 -g 1 -n 10 -s 12288 -m 4096 -c", &args(&format!("rc-pingpong -d eth0 -g 1 -n 10 -s 12288 -m 4096 -c {GUEST_IP}")));
    assert!(ours.contains("10 iters in"), "{ours}");
    let (ours, _) = urnic_server(&lab, "rc-mtu4096-rev", &format!("ibv_rc_pingpong -d rxe0 -g 1 -n 10 -s 12288 -m 4096 -c {OUR_IP}"), &args("rc-pingpong -d eth0 -g 1 -n 10 -s 12288 -m 4096 -c"));
    assert!(ours.contains("10 iters in") && !ours.contains("invalid data"), "{ours}");
    // The capture holds full 4096-byte payloads (frames of 4154 bytes).
    let pcap = lab.dir.join("rc-mtu4096.pcap");
    let o = Command::new("tshark").arg("-r").arg(&pcap).args(["-Y", "infiniband && frame.len == 4154"]).output().unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).lines().count() >= 20, "no 4154-byte frames in {}", pcap.display());
}

#[test]
fn ud_pingpong_both_ways() {
    let lab = Lab::new("udpp", 1500);
    let (ours, _) = rxe_server(&lab, "ud-rxe-server", "ibv_ud_pingpong -d rxe0 -g 1 -n 20 -s 1000 -c", &args(&format!("ud-pingpong -d eth0 -g 1 -n 20 -s 1000 -c {GUEST_IP}")));
    assert!(ours.contains("20 iters in"), "{ours}");
    let (ours, theirs) = urnic_server(&lab, "ud-urnic-server", &format!("ibv_ud_pingpong -d rxe0 -g 1 -n 20 -s 1000 -c {OUR_IP}"), &args("ud-pingpong -d eth0 -g 1 -n 20 -s 1000 -c"));
    assert!(ours.contains("20 iters in") && !ours.contains("invalid data"), "{ours}");
    assert!(theirs.contains("20 iters in"), "{theirs}");
}

/// The perftest cases: (urnic test, perftest tool, extra perftest args, sizes).
const PERF: &[(&str, &str, &str, &[usize])] = &[
    ("write-bw", "ib_write_bw", "", &[1, 4096, 1 << 20]),
    ("read-bw", "ib_read_bw", "", &[1, 4096, 1 << 20]),
    ("send-bw", "ib_send_bw", "", &[1, 4096, 1 << 20]),
    ("atomic-bw", "ib_atomic_bw", "-A FETCH_AND_ADD", &[8]),
    ("atomic-bw", "ib_atomic_bw", "-A CMP_AND_SWAP", &[8]),
    ("send-lat", "ib_send_lat", "", &[2, 4096]),
    ("write-lat", "ib_write_lat", "", &[2, 4096]),
    ("read-lat", "ib_read_lat", "", &[2, 4096]),
];

fn iters_for(size: usize) -> usize {
    if size >= 1 << 20 {
        5
    } else {
        20
    }
}

/// All perftest cases with rxe as the server: one guest runs the servers
/// one after the other; urnic runs the clients.
#[test]
fn perftest_rxe_servers_urnic_clients() {
    let lab = Lab::new("perf1", 1500);
    let mut script = String::from("set -e\n");
    let mut ours = Vec::new();
    for &(t, tool, extra, sizes) in PERF {
        for &s in sizes {
            let n = iters_for(s);
            script.push_str(&format!("{tool} -d rxe0 -x 1 -F -n {n} -s {s} {extra}\n"));
            let a = if extra.is_empty() { String::new() } else { format!(" {extra}") };
            ours.push((format!("{t} s={s}{a}"), args(&format!("perf {t} -d eth0 -x 1 -n {n} -s {s}{a} {GUEST_IP}"))));
        }
    }
    let share = lab.dir.join("share1");
    std::fs::create_dir_all(&share).unwrap();
    std::fs::write(share.join("cmd.sh"), &script).unwrap();
    let (mut child, log, pcap) = lab.guest_shared("perf-rxe-servers", &share);
    lab.wait_ready(&log);
    for (what, a) in &ours {
        // The next server may still be starting: the client retries connecting.
        let out = lab.urnic(a).output().unwrap();
        assert!(out.status.success(), "{what}: urnic client failed:\n{}\n--- rxe ---\n{}", text(&out), std::fs::read_to_string(&log).unwrap_or_default());
        // A short pause lets the guest's server exit and the next one listen.
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    let _ = child.wait();
    let g = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(guest_rc(&log), Some(0), "rxe perftest servers:\n{g}");
    assert!(check_capture(&pcap) > 100);
}

/// All perftest cases with urnic as the server, perftest on rxe the client.
#[test]
fn perftest_urnic_servers_rxe_clients() {
    let lab = Lab::new("perf2", 1500);
    let mut script = String::from("set -e\nretry() { for i in $(seq 60); do \"$@\" && return 0; sleep 1; done; return 1; }\n");
    let mut ours = Vec::new();
    for &(t, tool, extra, sizes) in PERF {
        for &s in sizes {
            let n = iters_for(s);
            script.push_str(&format!("retry {tool} -d rxe0 -x 1 -F -n {n} -s {s} {extra} {OUR_IP}\n"));
            let a = if extra.is_empty() { String::new() } else { format!(" {extra}") };
            ours.push((format!("{t} s={s}{a}"), args(&format!("perf {t} -d eth0 -x 1 -n {n} -s {s}{a}"))));
        }
    }
    let share = lab.dir.join("share2");
    std::fs::create_dir_all(&share).unwrap();
    std::fs::write(share.join("cmd.sh"), &script).unwrap();
    let (mut child, log, pcap) = lab.guest_shared("perf-urnic-servers", &share);
    for (what, a) in &ours {
        let out = lab.urnic(a).output().unwrap();
        assert!(out.status.success(), "{what}: urnic server failed:\n{}\n--- rxe ---\n{}", text(&out), std::fs::read_to_string(&log).unwrap_or_default());
        let o = text(&out);
        // ib_read_lat's server measures nothing, as perftest's does not.
        assert!(o.contains("#bytes") || what.starts_with("read-lat"), "{what}: no result table:\n{o}");
    }
    let _ = child.wait();
    let g = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(guest_rc(&log), Some(0), "rxe perftest clients:\n{g}");
    assert!(check_capture(&pcap) > 100);
}

/// 5% of the frames urnic receives are dropped by its XDP program: rxe's
/// requester and our responder (and the other way round) recover by
/// retransmission; the transfers complete and our counters show it.
#[test]
fn retransmission_interoperates_under_loss() {
    let lab = Lab::new("loss", 1500);
    // rxe writes to us (we are the responder: we NAK the gaps, rxe goes back).
    let (ours, _) = urnic_server(&lab, "loss-rxe-writes", &format!("ib_write_bw -d rxe0 -x 1 -F -n 20 -s 65536 {OUR_IP}"), &args("perf write-bw -d eth0 -x 1 -n 20 -s 65536 --drop 0.05 --stats"));
    let naks: u64 = ours.lines().filter(|l| l.contains("resp_naks_psn_seq_sent") || l.contains("resp_duplicates")).filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok()).sum();
    assert!(ours.contains("xdp_impair_dropped"), "{ours}");
    assert!(naks > 0, "no sequence NAK or duplicate seen at 5% loss:\n{ours}");
    // We write to rxe and lose some of its ACKs: our requester times out or
    // is NAKed and retransmits.
    let (ours, _) = rxe_server(&lab, "loss-urnic-writes", "ib_write_bw -d rxe0 -x 1 -F -n 20 -s 65536", &args(&format!("perf write-bw -d eth0 -x 1 -n 20 -s 65536 --drop 0.3 --stats {GUEST_IP}")));
    assert!(ours.contains("#bytes"), "{ours}");
}

impl Lab {
    /// A guest that runs DIR/cmd.sh (shared over 9p).
    fn guest_shared(&self, name: &str, share: &Path) -> (Child, PathBuf, PathBuf) {
        let log = self.dir.join(format!("{name}.log"));
        let pcap = self.dir.join(format!("{name}.pcap"));
        let child = self
            .peer(&["run", "--ip", &format!("{GUEST_IP}/24"), "--mtu", &self.mtu.to_string(), "--timeout", "900"])
            .arg("--log")
            .arg(&log)
            .arg("--pcap")
            .arg(&pcap)
            .arg("--share")
            .arg(share)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("peer.sh run");
        (child, log, pcap)
    }
}
