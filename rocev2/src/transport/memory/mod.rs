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
//!
//! # Implementation
//! One reader-writer lock guards the whole table (`lock`). Data
//! movers (`remote_*`, `local_*`) hold a read guard for the whole
//! check-then-copy, so many datapath threads move data at once, and
//! `deregister`/`reregister` (write guard) wait until every in-flight copy has
//! finished: after they return, no byte of the old region is touched again.
//! MW bind and invalidation also take the write guard (they are rare control
//! operations). A datapath thread opens a [`MemoryBatch`] around a poll
//! iteration: its movers then enter the lock once for the whole iteration
//! instead of once per copy, and writers wait for the iteration's end.
//!
//! MRs and MWs share one index space (index 0 is never used, so key 0 is never
//! valid). A slot's key byte is drawn at random, different from its previous
//! one, whenever the slot gets a new object or an MR is re-registered (rxe
//! `rxe_get_next_key`), and set to the caller's byte on an MW bind. The
//! generator is seeded from the operating system's randomness for every table
//! ([`MemoryTable::new`]), so no two devices hand out the same key sequence and
//! a peer cannot predict a key from the order of registrations;
//! [`MemoryTable::with_seed`] makes it repeatable for simulations. Freed
//! indices are reused first-in first-out.
//!
//! Atomics are real `AtomicU64` operations on the registered memory, so they
//! are atomic against every other QP and thread using this table (rxe uses a
//! global spinlock for the same guarantee, `atomic_ops_lock` in rxe_resp.c).
//! As in rxe, the 8-byte target is read in host byte order.
//!
//! The memory is shared with the application the way a NIC's DMA shares it:
//! the application must not read a buffer before the completion that covers it
//! has been polled (ibverbs rules), and the table never creates Rust references
//! to registered memory; it copies with raw pointers.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::transport::ids::Sge;
pub use crate::transport::ids::{Access, PdId};

mod cache;
mod check;
mod dma;
mod keys;
mod lock;
mod object;
mod region;
mod window;

pub use cache::{LkeyCache, LKEY_CACHE_ENTRIES};
pub use dma::{sgl_len, GatherMemo, WriteMemo};
use keys::{key_of, Table, MAX_INDEX};
use lock::{ReadGuard, TableLock, WriteGuard};
use object::Object;
use region::{Region, RegionPtr};

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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum AccessError {
    /// No region or window with this key (or stale key byte).
    #[error("no memory region or window with this key")]
    InvalidKey,
    /// The key belongs to another protection domain.
    #[error("the key belongs to another protection domain")]
    PdMismatch,
    /// The region/window does not grant the needed access.
    #[error("the region or window does not grant this access")]
    AccessDenied,
    /// The range falls outside the region/window (or overflows).
    #[error("the range lies outside the region or window")]
    OutOfBounds,
    /// An atomic address is not 8-byte aligned.
    #[error("the atomic target is not 8-byte aligned")]
    Misaligned,
    /// The key was invalidated.
    #[error("the key was invalidated")]
    Invalidated,
    /// A type-2 window used by a QP it is not bound to.
    #[error("the type-2 window is bound to another QP")]
    WrongQp,
}

/// The first SGE of a list that the checker refused
/// ([`MemoryTable::local_check_sgl`]): where it is in the list, the SGE
/// itself, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[error("sge[{index}] (addr {:#x}, length {}, lkey {:#x}): {error}", sge.addr, sge.length, sge.lkey)]
pub struct SgeError {
    /// Its index in the list.
    pub index: usize,
    /// The SGE.
    pub sge: Sge,
    /// Why it was refused.
    pub error: AccessError,
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

/// The keys of a registered memory region (`ibv_mr.lkey` / `ibv_mr.rkey`);
/// equal for urnic MRs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MrKeys {
    /// Local key (used in SGEs).
    pub lkey: u32,
    /// Remote key (used by peers in RETH/AtomicETH).
    pub rkey: u32,
}

/// Why a registration-side call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum RegError {
    /// Bad argument: null address, `iova + len` overflowing, REMOTE_WRITE or
    /// REMOTE_ATOMIC without LOCAL_WRITE (`ibv_reg_mr`: EINVAL), a key of the
    /// wrong kind (an MW key given to `deregister`, ...).
    #[error("invalid argument")]
    InvalidArgument,
    /// The table is full (2^24 - 1 keys, or the limit given to
    /// [`MemoryTable::with_max_entries`]).
    #[error("no free memory keys")]
    NoResources,
    /// No object with this key (or a stale key byte).
    #[error("no memory region or window with this key")]
    InvalidKey,
    /// The region still has memory windows bound to it (`ibv_dereg_mr`: EBUSY).
    #[error("memory windows are still bound to the region")]
    Busy,
}

