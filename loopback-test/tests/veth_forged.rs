//! Issue 14, rules 1, 2 and 6 over a real segment: two urnic devices and an
//! attacker share one Linux bridge (three namespaces). While the devices run
//! RC traffic both ways (WRITEs and SENDs with known patterns, READs of known
//! memory), the attacker's raw socket injects at both devices frames forged
//! by `rocev2::sim::forge` (correct ICRCs, QPNs, PSNs, rkeys and VAs):
//!
//! - from its own address (IPv4 and IPv6) and from the peer host's IPv6
//!   address (not the QP's GID), or from the peer to the device's IPv6
//!   address (not the QP's GID): SEND, WRITE, READ and atomic requests at the
//!   QP's expected PSN, every kind of response for the newest PSN sent, CNPs
//!   — every one `rx_wrong_peer` (rxe `check_addr`);
//! - from the peer's own IPv4 address (spoofed): every kind of response for
//!   PSNs long acknowledged (`req_stale_responses`) and never sent
//!   (`req_ghost_responses`), at a busy QP and at an idle one.
//!
//! Nothing may change: no byte placed (guard memory untouched), no
//! completion, every QP in RTS, the traffic's data intact with each WR
//! completed exactly once, no CNP accepted; and each counter equals exactly
//! what was injected of its class, so real traffic counts none.
//!
//! Each forged frame is confirmed counted before the next goes out: the
//! count is exact, and a frame that is not counted where it should be (or is
//! lost) stops the test with its name.

// Device indices (0, 1) address several parallel arrays at once.
#![allow(clippy::needless_range_loop)]

#[path = "../../verbs-api/tests/common.rs"]
mod common;
mod veth;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use common::*;
use rocev2::psn::Psn;
use rocev2::sim::forge::{self, Attack, Expect, ReqOp, RespOp, Station, VictimView};
use urnic::*;
use urnic_datapath::raw::RawSender;

/// Traffic memory layout (each device's 4 MiB MR).
const MAX_LEN: usize = 64 << 10;
const SRC_W: usize = 0;
const SRC_S: usize = 512 << 10;
const WRITE_AT: usize = 1 << 20;
const RECV_AT: usize = 2 << 20;
const READ_SRC: usize = 3 << 20;
const READ_DST: usize = (3 << 20) + (256 << 10);
/// Never touched by real traffic: forged WRITEs aim here.
const GUARD_AT: usize = (3 << 20) + (512 << 10);
const GUARD_LEN: usize = 512 << 10;
const MR_LEN: usize = 4 << 20;

/// Victim MR: receive buffers, a WRITE target, and a source for the real
/// traffic of the last phase.
const V_RECV: usize = 16 << 10;
const V_RECVS: usize = 4;
const V_WRITE_AT: usize = 64 << 10;
const V_GUARDED: usize = 128 << 10;
const V_SRC: usize = 128 << 10;
const V_LEN: usize = 256 << 10;

/// Local ACK timeout exponent of every QP (4.096 us x 2^18 = 1.07 s).
const ACK_TIMEOUT: u8 = 18;

/// Attack rounds, each against both devices.
const ATTACK_ROUNDS: u64 = 12;

fn guard(i: usize) -> u8 {
    (i as u8).wrapping_mul(37) ^ 0xa5
}

fn fill_guard(mr: &mut Mr, off: usize, len: usize) {
    let g: Vec<u8> = (off..off + len).map(guard).collect();
    mr.write_at(off, &g).unwrap();
}

/// The first offset in `mr[off..off + len]` that lost its guard pattern.
fn guard_broken(mr: &Mr, off: usize, len: usize) -> Option<usize> {
    bytes(mr, off..off + len).iter().enumerate().find(|(i, b)| **b != guard(off + i)).map(|(i, _)| off + i)
}

fn wr_id(round: u64, dev: usize, k: u64) -> u64 {
    (round << 4) | ((dev as u64) << 2) | k
}
const K_WRITE: u64 = 0;
const K_SEND: u64 = 1;
const K_READ: u64 = 2;
const K_RECV: u64 = 3;

