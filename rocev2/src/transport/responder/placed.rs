//! An RDMA WRITE's continuation placed while its ICRC is checked: one pass
//! over the payload instead of a check and then a copy.
//!
//! The wire layer leaves the ICRC of an RC WRITE MIDDLE or LAST (no
//! immediate, a payload the fused kernel takes) to its receiver
//! (`parse_frame_deferring`). Before anything happens to such a frame, the
//! engine asks [`Responder::place_write_continuation`] whether the ordinary
//! path would certainly accept it and place its payload, and where. Only
//! then are the bytes copied, with the ICRC computed over the frame as they
//! are; the frame then goes through the ordinary path with
//! [`Placement::Done`] (every check again, the placement skipped). A bad
//! ICRC drops the frame with nothing changed but the wire layer's counter.
//! Any frame this refuses has its ICRC checked alone first and then takes
//! the ordinary path, so a frame failing its ICRC is always counted as that
//! and never answered (no NAK, no counter of the QP's, no CNP).
//!
//! Why a frame with a bad ICRC may leave bytes: a continuation's
//! destination is not in the frame but in the responder's state (the
//! running address of the WRITE that a FIRST, checked whole, began and
//! whose whole range the R_Key check approved), and the payload goes only
//! where the packet with the expected PSN would go: inside the part of that
//! range no accepted packet has written yet. A corrupted frame cannot move
//! it elsewhere (a corrupted length or opcode is still held to the
//! remaining range; a corrupted PSN or QPN finds another expected packet's
//! place, equally unwritten). The requester retransmits from that PSN
//! (go-back-N after the next packet's sequence NAK, or its timeout), and
//! the retransmitted packet overwrites those bytes before the WRITE can
//! complete; the verbs leave an RDMA WRITE's target undefined until then. A
//! FIRST or ONLY carries its address in the RETH, which a corrupted bit
//! could move anywhere the R_Key allows: those are checked first.

use crate::transport::ids::Access;
use crate::wire::{IcrcCheck, Opcode, ParsedFrame, Segment, WireError};

use super::*;

/// Whether a request's payload is still to be placed by the responder, or
/// was placed, with its ICRC checked in the same pass, before it came
/// ([`Responder::place_write_continuation`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Placement {
    /// The responder places the payload (every frame but a fused one).
    ToDo,
    /// The payload is where the responder would have placed it.
    Done,
}

/// What [`Responder::place_write_continuation`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Placed {
    /// Nothing: the frame is not one the ordinary path would certainly
    /// accept and place as it is now (check its ICRC alone first).
    NotTaken,
    /// The payload is in place and the ICRC is good: hand the frame to the
    /// ordinary path with [`Placement::Done`].
    Done,
    /// The ICRC is bad: drop the frame, counted, and change nothing else
    /// (its bytes landed in a part of the WRITE no accepted packet has
    /// written yet).
    BadIcrc(WireError),
}

impl Responder {
    /// Place the payload of RC WRITE continuation `f` (MIDDLE or LAST,
    /// checked by the engine's `hdr_check` already) while checking its ICRC
    /// (`check`), if the ordinary path would accept it and place it here
    /// and now: the checks of [`Responder::handle_request_placed`] for this frame,
    /// in its order, each a refusal here (not in error; PSN the expected
    /// one; a WRITE in progress (opcode sequence); the QP grants
    /// REMOTE_WRITE; the packet length against the path MTU; the packet
    /// inside the WRITE's remaining length), then the destination through
    /// the WRITE's memo as `exec_write` would resolve it. Changes nothing
    /// in the responder.
    pub(crate) fn place_write_continuation(
        &self,
        attr: &QpAttr,
        pd: PdId,
        qpn: u32,
        memory: &MemoryTable,
        f: &ParsedFrame<'_>,
        check: &IcrcCheck<'_>,
    ) -> Placed {
        let bth = f.repr.transport.bth;
        let op = bth.opcode;
        let seg = op.segment();
        let len = f.payload.len();
        // The wire layer defers only these; anything else is not ours.
        let continuation = (op == Opcode::RC_WRITE_MIDDLE || op == Opcode::RC_WRITE_LAST) && f.repr.transport.immediate.is_none();
        if !continuation || self.error || bth.psn != self.epsn || check.payload_len() != len {
            return Placed::NotTaken;
        }
        let MsgState::Write { rkey, va, remaining, .. } = self.msg else {
            return Placed::NotTaken;
        };
        let fits = match seg {
            Segment::Middle => (len as u64) < remaining,
            _ => len as u64 == remaining,
        };
        if !attr.qp_access_flags.contains(Access::REMOTE_WRITE) || !length_ok(seg, len, bth.pad_count, attr.path_mtu) || !fits {
            return Placed::NotTaken;
        }
        // SAFETY: `remote_place_memo` hands over `len` writable bytes of
        // registered memory apart from every byte of the frame `place` reads.
        match memory.remote_place_memo(&self.write_memo, pd, qpn, rkey, va, len, check.frame_bytes(), |dst| unsafe { check.place(dst) }) {
            None | Some(None) => Placed::NotTaken,
            Some(Some(icrc)) => match check.judge(icrc) {
                Ok(()) => Placed::Done,
                Err(e) => Placed::BadIcrc(e),
            },
        }
    }
}
