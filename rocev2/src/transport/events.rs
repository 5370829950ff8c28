//! What the engine reports besides completions: errors of its calls,
//! asynchronous events (`enum ibv_event_type`) and device-wide counters of
//! frames dropped before they reach a QP.

use std::collections::HashMap;

use crate::transport::attr::{QpAttrMask, QpState};
use crate::transport::ids::SrqId;
use crate::wire::WireError;

/// Why an engine call failed. Nothing changed when one is returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// No QP with this number.
    #[error("no QP {0:#x}")]
    NoSuchQp(u32),
    /// No SRQ with this id.
    #[error("no SRQ {}", (.0).0)]
    NoSuchSrq(SrqId),
    /// QP or SRQ limit reached.
    #[error("resource limit reached")]
    TooMany,
    /// The QP's state does not allow the call (e.g. post_send before RTS).
    #[error("not allowed in state {0:?}")]
    WrongState(QpState),
    /// `ibv_modify_qp`: a transition the state machine does not have.
    #[error("no transition {from:?} -> {to:?}")]
    BadTransition {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// `ibv_modify_qp`: a required attribute is missing from the mask.
    #[error("required attributes missing: {0:?}")]
    MissingAttr(QpAttrMask),
    /// `ibv_modify_qp`: an attribute not allowed for this transition / QP type.
    #[error("attributes not allowed here: {0:?}")]
    ExtraAttr(QpAttrMask),
    /// An attribute value is out of range (named).
    #[error("bad value: {0}")]
    BadValue(&'static str),
    /// The send or receive queue is full.
    #[error("queue full")]
    QueueFull,
    /// A WR is not valid for this QP (type, SGE count, ...).
    #[error("bad work request: {0}")]
    BadWr(&'static str),
    /// The SRQ is still used by QPs.
    #[error("still in use")]
    Busy,
    /// A multicast limit was reached (named, as `ibv_query_device` reports it).
    #[error("multicast limit reached: {0}")]
    McastLimit(&'static str),
}

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
    /// Multicast frames (DestQP 0xFFFFFF) accepted for delivery to a
    /// group's attached QPs (each QP then checks and counts its copy).
    pub mcast_frames: u64,
    /// Dropped: a multicast frame (DestQP 0xFFFFFF) whose destination IP
    /// names no group a QP of this device is attached to (rxe
    /// `rxe_rcv_mcast_pkt`: no mcg → drop).
    pub rx_mcast_no_member: u64,
    /// RDMA WRITE continuations (RC WRITE MIDDLE and LAST) placed with
    /// their ICRC checked in the same pass (`responder/placed.rs`), then
    /// accepted; a bad one is counted in `rx_bad_frame` as any bad ICRC.
    pub rx_icrc_at_placement: u64,
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
            mcast_frames,
            rx_mcast_no_member,
            rx_icrc_at_placement,
            tx_frames,
        } = other;
        self.rx_frames += rx_frames;
        self.rx_unknown_qpn += rx_unknown_qpn;
        self.rx_wrong_service += rx_wrong_service;
        self.rx_bad_pkey += rx_bad_pkey;
        self.rx_wrong_peer += rx_wrong_peer;
        self.rx_wrong_state += rx_wrong_state;
        self.rx_cnps += rx_cnps;
        self.mcast_frames += mcast_frames;
        self.rx_mcast_no_member += rx_mcast_no_member;
        self.rx_icrc_at_placement += rx_icrc_at_placement;
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
            ("mcast_frames", self.mcast_frames),
            ("rx_mcast_no_member", self.rx_mcast_no_member),
            ("rx_icrc_at_placement", self.rx_icrc_at_placement),
            ("tx_frames", self.tx_frames),
        ];
        fixed
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .chain(WireErrorKind::ALL.into_iter().map(|k| (format!("rx_drop_{}", k.name()), self.rx_bad_frame.get(&k).copied().unwrap_or(0))))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_errors_say_what_is_wrong() {
        assert_eq!(EngineError::NoSuchQp(0x11).to_string(), "no QP 0x11");
        assert_eq!(EngineError::NoSuchSrq(SrqId(7)).to_string(), "no SRQ 7");
        assert_eq!(EngineError::BadTransition { from: QpState::Reset, to: QpState::Rts }.to_string(), "no transition Reset -> Rts");
        assert_eq!(EngineError::BadWr("too many SGEs").to_string(), "bad work request: too many SGEs");
        let e: &dyn std::error::Error = &EngineError::Busy;
        assert!(e.source().is_none());
    }
}
