//! Structured fuzzing of [`Engine::handle_frame`] (fuzz target `engine_frames`).
//!
//! Every input builds two engines, A and B, each with one "main" QP (RC, UC
//! or UD, chosen by the input) connected to the other, plus an "idle" RC QP
//! left in INIT. Traffic is posted and partly exchanged over two in-memory
//! links, and frames forged from the input's bytes are injected between the
//! real exchange steps, so they land while requests, responses, retries and
//! RNR waits are under way. Forged frames are always well formed (correct
//! lengths, pad count and ICRC; only an unknown opcode byte makes one that
//! the parser refuses), so what gets fuzzed is the transport state machine,
//! not the ICRC check.
//!
//! # Invariants (checked after every step; a violation panics with a message)
//!
//! - no panic inside the engine;
//! - no byte outside a registered region is written: every region sits
//!   between 256-byte guard areas filled with a pattern; regions nothing may
//!   write (REMOTE_READ only without LOCAL_WRITE; another PD's region) keep
//!   their contents; the remote-access region keeps its contents while the
//!   QPs grant neither REMOTE_WRITE nor REMOTE_ATOMIC (or are UD);
//! - QP states move only along edges an unsolicited frame may cause: a QP
//!   reaches ERR only from RTR/RTS/SQD/SQE and only with an
//!   `IBV_EVENT_QP_FATAL`; nothing leaves ERR; RESET/INIT/RTR/RTS/SQD never
//!   appear except through the harness's own `modify_qp` calls;
//! - every posted WR completes at most once, on the QP it was posted to, as
//!   a send or a receive as posted; an unsignaled WR never completes
//!   successfully; after the final move of every QP to ERR each signaled WR
//!   and each receive WR has completed exactly once;
//! - engines emit only frames that parse;
//! - a response for a PSN at or after the requester's next PSN (never sent)
//!   changes neither the QP's state nor produces a completion;
//! - the transport rules of issue 14 (rocev2 commit 1012030): a frame
//!   for an RC/UC QP whose IP source is not the QP's peer or whose IP
//!   destination is not the QP's own address changes nothing (state,
//!   completions, events, memory, QP counters other than drops); any
//!   response while the RC QP has nothing outstanding changes nothing; no
//!   frame invalidates an ordinary MR;
//! - a frame with a bad ICRC changes nothing (state, completions, events,
//!   QP counters, engine counters but one bad-ICRC drop) and no memory
//!   outside the remote-write region: an RDMA WRITE's continuation is
//!   placed as its ICRC is checked (`responder/placed.rs`), so its bytes
//!   may land in the part of that WRITE's range not written yet.
//!
//! # Input format
//!
//! Bytes are read in order; a read past the end yields 0, and 0 is the
//! ordinary choice everywhere (real QPN, peer address, P_Key 0xffff, ...).
//! Multi-byte values are big-endian. `fuzz/seeds/engine_frames.py` writes
//! seeds in this format; keep the two in step.
//!
//! Setup, 7 bytes:
//! - `s0`: QP type `(s0 & 0x3f) % 3` (RC, UC, UD); bit 7: IPv6 hosts.
//! - `s1`: path MTU `[1024, 256, 512, 4096][s1 & 3]`; local ACK timeout
//!   exponent `8 + (s1 >> 2 & 7)`; retry_cnt `7 - (s1 >> 5 & 7)`.
//! - `s2`: rnr_retry `7 - (s2 & 7)`; min_rnr_timer `1 ^ (s2 >> 3 & 31)`.
//! - `s3`: max_rd_atomic `4 - (s3 & 3)`; max_dest_rd_atomic `4 - (s3 >> 2 & 3)`;
//!   bits 4, 5, 6 withdraw REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC from
//!   both QPs; bit 7: `sq_sig_all` off.
//! - `s4`: first PSN of A `[100, 0xfffff0, 0, 0x7ffffe][s4 & 3]`, of B
//!   `[5000, 0xfffffd, 0, 0x800001][s4 >> 2 & 3]`.
//! - `s5`: receives posted on B `(s5 & 7) ^ 4`, on A `(s5 >> 3 & 3) ^ 2`.
//! - `s6`: `s6 & 7` work requests follow (5 bytes each, see below).
//!
//! Work request, 5 bytes `w0 len:u16 w3 w4`: `w0` bit 7 B posts (else A);
//! operation `w0 & 7` from `[SEND, SEND_IMM, WRITE, WRITE_IMM, READ,
//! CMP_SWAP, FETCH_ADD, SEND_INV]` (folded onto what the QP type allows);
//! length `len % 12289` (UD: at most the MTU; atomics 8); `w3` bit 0
//! unsignaled (when `sq_sig_all` is off), bit 1 solicited, bit 2 fence, bit
//! 3 inline (SEND/WRITE up to 64 bytes), bits 4-5 remote region `[rw, ro,
//! stale key, other PD]` (UD: bit 4 wrong Q_Key), bits 6-7 local buffer
//! `[local region, read-only region, bad lkey, two SGEs]`; `w4 * 8` is the
//! offset into both regions.
//!
//! Then steps, until the input ends (at most 128): one byte `o`, `o % 32`:
//! 0-2 deliver the next A→B frame, 3-5 the next B→A frame, 6/7 drop the
//! next A→B/B→A frame, 8/9 deliver it but keep it queued (a duplicate),
//! 10 pump both ways until quiet, 11 fire the next timer, 12 advance time
//! (`[1µs, 10µs, 100µs, 1ms, 10ms, 100ms, 1s][b % 7]`, one byte), 13 post a
//! work request (5 bytes as above), 14 post a receive (one byte `v`: bit 0
//! on A, else B; `v >> 1 & 3` → `[4 KiB, 4 KiB, v >> 3 bytes, read-only
//! region]`), 15 move a main QP to SQD or back to RTS (one byte: bit 0 side,
//! bit 1 back to RTS), 16-27 inject a forged frame, 28-31 inject a mutated
//! copy of the next queued real frame.
//!
//! Forged frame: `f0` bit 0 target A (else B); `f1 f2` opcode: `f1 & 7` in
//! 0..=4 → the target QP's own service `list[f2 % n]`, 5 → any known opcode,
//! 6 → CNP, 7 → the raw byte `f2`; `f3` destination QP: `f3 & 15` in 0..=9 →
//! the target's main QP, 10 its idle QP, 11 the other engine's main QPN,
//! 12 main ± 1, 13 QPN 0/1, 14 0xffffff, 15 → a u24 follows; `f4` PSN base
//! `[expected request PSN, next send PSN, u24 follows, last PSN delivered
//! to the target][f4 & 3]` plus `f5` as a signed delta; `f6` flags: bit 0
//! AckReq, 1 SE, 2 MigReq, 3 FECN, 4 BECN, bits 5-6 ECN `[ECT(0), CE,
//! not-ECT, ECT(1)]`, bit 7 VLAN tag; `f7`: P_Key `[0xffff, 0xffff, 0x7fff,
//! u16 follows][f7 & 3]`, source `f7 >> 2 & 7` (0..=4 the peer, 5 a
//! stranger, 6 a stranger of the other IP family, 7 the target itself),
//! destination `f7 >> 5 & 3` (0..=2 the target, 3 the peer), bit 7 a UDP
//! source port u16 follows. Then the extension headers the opcode carries,
//! in wire order: DETH `d0` (Q_Key `[right, right, right ^ 1, u32
//! follows][d0 & 3]`, bit 2 sets the Q_Key's top bit, bit 3 a u24 source QP
//! follows, else the peer's QPN); RETH and AtomicETH a region reference
//! (`r0`: region `[rw, ro, other PD, local][r0 & 3]`, key `[its key, its
//! key, key byte + 1, u32 follows][r0 >> 2 & 3]`, bit 4 from the region's
//! end, then an i16 offset) and for RETH `l0` (DMA length `[u8 follows,
//! the payload length, the region length, u32 follows][l0 & 3]`), for
//! AtomicETH two bytes swap/add and compare; AETH syndrome byte, then `m`
//! (MSN `m`, or a u24 follows when bit 7 is set); AtomicAckETH one byte;
//! ImmDt one byte; IETH a region reference as above (its key). Last the
//! payload: `p0 p1 p2`, length `[0, p1, MTU, MTU - p1 % 4, MTU + 1 + p1 %
//! 8, u16 % 4200 follows, 8, p1 & 63][p0 & 7]` (0 when the opcode carries
//! none), bytes a pattern seeded by `p2`.
//!
//! Mutation: `m0 m1`: `m0` bit 0 the B→A link (else A→B), bit 1 keep the
//! original queued, `m0 >> 2 & 7` what changes: PSN by `m1` as i8, opcode
//! (same service `list[m1 % n]`), destination QP (`m1` as `f3` above), AETH
//! syndrome `m1`, RETH va/rkey/length, payload length, source IP (a
//! stranger), flags and P_Key; `m0` bit 5: then one bit of the frame's
//! last byte before the ICRC flipped (`m1 & 7`), the ICRC left as it was.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::reader::Reader;
use rocev2::psn::Psn;
use rocev2::time::Instant;
use rocev2::transport::attr::{AddressVector, Mtu, QpAttr, QpAttrMask, QpCaps, QpInitAttr, QpState, QpType};
use rocev2::transport::engine::{AsyncEvent, Engine, EngineConfig};
use rocev2::transport::memory::{Access, MemoryTable, PdId};
use rocev2::transport::path::PathHeaders;
use rocev2::transport::stats::QpStats;
use rocev2::transport::wr::{CqId, Payload, RecvWr, RemoteAddr, SendFlags, SendOp, SendWr, Sge, UdDest, WcOpcode, WcStatus};
use rocev2::wire::BthRepr;
use rocev2::wire::{icrc, parse_frame, AckSyndrome, AethRepr, AtomicEthRepr, DethRepr, IpRepr, Opcode, RethRepr, Service, TransportRepr, VlanTag};