fn lens(round: u64, dev: usize) -> (usize, usize, usize) {
    let r = round as usize;
    (1 + (r * 7919 + dev * 104_729) % MAX_LEN, 1 + (r * 6007 + dev * 31) % MAX_LEN, 1 + (r * 4099 + dev * 17) % MAX_LEN)
}

fn seeds(round: u64, dev: usize) -> (u8, u8) {
    let s = (round as u8).wrapping_mul(2).wrapping_add(dev as u8);
    (s, s ^ 0x55)
}

fn read_seed(dev: usize) -> u8 {
    0xc0 + dev as u8
}

/// What the traffic thread did.
#[derive(Debug, Default)]
struct TrafficReport {
    rounds: u64,
    /// Work requests posted (sends and receives), each seen completed once.
    wrs: u64,
}

/// Real RC traffic between the two traffic QPs until `stop` (and at least
/// four rounds): per round and direction a WRITE and a SEND of fresh
/// patterns and a READ of the peer's fixed pattern; every completion (exact
/// set per round, all successful) and every byte checked.
fn traffic(sides: [&mut Side; 2], qps: [&Qp; 2], stop: &AtomicBool, done_rounds: &AtomicU64, failed: &AtomicBool) -> TrafficReport {
    struct Flag<'a>(&'a AtomicBool);
    impl Drop for Flag<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                self.0.store(true, Ordering::Release);
            }
        }
    }
    let _flag = Flag(failed);
    let [s0, s1] = sides;
    let mut report = TrafficReport::default();
    let mut round = 0u64;
    while !stop.load(Ordering::Acquire) || round < 4 {
        for d in 0..2 {
            let p = 1 - d;
            let (me, peer) = if d == 0 { (&mut *s0, &*s1) } else { (&mut *s1, &*s0) };
            let (lw, ls, lr) = lens(round, d);
            let (sw, ss) = seeds(round, d);
            fill(&mut me.mr, SRC_W, lw, sw);
            fill(&mut me.mr, SRC_S, ls, ss);
            me.mr.fill_at(READ_DST, lr, 0).unwrap();
            qps[p].post_recv(&RecvWr { wr_id: wr_id(round, p, K_RECV), sgl: vec![peer.mr.sge(RECV_AT, MAX_LEN as u32)] }).unwrap();
            let remote = |off: usize| RemoteAddr { addr: peer.mr.addr() + off as u64, rkey: peer.mr.rkey() };
            let wrs = [
                send_wr(wr_id(round, d, K_WRITE), SendOp::Write { remote: remote(WRITE_AT) }, vec![me.mr.sge(SRC_W, lw as u32)]),
                send_wr(wr_id(round, d, K_SEND), SendOp::Send, vec![me.mr.sge(SRC_S, ls as u32)]),
                send_wr(wr_id(round, d, K_READ), SendOp::Read { remote: remote(READ_SRC) }, vec![me.mr.sge(READ_DST, lr as u32)]),
            ];
            for wr in &wrs {
                qps[d].post_send(wr).unwrap();
            }
            report.wrs += 4;
        }
        let got = [wait(&s0.cq, 4), wait(&s1.cq, 4)];
        for d in 0..2 {
            let p = 1 - d;
            let (_, _, lr) = lens(round, d);
            let (_, ls_p, _) = lens(round, p);
            let mut seen: Vec<(u64, WcOpcode, WcStatus, Option<u32>)> = got[d]
                .iter()
                .map(|c| (c.wr_id, c.opcode, c.status, matches!(c.opcode, WcOpcode::Recv | WcOpcode::RdmaRead).then_some(c.byte_len)))
                .collect();
            seen.sort_by_key(|c| c.0);
            let mut want = vec![
                (wr_id(round, d, K_WRITE), WcOpcode::RdmaWrite, WcStatus::Success, None),
                (wr_id(round, d, K_SEND), WcOpcode::Send, WcStatus::Success, None),
                (wr_id(round, d, K_READ), WcOpcode::RdmaRead, WcStatus::Success, Some(lr as u32)),
                // The receive on device d that p's SEND consumed.
                (wr_id(round, d, K_RECV), WcOpcode::Recv, WcStatus::Success, Some(ls_p as u32)),
            ];
            want.sort_by_key(|c| c.0);
            assert_eq!(seen, want, "round {round}: device {d}'s completions; its QP {:?}", qps[d].stats());
        }
        for d in 0..2 {
            let p = 1 - d;
            let (me, peer) = if d == 0 { (&*s0, &*s1) } else { (&*s1, &*s0) };
            let (lw, ls, lr) = lens(round, d);
            let (sw, ss) = seeds(round, d);
            assert!(bytes(&peer.mr, WRITE_AT..WRITE_AT + lw) == expected(lw, sw), "round {round}: WRITE data {d}->{p}");
            assert!(bytes(&peer.mr, RECV_AT..RECV_AT + ls) == expected(ls, ss), "round {round}: SEND data {d}->{p}");
            assert!(bytes(&me.mr, READ_DST..READ_DST + lr) == expected(lr, read_seed(p)), "round {round}: READ data {p}->{d}");
        }
        round += 1;
        done_rounds.store(round, Ordering::Release);
    }
    report.rounds = round;
    report
}

