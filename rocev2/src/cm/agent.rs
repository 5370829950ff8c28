//! The CM agent: connection establishment and release (IBTA Vol 1 12.9) and
//! service ID resolution (12.11), sans-IO in quinn-proto's manner.
//!
//! Input: [`Cm::handle_mad`] (a MAD that arrived on QP1, with the GIDs it
//! came from and went to), the calls ([`Cm::connect`], [`Cm::accept`], ...)
//! and [`Cm::handle_timeout`]. Output: [`Cm::poll_transmit`] (MADs for QP1
//! to send), [`Cm::poll_event`] and [`Cm::next_timeout`].
//!
//! The rules, with where they come from (Linux `drivers/infiniband/core/cm.c`
//! is the CM that rxe peers run; the capture `../pcaps/rping.pcap` shows it):
//! - Requests (REQ, REP, DREQ, SIDR_REQ) are retransmitted every response
//!   timeout until answered, at most Max CM Retries times (IBTA 12.9.2,
//!   12.9.3); then the exchange fails with [`CmEvent::TimedOut`]. An active
//!   side that gives up on its REQ sends a REJ "timeout" (IBTA 12.6.7, as
//!   Linux's `ib_destroy_cm_id` does), so the passive side's state goes too.
//! - An MRA (12.6.6) extends the wait for the REP by its service timeout. We
//!   send one for a duplicate REQ the consumer has not answered yet, and
//!   repeat it for further duplicates (Linux `cm_dup_req_handler`).
//! - Duplicates are answered from state: a REQ after our REP gets the same
//!   REP, a REP after our RTU the same RTU (`cm_dup_rep_handler`), a DREQ in
//!   timewait a DREP, a SIDR_REQ after our SIDR_REP the same SIDR_REP.
//! - A REQ nobody listens for gets REJ reason 8, invalid service ID
//!   (`cm_req_handler` → `cm_issue_rej`); a consumer's reject is reason 28
//!   with its private data; a REQ over the listener's backlog or the agent's
//!   bound gets reason 3, no resources.
//! - A REQ in timewait, or one that names a QP an existing connection with
//!   the same peer uses, is stale: REJ reason 10, and the older connection
//!   is disconnected (IBTA 12.9.8.3.1, `cm_req_handler`'s stale check).
//! - After a disconnect each side waits in timewait before the comm ID is
//!   reused (IBTA 12.9.8.5).
//! - Every message after the REQ must come from the GID the connection is
//!   with and name both comm IDs (and DREQ our QPN); anything else is a
//!   counted drop and never touches the connection: a stranger cannot reject
//!   or disconnect someone else's connection without forging its source
//!   address and guessing two random 32-bit IDs.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use super::error::{CmError, MadError};
use super::mad::MAD_LEN;
use super::msg::{private_len, reason, sidr_status, CmMad, CmMessage, Drep, Dreq, Mra, MsgRef, Rej, Rep, Req, Rtu, SidrRep, SidrReq};
use crate::Instant;

/// A GID (on RoCEv2: an IPv6 address, IPv4 mapped as `::ffff:a.b.c.d`).
pub type Gid = [u8; 16];

/// A CM id: the local Communication ID of a connection, or the Request ID of
/// a SIDR exchange (random, never 0, unique among live ids).
pub type CmId = u32;

/// `4.096 µs × 2^exp`, the encoding of every CM and ACK timeout (IBTA 12.6.5).
pub fn timeout_duration(exp: u8) -> Duration {
    Duration::from_nanos(4096u64 << exp.min(31))
}

/// The agent's settings.
#[derive(Clone, Debug)]
pub struct CmConfig {
    /// Our CA GUID (REQ/REP "Local CA GUID").
    pub local_ca_guid: u64,
    /// How long we wait for an answer, as a timeout exponent; sent as the
    /// REQ's Remote and Local CM Response Timeout. RDMA-CM uses 20 (4.3 s).
    pub response_timeout: u8,
    /// Max CM Retries we ask for in a REQ (4 bits). RDMA-CM uses 15.
    pub max_retries: u8,
    /// The service timeout we announce in an MRA (exponent).
    pub mra_service_timeout: u8,
    /// Timewait after a disconnect.
    pub timewait: Duration,
    /// Live ids at most (connections, SIDR exchanges, timewait included).
    pub max_ids: usize,
}

impl Default for CmConfig {
    fn default() -> CmConfig {
        CmConfig { local_ca_guid: 0, response_timeout: 20, max_retries: 15, mra_service_timeout: 24, timewait: Duration::from_secs(1), max_ids: 4096 }
    }
}

/// Parameters of a connect (the REQ's fields the consumer chooses).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectParams {
    /// Service ID of the listener.
    pub service_id: u64,
    /// Our GID (the source address).
    pub local_gid: Gid,
    /// The peer's GID.
    pub remote_gid: Gid,
    /// Our QPN.
    pub qpn: u32,
    /// The REQ's Starting PSN: the PSN the passive side starts sending with,
    /// i.e. our receive PSN (Linux `cm.c`: the active side's `rq_psn`, the
    /// passive side's `sq_psn`; rxe's rping capture shows it).
    pub starting_psn: u32,
    /// Transport service type: 0 RC, 1 UC.
    pub transport: u8,
    /// READ/atomic requests we accept.
    pub responder_resources: u8,
    /// READ/atomic requests we issue.
    pub initiator_depth: u8,
    /// Path MTU (`ibv_mtu`, 1..=5).
    pub path_mtu: u8,
    /// Retry count (0..=7).
    pub retry_count: u8,
    /// RNR retry count (0..=7).
    pub rnr_retry_count: u8,
    /// Local ACK timeout (exponent, 0..=31).
    pub local_ack_timeout: u8,
    /// Hop limit of the path.
    pub hop_limit: u8,
    /// Traffic class of the path.
    pub traffic_class: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Our QP uses an SRQ.
    pub srq: bool,
    /// Private data (at most 92 bytes; RDMA-CM's IP header first).
    pub private_data: Vec<u8>,
}

impl ConnectParams {
    /// An RC connect from `local_gid` to `service_id` at `remote_gid` for QP
    /// `qpn`, with the usual path (MTU 1024, hop limit 64, no flow label),
    /// one READ/atomic each way, seven retries and RNR retries, local ACK
    /// timeout 14, starting PSN 0, no SRQ and no private data: a base to
    /// change with struct update syntax.
    pub fn rc(service_id: u64, local_gid: Gid, remote_gid: Gid, qpn: u32) -> ConnectParams {
        ConnectParams {
            service_id,
            local_gid,
            remote_gid,
            qpn,
            starting_psn: 0,
            transport: 0,
            responder_resources: 1,
            initiator_depth: 1,
            path_mtu: 3,
            retry_count: 7,
            rnr_retry_count: 7,
            local_ack_timeout: 14,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
            srq: false,
            private_data: Vec::new(),
        }
    }
}

