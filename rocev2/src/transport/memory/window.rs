//! Memory windows (rxe_mw.c): allocation, the bind state machine (type 1
//! and type 2, IBTA 10.6.7), invalidation (LOCAL_INV and a peer's SEND with
//! Invalidate).

use super::keys::key_of;
use super::object::{Object, Window, WindowState};
use super::{AccessError, MemoryTable, MwType, RegError};
use crate::transport::ids::{Access, PdId};

/// Rights a memory window may grant (IBTA 10.6.7: windows grant remote access only).
pub(super) const MW_RIGHTS: Access = Access::REMOTE_READ.union(Access::REMOTE_WRITE).union(Access::REMOTE_ATOMIC).union(Access::ZERO_BASED);

impl MemoryTable {
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
            WindowState::Bound { mr: mr_index, addr, len, access, qpn: (ty == MwType::Type2).then_some(qpn) }
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
}
