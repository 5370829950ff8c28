//! perftest-style measurements over the verbs API: an RC QP pair between two
//! contexts, RDMA WRITE bandwidth and SEND ping-pong latency with data checks.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use urnic::{
    Access, Connect, Context, Cq, Mr, PayloadRef, Qp, QpCaps, QpInit, QpType, RecvWr, RecvWrRef, RemoteAddr, SendFlags, SendOp, SendWrRef, WcStatus,
    WorkCompletion,
};

use crate::out::outln;
use crate::report::{LatStats, RULE};

/// How long a bandwidth run may go without a single completion before it
/// is declared stalled (a slow machine still completes something).
const STALL: Duration = Duration::from_secs(60);

/// One endpoint: PD, CQ, QP and a buffer.
pub struct Endpoint {
    /// Context.
    pub ctx: Context,
    /// QP (dropped before the CQ and MR).
    pub qp: Qp,
    /// CQ for sends and receives.
    pub cq: Cq,
    /// The registered buffer.
    pub mr: Mr,
    /// Contexts in run-to-completion mode this thread drives while it waits
    /// (empty when each device has its own datapath thread).
    pub drive: Vec<Context>,
}

impl Endpoint {
    /// Create the endpoint's objects with a `buf_len` buffer.
    pub fn new(ctx: &Context, buf_len: usize, depth: u32) -> Result<Endpoint> {
        let pd = ctx.alloc_pd().context("alloc_pd")?;
        let cq = ctx.create_cq(depth * 3 + 16, None).context("create_cq")?;
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        let mr = pd.alloc_mr(buf_len, access).context("alloc_mr")?;
        let qp = pd
            .create_qp(&QpInit {
                qp_type: QpType::Rc,
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                // Twice the receives: a SEND bandwidth run keeps `depth`
                // SENDs in flight while consumed receives wait to be reposted.
                cap: QpCaps { max_send_wr: depth, max_recv_wr: 2 * depth, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 },
                sq_sig_all: false,
            })
            .context("create_qp")?;
        Ok(Endpoint { ctx: ctx.clone(), qp, cq, mr, drive: Vec::new() })
    }

    /// Bring the QP to RTS towards `remote` (GID index 1, the IPv4-mapped GID).
    pub fn connect(&self, remote_qpn: u32, remote_gid: [u8; 16], local_psn: u32, remote_psn: u32) -> Result<()> {
        self.qp.connect(&Connect::new(remote_qpn, remote_gid, local_psn, remote_psn)).context("connect")
    }

    /// Run one datapath iteration of every context this thread drives.
    pub fn kick(&self) {
        for c in &self.drive {
            c.poll();
        }
    }

    /// Poll until a completion arrives or `deadline` passes.
    pub fn wait_one(&self, deadline: Instant) -> Result<WorkCompletion> {
        let mut wc = [WorkCompletion::default(); 1];
        let mut deadline = SpinDeadline::new(deadline);
        loop {
            if self.cq.poll(&mut wc).context("poll_cq")? == 1 {
                if wc[0].status != WcStatus::Success {
                    bail!("completion error: {:?} (wr_id {})", wc[0].status, wc[0].wr_id);
                }
                return Ok(wc[0]);
            }
            if deadline.passed() {
                bail!("timed out waiting for a completion");
            }
            self.kick();
        }
    }
}

/// A waiting loop's deadline, read from the clock every
/// [`SpinDeadline::EVERY`] spins rather than on each: a ping-pong's waits
/// spin between its frames, and a clock read per spin was five of the
/// eleven clock reads of an 8-byte round trip, on the path being timed
/// (perftest's loops read no clock while they wait). The raw AF_XDP
/// ping-pong waits the same way.
pub(crate) struct SpinDeadline {
    at: Instant,
    spins: Spins,
}

/// The rhythm of a waiting loop's looks at the clock, shared by
/// [`SpinDeadline`] and [`StallWatch`]: [`Spins::look`] says yes on every
/// [`SpinDeadline::EVERY`]th spin counted.
#[derive(Default)]
struct Spins(u32);

impl Spins {
    /// Count a spin; whether this one looks at the clock.
    fn look(&mut self) -> bool {
        self.0 += 1;
        if self.0 < SpinDeadline::EVERY {
            return false;
        }
        self.0 = 0;
        true
    }
}

impl SpinDeadline {
    /// Spins between two looks at the clock (each spin polls a device:
    /// microseconds, so a deadline of seconds is seen within milliseconds).
    const EVERY: u32 = 1024;

    pub(crate) fn new(at: Instant) -> SpinDeadline {
        SpinDeadline { at, spins: Spins::default() }
    }

    /// Count a spin; whether the deadline has passed (looked at on every
    /// [`SpinDeadline::EVERY`]th spin).
    pub(crate) fn passed(&mut self) -> bool {
        self.spins.look() && Instant::now() > self.at
    }
}

