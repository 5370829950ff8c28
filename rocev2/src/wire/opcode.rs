//! BTH opcodes and the extension headers each one carries.
//!
//! IBTA Vol 1, 9.2 (table 35 "OpCode field") and 9.3 (which headers follow the
//! BTH for each opcode). The opcode's top 3 bits name the transport service
//! (RC 000, UC 001, RD 010, UD 011, CNP 100), the low 5 bits the operation.
//! Unknown opcodes are ordinary values: [`Opcode::layout`] returns `None` for them.

use core::fmt;

/// Transport service named by the top three bits of an opcode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Service {
    /// Reliable Connected (0b000).
    Rc,
    /// Unreliable Connected (0b001).
    Uc,
    /// Reliable Datagram (0b010); not implemented by urnic.
    Rd,
    /// Unreliable Datagram (0b011).
    Ud,
    /// Congestion notification (0b100, RoCEv2 annex A17.9.3).
    Cnp,
    /// Manufacturer-specific or reserved (0b101..0b111).
    Other,
}

/// Which extension headers follow the BTH, in wire order, and whether the
/// packet carries a payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct HeaderLayout {
    /// Datagram ETH (8 bytes): UD.
    pub deth: bool,
    /// RDMA ETH (16 bytes): WRITE first/only, READ request.
    pub reth: bool,
    /// Atomic ETH (28 bytes): CMP_SWAP, FETCH_ADD.
    pub atomic_eth: bool,
    /// ACK ETH (4 bytes): ACK, atomic ACK, READ response first/last/only.
    pub aeth: bool,
    /// Atomic ACK ETH (8 bytes): atomic ACK.
    pub atomic_ack_eth: bool,
    /// Immediate data (4 bytes).
    pub immdt: bool,
    /// Invalidate ETH (4 bytes): SEND with invalidate.
    pub ieth: bool,
    /// 16 reserved bytes of a CNP.
    pub cnp_reserved: bool,
    /// Whether a payload may follow the headers.
    pub payload: bool,
}

impl HeaderLayout {
    /// Total length of the extension headers in bytes.
    pub const fn ext_len(&self) -> usize {
        (self.deth as usize) * 8
            + (self.reth as usize) * 16
            + (self.atomic_eth as usize) * 28
            + (self.aeth as usize) * 4
            + (self.atomic_ack_eth as usize) * 8
            + (self.immdt as usize) * 4
            + (self.ieth as usize) * 4
            + (self.cnp_reserved as usize) * 16
    }
}

/// An opcode's [`HeaderLayout`] in one byte ([`Opcode::shape`]): whether a
/// payload may follow, and the extension headers' length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpcodeShape(u8);

impl OpcodeShape {
    const KNOWN: u8 = 0x80;
    const PAYLOAD: u8 = 0x40;
    const EXT_LEN: u8 = 0x3f;

    const fn of(l: HeaderLayout) -> u8 {
        // At most 28 + 8 + 4 + 16 (no opcode has more than two): fits six bits.
        let payload = if l.payload { Self::PAYLOAD } else { 0 };
        Self::KNOWN | payload | l.ext_len() as u8
    }

    /// [`HeaderLayout::payload`].
    #[inline]
    pub const fn payload(self) -> bool {
        self.0 & Self::PAYLOAD != 0
    }

    /// [`HeaderLayout::ext_len`].
    #[inline]
    pub const fn ext_len(self) -> usize {
        (self.0 & Self::EXT_LEN) as usize
    }
}

/// Position of a packet within a multi-packet message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Segment {
    /// First packet of a message of several.
    First,
    /// Neither first nor last.
    Middle,
    /// Last packet of a message of several.
    Last,
    /// The whole message in one packet.
    Only,
}

/// A BTH opcode. Any byte is a valid `Opcode`; only known ones have a layout.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(pub u8);

