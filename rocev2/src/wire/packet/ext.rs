//! Extended transport headers (IBTA Vol 1 9.3) and the CNP's reserved
//! bytes (RoCEv2 annex A17.9.3). All are fixed-size; each view starts at its
//! header. Wire order after the BTH (IBTA 9.3): DETH, RETH | AtomicETH,
//! AETH, AtomicAckETH, ImmDt | IETH.

use super::field;
use super::view;
use crate::wire::repr::AckSyndrome;
use crate::wire::{Header, WireError};

/// `LEN` and a `check_len` that reports `Truncated(ExtHeaders)`.
macro_rules! fixed_len {
    ($name:ident, $len:expr) => {
        impl<T: AsRef<[u8]>> $name<T> {
            /// Header length in bytes.
            pub const LEN: usize = $len;

            /// The buffer holds the whole header.
            pub fn check_len(&self) -> Result<(), WireError> {
                if self.buffer.as_ref().len() < Self::LEN {
                    return Err(WireError::Truncated(Header::ExtHeaders));
                }
                Ok(())
            }
        }
    };
}

view! {
    /// RDMA ETH (IBTA 9.3.3, 16 bytes): VA(64), R_Key, DMA length. Carried by
    /// RDMA WRITE first/only and RDMA READ request.
    RethPacket
}
fixed_len!(RethPacket, 16);

