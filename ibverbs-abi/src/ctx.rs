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
