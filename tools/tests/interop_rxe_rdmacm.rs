//! Debian's unmodified RDMA-CM programs (rdmacm-utils, perftest `-R`,
//! qperf `-cm1`) on urnic's librdmacm.so.1 against the same programs on
//! Linux rxe (the kernel's CM), in both roles.
//!
//! As interop_rxe_programs: urnic's side in our namespace on the rxe lab's
//! bridge (device urnic-eth0), the guest (deploy/rxe-peer/peer.sh) runs the
//! other side of every case in sequence from a script over 9p; one boot per
//! direction; the guest's tap is captured and every RoCE frame (the CM MADs
//! on QP1 included) must pass our parser (ICRC) and tshark's dissection.
//!
//! The cases: rping -v -C 10, rping -q (each side's own QP moved with
//! rdma_init_qp_attr), ucmatose with 4 connections, udaddy (UD ids through
//! SIDR), rdma_server / rdma_client, ib_send_bw -R, ib_write_bw -R, and
//! qperf -cm1 with rc_bw, rc_lat, rc_rdma_write_bw and rc_rdma_read_lat.
//!
//! perftest 4.5-0.17's `-R` client connects its test QP as soon as the
//! server has sent its last handshake message, without waiting for the
//! server's second listen: a client faster than the server (urnic's client
//! against rxe's server in the emulated guest, about one run in three; two
//! rxe guests with the server's guest slowed down too) is rejected with
//! REJ "invalid service ID" (reason 8), and perftest's own retry then calls
//! `rdma_resolve_addr` on the ids it has just destroyed and fails. Such a
//! run, proven by the client's output *and* the capture (the REJ, reason 8,
//! answers the second REQ right after the first connection's RTU), starts
//! the pair again; any other failure fails the test.
//!
//! urnic's client lost that race about 19 runs in 20 on a 2-vCPU host, so
//! ten runs again were often not enough. So while rxe's perftest servers
//! run, the guest delays every CM MAD it receives by 50 ms (tc: an ingress
//! u32 filter for UDP 4791 with BTH destination QP 1, redirected to an ifb
//! device with netem), which gives rxe's server time to listen before the
//! test QP's REQ comes: a slower path for the CM alone, the programs and
//! both stacks unchanged. The guest reports how many MADs it delayed, and
//! the test checks it did. A client that still loses runs again, up to
//! MAX_LOST times; one more loss fails the test, saying so (before,
//! an eleventh loss fell through to the plain "refused" retry, which ran
//! the client again against the old, stuck server: the test QP it then
//! connected never had a receive posted, and the client hung in RNR NAKs).
//!
//! qperf 0.4.11 has a race of the same kind: its server sends the client
//! the port of a test's RDMA-CM connection before it calls `rdma_listen`
//! (qperf's rdma.c, `cm_open_server`), and a client that connects first is
//! rejected (REJ 8, "unexpected event from RDMA CM: Event rejected"). Such a
//! client, proven by its output and the capture (its REQ answered by REJ
//! 8), runs again; the qperf server serves on.
//!
//! The library is built by `ibverbs-abi/link.sh release`; `URNIC_LIB_DIR`
//! points elsewhere. Nothing is timed: loops have hang guards.

mod rxe_lab;

use std::path::Path;
use std::process::Command;

use rxe_lab::{case_epilogue, case_marker, check_capture, lib_dir, text, GuestRun, Lab, Serving, GUEST_IP, OUR_IP};

/// How the guest knows its server of a case listens.
#[derive(Clone, Copy)]
enum Listens {
    /// A listening CM id in the kernel's table (`rdma resource show cm_id`).
    CmId,
    /// A listening TCP port (qperf's control connection).
    Tcp(u16),
}

