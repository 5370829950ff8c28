//! Structured fuzzing of the CM agent, [`Cm`] (fuzz target `cm_agents`).
//!
//! Every input builds two agents, A and B, each listening on a service of
//! its own, and runs a program read from the input: connects, SIDR
//! requests, the consumer's answers (accept, reject, RTU, establish,
//! disconnect, destroy, SIDR replies, listen/unlisten), MADs delivered,
//! dropped or duplicated between the two, time advanced, and MADs forged
//! from the input's bytes (a real MAD mutated, a well-formed CM header over
//! chosen fields and comm IDs the agents use, or raw bytes of any length)
//! from the peer's GID or a stranger's. `proptest` in `rocev2/tests/cm_hostile.rs`
//! throws single random MADs at an established pair; this one reaches the
//! exchanges' deeper states, where the comm IDs, GIDs and QPNs must match.
//!
//! # Invariants (checked after every step; a violation panics with a message)
//!
//! - nothing in the agent panics, whatever arrives or the consumer calls;
//! - every MAD an agent sends parses ([`CmMad::parse`]), and every MAD that
//!   parses emits and parses back to the same message (and so does the
//!   RDMA-CM IP header of a REQ's or SIDR_REQ's private data);
//! - events name only ids the consumer holds (an id from its own `connect`
//!   or `sidr_request`, or one a `ConnectRequest`/`SidrRequest` introduced),
//!   never one it destroyed or rejected, or one an earlier event ended
//!   (`Rejected`, `TimedOut`, `TimewaitExit`, `SidrReply`);
//! - an agent holds at most `max_ids` live ids;
//! - at the end the consumer destroys every id it holds and time runs on
//!   with nothing delivered: every id of both agents runs out
//!   ("state runs out alone", `Cm::destroy`), and B, listening again,
//!   takes a fresh REQ from A (its backlog slots all came back).
//!
//! # Input format
//!
//! Setup, 2 bytes `s0 s1`: response timeout exponent `8 + (s0 & 7)` (1 ms
//! to 131 ms), max CM retries `s0 >> 3 & 3`, B's backlog `1 + (s0 >> 5)`;
//! timewait `1 << (s1 & 7)` ms, agent seed `s1`.
//!
//! Then steps, until the input ends (at most [`MAX_STEPS`]): one byte `o`,
//! `o % 16`:
//! 0/1 A/B connects (a `connect` byte and fields follow, see
//! [`World::connect`]); 2/3 deliver the next MAD queued for A/B; 4/5 drop it;
//! 6/7 deliver it and keep it queued (a duplicate); 8 advance time (one
//! byte: `[10 µs, 1 ms, 100 ms, 1 s, 10 s, to the next timeout][b % 6]`)
//! and run both agents' timers; 9/10 a consumer call on A/B (see
//! [`World::consumer`]); 11/12 a mutated copy of the next MAD queued for
//! A/B, delivered (see [`World::mutate`]); 13 a forged CM MAD (see
//! [`World::forge`]); 14 a SIDR request (one byte: bit 0 from B, bit 1 to
//! an unknown service, bits 2-3 private data length `[0, 16, 216, 217]`);
//! 15 raw bytes (one byte `n`: bit 0 to B, bit 1 from a stranger, then
//! `n >> 2` as a length step of 5: `0, 5, ..., 315` bytes).

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use crate::reader::Reader;
use rocev2::cm::msg::attr;
use rocev2::cm::{AcceptParams, Cm, CmConfig, CmEvent, CmId, CmMad, CmMessage, CmaHeader, ConnectParams, Gid, PortSpace, MAD_LEN};
use rocev2::Instant;

/// Most steps taken from one input.
pub const MAX_STEPS: usize = 128;
/// Live ids an agent may hold.
const MAX_IDS: usize = 12;
/// MADs a direction holds; more are dropped, as a full queue would.
const QUEUE_CAP: usize = 64;
/// Timer rounds the final wind-down may take before it counts as stuck.
const WIND_DOWN_ROUNDS: usize = 100_000;

const GIDS: [Gid; 2] = [[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2]];
const STRANGER: Gid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 66];
const T0: Instant = Instant::from_nanos(1_000_000);

