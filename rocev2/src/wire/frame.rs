//! Whole-frame parse and emit: Ethernet / IP / UDP / BTH / ext headers /
//! payload / pad / ICRC.
//!
//! - [`parse_frame`] fully checks a received Ethernet frame, including the
//!   ICRC, and returns the headers plus a borrowed payload (pad and ICRC removed).
//! - [`FrameRepr::emit_with`] writes the headers, lets the caller fill the
//!   payload in place (the one copy), then writes pad bytes and the ICRC. It
//!   computes the IPv4 total length and header checksum, the IPv6 payload
//!   length, the UDP length and the BTH pad count from `payload_len`; the
//!   values of those fields in the repr are ignored. The UDP checksum is
//!   emitted as given (0 for RoCEv2 over IPv4).

use super::bth::{BthRepr, BTH_LEN};
use super::crc;
use super::error::{Header, WireError};
use super::ethernet::{EthernetHead, EthernetRepr, ETHERNET_LEN, ETHERTYPE_IPV4, ETHERTYPE_IPV6, ETHERTYPE_VLAN};
use super::icrc::{self, ICRC_LEN};
use super::ip::{IpRepr, IPPROTO_UDP};
use super::ipv4::{Ipv4Repr, IPV4_LEN};
use super::ipv6::{Ipv6Repr, IPV6_LEN};
use super::opcode::Opcode;
use super::transport_headers::TransportRepr;
use super::udp::{UdpRepr, ROCEV2_UDP_PORT, UDP_LEN};
use crate::psn::Psn;

/// A whole RoCEv2 frame's headers: Ethernet, IP, UDP and transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FrameRepr {
    /// Ethernet header.
    pub eth: EthernetRepr,
    /// IP header.
    pub ip: IpRepr,
    /// UDP header.
    pub udp: UdpRepr,
    /// BTH and extension headers.
    pub transport: TransportRepr,
}

/// Pad bytes that make a payload of `len` bytes a multiple of 4 (IBTA 9.2,
/// BTH PadCnt: the payload is padded to a 4-byte boundary).
pub const fn pad_for(len: usize) -> usize {
    (4 - len % 4) % 4
}

/// A parsed, ICRC-checked RoCEv2 frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParsedFrame<'a> {
    /// All headers.
    pub repr: FrameRepr,
    /// The payload, without pad and ICRC.
    pub payload: &'a [u8],
    /// The ICRC as read from the wire (already verified, unless the frame
    /// came with an [`IcrcCheck`] from [`parse_frame_deferring`]).
    pub icrc: u32,
}

// What `parse_ip` starts from and overwrites in full (zeros, opcode 0): not
// headers anyone received. (`parse_frame_with` spells the transport out.)
const UNSET_IP: IpRepr =
    IpRepr::V4(Ipv4Repr { src: [0; 4], dst: [0; 4], dscp: 0, ecn: 0, ident: 0, dont_frag: false, ttl: 0, protocol: 0, payload_len: 0 });
const UNSET_UDP: UdpRepr = UdpRepr { src_port: 0, dst_port: 0, length: 0, checksum: 0 };
const UNSET_TRANSPORT: TransportRepr = TransportRepr::bth_only(BthRepr::new(Opcode(0), 0, Psn::new(0)));

/// A parsed, ICRC-checked RoCEv2 packet from the IP header onward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParsedL3<'a> {
    /// IP header.
    pub ip: IpRepr,
    /// UDP header.
    pub udp: UdpRepr,
    /// BTH and extension headers.
    pub transport: TransportRepr,
    /// The payload, without pad and ICRC.
    pub payload: &'a [u8],
    /// The ICRC (verified).
    pub icrc: u32,
}

/// Parse and fully check an Ethernet frame carrying RoCEv2. Bytes after the
/// IP packet (Ethernet padding of short frames) are ignored.
///
/// Checks, in order: Ethernet (+ one 802.1Q tag) length, EtherType IPv4 or
/// IPv6, then everything [`parse_l3`] checks, with the IP version required to
/// match the EtherType.
pub fn parse_frame(frame: &[u8]) -> Result<ParsedFrame<'_>, WireError> {
    parse_frame_with(frame, |p| *p)
}

