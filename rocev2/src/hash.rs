//! A fast hasher for the engine's small integer keys (QPNs, SRQ and CQ ids).
//!
//! `std`'s SipHash costs more per lookup than the rest of handling a small
//! packet (13% of all instructions of a 64-byte WRITE stream, callgrind).
//! These maps hold only keys we allocated; frames from the wire only look
//! keys up (never insert), so a hash that is not flood-resistant is fine.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Multiplicative (Fibonacci) hashing of integer keys.
#[derive(Clone, Copy, Debug, Default)]
pub struct IntHasher(u64);

impl Hasher for IntHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        // 2^64 / φ: neighbouring keys land far apart in both the high bits
        // (hashbrown's control bytes) and the low bits (its bucket index).
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// A `HashMap` with [`IntHasher`].
pub type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_keys_spread() {
        let mut m: IntMap<u32, u32> = IntMap::default();
        for q in 0x11..0x11 + 10_000u32 {
            m.insert(q, q * 2);
        }
        assert!((0x11..0x11 + 10_000u32).all(|q| m[&q] == q * 2));
        assert!(!m.contains_key(&0xff_ffff));
        let h = |k: u32| {
            let mut s = IntHasher::default();
            s.write_u32(k);
            s.finish()
        };
        assert_ne!(h(1) >> 57, h(2) >> 57, "control bytes differ for neighbours");
    }
}
