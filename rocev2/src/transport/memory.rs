//! Registered memory: memory regions (MR) and memory windows (MW), their keys
//! and access checks, and the "DMA" that places and fetches data.
//!
//! CONTRACT (fixed; requester, responder and the verbs layer code against it):
//! - A `MemoryTable` is shared by every QP of a device (`Arc<MemoryTable>`) and
//!   may be used from several threads: registration from application threads,
//!   data movement from datapath threads. Deregistration waits for in-flight
//!   data movement on that region to finish (a `RwLock` per table or per region
//!   gives that: movers hold a read guard while they touch memory).
//! - Keys follow the ibverbs convention: `key = index << 8 | key_byte`; an MR's
//!   lkey == rkey. Re-registration or MW re-bind changes the key byte, so stale
//!   keys fail.
//! - Every remote check is done before any byte is touched: a failing request
//!   leaves target memory untouched.

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

/// Memory-window type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MwType {
    /// Type 1: bound with `ibv_bind_mw`, not tied to a QP.
    Type1,
    /// Type 2: bound with a BIND_MW work request, tied to the binding QP.
    Type2,
}

/// Why an access to registered memory was refused. The responder maps these
/// to NAK codes (remote access error) and the requester to completion status
/// (local protection / local access errors).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AccessError {
    /// No region or window with this key (or stale key byte).
    InvalidKey,
    /// The key belongs to another protection domain.
    PdMismatch,
    /// The region/window does not grant the needed access.
    AccessDenied,
    /// The range falls outside the region/window (or overflows).
    OutOfBounds,
    /// An atomic address is not 8-byte aligned.
    Misaligned,
    /// The key was invalidated.
    Invalidated,
    /// A type-2 window used by a QP it is not bound to.
    WrongQp,
}

/// An atomic operation on 8 bytes of registered memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AtomicOp {
    /// Compare and swap.
    CmpSwap {
        /// Compare value.
        compare: u64,
        /// Swap value.
        swap: u64,
    },
    /// Fetch and add.
    FetchAdd {
        /// Value to add.
        add: u64,
    },
}
