//! The common MAD header (IBTA Vol 1 13.4.3) as Communication Management uses
//! it: every CM message is one 256-byte MAD, carried as the payload of a UD
//! SEND-only packet from QP1 to QP1 (IBTA 12.11, 13.5.1; RoCEv2 keeps QP1).

use super::error::MadError;

/// Size of every CM MAD (IBTA 13.4.2: MADs are exactly 256 bytes).
pub const MAD_LEN: usize = 256;
/// Size of the common MAD header.
pub const MAD_HEADER_LEN: usize = 24;
/// Bytes of CM message data after the common header.
pub const CM_DATA_LEN: usize = MAD_LEN - MAD_HEADER_LEN;

/// `BaseVersion` of every MAD (IBTA 13.4.3).
pub const MAD_BASE_VERSION: u8 = 1;
/// `MgmtClass` of Communication Management (IBTA Table 140).
pub const MGMT_CLASS_CM: u8 = 0x07;
/// `ClassVersion` of the CM class that rdma-core and Linux speak (IBTA 12.6.1: 2).
pub const CM_CLASS_VERSION: u8 = 2;
/// `Method` Send (IBTA Table 142): every CM message is sent with it.
pub const METHOD_SEND: u8 = 0x03;

/// The GSI QP's Q_Key (IBTA 9.6.1.1.1: "well-known Q_Key 0x8001_0000").
pub const GSI_QKEY: u32 = 0x8001_0000;
/// The GSI QP number.
pub const GSI_QPN: u32 = 1;

/// The common MAD header fields CM uses (the rest must be as CM sends them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MadHeader {
    /// `Status` (0 for every CM message Linux and rxe send).
    pub status: u16,
    /// `ClassSpecific`.
    pub class_specific: u16,
    /// `TransactionID`: a response (REP, RTU, REJ, MRA to a REQ; DREP to a
    /// DREQ; SIDR_REP) echoes the request's (IBTA 13.4.6.4).
    pub tid: u64,
    /// `AttributeID`: which CM message this is.
    pub attr_id: u16,
    /// `AttributeModifier`.
    pub attr_mod: u32,
}

impl MadHeader {
    /// Parse the header of the 256-byte `mad` and check it is a CM Send MAD
    /// of class version 2 (IBTA 13.4.3; other classes belong to other agents).
    pub fn parse(mad: &[u8]) -> Result<MadHeader, MadError> {
        if mad.len() != MAD_LEN {
            return Err(MadError::Length(mad.len()));
        }
        if mad[0] != MAD_BASE_VERSION {
            return Err(MadError::BaseVersion(mad[0]));
        }
        if mad[1] != MGMT_CLASS_CM {
            return Err(MadError::Class(mad[1]));
        }
        if mad[2] != CM_CLASS_VERSION {
            return Err(MadError::ClassVersion(mad[2]));
        }
        if mad[3] != METHOD_SEND {
            return Err(MadError::Method(mad[3]));
        }
        Ok(MadHeader { status: be16(mad, 4), class_specific: be16(mad, 6), tid: be64(mad, 8), attr_id: be16(mad, 16), attr_mod: be32(mad, 20) })
    }

    /// Write the header into the first [`MAD_HEADER_LEN`] bytes of `mad`.
    pub fn emit(&self, mad: &mut [u8; MAD_LEN]) {
        mad[0] = MAD_BASE_VERSION;
        mad[1] = MGMT_CLASS_CM;
        mad[2] = CM_CLASS_VERSION;
        mad[3] = METHOD_SEND;
        mad[4..6].copy_from_slice(&self.status.to_be_bytes());
        mad[6..8].copy_from_slice(&self.class_specific.to_be_bytes());
        mad[8..16].copy_from_slice(&self.tid.to_be_bytes());
        mad[16..18].copy_from_slice(&self.attr_id.to_be_bytes());
        mad[18..20].fill(0);
        mad[20..24].copy_from_slice(&self.attr_mod.to_be_bytes());
    }
}

// Fixed-offset big-endian reads; callers index inside a checked 256-byte MAD
// or a fixed-size message area, so the offsets are always in range.
pub(super) fn be16(b: &[u8], off: usize) -> u16 {
    u16::from_be_bytes([b[off], b[off + 1]])
}
pub(super) fn be24(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes([0, b[off], b[off + 1], b[off + 2]])
}
pub(super) fn be32(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}
pub(super) fn be64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_be_bytes(a)
}
pub(super) fn put16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_be_bytes());
}
/// The low 24 bits of `v`.
pub(super) fn put24(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}
pub(super) fn put32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_be_bytes());
}
pub(super) fn put64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> MadHeader {
        MadHeader { status: 0, class_specific: 0, tid: 0x0000_0002_0885_a4a5, attr_id: 0x0010, attr_mod: 0 }
    }

    #[test]
    fn round_trip() {
        let mut mad = [0u8; MAD_LEN];
        header().emit(&mut mad);
        assert_eq!(&mad[..4], &[1, 7, 2, 3]);
        assert_eq!(MadHeader::parse(&mad), Ok(header()));
    }

    #[test]
    fn refuses_what_is_not_a_cm_send() {
        let mut mad = [0u8; MAD_LEN];
        header().emit(&mut mad);
        assert_eq!(MadHeader::parse(&mad[..255]), Err(MadError::Length(255)));
        assert_eq!(MadHeader::parse(&[]), Err(MadError::Length(0)));
        for (i, bad, err) in
            [(0, 2, MadError::BaseVersion(2)), (1, 0x81, MadError::Class(0x81)), (2, 1, MadError::ClassVersion(1)), (3, 0x81, MadError::Method(0x81))]
        {
            let mut m = mad;
            m[i] = bad;
            assert_eq!(MadHeader::parse(&m), Err(err));
        }
    }
}
