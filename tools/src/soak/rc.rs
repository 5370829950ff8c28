//! One direction of an RC QP pair under soak: the requester posts a random
//! mix of SEND, SEND_WITH_IMM, WRITE, WRITE_WITH_IMM, READ, FETCH_ADD and
//! CMP_SWAP; every completion is matched to the one WR it belongs to and
//! every byte that moved is checked against a model of the responder's memory.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use urnic::{Access, Mr, Payload, Pd, Qp, RecvWr, RemoteAddr, SendFlags, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion};

use super::pattern::{self, Rng};
use super::Totals;

/// Largest message, and the size of a WRITE/READ target slot.
pub const SLOT: usize = 16 * 1024;
/// Target slots per flow at the responder.
pub const SLOTS: usize = 8;
/// Inline data a QP accepts (small SENDs and WRITEs go inline sometimes).
pub const INLINE_MAX: u32 = 256;
const ATOMIC_OFF: usize = SLOTS * SLOT;
const FA_OFF: usize = ATOMIC_OFF;
const CS_OFF: usize = ATOMIC_OFF + 8;
const RECV_OFF: usize = ATOMIC_OFF + 64;

/// The operations, for counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// SEND.
    Send,
    /// SEND_WITH_IMM.
    SendImm,
    /// RDMA WRITE.
    Write,
    /// RDMA WRITE_WITH_IMM.
    WriteImm,
    /// RDMA READ.
    Read,
    /// ATOMIC FETCH_AND_ADD.
    FetchAdd,
    /// ATOMIC CMP_AND_SWP.
    CmpSwap,
}

impl Kind {
    /// Every kind, in report order.
    pub const ALL: [Kind; 7] = [Kind::Send, Kind::SendImm, Kind::Write, Kind::WriteImm, Kind::Read, Kind::FetchAdd, Kind::CmpSwap];

    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Send => "send",
            Kind::SendImm => "send_imm",
            Kind::Write => "write",
            Kind::WriteImm => "write_imm",
            Kind::Read => "read",
            Kind::FetchAdd => "fetch_add",
            Kind::CmpSwap => "cmp_swap",
        }
    }

    fn wc_opcode(self) -> WcOpcode {
        match self {
            Kind::Send | Kind::SendImm => WcOpcode::Send,
            Kind::Write | Kind::WriteImm => WcOpcode::RdmaWrite,
            Kind::Read => WcOpcode::RdmaRead,
            Kind::FetchAdd => WcOpcode::FetchAdd,
            Kind::CmpSwap => WcOpcode::CompSwap,
        }
    }
}

/// A posted send WR awaiting its completion.
#[derive(Clone, Copy, Debug)]
enum Pending {
    Send { stage: Option<usize> },
    Write { stage: Option<usize>, slot: usize, off: usize, len: usize, gen: u64, imm: bool },
    Read { stage: usize, slot: usize, off: usize, len: usize },
    Atomic { stage: usize, cmp_swap: bool, expect_old: u64 },
}

/// A message the responder must receive next, in order.
#[derive(Clone, Copy, Debug)]
enum Expect {
    Send { gen: u64, len: usize, imm: Option<u32> },
    WriteImm { gen: u64, slot: usize, off: usize, len: usize, imm: u32 },
}

/// Who holds a target slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotUse {
    Free,
    Write,
    /// A WRITE_WITH_IMM: free once both its completion and its receive completion are in.
    WriteImm {
        req_done: bool,
        recv_done: bool,
    },
    Read,
}

