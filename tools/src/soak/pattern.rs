//! Data patterns and the soak's random numbers: every message carries bytes
//! that are a pure function of (run seed, stream, generation, offset), so the
//! receiver can check any byte without a copy of what was sent.

/// SplitMix64's finalizer: a cheap, well-mixed 64-bit hash.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The key of one message's pattern.
pub fn key(seed: u64, stream: u64, gen: u64) -> u64 {
    mix(seed ^ mix(stream.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ mix(gen)))
}

fn word(key: u64, i: usize) -> [u8; 8] {
    mix(key ^ (i as u64).wrapping_mul(0xd6e8_feb8_6659_fd93)).to_le_bytes()
}

/// Fill `buf` with the pattern of `key` (byte `j` of `buf` is byte `j` of the message).
pub fn fill(buf: &mut [u8], key: u64) {
    for (i, chunk) in buf.chunks_mut(8).enumerate() {
        let w = word(key, i);
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
}

/// The first offset at which `buf` differs from the pattern of `key`.
pub fn check(buf: &[u8], key: u64) -> Option<usize> {
    for (i, chunk) in buf.chunks(8).enumerate() {
        let w = word(key, i);
        if chunk != &w[..chunk.len()] {
            let j = chunk.iter().zip(w.iter()).position(|(a, b)| a != b).unwrap_or(0);
            return Some(i * 8 + j);
        }
    }
    None
}

/// First offset where two slices differ (they have the same length).
pub fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    if a == b {
        return None;
    }
    Some(a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len())))
}

/// A small, fast, seeded generator (xorshift64*), deterministic per seed.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` (any value, 0 included).
    pub fn new(seed: u64) -> Rng {
        Rng(mix(seed) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (`n` > 0; 0 gives 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo).saturating_add(1))
    }

    /// True with probability `pct`/100.
    pub fn percent(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_checks_what_it_filled_and_finds_a_flipped_bit() {
        for len in [0usize, 1, 7, 8, 9, 1000, 4099] {
            let mut b = vec![0u8; len];
            fill(&mut b, key(1, 2, 3));
            assert_eq!(check(&b, key(1, 2, 3)), None, "{len}");
            if len > 0 {
                assert!(check(&b, key(1, 2, 4)).is_some(), "another generation differs");
                let at = len / 2;
                b[at] ^= 0x10;
                assert_eq!(check(&b, key(1, 2, 3)), Some(at));
            }
        }
    }

    #[test]
    fn rng_stays_in_range_and_repeats_per_seed() {
        let mut a = Rng::new(5);
        let mut b = Rng::new(5);
        for _ in 0..1000 {
            let x = a.range(3, 9);
            assert!((3..=9).contains(&x));
            assert_eq!(x, b.range(3, 9));
        }
        assert_eq!(Rng::new(0).below(0), 0);
    }
}
