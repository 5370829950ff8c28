//! The CM messages (IBTA Vol 1 12.6, 12.11), each as a plain `Repr` with
//! parse and emit over the 232 bytes of message data that follow the MAD
//! header. Offsets are the spec's byte offsets within that data.
//!
//! Reserved fields are written as zero and ignored on receipt (IBTA 13.4.1:
//! receivers ignore reserved fields). Private data is parsed as the whole
//! area the message has (the spec gives no length: trailing zeros are the
//! sender's padding), and emitted zero-padded to it.

use super::error::MadError;
use super::mad::{be16, be24, be32, be64, put16, put24, put32, put64, MadHeader, CM_DATA_LEN, MAD_HEADER_LEN, MAD_LEN};

/// `AttributeID`s of the CM messages (IBTA Table 100).
pub mod attr {
    /// ConnectRequest.
    pub const REQ: u16 = 0x0010;
    /// MessageReceiptAcknowledgement.
    pub const MRA: u16 = 0x0011;
    /// ConnectReject.
    pub const REJ: u16 = 0x0012;
    /// ConnectReply.
    pub const REP: u16 = 0x0013;
    /// ReadyToUse.
    pub const RTU: u16 = 0x0014;
    /// DisconnectRequest.
    pub const DREQ: u16 = 0x0015;
    /// DisconnectReply.
    pub const DREP: u16 = 0x0016;
    /// ServiceIDResolutionRequest.
    pub const SIDR_REQ: u16 = 0x0017;
    /// ServiceIDResolutionResponse.
    pub const SIDR_REP: u16 = 0x0018;
}

/// Private data each message carries (IBTA 12.6.5 ff.).
pub mod private_len {
    /// REQ.
    pub const REQ: usize = 92;
    /// MRA.
    pub const MRA: usize = 222;
    /// REJ.
    pub const REJ: usize = 148;
    /// REP.
    pub const REP: usize = 196;
    /// RTU.
    pub const RTU: usize = 224;
    /// DREQ.
    pub const DREQ: usize = 220;
    /// DREP.
    pub const DREP: usize = 224;
    /// SIDR_REQ.
    pub const SIDR_REQ: usize = 216;
    /// SIDR_REP.
    pub const SIDR_REP: usize = 136;
}

/// One path of a REQ (primary or alternate; IBTA 12.6.5 bytes 52..96 and 96..140).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ReqPath {
    /// Local port LID (0xFFFF, the permissive LID, on RoCE as rxe sends it).
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID (on RoCEv2: the source IP as a GID).
    pub local_gid: [u8; 16],
    /// Remote port GID.
    pub remote_gid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local.
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits: 4.096 µs × 2^n).
    pub local_ack_timeout: u8,
}

impl ReqPath {
    fn parse(d: &[u8]) -> ReqPath {
        let mut local_gid = [0u8; 16];
        let mut remote_gid = [0u8; 16];
        local_gid.copy_from_slice(&d[4..20]);
        remote_gid.copy_from_slice(&d[20..36]);
        let w = be32(d, 36);
        ReqPath {
            local_lid: be16(d, 0),
            remote_lid: be16(d, 2),
            local_gid,
            remote_gid,
            flow_label: w >> 12,
            packet_rate: (w & 0x3f) as u8,
            traffic_class: d[40],
            hop_limit: d[41],
            sl: d[42] >> 4,
            subnet_local: d[42] & 0x08 != 0,
            local_ack_timeout: d[43] >> 3,
        }
    }

    fn emit(&self, d: &mut [u8]) {
        put16(d, 0, self.local_lid);
        put16(d, 2, self.remote_lid);
        d[4..20].copy_from_slice(&self.local_gid);
        d[20..36].copy_from_slice(&self.remote_gid);
        put32(d, 36, (self.flow_label & 0xf_ffff) << 12 | u32::from(self.packet_rate & 0x3f));
        d[40] = self.traffic_class;
        d[41] = self.hop_limit;
        d[42] = (self.sl & 0xf) << 4 | u8::from(self.subnet_local) << 3;
        d[43] = (self.local_ack_timeout & 0x1f) << 3;
    }
}

