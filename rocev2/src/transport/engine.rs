//! The engine: one device's QPs and SRQs, driven sans-IO.
//!
//! The engine owns the QP table, dispatches received frames by BTH DestQP
//! (DestQP 0xFFFFFF: to every QP attached to the destination IP's
//! multicast group, [`Engine::attach_mcast`], `mcast`),
//! keeps the ready list (QPs that may have something to send) and the timer
//! queue. Everything protocol-specific lives beside it, in rxe's split:
//! `qp` (QP object, `ibv_modify_qp` rules), `requester`,
//! `completer`, `responder`, [`memory`](super::memory), `recv`, `dcqcn`.
//!
//! # Calling contract
//!
//! The engine does no I/O, reads no clock and spawns nothing: the caller
//! (the datapath's polling loop, the simulator, a test, an appliance's own
//! run-to-completion loop) owns the wire and the time, as with quinn-proto's
//! `Connection`. The calls fall into five groups:
//!
//! - **Getters** ([`Engine::stats`], [`Engine::qp_stats`],
//!   [`Engine::query_qp`], [`Engine::qp_state`], [`Engine::qpns`],
//!   [`Engine::qp_dcqcn`], [`Engine::memory`]) change nothing.
//! - **Verbs** ([`Engine::create_qp`], [`Engine::modify_qp`],
//!   [`Engine::post_send`], [`Engine::post_recv`], [`Engine::create_srq`], …)
//!   validate their arguments first: on `Err` nothing changed. A post may
//!   make a QP ready to send; call `poll_transmit` afterwards.
//! - **Input**: [`Engine::handle_frame`] for every received frame (never
//!   panics; a refused frame changes only a drop counter) and
//!   [`Engine::handle_timeout`] once `now` has reached
//!   [`Engine::next_timeout`].
//! - **Output**: after any call above, drain [`Engine::poll_transmit`] (one
//!   whole frame per call, responses before requests, round-robin over QPs;
//!   except that the ACK of a whole SEND or WRITE is held for its QP's next
//!   request frame and follows it, or leaves by [`EngineConfig::ack_hold`]:
//!   keep calling `handle_timeout` at `next_timeout`) until it returns
//!   `None`, then [`Engine::poll_completion`] and
//!   [`Engine::poll_event`]. Each work request produces exactly one
//!   completion (success or error) unless it was posted unsignaled and
//!   succeeded.
//! - **Time**: every `now` passed in is monotonic (an earlier `now` than one
//!   already seen is treated as that one). `next_timeout` may be earlier than
//!   the real deadline (a stale timer entry) but never later; calling
//!   `handle_timeout` early is harmless.
//!
//! Received frames pass the checks of rxe's `rxe_rcv` before any QP sees
//! them (ICRC and headers in `wire`, then service, state, peer address and
//! P_Key here): a connected QP hears only its peer.

use std::borrow::Borrow;
use std::cmp::Reverse;

use crate::hash::IntMap;
use crate::transport::dcqcn::{DcqcnParams, ReactionPoint};
pub use crate::transport::events::{AsyncEvent, EngineError, EngineStats, WireErrorKind};
use crate::transport::qp::{emit_cnp, flush_completion, flush_responder, from_peer, req_ctx, req_parts, resp_parts, Qp};
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

use crate::cm::{Cm, GSI_QPN};
use crate::time::Instant;
use crate::transport::attr::{QpAttr, QpAttrMask, QpInitAttr, QpState, QpType, SrqId};
use crate::transport::gsi::Gsi;
use crate::transport::ids::PdId;
use crate::transport::mcast::{is_multicast_gid, McastLimits, McastTable, MULTICAST_QPN};
use crate::transport::memory::MemoryTable;
use crate::transport::recv::RecvQueue;
use crate::transport::requester::SqFatal;
use crate::transport::responder::{Placed, Placement, ResponderOutcome};
use crate::transport::retired::RetiredCount;
use crate::transport::stats::QpStats;
use crate::transport::wqe::{RecvSource, RecvWqe, SendSource, SendWqe};
use crate::transport::wr::{Completion, WcOpcode};
use crate::wire::{parse_frame_deferring, IcrcCheck, MacAddr, Opcode, ParsedFrame, Service, VlanTag};

/// Room for an ACK framed outside `poll_transmit` (Ethernet, 802.1Q, IPv6,
/// UDP, BTH, AETH and ICRC take 98 bytes).
const PARTING_FRAME: usize = 128;

/// Engine configuration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineConfig {
    /// First QPN handed out (rxe starts at 0x11; 0 and 1 are special QPs).
    pub first_qpn: u32,
    /// Most QPs at once.
    pub max_qps: u32,
    /// Most SRQs at once.
    pub max_srqs: u32,
    /// This engine is shard `.0` of `.1`: it hands out only QPNs and SRQ ids
    /// `x` with `x % .1 == .0`, so a frame's QPN names its shard. (0, 1):
    /// unsharded.
    pub shard: (u32, u32),
    /// DCQCN congestion control for every QP (`enabled: false` switches the
    /// reaction point off device-wide; CNPs are still sent and counted).
    pub dcqcn: DcqcnParams,
    /// UD multicast limits (of this engine's attachments).
    pub mcast: McastLimits,
    /// How long the ACK of a whole SEND or WRITE may wait for its QP's next
    /// request frame (the application's reply) to leave right behind it
    /// (the responder's "held ACKs"); zero sends every ACK at once. Keep it
    /// far below the peers' local ACK timeout (IBTA 9.7.6.1.3: 4.096 µs ×
    /// 2^timeout; 14, 67 ms, is usual).
    pub ack_hold: core::time::Duration,
}

/// [`EngineConfig::ack_hold`]'s default: several times an application's
/// answer to a completion on a polling core, far below any ACK timeout in
/// use.
pub const DEFAULT_ACK_HOLD: core::time::Duration = core::time::Duration::from_micros(8);

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            first_qpn: 0x11,
            max_qps: 4096,
            max_srqs: 1024,
            shard: (0, 1),
            dcqcn: DcqcnParams::default(),
            mcast: McastLimits::default(),
            ack_hold: DEFAULT_ACK_HOLD,
        }
    }
}

impl EngineConfig {
    fn in_shard(&self, x: u32) -> bool {
        let (i, n) = self.shard;
        n <= 1 || x % n == i
    }
}

/// A device's transport engine.
pub struct Engine {
    config: EngineConfig,
    memory: Arc<MemoryTable>,
    qps: IntMap<u32, Qp>,
    /// QPNs in creation order.
    order: Vec<u32>,
    next_qpn: u32,
    srqs: IntMap<SrqId, RecvQueue>,
    next_srq: u32,
    completions: VecDeque<Completion>,
    events: VecDeque<AsyncEvent>,
    stats: EngineStats,
    /// Per-QP deadlines (retransmission, RNR, pacing, a held ACK), earliest
    /// first. Entries are not removed one by one: a QP whose deadline moved
    /// keeps a stale entry that is re-checked when it comes up (lazy
    /// deletion), so an ACK costs nothing here and a timer costs O(log n)
    /// once; stale entries are swept in place when the heap is full
    /// ([`Engine::arm`]), so it grows only with the number of QPs.
    timers: BinaryHeap<Reverse<(Instant, u32)>>,
    /// The latest `now` the engine was given (pacing deadlines in the past
    /// are not timers).
    last_now: Instant,
    /// QP1 and the CM agent, where this engine runs them ([`Engine::enable_cm`]).
    gsi: Option<Box<Gsi>>,
    /// QPs that may have something to send, in round-robin order. A QP is
    /// put here by every event that can give it work (a post, a received
    /// frame, a timer, a state change) and leaves when it has nothing to
    /// send: transmit costs O(active QPs), not O(all QPs).
    ready: VecDeque<u32>,
    /// QPs whose held ACK's deadline has passed and whose requester had
    /// nothing to send: their ACKs leave after every other frame
    /// (`poll_transmit`).
    late_acks: Vec<u32>,
    /// ACKs of QPs destroyed, reset or moved to ERR while holding them,
    /// framed at that moment, for the next `poll_transmit`.
    parting: VecDeque<Vec<u8>>,
    /// UD multicast groups and their attached QPs.
    mcast: McastTable,
}

