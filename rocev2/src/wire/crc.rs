//! CRC-32 as the ICRC uses it (the Ethernet/zlib CRC: reflected polynomial
//! 0xEDB88320), continued over a buffer, and fused with a copy.
//!
//! A requester builds a frame by copying the payload out of a registered
//! region into the frame and then computing the ICRC over the frame, which
//! reads the payload a second time. [`copy_update`] does both in one pass:
//! each 128-byte block is loaded once, stored to the frame and folded into
//! the CRC, so the copy costs only its stores (about 120 ns of a 4 KiB
//! frame's 350 ns on the machine the README's figures come from). The CRC
//! also covers exactly the bytes stored, even if the application changes its
//! buffer meanwhile (which the verbs rules leave undefined, but which must
//! not turn into a frame the peer drops for a bad ICRC).
//!
//! The folding is the scheme of Intel's white paper "Fast CRC Computation for
//! Generic Polynomials Using PCLMULQDQ Instruction" (Gopal et al., 2009) in
//! its bit-reflected form, 4 × 512 bits per step with VPCLMULQDQ on AVX-512
//! CPUs (4 × 256 bits on AVX2 ones, and for copies under 1 KiB): a 128-bit
//! lane `a` that lies `D` bits before lane `b` is folded into it as
//! `clmul(a.lo, k1) ^ clmul(a.hi, k2) ^ b`, with
//! `k1 = reflect32(x^(D+32) mod P) << 1` and `k2 = reflect32(x^(D-32) mod P) << 1`
//! ([`fold_keys`], computed at compile time). Folding keeps the CRC: the
//! register after the whole buffer equals the register after feeding the 16
//! bytes the folds end with, from a zero register. Those 16 bytes are reduced
//! by the short kernel's final reduction; the tail and short buffers go
//! through the short kernel or `crc32fast`, as do CPUs without VPCLMULQDQ/AVX2.
//! A frame's header CRC can enter the copy unreduced ([`CrcLane`]), so that a
//! frame has one final reduction; it joins the copy's lane at the end (moved
//! there in one fold, keys from a table of whole-lane distances), so the copy
//! does not wait for it. The wide kernels' accumulators collapse the same
//! way, each lane moved by its own distance at once.

#[cfg(target_arch = "x86_64")]
use super::crc_short;
pub use super::crc_short::{fold_keys, SHORT_MAX};

/// Copies shorter than this take `copy_from_slice` + `crc32fast`: the fused
/// kernel's set-up and final folds cost more than they save.
pub const FUSED_MIN: usize = 512;

/// Copies from this length on take the 512-bit kernel where the CPU has
/// AVX-512 (sixteen lanes; below, the 256-bit one's shorter set-up wins).
pub const FUSED512_MIN: usize = 1024;

/// Continue a CRC-32: `crc` is a finished CRC (as `crc32fast::Hasher`
/// reports it; 0 for an empty start), the result is the CRC of everything
/// before plus `data`.
#[inline]
pub fn update(crc: u32, data: &[u8]) -> u32 {
    // Nothing to add (a frame without pad, a 16-byte-multiple tail): skip
    // the hasher's set-up, which detects CPU features on every call.
    if data.is_empty() {
        return crc;
    }
    #[cfg(target_arch = "x86_64")]
    if (crc_short::SHORT_MIN..=crc_short::SHORT_MAX).contains(&data.len()) && crc_short::available() {
        // SAFETY: the CPU has the instructions (checked just above).
        return unsafe { crc_short::update(crc, data) };
    }
    let mut h = crc32fast::Hasher::new_with_initial(crc);
    h.update(data);
    h.finalize()
}

/// [`update`] over `data` with each byte ORed with `mask`'s byte at the
/// same place (the ICRC's masked fields), reading `data` in place: `None`
/// where the short kernel cannot take it (other lengths, no PCLMULQDQ, a
/// `mask` shorter than `data`), and the caller masks a copy instead.
#[inline]
pub fn update_masked(crc: u32, data: &[u8], mask: &[u8]) -> Option<u32> {
    // The lengths are checked here, inline, before the call: a full-MTU
    // frame's check (`icrc::compute`) asks first and was refused by the
    // kernel's own check after a call and its register shuffles (most of
    // `compute`'s own samples, `perf annotate`).
    #[cfg(target_arch = "x86_64")]
    if (crc_short::SHORT_MIN..=SHORT_MAX).contains(&data.len()) && mask.len() >= data.len() && crc_short::available() {
        // SAFETY: the CPU has the instructions (checked just above).
        return unsafe { crc_short::update_masked(crc, data, mask) };
    }
    let _ = (crc, data, mask);
    None
}

/// Bytes at the start of a run that [`update_masked_head`] masks: the
/// ICRC's variant fields all lie in the first 64 bytes after the LRH (an
/// IPv6 header, UDP and the BTH's byte 4 end at byte 53).
pub const MASK_HEAD: usize = 64;

/// [`update`] over `data` ([`FUSED_MIN_MASKED`] to [`FUSED_MAX_MASKED`] bytes) with its
/// first [`MASK_HEAD`] bytes ORed with `mask` (the ICRC's variant fields),
/// read in place, in one pass of the wide kernel: a received frame's whole
/// ICRC with one kernel set-up and one final reduction, where a masked run
/// over the headers and `crc32fast` over the rest took two of each. `None`
/// where this CPU has no VPCLMULQDQ/AVX2 or `data` is shorter; the caller
/// then takes the two runs, as for longer runs.
#[inline]
pub fn update_masked_head(crc: u32, data: &[u8], mask: &[u8; MASK_HEAD]) -> Option<u32> {
    #[cfg(target_arch = "x86_64")]
    if data.len() >= FUSED512_MIN_MASKED && fused::available512() {
        // SAFETY: the CPU has the instructions (checked just above) and
        // `data` has at least one 256-byte block.
        return Some(unsafe { fused::fold_masked512(!crc, data, mask) });
    }
    #[cfg(target_arch = "x86_64")]
    if (FUSED_MIN_MASKED..FUSED_MAX_MASKED).contains(&data.len()) && fused::available() {
        // SAFETY: the CPU has the instructions (checked just above) and
        // `data` has at least one 128-byte block.
        return Some(unsafe { fused::fold_masked(!crc, data, mask) });
    }
    let _ = (crc, data, mask);
    None
}

/// Shortest payload [`update_masked_place`] places: a run of at least one
/// 256-byte block once the headers are added.
pub const PLACE_MIN: usize = 256;

/// Whether this CPU runs [`update_masked_place`] (AVX-512F and BW,
/// VPCLMULQDQ).
#[inline]
pub fn place_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return fused::available_place512();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// [`update_masked_head`] over `data` (a received packet's ICRC run: from
/// its IP header to its ICRC) that also copies `data[skip..skip + len]` (its
/// payload) to `dst` as it folds, in the same pass: each 64 bytes loaded
/// once, folded, and stored whole where they belong (the payload's last 64
/// bytes stored once more, overlapping). Every byte of the CRC and of the
/// copy comes from `data`; nothing is read from `dst` (registered memory, which the
/// application may touch at any time). `None`, with nothing written, where
/// this CPU lacks the kernel ([`place_available`]) or the run does not fit
/// it: `data` shorter than 256 bytes, the payload starting before byte 16,
/// beyond byte 64 or not at a multiple of 4 (RoCEv2 headers are whole
/// 4-byte words: IPv4 20-60, UDP 8, BTH 12), or ending beyond `data`.
///
/// # Safety
/// `dst` must be valid for writes of `len` bytes and must not overlap
/// `data`.
#[inline]
pub unsafe fn update_masked_place(crc: u32, data: &[u8], mask: &[u8; MASK_HEAD], skip: usize, len: usize, dst: *mut u8) -> Option<u32> {
    #[cfg(target_arch = "x86_64")]
    if data.len() >= 256
        && (16..=MASK_HEAD).contains(&skip)
        && skip.is_multiple_of(4)
        && skip.checked_add(len).is_some_and(|end| end <= data.len())
        && fused::available_place512()
    {
        // SAFETY: the CPU has the instructions and the lengths fit (checked
        // just above); the caller vouches for `dst`.
        return Some(unsafe { fused::fold_masked_place512(!crc, data, mask, skip, len, dst) });
    }
    let _ = (crc, data, mask, skip, len, dst);
    None
}

