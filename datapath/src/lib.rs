//! urnic's polling datapath: ports, polling loops and the queues it shares
//! with the verbs layer. Protocol logic lives in `rocev2`.

#![deny(missing_docs)]

pub mod memport;
pub mod port;
pub mod queues;

pub use memport::{Impairments, MemHub, MemPort};
pub use port::{Port, PortError, PortInfo};
