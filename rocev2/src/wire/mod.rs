//! RoCEv2 wire formats: checked views, `Repr` structs, parse and emit.

pub mod frame;
pub mod opcode;
pub mod repr;

pub use frame::{parse_frame, ParsedFrame};
pub use opcode::{HeaderLayout, Opcode, Segment, Service};
pub use repr::*;

/// UDP destination port of RoCEv2 (IANA).
pub const ROCEV2_UDP_PORT: u16 = 4791;

/// Why a frame was rejected. Each variant names what is wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WireError {
    /// The buffer ends before the named header or field is complete.
    Truncated,
    /// The output buffer is too small for the frame being emitted.
    BufferTooSmall,
}

impl core::fmt::Display for WireError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Debug::fmt(self, f)
    }
}

impl std::error::Error for WireError {}
