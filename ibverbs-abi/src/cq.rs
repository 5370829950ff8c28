//! Completion queues and channels: `ibv_create_comp_channel`,
//! `ibv_create_cq`, `ibv_poll_cq` / `ibv_req_notify_cq` (through
//! `ibv_context.ops`), `ibv_get_cq_event`, `ibv_ack_cq_events`.
//!
//! A channel's fd is urnic's eventfd: poll/epoll on it works, and
//! `ibv_get_cq_event` blocks on it (or fails with EAGAIN when the program
//! made it non-blocking), as on a kernel channel.

use std::collections::HashMap;
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use rocev2::transport::wr::{WcOpcode, WcStatus, WorkCompletion};

use crate::ctx::uctx;
use crate::ffi::*;
use crate::{errno_of, guard, lock, null_err, set_errno};

#[repr(C)]
pub(crate) struct UChannel {
    pub(crate) ch: ibv_comp_channel,
    inner: urnic::CompChannel,
    /// CQ number → the `ibv_cq` to hand back from `ibv_get_cq_event`.
    cqs: Mutex<HashMap<u32, usize>>,
}

#[repr(C)]
pub(crate) struct UCq {
    pub(crate) cq: ibv_cq,
    pub(crate) inner: urnic::Cq,
    /// QPs using this CQ (once per role, send and receive):
    /// `ibv_destroy_cq` fails with EBUSY while any remain, as the kernel's
    /// uverbs_free_cq does (ib_destroy_usecnt).
    pub(crate) users: AtomicU32,
}

/// The urnic CQ behind an `ibv_cq` of ours.
pub(crate) unsafe fn ucq<'a>(cq: *mut ibv_cq) -> Option<&'a UCq> {
    (!cq.is_null() && uctx((*cq).context).is_some()).then(|| &*(cq as *const UCq))
}