/// A bandwidth loop's limit on time without progress: [`StallWatch::stalled`]
/// says so once `limit` has passed since the loop last made progress, and
/// reads the clock only on every [`SpinDeadline::EVERY`]th spin without
/// progress; [`StallWatch::progress`] reads none. `bw`'s loop read the
/// clock on every spin (to renew the deadline after a completion, or to
/// check it), on the application's thread beside the device it drives; in
/// the two-core 64 B rate that thread's clock reads (this loop's and the
/// poll's own, one a poll) were 1.7% of its time (`perf`). perftest's loop
/// reads no clock.
pub(crate) struct StallWatch {
    limit: Duration,
    /// Spins without progress since the last look.
    idle: Spins,
    /// When a look at the clock first found no progress since the last.
    since: Option<Instant>,
}

impl StallWatch {
    pub(crate) fn new(limit: Duration) -> StallWatch {
        StallWatch { limit, idle: Spins::default(), since: None }
    }

    /// The loop made progress: the watch starts over (no clock read).
    pub(crate) fn progress(&mut self) {
        self.idle = Spins::default();
        self.since = None;
    }

    /// Count a spin without progress; whether `limit` has passed since the
    /// first look that found none (looked at every [`SpinDeadline::EVERY`]
    /// such spins, so a stall is seen at most that many spins late).
    pub(crate) fn stalled(&mut self) -> bool {
        if !self.idle.look() {
            return false;
        }
        let now = Instant::now();
        match self.since {
            None => {
                self.since = Some(now);
                false
            }
            Some(s) => now.duration_since(s) >= self.limit,
        }
    }
}

/// Connect two endpoints to each other.
pub fn connect_pair(a: &Endpoint, b: &Endpoint) -> Result<()> {
    let ga = a.ctx.query_gid(1, 1).context("query_gid")?;
    let gb = b.ctx.query_gid(1, 1).context("query_gid")?;
    a.connect(b.qp.qp_num(), gb, 0x1000, 0x2000)?;
    b.connect(a.qp.qp_num(), ga, 0x2000, 0x1000)?;
    Ok(())
}

/// Result of a bandwidth run.
#[derive(Clone, Copy, Debug)]
pub struct BwResult {
    /// Bytes per message.
    pub bytes: usize,
    /// Messages.
    pub iters: usize,
    /// Best windowed bandwidth, MB/s.
    pub peak_mbs: f64,
    /// Average bandwidth, MB/s.
    pub avg_mbs: f64,
}

/// The operation a bandwidth run moves data with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BwOp {
    /// RDMA WRITE from `a` into `b`'s buffer (ib_write_bw).
    Write,
    /// RDMA READ by `a` from `b`'s buffer (ib_read_bw).
    Read,
    /// SEND from `a` into receives posted at `b` (ib_send_bw).
    Send,
}

impl BwOp {
    /// All three, in report order.
    pub const ALL: [BwOp; 3] = [BwOp::Write, BwOp::Read, BwOp::Send];

    /// Lower-case name (write, read, send).
    pub fn name(self) -> &'static str {
        match self {
            BwOp::Write => "write",
            BwOp::Read => "read",
            BwOp::Send => "send",
        }
    }
}

/// Above this message size perftest signals every WR
/// (perftest_parameters.c: `MSG_SIZE_CQ_MOD_LIMIT`).
pub const MSG_SIZE_CQ_MOD_LIMIT: usize = 8192;

/// perftest's CQ moderation for a bandwidth run of `size`-byte messages,
/// `depth` outstanding: one WR in every `min(depth, 100)` signalled
/// (`DEF_CQ_MOD`), but every one above [`MSG_SIZE_CQ_MOD_LIMIT`]
/// (`DISABLED_CQ_MOD_VALUE`), as `ib_write_bw` runs by default.
pub fn perftest_cq_mod(size: usize, depth: usize) -> usize {
    if size > MSG_SIZE_CQ_MOD_LIMIT {
        1
    } else {
        depth.clamp(1, 100)
    }
}

/// RDMA WRITE bandwidth from `a` to `b`: `iters` writes of `size` bytes,
/// `depth` outstanding, signalled as perftest does ([`perftest_cq_mod`]);
/// then checks `b`'s buffer.
pub fn write_bw(a: &mut Endpoint, b: &mut Endpoint, size: usize, iters: usize, depth: usize) -> Result<BwResult> {
    bw(a, b, BwOp::Write, size, iters, depth, perftest_cq_mod(size, depth))
}

