//! urnic's side of `urnic bench`: two connected endpoints on the veth pair
//! (one core: both devices run-to-completion on the application's thread;
//! two: device B polled by a second thread), the 64 KiB WRITE bandwidth,
//! the small-message rate and latencies, many QPs on one device, and the
//! bandwidth sweeps of `--report`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use urnic::{open_af_xdp, Context, DatapathMode, XskConfig};
use urnic_datapath::netns::VethPair;

use super::metrics::{cpu_self, rss, UserClock};
use super::Cores;
use crate::perf::{bw, connect_pair, send_lat_samples, write_lat_samples, BwOp, Endpoint};

/// A thread polling one device (or running any polling step) until dropped.
pub(super) struct Poller {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Poller {
    fn spawn(ctx: Context) -> Poller {
        Poller::spawn_loop(move || {
            ctx.poll();
        })
    }

    /// Run `step` over and over on a thread of its own until dropped.
    pub(super) fn spawn_loop(mut step: impl FnMut() + Send + 'static) -> Poller {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                step();
            }
        });
        Poller { stop, thread: Some(thread) }
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Two connected urnic endpoints on a veth pair. Field order is drop order:
/// the poller stops before the endpoints go.
pub(super) struct Rig {
    _poller: Option<Poller>,
    pub(super) ea: Endpoint,
    pub(super) eb: Endpoint,
}

/// Open urnic devices on both ends of `pair` (`tag`0/1), connect an RC QP
/// pair with `buf`-byte regions, and drive them as `cores` says.
pub(super) fn rig(pair: &VethPair, cores: Cores, buf: usize, tag: &str) -> Result<Rig> {
    let open = |end: usize| {
        let ctx = open_af_xdp(Some(&pair.ns[end]), &format!("{tag}{end}"), &XskConfig::new(&pair.ifname[end]), DatapathMode::Manual)
            .context("open_af_xdp")?;
        // `urnic stat` shows what bench runs (a snapshot every 250 ms).
        crate::stat::publish(&ctx);
        anyhow::Ok(ctx)
    };
    let (a, b) = (open(0)?, open(1)?);
    let buf = buf.max(16384).div_ceil(4096) * 4096;
    let mut ea = Endpoint::new(&a, buf, 128)?;
    let mut eb = Endpoint::new(&b, buf, 128)?;
    let poller = match cores {
        Cores::One => {
            ea.drive = vec![a.clone(), b.clone()];
            eb.drive = vec![a.clone(), b.clone()];
            None
        }
        Cores::Two => {
            // The application's thread drives A whichever endpoint it waits on.
            ea.drive = vec![a.clone()];
            eb.drive = vec![a.clone()];
            Some(Poller::spawn(b.clone()))
        }
    };
    connect_pair(&ea, &eb)?;
    Ok(Rig { _poller: poller, ea, eb })
}

/// Messages per bandwidth point: about 64 MiB, 200..20,000 messages.
fn iters_for(size: usize) -> usize {
    (64usize << 20).div_ceil(size).clamp(200, 20_000)
}

/// Warm-up before a timed bandwidth measurement, as the raw ceiling has:
/// `size`-byte WRITEs for at least this long on a fresh rig (the first
/// milliseconds of new devices, the kernel's page pools and the caches are
/// not the steady state the ceiling is measured in).
const WARMUP: Duration = Duration::from_millis(200);

/// How long a 64 KiB WRITE measurement runs: the raw ceiling's window
/// (`raw_afxdp(.., 1.0)`), so that both sides of a ratio average the host's
/// noise over the same time. A fixed count (6,000 WRITEs) ran 0.23 s at
/// 1.7 GB/s on two cores against the ceiling's 1 s there, and a stall of a
/// few milliseconds moved that row's ratio by several hundredths.
pub(super) const WRITE_64K_SECS: f64 = 1.0;

/// 64 KiB WRITEs for about `secs` at the warm-up's rate `bytes_per_s`
/// (1,000..40,000: a rate read wrong by a stall still gives a window of
/// useful length).
fn write_64k_iters(bytes_per_s: f64, secs: f64) -> usize {
    let n = bytes_per_s * secs / 65536.0;
    if n.is_finite() {
        (n as usize).clamp(1_000, 40_000)
    } else {
        1_000
    }
}

/// 64-byte WRITEs timed for the message rate (about 0.5 s).
const MSG_RATE_ITERS: usize = 150_000;

/// Run `size`-byte WRITEs untimed for [`WARMUP`]; their rate, bytes per
/// second (what a timed run of the same size can expect).
fn warm_up(rig: &mut Rig, size: usize) -> Result<f64> {
    let start = Instant::now();
    let until = start + WARMUP;
    let mut bytes = 0usize;
    while Instant::now() < until {
        bw(&mut rig.ea, &mut rig.eb, BwOp::Write, size, 200, 128, 1).context("warm-up")?;
        bytes += 200 * size;
    }
    Ok(bytes as f64 / start.elapsed().as_secs_f64())
}

