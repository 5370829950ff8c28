//! Debian's unmodified `mckey` (rdmacm-utils: `rdma_join_multicast_ex`,
//! `rdma_leave_multicast`, UD sends to the group) on urnic's librdmacm.so.1
//! and libibverbs.so.1 (issue 18): namespaces on one bridge, one sender and
//! several receivers, each process with its own urnic device. Every run is
//! captured (`URNIC_PCAP`) and tshark must dissect the group's RoCE frames
//! (UD SEND with immediate to QP 0xFFFFFF, the group's IP address) without
//! a malformed packet or an expert error.
//!
//! mckey's receivers poll until every message arrives, the sender sends
//! once, 5 s after its join: a receiver is ready once the kernel holds the
//! group on its interface (`ip maddr`, urnic's host join on the QP's
//! attach), and the sender starts only then.
//!
//! The libraries are built by `ibverbs-abi/link.sh release` (deploy/test.sh
//! runs it first); `URNIC_LIB_DIR` points elsewhere. Nothing is timed: loops
//! have hang guards.

mod programs;
mod veth;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use programs::text;
use urnic_datapath::netns::Segment;

/// A bridge with `n` namespaces, captures in a directory of the test's.
struct Lab {
    seg: Segment,
    lib: PathBuf,
    dir: PathBuf,
}

