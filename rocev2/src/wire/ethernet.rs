//! Ethernet II with at most one 802.1Q tag (IEEE 802.3 / 802.1Q): the
//! [`EthernetFrame`] view, [`EthernetRepr`] with its parse and emit, and the
//! EtherTypes a RoCEv2 frame uses.

use super::error::{Header, WireError};
use super::field::{self, view};

/// A 48-bit Ethernet MAC address.
pub type MacAddr = [u8; 6];

/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// EtherType (TPID) of an 802.1Q tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;
/// Ethernet header length without a tag.
pub const ETHERNET_LEN: usize = 14;
/// Length of an 802.1Q tag (TPID and TCI).
const VLAN_TAG_LEN: usize = 4;

/// An 802.1Q tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct VlanTag {
    /// Priority code point (3 bits).
    pub pcp: u8,
    /// Drop eligible indicator.
    pub dei: bool,
    /// VLAN identifier (12 bits).
    pub vid: u16,
}

impl VlanTag {
    /// The tag a TCI holds (PCP 3 bits, DEI, VID 12 bits).
    const fn from_tci(tci: u16) -> VlanTag {
        VlanTag { pcp: (tci >> 13) as u8, dei: tci & 0x1000 != 0, vid: tci & 0x0fff }
    }
}

/// The fixed part of a received Ethernet header, each byte read once
/// ([`EthernetHead::parse`]): what the frame parse needs before the IP
/// header, where the checked view ([`EthernetFrame`]) tests the TPID again
/// for each of its length, EtherType and tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EthernetHead<'a> {
    /// The first 14 bytes: the addresses, then the TPID or the EtherType.
    pub(crate) bytes: &'a [u8; ETHERNET_LEN],
    /// 14, or 18 with a tag.
    pub(crate) len: usize,
    /// The EtherType after the tag, if any.
    pub(crate) ethertype: u16,
    /// The 802.1Q tag (TPID 0x8100).
    pub(crate) vlan: Option<VlanTag>,
}

impl<'a> EthernetHead<'a> {
    /// The checks and errors of [`EthernetFrame::new_checked`] (14 bytes,
    /// and 4 more after the TPID 0x8100), then the header's fields.
    #[inline(always)]
    pub(crate) fn parse(frame: &'a [u8]) -> Result<EthernetHead<'a>, WireError> {
        let Some(bytes) = frame.first_chunk::<ETHERNET_LEN>() else { return Err(WireError::Truncated(Header::Ethernet)) };
        let tpid = u16::from_be_bytes([bytes[12], bytes[13]]);
        if tpid != ETHERTYPE_VLAN {
            return Ok(EthernetHead { bytes, len: ETHERNET_LEN, ethertype: tpid, vlan: None });
        }
        let Some(t) = frame.first_chunk::<{ ETHERNET_LEN + VLAN_TAG_LEN }>() else { return Err(WireError::Truncated(Header::Vlan)) };
        let vlan = Some(VlanTag::from_tci(u16::from_be_bytes([t[14], t[15]])));
        Ok(EthernetHead { bytes, len: ETHERNET_LEN + VLAN_TAG_LEN, ethertype: u16::from_be_bytes([t[16], t[17]]), vlan })
    }

    /// Destination MAC address.
    #[inline]
    pub(crate) fn dst_addr(&self) -> MacAddr {
        let [a, b, c, d, e, f, ..] = *self.bytes;
        [a, b, c, d, e, f]
    }

    /// Source MAC address.
    #[inline]
    pub(crate) fn src_addr(&self) -> MacAddr {
        let [_, _, _, _, _, _, a, b, c, d, e, f, ..] = *self.bytes;
        [a, b, c, d, e, f]
    }
}

/// Ethernet II header, optionally with one 802.1Q tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EthernetRepr {
    /// Destination MAC.
    pub dst: MacAddr,
    /// Source MAC.
    pub src: MacAddr,
    /// 802.1Q tag, if any (TPID 0x8100).
    pub vlan: Option<VlanTag>,
    /// EtherType of the payload (0x0800 IPv4, 0x86dd IPv6).
    pub ethertype: u16,
}

