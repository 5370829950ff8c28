//! Queue pairs, shared receive queues and address handles:
//! `ibv_create_qp`, `ibv_modify_qp`, `ibv_query_qp`, `ibv_destroy_qp`,
//! `ibv_post_send` / `ibv_post_recv` / `ibv_post_srq_recv` (through
//! `ibv_context.ops`), `ibv_create_srq` and friends, `ibv_create_ah`,
//! `ibv_create_ah_from_wc`.

use std::os::raw::{c_int, c_uint};
use std::ptr;
use std::sync::atomic::Ordering;

use rocev2::transport::attr::AddressVector;
use rocev2::transport::wqe::{PayloadRef, RecvWrRef, SendWrRef, WQE_INLINE_BYTES};
use urnic::{AhAttr, QpAttrMask, QpCaps, QpState, QpType, RemoteAddr, SendFlags, SendOp, Sge, UdDest};

use crate::cq::ucq;
use crate::ctx::{register, uctx, unregister};
use crate::ffi::*;
use crate::mr::{pd_users, umr, upd};
use crate::{errno_of, guard, null_err, set_errno};

#[repr(C)]
pub(crate) struct UQp {
    pub(crate) qp: ibv_qp,
    pub(crate) inner: urnic::Qp,
    sq_sig_all: bool,
    cap: ibv_qp_cap,
}

#[repr(C)]
pub(crate) struct USrq {
    pub(crate) srq: ibv_srq,
    inner: urnic::Srq,
    max_wr: u32,
    max_sge: u32,
    limit: u32,
}

#[repr(C)]
pub(crate) struct UAh {
    ah: ibv_ah,
    inner: urnic::Ah,
}

pub(crate) unsafe fn uqp<'a>(qp: *mut ibv_qp) -> Option<&'a UQp> {
    (!qp.is_null() && uctx((*qp).context).is_some()).then(|| &*(qp as *const UQp))
}

unsafe fn usrq<'a>(srq: *mut ibv_srq) -> Option<&'a USrq> {
    (!srq.is_null() && uctx((*srq).context).is_some()).then(|| &*(srq as *const USrq))
}

pub(crate) fn install_ops(ops: &mut ibv_context_ops) {
    ops.post_send = Some(post_send);
    ops.post_recv = Some(post_recv);
    ops.post_srq_recv = Some(post_srq_recv);
}

fn qp_type_of(t: ibv_qp_type) -> Option<QpType> {
    match t {
        IBV_QPT_RC => Some(QpType::Rc),
        IBV_QPT_UC => Some(QpType::Uc),
        IBV_QPT_UD => Some(QpType::Ud),
        _ => None,
    }
}

fn state_of(s: ibv_qp_state) -> Option<QpState> {
    Some(match s {
        IBV_QPS_RESET => QpState::Reset,
        IBV_QPS_INIT => QpState::Init,
        IBV_QPS_RTR => QpState::Rtr,
        IBV_QPS_RTS => QpState::Rts,
        IBV_QPS_SQD => QpState::Sqd,
        IBV_QPS_SQE => QpState::Sqe,
        IBV_QPS_ERR => QpState::Err,
        _ => return None,
    })
}

fn ibv_state(s: QpState) -> ibv_qp_state {
    match s {
        QpState::Reset => IBV_QPS_RESET,
        QpState::Init => IBV_QPS_INIT,
        QpState::Rtr => IBV_QPS_RTR,
        QpState::Rts => IBV_QPS_RTS,
        QpState::Sqd => IBV_QPS_SQD,
        QpState::Sqe => IBV_QPS_SQE,
        QpState::Err => IBV_QPS_ERR,
    }
}