#[allow(missing_docs)]
impl Opcode {
    pub const RC_SEND_FIRST: Opcode = Opcode(0x00);
    pub const RC_SEND_MIDDLE: Opcode = Opcode(0x01);
    pub const RC_SEND_LAST: Opcode = Opcode(0x02);
    pub const RC_SEND_LAST_IMM: Opcode = Opcode(0x03);
    pub const RC_SEND_ONLY: Opcode = Opcode(0x04);
    pub const RC_SEND_ONLY_IMM: Opcode = Opcode(0x05);
    pub const RC_WRITE_FIRST: Opcode = Opcode(0x06);
    pub const RC_WRITE_MIDDLE: Opcode = Opcode(0x07);
    pub const RC_WRITE_LAST: Opcode = Opcode(0x08);
    pub const RC_WRITE_LAST_IMM: Opcode = Opcode(0x09);
    pub const RC_WRITE_ONLY: Opcode = Opcode(0x0a);
    pub const RC_WRITE_ONLY_IMM: Opcode = Opcode(0x0b);
    pub const RC_READ_REQUEST: Opcode = Opcode(0x0c);
    pub const RC_READ_RESPONSE_FIRST: Opcode = Opcode(0x0d);
    pub const RC_READ_RESPONSE_MIDDLE: Opcode = Opcode(0x0e);
    pub const RC_READ_RESPONSE_LAST: Opcode = Opcode(0x0f);
    pub const RC_READ_RESPONSE_ONLY: Opcode = Opcode(0x10);
    pub const RC_ACK: Opcode = Opcode(0x11);
    pub const RC_ATOMIC_ACK: Opcode = Opcode(0x12);
    pub const RC_CMP_SWAP: Opcode = Opcode(0x13);
    pub const RC_FETCH_ADD: Opcode = Opcode(0x14);
    pub const RC_SEND_LAST_INV: Opcode = Opcode(0x16);
    pub const RC_SEND_ONLY_INV: Opcode = Opcode(0x17);

    pub const UC_SEND_FIRST: Opcode = Opcode(0x20);
    pub const UC_SEND_MIDDLE: Opcode = Opcode(0x21);
    pub const UC_SEND_LAST: Opcode = Opcode(0x22);
    pub const UC_SEND_LAST_IMM: Opcode = Opcode(0x23);
    pub const UC_SEND_ONLY: Opcode = Opcode(0x24);
    pub const UC_SEND_ONLY_IMM: Opcode = Opcode(0x25);
    pub const UC_WRITE_FIRST: Opcode = Opcode(0x26);
    pub const UC_WRITE_MIDDLE: Opcode = Opcode(0x27);
    pub const UC_WRITE_LAST: Opcode = Opcode(0x28);
    pub const UC_WRITE_LAST_IMM: Opcode = Opcode(0x29);
    pub const UC_WRITE_ONLY: Opcode = Opcode(0x2a);
    pub const UC_WRITE_ONLY_IMM: Opcode = Opcode(0x2b);

    pub const UD_SEND_ONLY: Opcode = Opcode(0x64);
    pub const UD_SEND_ONLY_IMM: Opcode = Opcode(0x65);

    pub const CNP: Opcode = Opcode(0x81);

    /// The transport service (top three bits).
    pub const fn service(self) -> Service {
        match self.0 >> 5 {
            0 => Service::Rc,
            1 => Service::Uc,
            2 => Service::Rd,
            3 => Service::Ud,
            4 => Service::Cnp,
            _ => Service::Other,
        }
    }

    /// The extension headers this opcode carries, or `None` for an opcode
    /// urnic does not know (reserved, RD, manufacturer-specific, FLUSH, ...).
    /// A lookup in a table built at compile time (it is asked for several
    /// times per packet).
    #[inline]
    pub const fn layout(self) -> Option<HeaderLayout> {
        LAYOUTS[self.0 as usize]
    }

    /// What an emit or a frame parse checks of the opcode (known, payload
    /// allowed, extension headers' length), or `None` for an opcode urnic
    /// does not know: one byte from a table, where [`layout`](Self::layout)
    /// copies ten and its `ext_len` sums eight flags (about 80 instructions
    /// per frame over the emit's callers, callgrind).
    #[inline]
    pub const fn shape(self) -> Option<OpcodeShape> {
        let s = SHAPES[self.0 as usize];
        if s & OpcodeShape::KNOWN == 0 {
            None
        } else {
            Some(OpcodeShape(s))
        }
    }

