//! The BTH and the extension transport headers (IBTA Vol 1 9.2, 9.3):
//! DETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH, and the 16
//! reserved bytes of a RoCEv2 CNP.

use super::opcode::HeaderLayout;
use super::packet::{
    AethPacket, AtomicAckEthPacket, AtomicEthPacket, BthPacket, CnpPacket, DethPacket, IethPacket, ImmDtPacket,
    RethPacket,
};
use super::repr::{AckSyndrome, AethRepr, AtomicEthRepr, BthRepr, DethRepr, NakCode, RethRepr, TransportRepr};
use super::{Header, WireError};

/// BTH length.
pub const BTH_LEN: usize = 12;

impl BthRepr {
    /// Parse the 12-byte BTH. The opcode is not checked here (see
    /// [`TransportRepr::parse`]).
    pub fn parse(b: &[u8]) -> Result<BthRepr, WireError> {
        let p = BthPacket::new_checked(b)?;
        Ok(BthRepr {
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
        })
    }

    /// Emit the 12-byte BTH (every bit of it).
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let h = out.get_mut(..BTH_LEN).ok_or(WireError::BufferTooSmall)?;
        let mut p = BthPacket::new_unchecked(h);
        p.set_opcode(self.opcode);
        p.set_solicited(self.solicited);
        p.set_mig_req(self.mig_req);
        p.set_pad_count(self.pad_count);
        p.set_tver(self.tver);
        p.set_pkey(self.pkey);
        p.set_fecn(self.fecn);
        p.set_becn(self.becn);
        p.set_resv6(self.resv6);
        p.set_dest_qp(self.dest_qp);
        p.set_ack_req(self.ack_req);
        p.set_resv7(self.resv7);
        p.set_psn(self.psn);
        Ok(BTH_LEN)
    }
}

impl AckSyndrome {
    /// Decode the AETH syndrome byte (IBTA 9.7.5.1, table 42: bit 7 is
    /// reserved (0); bits 6:5 select ACK 00, RNR NAK 01, reserved 10, NAK 11;
    /// bits 4:0 are the credit count, RNR timer code or NAK code).
    ///
    /// A byte with bit 7 set is `Reserved` (rxe likewise matches the type on
    /// bits 7:5 and treats such a syndrome as unknown), so every byte
    /// round-trips through [`to_byte`](Self::to_byte).
    pub const fn from_byte(s: u8) -> AckSyndrome {
        let low = s & 0x1f;
        if s & 0x80 != 0 {
            return AckSyndrome::Reserved(s);
        }
        match (s >> 5) & 3 {
            0 => AckSyndrome::Ack { credits: low },
            1 => AckSyndrome::RnrNak { timer: low },
            3 => AckSyndrome::Nak(match low {
                0 => NakCode::PsnSequenceError,
                1 => NakCode::InvalidRequest,
                2 => NakCode::RemoteAccessError,
                3 => NakCode::RemoteOperationalError,
                4 => NakCode::InvalidRdRequest,
                n => NakCode::Reserved(n),
            }),
            _ => AckSyndrome::Reserved(s),
        }
    }

    /// Encode into the syndrome byte (bit 7 is reserved, 0).
    pub const fn to_byte(self) -> u8 {
        match self {
            AckSyndrome::Ack { credits } => credits & 0x1f,
            AckSyndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            AckSyndrome::Nak(code) => {
                0x60 | match code {
                    NakCode::PsnSequenceError => 0,
                    NakCode::InvalidRequest => 1,
                    NakCode::RemoteAccessError => 2,
                    NakCode::RemoteOperationalError => 3,
                    NakCode::InvalidRdRequest => 4,
                    NakCode::Reserved(n) => n & 0x1f,
                }
            }
            AckSyndrome::Reserved(s) => s,
        }
    }
}

