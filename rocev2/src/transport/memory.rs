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
//! One `RwLock` guards the whole table. Data movers (`remote_*`, `local_*`)
//! hold the read guard for the whole check-then-copy, so many datapath threads
//! move data at once, and `deregister`/`reregister` (write guard) wait until
//! every in-flight copy has finished: after they return, no byte of the old
//! region is touched again. MW bind and invalidation also take the write guard
//! (they are rare control operations).
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

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::transport::ids::Sge;
pub use crate::transport::ids::{Access, PdId};
use crate::wire::crc;



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

impl fmt::Display for AccessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AccessError::InvalidKey => "no memory region or window with this key",
            AccessError::PdMismatch => "the key belongs to another protection domain",
            AccessError::AccessDenied => "the region or window does not grant this access",
            AccessError::OutOfBounds => "the range lies outside the region or window",
            AccessError::Misaligned => "the atomic target is not 8-byte aligned",
            AccessError::Invalidated => "the key was invalidated",
            AccessError::WrongQp => "the type-2 window is bound to another QP",
        })
    }
}

impl std::error::Error for AccessError {}

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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RegError {
    /// Bad argument: null address, `iova + len` overflowing, REMOTE_WRITE or
    /// REMOTE_ATOMIC without LOCAL_WRITE (`ibv_reg_mr`: EINVAL), a key of the
    /// wrong kind (an MW key given to `deregister`, ...).
    InvalidArgument,
    /// The table is full (2^24 - 1 keys, or the limit given to
    /// [`MemoryTable::with_max_entries`]).
    NoResources,
    /// No object with this key (or a stale key byte).
    InvalidKey,
    /// The region still has memory windows bound to it (`ibv_dereg_mr`: EBUSY).
    Busy,
}

impl fmt::Display for RegError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RegError::InvalidArgument => "invalid argument",
            RegError::NoResources => "no free memory keys",
            RegError::InvalidKey => "no memory region or window with this key",
            RegError::Busy => "memory windows are still bound to the region",
        })
    }
}

impl std::error::Error for RegError {}

/// Largest usable index: keys carry 24 index bits.
const MAX_INDEX: u32 = (1 << 24) - 1;

/// Rights a memory window may grant (IBTA 10.6.7: windows grant remote access only).
const MW_RIGHTS: Access = Access::REMOTE_READ
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_ATOMIC)
    .union(Access::ZERO_BASED);

/// Start of registered memory.
#[derive(Clone, Copy, Debug)]
struct RegionPtr(*mut u8);

// SAFETY: the caller of `MemoryTable::register` promised that the memory stays
// valid for reads and writes (from any thread) until `deregister` returns; the
// pointer is only dereferenced under the table's read guard, which
// `deregister` waits for.
unsafe impl Send for RegionPtr {}
// SAFETY: as above; the table never hands out references into the region.
unsafe impl Sync for RegionPtr {}

#[derive(Debug)]
struct Region {
    pd: PdId,
    ptr: RegionPtr,
    len: u64,
    iova: u64,
    access: Access,
    /// Memory windows bound into this region.
    bound_windows: u32,
    /// Invalidated (LOCAL_INV / SEND with invalidate) and not re-registered since.
    invalidated: bool,
}

impl Region {
    /// First address of the region's address space: the IOVA, or 0 when
    /// registered ZERO_BASED.
    fn base(&self) -> u64 {
        if self.access.contains(Access::ZERO_BASED) {
            0
        } else {
            self.iova
        }
    }

    /// Byte offset of `[va, va + len)` within the region. Overflow-safe.
    fn offset_of(&self, va: u64, len: u64) -> Result<u64, AccessError> {
        let off = va.checked_sub(self.base()).ok_or(AccessError::OutOfBounds)?;
        let end = off.checked_add(len).ok_or(AccessError::OutOfBounds)?;
        if end > self.len {
            return Err(AccessError::OutOfBounds);
        }
        Ok(off)
    }

    /// Host pointer to byte `off` (`off <= len`, checked by `offset_of`).
    fn host(&self, off: u64) -> *mut u8 {
        // `wrapping_add` needs no unsafe; `off <= len <= isize::MAX` keeps it in the region.
        self.ptr.0.wrapping_add(off as usize)
    }
}

#[derive(Clone, Copy, Debug)]
enum WindowState {
    /// Allocated, not bound (type 2 after invalidation, type 1 unbound).
    Free,
    /// Bound to `[addr, addr + len)` of the MR at index `mr`.
    Bound {
        mr: u32,
        addr: u64,
        len: u64,
        access: Access,
        /// Type 2: the QP the window is bound to.
        qpn: Option<u32>,
    },
}

#[derive(Debug)]
struct Window {
    pd: PdId,
    ty: MwType,
    state: WindowState,
}

#[derive(Debug)]
enum Object {
    Mr(Region),
    Mw(Window),
}

#[derive(Debug)]
struct Slot {
    key: u8,
    obj: Option<Object>,
}

#[derive(Debug)]
struct Table {
    /// `slots[0]` is never used.
    slots: Vec<Slot>,
    free: VecDeque<u32>,
    max_index: u32,
    /// State of the key byte generator (splitmix64).
    rng: u64,
}

fn key_of(index: u32, key: u8) -> u32 {
    (index << 8) | u32::from(key)
}

impl Table {
    /// A random key byte other than `last` (rxe `rxe_get_next_key`: a slot
    /// never gets the same key byte twice in a row, so the previous key of a
    /// reused or re-registered slot always fails).
    fn next_key_byte(&mut self, last: u8) -> u8 {
        loop {
            // splitmix64 (Steele, Lea, Flood 2014).
            self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.rng;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            let b = (z ^ (z >> 31)) as u8;
            if b != last {
                return b;
            }
        }
    }

    /// The object whose current key is `key`.
    fn get(&self, key: u32) -> Option<&Object> {
        let slot = self.slots.get((key >> 8) as usize)?;
        if key >> 8 == 0 || slot.key != key as u8 {
            return None;
        }
        slot.obj.as_ref()
    }

    fn get_mut(&mut self, key: u32) -> Option<&mut Object> {
        let slot = self.slots.get_mut((key >> 8) as usize)?;
        if key >> 8 == 0 || slot.key != key as u8 {
            return None;
        }
        slot.obj.as_mut()
    }

    fn region_at(&mut self, index: u32) -> Option<&mut Region> {
        match self.slots.get_mut(index as usize)?.obj.as_mut()? {
            Object::Mr(r) => Some(r),
            Object::Mw(_) => None,
        }
    }

    /// Put `obj` into a fresh slot; returns its key.
    fn insert(&mut self, obj: Object) -> Result<u32, RegError> {
        let index = match self.free.pop_front() {
            Some(i) => i,
            None => {
                let next = self.slots.len() as u32;
                if next > self.max_index {
                    return Err(RegError::NoResources);
                }
                self.slots.push(Slot { key: 0, obj: None });
                next
            }
        };
        let key = self.next_key_byte(self.slots[index as usize].key);
        let slot = &mut self.slots[index as usize];
        slot.key = key;
        slot.obj = Some(obj);
        Ok(key_of(index, key))
    }