    const fn layout_by_match(self) -> Option<HeaderLayout> {
        const P: HeaderLayout = HeaderLayout {
            deth: false,
            reth: false,
            atomic_eth: false,
            aeth: false,
            atomic_ack_eth: false,
            immdt: false,
            ieth: false,
            cnp_reserved: false,
            payload: true,
        };
        const NONE: HeaderLayout = HeaderLayout { payload: false, ..P };
        let low = self.0 & 0x1f;
        match self.service() {
            Service::Rc => Some(match low {
                0x00 | 0x01 | 0x02 | 0x04 => P,
                0x03 | 0x05 => HeaderLayout { immdt: true, ..P },
                0x06 | 0x0a => HeaderLayout { reth: true, ..P },
                0x07 | 0x08 => P,
                0x09 => HeaderLayout { immdt: true, ..P },
                0x0b => HeaderLayout { reth: true, immdt: true, ..P },
                0x0c => HeaderLayout { reth: true, ..NONE },
                0x0d | 0x0f | 0x10 => HeaderLayout { aeth: true, ..P },
                0x0e => P,
                0x11 => HeaderLayout { aeth: true, ..NONE },
                0x12 => HeaderLayout { aeth: true, atomic_ack_eth: true, ..NONE },
                0x13 | 0x14 => HeaderLayout { atomic_eth: true, ..NONE },
                0x16 | 0x17 => HeaderLayout { ieth: true, ..P },
                _ => return None,
            }),
            Service::Uc => Some(match low {
                0x00 | 0x01 | 0x02 | 0x04 | 0x07 | 0x08 => P,
                0x03 | 0x05 | 0x09 => HeaderLayout { immdt: true, ..P },
                0x06 | 0x0a => HeaderLayout { reth: true, ..P },
                0x0b => HeaderLayout { reth: true, immdt: true, ..P },
                _ => return None,
            }),
            Service::Ud => Some(match low {
                0x04 => HeaderLayout { deth: true, ..P },
                0x05 => HeaderLayout { deth: true, immdt: true, ..P },
                _ => return None,
            }),
            Service::Cnp => match self.0 {
                0x81 => Some(HeaderLayout { cnp_reserved: true, ..NONE }),
                _ => None,
            },
            Service::Rd | Service::Other => None,
        }
    }

    /// Whether urnic knows this opcode.
    pub const fn is_known(self) -> bool {
        self.layout().is_some()
    }

    /// Position within a message for SEND, WRITE and READ RESPONSE opcodes;
    /// `Only` for single-packet operations (READ request, atomics, ACKs, UD, CNP).
    #[inline]
    pub const fn segment(self) -> Segment {
        match (KINDS[self.0 as usize] >> kind::SEGMENT_SHIFT) & 3 {
            0 => Segment::First,
            1 => Segment::Middle,
            2 => Segment::Last,
            _ => Segment::Only,
        }
    }

    /// SEND of any kind (RC, UC, UD).
    #[inline]
    pub const fn is_send(self) -> bool {
        KINDS[self.0 as usize] & kind::SEND != 0
    }

    /// RDMA WRITE of any kind (RC, UC).
    #[inline]
    pub const fn is_write(self) -> bool {
        KINDS[self.0 as usize] & kind::WRITE != 0
    }

    /// RC READ RESPONSE first/middle/last/only.
    pub const fn is_read_response(self) -> bool {
        matches!(self.0, 0x0d..=0x10)
    }

    /// RC CMP_SWAP or FETCH_ADD.
    pub const fn is_atomic(self) -> bool {
        matches!(self.0, 0x13 | 0x14)
    }

    /// A request (sent by a requester to a responder), as opposed to a
    /// response (ACK, atomic ACK, READ response) or a CNP.
    #[inline]
    pub const fn is_request(self) -> bool {
        KINDS[self.0 as usize] & kind::REQUEST != 0
    }

    /// A response travelling from responder to requester.
    #[inline]
    pub const fn is_response(self) -> bool {
        KINDS[self.0 as usize] & kind::RESPONSE != 0
    }

    /// Carries immediate data.
    #[inline]
    pub const fn has_immediate(self) -> bool {
        KINDS[self.0 as usize] & kind::IMMEDIATE != 0
    }

    /// [`segment`](Self::segment) by the IBTA table (9.2, table 35): what
    /// [`KINDS`] is built from.
    const fn segment_by_match(self) -> Segment {
        match self.service() {
            Service::Rc | Service::Uc => match self.0 & 0x1f {
                0x00 | 0x06 | 0x0d => Segment::First,
                0x01 | 0x07 | 0x0e => Segment::Middle,
                0x02 | 0x03 | 0x08 | 0x09 | 0x0f | 0x16 => Segment::Last,
                _ => Segment::Only,
            },
            _ => Segment::Only,
        }
    }