view! {
    /// A checked view of an Ethernet II frame: destination and source MAC,
    /// an optional 802.1Q tag (TPID 0x8100), the EtherType, the payload.
    EthernetFrame
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// Length of the header without a tag.
    pub const BASE_LEN: usize = ETHERNET_LEN;

    /// The buffer holds the 14-byte header, and the 4 tag bytes when the
    /// TPID at offset 12 is 0x8100.
    pub fn check_len(&self) -> Result<(), WireError> {
        let len = self.buffer.as_ref().len();
        if len < ETHERNET_LEN {
            return Err(WireError::Truncated(Header::Ethernet));
        }
        if self.has_vlan() && len < ETHERNET_LEN + VLAN_TAG_LEN {
            return Err(WireError::Truncated(Header::Vlan));
        }
        Ok(())
    }

    /// Destination MAC address.
    pub fn dst_addr(&self) -> MacAddr {
        field::rd(self.buffer.as_ref(), 0)
    }

    /// Source MAC address.
    pub fn src_addr(&self) -> MacAddr {
        field::rd(self.buffer.as_ref(), 6)
    }

    /// Whether an 802.1Q tag follows the source address.
    pub fn has_vlan(&self) -> bool {
        field::u16_at(self.buffer.as_ref(), 12) == ETHERTYPE_VLAN
    }

    /// The 802.1Q tag (PCP 3 bits, DEI, VID 12 bits), if present.
    pub fn vlan(&self) -> Option<VlanTag> {
        if !self.has_vlan() {
            return None;
        }
        Some(VlanTag::from_tci(field::u16_at(self.buffer.as_ref(), 14)))
    }

    /// Header length: 14, or 18 with a tag.
    pub fn header_len(&self) -> usize {
        if self.has_vlan() {
            ETHERNET_LEN + VLAN_TAG_LEN
        } else {
            ETHERNET_LEN
        }
    }

    /// The EtherType of the payload (after the tag, if any).
    pub fn ethertype(&self) -> u16 {
        field::u16_at(self.buffer.as_ref(), self.header_len() - 2)
    }

    /// Everything after the header.
    pub fn payload(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        field::slice(b, self.header_len(), b.len())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    /// Set the destination MAC address.
    pub fn set_dst_addr(&mut self, a: MacAddr) {
        field::wr(self.bytes_mut(), 0, a);
    }

    /// Set the source MAC address.
    pub fn set_src_addr(&mut self, a: MacAddr) {
        field::wr(self.bytes_mut(), 6, a);
    }

    /// Write an 802.1Q tag (TPID and TCI at offsets 12..16). Set it before
    /// [`set_ethertype`](Self::set_ethertype), which writes after the tag.
    pub fn set_vlan(&mut self, tag: VlanTag) {
        let tci = (u16::from(tag.pcp & 7) << 13) | (u16::from(tag.dei) << 12) | (tag.vid & 0x0fff);
        let b = self.bytes_mut();
        field::set_u16(b, 12, ETHERTYPE_VLAN);
        field::set_u16(b, 14, tci);
    }

    /// Set the EtherType (at offset 12, or 16 after a tag).
    pub fn set_ethertype(&mut self, t: u16) {
        let off = self.header_len() - 2;
        field::set_u16(self.bytes_mut(), off, t);
    }

    /// Everything after the header, mutable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let h = self.header_len();
        let b = self.bytes_mut();
        let len = b.len();
        field::slice_mut(b, h, len)
    }
}

impl EthernetRepr {
    /// Bytes this header takes on the wire.
    pub const fn header_len(&self) -> usize {
        if self.vlan.is_some() {
            ETHERNET_LEN + VLAN_TAG_LEN
        } else {
            ETHERNET_LEN
        }
    }

    /// Parse an Ethernet II header with at most one 802.1Q tag. Returns the
    /// repr and the header length.
    // Inlined into the receive path: returned through memory, the result's
    // narrow stores were read back wider (a store-forwarding stall per frame,
    // most of `Engine::handle_frame`'s perf samples).
    #[inline]
    pub fn parse(b: &[u8]) -> Result<(EthernetRepr, usize), WireError> {
        // The receive path's head parse: the same checks and errors as the
        // checked view (`the_head_parse_agrees_with_the_view`).
        let h = EthernetHead::parse(b)?;
        let repr = EthernetRepr { dst: h.dst_addr(), src: h.src_addr(), vlan: h.vlan, ethertype: h.ethertype };
        Ok((repr, h.len))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tagged_and_untagged() {
        let mut b = [0u8; 20];
        let mut f = EthernetFrame::new_unchecked(&mut b[..]);
        f.set_dst_addr([1, 2, 3, 4, 5, 6]);
        f.set_src_addr([7, 8, 9, 10, 11, 12]);
        f.set_ethertype(0x0800);
        assert!(f.vlan().is_none());
        assert_eq!((f.header_len(), f.ethertype(), f.payload().len()), (14, 0x0800, 6));
        f.set_vlan(VlanTag { pcp: 5, dei: true, vid: 0xabc });
        f.set_ethertype(0x86dd);
        assert_eq!(f.vlan(), Some(VlanTag { pcp: 5, dei: true, vid: 0xabc }));
        assert_eq!((f.header_len(), f.ethertype(), f.payload().len()), (18, 0x86dd, 2));
        assert_eq!(&b[12..18], &[0x81, 0x00, 0xba, 0xbc, 0x86, 0xdd]);
        let f = EthernetFrame::new_checked(&b[..]).unwrap();
        assert_eq!((f.dst_addr(), f.src_addr()), ([1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]));
    }

    #[test]
    fn short_buffers_are_typed_errors_and_reads_never_panic() {
        let mut b = [0u8; 16];
        b[12] = 0x81;
        assert_eq!(EthernetFrame::new_checked(&b[..]), Err(WireError::Truncated(Header::Vlan)));
        assert_eq!(EthernetFrame::new_checked(&b[..13]), Err(WireError::Truncated(Header::Ethernet)));
        let f = EthernetFrame::new_unchecked(&b[..13]);
        assert_eq!((f.ethertype(), f.vlan(), f.payload()), (0, None, &[][..]));
        let mut e: [u8; 0] = [];
        let mut f = EthernetFrame::new_unchecked(&mut e[..]);
        f.set_vlan(VlanTag::default());
        f.set_ethertype(1);
        assert_eq!(f.payload_mut(), &mut [][..]);
    }

    /// The receive path's head parse gives what the checked view gives, and
    /// refuses what it refuses, for every length up to a tagged header and
    /// beyond, tagged or not (and an 802.1ad TPID, which is an EtherType here).
    #[test]
    fn the_head_parse_agrees_with_the_view() {
        for tpid in [[0x08, 0x00], [0x81, 0x00], [0x88, 0xa8], [0x86, 0xdd]] {
            let mut b: Vec<u8> = (1..=24).collect();
            b[12..14].copy_from_slice(&tpid);
            for len in 0..=b.len() {
                let f = &b[..len];
                let head = EthernetHead::parse(f).map(|h| (h.len, h.ethertype, h.vlan, h.dst_addr(), h.src_addr()));
                let view = EthernetFrame::new_checked(f).map(|v| (v.header_len(), v.ethertype(), v.vlan(), v.dst_addr(), v.src_addr()));
                assert_eq!(head, view, "tpid {tpid:02x?} len {len}");
            }
        }
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
}
