//! Helpers to join transport engines with RC (and UC) queue pairs inside a
//! simulated network: addresses, paths and the RESET → INIT → RTR → RTS sequence an
//! application (or `ibv_rc_pingpong`) performs with `ibv_modify_qp`.

use crate::psn::Psn;
use crate::sim::network::Endpoint;
use crate::time::Instant;
use crate::transport::attr::{AddressVector, Mtu, QpAttr, QpAttrMask, QpState};
use crate::transport::engine::{Engine, EngineError};
use crate::transport::memory::Access;
use crate::wire::MacAddr;

impl Endpoint for Engine {
    fn handle_frame(&mut self, now: Instant, frame: &[u8]) {
        Engine::handle_frame(self, now, frame)
    }
    fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        Engine::poll_transmit(self, now, buf)
    }
    fn handle_timeout(&mut self, now: Instant) {
        Engine::handle_timeout(self, now)
    }
    fn next_timeout(&self) -> Option<Instant> {
        Engine::next_timeout(self)
    }
}

/// A simulated host's addresses: its MAC and its GID (an IPv4-mapped GID
/// selects IPv4 framing, any other IPv6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HostAddr {
    /// MAC address.
    pub mac: MacAddr,
    /// GID (IP address).
    pub gid: [u8; 16],
}

impl HostAddr {
    /// Host `n` on 10.0.0.0/24: MAC `02:00:00:00:00:n`, IP `10.0.0.n`.
    pub fn ipv4(n: u8) -> HostAddr {
        HostAddr { mac: [2, 0, 0, 0, 0, n], gid: AddressVector::ipv4_gid([10, 0, 0, n]) }
    }

    /// Host `n` on fd00::/64: MAC `02:00:00:00:00:n`, IP `fd00::n`.
    pub fn ipv6(n: u8) -> HostAddr {
        let mut gid = [0u8; 16];
        gid[0] = 0xfd;
        gid[15] = n;
        HostAddr { mac: [2, 0, 0, 0, 0, n], gid }
    }

    /// The path from this host to `to` (no VLAN, traffic class 0, TTL 64,
    /// Linux's UDP source port).
    pub fn path_to(&self, to: &HostAddr) -> AddressVector {
        AddressVector {
            dmac: to.mac,
            smac: self.mac,
            vlan: None,
            sgid: self.gid,
            dgid: to.gid,
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
            udp_sport: None,
        }
    }
}

/// Connection parameters of one side of an RC QP pair (the `ibv_modify_qp`
/// attributes of the INIT, RTR and RTS transitions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RcParams {
    /// Path MTU (both sides must agree).
    pub mtu: Mtu,
    /// PSN of this side's first request (`sq_psn`); the peer's `rq_psn`.
    pub sq_psn: Psn,
    /// Remote access this side grants.
    pub access: Access,
    /// Local ACK timeout exponent (4.096 µs × 2^timeout).
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7 = forever).
    pub rnr_retry: u8,
    /// RNR NAK timer code this side advertises as a responder.
    pub min_rnr_timer: u8,
    /// Outstanding READ/atomic requests as requester.
    pub max_rd_atomic: u8,
    /// Outstanding READ/atomic requests accepted as responder.
    pub max_dest_rd_atomic: u8,
}

impl Default for RcParams {
    fn default() -> Self {
        RcParams {
            mtu: Mtu::Mtu1024,
            sq_psn: Psn::new(0),
            access: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
        }
    }
}

/// Move QP `qpn` of `engine` from RESET to INIT: port 1, P_Key index 0 and
/// `p.access` as the remote access it grants (RC and UC alike). Receives may
/// be posted from here on.
pub fn init_qp(engine: &mut Engine, qpn: u32, p: &RcParams) -> Result<(), EngineError> {
    let init = QpAttr { qp_state: QpState::Init, pkey_index: 0, port_num: 1, qp_access_flags: p.access, ..QpAttr::default() };
    engine.modify_qp(qpn, &init, QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS)
}