impl Engine {
    /// A new engine using `memory` for all its QPs.
    pub fn new(config: EngineConfig, memory: Arc<MemoryTable>) -> Engine {
        Engine {
            config,
            memory,
            qps: IntMap::default(),
            order: Vec::new(),
            next_qpn: config.first_qpn.max(2),
            srqs: IntMap::default(),
            next_srq: 1,
            completions: VecDeque::new(),
            events: VecDeque::new(),
            stats: EngineStats::default(),
            timers: BinaryHeap::new(),
            last_now: Instant::ZERO,
            gsi: None,
            ready: VecDeque::new(),
            late_acks: Vec::with_capacity(16),
            parting: VecDeque::new(),
            mcast: McastTable::default(),
        }
    }

    /// Run QP1 and the CM agent `cm` in this engine (one engine per device:
    /// the shard that owns QPN 1), on a port with MAC `mac`.
    pub fn enable_cm(&mut self, cm: Cm, mac: MacAddr, vlan: Option<VlanTag>) {
        self.gsi = Some(Box::new(Gsi::new(cm, mac, vlan)));
    }

    /// QP1, if this engine runs it: the CM agent's calls (`gsi.cm.connect`,
    /// `accept`, ...), its events, and the peer MACs MADs go to. After a
    /// call, drain [`Engine::poll_transmit`] as after a post.
    pub fn gsi(&mut self) -> Option<&mut Gsi> {
        self.gsi.as_deref_mut()
    }

    /// The registered memory shared by this engine's QPs.
    pub fn memory(&self) -> &Arc<MemoryTable> {
        &self.memory
    }

    /// Engine-wide counters.
    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    /// Switch DCQCN's reaction point on or off for one QP (the device
    /// default comes from [`EngineConfig::dcqcn`]).
    pub fn set_qp_dcqcn(&mut self, qpn: u32, enabled: bool) -> Result<(), EngineError> {
        let qp = self.qps.get_mut(&qpn).ok_or(EngineError::NoSuchQp(qpn))?;
        let params = DcqcnParams { enabled, ..*qp.rp.params() };
        qp.rp = ReactionPoint::new(params);
        self.wake(qpn);
        Ok(())
    }

    /// The DCQCN reaction point of a QP (its current rate, α, counters).
    pub fn qp_dcqcn(&self, qpn: u32) -> Option<&ReactionPoint> {
        self.qps.get(&qpn).map(|q| &q.rp)
    }

