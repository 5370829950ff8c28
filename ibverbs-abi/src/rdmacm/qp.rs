//! QPs on CM ids: `rdma_create_qp(_ex)`, `rdma_destroy_qp`,
//! `rdma_init_qp_attr`. As librdmacm: the QP is made with libibverbs'
//! calls (so it is an ordinary `ibv_qp` of ours), CQs with completion
//! channels are made when the program gives none, and the QP leaves
//! `rdma_create_qp` in INIT (UD: in RTS with RDMA-CM's Q_Key).

use std::os::raw::c_int;
use std::ptr;

use super::fail;
use crate::cmffi::*;
use crate::ffi::*;
use crate::guard;

/// The attributes that move a fresh QP of `id` to `state` (INIT; for UD also
/// RTR and RTS), with their mask.
unsafe fn init_attr(id: *mut rdma_cm_id, state: ibv_qp_state) -> Result<(ibv_qp_attr, c_int), c_int> {
    let mut a: ibv_qp_attr = std::mem::zeroed();
    a.qp_state = state;
    let ud = (*id).qp_type == IBV_QPT_UD;
    let mask = match state {
        IBV_QPS_INIT => {
            a.pkey_index = 0;
            a.port_num = 1;
            if ud {
                a.qkey = rocev2::cm::cma::RDMA_UDP_QKEY;
                IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY
            } else {
                a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
                IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS
            }
        }
        IBV_QPS_RTR if ud => IBV_QP_STATE,
        IBV_QPS_RTS if ud => {
            a.sq_psn = 0;
            IBV_QP_STATE | IBV_QP_SQ_PSN
        }
        // RC/UC RTR and RTS carry what the REQ and REP negotiated: urnic's CM
        // moves QPs made by rdma_create_qp itself; for a program's own QP
        // this is not offered yet.
        _ => return Err(libc::ENOSYS),
    };
    Ok((a, mask as c_int))
}

/// `rdma_init_qp_attr`: INIT for every id; RTR and RTS for UD ids.
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_init_qp_attr(id: *mut rdma_cm_id, attr: *mut ibv_qp_attr, mask: *mut c_int) -> c_int {
    guard("rdma_init_qp_attr", -1, || {
        if id.is_null() || attr.is_null() || mask.is_null() || !super::with_cma(|c| c.ids.contains_key(&(id as usize))) {
            return fail(libc::EINVAL);
        }
        match init_attr(id, (*attr).qp_state) {
            Ok((a, m)) => {
                *attr = a;
                *mask = m;
                0
            }
            Err(e) => fail(e),
        }
    })
}

unsafe fn modify(qp: *mut ibv_qp, id: *mut rdma_cm_id, state: ibv_qp_state) -> c_int {
    match init_attr(id, state) {
        Ok((mut a, m)) => crate::qp::ibv_modify_qp(qp, &mut a, m),
        Err(e) => e,
    }
}

/// Destroy the CQs and channels `rdma_create_qp` made for `id`.
pub(crate) unsafe fn destroy_cqs(id: *mut rdma_cm_id) {
    let i = &mut *id;
    if !i.send_cq.is_null() && i.send_cq != i.recv_cq {
        crate::cq::ibv_destroy_cq(i.send_cq);
    }
    if !i.recv_cq.is_null() {
        crate::cq::ibv_destroy_cq(i.recv_cq);
    }
    if !i.send_cq_channel.is_null() && i.send_cq_channel != i.recv_cq_channel {
        crate::cq::ibv_destroy_comp_channel(i.send_cq_channel);
    }
    if !i.recv_cq_channel.is_null() {
        crate::cq::ibv_destroy_comp_channel(i.recv_cq_channel);
    }
    i.send_cq = ptr::null_mut();
    i.recv_cq = ptr::null_mut();
    i.send_cq_channel = ptr::null_mut();
    i.recv_cq_channel = ptr::null_mut();
}