/// Each side's own service (A listens on port 1000, B on 2000); 3000 has
/// no listener.
fn service(port: u16) -> u64 {
    PortSpace::Tcp.service_id(port)
}
const PORTS: [u16; 2] = [1000, 2000];
const UNKNOWN_PORT: u16 = 3000;

const CM_ATTRS: [u16; 9] = [attr::REQ, attr::MRA, attr::REJ, attr::REP, attr::RTU, attr::DREQ, attr::DREP, attr::SIDR_REQ, attr::SIDR_REP];

/// One agent and what its consumer knows.
struct Side {
    cm: Cm,
    /// Ids the consumer holds.
    ids: Vec<CmId>,
    /// Ids the consumer let go of, or whose end an event announced.
    gone: HashSet<CmId>,
    /// MADs on their way to this side: (source GID, destination GID, MAD).
    inbox: VecDeque<(Gid, Gid, [u8; MAD_LEN])>,
    /// Whether it listens on its own service.
    listening: bool,
}

impl Side {
    fn hold(&mut self, id: CmId) {
        // Ids are drawn at random among those not live: one the consumer let
        // go of long ago may come back.
        self.gone.remove(&id);
        if !self.ids.contains(&id) {
            self.ids.push(id);
        }
    }

    fn release(&mut self, id: CmId) {
        self.ids.retain(|&i| i != id);
        self.gone.insert(id);
    }
}

/// One of `ids` (`b` picks), or, with bit 7 of `b` or no ids, any value the
/// input gives.
fn choose_id(ids: &[CmId], b: u8, r: &mut Reader) -> CmId {
    if b & 0x80 != 0 || ids.is_empty() {
        r.u32()
    } else {
        ids[usize::from(b) % ids.len()]
    }
}

/// Both agents, the virtual clock and B's backlog.
struct World {
    sides: [Side; 2],
    now: Instant,
    backlog: usize,
}

impl World {
    fn new(r: &mut Reader) -> World {
        let (s0, s1) = (r.u8(), r.u8());
        let backlog = 1 + usize::from(s0 >> 5);
        let config = |guid| CmConfig {
            local_ca_guid: guid,
            response_timeout: 8 + (s0 & 7),
            max_retries: s0 >> 3 & 3,
            mra_service_timeout: 10,
            timewait: Duration::from_millis(1 << (s1 & 7)),
            max_ids: MAX_IDS,
        };
        let side = |i: usize| {
            let mut cm = Cm::with_seed(config(i as u64 + 1), u64::from(s1) << 8 | i as u64);
            cm.listen(service(PORTS[i]), backlog).expect("a fresh agent listens");
            Side { cm, ids: Vec::new(), gone: HashSet::new(), inbox: VecDeque::new(), listening: true }
        };
        World { sides: [side(0), side(1)], now: T0, backlog }
    }

    /// Hand `mad` to side `to` as if from `src`, with the round-trip check.
    fn deliver(&mut self, to: usize, src: Gid, dst: Gid, mad: &[u8]) {
        if let Ok(m) = CmMad::parse(mad) {
            let again = CmMad::parse(&m.emit()).expect("an emitted MAD parses");
            assert_eq!(again, m, "a parsed MAD emits and parses back to itself");
            // RDMA-CM's IP header, which the verbs layer reads from a REQ's
            // or SIDR_REQ's private data.
            let private = match &m.msg {
                CmMessage::Req(req) => Some(&req.private_data),
                CmMessage::SidrReq(req) => Some(&req.private_data),
                _ => None,
            };
            if let Some(Ok(h)) = private.map(|p| CmaHeader::parse(p)) {
                assert_eq!(CmaHeader::parse(&h.emit()), Ok(h), "an RDMA-CM IP header emits and parses back to itself");
            }
        }
        let r = self.sides[to].cm.handle_mad(self.now, src, dst, mad);
        trace!("  {} handles a MAD from {:?}: {r:?}", name(to), &src[12..]);
    }