    /// The QPNs of every QP, in creation order.
    pub fn qpns(&self) -> impl Iterator<Item = u32> + '_ {
        self.order.iter().copied()
    }

    /// Counters of one QP.
    pub fn qp_stats(&self, qpn: u32) -> Option<&QpStats> {
        self.qps.get(&qpn).map(|q| &q.stats)
    }

    /// Create a QP in RESET; returns its QPN.
    pub fn create_qp(&mut self, init: &QpInitAttr) -> Result<u32, EngineError> {
        if self.qps.len() >= self.config.max_qps as usize {
            return Err(EngineError::TooMany);
        }
        let mut qpn = self.next_qpn;
        while self.qps.contains_key(&qpn) || qpn < 2 || !self.config.in_shard(qpn) {
            qpn = (qpn + 1) & 0x00ff_ffff;
        }
        self.create_qp_with_qpn(init, qpn)?;
        self.next_qpn = (qpn + 1) & 0x00ff_ffff;
        Ok(qpn)
    }

    /// Create a QP with a chosen QPN (tests replaying captures, tools that
    /// must match a peer's expectations).
    pub fn create_qp_with_qpn(&mut self, init: &QpInitAttr, qpn: u32) -> Result<(), EngineError> {
        if !(2..=0x00ff_ffff).contains(&qpn) {
            return Err(EngineError::BadValue("QPN must be in 2..=0xffffff"));
        }
        if self.qps.contains_key(&qpn) {
            return Err(EngineError::BadValue("QPN in use"));
        }
        if self.qps.len() >= self.config.max_qps as usize {
            return Err(EngineError::TooMany);
        }
        if let Some(s) = init.srq {
            if !self.srqs.contains_key(&s) {
                return Err(EngineError::NoSuchSrq(s));
            }
        }
        if init.cap.max_send_wr == 0 {
            return Err(EngineError::BadValue("max_send_wr must be at least 1"));
        }
        self.qps.insert(qpn, Qp::new(qpn, init, self.config.dcqcn));
        self.order.push(qpn);
        Ok(())
    }

    /// Destroy a QP. Outstanding WRs are dropped with it, as `ibv_destroy_qp`
    /// does (move it to ERR first to have them flushed).
    pub fn destroy_qp(&mut self, qpn: u32) -> Result<(), EngineError> {
        self.part_with_held_ack(qpn);
        self.qps.remove(&qpn).ok_or(EngineError::NoSuchQp(qpn))?;
        self.order.retain(|&q| q != qpn);
        self.mcast.detach_all(qpn);
        Ok(())
    }

    /// `ibv_attach_mcast`: UD QP `qpn` joins multicast group `gid` (an
    /// IPv4-mapped 224.0.0.0/4 or an ff00::/8 GID). From now on every frame
    /// to the group is delivered to it too, checked as if addressed to it
    /// (state, P_Key, Q_Key). `Ok(false)`: it already was attached (nothing
    /// changes, as rxe answers). Errors: no such QP, not a UD QP or not a
    /// multicast GID (kernel `ib_attach_mcast`: EINVAL), a limit of
    /// [`EngineConfig::mcast`] reached.
    pub fn attach_mcast(&mut self, qpn: u32, gid: [u8; 16]) -> Result<bool, EngineError> {
        let qp = self.qps.get(&qpn).ok_or(EngineError::NoSuchQp(qpn))?;
        if qp.init.qp_type != QpType::Ud {
            return Err(EngineError::BadValue("multicast needs a UD QP"));
        }
        self.mcast.attach(qpn, gid, &self.config.mcast)
    }

    /// `ibv_detach_mcast`: `qpn` leaves group `gid`; frames to the group
    /// already received are delivered, none after the call. An error if the
    /// QP is not attached to it.
    pub fn detach_mcast(&mut self, qpn: u32, gid: &[u8; 16]) -> Result<(), EngineError> {
        if !self.qps.contains_key(&qpn) {
            return Err(EngineError::NoSuchQp(qpn));
        }
        if !is_multicast_gid(gid) {
            return Err(EngineError::BadValue("not a multicast GID (IPv4-mapped 224.0.0.0/4 or ff00::/8)"));
        }
        self.mcast.detach(qpn, gid)
    }

    /// The multicast groups and their members.
    pub fn mcast(&self) -> &McastTable {
        &self.mcast
    }

    /// `ibv_query_qp`.
    pub fn query_qp(&self, qpn: u32) -> Result<QpAttr, EngineError> {
        self.qps.get(&qpn).map(Qp::query).ok_or(EngineError::NoSuchQp(qpn))
    }

    /// The QP's state.
    pub fn qp_state(&self, qpn: u32) -> Result<QpState, EngineError> {
        self.qps.get(&qpn).map(|q| q.state).ok_or(EngineError::NoSuchQp(qpn))
    }

    /// `ibv_modify_qp`: validate the mask and values for the transition, then
    /// apply. On error nothing changes.
    pub fn modify_qp(&mut self, qpn: u32, attr: &QpAttr, mask: QpAttrMask) -> Result<(), EngineError> {
        let r = self.modify_qp_inner(qpn, attr, mask);
        self.arm(qpn);
        self.wake(qpn);
        r
    }

    fn modify_qp_inner(&mut self, qpn: u32, attr: &QpAttr, mask: QpAttrMask) -> Result<(), EngineError> {
        if mask.contains(QpAttrMask::STATE) && matches!(attr.qp_state, QpState::Reset | QpState::Err) {
            self.part_with_held_ack(qpn);
        }
        let qp = self.qps.get_mut(&qpn).ok_or(EngineError::NoSuchQp(qpn))?;
        let (from, to) = qp.modify(attr, mask)?;
        if from != to {
            tracing::debug!(qpn, ?from, ?to, "QP state");
        }
        if from != QpState::Err && to == QpState::Err {
            self.enter_error(qpn, false);
        }
        Ok(())
    }

    /// Move a QP to ERR and flush its queues (each WR completes once with
    /// `WR_FLUSH_ERR`). `fatal`: raised by the QP itself, not by modify.
    fn enter_error(&mut self, qpn: u32, fatal: bool) {
        // A responder NAK or flush may still have to go out.
        self.wake(qpn);
        let Some(qp) = self.qps.get_mut(&qpn) else { return };
        qp.state = QpState::Err;
        qp.responder.release_hold();
        {
            let (requester, mut ctx) = req_ctx(qp, &self.memory, &mut self.completions);
            requester.flush(&mut ctx);
        }
        if qp.responder.has_pending() && fatal {
            // Let the NAK out first; poll_transmit flushes afterwards.
            qp.responder_flush_pending = true;
        } else {
            flush_responder(qp, &self.memory, &mut self.srqs, &mut self.completions, &mut self.events);
        }
        if fatal {
            tracing::debug!(qpn, "QP state: error (fatal, raised by the QP)");
            self.events.push_back(AsyncEvent::QpFatal(qpn));
        }
    }

    /// `ibv_create_srq`.
    pub fn create_srq(&mut self, pd: PdId, max_wr: u32, max_sge: u32) -> Result<SrqId, EngineError> {
        if self.srqs.len() >= self.config.max_srqs as usize {
            return Err(EngineError::TooMany);
        }
        if max_wr == 0 {
            return Err(EngineError::BadValue("max_wr must be at least 1"));
        }
        let mut n = self.next_srq;
        while n == 0 || self.srqs.contains_key(&SrqId(n)) || !self.config.in_shard(n) {
            n = n.wrapping_add(1);
        }
        let id = SrqId(n);
        self.next_srq = n.wrapping_add(1);
        self.srqs.insert(id, RecvQueue::new_srq(id, pd, max_wr, max_sge));
        Ok(id)
    }

    /// `ibv_modify_srq` with `IBV_SRQ_LIMIT`: arm the limit event.
    pub fn modify_srq(&mut self, srq: SrqId, srq_limit: u32) -> Result<(), EngineError> {
        let q = self.srqs.get_mut(&srq).ok_or(EngineError::NoSuchSrq(srq))?;
        q.set_limit(srq_limit).map_err(|_| EngineError::BadValue("srq_limit above the SRQ depth"))
    }

    /// `ibv_destroy_srq`; refused while a QP uses it.
    pub fn destroy_srq(&mut self, srq: SrqId) -> Result<(), EngineError> {
        if self.qps.values().any(|q| q.init.srq == Some(srq)) {
            return Err(EngineError::Busy);
        }
        self.srqs.remove(&srq).map(|_| ()).ok_or(EngineError::NoSuchSrq(srq))
    }

    /// `ibv_post_send`. Posting on a QP in ERR completes the WR at once with
    /// `WR_FLUSH_ERR`, as ibverbs providers do.
    /// Takes a [`SendWr`](crate::transport::wr::SendWr) or a ready [`SendWqe`].
    pub fn post_send(&mut self, qpn: u32, wr: impl Into<SendWqe>) -> Result<(), EngineError> {
        self.post_send_boxed(qpn, Box::new(wr.into()))
    }

    /// [`post_send`](Self::post_send) of a WQE already in a box: the box is
    /// kept (no copy of the WQE) and, once the WQE is reaped, handed back by
    /// [`recycle_send_wqes`](Self::recycle_send_wqes) for the next post.
    pub fn post_send_boxed(&mut self, qpn: u32, wr: Box<SendWqe>) -> Result<(), EngineError> {
        let (mut wr, mut refused) = (Some(wr), None);
        self.post_send_batch(qpn, || wr.take(), |_, _, e| refused = Some(e));
        refused.map_or(Ok(()), Err)
    }

    /// [`post_send_boxed`](Self::post_send_boxed) of every WQE `next` yields,
    /// in order (a doorbell's drain takes its send WQEs the same way, in
    /// [`drain_posts`](Self::drain_posts)): the QP is looked up, and
    /// its timer armed and the QP woken, once for the batch instead of once a
    /// WR. Each WQE gets exactly what `post_send_boxed` would give it; one the
    /// engine refuses goes to `refused` (its `wr_id`, completion opcode and
    /// why), and the batch goes on. Returns how many WQEs `next` yielded.
    pub fn post_send_batch(
        &mut self,
        qpn: u32,
        mut next: impl FnMut() -> Option<Box<SendWqe>>,
        mut refused: impl FnMut(u64, WcOpcode, EngineError),
    ) -> usize {
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return refuse_all(qpn, next, refused);
        };
        let (n, due) = post_sends(qp, self.last_now, &mut self.completions, &mut self.ready, &mut next, &mut refused);
        if let Some(t) = due {
            self.queue_timer(t, qpn);
        }
        n
    }

    /// A doorbell's drain of `qpn`'s posted work with one lookup of the QP:
    /// every receive WQE `recvs` lends, each as [`post_recv`](Self::post_recv)
    /// takes it (copied once, into the receive queue; one it refuses goes to
    /// `recv_refused` with its `wr_id`); then, with `sends`, the boxes of the
    /// send WQEs reaped since the last drain back to it (as
    /// [`recycle_send_wqes`](Self::recycle_send_wqes)) and every send WQE it
    /// yields, as [`post_send_batch`](Self::post_send_batch) takes them.
    /// Returns how many WQEs `recvs` and `sends` yielded.
    pub fn drain_posts(
        &mut self,
        qpn: u32,
        mut recvs: impl RecvSource,
        mut recv_refused: impl FnMut(u64, EngineError),
        sends: Option<&mut impl SendSource>,
        mut send_refused: impl FnMut(u64, WcOpcode, EngineError),
    ) -> usize {
        let mut n = 0;
        let Some(qp) = self.qps.get_mut(&qpn) else {
            while let Some(wr_id) = recvs.next_recv(|wr| wr.wr_id) {
                n += 1;
                recv_refused(wr_id, EngineError::NoSuchQp(qpn));
            }
            return n + sends.map_or(0, |s| refuse_all(qpn, || s.next_wqe(), send_refused));
        };
        let completions = &mut self.completions;
        while let Some(posted) = recvs.next_recv(|wr| post_recv_to(qp, completions, wr).map_err(|e| (wr.wr_id, e))) {
            n += 1;
            if let Err((wr_id, e)) = posted {
                recv_refused(wr_id, e);
            }
        }
        let Some(sends) = sends else { return n };
        qp.requester.take_spent().for_each(|b| sends.recycle(b));
        let (posted, due) = post_sends(qp, self.last_now, &mut self.completions, &mut self.ready, &mut || sends.next_wqe(), &mut send_refused);
        if let Some(t) = due {
            self.queue_timer(t, qpn);
        }
        n + posted
    }

    /// Hand `f` the boxes of `qpn`'s send WQEs reaped since the last call
    /// (see [`post_send_boxed`](Self::post_send_boxed)); nothing for an unknown QP.
    pub fn recycle_send_wqes(&mut self, qpn: u32, f: impl FnMut(Box<SendWqe>)) {
        if let Some(qp) = self.qps.get_mut(&qpn) {
            qp.requester.take_spent().for_each(f);
        }
    }

    /// `ibv_post_recv`. In ERR the WR completes at once with `WR_FLUSH_ERR`.
    /// Takes a [`RecvWr`](crate::transport::wr::RecvWr) or a ready [`RecvWqe`].
    pub fn post_recv(&mut self, qpn: u32, wr: impl Into<RecvWqe>) -> Result<(), EngineError> {
        let wr = wr.into();
        let qp = self.qps.get_mut(&qpn).ok_or(EngineError::NoSuchQp(qpn))?;
        post_recv_to(qp, &mut self.completions, wr)
    }

    /// `ibv_post_srq_recv`.
    pub fn post_srq_recv(&mut self, srq: SrqId, wr: impl Into<RecvWqe>) -> Result<(), EngineError> {
        let q = self.srqs.get_mut(&srq).ok_or(EngineError::NoSuchSrq(srq))?;
        post_srq_to(q, wr.into())
    }

    /// A doorbell's drain of an SRQ's posted receive WQEs with one lookup of
    /// the SRQ: each WQE `recvs` lends as
    /// [`post_srq_recv`](Self::post_srq_recv) takes it (copied once, into the
    /// SRQ); one it refuses goes to `refused` with its `wr_id`. How many
    /// WQEs `recvs` lent.
    pub fn drain_srq_posts(&mut self, srq: SrqId, mut recvs: impl RecvSource, mut refused: impl FnMut(u64, EngineError)) -> usize {
        let mut q = self.srqs.get_mut(&srq);
        let mut n = 0;
        while let Some(posted) = recvs.next_recv(|wr| match q.as_deref_mut() {
            Some(q) => post_srq_to(q, wr).map_err(|e| (wr.wr_id, e)),
            None => Err((wr.wr_id, EngineError::NoSuchSrq(srq))),
        }) {
            n += 1;
            if let Err((wr_id, e)) = posted {
                refused(wr_id, e);
            }
        }
        n
    }

    /// The counts of WQEs `qpn`'s send queue and its own receive queue
    /// (`None` with an SRQ) have retired: what a post path compares the WRs
    /// it accepted with, to refuse a post into a full queue at once (see
    /// [`RetiredCount`]). `None` for an unknown QP.
    pub fn qp_retired_counts(&self, qpn: u32) -> Option<(Arc<RetiredCount>, Option<Arc<RetiredCount>>)> {
        let qp = self.qps.get(&qpn)?;
        Some((qp.requester.retired().clone(), qp.rq.as_ref().map(|rq| rq.retired().clone())))
    }

    /// As [`Engine::qp_retired_counts`], for an SRQ.
    pub fn srq_retired_count(&self, srq: SrqId) -> Option<Arc<RetiredCount>> {
        self.srqs.get(&srq).map(|q| q.retired().clone())
    }

    /// Whether completions wait for [`Engine::poll_completion`].
    #[inline]
    pub fn has_completions(&self) -> bool {
        !self.completions.is_empty()
    }

    /// Next completion, in the order they happened.
    #[must_use]
    #[inline]
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.completions.pop_front()
    }

    /// Next asynchronous event.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<AsyncEvent> {
        self.events.pop_front()
    }

    /// A frame from the wire. Never panics; anything refused is counted.
    pub fn handle_frame(&mut self, now: Instant, frame: &[u8]) {
        self.last_now = self.last_now.max(now);
        self.stats.rx_frames += 1;
        // Parsed in place and dispatched from inside the parse: the headers
        // are written once, neither moved out of results nor copied in first.
        // An RDMA WRITE's continuation comes with its ICRC still to check
        // (`responder/placed.rs`): placed and checked in one pass, or checked
        // alone first.
        let len = frame.len();
        if let Err(e) = parse_frame_deferring(frame, |p, check| self.dispatch(now, p, len, check)) {
            self.count_bad_frame(e);
        }
    }

    /// A frame the parse refused, counted by reason. Out of line: the map's
    /// hashing inlined into `handle_frame` took the inlining budget the
    /// parse of every good frame needs.
    #[cold]
    #[inline(never)]
    fn count_bad_frame(&mut self, e: crate::wire::WireError) {
        *self.stats.rx_bad_frame.entry(e.into()).or_insert(0) += 1;
    }

    /// A parsed frame of `len` bytes to the GSI, a multicast group's
    /// members or its DestQP, ICRC-checked unless it comes with its `check`
    /// still to make (an RDMA WRITE's continuation: `handle_for_qp`). A bad
    /// ICRC found here or there is counted as the parse counts it, and
    /// nothing else happens.
    #[inline(always)]
    fn dispatch(&mut self, now: Instant, p: &ParsedFrame<'_>, len: usize, check: Option<&IcrcCheck<'_>>) {
        let bth = p.repr.transport.bth;
        let qpn = bth.dest_qp;
        if let Some(c) = check {
            if qpn == GSI_QPN || qpn == MULTICAST_QPN {
                // Never an RC QP's: checked before anything looks at it.
                if let Err(e) = c.verify() {
                    self.count_bad_frame(e);
                    return;
                }
            }
        }
        if qpn == GSI_QPN {
            // IBTA C9-42: the P_Key check applies to QP1 too; the GSI's own
            // checks (UD SEND only, GSI Q_Key, source QP 1) are in `gsi`.
            match self.gsi.as_deref_mut() {
                Some(g) if bth.pkey & 0x7fff == 0x7fff => g.handle_frame(now, p),
                Some(_) => self.stats.rx_bad_pkey += 1,
                None => self.stats.rx_unknown_qpn += 1,
            }
            return;
        }
        if qpn == MULTICAST_QPN {
            self.handle_mcast(now, p, len);
            return;
        }
        // An unknown DestQP is counted there (`rx_unknown_qpn`): one lookup.
        self.handle_for_qp(now, qpn, p, len, check);
    }

    /// A frame to DestQP 0xFFFFFF: one copy to each QP attached to the
    /// group its destination IP names (rxe `rxe_rcv_mcast_pkt`), each
    /// through the checks of an ordinary frame for that QP (service, state,
    /// P_Key, then the UD responder's Q_Key: IBTA C10-15, a copy with
    /// another QP's Q_Key is dropped by this one only). No member: dropped,
    /// counted (`rx_mcast_no_member`).
    fn handle_mcast(&mut self, now: Instant, p: &crate::wire::ParsedFrame<'_>, len: usize) {
        let gid = p.repr.ip.dst_gid();
        let Some(members) = self.mcast.take(&gid) else {
            self.stats.rx_mcast_no_member += 1;
            return;
        };
        self.stats.mcast_frames += 1;
        for &qpn in &members {
            self.handle_for_qp(now, qpn, p, len, None);
        }
        self.mcast.restore(&gid, members);
    }

    /// The per-QP part of `handle_frame`: rxe's `hdr_check` for `qpn`, then
    /// the requester or responder.
    ///
    /// A frame with its ICRC still to check (`check`: an RC WRITE
    /// continuation, `responder/placed.rs`) has it checked before anything
    /// else happens: with its placement, where the responder would accept
    /// the frame and place its payload (then the responder runs with the
    /// placement done), or alone (then the frame goes on as any other). A
    /// bad ICRC is counted as the parse counts it (`rx_bad_frame`), and
    /// nothing else changes: no refusal counted, no counter of the QP's, no
    /// CNP, no answer.
    fn handle_for_qp(&mut self, now: Instant, qpn: u32, p: &ParsedFrame<'_>, len: usize, check: Option<&IcrcCheck<'_>>) {
        // A bad ICRC: counted, and the frame goes no further.
        macro_rules! bad_icrc {
            ($e:expr) => {{
                self.count_bad_frame($e);
                return;
            }};
        }
        // A refusal: the ICRC first (if still to check), then the counter.
        macro_rules! refuse {
            ($counter:expr) => {{
                if let Some(Err(e)) = check.map(IcrcCheck::verify) {
                    bad_icrc!(e);
                }
                $counter += 1;
                return;
            }};
        }
        let bth = p.repr.transport.bth;
        let Some(qp) = self.qps.get_mut(&qpn) else { refuse!(self.stats.rx_unknown_qpn) };
        // The checks of rxe_recv.c `hdr_check`, in its order: service and
        // state (`check_type_state`), addresses (`check_addr`), keys
        // (`check_keys`). A frame refused here changes nothing but a counter.
        let is_cnp = bth.opcode == Opcode::CNP;
        let service_ok = match (qp.init.qp_type, bth.opcode.service()) {
            // DCQCN runs per connected QP: a UD QP has no peer a CNP could
            // come from, so a CNP for it is refused like any wrong service.
            (QpType::Rc | QpType::Uc, _) if is_cnp => true,
            (QpType::Rc, Service::Rc) | (QpType::Uc, Service::Uc) | (QpType::Ud, Service::Ud) => !is_cnp,
            _ => false,
        };
        if !service_ok {
            refuse!(self.stats.rx_wrong_service);
        }
        // rxe check_type_state: requests (and CNPs) from RTR on, responses
        // only once we send (RTS, SQD, SQE); nothing in RESET, INIT or ERR.
        let state_ok = if bth.opcode.is_response() {
            matches!(qp.state, QpState::Rts | QpState::Sqd | QpState::Sqe)
        } else {
            matches!(qp.state, QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe)
        };
        if !state_ok {
            refuse!(self.stats.rx_wrong_state);
        }
        // rxe check_addr: a connected QP hears only its peer. The IP source
        // must be the QP's destination GID and the IP destination its source
        // GID, so a stranger on the segment cannot inject requests, responses
        // or CNPs even with the right QPN, PSN and keys.
        if qp.init.qp_type != QpType::Ud && !from_peer(qp.attr.ah_attr.as_ref(), &p.repr.ip) {
            refuse!(self.stats.rx_wrong_peer);
        }
        // IBTA 9.6.1.1 (C9-42), rxe check_keys: the P_Key must match the QP's
        // partition (0xffff; the membership bit is ignored).
        if bth.pkey & 0x7fff != 0x7fff {
            refuse!(self.stats.rx_bad_pkey);
        }
        // The frame passed `hdr_check`: an RC WRITE continuation is placed
        // with its ICRC checked where the responder would certainly accept
        // it and place its payload (its own checks, then the memo), or has
        // its ICRC checked alone. Either way the verdict comes before the
        // counters and the DCQCN notification point below.
        let mut placement = Placement::ToDo;
        if let Some(c) = check {
            let has_rq = qp.rq.is_some() || qp.init.srq.is_some_and(|id| self.srqs.contains_key(&id));
            let placed = if has_rq && qp.init.qp_type == QpType::Rc {
                qp.responder.place_write_continuation(&qp.attr, qp.init.pd, qpn, &self.memory, p, c)
            } else {
                Placed::NotTaken
            };
            match placed {
                Placed::Done => {
                    self.stats.rx_icrc_at_placement += 1;
                    placement = Placement::Done;
                }
                Placed::BadIcrc(e) => bad_icrc!(e),
                Placed::NotTaken => {
                    if let Err(e) = c.verify() {
                        bad_icrc!(e);
                    }
                }
            }
        }
        if is_cnp {
            // DCQCN reaction point: a CNP from the peer cuts this QP's rate.
            self.stats.rx_cnps += 1;
            qp.stats.rp_cnps_received += 1;
            qp.rp.on_cnp(now);
            self.arm(qpn);
            self.wake(qpn);
            return;
        }
        qp.stats.rx_packets += 1;
        qp.stats.rx_bytes += len as u64;
        // DCQCN notification point: CE-marked packets of a connected QP are
        // answered with a CNP to the peer QP, at most one per interval.
        let ce = match p.repr.ip {
            crate::wire::IpRepr::V4(v4) => v4.ecn == 3,
            crate::wire::IpRepr::V6(v6) => v6.traffic_class & 3 == 3,
        };
        if ce && qp.init.qp_type != QpType::Ud {
            qp.stats.np_ce_received += 1;
            let gap = core::time::Duration::from_micros(self.config.dcqcn.np_min_time_between_cnps_us);
            if qp.np.on_ce(now, gap) {
                qp.cnp_due = true;
            }
        }
        // Whatever this frame does to the QP, it may have something to send
        // afterwards: the QP goes on the ready list (a request's once it has
        // been handled, unless its only answer is a held ACK).
        if bth.opcode.is_response() {
            mark_ready(qp, &mut self.ready);
            let r = {
                let (requester, mut ctx) = req_ctx(qp, &self.memory, &mut self.completions);
                requester.handle_response(now, &mut ctx, p)
            };
            if let Err(SqFatal(_)) = r {
                self.enter_error(qpn, true);
                self.arm(qpn);
                self.note_drained(qpn);
                return;
            }
            // `arm` and `note_drained` with the QP still in hand (no second
            // and third lookup per response).
            let t = next_arm(qp, self.last_now);
            check_drained(qp, &mut self.events);
            if let Some(t) = t {
                self.queue_timer(t, qpn);
            }
        } else {
            let out = {
                let Some((responder, mut ctx, _)) = resp_parts(qp, &self.memory, &mut self.srqs, &mut self.completions, &mut self.events) else {
                    mark_ready(qp, &mut self.ready);
                    return;
                };
                responder.handle_request_placed(now, &mut ctx, p, placement)
            };
            if let ResponderOutcome::QpError(_) = out {
                // (`enter_error` puts the QP on the ready list for its NAK.)
                self.enter_error(qpn, true);
            } else if qp.responder.start_hold(now, self.config.ack_hold).is_some() {
                // A held ACK (responder, "held ACKs") gets its deadline in
                // the timer queue: it leaves alone then at the latest.
                qp.stats.resp_acks_held += 1;
                // The QP goes on the ready list only with something else to
                // send (`has_work`): the held ACK leaves with the next
                // request (a post, or a frame of the peer, marks the QP
                // ready) or at its deadline (the timer wakes the QP).
                if has_work(qp) {
                    mark_ready(qp, &mut self.ready);
                }
                // `arm` with the QP in hand (no second lookup).
                if let Some(t) = next_arm(qp, self.last_now) {
                    self.queue_timer(t, qpn);
                }
            } else {
                mark_ready(qp, &mut self.ready);
            }
        }
    }

    fn note_drained(&mut self, qpn: u32) {
        if let Some(qp) = self.qps.get_mut(&qpn) {
            check_drained(qp, &mut self.events);
        }
    }

    /// Whether [`Engine::poll_transmit`] may give a frame at `now`: QP1's
    /// MADs, a closing QP's parting frame, a QP on the ready list, a held
    /// ACK past its deadline. `false` means it would give none, so a caller
    /// need not lend it a buffer (a transmit attempt that finds nothing cost
    /// an AF_XDP port about 20 ns). Records `now` as `poll_transmit` does
    /// (the time later posts arm their timers from).
    #[inline]
    pub fn may_transmit(&mut self, now: Instant) -> bool {
        self.last_now = self.last_now.max(now);
        self.may_transmit_more()
    }

    /// [`Engine::may_transmit`] right after [`Engine::poll_transmit`] gave a
    /// frame (which recorded the time): whether another may follow. A QP
    /// with a frame left is still on the ready list, so a stream answers on
    /// the first test.
    #[inline]
    pub fn may_transmit_more(&self) -> bool {
        !self.ready.is_empty() || !self.late_acks.is_empty() || !self.parting.is_empty() || self.gsi.as_ref().is_some_and(|g| g.cm.has_transmit())
    }

    /// The next frame to send, written into `buf`; its length.
    #[must_use]
    #[inline]
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        // `may_transmit` must never say no where a frame would come.
        #[cfg(debug_assertions)]
        let may = self.may_transmit(now);
        let out = self.next_frame(now, buf);
        #[cfg(debug_assertions)]
        debug_assert!(out.is_none() || may, "may_transmit said no, but poll_transmit gave a frame");
        out
    }

    /// [`Engine::poll_transmit`]'s body.
    fn next_frame(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        self.last_now = self.last_now.max(now);
        if let Some(len) = self.gsi.as_deref_mut().and_then(|g| g.poll_transmit(buf)) {
            self.stats.tx_frames += 1;
            return Some(len);
        }
        if let Some(frame) = self.parting.pop_front() {
            if let Some(dst) = buf.get_mut(..frame.len()) {
                dst.copy_from_slice(&frame);
                self.stats.tx_frames += 1;
                return Some(frame.len());
            }
        }
        for _ in 0..self.ready.len() {
            // `transmit_qp` takes the QP off the list's head (or leaves a
            // lone one there when it sends: see there).
            let &qpn = self.ready.front()?;
            // A QP gone since it was queued sends nothing (`None`); one that
            // sent a frame is back at the end of the line (round robin).
            if let Some(len) = self.transmit_qp(now, qpn, buf) {
                self.stats.tx_frames += 1;
                return Some(len);
            }
        }
        // Held ACKs past their deadline, behind everything else.
        while let Some(qpn) = self.late_acks.pop() {
            let Some(qp) = self.qps.get_mut(&qpn) else { continue };
            if !qp.responder.has_held_ack() {
                continue;
            }
            qp.responder.release_hold();
            if let Some(len) = self.transmit_response(qpn, buf) {
                self.wake(qpn);
                self.stats.tx_frames += 1;
                return Some(len);
            }
        }
        None
    }

    /// The next frame of `qpn` (at the ready list's head), if any: the QP
    /// is taken off the list, and one that sent a frame is put back at its
    /// end, more may follow. Each branch does that with the QP in hand
    /// where it has it: a data frame costs one QP lookup.
    ///
    /// A lone ready QP's data frame leaves it where it is: taken off and put
    /// back, it would end up where it was, the only one on the list and
    /// marked ready (the pop and push cost a frame about 30 instructions).
    /// Nothing in [`request_frame`] but its own re-marking after a frame
    /// touches the list, so when no frame comes the QP is taken off after
    /// all, as if before: the list and the QP's mark end as they always did.
    fn transmit_qp(&mut self, now: Instant, qpn: u32, buf: &mut [u8]) -> Option<usize> {
        let Some(qp) = self.qps.get_mut(&qpn) else {
            self.ready.pop_front();
            return None;
        };
        if qp.cnp_due || qp.responder.has_held_ack() || qp.responder.has_pending() {
            self.ready.pop_front();
            qp.ready = false;
            return self.transmit_qp_first(now, qpn, buf);
        }
        // The common case (a data frame): the QP still in hand, no second lookup.
        // (Marked: not a stale entry of a QP since destroyed and made anew.)
        let lone = self.ready.len() == 1 && qp.ready;
        if !lone {
            self.ready.pop_front();
            qp.ready = false;
        }
        let out = request_frame(qp, now, self.last_now, &self.memory, &mut self.srqs, &mut self.completions, &mut self.events, &mut self.ready, buf);
        if lone && !matches!(out.frame, Ok(Some(_))) {
            // No frame: off the list, unmarked, before `after_request`
            // (whose error path wakes it again), as a QP that sent nothing is.
            // (After a frame it stays: in a stream, one visit that finds
            // nothing at a burst's end costs less than asking `has_work`
            // after every frame.)
            self.ready.pop_front();
            qp.ready = false;
        }
        self.after_request(qpn, out)
    }

    /// [`transmit_qp`](Self::transmit_qp) for a QP with something to send
    /// before its next request frame (a CNP, a held ACK, a pending
    /// response): out of line, so the data frame's path carries none of it.
    #[cold]
    #[inline(never)]
    fn transmit_qp_first(&mut self, now: Instant, qpn: u32, buf: &mut [u8]) -> Option<usize> {
        let qp = self.qps.get_mut(&qpn)?;
        // A due CNP goes before anything else.
        if qp.cnp_due {
            if let Some(path) = &qp.path {
                qp.cnp_due = false;
                if let Some(len) = emit_cnp(path, qp.attr.dest_qp_num, self.config.dcqcn.cnp_dscp, buf) {
                    qp.stats.np_cnps_sent += 1;
                    qp.stats.tx_packets += 1;
                    qp.stats.tx_bytes += len as u64;
                    mark_ready(qp, &mut self.ready);
                    return Some(len);
                }
            }
        }
        // Responses first: they unblock the peer. A held ACK (responder,
        // "held ACKs") instead waits for this QP's next request frame and
        // leaves right behind it; once its deadline has passed, it leaves
        // after every other frame of this `poll_transmit` round (`late_acks`),
        // so that it never precedes a reply in the same kick.
        if qp.responder.has_held_ack() {
            // `transmit_request` with the QP in hand. Its usual outcome
            // here (a SEND has just arrived and the reply is not posted
            // yet): no frame, no timer, no error, and the QP still in hand
            // for the late-ACK check (no second lookup).
            let out =
                request_frame(qp, now, self.last_now, &self.memory, &mut self.srqs, &mut self.completions, &mut self.events, &mut self.ready, buf);
            let qp = if matches!(out, RequestOut { frame: Ok(None), due: None }) {
                qp
            } else {
                if let Some(len) = self.after_request(qpn, out) {
                    return Some(len);
                }
                self.qps.get_mut(&qpn)?
            };
            if !qp.responder.holding(now) && !self.late_acks.contains(&qpn) {
                self.late_acks.push(qpn);
            }
            return None;
        }
        if qp.responder.has_pending() {
            // `transmit_response` and `wake` with the QP in hand; a fatal
            // responder error goes the general way, the QP out of hand.
            let (out, fatal) = response_frame(qp, &self.memory, &mut self.srqs, &mut self.completions, &mut self.events, buf);
            if fatal {
                self.enter_error(qpn, true);
                if out.is_some() {
                    self.wake(qpn);
                    return out;
                }
            } else if out.is_some() {
                if has_work(qp) {
                    mark_ready(qp, &mut self.ready);
                }
                return out;
            }
            return self.transmit_request(now, qpn, buf);
        }
        let out = request_frame(qp, now, self.last_now, &self.memory, &mut self.srqs, &mut self.completions, &mut self.events, &mut self.ready, buf);
        self.after_request(qpn, out)
    }

    /// The next response of `qpn`'s responder, if any.
    fn transmit_response(&mut self, qpn: u32, buf: &mut [u8]) -> Option<usize> {
        let qp = self.qps.get_mut(&qpn)?;
        let (out, fatal) = response_frame(qp, &self.memory, &mut self.srqs, &mut self.completions, &mut self.events, buf);
        if fatal {
            self.enter_error(qpn, true);
        }
        out
    }

    /// The next request frame of `qpn`'s requester, if any (after a
    /// pending responder flush); after one, the QP is back on the ready list.
    fn transmit_request(&mut self, now: Instant, qpn: u32, buf: &mut [u8]) -> Option<usize> {
        let qp = self.qps.get_mut(&qpn)?;
        let out = request_frame(qp, now, self.last_now, &self.memory, &mut self.srqs, &mut self.completions, &mut self.events, &mut self.ready, buf);
        self.after_request(qpn, out)
    }

    /// What follows a [`request_frame`] once the QP is out of hand: its
    /// timer queued, a fatal send-queue error taken to ERR.
    fn after_request(&mut self, qpn: u32, out: RequestOut) -> Option<usize> {
        if let Some(t) = out.due {
            self.queue_timer(t, qpn);
        }
        match out.frame {
            Ok(len) => len,
            Err(SqFatal(_)) => {
                self.enter_error(qpn, true);
                None
            }
        }
    }

    /// A QP about to be destroyed, reset or moved to ERR by its owner has a
    /// held ACK (responder, "held ACKs"): the ACK is framed now and leaves
    /// with the next `poll_transmit`, so the peer's last message (whose
    /// completion the application may already have acted on) is
    /// acknowledged and not retransmitted into a QP that is gone.
    fn part_with_held_ack(&mut self, qpn: u32) {
        let Some(qp) = self.qps.get_mut(&qpn) else { return };
        if !qp.responder.has_held_ack() {
            return;
        }
        qp.responder.release_hold();
        let mut frame = vec![0u8; PARTING_FRAME];
        if let Some(len) = self.transmit_response(qpn, &mut frame) {
            frame.truncate(len);
            self.parting.push_back(frame);
        }
    }

    /// Send every held ACK (responder, "held ACKs") at the next
    /// `poll_transmit` calls, without waiting for replies or deadlines: for
    /// a caller about to stop polling (a device closing).
    pub fn release_held_acks(&mut self) {
        let held: Vec<u32> = self.qps.iter().filter(|(_, qp)| qp.responder.hold_deadline().is_some()).map(|(&n, _)| n).collect();
        for qpn in held {
            if let Some(qp) = self.qps.get_mut(&qpn) {
                qp.responder.release_hold();
            }
            self.wake(qpn);
        }
    }

    /// When the engine next wants `handle_timeout`. May be earlier than any
    /// real deadline (a stale entry), never later.
    #[must_use]
    #[inline]
    pub fn next_timeout(&self) -> Option<Instant> {
        let qps = self.timers.peek().map(|Reverse((t, _))| *t);
        match (qps, self.gsi.as_ref().and_then(|g| g.cm.next_timeout())) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Put `qpn` on the ready list (once).
    fn wake(&mut self, qpn: u32) {
        if let Some(qp) = self.qps.get_mut(&qpn) {
            mark_ready(qp, &mut self.ready);
        }
    }

    /// Put `qpn`'s requester deadline in the timer queue if it is earlier
    /// than the entry the QP already has there.
    fn arm(&mut self, qpn: u32) {
        let Some(qp) = self.qps.get_mut(&qpn) else { return };
        if let Some(t) = next_arm(qp, self.last_now) {
            self.queue_timer(t, qpn);
        }
    }

    /// Queue `qpn`'s timer entry for `t` (its `timer_at`, set by [`next_arm`]).
    fn queue_timer(&mut self, t: Instant, qpn: u32) {
        // The QP's live entry is `(timer_at, qpn)` from now on, so an entry
        // of its own at the heap's top for another time is stale (a released
        // hold's deadline, `release_replied_hold`): overwritten in place, one
        // sift instead of this push and a `handle_timeout` call at that time
        // to pop it. (`PeekMut` sifts only when written.)
        if let Some(mut top) = self.timers.peek_mut() {
            let Reverse((at, q)) = *top;
            if q == qpn && at != t {
                *top = Reverse((t, qpn));
                return;
            }
        }
        if self.timers.len() == self.timers.capacity() {
            // Before the heap grows: drop the stale entries (each QP has at
            // most one live one, `(timer_at, qpn)`). A held ACK's short
            // deadline lands in front of a retransmission deadline each
            // round trip, and those stale entries would otherwise pile up
            // until they come due (a ping-pong's 67 ms ACK timeout: one heap
            // growth every few hundred round trips, an allocation on the
            // post/poll path). `retain` works in place.
            let qps = &self.qps;
            self.timers.retain(|Reverse((at, q))| qps.get(q).is_some_and(|qp| qp.timer_at == Some(*at)));
        }
        self.timers.push(Reverse((t, qpn)));
    }

    /// Fire every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.last_now = self.last_now.max(now);
        if let Some(g) = self.gsi.as_deref_mut() {
            if g.cm.next_timeout().is_some_and(|t| t <= now) {
                g.cm.handle_timeout(now);
            }
        }
        while let Some(&Reverse((t, qpn))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            let Some(qp) = self.qps.get_mut(&qpn) else { continue };
            if qp.timer_at != Some(t) {
                // Superseded by an earlier entry that already fired.
                continue;
            }
            qp.timer_at = None;
            qp.rp.handle_timeout(now);
            if qp.responder.expire_hold(now) {
                qp.stats.resp_acks_hold_expired += 1;
            }
            mark_ready(qp, &mut self.ready);
            if qp.requester.next_timeout().is_some_and(|d| d <= now) {
                let r = {
                    let (requester, mut ctx) = req_ctx(qp, &self.memory, &mut self.completions);
                    requester.handle_timeout(now, &mut ctx)
                };
                if r.is_err() {
                    self.enter_error(qpn, true);
                    self.arm(qpn);
                    continue;
                }
            }
            // `arm` with the QP still in hand (no second lookup a timer).
            if let Some(t) = next_arm(qp, self.last_now) {
                self.queue_timer(t, qpn);
            }
        }
    }
}