/// One program: the server's and the client's arguments (`{S}`: the
/// server's address), and what the client's output shows when it ran.
struct Case {
    name: &'static str,
    server: &'static str,
    client: &'static str,
    /// Every one of these is in the client's output.
    done: &'static [&'static str],
    listens: Listens,
    /// The server serves until it is stopped (qperf), rather than ending
    /// after its client.
    serves_on: bool,
    /// The program's own race with its server's listen (see the top).
    race: Race,
}

/// How many times in a row a client may lose its program's race (see the
/// top) and run again.
const MAX_LOST: u32 = 10;

/// What rxe's CM MADs wait in the guest while its perftest `-R` servers
/// run (see the top), in ms.
const CM_DELAY_MS: u32 = 50;

/// A client's race with its server's `rdma_listen` that the program itself
/// has (see the top): a client that lost it is started again.
#[derive(Clone, Copy, PartialEq)]
enum Race {
    None,
    /// perftest 4.5-0.17 `-R`: the pair runs again, server and client.
    PerftestR,
    /// qperf 0.4.11 `-cm1`: the client runs again, the server serves on.
    QperfListen,
}

const QPERF_TESTS: [&str; 4] = ["rc_bw", "rc_lat", "rc_rdma_write_bw", "rc_rdma_read_lat"];

