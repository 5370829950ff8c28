//! Ethernet, IPv4, IPv6 and UDP: parse and emit of the layers below the BTH.
//!
//! Parsers take the bytes starting at their header and return the `Repr` plus
//! the header length; they never panic and never read past the slice.

use super::be;
use super::repr::{EthernetRepr, Ipv4Repr, Ipv6Repr, UdpRepr, VlanTag};
use super::{Header, WireError};

/// EtherType of an 802.1Q tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;
/// Ethernet header length without a tag.
pub const ETHERNET_LEN: usize = 14;
/// IPv4 header length without options.
pub const IPV4_LEN: usize = 20;
/// IPv6 header length.
pub const IPV6_LEN: usize = 40;
/// UDP header length.
pub const UDP_LEN: usize = 8;

impl EthernetRepr {
    /// Bytes this header takes on the wire.
    pub const fn header_len(&self) -> usize {
        if self.vlan.is_some() {
            ETHERNET_LEN + 4
        } else {
            ETHERNET_LEN
        }
    }

    /// Parse an Ethernet II header with at most one 802.1Q tag.
    pub fn parse(b: &[u8]) -> Result<(EthernetRepr, usize), WireError> {
        let t = || WireError::Truncated(Header::Ethernet);
        let dst: [u8; 6] = b.get(0..6).ok_or_else(t)?.try_into().map_err(|_| t())?;
        let src: [u8; 6] = b.get(6..12).ok_or_else(t)?.try_into().map_err(|_| t())?;
        let mut ethertype = be::u16_at(b, 12).ok_or_else(t)?;
        let mut len = ETHERNET_LEN;
        let mut vlan = None;
        if ethertype == ETHERTYPE_VLAN {
            let tci = be::u16_at(b, 14).ok_or(WireError::Truncated(Header::Vlan))?;
            ethertype = be::u16_at(b, 16).ok_or(WireError::Truncated(Header::Vlan))?;
            vlan = Some(VlanTag { pcp: (tci >> 13) as u8, dei: tci & 0x1000 != 0, vid: tci & 0x0fff });
            len += 4;
        }
        Ok((EthernetRepr { dst, src, vlan, ethertype }, len))
    }

    /// Emit into the start of `out` (at least `header_len()` bytes).
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let len = self.header_len();
        let out = out.get_mut(..len).ok_or(WireError::BufferTooSmall)?;
        out[0..6].copy_from_slice(&self.dst);
        out[6..12].copy_from_slice(&self.src);
        let mut off = 12;
        if let Some(v) = self.vlan {
            out[12..14].copy_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
            let tci = (u16::from(v.pcp & 7) << 13) | (u16::from(v.dei) << 12) | (v.vid & 0x0fff);
            out[14..16].copy_from_slice(&tci.to_be_bytes());
            off = 16;
        }
        out[off..off + 2].copy_from_slice(&self.ethertype.to_be_bytes());
        Ok(len)
    }
}

/// The Internet checksum (RFC 1071) of `data`.
pub fn internet_checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

impl Ipv4Repr {
    /// Parse an IPv4 header (options accepted and skipped). Checks version,
    /// IHL, total length against `b`, the header checksum, and that the packet
    /// is not a fragment. Returns the repr and the header length.
    pub fn parse(b: &[u8]) -> Result<(Ipv4Repr, usize), WireError> {
        let t = WireError::Truncated(Header::Ipv4);
        let h = b.get(..IPV4_LEN).ok_or(t)?;
        if h[0] >> 4 != 4 {
            return Err(WireError::BadIpVersion(h[0] >> 4));
        }
        let ihl = h[0] & 0x0f;
        if ihl < 5 {
            return Err(WireError::BadIhl(ihl));
        }
        let hlen = usize::from(ihl) * 4;
        let full = b.get(..hlen).ok_or(t)?;
        let total = usize::from(u16::from_be_bytes([h[2], h[3]]));
        if total < hlen || total > b.len() {
            return Err(WireError::BadIpLength);
        }
        if internet_checksum(full) != 0 {
            return Err(WireError::BadIpv4Checksum);
        }
        let flags_frag = u16::from_be_bytes([h[6], h[7]]);
        if flags_frag & 0x2000 != 0 || flags_frag & 0x1fff != 0 {
            return Err(WireError::Fragmented);
        }
        let repr = Ipv4Repr {
            src: [h[12], h[13], h[14], h[15]],
            dst: [h[16], h[17], h[18], h[19]],
            dscp: h[1] >> 2,
            ecn: h[1] & 3,
            ident: u16::from_be_bytes([h[4], h[5]]),
            dont_frag: flags_frag & 0x4000 != 0,
            ttl: h[8],
            protocol: h[9],
            payload_len: (total - hlen) as u16,
        };
        Ok((repr, hlen))
    }

    /// Emit a 20-byte header (IHL 5) with the header checksum computed.
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let h = out.get_mut(..IPV4_LEN).ok_or(WireError::BufferTooSmall)?;
        let total = usize::from(self.payload_len) + IPV4_LEN;
        let total = u16::try_from(total).map_err(|_| WireError::FieldOverflow)?;
        h[0] = 0x45;
        h[1] = (self.dscp << 2) | (self.ecn & 3);
        h[2..4].copy_from_slice(&total.to_be_bytes());
        h[4..6].copy_from_slice(&self.ident.to_be_bytes());
        h[6..8].copy_from_slice(&(if self.dont_frag { 0x4000u16 } else { 0 }).to_be_bytes());
        h[8] = self.ttl;
        h[9] = self.protocol;
        h[10] = 0;
        h[11] = 0;
        h[12..16].copy_from_slice(&self.src);
        h[16..20].copy_from_slice(&self.dst);
        let ck = internet_checksum(h);
        h[10..12].copy_from_slice(&ck.to_be_bytes());
        Ok(IPV4_LEN)
    }
}

