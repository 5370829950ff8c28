//! QP types, states and attributes, as in `ibv_create_qp` / `ibv_modify_qp`.

use bitflags::bitflags;

use crate::psn::Psn;
pub use crate::transport::ids::SrqId;
use crate::transport::ids::{Access, CqId, PdId};
use crate::wire::{MacAddr, VlanTag};

/// Transport service of a QP (`enum ibv_qp_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connected.
    Rc,
    /// Unreliable connected.
    Uc,
    /// Unreliable datagram.
    Ud,
}

/// QP state (`enum ibv_qp_state`, IBTA 10.3.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Reset.
    Reset,
    /// Initialized: receives may be posted.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drain.
    Sqd,
    /// Send queue error (UC/UD).
    Sqe,
    /// Error: every WR is flushed.
    Err,
}

/// Path MTU (`enum ibv_mtu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl Mtu {
    /// Payload bytes per packet.
    pub const fn bytes(self) -> u32 {
        128 << (self as u32)
    }

    /// The MTU of `bytes` payload bytes (256, 512, 1024, 2048 or 4096).
    pub const fn from_bytes(bytes: u32) -> Option<Mtu> {
        Some(match bytes {
            256 => Mtu::Mtu256,
            512 => Mtu::Mtu512,
            1024 => Mtu::Mtu1024,
            2048 => Mtu::Mtu2048,
            4096 => Mtu::Mtu4096,
            _ => return None,
        })
    }

    /// The `ibv_mtu` enum value (1..=5) as an `Mtu`.
    pub const fn from_ibv(v: u8) -> Option<Mtu> {
        Some(match v {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            4 => Mtu::Mtu2048,
            5 => Mtu::Mtu4096,
            _ => return None,
        })
    }

    /// The largest IB MTU whose RoCEv2 frame fits an Ethernet/IP MTU of
    /// `netdev_mtu` bytes (as rxe does: 1500 → 1024, 9000 → 4096).
    pub const fn for_netdev_mtu(netdev_mtu: u32) -> Option<Mtu> {
        // IPv4 20 + UDP 8 + BTH 12 + the largest ext headers 28 + ICRC 4 = 72 bytes of overhead.
        let room = netdev_mtu.saturating_sub(72);
        if room >= 4096 {
            Some(Mtu::Mtu4096)
        } else if room >= 2048 {
            Some(Mtu::Mtu2048)
        } else if room >= 1024 {
            Some(Mtu::Mtu1024)
        } else if room >= 512 {
            Some(Mtu::Mtu512)
        } else if room >= 256 {
            Some(Mtu::Mtu256)
        } else {
            None
        }
    }
}

/// A resolved path to a peer: everything needed to build the Ethernet, IP and
/// UDP headers of frames to it (the `ibv_ah_attr` after GID and neighbour
/// resolution). GIDs are IPv6 addresses; an IPv4-mapped GID (`::ffff:a.b.c.d`)
/// selects IPv4 framing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AddressVector {
    /// Peer MAC.
    pub dmac: MacAddr,
    /// Our MAC.
    pub smac: MacAddr,
    /// 802.1Q tag, if the port is on a VLAN.
    pub vlan: Option<VlanTag>,
    /// Our GID (source IP).
    pub sgid: [u8; 16],
    /// Peer GID (destination IP).
    pub dgid: [u8; 16],
    /// Traffic class: DSCP << 2 | ECN (the engine sets ECN to ECT(0) on data when
    /// congestion control is on).
    pub traffic_class: u8,
    /// IPv4 TTL / IPv6 hop limit.
    pub hop_limit: u8,
    /// IPv6 flow label (20 bits); for IPv4 unused.
    pub flow_label: u32,
    /// UDP source port; `None` = computed from the QPNs as Linux does.
    pub udp_sport: Option<u16>,
}

impl AddressVector {
    /// Whether `gid` is an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`).
    pub fn is_ipv4_mapped(gid: &[u8; 16]) -> bool {
        gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff
    }

    /// The IPv4-mapped GID for an IPv4 address.
    pub fn ipv4_gid(ip: [u8; 4]) -> [u8; 16] {
        crate::wire::ipv4_mapped(ip)
    }
}

