//! The one memory checker: every local (SGE lkey) and remote (rkey)
//! access is resolved here — key, protection domain, state, access rights,
//! bounds — before any byte moves (rxe_mr.c `lookup_mr` + `mr_check_range`,
//! rxe_mw.c `rxe_lookup_mw`). The verbs layer's post-time checks use it too.

use super::keys::Table;
use super::object::Object;
use super::object::WindowState;
use super::AccessError;
use crate::transport::ids::{Access, PdId, Sge};

impl Table {
    /// Resolve a local key (SGE lkey) to a host pointer for `[addr, addr+len)`.
    pub(super) fn resolve_local(&self, pd: PdId, lkey: u32, addr: u64, len: u64, needed: Access) -> Result<*mut u8, AccessError> {
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
    pub(super) fn resolve_remote(&self, pd: PdId, qpn: u32, rkey: u32, va: u64, len: u64, needed: Access) -> Result<*mut u8, AccessError> {
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
    pub(super) fn for_sgl_pieces(
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
        // Pass 1 checks everything, pass 2 moves: no byte moves unless all
        // pieces are valid. A range within one SGE (a small message, most
        // frames of a large one) moves in pass 1, with the key resolved once.
        let mut single = None;
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
                } else if from == offset && to == end {
                    single = Some(host);
                }
            }
            if let Some(host) = single {
                f(host, 0, len);
                break;
            }
        }
        Ok(())
    }
}
