//! Two transport engines, each with one registered buffer and one QP
//! connected to the other's (RC or UC), joined directly: frames move from
//! one engine's `poll_transmit` to the other's `handle_frame` in virtual
//! time, with an optional per-frame filter that sees, changes or drops
//! each one, and timers fire when both are quiet.
//!
//! This is the harness of the crate's transport rule and hostile-peer tests
//! and of the benches; [`Pair::into_network`] hands the two engines to a
//! [`Network`] instead, for links with delay and impairments.
//!
//! The driver does no per-frame work beyond moving the frame unless a
//! filter is given or recording is on ([`Pair::record`]): only then is
//! each frame parsed.

use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

use crate::sim::network::{Network, NodeId, MAX_FRAME};
use crate::sim::rc::{bring_up_rc, bring_up_uc, HostAddr, RcParams};
use crate::sim::LinkConfig;
use crate::time::Instant;
use crate::transport::attr::{QpCaps, QpInitAttr, QpState, QpType};
use crate::transport::engine::{Engine, EngineConfig, EngineError};
use crate::transport::memory::{Access, MemoryTable, PdId, RegError};
use crate::transport::wr::{CqId, RemoteAddr, Sge, WorkCompletion};
use crate::wire::{parse_frame, FrameRepr, TransportRepr};
use crate::Psn;

/// Virtual time between two frames the driver moves (one 100 Gb/s frame
/// of about 1 KiB).
pub const FRAME_GAP: Duration = Duration::from_nanos(100);

/// How long [`Pair::run`] may go on in virtual time: long enough for every
/// retry and RNR budget of the default parameters to run out.
pub const RUN_LIMIT: Duration = Duration::from_secs(60);

/// IOVA of host `a`'s buffer and of host `b`'s.
pub const IOVA: [u64; 2] = [0x1000_0000, 0x2000_0000];

/// Every access right of a memory region or QP (local write, remote write,
/// read and atomic).
pub const ALL_ACCESS: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ).union(Access::REMOTE_ATOMIC);

/// How to build a [`Pair`]. Index 0 is host `a`, index 1 host `b`.
#[derive(Clone, Copy, Debug)]
pub struct PairConfig {
    /// The hosts' addresses.
    pub hosts: [HostAddr; 2],
    /// Each engine's configuration (first QPN, DCQCN...).
    pub engines: [EngineConfig; 2],
    /// The QP each engine creates (`qp_type` `Rc` or `Uc`); `pd` is also
    /// the buffers' protection domain.
    pub qp: QpInitAttr,
    /// Each side's connection parameters (for UC only `access`, `mtu` and
    /// `sq_psn` apply).
    pub params: [RcParams; 2],
    /// Length of each host's buffer in bytes (rounded up to 8).
    pub buf_len: usize,
    /// Access rights of the buffers' memory regions.
    pub mr_access: Access,
}

impl Default for PairConfig {
    /// Two IPv4 hosts (10.0.0.1 and .2), default engines, RC QPs with 64
    /// WRs and 4 SGEs per queue, 64 bytes inline, every WR signaled, send
    /// completions on CQ 1 and receive completions on CQ 2; default
    /// [`RcParams`] with first PSNs 100 and 200; 1 MiB buffers with every
    /// access right.
    fn default() -> Self {
        let cap = QpCaps { max_send_wr: 64, max_recv_wr: 64, max_send_sge: 4, max_recv_sge: 4, max_inline_data: 64 };
        PairConfig {
            hosts: [HostAddr::ipv4(1), HostAddr::ipv4(2)],
            engines: [EngineConfig::default(); 2],
            qp: QpInitAttr { qp_type: QpType::Rc, pd: PdId(1), send_cq: CqId(1), recv_cq: CqId(2), srq: None, cap, sq_sig_all: true },
            params: [RcParams { sq_psn: Psn::new(100), ..RcParams::default() }, RcParams { sq_psn: Psn::new(200), ..RcParams::default() }],
            buf_len: 1 << 20,
            mr_access: ALL_ACCESS,
        }
    }
}

