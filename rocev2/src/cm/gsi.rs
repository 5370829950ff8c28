//! CM MADs on the wire: the GSI QP (QP1) packets that carry them on RoCEv2
//! (IBTA 13.5.1, Annex A17: QP1 stays, QP0 does not exist), as Linux rxe
//! sends them (`../pcaps/rping.pcap`): a UD SEND only to QP1 with P_Key
//! 0xFFFF and AckReq set, a DETH with the GSI Q_Key and source QP 1, the
//! 256-byte MAD as payload, from UDP source port `0xC000 + hash_32(1, 14)`.

use super::mad::{GSI_QKEY, GSI_QPN, MAD_LEN};
use crate::wire::{sport, BthRepr, DethRepr, Opcode, TransportRepr};
use crate::Psn;

/// The UDP source port of QP1 packets (Linux `rxe_qp` for UD/GSI: 0xC000 + hash_32(qpn, 14)).
pub const GSI_UDP_SPORT: u16 = sport::ud_sport(GSI_QPN);

/// Why a packet to QP1 is not a MAD for the CM (a counted drop).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GsiError {
    /// QP1 takes UD SEND only (IBTA 13.5.1: MADs are one packet).
    #[error("opcode {0:?} to QP1 (only UD SEND only)")]
    Opcode(Opcode),
    /// The DETH's Q_Key is not the GSI's (IBTA C9-50 ff.: QP1's Q_Key is 0x80010000).
    #[error("Q_Key {0:#010x} is not the GSI Q_Key")]
    QKey(u32),
    /// GSI MADs come from QP1 (IBTA 13.5.1.1: responses go back to the source QP; CM uses QP1).
    #[error("source QP {0:#x} is not QP1")]
    SourceQp(u32),
    /// A MAD is 256 bytes.
    #[error("payload of {0} bytes (a MAD is 256)")]
    Length(usize),
}

/// The transport headers of a QP1 packet with sequence number `psn`.
pub fn transport(psn: Psn) -> TransportRepr {
    let bth = BthRepr {
        opcode: Opcode::UD_SEND_ONLY,
        solicited: false,
        mig_req: false,
        pad_count: 0,
        tver: 0,
        pkey: 0xFFFF,
        fecn: false,
        becn: false,
        resv6: 0,
        dest_qp: GSI_QPN,
        ack_req: true,
        resv7: 0,
        psn,
    };
    TransportRepr { deth: Some(DethRepr { qkey: GSI_QKEY, resv8: 0, src_qp: GSI_QPN }), ..TransportRepr::bth_only(bth) }
}

/// The MAD a packet to QP1 carries, after the GSI's checks.
pub fn mad<'a>(t: &TransportRepr, payload: &'a [u8]) -> Result<&'a [u8], GsiError> {
    if t.bth.opcode != Opcode::UD_SEND_ONLY {
        return Err(GsiError::Opcode(t.bth.opcode));
    }
    let deth = t.deth.ok_or(GsiError::Opcode(t.bth.opcode))?;
    if deth.qkey != GSI_QKEY {
        return Err(GsiError::QKey(deth.qkey));
    }
    if deth.src_qp != GSI_QPN {
        return Err(GsiError::SourceQp(deth.src_qp));
    }
    if payload.len() != MAD_LEN {
        return Err(GsiError::Length(payload.len()));
    }
    Ok(payload)
}