/// Most steps taken from one input.
pub const MAX_STEPS: usize = 128;
const PD: PdId = PdId(1);
const PD_OTHER: PdId = PdId(2);
const GUARD: usize = 256;
const QKEY: u32 = 0x1111_1111;
/// Frames a link holds; more are dropped, as a full switch queue would.
const LINK_CAP: usize = 1024;
/// Frames taken from one engine per `fill` (bounds a step's work).
const FILL_MAX: usize = 64;
const BUF: usize = 10_000;

/// Region roles, the index into `Host::regions`.
const RW: usize = 0;
const RO: usize = 1;
const FOREIGN: usize = 2;
const LOCAL: usize = 3;
const REGION_LEN: [usize; 4] = [16384, 4096, 4096, 16384];

const RC_OPS: [u8; 23] =
    [0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10, 0x11, 0x12, 0x13, 0x14, 0x16, 0x17];
const UC_OPS: [u8; 12] = [0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28, 0x29, 0x2a, 0x2b];
const UD_OPS: [u8; 2] = [0x64, 0x65];

fn own_ops(ty: QpType) -> &'static [u8] {
    match ty {
        QpType::Rc => &RC_OPS,
        QpType::Uc => &UC_OPS,
        QpType::Ud => &UD_OPS,
    }
}

fn any_known_op(i: u8) -> Opcode {
    let n = RC_OPS.len() + UC_OPS.len() + UD_OPS.len() + 1;
    let i = usize::from(i) % n;
    Opcode(if i < RC_OPS.len() {
        RC_OPS[i]
    } else if i < RC_OPS.len() + UC_OPS.len() {
        UC_OPS[i - RC_OPS.len()]
    } else if i < n - 1 {
        UD_OPS[i - RC_OPS.len() - UC_OPS.len()]
    } else {
        Opcode::CNP.0
    })
}

fn guard_byte(i: usize) -> u8 {
    0xa5 ^ (i as u8).wrapping_mul(13)
}

fn fill_byte(seed: u8, i: usize) -> u8 {
    (i as u8).wrapping_mul(7).wrapping_add(seed) ^ ((i >> 8) as u8)
}

/// The initial contents of a region's allocation (guards and fill), built
/// once per (host, region): regions are copied from it and compared with it
/// by `memcmp`, which keeps the checks cheap under coverage instrumentation.
fn template(host: usize, k: usize) -> &'static [u8] {
    static T: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    let all = T.get_or_init(|| {
        (0..8)
            .map(|n| {
                let (h, k) = (n / 4, n % 4);
                let len = REGION_LEN[k];
                let seed = (h as u8).wrapping_mul(16).wrapping_add(k as u8);
                (0..len + 2 * GUARD).map(|i| if (GUARD..GUARD + len).contains(&i) { fill_byte(seed, i - GUARD) } else { guard_byte(i) }).collect()
            })
            .collect()
    });
    &all[host * 4 + k]
}

/// A registered region inside a larger allocation: `GUARD` pattern bytes,
/// the region, `GUARD` pattern bytes.
struct Region {
    buf: Box<[u8]>,
    template: &'static [u8],
    len: usize,
    iova: u64,
    key: u32,
    pd: PdId,
    access: Access,
}

impl Region {
    fn new(host: usize, k: usize, iova: u64, pd: PdId, access: Access) -> Region {
        let template = template(host, k);
        Region { buf: template.into(), template, len: REGION_LEN[k], iova, key: 0, pd, access }
    }
    /// Offset (relative to the region start) of the first guard byte changed.
    fn bad_guard(&self) -> Option<isize> {
        let end = GUARD + self.len;
        let (b, t) = (&self.buf, self.template);
        if b[..GUARD] == t[..GUARD] && b[end..] == t[end..] {
            return None;
        }
        (0..GUARD).chain(end..end + GUARD).find(|&i| b[i] != t[i]).map(|i| i as isize - GUARD as isize)
    }
    /// Offset of the first byte that differs from the initial fill.
    fn changed_at(&self) -> Option<usize> {
        let r = GUARD..GUARD + self.len;
        let (b, t) = (&self.buf[r.clone()], &self.template[r]);
        if b == t {
            return None;
        }
        b.iter().zip(t).position(|(x, y)| x != y)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Addr {
    mac: [u8; 6],
    gid: [u8; 16],
}

fn v4_gid(n: u8) -> [u8; 16] {
    AddressVector::ipv4_gid([10, 0, 0, n])
}

fn v6_gid(n: u8) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0] = 0xfd;
    g[15] = n;
    g
}

fn path(from: &Addr, to: &Addr) -> AddressVector {
    AddressVector {
        dmac: to.mac,
        smac: from.mac,
        vlan: None,
        sgid: from.gid,
        dgid: to.gid,
        traffic_class: 0,
        hop_limit: 64,
        flow_label: 0,
        udp_sport: None,
    }
}

