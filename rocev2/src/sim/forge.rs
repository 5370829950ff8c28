//! Forged RoCEv2 frames: what a hostile third host on the segment can send
//! at a connected (RC) QP.
//!
//! An attacker on the same Ethernet segment sees the traffic of a QP pair:
//! both hosts' MAC and IP addresses, both QPNs, the PSNs in flight and the
//! R_Keys and addresses of RDMA requests. From such a [`VictimView`] and its
//! own [`Station`], [`forge`] builds one well-formed frame (correct lengths,
//! IPv4 header checksum and ICRC, so it passes every wire check) of an
//! [`Attack`] class, and [`Attack::expect`] says how a receiver that follows
//! urnic's rules counts it (issue 14, "hostile peers"):
//!
//! - frames from a stranger's address, or to an address that is not the
//!   victim QP's own, are dropped as `rx_wrong_peer` (rxe `check_addr`);
//! - requests that spoof the peer but carry a PSN far behind the expected
//!   one are duplicates (IBTA C9-105: SEND/WRITE re-acknowledged, never
//!   executed again; READ/atomic without a saved resource dropped);
//!   far ahead, a PSN sequence error (one NAK, then silence);
//! - responses that spoof the peer are valid only for outstanding PSNs:
//!   older ones are stale (`req_stale_responses`), ones at or after the next
//!   PSN ghosts (`req_ghost_responses`), so a forged error NAK never fails
//!   a WR or moves the QP to ERR.
//!
//! Some classes are indistinguishable from the real peer (its address and
//! an in-window PSN): a receiver acts on them, as rxe and ConnectX do; they
//! are marked by [`Attack::model_safe`] `== false` and [`Expect::Accepted`].
//!
//! Sans-IO and deterministic: the same attack, view, attacker and `rng_bits`
//! give the same bytes. Nothing here panics; emission errors are returned.
//! Used by the simulator's adversary ([`crate::sim::adversary`]), and meant
//! for injecting over raw sockets in veth tests and soak tools.

use std::net::IpAddr;

use crate::psn::Psn;
use crate::sim::rc::HostAddr;
use crate::transport::attr::AddressVector;
use crate::wire::{sport, Opcode, WireError, ROCEV2_UDP_PORT};
use crate::wire::{
    AckSyndrome, AethRepr, AtomicEthRepr, BthRepr, EthernetRepr, FrameRepr, IpRepr, Ipv4Repr, Ipv6Repr, MacAddr, NakCode, RethRepr, TransportRepr,
    UdpRepr,
};
use crate::wire::{ETHERTYPE_IPV4, ETHERTYPE_IPV6, IPPROTO_UDP};

/// A station on the segment: its MAC and IP address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Station {
    /// MAC address.
    pub mac: MacAddr,
    /// IP address (an IPv4-mapped IPv6 address is treated as IPv4).
    pub ip: IpAddr,
}

impl Station {
    /// The station's GID: IPv4 as `::ffff:a.b.c.d`, IPv6 as is.
    pub fn gid(&self) -> [u8; 16] {
        match self.ip {
            IpAddr::V4(v4) => AddressVector::ipv4_gid(v4.octets()),
            IpAddr::V6(v6) => v6.octets(),
        }
    }

    fn v4(&self) -> Option<[u8; 4]> {
        let g = self.gid();
        AddressVector::is_ipv4_mapped(&g).then(|| [g[12], g[13], g[14], g[15]])
    }
}

impl From<&HostAddr> for Station {
    fn from(h: &HostAddr) -> Station {
        let ip = if AddressVector::is_ipv4_mapped(&h.gid) { IpAddr::from([h.gid[12], h.gid[13], h.gid[14], h.gid[15]]) } else { IpAddr::from(h.gid) };
        Station { mac: h.mac, ip }
    }
}

