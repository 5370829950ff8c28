//! Connection management (IBTA Vol 1 ch. 12) as RDMA-CM uses it on RoCEv2:
//! CM MADs (class 0x07) over the GSI QP (QP1), sans-IO.
//!
//! - [`mad`]: the common MAD header and the GSI constants;
//! - [`msg`]: REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR_REQ, SIDR_REP;
//! - [`cma`]: RDMA-CM's service IDs and the IP header in the private data;
//! - [`gsi`]: the QP1 packets that carry the MADs;
//! - [`agent`]: the state machines ([`Cm`]): establishment, release,
//!   timewait, SIDR, retries, duplicates, and the checks every message passes.
//!
//! Checked byte for byte against Linux rxe's rping (`../pcaps/rping.pcap`) in
//! `tests/cm_rping.rs`; the state machines run in a lossy simulator in
//! `tests/cm_sim.rs`.

pub mod agent;
pub mod cma;
mod error;
pub mod gsi;
pub mod mad;
pub mod msg;

pub use agent::{AcceptParams, Cm, CmConfig, CmEvent, CmId, CmStats, ConnectParams, Drop, Gid, Transmit, Waited};
pub use cma::{CmaHeader, PortSpace, RDMA_UDP_QKEY};
pub use error::{CmError, MadError};
pub use mad::{MadHeader, GSI_QKEY, GSI_QPN, MAD_LEN};
pub use msg::{CmMad, CmMessage};
