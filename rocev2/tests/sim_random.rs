//! Randomized end-to-end test of the RC transport in the simulator.
//!
//! Per seed: two engines joined by impaired virtual links, one to three RC QP
//! pairs (random MTU, PSNs near the 2^24 wrap, limits), a random mix of SEND
//! (+imm, +inv), RDMA WRITE (+imm), RDMA READ, CMP_SWAP and FETCH_ADD posted
//! on both sides, with random sizes (0 .. 256 KiB, biased to MTU edges),
//! random scatter/gather splits across several MRs, inline data, fences,
//! unsignaled WRs and solicited events. A reference model predicts the final
//! contents of every registered byte on both hosts and every completion.
//! Every target region is used by one WR only, so effects do not depend on
//! the order of QPs; atomics use 8-byte slots whose value sequence the model
//! follows per QP.
//!
//! Checks: the network goes idle; every send WR completes exactly once, in
//! posting order per QP, with the right status and opcode (or, where a run
//! gives up, one error followed only by flush errors); receive completions
//! carry the right wr_id, byte_len, immediate, invalidated key and solicited
//! flag; all memory on both hosts equals the model.
//!
//! `URNIC_SIM_SEEDS=N` sets the number of seeds (default 2000, split over two
//! test functions); `URNIC_SIM_SEED=S` runs only seed `S`;
//! `URNIC_SIM_TRACE=1` prints every frame of that run.

// Both hosts' state lives in `[_; 2]` arrays indexed by side, often several
// at once: index loops read better here than zipped iterators.
#![allow(clippy::needless_range_loop)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use rocev2::psn::Psn;
use rocev2::sim::rc::{bring_up_rc, bring_up_rc_from_init, HostAddr, RcParams};
use rocev2::sim::{split_seed, LinkConfig, Network, NodeId, RunOutcome};
use rocev2::time::Instant;
use rocev2::transport::attr::{Mtu, QpAttr, QpAttrMask, QpCaps, QpInitAttr, QpState, QpType};
use rocev2::transport::engine::{Engine, EngineConfig};
use rocev2::transport::memory::{Access, MemoryTable, MwType, PdId};
use rocev2::transport::wr::{
    Completion, CqId, Payload, RecvWr, RemoteAddr, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};
use rocev2::wire::parse_frame;

const PD: PdId = PdId(1);
const MAX_SIZE: usize = 256 * 1024;
/// Links losing this much or more may exhaust the retries.
const SEVERE_LOSS: f64 = 0.10;
const ALL_ACCESS: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC)
    .union(Access::MW_BIND);

// ---------------------------------------------------------------- memory

/// A registered buffer and its model image.
struct Mr {
    /// Backing store (u64 for 8-byte alignment of atomic slots).
    ptr: *mut u64,
    words: usize,
    iova: u64,
    key: u32,
    /// What every byte must hold at the end.
    model: Vec<u8>,
    /// Bump allocator.
    next: usize,
}

impl Mr {
    fn bytes(&self) -> &[u8] {
        // SAFETY: the buffer is alive (freed in Drop) and nothing writes it
        // while this shared view exists: the engines only run inside
        // `Network` calls, never while the test inspects memory.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.words * 8) }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `Box::into_raw` of a `[u64]` of `words` elements.
        unsafe { drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.words))) }
    }
}

/// A host's registered memory: several MRs with random contents.
struct HostMem {
    table: Arc<MemoryTable>,
    mrs: Vec<Mr>,
}

/// A byte range of one MR of one host.
#[derive(Clone, Copy, Debug)]
struct Region {
    mr: usize,
    off: usize,
    len: usize,
}

impl HostMem {
    fn new(rng: &mut ChaCha8Rng, sizes: &[usize]) -> HostMem {
        let table = Arc::new(MemoryTable::with_seed(rng.gen()));
        let mut mrs = Vec::new();
        for &size in sizes {
            let words = size.div_ceil(8).max(1);
            // splitmix64 from a random start: cheap even in debug builds.
            let mut x: u64 = rng.gen();
            let init: Vec<u64> = (0..words)
                .map(|_| {
                    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
                    let mut z = x;
                    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                    z ^ (z >> 31)
                })
                .collect();
            let ptr = Box::into_raw(init.into_boxed_slice()) as *mut u64;
            let model = {
                // SAFETY: just allocated, `words` u64s.
                unsafe { std::slice::from_raw_parts(ptr as *const u8, words * 8) }.to_vec()
            };
            // Random 8-aligned IOVA, sometimes high in the 64-bit space.
            let iova = if rng.gen_bool(0.5) {
                rng.gen_range(1u64 << 12..1u64 << 47) & !7
            } else {
                (u64::MAX - (words as u64) * 8 - rng.gen_range(0..1u64 << 20)) & !7
            };
            // SAFETY: the buffer outlives the table's use of it: `Mr::drop`
            // runs after the engines (and their `Arc<MemoryTable>`) are gone.
            let keys = unsafe { table.register(PD, ptr as *mut u8, words * 8, iova, ALL_ACCESS) }.expect("register MR");
            mrs.push(Mr { ptr, words, iova, key: keys.lkey, model, next: 0 });
        }
        HostMem { table, mrs }
    }

    /// A fresh region of `len` bytes in MR `mr`, after a random gap.
    fn alloc_in(&mut self, rng: &mut ChaCha8Rng, mr: usize, len: usize, align: usize) -> Region {
        let m = &mut self.mrs[mr];
        let gap = rng.gen_range(0..24);
        let off = (m.next + gap).next_multiple_of(align);
        assert!(off + len <= m.words * 8, "MR {mr} too small");
        m.next = off + len;
        Region { mr, off, len }
    }

    fn alloc(&mut self, rng: &mut ChaCha8Rng, len: usize) -> Region {
        let mr = rng.gen_range(0..self.mrs.len());
        self.alloc_in(rng, mr, len, 1)
    }

    fn va(&self, r: &Region) -> u64 {
        self.mrs[r.mr].iova + r.off as u64
    }

    fn sge(&self, r: &Region) -> Sge {
        Sge { addr: self.va(r), length: r.len as u32, lkey: self.mrs[r.mr].key }
    }

    fn model(&self, r: &Region) -> &[u8] {
        &self.mrs[r.mr].model[r.off..r.off + r.len]
    }

    fn set_model(&mut self, r: &Region, data: &[u8]) {
        assert_eq!(r.len, data.len());
        self.mrs[r.mr].model[r.off..r.off + r.len].copy_from_slice(data);
    }

    /// Split `len` bytes into 1..=4 fresh regions in random MRs.
    fn alloc_sgl(&mut self, rng: &mut ChaCha8Rng, len: usize) -> Vec<Region> {
        if len == 0 {
            return Vec::new();
        }
        let parts = rng.gen_range(1..=4usize).min(len);
        let mut cuts: Vec<usize> = (0..parts - 1).map(|_| rng.gen_range(1..len)).collect();
        cuts.sort_unstable();
        cuts.dedup();
        let mut out = Vec::new();
        let mut start = 0;
        for c in cuts.into_iter().chain(std::iter::once(len)) {
            out.push(self.alloc(rng, c - start));
            start = c;
        }
        out
    }

    fn gather_model(&self, sgl: &[Region]) -> Vec<u8> {
        sgl.iter().flat_map(|r| self.model(r).iter().copied()).collect()
    }

