//! CM ids: create/destroy, bind, resolve, listen, connect, accept, reject,
//! disconnect, establish, options, addresses, and the synchronous helpers
//! `rdma_create_ep` / `rdma_get_request`.

use std::net::SocketAddr;
use std::os::raw::{c_int, c_void};
use std::ptr;

use urnic::cm::ConnParam;

use super::addr::{ifname_of_local, route_to, sa_to_std};
use super::devs::{open_all, open_dev};
use super::event::{drop_events_of, push_event, sync_wait, uchannel, NewEvent, UEventChannel};
use super::ids::{fill_route, new_id, space_of, st, REP_PRIVATE, REQ_PRIVATE, SIDR_REP_PRIVATE, SIDR_REQ_PRIVATE};
use super::{errno, fail, with_cma, Cma, UCmId};
use crate::cmffi::*;
use crate::ffi::*;
use crate::guard;

/// `RDMA_MAX_RESP_RES` / `RDMA_MAX_INIT_DEPTH`: "as many as the device has".
const RDMA_MAX: u8 = 0xFF;

/// `rdma_create_id`: RDMA_PS_TCP (RC) or RDMA_PS_UDP (UD); a NULL channel
/// makes a synchronous id.
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: rdma_port_space,
) -> c_int {
    guard("rdma_create_id", -1, || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        let qp_type = match ps {
            RDMA_PS_TCP => IBV_QPT_RC,
            RDMA_PS_UDP => IBV_QPT_UD,
            // RDMA_PS_IB (no IP header) and IPoIB: not offered.
            RDMA_PS_IB | RDMA_PS_IPOIB => return fail(libc::EPROTONOSUPPORT),
            // The kernel's ucma_get_qp_type: any other port space is EINVAL.
            _ => return fail(libc::EINVAL),
        };
        create_id(channel, id, context, ps, qp_type)
    })
}

unsafe fn create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: rdma_port_space,
    qp_type: ibv_qp_type,
) -> c_int {
    let (ch, own) = if channel.is_null() {
        let ch = super::event::urnic_rdma_create_event_channel();
        if ch.is_null() {
            return -1;
        }
        (ch, true)
    } else {
        (channel, false)
    };
    let p = with_cma(|c| {
        let p = new_id(c, ch, context, ps, qp_type);
        if let Some(s) = c.ids.get_mut(&(p as usize)) {
            s.own_channel = own;
        }
        p
    });
    *id = p as *mut rdma_cm_id;
    0
}

/// `rdma_destroy_id`: what the CM still owes the peer is sent (DREQ, REJ);
/// no more events; the CQs `rdma_create_qp` made are destroyed.
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    guard("rdma_destroy_id", -1, || {
        let Some(s) = with_cma(|c| c.ids.remove(&(id as usize))) else { return fail(libc::EINVAL) };
        with_cma(|c| {
            if let (Some(d), Some(cm)) = (s.dev, s.cm) {
                c.by_cm.remove(&(d, cm));
                let _ = c.devs[d].chan.destroy_id(cm);
            }
            if let Some((space, port)) = s.listen {
                let key = (space.value(), port);
                let others = match c.listeners.get_mut(&key) {
                    Some(v) => {
                        v.retain(|&i| i != id as usize);
                        v.len()
                    }
                    None => 0,
                };
                if others == 0 {
                    c.listeners.remove(&key);
                    for d in &c.devs {
                        let _ = d.chan.unlisten(space, port);
                    }
                }
            }
            if let Some(src) = s.src {
                if let Some(v) = c.bound.get_mut(&((*id).ps as u16, src.port())) {
                    v.retain(|&i| i != id as usize);
                }
            }
        });
        super::mcast::leave_all(id, &s.joins);
        drop_events_of((*id).channel, id as *mut UCmId);
        super::qp::destroy_cqs(id);
        libc::free((*id).route.path_rec.cast());
        if s.own_channel {
            super::event::urnic_rdma_destroy_event_channel((*id).channel);
        }
        drop(Box::from_raw(id as *mut UCmId));
        0
    })
}

