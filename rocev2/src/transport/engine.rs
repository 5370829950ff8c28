//! The engine: a device's QPs and SRQs, driven sans-IO.
//!
//! `handle_frame` parses and checks a received frame and dispatches it by
//! BTH DestQP: requests to the QP's responder, responses to its completer.
//! `poll_transmit` hands out one frame per call, round-robin over QPs,
//! responses before requests. Timers are driven by `next_timeout` /
//! `handle_timeout`; completions and async events are polled out.

use std::cmp::Reverse;

use crate::hash::IntMap;
use crate::transport::dcqcn::{DcqcnParams, NotificationPoint, ReactionPoint};
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;

use crate::psn::Psn;
use crate::time::Instant;
use crate::transport::attr::{AddressVector, QpAttr, QpAttrMask, QpInitAttr, QpState, QpType, SrqId};
use crate::transport::memory::{Access, MemoryTable, PdId};
use crate::transport::packet::PathHeaders;
use crate::transport::recv::RecvQueue;
use crate::transport::requester::{Requester, RequesterCtx, SqFatal};
use crate::transport::responder::{Responder, ResponderCtx, ResponderOutcome};
use crate::transport::stats::QpStats;
use crate::transport::wr::{Completion, CqId, RecvWr, SendWr, WcOpcode, WcStatus};
use crate::wire::{parse_frame, sport, Opcode, Service, WireError};

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
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig { first_qpn: 0x11, max_qps: 4096, max_srqs: 1024, shard: (0, 1), dcqcn: DcqcnParams::default() }
    }
}

impl EngineConfig {
    fn in_shard(&self, x: u32) -> bool {
        let (i, n) = self.shard;
        n <= 1 || x % n == i
    }
}

/// Why an engine call failed. Nothing changed when one is returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineError {
    /// No QP with this number.
    NoSuchQp(u32),
    /// No SRQ with this id.
    NoSuchSrq(SrqId),
    /// QP or SRQ limit reached.
    TooMany,
    /// The QP's state does not allow the call (e.g. post_send before RTS).
    WrongState(QpState),
    /// `ibv_modify_qp`: a transition the state machine does not have.
    BadTransition {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// `ibv_modify_qp`: a required attribute is missing from the mask.
    MissingAttr(QpAttrMask),
    /// `ibv_modify_qp`: an attribute not allowed for this transition / QP type.
    ExtraAttr(QpAttrMask),
    /// An attribute value is out of range (named).
    BadValue(&'static str),
    /// The send or receive queue is full.
    QueueFull,
    /// A WR is not valid for this QP (type, SGE count, ...).
    BadWr(&'static str),
    /// The SRQ is still used by QPs.
    Busy,
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineError::NoSuchQp(q) => write!(f, "no QP {q:#x}"),
            EngineError::NoSuchSrq(s) => write!(f, "no SRQ {}", s.0),
            EngineError::TooMany => write!(f, "resource limit reached"),
            EngineError::WrongState(s) => write!(f, "not allowed in state {s:?}"),
            EngineError::BadTransition { from, to } => write!(f, "no transition {from:?} -> {to:?}"),
            EngineError::MissingAttr(m) => write!(f, "required attributes missing: {m:?}"),
            EngineError::ExtraAttr(m) => write!(f, "attributes not allowed here: {m:?}"),
            EngineError::BadValue(w) => write!(f, "bad value: {w}"),
            EngineError::QueueFull => write!(f, "queue full"),
            EngineError::BadWr(w) => write!(f, "bad work request: {w}"),
            EngineError::Busy => write!(f, "still in use"),
        }
    }
}

impl std::error::Error for EngineError {}

