//! RDMA-CM in the Rust API: connect RC/UC QPs the way librdmacm does, by IP
//! address and port, through the CM agent on QP1 (`rocev2::cm`).
//!
//! ```text
//! passive                                    active
//! ch.listen(PortSpace::Tcp, 7174, 8)
//!                                            id = ch.connect(&qp, addr, &param)   REQ →
//! ConnectRequest(req) ← get_event
//! ch.accept(&req, &qp, &param)   ← REP                                            (QP: INIT, RTR, RTS)
//!                                            ConnectResponse(rep) ← get_event
//!                                            ch.complete_connect(&rep, &qp)       RTU → (QP: RTR, RTS)
//! Established ← get_event                    Established ← get_event
//! ...                                        ch.disconnect(id, Some(&qp))         DREQ →
//! Disconnected ← get_event
//! ch.disconnect(id, Some(&qp))   ← DREP                                           Disconnected
//! ```
//!
//! As librdmacm does with a QP attached to the id: the QP is moved through
//! INIT, RTR and RTS with what the REQ and REP carry (QPNs, starting PSNs,
//! path MTU, READ/atomic depths, retry counts), and to ERR on disconnect.
//! The active side's private data starts with RDMA-CM's IP header (source
//! and destination address and port, IBTA Annex A11); a listener sees the
//! consumer's part only, and the addresses in [`ConnectRequest`].
//!
//! One channel per device: the CM agent is the device's (QP1), its events
//! arrive on the channel's file descriptor ([`CmChannel::fd`]).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::Duration;

use rocev2::cm::{AcceptParams, Cm, CmConfig, CmError, CmaHeader, ConnectParams, Waited};
pub use rocev2::cm::{CmId, PortSpace};
use rocev2::transport::attr::AddressVector;

use crate::device::Context;
use crate::error::{Error, ErrorKind, Result};
use crate::qp::{AhAttr, Qp, QpAttr};
use crate::{Access, Gid, Mtu, QpAttrMask, QpState, QpType};

mod mcast;
pub use mcast::{McastGroup, MCAST_QPN};

/// Private data a connect carries for the consumer: the REQ's 92 bytes less
/// RDMA-CM's 36-byte IP header (librdmacm: `RDMA_MAX_PRIVATE_DATA` for a
/// TCP-space REQ is 56).
pub const MAX_CONNECT_PRIVATE_DATA: usize = 92 - rocev2::cm::cma::CMA_HDR_LEN;

/// The local ACK timeout RDMA-CM uses on RoCE, in the REQ and for both QPs:
/// the kernel's CMA sets a RoCE path's packet lifetime to 18
/// (`CMA_IBOE_PACKET_LIFETIME`) and the timeout to one more, 4.096 µs × 2^19
/// ≈ 2.1 s (rxe's rping REQ carries 19).
pub const ROCE_LOCAL_ACK_TIMEOUT: u8 = 19;

/// `struct rdma_conn_param`: what the consumer chooses for a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnParam {
    /// Private data for the peer.
    pub private_data: Vec<u8>,
    /// READ/atomic requests we accept.
    pub responder_resources: u8,
    /// READ/atomic requests we issue.
    pub initiator_depth: u8,
    /// Transport retries (0..=7).
    pub retry_count: u8,
    /// RNR retries (0..=7; 7 = forever).
    pub rnr_retry_count: u8,
}

impl Default for ConnParam {
    /// One READ/atomic each way, 7 retries, RNR retry forever (rping's choices).
    fn default() -> ConnParam {
        ConnParam { private_data: vec![], responder_resources: 1, initiator_depth: 1, retry_count: 7, rnr_retry_count: 7 }
    }
}

/// A connect request for one of our listeners (`RDMA_CM_EVENT_CONNECT_REQUEST`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectRequest {
    /// The new id: accept or reject it.
    pub id: CmId,
    /// The active side's address and port (from RDMA-CM's IP header).
    pub src: SocketAddr,
    /// The address and port it connected to.
    pub dst: SocketAddr,
    /// The consumer's private data.
    pub private_data: Vec<u8>,
    /// The peer's QPN.
    pub remote_qpn: u32,
    /// READ/atomic requests the peer accepts.
    pub responder_resources: u8,
    /// READ/atomic requests the peer issues.
    pub initiator_depth: u8,
    /// RC or UC.
    pub qp_type: QpType,
    remote_gid: Gid,
    local_gid: Gid,
    starting_psn: u32,
    path_mtu: u8,
    retry_count: u8,
    local_ack_timeout: u8,
    flow_label: u32,
    /// The starting PSN our REP will carry (our RQ PSN), drawn when the
    /// request arrives so `qp_attr_for_request` and `accept` agree.
    rq_psn: u32,
}

