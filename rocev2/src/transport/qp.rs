//! A queue pair: its attributes and state machine (IBTA 10.3, `ibv_modify_qp`
//! transitions with their required and optional attributes, IBTA 11.2.4.2),
//! its requester, responder, receive queue, path and DCQCN state; and how
//! the requester and responder borrow what they need from it (rxe_qp.c).

use std::collections::VecDeque;
use std::sync::Arc;

use crate::hash::IntMap;
use crate::psn::Psn;
use crate::time::Instant;
use crate::transport::attr::{AddressVector, QpAttr, QpAttrMask, QpInitAttr, QpState, QpType, SrqId};
use crate::transport::dcqcn::{DcqcnParams, NotificationPoint, ReactionPoint};
use crate::transport::events::{AsyncEvent, EngineError};
use crate::transport::ids::{Access, CqId};
use crate::transport::memory::MemoryTable;
use crate::transport::path::PathHeaders;
use crate::transport::recv::RecvQueue;
use crate::transport::requester::{Requester, RequesterCtx};
use crate::transport::responder::{Responder, ResponderCtx};
use crate::transport::stats::QpStats;
use crate::transport::wr::{Completion, WcOpcode, WcStatus};
use crate::wire::{sport, Opcode};

pub(crate) struct Qp {
    pub(crate) qpn: u32,
    pub(crate) init: QpInitAttr,
    pub(crate) attr: QpAttr,
    pub(crate) state: QpState,
    pub(crate) requester: Requester,
    pub(crate) responder: Responder,
    /// Own receive queue (None when the QP uses an SRQ).
    pub(crate) rq: Option<RecvQueue>,
    pub(crate) path: Option<PathHeaders>,
    pub(crate) stats: QpStats,
    /// The responder hit a fatal error: flush it once its NAK is out.
    pub(crate) responder_flush_pending: bool,
    pub(crate) drained_reported: bool,
    /// Deadline of this QP's newest entry in the engine's timer queue.
    pub(crate) timer_at: Option<Instant>,
    /// DCQCN reaction point (paces our requests after CNPs).
    pub(crate) rp: ReactionPoint,
    /// DCQCN notification point (CNPs for CE-marked packets we receive).
    pub(crate) np: NotificationPoint,
    /// A CNP is due to the peer QP.
    pub(crate) cnp_due: bool,
    /// In the engine's ready list.
    pub(crate) ready: bool,
}

impl Qp {
    /// A new QP in RESET.
    pub(crate) fn new(qpn: u32, init: &QpInitAttr, dcqcn: DcqcnParams) -> Qp {
        let rq = init.srq.is_none().then(|| RecvQueue::new(init.pd, init.cap.max_recv_wr.max(1), init.cap.max_recv_sge));
        Qp {
            qpn,
            init: *init,
            attr: QpAttr { cap: init.cap, ..QpAttr::default() },
            state: QpState::Reset,
            requester: Requester::new(init.cap.max_send_wr, Psn::new(0), Arc::default()),
            responder: Responder::new(Psn::new(0)),
            rq,
            path: None,
            stats: QpStats::default(),
            responder_flush_pending: false,
            drained_reported: false,
            timer_at: None,
            rp: ReactionPoint::new(dcqcn),
            np: NotificationPoint::default(),
            cnp_due: false,
            ready: false,
        }
    }

    /// `ibv_query_qp`.
    pub(crate) fn query(&self) -> QpAttr {
        let mut a = self.attr;
        a.qp_state = self.state;
        a.cur_qp_state = self.state;
        a.sq_psn = self.requester.next_psn();
        a.rq_psn = self.responder.expected_psn();
        a.sq_draining = self.state == QpState::Sqd && self.requester.outstanding() > 0;
        a
    }

