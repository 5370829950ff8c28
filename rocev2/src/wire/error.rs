//! The errors of the wire layer: [`WireError`], and [`Header`], which names
//! the header a truncated frame ran out in.

/// Which header a [`WireError::Truncated`] ran out in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Header {
    /// Ethernet II header.
    Ethernet,
    /// 802.1Q tag.
    Vlan,
    /// IPv4 header (or the packet its total length announces).
    Ipv4,
    /// IPv6 header (or the packet its payload length announces).
    Ipv6,
    /// UDP header (or the datagram its length announces).
    Udp,
    /// Base transport header.
    Bth,
    /// The extension headers the opcode calls for.
    ExtHeaders,
    /// The 4-byte ICRC.
    Icrc,
}

/// Why a frame was rejected. Each variant names what is wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The buffer ends before the named header is complete.
    #[error("frame truncated in the {0:?} header")]
    Truncated(Header),
    /// The output buffer is too small for the frame being emitted.
    #[error("output buffer too small")]
    BufferTooSmall,
    /// The EtherType is neither IPv4 nor IPv6.
    #[error("EtherType {ethertype:#06x} is not IPv4/IPv6")]
    NotIp {
        /// The EtherType found.
        ethertype: u16,
    },
    /// The IP version nibble disagrees with the EtherType.
    #[error("IP version {0} disagrees with the EtherType")]
    BadIpVersion(u8),
    /// IPv4 IHL below 5.
    #[error("IPv4 IHL {0} is below 5")]
    BadIhl(u8),
    /// IPv4 total length (or IPv6 payload length) disagrees with the frame.
    #[error("IP length field disagrees with the frame")]
    BadIpLength,
    /// IPv4 header checksum does not verify.
    #[error("IPv4 header checksum is wrong")]
    BadIpv4Checksum,
    /// A fragmented IPv4 packet (RoCEv2 is never fragmented).
    #[error("IPv4 fragment")]
    Fragmented,
    /// The IP protocol / next header is not UDP.
    #[error("IP protocol {protocol} is not UDP")]
    NotUdp {
        /// Protocol number found.
        protocol: u8,
    },
    /// The UDP length disagrees with the IP packet.
    #[error("UDP length disagrees with the IP packet")]
    BadUdpLength,
    /// UDP destination port is not 4791.
    #[error("UDP port {dst_port} is not RoCEv2 (4791)")]
    NotRoce {
        /// Destination port found.
        dst_port: u16,
    },
    /// An opcode urnic does not implement (RD, reserved, vendor).
    #[error("unknown BTH opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// Transport header version is not 0.
    #[error("BTH TVer {0} is not 0")]
    BadTver(u8),
    /// The pad count exceeds the payload area, is non-zero where no payload
    /// is allowed, or payload plus pad is not a multiple of 4 bytes.
    #[error("pad count {pad} does not fit the payload")]
    BadPad {
        /// Pad count from the BTH.
        pad: u8,
    },
    /// Payload bytes after an opcode that carries none.
    #[error("payload after an opcode that carries none")]
    UnexpectedPayload,
    /// The ICRC does not match.
    #[error("ICRC {found:#010x} should be {expected:#010x}")]
    BadIcrc {
        /// What the frame's bytes compute to.
        expected: u32,
        /// What the frame carries.
        found: u32,
    },
    /// A field value cannot be encoded (e.g. payload too large for the IP length field).
    #[error("a length does not fit its header field")]
    FieldOverflow,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_errors_say_what_is_wrong() {
        assert_eq!(WireError::Truncated(Header::Bth).to_string(), "frame truncated in the Bth header");
        assert_eq!(WireError::NotIp { ethertype: 0x806 }.to_string(), "EtherType 0x0806 is not IPv4/IPv6");
        assert_eq!(WireError::UnknownOpcode(0x1f).to_string(), "unknown BTH opcode 0x1f");
        assert_eq!(WireError::BadIcrc { expected: 1, found: 0xdead_beef }.to_string(), "ICRC 0xdeadbeef should be 0x00000001");
        assert_eq!(WireError::NotRoce { dst_port: 53 }.to_string(), "UDP port 53 is not RoCEv2 (4791)");
    }
}