const fn case(name: &'static str, server: &'static str, client: &'static str, done: &'static [&'static str]) -> Case {
    Case { name, server, client, done, listens: Listens::CmId, serves_on: false, race: Race::None }
}

const fn perftest(name: &'static str, server: &'static str, client: &'static str) -> Case {
    Case { race: Race::PerftestR, ..case(name, server, client, &["16384"]) }
}

const CASES: &[Case] = &[
    case("rping", "rping -s -a {S} -v -C 10", "rping -c -a {S} -v -C 10", &["rdma-ping-9: "]),
    // Each side's own QP, moved with rdma_init_qp_attr.
    case("rping_own_qp", "rping -s -q -a {S} -v -C 5", "rping -c -q -a {S} -v -C 5", &["rdma-ping-4: "]),
    case("ucmatose", "ucmatose -c 4", "ucmatose -s {S} -c 4", &["return status 0"]),
    case("udaddy", "udaddy", "udaddy -s {S}", &["return status 0"]),
    // rdma_create_ep / rdma_get_request (synchronous ids), port 7471.
    case("rdma_server_client", "rdma_server", "rdma_client -s {S}", &["rdma_client: end 0"]),
    perftest("send_bw_cm", "ib_send_bw -F -R -n 50 -s 16384", "ib_send_bw -F -R -n 50 -s 16384 {S}"),
    perftest("write_bw_cm", "ib_write_bw -F -R -n 50 -s 16384", "ib_write_bw -F -R -n 50 -s 16384 {S}"),
    // qperf's control connection is TCP 19765, each test a CM connection.
    Case {
        listens: Listens::Tcp(19765),
        serves_on: true,
        race: Race::QperfListen,
        ..case(
            "qperf_cm",
            "qperf",
            "qperf -cm1 -t 2 -m 64K {S} rc_bw rc_lat rc_rdma_write_bw rc_rdma_read_lat",
            &["rc_bw:", "rc_lat:", "rc_rdma_write_bw:", "rc_rdma_read_lat:"],
        )
    },
];

impl Case {
    fn argv(&self, client: bool, server_ip: &str) -> Vec<String> {
        let t = if client { self.client } else { self.server };
        t.replace("{S}", server_ip).split_whitespace().map(str::to_string).collect()
    }

    fn check_client(&self, out: &str, side: &str) {
        for d in self.done {
            assert!(out.contains(d), "{}: the {side} client did not finish (no `{d}`):\n{out}", self.name);
        }
        if self.serves_on {
            // qperf: a figure for each test (`bw  =  ...`, `latency  =  ...`).
            let figures = out.lines().filter(|l| l.trim_start().starts_with("bw  =") || l.trim_start().starts_with("latency  =")).count();
            assert_eq!(figures, QPERF_TESTS.len(), "{}: one figure per test from the {side} client:\n{out}", self.name);
        }
    }

    /// The guest's test that its server listens.
    fn listening(&self) -> String {
        match self.listens {
            Listens::CmId => "rdma resource show cm_id 2>/dev/null | grep -q LISTEN".into(),
            Listens::Tcp(port) => format!("ss -Hltn 'sport = :{port}' | grep -q ."),
        }
    }
}

/// A client refused because nothing listened yet (REJ 8 / SIDR status 1,
/// qperf's refused TCP connection): nothing was exchanged, it may run again.
fn refused_before_connecting(out: &str) -> bool {
    out.contains("REJECTED") || out.contains("UNREACHABLE") || out.contains("bl blka 8") || out.contains("bl blka 7") || qperf_refused(out)
}

fn qperf_refused(out: &str) -> bool {
    out.contains("failed to connect") || out.contains("could not make")
}

/// Whether a client that failed lost its program's own race with the
/// server's listen (see the top): its output shows the rejection, and the CM
/// MADs of `pcap` end with the REQ answered by a REJ with reason 8 (IBTA
/// 12.6.7.2 table 103: 8 = invalid service ID, the CM's answer when nothing
/// listens) — for perftest `-R` right after its first connection (REQ, REP,
/// RTU).
fn lost_race(race: Race, out: &str, pcap: &Path) -> bool {
    // IBTA 16.7.2 table 246 (CM attribute IDs): REQ 0x10, REJ 0x12, REP
    // 0x13, RTU 0x14, DREQ 0x15, DREP 0x16.
    let (said, tail): (&str, &[&str]) = match race {
        Race::None => return false,
        Race::PerftestR => ("Event: RDMA_CM_EVENT_REJECTED; error: 8.", &["0x0010", "0x0013", "0x0014", "0x0010", "0x0012 0x0008"]),
        Race::QperfListen => ("unexpected event from RDMA CM: Event rejected", &["0x0010", "0x0012 0x0008"]),
    };
    out.contains(said) && ends_with_mads(pcap, tail)
}

/// Whether the CM MADs of `pcap` (attribute ID, and a REJ's reason) end
/// with `tail`, less the DREQ/DREP a client that exits sends afterwards.
fn ends_with_mads(pcap: &Path, tail: &[&str]) -> bool {
    let o = Command::new("tshark")
        .arg("-r")
        .arg(pcap)
        .args(["-Y", "infiniband.bth.destqp == 1 && !icmp", "-T", "fields", "-e", "infiniband.mad.attributeid", "-e", "infiniband.cm.rej.reason"])
        .output()
        .expect("tshark");
    let mut mads: Vec<String> = String::from_utf8_lossy(&o.stdout).lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).collect();
    // A client that exits rather than crashing releases the connections it
    // still has afterwards (DREQ/DREP).
    while mads.last().is_some_and(|m| m == "0x0015" || m == "0x0016") {
        mads.pop();
    }
    mads.ends_with(&tail.iter().map(|m| m.to_string()).collect::<Vec<_>>())
}

/// urnic's perftest `-R` server `argv` of case `name` against the guest's
/// client, until it ends on its own; it must succeed. A client rejected
/// with REJ 8 reports `URNIC-CASE-NAME-lost-N` and waits: if the capture
/// proves perftest's -R race (see the top: the test QP's REQ refused right
/// after the handshake connection), urnic's server is started again;
/// a REQ refused before any connection (the server not listening yet) needs
/// nothing; any other rejection fails. Then the client runs again. Hang
/// guard: 600 s (urnic_server's).
fn serve_perftest_r(lab: &Lab, lib: &Path, argv: &[String], name: &str, guest: &mut GuestRun) {
    let mut attempt = 0;
    lab.urnic_server_with(lib, argv, name, guest, &mut |guest, restart| {
        let lost = format!("{}-lost-{}", case_marker(name), attempt + 1);
        if !guest.console().lines().any(|l| l.trim_end() == lost) {
            return;
        }
        attempt += 1;
        let out = std::fs::read_to_string(guest.share.join(format!("{name}.lost-{attempt}"))).unwrap_or_default();
        if lost_race(Race::PerftestR, &out, &guest.pcap) {
            eprintln!("{name}: rxe's client lost perftest's -R race against urnic's server (REJ 8 for its test QP): the pair runs again");
            restart();
        } else {
            assert!(
                ends_with_mads(&guest.pcap, &["0x0010", "0x0012 0x0008"]),
                "{name}: rxe's client was rejected, not by perftest's race nor before urnic's server listened:\n{out}\n--- rxe guest ---\n{}",
                guest.console()
            );
            eprintln!("{name}: rxe's client came before urnic's server listened (REJ 8): it runs again");
        }
        tell_guest(guest, &format!("{name}.again-{attempt}"));
    });
}

