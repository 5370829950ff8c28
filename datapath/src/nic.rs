//! The NIC: its shards (an engine and a port each), the queues it shares
//! with applications, and the poll loop that moves everything along.
//!
//! A NIC has one shard per polling core. A shard owns the QPs whose QPN is
//! its index modulo the shard count (the engine hands out only those), its
//! own port (for AF_XDP, a socket on its own RX/TX queue) and its own
//! doorbell queue. A frame received by a shard that does not own its QP is
//! handed over through the owner's lock-free inbox; completions go to CQ
//! rings that every shard may fill. With one shard (the default, and the
//! only choice for the in-memory port) all of this collapses to one loop.
//!
//! Multicast (UD, issue 18): the NIC keeps the device's group table (group
//! GID → attached QPNs, within the device's limits) beside each engine's
//! own. A received frame to DestQP 0xFFFFFF goes to every shard owning a
//! member of the group its destination IP names (a copy through the
//! others' inboxes), or, with no member anywhere, to the receiving engine,
//! which counts it (`rx_mcast_no_member`). A multicast frame this device
//! sends goes to the port *and*, if QPs of this device are attached to the
//! group, into their shards' loopback queues, as an HCA delivers its own
//! multicast to local members (ConnectX unless the QP was created with
//! `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB`; rxe when the host joined the group,
//! as RDMA-CM does, through the kernel's multicast loopback).
//!
//! Loopback: a frame the engine sends to this device itself (destination
//! MAC the port's, or destination IP one of the device's addresses) never
//! reaches the port. It goes into the owning shard's bounded loopback queue
//! and into that engine on its next poll, like a frame received from the
//! wire (every check of `Engine::handle_frame` applies). On veth a frame
//! sent to our own MAC would go to the peer and never come back; an HCA and
//! rxe (`rxe_xmit_packet`: `RXE_LOOPBACK_MASK` → `rxe_loopback`) loop it
//! inside the device. A frame that finds the queue full is dropped and
//! counted (`loopback_drops`); RC recovers by retransmission.
//!
//! `Nic::poll` is one run-to-completion iteration: ring doorbells (WRs posted
//! by applications go into the engine), receive frames, fire due timers,
//! transmit, deliver completions. A datapath thread calls it in a loop
//! ([`crate::runner`]); an embedding application may call it itself.
//!
//! Locks: each engine sits behind a mutex that only its poller and control
//! operations (create/modify/destroy) take. Posting and polling from
//! application threads never take one.

use rocev2::hash::IntMap;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use crossbeam_queue::ArrayQueue;
use rocev2::cm::{Cm, CmEvent, GSI_QPN};
use rocev2::transport::attr::SrqId;
use rocev2::transport::engine::{AsyncEvent, Engine, EngineError};
use rocev2::transport::gsi::Gsi;
use rocev2::transport::mcast::{is_multicast_gid, McastLimits, McastTable, MULTICAST_QPN};
use rocev2::transport::wr::{Completion, CqId, WcOpcode, WcStatus};
use rocev2::wire::Opcode;
use rocev2::Instant;

use crate::port::{Port, PortInfo};
use crate::queues::{CqRing, CqSignals, QpRings, SrqRing};

/// Frames received per poll iteration at most.
const RX_BUDGET: usize = 64;
/// Frames sent per poll iteration at most.
const TX_BUDGET: usize = 64;

/// What the poller met that was not the engine's business: counted here.
#[derive(Debug, Default)]
pub struct NicStats {
    /// Poll iterations.
    pub polls: AtomicU64,
    /// Frames received from the port.
    pub rx_frames: AtomicU64,
    /// Frames handed to the port.
    pub tx_frames: AtomicU64,
    /// Completions delivered to CQ rings.
    pub completions: AtomicU64,
    /// Completions for a CQ that no longer exists (dropped, counted).
    pub completions_orphaned: AtomicU64,
    /// CQ overruns.
    pub cq_overruns: AtomicU64,
    /// Port errors on transmit or receive.
    pub port_errors: AtomicU64,
    /// Capture-file write failures (capture is switched off after one).
    pub capture_errors: AtomicU64,
    /// WRs the engine refused after the application's post had returned
    /// (completed with an error status, never lost).
    pub posts_refused: AtomicU64,
    /// Frames received by a shard that does not own their QP, handed over.
    pub rx_handoffs: AtomicU64,
    /// Handovers dropped because the owner's inbox was full.
    pub rx_handoff_drops: AtomicU64,
    /// Batches of bare ACKs whose kick waited one poll to leave with the
    /// application's answer.
    pub acks_deferred: AtomicU64,
    /// Frames sent to this device itself, looped back inside the NIC
    /// instead of going to the port (not in `tx_frames` or `rx_frames`).
    pub loopback_frames: AtomicU64,
    /// Looped-back frames dropped because the owning shard's loopback
    /// queue was full.
    pub loopback_drops: AtomicU64,
    /// CM events dropped because nobody read the CM event queue (it holds
    /// more than the agent's id bound can produce at once).
    pub cm_event_drops: AtomicU64,
    /// Poll iterations a standing-back datapath thread ran for work that
    /// an application driving the datapath left waiting ([`Nic::serve`]).
    pub served_polls: AtomicU64,
    /// Poll iterations a datapath thread ran in an application's stead:
    /// the application had driven the datapath ([`Nic::drive`]) but then
    /// left it alone for [`DRIVE_WINDOW`] without handing it back (it was
    /// preempted, or stopped polling without arming a CQ).
    pub takeover_polls: AtomicU64,
}

impl NicStats {
    /// Every counter with its name.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        [
            ("polls", g(&self.polls)),
            ("rx_frames", g(&self.rx_frames)),
            ("tx_frames", g(&self.tx_frames)),
            ("completions", g(&self.completions)),
            ("completions_orphaned", g(&self.completions_orphaned)),
            ("cq_overruns", g(&self.cq_overruns)),
            ("port_errors", g(&self.port_errors)),
            ("capture_errors", g(&self.capture_errors)),
            ("acks_deferred", g(&self.acks_deferred)),
            ("posts_refused", g(&self.posts_refused)),
            ("rx_handoffs", g(&self.rx_handoffs)),
            ("rx_handoff_drops", g(&self.rx_handoff_drops)),
            ("loopback_frames", g(&self.loopback_frames)),
            ("loopback_drops", g(&self.loopback_drops)),
            ("cm_event_drops", g(&self.cm_event_drops)),
            ("served_polls", g(&self.served_polls)),
            ("takeover_polls", g(&self.takeover_polls)),
        ]
        .into_iter()
    }
}

/// What a batch of completions came to: added to [`NicStats`] once per
/// batch rather than with a locked add per completion (about half of the
/// delivery's cost per 64 B WRITE, `perf annotate`).
#[derive(Debug, Default)]
struct Delivered {
    delivered: u64,
    orphaned: u64,
    overruns: u64,
}

impl Delivered {
    /// Add the tally to `stats` (only the counters that moved).
    fn count(&self, stats: &NicStats) {
        for (n, c) in [(self.delivered, &stats.completions), (self.orphaned, &stats.completions_orphaned), (self.overruns, &stats.cq_overruns)] {
            if n > 0 {
                c.fetch_add(n, Ordering::Relaxed);
            }
        }
    }
}

enum Doorbell {
    Qp(u32),
    Srq(SrqId),
}

/// CM events the device queues for its channel (four times the agent's
/// default id bound: more than its ids can produce before being read).
const CM_EVENTS: usize = 16 * 1024;

/// The first 12 bytes of an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`).
const IPV4_MAPPED: [u8; 12] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];

/// Frames a shard's inbox holds (handovers from other shards).
const INBOX: usize = 4096;
/// Frames a shard's loopback queue holds (frames this device sent to
/// itself, waiting for the owning engine's next poll). Every shard loops at
/// most `TX_BUDGET` frames per poll, and the owner takes them all each poll.
const LOOPBACK: usize = 1024;

/// One polling core's share of the NIC.
struct Shard {
    engine: Mutex<Engine>,
    /// The engine's memory table (the device's), for the poll iteration's
    /// batch of data movement without borrowing the engine.
    memory: Arc<rocev2::transport::memory::MemoryTable>,
    port: Mutex<Box<dyn Port>>,
    doorbells: ArrayQueue<Doorbell>,
    sweep: AtomicBool,
    inbox: ArrayQueue<Vec<u8>>,
    /// Frames this device sent to itself for this shard's QPs.
    loopback: ArrayQueue<Vec<u8>>,
    /// Buffers of looped-back frames already handled, reused for the next
    /// ones: looping back allocates only while the pool warms up.
    loopback_free: ArrayQueue<Vec<u8>>,
    /// The last poll left a batch of bare ACKs unkicked (see `poll_shard`).
    ack_deferred: AtomicBool,
    /// When (nanoseconds of `Nic::now`) the engine's next timer is due as
    /// of its last poll; `u64::MAX`: none. What a datapath thread standing
    /// back watches, without the engine's lock ([`Nic::serve`]).
    next_timer: AtomicU64,
}

impl Shard {
    /// Whether posted WRs wait for `ring_doorbells` (two loads, no writes).
    fn rung(&self) -> bool {
        !self.doorbells.is_empty() || self.sweep.load(Ordering::Acquire)
    }
}

/// Nanoseconds of `CLOCK_MONOTONIC` (the clock `std::time::Instant` reads
/// on Linux): one vDSO call and a multiply-add. `Instant::elapsed` costs
/// every poll iteration about 45 instructions more (a checked subtraction
/// of two timespecs, then a 128-bit `Duration::as_nanos`).
fn monotonic_nanos() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec for the call to write; the clock id
    // is one Linux always has (it cannot fail, and `ts` stays zero if it did).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

