//! The IBVERBS_PRIVATE_34 interface that rdma-core's providers import.
//!
//! Debian's perftest binaries link `libmlx5.so.1` and `libefa.so.1`, and
//! rdma-core is built with BIND_NOW: their IBVERBS_PRIVATE_34 imports must
//! resolve when the program loads, and they register themselves from a
//! constructor. urnic's library behaves as libibverbs does on a host where
//! those providers' kernel devices are absent (which is what a host without
//! that hardware is): a registration is accepted and never matches a
//! device, so no provider context is ever created and none of the kernel
//! commands below is reached; were one called, it fails with EOPNOTSUPP.
//! None of this stands in for an urnic feature.

use std::os::raw::{c_char, c_int, c_void};

use crate::set_errno;

/// `verbs_register_driver_34`: a provider announces itself. urnic serves
/// only its own devices, so the registration is noted and never matched.
#[no_mangle]
pub extern "C" fn verbs_register_driver_34(_ops: *const c_void) {}

/// `_verbs_init_and_alloc_context`: only reached when opening a provider's
/// device, which never exists here.
#[no_mangle]
pub extern "C" fn _verbs_init_and_alloc_context(
    _device: *mut c_void,
    _cmd_fd: c_int,
    _alloc_size: usize,
    _context_offset: usize,
    _driver_id: u32,
) -> *mut c_void {
    set_errno(libc::ENODEV);
    std::ptr::null_mut()
}

/// `verbs_open_device`: no provider device exists here.
#[no_mangle]
pub extern "C" fn verbs_open_device(_device: *mut c_void, _private_data: *mut c_void) -> *mut c_void {
    set_errno(libc::ENODEV);
    std::ptr::null_mut()
}

#[no_mangle]
pub extern "C" fn verbs_set_ops(_ctx: *mut c_void, _ops: *const c_void) {}

#[no_mangle]
pub extern "C" fn verbs_init_cq(_cq: *mut c_void, _ctx: *mut c_void, _channel: *mut c_void, _cq_context: *mut c_void) {}

#[no_mangle]
pub extern "C" fn verbs_uninit_context(_ctx: *mut c_void) {}

/// `__verbs_log(ctx, level, fmt, ...)`: providers' debug logging, silent
/// (the variadic arguments are never read, which the x86-64 calling
/// convention allows).
#[no_mangle]
pub extern "C" fn __verbs_log(_ctx: *mut c_void, _level: u32, _fmt: *const c_char) {}

/// `verbs_allow_disassociate_destroy`, a flag providers read.
#[no_mangle]
pub static mut verbs_allow_disassociate_destroy: bool = false;

/// Kernel commands (`ibv_cmd_*`, `execute_ioctl`): they talk to
/// /dev/infiniband/uverbsN on behalf of a provider context, which cannot
/// exist here; each fails with EOPNOTSUPP.
macro_rules! kernel_commands {
    ($($name:ident),* $(,)?) => {
        $(
            #[no_mangle]
            pub extern "C" fn $name() -> c_int {
                libc::EOPNOTSUPP
            }
        )*
    };
}

kernel_commands!(
    execute_ioctl,
    ibv_cmd_advise_mr,
    ibv_cmd_alloc_dm,
    ibv_cmd_alloc_mw,
    ibv_cmd_alloc_pd,
    ibv_cmd_attach_mcast,
    ibv_cmd_close_xrcd,
    ibv_cmd_create_ah,
    ibv_cmd_create_counters,
    ibv_cmd_create_cq,
    ibv_cmd_create_cq_ex,
    ibv_cmd_create_flow,
    ibv_cmd_create_flow_action_esp,
    ibv_cmd_create_qp,
    ibv_cmd_create_qp_ex,
    ibv_cmd_create_qp_ex2,
    ibv_cmd_create_rwq_ind_table,
    ibv_cmd_create_srq,
    ibv_cmd_create_srq_ex,
    ibv_cmd_create_wq,
    ibv_cmd_dealloc_mw,
    ibv_cmd_dealloc_pd,
    ibv_cmd_dereg_mr,
    ibv_cmd_destroy_ah,
    ibv_cmd_destroy_counters,
    ibv_cmd_destroy_cq,
    ibv_cmd_destroy_flow,
    ibv_cmd_destroy_flow_action,
    ibv_cmd_destroy_qp,
    ibv_cmd_destroy_rwq_ind_table,
    ibv_cmd_destroy_srq,
    ibv_cmd_destroy_wq,
    ibv_cmd_detach_mcast,
    ibv_cmd_free_dm,
    ibv_cmd_get_context,
    ibv_cmd_modify_cq,
    ibv_cmd_modify_flow_action_esp,
    ibv_cmd_modify_qp,
    ibv_cmd_modify_qp_ex,
    ibv_cmd_modify_srq,
    ibv_cmd_modify_wq,
    ibv_cmd_open_qp,
    ibv_cmd_open_xrcd,
    ibv_cmd_query_context,
    ibv_cmd_query_device_any,
    ibv_cmd_query_mr,
    ibv_cmd_query_port,
    ibv_cmd_query_qp,
    ibv_cmd_query_srq,
    ibv_cmd_read_counters,
    ibv_cmd_reg_dm_mr,
    ibv_cmd_reg_dmabuf_mr,
    ibv_cmd_reg_mr,
    ibv_cmd_rereg_mr,
    ibv_cmd_resize_cq,
);