/// Why a [`Pair`] could not be built.
#[derive(Debug, Error)]
pub enum PairError {
    /// Registering a buffer failed.
    #[error("registering the buffer: {0}")]
    Register(#[from] RegError),
    /// Creating or connecting a QP failed.
    #[error("setting up the QP: {0}")]
    Engine(#[from] EngineError),
    /// The pair connects RC or UC QPs only.
    #[error("a pair connects RC or UC QPs, not {0:?}")]
    QpType(QpType),
}

/// A buffer registered as a memory region: the memory the engine reads and
/// writes through the region's pointer, 8-byte aligned, and its keys.
///
/// The memory is reached only through the pointer handed to the table (the
/// slices [`Mr::bytes`] and [`Mr::bytes_mut`] give are made from it), so
/// the engine's accesses and the test's never go through two owners. The
/// memory is freed on drop: drop the engine (its table) first.
#[derive(Debug)]
pub struct Mr {
    ptr: NonNull<u64>,
    words: usize,
    key: u32,
    iova: u64,
}

impl Mr {
    /// A zeroed buffer of `len` bytes (rounded up to 8) at `iova`,
    /// registered in `table` for `pd` with `access`.
    pub fn new(table: &MemoryTable, pd: PdId, len: usize, iova: u64, access: Access) -> Result<Mr, RegError> {
        let words = len.div_ceil(8);
        let raw = Box::into_raw(vec![0u64; words].into_boxed_slice());
        // SAFETY: `Box::into_raw` never returns null.
        let ptr = unsafe { NonNull::new_unchecked(raw as *mut u64) };
        // SAFETY: the allocation lives until this `Mr` is dropped, which
        // its documentation puts after the table's users.
        match unsafe { table.register(pd, ptr.as_ptr() as *mut u8, words * 8, iova, access) } {
            Ok(keys) => Ok(Mr { ptr, words, key: keys.lkey, iova }),
            Err(e) => {
                // SAFETY: `raw` came from `Box::into_raw` and was not registered.
                drop(unsafe { Box::from_raw(raw) });
                Err(e)
            }
        }
    }

    /// The region's lkey, which is also its rkey.
    #[inline]
    pub fn key(&self) -> u32 {
        self.key
    }

    /// The address of the first byte in SGEs and remote addresses.
    #[inline]
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.words * 8
    }

    /// Whether the buffer has no bytes.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.words == 0
    }

    /// The IOVA of byte `off`.
    #[inline]
    pub fn va(&self, off: usize) -> u64 {
        self.iova + off as u64
    }

    /// A local SGE of `len` bytes at byte `off`.
    #[inline]
    pub fn sge(&self, off: usize, len: u32) -> Sge {
        Sge { addr: self.va(off), length: len, lkey: self.key }
    }

    /// The remote address of byte `off`, for a peer's WRITE, READ or atomic.
    #[inline]
    pub fn remote(&self, off: usize) -> RemoteAddr {
        RemoteAddr { addr: self.va(off), rkey: self.key }
    }

    /// The buffer's bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` points to `words` initialised u64s owned by this Mr;
        // any byte of them is a valid u8; nothing writes them while the
        // shared borrow of `self` lasts (the engine writes only inside its
        // own calls, which need the host mutably).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr() as *const u8, self.words * 8) }
    }

    /// The buffer's bytes, to fill.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and the borrow of `self` is unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr() as *mut u8, self.words * 8) }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        let raw = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.words);
        // SAFETY: made by `Box::into_raw` of a boxed slice of `words` u64s in `new`.
        drop(unsafe { Box::from_raw(raw) });
    }
}

/// One side of a [`Pair`]: an engine, its address, its QP and its buffer.
pub struct Host {
    /// The transport engine.
    pub engine: Engine,
    /// The host's addresses.
    pub addr: HostAddr,
    /// The QP connected to the other host's.
    pub qpn: u32,
    /// The registered buffer (dropped after `engine`: field order).
    pub mr: Mr,
}