/// ConnectRequest (IBTA 12.6.5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Req {
    /// Local Communication ID (the sender's).
    pub local_comm_id: u32,
    /// Service ID (RDMA-CM: port space << 16 | port).
    pub service_id: u64,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Local Q_Key (RD only; 0 for RC/UC).
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Responder resources: RDMA READ/atomic requests the sender accepts.
    pub responder_resources: u8,
    /// Local EECN (RD; 24 bits).
    pub local_eecn: u32,
    /// Initiator depth: RDMA READ/atomic requests the sender will issue.
    pub initiator_depth: u8,
    /// Remote EECN (RD; 24 bits).
    pub remote_eecn: u32,
    /// Remote CM response timeout (5 bits): how long the sender waits for a reply.
    pub remote_cm_response_timeout: u8,
    /// Transport service type (2 bits): 0 RC, 1 UC, 2 RD.
    pub transport_service_type: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// Starting PSN (24 bits): the PSN the passive side sends its first
    /// packet with (the active side's receive PSN; Linux `cm.c`).
    pub starting_psn: u32,
    /// Local CM response timeout (5 bits): how long the sender takes to answer.
    pub local_cm_response_timeout: u8,
    /// Retry count (3 bits).
    pub retry_count: u8,
    /// P_Key.
    pub partition_key: u16,
    /// Path MTU (4 bits, `ibv_mtu`: 1 = 256 … 5 = 4096).
    pub path_mtu: u8,
    /// RDC exists.
    pub rdc_exists: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Max CM retries (4 bits).
    pub max_cm_retries: u8,
    /// The sender's QP uses an SRQ.
    pub srq: bool,
    /// Extended transport type (3 bits; 0 except XRC).
    pub extended_transport_type: u8,
    /// Primary path.
    pub primary: ReqPath,
    /// Alternate path (all zero when none).
    pub alternate: ReqPath,
    /// Private data (92 bytes; RDMA-CM's IP header first).
    pub private_data: Vec<u8>,
}

/// ConnectReply (IBTA 12.6.8).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rep {
    /// Local Communication ID (the sender's).
    pub local_comm_id: u32,
    /// Remote Communication ID (the REQ's local one).
    pub remote_comm_id: u32,
    /// Local Q_Key (RD).
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Local EE context number (RD; 24 bits).
    pub local_eecn: u32,
    /// Starting PSN (24 bits): the PSN the active side sends its first
    /// packet with (the passive side's receive PSN).
    pub starting_psn: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// The sender's QP uses an SRQ.
    pub srq: bool,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Private data (196 bytes).
    pub private_data: Vec<u8>,
}

/// Which message a REJ or MRA answers (IBTA 12.6.6, 12.6.7: 2 bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsgRef {
    /// The REQ.
    Req,
    /// The REP.
    Rep,
    /// Other (LAP for MRA; "other" for REJ).
    Other,
}

impl MsgRef {
    fn from_bits(b: u8) -> Result<MsgRef, MadError> {
        match b {
            0 => Ok(MsgRef::Req),
            1 => Ok(MsgRef::Rep),
            2 => Ok(MsgRef::Other),
            _ => Err(MadError::Field("message REJected/MRAed")),
        }
    }

    fn bits(self) -> u8 {
        match self {
            MsgRef::Req => 0,
            MsgRef::Rep => 1,
            MsgRef::Other => 2,
        }
    }
}

/// MessageReceiptAcknowledgement (IBTA 12.6.6).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mra {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// The message acknowledged.
    pub msg_mraed: MsgRef,
    /// Service timeout (5 bits): how much longer the sender needs.
    pub service_timeout: u8,
    /// Private data (222 bytes).
    pub private_data: Vec<u8>,
}

