//! Executing RC requests (rxe_resp.c `execute`, `duplicate_request`):
//! READ and atomic requests with their saved resources, SEND and WRITE
//! placement, and the replies to duplicates.

use crate::transport::ids::Access;
use crate::transport::memory::{sgl_len, AccessError, AtomicOp};
use crate::transport::wr::{Completion, WcOpcode, WcStatus, WorkCompletion};
use crate::wire::{Opcode, ParsedFrame, Segment};

use super::*;

impl Responder {
    pub(super) fn rc_read(&mut self, ctx: &mut ResponderCtx<'_>, f: &ParsedFrame<'_>) -> ResponderOutcome {
        let psn = f.repr.transport.bth.psn;
        let Some(reth) = f.repr.transport.reth else {
            return self.rc_fault(ctx, psn, Fault::InvalidRequest);
        };
        if reth.dma_len > MAX_DMA_LEN {
            return self.rc_fault(ctx, psn, Fault::InvalidRequest);
        }
        // R_Key, PD, REMOTE_READ and bounds for the whole length, before any
        // response (rxe check_rkey). A zero-length READ needs no valid key
        // (rxe: "A zero-byte op is not required to set an addr or rkey").
        if reth.dma_len > 0
            && ctx.memory.remote_check(ctx.init.pd, ctx.qpn, reth.rkey, reth.va, u64::from(reth.dma_len), Access::REMOTE_READ).is_err()
        {
            return self.rc_fault(ctx, psn, Fault::RemoteAccess);
        }
        let npkts = packets_for(reth.dma_len, ctx.attr.path_mtu);
        let last = psn.add(npkts - 1);
        // IBTA C9-148: the MSN of an RDMA READ advances when it is accepted.
        self.msn = (self.msn + 1) & MSN_MASK;
        ctx.stats.resp_messages += 1;
        self.save_resource(ctx, Resource { first: psn, last, kind: ResKind::Read { rkey: reth.rkey, va: reth.va, len: reth.dma_len } });
        let msn = self.msn;
        self.push(ctx, Pending::Read { rkey: reth.rkey, va: reth.va, remaining: reth.dma_len, psn, first: true, msn });
        // The READ consumed one PSN per response packet (rxe read_reply: resp.psn = cur_psn).
        self.epsn = last.next();
        ResponderOutcome::Ok
    }

    pub(super) fn rc_atomic(&mut self, ctx: &mut ResponderCtx<'_>, f: &ParsedFrame<'_>) -> ResponderOutcome {
        let bth = f.repr.transport.bth;
        let psn = bth.psn;
        let Some(a) = f.repr.transport.atomic_eth else {
            return self.rc_fault(ctx, psn, Fault::InvalidRequest);
        };
        let op = if bth.opcode == Opcode::RC_CMP_SWAP {
            AtomicOp::CmpSwap { compare: a.compare, swap: a.swap_add }
        } else {
            AtomicOp::FetchAdd { add: a.swap_add }
        };
        // Checks (key, PD, REMOTE_ATOMIC, bounds, then alignment) precede the
        // operation; executed exactly once, the result saved for replays.
        let orig = match ctx.memory.remote_atomic(ctx.init.pd, ctx.qpn, a.rkey, a.va, op) {
            Ok(v) => v,
            // rxe atomic_reply: RESPST_ERR_MISALIGNED_ATOMIC is class C
            // AETH_NAK_INVALID_REQ (not a remote access error).
            Err(AccessError::Misaligned) => return self.rc_fault(ctx, psn, Fault::InvalidRequest),
            Err(_) => return self.rc_fault(ctx, psn, Fault::RemoteAccess),
        };
        self.msn = (self.msn + 1) & MSN_MASK;
        ctx.stats.resp_messages += 1;
        self.save_resource(ctx, Resource { first: psn, last: psn, kind: ResKind::Atomic { orig } });
        let msn = self.msn;
        // Atomic ACKs are always sent, AckReq or not (rxe acknowledge).
        self.push(ctx, Pending::AtomicAck { psn, msn, orig });
        self.epsn = psn.next();
        ResponderOutcome::Ok
    }