impl Host {
    /// The buffer's bytes.
    pub fn mem(&self) -> &[u8] {
        self.mr.bytes()
    }

    /// The buffer's bytes, to fill.
    pub fn mem_mut(&mut self) -> &mut [u8] {
        self.mr.bytes_mut()
    }

    /// The IOVA of byte `off` of the buffer.
    #[inline]
    pub fn va(&self, off: usize) -> u64 {
        self.mr.va(off)
    }

    /// A local SGE of `len` bytes at byte `off` of the buffer.
    #[inline]
    pub fn sge(&self, off: usize, len: u32) -> Sge {
        self.mr.sge(off, len)
    }

    /// The remote address of byte `off` of the buffer.
    #[inline]
    pub fn remote(&self, off: usize) -> RemoteAddr {
        self.mr.remote(off)
    }

    /// Every completion the engine has, in order.
    pub fn completions(&mut self) -> Vec<WorkCompletion> {
        std::iter::from_fn(|| self.engine.poll_completion()).map(|c| c.wc).collect()
    }

    /// The QP's state.
    ///
    /// # Panics
    /// If the QP was destroyed.
    pub fn qp_state(&self) -> QpState {
        self.engine.qp_state(self.qpn).expect("the pair's QP exists")
    }

    /// The PSN the QP's responder expects next.
    ///
    /// # Panics
    /// If the QP was destroyed.
    pub fn rq_psn(&self) -> Psn {
        self.engine.query_qp(self.qpn).expect("the pair's QP exists").rq_psn
    }

    /// The PSN the QP's requester uses next.
    ///
    /// # Panics
    /// If the QP was destroyed.
    pub fn sq_psn(&self) -> Psn {
        self.engine.query_qp(self.qpn).expect("the pair's QP exists").sq_psn
    }
}

/// The direction a frame travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dir {
    /// From host `a` to host `b`.
    AtoB,
    /// From host `b` to host `a`.
    BtoA,
}

/// A frame in flight, as a filter sees it.
#[derive(Debug)]
pub struct Frame<'a> {
    /// Which way it goes.
    pub dir: Dir,
    /// Its position among the frames of this run (from 0).
    pub index: usize,
    /// When it left.
    pub at: Instant,
    /// Its headers as it left the sender (changes to `bytes` are not
    /// reflected here).
    pub repr: FrameRepr,
    /// The frame itself, which the filter may change before it is
    /// delivered (ICRC and checksums are the filter's concern).
    pub bytes: &'a mut [u8],
}

/// A frame that crossed (or was dropped), as [`Pair::record`] keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sent {
    /// Which way it went.
    pub dir: Dir,
    /// When it left.
    pub at: Instant,
    /// Its transport headers.
    pub transport: TransportRepr,
    /// Whether it was delivered (the filter kept it).
    pub delivered: bool,
}

/// Two connected hosts, `a` and `b`, and the virtual time between them.
pub struct Pair {
    /// Host `a` (the requester in most uses).
    pub a: Host,
    /// Host `b`.
    pub b: Host,
    /// The current virtual time.
    pub now: Instant,
    log: Option<Vec<Sent>>,
    buf: Box<[u8]>,
}

impl Pair {
    /// Two engines with a buffer and a QP each, the QPs connected to each
    /// other (RESET to RTS, both sides), at virtual time zero.
    pub fn new(cfg: &PairConfig) -> Result<Pair, PairError> {
        let (mut a, mut b) = (Self::host(cfg, 0)?, Self::host(cfg, 1)?);
        let (pa, pb) = (&cfg.params[0], &cfg.params[1]);
        let bring_up = match cfg.qp.qp_type {
            QpType::Rc => bring_up_rc,
            QpType::Uc => bring_up_uc,
            other => return Err(PairError::QpType(other)),
        };
        bring_up(&mut a.engine, a.qpn, &a.addr, &b.addr, b.qpn, pb.sq_psn, pa)?;
        bring_up(&mut b.engine, b.qpn, &b.addr, &a.addr, a.qpn, pa.sq_psn, pb)?;
        Ok(Pair { a, b, now: Instant::ZERO, log: None, buf: vec![0; MAX_FRAME].into_boxed_slice() })
    }