bitflags! {
    /// `enum ibv_qp_attr_mask`: which fields of [`QpAttr`] a modify applies.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct QpAttrMask: u32 {
        /// `IBV_QP_STATE`.
        const STATE = 1 << 0;
        /// `IBV_QP_CUR_STATE`.
        const CUR_STATE = 1 << 1;
        /// `IBV_QP_EN_SQD_ASYNC_NOTIFY`.
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// `IBV_QP_ACCESS_FLAGS`.
        const ACCESS_FLAGS = 1 << 3;
        /// `IBV_QP_PKEY_INDEX`.
        const PKEY_INDEX = 1 << 4;
        /// `IBV_QP_PORT`.
        const PORT = 1 << 5;
        /// `IBV_QP_QKEY`.
        const QKEY = 1 << 6;
        /// `IBV_QP_AV`.
        const AV = 1 << 7;
        /// `IBV_QP_PATH_MTU`.
        const PATH_MTU = 1 << 8;
        /// `IBV_QP_TIMEOUT`.
        const TIMEOUT = 1 << 9;
        /// `IBV_QP_RETRY_CNT`.
        const RETRY_CNT = 1 << 10;
        /// `IBV_QP_RNR_RETRY`.
        const RNR_RETRY = 1 << 11;
        /// `IBV_QP_RQ_PSN`.
        const RQ_PSN = 1 << 12;
        /// `IBV_QP_MAX_QP_RD_ATOMIC`.
        const MAX_QP_RD_ATOMIC = 1 << 13;
        /// `IBV_QP_ALT_PATH`.
        const ALT_PATH = 1 << 14;
        /// `IBV_QP_MIN_RNR_TIMER`.
        const MIN_RNR_TIMER = 1 << 15;
        /// `IBV_QP_SQ_PSN`.
        const SQ_PSN = 1 << 16;
        /// `IBV_QP_MAX_DEST_RD_ATOMIC`.
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        /// `IBV_QP_PATH_MIG_STATE`.
        const PATH_MIG_STATE = 1 << 18;
        /// `IBV_QP_CAP`.
        const CAP = 1 << 19;
        /// `IBV_QP_DEST_QPN`.
        const DEST_QPN = 1 << 20;
    }
}

/// QP attributes (`struct ibv_qp_attr`), the fields urnic uses.
///
/// Generic over the path type: the engine takes resolved [`AddressVector`]s;
/// the verbs layer's `QpAttr` carries a GID-based `AhAttr` and resolves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QpAttr<A = AddressVector> {
    /// Target state.
    pub qp_state: QpState,
    /// Current state (checked when `CUR_STATE` is in the mask).
    pub cur_qp_state: QpState,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Expected PSN of the first incoming request.
    pub rq_psn: Psn,
    /// PSN of the first outgoing request.
    pub sq_psn: Psn,
    /// Remote QPN (connected QPs).
    pub dest_qp_num: u32,
    /// Remote access the QP allows (REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC).
    pub qp_access_flags: Access,
    /// P_Key index (urnic has one P_Key, 0xffff, at index 0).
    pub pkey_index: u16,
    /// Port number (1).
    pub port_num: u8,
    /// Outstanding RDMA READ/ATOMIC requests this QP may have as requester.
    pub max_rd_atomic: u8,
    /// Outstanding RDMA READ/ATOMIC requests this QP accepts as responder.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code this responder advertises (0..=31).
    pub min_rnr_timer: u8,
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout, 0 = infinite.
    pub timeout: u8,
    /// Transport retries (0..=7).
    pub retry_cnt: u8,
    /// RNR retries (0..=7, 7 = infinite).
    pub rnr_retry: u8,
    /// Path to the peer (connected QPs).
    pub ah_attr: Option<A>,
    /// Capabilities (read back by query).
    pub cap: QpCaps,
    /// Whether the SQ is draining (query, SQD).
    pub sq_draining: bool,
}

impl<A> Default for QpAttr<A> {
    fn default() -> Self {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: Mtu::Mtu1024,
            qkey: 0,
            rq_psn: Psn::new(0),
            sq_psn: Psn::new(0),
            dest_qp_num: 0,
            qp_access_flags: Access::empty(),
            pkey_index: 0,
            port_num: 1,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 0,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            ah_attr: None,
            cap: QpCaps::default(),
            sq_draining: false,
        }
    }
}

impl<A> QpAttr<A> {
    /// The same attributes with the path mapped through `f`.
    pub fn map_path<B, E>(self, f: impl FnOnce(A) -> Result<B, E>) -> Result<QpAttr<B>, E> {
        let ah_attr = match self.ah_attr {
            Some(a) => Some(f(a)?),
            None => None,
        };
        Ok(QpAttr {
            qp_state: self.qp_state,
            cur_qp_state: self.cur_qp_state,
            path_mtu: self.path_mtu,
            qkey: self.qkey,
            rq_psn: self.rq_psn,
            sq_psn: self.sq_psn,
            dest_qp_num: self.dest_qp_num,
            qp_access_flags: self.qp_access_flags,
            pkey_index: self.pkey_index,
            port_num: self.port_num,
            max_rd_atomic: self.max_rd_atomic,
            max_dest_rd_atomic: self.max_dest_rd_atomic,
            min_rnr_timer: self.min_rnr_timer,
            timeout: self.timeout,
            retry_cnt: self.retry_cnt,
            rnr_retry: self.rnr_retry,
            ah_attr,
            cap: self.cap,
            sq_draining: self.sq_draining,
        })
    }
}

/// Queue sizes (`struct ibv_qp_cap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Bytes of inline data per send WR.
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps { max_send_wr: 256, max_recv_wr: 256, max_send_sge: 16, max_recv_sge: 16, max_inline_data: 400 }
    }
}

/// Arguments of QP creation (`struct ibv_qp_init_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QpInitAttr {
    /// Service type.
    pub qp_type: QpType,
    /// Protection domain.
    pub pd: PdId,
    /// CQ for send completions.
    pub send_cq: CqId,
    /// CQ for receive completions.
    pub recv_cq: CqId,
    /// Shared receive queue, if any.
    pub srq: Option<SrqId>,
    /// Queue sizes.
    pub cap: QpCaps,
    /// Every send WR generates a completion (else only `SIGNALED` ones).
    pub sq_sig_all: bool,
}
