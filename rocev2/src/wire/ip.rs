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

    /// Whether the source and destination addresses are the GIDs `src` and
    /// `dst` (IPv4 as `::ffff:a.b.c.d`), compared in place: what
    /// `src_gid() == *src && dst_gid() == *dst` says, without building the
    /// two GIDs (a check made on every received frame).
    pub fn is_between(&self, src: &[u8; 16], dst: &[u8; 16]) -> bool {
        match self {
            IpRepr::V4(v4) => {
                // IBTA A17.4.5.1: the RoCEv2 GID of an IPv4 address.
                let (sp, sa) = src.split_at(12);
                let (dp, da) = dst.split_at(12);
                sa == v4.src && da == v4.dst && sp == IPV4_MAPPED_PREFIX && dp == IPV4_MAPPED_PREFIX
            }
            IpRepr::V6(v6) => v6.src == *src && v6.dst == *dst,
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

/// The first 12 bytes of an IPv4-mapped GID (`::ffff:0:0/96`).
const IPV4_MAPPED_PREFIX: [u8; 12] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];

/// `::ffff:a.b.c.d`, the GID of an IPv4 address (RoCEv2, IBTA A17.4.5.1).
pub const fn ipv4_mapped(ip: [u8; 4]) -> [u8; 16] {
    [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, ip[0], ip[1], ip[2], ip[3]]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A GID from a small alphabet (so prefixes and addresses collide often):
    /// IPv4-mapped, or 16 free bytes.
    fn gid() -> impl Strategy<Value = [u8; 16]> {
        (any::<[u8; 16]>(), any::<bool>()).prop_map(|(b, mapped)| {
            let g = b.map(|x| [0, 0xff, 1, 10][usize::from(x % 4)]);
            if mapped {
                ipv4_mapped([g[12], g[13], g[14], g[15]])
            } else {
                g
            }
        })
    }

    fn v4(src: [u8; 4], dst: [u8; 4]) -> IpRepr {
        IpRepr::V4(Ipv4Repr { src, dst, dscp: 0, ecn: 0, ident: 0, dont_frag: true, ttl: 64, protocol: IPPROTO_UDP, payload_len: 0 })
    }

    fn v6(src: [u8; 16], dst: [u8; 16]) -> IpRepr {
        IpRepr::V6(Ipv6Repr { src, dst, traffic_class: 0, flow_label: 0, next_header: IPPROTO_UDP, hop_limit: 64, payload_len: 0 })
    }

    /// `g` with byte `i` set to `v`, if a change is given.
    fn tweak(mut g: [u8; 16], change: Option<(usize, u8)>) -> [u8; 16] {
        if let Some((i, v)) = change {
            g[i] = v;
        }
        g
    }

    proptest! {
        /// `is_between` says what comparing the built GIDs says, for IPv4 and
        /// IPv6 headers, against their own GIDs with at most one byte changed
        /// in each (the mapped prefix among them) and against unrelated GIDs.
        #[test]
        fn is_between_is_the_gid_comparison(
            a in gid(),
            b in gid(),
            c in gid(),
            d in gid(),
            unrelated in any::<bool>(),
            cs in proptest::option::of((0..16usize, any::<u8>())),
            ds in proptest::option::of((0..16usize, any::<u8>())),
        ) {
            for ip in [v4([a[12], a[13], a[14], a[15]], [b[12], b[13], b[14], b[15]]), v6(a, b)] {
                let (src, dst) = if unrelated { (c, d) } else { (tweak(ip.src_gid(), cs), tweak(ip.dst_gid(), ds)) };
                prop_assert_eq!(ip.is_between(&src, &dst), ip.src_gid() == src && ip.dst_gid() == dst);
            }
        }
    }
}
