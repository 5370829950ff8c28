//! The small identifiers and values every part of the transport shares:
//! protection domains, completion and shared receive queues, access rights
//! and scatter/gather elements (`ibv_pd`, `ibv_cq`, `ibv_srq`,
//! `enum ibv_access_flags`, `struct ibv_sge`). They live here, below the QP
//! attributes, the memory table and the work requests, so none of those
//! needs another for them.

use bitflags::bitflags;

bitflags! {
    /// Access rights (`enum ibv_access_flags`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct Access: u32 {
        /// `IBV_ACCESS_LOCAL_WRITE`: the HCA may write (receives, READ responses, atomics results).
        const LOCAL_WRITE = 1 << 0;
        /// `IBV_ACCESS_REMOTE_WRITE`.
        const REMOTE_WRITE = 1 << 1;
        /// `IBV_ACCESS_REMOTE_READ`.
        const REMOTE_READ = 1 << 2;
        /// `IBV_ACCESS_REMOTE_ATOMIC`.
        const REMOTE_ATOMIC = 1 << 3;
        /// `IBV_ACCESS_MW_BIND`.
        const MW_BIND = 1 << 4;
        /// `IBV_ACCESS_ZERO_BASED`: addresses are offsets from the start.
        const ZERO_BASED = 1 << 5;
    }
}

/// Identifies a protection domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct PdId(pub u32);

/// Identifies a completion queue. The engine does not own CQs: it tags each
/// completion with the CQ the QP was created with and the caller delivers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct CqId(pub u32);

/// Identifies a shared receive queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct SrqId(pub u32);

/// One scatter/gather element: `length` bytes at local address `addr` of the
/// memory region whose local key is `lkey` (`struct ibv_sge`, with its
/// layout: the C library views a program's `ibv_sge` array as `[Sge]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(C)]
pub struct Sge {
    /// Address in the region's address space (the registered IOVA).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the region.
    pub lkey: u32,
}
