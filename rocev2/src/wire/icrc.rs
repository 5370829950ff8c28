//! The RoCEv2 invariant CRC (IBTA Vol 1 Annex A17.3.3, "ICRC").
//!
//! CRC-32 as in Ethernet/zlib (reflected polynomial 0xEDB88320, initial value
//! all ones, final complement) over: 8 bytes of 0xFF standing for the masked
//! LRH, the IP header with the variant fields set to all ones (IPv4: TOS, TTL,
//! header checksum; IPv6: traffic class, flow label, hop limit), the UDP
//! header with its checksum set to all ones, the BTH with byte 4
//! (FECN/BECN/resv6) set to all ones, then everything up to the ICRC. The
//! result goes on the wire least-significant byte first.
//!
//! Computed in one pass without copying the frame: for the usual headers
//! (IPv4 without options, IPv6) the variant fields are set as the CRC
//! kernels load them ([`crc::update_masked`] up to 127 bytes,
//! [`crc::update_masked_head`] beyond, both carry-less multiplication);
//! other headers are masked in a stack copy and the rest is fed in place.
//!
//! Entry points: [`of_l3`] / [`of_frame`] compute the ICRC a packet should
//! carry, [`fill_l3`] / [`fill_frame`] store it, [`compute`] is the primitive
//! for callers that already know where the headers are, and [`headers`]
//! starts a CRC that a sender continues over the payload as it copies it
//! ([`crc::copy_update`]).

use super::bth::BTH_LEN;
use super::crc;
use super::error::{Header, WireError};
use super::ethernet::EthernetFrame;
use super::field;
use super::ipv4::Ipv4Packet;
use super::ipv6::{Ipv6Packet, IPV6_LEN};
use super::udp::UDP_LEN;

/// ICRC length.
pub const ICRC_LEN: usize = 4;

/// CRC-32 register after the 8 bytes of 0xFF that stand for the masked LRH
/// (the value rxe starts from; `crc32fast` takes the complemented form,
/// [`LRH_CRC`]).
pub const LRH_STATE: u32 = 0xdebb_20e3;

/// The finished CRC-32 of 8 bytes of 0xFF (`!LRH_STATE`): the value
/// `crc32fast::Hasher::new_with_initial` continues from.
pub const LRH_CRC: u32 = !LRH_STATE;

/// Compute the ICRC over an L3 packet starting at its IP header, where
/// `ip_header_len` bytes are the IP header (20..=60 for IPv4, 40 for IPv6), and
/// `end` is where the ICRC starts (the ICRC covers `packet[..end]`).
///
/// Errors: `Truncated(Bth)` if `end` leaves no room for the IP, UDP and BTH
/// headers or lies beyond `packet`; `BadIhl` for an IPv4 header length
/// outside 20..=60; `BadIpVersion` for a version nibble other than 4 or 6.
pub fn compute(packet: &[u8], ip_header_len: usize, end: usize) -> Result<u32, WireError> {
    packet.first().ok_or(WireError::Truncated(Header::Ipv4))?;
    let rest = ip_header_len + UDP_LEN + BTH_LEN;
    let covered = packet.get(..end).ok_or(WireError::Truncated(Header::Bth))?;
    if end < rest {
        return Err(WireError::Truncated(Header::Bth));
    }
    // A small packet (a 64 B WRITE's 120 bytes) in one masked run, a
    // larger one (a full-MTU frame) in one masked run of the wide kernel.
    let version = covered.first().map_or(0, |b| b >> 4);
    let mask = mask_for(version, ip_header_len);
    if let Some(crc) = crc::update_masked(LRH_CRC, covered, mask) {
        return Ok(crc);
    }
    if let Some(crc) = mask.first_chunk::<{ crc::MASK_HEAD }>().and_then(|head| crc::update_masked_head(LRH_CRC, covered, head)) {
        return Ok(crc);
    }
    let crc = headers(covered, ip_header_len, rest)?;
    Ok(crc::update(crc, &covered[rest..]))
}

