//! RDMA-CM (`librdmacm.so.1`) for urnic: rdma-core's `rdma_*` calls over
//! the CM agent of `urnic::cm::CmChannel` (QP1 of each device).
//!
//! **One copy of the device state.** RDMA-CM hands programs `ibv_context`s
//! (`rdma_cm_id.verbs`) and `ibv_qp`s (`rdma_create_qp`) that they then use
//! with libibverbs, and it needs the CM agent of the device those came from.
//! A second Rust static library in a second `.so` would carry its own copy
//! of every static (the device list, the open contexts, the datapath), so
//! the calls live here, in libibverbs.so.1, exported under the private
//! version node `URNIC_PRIVATE_1` as `urnic_rdma_*` (no other library
//! uses that node). `librdmacm.so.1` is a thin C file of forwarders
//! (`ibverbs-abi/rdmacm/librdmacm.c`) linked against our libibverbs.so.1
//! (DT_NEEDED) with librdmacm's version nodes (`librdmacm.map`), both
//! built by `ibverbs-abi/link.sh`.
//!
//! **Events.** Each event channel's fd is an eventfd in semaphore mode:
//! one count per queued event, so `poll` sees it readable while events wait
//! and `rdma_get_cm_event` blocks in `read` unless the program made the fd
//! O_NONBLOCK. Address and route resolution finish inside the call (the
//! kernel's neighbour table answers at once) and queue their event; the CM
//! agent's events are taken off each device's CM fd by one thread per
//! device (`dispatch`), translated as librdmacm does (a REP with a QP made
//! by `rdma_create_qp` moves the QP to RTR/RTS, sends the RTU and reports
//! ESTABLISHED with the REP's private data) and queued on the channel of
//! the id they name.
//!
//! Synchronous ids (`rdma_create_id` with a NULL channel, `rdma_create_ep`)
//! get a private channel and each call waits for its event, as librdmacm
//! does.
//!
//! **Modules**, each using only those before it (and this one's state):
//! `addr` (addresses, routes, `rdma_getaddrinfo`), `event` (channels and
//! events), `ids` (an id's table entry and route), `dispatch` (the CM
//! agent's events onto channels), `devs` (opening devices, which starts
//! their dispatchers), then the calls on ids: `qp`, `mcast`, `id`.

mod addr;
mod devs;
mod dispatch;
mod event;
mod id;
mod ids;
mod mcast;
mod qp;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use crate::cmffi::*;
use crate::ffi::*;
use crate::{guard, lock};

pub use devs::*;
pub use event::*;
pub use id::*;
pub use mcast::*;
pub use qp::*;

/// A device RDMA-CM has opened (through `ibv_open_device`, so the context
/// is the one libibverbs calls accept), with its CM channel.
pub(crate) struct CmDev {
    pub(crate) ifname: String,
    pub(crate) verbs: *mut ibv_context,
    pub(crate) chan: Arc<urnic::cm::CmChannel>,
    /// The PD `rdma_create_qp` uses when given none (librdmacm's per-device PD).
    pub(crate) pd: *mut ibv_pd,
}

/// What RDMA-CM keeps of one `rdma_cm_id` besides the C struct.
#[derive(Default)]
pub(crate) struct IdState {
    /// Index into `Cma::devs` once bound to a device.
    pub(crate) dev: Option<usize>,
    /// The CM agent's id (after connect, or for a request's new id).
    pub(crate) cm: Option<urnic::cm::CmId>,
    pub(crate) src: Option<SocketAddr>,
    pub(crate) dst: Option<SocketAddr>,
    /// Listening on (port space, port).
    pub(crate) listen: Option<(urnic::cm::PortSpace, u16)>,
    pub(crate) backlog: usize,
    /// A connect request waiting for accept or reject.
    pub(crate) req: Option<Box<urnic::cm::ConnectRequest>>,
    pub(crate) ud_req: Option<Box<urnic::cm::UdRequest>>,
    /// A REP reported as CONNECT_RESPONSE (no QP made by `rdma_create_qp`).
    pub(crate) rep: Option<Box<urnic::cm::ConnectResponse>>,
    /// Active side whose RTU we sent: the agent's Established is ours to hide
    /// (ESTABLISHED was already reported with the REP's private data).
    pub(crate) hide_established: bool,
    pub(crate) connected: bool,
    /// `rdma_create_ep` on a passive id: the QP each request gets in
    /// `rdma_get_request`.
    pub(crate) ep_qp_attr: Option<ibv_qp_init_attr>,
    /// A private channel (synchronous id), destroyed with the id.
    pub(crate) own_channel: bool,
    pub(crate) tos: u8,
    pub(crate) reuseaddr: bool,
    pub(crate) afonly: bool,
    /// Multicast groups joined (`rdma_join_multicast`).
    pub(crate) joins: Vec<Join>,
}