    /// `ibv_modify_qp` on this QP: validate the mask and values for the
    /// transition (IBTA 11.2.4.2), then apply them and the transition's own
    /// effects. Returns (from, to); entering ERR (flushing) is the engine's
    /// part. On error nothing changes.
    pub(crate) fn modify(&mut self, attr: &QpAttr, mask: QpAttrMask) -> Result<(QpState, QpState), EngineError> {
        let qp = self;
        let qpn = qp.qpn;
        let from = qp.state;
        if mask.contains(QpAttrMask::CUR_STATE) && attr.cur_qp_state != from {
            return Err(EngineError::BadValue("cur_qp_state does not match the QP's state"));
        }
        let to = if mask.contains(QpAttrMask::STATE) { attr.qp_state } else { from };
        let (required, optional) = transition_masks(qp.init.qp_type, from, to).ok_or(EngineError::BadTransition { from, to })?;
        let given = mask - QpAttrMask::STATE;
        if !given.contains(required) {
            return Err(EngineError::MissingAttr(required - given));
        }
        let extra = given - required - optional;
        if !extra.is_empty() {
            return Err(EngineError::ExtraAttr(extra));
        }
        // Values.
        if mask.contains(QpAttrMask::PORT) && attr.port_num != 1 {
            return Err(EngineError::BadValue("port_num must be 1"));
        }
        if mask.contains(QpAttrMask::PKEY_INDEX) && attr.pkey_index != 0 {
            return Err(EngineError::BadValue("pkey_index must be 0 (one P_Key, 0xffff)"));
        }
        if mask.contains(QpAttrMask::MIN_RNR_TIMER) && attr.min_rnr_timer > 31 {
            return Err(EngineError::BadValue("min_rnr_timer is a 5-bit code"));
        }
        if mask.contains(QpAttrMask::TIMEOUT) && attr.timeout > 31 {
            return Err(EngineError::BadValue("timeout is a 5-bit exponent"));
        }
        if mask.contains(QpAttrMask::RETRY_CNT) && attr.retry_cnt > 7 {
            return Err(EngineError::BadValue("retry_cnt is 0..=7"));
        }
        if mask.contains(QpAttrMask::RNR_RETRY) && attr.rnr_retry > 7 {
            return Err(EngineError::BadValue("rnr_retry is 0..=7"));
        }
        if mask.contains(QpAttrMask::DEST_QPN) && attr.dest_qp_num > 0x00ff_ffff {
            return Err(EngineError::BadValue("dest_qp_num is 24 bits"));
        }
        if mask.contains(QpAttrMask::AV) && attr.ah_attr.is_none() {
            return Err(EngineError::BadValue("IBV_QP_AV without ah_attr"));
        }
        if mask.contains(QpAttrMask::ACCESS_FLAGS)
            && !(Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC | Access::LOCAL_WRITE | Access::MW_BIND)
                .contains(attr.qp_access_flags)
        {
            return Err(EngineError::BadValue("qp_access_flags has unknown bits"));
        }
        // Apply.
        let a = &mut qp.attr;
        if mask.contains(QpAttrMask::ACCESS_FLAGS) {
            a.qp_access_flags = attr.qp_access_flags;
        }
        if mask.contains(QpAttrMask::QKEY) {
            a.qkey = attr.qkey;
        }
        if mask.contains(QpAttrMask::PATH_MTU) {
            a.path_mtu = attr.path_mtu;
        }
        if mask.contains(QpAttrMask::DEST_QPN) {
            a.dest_qp_num = attr.dest_qp_num;
        }
        if mask.contains(QpAttrMask::MAX_DEST_RD_ATOMIC) {
            a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        }
        if mask.contains(QpAttrMask::MAX_QP_RD_ATOMIC) {
            a.max_rd_atomic = attr.max_rd_atomic;
        }
        if mask.contains(QpAttrMask::MIN_RNR_TIMER) {
            a.min_rnr_timer = attr.min_rnr_timer;
        }
        if mask.contains(QpAttrMask::TIMEOUT) {
            a.timeout = attr.timeout;
        }
        if mask.contains(QpAttrMask::RETRY_CNT) {
            a.retry_cnt = attr.retry_cnt;
        }
        if mask.contains(QpAttrMask::RNR_RETRY) {
            a.rnr_retry = attr.rnr_retry;
        }
        if mask.contains(QpAttrMask::AV) {
            a.ah_attr = attr.ah_attr;
        }
        if mask.contains(QpAttrMask::RQ_PSN) {
            a.rq_psn = attr.rq_psn;
            qp.responder = Responder::new(attr.rq_psn);
        }
        if mask.contains(QpAttrMask::SQ_PSN) {
            a.sq_psn = attr.sq_psn;
        }
        if let (true, Some(av)) = (mask.contains(QpAttrMask::AV) || to == QpState::Rtr, qp.attr.ah_attr) {
            let mut path = PathHeaders::new(&av, rc_port(&av, qpn, qp.attr.dest_qp_num));
            // DCQCN: our packets are ECN-capable (ECT(0)) so switches mark
            // them instead of dropping, unless the path says otherwise.
            if av.traffic_class & 3 == 0 {
                path.set_ecn(2);
            }
            qp.path = Some(path);
        }
        qp.state = to;
        match (from, to) {
            (_, QpState::Reset) => {
                qp.requester.reset();
                qp.responder = Responder::new(Psn::new(0));
                if let Some(rq) = &mut qp.rq {
                    let _ = rq.flush().count();
                }
                qp.path = None;
            }
            (QpState::Rtr, QpState::Rts) => {
                qp.requester.start(qp.attr.sq_psn, qp.attr.retry_cnt, qp.attr.rnr_retry);
            }
            (_, QpState::Sqd) => qp.drained_reported = !mask.contains(QpAttrMask::EN_SQD_ASYNC_NOTIFY),
            _ => {}
        }
        Ok((from, to))
    }
}