    /// Drain both agents' MADs (checked, routed) and events (checked).
    fn settle(&mut self) {
        for i in 0..2 {
            while let Some(t) = self.sides[i].cm.poll_transmit() {
                let m = CmMad::parse(&t.mad).unwrap_or_else(|e| panic!("{} sent a MAD that does not parse: {e:?}", name(i)));
                trace!("  {} sends {} (tid {:#x})", name(i), m.msg.name(), m.tid);
                let peer = &mut self.sides[1 - i];
                if t.dst_gid == GIDS[1 - i] && peer.inbox.len() < QUEUE_CAP {
                    peer.inbox.push_back((t.src_gid, t.dst_gid, t.mad));
                }
            }
            while let Some(ev) = self.sides[i].cm.poll_event() {
                trace!("  {} event {ev:?}", name(i));
                let side = &mut self.sides[i];
                match ev {
                    CmEvent::ConnectRequest { id, .. } | CmEvent::SidrRequest { id, .. } => {
                        assert!(!side.ids.contains(&id), "{}: a new request names id {id:#x}, which the consumer holds", name(i));
                        side.hold(id);
                    }
                    ev => {
                        let id = event_id(&ev);
                        assert!(!side.gone.contains(&id), "{}: event {ev:?} for an id the consumer let go of or that ended", name(i));
                        assert!(side.ids.contains(&id), "{}: event {ev:?} for an id the consumer never held", name(i));
                        if matches!(
                            ev,
                            CmEvent::Rejected { .. } | CmEvent::TimedOut { .. } | CmEvent::TimewaitExit { .. } | CmEvent::SidrReply { .. }
                        ) {
                            side.release(id);
                        }
                    }
                }
            }
            let live = self.sides[i].cm.live_ids();
            assert!(live <= MAX_IDS, "{} holds {live} ids, more than its bound {MAX_IDS}", name(i));
        }
    }

    /// `connect` from `from`: `c0` service `[the peer's, the peer's, its
    /// own (to itself, so through the peer's link nowhere), unknown][c0 &
    /// 3]`, bit 2 to a stranger's GID, bit 3 UC, bit 4 an invalid field
    /// (`c1` picks which), bits 5-6 private data length `[0, 36, 92, 93]`;
    /// `c2` QPN low byte (QPN `0x100 + c2`).
    fn connect(&mut self, from: usize, r: &mut Reader) {
        let (c0, c1, c2) = (r.u8(), r.u8(), r.u8());
        let port = [PORTS[1 - from], PORTS[1 - from], PORTS[from], UNKNOWN_PORT][usize::from(c0 & 3)];
        let remote_gid = if c0 & 4 != 0 { STRANGER } else { GIDS[1 - from] };
        let mut p = ConnectParams {
            starting_psn: u32::from(c1) << 8,
            transport: c0 >> 3 & 1,
            responder_resources: c1 & 3,
            initiator_depth: c1 >> 2 & 3,
            path_mtu: 1 + (c1 >> 4) % 5,
            srq: c1 & 0x80 != 0,
            private_data: vec![0xab; [0, 36, 92, 93][usize::from(c0 >> 5 & 3)]],
            ..ConnectParams::rc(service(port), GIDS[from], remote_gid, 0x100 + u32::from(c2))
        };
        if c0 & 0x10 != 0 {
            match c1 % 5 {
                0 => p.qpn = 1,
                1 => p.starting_psn = 1 << 24,
                2 => p.transport = 2,
                3 => p.path_mtu = 0,
                _ => p.flow_label = 1 << 20,
            }
        }
        let r = self.sides[from].cm.connect(self.now, &p);
        trace!("  {} connect to port {port}: {r:?}", name(from));
        if let Ok(id) = r {
            self.sides[from].hold(id);
        }
    }

