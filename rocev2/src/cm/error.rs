//! The CM's errors: [`MadError`] for what arrives, [`CmError`] for what the
//! caller asks.

/// Why a received MAD was not accepted as a CM message (each is a counted drop).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum MadError {
    /// A MAD is exactly 256 bytes.
    #[error("MAD of {0} bytes (a MAD is 256)")]
    Length(usize),
    /// `BaseVersion` is not 1.
    #[error("MAD base version {0} is not 1")]
    BaseVersion(u8),
    /// Not the CM management class (0x07).
    #[error("management class {0:#04x} is not CM (0x07)")]
    Class(u8),
    /// CM class version is not 2.
    #[error("CM class version {0} is not 2")]
    ClassVersion(u8),
    /// CM messages use method Send (0x03) only.
    #[error("MAD method {0:#04x} is not Send")]
    Method(u8),
    /// An attribute CM does not implement (ClassPortInfo, LAP, APR, reserved).
    #[error("CM attribute {0:#06x} not supported")]
    Attribute(u16),
    /// A field value the spec does not allow (the field is named).
    #[error("CM message field {0} has a value the spec does not allow")]
    Field(&'static str),
}

/// Why a CM call was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CmError {
    /// Private data longer than the message carries.
    #[error("private data of {len} bytes exceeds the {max} bytes this message carries")]
    PrivateDataTooLong {
        /// Length asked for.
        len: usize,
        /// What the message has room for.
        max: usize,
    },
    /// No connection or request with this id.
    #[error("unknown CM id {0:#010x}")]
    UnknownId(u32),
    /// The id is not in a state where this call is allowed (names the state).
    #[error("CM id {id:#010x} is in state {state}, where {call} is not allowed")]
    BadState {
        /// The id.
        id: u32,
        /// Its state.
        state: &'static str,
        /// The call refused.
        call: &'static str,
    },
    /// A listener already holds this service ID.
    #[error("service ID {0:#018x} is already listened on")]
    ServiceInUse(u64),
    /// No listener on this service ID.
    #[error("no listener on service ID {0:#018x}")]
    NoListener(u64),
    /// A parameter out of its field's range (named).
    #[error("{0} is out of range")]
    Invalid(&'static str),
    /// Too many connections or requests outstanding.
    #[error("too many CM ids ({0} is the limit)")]
    TooMany(usize),
}
