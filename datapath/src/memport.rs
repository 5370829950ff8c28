//! The in-memory port: several engines in one process exchanging whole
//! Ethernet frames (real RoCEv2 bytes, ICRC included) through a hub that
//! forwards by destination MAC, like a switch.
//!
//! Optional impairments, applied per sending port with a seeded RNG so runs
//! are repeatable: the [`Faults`] (loss, duplication, reordering, corruption,
//! ECN CE marking) and a rate limit. Used by unit tests and by the
//! no-privilege quick start; real links use the AF_XDP port.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crossbeam_queue::ArrayQueue;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rocev2::impair::Faults;
use rocev2::wire::FrameView;

use crate::port::{Port, PortError, PortInfo};

/// Largest frame the hub carries (a 4096-byte-MTU RoCEv2 frame plus VLAN tag fits).
pub const MAX_FRAME: usize = 9216;

/// Frame buffers the hub keeps for reuse: a frame's buffer goes back to the
/// hub once its receiver has handled it (or the hub dropped it), and the next
/// frame sent takes it, so a steady stream allocates nothing per frame. More
/// than this many idle buffers are freed.
const SPARE_BUFFERS: usize = 1024;

/// Impairments applied to frames a port sends.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Impairments {
    /// Fault probabilities per frame, in the vocabulary the simulator's links
    /// and the XDP program share. A reordered frame is held back and
    /// delivered after the port's next frame (or at the next flush).
    /// Probabilities outside `0.0..=1.0` act as the nearest bound (NaN as 0);
    /// the verbs layer refuses them when a device opens.
    pub faults: Faults,
    /// Limit the sending rate to this many bits per second (a policer: a
    /// frame past `rate_burst_bytes` of credit is dropped). `None`: unlimited.
    pub rate_bps: Option<u64>,
    /// Bytes of credit the rate limiter allows in a burst.
    pub rate_burst_bytes: u64,
}

impl Default for Impairments {
    fn default() -> Self {
        Impairments { faults: Faults::NONE, rate_bps: None, rate_burst_bytes: 64 * 1024 }
    }
}

impl From<Faults> for Impairments {
    /// `faults`, without a rate limit.
    fn from(faults: Faults) -> Self {
        Impairments { faults, ..Impairments::default() }
    }
}

/// A Bernoulli draw that cannot panic: `p >= 1` is always (no draw, as
/// `gen_bool(1.0)`), `p <= 0` and NaN never (no draw).
fn chance(rng: &mut ChaCha8Rng, p: f64) -> bool {
    if p >= 1.0 {
        true
    } else if p > 0.0 {
        rng.gen_bool(p)
    } else {
        false
    }
}

/// What the hub did to frames, summed over all ports.
#[derive(Debug, Default)]
pub struct HubStats {
    /// Frames delivered to a port's inbox.
    pub delivered: AtomicU64,
    /// Frames lost to [`Faults::loss`].
    pub dropped: AtomicU64,
    /// Frames duplicated.
    pub duplicated: AtomicU64,
    /// Frames reordered.
    pub reordered: AtomicU64,
    /// Frames corrupted.
    pub corrupted: AtomicU64,
    /// Frames ECN-marked.
    pub ecn_marked: AtomicU64,
    /// Frames dropped by the rate limiter.
    pub rate_dropped: AtomicU64,
    /// Frames dropped because the receiver's inbox was full.
    pub inbox_full: AtomicU64,
    /// Frames addressed to a MAC no port has.
    pub unknown_dst: AtomicU64,
    /// Frames dropped because the sending or receiving port's link was down.
    pub link_down: AtomicU64,
}

struct Attached {
    mac: [u8; 6],
    inbox: Arc<ArrayQueue<Vec<u8>>>,
    link: Arc<AtomicBool>,
}

/// A switch joining in-memory ports. It also plays the neighbour table
/// (what ARP/ND resolves on a real link): devices publish their IP addresses
/// and resolve peers' MACs through it.
pub struct MemHub {
    ports: Mutex<Vec<Attached>>,
    neighbours: Mutex<Vec<([u8; 16], [u8; 6])>>,
    /// Buffers of frames already handled, for the next frames sent.
    spare: ArrayQueue<Vec<u8>>,
    seed: u64,
    /// Counters.
    pub stats: HubStats,
}