/// Bandwidth of `op` between `a` (the requester) and `b`: `iters` messages
/// of `size` bytes, `depth` outstanding, one in every `signal_every`
/// signalled (and the last; 1: every one), as perftest's CQ moderation
/// does; then checks that the destination buffer holds the source's
/// pattern. A completion stands for the unsignalled WRs before it (an RC
/// send queue completes in order). SEND receives land in the upper half of
/// `b`'s buffer (so `size` must fit in half).
pub fn bw(a: &mut Endpoint, b: &mut Endpoint, op: BwOp, size: usize, iters: usize, depth: usize, signal_every: usize) -> Result<BwResult> {
    let pattern = |i: usize| (i * 7 + 3) as u8;
    let max = a.ctx.query_device().limits.max_msg_size;
    let Some(len) = u32::try_from(size).ok().filter(|&l| l > 0 && l <= max) else {
        bail!("a {size}-byte message: messages are 1 to {max} bytes");
    };
    if iters == 0 {
        bail!("a bandwidth run needs at least one message");
    }
    let half = b.mr.len() / 2;
    if op == BwOp::Send && size > half {
        bail!("SEND of {size} bytes does not fit the {half}-byte receive area");
    }
    // Source and destination of the data, by operation.
    let (src, dst_at) = match op {
        BwOp::Write => (&mut *a, 0),
        BwOp::Read => (&mut *b, 0),
        BwOp::Send => (&mut *a, half),
    };
    let data: Vec<u8> = (0..size).map(pattern).collect();
    src.mr.write_at(0, &data).context("write_at")?;
    let dst: &mut Endpoint = if op == BwOp::Read { &mut *a } else { &mut *b };
    dst.mr.fill_at(dst_at, size, 0).context("fill_at")?;
    let remote = RemoteAddr { addr: b.mr.addr(), rkey: b.mr.rkey() };
    if size > half {
        bail!("{size} bytes do not fit the {half}-byte buffer half");
    }
    let sge = a.mr.sge(0, len);
    let opcode = match op {
        BwOp::Write => SendOp::Write { remote },
        BwOp::Read => SendOp::Read { remote },
        BwOp::Send => SendOp::Send,
    };
    let recv = RecvWr { wr_id: 7, sgl: vec![b.mr.sge(half, len)] };
    let depth = depth.max(1);
    let signal_every = signal_every.max(1);
    let mut recvs_posted = 0usize;
    if op == BwOp::Send {
        for _ in 0..(2 * depth).min(iters) {
            b.qp.post_recv(&recv).context("post_recv")?;
            recvs_posted += 1;
        }
    }
    // Reset by every completion: a limit on time without progress, not on the run.
    let mut stall = StallWatch::new(STALL);
    let start = Instant::now();
    let (mut posted, mut done, mut received) = (0usize, 0usize, 0usize);
    let mut window_start = start;
    let mut window_done = 0usize;
    let mut peak = 0f64;
    let mut wcs = vec![WorkCompletion::default(); 64];
    while done < iters || (op == BwOp::Send && received < iters) {
        while posted < iters && posted - done < depth {
            posted += 1;
            let signaled = posted % signal_every == 0 || posted == iters;
            // Borrowed SGEs, as the C library posts: no allocation per WR.
            // A WR's id is its count, so a completion says how many are done.
            let wr = SendWrRef {
                wr_id: posted as u64,
                op: opcode,
                payload: PayloadRef::Sgl(std::slice::from_ref(&sge)),
                flags: if signaled { SendFlags::SIGNALED } else { SendFlags::empty() },
                ud: None,
            };
            a.qp.post_send_ref(&wr).context("post_send")?;
        }
        a.kick();
        let n = a.cq.poll(&mut wcs).context("poll_cq")?;
        let before = done;
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                bail!("{} {} completed with {:?}", op.name(), wc.wr_id, wc.status);
            }
            let upto = usize::try_from(wc.wr_id).unwrap_or(usize::MAX);
            if upto <= done || upto > posted {
                bail!("{} completed out of order: WR {upto} after {done} of {posted} posted", op.name());
            }
            done = upto;
        }
        window_done += done - before;
        if n > 0 {
            stall.progress();
        }
        if op == BwOp::Send {
            let m = b.cq.poll(&mut wcs).context("poll_cq")?;
            if m > 0 {
                stall.progress();
            }
            for wc in &wcs[..m] {
                if wc.status != WcStatus::Success || wc.byte_len as usize != size {
                    bail!("receive completed with {:?}, {} bytes", wc.status, wc.byte_len);
                }
                received += 1;
                if recvs_posted < iters {
                    b.qp.post_recv(&recv).context("post_recv")?;
                    recvs_posted += 1;
                }
            }
        }
        if window_done >= depth.max(16) {
            let dt = window_start.elapsed().as_secs_f64();
            if dt > 0.0 {
                peak = peak.max((window_done * size) as f64 / dt / 1e6);
            }
            window_start = Instant::now();
            window_done = 0;
        }
        if n == 0 && stall.stalled() {
            bail!("{} bandwidth stalled: no completion for {} s ({done}/{iters} completed)", op.name(), STALL.as_secs());
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let avg = (iters * size) as f64 / secs / 1e6;
    let dst: &Endpoint = if op == BwOp::Read { a } else { b };
    if dst.mr.read_vec(dst_at, size).context("read_at")?.iter().enumerate().any(|(i, &v)| v != pattern(i)) {
        bail!("data check failed: the {} destination does not hold what was sent", op.name());
    }
    Ok(BwResult { bytes: size, iters, peak_mbs: peak.max(avg), avg_mbs: avg })
}

/// SEND ping-pong latency between `a` and `b`: `iters` round trips of
/// `size`-byte messages; returns one-way latencies (RTT/2) in µs, as
/// ib_send_lat reports them.
pub fn send_lat(a: &mut Endpoint, b: &mut Endpoint, size: usize, iters: usize) -> Result<LatStats> {
    let mut samples = send_lat_samples(a, b, size, iters)?;
    LatStats::from_samples(&mut samples).context("no samples")
}