/// One send WQE into `qp`'s requester, after the engine's checks. In ERR
/// it completes at once with `WR_FLUSH_ERR`, as ibverbs providers do.
/// `Ok(true)`: queued (the caller arms the QP's timer and wakes it).
fn post_one_send(qp: &mut Qp, wr: Box<SendWqe>, completions: &mut VecDeque<Completion>) -> Result<bool, EngineError> {
    match qp.state {
        QpState::Rts | QpState::Sqd => {}
        QpState::Err => {
            // Done with at once: its slot is free, and the box goes back
            // with the reaped ones.
            qp.requester.retired().add(1);
            completions.push_back(flush_completion(qp.init.send_cq, qp.qpn, wr.wr_id, wr.op.wc_opcode()));
            qp.requester.keep_spent(wr);
            return Ok(false);
        }
        s => return Err(EngineError::WrongState(s)),
    }
    if let crate::transport::wqe::WqePayload::Sgl(sgl) = &wr.payload {
        if sgl.len() > qp.init.cap.max_send_sge as usize {
            return Err(EngineError::BadWr("more SGEs than max_send_sge"));
        }
    }
    match (qp.init.qp_type, wr.ud.is_some()) {
        (QpType::Ud, false) => return Err(EngineError::BadWr("UD send without a destination")),
        (QpType::Rc | QpType::Uc, true) => return Err(EngineError::BadWr("destination given on a connected QP")),
        _ => {}
    }
    let sig_all = qp.init.sq_sig_all;
    qp.requester.post(wr, qp.init.qp_type, sig_all).map_err(|_| EngineError::QueueFull)?;
    Ok(true)
}

