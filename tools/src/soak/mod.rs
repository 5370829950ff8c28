//! `urnic soak`: two urnic devices in network namespaces (over veth; with
//! the hostile injector, three namespaces on a bridge, the injector in the
//! third), many RC QPs running a random mix of every verb both ways plus UD
//! QPs, with the XDP program dropping and corrupting frames and the injector
//! firing forged frames, for a given time. Every byte that moves is checked, every
//! WR must complete exactly once (RC: with success), and the process's RSS,
//! frames, retransmissions and drops by reason are printed as it goes.

mod inject;
mod pattern;
mod rc;
mod ud;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use urnic::{
    open_af_xdp, xdp, AhAttr, AsyncEvent, BindMode, Connect, Context, Cq, DatapathMode, IdlePolicy, Pd, Qp, QpAttr, QpAttrMask, QpCaps, QpInit,
    QpState, QpType, UdDest, WorkCompletion, XskConfig,
};
use urnic_datapath::netns::{Segment, VethPair};
use urnic_datapath::raw::RawSender;

use self::inject::{counters_of, Addr, Injector, Launcher, Target};
use self::pattern::Rng;
use self::rc::{Kind, RcFlow};
use self::ud::UdFlow;

/// Longest run (an Instant a few centuries ahead would overflow).
const MAX_DAYS: u64 = 366;
/// Fastest injector (one thread pacing by the millisecond).
const MAX_HOSTILE: u64 = 1_000_000;

/// Q_Key of the soak's UD QPs.
const UD_QKEY: u32 = 0x1111_1111;

/// Options of `urnic soak`.
#[derive(clap::Args, Debug, Clone)]
pub struct SoakArgs {
    /// How long to run: 20s, 30m, 1h30m, 500ms (Ctrl-C ends it early, with the summary).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    duration: Duration,
    /// RC QP pairs; each carries traffic both ways.
    #[arg(long, default_value_t = 8)]
    qps: usize,
    /// UD QP pairs; each carries SENDs both ways.
    #[arg(long, default_value_t = 2)]
    ud_qps: usize,
    /// WRs in flight per RC direction (and per UD direction).
    #[arg(long, default_value_t = 8)]
    depth: usize,
    /// Share (0 to 0.5) of the RoCE frames each device's XDP program drops.
    #[arg(long, default_value_t = 0.01)]
    loss: f64,
    /// Share (0 to 0.5) of the RoCE frames each device's XDP program corrupts (one bit).
    #[arg(long, default_value_t = 0.005)]
    corrupt: f64,
    /// Forged frames per second from the hostile injector (0: none).
    #[arg(long, default_value_t = 200)]
    hostile: u64,
    /// Only these attack classes (names or prefixes, comma-separated, e.g.
    /// `stranger_,stale_ack`; default: every class the rules refuse).
    #[arg(long, value_delimiter = ',')]
    attacks: Vec<String>,
    /// Seed of the operation mix, sizes and patterns (default: random, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Print a progress report this often.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    report_every: Duration,
    /// RC local ACK timeout exponent (4.096 us x 2^t; 15 = 134 ms).
    #[arg(long, default_value_t = 15)]
    timeout: u8,
    /// Who runs the datapaths: this thread between its own work (manual) or a thread per device.
    #[arg(long, value_enum, default_value = "manual")]
    datapath: SoakDatapath,
    /// veth MTU (1500 gives IB MTU 1024, 9000 gives 4096).
    #[arg(long, default_value_t = 1500)]
    link_mtu: u32,
    /// Capture each device's frames into DIR/soak0.pcap and DIR/soak1.pcap
    /// (grows by the traffic's size: for short runs).
    #[arg(long, value_name = "DIR")]
    pcap_dir: Option<std::path::PathBuf>,
    /// Fail when a flow with WRs in flight sees no completion for this long.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    stall: Duration,
}

/// Who drives the datapaths in a soak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SoakDatapath {
    /// The soak thread polls both devices between its own work.
    Manual,
    /// One datapath thread per device.
    Thread,
}

/// `30m`, `20s`, `1h30m`, `500ms`, `90` (seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if let Ok(n) = s.parse::<u64>() {
        return Ok(Duration::from_secs(n));
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    if rest.is_empty() {
        return Err("empty duration".into());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!("{s}: expected a number, as in 30m, 20s, 1h30m, 500ms"));
        }
        let n: u64 = rest[..digits].parse().map_err(|_| format!("{s}: number too large"))?;
        rest = &rest[digits..];
        let unit = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let d = match &rest[..unit] {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.saturating_mul(60)),
            "h" => Duration::from_secs(n.saturating_mul(3600)),
            u => return Err(format!("{s}: unknown unit {u:?} (ms, s, m, h)")),
        };
        total = total.saturating_add(d);
        rest = &rest[unit..];
    }
    Ok(total)
}