fn mtu_of(m: ibv_mtu) -> Option<urnic::Mtu> {
    Some(match m {
        IBV_MTU_256 => urnic::Mtu::Mtu256,
        IBV_MTU_512 => urnic::Mtu::Mtu512,
        IBV_MTU_1024 => urnic::Mtu::Mtu1024,
        IBV_MTU_2048 => urnic::Mtu::Mtu2048,
        IBV_MTU_4096 => urnic::Mtu::Mtu4096,
        _ => return None,
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(pd: *mut ibv_pd, init: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    guard("ibv_create_qp", ptr::null_mut(), || {
        let (Some(p), false) = (upd(pd), init.is_null()) else { return null_err(libc::EINVAL) };
        let a = &mut *init;
        let (Some(scq), Some(rcq)) = (ucq(a.send_cq), ucq(a.recv_cq)) else { return null_err(libc::EINVAL) };
        let Some(ty) = qp_type_of(a.qp_type) else {
            // XRC, raw packet and driver QPs are not urnic's.
            return null_err(libc::EOPNOTSUPP);
        };
        let srq = if a.srq.is_null() {
            None
        } else {
            match usrq(a.srq) {
                Some(s) => Some(&s.inner),
                None => return null_err(libc::EINVAL),
            }
        };
        // A queue of 0 WRs is a valid request (qperf's one-way tests ask for
        // it: rxe_qp_chk_cap has no lower bound); the QP gets at least the
        // requested sizes, as verbs allows, and reports them below.
        let cap = QpCaps {
            max_send_wr: a.cap.max_send_wr.max(1),
            max_recv_wr: if srq.is_some() { 0 } else { a.cap.max_recv_wr.max(1) },
            max_send_sge: a.cap.max_send_sge.max(1),
            max_recv_sge: a.cap.max_recv_sge.max(1),
            max_inline_data: a.cap.max_inline_data,
        };
        let qi = urnic::QpInit { qp_type: ty, send_cq: &scq.inner, recv_cq: &rcq.inner, srq, cap, sq_sig_all: a.sq_sig_all != 0 };
        let inner = match p.inner.create_qp(&qi) {
            Ok(q) => q,
            Err(e) => return null_err(errno_of(&e)),
        };
        // The caps the QP really has, written back as libibverbs does.
        let c = inner.caps();
        a.cap = ibv_qp_cap {
            max_send_wr: c.max_send_wr,
            max_recv_wr: c.max_recv_wr,
            max_send_sge: c.max_send_sge,
            max_recv_sge: c.max_recv_sge,
            max_inline_data: c.max_inline_data,
        };
        let mut qp: ibv_qp = std::mem::zeroed();
        qp.context = (*pd).context;
        qp.qp_context = a.qp_context;
        qp.pd = pd;
        qp.send_cq = a.send_cq;
        qp.recv_cq = a.recv_cq;
        qp.srq = a.srq;
        qp.handle = inner.qp_num();
        qp.qp_num = inner.qp_num();
        qp.state = IBV_QPS_RESET;
        qp.qp_type = a.qp_type;
        libc::pthread_mutex_init(&mut qp.mutex as *mut _ as *mut libc::pthread_mutex_t, ptr::null());
        libc::pthread_cond_init(&mut qp.cond as *mut _ as *mut libc::pthread_cond_t, ptr::null());
        let qpn = inner.qp_num();
        let b = Box::into_raw(Box::new(UQp { qp, inner, sq_sig_all: a.sq_sig_all != 0, cap: a.cap }));
        if let Some(u) = uctx((*pd).context) {
            register(&u.qps, qpn, b as usize);
        }
        pd_users(pd, 1);
        scq.users.fetch_add(1, Ordering::AcqRel);
        rcq.users.fetch_add(1, Ordering::AcqRel);
        &mut (*b).qp
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    guard("ibv_destroy_qp", libc::EIO, || {
        let Some(q) = uqp(qp) else { return libc::EINVAL };
        // uverbs (`uverbs_free_qp`): a QP still attached to a group is busy.
        if !q.inner.mcast_groups().is_empty() {
            return libc::EBUSY;
        }
        if let Some(u) = uctx((*qp).context) {
            unregister(&u.qps, q.inner.qp_num());
        }
        pd_users((*qp).pd, -1);
        for cq in [(*qp).send_cq, (*qp).recv_cq] {
            if let Some(c) = ucq(cq) {
                c.users.fetch_sub(1, Ordering::AcqRel);
            }
        }
        drop(Box::from_raw(qp as *mut UQp));
        0
    })
}

/// `ibv_ah_attr` → urnic's (RoCE: always global, the GRH carries the GIDs).
fn ah_of(a: &ibv_ah_attr) -> AhAttr {
    // SAFETY: every bit pattern is a valid [u8; 16].
    let dgid = unsafe { a.grh.dgid.raw };
    AhAttr {
        dgid,
        sgid_index: a.grh.sgid_index,
        traffic_class: a.grh.traffic_class,
        hop_limit: a.grh.hop_limit,
        flow_label: a.grh.flow_label,
        port_num: a.port_num,
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    // rdma-core's ibv_modify_qp fails through a system call, which leaves its
    // error in errno too; programs print strerror(errno) (qperf does).
    let rc = modify_qp(qp, attr, mask);
    if rc != 0 {
        set_errno(rc);
    }
    rc
}

unsafe fn modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    guard("ibv_modify_qp", libc::EIO, || {
        let (Some(q), false) = (uqp(qp), attr.is_null()) else { return libc::EINVAL };
        let a = &*attr;
        let Some(mask) = QpAttrMask::from_bits(mask as u32) else { return libc::EINVAL };
        let mut x = urnic::QpAttr::default();
        if mask.contains(QpAttrMask::STATE) {
            let Some(s) = state_of(a.qp_state) else { return libc::EINVAL };
            x.qp_state = s;
        }
        if mask.contains(QpAttrMask::CUR_STATE) {
            let Some(s) = state_of(a.cur_qp_state) else { return libc::EINVAL };
            x.cur_qp_state = s;
        }
        if mask.contains(QpAttrMask::PATH_MTU) {
            let Some(m) = mtu_of(a.path_mtu) else { return libc::EINVAL };
            x.path_mtu = m;
        }
        x.qkey = a.qkey;
        x.rq_psn = urnic::Psn::new(a.rq_psn & 0x00ff_ffff);
        x.sq_psn = urnic::Psn::new(a.sq_psn & 0x00ff_ffff);
        x.dest_qp_num = a.dest_qp_num;
        if mask.contains(QpAttrMask::ACCESS_FLAGS) {
            let Some(acc) = urnic::Access::from_bits(a.qp_access_flags) else { return libc::EINVAL };
            x.qp_access_flags = acc;
        }
        x.pkey_index = a.pkey_index;
        x.port_num = a.port_num;
        x.max_rd_atomic = a.max_rd_atomic;
        x.max_dest_rd_atomic = a.max_dest_rd_atomic;
        x.min_rnr_timer = a.min_rnr_timer;
        x.timeout = a.timeout;
        x.retry_cnt = a.retry_cnt;
        x.rnr_retry = a.rnr_retry;
        if mask.contains(QpAttrMask::AV) {
            if a.ah_attr.is_global == 0 {
                // RoCE addresses by GID: a path without a GRH (a LID alone, as
                // qperf's non-CM tests give) is refused as the kernel's
                // rdma_check_ah_attr refuses it for rxe and every RoCE port.
                return libc::EINVAL;
            }
            x.ah_attr = Some(ah_of(&a.ah_attr));
        }
        match q.inner.modify(&x, mask) {
            Ok(()) => {
                if mask.contains(QpAttrMask::STATE) {
                    (*qp).state = a.qp_state;
                }
                0
            }
            Err(e) => errno_of(&e),
        }
    })
}

fn fill_ah_attr(av: &AddressVector, gids: &[urnic::Gid], out: &mut ibv_ah_attr) {
    out.is_global = 1;
    out.port_num = 1;
    out.grh.dgid.raw = av.dgid;
    out.grh.sgid_index = gids.iter().position(|g| *g == av.sgid).unwrap_or(0) as u8;
    out.grh.traffic_class = av.traffic_class;
    out.grh.hop_limit = av.hop_limit;
    out.grh.flow_label = av.flow_label;
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, _mask: c_int, init: *mut ibv_qp_init_attr) -> c_int {
    guard("ibv_query_qp", libc::EIO, || {
        let (Some(q), false, false) = (uqp(qp), attr.is_null(), init.is_null()) else { return libc::EINVAL };
        let Some(u) = uctx((*qp).context) else { return libc::EINVAL };
        let x = match q.inner.query() {
            Ok(x) => x,
            Err(e) => return errno_of(&e),
        };
        let a = &mut *attr;
        *a = std::mem::zeroed();
        a.qp_state = ibv_state(x.qp_state);
        a.cur_qp_state = ibv_state(x.cur_qp_state);
        a.path_mtu = x.path_mtu as u32 as ibv_mtu;
        a.path_mig_state = IBV_MIG_MIGRATED;
        a.qkey = x.qkey;
        a.rq_psn = x.rq_psn.value();
        a.sq_psn = x.sq_psn.value();
        a.dest_qp_num = x.dest_qp_num;
        a.qp_access_flags = x.qp_access_flags.bits();
        a.cap = q.cap;
        if let Some(av) = &x.ah_attr {
            fill_ah_attr(av, u.ctx.gids(), &mut a.ah_attr);
        }
        a.pkey_index = x.pkey_index;
        a.sq_draining = x.sq_draining as u8;
        a.max_rd_atomic = x.max_rd_atomic;
        a.max_dest_rd_atomic = x.max_dest_rd_atomic;
        a.min_rnr_timer = x.min_rnr_timer;
        a.port_num = 1;
        a.timeout = x.timeout;
        a.retry_cnt = x.retry_cnt;
        a.rnr_retry = x.rnr_retry;
        let i = &mut *init;
        i.qp_context = (*qp).qp_context;
        i.send_cq = (*qp).send_cq;
        i.recv_cq = (*qp).recv_cq;
        i.srq = (*qp).srq;
        i.cap = q.cap;
        i.qp_type = (*qp).qp_type;
        i.sq_sig_all = q.sq_sig_all as c_int;
        0
    })
}

/// `ibv_qp_to_qp_ex`: urnic QPs are not created through `ibv_create_qp_ex`
/// (that extended op is NULL), so there is no `ibv_qp_ex`, as libibverbs
/// answers for such a QP.
#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(_qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    ptr::null_mut()
}

// `ibv_sge` and urnic's `Sge` have one layout: a program's SGE array is
// read in place, without a copy (checked here at compile time; the field
// layout of `ibv_sge` itself is checked against the system header).
const _: () = {
    assert!(std::mem::size_of::<Sge>() == std::mem::size_of::<ibv_sge>());
    assert!(std::mem::align_of::<Sge>() == std::mem::align_of::<ibv_sge>());
    assert!(std::mem::offset_of!(Sge, addr) == std::mem::offset_of!(ibv_sge, addr));
    assert!(std::mem::offset_of!(Sge, length) == std::mem::offset_of!(ibv_sge, length));
    assert!(std::mem::offset_of!(Sge, lkey) == std::mem::offset_of!(ibv_sge, lkey));
};

/// A C SGE array as urnic SGEs, in place.
///
/// # Safety
/// `list` points to `n` readable `ibv_sge`s that stay unchanged for `'a`
/// (the call's duration: ibv_post_send(3) lets the program reuse them once
/// the call returns, and urnic copies them into the WQE before that).
unsafe fn sges<'a>(list: *const ibv_sge, n: c_int) -> Result<&'a [Sge], c_int> {
    if n < 0 || (n > 0 && list.is_null()) {
        return Err(libc::EINVAL);
    }
    if n == 0 {
        return Ok(&[]);
    }
    // SAFETY: same layout (asserted above); the caller vouches for `list`.
    Ok(std::slice::from_raw_parts(list.cast::<Sge>(), n as usize))
}

/// One C send WR's operation and flags as urnic's.
unsafe fn send_op(w: &ibv_send_wr) -> Result<(SendOp, SendFlags), c_int> {
    let f = w.send_flags;
    let mut flags = SendFlags::empty();
    if f & IBV_SEND_FENCE as c_uint != 0 {
        flags |= SendFlags::FENCE;
    }
    if f & IBV_SEND_SIGNALED as c_uint != 0 {
        flags |= SendFlags::SIGNALED;
    }
    if f & IBV_SEND_SOLICITED as c_uint != 0 {
        flags |= SendFlags::SOLICITED;
    }
    if f & IBV_SEND_INLINE as c_uint != 0 {
        flags |= SendFlags::INLINE;
    }
    let rdma = || RemoteAddr { addr: w.wr.rdma.remote_addr, rkey: w.wr.rdma.rkey };
    let imm = u32::from_be(w.__bindgen_anon_1.imm_data);
    let op = match w.opcode {
        IBV_WR_SEND => SendOp::Send,
        IBV_WR_SEND_WITH_IMM => SendOp::SendWithImm { imm },
        IBV_WR_SEND_WITH_INV => SendOp::SendWithInv { rkey: w.__bindgen_anon_1.invalidate_rkey },
        IBV_WR_RDMA_WRITE => SendOp::Write { remote: rdma() },
        IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::WriteWithImm { remote: rdma(), imm },
        IBV_WR_RDMA_READ => SendOp::Read { remote: rdma() },
        IBV_WR_ATOMIC_CMP_AND_SWP => SendOp::CmpSwap {
            remote: RemoteAddr { addr: w.wr.atomic.remote_addr, rkey: w.wr.atomic.rkey },
            compare: w.wr.atomic.compare_add,
            swap: w.wr.atomic.swap,
        },
        IBV_WR_ATOMIC_FETCH_AND_ADD => {
            SendOp::FetchAdd { remote: RemoteAddr { addr: w.wr.atomic.remote_addr, rkey: w.wr.atomic.rkey }, add: w.wr.atomic.compare_add }
        }
        IBV_WR_LOCAL_INV => SendOp::LocalInv { rkey: w.__bindgen_anon_1.invalidate_rkey },
        IBV_WR_BIND_MW => {
            let b = &w.__bindgen_anon_2.bind_mw;
            let mw = b.mw;
            if mw.is_null() {
                return Err(libc::EINVAL);
            }
            let Some(mr) = umr(b.bind_info.mr) else { return Err(libc::EINVAL) };
            let Some(access) = urnic::Access::from_bits(b.bind_info.mw_access_flags) else { return Err(libc::EINVAL) };
            SendOp::BindMw {
                mw_rkey: (*mw).rkey,
                new_key: b.rkey as u8,
                mr_lkey: mr.lkey(),
                addr: b.bind_info.addr,
                length: b.bind_info.length,
                access,
            }
        }
        _ => return Err(libc::EINVAL),
    };
    Ok((op, flags))
}

/// Post one C send WR. Inline data is read from the program's buffers now
/// (no lkey) into a stack buffer as large as any WQE's inline area; more
/// than that exceeds every QP's `max_inline_data` and goes to the same
/// check on the heap (it refuses it, with its message).
unsafe fn post_one_send(q: &UQp, qp_type: ibv_qp_type, w: &ibv_send_wr) -> Result<(), c_int> {
    let (op, flags) = send_op(w)?;
    let sgl = sges(w.sg_list, w.num_sge)?;
    let ud = if qp_type == IBV_QPT_UD {
        let ud = &w.wr.ud;
        if ud.ah.is_null() {
            return Err(libc::EINVAL);
        }
        let ah = &*(ud.ah as *const UAh);
        Some(UdDest { av: *ah.inner.address_vector(), remote_qpn: ud.remote_qpn, remote_qkey: ud.remote_qkey })
    } else {
        None
    };
    let post = |payload| q.inner.post_send_ref(&SendWrRef { wr_id: w.wr_id, op, payload, flags, ud }).map_err(|e| errno_of(&e));
    if !flags.contains(SendFlags::INLINE) {
        return post(PayloadRef::Sgl(sgl));
    }
    if sgl.iter().any(|s| s.length > 0 && s.addr == 0) {
        return Err(libc::EINVAL);
    }
    let piece = |s: &Sge| std::slice::from_raw_parts(s.addr as *const u8, s.length as usize);
    let total: u64 = sgl.iter().map(|s| u64::from(s.length)).sum();
    if total <= WQE_INLINE_BYTES as u64 {
        let mut buf = [0u8; WQE_INLINE_BYTES];
        let mut at = 0;
        for s in sgl {
            buf[at..at + s.length as usize].copy_from_slice(piece(s));
            at += s.length as usize;
        }
        post(PayloadRef::Inline(&buf[..at]))
    } else {
        let data: Vec<u8> = sgl.iter().flat_map(|s| piece(s).iter().copied()).collect();
        post(PayloadRef::Inline(&data))
    }
}

/// `ops.post_send` (the inline `ibv_post_send`): no allocation, no lock.
unsafe extern "C" fn post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad: *mut *mut ibv_send_wr) -> c_int {
    guard("ibv_post_send", libc::EIO, || {
        let Some(q) = uqp(qp) else { return libc::EINVAL };
        let qp_type = (*qp).qp_type;
        let mut cur = wr;
        while !cur.is_null() {
            let w = &*cur;
            if let Err(e) = post_one_send(q, qp_type, w) {
                if !bad.is_null() {
                    *bad = cur;
                }
                return e;
            }
            cur = w.next;
        }
        0
    })
}

/// Post a C list of receive WRs through `post`, stopping at the first
/// failure with `*bad` set to it, as providers do.
unsafe fn post_recv_list(wr: *mut ibv_recv_wr, bad: *mut *mut ibv_recv_wr, post: impl Fn(&RecvWrRef<'_>) -> urnic::Result<()>) -> c_int {
    let mut cur = wr;
    while !cur.is_null() {
        let w = &*cur;
        let r = sges(w.sg_list, w.num_sge).and_then(|sgl| post(&RecvWrRef { wr_id: w.wr_id, sgl }).map_err(|e| errno_of(&e)));
        if let Err(e) = r {
            if !bad.is_null() {
                *bad = cur;
            }
            return e;
        }
        cur = w.next;
    }
    0
}

/// `ops.post_recv` (the inline `ibv_post_recv`).
unsafe extern "C" fn post_recv(qp: *mut ibv_qp, wr: *mut ibv_recv_wr, bad: *mut *mut ibv_recv_wr) -> c_int {
    guard("ibv_post_recv", libc::EIO, || match uqp(qp) {
        Some(q) => post_recv_list(wr, bad, |r| q.inner.post_recv_ref(r)),
        None => libc::EINVAL,
    })
}

/// `ops.post_srq_recv` (the inline `ibv_post_srq_recv`).
unsafe extern "C" fn post_srq_recv(srq: *mut ibv_srq, wr: *mut ibv_recv_wr, bad: *mut *mut ibv_recv_wr) -> c_int {
    guard("ibv_post_srq_recv", libc::EIO, || match usrq(srq) {
        Some(s) => post_recv_list(wr, bad, |r| s.inner.post_recv_ref(r)),
        None => libc::EINVAL,
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(pd: *mut ibv_pd, init: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    guard("ibv_create_srq", ptr::null_mut(), || {
        let (Some(p), false) = (upd(pd), init.is_null()) else { return null_err(libc::EINVAL) };
        let a = &mut *init;
        let inner = match p.inner.create_srq(a.attr.max_wr, a.attr.max_sge) {
            Ok(s) => s,
            Err(e) => return null_err(errno_of(&e)),
        };
        if a.attr.srq_limit > 0 {
            if let Err(e) = inner.arm_limit(a.attr.srq_limit) {
                return null_err(errno_of(&e));
            }
        }
        let mut srq: ibv_srq = std::mem::zeroed();
        srq.context = (*pd).context;
        srq.srq_context = a.srq_context;
        srq.pd = pd;
        srq.handle = inner.id();
        libc::pthread_mutex_init(&mut srq.mutex as *mut _ as *mut libc::pthread_mutex_t, ptr::null());
        libc::pthread_cond_init(&mut srq.cond as *mut _ as *mut libc::pthread_cond_t, ptr::null());
        let id = inner.id();
        let b = Box::into_raw(Box::new(USrq { srq, inner, max_wr: a.attr.max_wr, max_sge: a.attr.max_sge, limit: a.attr.srq_limit }));
        if let Some(u) = uctx((*pd).context) {
            register(&u.srqs, id, b as usize);
        }
        pd_users(pd, 1);
        &mut (*b).srq
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: c_int) -> c_int {
    guard("ibv_modify_srq", libc::EIO, || {
        let (Some(_), false) = (usrq(srq), attr.is_null()) else { return libc::EINVAL };
        let s = &mut *(srq as *mut USrq);
        if mask & !(IBV_SRQ_LIMIT as c_int) != 0 {
            // Resizing an SRQ (IBV_SRQ_MAX_WR) is not offered.
            return libc::EOPNOTSUPP;
        }
        if mask & IBV_SRQ_LIMIT as c_int != 0 {
            if let Err(e) = s.inner.arm_limit((*attr).srq_limit) {
                return errno_of(&e);
            }
            s.limit = (*attr).srq_limit;
        }
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    guard("ibv_query_srq", libc::EIO, || {
        let (Some(s), false) = (usrq(srq), attr.is_null()) else { return libc::EINVAL };
        *attr = ibv_srq_attr { max_wr: s.max_wr, max_sge: s.max_sge, srq_limit: s.limit };
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    guard("ibv_destroy_srq", libc::EIO, || {
        let Some(s) = usrq(srq) else { return libc::EINVAL };
        if let Some(u) = uctx((*srq).context) {
            unregister(&u.srqs, s.inner.id());
        }
        pd_users((*srq).pd, -1);
        drop(Box::from_raw(srq as *mut USrq));
        0
    })
}

unsafe fn make_ah(pd: *mut ibv_pd, attr: &AhAttr) -> *mut ibv_ah {
    let Some(p) = upd(pd) else { return null_err(libc::EINVAL) };
    match p.inner.create_ah(attr) {
        Ok(inner) => {
            pd_users(pd, 1);
            let b = Box::into_raw(Box::new(UAh { ah: ibv_ah { context: (*pd).context, pd, handle: 0 }, inner }));
            &mut (*b).ah
        }
        Err(e) => null_err(errno_of(&e)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    guard("ibv_create_ah", ptr::null_mut(), || {
        if attr.is_null() {
            return null_err(libc::EINVAL);
        }
        if (*attr).is_global == 0 {
            // RoCE addresses by GID: an AH without a GRH cannot be routed.
            return null_err(libc::EINVAL);
        }
        make_ah(pd, &ah_of(&*attr))
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    guard("ibv_destroy_ah", libc::EIO, || {
        if ah.is_null() || uctx((*ah).context).is_none() {
            return libc::EINVAL;
        }
        pd_users((*ah).pd, -1);
        drop(Box::from_raw(ah as *mut UAh));
        0
    })
}

/// What a received UD message's GRH area says about its path.
struct GrhPath {
    /// The sender's GID.
    src: [u8; 16],
    /// Ours, as the sender addressed us.
    dst: [u8; 16],
    traffic_class: u8,
    hop_limit: u8,
    flow_label: u32,
}

/// The path from a received UD message's GRH area: an IPv6 header
/// (version 6), or for RoCEv2 over IPv4 the IPv4 header in its last 20
/// bytes (as rxe and urnic place it).
fn path_from_grh(grh: &[u8; 40]) -> Option<GrhPath> {
    if grh[0] >> 4 == 6 {
        let mut src = [0u8; 16];
        let mut dst = [0u8; 16];
        src.copy_from_slice(&grh[8..24]);
        dst.copy_from_slice(&grh[24..40]);
        let traffic_class = (grh[0] << 4) | (grh[1] >> 4);
        let flow_label = (u32::from(grh[1] & 0xf) << 16) | (u32::from(grh[2]) << 8) | u32::from(grh[3]);
        return Some(GrhPath { src, dst, traffic_class, hop_limit: grh[7], flow_label });
    }
    let ip = &grh[20..40];
    if ip[0] >> 4 != 4 {
        return None;
    }
    let mapped = |a: &[u8]| AddressVector::ipv4_gid([a[0], a[1], a[2], a[3]]);
    Some(GrhPath { src: mapped(&ip[12..16]), dst: mapped(&ip[16..20]), traffic_class: ip[1], hop_limit: ip[8], flow_label: 0 })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    ctx: *mut ibv_context,
    port: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    guard("ibv_init_ah_from_wc", -1, || {
        let (Some(u), false, false, false) = (uctx(ctx), wc.is_null(), grh.is_null(), ah_attr.is_null()) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if (*wc).wc_flags & IBV_WC_GRH as c_uint == 0 {
            set_errno(libc::EINVAL);
            return -1;
        }
        let bytes = &*(grh as *const [u8; 40]);
        let Some(GrhPath { src, dst, traffic_class, hop_limit, flow_label }) = path_from_grh(bytes) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        let Some(sgid_index) = u.ctx.gids().iter().position(|g| *g == dst) else {
            set_errno(libc::ENOENT);
            return -1;
        };
        let a = &mut *ah_attr;
        *a = std::mem::zeroed();
        a.is_global = 1;
        a.port_num = port;
        a.grh.dgid.raw = src;
        a.grh.sgid_index = sgid_index as u8;
        a.grh.traffic_class = traffic_class;
        a.grh.hop_limit = hop_limit;
        a.grh.flow_label = flow_label;
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(pd: *mut ibv_pd, wc: *mut ibv_wc, grh: *mut ibv_grh, port: u8) -> *mut ibv_ah {
    guard("ibv_create_ah_from_wc", ptr::null_mut(), || {
        if pd.is_null() {
            return null_err(libc::EINVAL);
        }
        let mut attr: ibv_ah_attr = std::mem::zeroed();
        if ibv_init_ah_from_wc((*pd).context, port, wc, grh, &mut attr) != 0 {
            return ptr::null_mut();
        }
        make_ah(pd, &ah_of(&attr))
    })
}

/// `ibv_attach_mcast`: a UD QP joins a multicast group ([`urnic::Qp::attach_mcast`]).
/// `lid` is ignored, as on RoCE ports. rxe's answers: 0 if already attached;
/// EINVAL for a non-UD QP, a GID that is not multicast, a full group or
/// device; ENOMEM at `max_mcast_grp` groups.
#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, _lid: u16) -> c_int {
    guard("ibv_attach_mcast", libc::EIO, || {
        let Some(q) = uqp(qp) else { return libc::EINVAL };
        if gid.is_null() {
            return libc::EINVAL;
        }
        match q.inner.attach_mcast(&(*gid).raw) {
            Ok(()) => 0,
            Err(e) => errno_of(&e),
        }
    })
}

/// `ibv_detach_mcast`: EINVAL if the QP is not attached to the group (rxe, uverbs).
#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, _lid: u16) -> c_int {
    guard("ibv_detach_mcast", libc::EIO, || {
        let Some(q) = uqp(qp) else { return libc::EINVAL };
        if gid.is_null() {
            return libc::EINVAL;
        }
        match q.inner.detach_mcast(&(*gid).raw) {
            Ok(()) => 0,
            Err(e) => errno_of(&e),
        }
    })
}

/// Enhanced connection establishment is a ConnectX feature: EOPNOTSUPP.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_ece(_qp: *mut ibv_qp, _ece: *mut ibv_ece) -> c_int {
    libc::EOPNOTSUPP
}

#[no_mangle]
pub unsafe extern "C" fn ibv_set_ece(_qp: *mut ibv_qp, _ece: *mut ibv_ece) -> c_int {
    libc::EOPNOTSUPP
}
