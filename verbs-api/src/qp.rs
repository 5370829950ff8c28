//! Queue pairs, shared receive queues and address handles: `ibv_create_qp`,
//! `ibv_modify_qp`, `ibv_query_qp`, `ibv_post_send`, `ibv_post_recv`,
//! `ibv_create_srq`, `ibv_post_srq_recv`, `ibv_create_ah`.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use rocev2::transport::attr::{AddressVector, Mtu, QpAttrMask, QpCaps, QpInitAttr, QpState, QpType, SrqId};
use rocev2::transport::engine::EngineError;
use rocev2::transport::memory::{Access, LkeyCache};
use rocev2::transport::wqe::{PayloadRef, RecvWrRef, SendWrRef};
use rocev2::transport::wr::{RecvWr, SendOp, SendWr};
use urnic_datapath::queues::{QpRings, SrqRing, WqBound};

use crate::cq::Cq;
use crate::device::{Context, Gid};
use crate::error::{Error, ErrorKind, Result};
use crate::mr::Pd;

/// Address attributes (`struct ibv_ah_attr` with its GRH, as RoCE uses it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct AhAttr {
    /// Destination GID.
    pub dgid: Gid,
    /// Index of our source GID in the GID table (1 = the IPv4-mapped GID).
    pub sgid_index: u8,
    /// Traffic class (DSCP << 2 | ECN).
    pub traffic_class: u8,
    /// Hop limit / TTL (0 → 64).
    pub hop_limit: u8,
    /// Flow label (IPv6).
    pub flow_label: u32,
    /// Port (1).
    pub port_num: u8,
}

/// QP attributes as the application gives them (`struct ibv_qp_attr`): the
/// engine's attributes with a GID-based path.
pub type QpAttr = rocev2::transport::attr::QpAttr<AhAttr>;

/// Everything [`Qp::connect`] needs to take an RC or UC QP from RESET to RTS:
/// what the two sides exchange out of band (QPN, PSN, GID) plus the usual
/// knobs, with the defaults ibv_rc_pingpong and perftest use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Connect {
    /// The peer's QPN.
    pub remote_qpn: u32,
    /// The peer's GID.
    pub remote_gid: Gid,
    /// The PSN this side starts sending with (the peer's `rq_psn`).
    pub local_psn: u32,
    /// The PSN the peer starts sending with.
    pub remote_psn: u32,
    /// Our GID index (1 = the IPv4-mapped RoCEv2 GID).
    pub sgid_index: u8,
    /// Path MTU; `None` = the port's active MTU.
    pub mtu: Option<Mtu>,
    /// Remote access this QP grants.
    pub access: Access,
    /// Outstanding READ/ATOMIC in each direction.
    pub rd_atomic: u8,
    /// Local ACK timeout exponent (4.096 µs × 2^timeout).
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7 = forever).
    pub rnr_retry: u8,
    /// RNR NAK timer code this side advertises.
    pub min_rnr_timer: u8,
}

impl Connect {
    /// Defaults: GID index 1, active MTU, remote write/read/atomic allowed,
    /// 16 outstanding READ/ATOMIC, timeout 14 (67 ms), 7 retries, RNR retry forever.
    pub fn new(remote_qpn: u32, remote_gid: Gid, local_psn: u32, remote_psn: u32) -> Connect {
        Connect {
            remote_qpn,
            remote_gid,
            local_psn,
            remote_psn,
            sgid_index: 1,
            mtu: None,
            access: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            rd_atomic: 16,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
        }
    }
}

/// An address handle (`struct ibv_ah`): a resolved path for UD sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ah {
    pub(crate) av: AddressVector,
}

impl Ah {
    /// The resolved path.
    pub fn address_vector(&self) -> &AddressVector {
        &self.av
    }
}

const STATES: [QpState; 7] = [QpState::Reset, QpState::Init, QpState::Rtr, QpState::Rts, QpState::Sqd, QpState::Sqe, QpState::Err];

fn state_code(s: QpState) -> u8 {
    STATES.iter().position(|&x| x == s).unwrap_or(0) as u8
}