/// The RNR NAK timer in nanoseconds for a 5-bit code (IBTA 9.7.5.2.8, table 45;
/// code 0 is the longest, 655.36 ms).
pub const fn rnr_timer_nanos(code: u8) -> u64 {
    const US_X100: [u64; 32] = [
        65_536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072,
        4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
    ];
    // table values in units of 10 µs
    US_X100[(code & 0x1f) as usize] * 10_000
}

impl TransportRepr {
    /// Length of the BTH plus the extension headers of `layout`.
    pub const fn header_len(layout: &HeaderLayout) -> usize {
        BTH_LEN + layout.ext_len()
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
        let bth = BthRepr::parse(b)?;
        let layout = bth.opcode.layout().ok_or(WireError::UnknownOpcode(bth.opcode.0))?;
        if bth.tver != 0 {
            return Err(WireError::BadTver(bth.tver));
        }
        let len = Self::header_len(&layout);
        let h = b.get(..len).ok_or(WireError::Truncated(Header::ExtHeaders))?;
        let mut r = TransportRepr::bth_only(bth);
        // `h` holds all `len` bytes, so every view below is complete.
        let at = |off: usize| h.get(off..).unwrap_or(&[]);
        let mut off = BTH_LEN;
        // IBTA 9.3: header order BTH, [RDETH], [DETH], [RETH | AtomicETH],
        // [AETH], [AtomicAckETH], [ImmDt | IETH].
        if layout.deth {
            let d = DethPacket::new_unchecked(at(off));
            r.deth = Some(DethRepr { qkey: d.qkey(), resv8: d.resv8(), src_qp: d.src_qp() });
            off += DethPacket::<&[u8]>::LEN;
        }
        if layout.reth {
            let x = RethPacket::new_unchecked(at(off));
            r.reth = Some(RethRepr { va: x.va(), rkey: x.rkey(), dma_len: x.dma_len() });
            off += RethPacket::<&[u8]>::LEN;
        }
        if layout.atomic_eth {
            let x = AtomicEthPacket::new_unchecked(at(off));
            r.atomic_eth = Some(AtomicEthRepr { va: x.va(), rkey: x.rkey(), swap_add: x.swap_add(), compare: x.compare() });
            off += AtomicEthPacket::<&[u8]>::LEN;
        }
        if layout.aeth {
            let x = AethPacket::new_unchecked(at(off));
            r.aeth = Some(AethRepr { syndrome: x.syndrome(), msn: x.msn() });
            off += AethPacket::<&[u8]>::LEN;
        }
        if layout.atomic_ack_eth {
            r.atomic_ack = Some(AtomicAckEthPacket::new_unchecked(at(off)).orig_remote_data());
            off += AtomicAckEthPacket::<&[u8]>::LEN;
        }
        if layout.immdt {
            r.immediate = Some(ImmDtPacket::new_unchecked(at(off)).immediate());
            off += ImmDtPacket::<&[u8]>::LEN;
        }
        if layout.ieth {
            r.invalidate_rkey = Some(IethPacket::new_unchecked(at(off)).rkey());
            off += IethPacket::<&[u8]>::LEN;
        }
        if layout.cnp_reserved {
            // A17.9.3: reserved, ignored on receipt.
            off += CnpPacket::<&[u8]>::LEN;
        }
        debug_assert_eq!(off, len);
        Ok((r, len))
    }