/// Bind `id` to `addr` (a local address of an urnic device, or the wildcard).
unsafe fn bind(c: &mut Cma, id: *mut rdma_cm_id, addr: SocketAddr) -> Result<(), c_int> {
    let ps = (*id).ps as u16;
    let Some(s) = st(c, id) else { return Err(libc::EINVAL) };
    if s.src.is_some() {
        return Err(libc::EINVAL);
    }
    let dev = if addr.ip().is_unspecified() { None } else { Some(open_dev(c, &ifname_of_local(addr.ip())?)?) };
    let port = if addr.port() == 0 {
        loop {
            let p = urnic::cm::ephemeral_port();
            if c.bound.get(&(ps, p)).is_none_or(|v| v.is_empty()) {
                break p;
            }
        }
    } else {
        addr.port()
    };
    // A port is taken when another id holds it on the same address or
    // either is the wildcard (REUSEADDR lets listeners share it after close).
    if let Some(v) = c.bound.get(&(ps, port)) {
        for &o in v {
            let os = &c.ids[&o];
            if let Some(oa) = os.src {
                if oa.ip().is_unspecified() || addr.ip().is_unspecified() || oa.ip() == addr.ip() {
                    return Err(libc::EADDRINUSE);
                }
            }
        }
    }
    c.bound.entry((ps, port)).or_default().push(id as usize);
    let src = SocketAddr::new(addr.ip(), port);
    let s = st(c, id).ok_or(libc::EINVAL)?;
    s.src = Some(src);
    s.dev = dev;
    if let Some(d) = dev {
        (*id).verbs = c.devs[d].verbs;
        (*id).port_num = 1;
    }
    fill_route(id, Some(src), None);
    Ok(())
}

