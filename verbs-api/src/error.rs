//! Errors of verbs calls.

use core::fmt;

/// What kind of failure (the errno an ibverbs call would return).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// `EINVAL`: an argument is invalid (bad mask, bad value, bad lkey, too many SGEs ...).
    InvalidArgument,
    /// `ENOMEM`: a queue is full or a resource limit is reached.
    NoResources,
    /// `EINVAL` on a QP/SRQ in a state that does not allow the call.
    InvalidState,
    /// `EBUSY`: the object is still in use (e.g. an MR with bound windows).
    Busy,
    /// `EOPNOTSUPP`.
    NotSupported,
    /// `ENOENT`: no such object (e.g. no neighbour entry for a GID).
    NotFound,
    /// An operating-system error.
    Io,
}

/// A failed verbs call: its kind and a message saying what was wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    /// A new error.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, message: message.into() }
    }

    /// The kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidArgument, message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::new(ErrorKind::Io, e.to_string())
    }
}

/// Result of a verbs call.
pub type Result<T> = core::result::Result<T, Error>;