/// The QP a forged frame is aimed at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Role {
    /// The busy traffic QP.
    Traffic,
    /// The idle victim QP.
    Victim,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Traffic => "traffic",
            Role::Victim => "victim",
        }
    }
}

/// Engine counters real traffic moves (the rest must hold exactly what was
/// injected): frames in and out, and WRITE continuations placed as their
/// ICRC is checked.
const ENGINE_TRAFFIC: [&str; 3] = ["rx_frames", "rx_icrc_at_placement", "tx_frames"];

/// QP counters a forged frame could move: for the busy QP those real
/// traffic leaves at zero; for the idle victim (real traffic only after the
/// attack) everything about responses, requests and CNPs.
const QP_HOSTILE: [&str; 11] = [
    "req_stale_responses",
    "req_ghost_responses",
    "req_bad_responses",
    "req_naks_error_received",
    "req_rnr_naks_received",
    "rp_cnps_received",
    "resp_naks_inv_req_sent",
    "resp_naks_rem_access_sent",
    "resp_naks_rem_op_sent",
    "resp_dup_no_resource_dropped",
    "resp_dropped_in_error",
];
const QP_IDLE: [&str; 13] = [
    "resp_acks_sent",
    "resp_naks_psn_seq_sent",
    "resp_duplicates",
    "resp_out_of_seq_dropped",
    "resp_messages",
    "resp_bytes_placed",
    "resp_read_responses_sent",
    "resp_atomic_acks_sent",
    "req_acks_received",
    "req_duplicate_acks",
    "req_naks_seq_received",
    "req_duplicate_naks",
    "req_retransmits",
];

/// Every counter a forged frame could move on device `ctx`, by name: the
/// engine's (`rx_wrong_peer`, `rx_cnps`, drops by reason, ...) and, as
/// `traffic.<name>` / `victim.<name>`, its two QPs'.
fn hostile_counts(ctx: &Context, traffic: &Qp, victim: &Qp) -> BTreeMap<String, u64> {
    let mut m: BTreeMap<String, u64> = ctx.engine_stats().iter().filter(|(k, _)| !ENGINE_TRAFFIC.contains(&k.as_str())).collect();
    for (role, qp, names) in
        [(Role::Traffic, traffic, &QP_HOSTILE[..]), (Role::Victim, victim, &QP_HOSTILE[..]), (Role::Victim, victim, &QP_IDLE[..])]
    {
        let s = qp.stats().unwrap();
        for (k, v) in s.iter().filter(|(k, _)| names.contains(k)) {
            m.insert(format!("{}.{k}", role.name()), v);
        }
    }
    m
}

/// Where `attack`'s frame aimed at a `role` QP must be counted: the key of
/// [`hostile_counts`]. The classes used here are each counted once in one
/// counter.
fn counter_key(attack: Attack, role: Role) -> String {
    match attack.expect() {
        Expect::Counted([forge::Counter::Engine(n)]) => n.to_string(),
        Expect::Counted([forge::Counter::Qp(n)]) => format!("{}.{n}", role.name()),
        e => panic!("{attack}: expected to be counted once in one counter, forge says {e:?}"),
    }
}

