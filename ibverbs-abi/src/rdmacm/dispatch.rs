//! One thread per opened device takes the CM agent's events off the
//! device's CM fd and queues them, as librdmacm reports them, on the event
//! channel of the id they belong to.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use urnic::cm::{CmChannel, CmEvent};

use super::event::{push_event, NewEvent};
use super::ids::{fill_route, new_id, REJ_PRIVATE, REP_PRIVATE, REQ_PRIVATE, SIDR_REP_PRIVATE, SIDR_REQ_PRIVATE};
use super::{with_cma, Cma, UCmId};
use crate::cmffi::*;
use crate::ffi::*;

/// Start `dev`'s dispatcher (it lives as long as the process, as the device).
pub(crate) fn start(dev: usize, ifname: &str, chan: Arc<CmChannel>) {
    let r = std::thread::Builder::new().name(format!("urnic-cma-{ifname}")).spawn(move || loop {
        match chan.get_event(Some(Duration::from_secs(60))) {
            Ok(Some(ev)) => with_cma(|c| unsafe { handle(c, dev, &chan, ev) }),
            Ok(None) => {}
            Err(e) => {
                eprintln!("urnic librdmacm: CM events of device {dev}: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    });
    if let Err(e) = r {
        eprintln!("urnic librdmacm: cannot start the CM event thread: {e}");
    }
}

/// The listener for a request to `dst` in `space` on `dev`.
fn listener(c: &Cma, dev: usize, space: urnic::cm::PortSpace, dst: SocketAddr) -> Option<usize> {
    let v = c.listeners.get(&(space.value(), dst.port()))?;
    v.iter().copied().find(|i| {
        c.ids.get(i).is_some_and(|s| match (s.dev, s.src) {
            (Some(d), Some(a)) => d == dev && (a.ip() == dst.ip() || a.ip().is_unspecified()),
            (None, _) => true,
            _ => false,
        })
    })
}

/// A new id for a request to listener `l`, on its channel.
unsafe fn child(c: &mut Cma, dev: usize, l: usize, cm: urnic::cm::CmId, src: SocketAddr, dst: SocketAddr) -> *mut UCmId {
    let lid = l as *mut rdma_cm_id;
    let p = new_id(c, (*lid).channel, (*lid).context, (*lid).ps, (*lid).qp_type);
    let id = p as *mut rdma_cm_id;
    (*id).verbs = c.devs[dev].verbs;
    (*id).port_num = 1;
    fill_route(id, Some(dst), Some(src));
    if let Some(s) = c.ids.get_mut(&(p as usize)) {
        s.dev = Some(dev);
        s.cm = Some(cm);
        s.src = Some(dst);
        s.dst = Some(src);
    }
    c.by_cm.insert((dev, cm), p as usize);
    p
}

unsafe fn handle(c: &mut Cma, dev: usize, chan: &CmChannel, ev: CmEvent) {
    use urnic::cm::PortSpace;
    let find = |c: &Cma, cm| c.by_cm.get(&(dev, cm)).copied();
    match ev {
        CmEvent::ConnectRequest(req) => {
            let Some(l) = listener(c, dev, PortSpace::Tcp, req.dst) else {
                // The listener went away meanwhile: refuse as the kernel does.
                let _ = chan.reject(req.id, &[]);
                return;
            };
            let p = child(c, dev, l, req.id, req.src, req.dst);
            let mut e = NewEvent::new(p, RDMA_CM_EVENT_CONNECT_REQUEST, 0).with_data(&req.private_data, REQ_PRIVATE);
            e.listen_id = l as *mut UCmId;
            e.conn.responder_resources = req.responder_resources;
            e.conn.initiator_depth = req.initiator_depth;
            e.conn.qp_num = req.remote_qpn;
            e.conn.retry_count = 7;
            e.conn.rnr_retry_count = 7;
            e.conn.flow_control = 1;
            let ch = (*(p as *mut rdma_cm_id)).channel;
            if let Some(s) = c.ids.get_mut(&(p as usize)) {
                s.req = Some(req);
            }
            push_event(ch, e);
        }
        CmEvent::UdRequest(req) => {
            let Some(l) = listener(c, dev, PortSpace::Udp, req.dst) else {
                let _ = chan.reject_ud(req.id, &[]);
                return;
            };
            let p = child(c, dev, l, req.id, req.src, req.dst);
            let mut e = NewEvent::new(p, RDMA_CM_EVENT_CONNECT_REQUEST, 0).with_data(&req.private_data, SIDR_REQ_PRIVATE);
            e.listen_id = l as *mut UCmId;
            e.ud = Some((std::mem::zeroed(), 0, 0));
            let ch = (*(p as *mut rdma_cm_id)).channel;
            if let Some(s) = c.ids.get_mut(&(p as usize)) {
                s.ud_req = Some(req);
            }
            push_event(ch, e);
        }
        CmEvent::ConnectResponse(rep) => {
            let Some(p) = find(c, rep.id) else {
                let _ = chan.reject(rep.id, &[]);
                return;
            };
            let id = p as *mut rdma_cm_id;
            let mut e = NewEvent::new(p as *mut UCmId, RDMA_CM_EVENT_ESTABLISHED, 0).with_data(&rep.private_data, REP_PRIVATE);
            e.conn.responder_resources = rep.responder_resources;
            e.conn.initiator_depth = rep.initiator_depth;
            e.conn.qp_num = rep.remote_qpn;
            let qp = crate::qp::uqp((*id).qp);
            match qp {
                // As librdmacm's ucma_process_conn_resp: RTR, RTS, RTU, and
                // ESTABLISHED carrying the REP's private data.
                Some(q) => match chan.complete_connect(&rep, &q.inner) {
                    Ok(()) => {
                        (*(*id).qp).state = IBV_QPS_RTS;
                        if let Some(s) = c.ids.get_mut(&p) {
                            s.hide_established = true;
                            s.connected = true;
                        }
                    }
                    Err(err) => {
                        let _ = chan.reject(rep.id, &[]);
                        e = NewEvent::new(p as *mut UCmId, RDMA_CM_EVENT_CONNECT_ERROR, -crate::errno_of(&err));
                    }
                },
                None => {
                    e.event = RDMA_CM_EVENT_CONNECT_RESPONSE;
                    if let Some(s) = c.ids.get_mut(&p) {
                        s.rep = Some(rep);
                        s.hide_established = true;
                    }
                }
            }
            push_event((*id).channel, e);
        }
        CmEvent::Established { id: cm } => {
            let Some(p) = find(c, cm) else { return };
            let Some(s) = c.ids.get_mut(&p) else { return };
            s.connected = true;
            if std::mem::take(&mut s.hide_established) {
                return;
            }
            push_event((*(p as *mut rdma_cm_id)).channel, NewEvent::new(p as *mut UCmId, RDMA_CM_EVENT_ESTABLISHED, 0));
        }
        CmEvent::UdResolved(r) => {
            let Some(p) = find(c, r.id) else { return };
            let mut ah: ibv_ah_attr = std::mem::zeroed();
            ah.is_global = 1;
            ah.port_num = 1;
            ah.grh.dgid.raw = r.ah.dgid;
            ah.grh.sgid_index = r.ah.sgid_index;
            ah.grh.hop_limit = r.ah.hop_limit;
            ah.grh.flow_label = r.ah.flow_label;
            ah.grh.traffic_class = r.ah.traffic_class;
            let mut e = NewEvent::new(p as *mut UCmId, RDMA_CM_EVENT_ESTABLISHED, 0).with_data(&r.private_data, SIDR_REP_PRIVATE);
            e.ud = Some((ah, r.qpn, r.qkey));
            push_event((*(p as *mut rdma_cm_id)).channel, e);
        }
        CmEvent::Rejected { id: cm, reason, private_data } => {
            let Some(p) = find(c, cm) else { return };
            let id = p as *mut rdma_cm_id;
            c.by_cm.remove(&(dev, cm));
            if let Some(s) = c.ids.get_mut(&p) {
                s.cm = None;
            }
            // A UD resolution refused (SIDR status): UNREACHABLE with the
            // status, as the kernel's cma_sidr_rep_handler reports it.
            let e = if (*id).qp_type == IBV_QPT_UD {
                NewEvent::new(p as *mut UCmId, RDMA_CM_EVENT_UNREACHABLE, i32::from(reason)).with_data(&private_data, SIDR_REP_PRIVATE)
            } else {
                NewEvent::new(p as *mut UCmId, RDMA_CM_EVENT_REJECTED, i32::from(reason)).with_data(&private_data, REJ_PRIVATE)
            };
            push_event((*id).channel, e);
        }
        CmEvent::Unreachable { id: cm } => {
            let Some(p) = find(c, cm) else { return };
            c.by_cm.remove(&(dev, cm));
            if let Some(s) = c.ids.get_mut(&p) {
                s.cm = None;
            }
            push_event((*(p as *mut rdma_cm_id)).channel, NewEvent::new(p as *mut UCmId, RDMA_CM_EVENT_UNREACHABLE, -libc::ETIMEDOUT));
        }
        CmEvent::Disconnected { id: cm } => {
            let Some(p) = find(c, cm) else { return };
            if let Some(s) = c.ids.get_mut(&p) {
                s.connected = false;
            }
            push_event((*(p as *mut rdma_cm_id)).channel, NewEvent::new(p as *mut UCmId, RDMA_CM_EVENT_DISCONNECTED, 0));
        }
        CmEvent::TimewaitExit { id: cm } => {
            let Some(p) = c.by_cm.remove(&(dev, cm)) else { return };
            if let Some(s) = c.ids.get_mut(&p) {
                s.cm = None;
            }
            push_event((*(p as *mut rdma_cm_id)).channel, NewEvent::new(p as *mut UCmId, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0));
        }
    }
}