/// One urnic NIC instance.
pub struct Nic {
    shards: Vec<Shard>,
    info: PortInfo,
    qps: RwLock<IntMap<u32, Arc<QpRings>>>,
    srqs: RwLock<IntMap<SrqId, Arc<SrqRing>>>,
    cqs: RwLock<IntMap<CqId, Arc<CqRing>>>,
    events: ArrayQueue<AsyncEvent>,
    /// Signalled whenever an event is queued, so a waiter can block on it
    /// (`ibv_context.async_fd`). `None` only if the kernel refused an eventfd.
    events_fd: Option<crate::queues::EventFd>,
    /// [`monotonic_nanos`] when the NIC was made: [`Nic::now`] counts from it.
    epoch: u64,
    link_up: AtomicBool,
    capture: Mutex<Option<crate::capture::PcapWriter>>,
    /// Whether `capture` holds a writer: the per-frame check, so frames do
    /// not take the capture lock when nobody captures.
    capturing: AtomicBool,
    next_shard: std::sync::atomic::AtomicUsize,
    /// The device's IP addresses (IPv4 as IPv4-mapped IPv6): a frame sent
    /// to one of them is looped back, whatever its destination MAC.
    local_ips: Vec<[u8; 16]>,
    /// The IPv4 ones among them, as 4 bytes: what an IPv4 frame's
    /// destination is compared with, in place (`is_local`).
    local_v4: Vec<[u8; 4]>,
    /// Events of the CM agent (QP1), for the device's CM event channel.
    cm_events: ArrayQueue<CmEvent>,
    /// Signalled whenever a CM event is queued (the channel's fd).
    cm_fd: Option<crate::queues::EventFd>,
    /// The device's multicast groups (every shard's members) and limits.
    mcast: RwLock<McastTable>,
    mcast_limits: McastLimits,
    /// Whether `mcast` has any group: the per-frame check on transmit.
    mcast_any: AtomicBool,
    /// When (nanoseconds of `now()`, 0 = not) an application thread last
    /// drove the datapath ([`Nic::drive`]): the datapath threads stand
    /// back while it does ([`Nic::app_driving`]).
    driven_at: AtomicU64,
    /// Whether an application thread is in [`Nic::drive`] right now: then
    /// it drives, however long ago its iteration began (a kick of a full
    /// batch takes 100-200 us on veth). Two plain stores per drive; with
    /// several application threads driving at once, a guide only.
    in_drive: AtomicBool,
    /// The datapath threads, woken when the application stops driving.
    runners: Mutex<Vec<std::thread::Thread>>,
    /// Whether `runners` has any: without a datapath thread nobody stands
    /// back or takes over, and [`Nic::drive`] skips its end-of-iteration
    /// stamp (a clock read no reader needs).
    has_runners: AtomicBool,
    /// Counters.
    pub stats: NicStats,
}

/// How long after an application thread's last [`Nic::drive`] the datapath
/// threads keep standing back (they take the polling loop back after it).
/// Shorter windows made the parked threads' wakeups cost more than they
/// saved (ib_send_lat p50 4.5 -> 13-20 us on this 2-core host). Within
/// the window a standing-back thread still serves work the application
/// leaves waiting once it has not driven for [`DRIVE_QUIET`] ([`Nic::serve`]).
pub const DRIVE_WINDOW: std::time::Duration = std::time::Duration::from_micros(200);

/// How long an application that drives the datapath may leave it alone
/// before a standing-back datapath thread serves what waits (received
/// frames, due timers, posted WRs, an unkicked batch): a program that
/// polls its CQ and then spins on memory (ib_write_lat waits for the peer's
/// WRITE so) is served as by an HCA instead of after [`DRIVE_WINDOW`]. An
/// application in a polling loop drives every microsecond or two, so a
/// thread that finds it quiet for this long is not racing it. (Having
/// found such work, the thread watches more closely for a while: `runner`.)
pub const DRIVE_QUIET: std::time::Duration = std::time::Duration::from_micros(20);

/// `Nic::in_drive` set while this lives: cleared on the way out, a
/// panic's unwinding included (the C library catches panics at its edge).
struct InDrive<'a>(&'a AtomicBool);

impl<'a> InDrive<'a> {
    fn enter(flag: &'a AtomicBool) -> InDrive<'a> {
        flag.store(true, Ordering::Relaxed);
        InDrive(flag)
    }
}

impl Drop for InDrive<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

/// Lock a mutex, recovering the data if a panicking thread poisoned it.
fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for Nic {
    /// Send the ACKs the engine still holds for replies (rocev2's responder,
    /// "held ACKs") and kick whatever the last poll left queued on each port
    /// (a deferred ACK, see `poll_shard`): the peer must not be left
    /// retransmitting a message that completed here just before the device
    /// closed. Frames for this device itself are not sent (it is closing).
    fn drop(&mut self) {
        let now = self.now();
        let this: &Nic = self;
        for shard in &this.shards {
            let mut engine = lock(&shard.engine);
            let mut port = lock(&shard.port);
            engine.release_held_acks();
            for _ in 0..TX_BUDGET {
                let mut fill = |buf: &mut [u8]| {
                    let n = engine.poll_transmit(now, buf)?;
                    (!this.is_local(buf.get(..n)?)).then_some(n)
                };
                if !matches!(port.transmit_with(&mut fill), Ok(true)) {
                    break;
                }
            }
            if port.tx_pending() {
                let _ = port.flush();
            }
        }
    }
}

impl Nic {
    /// A one-shard NIC running `engine` on `port`. `max_queues` bounds QPs + SRQs.
    pub fn new(engine: Engine, port: Box<dyn Port>, max_queues: usize) -> Nic {
        Nic::sharded(vec![(engine, port)], max_queues)
    }

    /// A NIC with one shard per (engine, port). Engine `i` of `n` must be
    /// configured with `EngineConfig::shard == (i, n)`, and every engine
    /// must share one memory table. The ports must be on the same link (one
    /// queue each of the same interface).
    ///
    /// # Panics
    /// If `shards` is empty (a programming error, not an input).
    pub fn sharded(shards: Vec<(Engine, Box<dyn Port>)>, max_queues: usize) -> Nic {
        assert!(!shards.is_empty(), "a NIC needs at least one shard");
        let info = shards[0].1.info();
        let shards = shards
            .into_iter()
            .map(|(engine, port)| Shard {
                memory: engine.memory().clone(),
                engine: Mutex::new(engine),
                port: Mutex::new(port),
                doorbells: ArrayQueue::new(max_queues.max(16) * 2),
                sweep: AtomicBool::new(false),
                inbox: ArrayQueue::new(INBOX),
                loopback: ArrayQueue::new(LOOPBACK),
                loopback_free: ArrayQueue::new(LOOPBACK),
                ack_deferred: AtomicBool::new(false),
                next_timer: AtomicU64::new(u64::MAX),
            })
            .collect();
        Nic {
            shards,
            info,
            qps: RwLock::new(IntMap::default()),
            srqs: RwLock::new(IntMap::default()),
            cqs: RwLock::new(IntMap::default()),
            events: ArrayQueue::new(1024),
            events_fd: crate::queues::EventFd::new().ok(),
            epoch: monotonic_nanos(),
            link_up: AtomicBool::new(true),
            capture: Mutex::new(None),
            capturing: AtomicBool::new(false),
            next_shard: std::sync::atomic::AtomicUsize::new(0),
            local_ips: Vec::new(),
            local_v4: Vec::new(),
            cm_events: ArrayQueue::new(CM_EVENTS),
            cm_fd: crate::queues::EventFd::new().ok(),
            mcast: RwLock::new(McastTable::default()),
            mcast_limits: McastLimits::default(),
            mcast_any: AtomicBool::new(false),
            driven_at: AtomicU64::new(0),
            in_drive: AtomicBool::new(false),
            runners: Mutex::new(Vec::new()),
            has_runners: AtomicBool::new(false),
            stats: NicStats::default(),
        }
    }

    /// Run QP1 and the CM agent `cm` (once per device: the shard owning
    /// QPN 1). Returns false if the CM already runs (the new agent is dropped).
    pub fn enable_cm(&self, cm: Cm) -> bool {
        let mac = self.info.mac;
        self.with_engine_of(GSI_QPN, |e| {
            if e.gsi().is_some() {
                return false;
            }
            e.enable_cm(cm, mac, None);
            true
        })
    }

    /// Run `f` on QP1 (the CM agent and its peer MACs) with its engine
    /// locked; `None` if the CM is not enabled. What `f` queues is sent by
    /// the next poll.
    pub fn with_gsi<R>(&self, f: impl FnOnce(&mut Gsi) -> R) -> Option<R> {
        self.with_engine_of(GSI_QPN, |e| e.gsi().map(f))
    }

    /// Next CM event, if any (non-blocking).
    pub fn poll_cm_event(&self) -> Option<CmEvent> {
        self.cm_events.pop()
    }

    /// An eventfd that becomes readable when a CM event is queued (-1 if
    /// none could be made): the CM event channel's fd.
    pub fn cm_event_fd(&self) -> std::os::fd::RawFd {
        self.cm_fd.as_ref().map_or(-1, std::os::fd::AsRawFd::as_raw_fd)
    }

    /// The NIC with `limits` as the device's multicast limits (each engine
    /// enforces its own [`rocev2::transport::engine::EngineConfig::mcast`]
    /// on its QPs; these bound the device as a whole).
    pub fn with_mcast_limits(mut self, limits: McastLimits) -> Nic {
        self.mcast_limits = limits;
        self
    }

    /// `ibv_attach_mcast`: QP `qpn` joins group `gid` (see
    /// [`Engine::attach_mcast`]). `Ok(false)`: it already was a member.
    /// The owning engine checks the QP and the GID first, then the device's
    /// limits apply; on any error nothing changed.
    pub fn attach_mcast(&self, qpn: u32, gid: [u8; 16]) -> Result<bool, EngineError> {
        if !self.with_engine_of(qpn, |e| e.attach_mcast(qpn, gid))? {
            return Ok(false);
        }
        let r = self.mcast.write().unwrap_or_else(|e| e.into_inner()).attach(qpn, gid, &self.mcast_limits);
        if let Err(e) = r {
            // Never held together with the table's lock (the poller takes
            // its engine, then the table).
            let _ = self.with_engine_of(qpn, |en| en.detach_mcast(qpn, &gid));
            return Err(e);
        }
        self.mcast_any.store(true, Ordering::Release);
        Ok(true)
    }