/// Move QP `qpn` of `engine` from RESET to RTS, connected to `remote_qpn` at
/// `remote` (whose first request PSN is `remote_sq_psn`).
pub fn bring_up_rc(
    engine: &mut Engine,
    qpn: u32,
    local: &HostAddr,
    remote: &HostAddr,
    remote_qpn: u32,
    remote_sq_psn: Psn,
    p: &RcParams,
) -> Result<(), EngineError> {
    init_qp(engine, qpn, p)?;
    bring_up_rc_from_init(engine, qpn, local, remote, remote_qpn, remote_sq_psn, p)
}

/// Move UC QP `qpn` of `engine` from RESET to RTS, connected to
/// `remote_qpn` at `remote` (whose first PSN is `remote_sq_psn`). Of `p`
/// only `access`, `mtu` and `sq_psn` apply: the RTR and RTS attributes a UC
/// QP requires are the path, MTU, destination QPN and the two PSNs, and
/// timeouts, retries or read/atomic limits in the mask are refused (the
/// kernel's `qp_state_table` / `ib_modify_qp_is_ok`, as the engine checks).
pub fn bring_up_uc(
    engine: &mut Engine,
    qpn: u32,
    local: &HostAddr,
    remote: &HostAddr,
    remote_qpn: u32,
    remote_sq_psn: Psn,
    p: &RcParams,
) -> Result<(), EngineError> {
    init_qp(engine, qpn, p)?;
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: Some(local.path_to(remote)),
        path_mtu: p.mtu,
        dest_qp_num: remote_qpn,
        rq_psn: remote_sq_psn,
        ..QpAttr::default()
    };
    engine.modify_qp(qpn, &rtr, QpAttrMask::STATE | QpAttrMask::AV | QpAttrMask::PATH_MTU | QpAttrMask::DEST_QPN | QpAttrMask::RQ_PSN)?;
    let rts = QpAttr { qp_state: QpState::Rts, sq_psn: p.sq_psn, ..QpAttr::default() };
    engine.modify_qp(qpn, &rts, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
}

/// Move QP `qpn` (in INIT, receives possibly posted) through RTR to RTS.
pub fn bring_up_rc_from_init(
    engine: &mut Engine,
    qpn: u32,
    local: &HostAddr,
    remote: &HostAddr,
    remote_qpn: u32,
    remote_sq_psn: Psn,
    p: &RcParams,
) -> Result<(), EngineError> {
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: Some(local.path_to(remote)),
        path_mtu: p.mtu,
        dest_qp_num: remote_qpn,
        rq_psn: remote_sq_psn,
        max_dest_rd_atomic: p.max_dest_rd_atomic,
        min_rnr_timer: p.min_rnr_timer,
        ..QpAttr::default()
    };
    engine.modify_qp(
        qpn,
        &rtr,
        QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER,
    )?;
    let rts = QpAttr {
        qp_state: QpState::Rts,
        timeout: p.timeout,
        retry_cnt: p.retry_cnt,
        rnr_retry: p.rnr_retry,
        sq_psn: p.sq_psn,
        max_rd_atomic: p.max_rd_atomic,
        ..QpAttr::default()
    };
    engine.modify_qp(
        qpn,
        &rts,
        QpAttrMask::STATE | QpAttrMask::TIMEOUT | QpAttrMask::RETRY_CNT | QpAttrMask::RNR_RETRY | QpAttrMask::SQ_PSN | QpAttrMask::MAX_QP_RD_ATOMIC,
    )
}

/// Connect QP `qpn_a` of `a` (at `addr_a`) with QP `qpn_b` of `b` (at
/// `addr_b`): both from RESET to RTS.
#[allow(clippy::too_many_arguments)]
pub fn connect_rc(
    a: &mut Engine,
    qpn_a: u32,
    addr_a: &HostAddr,
    pa: &RcParams,
    b: &mut Engine,
    qpn_b: u32,
    addr_b: &HostAddr,
    pb: &RcParams,
) -> Result<(), EngineError> {
    bring_up_rc(a, qpn_a, addr_a, addr_b, qpn_b, pb.sq_psn, pa)?;
    bring_up_rc(b, qpn_b, addr_b, addr_a, qpn_a, pa.sq_psn, pb)
}
