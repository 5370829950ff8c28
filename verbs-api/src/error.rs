//! Errors of verbs calls.
//!
//! An [`Error`] has a [`kind`](Error::kind), the [`errno`](Error::errno) the
//! matching ibverbs call would fail with, a message saying what was wrong,
//! and, where another error caused it, that error as its
//! [`source`](std::error::Error::source): the `io::Error` of a failed system
//! call (with its OS errno), or the transport's `RegError`, `SgeError` or
//! `EngineError`. The message already includes the cause's text, so printing
//! an `Error` alone says everything.

use std::io;

use rocev2::transport::engine::EngineError;

/// What kind of failure (the errno an ibverbs call would return).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// `EINVAL`: an argument is invalid (bad mask, bad value, bad lkey, too many SGEs ...).
    InvalidArgument,
    /// `ENOMEM`: a queue is full or a resource limit is reached.
    NoResources,
    /// `EINVAL` on a QP/SRQ in a state that does not allow the call.
    InvalidState,
    /// `EBUSY`: the object is still in use (e.g. an MR with bound windows,
    /// an interface another process holds).
    Busy,
    /// `EOPNOTSUPP`.
    NotSupported,
    /// `ENOENT`: no such object (e.g. no neighbour entry for a GID).
    NotFound,
    /// `EPERM` (or the OS's `EACCES`): the process lacks a privilege the
    /// call needs, e.g. opening an AF_XDP device without root or
    /// `CAP_NET_ADMIN`, `CAP_NET_RAW` and `CAP_BPF`.
    PermissionDenied,
    /// Another operating-system error ([`Error::errno`] gives its errno).
    Io,
}

impl ErrorKind {
    /// The errno of this kind when no OS error says otherwise.
    pub fn errno(self) -> i32 {
        match self {
            ErrorKind::InvalidArgument | ErrorKind::InvalidState => libc::EINVAL,
            ErrorKind::NoResources => libc::ENOMEM,
            ErrorKind::Busy => libc::EBUSY,
            ErrorKind::NotSupported => libc::EOPNOTSUPP,
            ErrorKind::NotFound => libc::ENOENT,
            ErrorKind::PermissionDenied => libc::EPERM,
            ErrorKind::Io => libc::EIO,
        }
    }
}

/// The cause of an [`Error`].
type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A failed verbs call: its kind, the errno, a message saying what was
/// wrong, and the error that caused it, if any.
#[derive(Debug, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
    /// The OS errno of the system call that failed, if one did.
    os_errno: Option<i32>,
    #[source]
    source: Option<Cause>,
}

impl PartialEq for Error {
    /// Equal kind, errno and message (the causes are not compared).
    fn eq(&self, other: &Error) -> bool {
        self.kind == other.kind && self.errno() == other.errno() && self.message == other.message
    }
}

impl Eq for Error {}

impl Error {
    /// A new error.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, message: message.into(), os_errno: None, source: None }
    }

    /// A new error caused by `source` (returned by
    /// [`source`](std::error::Error::source)). `message` should say what
    /// failed, including the cause's text. The first `io::Error` in the
    /// source's chain gives the errno (see [`Error::errno`]).
    pub fn with_source(kind: ErrorKind, message: impl Into<String>, source: impl std::error::Error + Send + Sync + 'static) -> Error {
        let source: Cause = Box::new(source);
        // The first io::Error down the chain says which system call failed how.
        let mut os_errno = None;
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&*source);
        while let (None, Some(c)) = (os_errno, cause) {
            os_errno = io_errno(c);
            cause = c.source();
        }
        Error { kind, message: message.into(), os_errno, source: Some(source) }
    }

    /// An error for a failed system call: `what` failed because of `e`. The
    /// kind is [`ErrorKind::PermissionDenied`] for `EPERM`/`EACCES`, else
    /// [`ErrorKind::Io`]; the errno is the OS's.
    pub fn io(what: impl std::fmt::Display, e: io::Error) -> Error {
        let kind = io_kind(&e);
        Error::with_source(kind, format!("{what}: {e}"), e)
    }

    /// The kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The errno the ibverbs call would fail with (positive, as `errno`):
    /// the OS's errno when a system call failed (an `io::Error` source),
    /// else the kind's ([`ErrorKind::errno`]): `EINVAL`, `ENOMEM`, `EBUSY`,
    /// `EOPNOTSUPP`, `ENOENT`, `EPERM`, `EIO`.
    pub fn errno(&self) -> i32 {
        self.os_errno.unwrap_or_else(|| self.kind.errno())
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidArgument, message)
    }

    /// An engine call behind `what` failed: the kind the ibverbs call would
    /// report (`ibv_modify_qp`: EINVAL for a bad transition or attribute
    /// mask; `ibv_create_qp`: ENOMEM at a limit), with `e` as the source.
    pub(crate) fn engine(what: &str, e: EngineError) -> Error {
        let kind = match e {
            EngineError::NoSuchQp(_) | EngineError::NoSuchSrq(_) => ErrorKind::NotFound,
            EngineError::TooMany | EngineError::QueueFull => ErrorKind::NoResources,
            EngineError::WrongState(_) => ErrorKind::InvalidState,
            EngineError::BadTransition { .. }
            | EngineError::MissingAttr(_)
            | EngineError::ExtraAttr(_)
            | EngineError::BadValue(_)
            | EngineError::BadWr(_) => ErrorKind::InvalidArgument,
            EngineError::Busy => ErrorKind::Busy,
            // As rxe: no more groups is ENOMEM (`rxe_get_mcg`), a full
            // group or device EINVAL (`rxe_attach_mcg`).
            EngineError::McastLimit(m) if m.starts_with("max_mcast_grp") => ErrorKind::NoResources,
            EngineError::McastLimit(_) => ErrorKind::InvalidArgument,
        };
        Error::with_source(kind, format!("{what}: {e}"), e)
    }
}

