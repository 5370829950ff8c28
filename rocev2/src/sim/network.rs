//! Endpoints joined by [`Link`]s, run as a discrete-event loop in virtual time.

use core::time::Duration;

use crate::sim::link::{Link, LinkConfig};
use crate::time::Instant;
use crate::wire::MacAddr;

/// A sans-IO endpoint the network drives: the transport [`Engine`] or a test double.
///
/// [`Engine`]: crate::transport::engine::Engine
pub trait Endpoint {
    /// A frame arrived at `now`.
    fn handle_frame(&mut self, now: Instant, frame: &[u8]);
    /// The next frame to send at `now`, written into `buf`; its length.
    fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize>;
    /// The timer armed for `next_timeout` is due (`now` is at or after it).
    fn handle_timeout(&mut self, now: Instant);
    /// When the endpoint next wants [`Endpoint::handle_timeout`].
    fn next_timeout(&self) -> Option<Instant>;
}

impl<E: Endpoint + ?Sized> Endpoint for Box<E> {
    fn handle_frame(&mut self, now: Instant, frame: &[u8]) {
        (**self).handle_frame(now, frame)
    }
    fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        (**self).poll_transmit(now, buf)
    }
    fn handle_timeout(&mut self, now: Instant) {
        (**self).handle_timeout(now)
    }
    fn next_timeout(&self) -> Option<Instant> {
        (**self).next_timeout()
    }
}

/// Index of a node in a [`Network`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub usize);

impl NodeId {
    /// The sender of frames put on the segment with [`Network::inject`]: a
    /// third host that is not one of the network's endpoints.
    pub const OUTSIDER: NodeId = NodeId(usize::MAX);
}

/// Index of a link in a [`Network`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LinkId(pub usize);

/// Why [`Network::run_until`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunOutcome {
    /// Nothing left to do: no frame on any link, no timer armed, nothing to send.
    Idle,
    /// The deadline came with work still pending (frames or timers after it).
    Deadline,
    /// Virtual time stopped advancing: more than [`Network::set_stall_limit`]
    /// consecutive steps at one instant (an endpoint that re-arms a timer in
    /// the past, or two endpoints ping-ponging forever over zero-delay links).
    Stalled,
    /// The caller's stop condition became true, or the
    /// [`Network::set_watch`] predicate asked to stop after a delivery.
    Stopped,
}

/// Where a [`Tap`] saw a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TapPoint {
    /// Sent by `from` onto the link towards `to` (before impairments).
    Sent,
    /// Delivered to `to` (after impairments).
    Delivered,
    /// Put on the segment by a third host ([`Network::inject`]) and handed
    /// to `to`; `from` is [`NodeId::OUTSIDER`].
    Injected,
}

/// A frame observer, for debugging and captures: `(point, now, from, to, frame)`.
pub type Tap = Box<dyn FnMut(TapPoint, Instant, NodeId, NodeId, &[u8])>;

/// A delivery watch: `(now, from, to, frame)` after `to` has handled a frame
/// that came over a link; returning true stops the run right there, before
/// the other events of the same instant (see [`Network::set_watch`]).
pub type Watch = Box<dyn FnMut(Instant, NodeId, NodeId, &[u8]) -> bool>;

/// Network-wide counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetworkStats {
    /// Event-loop steps taken.
    pub steps: u64,
    /// Frames the endpoints sent.
    pub frames_sent: u64,
    /// Frames handed to endpoints.
    pub frames_delivered: u64,
    /// Frames no link could carry (unknown destination MAC and several links out).
    pub unroutable: u64,
    /// `handle_timeout` calls.
    pub timeouts_fired: u64,
    /// Frames a third host put on the segment ([`Network::inject`]).
    pub injected: u64,
}

struct Node<E> {
    endpoint: E,
    mac: MacAddr,
    out_links: Vec<LinkId>,
}

struct LinkEntry {
    from: NodeId,
    to: NodeId,
    backpressure: bool,
    link: Link,
}

