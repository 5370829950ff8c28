//! The Ethernet, IP and UDP headers of one path as bytes, emitted once and
//! copied into every frame with only the per-frame fields patched.
//!
//! Everything below the BTH of a connected QP's frames is the same from
//! frame to frame but for the lengths (IPv4 total length or IPv6 payload
//! length, UDP length), the IPv4 identification and the IPv4 header
//! checksum. [`FrameRepr::emit_with_crc`](super::FrameRepr::emit_with_crc)
//! writes those headers field by field for every frame (about 120
//! instructions of a 64 B WRITE's frame, callgrind); a [`HeaderTemplate`]
//! copies up to 66 prebuilt bytes and patches four fields, the IPv4
//! checksum from a sum of the fixed words taken once (RFC 1071's sum is
//! associative, RFC 1624: the checksum of a header that differs in a few
//! words follows from a partial sum of the rest). The bytes on the wire are
//! the same (tested against `FrameRepr` for every case below).

use super::bth::BTH_LEN;
use super::error::WireError;
use super::ethernet::EthernetRepr;
use super::frame::{emit_transport_and_icrc, pad_for, PayloadFill};
use super::icrc::ICRC_LEN;
use super::ip::IpRepr;
use super::transport_headers::TransportRepr;
use super::udp::{UdpRepr, UDP_LEN};

/// Longest header run a template holds: Ethernet with an 802.1Q tag (18),
/// IPv6 (40), UDP (8).
const TEMPLATE_MAX: usize = 18 + 40 + UDP_LEN;

/// Prebuilt Ethernet + IP + UDP headers for frames along one path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeaderTemplate {
    /// The headers with zero lengths, identification and checksum.
    bytes: [u8; TEMPLATE_MAX],
    /// Bytes of `bytes` in use (Ethernet + IP + UDP).
    len: u8,
    /// Where the IP header starts.
    l3_at: u8,
    /// IP header length (20 for IPv4, 40 for IPv6).
    ip_len: u8,
    /// The one's-complement sum (RFC 1071, carries not yet folded) of the
    /// IPv4 header's 16-bit words other than total length, identification
    /// and checksum; `None` for IPv6.
    v4_sum: Option<u32>,
}