    /// A consumer call on `side`: `k0` call `k0 % 8` `[accept, reject,
    /// ready_to_use, establish, disconnect, destroy, sidr_reply,
    /// listen/unlisten]`, on the id `k1` picks among the side's ([`choose_id`]); `k2` the
    /// call's private data length `k2 % 8 * 32` (up to 224, past most
    /// limits) and fields.
    fn consumer(&mut self, i: usize, r: &mut Reader) {
        let (k0, k1) = (r.u8(), r.u8());
        let id = choose_id(&self.sides[i].ids, k1, r);
        let k2 = r.u8();
        let private = vec![0xcd; usize::from(k2 % 8) * 32];
        let now = self.now;
        let s = &mut self.sides[i];
        let (what, res) = match k0 % 8 {
            0 => {
                let p = AcceptParams {
                    qpn: if k2 & 0x80 != 0 { 1 } else { 0x200 + u32::from(k2) },
                    starting_psn: u32::from(k2) << 4,
                    responder_resources: k2 & 3,
                    initiator_depth: k2 >> 2 & 3,
                    target_ack_delay: 15,
                    rnr_retry_count: 7,
                    srq: k2 & 0x40 != 0,
                    private_data: private,
                };
                ("accept", s.cm.accept(now, id, &p))
            }
            1 => {
                let r = s.cm.reject(now, id, &private);
                if r.is_ok() {
                    s.release(id);
                }
                ("reject", r)
            }
            2 => ("ready_to_use", s.cm.ready_to_use(now, id, &private)),
            3 => ("establish", s.cm.establish(id)),
            4 => ("disconnect", s.cm.disconnect(now, id, &private)),
            5 => {
                let r = s.cm.destroy(now, id);
                if r.is_ok() {
                    s.release(id);
                }
                ("destroy", r)
            }
            6 => ("sidr_reply", s.cm.sidr_reply(now, id, k2 & 3, 0x300 + u32::from(k2), 0x0123_4567, &private)),
            _ => {
                let sid = service(PORTS[i]);
                s.listening = !s.listening;
                let r = if s.listening { s.cm.listen(sid, self.backlog) } else { s.cm.unlisten(sid) };
                (if s.listening { "listen" } else { "unlisten" }, r)
            }
        };
        trace!("  {} {what}({id:#x}): {res:?}", name(i));
    }

    /// A mutated copy of the next MAD queued for side `i` (nothing if none),
    /// delivered ahead of it: `u0` changes `1 + u0 % 4`, each `p v` (offset
    /// `p`, value `v`; for `p` in 248..=255 instead a comm ID field (data
    /// offset 0 or 4) set to an id of A or B, `v` picks which), bit 7 of
    /// `u0` from a stranger.
    fn mutate(&mut self, i: usize, r: &mut Reader) {
        let u0 = r.u8();
        let Some(&(src, dst, mut mad)) = self.sides[i].inbox.front() else { return };
        for _ in 0..1 + u0 % 4 {
            let (p, v) = (r.u8(), r.u8());
            if p >= 248 {
                let at = 24 + if p & 1 == 0 { 0 } else { 4 };
                let id = self.known_id(v, r);
                mad[at..at + 4].copy_from_slice(&id.to_be_bytes());
            } else {
                mad[usize::from(p)] = v;
            }
        }
        let src = if u0 & 0x80 != 0 { STRANGER } else { src };
        trace!("  mutated MAD to {}", name(i));
        self.deliver(i, src, dst, &mad);
    }

    /// One of the ids either agent uses (their consumers' lists), or any
    /// ([`choose_id`]).
    fn known_id(&self, v: u8, r: &mut Reader) -> u32 {
        let all: Vec<CmId> = self.sides.iter().flat_map(|s| s.ids.iter().copied()).collect();
        choose_id(&all, v, r)
    }

