//! IPv4 header (RFC 791), options allowed.

use super::field;
use super::view;
use crate::wire::ip::{internet_checksum, IPV4_LEN};
use crate::wire::{Header, WireError};

view! {
    /// A checked view of an IPv4 packet. Options are accepted (IHL 5..=15);
    /// [`payload`](Self::payload) ends where the total length says.
    Ipv4Packet
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    /// The buffer holds a version-4 header of IHL ≥ 5 (RFC 791: the minimum
    /// header is 5 words) with its options, and the total length covers the
    /// header and fits the buffer (bytes beyond it, e.g. Ethernet padding,
    /// are allowed).
    pub fn check_len(&self) -> Result<(), WireError> {
        let b = self.buffer.as_ref();
        if b.len() < IPV4_LEN {
            return Err(WireError::Truncated(Header::Ipv4));
        }
        if self.version() != 4 {
            return Err(WireError::BadIpVersion(self.version()));
        }
        if self.ihl() < 5 {
            return Err(WireError::BadIhl(self.ihl()));
        }
        let hlen = self.header_len();
        if b.len() < hlen {
            return Err(WireError::Truncated(Header::Ipv4));
        }
        let total = usize::from(self.total_len());
        if total < hlen || total > b.len() {
            return Err(WireError::BadIpLength);
        }
        Ok(())
    }

    /// Version nibble (4).
    pub fn version(&self) -> u8 {
        field::u8_at(self.buffer.as_ref(), 0) >> 4
    }

    /// Internet header length in 32-bit words.
    pub fn ihl(&self) -> u8 {
        field::u8_at(self.buffer.as_ref(), 0) & 0x0f
    }

    /// Header length in bytes (IHL × 4).
    pub fn header_len(&self) -> usize {
        usize::from(self.ihl()) * 4
    }

    /// DSCP (upper 6 bits of the TOS byte).
    pub fn dscp(&self) -> u8 {
        field::u8_at(self.buffer.as_ref(), 1) >> 2
    }

    /// ECN (lower 2 bits of the TOS byte): 0 not-ECT, 1 ECT(1), 2 ECT(0), 3 CE.
    pub fn ecn(&self) -> u8 {
        field::u8_at(self.buffer.as_ref(), 1) & 3
    }

    /// Total length (header + payload).
    pub fn total_len(&self) -> u16 {
        field::u16_at(self.buffer.as_ref(), 2)
    }

    /// Identification.
    pub fn ident(&self) -> u16 {
        field::u16_at(self.buffer.as_ref(), 4)
    }

    /// The DF flag.
    pub fn dont_frag(&self) -> bool {
        field::u16_at(self.buffer.as_ref(), 6) & 0x4000 != 0
    }

    /// The MF flag.
    pub fn more_frags(&self) -> bool {
        field::u16_at(self.buffer.as_ref(), 6) & 0x2000 != 0
    }

    /// Fragment offset in 8-byte units.
    pub fn frag_offset(&self) -> u16 {
        field::u16_at(self.buffer.as_ref(), 6) & 0x1fff
    }

    /// Time to live.
    pub fn ttl(&self) -> u8 {
        field::u8_at(self.buffer.as_ref(), 8)
    }

    /// Protocol (17 = UDP).
    pub fn protocol(&self) -> u8 {
        field::u8_at(self.buffer.as_ref(), 9)
    }

    /// Header checksum as stored.
    pub fn checksum(&self) -> u16 {
        field::u16_at(self.buffer.as_ref(), 10)
    }

    /// Source address.
    pub fn src_addr(&self) -> [u8; 4] {
        field::rd(self.buffer.as_ref(), 12)
    }

    /// Destination address.
    pub fn dst_addr(&self) -> [u8; 4] {
        field::rd(self.buffer.as_ref(), 16)
    }

    /// The options (bytes 20 to the header length).
    pub fn options(&self) -> &[u8] {
        field::slice(self.buffer.as_ref(), IPV4_LEN, self.header_len())
    }

    /// Whether the header checksum verifies (RFC 1071: the one's-complement
    /// sum over the header, checksum included, is all ones).
    pub fn verify_checksum(&self) -> bool {
        let b = self.buffer.as_ref();
        self.header_len() >= IPV4_LEN && b.len() >= self.header_len() && internet_checksum(field::slice(b, 0, self.header_len())) == 0
    }

    /// The payload: from the end of the header to the total length.
    pub fn payload(&self) -> &[u8] {
        field::slice(self.buffer.as_ref(), self.header_len(), usize::from(self.total_len()))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    /// Set version 4 and the header length in bytes (a multiple of 4, 20..=60).
    pub fn set_version_and_header_len(&mut self, header_len: usize) {
        let ihl = ((header_len / 4) & 0x0f) as u8;
        field::set_u8(self.bytes_mut(), 0, 0x40 | ihl);
    }

    /// Set the DSCP (6 bits).
    pub fn set_dscp(&mut self, dscp: u8) {
        field::set_bits(self.bytes_mut(), 1, 0xfc, dscp << 2);
    }

    /// Set the ECN bits (2 bits).
    pub fn set_ecn(&mut self, ecn: u8) {
        field::set_bits(self.bytes_mut(), 1, 0x03, ecn);
    }

    /// Set the total length.
    pub fn set_total_len(&mut self, v: u16) {
        field::set_u16(self.bytes_mut(), 2, v);
    }

    /// Set the identification.
    pub fn set_ident(&mut self, v: u16) {
        field::set_u16(self.bytes_mut(), 4, v);
    }

    /// Set flags and fragment offset: DF, MF, offset (13 bits); the
    /// reserved flag is cleared.
    pub fn set_flags_frag(&mut self, dont_frag: bool, more_frags: bool, frag_offset: u16) {
        let v = (u16::from(dont_frag) << 14) | (u16::from(more_frags) << 13) | (frag_offset & 0x1fff);
        field::set_u16(self.bytes_mut(), 6, v);
    }

    /// Set the time to live.
    pub fn set_ttl(&mut self, v: u8) {
        field::set_u8(self.bytes_mut(), 8, v);
    }

    /// Set the protocol.
    pub fn set_protocol(&mut self, v: u8) {
        field::set_u8(self.bytes_mut(), 9, v);
    }

    /// Set the header checksum field as given.
    pub fn set_checksum(&mut self, v: u16) {
        field::set_u16(self.bytes_mut(), 10, v);
    }

    /// Set the source address.
    pub fn set_src_addr(&mut self, a: [u8; 4]) {
        field::wr(self.bytes_mut(), 12, a);
    }

    /// Set the destination address.
    pub fn set_dst_addr(&mut self, a: [u8; 4]) {
        field::wr(self.bytes_mut(), 16, a);
    }

    /// Compute and store the header checksum (RFC 791) over the header
    /// length's bytes (options included).
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let hlen = self.header_len();
        let ck = internet_checksum(field::slice(self.as_bytes(), 0, hlen));
        self.set_checksum(ck);
    }

    /// The payload, mutable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let (h, t) = (self.header_len(), usize::from(self.total_len()));
        field::slice_mut(self.bytes_mut(), h, t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_options() -> [u8; 30] {
        let mut b = [0u8; 30];
        let mut p = Ipv4Packet::new_unchecked(&mut b[..]);
        p.set_version_and_header_len(24);
        p.set_dscp(46);
        p.set_ecn(3);
        p.set_total_len(28);
        p.set_ident(0xbeef);
        p.set_flags_frag(true, false, 0);
        p.set_ttl(64);
        p.set_protocol(17);
        p.set_src_addr([10, 0, 0, 1]);
        p.set_dst_addr([10, 0, 0, 2]);
        p.payload_mut().copy_from_slice(&[1, 2, 3, 4]);
        b[20..24].copy_from_slice(&[1, 1, 1, 0]); // NOP NOP NOP EOL
        Ipv4Packet::new_unchecked(&mut b[..]).fill_checksum();
        b
    }

    #[test]
    fn fields_options_payload_checksum() {
        let b = with_options();
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert_eq!((p.version(), p.ihl(), p.header_len()), (4, 6, 24));
        assert_eq!((p.dscp(), p.ecn(), p.total_len(), p.ident()), (46, 3, 28, 0xbeef));
        assert_eq!((p.dont_frag(), p.more_frags(), p.frag_offset(), p.ttl(), p.protocol()), (true, false, 0, 64, 17));
        assert_eq!((p.src_addr(), p.dst_addr()), ([10, 0, 0, 1], [10, 0, 0, 2]));
        assert_eq!(p.options(), &[1, 1, 1, 0]);
        assert_eq!(p.payload(), &[1, 2, 3, 4]); // the 2 trailing bytes are not payload
        assert!(p.verify_checksum());
        let mut bad = b;
        bad[8] = 63;
        assert!(!Ipv4Packet::new_checked(&bad[..]).unwrap().verify_checksum());
    }

    #[test]
    fn check_len_errors() {
        let b = with_options();
        assert_eq!(Ipv4Packet::new_checked(&b[..19]), Err(WireError::Truncated(Header::Ipv4)));
        assert_eq!(Ipv4Packet::new_checked(&b[..22]), Err(WireError::Truncated(Header::Ipv4)));
        assert_eq!(Ipv4Packet::new_checked(&b[..27]), Err(WireError::BadIpLength));
        let mut v = b;
        v[0] = 0x66;
        assert_eq!(Ipv4Packet::new_checked(&v[..]), Err(WireError::BadIpVersion(6)));
        v[0] = 0x44;
        assert_eq!(Ipv4Packet::new_checked(&v[..]), Err(WireError::BadIhl(4)));
        let mut v = b;
        v[3] = 23; // total length shorter than the header
        assert_eq!(Ipv4Packet::new_checked(&v[..]), Err(WireError::BadIpLength));
        let p = Ipv4Packet::new_unchecked(&b[..3]);
        assert_eq!((p.total_len(), p.ttl(), p.options(), p.payload(), p.verify_checksum()), (0, 0, &[][..], &[][..], false));
    }
}