    /// A request behind the expected PSN (rxe duplicate_request).
    pub(super) fn duplicate(&mut self, ctx: &mut ResponderCtx<'_>, f: &ParsedFrame<'_>) -> ResponderOutcome {
        let t = &f.repr.transport;
        let op = t.bth.opcode;
        let psn = t.bth.psn;
        ctx.stats.resp_duplicates += 1;
        if op.is_send() || op.is_write() {
            // IBTA C9-105: a duplicate SEND/WRITE is not executed again but
            // acknowledged, with the PSN of the last executed SEND/WRITE packet.
            let ack = self.last_ack_psn;
            self.queue_ack(ctx, ack);
            return ResponderOutcome::Ok;
        }
        let mtu = ctx.attr.path_mtu;
        let found = self.resources.iter().flatten().copied().find(|r| {
            !psn.is_before(r.first)
                && !psn.is_after(r.last)
                && matches!((r.kind, op == Opcode::RC_READ_REQUEST), (ResKind::Read { .. }, true) | (ResKind::Atomic { .. }, false))
        });
        match (found, op == Opcode::RC_READ_REQUEST) {
            (Some(Resource { first, last, kind: ResKind::Read { rkey, va, len } }), true) => {
                // Replay from `psn` (possibly mid-message): the request must
                // name the same key and a part of the original range, and its
                // responses must fit the original PSN range (rxe checks the
                // first two; the third keeps our expected PSN consistent).
                let Some(reth) = t.reth else {
                    ctx.stats.resp_dup_no_resource_dropped += 1;
                    return ResponderOutcome::Ok;
                };
                let within = reth.rkey == rkey
                    && reth.va >= va
                    && reth.va.checked_add(u64::from(reth.dma_len)).is_some_and(|e| e <= va.saturating_add(u64::from(len)))
                    && !psn.add(packets_for(reth.dma_len, mtu) - 1).is_after(last);
                if !within {
                    ctx.stats.resp_dup_no_resource_dropped += 1;
                    return ResponderOutcome::Ok;
                }
                ctx.stats.resp_read_replays += 1;
                let msn = self.msn;
                let replay = Pending::Read { rkey, va: reth.va, remaining: reth.dma_len, psn, first: psn == first, msn };
                // The replay supersedes a stream of the same resource still
                // queued (rxe restarts the resource in place): otherwise every
                // re-request would add a whole stream and a lossy link would
                // multiply READ responses. It takes that stream's place in the
                // queue, so responses stay in PSN order.
                let same = |p: &Pending| matches!(*p, Pending::Read { rkey: k, psn: q, .. } if k == rkey && !q.is_before(first) && !q.is_after(last));
                match self.pending.iter().position(same) {
                    Some(i) => {
                        self.pending[i] = replay;
                        let mut j = i + 1;
                        while j < self.pending.len() {
                            if same(&self.pending[j]) {
                                self.pending.remove(j);
                            } else {
                                j += 1;
                            }
                        }
                    }
                    None => {
                        self.push(ctx, replay);
                    }
                }
            }
            (Some(Resource { first, kind: ResKind::Atomic { orig }, .. }), false) if first == psn => {
                // Never execute an atomic twice: answer with the saved value.
                ctx.stats.resp_atomic_replays += 1;
                let msn = self.msn;
                self.push(ctx, Pending::AtomicAck { psn, msn, orig });
            }
            _ => {
                // Class D: no resource covers it (too old, or never executed): drop.
                ctx.stats.resp_dup_no_resource_dropped += 1;
            }
        }
        ResponderOutcome::Ok
    }

    pub(super) fn save_resource(&mut self, ctx: &mut ResponderCtx<'_>, r: Resource) {
        // rxe: `max_dest_rd_atomic` resources, the oldest is reused
        // ("it is the requester's job to not send too many").
        let n = usize::from(ctx.attr.max_dest_rd_atomic.max(1));
        if self.resources.len() != n {
            // Only when max_dest_rd_atomic changed (modify_qp), not per packet.
            self.resources.resize(n, None);
            self.res_head %= n;
        }
        self.resources[self.res_head] = Some(r);
        self.res_head = (self.res_head + 1) % n;
    }

