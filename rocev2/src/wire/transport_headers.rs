//! All transport headers of one packet: [`TransportRepr`], the BTH and the
//! extension headers its opcode calls for (IBTA Vol 1 9.2, 9.3), parsed and
//! emitted in wire order. Each header's own view, `Repr`, parse and emit are
//! in [`bth`](super::bth) and [`ext`](super::ext).

use super::bth::{BthRepr, BTH_LEN};
use super::error::{Header, WireError};
use super::ext::{
    AckSyndrome, AethPacket, AethRepr, AtomicAckEthPacket, AtomicEthPacket, AtomicEthRepr, CnpPacket, DethPacket, DethRepr, IethPacket, ImmDtPacket,
    RethPacket, RethRepr,
};
use super::opcode::Opcode;

/// All transport headers of one packet: the BTH and its extension headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TransportRepr {
    /// Base transport header.
    pub bth: BthRepr,
    /// DETH (UD).
    pub deth: Option<DethRepr>,
    /// RETH (WRITE first/only, READ request).
    pub reth: Option<RethRepr>,
    /// AtomicETH (CMP_SWAP, FETCH_ADD).
    pub atomic_eth: Option<AtomicEthRepr>,
    /// AETH (ACKs and READ responses).
    pub aeth: Option<AethRepr>,
    /// AtomicAckETH: the original remote value.
    pub atomic_ack: Option<u64>,
    /// ImmDt: immediate data, as on the wire (big-endian value).
    pub immediate: Option<u32>,
    /// IETH: R_Key to invalidate.
    pub invalidate_rkey: Option<u32>,
}

impl TransportRepr {
    /// A BTH with no extension headers (SEND/WRITE MIDDLE, CNP, and the
    /// start that parsing fills in).
    pub const fn bth_only(bth: BthRepr) -> TransportRepr {
        TransportRepr { bth, deth: None, reth: None, atomic_eth: None, aeth: None, atomic_ack: None, immediate: None, invalidate_rkey: None }
    }

    /// Parse the BTH and the extension headers its opcode calls for.
    /// Returns the repr and the number of bytes the headers took.
    ///
    /// A CNP's 16 reserved bytes are ignored (A17.9.3) and [`emit`](Self::emit)
    /// writes zeros, so a received CNP with non-zero reserved bytes re-emits
    /// differently (with the same repr).
    ///
    /// Errors: `Truncated(Bth)`, `UnknownOpcode` (IBTA 9.2: reserved, RD and
    /// manufacturer opcodes are not handled by urnic), `BadTver` (IBTA 9.2:
    /// the transport header version is 0), `Truncated(ExtHeaders)`.
    pub fn parse(b: &[u8]) -> Result<(TransportRepr, usize), WireError> {
        let mut r = TransportRepr::bth_only(BthRepr::new(super::opcode::Opcode(0), 0, crate::psn::Psn::new(0)));
        let len = r.parse_into(b)?;
        Ok((r, len))
    }

    /// [`parse`](Self::parse) into `self`, for a caller that parses into a
    /// structure of its own rather than moving a returned one (the receive
    /// path: the headers are written once, where they are used). Every
    /// field is overwritten (the extension headers the opcode does not carry
    /// with `None`); after an error `self` holds whatever was parsed
    /// before it. Returns the number of bytes the headers took.
    pub fn parse_into(&mut self, b: &[u8]) -> Result<usize, WireError> {
        self.parse_into_inline::<false>(b)
    }

    /// [`parse_into`](Self::parse_into), inlined into the frame parse: a
    /// frame without extension headers (a SEND or WRITE middle, most of a
    /// long message's frames) is parsed without a call, its headers written
    /// once where the frame's placeholder is (the placeholder's stores, the
    /// `Result` through memory and the call's saved registers were about 40
    /// instructions a frame); the extension headers are parsed out of line
    /// ([`parse_ext`](Self::parse_ext)).
    ///
    /// `FRESH`: `self`'s extension headers are all `None` already (the frame
    /// parse's placeholder, made for this frame), so they are not written
    /// again (seven stores a frame).
    #[inline(always)]
    pub(crate) fn parse_into_inline<const FRESH: bool>(&mut self, b: &[u8]) -> Result<usize, WireError> {
        // The checks of `BthRepr::parse` and then of the opcode and TVer on
        // the bytes, so that the BTH is built once, in place (parsed into a
        // local first, it was stored in pieces and read back in wider
        // loads across them: a store-forwarding stall per frame).
        let Some(bth) = b.first_chunk::<BTH_LEN>() else { return Err(WireError::Truncated(Header::Bth)) };
        // let-else: see `HeaderTemplate::emit_with_crc` (no `Result` through the stack).
        let Some(shape) = Opcode(bth[0]).shape() else { return Err(WireError::UnknownOpcode(bth[0])) };
        // IBTA 9.2: TVer (the low nibble of byte 1) is 0.
        let tver = bth[1] & 0x0f;
        if tver != 0 {
            return Err(WireError::BadTver(tver));
        }
        let len = BTH_LEN + shape.ext_len();
        let h = b.get(..len).ok_or(WireError::Truncated(Header::ExtHeaders))?;
        self.bth = BthRepr::from_bytes(bth);
        if FRESH {
            debug_assert_eq!(*self, TransportRepr::bth_only(self.bth), "a fresh repr has no extension header");
        } else {
            self.deth = None;
            self.reth = None;
            self.atomic_eth = None;
            self.aeth = None;
            self.atomic_ack = None;
            self.immediate = None;
            self.invalidate_rkey = None;
        }
        if len == BTH_LEN {
            // No extension header: none of the eight tests of `parse_ext`.
            return Ok(len);
        }
        self.parse_ext(h)?;
        Ok(len)
    }