fn ip_gids(ip: &IpRepr) -> ([u8; 16], [u8; 16]) {
    match ip {
        IpRepr::V4(v4) => (AddressVector::ipv4_gid(v4.src), AddressVector::ipv4_gid(v4.dst)),
        IpRepr::V6(v6) => (v6.src, v6.dst),
    }
}

#[derive(Debug)]
struct WrRec {
    qpn: u32,
    recv: bool,
    signaled: bool,
    completions: u32,
}

struct Host {
    name: &'static str,
    /// Declared before `regions`: dropped first, while the memory it points
    /// into is still there.
    engine: Engine,
    memory: Arc<MemoryTable>,
    regions: Vec<Region>,
    addr: Addr,
    qpn: u32,
    idle_qpn: u32,
    wrs: BTreeMap<u64, WrRec>,
    states: BTreeMap<u32, QpState>,
    /// An unsignaled send was posted on the main QP (its successful
    /// completion is invisible, so "all sends completed" cannot be known).
    unsignaled_posted: bool,
}

impl Host {
    fn region_ref(&self, r: &mut Reader) -> (u64, u32, usize) {
        let r0 = r.u8();
        let reg = &self.regions[usize::from(r0 & 3)];
        let key = match (r0 >> 2) & 3 {
            0 | 1 => reg.key,
            2 => (reg.key & !0xff) | (reg.key.wrapping_add(1) & 0xff),
            _ => r.u32(),
        };
        let base = if r0 & 0x10 != 0 { reg.iova + reg.len as u64 } else { reg.iova };
        let off = r.u16() as i16;
        (base.wrapping_add(off as i64 as u64), key, reg.len)
    }

    fn pending_sends(&self) -> usize {
        self.wrs.values().filter(|w| w.qpn == self.qpn && !w.recv && w.completions == 0).count()
    }

    fn snapshot(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.regions.iter().map(|r| r.buf.len()).sum());
        for r in &self.regions {
            v.extend_from_slice(&r.buf);
        }
        v
    }

    fn qp_stats(&self) -> Vec<(u32, QpStats)> {
        self.states.keys().map(|&q| (q, *self.engine.qp_stats(q).expect("QP exists"))).collect()
    }
}

/// What a step did, for the messages of failed checks.
#[derive(Clone, Debug)]
struct Ctx {
    input_step: usize,
    what: String,
}

impl std::fmt::Display for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "step {} ({})", self.input_step, self.what)
    }
}

struct World {
    hosts: [Host; 2],
    /// `links[0]`: A→B, `links[1]`: B→A.
    links: [VecDeque<Vec<u8>>; 2],
    now: Instant,
    ty: QpType,
    mtu: Mtu,
    /// Remote access the QPs grant.
    access: Access,
    sig_all: bool,
    v6: bool,
    next_wr_id: u64,
    /// The PSN of the last real frame delivered to each host.
    last_psn: [Option<Psn>; 2],
    buf: Vec<u8>,
}

fn caps() -> QpCaps {
    QpCaps { max_send_wr: 32, max_recv_wr: 32, max_send_sge: 2, max_recv_sge: 2, max_inline_data: 64 }
}

/// The engine's memory table: keys from a fixed seed, so an input replays
/// the same way (`MemoryTable::new` draws its key bytes from the OS).
fn new_memory(seed: u64) -> Arc<MemoryTable> {
    Arc::new(MemoryTable::with_seed(seed))
}