/// What the attacker knows (or guesses) about one connected QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VictimView {
    /// The host the forged frame is for.
    pub victim: Station,
    /// The victim QP's real peer (whose address a spoofing attack uses).
    pub peer: Station,
    /// The victim's QPN (the forged frame's DestQP).
    pub qpn: u32,
    /// The peer's QPN (picks the UDP source port the peer itself uses).
    pub peer_qpn: u32,
    /// The PSN the victim's responder expects next: the PSN of the peer's
    /// next new request (seen on the wire as the last request PSN + 1).
    pub rq_psn: Psn,
    /// The victim requester's next PSN (its last request PSN + 1).
    pub sq_psn: Psn,
    /// The victim requester's oldest unacknowledged PSN (the last ACK's
    /// PSN + 1); equal to `sq_psn` when nothing is outstanding.
    pub una: Psn,
    /// An R_Key of the victim's memory (from a sniffed RETH).
    pub rkey: u32,
    /// A virtual address inside that memory region.
    pub va: u64,
}

/// How a receiver following urnic's rules counts a forged frame, for a
/// victim QP in RTS (a QP in another state refuses everything as
/// `rx_wrong_state`, responses also in RTR). Counter names are those of
/// `EngineStats::iter` ([`Counter::Engine`]) and `QpStats::iter`
/// ([`Counter::Qp`], the victim QP's counters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Each of these counters goes up by exactly one, and the frame changes
    /// nothing else that matters: no WR completes or fails, no memory is
    /// written, the QP stays in RTS.
    Counted(&'static [Counter]),
    /// Exactly one of these goes up by one (which one depends on the QP's
    /// state, e.g. whether a sequence NAK is already outstanding); otherwise
    /// as [`Expect::Counted`].
    OneOf(&'static [Counter]),
    /// Indistinguishable from the real peer: the victim acts on it (the
    /// documented limit of an unauthenticated transport; rxe and ConnectX
    /// behave the same). Counted as the real thing would be.
    Accepted,
}

/// A counter named as in `EngineStats::iter` / `QpStats::iter`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Counter {
    /// An engine-wide counter (`EngineStats`).
    Engine(&'static str),
    /// A counter of the victim QP (`QpStats`).
    Qp(&'static str),
}

impl Counter {
    /// The counter's name.
    pub const fn name(self) -> &'static str {
        match self {
            Counter::Engine(n) | Counter::Qp(n) => n,
        }
    }
}

const WRONG_PEER: &[Counter] = &[Counter::Engine("rx_wrong_peer")];
const STALE: &[Counter] = &[Counter::Qp("req_stale_responses")];
const GHOST: &[Counter] = &[Counter::Qp("req_ghost_responses")];
const DUP: &[Counter] = &[Counter::Qp("resp_duplicates")];
const DUP_DROPPED: &[Counter] = &[Counter::Qp("resp_duplicates"), Counter::Qp("resp_dup_no_resource_dropped")];
const AHEAD: &[Counter] = &[Counter::Qp("resp_naks_psn_seq_sent"), Counter::Qp("resp_out_of_seq_dropped")];
const DUP_NAK: &[Counter] = &[Counter::Qp("req_duplicate_naks")];

/// A request operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReqOp {
    /// SEND ONLY with a payload.
    Send,
    /// RDMA WRITE ONLY with a payload, to the view's R_Key and address.
    Write,
    /// RDMA READ request of the view's R_Key and address.
    Read,
    /// FETCH_ADD on the view's R_Key and (8-aligned) address.
    Atomic,
}

/// A response kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RespOp {
    /// Positive ACK.
    Ack,
    /// NAK Invalid Request.
    NakInvalid,
    /// NAK Remote Access Error.
    NakAccess,
    /// NAK Remote Operational Error.
    NakRemoteOp,
    /// NAK PSN Sequence Error.
    NakSeq,
    /// RNR NAK.
    RnrNak,
    /// READ RESPONSE ONLY with a payload.
    ReadResponse,
    /// Atomic ACK.
    AtomicAck,
}

impl RespOp {
    /// Every response kind.
    pub const ALL: [RespOp; 8] = [
        RespOp::Ack,
        RespOp::NakInvalid,
        RespOp::NakAccess,
        RespOp::NakRemoteOp,
        RespOp::NakSeq,
        RespOp::RnrNak,
        RespOp::ReadResponse,
        RespOp::AtomicAck,
    ];
}