/// Whether this CPU runs the wide kernels ([`update_masked_head`] and the
/// fused copy of [`copy_update`]).
#[inline]
pub fn wide_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return fused::available();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Shortest run [`update_masked_head`] takes: one 128-byte block of its
/// four 256-bit lanes (shorter runs fit the short kernel's masked run).
pub const FUSED_MIN_MASKED: usize = 128;

/// Runs from this length on take the 512-bit kernel where the CPU has
/// AVX-512 (one whole 256-byte step).
pub const FUSED512_MIN_MASKED: usize = 256;

/// Without AVX-512, runs from this length on are left to `crc32fast` after the masked
/// headers: on AVX-512 CPUs it folds sixteen 128-bit lanes from 2 KiB on,
/// which is faster than four 256-bit ones once the set-up is shared by
/// enough bytes (`benches/wire.rs` `icrc`, same run, lower bounds of three
/// runs: a 4154-byte frame 159-208 ns against 120-178 ns for the two runs;
/// a 1082-byte frame 41-56 ns against 52-72 ns).
pub const FUSED_MAX_MASKED: usize = 2048;

/// Copy `src` into the start of `dst` (as many bytes as both have) and
/// continue `crc` over the bytes copied: the same as
/// `dst[..n].copy_from_slice(&src[..n])` followed by [`update`]`(crc, &dst[..n])`,
/// in one pass.
pub fn copy_update(crc: u32, src: &[u8], dst: &mut [u8]) -> u32 {
    let n = src.len().min(dst.len());
    // SAFETY: `src` has `n` readable bytes, and a shared slice cannot
    // overlap the exclusive `dst`.
    unsafe { copy_update_raw(crc, src.as_ptr(), &mut dst[..n]) }
}