impl World {
    fn new(r: &mut Reader) -> World {
        let s0 = r.u8();
        let ty = [QpType::Rc, QpType::Uc, QpType::Ud][usize::from(s0 & 0x3f) % 3];
        let v6 = s0 & 0x80 != 0;
        let s1 = r.u8();
        let mtu = [Mtu::Mtu1024, Mtu::Mtu256, Mtu::Mtu512, Mtu::Mtu4096][usize::from(s1 & 3)];
        let timeout = 8 + ((s1 >> 2) & 7);
        let retry_cnt = 7 - ((s1 >> 5) & 7);
        let s2 = r.u8();
        let rnr_retry = 7 - (s2 & 7);
        let min_rnr_timer = 1 ^ ((s2 >> 3) & 31);
        let s3 = r.u8();
        let max_rd_atomic = 4 - (s3 & 3);
        let max_dest_rd_atomic = 4 - ((s3 >> 2) & 3);
        let mut access = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        for (bit, a) in [(0x10, Access::REMOTE_WRITE), (0x20, Access::REMOTE_READ), (0x40, Access::REMOTE_ATOMIC)] {
            if s3 & bit != 0 {
                access.remove(a);
            }
        }
        let sig_all = s3 & 0x80 == 0;
        let s4 = r.u8();
        let psn = [[100, 0xfffff0, 0, 0x7ffffe][usize::from(s4 & 3)], [5000, 0xfffffd, 0, 0x800001][usize::from((s4 >> 2) & 3)]];
        let s5 = r.u8();
        let recvs = [((s5 >> 3) & 3) ^ 2, (s5 & 7) ^ 4];
        let s6 = r.u8();
        let n_wrs = s6 & 7;
        trace!("setup {ty:?} v6={v6} mtu={mtu:?} timeout={timeout} retry={retry_cnt} rnr_retry={rnr_retry} min_rnr={min_rnr_timer} rd_atomic={max_rd_atomic}/{max_dest_rd_atomic} access={access:?} sig_all={sig_all} psn={psn:x?} recvs={recvs:?} wrs={n_wrs}");

        let mk_host = |i: u8, name: &'static str| -> Host {
            let memory = new_memory(0x5eed_0000 + u64::from(i));
            let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
            let specs = [(PD, all), (PD, Access::REMOTE_READ), (PD_OTHER, all), (PD, Access::LOCAL_WRITE)];
            let mut regions = Vec::new();
            for (k, (pd, acc)) in specs.into_iter().enumerate() {
                let iova = (u64::from(i) << 36) + ((k as u64 + 1) << 24);
                let mut reg = Region::new(usize::from(i), k, iova, pd, acc);
                // SAFETY: the region's buffer lives in `Host::regions` beside
                // the engine, which is dropped first; the box never moves.
                let keys = unsafe { memory.register(pd, reg.buf[GUARD..].as_mut_ptr(), reg.len, iova, acc) }.expect("register a region");
                reg.key = keys.lkey;
                regions.push(reg);
            }
            let engine = Engine::new(EngineConfig { first_qpn: 0x11 + 0x40 * u32::from(i), ..EngineConfig::default() }, memory.clone());
            let gid = if v6 { v6_gid(i + 1) } else { v4_gid(i + 1) };
            Host {
                name,
                engine,
                memory,
                regions,
                addr: Addr { mac: [2, 0, 0, 0, 0, i + 1], gid },
                qpn: 0,
                idle_qpn: 0,
                wrs: BTreeMap::new(),
                states: BTreeMap::new(),
                unsignaled_posted: false,
            }
        };
        let mut hosts = [mk_host(0, "A"), mk_host(1, "B")];
        for h in hosts.iter_mut() {
            let init = QpInitAttr { qp_type: ty, pd: PD, send_cq: CqId(1), recv_cq: CqId(2), srq: None, cap: caps(), sq_sig_all: sig_all };
            h.qpn = h.engine.create_qp(&init).expect("create the main QP");
            let idle = QpInitAttr { qp_type: QpType::Rc, ..init };
            h.idle_qpn = h.engine.create_qp(&idle).expect("create the idle QP");
        }
        for i in 0..2 {
            let j = 1 - i;
            let (peer_qpn, peer_addr) = (hosts[j].qpn, hosts[j].addr);
            let h = &mut hosts[i];
            let e = &mut h.engine;
            let mut a = QpAttr { qp_state: QpState::Init, qp_access_flags: access, qkey: QKEY, ..QpAttr::default() };
            let m = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
            e.modify_qp(h.idle_qpn, &a, m | QpAttrMask::ACCESS_FLAGS).expect("idle QP to INIT");
            match ty {
                QpType::Ud => {
                    e.modify_qp(h.qpn, &a, m | QpAttrMask::QKEY).expect("UD INIT");
                    a.qp_state = QpState::Rtr;
                    e.modify_qp(h.qpn, &a, QpAttrMask::STATE).expect("UD RTR");
                    a.qp_state = QpState::Rts;
                    a.sq_psn = Psn::new(psn[i]);
                    e.modify_qp(h.qpn, &a, QpAttrMask::STATE | QpAttrMask::SQ_PSN).expect("UD RTS");
                }
                QpType::Rc | QpType::Uc => {
                    let rc = ty == QpType::Rc;
                    e.modify_qp(h.qpn, &a, m | QpAttrMask::ACCESS_FLAGS).expect("INIT");
                    a.qp_state = QpState::Rtr;
                    a.path_mtu = mtu;
                    a.dest_qp_num = peer_qpn;
                    a.rq_psn = Psn::new(psn[j]);
                    a.max_dest_rd_atomic = max_dest_rd_atomic;
                    a.min_rnr_timer = min_rnr_timer;
                    a.ah_attr = Some(path(&h.addr, &peer_addr));
                    let mut m = QpAttrMask::STATE | QpAttrMask::AV | QpAttrMask::PATH_MTU | QpAttrMask::DEST_QPN | QpAttrMask::RQ_PSN;
                    if rc {
                        m |= QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER;
                    }
                    e.modify_qp(h.qpn, &a, m).expect("RTR");
                    a.qp_state = QpState::Rts;
                    a.sq_psn = Psn::new(psn[i]);
                    a.timeout = timeout;
                    a.retry_cnt = retry_cnt;
                    a.rnr_retry = rnr_retry;
                    a.max_rd_atomic = max_rd_atomic;
                    let mut m = QpAttrMask::STATE | QpAttrMask::SQ_PSN;
                    if rc {
                        m |= QpAttrMask::TIMEOUT | QpAttrMask::RETRY_CNT | QpAttrMask::RNR_RETRY | QpAttrMask::MAX_QP_RD_ATOMIC;
                    }
                    e.modify_qp(h.qpn, &a, m).expect("RTS");
                }
            }
            for q in [h.qpn, h.idle_qpn] {
                h.states.insert(q, h.engine.qp_state(q).expect("QP exists"));
            }
        }
        let mut w = World {
            hosts,
            links: [VecDeque::new(), VecDeque::new()],
            now: Instant::ZERO,
            ty,
            mtu,
            access,
            sig_all,
            v6,
            next_wr_id: 1,
            last_psn: [None, None],
            buf: vec![0u8; BUF],
        };
        for (i, &count) in recvs.iter().enumerate() {
            let idle = w.hosts[i].idle_qpn;
            w.post_recv_on(i, idle, 0);
            for k in 0..count {
                let q = w.hosts[i].qpn;
                w.post_recv_on(i, q, k & 1);
            }
        }
        for _ in 0..n_wrs {
            w.post_wr(r);
        }
        w
    }

    /// Post a receive: `v >> 1 & 3` selects the buffer (see the module docs).
    fn post_recv_on(&mut self, side: usize, qpn: u32, v: u8) {
        let id = self.next_wr_id;
        self.next_wr_id += 1;
        let h = &mut self.hosts[side];
        let slot = (id % 4) * 4096;
        let (local, ro) = (&h.regions[LOCAL], &h.regions[RO]);
        let sge = match (v >> 1) & 3 {
            0 | 1 => Sge { addr: local.iova + slot, length: 4096, lkey: local.key },
            2 => Sge { addr: local.iova + slot, length: u32::from(v >> 3), lkey: local.key },
            _ => Sge { addr: ro.iova, length: 4096, lkey: ro.key },
        };
        let wr = RecvWr { wr_id: id, sgl: vec![sge] };
        if h.engine.post_recv(qpn, wr).is_ok() {
            h.wrs.insert(id, WrRec { qpn, recv: true, signaled: true, completions: 0 });
        }
        trace!("  post_recv {} qp {qpn:#x} wr {id} {sge:x?}", h.name);
    }

    /// Read a work request (5 bytes) and post it.
    fn post_wr(&mut self, r: &mut Reader) {
        let w0 = r.u8();
        let len = r.u16();
        let w3 = r.u8();
        let w4 = r.u8();
        let side = usize::from(w0 >> 7);
        let peer = 1 - side;
        let id = self.next_wr_id;
        self.next_wr_id += 1;
        let sel = w0 & 7;
        let off = u64::from(w4) * 8;
        let (remote_reg, peer_qpn, peer_idle, peer_addr) = {
            let p = &self.hosts[peer];
            let reg = match (w3 >> 4) & 3 {
                0 => RemoteAddr { addr: p.regions[RW].iova + off, rkey: p.regions[RW].key },
                1 => RemoteAddr { addr: p.regions[RO].iova + off, rkey: p.regions[RO].key },
                2 => RemoteAddr { addr: p.regions[RW].iova + off, rkey: p.regions[RW].key.wrapping_add(0x101) },
                _ => RemoteAddr { addr: p.regions[FOREIGN].iova + off, rkey: p.regions[FOREIGN].key },
            };
            (reg, p.qpn, p.idle_qpn, p.addr)
        };
        let op = match self.ty {
            QpType::Ud => [SendOp::Send, SendOp::SendWithImm { imm: u32::from(w4) }][usize::from(sel & 1)],
            QpType::Uc => [
                SendOp::Send,
                SendOp::SendWithImm { imm: u32::from(w4) },
                SendOp::Write { remote: remote_reg },
                SendOp::WriteWithImm { remote: remote_reg, imm: u32::from(w4) },
            ][usize::from(sel & 3)],
            QpType::Rc => match sel {
                0 => SendOp::Send,
                1 => SendOp::SendWithImm { imm: u32::from(w4) },
                2 => SendOp::Write { remote: remote_reg },
                3 => SendOp::WriteWithImm { remote: remote_reg, imm: u32::from(w4) },
                4 => SendOp::Read { remote: remote_reg },
                5 => SendOp::CmpSwap { remote: remote_reg, compare: u64::from(w4), swap: 0x1234 },
                6 => SendOp::FetchAdd { remote: remote_reg, add: u64::from(len) },
                _ => SendOp::SendWithInv { rkey: remote_reg.rkey },
            },
        };
        let atomic = matches!(op, SendOp::CmpSwap { .. } | SendOp::FetchAdd { .. });
        let mut len = u32::from(len) % 12289;
        if self.ty == QpType::Ud {
            len %= self.mtu.bytes() + 1;
        }
        if atomic {
            len = 8;
        }
        let h = &self.hosts[side];
        let (local, ro) = (&h.regions[LOCAL], &h.regions[RO]);
        let loff = off % 4096;
        let sgl = match (w3 >> 6) & 3 {
            0 => vec![Sge { addr: local.iova + loff, length: len, lkey: local.key }],
            1 => vec![Sge { addr: ro.iova + loff % 2048, length: len.min(2048), lkey: ro.key }],
            2 => vec![Sge { addr: local.iova + loff, length: len, lkey: local.key ^ 0x8000 }],
            _ => {
                let a = len / 2;
                vec![Sge { addr: local.iova + loff, length: a, lkey: local.key }, Sge { addr: local.iova + 8192, length: len - a, lkey: local.key }]
            }
        };
        let inline_ok = matches!(op, SendOp::Send | SendOp::SendWithImm { .. } | SendOp::Write { .. } | SendOp::WriteWithImm { .. });
        let payload = if w3 & 8 != 0 && inline_ok && len <= 64 {
            Payload::Inline((0..len as usize).map(|i| fill_byte(w4, i)).collect())
        } else {
            Payload::Sgl(sgl)
        };
        let unsignaled = w3 & 1 != 0 && !self.sig_all;
        let mut flags = if unsignaled { SendFlags::empty() } else { SendFlags::SIGNALED };
        if w3 & 2 != 0 {
            flags |= SendFlags::SOLICITED;
        }
        if w3 & 4 != 0 {
            flags |= SendFlags::FENCE;
        }
        if matches!(payload, Payload::Inline(_)) {
            flags |= SendFlags::INLINE;
        }
        let ud = (self.ty == QpType::Ud).then(|| UdDest {
            av: path(&h.addr, &peer_addr),
            remote_qpn: if w4 & 1 != 0 { peer_idle } else { peer_qpn },
            remote_qkey: if w3 & 0x10 != 0 { QKEY ^ 1 } else { QKEY },
        });
        let wr = SendWr { wr_id: id, op, payload, flags, ud };
        let h = &mut self.hosts[side];
        let qpn = h.qpn;
        trace!("  post_send {} wr {id} {:?} len {len} flags {:?}", h.name, wr.op, wr.flags);
        match h.engine.post_send(qpn, wr) {
            Ok(()) => {
                h.wrs.insert(id, WrRec { qpn, recv: false, signaled: !unsignaled, completions: 0 });
                h.unsignaled_posted |= unsignaled;
            }
            Err(e) => trace!("    refused: {e}"),
        }
    }

    /// Move what the engines want to send onto the links.
    fn fill(&mut self) {
        for i in 0..2 {
            for _ in 0..FILL_MAX {
                let Some(len) = self.hosts[i].engine.poll_transmit(self.now, &mut self.buf) else { break };
                let frame = self.buf[..len].to_vec();
                if let Err(e) = parse_frame(&frame) {
                    panic!("host {} emitted a frame that does not parse ({e}): {frame:02x?}", self.hosts[i].name);
                }
                if self.links[i].len() < LINK_CAP {
                    self.links[i].push_back(frame);
                }
            }
        }
    }

    /// Deliver the next frame on `link` (0: A→B, 1: B→A); `keep`: leave it queued.
    fn deliver(&mut self, link: usize, keep: bool) -> bool {
        if self.links[link].is_empty() {
            self.fill();
        }
        let frame = if keep { self.links[link].front().cloned() } else { self.links[link].pop_front() };
        let Some(frame) = frame else { return false };
        let to = 1 - link;
        if let Ok(p) = parse_frame(&frame) {
            self.last_psn[to] = Some(p.repr.transport.bth.psn);
            trace!(
                "  deliver {}→{} {:?} psn {:#x} qp {:#x} len {}",
                self.hosts[link].name,
                self.hosts[to].name,
                p.repr.transport.bth.opcode,
                p.repr.transport.bth.psn.value(),
                p.repr.transport.bth.dest_qp,
                p.payload.len()
            );
        }
        self.hosts[to].engine.handle_frame(self.now, &frame);
        self.now += Duration::from_micros(1);
        true
    }

    fn fire_timers(&mut self) {
        let next = self.hosts.iter().filter_map(|h| h.engine.next_timeout()).min();
        match next {
            Some(t) => self.now = self.now.max(t),
            None => self.now += Duration::from_millis(1),
        }
        trace!("  timers at {:?}", self.now);
        for h in self.hosts.iter_mut() {
            h.engine.handle_timeout(self.now);
        }
    }

    /// Build a forged frame from the input: (target host, frame bytes).
    fn forge(&mut self, r: &mut Reader) -> (usize, Vec<u8>) {
        let f0 = r.u8();
        let t = if f0 & 1 != 0 { 0 } else { 1 };
        let peer = 1 - t;
        let f1 = r.u8();
        let f2 = r.u8();
        let opcode = match f1 & 7 {
            0..=4 => {
                let ops = own_ops(self.ty);
                Opcode(ops[usize::from(f2) % ops.len()])
            }
            5 => any_known_op(f2),
            6 => Opcode::CNP,
            _ => Opcode(f2),
        };
        let f3 = r.u8();
        let dest_qp = self.choose_qpn(t, f3, r);
        let f4 = r.u8();
        let delta = r.u8() as i8;
        let attr = self.hosts[t].engine.query_qp(self.hosts[t].qpn).expect("main QP exists");
        let base = match f4 & 3 {
            0 => attr.rq_psn,
            1 => attr.sq_psn,
            2 => Psn::new(r.u24()),
            _ => self.last_psn[t].unwrap_or(attr.rq_psn),
        };
        let psn = base.add(delta as i32 as u32);
        let f6 = r.u8();
        let f7 = r.u8();
        let pkey = match f7 & 3 {
            0 | 1 => 0xffff,
            2 => 0x7fff,
            _ => r.u16(),
        };
        let (me, them) = (self.hosts[t].addr, self.hosts[peer].addr);
        let other_n = t as u8 + 1;
        let src = match (f7 >> 2) & 7 {
            0..=4 => them.gid,
            5 => {
                if self.v6 {
                    v6_gid(99)
                } else {
                    v4_gid(99)
                }
            }
            6 => {
                if self.v6 {
                    v4_gid(2 - other_n + 1)
                } else {
                    v6_gid(2 - other_n + 1)
                }
            }
            _ => me.gid,
        };
        let dst = if (f7 >> 5) & 3 == 3 { them.gid } else { me.gid };
        let sport = if f7 & 0x80 != 0 { r.u16() } else { 0xc000 | (dest_qp as u16 & 0x3fff) };
        let ecn = [2u8, 3, 0, 1][usize::from((f6 >> 5) & 3)];
        let av = AddressVector {
            dmac: me.mac,
            smac: them.mac,
            vlan: (f6 & 0x80 != 0).then_some(VlanTag { pcp: 3, dei: false, vid: 7 }),
            sgid: src,
            dgid: dst,
            traffic_class: ecn,
            hop_limit: 64,
            flow_label: 0,
            udp_sport: None,
        };
        let known = opcode.layout();
        let layout = known.unwrap_or_else(|| Opcode::RC_SEND_ONLY.layout().expect("known"));
        let bth = BthRepr {
            solicited: f6 & 2 != 0,
            mig_req: f6 & 4 != 0,
            pkey,
            fecn: f6 & 8 != 0,
            becn: f6 & 0x10 != 0,
            ack_req: f6 & 1 != 0,
            ..BthRepr::new(if known.is_some() { opcode } else { Opcode::RC_SEND_ONLY }, dest_qp, psn)
        };
        let mut tr = TransportRepr::bth_only(bth);
        let mtu = self.mtu.bytes() as usize;
        let peer_qpn = self.hosts[peer].qpn;
        if layout.deth {
            let d0 = r.u8();
            let mut qkey = match d0 & 3 {
                0 | 1 => QKEY,
                2 => QKEY ^ 1,
                _ => r.u32(),
            };
            if d0 & 4 != 0 {
                qkey |= 0x8000_0000;
            }
            let src_qp = if d0 & 8 != 0 { r.u24() } else { peer_qpn };
            tr.deth = Some(DethRepr { qkey, resv8: 0, src_qp });
        }
        // Payload length is chosen last but RETH's "payload length" needs it:
        // read the RETH/atomic fields first and resolve after.
        let mut reth_len_sel = None;
        if layout.reth {
            let (va, rkey, rlen) = self.hosts[t].region_ref(r);
            let l0 = r.u8();
            let dma_len = match l0 & 3 {
                0 => Some(u32::from(r.u8())),
                1 => None,
                2 => Some(rlen as u32),
                _ => Some(r.u32()),
            };
            reth_len_sel = Some(dma_len);
            tr.reth = Some(RethRepr { va, rkey, dma_len: 0 });
        }
        if layout.atomic_eth {
            let (va, rkey, _) = self.hosts[t].region_ref(r);
            tr.atomic_eth = Some(AtomicEthRepr { va, rkey, swap_add: u64::from(r.u8()), compare: u64::from(r.u8()) });
        }
        if layout.aeth {
            let syndrome = AckSyndrome::from_byte(r.u8());
            let m = r.u8();
            let msn = if m & 0x80 != 0 { r.u24() } else { u32::from(m) };
            tr.aeth = Some(AethRepr { syndrome, msn });
        }
        if layout.atomic_ack_eth {
            tr.atomic_ack = Some(u64::from(r.u8()));
        }
        if layout.immdt {
            tr.immediate = Some(u32::from(r.u8()));
        }
        if layout.ieth {
            let (_, key, _) = self.hosts[t].region_ref(r);
            tr.invalidate_rkey = Some(key);
        }
        let p0 = r.u8();
        let p1 = r.u8();
        let p2 = r.u8();
        let mut plen = match p0 & 7 {
            0 => 0,
            1 => usize::from(p1),
            2 => mtu,
            3 => mtu - usize::from(p1 % 4),
            4 => mtu + 1 + usize::from(p1 % 8),
            5 => usize::from(r.u16()) % 4200,
            6 => 8,
            _ => usize::from(p1 & 63),
        };
        if !layout.payload {
            plen = 0;
        }
        if let (Some(reth), Some(sel)) = (tr.reth.as_mut(), reth_len_sel) {
            reth.dma_len = sel.unwrap_or(plen as u32);
        }
        let payload: Vec<u8> = (0..plen).map(|i| fill_byte(p2, i)).collect();
        let frame_repr = PathHeaders::new(&av, sport).frame(tr);
        let mut frame = vec![0u8; frame_repr.frame_len(plen)];
        frame_repr.emit(&payload, &mut frame).expect("a forged frame emits");
        if known.is_none() {
            // An opcode urnic does not know: patch the byte, re-seal the ICRC.
            let eth = if av.vlan.is_some() { 18 } else { 14 };
            let ip = if matches!(frame_repr.ip, IpRepr::V4(_)) { 20 } else { 40 };
            frame[eth + ip + 8] = opcode.0;
            icrc::fill_frame(&mut frame).expect("re-seal the ICRC");
        }
        (t, frame)
    }

    fn choose_qpn(&self, t: usize, f3: u8, r: &mut Reader) -> u32 {
        let h = &self.hosts[t];
        match f3 & 15 {
            0..=9 => h.qpn,
            10 => h.idle_qpn,
            11 => self.hosts[1 - t].qpn,
            12 => {
                if f3 & 0x10 != 0 {
                    h.qpn + 1
                } else {
                    h.qpn - 1
                }
            }
            13 => u32::from((f3 >> 4) & 1),
            14 => 0x00ff_ffff,
            _ => r.u24(),
        }
    }

    /// A mutated copy of the next queued real frame: (target host, frame).
    fn mutate(&mut self, r: &mut Reader) -> Option<(usize, Vec<u8>)> {
        let m0 = r.u8();
        let m1 = r.u8();
        let link = usize::from(m0 & 1);
        let orig = if m0 & 2 != 0 { self.links[link].front().cloned()? } else { self.links[link].pop_front()? };
        let t = 1 - link;
        let p = parse_frame(&orig).expect("queued frames come from the engines");
        let mut repr = p.repr;
        let mut payload = p.payload.to_vec();
        let tr = &mut repr.transport;
        let layout = tr.bth.opcode.layout().expect("known opcode");
        match (m0 >> 2) & 7 {
            0 => tr.bth.psn = tr.bth.psn.add(m1 as i8 as i32 as u32),
            1 => {
                let ops = match tr.bth.opcode.service() {
                    Service::Uc => &UC_OPS[..],
                    Service::Ud => &UD_OPS[..],
                    _ => &RC_OPS[..],
                };
                tr.bth.opcode = Opcode(ops[usize::from(m1) % ops.len()]);
                if !tr.bth.opcode.layout().expect("known").payload {
                    payload.clear();
                }
            }
            2 => tr.bth.dest_qp = self.choose_qpn(t, m1, r),
            3 => match tr.aeth.as_mut() {
                Some(a) => a.syndrome = AckSyndrome::from_byte(m1),
                None => tr.aeth = Some(AethRepr { syndrome: AckSyndrome::from_byte(m1), msn: 0 }),
            },
            4 => {
                let reth = tr.reth.get_or_insert_with(RethRepr::default);
                match m1 & 3 {
                    0 => reth.va = reth.va.wrapping_add(u64::from(m1 >> 2) * 64),
                    1 => reth.rkey ^= 1 << (m1 >> 2 & 31),
                    2 => reth.dma_len = reth.dma_len.wrapping_add(u32::from(m1 >> 2)),
                    _ => reth.va = reth.va.wrapping_sub(u64::from(m1 >> 2) + 1),
                }
            }
            5 => {
                if layout.payload {
                    if m1 & 0x80 != 0 {
                        payload.extend((0..usize::from(m1 & 0x7f)).map(|i| fill_byte(m1, i)));
                    } else {
                        payload.truncate(payload.len() * usize::from(m1) / 128);
                    }
                }
            }
            6 => match &mut repr.ip {
                IpRepr::V4(v4) => v4.src = [10, 0, 0, 99],
                IpRepr::V6(v6) => v6.src[15] = 99,
            },
            _ => {
                tr.bth.ack_req ^= m1 & 1 != 0;
                tr.bth.solicited ^= m1 & 2 != 0;
                if m1 & 4 != 0 {
                    tr.bth.pkey = u16::from(m1) << 8 | 0x7f;
                }
            }
        }
        let mut frame = vec![0u8; repr.frame_len(payload.len()).max(1)];
        match repr.emit(&payload, &mut frame) {
            Ok(n) => {
                frame.truncate(n);
                if m0 & 0x20 != 0 {
                    // The byte before the ICRC (payload, pad or a header's
                    // last byte, never a masked field): the ICRC no longer holds.
                    frame[n - 5] ^= 1 << (m1 & 7);
                }
                Some((t, frame))
            }
            Err(_) => None,
        }
    }

    /// Deliver an injected frame to host `t` and check what it may change.
    fn inject(&mut self, t: usize, frame: &[u8], ctx: &Ctx) {
        let parsed = parse_frame(frame);
        let bad_icrc = matches!(parsed, Err(rocev2::wire::WireError::BadIcrc { .. }));
        let info = match &parsed {
            Ok(p) => {
                let (src, dst) = ip_gids(&p.repr.ip);
                Some((p.repr.transport, src, dst))
            }
            Err(_) if bad_icrc => None,
            Err(e) => {
                // Only an unknown opcode byte makes a forged frame the parser refuses.
                let op = rocev2::wire::peek_opcode(frame).unwrap_or(Opcode(0));
                assert!(!op.is_known(), "{ctx}: the harness built a malformed frame ({e}): {frame:02x?}");
                None
            }
        };
        if let Some((tr, ..)) = &info {
            trace!("  inject → {} {:?} psn {:#x} qp {:#x} {tr:?}", self.hosts[t].name, tr.bth.opcode, tr.bth.psn.value(), tr.bth.dest_qp);
        }
        let h = &self.hosts[t];
        let main_attr = h.engine.query_qp(h.qpn).expect("main QP exists");
        let qp_type = |q: u32| -> Option<QpType> {
            if q == h.qpn {
                Some(self.ty)
            } else if q == h.idle_qpn {
                Some(QpType::Rc)
            } else {
                None
            }
        };
        // Which checks apply to this frame.
        let mut ghost = false;
        let mut stranger = false;
        let mut idle_rc_response = false;
        if let Some((tr, src, dst)) = &info {
            let op = tr.bth.opcode;
            let on_main = tr.bth.dest_qp == h.qpn;
            // Rule: a response for a PSN the requester never sent (at or after
            // its next PSN) is ignored (counted in req_ghost_responses).
            ghost = self.ty == QpType::Rc && on_main && op.is_response() && !tr.bth.psn.is_before(main_attr.sq_psn);
            let rc_uc = matches!(qp_type(tr.bth.dest_qp), Some(QpType::Rc | QpType::Uc));
            stranger = rc_uc && (*src != self.hosts[1 - t].addr.gid || *dst != h.addr.gid);
            idle_rc_response = self.ty == QpType::Rc && on_main && op.is_response() && h.pending_sends() == 0 && !h.unsignaled_posted;
        }
        // A frame that must change nothing, why, and the QP counters it may
        // move: a stranger's frame none (it is dropped and counted engine-wide,
        // rule 1, rxe check_addr); a response never sent or while nothing is
        // outstanding only the receive and stale/ghost counters (rule 2).
        const RESPONSE_DROP: &[&str] = &["rx_packets", "rx_bytes", "req_stale_responses", "req_ghost_responses", "np_ce_received"];
        let quiet: Option<(&str, &[&str])> = if bad_icrc {
            Some(("a frame with a bad ICRC", &[]))
        } else if stranger {
            Some(("a frame from a stranger address", &[]))
        } else if ghost {
            Some(("a response for a PSN never sent", RESPONSE_DROP))
        } else if idle_rc_response {
            Some(("a response while nothing is outstanding", RESPONSE_DROP))
        } else {
            None
        };
        let before = quiet.map(|_| (h.states.clone(), h.snapshot(), h.qp_stats(), h.engine.stats().clone()));

        self.hosts[t].engine.handle_frame(self.now, frame);
        self.now += Duration::from_micros(1);

        let (Some((why, may_move)), Some((states, mem, stats, estats))) = (quiet, before) else { return };
        let h = &mut self.hosts[t];
        if let Some(c) = h.engine.poll_completion() {
            panic!("{ctx}: host {} completed {:?} on {why}", h.name, c);
        }
        if let Some(ev) = h.engine.poll_event() {
            panic!("{ctx}: host {} raised {ev:?} on {why}", h.name);
        }
        for (&q, &s) in &states {
            let now = h.engine.qp_state(q).expect("QP exists");
            assert_eq!(now, s, "{ctx}: host {} QP {q:#x} went {s:?} -> {now:?} on {why}", h.name);
        }
        let now_mem = h.snapshot();
        // A bad ICRC may leave a WRITE continuation's bytes in the
        // remote-write region (the snapshot's first region) only.
        let from = if bad_icrc { h.regions[RW].buf.len() } else { 0 };
        if let Some(i) = (mem[from..] != now_mem[from..]).then(|| mem[from..].iter().zip(&now_mem[from..]).position(|(x, y)| x != y)).flatten() {
            panic!("{ctx}: host {} memory changed (byte {} of the region snapshot) on {why}", h.name, from + i);
        }
        for ((q, b), (_, a)) in stats.iter().zip(&h.qp_stats()) {
            for ((name, x), (_, y)) in b.iter().zip(a.iter()) {
                if x != y && !may_move.contains(&name) {
                    panic!("{ctx}: host {} QP {q:#x} counter {name} {x} -> {y} on {why}", h.name);
                }
            }
        }
        if bad_icrc {
            let mut want = estats.clone();
            want.rx_frames += 1;
            *want.rx_bad_frame.entry(rocev2::transport::events::WireErrorKind::BadIcrc).or_insert(0) += 1;
            assert_eq!(h.engine.stats(), &want, "{ctx}: host {} counted more than one bad-ICRC drop on {why}", h.name);
        }
        if stranger {
            // Dropped before the QP: exactly one engine drop counter moved.
            let drops = |e: &rocev2::transport::engine::EngineStats| -> u64 {
                e.iter()
                    .filter(|(k, _)| !matches!(k.as_str(), "rx_frames" | "rx_cnps" | "mcast_frames" | "rx_icrc_at_placement" | "tx_frames"))
                    .map(|(_, v)| v)
                    .sum()
            };
            let after = h.engine.stats();
            assert_eq!(after.rx_cnps, estats.rx_cnps, "{ctx}: host {} counted a CNP from a stranger", h.name);
            assert_eq!(drops(after), drops(&estats) + 1, "{ctx}: host {} did not count the stranger's frame as one drop: {after:?}", h.name);
        }
    }

    /// The invariants that hold after every step.
    fn check(&mut self, ctx: &Ctx) {
        let ty = self.ty;
        let access = self.access;
        for h in self.hosts.iter_mut() {
            // (d) completions: once each, on the right QP, of the right kind.
            while let Some(c) = h.engine.poll_completion() {
                let wc = c.wc;
                let Some(rec) = h.wrs.get_mut(&wc.wr_id) else {
                    panic!("{ctx}: host {} completed wr_id {} that was never posted: {c:?}", h.name, wc.wr_id);
                };
                rec.completions += 1;
                assert!(rec.completions == 1, "{ctx}: host {} completed wr_id {} a second time: {c:?}", h.name, wc.wr_id);
                assert_eq!(wc.qp_num, rec.qpn, "{ctx}: host {} completed wr_id {} on another QP: {c:?}", h.name, wc.wr_id);
                let recv_op = matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
                assert_eq!(recv_op, rec.recv, "{ctx}: host {} completion kind does not match the WR: {c:?} for {rec:?}", h.name);
                assert!(rec.signaled || wc.status != WcStatus::Success, "{ctx}: host {} an unsignaled WR completed successfully: {c:?}", h.name);
                trace!("  completion {} {:?}", h.name, wc);
            }
            // (c) states.
            let mut fatal = BTreeSet::new();
            while let Some(ev) = h.engine.poll_event() {
                trace!("  event {} {ev:?}", h.name);
                if let AsyncEvent::QpFatal(q) = ev {
                    assert!(h.states.contains_key(&q), "{ctx}: host {} QP_FATAL for unknown QP {q:#x}", h.name);
                    fatal.insert(q);
                }
            }
            for (&q, prev) in h.states.iter_mut() {
                let now = h.engine.qp_state(q).expect("QP exists");
                if fatal.contains(&q) {
                    assert_eq!(now, QpState::Err, "{ctx}: host {} QP {q:#x} raised QP_FATAL but is in {now:?}", h.name);
                }
                if now != *prev {
                    let ok = now == QpState::Err && matches!(*prev, QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe) && fatal.contains(&q);
                    assert!(ok, "{ctx}: host {} QP {q:#x} went {prev:?} -> {now:?} (QP_FATAL raised: {})", h.name, fatal.contains(&q));
                    trace!("  {} QP {q:#x}: {prev:?} -> {now:?}", h.name);
                    *prev = now;
                }
            }
            // (b) memory.
            for (k, reg) in h.regions.iter().enumerate() {
                if let Some(off) = reg.bad_guard() {
                    panic!("{ctx}: host {} wrote outside registered region {k} (guard byte at offset {off})", h.name);
                }
            }
            for k in [RO, FOREIGN] {
                if let Some(off) = h.regions[k].changed_at() {
                    panic!(
                        "{ctx}: host {} wrote into region {k} ({}), which nothing may write, at offset {off}",
                        h.name,
                        ["rw", "read-only", "other PD", "local"][k]
                    );
                }
            }
            let remote_may_write = match ty {
                QpType::Ud => false,
                QpType::Uc => access.contains(Access::REMOTE_WRITE),
                QpType::Rc => access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC),
            };
            if !remote_may_write {
                if let Some(off) = h.regions[RW].changed_at() {
                    panic!("{ctx}: host {} remote-access region written at offset {off} although the QPs ({ty:?}) grant only {access:?}", h.name);
                }
            }
            // Rule 4 of issue 14 (rxe invalidate_rkey): no frame revokes an
            // ordinary MR, so every region's key keeps working.
            for (k, reg) in h.regions.iter().enumerate() {
                let needed = reg.access & (Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC);
                if needed.is_empty() {
                    continue;
                }
                if let Err(e) = h.memory.remote_check(reg.pd, h.qpn, reg.key, reg.iova, 8, needed) {
                    panic!("{ctx}: host {} region {k}'s MR (key {:#x}) no longer usable: {e}", h.name, reg.key);
                }
            }
        }
    }

    /// Move every QP to ERR, let the flushes run and check that every
    /// signaled or receive WR completed exactly once.
    fn finish(&mut self, ctx: &Ctx) {
        for h in self.hosts.iter_mut() {
            let qpns: Vec<u32> = h.states.keys().copied().collect();
            for q in qpns {
                let a = QpAttr { qp_state: QpState::Err, ..QpAttr::default() };
                h.engine.modify_qp(q, &a, QpAttrMask::STATE).expect("any state -> ERR");
                h.states.insert(q, QpState::Err);
            }
        }
        for _ in 0..64 {
            let before: usize = self.links.iter().map(|l| l.len()).sum();
            self.fill();
            let after: usize = self.links.iter().map(|l| l.len()).sum();
            if after == before {
                break;
            }
        }
        self.check(ctx);
        for h in &self.hosts {
            for (id, w) in &h.wrs {
                if w.recv || w.signaled {
                    assert_eq!(w.completions, 1, "{ctx}: host {} wr_id {id} ({w:?}) did not complete after the QP was flushed", h.name);
                }
            }
        }
    }

    fn set_state(&mut self, side: usize, to: QpState) {
        let h = &mut self.hosts[side];
        let from = h.states[&h.qpn];
        let a = QpAttr { qp_state: to, ..QpAttr::default() };
        let r = h.engine.modify_qp(h.qpn, &a, QpAttrMask::STATE);
        trace!("  modify {} {from:?} -> {to:?}: {r:?}", h.name);
        if r.is_ok() {
            h.states.insert(h.qpn, to);
        }
    }
}