impl MemHub {
    /// A hub whose impairment RNGs derive from `seed`.
    pub fn new(seed: u64) -> Arc<MemHub> {
        Arc::new(MemHub {
            ports: Mutex::new(Vec::new()),
            neighbours: Mutex::new(Vec::new()),
            spare: ArrayQueue::new(SPARE_BUFFERS),
            seed,
            stats: HubStats::default(),
        })
    }

    /// A buffer holding a copy of `bytes`: a spare one if the hub has one.
    fn buffer_with(&self, bytes: &[u8]) -> Vec<u8> {
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(bytes);
        buf
    }

    /// Keep `buf` for a later frame (freed if the hub has enough spares).
    fn recycle(&self, buf: Vec<u8>) {
        let _ = self.spare.push(buf);
    }

    /// Attach a port with `mac` and link `mtu`, impairing what it sends.
    pub fn attach(self: &Arc<Self>, mac: [u8; 6], mtu: u32, impair: Impairments) -> MemPort {
        let inbox = Arc::new(ArrayQueue::new(8192));
        let link = Arc::new(AtomicBool::new(true));
        let mut ports = self.ports.lock().unwrap_or_else(|e| e.into_inner());
        let index = ports.len() as u64;
        ports.push(Attached { mac, inbox: inbox.clone(), link: link.clone() });
        MemPort {
            hub: self.clone(),
            info: PortInfo { mac, mtu },
            inbox,
            link,
            impair,
            rng: ChaCha8Rng::seed_from_u64(self.seed ^ (index.wrapping_mul(0x9e37_79b9_7f4a_7c15))),
            held: None,
            tx_buf: vec![0u8; MAX_FRAME],
            credit: impair.rate_burst_bytes as f64,
            last_refill: Instant::now(),
        }
    }

    /// Take the link of the port with `mac` down or up (pulling the cable).
    /// Returns false if no port has that MAC.
    pub fn set_link(&self, mac: [u8; 6], up: bool) -> bool {
        let ports = self.ports.lock().unwrap_or_else(|e| e.into_inner());
        match ports.iter().find(|p| p.mac == mac) {
            Some(p) => {
                p.link.store(up, Ordering::Release);
                true
            }
            None => false,
        }
    }

    /// Publish that `ip` (an IPv6 or IPv4-mapped address) is at `mac`.
    pub fn publish_address(&self, ip: [u8; 16], mac: [u8; 6]) {
        let mut n = self.neighbours.lock().unwrap_or_else(|e| e.into_inner());
        n.retain(|(a, _)| *a != ip);
        n.push((ip, mac));
    }

    /// The MAC that `ip` is at, if published.
    pub fn resolve(&self, ip: &[u8; 16]) -> Option<[u8; 6]> {
        let n = self.neighbours.lock().unwrap_or_else(|e| e.into_inner());
        n.iter().find(|(a, _)| a == ip).map(|(_, m)| *m)
    }