/// [`parse_frame_with`] for a receiver that places an RDMA WRITE's
/// continuation (RC WRITE MIDDLE or LAST without immediate, a payload of
/// [`crc::PLACE_MIN`] bytes or more, IPv6 or IPv4 without options, where
/// the CPU has the kernel: [`crc::place_available`]) while it checks the
/// ICRC, in one pass over the frame instead of a check and then a copy:
/// such a frame reaches `f` with every other check done and its ICRC **not
/// yet checked**, and an [`IcrcCheck`] for the receiver to finish with
/// ([`IcrcCheck::place`] or [`IcrcCheck::verify`]) before the frame changes
/// anything. Every other frame is checked in full, as [`parse_frame_with`]
/// does, and reaches `f` with `None`.
#[inline(always)]
pub fn parse_frame_deferring<'a, R>(frame: &'a [u8], f: impl FnOnce(&ParsedFrame<'a>, Option<&IcrcCheck<'a>>) -> R) -> Result<R, WireError> {
    parse_frame_impl::<true, R>(frame, f)
}

/// A WRITE continuation's ICRC, still to be checked
/// ([`parse_frame_deferring`]): the IP packet it covers, the payload's place
/// in it, and the value the frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IcrcCheck<'a> {
    /// The IP packet, from its header to the end of the ICRC.
    packet: &'a [u8],
    /// Length of the IP header.
    ip_len: usize,
    /// Where the payload starts in `packet` (after the BTH: a continuation
    /// has no extension header).
    payload_at: usize,
    /// Payload bytes (pad excluded).
    payload_len: usize,
    /// Where the ICRC starts in `packet` (after the pad).
    icrc_at: usize,
    /// The ICRC the frame carries.
    found: u32,
}

impl IcrcCheck<'_> {
    /// Check the ICRC on its own (IBTA A17.3.3), as [`parse_frame`] does:
    /// for a frame that is not placed, before anything else is done with it.
    pub fn verify(&self) -> Result<(), WireError> {
        let expected = icrc::compute(self.packet, self.ip_len, self.icrc_at)?;
        self.judge(expected)
    }

    /// Copy the payload to `dst` while computing the ICRC over the frame in
    /// the same pass ([`icrc::compute_placing`]), every byte taken from the
    /// frame: the ICRC computed, for [`judge`](Self::judge); `None`, with
    /// nothing written, if the kernel did not take the frame (the parse
    /// defers only frames it takes). The bytes land whatever the ICRC: the
    /// caller places only where a frame with a bad ICRC may leave bytes (a
    /// part of an RDMA WRITE's range that its accepted packets have not
    /// written yet, which the packet retransmitted in its place overwrites
    /// before the WRITE can complete) and changes nothing else for a bad
    /// one. (A plain `u32` back, not a `Result`: the enum written through
    /// memory and read back wider stalled every placed frame.)
    ///
    /// # Safety
    /// `dst` must be valid for writes of [`payload_len`](Self::payload_len)
    /// bytes and must not overlap the frame.
    #[inline]
    pub unsafe fn place(&self, dst: *mut u8) -> Option<u32> {
        // SAFETY: the caller vouches for `dst`.
        unsafe { icrc::compute_placing(self.packet, self.ip_len, self.icrc_at, self.payload_at, self.payload_len, dst) }
    }

    /// Payload bytes [`place`](Self::place) writes.
    pub fn payload_len(&self) -> usize {
        self.payload_len
    }

    /// The bytes [`place`](Self::place) reads (the IP packet, from its
    /// header to its ICRC): its destination must lie apart from them.
    pub fn frame_bytes(&self) -> &[u8] {
        self.packet
    }

    /// `Ok` if `expected` (the ICRC computed over the frame, e.g. by
    /// [`place`](Self::place)) is the one the frame carries, else
    /// [`WireError::BadIcrc`].
    pub fn judge(&self, expected: u32) -> Result<(), WireError> {
        if expected == self.found {
            Ok(())
        } else {
            Err(WireError::BadIcrc { expected, found: self.found })
        }
    }
}

/// [`parse_frame`], handing the parsed frame to `f` (by reference) and
/// returning what `f` returns. The receive path dispatches from inside `f`:
/// the ~230-byte headers are written once, where they are parsed, and
/// neither moved out of nested results (three copies of them per frame were
/// about 175 instructions of a 64 B WRITE's receive, callgrind) nor copied
/// in as a whole placeholder first (a 248-byte `memcpy` per frame, about
/// 30 instructions). `f` runs only for a frame that passed every check.
#[inline(always)]
pub fn parse_frame_with<'a, R>(frame: &'a [u8], f: impl FnOnce(&ParsedFrame<'a>) -> R) -> Result<R, WireError> {
    parse_frame_impl::<false, R>(frame, |p, _| f(p))
}