/// [`send_lat`]'s samples, one-way µs in measurement order.
pub fn send_lat_samples(a: &mut Endpoint, b: &mut Endpoint, size: usize, iters: usize) -> Result<Vec<f64>> {
    let mut pp = SendPingPong::new(a, b, size)?;
    (0..iters).map(|_| pp.round(a, b)).collect()
}

/// Post one receive of the upper half of `ep`'s region, from byte `half`
/// (a borrowed SGE, as the C library posts: no allocation).
fn post_recv_upper(ep: &Endpoint, half: usize) -> Result<()> {
    let sge = ep.mr.sge(half, half as u32);
    ep.qp.post_recv_ref(&RecvWrRef { wr_id: 1, sgl: std::slice::from_ref(&sge) }).context("post_recv")
}

/// Post a signaled `op` of the first `size` bytes of `ep`'s region (a
/// borrowed SGE: no allocation).
fn post_signaled(ep: &Endpoint, wr_id: u64, op: SendOp, size: usize) -> Result<()> {
    let sge = ep.mr.sge(0, size as u32);
    let wr = SendWrRef { wr_id, op, payload: PayloadRef::Sgl(std::slice::from_ref(&sge)), flags: SendFlags::SIGNALED, ud: None };
    ep.qp.post_send_ref(&wr).context("post_send")
}

/// Wait on `ep` until a receive completes (send completions met on the
/// way are consumed).
fn wait_recv(ep: &Endpoint, deadline: Instant) -> Result<()> {
    while ep.wait_one(deadline)?.opcode != urnic::WcOpcode::Recv {}
    Ok(())
}

/// Read `buf.len()` bytes of `mr` from `offset` into `buf`; the first one
/// that is not `tag`, if any.
fn first_not(mr: &Mr, offset: usize, buf: &mut [u8], tag: u8) -> Result<Option<usize>> {
    mr.read_at(offset, buf).context("read_at")?;
    Ok(buf.iter().position(|&v| v != tag))
}

/// The last byte of the `size`-byte landing area at `half` of `mr`: the
/// tag of the WRITE that landed there last (ib_write_lat's signal).
fn landed_tag(mr: &Mr, half: usize, size: usize) -> u8 {
    let at = mr.as_ptr().wrapping_add(half + size - 1);
    // SAFETY: `at` is inside the registered buffer (`WritePingPong::new`
    // checked that the area fits), which the datapath writes concurrently:
    // hence the volatile read.
    unsafe { std::ptr::read_volatile(at) }
}

/// A SEND ping-pong between two connected endpoints, one round trip at a
/// time (so that a benchmark can interleave it with other measurements):
/// `a` sends, `b` receives, checks the data and answers, `a` receives.
/// Receive buffers are the upper half of each region, large enough for any
/// size, so a receive left posted by an earlier size still fits.
pub struct SendPingPong {
    size: usize,
    half: usize,
    rounds: usize,
    /// Where a received message is read back for its check.
    buf: Vec<u8>,
}

impl SendPingPong {
    /// Check `size` against the regions and post one receive on each side.
    pub fn new(a: &mut Endpoint, b: &mut Endpoint, size: usize) -> Result<SendPingPong> {
        let half = a.mr.len().min(b.mr.len()) / 2;
        if size > half {
            bail!("message of {size} bytes does not fit the {half}-byte receive area");
        }
        post_recv_upper(b, half)?;
        post_recv_upper(a, half)?;
        Ok(SendPingPong { size, half, rounds: 0, buf: vec![0; size] })
    }

    /// Start the next round: fill `a`'s send area with its tag and post the
    /// ping. The round's number, its tag, when it started.
    fn ping(&mut self, a: &mut Endpoint) -> Result<(usize, u8, Instant)> {
        let i = self.rounds;
        self.rounds += 1;
        let tag = (i % 251) as u8;
        a.mr.fill_at(0, self.size, tag).context("fill_at")?;
        let t0 = Instant::now();
        post_signaled(a, 2, SendOp::Send, self.size)?;
        Ok((i, tag, t0))
    }

    /// One round trip; its one-way latency (RTT/2) in µs.
    pub fn round(&mut self, a: &mut Endpoint, b: &mut Endpoint) -> Result<f64> {
        let (i, tag, t0) = self.ping(a)?;
        let (size, half, deadline) = (self.size, self.half, t0 + Duration::from_secs(10));
        // b: receive, check, answer
        wait_recv(b, deadline)?;
        if first_not(&b.mr, half, &mut self.buf, tag)?.is_some() {
            bail!("data check failed on ping {i}");
        }
        post_recv_upper(b, half)?;
        b.mr.fill_at(0, size, tag).context("fill_at")?;
        post_signaled(b, 2, SendOp::Send, size)?;
        // a: wait for the pong (its own send completion may come first)
        wait_recv(a, deadline)?;
        let rtt = t0.elapsed();
        post_recv_upper(a, half)?;
        // drain remaining send completions
        let mut wcs = [WorkCompletion::default(); 4];
        let _ = a.cq.poll(&mut wcs);
        let _ = b.cq.poll(&mut wcs);
        Ok(rtt.as_secs_f64() * 1e6 / 2.0)
    }