    /// [`is_send`](Self::is_send) by the IBTA table.
    const fn is_send_by_match(self) -> bool {
        match self.service() {
            Service::Rc => matches!(self.0 & 0x1f, 0x00..=0x05 | 0x16 | 0x17),
            Service::Uc => matches!(self.0 & 0x1f, 0x00..=0x05),
            Service::Ud => matches!(self.0 & 0x1f, 0x04 | 0x05),
            _ => false,
        }
    }

    /// [`is_write`](Self::is_write) by the IBTA table.
    const fn is_write_by_match(self) -> bool {
        matches!(self.service(), Service::Rc | Service::Uc) && matches!(self.0 & 0x1f, 0x06..=0x0b)
    }

    /// The classes above in one byte ([`KINDS`]).
    const fn kind_by_match(self) -> u8 {
        let send = self.is_send_by_match();
        let write = self.is_write_by_match();
        let request = send || write || self.0 == 0x0c || self.is_atomic();
        let response = self.is_read_response() || matches!(self.0, 0x11 | 0x12);
        let immediate = match self.layout_by_match() {
            Some(l) => l.immdt,
            None => false,
        };
        let segment = match self.segment_by_match() {
            Segment::First => 0,
            Segment::Middle => 1,
            Segment::Last => 2,
            Segment::Only => 3,
        };
        (if send { kind::SEND } else { 0 })
            | (if write { kind::WRITE } else { 0 })
            | (if request { kind::REQUEST } else { 0 })
            | (if response { kind::RESPONSE } else { 0 })
            | (if immediate { kind::IMMEDIATE } else { 0 })
            | segment << kind::SEGMENT_SHIFT
    }

