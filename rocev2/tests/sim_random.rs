//! Randomized end-to-end test of the RC transport in the simulator.
//!
//! Per seed: two engines joined by impaired virtual links, one to three RC QP
//! pairs (random MTU, PSNs near the 2^24 wrap, limits), a random mix of SEND
//! (+imm, +inv), RDMA WRITE (+imm), RDMA READ, CMP_SWAP and FETCH_ADD posted
//! on both sides, with random sizes (0 .. 256 KiB, biased to MTU edges),
//! random scatter/gather splits across several MRs, inline data, fences,
//! unsignaled WRs and solicited events. A reference model predicts the final
//! contents of every registered byte on both hosts and every completion.
//! Effects never depend on the order of QPs: a region is written by WRs of
//! one QP only; atomics use 8-byte slots whose value sequence the model
//! follows per QP.
//!
//! Generations: every WRITE's data and every READ's source starts with a
//! stamp of its own (`generation`), and most WRITEs (READs) of one requester
//! on one QP share their destination, in posting order. A WRITE or READ
//! applied twice (an old WRITE replayed after a newer one, a stale READ
//! response placed again) leaves an older generation where the model has a
//! newer one; with a region per WR, as before, the second application
//! rewrote identical bytes and went unseen (`generations_catch_*`).
//!
//! Checks: the network goes idle; every send WR completes exactly once, in
//! posting order per QP, with the right status and opcode (or, where a run
//! gives up, one error followed only by flush errors); receive completions
//! carry the right wr_id, byte_len, immediate, invalidated key and solicited
//! flag; all memory on both hosts equals the model.
//!
//! The adversarial mixes add a third host on the segment
//! (`rocev2::sim::adversary`) that injects forged frames with valid ICRCs
//! during the run and after it, of every class `sim::forge` marks
//! model-safe: requests, responses and CNPs from a stranger's address;
//! requests from the peer's address far behind or ahead of the window;
//! responses from the peer's address for stale or never-sent PSNs; copies of
//! sequence NAKs. The same checks must hold, and each forged frame must be
//! counted exactly as its class says (issue 14).
//!
//! `URNIC_SIM_SEEDS=N` sets the number of seeds (default 2000, split over two
//! test functions); `URNIC_SIM_SEED=S` runs only seed `S`;
//! `URNIC_SIM_ADV_SEEDS` / `URNIC_SIM_ADV_SEED` the same for the adversarial
//! mixes (default 60), `URNIC_SIM_ADV_ATTACKS=a,b` narrows their classes;
//! `URNIC_SIM_SEED_BASE` is the first seed; `URNIC_SIM_KEEP_GOING=1` lists
//! every failing seed; `URNIC_SIM_VERBOSE=1` prints what the forged frames
//! were counted as; `URNIC_SIM_TRACE=1` prints every frame of a run.

// Both hosts' state lives in `[_; 2]` arrays indexed by side, often several
// at once: index loops read better here than zipped iterators.
#![allow(clippy::needless_range_loop)]

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use rocev2::psn::Psn;
use rocev2::sim::adversary::{Adversary, AdversaryConfig, Strike, Target};
use rocev2::sim::forge::Station;
use rocev2::sim::rc::{bring_up_rc, bring_up_rc_from_init, init_qp, HostAddr, RcParams};
use rocev2::sim::{split_seed, LinkConfig, Network, NodeId, RunOutcome, TapPoint};
use rocev2::time::Instant;
use rocev2::transport::attr::{Mtu, QpCaps, QpInitAttr, QpState, QpType};
use rocev2::transport::engine::{Engine, EngineConfig};
use rocev2::transport::memory::{Access, MemoryTable, MwType, PdId};
use rocev2::transport::wr::{Completion, CqId, Payload, RecvWr, RemoteAddr, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus};
use rocev2::wire::{parse_frame, peek_opcode, Opcode};

const PD: PdId = PdId(1);
const MAX_SIZE: usize = 256 * 1024;
/// Links losing this much or more may exhaust the retries.
const SEVERE_LOSS: f64 = 0.10;
const ALL_ACCESS: Access =
    Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ).union(Access::REMOTE_ATOMIC).union(Access::MW_BIND);

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

    /// Write `data` over the start of `sgl`, in the buffers and in the model
    /// alike (before the engines run).
    fn poke_sgl(&mut self, sgl: &[Region], data: &[u8]) {
        let mut off = 0;
        for r in sgl {
            let n = r.len.min(data.len() - off);
            let m = &mut self.mrs[r.mr];
            m.model[r.off..r.off + n].copy_from_slice(&data[off..off + n]);
            // SAFETY: the region lies inside the MR's buffer (allocated by
            // `alloc`), and no engine runs while the test writes it.
            unsafe { std::ptr::copy_nonoverlapping(data[off..].as_ptr(), (m.ptr as *mut u8).add(r.off), n) };
            off += n;
            if off == data.len() {
                break;
            }
        }
    }

    /// Overwrite the actual bytes of `sgl` with the start of `data`, leaving
    /// the model alone: what a transport that applies an effect a second
    /// time would do (for the tests that show the model catches it).
    fn doctor(&mut self, sgl: &[Region], data: &[u8]) {
        let mut off = 0;
        for r in sgl {
            let n = r.len.min(data.len() - off);
            let m = &mut self.mrs[r.mr];
            // SAFETY: as in `poke_sgl`.
            unsafe { std::ptr::copy_nonoverlapping(data[off..].as_ptr(), (m.ptr as *mut u8).add(r.off), n) };
            off += n;
            if off == data.len() {
                break;
            }
        }
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
        c.faults.loss = rng.gen_range(SEVERE_LOSS..0.25);
        c.faults.duplicate = rng.gen_range(0.0..0.05);
        c.faults.reorder = rng.gen_range(0.0..0.1);
        c.reorder_max = Duration::from_nanos(rng.gen_range(1_000..50_000));
        c.faults.corrupt = rng.gen_range(0.0..0.05);
        return c;
    }
    if x < 40 {
        return c;
    }
    let severity = if x < 70 { 0.01 } else { 0.05 };
    c.faults.loss = rng.gen_range(0.0..severity);
    c.faults.duplicate = rng.gen_range(0.0..severity);
    c.faults.reorder = rng.gen_range(0.0..severity * 2.0);
    c.reorder_max = Duration::from_nanos(rng.gen_range(1_000..50_000));
    c.faults.corrupt = rng.gen_range(0.0..severity);
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

