//! UC and UD receive paths: no acknowledgements, no retransmission; a lost
//! packet drops its message (IBTA 9.8.3 UC, 9.8.4 UD Q_Key checks).

use crate::transport::memory::sgl_len;
use crate::transport::wr::{Completion, WcOpcode, WcStatus, WorkCompletion};
use crate::wire::{Opcode, ParsedFrame, Segment, Service};

use super::*;

impl Responder {
    pub(super) fn uc(&mut self, ctx: &mut ResponderCtx<'_>, f: &ParsedFrame<'_>) -> ResponderOutcome {
        let bth = f.repr.transport.bth;
        let op = bth.opcode;
        if op.service() != Service::Uc || !(op.is_send() || op.is_write()) {
            ctx.stats.resp_bad_opcode_dropped += 1;
            return ResponderOutcome::Ok;
        }
        let starts = matches!(op.segment(), Segment::First | Segment::Only);
        // IBTA 9.8.4 (UC): a PSN gap loses the rest of the current message;
        // the next FIRST/ONLY starts over (rxe check_psn UC / drop_msg).
        if self.uc_drop || bth.psn != self.epsn {
            self.abandon(ctx);
            if !starts {
                self.uc_drop = true;
                ctx.stats.resp_uc_dropped += 1;
                return ResponderOutcome::Ok;
            }
            self.uc_drop = false;
        }
        // Opcode sequence (rxe check_op_seq UC, class D1/E): a FIRST/ONLY
        // inside a message abandons the old one and starts anew; a MIDDLE/LAST
        // of the wrong kind or outside a message is dropped with the rest.
        if starts {
            self.abandon(ctx);
        } else if !self.sequence_ok(op) {
            self.abandon(ctx);
            return self.uc_drop_msg(ctx);
        }
        // rxe check_op_valid UC: WRITE to a QP without REMOTE_WRITE drops the message.
        if !ctx.attr.qp_access_flags.contains(needed_qp_access(op)) || !length_ok(op.segment(), f.payload.len(), bth.pad_count, ctx.attr.path_mtu) {
            self.abandon(ctx);
            return self.uc_drop_msg(ctx);
        }
        let result = if op.is_send() { self.exec_send(ctx, f) } else { self.exec_write(ctx, f, Placement::ToDo) };
        match result {
            Ok(()) => {
                self.epsn = bth.psn.next();
                ResponderOutcome::Ok
            }
            // A broken receive WQE is class A for every service (rxe ERR_MALFORMED_WQE).
            Err(Fault::LocalProtection) => self.fail(ctx, WcStatus::LocProtErr),
            Err(_) => {
                // UC class D: no WQE, bad R_Key, length: drop the message.
                self.abandon(ctx);
                self.uc_drop_msg(ctx)
            }
        }
    }

    pub(super) fn uc_drop_msg(&mut self, ctx: &mut ResponderCtx<'_>) -> ResponderOutcome {
        self.uc_drop = true;
        ctx.stats.resp_uc_dropped += 1;
        ResponderOutcome::Ok
    }

    /// Forget the message in progress; a receive WQE it had taken goes back
    /// to the head of its queue for the next message (rxe class D1).
    pub(super) fn abandon(&mut self, ctx: &mut ResponderCtx<'_>) {
        if let MsgState::Send { wr, .. } = std::mem::replace(&mut self.msg, MsgState::Idle) {
            ctx.recv_queue.requeue_front(wr);
        }
    }

    // ------------------------------------------------------------------ UD

    pub(super) fn ud(&mut self, ctx: &mut ResponderCtx<'_>, f: &ParsedFrame<'_>) -> ResponderOutcome {
        let t = &f.repr.transport;
        let op = t.bth.opcode;
        let deth = match t.deth {
            Some(d) if op == Opcode::UD_SEND_ONLY || op == Opcode::UD_SEND_ONLY_IMM => d,
            _ => {
                ctx.stats.resp_bad_opcode_dropped += 1;
                return ResponderOutcome::Ok;
            }
        };
        // IBTA C10-15 / 10.2.5: a datagram whose Q_Key differs from the QP's is dropped.
        if deth.qkey != ctx.attr.qkey {
            ctx.stats.resp_ud_qkey_dropped += 1;
            return ResponderOutcome::Ok;
        }
        let len = f.payload.len();
        if len > ctx.attr.path_mtu.bytes() as usize {
            ctx.stats.resp_ud_len_dropped += 1;
            return ResponderOutcome::Ok;
        }
        // UD has no RNR: no WQE → drop (IBTA 9.7.5.2.8 applies to RC only).
        let Some(front) = ctx.recv_queue.front() else {
            ctx.stats.resp_ud_no_wqe_dropped += 1;
            return ResponderOutcome::Ok;
        };
        // Too small for GRH + payload: drop, the WQE stays (rxe class D).
        if sgl_len(&front.sgl) < (GRH_LEN + len) as u64 {
            ctx.stats.resp_ud_len_dropped += 1;
            return ResponderOutcome::Ok;
        }
        let Some(wr) = ctx.recv_queue.pop() else {
            return ResponderOutcome::Ok;
        };
        srq_event(ctx);
        let grh = grh_bytes(&f.repr.ip);
        let pd = ctx.recv_queue.pd();
        let placed = ctx.memory.local_scatter(pd, &wr.sgl, 0, &grh).and_then(|()| ctx.memory.local_scatter(pd, &wr.sgl, GRH_LEN as u64, f.payload));
        if placed.is_err() {
            push_recv_error(ctx, wr.wr_id, WcStatus::LocProtErr);
            self.error = true;
            return ResponderOutcome::QpError(WcStatus::LocProtErr);
        }
        ctx.stats.resp_bytes_placed += len as u64;
        ctx.stats.resp_messages += 1;
        self.epsn = t.bth.psn.next();
        let wc = WorkCompletion {
            wr_id: wr.wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            qp_num: ctx.qpn,
            byte_len: (GRH_LEN + len) as u32,
            imm_data: t.immediate,
            invalidated_rkey: None,
            src_qp: deth.src_qp,
            grh: true,
        };
        ctx.completions.push_back(Completion { cq: ctx.init.recv_cq, wc, solicited: t.bth.solicited });
        ResponderOutcome::Ok
    }

    // ------------------------------------------------------------ responses
}
