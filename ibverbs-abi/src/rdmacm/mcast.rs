//! RDMA-CM multicast: `rdma_join_multicast(_ex)`, `rdma_leave_multicast`.
//!
//! RoCE has no subnet administrator, so a join is answered at once, as the
//! kernel's `cma_iboe_join_multicast` does: the group's GID from its IP
//! address, RDMA-CM's UDP Q_Key, and `RDMA_CM_EVENT_MULTICAST_JOIN`
//! carrying the address vector to send to the group (`param.ud`: dgid =
//! the group, hop limit 64, QPN 0xFFFFFF) with the join's context as its
//! private data. As librdmacm's `ucma_process_join`, the id's QP (if it has
//! one, and the join is not send-only) is attached to the group, which also
//! joins it on the host (IGMP / MLD); a failed attach is reported as
//! `RDMA_CM_EVENT_MULTICAST_ERROR` with the attach's -errno as its status
//! (librdmacm puts -1 there and the errno in `errno`; -errno is what the
//! kernel reports for its own multicast errors, and says which). Leaving
//! (or destroying the id) detaches; unlike librdmacm, a leave does not wait
//! for the program to ack the join's event.
//!
//! The Q_Key is `RDMA_UDP_QKEY`, the kernel's `cma_set_default_qkey` for
//! `RDMA_PS_UDP` (and `RDMA_PS_IB`); its `RDMA_PS_IPOIB` Q_Key comes from the
//! IPoIB broadcast group's SA record, and urnic makes no IPoIB ids
//! (`rdma_create_id`: EPROTONOSUPPORT).
//!
//! A send-only join holds no host membership (the kernel sends no IGMP for
//! one either). The hop limit is 64 for IPv6 groups too (the kernel takes
//! none on RoCEv2: ENOTSUPP).
//!
//! Not offered: joins through an IB subnet administrator (`RDMA_PS_IB`,
//! `AF_IB` addresses), and the host membership of a full member that has no
//! QP when it joins (urnic's host membership follows the QP's attach).

use std::os::raw::{c_int, c_void};

use super::addr::sa_to_std;
use super::event::{push_event, sync_wait, NewEvent};
use super::ids::st;
use super::{errno, fail, with_cma, Join, UCmId};
use crate::cmffi::*;
use crate::ffi::*;
use crate::guard;

/// `rdma_join_multicast`: a full-member join.
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_join_multicast(id: *mut rdma_cm_id, addr: *mut sockaddr, context: *mut c_void) -> c_int {
    guard("rdma_join_multicast", -1, || join(id, addr, RDMA_MC_JOIN_FLAG_FULLMEMBER, context))
}

/// `rdma_join_multicast_ex`: librdmacm's checks of the attributes
/// (unknown `comp_mask` bits: EOPNOTSUPP; no address, no join flags or
/// unknown flags: EINVAL), then the join.
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_join_multicast_ex(id: *mut rdma_cm_id, attr: *mut rdma_cm_join_mc_attr_ex, context: *mut c_void) -> c_int {
    guard("rdma_join_multicast_ex", -1, || {
        if attr.is_null() {
            return fail(libc::EINVAL);
        }
        let a = &*attr;
        if a.comp_mask >= RDMA_CM_JOIN_MC_ATTR_RESERVED {
            return fail(libc::EOPNOTSUPP);
        }
        if a.comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS == 0 || a.comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS == 0 {
            return fail(libc::EINVAL);
        }
        join(id, a.addr, a.join_flags, context)
    })
}

