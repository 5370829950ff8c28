//! A deterministic network simulator in virtual time (feature `sim`).
//!
//! [`Link`] is a one-way virtual link with seeded impairments (loss,
//! duplication, reordering, bit corruption, ECN marking, fixed delay and a
//! rate limit with a tail-dropping queue). [`Network`] joins sans-IO
//! [`Endpoint`]s — normally transport engines — with links and runs them as a
//! discrete-event loop: no threads, no clocks, no I/O, so a run is a pure
//! function of its seeds and any failure replays exactly.
//!
//! [`forge`] builds the frames of a hostile third host on the segment
//! (forged requests and responses with a valid ICRC) and says how a receiver
//! counts each; [`adversary`] is that host in a simulated network, injecting
//! them at live QPs and checking how each was counted.
//!
//! [`pair`] is the two-engine harness: two hosts with registered memory and
//! connected RC or UC QPs (set up with [`rc`]'s helpers), frames moved
//! between them directly in virtual time through an optional per-frame
//! filter, timers fired; or handed to a [`Network`].
//!
//! The crate's randomized transport tests, the benches crate and the verbs
//! layer's tests build on it.

pub mod adversary;
pub mod dcqcn;
pub mod forge;
pub mod link;
pub mod network;
pub mod pair;
pub mod rc;

pub use crate::impair::Faults;
pub use link::{Link, LinkConfig, LinkStats};
pub use network::{split_seed, Endpoint, LinkId, Network, NetworkStats, NodeId, RunOutcome, Tap, TapPoint, Watch, MAX_FRAME};
