//! Diagnostics on stderr through `tracing`: `RUST_LOG` (an env-filter such
//! as `debug` or `urnic_datapath=trace`) when set, else `urnic -v` (debug)
//! or `-vv` (trace), else warnings only. What the crates say at debug
//! level: device open (mode, queues, UMEM), neighbour resolution, QP state
//! changes, retransmissions and NAKs, libbpf's messages (target `libbpf`).
//! Nothing is logged per packet unless asked for at trace level.

use tracing_subscriber::EnvFilter;

/// Install the subscriber (once, before any device opens).
pub fn init(verbose: u8) {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => EnvFilter::try_new(&v).unwrap_or_else(|e| {
            eprintln!("urnic: RUST_LOG={v:?}: {e}; logging warnings only");
            EnvFilter::new("warn")
        }),
        _ => EnvFilter::new(match verbose {
            0 => "warn",
            1 => "debug",
            _ => "trace",
        }),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(true)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
