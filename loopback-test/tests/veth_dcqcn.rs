//! DCQCN on a real link: two senders in two namespaces write into one
//! receiver through a bridge whose port towards the receiver is rate-limited
//! (tbf); urnic's XDP program on the receiver marks ECN CE on RoCE frames
//! arriving faster than 75% of the bottleneck, the receiver's NP returns
//! CNPs, the senders' RPs slow down. Measured in the same run with DCQCN
//! on and off: drops at the bottleneck and the queueing delay a ping sees.

#[path = "../../verbs-api/tests/common.rs"]
mod common;
mod veth;

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use urnic::*;

fn ip(args: &[&str]) {
    let o = Command::new("ip").args(args).output().unwrap();
    assert!(o.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr));
}

struct Topo {
    names: Vec<String>,
}

impl Drop for Topo {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}

const RATE_MBIT: u64 = 200;
const FRAME: u64 = 1078;
/// The bottleneck's queue (tbf limit; tc's "200kb").
const QUEUE_BYTES: u64 = 200 * 1024;

/// br (bridge) + s1, s2, r: 10.97.0.1/.2 senders, .3 receiver; tbf on the
/// bridge port towards r.
fn topo(tag: &str) -> (Topo, [String; 4]) {
    let pid = std::process::id();
    let n = |s: &str| format!("urnic-dq{tag}-{pid}-0-{s}");
    let (br, s1, s2, r) = (n("br"), n("s1"), n("s2"), n("r"));
    let t = Topo { names: vec![br.clone(), s1.clone(), s2.clone(), r.clone()] };
    for x in &t.names {
        ip(&["netns", "add", x]);
    }
    ip(&["-n", &br, "link", "add", "br0", "type", "bridge"]);
    ip(&["-n", &br, "link", "set", "br0", "up"]);
    for (i, x) in [&s1, &s2, &r].into_iter().enumerate() {
        let port = format!("p{i}");
        ip(&["-n", &br, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", x]);
        ip(&["-n", &br, "link", "set", &port, "master", "br0", "up"]);
        ip(&["-n", x, "addr", "add", &format!("10.97.0.{}/24", i + 1), "dev", "eth0"]);
        ip(&["-n", x, "link", "set", "eth0", "up"]);
        ip(&["-n", x, "link", "set", "lo", "up"]);
    }
    // The bottleneck: p2 (towards r) sends at RATE_MBIT with a 200 KB queue
    // (less than the two senders can keep in flight: 2 × 128 frames).
    let o = Command::new("ip")
        .args([
            "netns",
            "exec",
            &br,
            "tc",
            "qdisc",
            "add",
            "dev",
            "p2",
            "root",
            "tbf",
            "rate",
            &format!("{RATE_MBIT}mbit"),
            "burst",
            "64kb",
            "limit",
            &format!("{QUEUE_BYTES}"),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "tc tbf: {}", String::from_utf8_lossy(&o.stderr));
    (t, [br, s1, s2, r])
}

/// Bytes queued in the bottleneck's tbf now.
fn tbf_backlog(br: &str) -> u64 {
    let o = Command::new("ip").args(["netns", "exec", br, "tc", "-s", "qdisc", "show", "dev", "p2"]).output().unwrap();
    let t = String::from_utf8_lossy(&o.stdout);
    // "backlog 12345b 11p requeues 0"
    t.split("backlog ").nth(1).and_then(|x| x.split('b').next()).and_then(|x| x.parse().ok()).unwrap_or(0)
}

fn tbf_drops(br: &str) -> u64 {
    let o = Command::new("ip").args(["netns", "exec", br, "tc", "-s", "qdisc", "show", "dev", "p2"]).output().unwrap();
    let t = String::from_utf8_lossy(&o.stdout);
    t.split("dropped ").nth(1).and_then(|x| x.split(|c: char| !c.is_ascii_digit()).next()).and_then(|x| x.parse().ok()).unwrap_or(0)
}

/// The completions `cq` has, sleeping on its channel while it has none.
fn wait_sleeping(cq: &Cq, ch: &CompChannel) -> Vec<WorkCompletion> {
    let mut buf = vec![WorkCompletion::default(); 64];
    loop {
        let k = cq.poll(&mut buf).unwrap();
        if k > 0 {
            buf.truncate(k);
            return buf;
        }
        cq.req_notify(false);
        // A completion that arrived before the arming raised no event.
        let k = cq.poll(&mut buf).unwrap();
        if k > 0 {
            buf.truncate(k);
            return buf;
        }
        ch.get_cq_event().unwrap();
    }
}

struct Run {
    drops: u64,
    rtt_ms: f64,
    backlog_mean: f64,
    cnps_sent: u64,
    cnps_received: u64,
    goodput_mbps: f64,
}

fn run(dcqcn_on: bool) -> Run {
    veth::require_root();
    let (_t, [br, s1, s2, r]) = topo(if dcqcn_on { "on" } else { "off" });
    let params = rocev2::transport::dcqcn::DcqcnParams { enabled: dcqcn_on, ..rocev2::transport::dcqcn::DcqcnParams::paper(1000.0) };
    let mut xsk = XskConfig::new("eth0");
    let mode = DatapathMode::Thread { core: None, idle: IdlePolicy::default() };
    let open = |ns: &str, name: &str, xsk: &XskConfig| {
        let ns = ns.to_string();
        let name = name.to_string();
        let xsk = xsk.clone();
        let mode = mode.clone();
        urnic_datapath::netns::in_netns(Some(&ns), move || {
            let mut cfg = DeviceConfig::af_xdp(&name, &xsk)?;
            cfg.datapath = mode;
            cfg.dcqcn = params;
            open_device(cfg)
        })
        .unwrap()
        .unwrap()
    };
    let c1 = open(&s1, "s1", &xsk);
    let c2 = open(&s2, "s2", &xsk);
    // The receiver's XDP program marks CE above 75% of the bottleneck's packet rate.
    xsk.xdp.impairments.ecn_mark_above_pps = RATE_MBIT * 1_000_000 / 8 / FRAME * 3 / 4;
    let cr = open(&r, "r", &xsk);
    let pcap = std::env::temp_dir().join(format!("urnic-dcqcn-{}-{}.pcap", if dcqcn_on { "on" } else { "off" }, std::process::id()));
    cr.nic().set_capture(Some(&pcap)).unwrap();

    let rs = side(&cr, 8 << 20);
    let mut senders = Vec::new();
    for c in [&c1, &c2] {
        // The senders sleep on a completion channel between completions:
        // on a 2-core machine, application threads spinning beside three
        // datapath threads would make the offered load (and the queue it
        // builds) depend on the scheduler more than on DCQCN.
        let ch = c.create_comp_channel().unwrap();
        let mut s = side(c, 1 << 20);
        s.cq = c.create_cq(4096, Some(&ch)).unwrap();
        let qs = rc_qp(&s, None);
        let qr = rc_qp(&rs, None);
        bring_up_with_timeout(&qs, c, qr.qp_num(), &cr, 1, 2, 14);
        bring_up_with_timeout(&qr, &cr, qs.qp_num(), c, 2, 1, 14);
        senders.push((s, ch, qs, qr));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut threads = Vec::new();
    let remote = RemoteAddr { addr: rs.mr.addr(), rkey: rs.mr.rkey() };
    let mut receivers = Vec::new();
    for (k, (s, ch, qs, qr)) in senders.into_iter().enumerate() {
        receivers.push(qr);
        let stop = stop.clone();
        threads.push(std::thread::spawn(move || {
            let mut bytes = 0u64;
            let mut id = 0u64;
            // Keep 8 × 64 KiB WRITEs in flight until told to stop.
            let mut inflight = 0;
            while !stop.load(Ordering::Relaxed) || inflight > 0 {
                while inflight < 8 && !stop.load(Ordering::Relaxed) {
                    let rem = RemoteAddr { addr: remote.addr + (k as u64) * (4 << 20), ..remote };
                    qs.post_send(&send_wr(id, SendOp::Write { remote: rem }, vec![s.mr.sge(0, 65536)])).unwrap();
                    id += 1;
                    inflight += 1;
                }
                let c = wait_sleeping(&s.cq, &ch);
                assert!(c.iter().all(|c| c.status == WcStatus::Success), "{c:?}");
                inflight -= c.len();
                bytes += 65536 * c.len() as u64;
            }
            (bytes, qs.stats().unwrap().rp_cnps_received)
        }));
    }
    // Queueing delay: pings from s1 to r across the same bottleneck, with
    // the bottleneck's backlog sampled over the same window.
    std::thread::sleep(Duration::from_millis(500));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (br, sampling) = (br.clone(), sampling.clone());
        std::thread::spawn(move || {
            let mut backlog = Vec::new();
            while sampling.load(Ordering::Relaxed) {
                backlog.push(tbf_backlog(&br) as f64);
                std::thread::sleep(Duration::from_millis(20));
            }
            backlog
        })
    };
    let o = Command::new("ip").args(["netns", "exec", &s1, "ping", "-c", "40", "-i", "0.05", "-W", "2", "10.97.0.3"]).output().unwrap();
    sampling.store(false, Ordering::Relaxed);
    let backlog = sampler.join().unwrap();
    let backlog_mean = backlog.iter().sum::<f64>() / backlog.len().max(1) as f64;
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let mut rtts: Vec<f64> = text.lines().filter_map(|l| l.split("time=").nth(1)).filter_map(|v| v.split_whitespace().next()?.parse().ok()).collect();
    rtts.sort_by(|a, b| a.total_cmp(b));
    stop.store(true, Ordering::Relaxed);
    let results: Vec<(u64, u64)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let bytes: u64 = results.iter().map(|r| r.0).sum();
    let cnps_received: u64 = results.iter().map(|r| r.1).sum();
    let secs = start.elapsed().as_secs_f64();
    cr.nic().set_capture(None).unwrap();
    let rc = cr.counters();
    let sum = |c: &urnic::DeviceCounters, k: &str| -> u64 { c.qps.iter().map(|(_, s)| s.iter().find(|(n, _)| *n == k).map_or(0, |(_, v)| v)).sum() };
    let cnps_sent = sum(&rc, "np_cnps_sent");
    // CNPs in the receiver's capture: BTH opcode 0x81 after Eth/IPv4/UDP.
    let cap = urnic_datapath::capture::read_frames(&pcap).unwrap();
    let _ = std::fs::remove_file(&pcap);
    let captured_cnps = cap.iter().filter(|f| f.len() > 42 && f[42] == 0x81 && rocev2::wire::parse_frame(f).is_ok()).count() as u64;
    assert_eq!(captured_cnps, cnps_sent, "every CNP the receiver sent is in its capture");
    Run {
        drops: tbf_drops(&br),
        rtt_ms: rtts.get(rtts.len() / 2).copied().unwrap_or(f64::MAX),
        backlog_mean,
        cnps_sent,
        cnps_received,
        goodput_mbps: bytes as f64 * 8.0 / secs / 1e6,
    }
}

#[test]
fn dcqcn_lowers_queueing_delay_and_drops_on_a_shared_bottleneck() {
    // The comparison means something only if the two senders, without
    // DCQCN, congest the bottleneck: its queue at least a quarter full on
    // average. A host too loaded to offer that much (each sender's process
    // starved; its goodput then stays below the bottleneck's rate and the
    // queue near empty: seen at 11-20 KB with helpers compiling, against
    // 80-124 KB when they were not) did not run the experiment: the pair
    // runs again, up to 5 times, and the test fails if it never could.
    let mut attempt = 0;
    let off = loop {
        attempt += 1;
        let off = run(false);
        if off.backlog_mean >= QUEUE_BYTES as f64 / 4.0 {
            break off;
        }
        eprintln!(
            "DCQCN off did not congest the bottleneck (backlog {:.0} B of {QUEUE_BYTES}, goodput {:.0} Mb/s of {RATE_MBIT}): the host is too loaded, run {attempt} of 5",
            off.backlog_mean, off.goodput_mbps
        );
        assert!(attempt < 5, "the senders never congested the bottleneck without DCQCN in 5 runs: the host is too loaded for this test");
    };
    let on = run(true);
    eprintln!(
        "DCQCN off: drops {} backlog {:.0} B ({:.2} ms at the bottleneck) median ping {:.2} ms goodput {:.0} Mb/s CNPs {}/{}\nDCQCN on:  drops {} backlog {:.0} B ({:.2} ms) median ping {:.2} ms goodput {:.0} Mb/s CNPs {}/{}",
        off.drops,
        off.backlog_mean,
        off.backlog_mean * 8.0 / (RATE_MBIT as f64 * 1e3),
        off.rtt_ms,
        off.goodput_mbps,
        off.cnps_sent,
        off.cnps_received,
        on.drops,
        on.backlog_mean,
        on.backlog_mean * 8.0 / (RATE_MBIT as f64 * 1e3),
        on.rtt_ms,
        on.goodput_mbps,
        on.cnps_sent,
        on.cnps_received
    );
    assert!(on.cnps_sent > 0 && on.cnps_received > 0, "CNPs flow with DCQCN on");
    assert!(off.cnps_sent > 0, "the NP works whatever the senders do");
    // The queueing delay is the bottleneck's backlog over its rate (the ping
    // is reported too, but a loaded machine's scheduling noise swamps it).
    assert!(on.backlog_mean < off.backlog_mean, "bottleneck backlog: on {:.0} B vs off {:.0} B", on.backlog_mean, off.backlog_mean);
    assert!(on.drops * 2 <= off.drops, "drops: on {} vs off {}", on.drops, off.drops);
}