/// A seed from the operating system's randomness: std's `RandomState` keys
/// come from the OS (getrandom) once per thread and differ for every
/// instance, so hashing nothing with a fresh one gives an unpredictable,
/// per-table value without any I/O of our own.
fn os_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x7572_6e69_632d_6b65); // "urnic-ke"
    h.finish()
}

/// A batch of data movement on one thread ([`MemoryTable::batch`]); ends
/// when dropped. Not `Send`: it marks the thread that opened it.
pub struct MemoryBatch<'a> {
    _batch: lock::Batch<'a, Table>,
}

impl std::fmt::Debug for MemoryBatch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBatch").finish_non_exhaustive()
    }
}

/// The device's registered memory: MRs and MWs, keys, checks and data movement.
#[derive(Debug)]
pub struct MemoryTable {
    inner: TableLock<Table>,
    /// Renewed by every writer before it changes the table, from a counter
    /// shared by every table of the process ([`fresh_generation`]): what
    /// [`LkeyCache`] verdicts and the data movers' memos are valid for. A
    /// value no other table ever holds, so that a memo taken on one table
    /// cannot pass as fresh on another (whose host pointers it does not
    /// hold), whatever their numbers of changes.
    generation: AtomicU64,
}

/// A table generation never handed out before in this process (from 1: 0 is
/// no table's, the memos' and cache entries' empty value).
fn fresh_generation() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Default for MemoryTable {
    fn default() -> Self {
        MemoryTable::new()
    }
}

impl MemoryTable {
    /// An empty table (up to 2^24 - 1 MRs and MWs together) whose key bytes
    /// come from a generator seeded from the operating system's randomness.
    pub fn new() -> MemoryTable {
        MemoryTable::with_max_entries(MAX_INDEX)
    }

    /// An empty table holding at most `max` MRs and MWs together (capped at
    /// 2^24 - 1), keys seeded from the operating system's randomness.
    pub fn with_max_entries(max: u32) -> MemoryTable {
        MemoryTable::build(max, os_seed())
    }

    /// An empty table whose key bytes follow a fixed sequence given by
    /// `seed`: for seeded simulations and tests that must repeat exactly.
    /// A device must not use this (its keys would be predictable).
    pub fn with_seed(seed: u64) -> MemoryTable {
        MemoryTable::build(MAX_INDEX, seed)
    }

    fn build(max: u32, seed: u64) -> MemoryTable {
        MemoryTable { inner: TableLock::new(Table::new(max.min(MAX_INDEX), seed)), generation: AtomicU64::new(fresh_generation()) }
    }