    /// One round trip against a [`SendEcho`] that another thread drives
    /// (the answering side on a core of its own, as a perftest server
    /// process is): `a` sends, waits for the echo and checks that every
    /// byte came back. Its one-way latency (RTT/2) in µs.
    ///
    /// The round ends, untimed, when the ping itself has completed (the
    /// echo's ACK, which leaves right behind the pong), so that every round
    /// starts with nothing in flight, as the raw ping-pong's do. A ping-pong
    /// running alone handles that ACK while its next ping's kick is in the
    /// kernel, off the timed path; in the bench other ping-pongs run between
    /// two of its rounds, and the ACK would wait for the next round's first
    /// poll, on its timed path (perf-notes, "The two-core round trip, stage
    /// by stage").
    pub fn round_echoed(&mut self, a: &mut Endpoint) -> Result<f64> {
        let (i, tag, t0) = self.ping(a)?;
        let deadline = t0 + Duration::from_secs(10);
        // The pong; the ping's own completion may come first.
        let mut completed = false;
        while a.wait_one(deadline)?.opcode != urnic::WcOpcode::Recv {
            completed = true;
        }
        let rtt = t0.elapsed();
        if let Some(at) = first_not(&a.mr, self.half, &mut self.buf, tag)? {
            bail!("data check failed on echo {i}: byte {at} of the pong is not the ping's");
        }
        post_recv_upper(a, self.half)?;
        if !completed && a.wait_one(deadline)?.opcode == urnic::WcOpcode::Recv {
            bail!("echo {i}: a second message came back for one ping");
        }
        Ok(rtt.as_secs_f64() * 1e6 / 2.0)
    }

    /// The answering side of this ping-pong for a thread of its own
    /// ([`SendEcho::step`]); `b` already has its receive posted by
    /// [`SendPingPong::new`].
    pub fn echo(&self) -> SendEcho {
        SendEcho { size: self.size, half: self.half, buf: vec![0; self.size] }
    }
}

/// The `b` side of a [`SendPingPong`] run one step at a time by a thread of
/// its own: every SEND it receives goes back to the sender byte for byte.
pub struct SendEcho {
    size: usize,
    half: usize,
    buf: Vec<u8>,
}

impl SendEcho {
    /// Run `b`'s datapath once ([`Endpoint::kick`]), then answer each SEND
    /// received: repost the receive, copy the message to the send area,
    /// send it back and run the datapath again. Send completions are
    /// consumed; an error completion is an error.
    pub fn step(&mut self, b: &mut Endpoint) -> Result<()> {
        b.kick();
        let mut wcs = [WorkCompletion::default(); 4];
        let n = b.cq.poll(&mut wcs).context("poll_cq")?;
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                bail!("echo: completion error: {:?} (wr_id {})", wc.status, wc.wr_id);
            }
            if wc.opcode != urnic::WcOpcode::Recv {
                continue;
            }
            b.mr.read_at(self.half, &mut self.buf).context("read_at")?;
            post_recv_upper(b, self.half)?;
            b.mr.write_at(0, &self.buf).context("write_at")?;
            post_signaled(b, 2, SendOp::Send, self.size)?;
            // The answer leaves now, as it would from an application whose
            // next call polls its own device (the thread's other steps
            // run between two calls of this one).
            b.kick();
        }
        Ok(())
    }
}

/// WRITE ping-pong latency (ib_write_lat): `a` writes `size` bytes into
/// `b`'s buffer whose last byte counts the iterations, `b` spins on that
/// byte and writes back the same way. One-way µs (RTT/2) per round trip.
pub fn write_lat_samples(a: &mut Endpoint, b: &mut Endpoint, size: usize, iters: usize) -> Result<Vec<f64>> {
    let mut pp = WritePingPong::new(a, b, size)?;
    let samples = (0..iters).map(|_| pp.round(a, b)).collect::<Result<Vec<_>>>()?;
    pp.finish(a, b)?;
    Ok(samples)
}

/// [`write_lat_samples`] one round trip at a time; [`WritePingPong::finish`]
/// waits for the last WRITE completions.
pub struct WritePingPong {
    size: usize,
    half: [usize; 2],
    to_a: RemoteAddr,
    to_b: RemoteAddr,
    rounds: usize,
    /// Completions so far, per side (every WRITE is signaled).
    done: [usize; 2],
    /// Where an echo is read back for its check.
    buf: Vec<u8>,
}

