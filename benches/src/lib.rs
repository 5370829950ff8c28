//! Benchmark helpers (criterion suites live in `benches/benches/`).
//!
//! [`EnginePair`] is two transport engines with one connected RC QP each,
//! joined by nothing: a suite moves frames between them itself, so it can
//! time one side of the exchange (the requester making frames, the
//! responder placing them, the completer turning ACKs into completions)
//! and do the rest untimed.

use std::sync::Arc;

use rocev2::psn::Psn;
use rocev2::sim::rc::{connect_rc, HostAddr, RcParams};
use rocev2::time::Instant;
use rocev2::transport::attr::{Mtu, QpCaps, QpInitAttr, QpType};
use rocev2::transport::engine::{Engine, EngineConfig};
use rocev2::transport::memory::{Access, MemoryTable, PdId};
use rocev2::transport::wr::{Completion, CqId, Payload, RecvWr, RemoteAddr, SendFlags, SendOp, SendWr, Sge, WcStatus};

const PD: PdId = PdId(1);

/// CQ of send completions on both engines.
pub const SEND_CQ: CqId = CqId(0);
/// CQ of receive completions on both engines.
pub const RECV_CQ: CqId = CqId(1);

/// The largest frame either engine emits (MTU 4096 payload plus headers).
pub const FRAME_BUF: usize = 4096 + 128;

/// Frames laid end to end in one reused buffer (no allocation and no
/// zeroing per frame once the buffer has grown to the batch's size, as a
/// NIC's transmit buffers are reused).
#[derive(Default)]
pub struct Frames {
    /// Grows (zero-filled) only; `used` bytes of it hold frames.
    buf: Vec<u8>,
    used: usize,
    ends: Vec<usize>,
}

impl Frames {
    /// An empty set with room for `frames` full-size frames.
    pub fn with_capacity(frames: usize) -> Frames {
        Frames { buf: vec![0; frames * FRAME_BUF], used: 0, ends: Vec::with_capacity(frames) }
    }

    /// Forget the frames (keeps the memory).
    pub fn clear(&mut self) {
        self.used = 0;
        self.ends.clear();
    }

    /// Number of frames.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Total bytes in all frames.
    pub fn bytes(&self) -> usize {
        self.used
    }

    /// The frames in order.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let f = &self.buf[start..end];
            start = end;
            f
        })
    }

    /// Append every frame `engine` has to send. Returns how many.
    pub fn transmit_all(&mut self, engine: &mut Engine, now: Instant) -> usize {
        let mut n = 0;
        loop {
            let start = self.used;
            if self.buf.len() < start + FRAME_BUF {
                self.buf.resize((start + FRAME_BUF).max(2 * self.buf.len()), 0);
            }
            match engine.poll_transmit(now, &mut self.buf[start..start + FRAME_BUF]) {
                Some(len) => {
                    self.used = start + len;
                    self.ends.push(self.used);
                    n += 1;
                }
                None => return n,
            }
        }
    }

    /// Hand every frame to `engine`.
    pub fn deliver(&self, engine: &mut Engine, now: Instant) {
        for f in self.iter() {
            engine.handle_frame(now, f);
        }
    }
}

/// Two engines, `a` and `b`, each with one RC QP connected to the other's
/// and one registered buffer of the same length.
pub struct EnginePair {
    /// Requester side in most suites.
    pub a: Engine,
    /// Responder side in most suites.
    pub b: Engine,
    /// QPN on `a` and on `b`.
    pub qpn: [u32; 2],
    /// lkey (= rkey) of each side's buffer.
    pub keys: [u32; 2],
    /// IOVA of each side's buffer.
    pub iova: [u64; 2],
    /// Length of each buffer.
    pub buf_len: usize,
    // Dropped after the engines (field order) that point into them.
    _bufs: [Box<[u64]>; 2],
}

/// Virtual time for the suites: timers never run (no retransmissions), so
/// one fixed instant is enough.
pub fn now() -> Instant {
    Instant::ZERO
}

