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

    /// The IPv4 protocol or the IPv6 next header.
    pub const fn protocol(&self) -> u8 {
        match self {
            IpRepr::V4(v4) => v4.protocol,
            IpRepr::V6(v6) => v6.next_header,
        }
    }
}