    /// A forged CM MAD with a valid header: `f0` bit 0 to B, bits 1-2 the
    /// source `[the peer, the peer, a stranger, the target itself]`,
    /// `f0 >> 3` the attribute `CM_ATTRS[.. % 9]`; `f1` the transaction ID
    /// `[an id's, u64 follows][f1 & 1]`; the two comm ID fields (data
    /// offsets 0 and 4) chosen as in [`World::known_id`] by `f2` and `f3`;
    /// then `f4` bytes of data from the input (as many as there are) from
    /// data offset 8, the rest zero.
    fn forge(&mut self, r: &mut Reader) {
        let f0 = r.u8();
        let to = usize::from(f0 & 1);
        let src = [GIDS[1 - to], GIDS[1 - to], STRANGER, GIDS[to]][usize::from(f0 >> 1 & 3)];
        let attr_id = CM_ATTRS[usize::from(f0 >> 3) % CM_ATTRS.len()];
        let f1 = r.u8();
        let tid = if f1 & 1 == 0 { u64::from(self.known_id(f1 >> 1, r)) } else { u64::from(r.u32()) << 32 | u64::from(r.u32()) };
        let mut mad = [0u8; MAD_LEN];
        mad[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
        mad[8..16].copy_from_slice(&tid.to_be_bytes());
        mad[16..18].copy_from_slice(&attr_id.to_be_bytes());
        let (f2, f3) = (r.u8(), r.u8());
        let local = self.known_id(f2, r);
        let remote = self.known_id(f3, r);
        mad[24..28].copy_from_slice(&local.to_be_bytes());
        mad[28..32].copy_from_slice(&remote.to_be_bytes());
        let n = usize::from(r.u8());
        for b in mad[32..].iter_mut().take(n) {
            *b = r.u8();
        }
        trace!("  forged attr {attr_id:#x} to {}", name(to));
        self.deliver(to, src, GIDS[to], &mad);
    }

    /// Advance the clock by `d` (or to the next timeout) and run the timers.
    fn advance(&mut self, b: u8) {
        let step = [Duration::from_micros(10), Duration::from_millis(1), Duration::from_millis(100), Duration::from_secs(1), Duration::from_secs(10)];
        self.now = match step.get(usize::from(b % 6)) {
            Some(&d) => self.now + d,
            None => self.next_timeout().map_or(self.now, |t| t.max(self.now)),
        };
        trace!("  time +{:?}", self.now.saturating_duration_since(T0));
        for s in &mut self.sides {
            s.cm.handle_timeout(self.now);
        }
    }

    fn next_timeout(&self) -> Option<Instant> {
        self.sides.iter().filter_map(|s| s.cm.next_timeout()).min()
    }

    fn step(&mut self, r: &mut Reader) {
        let o = r.u8();
        trace!("step {}", o % 16);
        match o % 16 {
            0 | 1 => self.connect(usize::from(o & 1), r),
            2..=7 => {
                let i = usize::from(o & 1);
                let keep = o % 16 >= 6;
                let drop = matches!(o % 16, 4 | 5);
                let next = if keep { self.sides[i].inbox.front().copied() } else { self.sides[i].inbox.pop_front() };
                if let (Some((src, dst, mad)), false) = (next, drop) {
                    self.deliver(i, src, dst, &mad);
                }
            }
            8 => {
                let b = r.u8();
                self.advance(b);
            }
            9 | 10 => self.consumer(usize::from(o % 16 - 9), r),
            11 | 12 => self.mutate(usize::from(o % 16 - 11), r),
            13 => self.forge(r),
            14 => {
                let b = r.u8();
                let from = usize::from(b & 1);
                let port = if b & 2 != 0 { UNKNOWN_PORT } else { PORTS[1 - from] };
                let private = vec![0x5a; [0, 16, 216, 217][usize::from(b >> 2 & 3)]];
                let res = self.sides[from].cm.sidr_request(self.now, service(port), GIDS[from], GIDS[1 - from], &private);
                trace!("  {} sidr_request to port {port}: {res:?}", name(from));
                if let Ok(id) = res {
                    self.sides[from].hold(id);
                }
            }
            _ => {
                let n = r.u8();
                let to = usize::from(n & 1);
                let src = if n & 2 != 0 { STRANGER } else { GIDS[1 - to] };
                let bytes: Vec<u8> = (0..usize::from(n >> 2) * 5).map(|_| r.u8()).collect();
                let res = self.sides[to].cm.handle_mad(self.now, src, GIDS[to], &bytes);
                trace!("  {} raw {} bytes: {res:?}", name(to), bytes.len());
            }
        }
        self.settle();
    }

    /// The consumer lets go of every id; time runs with nothing delivered
    /// until no timer is left; then every id must be gone and B must take
    /// a fresh REQ.
    fn wind_down(&mut self) {
        trace!("wind-down");
        for i in 0..2 {
            for id in std::mem::take(&mut self.sides[i].ids) {
                let res = self.sides[i].cm.destroy(self.now, id);
                trace!("  {} destroy({id:#x}): {res:?}", name(i));
                self.sides[i].gone.insert(id);
            }
        }
        let mut rounds = 0;
        loop {
            self.settle();
            for s in &mut self.sides {
                s.inbox.clear();
            }
            let Some(t) = self.next_timeout() else { break };
            rounds += 1;
            assert!(rounds <= WIND_DOWN_ROUNDS, "timers still running after {WIND_DOWN_ROUNDS} rounds of the wind-down");
            self.now = self.now.max(t);
            for s in &mut self.sides {
                s.cm.handle_timeout(self.now);
            }
        }
        for (i, s) in self.sides.iter().enumerate() {
            assert_eq!(s.cm.live_ids(), 0, "{}: ids left after the consumer destroyed every id and every timer ran out", name(i));
        }
        // B's backlog: every slot came back.
        let b = &mut self.sides[1];
        if !b.listening {
            b.cm.listen(service(PORTS[1]), self.backlog).expect("B listens again");
        }
        let p = ConnectParams::rc(service(PORTS[1]), GIDS[0], GIDS[1], 0x777);
        self.sides[0].cm.connect(self.now, &p).expect("A connects after the wind-down");
        let req = self.sides[0].cm.poll_transmit().expect("A sends its REQ");
        let res = self.sides[1].cm.handle_mad(self.now, req.src_gid, req.dst_gid, &req.mad);
        assert!(res.is_ok(), "B refused a fresh REQ after the wind-down: {res:?} ({:?})", self.sides[1].cm.stats());
        assert!(matches!(self.sides[1].cm.poll_event(), Some(CmEvent::ConnectRequest { .. })), "B took the fresh REQ without a ConnectRequest");
    }
}

fn name(i: usize) -> &'static str {
    ["A", "B"][i]
}

