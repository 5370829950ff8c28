//! A hostile third host on a simulated segment.
//!
//! An [`Adversary`] drives a [`Network`] of transport [`Engine`]s the way
//! [`Network::run_until`] does, and at moments drawn from its own seed
//! forges a frame ([`forge`]) of one of its [`Attack`] classes against one
//! of its [`Target`] QPs and puts it on the segment ([`Network::inject`]).
//! It aims as an attacker sniffing the segment would: at the victim's
//! current PSNs (read with `query_qp`, what the last frames on the wire
//! show), with R_Keys and addresses of the victim's memory. It also sniffs
//! the victim's incoming PSN sequence error NAKs ([`Network::set_watch`])
//! and replays copies of some of them right after the original.
//!
//! Around each injected frame it reads the victim engine's counters, so
//! every [`Strike`] records exactly what the frame changed and whether that
//! is what [`Attack::expect`] says a receiver following the rules does.

use core::time::Duration;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::psn::Psn;
use crate::sim::forge::{forge, Attack, Counter, Expect, Station, VictimView};
use crate::sim::network::{Network, NodeId, RunOutcome};
use crate::time::Instant;
use crate::transport::attr::QpState;
use crate::transport::engine::Engine;
use crate::wire::{parse_frame, AckSyndrome, NakCode, Opcode};

/// A QP the adversary may attack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The victim's node.
    pub node: NodeId,
    /// The victim QP.
    pub qpn: u32,
    /// The victim's address.
    pub addr: Station,
    /// Its peer QP's number.
    pub peer_qpn: u32,
    /// Its peer's address.
    pub peer: Station,
    /// Memory of the victim to aim RDMA requests at: `(rkey, first VA,
    /// length)` (keys and addresses an attacker reads in sniffed RETHs).
    pub memory: Vec<(u32, u64, u64)>,
}

/// How the adversary behaves.
///
/// It strikes on three triggers: after a number of frames delivered on the
/// segment (so strikes spread over the traffic of short and long runs
/// alike: the k-th comes after uniform `1..=2 * frames_base * frames_growth^k`
/// more frames), after a stretch of virtual time (quiet periods: RNR waits,
/// timeouts), and at idle QPs after the network went idle.
#[derive(Clone, Debug, PartialEq)]
pub struct AdversaryConfig {
    /// Classes to draw from, uniformly. [`Attack::SeqNakCopy`] is not drawn
    /// here: copies of sniffed NAKs are controlled by `nak_copy_chance`.
    pub attacks: Vec<Attack>,
    /// Mean frames before the first frame-triggered strike.
    pub frames_base: f64,
    /// Growth of that mean per strike.
    pub frames_growth: f64,
    /// Frame-triggered strikes, at most.
    pub max_frame_strikes: usize,
    /// Time between two time-triggered strikes: uniform in this range.
    pub gap: (Duration, Duration),
    /// Time-triggered strikes, at most.
    pub max_timed_strikes: usize,
    /// Strikes after the network went idle (at idle QPs), at most.
    pub after_idle: usize,
    /// Chance that a sniffed sequence NAK is replayed (1..=3 copies, right
    /// after the original).
    pub nak_copy_chance: f64,
    /// Sequence NAKs replayed, at most.
    pub max_nak_copies: usize,
}

impl AdversaryConfig {
    /// Every class a receiver can tell from its peer (the model-safe ones,
    /// [`Attack::model_safe`]); up to 48 strikes by frames (the first after
    /// about 4 frames, spacing growing by 15 % per strike: a run of 500
    /// frames sees about 20, one of 200,000 all), 12 by time (every
    /// 20..200 µs), 4 after idle; half the sniffed sequence NAKs replayed
    /// (at most 8).
    pub fn model_safe() -> AdversaryConfig {
        AdversaryConfig {
            attacks: Attack::ALL.iter().copied().filter(|a| a.model_safe() && *a != Attack::SeqNakCopy).collect(),
            frames_base: 4.0,
            frames_growth: 1.15,
            max_frame_strikes: 48,
            gap: (Duration::from_micros(20), Duration::from_micros(200)),
            max_timed_strikes: 12,
            after_idle: 4,
            nak_copy_chance: 0.5,
            max_nak_copies: 8,
        }
    }
}