/// [`parse_frame_with`] and [`parse_frame_deferring`] (`DEFER`).
#[inline(always)]
fn parse_frame_impl<'a, const DEFER: bool, R>(
    frame: &'a [u8],
    f: impl FnOnce(&ParsedFrame<'a>, Option<&IcrcCheck<'a>>) -> R,
) -> Result<R, WireError> {
    let e = EthernetHead::parse(frame)?;
    let (off, ethertype) = (e.len, e.ethertype);
    let version = match ethertype {
        ETHERTYPE_IPV4 => 4,
        ETHERTYPE_IPV6 => 6,
        ethertype => return Err(WireError::NotIp { ethertype }),
    };
    let rest = frame.get(off..).ok_or(WireError::Truncated(Header::Ethernet))?;
    // Placeholders that `parse_ip` overwrites in full. Built from the parsed
    // Ethernet header, the value is not one constant, so it is written field
    // by field (an absent extension header is one tag store) instead of
    // copied from a 248-byte constant with a `memcpy` call.
    let mut p = ParsedFrame {
        repr: FrameRepr {
            // The addresses are copied in below, from the frame to their
            // place: taken into a local first, the two 6-byte arrays were
            // stored in pieces and read back across them (a store-forwarding
            // stall per frame, a third of `Engine::handle_frame`'s samples).
            eth: EthernetRepr { dst: [0; 6], src: [0; 6], vlan: e.vlan, ethertype },
            ip: UNSET_IP,
            udp: UNSET_UDP,
            // Field by field: `UNSET_TRANSPORT` (144 bytes) would be copied
            // with a `memcpy` call.
            transport: TransportRepr {
                bth: BthRepr {
                    opcode: Opcode(0),
                    solicited: false,
                    mig_req: false,
                    pad_count: 0,
                    tver: 0,
                    pkey: 0,
                    fecn: false,
                    becn: false,
                    resv6: 0,
                    dest_qp: 0,
                    ack_req: false,
                    resv7: 0,
                    psn: Psn::new(0),
                },
                deth: None,
                reth: None,
                atomic_eth: None,
                aeth: None,
                atomic_ack: None,
                immediate: None,
                invalidate_rkey: None,
            },
        },
        payload: &[],
        icrc: 0,
    };
    let r = &mut p.repr;
    // Copied as slices (a 4- and a 2-byte move each): a 6-byte array value
    // is assembled from a 2- and a 4-byte load with shifts (7 instructions).
    r.eth.dst.copy_from_slice(&e.bytes[..6]);
    r.eth.src.copy_from_slice(&e.bytes[6..12]);
    let (payload, icrc, check) = parse_ip::<DEFER>(rest, Some(version), &mut r.ip, &mut r.udp, &mut r.transport)?;
    p.payload = payload;
    p.icrc = icrc;
    Ok(f(&p, check.as_ref()))
}

/// Parse and fully check a RoCEv2 packet starting at its IPv4 or IPv6 header
/// (as captured without an Ethernet header, e.g. the vendor CNP vector).
/// Bytes after the IP packet are ignored.
///
/// Checks, in order: the IP header ([`Ipv4Repr::parse`]: version, IHL,
/// total length, header checksum, no fragment; [`Ipv6Repr::parse`]: version,
/// payload length), protocol UDP, the UDP length against the IP length,
/// destination port 4791 (IBTA annex A17, the IANA RoCEv2 port), the
/// BTH and the extension headers of its opcode ([`TransportRepr::parse`]),
/// the pad count (IBTA 9.2: the pad bytes are part of the payload area, so
/// they cannot outnumber it, and payload plus pad is a whole number of
/// 4-byte words), no payload after an opcode that carries none
/// (IBTA 9.3 layouts), and the ICRC (A17.3.3). The content of the pad bytes
/// is not checked (it carries nothing; [`FrameRepr::emit_with`] writes zeros).
pub fn parse_l3(packet: &[u8]) -> Result<ParsedL3<'_>, WireError> {
    let mut ip = UNSET_IP;
    let mut udp = UNSET_UDP;
    let mut transport = UNSET_TRANSPORT;
    let (payload, icrc, _) = parse_ip::<false>(packet, None, &mut ip, &mut udp, &mut transport)?;
    Ok(ParsedL3 { ip, udp, transport, payload, icrc })
}

