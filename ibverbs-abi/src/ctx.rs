//! The open device as the library keeps it: `verbs_context` (whose last
//! field is the `ibv_context` programs hold) followed by urnic's state, and
//! the way back from an `ibv_context` pointer to it. Every other module
//! reaches the context through here.

use std::collections::HashMap;
use std::os::raw::c_int;
use std::sync::Mutex;

use crate::ffi::*;
use crate::lock;

/// An open device: `verbs_context` (whose last field is the `ibv_context`
/// programs hold) followed by urnic's state.
#[repr(C)]
pub(crate) struct UContext {
    pub(crate) vctx: verbs_context,
    pub(crate) ctx: urnic::Context,
    pub(crate) async_fd: c_int,
    /// QPs and SRQs by number, for asynchronous events.
    pub(crate) qps: Mutex<HashMap<u32, usize>>,
    pub(crate) srqs: Mutex<HashMap<u32, usize>>,
    /// Held open by RDMA-CM for the life of the process (its ids, CM agent
    /// and QPN allocation depend on it): `ibv_close_device` leaves it.
    pub(crate) held: std::sync::atomic::AtomicBool,
}

/// `__VERBS_ABI_IS_EXTENDED`: `ibv_context.abi_compat` of a `verbs_context`.
pub(crate) const VERBS_ABI_IS_EXTENDED: *mut std::os::raw::c_void = usize::MAX as *mut std::os::raw::c_void;

/// The urnic context behind an `ibv_context` (container_of).
pub(crate) unsafe fn uctx<'a>(ctx: *mut ibv_context) -> Option<&'a UContext> {
    if ctx.is_null() || (*ctx).abi_compat != VERBS_ABI_IS_EXTENDED {
        return None;
    }
    let off = std::mem::offset_of!(verbs_context, context);
    Some(&*((ctx as *mut u8).sub(off) as *const UContext))
}

/// Look up a QP or SRQ registered with the context (`qps` / `srqs`).
pub(crate) fn register(map: &Mutex<HashMap<u32, usize>>, n: u32, p: usize) {
    lock(map).insert(n, p);
}

/// Forget a QP or SRQ.
pub(crate) fn unregister(map: &Mutex<HashMap<u32, usize>>, n: u32) {
    lock(map).remove(&n);
}

/// The urnic contexts open in this process, by interface, with how many
/// `ibv_context`s share each. A process opens an interface once (the
/// datapath owns its AF_XDP socket); a second `ibv_open_device` of the
/// same device — a program's own and RDMA-CM's, as perftest `-R` does —
/// shares that context, as two opens of one kernel device share the HCA.
static OPEN: Mutex<Vec<(String, urnic::Context, usize)>> = Mutex::new(Vec::new());

/// A context already open on `ifname` (counted as one more user).
pub(crate) fn share_open(ifname: &str) -> Option<urnic::Context> {
    let mut v = lock(&OPEN);
    let e = v.iter_mut().find(|e| e.0 == ifname)?;
    e.2 += 1;
    Some(e.1.clone())
}

/// Record a newly opened context of `ifname`.
pub(crate) fn record_open(ifname: &str, ctx: &urnic::Context) {
    lock(&OPEN).push((ifname.to_string(), ctx.clone(), 1));
}

/// One user of `ifname`'s context is gone; the last drops the shared handle.
pub(crate) fn release_open(ifname: &str) {
    let mut v = lock(&OPEN);
    if let Some(i) = v.iter().position(|e| e.0 == ifname) {
        v[i].2 -= 1;
        if v[i].2 == 0 {
            v.remove(i);
        }
    }
}