/// Asynchronous events (`enum ibv_event_type`, the ones urnic raises).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AsyncEvent {
    /// `IBV_EVENT_QP_FATAL`: the QP entered ERR on its own.
    QpFatal(u32),
    /// `IBV_EVENT_SQ_DRAINED`: an SQD QP finished its outstanding work.
    SqDrained(u32),
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`: the SRQ fell below its armed limit.
    SrqLimitReached(SrqId),
    /// `IBV_EVENT_PORT_ACTIVE`: the link came up (raised by the datapath).
    PortActive,
    /// `IBV_EVENT_PORT_ERR`: the link went down (raised by the datapath).
    PortError,
}

/// Engine-wide counters: frames dropped before reaching a QP, by reason.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Frames handed to `handle_frame`.
    pub rx_frames: u64,
    /// Dropped: the wire layer refused the frame (by reason).
    pub rx_bad_frame: HashMap<WireErrorKind, u64>,
    /// Dropped: DestQP names no QP.
    pub rx_unknown_qpn: u64,
    /// Dropped: the opcode's service does not match the QP type.
    pub rx_wrong_service: u64,
    /// Dropped: the P_Key does not match ours.
    pub rx_bad_pkey: u64,
    /// Dropped: an RC/UC frame (request, response or CNP) not from the QP's
    /// peer: IP source is not its destination GID, or IP destination is not
    /// its source GID (rxe `check_addr`).
    pub rx_wrong_peer: u64,
    /// Dropped: the QP's state does not accept this packet.
    pub rx_wrong_state: u64,
    /// Congestion notification packets accepted (from a QP's peer, for a
    /// connected QP in RTR or later); refused ones are counted by reason.
    pub rx_cnps: u64,
    /// Frames sent.
    pub tx_frames: u64,
}

/// A [`WireError`] without its details, for counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WireErrorKind {
    /// Truncated header.
    Truncated,
    /// Not IPv4/IPv6, bad IP version, IHL, length or checksum, fragments.
    BadIp,
    /// Not UDP, bad UDP length.
    BadUdp,
    /// UDP port not 4791.
    NotRoce,
    /// Unknown opcode or TVer.
    BadOpcode,
    /// Bad pad or payload where none is allowed.
    BadLayout,
    /// ICRC mismatch.
    BadIcrc,
    /// Anything else.
    Other,
}

impl WireErrorKind {
    /// A short name for counters (`bad_icrc`).
    pub fn name(self) -> &'static str {
        match self {
            WireErrorKind::Truncated => "truncated",
            WireErrorKind::BadIp => "bad_ip",
            WireErrorKind::BadUdp => "bad_udp",
            WireErrorKind::NotRoce => "not_roce",
            WireErrorKind::BadOpcode => "bad_opcode",
            WireErrorKind::BadLayout => "bad_layout",
            WireErrorKind::BadIcrc => "bad_icrc",
            WireErrorKind::Other => "other",
        }
    }

    /// Every kind.
    pub const ALL: [WireErrorKind; 8] = [
        WireErrorKind::Truncated,
        WireErrorKind::BadIp,
        WireErrorKind::BadUdp,
        WireErrorKind::NotRoce,
        WireErrorKind::BadOpcode,
        WireErrorKind::BadLayout,
        WireErrorKind::BadIcrc,
        WireErrorKind::Other,
    ];
}

impl EngineStats {
    /// Add `other`'s counters to these (summing a device's shards).
    pub fn add(&mut self, other: &EngineStats) {
        let EngineStats {
            rx_frames,
            rx_bad_frame,
            rx_unknown_qpn,
            rx_wrong_service,
            rx_bad_pkey,
            rx_wrong_peer,
            rx_wrong_state,
            rx_cnps,
            tx_frames,
        } = other;
        self.rx_frames += rx_frames;
        self.rx_unknown_qpn += rx_unknown_qpn;
        self.rx_wrong_service += rx_wrong_service;
        self.rx_bad_pkey += rx_bad_pkey;
        self.rx_wrong_peer += rx_wrong_peer;
        self.rx_wrong_state += rx_wrong_state;
        self.rx_cnps += rx_cnps;
        self.tx_frames += tx_frames;
        for (k, v) in rx_bad_frame {
            *self.rx_bad_frame.entry(*k).or_insert(0) += v;
        }
    }

    /// Every counter with its name (bad frames one per reason).
    pub fn iter(&self) -> impl Iterator<Item = (String, u64)> + '_ {
        let fixed = [
            ("rx_frames", self.rx_frames),
            ("rx_unknown_qpn", self.rx_unknown_qpn),
            ("rx_wrong_service", self.rx_wrong_service),
            ("rx_bad_pkey", self.rx_bad_pkey),
            ("rx_wrong_peer", self.rx_wrong_peer),
            ("rx_wrong_state", self.rx_wrong_state),
            ("rx_cnps", self.rx_cnps),
            ("tx_frames", self.tx_frames),
        ];
        fixed.into_iter().map(|(k, v)| (k.to_string(), v)).chain(
            WireErrorKind::ALL
                .into_iter()
                .map(|k| (format!("rx_drop_{}", k.name()), self.rx_bad_frame.get(&k).copied().unwrap_or(0))),
        )
    }
}

impl From<WireError> for WireErrorKind {
    fn from(e: WireError) -> Self {
        match e {
            WireError::Truncated(_) => WireErrorKind::Truncated,
            WireError::NotIp { .. }
            | WireError::BadIpVersion(_)
            | WireError::BadIhl(_)
            | WireError::BadIpLength
            | WireError::BadIpv4Checksum
            | WireError::Fragmented => WireErrorKind::BadIp,
            WireError::NotUdp { .. } | WireError::BadUdpLength => WireErrorKind::BadUdp,
            WireError::NotRoce { .. } => WireErrorKind::NotRoce,
            WireError::UnknownOpcode(_) | WireError::BadTver(_) => WireErrorKind::BadOpcode,
            WireError::BadPad { .. } | WireError::UnexpectedPayload => WireErrorKind::BadLayout,
            WireError::BadIcrc { .. } => WireErrorKind::BadIcrc,
            _ => WireErrorKind::Other,
        }
    }
}

struct Qp {
    qpn: u32,
    init: QpInitAttr,
    attr: QpAttr,
    state: QpState,
    requester: Requester,
    responder: Responder,
    /// Own receive queue (None when the QP uses an SRQ).
    rq: Option<RecvQueue>,
    path: Option<PathHeaders>,
    stats: QpStats,
    /// The responder hit a fatal error: flush it once its NAK is out.
    responder_flush_pending: bool,
    drained_reported: bool,
    /// Deadline of this QP's newest entry in the engine's timer queue.
    timer_at: Option<Instant>,
    /// DCQCN reaction point (paces our requests after CNPs).
    rp: ReactionPoint,
    /// DCQCN notification point (CNPs for CE-marked packets we receive).
    np: NotificationPoint,
    /// A CNP is due to the peer QP.
    cnp_due: bool,
    /// In the engine's ready list.
    ready: bool,
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
    /// Requester deadlines (retransmission, RNR), earliest first. Entries are
    /// never removed early: a QP whose deadline moved later keeps a stale,
    /// earlier entry that is re-checked when it comes up (lazy deletion), so
    /// an ACK costs nothing here and a timer costs O(log n) once.
    timers: BinaryHeap<Reverse<(Instant, u32)>>,
    /// The latest `now` the engine was given (pacing deadlines in the past
    /// are not timers).
    last_now: Instant,
    /// QPs that may have something to send, in round-robin order. A QP is
    /// put here by every event that can give it work (a post, a received
    /// frame, a timer, a state change) and leaves when it has nothing to
    /// send: transmit costs O(active QPs), not O(all QPs).
    ready: VecDeque<u32>,
}

/// (required, optional) attribute masks of a transition, IBTA 11.2.4.2 /
/// `ibv_modify_qp(3)`. `None`: no such transition.
fn transition_masks(ty: QpType, from: QpState, to: QpState) -> Option<(QpAttrMask, QpAttrMask)> {
    use QpAttrMask as M;
    use QpState::*;
    let none = M::empty();
    Some(match (from, to) {
        (_, Reset) | (_, Err) => (none, none),
        (Reset, Init) | (Init, Init) => {
            let base = M::PKEY_INDEX | M::PORT;
            let k = match ty {
                QpType::Ud => M::QKEY,
                _ => M::ACCESS_FLAGS,
            };
            if from == Reset {
                (base | k, none)
            } else {
                (none, base | k)
            }
        }
        (Init, Rtr) => match ty {
            QpType::Rc => (
                M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER,
                M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
            ),
            QpType::Uc => (M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN, M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX),
            QpType::Ud => (none, M::PKEY_INDEX | M::QKEY),
        },
        (Rtr, Rts) => match ty {
            QpType::Rc => (
                M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::MIN_RNR_TIMER | M::PATH_MIG_STATE,
            ),
            QpType::Uc => (M::SQ_PSN, M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE),
            QpType::Ud => (M::SQ_PSN, M::CUR_STATE | M::QKEY),
        },
        (Rts, Rts) | (Sqe, Rts) => match ty {
            QpType::Rc => (none, M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE | M::MIN_RNR_TIMER),
            QpType::Uc => (none, M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE),
            QpType::Ud => (none, M::CUR_STATE | M::QKEY),
        },
        (Rts, Sqd) => (none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Rts) => (none, M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE | M::MIN_RNR_TIMER | M::QKEY),
        (Sqd, Sqd) => (
            none,
            M::AV | M::MAX_QP_RD_ATOMIC | M::MAX_DEST_RD_ATOMIC | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::ACCESS_FLAGS | M::QKEY | M::PKEY_INDEX | M::MIN_RNR_TIMER | M::PATH_MIG_STATE | M::ALT_PATH,
        ),
        _ => return None,
    })
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
            ready: VecDeque::new(),
        }
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
        let rq = init.srq.is_none().then(|| RecvQueue::new(init.pd, init.cap.max_recv_wr.max(1), init.cap.max_recv_sge));
        let attr = QpAttr { cap: init.cap, ..QpAttr::default() };
        self.qps.insert(
            qpn,
            Qp {
                qpn,
                init: *init,
                attr,
                state: QpState::Reset,
                requester: Requester::new(init.cap.max_send_wr, Psn::new(0)),
                responder: Responder::new(Psn::new(0)),
                rq,
                path: None,
                stats: QpStats::default(),
                responder_flush_pending: false,
                drained_reported: false,
                timer_at: None,
                rp: ReactionPoint::new(self.config.dcqcn),
                np: NotificationPoint::default(),
                cnp_due: false,
                ready: false,
            },
        );
        self.order.push(qpn);
        Ok(())
    }

    /// Destroy a QP. Outstanding WRs are dropped with it, as `ibv_destroy_qp`
    /// does (move it to ERR first to have them flushed).
    pub fn destroy_qp(&mut self, qpn: u32) -> Result<(), EngineError> {
        self.qps.remove(&qpn).ok_or(EngineError::NoSuchQp(qpn))?;
        self.order.retain(|&q| q != qpn);
        Ok(())
    }

    /// `ibv_query_qp`.
    pub fn query_qp(&self, qpn: u32) -> Result<QpAttr, EngineError> {
        let qp = self.qps.get(&qpn).ok_or(EngineError::NoSuchQp(qpn))?;
        let mut a = qp.attr;
        a.qp_state = qp.state;
        a.cur_qp_state = qp.state;
        a.sq_psn = qp.requester.next_psn();
        a.rq_psn = qp.responder.expected_psn();
        a.sq_draining = qp.state == QpState::Sqd && qp.requester.outstanding() > 0;
        Ok(a)
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
        let qp = self.qps.get_mut(&qpn).ok_or(EngineError::NoSuchQp(qpn))?;
        let from = qp.state;
        if mask.contains(QpAttrMask::CUR_STATE) && attr.cur_qp_state != from {
            return Err(EngineError::BadValue("cur_qp_state does not match the QP's state"));
        }
        let to = if mask.contains(QpAttrMask::STATE) { attr.qp_state } else { from };
        let (required, optional) =
            transition_masks(qp.init.qp_type, from, to).ok_or(EngineError::BadTransition { from, to })?;
        let given = mask - QpAttrMask::STATE;
        if !given.contains(required) {
            return Err(EngineError::MissingAttr(required - given));
        }
        let extra = given - required - optional;
        if !extra.is_empty() {
            return Err(EngineError::ExtraAttr(extra));
        }
        // Values.
        if mask.contains(QpAttrMask::PORT) && attr.port_num != 1 {
            return Err(EngineError::BadValue("port_num must be 1"));
        }
        if mask.contains(QpAttrMask::PKEY_INDEX) && attr.pkey_index != 0 {
            return Err(EngineError::BadValue("pkey_index must be 0 (one P_Key, 0xffff)"));
        }
        if mask.contains(QpAttrMask::MIN_RNR_TIMER) && attr.min_rnr_timer > 31 {
            return Err(EngineError::BadValue("min_rnr_timer is a 5-bit code"));
        }
        if mask.contains(QpAttrMask::TIMEOUT) && attr.timeout > 31 {
            return Err(EngineError::BadValue("timeout is a 5-bit exponent"));
        }
        if mask.contains(QpAttrMask::RETRY_CNT) && attr.retry_cnt > 7 {
            return Err(EngineError::BadValue("retry_cnt is 0..=7"));
        }
        if mask.contains(QpAttrMask::RNR_RETRY) && attr.rnr_retry > 7 {
            return Err(EngineError::BadValue("rnr_retry is 0..=7"));
        }
        if mask.contains(QpAttrMask::DEST_QPN) && attr.dest_qp_num > 0x00ff_ffff {
            return Err(EngineError::BadValue("dest_qp_num is 24 bits"));
        }
        if mask.contains(QpAttrMask::AV) && attr.ah_attr.is_none() {
            return Err(EngineError::BadValue("IBV_QP_AV without ah_attr"));
        }
        if mask.contains(QpAttrMask::ACCESS_FLAGS)
            && !(Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC | Access::LOCAL_WRITE | Access::MW_BIND).contains(attr.qp_access_flags)
        {
            return Err(EngineError::BadValue("qp_access_flags has unknown bits"));
        }
        // Apply.
        let a = &mut qp.attr;
        if mask.contains(QpAttrMask::ACCESS_FLAGS) {
            a.qp_access_flags = attr.qp_access_flags;
        }
        if mask.contains(QpAttrMask::QKEY) {
            a.qkey = attr.qkey;
        }
        if mask.contains(QpAttrMask::PATH_MTU) {
            a.path_mtu = attr.path_mtu;
        }
        if mask.contains(QpAttrMask::DEST_QPN) {
            a.dest_qp_num = attr.dest_qp_num;
        }
        if mask.contains(QpAttrMask::MAX_DEST_RD_ATOMIC) {
            a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        }
        if mask.contains(QpAttrMask::MAX_QP_RD_ATOMIC) {
            a.max_rd_atomic = attr.max_rd_atomic;
        }
        if mask.contains(QpAttrMask::MIN_RNR_TIMER) {
            a.min_rnr_timer = attr.min_rnr_timer;
        }
        if mask.contains(QpAttrMask::TIMEOUT) {
            a.timeout = attr.timeout;
        }
        if mask.contains(QpAttrMask::RETRY_CNT) {
            a.retry_cnt = attr.retry_cnt;
        }
        if mask.contains(QpAttrMask::RNR_RETRY) {
            a.rnr_retry = attr.rnr_retry;
        }
        if mask.contains(QpAttrMask::AV) {
            a.ah_attr = attr.ah_attr;
        }
        if mask.contains(QpAttrMask::RQ_PSN) {
            a.rq_psn = attr.rq_psn;
            qp.responder = Responder::new(attr.rq_psn);
        }
        if mask.contains(QpAttrMask::SQ_PSN) {
            a.sq_psn = attr.sq_psn;
        }
        if let (true, Some(av)) = (mask.contains(QpAttrMask::AV) || to == QpState::Rtr, qp.attr.ah_attr) {
            let mut path = PathHeaders::new(&av, rc_port(&av, qpn, qp.attr.dest_qp_num));
            // DCQCN: our packets are ECN-capable (ECT(0)) so switches mark
            // them instead of dropping, unless the path says otherwise.
            if av.traffic_class & 3 == 0 {
                path.set_ecn(2);
            }
            qp.path = Some(path);
        }
        qp.state = to;
        match (from, to) {
            (_, QpState::Reset) => {
                let cap = qp.init.cap;
                qp.requester = Requester::new(cap.max_send_wr, Psn::new(0));
                qp.responder = Responder::new(Psn::new(0));
                if let Some(rq) = &mut qp.rq {
                    let _ = rq.flush().count();
                }
                qp.path = None;
            }
            (QpState::Rtr, QpState::Rts) => {
                qp.requester.start(qp.attr.sq_psn, qp.attr.retry_cnt, qp.attr.rnr_retry);
            }
            (f, QpState::Err) if f != QpState::Err => {
                self.enter_error(qpn, false);
            }
            (_, QpState::Sqd) => qp.drained_reported = !mask.contains(QpAttrMask::EN_SQD_ASYNC_NOTIFY),
            _ => {}
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
    pub fn post_send(&mut self, qpn: u32, wr: SendWr) -> Result<(), EngineError> {
        let qp = self.qps.get_mut(&qpn).ok_or(EngineError::NoSuchQp(qpn))?;
        match qp.state {
            QpState::Rts | QpState::Sqd => {}
            QpState::Err => {
                self.completions.push_back(flush_completion(qp.init.send_cq, qpn, wr.wr_id, wr.op.wc_opcode()));
                return Ok(());
            }
            s => return Err(EngineError::WrongState(s)),
        }
        if let crate::transport::wr::Payload::Sgl(sgl) = &wr.payload {
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
        self.arm(qpn);
        self.wake(qpn);
        Ok(())
    }

    /// `ibv_post_recv`. In ERR the WR completes at once with `WR_FLUSH_ERR`.
    pub fn post_recv(&mut self, qpn: u32, wr: RecvWr) -> Result<(), EngineError> {
        let qp = self.qps.get_mut(&qpn).ok_or(EngineError::NoSuchQp(qpn))?;
        if qp.state == QpState::Reset {
            return Err(EngineError::WrongState(QpState::Reset));
        }
        let cq = qp.init.recv_cq;
        let Some(rq) = qp.rq.as_mut() else { return Err(EngineError::BadWr("QP uses an SRQ")) };
        if qp.state == QpState::Err {
            self.completions.push_back(flush_completion(cq, qpn, wr.wr_id, WcOpcode::Recv));
            return Ok(());
        }
        rq.post(wr).map_err(|_| EngineError::QueueFull)
    }

    /// `ibv_post_srq_recv`.
    pub fn post_srq_recv(&mut self, srq: SrqId, wr: RecvWr) -> Result<(), EngineError> {
        let q = self.srqs.get_mut(&srq).ok_or(EngineError::NoSuchSrq(srq))?;
        q.post(wr).map_err(|_| EngineError::QueueFull)
    }

    /// Whether completions wait for [`Engine::poll_completion`].
    pub fn has_completions(&self) -> bool {
        !self.completions.is_empty()
    }

    /// Next completion, in the order they happened.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.completions.pop_front()
    }

    /// Next asynchronous event.
    pub fn poll_event(&mut self) -> Option<AsyncEvent> {
        self.events.pop_front()
    }

    /// A frame from the wire. Never panics; anything refused is counted.
    pub fn handle_frame(&mut self, now: Instant, frame: &[u8]) {
        self.last_now = self.last_now.max(now);
        self.stats.rx_frames += 1;
        let p = match parse_frame(frame) {
            Ok(p) => p,
            Err(e) => {
                *self.stats.rx_bad_frame.entry(e.into()).or_insert(0) += 1;
                return;
            }
        };
        let bth = p.repr.transport.bth;
        let qpn = bth.dest_qp;
        let Some(qp) = self.qps.get_mut(&qpn) else {
            self.stats.rx_unknown_qpn += 1;
            return;
        };
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
            self.stats.rx_wrong_service += 1;
            return;
        }
        // rxe check_type_state: requests (and CNPs) from RTR on, responses
        // only once we send (RTS, SQD, SQE); nothing in RESET, INIT or ERR.
        let state_ok = if bth.opcode.is_response() {
            matches!(qp.state, QpState::Rts | QpState::Sqd | QpState::Sqe)
        } else {
            matches!(qp.state, QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe)
        };
        if !state_ok {
            self.stats.rx_wrong_state += 1;
            return;
        }
        // rxe check_addr: a connected QP hears only its peer. The IP source
        // must be the QP's destination GID and the IP destination its source
        // GID, so a stranger on the segment cannot inject requests, responses
        // or CNPs even with the right QPN, PSN and keys.
        if qp.init.qp_type != QpType::Ud && !from_peer(qp.attr.ah_attr.as_ref(), &p.repr.ip) {
            self.stats.rx_wrong_peer += 1;
            return;
        }
        // IBTA 9.6.1.1 (C9-42), rxe check_keys: the P_Key must match the QP's
        // partition (0xffff; the membership bit is ignored).
        if bth.pkey & 0x7fff != 0x7fff {
            self.stats.rx_bad_pkey += 1;
            return;
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
        // Whatever this frame does to the QP (ACK, request, NAK), it may
        // have something to send afterwards.
        if !qp.ready {
            qp.ready = true;
            self.ready.push_back(qpn);
        }
        qp.stats.rx_packets += 1;
        qp.stats.rx_bytes += frame.len() as u64;
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
        if bth.opcode.is_response() {
            let r = {
                let (requester, mut ctx) = req_ctx(qp, &self.memory, &mut self.completions);
                requester.handle_response(now, &mut ctx, &p)
            };
            if let Err(SqFatal(_)) = r {
                self.enter_error(qpn, true);
            }
            self.arm(qpn);
            self.note_drained(qpn);
        } else {
            let out = {
                let mut ctx = match resp_ctx(qp, &self.memory, &mut self.srqs, &mut self.completions, &mut self.events) {
                    Some(c) => c,
                    None => return,
                };
                let (responder, ctx) = (&mut ctx.0, &mut ctx.1);
                responder.handle_request(now, ctx, &p)
            };
            if let ResponderOutcome::QpError(_) = out {
                self.enter_error(qpn, true);
            }
        }
    }

    fn note_drained(&mut self, qpn: u32) {
        if let Some(qp) = self.qps.get_mut(&qpn) {
            if qp.state == QpState::Sqd && !qp.drained_reported && qp.requester.outstanding() == 0 {
                qp.drained_reported = true;
                self.events.push_back(AsyncEvent::SqDrained(qpn));
            }
        }
    }

    /// The next frame to send, written into `buf`; its length.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        self.last_now = self.last_now.max(now);
        for _ in 0..self.ready.len() {
            let qpn = self.ready.pop_front()?;
            match self.qps.get_mut(&qpn) {
                Some(qp) => qp.ready = false,
                None => continue,
            }
            if let Some(len) = self.transmit_qp(now, qpn, buf) {
                // More may follow: back to the end of the line (round robin).
                self.wake(qpn);
                self.stats.tx_frames += 1;
                return Some(len);
            }
        }
        None
    }

    fn transmit_qp(&mut self, now: Instant, qpn: u32, buf: &mut [u8]) -> Option<usize> {
        let qp = self.qps.get_mut(&qpn)?;
        // A due CNP goes before anything else.
        if qp.cnp_due {
            if let Some(path) = qp.path {
                qp.cnp_due = false;
                if let Some(len) = emit_cnp(&path, qp.attr.dest_qp_num, self.config.dcqcn.cnp_dscp, buf) {
                    qp.stats.np_cnps_sent += 1;
                    qp.stats.tx_packets += 1;
                    qp.stats.tx_bytes += len as u64;
                    return Some(len);
                }
            }
        }
        // Responses first: they unblock the peer.
        if qp.responder.has_pending() {
            if let Some(path) = qp.path {
                let dest = qp.attr.dest_qp_num;
                let (out, fatal) = {
                    let mut c = resp_ctx(qp, &self.memory, &mut self.srqs, &mut self.completions, &mut self.events)?;
                    let (responder, ctx) = (&mut c.0, &mut c.1);
                    let out = responder.poll_transmit(ctx, &path, dest, buf);
                    (out, responder.take_fatal())
                };
                if let Some(len) = out {
                    qp.stats.tx_packets += 1;
                    qp.stats.tx_bytes += len as u64;
                }
                if fatal.is_some() {
                    self.enter_error(qpn, true);
                }
                if out.is_some() {
                    return out;
                }
            }
        }
        let qp = self.qps.get_mut(&qpn)?;
        if qp.responder_flush_pending && !qp.responder.has_pending() {
            qp.responder_flush_pending = false;
            flush_responder(qp, &self.memory, &mut self.srqs, &mut self.completions, &mut self.events);
        }
        if !matches!(qp.state, QpState::Rts | QpState::Sqd) {
            return None;
        }
        // DCQCN pacing: requests leave no faster than the QP's current rate.
        if !qp.rp.may_send(now) {
            return None;
        }
        let mut path = match (qp.init.qp_type, qp.path) {
            // UD sends carry their own path per WR; this one is never used.
            (QpType::Ud, p) => p.unwrap_or_else(|| PathHeaders::new(&UNUSED_PATH, 0)),
            (_, Some(p)) => p,
            (_, None) => return None,
        };
        let r = {
            let (requester, mut ctx) = req_ctx(qp, &self.memory, &mut self.completions);
            requester.poll_transmit(now, &mut ctx, &mut path, buf)
        };
        if qp.init.qp_type != QpType::Ud {
            qp.path = Some(path);
        }
        if let Ok(Some(len)) = r {
            qp.rp.on_sent(now, len);
        }
        self.arm(qpn);
        match r {
            Ok(out) => {
                self.note_drained(qpn);
                out
            }
            Err(SqFatal(_)) => {
                self.enter_error(qpn, true);
                None
            }
        }
    }

    /// When the engine next wants `handle_timeout`. May be earlier than any
    /// real deadline (a stale entry), never later.
    pub fn next_timeout(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse((t, _))| *t)
    }

    /// Put `qpn` on the ready list (once).
    fn wake(&mut self, qpn: u32) {
        if let Some(qp) = self.qps.get_mut(&qpn) {
            if !qp.ready {
                qp.ready = true;
                self.ready.push_back(qpn);
            }
        }
    }

    /// Put `qpn`'s requester deadline in the timer queue if it is earlier
    /// than the entry the QP already has there.
    fn arm(&mut self, qpn: u32) {
        let Some(qp) = self.qps.get_mut(&qpn) else { return };
        let rp = qp.rp.next_event(self.last_now);
        let t = match (qp.requester.next_timeout(), rp) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(t) = t {
            if qp.timer_at.is_none_or(|s| t < s) {
                qp.timer_at = Some(t);
                self.timers.push(Reverse((t, qpn)));
            }
        }
    }

    /// Fire every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.last_now = self.last_now.max(now);
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
            if !qp.ready {
                qp.ready = true;
                self.ready.push_back(qpn);
            }
            if qp.requester.next_timeout().is_some_and(|d| d <= now) {
                let r = {
                    let (requester, mut ctx) = req_ctx(qp, &self.memory, &mut self.completions);
                    requester.handle_timeout(now, &mut ctx)
                };
                if r.is_err() {
                    self.enter_error(qpn, true);
                }
            }
            self.arm(qpn);
        }
    }
}

/// A CNP to `dest_qp` along `path` (as ConnectX sends them: DSCP `dscp`,
/// ECT(0), UDP source port 0, BECN set, PSN 0, 16 reserved bytes).
fn emit_cnp(path: &PathHeaders, dest_qp: u32, dscp: u8, buf: &mut [u8]) -> Option<usize> {
    use crate::wire::{BthRepr, IpRepr, TransportRepr};
    let mut f = path.frame(TransportRepr::bth_only(BthRepr { becn: true, ..BthRepr::new(Opcode::CNP, dest_qp, Psn::new(0)) }));
    match &mut f.ip {
        IpRepr::V4(v4) => {
            v4.dscp = dscp & 0x3f;
            v4.ecn = 2;
        }
        IpRepr::V6(v6) => v6.traffic_class = (dscp << 2) | 2,
    }
    f.udp.src_port = 0;
    f.emit(&[], buf).ok()
}

/// Whether a frame with IP header `ip` comes from the peer of a connected QP
/// whose address vector is `av` (rxe `check_addr`): source = `dgid`,
/// destination = `sgid`. An IPv4 frame matches IPv4-mapped GIDs
/// (::ffff:a.b.c.d, the RoCEv2 GID of an IPv4 address). No address vector
/// (not yet connected): nobody is the peer.
fn from_peer(av: Option<&AddressVector>, ip: &crate::wire::IpRepr) -> bool {
    let Some(av) = av else { return false };
    match ip {
        crate::wire::IpRepr::V4(v4) => {
            av.sgid == ipv4_mapped(v4.dst) && av.dgid == ipv4_mapped(v4.src)
        }
        crate::wire::IpRepr::V6(v6) => av.sgid == v6.dst && av.dgid == v6.src,
    }
}

/// The IPv4-mapped IPv6 address (GID) of `a`.
fn ipv4_mapped(a: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&a);
    g
}

/// The UDP source port of an RC/UC path: Linux's flow-label port from the
/// two QPNs unless the path names one.
fn rc_port(av: &AddressVector, qpn: u32, dest: u32) -> u16 {
    av.udp_sport.unwrap_or_else(|| sport::rc_sport(qpn, dest))
}

const UNUSED_PATH: AddressVector = AddressVector {
    dmac: [0; 6],
    smac: [0; 6],
    vlan: None,
    sgid: [0; 16],
    dgid: [0; 16],
    traffic_class: 0,
    hop_limit: 0,
    flow_label: 0,
    udp_sport: None,
};

/// The requester and its context, borrowed out of a QP.
fn req_ctx<'a>(qp: &'a mut Qp, memory: &'a MemoryTable, completions: &'a mut VecDeque<Completion>) -> (&'a mut Requester, RequesterCtx<'a>) {
    (&mut qp.requester, RequesterCtx {
        memory,
        pd: qp.init.pd,
        qpn: qp.qpn,
        qp_type: qp.init.qp_type,
        dest_qpn: qp.attr.dest_qp_num,
        pmtu: qp.attr.path_mtu,
        qkey: qp.attr.qkey,
        send_cq: qp.init.send_cq,
        completions,
        stats: &mut qp.stats,
        timeout: qp.attr.timeout,
        retry_cnt: qp.attr.retry_cnt,
        rnr_retry: qp.attr.rnr_retry,
        max_rd_atomic: qp.attr.max_rd_atomic,
        draining: qp.state == QpState::Sqd,
    })
}

/// The responder and its context, borrowed out of a QP (its own RQ or its SRQ).
fn resp_ctx<'a>(
    qp: &'a mut Qp,
    memory: &'a MemoryTable,
    srqs: &'a mut IntMap<SrqId, RecvQueue>,
    completions: &'a mut VecDeque<Completion>,
    events: &'a mut VecDeque<crate::transport::engine::AsyncEvent>,
) -> Option<(&'a mut Responder, ResponderCtx<'a>)> {
    let recv_queue = match (&mut qp.rq, qp.init.srq) {
        (Some(rq), _) => rq,
        (None, Some(id)) => srqs.get_mut(&id)?,
        (None, None) => return None,
    };
    Some((
        &mut qp.responder,
        ResponderCtx {
            memory,
            pd: qp.init.pd,
            qpn: qp.qpn,
            qp_type: qp.init.qp_type,
            access: qp.attr.qp_access_flags,
            pmtu: qp.attr.path_mtu,
            qkey: qp.attr.qkey,
            recv_queue,
            recv_cq: qp.init.recv_cq,
            completions,
            events,
            min_rnr_timer: qp.attr.min_rnr_timer,
            max_dest_rd_atomic: qp.attr.max_dest_rd_atomic,
            stats: &mut qp.stats,
        },
    ))
}

fn flush_responder(
    qp: &mut Qp,
    memory: &MemoryTable,
    srqs: &mut IntMap<SrqId, RecvQueue>,
    completions: &mut VecDeque<Completion>,
    events: &mut VecDeque<AsyncEvent>,
) {
    if let Some((responder, mut ctx)) = resp_ctx(qp, memory, srqs, completions, events) {
        responder.flush(&mut ctx);
    }
}

fn flush_completion(cq: CqId, qpn: u32, wr_id: u64, opcode: WcOpcode) -> Completion {
    Completion::error(cq, qpn, wr_id, opcode, WcStatus::WrFlushErr)
}
