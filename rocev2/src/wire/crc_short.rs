//! CRC-32 (the ICRC's: reflected polynomial 0xEDB88320) of short buffers,
//! 16 to [`SHORT_MAX`] bytes, in one or two carry-less-multiply lanes: the masked
//! headers of every frame (40 to 104 bytes) and the payload of small ones.
//!
//! `crc32fast` computes the same, but each call builds a `Hasher`, which
//! detects the CPU's features again (about 40 instructions) before a fold of
//! a few blocks that costs about as much; at five short CRCs a frame pair
//! (callgrind, 64 B WRITE) that set-up was a third of the ICRC work. Here
//! the features are detected once for the process ([`has`]: one load).
//!
//! The method is the bit-reflected fold of Intel's white paper "Fast CRC
//! Computation for Generic Polynomials Using PCLMULQDQ Instruction" (Gopal
//! et al., 2009), as [`super::crc`]'s fused kernel uses it, and a final
//! reduction of 128 → 64 bits in one step (the lane's words each moved by
//! its own distance, [`reduce`]) and Barrett's 64 → 32. A buffer whose length is
//! not a multiple of 16 is treated as if it had leading zero bytes up to the
//! next multiple: with the CRC register entering as a change to the first 4
//! message bytes, leading zeros before it do not change the result, so the
//! partial block comes first (shifted up inside its lane) and every later
//! load is a whole 16 bytes of the buffer.

#[cfg(target_arch = "x86_64")]
use core::arch::x86_64::*;

/// Longest buffer this kernel takes (and the longest run
/// [`super::crc::update_masked`] takes); from 128 bytes on `crc32fast` folds
/// four lanes (or wider) at once, which beats one lane's chain of
/// dependent multiplications (`benches/wire.rs` `crc_short`: at 128 bytes
/// one lane took 1.09x the time of `crc32fast`'s Hasher, at 80 bytes 0.80x).
pub const SHORT_MAX: usize = 127;

/// The CRC-32 polynomial x^32 + x^26 + ... + 1 (bit 32 set, not reflected).
const POLY: u64 = 0x1_04C1_1DB7;

/// x^n mod P, not reflected (degree < 32).
pub(super) const fn xpow_mod(n: u32) -> u32 {
    times_xpow(1, n)
}

/// `r` · x^n mod P, not reflected (`r` of degree < 32): `r` shifted up
/// `n` times, P subtracted whenever x^32 appears.
pub(super) const fn times_xpow(r: u32, n: u32) -> u32 {
    let mut r = r as u64;
    let mut i = 0;
    while i < n {
        r <<= 1;
        if r & (1 << 32) != 0 {
            r ^= POLY;
        }
        i += 1;
    }
    r as u32
}

/// The two multipliers that fold a 128-bit lane forward by `d` bits (low
/// half, high half), in the reflected domain (this kernel's and
/// [`super::crc`]'s fused one).
pub const fn fold_keys(d: u32) -> (u64, u64) {
    ((xpow_mod(d + 32).reverse_bits() as u64) << 1, (xpow_mod(d - 32).reverse_bits() as u64) << 1)
}

/// Shortest buffer this kernel takes (one whole lane).
pub const SHORT_MIN: usize = 16;

/// Fold one lane forward by 128 bits (low, high multiplier).
const K128: (u64, u64) = fold_keys(128);

/// Fold one lane forward by 256 bits (two lanes in flight).
const K256: (u64, u64) = fold_keys(256);

/// x^64 mod P, bit-reflected and shifted as [`reduce`] multiplies a lane's
/// third word by it.
const K64: u64 = (xpow_mod(64).reverse_bits() as u64) << 1;

/// x^128 mod P, the same for a lane's first word (its second takes
/// x^96 mod P: [`K128`]'s high key).
const K_WORD0: u64 = (xpow_mod(128).reverse_bits() as u64) << 1;

/// The polynomial P(x), bit-reflected, with its x^32 term (Barrett's P).
const P_REFLECTED: u64 = 0x1_db71_0641;

/// Barrett's μ = floor(x^64 / P(x)), bit-reflected (33 bits).
const MU_REFLECTED: u64 = 0x1_f701_1641;

/// Whether this CPU can run [`update`] and [`super::crc`]'s fused kernel,
/// as bits ([`SHORT`], [`FUSED`]) plus [`KNOWN`], once detected.
#[cfg(target_arch = "x86_64")]
static FEATURES: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// [`FEATURES`] bit: PCLMULQDQ, SSSE3 and SSE4.1 ([`update`]).
#[cfg(target_arch = "x86_64")]
pub const SHORT: u8 = 1;