/// Parameters of an accept (the REP's fields).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcceptParams {
    /// Our QPN.
    pub qpn: u32,
    /// The REP's Starting PSN: the PSN the active side starts sending with,
    /// i.e. our receive PSN.
    pub starting_psn: u32,
    /// READ/atomic requests we accept.
    pub responder_resources: u8,
    /// READ/atomic requests we issue.
    pub initiator_depth: u8,
    /// Target ACK delay (exponent).
    pub target_ack_delay: u8,
    /// RNR retry count (0..=7).
    pub rnr_retry_count: u8,
    /// Our QP uses an SRQ.
    pub srq: bool,
    /// Private data (at most 196 bytes).
    pub private_data: Vec<u8>,
}

/// What a connection attempt failed waiting for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waited {
    /// A REP to our REQ.
    Rep,
    /// An RTU to our REP.
    Rtu,
    /// A SIDR_REP to our SIDR_REQ.
    SidrRep,
}

/// What the agent tells its consumer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ for one of our listeners: [`Cm::accept`] or [`Cm::reject`] it.
    ConnectRequest {
        /// The new id.
        id: CmId,
        /// Service ID of the listener.
        service_id: u64,
        /// The peer's GID (the REQ's source).
        remote_gid: Gid,
        /// Our GID it was sent to.
        local_gid: Gid,
        /// The REQ.
        req: Box<Req>,
    },
    /// The REP to our REQ: move the QP to RTR/RTS, then [`Cm::ready_to_use`]
    /// (or [`Cm::reject`]).
    ConnectReply {
        /// The id.
        id: CmId,
        /// The REP.
        rep: Box<Rep>,
    },
    /// The connection is established (passive: RTU or [`Cm::establish`];
    /// active: after [`Cm::ready_to_use`]).
    Established {
        /// The id.
        id: CmId,
    },
    /// The peer rejected (REJ; `reason` from [`reason`]).
    Rejected {
        /// The id.
        id: CmId,
        /// The REJ's reason.
        reason: u16,
        /// The REJ's private data.
        private_data: Vec<u8>,
    },
    /// No answer after every retry.
    TimedOut {
        /// The id.
        id: CmId,
        /// What never came.
        waited: Waited,
    },
    /// The connection is being torn down: the peer's DREQ arrived (answer
    /// with [`Cm::disconnect`]), or our DREQ was answered or timed out.
    Disconnected {
        /// The id.
        id: CmId,
    },
    /// Timewait ended: the id is gone.
    TimewaitExit {
        /// The id.
        id: CmId,
    },
    /// A SIDR_REQ for one of our listeners: [`Cm::sidr_reply`] to it.
    SidrRequest {
        /// The new id.
        id: CmId,
        /// Service ID of the listener.
        service_id: u64,
        /// The peer's GID.
        remote_gid: Gid,
        /// Our GID it was sent to.
        local_gid: Gid,
        /// The SIDR_REQ.
        req: Box<SidrReq>,
    },
    /// The SIDR_REP to our SIDR_REQ (status from [`sidr_status`]).
    SidrReply {
        /// The id.
        id: CmId,
        /// The SIDR_REP.
        rep: Box<SidrRep>,
    },
}

/// A MAD for QP1 to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Our GID to send from.
    pub src_gid: Gid,
    /// The peer's GID.
    pub dst_gid: Gid,
    /// The 256-byte MAD.
    pub mad: [u8; MAD_LEN],
}

/// The agent's counters: every MAD that did not move a connection forward
/// is counted under one reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmStats {
    /// MADs handed to [`Cm::handle_mad`].
    pub rx_mads: u64,
    /// Not a CM message we can parse (bad header, attribute, field).
    pub rx_malformed: u64,
    /// Names no live id of ours.
    pub rx_unknown_id: u64,
    /// Names a live id but comes from another GID or names other peer IDs/QPN.
    pub rx_wrong_peer: u64,
    /// A message the id's state does not expect (dropped, IBTA 12.9.6).
    pub rx_bad_state: u64,
    /// Duplicates answered from state (or dropped where nothing is owed).
    pub rx_duplicates: u64,
    /// REQs or SIDR_REQs for a service nobody listens on.
    pub rx_no_listener: u64,
    /// REQs refused for the backlog or the agent's id bound.
    pub rx_over_limit: u64,
    /// REQs refused as stale.
    pub rx_stale: u64,
    /// MADs queued for sending.
    pub tx_mads: u64,
    /// Retransmissions among them.
    pub tx_retransmits: u64,
    /// Exchanges that ran out of retries.
    pub timeouts: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    ReqSent,
    MraReqRcvd,
    ReqRcvd,
    MraReqSent,
    RepSent,
    RepRcvd,
    Established,
    DreqSent,
    DreqRcvd,
    TimeWait,
    SidrReqSent,
    SidrReqRcvd,
    /// Our SIDR_REP was sent; kept to answer duplicates until timewait ends.
    SidrRepSent,
    /// The consumer rejected a REQ; the REJ is kept to answer duplicates
    /// (a lost REJ must not turn a retransmitted REQ into a new request).
    RejSent,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::ReqSent => "REQ_SENT",
            State::MraReqRcvd => "MRA_REQ_RCVD",
            State::ReqRcvd => "REQ_RCVD",
            State::MraReqSent => "MRA_REQ_SENT",
            State::RepSent => "REP_SENT",
            State::RepRcvd => "REP_RCVD",
            State::Established => "ESTABLISHED",
            State::DreqSent => "DREQ_SENT",
            State::DreqRcvd => "DREQ_RCVD",
            State::TimeWait => "TIMEWAIT",
            State::SidrReqSent => "SIDR_REQ_SENT",
            State::SidrReqRcvd => "SIDR_REQ_RCVD",
            State::SidrRepSent => "SIDR_REP_SENT",
            State::RejSent => "REJ_SENT",
        }
    }
}

