//! Memory regions (rxe_mr.c): where a registered range lives, its address
//! space (IOVA or ZERO_BASED), its rights, and how many windows are bound
//! into it.

use super::AccessError;
use crate::transport::ids::{Access, PdId};

/// Start of registered memory.
#[derive(Clone, Copy, Debug)]
pub(super) struct RegionPtr(pub(super) *mut u8);

// SAFETY: the caller of `MemoryTable::register` promised that the memory stays
// valid for reads and writes (from any thread) until `deregister` returns; the
// pointer is only dereferenced under the table's read guard, which
// `deregister` waits for.
unsafe impl Send for RegionPtr {}
// SAFETY: as above; the table never hands out references into the region.
unsafe impl Sync for RegionPtr {}

#[derive(Debug)]
pub(super) struct Region {
    pub(super) pd: PdId,
    pub(super) ptr: RegionPtr,
    pub(super) len: u64,
    pub(super) iova: u64,
    pub(super) access: Access,
    /// Memory windows bound into this region.
    pub(super) bound_windows: u32,
    /// Invalidated (LOCAL_INV / SEND with invalidate) and not re-registered since.
    pub(super) invalidated: bool,
}

impl Region {
    /// First address of the region's address space: the IOVA, or 0 when
    /// registered ZERO_BASED.
    pub(super) fn base(&self) -> u64 {
        if self.access.contains(Access::ZERO_BASED) {
            0
        } else {
            self.iova
        }
    }

    /// Byte offset of `[va, va + len)` within the region. Overflow-safe.
    pub(super) fn offset_of(&self, va: u64, len: u64) -> Result<u64, AccessError> {
        range_offset(self.base(), self.len, va, len)
    }

    /// Host pointer to byte `off` (`off <= len`, checked by `offset_of`).
    pub(super) fn host(&self, off: u64) -> *mut u8 {
        // `wrapping_add` needs no unsafe; `off <= len <= isize::MAX` keeps it in the region.
        self.ptr.0.wrapping_add(off as usize)
    }
}

/// Byte offset of `[va, va + len)` within the address space
/// `[base, base + space)`. Overflow-safe. (rxe_mr.c `mr_check_range`.)
pub(super) fn range_offset(base: u64, space: u64, va: u64, len: u64) -> Result<u64, AccessError> {
    let off = va.checked_sub(base).ok_or(AccessError::OutOfBounds)?;
    let end = off.checked_add(len).ok_or(AccessError::OutOfBounds)?;
    if end > space {
        return Err(AccessError::OutOfBounds);
    }
    Ok(off)
}