/// What one injected frame did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Strike {
    /// When.
    pub at: Instant,
    /// The class.
    pub attack: Attack,
    /// The victim's node and QP.
    pub victim: (NodeId, u32),
    /// The forged frame's opcode and PSN.
    pub opcode: Opcode,
    /// PSN of the forged frame.
    pub psn: Psn,
    /// The victim QP's state before and after.
    pub state: (QpState, QpState),
    /// Every counter of the victim that changed, with its change (engine
    /// counters as `engine.NAME`, the victim QP's as `qp.NAME`; frame and
    /// byte totals left out).
    pub deltas: Vec<(String, i64)>,
    /// `Ok` if the frame was counted as expected, else why not.
    pub verdict: Result<(), String>,
    /// Whether the network had work pending when the frame came (frames
    /// on a link or a timer armed): struck during traffic, not after it.
    pub busy: bool,
}

impl Strike {
    /// The changed counters as `name+n` words, for reports.
    pub fn counted_as(&self) -> String {
        let v: Vec<String> = self.deltas.iter().map(|(k, d)| format!("{k}{d:+}")).collect();
        if v.is_empty() {
            "nothing".into()
        } else {
            v.join(" ")
        }
    }
}

/// What the adversary shares with its watch on the segment.
#[derive(Debug, Default)]
struct Sniffer {
    /// Frames delivered on the segment so far.
    delivered: u64,
    /// Stop the run when `delivered` reaches this (a frame-triggered strike).
    strike_at: u64,
    /// Sequence NAKs caught, to be replayed: (receiver, frame).
    naks: Vec<(NodeId, Vec<u8>)>,
}

/// A hostile third host on the segment; see the module documentation.
pub struct Adversary {
    rng: ChaCha8Rng,
    me: Station,
    config: AdversaryConfig,
    targets: Vec<Target>,
    strikes: Vec<Strike>,
    next_at: Option<Instant>,
    frame_strikes: usize,
    timed_left: usize,
    idle_left: usize,
    sniffer: Rc<RefCell<Sniffer>>,
}

impl core::fmt::Debug for Adversary {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Adversary").field("me", &self.me).field("strikes", &self.strikes.len()).finish()
    }
}

/// Counters that every frame (or every accepted one) moves: not evidence.
const NOISE: &[&str] = &["engine.rx_frames", "engine.tx_frames", "qp.rx_packets", "qp.rx_bytes", "qp.tx_packets", "qp.tx_bytes"];

fn counters(e: &Engine, qpn: u32) -> BTreeMap<String, u64> {
    let mut m: BTreeMap<String, u64> = e.stats().iter().map(|(k, v)| (format!("engine.{k}"), v)).collect();
    if let Some(s) = e.qp_stats(qpn) {
        m.extend(s.iter().map(|(k, v)| (format!("qp.{k}"), v)));
    }
    m
}