/// The generation stamp of WR `wr_id`: the first bytes of what a WRITE
/// writes or a READ fetches (up to 8; the low byte alone already differs
/// between the WRs of a plan).
fn generation(wr_id: u64) -> [u8; 8] {
    (0xa5a5_0000_0000_0000 | wr_id).to_le_bytes()
}

/// Plan the WRs of `seed`. With `generations`, WRITEs and READs carry a
/// generation stamp and most of them share their destination with the
/// earlier WRITEs (READs) of the same requester on the same QP, so that an
/// older one applied again after a newer one (a replayed WRITE executed
/// twice, a stale READ response placed again) leaves a wrong generation in
/// memory. Without, every WR gets fresh regions (the model before
/// generations, blind to such double execution).
fn plan(seed: u64, generations: bool) -> (Plan, [HostMem; 2]) {
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
            p.sq_psn = if rng.gen_bool(0.3) { Psn::new(0xff_ffff - rng.gen_range(0..64)) } else { Psn::new(rng.gen_range(0..=0xff_ffff)) };
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
    // The longest WRITE and READ of each requester side and QP: the size of
    // the place they share.
    let mut longest: BTreeMap<(usize, usize, bool), usize> = BTreeMap::new();
    for d in &drafts {
        let read = match d.kind {
            Kind::Write | Kind::WriteImm => false,
            Kind::Read => true,
            _ => continue,
        };
        let e = longest.entry((d.side, d.qp, read)).or_insert(0);
        *e = (*e).max(d.len);
    }
    let mut shared: BTreeMap<(usize, usize, bool), Region> = BTreeMap::new();
    let total: usize = drafts.iter().map(|d| d.len + 64).sum::<usize>() + longest.values().map(|l| l + 64).sum::<usize>();
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
        let stamp = generation(wr_id);
        let stamp = &stamp[..d.len.min(8)];
        let stamped = generations && matches!(d.kind, Kind::Write | Kind::WriteImm);
        let source = |mem: &mut [HostMem; 2], rng: &mut ChaCha8Rng, flags: &mut SendFlags| -> (Payload, Vec<u8>) {
            if d.len <= 400 && rng.gen_bool(0.3) {
                let mut data = vec![0u8; d.len];
                rng.fill(&mut data[..]);
                if stamped {
                    data[..stamp.len()].copy_from_slice(stamp);
                }
                *flags |= SendFlags::INLINE;
                (Payload::Inline(data.clone()), data)
            } else {
                let sgl = mem[s].alloc_sgl(rng, d.len);
                if stamped {
                    mem[s].poke_sgl(&sgl, stamp);
                }
                let data = mem[s].gather_model(&sgl);
                (Payload::Sgl(sgl.iter().map(|g| mem[s].sge(g)).collect()), data)
            }
        };
        // The place this WRITE (READ) shares with the requester's others on
        // this QP, if it does.
        let mut shared_place = |mem: &mut [HostMem; 2], rng: &mut ChaCha8Rng, read: bool| -> Option<Region> {
            if !generations || !rng.gen_bool(0.7) {
                return None;
            }
            let host = if read { s } else { r };
            let len = longest[&(s, d.qp, read)];
            let area = *shared.entry((s, d.qp, read)).or_insert_with(|| mem[host].alloc(rng, len));
            Some(Region { len: d.len, ..area })
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
                let target = match shared_place(&mut mem, &mut rng, false) {
                    Some(place) => place,
                    None => mem[r].alloc(&mut rng, d.len),
                };
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
                if generations {
                    mem[r].poke_sgl(&[src], stamp);
                }
                let data = mem[r].model(&src).to_vec();
                let dest = match shared_place(&mut mem, &mut rng, true) {
                    // The shared place, split into 1..=4 scatter entries.
                    Some(place) if d.len > 0 => {
                        let parts = rng.gen_range(1..=4usize).min(d.len);
                        let mut cuts: Vec<usize> = (0..parts - 1).map(|_| rng.gen_range(1..d.len)).collect();
                        cuts.push(d.len);
                        cuts.sort_unstable();
                        cuts.dedup();
                        let mut at = 0;
                        cuts.into_iter()
                            .map(|c| {
                                let g = Region { off: place.off + at, len: c - at, ..place };
                                at = c;
                                g
                            })
                            .collect()
                    }
                    _ => mem[s].alloc_sgl(&mut rng, d.len),
                };
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
        wrs.push(PlannedWr { side: s, qp: d.qp, wr: SendWr { wr_id, op, payload, flags, ud: None }, kind: d.kind, signaled, effect, recv });
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
    /// What the adversary injected, if there was one.
    strikes: Vec<Strike>,
}

/// Options that scenarios change.
#[derive(Clone, Copy, Debug)]
struct RunOpts {
    /// Virtual deadline.
    deadline: Duration,
    /// Accept an error completion followed by flushes (severe impairments).
    allow_failure: bool,
    /// WRITEs and READs carry generations and share destinations (see `plan`).
    generations: bool,
    /// A third host on the segment injects forged frames (model-safe classes).
    adversary: bool,
    /// Keep the WRITE ONLY frames the hosts send, for `after_idle` hooks.
    capture_writes: bool,
}

impl RunOpts {
    const fn mix() -> RunOpts {
        RunOpts { deadline: Duration::from_secs(600), allow_failure: false, generations: true, adversary: false, capture_writes: false }
    }
}

/// What an `after_idle` hook of [`run_plan`] gets: the run, idle, before the check.
struct Idle<'a> {
    plan: &'a Plan,
    mem: &'a mut [HostMem; 2],
    net: &'a mut Network<Engine>,
    nodes: [NodeId; 2],
    /// WRITE ONLY frames sent (with `capture_writes`): (sender side, frame).
    writes: Vec<(usize, Vec<u8>)>,
}

