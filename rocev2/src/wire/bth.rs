//! Base Transport Header (IBTA Vol 1 9.2; FECN/BECN in byte 4 per RoCEv2
//! annex A17.9.3): the [`BthPacket`] view and [`BthRepr`] with its parse and emit.
//!
//! ```text
//! byte 0      opcode
//! byte 1      SE(7) MigReq(6) PadCnt(5:4) TVer(3:0)
//! bytes 2-3   P_Key
//! byte 4      FECN(7) BECN(6) resv6(5:0)   (the IBA "resv8a" byte)
//! bytes 5-7   DestQP
//! byte 8      AckReq(7) resv7(6:0)
//! bytes 9-11  PSN
//! ```

use super::error::{Header, WireError};
use super::field::{self, view};
use super::opcode::Opcode;
use crate::psn::Psn;

/// BTH length.
pub const BTH_LEN: usize = 12;

/// Base Transport Header (IBTA 9.2, 12 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BthRepr {
    /// Operation code.
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    /// Migration request (ConnectX-3 Pro sets it; receivers ignore it).
    pub mig_req: bool,
    /// Pad count (0..=3): bytes added to make the payload a multiple of 4.
    pub pad_count: u8,
    /// Transport header version (0).
    pub tver: u8,
    /// Partition key (0xffff default).
    pub pkey: u16,
    /// Forward ECN (not used by RoCEv2; carried for re-emission).
    pub fecn: bool,
    /// Backward ECN (set in CNPs).
    pub becn: bool,
    /// The 6 reserved bits of byte 8 (kept so captured frames re-emit identically).
    pub resv6: u8,
    /// Destination QP number (24 bits).
    pub dest_qp: u32,
    /// Acknowledge request.
    pub ack_req: bool,
    /// The 7 reserved bits of byte 8 (kept for re-emission).
    pub resv7: u8,
    /// Packet sequence number.
    pub psn: Psn,
}

view! {
    /// A checked view of a BTH followed by the rest of the transport packet.
    BthPacket
}

impl<T: AsRef<[u8]>> BthPacket<T> {
    /// The buffer holds the 12-byte BTH. (Whether the opcode is known and
    /// TVer is 0 are checked by [`TransportRepr::parse`](crate::wire::TransportRepr::parse).)
    pub fn check_len(&self) -> Result<(), WireError> {
        if self.buffer.as_ref().len() < BTH_LEN {
            return Err(WireError::Truncated(Header::Bth));
        }
        Ok(())
    }

    fn byte(&self, off: usize) -> u8 {
        field::u8_at(self.buffer.as_ref(), off)
    }

    /// Operation code (any byte; unknown ones have no layout).
    pub fn opcode(&self) -> Opcode {
        Opcode(self.byte(0))
    }

    /// Solicited event.
    pub fn solicited(&self) -> bool {
        self.byte(1) & 0x80 != 0
    }

    /// Migration request (receivers ignore it: ConnectX-3 Pro sets it, rxe does not).
    pub fn mig_req(&self) -> bool {
        self.byte(1) & 0x40 != 0
    }

    /// Pad count (0..=3).
    pub fn pad_count(&self) -> u8 {
        (self.byte(1) >> 4) & 3
    }

    /// Transport header version (IBTA 9.2: 0).
    pub fn tver(&self) -> u8 {
        self.byte(1) & 0x0f
    }

    /// Partition key.
    pub fn pkey(&self) -> u16 {
        field::u16_at(self.buffer.as_ref(), 2)
    }

    /// Forward ECN.
    pub fn fecn(&self) -> bool {
        self.byte(4) & 0x80 != 0
    }

    /// Backward ECN (set in CNPs).
    pub fn becn(&self) -> bool {
        self.byte(4) & 0x40 != 0
    }

    /// The 6 reserved bits of byte 4.
    pub fn resv6(&self) -> u8 {
        self.byte(4) & 0x3f
    }

    /// Destination QP number (24 bits).
    pub fn dest_qp(&self) -> u32 {
        field::u24_at(self.buffer.as_ref(), 5)
    }

    /// Acknowledge request.
    pub fn ack_req(&self) -> bool {
        self.byte(8) & 0x80 != 0
    }

    /// The 7 reserved bits of byte 8.
    pub fn resv7(&self) -> u8 {
        self.byte(8) & 0x7f
    }

    /// Packet sequence number.
    pub fn psn(&self) -> Psn {
        Psn::new(field::u24_at(self.buffer.as_ref(), 9))
    }