    /// Put `obj` into the slot `key >> 8` with key byte `key as u8` (see
    /// [`MemoryTable::register_with_key`]); the slot must be free.
    fn insert_at(&mut self, key: u32, obj: Object) -> Result<u32, RegError> {
        let index = key >> 8;
        if index == 0 {
            return Err(RegError::InvalidArgument);
        }
        if index > self.max_index {
            return Err(RegError::NoResources);
        }
        while self.slots.len() as u32 <= index {
            let next = self.slots.len() as u32;
            self.slots.push(Slot { key: 0, obj: None });
            if next != index {
                self.free.push_back(next);
            }
        }
        if self.slots[index as usize].obj.is_some() {
            return Err(RegError::InvalidArgument);
        }
        self.free.retain(|&i| i != index);
        let slot = &mut self.slots[index as usize];
        slot.key = key as u8;
        slot.obj = Some(obj);
        Ok(key)
    }

    fn remove(&mut self, index: u32) {
        if let Some(slot) = self.slots.get_mut(index as usize) {
            if slot.obj.take().is_some() {
                self.free.push_back(index);
            }
        }
    }

    /// Resolve a local key (SGE lkey) to a host pointer for `[addr, addr+len)`.
    fn resolve_local(&self, pd: PdId, lkey: u32, addr: u64, len: u64, needed: Access) -> Result<*mut u8, AccessError> {
        // rxe_mr.c lookup_mr(RXE_LOOKUP_LOCAL): key, PD, access, state; then mr_check_range.
        let r = match self.get(lkey) {
            Some(Object::Mr(r)) => r,
            _ => return Err(AccessError::InvalidKey),
        };
        if r.pd != pd {
            return Err(AccessError::PdMismatch);
        }
        if r.invalidated {
            return Err(AccessError::Invalidated);
        }
        if !r.access.contains(needed) {
            return Err(AccessError::AccessDenied);
        }
        let off = r.offset_of(addr, len)?;
        Ok(r.host(off))
    }

    /// Resolve a remote key (MR rkey or MW rkey) for `[va, va+len)`.
    fn resolve_remote(
        &self,
        pd: PdId,
        qpn: u32,
        rkey: u32,
        va: u64,
        len: u64,
        needed: Access,
    ) -> Result<*mut u8, AccessError> {
        match self.get(rkey) {
            None => Err(AccessError::InvalidKey),
            Some(Object::Mr(r)) => {
                // rxe_mr.c lookup_mr(RXE_LOOKUP_REMOTE) + mr_check_range.
                if r.pd != pd {
                    return Err(AccessError::PdMismatch);
                }
                if r.invalidated {
                    return Err(AccessError::Invalidated);
                }
                if !r.access.contains(needed) {
                    return Err(AccessError::AccessDenied);
                }
                let off = r.offset_of(va, len)?;
                Ok(r.host(off))
            }
            Some(Object::Mw(w)) => {
                // rxe_mw.c rxe_lookup_mw: key, PD, type-2 QP, length, access, state.
                if w.pd != pd {
                    return Err(AccessError::PdMismatch);
                }
                let WindowState::Bound { mr, addr, len: wlen, access, qpn: bound_qp } = w.state else {
                    return Err(AccessError::Invalidated);
                };
                if bound_qp.is_some_and(|q| q != qpn) {
                    return Err(AccessError::WrongQp);
                }
                if !access.contains(needed) {
                    return Err(AccessError::AccessDenied);
                }
                // Window bounds. A ZERO_BASED window is addressed by offset
                // (rxe check_rkey: `resp.offset = mw->addr`).
                let start = if access.contains(Access::ZERO_BASED) {
                    let end = va.checked_add(len).ok_or(AccessError::OutOfBounds)?;
                    if end > wlen {
                        return Err(AccessError::OutOfBounds);
                    }
                    addr.checked_add(va).ok_or(AccessError::OutOfBounds)?
                } else {
                    let end = va.checked_add(len).ok_or(AccessError::OutOfBounds)?;
                    if va < addr || end > addr.saturating_add(wlen) {
                        return Err(AccessError::OutOfBounds);
                    }
                    va
                };
                let r = match self.slots.get(mr as usize).and_then(|s| s.obj.as_ref()) {
                    Some(Object::Mr(r)) => r,
                    // Cannot happen: an MR with bound windows cannot be deregistered.
                    _ => return Err(AccessError::InvalidKey),
                };
                if r.invalidated {
                    return Err(AccessError::Invalidated);
                }
                let off = r.offset_of(start, len)?;
                Ok(r.host(off))
            }
        }
    }