    /// `ibv_detach_mcast`: QP `qpn` leaves group `gid`. Its engine stops
    /// delivering to it before this returns.
    pub fn detach_mcast(&self, qpn: u32, gid: &[u8; 16]) -> Result<(), EngineError> {
        self.with_engine_of(qpn, |e| e.detach_mcast(qpn, gid))?;
        let mut t = self.mcast.write().unwrap_or_else(|e| e.into_inner());
        let _ = t.detach(qpn, gid);
        self.mcast_any.store(t.group_count() > 0, Ordering::Release);
        Ok(())
    }

    /// The groups QP `qpn` is attached to.
    pub fn mcast_groups_of(&self, qpn: u32) -> Vec<[u8; 16]> {
        self.mcast.read().unwrap_or_else(|e| e.into_inner()).groups_of(qpn).to_vec()
    }

    /// How many QPs of the device are attached to `gid`.
    pub fn mcast_members(&self, gid: &[u8; 16]) -> usize {
        self.mcast.read().unwrap_or_else(|e| e.into_inner()).members(gid).len()
    }

    /// The device's multicast limits.
    pub fn mcast_limits(&self) -> McastLimits {
        self.mcast_limits
    }

    /// The shards owning a member of group `gid`, each once, in order
    /// (empty: the group has no member on this device).
    fn mcast_shards(&self, gid: &[u8; 16]) -> Vec<usize> {
        let t = self.mcast.read().unwrap_or_else(|e| e.into_inner());
        let mut s: Vec<usize> = t.members(gid).iter().map(|&q| self.shard_of(q)).collect();
        s.sort_unstable();
        s.dedup();
        s
    }

    /// The destination IP of `frame` as a GID (IPv4 as IPv4-mapped).
    fn dst_gid(frame: &[u8]) -> Option<[u8; 16]> {
        use rocev2::wire::{EthernetFrame, Ipv4Packet, Ipv6Packet, ETHERTYPE_IPV4, ETHERTYPE_IPV6};
        let eth = EthernetFrame::new_checked(frame).ok()?;
        match eth.ethertype() {
            ETHERTYPE_IPV4 => Ipv4Packet::new_checked(eth.payload()).ok().map(|p| rocev2::transport::attr::AddressVector::ipv4_gid(p.dst_addr())),
            ETHERTYPE_IPV6 => Ipv6Packet::new_checked(eth.payload()).ok().map(|p| p.dst_addr()),
            _ => None,
        }
    }