/// `rdma_bind_addr`.
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    guard("rdma_bind_addr", -1, || {
        let Some(a) = sa_to_std(addr) else { return fail(if addr.is_null() { libc::EINVAL } else { libc::EAFNOSUPPORT }) };
        match with_cma(|c| bind(c, id, a)) {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

/// `rdma_resolve_addr`: the device that owns `src` (or routes to `dst`),
/// the peer's MAC from the kernel's neighbour table; ADDR_RESOLVED or
/// ADDR_ERROR is queued at once.
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_resolve_addr(id: *mut rdma_cm_id, src: *mut sockaddr, dst: *mut sockaddr, _timeout_ms: c_int) -> c_int {
    guard("rdma_resolve_addr", -1, || {
        let Some(d) = sa_to_std(dst) else { return fail(if dst.is_null() { libc::EINVAL } else { libc::EAFNOSUPPORT }) };
        let r = with_cma(|c| -> Result<Result<(), c_int>, c_int> {
            let s = st(c, id).ok_or(libc::EINVAL)?;
            if s.cm.is_some() || s.listen.is_some() {
                return Err(libc::EINVAL);
            }
            if s.src.is_none() {
                let local = match sa_to_std(src) {
                    Some(a) => a,
                    None => {
                        let (ip, _) = route_to(d.ip())?;
                        SocketAddr::new(ip, 0)
                    }
                };
                bind(c, id, local)?;
            }
            let s = st(c, id).ok_or(libc::EINVAL)?;
            let mut srca = s.src.ok_or(libc::EINVAL)?;
            if srca.ip().is_unspecified() || s.dev.is_none() {
                let (ip, ifname) = route_to(d.ip())?;
                let dev = open_dev(c, &ifname)?;
                srca = SocketAddr::new(ip, srca.port());
                let s = st(c, id).ok_or(libc::EINVAL)?;
                s.dev = Some(dev);
                s.src = Some(srca);
                (*id).verbs = c.devs[dev].verbs;
                (*id).port_num = 1;
            }
            let s = st(c, id).ok_or(libc::EINVAL)?;
            s.dst = Some(d);
            let dev = s.dev.ok_or(libc::EINVAL)?;
            fill_route(id, Some(srca), Some(d));
            // The neighbour table must know the peer (as the kernel's
            // rdma_resolve_ip): ADDR_ERROR otherwise.
            let u = crate::ctx::uctx(c.devs[dev].verbs).ok_or(libc::ENODEV)?;
            let gid = (*id).route.addr.addr.ibaddr.as_ref().dgid.raw;
            Ok(u.ctx.resolve_mac(&gid).map(|_| ()).map_err(|e| errno(&e)))
        });
        let ok = match r {
            Err(e) => return fail(e),
            Ok(ok) => ok,
        };
        let ev = match ok {
            Ok(()) => NewEvent::new(id as *mut UCmId, RDMA_CM_EVENT_ADDR_RESOLVED, 0),
            Err(e) => NewEvent::new(id as *mut UCmId, RDMA_CM_EVENT_ADDR_ERROR, -e),
        };
        push_event((*id).channel, ev);
        sync_wait(id)
    })
}

/// `rdma_resolve_route`: RoCE needs no SA query; the path is the resolved
/// address pair (one `ibv_sa_path_rec`); ROUTE_RESOLVED is queued.
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    guard("rdma_resolve_route", -1, || {
        let ok = with_cma(|c| st(c, id).is_some_and(|s| s.dst.is_some() && s.dev.is_some()));
        if !ok {
            return fail(libc::EINVAL);
        }
        if (*id).route.path_rec.is_null() {
            let p = libc::calloc(1, std::mem::size_of::<ibv_sa_path_rec>()) as *mut ibv_sa_path_rec;
            if p.is_null() {
                return fail(libc::ENOMEM);
            }
            let ib = (*id).route.addr.addr.ibaddr.as_ref();
            (*p).sgid = ib.sgid;
            (*p).dgid = ib.dgid;
            (*p).pkey = ib.pkey;
            (*p).hop_limit = 64;
            (*p).reversible = 1;
            (*p).numb_path = 1;
            (*p).mtu = IBV_MTU_1024 as u8;
            (*id).route.path_rec = p;
            (*id).route.num_paths = 1;
        }
        push_event((*id).channel, NewEvent::new(id as *mut UCmId, RDMA_CM_EVENT_ROUTE_RESOLVED, 0));
        sync_wait(id)
    })
}

/// `rdma_listen`: on the bound device, or every urnic device for the
/// wildcard address.
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    guard("rdma_listen", -1, || {
        let Some(space) = space_of((*id).ps) else { return fail(libc::EINVAL) };
        let r = with_cma(|c| -> Result<(), c_int> {
            let s = st(c, id).ok_or(libc::EINVAL)?;
            if s.listen.is_some() || s.cm.is_some() {
                return Err(libc::EINVAL);
            }
            if s.src.is_none() {
                bind(c, id, (std::net::Ipv4Addr::UNSPECIFIED, 0).into())?;
            }
            let s = st(c, id).ok_or(libc::EINVAL)?;
            let port = s.src.ok_or(libc::EINVAL)?.port();
            let backlog = if backlog <= 0 { 128 } else { backlog as usize };
            let devs = match s.dev {
                Some(d) => vec![d],
                None => open_all(c),
            };
            if devs.is_empty() {
                return Err(libc::ENODEV);
            }
            let key = (space.value(), port);
            if !c.listeners.contains_key(&key) {
                for &d in &devs {
                    if let Err(e) = c.devs[d].chan.listen(space, port, backlog) {
                        return Err(if e.kind() == urnic::ErrorKind::Busy { libc::EADDRINUSE } else { errno(&e) });
                    }
                }
            }
            c.listeners.entry(key).or_default().push(id as usize);
            let s = st(c, id).ok_or(libc::EINVAL)?;
            s.listen = Some((space, port));
            s.backlog = backlog;
            Ok(())
        });
        match r {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

/// The urnic QP for `id`: the one `rdma_create_qp` made, or the program's
/// own named by `qp_num` (looked up on the id's device).
unsafe fn qp_for<'a>(id: *mut rdma_cm_id, qp_num: Option<u32>) -> Option<(&'a urnic::Qp, *mut ibv_qp)> {
    let qp = if !(*id).qp.is_null() {
        (*id).qp
    } else {
        let u = crate::ctx::uctx((*id).verbs)?;
        let n = qp_num?;
        let p = crate::lock(&u.qps).get(&n).copied()?;
        p as *mut ibv_qp
    };
    crate::qp::uqp(qp).map(|q| (&q.inner, qp))
}

/// READ depth the device allows (`RDMA_MAX_*` asks for it).
unsafe fn rd_max(id: *mut rdma_cm_id) -> u8 {
    crate::ctx::uctx((*id).verbs).map_or(1, |u| u.ctx.query_device().limits.max_qp_rd_atom.min(255) as u8)
}

unsafe fn private_of(p: *const rdma_conn_param, max: usize) -> Result<Vec<u8>, c_int> {
    if p.is_null() || (*p).private_data.is_null() || (*p).private_data_len == 0 {
        return Ok(vec![]);
    }
    let n = usize::from((*p).private_data_len);
    if n > max {
        return Err(libc::EINVAL);
    }
    Ok(std::slice::from_raw_parts((*p).private_data as *const u8, n).to_vec())
}

unsafe fn conn_param(id: *mut rdma_cm_id, p: *const rdma_conn_param, max_private: usize) -> Result<ConnParam, c_int> {
    let dmax = rd_max(id);
    let pick = |v: u8| if v == RDMA_MAX { dmax } else { v.min(dmax) };
    let mut cp = ConnParam { private_data: private_of(p, max_private)?, ..ConnParam::default() };
    if !p.is_null() {
        cp.responder_resources = pick((*p).responder_resources);
        cp.initiator_depth = pick((*p).initiator_depth);
        cp.retry_count = (*p).retry_count.min(7);
        cp.rnr_retry_count = (*p).rnr_retry_count.min(7);
    } else {
        cp.responder_resources = dmax;
        cp.initiator_depth = dmax;
    }
    Ok(cp)
}

/// `rdma_connect`: a REQ (RC/UC) or a SIDR_REQ (UD) to the resolved address.
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_connect(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    guard("rdma_connect", -1, || {
        let ud = (*id).qp_type == IBV_QPT_UD || (*id).ps == RDMA_PS_UDP;
        let r = with_cma(|c| -> Result<(), c_int> {
            let s = st(c, id).ok_or(libc::EINVAL)?;
            let (Some(dev), Some(dst), Some(src)) = (s.dev, s.dst, s.src) else { return Err(libc::EINVAL) };
            if s.cm.is_some() {
                return Err(libc::EISCONN);
            }
            let chan = c.devs[dev].chan.clone();
            let cm = if ud {
                let data = private_of(param, SIDR_REQ_PRIVATE)?;
                chan.resolve_ud(Some(src.port()), dst, &data).map_err(|e| errno(&e))?
            } else {
                let qpn = (!param.is_null()).then(|| (*param).qp_num);
                let Some((qp, cqp)) = qp_for(id, qpn) else { return Err(libc::EINVAL) };
                let cp = conn_param(id, param, REQ_PRIVATE)?;
                let cm = chan.connect_from(qp, Some(src.port()), dst, &cp).map_err(|e| errno(&e))?;
                if (*cqp).state == IBV_QPS_RESET {
                    (*cqp).state = IBV_QPS_INIT;
                }
                cm
            };
            c.by_cm.insert((dev, cm), id as usize);
            st(c, id).ok_or(libc::EINVAL)?.cm = Some(cm);
            Ok(())
        });
        match r {
            Ok(()) => sync_wait(id),
            Err(e) => fail(e),
        }
    })
}

/// `rdma_accept`: the REP (RC/UC: the QP goes to RTS) or the SIDR_REP (UD).
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_accept(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    guard("rdma_accept", -1, || {
        let r = with_cma(|c| -> Result<(), c_int> {
            let s = c.ids.get_mut(&(id as usize)).ok_or(libc::EINVAL)?;
            let dev = s.dev.ok_or(libc::EINVAL)?;
            let chan = c.devs[dev].chan.clone();
            let qpn = (!param.is_null()).then(|| (*param).qp_num);
            if let Some(req) = s.ud_req.take() {
                let data = private_of(param, SIDR_REP_PRIVATE)?;
                let qpn = if !(*id).qp.is_null() { (*(*id).qp).qp_num } else { qpn.ok_or(libc::EINVAL)? };
                return chan.accept_ud(&req, qpn, rocev2::cm::cma::RDMA_UDP_QKEY, &data).map_err(|e| errno(&e));
            }
            let req = s.req.take().ok_or(libc::EINVAL)?;
            let mut cp = conn_param(id, param, REP_PRIVATE)?;
            if param.is_null() {
                cp.responder_resources = req.initiator_depth;
                cp.initiator_depth = req.responder_resources;
            }
            if (*id).qp.is_null() {
                // The program's own QP, moved by itself with
                // rdma_init_qp_attr (as librdmacm leaves it): only the REP.
                let r = match qpn {
                    Some(n) if n != 0 => chan.accept_qpn(&req, n, &cp).map_err(|e| errno(&e)),
                    _ => Err(libc::EINVAL),
                };
                if r.is_err() {
                    st(c, id).ok_or(libc::EINVAL)?.req = Some(req);
                }
                return r;
            }
            let Some((qp, cqp)) = qp_for(id, None) else {
                st(c, id).ok_or(libc::EINVAL)?.req = Some(req);
                return Err(libc::EINVAL);
            };
            match chan.accept(&req, qp, &cp) {
                Ok(()) => {
                    (*cqp).state = IBV_QPS_RTS;
                    Ok(())
                }
                Err(e) => {
                    st(c, id).ok_or(libc::EINVAL)?.req = Some(req);
                    Err(errno(&e))
                }
            }
        });
        if let Err(e) = r {
            return fail(e);
        }
        if (*id).qp_type == IBV_QPT_UD {
            return 0;
        }
        sync_wait(id)
    })
}

/// `rdma_reject`: REJ 28 "consumer defined" with the private data (UD:
/// SIDR_REP status 2).
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_reject(id: *mut rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    guard("rdma_reject", -1, || {
        let d = if data.is_null() || len == 0 { vec![] } else { std::slice::from_raw_parts(data as *const u8, usize::from(len)).to_vec() };
        let r = with_cma(|c| -> Result<(), c_int> {
            let s = c.ids.get_mut(&(id as usize)).ok_or(libc::EINVAL)?;
            let dev = s.dev.ok_or(libc::EINVAL)?;
            let cm = s.cm.ok_or(libc::EINVAL)?;
            let chan = c.devs[dev].chan.clone();
            if s.ud_req.take().is_some() {
                return chan.reject_ud(cm, &d).map_err(|e| errno(&e));
            }
            s.req = None;
            s.rep = None;
            chan.reject(cm, &d).map_err(|e| errno(&e))
        });
        match r {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

/// `rdma_disconnect`: the QP to ERR and a DREQ (or the DREP to the peer's).
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    guard("rdma_disconnect", -1, || {
        let r = with_cma(|c| -> Result<(), c_int> {
            let s = st(c, id).ok_or(libc::EINVAL)?;
            let (Some(dev), Some(cm)) = (s.dev, s.cm) else { return Err(libc::EINVAL) };
            let chan = c.devs[dev].chan.clone();
            let q = qp_for(id, None);
            if let Some((_, cqp)) = q {
                (*cqp).state = IBV_QPS_ERR;
            }
            chan.disconnect(cm, q.map(|(qp, _)| qp)).map_err(|e| errno(&e))
        });
        match r {
            Ok(()) => sync_wait(id),
            Err(e) => fail(e),
        }
    })
}

/// `rdma_establish`: active side after CONNECT_RESPONSE with a QP the
/// program moved itself: the RTU; passive side: traffic came first.
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_establish(id: *mut rdma_cm_id) -> c_int {
    guard("rdma_establish", -1, || {
        let r = with_cma(|c| -> Result<(), c_int> {
            let s = c.ids.get_mut(&(id as usize)).ok_or(libc::EINVAL)?;
            let (Some(dev), Some(cm)) = (s.dev, s.cm) else { return Err(libc::EINVAL) };
            let chan = c.devs[dev].chan.clone();
            match s.rep.take() {
                // The RTU; no ESTABLISHED follows (librdmacm reports none
                // after rdma_establish: the program knows).
                Some(rep) => chan.ready_to_use(&rep).map_err(|e| errno(&e)),
                None => chan.establish(cm).map_err(|e| errno(&e)),
            }
        });
        match r {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

/// `rdma_migrate_id`: move `id` (and its queued events) to `channel`
/// (NULL: a private channel, the id becomes synchronous).
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_migrate_id(id: *mut rdma_cm_id, channel: *mut rdma_event_channel) -> c_int {
    guard("rdma_migrate_id", -1, || {
        if !with_cma(|c| c.ids.contains_key(&(id as usize))) {
            return fail(libc::EINVAL);
        }
        let (ch, own) = if channel.is_null() {
            let ch = super::event::urnic_rdma_create_event_channel();
            if ch.is_null() {
                return -1;
            }
            (ch, true)
        } else {
            (channel, false)
        };
        migrate(id, ch, own);
        0
    })
}

pub(crate) unsafe fn migrate(id: *mut rdma_cm_id, ch: *mut rdma_event_channel, own: bool) {
    let old = (*id).channel;
    if let (Some(o), Some(n)) = (uchannel(old), uchannel(ch)) {
        let moved: Vec<_> = {
            let mut q = crate::lock(&o.queue);
            let (m, keep): (Vec<_>, Vec<_>) = q.drain(..).partition(|e| e.ev.id == id);
            q.extend(keep);
            m
        };
        for e in moved {
            crate::lock(&n.queue).push_back(e);
            let one = 1u64;
            libc::write(n.ch.fd, (&one as *const u64).cast(), 8);
        }
    }
    (*id).channel = ch;
    let was_own = with_cma(|c| {
        st(c, id).map(|s| {
            let w = s.own_channel;
            s.own_channel = own;
            w
        })
    });
    if was_own == Some(true) {
        let b = Box::from_raw(old as *mut UEventChannel);
        libc::close(b.ch.fd);
    }
}

/// `rdma_set_option`: RDMA_OPTION_ID TOS, REUSEADDR, AFONLY and ACK_TIMEOUT
/// are taken; RDMA_OPTION_IB_PATH (a path record for IB) is not urnic's.
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_set_option(id: *mut rdma_cm_id, level: c_int, optname: c_int, optval: *mut c_void, optlen: usize) -> c_int {
    guard("rdma_set_option", -1, || {
        if optval.is_null() {
            return fail(libc::EINVAL);
        }
        let r = with_cma(|c| -> Result<(), c_int> {
            let s = st(c, id).ok_or(libc::EINVAL)?;
            match (level as u32, optname as u32) {
                (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) if optlen == 1 => s.tos = *(optval as *const u8),
                (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR) if optlen == 4 => s.reuseaddr = *(optval as *const c_int) != 0,
                (RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY) if optlen == 4 => s.afonly = *(optval as *const c_int) != 0,
                (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) if optlen == 1 => {}
                (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => return Err(libc::ENOSYS),
                _ => return Err(libc::EINVAL),
            }
            Ok(())
        });
        match r {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

unsafe fn port_of(id: *mut rdma_cm_id, src: bool) -> u16 {
    with_cma(|c| st(c, id).and_then(|s| if src { s.src } else { s.dst }).map_or(0, |a| a.port().to_be()))
}

/// `rdma_get_src_port` (network byte order; 0 if none).
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    port_of(id, true)
}

/// `rdma_get_dst_port` (network byte order; 0 if none).
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    port_of(id, false)
}

/// `rdma_get_request`: the next connect request of a synchronous listener
/// (its id synchronous too, with the QP `rdma_create_ep` asked for).
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_get_request(listen: *mut rdma_cm_id, id: *mut *mut rdma_cm_id) -> c_int {
    guard("rdma_get_request", -1, || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        let Some((sync, attr)) = with_cma(|c| st(c, listen).map(|s| (s.own_channel, s.ep_qp_attr))) else { return fail(libc::EINVAL) };
        if !sync {
            return fail(libc::EINVAL);
        }
        let ev = match super::event::next_event((*listen).channel) {
            Ok(e) => e,
            Err(e) => return fail(e),
        };
        if ev.ev.event != RDMA_CM_EVENT_CONNECT_REQUEST {
            let status = ev.ev.status;
            return fail(if status < 0 { -status } else { libc::ECONNABORTED });
        }
        let new = ev.ev.id;
        drop(ev);
        let ch = super::event::urnic_rdma_create_event_channel();
        if ch.is_null() {
            return -1;
        }
        migrate(new, ch, true);
        if let Some(mut a) = attr {
            if super::qp::urnic_rdma_create_qp(new, (*listen).pd, &mut a) != 0 {
                let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL);
                let _ = urnic_rdma_reject(new, ptr::null(), 0);
                urnic_rdma_destroy_id(new);
                return fail(e);
            }
        }
        *id = new;
        0
    })
}

/// `rdma_create_ep`: a synchronous id from `rdma_getaddrinfo`'s answer:
/// passive (RAI_PASSIVE) bound to the source, its requests getting
/// `qp_init_attr`'s QP; active resolved (address and route) with its QP.
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard("rdma_create_ep", -1, || {
        if id.is_null() || res.is_null() {
            return fail(libc::EINVAL);
        }
        let r = &*res;
        let ps = if r.ai_port_space != 0 { r.ai_port_space as rdma_port_space } else { RDMA_PS_TCP };
        let qpt = if r.ai_qp_type != 0 {
            r.ai_qp_type as ibv_qp_type
        } else if ps == RDMA_PS_UDP {
            IBV_QPT_UD
        } else {
            IBV_QPT_RC
        };
        if space_of(ps).is_none() {
            return fail(libc::EPROTONOSUPPORT);
        }
        let mut cid: *mut rdma_cm_id = ptr::null_mut();
        if create_id(ptr::null_mut(), &mut cid, ptr::null_mut(), ps, qpt) != 0 {
            return -1;
        }
        let done = |rc: c_int| {
            if rc != 0 {
                let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL);
                urnic_rdma_destroy_id(cid);
                return fail(e);
            }
            0
        };
        if r.ai_flags as u32 & RAI_PASSIVE != 0 {
            if done(urnic_rdma_bind_addr(cid, r.ai_src_addr)) != 0 {
                return -1;
            }
            if !qp_init_attr.is_null() {
                // librdmacm: the QP type is the address info's.
                let mut a = *qp_init_attr;
                a.qp_type = qpt;
                with_cma(|c| {
                    if let Some(s) = st(c, cid) {
                        s.ep_qp_attr = Some(a);
                    }
                });
            }
            (*cid).pd = pd;
        } else {
            if done(urnic_rdma_resolve_addr(cid, r.ai_src_addr, r.ai_dst_addr, 2000)) != 0 {
                return -1;
            }
            if done(urnic_rdma_resolve_route(cid, 2000)) != 0 {
                return -1;
            }
            if !qp_init_attr.is_null() {
                (*qp_init_attr).qp_type = qpt;
                if done(super::qp::urnic_rdma_create_qp(cid, pd, qp_init_attr)) != 0 {
                    return -1;
                }
            }
        }
        *id = cid;
        0
    })
}

/// `rdma_destroy_ep`: its QP, CQs and the id.
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_destroy_ep(id: *mut rdma_cm_id) {
    guard("rdma_destroy_ep", (), || {
        if id.is_null() {
            return;
        }
        if !(*id).qp.is_null() {
            super::qp::urnic_rdma_destroy_qp(id);
        }
        urnic_rdma_destroy_id(id);
    })
}
