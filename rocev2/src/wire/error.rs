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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WireError {
    /// The buffer ends before the named header is complete.
    Truncated(Header),
    /// The output buffer is too small for the frame being emitted.
    BufferTooSmall,
    /// The EtherType is neither IPv4 nor IPv6.
    NotIp {
        /// The EtherType found.
        ethertype: u16,
    },
    /// The IP version nibble disagrees with the EtherType.
    BadIpVersion(u8),
    /// IPv4 IHL below 5.
    BadIhl(u8),
    /// IPv4 total length (or IPv6 payload length) disagrees with the frame.
    BadIpLength,
    /// IPv4 header checksum does not verify.
    BadIpv4Checksum,
    /// A fragmented IPv4 packet (RoCEv2 is never fragmented).
    Fragmented,
    /// The IP protocol / next header is not UDP.
    NotUdp {
        /// Protocol number found.
        protocol: u8,
    },
    /// The UDP length disagrees with the IP packet.
    BadUdpLength,
    /// UDP destination port is not 4791.
    NotRoce {
        /// Destination port found.
        dst_port: u16,
    },
    /// An opcode urnic does not implement (RD, reserved, vendor).
    UnknownOpcode(u8),
    /// Transport header version is not 0.
    BadTver(u8),
    /// The pad count exceeds the payload area, is non-zero where no payload
    /// is allowed, or payload plus pad is not a multiple of 4 bytes.
    BadPad {
        /// Pad count from the BTH.
        pad: u8,
    },
    /// Payload bytes after an opcode that carries none.
    UnexpectedPayload,
    /// The ICRC does not match.
    BadIcrc {
        /// What the frame's bytes compute to.
        expected: u32,
        /// What the frame carries.
        found: u32,
    },
    /// A field value cannot be encoded (e.g. payload too large for the IP length field).
    FieldOverflow,
}

impl core::fmt::Display for WireError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            WireError::Truncated(h) => write!(f, "frame truncated in the {h:?} header"),
            WireError::BufferTooSmall => write!(f, "output buffer too small"),
            WireError::NotIp { ethertype } => write!(f, "EtherType {ethertype:#06x} is not IPv4/IPv6"),
            WireError::BadIpVersion(v) => write!(f, "IP version {v} disagrees with the EtherType"),
            WireError::BadIhl(i) => write!(f, "IPv4 IHL {i} is below 5"),
            WireError::BadIpLength => write!(f, "IP length field disagrees with the frame"),
            WireError::BadIpv4Checksum => write!(f, "IPv4 header checksum is wrong"),
            WireError::Fragmented => write!(f, "IPv4 fragment"),
            WireError::NotUdp { protocol } => write!(f, "IP protocol {protocol} is not UDP"),
            WireError::BadUdpLength => write!(f, "UDP length disagrees with the IP packet"),
            WireError::NotRoce { dst_port } => write!(f, "UDP port {dst_port} is not RoCEv2 (4791)"),
            WireError::UnknownOpcode(o) => write!(f, "unknown BTH opcode {o:#04x}"),
            WireError::BadTver(t) => write!(f, "BTH TVer {t} is not 0"),
            WireError::BadPad { pad } => write!(f, "pad count {pad} does not fit the payload"),
            WireError::UnexpectedPayload => write!(f, "payload after an opcode that carries none"),
            WireError::BadIcrc { expected, found } => write!(f, "ICRC {found:#010x} should be {expected:#010x}"),
            WireError::FieldOverflow => write!(f, "a length does not fit its header field"),
        }
    }
}

impl std::error::Error for WireError {}
