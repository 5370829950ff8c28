//! `urnic stat` (another process) reads the counters a running device
//! publishes, and the file goes away with the device.

#[path = "../../verbs-api/tests/common.rs"]
mod common;

use std::time::Duration;

use common::*;
use urnic::*;

#[test]
fn urnic_stat_reads_the_counters_a_device_publishes() {
    let hub = MemHub::new(3);
    let ca = open_device(DeviceConfig::memory(&hub, "urnic0", [2, 0, 0, 0, 0, 1], [10, 0, 0, 1])).unwrap();
    let cb = open_device(DeviceConfig::memory(&hub, "urnic1", [2, 0, 0, 0, 0, 2], [10, 0, 0, 2])).unwrap();
    let dir = std::env::temp_dir().join(format!("urnic-stat-test-{}", std::process::id()));
    let path = ca.publish_counters(&dir).unwrap();
    let a = side(&ca, 65536);
    let b = side(&cb, 65536);
    let qa = rc_qp(&a, None);
    let qb = rc_qp(&b, None);
    bring_up(&qa, &ca, qb.qp_num(), &cb, 1, 2);
    bring_up(&qb, &cb, qa.qp_num(), &ca, 2, 1);
    let remote = RemoteAddr { addr: b.mr.addr(), rkey: b.mr.rkey() };
    for i in 0..10 {
        qa.post_send(&send_wr(i, SendOp::Write { remote }, vec![a.mr.sge(0, 4000)])).unwrap();
        wait(&a.cq, 1);
    }
    std::thread::sleep(Duration::from_millis(600));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_urnic")).args(["stat", "--dir"]).arg(&dir).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "urnic stat: {text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("device urnic0"), "{text}");
    let line = |name: &str| text.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).and_then(|v| v.parse::<u64>().ok());
    assert!(line("datapath.tx_frames").unwrap_or(0) >= 40, "{text}");
    assert!(line("transport.rx_frames").unwrap_or(0) >= 10, "{text}");
    assert!(line(&format!("qp{:#x}.tx_packets", qa.qp_num())).unwrap_or(0) >= 40, "{text}");
    // Zero counters are left out unless --all.
    assert!(!text.lines().any(|l| l.ends_with(" 0")), "{text}");
    // The file goes when the device closes.
    drop((qa, qb, a, b, ca));
    // At once, unless the publisher held the device at that moment (then
    // it closes on the publisher's thread a moment later).
    let guard = std::time::Instant::now() + Duration::from_secs(30);
    while path.exists() {
        assert!(std::time::Instant::now() < guard, "{} outlived its device", path.display());
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_urnic")).args(["stat", "--dir"]).arg(&dir).output().unwrap();
    assert!(!out.status.success(), "no device left: urnic stat says so");
    let _ = std::fs::remove_dir_all(&dir);
}