    /// Emit the BTH and the extension headers the opcode calls for. A header
    /// the opcode needs but the repr lacks is emitted as zeros (an absent
    /// AETH as a plain ACK with credits "invalid", 0x1f); headers the opcode
    /// does not carry are ignored. Returns bytes written.
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let layout = self.bth.opcode.layout().ok_or(WireError::UnknownOpcode(self.bth.opcode.0))?;
        let len = Self::header_len(&layout);
        let h = out.get_mut(..len).ok_or(WireError::BufferTooSmall)?;
        self.bth.emit(h)?;
        let mut off = BTH_LEN;
        // `h` holds all `len` bytes, so every view below is complete.
        fn at(h: &mut [u8], off: usize) -> &mut [u8] {
            h.get_mut(off..).unwrap_or(&mut [])
        }
        if layout.deth {
            let d = self.deth.unwrap_or_default();
            let mut x = DethPacket::new_unchecked(at(h, off));
            x.set_qkey(d.qkey);
            x.set_resv8(d.resv8);
            x.set_src_qp(d.src_qp);
            off += DethPacket::<&[u8]>::LEN;
        }
        if layout.reth {
            let r = self.reth.unwrap_or_default();
            let mut x = RethPacket::new_unchecked(at(h, off));
            x.set_va(r.va);
            x.set_rkey(r.rkey);
            x.set_dma_len(r.dma_len);
            off += RethPacket::<&[u8]>::LEN;
        }
        if layout.atomic_eth {
            let a = self.atomic_eth.unwrap_or_default();
            let mut x = AtomicEthPacket::new_unchecked(at(h, off));
            x.set_va(a.va);
            x.set_rkey(a.rkey);
            x.set_swap_add(a.swap_add);
            x.set_compare(a.compare);
            off += AtomicEthPacket::<&[u8]>::LEN;
        }
        if layout.aeth {
            let a = self.aeth.unwrap_or(AethRepr { syndrome: AckSyndrome::Ack { credits: 0x1f }, msn: 0 });
            let mut x = AethPacket::new_unchecked(at(h, off));
            x.set_syndrome(a.syndrome);
            x.set_msn(a.msn);
            off += AethPacket::<&[u8]>::LEN;
        }
        if layout.atomic_ack_eth {
            AtomicAckEthPacket::new_unchecked(at(h, off)).set_orig_remote_data(self.atomic_ack.unwrap_or(0));
            off += AtomicAckEthPacket::<&[u8]>::LEN;
        }
        if layout.immdt {
            ImmDtPacket::new_unchecked(at(h, off)).set_immediate(self.immediate.unwrap_or(0));
            off += ImmDtPacket::<&[u8]>::LEN;
        }
        if layout.ieth {
            IethPacket::new_unchecked(at(h, off)).set_rkey(self.invalidate_rkey.unwrap_or(0));
            off += IethPacket::<&[u8]>::LEN;
        }
        if layout.cnp_reserved {
            CnpPacket::new_unchecked(at(h, off)).clear_reserved();
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
    fn syndrome_roundtrip_and_values() {
        for b in 0..=255u8 {
            assert_eq!(AckSyndrome::from_byte(b).to_byte(), b, "{b:#x}");
        }
        // fuzz crash-b78e2e37: bit 7 was dropped (0xa4 decoded as RNR NAK timer 4)
        assert_eq!(AckSyndrome::from_byte(0xa4), AckSyndrome::Reserved(0xa4));
        assert_eq!(AckSyndrome::from_byte(0x9f), AckSyndrome::Reserved(0x9f));
        assert_eq!(AckSyndrome::from_byte(0x24), AckSyndrome::RnrNak { timer: 4 });
        assert_eq!(AckSyndrome::from_byte(0x1f), AckSyndrome::Ack { credits: 31 });
        assert_eq!(AckSyndrome::from_byte(0x60), AckSyndrome::Nak(NakCode::PsnSequenceError));
        assert_eq!(AckSyndrome::from_byte(0x62), AckSyndrome::Nak(NakCode::RemoteAccessError));
        assert_eq!(AckSyndrome::from_byte(0x2e), AckSyndrome::RnrNak { timer: 14 });
    }

    #[test]
    fn rnr_timer_table() {
        assert_eq!(rnr_timer_nanos(0), 655_360_000);
        assert_eq!(rnr_timer_nanos(1), 10_000);
        assert_eq!(rnr_timer_nanos(14), 1_280_000);
        assert_eq!(rnr_timer_nanos(31), 491_520_000);
    }

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
}