/// [`FEATURES`] bit: AVX2 and VPCLMULQDQ with [`SHORT`]'s features (the
/// fused copy kernel and the long masked run, which finish with the short
/// kernel's reduction).
#[cfg(target_arch = "x86_64")]
pub const FUSED: u8 = 2;

/// [`FEATURES`] bit: AVX-512F and VPCLMULQDQ with [`FUSED`]'s features (the
/// fused copy's 512-bit kernel).
#[cfg(target_arch = "x86_64")]
pub const WIDE512: u8 = 8;

/// [`FEATURES`] bit: AVX-512BW with [`WIDE512`]'s features (byte-masked
/// stores: the receive side's masked run that places a frame's payload as
/// it folds the frame).
#[cfg(target_arch = "x86_64")]
pub const PLACE512: u8 = 16;

/// [`FEATURES`] bit: the others are valid.
#[cfg(target_arch = "x86_64")]
const KNOWN: u8 = 4;

/// Whether the CPU has every feature of `bits` ([`SHORT`], [`FUSED`]): one
/// load of a value detected once, where `std::is_x86_feature_detected!`
/// costs about nine instructions per feature and call (three features per
/// kernel, several kernels per frame).
#[cfg(target_arch = "x86_64")]
#[inline]
pub fn has(bits: u8) -> bool {
    use std::sync::atomic::Ordering::Relaxed;
    let mut f = FEATURES.load(Relaxed);
    if f == 0 {
        f = detect();
        FEATURES.store(f, Relaxed);
    }
    f & bits == bits
}

#[cfg(target_arch = "x86_64")]
#[cold]
fn detect() -> u8 {
    let short = std::is_x86_feature_detected!("pclmulqdq") && std::is_x86_feature_detected!("ssse3") && std::is_x86_feature_detected!("sse4.1");
    // The fused kernels finish with this one's reduction: FUSED implies SHORT.
    let fused = short && std::is_x86_feature_detected!("vpclmulqdq") && std::is_x86_feature_detected!("avx2");
    let wide512 = fused && std::is_x86_feature_detected!("avx512f");
    let place512 = wide512 && std::is_x86_feature_detected!("avx512bw");
    KNOWN | if short { SHORT } else { 0 } | if fused { FUSED } else { 0 } | if wide512 { WIDE512 } else { 0 } | if place512 { PLACE512 } else { 0 }
}

/// Whether this CPU can run [`update`].
#[cfg(target_arch = "x86_64")]
#[inline]
pub fn available() -> bool {
    has(SHORT)
}

/// Continue the finished CRC `crc` over `data` (`SHORT_MIN..=SHORT_MAX`
/// bytes; other lengths are accepted but meant for `crc32fast`).
///
/// # Safety
/// The CPU must have PCLMULQDQ, SSSE3 and SSE4.1 ([`available`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "pclmulqdq,ssse3,sse4.1")]
pub unsafe fn update(crc: u32, data: &[u8]) -> u32 {
    if data.len() < SHORT_MIN {
        let mut h = crc32fast::Hasher::new_with_initial(crc);
        h.update(data);
        return h.finalize();
    }
    // SAFETY: the caller vouches for the CPU (the same features).
    unsafe { fold_run(crc, data, None) }
}

/// [`update`] over `data` with every byte ORed with the byte of `mask` at
/// the same place, without writing the masked bytes anywhere: the ICRC's
/// masked header fields (all ones) are set in the lanes as they are
/// loaded. Copying the headers to a buffer and storing the ones there made
/// every 16-byte load of that buffer wait for the byte stores before it
/// (a store-forwarding stall, several per frame). `None` if `data` is not
/// `SHORT_MIN..=SHORT_MAX` bytes or `mask` is shorter.
///
/// # Safety
/// As [`update`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "pclmulqdq,ssse3,sse4.1")]
pub unsafe fn update_masked(crc: u32, data: &[u8], mask: &[u8]) -> Option<u32> {
    if !(SHORT_MIN..=SHORT_MAX).contains(&data.len()) || mask.len() < data.len() {
        return None;
    }
    // SAFETY: the caller vouches for the CPU (the same features).
    Some(unsafe { fold_run(crc, data, Some(mask)) })
}

/// The fold of [`update`] for `SHORT_MIN..` bytes, each lane ORed with the
/// same lane of `mask` if there is one (`mask` at least as long as `data`).
///
/// # Safety
/// As [`fold_run_lane`].
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "pclmulqdq,ssse3,sse4.1")]
unsafe fn fold_run(crc: u32, data: &[u8], mask: Option<&[u8]>) -> u32 {
    // SAFETY: the caller vouches for the CPU (the same features).
    reduce(unsafe { fold_run_lane(crc, data, mask) })
}

