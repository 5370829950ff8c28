//! A checked, zero-copy view over a whole RoCEv2 frame (smoltcp style): the
//! structure is validated once by [`FrameView::new_checked`], after which the
//! accessors read (and, for mutable buffers, write) fields in place without
//! copying or re-parsing. Used where a frame is inspected or patched on the
//! hot path (ECN marking, dispatch by DestQP) rather than fully parsed.

use super::frame::{parse_frame, ICRC_LEN};
use super::opcode::Opcode;
use super::packet::{field, BthPacket, Ipv4Packet, Ipv6Packet};
use super::WireError;
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
            let ipv4 = matches!(p.repr.ip, super::IpRepr::V4(_));
            let ip_len = if ipv4 { usize::from(b[ip] & 0x0f) * 4 } else { 40 };
            let bth = ip + ip_len + 8;
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::*;

    #[test]
    fn view_reads_and_marks_in_place() {
        let repr = FrameRepr {
            eth: EthernetRepr { dst: [2; 6], src: [4; 6], vlan: Some(VlanTag { pcp: 3, dei: false, vid: 7 }), ethertype: 0x0800 },
            ip: IpRepr::V4(Ipv4Repr { src: [1, 2, 3, 4], dst: [5, 6, 7, 8], dscp: 26, ecn: 2, ident: 9, dont_frag: true, ttl: 64, protocol: 17, payload_len: 0 }),
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
}