/// [`parse_l3`]'s work, writing the headers into `ip`, `udp` and
/// `transport`; returns the payload and the (verified) ICRC, or with
/// `DEFER`, for a WRITE continuation [`parse_frame_deferring`] leaves to its
/// receiver, the ICRC as read and the check still to make.
#[inline(always)]
fn parse_ip<'a, const DEFER: bool>(
    packet: &'a [u8],
    want_version: Option<u8>,
    ip_out: &mut IpRepr,
    udp_out: &mut UdpRepr,
    transport: &mut TransportRepr,
) -> Result<(&'a [u8], u32, Option<IcrcCheck<'a>>), WireError> {
    let first = *packet.first().ok_or(match want_version {
        Some(6) => WireError::Truncated(Header::Ipv6),
        _ => WireError::Truncated(Header::Ipv4),
    })?;
    let version = first >> 4;
    if want_version.is_some_and(|w| w != version) {
        return Err(WireError::BadIpVersion(version));
    }
    // The header goes straight into `ip_out`: built in a local and moved
    // there later, the enum was stored in pieces and read back whole (a
    // store-forwarding stall per frame, a third of this function's samples).
    let (ip_len, total) = match version {
        4 => {
            let (v4, hl) = Ipv4Repr::parse(packet)?;
            *ip_out = IpRepr::V4(v4);
            (hl, hl + usize::from(v4.payload_len))
        }
        6 => {
            let (v6, hl) = Ipv6Repr::parse(packet)?;
            *ip_out = IpRepr::V6(v6);
            (hl, hl + usize::from(v6.payload_len))
        }
        v => return Err(WireError::BadIpVersion(v)),
    };
    let protocol = ip_out.protocol();
    if protocol != IPPROTO_UDP {
        return Err(WireError::NotUdp { protocol });
    }
    // The IP parsers checked that `total` fits `packet`.
    let ip_packet = packet.get(..total).ok_or(WireError::BadIpLength)?;
    let udp = UdpRepr::parse(ip_packet.get(ip_len..).unwrap_or(&[]))?;
    if ip_len + usize::from(udp.length) != total {
        return Err(WireError::BadUdpLength);
    }
    if udp.dst_port != ROCEV2_UDP_PORT {
        return Err(WireError::NotRoce { dst_port: udp.dst_port });
    }
    let ib_start = ip_len + UDP_LEN;
    let ib_len = total - ib_start;
    if ib_len < BTH_LEN {
        return Err(WireError::Truncated(Header::Bth));
    }
    if ib_len < BTH_LEN + ICRC_LEN {
        return Err(WireError::Truncated(Header::Icrc));
    }
    let icrc_at = total - ICRC_LEN;
    let ib = ip_packet.get(ib_start..icrc_at).unwrap_or(&[]);
    *udp_out = udp;
    // `transport` is the caller's placeholder for this frame (`parse_frame_with`,
    // `parse_l3`): no extension header in it yet.
    let hdr_len = transport.parse_into_inline::<true>(ib)?;
    let Some(shape) = transport.bth.opcode.shape() else { return Err(WireError::UnknownOpcode(transport.bth.opcode.0)) };
    let body = ib.get(hdr_len..).unwrap_or(&[]);
    let pad = usize::from(transport.bth.pad_count);
    if pad > body.len() {
        return Err(WireError::BadPad { pad: transport.bth.pad_count });
    }
    if !shape.payload() && !body.is_empty() {
        return Err(if pad > 0 { WireError::BadPad { pad: transport.bth.pad_count } } else { WireError::UnexpectedPayload });
    }
    // IBTA 9.2 (PadCnt): payload plus pad fill whole 4-byte words; rxe and
    // ConnectX always pad so. A misaligned body means the pad count is wrong.
    if body.len() % 4 != 0 {
        return Err(WireError::BadPad { pad: transport.bth.pad_count });
    }
    let payload = body.get(..body.len() - pad).unwrap_or(&[]);
    let found = u32::from_le_bytes(icrc::rd_icrc(ip_packet, icrc_at));
    let op = transport.bth.opcode;
    if DEFER
        && payload.len() >= crc::PLACE_MIN
        && (op == Opcode::RC_WRITE_MIDDLE || op == Opcode::RC_WRITE_LAST)
        && (version == 6 || ip_len == IPV4_LEN)
        && crc::place_available()
    {
        // A continuation has no extension header: its payload follows the BTH.
        let payload_at = ib_start + hdr_len;
        let check = IcrcCheck { packet: ip_packet, ip_len, payload_at, payload_len: payload.len(), icrc_at, found };
        return Ok((payload, found, Some(check)));
    }
    let expected = icrc::compute(ip_packet, ip_len, icrc_at)?;
    if found != expected {
        return Err(WireError::BadIcrc { expected, found });
    }
    Ok((payload, found, None))
}

impl FrameRepr {
    fn layout_len(&self) -> Result<usize, WireError> {
        let op = self.transport.bth.opcode;
        let shape = op.shape().ok_or(WireError::UnknownOpcode(op.0))?;
        Ok(BTH_LEN + shape.ext_len())
    }

