//! A one-way virtual link with seeded impairments.
//!
//! A frame offered to a [`Link`] at time `now` goes through, in order:
//! 1. the blackout switch ([`Link::set_down`]): a down link drops everything;
//! 2. the serializer, when the link has a rate ([`LinkConfig::rate_bps`]): a
//!    FIFO of at most [`LinkConfig::queue_bytes`] bytes drained at the link
//!    rate; a frame that does not fit behind the backlog is tail-dropped;
//! 3. the wire ([`LinkConfig::faults`]): loss, corruption (one random bit flipped after the Ethernet
//!    header, where the IPv4 checksum or the ICRC must catch it), ECN CE
//!    marking, the fixed propagation delay, a random extra delay for reordered
//!    frames, and duplication.
//!
//! Every random decision comes from the link's own ChaCha8 generator, seeded
//! at construction, so a run is a pure function of the seeds and of the order
//! of the calls.

use core::cmp::Ordering;
use core::time::Duration;
use std::collections::BinaryHeap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::impair::Faults;
use crate::time::Instant;
use crate::wire::{FrameView, ETHERNET_LEN};

/// Impairments and shape of one direction of a link.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkConfig {
    /// Fixed propagation delay of every frame.
    pub delay: Duration,
    /// Fault probabilities per frame (loss, duplication, reordering,
    /// corruption, ECN marking), in the vocabulary the in-memory hub and the
    /// XDP program share. Corruption flips one random bit after the Ethernet
    /// header; ECN marking marks only a frame that is valid RoCEv2
    /// ([`FrameView::mark_ce`]), so one a receiver would drop anyway (e.g.
    /// corrupted just before) is left alone; a reordered frame gets a random
    /// extra delay up to [`LinkConfig::reorder_max`].
    pub faults: Faults,
    /// Largest extra delay of a reordered frame: uniform in
    /// `1 ns ..= reorder_max`, so frames sent after it may overtake it. Zero:
    /// no frame is reordered.
    pub reorder_max: Duration,
    /// Serialization rate in bits per second; `None`: infinitely fast (no
    /// serializer, no queue).
    pub rate_bps: Option<u64>,
    /// Bytes the serializer's queue holds (the frame being serialized
    /// included); a frame that does not fit is tail-dropped. Only with a rate.
    pub queue_bytes: usize,
    /// Bytes added to every frame for the serialization time (preamble,
    /// inter-frame gap and FCS: 24 on Ethernet). Only with a rate.
    pub frame_overhead_bytes: u32,
}

impl Default for LinkConfig {
    /// A perfect link: 1 µs delay, no impairments, no rate limit.
    fn default() -> Self {
        LinkConfig {
            delay: Duration::from_micros(1),
            faults: Faults::NONE,
            reorder_max: Duration::ZERO,
            rate_bps: None,
            queue_bytes: 256 * 1024,
            frame_overhead_bytes: 0,
        }
    }
}

impl LinkConfig {
    /// A perfect link with the given propagation delay.
    pub fn ideal(delay: Duration) -> LinkConfig {
        LinkConfig { delay, ..LinkConfig::default() }
    }

    /// This link with `faults`.
    pub fn with_faults(self, faults: Faults) -> LinkConfig {
        LinkConfig { faults, ..self }
    }

    /// Time the serializer needs for a frame of `len` bytes (zero without a rate).
    pub fn serialization_time(&self, len: usize) -> Duration {
        match self.rate_bps {
            None | Some(0) => Duration::ZERO,
            Some(rate) => {
                let bits = (len as u128 + u128::from(self.frame_overhead_bytes)) * 8;
                let ns = (bits * 1_000_000_000).div_ceil(u128::from(rate));
                Duration::from_nanos(ns.min(u128::from(u64::MAX)) as u64)
            }
        }
    }
}

/// What a link did to the frames offered to it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Frames offered by the sender.
    pub offered: u64,
    /// Bytes offered by the sender.
    pub offered_bytes: u64,
    /// Frames handed to the receiver (duplicates included).
    pub delivered: u64,
    /// Frames dropped because the link was down.
    pub blackout_dropped: u64,
    /// Frames tail-dropped by the serializer's queue.
    pub tail_dropped: u64,
    /// Frames lost on the wire.
    pub lost: u64,
    /// Frames with a flipped bit.
    pub corrupted: u64,
    /// Frames marked ECN CE.
    pub ecn_marked: u64,
    /// Frames that got a random extra delay.
    pub reordered: u64,
    /// Extra copies created.
    pub duplicated: u64,
}