/// [`Engine::post_srq_recv`] with the SRQ in hand: a WQE lent (a drain's)
/// is copied into the queue, an owned one moved.
fn post_srq_to<W: Borrow<RecvWqe> + Into<RecvWqe>>(q: &mut RecvQueue, wr: W) -> Result<(), EngineError> {
    q.post_wqe(wr).map_err(|_| {
        q.retired().add(1);
        EngineError::QueueFull
    })
}

/// [`Engine::post_recv`] with the QP in hand: a WQE lent (a drain's) is
/// copied into the receive queue, an owned one moved.
fn post_recv_to<W: Borrow<RecvWqe> + Into<RecvWqe>>(qp: &mut Qp, completions: &mut VecDeque<Completion>, wr: W) -> Result<(), EngineError> {
    if qp.state == QpState::Reset {
        return Err(EngineError::WrongState(QpState::Reset));
    }
    let (cq, qpn) = (qp.init.recv_cq, qp.qpn);
    let Some(rq) = qp.rq.as_mut() else { return Err(EngineError::BadWr("QP uses an SRQ")) };
    // A WR not queued is retired at once (its slot free before its
    // completion, this flush or the caller's error, exists).
    if qp.state == QpState::Err {
        rq.retired().add(1);
        completions.push_back(flush_completion(cq, qpn, wr.borrow().wr_id, WcOpcode::Recv));
        return Ok(());
    }
    rq.post_wqe(wr).map_err(|_| {
        rq.retired().add(1);
        EngineError::QueueFull
    })
}