unsafe fn join(id: *mut rdma_cm_id, addr: *mut sockaddr, flags: u32, context: *mut c_void) -> c_int {
    if flags >= RDMA_MC_JOIN_FLAG_RESERVED {
        return fail(libc::EINVAL);
    }
    let send_only = flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER;
    let Some(group) = sa_to_std(addr) else { return fail(libc::EINVAL) };
    let r = with_cma(|c| -> Result<(NewEvent, *mut rdma_event_channel), c_int> {
        let s = st(c, id).ok_or(libc::EINVAL)?;
        // The kernel's rdma_join_multicast: a UD id, bound to a device or
        // with its address resolved (not listening, connecting, or past
        // route resolution).
        let Some(dev) = s.dev else { return Err(libc::EINVAL) };
        if (*id).qp_type != IBV_QPT_UD || s.listen.is_some() || s.cm.is_some() || !(*id).route.path_rec.is_null() {
            return Err(libc::EINVAL);
        }
        if s.joins.iter().any(|j| j.addr == group) {
            return Err(libc::EADDRINUSE);
        }
        let src = s.src.ok_or(libc::EINVAL)?;
        // cma_iboe_join_multicast: the zero address is EINVAL; so is an
        // address outside 224.0.0.0/4 and ff00::/8 (no multicast GID).
        let g = c.devs[dev].chan.multicast_group(group.ip(), src.ip()).map_err(|e| errno(&e))?;
        let qp = if send_only { None } else { crate::qp::uqp((*id).qp) };
        let attach = qp.map(|q| q.inner.attach_mcast(&g.gid));
        let attached = matches!(attach, Some(Ok(())));
        let ev = match attach {
            Some(Err(e)) => NewEvent::new(id as *mut UCmId, RDMA_CM_EVENT_MULTICAST_ERROR, -errno(&e)),
            _ => {
                let mut ah: ibv_ah_attr = std::mem::zeroed();
                ah.is_global = 1;
                ah.port_num = g.ah.port_num;
                ah.grh.dgid.raw = g.ah.dgid;
                ah.grh.sgid_index = g.ah.sgid_index;
                ah.grh.hop_limit = g.ah.hop_limit;
                ah.grh.traffic_class = g.ah.traffic_class;
                ah.grh.flow_label = g.ah.flow_label;
                let mut e = NewEvent::new(id as *mut UCmId, RDMA_CM_EVENT_MULTICAST_JOIN, 0);
                e.ud = Some((ah, g.qpn, g.qkey));
                e
            }
        };
        // librdmacm hands the join's context back as the event's private data.
        let mut ev = ev;
        ev.private_ptr = context;
        st(c, id).ok_or(libc::EINVAL)?.joins.push(Join { addr: group, group: g, attached });
        Ok((ev, (*id).channel))
    });
    match r {
        Ok((ev, ch)) => {
            push_event(ch, ev);
            sync_wait(id)
        }
        Err(e) => fail(e),
    }
}

/// `rdma_leave_multicast`: EADDRNOTAVAIL for a group the id has not joined
/// (librdmacm); the id's QP is detached from the group.
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_leave_multicast(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    guard("rdma_leave_multicast", -1, || {
        let Some(a) = sa_to_std(addr) else { return fail(libc::EINVAL) };
        let j = with_cma(|c| {
            let s = st(c, id).ok_or(libc::EINVAL)?;
            let i = s.joins.iter().position(|j| j.addr == a).ok_or(libc::EADDRNOTAVAIL)?;
            Ok(s.joins.remove(i))
        });
        match j {
            Ok(j) => {
                detach(id, &j);
                0
            }
            Err(e) => fail(e),
        }
    })
}

/// Leave every group of an id being destroyed.
pub(crate) unsafe fn leave_all(id: *mut rdma_cm_id, joins: &[Join]) {
    for j in joins {
        detach(id, j);
    }
}

unsafe fn detach(id: *mut rdma_cm_id, j: &Join) {
    if !j.attached {
        return;
    }
    // The program may have destroyed the QP (which left its groups).
    // It fails only if the program detached the QP itself (ibv_detach_mcast).
    if let Some(q) = crate::qp::uqp((*id).qp) {
        let _ = q.inner.detach_mcast(&j.group.gid);
    }
}