/// An attack class: who the frame claims to come from, what it is and
/// which PSN it carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Attack {
    /// A request from the attacker's own address at the in-window PSN
    /// (`rq_psn`): `rx_wrong_peer`.
    StrangerRequest(ReqOp),
    /// An RDMA WRITE from the peer's address but to an IP address that is
    /// not the victim's (the victim's MAC), at the in-window PSN: `rx_wrong_peer`.
    MisaddressedWrite,
    /// A request spoofing the peer, PSN 4..5 Mi behind `rq_psn`: a
    /// duplicate (SEND/WRITE re-acknowledged, READ/atomic dropped without
    /// a saved resource).
    StaleRequest(ReqOp),
    /// A request spoofing the peer, PSN 64 Ki..4 Mi ahead of `rq_psn`: a
    /// PSN sequence error (NAK once, then dropped).
    AheadRequest(ReqOp),
    /// A response spoofing the peer, PSN 4..5 Mi behind `sq_psn`: stale.
    StaleResponse(RespOp),
    /// A response spoofing the peer, PSN 64 Ki..4 Mi after `sq_psn` (never
    /// sent): a ghost.
    GhostResponse(RespOp),
    /// A response from the attacker's address at the victim's last sent PSN
    /// (`sq_psn - 1`, outstanding if anything is): `rx_wrong_peer`.
    StrangerResponse(RespOp),
    /// A CNP from the attacker's address: `rx_wrong_peer`.
    StrangerCnp,
    /// A PSN sequence NAK spoofing the peer at `una`: sent right after the
    /// peer's own sequence NAK for that PSN (a duplicated copy), it repeats a
    /// retry already under way: `req_duplicate_naks`, no retry used up.
    SeqNakCopy,
    /// Limit: an RDMA WRITE spoofing the peer at the in-window PSN. Executed.
    PeerWriteInWindow,
    /// Limit: a Remote Access Error NAK spoofing the peer at `una` while
    /// something is outstanding. Fails the WR, QP to ERR.
    PeerErrorNakOutstanding,
    /// Limit: a CNP spoofing the peer. Accepted (slows the QP down).
    PeerCnp,
}

const REQ_OPS: [ReqOp; 4] = [ReqOp::Send, ReqOp::Write, ReqOp::Read, ReqOp::Atomic];

impl Attack {
    /// Every attack class.
    pub const ALL: [Attack; 42] = {
        let mut all = [Attack::StrangerCnp; 42];
        let mut n = 0;
        let mut i = 0;
        while i < 4 {
            all[n] = Attack::StrangerRequest(REQ_OPS[i]);
            all[n + 1] = Attack::StaleRequest(REQ_OPS[i]);
            all[n + 2] = Attack::AheadRequest(REQ_OPS[i]);
            n += 3;
            i += 1;
        }
        let mut j = 0;
        while j < 8 {
            all[n] = Attack::StaleResponse(RespOp::ALL[j]);
            all[n + 1] = Attack::GhostResponse(RespOp::ALL[j]);
            all[n + 2] = Attack::StrangerResponse(RespOp::ALL[j]);
            n += 3;
            j += 1;
        }
        all[n] = Attack::MisaddressedWrite;
        all[n + 1] = Attack::StrangerCnp;
        all[n + 2] = Attack::SeqNakCopy;
        all[n + 3] = Attack::PeerWriteInWindow;
        all[n + 4] = Attack::PeerErrorNakOutstanding;
        all[n + 5] = Attack::PeerCnp;
        all
    };

