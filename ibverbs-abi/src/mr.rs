//! Protection domains, memory regions and memory windows: `ibv_alloc_pd`,
//! `ibv_reg_mr`, `ibv_reg_mr_iova2`, `ibv_dereg_mr`, and `ibv_alloc_mw` /
//! `ibv_bind_mw` / `ibv_dealloc_mw` through `ibv_context.ops`.

use std::os::raw::{c_int, c_uint, c_void};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::ctx::uctx;
use crate::ffi::*;
use crate::{errno_of, guard, null_err};

#[repr(C)]
pub(crate) struct UPd {
    pub(crate) pd: ibv_pd,
    pub(crate) inner: urnic::Pd,
    /// MRs, MWs, QPs, SRQs and AHs made on this PD and not yet destroyed:
    /// `ibv_dealloc_pd` fails with EBUSY while any remain, as the kernel does.
    pub(crate) users: AtomicU32,
}

#[repr(C)]
struct UMr {
    mr: ibv_mr,
    inner: Option<urnic::Mr>,
}

#[repr(C)]
struct UMw {
    mw: ibv_mw,
    inner: urnic::Mw,
}

/// The urnic PD behind an `ibv_pd` of ours.
pub(crate) unsafe fn upd<'a>(pd: *mut ibv_pd) -> Option<&'a UPd> {
    (!pd.is_null() && uctx((*pd).context).is_some()).then(|| &*(pd as *const UPd))
}

/// The urnic MR behind an `ibv_mr` of ours.
pub(crate) unsafe fn umr<'a>(mr: *mut ibv_mr) -> Option<&'a urnic::Mr> {
    if mr.is_null() || uctx((*mr).context).is_none() {
        return None;
    }
    (*(mr as *const UMr)).inner.as_ref()
}

pub(crate) fn install_ops(ops: &mut ibv_context_ops) {
    ops.alloc_mw = Some(alloc_mw);
    ops.bind_mw = Some(bind_mw);
    ops.dealloc_mw = Some(dealloc_mw);
}

#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    guard("ibv_alloc_pd", ptr::null_mut(), || {
        let Some(u) = uctx(ctx) else { return null_err(libc::EINVAL) };
        match u.ctx.alloc_pd() {
            Ok(inner) => {
                let pd = ibv_pd { context: ctx, handle: inner.id() };
                let b = Box::into_raw(Box::new(UPd { pd, inner, users: AtomicU32::new(0) }));
                &mut (*b).pd
            }
            Err(e) => null_err(errno_of(&e)),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    guard("ibv_dealloc_pd", libc::EIO, || {
        let Some(p) = upd(pd) else { return libc::EINVAL };
        if p.users.load(Ordering::Acquire) != 0 {
            return libc::EBUSY;
        }
        drop(Box::from_raw(pd as *mut UPd));
        0
    })
}

/// The access bits urnic knows; IBV_ACCESS_OPTIONAL_RANGE bits (relaxed
/// ordering and the like) are hints a provider may ignore, as libibverbs
/// lets it; any other unknown bit is EINVAL.
fn access_of(access: c_uint) -> Result<urnic::Access, c_int> {
    // IB_UVERBS_ACCESS_OPTIONAL_FIRST (bit 20) up to _LAST (bit 29).
    let optional = ((1u32 << 30) - 1) & !(IBV_ACCESS_OPTIONAL_FIRST - 1);
    let known = (IBV_ACCESS_LOCAL_WRITE
        | IBV_ACCESS_REMOTE_WRITE
        | IBV_ACCESS_REMOTE_READ
        | IBV_ACCESS_REMOTE_ATOMIC
        | IBV_ACCESS_MW_BIND
        | IBV_ACCESS_ZERO_BASED) as c_uint;
    // IBV_ACCESS_HUGETLB is a hint the kernel accepts; urnic needs none.
    let a = access & !optional & !(IBV_ACCESS_HUGETLB as c_uint);
    if a & !known != 0 {
        return Err(libc::EINVAL);
    }
    urnic::Access::from_bits(a).ok_or(libc::EINVAL)
}

