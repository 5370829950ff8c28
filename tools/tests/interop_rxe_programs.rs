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
//!   need `-cm1` (RDMA-CM: interop_rxe_rdmacm.rs runs them against rxe,
//!   loopback-test's rdmacm_programs between urnic processes) and `ud_lat`
//!   (never RDMA-CM) cannot run on any RoCE device.
//! - perftest `-R`, rping and the other RDMA-CM programs: interop_rxe_rdmacm.rs.
//!
//! The library is built by `ibverbs-abi/link.sh release` (deploy/test.sh
//! does it first); `URNIC_LIB_DIR` points elsewhere. The guests run under
//! software emulation: sizes and counts are modest and nothing is timed
//! (the loops below have hang guards that fail loudly).

mod rxe_lab;

use rxe_lab::{case_epilogue, case_marker, check_capture, lib_dir, perftest_rows, roce_frames_link_local, Lab, GUEST_IP, OUR_IP};

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
        // perftest turns cycles into time with the CPU frequency it measures
        // at start; in the emulated guest that measurement can fail, which
        // perftest reports itself ("Correlation coefficient r^2: 0.72 <
        // 0.9"), and a short run's figures then come out as zero. Its result
        // row, printed once every iteration completed, still shows the case
        // ran; only then is a zero figure taken (and said).
        let clock_failed = out.lines().any(|l| l.starts_with("Correlation coefficient r^2") && l.contains("< 0.9"));
        for r in &rows {
            // bw: #bytes #iterations BW-peak BW-average MsgRate;
            // lat: #bytes #iterations t_min t_max t_typical ...
            // (A bandwidth column rounds to 0.00 MB/s for 2-byte messages
            // under emulation; the message rate then still shows.)
            let ok = if lat { r[2] > 0.0 && r[4] > 0.0 } else { r[3] > 0.0 || r[4] > 0.0 };
            if !ok && clock_failed && r[1] > 0.0 {
                eprintln!(
                    "{}: the {side} client's perftest could not measure its CPU clock: its figures read zero, {} iterations done",
                    self.name, r[1]
                );
                continue;
            }
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

/// Whether a client failed only because nothing listened yet (the guest's
/// next server still starting): nothing was exchanged, it may run again.
fn refused_before_connecting(out: &str) -> bool {
    out.contains("Couldn't connect to") || out.contains("Unable to open file descriptor for socket connection")
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
        s.push_str(&format!("echo {}\n{cmd} >/host/{name}.out 2>&1; rc=$?\n{}", case_marker(c.name), case_epilogue(c.name), name = c.name));
    }
    s
}

/// rxe runs the servers (one after the other in one guest), urnic's
/// library the clients.
#[test]
fn debian_programs_rxe_servers_urnic_clients() {
    let lab = Lab::new("progs1", 1500);
    let lib = lib_dir("libibverbs.so.1");
    let mut guest = lab.boot("progs-rxe-servers", &guest_script(false));
    lab.wait_ready(&guest.log);
    let mut ran = Vec::new();
    for c in CASES {
        guest.wait_for_marker(&case_marker(c.name));
        let mut argv = c.argv("urnic-eth0");
        argv.push(GUEST_IP.to_string());
        let t = lab.urnic_client(&lib, &argv, c.name, (&guest.log, &guest.share), &mut refused_before_connecting);
        eprintln!("{}: urnic client: {}", c.name, c.check_client_output(&t, "urnic"));
        ran.push(c.name);
    }
    guest.finish("rxe's servers");
    for c in CASES.iter().filter(|c| c.is_pingpong()) {
        // The pingpong servers check the buffers too (-c).
        c.check_client_output(&guest.case_output(c.name), "rxe (server)");
    }
    let frames = check_capture(&guest.pcap);
    assert!(frames > 1000, "only {frames} RoCE frames captured for {ran:?}");
    eprintln!("{frames} RoCE frames captured, every one parsed (ICRC checked) and dissected");
}