/// One live id.
#[derive(Debug)]
struct Conn {
    state: State,
    local_gid: Gid,
    remote_gid: Gid,
    /// The peer's comm ID (0 until its REP, for an active connection).
    remote_comm_id: u32,
    local_qpn: u32,
    remote_qpn: u32,
    /// The listener a passive id came through (backlog accounting).
    listener: Option<u64>,
    /// Transaction ID of the current exchange (REQ's, then DREQ's).
    tid: u64,
    /// The last message we sent: retransmitted on timeouts, resent for duplicates.
    sent: Option<Box<[u8; MAD_LEN]>>,
    /// Retransmissions left for `sent`.
    retries_left: u8,
    /// Wait between retransmissions.
    wait: Duration,
    /// Max CM Retries of the connection (from the REQ).
    max_retries: u8,
    /// Next retransmission or expiry.
    deadline: Option<Instant>,
    /// The consumer destroyed the id: no more events; state runs out alone.
    detached: bool,
}

/// The CM agent of one port (see the module docs).
#[derive(Debug)]
pub struct Cm {
    config: CmConfig,
    conns: HashMap<CmId, Conn>,
    /// Listeners: service ID → backlog.
    listeners: HashMap<u64, usize>,
    /// Passive ids not yet accepted or rejected, per listener.
    pending: HashMap<u64, usize>,
    /// Passive ids by (peer GID, peer comm ID or SIDR request ID): duplicate detection.
    by_remote: HashMap<(Gid, u32), CmId>,
    transmits: VecDeque<Transmit>,
    events: VecDeque<CmEvent>,
    stats: CmStats,
    rng: u64,
    tid_high: u64,
}

impl Cm {
    /// An agent whose IDs follow a seed from the OS's per-process randomness
    /// (std's `RandomState`; no I/O here).
    pub fn new(config: CmConfig) -> Cm {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(config.local_ca_guid);
        Cm::with_seed(config, h.finish())
    }

    /// An agent whose IDs follow `seed` (simulations).
    pub fn with_seed(config: CmConfig, seed: u64) -> Cm {
        let mut cm = Cm {
            config,
            conns: HashMap::new(),
            listeners: HashMap::new(),
            pending: HashMap::new(),
            by_remote: HashMap::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            stats: CmStats::default(),
            rng: seed,
            tid_high: 0,
        };
        cm.tid_high = (cm.next_random() as u32 as u64) << 32;
        cm
    }

    /// The counters.
    pub fn stats(&self) -> CmStats {
        self.stats
    }

    /// Live ids (timewait included).
    pub fn live_ids(&self) -> usize {
        self.conns.len()
    }