#[test]
fn forged_frames_from_the_segment_change_nothing_and_are_counted_exactly() {
    veth::require_root();
    let (seg, ca, cb) = veth::segment(Impairments::default(), 1500, 3);
    let ctx = [ca.clone(), cb.clone()];
    let attacker = RawSender::open_in(Some(&seg.ns[2]), &seg.ifname[2]).expect("raw sender in the attacker's namespace");
    assert_eq!(attacker.mac(), seg.mac[2]);

    // Traffic: one RC QP per device, connected to each other.
    let mut sa = side(&ca, MR_LEN);
    let mut sb = side(&cb, MR_LEN);
    let ta = rc_qp(&sa, None);
    let tb = rc_qp(&sb, None);
    let t_lpsn = [Psn::new(0xff_fe00), Psn::new(0x12_3456)];
    // ACK timeout 18 (1.07 s), not perftest's 14 (67 ms): on a loaded
    // two-core machine a datapath thread descheduled for longer than the
    // timeout makes its peer retransmit, and the duplicate ACKs that answer
    // the retransmission are stale responses too (rule 2), which would
    // blur the exact count of forged ones. The segment itself loses nothing.
    bring_up_with_timeout(&ta, &ca, tb.qp_num(), &cb, t_lpsn[0].value(), t_lpsn[1].value(), ACK_TIMEOUT);
    bring_up_with_timeout(&tb, &cb, ta.qp_num(), &ca, t_lpsn[1].value(), t_lpsn[0].value(), ACK_TIMEOUT);
    for (d, s) in [&mut sa, &mut sb].into_iter().enumerate() {
        fill(&mut s.mr, READ_SRC, MAX_LEN, read_seed(d));
        fill_guard(&mut s.mr, GUARD_AT, GUARD_LEN);
    }
    // Victims: a second, idle RC pair with receives posted into guarded
    // memory, a CQ of its own, and a guarded WRITE target.
    let vcq = [ca.create_cq(64, None).unwrap(), cb.create_cq(64, None).unwrap()];
    let mut vmr = [sa.pd.alloc_mr(V_LEN, ALL).unwrap(), sb.pd.alloc_mr(V_LEN, ALL).unwrap()];
    let vqp: Vec<Qp> = (0..2)
        .map(|d| {
            let pd = if d == 0 { &sa.pd } else { &sb.pd };
            pd.create_qp(&QpInit { qp_type: QpType::Rc, send_cq: &vcq[d], recv_cq: &vcq[d], srq: None, cap: caps(), sq_sig_all: false }).unwrap()
        })
        .collect();
    let v_lpsn = [Psn::new(0x7f_fff0), Psn::new(5)];
    bring_up_with_timeout(&vqp[0], &ca, vqp[1].qp_num(), &cb, v_lpsn[0].value(), v_lpsn[1].value(), ACK_TIMEOUT);
    bring_up_with_timeout(&vqp[1], &cb, vqp[0].qp_num(), &ca, v_lpsn[1].value(), v_lpsn[0].value(), ACK_TIMEOUT);
    for d in 0..2 {
        fill_guard(&mut vmr[d], 0, V_GUARDED);
        for i in 0..V_RECVS {
            vqp[d].post_recv(&RecvWr { wr_id: 900 + i as u64, sgl: vec![vmr[d].sge(i * V_RECV, V_RECV as u32)] }).unwrap();
        }
    }

    // What the attacker knows (an on-segment attacker sniffs it; the test
    // simply knows): MACs, addresses, QPNs, PSNs, rkeys, VAs. It keeps its
    // own MAC as Ethernet source also when it spoofs the peer's IP address
    // (a bridge would otherwise learn the peer's MAC on the attacker's port
    // and hand it the peer's real traffic).
    let tqp = [&ta, &tb];
    let t_mr = [(sa.mr.addr(), sa.mr.rkey()), (sb.mr.addr(), sb.mr.rkey())];
    let v_mr = [(vmr[0].addr(), vmr[0].rkey()), (vmr[1].addr(), vmr[1].rkey())];
    let ip4 = |i: usize| IpAddr::from(seg.ipv4[i]);
    let ip6 = |i: usize| IpAddr::from(seg.ipv6[i]);
    let x_mac = seg.mac[2];
    let counts = |d: usize| hostile_counts(&ctx[d], tqp[d], &vqp[d]);

    let stop = AtomicBool::new(false);
    let failed = AtomicBool::new(false);
    let rounds = AtomicU64::new(0);
    // (device, counter key) -> frames injected that must land there.
    let mut injected: BTreeMap<(usize, String), u64> = BTreeMap::new();
    let mut shots_by_class: BTreeMap<String, u64> = BTreeMap::new();
    let mut real_alone = Vec::new();
    let report = std::thread::scope(|s| {
        let worker = s.spawn(|| traffic([&mut sa, &mut sb], [&ta, &tb], &stop, &rounds, &failed));
        let wait_rounds = |n: u64| {
            veth::wait_until(
                || format!("{n} traffic rounds"),
                || {
                    assert!(!failed.load(Ordering::Acquire), "the traffic thread failed");
                    rounds.load(Ordering::Acquire)
                },
                |r| *r >= n,
            )
        };
        // Real traffic alone counts nothing.
        wait_rounds(3);
        real_alone = [counts(0), counts(1)].to_vec();

        let mut frame = Vec::new();
        for k in 0..ATTACK_ROUNDS {
            // Spread the attack over the traffic.
            let seen = rounds.load(Ordering::Acquire);
            wait_rounds(seen + 1);
            for d in 0..2 {
                let p = 1 - d;
                // The attacker's view of device d's QP `role`, addressed to
                // the device's `victim_ip`; `una` is not used by these classes.
                let view = |role: Role, victim_ip: IpAddr| {
                    let (qp, peer_qp, (addr, rkey), va_off) = match role {
                        Role::Traffic => (tqp[d], tqp[p], t_mr[d], GUARD_AT + 4096 * (k as usize % 64)),
                        Role::Victim => (&vqp[d], &vqp[p], v_mr[d], V_WRITE_AT),
                    };
                    let a = qp.query().unwrap();
                    VictimView {
                        victim: Station { mac: seg.mac[d], ip: victim_ip },
                        peer: Station { mac: x_mac, ip: ip4(p) },
                        qpn: qp.qp_num(),
                        peer_qpn: peer_qp.qp_num(),
                        rq_psn: a.rq_psn,
                        sq_psn: a.sq_psn,
                        una: a.sq_psn,
                        rkey,
                        va: addr + va_off as u64,
                    }
                };
                let (t4, t6, v4) = (view(Role::Traffic, ip4(d)), view(Role::Traffic, ip6(d)), view(Role::Victim, ip4(d)));
                let me4 = Station { mac: x_mac, ip: ip4(2) };
                let me6 = Station { mac: x_mac, ip: ip6(2) };
                // The peer host's IPv6 address: the right host, not the QP's GID.
                let peer_host6 = Station { mac: x_mac, ip: ip6(p) };
                // A misaddressed frame goes to the "attacker's" address: the
                // device's IPv6 one, which the XDP program hands up but the
                // QP's GID is not.
                let own6 = Station { mac: x_mac, ip: ip6(d) };
                let mut shots: Vec<(Attack, Role, VictimView, Station, &str)> = Vec::new();
                // Rule 1: requests from a stranger at the expected PSN with valid keys.
                for op in [ReqOp::Send, ReqOp::Write, ReqOp::Read, ReqOp::Atomic] {
                    shots.push((Attack::StrangerRequest(op), Role::Traffic, t4, me4, ""));
                }
                for op in [ReqOp::Send, ReqOp::Write] {
                    shots.push((Attack::StrangerRequest(op), Role::Victim, v4, me4, ""));
                }
                shots.push((Attack::StrangerRequest(ReqOp::Send), Role::Traffic, t6, me6, " (IPv6)"));
                shots.push((Attack::StrangerRequest(ReqOp::Write), Role::Traffic, t6, peer_host6, " (peer host's IPv6)"));
                shots.push((Attack::MisaddressedWrite, Role::Traffic, t4, own6, " (to the device's IPv6)"));
                for r in RespOp::ALL {
                    // Rule 1 for responses: a stranger's, for the newest PSN sent.
                    shots.push((Attack::StrangerResponse(r), Role::Traffic, t4, me4, ""));
                    // Rule 2: the peer's address, PSNs long acknowledged or never sent,
                    // at the busy QP and at the idle one (nothing outstanding).
                    for (role, v) in [(Role::Traffic, t4), (Role::Victim, v4)] {
                        shots.push((Attack::StaleResponse(r), role, v, me4, ""));
                        shots.push((Attack::GhostResponse(r), role, v, me4, ""));
                    }
                }
                // Rule 6: CNPs from a stranger.
                shots.push((Attack::StrangerCnp, Role::Traffic, t4, me4, ""));
                shots.push((Attack::StrangerCnp, Role::Victim, v4, me4, ""));

                for (i, (attack, role, v, from, note)) in shots.into_iter().enumerate() {
                    let key = counter_key(attack, role);
                    let want = {
                        let n = injected.entry((d, key.clone())).or_insert(0);
                        *n += 1;
                        *n
                    };
                    *shots_by_class.entry(format!("{attack}{note} -> {}", role.name())).or_insert(0) += 1;
                    frame.clear();
                    forge::forge(attack, &v, &from, k << 16 | (d as u64) << 8 | i as u64, &mut frame).expect("forge");
                    attacker.send(&frame).unwrap_or_else(|e| panic!("{attack}: {e}"));
                    veth::wait_until(
                        || {
                            format!(
                                "attack round {k}: device {d}: {attack}{note} -> {} counted in {key} ({want}); counters {:?}",
                                role.name(),
                                counts(d)
                            )
                        },
                        || {
                            assert!(!failed.load(Ordering::Acquire), "the traffic thread failed");
                            counts(d)[&key]
                        },
                        |n| *n >= want,
                    );
                }
            }
        }
        stop.store(true, Ordering::Release);
        worker.join().expect("the traffic thread")
    });
    eprintln!("traffic: {report:?}; forged frames by class: {shots_by_class:#?}");
    assert!(report.rounds > ATTACK_ROUNDS, "{report:?}");

    // Real traffic alone counted nothing.
    for (d, c) in real_alone.iter().enumerate() {
        let nonzero: Vec<_> = c.iter().filter(|(_, v)| **v != 0).collect();
        assert!(nonzero.is_empty(), "device {d}: real traffic alone moved hostile-frame counters: {nonzero:?}");
    }
    // No unexpected completion anywhere.
    assert_quiet(&sa.cq);
    assert_quiet(&sb.cq);
    assert_quiet(&vcq[0]);
    assert_quiet(&vcq[1]);
    // No byte placed.
    for d in 0..2 {
        let s = if d == 0 { &sa } else { &sb };
        assert_eq!(guard_broken(&s.mr, GUARD_AT, GUARD_LEN), None, "device {d}: traffic MR guard written");
        assert_eq!(guard_broken(&vmr[d], 0, V_GUARDED), None, "device {d}: victim MR written");
    }
    // Every QP still in RTS.
    for d in 0..2 {
        assert_eq!(tqp[d].query().unwrap().qp_state, QpState::Rts, "device {d} traffic QP {:?}", tqp[d].stats());
        assert_eq!(vqp[d].query().unwrap().qp_state, QpState::Rts, "device {d} victim QP {:?}", vqp[d].stats());
    }
    // Each counter exactly what was injected of its class; all others zero.
    for d in 0..2 {
        let got = counts(d);
        let mut want: BTreeMap<String, u64> = got.keys().map(|k| (k.clone(), 0)).collect();
        for ((x, key), n) in &injected {
            if *x == d {
                *want.get_mut(key).unwrap_or_else(|| panic!("no counter {key}")) += n;
            }
        }
        let q = tqp[d].stats().unwrap();
        let diff: Vec<_> = got.iter().filter(|(k, v)| want[*k] != **v).map(|(k, v)| (k, *v, want[k])).collect();
        assert!(
            diff.is_empty(),
            "device {d}: hostile-frame counters differ (name, counted, injected): {diff:?}; traffic QP: retransmits {}, \
             timeouts {}, duplicates {}; ports' drops: a {:?}, b {:?}; segment:\n{}",
            q.req_retransmits,
            q.req_timeouts,
            q.resp_duplicates,
            port_drops(&ca),
            port_drops(&cb),
            segment_drops(&seg),
        );
    }
    // The victims were never touched: their receives are still the first
    // ones posted and their PSNs unmoved, so real traffic lands exactly.
    for d in 0..2 {
        let p = 1 - d;
        let (send_len, write_len) = (1000 + d, 2000 + d);
        fill(&mut vmr[d], V_SRC, V_LEN - V_SRC, 0x30 + d as u8);
        let remote = RemoteAddr { addr: vmr[p].addr() + V_WRITE_AT as u64, rkey: vmr[p].rkey() };
        vqp[d].post_send(&send_wr(1, SendOp::Send, vec![vmr[d].sge(V_SRC, send_len as u32)])).unwrap();
        vqp[d].post_send(&send_wr(2, SendOp::Write { remote }, vec![vmr[d].sge(V_SRC, write_len as u32)])).unwrap();
        let mut c: Vec<_> = wait(&vcq[d], 2).iter().map(|c| (c.wr_id, c.status)).collect();
        c.sort_by_key(|c| c.0);
        assert_eq!(c, vec![(1, WcStatus::Success), (2, WcStatus::Success)], "victim {d} -> {p}");
        let r = wait(&vcq[p], 1);
        assert_eq!((r[0].wr_id, r[0].status, r[0].byte_len as usize), (900, WcStatus::Success, send_len), "victim {p} receive");
        let pat = expected(V_LEN - V_SRC, 0x30 + d as u8);
        assert!(bytes(&vmr[p], 0..send_len) == pat[..send_len], "victim {p}: SEND data");
        assert_eq!(guard_broken(&vmr[p], send_len, V_WRITE_AT - send_len), None, "victim {p}: past the SEND");
        assert!(bytes(&vmr[p], V_WRITE_AT..V_WRITE_AT + write_len) == pat[..write_len], "victim {p}: WRITE data");
        assert_eq!(guard_broken(&vmr[p], V_WRITE_AT + write_len, V_GUARDED - V_WRITE_AT - write_len), None, "victim {p}: past the WRITE");
    }
    for d in 0..2 {
        assert_quiet(&vcq[d]);
        assert_eq!(vqp[d].query().unwrap().qp_state, QpState::Rts);
    }
    let xdp: Vec<_> = cb.nic().with_port(|p| p.counters()).into_iter().filter(|(k, _)| k.starts_with("xsk_rx_") || k.starts_with("xdp_")).collect();
    eprintln!("device b port: {xdp:?}");
    for d in 0..2 {
        let q = tqp[d].stats().unwrap();
        eprintln!(
            "device {d} traffic QP: retransmits {}, timeouts {}, duplicates {}, stale {}, dup acks {}",
            q.req_retransmits, q.req_timeouts, q.resp_duplicates, q.req_stale_responses, q.req_duplicate_acks
        );
    }
    // Devices and QPs go before the segment they sit on.
    drop((vqp, vmr, vcq, ta, tb, sa, sb, ctx, ca, cb));
    drop(seg);
}

/// A device's AF_XDP and XDP counters that say a frame was lost on the way.
fn port_drops(ctx: &Context) -> Vec<(String, u64)> {
    let lost = |k: &str| ["drop", "full", "empty", "no_buffer"].iter().any(|w| k.contains(w));
    ctx.nic().with_port(|p| p.counters()).into_iter().filter(|(k, v)| *v != 0 && lost(k)).collect()
}

/// `ip -s link` (packets, errors, drops each way) of every interface of the
/// segment, one line each.
fn segment_drops(seg: &urnic_datapath::netns::Segment) -> String {
    let mut out = String::new();
    for ns in seg.ns.iter().chain(std::iter::once(&seg.bridge_ns)) {
        if let Ok(o) = std::process::Command::new("ip").args(["-n", ns, "-s", "-o", "link"]).output() {
            for line in String::from_utf8_lossy(&o.stdout).lines() {
                out.push_str(&format!("{ns}: {}\n", line.split_whitespace().collect::<Vec<_>>().join(" ")));
            }
        }
    }
    out
}
