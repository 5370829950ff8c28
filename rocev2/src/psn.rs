//! Packet sequence numbers: 24-bit serial numbers with wraparound.
//!
//! IBTA 9.7.1: "PSNs are 24 bits and wrap". Two PSNs are ordered by the signed
//! distance between them: `b` is after `a` when `b - a`, taken modulo 2^24 and
//! read as a signed 24-bit number, is positive (the rule rxe implements as
//! `psn_compare`: `((a - b) << 8) as i32`).

use core::cmp::Ordering;
use core::fmt;

/// Mask of the 24 PSN bits.
pub const PSN_MASK: u32 = 0x00ff_ffff;

/// A 24-bit packet sequence number.
///
/// `Psn` deliberately does not implement `Ord`: PSN order is only meaningful
/// within half the number space. Use [`Psn::cmp_serial`], [`Psn::distance`]
/// and the `is_*` helpers instead.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// The PSN `value & 0xffffff`.
    pub const fn new(value: u32) -> Psn {
        Psn(value & PSN_MASK)
    }

    /// The 24-bit value.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// This PSN advanced by `n` (mod 2^24).
    #[must_use]
    pub const fn add(self, n: u32) -> Psn {
        Psn(self.0.wrapping_add(n) & PSN_MASK)
    }

    /// This PSN moved back by `n` (mod 2^24).
    #[must_use]
    pub const fn sub(self, n: u32) -> Psn {
        Psn(self.0.wrapping_sub(n) & PSN_MASK)
    }

    /// The next PSN.
    #[must_use]
    pub const fn next(self) -> Psn {
        self.add(1)
    }

    /// Signed distance `self - other` in the 24-bit serial space,
    /// in `-2^23 ..= 2^23 - 1`.
    pub const fn distance(self, other: Psn) -> i32 {
        (self.0.wrapping_sub(other.0) << 8) as i32 >> 8
    }

    /// Serial-number comparison: `Less` when `self` comes before `other`.
    pub const fn cmp_serial(self, other: Psn) -> Ordering {
        let d = self.distance(other);
        if d < 0 {
            Ordering::Less
        } else if d > 0 {
            Ordering::Greater
        } else {
            Ordering::Equal
        }
    }

    /// `self` comes strictly before `other`.
    pub const fn is_before(self, other: Psn) -> bool {
        self.distance(other) < 0
    }

    /// `self` comes strictly after `other`.
    pub const fn is_after(self, other: Psn) -> bool {
        self.distance(other) > 0
    }

    /// `self` lies in the half-open range `[start, end)` (in serial order).
    pub const fn in_range(self, start: Psn, end: Psn) -> bool {
        !self.is_before(start) && self.is_before(end)
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({:#08x})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

impl From<Psn> for u32 {
    fn from(p: Psn) -> u32 {
        p.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_at_24_bits() {
        let top = Psn::new(PSN_MASK);
        assert_eq!(top.next(), Psn::new(0));
        assert_eq!(Psn::new(0).sub(1), top);
        assert_eq!(Psn::new(0x1_000_005), Psn::new(5));
        assert!(top.is_before(Psn::new(0)));
        assert!(Psn::new(3).is_after(top));
        assert_eq!(Psn::new(3).distance(top), 4);
        assert_eq!(top.distance(Psn::new(3)), -4);
    }

    #[test]
    fn half_space_ordering() {
        let a = Psn::new(10);
        assert_eq!(a.add(0x7f_ffff).distance(a), 0x7f_ffff);
        assert_eq!(a.add(0x80_0000).distance(a), -0x80_0000);
        assert!(Psn::new(5).in_range(Psn::new(PSN_MASK - 2), Psn::new(6)));
        assert!(!Psn::new(6).in_range(Psn::new(PSN_MASK - 2), Psn::new(6)));
        assert_eq!(a.cmp_serial(a), Ordering::Equal);
    }

    #[test]
    fn matches_rxe_psn_compare() {
        // rxe: psn_compare(a, b) = (s32)((a - b) << 8)
        for &(a, b) in &[(0u32, 1u32), (1, 0), (0xffffff, 0), (0, 0xffffff), (0x800000, 0), (5, 0x7fffff)] {
            let rxe = ((a.wrapping_sub(b)) << 8) as i32;
            assert_eq!(Psn::new(a).cmp_serial(Psn::new(b)), rxe.cmp(&0), "{a:#x} vs {b:#x}");
        }
    }
}