    fn scatter_model(&mut self, sgl: &[Region], data: &[u8]) {
        let mut off = 0;
        for r in sgl {
            let n = r.len.min(data.len() - off);
            let m = &mut self.mrs[r.mr].model;
            m[r.off..r.off + n].copy_from_slice(&data[off..off + n]);
            off += n;
            if off == data.len() {
                break;
            }
        }
        assert_eq!(off, data.len(), "scatter list too short for the model");
    }
}

// ---------------------------------------------------------------- plan

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Send,
    SendImm,
    SendInv,
    Write,
    WriteImm,
    Read,
    CmpSwap,
    FetchAdd,
}

/// The effect a WR has when it succeeds.
#[derive(Clone, Debug)]
enum Effect {
    /// WRITE: `data` lands at `target` on the responder.
    Write { target: Region, data: Vec<u8> },
    /// SEND: `data` lands in the receive WR's buffers.
    Send { data: Vec<u8> },
    /// READ: `data` (the responder's source) lands in `dest` on the requester.
    Read { dest: Vec<Region>, data: Vec<u8> },
    /// Atomic: the slot goes from `orig` to `new`; `orig` lands in `dest`.
    Atomic { slot: Region, dest: Region, orig: u64, new: u64 },
}

#[derive(Clone, Debug)]
struct PlannedWr {
    /// Requester side (0 = A, 1 = B).
    side: usize,
    qp: usize,
    wr: SendWr,
    kind: Kind,
    signaled: bool,
    effect: Effect,
    /// Index into the responder's planned receives, if the WR consumes one.
    recv: Option<usize>,
}

#[derive(Clone, Debug)]
struct PlannedRecv {
    /// Receiving side.
    side: usize,
    qp: usize,
    wr: RecvWr,
    sgl: Vec<Region>,
    /// Expected completion fields.
    opcode: WcOpcode,
    byte_len: u32,
    imm: Option<u32>,
    inv: Option<u32>,
    solicited: bool,
}

/// One QP pair's connection parameters.
#[derive(Clone, Copy, Debug)]
struct PairCfg {
    qpn: [u32; 2],
    params: [RcParams; 2],
}

struct Plan {
    seed: u64,
    ipv6: bool,
    pairs: Vec<PairCfg>,
    links: [LinkConfig; 2],
    wrs: Vec<PlannedWr>,
    recvs: Vec<PlannedRecv>,
    /// Keys (MWs or MRs) that SEND with invalidate must have invalidated: (side, qp, key).
    invalidated: Vec<(usize, usize, u32)>,
    /// Post receives only at this virtual time (exercises RNR); `None`: up front.
    late_recvs: Option<Duration>,
}

fn pick_size(rng: &mut ChaCha8Rng, mtu: usize) -> usize {
    let x = rng.gen_range(0..100);
    let s = if x < 8 {
        0
    } else if x < 50 {
        // MTU edges: k * mtu + {-1, 0, 1}
        let k = rng.gen_range(1..=4usize);
        let d = rng.gen_range(-1i64..=1);
        (k as i64 * mtu as i64 + d).max(1) as usize
    } else if x < 85 {
        rng.gen_range(1..=2 * mtu)
    } else if x < 97 {
        rng.gen_range(1..=32 * 1024)
    } else if x < 99 {
        rng.gen_range(32 * 1024..=MAX_SIZE)
    } else {
        MAX_SIZE
    };
    s.min(MAX_SIZE)
}

fn pick_link(rng: &mut ChaCha8Rng) -> LinkConfig {
    let delay = Duration::from_nanos(rng.gen_range(500..20_000));
    let x = rng.gen_range(0..100);
    let mut c = LinkConfig::ideal(delay);
    if rng.gen_bool(0.02) {
        // Severe: 10..25 % loss. Runs may give up (RETRY_EXC_ERR, then flushes).
        c.loss = rng.gen_range(SEVERE_LOSS..0.25);
        c.duplicate = rng.gen_range(0.0..0.05);
        c.reorder = rng.gen_range(0.0..0.1);
        c.reorder_max = Duration::from_nanos(rng.gen_range(1_000..50_000));
        c.corrupt = rng.gen_range(0.0..0.05);
        return c;
    }
    if x < 40 {
        return c;
    }
    let severity = if x < 70 { 0.01 } else { 0.05 };
    c.loss = rng.gen_range(0.0..severity);
    c.duplicate = rng.gen_range(0.0..severity);
    c.reorder = rng.gen_range(0.0..severity * 2.0);
    c.reorder_max = Duration::from_nanos(rng.gen_range(1_000..50_000));
    c.corrupt = rng.gen_range(0.0..severity);
    if x >= 92 {
        // A rate-limited bottleneck: 1..100 Gb/s with a 64 KiB..1 MiB queue.
        c.rate_bps = Some(rng.gen_range(1..=100u64) * 1_000_000_000);
        c.queue_bytes = rng.gen_range(64 * 1024..=1024 * 1024);
        c.frame_overhead_bytes = 24;
    }
    c
}

fn mtu_of(i: u32) -> Mtu {
    Mtu::from_ibv(i as u8).expect("mtu")
}

