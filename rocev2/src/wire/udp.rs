//! UDP (RFC 768): the [`UdpPacket`] view, [`UdpRepr`] with its parse and
//! emit, and the RoCEv2 port.

use super::error::{Header, WireError};
use super::field::{self, view};

/// UDP header length.
pub const UDP_LEN: usize = 8;

/// UDP destination port of RoCEv2 (IANA).
pub const ROCEV2_UDP_PORT: u16 = 4791;

/// UDP header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UdpRepr {
    /// Source port (flow entropy for RoCEv2).
    pub src_port: u16,
    /// Destination port (4791 for RoCEv2).
    pub dst_port: u16,
    /// Length of UDP header + payload.
    pub length: u16,
    /// Checksum as on the wire (RoCEv2 over IPv4 sends 0).
    pub checksum: u16,
}

view! {
    /// A checked view of a UDP datagram.
    UdpPacket
}

impl<T: AsRef<[u8]>> UdpPacket<T> {
    /// The buffer holds the 8-byte header, and the UDP length covers the
    /// header and fits the buffer.
    pub fn check_len(&self) -> Result<(), WireError> {
        let b = self.buffer.as_ref();
        if b.len() < UDP_LEN {
            return Err(WireError::Truncated(Header::Udp));
        }
        let len = usize::from(self.len());
        if len < UDP_LEN || len > b.len() {
            return Err(WireError::BadUdpLength);
        }
        Ok(())
    }

    /// Source port (RoCEv2: flow entropy).
    pub fn src_port(&self) -> u16 {
        field::u16_at(self.buffer.as_ref(), 0)
    }

    /// Destination port (RoCEv2: 4791).
    pub fn dst_port(&self) -> u16 {
        field::u16_at(self.buffer.as_ref(), 2)
    }

    /// Length of header plus payload.
    pub fn len(&self) -> u16 {
        field::u16_at(self.buffer.as_ref(), 4)
    }

    /// Whether the length field says there is no payload.
    pub fn is_empty(&self) -> bool {
        usize::from(self.len()) <= UDP_LEN
    }

    /// Checksum as stored (0 = none, as RoCEv2 over IPv4 sends).
    pub fn checksum(&self) -> u16 {
        field::u16_at(self.buffer.as_ref(), 6)
    }

    /// The payload (up to the UDP length).
    pub fn payload(&self) -> &[u8] {
        field::slice(self.buffer.as_ref(), UDP_LEN, usize::from(self.len()))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> UdpPacket<T> {
    /// Set the source port.
    pub fn set_src_port(&mut self, v: u16) {
        field::set_u16(self.bytes_mut(), 0, v);
    }

    /// Set the destination port.
    pub fn set_dst_port(&mut self, v: u16) {
        field::set_u16(self.bytes_mut(), 2, v);
    }

    /// Set the length field.
    pub fn set_len(&mut self, v: u16) {
        field::set_u16(self.bytes_mut(), 4, v);
    }

    /// Set the checksum field as given.
    pub fn set_checksum(&mut self, v: u16) {
        field::set_u16(self.bytes_mut(), 6, v);
    }

    /// The payload, mutable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = usize::from(self.len());
        field::slice_mut(self.bytes_mut(), UDP_LEN, end)
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

    #[test]
    fn fields_and_errors() {
        let mut b = [0u8; 12];
        let mut u = UdpPacket::new_unchecked(&mut b[..]);
        u.set_src_port(49441);
        u.set_dst_port(4791);
        u.set_len(11);
        u.set_checksum(0xffff);
        u.payload_mut().copy_from_slice(b"abc");
        let u = UdpPacket::new_checked(&b[..]).unwrap();
        assert_eq!((u.src_port(), u.dst_port(), u.len(), u.checksum(), u.payload(), u.is_empty()), (49441, 4791, 11, 0xffff, &b"abc"[..], false));
        assert_eq!(UdpPacket::new_checked(&b[..10]), Err(WireError::BadUdpLength));
        assert_eq!(UdpPacket::new_checked(&b[..7]), Err(WireError::Truncated(Header::Udp)));
        b[5] = 7;
        assert_eq!(UdpPacket::new_checked(&b[..]), Err(WireError::BadUdpLength));
        assert_eq!(UdpPacket::new_unchecked(&b[..1]).payload(), &[][..]);
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