    /// The extension headers of `self.bth`'s opcode (known, with extension
    /// headers), from `h`: the BTH and all of them (`parse_into` checked
    /// the length). Every one the opcode does not carry is already `None`.
    #[inline(never)]
    fn parse_ext(&mut self, h: &[u8]) -> Result<(), WireError> {
        // Known (its shape is), so it has a layout.
        let layout = self.bth.opcode.layout().unwrap_or_default();
        // `h` holds all the headers, so every header below is complete.
        let at = |off: usize| h.get(off..).unwrap_or(&[]);
        let mut off = BTH_LEN;
        // IBTA 9.3: header order BTH, [RDETH], [DETH], [RETH | AtomicETH],
        // [AETH], [AtomicAckETH], [ImmDt | IETH].
        if layout.deth {
            self.deth = Some(DethRepr::parse(at(off))?);
            off += DethPacket::<&[u8]>::LEN;
        }
        if layout.reth {
            self.reth = Some(RethRepr::parse(at(off))?);
            off += RethPacket::<&[u8]>::LEN;
        }
        if layout.atomic_eth {
            self.atomic_eth = Some(AtomicEthRepr::parse(at(off))?);
            off += AtomicEthPacket::<&[u8]>::LEN;
        }
        if layout.aeth {
            self.aeth = Some(AethRepr::parse(at(off))?);
            off += AethPacket::<&[u8]>::LEN;
        }
        if layout.atomic_ack_eth {
            self.atomic_ack = Some(AtomicAckEthPacket::new_checked(at(off))?.orig_remote_data());
            off += AtomicAckEthPacket::<&[u8]>::LEN;
        }
        if layout.immdt {
            self.immediate = Some(ImmDtPacket::new_checked(at(off))?.immediate());
            off += ImmDtPacket::<&[u8]>::LEN;
        }
        if layout.ieth {
            self.invalidate_rkey = Some(IethPacket::new_checked(at(off))?.rkey());
            off += IethPacket::<&[u8]>::LEN;
        }
        if layout.cnp_reserved {
            // A17.9.3: reserved, ignored on receipt.
            off += CnpPacket::<&[u8]>::LEN;
        }
        debug_assert_eq!(off, h.len());
        Ok(())
    }

