//! Sans-IO RoCEv2 for urnic: wire formats, ICRC, PSN arithmetic, the RC/UD
//! transport state machines and DCQCN.
//!
//! Nothing in this crate does I/O, reads a clock or spawns a thread: time is
//! passed in as `now`, frames are passed in and out as byte slices.

#![deny(missing_docs)]
#![forbid(unsafe_op_in_unsafe_fn)]

pub mod cm;
pub mod hash;
pub mod impair;
pub mod psn;
#[cfg(feature = "sim")]
pub mod sim;
pub mod wire;

pub use psn::Psn;
pub mod time;
pub mod transport;

pub use time::Instant;