/// The masked fold of [`update_masked`] left unreduced: the 128-bit lane
/// whose [`reduce`] is the finished CRC, for a run that a fused copy
/// continues ([`advance`]) with one reduction at the frame's end instead of
/// one here and one there.
///
/// # Safety
/// As [`update`], and `data` is `SHORT_MIN..` bytes and `mask` at least
/// as long (the caller checks: [`super::crc::update_masked_lane`]): the
/// lanes are loaded without a bounds check each.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "pclmulqdq,ssse3,sse4.1")]
pub unsafe fn update_masked_lane(crc: u32, data: &[u8], mask: &[u8]) -> __m128i {
    // SAFETY: the caller vouches for the CPU (the same features).
    unsafe { fold_run_lane(crc, data, Some(mask)) }
}

/// The fold of [`fold_run`] before its reduction.
///
/// # Safety
/// As [`update`], and `data` is `SHORT_MIN..` bytes and `mask`, if any, at
/// least as long: each lane is loaded without a bounds check (two checks a
/// load, for the buffer and the mask, were about half of the kernel's
/// instructions, and the kernel runs four times per 64 B WRITE).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "pclmulqdq,ssse3,sse4.1")]
unsafe fn fold_run_lane(crc: u32, data: &[u8], mask: Option<&[u8]>) -> __m128i {
    let len = data.len();
    let register = !crc;
    // `lead` bytes of the buffer make a partial first lane (0 = none).
    let lead = len % 16;
    let keys = _mm_set_epi64x(K128.1 as i64, K128.0 as i64);
    debug_assert!(len >= SHORT_MIN && mask.is_none_or(|m| m.len() >= len));
    let lane = |b: &[u8], at: usize| -> __m128i {
        // SAFETY: every `at` below has 16 bytes after it within `len`
        // (`at + 16 <= len`), and `b` (the data or the mask) holds at least
        // `len` bytes (the caller's contract); loadu needs no alignment.
        unsafe { _mm_loadu_si128(b.as_ptr().add(at).cast()) }
    };
    let load = |at: usize| -> __m128i {
        match mask {
            Some(m) => _mm_or_si128(lane(data, at), lane(m, at)),
            None => lane(data, at),
        }
    };
    let (mut x, mut at) = if lead == 0 {
        (_mm_xor_si128(load(0), _mm_cvtsi32_si128(register as i32)), 16)
    } else {
        // The first lane: `16 - lead` zero bytes, then the buffer's first
        // `lead` bytes (its first 16 bytes shifted up by `16 - lead`: byte
        // i of the lane takes byte i - (16 - lead), or zero where that is
        // negative, which sets the shuffle index's top bit).
        let first = _mm_xor_si128(load(0), _mm_cvtsi32_si128(register as i32));
        let index = _mm_add_epi8(_mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm_set1_epi8(lead as i8 - 16));
        let head = _mm_shuffle_epi8(first, index);
        // The second lane is bytes `lead..lead + 16`; the register's bytes
        // beyond `lead` (lead < 4) belong to it.
        let spill = if lead < 4 { register >> (8 * lead) } else { 0 };
        let second = _mm_xor_si128(load(lead), _mm_cvtsi32_si128(spill as i32));
        (fold(head, second, keys), lead + 16)
    };
    // Two lanes in flight: `x` takes the lanes at `at`, `at + 32`, ...,
    // `y` those in between, each folded 32 bytes forward a step, then `x`
    // onto `y`. One lane's chain of dependent multiplications was the
    // kernel's limit (`perf annotate`: most samples on the XOR waiting for
    // each fold); two chains of half the length overlap.
    if at + 32 <= len {
        let k256 = _mm_set_epi64x(K256.1 as i64, K256.0 as i64);
        let mut y = load(at);
        at += 16;
        while at + 32 <= len {
            x = fold(x, load(at), k256);
            y = fold(y, load(at + 16), k256);
            at += 32;
        }
        x = fold(x, y, keys);
    }
    while at + 16 <= len {
        x = fold(x, load(at), keys);
        at += 16;
    }
    x
}

/// Lane `x` folded forward by 16 bytes onto zeros: what enters the first
/// 16-byte lane of the bytes after the ones `x` stands for (where a finished
/// CRC enters as its complement in the lane's first 4 bytes).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "pclmulqdq")]
pub(super) fn advance(x: __m128i) -> __m128i {
    fold(x, _mm_setzero_si128(), _mm_set_epi64x(K128.1 as i64, K128.0 as i64))
}