fn plan(seed: u64) -> (Plan, [HostMem; 2]) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let npairs = rng.gen_range(1..=3usize);
    let mut pairs = Vec::new();
    let links = [pick_link(&mut rng), pick_link(&mut rng)];
    let rate_limited = links.iter().any(|l| l.rate_bps.is_some());
    for q in 0..npairs {
        let mtu = mtu_of(rng.gen_range(1..=5));
        let rd = rng.gen_range(1..=16u8);
        let mut params = [RcParams::default(); 2];
        for p in &mut params {
            p.mtu = mtu;
            p.sq_psn = if rng.gen_bool(0.3) {
                Psn::new(0xff_ffff - rng.gen_range(0..64))
            } else {
                Psn::new(rng.gen_range(0..=0xff_ffff))
            };
            p.timeout = if rate_limited { rng.gen_range(15..=17) } else { rng.gen_range(10..=14) };
            p.retry_cnt = 7;
            p.rnr_retry = 7;
            p.min_rnr_timer = rng.gen_range(1..=12);
            p.max_rd_atomic = rd;
            p.max_dest_rd_atomic = rd;
        }
        pairs.push(PairCfg { qpn: [0, 0], params });
        let _ = q;
    }
    // Work requests first (sizes decide how much memory is needed).
    struct Draft {
        side: usize,
        qp: usize,
        kind: Kind,
        len: usize,
    }
    let mut drafts = Vec::new();
    for qp in 0..npairs {
        let n = rng.gen_range(1..=12);
        let mtu = pairs[qp].params[0].mtu.bytes() as usize;
        for _ in 0..n {
            let side = rng.gen_range(0..2);
            let kind = match rng.gen_range(0..100) {
                0..=17 => Kind::Send,
                18..=27 => Kind::SendImm,
                28..=32 => Kind::SendInv,
                33..=52 => Kind::Write,
                53..=62 => Kind::WriteImm,
                63..=79 => Kind::Read,
                80..=89 => Kind::CmpSwap,
                _ => Kind::FetchAdd,
            };
            let len = match kind {
                Kind::CmpSwap | Kind::FetchAdd => 8,
                _ => pick_size(&mut rng, mtu),
            };
            drafts.push(Draft { side, qp, kind, len });
        }
    }
    // Shuffle the posting order across QPs (order within a QP and side is what matters).
    for i in (1..drafts.len()).rev() {
        let j = rng.gen_range(0..=i);
        drafts.swap(i, j);
    }
    let total: usize = drafts.iter().map(|d| d.len + 64).sum();
    // Each host: three MRs, each big enough for everything (sources, targets,
    // receive buffers and slack for the random gaps).
    let mr_size = 2 * total + 512 * drafts.len() + 4096;
    let mut mem = [HostMem::new(&mut rng, &[mr_size; 3]), HostMem::new(&mut rng, &[mr_size; 3])];

    let mut wrs = Vec::new();
    let mut recvs: Vec<PlannedRecv> = Vec::new();
    let mut invalidated = Vec::new();
    // Atomic slots: per (responder side, qp), 1..=2 slots with their model values.
    let mut slots: BTreeMap<(usize, usize), Vec<(Region, u64)>> = BTreeMap::new();
    let mut recv_id = 1u64 << 32;
    for (k, d) in drafts.into_iter().enumerate() {
        let (s, r) = (d.side, 1 - d.side);
        let wr_id = 1001 + k as u64;
        let signaled = rng.gen_bool(0.8);
        let mut flags = SendFlags::empty();
        if signaled {
            flags |= SendFlags::SIGNALED;
        }
        if rng.gen_bool(0.15) {
            flags |= SendFlags::FENCE;
        }
        let solicited = matches!(d.kind, Kind::Send | Kind::SendImm | Kind::SendInv | Kind::WriteImm) && rng.gen_bool(0.3);
        if solicited {
            flags |= SendFlags::SOLICITED;
        }
        let imm: u32 = rng.gen();
        // Local data source for SEND/WRITE: inline or gathered.
        let source = |mem: &mut [HostMem; 2], rng: &mut ChaCha8Rng, flags: &mut SendFlags| -> (Payload, Vec<u8>) {
            if d.len <= 400 && rng.gen_bool(0.3) {
                let mut data = vec![0u8; d.len];
                rng.fill(&mut data[..]);
                *flags |= SendFlags::INLINE;
                (Payload::Inline(data.clone()), data)
            } else {
                let sgl = mem[s].alloc_sgl(rng, d.len);
                let data = mem[s].gather_model(&sgl);
                (Payload::Sgl(sgl.iter().map(|g| mem[s].sge(g)).collect()), data)
            }
        };
        let mut consume_recv = |mem: &mut [HostMem; 2], rng: &mut ChaCha8Rng, opcode: WcOpcode, inv: Option<u32>, data_len: usize| {
            recv_id += 1;
            let (cap, sgl) = if opcode == WcOpcode::Recv {
                let cap = d.len + if rng.gen_bool(0.5) { 0 } else { rng.gen_range(1..=64) };
                (cap, mem[r].alloc_sgl(rng, cap))
            } else if rng.gen_bool(0.5) {
                (0, Vec::new())
            } else {
                let cap = rng.gen_range(1..=64);
                (cap, mem[r].alloc_sgl(rng, cap))
            };
            let _ = cap;
            let wr = RecvWr { wr_id: recv_id, sgl: sgl.iter().map(|g| mem[r].sge(g)).collect() };
            recvs.push(PlannedRecv {
                side: r,
                qp: d.qp,
                wr,
                sgl,
                opcode,
                byte_len: data_len as u32,
                imm: if matches!(d.kind, Kind::SendImm | Kind::WriteImm) { Some(imm) } else { None },
                inv,
                solicited,
            });
            recvs.len() - 1
        };
        let (op, payload, effect, recv) = match d.kind {
            Kind::Send | Kind::SendImm | Kind::SendInv => {
                let (payload, data) = source(&mut mem, &mut rng, &mut flags);
                let (op, inv) = match d.kind {
                    Kind::Send => (SendOp::Send, None),
                    Kind::SendImm => (SendOp::SendWithImm { imm }, None),
                    _ => {
                        // A key for the responder to invalidate: a type-2 window
                        // bound to the receiving QP (bound once QPNs are known).
                        // Only windows may be invalidated remotely (rxe
                        // invalidate_rkey); an MR key is refused, which
                        // transport_rules checks.
                        let key = {
                            let rkey = mem[r].table.alloc_mw(PD, MwType::Type2).expect("alloc MW");
                            invalidated.push((r, d.qp, rkey | 0x8000_0000));
                            rkey
                        };
                        (SendOp::SendWithInv { rkey: key }, Some(key))
                    }
                };
                let ri = consume_recv(&mut mem, &mut rng, WcOpcode::Recv, inv, d.len);
                (op, payload, Effect::Send { data }, Some(ri))
            }
            Kind::Write | Kind::WriteImm => {
                let (payload, data) = source(&mut mem, &mut rng, &mut flags);
                let target = mem[r].alloc(&mut rng, d.len);
                let remote = RemoteAddr { addr: mem[r].va(&target), rkey: mem[r].mrs[target.mr].key };
                if d.kind == Kind::Write {
                    (SendOp::Write { remote }, payload, Effect::Write { target, data }, None)
                } else {
                    let ri = consume_recv(&mut mem, &mut rng, WcOpcode::RecvRdmaWithImm, None, d.len);
                    (SendOp::WriteWithImm { remote, imm }, payload, Effect::Write { target, data }, Some(ri))
                }
            }
            Kind::Read => {
                let src = mem[r].alloc(&mut rng, d.len);
                let data = mem[r].model(&src).to_vec();
                let dest = mem[s].alloc_sgl(&mut rng, d.len);
                let remote = RemoteAddr { addr: mem[r].va(&src), rkey: mem[r].mrs[src.mr].key };
                let payload = Payload::Sgl(dest.iter().map(|g| mem[s].sge(g)).collect());
                (SendOp::Read { remote }, payload, Effect::Read { dest, data }, None)
            }
            Kind::CmpSwap | Kind::FetchAdd => {
                let list = slots.entry((r, d.qp)).or_default();
                if list.is_empty() || (list.len() < 2 && rng.gen_bool(0.3)) {
                    let mr = rng.gen_range(0..3);
                    let slot = mem[r].alloc_in(&mut rng, mr, 8, 8);
                    let v = u64::from_ne_bytes(mem[r].model(&slot).try_into().unwrap());
                    list.push((slot, v));
                }
                let i = rng.gen_range(0..list.len());
                let (slot, cur) = list[i];
                let dest = {
                    let mr = rng.gen_range(0..3);
                    let align = if rng.gen_bool(0.5) { 8 } else { 1 };
                    mem[s].alloc_in(&mut rng, mr, 8, align)
                };
                let remote = RemoteAddr { addr: mem[r].va(&slot), rkey: mem[r].mrs[slot.mr].key };
                let (op, new) = if d.kind == Kind::CmpSwap {
                    let compare = if rng.gen_bool(0.6) { cur } else { rng.gen() };
                    let swap: u64 = rng.gen();
                    (SendOp::CmpSwap { remote, compare, swap }, if compare == cur { swap } else { cur })
                } else {
                    let add: u64 = if rng.gen_bool(0.5) { rng.gen_range(0..1000) } else { rng.gen() };
                    (SendOp::FetchAdd { remote, add }, cur.wrapping_add(add))
                };
                list[i].1 = new;
                let payload = Payload::Sgl(vec![mem[s].sge(&dest)]);
                (op, payload, Effect::Atomic { slot, dest, orig: cur, new }, None)
            }
        };
        wrs.push(PlannedWr {
            side: s,
            qp: d.qp,
            wr: SendWr { wr_id, op, payload, flags, ud: None },
            kind: d.kind,
            signaled,
            effect,
            recv,
        });
    }
    let late_recvs = if rng.gen_bool(0.15) { Some(Duration::from_micros(rng.gen_range(10..3000))) } else { None };
    let ipv6 = rng.gen_bool(0.3);
    let plan = Plan { seed, ipv6, pairs, links, wrs, recvs, invalidated, late_recvs };
    (plan, mem)
}