    /// A multicast frame this device sends: a copy into the loopback queue
    /// of every shard with a member of its group (none: nothing to do).
    fn loop_back_mcast(&self, frame: &[u8]) {
        if !self.mcast_any.load(Ordering::Acquire) {
            return;
        }
        let Some(gid) = Self::dst_gid(frame).filter(is_multicast_gid) else { return };
        for s in self.mcast_shards(&gid) {
            if self.shards[s].loopback.push(frame.to_vec()).is_ok() {
                self.stats.loopback_frames.fetch_add(1, Ordering::Relaxed);
            } else {
                self.stats.loopback_drops.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The NIC with `ips` (IPv6, IPv4 as IPv4-mapped) as the device's own
    /// addresses: frames the engine sends to one of them are looped back to
    /// the device, as are frames to the port's MAC.
    pub fn with_local_addresses(mut self, ips: &[[u8; 16]]) -> Nic {
        self.local_ips = ips.to_vec();
        self.local_v4 = ips.iter().filter_map(|g| g.strip_prefix(&IPV4_MAPPED)?.try_into().ok()).collect();
        self
    }

    /// Whether `frame` (one the engine built) is for this device itself:
    /// its destination MAC is the port's (rxe `rxe_prepare`: the
    /// destination MAC equal to the netdev's sets `RXE_LOOPBACK_MASK`), or
    /// its destination IP is one of the device's addresses.
    ///
    /// Called for every frame sent: it reads the two addresses in place
    /// (a GID built from the IPv4 header and compared whole was about 70
    /// instructions a frame). An untagged IPv4 frame (RoCEv2 over IPv4, the
    /// common shape) is read as one 34-byte piece, with one length check
    /// for the MAC, the EtherType and the IPv4 destination; any other shape
    /// (802.1Q, IPv6, short) takes [`is_local_general`](Self::is_local_general).
    #[inline]
    fn is_local(&self, frame: &[u8]) -> bool {
        if let Some(h) = frame.first_chunk::<34>() {
            if h[..6] == self.info.mac {
                return true;
            }
            if u16::from_be_bytes([h[12], h[13]]) == rocev2::wire::ETHERTYPE_IPV4 {
                // The IPv4 destination at bytes 16..20 of the header (no
                // addresses: `local_v4` is empty, nothing is local).
                let dst = [h[30], h[31], h[32], h[33]];
                return self.local_v4.contains(&dst);
            }
        }
        self.is_local_general(frame)
    }

    /// [`is_local`](Self::is_local) for a frame of any shape.
    #[inline(never)]
    fn is_local_general(&self, frame: &[u8]) -> bool {
        let Some(dst_mac) = frame.get(..6) else { return false };
        if *dst_mac == self.info.mac {
            return true;
        }
        if self.local_ips.is_empty() {
            return false;
        }
        // The EtherType, after one 802.1Q tag if there is one.
        let at = |i: usize| frame.get(i..i + 2).map(|b| u16::from_be_bytes([b[0], b[1]]));
        let (ethertype, l3) = match at(12) {
            Some(rocev2::wire::ETHERTYPE_VLAN) => (at(16), 18),
            t => (t, 14),
        };
        match ethertype {
            // IPv4: the destination at bytes 16..20 of the header.
            Some(rocev2::wire::ETHERTYPE_IPV4) => frame.get(l3 + 16..l3 + 20).is_some_and(|d| self.local_v4.iter().any(|a| a == d)),
            // IPv6: at bytes 24..40.
            Some(rocev2::wire::ETHERTYPE_IPV6) => frame.get(l3 + 24..l3 + 40).is_some_and(|d| self.local_ips.iter().any(|a| a == d)),
            _ => false,
        }
    }

    /// Queue a frame this device sent to itself for the shard owning its
    /// QP (shard `from` if it names none). Bounded: a full queue drops it.
    fn loop_back(&self, from: usize, frame: &[u8]) {
        let n = self.shards.len();
        let owner = if n == 1 { from } else { rocev2::wire::peek_dest_qpn(frame).map_or(from, |q| q as usize % n) };
        let shard = &self.shards[owner];
        let buf = match shard.loopback_free.pop() {
            Some(mut b) => {
                b.clear();
                b.extend_from_slice(frame);
                b
            }
            None => {
                // Room for a full 1500-byte frame: most buffers never grow.
                let mut b = Vec::with_capacity(frame.len().max(1536));
                b.extend_from_slice(frame);
                b
            }
        };
        if shard.loopback.push(buf).is_ok() {
            self.stats.loopback_frames.fetch_add(1, Ordering::Relaxed);
        } else {
            self.stats.loopback_drops.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// How many shards (polling loops) this NIC has.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// The shard that owns QPN (or SRQ id) `x`.
    pub fn shard_of(&self, x: u32) -> usize {
        // Every post asks (the doorbell): no division for the common
        // single-shard device.
        match self.shards.len() {
            1 => 0,
            n => x as usize % n,
        }
    }

    /// The port's addresses.
    pub fn port_info(&self) -> PortInfo {
        self.info
    }

    /// Capture every frame sent and received from now on into a pcap file
    /// at `path` (`--pcap FILE`); `None` stops capturing (and flushes).
    pub fn set_capture(&self, path: Option<&std::path::Path>) -> std::io::Result<()> {
        let w = match path {
            Some(p) => Some(crate::capture::PcapWriter::create(p)?),
            None => None,
        };
        let mut c = lock(&self.capture);
        self.capturing.store(w.is_some(), Ordering::Release);
        *c = w;
        Ok(())
    }

    /// Whether the port's link was up at the last poll.
    pub fn link_up(&self) -> bool {
        self.link_up.load(Ordering::Acquire)
    }

    /// The engine's notion of now.
    pub fn now(&self) -> Instant {
        Instant::from_nanos(monotonic_nanos().saturating_sub(self.epoch))
    }

    /// Run `f` with the engine owning QPN (or SRQ id) `x` locked.
    pub fn with_engine_of<R>(&self, x: u32, f: impl FnOnce(&mut Engine) -> R) -> R {
        f(&mut lock(&self.shards[self.shard_of(x)].engine))
    }

    /// Run `f` with the engine of the next shard in turn locked (creating a
    /// QP or SRQ: spreads them over the shards).
    pub fn with_next_engine<R>(&self, f: impl FnOnce(&mut Engine) -> R) -> R {
        let i = self.next_shard.fetch_add(1, Ordering::Relaxed) % self.shards.len();
        f(&mut lock(&self.shards[i].engine))
    }

    /// Run `f` with the engine that should own a new QP locked: the SRQ's
    /// shard if the QP uses one (its receives must come from that engine),
    /// else the next shard in turn.
    pub fn create_qp_engine<R>(&self, srq: Option<SrqId>, f: impl FnOnce(&mut Engine) -> R) -> R {
        match srq {
            Some(id) => self.with_engine_of(id.0, f),
            None => self.with_next_engine(f),
        }
    }

    /// Run `f` on every engine in turn (counters).
    pub fn for_each_engine(&self, mut f: impl FnMut(&mut Engine)) {
        for s in &self.shards {
            f(&mut lock(&s.engine));
        }
    }

    /// Run `f` with every engine locked: no poller delivers completions
    /// meanwhile (resizing a CQ).
    pub fn with_all_engines_locked<R>(&self, f: impl FnOnce() -> R) -> R {
        let guards: Vec<_> = self.shards.iter().map(|s| lock(&s.engine)).collect();
        let r = f();
        drop(guards);
        r
    }

    /// Engine-wide counters summed over the shards.
    pub fn engine_stats(&self) -> rocev2::transport::engine::EngineStats {
        let mut total = rocev2::transport::engine::EngineStats::default();
        self.for_each_engine(|e| total.add(e.stats()));
        total
    }

    /// Run `f` with the port of shard 0 locked (port counters and controls).
    pub fn with_port<R>(&self, f: impl FnOnce(&mut dyn Port) -> R) -> R {
        let mut p = lock(&self.shards[0].port);
        f(&mut **p)
    }

    /// Port counters of every shard, summed by name.
    pub fn port_counters(&self) -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> = Vec::new();
        for s in &self.shards {
            for (k, v) in lock(&s.port).counters() {
                match out.iter_mut().find(|(n, _)| *n == k) {
                    Some((_, t)) => *t += v,
                    None => out.push((k, v)),
                }
            }
        }
        out
    }

    /// Make a QP's rings visible to the poller.
    pub fn attach_qp(&self, rings: Arc<QpRings>) {
        self.qps.write().unwrap_or_else(|e| e.into_inner()).insert(rings.qpn, rings);
    }

    /// Forget a QP's rings (after the engine destroyed the QP).
    pub fn detach_qp(&self, qpn: u32) {
        self.qps.write().unwrap_or_else(|e| e.into_inner()).remove(&qpn);
        // The engine forgot its groups with it (`Engine::destroy_qp`).
        let mut t = self.mcast.write().unwrap_or_else(|e| e.into_inner());
        t.detach_all(qpn);
        self.mcast_any.store(t.group_count() > 0, Ordering::Release);
    }

    /// Make an SRQ's ring visible to the poller.
    pub fn attach_srq(&self, ring: Arc<SrqRing>) {
        self.srqs.write().unwrap_or_else(|e| e.into_inner()).insert(ring.id, ring);
    }

    /// Forget an SRQ's ring.
    pub fn detach_srq(&self, id: SrqId) {
        self.srqs.write().unwrap_or_else(|e| e.into_inner()).remove(&id);
    }

    /// Make a CQ's ring visible to the poller.
    pub fn attach_cq(&self, ring: Arc<CqRing>) {
        self.cqs.write().unwrap_or_else(|e| e.into_inner()).insert(ring.id, ring);
    }

    /// Forget a CQ's ring.
    pub fn detach_cq(&self, id: CqId) {
        self.cqs.write().unwrap_or_else(|e| e.into_inner()).remove(&id);
    }

    /// Tell the poller that `rings` has new WRs (the doorbell), after the
    /// post's WR is in its ring. Lock-free; while the QP's doorbell is rung
    /// and not yet answered (a stream of posts between two drains), a post
    /// only reads the flag: one read-modify-write per drain, not per post.
    ///
    /// Why a read is enough: every post claims its slot with a SeqCst
    /// compare-and-swap of the ring's tail before it reads the flag here
    /// (SeqCst). If it reads the flag still set, that read precedes, in the
    /// SeqCst order, the swap with which the next drain clears the flag, and
    /// so does the claim: the drain's check of the tails after it
    /// (`Nic::drain_qp`) sees the claim, and either takes the WR or, if
    /// its post has not published it yet, rings the doorbell again for the
    /// next poll. A flag read as clear is set with a swap, as before.
    pub fn ring_qp(&self, rings: &QpRings) {
        if rings.rung.load(Ordering::SeqCst) {
            return;
        }
        let shard = &self.shards[self.shard_of(rings.qpn)];
        if !rings.rung.swap(true, Ordering::SeqCst) && shard.doorbells.push(Doorbell::Qp(rings.qpn)).is_err() {
            // More queues than the doorbell queue holds: the poller sweeps
            // every queue once instead.
            shard.sweep.store(true, Ordering::Release);
        }
    }

    /// Tell the poller that an SRQ has new receive WRs. Lock-free.
    pub fn ring_srq(&self, ring: &SrqRing) {
        let shard = &self.shards[self.shard_of(ring.id.0)];
        if !ring.rung.swap(true, Ordering::AcqRel) && shard.doorbells.push(Doorbell::Srq(ring.id)).is_err() {
            shard.sweep.store(true, Ordering::Release);
        }
    }

    /// Next asynchronous event, if any (`ibv_get_async_event`, non-blocking).
    pub fn poll_async_event(&self) -> Option<AsyncEvent> {
        self.events.pop()
    }

    /// An eventfd that becomes readable when an asynchronous event is
    /// queued (-1 if none could be made): what `ibv_context.async_fd` is.
    pub fn async_event_fd(&self) -> std::os::fd::RawFd {
        self.events_fd.as_ref().map_or(-1, std::os::fd::AsRawFd::as_raw_fd)
    }

    fn push_event(&self, ev: AsyncEvent) {
        // A full queue (1024 unread events) drops the newest, as a CQ
        // overrun would; the application is not reading events.
        let _ = self.events.push(ev);
        if let Some(f) = &self.events_fd {
            f.signal();
        }
    }

    /// One poll iteration of every shard, in turn (run-to-completion mode).
    /// Returns how much work it did (0 = idle).
    pub fn poll(&self) -> usize {
        (0..self.shards.len()).map(|i| self.poll_shard(i)).sum()
    }

    /// One poll iteration of shard `i` (its datapath thread calls this):
    /// receive a batch, take posted WRs, run due timers, transmit what the
    /// engine has, kick the port, deliver completions and events.
    ///
    /// A batch made only of bare RC ACKs, while completions wait for the
    /// application or right after the requests it acknowledges arrived, is
    /// left unkicked until the next iteration (never two in a row): the
    /// application usually answers at once and the ACK then leaves with its
    /// reply in one kick. `Nic`'s drop kicks whatever is left. Counted as
    /// `acks_deferred`.
    pub fn poll_shard(&self, i: usize) -> usize {
        let Some(shard) = self.shards.get(i) else { return 0 };
        self.poll_locked(i, shard, lock(&shard.engine), false)
    }

    /// An application thread drives the datapath (the C library's
    /// `ibv_poll_cq` finding its CQ empty, as a run-to-completion program
    /// calls [`Nic::poll`]): one poll iteration of every shard no other
    /// thread is polling right now (never waits for one). Until
    /// [`DRIVE_WINDOW`] after the last such call the datapath threads stand
    /// back (sleep) instead of competing with the application for the
    /// cores; [`Nic::stop_driving`] hands the work back to them at once.
    pub fn drive(&self) -> usize {
        // The first iteration stamps the drive time with the clock it reads
        // anyway, at its start (a clock read is most of what driving adds
        // to an idle poll, and an idle iteration is short).
        let mut work = 0;
        let mut stamped = false;
        {
            let _in_drive = InDrive::enter(&self.in_drive);
            for i in 0..self.shards.len() {
                if let Some(w) = self.try_poll(i, !stamped) {
                    work += w;
                    stamped = true;
                }
            }
        }
        // An iteration that did work can be long: on veth a kick of a full
        // transmit batch delivers it to the peer in this thread (64 frames
        // of 1 KiB, one 64 KiB WRITE, take 100-200 us here, about
        // `DRIVE_WINDOW`). Stamped only at its start, it made a standing-
        // back thread take the application that had just polled for one
        // that stopped, and poll beside it (ib_write_bw -s 65536: a million
        // takeover polls in 10,000 WRITEs). So it is stamped again at its
        // end, for the price of a clock read per iteration that did work.
        // Without a datapath thread (`DatapathMode::Manual`) nobody stands
        // back or takes over: the start's stamp serves `since_driven`.
        if !stamped || (work > 0 && self.has_runners.load(Ordering::Relaxed)) {
            self.driven_at.store(self.now().as_nanos().max(1), Ordering::Relaxed);
        }
        work
    }

    /// A datapath thread takes over from an application that drove the
    /// datapath and then left it alone for [`DRIVE_WINDOW`] (counted as
    /// `takeover_polls`): one poll iteration of each shard in `shards` that
    /// no other thread is polling right now. `None` if every one of them
    /// was busy: the application is in an iteration longer than the window
    /// (it drives after all), and the thread must not wait for it (it
    /// would then run the next iteration in the application's stead).
    pub fn take_over(&self, shards: std::ops::Range<usize>) -> Option<usize> {
        let work = shards.filter_map(|i| self.try_poll(i, false)).reduce(|a, b| a + b)?;
        self.stats.takeover_polls.fetch_add(1, Ordering::Relaxed);
        Some(work)
    }

    /// One poll iteration of shard `i` unless another thread is polling it
    /// right now (then `None`: never waits); `driver`: an application
    /// thread's, which stamps the drive time.
    fn try_poll(&self, i: usize, driver: bool) -> Option<usize> {
        let shard = self.shards.get(i)?;
        let engine = match shard.engine.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        Some(self.poll_locked(i, shard, engine, driver))
    }

    /// The application is about to block (it arms a CQ to sleep on its
    /// completion channel): the datapath threads take over now.
    pub fn stop_driving(&self) {
        if self.driven_at.swap(0, Ordering::Relaxed) != 0 {
            for t in lock(&self.runners).iter() {
                t.unpark();
            }
        }
    }

    /// Whether an application thread drove the datapath within [`DRIVE_WINDOW`].
    pub fn app_driving(&self) -> bool {
        self.since_driven().is_some_and(|d| d < DRIVE_WINDOW)
    }

    /// How long ago an application thread last drove the datapath
    /// ([`Nic::drive`]): zero while one is in a drive; `None` if it never
    /// did or handed the work back ([`Nic::stop_driving`]).
    pub fn since_driven(&self) -> Option<std::time::Duration> {
        self.since_driven_with(&mut || self.now())
    }

    /// [`Nic::since_driven`] with the clock read `now` gives, called only
    /// when the answer needs it (not while the application never drove or
    /// is in a drive): a datapath thread standing back reads the clock once
    /// per look for this, its watch and [`Nic::work_pending_with`] (`runner`).
    pub(crate) fn since_driven_with(&self, now: &mut dyn FnMut() -> Instant) -> Option<std::time::Duration> {
        let at = self.driven_at.load(Ordering::Relaxed);
        if at == 0 {
            return None;
        }
        if self.in_drive.load(Ordering::Relaxed) {
            return Some(std::time::Duration::ZERO);
        }
        Some(std::time::Duration::from_nanos(now().as_nanos().saturating_sub(at)))
    }

    /// Whether shard `i` has work waiting for a poll, seen without a syscall
    /// and without waiting for a lock: received frames in its port (not
    /// looked at while another thread holds the port: that one is polling),
    /// frames handed over or looped back, rung doorbells, transmissions not
    /// yet kicked (a deferred ACK batch), a due timer (a held ACK's bound, a
    /// retransmission).
    pub fn work_pending(&self, i: usize) -> bool {
        self.work_pending_with(i, &mut || self.now())
    }

    /// [`Nic::work_pending`] with the clock read `now` gives, called only
    /// when the answer needs it (no other work waits, a timer is armed).
    pub(crate) fn work_pending_with(&self, i: usize, now: &mut dyn FnMut() -> Instant) -> bool {
        let Some(shard) = self.shards.get(i) else { return false };
        if shard.rung() || !shard.inbox.is_empty() || !shard.loopback.is_empty() {
            return true;
        }
        let timer = shard.next_timer.load(Ordering::Relaxed);
        if timer != u64::MAX && timer <= now().as_nanos() {
            return true;
        }
        match shard.port.try_lock() {
            Ok(mut p) => p.rx_pending() || p.tx_pending(),
            Err(_) => false,
        }
    }

    /// What a datapath thread standing back for a driving application does
    /// (`runner`): one poll iteration of each shard in `shards` that has work
    /// waiting ([`Nic::work_pending`]) and that no other thread is polling
    /// right now (never waits for one). Unlike [`Nic::drive`] it leaves the
    /// application's drive time alone. Returns the work done.
    pub fn serve(&self, shards: std::ops::Range<usize>) -> usize {
        self.serve_with(shards, &mut || self.now())
    }

    /// [`Nic::serve`] with the clock read `now` gives (for
    /// [`Nic::work_pending_with`]).
    pub(crate) fn serve_with(&self, shards: std::ops::Range<usize>, now: &mut dyn FnMut() -> Instant) -> usize {
        let work = shards.filter(|&i| self.work_pending_with(i, now)).filter_map(|i| self.try_poll(i, false)).sum();
        if work > 0 {
            self.stats.served_polls.fetch_add(1, Ordering::Relaxed);
        }
        work
    }

    /// Register a datapath thread (woken by [`Nic::stop_driving`]).
    pub(crate) fn add_runner(&self, t: std::thread::Thread) {
        lock(&self.runners).push(t);
        self.has_runners.store(true, Ordering::Relaxed);
    }

    /// One poll iteration of shard `i` with its engine locked; `driver`:
    /// an application thread's ([`Nic::drive`]), which stamps the drive time
    /// with this iteration's clock.
    fn poll_locked(&self, i: usize, shard: &Shard, mut engine: MutexGuard<'_, Engine>, driver: bool) -> usize {
        self.stats.polls.fetch_add(1, Ordering::Relaxed);
        let mut port = lock(&shard.port);
        // The copies of the whole iteration (gathers, placements) enter the
        // memory table's lock once, at the first of them; it is left before
        // the kick and the delivery (which take the CQ table's lock).
        let batch = shard.memory.batch();
        let mut work = self.ring_doorbells(shard, &mut engine);
        let now = self.now();
        if driver {
            self.driven_at.store(now.as_nanos().max(1), Ordering::Relaxed);
        }

        // Link state changes become async events (IBV_EVENT_PORT_ACTIVE/ERR).
        if i == 0 {
            let up = port.link_up(now);
            if self.link_up.swap(up, Ordering::AcqRel) != up {
                self.push_event(if up { AsyncEvent::PortActive } else { AsyncEvent::PortError });
                work += 1;
            }
        }

        // Receive: ours into the engine, others' into their owner's inbox.
        //
        // Doorbells rung since the drain above are taken before each frame:
        // a receive WR posted before the peer sent this frame must be there
        // when it lands (post_recv's ring and doorbell happen before the
        // peer's send, which happens before we take the frame). Otherwise a
        // poller preempted between the drain and the receive would leave
        // a UC/UD message without its WR (dropped) or an RC one with an
        // RNR NAK.
        let one_shard = self.shards.len() == 1;
        let mut rung_late = 0;
        let rx = {
            let engine = &mut *engine;
            port.receive(RX_BUDGET, &mut |frame| {
                // The usual case, one shard with no capture and no doorbell
                // rung, straight into the engine: what `receive_frame` does
                // then. The closure then jumps into `handle_frame` without
                // a frame of its own (the whole path inline saved six
                // registers per frame: about 13 instructions).
                if one_shard && !self.capturing.load(Ordering::Relaxed) && !shard.rung() {
                    engine.handle_frame(now, frame);
                } else {
                    rung_late += self.receive_frame(i, shard, engine, now, frame);
                }
            })
        };
        work += rung_late;
        let mut received = 0;
        match rx {
            Ok(n) => {
                received = n;
                work += n;
                self.stats.rx_frames.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(_) => {
                self.stats.port_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        // Frames other shards received for our QPs. An empty inbox (always,
        // with one shard) is seen from its two indices: a pop of an empty
        // `ArrayQueue` costs about 36 instructions and a full fence.
        for _ in 0..INBOX {
            if shard.inbox.is_empty() {
                break;
            }
            let Some(frame) = shard.inbox.pop() else { break };
            if shard.rung() {
                work += self.ring_doorbells(shard, &mut engine);
            }
            engine.handle_frame(now, &frame);
            work += 1;
        }
        // Frames this device sent to itself (any shard) for our QPs: as if
        // received, through every check of `handle_frame`. At most what was
        // queued when we looked (bounded: nothing we send now is taken).
        for _ in 0..shard.loopback.len() {
            let Some(frame) = shard.loopback.pop() else { break };
            if shard.rung() {
                work += self.ring_doorbells(shard, &mut engine);
            }
            engine.handle_frame(now, &frame);
            let _ = shard.loopback_free.push(frame);
            work += 1;
        }

        // Timers.
        if engine.next_timeout().is_some_and(|t| t <= now) {
            engine.handle_timeout(now);
            work += 1;
        }

        // Transmit. A frame for this device itself is built in the port's
        // buffer like any other, then copied to the loopback queue and the
        // buffer handed back unsent (`None`).
        let mut sent = 0;
        let mut looped = 0;
        let mut only_acks = true;
        {
            // The fill is built once per poll, not once per frame (it holds
            // seven references); `was_looped` tells the loop what it did,
            // `more` whether the engine may have another frame (the port
            // lends no buffer for an attempt that would find none).
            let engine = &mut *engine;
            let was_looped = Cell::new(false);
            let more = Cell::new(engine.may_transmit(now));
            let mut fill = |buf: &mut [u8]| {
                let Some(n) = engine.poll_transmit(now, buf) else {
                    more.set(false);
                    return None;
                };
                more.set(engine.may_transmit_more());
                let frame = buf.get(..n)?;
                self.capture(frame);
                if self.is_local(frame) {
                    self.loop_back(i, frame);
                    was_looped.set(true);
                    return None;
                }
                // Multicast: to the wire, and to this device's members.
                self.loop_back_mcast(frame);
                // Only while the batch could still be all ACKs (a data
                // frame's later ones neither read its opcode nor store
                // the flag again through the captured reference).
                if only_acks {
                    only_acks = rocev2::wire::peek_opcode(frame) == Some(Opcode::RC_ACK);
                }
                Some(n)
            };
            while sent + looped < TX_BUDGET && more.get() {
                was_looped.set(false);
                match port.transmit_with(&mut fill) {
                    Ok(true) => sent += 1,
                    Ok(false) if was_looped.get() => looped += 1,
                    Ok(false) => break,
                    Err(_) => {
                        self.stats.port_errors.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                }
            }
        }
        drop(batch);
        // A batch of nothing but bare ACKs, made by frames that also
        // completed work requests or arrived in this poll (a WRITE's data,
        // which an application spinning on memory sees at once, as
        // ib_write_lat's does), waits one poll before its kick (never two
        // in a row): the application usually answers at once (a
        // ping-pong's reply, the next request), and the ACK then leaves
        // with it in one kick rather than two. A kick costs a syscall and,
        // on veth, the whole delivery to the peer. The ACK is late by one
        // poll iteration, far below any ACK timeout.
        let answerable = engine.has_completions() || received > 0;
        let defer = sent > 0 && only_acks && answerable && !shard.ack_deferred.load(Ordering::Relaxed);
        shard.ack_deferred.store(defer, Ordering::Relaxed);
        if defer {
            self.stats.acks_deferred.fetch_add(1, Ordering::Relaxed);
        } else if (sent > 0 || port.tx_pending()) && port.flush().is_err() {
            self.stats.port_errors.fetch_add(1, Ordering::Relaxed);
        }
        self.stats.tx_frames.fetch_add(sent as u64, Ordering::Relaxed);
        work += sent + looped;
        drop(port);

        // Completions and events: the CQ table is read-locked once per
        // batch, not once per completion (with a reference count taken and
        // dropped on the ring each time).
        if engine.has_completions() {
            let cqs = self.cqs.read().unwrap_or_else(|e| e.into_inner());
            let mut tally = Delivered::default();
            // The CQs' arming is looked at once for the batch, after one
            // fence, not once per completion (`CqSignals`).
            let mut signals = CqSignals::new();
            while let Some(c) = engine.poll_completion() {
                self.deliver_to(&cqs, c, &mut tally, &mut signals);
                work += 1;
            }
            tally.overruns += signals.finish() as u64;
            tally.count(&self.stats);
        }
        while let Some(ev) = engine.poll_event() {
            self.push_event(ev);
            work += 1;
        }
        if let Some(g) = engine.gsi() {
            let mut any = false;
            while let Some(ev) = g.cm.poll_event() {
                if self.cm_events.push(ev).is_err() {
                    self.stats.cm_event_drops.fetch_add(1, Ordering::Relaxed);
                }
                any = true;
                work += 1;
            }
            if any {
                if let Some(f) = &self.cm_fd {
                    f.signal();
                }
            }
        }
        shard.next_timer.store(engine.next_timeout().map_or(u64::MAX, Instant::as_nanos), Ordering::Relaxed);
        work
    }

    /// A received frame to DestQP 0xFFFFFF on a sharded NIC: a copy to the
    /// inbox of every other shard owning a member of its group. Whether
    /// shard `i` takes it too (it owns a member, or nobody does and its
    /// engine counts the drop).
    fn route_mcast(&self, i: usize, frame: &[u8]) -> bool {
        let shards = Self::dst_gid(frame).map(|g| self.mcast_shards(&g)).unwrap_or_default();
        if shards.is_empty() {
            return true;
        }
        for &s in shards.iter().filter(|&&s| s != i) {
            if self.shards[s].inbox.push(frame.to_vec()).is_ok() {
                self.stats.rx_handoffs.fetch_add(1, Ordering::Relaxed);
            } else {
                self.stats.rx_handoff_drops.fetch_add(1, Ordering::Relaxed);
            }
        }
        shards.contains(&i)
    }

    /// A frame shard `i`'s port received: captured, then into shard `i`'s
    /// engine (doorbells rung since the poll's drain taken first), or
    /// handed to the shard that owns its DestQP, or a multicast group's
    /// shards. Returns the work of the doorbells it rang.
    #[inline(never)]
    fn receive_frame(&self, i: usize, shard: &Shard, engine: &mut Engine, now: Instant, frame: &[u8]) -> usize {
        self.capture(frame);
        let n = self.shards.len();
        let dest = if n == 1 { None } else { rocev2::wire::peek_dest_qpn(frame) };
        let owner = match dest {
            Some(MULTICAST_QPN) => {
                if !self.route_mcast(i, frame) {
                    return 0;
                }
                i
            }
            Some(q) => q as usize % n,
            None => i,
        };
        let mut rung = 0;
        if owner == i {
            if shard.rung() {
                rung = self.ring_doorbells(shard, engine);
            }
            engine.handle_frame(now, frame);
        } else if self.shards[owner].inbox.push(frame.to_vec()).is_ok() {
            self.stats.rx_handoffs.fetch_add(1, Ordering::Relaxed);
        } else {
            self.stats.rx_handoff_drops.fetch_add(1, Ordering::Relaxed);
        }
        rung
    }

    /// Write `frame` to the capture file, if capturing. Called for every
    /// frame sent and received: the check is inlined, the writing is not
    /// (a call whose body could write saved and restored registers on every
    /// frame, about 30 instructions, capturing or not).
    #[inline]
    fn capture(&self, frame: &[u8]) {
        if self.capturing.load(Ordering::Relaxed) {
            self.capture_write(frame);
        }
    }

    #[cold]
    #[inline(never)]
    fn capture_write(&self, frame: &[u8]) {
        let mut c = lock(&self.capture);
        if let Some(w) = c.as_mut() {
            if w.write(frame).is_err() {
                self.stats.capture_errors.fetch_add(1, Ordering::Relaxed);
                self.capturing.store(false, Ordering::Release);
                *c = None;
            }
        }
    }

    /// Take posted WRs from rung QPs and SRQs of `shard` into its engine.
    fn ring_doorbells(&self, shard: &Shard, engine: &mut Engine) -> usize {
        let mut work = 0;
        // Read before it is swapped: a swap every poll is a locked
        // read-modify-write for a flag that is almost never set.
        if shard.sweep.load(Ordering::Acquire) && shard.sweep.swap(false, Ordering::AcqRel) {
            let me = self.shard_of_ptr(shard);
            let qps: Vec<_> = self.qps.read().unwrap_or_else(|e| e.into_inner()).values().filter(|q| self.shard_of(q.qpn) == me).cloned().collect();
            for q in qps {
                work += self.drain_qp(engine, &q);
            }
            let srqs: Vec<_> =
                self.srqs.read().unwrap_or_else(|e| e.into_inner()).values().filter(|r| self.shard_of(r.id.0) == me).cloned().collect();
            for r in srqs {
                work += self.drain_srq(engine, &r);
            }
        }
        let n = shard.doorbells.len();
        for _ in 0..n {
            let Some(db) = shard.doorbells.pop() else { break };
            match db {
                Doorbell::Qp(qpn) => {
                    // Drained under the table's read lock, not from a clone
                    // of the `Arc` (two locked read-modify-writes a drain):
                    // the drain takes no lock a writer of the table holds.
                    let qps = self.qps.read().unwrap_or_else(|e| e.into_inner());
                    if let Some(rings) = qps.get(&qpn) {
                        work += self.drain_qp(engine, rings);
                    }
                }
                Doorbell::Srq(id) => {
                    let ring = self.srqs.read().unwrap_or_else(|e| e.into_inner()).get(&id).cloned();
                    if let Some(ring) = ring {
                        work += self.drain_srq(engine, &ring);
                    }
                }
            }
        }
        work
    }

    fn shard_of_ptr(&self, shard: &Shard) -> usize {
        self.shards.iter().position(|s| std::ptr::eq(s, shard)).unwrap_or(0)
    }

    fn drain_qp(&self, engine: &mut Engine, rings: &QpRings) -> usize {
        let mut work = 0;
        // A swap, not a store: a read-modify-write orders the flag's reset
        // before the ring reads below (a plain store may sit in the store
        // buffer while the pops read an empty ring and the poster, still
        // seeing the flag set, rings no doorbell: a WR left in the ring).
        // SeqCst: the order `ring_qp` relies on (its flag read, this swap,
        // the tail checks at the end).
        rings.rung.swap(false, Ordering::SeqCst);
        // Drains of one QP are serialised by the engine's lock: the rings'
        // consumers are always free here. Each receive WQE is lent from its
        // ring slot and copied once, into the engine's receive queue; the
        // send ring's boxes of WQEs reaped since the last drain replace the
        // ones taken. One engine lookup, timer arming and wake-up for the
        // whole drain.
        let (recvs, mut sends) = (rings.recv.consumer(), rings.send.consumer());
        work += engine.drain_posts(
            rings.qpn,
            recvs,
            |wr_id, e| self.refuse(rings, wr_id, WcOpcode::Recv, e, true),
            sends.as_mut(),
            |wr_id, opcode, e| self.refuse(rings, wr_id, opcode, e, false),
        );
        drop(sends);
        // A WR claimed before the swap above whose post read the flag still
        // set rang no doorbell (`ring_qp`); if a ring stopped at it, not yet
        // published, or WRs came in since, ring again: the next poll drains it.
        if !rings.send.is_empty() || !rings.recv.is_empty() {
            self.ring_qp(rings);
        }
        work
    }

    fn drain_srq(&self, engine: &mut Engine, ring: &SrqRing) -> usize {
        ring.rung.swap(false, Ordering::AcqRel); // a swap: see drain_qp

        // The post path bounds the SRQ by its depth (WRs the engine holds
        // included) and checks SGE counts, so the engine refuses a WR only
        // if the SRQ went away meanwhile; it has no QP to complete on:
        // count it.
        let work = engine.drain_srq_posts(ring.id, ring.recv.consumer(), |_, _| {
            self.stats.posts_refused.fetch_add(1, Ordering::Relaxed);
        });
        // As in `drain_qp`: a post that claimed a slot before the swap and
        // read the flag still set rang no doorbell.
        if !ring.recv.is_empty() {
            self.ring_srq(ring);
        }
        work
    }

    /// A WR the application posted successfully but the engine refused (the
    /// QP changed state in between): complete it with an error, never drop it.
    fn refuse(&self, rings: &QpRings, wr_id: u64, opcode: WcOpcode, err: EngineError, recv: bool) {
        self.stats.posts_refused.fetch_add(1, Ordering::Relaxed);
        let _ = err;
        let status = WcStatus::LocQpOpErr;
        let cq = if recv { rings.recv_cq } else { rings.send_cq };
        self.deliver(Completion::error(cq, rings.qpn, wr_id, opcode, status));
    }

    fn deliver(&self, c: Completion) {
        let mut tally = Delivered::default();
        let cqs = self.cqs.read().unwrap_or_else(|e| e.into_inner());
        let mut signals = CqSignals::new();
        self.deliver_to(&cqs, c, &mut tally, &mut signals);
        tally.overruns += signals.finish() as u64;
        tally.count(&self.stats);
    }

    /// [`Nic::deliver`] with the CQ table already read-locked, counted in
    /// `tally` (the caller adds a batch's tally to the counters once), the
    /// completion pushed with its run and the CQ's arming looked at when
    /// `signals`' batch ends (whose `finish` says how many overran).
    fn deliver_to<'a>(&self, cqs: &'a IntMap<CqId, Arc<CqRing>>, c: Completion, tally: &mut Delivered, signals: &mut CqSignals<'a>) {
        // The CQ of the run being gathered, if it is this one's: no lookup
        // for the completions after the first of a run (the table cannot
        // change under the read lock the caller holds).
        if let Some(ring) = signals.gathering().filter(|r| r.id == c.cq) {
            tally.delivered += 1;
            signals.push(ring, c.wc, c.solicited);
            return;
        }
        match cqs.get(&c.cq) {
            Some(ring) => {
                tally.delivered += 1;
                signals.push(ring, c.wc, c.solicited);
            }
            None => tally.orphaned += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memport::{MemHub, MemPort};
    use rocev2::transport::engine::EngineConfig;
    use rocev2::transport::memory::MemoryTable;

    const MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const OTHER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
    const V4: [u8; 4] = [10, 0, 0, 1];
    const V6: [u8; 16] = [0xfd, 0x75, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

    fn nic() -> Nic {
        let hub = MemHub::new(1);
        let engine = Engine::new(EngineConfig::default(), Arc::new(MemoryTable::new()));
        let mut v4 = [0u8; 16];
        v4[10] = 0xff;
        v4[11] = 0xff;
        v4[12..].copy_from_slice(&V4);
        Nic::new(engine, Box::new(hub.attach(MAC, 1500, Default::default())), 16).with_local_addresses(&[v4, V6])
    }

    /// An Ethernet frame to `dmac` (802.1Q-tagged if `vlan`) carrying an
    /// IPv4 (`dst` of 4 bytes) or IPv6 (16 bytes) header to `dst` and 8
    /// bytes of UDP.
    fn frame(dmac: [u8; 6], vlan: bool, dst: &[u8]) -> Vec<u8> {
        let mut f = dmac.to_vec();
        f.extend_from_slice(&OTHER_MAC);
        if vlan {
            f.extend_from_slice(&[0x81, 0x00, 0, 5]);
        }
        if dst.len() == 4 {
            f.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 28, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 2]);
        } else {
            f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0, 0, 8, 17, 64]);
            f.extend_from_slice(&[0xfd, 0x75, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        }
        f.extend_from_slice(dst);
        f.extend_from_slice(&[0x12, 0x34, 0x12, 0xb7, 0, 8, 0, 0]);
        f
    }

    #[test]
    fn frames_to_our_mac_or_addresses_are_local() {
        let nic = nic();
        assert!(nic.is_local(&frame(MAC, false, &[10, 0, 0, 9])), "our MAC, whatever the IP (rxe_prepare)");
        assert!(nic.is_local(&frame(OTHER_MAC, false, &V4)), "our IPv4 address");
        assert!(nic.is_local(&frame(OTHER_MAC, true, &V4)), "our IPv4 address behind a VLAN tag");
        assert!(nic.is_local(&frame(OTHER_MAC, false, &V6)), "our IPv6 address");
        assert!(!nic.is_local(&frame(OTHER_MAC, false, &[10, 0, 0, 2])), "a peer's IPv4 address");
        let mut peer6 = V6;
        peer6[15] = 2;
        assert!(!nic.is_local(&frame(OTHER_MAC, true, &peer6)), "a peer's IPv6 address");
        // Not IP, or too short to say: for the port (whatever it makes of it).
        let mut arp = frame(OTHER_MAC, false, &V4);
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert!(!nic.is_local(&arp));
        assert!(!nic.is_local(&frame(OTHER_MAC, false, &V4)[..20]));
        assert!(!nic.is_local(&MAC[..4]));
        // Without addresses only the MAC counts.
        let engine = Engine::new(EngineConfig::default(), Arc::new(MemoryTable::new()));
        let bare = Nic::new(engine, Box::new(MemHub::new(2).attach(MAC, 1500, Default::default())), 16);
        assert!(!bare.is_local(&frame(OTHER_MAC, false, &V4)));
        assert!(bare.is_local(&frame(MAC, false, &V4)));
    }

    /// `is_local`'s one-piece read of an untagged IPv4 frame answers as the
    /// general reading does, for every shape of frame and every prefix of
    /// it: either MAC, tagged or not, IPv4/IPv6/ARP, our address or a
    /// peer's, each bit of the EtherType and the destination flipped.
    #[test]
    fn the_untagged_ipv4_shortcut_answers_as_the_general_reading() {
        let nic = nic();
        let engine = Engine::new(EngineConfig::default(), Arc::new(MemoryTable::new()));
        let bare = Nic::new(engine, Box::new(MemHub::new(2).attach(MAC, 1500, Default::default())), 16);
        let mut peer6 = V6;
        peer6[15] = 2;
        let mut checked = 0;
        for dmac in [MAC, OTHER_MAC] {
            for vlan in [false, true] {
                for dst in [&V4[..], &[10, 0, 0, 2], &V6, &peer6] {
                    let base = frame(dmac, vlan, dst);
                    // The base frame, then each bit of the MAC, the EtherType
                    // and the IPv4 destination's bytes flipped in turn.
                    let mut variants = vec![base.clone()];
                    for at in (0..6).chain(12..14).chain(16..18).chain(30..34) {
                        for bit in 0..8 {
                            let mut f = base.clone();
                            f[at] ^= 1 << bit;
                            variants.push(f);
                        }
                    }
                    for f in &variants {
                        for len in 0..=f.len() {
                            for n in [&nic, &bare] {
                                assert_eq!(n.is_local(&f[..len]), n.is_local_general(&f[..len]), "{:02x?}", &f[..len]);
                                checked += 1;
                            }
                        }
                    }
                }
            }
        }
        assert!(checked > 10_000);
    }

    /// The completion counters come out as they did with one locked add
    /// per completion: delivered (overruns included), overruns, orphans.
    #[test]
    fn completion_counters_count_every_outcome() {
        let nic = nic();
        nic.attach_cq(Arc::new(CqRing::new(CqId(5), 2, None)));
        let c = |cq: u32, wr_id| Completion::error(CqId(cq), 0x11, wr_id, WcOpcode::Send, WcStatus::WrFlushErr);
        let cqs = nic.cqs.read().unwrap();
        let mut tally = Delivered::default();
        let mut signals = CqSignals::new();
        for wr_id in 0..3 {
            nic.deliver_to(&cqs, c(5, wr_id), &mut tally, &mut signals);
        }
        nic.deliver_to(&cqs, c(6, 9), &mut tally, &mut signals);
        tally.overruns += signals.finish() as u64;
        drop(signals);
        drop(cqs);
        let counts = || ["completions", "cq_overruns", "completions_orphaned"].map(|k| nic.stats.iter().find(|(n, _)| *n == k).unwrap().1);
        assert_eq!(counts(), [0, 0, 0], "counted once per batch, at its end");
        tally.count(&nic.stats);
        assert_eq!(counts(), [3, 1, 1]);
        nic.deliver(c(6, 10));
        assert_eq!(counts(), [3, 1, 2], "a single delivery is counted at once");
    }

    /// A batch's completions land in their own CQs, in order, whether the
    /// CQ is looked up or taken from the run being gathered; an unknown CQ
    /// in the middle of a run is an orphan and does not end up in the run's.
    #[test]
    fn a_batch_delivers_each_completion_to_its_cq_in_order() {
        let nic = nic();
        let (five, seven) = (Arc::new(CqRing::new(CqId(5), 64, None)), Arc::new(CqRing::new(CqId(7), 64, None)));
        nic.attach_cq(five.clone());
        nic.attach_cq(seven.clone());
        let order = [5, 5, 7, 5, 7, 7, 9, 7, 5, 5, 5];
        let cqs = nic.cqs.read().unwrap();
        let mut tally = Delivered::default();
        let mut signals = CqSignals::new();
        for (wr_id, &cq) in order.iter().enumerate() {
            let c = Completion::error(CqId(cq), 0x11, wr_id as u64, WcOpcode::Send, WcStatus::WrFlushErr);
            nic.deliver_to(&cqs, c, &mut tally, &mut signals);
        }
        assert_eq!(signals.finish(), 0);
        drop(signals);
        drop(cqs);
        assert_eq!((tally.delivered, tally.orphaned), (10, 1));
        for (ring, id) in [(&five, 5), (&seven, 7)] {
            let mut out = [rocev2::transport::wr::WorkCompletion::default(); 16];
            let n = ring.poll(&mut out);
            let expected: Vec<u64> = order.iter().enumerate().filter(|(_, &c)| c == id).map(|(i, _)| i as u64).collect();
            assert_eq!(out[..n].iter().map(|w| w.wr_id).collect::<Vec<_>>(), expected, "CQ {id}");
        }
    }

    /// A NIC on an in-memory hub (kept alive by the caller) and a peer port
    /// on the same hub.
    fn nic_and_peer() -> (Arc<MemHub>, Nic, MemPort) {
        let hub = MemHub::new(3);
        let engine = Engine::new(EngineConfig::default(), Arc::new(MemoryTable::new()));
        let nic = Nic::new(engine, Box::new(hub.attach(MAC, 1500, Default::default())), 16);
        let peer = hub.attach(OTHER_MAC, 1500, Default::default());
        (hub, nic, peer)
    }

    /// The peer sends the NIC one IPv4 RoCE frame.
    fn send_v4_frame(peer: &mut MemPort) {
        let f = frame(MAC, false, &V4);
        assert!(peer
            .transmit_with(&mut |buf: &mut [u8]| {
                buf[..f.len()].copy_from_slice(&f);
                Some(f.len())
            })
            .unwrap());
    }

    #[test]
    fn serve_takes_only_waiting_work_and_never_waits() {
        let (_hub, nic, mut peer) = nic_and_peer();
        let served = || nic.stats.served_polls.load(Ordering::Relaxed);
        nic.poll();
        assert!(!nic.work_pending(0), "nothing waits after a poll");
        assert_eq!(nic.serve(0..1), 0);
        assert_eq!(served(), 0, "no poll without work");

        send_v4_frame(&mut peer);
        assert!(nic.work_pending(0), "a received frame waits");
        // Another thread in an iteration (here: this one, holding the
        // engine): serving does not wait for it and leaves the frame.
        nic.with_engine_of(0, |_| assert_eq!(nic.serve(0..1), 0));
        assert!(nic.work_pending(0));

        assert_eq!(nic.since_driven(), None);
        assert!(nic.serve(0..1) > 0, "the frame is taken");
        assert!(!nic.work_pending(0));
        assert_eq!(served(), 1);
        assert_eq!(nic.stats.rx_frames.load(Ordering::Relaxed), 1);
        assert_eq!(nic.since_driven(), None, "serving is not the application driving");
        assert!(!nic.app_driving());

        nic.drive();
        assert!(nic.since_driven().is_some_and(|d| d < DRIVE_WINDOW) && nic.app_driving());
        nic.stop_driving();
        assert_eq!(nic.since_driven(), None);
    }

    /// The standing-back thread's looks read the clock only when their
    /// answer needs it, and then give what the clock-reading forms give.
    #[test]
    fn looks_read_the_clock_only_when_the_answer_needs_it() {
        let (_hub, nic, mut peer) = nic_and_peer();
        let no_read = &mut || -> Instant { panic!("the clock was read") };
        nic.poll();
        assert_eq!(shard_timer(&nic), u64::MAX, "no timer armed");
        assert!(!nic.work_pending_with(0, no_read), "nothing waits, no timer to compare");
        assert_eq!(nic.serve_with(0..1, no_read), 0);
        assert_eq!(nic.since_driven_with(no_read), None, "never driven");
        send_v4_frame(&mut peer);
        assert!(nic.work_pending_with(0, no_read), "a received frame waits");

        // Without a datapath thread the drive keeps its start's stamp.
        let before = nic.now().as_nanos();
        nic.drive();
        let at = nic.driven_at.load(Ordering::Relaxed);
        assert!(at >= before.max(1));
        let later = &mut || Instant::from_nanos(at + 5_000);
        assert_eq!(nic.since_driven_with(later), Some(std::time::Duration::from_micros(5)));
        let earlier = &mut || Instant::from_nanos(at - 1);
        assert_eq!(nic.since_driven_with(earlier), Some(std::time::Duration::ZERO), "saturates");
        {
            let _in = InDrive::enter(&nic.in_drive);
            assert_eq!(nic.since_driven_with(no_read), Some(std::time::Duration::ZERO), "in a drive");
        }
        // A due timer is seen with the clock read given.
        nic.shards[0].next_timer.store(1_000, Ordering::Relaxed);
        assert!(!nic.work_pending_with(0, &mut || Instant::from_nanos(999)));
        assert!(nic.work_pending_with(0, &mut || Instant::from_nanos(1_000)));
    }

    fn shard_timer(nic: &Nic) -> u64 {
        nic.shards[0].next_timer.load(Ordering::Relaxed)
    }

    /// The doorbell's protocol (`Nic::ring_qp`): a post that reads the
    /// flag still set rings nothing, so a drain that stops at a WR claimed
    /// and not yet published rings again, and the next poll takes the WR.
    /// (The QP has no engine state: the engine refuses the WR, counted.)
    #[test]
    fn a_drain_that_stops_at_a_claimed_wr_rings_again() {
        use rocev2::transport::wqe::{PayloadRef, SendWrRef};
        use rocev2::transport::wr::{SendFlags, SendOp};
        let nic = nic();
        let rings = Arc::new(QpRings::new(0x20, CqId(1), CqId(1), crate::queues::WqBound::unshared(4), crate::queues::WqBound::unshared(4)));
        nic.attach_qp(rings.clone());
        let refused = || nic.stats.posts_refused.load(Ordering::Relaxed);
        // A post claims its slot, rings (the flag was clear), and is held
        // up before it publishes its WR.
        let pos = rings.send.claim().unwrap();
        nic.ring_qp(&rings);
        nic.poll();
        assert!(!rings.send.is_empty(), "the drain stopped at the claimed slot");
        assert!(rings.rung.load(Ordering::SeqCst), "and rang again");
        // Published now; the post would not ring again.
        let wr = SendWrRef { wr_id: 7, op: SendOp::Send, payload: PayloadRef::Inline(&[]), flags: SendFlags::SIGNALED, ud: None };
        // SAFETY: `pos` was claimed above and not published.
        unsafe { rings.send.publish(pos, &wr) };
        nic.poll();
        assert!(rings.send.is_empty(), "taken at the next poll");
        assert_eq!(refused(), 1);
        assert!(!rings.rung.load(Ordering::SeqCst), "nothing left: not rung again");
        // A later post finds the flag clear and rings with the swap.
        assert!(rings.send.push(&wr));
        nic.ring_qp(&rings);
        assert!(rings.rung.load(Ordering::SeqCst));
        nic.poll();
        assert_eq!((refused(), rings.send.is_empty()), (2, true));
    }

    /// The same protocol for the receive rings, a QP's own and an SRQ's: a
    /// drain that stops at a receive WR claimed and not yet published rings
    /// again, and the next poll takes the WR, once. (No engine QP or SRQ
    /// behind the rings: the engine refuses each WR, counted.)
    #[test]
    fn a_drain_that_stops_at_a_claimed_receive_wr_rings_again() {
        use rocev2::transport::wqe::RecvWrRef;
        let nic = nic();
        let rings = Arc::new(QpRings::new(0x21, CqId(1), CqId(1), crate::queues::WqBound::unshared(4), crate::queues::WqBound::unshared(4)));
        nic.attach_qp(rings.clone());
        let srq = Arc::new(SrqRing::new(SrqId(0x22), crate::queues::WqBound::unshared(4)));
        nic.attach_srq(srq.clone());
        let refused = || nic.stats.posts_refused.load(Ordering::Relaxed);
        let wr = RecvWrRef { wr_id: 7, sgl: &[] };
        let (pos, srq_pos) = (rings.recv.claim().unwrap(), srq.recv.claim().unwrap());
        nic.ring_qp(&rings);
        nic.ring_srq(&srq);
        nic.poll();
        assert!(!rings.recv.is_empty() && !srq.recv.is_empty(), "the drains stopped at the claimed slots");
        assert!(rings.rung.load(Ordering::SeqCst) && srq.rung.load(Ordering::SeqCst), "and rang again");
        assert_eq!(refused(), 0);
        // SAFETY: `pos` and `srq_pos` were claimed above and not published.
        unsafe {
            rings.recv.publish(pos, &wr);
            srq.recv.publish(srq_pos, &wr);
        }
        nic.poll();
        assert!(rings.recv.is_empty() && srq.recv.is_empty(), "taken at the next poll");
        assert_eq!(refused(), 2, "each WR once");
        assert!(!rings.rung.load(Ordering::SeqCst) && !srq.rung.load(Ordering::SeqCst), "nothing left: not rung again");
        nic.poll();
        assert_eq!(refused(), 2);
    }

    /// A received frame goes into the engine the same way whether the
    /// receive takes its short path (one shard, not capturing, no doorbell
    /// rung) or `receive_frame` (capturing; a doorbell rung during the
    /// poll): counted once by the NIC and once by the engine, with the same
    /// verdict, and written to the capture only while capturing.
    #[test]
    fn both_receive_paths_hand_a_frame_to_the_engine_once() {
        use rocev2::transport::wqe::{PayloadRef, SendWrRef};
        use rocev2::transport::wr::{SendFlags, SendOp};
        let (_hub, nic, mut peer) = nic_and_peer();
        let counts = || {
            let nic_rx = nic.stats.rx_frames.load(Ordering::Relaxed);
            nic.with_engine_of(0, |e| (nic_rx, e.stats().rx_frames, e.stats().rx_bad_frame.values().sum::<u64>()))
        };
        let pcap = std::env::temp_dir().join(format!("urnic-nic-receive-paths-{}.pcap", std::process::id()));
        let captured = || std::fs::metadata(&pcap).map(|m| m.len()).unwrap_or(0);

        // The short path.
        send_v4_frame(&mut peer);
        nic.poll();
        assert_eq!(counts(), (1, 1, 1));

        // Capturing: the general path, the frame in the file.
        nic.set_capture(Some(&pcap)).unwrap();
        send_v4_frame(&mut peer);
        nic.poll();
        assert_eq!(counts(), (2, 2, 2));
        nic.set_capture(None).unwrap();
        // The pcap file header (24 bytes), one record header (16) and the frame.
        let one = captured();
        assert_eq!(one, 24 + 16 + frame(MAC, false, &V4).len() as u64, "captured");

        // A doorbell rung while the frame is received: a drain that stops
        // at a claimed, unpublished WR rings again, so the receive finds it
        // rung (the general path) and drains again before the frame.
        let rings = Arc::new(QpRings::new(0x20, CqId(1), CqId(1), crate::queues::WqBound::unshared(4), crate::queues::WqBound::unshared(4)));
        nic.attach_qp(rings.clone());
        let pos = rings.send.claim().unwrap();
        nic.ring_qp(&rings);
        send_v4_frame(&mut peer);
        nic.poll();
        assert!(rings.rung.load(Ordering::SeqCst), "still rung after the poll");
        assert_eq!(counts(), (3, 3, 3));
        assert_eq!(captured(), one, "nothing captured once capture is off");
        let wr = SendWrRef { wr_id: 7, op: SendOp::Send, payload: PayloadRef::Inline(&[]), flags: SendFlags::SIGNALED, ud: None };
        // SAFETY: `pos` was claimed above and not published.
        unsafe { rings.send.publish(pos, &wr) };
        nic.poll();
        let _ = std::fs::remove_file(&pcap);
    }

    #[test]
    fn take_over_never_waits_for_an_iteration_in_progress() {
        let (_hub, nic, mut peer) = nic_and_peer();
        let takeovers = || nic.stats.takeover_polls.load(Ordering::Relaxed);
        send_v4_frame(&mut peer);
        // The application in an iteration (here: this thread, holding the
        // engine): the thread does not wait, polls nothing, counts nothing.
        nic.with_engine_of(0, |_| assert_eq!(nic.take_over(0..1), None));
        assert_eq!(takeovers(), 0);
        assert!(nic.work_pending(0), "the frame still waits");
        assert!(nic.take_over(0..1).is_some_and(|w| w > 0), "the frame is taken");
        assert_eq!(nic.stats.rx_frames.load(Ordering::Relaxed), 1);
        assert_eq!(nic.take_over(0..1), Some(0), "an idle iteration");
        assert_eq!(takeovers(), 2);
        assert_eq!(nic.since_driven(), None, "taking over is not the application driving");
    }
}