/// (required, optional) attribute masks of a transition, IBTA 11.2.4.2 /
/// `ibv_modify_qp(3)`. `None`: no such transition.
fn transition_masks(ty: QpType, from: QpState, to: QpState) -> Option<(QpAttrMask, QpAttrMask)> {
    use QpAttrMask as M;
    use QpState::*;
    let none = M::empty();
    Some(match (from, to) {
        (_, Reset) | (_, Err) => (none, none),
        (Reset, Init) | (Init, Init) => {
            let base = M::PKEY_INDEX | M::PORT;
            let k = match ty {
                QpType::Ud => M::QKEY,
                _ => M::ACCESS_FLAGS,
            };
            if from == Reset {
                (base | k, none)
            } else {
                (none, base | k)
            }
        }
        (Init, Rtr) => match ty {
            QpType::Rc => (
                M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER,
                M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
            ),
            QpType::Uc => (M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN, M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX),
            QpType::Ud => (none, M::PKEY_INDEX | M::QKEY),
        },
        (Rtr, Rts) => match ty {
            QpType::Rc => (
                M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::MIN_RNR_TIMER | M::PATH_MIG_STATE,
            ),
            QpType::Uc => (M::SQ_PSN, M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE),
            QpType::Ud => (M::SQ_PSN, M::CUR_STATE | M::QKEY),
        },
        (Rts, Rts) | (Sqe, Rts) => match ty {
            QpType::Rc => (none, M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE | M::MIN_RNR_TIMER),
            QpType::Uc => (none, M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE),
            QpType::Ud => (none, M::CUR_STATE | M::QKEY),
        },
        (Rts, Sqd) => (none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Rts) => (none, M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE | M::MIN_RNR_TIMER | M::QKEY),
        (Sqd, Sqd) => (
            none,
            M::AV
                | M::MAX_QP_RD_ATOMIC
                | M::MAX_DEST_RD_ATOMIC
                | M::TIMEOUT
                | M::RETRY_CNT
                | M::RNR_RETRY
                | M::ACCESS_FLAGS
                | M::QKEY
                | M::PKEY_INDEX
                | M::MIN_RNR_TIMER
                | M::PATH_MIG_STATE
                | M::ALT_PATH,
        ),
        _ => return None,
    })
}

/// A CNP to `dest_qp` along `path` (as ConnectX sends them: DSCP `dscp`,
/// ECT(0), UDP source port 0, BECN set, PSN 0, 16 reserved bytes).
pub(crate) fn emit_cnp(path: &PathHeaders, dest_qp: u32, dscp: u8, buf: &mut [u8]) -> Option<usize> {
    use crate::wire::{BthRepr, IpRepr, TransportRepr};
    let mut f = path.frame(TransportRepr::bth_only(BthRepr { becn: true, ..BthRepr::new(Opcode::CNP, dest_qp, Psn::new(0)) }));
    match &mut f.ip {
        IpRepr::V4(v4) => {
            v4.dscp = dscp & 0x3f;
            v4.ecn = 2;
        }
        IpRepr::V6(v6) => v6.traffic_class = (dscp << 2) | 2,
    }
    f.udp.src_port = 0;
    f.emit(&[], buf).ok()
}