/// Largest frame an endpoint may emit (a 4096-byte-MTU RoCEv2 frame with a
/// VLAN tag and every header fits in far less).
pub const MAX_FRAME: usize = 9216;

/// Frames taken from one endpoint in one transmit pass, at most; the rest wait
/// for the next pass at the same instant (the stall limit catches an endpoint
/// that never stops).
const MAX_FRAMES_PER_PASS: usize = 65_536;

/// Endpoints joined by one-way links, driven in virtual time.
///
/// Each step of the loop: every endpoint is asked for frames
/// (`poll_transmit`) until it has none (or its backpressured port is busy),
/// each frame is routed by destination MAC to a link (a node with a single
/// link out uses it for every frame); then the clock jumps to the earliest
/// event — a frame arriving, an endpoint's timer, a busy port freeing up —
/// and every frame due is delivered (`handle_frame`) and every timer due
/// fired (`handle_timeout`).
pub struct Network<E> {
    now: Instant,
    nodes: Vec<Node<E>>,
    links: Vec<LinkEntry>,
    buf: Vec<u8>,
    stats: NetworkStats,
    stall_limit: u64,
    same_instant_steps: u64,
    tap: Option<Tap>,
    watch: Option<Watch>,
}

impl<E> core::fmt::Debug for Network<E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Network")
            .field("now", &self.now)
            .field("nodes", &self.nodes.len())
            .field("links", &self.links.iter().map(|l| &l.link).collect::<Vec<_>>())
            .field("stats", &self.stats)
            .finish()
    }
}

impl<E: Endpoint> Default for Network<E> {
    fn default() -> Self {
        Network::new(Instant::ZERO)
    }
}

impl<E: Endpoint> Network<E> {
    /// An empty network whose clock starts at `start`.
    pub fn new(start: Instant) -> Network<E> {
        Network {
            now: start,
            nodes: Vec::new(),
            links: Vec::new(),
            buf: vec![0u8; MAX_FRAME],
            stats: NetworkStats::default(),
            stall_limit: 10_000_000,
            same_instant_steps: 0,
            tap: None,
            watch: None,
        }
    }

    /// Add an endpoint reachable at `mac`.
    pub fn add_node(&mut self, endpoint: E, mac: MacAddr) -> NodeId {
        self.nodes.push(Node { endpoint, mac, out_links: Vec::new() });
        NodeId(self.nodes.len() - 1)
    }

    /// A one-way link from `from` to `to`, its randomness seeded with `seed`.
    ///
    /// With `backpressure`, the link is `from`'s own port: `from` is not asked
    /// for another frame while the link is still serializing one, so the
    /// port never tail-drops its own traffic. Without it, frames are pushed
    /// as fast as `from` produces them and the queue tail-drops (a bottleneck
    /// further along the path). Only matters when the link has a rate.
    pub fn connect(&mut self, from: NodeId, to: NodeId, config: LinkConfig, seed: u64, backpressure: bool) -> LinkId {
        assert!(from.0 < self.nodes.len() && to.0 < self.nodes.len(), "unknown node");
        let id = LinkId(self.links.len());
        self.links.push(LinkEntry { from, to, backpressure, link: Link::new(config, seed) });
        self.nodes[from.0].out_links.push(id);
        id
    }

    /// Links both ways between `a` and `b` with the same configuration and
    /// seeds derived from `seed`; returns `(a→b, b→a)`.
    pub fn connect_pair(&mut self, a: NodeId, b: NodeId, config: LinkConfig, seed: u64) -> (LinkId, LinkId) {
        let ab = self.connect(a, b, config, split_seed(seed, 0), false);
        let ba = self.connect(b, a, config, split_seed(seed, 1), false);
        (ab, ba)
    }

    /// The current virtual time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Counters.
    pub fn stats(&self) -> &NetworkStats {
        &self.stats
    }

    /// The endpoint of `node`.
    pub fn node(&self, node: NodeId) -> &E {
        &self.nodes[node.0].endpoint
    }