    /// Emit the BTH and the extension headers the opcode calls for. A header
    /// the opcode needs but the repr lacks is emitted as zeros (an absent
    /// AETH as a plain ACK with credits "invalid", 0x1f); headers the opcode
    /// does not carry are ignored. Returns bytes written.
    ///
    /// Inlined: a frame without extension headers (a SEND/WRITE middle, an
    /// ACK) writes its BTH without a call of its own (out of line, its
    /// saved registers and the `Result` through memory cost such a frame
    /// about 20 instructions); the extension headers are out of line.
    #[inline]
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        self.emit_with_pad(out, self.bth.pad_count)
    }

    /// [`emit`](Self::emit) with the BTH's pad count `pad_count` in place of
    /// the repr's: a frame's builder knows its pad from the payload's length.
    /// Always inlined: a frame's builder (`emit_transport_and_icrc`, inlined
    /// into the requester and the responder's ACK) then writes the BTH from
    /// the repr it has just made, its constant fields folded.
    #[inline(always)]
    pub(crate) fn emit_with_pad(&self, out: &mut [u8], pad_count: u8) -> Result<usize, WireError> {
        let Some(shape) = self.bth.opcode.shape() else { return Err(WireError::UnknownOpcode(self.bth.opcode.0)) };
        let len = BTH_LEN + shape.ext_len();
        let h = out.get_mut(..len).ok_or(WireError::BufferTooSmall)?;
        let off = self.bth.emit_with_pad(h, pad_count)?;
        if len == BTH_LEN {
            // No extension header: none of the eight tests of `emit_ext`.
            return Ok(len);
        }
        self.emit_ext(h, off)
    }

    /// The extension headers of [`emit`](Self::emit) into `h` (exactly the
    /// BTH and the headers the opcode calls for), from `off` (after the
    /// BTH); returns `h`'s length.
    #[inline(never)]
    fn emit_ext(&self, h: &mut [u8], mut off: usize) -> Result<usize, WireError> {
        let len = h.len();
        // Known (its shape is), so it has a layout.
        let layout = self.bth.opcode.layout().unwrap_or_default();
        // `h` holds all `len` bytes, so every header below fits.
        fn at(h: &mut [u8], off: usize) -> &mut [u8] {
            h.get_mut(off..).unwrap_or(&mut [])
        }
        if layout.deth {
            off += self.deth.unwrap_or_default().emit(at(h, off))?;
        }
        if layout.reth {
            off += self.reth.unwrap_or_default().emit(at(h, off))?;
        }
        if layout.atomic_eth {
            off += self.atomic_eth.unwrap_or_default().emit(at(h, off))?;
        }
        if layout.aeth {
            let a = self.aeth.unwrap_or(AethRepr { syndrome: AckSyndrome::Ack { credits: 0x1f }, msn: 0 });
            off += a.emit(at(h, off))?;
        }
        if layout.atomic_ack_eth {
            AtomicAckEthPacket::new_checked(at(h, off))?.set_orig_remote_data(self.atomic_ack.unwrap_or(0));
            off += AtomicAckEthPacket::<&[u8]>::LEN;
        }
        if layout.immdt {
            ImmDtPacket::new_checked(at(h, off))?.set_immediate(self.immediate.unwrap_or(0));
            off += ImmDtPacket::<&[u8]>::LEN;
        }
        if layout.ieth {
            IethPacket::new_checked(at(h, off))?.set_rkey(self.invalidate_rkey.unwrap_or(0));
            off += IethPacket::<&[u8]>::LEN;
        }
        if layout.cnp_reserved {
            CnpPacket::new_checked(at(h, off))?.clear_reserved();
            off += CnpPacket::<&[u8]>::LEN;
        }
        debug_assert_eq!(off, len);
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Opcode;

    #[test]
    fn unknown_opcode_and_truncation() {
        let mut b = [0u8; 40];
        b[0] = 0x15;
        assert_eq!(TransportRepr::parse(&b), Err(WireError::UnknownOpcode(0x15)));
        b[0] = Opcode::RC_CMP_SWAP.0;
        assert_eq!(TransportRepr::parse(&b[..30]), Err(WireError::Truncated(Header::ExtHeaders)));
        b[1] = 1;
        assert_eq!(TransportRepr::parse(&b), Err(WireError::BadTver(1)));
        assert_eq!(TransportRepr::parse(&b[..5]), Err(WireError::Truncated(Header::Bth)));
    }

    /// A repr parsed into again (the receive path reuses one) keeps nothing
    /// of the frame before: a frame without extension headers after one
    /// with every kind, each emitted and parsed back byte for byte.
    #[test]
    fn parse_into_overwrites_every_header() {
        let bth = |op| BthRepr::new(op, 0x12, crate::psn::Psn::new(77));
        let mut full = TransportRepr::bth_only(bth(Opcode::RC_WRITE_ONLY_IMM));
        full.reth = Some(RethRepr { va: 0x1122_3344_5566_7788, rkey: 0x99aa_bbcc, dma_len: 4096 });
        full.immediate = Some(0xdead_beef);
        let middle = TransportRepr::bth_only(bth(Opcode::RC_WRITE_MIDDLE));
        let mut ud = TransportRepr::bth_only(bth(Opcode::UD_SEND_ONLY_IMM));
        ud.deth = Some(DethRepr { qkey: 0x1234_5678, resv8: 0, src_qp: 0x42 });
        ud.immediate = Some(7);
        let mut into = full;
        for want in [full, middle, ud, middle, full] {
            let mut b = [0u8; 64];
            let n = want.emit(&mut b).unwrap();
            assert_eq!(n, BTH_LEN + want.bth.opcode.shape().unwrap().ext_len());
            assert_eq!(into.parse_into(&b[..n]), Ok(n));
            assert_eq!(into, want);
            assert_eq!(TransportRepr::parse(&b[..n]), Ok((want, n)));
        }
    }
}