    /// Host `i` of `cfg`: a buffer registered in a new table, the engine
    /// over that table and its QP, in RESET.
    fn host(cfg: &PairConfig, i: usize) -> Result<Host, PairError> {
        let table = Arc::new(MemoryTable::new());
        let mr = Mr::new(&table, cfg.qp.pd, cfg.buf_len, IOVA[i], cfg.mr_access)?;
        let mut engine = Engine::new(cfg.engines[i], table);
        let qpn = engine.create_qp(&cfg.qp)?;
        Ok(Host { engine, addr: cfg.hosts[i], qpn, mr })
    }

    /// Keep every frame that crosses from now on (see [`Pair::log`]); each
    /// is parsed, filter or not.
    pub fn record(&mut self) {
        self.log.get_or_insert_with(Vec::new);
    }

    /// The frames that crossed or were dropped since [`Pair::record`], in
    /// order (empty when not recording).
    pub fn log(&self) -> &[Sent] {
        self.log.as_deref().unwrap_or(&[])
    }

    /// Move frames both ways until neither engine has one to send and no
    /// timer is due within [`RUN_LIMIT`] of virtual time.
    pub fn run(&mut self) {
        self.run_for(RUN_LIMIT);
    }

    /// [`Pair::run`] for at most `max` of virtual time: no timer due at or
    /// after `now + max` fires.
    pub fn run_for(&mut self, max: Duration) {
        self.drive(max, None::<fn(&mut Frame<'_>) -> bool>);
    }

    /// [`Pair::run_for`] with `keep` deciding for each frame whether it is
    /// delivered (`true`) or lost; it may also change the frame. Returns
    /// the frames it dropped, in order, for the caller to deliver later or
    /// inspect.
    ///
    /// # Panics
    /// If an engine sends a frame that does not parse (an engine bug).
    pub fn run_filtered(&mut self, max: Duration, keep: impl FnMut(&mut Frame<'_>) -> bool) -> Vec<Vec<u8>> {
        self.drive(max, Some(keep))
    }

    /// [`Pair::run_filtered`] losing only the first frame going `dir` that
    /// `lose` picks; every other frame is delivered as sent. Whether one
    /// was lost.
    pub fn run_losing_first(&mut self, max: Duration, dir: Dir, mut lose: impl FnMut(&Frame<'_>) -> bool) -> bool {
        let mut lost = false;
        self.run_filtered(max, |f| {
            if !lost && f.dir == dir && lose(f) {
                lost = true;
                return false;
            }
            true
        });
        lost
    }

    /// The loop: each round, first everything `a` sends, then everything
    /// `b` sends, each frame delivered at once and [`FRAME_GAP`] apart;
    /// when a round moves nothing, both engines' timers fire at the earlier
    /// deadline, if it is before the end.
    fn drive<F: FnMut(&mut Frame<'_>) -> bool>(&mut self, max: Duration, mut keep: Option<F>) -> Vec<Vec<u8>> {
        let end = self.now + max;
        let mut dropped = Vec::new();
        let mut index = 0;
        loop {
            let mut moved = false;
            for dir in [Dir::AtoB, Dir::BtoA] {
                let (from, to) = match dir {
                    Dir::AtoB => (&mut self.a.engine, &mut self.b.engine),
                    Dir::BtoA => (&mut self.b.engine, &mut self.a.engine),
                };
                while let Some(len) = from.poll_transmit(self.now, &mut self.buf) {
                    moved = true;
                    let bytes = &mut self.buf[..len];
                    let deliver = if keep.is_none() && self.log.is_none() {
                        true
                    } else {
                        let repr = parse_frame(bytes).expect("engines send valid frames").repr;
                        let at = self.now;
                        let deliver = match keep.as_mut() {
                            Some(keep) => keep(&mut Frame { dir, index, at, repr, bytes: &mut *bytes }),
                            None => true,
                        };
                        if let Some(log) = self.log.as_mut() {
                            log.push(Sent { dir, at, transport: repr.transport, delivered: deliver });
                        }
                        deliver
                    };
                    index += 1;
                    if deliver {
                        to.handle_frame(self.now, bytes);
                    } else {
                        dropped.push(bytes.to_vec());
                    }
                    self.now += FRAME_GAP;
                }
            }
            if moved {
                continue;
            }
            match [self.a.engine.next_timeout(), self.b.engine.next_timeout()].into_iter().flatten().min() {
                Some(t) if t < end => {
                    self.now = self.now.max(t);
                    self.a.engine.handle_timeout(self.now);
                    self.b.engine.handle_timeout(self.now);
                }
                _ => return dropped,
            }
        }
    }

    /// Hand both engines to a [`Network`] at the pair's time, joined by a
    /// link with `link` each way (seeded from `seed`, as
    /// [`Network::connect_pair`]).
    pub fn into_network(self, link: LinkConfig, seed: u64) -> NetworkPair {
        let Pair { a, b, now, .. } = self;
        let mut net = Network::new(now);
        let na = net.add_node(a.engine, a.addr.mac);
        let nb = net.add_node(b.engine, b.addr.mac);
        net.connect_pair(na, nb, link, seed);
        NetworkPair { net, nodes: [na, nb], addr: [a.addr, b.addr], qpn: [a.qpn, b.qpn], mr: [a.mr, b.mr] }
    }
}

/// A [`Pair`] whose engines run in a [`Network`] (see
/// [`Pair::into_network`]). Index 0 is host `a`, index 1 host `b`.
pub struct NetworkPair {
    /// The network holding both engines.
    pub net: Network<Engine>,
    /// Each host's node.
    pub nodes: [NodeId; 2],
    /// Each host's addresses.
    pub addr: [HostAddr; 2],
    /// Each host's QP.
    pub qpn: [u32; 2],
    /// Each host's buffer (dropped after `net`: field order).
    pub mr: [Mr; 2],
}

impl NetworkPair {
    /// Host `i`'s engine.
    pub fn engine(&mut self, i: usize) -> &mut Engine {
        self.net.node_mut(self.nodes[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::attr::Mtu;
    use crate::transport::wr::{Payload, RecvWr, SendFlags, SendOp, SendWr, WcStatus};
    use crate::wire::Opcode;

    fn write(id: u64, from: &Host, to: &Host, off: usize, len: u32) -> SendWr {
        SendWr {
            wr_id: id,
            op: SendOp::Write { remote: to.remote(off) },
            payload: Payload::Sgl(vec![from.sge(off, len)]),
            flags: SendFlags::SIGNALED,
            ud: None,
        }
    }

    #[test]
    fn a_write_crosses_and_the_filter_sees_every_frame() {
        for qp_type in [QpType::Rc, QpType::Uc] {
            let mut cfg = PairConfig::default();
            cfg.qp.qp_type = qp_type;
            let mut p = Pair::new(&cfg).unwrap();
            p.record();
            p.a.mem_mut()[..3000].iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
            let w = write(1, &p.a, &p.b, 0, 3000);
            p.a.engine.post_send(p.a.qpn, w).unwrap();
            let mut seen = Vec::new();
            let dropped = p.run_filtered(RUN_LIMIT, |f| {
                seen.push((f.dir, f.index, f.repr.transport.bth.opcode));
                true
            });
            assert!(dropped.is_empty());
            assert_eq!(&p.b.mem()[..3000], &p.a.mem()[..3000], "{qp_type:?}");
            let c = p.a.completions();
            assert_eq!((c.len(), c[0].status), (1, WcStatus::Success), "{qp_type:?}");
            let want = if qp_type == QpType::Rc { 4 } else { 3 };
            assert_eq!(seen.len(), want, "three data frames (and an ACK on RC): {seen:?}");
            assert!(seen.iter().enumerate().all(|(i, s)| s.1 == i));
            assert_eq!(p.log().len(), want);
            assert!(p.log().iter().all(|s| s.delivered));
        }
    }

    #[test]
    fn dropped_frames_are_returned_and_timers_fire() {
        let mut p = Pair::new(&PairConfig::default()).unwrap();
        let w = write(7, &p.a, &p.b, 0, 100);
        p.a.engine.post_send(p.a.qpn, w).unwrap();
        // Lose the first copy of the WRITE: the retransmission timer
        // (4.096 µs × 2^14) resends it.
        let mut first = true;
        let dropped = p.run_filtered(RUN_LIMIT, |f| !std::mem::take(&mut first) || f.dir != Dir::AtoB);
        assert_eq!(dropped.len(), 1);
        assert_eq!(parse_frame(&dropped[0]).unwrap().repr.transport.bth.opcode, Opcode::RC_WRITE_ONLY);
        assert!(p.now >= Instant::ZERO + Duration::from_millis(67), "{:?}", p.now);
        assert_eq!(p.a.completions()[0].status, WcStatus::Success);
        assert_eq!(p.a.engine.qp_stats(p.a.qpn).unwrap().req_timeouts, 1);
    }

    #[test]
    fn run_for_stops_before_a_later_timer() {
        let mut p = Pair::new(&PairConfig::default()).unwrap();
        let w = write(7, &p.a, &p.b, 0, 100);
        p.a.engine.post_send(p.a.qpn, w).unwrap();
        p.run_filtered(Duration::from_millis(1), |f| f.dir != Dir::AtoB);
        assert!(p.a.completions().is_empty());
        assert_eq!(p.a.engine.qp_stats(p.a.qpn).unwrap().req_timeouts, 0);
        assert!(p.now < Instant::ZERO + Duration::from_millis(1));
    }

    #[test]
    fn a_network_pair_moves_a_send() {
        let cfg = PairConfig { params: [RcParams { mtu: Mtu::Mtu4096, ..RcParams::default() }; 2], ..PairConfig::default() };
        let p = Pair::new(&cfg).unwrap();
        let mut n = p.into_network(LinkConfig::ideal(Duration::from_micros(1)), 1);
        let recv = RecvWr { wr_id: 3, sgl: vec![n.mr[1].sge(0, 8192)] };
        let qpn = n.qpn;
        n.engine(1).post_recv(qpn[1], recv).unwrap();
        n.mr[0].bytes_mut()[..5000].fill(0xab);
        let send = SendWr { wr_id: 4, op: SendOp::Send, payload: Payload::Sgl(vec![n.mr[0].sge(0, 5000)]), flags: SendFlags::SIGNALED, ud: None };
        n.engine(0).post_send(qpn[0], send).unwrap();
        let deadline = n.net.now() + Duration::from_secs(1);
        assert_eq!(n.net.run_until(deadline), crate::sim::RunOutcome::Idle);
        let c = n.engine(1).poll_completion().unwrap().wc;
        assert_eq!((c.wr_id, c.status, c.byte_len), (3, WcStatus::Success, 5000));
        assert!(n.mr[1].bytes()[..5000].iter().all(|&b| b == 0xab));
        assert!(n.mr[1].bytes()[5000..].iter().all(|&b| b == 0));
    }

    #[test]
    fn ud_is_refused() {
        let mut cfg = PairConfig::default();
        cfg.qp.qp_type = QpType::Ud;
        assert!(matches!(Pair::new(&cfg), Err(PairError::QpType(QpType::Ud))));
    }
}