/// The REP to our connect (`RDMA_CM_EVENT_CONNECT_RESPONSE`): finish with
/// [`CmChannel::complete_connect`] or [`CmChannel::reject`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectResponse {
    /// The id.
    pub id: CmId,
    /// The peer's private data.
    pub private_data: Vec<u8>,
    /// The peer's QPN.
    pub remote_qpn: u32,
    /// READ/atomic requests the peer accepts.
    pub responder_resources: u8,
    /// READ/atomic requests the peer issues.
    pub initiator_depth: u8,
    starting_psn: u32,
    rnr_retry_count: u8,
}

/// Private data a UD resolution carries for the consumer: the SIDR_REQ's 216
/// bytes less RDMA-CM's IP header (librdmacm: 180 for `RDMA_PS_UDP`).
pub const MAX_UD_PRIVATE_DATA: usize = 216 - rocev2::cm::cma::CMA_HDR_LEN;

/// A UD request for one of our UDP-space listeners (SIDR_REQ,
/// `RDMA_CM_EVENT_CONNECT_REQUEST` on a `RDMA_PS_UDP` id): answer with
/// [`CmChannel::accept_ud`] or [`CmChannel::reject`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UdRequest {
    /// The new id.
    pub id: CmId,
    /// The requester's address and port (RDMA-CM's IP header).
    pub src: SocketAddr,
    /// The address and port it asked for.
    pub dst: SocketAddr,
    /// The consumer's private data.
    pub private_data: Vec<u8>,
}

/// The answer to our UD resolution (SIDR_REP with status 0): what
/// librdmacm reports as `RDMA_CM_EVENT_ESTABLISHED` with `param.ud`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UdResolved {
    /// The id.
    pub id: CmId,
    /// The peer's UD QPN.
    pub qpn: u32,
    /// Its Q_Key.
    pub qkey: u32,
    /// The peer's private data.
    pub private_data: Vec<u8>,
    /// The address vector that reaches it (for an AH).
    pub ah: AhAttr,
}

/// An event of the CM channel (`struct rdma_cm_event`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CmEvent {
    /// `RDMA_CM_EVENT_CONNECT_REQUEST`.
    ConnectRequest(Box<ConnectRequest>),
    /// `RDMA_CM_EVENT_CONNECT_RESPONSE`.
    ConnectResponse(Box<ConnectResponse>),
    /// `RDMA_CM_EVENT_ESTABLISHED`.
    Established {
        /// The id.
        id: CmId,
    },
    /// A UD request (SIDR_REQ) for a UDP-space listener.
    UdRequest(Box<UdRequest>),
    /// Our UD resolution was answered (SIDR_REP, status 0).
    UdResolved(Box<UdResolved>),
    /// `RDMA_CM_EVENT_REJECTED` (reason: `rocev2::cm::msg::reason`; for a
    /// UD resolution the SIDR_REP's status, `rocev2::cm::msg::sidr_status`).
    Rejected {
        /// The id.
        id: CmId,
        /// The REJ's reason (8 no listener, 28 consumer reject, ...).
        reason: u16,
        /// The REJ's private data.
        private_data: Vec<u8>,
    },
    /// `RDMA_CM_EVENT_UNREACHABLE`: no answer after every retry.
    Unreachable {
        /// The id.
        id: CmId,
    },
    /// `RDMA_CM_EVENT_DISCONNECTED`.
    Disconnected {
        /// The id.
        id: CmId,
    },
    /// `RDMA_CM_EVENT_TIMEWAIT_EXIT`: the id is gone.
    TimewaitExit {
        /// The id.
        id: CmId,
    },
}

/// What the channel remembers of an active id until its REP.
#[derive(Clone, Copy, Debug)]
struct Pending {
    remote_gid: Gid,
    sgid_index: u8,
    /// The PSN our REQ announced: the one we expect the peer's first packet
    /// to carry (our RQ PSN).
    rq_psn: u32,
    path_mtu: Mtu,
    flow_label: u32,
    param_retry: u8,
    rd_atomic: u8,
}

/// A connection's path and parameters, from which its QP's INIT, RTR and
/// RTS attributes follow (what the kernel's `rdma_init_qp_attr` answers).
#[derive(Clone, Copy, Debug)]
struct Path {
    dgid: Gid,
    sgid_index: u8,
    flow_label: u32,
    mtu: Mtu,
    remote_qpn: u32,
    rq_psn: u32,
    sq_psn: u32,
    responder: u8,
    initiator: u8,
    retry: u8,
    rnr_retry: u8,
    timeout: u8,
}

impl Path {
    fn check_state(state: QpState) -> Result<()> {
        match state {
            QpState::Init | QpState::Rtr | QpState::Rts => Ok(()),
            s => Err(Error::invalid(format!("no CM attributes for {s:?}"))),
        }
    }

