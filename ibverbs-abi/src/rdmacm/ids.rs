//! What every id has: its state in the process's table, its route
//! (addresses and GIDs, as librdmacm's `ucma_query_route` reports them),
//! how a new one is made, and the private data sizes of the CM messages.
//! Below everything that makes or reports ids (`id`, `dispatch`, `mcast`).

use std::net::{IpAddr, SocketAddr};
use std::os::raw::c_void;

use rocev2::transport::attr::AddressVector;
use urnic::cm::PortSpace;

use super::addr::std_to_sa;
use super::{Cma, IdState, UCmId};
use crate::cmffi::*;
use crate::ffi::*;

/// The REQ's private data a listener sees (92 less RDMA-CM's header).
pub(crate) const REQ_PRIVATE: usize = 56;
/// The REP's private data (IBTA 12.6.8).
pub(crate) const REP_PRIVATE: usize = 196;
/// The REJ's private data (IBTA 12.6.7).
pub(crate) const REJ_PRIVATE: usize = 148;
/// SIDR_REQ's private data less RDMA-CM's header.
pub(crate) const SIDR_REQ_PRIVATE: usize = 180;
/// SIDR_REP's private data (IBTA 12.11.2).
pub(crate) const SIDR_REP_PRIVATE: usize = 136;

/// urnic's port space of a librdmacm one (TCP and UDP only).
pub(crate) fn space_of(ps: rdma_port_space) -> Option<PortSpace> {
    match ps {
        RDMA_PS_TCP => Some(PortSpace::Tcp),
        RDMA_PS_UDP => Some(PortSpace::Udp),
        _ => None,
    }
}

/// The state of a live id (None: not one of ours, or destroyed).
pub(crate) fn st(c: &mut Cma, id: *mut rdma_cm_id) -> Option<&mut IdState> {
    c.ids.get_mut(&(id as usize))
}

/// Write the route's addresses and GIDs as librdmacm's `ucma_query_route` does.
pub(crate) unsafe fn fill_route(id: *mut rdma_cm_id, src: Option<SocketAddr>, dst: Option<SocketAddr>) {
    let r = &mut (*id).route;
    let gid = |a: SocketAddr| match a.ip() {
        IpAddr::V4(v4) => AddressVector::ipv4_gid(v4.octets()),
        IpAddr::V6(v6) => v6.octets(),
    };
    let ib = r.addr.addr.ibaddr.as_mut();
    ib.pkey = 0xffffu16.to_be();
    if let Some(s) = src {
        std_to_sa(s, &mut r.addr.__bindgen_anon_1.src_addr as *mut sockaddr);
        ib.sgid.raw = gid(s);
    }
    if let Some(d) = dst {
        std_to_sa(d, &mut r.addr.__bindgen_anon_2.dst_addr as *mut sockaddr);
        ib.dgid.raw = gid(d);
    }
}

/// A new id on `channel` (its C struct boxed, its state registered).
pub(crate) unsafe fn new_id(
    c: &mut Cma,
    channel: *mut rdma_event_channel,
    context: *mut c_void,
    ps: rdma_port_space,
    qp_type: ibv_qp_type,
) -> *mut UCmId {
    let mut cid: rdma_cm_id = std::mem::zeroed();
    cid.channel = channel;
    cid.context = context;
    cid.ps = ps;
    cid.qp_type = qp_type;
    let p = Box::into_raw(Box::new(UCmId { id: cid }));
    c.ids.insert(p as usize, IdState::default());
    p
}