/// Every send WQE `next` yields refused: `qpn` is unknown. How many.
fn refuse_all(qpn: u32, mut next: impl FnMut() -> Option<Box<SendWqe>>, mut refused: impl FnMut(u64, WcOpcode, EngineError)) -> usize {
    let mut n = 0;
    while let Some(wr) = next() {
        n += 1;
        refused(wr.wr_id, wr.op.wc_opcode(), EngineError::NoSuchQp(qpn));
    }
    n
}

/// [`Engine::post_send_batch`] with the QP in hand: every WQE `next`
/// yields posted (or handed to `refused`), then, if any was queued, the
/// QP's timer armed and the QP woken, once for the batch. How many WQEs
/// `next` yielded, and the timer to queue.
fn post_sends(
    qp: &mut Qp,
    last_now: Instant,
    completions: &mut VecDeque<Completion>,
    ready: &mut VecDeque<u32>,
    next: &mut impl FnMut() -> Option<Box<SendWqe>>,
    refused: &mut impl FnMut(u64, WcOpcode, EngineError),
) -> (usize, Option<Instant>) {
    let (mut n, mut queued) = (0, false);
    while let Some(wr) = next() {
        n += 1;
        let (wr_id, opcode) = (wr.wr_id, wr.op.wc_opcode());
        match post_one_send(qp, wr, completions) {
            Ok(q) => queued |= q,
            Err(e) => {
                // Posted, now refused: its slot is free before the
                // caller completes it with an error.
                qp.requester.retired().add(1);
                refused(wr_id, opcode, e)
            }
        }
    }
    if !queued {
        return (n, None);
    }
    // `arm` and `wake` with the QP in hand, once for the batch.
    let due = next_arm(qp, last_now);
    mark_ready(qp, ready);
    (n, due)
}