    /// The attributes and mask for `state` (INIT, RTR or RTS) of an RC or UC QP.
    fn attrs(&self, state: QpState, qp_type: QpType) -> (QpAttr, QpAttrMask) {
        let rc = qp_type == QpType::Rc;
        let mut a = QpAttr { qp_state: state, ..QpAttr::default() };
        match state {
            QpState::Init => {
                a.qp_access_flags = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
                (a, QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS)
            }
            QpState::Rtr => {
                a.path_mtu = self.mtu;
                a.dest_qp_num = self.remote_qpn;
                a.rq_psn = rocev2::Psn::new(self.rq_psn);
                a.max_dest_rd_atomic = self.responder;
                a.min_rnr_timer = 12;
                a.ah_attr = Some(AhAttr {
                    dgid: self.dgid,
                    sgid_index: self.sgid_index,
                    port_num: 1,
                    flow_label: self.flow_label,
                    hop_limit: 64,
                    ..AhAttr::default()
                });
                let mut m = QpAttrMask::STATE | QpAttrMask::AV | QpAttrMask::PATH_MTU | QpAttrMask::DEST_QPN | QpAttrMask::RQ_PSN;
                if rc {
                    m |= QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER;
                }
                (a, m)
            }
            _ => {
                a.sq_psn = rocev2::Psn::new(self.sq_psn);
                a.timeout = self.timeout.clamp(1, 31);
                a.retry_cnt = self.retry.min(7);
                a.rnr_retry = self.rnr_retry.min(7);
                a.max_rd_atomic = self.initiator;
                let mut m = QpAttrMask::STATE | QpAttrMask::SQ_PSN;
                if rc {
                    m |= QpAttrMask::TIMEOUT | QpAttrMask::RETRY_CNT | QpAttrMask::RNR_RETRY | QpAttrMask::MAX_QP_RD_ATOMIC;
                }
                (a, m)
            }
        }
    }
}

/// An RDMA-CM event channel on one device (`rdma_create_event_channel` plus
/// the ids made on it).
pub struct CmChannel {
    ctx: Context,
    pending: Mutex<HashMap<CmId, Pending>>,
}

fn cm_err(e: CmError) -> Error {
    let kind = match e {
        CmError::UnknownId(_) => ErrorKind::NotFound,
        CmError::BadState { .. } => ErrorKind::InvalidState,
        CmError::ServiceInUse(_) => ErrorKind::Busy,
        CmError::NoListener(_) => ErrorKind::NotFound,
        CmError::TooMany(_) => ErrorKind::NoResources,
        _ => ErrorKind::InvalidArgument,
    };
    Error::new(kind, e.to_string())
}

/// A fresh 24-bit PSN or a port: unpredictable to other hosts, as the
/// kernel's CM draws them (std's per-process random keys; no I/O).
fn random_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    h.finish() as u32
}

/// An ephemeral port (Linux's default range 32768..60999), as the kernel's
/// CM binds one for an id without a port.
pub fn ephemeral_port() -> u16 {
    32768 + (random_u32() % 28232) as u16
}

fn gid_of(ip: IpAddr) -> Gid {
    match ip {
        IpAddr::V4(v4) => AddressVector::ipv4_gid(v4.octets()),
        IpAddr::V6(v6) => v6.octets(),
    }
}

fn ip_of(gid: &Gid) -> IpAddr {
    if AddressVector::is_ipv4_mapped(gid) {
        IpAddr::V4(std::net::Ipv4Addr::new(gid[12], gid[13], gid[14], gid[15]))
    } else {
        IpAddr::V6(std::net::Ipv6Addr::from(*gid))
    }
}

