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
//! | `ibv_attach_mcast` / `ibv_detach_mcast` | [`Qp::attach_mcast`], [`Qp::detach_mcast`] (UD; send with an [`Ah`] on the group's GID and remote QPN `0xFFFFFF`) |
//! | `ibv_get_async_event` | [`Context::poll_async_event`] |
//!
//! # The sequence every RC program runs
//!
//! Two devices on an in-memory link (no privileges; on a real interface,
//! [`open_af_xdp`] instead of [`open_device`]): open, PD, MR, CQ, QP, connect
//! (the INIT → RTR → RTS of `ibv_modify_qp`), post a receive, RDMA WRITE and
//! SEND, poll the completions.
//!
//! ```
//! use urnic::*;
//!
//! # fn main() -> urnic::Result<()> {
//! let hub = MemHub::new(1);
//! let a = open_device(DeviceConfig::memory(&hub, "urnic0", [2, 0, 0, 0, 0, 1], [10, 0, 0, 1]))?;
//! let b = open_device(DeviceConfig::memory(&hub, "urnic1", [2, 0, 0, 0, 0, 2], [10, 0, 0, 2]))?;
//! let cap = QpCaps { max_send_wr: 8, max_recv_wr: 8, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
//! let (pd_a, pd_b) = (a.alloc_pd()?, b.alloc_pd()?);
//! let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
//! let (mut mr_a, mr_b) = (pd_a.alloc_mr(4096, access)?, pd_b.alloc_mr(4096, access)?);
//! let (cq_a, cq_b) = (a.create_cq(16, None)?, b.create_cq(16, None)?);
//! let qp_a = pd_a.create_qp(&QpInit { qp_type: QpType::Rc, send_cq: &cq_a, recv_cq: &cq_a, srq: None, cap, sq_sig_all: true })?;
//! let qp_b = pd_b.create_qp(&QpInit { qp_type: QpType::Rc, send_cq: &cq_b, recv_cq: &cq_b, srq: None, cap, sq_sig_all: true })?;
//! // What ibv_rc_pingpong exchanges over TCP: QPN, PSN, GID (index 1: IPv4).
//! qp_a.connect(&Connect::new(qp_b.qp_num(), b.query_gid(1, 1)?, 100, 200))?;
//! qp_b.connect(&Connect::new(qp_a.qp_num(), a.query_gid(1, 1)?, 200, 100))?;
//!
//! qp_b.post_recv(&RecvWr { wr_id: 7, sgl: vec![mr_b.sge(2048, 64)] })?;
//! mr_a.write_at(0, b"hello, RDMA")?;
//! let remote = RemoteAddr { addr: mr_b.addr(), rkey: mr_b.rkey() };
//! let write = SendWr { wr_id: 1, op: SendOp::Write { remote }, payload: Payload::Sgl(vec![mr_a.sge(0, 11)]), flags: SendFlags::SIGNALED, ud: None };
//! let send = SendWr { wr_id: 2, op: SendOp::Send, payload: Payload::Sgl(vec![mr_a.sge(0, 5)]), flags: SendFlags::SIGNALED, ud: None };
//! qp_a.post_send(&write)?;
//! qp_a.post_send(&send)?;
//!
//! // ibv_poll_cq until both sides have their completions.
//! let mut wc = [WorkCompletion::default(); 4];
//! let (mut sent, mut received) = (0, 0);
//! while sent < 2 || received < 1 {
//!     let n = cq_a.poll(&mut wc)?;
//!     for c in &wc[..n] {
//!         assert_eq!(c.status, WcStatus::Success);
//!         sent += 1;
//!     }
//!     let n = cq_b.poll(&mut wc)?;
//!     for c in &wc[..n] {
//!         assert_eq!((c.wr_id, c.status, c.byte_len), (7, WcStatus::Success, 5));
//!         received += 1;
//!     }
//! }
//! assert_eq!(mr_b.read_vec(0, 11)?, b"hello, RDMA");
//! assert_eq!(mr_b.read_vec(2048, 5)?, b"hello");
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

mod backing;
pub mod cm;
mod counter_file;
mod cq;
mod device;
mod discover;
mod error;
mod host_groups;
mod mcast;
mod mr;
mod qp;
mod stats;

pub use counter_file::{counter_file_pid, sweep_counter_files};
pub use cq::{CompChannel, Cq};
pub use device::{
    gid_to_string, link_local_gid, open_af_xdp, open_device, Context, DatapathMode, DeviceAttr, DeviceConfig, DeviceLimits, Gid, PortAttr,
    PortConfig, PortState, Resolver,
};
pub use discover::{device_list, DeviceInfo};
pub use error::{Error, ErrorKind, Result};
pub use mr::{DeregError, Mr, Mw, Pd};
pub use qp::{Ah, AhAttr, Connect, Qp, QpAttr, QpInit, Srq};
pub use stats::DeviceCounters;

pub use rocev2::transport::attr::{Mtu, QpAttrMask, QpCaps, QpState, QpType};
pub use rocev2::transport::engine::{AsyncEvent, EngineStats};
pub use rocev2::transport::memory::{Access, MwType};
pub use rocev2::transport::stats::QpStats;
pub use rocev2::transport::wqe::{PayloadRef, RecvWrRef, SendWrRef};
pub use rocev2::transport::wr::{Payload, RecvWr, RemoteAddr, SendFlags, SendOp, SendWr, Sge, UdDest, WcOpcode, WcStatus, WorkCompletion};
pub use rocev2::Psn;
pub use urnic_datapath::{xdp, BindMode, Faults, IdlePolicy, Impairments, MemHub, XskConfig};