/// The guest's script: each case after a marker line (a server's once it
/// listens), output in /host/NAME.out. Clients retry while refused before
/// connecting; a perftest `-R` client refused with REJ 8 waits for the test
/// instead (`serve_perftest_r`). A server runs again, with the marker
/// `URNIC-CASE-NAME-again-N`, when the test creates /host/NAME.again-N (its
/// perftest client lost perftest's race), and one that serves on is
/// stopped when the test creates /host/NAME.stop (it must still be running).
fn guest_script(clients: bool) -> String {
    let mut s = String::from(
        "retry() { for i in $(seq 60); do out=$(\"$@\" 2>&1); rc=$?; echo \"$out\"; [ $rc = 0 ] && return 0; \
         echo \"$out\" | grep -qE 'REJECTED|UNREACHABLE|bl blka [78]|failed to connect|could not make' || return $rc; sleep 1; done; return 1; }\n",
    );
    for (i, c) in CASES.iter().enumerate() {
        let delayed = |c: Option<&Case>| !clients && c.is_some_and(|c| c.race == Race::PerftestR);
        if delayed(Some(c)) && !delayed(i.checked_sub(1).map(|p| &CASES[p])) {
            s.push_str(&cm_delay_on());
        }
        let ip = if clients { OUR_IP } else { GUEST_IP };
        let cmd = c.argv(clients, ip).join(" ");
        let run = if clients && c.race == Race::PerftestR {
            // A REJ 8 may be perftest's -R race (see the top), which needs
            // urnic's server started again: the client reports it with
            // `URNIC-CASE-NAME-lost-N` and runs again once the test has
            // looked and created /host/NAME.again-N.
            format!(
                "echo {marker}\n\
                 attempt=0\n\
                 while :; do\n\
                 {cmd} >/host/{name}.out 2>&1; rc=$?\n\
                 [ $rc = 0 ] && break\n\
                 grep -q 'RDMA_CM_EVENT_REJECTED; error: 8' /host/{name}.out || break\n\
                 attempt=$((attempt + 1)); [ $attempt -le {MAX_LOST} ] || break\n\
                 cp /host/{name}.out /host/{name}.lost-$attempt\n\
                 echo {marker}-lost-$attempt\n\
                 while [ ! -e /host/{name}.again-$attempt ]; do sleep 0.2; done\n\
                 done\n",
                marker = case_marker(c.name),
                name = c.name,
            )
        } else if clients {
            format!("echo {}\nretry {cmd} >/host/{name}.out 2>&1; rc=$?\n", case_marker(c.name), name = c.name)
        } else {
            // The marker once the server listens: a client that comes
            // earlier is refused (REJ 8), and perftest 4.5-0.17's -R pair
            // does not recover from that (see the top).
            format!(
                "attempt=0\n\
                 while :; do\n\
                 {cmd} >/host/{name}.out 2>&1 & pid=$!\n\
                 for i in $(seq 1200); do {listening} && break; sleep 0.1; done\n\
                 if [ $attempt = 0 ]; then echo {marker}; else echo {marker}-again-$attempt; fi\n\
                 next=/host/{name}.again-$((attempt + 1))\n\
                 while kill -0 $pid 2>/dev/null && [ ! -e $next ] && [ ! -e /host/{name}.stop ]; do sleep 0.2; done\n\
                 [ -e $next ] || break\n\
                 kill $pid; wait $pid; attempt=$((attempt + 1))\n\
                 done\n\
                 if [ -e /host/{name}.stop ]; then kill $pid && rc=0 || rc=1; wait $pid; else wait $pid; rc=$?; fi\n",
                name = c.name,
                marker = case_marker(c.name),
                listening = c.listening(),
            )
        };
        s.push_str(&run);
        s.push_str(&case_epilogue(c.name));
        if delayed(Some(c)) && !delayed(CASES.get(i + 1)) {
            s.push_str(CM_DELAY_OFF);
        }
    }
    s
}

