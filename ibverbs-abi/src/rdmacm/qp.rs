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

/// The attributes that move a QP of `id` to `state`, with their mask.
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
        IBV_QPS_RTR | IBV_QPS_RTS => return negotiated(id, state),
        _ => return Err(libc::EINVAL),
    };
    Ok((a, mask as c_int))
}

/// RC/UC RTR and RTS: what the REQ and REP negotiated, from the CM (a
/// request not yet accepted, or a connect answered by CONNECT_RESPONSE).
unsafe fn negotiated(id: *mut rdma_cm_id, state: ibv_qp_state) -> Result<(ibv_qp_attr, c_int), c_int> {
    let st = if state == IBV_QPS_RTR { urnic::QpState::Rtr } else { urnic::QpState::Rts };
    let ty = if (*id).qp_type == IBV_QPT_UC { urnic::QpType::Uc } else { urnic::QpType::Rc };
    let r = super::with_cma(|c| -> Result<_, c_int> {
        let s = c.ids.get(&(id as usize)).ok_or(libc::EINVAL)?;
        let chan = &c.devs[s.dev.ok_or(libc::EINVAL)?].chan;
        let r = if let Some(req) = &s.req {
            // As librdmacm's ucma_modify_qp_rtr/rts on a request: the depths
            // the request offers.
            let p = urnic::cm::ConnParam {
                responder_resources: req.initiator_depth,
                initiator_depth: req.responder_resources,
                ..urnic::cm::ConnParam::default()
            };
            chan.qp_attr_for_request(req, &p, st, ty)
        } else if let Some(rep) = &s.rep {
            chan.qp_attr_for_response(rep, st, ty)
        } else {
            return Err(libc::EINVAL);
        };
        r.map_err(|e| super::errno(&e))
    })?;
    Ok((ibv_attr(&r.0), r.1.bits() as c_int))
}

/// urnic's QP attributes as `ibv_qp_attr`.
fn ibv_attr(a: &urnic::QpAttr) -> ibv_qp_attr {
    // SAFETY: ibv_qp_attr is plain data; all-zero is valid.
    let mut o: ibv_qp_attr = unsafe { std::mem::zeroed() };
    o.qp_state = match a.qp_state {
        urnic::QpState::Init => IBV_QPS_INIT,
        urnic::QpState::Rtr => IBV_QPS_RTR,
        urnic::QpState::Rts => IBV_QPS_RTS,
        _ => IBV_QPS_RESET,
    };
    o.qp_access_flags = a.qp_access_flags.bits();
    o.path_mtu = a.path_mtu as u32 as ibv_mtu;
    o.dest_qp_num = a.dest_qp_num;
    o.rq_psn = a.rq_psn.value();
    o.sq_psn = a.sq_psn.value();
    o.max_dest_rd_atomic = a.max_dest_rd_atomic;
    o.max_rd_atomic = a.max_rd_atomic;
    o.min_rnr_timer = a.min_rnr_timer;
    o.timeout = a.timeout;
    o.retry_cnt = a.retry_cnt;
    o.rnr_retry = a.rnr_retry;
    o.port_num = 1;
    if let Some(ah) = &a.ah_attr {
        o.ah_attr.is_global = 1;
        o.ah_attr.port_num = ah.port_num;
        o.ah_attr.grh.dgid.raw = ah.dgid;
        o.ah_attr.grh.sgid_index = ah.sgid_index;
        o.ah_attr.grh.flow_label = ah.flow_label;
        o.ah_attr.grh.hop_limit = ah.hop_limit;
        o.ah_attr.grh.traffic_class = ah.traffic_class;
    }
    o
}

/// `rdma_init_qp_attr`: INIT for every id; RTR and RTS for UD ids, and for
/// RC/UC ids with a request to accept or a CONNECT_RESPONSE to complete.
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
