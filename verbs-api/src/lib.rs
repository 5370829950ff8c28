//! urnic's verbs API: ibverbs semantics in idiomatic Rust.
//!
//! | ibverbs | urnic |
//! |---|---|
//! | `ibv_get_device_list` | [`device_list`] (Ethernet interfaces a device can attach to) |
//! | `ibv_open_device` | [`open_device`] → [`Context`] |
//! | `ibv_query_device` / `_port` / `_gid` | [`Context::query_device`], [`Context::query_port`], [`Context::query_gid`] |
//! | `ibv_alloc_pd` | [`Context::alloc_pd`] → [`Pd`] |
//! | `ibv_reg_mr` / `ibv_dereg_mr` / `ibv_rereg_mr` | [`Pd::reg_mr`], [`Pd::alloc_mr`], [`Pd::reg_mr_raw`] → [`Mr`]; drop or [`Mr::dereg`] (`EBUSY`: [`DeregError`]); [`Mr::rereg_access`]; data: [`Mr::read_at`], [`Mr::write_at`] |
//! | `ibv_alloc_mw` / `ibv_bind_mw` | [`Pd::alloc_mw`] → [`Mw`], [`Mw::bind`]; type 2: `SendOp::BindMw` |
//! | `ibv_create_comp_channel` / `ibv_get_cq_event` | [`Context::create_comp_channel`] → [`CompChannel::get_cq_event`] |
//! | `ibv_create_cq` / `ibv_poll_cq` / `ibv_req_notify_cq` / `ibv_resize_cq` | [`Context::create_cq`] → [`Cq::poll`], [`Cq::req_notify`], [`Cq::resize`] |
//! | `ibv_create_qp` / `ibv_modify_qp` / `ibv_query_qp` | [`Pd::create_qp`] → [`Qp::modify`], [`Qp::query`] |
//! | `ibv_post_send` / `ibv_post_recv` | [`Qp::post_send`], [`Qp::post_recv`] |
//! | `ibv_create_srq` / `ibv_post_srq_recv` / `ibv_modify_srq` | [`Pd::create_srq`] → [`Srq::post_recv`], [`Srq::arm_limit`] |
//! | `ibv_create_ah` | [`Pd::create_ah`] → [`Ah`] |
//! | `ibv_get_async_event` | [`Context::poll_async_event`] |

#![deny(missing_docs)]

mod cq;
mod device;
mod discover;
mod error;
mod mr;
mod qp;
mod stats;

pub use cq::{CompChannel, Cq};
pub use device::{
    gid_to_string, link_local_gid, open_af_xdp, open_device, Context, DatapathMode, DeviceAttr, DeviceConfig, DeviceLimits, Gid,
    PortAttr, PortConfig, PortState, Resolver,
};
pub use discover::{device_list, DeviceInfo};
pub use error::{Error, ErrorKind, Result};
pub use mr::{DeregError, Mr, Mw, Pd};
pub use stats::DeviceCounters;
pub use qp::{Ah, AhAttr, Connect, Qp, QpAttr, QpInit, Srq};

pub use rocev2::transport::attr::{Mtu, QpAttrMask, QpCaps, QpState, QpType};
pub use rocev2::transport::memory::{Access, MwType};
pub use rocev2::transport::wr::{
    Payload, RecvWr, RemoteAddr, SendFlags, SendOp, SendWr, Sge, UdDest, WcOpcode, WcStatus, WorkCompletion,
};
pub use rocev2::Psn;
pub use rocev2::transport::engine::{AsyncEvent, EngineStats};
pub use rocev2::transport::stats::QpStats;
pub use urnic_datapath::{xdp, BindMode, IdlePolicy, Impairments, MemHub, XskConfig};