    /// Everything after the BTH (extension headers, payload, pad, ICRC).
    pub fn payload(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        field::slice(b, BTH_LEN, b.len())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> BthPacket<T> {
    /// Set the opcode.
    pub fn set_opcode(&mut self, op: Opcode) {
        field::set_u8(self.bytes_mut(), 0, op.0);
    }

    /// Set the solicited-event bit.
    pub fn set_solicited(&mut self, v: bool) {
        field::set_bits(self.bytes_mut(), 1, 0x80, u8::from(v) << 7);
    }

    /// Set the MigReq bit.
    pub fn set_mig_req(&mut self, v: bool) {
        field::set_bits(self.bytes_mut(), 1, 0x40, u8::from(v) << 6);
    }

    /// Set the pad count (2 bits).
    pub fn set_pad_count(&mut self, v: u8) {
        field::set_bits(self.bytes_mut(), 1, 0x30, v << 4);
    }

    /// Set TVer (4 bits).
    pub fn set_tver(&mut self, v: u8) {
        field::set_bits(self.bytes_mut(), 1, 0x0f, v);
    }

    /// Set the P_Key.
    pub fn set_pkey(&mut self, v: u16) {
        field::set_u16(self.bytes_mut(), 2, v);
    }

    /// Set FECN.
    pub fn set_fecn(&mut self, v: bool) {
        field::set_bits(self.bytes_mut(), 4, 0x80, u8::from(v) << 7);
    }

    /// Set BECN.
    pub fn set_becn(&mut self, v: bool) {
        field::set_bits(self.bytes_mut(), 4, 0x40, u8::from(v) << 6);
    }

    /// Set the 6 reserved bits of byte 4.
    pub fn set_resv6(&mut self, v: u8) {
        field::set_bits(self.bytes_mut(), 4, 0x3f, v);
    }

    /// Set DestQP (low 24 bits).
    pub fn set_dest_qp(&mut self, qpn: u32) {
        field::set_u24(self.bytes_mut(), 5, qpn);
    }

    /// Set AckReq.
    pub fn set_ack_req(&mut self, v: bool) {
        field::set_bits(self.bytes_mut(), 8, 0x80, u8::from(v) << 7);
    }

    /// Set the 7 reserved bits of byte 8.
    pub fn set_resv7(&mut self, v: u8) {
        field::set_bits(self.bytes_mut(), 8, 0x7f, v);
    }

    /// Set the PSN.
    pub fn set_psn(&mut self, psn: Psn) {
        field::set_u24(self.bytes_mut(), 9, psn.value());
    }

    /// Everything after the BTH, mutable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let b = self.bytes_mut();
        let len = b.len();
        field::slice_mut(b, BTH_LEN, len)
    }
}

impl BthRepr {
    /// A BTH for `opcode` to `dest_qp` at `psn` with everything else at its
    /// usual value: the default P_Key 0xffff, transport version 0, no pad,
    /// no flags (solicited, MigReq, FECN, BECN, AckReq), reserved bits zero.
    /// Set the rest with struct update syntax.
    pub const fn new(opcode: Opcode, dest_qp: u32, psn: Psn) -> BthRepr {
        BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            resv6: 0,
            dest_qp,
            ack_req: false,
            resv7: 0,
            psn,
        }
    }

    /// Parse the 12-byte BTH. The opcode is not checked here (see
    /// [`TransportRepr::parse`](crate::wire::TransportRepr::parse)).
    #[inline]
    pub fn parse(b: &[u8]) -> Result<BthRepr, WireError> {
        let Some(h) = b.first_chunk::<BTH_LEN>() else { return Err(WireError::Truncated(Header::Bth)) };
        Ok(BthRepr::from_bytes(h))
    }

    /// The fields of a whole BTH, read from its 12 bytes at once: the same
    /// values as [`BthPacket`]'s accessors, one bounds check instead of one
    /// per field (every received frame has one).
    #[inline(always)]
    pub(crate) fn from_bytes(h: &[u8; BTH_LEN]) -> BthRepr {
        // IBTA 9.2, figure 124: OpCode | SE M PadCnt TVer | P_Key |
        // F B Resv6 | DestQP (24 bits) | A Resv7 | PSN (24 bits).
        let [opcode, flags1, pkey_hi, pkey_lo, flags4, q0, q1, q2, flags8, p0, p1, p2] = *h;
        BthRepr {
            opcode: Opcode(opcode),
            solicited: flags1 & 0x80 != 0,
            mig_req: flags1 & 0x40 != 0,
            pad_count: (flags1 >> 4) & 3,
            tver: flags1 & 0x0f,
            pkey: u16::from_be_bytes([pkey_hi, pkey_lo]),
            fecn: flags4 & 0x80 != 0,
            becn: flags4 & 0x40 != 0,
            resv6: flags4 & 0x3f,
            dest_qp: u32::from_be_bytes([0, q0, q1, q2]),
            ack_req: flags8 & 0x80 != 0,
            resv7: flags8 & 0x7f,
            psn: Psn::new(u32::from_be_bytes([0, p0, p1, p2])),
        }
    }