    /// Bytes the whole frame takes for a payload of `payload_len` bytes
    /// (headers + payload + pad + 4-byte ICRC); 0 for an unknown opcode.
    /// (Saturates instead of overflowing for absurd `payload_len`s, which
    /// [`emit_with`](Self::emit_with) refuses.)
    pub fn frame_len(&self, payload_len: usize) -> usize {
        let ip = self.ip.header_len();
        let ib = self.layout_len().unwrap_or(0);
        if ib == 0 {
            return 0;
        }
        let pad = pad_for(payload_len);
        (self.eth.header_len() + ip + UDP_LEN + ib + pad + ICRC_LEN).saturating_add(payload_len)
    }

    /// Emit the frame with `payload` copied in. Returns the frame length.
    pub fn emit(&self, payload: &[u8], buf: &mut [u8]) -> Result<usize, WireError> {
        self.emit_with(payload.len(), buf, |dst| dst.copy_from_slice(payload))
    }

    /// Emit the frame, calling `fill` with the `payload_len`-byte payload area
    /// so the caller can gather the payload straight into `buf`.
    /// Returns the frame length.
    pub fn emit_with(&self, payload_len: usize, buf: &mut [u8], fill: impl FnOnce(&mut [u8])) -> Result<usize, WireError> {
        self.emit_filled(payload_len, buf, CopyOnly(fill))
    }

    /// [`emit_with`](Self::emit_with) for a `fill` that also continues the
    /// ICRC over the payload it writes: it gets the CRC of everything before
    /// the payload (finished form) and returns it continued over the payload,
    /// e.g. with [`crc::copy_update`], which copies and computes in one pass.
    /// A `fill` that returns anything else makes a frame with a bad ICRC.
    pub fn emit_with_crc(&self, payload_len: usize, buf: &mut [u8], fill: impl FnOnce(&mut [u8], u32) -> u32) -> Result<usize, WireError> {
        self.emit_filled(payload_len, buf, fill)
    }

    /// [`emit_with_crc`](Self::emit_with_crc) with any [`PayloadFill`] (such
    /// a closure is one): a filler that can also just copy lets a small
    /// frame's ICRC be taken in one run.
    pub fn emit_filled(&self, payload_len: usize, buf: &mut [u8], fill: impl PayloadFill) -> Result<usize, WireError> {
        let ib_len = self.layout_len()?;
        let layout_payload = self.transport.bth.opcode.layout().is_some_and(|l| l.payload);
        if payload_len > 0 && !layout_payload {
            return Err(WireError::UnexpectedPayload);
        }
        // Every length below fits a u16 field, so none of the sums overflow.
        if payload_len > usize::from(u16::MAX) {
            return Err(WireError::FieldOverflow);
        }
        let pad = pad_for(payload_len);
        let total = self.frame_len(payload_len);
        let buf = buf.get_mut(..total).ok_or(WireError::BufferTooSmall)?;
        let eth_len = self.eth.emit(buf)?;
        let ip_len = self.ip.header_len();
        let udp_len = UDP_LEN + ib_len + payload_len + pad + ICRC_LEN;
        let udp_len16 = u16::try_from(udp_len).map_err(|_| WireError::FieldOverflow)?;
        let l3 = &mut buf[eth_len..];
        match self.ip {
            IpRepr::V4(mut v4) => {
                v4.payload_len = udp_len16;
                v4.emit(l3)?;
            }
            IpRepr::V6(mut v6) => {
                v6.payload_len = udp_len16;
                v6.emit(l3)?;
            }
        }
        UdpRepr { length: udp_len16, ..self.udp }.emit(&mut l3[ip_len..])?;
        emit_transport_and_icrc(&self.transport, l3, ip_len, payload_len, fill)?;
        Ok(total)
    }
}

/// What writes a frame's payload in place during an emit
/// ([`FrameRepr::emit_with_crc`]): a closure `(dst, crc) -> crc` that copies
/// and continues the ICRC in one pass, or a filler that can also just copy.
pub trait PayloadFill {
    /// Whether [`copy`](Self::copy) costs less than [`copy_crc`](Self::copy_crc)
    /// (it skips the CRC): then a frame whose ICRC covers at most
    /// [`crc::SHORT_MAX`] bytes takes it in one run over headers and payload
    /// together, after the copy.
    const COPIES: bool = false;

    /// Write the payload into `dst` and return `crc` (the CRC of everything
    /// before it, finished form) continued over the bytes written.
    fn copy_crc(self, dst: &mut [u8], crc: u32) -> u32;

