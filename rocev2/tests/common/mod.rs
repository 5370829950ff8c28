//! Shared helpers for rocev2's integration tests.

#![allow(dead_code)]

pub mod pcap;

use std::path::PathBuf;

/// `../shared` next to the repository (CI clones it there).
pub fn shared_dir() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared");
    assert!(p.join("pcaps").is_dir(), "reference material missing: {} must hold pcaps/ and vectors/", p.display());
    p
}