/// A queue pair (`struct ibv_qp`). Destroyed on drop.
pub struct Qp {
    pd: Pd,
    qpn: u32,
    qp_type: QpType,
    caps: QpCaps,
    rings: Arc<QpRings>,
    srq: Option<SrqId>,
    /// The state as last set by modify (the engine may move to ERR on its own;
    /// posting in ERR is allowed and flushes).
    state: AtomicU8,
    /// The checker's verdicts on this QP's recent lkeys (post-time SGE
    /// checks without the memory table's lock).
    lkeys: LkeyCache,
}

/// Arguments of [`Pd::create_qp`].
pub struct QpInit<'a> {
    /// Service.
    pub qp_type: QpType,
    /// CQ for send completions.
    pub send_cq: &'a Cq,
    /// CQ for receive completions.
    pub recv_cq: &'a Cq,
    /// Shared receive queue.
    pub srq: Option<&'a Srq>,
    /// Queue sizes.
    pub cap: QpCaps,
    /// Signal every send WR.
    pub sq_sig_all: bool,
}

impl Pd {
    /// `ibv_create_qp`.
    pub fn create_qp(&self, init: &QpInit<'_>) -> Result<Qp> {
        let inner = &self.ctx.inner;
        let lim = inner.limits;
        let c = init.cap;
        if c.max_send_wr == 0 || c.max_send_wr > lim.max_qp_wr || c.max_recv_wr > lim.max_qp_wr {
            return Err(Error::invalid(format!("queue depth outside 1..={}", lim.max_qp_wr)));
        }
        if c.max_send_sge > lim.max_sge || c.max_recv_sge > lim.max_sge {
            return Err(Error::invalid(format!("more than {} SGEs per WR", lim.max_sge)));
        }
        if c.max_inline_data > lim.max_inline_data {
            return Err(Error::invalid(format!("max_inline_data above {}", lim.max_inline_data)));
        }
        if init.srq.is_none() && c.max_recv_wr == 0 {
            return Err(Error::invalid("a QP without an SRQ needs max_recv_wr >= 1"));
        }
        for cq in [init.send_cq, init.recv_cq] {
            if !Arc::ptr_eq(&cq.ctx.inner, inner) {
                return Err(Error::invalid("CQ belongs to another device"));
            }
        }
        if inner.qp_count.fetch_add(1, Ordering::AcqRel) >= lim.max_qp {
            inner.qp_count.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::new(ErrorKind::NoResources, format!("device has its maximum of {} QPs", lim.max_qp)));
        }
        let attr = QpInitAttr {
            qp_type: init.qp_type,
            pd: self.id,
            send_cq: init.send_cq.cq_id(),
            recv_cq: init.recv_cq.cq_id(),
            srq: init.srq.map(|s| s.id),
            cap: c,
            sq_sig_all: init.sq_sig_all,
        };
        // The engine's counts of retired WQEs bound the rings: a post into a
        // queue whose depth of WRs is outstanding is refused at once (ENOMEM).
        let created = inner.nic.create_qp_engine(attr.srq, |e| {
            let qpn = e.create_qp(&attr)?;
            let counts = e.qp_retired_counts(qpn).ok_or(EngineError::NoSuchQp(qpn))?;
            Ok::<_, EngineError>((qpn, counts))
        });
        let (qpn, (sq_retired, rq_retired)) = match created {
            Ok(q) => q,
            Err(e) => {
                inner.qp_count.fetch_sub(1, Ordering::AcqRel);
                return Err(Error::engine("create_qp", e));
            }
        };
        let send = WqBound { depth: c.max_send_wr as usize, retired: sq_retired };
        // With an SRQ the QP's own receive ring takes no posts (post_recv
        // refuses first).
        let recv_depth = c.max_recv_wr.max(1) as usize;
        let recv = rq_retired.map_or_else(|| WqBound::unshared(recv_depth), |retired| WqBound { depth: recv_depth, retired });
        let rings = Arc::new(QpRings::new(qpn, attr.send_cq, attr.recv_cq, send, recv));
        inner.nic.attach_qp(rings.clone());
        Ok(Qp {
            pd: self.clone(),
            qpn,
            qp_type: init.qp_type,
            caps: c,
            rings,
            srq: attr.srq,
            state: AtomicU8::new(state_code(QpState::Reset)),
            lkeys: LkeyCache::new(),
        })
    }

    /// `ibv_create_ah`: resolve a path (neighbour lookup) for UD sends.
    pub fn create_ah(&self, attr: &AhAttr) -> Result<Ah> {
        Ok(Ah { av: self.ctx.inner.resolve_path(attr)? })
    }

    /// `ibv_create_srq`.
    pub fn create_srq(&self, max_wr: u32, max_sge: u32) -> Result<Srq> {
        let inner = &self.ctx.inner;
        let lim = inner.limits;
        if max_wr == 0 || max_wr > lim.max_srq_wr || max_sge == 0 || max_sge > lim.max_sge {
            return Err(Error::invalid(format!("SRQ sizes outside 1..={} WRs, 1..={} SGEs", lim.max_srq_wr, lim.max_sge)));
        }
        if inner.srq_count.fetch_add(1, Ordering::AcqRel) >= lim.max_srq {
            inner.srq_count.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::new(ErrorKind::NoResources, format!("device has its maximum of {} SRQs", lim.max_srq)));
        }
        let created = inner.nic.with_next_engine(|e| {
            let id = e.create_srq(self.id, max_wr, max_sge)?;
            Ok::<_, EngineError>((id, e.srq_retired_count(id).ok_or(EngineError::NoSuchSrq(id))?))
        });
        let (id, retired) = match created {
            Ok(c) => c,
            Err(e) => {
                inner.srq_count.fetch_sub(1, Ordering::AcqRel);
                return Err(Error::engine("create_srq", e));
            }
        };
        let ring = Arc::new(SrqRing::new(id, WqBound { depth: max_wr as usize, retired }));
        inner.nic.attach_srq(ring.clone());
        Ok(Srq { pd: self.clone(), id, ring, max_sge, lkeys: LkeyCache::new() })
    }
}