impl<T: AsRef<[u8]>> RethPacket<T> {
    /// Remote virtual address.
    pub fn va(&self) -> u64 {
        field::u64_at(self.buffer.as_ref(), 0)
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        field::u32_at(self.buffer.as_ref(), 8)
    }
    /// Length of the whole RDMA operation.
    pub fn dma_len(&self) -> u32 {
        field::u32_at(self.buffer.as_ref(), 12)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> RethPacket<T> {
    /// Set the virtual address.
    pub fn set_va(&mut self, v: u64) {
        field::set_u64(self.bytes_mut(), 0, v);
    }
    /// Set the remote key.
    pub fn set_rkey(&mut self, v: u32) {
        field::set_u32(self.bytes_mut(), 8, v);
    }
    /// Set the DMA length.
    pub fn set_dma_len(&mut self, v: u32) {
        field::set_u32(self.bytes_mut(), 12, v);
    }
}

view! {
    /// Atomic ETH (IBTA 9.3.4, 28 bytes): VA(64), R_Key, swap/add data(64),
    /// compare data(64). Carried by CMP_SWAP and FETCH_ADD.
    AtomicEthPacket
}
fixed_len!(AtomicEthPacket, 28);

impl<T: AsRef<[u8]>> AtomicEthPacket<T> {
    /// Remote virtual address (must be 8-byte aligned; the responder checks it).
    pub fn va(&self) -> u64 {
        field::u64_at(self.buffer.as_ref(), 0)
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        field::u32_at(self.buffer.as_ref(), 8)
    }
    /// Swap value (CMP_SWAP) or add value (FETCH_ADD).
    pub fn swap_add(&self) -> u64 {
        field::u64_at(self.buffer.as_ref(), 12)
    }
    /// Compare value (CMP_SWAP).
    pub fn compare(&self) -> u64 {
        field::u64_at(self.buffer.as_ref(), 20)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicEthPacket<T> {
    /// Set the virtual address.
    pub fn set_va(&mut self, v: u64) {
        field::set_u64(self.bytes_mut(), 0, v);
    }
    /// Set the remote key.
    pub fn set_rkey(&mut self, v: u32) {
        field::set_u32(self.bytes_mut(), 8, v);
    }
    /// Set the swap/add value.
    pub fn set_swap_add(&mut self, v: u64) {
        field::set_u64(self.bytes_mut(), 12, v);
    }
    /// Set the compare value.
    pub fn set_compare(&mut self, v: u64) {
        field::set_u64(self.bytes_mut(), 20, v);
    }
}

view! {
    /// ACK ETH (IBTA 9.3.5, 4 bytes): syndrome(8), MSN(24). Carried by ACK,
    /// ATOMIC ACK and READ response first/last/only.
    AethPacket
}
fixed_len!(AethPacket, 4);

impl<T: AsRef<[u8]>> AethPacket<T> {
    /// The raw syndrome byte.
    pub fn syndrome_byte(&self) -> u8 {
        field::u8_at(self.buffer.as_ref(), 0)
    }
    /// The decoded syndrome (IBTA 9.7.5.1 table 42).
    pub fn syndrome(&self) -> AckSyndrome {
        AckSyndrome::from_byte(self.syndrome_byte())
    }
    /// Message sequence number (24 bits).
    pub fn msn(&self) -> u32 {
        field::u24_at(self.buffer.as_ref(), 1)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AethPacket<T> {
    /// Set the syndrome.
    pub fn set_syndrome(&mut self, s: AckSyndrome) {
        field::set_u8(self.bytes_mut(), 0, s.to_byte());
    }
    /// Set the MSN (low 24 bits).
    pub fn set_msn(&mut self, msn: u32) {
        field::set_u24(self.bytes_mut(), 1, msn);
    }
}

view! {
    /// Atomic ACK ETH (IBTA 9.3.6, 8 bytes): the original remote data.
    AtomicAckEthPacket
}
fixed_len!(AtomicAckEthPacket, 8);

impl<T: AsRef<[u8]>> AtomicAckEthPacket<T> {
    /// The value at the remote address before the atomic operation.
    pub fn orig_remote_data(&self) -> u64 {
        field::u64_at(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicAckEthPacket<T> {
    /// Set the original remote data.
    pub fn set_orig_remote_data(&mut self, v: u64) {
        field::set_u64(self.bytes_mut(), 0, v);
    }
}

view! {
    /// Immediate data ETH (IBTA 9.3.7, 4 bytes).
    ImmDtPacket
}
fixed_len!(ImmDtPacket, 4);

impl<T: AsRef<[u8]>> ImmDtPacket<T> {
    /// The immediate data (read big-endian, as [`TransportRepr::immediate`](crate::wire::TransportRepr) holds it).
    pub fn immediate(&self) -> u32 {
        field::u32_at(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ImmDtPacket<T> {
    /// Set the immediate data.
    pub fn set_immediate(&mut self, v: u32) {
        field::set_u32(self.bytes_mut(), 0, v);
    }
}

view! {
    /// Invalidate ETH (IBTA 9.3.8, 4 bytes): the R_Key to invalidate.
    /// Carried by SEND last/only with invalidate.
    IethPacket
}
fixed_len!(IethPacket, 4);

impl<T: AsRef<[u8]>> IethPacket<T> {
    /// The R_Key to invalidate.
    pub fn rkey(&self) -> u32 {
        field::u32_at(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> IethPacket<T> {
    /// Set the R_Key to invalidate.
    pub fn set_rkey(&mut self, v: u32) {
        field::set_u32(self.bytes_mut(), 0, v);
    }
}

view! {
    /// Datagram ETH (IBTA 9.3.2, 8 bytes): Q_Key, reserved(8), SrcQP(24).
    /// Carried by every UD packet.
    DethPacket
}
fixed_len!(DethPacket, 8);

impl<T: AsRef<[u8]>> DethPacket<T> {
    /// Queue key (GSI/QP1 uses 0x80010000).
    pub fn qkey(&self) -> u32 {
        field::u32_at(self.buffer.as_ref(), 0)
    }
    /// The reserved byte.
    pub fn resv8(&self) -> u8 {
        field::u8_at(self.buffer.as_ref(), 4)
    }
    /// Source QP number (24 bits).
    pub fn src_qp(&self) -> u32 {
        field::u24_at(self.buffer.as_ref(), 5)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> DethPacket<T> {
    /// Set the Q_Key.
    pub fn set_qkey(&mut self, v: u32) {
        field::set_u32(self.bytes_mut(), 0, v);
    }
    /// Set the reserved byte.
    pub fn set_resv8(&mut self, v: u8) {
        field::set_u8(self.bytes_mut(), 4, v);
    }
    /// Set the source QP (low 24 bits).
    pub fn set_src_qp(&mut self, qpn: u32) {
        field::set_u24(self.bytes_mut(), 5, qpn);
    }
}

view! {
    /// The 16 reserved bytes that follow the BTH of a CNP (opcode 0x81,
    /// RoCEv2 annex A17.9.3): senders write zeros, receivers ignore them.
    CnpPacket
}
fixed_len!(CnpPacket, 16);

impl<T: AsRef<[u8]>> CnpPacket<T> {
    /// The reserved bytes as stored.
    pub fn reserved(&self) -> [u8; 16] {
        field::rd(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CnpPacket<T> {
    /// Zero the reserved bytes (what a sender must write).
    pub fn clear_reserved(&mut self) {
        field::wr(self.bytes_mut(), 0, [0u8; 16]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::repr::NakCode;

    #[test]
    fn each_header_in_place() {
        let mut b = [0u8; 28];
        let mut r = RethPacket::new_unchecked(&mut b[..16]);
        r.set_va(0x0102_0304_0506_0708);
        r.set_rkey(0x1122_3344);
        r.set_dma_len(4096);
        let r = RethPacket::new_checked(&b[..16]).unwrap();
        assert_eq!((r.va(), r.rkey(), r.dma_len()), (0x0102_0304_0506_0708, 0x1122_3344, 4096));
        assert_eq!(&b[..12], &[1, 2, 3, 4, 5, 6, 7, 8, 0x11, 0x22, 0x33, 0x44]);

        let mut a = AtomicEthPacket::new_unchecked(&mut b[..]);
        a.set_va(8);
        a.set_rkey(9);
        a.set_swap_add(u64::MAX - 1);
        a.set_compare(42);
        let a = AtomicEthPacket::new_checked(&b[..]).unwrap();
        assert_eq!((a.va(), a.rkey(), a.swap_add(), a.compare()), (8, 9, u64::MAX - 1, 42));

        let mut k = AethPacket::new_unchecked(&mut b[..4]);
        k.set_syndrome(AckSyndrome::Nak(NakCode::RemoteAccessError));
        k.set_msn(0x0100_0203); // only the low 24 bits
        let k = AethPacket::new_checked(&b[..4]).unwrap();
        assert_eq!((k.syndrome_byte(), k.syndrome(), k.msn()), (0x62, AckSyndrome::Nak(NakCode::RemoteAccessError), 0x0203));

        AtomicAckEthPacket::new_unchecked(&mut b[..8]).set_orig_remote_data(7);
        assert_eq!(AtomicAckEthPacket::new_checked(&b[..8]).unwrap().orig_remote_data(), 7);
        ImmDtPacket::new_unchecked(&mut b[..4]).set_immediate(0xdead_beef);
        assert_eq!(&b[..4], &[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(ImmDtPacket::new_checked(&b[..4]).unwrap().immediate(), 0xdead_beef);
        IethPacket::new_unchecked(&mut b[..4]).set_rkey(0x55);
        assert_eq!(IethPacket::new_checked(&b[..4]).unwrap().rkey(), 0x55);

        let mut d = DethPacket::new_unchecked(&mut b[..8]);
        d.set_qkey(0x8001_0000);
        d.set_resv8(0xaa);
        d.set_src_qp(0xff_0001);
        assert_eq!(&b[..8], &[0x80, 0x01, 0, 0, 0xaa, 0xff, 0, 1]);
        let d = DethPacket::new_checked(&b[..8]).unwrap();
        assert_eq!((d.qkey(), d.resv8(), d.src_qp()), (0x8001_0000, 0xaa, 0xff_0001));

        let mut c = CnpPacket::new_unchecked(&mut b[..16]);
        c.clear_reserved();
        assert_eq!(CnpPacket::new_checked(&b[..16]).unwrap().reserved(), [0; 16]);
    }

    #[test]
    fn short_buffers() {
        let b = [0xffu8; 27];
        let t = Err(WireError::Truncated(Header::ExtHeaders));
        assert_eq!(RethPacket::new_checked(&b[..15]).map(|_| ()), t);
        assert_eq!(AtomicEthPacket::new_checked(&b[..]).map(|_| ()), t);
        assert_eq!(AethPacket::new_checked(&b[..3]).map(|_| ()), t);
        assert_eq!(AtomicAckEthPacket::new_checked(&b[..7]).map(|_| ()), t);
        assert_eq!(ImmDtPacket::new_checked(&b[..3]).map(|_| ()), t);
        assert_eq!(IethPacket::new_checked(&b[..3]).map(|_| ()), t);
        assert_eq!(DethPacket::new_checked(&b[..7]).map(|_| ()), t);
        assert_eq!(CnpPacket::new_checked(&b[..15]).map(|_| ()), t);
        // never panics: what is missing reads as zero
        let a = AtomicEthPacket::new_unchecked(&b[..]);
        assert_eq!(a.compare(), 0);
        assert_eq!(a.swap_add(), u64::MAX);
    }
}
