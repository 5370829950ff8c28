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
//! Computed in one pass without copying the frame: the three small headers
//! are masked in stack copies, the rest of the packet is fed in place.
//! `crc32fast` uses carry-less multiplication (PCLMULQDQ) when the CPU has it.

use super::ip::{IPV6_LEN, UDP_LEN};
use super::ext::BTH_LEN;
use super::{Header, WireError};

/// CRC-32 state after the 8 bytes of 0xFF that stand for the masked LRH
/// (the value rxe starts from).
pub const LRH_STATE: u32 = 0xdebb_20e3;

/// Compute the ICRC over an L3 packet starting at its IP header, where
/// `ip_header_len` bytes are the IP header (20+ for IPv4, 40 for IPv6), and
/// `end` is where the ICRC starts (the ICRC covers `packet[..end]`).
pub fn compute(packet: &[u8], ip_header_len: usize, end: usize) -> Result<u32, WireError> {
    let version = packet.first().ok_or(WireError::Truncated(Header::Ipv4))? >> 4;
    let udp = ip_header_len;
    let bth = udp + UDP_LEN;
    let rest = bth + BTH_LEN;
    if end < rest || end > packet.len() {
        return Err(WireError::Truncated(Header::Bth));
    }
    let mut h = crc32fast::Hasher::new_with_initial(!LRH_STATE);
    match version {
        4 => {
            let mut ip = [0u8; 60];
            let ip = ip.get_mut(..ip_header_len).ok_or(WireError::BadIhl((ip_header_len / 4) as u8))?;
            ip.copy_from_slice(&packet[..ip_header_len]);
            ip[1] = 0xff; // TOS
            ip[8] = 0xff; // TTL
            ip[10] = 0xff; // header checksum
            ip[11] = 0xff;
            h.update(ip);
        }
        6 => {
            let mut ip = [0u8; IPV6_LEN];
            ip.copy_from_slice(packet.get(..IPV6_LEN).ok_or(WireError::Truncated(Header::Ipv6))?);
            ip[0] |= 0x0f; // traffic class (low nibble of byte 0, high of byte 1)
            ip[1] = 0xff; // ... and the flow label
            ip[2] = 0xff;
            ip[3] = 0xff;
            ip[7] = 0xff; // hop limit
            h.update(&ip);
        }
        v => return Err(WireError::BadIpVersion(v)),
    }
    let mut u = [0u8; UDP_LEN];
    u.copy_from_slice(&packet[udp..bth]);
    u[6] = 0xff;
    u[7] = 0xff;
    h.update(&u);
    let mut b = [0u8; BTH_LEN];
    b.copy_from_slice(&packet[bth..rest]);
    b[4] = 0xff;
    h.update(&b);
    h.update(&packet[rest..end]);
    Ok(h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lrh_state_is_crc_of_eight_ff() {
        // crc32fast's `new_with_initial(x)` continues a CRC whose finalized
        // value so far is `x`; the raw register after 8 × 0xFF is !crc.
        let mut h = crc32fast::Hasher::new();
        h.update(&[0xff; 8]);
        assert_eq!(!h.finalize(), LRH_STATE);
    }
}