impl Ipv6Repr {
    /// Parse an IPv6 header (no extension headers). Checks the version and
    /// the payload length against `b`.
    pub fn parse(b: &[u8]) -> Result<(Ipv6Repr, usize), WireError> {
        let h = b.get(..IPV6_LEN).ok_or(WireError::Truncated(Header::Ipv6))?;
        if h[0] >> 4 != 6 {
            return Err(WireError::BadIpVersion(h[0] >> 4));
        }
        let payload_len = u16::from_be_bytes([h[4], h[5]]);
        if IPV6_LEN + usize::from(payload_len) > b.len() {
            return Err(WireError::BadIpLength);
        }
        let mut src = [0u8; 16];
        let mut dst = [0u8; 16];
        src.copy_from_slice(&h[8..24]);
        dst.copy_from_slice(&h[24..40]);
        let vtf = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
        Ok((
            Ipv6Repr {
                src,
                dst,
                traffic_class: (vtf >> 20) as u8,
                flow_label: vtf & 0x000f_ffff,
                next_header: h[6],
                hop_limit: h[7],
                payload_len,
            },
            IPV6_LEN,
        ))
    }

    /// Emit the 40-byte header.
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let h = out.get_mut(..IPV6_LEN).ok_or(WireError::BufferTooSmall)?;
        let vtf = (6u32 << 28) | (u32::from(self.traffic_class) << 20) | (self.flow_label & 0x000f_ffff);
        h[0..4].copy_from_slice(&vtf.to_be_bytes());
        h[4..6].copy_from_slice(&self.payload_len.to_be_bytes());
        h[6] = self.next_header;
        h[7] = self.hop_limit;
        h[8..24].copy_from_slice(&self.src);
        h[24..40].copy_from_slice(&self.dst);
        Ok(IPV6_LEN)
    }
}

impl UdpRepr {
    /// Parse a UDP header; `length` must fit in `b` and cover the header.
    pub fn parse(b: &[u8]) -> Result<UdpRepr, WireError> {
        let h = b.get(..UDP_LEN).ok_or(WireError::Truncated(Header::Udp))?;
        let length = u16::from_be_bytes([h[4], h[5]]);
        if usize::from(length) < UDP_LEN || usize::from(length) > b.len() {
            return Err(WireError::BadUdpLength);
        }
        Ok(UdpRepr {
            src_port: u16::from_be_bytes([h[0], h[1]]),
            dst_port: u16::from_be_bytes([h[2], h[3]]),
            length,
            checksum: u16::from_be_bytes([h[6], h[7]]),
        })
    }

    /// Emit the 8-byte header as given.
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let h = out.get_mut(..UDP_LEN).ok_or(WireError::BufferTooSmall)?;
        h[0..2].copy_from_slice(&self.src_port.to_be_bytes());
        h[2..4].copy_from_slice(&self.dst_port.to_be_bytes());
        h[4..6].copy_from_slice(&self.length.to_be_bytes());
        h[6..8].copy_from_slice(&self.checksum.to_be_bytes());
        Ok(UDP_LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_roundtrip_and_checks() {
        let r = Ipv4Repr {
            src: [10, 0, 0, 1],
            dst: [10, 0, 0, 2],
            dscp: 26,
            ecn: 2,
            ident: 0x1234,
            dont_frag: true,
            ttl: 64,
            protocol: 17,
            payload_len: 8,
        };
        let mut b = [0u8; 28];
        assert_eq!(r.emit(&mut b).unwrap(), 20);
        assert_eq!(Ipv4Repr::parse(&b).unwrap(), (r, 20));
        let mut bad = b;
        bad[8] ^= 1;
        assert_eq!(Ipv4Repr::parse(&bad), Err(WireError::BadIpv4Checksum));
        let mut ihl = b;
        ihl[0] = 0x44;
        assert_eq!(Ipv4Repr::parse(&ihl), Err(WireError::BadIhl(4)));
        assert_eq!(Ipv4Repr::parse(&b[..27]), Err(WireError::BadIpLength));
        assert_eq!(Ipv4Repr::parse(&b[..10]), Err(WireError::Truncated(Header::Ipv4)));
        let mut v6 = b;
        v6[0] = 0x65;
        assert_eq!(Ipv4Repr::parse(&v6), Err(WireError::BadIpVersion(6)));
    }

    #[test]
    fn ethernet_with_vlan() {
        let e = EthernetRepr { dst: [1; 6], src: [2; 6], vlan: Some(VlanTag { pcp: 3, dei: true, vid: 100 }), ethertype: 0x0800 };
        let mut b = [0u8; 18];
        assert_eq!(e.emit(&mut b).unwrap(), 18);
        assert_eq!(EthernetRepr::parse(&b).unwrap(), (e, 18));
        assert_eq!(EthernetRepr::parse(&b[..15]), Err(WireError::Truncated(Header::Vlan)));
        assert_eq!(EthernetRepr::parse(&b[..5]), Err(WireError::Truncated(Header::Ethernet)));
    }

    #[test]
    fn udp_length_checked() {
        let u = UdpRepr { src_port: 1, dst_port: 4791, length: 20, checksum: 0 };
        let mut b = [0u8; 20];
        u.emit(&mut b).unwrap();
        assert_eq!(UdpRepr::parse(&b).unwrap(), u);
        assert_eq!(UdpRepr::parse(&b[..19]), Err(WireError::BadUdpLength));
    }
}