impl WritePingPong {
    /// Check `size` and clear both landing areas (each side sends from the
    /// lower half of its region and is written into the upper half).
    pub fn new(a: &mut Endpoint, b: &mut Endpoint, size: usize) -> Result<WritePingPong> {
        if size == 0 || size > a.mr.len().min(b.mr.len()) / 2 {
            bail!("write_lat: {size} bytes do not fit half the buffer");
        }
        let half = [a.mr.len() / 2, b.mr.len() / 2];
        a.mr.fill_at(half[0], size, 0).context("fill_at")?;
        b.mr.fill_at(half[1], size, 0).context("fill_at")?;
        let to_b = RemoteAddr { addr: b.mr.addr() + half[1] as u64, rkey: b.mr.rkey() };
        let to_a = RemoteAddr { addr: a.mr.addr() + half[0] as u64, rkey: a.mr.rkey() };
        Ok(WritePingPong { size, half, to_a, to_b, rounds: 0, done: [0; 2], buf: vec![0; size] })
    }

    /// Spin until the last byte of `ep`'s landing area (at `half`) reads `tag`.
    fn spin(&self, ep: &Endpoint, half: usize, tag: u8, deadline: Instant) -> Result<()> {
        let mut deadline = SpinDeadline::new(deadline);
        while landed_tag(&ep.mr, half, self.size) != tag {
            if deadline.passed() {
                bail!("write_lat: the peer's WRITE did not land within 10 s");
            }
            ep.kick();
        }
        Ok(())
    }

    /// Poll `ep`'s completions into side `side`'s count.
    fn drain(&mut self, ep: &Endpoint, side: usize) -> Result<()> {
        let mut wcs = [WorkCompletion::default(); 8];
        let n = ep.cq.poll(&mut wcs).context("poll_cq")?;
        self.done[side] += n;
        match wcs[..n].iter().find(|w| w.status != WcStatus::Success) {
            Some(w) => Err(anyhow!("write_lat: completion {:?}", w.status)),
            None => Ok(()),
        }
    }

    /// Start the next round: fill `a`'s send area with its tag (and
    /// `answer`'s, the side that writes back, untimed), then post `a`'s
    /// WRITE. The round's number, its tag, when it started.
    fn ping(&mut self, a: &mut Endpoint, answer: Option<&mut Endpoint>) -> Result<(usize, u8, Instant)> {
        let i = self.rounds;
        self.rounds += 1;
        let tag = (i % 255 + 1) as u8;
        a.mr.fill_at(0, self.size, tag).context("fill_at")?;
        if let Some(b) = answer {
            b.mr.fill_at(0, self.size, tag).context("fill_at")?;
        }
        let t0 = Instant::now();
        post_signaled(a, 3, SendOp::Write { remote: self.to_b }, self.size)?;
        Ok((i, tag, t0))
    }

    /// One round trip; its one-way latency (RTT/2) in µs.
    pub fn round(&mut self, a: &mut Endpoint, b: &mut Endpoint) -> Result<f64> {
        let (_, tag, t0) = self.ping(a, Some(b))?;
        let (size, deadline) = (self.size, t0 + Duration::from_secs(10));
        self.spin(b, self.half[1], tag, deadline)?;
        post_signaled(b, 3, SendOp::Write { remote: self.to_a }, size)?;
        self.spin(a, self.half[0], tag, deadline)?;
        let one_way = t0.elapsed().as_secs_f64() * 1e6 / 2.0;
        self.drain(a, 0)?;
        self.drain(b, 1)?;
        Ok(one_way)
    }

    /// Wait for the last WRITE completions, so the next test starts with
    /// empty CQs and send queues.
    pub fn finish(&mut self, a: &mut Endpoint, b: &mut Endpoint) -> Result<()> {
        let n = self.rounds;
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.done[0] < n || self.done[1] < n {
            if Instant::now() > deadline {
                bail!("write_lat: {}/{n} and {}/{n} WRITEs completed", self.done[0], self.done[1]);
            }
            a.kick();
            b.kick();
            self.drain(a, 0)?;
            self.drain(b, 1)?;
        }
        Ok(())
    }

    /// One round trip against a [`WriteEcho`] that another thread drives:
    /// `a` writes, spins until the echo's WRITE lands and checks every byte
    /// of it. Its one-way latency (RTT/2) in µs.
    ///
    /// As [`SendPingPong::round_echoed`], the round ends, untimed, when `a`'s
    /// WRITE has completed (the echo's ACK comes after its write-back).
    pub fn round_echoed(&mut self, a: &mut Endpoint) -> Result<f64> {
        let (i, tag, t0) = self.ping(a, None)?;
        let deadline = t0 + Duration::from_secs(10);
        self.spin(a, self.half[0], tag, deadline)?;
        let one_way = t0.elapsed().as_secs_f64() * 1e6 / 2.0;
        if let Some(at) = first_not(&a.mr, self.half[0], &mut self.buf, tag)? {
            bail!("write_lat: byte {at} of echo {i} is not the ping's");
        }
        let mut wait = SpinDeadline::new(deadline);
        self.drain(a, 0)?;
        while self.done[0] < self.rounds {
            if wait.passed() {
                bail!("write_lat: WRITE {i} did not complete within 10 s");
            }
            a.kick();
            self.drain(a, 0)?;
        }
        Ok(one_way)
    }

    /// The answering side of this ping-pong for a thread of its own
    /// ([`WriteEcho::step`]).
    pub fn echo(&self) -> WriteEcho {
        WriteEcho { size: self.size, half: self.half[1], to_a: self.to_a, last: 0, buf: vec![0; self.size], done: Arc::new(AtomicUsize::new(0)) }
    }