/// ConnectReject (IBTA 12.6.7).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rej {
    /// Local Communication ID (0 when rejecting a REQ nobody took).
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// The message rejected.
    pub msg_rejected: MsgRef,
    /// Reject info length (7 bits).
    pub reject_info_len: u8,
    /// Reason ([`reason`]).
    pub reason: u16,
    /// Additional reject information (72 bytes).
    pub ari: [u8; 72],
    /// Private data (148 bytes).
    pub private_data: Vec<u8>,
}

/// REJ reasons (IBTA Table 103) urnic sends or acts on.
pub mod reason {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// Insufficient resources.
    pub const NO_RESOURCES: u16 = 3;
    /// Timeout (the sender gave up waiting).
    pub const TIMEOUT: u16 = 4;
    /// Unsupported request.
    pub const UNSUPPORTED: u16 = 5;
    /// Invalid Communication ID.
    pub const INVALID_COMM_ID: u16 = 6;
    /// Invalid Service ID: no listener (what Linux's CM answers a REQ nobody listens for).
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// Invalid transport service type.
    pub const INVALID_TRANSPORT_TYPE: u16 = 9;
    /// Stale connection.
    pub const STALE_CONN: u16 = 10;
    /// Invalid MTU.
    pub const INVALID_MTU: u16 = 26;
    /// Consumer reject (rdma_reject; private data from the consumer).
    pub const CONSUMER_DEFINED: u16 = 28;
    /// Invalid class version.
    pub const INVALID_CLASS_VERSION: u16 = 31;
}

/// ReadyToUse (IBTA 12.6.9).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rtu {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Private data (224 bytes).
    pub private_data: Vec<u8>,
}

/// DisconnectRequest (IBTA 12.6.10).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dreq {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Remote QPN/EECN (24 bits): the receiver's QP.
    pub remote_qpn: u32,
    /// Private data (220 bytes).
    pub private_data: Vec<u8>,
}

/// DisconnectReply (IBTA 12.6.11).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Drep {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Private data (224 bytes).
    pub private_data: Vec<u8>,
}

/// ServiceIDResolutionRequest (IBTA 12.11.1): UD "connections".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SidrReq {
    /// Request ID.
    pub request_id: u32,
    /// P_Key.
    pub partition_key: u16,
    /// Service ID.
    pub service_id: u64,
    /// Private data (216 bytes).
    pub private_data: Vec<u8>,
}

/// SIDR_REP status values (IBTA Table 108).
pub mod sidr_status {
    /// The QP is valid.
    pub const SUCCESS: u8 = 0;
    /// Service ID not supported (no listener).
    pub const SID_NOT_SUPPORTED: u8 = 1;
    /// Rejected by the service provider.
    pub const REJECTED: u8 = 2;
    /// No QP available.
    pub const NO_QP: u8 = 3;
}

/// ServiceIDResolutionResponse (IBTA 12.11.2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SidrRep {
    /// Request ID (the SIDR_REQ's).
    pub request_id: u32,
    /// Status ([`sidr_status`]).
    pub status: u8,
    /// Additional information length.
    pub add_info_len: u8,
    /// QPN (24 bits).
    pub qpn: u32,
    /// Service ID.
    pub service_id: u64,
    /// Q_Key.
    pub qkey: u32,
    /// ClassPortInfo (72 bytes; redirection, unused here).
    pub class_port_info: [u8; 72],
    /// Private data (136 bytes).
    pub private_data: Vec<u8>,
}

/// One CM message.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum CmMessage {
    Req(Req),
    Mra(Mra),
    Rej(Rej),
    Rep(Rep),
    Rtu(Rtu),
    Dreq(Dreq),
    Drep(Drep),
    SidrReq(SidrReq),
    SidrRep(SidrRep),
}

/// A whole CM MAD: the transaction ID and the message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CmMad {
    /// `TransactionID`.
    pub tid: u64,
    /// The message.
    pub msg: CmMessage,
}

fn private(d: &[u8], off: usize, len: usize) -> Vec<u8> {
    d[off..off + len].to_vec()
}