/// [`copy_update`] from a raw source of `dst.len()` bytes (registered memory,
/// which the memory table reaches by pointer).
///
/// # Safety
/// `src` must be valid for reads of `dst.len()` bytes and must not overlap
/// `dst`.
pub unsafe fn copy_update_raw(crc: u32, src: *const u8, dst: &mut [u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if dst.len() >= FUSED_MIN && fused::available() {
        // The finished CRC enters as its complement in the first 4 bytes.
        // SAFETY: the CPU has the instructions (checked above); the caller
        // vouches for `src`.
        return unsafe { fused_copy(&core::arch::x86_64::_mm_cvtsi32_si128(!crc as i32), false, src, dst) };
    }
    // SAFETY: the caller vouches for `src` and that it does not overlap `dst`.
    unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
    update(crc, dst)
}

/// The fused copy of `dst.len() >= FUSED_MIN` bytes continuing `seed` (a
/// lane of the bytes before if `advance`, else a CRC register in the first
/// 4 bytes of the copy's first lane), finished: the seed moved to the
/// copy's last whole lane and added there (the copy itself folds from zero,
/// not waiting for the seed), the sum reduced, the bytes after it folded in.
/// The seed's fold, the kernel and the reduction inline into one function
/// per kernel width, so the lanes stay in registers.
///
/// # Safety
/// As [`copy_update_raw`], and the CPU has the fused kernel ([`fused::available`]).
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn fused_copy(seed: &core::arch::x86_64::__m128i, advance: bool, src: *const u8, dst: &mut [u8]) -> u32 {
    // SAFETY: the caller vouches for the CPU and for `src`.
    unsafe {
        if dst.len() >= FUSED512_MIN && fused::available512() {
            fused::copy_finish512(seed, advance, src, dst)
        } else {
            fused::copy_finish(seed, advance, src, dst)
        }
    }
}

/// A CRC in progress as the short kernel's unreduced 128-bit lane (on CPUs
/// without it, and elsewhere, a finished CRC): the ICRC over a frame's
/// headers, handed to the fused copy of its payload, which folds it into
/// its first lane ([`copy_update_lane_raw`]). One final reduction per frame
/// instead of two: the headers' reduction (a chain of four dependent
/// carry-less multiplications) and the copy's set-up for a finished CRC
/// were about 13 ns of a 1 KiB frame's send side (`perf`, 5.7% of user
/// samples).
#[derive(Clone, Copy, Debug)]
pub struct CrcLane {
    #[cfg(target_arch = "x86_64")]
    lane: core::arch::x86_64::__m128i,
    #[cfg(not(target_arch = "x86_64"))]
    crc: u32,
}

impl CrcLane {
    /// The finished CRC of everything this lane stands for.
    #[inline]
    pub fn finish(self) -> u32 {
        // SAFETY: a lane exists only where the short kernel ran
        // ([`update_masked_lane`]), so the CPU has its features.
        #[cfg(target_arch = "x86_64")]
        return unsafe { crc_short::reduce(self.lane) };
        #[cfg(not(target_arch = "x86_64"))]
        self.crc
    }
}

/// [`update_masked`] left unreduced ([`CrcLane`]): `None` where
/// [`update_masked`] would be.
#[inline]
pub fn update_masked_lane(crc: u32, data: &[u8], mask: &[u8]) -> Option<CrcLane> {
    #[cfg(target_arch = "x86_64")]
    if crc_short::available() && (crc_short::SHORT_MIN..=SHORT_MAX).contains(&data.len()) && mask.len() >= data.len() {
        // SAFETY: the CPU has the instructions and the lengths fit (checked just above).
        return Some(CrcLane { lane: unsafe { crc_short::update_masked_lane(crc, data, mask) } });
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (crc, data, mask);
    None
}

/// [`copy_update_raw`] continuing a [`CrcLane`]: the same result as
/// `copy_update_raw(lane.finish(), src, dst)`, with the lane folded into
/// the fused copy's first lane instead of reduced first where the copy
/// takes the fused kernel.
///
/// # Safety
/// As [`copy_update_raw`].
#[inline]
pub unsafe fn copy_update_lane_raw(lane: CrcLane, src: *const u8, dst: &mut [u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if dst.len() >= FUSED_MIN && fused::available() {
        // SAFETY: the CPU has the instructions (checked above); the caller
        // vouches for `src`.
        return unsafe { fused_copy(&lane.lane, true, src, dst) };
    }
    // SAFETY: as above.
    unsafe { copy_update_raw(lane.finish(), src, dst) }
}

/// [`copy_update`] continuing a [`CrcLane`] ([`copy_update_lane_raw`]).
pub fn copy_update_lane(lane: CrcLane, src: &[u8], dst: &mut [u8]) -> u32 {
    let n = src.len().min(dst.len());
    // SAFETY: `src` has `n` readable bytes, and a shared slice cannot
    // overlap the exclusive `dst`.
    unsafe { copy_update_lane_raw(lane, src.as_ptr(), &mut dst[..n]) }
}

#[cfg(target_arch = "x86_64")]
mod fused {
    use core::arch::x86_64::*;

    use super::crc_short::fold as fold128;
    use super::fold_keys;

    /// Whether this CPU can run [`fold_copy`] (detected once).
    #[inline]
    pub fn available() -> bool {
        super::crc_short::has(super::crc_short::FUSED)
    }

    const K1024: (u64, u64) = fold_keys(1024);
    const K128: (u64, u64) = fold_keys(128);

    /// Fold each 128-bit lane of `a` forward by the distance `k` was made
    /// for, and add `b`.
    #[inline]
    #[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq")]
    fn fold256(a: __m256i, b: __m256i, k: __m256i) -> __m256i {
        let lo = _mm256_clmulepi64_epi128(a, k, 0x00);
        let hi = _mm256_clmulepi64_epi128(a, k, 0x11);
        _mm256_xor_si256(_mm256_xor_si256(lo, hi), b)
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn keys256(k: (u64, u64)) -> __m256i {
        _mm256_set_epi64x(k.1 as i64, k.0 as i64, k.1 as i64, k.0 as i64)
    }

    /// Whether this CPU can run [`fold_copy512`] (detected once).
    #[inline]
    pub fn available512() -> bool {
        super::crc_short::has(super::crc_short::WIDE512)
    }

    const K2048: (u64, u64) = fold_keys(2048);

    /// [`fold256`] on four lanes.
    #[inline]
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    fn fold512(a: __m512i, b: __m512i, k: __m512i) -> __m512i {
        let lo = _mm512_clmulepi64_epi128(a, k, 0x00);
        let hi = _mm512_clmulepi64_epi128(a, k, 0x11);
        // lo ^ hi ^ b in one instruction (truth table 0x96: a three-way xor).
        _mm512_ternarylogic_epi64(lo, hi, b, 0x96)
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn keys512(k: (u64, u64)) -> __m512i {
        let (lo, hi) = (k.0 as i64, k.1 as i64);
        _mm512_set_epi64(hi, lo, hi, lo, hi, lo, hi, lo)
    }

    /// Fold the whole 16-byte lanes of `p[at..len]` onto `z` (fewer than
    /// sixteen: what a wide kernel's last block leaves): `z` and each lane
    /// but the last moved at once by its own distance to the last lane
    /// ([`join_keys`]) and added, instead of one chain of dependent folds
    /// (a received 1 KiB or 4 KiB frame's ICRC run ends in two or three
    /// lanes after its last block: 15% of `fold_masked512`'s samples sat
    /// in that chain, `perf annotate`).
    ///
    /// # Safety
    /// `p` must be valid for reads of `len` bytes.
    #[inline]
    #[target_feature(enable = "pclmulqdq")]
    unsafe fn fold_lanes(z: __m128i, p: *const u8, at: usize, len: usize) -> __m128i {
        let lanes = len.saturating_sub(at) / 16;
        // SAFETY: lane `i < lanes` lies inside the caller's `len` bytes.
        let lane = |i: usize| unsafe { _mm_loadu_si128(p.add(at + 16 * i).cast()) };
        let moved = |x: __m128i, by: usize| match join_keys(by) {
            Some(k) => fold128(x, _mm_setzero_si128(), k),
            None => x,
        };
        if lanes == 0 || lanes > JOIN_LANES {
            // Nothing to fold, or more than the table covers: one by one.
            let k128 = _mm_set_epi64x(K128.1 as i64, K128.0 as i64);
            return (0..lanes).fold(z, |z, i| fold128(z, lane(i), k128));
        }
        (0..lanes).fold(moved(z, lanes), |acc, i| _mm_xor_si128(acc, moved(lane(i), lanes - 1 - i)))
    }

    /// The finished CRC of a folded run ([`fold_lanes`] onto `z` from `at`,
    /// then the bytes after the last whole lane, [`finish_tail`]).
    ///
    /// # Safety
    /// `p` must be valid for reads of `len >= 16` bytes.
    #[inline]
    #[target_feature(enable = "pclmulqdq,ssse3,sse4.1")]
    unsafe fn finish_run(z: __m128i, p: *const u8, at: usize, len: usize) -> u32 {
        // SAFETY: the caller vouches for `len` bytes at `p`.
        let z = unsafe { fold_lanes(z, p, at, len) };
        // SAFETY: `len >= 16`: the last 16 bytes are inside the run.
        let last = unsafe { _mm_loadu_si128(p.add(len - 16).cast()) };
        finish_tail(z, last, len % 16)
    }

    /// Load the 256 bytes at `src`, store them at `dst`, return them as four 512-bit registers.
    ///
    /// # Safety
    /// 256 bytes readable at `src`, writable at `dst`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn move_block512(src: *const u8, dst: *mut u8) -> [__m512i; 4] {
        // SAFETY: the caller guarantees both ranges; loadu/storeu need no alignment.
        unsafe {
            let v = [
                _mm512_loadu_si512(src.cast()),
                _mm512_loadu_si512(src.add(64).cast()),
                _mm512_loadu_si512(src.add(128).cast()),
                _mm512_loadu_si512(src.add(192).cast()),
            ];
            _mm512_storeu_si512(dst.cast(), v[0]);
            _mm512_storeu_si512(dst.add(64).cast(), v[1]);
            _mm512_storeu_si512(dst.add(128).cast(), v[2]);
            _mm512_storeu_si512(dst.add(192).cast(), v[3]);
            v
        }
    }

    /// [`fold_copy512`] continuing `seed` (a lane of the bytes before if
    /// `advance`, else a CRC register in the first 4 bytes of the copy's
    /// first lane), reduced and continued over the tail: `super::fused_copy`'s
    /// 512-bit arm ([`split_seed`], [`finish_copy`]).
    ///
    /// # Safety
    /// As [`fold_copy512`].
    #[target_feature(enable = "avx512f,avx2,vpclmulqdq,pclmulqdq,ssse3,sse4.1")]
    pub unsafe fn copy_finish512(seed: &__m128i, advance: bool, src: *const u8, dst: &mut [u8]) -> u32 {
        let (moved, seed) = split_seed(*seed, advance, dst.len());
        // SAFETY: the caller vouches for the CPU and for `src`.
        let lane = unsafe { fold_copy512(seed, src, dst) };
        // SAFETY: `fold_copy512` took at least 256 bytes (its contract).
        unsafe { finish_copy(_mm_xor_si128(lane, moved), dst) }
    }

    /// [`copy_finish512`] with [`fold_copy`].
    ///
    /// # Safety
    /// As [`fold_copy`], and the CPU has SSSE3 and SSE4.1 ([`available`]).
    #[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,ssse3,sse4.1")]
    pub unsafe fn copy_finish(seed: &__m128i, advance: bool, src: *const u8, dst: &mut [u8]) -> u32 {
        let (moved, seed) = split_seed(*seed, advance, dst.len());
        // SAFETY: the caller vouches for the CPU and for `src`.
        let lane = unsafe { fold_copy(seed, src, dst) };
        // SAFETY: `fold_copy` took at least 128 bytes (its contract).
        unsafe { finish_copy(_mm_xor_si128(lane, moved), dst) }
    }

    /// How a fused copy of `len` (at least 128) bytes continues `seed` (as
    /// [`copy_finish512`] takes it): `(moved, kernel_seed)`, the kernel to
    /// fold from `kernel_seed` and `moved` to be added to its last lane.
    /// Where [`join_keys`] has the distance from the seed to the copy's last
    /// whole lane, the copy folds from zero and the seed, folded forward by
    /// that distance in one step, is `moved` (a CRC is linear: the register
    /// after `a` then `b` is that after `a` moved over `b`'s length, plus
    /// that of `b` from zero). The seed is the end of the frame's header
    /// run, a chain of dependent folds: entering the copy's first lane, it
    /// held back that lane's chain, and with it the whole copy's result
    /// (`perf annotate`: 17% of `emit_transport_and_icrc`'s samples on the
    /// first instruction after the lane's load); now the two chains run
    /// at once. Otherwise the seed enters the first lane (`moved` is zero).
    /// Inline parts rather than one function taking the kernel as a
    /// closure: the closure stayed a function of its own, its lane
    /// returned through memory.
    #[inline]
    #[target_feature(enable = "pclmulqdq")]
    fn split_seed(seed: __m128i, advance: bool, len: usize) -> (__m128i, __m128i) {
        debug_assert!(len >= 128);
        // A lane of the bytes before moves over all the copy's lanes; a
        // register in the first lane over the lanes after it.
        match join_keys(len / 16 - usize::from(!advance)) {
            Some(k) => (fold128(seed, _mm_setzero_si128(), k), _mm_setzero_si128()),
            None => (_mm_setzero_si128(), if advance { super::crc_short::advance(seed) } else { seed }),
        }
    }

    /// The finished CRC of a fused copy into `dst` whose whole lanes fold
    /// to `lane`: the bytes after them folded in registers ([`finish_tail`]).
    ///
    /// # Safety
    /// `dst` is at least 16 bytes (its last 16 are loaded unchecked; the
    /// fused copies' callers hold at least [`super::FUSED_MIN`]).
    #[inline]
    #[target_feature(enable = "pclmulqdq,ssse3,sse4.1")]
    unsafe fn finish_copy(lane: __m128i, dst: &[u8]) -> u32 {
        let len = dst.len();
        debug_assert!(len >= 16);
        // SAFETY: `len >= 16` (the caller's contract): the last 16 bytes are inside `dst`.
        let last = unsafe { _mm_loadu_si128(dst.as_ptr().add(len - 16).cast()) };
        finish_tail(lane, last, len % 16)
    }

    /// Longest distance, in 16-byte lanes, that [`join_keys`] has keys for:
    /// a 4096-byte payload (the largest path MTU) and its header lane.
    pub(super) const JOIN_LANES: usize = 256;

    /// `fold_keys(128 * m)` (low, high) for `m` in `1..=JOIN_LANES`: the keys
    /// that fold a lane forward by `m` lanes (entry 0 is not used). 4 KiB,
    /// of which a QP's frames use one or two entries (its full-MTU payload
    /// and its last one's).
    pub(super) static JOIN_KEYS: [[u64; 2]; JOIN_LANES + 1] = JOIN_KEYS_CONST;

    /// [`JOIN_KEYS`] for constant evaluation.
    const JOIN_KEYS_CONST: [[u64; 2]; JOIN_LANES + 1] = join_table();

    /// [`JOIN_KEYS`], each `m`'s powers of x from the last's (x^(128m - 32)
    /// and x^(128m + 32) mod P), at compile time.
    const fn join_table() -> [[u64; 2]; JOIN_LANES + 1] {
        use super::crc_short::{times_xpow, xpow_mod};
        let mut t = [[0u64; 2]; JOIN_LANES + 1];
        let mut low = xpow_mod(128 - 32);
        let mut m = 1;
        while m <= JOIN_LANES {
            let high = times_xpow(low, 64);
            t[m] = [(high.reverse_bits() as u64) << 1, (low.reverse_bits() as u64) << 1];
            low = times_xpow(low, 128);
            m += 1;
        }
        t
    }

    /// The keys that fold a lane forward by `lanes` 16-byte lanes
    /// ([`JOIN_KEYS`]), low key in the low half; `None` for 0 or more than
    /// [`JOIN_LANES`].
    #[inline]
    #[target_feature(enable = "sse2")]
    fn join_keys(lanes: usize) -> Option<__m128i> {
        let k = JOIN_KEYS.get(lanes).filter(|_| lanes > 0)?;
        // SAFETY: `k` is 16 readable bytes; loadu needs no alignment.
        Some(unsafe { _mm_loadu_si128(k.as_ptr().cast()) })
    }

    /// [`fold_copy`] with four 512-bit registers (sixteen 128-bit lanes,
    /// 256 bytes a step): on this project's AVX-512 host the 256-bit
    /// kernel ran at about 33 bytes/ns over 4 KiB, its multiplier the
    /// limit, where sixteen lanes in 512-bit registers reach about 62
    /// (interleaved timing, hot caches: 65.6 against 121 ns for 4096 bytes).
    /// Copies `dst.len()` (at least 256) bytes from `src` into `dst` and
    /// returns the lane the folds end with, as [`fold_copy`] does.
    ///
    /// # Safety
    /// The CPU must have AVX-512F, VPCLMULQDQ, AVX2 and PCLMULQDQ
    /// ([`available512`]); `src` must be valid for reads of `dst.len()`
    /// bytes and must not overlap `dst`.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,vpclmulqdq,pclmulqdq")]
    pub unsafe fn fold_copy512(seed: __m128i, src: *const u8, dst: &mut [u8]) -> __m128i {
        let len = dst.len();
        debug_assert!(len >= 256);
        let blocks = len / 256;
        let d = dst.as_mut_ptr();
        // SAFETY: block 0 lies within `len` bytes at both ends.
        let mut x = unsafe { move_block512(src, d) };
        x[0] = _mm512_xor_si512(x[0], _mm512_zextsi128_si512(seed));
        let k2048 = keys512(K2048);
        for b in 1..blocks {
            // SAFETY: block `b` ends at (b + 1) * 256 <= len.
            let y = unsafe { move_block512(src.add(b * 256), d.add(b * 256)) };
            for i in 0..4 {
                x[i] = fold512(x[i], y[i], k2048);
            }
        }
        let done = blocks * 256;
        if done < len {
            // SAFETY: `done..len` is in range at both ends; no overlap (caller).
            unsafe { std::ptr::copy_nonoverlapping(src.add(done), d.add(done), len - done) };
        }
        // SAFETY: `dst` has `len` bytes.
        unsafe { fold_lanes(collapse512(x), d, done, len) }
    }

    /// The four 512-bit accumulators of a 256-byte step folded into one
    /// 128-bit lane: each of the sixteen lanes moved at once by its own
    /// distance to the last ([`COLLAPSE_KEYS`]; the last stays), the sum's
    /// four lanes added. Folding the registers one onto the next, then the
    /// halves, then the lanes was a chain of five dependent folds at the
    /// end of every frame's CRC (sent and checked); now there is one.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,vpclmulqdq,pclmulqdq")]
    fn collapse512(x: [__m512i; 4]) -> __m128i {
        let k = &COLLAPSE_KEYS;
        // SAFETY: each row is 64 readable bytes; loadu needs no alignment.
        let key = |i: usize| unsafe { _mm512_loadu_si512(k[4 * i..4 * i + 4].as_ptr().cast()) };
        let moved = |i: usize| {
            let k = key(i);
            _mm512_xor_si512(_mm512_clmulepi64_epi128(x[i], k, 0x00), _mm512_clmulepi64_epi128(x[i], k, 0x11))
        };
        // The last lane of x[3] is where the others go: it is added as it is.
        let last = _mm512_maskz_mov_epi64(0xc0, x[3]);
        let y = _mm512_ternarylogic_epi64(moved(0), moved(1), moved(2), 0x96);
        let y = _mm512_ternarylogic_epi64(y, moved(3), last, 0x96);
        let y = _mm256_xor_si256(_mm512_castsi512_si256(y), _mm512_extracti64x4_epi64(y, 1));
        _mm_xor_si128(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1))
    }

    /// The keys that move lane `j` of a 256-byte step (`j` in 0..16, as
    /// [`collapse512`]'s registers hold them, four a register) forward by
    /// `15 - j` lanes onto the last: [`JOIN_KEYS`]' entries, low and high
    /// per lane; zero for the last lane, which does not move.
    static COLLAPSE_KEYS: [[u64; 2]; 16] = collapse_table();

    const fn collapse_table() -> [[u64; 2]; 16] {
        let mut t = [[0u64; 2]; 16];
        let mut j = 0;
        while j < 15 {
            t[j] = JOIN_KEYS_CONST[15 - j];
            j += 1;
        }
        t
    }

    /// [`fold_masked`] with four 512-bit registers, as [`fold_copy512`]
    /// folds: `data` at least 256 bytes, its first 64 ORed with `mask`.
    ///
    /// # Safety
    /// As [`fold_copy512`] ([`available512`]) with `data.len() >= 256`.
    #[target_feature(enable = "avx512f,avx2,vpclmulqdq,pclmulqdq,ssse3,sse4.1")]
    pub unsafe fn fold_masked512(register: u32, data: &[u8], mask: &[u8; 64]) -> u32 {
        let len = data.len();
        debug_assert!(len >= 256);
        let blocks = len / 256;
        let p = data.as_ptr();
        // SAFETY: block 0 (256 bytes) lies within `data`; `mask` is 64 bytes.
        let mut x = unsafe {
            [
                _mm512_or_si512(_mm512_loadu_si512(p.cast()), _mm512_loadu_si512(mask.as_ptr().cast())),
                _mm512_loadu_si512(p.add(64).cast()),
                _mm512_loadu_si512(p.add(128).cast()),
                _mm512_loadu_si512(p.add(192).cast()),
            ]
        };
        x[0] = _mm512_xor_si512(x[0], _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, i64::from(register)));
        let k2048 = keys512(K2048);
        for b in 1..blocks {
            // SAFETY: block `b` ends at (b + 1) * 256 <= len.
            let y = unsafe {
                let q = p.add(b * 256);
                [
                    _mm512_loadu_si512(q.cast()),
                    _mm512_loadu_si512(q.add(64).cast()),
                    _mm512_loadu_si512(q.add(128).cast()),
                    _mm512_loadu_si512(q.add(192).cast()),
                ]
            };
            for i in 0..4 {
                x[i] = fold512(x[i], y[i], k2048);
            }
        }
        // SAFETY: `data` has `len >= 256` bytes.
        unsafe { finish_run(collapse512(x), p, blocks * 256, len) }
    }

    /// Whether this CPU can run [`fold_masked_place512`] (detected once).
    #[inline]
    pub fn available_place512() -> bool {
        super::crc_short::has(super::crc_short::PLACE512)
    }

    /// [`fold_masked512`] that also stores `data[skip..skip + len]` to `dst`
    /// (`super::update_masked_place`), each byte loaded once.
    ///
    /// The run is folded as if led by `64 - skip` zero bytes (`pre`), so
    /// that the payload starts at the second 64-byte piece and every piece
    /// of it is stored whole at its place, aligned as `dst` is: stored
    /// from where the run starts, each piece would straddle two cache lines
    /// in `dst`, and the piece holding the headers' end would need a
    /// byte-masked store (both slow: on this project's Zen 4 host such a
    /// kernel lost 2-21% against a check and a separate copy). Leading
    /// zeros leave a CRC alone once the register is zero, so the register
    /// enters as a change to the run's first 4 bytes, as in
    /// [`fold_masked512`]; the first piece is a zeroing masked load that
    /// reads nothing before `data`. The pieces after the last one that is
    /// payload throughout are stored after the fold, reloaded from `data`,
    /// the payload's last 64 bytes with one store that overlaps the piece
    /// before (no byte-masked store; a payload under 64 bytes is copied
    /// plainly).
    ///
    /// # Safety
    /// As [`fold_masked512`] ([`available_place512`]), with `data.len() >=
    /// 256`, `16 <= skip <= 64`, `skip % 4 == 0`, `skip + len <= data.len()`,
    /// and `dst` valid for writes of `len` bytes apart from `data`.
    #[target_feature(enable = "avx512f,avx512bw,avx2,vpclmulqdq,pclmulqdq,ssse3,sse4.1")]
    pub unsafe fn fold_masked_place512(register: u32, data: &[u8], mask: &[u8; 64], skip: usize, len: usize, dst: *mut u8) -> u32 {
        let n = data.len();
        debug_assert!(n >= 256 && (16..=64).contains(&skip) && skip.is_multiple_of(4) && skip + len <= n);
        let pre = 64 - skip;
        // The run as folded: `pre` zeros, then `data`; piece `o` (a
        // multiple of 64 from 64 on) is `data[o - pre..]` and holds
        // payload bytes `o - 64..`, stored at `dst + o - 64`.
        let (run, end) = (n + pre, 64 + len);
        let p = data.as_ptr();
        // Store piece `v` at `o >= 64` if it is payload throughout (the
        // pieces after are stored after the fold, below).
        let place = |v: __m512i, o: usize| {
            if o + 64 <= end {
                // SAFETY: `dst[o - 64..o]` is inside `len` bytes.
                unsafe { _mm512_storeu_si512(dst.add(o - 64).cast(), v) };
            }
        };
        let head = !0u64 << pre;
        // SAFETY: the masked loads read only the lanes of `head`
        // (`data[..skip]`, `mask[..skip]`) and the others read lanes of
        // `data` and `mask` inside them (`skip + 64 <= 128 <= n`).
        let (first, mask0, mask1) = unsafe {
            (
                [
                    _mm512_maskz_loadu_epi8(head, p.wrapping_sub(pre).cast()),
                    _mm512_loadu_si512(p.add(skip).cast()),
                    _mm512_loadu_si512(p.add(skip + 64).cast()),
                    _mm512_loadu_si512(p.add(skip + 128).cast()),
                ],
                _mm512_maskz_loadu_epi8(head, mask.as_ptr().wrapping_sub(pre).cast()),
                _mm512_maskz_loadu_epi8(!head, mask.as_ptr().add(skip).cast()),
            )
        };
        // Block 0's last three pieces are `data[skip..skip + 192]`: `skip +
        // 192 <= 256 <= n`, checked above for the loads.
        for (i, &v) in first.iter().enumerate().skip(1) {
            place(v, 64 * i);
        }
        // The register as the change to the run's first 4 bytes (lane
        // `pre / 4` of the first piece), the masks ORed in.
        let reg = _mm512_maskz_set1_epi32(1u16 << (pre / 4), register as i32);
        let mut x = [
            // (data | mask) ^ register in one instruction (truth table 0x56).
            _mm512_ternarylogic_epi64(first[0], mask0, reg, 0x56),
            _mm512_or_si512(first[1], mask1),
            first[2],
            first[3],
        ];
        let blocks = run / 256;
        let k2048 = keys512(K2048);
        for b in 1..blocks {
            let o = b * 256;
            // SAFETY: block `b` is `data[o - pre..o + 256 - pre]`, inside `run - pre = n`.
            let y = unsafe {
                let q = p.add(o - pre);
                [
                    _mm512_loadu_si512(q.cast()),
                    _mm512_loadu_si512(q.add(64).cast()),
                    _mm512_loadu_si512(q.add(128).cast()),
                    _mm512_loadu_si512(q.add(192).cast()),
                ]
            };
            if o + 256 <= end {
                // The whole block is payload: four stores.
                // SAFETY: `dst[o - 64..o + 192]` is inside `len` bytes.
                unsafe {
                    let d = dst.add(o - 64);
                    _mm512_storeu_si512(d.cast(), y[0]);
                    _mm512_storeu_si512(d.add(64).cast(), y[1]);
                    _mm512_storeu_si512(d.add(128).cast(), y[2]);
                    _mm512_storeu_si512(d.add(192).cast(), y[3]);
                }
            } else {
                for (i, &v) in y.iter().enumerate() {
                    place(v, o + 64 * i);
                }
            }
            for i in 0..4 {
                x[i] = fold512(x[i], y[i], k2048);
            }
        }
        let done = blocks * 256;
        // The payload not stored yet, from the first piece that was not
        // payload throughout (in the last block, or after it): whole
        // pieces, then the payload's last 64 bytes once more, overlapping
        // (the same bytes again: no byte-masked store, no `memcpy` call).
        // SAFETY: every piece `o..o + 64` stored is inside `64..end`, and its
        // bytes `data[o - pre..]` inside `data`; the last store is
        // `dst[len - 64..len]` (`len >= 64`), its bytes `data[skip + len - 64..skip + len]`.
        unsafe {
            // The blocks stored every piece before `done` that ends by
            // `end`: all up to the first piece that would not.
            let mut o = done.min(64 + len / 64 * 64);
            while o + 64 <= end {
                _mm512_storeu_si512(dst.add(o - 64).cast(), _mm512_loadu_si512(p.add(o - pre).cast()));
                o += 64;
            }
            if o < end && len >= 64 {
                _mm512_storeu_si512(dst.add(len - 64).cast(), _mm512_loadu_si512(p.add(skip + len - 64).cast()));
            } else if o < end {
                std::ptr::copy_nonoverlapping(p.add(o - pre), dst.add(o - 64), end - o);
            }
        }
        // The whole lanes after the last block, then the bytes after them:
        // `data[done - pre..]` (`done - pre >= 208`), and the run's last 16
        // bytes, `data[n - 16..]`.
        // SAFETY: both are inside `data`.
        let z = unsafe { fold_lanes(collapse512(x), p.add(done - pre), 0, run - done) };
        // SAFETY: `n >= 256`.
        let last = unsafe { _mm_loadu_si128(p.add(n - 16).cast()) };
        finish_tail(z, last, run % 16)
    }

    /// Fold blocks 1..`blocks` (each 128 bytes, four 256-bit lanes, from
    /// `block(b)`) into `x`, the lanes of block 0, each forward by 128 bytes.
    #[inline]
    #[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq")]
    fn fold_blocks(mut x: [__m256i; 4], blocks: usize, mut block: impl FnMut(usize) -> [__m256i; 4]) -> [__m256i; 4] {
        let k1024 = keys256(K1024);
        for b in 1..blocks {
            let y = block(b);
            for i in 0..4 {
                x[i] = fold256(x[i], y[i], k1024);
            }
        }
        x
    }

    /// Load the 128 bytes at `src`, store them at `dst`, return them as four lanes.
    ///
    /// # Safety
    /// 128 bytes readable at `src`, writable at `dst`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn move_block(src: *const u8, dst: *mut u8) -> [__m256i; 4] {
        // SAFETY: the caller guarantees both ranges; loadu/storeu need no alignment.
        unsafe {
            let v = [
                _mm256_loadu_si256(src.cast()),
                _mm256_loadu_si256(src.add(32).cast()),
                _mm256_loadu_si256(src.add(64).cast()),
                _mm256_loadu_si256(src.add(96).cast()),
            ];
            _mm256_storeu_si256(dst.cast(), v[0]);
            _mm256_storeu_si256(dst.add(32).cast(), v[1]);
            _mm256_storeu_si256(dst.add(64).cast(), v[2]);
            _mm256_storeu_si256(dst.add(96).cast(), v[3]);
            v
        }
    }

    /// Copy `dst.len()` (at least 128) bytes from `src` into `dst` and fold
    /// them, `seed` XORed into their first 16-byte lane (a CRC register, the
    /// complement of a finished CRC, in its first 4 bytes; or the lane of the
    /// bytes before, advanced by 16 bytes: `crc_short::advance`), down to one
    /// lane whose CRC from a zero register (`crc_short::reduce`) is the CRC
    /// of the whole 16-byte lanes of `dst` from there; returned in a
    /// register, not through memory. The caller feeds the last
    /// `dst.len() % 16` bytes after it.
    ///
    /// # Safety
    /// The CPU must have AVX2, VPCLMULQDQ and PCLMULQDQ; `src` must be valid
    /// for reads of `dst.len()` bytes and must not overlap `dst`.
    #[inline]
    #[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq")]
    pub unsafe fn fold_copy(seed: __m128i, src: *const u8, dst: &mut [u8]) -> __m128i {
        let len = dst.len();
        debug_assert!(len >= 128);
        let blocks = len / 128;
        let d = dst.as_mut_ptr();
        // SAFETY: block 0 lies within `len` bytes at both ends.
        let mut x = unsafe { move_block(src, d) };
        x[0] = _mm256_xor_si256(x[0], _mm256_zextsi128_si256(seed));
        // SAFETY: every block `b < blocks` ends at (b + 1) * 128 <= len.
        let x = fold_blocks(x, blocks, |b| unsafe { move_block(src.add(b * 128), d.add(b * 128)) });
        // The bytes after the last whole block are copied plainly and folded
        // from `dst`, where they now are (in L1).
        let done = blocks * 128;
        if done < len {
            // SAFETY: `done..len` is in range at both ends; no overlap (caller).
            unsafe { std::ptr::copy_nonoverlapping(src.add(done), d.add(done), len - done) };
        }
        // SAFETY: `dst` has `len` bytes.
        unsafe { fold_lanes(collapse256(x), d, done, len) }
    }

    /// Four 256-bit accumulators of a 128-byte step into one lane, as
    /// [`collapse512`] does: each of the eight lanes moved at once by its
    /// distance to the last (the last eight rows of [`COLLAPSE_KEYS`]).
    #[inline]
    #[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq")]
    fn collapse256(x: [__m256i; 4]) -> __m128i {
        let k = &COLLAPSE_KEYS[8..];
        // SAFETY: each row is 32 readable bytes; loadu needs no alignment.
        let key = |i: usize| unsafe { _mm256_loadu_si256(k[2 * i..2 * i + 2].as_ptr().cast()) };
        let moved = |i: usize| {
            let k = key(i);
            _mm256_xor_si256(_mm256_clmulepi64_epi128(x[i], k, 0x00), _mm256_clmulepi64_epi128(x[i], k, 0x11))
        };
        let last = _mm256_blend_epi32(_mm256_setzero_si256(), x[3], 0xf0);
        let y = _mm256_xor_si256(_mm256_xor_si256(moved(0), moved(1)), _mm256_xor_si256(moved(2), _mm256_xor_si256(moved(3), last)));
        _mm_xor_si128(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1))
    }

    /// Fold `data` (at least 128 bytes) from CRC register `register`, its
    /// first 64 bytes ORed with `mask` as they are loaded, and finish: the
    /// finished CRC (the complement of the register after `data`). The
    /// fold of [`fold_copy`] without the stores; the bytes after the last
    /// whole lane are taken with it in registers ([`finish_tail`]).
    ///
    /// # Safety
    /// The CPU must have AVX2, VPCLMULQDQ, PCLMULQDQ, SSSE3 and SSE4.1
    /// ([`available`]); `data.len() >= 128`.
    #[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,ssse3,sse4.1")]
    pub unsafe fn fold_masked(register: u32, data: &[u8], mask: &[u8; 64]) -> u32 {
        let len = data.len();
        debug_assert!(len >= 128);
        let blocks = len / 128;
        let p = data.as_ptr();
        // SAFETY: block 0 (128 bytes) lies within `data`; `mask` is 64 bytes.
        let mut x = unsafe {
            [
                _mm256_or_si256(_mm256_loadu_si256(p.cast()), _mm256_loadu_si256(mask.as_ptr().cast())),
                _mm256_or_si256(_mm256_loadu_si256(p.add(32).cast()), _mm256_loadu_si256(mask.as_ptr().add(32).cast())),
                _mm256_loadu_si256(p.add(64).cast()),
                _mm256_loadu_si256(p.add(96).cast()),
            ]
        };
        // The register enters as a change to the first 4 bytes.
        x[0] = _mm256_xor_si256(x[0], _mm256_set_epi64x(0, 0, 0, i64::from(register)));
        // SAFETY: every block `b < blocks` ends at (b + 1) * 128 <= len.
        let x = fold_blocks(x, blocks, |b| unsafe {
            let q = p.add(b * 128);
            [
                _mm256_loadu_si256(q.cast()),
                _mm256_loadu_si256(q.add(32).cast()),
                _mm256_loadu_si256(q.add(64).cast()),
                _mm256_loadu_si256(q.add(96).cast()),
            ]
        });
        // SAFETY: `data` has `len >= 128` bytes.
        unsafe { finish_run(collapse256(x), p, blocks * 128, len) }
    }

    /// The finished CRC of lane `z` (the folded bytes so far, as from a
    /// zero register) followed by the last `tail` (0..16) bytes of the
    /// buffer, which are the top `tail` bytes of `last` (the buffer's last
    /// 16). The 16 + `tail` bytes are taken as the short kernel takes a run
    /// that is not a multiple of 16: as if led by zeros, the partial lane
    /// (`z`'s first `tail` bytes, at the top of a zeroed lane) folded onto
    /// the whole lane after it (`z`'s other bytes, then the tail).
    #[inline]
    #[target_feature(enable = "pclmulqdq,ssse3,sse4.1")]
    fn finish_tail(z: __m128i, last: __m128i, tail: usize) -> u32 {
        if tail == 0 {
            return super::crc_short::reduce(z);
        }
        let iota = _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        let t = tail as i8;
        // Byte i takes z's byte i - (16 - tail); a negative index (top bit
        // set) gives zero.
        let head = _mm_shuffle_epi8(z, _mm_add_epi8(iota, _mm_set1_epi8(t - 16)));
        // Byte i takes z's byte i + tail below 16 - tail, the tail above.
        let down = _mm_shuffle_epi8(z, _mm_add_epi8(iota, _mm_set1_epi8(t)));
        let upper = _mm_cmpgt_epi8(iota, _mm_set1_epi8(15 - t));
        let second = _mm_blendv_epi8(down, last, upper);
        let k128 = _mm_set_epi64x(K128.1 as i64, K128.0 as i64);
        super::crc_short::reduce(fold128(head, second, k128))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(crc: u32, data: &[u8]) -> u32 {
        let mut h = crc32fast::Hasher::new_with_initial(crc);
        h.update(data);
        h.finalize()
    }

    fn noise(n: usize) -> Vec<u8> {
        crate::wire::test_noise::XorShift::new(0x1234_5678).bytes(n)
    }

    #[test]
    fn keys_match_the_published_constants() {
        // The 4 x 128-bit and 128-bit fold constants of Intel's paper (as
        // Linux's crc32-pclmul and zlib use them), and x^64 mod P.
        assert_eq!(fold_keys(512), (0x1_5444_2bd4, 0x1_c6e4_1596));
        assert_eq!(fold_keys(128), (0x1_7519_97d0, 0x0_ccaa_009e));
        assert_eq!((crate::wire::crc_short::xpow_mod(64).reverse_bits() as u64) << 1, 0x1_63cd_6124);
    }

    #[test]
    fn copy_update_copies_and_matches_crc32fast_for_every_length_and_start() {
        let buf = noise(9100);
        for len in (0..1200).chain([2047, 2048, 2049, 4095, 4096, 4097, 4154, 8191, 9000]) {
            for (off, init) in [(0, 0), (3, 0xdead_beef), (17, crate::wire::icrc::LRH_CRC)] {
                let src = &buf[off..off + len];
                // A destination at an odd offset, with guard bytes around it.
                let mut dst = vec![0xa5u8; len + 9];
                let crc = copy_update(init, src, &mut dst[5..5 + len]);
                assert_eq!(crc, reference(init, src), "len {len} offset {off} init {init:#x}");
                assert_eq!(&dst[5..5 + len], src, "len {len}: the copy");
                assert!(dst[..5].iter().chain(&dst[5 + len..]).all(|&b| b == 0xa5), "len {len}: bytes outside the copy");
            }
        }
        // A known value: CRC-32 of "123456789".
        let mut d = [0u8; 9];
        assert_eq!(copy_update(0, b"123456789", &mut d), 0xcbf4_3926);
        assert_eq!(update(0, b"123456789"), 0xcbf4_3926);
    }

    #[test]
    fn the_masked_head_run_equals_the_crc_of_the_masked_bytes() {
        let buf = noise(9100);
        let mut mask = [0u8; MASK_HEAD];
        for (i, m) in mask.iter_mut().enumerate() {
            *m = if i % 7 == 1 { 0xff } else { buf[9000 + i] & 0x41 };
        }
        for len in (0..700).chain([1023, 1024, 1064, 1065, 1080, 2048, 4095, 4096, 4136, 4152, 4153, 8191, 9000]) {
            for (off, init) in [(0, 0), (3, 0xdead_beef), (17, crate::wire::icrc::LRH_CRC)] {
                let data = &buf[off..off + len];
                let mut ored = data.to_vec();
                for (b, m) in ored.iter_mut().zip(mask) {
                    *b |= m;
                }
                match update_masked_head(init, data, &mask) {
                    Some(crc) => assert_eq!(crc, reference(init, &ored), "len {len} offset {off} init {init:#x}"),
                    None => assert!(!(FUSED_MIN_MASKED..FUSED_MAX_MASKED).contains(&len) || !wide_available(), "len {len}: refused"),
                }
                // The kernel itself at every length it can take, the long
                // ones `update_masked_head` leaves to `crc32fast` too.
                #[cfg(target_arch = "x86_64")]
                if len >= 128 && wide_available() {
                    // SAFETY: the CPU has the instructions; `len >= 128`.
                    let crc = unsafe { fused::fold_masked(!init, data, &mask) };
                    assert_eq!(crc, reference(init, &ored), "kernel, len {len} offset {off} init {init:#x}");
                }
            }
        }
        assert!(!wide_available() || update_masked_head(0, &buf[..FUSED_MIN_MASKED], &mask).is_some());
    }

    #[test]
    fn copy_update_stops_at_the_shorter_side() {
        let src = noise(1000);
        let mut dst = vec![0u8; 700];
        assert_eq!(copy_update(7, &src, &mut dst), reference(7, &src[..700]));
        assert_eq!(dst, src[..700]);
        let mut dst = vec![0u8; 1000];
        assert_eq!(copy_update(7, &src[..600], &mut dst), reference(7, &src[..600]));
        assert!(dst[600..].iter().all(|&b| b == 0));
    }

    /// A finished CRC as the fused kernels' seed (its complement in the first 4 bytes).
    #[cfg(target_arch = "x86_64")]
    fn seed(crc: u32) -> core::arch::x86_64::__m128i {
        // SAFETY: SSE2 is part of x86_64.
        unsafe { core::arch::x86_64::_mm_cvtsi32_si128(!crc as i32) }
    }

    /// A lane's 16 bytes.
    #[cfg(target_arch = "x86_64")]
    fn lane_bytes(z: core::arch::x86_64::__m128i) -> [u8; 16] {
        let mut out = [0u8; 16];
        // SAFETY: `out` is 16 bytes; storeu needs no alignment.
        unsafe { core::arch::x86_64::_mm_storeu_si128(out.as_mut_ptr().cast(), z) };
        out
    }

    #[test]
    fn a_masked_lane_continues_into_the_copy_as_its_finished_crc_does() {
        let buf = noise(6000);
        let mask: Vec<u8> = buf.iter().rev().map(|b| b & 0x90).collect();
        let mut lanes = 0;
        for hlen in [16, 17, 20, 31, 32, 40, 47, 52, 56, 63, 64, 76, 100, 127] {
            let ored: Vec<u8> = buf[..hlen].iter().zip(&mask).map(|(a, m)| a | m).collect();
            for init in [0, !0, 0x2144_df1c, 0xdead_beef] {
                let Some(lane) = update_masked_lane(init, &buf[..hlen], &mask) else {
                    // Only where the short kernel is missing.
                    assert_eq!(update_masked(init, &buf[..hlen], &mask), None);
                    continue;
                };
                lanes += 1;
                let head = reference(init, &ored);
                assert_eq!(lane.finish(), head, "header {hlen} init {init:#x}");
                for len in
                    [0, 1, 15, 16, 100, 127, 128, 255, 256, 511, 512, 513, 527, 528, 1000, 1023, 1024, 1025, 1040, 2047, 2048, 4096, 4100, 5000]
                {
                    for off in [0, 1, 7, 33, 64] {
                        let src = &buf[hlen + off..hlen + off + len];
                        let mut dst = vec![0u8; len + 3];
                        let got = copy_update_lane(lane, src, &mut dst);
                        assert_eq!(got, reference(head, src), "header {hlen} init {init:#x} payload {len} offset {off}");
                        assert_eq!(&dst[..len], src);
                        assert!(dst[len..].iter().all(|&b| b == 0));
                    }
                }
            }
        }
        // Refused where update_masked refuses.
        assert!(update_masked_lane(0, &buf[..15], &mask).is_none());
        assert!(update_masked_lane(0, &buf[..SHORT_MAX + 1], &mask).is_none());
        assert!(update_masked_lane(0, &buf[..40], &mask[..39]).is_none());
        #[cfg(target_arch = "x86_64")]
        assert!(lanes > 0 || !crc_short::available(), "the short kernel is here but no lane was made");
        let _ = lanes;
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_join_keys_are_the_fold_keys_of_whole_lanes() {
        for m in 1..=fused::JOIN_LANES {
            let (lo, hi) = fold_keys(128 * m as u32);
            assert_eq!(fused::JOIN_KEYS[m], [lo, hi], "{m} lanes");
        }
        // The published 4 x 128-bit keys (64 bytes: four lanes).
        assert_eq!(fused::JOIN_KEYS[4], [0x1_5444_2bd4, 0x1_c6e4_1596]);
    }

    #[test]
    fn a_header_lane_joins_the_copy_at_its_end_for_every_payload_length() {
        // Every payload length 0-5000 (either side of every lane, of the
        // fused kernels' minimums and of the join table's 4096 bytes), each
        // with a header run, source offset and initial value from lists
        // walked at different strides, through the lane (`copy_update_lane`)
        // and through a finished CRC (`copy_update`), against `crc32fast`.
        let buf = noise(5300);
        let mask: Vec<u8> = buf.iter().rev().map(|b| b & 0x48).collect();
        let hlens = [16, 20, 28, 31, 40, 44, 52, 56, 60, 64, 77, 96, 111, 127];
        let inits = [0, !0, crate::wire::icrc::LRH_CRC, 0xdead_beef, 0x0000_00ff];
        let offs = [0, 1, 3, 8, 15, 16, 31, 64, 100];
        let mut dst = vec![0u8; 5010];
        let mut lanes = 0;
        for len in 0..=5000 {
            let (hlen, init, off) = (hlens[len % hlens.len()], inits[len % inits.len()], offs[len / 7 % offs.len()]);
            let ored: Vec<u8> = buf[..hlen].iter().zip(&mask).map(|(a, m)| a | m).collect();
            let head = reference(init, &ored);
            let src = &buf[hlen + off..hlen + off + len];
            let want = reference(head, src);
            dst.fill(0x5a);
            assert_eq!(copy_update(head, src, &mut dst[..len]), want, "finished CRC, payload {len} offset {off}");
            assert_eq!(&dst[..len], src);
            if let Some(lane) = update_masked_lane(init, &buf[..hlen], &mask) {
                lanes += 1;
                dst.fill(0xa5);
                let got = copy_update_lane(lane, src, &mut dst[..len + 7]);
                assert_eq!(got, want, "header {hlen} init {init:#x} payload {len} offset {off}");
                assert_eq!(&dst[..len], src);
                assert!(dst[len..].iter().all(|&b| b == 0xa5), "payload {len}: bytes after the copy");
            }
        }
        #[cfg(target_arch = "x86_64")]
        assert!(lanes > 0 || !crc_short::available(), "the short kernel is here but no lane was made");
        let _ = lanes;
    }

    #[test]
    fn a_masked_run_places_its_payload_as_it_folds_at_every_length() {
        // Runs of 256-5000 bytes (either side of every block and lane), the
        // payload from offsets 16-64 (IPv4 headers end at 40-80, IPv6 at 60)
        // to 0-3 bytes (pad) or more before the run's end, against
        // `crc32fast` over the masked run; the payload lands exactly in
        // `dst`, the guard bytes on both sides untouched.
        if !place_available() {
            eprintln!("this CPU has no AVX-512BW/VPCLMULQDQ: update_masked_place declines (checked below)");
        }
        let buf = noise(5100);
        let mut mask = [0u8; MASK_HEAD];
        for (i, m) in mask.iter_mut().enumerate() {
            *m = if i % 7 == 1 { 0xff } else { 0 };
        }
        let skips = [40, 60, 16, 20, 44, 52, 56, 64];
        let tails = [0, 1, 2, 3, 0, 15, 16, 100, 255];
        let mut dst = vec![0u8; 5200];
        let mut placed = 0;
        for n in 256..=5000 {
            let (skip, tail, init) = (skips[n % skips.len()], tails[n / 3 % tails.len()], [0, !0, 0x1234_5678][n % 3]);
            let data = &buf[n % 13..n % 13 + n];
            let len = n - skip - tail.min(n - skip);
            let mut masked = data.to_vec();
            for (b, m) in masked.iter_mut().zip(mask) {
                *b |= m;
            }
            dst.fill(0x6b);
            // SAFETY: `dst` has 64 guard bytes, `len` bytes and more after them, apart from `data`.
            let got = unsafe { update_masked_place(init, data, &mask, skip, len, dst.as_mut_ptr().add(64)) };
            let Some(got) = got else {
                assert!(!place_available(), "refused {n} bytes, payload at {skip}");
                assert!(dst.iter().all(|&b| b == 0x6b), "nothing written when refused");
                continue;
            };
            placed += 1;
            assert_eq!(got, reference(init, &masked), "run {n}, payload at {skip}, {tail} after it");
            assert!(dst[..64].iter().all(|&b| b == 0x6b), "run {n}: bytes before the payload's place");
            assert_eq!(&dst[64..64 + len], &data[skip..skip + len], "run {n}: the payload, from {skip}");
            assert!(dst[64 + len..].iter().all(|&b| b == 0x6b), "run {n}: bytes after the payload's place");
        }
        assert_eq!(placed > 0, place_available());
        // Refused: shorter than a block, a payload before byte 16, after
        // byte 64, not on a 4-byte word, or beyond the run.
        // SAFETY: nothing is written when refused (and `dst` is large enough anyway).
        unsafe {
            for (n, skip, len) in [(255, 40, 100), (1000, 12, 100), (1000, 68, 100), (1000, 42, 100), (1000, 40, 961)] {
                assert_eq!(update_masked_place(0, &buf[..n], &mask, skip, len, dst.as_mut_ptr()), None, "{n} {skip} {len}");
            }
        }
    }

    #[test]
    fn the_fused_kernel_runs_here_or_says_why_not() {
        #[cfg(target_arch = "x86_64")]
        if fused::available() {
            let src = noise(5000);
            for len in [128, 129, 143, 144, 255, 256, 257, 300, 511, 512, 1000, 1024, 1040, 4096, 4100, 5000] {
                let mut dst = vec![0u8; len];
                // SAFETY: available() said yes; `src` has `len` bytes apart from `dst`.
                let reg = unsafe { fused::fold_copy(seed(0x5555_aaaa), src.as_ptr(), &mut dst) };
                let mut h = crc32fast::Hasher::new_with_initial(!0);
                h.update(&lane_bytes(reg));
                h.update(&dst[len / 16 * 16..]);
                assert_eq!(h.finalize(), reference(0x5555_aaaa, &src[..len]), "len {len}");
                assert_eq!(dst, src[..len]);
                if len < 256 || !fused::available512() {
                    continue;
                }
                // The 512-bit kernel, at every length copy_update gives it and below.
                let mut dst = vec![0u8; len];
                // SAFETY: available512() said yes; `src` has `len` bytes apart from `dst`.
                let reg = unsafe { fused::fold_copy512(seed(0x5555_aaaa), src.as_ptr(), &mut dst) };
                let mut h = crc32fast::Hasher::new_with_initial(!0);
                h.update(&lane_bytes(reg));
                h.update(&dst[len / 16 * 16..]);
                assert_eq!(h.finalize(), reference(0x5555_aaaa, &src[..len]), "512-bit, len {len}");
                assert_eq!(dst, src[..len]);
            }
            return;
        }
        eprintln!("this CPU has no VPCLMULQDQ/AVX2: only copy_update's plain path is tested");
    }
}