    /// A short stable name, e.g. `"stale_response_nak_access"`.
    pub const fn name(self) -> &'static str {
        use Attack::*;
        match self {
            StrangerRequest(ReqOp::Send) => "stranger_send",
            StrangerRequest(ReqOp::Write) => "stranger_write",
            StrangerRequest(ReqOp::Read) => "stranger_read",
            StrangerRequest(ReqOp::Atomic) => "stranger_atomic",
            MisaddressedWrite => "misaddressed_write",
            StaleRequest(ReqOp::Send) => "stale_send",
            StaleRequest(ReqOp::Write) => "stale_write",
            StaleRequest(ReqOp::Read) => "stale_read",
            StaleRequest(ReqOp::Atomic) => "stale_atomic",
            AheadRequest(ReqOp::Send) => "ahead_send",
            AheadRequest(ReqOp::Write) => "ahead_write",
            AheadRequest(ReqOp::Read) => "ahead_read",
            AheadRequest(ReqOp::Atomic) => "ahead_atomic",
            StaleResponse(r) => match r {
                RespOp::Ack => "stale_ack",
                RespOp::NakInvalid => "stale_nak_invalid",
                RespOp::NakAccess => "stale_nak_access",
                RespOp::NakRemoteOp => "stale_nak_remote_op",
                RespOp::NakSeq => "stale_nak_seq",
                RespOp::RnrNak => "stale_rnr_nak",
                RespOp::ReadResponse => "stale_read_response",
                RespOp::AtomicAck => "stale_atomic_ack",
            },
            GhostResponse(r) => match r {
                RespOp::Ack => "ghost_ack",
                RespOp::NakInvalid => "ghost_nak_invalid",
                RespOp::NakAccess => "ghost_nak_access",
                RespOp::NakRemoteOp => "ghost_nak_remote_op",
                RespOp::NakSeq => "ghost_nak_seq",
                RespOp::RnrNak => "ghost_rnr_nak",
                RespOp::ReadResponse => "ghost_read_response",
                RespOp::AtomicAck => "ghost_atomic_ack",
            },
            StrangerResponse(r) => match r {
                RespOp::Ack => "stranger_ack",
                RespOp::NakInvalid => "stranger_nak_invalid",
                RespOp::NakAccess => "stranger_nak_access",
                RespOp::NakRemoteOp => "stranger_nak_remote_op",
                RespOp::NakSeq => "stranger_nak_seq",
                RespOp::RnrNak => "stranger_rnr_nak",
                RespOp::ReadResponse => "stranger_read_response",
                RespOp::AtomicAck => "stranger_atomic_ack",
            },
            StrangerCnp => "stranger_cnp",
            SeqNakCopy => "seq_nak_copy",
            PeerWriteInWindow => "peer_write_in_window",
            PeerErrorNakOutstanding => "peer_error_nak_outstanding",
            PeerCnp => "peer_cnp",
        }
    }

    /// How a receiver following urnic's rules counts the frame (victim QP
    /// in RTS). [`Attack::SeqNakCopy`] assumes it follows the peer's own
    /// sequence NAK at `una` with no progress in between.
    pub const fn expect(self) -> Expect {
        use Attack::*;
        match self {
            StrangerRequest(_) | MisaddressedWrite | StrangerResponse(_) | StrangerCnp => Expect::Counted(WRONG_PEER),
            StaleRequest(ReqOp::Send | ReqOp::Write) => Expect::Counted(DUP),
            StaleRequest(ReqOp::Read | ReqOp::Atomic) => Expect::Counted(DUP_DROPPED),
            AheadRequest(_) => Expect::OneOf(AHEAD),
            StaleResponse(_) => Expect::Counted(STALE),
            GhostResponse(_) => Expect::Counted(GHOST),
            SeqNakCopy => Expect::Counted(DUP_NAK),
            PeerWriteInWindow | PeerErrorNakOutstanding | PeerCnp => Expect::Accepted,
        }
    }

    /// Whether a receiver can keep every WR's outcome and all memory exactly
    /// as without the attack: false for the classes a receiver cannot tell
    /// from its peer, which change what happens (a WRITE executed, a WR
    /// failed). [`Attack::PeerCnp`] is accepted but only slows the QP down.
    pub const fn model_safe(self) -> bool {
        !matches!(self, Attack::PeerWriteInWindow | Attack::PeerErrorNakOutstanding)
    }

    /// Whether the frame claims the peer's IP address as its source.
    pub const fn spoofs_peer(self) -> bool {
        !matches!(self, Attack::StrangerRequest(_) | Attack::StrangerResponse(_) | Attack::StrangerCnp)
    }

    /// Whether the frame is a request (for the victim's responder); the
    /// others are responses (for its requester) or CNPs.
    pub const fn is_request(self) -> bool {
        matches!(
            self,
            Attack::StrangerRequest(_) | Attack::MisaddressedWrite | Attack::StaleRequest(_) | Attack::AheadRequest(_) | Attack::PeerWriteInWindow
        )
    }
}

impl core::fmt::Display for Attack {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// What [`forge`] built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Forged {
    /// The frame's opcode.
    pub opcode: Opcode,
    /// The frame's PSN.
    pub psn: Psn,
    /// Frame length (the bytes appended to `out`).
    pub len: usize,
}

