//! Loopback on a real link: an AF_XDP device on one end of a veth pair in a
//! namespace, its QPs talking to each other through its own GIDs (RC and
//! UD, IPv4-mapped and IPv6, SEND/WRITE/READ/atomics, every byte checked).
//! On veth a frame sent to our own MAC would reach the peer end and never
//! come back: the device must loop it itself. Its XDP program drops a
//! share of what arrives from the wire, which loopback never meets; the
//! port's counters show that nothing left or arrived for that traffic.

#[path = "../../verbs-api/tests/common.rs"]
mod common;
#[path = "../../verbs-api/tests/loopback_cases/mod.rs"]
mod loopback_cases;
mod veth;

use loopback_cases::*;
use urnic::*;
use urnic_datapath::netns::VethPair;

/// A veth pair with an AF_XDP device on end 0 only (`shards` queues and
/// datapath threads), whose XDP program drops `drop` of the frames it
/// receives.
fn device_alone(drop: f64, shards: u32) -> (VethPair, Context) {
    veth::require_root();
    let _ = VethPair::sweep_stale();
    let pair = VethPair::create_with_queues("lb", 1500, shards).expect("create namespaces and veth (needs root and iproute2)");
    let mut xsk = XskConfig::new(&pair.ifname[0]);
    xsk.xdp.impairments = veth::xdp_impairments(Impairments::from(Faults { loss: drop, ..Faults::NONE }));
    let idle = IdlePolicy::default();
    let mode = match shards {
        1 => DatapathMode::Thread { core: None, idle },
        n => DatapathMode::Threads { cores: (0..n as usize).map(|c| c % veth::num_cpus()).collect(), idle },
    };
    let ctx = open_af_xdp(Some(&pair.ns[0]), "urnic0", &xsk, mode).expect("AF_XDP device in namespace a");
    (pair, ctx)
}

/// The port's own count of frames it sent and received (AF_XDP rings).
fn port_frames(ctx: &Context) -> (u64, u64) {
    let c = ctx.counters();
    (c.get("xsk_tx_frames").unwrap(), c.get("xsk_rx_frames").unwrap())
}

/// Run `case` on `ctx` and check the AF_XDP socket carried nothing meanwhile.
fn off_the_wire<T>(ctx: &Context, case: impl FnOnce() -> T) -> T {
    let before = port_frames(ctx);
    let r = case();
    assert_eq!(port_frames(ctx), before, "the AF_XDP socket sent or received frames during loopback traffic");
    r
}

#[test]
fn rc_through_the_ipv4_mapped_gid() {
    let (pair, ctx) = device_alone(0.5, 1);
    let v4 = pair.ipv4[0];
    assert_eq!(ctx.query_gid(1, 1).unwrap(), [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, v4[0], v4[1], v4[2], v4[3]]);
    off_the_wire(&ctx, || rc_to_itself(&ctx, 1));
}

#[test]
fn rc_through_the_ipv6_gid() {
    let (pair, ctx) = device_alone(0.5, 1);
    assert_eq!(ctx.query_gid(1, 2).unwrap(), pair.ipv6[0]);
    off_the_wire(&ctx, || rc_to_itself(&ctx, 2));
}

#[test]
fn ud_through_the_ipv4_mapped_gid() {
    let (_pair, ctx) = device_alone(0.5, 1);
    off_the_wire(&ctx, || ud_to_itself(&ctx, 1));
}

#[test]
fn ud_through_the_ipv6_gid() {
    let (_pair, ctx) = device_alone(0.5, 1);
    off_the_wire(&ctx, || ud_to_itself(&ctx, 2));
}

/// Two shards (queues, pinned datapath threads): the two QPs live on
/// different shards, so every frame crosses from one shard's engine to the
/// other's loopback queue.
#[test]
fn rc_across_shards() {
    let (_pair, ctx) = device_alone(0.5, 2);
    let (qa, qb) = off_the_wire(&ctx, || rc_to_itself(&ctx, 1));
    assert_ne!(ctx.nic().shard_of(qa), ctx.nic().shard_of(qb), "QPs {qa:#x} and {qb:#x} on one shard");
}

/// Two devices on the veth pair, both XDP programs dropping 5 % of what
/// arrives: WRITEs over the wire are retransmitted, the WRITEs and READs
/// device a's own QPs exchange at the same time are not.
#[test]
fn loopback_beside_a_lossy_link() {
    veth::require_root();
    let (_pair, a, b) = veth::pair(Impairments::from(Faults { loss: 0.05, ..Faults::NONE }), 1500);
    loopback_cases::loopback_beside_a_lossy_link(&a, &b, 1);
    let dropped = |c: &Context| c.counters().get("xdp_impair_dropped").unwrap();
    assert!(dropped(&a) + dropped(&b) > 0, "the XDP programs dropped nothing");
}