    /// The state of `id`, by its IBTA name (e.g. "ESTABLISHED").
    pub fn state_name(&self, id: CmId) -> Option<&'static str> {
        self.conns.get(&id).map(|c| c.state.name())
    }

    fn next_random(&mut self) -> u64 {
        // splitmix64 (Steele, Lea, Flood 2014).
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn new_id(&mut self) -> Result<CmId, CmError> {
        if self.conns.len() >= self.config.max_ids {
            return Err(CmError::TooMany(self.config.max_ids));
        }
        loop {
            let id = self.next_random() as u32;
            if id != 0 && !self.conns.contains_key(&id) {
                return Ok(id);
            }
        }
    }

    // ---- listeners

    /// Listen on `service_id`; at most `backlog` requests wait for an answer.
    pub fn listen(&mut self, service_id: u64, backlog: usize) -> Result<(), CmError> {
        if self.listeners.contains_key(&service_id) {
            return Err(CmError::ServiceInUse(service_id));
        }
        self.listeners.insert(service_id, backlog.max(1));
        Ok(())
    }

    /// Stop listening on `service_id` (requests already delivered stay).
    pub fn unlisten(&mut self, service_id: u64) -> Result<(), CmError> {
        self.listeners.remove(&service_id).map(|_| ()).ok_or(CmError::NoListener(service_id))
    }

    // ---- output

    /// The next MAD to send.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// Whether [`Cm::poll_transmit`] has a MAD to give.
    #[must_use]
    pub fn has_transmit(&self) -> bool {
        !self.transmits.is_empty()
    }

    /// The next event.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// When [`Cm::handle_timeout`] is next due.
    #[must_use]
    pub fn next_timeout(&self) -> Option<Instant> {
        self.conns.values().filter_map(|c| c.deadline).min()
    }

    fn send(&mut self, src_gid: Gid, dst_gid: Gid, mad: [u8; MAD_LEN]) {
        self.stats.tx_mads += 1;
        self.transmits.push_back(Transmit { src_gid, dst_gid, mad });
    }

    fn event(&mut self, id: CmId, ev: CmEvent) {
        if self.conns.get(&id).is_some_and(|c| !c.detached) {
            self.events.push_back(ev);
        }
    }

    /// Send `msg` on `id`'s exchange and keep it as the id's last message.
    fn send_kept(&mut self, id: CmId, msg: CmMessage, now: Instant, retransmit: bool) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        let mad = CmMad { tid: c.tid, msg }.emit();
        c.sent = Some(Box::new(mad));
        if retransmit {
            c.retries_left = c.max_retries;
            c.deadline = Some(now + c.wait);
        }
        let (s, d) = (c.local_gid, c.remote_gid);
        self.send(s, d, mad);
    }

    fn resend_kept(&mut self, id: CmId) {
        if let Some(c) = self.conns.get(&id) {
            if let Some(mad) = c.sent.as_deref().copied() {
                let (s, d) = (c.local_gid, c.remote_gid);
                self.send(s, d, mad);
            }
        }
    }

    fn remove(&mut self, id: CmId) {
        if let Some(c) = self.conns.remove(&id) {
            if let Some(l) = c.listener {
                if matches!(c.state, State::ReqRcvd | State::MraReqRcvd | State::MraReqSent | State::SidrReqRcvd) {
                    self.unpend(l);
                }
            }
            self.by_remote.retain(|_, v| *v != id);
        }
    }

    fn unpend(&mut self, listener: u64) {
        if let Some(n) = self.pending.get_mut(&listener) {
            *n = n.saturating_sub(1);
        }
    }

    fn enter_timewait(&mut self, id: CmId, now: Instant) {
        let tw = self.config.timewait;
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = State::TimeWait;
            c.deadline = Some(now + tw);
        }
    }

    fn check_private(len: usize, max: usize) -> Result<(), CmError> {
        if len > max {
            return Err(CmError::PrivateDataTooLong { len, max });
        }
        Ok(())
    }

    fn conn_mut(&mut self, id: CmId) -> Result<&mut Conn, CmError> {
        self.conns.get_mut(&id).filter(|c| !c.detached).ok_or(CmError::UnknownId(id))
    }

    fn bad_state(id: CmId, state: State, call: &'static str) -> CmError {
        CmError::BadState { id, state: state.name(), call }
    }

    // ---- active side

    /// Send a REQ (IBTA 12.9.5.1); the answer comes as [`CmEvent::ConnectReply`],
    /// [`CmEvent::Rejected`] or [`CmEvent::TimedOut`].
    pub fn connect(&mut self, now: Instant, p: &ConnectParams) -> Result<CmId, CmError> {
        Cm::check_private(p.private_data.len(), private_len::REQ)?;
        let checks: [(bool, &'static str); 7] = [
            (p.qpn < 1 << 24 && p.qpn > 1, "QPN"),
            (p.starting_psn < 1 << 24, "starting PSN"),
            (p.transport <= 1, "transport (0 RC, 1 UC)"),
            ((1..=5).contains(&p.path_mtu), "path MTU"),
            (p.retry_count <= 7 && p.rnr_retry_count <= 7, "retry count"),
            (p.local_ack_timeout <= 31, "local ACK timeout"),
            (p.flow_label < 1 << 20, "flow label"),
        ];
        if let Some((_, what)) = checks.iter().find(|(ok, _)| !ok) {
            return Err(CmError::Invalid(what));
        }
        let id = self.new_id()?;
        let tid = self.tid_high | u64::from(id);
        let req = Req {
            local_comm_id: id,
            service_id: p.service_id,
            local_ca_guid: self.config.local_ca_guid,
            local_qkey: 0,
            local_qpn: p.qpn,
            responder_resources: p.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: self.config.response_timeout,
            transport_service_type: p.transport,
            end_to_end_flow_control: false,
            starting_psn: p.starting_psn,
            local_cm_response_timeout: self.config.response_timeout,
            retry_count: p.retry_count,
            partition_key: 0xFFFF,
            path_mtu: p.path_mtu,
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count,
            max_cm_retries: self.config.max_retries,
            srq: p.srq,
            extended_transport_type: 0,
            primary: super::msg::ReqPath {
                local_lid: 0xFFFF,
                remote_lid: 0xFFFF,
                local_gid: p.local_gid,
                remote_gid: p.remote_gid,
                flow_label: p.flow_label,
                packet_rate: 1,
                traffic_class: p.traffic_class,
                hop_limit: p.hop_limit,
                sl: 0,
                subnet_local: false,
                local_ack_timeout: p.local_ack_timeout,
            },
            alternate: Default::default(),
            private_data: p.private_data.clone(),
        };
        self.conns.insert(
            id,
            Conn {
                state: State::ReqSent,
                local_gid: p.local_gid,
                remote_gid: p.remote_gid,
                remote_comm_id: 0,
                local_qpn: p.qpn,
                remote_qpn: 0,
                listener: None,
                tid,
                sent: None,
                retries_left: 0,
                wait: timeout_duration(self.config.response_timeout),
                max_retries: self.config.max_retries,
                deadline: None,
                detached: false,
            },
        );
        self.send_kept(id, CmMessage::Req(req), now, true);
        Ok(id)
    }

    /// After [`CmEvent::ConnectReply`]: send the RTU (IBTA 12.9.5.2); the
    /// connection is established.
    pub fn ready_to_use(&mut self, now: Instant, id: CmId, private_data: &[u8]) -> Result<(), CmError> {
        Cm::check_private(private_data.len(), private_len::RTU)?;
        let c = self.conn_mut(id)?;
        if c.state != State::RepRcvd {
            return Err(Cm::bad_state(id, c.state, "ready_to_use"));
        }
        c.state = State::Established;
        c.deadline = None;
        let msg = CmMessage::Rtu(Rtu { local_comm_id: id, remote_comm_id: c.remote_comm_id, private_data: private_data.to_vec() });
        self.send_kept(id, msg, now, false);
        self.event(id, CmEvent::Established { id });
        Ok(())
    }

    // ---- passive side

    /// Answer a [`CmEvent::ConnectRequest`] with a REP (IBTA 12.9.5.1); the
    /// RTU brings [`CmEvent::Established`].
    pub fn accept(&mut self, now: Instant, id: CmId, p: &AcceptParams) -> Result<(), CmError> {
        Cm::check_private(p.private_data.len(), private_len::REP)?;
        if p.qpn >= 1 << 24 || p.qpn < 2 || p.starting_psn >= 1 << 24 || p.rnr_retry_count > 7 {
            return Err(CmError::Invalid("QPN, starting PSN or RNR retry count"));
        }
        let guid = self.config.local_ca_guid;
        let c = self.conn_mut(id)?;
        if !matches!(c.state, State::ReqRcvd | State::MraReqSent) {
            return Err(Cm::bad_state(id, c.state, "accept"));
        }
        c.state = State::RepSent;
        c.local_qpn = p.qpn;
        let rep = Rep {
            local_comm_id: id,
            remote_comm_id: c.remote_comm_id,
            local_qkey: 0,
            local_qpn: p.qpn,
            local_eecn: 0,
            starting_psn: p.starting_psn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: p.target_ack_delay,
            failover_accepted: 0,
            end_to_end_flow_control: false,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq,
            local_ca_guid: guid,
            private_data: p.private_data.clone(),
        };
        if let Some(l) = c.listener {
            self.unpend(l);
        }
        self.send_kept(id, CmMessage::Rep(rep), now, true);
        Ok(())
    }

    /// Passive side: traffic arrived before the RTU (IBTA 12.9.5.3, the
    /// "communication established" event); treat the connection as established.
    pub fn establish(&mut self, id: CmId) -> Result<(), CmError> {
        let c = self.conn_mut(id)?;
        match c.state {
            State::RepSent => {
                c.state = State::Established;
                c.deadline = None;
                self.event(id, CmEvent::Established { id });
                Ok(())
            }
            State::Established => Ok(()),
            s => Err(Cm::bad_state(id, s, "establish")),
        }
    }

    /// Reject a request (passive, before accepting) or a REP (active, instead
    /// of the RTU): REJ reason 28 "consumer defined" with `private_data`
    /// (IBTA 12.6.7). The id is gone for the consumer; a rejected REQ's REJ
    /// is kept until timewait ends to answer the REQ's retransmissions.
    pub fn reject(&mut self, now: Instant, id: CmId, private_data: &[u8]) -> Result<(), CmError> {
        Cm::check_private(private_data.len(), private_len::REJ)?;
        let timewait = self.config.timewait;
        let c = self.conn_mut(id)?;
        let msg_rejected = match c.state {
            State::ReqRcvd | State::MraReqSent => MsgRef::Req,
            State::RepRcvd => MsgRef::Rep,
            s => return Err(Cm::bad_state(id, s, "reject")),
        };
        let rej = Rej {
            local_comm_id: id,
            remote_comm_id: c.remote_comm_id,
            msg_rejected,
            reject_info_len: 0,
            reason: reason::CONSUMER_DEFINED,
            ari: [0; 72],
            private_data: private_data.to_vec(),
        };
        if msg_rejected == MsgRef::Rep {
            let (tid, s, d) = (c.tid, c.local_gid, c.remote_gid);
            self.send(s, d, CmMad { tid, msg: CmMessage::Rej(rej) }.emit());
            self.remove(id);
            return Ok(());
        }
        c.state = State::RejSent;
        c.detached = true;
        c.deadline = Some(now + timewait);
        if let Some(l) = c.listener {
            self.unpend(l);
        }
        self.send_kept(id, CmMessage::Rej(rej), now, false);
        Ok(())
    }

    // ---- release

    /// Disconnect: from ESTABLISHED send a DREQ (the DREP or its timeout
    /// brings [`CmEvent::Disconnected`]); after the peer's DREQ send the DREP.
    /// Both end in timewait (IBTA 12.9.8.3).
    pub fn disconnect(&mut self, now: Instant, id: CmId, private_data: &[u8]) -> Result<(), CmError> {
        Cm::check_private(private_data.len(), private_len::DREQ)?;
        let state = self.conn_mut(id)?.state;
        match state {
            State::Established => {
                self.send_dreq(now, id, private_data);
                Ok(())
            }
            State::DreqRcvd => {
                self.send_drep(id, private_data);
                self.enter_timewait(id, now);
                Ok(())
            }
            State::DreqSent | State::TimeWait => Ok(()),
            s => Err(Cm::bad_state(id, s, "disconnect")),
        }
    }

    fn send_dreq(&mut self, now: Instant, id: CmId, private_data: &[u8]) {
        let tid_high = self.tid_high;
        let wait = timeout_duration(self.config.response_timeout);
        let Some(c) = self.conns.get_mut(&id) else { return };
        c.state = State::DreqSent;
        c.tid = tid_high | u64::from(id) ^ 0x8000_0000_0000;
        c.wait = wait;
        let msg = CmMessage::Dreq(Dreq {
            local_comm_id: id,
            remote_comm_id: c.remote_comm_id,
            remote_qpn: c.remote_qpn,
            private_data: private_data.to_vec(),
        });
        self.send_kept(id, msg, now, true);
    }

    fn send_drep(&mut self, id: CmId, private_data: &[u8]) {
        let Some(c) = self.conns.get(&id) else { return };
        let msg = CmMessage::Drep(Drep { local_comm_id: id, remote_comm_id: c.remote_comm_id, private_data: private_data.to_vec() });
        let (tid, s, d) = (c.tid, c.local_gid, c.remote_gid);
        let mad = CmMad { tid, msg }.emit();
        if let Some(c) = self.conns.get_mut(&id) {
            c.sent = Some(Box::new(mad));
        }
        self.send(s, d, mad);
    }

    /// The consumer is done with `id` (as `ib_destroy_cm_id`): whatever the
    /// protocol still owes is sent — REJ "timeout" for our unanswered REQ,
    /// REJ "consumer defined" for an unanswered REQ or REP, a DREQ for an
    /// established connection, a DREP for a received DREQ — and the id runs
    /// out its timewait with no further events.
    pub fn destroy(&mut self, now: Instant, id: CmId) -> Result<(), CmError> {
        let state = self.conn_mut(id)?.state;
        match state {
            State::ReqSent | State::MraReqRcvd => {
                self.send_timeout_rej(id);
                self.remove(id);
            }
            State::ReqRcvd | State::MraReqSent | State::RepRcvd => {
                self.reject(now, id, &[])?;
            }
            State::RepSent => {
                let c = &self.conns[&id];
                let rej = Rej {
                    local_comm_id: id,
                    remote_comm_id: c.remote_comm_id,
                    msg_rejected: MsgRef::Rep,
                    reject_info_len: 0,
                    reason: reason::CONSUMER_DEFINED,
                    ari: [0; 72],
                    private_data: vec![],
                };
                let (tid, s, d) = (c.tid, c.local_gid, c.remote_gid);
                self.send(s, d, CmMad { tid, msg: CmMessage::Rej(rej) }.emit());
                self.remove(id);
            }
            State::Established => {
                self.send_dreq(now, id, &[]);
            }
            State::DreqRcvd => {
                self.send_drep(id, &[]);
                self.enter_timewait(id, now);
            }
            State::DreqSent | State::TimeWait | State::SidrRepSent | State::RejSent => {}
            State::SidrReqSent => self.remove(id),
            State::SidrReqRcvd => {
                self.sidr_reply(now, id, sidr_status::REJECTED, 0, 0, &[])?;
            }
        }
        if let Some(c) = self.conns.get_mut(&id) {
            c.detached = true;
        }
        Ok(())
    }

    fn send_timeout_rej(&mut self, id: CmId) {
        let guid = self.config.local_ca_guid;
        let Some(c) = self.conns.get(&id) else { return };
        let mut ari = [0u8; 72];
        ari[..8].copy_from_slice(&guid.to_be_bytes());
        let rej = Rej {
            local_comm_id: id,
            remote_comm_id: c.remote_comm_id,
            msg_rejected: MsgRef::Req,
            reject_info_len: 8,
            reason: reason::TIMEOUT,
            ari,
            private_data: vec![],
        };
        let (tid, s, d) = (c.tid, c.local_gid, c.remote_gid);
        self.send(s, d, CmMad { tid, msg: CmMessage::Rej(rej) }.emit());
    }

    // ---- SIDR

    /// Send a SIDR_REQ (IBTA 12.11.1) to resolve `service_id` at `remote_gid`
    /// to a UD QPN and Q_Key; the answer comes as [`CmEvent::SidrReply`] or
    /// [`CmEvent::TimedOut`].
    pub fn sidr_request(&mut self, now: Instant, service_id: u64, local_gid: Gid, remote_gid: Gid, private_data: &[u8]) -> Result<CmId, CmError> {
        Cm::check_private(private_data.len(), private_len::SIDR_REQ)?;
        let id = self.new_id()?;
        let tid = self.tid_high | u64::from(id);
        self.conns.insert(
            id,
            Conn {
                state: State::SidrReqSent,
                local_gid,
                remote_gid,
                remote_comm_id: 0,
                local_qpn: 0,
                remote_qpn: 0,
                listener: None,
                tid,
                sent: None,
                retries_left: 0,
                wait: timeout_duration(self.config.response_timeout),
                max_retries: self.config.max_retries,
                deadline: None,
                detached: false,
            },
        );
        let msg = CmMessage::SidrReq(SidrReq { request_id: id, partition_key: 0xFFFF, service_id, private_data: private_data.to_vec() });
        self.send_kept(id, msg, now, true);
        Ok(id)
    }

    /// Answer a [`CmEvent::SidrRequest`] (IBTA 12.11.2). The reply is kept to
    /// answer duplicates until timewait ends.
    pub fn sidr_reply(&mut self, now: Instant, id: CmId, status: u8, qpn: u32, qkey: u32, private_data: &[u8]) -> Result<(), CmError> {
        Cm::check_private(private_data.len(), private_len::SIDR_REP)?;
        if qpn >= 1 << 24 {
            return Err(CmError::Invalid("QPN"));
        }
        let timewait = self.config.timewait;
        let c = self.conn_mut(id)?;
        if c.state != State::SidrReqRcvd {
            return Err(Cm::bad_state(id, c.state, "sidr_reply"));
        }
        let rep = SidrRep {
            request_id: c.remote_comm_id,
            status,
            add_info_len: 0,
            qpn,
            service_id: c.listener.unwrap_or(0),
            qkey,
            class_port_info: [0; 72],
            private_data: private_data.to_vec(),
        };
        c.state = State::SidrRepSent;
        c.deadline = Some(now + timewait);
        if let Some(l) = c.listener {
            self.unpend(l);
        }
        self.send_kept(id, CmMessage::SidrRep(rep), now, false);
        Ok(())
    }

    // ---- time

    /// Retransmit what is due, fail what ran out of retries, end timewaits.
    pub fn handle_timeout(&mut self, now: Instant) {
        let due: Vec<CmId> = self.conns.iter().filter(|(_, c)| c.deadline.is_some_and(|d| d <= now)).map(|(&id, _)| id).collect();
        for id in due {
            let Some(c) = self.conns.get_mut(&id) else { continue };
            match c.state {
                State::TimeWait | State::SidrRepSent | State::RejSent => {
                    let emit = c.state == State::TimeWait;
                    if emit {
                        self.event(id, CmEvent::TimewaitExit { id });
                    }
                    self.remove(id);
                }
                State::ReqSent | State::MraReqRcvd | State::RepSent | State::DreqSent | State::SidrReqSent if c.retries_left > 0 => {
                    c.retries_left -= 1;
                    c.deadline = Some(now + c.wait);
                    if c.state == State::MraReqRcvd {
                        c.state = State::ReqSent;
                    }
                    self.stats.tx_retransmits += 1;
                    self.resend_kept(id);
                }
                State::ReqSent | State::MraReqRcvd => {
                    self.stats.timeouts += 1;
                    self.send_timeout_rej(id);
                    self.event(id, CmEvent::TimedOut { id, waited: Waited::Rep });
                    self.remove(id);
                }
                State::RepSent => {
                    self.stats.timeouts += 1;
                    self.event(id, CmEvent::TimedOut { id, waited: Waited::Rtu });
                    self.remove(id);
                }
                State::SidrReqSent => {
                    self.stats.timeouts += 1;
                    self.event(id, CmEvent::TimedOut { id, waited: Waited::SidrRep });
                    self.remove(id);
                }
                State::DreqSent => {
                    // IBTA 12.9.8.3.1: no DREP after every retry: timewait anyway.
                    self.stats.timeouts += 1;
                    self.event(id, CmEvent::Disconnected { id });
                    self.enter_timewait(id, now);
                }
                _ => c.deadline = None,
            }
        }
    }

    // ---- input

    /// A MAD that arrived on QP1 from `src_gid` to our `dst_gid`. A MAD that
    /// moves nothing forward is counted in [`CmStats`] and returned as the
    /// reason; nothing here panics on input.
    pub fn handle_mad(&mut self, now: Instant, src_gid: Gid, dst_gid: Gid, mad: &[u8]) -> Result<(), Drop> {
        self.stats.rx_mads += 1;
        let m = match CmMad::parse(mad) {
            Ok(m) => m,
            Err(e) => {
                self.stats.rx_malformed += 1;
                return Err(Drop::Malformed(e));
            }
        };
        let r = match m.msg {
            CmMessage::Req(req) => self.handle_req(now, src_gid, dst_gid, m.tid, req),
            CmMessage::Rep(rep) => self.handle_rep(now, src_gid, rep),
            CmMessage::Rtu(rtu) => self.handle_rtu(src_gid, rtu),
            CmMessage::Mra(mra) => self.handle_mra(now, src_gid, mra),
            CmMessage::Rej(rej) => self.handle_rej(now, src_gid, rej),
            CmMessage::Dreq(dreq) => self.handle_dreq(now, src_gid, dst_gid, m.tid, dreq),
            CmMessage::Drep(drep) => self.handle_drep(now, src_gid, drep),
            CmMessage::SidrReq(req) => self.handle_sidr_req(src_gid, dst_gid, m.tid, req),
            CmMessage::SidrRep(rep) => self.handle_sidr_rep(src_gid, rep),
        };
        if let Err(d) = r {
            match d {
                Drop::Malformed(_) => self.stats.rx_malformed += 1,
                Drop::UnknownId => self.stats.rx_unknown_id += 1,
                Drop::WrongPeer => self.stats.rx_wrong_peer += 1,
                Drop::BadState => self.stats.rx_bad_state += 1,
                Drop::Duplicate => self.stats.rx_duplicates += 1,
                Drop::NoListener => self.stats.rx_no_listener += 1,
                Drop::OverLimit => self.stats.rx_over_limit += 1,
                Drop::Stale => self.stats.rx_stale += 1,
            }
        }
        r
    }

    /// The live id `local` that `src_gid` may address as the peer whose comm
    /// ID is `remote` (0 accepted where the peer has none yet).
    fn find(&self, src_gid: Gid, local: u32, remote: u32, remote_may_be_zero: bool) -> Result<CmId, Drop> {
        let c = self.conns.get(&local).ok_or(Drop::UnknownId)?;
        if c.remote_gid != src_gid {
            return Err(Drop::WrongPeer);
        }
        let remote_ok = c.remote_comm_id == remote || (remote_may_be_zero && (remote == 0 || c.remote_comm_id == 0));
        if !remote_ok {
            return Err(Drop::WrongPeer);
        }
        Ok(local)
    }

    fn reply_rej(&mut self, src: Gid, dst: Gid, tid: u64, remote_comm_id: u32, msg: MsgRef, why: u16) {
        let rej = Rej { local_comm_id: 0, remote_comm_id, msg_rejected: msg, reject_info_len: 0, reason: why, ari: [0; 72], private_data: vec![] };
        self.send(dst, src, CmMad { tid, msg: CmMessage::Rej(rej) }.emit());
    }

    fn handle_req(&mut self, now: Instant, src: Gid, dst: Gid, tid: u64, req: Req) -> Result<(), Drop> {
        // Duplicate of a REQ we hold (IBTA 12.9.6; Linux cm_dup_req_handler).
        if let Some(&id) = self.by_remote.get(&(src, req.local_comm_id)) {
            let state = self.conns[&id].state;
            match state {
                State::ReqRcvd => {
                    let mra = Mra {
                        local_comm_id: id,
                        remote_comm_id: req.local_comm_id,
                        msg_mraed: MsgRef::Req,
                        service_timeout: self.config.mra_service_timeout,
                        private_data: vec![],
                    };
                    if let Some(c) = self.conns.get_mut(&id) {
                        c.state = State::MraReqSent;
                    }
                    self.send_kept(id, CmMessage::Mra(mra), now, false);
                }
                State::MraReqSent | State::RepSent | State::RejSent => self.resend_kept(id),
                State::TimeWait => {
                    self.reply_rej(src, dst, tid, req.local_comm_id, MsgRef::Req, reason::STALE_CONN);
                    return Err(Drop::Stale);
                }
                _ => {}
            }
            return Err(Drop::Duplicate);
        }
        if req.transport_service_type > 1 {
            self.reply_rej(src, dst, tid, req.local_comm_id, MsgRef::Req, reason::INVALID_TRANSPORT_TYPE);
            return Err(Drop::Malformed(MadError::Field("transport service type")));
        }
        if !(1..=5).contains(&req.path_mtu) {
            self.reply_rej(src, dst, tid, req.local_comm_id, MsgRef::Req, reason::INVALID_MTU);
            return Err(Drop::Malformed(MadError::Field("path MTU")));
        }
        let Some(&backlog) = self.listeners.get(&req.service_id) else {
            self.reply_rej(src, dst, tid, req.local_comm_id, MsgRef::Req, reason::INVALID_SERVICE_ID);
            return Err(Drop::NoListener);
        };
        // Stale: the peer reuses a QPN one of our connections with it still
        // holds (IBTA 12.9.8.3.1; Linux cm_req_handler's remote QPN check).
        let stale = self
            .conns
            .iter()
            .find(|(_, c)| c.remote_gid == src && c.remote_qpn == req.local_qpn && c.remote_comm_id != 0)
            .map(|(&id, c)| (id, c.state));
        if let Some((old, state)) = stale {
            self.reply_rej(src, dst, tid, req.local_comm_id, MsgRef::Req, reason::STALE_CONN);
            if state == State::Established {
                self.send_dreq(now, old, &[]);
            }
            return Err(Drop::Stale);
        }
        let pending = self.pending.get(&req.service_id).copied().unwrap_or(0);
        if pending >= backlog || self.conns.len() >= self.config.max_ids {
            self.reply_rej(src, dst, tid, req.local_comm_id, MsgRef::Req, reason::NO_RESOURCES);
            return Err(Drop::OverLimit);
        }
        let Ok(id) = self.new_id() else {
            self.reply_rej(src, dst, tid, req.local_comm_id, MsgRef::Req, reason::NO_RESOURCES);
            return Err(Drop::OverLimit);
        };
        *self.pending.entry(req.service_id).or_insert(0) += 1;
        self.by_remote.insert((src, req.local_comm_id), id);
        self.conns.insert(
            id,
            Conn {
                state: State::ReqRcvd,
                local_gid: dst,
                remote_gid: src,
                remote_comm_id: req.local_comm_id,
                local_qpn: 0,
                remote_qpn: req.local_qpn,
                listener: Some(req.service_id),
                tid,
                sent: None,
                retries_left: 0,
                // We wait for the RTU as long as the peer says it takes
                // (its Local CM Response Timeout), retrying as often as it asks.
                wait: timeout_duration(req.local_cm_response_timeout),
                max_retries: req.max_cm_retries,
                deadline: None,
                detached: false,
            },
        );
        let service_id = req.service_id;
        self.event(id, CmEvent::ConnectRequest { id, service_id, remote_gid: src, local_gid: dst, req: Box::new(req) });
        Ok(())
    }

    fn handle_rep(&mut self, now: Instant, src: Gid, rep: Rep) -> Result<(), Drop> {
        let id = self.find(src, rep.remote_comm_id, rep.local_comm_id, true)?;
        let c = self.conns.get_mut(&id).ok_or(Drop::UnknownId)?;
        match c.state {
            State::ReqSent | State::MraReqRcvd => {
                c.state = State::RepRcvd;
                c.remote_comm_id = rep.local_comm_id;
                c.remote_qpn = rep.local_qpn;
                c.deadline = None;
                c.sent = None;
                let _ = now;
                self.event(id, CmEvent::ConnectReply { id, rep: Box::new(rep) });
                Ok(())
            }
            // Our RTU was lost: send it again (Linux cm_dup_rep_handler).
            State::Established if c.remote_comm_id == rep.local_comm_id => {
                self.resend_kept(id);
                Err(Drop::Duplicate)
            }
            State::RepRcvd => Err(Drop::Duplicate),
            _ => Err(Drop::BadState),
        }
    }

    fn handle_rtu(&mut self, src: Gid, rtu: Rtu) -> Result<(), Drop> {
        let id = self.find(src, rtu.remote_comm_id, rtu.local_comm_id, false)?;
        let c = self.conns.get_mut(&id).ok_or(Drop::UnknownId)?;
        match c.state {
            State::RepSent => {
                c.state = State::Established;
                c.deadline = None;
                self.event(id, CmEvent::Established { id });
                Ok(())
            }
            State::Established => Err(Drop::Duplicate),
            _ => Err(Drop::BadState),
        }
    }

    fn handle_mra(&mut self, now: Instant, src: Gid, mra: Mra) -> Result<(), Drop> {
        let id = self.find(src, mra.remote_comm_id, mra.local_comm_id, true)?;
        let response = self.config.response_timeout;
        let c = self.conns.get_mut(&id).ok_or(Drop::UnknownId)?;
        match (c.state, mra.msg_mraed) {
            // IBTA 12.6.6: wait the service timeout on top of the response time.
            (State::ReqSent | State::MraReqRcvd, MsgRef::Req) => {
                c.state = State::MraReqRcvd;
                c.remote_comm_id = mra.local_comm_id;
                c.deadline = Some(now + timeout_duration(mra.service_timeout) + timeout_duration(response));
                Ok(())
            }
            (State::RepSent, MsgRef::Rep) => {
                c.deadline = Some(now + timeout_duration(mra.service_timeout) + c.wait);
                Ok(())
            }
            _ => Err(Drop::BadState),
        }
    }

    fn handle_rej(&mut self, now: Instant, src: Gid, rej: Rej) -> Result<(), Drop> {
        let id = self.find(src, rej.remote_comm_id, rej.local_comm_id, true)?;
        let state = self.conns[&id].state;
        let answers_ours = match (state, rej.msg_rejected) {
            (State::ReqSent | State::MraReqRcvd, MsgRef::Req) => true,
            (State::RepSent, MsgRef::Rep) => true,
            // The active side gave up (REJ "timeout") or rejected our REP late.
            (State::ReqRcvd | State::MraReqSent | State::RepSent, _) => true,
            _ => false,
        };
        if !answers_ours {
            return Err(Drop::BadState);
        }
        self.event(id, CmEvent::Rejected { id, reason: rej.reason, private_data: rej.private_data });
        if rej.reason == reason::STALE_CONN && matches!(state, State::ReqSent | State::MraReqRcvd) {
            // Linux cm_rej_handler: a stale REQ's id goes to timewait.
            self.enter_timewait(id, now);
            if let Some(c) = self.conns.get_mut(&id) {
                c.detached = true;
            }
        } else {
            self.remove(id);
        }
        Ok(())
    }

    fn handle_dreq(&mut self, now: Instant, src: Gid, dst: Gid, tid: u64, dreq: Dreq) -> Result<(), Drop> {
        let id = self.find(src, dreq.remote_comm_id, dreq.local_comm_id, false)?;
        let c = self.conns.get_mut(&id).ok_or(Drop::UnknownId)?;
        if c.local_qpn != dreq.remote_qpn {
            return Err(Drop::WrongPeer);
        }
        let _ = dst;
        c.tid = tid;
        match c.state {
            State::Established | State::RepSent => {
                // A DREQ in REP_SENT means the peer's RTU was lost: the peer
                // established (it sent the RTU), so we did too (IBTA 12.9.5.3).
                let was = c.state;
                c.state = State::DreqRcvd;
                c.deadline = None;
                if was == State::RepSent {
                    self.event(id, CmEvent::Established { id });
                }
                self.event(id, CmEvent::Disconnected { id });
                if self.conns.get(&id).is_some_and(|c| c.detached) {
                    self.send_drep(id, &[]);
                    self.enter_timewait(id, now);
                }
                Ok(())
            }
            // Both sides disconnect at once: answer, and wait out timewait.
            State::DreqSent => {
                self.send_drep(id, &[]);
                self.event(id, CmEvent::Disconnected { id });
                self.enter_timewait(id, now);
                Ok(())
            }
            State::TimeWait => {
                self.send_drep(id, &[]);
                Err(Drop::Duplicate)
            }
            State::DreqRcvd => Err(Drop::Duplicate),
            _ => Err(Drop::BadState),
        }
    }

    fn handle_drep(&mut self, now: Instant, src: Gid, drep: Drep) -> Result<(), Drop> {
        let id = self.find(src, drep.remote_comm_id, drep.local_comm_id, false)?;
        match self.conns[&id].state {
            State::DreqSent => {
                self.event(id, CmEvent::Disconnected { id });
                self.enter_timewait(id, now);
                Ok(())
            }
            State::TimeWait => Err(Drop::Duplicate),
            _ => Err(Drop::BadState),
        }
    }

    fn handle_sidr_req(&mut self, src: Gid, dst: Gid, tid: u64, req: SidrReq) -> Result<(), Drop> {
        if let Some(&id) = self.by_remote.get(&(src, req.request_id)) {
            if self.conns[&id].state == State::SidrRepSent {
                self.resend_kept(id);
            }
            return Err(Drop::Duplicate);
        }
        let reply = |cm: &mut Cm, status: u8| {
            let rep = SidrRep {
                request_id: req.request_id,
                status,
                add_info_len: 0,
                qpn: 0,
                service_id: req.service_id,
                qkey: 0,
                class_port_info: [0; 72],
                private_data: vec![],
            };
            cm.send(dst, src, CmMad { tid, msg: CmMessage::SidrRep(rep) }.emit());
        };
        let Some(&backlog) = self.listeners.get(&req.service_id) else {
            reply(self, sidr_status::SID_NOT_SUPPORTED);
            return Err(Drop::NoListener);
        };
        let pending = self.pending.get(&req.service_id).copied().unwrap_or(0);
        let id = match self.new_id() {
            Ok(id) if pending < backlog => id,
            _ => {
                reply(self, sidr_status::NO_QP);
                return Err(Drop::OverLimit);
            }
        };
        *self.pending.entry(req.service_id).or_insert(0) += 1;
        self.by_remote.insert((src, req.request_id), id);
        self.conns.insert(
            id,
            Conn {
                state: State::SidrReqRcvd,
                local_gid: dst,
                remote_gid: src,
                remote_comm_id: req.request_id,
                local_qpn: 0,
                remote_qpn: 0,
                listener: Some(req.service_id),
                tid,
                sent: None,
                retries_left: 0,
                wait: Duration::ZERO,
                max_retries: 0,
                deadline: None,
                detached: false,
            },
        );
        let service_id = req.service_id;
        self.event(id, CmEvent::SidrRequest { id, service_id, remote_gid: src, local_gid: dst, req: Box::new(req) });
        Ok(())
    }

    fn handle_sidr_rep(&mut self, src: Gid, rep: SidrRep) -> Result<(), Drop> {
        let c = self.conns.get(&rep.request_id).ok_or(Drop::UnknownId)?;
        if c.remote_gid != src {
            return Err(Drop::WrongPeer);
        }
        if c.state != State::SidrReqSent {
            return Err(Drop::BadState);
        }
        let id = rep.request_id;
        self.event(id, CmEvent::SidrReply { id, rep: Box::new(rep) });
        self.remove(id);
        Ok(())
    }
}

/// Why [`Cm::handle_mad`] did not act on a MAD (each is counted in [`CmStats`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drop {
    /// Not a CM message we can parse.
    Malformed(MadError),
    /// Names no live id.
    UnknownId,
    /// From another GID than the id's peer, or naming other IDs/QPN.
    WrongPeer,
    /// Not expected in the id's state.
    BadState,
    /// A duplicate (answered from state where something is owed).
    Duplicate,
    /// For a service nobody listens on (answered with REJ / SIDR_REP).
    NoListener,
    /// Over the backlog or the id bound (answered with REJ / SIDR_REP).
    OverLimit,
    /// A stale REQ (answered with REJ reason 10).
    Stale,
}