// ---------------------------------------------------------------- run

/// What happened to one send WR, from its completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Completed successfully (or implied by a later successful completion).
    Done,
    /// Unknown: the QP failed at or before this WR.
    Unknown,
}

macro_rules! ensure {
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            return Err(format!($($arg)+));
        }
    };
}

fn send_cq(qp: usize) -> CqId {
    CqId(2 * qp as u32)
}

fn recv_cq(qp: usize) -> CqId {
    CqId(2 * qp as u32 + 1)
}

fn expected_wc_opcode(k: Kind) -> WcOpcode {
    match k {
        Kind::Send | Kind::SendImm | Kind::SendInv => WcOpcode::Send,
        Kind::Write | Kind::WriteImm => WcOpcode::RdmaWrite,
        Kind::Read => WcOpcode::RdmaRead,
        Kind::CmpSwap => WcOpcode::CompSwap,
        Kind::FetchAdd => WcOpcode::FetchAdd,
    }
}

fn describe(f: &[u8]) -> String {
    match parse_frame(f) {
        Ok(p) => {
            let t = &p.repr.transport;
            let mut s = format!("{:?} qp={:#x} psn={} ack_req={} len={}", t.bth.opcode, t.bth.dest_qp, t.bth.psn, t.bth.ack_req, p.payload.len());
            if let Some(a) = t.aeth {
                s += &format!(" aeth={:?} msn={}", a.syndrome, a.msn);
            }
            if let Some(r) = t.reth {
                s += &format!(" reth(va={:#x} rkey={:#x} len={})", r.va, r.rkey, r.dma_len);
            }
            s
        }
        Err(e) => format!("unparsable ({e:?}), {} bytes", f.len()),
    }
}

struct Outcome {
    errors: usize,
    frames: u64,
}

/// Options that scenarios change.
#[derive(Clone, Copy, Debug)]
struct RunOpts {
    /// Virtual deadline.
    deadline: Duration,
    /// Accept an error completion followed by flushes (severe impairments).
    allow_failure: bool,
}

fn run_seed(seed: u64, mut opts: RunOpts) -> Result<Outcome, String> {
    let (mut plan, mut mem) = plan(seed);
    opts.allow_failure |= plan.links.iter().any(|l| l.loss >= SEVERE_LOSS);
    let trace = std::env::var("URNIC_SIM_TRACE").is_ok_and(|v| v != "0");
    if trace {
        eprintln!("seed {seed}: links {:?}\npairs {:?}\nlate receives {:?}, ipv6 {}", plan.links, plan.pairs, plan.late_recvs, plan.ipv6);
        for w in &plan.wrs {
            eprintln!("  wr {} side {} qp {} {:?} {} bytes flags {:?}", w.wr.wr_id, w.side, w.qp, w.kind, w.wr.payload.len(), w.wr.flags);
        }
    }
    run_plan(&mut plan, &mut mem, opts, trace)
}

fn run_plan(plan: &mut Plan, mem: &mut [HostMem; 2], opts: RunOpts, trace: bool) -> Result<Outcome, String> {
    let hosts = if plan.ipv6 { [HostAddr::ipv6(1), HostAddr::ipv6(2)] } else { [HostAddr::ipv4(1), HostAddr::ipv4(2)] };
    let mut engines = [0, 1].map(|i| {
        Engine::new(EngineConfig { first_qpn: 0x11 + 0x100 * i as u32, ..EngineConfig::default() }, mem[i].table.clone())
    });
    let npairs = plan.pairs.len();
    let caps = QpCaps { max_send_wr: 1024, max_recv_wr: 1024, max_send_sge: 16, max_recv_sge: 16, max_inline_data: 400 };
    for q in 0..npairs {
        for side in 0..2 {
            let init = QpInitAttr {
                qp_type: QpType::Rc,
                pd: PD,
                send_cq: send_cq(q),
                recv_cq: recv_cq(q),
                srq: None,
                cap: caps,
                sq_sig_all: false,
            };
            plan.pairs[q].qpn[side] = engines[side].create_qp(&init).map_err(|e| format!("create_qp: {e:?}"))?;
        }
    }
    // Bind the windows that SEND with invalidate targets, now that QPNs are known.
    for (side, qp, key) in plan.invalidated.iter_mut() {
        if *key & 0x8000_0000 != 0 {
            let mw = *key & 0x7fff_ffff;
            let m = &mem[*side];
            let qpn = plan.pairs[*qp].qpn[*side];
            let new_key = (mw as u8).wrapping_add(1);
            let bound = m
                .table
                .bind_mw(PD, qpn, mw, new_key, m.mrs[0].key, m.mrs[0].iova, 64, Access::REMOTE_READ)
                .map_err(|e| format!("bind_mw: {e:?}"))?;
            // The WR was planned with the unbound key: patch it.
            for w in plan.wrs.iter_mut() {
                if let SendOp::SendWithInv { rkey } = &mut w.wr.op {
                    if *rkey == mw && w.side != *side && w.qp == *qp {
                        *rkey = bound;
                    }
                }
            }
            for r in plan.recvs.iter_mut() {
                if r.inv == Some(mw) && r.side == *side && r.qp == *qp {
                    r.inv = Some(bound);
                }
            }
            *key = bound;
        }
    }
    // Receives (up front unless late), then RTR/RTS.
    for q in 0..npairs {
        for side in 0..2 {
            let qpn = plan.pairs[q].qpn[side];
            let p = plan.pairs[q].params[side];
            let init = QpAttr { qp_state: QpState::Init, qp_access_flags: p.access, ..QpAttr::default() };
            engines[side]
                .modify_qp(qpn, &init, QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS)
                .map_err(|e| format!("modify INIT: {e:?}"))?;
        }
    }
    if plan.late_recvs.is_none() {
        for r in &plan.recvs {
            engines[r.side].post_recv(plan.pairs[r.qp].qpn[r.side], r.wr.clone()).map_err(|e| format!("post_recv: {e:?}"))?;
        }
    }
    for q in 0..npairs {
        for side in 0..2 {
            let pc = plan.pairs[q];
            bring_up_rc_from_init(
                &mut engines[side],
                pc.qpn[side],
                &hosts[side],
                &hosts[1 - side],
                pc.qpn[1 - side],
                pc.params[1 - side].sq_psn,
                &pc.params[side],
            )
            .map_err(|e| format!("bring up: {e:?}"))?;
        }
    }
    for w in &plan.wrs {
        engines[w.side]
            .post_send(plan.pairs[w.qp].qpn[w.side], w.wr.clone())
            .map_err(|e| format!("post_send wr {}: {e:?}", w.wr.wr_id))?;
    }
    let [ea, eb] = engines;
    let mut net: Network<Engine> = Network::new(Instant::ZERO);
    let a = net.add_node(ea, hosts[0].mac);
    let b = net.add_node(eb, hosts[1].mac);
    let nodes = [a, b];
    net.connect(a, b, plan.links[0], split_seed(plan.seed, 100), false);
    net.connect(b, a, plan.links[1], split_seed(plan.seed, 101), false);
    if trace {
        net.set_tap(Some(Box::new(|p, t, from, to, f: &[u8]| {
            eprintln!("{:>12} {:?} {}->{} {}", t.as_nanos(), p, from.0, to.0, describe(f));
        })));
    }
    let deadline = Instant::ZERO + opts.deadline;
    if let Some(at) = plan.late_recvs {
        if net.advance_to(Instant::ZERO + at) == RunOutcome::Stalled {
            return Err("stalled before the late receives".into());
        }
        for r in &plan.recvs {
            net.node_mut(nodes[r.side])
                .post_recv(plan.pairs[r.qp].qpn[r.side], r.wr.clone())
                .map_err(|e| format!("late post_recv: {e:?}"))?;
        }
    }
    let outcome = net.run_until(deadline);
    ensure!(outcome == RunOutcome::Idle, "network not idle at the end: {outcome:?} at {:?}", net.now());
    check(plan, mem, &mut net, nodes, opts)
        .map(|errors| Outcome { errors, frames: net.stats().frames_sent })
        .map_err(|e| format!("{e}\n{}", diagnostics(plan, &net, nodes)))
}

