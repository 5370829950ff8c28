//! Work requests and work completions, named as in ibverbs.

use bitflags::bitflags;

pub use crate::transport::ids::{CqId, Sge};

bitflags! {
    /// `IBV_SEND_*` flags.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// Wait for all prior RDMA READ and ATOMIC operations to complete first.
        const FENCE = 1 << 0;
        /// Generate a completion even if the QP was created with `sq_sig_all = false`.
        const SIGNALED = 1 << 1;
        /// Set the solicited-event bit on the last packet.
        const SOLICITED = 1 << 2;
        /// The payload was copied at post time (see [`Payload::Inline`]).
        const INLINE = 1 << 3;
    }
}

/// Where a remote operation points: remote virtual address and key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct RemoteAddr {
    /// Remote virtual address.
    pub addr: u64,
    /// Remote key.
    pub rkey: u32,
}

/// The operation of a send-queue work request (`ibv_wr_opcode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SendOp {
    /// `IBV_WR_SEND`.
    Send,
    /// `IBV_WR_SEND_WITH_IMM`.
    SendWithImm {
        /// Immediate data (host order; sent big-endian).
        imm: u32,
    },
    /// `IBV_WR_SEND_WITH_INV`: the responder invalidates `rkey`.
    SendWithInv {
        /// R_Key to invalidate at the responder.
        rkey: u32,
    },
    /// `IBV_WR_RDMA_WRITE`.
    Write {
        /// Target.
        remote: RemoteAddr,
    },
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`: consumes a receive WQE at the responder.
    WriteWithImm {
        /// Target.
        remote: RemoteAddr,
        /// Immediate data.
        imm: u32,
    },
    /// `IBV_WR_RDMA_READ`: the local SGEs receive the data.
    Read {
        /// Source.
        remote: RemoteAddr,
    },
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`: one 8-byte local SGE receives the original value.
    CmpSwap {
        /// Target (8-byte aligned).
        remote: RemoteAddr,
        /// Compare value.
        compare: u64,
        /// Swap value.
        swap: u64,
    },
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`: one 8-byte local SGE receives the original value.
    FetchAdd {
        /// Target (8-byte aligned).
        remote: RemoteAddr,
        /// Value to add.
        add: u64,
    },
    /// `IBV_WR_LOCAL_INV`: invalidate a local key (memory window or MR).
    LocalInv {
        /// Key to invalidate.
        rkey: u32,
    },
    /// `IBV_WR_BIND_MW`: bind a type-2 memory window.
    BindMw {
        /// The window's current rkey (its key byte is replaced by `new_key`).
        mw_rkey: u32,
        /// New 8-bit key for the window.
        new_key: u8,
        /// The MR the window binds into (its lkey).
        mr_lkey: u32,
        /// Start address of the window.
        addr: u64,
        /// Length of the window.
        length: u64,
        /// Remote access rights of the window.
        access: crate::transport::ids::Access,
    },
}

impl SendOp {
    /// The completion opcode this operation reports.
    pub const fn wc_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => WcOpcode::Send,
            SendOp::Write { .. } | SendOp::WriteWithImm { .. } => WcOpcode::RdmaWrite,
            SendOp::Read { .. } => WcOpcode::RdmaRead,
            SendOp::CmpSwap { .. } => WcOpcode::CompSwap,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
            SendOp::LocalInv { .. } => WcOpcode::LocalInv,
            SendOp::BindMw { .. } => WcOpcode::BindMw,
        }
    }
}

/// Where a send WR's payload comes from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Payload {
    /// Gathered from registered memory at transmit time.
    Sgl(Vec<Sge>),
    /// Copied at post time (`IBV_SEND_INLINE`): no lkey needed.
    Inline(Vec<u8>),
}

impl Payload {
    /// Total payload length in bytes.
    pub fn len(&self) -> u64 {
        match self {
            Payload::Sgl(s) => s.iter().map(|s| u64::from(s.length)).sum(),
            Payload::Inline(v) => v.len() as u64,
        }
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// UD destination of a send WR (`wr.ud`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UdDest {
    /// Where to send: the resolved address handle.
    pub av: crate::transport::attr::AddressVector,
    /// Remote QPN.
    pub remote_qpn: u32,
    /// Remote Q_Key (if its top bit is set, the QP's own Q_Key is used, IBTA 10.2.5).
    pub remote_qkey: u32,
}

/// A send-queue work request (`struct ibv_send_wr`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SendWr {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: SendOp,
    /// Local data: source for SEND/WRITE, destination for READ/atomics.
    pub payload: Payload,
    /// `IBV_SEND_*` flags.
    pub flags: SendFlags,
    /// Destination for UD QPs; `None` for connected QPs.
    pub ud: Option<UdDest>,
}

/// A receive-queue work request (`struct ibv_recv_wr`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct RecvWr {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Where incoming SEND data is placed.
    pub sgl: Vec<Sge>,
}

/// Completion status (`enum ibv_wc_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcStatus {
    /// `IBV_WC_SUCCESS`.
    Success,
    /// `IBV_WC_LOC_LEN_ERR`: local buffer too small / message too long.
    LocLenErr,
    /// `IBV_WC_LOC_QP_OP_ERR`: internal QP consistency error.
    LocQpOpErr,
    /// `IBV_WC_LOC_PROT_ERR`: bad lkey / local protection error.
    LocProtErr,
    /// `IBV_WC_WR_FLUSH_ERR`: flushed because the QP entered the error state.
    WrFlushErr,
    /// `IBV_WC_MW_BIND_ERR`.
    MwBindErr,
    /// `IBV_WC_BAD_RESP_ERR`: unexpected transport opcode in a response.
    BadRespErr,
    /// `IBV_WC_LOC_ACCESS_ERR`: protection error on a local data buffer (responder).
    LocAccessErr,
    /// `IBV_WC_REM_INV_REQ_ERR`: the responder saw an invalid request.
    RemInvReqErr,
    /// `IBV_WC_REM_ACCESS_ERR`: the responder saw a protection error.
    RemAccessErr,
    /// `IBV_WC_REM_OP_ERR`: the responder could not complete the operation.
    RemOpErr,
    /// `IBV_WC_RETRY_EXC_ERR`: transport retry counter exceeded.
    RetryExcErr,
    /// `IBV_WC_RNR_RETRY_EXC_ERR`: RNR retry counter exceeded.
    RnrRetryExcErr,
    /// `IBV_WC_REM_ABORT_ERR`.
    RemAbortErr,
    /// `IBV_WC_GENERAL_ERR`.
    GeneralErr,
}