impl Lab {
    fn new(tag: &str, n: usize) -> Lab {
        veth::require_root();
        let _ = Segment::sweep_stale();
        let seg = Segment::create(tag, n, 1500).expect("create the segment (needs root and iproute2)");
        let dir = std::env::temp_dir().join(format!("urnic-mckey-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("capture dir");
        // urnic offers an interface as a device once it is up.
        for (ns, ifname) in seg.ns.iter().zip(&seg.ifname) {
            let start = Instant::now();
            loop {
                let out = Command::new("ip").args(["-n", ns, "-o", "link", "show", ifname]).output().expect("ip link");
                if String::from_utf8_lossy(&out.stdout).contains("state UP") {
                    break;
                }
                // A hang guard, not a timing assertion.
                assert!(start.elapsed() < Duration::from_secs(30), "{ifname} in {ns} never came up");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Lab { seg, lib: programs::lib_dir("librdmacm.so.1"), dir }
    }

    fn ip(&self, i: usize, v6: bool) -> String {
        if v6 {
            std::net::Ipv6Addr::from(self.seg.ipv6[i]).to_string()
        } else {
            std::net::Ipv4Addr::from(self.seg.ipv4[i]).to_string()
        }
    }

    fn pcap(&self, i: usize) -> PathBuf {
        self.dir.join(format!("member{i}.pcap"))
    }

    /// mckey in member `i`'s namespace on urnic, bound to its address.
    fn mckey(&self, i: usize, v6: bool, args: &[&str]) -> Running {
        let stats = self.dir.join(format!("member{i}.stats"));
        std::fs::create_dir_all(&stats).expect("stats dir");
        Command::new("ip")
            .args(["netns", "exec", &self.seg.ns[i], "env"])
            .arg(format!("LD_LIBRARY_PATH={}", self.lib.display()))
            .arg(format!("URNIC_DEVICES={}", self.seg.ifname[i]))
            .arg(format!("URNIC_PCAP={}", self.pcap(i).display()))
            .arg(format!("URNIC_STATS={}", stats.display()))
            .arg(programs::program("mckey", "rdmacm-utils"))
            .args(["-b", &self.ip(i, v6)])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map(|c| Running(Some(c)))
            .expect("start mckey")
    }

    /// Wait until the kernel holds `group` on member `i`'s interface (the
    /// receiver's QP is attached), failing if the receiver exits first.
    fn wait_joined(&self, i: usize, group: &str, rx: &mut Running) {
        let rx = rx.0.as_mut().expect("running");
        let start = Instant::now();
        loop {
            let o = Command::new("ip").args(["-n", &self.seg.ns[i], "maddr", "show", "dev", &self.seg.ifname[i]]).output().expect("ip maddr");
            if String::from_utf8_lossy(&o.stdout).split_whitespace().any(|w| w == group) {
                return;
            }
            if let Ok(Some(st)) = rx.try_wait() {
                panic!("receiver {i} exited ({st}) before joining {group}:\n{}", text(&rx_output(rx)));
            }
            // A hang guard, not a timing assertion.
            assert!(start.elapsed() < Duration::from_secs(120), "receiver {i} never joined {group}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// tshark on member `i`'s capture: the group's UD SENDs with immediate
    /// (opcode 0x65) to QP 0xFFFFFF, and nothing malformed.
    fn group_sends(&self, i: usize, group: &str) -> usize {
        let f = self.pcap(i);
        assert!(f.exists(), "no capture {}", f.display());
        // RoCEv2 over IPv6 carries UDP checksum 0, as rxe sends it
        // (`prepare_udp_hdr`); Wireshark flags that (RFC 8200) and nothing
        // else may be wrong.
        let bad = tshark(&f, "_ws.malformed || _ws.expert.severity >= \"error\"");
        let msgs = tshark_fields(&f, "_ws.malformed || _ws.expert.severity >= \"error\"", "_ws.expert.message");
        let other = msgs.split([',', '\n']).map(str::trim).any(|m| !m.is_empty() && m != "Illegal checksum value (0)");
        assert!(bad.trim().is_empty() || (group.contains(':') && !other), "tshark finds errors in {}:\n{bad}\n{msgs}", f.display());
        let ipf = if group.contains(':') { "ipv6.dst" } else { "ip.dst" };
        tshark(&f, &format!("{ipf} == {group} && udp.dstport == 4791 && infiniband.bth.opcode == 0x65 && infiniband.bth.destqp == 0xffffff"))
            .lines()
            .count()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn tshark(f: &Path, filter: &str) -> String {
    let o = Command::new("tshark")
        .arg("-r")
        .arg(f)
        .args(["--disable-protocol", "rpcordma", "-Y", filter])
        .stderr(Stdio::null())
        .output()
        .expect("tshark (deploy/deps.sh test installs it)");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn tshark_fields(f: &Path, filter: &str, field: &str) -> String {
    let o = Command::new("tshark")
        .arg("-r")
        .arg(f)
        .args(["--disable-protocol", "rpcordma", "-Y", filter, "-T", "fields", "-e", field])
        .stderr(Stdio::null())
        .output()
        .expect("tshark");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A mckey process, killed if the test fails while it runs.
struct Running(Option<Child>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn rx_output(c: &mut Child) -> Output {
    let _ = c.kill();
    Output { status: c.wait().expect("wait"), stdout: read(c.stdout.take()), stderr: read(c.stderr.take()) }
}

fn read(r: Option<impl std::io::Read>) -> Vec<u8> {
    let mut v = vec![];
    if let Some(mut r) = r {
        let _ = r.read_to_end(&mut v);
    }
    v
}

/// Wait for a mckey that finishes on its own (bounded: a hung one is
/// killed and fails the test).
fn finish(mut running: Running, who: &str) -> String {
    let mut child = running.0.take().expect("running");
    let start = Instant::now();
    while matches!(child.try_wait(), Ok(None)) {
        if start.elapsed() > Duration::from_secs(180) {
            panic!("{who} hung:\n{}", text(&rx_output(&mut child)));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = child.wait_with_output().expect("mckey output");
    let out = text(&o);
    assert!(o.status.success(), "{who} failed ({}):\n{out}", o.status);
    out
}

/// Member 0 sends `count` messages to `group`, members 1.. receive them
/// all; `sender_args` adds the sender's options (`-o`: a send-only join),
/// `receiver_args` the receivers' (`-c 2`: two ids, each with its QP on
/// the group, each getting every message).
fn one_sender_many_receivers(tag: &str, members: usize, group: &str, v6: bool, sender_args: &[&str], receiver_args: &[&str]) {
    let lab = Lab::new(tag, members);
    let count = "10";
    let mut rx: Vec<Running> = (1..members).map(|i| lab.mckey(i, v6, &[&["-m", group, "-C", count], receiver_args].concat())).collect();
    for (i, r) in rx.iter_mut().enumerate() {
        lab.wait_joined(i + 1, group, r);
    }
    let mut args = vec!["-m", group, "-s", "-C", count];
    args.extend_from_slice(sender_args);
    let sent = finish(lab.mckey(0, v6, &args), "the sender");
    let dgid = if v6 { group.to_string() } else { format!("::ffff:{group}") };
    assert!(sent.contains(&format!("mckey: joined dgid: {dgid} mlid 0x0 sl 0")), "sender's join:\n{sent}");
    assert!(sent.contains("initiating data transfers") && sent.contains("data transfers complete"), "{sent}");
    for (i, r) in rx.into_iter().enumerate() {
        let out = finish(r, &format!("receiver {}", i + 1));
        let joins = out.matches(&format!("mckey: joined dgid: {dgid} mlid 0x0 sl 0")).count();
        let ids = receiver_args.windows(2).find(|w| w[0] == "-c").map_or(1, |w| w[1].parse().unwrap());
        assert_eq!(joins, ids, "receiver {}: each id joined: {out}", i + 1);
        assert!(out.contains("receiving data transfers") && out.contains("data transfers complete"), "receiver {}: {out}", i + 1);
        // The receiver left: the kernel no longer holds the group.
        let o = Command::new("ip").args(["-n", &lab.seg.ns[i + 1], "maddr", "show", "dev", &lab.seg.ifname[i + 1]]).output().expect("ip maddr");
        assert!(!String::from_utf8_lossy(&o.stdout).split_whitespace().any(|w| w == group), "receiver {} still in {group}", i + 1);
    }
    assert_eq!(lab.group_sends(0, group), 10, "the sender's capture holds its 10 sends to {group}");
    for i in 1..members {
        assert_eq!(lab.group_sends(i, group), 10, "member {i}'s capture holds the 10 sends to {group}");
    }
}

#[test]
fn mckey_ipv4_one_sender_three_receivers() {
    one_sender_many_receivers("mck4", 4, "239.18.0.1", false, &[], &[]);
}

#[test]
fn mckey_ipv4_send_only_sender() {
    one_sender_many_receivers("mcko", 2, "239.18.0.2", false, &["-o"], &[]);
}

#[test]
fn mckey_ipv6_one_sender_two_receivers() {
    one_sender_many_receivers("mck6", 3, "ff0e::18:1", true, &[], &[]);
}

/// One receiving process with two ids (two QPs of one device on the group):
/// each QP gets its own copy of every message.
#[test]
fn mckey_two_qps_of_one_receiver() {
    one_sender_many_receivers("mck2", 2, "239.18.0.3", false, &[], &["-c", "2"]);
}

/// `ibverbs-abi/tests/c/rdmacm_mcast.c` (bad arguments, wrong states, the
/// MULTICAST_JOIN event's fields, attach / host membership / leave,
/// send-only, a synchronous id, MULTICAST_ERROR past the device's limit),
/// compiled against the system's `<rdma/rdma_cma.h>` and linked with
/// urnic's libraries, in a namespace holding one urnic device.
#[test]
fn join_and_leave_from_c() {
    let h = "/usr/include/rdma/rdma_cma.h";
    assert!(Path::new(h).exists(), "{h} is missing: apt-get install librdmacm-dev (deploy/deps.sh build installs it)");
    let lab = Lab::new("mckc", 2);
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../ibverbs-abi/tests/c/rdmacm_mcast.c");
    let exe = lab.dir.join("rdmacm_mcast");
    let o = Command::new("cc")
        .args(["-std=gnu11", "-O1", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg(format!("-L{}", lab.lib.display()))
        .args(["-l:librdmacm.so.1", "-l:libibverbs.so.1"])
        .output()
        .expect("cc (apt-get install gcc)");
    assert!(o.status.success(), "cc failed:\n{}", text(&o));
    let o = Command::new("ip")
        .args(["netns", "exec", &lab.seg.ns[0], "env"])
        .arg(format!("LD_LIBRARY_PATH={}", lab.lib.display()))
        .arg(format!("URNIC_DEVICES={}", lab.seg.ifname[0]))
        .arg("URNIC_STATS=0")
        .arg(&exe)
        .arg(lab.ip(0, false))
        .output()
        .expect("run rdmacm_mcast");
    let out = text(&o);
    assert!(o.status.success() && !out.contains("FAIL"), "rdmacm_mcast failed ({}):\n{out}", o.status);
    let summary = out.lines().find(|l| l.ends_with("failed")).unwrap_or("");
    let checks: usize = summary.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(summary.ends_with(" 0 failed") && checks >= 39, "expected the full run (39 checks, none failed):\n{out}");
}