/// Running totals of the workload.
#[derive(Clone, Debug, Default)]
pub struct Totals {
    /// RC WRs posted by kind (`Kind::ALL` order).
    pub posted: [u64; 7],
    /// Send-queue completions (RC and UD).
    pub send_wcs: u64,
    /// Receive completions (RC and UD).
    pub recv_wcs: u64,
    /// Bytes checked as they arrived (SEND, WRITE, READ, atomic results, UD).
    pub verified_bytes: u64,
    /// Messages those bytes came in.
    pub verified_msgs: u64,
    /// Bytes of idle target memory compared with the model by the periodic sweeps.
    pub swept_bytes: u64,
    /// UD messages received intact.
    pub ud_received: u64,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn install_signal_handlers() {
    // SAFETY: the handler only stores to an atomic (async-signal-safe);
    // sigaction is given a zeroed, then filled, struct.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        for sig in [libc::SIGINT, libc::SIGTERM] {
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// The process's resident set (VmRSS), KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn human_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b => format!("{b} B"),
    }
}

fn fmt_secs(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

/// The network the devices talk over.
enum Net {
    /// Two namespaces joined by veth (no injector).
    Pair(VethPair),
    /// Three namespaces on a bridged segment: the devices in the first two,
    /// the hostile injector in the third (`Segment`, the bridge lab).
    Lab(Segment),
}

impl Net {
    /// The namespace of device `i` (0 or 1).
    fn ns(&self, i: usize) -> &str {
        match self {
            Net::Pair(p) => &p.ns[i],
            Net::Lab(l) => &l.ns[i],
        }
    }

    /// The interface of device `i`.
    fn ifname(&self, i: usize) -> &str {
        match self {
            Net::Pair(p) => &p.ifname[i],
            Net::Lab(l) => &l.ifname[i],
        }
    }

    /// The address of member `i`.
    fn addr(&self, i: usize) -> Addr {
        match self {
            Net::Pair(p) => Addr { mac: p.mac[i], ipv4: p.ipv4[i] },
            Net::Lab(l) => Addr { mac: l.mac[i], ipv4: l.ipv4[i] },
        }
    }

    fn describe(&self) -> String {
        match self {
            Net::Pair(_) => format!("soak0 in {}, soak1 in {} (veth, AF_XDP)", self.ns(0), self.ns(1)),
            Net::Lab(l) => format!("soak0 in {}, soak1 in {}, injector in {} (bridge in {}; AF_XDP)", l.ns[0], l.ns[1], l.ns[2], l.bridge_ns),
        }
    }

    /// The injector's address and where it fires from: the third member of
    /// the lab; on a bare veth pair, each end fires at the other device as
    /// a made-up stranger.
    fn attacker(&self) -> Result<(Addr, Vec<Launcher>), String> {
        let open = |ns: &str, ifname: &str| RawSender::open_in(Some(ns), ifname).map_err(|e| format!("injector in {ns}: {e}"));
        match self {
            Net::Lab(l) => Ok((self.addr(2), vec![Launcher { tx: open(&l.ns[2], &l.ifname[2])?, reaches: vec![0, 1] }])),
            Net::Pair(p) => {
                let mut ip = p.ipv4[0];
                ip[3] = 66;
                let stranger = Addr { mac: [0x02, 0x75, 0x72, 0, 0, 0x66], ipv4: ip };
                let v = (0..2)
                    .map(|from| Ok(Launcher { tx: open(&p.ns[from], &p.ifname[from])?, reaches: vec![1 - from] }))
                    .collect::<Result<Vec<_>, String>>()?;
                Ok((stranger, v))
            }
        }
    }
}

/// One device's objects.
struct Side {
    pd: Pd,
    scq: Cq,
    rcq: Cq,
}

/// Resident set sizes over the run, KiB.
struct Rss {
    start: u64,
    setup: u64,
    end: u64,
    max: u64,
}

/// What a finished soak reports.
struct Outcome {
    failure: Option<String>,
    elapsed: Duration,
    interrupted: bool,
}

/// Counters of both devices, summed by name: `dp.*` datapath, `port.*`
/// AF_XDP socket and XDP program, `tr.*` transport (engine-wide), `qp.*` all QPs.
#[derive(Clone, Debug, Default)]
struct Snap(BTreeMap<String, u64>);

impl Snap {
    fn take(ctxs: &[&Context]) -> Snap {
        let mut m = BTreeMap::new();
        for c in ctxs {
            let d = c.counters();
            for (group, list) in [("dp", &d.datapath), ("port", &d.port), ("tr", &d.transport)] {
                for (k, v) in list {
                    *m.entry(format!("{group}.{k}")).or_insert(0) += v;
                }
            }
            for (_, s) in &d.qps {
                for (k, v) in s.iter() {
                    *m.entry(format!("qp.{k}")).or_insert(0) += v;
                }
            }
        }
        Snap(m)
    }

    fn get(&self, k: &str) -> u64 {
        self.0.get(k).copied().unwrap_or(0)
    }

    /// Counters that count a frame or message thrown away, by reason:
    /// (full key, name without its group), non-zero ones only.
    fn drops(&self) -> Vec<(&str, &str)> {
        self.0
            .iter()
            .filter(|(_, &v)| v > 0)
            .map(|(k, _)| k.as_str())
            .filter(|k| {
                k.starts_with("port.xdp_impair_")
                    || matches!(*k, "port.xsk_rx_dropped" | "port.xsk_rx_ring_full" | "port.xsk_rx_multibuffer_dropped")
                    || (k.starts_with("tr.rx_") && !matches!(*k, "tr.rx_frames" | "tr.rx_cnps" | "tr.rx_icrc_at_placement"))
                    || (k.starts_with("qp.") && ["dropped", "duplicate", "ghost", "stale", "bad_"].iter().any(|w| k.contains(w)))
                    || matches!(*k, "dp.port_errors" | "dp.cq_overruns" | "dp.rx_handoff_drops" | "dp.completions_orphaned")
            })
            .map(|k| (k, k.split_once('.').map(|(_, n)| n).unwrap_or(k)))
            .collect()
    }
}

/// Run `urnic soak`.
pub fn run(a: &SoakArgs) -> Result<(), String> {
    if a.qps == 0 && a.ud_qps == 0 {
        return Err("nothing to soak: --qps and --ud-qps are both 0".into());
    }
    if !(1..=64).contains(&a.depth) {
        return Err("--depth must be 1..=64".into());
    }
    for (n, p) in [("--loss", a.loss), ("--corrupt", a.corrupt)] {
        if !(0.0..=0.5).contains(&p) {
            return Err(format!("{n} must be a share in 0..=0.5"));
        }
    }
    if a.timeout == 0 || a.timeout > 31 {
        return Err("--timeout must be 1..=31 (0 would be an infinite timeout: a lost tail never recovers)".into());
    }
    if a.duration > Duration::from_secs(MAX_DAYS * 86_400) {
        return Err(format!("--duration above {MAX_DAYS} days"));
    }
    if a.report_every < Duration::from_millis(100) || a.stall < Duration::from_secs(1) {
        return Err("--report-every must be at least 100ms and --stall at least 1s".into());
    }
    if a.hostile > MAX_HOSTILE {
        return Err(format!("--hostile above {MAX_HOSTILE} frames/s"));
    }
    let seed = a.seed.unwrap_or_else(|| pattern::mix(std::process::id() as u64 ^ Instant::now().elapsed().as_nanos() as u64 ^ rand_seed()));
    install_signal_handlers();
    let rss_start = rss_kib();
    println!(
        "urnic soak: {} RC QP pairs (both ways, {} WRs in flight each way), {} UD pairs; XDP loss {} corrupt {}; \
         hostile {} frames/s; seed {seed:#x}; {}",
        a.qps,
        a.depth,
        a.ud_qps,
        a.loss,
        a.corrupt,
        a.hostile,
        fmt_secs(a.duration)
    );
    // Namespaces left by a killed earlier run (of any urnic tool or test).
    let _ = Segment::sweep_stale();
    let net = if a.hostile > 0 {
        Net::Lab(Segment::create("soak", 3, a.link_mtu).map_err(|e| format!("creating three network namespaces on a bridge (run as root): {e}"))?)
    } else {
        Net::Pair(VethPair::create("soak", a.link_mtu).map_err(|e| format!("creating two network namespaces joined by veth (run as root): {e}"))?)
    };
    let mut rss_max = rss_start;
    let out = soak(a, &net, seed, rss_start, &mut rss_max);
    // Everything but the namespaces is gone now; they go with `net`.
    drop(net);
    let rss_end = rss_kib();
    let out = out?;
    println!(" RSS after closing the devices and removing the namespaces: {}", mib(rss_end));
    match out.failure {
        Some(f) => Err(format!("soak FAILED after {}: {f}", fmt_secs(out.elapsed))),
        None => {
            println!(
                " result: PASS{} — every byte verified, every WR completed exactly once, every RC WR successfully",
                if out.interrupted { " (interrupted early)" } else { "" }
            );
            Ok(())
        }
    }
}

fn rand_seed() -> u64 {
    let mut b = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut b);
    }
    u64::from_le_bytes(b)
}

