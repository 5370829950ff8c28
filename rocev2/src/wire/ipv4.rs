//! IPv4 (RFC 791): the [`Ipv4Packet`] view (options allowed), [`Ipv4Repr`]
//! with its parse and emit, and the Internet checksum.

use super::error::{Header, WireError};
use super::field::{self, view};

/// IPv4 header length without options.
pub const IPV4_LEN: usize = 20;

/// The Internet checksum (RFC 1071) of `data`.
///
/// Summed a 32-bit big-endian word at a time into 64 bits and folded at the
/// end (RFC 1071 section 2(B): the one's-complement sum does not depend on
/// the word size, as 2^16 = 1 modulo 0xffff): five additions for a 20-byte
/// IPv4 header instead of ten, with no vector set-up, on every frame received.
#[inline]
pub fn internet_checksum(data: &[u8]) -> u16 {
    let mut sum: u64 = 0;
    let mut words = data.chunks_exact(4);
    for w in &mut words {
        sum += u64::from(u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
    }
    // 0-3 bytes left: as the high bytes of one more word (an odd last byte is
    // the high byte of its 16-bit word, RFC 1071 section 4.1).
    let mut tail = [0u8; 4];
    let rest = words.remainder();
    if let Some(t) = tail.get_mut(..rest.len()) {
        t.copy_from_slice(rest);
    }
    sum += u64::from(u32::from_be_bytes(tail));
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Whether the one's-complement sum of a 20-byte header (checksum
/// included) is all ones, i.e. `internet_checksum(h) == 0`. The words are
/// read in the machine's byte order: RFC 1071 section 2(B), the sum of
/// byte-swapped words is the byte-swapped sum, and all ones swapped is all
/// ones (no `bswap` per word). Five 32-bit words sum below 2^35: three folds
/// bring any sum to at most 0xffff (RFC 1071 section 2(C)), where the
/// general [`internet_checksum`] loops over the words and the folds.
#[inline]
fn header_sums_to_ones(h: &[u8; IPV4_LEN]) -> bool {
    let w = |i: usize| u64::from(u32::from_ne_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]));
    let sum = w(0) + w(4) + w(8) + w(12) + w(16);
    let sum = (sum & 0xffff) + (sum >> 16); // < 2^16 + 2^19
    let sum = (sum & 0xffff) + (sum >> 16); // <= 0xffff + 8
    let sum = (sum & 0xffff) + (sum >> 16); // <= 0xffff
    sum == 0xffff
}

/// IPv4 header fields a RoCEv2 frame needs (no options: IHL 5 is emitted;
/// a received header with options is accepted and the options skipped).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ipv4Repr {
    /// Source address.
    pub src: [u8; 4],
    /// Destination address.
    pub dst: [u8; 4],
    /// DSCP (6 bits).
    pub dscp: u8,
    /// ECN (2 bits): 0 not-ECT, 1 ECT(1), 2 ECT(0), 3 CE.
    pub ecn: u8,
    /// Identification.
    pub ident: u16,
    /// Don't-fragment flag (RoCEv2 sets it).
    pub dont_frag: bool,
    /// Time to live.
    pub ttl: u8,
    /// IP protocol (17 for UDP).
    pub protocol: u8,
    /// Length of everything after the IPv4 header.
    pub payload_len: u16,
}

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
        // The usual header (no options, every RoCEv2 frame urnic, rxe and
        // ConnectX send): its five words summed in place.
        if self.header_len() == IPV4_LEN {
            if let Some(h) = b.first_chunk::<IPV4_LEN>() {
                return header_sums_to_ones(h);
            }
        }
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

impl Ipv4Repr {
    /// Parse an IPv4 header (options accepted and skipped). Checks, in this
    /// order: version, IHL (RFC 791: at least 5), total length against `b`,
    /// the header checksum, and that the packet is not a fragment (RoCEv2
    /// sets DF and is never fragmented). Returns the repr and the header length.
    // Inlined, as `EthernetRepr::parse` (a stall in `parse_ip` otherwise).
    #[inline]
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The 20-byte header's check in the machine's byte order verifies
    /// exactly the headers whose 16-bit big-endian sum verifies: a valid
    /// header, every single-bit change of it, every pair of byte changes of
    /// a pseudo-random sample, all zeros and all ones.
    #[test]
    fn a_plain_headers_check_matches_the_general_sum() {
        let agree = |h: &[u8; IPV4_LEN]| {
            assert_eq!(header_sums_to_ones(h), checksum_by_halfwords(h) == 0, "{h:02x?}");
            header_sums_to_ones(h)
        };
        let mut h = [0x45, 0x02, 0x10, 0x5a, 0x12, 0x34, 0x40, 0x00, 0x40, 0x11, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2];
        let c = checksum_by_halfwords(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        assert!(agree(&h));
        for bit in 0..IPV4_LEN * 8 {
            let mut x = h;
            x[bit / 8] ^= 1 << (bit % 8);
            assert!(!agree(&x), "bit {bit}");
        }
        let mut rng = crate::wire::test_noise::XorShift::new(0x9e37_79b9_7f4a_7c15);
        for _ in 0..20_000 {
            let seed = rng.next_u64();
            let mut x = h;
            x[(seed % 20) as usize] = (seed >> 8) as u8;
            x[((seed >> 16) % 20) as usize] = (seed >> 24) as u8;
            agree(&x);
        }
        assert!(!agree(&[0; IPV4_LEN]));
        assert!(agree(&[0xff; IPV4_LEN]));
        // A header whose bytes sum to a multiple of 0xffff without being all ones.
        let mut y = [0u8; IPV4_LEN];
        y[0] = 0xff;
        y[1] = 0xfe;
        y[3] = 0x01;
        assert!(agree(&y));
    }

    /// RFC 1071's sum, 16 bits at a time: what `internet_checksum` must equal.
    fn checksum_by_halfwords(data: &[u8]) -> u16 {
        let mut sum: u32 = 0;
        for c in data.chunks(2) {
            sum += u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)]));
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    #[test]
    fn checksum_by_words_matches_the_halfword_sum() {
        // Every length 0-80 (odd tails, the 20-60-byte headers), all-ones
        // bytes (carries in every word) and a pseudo-random fill.
        let random: Vec<u8> = (0..80u32).map(|i| (i.wrapping_mul(0x9e37_79b9).rotate_left(i % 13) >> 24) as u8).collect();
        for data in [vec![0xffu8; 80], vec![0u8; 80], random] {
            for len in 0..=data.len() {
                for start in 0..3.min(data.len() - len + 1) {
                    let d = &data[start..start + len];
                    assert_eq!(internet_checksum(d), checksum_by_halfwords(d), "len {len} start {start}");
                }
            }
        }
        // RFC 1071 section 3's example bytes: sum 0xddf2, checksum 0x220d.
        assert_eq!(internet_checksum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]), 0x220d);
    }

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
}
