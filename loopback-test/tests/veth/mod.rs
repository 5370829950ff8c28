//! Two AF_XDP urnic devices in two network namespaces joined by veth.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use urnic::*;
use urnic_datapath::netns::{Segment, VethPair};

/// Fail loudly (never skip) when the tests cannot make namespaces.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "the veth tests create network namespaces and attach XDP programs: run them as root");
}

/// What the XDP program does to the frames each device receives: the same
/// [`Faults`] (the program refuses duplication and reordering when the
/// device opens); it has no rate limiter.
pub fn xdp_impairments(imp: Impairments) -> xdp::Impairments {
    assert!(imp.rate_bps.is_none(), "the XDP program has no rate limiter: {imp:?}");
    xdp::Impairments::from(imp.faults)
}

/// A veth pair in two fresh namespaces with a urnic device on each end.
/// The namespaces live until the process exits.
pub fn pair(imp: Impairments, mtu: u32) -> (VethPair, Context, Context) {
    pair_sharded(imp, mtu, 1)
}

/// [`pair`] with `shards` queues on each veth end and one pinned datapath
/// thread (and AF_XDP socket) per queue on each device.
pub fn pair_sharded(imp: Impairments, mtu: u32, shards: u32) -> (VethPair, Context, Context) {
    let _ = VethPair::sweep_stale();
    let pair = VethPair::create_with_queues("t", mtu, shards).expect("create namespaces and veth (needs root and iproute2)");
    let mut xsk = XskConfig::new(&pair.ifname[0]);
    xsk.xdp.impairments = xdp_impairments(imp);
    let idle = IdlePolicy::default();
    let mode = match shards {
        1 => DatapathMode::Thread { core: None, idle },
        n => DatapathMode::Threads { cores: (0..n as usize).map(|c| c % num_cpus()).collect(), idle },
    };
    let a = open_af_xdp(Some(&pair.ns[0]), "urnic0", &xsk, mode.clone()).expect("AF_XDP device in namespace a");
    xsk.ifname = pair.ifname[1].clone();
    let b = open_af_xdp(Some(&pair.ns[1]), "urnic1", &xsk, mode).expect("AF_XDP device in namespace b");
    (pair, a, b)
}

/// The fabric the shared cases run on.
pub fn devices(imp: Impairments) -> (Context, Context) {
    let (pair, a, b) = pair(imp, 1500);
    // Outlive the contexts the case holds: deleted at process exit.
    std::mem::forget(pair);
    (a, b)
}

/// Online CPUs.
pub fn num_cpus() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// The sharded fabric: two shards (pinned threads, queues) per device.
pub fn devices_sharded(imp: Impairments) -> (Context, Context) {
    let (pair, a, b) = pair_sharded(imp, 1500, 2);
    std::mem::forget(pair);
    (a, b)
}

/// A bridged segment of `members` (at least 3) fresh namespaces with a urnic
/// device on members 0 and 1 (single datapath thread each); the others are
/// left to the test (an attacker's raw sender, say). Everything is deleted
/// when the [`Segment`] drops (at exit if a failing test leaks it, by the
/// orphan sweep if the process is killed).
pub fn segment(imp: Impairments, mtu: u32, members: usize) -> (Segment, Context, Context) {
    let _ = Segment::sweep_stale();
    let seg = Segment::create("s", members, mtu).expect("create the namespaces, veths and bridge (needs root and iproute2)");
    let mut xsk = XskConfig::new(&seg.ifname[0]);
    xsk.xdp.impairments = xdp_impairments(imp);
    let mode = DatapathMode::Thread { core: None, idle: IdlePolicy::default() };
    let a = open_af_xdp(Some(&seg.ns[0]), "urnic0", &xsk, mode.clone()).expect("AF_XDP device on member 0");
    xsk.ifname = seg.ifname[1].clone();
    let b = open_af_xdp(Some(&seg.ns[1]), "urnic1", &xsk, mode).expect("AF_XDP device on member 1");
    (seg, a, b)
}

/// Poll `value` until `done` holds for it, sleeping briefly between looks
/// (the datapath threads need the two cores more than this loop does).
/// A hang detector, not a timing assertion: after a generous 60 s it
/// panics with `what` and the last value.
pub fn wait_until<T: std::fmt::Debug>(what: impl Fn() -> String, mut value: impl FnMut() -> T, done: impl Fn(&T) -> bool) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = value();
        if done(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "still waiting for {}: {v:?}", what());
        std::thread::sleep(Duration::from_micros(200));
    }
}