    /// Validate every SGE piece covering `[offset, offset + len)` of the SGE
    /// list's concatenation and call `f(host_ptr, position_in_data, piece_len)`
    /// for each. Nothing is called unless every piece validates.
    fn for_sgl_pieces(
        &self,
        pd: PdId,
        sgl: &[Sge],
        offset: u64,
        len: usize,
        needed: Access,
        mut f: impl FnMut(*mut u8, usize, usize),
    ) -> Result<(), AccessError> {
        let end = offset.checked_add(len as u64).ok_or(AccessError::OutOfBounds)?;
        let total: u64 = sgl.iter().map(|s| u64::from(s.length)).sum();
        if end > total {
            return Err(AccessError::OutOfBounds);
        }
        if len == 0 {
            return Ok(());
        }
        // Pass 1 checks everything, pass 2 moves: no byte moves unless all pieces are valid.
        for pass in 0..2 {
            let mut pos = 0u64; // start of the current SGE in the concatenation
            for s in sgl {
                let slen = u64::from(s.length);
                let (sge_start, sge_end) = (pos, pos + slen);
                pos = sge_end;
                if sge_end <= offset || slen == 0 {
                    continue;
                }
                if sge_start >= end {
                    break;
                }
                let from = offset.max(sge_start);
                let to = end.min(sge_end);
                let within = from - sge_start;
                let addr = s.addr.checked_add(within).ok_or(AccessError::OutOfBounds)?;
                let host = self.resolve_local(pd, s.lkey, addr, to - from, needed)?;
                if pass == 1 {
                    f(host, (from - offset) as usize, (to - from) as usize);
                }
            }
        }
        Ok(())
    }
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

/// The device's registered memory: MRs and MWs, keys, checks and data movement.
#[derive(Debug)]
pub struct MemoryTable {
    inner: RwLock<Table>,
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
        MemoryTable {
            inner: RwLock::new(Table {
                slots: vec![Slot { key: 0, obj: None }],
                free: VecDeque::new(),
                max_index: max.min(MAX_INDEX),
                rng: seed,
            }),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, Table> {
        // Nothing panics while holding the guard; recover from poisoning anyway.
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Table> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
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
    pub unsafe fn register(
        &self,
        pd: PdId,
        addr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MrKeys, RegError> {
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
    pub unsafe fn register_with_key(
        &self,
        pd: PdId,
        addr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
        key: u32,
    ) -> Result<MrKeys, RegError> {
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
    pub unsafe fn reregister(
        &self,
        lkey: u32,
        pd: PdId,
        addr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MrKeys, RegError> {
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

    /// Allocate an unbound memory window of `pd` (`ibv_alloc_mw`); returns its rkey.
    pub fn alloc_mw(&self, pd: PdId, ty: MwType) -> Result<u32, RegError> {
        self.write().insert(Object::Mw(Window { pd, ty, state: WindowState::Free }))
    }

    /// Deallocate the window `rkey` (`ibv_dealloc_mw`), unbinding it first.
    pub fn dealloc_mw(&self, rkey: u32) -> Result<(), RegError> {
        let mut t = self.write();
        let mr = match t.get(rkey) {
            None => return Err(RegError::InvalidKey),
            Some(Object::Mr(_)) => return Err(RegError::InvalidArgument),
            Some(Object::Mw(w)) => match w.state {
                WindowState::Bound { mr, .. } => Some(mr),
                WindowState::Free => None,
            },
        };
        if let Some(r) = mr.and_then(|i| t.region_at(i)) {
            r.bound_windows = r.bound_windows.saturating_sub(1);
        }
        t.remove(rkey >> 8);
        Ok(())
    }

    /// Bind the window `mw_rkey` to `[addr, addr + len)` of the region
    /// `mr_lkey` with the remote rights `access`, giving it the key byte
    /// `new_key`; returns the new rkey. `pd` and `qpn` are the binding QP's
    /// (type-2 windows become bound to `qpn`). A type-1 bind with `len == 0`
    /// unbinds. Rules from rxe_mw.c `rxe_check_bind_mw` (IBTA 10.6.7):
    /// - type 1: no ZERO_BASED (o10-36.2.2); type 2: must be free (o10-37.2.30),
    ///   nonzero length (o10-37.2.40), same PD as the QP (C10-72);
    /// - the MR: same PD, not ZERO_BASED, has MW_BIND (C10-73), has LOCAL_WRITE
    ///   if the window grants REMOTE_WRITE or REMOTE_ATOMIC (C10-74), contains
    ///   the window (C10-75);
    /// - the window grants only remote rights (and ZERO_BASED).
    #[allow(clippy::too_many_arguments)]
    pub fn bind_mw(
        &self,
        pd: PdId,
        qpn: u32,
        mw_rkey: u32,
        new_key: u8,
        mr_lkey: u32,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<u32, AccessError> {
        let mut t = self.write();
        let (ty, old_mr) = match t.get(mw_rkey) {
            Some(Object::Mw(w)) => {
                if w.pd != pd {
                    return Err(AccessError::PdMismatch);
                }
                let old = match w.state {
                    WindowState::Bound { mr, .. } => Some(mr),
                    WindowState::Free => None,
                };
                (w.ty, old)
            }
            _ => return Err(AccessError::InvalidKey),
        };
        if !MW_RIGHTS.contains(access) {
            return Err(AccessError::AccessDenied);
        }
        match ty {
            MwType::Type1 => {
                if access.contains(Access::ZERO_BASED) {
                    return Err(AccessError::AccessDenied);
                }
            }
            MwType::Type2 => {
                if old_mr.is_some() || len == 0 {
                    return Err(AccessError::AccessDenied);
                }
            }
        }
        let new_state = if len == 0 {
            WindowState::Free
        } else {
            let mr_index = mr_lkey >> 8;
            let r = match t.get(mr_lkey) {
                Some(Object::Mr(r)) => r,
                _ => return Err(AccessError::InvalidKey),
            };
            if r.pd != pd {
                return Err(AccessError::PdMismatch);
            }
            if r.invalidated {
                return Err(AccessError::Invalidated);
            }
            if r.access.contains(Access::ZERO_BASED) || !r.access.contains(Access::MW_BIND) {
                return Err(AccessError::AccessDenied);
            }
            if access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC) && !r.access.contains(Access::LOCAL_WRITE) {
                return Err(AccessError::AccessDenied);
            }
            r.offset_of(addr, len)?;
            WindowState::Bound {
                mr: mr_index,
                addr,
                len,
                access,
                qpn: (ty == MwType::Type2).then_some(qpn),
            }
        };
        // All checks passed: commit.
        if let Some(r) = old_mr.and_then(|i| t.region_at(i)) {
            r.bound_windows = r.bound_windows.saturating_sub(1);
        }
        if let WindowState::Bound { mr, .. } = new_state {
            if let Some(r) = t.region_at(mr) {
                r.bound_windows += 1;
            }
        }
        let index = mw_rkey >> 8;
        let slot = &mut t.slots[index as usize];
        if let Some(Object::Mw(w)) = slot.obj.as_mut() {
            w.state = new_state;
        }
        slot.key = new_key;
        Ok(key_of(index, new_key))
    }

    /// Invalidate `rkey` for the QP `qpn` of `pd` (LOCAL_INV).
    /// - A type-2 window goes back to the free state; it must be bound, to
    ///   `qpn`, in `pd`. Type-1 windows cannot be invalidated (o10-37.2.26).
    /// - An MR becomes unusable until re-registered; refused while windows are
    ///   bound to it (rxe `rxe_invalidate_mr`: -EINVAL when `num_mw > 0`).
    pub fn invalidate(&self, pd: PdId, qpn: u32, rkey: u32) -> Result<(), AccessError> {
        self.invalidate_key(pd, qpn, rkey, false)
    }

    /// Invalidate `rkey` for a received SEND with Invalidate, on QP `qpn` of
    /// `pd`. Only a type-2 memory window can be invalidated by the peer
    /// (same rules as [`MemoryTable::invalidate`]); an ordinary registered
    /// MR is refused with [`AccessError::AccessDenied`], which the responder
    /// answers as an invalid request (rxe `invalidate_rkey` →
    /// `rxe_invalidate_mr` accepts only fast-registered MRs,
    /// `IB_MR_TYPE_MEM_REG`, which urnic does not have; IBTA 10.6.6: remote
    /// invalidation applies to windows and fast-registered regions).
    /// Otherwise any peer that learned an rkey could revoke the region.
    pub fn invalidate_remote(&self, pd: PdId, qpn: u32, rkey: u32) -> Result<(), AccessError> {
        self.invalidate_key(pd, qpn, rkey, true)
    }

    fn invalidate_key(&self, pd: PdId, qpn: u32, rkey: u32, remote: bool) -> Result<(), AccessError> {
        let mut t = self.write();
        let mr_to_release = match t.get_mut(rkey) {
            None => return Err(AccessError::InvalidKey),
            Some(Object::Mr(_)) if remote => return Err(AccessError::AccessDenied),
            Some(Object::Mr(r)) => {
                if r.pd != pd {
                    return Err(AccessError::PdMismatch);
                }
                if r.bound_windows > 0 {
                    return Err(AccessError::AccessDenied);
                }
                if r.invalidated {
                    return Err(AccessError::Invalidated);
                }
                r.invalidated = true;
                return Ok(());
            }
            Some(Object::Mw(w)) => {
                if w.pd != pd {
                    return Err(AccessError::PdMismatch);
                }
                if w.ty == MwType::Type1 {
                    return Err(AccessError::AccessDenied);
                }
                match w.state {
                    WindowState::Free => return Err(AccessError::Invalidated),
                    WindowState::Bound { qpn: Some(q), .. } if q != qpn => return Err(AccessError::WrongQp),
                    WindowState::Bound { mr, .. } => {
                        w.state = WindowState::Free;
                        mr
                    }
                }
            }
        };
        if let Some(r) = t.region_at(mr_to_release) {
            r.bound_windows = r.bound_windows.saturating_sub(1);
        }
        Ok(())
    }

    // ---- responder side (remote keys) ----

    /// Check that `[va, va + len)` may be accessed with `needed` through
    /// `rkey` by QP `qpn` of `pd`. Moves nothing.
    pub fn remote_check(&self, pd: PdId, qpn: u32, rkey: u32, va: u64, len: u64, needed: Access) -> Result<(), AccessError> {
        self.read().resolve_remote(pd, qpn, rkey, va, len, needed).map(|_| ())
    }

    /// Write `data` at `va` through `rkey` (needs REMOTE_WRITE). All checks
    /// precede the copy.
    pub fn remote_write(&self, pd: PdId, qpn: u32, rkey: u32, va: u64, data: &[u8]) -> Result<(), AccessError> {
        let t = self.read();
        let dst = t.resolve_remote(pd, qpn, rkey, va, data.len() as u64, Access::REMOTE_WRITE)?;
        // SAFETY: `resolve_remote` checked that `[dst, dst + data.len())` lies in a
        // registered region, which stays valid while we hold the read guard
        // (deregistration takes the write guard). `data` is a Rust slice and
        // cannot overlap registered memory the table only reaches by raw pointer
        // (if a caller passed a slice of the region itself, `copy` below would
        // still be correct: we use the overlap-tolerant copy).
        unsafe { std::ptr::copy(data.as_ptr(), dst, data.len()) };
        Ok(())
    }

    /// Read `out.len()` bytes at `va` through `rkey` (needs REMOTE_READ).
    pub fn remote_read(&self, pd: PdId, qpn: u32, rkey: u32, va: u64, out: &mut [u8]) -> Result<(), AccessError> {
        let t = self.read();
        let src = t.resolve_remote(pd, qpn, rkey, va, out.len() as u64, Access::REMOTE_READ)?;
        // SAFETY: `[src, src + out.len())` is inside a registered region kept
        // valid by the read guard; `copy` tolerates overlap.
        unsafe { std::ptr::copy(src, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// [`remote_read`](Self::remote_read) that also continues `crc` (a
    /// finished CRC-32) over the bytes read, in the same pass; returns it.
    pub fn remote_read_crc(&self, pd: PdId, qpn: u32, rkey: u32, va: u64, out: &mut [u8], crc: u32) -> Result<u32, AccessError> {
        let t = self.read();
        let src = t.resolve_remote(pd, qpn, rkey, va, out.len() as u64, Access::REMOTE_READ)?;
        // SAFETY: `[src, src + out.len())` is inside a registered region kept
        // valid by the read guard, reached only by raw pointer, so it is not
        // the exclusive `out`.
        Ok(unsafe { crc::copy_update_raw(crc, src, out) })
    }

    /// Execute `op` on the 8 bytes at `va` through `rkey` (needs
    /// REMOTE_ATOMIC, 8-byte alignment); returns the original value. Atomic
    /// against every other user of this table.
    pub fn remote_atomic(&self, pd: PdId, qpn: u32, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, AccessError> {
        let t = self.read();
        let p = t.resolve_remote(pd, qpn, rkey, va, 8, Access::REMOTE_ATOMIC)?;
        // IBTA 9.4.5: atomic targets are naturally aligned; rxe also checks the
        // host address (`(uintptr_t)vaddr & 7` in atomic_reply).
        if va & 7 != 0 || (p as usize) & 7 != 0 {
            return Err(AccessError::Misaligned);
        }
        // SAFETY: `p` is 8-byte aligned and `[p, p + 8)` lies in a registered
        // region that stays valid for reads and writes while we hold the read
        // guard; `AtomicU64` has the size and alignment of `u64`. All accesses
        // this table makes to the bytes concurrently are either atomic (here)
        // or DMA-like copies the ibverbs rules forbid to overlap with an atomic.
        let cell = unsafe { AtomicU64::from_ptr(p.cast::<u64>()) };
        Ok(match op {
            AtomicOp::CmpSwap { compare, swap } => {
                match cell.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(v) | Err(v) => v,
                }
            }
            AtomicOp::FetchAdd { add } => cell.fetch_add(add, Ordering::SeqCst),
        })
    }

    // ---- local side (lkeys in SGE lists) ----

    /// Check every SGE of `sgl` (lkey, PD, bounds, `needed` rights).
    /// Zero-length SGEs are skipped.
    pub fn local_check(&self, pd: PdId, sgl: &[Sge], needed: Access) -> Result<(), AccessError> {
        let t = self.read();
        for s in sgl.iter().filter(|s| s.length != 0) {
            t.resolve_local(pd, s.lkey, s.addr, u64::from(s.length), needed)?;
        }
        Ok(())
    }

    /// Copy `out.len()` bytes starting at byte `offset` of the SGE list's
    /// concatenation into `out`. Fails (moving nothing) if the range exceeds
    /// the list or any covered SGE is invalid.
    pub fn local_gather(&self, pd: PdId, sgl: &[Sge], offset: u64, out: &mut [u8]) -> Result<(), AccessError> {
        let t = self.read();
        let out_ptr = out.as_mut_ptr();
        t.for_sgl_pieces(pd, sgl, offset, out.len(), Access::empty(), |src, at, n| {
            // SAFETY: `src..src+n` was validated inside a registered region kept
            // alive by the read guard; `at + n <= out.len()` by construction
            // of the pieces; `copy` tolerates overlap.
            unsafe { std::ptr::copy(src, out_ptr.add(at), n) };
        })
    }

    /// [`local_gather`](Self::local_gather) that also continues `crc` (a
    /// finished CRC-32) over the bytes gathered, in the same pass
    /// ([`crc::copy_update_raw`]); returns the continued CRC.
    pub fn local_gather_crc(&self, pd: PdId, sgl: &[Sge], offset: u64, out: &mut [u8], crc: u32) -> Result<u32, AccessError> {
        let t = self.read();
        let mut crc = crc;
        t.for_sgl_pieces(pd, sgl, offset, out.len(), Access::empty(), |src, at, n| {
            // SAFETY: `src..src+n` was validated inside a registered region kept
            // alive by the read guard; `at + n <= out.len()` by construction of
            // the pieces. Registered memory is reached only by raw pointer and
            // cannot be the exclusive `out`.
            crc = unsafe { crc::copy_update_raw(crc, src, &mut out[at..at + n]) };
        })?;
        Ok(crc)
    }

    /// Copy `data` to byte `offset` of the SGE list's concatenation (needs
    /// LOCAL_WRITE). Fails (moving nothing) if the range exceeds the list or
    /// any covered SGE is invalid.
    pub fn local_scatter(&self, pd: PdId, sgl: &[Sge], offset: u64, data: &[u8]) -> Result<(), AccessError> {
        let t = self.read();
        let src = data.as_ptr();
        t.for_sgl_pieces(pd, sgl, offset, data.len(), Access::LOCAL_WRITE, |dst, at, n| {
            // SAFETY: `dst..dst+n` was validated inside a registered region kept
            // alive by the read guard; `at + n <= data.len()`; `copy` tolerates overlap.
            unsafe { std::ptr::copy(src.add(at), dst, n) };
        })
    }
}

/// Total length of an SGE list in bytes.
pub fn sgl_len(sgl: &[Sge]) -> u64 {
    sgl.iter().map(|s| u64::from(s.length)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const PD: PdId = PdId(1);
    const OTHER_PD: PdId = PdId(2);
    const ALL: Access = Access::LOCAL_WRITE
        .union(Access::REMOTE_WRITE)
        .union(Access::REMOTE_READ)
        .union(Access::REMOTE_ATOMIC)
        .union(Access::MW_BIND);

    /// Heap memory for a test region, 8-byte aligned.
    struct Buf(Vec<u64>);

    impl Buf {
        fn new(len: usize) -> Buf {
            Buf(vec![0u64; len.div_ceil(8)])
        }
        fn ptr(&mut self) -> *mut u8 {
            self.0.as_mut_ptr().cast()
        }
        fn bytes(&self) -> Vec<u8> {
            self.0.iter().flat_map(|w| w.to_ne_bytes()).collect()
        }
    }

    fn reg(t: &MemoryTable, buf: &mut Buf, iova: u64, access: Access) -> MrKeys {
        let len = buf.0.len() * 8;
        // SAFETY: every test keeps `buf` alive past the table's last use of it.
        unsafe { t.register(PD, buf.ptr(), len, iova, access) }.unwrap()
    }

    #[test]
    fn keys_follow_ibverbs_convention() {
        let t = MemoryTable::new();
        let mut b1 = Buf::new(64);
        let mut b2 = Buf::new(64);
        let k1 = reg(&t, &mut b1, 0x1000, ALL);
        let k2 = reg(&t, &mut b2, 0x2000, ALL);
        assert_eq!(k1.lkey, k1.rkey);
        assert_ne!(k1.lkey >> 8, 0, "index 0 is never used");
        assert_ne!(k1.lkey >> 8, k2.lkey >> 8);
        let mw = t.alloc_mw(PD, MwType::Type1).unwrap();
        assert_ne!(mw >> 8, k1.lkey >> 8);
        assert_ne!(mw >> 8, k2.lkey >> 8);
        // A key with the right index and a wrong key byte is refused.
        let wrong = (k1.rkey & !0xff) | ((k1.rkey as u8).wrapping_add(1) as u32);
        assert_eq!(t.remote_check(PD, 1, wrong, 0x1000, 8, Access::REMOTE_READ), Err(AccessError::InvalidKey));
        assert_eq!(t.remote_check(PD, 1, 0, 0x1000, 8, Access::REMOTE_READ), Err(AccessError::InvalidKey));
        assert_eq!(t.remote_check(PD, 1, 0xffff_ff00, 0, 0, Access::empty()), Err(AccessError::InvalidKey));
    }

    #[test]
    fn registration_arguments_are_checked() {
        let t = MemoryTable::new();
        let mut b = Buf::new(16);
        // SAFETY: invalid arguments are refused before anything is stored.
        unsafe {
            assert_eq!(t.register(PD, std::ptr::null_mut(), 16, 0, ALL), Err(RegError::InvalidArgument));
            assert_eq!(t.register(PD, b.ptr(), 16, u64::MAX - 4, ALL), Err(RegError::InvalidArgument));
            assert_eq!(t.register(PD, b.ptr(), 16, 0, Access::REMOTE_WRITE), Err(RegError::InvalidArgument));
            assert_eq!(t.register(PD, b.ptr(), 16, 0, Access::REMOTE_ATOMIC), Err(RegError::InvalidArgument));
            // ZERO_BASED ignores the IOVA, so a huge IOVA is fine.
            assert!(t.register(PD, b.ptr(), 16, u64::MAX - 4, Access::ZERO_BASED | Access::REMOTE_READ).is_ok());
        }
        let small = MemoryTable::with_max_entries(2);
        reg(&small, &mut b, 0, ALL);
        small.alloc_mw(PD, MwType::Type1).unwrap();
        assert_eq!(small.alloc_mw(PD, MwType::Type1), Err(RegError::NoResources));
    }

    #[test]
    fn remote_write_read_and_bounds() {
        let t = MemoryTable::new();
        let mut b = Buf::new(64);
        let k = reg(&t, &mut b, 0x10_000, ALL);
        t.remote_write(PD, 1, k.rkey, 0x10_008, b"hello").unwrap();
        let mut out = [0u8; 5];
        t.remote_read(PD, 1, k.rkey, 0x10_008, &mut out).unwrap();
        assert_eq!(&out, b"hello");
        assert_eq!(&b.bytes()[8..13], b"hello");
        // Last byte in, one past out.
        t.remote_write(PD, 1, k.rkey, 0x10_03f, b"z").unwrap();
        assert_eq!(t.remote_write(PD, 1, k.rkey, 0x10_03f, b"zz"), Err(AccessError::OutOfBounds));
        assert_eq!(t.remote_write(PD, 1, k.rkey, 0xffff, b"z"), Err(AccessError::OutOfBounds));
        assert_eq!(t.remote_check(PD, 1, k.rkey, 0x10_040, 1, Access::REMOTE_READ), Err(AccessError::OutOfBounds));
        assert_eq!(t.remote_check(PD, 1, k.rkey, 0x10_040, 0, Access::REMOTE_READ), Ok(()));
        assert_eq!(t.remote_check(PD, 1, k.rkey, 0x10_000, 64, Access::REMOTE_READ), Ok(()));
        assert_eq!(t.remote_check(PD, 1, k.rkey, 0x10_000, 65, Access::REMOTE_READ), Err(AccessError::OutOfBounds));
    }

    #[test]
    fn bounds_arithmetic_never_overflows() {
        let t = MemoryTable::new();
        let mut b = Buf::new(64);
        // The highest region possible: [2^64 - 65, 2^64 - 1).
        let k = reg(&t, &mut b, u64::MAX - 64, ALL);
        assert_eq!(t.remote_check(PD, 1, k.rkey, u64::MAX - 64, 64, Access::REMOTE_READ), Ok(()));
        assert_eq!(t.remote_check(PD, 1, k.rkey, u64::MAX - 1, 1, Access::REMOTE_READ), Ok(()));
        assert_eq!(t.remote_check(PD, 1, k.rkey, u64::MAX - 1, 2, Access::REMOTE_READ), Err(AccessError::OutOfBounds));
        assert_eq!(t.remote_check(PD, 1, k.rkey, u64::MAX, 1, Access::REMOTE_READ), Err(AccessError::OutOfBounds));
        assert_eq!(t.remote_check(PD, 1, k.rkey, u64::MAX - 64, u64::MAX, Access::REMOTE_READ), Err(AccessError::OutOfBounds));
        assert_eq!(t.remote_check(PD, 1, k.rkey, 0, u64::MAX, Access::REMOTE_READ), Err(AccessError::OutOfBounds));
        let sgl = [Sge { addr: u64::MAX - 8, length: 16, lkey: k.lkey }];
        assert_eq!(t.local_scatter(PD, &sgl, 0, &[1; 16]), Err(AccessError::OutOfBounds));
        assert_eq!(t.local_gather(PD, &sgl, u64::MAX, &mut [0; 2]), Err(AccessError::OutOfBounds));
        assert!(b.bytes().iter().all(|&x| x == 0));
    }

    #[test]
    fn pd_and_access_flags_are_enforced() {
        let t = MemoryTable::new();
        let mut b = Buf::new(64);
        let ro = reg(&t, &mut b, 0, Access::REMOTE_READ);
        assert_eq!(t.remote_write(PD, 1, ro.rkey, 0, b"x"), Err(AccessError::AccessDenied));
        assert_eq!(t.remote_atomic(PD, 1, ro.rkey, 0, AtomicOp::FetchAdd { add: 1 }), Err(AccessError::AccessDenied));
        assert_eq!(t.remote_read(OTHER_PD, 1, ro.rkey, 0, &mut [0; 1]), Err(AccessError::PdMismatch));
        // Local scatter needs LOCAL_WRITE, gather does not.
        let sgl = [Sge { addr: 0, length: 8, lkey: ro.lkey }];
        assert_eq!(t.local_scatter(PD, &sgl, 0, &[1; 8]), Err(AccessError::AccessDenied));
        t.local_gather(PD, &sgl, 0, &mut [0; 8]).unwrap();
        assert_eq!(t.local_check(PD, &sgl, Access::LOCAL_WRITE), Err(AccessError::AccessDenied));
        assert_eq!(t.local_check(OTHER_PD, &sgl, Access::empty()), Err(AccessError::PdMismatch));
        let wr = reg(&t, &mut b, 0, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        assert_eq!(t.remote_read(PD, 1, wr.rkey, 0, &mut [0; 1]), Err(AccessError::AccessDenied));
        t.remote_write(PD, 1, wr.rkey, 0, b"x").unwrap();
        assert_eq!(b.bytes()[0], b'x');
    }

    #[test]
    fn zero_based_regions_use_offsets() {
        let t = MemoryTable::new();
        let mut b = Buf::new(32);
        let k = reg(&t, &mut b, 0xdead_0000, ALL | Access::ZERO_BASED);
        t.remote_write(PD, 1, k.rkey, 4, b"abcd").unwrap();
        assert_eq!(&b.bytes()[4..8], b"abcd");
        assert_eq!(t.remote_check(PD, 1, k.rkey, 0xdead_0000, 1, Access::REMOTE_READ), Err(AccessError::OutOfBounds));
        let sgl = [Sge { addr: 30, length: 2, lkey: k.lkey }];
        t.local_scatter(PD, &sgl, 0, b"yz").unwrap();
        assert_eq!(&b.bytes()[30..32], b"yz");
    }

    #[test]
    fn sge_lists_scatter_and_gather_across_elements() {
        let t = MemoryTable::new();
        let mut b = Buf::new(64);
        let k = reg(&t, &mut b, 0x1000, ALL);
        let sgl = [
            Sge { addr: 0x1000, length: 3, lkey: k.lkey },
            Sge { addr: 0x1000, length: 0, lkey: 0xbad }, // zero-length: ignored
            Sge { addr: 0x1020, length: 4, lkey: k.lkey },
            Sge { addr: 0x1030, length: 2, lkey: k.lkey },
        ];
        assert_eq!(sgl_len(&sgl), 9);
        t.local_scatter(PD, &sgl, 0, b"abcdefghi").unwrap();
        let bytes = b.bytes();
        assert_eq!(&bytes[0..3], b"abc");
        assert_eq!(&bytes[0x20..0x24], b"defg");
        assert_eq!(&bytes[0x30..0x32], b"hi");
        let mut out = [0u8; 5];
        t.local_gather(PD, &sgl, 2, &mut out).unwrap();
        assert_eq!(&out, b"cdefg");
        // Running offsets: scatter the next piece at offset 7.
        t.local_scatter(PD, &sgl, 7, b"XY").unwrap();
        assert_eq!(&b.bytes()[0x30..0x32], b"XY");
        // Past the end: refused, nothing written.
        assert_eq!(t.local_scatter(PD, &sgl, 8, b"12"), Err(AccessError::OutOfBounds));
        assert_eq!(&b.bytes()[0x31..0x32], b"Y");
        // A bad SGE after good ones: refused before the good ones are written.
        let bad = [Sge { addr: 0x1000, length: 4, lkey: k.lkey }, Sge { addr: 0x1000, length: 4, lkey: k.lkey ^ 1 }];
        assert_eq!(t.local_scatter(PD, &bad, 0, b"12345678"), Err(AccessError::InvalidKey));
        assert_eq!(&b.bytes()[0..3], b"abc");
        assert_eq!(t.local_check(PD, &bad, Access::empty()), Err(AccessError::InvalidKey));
    }

    #[test]
    fn reregister_and_deregister_make_old_keys_stale() {
        let t = MemoryTable::new();
        let mut b = Buf::new(64);
        let k1 = reg(&t, &mut b, 0x1000, ALL);
        // SAFETY: `b` outlives the table's use.
        let k2 = unsafe { t.reregister(k1.lkey, PD, b.ptr(), 64, 0x2000, ALL) }.unwrap();
        assert_eq!(k1.lkey >> 8, k2.lkey >> 8, "re-registration keeps the index");
        assert_ne!(k1.lkey, k2.lkey, "and changes the key byte");
        assert_eq!(t.remote_write(PD, 1, k1.rkey, 0x1000, b"x"), Err(AccessError::InvalidKey));
        t.remote_write(PD, 1, k2.rkey, 0x2000, b"x").unwrap();
        assert_eq!(t.deregister(k1.lkey), Err(RegError::InvalidKey));
        t.deregister(k2.lkey).unwrap();
        assert_eq!(t.remote_write(PD, 1, k2.rkey, 0x2000, b"y"), Err(AccessError::InvalidKey));
        assert_eq!(t.deregister(k2.lkey), Err(RegError::InvalidKey));
        // The index is reused with another key byte.
        let k3 = reg(&t, &mut b, 0x2000, ALL);
        assert_ne!(k3.lkey, k2.lkey);
        assert_eq!(t.remote_write(PD, 1, k2.rkey, 0x2000, b"y"), Err(AccessError::InvalidKey));
        assert_eq!(b.bytes()[0], b'x');
        // Kind mismatches.
        let mw = t.alloc_mw(PD, MwType::Type1).unwrap();
        assert_eq!(t.deregister(mw), Err(RegError::InvalidArgument));
        assert_eq!(t.dealloc_mw(k3.lkey), Err(RegError::InvalidArgument));
    }

    #[test]
    fn atomics_check_alignment_and_return_original() {
        let t = MemoryTable::new();
        let mut b = Buf::new(32);
        let k = reg(&t, &mut b, 0x1000, ALL);
        assert_eq!(t.remote_atomic(PD, 1, k.rkey, 0x1004, AtomicOp::FetchAdd { add: 1 }), Err(AccessError::Misaligned));
        assert_eq!(t.remote_atomic(PD, 1, k.rkey, 0x1020, AtomicOp::FetchAdd { add: 1 }), Err(AccessError::OutOfBounds));
        assert_eq!(t.remote_atomic(PD, 1, k.rkey, 0x1008, AtomicOp::FetchAdd { add: 5 }), Ok(0));
        assert_eq!(t.remote_atomic(PD, 1, k.rkey, 0x1008, AtomicOp::FetchAdd { add: u64::MAX }), Ok(5));
        assert_eq!(b.0[1], 4, "fetch-add wraps");
        assert_eq!(t.remote_atomic(PD, 1, k.rkey, 0x1008, AtomicOp::CmpSwap { compare: 3, swap: 9 }), Ok(4));
        assert_eq!(b.0[1], 4, "compare failed: unchanged");
        assert_eq!(t.remote_atomic(PD, 1, k.rkey, 0x1008, AtomicOp::CmpSwap { compare: 4, swap: 9 }), Ok(4));
        assert_eq!(b.0[1], 9);
        // An aligned VA over a misaligned host address is refused too.
        let mut raw = Buf::new(32);
        // SAFETY: `raw` outlives the table's use.
        let k2 = unsafe { t.register(PD, raw.ptr().add(4), 16, 0x8000, ALL) }.unwrap();
        assert_eq!(t.remote_atomic(PD, 1, k2.rkey, 0x8000, AtomicOp::FetchAdd { add: 1 }), Err(AccessError::Misaligned));
        assert!(raw.bytes().iter().all(|&x| x == 0));
    }

    #[test]
    fn concurrent_atomics_from_two_threads_sum_exactly() {
        let t = Arc::new(MemoryTable::new());
        let mut b = Buf::new(8);
        let k = reg(&t, &mut b, 0x1000, ALL);
        const N: u64 = 50_000;
        let threads: Vec<_> = (0..2)
            .map(|i| {
                let t = Arc::clone(&t);
                std::thread::spawn(move || {
                    for _ in 0..N {
                        t.remote_atomic(PD, i, k.rkey, 0x1000, AtomicOp::FetchAdd { add: 1 }).unwrap();
                    }
                    // A CAS loop on top: exact increments too.
                    for _ in 0..N {
                        loop {
                            let mut cur = [0u8; 8];
                            t.remote_read(PD, i, k.rkey, 0x1000, &mut cur).unwrap();
                            let cur = u64::from_ne_bytes(cur);
                            let op = AtomicOp::CmpSwap { compare: cur, swap: cur + 1 };
                            if t.remote_atomic(PD, i, k.rkey, 0x1000, op).unwrap() == cur {
                                break;
                            }
                        }
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        assert_eq!(b.0[0], 4 * N);
    }

    #[test]
    fn deregistration_waits_for_an_in_flight_mover() {
        let t = Arc::new(MemoryTable::new());
        let mut b = Buf::new(64);
        let k = reg(&t, &mut b, 0x1000, ALL);
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        // A mover holding the read guard, as `remote_write` does while copying.
        let t2 = Arc::clone(&t);
        let mover = std::thread::spawn(move || {
            let guard = t2.read();
            assert!(guard.resolve_remote(PD, 1, k.rkey, 0x1000, 8, Access::REMOTE_WRITE).is_ok());
            held_tx.send(()).unwrap();
            release_rx.recv().unwrap();
            drop(guard);
        });
        held_rx.recv().unwrap();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (t3, done2) = (Arc::clone(&t), Arc::clone(&done));
        let dereg = std::thread::spawn(move || {
            t3.deregister(k.lkey).unwrap();
            done2.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!done.load(Ordering::SeqCst), "deregister returned while a mover held the region");
        release_tx.send(()).unwrap();
        mover.join().unwrap();
        dereg.join().unwrap();
        assert!(done.load(Ordering::SeqCst));
        assert_eq!(t.remote_write(PD, 1, k.rkey, 0x1000, b"x"), Err(AccessError::InvalidKey));
    }

    #[test]
    fn type1_window_bind_use_rebind_and_rules() {
        let t = MemoryTable::new();
        let mut b = Buf::new(256);
        let mr = reg(&t, &mut b, 0x1000, ALL);
        let mw = t.alloc_mw(PD, MwType::Type1).unwrap();
        // Unbound: no access.
        assert_eq!(t.remote_check(PD, 1, mw, 0x1000, 1, Access::REMOTE_READ), Err(AccessError::Invalidated));
        let k1 = (mw as u8).wrapping_add(1);
        let r1 = t.bind_mw(PD, 0, mw, k1, mr.lkey, 0x1010, 0x20, Access::REMOTE_READ | Access::REMOTE_WRITE).unwrap();
        assert_eq!(r1 >> 8, mw >> 8);
        assert_eq!(r1 as u8, k1);
        assert_eq!(t.remote_check(PD, 1, mw, 0x1010, 1, Access::REMOTE_READ), Err(AccessError::InvalidKey), "old key stale");
        t.remote_write(PD, 9, r1, 0x1010, b"win").unwrap(); // type 1: any QP of the PD
        assert_eq!(&b.bytes()[0x10..0x13], b"win");
        assert_eq!(t.remote_write(PD, 9, r1, 0x100f, b"w"), Err(AccessError::OutOfBounds));
        assert_eq!(t.remote_write(PD, 9, r1, 0x102f, b"ww"), Err(AccessError::OutOfBounds));
        assert_eq!(t.remote_atomic(PD, 9, r1, 0x1010, AtomicOp::FetchAdd { add: 1 }), Err(AccessError::AccessDenied));
        assert_eq!(t.remote_check(OTHER_PD, 9, r1, 0x1010, 1, Access::REMOTE_READ), Err(AccessError::PdMismatch));
        // Deregistration refused while bound; invalidating the MR too.
        assert_eq!(t.deregister(mr.lkey), Err(RegError::Busy));
        // SAFETY: refused, nothing changes.
        assert_eq!(unsafe { t.reregister(mr.lkey, PD, b.ptr(), 256, 0x1000, ALL) }, Err(RegError::Busy));
        assert_eq!(t.invalidate(PD, 1, mr.rkey), Err(AccessError::AccessDenied));
        // Type 1 windows cannot be invalidated (o10-37.2.26).
        assert_eq!(t.invalidate(PD, 1, r1), Err(AccessError::AccessDenied));
        // Rebind moves the window; the previous rkey is stale.
        let r2 = t.bind_mw(PD, 0, r1, k1.wrapping_add(1), mr.lkey, 0x1080, 0x10, Access::REMOTE_READ).unwrap();
        assert_eq!(t.remote_check(PD, 1, r1, 0x1010, 1, Access::REMOTE_READ), Err(AccessError::InvalidKey));
        assert_eq!(t.remote_check(PD, 1, r2, 0x1080, 0x10, Access::REMOTE_READ), Ok(()));
        // Bind with length 0 unbinds; then the MR can go.
        let r3 = t.bind_mw(PD, 0, r2, k1.wrapping_add(2), 0, 0, 0, Access::empty()).unwrap();
        assert_eq!(t.remote_check(PD, 1, r3, 0x1080, 1, Access::REMOTE_READ), Err(AccessError::Invalidated));
        t.deregister(mr.lkey).unwrap();
        t.dealloc_mw(r3).unwrap();
        assert_eq!(t.dealloc_mw(r3), Err(RegError::InvalidKey));
    }

    #[test]
    fn bind_checks_mr_rights_and_range() {
        let t = MemoryTable::new();
        let mut b = Buf::new(256);
        let mr = reg(&t, &mut b, 0x1000, ALL);
        let no_bind = reg(&t, &mut b, 0x1000, ALL - Access::MW_BIND);
        let ro_bind = reg(&t, &mut b, 0x1000, Access::REMOTE_READ | Access::MW_BIND);
        let zb = reg(&t, &mut b, 0x1000, ALL | Access::ZERO_BASED);
        let mw = t.alloc_mw(PD, MwType::Type1).unwrap();
        let rr = Access::REMOTE_READ;
        let bind = |mr: u32, addr, len, acc| t.bind_mw(PD, 0, mw, 7, mr, addr, len, acc);
        assert_eq!(bind(no_bind.lkey, 0x1000, 8, rr), Err(AccessError::AccessDenied)); // C10-73
        assert_eq!(bind(ro_bind.lkey, 0x1000, 8, Access::REMOTE_WRITE), Err(AccessError::AccessDenied)); // C10-74
        assert_eq!(bind(ro_bind.lkey, 0x1000, 8, Access::REMOTE_ATOMIC), Err(AccessError::AccessDenied)); // C10-74
        assert_eq!(bind(zb.lkey, 0, 8, rr), Err(AccessError::AccessDenied)); // no windows on ZB MRs (rxe)
        assert_eq!(bind(mr.lkey, 0x1000, 8, rr | Access::ZERO_BASED), Err(AccessError::AccessDenied)); // o10-36.2.2
        assert_eq!(bind(mr.lkey, 0x1000, 8, rr | Access::LOCAL_WRITE), Err(AccessError::AccessDenied));
        assert_eq!(bind(mr.lkey, 0x0fff, 8, rr), Err(AccessError::OutOfBounds)); // C10-75
        assert_eq!(bind(mr.lkey, 0x10f9, 8, rr), Err(AccessError::OutOfBounds));
        assert_eq!(bind(mr.lkey, u64::MAX, 8, rr), Err(AccessError::OutOfBounds));
        assert_eq!(bind(mr.lkey ^ 0x80, 0x1000, 8, rr), Err(AccessError::InvalidKey));
        assert_eq!(bind(mw, 0x1000, 8, rr), Err(AccessError::InvalidKey));
        assert_eq!(t.bind_mw(OTHER_PD, 0, mw, 7, mr.lkey, 0x1000, 8, rr), Err(AccessError::PdMismatch));
        let other_mr = {
            let len = b.0.len() * 8;
            // SAFETY: `b` outlives the table's use.
            unsafe { t.register(OTHER_PD, b.ptr(), len, 0x1000, ALL) }.unwrap()
        };
        assert_eq!(bind(other_mr.lkey, 0x1000, 8, rr), Err(AccessError::PdMismatch));
        // Every failure left the window unbound with its key.
        assert_eq!(t.remote_check(PD, 1, mw, 0x1000, 1, rr), Err(AccessError::Invalidated));
        // Remote write through a window on an MR without REMOTE_WRITE but with LOCAL_WRITE works.
        let lw = reg(&t, &mut b, 0x1000, Access::LOCAL_WRITE | Access::MW_BIND);
        let r = bind(lw.lkey, 0x1000, 16, Access::REMOTE_WRITE).unwrap();
        t.remote_write(PD, 1, r, 0x1008, b"ok").unwrap();
        assert_eq!(&b.bytes()[8..10], b"ok");
        assert_eq!(t.remote_write(PD, 1, lw.rkey, 0x1008, b"no"), Err(AccessError::AccessDenied));
    }

    #[test]
    fn type2_window_is_tied_to_its_qp_and_invalidated() {
        let t = MemoryTable::new();
        let mut b = Buf::new(128);
        let mr = reg(&t, &mut b, 0x1000, ALL);
        let mw = t.alloc_mw(PD, MwType::Type2).unwrap();
        // Zero length bind of a type 2 window is refused (o10-37.2.40).
        assert_eq!(t.bind_mw(PD, 5, mw, 1, mr.lkey, 0x1000, 0, Access::REMOTE_READ), Err(AccessError::AccessDenied));
        let acc = Access::REMOTE_READ | Access::REMOTE_WRITE | Access::ZERO_BASED;
        let r = t.bind_mw(PD, 5, mw, 0x42, mr.lkey, 0x1020, 0x20, acc).unwrap();
        assert_eq!(r, (mw & !0xff) | 0x42);
        // Zero-based window: offsets from the window start.
        t.remote_write(PD, 5, r, 0, b"zb").unwrap();
        assert_eq!(&b.bytes()[0x20..0x22], b"zb");
        assert_eq!(t.remote_check(PD, 5, r, 0x1f, 2, Access::REMOTE_READ), Err(AccessError::OutOfBounds));
        assert_eq!(t.remote_check(PD, 5, r, 0x1f, 1, Access::REMOTE_READ), Ok(()));
        // Another QP of the same PD may not use it.
        assert_eq!(t.remote_write(PD, 6, r, 0, b"xx"), Err(AccessError::WrongQp));
        assert_eq!(&b.bytes()[0x20..0x22], b"zb");
        // A bound type 2 window cannot be re-bound (o10-37.2.30).
        assert_eq!(t.bind_mw(PD, 5, r, 0x43, mr.lkey, 0x1000, 8, Access::REMOTE_READ), Err(AccessError::AccessDenied));
        assert_eq!(t.deregister(mr.lkey), Err(RegError::Busy));
        // Invalidation: only by the bound QP, in the PD, with the current key.
        assert_eq!(t.invalidate(PD, 6, r), Err(AccessError::WrongQp));
        assert_eq!(t.invalidate(OTHER_PD, 5, r), Err(AccessError::PdMismatch));
        assert_eq!(t.invalidate(PD, 5, mw), Err(AccessError::InvalidKey));
        t.invalidate(PD, 5, r).unwrap();
        assert_eq!(t.invalidate(PD, 5, r), Err(AccessError::Invalidated));
        assert_eq!(t.remote_write(PD, 5, r, 0, b"no"), Err(AccessError::Invalidated));
        // Free again: can be bound with a new key (old one stale), MR can then be deregistered
        // once the window is deallocated.
        let r2 = t.bind_mw(PD, 5, r, 0x44, mr.lkey, 0x1000, 8, Access::REMOTE_READ).unwrap();
        assert_eq!(t.remote_check(PD, 5, r, 0x1000, 1, Access::REMOTE_READ), Err(AccessError::InvalidKey));
        assert_eq!(t.remote_check(PD, 5, r2, 0x1000, 8, Access::REMOTE_READ), Ok(()));
        t.dealloc_mw(r2).unwrap();
        t.deregister(mr.lkey).unwrap();
    }

    #[test]
    fn mr_invalidation_until_reregistration() {
        let t = MemoryTable::new();
        let mut b = Buf::new(64);
        let k = reg(&t, &mut b, 0x1000, ALL);
        assert_eq!(t.invalidate(OTHER_PD, 1, k.rkey), Err(AccessError::PdMismatch));
        t.invalidate(PD, 1, k.rkey).unwrap();
        assert_eq!(t.remote_write(PD, 1, k.rkey, 0x1000, b"x"), Err(AccessError::Invalidated));
        let sgl = [Sge { addr: 0x1000, length: 1, lkey: k.lkey }];
        assert_eq!(t.local_scatter(PD, &sgl, 0, b"x"), Err(AccessError::Invalidated));
        assert_eq!(t.invalidate(PD, 1, k.rkey), Err(AccessError::Invalidated));
        // SAFETY: `b` outlives the table's use.
        let k2 = unsafe { t.reregister(k.lkey, PD, b.ptr(), 64, 0x1000, ALL) }.unwrap();
        t.remote_write(PD, 1, k2.rkey, 0x1000, b"x").unwrap();
        assert_eq!(b.bytes()[0], b'x');
    }

    #[test]
    fn table_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<MemoryTable>();
    }

    #[test]
    fn register_with_a_chosen_key() {
        let t = MemoryTable::new();
        let mut b1 = Buf::new(64);
        let mut b2 = Buf::new(64);
        let mut b3 = Buf::new(64);
        // SAFETY: the buffers outlive the table's use of them.
        let k = unsafe { t.register_with_key(PD, b1.ptr(), 64, 0x5000, ALL, 0x3ea) }.unwrap();
        assert_eq!((k.lkey, k.rkey), (0x3ea, 0x3ea));
        t.remote_write(PD, 1, 0x3ea, 0x5008, &[7; 8]).unwrap();
        assert_eq!(b1.bytes()[8..16], [7; 8]);
        // The index is taken: refused, whatever the key byte.
        // SAFETY: as above.
        assert_eq!(unsafe { t.register_with_key(PD, b2.ptr(), 64, 0, ALL, 0x311) }, Err(RegError::InvalidArgument));
        // SAFETY: as above.
        assert_eq!(unsafe { t.register_with_key(PD, b2.ptr(), 64, 0, ALL, 0x0ff) }, Err(RegError::InvalidArgument), "index 0");
        // Indices skipped on the way stay available to plain registration.
        let a = reg(&t, &mut b2, 0, ALL);
        let b = reg(&t, &mut b3, 0, ALL);
        assert_eq!([a.lkey >> 8, b.lkey >> 8], [1, 2]);
        t.deregister(0x3ea).unwrap();
        assert_eq!(t.remote_write(PD, 1, 0x3ea, 0x5008, &[7; 8]), Err(AccessError::InvalidKey));
    }
}