/// Run one fuzz input (see the module docs for its format).
pub fn run(data: &[u8]) {
    let mut r = Reader::new(data);
    let mut w = World::new(&mut r);
    let mut ctx = Ctx { input_step: 0, what: "setup".into() };
    w.check(&ctx);
    let mut step = 0;
    while !r.done() && step < MAX_STEPS {
        step += 1;
        let o = r.u8() % 32;
        ctx = Ctx { input_step: step, what: String::new() };
        match o {
            0..=2 => {
                ctx.what = "deliver A→B".into();
                w.deliver(0, false);
            }
            3..=5 => {
                ctx.what = "deliver B→A".into();
                w.deliver(1, false);
            }
            6 | 7 => {
                ctx.what = "drop".into();
                let l = usize::from(o - 6);
                if w.links[l].is_empty() {
                    w.fill();
                }
                w.links[l].pop_front();
            }
            8 | 9 => {
                ctx.what = "duplicate".into();
                w.deliver(usize::from(o - 8), true);
            }
            10 => {
                ctx.what = "pump".into();
                for _ in 0..256 {
                    if !w.deliver(0, false) & !w.deliver(1, false) {
                        break;
                    }
                }
            }
            11 => {
                ctx.what = "timers".into();
                w.fire_timers();
            }
            12 => {
                let d = [1, 10, 100, 1000, 10_000, 100_000, 1_000_000][usize::from(r.u8() % 7)];
                ctx.what = format!("advance {d} µs");
                w.now += Duration::from_micros(d);
                for h in w.hosts.iter_mut() {
                    h.engine.handle_timeout(w.now);
                }
            }
            13 => {
                ctx.what = "post send".into();
                w.post_wr(&mut r);
            }
            14 => {
                ctx.what = "post recv".into();
                let v = r.u8();
                let side = if v & 1 != 0 { 0 } else { 1 };
                let q = w.hosts[side].qpn;
                w.post_recv_on(side, q, v);
            }
            15 => {
                let v = r.u8();
                let side = usize::from(v & 1);
                let to = if v & 2 != 0 { QpState::Rts } else { QpState::Sqd };
                ctx.what = format!("modify {} to {to:?}", w.hosts[side].name);
                w.set_state(side, to);
            }
            16..=27 => {
                let (t, frame) = w.forge(&mut r);
                ctx.what = format!("forged frame to {}: {:02x?}", w.hosts[t].name, frame);
                w.inject(t, &frame, &ctx);
            }
            _ => {
                ctx.what = "transmit before a mutated frame".into();
                // What the engines send now may complete or flush work: check
                // it apart from what the mutated frame does.
                w.fill();
                w.check(&ctx);
                ctx.what = "mutated frame".into();
                if let Some((t, frame)) = w.mutate(&mut r) {
                    ctx.what = format!("mutated frame to {}: {:02x?}", w.hosts[t].name, frame);
                    w.inject(t, &frame, &ctx);
                }
            }
        }
        trace!("step {step}: {}", ctx.what);
        w.check(&ctx);
    }
    ctx = Ctx { input_step: step + 1, what: "final flush to ERR".into() };
    w.finish(&ctx);
}