/// One direction of an RC pair.
pub struct RcFlow {
    /// Index among the RC flows.
    pub id: usize,
    /// The pair (index of the QPs on both sides).
    pub pair: usize,
    /// The side whose QP posts the requests (0 or 1).
    pub req_side: usize,
    /// Requester staging: one SLOT per WR in flight.
    local: Mr,
    /// Responder memory: SLOTS target slots, two atomic words, receive buffers.
    remote: Mr,
    depth: usize,
    stream: u64,
    shadow: Vec<Vec<u8>>,
    /// Room to build an outgoing message or copy memory out for a check.
    scratch: Vec<u8>,
    slots: Vec<SlotUse>,
    stage_free: Vec<usize>,
    pending: HashMap<u64, (Kind, Pending)>,
    next_wr: u64,
    next_gen: u64,
    expect: VecDeque<Expect>,
    recvs: HashMap<u64, usize>,
    next_recv: u64,
    recv_depth: usize,
    fa_model: u64,
    fa_inflight: u32,
    cs_model: u64,
    cs_inflight: u32,
    /// When a completion of this flow last arrived (or it last went idle).
    pub last_progress: Instant,
}

fn fail<T>(flow: usize, qpn: u32, what: String) -> Result<T, String> {
    Err(format!("RC flow {flow} (QP {qpn:#x}): {what}"))
}

impl RcFlow {
    /// Allocate the flow's memory: staging at the requester (`req_pd`), slots,
    /// atomics and receive buffers at the responder (`resp_pd`).
    pub fn new(id: usize, pair: usize, req_side: usize, req_pd: &Pd, resp_pd: &Pd, depth: usize, seed: u64) -> Result<RcFlow, String> {
        let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        let recv_depth = depth + 4;
        let local = req_pd.alloc_mr(depth * SLOT, Access::LOCAL_WRITE).map_err(|e| format!("staging MR: {e}"))?;
        let mut remote = resp_pd.alloc_mr(RECV_OFF + recv_depth * SLOT, all).map_err(|e| format!("target MR: {e}"))?;
        let stream = id as u64;
        let mut shadow = Vec::with_capacity(SLOTS);
        let e = |e: urnic::Error| format!("initialising the target MR: {e}");
        for s in 0..SLOTS {
            let mut v = vec![0u8; SLOT];
            pattern::fill(&mut v, pattern::key(seed, stream, u64::MAX - s as u64));
            remote.write_at(s * SLOT, &v).map_err(e)?;
            shadow.push(v);
        }
        let fa_model = pattern::mix(seed ^ stream ^ 0xfa);
        let cs_model = pattern::mix(seed ^ stream ^ 0xc5);
        remote.write_at(FA_OFF, &fa_model.to_ne_bytes()).map_err(e)?;
        remote.write_at(CS_OFF, &cs_model.to_ne_bytes()).map_err(e)?;
        Ok(RcFlow {
            id,
            pair,
            req_side,
            local,
            remote,
            depth,
            stream,
            shadow,
            scratch: vec![0u8; SLOT],
            slots: vec![SlotUse::Free; SLOTS],
            stage_free: (0..depth).rev().collect(),
            pending: HashMap::new(),
            next_wr: 1,
            next_gen: 1,
            expect: VecDeque::new(),
            recvs: HashMap::new(),
            next_recv: 1,
            recv_depth,
            fa_model,
            fa_inflight: 0,
            cs_model,
            cs_inflight: 0,
            last_progress: Instant::now(),
        })
    }

    /// The R_Key and an address of the responder memory this flow targets.
    pub fn target_key(&self) -> (u32, u64) {
        (self.remote.rkey(), self.remote.addr() + 64)
    }

    /// WRs posted and not completed yet.
    pub fn outstanding(&self) -> usize {
        self.pending.len()
    }

    /// Messages sent towards the responder's receive queue and not received yet.
    pub fn unreceived(&self) -> usize {
        self.expect.len()
    }

    /// Post one receive on the responder QP `rq`.
    fn post_recv(&mut self, rq: &Qp, buf: usize) -> Result<(), String> {
        let wr_id = self.next_recv;
        self.next_recv += 1;
        let wr = RecvWr { wr_id, sgl: vec![self.remote.sge(RECV_OFF + buf * SLOT, SLOT as u32)] };
        match rq.post_recv(&wr) {
            Ok(()) => {
                self.recvs.insert(wr_id, buf);
                Ok(())
            }
            Err(e) => fail(self.id, rq.qp_num(), format!("post_recv: {e}")),
        }
    }