unsafe fn reg(pd: *mut ibv_pd, addr: *mut c_void, len: usize, iova: u64, access: c_uint) -> *mut ibv_mr {
    let Some(p) = upd(pd) else { return null_err(libc::EINVAL) };
    let access = match access_of(access) {
        Ok(a) => a,
        Err(e) => return null_err(e),
    };
    // ib_umem_get: no pages is EINVAL; an address it cannot pin (page 0)
    // is EFAULT.
    if len == 0 {
        return null_err(libc::EINVAL);
    }
    if addr.is_null() {
        return null_err(libc::EFAULT);
    }
    if iova != addr as u64 {
        // urnic addresses a region by its own virtual address.
        eprintln!("urnic: ibv_reg_mr_iova2 with an IOVA other than the address is not supported yet");
        return null_err(libc::EOPNOTSUPP);
    }
    // SAFETY: the caller keeps [addr, addr+len) valid until ibv_dereg_mr, as
    // ibv_reg_mr requires.
    match p.inner.reg_mr_raw(addr as *mut u8, len, access) {
        Ok(mr) => {
            let m = ibv_mr { context: (*pd).context, pd, addr, length: len, handle: mr.lkey(), lkey: mr.lkey(), rkey: mr.rkey() };
            p.users.fetch_add(1, Ordering::AcqRel);
            let b = Box::into_raw(Box::new(UMr { mr: m, inner: Some(mr) }));
            &mut (*b).mr
        }
        Err(e) => null_err(errno_of(&e)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, len: usize, access: c_int) -> *mut ibv_mr {
    guard("ibv_reg_mr", ptr::null_mut(), || reg(pd, addr, len, addr as u64, access as c_uint))
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(pd: *mut ibv_pd, addr: *mut c_void, len: usize, iova: u64, access: c_uint) -> *mut ibv_mr {
    guard("ibv_reg_mr_iova2", ptr::null_mut(), || reg(pd, addr, len, iova, access))
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    guard("ibv_dereg_mr", libc::EIO, || {
        if umr(mr).is_none() {
            return libc::EINVAL;
        }
        let u = &mut *(mr as *mut UMr);
        let Some(inner) = u.inner.take() else { return libc::EINVAL };
        match inner.dereg() {
            Ok(_) => {
                if let Some(p) = upd((*mr).pd) {
                    p.users.fetch_sub(1, Ordering::AcqRel);
                }
                drop(Box::from_raw(mr as *mut UMr));
                0
            }
            Err(e) => {
                // Still registered and usable (windows bound): EBUSY, as
                // ibv_dereg_mr answers.
                let errno = errno_of(e.error());
                u.inner = Some(e.into_mr());
                errno
            }
        }
    })
}

unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, ty: ibv_mw_type) -> *mut ibv_mw {
    guard("ibv_alloc_mw", ptr::null_mut(), || {
        let Some(p) = upd(pd) else { return null_err(libc::EINVAL) };
        let t = match ty {
            IBV_MW_TYPE_1 => urnic::MwType::Type1,
            IBV_MW_TYPE_2 => urnic::MwType::Type2,
            _ => return null_err(libc::EINVAL),
        };
        match p.inner.alloc_mw(t) {
            Ok(inner) => {
                let mw = ibv_mw { context: (*pd).context, pd, rkey: inner.rkey(), handle: inner.rkey(), type_: ty };
                p.users.fetch_add(1, Ordering::AcqRel);
                let b = Box::into_raw(Box::new(UMw { mw, inner }));
                &mut (*b).mw
            }
            Err(e) => null_err(errno_of(&e)),
        }
    })
}

/// `ops.bind_mw`: bind a type-1 window. urnic binds it at once; a bind that
/// asks for a completion (IBV_SEND_SIGNALED) is refused with EOPNOTSUPP
/// rather than left without one.
unsafe extern "C" fn bind_mw(_qp: *mut ibv_qp, mw: *mut ibv_mw, bind: *mut ibv_mw_bind) -> c_int {
    guard("ibv_bind_mw", libc::EIO, || {
        if mw.is_null() || bind.is_null() || uctx((*mw).context).is_none() {
            return libc::EINVAL;
        }
        let b = &*bind;
        if b.send_flags & IBV_SEND_SIGNALED as c_uint != 0 {
            return libc::EOPNOTSUPP;
        }
        let info = &b.bind_info;
        // A zero-length bind unbinds; urnic still wants the region it was in.
        let Some(mr) = umr(info.mr) else { return libc::EINVAL };
        let access = match access_of(info.mw_access_flags) {
            Ok(a) => a,
            Err(e) => return e,
        };
        let u = &mut *(mw as *mut UMw);
        match u.inner.bind(mr, info.addr, info.length, access) {
            Ok(rkey) => {
                (*mw).rkey = rkey;
                0
            }
            Err(e) => errno_of(&e),
        }
    })
}

unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    guard("ibv_dealloc_mw", libc::EIO, || {
        if mw.is_null() || uctx((*mw).context).is_none() {
            return libc::EINVAL;
        }
        if let Some(p) = upd((*mw).pd) {
            p.users.fetch_sub(1, Ordering::AcqRel);
        }
        drop(Box::from_raw(mw as *mut UMw));
        0
    })
}

/// A PD gained or lost a user (QP, SRQ, AH).
pub(crate) unsafe fn pd_users(pd: *mut ibv_pd, delta: i32) {
    if let Some(p) = upd(pd) {
        if delta > 0 {
            p.users.fetch_add(1, Ordering::AcqRel);
        } else {
            p.users.fetch_sub(1, Ordering::AcqRel);
        }
    }
}