/// One multicast group an id has joined (`rdma_join_multicast`).
pub(crate) struct Join {
    /// The address the program joined (a leave names it the same way).
    pub(crate) addr: SocketAddr,
    pub(crate) group: urnic::cm::McastGroup,
    /// The id's QP was attached to the group.
    pub(crate) attached: bool,
}

/// The process's RDMA-CM state (one lock; never held while blocking).
#[derive(Default)]
pub(crate) struct Cma {
    pub(crate) devs: Vec<CmDev>,
    /// Every live id (address of its `UCmId`) and its state.
    pub(crate) ids: HashMap<usize, IdState>,
    /// (device, agent id) → id.
    pub(crate) by_cm: HashMap<(usize, urnic::cm::CmId), usize>,
    /// (port space value, port) → listening ids.
    pub(crate) listeners: HashMap<(u16, u16), Vec<usize>>,
    /// Bound (port space value, port) → ids, for EADDRINUSE.
    pub(crate) bound: HashMap<(u16, u16), Vec<usize>>,
}

// SAFETY: the raw pointers in `Cma` name leaked or boxed C objects that
// live until the calls that free them, which take this lock first.
unsafe impl Send for Cma {}

pub(crate) static CMA: Mutex<Option<Cma>> = Mutex::new(None);

/// Run `f` on the state (created on first use).
pub(crate) fn with_cma<R>(f: impl FnOnce(&mut Cma) -> R) -> R {
    let mut g = lock(&CMA);
    f(g.get_or_insert_with(Cma::default))
}

/// `struct rdma_cm_id` as RDMA-CM allocates it (the state is in `Cma::ids`).
#[repr(C)]
pub(crate) struct UCmId {
    pub(crate) id: rdma_cm_id,
}

/// Fail with -1 and errno `e` (librdmacm's convention).
pub(crate) fn fail(e: i32) -> i32 {
    crate::set_errno(e);
    -1
}

/// The errno of an urnic error.
pub(crate) fn errno(e: &urnic::Error) -> i32 {
    crate::errno_of(e)
}

/// At process exit (librdmacm.so's destructor): release the ids the program
/// left, let each device's CM agent put what it owes (a DREP, a DREQ, a
/// REJ) on the wire, and flush the
/// capture of `URNIC_PCAP`, since RDMA-CM keeps its devices open for the
/// life of the process and no `ibv_close_device` does it.
#[no_mangle]
pub extern "C" fn urnic_rdma_fini() {
    guard("librdmacm fini", (), || {
        // What the kernel does when a process's ucma file closes: every id
        // still connected or connecting is destroyed, which sends what the
        // protocol owes (DREP to a DREQ, DREQ, REJ to a pending request).
        let devs: Vec<(Arc<urnic::cm::CmChannel>, *mut ibv_context)> = with_cma(|c| {
            for s in c.ids.values_mut() {
                if let (Some(d), Some(cm)) = (s.dev, s.cm.take()) {
                    let _ = c.devs[d].chan.destroy_id(cm);
                }
            }
            c.by_cm.clear();
            c.devs.iter().map(|d| (d.chan.clone(), d.verbs)).collect()
        });
        for (chan, verbs) in devs {
            chan.drain(std::time::Duration::from_millis(500));
            // SAFETY: RDMA-CM's contexts are never closed.
            if let Some(u) = unsafe { crate::ctx::uctx(verbs) } {
                if std::env::var_os("URNIC_PCAP").is_some() {
                    let _ = u.ctx.nic().set_capture(None);
                }
            }
        }
    })
}