/// Engine state for a failure message: timers, QP states, per-QP counters.
fn diagnostics(plan: &Plan, net: &Network<Engine>, nodes: [NodeId; 2]) -> String {
    let mut out = format!("now {:?}", net.now());
    for (side, &n) in nodes.iter().enumerate() {
        let e = net.node(n);
        out += &format!("\nside {side}: next_timeout {:?}", e.next_timeout());
        for (q, pc) in plan.pairs.iter().enumerate() {
            let qpn = pc.qpn[side];
            out += &format!("\n  qp {q} ({qpn:#x}) {:?}: {:?}", e.qp_state(qpn), e.qp_stats(qpn));
        }
    }
    for (id, from, to, l) in net.links() {
        out += &format!("\nlink {} {}->{}: {:?}", id.0, from.0, to.0, l.stats());
    }
    out
}

/// Compare completions and memory with the model. Returns the number of QP
/// sides that ended in error.
fn check(plan: &Plan, mem: &mut [HostMem; 2], net: &mut Network<Engine>, nodes: [NodeId; 2], opts: RunOpts) -> Result<usize, String> {
    // Completions by (side, cq).
    let mut cqs: BTreeMap<(usize, CqId), Vec<Completion>> = BTreeMap::new();
    for side in 0..2 {
        while let Some(c) = net.node_mut(nodes[side]).poll_completion() {
            cqs.entry((side, c.cq)).or_default().push(c);
        }
    }
    let mut events = Vec::new();
    for (side, &node) in nodes.iter().enumerate() {
        while let Some(ev) = net.node_mut(node).poll_event() {
            events.push((side, ev));
        }
    }
    let cq_dump: Vec<String> = cqs
        .iter()
        .map(|((side, cq), v)| {
            let l: Vec<String> = v.iter().map(|c| format!("{}:{:?}", c.wc.wr_id, c.wc.status)).collect();
            format!("side {side} {cq:?}: [{}]", l.join(", "))
        })
        .collect();
    let cq_dump = cq_dump.join("\n  ");
    let r = check_completions(plan, mem, cqs, opts);
    if let Err(e) = r {
        return Err(format!("{e}\nasync events: {events:?}\ncompletions:\n  {cq_dump}"));
    }
    ensure!(opts.allow_failure || events.is_empty(), "unexpected async events {events:?}");
    r
}