    // ---------------------------------------------------- SEND / WRITE (RC, UC)

    /// Execute a SEND packet (sequence, access and length already checked).
    pub(super) fn exec_send(&mut self, ctx: &mut ResponderCtx<'_>, f: &ParsedFrame<'_>) -> Result<(), Fault> {
        let t = &f.repr.transport;
        let seg = t.bth.opcode.segment();
        let (wr, offset) = match std::mem::replace(&mut self.msg, MsgState::Idle) {
            MsgState::Send { wr, offset } => (wr, offset),
            _ => {
                // FIRST/ONLY: take a receive WQE (IBTA 9.7.5.2.8: RNR NAK if none).
                let Some(wr) = ctx.recv_queue.pop() else {
                    return Err(Fault::Rnr);
                };
                srq_event(ctx);
                (wr, 0)
            }
        };
        let end = offset + f.payload.len() as u64;
        if end > sgl_len(&wr.sgl) {
            self.msg = MsgState::Send { wr, offset };
            return Err(Fault::RecvTooLong);
        }
        if ctx.memory.local_scatter(ctx.recv_queue.pd(), &wr.sgl, offset, f.payload).is_err() {
            self.msg = MsgState::Send { wr, offset };
            return Err(Fault::LocalProtection);
        }
        ctx.stats.resp_bytes_placed += f.payload.len() as u64;
        if !matches!(seg, Segment::Last | Segment::Only) {
            self.msg = MsgState::Send { wr, offset: end };
            return Ok(());
        }
        let mut invalidated = None;
        if let Some(rkey) = t.invalidate_rkey {
            // SEND with Invalidate (IBTA 9.4.4 IETH, rxe `invalidate_rkey`):
            // only a memory window may be invalidated remotely; an MR key or
            // any other failure is an invalid request (rxe
            // RESPST_ERR_INVALIDATE_RKEY: REM_INV_REQ_ERR, class J).
            if ctx.memory.invalidate_remote(ctx.init.pd, ctx.qpn, rkey).is_err() {
                self.msg = MsgState::Send { wr, offset: end };
                return Err(Fault::Invalidate);
            }
            invalidated = Some(rkey);
        }
        self.msn = (self.msn + 1) & MSN_MASK;
        ctx.stats.resp_messages += 1;
        let wc = WorkCompletion {
            wr_id: wr.wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            qp_num: ctx.qpn,
            byte_len: end as u32,
            imm_data: t.immediate,
            invalidated_rkey: invalidated,
            src_qp: 0,
            grh: false,
        };
        ctx.completions.push_back(Completion { cq: ctx.init.recv_cq, wc, solicited: t.bth.solicited });
        Ok(())
    }

