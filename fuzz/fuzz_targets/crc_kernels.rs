//! Fuzz the CRC kernels every frame goes through (`rocev2::wire::crc`: the
//! short PCLMULQDQ kernel, the fused copy in 256- and 512-bit registers, the
//! masked runs, the receive side's masked run that places a payload),
//! differentially: each result must equal a bit-by-bit CRC-32 of the same
//! bytes, and a copy must leave exactly the source's bytes.
//!
//! The kernels load without bounds checks and finish with loads relative to
//! a buffer's end, so every buffer here is its own allocation ending where
//! the slice ends (a misaligned start is the tail of a slightly longer one):
//! the address sanitizer then reports any read or write past an end.
//!
//! Input: a selector, a CRC seed, two start offsets and a length (up to
//! 8 KiB, so that one input can reach the 512-bit kernels, which take
//! 1 KiB and more); the buffer is the input's remaining bytes, continued by
//! a pseudo-random stream seeded from them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rocev2::wire::{crc, icrc};

fuzz_target!(|data: &[u8]| {
    if data.len() < 10 {
        return;
    }
    let sel = data[0];
    let seed = u32::from_le_bytes([data[1], data[2], data[3], data[4]]);
    let (src_off, dst_off) = (usize::from(data[5] % 64), usize::from(data[6] % 64));
    let len = usize::from(u16::from_le_bytes([data[7], data[8]])) % 8193;
    let mask_cut = usize::from(data[9]);
    let bytes = stream(&data[10..], len + 64);
    // The data, the mask (the ICRC's masked fields are ORed-in ones), a
    // header run for the lane variants.
    let src = exact(src_off, &bytes[..len]);
    let src = &src[src_off..];
    let mask_len = if sel & 0x80 != 0 { len.saturating_sub(mask_cut % 17) } else { len };
    let mask_bytes: Vec<u8> = bytes[64..64 + mask_len].iter().map(|b| b & 0x91).collect();
    let mask = exact(0, &mask_bytes);
    match sel % 7 {
        0 => assert_eq!(crc::update(seed, src), reference(seed, src), "update, {len} bytes"),
        1 => {
            let got = crc::update_masked(seed, src, &mask);
            let eligible = (16..=crc::SHORT_MAX).contains(&len) && mask.len() >= len;
            if !eligible {
                assert_eq!(got, None, "update_masked took {len} bytes with a {}-byte mask", mask.len());
            } else if crc::wide_available() {
                // The wide kernels need the short one's features.
                assert!(got.is_some(), "update_masked refused {len} bytes on a CPU that has the kernel");
            }
            if let Some(c) = got {
                assert_eq!(c, reference(seed, &ored(src, &mask)), "update_masked, {len} bytes");
            }
            let lane = crc::update_masked_lane(seed, src, &mask);
            assert_eq!(lane.is_some(), got.is_some(), "update_masked_lane and update_masked disagree at {len} bytes");
            if let Some(l) = lane {
                assert_eq!(l.finish(), reference(seed, &ored(src, &mask)), "update_masked_lane, {len} bytes");
            }
        }
        2 => {
            let mut head = [0u8; crc::MASK_HEAD];
            for (h, m) in head.iter_mut().zip(bytes.iter().rev()) {
                *h = m & 0x83;
            }
            if let Some(c) = crc::update_masked_head(seed, src, &head) {
                assert!(len >= 128, "update_masked_head took {len} bytes");
                let mut want = src.to_vec();
                for (w, m) in want.iter_mut().zip(head.iter()) {
                    *w |= m;
                }
                assert_eq!(c, reference(seed, &want), "update_masked_head, {len} bytes");
            }
            // The receive side's form: the same run, its payload (from 16-64
            // bytes in, a whole number of words; up to 16 bytes before the
            // end) placed as it folds.
            let skip = (16 + src_off % 49 / 4 * 4).min(len);
            let n = (len - skip).saturating_sub(mask_cut % 17);
            let mut dst = exact(dst_off, &vec![0x3c; n]);
            // SAFETY: `dst` holds `n` writable bytes apart from `src`.
            if let Some(c) = unsafe { crc::update_masked_place(seed, src, &head, skip, n, dst[dst_off..].as_mut_ptr()) } {
                assert!(len >= 256, "update_masked_place took {len} bytes");
                let mut want = src.to_vec();
                for (w, m) in want.iter_mut().zip(head.iter()) {
                    *w |= m;
                }
                assert_eq!(c, reference(seed, &want), "update_masked_place, {len} bytes");
                assert_eq!(&dst[dst_off..], &src[skip..skip + n], "update_masked_place's copy, {n} bytes from {skip}");
            } else {
                assert!(len < 256 || skip + n > len || !crc::place_available(), "update_masked_place refused {len} bytes");
                assert!(dst[dst_off..].iter().all(|&b| b == 0x3c), "update_masked_place wrote when it refused");
            }
        }
        3 => {
            // A destination shorter than the source by up to 16 bytes.
            let n = len.saturating_sub(mask_cut % 17);
            let mut dst = exact(dst_off, &vec![0xa5; n]);
            let got = crc::copy_update(seed, src, &mut dst[dst_off..]);
            assert_eq!(&dst[dst_off..], &src[..n], "copy_update's copy, {n} of {len} bytes");
            assert_eq!(got, reference(seed, &src[..n]), "copy_update, {n} bytes");
            let mut dst = exact(dst_off, &vec![0x5a; len]);
            // SAFETY: `src` holds `len` readable bytes and is not `dst`.
            let got = unsafe { crc::copy_update_raw(seed, src.as_ptr(), &mut dst[dst_off..]) };
            assert_eq!(&dst[dst_off..], src, "copy_update_raw's copy, {len} bytes");
            assert_eq!(got, reference(seed, src), "copy_update_raw, {len} bytes");
        }
        4 | 5 => {
            // A header run (16..=127 bytes, masked) continued by a copy, as a
            // frame is built (requester, READ responses).
            let h = 16 + usize::from(data[9]) % (crc::SHORT_MAX - 15);
            let hdr = exact(0, &bytes[len..len + 64].iter().chain(bytes.iter()).take(h).copied().collect::<Vec<u8>>());
            let hmask = exact(0, &bytes.iter().rev().take(h).map(|b| b & 0x11).collect::<Vec<u8>>());
            let Some(lane) = crc::update_masked_lane(seed, &hdr, &hmask) else { return };
            let want = reference(reference(seed, &ored(&hdr, &hmask)), src);
            let mut dst = exact(dst_off, &vec![0; len]);
            let got = if sel % 7 == 4 {
                crc::copy_update_lane(lane, src, &mut dst[dst_off..])
            } else {
                // SAFETY: `src` holds `len` readable bytes and is not `dst`.
                unsafe { crc::copy_update_lane_raw(lane, src.as_ptr(), &mut dst[dst_off..]) }
            };
            assert_eq!(&dst[dst_off..], src, "copy_update_lane's copy, {len} bytes after {h}");
            assert_eq!(got, want, "copy_update_lane, {len} bytes after a {h}-byte header run");
        }
        _ => {
            // An IP packet's ICRC (IPv4 with 0 to 40 bytes of options, or
            // IPv6): `icrc::compute` picks a kernel by header and length.
            let v6 = sel & 0x40 != 0;
            let ip_len = if v6 { 40 } else { 4 * (5 + usize::from(data[9] % 11)) };
            let mut pkt = src.to_vec();
            if let Some(b) = pkt.first_mut() {
                *b = if v6 { 0x60 | (*b & 0x0f) } else { 0x40 | (ip_len / 4) as u8 };
            }
            let pkt = exact(0, &pkt);
            let rest = ip_len + 8 + 12;
            match icrc::compute(&pkt, ip_len, len) {
                Ok(c) => assert_eq!(c, icrc_reference(&pkt, v6, ip_len), "icrc::compute, {len} bytes, IP header {ip_len}"),
                Err(e) => assert!(len < rest, "icrc::compute refused {len} bytes (IP header {ip_len}): {e:?}"),
            }
            // The sender's header run: up to the longest extension headers.
            let upto = (rest + usize::from(data[6]) % 29).min(len);
            if upto >= rest {
                let want = icrc_reference(&pkt[..upto], v6, ip_len);
                assert_eq!(icrc::headers(&pkt, ip_len, upto), Ok(want), "icrc::headers, {upto} bytes, IP header {ip_len}");
                if let Ok(Some(lane)) = icrc::headers_lane(&pkt, ip_len, upto) {
                    assert_eq!(lane.finish(), want, "icrc::headers_lane, {upto} bytes, IP header {ip_len}");
                }
            }
        }
    }
});