fn open_side(net: &Net, i: usize, a: &SoakArgs) -> Result<Context, String> {
    let mut xsk = XskConfig::new(net.ifname(i));
    xsk.bind = BindMode::Auto;
    xsk.xdp.mode = xdp::AttachMode::Auto;
    xsk.xdp.impairments.faults.loss = a.loss;
    xsk.xdp.impairments.faults.corrupt = a.corrupt;
    let mode = match a.datapath {
        SoakDatapath::Manual => DatapathMode::Manual,
        SoakDatapath::Thread => DatapathMode::Thread { core: None, idle: IdlePolicy::default() },
    };
    let ctx = open_af_xdp(Some(net.ns(i)), &format!("soak{i}"), &xsk, mode).map_err(|e| format!("urnic device in {}: {e}", net.ns(i)))?;
    // `urnic stat` in another terminal shows the soak's devices live.
    crate::stat::publish(&ctx);
    Ok(ctx)
}

fn rc_qp(s: &Side, depth: usize) -> Result<Qp, String> {
    s.pd.create_qp(&QpInit {
        qp_type: QpType::Rc,
        send_cq: &s.scq,
        recv_cq: &s.rcq,
        srq: None,
        cap: QpCaps { max_send_wr: depth as u32, max_recv_wr: depth as u32 + 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: rc::INLINE_MAX },
        sq_sig_all: false,
    })
    .map_err(|e| format!("create RC QP: {e}"))
}