    #[inline]
    fn read(&self) -> ReadGuard<'_, Table> {
        self.inner.read()
    }

    fn write(&self) -> WriteGuard<'_, Table> {
        let t = self.inner.write();
        // Before any change: a memo taken earlier no longer answers (cache.rs).
        // A fresh value, not an increment (writers hold the lock, one at a
        // time); swapped with the add's ordering.
        self.generation.swap(fresh_generation(), Ordering::AcqRel);
        t
    }

    /// Open a batch of data movement on this thread: until the batch is
    /// dropped, this thread's movers on this table enter its lock once (at
    /// the first of them) instead of once per call, and registration changes
    /// (`deregister`, `reregister`, MW bind and invalidation) from other
    /// threads wait for the batch's end, as they wait for a copy in flight.
    /// A change made on this thread inside the batch does not wait for it.
    /// For a poll iteration; keep it short (it delays deregistrations) and
    /// take no lock inside it that a thread changing registrations may
    /// hold, nor change another table's registrations inside it (that
    /// writer would wait for the other table's batches while this one
    /// holds its own: two such threads would wait for each other). A batch
    /// opened while another is open on this thread (on any table) does
    /// nothing.
    pub fn batch(&self) -> MemoryBatch<'_> {
        MemoryBatch { _batch: self.inner.batch() }
    }

    fn check_reg_args(addr: *mut u8, len: usize, iova: u64, access: Access) -> Result<(), RegError> {
        if addr.is_null() || isize::try_from(len).is_err() || (addr as usize).checked_add(len).is_none() {
            return Err(RegError::InvalidArgument);
        }
        if !access.contains(Access::ZERO_BASED) && iova.checked_add(len as u64).is_none() {
            return Err(RegError::InvalidArgument);
        }
        // ibv_reg_mr(3): "If IBV_ACCESS_REMOTE_WRITE or IBV_ACCESS_REMOTE_ATOMIC
        // is set, then IBV_ACCESS_LOCAL_WRITE must be set too" (EINVAL).
        if access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC) && !access.contains(Access::LOCAL_WRITE) {
            return Err(RegError::InvalidArgument);
        }
        Ok(())
    }

    /// A checked, unregistered region over `[addr, addr + len)`.
    fn new_region(pd: PdId, addr: *mut u8, len: usize, iova: u64, access: Access) -> Result<Region, RegError> {
        Self::check_reg_args(addr, len, iova, access)?;
        Ok(Region { pd, ptr: RegionPtr(addr), len: len as u64, iova, access, bound_windows: 0, invalidated: false })
    }

    /// Register `[addr, addr + len)` as a memory region of `pd` whose first
    /// byte has address `iova` (0 when `access` has ZERO_BASED) for SGEs and
    /// peers (`ibv_reg_mr_iova`).
    ///
    /// # Safety
    /// `[addr, addr+len)` stays valid for reads and writes until `deregister` returns.
    pub unsafe fn register(&self, pd: PdId, addr: *mut u8, len: usize, iova: u64, access: Access) -> Result<MrKeys, RegError> {
        let region = Self::new_region(pd, addr, len, iova, access)?;
        let key = self.write().insert(Object::Mr(region))?;
        Ok(MrKeys { lkey: key, rkey: key })
    }

    /// [`MemoryTable::register`] with a chosen key (`index << 8 | key_byte`)
    /// instead of the next free one: for replaying captured traffic, whose
    /// requests carry the peer's rkeys, and for tests. Fails with
    /// [`RegError::InvalidArgument`] when the index is 0 or already in use.
    ///
    /// # Safety
    /// As for [`MemoryTable::register`].
    pub unsafe fn register_with_key(&self, pd: PdId, addr: *mut u8, len: usize, iova: u64, access: Access, key: u32) -> Result<MrKeys, RegError> {
        let region = Self::new_region(pd, addr, len, iova, access)?;
        let key = self.write().insert_at(key, Object::Mr(region))?;
        Ok(MrKeys { lkey: key, rkey: key })
    }

    /// Re-register the region `lkey` with new memory, PD, IOVA and access
    /// (`ibv_rereg_mr` with every change flag; pass the old values for what
    /// does not change). The index stays, the key byte changes: old keys fail.
    /// Waits for in-flight data movement on the table. Refused with
    /// [`RegError::Busy`] while windows are bound (as for `deregister`: the
    /// windows would keep pointing into the old translation). Clears an
    /// invalidation.
    ///
    /// # Safety
    /// `[addr, addr+len)` stays valid for reads and writes until `deregister`
    /// (or the next `reregister`) returns.
    pub unsafe fn reregister(&self, lkey: u32, pd: PdId, addr: *mut u8, len: usize, iova: u64, access: Access) -> Result<MrKeys, RegError> {
        let region = Self::new_region(pd, addr, len, iova, access)?;
        let mut t = self.write();
        let index = lkey >> 8;
        match t.get_mut(lkey) {
            None => return Err(RegError::InvalidKey),
            Some(Object::Mw(_)) => return Err(RegError::InvalidArgument),
            Some(Object::Mr(r)) => {
                if r.bound_windows > 0 {
                    return Err(RegError::Busy);
                }
                *r = region;
            }
        }
        let last = t.slots[index as usize].key;
        let byte = t.next_key_byte(last);
        t.slots[index as usize].key = byte;
        let key = key_of(index, byte);
        Ok(MrKeys { lkey: key, rkey: key })
    }

    /// Deregister the region `lkey` (`ibv_dereg_mr`). Waits for in-flight data
    /// movement to finish: once this returns, the region's memory is never
    /// touched again. Refused with [`RegError::Busy`] while windows are bound
    /// (rxe: `rxe_dereg_mr` returns -EINVAL while `num_mw > 0`).
    pub fn deregister(&self, lkey: u32) -> Result<(), RegError> {
        let mut t = self.write();
        match t.get(lkey) {
            None => Err(RegError::InvalidKey),
            Some(Object::Mw(_)) => Err(RegError::InvalidArgument),
            Some(Object::Mr(r)) if r.bound_windows > 0 => Err(RegError::Busy),
            Some(Object::Mr(_)) => {
                t.remove(lkey >> 8);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests;
