//! Plain `Repr` structs for every header urnic parses and emits.
//!
//! Field names follow the IBTA spec (Vol 1 ch. 9, RoCEv2 annex A17). These are
//! the high-level, owned forms; the checked byte views live next to them.

use crate::psn::Psn;
use crate::wire::opcode::Opcode;

/// A 48-bit Ethernet MAC address.
pub type MacAddr = [u8; 6];

/// An 802.1Q tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct VlanTag {
    /// Priority code point (3 bits).
    pub pcp: u8,
    /// Drop eligible indicator.
    pub dei: bool,
    /// VLAN identifier (12 bits).
    pub vid: u16,
}

/// Ethernet II header, optionally with one 802.1Q tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EthernetRepr {
    /// Destination MAC.
    pub dst: MacAddr,
    /// Source MAC.
    pub src: MacAddr,
    /// 802.1Q tag, if any (TPID 0x8100).
    pub vlan: Option<VlanTag>,
    /// EtherType of the payload (0x0800 IPv4, 0x86dd IPv6).
    pub ethertype: u16,
}

/// IPv4 header fields a RoCEv2 frame needs (no options: IHL 5 is emitted;
/// a received header with options is accepted and the options skipped).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ipv4Repr {
    /// Source address.
    pub src: [u8; 4],
    /// Destination address.
    pub dst: [u8; 4],
    /// DSCP (6 bits).
    pub dscp: u8,
    /// ECN (2 bits): 0 not-ECT, 1 ECT(1), 2 ECT(0), 3 CE.
    pub ecn: u8,
    /// Identification.
    pub ident: u16,
    /// Don't-fragment flag (RoCEv2 sets it).
    pub dont_frag: bool,
    /// Time to live.
    pub ttl: u8,
    /// IP protocol (17 for UDP).
    pub protocol: u8,
    /// Length of everything after the IPv4 header.
    pub payload_len: u16,
}

/// IPv6 header fields (no extension headers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ipv6Repr {
    /// Source address.
    pub src: [u8; 16],
    /// Destination address.
    pub dst: [u8; 16],
    /// Traffic class (DSCP << 2 | ECN).
    pub traffic_class: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Next header (17 for UDP).
    pub next_header: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Payload length.
    pub payload_len: u16,
}

/// IPv4 or IPv6.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IpRepr {
    /// IPv4.
    V4(Ipv4Repr),
    /// IPv6.
    V6(Ipv6Repr),
}

/// UDP header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UdpRepr {
    /// Source port (flow entropy for RoCEv2).
    pub src_port: u16,
    /// Destination port (4791 for RoCEv2).
    pub dst_port: u16,
    /// Length of UDP header + payload.
    pub length: u16,
    /// Checksum as on the wire (RoCEv2 over IPv4 sends 0).
    pub checksum: u16,
}

/// Base Transport Header (IBTA 9.2, 12 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BthRepr {
    /// Operation code.
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    /// Migration request (ConnectX-3 Pro sets it; receivers ignore it).
    pub mig_req: bool,
    /// Pad count (0..=3): bytes added to make the payload a multiple of 4.
    pub pad_count: u8,
    /// Transport header version (0).
    pub tver: u8,
    /// Partition key (0xffff default).
    pub pkey: u16,
    /// Forward ECN (not used by RoCEv2; carried for re-emission).
    pub fecn: bool,
    /// Backward ECN (set in CNPs).
    pub becn: bool,
    /// The 6 reserved bits of byte 8 (kept so captured frames re-emit identically).
    pub resv6: u8,
    /// Destination QP number (24 bits).
    pub dest_qp: u32,
    /// Acknowledge request.
    pub ack_req: bool,
    /// The 7 reserved bits of byte 8 (kept for re-emission).
    pub resv7: u8,
    /// Packet sequence number.
    pub psn: Psn,
}

/// RDMA Extended Transport Header (16 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct RethRepr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Length of the whole RDMA operation in bytes.
    pub dma_len: u32,
}

