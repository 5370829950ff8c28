//! `urnic bench`: urnic against the baselines a user would pick, on the same
//! veth between two namespaces, in one run, with medians over several runs
//! and the ratios.
//!
//! urnic runs with one core (both devices run-to-completion on the
//! application's thread) and with two (device A on the application's thread,
//! device B polled by a second thread). Its baselines, measured on the same
//! veth in the same run:
//! - the raw AF_XDP ceiling: MTU-sized RoCE frames from one AF_XDP socket to
//!   the other through the same XDP program, doing nothing else — with one
//!   thread sending and receiving (the one-core budget) and with a sender and
//!   a receiver thread (two cores); and its ping-pong: one frame of an
//!   8-byte SEND's length bounced between the two sockets (the latency
//!   floor of any AF_XDP stack here);
//! - kernel TCP: single-stream throughput and 64-byte-write message rate
//!   (iperf3), 8-byte ping-pong latency (our echo over TCP_NODELAY);
//! - kernel UDP: 8-byte ping-pong latency.
//!
//! Bandwidth against the ceiling is measured at the same footing on both
//! sides: each after a 200 ms warm-up, for about a second, and next to each
//! other in the order urnic, ceiling, ceiling, urnic (the host's speed drifts
//! over seconds; the bracket cancels a steady drift).
//!
//! `--report DIR` adds bandwidth sweeps (WRITE, READ, SEND; 64 B..1 MiB; MTU
//! 1024 and 4096; one and two cores) and writes report.md, sweep.csv,
//! bandwidth_{write,read,send}.png and latency.png (distributions).

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use urnic::{open_af_xdp, Context, DatapathMode, XskConfig};
use urnic_datapath::netns::{in_netns, VethPair};
use urnic_datapath::{Port, XskPort};

use crate::perf::{bw, connect_pair, send_lat_samples, write_lat_samples, BwOp, Endpoint};
use crate::plot::{linear_ticks, nice_max, Canvas, Panel, BLACK, COLORS, H, W};

/// Median (sorts `v`); NaN if empty.
fn median(v: &mut [f64]) -> f64 {
    pct(v, 0.5)
}

/// The `p` quantile (nearest rank; sorts `v`); NaN if empty.
fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len().max(1)) - 1;
    v.get(i).copied().unwrap_or(f64::NAN)
}

/// Resident memory of this process, bytes.
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()))
        .map_or(0, |pages| pages * 4096)
}

fn cpu(who: i32) -> f64 {
    // SAFETY: getrusage fills the struct we pass.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(who, &mut ru);
        ru.ru_utime.tv_sec as f64 + ru.ru_utime.tv_usec as f64 / 1e6 + ru.ru_stime.tv_sec as f64 + ru.ru_stime.tv_usec as f64 / 1e6
    }
}

/// CPU time (user + system) of this process so far (all its threads), s.
fn cpu_self() -> f64 {
    cpu(libc::RUSAGE_SELF)
}

/// CPU time of finished children (iperf3), seconds.
fn cpu_children() -> f64 {
    cpu(libc::RUSAGE_CHILDREN)
}

fn err<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |e| format!("{what}: {e}")
}

/// How many cores urnic gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cores {
    /// Both devices run-to-completion on the application's thread.
    One,
    /// Device A on the application's thread, device B on its own thread.
    Two,
}

impl Cores {
    fn label(self) -> &'static str {
        match self {
            Cores::One => "1 core",
            Cores::Two => "2 cores",
        }
    }
}