/// What one 64 KiB WRITE measurement gave.
pub(super) struct Write64k {
    /// MB/s of payload.
    pub(super) mbs: f64,
    /// CPU seconds (user + system, the whole process) per GB moved.
    pub(super) cpu_per_gb: f64,
}

/// urnic's 64 KiB WRITE MB/s on a fresh rig after the warm-up, over about
/// [`WRITE_64K_SECS`], and the CPU it took.
pub(super) fn urnic_write_64k(pair: &VethPair, cores: Cores, tag: &str) -> Result<Write64k> {
    let mut rig = rig(pair, cores, 2 * 65536, tag)?;
    let iters = write_64k_iters(warm_up(&mut rig, 65536)?, WRITE_64K_SECS);
    let cpu0 = cpu_self();
    let mbs = bw(&mut rig.ea, &mut rig.eb, BwOp::Write, 65536, iters, 128, 1).with_context(|| format!("{}: 64 KiB", cores.label()))?.avg_mbs;
    let cpu = cpu_self() - cpu0;
    Ok(Write64k { mbs, cpu_per_gb: cpu / ((65536 * iters) as f64 / 1e9) })
}

/// 64 KiB WRITEs per lap of the CPU measurement (about 40 ms each).
const USER_CPU_LAP: usize = 1_000;

/// urnic's user CPU on one core over 64 KiB WRITEs on a fresh rig, after
/// the warm-up, laps until those counted ([`UserClock`]: no context switch
/// in them) ran `secs` or four times that passed: (user CPU seconds per
/// message of the thread that drives both devices, exact: its run time
/// less its time inside the sockets' system calls). On this kernel
/// `getrusage`'s user time is a sample per 4 ms tick: about ±15% over the
/// bandwidth rows' short runs, about ±5% over two seconds.
pub(super) fn urnic_user_cpu_64k(pair: &VethPair, secs: f64) -> Result<f64> {
    let mut rig = rig(pair, Cores::One, 2 * 65536, "bu")?;
    warm_up(&mut rig, 65536)?;
    let (start, mut clock) = (Instant::now(), UserClock::start());
    while clock.counted_run() < secs && start.elapsed().as_secs_f64() < 4.0 * secs {
        bw(&mut rig.ea, &mut rig.eb, BwOp::Write, 65536, USER_CPU_LAP, 128, 1).context("1 core: 64 KiB, user CPU")?;
        clock.lap(USER_CPU_LAP as f64);
    }
    clock.per_unit()
}

/// The 64-byte WRITE message rate on `rig` (after a warm-up): messages/s,
/// and the process's CPU seconds (user + system) per message. Every WRITE
/// is signalled, a completion each (stricter than `ib_write_bw`, which
/// signals one in 100: on veth that measured within 1% of this rate).
fn msg_rate(rig: &mut Rig, cores: Cores) -> Result<(f64, f64)> {
    warm_up(rig, 64)?;
    let c = cores.label();
    let cpu0 = cpu_self();
    let rate = bw(&mut rig.ea, &mut rig.eb, BwOp::Write, 64, MSG_RATE_ITERS, 128, 1).with_context(|| format!("{c}: 64 B"))?.avg_mbs * 1e6 / 64.0;
    Ok((rate, (cpu_self() - cpu0) / MSG_RATE_ITERS as f64))
}

/// urnic's 64-byte WRITE message rate on a fresh rig: messages/s and CPU
/// seconds per message.
pub(super) fn urnic_rate(pair: &VethPair, cores: Cores) -> Result<(f64, f64)> {
    msg_rate(&mut rig(pair, cores, 2 * 65536, "br")?, cores)
}

/// urnic's small-message figures on one rig: 64-byte WRITE message rate
/// (after a warm-up) and 8-byte SEND and WRITE latencies.
pub(super) fn urnic_small(pair: &VethPair, cores: Cores) -> Result<(f64, Vec<f64>, Vec<f64>)> {
    let mut rig = rig(pair, cores, 2 * 65536, "bs")?;
    let (rate, _) = msg_rate(&mut rig, cores)?;
    let c = cores.label();
    let send = send_lat_samples(&mut rig.ea, &mut rig.eb, 8, 3000).with_context(|| format!("{c}: send_lat"))?;
    let write = write_lat_samples(&mut rig.ea, &mut rig.eb, 8, 3000).with_context(|| format!("{c}: write_lat"))?;
    Ok((rate, send, write))
}

