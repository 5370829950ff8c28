//! Standard output that a closed pipe does not turn into a panic.
//!
//! `println!` panics when stdout is a pipe whose reader has gone
//! (`urnic devinfo -v | head -1`): Rust ignores SIGPIPE, so the write fails
//! with EPIPE and the macro panics on it. [`outln!`] returns the failure as
//! an error instead, which unwinds the command like any other error (the
//! devices close, the namespaces go); `main` then recognises
//! [`ClosedStdout`] and ends the process the way every Unix tool ends on a
//! closed pipe, killed by SIGPIPE, without a message.

use std::fmt;
use std::io::Write;

/// Stdout's reader went away (EPIPE).
#[derive(Debug)]
pub struct ClosedStdout;

impl fmt::Display for ClosedStdout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("standard output was closed")
    }
}

impl std::error::Error for ClosedStdout {}

/// Write `text` to stdout; EPIPE becomes [`ClosedStdout`].
pub fn text(text: &str) -> anyhow::Result<()> {
    let mut o = std::io::stdout().lock();
    o.write_all(text.as_bytes()).and_then(|()| o.flush()).map_err(|e| {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            anyhow::Error::new(ClosedStdout)
        } else {
            anyhow::Error::new(e).context("writing to standard output")
        }
    })
}

/// `println!` returning `anyhow::Result<()>` (see the module).
macro_rules! outln {
    () => {
        $crate::out::text("\n")
    };
    ($($arg:tt)*) => {
        $crate::out::text(&format!("{}\n", format_args!($($arg)*)))
    };
}
pub(crate) use outln;

/// Whether `e` (or any cause in its chain) is a closed stdout.
pub fn is_closed_stdout(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<ClosedStdout>())
}

/// End the process as a Unix tool whose stdout pipe was closed: by SIGPIPE.
pub fn die_of_sigpipe() -> ! {
    // SAFETY: restoring the default action of SIGPIPE and raising it have
    // no memory preconditions; the default action ends the process.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    // Not reached; should the signal be blocked, exit as a shell reports it.
    std::process::exit(128 + libc::SIGPIPE)
}