/// The ICRC over `packet` (IBTA A17.3.3) from the rules alone: 8 bytes of
/// 0xFF for the LRH, then the packet with its variant fields set to ones
/// (IPv4: TOS, TTL, header checksum; IPv6: traffic class, flow label, hop
/// limit; the UDP checksum; the BTH's byte 4).
fn icrc_reference(packet: &[u8], v6: bool, ip_len: usize) -> u32 {
    let mut p = packet.to_vec();
    let ones: &[usize] = if v6 { &[1, 2, 3, 7] } else { &[1, 8, 10, 11] };
    for &i in ones.iter().chain(&[ip_len + 6, ip_len + 7, ip_len + 8 + 4]) {
        if let Some(b) = p.get_mut(i) {
            *b = 0xff;
        }
    }
    if v6 {
        p[0] |= 0x0f;
    }
    reference(reference(0, &[0xff; 8]), &p)
}

/// CRC-32 (reflected 0xEDB88320) continued from the finished CRC `crc`, one
/// bit at a time: the reference no kernel shares code with.
fn reference(crc: u32, data: &[u8]) -> u32 {
    let mut r = !crc;
    for &b in data {
        r ^= u32::from(b);
        for _ in 0..8 {
            r = if r & 1 != 0 { (r >> 1) ^ 0xedb8_8320 } else { r >> 1 };
        }
    }
    !r
}

/// `data` with each byte ORed with `mask`'s at the same place.
fn ored(data: &[u8], mask: &[u8]) -> Vec<u8> {
    data.iter().zip(mask).map(|(d, m)| d | m).collect()
}

/// `lead` filler bytes then `data`, in an allocation of exactly that size.
fn exact(lead: usize, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(lead + data.len());
    v.resize(lead, 0xee);
    v.extend_from_slice(data);
    v
}

/// `n` bytes: `prefix`, then a xorshift stream seeded from it.
fn stream(prefix: &[u8], n: usize) -> Vec<u8> {
    let mut s = prefix.iter().fold(0x9e37_79b9_7f4a_7c15u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)) | 1;
    let mut v: Vec<u8> = prefix.iter().copied().take(n).collect();
    while v.len() < n {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        v.push(s as u8);
    }
    v
}