/// splitmix64: the next value of a small deterministic generator.
fn mix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// PSN offsets: far enough from the live window that no real traffic
/// reaches them while a forged frame is in flight (a QP of the simulator
/// has at most a few ten thousand packets outstanding).
const FAR_BEHIND: u32 = 0x40_0000;
const FAR_AHEAD: u32 = 0x1_0000;
const SPREAD: u32 = 0x10_0000;

/// Build the frame of `attack` against the QP of `v`, sent by `attacker`,
/// and append it to `out`. Deterministic in `rng_bits` (PSN offsets,
/// payload lengths and bytes, MSN, UDP source port of a stranger, atomic
/// operands). The frame passes `wire::parse_frame` (lengths, checksums,
/// ICRC). Errors only if a header cannot be encoded (none of the classes'
/// fixed sizes can fail).
pub fn forge(attack: Attack, v: &VictimView, attacker: &Station, rng_bits: u64, out: &mut Vec<u8>) -> Result<Forged, WireError> {
    use Attack::*;
    let mut rng = rng_bits;
    let r0 = mix(&mut rng);
    let r1 = mix(&mut rng);
    let behind = FAR_BEHIND + (r0 as u32) % SPREAD;
    let ahead = FAR_AHEAD + (r0 as u32) % (4 * SPREAD - FAR_AHEAD);
    // Source and destination addresses of the frame.
    let (src, dst_ip) = match attack {
        StrangerRequest(_) | StrangerResponse(_) | StrangerCnp => (*attacker, v.victim.ip),
        MisaddressedWrite => (v.peer, attacker.ip),
        _ => (v.peer, v.victim.ip),
    };
    let dst = Station { mac: v.victim.mac, ip: dst_ip };
    // The peer's own UDP source port when spoofing it; a random one otherwise.
    let sport = if attack.spoofs_peer() { sport::rc_sport(v.peer_qpn, v.qpn) } else { 0xc000 | (r1 as u16 & 0x3fff) };
    let msn = (r1 >> 16) as u32 & 0xff_ffff;
    let payload_len = 1 + (r1 >> 40) as usize % 256;
    let (transport, payload_len) = match attack {
        StrangerRequest(op) => request(op, v, v.rq_psn, r1, payload_len),
        MisaddressedWrite | PeerWriteInWindow => request(ReqOp::Write, v, v.rq_psn, r1, payload_len),
        StaleRequest(op) => request(op, v, v.rq_psn.sub(behind), r1, payload_len),
        AheadRequest(op) => request(op, v, v.rq_psn.add(ahead), r1, payload_len),
        StaleResponse(op) => response(op, v.qpn, v.sq_psn.sub(behind), msn, r1, payload_len),
        GhostResponse(op) => response(op, v.qpn, v.sq_psn.add(ahead), msn, r1, payload_len),
        StrangerResponse(op) => response(op, v.qpn, v.sq_psn.sub(1), msn, r1, payload_len),
        SeqNakCopy => response(RespOp::NakSeq, v.qpn, v.una, msn, r1, 0),
        PeerErrorNakOutstanding => response(RespOp::NakAccess, v.qpn, v.una, msn, r1, 0),
        StrangerCnp | PeerCnp => (TransportRepr::bth_only(BthRepr { becn: true, ..BthRepr::new(Opcode::CNP, v.qpn, Psn::new(0)) }), 0),
    };
    let repr = frame_repr(&src, &dst, sport, transport, attack, r1);
    let len = repr.frame_len(payload_len);
    let start = out.len();
    out.resize(start + len, 0);
    let mut fill_state = r1 ^ 0x5a5a_5a5a_5a5a_5a5a;
    let written = repr.emit_with(payload_len, &mut out[start..], |p| {
        for chunk in p.chunks_mut(8) {
            let x = mix(&mut fill_state).to_le_bytes();
            chunk.copy_from_slice(&x[..chunk.len()]);
        }
    });
    match written {
        Ok(n) => {
            out.truncate(start + n);
            Ok(Forged { opcode: transport.bth.opcode, psn: transport.bth.psn, len: n })
        }
        Err(e) => {
            out.truncate(start);
            Err(e)
        }
    }
}

