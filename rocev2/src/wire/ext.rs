//! The BTH and the extension transport headers (IBTA Vol 1 9.2, 9.3):
//! DETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH, and the 16
//! reserved bytes of a RoCEv2 CNP.

use super::be;
use super::opcode::{HeaderLayout, Opcode};
use super::repr::{AckSyndrome, AethRepr, AtomicEthRepr, BthRepr, DethRepr, NakCode, RethRepr, TransportRepr};
use super::{Header, WireError};
use crate::psn::Psn;

/// BTH length.
pub const BTH_LEN: usize = 12;

impl BthRepr {
    /// Parse the 12-byte BTH. The opcode is not checked here (see
    /// [`TransportRepr::parse`]).
    pub fn parse(b: &[u8]) -> Result<BthRepr, WireError> {
        let h = b.get(..BTH_LEN).ok_or(WireError::Truncated(Header::Bth))?;
        Ok(BthRepr {
            opcode: Opcode(h[0]),
            solicited: h[1] & 0x80 != 0,
            mig_req: h[1] & 0x40 != 0,
            pad_count: (h[1] >> 4) & 3,
            tver: h[1] & 0x0f,
            pkey: u16::from_be_bytes([h[2], h[3]]),
            fecn: h[4] & 0x80 != 0,
            becn: h[4] & 0x40 != 0,
            resv6: h[4] & 0x3f,
            dest_qp: u32::from_be_bytes([0, h[5], h[6], h[7]]),
            ack_req: h[8] & 0x80 != 0,
            resv7: h[8] & 0x7f,
            psn: Psn::new(u32::from_be_bytes([0, h[9], h[10], h[11]])),
        })
    }

    /// Emit the 12-byte BTH.
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let h = out.get_mut(..BTH_LEN).ok_or(WireError::BufferTooSmall)?;
        h[0] = self.opcode.0;
        h[1] = (u8::from(self.solicited) << 7)
            | (u8::from(self.mig_req) << 6)
            | ((self.pad_count & 3) << 4)
            | (self.tver & 0x0f);
        h[2..4].copy_from_slice(&self.pkey.to_be_bytes());
        h[4] = (u8::from(self.fecn) << 7) | (u8::from(self.becn) << 6) | (self.resv6 & 0x3f);
        h[5..8].copy_from_slice(&self.dest_qp.to_be_bytes()[1..]);
        h[8] = (u8::from(self.ack_req) << 7) | (self.resv7 & 0x7f);
        h[9..12].copy_from_slice(&self.psn.value().to_be_bytes()[1..]);
        Ok(BTH_LEN)
    }
}