/// Shell for the guest: from here on, every CM MAD eth0 receives (IPv4
/// without options, UDP 4791, BTH destination QP 1 at bytes 33-35 of the
/// IP packet: IBTA 9.2, Annex A17) waits CM_DELAY_MS in the netem qdisc of
/// ifb device `cmdelay` (see the top). The script fails if tc cannot.
fn cm_delay_on() -> String {
    format!(
        "modprobe -a sch_ingress cls_u32 act_mirred sch_netem && modprobe ifb numifbs=0 \\\n\
         && ip link add cmdelay type ifb && ip link set cmdelay up \\\n\
         && tc qdisc add dev cmdelay root netem delay {CM_DELAY_MS}ms && tc qdisc add dev eth0 handle ffff: ingress \\\n\
         && tc filter add dev eth0 parent ffff: protocol ip prio 1 u32 match u8 0x45 0xff at 0 match u8 17 0xff at 9 \\\n\
         match u16 4791 0xffff at 22 match u32 1 0x00ffffff at 32 action mirred egress redirect dev cmdelay \\\n\
         || {{ echo 'URNIC-CASE-FAILED cm-delay: tc could not delay the CM MADs'; exit 1; }}\n"
    )
}

/// Shell for the guest: the delay of `cm_delay_on` off, and a line
/// `URNIC-CM-DELAYED N` with the number of MADs it delayed.
const CM_DELAY_OFF: &str = "echo URNIC-CM-DELAYED $(tc -s qdisc show dev cmdelay | awk '/Sent/ {print $4; exit}')\n\
                            tc qdisc del dev eth0 ingress; ip link del cmdelay\n";

/// The number of CM MADs the guest delayed (`CM_DELAY_OFF`'s line).
fn cm_mads_delayed(console: &str) -> u64 {
    let line = console.lines().find_map(|l| l.trim_end().strip_prefix("URNIC-CM-DELAYED "));
    let n = line.and_then(|n| n.parse().ok());
    n.unwrap_or_else(|| panic!("the guest did not report the CM MADs it delayed ({line:?}):\n{console}"))
}

/// The CM MADs of the capture, by tshark's name (`CM: ConnectRequest`, ...),
/// with every message the programs exchange present.
fn check_cm_messages(pcap: &Path) {
    let o = Command::new("tshark").arg("-r").arg(pcap).args(["-Y", "infiniband.bth.destqp == 1"]).output().expect("tshark");
    let cm = String::from_utf8_lossy(&o.stdout);
    for m in ["ConnectRequest", "ConnectReply", "ReadyToUse", "DisconnectRequest", "DisconnectReply", "ServiceIDResReq", "ServiceIDResReqResp"] {
        assert!(cm.contains(&format!("CM: {m}")), "no CM {m} in the capture:\n{cm}");
    }
}

/// Tell the guest's script `file` (in /host).
fn tell_guest(guest: &GuestRun, file: &str) {
    std::fs::write(guest.share.join(file), b"").expect("the guest's share");
}