/// Fold lane `a` forward by the distance `keys` were made for
/// ([`fold_keys`]) onto `b`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "pclmulqdq")]
pub(super) fn fold(a: __m128i, b: __m128i, keys: __m128i) -> __m128i {
    let lo = _mm_clmulepi64_si128(a, keys, 0x00);
    let hi = _mm_clmulepi64_si128(a, keys, 0x11);
    _mm_xor_si128(_mm_xor_si128(lo, hi), b)
}

/// The finished CRC of a 128-bit lane (the CRC register after the bytes
/// it stands for, complemented).
///
/// 128 → 64 bits in one step: the lane's first three 32-bit words (the
/// earliest bytes) each times x^128, x^96 or x^64 mod P, three independent
/// multiplications, the last word as it is; then Barrett (two). The usual
/// reduction (128 → 96 bits, then 96 → 64, then Barrett) was a chain of
/// four dependent multiplications at the end of every frame's CRC, sent
/// and checked: most of a 64 B WRITE's masked run's samples (`perf`).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "pclmulqdq,sse4.1")]
pub(super) fn reduce(x: __m128i) -> u32 {
    // Words 0 and 2 against the low and high keys, word 1 (shifted down)
    // against its own; each product has at most 64 bits.
    let even = _mm_and_si128(x, _mm_set_epi32(0, -1, 0, -1));
    let k02 = _mm_set_epi64x(K64 as i64, K_WORD0 as i64);
    let w0 = _mm_clmulepi64_si128(even, k02, 0x00);
    let w2 = _mm_clmulepi64_si128(even, k02, 0x11);
    let w1 = _mm_clmulepi64_si128(_mm_srli_epi64(x, 32), _mm_set_epi64x(0, K128.1 as i64), 0x00);
    let r = _mm_xor_si128(_mm_xor_si128(w0, w2), _mm_xor_si128(w1, _mm_srli_si128(x, 12)));
    // Barrett: T1 = (R mod x^32) · μ, T2 = (T1 mod x^32) · P, CRC = (R ^ T2) / x^32
    // (the reflected form keeps the result in bits 32..64).
    let low32 = _mm_set_epi32(0, 0, 0, -1);
    let pmu = _mm_set_epi64x(MU_REFLECTED as i64, P_REFLECTED as i64);
    let t1 = _mm_clmulepi64_si128(_mm_and_si128(r, low32), pmu, 0x10);
    let t2 = _mm_clmulepi64_si128(_mm_and_si128(t1, low32), pmu, 0x00);
    !(_mm_extract_epi32(_mm_xor_si128(r, t2), 1) as u32)
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    fn reference(crc: u32, data: &[u8]) -> u32 {
        let mut h = crc32fast::Hasher::new_with_initial(crc);
        h.update(data);
        h.finalize()
    }

    #[test]
    fn matches_crc32fast_for_every_short_length_start_and_initial_value() {
        if !available() {
            eprintln!("this CPU has no PCLMULQDQ/SSSE3/SSE4.1: the short kernel is not used here");
            return;
        }
        let buf = crate::wire::test_noise::XorShift::new(0x9e37_79b9).bytes(400);
        for len in 0..=SHORT_MAX + 40 {
            for off in [0, 1, 7, 15, 16, 33] {
                for init in [0, !0, 0xdead_beef, 0x2144_df1c /* the ICRC's start, icrc::LRH_CRC */, 0x0000_00ff, 0xff00_0000] {
                    let d = &buf[off..off + len];
                    // SAFETY: available() said yes.
                    let got = unsafe { update(init, d) };
                    assert_eq!(got, reference(init, d), "len {len} offset {off} init {init:#x}");
                }
            }
        }
        // Masked: the same as the CRC of the ORed copy; refused lengths.
        let mask: Vec<u8> = buf.iter().rev().map(|b| b & 0x81).collect();
        for len in SHORT_MIN..=SHORT_MAX {
            let ored: Vec<u8> = buf[..len].iter().zip(&mask).map(|(a, m)| a | m).collect();
            // SAFETY: available() said yes.
            assert_eq!(unsafe { update_masked(7, &buf[..len], &mask) }, Some(reference(7, &ored)), "masked, len {len}");
        }
        // SAFETY: available() said yes (all three).
        unsafe {
            assert_eq!(update_masked(7, &buf[..15], &mask), None);
            assert_eq!(update_masked(7, &buf[..SHORT_MAX + 1], &mask), None);
            assert_eq!(update_masked(7, &buf[..40], &mask[..39]), None);
        }
        // CRC-32 of "123456789" continued from an empty start, padded to 16+.
        // SAFETY: available() said yes.
        assert_eq!(unsafe { update(0, b"123456789abcdefgh") }, reference(0, b"123456789abcdefgh"));
    }
}
