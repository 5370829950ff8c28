//! urnic's polling datapath: ports, polling loops and the queues it shares
//! with the verbs layer. Protocol logic lives in `rocev2`.

#![deny(missing_docs)]

pub mod capture;
pub mod completion_ring;
pub mod kernel_time;
pub mod memport;
pub mod neigh;
pub mod netdev;
pub mod netns;
pub mod nic;
pub mod port;
pub mod queues;
pub mod raw;
pub mod reassembly;
pub mod recv_ring;
pub mod runner;
pub mod send_ring;
mod wq_ring;
pub mod xsk;

pub use memport::{Impairments, MemHub, MemPort};
pub use nic::Nic;
pub use port::{Port, PortError, PortInfo};
pub use rocev2::impair::Faults;
pub use runner::{IdlePolicy, Runner};
pub use urnic_xdp as xdp;
pub use xsk::{BindMode, XskConfig, XskPort};