/// A request frame of `qp`'s and what [`Engine::after_request`] does with
/// the QP out of hand.
struct RequestOut {
    frame: Result<Option<usize>, SqFatal>,
    /// The QP's timer to queue.
    due: Option<Instant>,
}

/// The next response frame of `qp`'s responder into `buf` (counted in the
/// QP's statistics), with the QP in hand, and whether the responder took a
/// fatal error (the caller moves the QP to ERR). `(None, false)` if the
/// responder has no context (no receive queue) or the QP no path.
fn response_frame(
    qp: &mut Qp,
    memory: &MemoryTable,
    srqs: &mut IntMap<SrqId, RecvQueue>,
    completions: &mut VecDeque<Completion>,
    events: &mut VecDeque<AsyncEvent>,
    buf: &mut [u8],
) -> (Option<usize>, bool) {
    let dest = qp.attr.dest_qp_num;
    let (out, fatal) = {
        // The path is used in place.
        let Some((responder, mut ctx, path)) = resp_parts(qp, memory, srqs, completions, events) else {
            return (None, false);
        };
        let Some(path) = path else { return (None, false) };
        let out = responder.poll_transmit(&mut ctx, path, dest, buf);
        (out, responder.take_fatal().is_some())
    };
    if let Some(len) = out {
        qp.stats.tx_packets += 1;
        qp.stats.tx_bytes += len as u64;
    }
    (out, fatal)
}