/// Replay an observed frame at another PSN: the same headers and payload
/// with the BTH PSN set to `psn` and the IPv4 checksum and ICRC made right
/// again, appended to `out`. With the peer's frame and the victim's
/// expected PSN this is the attack no unauthenticated receiver can refuse
/// (an old WRITE executed a second time, [`Attack::PeerWriteInWindow`]).
/// Errors: whatever [`crate::wire::parse_frame`] finds wrong with `frame`.
pub fn replay_at(frame: &[u8], psn: Psn, out: &mut Vec<u8>) -> Result<Forged, WireError> {
    let p = crate::wire::parse_frame(frame)?;
    let mut repr = p.repr;
    repr.transport.bth.psn = psn;
    let len = repr.frame_len(p.payload.len());
    let start = out.len();
    out.resize(start + len, 0);
    match repr.emit(p.payload, &mut out[start..]) {
        Ok(n) => {
            out.truncate(start + n);
            Ok(Forged { opcode: repr.transport.bth.opcode, psn, len: n })
        }
        Err(e) => {
            out.truncate(start);
            Err(e)
        }
    }
}

fn request(op: ReqOp, v: &VictimView, psn: Psn, r: u64, payload_len: usize) -> (TransportRepr, usize) {
    let reth = RethRepr { va: v.va, rkey: v.rkey, dma_len: payload_len as u32 };
    let (opcode, payload) = match op {
        ReqOp::Send => (Opcode::RC_SEND_ONLY, payload_len),
        ReqOp::Write => (Opcode::RC_WRITE_ONLY, payload_len),
        ReqOp::Read => (Opcode::RC_READ_REQUEST, 0),
        ReqOp::Atomic => (Opcode::RC_FETCH_ADD, 0),
    };
    let mut t = TransportRepr::bth_only(BthRepr { ack_req: true, ..BthRepr::new(opcode, v.qpn, psn) });
    match op {
        ReqOp::Send => {}
        ReqOp::Write => t.reth = Some(reth),
        ReqOp::Read => t.reth = Some(RethRepr { dma_len: 1 + (r >> 20) as u32 % 4096, ..reth }),
        ReqOp::Atomic => {
            t.atomic_eth = Some(AtomicEthRepr { va: v.va & !7, rkey: v.rkey, swap_add: r | 1, compare: 0 });
        }
    }
    (t, payload)
}

fn response(op: RespOp, qpn: u32, psn: Psn, msn: u32, r: u64, payload_len: usize) -> (TransportRepr, usize) {
    let syndrome = match op {
        RespOp::Ack | RespOp::ReadResponse | RespOp::AtomicAck => AckSyndrome::Ack { credits: 0x1f },
        RespOp::NakInvalid => AckSyndrome::Nak(NakCode::InvalidRequest),
        RespOp::NakAccess => AckSyndrome::Nak(NakCode::RemoteAccessError),
        RespOp::NakRemoteOp => AckSyndrome::Nak(NakCode::RemoteOperationalError),
        RespOp::NakSeq => AckSyndrome::Nak(NakCode::PsnSequenceError),
        RespOp::RnrNak => AckSyndrome::RnrNak { timer: (r >> 8) as u8 & 0x1f },
    };
    let opcode = match op {
        RespOp::ReadResponse => Opcode::RC_READ_RESPONSE_ONLY,
        RespOp::AtomicAck => Opcode::RC_ATOMIC_ACK,
        _ => Opcode::RC_ACK,
    };
    let mut t = TransportRepr::bth_only(BthRepr::new(opcode, qpn, psn));
    t.aeth = Some(AethRepr { syndrome, msn });
    if op == RespOp::AtomicAck {
        t.atomic_ack = Some(r);
    }
    (t, if op == RespOp::ReadResponse { payload_len } else { 0 })
}