/// Whether a frame with IP header `ip` comes from the peer of a connected QP
/// whose address vector is `av` (rxe `check_addr`): source = `dgid`,
/// destination = `sgid`. An IPv4 frame matches IPv4-mapped GIDs
/// (::ffff:a.b.c.d, the RoCEv2 GID of an IPv4 address). No address vector
/// (not yet connected): nobody is the peer.
pub(crate) fn from_peer(av: Option<&AddressVector>, ip: &crate::wire::IpRepr) -> bool {
    let Some(av) = av else { return false };
    ip.is_between(&av.dgid, &av.sgid)
}

/// The UDP source port of an RC/UC path, unless the path names one: Linux's
/// `rdma_get_udp_sport` — from the path's flow label when it has one (RDMA-CM
/// gives every connection one, from its ports: both ends then send from the
/// same port), else from the flow label of the two QPNs.
fn rc_port(av: &AddressVector, qpn: u32, dest: u32) -> u16 {
    av.udp_sport.unwrap_or_else(|| sport::udp_sport(av.flow_label, qpn, dest))
}

#[cfg(test)]
pub(crate) const UNUSED_PATH: AddressVector = AddressVector {
    dmac: [0; 6],
    smac: [0; 6],
    vlan: None,
    sgid: [0; 16],
    dgid: [0; 16],
    traffic_class: 0,
    hop_limit: 0,
    flow_label: 0,
    udp_sport: None,
};

/// The requester and its context, borrowed out of a QP.
pub(crate) fn req_ctx<'a>(
    qp: &'a mut Qp,
    memory: &'a MemoryTable,
    completions: &'a mut VecDeque<Completion>,
) -> (&'a mut Requester, RequesterCtx<'a>) {
    let (requester, ctx, _) = req_parts(qp, memory, completions);
    (requester, ctx)
}

/// [`req_ctx`] and the QP's path beside them, borrowed in place (not copied
/// out and back per frame: with its header template it is about 200 bytes).
pub(crate) fn req_parts<'a>(
    qp: &'a mut Qp,
    memory: &'a MemoryTable,
    completions: &'a mut VecDeque<Completion>,
) -> (&'a mut Requester, RequesterCtx<'a>, Option<&'a mut PathHeaders>) {
    (
        &mut qp.requester,
        RequesterCtx { memory, init: &qp.init, attr: &qp.attr, qpn: qp.qpn, completions, stats: &mut qp.stats, draining: qp.state == QpState::Sqd },
        qp.path.as_mut(),
    )
}

/// The responder and its context, borrowed out of a QP (its own RQ or its
/// SRQ), and the QP's path beside them, borrowed in place. Inlined: its
/// result read back from memory in wider loads than it was stored with
/// stalled every received request (half of `handle_for_qp`'s perf samples;
/// a plain `#[inline]` left it out of line).
#[inline(always)]
pub(crate) fn resp_parts<'a>(
    qp: &'a mut Qp,
    memory: &'a MemoryTable,
    srqs: &'a mut IntMap<SrqId, RecvQueue>,
    completions: &'a mut VecDeque<Completion>,
    events: &'a mut VecDeque<AsyncEvent>,
) -> Option<(&'a mut Responder, ResponderCtx<'a>, Option<&'a PathHeaders>)> {
    let recv_queue = match (&mut qp.rq, qp.init.srq) {
        (Some(rq), _) => rq,
        (None, Some(id)) => srqs.get_mut(&id)?,
        (None, None) => return None,
    };
    Some((
        &mut qp.responder,
        ResponderCtx { memory, qpn: qp.qpn, init: &qp.init, attr: &qp.attr, recv_queue, completions, events, stats: &mut qp.stats },
        qp.path.as_ref(),
    ))
}

pub(crate) fn flush_responder(
    qp: &mut Qp,
    memory: &MemoryTable,
    srqs: &mut IntMap<SrqId, RecvQueue>,
    completions: &mut VecDeque<Completion>,
    events: &mut VecDeque<AsyncEvent>,
) {
    if let Some((responder, mut ctx, _)) = resp_parts(qp, memory, srqs, completions, events) {
        responder.flush(&mut ctx);
    }
}

pub(crate) fn flush_completion(cq: CqId, qpn: u32, wr_id: u64, opcode: WcOpcode) -> Completion {
    Completion::error(cq, qpn, wr_id, opcode, WcStatus::WrFlushErr)
}