/// [`compute`] that also copies `packet[payload_at..payload_at + len]` (a
/// received packet's payload) to `dst` in the same pass
/// ([`crc::update_masked_place`]): `None`, with nothing written, where that
/// kernel does not take the packet (a CPU without it, an IPv4 header with
/// options, a run under 256 bytes, a payload not inside `packet[..end]`).
///
/// # Safety
/// `dst` must be valid for writes of `len` bytes and must not overlap `packet`.
#[inline]
pub unsafe fn compute_placing(packet: &[u8], ip_header_len: usize, end: usize, payload_at: usize, len: usize, dst: *mut u8) -> Option<u32> {
    let covered = packet.get(..end)?;
    let version = covered.first()? >> 4;
    let head = mask_for(version, ip_header_len).first_chunk::<{ crc::MASK_HEAD }>()?;
    // The payload after the BTH (and inside `end`: the kernel checks that).
    if payload_at < ip_header_len + UDP_LEN + BTH_LEN {
        return None;
    }
    // SAFETY: the caller vouches for `dst`.
    unsafe { crc::update_masked_place(LRH_CRC, covered, head, payload_at, len, dst) }
}

/// Longest header run [`headers`] takes: an IPv4 header with options, UDP,
/// BTH and the longest extension headers a packet carries (AtomicETH, 28).
pub const HEADERS_MAX: usize = 60 + UDP_LEN + BTH_LEN + 28;

/// The ICRC's masks (A17.3.3) over an IPv6 header (`v6`) or an IPv4 header
/// of `ip_len` bytes, UDP and BTH, and zeros after them (extension headers
/// and payload): ones where a variant field lies. For the usual headers `N`
/// covers the longest run the short CRC kernel takes, so a small packet's
/// whole ICRC is one masked run; [`headers`] masks its copy of other
/// headers with it too.
const fn header_mask<const N: usize>(v6: bool, ip_len: usize) -> [u8; N] {
    let mut m = [0u8; N];
    if v6 {
        m[0] = 0x0f; // traffic class (low nibble of byte 0, high of byte 1)
        m[1] = 0xff; // ... and the flow label
        m[2] = 0xff;
        m[3] = 0xff;
        m[7] = 0xff; // hop limit
    } else {
        m[1] = 0xff; // TOS (DSCP + ECN)
        m[8] = 0xff; // TTL
        m[10] = 0xff; // header checksum
        m[11] = 0xff;
    }
    m[ip_len + 6] = 0xff; // UDP checksum
    m[ip_len + 7] = 0xff;
    m[ip_len + UDP_LEN + 4] = 0xff; // BTH: FECN, BECN, resv6
    m
}

/// [`header_mask`] for IPv4 without options.
const MASK_V4: [u8; MASK_LEN] = header_mask(false, 20);

/// [`header_mask`] for IPv6.
const MASK_V6: [u8; MASK_LEN] = header_mask(true, IPV6_LEN);

/// Bytes a mask covers: every run the short CRC kernel takes.
const MASK_LEN: usize = crc::SHORT_MAX;

/// The mask of an IP header of `ip_header_len` bytes with version
/// `version`: IPv4 without options and IPv6 (empty for anything else).
fn mask_for(version: u8, ip_header_len: usize) -> &'static [u8] {
    match (version, ip_header_len) {
        (4, 20) => &MASK_V4,
        (6, IPV6_LEN) => &MASK_V6,
        _ => &[],
    }
}

/// The CRC (finished form, to continue with [`crc::update`]) of the ICRC's
/// start: the masked LRH, then `packet[..upto]` with the IP, UDP and BTH
/// variant fields masked. `upto` covers at least the BTH and at most
/// [`HEADERS_MAX`] bytes: the extension headers may ride along, so that a
/// sender can continue over a payload it is still copying.
///
/// Errors as [`compute`]; `BufferTooSmall` if `upto` exceeds `HEADERS_MAX`.
pub fn headers(packet: &[u8], ip_header_len: usize, upto: usize) -> Result<u32, WireError> {
    // The usual headers (IPv4 without options, IPv6) are masked as the CRC
    // loads them, in place: no copy, no stores for loads to wait on.
    if let Some(lane) = headers_lane(packet, ip_header_len, upto)? {
        return Ok(lane.finish());
    }
    // `headers_lane` checked that these exist (the error is its own).
    let (Some(&first), Some(covered)) = (packet.first(), packet.get(..upto)) else {
        return Err(WireError::Truncated(Header::Bth));
    };
    let version = first >> 4;
    // Otherwise the masked headers are copied into one buffer, so the CRC
    // runs over them at once rather than over several small runs.
    match version {
        4 if !(20..=60).contains(&ip_header_len) => return Err(WireError::BadIhl((ip_header_len / 4).min(255) as u8)),
        6 if ip_header_len != IPV6_LEN => return Err(WireError::BadIpLength),
        4 | 6 => {}
        v => return Err(WireError::BadIpVersion(v)),
    }
    let mut hdr: [u8; HEADERS_MAX] = header_mask(version == 6, ip_header_len);
    for (h, &c) in hdr.iter_mut().zip(covered) {
        *h |= c;
    }
    Ok(crc::update(LRH_CRC, &hdr[..upto]))
}

