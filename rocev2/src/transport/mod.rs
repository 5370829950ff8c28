//! The transport: RC (and UC/UD) queue pairs as sans-IO state machines.
//!
//! Split as rxe does: the requester turns work requests into request packets,
//! the completer matches responses (ACK, NAK, READ responses, atomic ACKs) to
//! outstanding requests and completes them, the responder executes incoming
//! requests against registered memory and answers.

pub mod attr;
mod completer;
pub mod dcqcn;
pub mod engine;
pub mod events;
pub mod gsi;
pub mod ids;
pub mod mcast;
pub mod memory;
pub mod path;
mod qp;
pub mod recv;
pub mod requester;
pub mod responder;
pub mod retired;
pub mod stats;
pub mod wqe;
pub mod wr;