fn ud_qp(s: &Side, depth: usize, psn: u32) -> Result<Qp, String> {
    let qp =
        s.pd.create_qp(&QpInit {
            qp_type: QpType::Ud,
            send_cq: &s.scq,
            recv_cq: &s.rcq,
            srq: None,
            cap: QpCaps {
                max_send_wr: depth as u32,
                max_recv_wr: (ud::RECV_PER_SEND * depth) as u32,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        })
        .map_err(|e| format!("create UD QP: {e}"))?;
    let mut at = QpAttr { qp_state: QpState::Init, qkey: UD_QKEY, ..QpAttr::default() };
    let e = |e: urnic::Error| format!("UD QP to RTS: {e}");
    qp.modify(&at, QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY).map_err(e)?;
    at.qp_state = QpState::Rtr;
    qp.modify(&at, QpAttrMask::STATE).map_err(e)?;
    at.qp_state = QpState::Rts;
    at.sq_psn = urnic::Psn::new(psn);
    qp.modify(&at, QpAttrMask::STATE | QpAttrMask::SQ_PSN).map_err(e)?;
    Ok(qp)
}

/// A random 24-bit PSN, a quarter of them just short of the wrap.
fn psn(rng: &mut Rng) -> u32 {
    if rng.percent(25) {
        0x00ff_ffff - rng.below(64) as u32
    } else {
        rng.below(1 << 24) as u32
    }
}

/// Everything between the devices opening and closing.
fn soak(a: &SoakArgs, net: &Net, seed: u64, rss_start: u64, rss_max: &mut u64) -> Result<Outcome, String> {
    let ctxs = [open_side(net, 0, a)?, open_side(net, 1, a)?];
    let manual = a.datapath == SoakDatapath::Manual;
    if let Some(dir) = &a.pcap_dir {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for c in &ctxs {
            let path = dir.join(format!("{}.pcap", c.name()));
            c.nic().set_capture(Some(&path)).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    let cqe = (a.qps * (2 * a.depth + 4) + a.ud_qps * (ud::RECV_PER_SEND + 1) * a.depth + 64) as u32;
    let mut sides = Vec::new();
    for c in &ctxs {
        let pd = c.alloc_pd().map_err(|e| e.to_string())?;
        let scq = c.create_cq(cqe, None).map_err(|e| format!("create_cq: {e}"))?;
        let rcq = c.create_cq(cqe, None).map_err(|e| format!("create_cq: {e}"))?;
        sides.push(Side { pd, scq, rcq });
    }
    let gids = [ctxs[0].query_gid(1, 1).map_err(|e| e.to_string())?, ctxs[1].query_gid(1, 1).map_err(|e| e.to_string())?];
    let mut rng = Rng::new(seed);

    // RC pairs, connected both ways.
    let mut rc_qps: Vec<[Qp; 2]> = Vec::new();
    for _ in 0..a.qps {
        let q = [rc_qp(&sides[0], a.depth)?, rc_qp(&sides[1], a.depth)?];
        let (p0, p1) = (psn(&mut rng), psn(&mut rng));
        for s in 0..2 {
            let mut c = Connect::new(q[1 - s].qp_num(), gids[1 - s], if s == 0 { p0 } else { p1 }, if s == 0 { p1 } else { p0 });
            c.timeout = a.timeout;
            c.retry_cnt = 7;
            c.rnr_retry = 7;
            q[s].connect(&c).map_err(|e| format!("connect RC QP {:#x}: {e}", q[s].qp_num()))?;
        }
        rc_qps.push(q);
    }
    let mut flows = Vec::new();
    for (i, _) in rc_qps.iter().enumerate() {
        for r in 0..2 {
            let mut f = RcFlow::new(flows.len(), i, r, &sides[r].pd, &sides[1 - r].pd, a.depth, seed)?;
            f.post_initial_recvs(&rc_qps[i][1 - r])?;
            flows.push(f);
        }
    }
    // UD pairs.
    let mtu = ctxs[0].query_port(1).map_err(|e| e.to_string())?.active_mtu.bytes() as usize;
    let mut ud_qps: Vec<[Qp; 2]> = Vec::new();
    for _ in 0..a.ud_qps {
        ud_qps.push([ud_qp(&sides[0], a.depth, psn(&mut rng))?, ud_qp(&sides[1], a.depth, psn(&mut rng))?]);
    }
    let mut uds = Vec::new();
    for (j, q) in ud_qps.iter().enumerate() {
        for s in 0..2 {
            let ah = sides[s]
                .pd
                .create_ah(&AhAttr { dgid: gids[1 - s], sgid_index: 1, port_num: 1, ..AhAttr::default() })
                .map_err(|e| format!("create_ah: {e}"))?;
            let dest = UdDest { av: *ah.address_vector(), remote_qpn: q[1 - s].qp_num(), remote_qkey: UD_QKEY };
            let mut f = UdFlow::new(uds.len(), j, s, &sides[s].pd, &sides[1 - s].pd, mtu, a.depth, dest, q[s].qp_num(), Some(net.addr(s).ipv4))?;
            f.post_initial_recvs(&q[1 - s])?;
            uds.push(f);
        }
    }
    // Completion dispatch: (side, qpn) -> flow.
    let mut rc_send: HashMap<(usize, u32), usize> = HashMap::new();
    let mut rc_recv: HashMap<(usize, u32), usize> = HashMap::new();
    for f in &flows {
        rc_send.insert((f.req_side, rc_qps[f.pair][f.req_side].qp_num()), f.id);
        rc_recv.insert((1 - f.req_side, rc_qps[f.pair][1 - f.req_side].qp_num()), f.id);
    }
    let mut ud_send: HashMap<(usize, u32), usize> = HashMap::new();
    let mut ud_recv: HashMap<(usize, u32), usize> = HashMap::new();
    for f in &uds {
        ud_send.insert((f.send_side, ud_qps[f.pair][f.send_side].qp_num()), f.id);
        ud_recv.insert((1 - f.send_side, ud_qps[f.pair][1 - f.send_side].qp_num()), f.id);
    }

    // The injector, aimed at the RC QPs.
    let targets: Arc<Mutex<Vec<Target>>> = Arc::new(Mutex::new(Vec::new()));
    // The memory each QP's peer accesses (its rkey, as a sniffer would know it).
    let keys: HashMap<(usize, usize), (u32, u64)> = flows.iter().map(|f| ((f.pair, 1 - f.req_side), f.target_key())).collect();
    let publish_targets = |targets: &Arc<Mutex<Vec<Target>>>| {
        let mut list = Vec::new();
        for (i, q) in rc_qps.iter().enumerate() {
            for (dev, qp) in q.iter().enumerate() {
                let (rkey, va) = keys.get(&(i, dev)).copied().unwrap_or((0, 0));
                if let Ok(at) = qp.query() {
                    list.push(Target {
                        dev,
                        qpn: qp.qp_num(),
                        peer_qpn: q[1 - dev].qp_num(),
                        sq_psn: at.sq_psn.value(),
                        rq_psn: at.rq_psn.value(),
                        rkey,
                        va,
                    });
                }
            }
        }
        if let Ok(mut t) = targets.lock() {
            *t = list;
        }
    };
    publish_targets(&targets);
    let mut injector = if a.hostile > 0 && !rc_qps.is_empty() {
        let classes = inject::classes(&a.attacks)?;
        Some(
            {
                let (attacker, launchers) = net.attacker()?;
                Injector::start(launchers, [net.addr(0), net.addr(1)], attacker, targets.clone(), a.hostile, seed, classes)
            }
            .map_err(|e| format!("injector thread: {e}"))?,
        )
    } else {
        None
    };

    let ctx_refs = [&ctxs[0], &ctxs[1]];
    let base = Snap::take(&ctx_refs);
    // Devices, QPs, memory and receives in place: the traffic starts from here.
    let rss_setup = rss_kib();
    *rss_max = (*rss_max).max(rss_setup);
    let start = Instant::now();
    let deadline = start + a.duration;
    let mut next_report = start + a.report_every;
    let mut next_sweep = start + Duration::from_secs(1);
    let mut next_targets = start + Duration::from_millis(100);
    let mut tot = Totals::default();
    let mut wcs = vec![WorkCompletion::default(); 256];
    let mut draining: Option<Instant> = None;
    let mut drained_at: Option<Instant> = None;
    let mut interrupted = false;
    println!(" devices: {}; IB MTU {mtu}; {} datapath", net.describe(), if manual { "run-to-completion" } else { "threaded" });

    let result: Result<(), String> = (|| {
        loop {
            let now = Instant::now();
            if draining.is_none() && (now >= deadline || STOP.load(Ordering::Relaxed)) {
                interrupted = now < deadline;
                draining = Some(now);
                if interrupted {
                    println!(" interrupted after {}: draining what is in flight", fmt_secs(now - start));
                }
            }
            if manual {
                for c in &ctxs {
                    c.poll();
                }
            }
            let mut got = 0usize;
            for s in 0..2 {
                loop {
                    let n = sides[s].scq.poll(&mut wcs).map_err(|e| format!("device {s} send CQ: {e}"))?;
                    for wc in &wcs[..n] {
                        if let Some(&f) = rc_send.get(&(s, wc.qp_num)) {
                            flows[f].on_send_wc(wc.qp_num, wc, seed, &mut tot)?;
                        } else if let Some(&f) = ud_send.get(&(s, wc.qp_num)) {
                            uds[f].on_send_wc(wc.qp_num, wc, &mut tot)?;
                        } else {
                            return Err(format!("device {s}: a send completion for QP {:#x}, which is not ours: {wc:?}", wc.qp_num));
                        }
                    }
                    got += n;
                    if n < wcs.len() {
                        break;
                    }
                }
                loop {
                    let n = sides[s].rcq.poll(&mut wcs).map_err(|e| format!("device {s} receive CQ: {e}"))?;
                    for wc in &wcs[..n] {
                        if let Some(&f) = rc_recv.get(&(s, wc.qp_num)) {
                            let fl = &mut flows[f];
                            fl.on_recv_wc(&rc_qps[fl.pair][s], wc, seed, &mut tot)?;
                        } else if let Some(&f) = ud_recv.get(&(s, wc.qp_num)) {
                            let fl = &mut uds[f];
                            fl.on_recv_wc(&ud_qps[fl.pair][s], wc, seed, &mut tot)?;
                        } else {
                            return Err(format!("device {s}: a receive completion for QP {:#x}, which is not ours: {wc:?}", wc.qp_num));
                        }
                    }
                    got += n;
                    if n < wcs.len() {
                        break;
                    }
                }
                while let Some(ev) = ctxs[s].poll_async_event() {
                    match ev {
                        AsyncEvent::QpFatal(q) => return Err(format!("device {s}: QP {q:#x} went to the error state (IBV_EVENT_QP_FATAL)")),
                        AsyncEvent::PortError => return Err(format!("device {s}: port error (link down)")),
                        _ => {}
                    }
                }
            }
            if draining.is_none() {
                for f in flows.iter_mut() {
                    f.top_up(&rc_qps[f.pair][f.req_side], &mut rng, seed, &mut tot)?;
                }
                for f in uds.iter_mut() {
                    f.top_up(&ud_qps[f.pair][f.send_side], &mut rng, seed)?;
                }
            }
            let now = Instant::now();
            if now >= next_targets {
                next_targets = now + Duration::from_millis(100);
                if injector.is_some() {
                    publish_targets(&targets);
                }
            }
            if now >= next_sweep {
                next_sweep = now + Duration::from_secs(1);
                for f in flows.iter_mut() {
                    tot.swept_bytes += f.sweep(rc_qps[f.pair][1 - f.req_side].qp_num())?;
                }
                *rss_max = (*rss_max).max(rss_kib());
                for f in &flows {
                    if f.outstanding() > 0 && now.duration_since(f.last_progress) > a.stall {
                        let q = &rc_qps[f.pair][f.req_side];
                        return Err(format!(
                            "RC flow {} (QP {:#x}): {} WRs in flight and no completion for {}; QP {:?}; stats {:?}",
                            f.id,
                            q.qp_num(),
                            f.outstanding(),
                            fmt_secs(a.stall),
                            q.query().map(|a| a.qp_state),
                            q.stats()
                        ));
                    }
                }
                for f in &uds {
                    if f.outstanding() > 0 && now.duration_since(f.last_progress) > a.stall {
                        return Err(format!("UD flow {}: {} SENDs in flight and no completion for {}", f.id, f.outstanding(), fmt_secs(a.stall)));
                    }
                }
            }
            if now >= next_report {
                next_report += a.report_every;
                let snap = Snap::take(&ctx_refs);
                report_line(now - start, &snap, &base, &tot, &uds, injector.as_ref());
            }
            if let Some(t0) = draining {
                let busy = flows.iter().map(|f| f.outstanding() + f.unreceived()).sum::<usize>() + uds.iter().map(|f| f.outstanding()).sum::<usize>();
                if busy == 0 {
                    // UD messages still on the wire get a moment to land.
                    let t = *drained_at.get_or_insert(now);
                    if now.duration_since(t) > Duration::from_millis(300) {
                        break;
                    }
                } else if now.duration_since(t0) > a.stall {
                    let stuck: Vec<String> = flows
                        .iter()
                        .filter(|f| f.outstanding() + f.unreceived() > 0)
                        .map(|f| format!("RC flow {}: {} WRs without completion, {} messages not received", f.id, f.outstanding(), f.unreceived()))
                        .chain(uds.iter().filter(|f| f.outstanding() > 0).map(|f| format!("UD flow {}: {} sends", f.id, f.outstanding())))
                        .collect();
                    return Err(format!("after {} of draining: {}", fmt_secs(a.stall), stuck.join("; ")));
                }
            }
            if !manual && got == 0 {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        // The last word: every idle slot and atomic word as the model says,
        // and no receive completed that nobody sent.
        for f in flows.iter_mut() {
            tot.swept_bytes += f.sweep(rc_qps[f.pair][1 - f.req_side].qp_num())?;
        }
        Ok(())
    })();
    let elapsed = start.elapsed();
    if result.is_err() {
        post_mortem(&ctxs, &sides, manual, &mut wcs);
    }
    if let Some(inj) = injector.as_mut() {
        inj.stop();
    }
    let rss_end = rss_kib();
    *rss_max = (*rss_max).max(rss_end);
    let snap = Snap::take(&ctx_refs);
    let rss = Rss { start: rss_start, setup: rss_setup, end: rss_end, max: *rss_max };
    summary(a, seed, elapsed, &snap, &base, &tot, &flows, &uds, injector.as_ref(), &rss);
    let failure = result.err();
    for c in &ctxs {
        let _ = c.nic().set_capture(None);
    }
    // Close in order: flows (MRs), QPs, CQs and PDs, then the devices.
    drop(injector);
    drop(flows);
    drop(uds);
    drop(rc_qps);
    drop(ud_qps);
    drop(sides);
    drop(ctxs);
    Ok(Outcome { failure, elapsed, interrupted })
}

/// After a failure: the error completions still queued (the first error of
/// a QP is the cause, the flushes behind it follow), and the counters of
/// the QPs they name, to tell what went wrong where.
fn post_mortem(ctxs: &[Context; 2], sides: &[Side], manual: bool, wcs: &mut [WorkCompletion]) {
    for _ in 0..100 {
        if manual {
            for c in ctxs {
                c.poll();
            }
        }
    }
    let mut shown = 0;
    let mut qps: Vec<(usize, u32)> = Vec::new();
    for (s, side) in sides.iter().enumerate() {
        for (which, cq) in [("send", &side.scq), ("receive", &side.rcq)] {
            while let Ok(n) = cq.poll(wcs) {
                if n == 0 {
                    break;
                }
                for wc in wcs[..n].iter().filter(|w| w.status != urnic::WcStatus::Success) {
                    if shown < 12 {
                        println!(
                            " queued error completion, device {s} {which} CQ: QP {:#x} wr_id {} {:?} {:?}",
                            wc.qp_num, wc.wr_id, wc.opcode, wc.status
                        );
                    }
                    shown += 1;
                    if !qps.contains(&(s, wc.qp_num)) {
                        qps.push((s, wc.qp_num));
                    }
                }
            }
        }
    }
    if shown > 12 {
        println!(" ... {} error completions in all", shown);
    }
    for (s, qpn) in qps.iter().take(4) {
        let c = ctxs[*s].counters();
        if let Some((_, st)) = c.qps.iter().find(|(n, _)| n == qpn) {
            let nz: Vec<String> = st.iter().filter(|(_, v)| *v != 0).map(|(k, v)| format!("{k} {v}")).collect();
            println!(" device {s} QP {qpn:#x}: {}", nz.join(", "));
        }
    }
}

fn delta(snap: &Snap, base: &Snap, k: &str) -> u64 {
    snap.get(k).saturating_sub(base.get(k))
}

fn drops_line(snap: &Snap, base: &Snap) -> String {
    let out: Vec<String> = snap
        .drops()
        .into_iter()
        .filter_map(|(full, name)| {
            let d = delta(snap, base, full);
            (d > 0).then(|| format!("{name} {d}"))
        })
        .collect();
    if out.is_empty() {
        "none".into()
    } else {
        out.join(", ")
    }
}

/// What the injector sent, by the counter each frame should land in, and
/// what those counters counted (over both devices; real traffic adds its own
/// duplicates and sequence errors to some of them).
fn injected_line(inj: &Injector, snap: &Snap, base: &Snap) -> String {
    let c = &inj.counts;
    let mut by_counter: BTreeMap<String, u64> = BTreeMap::new();
    for (i, a) in c.classes.iter().enumerate() {
        for name in counters_of(*a) {
            *by_counter.entry(name).or_insert(0) += c.sent(i);
        }
    }
    let pairs: Vec<String> = by_counter
        .iter()
        .map(|(label, n)| {
            let got: u64 = label.split('|').map(|k| ["tr", "qp", "port"].iter().map(|g| delta(snap, base, &format!("{g}.{k}"))).sum::<u64>()).sum();
            format!("{label} {n}/{got}")
        })
        .collect();
    format!(
        "{} frames of {} classes (send errors {}, forge errors {}); expected counter injected/counted: {}",
        c.total(),
        c.classes.len(),
        c.errors.load(Ordering::Relaxed),
        c.forge_errors.load(Ordering::Relaxed),
        pairs.join(", ")
    )
}

fn report_line(t: Duration, snap: &Snap, base: &Snap, tot: &Totals, uds: &[UdFlow], inj: Option<&Injector>) {
    let ud_sent: u64 = uds.iter().map(|f| f.sent).sum();
    println!(
        "[{:>7}] RSS {} | frames tx {} rx {} | retransmits {} (timeouts {}, seq NAKs {}) | verified {} in {} msgs \
         | completions {} | UD sent {} received {}",
        fmt_secs(t),
        mib(rss_kib()),
        delta(snap, base, "dp.tx_frames"),
        delta(snap, base, "dp.rx_frames"),
        delta(snap, base, "qp.req_retransmits"),
        delta(snap, base, "qp.req_timeouts"),
        delta(snap, base, "qp.req_naks_seq_received"),
        human_bytes(tot.verified_bytes),
        tot.verified_msgs,
        tot.send_wcs + tot.recv_wcs,
        ud_sent,
        tot.ud_received,
    );
    println!("          drops: {}", drops_line(snap, base));
    if let Some(i) = inj {
        println!("          injected: {}", injected_line(i, snap, base));
    }
}

#[allow(clippy::too_many_arguments)]
fn summary(
    a: &SoakArgs,
    seed: u64,
    elapsed: Duration,
    snap: &Snap,
    base: &Snap,
    tot: &Totals,
    flows: &[RcFlow],
    uds: &[UdFlow],
    inj: Option<&Injector>,
    rss: &Rss,
) {
    let secs = elapsed.as_secs_f64().max(1e-9);
    let ud_sent: u64 = uds.iter().map(|f| f.sent).sum();
    let ud_lost: u64 = uds.iter().map(|f| f.lost()).sum();
    println!("== urnic soak summary ==");
    println!(" ran {} of {} requested; seed {seed:#x}; {} RC flows, {} UD flows", fmt_secs(elapsed), fmt_secs(a.duration), flows.len(), uds.len());
    println!(
        " frames: tx {} rx {} ({:.0}/s); RoCE bytes sent {}",
        delta(snap, base, "dp.tx_frames"),
        delta(snap, base, "dp.rx_frames"),
        delta(snap, base, "dp.tx_frames") as f64 / secs,
        human_bytes(delta(snap, base, "qp.tx_bytes"))
    );
    let posted: Vec<String> = Kind::ALL.iter().zip(tot.posted.iter()).map(|(k, n)| format!("{} {n}", k.name())).collect();
    println!(" RC WRs posted: {} (total {})", posted.join(", "), tot.posted.iter().sum::<u64>());
    println!(" completions: {} send queue, {} receive (each matched to exactly one WR)", tot.send_wcs, tot.recv_wcs);
    println!(
        " verified: {} ({} bytes, {:.1} MB/s) in {} messages; idle memory re-checked: {}",
        human_bytes(tot.verified_bytes),
        tot.verified_bytes,
        tot.verified_bytes as f64 / secs / 1e6,
        tot.verified_msgs,
        human_bytes(tot.swept_bytes)
    );
    println!(
        " retransmissions {} (timeouts {}, PSN sequence NAKs received {}, RNR NAKs received {}); \
         duplicate requests answered {} (READs replayed {}, atomics replayed from the cache {})",
        delta(snap, base, "qp.req_retransmits"),
        delta(snap, base, "qp.req_timeouts"),
        delta(snap, base, "qp.req_naks_seq_received"),
        delta(snap, base, "qp.req_rnr_naks_received"),
        delta(snap, base, "qp.resp_duplicates"),
        delta(snap, base, "qp.resp_read_replays"),
        delta(snap, base, "qp.resp_atomic_replays"),
    );
    println!(
        " UD: {ud_sent} sent, {} received intact, {ud_lost} lost ({:.2}%)",
        tot.ud_received,
        if ud_sent > 0 { 100.0 * ud_lost as f64 / ud_sent as f64 } else { 0.0 }
    );
    println!(" drops by reason: {}", drops_line(snap, base));
    println!(
        " XDP impairments: {} dropped, {} corrupted; ICRC failures {}",
        delta(snap, base, "port.xdp_impair_dropped"),
        delta(snap, base, "port.xdp_impair_corrupted"),
        delta(snap, base, "tr.rx_drop_bad_icrc")
    );
    if let Some(i) = inj {
        println!(" injected: {}", injected_line(i, snap, base));
        let per: Vec<String> = i.counts.classes.iter().enumerate().map(|(k, a)| format!("{a} {}", i.counts.sent(k))).collect();
        println!(" injected by class: {}", per.join(", "));
    }
    println!(
        " RSS: start {} (before the devices), {} once set up, end {} (growth during the traffic {:+.1} MiB), max {}",
        mib(rss.start),
        mib(rss.setup),
        mib(rss.end),
        (rss.end as f64 - rss.setup as f64) / 1024.0,
        mib(rss.max)
    );
}
