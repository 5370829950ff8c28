//! Structured fuzzing of `Engine::handle_frame` against two engines with
//! traffic in flight: see `fuzz/src/engine_frames.rs` for the input format
//! and the invariants checked after every step.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rocev2_fuzz::engine_frames::run(data);
});