type AfterIdle<'a> = &'a mut dyn FnMut(&mut Idle<'_>) -> Result<(), String>;

/// Frames kept by the tap: (sender side, frame).
type Captured = Vec<(usize, Vec<u8>)>;

fn run_seed(seed: u64, opts: RunOpts) -> Result<Outcome, String> {
    run_seed_with(seed, opts, &mut |_| Ok(()))
}

fn run_seed_with(seed: u64, mut opts: RunOpts, after_idle: AfterIdle<'_>) -> Result<Outcome, String> {
    let (mut plan, mut mem) = plan(seed, opts.generations);
    opts.allow_failure |= plan.links.iter().any(|l| l.faults.loss >= SEVERE_LOSS);
    let trace = std::env::var("URNIC_SIM_TRACE").is_ok_and(|v| v != "0");
    if trace {
        eprintln!("seed {seed}: links {:?}\npairs {:?}\nlate receives {:?}, ipv6 {}", plan.links, plan.pairs, plan.late_recvs, plan.ipv6);
        for w in &plan.wrs {
            eprintln!("  wr {} side {} qp {} {:?} {} bytes flags {:?}", w.wr.wr_id, w.side, w.qp, w.kind, w.wr.payload.len(), w.wr.flags);
        }
    }
    run_plan(&mut plan, &mut mem, opts, trace, after_idle)
}

fn run_plan(plan: &mut Plan, mem: &mut [HostMem; 2], opts: RunOpts, trace: bool, after_idle: AfterIdle<'_>) -> Result<Outcome, String> {
    let hosts = if plan.ipv6 { [HostAddr::ipv6(1), HostAddr::ipv6(2)] } else { [HostAddr::ipv4(1), HostAddr::ipv4(2)] };
    let mut engines =
        [0, 1].map(|i| Engine::new(EngineConfig { first_qpn: 0x11 + 0x100 * i as u32, ..EngineConfig::default() }, mem[i].table.clone()));
    let npairs = plan.pairs.len();
    let caps = QpCaps { max_send_wr: 1024, max_recv_wr: 1024, max_send_sge: 16, max_recv_sge: 16, max_inline_data: 400 };
    for q in 0..npairs {
        for side in 0..2 {
            let init = QpInitAttr { qp_type: QpType::Rc, pd: PD, send_cq: send_cq(q), recv_cq: recv_cq(q), srq: None, cap: caps, sq_sig_all: false };
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
            let bound =
                m.table.bind_mw(PD, qpn, mw, new_key, m.mrs[0].key, m.mrs[0].iova, 64, Access::REMOTE_READ).map_err(|e| format!("bind_mw: {e:?}"))?;
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
            init_qp(&mut engines[side], qpn, &p).map_err(|e| format!("modify INIT: {e:?}"))?;
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
        engines[w.side].post_send(plan.pairs[w.qp].qpn[w.side], w.wr.clone()).map_err(|e| format!("post_send wr {}: {e:?}", w.wr.wr_id))?;
    }
    let [ea, eb] = engines;
    let mut net: Network<Engine> = Network::new(Instant::ZERO);
    let a = net.add_node(ea, hosts[0].mac);
    let b = net.add_node(eb, hosts[1].mac);
    let nodes = [a, b];
    net.connect(a, b, plan.links[0], split_seed(plan.seed, 100), false);
    net.connect(b, a, plan.links[1], split_seed(plan.seed, 101), false);
    let captured: Rc<RefCell<Captured>> = Rc::default();
    if trace || opts.capture_writes {
        let keep = captured.clone();
        let capture = opts.capture_writes;
        net.set_tap(Some(Box::new(move |p, t, from, to, f: &[u8]| {
            if trace {
                eprintln!("{:>12} {:?} {}->{} {}", t.as_nanos(), p, from.0 as isize, to.0, describe(f));
            }
            if capture && p == TapPoint::Sent && peek_opcode(f) == Some(Opcode::RC_WRITE_ONLY) {
                keep.borrow_mut().push((from.0, f.to_vec()));
            }
        })));
    }
    // The adversary: a third host on the segment with its own seed, aiming
    // at every QP of both hosts and at all their registered memory.
    let mut adversary = opts.adversary.then(|| {
        let mut targets = Vec::new();
        for pc in &plan.pairs {
            for side in 0..2 {
                targets.push(Target {
                    node: nodes[side],
                    qpn: pc.qpn[side],
                    addr: Station::from(&hosts[side]),
                    peer_qpn: pc.qpn[1 - side],
                    peer: Station::from(&hosts[1 - side]),
                    memory: mem[side].mrs.iter().map(|m| (m.key, m.iova, (m.words * 8) as u64)).collect(),
                });
            }
        }
        let me = if plan.ipv6 { HostAddr::ipv6(66) } else { HostAddr::ipv4(66) };
        let mut config = AdversaryConfig::model_safe();
        // `URNIC_SIM_ADV_ATTACKS=stale_ack,stranger_write` narrows the classes
        // (by `Attack::name`; `seq_nak_copy` alone: only NAK copies).
        if let Ok(names) = std::env::var("URNIC_SIM_ADV_ATTACKS") {
            let names: Vec<&str> = names.split(',').map(str::trim).collect();
            config.attacks.retain(|a| names.contains(&a.name()));
            if !names.contains(&"seq_nak_copy") {
                config.nak_copy_chance = 0.0;
            }
        }
        Adversary::new(split_seed(plan.seed, 300), Station::from(&me), config, targets)
    });
    if let Some(adv) = adversary.as_mut() {
        adv.install(&mut net);
    }
    let deadline = Instant::ZERO + opts.deadline;
    if let Some(at) = plan.late_recvs {
        let at = Instant::ZERO + at;
        let outcome = match adversary.as_mut() {
            Some(adv) => adv.run_until(&mut net, at, false),
            None => net.advance_to(at),
        };
        if outcome == RunOutcome::Stalled {
            return Err("stalled before the late receives".into());
        }
        for r in &plan.recvs {
            net.node_mut(nodes[r.side]).post_recv(plan.pairs[r.qp].qpn[r.side], r.wr.clone()).map_err(|e| format!("late post_recv: {e:?}"))?;
        }
    }
    let outcome = match adversary.as_mut() {
        Some(adv) => adv.run_until(&mut net, deadline, true),
        None => net.run_until(deadline),
    };
    ensure!(outcome == RunOutcome::Idle, "network not idle at the end: {outcome:?} at {:?}", net.now());
    let strikes = adversary.map(|a| a.strikes().to_vec()).unwrap_or_default();
    let writes = std::mem::take(&mut *captured.borrow_mut());
    after_idle(&mut Idle { plan, mem, net: &mut net, nodes, writes })?;
    // Forged frames not counted as their class says, by class (named
    // first in an error, so a model failure they caused is explained).
    let mut miscounted: BTreeMap<&str, usize> = BTreeMap::new();
    for s in strikes.iter().filter(|s| s.verdict.is_err()) {
        *miscounted.entry(s.attack.name()).or_insert(0) += 1;
    }
    let miscounted = if miscounted.is_empty() {
        String::new()
    } else {
        let v: Vec<String> = miscounted.iter().map(|(a, n)| format!("{a} x{n}")).collect();
        format!("forged frames not counted as expected: {}; ", v.join(", "))
    };
    let checked = check(plan, mem, &mut net, nodes, opts).and_then(|errors| check_strikes(&strikes, &net, nodes).map(|()| errors));
    checked
        .map(|errors| Outcome { errors, frames: net.stats().frames_sent, strikes })
        .map_err(|e| format!("{miscounted}{e}\n{}", diagnostics(plan, &net, nodes)))
}

/// Every forged frame was counted as its class says (each strike's counter
/// changes were judged as it was injected); and, summed over the run, the
/// engine-wide `rx_wrong_peer` of each host is exactly the adversary's
/// stranger frames: legitimate traffic never comes from a wrong address.
fn check_strikes(strikes: &[Strike], net: &Network<Engine>, nodes: [NodeId; 2]) -> Result<(), String> {
    let bad: Vec<String> = strikes
        .iter()
        .filter_map(|s| {
            s.verdict
                .as_ref()
                .err()
                .map(|e| format!("  {} at {:?} to node {} qp {:#x} psn {} ({:?}): {e}", s.attack, s.at, s.victim.0 .0, s.victim.1, s.psn, s.state.0))
        })
        .collect();
    ensure!(bad.is_empty(), "{} of {} forged frames not counted as expected:\n{}", bad.len(), strikes.len(), bad.join("\n"));
    for (side, &n) in nodes.iter().enumerate() {
        let forged: i64 = strikes
            .iter()
            .filter(|s| s.victim.0 == n)
            .flat_map(|s| s.deltas.iter())
            .filter(|(k, _)| k == "engine.rx_wrong_peer")
            .map(|(_, d)| d)
            .sum();
        let counted = net.node(n).stats().rx_wrong_peer as i64;
        ensure!(counted == forged, "side {side}: rx_wrong_peer {counted}, the adversary's frames account for {forged}");
    }
    Ok(())
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

fn check_completions(plan: &Plan, mem: &mut [HostMem; 2], mut cqs: BTreeMap<(usize, CqId), Vec<Completion>>, opts: RunOpts) -> Result<usize, String> {
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
                ensure!(
                    c.wc.opcode == expected_wc_opcode(w.kind),
                    "side {side} qp {q}: wr {} opcode {:?}, expected {:?}",
                    w.wr.wr_id,
                    c.wc.opcode,
                    expected_wc_opcode(w.kind)
                );
                if c.wc.status == WcStatus::Success {
                    ensure!(w.signaled, "side {side} qp {q}: unsignaled wr {} completed with success", w.wr.wr_id);
                    fate[i] = Fate::Done;
                } else {
                    ensure!(
                        opts.allow_failure,
                        "side {side} qp {q}: wr {} ({:?}, {} bytes) failed: {:?}",
                        w.wr.wr_id,
                        w.kind,
                        w.wr.payload.len(),
                        c.wc.status
                    );
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
                    ensure!(
                        !plan.wrs[i].signaled,
                        "side {side} qp {q}: signaled wr {} ({:?}) never completed",
                        plan.wrs[i].wr.wr_id,
                        plan.wrs[i].kind
                    );
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
                ensure!(
                    c.wc.invalidated_rkey == r.inv,
                    "side {side} qp {q}: receive {} invalidated {:?} expected {:?}",
                    r.wr.wr_id,
                    c.wc.invalidated_rkey,
                    r.inv
                );
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

/// Which planned WRs own byte `pos` of MR `mr` on `side`, and whose data
/// the byte holds (for error messages: a byte that holds an older WR's
/// generation where a newer one's belongs is a double execution).
fn describe_owner(plan: &Plan, mem: &[HostMem; 2], side: usize, mr: usize, pos: usize) -> String {
    let inside = |g: &Region| g.mr == mr && (g.off..g.off + g.len).contains(&pos);
    let actual = mem[side].mrs[mr].bytes()[pos];
    // Offset of `pos` within the data a scatter list received.
    let offset_in = |sgl: &[Region]| {
        let mut at = 0;
        for g in sgl {
            if inside(g) {
                return Some(at + pos - g.off);
            }
            at += g.len;
        }
        None
    };
    let mut owners = Vec::new();
    let mut holds = Vec::new();
    for w in &plan.wrs {
        let (s, r) = (w.side, 1 - w.side);
        let data_at = match &w.effect {
            Effect::Write { target, data } if r == side && inside(target) => Some(data.get(pos - target.off).copied()),
            Effect::Send { data } => w.recv.filter(|_| r == side).and_then(|ri| offset_in(&plan.recvs[ri].sgl)).map(|o| data.get(o).copied()),
            Effect::Read { dest, data } if s == side => offset_in(dest).map(|o| data.get(o).copied()),
            Effect::Atomic { slot, dest, .. } if (r == side && inside(slot)) || (s == side && inside(dest)) => Some(None),
            _ => None,
        };
        let recv_hit = w.recv.is_some_and(|ri| plan.recvs[ri].side == side && plan.recvs[ri].sgl.iter().any(inside));
        if data_at.is_some() || recv_hit {
            owners.push(format!(
                "wr {} ({:?}, {} bytes, qp {}, side {} -> {}, mtu {})",
                w.wr.wr_id,
                w.kind,
                w.wr.payload.len(),
                w.qp,
                s,
                r,
                plan.pairs[w.qp].params[0].mtu.bytes()
            ));
            if data_at.flatten() == Some(actual) {
                holds.push(w.wr.wr_id.to_string());
            }
        }
    }
    if owners.is_empty() {
        return "not in any WR's region (an overrun?)".into();
    }
    let holds = if holds.is_empty() { "none of theirs".to_string() } else { format!("the data of wr {}", holds.join(" or ")) };
    format!("owned by {} (in posting order); the byte matches {holds}", owners.join(", "))
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// A family of seeded runs: which options, how many seeds by default, and
/// the environment variables and test name that replay one.
struct Mix {
    opts: RunOpts,
    /// Seeds when the count variable is unset.
    default_seeds: u64,
    /// Number of seeds (`URNIC_SIM_SEEDS`, `URNIC_SIM_ADV_SEEDS`).
    seeds_var: &'static str,
    /// Run only this seed (`URNIC_SIM_SEED`, `URNIC_SIM_ADV_SEED`).
    seed_var: &'static str,
    /// The test that runs part 0.
    test: &'static str,
}

const RANDOM_MIX: Mix =
    Mix { opts: RunOpts::mix(), default_seeds: 2000, seeds_var: "URNIC_SIM_SEEDS", seed_var: "URNIC_SIM_SEED", test: "random_mix_0" };

const ADVERSARIAL_MIX: Mix = Mix {
    opts: RunOpts { adversary: true, ..RunOpts::mix() },
    default_seeds: 60,
    seeds_var: "URNIC_SIM_ADV_SEEDS",
    seed_var: "URNIC_SIM_ADV_SEED",
    test: "adversarial_mix_0",
};

/// Run part `part` of `parts` of the mix's seeds (`URNIC_SIM_SEED_BASE` is
/// the first). `URNIC_SIM_KEEP_GOING=1` runs every seed and lists all that
/// failed before failing.
fn run_seeds(mix: &Mix, part: u64, parts: u64) {
    let opts = mix.opts;
    let replay = |seed: u64| format!("replay: {}={seed} cargo test -p rocev2 --test sim_random {} -- --nocapture", mix.seed_var, mix.test);
    if let Some(seed) = env_u64(mix.seed_var) {
        if part == 0 {
            match run_seed(seed, opts) {
                Ok(o) => report_strikes(&format!("seed {seed}"), &o.strikes),
                Err(e) => panic!("seed {seed} failed: {e}"),
            }
        }
        return;
    }
    let n = env_u64(mix.seeds_var).unwrap_or(mix.default_seeds);
    let base = env_u64("URNIC_SIM_SEED_BASE").unwrap_or(0);
    let keep_going = std::env::var("URNIC_SIM_KEEP_GOING").is_ok_and(|v| v != "0");
    let start = std::time::Instant::now();
    let mut frames = 0;
    let mut count = 0;
    let mut failed_sides = 0;
    let mut strikes = Vec::new();
    let mut failures = Vec::new();
    for seed in (base..base + n).filter(|s| s % parts == part) {
        let r = std::panic::catch_unwind(|| run_seed(seed, opts));
        match r {
            Ok(Ok(o)) => {
                if o.frames > 100_000 && std::env::var("URNIC_SIM_VERBOSE").is_ok() {
                    eprintln!("seed {seed}: {} frames", o.frames);
                }
                frames += o.frames;
                failed_sides += o.errors;
                strikes.extend(o.strikes);
            }
            Ok(Err(e)) if keep_going => {
                let first = e.lines().next().unwrap_or("").to_string();
                eprintln!("seed {seed} failed: {first}");
                failures.push((seed, first));
            }
            Ok(Err(e)) => panic!("seed {seed} failed: {e}\n{}", replay(seed)),
            Err(p) => {
                eprintln!("seed {seed} panicked\n{}", replay(seed));
                std::panic::resume_unwind(p);
            }
        }
        count += 1;
    }
    eprintln!("part {part}: {count} seeds, {frames} frames, {failed_sides} QPs gave up (severe loss), {:?}", start.elapsed());
    if opts.adversary {
        report_strikes(&format!("part {part}"), &strikes);
    }
    if !failures.is_empty() {
        let list: Vec<String> = failures.iter().map(|(s, e)| format!("  seed {s}: {e}")).collect();
        panic!("{} of {count} seeds failed:\n{}", failures.len(), list.join("\n"));
    }
}

/// One line per attack class and what its frames were counted as.
fn report_strikes(what: &str, strikes: &[Strike]) {
    if strikes.is_empty() {
        return;
    }
    let mut by: BTreeMap<(&str, String), u64> = BTreeMap::new();
    for s in strikes {
        *by.entry((s.attack.name(), s.counted_as())).or_insert(0) += 1;
    }
    let busy = strikes.iter().filter(|s| s.busy).count();
    eprintln!("{what}: {} forged frames, {busy} of them while traffic was pending", strikes.len());
    if std::env::var("URNIC_SIM_VERBOSE").is_ok() {
        for ((a, c), n) in by {
            eprintln!("  {n:>6} {a}: {c}");
        }
    }
}

#[test]
fn random_mix_0() {
    run_seeds(&RANDOM_MIX, 0, 2);
}

#[test]
fn random_mix_1() {
    run_seeds(&RANDOM_MIX, 1, 2);
}

/// The random mixes with a third host on the segment injecting forged
/// frames (every model-safe class of `sim::forge`: strangers' requests,
/// responses and CNPs; spoofed requests far behind or ahead of the window;
/// spoofed stale and ghost responses; copies of sniffed sequence NAKs):
/// every WR still completes exactly once as predicted, all memory equals
/// the model, and every forged frame was counted as its class says.
/// `URNIC_SIM_ADV_SEEDS=N` (default 60), `URNIC_SIM_ADV_SEED=S`.
#[test]
fn adversarial_mix_0() {
    run_seeds(&ADVERSARIAL_MIX, 0, 2);
}

#[test]
fn adversarial_mix_1() {
    run_seeds(&ADVERSARIAL_MIX, 1, 2);
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
        f.net
            .node_mut(a)
            .post_send(
                qa,
                SendWr {
                    wr_id: i as u64,
                    op: SendOp::Send,
                    payload: Payload::Sgl(if len == 0 { vec![] } else { vec![sge] }),
                    flags: SendFlags::SIGNALED,
                    ud: None,
                },
            )
            .unwrap();
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
        f.net
            .node_mut(a)
            .post_send(
                qa,
                SendWr { wr_id: i, op: SendOp::Send, payload: Payload::Inline(data), flags: SendFlags::SIGNALED | SendFlags::INLINE, ud: None },
            )
            .unwrap();
    }
    assert_eq!(f.net.run_until(Instant::ZERO + Duration::from_secs(10)), RunOutcome::Idle);
    let got: Vec<_> = drain(&mut f.net, a).iter().map(|c| (c.wc.wr_id, c.wc.status)).collect();
    assert_eq!(got, vec![(0, WcStatus::RnrRetryExcErr), (1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr), (3, WcStatus::WrFlushErr)]);
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
        f.net
            .node_mut(a)
            .post_send(qa, SendWr { wr_id: i, op: SendOp::Write { remote }, payload: Payload::Sgl(vec![sge]), flags: SendFlags::SIGNALED, ud: None })
            .unwrap();
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

// ---------------------------------------------------------------- double execution

/// The first seed (from 0) whose plan, with generations, has two WRs on the
/// same requester side and QP whose destinations start at the same byte and
/// that `pick` accepts: `(seed, earlier, later)` as indices into `plan.wrs`.
fn seed_with_shared_pair(pick: impl Fn(&Plan, &PlannedWr, &PlannedWr) -> bool) -> (u64, usize, usize) {
    for seed in 0..1000 {
        let (plan, _mem) = plan(seed, true);
        if plan.links.iter().any(|l| l.faults.loss >= SEVERE_LOSS) {
            continue;
        }
        for (i, a) in plan.wrs.iter().enumerate() {
            for (j, b) in plan.wrs.iter().enumerate().skip(i + 1) {
                if a.side == b.side && a.qp == b.qp && pick(&plan, a, b) {
                    return (seed, i, j);
                }
            }
        }
    }
    panic!("no seed below 1000 has such a pair");
}

fn first_place(e: &Effect) -> Option<Region> {
    match e {
        Effect::Write { target, .. } => Some(*target),
        Effect::Read { dest, .. } => dest.first().copied(),
        _ => None,
    }
}

fn same_start(a: &PlannedWr, b: &PlannedWr) -> bool {
    match (first_place(&a.effect), first_place(&b.effect)) {
        (Some(x), Some(y)) => x.len > 0 && y.len > 0 && x.mr == y.mr && x.off == y.off,
        _ => false,
    }
}

/// After the run, the segment replays the WRITE ONLY frame of `plan.wrs[i]`
/// at the responder's expected PSN, from the requester's address: the one
/// attack an unauthenticated transport cannot refuse (`Attack::PeerWriteInWindow`,
/// as with rxe and ConnectX). The responder executes the WRITE a second
/// time. Returns the responder's `resp_messages` change (1: executed).
fn replay_write(idle: &mut Idle<'_>, i: usize) -> Result<u64, String> {
    let w = &idle.plan.wrs[i];
    let Effect::Write { target, data } = &w.effect else { return Err("not a WRITE".into()) };
    let (s, r) = (w.side, 1 - w.side);
    let va = idle.mem[r].va(target);
    let frame = idle
        .writes
        .iter()
        .find(|(from, f)| {
            *from == idle.nodes[s].0 && parse_frame(f).is_ok_and(|p| p.repr.transport.reth.is_some_and(|x| x.va == va) && p.payload == &data[..])
        })
        .map(|(_, f)| f.clone())
        .ok_or("the WRITE's frame was not captured")?;
    let (node, qpn) = (idle.nodes[r], idle.plan.pairs[w.qp].qpn[r]);
    let rq_psn = idle.net.node(node).query_qp(qpn).map_err(|e| format!("{e:?}"))?.rq_psn;
    let mut replayed = Vec::new();
    rocev2::sim::forge::replay_at(&frame, rq_psn, &mut replayed).map_err(|e| e.to_string())?;
    let before = idle.net.node(node).qp_stats(qpn).map_or(0, |q| q.resp_messages);
    idle.net.inject(node, &replayed);
    let after = idle.net.node(node).qp_stats(qpn).map_or(0, |q| q.resp_messages);
    ensure!(idle.net.run_until(Instant::ZERO + Duration::from_secs(700)) == RunOutcome::Idle, "not idle after the replay");
    Ok(after - before)
}

#[test]
fn generations_catch_a_write_executed_twice() {
    // Two WRITEs of one requester to the same place, the older a WRITE ONLY.
    let (seed, i, j) = seed_with_shared_pair(|plan, a, b| {
        let mtu = plan.pairs[a.qp].params[0].mtu.bytes() as usize;
        a.kind == Kind::Write
            && (1..=mtu).contains(&(a.wr.payload.len() as usize))
            && matches!(b.kind, Kind::Write | Kind::WriteImm)
            && same_start(a, b)
    });
    let opts = RunOpts { capture_writes: true, ..RunOpts::mix() };
    let mut executed = 0;
    let run = |generations: bool, executed: &mut u64| {
        run_seed_with(seed, RunOpts { generations, ..opts }, &mut |idle| {
            *executed = replay_write(idle, i)?;
            Ok(())
        })
    };
    // With generations: the replayed older WRITE lands over the newer one's
    // data, and the check names it.
    let err = run(true, &mut executed).err().unwrap_or_else(|| panic!("seed {seed}: the double execution went unnoticed"));
    assert_eq!(executed, 1, "seed {seed}: the replay was not executed");
    let (wi, wj) = (seed_wr_id(seed, i), seed_wr_id(seed, j));
    eprintln!("seed {seed}, wrs {wi} then {wj}: {}", err.lines().next().unwrap_or(""));
    assert!(err.contains(&format!("matches the data of wr {wi}")), "seed {seed} (wrs {wi}, {wj}): {err}");
    // Without (every WRITE its own place, the model before generations): the
    // same double execution rewrites identical bytes and passes the check.
    executed = 0;
    let without = run(false, &mut executed);
    assert_eq!(executed, 1, "seed {seed}: the replay was not executed");
    assert!(without.is_ok(), "seed {seed}: {:?}", without.err());
}

fn seed_wr_id(seed: u64, i: usize) -> u64 {
    plan(seed, true).0.wrs[i].wr.wr_id
}

#[test]
fn generations_catch_a_read_placed_twice() {
    // Two READs of one requester into the same place.
    let (seed, i, j) = seed_with_shared_pair(|_, a, b| a.kind == Kind::Read && b.kind == Kind::Read && same_start(a, b));
    // After the run, READ i's data is placed a second time, as a requester
    // that accepted a stale copy of its READ response would (rule 2 of issue
    // 14 keeps urnic from it; the doctored memory stands for such a bug).
    let place_again = |idle: &mut Idle<'_>| {
        let w = &idle.plan.wrs[i];
        let Effect::Read { dest, data } = &w.effect else { return Err("not a READ".to_string()) };
        idle.mem[w.side].doctor(dest, data);
        Ok(())
    };
    let err = run_seed_with(seed, RunOpts::mix(), &mut { place_again })
        .err()
        .unwrap_or_else(|| panic!("seed {seed}: the READ placed twice went unnoticed"));
    let (wi, wj) = (seed_wr_id(seed, i), seed_wr_id(seed, j));
    eprintln!("seed {seed}, wrs {wi} then {wj}: {}", err.lines().next().unwrap_or(""));
    assert!(err.contains(&format!("matches the data of wr {wi}")), "seed {seed} (wrs {wi}, {wj}): {err}");
    // Without generations each READ has its own place: placing READ i again
    // writes the same bytes and the old check passes.
    let without = run_seed_with(seed, RunOpts { generations: false, ..RunOpts::mix() }, &mut { place_again });
    assert!(without.is_ok(), "seed {seed}: {:?}", without.err());
}

/// The documented limit (issue 14): a frame with the peer's address and a
/// PSN inside the window is indistinguishable from the peer's own, so the
/// receiver acts on it, as rxe and ConnectX do. A forged WRITE is executed;
/// a forged error NAK for an outstanding PSN fails the WR and the QP. The
/// adversarial mixes leave these two classes out (`Attack::model_safe`).
#[test]
fn documented_limit_peer_address_and_window() {
    use rocev2::sim::forge::{forge, Attack, Expect, VictimView};
    let params = RcParams { timeout: 14, ..RcParams::default() };
    let mut f = fixture(11, 1, params, LinkConfig::ideal(Duration::from_micros(5)), |_, _, _| {});
    let [a, b] = f.nodes;
    let [qa, qb] = f.qpn[0];
    let (ha, hb) = (Station::from(&HostAddr::ipv4(1)), Station::from(&HostAddr::ipv4(2)));
    let attacker = Station::from(&HostAddr::ipv4(66));
    assert_eq!(Attack::PeerWriteInWindow.expect(), Expect::Accepted);
    assert_eq!(Attack::PeerErrorNakOutstanding.expect(), Expect::Accepted);
    // A WRITE that B did not ask for lands in B's memory.
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let place = f.mem[1].alloc(&mut rng, 256);
    let (rkey, va) = (f.mem[1].mrs[0].key, f.mem[1].va(&place));
    let view = |net: &Network<Engine>, victim: NodeId, qpn: u32, peer_qpn: u32, me: Station, peer: Station| {
        let q = net.node(victim).query_qp(qpn).expect("query");
        VictimView { victim: me, peer, qpn, peer_qpn, rq_psn: q.rq_psn, sq_psn: q.sq_psn, una: q.sq_psn, rkey, va }
    };
    let v = view(&f.net, b, qb, qa, hb, ha);
    let mut frame = Vec::new();
    forge(Attack::PeerWriteInWindow, &v, &attacker, 7, &mut frame).expect("forge");
    let before = f.mem[1].mrs[0].bytes()[place.off..place.off + place.len].to_vec();
    f.net.inject(b, &frame);
    let p = parse_frame(&frame).expect("parse");
    let after = &f.mem[1].mrs[0].bytes()[place.off..place.off + p.payload.len()];
    assert_eq!(after, p.payload, "the forged WRITE was executed");
    assert_ne!(&before[..p.payload.len()], p.payload);
    assert_eq!(f.net.node(b).qp_stats(qb).unwrap().resp_messages, 1);
    // An error NAK for A's outstanding WRITE fails it, and the QP.
    let src = f.mem[0].alloc(&mut rng, 64 * 1024);
    let dst = f.mem[1].alloc(&mut rng, 64 * 1024);
    let remote = RemoteAddr { addr: f.mem[1].va(&dst), rkey };
    let sge = f.mem[0].sge(&src);
    let una = f.net.node(a).query_qp(qa).unwrap().sq_psn;
    let wr = SendWr { wr_id: 9, op: SendOp::Write { remote }, payload: Payload::Sgl(vec![sge]), flags: SendFlags::SIGNALED, ud: None };
    f.net.node_mut(a).post_send(qa, wr).unwrap();
    f.net.transmit();
    let v = VictimView { una, ..view(&f.net, a, qa, qb, ha, hb) };
    frame.clear();
    forge(Attack::PeerErrorNakOutstanding, &v, &attacker, 8, &mut frame).expect("forge");
    f.net.inject(a, &frame);
    assert_eq!(f.net.node(a).qp_state(qa).unwrap(), QpState::Err);
    let c = f.net.node_mut(a).poll_completion().expect("a completion");
    assert_eq!((c.wc.wr_id, c.wc.status), (9, WcStatus::RemAccessErr));
}