/// rxe runs the servers, urnic's librdmacm the clients.
#[test]
fn rdmacm_programs_rxe_servers_urnic_clients() {
    let lab = Lab::new("cm1", 1500);
    let lib = lib_dir("librdmacm.so.1");
    let mut guest = lab.boot("cm-rxe-servers", &guest_script(false));
    lab.wait_ready(&guest.log);
    for c in CASES {
        guest.wait_for_marker(&case_marker(c.name));
        let argv = c.argv(true, GUEST_IP);
        let (log, share, pcap) = (guest.log.clone(), guest.share.clone(), guest.pcap.clone());
        let mut attempt = 0;
        let mut again = |out: &str| {
            if lost_race(c.race, out, &pcap) {
                assert!(
                    attempt < MAX_LOST,
                    "{}: urnic's client lost its program's race with rxe's server {} times in a row (see the top):\n{out}",
                    c.name,
                    MAX_LOST + 1
                );
                attempt += 1;
                if c.race == Race::PerftestR {
                    eprintln!("{}: urnic's client lost perftest's -R race (REJ 8 for its test QP): the pair runs again", c.name);
                    tell_guest(&guest, &format!("{}.again-{attempt}", c.name));
                    guest.wait_for_marker(&format!("{}-again-{attempt}", case_marker(c.name)));
                } else {
                    eprintln!("{}: urnic's client lost qperf's race with its server's rdma_listen (REJ 8): it runs again", c.name);
                }
                return true;
            }
            refused_before_connecting(out)
        };
        let t = lab.urnic_client(&lib, &argv, c.name, (&log, &share), &mut again);
        c.check_client(&t, "urnic");
        if c.serves_on {
            tell_guest(&guest, &format!("{}.stop", c.name));
        }
        eprintln!("{}: urnic client done", c.name);
    }
    guest.finish("rxe's servers");
    // Each perftest run's REQs, RTUs and DREQs at least.
    let delayed = cm_mads_delayed(&guest.console());
    assert!(delayed >= 6, "the guest delayed only {delayed} CM MADs");
    let frames = check_capture(&guest.pcap);
    check_cm_messages(&guest.pcap);
    eprintln!("{frames} RoCE frames captured, every one parsed (ICRC checked) and dissected");
}

/// urnic's librdmacm runs the servers, rxe the clients.
#[test]
fn rdmacm_programs_urnic_servers_rxe_clients() {
    let lab = Lab::new("cm2", 1500);
    let lib = lib_dir("librdmacm.so.1");
    let mut guest = lab.boot("cm-urnic-servers", &guest_script(true));
    for (i, c) in CASES.iter().enumerate() {
        let argv = c.argv(false, OUR_IP);
        let next = CASES.get(i + 1).map(|n| n.name);
        if c.serves_on {
            // It serves until stopped: still running after its client.
            let mut server = Serving(Some(lab.ours(&lib, &argv).spawn().expect("ip netns exec")));
            guest.wait_for_case(next);
            let mut child = server.take();
            let running = matches!(child.try_wait(), Ok(None));
            let _ = child.kill();
            let o = child.wait_with_output().expect("server output");
            assert!(
                running,
                "{}: urnic's server ended before it was stopped ({}):\n{}\n--- rxe guest ---\n{}",
                c.name,
                o.status,
                text(&o),
                guest.console()
            );
        } else if c.race == Race::PerftestR {
            serve_perftest_r(&lab, &lib, &argv, c.name, &mut guest);
            guest.wait_for_case(next);
        } else {
            lab.urnic_server(&lib, &argv, c.name, &mut guest);
            guest.wait_for_case(next);
        }
        c.check_client(&guest.case_output(c.name), "rxe");
        eprintln!("{}: rxe client done", c.name);
    }
    guest.finish("rxe's clients");
    let frames = check_capture(&guest.pcap);
    check_cm_messages(&guest.pcap);
    eprintln!("{frames} RoCE frames captured, every one parsed (ICRC checked) and dissected");
}