    /// [`WritePingPong::finish`] for [`WritePingPong::round_echoed`]: wait
    /// until `a`'s WRITEs and the echo's (counted in `echo_done`) have all
    /// completed.
    pub fn finish_echoed(&mut self, a: &mut Endpoint, echo_done: &AtomicUsize) -> Result<()> {
        let n = self.rounds;
        let deadline = Instant::now() + Duration::from_secs(10);
        let echoed = || echo_done.load(Ordering::Acquire);
        while self.done[0] < n || echoed() < n {
            if Instant::now() > deadline {
                bail!("write_lat: {}/{n} and {}/{n} WRITEs completed", self.done[0], echoed());
            }
            a.kick();
            self.drain(a, 0)?;
        }
        Ok(())
    }
}

/// The `b` side of a [`WritePingPong`] run one step at a time by a thread
/// of its own: each new tag that lands in `b`'s area is written back to `a`
/// byte for byte.
pub struct WriteEcho {
    size: usize,
    half: usize,
    to_a: RemoteAddr,
    /// The tag of the last WRITE answered (0: none yet).
    last: u8,
    buf: Vec<u8>,
    /// WRITEs of this echo completed so far.
    pub done: Arc<AtomicUsize>,
}

impl WriteEcho {
    /// Run `b`'s datapath once ([`Endpoint::kick`]); when a new tag has
    /// landed in the last byte of `b`'s area, WRITE the area's bytes back
    /// and run the datapath again; count `b`'s completions (an error
    /// completion is an error).
    pub fn step(&mut self, b: &mut Endpoint) -> Result<()> {
        b.kick();
        let tag = landed_tag(&b.mr, self.half, self.size);
        if tag != self.last {
            self.last = tag;
            b.mr.read_at(self.half, &mut self.buf).context("read_at")?;
            b.mr.write_at(0, &self.buf).context("write_at")?;
            post_signaled(b, 3, SendOp::Write { remote: self.to_a }, self.size)?;
            b.kick();
        }
        let mut wcs = [WorkCompletion::default(); 8];
        let n = b.cq.poll(&mut wcs).context("poll_cq")?;
        if let Some(w) = wcs[..n].iter().find(|w| w.status != WcStatus::Success) {
            bail!("write_lat echo: completion {:?}", w.status);
        }
        self.done.fetch_add(n, Ordering::Release);
        Ok(())
    }
}

