//! A checked, zero-copy view over a whole RoCEv2 frame (smoltcp style): the
//! structure is validated once by [`FrameView::new_checked`], after which the
//! accessors read (and, for mutable buffers, write) fields in place without
//! copying or re-parsing. Used where a frame is inspected or patched on the
//! hot path (ECN marking, dispatch by DestQP) rather than fully parsed.

use super::bth::BthPacket;
use super::error::WireError;
use super::field;
use super::frame::parse_frame;
use super::icrc::ICRC_LEN;
use super::ip::IpRepr;
use super::ipv4::Ipv4Packet;
use super::ipv6::{Ipv6Packet, IPV6_LEN};
use super::opcode::Opcode;
use super::udp::UDP_LEN;
use crate::psn::Psn;

/// A validated RoCEv2 frame; `T` is `&[u8]`, `&mut [u8]`, `Vec<u8>`, ...
#[derive(Debug, Clone)]
pub struct FrameView<T: AsRef<[u8]>> {
    buffer: T,
    ip: usize,
    ipv4: bool,
    bth: usize,
    payload: usize,
    payload_len: usize,
    end: usize,
}

impl<T: AsRef<[u8]>> FrameView<T> {
    /// Validate `buffer` as a RoCEv2 frame (every check of
    /// [`parse_frame`], ICRC included) and remember where
    /// its parts are.
    pub fn new_checked(buffer: T) -> Result<FrameView<T>, WireError> {
        let (ip, ipv4, bth, payload, payload_len, end) = {
            let b = buffer.as_ref();
            let p = parse_frame(b)?;
            let ip = p.repr.eth.header_len();
            let ipv4 = matches!(p.repr.ip, IpRepr::V4(_));
            let l3 = b.get(ip..).unwrap_or(&[]);
            let ip_len = if ipv4 { Ipv4Packet::new_unchecked(l3).header_len() } else { IPV6_LEN };
            let bth = ip + ip_len + UDP_LEN;
            let payload = p.payload.as_ptr() as usize - b.as_ptr() as usize;
            let udp_len = usize::from(p.repr.udp.length);
            (ip, ipv4, bth, payload, p.payload.len(), ip + ip_len + udp_len)
        };
        Ok(FrameView { buffer, ip, ipv4, bth, payload, payload_len, end })
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    fn bth_view(&self) -> BthPacket<&[u8]> {
        BthPacket::new_unchecked(self.b().get(self.bth..).unwrap_or(&[]))
    }

    /// The BTH opcode.
    pub fn opcode(&self) -> Opcode {
        self.bth_view().opcode()
    }

    /// The destination QP number.
    pub fn dest_qp(&self) -> u32 {
        self.bth_view().dest_qp()
    }

    /// The PSN.
    pub fn psn(&self) -> Psn {
        self.bth_view().psn()
    }

    /// The IP ECN bits (0 not-ECT, 1 ECT(1), 2 ECT(0), 3 CE).
    pub fn ecn(&self) -> u8 {
        let ip = self.b().get(self.ip..).unwrap_or(&[]);
        if self.ipv4 {
            Ipv4Packet::new_unchecked(ip).ecn()
        } else {
            Ipv6Packet::new_unchecked(ip).ecn()
        }
    }

    /// The payload (no pad, no ICRC).
    pub fn payload(&self) -> &[u8] {
        field::slice(self.b(), self.payload, self.payload + self.payload_len)
    }

    /// The ICRC as stored.
    pub fn icrc(&self) -> u32 {
        u32::from_le_bytes(field::rd(self.b(), self.end - ICRC_LEN))
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> FrameView<T> {
    /// Set the ECN bits, fixing the IPv4 header checksum. The ICRC does not
    /// cover them (they are masked), so the frame stays valid.
    pub fn set_ecn(&mut self, ecn: u8) {
        let (ip, ipv4) = (self.ip, self.ipv4);
        let b = self.buffer.as_mut().get_mut(ip..).unwrap_or(&mut []);
        if ipv4 {
            let mut p = Ipv4Packet::new_unchecked(b);
            p.set_ecn(ecn);
            p.fill_checksum();
        } else {
            Ipv6Packet::new_unchecked(b).set_ecn(ecn);
        }
    }

    /// Mark the frame Congestion Experienced as an ECN-capable switch does
    /// (RFC 3168 section 5): an ECT(0) or ECT(1) frame becomes CE, through
    /// [`set_ecn`](Self::set_ecn) (IPv4 header checksum fixed, ICRC still
    /// valid); a not-ECT frame is not marked and a CE frame stays as it is.
    /// Returns whether the frame was changed.
    pub fn mark_ce(&mut self) -> bool {
        if !matches!(self.ecn(), 1 | 2) {
            return false;
        }
        self.set_ecn(3);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::*;

    #[test]
    fn view_reads_and_marks_in_place() {
        let repr = FrameRepr {
            eth: EthernetRepr { dst: [2; 6], src: [4; 6], vlan: Some(VlanTag { pcp: 3, dei: false, vid: 7 }), ethertype: 0x0800 },
            ip: IpRepr::V4(Ipv4Repr {
                src: [1, 2, 3, 4],
                dst: [5, 6, 7, 8],
                dscp: 26,
                ecn: 2,
                ident: 9,
                dont_frag: true,
                ttl: 64,
                protocol: 17,
                payload_len: 0,
            }),
            udp: UdpRepr { src_port: 50000, dst_port: ROCEV2_UDP_PORT, length: 0, checksum: 0 },
            transport: TransportRepr::bth_only(BthRepr { ack_req: true, ..BthRepr::new(Opcode::RC_SEND_ONLY, 0xabcdef, Psn::new(0x123456)) }),
        };
        let mut buf = vec![0u8; 256];
        let n = repr.emit(b"hello", &mut buf).unwrap();
        buf.truncate(n);
        let mut v = FrameView::new_checked(buf).unwrap();
        assert_eq!((v.opcode(), v.dest_qp(), v.psn(), v.ecn(), v.payload()), (Opcode::RC_SEND_ONLY, 0xabcdef, Psn::new(0x123456), 2, &b"hello"[..]));
        v.set_ecn(3);
        assert_eq!(v.ecn(), 3);
        let again = FrameView::new_checked(v.into_inner()).expect("still valid: checksum fixed, ICRC masks ECN");
        assert_eq!(again.ecn(), 3);
        assert!(FrameView::new_checked(&[0u8; 10][..]).is_err());
    }

    fn frame(v6: bool, vlan: bool, ecn: u8) -> Vec<u8> {
        let ip = if v6 {
            IpRepr::V6(Ipv6Repr {
                src: [1; 16],
                dst: [2; 16],
                traffic_class: (26 << 2) | ecn,
                flow_label: 0xabcde,
                next_header: IPPROTO_UDP,
                hop_limit: 64,
                payload_len: 0,
            })
        } else {
            IpRepr::V4(Ipv4Repr {
                src: [1, 2, 3, 4],
                dst: [5, 6, 7, 8],
                dscp: 26,
                ecn,
                ident: 9,
                dont_frag: true,
                ttl: 64,
                protocol: IPPROTO_UDP,
                payload_len: 0,
            })
        };
        let repr = FrameRepr {
            eth: EthernetRepr {
                dst: [2; 6],
                src: [4; 6],
                vlan: vlan.then_some(VlanTag { pcp: 3, dei: false, vid: 7 }),
                ethertype: if v6 { ETHERTYPE_IPV6 } else { ETHERTYPE_IPV4 },
            },
            ip,
            udp: UdpRepr { src_port: 50000, dst_port: ROCEV2_UDP_PORT, length: 0, checksum: 0 },
            transport: TransportRepr::bth_only(BthRepr::new(Opcode::RC_SEND_ONLY, 0x11, Psn::new(7))),
        };
        let mut buf = vec![0u8; 256];
        let n = repr.emit(b"data", &mut buf).unwrap();
        buf.truncate(n);
        buf
    }

    /// IPv4 and IPv6, tagged or not, every ECN value: only ECT frames are
    /// marked, only the ECN bits (and the IPv4 checksum) change, and the
    /// frame stays valid.
    #[test]
    fn mark_ce_marks_only_ect_and_keeps_the_frame_valid() {
        for v6 in [false, true] {
            for vlan in [false, true] {
                for ecn in 0..4u8 {
                    let before = frame(v6, vlan, ecn);
                    let mut v = FrameView::new_checked(before.clone()).unwrap();
                    let marked = v.mark_ce();
                    let case = format!("v6 {v6} vlan {vlan} ecn {ecn}");
                    assert_eq!(marked, ecn == 1 || ecn == 2, "{case}");
                    let after = v.into_inner();
                    let p = parse_frame(&after).unwrap_or_else(|e| panic!("{case}: {e}"));
                    let want = if marked { 3 } else { ecn };
                    let got = match p.repr.ip {
                        IpRepr::V4(v4) => v4.ecn,
                        IpRepr::V6(v6) => v6.traffic_class & 3,
                    };
                    assert_eq!(got, want, "{case}");
                    let l3 = if vlan { 18 } else { 14 };
                    let may_change: &[usize] = if v6 { &[l3 + 1] } else { &[l3 + 1, l3 + 10, l3 + 11] };
                    for (i, (a, b)) in before.iter().zip(&after).enumerate() {
                        assert!(a == b || may_change.contains(&i), "{case}: byte {i} changed");
                    }
                }
            }
        }
    }

    /// The IPv4 checksum is recomputed over the whole header, options included.
    #[test]
    fn mark_ce_fixes_the_checksum_of_an_ipv4_header_with_options() {
        let plain = frame(false, false, 2);
        let mut f = plain[..34].to_vec();
        f.extend_from_slice(&[1, 1, 1, 0]); // NOP NOP NOP EOL
        f.extend_from_slice(&plain[34..]);
        {
            let mut ip = Ipv4Packet::new_unchecked(&mut f[14..]);
            ip.set_version_and_header_len(24);
            let total = ip.total_len();
            ip.set_total_len(total + 4);
            ip.fill_checksum();
        }
        icrc::fill_frame(&mut f).unwrap();
        let mut v = FrameView::new_checked(&mut f[..]).unwrap();
        assert_eq!(v.payload(), b"data");
        assert!(v.mark_ce());
        assert_eq!(v.ecn(), 3);
        let ip = Ipv4Packet::new_checked(&f[14..]).unwrap();
        assert_eq!((ip.header_len(), ip.ecn(), ip.verify_checksum()), (24, 3, true));
        assert_eq!(parse_frame(&f).map(|p| p.payload), Ok(&b"data"[..]));
    }
}