    /// Deliver `frame` to the port with its destination MAC, or to every
    /// port but the sender for a group address. The last receiver gets the
    /// frame itself, the others copies.
    fn forward(&self, frame: Vec<u8>) {
        if frame.len() < 14 {
            self.recycle(frame);
            return;
        }
        let dst: [u8; 6] = frame[..6].try_into().unwrap_or([0; 6]);
        let src: [u8; 6] = frame[6..12].try_into().unwrap_or([0; 6]);
        let ports = self.ports.lock().unwrap_or_else(|e| e.into_inner());
        let broadcast = dst[0] & 1 == 1;
        let mut sent = false;
        // The receiver found last, served once the next one (or none) is known.
        let mut last: Option<&Attached> = None;
        for p in ports.iter() {
            if p.mac == src || !(broadcast || p.mac == dst) {
                continue;
            }
            sent = true;
            if !p.link.load(Ordering::Acquire) {
                self.stats.link_down.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if let Some(earlier) = last.replace(p) {
                self.deliver(earlier, self.buffer_with(&frame));
            }
        }
        match last {
            Some(p) => self.deliver(p, frame),
            None => self.recycle(frame),
        }
        if !sent {
            self.stats.unknown_dst.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Put `frame` in `port`'s inbox, or count it dropped if that is full.
    fn deliver(&self, port: &Attached, frame: Vec<u8>) {
        match port.inbox.push(frame) {
            Ok(()) => {
                self.stats.delivered.fetch_add(1, Ordering::Relaxed);
            }
            Err(frame) => {
                self.stats.inbox_full.fetch_add(1, Ordering::Relaxed);
                self.recycle(frame);
            }
        }
    }
}

/// One port on a [`MemHub`].
pub struct MemPort {
    hub: Arc<MemHub>,
    info: PortInfo,
    inbox: Arc<ArrayQueue<Vec<u8>>>,
    link: Arc<AtomicBool>,
    impair: Impairments,
    rng: ChaCha8Rng,
    held: Option<Vec<u8>>,
    tx_buf: Vec<u8>,
    credit: f64,
    last_refill: Instant,
}

impl MemPort {
    /// The hub this port is attached to.
    pub fn hub(&self) -> &Arc<MemHub> {
        &self.hub
    }

    /// Change the impairments of frames this port sends.
    pub fn set_impairments(&mut self, impair: Impairments) {
        self.impair = impair;
    }

    fn rate_allows(&mut self, len: usize) -> bool {
        let Some(rate_bps) = self.impair.rate_bps else { return true };
        let rate = rate_bps as f64 / 8.0;
        let now = Instant::now();
        let dt = now.duration_since(self.last_refill);
        self.last_refill = now;
        self.credit = (self.credit + dt.as_secs_f64() * rate).min(self.impair.rate_burst_bytes as f64);
        if self.credit >= len as f64 {
            self.credit -= len as f64;
            true
        } else {
            false
        }
    }

    fn send_impaired(&mut self, mut frame: Vec<u8>) {
        if !self.link.load(Ordering::Acquire) {
            self.hub.stats.link_down.fetch_add(1, Ordering::Relaxed);
            self.hub.recycle(frame);
            return;
        }
        if !self.rate_allows(frame.len()) {
            self.hub.stats.rate_dropped.fetch_add(1, Ordering::Relaxed);
            self.hub.recycle(frame);
            return;
        }
        let (hub, rng) = (&*self.hub, &mut self.rng);
        let st = &hub.stats;
        let f = self.impair.faults;
        if chance(rng, f.loss) {
            st.dropped.fetch_add(1, Ordering::Relaxed);
            hub.recycle(frame);
            return;
        }
        if frame.len() > 14 && chance(rng, f.corrupt) {
            let byte = rng.gen_range(14..frame.len());
            frame[byte] ^= 1 << rng.gen_range(0..8);
            st.corrupted.fetch_add(1, Ordering::Relaxed);
        }
        if chance(rng, f.ecn_mark) && mark_ce(&mut frame) {
            st.ecn_marked.fetch_add(1, Ordering::Relaxed);
        }
        let dup = chance(rng, f.duplicate);
        if self.held.is_none() && chance(rng, f.reorder) {
            st.reordered.fetch_add(1, Ordering::Relaxed);
            self.held = Some(frame);
            return;
        }
        if dup {
            st.duplicated.fetch_add(1, Ordering::Relaxed);
            hub.forward(hub.buffer_with(&frame));
        }
        hub.forward(frame);
        if let Some(h) = self.held.take() {
            hub.forward(h);
        }
    }
}

/// Mark an ECN-capable (ECT) RoCEv2 frame Congestion Experienced, as a
/// switch does: [`FrameView::mark_ce`], which fixes the IPv4 header checksum
/// (the ICRC does not cover the ECN bits). A frame that is not valid RoCEv2
/// (the receiver drops it anyway), not ECN-capable, or already CE is left as
/// it is. Returns whether the frame was marked.
pub fn mark_ce(frame: &mut [u8]) -> bool {
    FrameView::new_checked(frame).is_ok_and(|mut v| v.mark_ce())
}

impl Port for MemPort {
    fn info(&self) -> PortInfo {
        self.info
    }

    fn transmit_with(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> Result<bool, PortError> {
        let Some(len) = fill(&mut self.tx_buf) else { return Ok(false) };
        if len > self.tx_buf.len() {
            return Err(PortError::FrameTooLarge { len, max: self.tx_buf.len() });
        }
        let frame = self.hub.buffer_with(&self.tx_buf[..len]);
        self.send_impaired(frame);
        Ok(true)
    }

    fn receive(&mut self, budget: usize, handler: &mut dyn FnMut(&[u8])) -> Result<usize, PortError> {
        let mut n = 0;
        while n < budget {
            let Some(frame) = self.inbox.pop() else { break };
            handler(&frame);
            self.hub.recycle(frame);
            n += 1;
        }
        Ok(n)
    }

    fn link_up(&self, _now: rocev2::Instant) -> bool {
        self.link.load(Ordering::Acquire)
    }

    fn rx_pending(&mut self) -> bool {
        !self.inbox.is_empty()
    }

    fn flush(&mut self) -> Result<(), PortError> {
        // A frame held back for reordering goes out once nothing follows it.
        if let Some(h) = self.held.take() {
            self.hub.forward(h);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(dst: [u8; 6], src: [u8; 6], body: u8) -> Vec<u8> {
        let mut f = vec![0u8; 60];
        f[..6].copy_from_slice(&dst);
        f[6..12].copy_from_slice(&src);
        f[12] = 0x08;
        f[14] = 0x45;
        f[15] = 0x02; // ECT(0)
        f[20] = body;
        f
    }

    fn send(p: &mut MemPort, f: &[u8]) {
        p.transmit_with(&mut |buf| {
            buf[..f.len()].copy_from_slice(f);
            Some(f.len())
        })
        .unwrap();
    }

    fn drain(p: &mut MemPort) -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        p.receive(usize::MAX, &mut |f| v.push(f.to_vec())).unwrap();
        v
    }

    const A: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 2];
    const C: [u8; 6] = [2, 0, 0, 0, 0, 3];

    /// A hub seeded with `seed` and unimpaired ports A, B and C on it.
    fn three_ports(seed: u64) -> (Arc<MemHub>, MemPort, MemPort, MemPort) {
        let hub = MemHub::new(seed);
        let [a, b, c] = [A, B, C].map(|mac| hub.attach(mac, 1500, Impairments::default()));
        (hub, a, b, c)
    }

    #[test]
    fn forwards_by_mac_and_broadcasts() {
        let (hub, mut a, mut b, mut c) = three_ports(1);
        send(&mut a, &frame(B, A, 7));
        assert_eq!(drain(&mut b).len(), 1);
        assert!(drain(&mut c).is_empty());
        send(&mut a, &frame([0xff; 6], A, 8));
        assert_eq!(drain(&mut b).len(), 1);
        assert_eq!(drain(&mut c).len(), 1);
        assert!(drain(&mut a).is_empty(), "no echo to the sender");
        send(&mut a, &frame([2, 9, 9, 9, 9, 9], A, 9));
        assert_eq!(hub.stats.unknown_dst.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn frame_buffers_are_reused() {
        let (hub, mut a, mut b, mut c) = three_ports(2);
        send(&mut a, &frame(B, A, 1));
        assert_eq!(hub.spare.len(), 0, "a unicast frame is delivered itself, not a copy");
        assert_eq!(drain(&mut b)[0][20], 1);
        assert_eq!(hub.spare.len(), 1, "handled: its buffer is back");
        send(&mut a, &frame(B, A, 2));
        assert_eq!(hub.spare.len(), 0, "the next frame took it");
        assert_eq!(drain(&mut b)[0][20], 2);
        // A broadcast: one copy and the frame itself, both back once handled.
        send(&mut a, &frame([0xff; 6], A, 3));
        assert_eq!((drain(&mut b)[0][20], drain(&mut c)[0][20]), (3, 3));
        assert_eq!(hub.spare.len(), 2);
        // Frames the hub drops give their buffers back too.
        send(&mut a, &frame([2, 9, 9, 9, 9, 9], A, 4));
        a.set_impairments(Impairments::from(Faults { loss: 1.0, ..Faults::NONE }));
        send(&mut a, &frame(B, A, 5));
        assert_eq!(hub.spare.len(), 2);
        assert!(drain(&mut b).is_empty());
        // A frame longer than any spare grows the buffer it takes.
        a.set_impairments(Impairments::default());
        let mut long = frame(B, A, 6);
        long.resize(1400, 0xab);
        send(&mut a, &long);
        assert_eq!(drain(&mut b), vec![long]);
    }

    #[test]
    fn loss_rate_is_seeded_and_close() {
        let hub = MemHub::new(42);
        let imp = Impairments::from(Faults { loss: 0.1, ..Faults::NONE });
        let mut a = hub.attach(A, 1500, imp);
        let mut b = hub.attach(B, 1500, Impairments::default());
        let mut got = 0;
        for i in 0..10_000u32 {
            send(&mut a, &frame(B, A, i as u8));
            got += drain(&mut b).len();
        }
        let dropped = hub.stats.dropped.load(Ordering::Relaxed) as usize;
        assert_eq!(got + dropped, 10_000);
        assert!((800..1200).contains(&dropped), "dropped {dropped}");
    }

    #[test]
    fn reorder_and_duplicate() {
        let hub = MemHub::new(3);
        let imp = Impairments::from(Faults { reorder: 1.0, ..Faults::NONE });
        let mut a = hub.attach(A, 1500, imp);
        let mut b = hub.attach(B, 1500, Impairments::default());
        send(&mut a, &frame(B, A, 1));
        send(&mut a, &frame(B, A, 2));
        let got: Vec<u8> = drain(&mut b).iter().map(|f| f[20]).collect();
        assert_eq!(got, vec![2, 1]);
        a.set_impairments(Impairments::from(Faults { duplicate: 1.0, ..Faults::NONE }));
        send(&mut a, &frame(B, A, 3));
        assert_eq!(drain(&mut b).len(), 2);
    }

    /// A RoCEv2 SEND from A to B over IPv4 with the given ECN bits.
    fn roce_frame(ecn: u8) -> Vec<u8> {
        use rocev2::wire::*;
        let repr = FrameRepr {
            eth: EthernetRepr { dst: B, src: A, vlan: None, ethertype: ETHERTYPE_IPV4 },
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
            transport: TransportRepr::bth_only(BthRepr::new(Opcode::RC_SEND_ONLY, 0x11, rocev2::Psn::new(1))),
        };
        let mut f = vec![0u8; 128];
        let n = repr.emit(&[7u8; 16], &mut f).unwrap();
        f.truncate(n);
        f
    }

    #[test]
    fn ce_marking_fixes_ipv4_checksum() {
        let mut f = roce_frame(2);
        // valid checksum first
        assert!(mark_ce(&mut f));
        assert_eq!(f[15] & 3, 3);
        let mut sum = 0u32;
        for c in f[14..34].chunks(2) {
            sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        assert_eq!(sum, 0xffff, "header checksum verifies");
        let mut not_ect = roce_frame(0);
        assert!(!mark_ce(&mut not_ect));
        assert!(!mark_ce(&mut [0u8; 10]));
    }

    #[test]
    fn rate_limit_drops_past_burst() {
        let hub = MemHub::new(5);
        let imp = Impairments { rate_bps: Some(8), rate_burst_bytes: 600, ..Default::default() };
        let mut a = hub.attach(A, 1500, imp);
        let mut b = hub.attach(B, 1500, Impairments::default());
        for i in 0..20 {
            send(&mut a, &frame(B, A, i));
        }
        assert_eq!(drain(&mut b).len(), 10);
        assert_eq!(hub.stats.rate_dropped.load(Ordering::Relaxed), 10);
    }
}
