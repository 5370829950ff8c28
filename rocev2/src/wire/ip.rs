//! The IP layer of a RoCEv2 frame, version-independent: [`IpRepr`] (IPv4 or
//! IPv6) and the protocol number of UDP. Each version's view, `Repr`, parse
//! and emit are in [`ipv4`](super::ipv4) and [`ipv6`](super::ipv6).

use super::ipv4::{Ipv4Repr, IPV4_LEN};
use super::ipv6::{Ipv6Repr, IPV6_LEN};

/// IP protocol number (IPv4 protocol, IPv6 next header) of UDP.
pub const IPPROTO_UDP: u8 = 17;

/// IPv4 or IPv6.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IpRepr {
    /// IPv4.
    V4(Ipv4Repr),
    /// IPv6.
    V6(Ipv6Repr),
}

impl IpRepr {
    /// Bytes the header takes when emitted: 20 (IPv4, emitted without
    /// options) or 40 (IPv6).
    pub const fn header_len(&self) -> usize {
        match self {
            IpRepr::V4(_) => IPV4_LEN,
            IpRepr::V6(_) => IPV6_LEN,
        }
    }

    /// The source address as a RoCEv2 GID (IPv4 as `::ffff:a.b.c.d`).
    pub const fn src_gid(&self) -> [u8; 16] {
        match self {
            IpRepr::V4(v4) => ipv4_mapped(v4.src),
            IpRepr::V6(v6) => v6.src,
        }
    }

    /// The destination address as a RoCEv2 GID.
    pub const fn dst_gid(&self) -> [u8; 16] {
        match self {
            IpRepr::V4(v4) => ipv4_mapped(v4.dst),
            IpRepr::V6(v6) => v6.dst,
        }
    }

    /// The IPv4 protocol or the IPv6 next header.
    pub const fn protocol(&self) -> u8 {
        match self {
            IpRepr::V4(v4) => v4.protocol,
            IpRepr::V6(v6) => v6.next_header,
        }
    }
}

/// `::ffff:a.b.c.d`, the GID of an IPv4 address (RoCEv2, IBTA A17.4.5.1).
pub const fn ipv4_mapped(ip: [u8; 4]) -> [u8; 16] {
    [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, ip[0], ip[1], ip[2], ip[3]]
}
