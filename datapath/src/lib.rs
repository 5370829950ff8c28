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

/// How many rounds a concurrency stress test runs: all of them natively,
/// a small share under Miri (`cargo miri test`), whose interpreter checks
/// every interleaving it takes for data races and undefined behaviour but
/// runs some ten thousand times slower.
#[cfg(test)]
pub(crate) const fn stress_rounds(native: u64) -> u64 {
    if cfg!(miri) {
        let scaled = native / 500;
        if scaled < 64 {
            64
        } else {
            scaled
        }
    } else {
        native
    }
}

pub use memport::{Impairments, MemHub, MemPort};
pub use nic::Nic;
pub use port::{Port, PortError, PortInfo};
pub use rocev2::impair::Faults;
pub use runner::{IdlePolicy, Runner};
pub use urnic_xdp as xdp;
pub use xsk::{BindMode, XskConfig, XskPort};
