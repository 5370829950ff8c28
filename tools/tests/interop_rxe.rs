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

mod rxe_lab;

use std::process::{Command, Stdio};

use rxe_lab::{check_capture, guest_rc, roce_frames_link_local, text, Lab, GUEST_IP, OUR_IP};

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
    let (ours, theirs) = rxe_server(
        &lab,
        "rc-rxe-server",
        "ibv_rc_pingpong -d rxe0 -g 1 -n 20 -s 4096 -c",
        &args(&format!("rc-pingpong -d eth0 -g 1 -n 20 -s 4096 -c {GUEST_IP}")),
    );
    assert!(ours.contains("20 iters in"), "{ours}");
    assert!(theirs.contains("20 iters in") && !theirs.contains("invalid data"), "{theirs}");
    let (ours, theirs) = urnic_server(
        &lab,
        "rc-urnic-server",
        &format!("ibv_rc_pingpong -d rxe0 -g 1 -n 20 -s 10000 -c {OUR_IP}"),
        &args("rc-pingpong -d eth0 -g 1 -n 20 -s 10000 -c"),
    );
    assert!(ours.contains("20 iters in") && !ours.contains("invalid data"), "{ours}");
    assert!(theirs.contains("20 iters in"), "{theirs}");
}

#[test]
fn rc_pingpong_at_mtu_4096_over_a_9000_byte_link() {
    // IB MTU 4096 frames (4154 bytes) span two 4 KiB UMEM frames: AF_XDP
    // multi-buffer on our side. SEND FIRST/MIDDLE/LAST of 4096 B each.
    let lab = Lab::new("rcmtu", 9000);
    let (ours, _) = rxe_server(
        &lab,
        "rc-mtu4096",
        "ibv_rc_pingpong -d rxe0 -g 1 -n 10 -s 12288 -m 4096 -c",
        &args(&format!("rc-pingpong -d eth0 -g 1 -n 10 -s 12288 -m 4096 -c {GUEST_IP}")),
    );
    assert!(ours.contains("10 iters in"), "{ours}");
    let (ours, _) = urnic_server(
        &lab,
        "rc-mtu4096-rev",
        &format!("ibv_rc_pingpong -d rxe0 -g 1 -n 10 -s 12288 -m 4096 -c {OUR_IP}"),
        &args("rc-pingpong -d eth0 -g 1 -n 10 -s 12288 -m 4096 -c"),
    );
    assert!(ours.contains("10 iters in") && !ours.contains("invalid data"), "{ours}");
    // The capture holds full 4096-byte payloads (frames of 4154 bytes).
    let pcap = lab.dir.join("rc-mtu4096.pcap");
    let o = Command::new("tshark").arg("-r").arg(&pcap).args(["-Y", "infiniband && frame.len == 4154"]).output().unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).lines().count() >= 20, "no 4154-byte frames in {}", pcap.display());
}

#[test]
fn ud_pingpong_both_ways() {
    let lab = Lab::new("udpp", 1500);
    let (ours, _) = rxe_server(
        &lab,
        "ud-rxe-server",
        "ibv_ud_pingpong -d rxe0 -g 1 -n 20 -s 1000 -c",
        &args(&format!("ud-pingpong -d eth0 -g 1 -n 20 -s 1000 -c {GUEST_IP}")),
    );
    assert!(ours.contains("20 iters in"), "{ours}");
    let (ours, theirs) = urnic_server(
        &lab,
        "ud-urnic-server",
        &format!("ibv_ud_pingpong -d rxe0 -g 1 -n 20 -s 1000 -c {OUR_IP}"),
        &args("ud-pingpong -d eth0 -g 1 -n 20 -s 1000 -c"),
    );
    assert!(ours.contains("20 iters in") && !ours.contains("invalid data"), "{ours}");
    assert!(theirs.contains("20 iters in"), "{theirs}");
}

/// Link-local GIDs (index 0: fe80:: from the MAC's EUI-64, rxe's default
/// GID) in both roles, IPv6 on in our namespace and the guest (issue 19):
/// each side finds the other's MAC by neighbour discovery for a link-local
/// address, which needs the interface as its scope. rdma-core's -c checks
/// the data on both sides; every RoCE frame goes between the two fe80::
/// addresses.
#[test]
fn rc_pingpong_over_link_local_gids_both_ways() {
    let lab = Lab::new_ipv6("rcll", 1500);
    let ll = |out: &str, side: &str| {
        for what in ["local address", "remote address"] {
            let line = out.lines().find(|l| l.contains(what)).unwrap_or_default();
            assert!(line.contains("GID fe80:"), "{side}: the {what} is not a link-local GID:\n{out}");
        }
    };
    for (name, rxe_serves) in [("rc-ll-rxe-server", true), ("rc-ll-urnic-server", false)] {
        let (ours, theirs) = if rxe_serves {
            // 4 KiB messages at MTU 1024: SEND FIRST/MIDDLE/LAST each way.
            rxe_server(
                &lab,
                name,
                "ibv_rc_pingpong -d rxe0 -g $RXE_GID_LL -n 20 -s 4096 -c",
                &args(&format!("rc-pingpong -d eth0 -g 0 -n 20 -s 4096 -c {GUEST_IP}")),
            )
        } else {
            urnic_server(
                &lab,
                name,
                &format!("ibv_rc_pingpong -d rxe0 -g $RXE_GID_LL -n 20 -s 4096 -c {OUR_IP}"),
                &args("rc-pingpong -d eth0 -g 0 -n 20 -s 4096 -c"),
            )
        };
        assert!(ours.contains("20 iters in") && !ours.contains("invalid data"), "{name}: {ours}");
        assert!(theirs.contains("20 iters in") && !theirs.contains("invalid data"), "{name}: {theirs}");
        ll(&ours, "urnic");
        ll(&theirs, "rxe");
        // 20 messages of 4 packets each way, and their ACKs.
        let (roce, link_local) = roce_frames_link_local(&lab.dir.join(format!("{name}.pcap")));
        assert!(roce >= 160, "{name}: only {roce} RoCE frames captured");
        assert_eq!(link_local, roce, "{name}: RoCE frames not between the link-local addresses");
    }
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
        assert!(
            out.status.success(),
            "{what}: urnic client failed:\n{}\n--- rxe ---\n{}",
            text(&out),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
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
        assert!(
            out.status.success(),
            "{what}: urnic server failed:\n{}\n--- rxe ---\n{}",
            text(&out),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
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
    let (ours, _) = urnic_server(
        &lab,
        "loss-rxe-writes",
        &format!("ib_write_bw -d rxe0 -x 1 -F -n 20 -s 65536 {OUR_IP}"),
        &args("perf write-bw -d eth0 -x 1 -n 20 -s 65536 --drop 0.05 --stats"),
    );
    let naks: u64 = ours
        .lines()
        .filter(|l| l.contains("resp_naks_psn_seq_sent") || l.contains("resp_duplicates"))
        .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
        .sum();
    assert!(ours.contains("xdp_impair_dropped"), "{ours}");
    assert!(naks > 0, "no sequence NAK or duplicate seen at 5% loss:\n{ours}");
    // We write to rxe and lose some of its ACKs: our requester times out or
    // is NAKed and retransmits.
    let (ours, _) = rxe_server(
        &lab,
        "loss-urnic-writes",
        "ib_write_bw -d rxe0 -x 1 -F -n 20 -s 65536",
        &args(&format!("perf write-bw -d eth0 -x 1 -n 20 -s 65536 --drop 0.3 --stats {GUEST_IP}")),
    );
    assert!(ours.contains("#bytes"), "{ours}");
}