    /// [`copy_crc`](Self::copy_crc) continuing a CRC not yet reduced
    /// ([`crc::CrcLane`]), which a fused copy folds into its first lane
    /// ([`crc::copy_update_lane_raw`]); by default the lane is finished and
    /// handed to [`copy_crc`](Self::copy_crc).
    fn copy_crc_lane(self, dst: &mut [u8], lane: crc::CrcLane) -> u32
    where
        Self: Sized,
    {
        self.copy_crc(dst, lane.finish())
    }

    /// Write the payload into `dst`, nothing else (called instead of
    /// [`copy_crc`](Self::copy_crc) only when [`COPIES`](Self::COPIES)).
    fn copy(self, dst: &mut [u8]);
}

impl<F: FnOnce(&mut [u8], u32) -> u32> PayloadFill for F {
    fn copy_crc(self, dst: &mut [u8], crc: u32) -> u32 {
        self(dst, crc)
    }

    fn copy(self, dst: &mut [u8]) {
        // Not called (`COPIES` is false): the closure's CRC has no use here.
        self(dst, 0);
    }
}

/// A [`PayloadFill`] from a closure that only writes the payload.
pub struct CopyOnly<F>(pub F);

impl<F: FnOnce(&mut [u8])> PayloadFill for CopyOnly<F> {
    const COPIES: bool = true;

    fn copy_crc(self, dst: &mut [u8], crc: u32) -> u32 {
        (self.0)(dst);
        crc::update(crc, dst)
    }

    fn copy(self, dst: &mut [u8]) {
        (self.0)(dst);
    }
}

/// The part of an emit after the UDP header, shared by [`FrameRepr`] and
/// [`HeaderTemplate`](super::template::HeaderTemplate): the transport
/// headers at `l3[ip_len + UDP_LEN..]` with the pad count for `payload_len`,
/// the payload through `fill`, zero pad bytes and the ICRC over the IP
/// packet. `l3` must be exactly the IP packet (its length fields already
/// written): headers, payload, pad and ICRC.
#[inline(always)]
pub(super) fn emit_transport_and_icrc<F: PayloadFill>(
    transport: &TransportRepr,
    l3: &mut [u8],
    ip_len: usize,
    payload_len: usize,
    fill: F,
) -> Result<(), WireError> {
    let ib_at = ip_len + UDP_LEN;
    // IBTA 9.2 (PadCnt): the pad this payload needs, whatever the repr says,
    // emitted with the BTH (not written over it afterwards).
    let pad = pad_for(payload_len);
    // The transport headers here, inlined into the frame's builder (the
    // requester's frame, the responder's ACK), where the repr was just
    // made: its constant fields (a requester's P_Key, TVer, FECN/BECN, the
    // reserved bits) fold into the BTH's three words, and a repr without
    // extension headers is not stored to memory for a callee to read back.
    let ib_len = transport.emit_with_pad(l3.get_mut(ib_at..).ok_or(WireError::BufferTooSmall)?, pad as u8)?;
    emit_payload_and_icrc(l3, ip_len, ib_at + ib_len, payload_len, pad, fill)
}