fn event_id(ev: &CmEvent) -> CmId {
    match *ev {
        CmEvent::ConnectRequest { id, .. }
        | CmEvent::ConnectReply { id, .. }
        | CmEvent::Established { id }
        | CmEvent::Rejected { id, .. }
        | CmEvent::TimedOut { id, .. }
        | CmEvent::Disconnected { id }
        | CmEvent::TimewaitExit { id }
        | CmEvent::SidrRequest { id, .. }
        | CmEvent::SidrReply { id, .. } => id,
    }
}

/// Run one input (see the module docs).
pub fn run(data: &[u8]) {
    let mut r = Reader::new(data);
    let mut w = World::new(&mut r);
    let mut steps = 0;
    while !r.done() && steps < MAX_STEPS {
        w.step(&mut r);
        steps += 1;
    }
    w.wind_down();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A's connect, B's accept, the REP, A's RTU, the RTU, then A's
    /// disconnect and the DREQ/DREP: the ordinary life of a connection
    /// through the harness's own steps.
    #[test]
    fn a_whole_connection_runs_through_the_harness() {
        let program = [
            0u8, 0, // setup
            0, 0, 0, 0, // A connects to B's service
            3, // B gets the REQ
            10, 0, 0, 0, // B accepts its first id
            2, // A gets the REP
            9, 2, 0, 0, // A sends the RTU
            3, // B gets the RTU
            9, 4, 0, 0, // A disconnects
            3, // B gets the DREQ
            10, 4, 0, 0, // B answers with the DREP
            2, // A gets the DREP
        ];
        let mut r = Reader::new(&program);
        let mut w = World::new(&mut r);
        while !r.done() {
            w.step(&mut r);
        }
        assert_eq!(w.sides[0].cm.state_name(w.sides[0].ids[0]), Some("TIMEWAIT"));
        assert_eq!(w.sides[1].cm.state_name(w.sides[1].ids[0]), Some("TIMEWAIT"));
        w.wind_down();
    }

    #[test]
    fn empty_and_short_inputs_run() {
        run(&[]);
        run(&[0xff]);
        run(&[0, 0, 13]);
    }
}