    /// Fill the responder QP's receive queue.
    pub fn post_initial_recvs(&mut self, rq: &Qp) -> Result<(), String> {
        for b in 0..self.recv_depth {
            self.post_recv(rq, b)?;
        }
        Ok(())
    }

    fn msg_len(rng: &mut Rng, min: usize) -> usize {
        let l = match rng.below(100) {
            0..=1 => 0,
            2..=49 => rng.range(1, 256) as usize,
            50..=84 => rng.range(257, 4096) as usize,
            _ => rng.range(4097, SLOT as u64) as usize,
        };
        l.max(min)
    }

    fn free_slot(&self, rng: &mut Rng) -> Option<usize> {
        let start = rng.below(SLOTS as u64) as usize;
        (0..SLOTS).map(|i| (start + i) % SLOTS).find(|&s| self.slots[s] == SlotUse::Free)
    }

    /// Post WRs on the requester QP `sq` until `depth` are in flight.
    pub fn top_up(&mut self, sq: &Qp, rng: &mut Rng, seed: u64, tot: &mut Totals) -> Result<(), String> {
        if self.pending.is_empty() {
            // Idle until now: the stall clock starts with this post.
            self.last_progress = Instant::now();
        }
        while self.pending.len() < self.depth {
            let Some(stage) = self.stage_free.pop() else { break };
            let mut kind = match rng.below(100) {
                0..=24 => Kind::Send,
                25..=29 => Kind::SendImm,
                30..=54 => Kind::Write,
                55..=64 => Kind::WriteImm,
                65..=82 => Kind::Read,
                83..=91 => Kind::FetchAdd,
                _ => Kind::CmpSwap,
            };
            let slot = match kind {
                Kind::Write | Kind::WriteImm | Kind::Read => self.free_slot(rng),
                _ => None,
            };
            if slot.is_none() && matches!(kind, Kind::Write | Kind::WriteImm | Kind::Read) {
                kind = Kind::Send;
            }
            // Messages consuming a receive never outnumber the receives (no RNR by design).
            if matches!(kind, Kind::Send | Kind::SendImm | Kind::WriteImm) && self.expect.len() >= self.recv_depth {
                kind = if rng.percent(50) { Kind::FetchAdd } else { Kind::CmpSwap };
            }
            let wr_id = self.next_wr;
            let gen = self.next_gen;
            let sbase = stage * SLOT;
            let (op, payload, pend) = match kind {
                Kind::Send | Kind::SendImm | Kind::Write | Kind::WriteImm => {
                    let len = Self::msg_len(rng, 0);
                    let k = pattern::key(seed, self.stream, gen);
                    self.next_gen += 1;
                    let inline = len > 0 && len as u32 <= INLINE_MAX && rng.percent(25);
                    pattern::fill(&mut self.scratch[..len], k);
                    let payload = if inline {
                        Payload::Inline(self.scratch[..len].to_vec())
                    } else {
                        self.local.write_at(sbase, &self.scratch[..len]).map_err(|e| format!("staging: {e}"))?;
                        Payload::Sgl(if len == 0 { Vec::new() } else { vec![self.local.sge(sbase, len as u32)] })
                    };
                    let stage_used = if inline { None } else { Some(stage) };
                    let imm_v = gen as u32;
                    match kind {
                        Kind::Send | Kind::SendImm => {
                            let imm = (kind == Kind::SendImm).then_some(imm_v);
                            self.expect.push_back(Expect::Send { gen, len, imm });
                            let op = match imm {
                                Some(imm) => SendOp::SendWithImm { imm },
                                None => SendOp::Send,
                            };
                            (op, payload, Pending::Send { stage: stage_used })
                        }
                        _ => {
                            let slot = slot.unwrap_or(0);
                            let off = rng.below((SLOT - len) as u64 + 1) as usize;
                            let remote = RemoteAddr { addr: self.remote.addr() + (slot * SLOT + off) as u64, rkey: self.remote.rkey() };
                            let imm = kind == Kind::WriteImm;
                            if imm {
                                self.expect.push_back(Expect::WriteImm { gen, slot, off, len, imm: imm_v });
                                self.slots[slot] = SlotUse::WriteImm { req_done: false, recv_done: false };
                            } else {
                                self.slots[slot] = SlotUse::Write;
                            }
                            let op = if imm { SendOp::WriteWithImm { remote, imm: imm_v } } else { SendOp::Write { remote } };
                            (op, payload, Pending::Write { stage: stage_used, slot, off, len, gen, imm })
                        }
                    }
                }
                Kind::Read => {
                    let slot = slot.unwrap_or(0);
                    let len = Self::msg_len(rng, 1);
                    let off = rng.below((SLOT - len) as u64 + 1) as usize;
                    // Poison the destination: a READ that places nothing is caught.
                    self.local.fill_at(sbase, len, 0xa5).map_err(|e| format!("staging: {e}"))?;
                    self.slots[slot] = SlotUse::Read;
                    let remote = RemoteAddr { addr: self.remote.addr() + (slot * SLOT + off) as u64, rkey: self.remote.rkey() };
                    (SendOp::Read { remote }, Payload::Sgl(vec![self.local.sge(sbase, len as u32)]), Pending::Read { stage, slot, off, len })
                }
                Kind::FetchAdd | Kind::CmpSwap => {
                    self.local.fill_at(sbase, 8, 0xa5).map_err(|e| format!("staging: {e}"))?;
                    let payload = Payload::Sgl(vec![self.local.sge(sbase, 8)]);
                    if kind == Kind::FetchAdd {
                        let add = if rng.percent(50) { rng.next_u64() } else { rng.range(1, 1000) };
                        let remote = RemoteAddr { addr: self.remote.addr() + FA_OFF as u64, rkey: self.remote.rkey() };
                        let expect_old = self.fa_model;
                        self.fa_model = self.fa_model.wrapping_add(add);
                        self.fa_inflight += 1;
                        (SendOp::FetchAdd { remote, add }, payload, Pending::Atomic { stage, cmp_swap: false, expect_old })
                    } else {
                        let remote = RemoteAddr { addr: self.remote.addr() + CS_OFF as u64, rkey: self.remote.rkey() };
                        let swap = rng.next_u64();
                        // Mostly the right compare value (the swap happens); sometimes a wrong one (it must not).
                        let compare = if rng.percent(80) { self.cs_model } else { self.cs_model ^ rng.range(1, u64::MAX) };
                        let expect_old = self.cs_model;
                        if compare == self.cs_model {
                            self.cs_model = swap;
                        }
                        self.cs_inflight += 1;
                        (SendOp::CmpSwap { remote, compare, swap }, payload, Pending::Atomic { stage, cmp_swap: true, expect_old })
                    }
                }
            };
            let flags = if matches!(payload, Payload::Inline(_)) { SendFlags::SIGNALED | SendFlags::INLINE } else { SendFlags::SIGNALED };
            let uses_stage = match pend {
                Pending::Send { stage, .. } | Pending::Write { stage, .. } => stage.is_some(),
                _ => true,
            };
            if !uses_stage {
                self.stage_free.push(stage);
            }
            let wr = SendWr { wr_id, op, payload, flags, ud: None };
            if let Err(e) = sq.post_send(&wr) {
                return fail(self.id, sq.qp_num(), format!("post_send of {} (wr_id {wr_id}): {e}", kind.name()));
            }
            self.next_wr += 1;
            self.pending.insert(wr_id, (kind, pend));
            tot.posted[Kind::ALL.iter().position(|&k| k == kind).unwrap_or(0)] += 1;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn check_slot_range(&mut self, qpn: u32, slot: usize, off: usize, len: usize, gen: u64, seed: u64, what: &str) -> Result<(), String> {
        let mem = &mut self.scratch[..len];
        if let Err(e) = self.remote.read_at(slot * SLOT + off, mem) {
            return fail(self.id, qpn, format!("reading slot {slot}: {e}"));
        }
        if let Some(at) = pattern::check(mem, pattern::key(seed, self.stream, gen)) {
            return fail(self.id, qpn, format!("{what} generation {gen} ({len} bytes at slot {slot} + {off}): byte {at} differs at the responder"));
        }
        Ok(())
    }

    fn slot_written(&mut self, slot: usize, off: usize, len: usize, gen: u64, seed: u64) {
        pattern::fill(&mut self.shadow[slot][off..off + len], pattern::key(seed, self.stream, gen));
    }

    fn check_atomics_settled(&self, qpn: u32) -> Result<(), String> {
        let word = |o: usize| {
            let mut b = [0u8; 8];
            // Both words lie inside the region: a failed read leaves a value the model never has.
            let _ = self.remote.read_at(o, &mut b);
            u64::from_ne_bytes(b)
        };
        if self.fa_inflight == 0 && word(FA_OFF) != self.fa_model {
            return fail(self.id, qpn, format!("fetch-add word is {:#x}, the sum of the adds is {:#x}", word(FA_OFF), self.fa_model));
        }
        if self.cs_inflight == 0 && word(CS_OFF) != self.cs_model {
            return fail(self.id, qpn, format!("cmp-swap word is {:#x}, the swap sequence ends at {:#x}", word(CS_OFF), self.cs_model));
        }
        Ok(())
    }

    /// A completion of the requester QP (`qpn`).
    pub fn on_send_wc(&mut self, qpn: u32, wc: &WorkCompletion, seed: u64, tot: &mut Totals) -> Result<(), String> {
        let Some((kind, p)) = self.pending.remove(&wc.wr_id) else {
            return fail(self.id, qpn, format!("completion for wr_id {} which is not outstanding (duplicate or unknown): {wc:?}", wc.wr_id));
        };
        self.last_progress = Instant::now();
        tot.send_wcs += 1;
        if wc.status != WcStatus::Success {
            return fail(self.id, qpn, format!("{} wr_id {} completed with {:?}", kind.name(), wc.wr_id, wc.status));
        }
        if wc.opcode != kind.wc_opcode() {
            return fail(self.id, qpn, format!("{} wr_id {} completed as {:?}", kind.name(), wc.wr_id, wc.opcode));
        }
        match p {
            Pending::Send { stage, .. } => {
                if let Some(s) = stage {
                    self.stage_free.push(s);
                }
            }
            Pending::Write { stage, slot, off, len, gen, imm } => {
                if let Some(s) = stage {
                    self.stage_free.push(s);
                }
                // The ACK means the data is placed (IBTA 9.7.5.1.1: responder
                // acknowledges after execution): the bytes are there now.
                self.check_slot_range(qpn, slot, off, len, gen, seed, kind.name())?;
                if !imm {
                    tot.verified_bytes += len as u64;
                    tot.verified_msgs += 1;
                }
                self.slot_written(slot, off, len, gen, seed);
                self.slots[slot] = match self.slots[slot] {
                    SlotUse::WriteImm { recv_done: true, .. } => SlotUse::Free,
                    SlotUse::WriteImm { recv_done: false, .. } => SlotUse::WriteImm { req_done: true, recv_done: false },
                    _ => SlotUse::Free,
                };
            }
            Pending::Read { stage, slot, off, len } => {
                let got = &mut self.scratch[..len];
                if let Err(e) = self.local.read_at(stage * SLOT, got) {
                    return fail(self.id, qpn, format!("reading staging: {e}"));
                }
                if let Some(at) = pattern::first_diff(got, &self.shadow[slot][off..off + len]) {
                    return fail(self.id, qpn, format!("READ wr_id {} of {len} bytes from slot {slot} + {off}: byte {at} differs", wc.wr_id));
                }
                tot.verified_bytes += len as u64;
                tot.verified_msgs += 1;
                self.slots[slot] = SlotUse::Free;
                self.stage_free.push(stage);
            }
            Pending::Atomic { stage, cmp_swap, expect_old } => {
                let mut b = [0u8; 8];
                if let Err(e) = self.local.read_at(stage * SLOT, &mut b) {
                    return fail(self.id, qpn, format!("reading staging: {e}"));
                }
                let old = u64::from_ne_bytes(b);
                if old != expect_old {
                    return fail(self.id, qpn, format!("{} wr_id {} returned {old:#x}, the model says {expect_old:#x}", kind.name(), wc.wr_id));
                }
                if cmp_swap {
                    self.cs_inflight -= 1;
                } else {
                    self.fa_inflight -= 1;
                }
                self.check_atomics_settled(qpn)?;
                tot.verified_bytes += 8;
                tot.verified_msgs += 1;
                self.stage_free.push(stage);
            }
        }
        Ok(())
    }

    /// A receive completion of the responder QP `rq`.
    pub fn on_recv_wc(&mut self, rq: &Qp, wc: &WorkCompletion, seed: u64, tot: &mut Totals) -> Result<(), String> {
        let qpn = rq.qp_num();
        let Some(buf) = self.recvs.remove(&wc.wr_id) else {
            return fail(self.id, qpn, format!("receive completion for wr_id {} which is not posted (duplicate or unknown): {wc:?}", wc.wr_id));
        };
        tot.recv_wcs += 1;
        if wc.status != WcStatus::Success {
            return fail(self.id, qpn, format!("receive wr_id {} completed with {:?}", wc.wr_id, wc.status));
        }
        let Some(exp) = self.expect.pop_front() else {
            return fail(self.id, qpn, format!("a message arrived that was never sent: {wc:?}"));
        };
        match exp {
            Expect::Send { gen, len, imm } => {
                if wc.opcode != WcOpcode::Recv || wc.byte_len as usize != len || wc.imm_data != imm {
                    return fail(self.id, qpn, format!("expected SEND generation {gen} of {len} bytes, imm {imm:?}; got {wc:?}"));
                }
                let mem = &mut self.scratch[..len];
                if let Err(e) = self.remote.read_at(RECV_OFF + buf * SLOT, mem) {
                    return fail(self.id, qpn, format!("reading receive buffer: {e}"));
                }
                if let Some(at) = pattern::check(mem, pattern::key(seed, self.stream, gen)) {
                    return fail(self.id, qpn, format!("SEND generation {gen} of {len} bytes: byte {at} differs in the receive buffer"));
                }
                tot.verified_bytes += len as u64;
                tot.verified_msgs += 1;
            }
            Expect::WriteImm { gen, slot, off, len, imm } => {
                if wc.opcode != WcOpcode::RecvRdmaWithImm || wc.byte_len as usize != len || wc.imm_data != Some(imm) {
                    return fail(self.id, qpn, format!("expected WRITE_WITH_IMM generation {gen} of {len} bytes, imm {imm:#x}; got {wc:?}"));
                }
                self.check_slot_range(qpn, slot, off, len, gen, seed, "WRITE_WITH_IMM at its receive completion")?;
                tot.verified_bytes += len as u64;
                tot.verified_msgs += 1;
                self.slots[slot] = match self.slots[slot] {
                    SlotUse::WriteImm { req_done: true, .. } => SlotUse::Free,
                    _ => SlotUse::WriteImm { req_done: false, recv_done: true },
                };
            }
        }
        self.post_recv(rq, buf)
    }

    /// Compare every idle slot and settled atomic word with the model.
    /// Returns the bytes compared.
    pub fn sweep(&mut self, qpn: u32) -> Result<u64, String> {
        let mut n = 0u64;
        for s in 0..SLOTS {
            if self.slots[s] != SlotUse::Free {
                continue;
            }
            let mem = &mut self.scratch[..SLOT];
            if let Err(e) = self.remote.read_at(s * SLOT, mem) {
                return fail(self.id, qpn, format!("reading slot {s}: {e}"));
            }
            if let Some(at) = pattern::first_diff(mem, &self.shadow[s]) {
                return fail(self.id, qpn, format!("idle target slot {s}: byte {at} is not what the last WRITE left there"));
            }
            n += SLOT as u64;
        }
        self.check_atomics_settled(qpn)?;
        Ok(n)
    }
}