/// The rest of [`emit_transport_and_icrc`] once the transport headers are
/// in `l3[ip_len + UDP_LEN..payload_at]`: the payload through `fill`, `pad`
/// zero bytes and the ICRC over the IP packet; out of line (the copy's CRC
/// lane set-up is the bulk of it).
#[inline(never)]
fn emit_payload_and_icrc<F: PayloadFill>(
    l3: &mut [u8],
    ip_len: usize,
    payload_at: usize,
    payload_len: usize,
    pad: usize,
    fill: F,
) -> Result<(), WireError> {
    if l3.len() != payload_at + payload_len + pad + ICRC_LEN {
        return Err(WireError::BufferTooSmall);
    }
    let end = payload_at + payload_len + pad;
    if F::COPIES && end <= crc::SHORT_MAX {
        // A small packet (a 64 B WRITE's 120 bytes): the payload copied and
        // the pad zeroed first, then the ICRC over all of it in one masked
        // run, instead of a run over the headers continued over the payload.
        let (_, tail) = l3.split_at_mut(payload_at);
        let (payload, tail) = tail.split_at_mut(payload_len);
        fill.copy(payload);
        tail[..pad].fill(0);
        let crc = icrc::compute(l3, ip_len, end)?;
        l3[end..].copy_from_slice(&crc.to_le_bytes());
        return Ok(());
    }
    // The ICRC over the headers, the payload as `fill` writes it, the pad:
    // the headers' CRC handed on unreduced where the kernel can.
    let lane = icrc::headers_lane(l3, ip_len, payload_at)?;
    let head = match lane {
        Some(_) => 0,
        None => icrc::headers(l3, ip_len, payload_at)?,
    };
    let (_, tail) = l3.split_at_mut(payload_at);
    let (payload, tail) = tail.split_at_mut(payload_len);
    let crc = match lane {
        Some(lane) => fill.copy_crc_lane(payload, lane),
        None => fill.copy_crc(payload, head),
    };
    let (pad_bytes, icrc_bytes) = tail.split_at_mut(pad);
    // A payload of whole words (every data frame but a message's last)
    // has no pad: no call of `crc::update` (out of line here, it tests
    // for the empty run itself after the call: about 17 instructions).
    let crc = if pad == 0 {
        crc
    } else {
        pad_bytes.fill(0);
        crc::update(crc, pad_bytes)
    };
    icrc_bytes.copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// Offset of the BTH in an Ethernet frame carrying RoCEv2 (IPv4 or IPv6,
/// optionally VLAN-tagged), from the headers' length fields alone (no
/// validation beyond "UDP"). `None` if the frame is too short or not UDP.
fn peek_bth_offset(frame: &[u8]) -> Option<usize> {
    let mut off = ETHERNET_LEN - 2;
    let mut ethertype = u16::from_be_bytes([*frame.get(off)?, *frame.get(off + 1)?]);
    // an 802.1Q tag, or an 802.1ad service tag (0x88a8) in its place
    if ethertype == ETHERTYPE_VLAN || ethertype == 0x88a8 {
        off += 4;
        ethertype = u16::from_be_bytes([*frame.get(off)?, *frame.get(off + 1)?]);
    }
    off += 2;
    let udp = match ethertype {
        ETHERTYPE_IPV4 => {
            let ihl = usize::from(frame.get(off)? & 0x0f) * 4;
            if ihl < IPV4_LEN || *frame.get(off + 9)? != IPPROTO_UDP {
                return None;
            }
            off + ihl
        }
        ETHERTYPE_IPV6 => {
            if *frame.get(off + 6)? != IPPROTO_UDP {
                return None;
            }
            off + IPV6_LEN
        }
        _ => return None,
    };
    Some(udp + UDP_LEN)
}

/// The destination QPN of an Ethernet frame carrying RoCEv2, without
/// validating anything else (no ICRC): for steering a frame to the shard
/// that owns its QP before the full parse. `None` if the frame is too short
/// or not IPv4/IPv6 + UDP.
pub fn peek_dest_qpn(frame: &[u8]) -> Option<u32> {
    let bth = peek_bth_offset(frame)?;
    let q = frame.get(bth + 5..bth + 8)?;
    Some(u32::from_be_bytes([0, q[0], q[1], q[2]]))
}

/// The BTH opcode of an Ethernet frame carrying RoCEv2, unvalidated like
/// [`peek_dest_qpn`] (for frames we built ourselves, or steering).
pub fn peek_opcode(frame: &[u8]) -> Option<Opcode> {
    frame.get(peek_bth_offset(frame)?).map(|&o| Opcode(o))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::psn::Psn;
    use crate::wire::{BthRepr, RethRepr};

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    const CX4_CNP: &str = "e41d2dab2bc27cfe90643b32080045c2003c718c4000401191610a0011010a001201000012b7002800008100ffff40000118000000000000000000000000000000000000000082fd002a";
    const VENDOR_CNP: &str =
        "4589003C98C64000201169271616160816161607DBAE12B7002800008100FFFF400000D20000000000000000000000000000000000000000DAFC1BEF";

    #[test]
    fn hardware_cnps_parse_and_reemit() {
        let f = hex(CX4_CNP);
        let p = parse_frame(&f).unwrap();
        assert_eq!(p.repr.transport.bth.opcode, Opcode::CNP);
        assert!(p.repr.transport.bth.becn);
        assert_eq!(p.repr.transport.bth.dest_qp, 0x118);
        assert_eq!(p.repr.udp.src_port, 0);
        let mut out = vec![0u8; f.len()];
        assert_eq!(p.repr.emit(p.payload, &mut out).unwrap(), f.len());
        assert_eq!(out, f);

        let v = hex(VENDOR_CNP);
        let l3 = parse_l3(&v).unwrap();
        assert_eq!(l3.icrc, 0xEF1B_FCDA);
        assert_eq!(l3.transport.bth.dest_qp, 0xd2);
    }

    fn sample() -> FrameRepr {
        FrameRepr {
            eth: EthernetRepr { dst: [2, 0, 0, 0, 0, 2], src: [2, 0, 0, 0, 0, 1], vlan: None, ethertype: ETHERTYPE_IPV4 },
            ip: IpRepr::V4(Ipv4Repr {
                src: [10, 0, 0, 1],
                dst: [10, 0, 0, 2],
                dscp: 0,
                ecn: 2,
                ident: 7,
                dont_frag: true,
                ttl: 64,
                protocol: 17,
                payload_len: 0,
            }),
            udp: UdpRepr { src_port: 0xc000, dst_port: 4791, length: 0, checksum: 0 },
            transport: TransportRepr {
                bth: BthRepr { ack_req: true, ..BthRepr::new(Opcode::RC_WRITE_ONLY, 0x11, Psn::new(5)) },
                deth: None,
                reth: Some(RethRepr { va: 0x1000, rkey: 0x1234, dma_len: 5 }),
                atomic_eth: None,
                aeth: None,
                atomic_ack: None,
                immediate: None,
                invalidate_rkey: None,
            },
        }
    }

    #[test]
    fn emit_parse_with_pad() {
        let r = sample();
        let mut buf = [0u8; 256];
        let n = r.emit(b"hello", &mut buf).unwrap();
        assert_eq!(n, r.frame_len(5));
        let p = parse_frame(&buf[..n]).unwrap();
        assert_eq!(p.payload, b"hello");
        assert_eq!(p.repr.transport.bth.pad_count, 3);
        assert_eq!(p.repr.transport.reth, r.transport.reth);
    }

    #[test]
    fn errors_name_the_problem() {
        let r = sample();
        let mut buf = [0u8; 256];
        let n = r.emit(b"hello!!!", &mut buf).unwrap();
        let f = &buf[..n];
        let mut bad = f.to_vec();
        bad[n - 1] ^= 1;
        assert!(matches!(parse_frame(&bad), Err(WireError::BadIcrc { .. })));
        let mut bad = f.to_vec();
        bad[70] ^= 0x80; // payload bit
        assert!(matches!(parse_frame(&bad), Err(WireError::BadIcrc { .. })));
        let mut bad = f.to_vec();
        bad[36] = 0x12;
        bad[37] = 0x34; // UDP dst port
        assert_eq!(parse_frame(&bad), Err(WireError::NotRoce { dst_port: 0x1234 }));
        let mut bad = f.to_vec();
        bad[12] = 0x08;
        bad[13] = 0x06;
        assert_eq!(parse_frame(&bad), Err(WireError::NotIp { ethertype: 0x0806 }));
        assert_eq!(parse_frame(&f[..30]), Err(WireError::Truncated(Header::Ipv4)));
        assert_eq!(parse_frame(&f[..n - 1]), Err(WireError::BadIpLength));
        let mut bad = f.to_vec();
        bad[24] ^= 1; // IPv4 TTL without fixing the header checksum
        assert_eq!(parse_frame(&bad), Err(WireError::BadIpv4Checksum));
        let mut bad = f.to_vec();
        bad[42] = 0x15; // opcode
        assert_eq!(parse_frame(&bad), Err(WireError::UnknownOpcode(0x15)));
        let mut bad = f.to_vec();
        bad[42] = Opcode::RC_ACK.0; // ACK with payload bytes after its AETH
        assert!(matches!(parse_frame(&bad), Err(WireError::UnexpectedPayload) | Err(WireError::BadPad { .. })));
        let mut ack = r;
        ack.transport.bth.opcode = Opcode::RC_ACK;
        assert_eq!(ack.emit(b"x", &mut buf), Err(WireError::UnexpectedPayload));
        assert_eq!(r.emit(b"hello", &mut [0u8; 20]), Err(WireError::BufferTooSmall));
    }

    #[test]
    fn ipv6_frame_roundtrip() {
        let mut r = sample();
        r.eth.ethertype = ETHERTYPE_IPV6;
        r.ip = IpRepr::V6(Ipv6Repr {
            src: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            dst: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
            traffic_class: 0x62,
            flow_label: 0x12345,
            next_header: 17,
            hop_limit: 64,
            payload_len: 0,
        });
        let mut buf = [0u8; 512];
        let n = r.emit(&[9u8; 100], &mut buf).unwrap();
        let p = parse_frame(&buf[..n]).unwrap();
        assert_eq!(p.payload, &[9u8; 100][..]);
        // the ICRC ignores the variant fields
        let mut v = buf[..n].to_vec();
        v[15] ^= 0xff; // traffic class / flow label bits
        v[21] = 1; // hop limit
        assert!(parse_frame(&v).is_ok());
    }
}