impl CmChannel {
    /// The CM channel of `ctx`'s device; starts the device's CM agent (QP1)
    /// the first time.
    pub fn new(ctx: &Context) -> Result<CmChannel> {
        let inner = &ctx.inner;
        let guid = u64::from_be_bytes({
            let m = inner.mac;
            [m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]]
        });
        inner.nic.enable_cm(Cm::new(CmConfig { local_ca_guid: guid, ..CmConfig::default() }));
        Ok(CmChannel { ctx: ctx.clone(), pending: Mutex::new(HashMap::new()) })
    }

    /// A file descriptor that becomes readable when an event waits (poll,
    /// epoll); [`CmChannel::get_event`] clears it.
    pub fn fd(&self) -> std::os::fd::RawFd {
        self.ctx.inner.nic.cm_event_fd()
    }

    fn with_cm<R>(&self, f: impl FnOnce(&mut Cm) -> std::result::Result<R, CmError>) -> Result<R> {
        self.ctx
            .inner
            .nic
            .with_gsi(|g| f(&mut g.cm))
            .ok_or_else(|| Error::new(ErrorKind::InvalidState, "the device's CM is not running"))?
            .map_err(cm_err)
    }

    /// `rdma_listen` on `port` of `space`: at most `backlog` requests wait
    /// for accept or reject.
    pub fn listen(&self, space: PortSpace, port: u16, backlog: usize) -> Result<()> {
        self.with_cm(|cm| cm.listen(space.service_id(port), backlog))
    }

    /// Stop listening.
    pub fn unlisten(&self, space: PortSpace, port: u16) -> Result<()> {
        self.with_cm(|cm| cm.unlisten(space.service_id(port)))
    }

    /// The GID index of ours that reaches `remote`: the IPv4-mapped GID for
    /// IPv4; for IPv6 the link-local GID for a link-local peer, else the
    /// first other IPv6 GID.
    fn sgid_index_for(&self, remote: &Gid) -> Result<u8> {
        let gids = &self.ctx.inner.gids;
        let v4 = AddressVector::is_ipv4_mapped(remote);
        let ll = |g: &Gid| g[0] == 0xfe && g[1] & 0xc0 == 0x80;
        gids.iter()
            .position(|g| if v4 { AddressVector::is_ipv4_mapped(g) } else { !AddressVector::is_ipv4_mapped(g) && ll(g) == ll(remote) })
            .map(|i| i as u8)
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no GID of this device reaches {}", ip_of(remote))))
    }

    /// Move `qp` from RESET to INIT as `rdma_create_qp` does (port 1, P_Key
    /// index 0, remote READ/WRITE/atomic allowed), so receives can be posted
    /// before the connection is up; a QP past RESET is left as it is.
    pub fn init_qp(qp: &Qp) -> Result<()> {
        if qp.query()?.qp_state != QpState::Reset {
            return Ok(());
        }
        let a = QpAttr {
            qp_state: QpState::Init,
            qp_access_flags: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            ..QpAttr::default()
        };
        qp.modify(&a, QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS)
    }

    /// `rdma_connect` (after `rdma_resolve_addr`/`rdma_resolve_route`, which
    /// this does too: the neighbour table gives the peer's MAC): send a REQ
    /// for `dst` in the TCP port space with `qp` (RC or UC, in RESET or
    /// INIT; moved to INIT here). Answers come as events.
    pub fn connect(&self, qp: &Qp, dst: SocketAddr, param: &ConnParam) -> Result<CmId> {
        self.connect_from(qp, None, dst, param)
    }

    /// [`CmChannel::connect`] from source port `src_port` (what
    /// `rdma_bind_addr` or `rdma_resolve_addr` chose; `None`: an ephemeral
    /// port, as the kernel's CM binds one).
    pub fn connect_from(&self, qp: &Qp, src_port: Option<u16>, dst: SocketAddr, param: &ConnParam) -> Result<CmId> {
        if param.private_data.len() > MAX_CONNECT_PRIVATE_DATA {
            return Err(Error::invalid(format!("private data of {} bytes (at most {MAX_CONNECT_PRIVATE_DATA})", param.private_data.len())));
        }
        let transport = match qp.qp_type() {
            QpType::Rc => 0,
            QpType::Uc => 1,
            QpType::Ud => return Err(Error::invalid("UD ids resolve with SIDR, not connect")),
        };
        let remote_gid = gid_of(dst.ip());
        let sgid_index = self.sgid_index_for(&remote_gid)?;
        let local_gid = self.ctx.inner.gids[usize::from(sgid_index)];
        let dmac = self.ctx.resolve_mac(&remote_gid)?;
        if qp.query()?.qp_state == QpState::Reset {
            let a = QpAttr {
                qp_state: QpState::Init,
                qp_access_flags: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
                ..QpAttr::default()
            };
            qp.modify(&a, QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS)?;
        }
        let src_port = src_port.unwrap_or_else(ephemeral_port);
        let src = SocketAddr::new(ip_of(&local_gid), src_port);
        let mut private_data = CmaHeader { src_port, src: src.ip(), dst: dst.ip() }.emit().to_vec();
        private_data.extend_from_slice(&param.private_data);
        let path_mtu = self.ctx.inner.active_mtu;
        // RDMA-CM's convention (the kernel's rdma_init_qp_attr sets the RTR
        // rq_psn to the id's own seq_num, the PSN its REQ or REP carries):
        // a CM message's starting PSN is what its sender expects to
        // receive; each side sends from the peer's. rxe's rping capture
        // shows it: the active side's first SEND has the REP's PSN.
        let rq_psn = random_u32() & 0x00ff_ffff;
        let flow_label = rocev2::cm::cma::roce_flow_label(src_port, dst.port());
        let params = ConnectParams {
            service_id: PortSpace::Tcp.service_id(dst.port()),
            local_gid,
            remote_gid,
            qpn: qp.qp_num(),
            starting_psn: rq_psn,
            transport,
            responder_resources: param.responder_resources,
            initiator_depth: param.initiator_depth,
            path_mtu: path_mtu as u8,
            retry_count: param.retry_count.min(7),
            rnr_retry_count: param.rnr_retry_count.min(7),
            local_ack_timeout: ROCE_LOCAL_ACK_TIMEOUT,
            hop_limit: 64,
            traffic_class: 0,
            flow_label,
            srq: false,
            private_data,
        };
        let now = self.ctx.inner.nic.now();
        let id = self
            .ctx
            .inner
            .nic
            .with_gsi(|g| {
                g.set_peer_mac(remote_gid, dmac);
                g.cm.connect(now, &params)
            })
            .ok_or_else(|| Error::new(ErrorKind::InvalidState, "the device's CM is not running"))?
            .map_err(cm_err)?;
        let p =
            Pending { remote_gid, sgid_index, rq_psn, path_mtu, flow_label, param_retry: param.retry_count.min(7), rd_atomic: param.initiator_depth };
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).insert(id, p);
        Ok(id)
    }

    /// The path and parameters of the connection `req` asks for, as we
    /// accept it with `param`.
    fn passive_path(&self, req: &ConnectRequest, param: &ConnParam) -> Result<Path> {
        let sgid_index = self
            .ctx
            .inner
            .gids
            .iter()
            .position(|g| *g == req.local_gid)
            .map(|i| i as u8)
            .ok_or_else(|| Error::invalid("request for a GID this device no longer has"))?;
        Ok(Path {
            dgid: req.remote_gid,
            sgid_index,
            flow_label: req.flow_label,
            mtu: Mtu::from_ibv(req.path_mtu).unwrap_or(Mtu::Mtu1024).min(self.ctx.inner.active_mtu),
            remote_qpn: req.remote_qpn,
            // Our REP's starting PSN is our RQ PSN; we send from the REQ's
            // (RDMA-CM's convention, see `connect_from`).
            rq_psn: req.rq_psn,
            sq_psn: req.starting_psn,
            // rdma_accept: our READ depth is bounded by what the peer accepts
            // and the peer's by what we accept.
            responder: param.responder_resources.min(req.initiator_depth.max(1)),
            initiator: param.initiator_depth.min(req.responder_resources),
            retry: req.retry_count,
            rnr_retry: param.rnr_retry_count,
            timeout: req.local_ack_timeout,
        })
    }

    /// The path of our connect answered by `rep`.
    fn active_path(&self, rep: &ConnectResponse) -> Result<Path> {
        let p = *self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&rep.id)
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no connect pending on id {:#x}", rep.id)))?;
        Ok(Path {
            dgid: p.remote_gid,
            sgid_index: p.sgid_index,
            flow_label: p.flow_label,
            mtu: p.path_mtu,
            remote_qpn: rep.remote_qpn,
            rq_psn: p.rq_psn,
            sq_psn: rep.starting_psn,
            responder: p.rd_atomic.min(rep.initiator_depth.max(1)),
            initiator: p.rd_atomic.min(rep.responder_resources),
            retry: p.param_retry,
            rnr_retry: rep.rnr_retry_count,
            timeout: ROCE_LOCAL_ACK_TIMEOUT,
        })
    }

    /// `rdma_accept`: move `qp` to RTS for the request's peer and answer
    /// with a REP. [`CmEvent::Established`] follows with the peer's RTU.
    pub fn accept(&self, req: &ConnectRequest, qp: &Qp, param: &ConnParam) -> Result<()> {
        let want = if req.qp_type == QpType::Uc { QpType::Uc } else { QpType::Rc };
        if qp.qp_type() != want {
            return Err(Error::invalid(format!("the request is for a {want:?} QP")));
        }
        let path = self.passive_path(req, param)?;
        for state in [QpState::Init, QpState::Rtr, QpState::Rts] {
            if state == QpState::Init && qp.query()?.qp_state != QpState::Reset {
                continue;
            }
            let (a, m) = path.attrs(state, qp.qp_type());
            qp.modify(&a, m)?;
        }
        self.send_rep(req, qp.qp_num(), &path, param)
    }

    /// `rdma_accept` for a QP the consumer moved itself (with
    /// [`CmChannel::qp_attr_for_request`]): only the REP, naming `qpn`.
    pub fn accept_qpn(&self, req: &ConnectRequest, qpn: u32, param: &ConnParam) -> Result<()> {
        let path = self.passive_path(req, param)?;
        self.send_rep(req, qpn, &path, param)
    }

    fn send_rep(&self, req: &ConnectRequest, qpn: u32, path: &Path, param: &ConnParam) -> Result<()> {
        let p = AcceptParams {
            qpn,
            starting_psn: path.rq_psn,
            responder_resources: path.responder,
            initiator_depth: path.initiator,
            target_ack_delay: 15,
            rnr_retry_count: param.rnr_retry_count.min(7),
            srq: false,
            private_data: param.private_data.clone(),
        };
        let now = self.ctx.inner.nic.now();
        self.with_cm(|cm| cm.accept(now, req.id, &p))
    }

    /// `rdma_init_qp_attr` on a request's id: the attributes (and mask) that
    /// move a QP of type `qp_type` to `state` (INIT, RTR or RTS) for the
    /// connection `req` asks for, accepted with `param`.
    pub fn qp_attr_for_request(&self, req: &ConnectRequest, param: &ConnParam, state: QpState, qp_type: QpType) -> Result<(QpAttr, QpAttrMask)> {
        Path::check_state(state)?;
        Ok(self.passive_path(req, param)?.attrs(state, qp_type))
    }

    /// `rdma_init_qp_attr` on an active id after [`CmEvent::ConnectResponse`]
    /// (then [`CmChannel::ready_to_use`] sends the RTU).
    pub fn qp_attr_for_response(&self, rep: &ConnectResponse, state: QpState, qp_type: QpType) -> Result<(QpAttr, QpAttrMask)> {
        Path::check_state(state)?;
        Ok(self.active_path(rep)?.attrs(state, qp_type))
    }

    /// Active side, after [`CmEvent::ConnectResponse`]: move `qp` to RTS
    /// and send the RTU (what librdmacm does before reporting ESTABLISHED).
    pub fn complete_connect(&self, rep: &ConnectResponse, qp: &Qp) -> Result<()> {
        let path = self.active_path(rep)?;
        for state in [QpState::Init, QpState::Rtr, QpState::Rts] {
            if state == QpState::Init && qp.query()?.qp_state != QpState::Reset {
                continue;
            }
            let (a, m) = path.attrs(state, qp.qp_type());
            qp.modify(&a, m)?;
        }
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&rep.id);
        let now = self.ctx.inner.nic.now();
        self.with_cm(|cm| cm.ready_to_use(now, rep.id, &[]))
    }

    /// Active side, after [`CmEvent::ConnectResponse`], when the consumer
    /// moved its QP itself (`rdma_establish` after `rdma_init_qp_attr`):
    /// only the RTU.
    pub fn ready_to_use(&self, rep: &ConnectResponse) -> Result<()> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&rep.id);
        let now = self.ctx.inner.nic.now();
        self.with_cm(|cm| cm.ready_to_use(now, rep.id, &[]))
    }

    /// `rdma_connect` on a `RDMA_PS_UDP` id: resolve `dst`'s UDP-space
    /// service to a UD QPN and Q_Key with a SIDR_REQ (IBTA 12.11) carrying
    /// RDMA-CM's IP header and `private_data`; the answer comes as
    /// [`CmEvent::UdResolved`], [`CmEvent::Rejected`] (the SIDR status) or
    /// [`CmEvent::Unreachable`].
    pub fn resolve_ud(&self, src_port: Option<u16>, dst: SocketAddr, private_data: &[u8]) -> Result<CmId> {
        if private_data.len() > MAX_UD_PRIVATE_DATA {
            return Err(Error::invalid(format!("private data of {} bytes (at most {MAX_UD_PRIVATE_DATA})", private_data.len())));
        }
        let remote_gid = gid_of(dst.ip());
        let sgid_index = self.sgid_index_for(&remote_gid)?;
        let local_gid = self.ctx.inner.gids[usize::from(sgid_index)];
        let dmac = self.ctx.resolve_mac(&remote_gid)?;
        let src_port = src_port.unwrap_or_else(ephemeral_port);
        let mut data = CmaHeader { src_port, src: ip_of(&local_gid), dst: dst.ip() }.emit().to_vec();
        data.extend_from_slice(private_data);
        let now = self.ctx.inner.nic.now();
        let service_id = PortSpace::Udp.service_id(dst.port());
        let id = self
            .ctx
            .inner
            .nic
            .with_gsi(|g| {
                g.set_peer_mac(remote_gid, dmac);
                g.cm.sidr_request(now, service_id, local_gid, remote_gid, &data)
            })
            .ok_or_else(|| Error::new(ErrorKind::InvalidState, "the device's CM is not running"))?
            .map_err(cm_err)?;
        let p = Pending {
            remote_gid,
            sgid_index,
            rq_psn: 0,
            path_mtu: self.ctx.inner.active_mtu,
            flow_label: rocev2::cm::cma::roce_flow_label(src_port, dst.port()),
            param_retry: 0,
            rd_atomic: 0,
        };
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).insert(id, p);
        Ok(id)
    }

    /// `rdma_accept` of a [`UdRequest`]: a SIDR_REP (status 0) naming our UD
    /// QP `qpn` and its `qkey` (RDMA-CM's is `rocev2::cm::cma::RDMA_UDP_QKEY`).
    pub fn accept_ud(&self, req: &UdRequest, qpn: u32, qkey: u32, private_data: &[u8]) -> Result<()> {
        let now = self.ctx.inner.nic.now();
        self.with_cm(|cm| cm.sidr_reply(now, req.id, rocev2::cm::msg::sidr_status::SUCCESS, qpn, qkey, private_data))
    }

    /// `rdma_reject` of a [`UdRequest`]: SIDR_REP status 2 "rejected".
    pub fn reject_ud(&self, id: CmId, private_data: &[u8]) -> Result<()> {
        let now = self.ctx.inner.nic.now();
        self.with_cm(|cm| cm.sidr_reply(now, id, rocev2::cm::msg::sidr_status::REJECTED, 0, 0, private_data))
    }

    /// `rdma_reject`: REJ "consumer defined" with `private_data`.
    pub fn reject(&self, id: CmId, private_data: &[u8]) -> Result<()> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        let now = self.ctx.inner.nic.now();
        self.with_cm(|cm| cm.reject(now, id, private_data))
    }

    /// Passive side: send the RTU-less establishment (traffic arrived
    /// first; `rdma_establish` / IBTA 12.9.5.3).
    pub fn establish(&self, id: CmId) -> Result<()> {
        self.with_cm(|cm| cm.establish(id))
    }

    /// `rdma_disconnect`: `qp` (if given) to ERR, flushing its WRs, and a
    /// DREQ — or the DREP, after the peer's [`CmEvent::Disconnected`].
    pub fn disconnect(&self, id: CmId, qp: Option<&Qp>) -> Result<()> {
        if let Some(qp) = qp {
            qp.modify(&QpAttr { qp_state: QpState::Err, ..QpAttr::default() }, QpAttrMask::STATE)?;
        }
        let now = self.ctx.inner.nic.now();
        self.with_cm(|cm| cm.disconnect(now, id, &[]))
    }

    /// `rdma_destroy_id`: what the protocol still owes is sent (see
    /// `rocev2::cm::Cm::destroy`); no further events for `id`.
    pub fn destroy_id(&self, id: CmId) -> Result<()> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        let now = self.ctx.inner.nic.now();
        self.with_cm(|cm| cm.destroy(now, id))
    }

    /// Wait (at most `max`) until every MAD the agent queued has been handed
    /// to the port, then a moment for the port to put it on the wire: a
    /// process about to exit owes its peers the DREQ, DREP or REJ it just
    /// queued (the agent lives in the process, not in a kernel that
    /// outlives it). True if everything went out.
    pub fn drain(&self, max: Duration) -> bool {
        let start = std::time::Instant::now();
        loop {
            let done = self.ctx.inner.nic.with_gsi(|g| {
                let s = g.stats();
                g.cm.stats().tx_mads <= s.tx_mads + s.tx_no_mac
            });
            if done != Some(false) {
                std::thread::sleep(Duration::from_millis(2));
                return true;
            }
            if start.elapsed() >= max {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The next event, waiting up to `timeout` (`None`: not at all).
    pub fn get_event(&self, timeout: Option<Duration>) -> Result<Option<CmEvent>> {
        loop {
            if let Some(ev) = self.ctx.inner.nic.poll_cm_event() {
                if let Some(ev) = self.translate(ev) {
                    return Ok(Some(ev));
                }
                continue;
            }
            let Some(t) = timeout else { return Ok(None) };
            let mut pfd = libc::pollfd { fd: self.fd(), events: libc::POLLIN, revents: 0 };
            let ms = i32::try_from(t.as_millis()).unwrap_or(i32::MAX);
            // SAFETY: one valid pollfd for the duration of the call.
            let n = unsafe { libc::poll(&mut pfd, 1, ms) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(Error::io("poll on the CM channel", e));
            }
            if n > 0 {
                let mut v = 0u64;
                // SAFETY: reads 8 bytes into `v` from our eventfd (clears it).
                unsafe { libc::read(pfd.fd, (&mut v as *mut u64).cast(), 8) };
            }
            if let Some(ev) = self.ctx.inner.nic.poll_cm_event() {
                if let Some(ev) = self.translate(ev) {
                    return Ok(Some(ev));
                }
            }
            if n == 0 {
                return Ok(None);
            }
        }
    }

    fn translate(&self, ev: rocev2::cm::CmEvent) -> Option<CmEvent> {
        use rocev2::cm::CmEvent as E;
        Some(match ev {
            E::ConnectRequest { id, service_id, remote_gid, local_gid, req } => {
                // Not an RDMA-CM request: refuse it as librdmacm's kernel does
                // (never leave it waiting for an answer nobody will give).
                let refuse = || {
                    let now = self.ctx.inner.nic.now();
                    let _ = self.with_cm(|cm| cm.reject(now, id, &[]));
                };
                // Every listener of this layer has an RDMA-CM service ID.
                let Some((space, port)) = PortSpace::from_service_id(service_id) else {
                    refuse();
                    return None;
                };
                let (src, dst, private_data) = if space.has_ip_header() {
                    match CmaHeader::parse(&req.private_data) {
                        Ok(h) => (
                            SocketAddr::new(h.src, h.src_port),
                            SocketAddr::new(h.dst, port),
                            req.private_data[rocev2::cm::cma::CMA_HDR_LEN..].to_vec(),
                        ),
                        Err(_) => {
                            refuse();
                            return None;
                        }
                    }
                } else {
                    (SocketAddr::new(ip_of(&remote_gid), 0), SocketAddr::new(ip_of(&local_gid), port), req.private_data.clone())
                };
                CmEvent::ConnectRequest(Box::new(ConnectRequest {
                    id,
                    src,
                    dst,
                    private_data,
                    remote_qpn: req.local_qpn,
                    responder_resources: req.responder_resources,
                    initiator_depth: req.initiator_depth,
                    qp_type: if req.transport_service_type == 1 { QpType::Uc } else { QpType::Rc },
                    remote_gid,
                    local_gid,
                    starting_psn: req.starting_psn,
                    path_mtu: req.path_mtu,
                    retry_count: req.retry_count,
                    local_ack_timeout: req.primary.local_ack_timeout,
                    flow_label: req.primary.flow_label,
                    rq_psn: random_u32() & 0x00ff_ffff,
                }))
            }
            E::ConnectReply { id, rep } => CmEvent::ConnectResponse(Box::new(ConnectResponse {
                id,
                private_data: rep.private_data.clone(),
                remote_qpn: rep.local_qpn,
                responder_resources: rep.responder_resources,
                initiator_depth: rep.initiator_depth,
                starting_psn: rep.starting_psn,
                rnr_retry_count: rep.rnr_retry_count,
            })),
            E::Established { id } => CmEvent::Established { id },
            E::Rejected { id, reason, private_data } => {
                self.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
                CmEvent::Rejected { id, reason, private_data }
            }
            E::TimedOut { id, waited } => {
                self.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
                match waited {
                    Waited::Rep | Waited::Rtu | Waited::SidrRep => CmEvent::Unreachable { id },
                }
            }
            E::Disconnected { id } => CmEvent::Disconnected { id },
            E::TimewaitExit { id } => CmEvent::TimewaitExit { id },
            E::SidrRequest { id, service_id, req, .. } => {
                let refuse = |status| {
                    let now = self.ctx.inner.nic.now();
                    let _ = self.with_cm(|cm| cm.sidr_reply(now, id, status, 0, 0, &[]));
                };
                let Some((_, port)) = PortSpace::from_service_id(service_id).filter(|(s, _)| s.has_ip_header()) else {
                    refuse(rocev2::cm::msg::sidr_status::SID_NOT_SUPPORTED);
                    return None;
                };
                match CmaHeader::parse(&req.private_data) {
                    Ok(h) => CmEvent::UdRequest(Box::new(UdRequest {
                        id,
                        src: SocketAddr::new(h.src, h.src_port),
                        dst: SocketAddr::new(h.dst, port),
                        private_data: req.private_data[rocev2::cm::cma::CMA_HDR_LEN..].to_vec(),
                    })),
                    Err(_) => {
                        // Not RDMA-CM's: the kernel's CMA rejects it.
                        refuse(rocev2::cm::msg::sidr_status::REJECTED);
                        return None;
                    }
                }
            }
            E::SidrReply { id, rep } => {
                let p = self.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&id)?;
                if rep.status != rocev2::cm::msg::sidr_status::SUCCESS {
                    return Some(CmEvent::Rejected { id, reason: u16::from(rep.status), private_data: rep.private_data.clone() });
                }
                CmEvent::UdResolved(Box::new(UdResolved {
                    id,
                    qpn: rep.qpn,
                    qkey: rep.qkey,
                    private_data: rep.private_data.clone(),
                    ah: AhAttr {
                        dgid: p.remote_gid,
                        sgid_index: p.sgid_index,
                        port_num: 1,
                        flow_label: p.flow_label,
                        hop_limit: 64,
                        ..AhAttr::default()
                    },
                }))
            }
        })
    }
}