pub(crate) fn install_ops(ops: &mut ibv_context_ops) {
    ops.poll_cq = Some(poll_cq);
    ops.req_notify_cq = Some(req_notify_cq);
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel {
    guard("ibv_create_comp_channel", ptr::null_mut(), || {
        let Some(u) = uctx(ctx) else { return null_err(libc::EINVAL) };
        match u.ctx.create_comp_channel() {
            Ok(inner) => {
                let ch = ibv_comp_channel { context: ctx, fd: inner.fd(), refcnt: 0 };
                let b = Box::into_raw(Box::new(UChannel { ch, inner, cqs: Mutex::new(HashMap::new()) }));
                &mut (*b).ch
            }
            Err(e) => null_err(errno_of(&e)),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    // Returns the error code, not -1/errno (verbs.c, and the man page:
    // "the value of errno on failure").
    guard("ibv_destroy_comp_channel", libc::EIO, || {
        if ch.is_null() {
            return libc::EINVAL;
        }
        let u = ch as *mut UChannel;
        // libibverbs: EBUSY while CQs still use the channel.
        if !lock(&(*u).cqs).is_empty() {
            return libc::EBUSY;
        }
        drop(Box::from_raw(u));
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    _comp_vector: c_int,
) -> *mut ibv_cq {
    guard("ibv_create_cq", ptr::null_mut(), || {
        let Some(u) = uctx(ctx) else { return null_err(libc::EINVAL) };
        if cqe <= 0 {
            return null_err(libc::EINVAL);
        }
        let ch = (!channel.is_null()).then(|| &*(channel as *const UChannel));
        let inner = match u.ctx.create_cq(cqe as u32, ch.map(|c| &c.inner)) {
            Ok(c) => c,
            Err(e) => return null_err(errno_of(&e)),
        };
        let mut cq: ibv_cq = std::mem::zeroed();
        cq.context = ctx;
        cq.channel = channel;
        cq.cq_context = cq_context;
        cq.handle = inner.id();
        cq.cqe = inner.capacity() as c_int;
        libc::pthread_mutex_init(&mut cq.mutex as *mut _ as *mut libc::pthread_mutex_t, ptr::null());
        libc::pthread_cond_init(&mut cq.cond as *mut _ as *mut libc::pthread_cond_t, ptr::null());
        let id = inner.id();
        let b = Box::into_raw(Box::new(UCq { cq, inner, users: AtomicU32::new(0) }));
        if let Some(c) = ch {
            lock(&c.cqs).insert(id, b as usize);
            (*channel).refcnt += 1;
        }
        &mut (*b).cq
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    guard("ibv_destroy_cq", libc::EIO, || {
        let Some(c) = ucq(cq) else { return libc::EINVAL };
        if c.users.load(Ordering::Acquire) != 0 {
            return libc::EBUSY;
        }
        let ch = (*cq).channel;
        if !ch.is_null() {
            lock(&(*(ch as *const UChannel)).cqs).remove(&c.inner.id());
            (*ch).refcnt -= 1;
        }
        drop(Box::from_raw(cq as *mut UCq));
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    guard("ibv_resize_cq", libc::EIO, || {
        let Some(c) = ucq(cq) else { return libc::EINVAL };
        if cqe <= 0 {
            return libc::EINVAL;
        }
        match c.inner.resize(cqe as u32) {
            Ok(()) => {
                (*cq).cqe = c.inner.capacity() as c_int;
                0
            }
            Err(e) => errno_of(&e),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(ch: *mut ibv_comp_channel, cq: *mut *mut ibv_cq, cq_context: *mut *mut c_void) -> c_int {
    guard("ibv_get_cq_event", -1, || {
        if ch.is_null() || cq.is_null() || cq_context.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        let u = &*(ch as *const UChannel);
        loop {
            let id = match u.inner.get_cq_event() {
                Ok(id) => id,
                Err(e) => {
                    set_errno(errno_of(&e));
                    return -1;
                }
            };
            // An event of a CQ destroyed meanwhile is dropped.
            if let Some(&p) = lock(&u.cqs).get(&id) {
                let p = p as *mut ibv_cq;
                *cq = p;
                *cq_context = (*p).cq_context;
                return 0;
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: u32) {
    if let Some(_c) = ucq(cq) {
        let m = &mut (*cq).mutex as *mut _ as *mut libc::pthread_mutex_t;
        libc::pthread_mutex_lock(m);
        (*cq).comp_events_completed = (*cq).comp_events_completed.wrapping_add(nevents);
        libc::pthread_mutex_unlock(m);
    }
}

/// `ops.req_notify_cq` (the inline `ibv_req_notify_cq`).
unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard("ibv_req_notify_cq", libc::EIO, || match ucq(cq) {
        Some(c) => {
            c.inner.req_notify(solicited_only != 0);
            0
        }
        None => libc::EINVAL,
    })
}

/// `ops.poll_cq` (the inline `ibv_poll_cq`): up to `n` completions into
/// `wc`; the count, or -1 (negative) on error as providers return.
unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    guard("ibv_poll_cq", -1, || {
        let Some(c) = ucq(cq) else { return -1 };
        // rxe_poll_cq (and mlx5) loop `npolled < ne`: a count <= 0 polls
        // nothing and returns 0.
        if n <= 0 {
            return 0;
        }
        if wc.is_null() {
            return -1;
        }
        // The program is polling, so its thread drives the datapath first
        // (as urnic's own tools do before each CQ poll) instead of sharing
        // the cores with a spinning datapath thread; a datapath thread in
        // an iteration right now is not waited for. Then each completion
        // goes straight into the program's array: no buffer, no
        // allocation, no lock.
        c.inner.context().drive();
        let got = c.inner.poll_with(n as usize, |i, w| *wc.add(i) = to_ibv_wc(w));
        match got {
            Ok(k) => k as c_int,
            Err(_) => -1,
        }
    })
}

/// `struct ibv_wc` from an urnic completion.
pub(crate) fn to_ibv_wc(w: &WorkCompletion) -> ibv_wc {
    let mut wc = ibv_wc { wr_id: w.wr_id, qp_num: w.qp_num, src_qp: w.src_qp, byte_len: w.byte_len, ..Default::default() };
    wc.status = wc_status(w.status);
    wc.opcode = wc_opcode(w.opcode);
    let mut flags = 0;
    if let Some(imm) = w.imm_data {
        // The application reads imm_data in network order (__be32).
        wc.__bindgen_anon_1.imm_data = imm.to_be();
        flags |= IBV_WC_WITH_IMM;
    } else if let Some(k) = w.invalidated_rkey {
        wc.__bindgen_anon_1.invalidated_rkey = k;
        flags |= IBV_WC_WITH_INV;
    }
    if w.grh {
        flags |= IBV_WC_GRH;
    }
    wc.wc_flags = flags as _;
    wc.pkey_index = 0;
    wc
}

fn wc_status(s: WcStatus) -> ibv_wc_status {
    use WcStatus as S;
    match s {
        S::Success => IBV_WC_SUCCESS,
        S::LocLenErr => IBV_WC_LOC_LEN_ERR,
        S::LocQpOpErr => IBV_WC_LOC_QP_OP_ERR,
        S::LocProtErr => IBV_WC_LOC_PROT_ERR,
        S::WrFlushErr => IBV_WC_WR_FLUSH_ERR,
        S::MwBindErr => IBV_WC_MW_BIND_ERR,
        S::BadRespErr => IBV_WC_BAD_RESP_ERR,
        S::LocAccessErr => IBV_WC_LOC_ACCESS_ERR,
        S::RemInvReqErr => IBV_WC_REM_INV_REQ_ERR,
        S::RemAccessErr => IBV_WC_REM_ACCESS_ERR,
        S::RemOpErr => IBV_WC_REM_OP_ERR,
        S::RetryExcErr => IBV_WC_RETRY_EXC_ERR,
        S::RnrRetryExcErr => IBV_WC_RNR_RETRY_EXC_ERR,
        S::RemAbortErr => IBV_WC_REM_ABORT_ERR,
        S::GeneralErr => IBV_WC_GENERAL_ERR,
    }
}

fn wc_opcode(o: WcOpcode) -> ibv_wc_opcode {
    use WcOpcode as O;
    match o {
        O::Send => IBV_WC_SEND,
        O::RdmaWrite => IBV_WC_RDMA_WRITE,
        O::RdmaRead => IBV_WC_RDMA_READ,
        O::CompSwap => IBV_WC_COMP_SWAP,
        O::FetchAdd => IBV_WC_FETCH_ADD,
        O::BindMw => IBV_WC_BIND_MW,
        O::LocalInv => IBV_WC_LOCAL_INV,
        O::Recv => IBV_WC_RECV,
        O::RecvRdmaWithImm => IBV_WC_RECV_RDMA_WITH_IMM,
    }
}
