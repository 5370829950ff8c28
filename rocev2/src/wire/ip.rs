//! Ethernet, IPv4, IPv6 and UDP: parse and emit of the layers below the BTH.
//!
//! Parsers take the bytes starting at their header and return the `Repr` plus
//! the header length; they never panic and never read past the slice.

use super::packet::{field, EthernetFrame, Ipv4Packet, Ipv6Packet, UdpPacket};
use super::repr::{EthernetRepr, Ipv4Repr, Ipv6Repr, UdpRepr};
use super::WireError;

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

    /// Parse an Ethernet II header with at most one 802.1Q tag. Returns the
    /// repr and the header length.
    pub fn parse(b: &[u8]) -> Result<(EthernetRepr, usize), WireError> {
        let f = EthernetFrame::new_checked(b)?;
        let repr = EthernetRepr { dst: f.dst_addr(), src: f.src_addr(), vlan: f.vlan(), ethertype: f.ethertype() };
        Ok((repr, f.header_len()))
    }

    /// Emit into the start of `out` (at least `header_len()` bytes).
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let len = self.header_len();
        let out = out.get_mut(..len).ok_or(WireError::BufferTooSmall)?;
        let mut f = EthernetFrame::new_unchecked(out);
        f.set_dst_addr(self.dst);
        f.set_src_addr(self.src);
        match self.vlan {
            Some(tag) => f.set_vlan(tag),
            // an untagged header: make sure no stale TPID moves the EtherType
            None => field::set_u16(f.bytes_mut(), 12, 0),
        }
        f.set_ethertype(self.ethertype);
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
    /// Parse an IPv4 header (options accepted and skipped). Checks, in this
    /// order: version, IHL (RFC 791: at least 5), total length against `b`,
    /// the header checksum, and that the packet is not a fragment (RoCEv2
    /// sets DF and is never fragmented). Returns the repr and the header length.
    pub fn parse(b: &[u8]) -> Result<(Ipv4Repr, usize), WireError> {
        let p = Ipv4Packet::new_checked(b)?;
        if !p.verify_checksum() {
            return Err(WireError::BadIpv4Checksum);
        }
        if p.more_frags() || p.frag_offset() != 0 {
            return Err(WireError::Fragmented);
        }
        let hlen = p.header_len();
        let repr = Ipv4Repr {
            src: p.src_addr(),
            dst: p.dst_addr(),
            dscp: p.dscp(),
            ecn: p.ecn(),
            ident: p.ident(),
            dont_frag: p.dont_frag(),
            ttl: p.ttl(),
            protocol: p.protocol(),
            // check_len: total length >= header length
            payload_len: p.total_len() - hlen as u16,
        };
        Ok((repr, hlen))
    }

    /// Emit a 20-byte header (IHL 5) with the header checksum computed.
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let h = out.get_mut(..IPV4_LEN).ok_or(WireError::BufferTooSmall)?;
        let total = usize::from(self.payload_len) + IPV4_LEN;
        let total = u16::try_from(total).map_err(|_| WireError::FieldOverflow)?;
        let mut p = Ipv4Packet::new_unchecked(h);
        p.set_version_and_header_len(IPV4_LEN);
        p.set_dscp(self.dscp);
        p.set_ecn(self.ecn);
        p.set_total_len(total);
        p.set_ident(self.ident);
        p.set_flags_frag(self.dont_frag, false, 0);
        p.set_ttl(self.ttl);
        p.set_protocol(self.protocol);
        p.set_src_addr(self.src);
        p.set_dst_addr(self.dst);
        p.fill_checksum();
        Ok(IPV4_LEN)
    }
}

impl Ipv6Repr {
    /// Parse an IPv6 header (no extension headers). Checks the version and
    /// the payload length against `b`.
    pub fn parse(b: &[u8]) -> Result<(Ipv6Repr, usize), WireError> {
        let p = Ipv6Packet::new_checked(b)?;
        let repr = Ipv6Repr {
            src: p.src_addr(),
            dst: p.dst_addr(),
            traffic_class: p.traffic_class(),
            flow_label: p.flow_label(),
            next_header: p.next_header(),
            hop_limit: p.hop_limit(),
            payload_len: p.payload_len(),
        };
        Ok((repr, IPV6_LEN))
    }

    /// Emit the 40-byte header.
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let h = out.get_mut(..IPV6_LEN).ok_or(WireError::BufferTooSmall)?;
        let mut p = Ipv6Packet::new_unchecked(h);
        p.set_version();
        p.set_traffic_class(self.traffic_class);
        p.set_flow_label(self.flow_label);
        p.set_payload_len(self.payload_len);
        p.set_next_header(self.next_header);
        p.set_hop_limit(self.hop_limit);
        p.set_src_addr(self.src);
        p.set_dst_addr(self.dst);
        Ok(IPV6_LEN)
    }
}

impl UdpRepr {
    /// Parse a UDP header; `length` must fit in `b` and cover the header.
    pub fn parse(b: &[u8]) -> Result<UdpRepr, WireError> {
        let p = UdpPacket::new_checked(b)?;
        Ok(UdpRepr { src_port: p.src_port(), dst_port: p.dst_port(), length: p.len(), checksum: p.checksum() })
    }

    /// Emit the 8-byte header as given.
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let h = out.get_mut(..UDP_LEN).ok_or(WireError::BufferTooSmall)?;
        let mut p = UdpPacket::new_unchecked(h);
        p.set_src_port(self.src_port);
        p.set_dst_port(self.dst_port);
        p.set_len(self.length);
        p.set_checksum(self.checksum);
        Ok(UDP_LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Header, VlanTag};

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