impl From<io::Error> for Error {
    /// Keeps the `io::Error` as the source and its errno; `EPERM`/`EACCES`
    /// become [`ErrorKind::PermissionDenied`], the rest [`ErrorKind::Io`].
    fn from(e: io::Error) -> Error {
        let kind = io_kind(&e);
        Error::with_source(kind, e.to_string(), e)
    }
}

/// The kind for an OS error.
fn io_kind(e: &io::Error) -> ErrorKind {
    match io_errno(e) {
        Some(libc::EPERM | libc::EACCES) => ErrorKind::PermissionDenied,
        _ if e.kind() == io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
        _ => ErrorKind::Io,
    }
}

/// The errno an `io::Error` (or an error holding one) stands for: its raw OS
/// error, that of an `io::Error` it wraps, or one matching its kind.
fn io_errno(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let io = e.downcast_ref::<io::Error>()?;
    if let Some(n) = io.raw_os_error() {
        return Some(n);
    }
    if let Some(n) = io.get_ref().and_then(|inner| io_errno(inner)) {
        return Some(n);
    }
    Some(match io.kind() {
        io::ErrorKind::NotFound => libc::ENOENT,
        io::ErrorKind::PermissionDenied => libc::EPERM,
        io::ErrorKind::AlreadyExists => libc::EEXIST,
        io::ErrorKind::WouldBlock => libc::EAGAIN,
        io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData => libc::EINVAL,
        io::ErrorKind::OutOfMemory => libc::ENOMEM,
        io::ErrorKind::Unsupported => libc::EOPNOTSUPP,
        io::ErrorKind::TimedOut => libc::ETIMEDOUT,
        io::ErrorKind::Interrupted => libc::EINTR,
        _ => libc::EIO,
    })
}

/// Result of a verbs call.
pub type Result<T> = core::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn io_errors_keep_their_errno_and_source() {
        let e = Error::from(io::Error::from_raw_os_error(libc::ENOENT));
        assert_eq!((e.kind(), e.errno()), (ErrorKind::Io, libc::ENOENT));
        let src = e.source().and_then(|s| s.downcast_ref::<io::Error>()).expect("io::Error source");
        assert_eq!(src.raw_os_error(), Some(libc::ENOENT));
        assert!(e.to_string().contains("No such file or directory"), "{e}");

        for n in [libc::EPERM, libc::EACCES] {
            let e = Error::io("opening /run/urnic", io::Error::from_raw_os_error(n));
            assert_eq!((e.kind(), e.errno()), (ErrorKind::PermissionDenied, n));
            assert!(e.message().starts_with("opening /run/urnic: "), "{e}");
        }
        // An io::Error made from another keeps the inner errno.
        let wrapped = io::Error::other(io::Error::from_raw_os_error(libc::EBUSY));
        assert_eq!(Error::from(wrapped).errno(), libc::EBUSY);
        // Kind only: the errno follows the kind.
        let custom = io::Error::new(io::ErrorKind::PermissionDenied, "setns into /run/netns/x: Operation not permitted");
        let e = Error::from(custom);
        assert_eq!((e.kind(), e.errno()), (ErrorKind::PermissionDenied, libc::EPERM));
        assert_eq!(Error::from(io::Error::other("odd")).errno(), libc::EIO);
    }

    #[test]
    fn the_errno_comes_from_the_first_io_error_down_the_chain() {
        use urnic_datapath::xsk::XskError;
        let x = XskError::Io { what: "AF_XDP socket".into(), source: io::Error::from_raw_os_error(libc::ENODEV) };
        let e = Error::with_source(ErrorKind::Io, x.to_string(), x);
        assert_eq!(e.errno(), libc::ENODEV);
        assert!(e.source().is_some_and(|s| s.is::<XskError>()));
        let busy = XskError::InUse { ifname: "veth0".into(), pid: Some(1234), holder: "urnic perftest".into() };
        assert_eq!(busy.to_string(), "interface veth0 is in use by urnic process 1234 (urnic perftest)");
        assert_eq!(Error::with_source(ErrorKind::Busy, busy.to_string(), busy).errno(), libc::EBUSY);
    }

    #[test]
    fn kinds_without_os_error_have_the_ibverbs_errno() {
        let want = [
            (ErrorKind::InvalidArgument, libc::EINVAL),
            (ErrorKind::InvalidState, libc::EINVAL),
            (ErrorKind::NoResources, libc::ENOMEM),
            (ErrorKind::Busy, libc::EBUSY),
            (ErrorKind::NotSupported, libc::EOPNOTSUPP),
            (ErrorKind::NotFound, libc::ENOENT),
            (ErrorKind::PermissionDenied, libc::EPERM),
            (ErrorKind::Io, libc::EIO),
        ];
        for (kind, errno) in want {
            let e = Error::new(kind, "x");
            assert_eq!(e.errno(), errno, "{kind:?}");
            assert!(e.source().is_none());
        }
        assert_eq!(Error::new(ErrorKind::Busy, "in use").to_string(), "Busy: in use");
        let e = Error::with_source(ErrorKind::Busy, "dereg: busy", rocev2::transport::memory::RegError::Busy);
        assert!(e.source().and_then(|s| s.downcast_ref::<rocev2::transport::memory::RegError>()).is_some());
        assert_eq!(e, Error::new(ErrorKind::Busy, "dereg: busy"));
    }
}
