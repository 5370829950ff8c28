//! Benchmark helpers (criterion suites live in `benches/benches/`).