impl HeaderTemplate {
    /// The template for these headers (their length fields, the IPv4
    /// identification and checksum and the UDP length are ignored: each
    /// frame sets them).
    ///
    /// Errors: what the headers' own `emit` refuses.
    pub fn new(eth: &EthernetRepr, ip: &IpRepr, udp: &UdpRepr) -> Result<HeaderTemplate, WireError> {
        let mut bytes = [0u8; TEMPLATE_MAX];
        let l3_at = eth.emit(&mut bytes)?;
        let ip_len = ip.header_len();
        let mut ip = *ip;
        if let IpRepr::V4(v4) = &mut ip {
            v4.ident = 0;
        }
        match ip {
            IpRepr::V4(v4) => v4.emit(&mut bytes[l3_at..])?,
            IpRepr::V6(v6) => v6.emit(&mut bytes[l3_at..])?,
        };
        UdpRepr { length: 0, ..*udp }.emit(&mut bytes[l3_at + ip_len..])?;
        let v4_sum = match ip {
            IpRepr::V4(_) => {
                let h = &mut bytes[l3_at..l3_at + ip_len];
                // Total length (bytes 2-3) and checksum (10-11) to zero; the
                // identification (4-5) is zero already.
                h[2..4].fill(0);
                h[10..12].fill(0);
                Some(h.chunks_exact(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum())
            }
            IpRepr::V6(_) => None,
        };
        let len = l3_at + ip_len + UDP_LEN;
        // Every length is at most TEMPLATE_MAX (66): the casts cannot truncate.
        Ok(HeaderTemplate { bytes, len: len as u8, l3_at: l3_at as u8, ip_len: ip_len as u8, v4_sum })
    }

    /// Bytes of the frame before the BTH.
    pub fn header_len(&self) -> usize {
        usize::from(self.len)
    }

    /// Emit a whole frame: these headers (IPv4 identification `ident`), then
    /// `transport`, the payload through `fill` (as in
    /// [`FrameRepr::emit_with_crc`](super::FrameRepr::emit_with_crc): it
    /// gets the CRC so far and returns it continued over the payload; or any
    /// [`PayloadFill`], as [`FrameRepr::emit_filled`](super::FrameRepr::emit_filled)), pad
    /// and ICRC. Returns the frame length.
    ///
    /// Errors: `UnknownOpcode`, `UnexpectedPayload` (payload for an opcode
    /// without one), `FieldOverflow`, `BufferTooSmall`.
    ///
    /// Inlined into its callers (the requester's frame, the responder's
    /// ACK): out of line, its six arguments and the transport headers read
    /// back from memory cost a data frame about 30 instructions.
    #[inline(always)]
    pub fn emit_with_crc(
        &self,
        ident: u16,
        transport: &TransportRepr,
        payload_len: usize,
        buf: &mut [u8],
        fill: impl PayloadFill,
    ) -> Result<usize, WireError> {
        let op = transport.bth.opcode;
        // let-else, not `ok_or(..)?`: the latter built the 10-byte `Result` on
        // the stack and read it back across its two stores (a store-forwarding
        // stall on every frame; most of this function's samples in `perf`).
        let Some(shape) = op.shape() else { return Err(WireError::UnknownOpcode(op.0)) };
        if payload_len > 0 && !shape.payload() {
            return Err(WireError::UnexpectedPayload);
        }
        if payload_len > usize::from(u16::MAX) {
            return Err(WireError::FieldOverflow);
        }
        let (l3_at, ip_len) = (usize::from(self.l3_at), usize::from(self.ip_len));
        let udp_len = UDP_LEN + BTH_LEN + shape.ext_len() + payload_len + pad_for(payload_len) + ICRC_LEN;
        let udp_len16 = u16::try_from(udp_len).map_err(|_| WireError::FieldOverflow)?;
        let total = l3_at + ip_len + udp_len;
        let buf = buf.get_mut(..total).ok_or(WireError::BufferTooSmall)?;
        let len = self.header_len();
        if let Some(head) = buf.first_chunk_mut::<TEMPLATE_MAX>() {
            // A frame of at least 66 bytes (every data frame but a BTH-only
            // one with under 8 payload bytes): the whole template in
            // fixed-size moves, not a `memcpy` call of `len` bytes. What lies
            // past `len` (zeros) is still inside the frame, and the transport
            // headers, payload, pad and ICRC written below cover it.
            let (a, b) = head.split_at_mut(32);
            a.copy_from_slice(&self.bytes[..32]);
            b.copy_from_slice(&self.bytes[32..]);
        } else {
            buf[..len].copy_from_slice(&self.bytes[..len]);
        }
        let l3 = &mut buf[l3_at..];
        match self.v4_sum {
            Some(sum) => {
                let ip_total = u16::try_from(ip_len + udp_len).map_err(|_| WireError::FieldOverflow)?;
                l3[2..4].copy_from_slice(&ip_total.to_be_bytes());
                l3[4..6].copy_from_slice(&ident.to_be_bytes());
                // RFC 1071: fold the carries of the whole sum, complement.
                let mut s = sum + u32::from(ip_total) + u32::from(ident);
                while s > 0xffff {
                    s = (s & 0xffff) + (s >> 16);
                }
                l3[10..12].copy_from_slice(&(!(s as u16)).to_be_bytes());
            }
            // IPv6 payload length: everything after the fixed header.
            None => l3[4..6].copy_from_slice(&udp_len16.to_be_bytes()),
        }
        l3[ip_len + 4..ip_len + 6].copy_from_slice(&udp_len16.to_be_bytes());
        emit_transport_and_icrc(transport, l3, ip_len, payload_len, fill)?;
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::psn::Psn;
    use crate::wire::{
        crc, BthRepr, CopyOnly, EthernetRepr, FrameRepr, Ipv4Repr, Ipv6Repr, Opcode, RethRepr, VlanTag, ETHERTYPE_IPV4, ETHERTYPE_IPV6,
    };

    fn paths() -> Vec<(EthernetRepr, IpRepr, UdpRepr)> {
        let mut v = Vec::new();
        for vlan in [None, Some(VlanTag { pcp: 3, dei: false, vid: 100 })] {
            for (ttl, ecn, dscp) in [(64, 0, 0), (1, 2, 26), (255, 3, 63)] {
                let v4 = Ipv4Repr {
                    src: [10, 0, 0, 1],
                    dst: [192, 168, 7, 254],
                    dscp,
                    ecn,
                    ident: 0x1234,
                    dont_frag: true,
                    ttl,
                    protocol: 17,
                    payload_len: 0,
                };
                let eth = EthernetRepr { dst: [2, 0, 0, 0, 0, 2], src: [2, 0, 0, 0, 0, 1], vlan, ethertype: ETHERTYPE_IPV4 };
                v.push((eth, IpRepr::V4(v4), UdpRepr { src_port: 0xc0de, dst_port: 4791, length: 0, checksum: 0 }));
            }
            let v6 = Ipv6Repr {
                src: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
                dst: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 0, 0, 2],
                traffic_class: 0x62,
                flow_label: 0xabcde,
                next_header: 17,
                hop_limit: 64,
                payload_len: 0,
            };
            let eth = EthernetRepr { dst: [2, 0, 0, 0, 0, 2], src: [2, 0, 0, 0, 0, 1], vlan, ethertype: ETHERTYPE_IPV6 };
            v.push((eth, IpRepr::V6(v6), UdpRepr { src_port: 0xffff, dst_port: 4791, length: 0, checksum: 0 }));
        }
        v
    }

    fn transports() -> Vec<TransportRepr> {
        let write = TransportRepr {
            reth: Some(RethRepr { va: 0xdead_beef_0000, rkey: 0x1234, dma_len: 77 }),
            ..TransportRepr::bth_only(BthRepr { ack_req: true, pad_count: 3, ..BthRepr::new(Opcode::RC_WRITE_ONLY, 0x11, Psn::new(5)) })
        };
        let ack = TransportRepr::bth_only(BthRepr::new(Opcode::RC_ACK, 0x22, Psn::new(0xff_ffff)));
        let send = TransportRepr::bth_only(BthRepr { solicited: true, ..BthRepr::new(Opcode::RC_SEND_MIDDLE, 0xabcdef, Psn::new(9)) });
        vec![write, ack, send]
    }

    #[test]
    fn frames_are_byte_for_byte_those_of_frame_repr() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 7 + 3) as u8).collect();
        for (eth, ip, udp) in paths() {
            let t = HeaderTemplate::new(&eth, &ip, &udp).unwrap();
            for transport in transports() {
                let has_payload = transport.bth.opcode.layout().is_some_and(|l| l.payload);
                // 40–72: either side of the one-run ICRC's limit (127 covered bytes).
                let lens: &[usize] = if has_payload { &[0, 1, 2, 3, 4, 40, 51, 52, 64, 71, 72, 1021, 4096] } else { &[0] };
                for &n in lens {
                    for ident in [0u16, 1, 0x7fff, 0xfffe, 0xffff] {
                        let mut ip = ip;
                        if let IpRepr::V4(v4) = &mut ip {
                            v4.ident = ident;
                        }
                        let fill = |d: &mut [u8], c: u32| crc::copy_update(c, &data[..d.len()], d);
                        let mut want = vec![0x5au8; 4300];
                        let wn = FrameRepr { eth, ip, udp, transport }.emit_with_crc(n, &mut want, fill).unwrap();
                        let mut got = vec![0xa5u8; 4300];
                        let gn = t.emit_with_crc(ident, &transport, n, &mut got, fill).unwrap();
                        assert_eq!(gn, wn, "{ip:?} {transport:?} {n}");
                        assert_eq!(got[..gn], want[..wn], "{ip:?} {:?} payload {n} ident {ident}", transport.bth.opcode);
                        assert!(crate::wire::parse_frame(&got[..gn]).is_ok());
                        // A filler that only copies (small frames: one ICRC run over headers and payload).
                        let mut copied = vec![0x3cu8; 4300];
                        let cn = t.emit_with_crc(ident, &transport, n, &mut copied, CopyOnly(|d: &mut [u8]| d.copy_from_slice(&data[..d.len()])));
                        assert_eq!(cn, Ok(wn));
                        assert_eq!(copied[..wn], want[..wn], "{ip:?} {:?} payload {n} ident {ident}, copy only", transport.bth.opcode);
                    }
                }
            }
        }
    }

    #[test]
    fn refuses_what_frame_repr_refuses() {
        let (eth, ip, udp) = paths()[0];
        let t = HeaderTemplate::new(&eth, &ip, &udp).unwrap();
        let ack = TransportRepr::bth_only(BthRepr::new(Opcode::RC_ACK, 1, Psn::new(0)));
        let fill = |_: &mut [u8], c: u32| c;
        assert_eq!(t.emit_with_crc(0, &ack, 1, &mut [0u8; 200], fill), Err(WireError::UnexpectedPayload));
        let unknown = TransportRepr::bth_only(BthRepr::new(Opcode(0x15), 1, Psn::new(0)));
        assert_eq!(t.emit_with_crc(0, &unknown, 0, &mut [0u8; 200], fill), Err(WireError::UnknownOpcode(0x15)));
        let write = transports()[0];
        assert_eq!(t.emit_with_crc(0, &write, 100, &mut [0u8; 120], fill), Err(WireError::BufferTooSmall));
        assert_eq!(t.emit_with_crc(0, &write, 70_000, &mut [0u8; 200], fill), Err(WireError::FieldOverflow));
        // The largest payload whose lengths still fit their fields.
        let mut big = vec![0u8; 66_000];
        assert!(t.emit_with_crc(0, &write, 65_000, &mut big, |d: &mut [u8], c: u32| crc::update(c, d)).is_ok());
        assert_eq!(t.emit_with_crc(0, &write, 65_500, &mut big, fill), Err(WireError::FieldOverflow));
    }
}