/// A thread polling one device until dropped.
struct Poller {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Poller {
    fn spawn(ctx: Context) -> Poller {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                ctx.poll();
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
struct Rig {
    _poller: Option<Poller>,
    ea: Endpoint,
    eb: Endpoint,
}

fn rig(pair: &VethPair, cores: Cores, buf: usize, tag: &str) -> Result<Rig, String> {
    let a = open_af_xdp(Some(&pair.ns[0]), &format!("{tag}0"), &XskConfig::new(&pair.ifname[0]), DatapathMode::Manual).map_err(err("open_af_xdp"))?;
    let b = open_af_xdp(Some(&pair.ns[1]), &format!("{tag}1"), &XskConfig::new(&pair.ifname[1]), DatapathMode::Manual).map_err(err("open_af_xdp"))?;
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

/// What one urnic configuration measured.
#[derive(Default)]
struct UrnicRun {
    /// 64 KiB WRITE MB/s at MTU 1024 and at MTU 4096.
    write_64k: f64,
    write_64k_mtu4096: f64,
    /// 64 B WRITE messages per second.
    msg_rate: f64,
    /// CPU seconds per GB in the 64 KiB WRITE run at MTU 1024.
    cpu_per_gb: f64,
    /// 8 B one-way latency samples, µs.
    send_lat: Vec<f64>,
    write_lat: Vec<f64>,
}

/// Warm-up before a timed bandwidth measurement, as the raw ceiling has:
/// `size`-byte WRITEs for at least this long on a fresh rig (the first
/// milliseconds of new devices, the kernel's page pools and the caches are
/// not the steady state the ceiling is measured in).
const WARMUP: Duration = Duration::from_millis(200);

/// 64 KiB WRITEs timed per measurement: 0.4-1.5 s here, comparable to the
/// ceiling's 1 s (the earlier 3000, about 0.25 s without a warm-up, measured
/// about a tenth lower than a long run of the same code).
const WRITE_64K_ITERS: usize = 6_000;

/// 64-byte WRITEs timed for the message rate (about 0.5 s).
const MSG_RATE_ITERS: usize = 150_000;

/// Run `size`-byte WRITEs untimed for [`WARMUP`].
fn warm_up(rig: &mut Rig, size: usize) -> Result<(), String> {
    let until = Instant::now() + WARMUP;
    while Instant::now() < until {
        bw(&mut rig.ea, &mut rig.eb, BwOp::Write, size, 200, 128).map_err(|e| format!("warm-up: {e}"))?;
    }
    Ok(())
}

/// urnic's 64 KiB WRITE MB/s on a fresh rig after the warm-up, and the
/// CPU seconds per GB it took.
fn urnic_write_64k(pair: &VethPair, cores: Cores, tag: &str) -> Result<(f64, f64), String> {
    let mut rig = rig(pair, cores, 2 * 65536, tag)?;
    warm_up(&mut rig, 65536)?;
    let cpu0 = cpu_self();
    let mbs = bw(&mut rig.ea, &mut rig.eb, BwOp::Write, 65536, WRITE_64K_ITERS, 128).map_err(|e| format!("{}: 64 KiB: {e}", cores.label()))?.avg_mbs;
    Ok((mbs, (cpu_self() - cpu0) / ((65536 * WRITE_64K_ITERS) as f64 / 1e9)))
}

/// Measure urnic and its raw ceiling next to each other, in the order
/// urnic, ceiling, ceiling, urnic: the host's speed drifts over seconds,
/// and the bracket cancels a steady drift. Returns the two means.
fn bracketed(mut urnic: impl FnMut() -> Result<f64, String>, mut ceiling: impl FnMut() -> Result<f64, String>) -> Result<(f64, f64), String> {
    let u1 = urnic()?;
    let c1 = ceiling()?;
    let c2 = ceiling()?;
    let u2 = urnic()?;
    Ok(((u1 + u2) / 2.0, (c1 + c2) / 2.0))
}

/// urnic's small-message figures on one rig: 64-byte WRITE message rate
/// (after a warm-up) and 8-byte SEND and WRITE latencies.
fn urnic_small(pair: &VethPair, cores: Cores) -> Result<(f64, Vec<f64>, Vec<f64>), String> {
    let mut rig = rig(pair, cores, 2 * 65536, "bs")?;
    warm_up(&mut rig, 64)?;
    let rate = bw(&mut rig.ea, &mut rig.eb, BwOp::Write, 64, MSG_RATE_ITERS, 128).map_err(|e| format!("{}: 64 B: {e}", cores.label()))?.avg_mbs * 1e6 / 64.0;
    let send = send_lat_samples(&mut rig.ea, &mut rig.eb, 8, 3000).map_err(|e| format!("{}: send_lat: {e}", cores.label()))?;
    let write = write_lat_samples(&mut rig.ea, &mut rig.eb, 8, 3000).map_err(|e| format!("{}: write_lat: {e}", cores.label()))?;
    Ok((rate, send, write))
}

/// `nqps` connected RC QP pairs on one pair of devices (one core), 64 KiB
/// WRITEs spread round-robin with 128 in flight: aggregate MB/s, and memory
/// per QP.
fn many_qps(pair: &VethPair, nqps: usize, iters: usize) -> Result<(f64, f64), String> {
    use urnic::{Access, Connect, Payload, QpCaps, QpInit, QpType, RemoteAddr, SendFlags, SendOp, SendWr, WcStatus, WorkCompletion};
    let a = open_af_xdp(Some(&pair.ns[0]), "many0", &XskConfig::new(&pair.ifname[0]), DatapathMode::Manual).map_err(err("open"))?;
    let b = open_af_xdp(Some(&pair.ns[1]), "many1", &XskConfig::new(&pair.ifname[1]), DatapathMode::Manual).map_err(err("open"))?;
    let (pa, pb) = (a.alloc_pd().map_err(err("pd"))?, b.alloc_pd().map_err(err("pd"))?);
    let acc = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let (ma, mb) = (pa.alloc_mr(65536, acc).map_err(err("mr"))?, pb.alloc_mr(65536, acc).map_err(err("mr"))?);
    let (ca, cb) = (a.create_cq(4096, None).map_err(err("cq"))?, b.create_cq(4096, None).map_err(err("cq"))?);
    let caps = QpCaps { max_send_wr: if nqps == 1 { 128 } else { 16 }, max_recv_wr: 1, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let (ga, gb) = (a.query_gid(1, 1).map_err(err("gid"))?, b.query_gid(1, 1).map_err(err("gid"))?);
    let before = rss();
    let mut qps = Vec::with_capacity(nqps);
    for i in 0..nqps {
        let qa = pa.create_qp(&QpInit { qp_type: QpType::Rc, send_cq: &ca, recv_cq: &ca, srq: None, cap: caps, sq_sig_all: true }).map_err(err("qp"))?;
        let qb = pb.create_qp(&QpInit { qp_type: QpType::Rc, send_cq: &cb, recv_cq: &cb, srq: None, cap: caps, sq_sig_all: true }).map_err(err("qp"))?;
        let psn = i as u32 + 1;
        qa.connect(&Connect { access: acc, ..Connect::new(qb.qp_num(), gb, psn, psn) }).map_err(err("connect"))?;
        qb.connect(&Connect { access: acc, ..Connect::new(qa.qp_num(), ga, psn, psn) }).map_err(err("connect"))?;
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
            let wr = SendWr { wr_id: posted as u64, op: SendOp::Write { remote }, payload: Payload::Sgl(vec![ma.sge(0, 65536)]), flags: SendFlags::SIGNALED, ud: None };
            qa.post_send(&wr).map_err(err("post"))?;
            posted += 1;
        }
        a.poll();
        b.poll();
        let n = ca.poll(&mut wc).map_err(err("poll"))?;
        if let Some(bad) = wc[..n].iter().find(|w| w.status != WcStatus::Success) {
            return Err(format!("completion {:?}", bad.status));
        }
        done += n;
        if start.elapsed() > Duration::from_secs(120) {
            return Err(format!("{nqps} QPs: only {done}/{iters} WRITEs in 120 s"));
        }
    }
    Ok(((iters * 65536) as f64 / start.elapsed().as_secs_f64() / 1e6, per_qp))
}

/// A RoCE frame of `frame_len` bytes (a WRITE MIDDLE to a QPN nobody has,
/// valid ICRC) from end 0 to end 1 of `pair`.
fn raw_frame(pair: &VethPair, frame_len: usize) -> Result<Vec<u8>, String> {
    raw_frame_from(pair, 0, frame_len)
}

/// [`raw_frame`] sent from veth end `from` (0 or 1) to the other.
fn raw_frame_from(pair: &VethPair, from: usize, frame_len: usize) -> Result<Vec<u8>, String> {
    use rocev2::wire::*;
    let payload = frame_len.checked_sub(58).ok_or("raw frame shorter than its headers")?;
    let (from, to) = if from == 0 { (0, 1) } else { (1, 0) };
    let repr = FrameRepr {
        eth: EthernetRepr { dst: pair.mac[to], src: pair.mac[from], vlan: None, ethertype: 0x0800 },
        ip: IpRepr::V4(Ipv4Repr { src: pair.ipv4[from], dst: pair.ipv4[to], dscp: 0, ecn: 2, ident: 0, dont_frag: true, ttl: 64, protocol: 17, payload_len: 0 }),
        udp: UdpRepr { src_port: 50000, dst_port: ROCEV2_UDP_PORT, length: 0, checksum: 0 },
        transport: TransportRepr::bth_only(BthRepr::new(Opcode::RC_WRITE_MIDDLE, 0x77, rocev2::Psn::new(1))),
    };
    let mut f = vec![0u8; repr.frame_len(payload)];
    repr.emit(&vec![0x5a; payload], &mut f).map_err(|e| e.to_string())?;
    Ok(f)
}

/// Queue a copy of `frame` on `port` (no kick); whether it was queued.
fn queue_copy(port: &mut XskPort, frame: &[u8]) -> bool {
    let fill = &mut |buf: &mut [u8]| {
        let n = frame.len().min(buf.len());
        buf[..n].copy_from_slice(&frame[..n]);
        Some(n)
    };
    matches!(port.transmit_with(fill), Ok(true))
}

/// Push up to 64 copies of `frame` into `tx` and kick it; frames queued.
fn blast(tx: &mut XskPort, frame: &[u8]) -> u64 {
    let mut sent = 0;
    while sent < 64 && queue_copy(tx, frame) {
        sent += 1;
    }
    let _ = tx.flush();
    sent
}

/// Raw AF_XDP sockets on both veth ends (0, 1), with the XDP program.
fn raw_ports(pair: &VethPair) -> Result<(XskPort, XskPort), String> {
    let open = |end: usize| {
        let ifname = pair.ifname[end].clone();
        in_netns(Some(&pair.ns[end]), move || XskPort::open(&XskConfig::new(&ifname))).map_err(|e| e.to_string())?.map_err(|e| e.to_string())
    };
    Ok((open(0)?, open(1)?))
}

/// Receive up to `budget` frames on `port`; how many were `len` bytes long
/// (whole frames as handed up, not the descriptors they took: at 4154 bytes
/// a frame spans two UMEM chunks, and counting chunks once doubled the
/// ceiling). Frames of other lengths (IPv6 neighbour discovery) are passed over.
fn received_of_len(port: &mut XskPort, budget: usize, len: usize) -> u64 {
    let mut n = 0u64;
    let _ = port.receive(budget, &mut |f| n += u64::from(f.len() == len));
    n
}

/// The raw AF_XDP ceiling: frames per second delivered from one AF_XDP
/// socket to the other through the same XDP program, `frame_len`-byte RoCE
/// frames; one thread doing both (`Cores::One`) or a sender and a receiver.
fn raw_afxdp(pair: &VethPair, frame_len: usize, cores: Cores, secs: f64) -> Result<f64, String> {
    let frame = raw_frame(pair, frame_len)?;
    let (mut tx, mut rx) = raw_ports(pair)?;
    let len = frame.len();
    let count = move |rx: &mut XskPort| received_of_len(rx, 256, len);
    match cores {
        Cores::One => {
            let warm = Instant::now() + Duration::from_millis(200);
            while Instant::now() < warm {
                blast(&mut tx, &frame);
                count(&mut rx);
            }
            let (start, mut got) = (Instant::now(), 0u64);
            while start.elapsed().as_secs_f64() < secs {
                blast(&mut tx, &frame);
                got += count(&mut rx);
            }
            Ok(got as f64 / start.elapsed().as_secs_f64())
        }
        Cores::Two => {
            let stop = Arc::new(AtomicBool::new(false));
            let s2 = stop.clone();
            let sender = std::thread::spawn(move || {
                while !s2.load(Ordering::Relaxed) {
                    blast(&mut tx, &frame);
                }
            });
            let warm = Instant::now() + Duration::from_millis(200);
            while Instant::now() < warm {
                count(&mut rx);
            }
            let (start, mut got) = (Instant::now(), 0u64);
            while start.elapsed().as_secs_f64() < secs {
                got += count(&mut rx);
            }
            let pps = got as f64 / start.elapsed().as_secs_f64();
            stop.store(true, Ordering::Relaxed);
            let _ = sender.join();
            Ok(pps)
        }
    }
}

/// Frame length of an 8-byte SEND ONLY: Ethernet, IPv4, UDP, BTH, payload, ICRC.
const SEND8_FRAME: usize = 14 + 20 + 8 + 12 + 8 + 4;

/// Queue `frame` on `port` and kick it; whether it was queued.
fn send_one(port: &mut XskPort, frame: &[u8]) -> bool {
    let queued = queue_copy(port, frame);
    let _ = port.flush();
    queued
}

/// The raw AF_XDP ping-pong: one frame of urnic's 8-byte SEND length
/// bounced between the two AF_XDP sockets through the same XDP program,
/// nothing else: the latency floor any AF_XDP stack has here. One-way µs
/// (RTT/2). One thread polls both sockets (`Cores::One`), or the echo runs
/// on a thread of its own (`Cores::Two`), as urnic's two configurations do.
fn raw_afxdp_pingpong(pair: &VethPair, cores: Cores, iters: usize) -> Result<Vec<f64>, String> {
    let (ping, pong) = (raw_frame_from(pair, 0, SEND8_FRAME)?, raw_frame_from(pair, 1, SEND8_FRAME)?);
    let (mut a, mut b) = raw_ports(pair)?;
    let len = ping.len();
    let got = move |port: &mut XskPort| received_of_len(port, 64, len);
    let send = |port: &mut XskPort, frame: &[u8]| -> Result<(), String> {
        if send_one(port, frame) {
            Ok(())
        } else {
            Err("raw AF_XDP ping-pong: no transmit buffer".into())
        }
    };
    // Poll `port` until a frame of the ping's length arrives (2 s at most).
    let answer = move |port: &mut XskPort| -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(2);
        while got(port) == 0 {
            if Instant::now() > deadline {
                return Err("raw AF_XDP ping-pong: no answer in 2 s".into());
            }
        }
        Ok(())
    };
    match cores {
        Cores::One => timed_rounds(iters, || {
            send(&mut a, &ping)?;
            answer(&mut b)?;
            send(&mut b, &pong)?;
            answer(&mut a)
        }),
        Cores::Two => {
            let stop = Arc::new(AtomicBool::new(false));
            let s2 = stop.clone();
            let echo = std::thread::spawn(move || {
                while !s2.load(Ordering::Relaxed) {
                    for _ in 0..got(&mut b) {
                        send_one(&mut b, &pong);
                    }
                }
            });
            let samples = timed_rounds(iters, || {
                send(&mut a, &ping)?;
                answer(&mut a)
            });
            stop.store(true, Ordering::Relaxed);
            let _ = echo.join();
            samples
        }
    }
}

fn ip_of(pair: &VethPair, end: usize) -> String {
    let a = pair.ipv4[end];
    format!("{}.{}.{}.{}", a[0], a[1], a[2], a[3])
}

/// iperf3 single-stream TCP from end 1 to end 0: (Mb/s, CPU s per GB of
/// both iperf3 processes). `extra` adds client options (e.g. -l 64 -N).
fn iperf3(pair: &VethPair, secs: u32, extra: &[&str]) -> Result<(f64, f64), String> {
    let c0 = cpu_children();
    let mut server = Command::new("ip")
        .args(["netns", "exec", &pair.ns[0], "iperf3", "-s", "-1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("iperf3 (apt install iperf3; deploy/deps.sh test): {e}"))?;
    std::thread::sleep(Duration::from_millis(300));
    let ip = ip_of(pair, 0);
    let t = secs.to_string();
    let mut args = vec!["netns", "exec", &pair.ns[1], "iperf3", "-c", &ip, "-t", &t, "-J"];
    args.extend_from_slice(extra);
    let out = Command::new("ip").args(&args).output().map_err(|e| format!("iperf3: {e}"))?;
    let _ = server.wait();
    let text = String::from_utf8_lossy(&out.stdout);
    // "sum_received": { ... "bits_per_second": N
    let at = text.find("\"sum_received\"").ok_or_else(|| format!("iperf3 output without sum_received: {text}"))?;
    let bps = text[at..]
        .split("\"bits_per_second\":")
        .nth(1)
        .and_then(|v| v.trim_start().split(|c: char| c == ',' || c.is_whitespace() || c == '}').next())
        .and_then(|v| v.parse::<f64>().ok())
        .ok_or("iperf3: no bits_per_second")?;
    // CPU of both iperf3 processes (user + system, the kernel's TCP work in
    // their context; softirq work elsewhere is not counted) per GB moved.
    let gb = bps / 8.0 * f64::from(secs) / 1e9;
    Ok((bps / 1e6, (cpu_children() - c0) / gb))
}

/// Ping-pong rounds left out of the samples (caches, neighbours, the peer's
/// first wakeups).
const WARMUP_ROUNDS: usize = 100;

/// Run `round` (one round trip) `WARMUP_ROUNDS + iters` times and return the
/// one-way µs (RTT/2) of the last `iters`.
fn timed_rounds(iters: usize, mut round: impl FnMut() -> Result<(), String>) -> Result<Vec<f64>, String> {
    let mut samples = Vec::with_capacity(iters);
    for i in 0..WARMUP_ROUNDS + iters {
        let t = Instant::now();
        round()?;
        if i >= WARMUP_ROUNDS {
            samples.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
        }
    }
    Ok(samples)
}

/// Kernel UDP ping-pong of 8 bytes: one-way µs samples (RTT/2).
fn udp_pingpong(pair: &VethPair, iters: usize) -> Result<Vec<f64>, String> {
    let srv = in_netns(Some(&pair.ns[0]), || UdpSocket::bind("0.0.0.0:9999")).map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
    let n = iters + WARMUP_ROUNDS;
    let echo = std::thread::spawn(move || {
        let mut b = [0u8; 64];
        for _ in 0..n {
            if let Ok((k, from)) = srv.recv_from(&mut b) {
                let _ = srv.send_to(&b[..k], from);
            }
        }
    });
    let cli = in_netns(Some(&pair.ns[1]), || UdpSocket::bind("0.0.0.0:0")).map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
    cli.set_read_timeout(Some(Duration::from_secs(2))).map_err(|e| e.to_string())?;
    cli.connect((std::net::Ipv4Addr::from(pair.ipv4[0]), 9999)).map_err(|e| e.to_string())?;
    let mut b = [0u8; 64];
    let samples = timed_rounds(iters, || {
        cli.send(&[7u8; 8]).map_err(|e| e.to_string())?;
        cli.recv(&mut b).map(drop).map_err(|e| format!("UDP ping-pong: {e}"))
    })?;
    let _ = echo.join();
    Ok(samples)
}

/// Kernel TCP ping-pong of 8 bytes over one TCP_NODELAY connection:
/// one-way µs samples (RTT/2).
fn tcp_pingpong(pair: &VethPair, iters: usize) -> Result<Vec<f64>, String> {
    let listener = in_netns(Some(&pair.ns[0]), || TcpListener::bind("0.0.0.0:9998")).map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
    let n = iters + WARMUP_ROUNDS;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        let mut b = [0u8; 8];
        for _ in 0..n {
            s.read_exact(&mut b)?;
            s.write_all(&b)?;
        }
        Ok(())
    });
    let addr = std::net::SocketAddr::from((pair.ipv4[0], 9998));
    let mut cli = in_netns(Some(&pair.ns[1]), move || TcpStream::connect_timeout(&addr, Duration::from_secs(2)))
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("TCP ping-pong connect: {e}"))?;
    cli.set_nodelay(true).map_err(|e| e.to_string())?;
    cli.set_read_timeout(Some(Duration::from_secs(2))).map_err(|e| e.to_string())?;
    let mut b = [0u8; 8];
    let samples = timed_rounds(iters, || {
        cli.write_all(&[7u8; 8]).map_err(|e| e.to_string())?;
        cli.read_exact(&mut b).map_err(|e| format!("TCP ping-pong: {e}"))
    })?;
    echo.join().map_err(|_| "TCP echo thread panicked".to_string())?.map_err(|e| format!("TCP echo: {e}"))?;
    Ok(samples)
}

/// Frame length of one full-MTU WRITE MIDDLE/LAST packet: Ethernet, IPv4,
/// UDP, BTH, payload, ICRC.
fn write_frame_len(mtu: usize) -> usize {
    14 + 20 + 8 + 12 + mtu + 4
}

/// Frame length of a one-packet 64-byte WRITE ONLY (with its RETH).
const WRITE64_FRAME: usize = 14 + 20 + 8 + 12 + 16 + 64 + 4;

/// Everything one run measures.
#[derive(Default)]
struct Run {
    urnic: [UrnicRun; 2],
    /// Raw ceiling pps, [cores] at 1082-byte, 4154-byte and 138-byte frames.
    raw_1k: [f64; 2],
    raw_4k: [f64; 2],
    raw_small: [f64; 2],
    tcp_mbps: f64,
    tcp_mbps_9k: f64,
    tcp_cpu_per_gb: f64,
    tcp_msgs: f64,
    one_qp: f64,
    many_qp: f64,
    mem_per_qp: f64,
    udp_lat: Vec<f64>,
    tcp_lat: Vec<f64>,
    /// Raw AF_XDP ping-pong one-way µs, [cores].
    raw_lat: [Vec<f64>; 2],
}

fn one_run() -> Result<Run, String> {
    let _ = VethPair::sweep_stale();
    let pair = VethPair::create("bench", 1500).map_err(|e| format!("namespaces (root): {e}"))?;
    let pair9k = VethPair::create("bench", 9000).map_err(|e| format!("namespaces (root): {e}"))?;
    let mut r = Run::default();
    for (i, cores) in [Cores::One, Cores::Two].into_iter().enumerate() {
        // Each bandwidth figure next to its ceiling (see `bracketed`).
        let mut cpu = Vec::new();
        (r.urnic[i].write_64k, r.raw_1k[i]) = bracketed(
            || urnic_write_64k(&pair, cores, "bn").map(|(mbs, c)| {
                cpu.push(c);
                mbs
            }),
            || raw_afxdp(&pair, write_frame_len(1024), cores, 1.0),
        )?;
        r.urnic[i].cpu_per_gb = cpu.iter().sum::<f64>() / cpu.len().max(1) as f64;
        (r.urnic[i].write_64k_mtu4096, r.raw_4k[i]) =
            bracketed(|| urnic_write_64k(&pair9k, cores, "bj").map(|(mbs, _)| mbs), || raw_afxdp(&pair9k, write_frame_len(4096), cores, 1.0))?;
        (r.urnic[i].msg_rate, r.urnic[i].send_lat, r.urnic[i].write_lat) = urnic_small(&pair, cores)?;
        r.raw_small[i] = raw_afxdp(&pair, WRITE64_FRAME, cores, 1.0)?;
        r.raw_lat[i] = raw_afxdp_pingpong(&pair, cores, 3000)?;
    }
    (r.tcp_mbps, r.tcp_cpu_per_gb) = iperf3(&pair, 2, &[])?;
    r.tcp_mbps_9k = iperf3(&pair9k, 2, &[])?.0;
    r.tcp_msgs = iperf3(&pair, 2, &["-l", "64", "-N"])?.0 * 1e6 / 8.0 / 64.0;
    r.one_qp = many_qps(&pair, 1, 2000)?.0;
    (r.many_qp, r.mem_per_qp) = many_qps(&pair, 1000, 4000)?;
    r.udp_lat = udp_pingpong(&pair, 3000)?;
    r.tcp_lat = tcp_pingpong(&pair, 3000)?;
    Ok(r)
}

/// The measurements of several runs: medians, ratios, pooled latency samples.
struct Summary {
    table: String,
    /// (label, pooled one-way µs samples) for the latency plot.
    latency: Vec<(String, Vec<f64>)>,
}

fn summarize(runs: &[Run]) -> Summary {
    let med = |f: &dyn Fn(&Run) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>());
    let lat = |f: &dyn Fn(&Run) -> &Vec<f64>, p: f64| median(&mut runs.iter().map(|r| pct(&mut f(r).clone(), p)).collect::<Vec<_>>());
    let lat_of = |v: &Vec<f64>, p: f64| pct(&mut v.clone(), p);
    // The ratio column pairs urnic with its baseline within each run
    // (measured seconds apart) and takes the median of those ratios: the
    // host's load drifts between runs, and a ratio of medians can pair a
    // fast run's urnic with a slow run's baseline.
    let mut t = String::new();
    let _ = writeln!(t, "| measure (medians of {} runs, same veth; ratio: median of the per-run ratios) | urnic | baseline | urnic / baseline |", runs.len());
    t.push_str("|---|---|---|---|\n");
    let tcp = med(&|r| r.tcp_mbps) / 8.0;
    let tcp9k = med(&|r| r.tcp_mbps_9k) / 8.0;
    for (i, cores) in [Cores::One, Cores::Two].into_iter().enumerate() {
        let c = cores.label();
        let threads = if cores == Cores::One { "1 thread sending and receiving" } else { "a sender and a receiver thread" };
        let w = med(&|r| r.urnic[i].write_64k);
        let raw = med(&|r| r.raw_1k[i]) * 1024.0 / 1e6;
        let _ = writeln!(t, "| 64 KiB WRITE, MTU 1024, {c} vs raw AF_XDP ceiling ({}-byte frames, {threads}; payload bytes) | {w:.0} MB/s | {raw:.0} MB/s | {:.2} |", write_frame_len(1024), med(&|r| r.urnic[i].write_64k / (r.raw_1k[i] * 1024.0 / 1e6)));
        let w4 = med(&|r| r.urnic[i].write_64k_mtu4096);
        let raw4 = med(&|r| r.raw_4k[i]) * 4096.0 / 1e6;
        let _ = writeln!(t, "| 64 KiB WRITE, MTU 4096 (9000-byte veth), {c} vs raw AF_XDP ceiling ({}-byte frames, {threads}) | {w4:.0} MB/s | {raw4:.0} MB/s | {:.2} |", write_frame_len(4096), med(&|r| r.urnic[i].write_64k_mtu4096 / (r.raw_4k[i] * 4096.0 / 1e6)));
        let _ = writeln!(t, "| 64 KiB WRITE, MTU 1024, {c} vs kernel TCP single stream (iperf3, 1500-byte veth) | {w:.0} MB/s | {tcp:.0} MB/s | {:.2} |", med(&|r| r.urnic[i].write_64k / (r.tcp_mbps / 8.0)));
        let _ = writeln!(t, "| 64 KiB WRITE, MTU 4096, {c} vs kernel TCP single stream (iperf3, 9000-byte veth) | {w4:.0} MB/s | {tcp9k:.0} MB/s | {:.2} |", med(&|r| r.urnic[i].write_64k_mtu4096 / (r.tcp_mbps_9k / 8.0)));
        let m = med(&|r| r.urnic[i].msg_rate);
        let raws = med(&|r| r.raw_small[i]);
        let _ = writeln!(t, "| 64 B WRITE message rate, {c} vs raw AF_XDP ceiling ({WRITE64_FRAME}-byte frames, {threads}) | {:.2} M/s | {:.2} M/s | {:.2} |", m / 1e6, raws / 1e6, med(&|r| r.urnic[i].msg_rate / r.raw_small[i]));
        let tm = med(&|r| r.tcp_msgs);
        let _ = writeln!(t, "| 64 B WRITE message rate, {c} vs kernel TCP 64-byte writes (iperf3 -l 64 -N) | {:.2} M/s | {:.2} M/s | {:.2} |", m / 1e6, tm / 1e6, med(&|r| r.urnic[i].msg_rate / r.tcp_msgs));
        for (name, f) in [("SEND", (|r: &Run, i: usize| &r.urnic[i].send_lat) as fn(&Run, usize) -> &Vec<f64>), ("WRITE", |r: &Run, i: usize| &r.urnic[i].write_lat)] {
            for (p, pl) in [(0.5, "p50"), (0.99, "p99")] {
                let u = lat(&|r| f(r, i), p);
                let k = lat(&|r| &r.udp_lat, p);
                let kt = lat(&|r| &r.tcp_lat, p);
                let ru = med(&|r| lat_of(f(r, i), p) / lat_of(&r.udp_lat, p));
                let rt = med(&|r| lat_of(f(r, i), p) / lat_of(&r.tcp_lat, p));
                let kr = lat(&|r| &r.raw_lat[i], p);
                let rr = med(&|r| lat_of(f(r, i), p) / lat_of(&r.raw_lat[i], p));
                let _ = writeln!(t, "| 8 B {name} latency {pl}, {c} vs raw AF_XDP ping-pong {pl} ({SEND8_FRAME}-byte frames, {threads}; one-way) | {u:.1} us | {kr:.1} us | {rr:.2} |");
                let _ = writeln!(t, "| 8 B {name} latency {pl}, {c} vs kernel UDP ping-pong {pl} (one-way) | {u:.1} us | {k:.1} us | {ru:.2} |");
                let _ = writeln!(t, "| 8 B {name} latency {pl}, {c} vs kernel TCP ping-pong {pl} (one-way, TCP_NODELAY) | {u:.1} us | {kt:.1} us | {rt:.2} |");
            }
        }
        let uc = med(&|r| r.urnic[i].cpu_per_gb);
        let tc = med(&|r| r.tcp_cpu_per_gb);
        let _ = writeln!(t, "| CPU seconds per GB moved, {c} (urnic: whole process; TCP: both iperf3 processes) | {uc:.2} s/GB | {tc:.2} s/GB | {:.2} |", med(&|r| r.urnic[i].cpu_per_gb / r.tcp_cpu_per_gb));
    }
    let (one, many, mem) = (med(&|r| r.one_qp), med(&|r| r.many_qp), med(&|r| r.mem_per_qp));
    let _ = writeln!(t, "| 1000 connected QPs sharing one device vs 1 QP, 64 KiB WRITE aggregate, 1 core | {many:.0} MB/s | {one:.0} MB/s | {:.2} |", med(&|r| r.many_qp / r.one_qp));
    let _ = writeln!(t, "| memory per QP (RSS growth / QPs created, 16-deep send queue) | {:.1} KiB | | |", mem / 1024.0);
    let pool = |f: &dyn Fn(&Run) -> &Vec<f64>| runs.iter().flat_map(|r| f(r).iter().copied()).collect::<Vec<_>>();
    let latency = vec![
        ("URNIC SEND, 1 CORE".to_string(), pool(&|r| &r.urnic[0].send_lat)),
        ("URNIC SEND, 2 CORES".to_string(), pool(&|r| &r.urnic[1].send_lat)),
        ("URNIC WRITE, 1 CORE".to_string(), pool(&|r| &r.urnic[0].write_lat)),
        ("URNIC WRITE, 2 CORES".to_string(), pool(&|r| &r.urnic[1].write_lat)),
        ("RAW AF_XDP, 1 CORE".to_string(), pool(&|r| &r.raw_lat[0])),
        ("RAW AF_XDP, 2 CORES".to_string(), pool(&|r| &r.raw_lat[1])),
        ("KERNEL UDP".to_string(), pool(&|r| &r.udp_lat)),
        ("KERNEL TCP".to_string(), pool(&|r| &r.tcp_lat)),
    ];
    Summary { table: t, latency }
}

fn runs(n: usize) -> Result<Vec<Run>, String> {
    let mut out = Vec::new();
    for i in 0..n.max(1) {
        let r = one_run()?;
        eprintln!(
            "run {}: urnic 64 KiB WRITE {:.0}/{:.0} MB/s (1/2 cores), raw {:.0}/{:.0} kpps; 8 B SEND p50 {:.1}/{:.1} us; TCP {:.0} MB/s; UDP p50 {:.1} us",
            i + 1,
            r.urnic[0].write_64k,
            r.urnic[1].write_64k,
            r.raw_1k[0] / 1e3,
            r.raw_1k[1] / 1e3,
            median(&mut r.urnic[0].send_lat.clone()),
            median(&mut r.urnic[1].send_lat.clone()),
            r.tcp_mbps / 8.0,
            median(&mut r.udp_lat.clone())
        );
        out.push(r);
    }
    Ok(out)
}

/// The raw AF_XDP ceiling alone at IB MTU `mtu`'s frame length, one thread,
/// 8 s (`urnic bench --ceiling-only MTU`, for profiling).
pub fn ceiling_only(mtu: usize) -> Result<(), String> {
    let _ = VethPair::sweep_stale();
    let pair = VethPair::create("ceil", if mtu > 1024 { 9000 } else { 1500 }).map_err(|e| format!("namespaces (root): {e}"))?;
    let frame = write_frame_len(mtu);
    let pps = raw_afxdp(&pair, frame, Cores::One, 8.0)?;
    println!("raw AF_XDP ceiling, {frame}-byte frames, one thread: {:.0} kframes/s, {:.0} MB/s of payload", pps / 1e3, pps * mtu as f64 / 1e6);
    Ok(())
}

/// Run everything `n` times and print medians and ratios.
pub fn run(n: usize) -> Result<(), String> {
    println!("{}", summarize(&runs(n)?).table);
    Ok(())
}

/// Bandwidth (MB/s) per message size, for each operation.
type Sweep = Vec<(BwOp, Vec<f64>)>;

/// Bandwidth (MB/s) of each op and size on a veth of `link_mtu`.
fn sweep(link_mtu: u32, cores: Cores, sizes: &[usize]) -> Result<Sweep, String> {
    let _ = VethPair::sweep_stale();
    let pair = VethPair::create("sweep", link_mtu).map_err(|e| format!("namespaces (root): {e}"))?;
    let max = sizes.iter().copied().max().unwrap_or(65536);
    let mut rig = rig(&pair, cores, 2 * max, "sw")?;
    warm_up(&mut rig, 65536)?;
    let mut out = Vec::new();
    for op in BwOp::ALL {
        let mut v = Vec::new();
        for &size in sizes {
            v.push(bw(&mut rig.ea, &mut rig.eb, op, size, iters_for(size), 128)?.avg_mbs);
        }
        out.push((op, v));
    }
    Ok(out)
}

fn size_label(s: usize) -> String {
    match s {
        s if s >= 1 << 20 => format!("{}M", s >> 20),
        s if s >= 1 << 10 => format!("{}K", s >> 10),
        s => s.to_string(),
    }
}

/// Bandwidth vs message size (log2 x axis), one line per series, dashed
/// horizontal lines for the ceilings.
fn plot_bandwidth(title: &str, sizes: &[usize], series: &[(String, Vec<f64>)], ceilings: &[(String, f64)], path: &std::path::Path) -> Result<(), String> {
    let mut c = Canvas::new();
    let top = series.iter().flat_map(|s| s.1.iter().copied()).chain(ceilings.iter().map(|c| c.1)).fold(0.0, f64::max);
    let (lo, hi) = ((sizes[0] as f64).log2(), (*sizes.last().unwrap_or(&1) as f64).log2());
    let p = Panel { area: (100, 40, W as i64 - 30, H as i64 - 60), xmax: hi - lo, ymax: nice_max(top * 1.05) };
    p.frame(&mut c);
    let xt: Vec<_> = sizes.iter().map(|&s| ((s as f64).log2() - lo, size_label(s))).collect();
    p.label(&mut c, &xt, &linear_ticks(p.ymax, 5, |v| format!("{v:.0}")), "MESSAGE SIZE (BYTES)", "MB/S", title);
    let mut legend = Vec::new();
    for (k, (label, v)) in series.iter().enumerate() {
        let col = COLORS[k % COLORS.len()];
        for (i, w) in v.windows(2).enumerate() {
            c.thick_line(p.at((sizes[i] as f64).log2() - lo, w[0]), p.at((sizes[i + 1] as f64).log2() - lo, w[1]), col);
        }
        legend.push((label.to_uppercase(), col, false));
    }
    for (k, (label, y)) in ceilings.iter().enumerate() {
        let col = if k == 0 { BLACK } else { COLORS[7] };
        c.dashed_line(p.at(0.0, *y), p.at(hi - lo, *y), col);
        legend.push((label.to_uppercase(), col, true));
    }
    p.legend(&mut c, &legend);
    c.save(path)
}

/// Latency distributions as CDFs: x one-way µs (up to the largest p99),
/// y fraction of round trips at or below.
fn plot_latency(series: &[(String, Vec<f64>)], path: &std::path::Path) -> Result<(), String> {
    let mut c = Canvas::new();
    // Up to the largest p99, in steps of 5 µs (or 10 "nice" steps beyond
    // 50 µs): the slower tail would squeeze the curves into a corner.
    let p99 = series.iter().map(|(_, v)| pct(&mut v.clone(), 0.99)).filter(|v| v.is_finite()).fold(1.0, f64::max);
    let (xmax, steps) = match (p99 / 5.0).ceil() as usize {
        n @ 1..=10 => (n as f64 * 5.0, n),
        _ => (nice_max(p99), 10),
    };
    let p = Panel { area: (100, 50, W as i64 - 30, H as i64 - 60), xmax, ymax: 1.0 };
    p.frame(&mut c);
    p.label(&mut c, &linear_ticks(xmax, steps, |v| format!("{v:.0}")), &linear_ticks(1.0, 5, |v| format!("{v:.1}")), "ONE-WAY LATENCY (US), 8 BYTES", "CDF", "LATENCY DISTRIBUTION");
    let mut legend = Vec::new();
    for (k, (label, v)) in series.iter().enumerate() {
        let mut s = v.clone();
        s.sort_by(|a, b| a.total_cmp(b));
        let col = COLORS[k % COLORS.len()];
        let n = s.len().max(1) as f64;
        let mut prev = None;
        // At most ~1000 points per curve.
        let step = (s.len() / 1000).max(1);
        for (i, x) in s.iter().enumerate().step_by(step) {
            let pt = p.at(*x, (i + 1) as f64 / n);
            if let Some(q) = prev {
                c.thick_line(q, pt, col);
            }
            prev = Some(pt);
        }
        legend.push((label.clone(), col, false));
    }
    p.legend_bottom_right(&mut c, &legend);
    c.save(path)
}

/// The sweeps and the baselines, written to `dir`: report.md, sweep.csv,
/// bandwidth_{write,read,send}.png, latency.png.
pub fn report(dir: &std::path::Path, n: usize) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let sizes = [64usize, 256, 1024, 4096, 16384, 65536, 262_144, 1 << 20];
    // [(mtu label, cores, per-op series)]
    let configs = [(1500u32, "MTU 1024", Cores::One), (1500, "MTU 1024", Cores::Two), (9000, "MTU 4096", Cores::One), (9000, "MTU 4096", Cores::Two)];
    // Whole passes over every configuration, `n` times, then the median of
    // each point: the host's load drifts over minutes, so repeating a point
    // back to back would share one moment's noise.
    let mut passes: Vec<Vec<Sweep>> = Vec::new();
    let mut ceiling_samples = (Vec::new(), Vec::new());
    for pass in 0..n.max(1) {
        let mut this = Vec::new();
        for &(link, label, cores) in &configs {
            let s = sweep(link, cores, &sizes)?;
            for (op, v) in &s {
                eprintln!("pass {}: {label}, {}, {}: {:?}", pass + 1, cores.label(), op.name(), v.iter().map(|x| *x as i64).collect::<Vec<_>>());
            }
            this.push(s);
        }
        passes.push(this);
        // Ceilings in payload MB/s at both frame sizes: the better of one
        // thread and two (on two cores, two threads plus the kernel's
        // softirq work can do worse than one).
        let p1 = VethPair::create("ceil", 1500).map_err(|e| e.to_string())?;
        let p9 = VethPair::create("ceil", 9000).map_err(|e| e.to_string())?;
        let best = |p: &VethPair, mtu: usize| -> Result<f64, String> {
            let one = raw_afxdp(p, write_frame_len(mtu), Cores::One, 1.0)?;
            let two = raw_afxdp(p, write_frame_len(mtu), Cores::Two, 1.0)?;
            Ok(one.max(two) * mtu as f64 / 1e6)
        };
        ceiling_samples.0.push(best(&p1, 1024)?);
        ceiling_samples.1.push(best(&p9, 4096)?);
    }
    let results: Vec<(&str, Cores, Sweep)> = configs
        .iter()
        .enumerate()
        .map(|(c, &(_, label, cores))| {
            let per_op = BwOp::ALL
                .iter()
                .enumerate()
                .map(|(o, &op)| {
                    let points = (0..sizes.len()).map(|i| median(&mut passes.iter().map(|p| p[c][o].1[i]).collect::<Vec<_>>())).collect();
                    (op, points)
                })
                .collect();
            (label, cores, per_op)
        })
        .collect();
    let (c1k, c4k) = (median(&mut ceiling_samples.0), median(&mut ceiling_samples.1));
    let ceilings = vec![("raw AF_XDP ceiling, MTU 1024 frames".to_string(), c1k), ("raw AF_XDP ceiling, MTU 4096 frames".to_string(), c4k)];
    let mut md = String::from("# urnic benchmark report\n\n");
    let _ = writeln!(md, "Bandwidth (MB/s, 10^6 bytes per second) between two namespaces over veth, by message size, median of {} passes over every point (each pass runs every configuration once); 200..20,000 iterations per point (about 64 MiB), 128 outstanding. 1 core: both devices run-to-completion on one thread; 2 cores: device A on the application's thread, device B on a second thread.\n", n.max(1));
    let mut csv = String::from("op,mtu,cores,size,mbps\n");
    for op in BwOp::ALL {
        let _ = writeln!(md, "## {} bandwidth\n", op.name().to_uppercase());
        let series: Vec<(String, Vec<f64>)> = results
            .iter()
            .map(|(l, c, s)| (format!("{l}, {}", c.label()), s.iter().find(|(o, _)| *o == op).map(|x| x.1.clone()).unwrap_or_default()))
            .collect();
        md.push_str("| size |");
        for (l, _) in &series {
            let _ = write!(md, " {l} |");
        }
        md.push_str("\n|---|");
        md.push_str(&"---|".repeat(series.len()));
        md.push('\n');
        for (i, s) in sizes.iter().enumerate() {
            let _ = write!(md, "| {} |", size_label(*s));
            for (_, v) in &series {
                let _ = write!(md, " {:.0} |", v[i]);
            }
            md.push('\n');
        }
        md.push('\n');
        for (l, c, s) in &results {
            if let Some((_, v)) = s.iter().find(|(o, _)| *o == op) {
                for (i, size) in sizes.iter().enumerate() {
                    let _ = writeln!(csv, "{},{},{},{size},{:.1}", op.name(), &l[4..], if *c == Cores::One { 1 } else { 2 }, v[i]);
                }
            }
        }
        plot_bandwidth(&format!("RDMA {} BANDWIDTH", op.name().to_uppercase()), &sizes, &series, &ceilings, &dir.join(format!("bandwidth_{}.png", op.name())))?;
    }
    let _ = writeln!(md, "Raw AF_XDP ceilings (payload MB/s, the better of one thread sending and receiving and a sender plus a receiver thread, median of the passes): {c1k:.0} at MTU 1024 frames, {c4k:.0} at MTU 4096 frames (dashed lines in the plots).\n");
    std::fs::write(dir.join("sweep.csv"), csv).map_err(|e| e.to_string())?;
    let all = runs(n)?;
    let s = summarize(&all);
    md.push_str("## Against the baselines (same veth, same run, medians)\n\n");
    md.push_str(&s.table);
    md.push_str("\nlatency.png: distribution (CDF) of the 8-byte one-way latencies of all runs.\n");
    plot_latency(&s.latency, &dir.join("latency.png"))?;
    std::fs::write(dir.join("report.md"), &md).map_err(|e| e.to_string())?;
    println!("{md}");
    println!("written: {}", dir.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles() {
        let mut v = vec![5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!(median(&mut v), 3.0);
        assert_eq!(pct(&mut v, 0.99), 5.0);
        assert_eq!(pct(&mut v, 0.2), 1.0);
        assert!(median(&mut []).is_nan());
    }

    #[test]
    fn ratios_pair_urnic_with_its_baseline_run_by_run() {
        // urnic/raw per run: 100/200, 300/400, 50/50 -> ratios 0.5, 0.75, 1.0
        // (median 0.75), while the ratio of the medians would be 100/200.
        let mk = |urnic: f64, raw_mbs: f64| {
            let mut r = Run::default();
            r.urnic[0].write_64k = urnic;
            r.raw_1k[0] = raw_mbs * 1e6 / 1024.0;
            r
        };
        let s = summarize(&[mk(100.0, 200.0), mk(300.0, 400.0), mk(50.0, 50.0)]);
        let row = s.table.lines().find(|l| l.starts_with("| 64 KiB WRITE, MTU 1024, 1 core vs raw")).expect("row");
        assert!(row.ends_with("| 100 MB/s | 200 MB/s | 0.75 |"), "{row}");
    }

    #[test]
    fn frame_lengths_match_the_wire_layer() {
        assert_eq!(write_frame_len(1024), 1082);
        assert_eq!(WRITE64_FRAME, 138);
        assert_eq!(iters_for(64), 20_000);
        assert_eq!(iters_for(1 << 20), 200);
        assert_eq!(size_label(65536), "64K");
        assert_eq!(size_label(1 << 20), "1M");
    }
}
