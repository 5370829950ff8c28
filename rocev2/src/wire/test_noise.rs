//! Seeded pseudo-random data for the wire layer's property tests: every
//! run sees the same bytes, and no test carries a generator of its own.

/// Marsaglia's 64-bit xorshift (shifts 13, 7, 17): fast and reproducible,
/// not for anything but test data.
pub(crate) struct XorShift(u64);

impl XorShift {
    /// A generator started at `seed` (made odd: zero would stay zero).
    pub(crate) fn new(seed: u64) -> Self {
        XorShift(seed | 1)
    }

    /// The next 64 bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Fill `buf`, eight bytes a step (little-endian; a short tail takes
    /// the low bytes of one more step).
    pub(crate) fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let word = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
    }

    /// `n` bytes.
    pub(crate) fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0; n];
        self.fill(&mut v);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_bytes_and_the_bytes_vary() {
        let a = XorShift::new(7).bytes(1000);
        assert_eq!(a, XorShift::new(7).bytes(1000));
        assert_ne!(a, XorShift::new(8).bytes(1000));
        // Every byte value turns up in 1000 bytes of any reasonable noise
        // but for a few: no stuck bits.
        let or = a.iter().fold(0u8, |o, &b| o | b);
        let and = a.iter().fold(0xffu8, |o, &b| o & b);
        assert_eq!((or, and), (0xff, 0));
        // Zero is not a fixed point.
        assert_ne!(XorShift::new(0).next_u64(), 0);
    }
}