/// The next request frame of `qp` (in RTS or SQD, as DCQCN pacing allows)
/// into `buf`, with the QP in hand: the engine's parts it needs borrowed
/// one by one, so a caller that has just looked the QP up passes it on.
/// Inlined: called out of line, its nine arguments (half of them on the
/// stack) and its saved registers cost a data frame about 37 instructions.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn request_frame(
    qp: &mut Qp,
    now: Instant,
    last_now: Instant,
    memory: &MemoryTable,
    srqs: &mut IntMap<SrqId, RecvQueue>,
    completions: &mut VecDeque<Completion>,
    events: &mut VecDeque<AsyncEvent>,
    ready: &mut VecDeque<u32>,
    buf: &mut [u8],
) -> RequestOut {
    if qp.responder_flush_pending && !qp.responder.has_pending() {
        qp.responder_flush_pending = false;
        flush_responder(qp, memory, srqs, completions, events);
    }
    // DCQCN pacing: requests leave no faster than the QP's current rate.
    if !matches!(qp.state, QpState::Rts | QpState::Sqd) || !qp.rp.may_send(now) {
        return RequestOut { frame: Ok(None), due: None };
    }
    // The path is used in place (UD sends carry their own per WR).
    let r = {
        let (requester, mut ctx, path) = req_parts(qp, memory, completions);
        requester.poll_transmit(now, &mut ctx, path, buf)
    };
    if let Ok(Some(len)) = r {
        qp.rp.on_sent(now, len);
        // The reply a held ACK waited for: the ACK leaves next, right
        // behind it (the QP is back on the ready list after a frame).
        if qp.responder.has_held_ack() {
            release_replied_hold(qp);
        }
        // (A lone QP kept on the list, still marked, is `transmit_qp`'s to
        // take off.)
        if !qp.ready && has_work(qp) {
            mark_ready(qp, ready);
        }
    }
    // `arm` and `note_drained` with the QP in hand (one lookup a frame).
    let due = next_arm(qp, last_now);
    if r.is_ok() {
        check_drained(qp, events);
    }
    RequestOut { frame: r, due }
}

/// The reply a held ACK (responder, "held ACKs") waited for has left: the
/// hold ends, and so does its deadline in the QP's timer. `timer_at` only
/// ever moves earlier ([`next_arm`]), so a timer armed for the hold would
/// otherwise stay at its deadline and fire for nothing: no hold left to
/// expire, no requester or DCQCN deadline due, only a ready-list visit that
/// finds nothing to send (two per ping-pong round trip). Forgetting it here
/// lets the caller's `next_arm` queue the QP's next real deadline at once,
/// the deadline the stale timer would have queued when it fired. The hold's
/// heap entry is then stale: overwritten in place by [`Engine::queue_timer`]
/// while it is the heap's top, else skipped when it comes up.
///
/// A QP whose DCQCN reaction point is engaged keeps the old timer: its
/// `handle_timeout` brings α up to date at every firing, and α's float
/// steps must not depend on this. A hold that has already expired has
/// fired its timer (`expire_hold`), which re-armed it. Out of line: a data
/// frame only tests `has_held_ack`.
#[cold]
#[inline(never)]
fn release_replied_hold(qp: &mut Qp) {
    let deadline = qp.responder.hold_deadline();
    qp.responder.release_hold();
    if deadline.is_some() && qp.timer_at == deadline && !qp.rp.is_limited() {
        qp.timer_at = None;
    }
}

/// [`Engine::arm`]'s decision for `qp`: its earliest deadline (requester
/// timer, DCQCN rate event, held ACK), recorded in `timer_at` and returned
/// if it is earlier than the entry the QP already has in the timer queue.
fn next_arm(qp: &mut Qp, now: Instant) -> Option<Instant> {
    let earlier = |a: Option<Instant>, b: Option<Instant>| match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let t = earlier(earlier(qp.requester.next_timeout(), qp.rp.next_event(now)), qp.responder.hold_deadline())?;
    if qp.timer_at.is_some_and(|s| t >= s) {
        return None;
    }
    qp.timer_at = Some(t);
    Some(t)
}

/// Whether `qp` has something for its next `poll_transmit` visit: a due
/// CNP, a response queued, a request packet left
/// (`Requester::has_unsent`), or the responder's flush that waits for its
/// last NAK to leave (`responder_flush_pending`, run by the next visit). A
/// held ACK is not (while one is held it is the only response queued:
/// anything queued behind it releases it): it leaves behind the next
/// request, which a post or the peer's frame puts the QP on the ready list
/// for, or after its deadline, whose timer wakes the QP. After a frame, a
/// QP goes back on the ready list only if this says so: otherwise the next
/// `poll_transmit` visited it once more for nothing (30-70 ns on each side
/// of a ping-pong's round trip, on its path).
#[inline]
fn has_work(qp: &Qp) -> bool {
    qp.cnp_due || (qp.responder.has_pending() && !qp.responder.has_held_ack()) || qp.requester.has_unsent() || qp.responder_flush_pending
}

/// Put `qp` on the ready list (the QPs `poll_transmit` visits) unless it
/// is there already.
fn mark_ready(qp: &mut Qp, ready: &mut VecDeque<u32>) {
    if !qp.ready {
        qp.ready = true;
        ready.push_back(qp.qpn);
    }
}

/// A draining QP (SQD) whose requester has nothing outstanding reports
/// `SqDrained` once.
fn check_drained(qp: &mut Qp, events: &mut VecDeque<AsyncEvent>) {
    if qp.state == QpState::Sqd && !qp.drained_reported && qp.requester.outstanding() == 0 {
        qp.drained_reported = true;
        events.push_back(AsyncEvent::SqDrained(qp.qpn));
    }
}
