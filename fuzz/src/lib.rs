//! Harnesses shared by the fuzz targets in `fuzz_targets/` (the targets
//! themselves stay one-liners so libFuzzer's `cargo fuzz run <target>` and a
//! plain `cargo test` of this crate use the same code).

/// Whether `URNIC_FUZZ_TRACE` asks the harnesses to print each step (read
/// once per process).
pub fn trace_on() -> bool {
    static T: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *T.get_or_init(|| std::env::var_os("URNIC_FUZZ_TRACE").is_some())
}

/// `eprintln!` when [`trace_on`]: a harness's account of what it does, for
/// replaying one input by hand.
macro_rules! trace {
    ($($t:tt)*) => { if $crate::trace_on() { eprintln!($($t)*); } };
}

pub mod cm_agents;
pub mod engine_frames;
pub mod reader;