fn check_completions(
    plan: &Plan,
    mem: &mut [HostMem; 2],
    mut cqs: BTreeMap<(usize, CqId), Vec<Completion>>,
    opts: RunOpts,
) -> Result<usize, String> {
    let npairs = plan.pairs.len();
    let mut failed_sides = 0;
    // fate[(side, qp)] per WR index in plan.wrs
    let mut fate: Vec<Fate> = vec![Fate::Unknown; plan.wrs.len()];
    let mut qp_failed = [[false; 2]; 3];
    for q in 0..npairs {
        for side in 0..2 {
            let qpn = plan.pairs[q].qpn[side];
            let mine: Vec<usize> = (0..plan.wrs.len()).filter(|&i| plan.wrs[i].qp == q && plan.wrs[i].side == side).collect();
            let got = cqs.remove(&(side, send_cq(q))).unwrap_or_default();
            // Walk the completions against the posted WRs in order.
            let mut k = 0; // index into `mine`
            let mut failed = false;
            for (n, c) in got.iter().enumerate() {
                ensure!(c.wc.qp_num == qpn, "side {side} qp {q}: completion for qpn {:#x}, expected {qpn:#x}", c.wc.qp_num);
                if failed {
                    // After the error: flush errors only, for each later WR in order.
                    ensure!(k < mine.len(), "side {side} qp {q}: extra completion {c:?}");
                    let w = &plan.wrs[mine[k]];
                    ensure!(c.wc.status == WcStatus::WrFlushErr, "side {side} qp {q}: after an error, {c:?} is not a flush (wr {})", w.wr.wr_id);
                    ensure!(c.wc.wr_id == w.wr.wr_id, "side {side} qp {q}: flushed wr_id {} out of order, expected {}", c.wc.wr_id, w.wr.wr_id);
                    ensure!(c.wc.opcode == expected_wc_opcode(w.kind), "side {side} qp {q}: flushed wr {} opcode {:?}", w.wr.wr_id, c.wc.opcode);
                    k += 1;
                    continue;
                }
                // Unsignaled successful WRs produce no completion: skip them.
                let pos = mine[k..].iter().position(|&i| plan.wrs[i].wr.wr_id == c.wc.wr_id);
                let Some(pos) = pos else {
                    return Err(format!("side {side} qp {q}: completion #{n} {c:?} does not match any later WR (duplicate or out of order)"));
                };
                for &i in &mine[k..k + pos] {
                    ensure!(
                        !plan.wrs[i].signaled || c.wc.status != WcStatus::Success,
                        "side {side} qp {q}: signaled wr {} has no completion before wr {}",
                        plan.wrs[i].wr.wr_id,
                        c.wc.wr_id
                    );
                    if c.wc.status == WcStatus::Success {
                        fate[i] = Fate::Done;
                    }
                }
                if c.wc.status != WcStatus::Success && pos > 0 {
                    // An error completion for a WR while earlier unsignaled WRs
                    // got nothing: those succeeded (completions are in order).
                    for &i in &mine[k..k + pos] {
                        ensure!(!plan.wrs[i].signaled, "side {side} qp {q}: signaled wr {} skipped before error", plan.wrs[i].wr.wr_id);
                        fate[i] = Fate::Done;
                    }
                }
                let i = mine[k + pos];
                let w = &plan.wrs[i];
                k += pos + 1;
                ensure!(c.wc.opcode == expected_wc_opcode(w.kind), "side {side} qp {q}: wr {} opcode {:?}, expected {:?}", w.wr.wr_id, c.wc.opcode, expected_wc_opcode(w.kind));
                if c.wc.status == WcStatus::Success {
                    ensure!(w.signaled, "side {side} qp {q}: unsignaled wr {} completed with success", w.wr.wr_id);
                    fate[i] = Fate::Done;
                } else {
                    ensure!(opts.allow_failure, "side {side} qp {q}: wr {} ({:?}, {} bytes) failed: {:?}", w.wr.wr_id, w.kind, w.wr.payload.len(), c.wc.status);
                    ensure!(
                        matches!(c.wc.status, WcStatus::RetryExcErr | WcStatus::RnrRetryExcErr),
                        "side {side} qp {q}: wr {} failed with {:?}, not a retry exhaustion",
                        w.wr.wr_id,
                        c.wc.status
                    );
                    failed = true;
                }
            }
            if failed {
                ensure!(k == mine.len(), "side {side} qp {q}: {} WRs never completed after the error", mine.len() - k);
                failed_sides += 1;
                qp_failed[q][side] = true;
            } else {
                // Every signaled WR must have completed; trailing unsignaled ones are done
                // iff the QP is quiescent, which the idle network implies.
                for &i in &mine[k..] {
                    ensure!(!plan.wrs[i].signaled, "side {side} qp {q}: signaled wr {} ({:?}) never completed", plan.wrs[i].wr.wr_id, plan.wrs[i].kind);
                    fate[i] = Fate::Done;
                }
            }
        }
    }
    // Receive completions.
    for q in 0..npairs {
        for side in 0..2 {
            let qpn = plan.pairs[q].qpn[side];
            let mine: Vec<&PlannedRecv> = plan.recvs.iter().filter(|r| r.qp == q && r.side == side).collect();
            let got = cqs.remove(&(side, recv_cq(q))).unwrap_or_default();
            let mut flushing = false;
            ensure!(got.len() <= mine.len(), "side {side} qp {q}: {} receive completions for {} receives", got.len(), mine.len());
            for (c, r) in got.iter().zip(&mine) {
                ensure!(c.wc.wr_id == r.wr.wr_id, "side {side} qp {q}: receive completion wr_id {} expected {}", c.wc.wr_id, r.wr.wr_id);
                ensure!(c.wc.qp_num == qpn, "side {side} qp {q}: receive completion qp_num {:#x}", c.wc.qp_num);
                if c.wc.status == WcStatus::WrFlushErr {
                    ensure!(qp_failed[q][side], "side {side} qp {q}: receive flushed but the QP did not fail");
                    flushing = true;
                    continue;
                }
                ensure!(!flushing, "side {side} qp {q}: success after a flush");
                ensure!(c.wc.status == WcStatus::Success, "side {side} qp {q}: receive {} status {:?}", r.wr.wr_id, c.wc.status);
                ensure!(c.wc.opcode == r.opcode, "side {side} qp {q}: receive {} opcode {:?} expected {:?}", r.wr.wr_id, c.wc.opcode, r.opcode);
                ensure!(c.wc.byte_len == r.byte_len, "side {side} qp {q}: receive {} byte_len {} expected {}", r.wr.wr_id, c.wc.byte_len, r.byte_len);
                ensure!(c.wc.imm_data == r.imm, "side {side} qp {q}: receive {} imm {:?} expected {:?}", r.wr.wr_id, c.wc.imm_data, r.imm);
                ensure!(c.wc.invalidated_rkey == r.inv, "side {side} qp {q}: receive {} invalidated {:?} expected {:?}", r.wr.wr_id, c.wc.invalidated_rkey, r.inv);
                ensure!(c.solicited == r.solicited, "side {side} qp {q}: receive {} solicited {} expected {}", r.wr.wr_id, c.solicited, r.solicited);
            }
            let peer_failed = qp_failed[q][1 - side];
            ensure!(
                got.len() == mine.len() || peer_failed || qp_failed[q][side],
                "side {side} qp {q}: only {} of {} receives completed",
                got.len(),
                mine.len()
            );
        }
    }
    ensure!(cqs.is_empty(), "completions on unknown CQs: {:?}", cqs.keys().collect::<Vec<_>>());

    // Apply the effects of the WRs known to be done to the model; regions of
    // WRs with unknown fate are excluded from the comparison.
    let mut unknown: Vec<(usize, Region)> = Vec::new();
    let mut slot_unknown: Vec<(usize, Region)> = Vec::new();
    // Atomics must be applied in posting order per slot: plan.wrs is in posting order.
    for (i, w) in plan.wrs.iter().enumerate() {
        let (s, r) = (w.side, 1 - w.side);
        let done = fate[i] == Fate::Done;
        match &w.effect {
            Effect::Write { target, data } => {
                if done {
                    mem[r].set_model(target, data);
                } else {
                    unknown.push((r, *target));
                }
            }
            Effect::Send { data } => {
                let rv = &plan.recvs[w.recv.expect("send consumes a receive")];
                if done {
                    mem[r].scatter_model(&rv.sgl, data);
                } else {
                    unknown.extend(rv.sgl.iter().map(|g| (r, *g)));
                }
            }
            Effect::Read { dest, data } => {
                if done {
                    mem[s].scatter_model(dest, data);
                } else {
                    unknown.extend(dest.iter().map(|g| (s, *g)));
                }
            }
            Effect::Atomic { slot, dest, orig, new } => {
                if done && !slot_unknown.iter().any(|(sd, g)| *sd == r && g.mr == slot.mr && g.off == slot.off) {
                    mem[r].set_model(slot, &new.to_ne_bytes());
                    mem[s].set_model(dest, &orig.to_ne_bytes());
                } else {
                    slot_unknown.push((r, *slot));
                    if !done {
                        unknown.push((s, *dest));
                    } else {
                        // Done after an unknown predecessor: its result cannot be predicted.
                        unknown.push((s, *dest));
                    }
                }
            }
        }
        if let Some(ri) = w.recv {
            if !done {
                let rv = &plan.recvs[ri];
                unknown.extend(rv.sgl.iter().map(|g| (r, *g)));
            }
        }
    }
    unknown.extend(slot_unknown);
    for side in 0..2 {
        for (mi, m) in mem[side].mrs.iter().enumerate() {
            let actual = m.bytes();
            // Compare the stretches between regions of unknown fate (slice
            // equality is a memcmp, fast even in debug builds).
            let mut skip: Vec<(usize, usize)> =
                unknown.iter().filter(|(sd, g)| *sd == side && g.mr == mi).map(|(_, g)| (g.off, g.off + g.len)).collect();
            skip.sort_unstable();
            let mut stretches = Vec::new();
            let mut at = 0;
            for (s0, s1) in skip {
                if s0 > at {
                    stretches.push((at, s0));
                }
                at = at.max(s1);
            }
            stretches.push((at, actual.len()));
            let bad = stretches.into_iter().find(|&(s0, s1)| actual[s0..s1] != m.model[s0..s1]);
            if let Some(pos) = bad.map(|(s0, s1)| (s0..s1).find(|&i| actual[i] != m.model[i]).unwrap_or(s0)) {
                let owner = describe_owner(plan, mem, side, mi, pos);
                return Err(format!(
                    "side {side} MR {mi} (iova {:#x}) byte {pos}: {:#04x}, model {:#04x}; {owner}",
                    m.iova, actual[pos], m.model[pos]
                ));
            }
        }
    }
    // Keys invalidated by SEND with invalidate are dead (when that SEND succeeded).
    for (side, qp, key) in &plan.invalidated {
        let sent = plan.wrs.iter().enumerate().find(|(_, w)| matches!(w.wr.op, SendOp::SendWithInv { rkey } if rkey == *key) && w.qp == *qp);
        if let Some((i, _)) = sent {
            if fate[i] == Fate::Done {
                let qpn = plan.pairs[*qp].qpn[*side];
                let r = mem[*side].table.remote_check(PD, qpn, *key, 0, 0, Access::REMOTE_READ);
                ensure!(r.is_err(), "side {side}: key {key:#x} still valid after SEND with invalidate");
            }
        }
    }
    Ok(failed_sides)
}