/// `nqps` connected RC QP pairs on one pair of devices (one core), 64 KiB
/// WRITEs spread round-robin with 128 in flight: aggregate MB/s, and memory
/// per QP.
pub(super) fn many_qps(pair: &VethPair, nqps: usize, iters: usize) -> Result<(f64, f64)> {
    use urnic::{Access, Connect, Payload, QpCaps, QpInit, QpType, RemoteAddr, SendFlags, SendOp, SendWr, WcStatus, WorkCompletion};
    let a = open_af_xdp(Some(&pair.ns[0]), "many0", &XskConfig::new(&pair.ifname[0]), DatapathMode::Manual).context("open")?;
    let b = open_af_xdp(Some(&pair.ns[1]), "many1", &XskConfig::new(&pair.ifname[1]), DatapathMode::Manual).context("open")?;
    crate::stat::publish(&a);
    crate::stat::publish(&b);
    let (pa, pb) = (a.alloc_pd().context("pd")?, b.alloc_pd().context("pd")?);
    let acc = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let (ma, mb) = (pa.alloc_mr(65536, acc).context("mr")?, pb.alloc_mr(65536, acc).context("mr")?);
    let (ca, cb) = (a.create_cq(4096, None).context("cq")?, b.create_cq(4096, None).context("cq")?);
    let caps = QpCaps { max_send_wr: if nqps == 1 { 128 } else { 16 }, max_recv_wr: 1, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let (ga, gb) = (a.query_gid(1, 1).context("gid")?, b.query_gid(1, 1).context("gid")?);
    let before = rss();
    let mut qps = Vec::with_capacity(nqps);
    for i in 0..nqps {
        let init = |cq| QpInit { qp_type: QpType::Rc, send_cq: cq, recv_cq: cq, srq: None, cap: caps, sq_sig_all: true };
        let (qa, qb) = (pa.create_qp(&init(&ca)).context("qp")?, pb.create_qp(&init(&cb)).context("qp")?);
        let psn = i as u32 + 1;
        qa.connect(&Connect { access: acc, ..Connect::new(qb.qp_num(), gb, psn, psn) }).context("connect")?;
        qb.connect(&Connect { access: acc, ..Connect::new(qa.qp_num(), ga, psn, psn) }).context("connect")?;
        qps.push((qa, qb));
    }
    let per_qp = (rss().saturating_sub(before)) as f64 / (2 * nqps) as f64;
    let remote = RemoteAddr { addr: mb.addr(), rkey: mb.rkey() };
    let mut wc = vec![WorkCompletion::default(); 256];
    let (mut posted, mut done) = (0usize, 0usize);
    let start = Instant::now();
    while done < iters {
        while posted < iters && posted - done < 128 {
            let (qa, _) = &qps[posted % nqps];
            let wr = SendWr {
                wr_id: posted as u64,
                op: SendOp::Write { remote },
                payload: Payload::Sgl(vec![ma.sge(0, 65536)]),
                flags: SendFlags::SIGNALED,
                ud: None,
            };
            qa.post_send(&wr).context("post")?;
            posted += 1;
        }
        a.poll();
        b.poll();
        let n = ca.poll(&mut wc).context("poll")?;
        if let Some(bad) = wc[..n].iter().find(|w| w.status != WcStatus::Success) {
            bail!("completion {:?}", bad.status);
        }
        done += n;
        if start.elapsed() > Duration::from_secs(120) {
            bail!("{nqps} QPs: only {done}/{iters} WRITEs in 120 s");
        }
    }
    Ok(((iters * 65536) as f64 / start.elapsed().as_secs_f64() / 1e6, per_qp))
}

/// Bandwidth (MB/s) per message size, for each operation.
pub(super) type Sweep = Vec<(BwOp, Vec<f64>)>;

/// Bandwidth (MB/s) of each op and size on a veth of `link_mtu`;
/// `starting` is told each operation as its sizes begin.
pub(super) fn sweep(link_mtu: u32, cores: Cores, sizes: &[usize], starting: &dyn Fn(BwOp)) -> Result<Sweep> {
    let _ = VethPair::sweep_stale();
    let pair = VethPair::create("sweep", link_mtu).context("namespaces (root)")?;
    let max = sizes.iter().copied().max().unwrap_or(65536);
    let mut rig = rig(&pair, cores, 2 * max, "sw")?;
    warm_up(&mut rig, 65536)?;
    let mut out = Vec::new();
    for op in BwOp::ALL {
        starting(op);
        let mut v = Vec::new();
        for &size in sizes {
            v.push(bw(&mut rig.ea, &mut rig.eb, op, size, iters_for(size), 128, 1)?.avg_mbs);
        }
        out.push((op, v));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iterations_per_point() {
        assert_eq!(iters_for(64), 20_000);
        assert_eq!(iters_for(1 << 20), 200);
    }

    #[test]
    fn the_64k_window_follows_the_warm_up_rate() {
        // 1.7 GB/s for 1 s: about 25,900 WRITEs; 0.7 GB/s: about 10,700.
        assert_eq!(write_64k_iters(1.7e9, 1.0), 25_939);
        assert_eq!(write_64k_iters(0.7e9, 1.0), 10_681);
        // A stalled warm-up or a nonsense rate still gives a usable window.
        assert_eq!(write_64k_iters(1e6, 1.0), 1_000);
        assert_eq!(write_64k_iters(1e12, 1.0), 40_000);
        assert_eq!(write_64k_iters(f64::NAN, 1.0), 1_000);
        assert_eq!(write_64k_iters(f64::INFINITY, 1.0), 1_000);
    }
}
