//! The CI run of `urnic soak` (issue 14): the built binary, 20 seconds, two
//! devices and the hostile injector in three namespaces on a bridge the tool
//! makes and removes, 1% loss and 0.5% corruption in the XDP program. The tool
//! itself fails the run on any byte that differs, any WR completed twice or
//! never, any RC WR that does not succeed; this test also checks that the
//! run moved data, that the impairments and the injector were really at
//! work, and that the namespaces are gone afterwards. Needs root.

use std::process::Command;

/// The number after `key` in `text` (digits, first match).
fn figure(text: &str, key: &str) -> Option<u64> {
    let at = text.find(key)? + key.len();
    let digits: String = text[at..].trim_start().chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

#[test]
fn soak_for_20_seconds_verifies_every_byte_and_completion() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "urnic soak creates network namespaces and attaches XDP programs: run as root");
    let out = Command::new(env!("CARGO_BIN_EXE_urnic"))
        .args(["soak", "--duration", "20s", "--report-every", "5s", "--qps", "6", "--ud-qps", "2", "--loss", "0.01", "--corrupt", "0.005"])
        .args(["--hostile", "500"])
        .output()
        .expect("run urnic soak");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let all = format!("{stdout}\n{stderr}");
    assert!(out.status.success(), "urnic soak failed:\n{all}");
    assert!(stdout.contains("result: PASS"), "{all}");
    let summary = &stdout[stdout.find("== urnic soak summary ==").unwrap_or(0)..];
    let after = |key: &str| summary.find(key).map(|at| &summary[at..]).unwrap_or("");
    let verified = figure(after(" verified: "), "(");
    assert!(verified.is_some_and(|b| b > 1 << 20), "verified bytes: {verified:?}\n{all}");
    assert!(figure(summary, "frames: tx ").is_some_and(|n| n > 10_000), "{all}");
    let xdp = after("XDP impairments: ");
    assert!(figure(xdp, "XDP impairments: ").is_some_and(|n| n > 0), "nothing dropped by the XDP program:\n{all}");
    assert!(figure(xdp, " dropped, ").is_some_and(|n| n > 0), "nothing corrupted by the XDP program:\n{all}");
    assert!(figure(summary, " injected: ").is_some_and(|n| n > 1000), "the injector sent too little:\n{all}");
    assert!(figure(summary, " retransmissions ").is_some_and(|n| n > 0), "no retransmission under loss:\n{all}");
    // The namespaces went with the run.
    let pid = stdout.split("urnic-soak-").nth(1).and_then(|s| s.split('-').next()).unwrap_or("none").to_string();
    let ns = Command::new("ip").args(["netns", "list"]).output().expect("ip netns list");
    let list = String::from_utf8_lossy(&ns.stdout);
    assert!(!list.contains(&format!("urnic-soak-{pid}-")), "namespaces of the run are left: {list}");
}