/// urnic's library runs the servers (one after the other), rxe the clients
/// (one guest, retrying each until urnic's server listens).
#[test]
fn debian_programs_urnic_servers_rxe_clients() {
    let lab = Lab::new("progs2", 1500);
    let lib = lib_dir("libibverbs.so.1");
    let mut guest = lab.boot("progs-urnic-servers", &guest_script(true));
    for (i, c) in CASES.iter().enumerate() {
        let t = lab.urnic_server(&lib, &c.argv("urnic-eth0"), c.name, &mut guest);
        if c.is_pingpong() {
            c.check_client_output(&t, "urnic (server)");
        }
        // The guest wrote its client's output before starting the next case.
        guest.wait_for_case(CASES.get(i + 1).map(|n| n.name));
        eprintln!("{}: rxe client: {}", c.name, c.check_client_output(&guest.case_output(c.name), "rxe"));
    }
    guest.finish("rxe's clients");
    let frames = check_capture(&guest.pcap);
    assert!(frames > 1000, "only {frames} RoCE frames captured");
    eprintln!("{frames} RoCE frames captured, every one parsed (ICRC checked) and dissected");
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
    let lib = lib_dir("libibverbs.so.1");
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
    let mut guest = lab.boot("progs-ll", &script);
    lab.wait_ready(&guest.log);
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
    guest.wait_for_marker(&case_marker("ll_rxe_server"));
    let t = lab.urnic_client(&lib, &argv(Some(GUEST_IP)), case.name, (&guest.log, &guest.share), &mut refused_before_connecting);
    eprintln!("urnic client: {}", case.check_client_output(&t, "urnic"));
    link_local(&t, "urnic client");

    // urnic's library serves, rxe is the client.
    guest.wait_for_marker(&case_marker("ll_rxe_client"));
    let t = lab.urnic_server(&lib, &argv(None), case.name, &mut guest);
    case.check_client_output(&t, "urnic (server)");
    link_local(&t, "urnic server");

    guest.finish("rxe's side");
    for (f, side) in [("server", "rxe (server)"), ("client", "rxe (client)")] {
        let theirs = guest.case_output(f);
        eprintln!("{side}: {}", case.check_client_output(&theirs, side));
        link_local(&theirs, side);
    }
    let frames = check_capture(&guest.pcap);
    let (roce, link_local) = roce_frames_link_local(&guest.pcap);
    assert_eq!(roce, frames);
    // 50 messages of 4 packets each way, twice, and their ACKs.
    assert!(frames >= 800, "only {frames} RoCE frames captured");
    assert_eq!(link_local, frames, "RoCE frames not between the link-local addresses");
    eprintln!("{frames} RoCE frames captured between the link-local GIDs, every one parsed (ICRC checked) and dissected");
}

/// A zero figure passes only when perftest said it could not measure its
/// CPU clock, and only for a row (every iteration done); anything else
/// fails. (No guest: the check alone, on perftest's own output shapes.)
#[test]
fn a_zero_figure_passes_only_when_perftest_could_not_measure_its_clock() {
    let case = Case { name: "send_bw_inline", program: "ib_send_bw", args: "-F -n 50 -s 64 -I 64" };
    let row = |bw: &str, rate: &str| {
        format!(" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n 64         50               {bw}               {bw}      {rate}\n")
    };
    let warned = "Correlation coefficient r^2: 0.715147 < 0.9\n";
    assert_eq!(case.check_client_output(&(warned.to_string() + &row("0.00", "0.000000")), "rxe"), "64 50 0 0 0");
    assert_eq!(case.check_client_output(&row("3.20", "0.050000"), "rxe"), "64 50 3.2 3.2 0.05");
    let zero_without_warning = std::panic::catch_unwind(|| case.check_client_output(&row("0.00", "0.000000"), "rxe"));
    assert!(zero_without_warning.is_err(), "a zero figure without perftest's warning fails");
    let fine_clock = "Correlation coefficient r^2: 0.99 ok\n".to_string() + &row("0.00", "0.000000");
    assert!(std::panic::catch_unwind(|| case.check_client_output(&fine_clock, "rxe")).is_err());
}

/// The capture check judges RoCE frames only. The fixture is fifteen frames
/// of a CI capture: five of urnic's RDMA WRITEs, then perftest's TCP
/// exchange from ephemeral port 34980, EtherCAT's, which tshark dissects as
/// two malformed TC-NV packets. (No guest: the check alone.)
#[test]
fn the_capture_check_leaves_perftests_tcp_exchange_alone() {
    let pcap = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/perftest_tcp_on_the_ethercat_port.pcap");
    let o = std::process::Command::new("tshark")
        .arg("-r")
        .arg(&pcap)
        .args(["-Y", "tcp && _ws.malformed"])
        .output()
        .expect("tshark (deploy/deps.sh test)");
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), 2, "the fixture holds the two TCP frames tshark calls malformed");
    assert_eq!(check_capture(&pcap), 5);
}