/// Print a perftest-style banner.
pub fn banner(title: &str, device: &str, mtu: u32, depth: usize) -> Result<()> {
    outln!("{RULE}")?;
    outln!("                    {title}")?;
    outln!(" Number of qps   : 1\t\tTransport type : IB")?;
    outln!(" Connection type : RC\t\tUsing SRQ      : OFF")?;
    outln!(" Device          : {device}")?;
    outln!(" TX depth        : {depth}")?;
    outln!(" Mtu             : {mtu}[B]")?;
    outln!(" Link type       : Ethernet")?;
    outln!(" GID index       : 1")?;
    outln!("{RULE}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spin_deadline_is_looked_at_every_so_many_spins() {
        // Passed already: seen at the EVERY-th spin, not before, and again
        // EVERY spins later.
        let mut d = SpinDeadline::new(Instant::now() - Duration::from_secs(1));
        for _ in 1..SpinDeadline::EVERY {
            assert!(!d.passed());
        }
        assert!(d.passed());
        for _ in 1..SpinDeadline::EVERY {
            assert!(!d.passed());
        }
        assert!(d.passed());
        // An hour away: never seen as passed.
        let mut d = SpinDeadline::new(Instant::now() + Duration::from_secs(3600));
        assert!((0..4 * SpinDeadline::EVERY).all(|_| !d.passed()));
    }

    #[test]
    fn a_stall_is_seen_only_after_spins_without_progress() {
        // No time allowed: the first look (EVERY-th idle spin) starts the
        // watch, the second (EVERY spins later) sees the stall.
        let mut w = StallWatch::new(Duration::ZERO);
        assert!((0..SpinDeadline::EVERY).all(|_| !w.stalled()));
        assert!((1..SpinDeadline::EVERY).all(|_| !w.stalled()));
        assert!(w.stalled());
        // Progress in between starts it over: never two looks in a row.
        let mut w = StallWatch::new(Duration::ZERO);
        for _ in 0..4 {
            assert!((0..2 * SpinDeadline::EVERY - 1).all(|_| !w.stalled()));
            w.progress();
        }
        // An hour allowed: never stalled.
        let mut w = StallWatch::new(Duration::from_secs(3600));
        assert!((0..8 * SpinDeadline::EVERY).all(|_| !w.stalled()));
    }

    /// Two connected endpoints on an in-memory link, each driving its own
    /// device (Manual mode).
    fn memory_pair() -> (Endpoint, Endpoint) {
        let hub = urnic::MemHub::new(1);
        let open = |name: &str, last: u8| {
            let mut c = urnic::DeviceConfig::memory(&hub, name, [0x02, 0, 0, 0, 0, last], [10, 0, 0, last]);
            c.datapath = urnic::DatapathMode::Manual;
            urnic::open_device(c).expect("open_device")
        };
        let (ca, cb) = (open("pp0", 1), open("pp1", 2));
        let mut a = Endpoint::new(&ca, 16384, 16).expect("endpoint a");
        let mut b = Endpoint::new(&cb, 16384, 16).expect("endpoint b");
        a.drive = vec![ca];
        b.drive = vec![cb];
        connect_pair(&a, &b).expect("connect");
        (a, b)
    }

    /// Run `step` on `b` on a thread of its own until `stop`.
    fn answering(
        mut b: Endpoint,
        mut step: impl FnMut(&mut Endpoint) -> Result<()> + Send + 'static,
    ) -> (Arc<std::sync::atomic::AtomicBool>, std::thread::JoinHandle<Result<Endpoint>>) {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let t = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                step(&mut b)?;
            }
            Ok(b)
        });
        (stop, t)
    }

    #[test]
    fn bandwidth_runs_with_cq_moderation_complete_every_wr_once() {
        let (mut a, mut b) = memory_pair();
        // One thread drives both devices (bw kicks only `a`'s list).
        a.drive.extend(b.drive.clone());
        assert_eq!((perftest_cq_mod(64, 128), perftest_cq_mod(64, 16), perftest_cq_mod(8192, 128), perftest_cq_mod(8193, 128)), (100, 16, 100, 1));
        for op in BwOp::ALL {
            // 250 is no multiple of 7: the last WR is signalled on its own.
            for signal_every in [1, 7, 16] {
                let r = bw(&mut a, &mut b, op, 64, 250, 16, signal_every).unwrap_or_else(|e| panic!("{} every {signal_every}: {e:#}", op.name()));
                assert_eq!((r.bytes, r.iters), (64, 250));
                let mut left = vec![WorkCompletion::default(); 4];
                assert_eq!(a.cq.poll(&mut left).expect("poll"), 0, "{}: no completion left over", op.name());
            }
        }
    }

    #[test]
    fn send_ping_pong_against_an_echo_on_another_thread() {
        let (mut a, mut b) = memory_pair();
        let mut pp = SendPingPong::new(&mut a, &mut b, 24).expect("ping-pong");
        let mut echo = pp.echo();
        let (stop, t) = answering(b, move |b| echo.step(b));
        let mut left = [WorkCompletion::default(); 4];
        for i in 0..300 {
            let one_way = pp.round_echoed(&mut a).expect("round");
            assert!(one_way > 0.0);
            // The round took the ping's own completion too: nothing of it
            // is left to come (the next round starts as the raw one does).
            for _ in 0..8 {
                a.kick();
            }
            assert_eq!(a.cq.poll(&mut left).expect("poll"), 0, "round {i} left a completion behind");
        }
        stop.store(true, Ordering::Relaxed);
        let b = t.join().expect("echo thread").expect("echo");
        // Every ping found its receive reposted in time: no RNR NAK either way.
        let (sa, sb) = (a.qp.stats().expect("stats"), b.qp.stats().expect("stats"));
        assert_eq!((sa.resp_rnr_naks_sent, sb.resp_rnr_naks_sent), (0, 0));
        assert!(sa.rx_packets >= 300 && sb.rx_packets >= 300, "{sa:?} {sb:?}");
    }

    #[test]
    fn write_ping_pong_against_an_echo_on_another_thread() {
        let (mut a, mut b) = memory_pair();
        let mut pp = WritePingPong::new(&mut a, &mut b, 40).expect("ping-pong");
        let mut echo = pp.echo();
        let done = echo.done.clone();
        let (stop, t) = answering(b, move |b| echo.step(b));
        // More rounds than tags (255): a tag comes back after a full cycle.
        for i in 0..600 {
            pp.round_echoed(&mut a).expect("round");
            // Each round waited for its own WRITE's completion.
            assert_eq!(pp.done[0], i + 1);
        }
        pp.finish_echoed(&mut a, &done).expect("every WRITE completes");
        stop.store(true, Ordering::Relaxed);
        t.join().expect("echo thread").expect("echo");
        assert_eq!(done.load(Ordering::Acquire), 600);
    }

    #[test]
    fn an_echo_that_changes_the_data_is_caught() {
        let (mut a, mut b) = memory_pair();
        let mut pp = SendPingPong::new(&mut a, &mut b, 16).expect("ping-pong");
        let mut echo = pp.echo();
        // The answering side's datapath runs, then its receive area is
        // overwritten before the echo reads it: a ping that landed in that
        // run goes back changed, and the pinger must see it.
        let half = echo.half;
        let (stop, t) = answering(b, move |b| {
            b.kick();
            b.mr.fill_at(half, 16, 0xee)?;
            echo.step(b)
        });
        let mut failed = None;
        for _ in 0..50 {
            if let Err(e) = pp.round_echoed(&mut a) {
                failed = Some(format!("{e:#}"));
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
        let _ = t.join();
        assert!(failed.as_deref().is_some_and(|e| e.contains("not the ping's")), "{failed:?}");
    }
}
