//! Benchmark helpers (criterion suites live in `benches/benches/`).
//!
//! [`engine_pair`] is two transport engines with one connected RC QP each
//! (the simulator's two-engine harness, `rocev2::sim::pair`), joined by
//! nothing: a suite moves frames between them itself, so it can time one
//! side of the exchange (the requester making frames, the responder
//! placing them, the completer turning ACKs into completions) and do the
//! rest untimed. [`BenchPair`] posts the suites' WRs on such a pair and
//! settles it.

use rocev2::psn::Psn;
use rocev2::sim::pair::{PairConfig, ALL_ACCESS};
use rocev2::sim::rc::RcParams;
use rocev2::time::Instant;
use rocev2::transport::attr::{Mtu, QpCaps};
use rocev2::transport::engine::Engine;
use rocev2::transport::wr::{Completion, CqId, Payload, RecvWr, SendFlags, SendOp, SendWr, WcStatus};

pub use rocev2::sim::pair::Pair;

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

/// Virtual time for the suites: timers never run (no retransmissions), so
/// one fixed instant is enough.
pub fn now() -> Instant {
    Instant::ZERO
}

/// Two engines, `a` (the requester in most suites) and `b`, each with one
/// RC QP connected to the other's (first PSNs 100 and 200, every access
/// right), queues of `depth` WRs, and one registered `buf_len`-byte buffer
/// (rounded up to 8). Send completions go to [`SEND_CQ`], receive
/// completions to [`RECV_CQ`].
pub fn engine_pair(mtu: Mtu, buf_len: usize, depth: u32) -> Pair {
    let mut cfg = PairConfig { buf_len, mr_access: ALL_ACCESS, ..PairConfig::default() };
    // Timers never run here ([`now`]): every ACK leaves at once, none is
    // held for a reply (`EngineConfig::ack_hold`).
    for e in &mut cfg.engines {
        e.ack_hold = std::time::Duration::ZERO;
    }
    cfg.qp.send_cq = SEND_CQ;
    cfg.qp.recv_cq = RECV_CQ;
    cfg.qp.cap = QpCaps { max_send_wr: depth, max_recv_wr: depth, ..QpCaps::default() };
    cfg.params = [100, 200].map(|psn| RcParams { mtu, sq_psn: Psn::new(psn), access: ALL_ACCESS, ..RcParams::default() });
    Pair::new(&cfg).expect("connect the pair")
}

/// The suites' work on an [`engine_pair`]: WRs from `a` into `b`'s buffer,
/// and settling.
pub trait BenchPair {
    /// A signaled WR from `a` of `size` bytes: `kind` with the remote
    /// address of message `i` in `b`'s buffer where it needs one.
    fn wr(&self, kind: Kind, i: usize, size: u32) -> SendWr;

    /// A receive WR on `b` for message `i` of `size` bytes.
    fn recv_wr(&self, i: usize, size: u32) -> RecvWr;

    /// Post `n` receives of `size` bytes on `b`.
    fn post_recvs(&mut self, n: usize, size: u32);

    /// Post `n` WRs of `kind` and `size` on `a` (and, for SEND, the
    /// receives on `b` first).
    fn post(&mut self, kind: Kind, n: usize, size: u32);

    /// Move frames both ways until neither engine has anything to send.
    /// `scratch` is reused.
    fn settle(&mut self, scratch: &mut Frames);
}

/// Offset of message `i` of `size` bytes, wrapping inside a `buf_len`-byte
/// buffer.
fn offset(buf_len: usize, i: usize, size: u32) -> usize {
    let slots = (buf_len / size.max(1) as usize).max(1);
    (i % slots) * size as usize
}

impl BenchPair for Pair {
    fn wr(&self, kind: Kind, i: usize, size: u32) -> SendWr {
        let off = offset(self.a.mr.len(), i, size);
        let remote = self.b.remote(off);
        let op = match kind {
            Kind::Write => SendOp::Write { remote },
            Kind::Read => SendOp::Read { remote },
            Kind::Send => SendOp::Send,
        };
        SendWr { wr_id: i as u64, op, payload: Payload::Sgl(vec![self.a.sge(off, size)]), flags: SendFlags::SIGNALED, ud: None }
    }

    fn recv_wr(&self, i: usize, size: u32) -> RecvWr {
        let off = offset(self.b.mr.len(), i, size);
        RecvWr { wr_id: i as u64, sgl: vec![self.b.sge(off, size)] }
    }

    fn post_recvs(&mut self, n: usize, size: u32) {
        for i in 0..n {
            let r = self.recv_wr(i, size);
            self.b.engine.post_recv(self.b.qpn, r).expect("post_recv");
        }
    }

    fn post(&mut self, kind: Kind, n: usize, size: u32) {
        if kind == Kind::Send {
            self.post_recvs(n, size);
        }
        for i in 0..n {
            let wr = self.wr(kind, i, size);
            self.a.engine.post_send(self.a.qpn, wr).expect("post_send");
        }
    }

    fn settle(&mut self, scratch: &mut Frames) {
        loop {
            scratch.clear();
            let from_a = scratch.transmit_all(&mut self.a.engine, now());
            scratch.deliver(&mut self.b.engine, now());
            scratch.clear();
            let from_b = scratch.transmit_all(&mut self.b.engine, now());
            scratch.deliver(&mut self.a.engine, now());
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
            let mut p = engine_pair(mtu, 1 << 20, 256);
            let mut f = Frames::with_capacity(64);
            for kind in [Kind::Write, Kind::Read, Kind::Send] {
                p.post(kind, 32, 10_000);
                p.settle(&mut f);
                assert_eq!(drain_completions(&mut p.a.engine), 32, "{kind:?} requester completions");
                let recvs = drain_completions(&mut p.b.engine);
                assert_eq!(recvs, if kind == Kind::Send { 32 } else { 0 }, "{kind:?} receive completions");
            }
        }
    }

    #[test]
    fn frames_round_trip_their_lengths() {
        let mut p = engine_pair(Mtu::Mtu1024, 1 << 16, 16);
        p.post(Kind::Write, 1, 3000);
        let mut f = Frames::default();
        assert_eq!(f.transmit_all(&mut p.a.engine, now()), 3);
        assert_eq!(f.len(), 3);
        let lens: Vec<usize> = f.iter().map(<[u8]>::len).collect();
        assert_eq!(lens.iter().sum::<usize>(), f.bytes());
        assert!(lens[0] > 1024 && lens[2] < lens[1], "{lens:?}");
    }
}