fn diff(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> Vec<(String, i64)> {
    after
        .iter()
        .filter(|(k, _)| !NOISE.contains(&k.as_str()))
        .filter_map(|(k, &v)| {
            let d = v as i64 - before.get(k).copied().unwrap_or(0) as i64;
            (d != 0).then(|| (k.clone(), d))
        })
        .collect()
}

fn key(c: &Counter) -> String {
    match c {
        Counter::Engine(n) => format!("engine.{n}"),
        Counter::Qp(n) => format!("qp.{n}"),
    }
}

/// Judge the counter changes against an expectation.
fn judge(expect: Expect, state: (QpState, QpState), deltas: &[(String, i64)]) -> Result<(), String> {
    let d = |k: &str| deltas.iter().find(|(n, _)| n == k).map_or(0, |x| x.1);
    match expect {
        Expect::Accepted => return Ok(()),
        Expect::Counted(list) => {
            for c in list {
                let k = key(c);
                if d(&k) != 1 {
                    return Err(format!("expected {k}+1, counted as {}", show(deltas)));
                }
            }
        }
        Expect::OneOf(list) => {
            let hits: Vec<String> = list.iter().map(key).filter(|k| d(k) != 0).collect();
            if hits.len() != 1 || d(&hits[0]) != 1 {
                let names: Vec<String> = list.iter().map(key).collect();
                return Err(format!("expected one of {} +1, counted as {}", names.join("|"), show(deltas)));
            }
        }
    }
    if state.0 != state.1 {
        return Err(format!("the QP went from {:?} to {:?} (counted as {})", state.0, state.1, show(deltas)));
    }
    Ok(())
}

fn show(deltas: &[(String, i64)]) -> String {
    let v: Vec<String> = deltas.iter().map(|(k, d)| format!("{k}{d:+}")).collect();
    if v.is_empty() {
        "nothing".into()
    } else {
        v.join(" ")
    }
}

const WRONG_STATE: &[Counter] = &[Counter::Engine("rx_wrong_state")];
const NAK_COPY: &[Counter] = &[Counter::Qp("req_duplicate_naks"), Counter::Qp("req_stale_responses"), Counter::Qp("req_ghost_responses")];

impl Adversary {
    /// An adversary at `me` with its own `seed`, attacking `targets`.
    pub fn new(seed: u64, me: Station, config: AdversaryConfig, targets: Vec<Target>) -> Adversary {
        let timed_left = config.max_timed_strikes;
        let idle_left = config.after_idle;
        let mut a = Adversary {
            rng: ChaCha8Rng::seed_from_u64(seed),
            me,
            config,
            targets,
            strikes: Vec::new(),
            next_at: None,
            frame_strikes: 0,
            timed_left,
            idle_left,
            sniffer: Rc::new(RefCell::new(Sniffer { strike_at: u64::MAX, ..Sniffer::default() })),
        };
        a.schedule_frames();
        a
    }

    /// Watch the segment of `net` ([`Network::set_watch`]): count the frames
    /// (for frame-triggered strikes) and catch sequence NAKs to the targets.
    /// Without it only time-triggered and idle strikes happen.
    pub fn install(&mut self, net: &mut Network<Engine>) {
        let nodes: Vec<NodeId> = self.targets.iter().map(|t| t.node).collect();
        let sniffer = self.sniffer.clone();
        let mut nak_left = self.config.max_nak_copies;
        let chance = self.config.nak_copy_chance.clamp(0.0, 1.0);
        let mut rng = ChaCha8Rng::seed_from_u64(self.rng.gen());
        net.set_watch(Some(Box::new(move |_now, _from, to, frame: &[u8]| {
            let mut sn = sniffer.borrow_mut();
            sn.delivered += 1;
            let strike = sn.delivered >= sn.strike_at;
            if nak_left == 0 || !nodes.contains(&to) || crate::wire::peek_opcode(frame) != Some(Opcode::RC_ACK) {
                return strike;
            }
            let Ok(p) = parse_frame(frame) else { return strike };
            let seq = p.repr.transport.aeth.map(|a| a.syndrome) == Some(AckSyndrome::Nak(NakCode::PsnSequenceError));
            if !seq || !rng.gen_bool(chance) {
                return strike;
            }
            nak_left -= 1;
            sn.naks.push((to, frame.to_vec()));
            true
        })));
    }

    /// Everything injected so far, in order.
    pub fn strikes(&self) -> &[Strike] {
        &self.strikes
    }

    /// The strikes not counted as expected.
    pub fn failures(&self) -> impl Iterator<Item = &Strike> {
        self.strikes.iter().filter(|s| s.verdict.is_err())
    }

    /// Strikes by class and what they were counted as.
    pub fn tally(&self) -> BTreeMap<(String, String), u64> {
        let mut m = BTreeMap::new();
        for s in &self.strikes {
            *m.entry((s.attack.name().to_string(), s.counted_as())).or_insert(0) += 1;
        }
        m
    }

    fn schedule_time(&mut self, now: Instant) {
        let (lo, hi) = self.config.gap;
        let (lo, hi) = (lo.as_nanos() as u64, hi.as_nanos() as u64);
        let ns = self.rng.gen_range(lo..=hi.max(lo));
        self.next_at = Some(now + Duration::from_nanos(ns));
    }

    fn schedule_frames(&mut self) {
        let mut sn = self.sniffer.borrow_mut();
        if self.frame_strikes >= self.config.max_frame_strikes {
            sn.strike_at = u64::MAX;
            return;
        }
        let mean = self.config.frames_base * self.config.frames_growth.powi(self.frame_strikes as i32);
        let hi = (2.0 * mean).clamp(1.0, 1e12) as u64;
        sn.strike_at = sn.delivered + self.rng.gen_range(1..=hi);
    }

    /// Run `net` like [`Network::run_until`]`(deadline)`, striking on the way.
    /// With `stop_when_idle`, returns [`RunOutcome::Idle`] once the network
    /// is idle and the strikes after idle are spent; without, goes on (time-
    /// triggered strikes, clock advanced) until `deadline`, ending with
    /// [`RunOutcome::Deadline`].
    pub fn run_until(&mut self, net: &mut Network<Engine>, deadline: Instant, stop_when_idle: bool) -> RunOutcome {
        loop {
            if self.next_at.is_none() && self.timed_left > 0 {
                self.schedule_time(net.now());
            }
            let t = self.next_at.unwrap_or(deadline).min(deadline);
            match net.run_until(t) {
                RunOutcome::Stopped => {
                    self.replay_naks(net);
                    let due = {
                        let sn = self.sniffer.borrow();
                        sn.delivered >= sn.strike_at
                    };
                    if due {
                        self.frame_strikes += 1;
                        self.strike(net);
                        self.schedule_frames();
                    }
                }
                RunOutcome::Stalled => return RunOutcome::Stalled,
                RunOutcome::Deadline => {
                    if net.now() >= deadline {
                        return RunOutcome::Deadline;
                    }
                    self.timed_left = self.timed_left.saturating_sub(1);
                    self.strike(net);
                    self.next_at = None;
                }
                RunOutcome::Idle => {
                    if !stop_when_idle {
                        // Waiting for the caller's next move: strike on time
                        // at the idle QPs until the deadline.
                        if net.advance_to(t) == RunOutcome::Stalled {
                            return RunOutcome::Stalled;
                        }
                        if t >= deadline {
                            return RunOutcome::Deadline;
                        }
                        self.timed_left = self.timed_left.saturating_sub(1);
                        self.strike(net);
                        self.next_at = None;
                        continue;
                    }
                    if self.idle_left == 0 {
                        return RunOutcome::Idle;
                    }
                    // A moment later, at the idle QPs.
                    let (lo, hi) = self.config.gap;
                    let later = net.now() + Duration::from_nanos(self.rng.gen_range(lo.as_nanos() as u64..=hi.as_nanos().max(lo.as_nanos()) as u64));
                    if later >= deadline {
                        return RunOutcome::Idle;
                    }
                    if net.advance_to(later) == RunOutcome::Stalled {
                        return RunOutcome::Stalled;
                    }
                    self.idle_left -= 1;
                    self.strike(net);
                    self.next_at = None;
                }
            }
        }
    }

    /// One forged frame of a random class at a random target, now.
    pub fn strike(&mut self, net: &mut Network<Engine>) {
        if self.targets.is_empty() || self.config.attacks.is_empty() {
            return;
        }
        let t = self.rng.gen_range(0..self.targets.len());
        let attack = self.config.attacks[self.rng.gen_range(0..self.config.attacks.len())];
        let target = self.targets[t].clone();
        let e = net.node(target.node);
        let Ok(attr) = e.query_qp(target.qpn) else { return };
        let (rkey, va) = match target.memory.len() {
            0 => (self.rng.gen(), self.rng.gen()),
            n => {
                let (k, lo, len) = target.memory[self.rng.gen_range(0..n)];
                (k, lo + self.rng.gen_range(0..len.saturating_sub(512).max(1)) / 8 * 8)
            }
        };
        let view = VictimView {
            victim: target.addr,
            peer: target.peer,
            qpn: target.qpn,
            peer_qpn: target.peer_qpn,
            rq_psn: attr.rq_psn,
            sq_psn: attr.sq_psn,
            una: attr.sq_psn,
            rkey,
            va,
        };
        let mut frame = Vec::new();
        let Ok(f) = forge(attack, &view, &self.me, self.rng.gen(), &mut frame) else { return };
        let expect = match attr.qp_state {
            QpState::Rts => attack.expect(),
            // rxe check_type_state: nothing is accepted in these states.
            QpState::Reset | QpState::Init | QpState::Err => Expect::Counted(WRONG_STATE),
            // RTR, SQD, SQE: the simulator's mixes have none; nothing to judge.
            _ => Expect::Accepted,
        };
        self.inject(net, &target, attack, f.opcode, f.psn, &frame, expect);
    }

    fn replay_naks(&mut self, net: &mut Network<Engine>) {
        let caught: Vec<(NodeId, Vec<u8>)> = std::mem::take(&mut self.sniffer.borrow_mut().naks);
        for (node, frame) in caught {
            let Ok(p) = parse_frame(&frame) else { continue };
            let (qpn, psn) = (p.repr.transport.bth.dest_qp, p.repr.transport.bth.psn);
            let Some(target) = self.targets.iter().find(|t| t.node == node && t.qpn == qpn).cloned() else { continue };
            let copies = self.rng.gen_range(1..=3);
            for _ in 0..copies {
                let state = net.node(node).qp_state(qpn).unwrap_or(QpState::Reset);
                let expect = match state {
                    QpState::Rts => Expect::OneOf(NAK_COPY),
                    _ => Expect::Counted(WRONG_STATE),
                };
                self.inject(net, &target, Attack::SeqNakCopy, Opcode::RC_ACK, psn, &frame, expect);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn inject(&mut self, net: &mut Network<Engine>, target: &Target, attack: Attack, opcode: Opcode, psn: Psn, frame: &[u8], expect: Expect) {
        let busy = net.next_event().is_some();
        let e = net.node(target.node);
        let before = counters(e, target.qpn);
        let s0 = e.qp_state(target.qpn).unwrap_or(QpState::Reset);
        net.inject(target.node, frame);
        let e = net.node(target.node);
        let after = counters(e, target.qpn);
        let s1 = e.qp_state(target.qpn).unwrap_or(QpState::Reset);
        let deltas = diff(&before, &after);
        let mut verdict = judge(expect, (s0, s1), &deltas);
        // A copy of a sequence NAK must never start a retry of its own (nor
        // use up retry_cnt).
        if attack == Attack::SeqNakCopy && verdict.is_ok() && deltas.iter().any(|(k, _)| k == "qp.req_retransmits") {
            verdict = Err(format!("a NAK copy restarted the retry: {}", show(&deltas)));
        }
        self.strikes.push(Strike { at: net.now(), attack, victim: (target.node, target.qpn), opcode, psn, state: (s0, s1), deltas, verdict, busy });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::link::LinkConfig;
    use crate::sim::rc::{connect_rc, HostAddr, RcParams};
    use crate::transport::engine::EngineConfig;
    use crate::transport::memory::MemoryTable;
    use crate::transport::wr::{Payload, SendFlags, SendOp, SendWr};
    use std::sync::Arc;

    #[test]
    fn judge_reads_counter_changes() {
        let rts = (QpState::Rts, QpState::Rts);
        let d = |v: &[(&str, i64)]| v.iter().map(|(k, n)| (k.to_string(), *n)).collect::<Vec<_>>();
        let wrong_peer = Attack::StrangerRequest(crate::sim::forge::ReqOp::Write).expect();
        assert!(judge(wrong_peer, rts, &d(&[("engine.rx_wrong_peer", 1)])).is_ok());
        assert!(judge(wrong_peer, rts, &d(&[("qp.resp_messages", 1), ("qp.resp_bytes_placed", 8)])).is_err());
        assert!(judge(wrong_peer, (QpState::Rts, QpState::Err), &d(&[("engine.rx_wrong_peer", 1)])).is_err());
        let ahead = Attack::AheadRequest(crate::sim::forge::ReqOp::Send).expect();
        assert!(judge(ahead, rts, &d(&[("qp.resp_out_of_seq_dropped", 1)])).is_ok());
        assert!(judge(ahead, rts, &d(&[("qp.resp_out_of_seq_dropped", 1), ("qp.resp_naks_psn_seq_sent", 1)])).is_err());
        assert!(judge(ahead, rts, &d(&[])).is_err());
        assert!(judge(Expect::Accepted, (QpState::Rts, QpState::Err), &d(&[])).is_ok());
    }

    #[test]
    fn strikes_are_counted_and_deterministic() {
        let run = |seed: u64| {
            let hosts = [HostAddr::ipv4(1), HostAddr::ipv4(2)];
            let mut e = [0, 1].map(|_| Engine::new(EngineConfig::default(), Arc::new(MemoryTable::new())));
            let init = crate::transport::attr::QpInitAttr {
                qp_type: crate::transport::attr::QpType::Rc,
                pd: crate::transport::memory::PdId(1),
                send_cq: crate::transport::wr::CqId(0),
                recv_cq: crate::transport::wr::CqId(1),
                srq: None,
                cap: crate::transport::attr::QpCaps::default(),
                sq_sig_all: true,
            };
            let qa = e[0].create_qp(&init).unwrap();
            let qb = e[1].create_qp(&init).unwrap();
            let [mut ea, mut eb] = e;
            let p = RcParams::default();
            connect_rc(&mut ea, qa, &hosts[0], &p, &mut eb, qb, &hosts[1], &p).unwrap();
            for i in 0..4 {
                // Zero-length WRITEs need no memory.
                let wr = SendWr {
                    wr_id: i,
                    op: SendOp::Write { remote: crate::transport::wr::RemoteAddr { addr: 0, rkey: 0 } },
                    payload: Payload::Sgl(vec![]),
                    flags: SendFlags::SIGNALED,
                    ud: None,
                };
                ea.post_send(qa, wr).unwrap();
            }
            let mut net = Network::new(Instant::ZERO);
            let a = net.add_node(ea, hosts[0].mac);
            let b = net.add_node(eb, hosts[1].mac);
            net.connect_pair(a, b, LinkConfig::ideal(Duration::from_micros(2)), 3);
            let (sa, sb) = (Station::from(&hosts[0]), Station::from(&hosts[1]));
            let targets = vec![
                Target { node: a, qpn: qa, addr: sa, peer_qpn: qb, peer: sb, memory: vec![] },
                Target { node: b, qpn: qb, addr: sb, peer_qpn: qa, peer: sa, memory: vec![] },
            ];
            let me = Station::from(&HostAddr::ipv4(66));
            let mut adv = Adversary::new(seed, me, AdversaryConfig::model_safe(), targets);
            adv.install(&mut net);
            let out = adv.run_until(&mut net, Instant::ZERO + Duration::from_secs(1), true);
            (out, adv.strikes().to_vec(), net.stats().injected)
        };
        let (out, strikes, injected) = run(5);
        assert_eq!(out, RunOutcome::Idle);
        assert_eq!(strikes.len() as u64, injected);
        assert!(strikes.len() >= 4, "{} strikes", strikes.len());
        assert_eq!(run(5).1, strikes, "same seed, same strikes");
        // Every strike recorded what it changed; stranger frames are refused
        // before they reach a QP whatever the rules (`rx_wrong_peer` or, on
        // a tree without the address check, something else: never nothing).
        for s in &strikes {
            assert!(!s.deltas.is_empty(), "{s:?}");
        }
        let bad: Vec<String> = strikes.iter().filter_map(|s| s.verdict.as_ref().err().map(|e| format!("{} at {:?}: {e}", s.attack, s.at))).collect();
        assert!(bad.is_empty(), "strikes not counted as expected:\n{}", bad.join("\n"));
    }
}