impl EnginePair {
    /// A connected pair with `buf_len`-byte buffers (rounded up to 8) and
    /// queues of `depth` WRs.
    pub fn new(mtu: Mtu, buf_len: usize, depth: u32) -> EnginePair {
        let hosts = [HostAddr::ipv4(1), HostAddr::ipv4(2)];
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        let words = buf_len.div_ceil(8);
        let mut bufs = [vec![0u64; words].into_boxed_slice(), vec![0u64; words].into_boxed_slice()];
        let iova = [0x1000_0000, 0x2000_0000];
        let mut keys = [0; 2];
        let mut engines = Vec::new();
        for i in 0..2 {
            let table = Arc::new(MemoryTable::new());
            // SAFETY: the buffers live in the returned pair and are dropped
            // after the engines that use them (field order).
            let k = unsafe { table.register(PD, bufs[i].as_mut_ptr() as *mut u8, words * 8, iova[i], access) }.expect("register");
            keys[i] = k.lkey;
            engines.push(Engine::new(EngineConfig::default(), table));
        }
        let init = QpInitAttr {
            qp_type: QpType::Rc,
            pd: PD,
            send_cq: SEND_CQ,
            recv_cq: RECV_CQ,
            srq: None,
            cap: QpCaps { max_send_wr: depth, max_recv_wr: depth, ..QpCaps::default() },
            sq_sig_all: true,
        };
        let mut b = engines.pop().expect("two engines");
        let mut a = engines.pop().expect("two engines");
        let qa = a.create_qp(&init).expect("create_qp");
        let qb = b.create_qp(&init).expect("create_qp");
        let pa = RcParams { mtu, sq_psn: Psn::new(100), access, ..RcParams::default() };
        let pb = RcParams { mtu, sq_psn: Psn::new(200), access, ..RcParams::default() };
        connect_rc(&mut a, qa, &hosts[0], &pa, &mut b, qb, &hosts[1], &pb).expect("connect");
        EnginePair { a, b, qpn: [qa, qb], keys, iova, buf_len: words * 8, _bufs: bufs }
    }

    /// Offset of message `i` of `size` bytes, wrapping inside the buffer.
    fn offset(&self, i: usize, size: u32) -> u64 {
        let slots = (self.buf_len / size.max(1) as usize).max(1);
        (i % slots) as u64 * u64::from(size)
    }

    /// A signaled WR from `a` of `size` bytes: `op` with the remote address
    /// of message `i` in `b`'s buffer where it needs one.
    pub fn wr(&self, kind: Kind, i: usize, size: u32) -> SendWr {
        let off = self.offset(i, size);
        let remote = RemoteAddr { addr: self.iova[1] + off, rkey: self.keys[1] };
        let op = match kind {
            Kind::Write => SendOp::Write { remote },
            Kind::Read => SendOp::Read { remote },
            Kind::Send => SendOp::Send,
        };
        SendWr {
            wr_id: i as u64,
            op,
            payload: Payload::Sgl(vec![Sge { addr: self.iova[0] + off, length: size, lkey: self.keys[0] }]),
            flags: SendFlags::SIGNALED,
            ud: None,
        }
    }

    /// A receive WR on `b` for message `i` of `size` bytes.
    pub fn recv_wr(&self, i: usize, size: u32) -> RecvWr {
        let off = self.offset(i, size);
        RecvWr { wr_id: i as u64, sgl: vec![Sge { addr: self.iova[1] + off, length: size, lkey: self.keys[1] }] }
    }

    /// Post `n` receives of `size` bytes on `b`.
    pub fn post_recvs(&mut self, n: usize, size: u32) {
        for i in 0..n {
            let r = self.recv_wr(i, size);
            self.b.post_recv(self.qpn[1], r).expect("post_recv");
        }
    }