/// Which planned WR owns byte `pos` of MR `mr` on `side` (for error messages).
fn describe_owner(plan: &Plan, mem: &[HostMem; 2], side: usize, mr: usize, pos: usize) -> String {
    let inside = |g: &Region| g.mr == mr && (g.off..g.off + g.len).contains(&pos);
    for w in &plan.wrs {
        let (s, r) = (w.side, 1 - w.side);
        let hit = match &w.effect {
            Effect::Write { target, .. } => r == side && inside(target),
            Effect::Send { .. } => w.recv.is_some_and(|ri| r == side && plan.recvs[ri].sgl.iter().any(inside)),
            Effect::Read { dest, .. } => s == side && dest.iter().any(inside),
            Effect::Atomic { slot, dest, .. } => (r == side && inside(slot)) || (s == side && inside(dest)),
        };
        let recv_hit = w.recv.is_some_and(|ri| plan.recvs[ri].side == side && plan.recvs[ri].sgl.iter().any(inside));
        if hit || recv_hit {
            return format!(
                "owned by wr {} ({:?}, {} bytes, qp {}, side {} -> {}, mtu {})",
                w.wr.wr_id,
                w.kind,
                w.wr.payload.len(),
                w.qp,
                s,
                r,
                plan.pairs[w.qp].params[0].mtu.bytes()
            );
        }
    }
    let _ = mem;
    "not in any WR's region (an overrun?)".into()
}