    /// Emit the 12-byte BTH (every bit of it): the same bytes as
    /// [`BthPacket`]'s setters, one per field, would write, assembled as
    /// three big-endian words and stored at once (every data frame emits one;
    /// the setters' read-modify-write of each byte cost about 40 instructions).
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        self.emit_with_pad(out, self.pad_count)
    }

    /// [`emit`](Self::emit) with `pad_count` in place of the repr's (its
    /// low two bits, as [`BthPacket::set_pad_count`] masks it): the frame
    /// builder's pad, which the payload's length decides (IBTA 9.2), written
    /// with the rest of byte 1 rather than over it afterwards.
    #[inline(always)]
    pub(crate) fn emit_with_pad(&self, out: &mut [u8], pad_count: u8) -> Result<usize, WireError> {
        let h = out.get_mut(..BTH_LEN).ok_or(WireError::BufferTooSmall)?;
        // IBTA 9.2, figure 124: OpCode | SE M PadCnt TVer | P_Key.
        let flags1 = (u8::from(self.solicited) << 7) | (u8::from(self.mig_req) << 6) | ((pad_count << 4) & 0x30) | (self.tver & 0x0f);
        let w0 = (u32::from(self.opcode.0) << 24) | (u32::from(flags1) << 16) | u32::from(self.pkey);
        // F B Resv6 | DestQP (24 bits).
        let flags4 = (u8::from(self.fecn) << 7) | (u8::from(self.becn) << 6) | (self.resv6 & 0x3f);
        let w1 = (u32::from(flags4) << 24) | (self.dest_qp & 0x00ff_ffff);
        // A Resv7 | PSN (24 bits).
        let flags8 = (u8::from(self.ack_req) << 7) | (self.resv7 & 0x7f);
        // (A `Psn` holds 24 bits.)
        let w2 = (u32::from(flags8) << 24) | self.psn.value();
        h[0..4].copy_from_slice(&w0.to_be_bytes());
        h[4..8].copy_from_slice(&w1.to_be_bytes());
        h[8..12].copy_from_slice(&w2.to_be_bytes());
        Ok(BTH_LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::test_noise::XorShift;

    /// `BthRepr::emit` writes what the setters, field by field, write into
    /// a buffer of any former content, for field values in and out of
    /// their ranges (the setters mask them).
    #[test]
    fn emit_equals_the_setters() {
        let mut rng = XorShift::new(0x9e37_79b9_7f4a_7c15);
        let mut next = || rng.next_u64();
        for i in 0..2000 {
            let r = next();
            let q = next();
            let bth = BthRepr {
                opcode: Opcode(r as u8),
                solicited: r & 0x100 != 0,
                mig_req: r & 0x200 != 0,
                pad_count: (r >> 10) as u8,
                tver: (r >> 18) as u8,
                pkey: (r >> 26) as u16,
                fecn: r & (1 << 42) != 0,
                becn: r & (1 << 43) != 0,
                resv6: (r >> 44) as u8,
                dest_qp: q as u32,
                ack_req: q & (1 << 32) != 0,
                resv7: (q >> 33) as u8,
                psn: Psn::new((q >> 41) as u32),
            };
            let former = if i % 2 == 0 { 0x00 } else { 0xff };
            let mut by_setters = [former; 13];
            let mut p = BthPacket::new_unchecked(&mut by_setters[..]);
            p.set_opcode(bth.opcode);
            p.set_solicited(bth.solicited);
            p.set_mig_req(bth.mig_req);
            p.set_pad_count(bth.pad_count);
            p.set_tver(bth.tver);
            p.set_pkey(bth.pkey);
            p.set_fecn(bth.fecn);
            p.set_becn(bth.becn);
            p.set_resv6(bth.resv6);
            p.set_dest_qp(bth.dest_qp);
            p.set_ack_req(bth.ack_req);
            p.set_resv7(bth.resv7);
            p.set_psn(bth.psn);
            let mut emitted = [former ^ 0x5a; 13];
            assert_eq!(bth.emit(&mut emitted), Ok(BTH_LEN));
            assert_eq!(emitted[..BTH_LEN], by_setters[..BTH_LEN], "{bth:?}");
            assert_eq!(emitted[BTH_LEN], former ^ 0x5a, "nothing written past the BTH");
            // The frame builder's form: the pad given (any byte, as the
            // setter masks it) equals the BTH emitted, then its pad set.
            let pad = (q >> 24) as u8;
            let mut padded = [former ^ 0x5a; 13];
            assert_eq!(bth.emit_with_pad(&mut padded, pad), Ok(BTH_LEN));
            BthPacket::new_unchecked(&mut emitted[..]).set_pad_count(pad);
            assert_eq!(padded, emitted, "{bth:?} pad {pad}");
        }
        assert_eq!(BthRepr::new(Opcode::RC_ACK, 1, Psn::new(2)).emit(&mut [0u8; 11]), Err(WireError::BufferTooSmall));
    }

    /// `BthRepr::parse` (all 12 bytes at once) reads every field as the
    /// view's accessors, one by one, do, for any bytes; and a short buffer
    /// is refused as the view refuses it.
    #[test]
    fn parse_equals_the_accessors() {
        let mut rng = XorShift::new(0x2545_f491_4f6c_dd1d);
        for i in 0..4000 {
            let mut b = [0u8; 16];
            rng.fill(&mut b);
            if i < 24 {
                // every bit of the flag bytes alone
                b = [0; 16];
                b[[1, 4, 8][i / 8]] = 1 << (i % 8);
            }
            let p = BthPacket::new_checked(&b[..]).unwrap();
            let by_accessors = BthRepr {
                opcode: p.opcode(),
                solicited: p.solicited(),
                mig_req: p.mig_req(),
                pad_count: p.pad_count(),
                tver: p.tver(),
                pkey: p.pkey(),
                fecn: p.fecn(),
                becn: p.becn(),
                resv6: p.resv6(),
                dest_qp: p.dest_qp(),
                ack_req: p.ack_req(),
                resv7: p.resv7(),
                psn: p.psn(),
            };
            assert_eq!(BthRepr::parse(&b[..BTH_LEN + i % 5]), Ok(by_accessors), "{b:02x?}");
        }
        for len in 0..BTH_LEN {
            assert_eq!(BthRepr::parse(&[0xff; 16][..len]), Err(WireError::Truncated(Header::Bth)));
            assert_eq!(BthPacket::new_checked(&[0xff; 16][..len]).err(), Some(WireError::Truncated(Header::Bth)));
        }
    }

    #[test]
    fn every_field_in_its_bits() {
        let mut b = [0u8; 14];
        let mut p = BthPacket::new_unchecked(&mut b[..]);
        p.set_opcode(Opcode::CNP);
        p.set_solicited(true);
        p.set_mig_req(true);
        p.set_pad_count(3);
        p.set_tver(0);
        p.set_pkey(0xffff);
        p.set_fecn(false);
        p.set_becn(true);
        p.set_resv6(0x15);
        p.set_dest_qp(0x12_3456);
        p.set_ack_req(true);
        p.set_resv7(0x2a);
        p.set_psn(Psn::new(0xab_cdef));
        p.payload_mut().copy_from_slice(&[9, 9]);
        assert_eq!(b, [0x81, 0xf0, 0xff, 0xff, 0x55, 0x12, 0x34, 0x56, 0xaa, 0xab, 0xcd, 0xef, 9, 9]);
        let p = BthPacket::new_checked(&b[..]).unwrap();
        assert_eq!((p.opcode(), p.solicited(), p.mig_req(), p.pad_count(), p.tver(), p.pkey()), (Opcode::CNP, true, true, 3, 0, 0xffff));
        assert_eq!((p.fecn(), p.becn(), p.resv6(), p.dest_qp(), p.ack_req(), p.resv7()), (false, true, 0x15, 0x12_3456, true, 0x2a));
        assert_eq!((p.psn(), p.payload()), (Psn::new(0xab_cdef), &[9u8, 9][..]));
        assert_eq!(BthPacket::new_checked(&b[..11]), Err(WireError::Truncated(Header::Bth)));
        assert_eq!(BthPacket::new_unchecked(&b[..6]).dest_qp(), 0);
    }

    #[test]
    fn repr_roundtrip_keeps_every_bit() {
        let r = BthRepr {
            solicited: true,
            mig_req: true,
            pad_count: 2,
            fecn: true,
            resv6: 0x2a,
            resv7: 0x55,
            ..BthRepr::new(Opcode::RC_SEND_LAST, 0xab_cdef, Psn::new(0x12_3456))
        };
        let mut b = [0u8; BTH_LEN];
        assert_eq!(r.emit(&mut b), Ok(BTH_LEN));
        assert_eq!(BthRepr::parse(&b), Ok(r));
        assert_eq!(r.emit(&mut b[..11]), Err(WireError::BufferTooSmall));
        assert_eq!(BthRepr::parse(&b[..11]), Err(WireError::Truncated(Header::Bth)));
    }

    #[test]
    fn any_header_parses_and_reemits_bit_for_bit() {
        let mut rng = XorShift::new(0x2545_f491);
        for _ in 0..2000 {
            let mut b = [0u8; BTH_LEN];
            rng.fill(&mut b);
            let r = BthRepr::parse(&b).unwrap();
            let mut out = [0u8; BTH_LEN];
            assert_eq!(r.emit(&mut out), Ok(BTH_LEN));
            assert_eq!(out, b, "{r:?}");
        }
    }
}