/// Completion opcode (`enum ibv_wc_opcode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// `IBV_WC_SEND`.
    Send,
    /// `IBV_WC_RDMA_WRITE`.
    RdmaWrite,
    /// `IBV_WC_RDMA_READ`.
    RdmaRead,
    /// `IBV_WC_COMP_SWAP`.
    CompSwap,
    /// `IBV_WC_FETCH_ADD`.
    FetchAdd,
    /// `IBV_WC_BIND_MW`.
    BindMw,
    /// `IBV_WC_LOCAL_INV`.
    LocalInv,
    /// `IBV_WC_RECV`.
    Recv,
    /// `IBV_WC_RECV_RDMA_WITH_IMM`.
    RecvRdmaWithImm,
}

/// A work completion (`struct ibv_wc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WorkCompletion {
    /// The WR's identifier.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// What completed. Valid for error completions too (urnic always fills it).
    pub opcode: WcOpcode,
    /// Local QPN.
    pub qp_num: u32,
    /// Bytes received (receive completions) or transferred (READ/atomic: 8).
    pub byte_len: u32,
    /// Immediate data, when the message carried it.
    pub imm_data: Option<u32>,
    /// R_Key invalidated by a SEND with invalidate.
    pub invalidated_rkey: Option<u32>,
    /// Source QPN (UD receive).
    pub src_qp: u32,
    /// A 40-byte GRH precedes UD receive data (`IBV_WC_GRH`).
    pub grh: bool,
}

impl Default for WorkCompletion {
    /// A zeroed completion (as a C program zero-fills its `ibv_wc` array):
    /// the buffer `Cq::poll` writes into.
    fn default() -> Self {
        WorkCompletion {
            wr_id: 0,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            qp_num: 0,
            byte_len: 0,
            imm_data: None,
            invalidated_rkey: None,
            src_qp: 0,
            grh: false,
        }
    }
}

impl Completion {
    /// A completion carrying only an error `status` (no data moved), for `cq`.
    /// Error completions always wake a CQ armed for solicited events.
    pub const fn error(cq: CqId, qp_num: u32, wr_id: u64, opcode: WcOpcode, status: WcStatus) -> Completion {
        Completion {
            cq,
            wc: WorkCompletion { wr_id, status, opcode, qp_num, byte_len: 0, imm_data: None, invalidated_rkey: None, src_qp: 0, grh: false },
            solicited: true,
        }
    }
}

/// A completion destined for a completion queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Completion {
    /// The CQ it belongs to.
    pub cq: CqId,
    /// The completion.
    pub wc: WorkCompletion,
    /// A receive completion for a message that had the solicited-event bit
    /// set (wakes a CQ armed with `solicited_only`; error completions always do).
    pub solicited: bool,
}