    /// Execute an RDMA WRITE packet (sequence, access and length already
    /// checked); with [`Placement::Done`], its payload is in place already
    /// (`place_write_continuation` put it exactly where this would).
    /// Inlined into `handle_request` (with the placement,
    /// [`MemoryTable::remote_write_memo`]): out of line, its call, saved
    /// registers and spills around the copy were about 25 instructions of
    /// every WRITE packet.
    #[inline(always)]
    pub(super) fn exec_write(&mut self, ctx: &mut ResponderCtx<'_>, f: &ParsedFrame<'_>, placement: Placement) -> Result<(), Fault> {
        let t = &f.repr.transport;
        let op = t.bth.opcode;
        let seg = op.segment();
        let len = f.payload.len() as u64;
        let mtu = u64::from(ctx.attr.path_mtu.bytes());
        let (rkey, va, remaining, dma_len) = match self.msg {
            MsgState::Write { rkey, va, remaining, dma_len } => (rkey, va, remaining, dma_len),
            _ => {
                let reth = t.reth.ok_or(Fault::InvalidRequest)?;
                let dma = u64::from(reth.dma_len);
                // rxe check_length/check_rkey: the RETH length must match the packets.
                if reth.dma_len > MAX_DMA_LEN || (seg == Segment::Only && len != dma) || (seg == Segment::First && dma <= mtu) {
                    return Err(Fault::InvalidRequest);
                }
                // WRITE ONLY with immediate consumes a WQE: RNR comes before the
                // R_Key check (rxe check_resource precedes check_rkey).
                if op.has_immediate() && ctx.recv_queue.is_empty() {
                    return Err(Fault::Rnr);
                }
                // The whole DMA range is checked at FIRST/ONLY, before any byte
                // is written; a zero-length WRITE needs no valid key (rxe check_rkey).
                // An ONLY carries the whole range (`len == dma`, checked above),
                // so the placement below checks exactly it before it writes a
                // byte, and nothing between here and there can fail: one
                // resolution of the R_Key instead of two. A FIRST keeps the
                // resolution of the whole range (`WriteMemo`): its packets are
                // placed through it while the memory table has not changed
                // since, and through the checker (with the same refusals as
                // before) once it has.
                if dma > 0 && seg != Segment::Only {
                    self.write_memo =
                        ctx.memory.remote_check_write(ctx.init.pd, ctx.qpn, reth.rkey, reth.va, dma).map_err(|_| Fault::RemoteAccess)?;
                }
                (reth.rkey, reth.va, dma, reth.dma_len)
            }
        };
        // Every packet must fit the announced length: MIDDLE leaves bytes for
        // a LAST, LAST ends exactly on it.
        let fits = match seg {
            Segment::First | Segment::Middle => len < remaining,
            Segment::Last | Segment::Only => len == remaining,
        };
        if !fits {
            return Err(Fault::InvalidRequest);
        }
        if op.has_immediate() && ctx.recv_queue.is_empty() {
            // LAST with immediate and no WQE: RNR; the state is untouched, so
            // the retried LAST is placed normally.
            return Err(Fault::Rnr);
        }
        if len > 0 {
            // A continuation placed before it came passed these same checks
            // there (`place_write_continuation`: state, fit, the memo).
            debug_assert!(placement == Placement::ToDo || matches!(self.msg, MsgState::Write { .. }));
            if placement == Placement::ToDo {
                ctx.memory.remote_write_memo(&self.write_memo, ctx.init.pd, ctx.qpn, rkey, va, f.payload).map_err(|_| Fault::RemoteAccess)?;
            }
            ctx.stats.resp_bytes_placed += len;
        }
        if matches!(seg, Segment::First | Segment::Middle) {
            let (va, remaining) = (va.wrapping_add(len), remaining - len);
            match &mut self.msg {
                // A MIDDLE moves the message on in place (rebuilt, the
                // state's tag was tested for a WQE to drop and all of it
                // stored again, every packet).
                MsgState::Write { va: at, remaining: left, .. } => (*at, *left) = (va, remaining),
                msg => *msg = MsgState::Write { rkey, va, remaining, dma_len },
            }
            return Ok(());
        }
        self.msg = MsgState::Idle;
        self.msn = (self.msn + 1) & MSN_MASK;
        ctx.stats.resp_messages += 1;
        if op.has_immediate() {
            if let Some(wr) = ctx.recv_queue.pop() {
                srq_event(ctx);
                // ibverbs: RECV_RDMA_WITH_IMM, byte_len = the RDMA length (rxe do_complete).
                let wc = WorkCompletion {
                    wr_id: wr.wr_id,
                    status: WcStatus::Success,
                    opcode: WcOpcode::RecvRdmaWithImm,
                    qp_num: ctx.qpn,
                    byte_len: dma_len,
                    imm_data: t.immediate,
                    invalidated_rkey: None,
                    src_qp: 0,
                    grh: false,
                };
                ctx.completions.push_back(Completion { cq: ctx.init.recv_cq, wc, solicited: t.bth.solicited });
            }
        }
        Ok(())
    }

    // ------------------------------------------------------------------ UC
}
