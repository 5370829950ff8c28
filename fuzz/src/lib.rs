//! Harnesses shared by the fuzz targets in `fuzz_targets/` (the targets
//! themselves stay one-liners so libFuzzer's `cargo fuzz run <target>` and a
//! plain `cargo test` of this crate use the same code).

pub mod cm_agents;
pub mod engine_frames;
pub mod reader;