/// A frame on the wire, due at `at`; `seq` keeps equal times in send order.
struct InFlight {
    at: Instant,
    seq: u64,
    frame: Vec<u8>,
}

impl PartialEq for InFlight {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at && self.seq == other.seq
    }
}

impl Eq for InFlight {}

impl PartialOrd for InFlight {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for InFlight {
    /// Reversed, so that `BinaryHeap` (a max-heap) pops the earliest frame.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// A one-way virtual link (see the module documentation).
pub struct Link {
    config: LinkConfig,
    rng: ChaCha8Rng,
    down: bool,
    /// When the serializer finishes the last frame queued.
    busy_until: Instant,
    in_flight: BinaryHeap<InFlight>,
    seq: u64,
    pool: Vec<Vec<u8>>,
    stats: LinkStats,
}

impl core::fmt::Debug for Link {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Link")
            .field("config", &self.config)
            .field("down", &self.down)
            .field("busy_until", &self.busy_until)
            .field("in_flight", &self.in_flight.len())
            .field("stats", &self.stats)
            .finish()
    }
}

impl Link {
    /// A link with `config`, its random decisions drawn from ChaCha8 seeded with `seed`.
    pub fn new(config: LinkConfig, seed: u64) -> Link {
        Link {
            config,
            rng: ChaCha8Rng::seed_from_u64(seed),
            down: false,
            busy_until: Instant::ZERO,
            in_flight: BinaryHeap::new(),
            seq: 0,
            pool: Vec::new(),
            stats: LinkStats::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &LinkConfig {
        &self.config
    }

    /// Change the configuration; frames already on the wire keep their fate.
    pub fn set_config(&mut self, config: LinkConfig) {
        self.config = config;
    }

    /// Take the link down (every frame offered is dropped) or bring it back up.
    /// Frames already on the wire are still delivered.
    pub fn set_down(&mut self, down: bool) {
        self.down = down;
    }

    /// Whether the link is down.
    pub fn is_down(&self) -> bool {
        self.down
    }

    /// Counters.
    pub fn stats(&self) -> &LinkStats {
        &self.stats
    }

    /// When the serializer is free again (at or before `now`: free now).
    pub fn busy_until(&self) -> Instant {
        self.busy_until
    }

    /// Bytes waiting in the serializer's queue at `now` (the frame being
    /// serialized counted in part). Zero without a rate.
    pub fn backlog_bytes(&self, now: Instant) -> u64 {
        match self.config.rate_bps {
            None | Some(0) => 0,
            Some(rate) => {
                let ns = self.busy_until.saturating_duration_since(now).as_nanos();
                (ns * u128::from(rate) / 8_000_000_000).min(u128::from(u64::MAX)) as u64
            }
        }
    }

    /// Frames on the wire, not yet taken by the receiver.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// When the earliest frame on the wire arrives.
    pub fn next_arrival(&self) -> Option<Instant> {
        self.in_flight.peek().map(|f| f.at)
    }

    /// Offer `frame` to the link at `now`.
    pub fn send(&mut self, now: Instant, frame: &[u8]) {
        self.stats.offered += 1;
        self.stats.offered_bytes += frame.len() as u64;
        if self.down {
            self.stats.blackout_dropped += 1;
            return;
        }
        // The serializer: a FIFO drained at the link rate, tail drop when full.
        let departs = match self.config.rate_bps {
            None | Some(0) => now,
            Some(_) => {
                let backlog = self.backlog_bytes(now);
                if backlog + frame.len() as u64 > self.config.queue_bytes as u64 {
                    self.stats.tail_dropped += 1;
                    return;
                }
                let start = self.busy_until.max(now);
                self.busy_until = start + self.config.serialization_time(frame.len());
                self.busy_until
            }
        };
        // The wire. Each decision draws from the generator whether or not its
        // probability is zero, so that turning one impairment on does not
        // shift the others' random streams.
        let lose = self.chance(self.config.faults.loss);
        let corrupt = self.chance(self.config.faults.corrupt);
        let mark = self.chance(self.config.faults.ecn_mark);
        let reorder = self.chance(self.config.faults.reorder);
        let duplicate = self.chance(self.config.faults.duplicate);
        let bit_pick: u64 = self.rng.gen();
        let extra_pick: u64 = self.rng.gen();
        if lose {
            self.stats.lost += 1;
            return;
        }
        let mut buf = self.pool.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(frame);
        if corrupt {
            let (start, span) = if buf.len() > ETHERNET_LEN { (ETHERNET_LEN, buf.len() - ETHERNET_LEN) } else { (0, buf.len()) };
            if span > 0 {
                let bit = (bit_pick % (span as u64 * 8)) as usize;
                buf[start + bit / 8] ^= 1 << (bit % 8);
                self.stats.corrupted += 1;
            }
        }
        if mark && FrameView::new_checked(&mut buf[..]).is_ok_and(|mut v| v.mark_ce()) {
            self.stats.ecn_marked += 1;
        }
        let mut at = departs + self.config.delay;
        if reorder && !self.config.reorder_max.is_zero() {
            let max = self.config.reorder_max.as_nanos().min(u128::from(u64::MAX)) as u64;
            at += Duration::from_nanos(1 + extra_pick % max);
            self.stats.reordered += 1;
        }
        if duplicate {
            let mut copy = self.pool.pop().unwrap_or_default();
            copy.clear();
            copy.extend_from_slice(&buf);
            self.push(at, buf);
            self.push(at, copy);
            self.stats.duplicated += 1;
        } else {
            self.push(at, buf);
        }
    }

    /// The earliest frame due at or before `now`, if any. Give the buffer back
    /// with [`Link::recycle`] to spare an allocation.
    pub fn pop_due(&mut self, now: Instant) -> Option<Vec<u8>> {
        if self.in_flight.peek()?.at > now {
            return None;
        }
        let f = self.in_flight.pop()?;
        self.stats.delivered += 1;
        Some(f.frame)
    }

    /// Return a frame buffer taken with [`Link::pop_due`] to the link's pool.
    pub fn recycle(&mut self, buf: Vec<u8>) {
        if self.pool.len() < 1024 {
            self.pool.push(buf);
        }
    }

    /// Drop every frame on the wire (counted as lost).
    pub fn clear(&mut self) {
        self.stats.lost += self.in_flight.len() as u64;
        while let Some(f) = self.in_flight.pop() {
            self.recycle(f.frame);
        }
    }

    fn push(&mut self, at: Instant, frame: Vec<u8>) {
        let seq = self.seq;
        self.seq += 1;
        self.in_flight.push(InFlight { at, seq, frame });
    }

    fn chance(&mut self, p: f64) -> bool {
        let x: f64 = self.rng.gen();
        x < p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(i: u32, len: usize) -> Vec<u8> {
        let mut f = vec![0u8; len.max(8)];
        f[..4].copy_from_slice(&i.to_be_bytes());
        f
    }

    fn id(f: &[u8]) -> u32 {
        u32::from_be_bytes([f[0], f[1], f[2], f[3]])
    }

    fn drain(link: &mut Link, until: Instant) -> Vec<(Instant, Vec<u8>)> {
        let mut out = Vec::new();
        while let Some(at) = link.next_arrival() {
            if at > until {
                break;
            }
            let f = link.pop_due(at).expect("due");
            out.push((at, f));
        }
        out
    }

    #[test]
    fn ideal_link_delivers_in_order_after_the_delay() {
        let mut link = Link::new(LinkConfig::ideal(Duration::from_micros(3)), 1);
        for i in 0..100u32 {
            link.send(Instant::from_nanos(u64::from(i) * 10), &frame(i, 64));
        }
        assert_eq!(link.pop_due(Instant::from_nanos(2_999)), None);
        let got = drain(&mut link, Instant::from_nanos(1_000_000));
        assert_eq!(got.len(), 100);
        for (i, (at, f)) in got.iter().enumerate() {
            assert_eq!(id(f), i as u32);
            assert_eq!(at.as_nanos(), i as u64 * 10 + 3_000);
        }
        assert_eq!(link.stats().delivered, 100);
        assert_eq!(link.stats().lost, 0);
    }

    #[test]
    fn loss_rate_within_tolerance() {
        let cfg = LinkConfig::default().with_faults(Faults { loss: 0.1, ..Faults::NONE });
        let mut link = Link::new(cfg, 42);
        let n = 100_000u32;
        for i in 0..n {
            link.send(Instant::ZERO, &frame(i, 16));
        }
        let lost = link.stats().lost as f64;
        // Binomial(1e5, 0.1): sigma ~ 95; allow 5 sigma.
        assert!((lost - 10_000.0).abs() < 475.0, "lost {lost}");
        assert_eq!(link.in_flight() as u64 + link.stats().lost, u64::from(n));
        // Survivors keep their order.
        let got = drain(&mut link, Instant::from_nanos(u64::MAX));
        assert!(got.windows(2).all(|w| id(&w[0].1) < id(&w[1].1)));
    }

    #[test]
    fn same_seed_same_fate_other_seed_other_fate() {
        let cfg = LinkConfig {
            faults: Faults { loss: 0.2, duplicate: 0.1, reorder: 0.2, corrupt: 0.1, ..Faults::NONE },
            reorder_max: Duration::from_micros(50),
            ..LinkConfig::default()
        };
        let run = |seed| {
            let mut link = Link::new(cfg, seed);
            for i in 0..2000u32 {
                link.send(Instant::from_nanos(u64::from(i) * 100), &frame(i, 80));
            }
            drain(&mut link, Instant::from_nanos(u64::MAX))
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn without_reorder_order_is_kept_despite_duplicates_and_loss() {
        let cfg = LinkConfig::default().with_faults(Faults { loss: 0.3, duplicate: 0.3, ..Faults::NONE });
        let mut link = Link::new(cfg, 3);
        for i in 0..5000u32 {
            link.send(Instant::from_nanos(u64::from(i)), &frame(i, 32));
        }
        let got = drain(&mut link, Instant::from_nanos(u64::MAX));
        assert!(got.windows(2).all(|w| id(&w[0].1) <= id(&w[1].1)));
        let dups = got.windows(2).filter(|w| id(&w[0].1) == id(&w[1].1)).count() as u64;
        assert_eq!(dups, link.stats().duplicated);
        let dup_rate = dups as f64 / (5000.0 - link.stats().lost as f64);
        assert!((dup_rate - 0.3).abs() < 0.04, "duplicate rate {dup_rate}");
    }

    #[test]
    fn reorder_lets_later_frames_overtake() {
        let cfg = LinkConfig { faults: Faults { reorder: 0.2, ..Faults::NONE }, reorder_max: Duration::from_micros(20), ..LinkConfig::default() };
        let mut link = Link::new(cfg, 11);
        for i in 0..1000u32 {
            link.send(Instant::from_nanos(u64::from(i) * 1_000), &frame(i, 32));
        }
        let got = drain(&mut link, Instant::from_nanos(u64::MAX));
        assert_eq!(got.len(), 1000);
        let inversions = got.windows(2).filter(|w| id(&w[0].1) > id(&w[1].1)).count();
        assert!(inversions > 50, "only {inversions} inversions");
        assert!(got.windows(2).all(|w| w[0].0 <= w[1].0));
        // Extra delay is bounded by reorder_max.
        for (at, f) in &got {
            let sent = u64::from(id(f)) * 1_000;
            let d = at.as_nanos() - sent;
            assert!((1_000..=21_000).contains(&d), "delay {d}");
        }
    }

    #[test]
    fn corruption_flips_exactly_one_bit_after_the_ethernet_header() {
        let cfg = LinkConfig::default().with_faults(Faults { corrupt: 1.0, ..Faults::NONE });
        let mut link = Link::new(cfg, 5);
        let orig: Vec<u8> = (0..200u32).map(|i| (i * 7) as u8).collect();
        for _ in 0..500 {
            link.send(Instant::ZERO, &orig);
        }
        let got = drain(&mut link, Instant::from_nanos(u64::MAX));
        let mut positions = std::collections::BTreeSet::new();
        for (_, f) in got {
            let diff: Vec<usize> = (0..f.len()).filter(|&i| f[i] != orig[i]).collect();
            assert_eq!(diff.len(), 1);
            assert!(diff[0] >= ETHERNET_LEN);
            assert_eq!((f[diff[0]] ^ orig[diff[0]]).count_ones(), 1);
            positions.insert(diff[0]);
        }
        assert!(positions.len() > 100, "flips should spread over the frame");
        assert_eq!(link.stats().corrupted, 500);
    }

    #[test]
    fn rate_limit_spaces_frames_by_serialization_time() {
        // 1 Gb/s: 1000 bytes take 8 µs.
        let cfg = LinkConfig { delay: Duration::from_micros(2), rate_bps: Some(1_000_000_000), queue_bytes: 1_000_000, ..LinkConfig::default() };
        let mut link = Link::new(cfg, 0);
        for i in 0..10u32 {
            link.send(Instant::ZERO, &frame(i, 1000));
        }
        let got = drain(&mut link, Instant::from_nanos(u64::MAX));
        let times: Vec<u64> = got.iter().map(|(t, _)| t.as_nanos()).collect();
        let want: Vec<u64> = (1..=10).map(|k| k * 8_000 + 2_000).collect();
        assert_eq!(times, want);
        // A frame offered after the queue drained starts at once.
        link.send(Instant::from_nanos(1_000_000), &frame(99, 125));
        assert_eq!(link.next_arrival(), Some(Instant::from_nanos(1_000_000 + 1_000 + 2_000)));
    }

    #[test]
    fn rate_limit_queue_tail_drops() {
        // 8 Mb/s: 1 byte per µs. Queue of 3000 bytes holds three 1000-byte frames.
        let cfg = LinkConfig { delay: Duration::ZERO, rate_bps: Some(8_000_000), queue_bytes: 3000, ..LinkConfig::default() };
        let mut link = Link::new(cfg, 0);
        for i in 0..10u32 {
            link.send(Instant::ZERO, &frame(i, 1000));
        }
        assert_eq!(link.stats().tail_dropped, 7);
        assert_eq!(link.backlog_bytes(Instant::ZERO), 3000);
        assert_eq!(link.backlog_bytes(Instant::from_nanos(1_500_000)), 1500);
        // After one frame has drained there is room for one more.
        link.send(Instant::from_nanos(1_000_000), &frame(10, 1000));
        assert_eq!(link.stats().tail_dropped, 7);
        link.send(Instant::from_nanos(1_000_000), &frame(11, 1000));
        assert_eq!(link.stats().tail_dropped, 8);
        let got = drain(&mut link, Instant::from_nanos(u64::MAX));
        let ids: Vec<u32> = got.iter().map(|(_, f)| id(f)).collect();
        assert_eq!(ids, vec![0, 1, 2, 10]);
        assert_eq!(got[3].0, Instant::from_nanos(4_000_000));
    }

    #[test]
    fn blackout_drops_new_frames_but_delivers_those_on_the_wire() {
        let mut link = Link::new(LinkConfig::default(), 0);
        link.send(Instant::ZERO, &frame(1, 64));
        link.set_down(true);
        link.send(Instant::ZERO, &frame(2, 64));
        link.set_down(false);
        link.send(Instant::ZERO, &frame(3, 64));
        let ids: Vec<u32> = drain(&mut link, Instant::from_nanos(u64::MAX)).iter().map(|(_, f)| id(f)).collect();
        assert_eq!(ids, vec![1, 3]);
        assert_eq!(link.stats().blackout_dropped, 1);
    }

    #[test]
    fn ecn_marking_sets_ce_and_keeps_the_ipv4_checksum_valid() {
        // A RoCEv2 frame over IPv4 with ECT(0), and the same not ECN-capable.
        let roce = |ecn: u8| {
            use crate::psn::Psn;
            use crate::wire::*;
            let repr = FrameRepr {
                eth: EthernetRepr { dst: [2, 0, 0, 0, 0, 2], src: [2, 0, 0, 0, 0, 1], vlan: None, ethertype: ETHERTYPE_IPV4 },
                ip: IpRepr::V4(Ipv4Repr {
                    src: [10, 0, 0, 1],
                    dst: [10, 0, 0, 2],
                    dscp: 0,
                    ecn,
                    ident: 1,
                    dont_frag: true,
                    ttl: 64,
                    protocol: IPPROTO_UDP,
                    payload_len: 0,
                }),
                udp: UdpRepr { src_port: 0xc000, dst_port: ROCEV2_UDP_PORT, length: 0, checksum: 0 },
                transport: TransportRepr::bth_only(BthRepr::new(Opcode::RC_SEND_ONLY, 0x11, Psn::new(1))),
            };
            let mut f = vec![0u8; 128];
            let n = repr.emit(&[7u8; 16], &mut f).unwrap();
            f.truncate(n);
            f
        };
        let f = roce(2);
        let csum = |h: &[u8]| {
            let mut s: u32 = h.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], c[1]]))).sum();
            while s > 0xffff {
                s = (s & 0xffff) + (s >> 16);
            }
            !(s as u16)
        };
        assert_eq!(csum(&f[14..34]), 0);
        let mut link = Link::new(LinkConfig::default().with_faults(Faults { ecn_mark: 1.0, ..Faults::NONE }), 0);
        link.send(Instant::ZERO, &f);
        let not_ect = roce(0);
        link.send(Instant::ZERO, &not_ect);
        let got = drain(&mut link, Instant::from_nanos(u64::MAX));
        assert_eq!(got[0].1[15] & 3, 3);
        assert_eq!(csum(&got[0].1[14..34]), 0, "checksum must still verify");
        assert_eq!(got[1].1[15] & 3, 0, "not-ECT frames are never marked");
        assert_eq!(link.stats().ecn_marked, 1);
    }
}