impl AckSyndrome {
    /// Decode the AETH syndrome byte (IBTA 9.7.5.1, table 42: bits 6:5 select
    /// ACK 00, RNR NAK 01, reserved 10, NAK 11; bits 4:0 are the credit count,
    /// RNR timer code or NAK code).
    pub const fn from_byte(s: u8) -> AckSyndrome {
        let low = s & 0x1f;
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
    pub fn parse(b: &[u8]) -> Result<(TransportRepr, usize), WireError> {
        let bth = BthRepr::parse(b)?;
        let layout = bth.opcode.layout().ok_or(WireError::UnknownOpcode(bth.opcode.0))?;
        if bth.tver != 0 {
            return Err(WireError::BadTver(bth.tver));
        }
        let len = Self::header_len(&layout);
        let h = b.get(..len).ok_or(WireError::Truncated(Header::ExtHeaders))?;
        let t = WireError::Truncated(Header::ExtHeaders);
        let mut r = TransportRepr {
            bth,
            deth: None,
            reth: None,
            atomic_eth: None,
            aeth: None,
            atomic_ack: None,
            immediate: None,
            invalidate_rkey: None,
        };
        let mut off = BTH_LEN;
        // IBTA 9.3: header order BTH, [RDETH], [DETH], [RETH | AtomicETH], [AETH], [AtomicAckETH], [ImmDt | IETH].
        if layout.deth {
            r.deth = Some(DethRepr {
                qkey: be::u32_at(h, off).ok_or(t)?,
                resv8: h[off + 4],
                src_qp: be::u32_at(h, off + 4).ok_or(t)? & 0x00ff_ffff,
            });
            off += 8;
        }
        if layout.reth {
            r.reth = Some(RethRepr {
                va: be::u64_at(h, off).ok_or(t)?,
                rkey: be::u32_at(h, off + 8).ok_or(t)?,
                dma_len: be::u32_at(h, off + 12).ok_or(t)?,
            });
            off += 16;
        }
        if layout.atomic_eth {
            r.atomic_eth = Some(AtomicEthRepr {
                va: be::u64_at(h, off).ok_or(t)?,
                rkey: be::u32_at(h, off + 8).ok_or(t)?,
                swap_add: be::u64_at(h, off + 12).ok_or(t)?,
                compare: be::u64_at(h, off + 20).ok_or(t)?,
            });
            off += 28;
        }
        if layout.aeth {
            let v = be::u32_at(h, off).ok_or(t)?;
            r.aeth = Some(AethRepr { syndrome: AckSyndrome::from_byte((v >> 24) as u8), msn: v & 0x00ff_ffff });
            off += 4;
        }
        if layout.atomic_ack_eth {
            r.atomic_ack = Some(be::u64_at(h, off).ok_or(t)?);
            off += 8;
        }
        if layout.immdt {
            r.immediate = Some(be::u32_at(h, off).ok_or(t)?);
            off += 4;
        }
        if layout.ieth {
            r.invalidate_rkey = Some(be::u32_at(h, off).ok_or(t)?);
            off += 4;
        }
        if layout.cnp_reserved {
            off += 16;
        }
        debug_assert_eq!(off, len);
        Ok((r, len))
    }

    /// Emit the BTH and the extension headers the opcode calls for. A header
    /// the opcode needs but the repr lacks is emitted as zeros; headers the
    /// opcode does not carry are ignored. Returns bytes written.
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let layout = self.bth.opcode.layout().ok_or(WireError::UnknownOpcode(self.bth.opcode.0))?;
        let len = Self::header_len(&layout);
        let h = out.get_mut(..len).ok_or(WireError::BufferTooSmall)?;
        self.bth.emit(h)?;
        let mut off = BTH_LEN;
        if layout.deth {
            let d = self.deth.unwrap_or_default();
            h[off..off + 4].copy_from_slice(&d.qkey.to_be_bytes());
            h[off + 4..off + 8].copy_from_slice(&(d.src_qp & 0x00ff_ffff).to_be_bytes());
            h[off + 4] = d.resv8;
            off += 8;
        }
        if layout.reth {
            let x = self.reth.unwrap_or_default();
            h[off..off + 8].copy_from_slice(&x.va.to_be_bytes());
            h[off + 8..off + 12].copy_from_slice(&x.rkey.to_be_bytes());
            h[off + 12..off + 16].copy_from_slice(&x.dma_len.to_be_bytes());
            off += 16;
        }
        if layout.atomic_eth {
            let x = self.atomic_eth.unwrap_or_default();
            h[off..off + 8].copy_from_slice(&x.va.to_be_bytes());
            h[off + 8..off + 12].copy_from_slice(&x.rkey.to_be_bytes());
            h[off + 12..off + 20].copy_from_slice(&x.swap_add.to_be_bytes());
            h[off + 20..off + 28].copy_from_slice(&x.compare.to_be_bytes());
            off += 28;
        }
        if layout.aeth {
            let a = self.aeth.unwrap_or(AethRepr { syndrome: AckSyndrome::Ack { credits: 0x1f }, msn: 0 });
            let v = (u32::from(a.syndrome.to_byte()) << 24) | (a.msn & 0x00ff_ffff);
            h[off..off + 4].copy_from_slice(&v.to_be_bytes());
            off += 4;
        }
        if layout.atomic_ack_eth {
            h[off..off + 8].copy_from_slice(&self.atomic_ack.unwrap_or(0).to_be_bytes());
            off += 8;
        }
        if layout.immdt {
            h[off..off + 4].copy_from_slice(&self.immediate.unwrap_or(0).to_be_bytes());
            off += 4;
        }
        if layout.ieth {
            h[off..off + 4].copy_from_slice(&self.invalidate_rkey.unwrap_or(0).to_be_bytes());
            off += 4;
        }
        if layout.cnp_reserved {
            h[off..off + 16].fill(0);
        }
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndrome_roundtrip_and_values() {
        for b in 0..=255u8 {
            let s = AckSyndrome::from_byte(b & 0x7f);
            assert_eq!(s.to_byte(), b & 0x7f);
        }
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
