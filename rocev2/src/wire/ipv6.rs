//! IPv6 (RFC 8200 section 3): the [`Ipv6Packet`] view of the fixed header
//! (extension headers are not parsed) and [`Ipv6Repr`] with its parse and emit.

use super::error::{Header, WireError};
use super::field::{self, view};

/// IPv6 header length.
pub const IPV6_LEN: usize = 40;

/// IPv6 header fields (no extension headers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ipv6Repr {
    /// Source address.
    pub src: [u8; 16],
    /// Destination address.
    pub dst: [u8; 16],
    /// Traffic class (DSCP << 2 | ECN).
    pub traffic_class: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Next header (17 for UDP).
    pub next_header: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Payload length.
    pub payload_len: u16,
}

view! {
    /// A checked view of an IPv6 packet (the 40-byte fixed header, then the
    /// payload-length bytes).
    Ipv6Packet
}

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    /// The buffer holds the 40-byte header with version 6, and the payload
    /// length fits the buffer.
    pub fn check_len(&self) -> Result<(), WireError> {
        let b = self.buffer.as_ref();
        if b.len() < IPV6_LEN {
            return Err(WireError::Truncated(Header::Ipv6));
        }
        if self.version() != 6 {
            return Err(WireError::BadIpVersion(self.version()));
        }
        if IPV6_LEN + usize::from(self.payload_len()) > b.len() {
            return Err(WireError::BadIpLength);
        }
        Ok(())
    }

    fn vtf(&self) -> u32 {
        field::u32_at(self.buffer.as_ref(), 0)
    }

    /// Version nibble (6).
    pub fn version(&self) -> u8 {
        (self.vtf() >> 28) as u8
    }

    /// Traffic class (DSCP << 2 | ECN).
    pub fn traffic_class(&self) -> u8 {
        (self.vtf() >> 20) as u8
    }

    /// ECN bits of the traffic class.
    pub fn ecn(&self) -> u8 {
        self.traffic_class() & 3
    }

    /// Flow label (20 bits).
    pub fn flow_label(&self) -> u32 {
        self.vtf() & 0x000f_ffff
    }

    /// Payload length (bytes after the 40-byte header).
    pub fn payload_len(&self) -> u16 {
        field::u16_at(self.buffer.as_ref(), 4)
    }

    /// Next header (17 = UDP).
    pub fn next_header(&self) -> u8 {
        field::u8_at(self.buffer.as_ref(), 6)
    }

    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        field::u8_at(self.buffer.as_ref(), 7)
    }

    /// Source address.
    pub fn src_addr(&self) -> [u8; 16] {
        field::rd(self.buffer.as_ref(), 8)
    }

    /// Destination address.
    pub fn dst_addr(&self) -> [u8; 16] {
        field::rd(self.buffer.as_ref(), 24)
    }

    /// The payload (payload-length bytes after the header).
    pub fn payload(&self) -> &[u8] {
        field::slice(self.buffer.as_ref(), IPV6_LEN, IPV6_LEN + usize::from(self.payload_len()))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6Packet<T> {
    fn set_vtf(&mut self, v: u32) {
        field::set_u32(self.bytes_mut(), 0, v);
    }

    /// Set version 6, leaving traffic class and flow label.
    pub fn set_version(&mut self) {
        let v = (self.vtf() & 0x0fff_ffff) | (6 << 28);
        self.set_vtf(v);
    }

    /// Set the traffic class.
    pub fn set_traffic_class(&mut self, tc: u8) {
        let v = (self.vtf() & 0xf00f_ffff) | (u32::from(tc) << 20);
        self.set_vtf(v);
    }

    /// Set the ECN bits of the traffic class.
    pub fn set_ecn(&mut self, ecn: u8) {
        let tc = (self.traffic_class() & !3) | (ecn & 3);
        self.set_traffic_class(tc);
    }

    /// Set the flow label (low 20 bits of `fl`).
    pub fn set_flow_label(&mut self, fl: u32) {
        let v = (self.vtf() & 0xfff0_0000) | (fl & 0x000f_ffff);
        self.set_vtf(v);
    }

    /// Set the payload length.
    pub fn set_payload_len(&mut self, v: u16) {
        field::set_u16(self.bytes_mut(), 4, v);
    }

    /// Set the next header.
    pub fn set_next_header(&mut self, v: u8) {
        field::set_u8(self.bytes_mut(), 6, v);
    }

    /// Set the hop limit.
    pub fn set_hop_limit(&mut self, v: u8) {
        field::set_u8(self.bytes_mut(), 7, v);
    }

    /// Set the source address.
    pub fn set_src_addr(&mut self, a: [u8; 16]) {
        field::wr(self.bytes_mut(), 8, a);
    }

    /// Set the destination address.
    pub fn set_dst_addr(&mut self, a: [u8; 16]) {
        field::wr(self.bytes_mut(), 24, a);
    }

    /// The payload, mutable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = IPV6_LEN + usize::from(self.payload_len());
        field::slice_mut(self.bytes_mut(), IPV6_LEN, end)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_roundtrip() {
        let mut b = [0u8; 48];
        let mut p = Ipv6Packet::new_unchecked(&mut b[..]);
        p.set_version();
        p.set_traffic_class(0xb9);
        p.set_flow_label(0xabcde);
        p.set_ecn(2);
        p.set_payload_len(8);
        p.set_next_header(17);
        p.set_hop_limit(255);
        p.set_src_addr([1; 16]);
        p.set_dst_addr([2; 16]);
        p.payload_mut().fill(7);
        let p = Ipv6Packet::new_checked(&b[..]).unwrap();
        assert_eq!((p.version(), p.traffic_class(), p.ecn(), p.flow_label()), (6, 0xba, 2, 0xabcde));
        assert_eq!((p.payload_len(), p.next_header(), p.hop_limit()), (8, 17, 255));
        assert_eq!((p.src_addr(), p.dst_addr(), p.payload()), ([1; 16], [2; 16], &[7u8; 8][..]));
        assert_eq!(&b[..4], &[0x6b, 0xaa, 0xbc, 0xde]);
    }

    #[test]
    fn check_len_errors() {
        let mut b = [0u8; 48];
        b[0] = 0x60;
        b[5] = 9;
        assert_eq!(Ipv6Packet::new_checked(&b[..]), Err(WireError::BadIpLength));
        assert_eq!(Ipv6Packet::new_checked(&b[..39]), Err(WireError::Truncated(Header::Ipv6)));
        b[0] = 0x40;
        assert_eq!(Ipv6Packet::new_checked(&b[..]), Err(WireError::BadIpVersion(4)));
        let p = Ipv6Packet::new_unchecked(&b[..2]);
        assert_eq!((p.payload_len(), p.src_addr(), p.payload()), (0, [0; 16], &[][..]));
    }
}