fn frame_repr(src: &Station, dst: &Station, sport: u16, transport: TransportRepr, attack: Attack, r: u64) -> FrameRepr {
    let cnp = matches!(attack, Attack::StrangerCnp | Attack::PeerCnp);
    // A CNP as ConnectX sends it: ECT(0), UDP source port 0 (A17.9.3).
    let ecn = if cnp { 2 } else { 0 };
    let ip = match (src.v4(), dst.v4()) {
        (Some(s), Some(d)) => IpRepr::V4(Ipv4Repr {
            src: s,
            dst: d,
            dscp: 0,
            ecn,
            ident: (r >> 48) as u16,
            dont_frag: true,
            ttl: 64,
            protocol: IPPROTO_UDP,
            payload_len: 0,
        }),
        // Mixed families: IPv6 framing with IPv4-mapped addresses.
        _ => IpRepr::V6(Ipv6Repr {
            src: src.gid(),
            dst: dst.gid(),
            traffic_class: ecn,
            flow_label: 0,
            next_header: IPPROTO_UDP,
            hop_limit: 64,
            payload_len: 0,
        }),
    };
    let ethertype = if matches!(ip, IpRepr::V4(_)) { ETHERTYPE_IPV4 } else { ETHERTYPE_IPV6 };
    FrameRepr {
        eth: EthernetRepr { dst: dst.mac, src: src.mac, vlan: None, ethertype },
        ip,
        udp: UdpRepr { src_port: if cnp { 0 } else { sport }, dst_port: ROCEV2_UDP_PORT, length: 0, checksum: 0 },
        transport,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{icrc, parse_frame};
    use std::collections::HashSet;

    fn view(v6: bool) -> (VictimView, Station) {
        let (a, b, c) =
            if v6 { (HostAddr::ipv6(1), HostAddr::ipv6(2), HostAddr::ipv6(66)) } else { (HostAddr::ipv4(1), HostAddr::ipv4(2), HostAddr::ipv4(66)) };
        let v = VictimView {
            victim: Station::from(&a),
            peer: Station::from(&b),
            qpn: 0x11,
            peer_qpn: 0x111,
            rq_psn: Psn::new(0xff_fff0),
            sq_psn: Psn::new(5),
            una: Psn::new(2),
            rkey: 0x1234_5678,
            va: 0xffff_ffff_ffff_f000,
        };
        (v, Station::from(&c))
    }

    #[test]
    fn every_attack_parses_with_a_valid_icrc() {
        assert_eq!(Attack::ALL.iter().collect::<HashSet<_>>().len(), Attack::ALL.len(), "ALL has duplicates");
        assert_eq!(Attack::ALL.iter().map(|a| a.name()).collect::<HashSet<_>>().len(), Attack::ALL.len());
        for v6 in [false, true] {
            let (v, attacker) = view(v6);
            for &attack in &Attack::ALL {
                for bits in 0..20u64 {
                    let mut out = vec![0xee; 3];
                    let f = forge(attack, &v, &attacker, bits, &mut out).unwrap();
                    assert_eq!(&out[..3], &[0xee; 3], "{attack}: appends");
                    let frame = &out[3..];
                    assert_eq!(frame.len(), f.len);
                    let p = parse_frame(frame).unwrap_or_else(|e| panic!("{attack} v6={v6} bits={bits}: {e}"));
                    let stored = u32::from_le_bytes(frame[frame.len() - 4..].try_into().unwrap());
                    assert_eq!(icrc::of_frame(frame).unwrap(), stored, "{attack}");
                    let t = &p.repr.transport;
                    assert_eq!(t.bth.dest_qp, v.qpn, "{attack}");
                    assert_eq!((t.bth.opcode, t.bth.psn), (f.opcode, f.psn), "{attack}");
                    assert_eq!(p.repr.eth.dst, v.victim.mac, "{attack}");
                    // Source: the peer's IP when spoofing, the attacker's otherwise.
                    let (src, dst) = (p.repr.ip.src_gid(), p.repr.ip.dst_gid());
                    let want_src = if attack.spoofs_peer() { v.peer.gid() } else { attacker.gid() };
                    assert_eq!(src, want_src, "{attack}");
                    let want_dst = if attack == Attack::MisaddressedWrite { attacker.gid() } else { v.victim.gid() };
                    assert_eq!(dst, want_dst, "{attack}");
                    assert_eq!(t.bth.opcode.is_request(), attack.is_request(), "{attack}");
                    // PSN classes.
                    let d_rq = t.bth.psn.distance(v.rq_psn);
                    let d_sq = t.bth.psn.distance(v.sq_psn);
                    match attack {
                        Attack::StrangerRequest(_) | Attack::MisaddressedWrite | Attack::PeerWriteInWindow => {
                            assert_eq!(d_rq, 0)
                        }
                        Attack::StaleRequest(_) => assert!(d_rq <= -(FAR_BEHIND as i32), "{attack} {d_rq}"),
                        Attack::AheadRequest(_) => assert!(d_rq >= FAR_AHEAD as i32 && d_rq < 1 << 22, "{attack} {d_rq}"),
                        Attack::StaleResponse(_) => assert!(d_sq <= -(FAR_BEHIND as i32), "{attack} {d_sq}"),
                        Attack::GhostResponse(_) => assert!(d_sq >= FAR_AHEAD as i32 && d_sq < 1 << 22, "{attack} {d_sq}"),
                        Attack::StrangerResponse(_) => assert_eq!(d_sq, -1),
                        Attack::SeqNakCopy | Attack::PeerErrorNakOutstanding => assert_eq!(t.bth.psn, v.una),
                        Attack::StrangerCnp | Attack::PeerCnp => assert_eq!(t.bth.opcode, Opcode::CNP),
                    }
                    // R_Key / address guesses are carried.
                    if let Some(r) = t.reth {
                        assert_eq!((r.rkey, r.va), (v.rkey, v.va));
                    }
                    if let Some(a) = t.atomic_eth {
                        assert_eq!((a.rkey, a.va), (v.rkey, v.va & !7));
                    }
                    // Deterministic.
                    let mut again = Vec::new();
                    forge(attack, &v, &attacker, bits, &mut again).unwrap();
                    assert_eq!(again, frame, "{attack}");
                }
            }
        }
    }

    #[test]
    fn expectations_name_real_counters() {
        // The names must exist in the engine's counter lists.
        let engine: HashSet<String> = crate::transport::engine::EngineStats::default().iter().map(|(k, _)| k).collect();
        let qp: HashSet<&str> = crate::transport::stats::QpStats::default().iter().map(|(k, _)| k).collect();
        for a in Attack::ALL {
            let list = match a.expect() {
                Expect::Counted(l) | Expect::OneOf(l) => l,
                Expect::Accepted => {
                    assert!(a.spoofs_peer(), "{a}");
                    continue;
                }
            };
            assert!(!list.is_empty());
            for c in list {
                match c {
                    Counter::Engine(n) => assert!(engine.contains(*n), "{a}: no engine counter {n}"),
                    Counter::Qp(n) => assert!(qp.contains(n), "{a}: no QP counter {n}"),
                }
            }
        }
        assert!(!Attack::PeerWriteInWindow.model_safe() && Attack::PeerCnp.model_safe());
        assert_eq!(Attack::ALL.iter().filter(|a| !a.model_safe()).count(), 2);
    }

    #[test]
    fn replay_moves_a_frame_to_another_psn() {
        let (v, attacker) = view(false);
        let mut orig = Vec::new();
        forge(Attack::StaleRequest(ReqOp::Write), &v, &attacker, 3, &mut orig).unwrap();
        let mut out = Vec::new();
        let f = replay_at(&orig, v.rq_psn, &mut out).unwrap();
        assert_eq!((f.psn, f.opcode, f.len), (v.rq_psn, Opcode::RC_WRITE_ONLY, orig.len()));
        let (a, b) = (parse_frame(&orig).unwrap(), parse_frame(&out).unwrap());
        assert_eq!(b.repr.transport.bth.psn, v.rq_psn);
        assert_eq!(a.payload, b.payload);
        let mut same = b.repr;
        same.transport.bth.psn = a.repr.transport.bth.psn;
        assert_eq!(same, a.repr);
        let mut bad = orig.clone();
        let n = bad.len();
        bad[n - 1] ^= 1;
        assert!(matches!(replay_at(&bad, v.rq_psn, &mut out), Err(WireError::BadIcrc { .. })));
    }

    #[test]
    fn mixed_families_use_ipv6_framing() {
        let (mut v, _) = view(false);
        let attacker = Station { mac: [2, 0, 0, 0, 0, 9], ip: "fd00::9".parse().unwrap() };
        v.rkey = 7;
        let mut out = Vec::new();
        forge(Attack::StrangerRequest(ReqOp::Write), &v, &attacker, 1, &mut out).unwrap();
        let p = parse_frame(&out).unwrap();
        match p.repr.ip {
            IpRepr::V6(x) => {
                assert_eq!(x.src, attacker.gid());
                assert_eq!(x.dst, v.victim.gid());
            }
            IpRepr::V4(_) => panic!("IPv4 framing for an IPv6 source"),
        }
    }
}