/// CQs (each with a completion channel) for the queues the program gave none for.
unsafe fn create_cqs(id: *mut rdma_cm_id, attr: &mut ibv_qp_init_attr) -> Result<(), c_int> {
    let i = &mut *id;
    let err = || std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::ENOMEM);
    if attr.recv_cq.is_null() {
        i.recv_cq_channel = crate::cq::ibv_create_comp_channel(i.verbs);
        if i.recv_cq_channel.is_null() {
            return Err(err());
        }
        i.recv_cq = crate::cq::ibv_create_cq(i.verbs, attr.cap.max_recv_wr.max(1) as c_int, id.cast(), i.recv_cq_channel, 0);
        if i.recv_cq.is_null() {
            return Err(err());
        }
        attr.recv_cq = i.recv_cq;
    }
    if attr.send_cq.is_null() {
        i.send_cq_channel = crate::cq::ibv_create_comp_channel(i.verbs);
        if i.send_cq_channel.is_null() {
            return Err(err());
        }
        i.send_cq = crate::cq::ibv_create_cq(i.verbs, attr.cap.max_send_wr.max(1) as c_int, id.cast(), i.send_cq_channel, 0);
        if i.send_cq.is_null() {
            return Err(err());
        }
        attr.send_cq = i.send_cq;
    }
    Ok(())
}

/// `rdma_create_qp`: a QP on the id's device (`pd` NULL: the device's PD),
/// left in INIT (UD: RTS with Q_Key `RDMA_UDP_QKEY`).
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_create_qp(id: *mut rdma_cm_id, pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> c_int {
    guard("rdma_create_qp", -1, || {
        if id.is_null() || attr.is_null() {
            return fail(libc::EINVAL);
        }
        let dev_pd = super::with_cma(|c| {
            let s = c.ids.get(&(id as usize))?;
            Some(s.dev.map(|d| c.devs[d].pd))
        });
        let Some(Some(dpd)) = dev_pd else { return fail(libc::EINVAL) };
        if (*id).verbs.is_null() || !(*id).qp.is_null() {
            return fail(libc::EINVAL);
        }
        let pd = if pd.is_null() { dpd } else { pd };
        if (*pd).context != (*id).verbs {
            return fail(libc::EINVAL);
        }
        let a = &mut *attr;
        if a.qp_type != (*id).qp_type && !((*id).qp_type == IBV_QPT_RC && a.qp_type == IBV_QPT_UC) {
            return fail(libc::EINVAL);
        }
        if let Err(e) = create_cqs(id, a) {
            destroy_cqs(id);
            return fail(e);
        }
        let qp = crate::qp::ibv_create_qp(pd, a);
        if qp.is_null() {
            let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL);
            destroy_cqs(id);
            return fail(e);
        }
        let states: &[ibv_qp_state] = if a.qp_type == IBV_QPT_UD { &[IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS] } else { &[IBV_QPS_INIT] };
        for &s in states {
            let rc = modify(qp, id, s);
            if rc != 0 {
                crate::qp::ibv_destroy_qp(qp);
                destroy_cqs(id);
                return fail(rc);
            }
        }
        (*id).qp = qp;
        (*id).pd = pd;
        0
    })
}

/// `rdma_create_qp_ex`: as `rdma_create_qp` from `ibv_qp_init_attr_ex`
/// (its PD if IBV_QP_INIT_ATTR_PD; no other extended attributes).
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_create_qp_ex(id: *mut rdma_cm_id, ex: *mut ibv_qp_init_attr_ex) -> c_int {
    guard("rdma_create_qp_ex", -1, || {
        if id.is_null() || ex.is_null() {
            return fail(libc::EINVAL);
        }
        let x = &mut *ex;
        if x.comp_mask & !IBV_QP_INIT_ATTR_PD != 0 {
            return fail(libc::EOPNOTSUPP);
        }
        let pd = if x.comp_mask & IBV_QP_INIT_ATTR_PD != 0 { x.pd } else { ptr::null_mut() };
        let mut a = ibv_qp_init_attr {
            qp_context: x.qp_context,
            send_cq: x.send_cq,
            recv_cq: x.recv_cq,
            srq: x.srq,
            cap: x.cap,
            qp_type: x.qp_type,
            sq_sig_all: x.sq_sig_all,
        };
        let rc = urnic_rdma_create_qp(id, pd, &mut a);
        if rc == 0 {
            x.cap = a.cap;
            x.send_cq = a.send_cq;
            x.recv_cq = a.recv_cq;
        }
        rc
    })
}

/// `rdma_destroy_qp`.
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_destroy_qp(id: *mut rdma_cm_id) {
    guard("rdma_destroy_qp", (), || {
        if id.is_null() || (*id).qp.is_null() {
            return;
        }
        crate::qp::ibv_destroy_qp((*id).qp);
        (*id).qp = ptr::null_mut();
    })
}
