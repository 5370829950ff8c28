//! UDP header (RFC 768).

use super::field;
use super::view;
use crate::wire::ip::UDP_LEN;
use crate::wire::{Header, WireError};

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
}