impl Qp {
    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        self.qpn
    }

    /// The service type.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// The capabilities it was created with.
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    fn ctx(&self) -> &Context {
        &self.pd.ctx
    }

    pub(crate) fn pd(&self) -> &Pd {
        &self.pd
    }

    /// `ibv_modify_qp`. The path in `attr.ah_attr` is resolved (neighbour
    /// lookup) when `QpAttrMask::AV` is set.
    pub fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        let inner = &self.ctx().inner;
        let resolved = if mask.contains(QpAttrMask::AV) {
            if attr.ah_attr.is_none() {
                return Err(Error::invalid("IBV_QP_AV set but ah_attr is None"));
            }
            attr.map_path(|ah| inner.resolve_path(&ah))?
        } else {
            // The path is not being changed: hand the engine no path at all.
            let mut unpathed = *attr;
            unpathed.ah_attr = None;
            unpathed.map_path(|ah| inner.resolve_path(&ah))?
        };
        if mask.contains(QpAttrMask::PATH_MTU) && resolved.path_mtu > inner.active_mtu {
            return Err(Error::invalid(format!("path_mtu {} exceeds the port's active MTU {}", resolved.path_mtu.bytes(), inner.active_mtu.bytes())));
        }
        inner.nic.with_engine_of(self.qpn, |e| e.modify_qp(self.qpn, &resolved, mask)).map_err(|e| Error::engine("modify_qp", e))?;
        if mask.contains(QpAttrMask::STATE) {
            self.state.store(state_code(attr.qp_state), Ordering::Release);
        }
        Ok(())
    }

    /// This QP's counters: packets/bytes each way, retransmissions, timeouts,
    /// NAKs and RNR NAKs sent and received by kind, duplicates, drops.
    pub fn stats(&self) -> Result<rocev2::transport::stats::QpStats> {
        self.ctx()
            .inner
            .nic
            .with_engine_of(self.qpn, |e| e.qp_stats(self.qpn).copied())
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("QP {:#x} is gone", self.qpn)))
    }

    /// Take an RC or UC QP from RESET through INIT and RTR to RTS with the
    /// three `ibv_modify_qp` calls every ibverbs program makes. A QP already
    /// in INIT (moved there to post receives before the peer is known, as
    /// `ibv_rc_pingpong` does) keeps its INIT attributes and goes on from there.
    pub fn connect(&self, c: &Connect) -> Result<()> {
        if self.qp_type == QpType::Ud {
            return Err(Error::invalid("connect is for RC and UC QPs"));
        }
        let rc = self.qp_type == QpType::Rc;
        let mtu = match c.mtu {
            Some(m) => m,
            None => self.ctx().query_port(1)?.active_mtu,
        };
        let mut a = QpAttr { qp_state: QpState::Init, qp_access_flags: c.access, ..QpAttr::default() };
        if self.query()?.qp_state != QpState::Init {
            self.modify(&a, QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS)?;
        }
        a.qp_state = QpState::Rtr;
        a.path_mtu = mtu;
        a.dest_qp_num = c.remote_qpn;
        a.rq_psn = rocev2::Psn::new(c.remote_psn);
        a.max_dest_rd_atomic = c.rd_atomic;
        a.min_rnr_timer = c.min_rnr_timer;
        a.ah_attr = Some(AhAttr { dgid: c.remote_gid, sgid_index: c.sgid_index, port_num: 1, ..AhAttr::default() });
        let mut m = QpAttrMask::STATE | QpAttrMask::AV | QpAttrMask::PATH_MTU | QpAttrMask::DEST_QPN | QpAttrMask::RQ_PSN;
        if rc {
            m |= QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER;
        }
        self.modify(&a, m)?;
        a.qp_state = QpState::Rts;
        a.sq_psn = rocev2::Psn::new(c.local_psn);
        a.timeout = c.timeout;
        a.retry_cnt = c.retry_cnt;
        a.rnr_retry = c.rnr_retry;
        a.max_rd_atomic = c.rd_atomic;
        let mut m = QpAttrMask::STATE | QpAttrMask::SQ_PSN;
        if rc {
            m |= QpAttrMask::TIMEOUT | QpAttrMask::RETRY_CNT | QpAttrMask::RNR_RETRY | QpAttrMask::MAX_QP_RD_ATOMIC;
        }
        self.modify(&a, m)
    }

    /// Switch DCQCN's rate limiting on or off for this QP (CNPs are still
    /// counted). The device default is `DeviceConfig::dcqcn`.
    pub fn set_congestion_control(&self, enabled: bool) -> Result<()> {
        self.ctx().inner.nic.with_engine_of(self.qpn, |e| e.set_qp_dcqcn(self.qpn, enabled)).map_err(|e| Error::engine("set_congestion_control", e))
    }

    /// DCQCN state of this QP: (current rate Mb/s, rate-limited, CNPs received).
    pub fn congestion_state(&self) -> Result<(f64, bool, u64)> {
        self.ctx()
            .inner
            .nic
            .with_engine_of(self.qpn, |e| e.qp_dcqcn(self.qpn).map(|rp| (rp.rate_mbps(), rp.is_limited(), rp.stats.cnps)))
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("QP {:#x} is gone", self.qpn)))
    }

    /// `ibv_query_qp`.
    pub fn query(&self) -> Result<rocev2::transport::attr::QpAttr> {
        self.ctx().inner.nic.with_engine_of(self.qpn, |e| e.query_qp(self.qpn)).map_err(|e| Error::engine("query_qp", e))
    }

    fn state(&self) -> QpState {
        STATES[usize::from(self.state.load(Ordering::Acquire)).min(6)]
    }

    /// `ibv_post_send`. Arguments are checked before anything is queued: a bad
    /// WR returns an error and leaves the queue untouched. SGEs are checked
    /// by the memory table's checker, the datapath's own, answered from this
    /// QP's memo of its verdicts while the table is unchanged
    /// ([`MemoryTable::local_check_sgl_cached`](rocev2::transport::memory::MemoryTable::local_check_sgl_cached));
    /// the queue itself is lock-free. The WR is copied into its ring slot.
    pub fn post_send(&self, wr: &SendWr) -> Result<()> {
        self.post_send_ref(&wr.borrowed())
    }

    /// [`Qp::post_send`] over borrowed SGEs / inline bytes. Takes no lock
    /// and allocates nothing for WRs of up to
    /// [`SEND_WQE_SGES`](rocev2::transport::wqe::SEND_WQE_SGES) SGEs (any
    /// inline WR the QP accepts fits its slot): the post path of the C
    /// library.
    pub fn post_send_ref(&self, wr: &SendWrRef<'_>) -> Result<()> {
        self.check_send(wr)?;
        if !self.rings.push_send(wr) {
            return Err(Error::new(ErrorKind::NoResources, format!("send queue of QP {:#x} is full", self.qpn)));
        }
        self.ctx().inner.nic.ring_qp(&self.rings);
        Ok(())
    }

    /// Post several send WRs; stops at the first bad one, returning its index.
    pub fn post_send_list(&self, wrs: &[SendWr]) -> core::result::Result<(), (usize, Error)> {
        for (i, wr) in wrs.iter().enumerate() {
            let wr = wr.borrowed();
            self.check_send(&wr).map_err(|e| (i, e))?;
            if !self.rings.push_send(&wr) {
                self.ctx().inner.nic.ring_qp(&self.rings);
                return Err((i, Error::new(ErrorKind::NoResources, "send queue full")));
            }
        }
        self.ctx().inner.nic.ring_qp(&self.rings);
        Ok(())
    }

    fn check_send(&self, wr: &SendWrRef<'_>) -> Result<()> {
        let st = self.state();
        if !matches!(st, QpState::Rts | QpState::Sqd | QpState::Sqe | QpState::Err) {
            return Err(Error::new(ErrorKind::InvalidState, format!("post_send on a QP in {st:?} (needs RTS)")));
        }
        let max_msg_size = self.ctx().inner.limits.max_msg_size;
        match wr.payload {
            PayloadRef::Sgl(sgl) => {
                if sgl.len() > self.caps.max_send_sge as usize {
                    return Err(Error::invalid(format!("{} SGEs > max_send_sge {}", sgl.len(), self.caps.max_send_sge)));
                }
                let need_write = matches!(wr.op, SendOp::Read { .. } | SendOp::CmpSwap { .. } | SendOp::FetchAdd { .. });
                crate::mr::check_sgl_cached(&self.ctx().inner.memory, &self.lkeys, self.pd.id, sgl, need_write)?;
            }
            PayloadRef::Inline(data) => {
                if data.len() > self.caps.max_inline_data as usize {
                    return Err(Error::invalid(format!("{} inline bytes > max_inline_data {}", data.len(), self.caps.max_inline_data)));
                }
                if !matches!(
                    wr.op,
                    SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } | SendOp::Write { .. } | SendOp::WriteWithImm { .. }
                ) {
                    return Err(Error::invalid("inline data is only for SEND and RDMA WRITE"));
                }
            }
        }
        let len = wr.payload.len();
        if len > u64::from(max_msg_size) {
            return Err(Error::invalid(format!("message of {len} bytes > max_msg_size {max_msg_size}")));
        }
        let is_send = matches!(wr.op, SendOp::Send | SendOp::SendWithImm { .. });
        match self.qp_type {
            QpType::Ud => {
                if !is_send {
                    return Err(Error::invalid(format!("{:?} is not allowed on a UD QP", wr.op)));
                }
                if wr.ud.is_none() {
                    return Err(Error::invalid("a UD send needs wr.ud (address handle, remote QPN, Q_Key)"));
                }
                let mtu = self.ctx().inner.active_mtu.bytes();
                if len > u64::from(mtu) {
                    return Err(Error::invalid(format!("UD message of {len} bytes > path MTU {mtu}")));
                }
            }
            QpType::Uc => {
                if matches!(wr.op, SendOp::Read { .. } | SendOp::CmpSwap { .. } | SendOp::FetchAdd { .. }) {
                    return Err(Error::invalid(format!("{:?} is not allowed on a UC QP", wr.op)));
                }
            }
            QpType::Rc => {}
        }
        if self.qp_type != QpType::Ud && wr.ud.is_some() {
            return Err(Error::invalid("wr.ud is only for UD QPs"));
        }
        if let SendOp::CmpSwap { remote, .. } | SendOp::FetchAdd { remote, .. } = wr.op {
            if len != 8 {
                return Err(Error::invalid(format!("atomic needs exactly 8 local bytes, got {len}")));
            }
            if remote.addr % 8 != 0 {
                return Err(Error::invalid(format!("atomic remote address {:#x} is not 8-byte aligned", remote.addr)));
            }
        }
        Ok(())
    }

    /// `ibv_post_recv`. SGEs are checked as in [`Qp::post_send`]; the queue
    /// is lock-free.
    pub fn post_recv(&self, wr: &RecvWr) -> Result<()> {
        self.post_recv_ref(&wr.borrowed())
    }

    /// [`Qp::post_recv`] over a borrowed SGE list: no lock, and no
    /// allocation for up to [`RECV_WQE_SGES`](rocev2::transport::wqe::RECV_WQE_SGES) SGEs.
    pub fn post_recv_ref(&self, wr: &RecvWrRef<'_>) -> Result<()> {
        if self.srq.is_some() {
            return Err(Error::invalid("QP uses an SRQ: post receives with Srq::post_recv"));
        }
        let st = self.state();
        if st == QpState::Reset {
            return Err(Error::new(ErrorKind::InvalidState, "post_recv on a QP in RESET"));
        }
        if wr.sgl.len() > self.caps.max_recv_sge as usize {
            return Err(Error::invalid(format!("{} SGEs > max_recv_sge {}", wr.sgl.len(), self.caps.max_recv_sge)));
        }
        crate::mr::check_sgl_cached(&self.ctx().inner.memory, &self.lkeys, self.pd.id, wr.sgl, true)?;
        if !self.rings.recv.push(wr) {
            return Err(Error::new(ErrorKind::NoResources, format!("receive queue of QP {:#x} is full", self.qpn)));
        }
        self.ctx().inner.nic.ring_qp(&self.rings);
        Ok(())
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        self.flush_posted_sends();
        self.detach_all_mcast();
        let inner = &self.pd.ctx.inner;
        let _ = inner.nic.with_engine_of(self.qpn, |e| e.destroy_qp(self.qpn));
        inner.nic.detach_qp(self.qpn);
        inner.qp_count.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Qp {
    /// Send WRs posted but not yet taken by the datapath leave before the
    /// QP goes, as on an HCA whose doorbell starts the DMA (rxe runs its
    /// requester inside `ibv_post_send`): a program that posts unsignaled
    /// UD sends and destroys the QP at once (Debian's `mckey` sender) has
    /// them on the wire. Bounded: the datapath takes a ring in one poll.
    fn flush_posted_sends(&self) {
        let nic = &self.pd.ctx.inner.nic;
        let shard = nic.shard_of(self.qpn);
        for _ in 0..64 {
            if self.rings.send.is_empty() {
                return;
            }
            nic.poll_shard(shard);
        }
    }
}

/// A shared receive queue (`struct ibv_srq`). Destroyed on drop.
pub struct Srq {
    pd: Pd,
    id: SrqId,
    ring: Arc<SrqRing>,
    max_sge: u32,
    /// As [`Qp`]'s: the checker's verdicts on recent lkeys.
    lkeys: LkeyCache,
}

impl Srq {
    /// `ibv_post_srq_recv`. SGEs are checked as in [`Qp::post_send`]; the
    /// queue is lock-free.
    pub fn post_recv(&self, wr: &RecvWr) -> Result<()> {
        self.post_recv_ref(&wr.borrowed())
    }

    /// [`Srq::post_recv`] over a borrowed SGE list (no lock, no allocation
    /// as for [`Qp::post_recv_ref`]).
    pub fn post_recv_ref(&self, wr: &RecvWrRef<'_>) -> Result<()> {
        if wr.sgl.len() > self.max_sge as usize {
            return Err(Error::invalid(format!("{} SGEs > SRQ max_sge {}", wr.sgl.len(), self.max_sge)));
        }
        crate::mr::check_sgl_cached(&self.pd.ctx.inner.memory, &self.lkeys, self.pd.id, wr.sgl, true)?;
        if !self.ring.recv.push(wr) {
            return Err(Error::new(ErrorKind::NoResources, format!("SRQ {} is full", self.id.0)));
        }
        self.pd.ctx.inner.nic.ring_srq(&self.ring);
        Ok(())
    }

    /// `ibv_modify_srq` with `IBV_SRQ_LIMIT`: arm the limit event, raised once
    /// when fewer than `limit` WRs remain.
    pub fn arm_limit(&self, limit: u32) -> Result<()> {
        self.pd.ctx.inner.nic.with_engine_of(self.id.0, |e| e.modify_srq(self.id, limit)).map_err(|e| Error::engine("modify_srq", e))
    }

    /// The SRQ's number.
    pub fn id(&self) -> u32 {
        self.id.0
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        let inner = &self.pd.ctx.inner;
        let _ = inner.nic.with_engine_of(self.id.0, |e| e.destroy_srq(self.id));
        inner.nic.detach_srq(self.id);
        inner.srq_count.fetch_sub(1, Ordering::AcqRel);
    }
}