    /// The endpoint of `node`, mutably (to post work, poll completions, ...).
    pub fn node_mut(&mut self, node: NodeId) -> &mut E {
        &mut self.nodes[node.0].endpoint
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The link `id`.
    pub fn link(&self, id: LinkId) -> &Link {
        &self.links[id.0].link
    }

    /// The link `id`, mutably (to change impairments or take it down).
    pub fn link_mut(&mut self, id: LinkId) -> &mut Link {
        &mut self.links[id.0].link
    }

    /// The links, with their endpoints.
    pub fn links(&self) -> impl Iterator<Item = (LinkId, NodeId, NodeId, &Link)> {
        self.links.iter().enumerate().map(|(i, l)| (LinkId(i), l.from, l.to, &l.link))
    }

    /// Consecutive steps allowed at one instant before [`RunOutcome::Stalled`].
    pub fn set_stall_limit(&mut self, steps: u64) {
        self.stall_limit = steps.max(1);
    }

    /// Observe every frame sent and delivered.
    pub fn set_tap(&mut self, tap: Option<Tap>) {
        self.tap = tap;
    }

    /// Watch every frame delivered over a link: `watch` is called after the
    /// receiver handled it, and when it returns true the run stops at once
    /// ([`RunOutcome::Stopped`]), the rest of that instant's events still
    /// pending. A third host sniffing the segment uses it to act right after
    /// a frame it is interested in (e.g. to replay a NAK). [`Network::advance_to`]
    /// does not stop for it.
    pub fn set_watch(&mut self, watch: Option<Watch>) {
        self.watch = watch;
    }

    /// A third host on the segment puts `frame` on the wire to `to` at the
    /// current instant: `to` handles it now, ahead of anything else due
    /// (no link, no impairment, no delay). The tap sees it as
    /// [`TapPoint::Injected`] from [`NodeId::OUTSIDER`].
    pub fn inject(&mut self, to: NodeId, frame: &[u8]) {
        let now = self.now;
        if let Some(tap) = self.tap.as_mut() {
            tap(TapPoint::Injected, now, NodeId::OUTSIDER, to, frame);
        }
        self.stats.injected += 1;
        self.nodes[to.0].endpoint.handle_frame(now, frame);
    }

    /// Give every endpoint the chance to send at the current instant.
    pub fn transmit(&mut self) {
        for n in 0..self.nodes.len() {
            self.transmit_node(n);
        }
    }

    fn port_busy(&self, n: usize) -> bool {
        self.nodes[n].out_links.iter().any(|l| {
            let e = &self.links[l.0];
            e.backpressure && e.link.busy_until() > self.now
        })
    }

    fn transmit_node(&mut self, n: usize) {
        for _ in 0..MAX_FRAMES_PER_PASS {
            if self.port_busy(n) {
                return;
            }
            let now = self.now;
            let Some(len) = self.nodes[n].endpoint.poll_transmit(now, &mut self.buf) else {
                return;
            };
            let len = len.min(self.buf.len());
            self.stats.frames_sent += 1;
            let node = &self.nodes[n];
            let dst: MacAddr = if len >= 6 { self.buf[..6].try_into().unwrap_or([0; 6]) } else { [0; 6] };
            let route = if node.out_links.len() == 1 {
                Some(node.out_links[0])
            } else {
                node.out_links.iter().copied().find(|l| self.nodes[self.links[l.0].to.0].mac == dst)
            };
            let Some(lid) = route else {
                self.stats.unroutable += 1;
                continue;
            };
            let entry = &mut self.links[lid.0];
            if let Some(tap) = self.tap.as_mut() {
                tap(TapPoint::Sent, now, entry.from, entry.to, &self.buf[..len]);
            }
            entry.link.send(now, &self.buf[..len]);
        }
    }

    /// The earliest pending event: a frame arrival, an endpoint timer, or a
    /// backpressured port becoming free.
    pub fn next_event(&self) -> Option<Instant> {
        let arrivals = self.links.iter().filter_map(|l| l.link.next_arrival());
        let timers = self.nodes.iter().filter_map(|n| n.endpoint.next_timeout());
        let ports = self.links.iter().filter(|l| l.backpressure && l.link.busy_until() > self.now).map(|l| l.link.busy_until());
        arrivals.chain(timers).chain(ports).min()
    }

    /// One step: transmit, then advance to the next event (not past
    /// `deadline`) and process everything due then.
    pub fn step(&mut self, deadline: Instant) -> Option<RunOutcome> {
        self.stats.steps += 1;
        self.transmit();
        let Some(t) = self.next_event() else {
            return Some(RunOutcome::Idle);
        };
        if t > deadline {
            self.now = self.now.max(deadline);
            return Some(RunOutcome::Deadline);
        }
        if t > self.now {
            self.now = t;
            self.same_instant_steps = 0;
        } else {
            self.same_instant_steps += 1;
            if self.same_instant_steps > self.stall_limit {
                return Some(RunOutcome::Stalled);
            }
        }
        let now = self.now;
        for l in 0..self.links.len() {
            while let Some(frame) = self.links[l].link.pop_due(now) {
                let to = self.links[l].to;
                let from = self.links[l].from;
                if let Some(tap) = self.tap.as_mut() {
                    tap(TapPoint::Delivered, now, from, to, &frame);
                }
                self.stats.frames_delivered += 1;
                self.nodes[to.0].endpoint.handle_frame(now, &frame);
                let stop = self.watch.as_mut().is_some_and(|w| w(now, from, to, &frame));
                self.links[l].link.recycle(frame);
                if stop {
                    // The rest of this instant (frames, timers) is handled
                    // by the next step.
                    return Some(RunOutcome::Stopped);
                }
            }
        }
        for node in &mut self.nodes {
            if node.endpoint.next_timeout().is_some_and(|t| t <= now) {
                self.stats.timeouts_fired += 1;
                node.endpoint.handle_timeout(now);
            }
        }
        None
    }

    /// Run until idle, until the next event would be after `deadline` (the
    /// clock is then left at `deadline`), or until stalled.
    pub fn run_until(&mut self, deadline: Instant) -> RunOutcome {
        self.run_until_or(deadline, |_| false)
    }

    /// Like [`Network::run_until`], also stopping (with
    /// [`RunOutcome::Stopped`]) as soon as `stop` returns true; `stop` is
    /// checked after every step.
    pub fn run_until_or(&mut self, deadline: Instant, mut stop: impl FnMut(&mut Self) -> bool) -> RunOutcome {
        loop {
            if let Some(outcome) = self.step(deadline) {
                return outcome;
            }
            if stop(self) {
                return RunOutcome::Stopped;
            }
        }
    }

    /// Run for `d` of virtual time from now (see [`Network::run_until`]).
    pub fn run_for(&mut self, d: Duration) -> RunOutcome {
        let deadline = self.now + d;
        self.run_until(deadline)
    }

    /// Process every event up to `t`, then set the clock to `t` (even if the
    /// network went idle before it). Returns [`RunOutcome::Stalled`] if it
    /// stalled on the way, else [`RunOutcome::Deadline`].
    pub fn advance_to(&mut self, t: Instant) -> RunOutcome {
        let mut outcome = self.run_until(t);
        while outcome == RunOutcome::Stopped {
            outcome = self.run_until(t);
        }
        match outcome {
            RunOutcome::Stalled => RunOutcome::Stalled,
            _ => {
                if t > self.now {
                    self.now = t;
                    self.same_instant_steps = 0;
                }
                RunOutcome::Deadline
            }
        }
    }
}

/// Derive independent-looking seeds from one (splitmix64 of `seed + index`).
pub fn split_seed(seed: u64, index: u64) -> u64 {
    let mut z = seed.wrapping_add(index.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// Sends `count` frames `[dst mac | seq u32 | kind]`; echoes every ping
    /// back as a pong; records what it got and when.
    struct Pinger {
        mac: MacAddr,
        peer: MacAddr,
        to_send: VecDeque<u32>,
        out: VecDeque<Vec<u8>>,
        got: Vec<(Instant, u32, u8)>,
        timer: Option<Instant>,
        fired: Vec<Instant>,
    }

    impl Pinger {
        fn new(mac: u8, peer: u8, count: u32) -> Pinger {
            Pinger {
                mac: [2, 0, 0, 0, 0, mac],
                peer: [2, 0, 0, 0, 0, peer],
                to_send: (0..count).collect(),
                out: VecDeque::new(),
                got: Vec::new(),
                timer: None,
                fired: Vec::new(),
            }
        }
        fn frame(&self, seq: u32, kind: u8, len: usize) -> Vec<u8> {
            let mut f = vec![0u8; len];
            f[..6].copy_from_slice(&self.peer);
            f[6..12].copy_from_slice(&self.mac);
            f[14..18].copy_from_slice(&seq.to_be_bytes());
            f[18] = kind;
            f
        }
    }

    impl Endpoint for Pinger {
        fn handle_frame(&mut self, now: Instant, frame: &[u8]) {
            let seq = u32::from_be_bytes(frame[14..18].try_into().unwrap());
            self.got.push((now, seq, frame[18]));
            if frame[18] == 0 {
                let mut pong = self.frame(seq, 1, 64);
                pong[..6].copy_from_slice(&frame[6..12]);
                self.out.push_back(pong);
            }
        }
        fn poll_transmit(&mut self, _now: Instant, buf: &mut [u8]) -> Option<usize> {
            let f = match self.out.pop_front() {
                Some(f) => f,
                None => {
                    let seq = self.to_send.pop_front()?;
                    self.frame(seq, 0, 1000)
                }
            };
            buf[..f.len()].copy_from_slice(&f);
            Some(f.len())
        }
        fn handle_timeout(&mut self, now: Instant) {
            self.fired.push(now);
            self.timer = None;
        }
        fn next_timeout(&self) -> Option<Instant> {
            self.timer
        }
    }

    fn us(n: u64) -> Instant {
        Instant::from_nanos(n * 1_000)
    }

    #[test]
    fn ping_pong_over_an_ideal_pair_goes_idle() {
        let mut net = Network::new(Instant::ZERO);
        let a = net.add_node(Pinger::new(1, 2, 3), [2, 0, 0, 0, 0, 1]);
        let b = net.add_node(Pinger::new(2, 1, 0), [2, 0, 0, 0, 0, 2]);
        net.connect_pair(a, b, LinkConfig::ideal(Duration::from_micros(5)), 1);
        assert_eq!(net.run_until(us(1_000_000)), RunOutcome::Idle);
        let bg: Vec<_> = net.node(b).got.clone();
        assert_eq!(bg, vec![(us(5), 0, 0), (us(5), 1, 0), (us(5), 2, 0)]);
        let ag: Vec<_> = net.node(a).got.clone();
        assert_eq!(ag, vec![(us(10), 0, 1), (us(10), 1, 1), (us(10), 2, 1)]);
        assert_eq!(net.now(), us(10));
        assert_eq!(net.stats().frames_sent, 6);
        assert_eq!(net.stats().frames_delivered, 6);
    }

    #[test]
    fn timers_fire_at_their_instant_and_deadline_stops_the_clock() {
        let mut net = Network::new(Instant::ZERO);
        let a = net.add_node(Pinger::new(1, 2, 0), [2, 0, 0, 0, 0, 1]);
        net.node_mut(a).timer = Some(us(70));
        assert_eq!(net.run_until(us(50)), RunOutcome::Deadline);
        assert_eq!(net.now(), us(50));
        assert!(net.node(a).fired.is_empty());
        assert_eq!(net.run_until(us(100)), RunOutcome::Idle);
        assert_eq!(net.node(a).fired, vec![us(70)]);
        assert_eq!(net.advance_to(us(500)), RunOutcome::Deadline);
        assert_eq!(net.now(), us(500));
    }

    #[test]
    fn a_timer_stuck_in_the_past_is_reported_as_a_stall() {
        struct Stuck;
        impl Endpoint for Stuck {
            fn handle_frame(&mut self, _: Instant, _: &[u8]) {}
            fn poll_transmit(&mut self, _: Instant, _: &mut [u8]) -> Option<usize> {
                None
            }
            fn handle_timeout(&mut self, _: Instant) {}
            fn next_timeout(&self) -> Option<Instant> {
                Some(Instant::from_nanos(3))
            }
        }
        let mut net = Network::new(Instant::ZERO);
        net.add_node(Stuck, [0; 6]);
        net.set_stall_limit(100);
        assert_eq!(net.run_until(us(1)), RunOutcome::Stalled);
    }

    #[test]
    fn backpressured_port_paces_the_sender_without_drops() {
        // 1000-byte frames at 1 Gb/s: one every 8 µs, none dropped although the
        // queue holds only one frame.
        let cfg = LinkConfig { delay: Duration::from_micros(1), rate_bps: Some(1_000_000_000), queue_bytes: 1000, ..LinkConfig::default() };
        let mut net = Network::new(Instant::ZERO);
        let a = net.add_node(Pinger::new(1, 2, 20), [2, 0, 0, 0, 0, 1]);
        let b = net.add_node(Pinger::new(2, 1, 0), [2, 0, 0, 0, 0, 2]);
        let ab = net.connect(a, b, cfg, 1, true);
        net.connect(b, a, LinkConfig::ideal(Duration::from_micros(1)), 2, true);
        assert_eq!(net.run_until(us(10_000)), RunOutcome::Idle);
        assert_eq!(net.link(ab).stats().tail_dropped, 0);
        let times: Vec<Instant> = net.node(b).got.iter().map(|g| g.0).collect();
        let want: Vec<Instant> = (1..=20).map(|k| us(8 * k + 1)).collect();
        assert_eq!(times, want);
    }

    #[test]
    fn unpaced_sender_overflows_a_bottleneck_queue() {
        let cfg = LinkConfig { delay: Duration::from_micros(1), rate_bps: Some(1_000_000_000), queue_bytes: 4000, ..LinkConfig::default() };
        let mut net = Network::new(Instant::ZERO);
        let a = net.add_node(Pinger::new(1, 2, 20), [2, 0, 0, 0, 0, 1]);
        let b = net.add_node(Pinger::new(2, 1, 0), [2, 0, 0, 0, 0, 2]);
        let (ab, _) = net.connect_pair(a, b, cfg, 9);
        assert_eq!(net.run_until(us(10_000)), RunOutcome::Idle);
        assert_eq!(net.link(ab).stats().tail_dropped, 16);
        assert_eq!(net.node(b).got.len(), 4);
    }

    #[test]
    fn frames_are_routed_by_destination_mac() {
        let mut net = Network::new(Instant::ZERO);
        let a = net.add_node(Pinger::new(1, 3, 2), [2, 0, 0, 0, 0, 1]);
        let b = net.add_node(Pinger::new(2, 1, 0), [2, 0, 0, 0, 0, 2]);
        let c = net.add_node(Pinger::new(3, 1, 0), [2, 0, 0, 0, 0, 3]);
        let ideal = LinkConfig::ideal(Duration::from_micros(1));
        net.connect_pair(a, b, ideal, 1);
        net.connect_pair(a, c, ideal, 2);
        assert_eq!(net.run_until(us(1_000)), RunOutcome::Idle);
        assert!(net.node(b).got.is_empty());
        assert_eq!(net.node(c).got.len(), 2);
        assert_eq!(net.node(a).got.len(), 2);
        // A frame to an unknown MAC from a node with two links is unroutable.
        net.node_mut(a).peer = [9; 6];
        net.node_mut(a).to_send.push_back(7);
        net.run_until(us(2_000));
        assert_eq!(net.stats().unroutable, 1);
    }

    #[test]
    fn injected_frames_reach_the_endpoint_at_once() {
        use std::cell::RefCell;
        use std::rc::Rc;
        let log = Rc::new(RefCell::new(Vec::new()));
        let l2 = log.clone();
        let mut net = Network::new(Instant::ZERO);
        let a = net.add_node(Pinger::new(1, 2, 0), [2, 0, 0, 0, 0, 1]);
        let b = net.add_node(Pinger::new(2, 1, 0), [2, 0, 0, 0, 0, 2]);
        net.connect_pair(a, b, LinkConfig::ideal(Duration::from_micros(3)), 1);
        net.set_tap(Some(Box::new(move |p, t, from, to, _f: &[u8]| l2.borrow_mut().push((p, t, from, to)))));
        assert_eq!(net.advance_to(us(7)), RunOutcome::Deadline);
        // A ping from a third host: handled at once; b's pong goes back over the b->a link.
        let ping = net.node(a).frame(42, 0, 64);
        net.inject(b, &ping);
        assert_eq!(net.node(b).got, vec![(us(7), 42, 0)]);
        assert_eq!(net.stats().injected, 1);
        assert_eq!(net.run_until(us(100)), RunOutcome::Idle);
        assert_eq!(net.node(a).got, vec![(us(10), 42, 1)]);
        assert_eq!(log.borrow()[0], (TapPoint::Injected, us(7), NodeId::OUTSIDER, b));
        assert_eq!(net.stats().frames_delivered, 1, "injected frames are not link deliveries");
    }

    #[test]
    fn watch_stops_right_after_the_frame_it_asked_for() {
        let mut net = Network::new(Instant::ZERO);
        let a = net.add_node(Pinger::new(1, 2, 3), [2, 0, 0, 0, 0, 1]);
        let b = net.add_node(Pinger::new(2, 1, 0), [2, 0, 0, 0, 0, 2]);
        net.connect_pair(a, b, LinkConfig::ideal(Duration::from_micros(5)), 1);
        // Stop after the second ping reaches b: the third, due at the same
        // instant, is still pending.
        net.set_watch(Some(Box::new(|_, _, _, f: &[u8]| f[17] == 1 && f[18] == 0)));
        assert_eq!(net.run_until(us(1_000)), RunOutcome::Stopped);
        assert_eq!(net.now(), us(5));
        assert_eq!(net.node(b).got, vec![(us(5), 0, 0), (us(5), 1, 0)]);
        // Going on delivers the rest at the same instant.
        assert_eq!(net.run_until(us(1_000)), RunOutcome::Idle);
        assert_eq!(net.node(b).got.len(), 3);
        assert_eq!(net.node(b).got[2], (us(5), 2, 0));
        assert_eq!(net.node(a).got.len(), 3);
        // advance_to does not stop for the watch.
        net.set_watch(Some(Box::new(|_, _, _, _: &[u8]| true)));
        net.node_mut(a).to_send.extend([7, 8]);
        assert_eq!(net.advance_to(us(2_000)), RunOutcome::Deadline);
        assert_eq!(net.node(a).got.len(), 5);
    }

    #[test]
    fn tap_sees_sent_and_delivered_frames() {
        use std::cell::RefCell;
        use std::rc::Rc;
        let log = Rc::new(RefCell::new(Vec::new()));
        let l2 = log.clone();
        let mut net = Network::new(Instant::ZERO);
        let a = net.add_node(Pinger::new(1, 2, 1), [2, 0, 0, 0, 0, 1]);
        let b = net.add_node(Pinger::new(2, 1, 0), [2, 0, 0, 0, 0, 2]);
        net.connect_pair(a, b, LinkConfig::ideal(Duration::from_micros(2)), 1);
        net.set_tap(Some(Box::new(move |p, t, from, to, f: &[u8]| l2.borrow_mut().push((p, t, from, to, f.len())))));
        net.run_until(us(100));
        let log = log.borrow();
        assert_eq!(
            *log,
            vec![
                (TapPoint::Sent, us(0), a, b, 1000),
                (TapPoint::Delivered, us(2), a, b, 1000),
                (TapPoint::Sent, us(2), b, a, 64),
                (TapPoint::Delivered, us(4), b, a, 64),
            ]
        );
    }
}
