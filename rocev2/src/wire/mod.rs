//! RoCEv2 wire formats, smoltcp style: per protocol, one file holds the
//! checked byte view, the `Repr` and its parse and emit; ICRC, UDP source
//! ports and whole frames are built on them. Everything public is
//! re-exported here, so users write `rocev2::wire::EthernetRepr`.
//!
//! Layout of a RoCEv2 frame (IBTA Vol 1 Annex A17, "RoCEv2"):
//! Ethernet [802.1Q] / IPv4 or IPv6 / UDP (dst 4791) / BTH / extension
//! headers / payload / pad (0..=3) / ICRC (4 bytes, LSB first).
//!
//! Files, lowest first (each uses only those above it): `error`, `field`
//! (the `view!` macro and field accessors), `opcode`, `crc`; `ethernet`,
//! `ipv4`, `ipv6`, `ip` (IPv4 or IPv6), `udp`, `bth`, `ext` (the extension
//! headers); `transport_headers` (BTH + extension headers of one packet),
//! `icrc`; `frame` (whole frames); `view` ([`FrameView`]); `sport`.

mod bth;
pub mod crc;
mod crc_short;
mod error;
mod ethernet;
mod ext;
mod field;
pub mod frame;
pub mod icrc;
mod ip;
mod ipv4;
mod ipv6;
pub mod opcode;
pub mod sport;
mod template;
#[cfg(test)]
mod test_noise;
mod transport_headers;
mod udp;
pub mod view;

pub use bth::{BthPacket, BthRepr, BTH_LEN};
pub use error::{Header, WireError};
pub use ethernet::{EthernetFrame, EthernetRepr, MacAddr, VlanTag, ETHERNET_LEN, ETHERTYPE_IPV4, ETHERTYPE_IPV6, ETHERTYPE_VLAN};
pub use ext::{
    rnr_timer_nanos, AckSyndrome, AethPacket, AethRepr, AtomicAckEthPacket, AtomicEthPacket, AtomicEthRepr, CnpPacket, DethPacket, DethRepr,
    IethPacket, ImmDtPacket, NakCode, RethPacket, RethRepr,
};
pub use frame::{
    pad_for, parse_frame, parse_frame_deferring, parse_frame_with, parse_l3, peek_dest_qpn, peek_opcode, CopyOnly, FrameRepr, IcrcCheck, ParsedFrame,
    ParsedL3, PayloadFill,
};
pub use icrc::ICRC_LEN;
pub use ip::{ipv4_mapped, IpRepr, IPPROTO_UDP};
pub use ipv4::{internet_checksum, Ipv4Packet, Ipv4Repr, IPV4_LEN};
pub use ipv6::{Ipv6Packet, Ipv6Repr, IPV6_LEN};
pub use opcode::{HeaderLayout, Opcode, OpcodeShape, Segment, Service};
pub use template::HeaderTemplate;
pub use transport_headers::TransportRepr;
pub use udp::{UdpPacket, UdpRepr, ROCEV2_UDP_PORT, UDP_LEN};
pub use view::FrameView;