/// [`headers`] as an unreduced [`crc::CrcLane`] for the usual headers (IPv4
/// without options, IPv6) where the CPU has the short kernel, which the
/// sender's fused copy folds on from ([`crc::copy_update_lane_raw`]);
/// `Ok(None)` where [`headers`] takes its copying path instead.
///
/// Errors as [`headers`].
#[inline]
pub fn headers_lane(packet: &[u8], ip_header_len: usize, upto: usize) -> Result<Option<crc::CrcLane>, WireError> {
    let version = packet.first().ok_or(WireError::Truncated(Header::Ipv4))? >> 4;
    let covered = packet.get(..upto).ok_or(WireError::Truncated(Header::Bth))?;
    if upto < ip_header_len + UDP_LEN + BTH_LEN {
        return Err(WireError::Truncated(Header::Bth));
    }
    if upto > HEADERS_MAX {
        return Err(WireError::BufferTooSmall);
    }
    Ok(crc::update_masked_lane(LRH_CRC, covered, mask_for(version, ip_header_len)))
}

/// Where the IP header ends and the IP packet ends, from the IP header's own
/// length fields (no checksum or protocol checks).
fn l3_bounds(packet: &[u8]) -> Result<(usize, usize), WireError> {
    match packet.first().map(|b| b >> 4) {
        Some(6) => {
            let p = Ipv6Packet::new_checked(packet)?;
            Ok((IPV6_LEN, IPV6_LEN + usize::from(p.payload_len())))
        }
        Some(_) => {
            let p = Ipv4Packet::new_checked(packet)?;
            Ok((p.header_len(), usize::from(p.total_len())))
        }
        None => Err(WireError::Truncated(Header::Ipv4)),
    }
}

/// The ICRC a RoCEv2 packet starting at its IP header should carry: the
/// CRC over the IP packet (as long as its length field says) up to its last
/// 4 bytes, which are the ICRC's place. Does not look at what is stored there.
pub fn of_l3(packet: &[u8]) -> Result<u32, WireError> {
    let (ip_len, total) = l3_bounds(packet)?;
    let end = total.checked_sub(ICRC_LEN).ok_or(WireError::Truncated(Header::Icrc))?;
    compute(packet, ip_len, end)
}

/// The ICRC an Ethernet frame (optionally 802.1Q-tagged) carrying RoCEv2
/// should carry; see [`of_l3`].
pub fn of_frame(frame: &[u8]) -> Result<u32, WireError> {
    of_l3(EthernetFrame::new_checked(frame)?.payload())
}

/// Compute the ICRC of an L3 packet and store it in its last 4 bytes (LSB
/// first), e.g. after patching a header field the ICRC covers. Returns it.
pub fn fill_l3(packet: &mut [u8]) -> Result<u32, WireError> {
    let (ip_len, total) = l3_bounds(packet)?;
    let end = total.checked_sub(ICRC_LEN).ok_or(WireError::Truncated(Header::Icrc))?;
    let crc = compute(packet, ip_len, end)?;
    if let Some(dst) = packet.get_mut(end..total) {
        dst.copy_from_slice(&crc.to_le_bytes());
    }
    Ok(crc)
}

/// [`fill_l3`] for an Ethernet frame.
pub fn fill_frame(frame: &mut [u8]) -> Result<u32, WireError> {
    let mut f = EthernetFrame::new_checked(frame)?;
    fill_l3(f.payload_mut())
}

