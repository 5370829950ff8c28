//! Framing: turning transport headers into whole Ethernet frames for a path.

use crate::transport::attr::AddressVector;
use crate::wire::{
    CopyOnly, EthernetRepr, FrameRepr, HeaderTemplate, IpRepr, Ipv4Repr, Ipv6Repr, PayloadFill, TransportRepr, UdpRepr, WireError, ETHERTYPE_IPV4,
    ETHERTYPE_IPV6, IPPROTO_UDP, ROCEV2_UDP_PORT,
};

/// Everything below the BTH for frames sent on one path: built once per QP
/// (or per UD destination) and reused for every packet, as headers and as
/// the bytes every frame starts with ([`HeaderTemplate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathHeaders {
    eth: EthernetRepr,
    ip: IpRepr,
    udp: UdpRepr,
    /// `eth`, `ip` and `udp` emitted; `None` if they cannot be (a repr no
    /// frame can carry: every emit then reports the headers' own error).
    template: Option<HeaderTemplate>,
}

impl PathHeaders {
    /// Headers for frames along `av`, from UDP source port `sport`
    /// (see [`crate::wire::sport`] for the Linux-compatible choice).
    pub fn new(av: &AddressVector, sport: u16) -> PathHeaders {
        let v4 = AddressVector::is_ipv4_mapped(&av.sgid) && AddressVector::is_ipv4_mapped(&av.dgid);
        let eth = EthernetRepr { dst: av.dmac, src: av.smac, vlan: av.vlan, ethertype: if v4 { ETHERTYPE_IPV4 } else { ETHERTYPE_IPV6 } };
        let ip = if v4 {
            let mut src = [0u8; 4];
            let mut dst = [0u8; 4];
            src.copy_from_slice(&av.sgid[12..]);
            dst.copy_from_slice(&av.dgid[12..]);
            IpRepr::V4(Ipv4Repr {
                src,
                dst,
                dscp: av.traffic_class >> 2,
                ecn: av.traffic_class & 3,
                ident: 0,
                dont_frag: true,
                ttl: av.hop_limit,
                protocol: IPPROTO_UDP,
                payload_len: 0,
            })
        } else {
            IpRepr::V6(Ipv6Repr {
                src: av.sgid,
                dst: av.dgid,
                traffic_class: av.traffic_class,
                flow_label: av.flow_label & 0xf_ffff,
                next_header: IPPROTO_UDP,
                hop_limit: av.hop_limit,
                payload_len: 0,
            })
        };
        let udp = UdpRepr { src_port: sport, dst_port: ROCEV2_UDP_PORT, length: 0, checksum: 0 };
        PathHeaders { eth, ip, udp, template: HeaderTemplate::new(&eth, &ip, &udp).ok() }
    }

    /// Set the ECN bits of outgoing frames (0 not-ECT, 2 ECT(0), 1 ECT(1)).
    pub fn set_ecn(&mut self, ecn: u8) {
        match &mut self.ip {
            IpRepr::V4(v4) => v4.ecn = ecn & 3,
            IpRepr::V6(v6) => v6.traffic_class = (v6.traffic_class & !3) | (ecn & 3),
        }
        self.template = HeaderTemplate::new(&self.eth, &self.ip, &self.udp).ok();
    }

    /// Set the IPv4 identification of the next frame (rxe increments it per frame).
    pub fn set_ident(&mut self, ident: u16) {
        if let IpRepr::V4(v4) = &mut self.ip {
            v4.ident = ident;
        }
    }

    /// The frame headers for `transport` along this path.
    pub fn frame(&self, transport: TransportRepr) -> FrameRepr {
        FrameRepr { eth: self.eth, ip: self.ip, udp: self.udp, transport }
    }

    /// Emit a whole frame into `buf`, letting `fill` write the payload in place.
    /// Returns the frame length.
    pub fn emit_with(&self, transport: TransportRepr, payload_len: usize, buf: &mut [u8], fill: impl FnOnce(&mut [u8])) -> Result<usize, WireError> {
        self.emit_with_crc(transport, payload_len, buf, CopyOnly(fill))
    }

    /// [`emit_with`](Self::emit_with) with a `fill` that continues the ICRC
    /// over the payload it writes ([`FrameRepr::emit_with_crc`]), or any
    /// [`PayloadFill`] ([`FrameRepr::emit_filled`]).
    ///
    /// Inlined (every request frame comes through here; out of line, its
    /// arguments and the transport headers passed through memory cost a
    /// frame about 35 instructions); a path without a template takes the
    /// out-of-line field-by-field emit.
    #[inline(always)]
    pub fn emit_with_crc(&self, transport: TransportRepr, payload_len: usize, buf: &mut [u8], fill: impl PayloadFill) -> Result<usize, WireError> {
        match &self.template {
            Some(t) => {
                let ident = match self.ip {
                    IpRepr::V4(v4) => v4.ident,
                    IpRepr::V6(_) => 0,
                };
                t.emit_with_crc(ident, &transport, payload_len, buf, fill)
            }
            None => self.emit_fields(transport, payload_len, buf, fill),
        }
    }

    /// [`emit_with_crc`](Self::emit_with_crc) without a template: every
    /// header field by field ([`FrameRepr::emit_filled`]).
    #[cold]
    #[inline(never)]
    fn emit_fields(&self, transport: TransportRepr, payload_len: usize, buf: &mut [u8], fill: impl PayloadFill) -> Result<usize, WireError> {
        self.frame(transport).emit_filled(payload_len, buf, fill)
    }
}