/// Atomic Extended Transport Header (28 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct AtomicEthRepr {
    /// Remote virtual address (8-byte aligned).
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap value (CMP_SWAP) or add value (FETCH_ADD).
    pub swap_add: u64,
    /// Compare value (CMP_SWAP).
    pub compare: u64,
}

/// What an AETH syndrome says (IBTA 9.7.5.1, table 42).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AckSyndrome {
    /// Positive ACK with an end-to-end credit count (31 = "invalid"/none).
    Ack {
        /// Credit count code (5 bits).
        credits: u8,
    },
    /// Receiver not ready, with its timer code (5 bits, see `rnr_timer`).
    RnrNak {
        /// RNR timer code.
        timer: u8,
    },
    /// NAK of the given kind.
    Nak(NakCode),
    /// A reserved syndrome, kept whole: bits 6:5 = 10, or bit 7 (reserved,
    /// 0 in IBTA 9.3.5) set.
    Reserved(u8),
}

/// NAK codes (AETH syndrome 0b011_xxxxx).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// 0: PSN sequence error.
    PsnSequenceError,
    /// 1: invalid request.
    InvalidRequest,
    /// 2: remote access error.
    RemoteAccessError,
    /// 3: remote operational error.
    RemoteOperationalError,
    /// 4: invalid RD request.
    InvalidRdRequest,
    /// Any other (reserved) value.
    Reserved(u8),
}

/// ACK Extended Transport Header (4 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AethRepr {
    /// The decoded syndrome.
    pub syndrome: AckSyndrome,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

/// Datagram Extended Transport Header (8 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct DethRepr {
    /// Queue key.
    pub qkey: u32,
    /// Reserved byte (kept for re-emission).
    pub resv8: u8,
    /// Source QP number (24 bits).
    pub src_qp: u32,
}

/// All transport headers of one packet: the BTH and its extension headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TransportRepr {
    /// Base transport header.
    pub bth: BthRepr,
    /// DETH (UD).
    pub deth: Option<DethRepr>,
    /// RETH (WRITE first/only, READ request).
    pub reth: Option<RethRepr>,
    /// AtomicETH (CMP_SWAP, FETCH_ADD).
    pub atomic_eth: Option<AtomicEthRepr>,
    /// AETH (ACKs and READ responses).
    pub aeth: Option<AethRepr>,
    /// AtomicAckETH: the original remote value.
    pub atomic_ack: Option<u64>,
    /// ImmDt: immediate data, as on the wire (big-endian value).
    pub immediate: Option<u32>,
    /// IETH: R_Key to invalidate.
    pub invalidate_rkey: Option<u32>,
}

impl BthRepr {
    /// A BTH for `opcode` to `dest_qp` at `psn` with everything else at its
    /// usual value: the default P_Key 0xffff, transport version 0, no pad,
    /// no flags (solicited, MigReq, FECN, BECN, AckReq), reserved bits zero.
    /// Set the rest with struct update syntax.
    pub const fn new(opcode: Opcode, dest_qp: u32, psn: Psn) -> BthRepr {
        BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            resv6: 0,
            dest_qp,
            ack_req: false,
            resv7: 0,
            psn,
        }
    }
}

impl TransportRepr {
    /// A BTH with no extension headers (SEND/WRITE MIDDLE, CNP, and the
    /// start that parsing fills in).
    pub const fn bth_only(bth: BthRepr) -> TransportRepr {
        TransportRepr { bth, deth: None, reth: None, atomic_eth: None, aeth: None, atomic_ack: None, immediate: None, invalidate_rkey: None }
    }
}

/// A whole RoCEv2 frame's headers: Ethernet, IP, UDP and transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FrameRepr {
    /// Ethernet header.
    pub eth: EthernetRepr,
    /// IP header.
    pub ip: IpRepr,
    /// UDP header.
    pub udp: UdpRepr,
    /// BTH and extension headers.
    pub transport: TransportRepr,
}