/// The 4 stored ICRC bytes at `at` (zeros if out of range; callers check lengths first).
pub(crate) fn rd_icrc(packet: &[u8], at: usize) -> [u8; 4] {
    field::rd(packet, at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lrh_state_is_crc_of_eight_ff() {
        // crc32fast's `new_with_initial(x)` continues a CRC whose finished
        // value so far is `x`; the raw register after 8 × 0xFF is its complement.
        let mut h = crc32fast::Hasher::new();
        h.update(&[0xff; 8]);
        assert_eq!(h.finalize(), LRH_CRC);
        assert_eq!(!LRH_CRC, 0xdebb_20e3);
        // ... and continuing from it equals hashing the 8 bytes first.
        let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        let mut whole = crc32fast::Hasher::new();
        whole.update(&[0xff; 8]);
        whole.update(&data);
        let mut cont = crc32fast::Hasher::new_with_initial(LRH_CRC);
        cont.update(&data);
        assert_eq!(cont.finalize(), whole.finalize());
    }

    #[test]
    fn headers_and_compute_masked_in_place_equal_a_masked_copy() {
        // The reference: copy, set the variant fields to ones (A17.3.3), CRC.
        fn reference(p: &[u8], ip_len: usize, upto: usize) -> u32 {
            let mut h = p[..upto].to_vec();
            if ip_len == IPV6_LEN {
                h[0] |= 0x0f;
                h[1..4].fill(0xff);
                h[7] = 0xff;
            } else {
                for i in [1, 8, 10, 11] {
                    h[i] = 0xff;
                }
            }
            h[ip_len + 6] = 0xff;
            h[ip_len + 7] = 0xff;
            h[ip_len + UDP_LEN + 4] = 0xff;
            let mut c = crc32fast::Hasher::new_with_initial(LRH_CRC);
            c.update(&h);
            c.finalize()
        }
        let mut rng = crate::wire::test_noise::XorShift::new(0x1357_9bdf);
        for round in 0..300 {
            let mut p = rng.bytes(if round < 30 { 4200 } else { 200 });
            let (ip_len, first) = match round % 3 {
                0 => (20, 0x45),
                1 => (IPV6_LEN, 0x60 | (p[0] & 0x0f)),
                _ => (24, 0x46),
            };
            p[0] = first;
            let min = ip_len + UDP_LEN + BTH_LEN;
            for upto in [min, min + 4, min + 16, min + 28, HEADERS_MAX.min(min + 28 + 9)] {
                assert_eq!(headers(&p, ip_len, upto), Ok(reference(&p, ip_len, upto)), "ip_len {ip_len} upto {upto}");
            }
            // The whole ICRC: one masked run up to 127 bytes, one run of the
            // wide kernel beyond (two runs for IPv4 with options, or without
            // the wide kernel): every length about the kernels' limits and
            // full-MTU frames, every tail after the last whole lane.
            for end in [min, 100, 120, 126, 127, 128, 150, 200] {
                assert_eq!(compute(&p, ip_len, end), Ok(reference(&p, ip_len, end)), "ip_len {ip_len} end {end}");
            }
            if p.len() > 200 {
                for end in (129..=400).chain(1050..=1100).chain([2048, 2049, 4096 + 40, 4096 + 56, 4096 + 56 + 3, 4199, 4200]) {
                    assert_eq!(compute(&p, ip_len, end), Ok(reference(&p, ip_len, end)), "ip_len {ip_len} end {end}");
                }
            }
        }
        assert_eq!(headers(&[0x45; 200], 20, HEADERS_MAX + 1), Err(WireError::BufferTooSmall));
    }

    #[test]
    fn the_variant_fields_lie_in_the_masked_head() {
        // `crc::update_masked_head` masks only the first MASK_HEAD bytes.
        for m in [&MASK_V4, &MASK_V6] {
            assert!(m[crc::MASK_HEAD..].iter().all(|&b| b == 0));
            assert!(m[..crc::MASK_HEAD].iter().any(|&b| b != 0));
        }
    }

    #[test]
    fn compute_rejects_bad_bounds() {
        let mut p = [0u8; 60];
        p[0] = 0x45;
        assert_eq!(compute(&p, 20, 39), Err(WireError::Truncated(Header::Bth)));
        assert_eq!(compute(&p, 20, 61), Err(WireError::Truncated(Header::Bth)));
        assert_eq!(compute(&p, 16, 56), Err(WireError::BadIhl(4)));
        assert_eq!(compute(&[0u8; 120], 64, 100).map(|_| ()), Err(WireError::BadIpVersion(0)));
        p[0] = 0x46;
        assert!(compute(&p, 24, 44).is_ok());
        assert_eq!(compute(&p, 64, 44), Err(WireError::Truncated(Header::Bth)));
        assert_eq!(compute(&[], 20, 0), Err(WireError::Truncated(Header::Ipv4)));
    }
}
