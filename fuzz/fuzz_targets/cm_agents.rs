//! Structured fuzzing of the CM agent: two agents, a program of connects,
//! consumer calls, deliveries, timers and forged MADs read from the input;
//! see `fuzz/src/cm_agents.rs` for the input format and the invariants.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rocev2_fuzz::cm_agents::run(data);
});