    /// The IBTA name of the opcode, e.g. `"RC_SEND_FIRST"`, or `"UNKNOWN"`.
    pub const fn name(self) -> &'static str {
        match self.0 {
            0x00 => "RC_SEND_FIRST",
            0x01 => "RC_SEND_MIDDLE",
            0x02 => "RC_SEND_LAST",
            0x03 => "RC_SEND_LAST_WITH_IMMEDIATE",
            0x04 => "RC_SEND_ONLY",
            0x05 => "RC_SEND_ONLY_WITH_IMMEDIATE",
            0x06 => "RC_RDMA_WRITE_FIRST",
            0x07 => "RC_RDMA_WRITE_MIDDLE",
            0x08 => "RC_RDMA_WRITE_LAST",
            0x09 => "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
            0x0a => "RC_RDMA_WRITE_ONLY",
            0x0b => "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
            0x0c => "RC_RDMA_READ_REQUEST",
            0x0d => "RC_RDMA_READ_RESPONSE_FIRST",
            0x0e => "RC_RDMA_READ_RESPONSE_MIDDLE",
            0x0f => "RC_RDMA_READ_RESPONSE_LAST",
            0x10 => "RC_RDMA_READ_RESPONSE_ONLY",
            0x11 => "RC_ACKNOWLEDGE",
            0x12 => "RC_ATOMIC_ACKNOWLEDGE",
            0x13 => "RC_CMP_SWAP",
            0x14 => "RC_FETCH_ADD",
            0x16 => "RC_SEND_LAST_WITH_INVALIDATE",
            0x17 => "RC_SEND_ONLY_WITH_INVALIDATE",
            0x20 => "UC_SEND_FIRST",
            0x21 => "UC_SEND_MIDDLE",
            0x22 => "UC_SEND_LAST",
            0x23 => "UC_SEND_LAST_WITH_IMMEDIATE",
            0x24 => "UC_SEND_ONLY",
            0x25 => "UC_SEND_ONLY_WITH_IMMEDIATE",
            0x26 => "UC_RDMA_WRITE_FIRST",
            0x27 => "UC_RDMA_WRITE_MIDDLE",
            0x28 => "UC_RDMA_WRITE_LAST",
            0x29 => "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
            0x2a => "UC_RDMA_WRITE_ONLY",
            0x2b => "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
            0x64 => "UD_SEND_ONLY",
            0x65 => "UD_SEND_ONLY_WITH_IMMEDIATE",
            0x81 => "CNP",
            _ => "UNKNOWN",
        }
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({:#04x})", self.name(), self.0)
    }
}

/// [`Opcode::layout`] for every opcode byte.
static LAYOUTS: [Option<HeaderLayout>; 256] = {
    let mut t = [None; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = Opcode(i as u8).layout_by_match();
        i += 1;
    }
    t
};

/// The bits of a [`KINDS`] entry.
mod kind {
    pub(super) const SEND: u8 = 0x01;
    pub(super) const WRITE: u8 = 0x02;
    pub(super) const REQUEST: u8 = 0x04;
    pub(super) const RESPONSE: u8 = 0x08;
    pub(super) const IMMEDIATE: u8 = 0x10;
    /// Two bits: 0 first, 1 middle, 2 last, 3 only.
    pub(super) const SEGMENT_SHIFT: u8 = 5;
}

/// Every opcode byte's class (send, write, request, response, immediate
/// data, segment) in one byte: the responder asks several of these per
/// packet, each one load from here instead of a match on the service and
/// the operation (about 16 instructions per data frame for `is_write`
/// alone, callgrind).
static KINDS: [u8; 256] = {
    let mut t = [0; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = Opcode(i as u8).kind_by_match();
        i += 1;
    }
    t
};

/// [`Opcode::shape`] for every opcode byte (0: unknown).
static SHAPES: [u8; 256] = {
    let mut t = [0; 256];
    let mut i = 0;
    while i < 256 {
        if let Some(l) = Opcode(i as u8).layout_by_match() {
            t[i] = OpcodeShape::of(l);
        }
        i += 1;
    }
    t
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_is_a_value() {
        let known = (0..=255u8).filter(|&b| Opcode(b).is_known()).count();
        // 23 RC + 12 UC + 2 UD + CNP
        assert_eq!(known, 38);
    }

    /// The classes read from `KINDS` are those of the IBTA table for every
    /// opcode byte (known or not).
    #[test]
    fn kinds_match_the_ibta_table() {
        for b in 0..=255u8 {
            let op = Opcode(b);
            assert_eq!(op.segment(), op.segment_by_match(), "opcode {b:#x}");
            assert_eq!(op.is_send(), op.is_send_by_match(), "opcode {b:#x}");
            assert_eq!(op.is_write(), op.is_write_by_match(), "opcode {b:#x}");
            let request = op.is_send_by_match() || op.is_write_by_match() || op == Opcode::RC_READ_REQUEST || op.is_atomic();
            assert_eq!(op.is_request(), request, "opcode {b:#x}");
            assert_eq!(op.is_response(), op.is_read_response() || op == Opcode::RC_ACK || op == Opcode::RC_ATOMIC_ACK, "opcode {b:#x}");
            assert_eq!(op.has_immediate(), op.layout().is_some_and(|l| l.immdt), "opcode {b:#x}");
        }
        let requests = (0..=255u8).filter(|&b| Opcode(b).is_request()).count();
        // RC: 6 SEND, 6 WRITE, READ, 2 atomics, 2 SEND with invalidate; UC: 6 + 6; UD: 2.
        assert_eq!(requests, 17 + 12 + 2);
        assert!(Opcode::RC_WRITE_LAST_IMM.has_immediate() && !Opcode::RC_WRITE_LAST.has_immediate());
        assert_eq!((Opcode::RC_READ_RESPONSE_FIRST.segment(), Opcode::CNP.segment()), (Segment::First, Segment::Only));
    }

    #[test]
    fn layouts_match_ibta_table() {
        assert_eq!(Opcode::RC_WRITE_ONLY_IMM.layout().unwrap().ext_len(), 20);
        assert_eq!(Opcode::RC_ATOMIC_ACK.layout().unwrap().ext_len(), 12);
        assert_eq!(Opcode::RC_CMP_SWAP.layout().unwrap().ext_len(), 28);
        assert_eq!(Opcode::UD_SEND_ONLY_IMM.layout().unwrap().ext_len(), 12);
        assert_eq!(Opcode::CNP.layout().unwrap().ext_len(), 16);
        for b in 0..=255u8 {
            let op = Opcode(b);
            let shape = op.shape().map(|s| (s.payload(), s.ext_len()));
            assert_eq!(shape, op.layout().map(|l| (l.payload, l.ext_len())), "opcode {b:#x}");
        }
        assert!(!Opcode::RC_READ_REQUEST.layout().unwrap().payload);
        assert_eq!(Opcode(0x15).layout(), None);
        assert_eq!(Opcode(0x2c).layout(), None);
        assert_eq!(Opcode::RC_SEND_LAST_INV.segment(), Segment::Last);
        assert_eq!(Opcode::UC_WRITE_MIDDLE.segment(), Segment::Middle);
        assert!(Opcode::UC_WRITE_LAST_IMM.has_immediate());
    }
}