/// Copy `p` into `d[off..off + len]`, zero-padded; longer private data is
/// cut to the area (callers check lengths first, see `CmError::PrivateDataTooLong`).
fn put_private(d: &mut [u8], off: usize, len: usize, p: &[u8]) {
    let n = p.len().min(len);
    d[off..off + n].copy_from_slice(&p[..n]);
    d[off + n..off + len].fill(0);
}

impl CmMessage {
    /// The message's `AttributeID`.
    pub fn attr_id(&self) -> u16 {
        match self {
            CmMessage::Req(_) => attr::REQ,
            CmMessage::Mra(_) => attr::MRA,
            CmMessage::Rej(_) => attr::REJ,
            CmMessage::Rep(_) => attr::REP,
            CmMessage::Rtu(_) => attr::RTU,
            CmMessage::Dreq(_) => attr::DREQ,
            CmMessage::Drep(_) => attr::DREP,
            CmMessage::SidrReq(_) => attr::SIDR_REQ,
            CmMessage::SidrRep(_) => attr::SIDR_REP,
        }
    }

    /// The message's name as the spec writes it.
    pub fn name(&self) -> &'static str {
        match self {
            CmMessage::Req(_) => "REQ",
            CmMessage::Mra(_) => "MRA",
            CmMessage::Rej(_) => "REJ",
            CmMessage::Rep(_) => "REP",
            CmMessage::Rtu(_) => "RTU",
            CmMessage::Dreq(_) => "DREQ",
            CmMessage::Drep(_) => "DREP",
            CmMessage::SidrReq(_) => "SIDR_REQ",
            CmMessage::SidrRep(_) => "SIDR_REP",
        }
    }

    /// Parse the 232 bytes of message data `d` as attribute `attr_id`.
    pub fn parse(attr_id: u16, d: &[u8; CM_DATA_LEN]) -> Result<CmMessage, MadError> {
        let d = &d[..];
        Ok(match attr_id {
            attr::REQ => {
                let tst = (d[43] >> 1) & 0x3;
                if tst == 3 {
                    return Err(MadError::Field("transport service type"));
                }
                CmMessage::Req(Req {
                    local_comm_id: be32(d, 0),
                    service_id: be64(d, 8),
                    local_ca_guid: be64(d, 16),
                    local_qkey: be32(d, 28),
                    local_qpn: be24(d, 32),
                    responder_resources: d[35],
                    local_eecn: be24(d, 36),
                    initiator_depth: d[39],
                    remote_eecn: be24(d, 40),
                    remote_cm_response_timeout: d[43] >> 3,
                    transport_service_type: tst,
                    end_to_end_flow_control: d[43] & 1 != 0,
                    starting_psn: be24(d, 44),
                    local_cm_response_timeout: d[47] >> 3,
                    retry_count: d[47] & 0x7,
                    partition_key: be16(d, 48),
                    path_mtu: d[50] >> 4,
                    rdc_exists: d[50] & 0x08 != 0,
                    rnr_retry_count: d[50] & 0x7,
                    max_cm_retries: d[51] >> 4,
                    srq: d[51] & 0x08 != 0,
                    extended_transport_type: d[51] & 0x7,
                    primary: ReqPath::parse(&d[52..96]),
                    alternate: ReqPath::parse(&d[96..140]),
                    private_data: private(d, 140, private_len::REQ),
                })
            }
            attr::MRA => CmMessage::Mra(Mra {
                local_comm_id: be32(d, 0),
                remote_comm_id: be32(d, 4),
                msg_mraed: MsgRef::from_bits(d[8] >> 6)?,
                service_timeout: d[9] >> 3,
                private_data: private(d, 10, private_len::MRA),
            }),
            attr::REJ => {
                let mut ari = [0u8; 72];
                ari.copy_from_slice(&d[12..84]);
                CmMessage::Rej(Rej {
                    local_comm_id: be32(d, 0),
                    remote_comm_id: be32(d, 4),
                    msg_rejected: MsgRef::from_bits(d[8] >> 6)?,
                    reject_info_len: d[9] >> 1,
                    reason: be16(d, 10),
                    ari,
                    private_data: private(d, 84, private_len::REJ),
                })
            }
            attr::REP => CmMessage::Rep(Rep {
                local_comm_id: be32(d, 0),
                remote_comm_id: be32(d, 4),
                local_qkey: be32(d, 8),
                local_qpn: be24(d, 12),
                local_eecn: be24(d, 16),
                starting_psn: be24(d, 20),
                responder_resources: d[24],
                initiator_depth: d[25],
                target_ack_delay: d[26] >> 3,
                failover_accepted: (d[26] >> 1) & 0x3,
                end_to_end_flow_control: d[26] & 1 != 0,
                rnr_retry_count: d[27] >> 5,
                srq: d[27] & 0x10 != 0,
                local_ca_guid: be64(d, 28),
                private_data: private(d, 36, private_len::REP),
            }),
            attr::RTU => CmMessage::Rtu(Rtu { local_comm_id: be32(d, 0), remote_comm_id: be32(d, 4), private_data: private(d, 8, private_len::RTU) }),
            attr::DREQ => CmMessage::Dreq(Dreq {
                local_comm_id: be32(d, 0),
                remote_comm_id: be32(d, 4),
                remote_qpn: be24(d, 8),
                private_data: private(d, 12, private_len::DREQ),
            }),
            attr::DREP => {
                CmMessage::Drep(Drep { local_comm_id: be32(d, 0), remote_comm_id: be32(d, 4), private_data: private(d, 8, private_len::DREP) })
            }
            attr::SIDR_REQ => CmMessage::SidrReq(SidrReq {
                request_id: be32(d, 0),
                partition_key: be16(d, 4),
                service_id: be64(d, 8),
                private_data: private(d, 16, private_len::SIDR_REQ),
            }),
            attr::SIDR_REP => {
                let mut class_port_info = [0u8; 72];
                class_port_info.copy_from_slice(&d[24..96]);
                CmMessage::SidrRep(SidrRep {
                    request_id: be32(d, 0),
                    status: d[4],
                    add_info_len: d[5],
                    qpn: be24(d, 8),
                    service_id: be64(d, 12),
                    qkey: be32(d, 20),
                    class_port_info,
                    private_data: private(d, 96, private_len::SIDR_REP),
                })
            }
            other => return Err(MadError::Attribute(other)),
        })
    }

    /// Write the message into the 232 bytes of message data `d` (every byte
    /// of `d` is written: reserved ones as zero).
    pub fn emit(&self, d: &mut [u8; CM_DATA_LEN]) {
        d.fill(0);
        let d = &mut d[..];
        match self {
            CmMessage::Req(r) => {
                put32(d, 0, r.local_comm_id);
                put64(d, 8, r.service_id);
                put64(d, 16, r.local_ca_guid);
                put32(d, 28, r.local_qkey);
                put24(d, 32, r.local_qpn);
                d[35] = r.responder_resources;
                put24(d, 36, r.local_eecn);
                d[39] = r.initiator_depth;
                put24(d, 40, r.remote_eecn);
                d[43] = (r.remote_cm_response_timeout & 0x1f) << 3 | (r.transport_service_type & 0x3) << 1 | u8::from(r.end_to_end_flow_control);
                put24(d, 44, r.starting_psn);
                d[47] = (r.local_cm_response_timeout & 0x1f) << 3 | (r.retry_count & 0x7);
                put16(d, 48, r.partition_key);
                d[50] = (r.path_mtu & 0xf) << 4 | u8::from(r.rdc_exists) << 3 | (r.rnr_retry_count & 0x7);
                d[51] = (r.max_cm_retries & 0xf) << 4 | u8::from(r.srq) << 3 | (r.extended_transport_type & 0x7);
                r.primary.emit(&mut d[52..96]);
                r.alternate.emit(&mut d[96..140]);
                put_private(d, 140, private_len::REQ, &r.private_data);
            }
            CmMessage::Mra(m) => {
                put32(d, 0, m.local_comm_id);
                put32(d, 4, m.remote_comm_id);
                d[8] = m.msg_mraed.bits() << 6;
                d[9] = (m.service_timeout & 0x1f) << 3;
                put_private(d, 10, private_len::MRA, &m.private_data);
            }
            CmMessage::Rej(r) => {
                put32(d, 0, r.local_comm_id);
                put32(d, 4, r.remote_comm_id);
                d[8] = r.msg_rejected.bits() << 6;
                d[9] = (r.reject_info_len & 0x7f) << 1;
                put16(d, 10, r.reason);
                d[12..84].copy_from_slice(&r.ari);
                put_private(d, 84, private_len::REJ, &r.private_data);
            }
            CmMessage::Rep(r) => {
                put32(d, 0, r.local_comm_id);
                put32(d, 4, r.remote_comm_id);
                put32(d, 8, r.local_qkey);
                put24(d, 12, r.local_qpn);
                put24(d, 16, r.local_eecn);
                put24(d, 20, r.starting_psn);
                d[24] = r.responder_resources;
                d[25] = r.initiator_depth;
                d[26] = (r.target_ack_delay & 0x1f) << 3 | (r.failover_accepted & 0x3) << 1 | u8::from(r.end_to_end_flow_control);
                d[27] = (r.rnr_retry_count & 0x7) << 5 | u8::from(r.srq) << 4;
                put64(d, 28, r.local_ca_guid);
                put_private(d, 36, private_len::REP, &r.private_data);
            }
            CmMessage::Rtu(r) => {
                put32(d, 0, r.local_comm_id);
                put32(d, 4, r.remote_comm_id);
                put_private(d, 8, private_len::RTU, &r.private_data);
            }
            CmMessage::Dreq(r) => {
                put32(d, 0, r.local_comm_id);
                put32(d, 4, r.remote_comm_id);
                put24(d, 8, r.remote_qpn);
                put_private(d, 12, private_len::DREQ, &r.private_data);
            }
            CmMessage::Drep(r) => {
                put32(d, 0, r.local_comm_id);
                put32(d, 4, r.remote_comm_id);
                put_private(d, 8, private_len::DREP, &r.private_data);
            }
            CmMessage::SidrReq(r) => {
                put32(d, 0, r.request_id);
                put16(d, 4, r.partition_key);
                put64(d, 8, r.service_id);
                put_private(d, 16, private_len::SIDR_REQ, &r.private_data);
            }
            CmMessage::SidrRep(r) => {
                put32(d, 0, r.request_id);
                d[4] = r.status;
                d[5] = r.add_info_len;
                put24(d, 8, r.qpn);
                put64(d, 12, r.service_id);
                put32(d, 20, r.qkey);
                d[24..96].copy_from_slice(&r.class_port_info);
                put_private(d, 96, private_len::SIDR_REP, &r.private_data);
            }
        }
    }
}

impl CmMad {
    /// Parse a whole 256-byte MAD (header checks in [`MadHeader::parse`]).
    pub fn parse(mad: &[u8]) -> Result<CmMad, MadError> {
        let h = MadHeader::parse(mad)?;
        let mut data = [0u8; CM_DATA_LEN];
        data.copy_from_slice(&mad[MAD_HEADER_LEN..]);
        Ok(CmMad { tid: h.tid, msg: CmMessage::parse(h.attr_id, &data)? })
    }

    /// The 256-byte MAD.
    pub fn emit(&self) -> [u8; MAD_LEN] {
        let mut mad = [0u8; MAD_LEN];
        MadHeader { status: 0, class_specific: 0, tid: self.tid, attr_id: self.msg.attr_id(), attr_mod: 0 }.emit(&mut mad);
        let mut data = [0u8; CM_DATA_LEN];
        self.msg.emit(&mut data);
        mad[MAD_HEADER_LEN..].copy_from_slice(&data);
        mad
    }
}
