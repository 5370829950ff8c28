//! The `*_str` helpers: names of enum values for messages.

use std::os::raw::c_char;

use crate::ffi::*;

fn c(s: &'static [u8]) -> *const c_char {
    s.as_ptr() as *const c_char
}

#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: ibv_wc_status) -> *const c_char {
    c(match status {
        IBV_WC_SUCCESS => b"success\0",
        IBV_WC_LOC_LEN_ERR => b"local length error\0",
        IBV_WC_LOC_QP_OP_ERR => b"local QP operation error\0",
        IBV_WC_LOC_EEC_OP_ERR => b"local EE context operation error\0",
        IBV_WC_LOC_PROT_ERR => b"local protection error\0",
        IBV_WC_WR_FLUSH_ERR => b"Work Request Flushed Error\0",
        IBV_WC_MW_BIND_ERR => b"memory management operation error\0",
        IBV_WC_BAD_RESP_ERR => b"bad response error\0",
        IBV_WC_LOC_ACCESS_ERR => b"local access error\0",
        IBV_WC_REM_INV_REQ_ERR => b"remote invalid request error\0",
        IBV_WC_REM_ACCESS_ERR => b"remote access error\0",
        IBV_WC_REM_OP_ERR => b"remote operation error\0",
        IBV_WC_RETRY_EXC_ERR => b"transport retry counter exceeded\0",
        IBV_WC_RNR_RETRY_EXC_ERR => b"RNR retry counter exceeded\0",
        IBV_WC_LOC_RDD_VIOL_ERR => b"local RDD violation error\0",
        IBV_WC_REM_INV_RD_REQ_ERR => b"remote invalid RD request\0",
        IBV_WC_REM_ABORT_ERR => b"aborted error\0",
        IBV_WC_INV_EECN_ERR => b"invalid EE context number\0",
        IBV_WC_INV_EEC_STATE_ERR => b"invalid EE context state\0",
        IBV_WC_FATAL_ERR => b"fatal error\0",
        IBV_WC_RESP_TIMEOUT_ERR => b"response timeout error\0",
        IBV_WC_GENERAL_ERR => b"general error\0",
        IBV_WC_TM_ERR => b"TM error\0",
        IBV_WC_TM_RNDV_INCOMPLETE => b"TM software rendezvous\0",
        _ => b"unknown\0",
    })
}

#[no_mangle]
pub extern "C" fn ibv_node_type_str(t: ibv_node_type) -> *const c_char {
    c(match t {
        IBV_NODE_CA => b"InfiniBand channel adapter\0",
        IBV_NODE_SWITCH => b"InfiniBand switch\0",
        IBV_NODE_ROUTER => b"InfiniBand router\0",
        IBV_NODE_RNIC => b"iWARP NIC\0",
        IBV_NODE_USNIC => b"usNIC\0",
        IBV_NODE_USNIC_UDP => b"usNIC UDP\0",
        IBV_NODE_UNSPECIFIED => b"unspecified\0",
        _ => b"unknown\0",
    })
}

#[no_mangle]
pub extern "C" fn ibv_port_state_str(s: ibv_port_state) -> *const c_char {
    c(match s {
        IBV_PORT_NOP => b"no state change (NOP)\0",
        IBV_PORT_DOWN => b"down\0",
        IBV_PORT_INIT => b"init\0",
        IBV_PORT_ARMED => b"armed\0",
        IBV_PORT_ACTIVE => b"active\0",
        IBV_PORT_ACTIVE_DEFER => b"active defer\0",
        _ => b"unknown\0",
    })
}

#[no_mangle]
pub extern "C" fn ibv_event_type_str(e: ibv_event_type) -> *const c_char {
    c(match e {
        IBV_EVENT_CQ_ERR => b"CQ error\0",
        IBV_EVENT_QP_FATAL => b"local work queue catastrophic error\0",
        IBV_EVENT_QP_REQ_ERR => b"invalid request local work queue error\0",
        IBV_EVENT_QP_ACCESS_ERR => b"local access violation work queue error\0",
        IBV_EVENT_COMM_EST => b"communication established\0",
        IBV_EVENT_SQ_DRAINED => b"send queue drained\0",
        IBV_EVENT_PATH_MIG => b"path migrated\0",
        IBV_EVENT_PATH_MIG_ERR => b"path migration request error\0",
        IBV_EVENT_DEVICE_FATAL => b"local catastrophic error\0",
        IBV_EVENT_PORT_ACTIVE => b"port active\0",
        IBV_EVENT_PORT_ERR => b"port error\0",
        IBV_EVENT_LID_CHANGE => b"LID change\0",
        IBV_EVENT_PKEY_CHANGE => b"P_Key change\0",
        IBV_EVENT_SM_CHANGE => b"SM change\0",
        IBV_EVENT_SRQ_ERR => b"SRQ catastrophic error\0",
        IBV_EVENT_SRQ_LIMIT_REACHED => b"SRQ limit reached\0",
        IBV_EVENT_QP_LAST_WQE_REACHED => b"last WQE reached\0",
        IBV_EVENT_CLIENT_REREGISTER => b"client reregistration\0",
        IBV_EVENT_GID_CHANGE => b"GID table change\0",
        IBV_EVENT_WQ_FATAL => b"WQ fatal\0",
        _ => b"unknown\0",
    })
}