    /// Post `n` WRs of `kind` and `size` on `a` (and, for SEND, the receives
    /// on `b` first).
    pub fn post(&mut self, kind: Kind, n: usize, size: u32) {
        if kind == Kind::Send {
            self.post_recvs(n, size);
        }
        for i in 0..n {
            let wr = self.wr(kind, i, size);
            self.a.post_send(self.qpn[0], wr).expect("post_send");
        }
    }

    /// Move frames both ways until neither engine has anything to send.
    /// `scratch` is reused.
    pub fn settle(&mut self, scratch: &mut Frames) {
        loop {
            scratch.clear();
            let from_a = scratch.transmit_all(&mut self.a, now());
            scratch.deliver(&mut self.b, now());
            scratch.clear();
            let from_b = scratch.transmit_all(&mut self.b, now());
            scratch.deliver(&mut self.a, now());
            if from_a == 0 && from_b == 0 {
                return;
            }
        }
    }
}

/// Poll every completion from `engine`, checking each succeeded. Returns how
/// many.
pub fn drain_completions(engine: &mut Engine) -> usize {
    let mut n = 0;
    while let Some(Completion { wc, .. }) = engine.poll_completion() {
        assert_eq!(wc.status, WcStatus::Success, "completion {wc:?}");
        n += 1;
    }
    n
}

/// Messages per sample in the requester and responder suites: about
/// 256 KiB, between 4 and 128 WRs.
pub fn batch(size: u32) -> usize {
    ((256 * 1024) / size.max(1) as usize).clamp(4, 128)
}

/// The (operation, message size, MTU) cases of the requester and responder
/// suites.
pub const CASES: &[(Kind, u32, Mtu)] = &[
    (Kind::Write, 64, Mtu::Mtu1024),
    (Kind::Write, 4096, Mtu::Mtu1024),
    (Kind::Write, 65536, Mtu::Mtu1024),
    (Kind::Write, 65536, Mtu::Mtu4096),
    (Kind::Send, 64, Mtu::Mtu1024),
    (Kind::Send, 65536, Mtu::Mtu4096),
    (Kind::Read, 65536, Mtu::Mtu4096),
];

/// The parameter part of the benchmark id of one of [`CASES`]
/// (`65536B_mtu4096`; the operation's name is the function part).
pub fn case_label(size: u32, mtu: Mtu) -> String {
    format!("{size}B_mtu{}", mtu.bytes())
}

/// The operation a suite measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
    /// SEND (with a receive posted on `b`).
    Send,
}

impl Kind {
    /// Lower-case name for benchmark ids.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Write => "write",
            Kind::Read => "read",
            Kind::Send => "send",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pair_moves_every_kind_and_completes_each_wr_once() {
        for mtu in [Mtu::Mtu1024, Mtu::Mtu4096] {
            let mut p = EnginePair::new(mtu, 1 << 20, 256);
            let mut f = Frames::with_capacity(64);
            for kind in [Kind::Write, Kind::Read, Kind::Send] {
                p.post(kind, 32, 10_000);
                p.settle(&mut f);
                assert_eq!(drain_completions(&mut p.a), 32, "{kind:?} requester completions");
                let recvs = drain_completions(&mut p.b);
                assert_eq!(recvs, if kind == Kind::Send { 32 } else { 0 }, "{kind:?} receive completions");
            }
        }
    }

    #[test]
    fn frames_round_trip_their_lengths() {
        let mut p = EnginePair::new(Mtu::Mtu1024, 1 << 16, 16);
        p.post(Kind::Write, 1, 3000);
        let mut f = Frames::default();
        assert_eq!(f.transmit_all(&mut p.a, now()), 3);
        assert_eq!(f.len(), 3);
        let lens: Vec<usize> = f.iter().map(<[u8]>::len).collect();
        assert_eq!(lens.iter().sum::<usize>(), f.bytes());
        assert!(lens[0] > 1024 && lens[2] < lens[1], "{lens:?}");
    }
}