fn seeds_from_env() -> (u64, u64) {
    let n = std::env::var("URNIC_SIM_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000u64);
    let base = std::env::var("URNIC_SIM_SEED_BASE").ok().and_then(|v| v.parse().ok()).unwrap_or(0u64);
    (base, n)
}

fn run_seeds(part: u64, parts: u64) {
    let opts = RunOpts { deadline: Duration::from_secs(600), allow_failure: false };
    if let Some(seed) = std::env::var("URNIC_SIM_SEED").ok().and_then(|v| v.parse::<u64>().ok()) {
        if part == 0 {
            if let Err(e) = run_seed(seed, opts) {
                panic!("seed {seed} failed: {e}");
            }
        }
        return;
    }
    let (base, n) = seeds_from_env();
    let start = std::time::Instant::now();
    let mut frames = 0;
    let mut count = 0;
    let mut failed_sides = 0;
    for seed in (base..base + n).filter(|s| s % parts == part) {
        let r = std::panic::catch_unwind(|| run_seed(seed, opts));
        match r {
            Ok(Ok(o)) => {
                if o.frames > 100_000 && std::env::var("URNIC_SIM_VERBOSE").is_ok() {
                    eprintln!("seed {seed}: {} frames", o.frames);
                }
                frames += o.frames;
                failed_sides += o.errors;
            }
            Ok(Err(e)) => panic!(
                "seed {seed} failed: {e}\nreplay: URNIC_SIM_SEED={seed} cargo test -p rocev2 --test sim_random random_mix_0 -- --nocapture"
            ),
            Err(p) => {
                eprintln!("seed {seed} panicked\nreplay: URNIC_SIM_SEED={seed} cargo test -p rocev2 --test sim_random random_mix_0 -- --nocapture");
                std::panic::resume_unwind(p);
            }
        }
        count += 1;
    }
    eprintln!("part {part}: {count} seeds, {frames} frames, {failed_sides} QPs gave up (severe loss), {:?}", start.elapsed());
}

#[test]
fn random_mix_0() {
    run_seeds(0, 2);
}

#[test]
fn random_mix_1() {
    run_seeds(1, 2);
}

// ---------------------------------------------------------------- scenarios

/// Helper for the fixed scenarios: two engines with `n` QP pairs and 1 MiB MRs.
struct Fixture {
    net: Network<Engine>,
    nodes: [NodeId; 2],
    qpn: Vec<[u32; 2]>,
    mem: [HostMem; 2],
    links: [rocev2::sim::LinkId; 2],
}

fn fixture(seed: u64, n: usize, params: RcParams, link: LinkConfig, post_init: impl Fn(&mut Engine, usize, u32)) -> Fixture {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mem = [HostMem::new(&mut rng, &[1 << 20]), HostMem::new(&mut rng, &[1 << 20])];
    let hosts = [HostAddr::ipv4(1), HostAddr::ipv4(2)];
    let mut engines = [0, 1].map(|i| Engine::new(EngineConfig { first_qpn: 0x11, ..EngineConfig::default() }, mem[i].table.clone()));
    let mut qpn = Vec::new();
    for q in 0..n {
        let mut pair = [0; 2];
        for side in 0..2 {
            let init = QpInitAttr {
                qp_type: QpType::Rc,
                pd: PD,
                send_cq: send_cq(q),
                recv_cq: recv_cq(q),
                srq: None,
                cap: QpCaps::default(),
                sq_sig_all: true,
            };
            pair[side] = engines[side].create_qp(&init).expect("create_qp");
        }
        qpn.push(pair);
    }
    for (q, pair) in qpn.iter().enumerate() {
        for side in 0..2 {
            let mut p = params;
            p.sq_psn = Psn::new(0xff_fff0 + side as u32);
            let peer_psn = Psn::new(0xff_fff0 + 1 - side as u32);
            let _ = &post_init;
            bring_up_rc(&mut engines[side], pair[side], &hosts[side], &hosts[1 - side], pair[1 - side], peer_psn, &p).expect("bring up");
            post_init(&mut engines[side], q, pair[side]);
        }
    }
    let [ea, eb] = engines;
    let mut net = Network::new(Instant::ZERO);
    let a = net.add_node(ea, hosts[0].mac);
    let b = net.add_node(eb, hosts[1].mac);
    let l0 = net.connect(a, b, link, split_seed(seed, 1), true);
    let l1 = net.connect(b, a, link, split_seed(seed, 2), true);
    Fixture { net, nodes: [a, b], qpn, mem, links: [l0, l1] }
}

fn drain(net: &mut Network<Engine>, node: NodeId) -> Vec<Completion> {
    std::iter::from_fn(|| net.node_mut(node).poll_completion()).collect()
}

#[test]
fn rnr_receiver_posts_receives_late() {
    // SENDs to a QP with no receive posted: the responder answers RNR NAK and
    // the requester waits (rnr_retry 7 = forever) until the receives arrive.
    let params = RcParams { min_rnr_timer: 14, timeout: 12, ..RcParams::default() }; // 1.28 ms RNR timer
    let mut f = fixture(7, 1, params, LinkConfig::ideal(Duration::from_micros(5)), |_, _, _| {});
    let [a, b] = f.nodes;
    let qa = f.qpn[0][0];
    let qb = f.qpn[0][1];
    let mut rng = ChaCha8Rng::seed_from_u64(99);
    let mut expected = Vec::new();
    let mut recvs = Vec::new();
    for (i, len) in [0usize, 1, 1024, 1025, 5000, 64].into_iter().enumerate() {
        let src = f.mem[0].alloc(&mut rng, len);
        let dst = f.mem[1].alloc(&mut rng, len);
        let data = f.mem[0].model(&src).to_vec();
        f.mem[1].set_model(&dst, &data);
        let sge = f.mem[0].sge(&src);
        f.net.node_mut(a).post_send(qa, SendWr { wr_id: i as u64, op: SendOp::Send, payload: Payload::Sgl(if len == 0 { vec![] } else { vec![sge] }), flags: SendFlags::SIGNALED, ud: None }).unwrap();
        recvs.push(RecvWr { wr_id: 100 + i as u64, sgl: if len == 0 { vec![] } else { vec![f.mem[1].sge(&dst)] } });
        expected.push(len);
    }
    // 10 ms without receives: only RNR NAKs, no completions, no errors.
    assert_eq!(f.net.advance_to(Instant::ZERO + Duration::from_millis(10)), RunOutcome::Deadline);
    assert!(drain(&mut f.net, a).is_empty(), "nothing may complete before the receives are posted");
    assert!(drain(&mut f.net, b).is_empty());
    for r in recvs {
        f.net.node_mut(b).post_recv(qb, r).unwrap();
    }
    assert_eq!(f.net.run_until(Instant::ZERO + Duration::from_secs(10)), RunOutcome::Idle);
    let sa = drain(&mut f.net, a);
    let sb = drain(&mut f.net, b);
    assert_eq!(sa.iter().map(|c| (c.wc.wr_id, c.wc.status)).collect::<Vec<_>>(), (0..6).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>());
    assert_eq!(
        sb.iter().map(|c| (c.wc.wr_id, c.wc.status, c.wc.byte_len)).collect::<Vec<_>>(),
        expected.iter().enumerate().map(|(i, &l)| (100 + i as u64, WcStatus::Success, l as u32)).collect::<Vec<_>>()
    );
    let m = &f.mem[1].mrs[0];
    assert!(m.bytes() == &m.model[..], "received data differs");
    // The RNR NAKs really happened: 10 ms of 1.28 ms RNR back-offs.
    let sent = f.net.node(b).qp_stats(qb).unwrap().resp_rnr_naks_sent;
    let got = f.net.node(a).qp_stats(qa).unwrap().req_rnr_naks_received;
    assert!(sent >= 5, "expected RNR NAKs from the responder, saw {sent}");
    assert!(got >= 5 && got <= sent, "requester saw {got} of {sent} RNR NAKs");
}

#[test]
fn rnr_retry_exhaustion_then_flush() {
    // rnr_retry = 2 and no receive ever: RNR_RETRY_EXC_ERR for the first WR,
    // WR_FLUSH_ERR for the rest, each exactly once.
    let params = RcParams { min_rnr_timer: 1, rnr_retry: 2, ..RcParams::default() };
    let mut f = fixture(8, 1, params, LinkConfig::ideal(Duration::from_micros(2)), |_, _, _| {});
    let [a, _b] = f.nodes;
    let qa = f.qpn[0][0];
    for i in 0..4u64 {
        let data = vec![i as u8; 100];
        f.net.node_mut(a).post_send(qa, SendWr { wr_id: i, op: SendOp::Send, payload: Payload::Inline(data), flags: SendFlags::SIGNALED | SendFlags::INLINE, ud: None }).unwrap();
    }
    assert_eq!(f.net.run_until(Instant::ZERO + Duration::from_secs(10)), RunOutcome::Idle);
    let got: Vec<_> = drain(&mut f.net, a).iter().map(|c| (c.wc.wr_id, c.wc.status)).collect();
    assert_eq!(
        got,
        vec![(0, WcStatus::RnrRetryExcErr), (1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr), (3, WcStatus::WrFlushErr)]
    );
}

#[test]
fn blackout_exhausts_retries_then_flushes() {
    // Traffic flows, then both directions go dark for good: the requester
    // retries retry_cnt (7) times, completes the oldest outstanding WR with
    // RETRY_EXC_ERR and flushes the rest (and its receive queue) with
    // WR_FLUSH_ERR, every WR exactly once.
    let params = RcParams { timeout: 10, retry_cnt: 7, ..RcParams::default() }; // 4.2 ms
    // 1 Gb/s ports: the 20 WRITEs of 3000 bytes take about 0.5 ms to send, so
    // some are done and some in flight when the lights go out.
    let link = LinkConfig { rate_bps: Some(1_000_000_000), ..LinkConfig::ideal(Duration::from_micros(10)) };
    let mut f = fixture(9, 1, params, link, |e, _, qpn| {
        for i in 0..3 {
            e.post_recv(qpn, RecvWr { wr_id: 500 + i, sgl: vec![] }).unwrap();
        }
    });
    let [a, b] = f.nodes;
    let qa = f.qpn[0][0];
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut done_regions = Vec::new();
    for i in 0..20u64 {
        let len = 3000;
        let src = f.mem[0].alloc(&mut rng, len);
        let dst = f.mem[1].alloc(&mut rng, len);
        let remote = RemoteAddr { addr: f.mem[1].va(&dst), rkey: f.mem[1].mrs[0].key };
        let sge = f.mem[0].sge(&src);
        f.net.node_mut(a).post_send(qa, SendWr { wr_id: i, op: SendOp::Write { remote }, payload: Payload::Sgl(vec![sge]), flags: SendFlags::SIGNALED, ud: None }).unwrap();
        done_regions.push((src, dst));
    }
    // Let the first few complete (each WRITE is 3 packets at MTU 1024; RTT 20 µs).
    let mut before = Vec::new();
    let outcome = f.net.run_until_or(Instant::ZERO + Duration::from_secs(1), |net| {
        while let Some(c) = net.node_mut(a).poll_completion() {
            before.push(c);
        }
        before.len() >= 3
    });
    assert_eq!(outcome, RunOutcome::Stopped);
    let t_dark = f.net.now();
    for l in f.links {
        f.net.link_mut(l).set_down(true);
    }
    assert_eq!(f.net.run_until(t_dark + Duration::from_secs(10)), RunOutcome::Idle);
    let elapsed = f.net.now() - t_dark;
    let mut all = before;
    all.extend(drain(&mut f.net, a));
    let statuses: Vec<(u64, WcStatus)> = all.iter().filter(|c| c.cq == send_cq(0)).map(|c| (c.wc.wr_id, c.wc.status)).collect();
    // Prefix of successes, one RETRY_EXC_ERR, then flushes; all 20 exactly once, in order.
    assert_eq!(statuses.iter().map(|s| s.0).collect::<Vec<_>>(), (0..20).collect::<Vec<_>>(), "{statuses:?}");
    let ok = statuses.iter().take_while(|s| s.1 == WcStatus::Success).count();
    assert!((3..20).contains(&ok), "{statuses:?}");
    assert_eq!(statuses[ok].1, WcStatus::RetryExcErr, "{statuses:?}");
    assert!(statuses[ok + 1..].iter().all(|s| s.1 == WcStatus::WrFlushErr), "{statuses:?}");
    // 8 timeouts of 4.194 ms (the first transmission plus 7 retries).
    let t = Duration::from_nanos(4096 << 10);
    assert!(elapsed >= t * 8 && elapsed < t * 10, "gave up after {elapsed:?}");
    // The receive queue of the failed QP is flushed too, each WR once, in order.
    let recv_flushed: Vec<(u64, WcStatus)> = all.iter().filter(|c| c.cq == recv_cq(0)).map(|c| (c.wc.wr_id, c.wc.status)).collect();
    assert_eq!(recv_flushed, (500..503).map(|i| (i, WcStatus::WrFlushErr)).collect::<Vec<_>>());
    assert_eq!(all.len(), 23, "no other completions");
    // The peer saw nothing fail: its QP is still fine and has nothing to report.
    assert!(drain(&mut f.net, b).is_empty());
    // Completed WRITEs landed.
    for (src, dst) in &done_regions[..ok] {
        assert_eq!(f.mem[1].mrs[0].bytes()[dst.off..dst.off + dst.len], f.mem[0].model(src)[..]);
    }
    // Nothing more comes out later.
    assert!(f.net.node_mut(a).poll_completion().is_none());
}
