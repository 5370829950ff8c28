//! `urnic`: the command-line tool.

mod bench;
mod dcqcn_plot;
mod dev;
mod devinfo;
mod perf;
mod perftest;
mod pingpong;
mod plot;
mod report;
mod soak;

use std::process::ExitCode;

use anyhow::{bail, Context as _, Result};
use clap::{Parser, Subcommand};
use urnic::{open_af_xdp, open_device, xdp, BindMode, Context, DatapathMode, DeviceConfig, IdlePolicy, MemHub, XskConfig};
use urnic_datapath::netns::VethPair;

use crate::perf::{banner, connect_pair, send_lat, write_bw, Endpoint};
use crate::report::{bw_header, bw_row, lat_header, lat_row, RULE};

#[derive(Parser)]
#[command(name = "urnic", version, about = "urnic, a userspace RoCEv2 NIC: tools")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Two urnic devices moving RDMA traffic, WRITE bandwidth and SEND
    /// latency, perftest-style: by default each in its own network namespace,
    /// joined by veth, through AF_XDP (needs root); `--link memory` joins
    /// them in memory instead (no privileges).
    Demo {
        /// veth (two namespaces, AF_XDP, the XDP program) or memory.
        #[arg(long, default_value = "veth")]
        link: Link,
        /// Who runs the datapaths: this thread for both devices
        /// (run-to-completion) or one polling thread per device.
        #[arg(long, default_value = "manual")]
        datapath: Datapath,
        /// veth only: queues per veth end and shards per device, each with its
        /// own AF_XDP socket and a polling thread pinned to core i (implies
        /// `--datapath thread`).
        #[arg(long, default_value_t = 1)]
        shards: usize,
        /// XDP attach mode on veth.
        #[arg(long, default_value = "auto")]
        xdp_mode: XdpMode,
        /// Capture everything urnic0 sends and receives into FILE (pcap).
        #[arg(long, value_name = "FILE")]
        pcap: Option<std::path::PathBuf>,
        /// Print every counter of both devices at the end.
        #[arg(long)]
        stats: bool,
        /// Message sizes for the bandwidth test.
        #[arg(long, value_delimiter = ',', default_values_t = [64usize, 1024, 4096, 65536, 1 << 20])]
        sizes: Vec<usize>,
        /// Messages per size.
        #[arg(short = 'n', long, default_value_t = 2000)]
        iters: usize,
        /// Outstanding WRITEs.
        #[arg(short = 't', long, default_value_t = 128)]
        tx_depth: usize,
        /// Link MTU (1500 → IB MTU 1024, 9000 → 4096).
        #[arg(long, default_value_t = 1500)]
        link_mtu: u32,
        /// Ping-pong iterations for the latency test.
        #[arg(long, default_value_t = 1000)]
        lat_iters: usize,
        /// Capture each device's frames into DIR/urnic0.pcap and DIR/urnic1.pcap.
        #[arg(long, value_name = "DIR")]
        pcap_dir: Option<std::path::PathBuf>,
    },
    /// Like ibv_devinfo: the interfaces a urnic device can be opened on, with
    /// port attributes and GID table.
    Devinfo {
        /// Only this interface.
        #[arg(short = 'd', long = "ib-dev")]
        dev: Option<String>,
        /// Also the GID table and limits.
        #[arg(short = 'v', long)]
        verbose: bool,
    },
    /// Wire-compatible with rdma-core's ibv_rc_pingpong (either side may be rdma-core).
    RcPingpong(PingpongArgs),
    /// Wire-compatible with rdma-core's ibv_ud_pingpong.
    UdPingpong(PingpongArgs),
    /// perftest-compatible tests (ib_send_bw, ib_write_bw, ...): the same
    /// TCP exchange and options, so the peer may be perftest on rxe or a
    /// ConnectX, or urnic.
    Perf(PerfArgs),
    /// urnic (one and two cores) against the baselines on the same veth, in
    /// one run: raw AF_XDP frame forwarding, kernel TCP (iperf3, ping-pong),
    /// kernel UDP ping-pong; a markdown table of medians and ratios (root).
    Bench {
        /// Repetitions (medians are reported).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Also sweep WRITE, READ and SEND bandwidth over message sizes at MTU
        /// 1024 and 4096 with one and two cores, and write report.md,
        /// sweep.csv, bandwidth_{write,read,send}.png and latency.png into DIR.
        #[arg(long, value_name = "DIR")]
        report: Option<std::path::PathBuf>,
        /// Only the raw AF_XDP ceiling, for 8 s at this IB MTU's frame size
        /// (1024 on a 1500-byte veth, 4096 on a 9000-byte one), one thread
        /// sending and receiving: a clean process to profile against
        /// `urnic demo`.
        #[arg(long, value_name = "MTU", conflicts_with = "report", value_parser = ["1024", "4096"])]
        ceiling_only: Option<String>,
    },
    /// DCQCN in virtual time: 2/4/8/16-to-1 incast, a flow joining and
    /// leaving, DCQCN off; PNG plots and CSV time series into DIR.
    DcqcnSim {
        /// Output directory.
        #[arg(long, default_value = "target/dcqcn")]
        out: std::path::PathBuf,
    },
    /// Soak test: two devices over veth, many RC QPs running every verb both
    /// ways plus UD, XDP loss and corruption, a hostile injector; every byte
    /// and completion checked for the given time (root).
    Soak(soak::SoakArgs),
    /// Counters of the urnic devices running on this machine (published by
    /// each device into DIR while it runs).
    Stat {
        /// Where devices publish their counters.
        #[arg(long, default_value = STAT_DIR)]
        dir: std::path::PathBuf,
        /// Show zero counters too.
        #[arg(long)]
        all: bool,
    },
}

/// Options of `urnic rc-pingpong` / `ud-pingpong` (as rdma-core's tools).
#[derive(clap::Args, Debug)]
struct PingpongArgs {
    /// Server to connect to (none: be the server and wait).
    server: Option<String>,
    /// Listen on / connect to this TCP port.
    #[arg(short = 'p', long, default_value_t = 18515)]
    port: u16,
    /// Interface to use (the urnic device is opened on it).
    #[arg(short = 'd', long = "ib-dev")]
    dev: Option<String>,
    /// Port of the device (only 1).
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// Message size (default 4096 for RC, 2048 for UD).
    #[arg(short = 's', long)]
    size: Option<usize>,
    /// Path MTU (RC).
    #[arg(short = 'm', long, default_value_t = 1024)]
    mtu: u32,
    /// Receives posted at a time.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    rx_depth: u32,
    /// Exchanges.
    #[arg(short = 'n', long, default_value_t = 1000)]
    iters: u32,
    /// Service level (accepted; RoCE carries none without VLAN priority).
    #[arg(short = 'l', long, default_value_t = 0)]
    sl: u8,
    /// Sleep on CQ events (accepted; urnic polls).
    #[arg(short = 'e', long)]
    events: bool,
    /// Local GID index.
    #[arg(short = 'g', long = "gid-idx")]
    gid_idx: Option<u8>,
    /// Validate the received buffer.
    #[arg(short = 'c', long = "chk")]
    chk: bool,
    /// Test impairment: drop this share (0..1) of the RoCE frames we receive.
    #[arg(long, default_value_t = 0.0)]
    drop: f64,
}

/// Options of `urnic perf` (perftest's letters).
#[derive(clap::Args, Debug)]
struct PerfArgs {
    /// The test.
    #[arg(value_enum)]
    test: perftest::Test,
    /// Server to connect to (none: be the server and wait).
    server: Option<String>,
    /// TCP port of the exchange.
    #[arg(short = 'p', long, default_value_t = 18515)]
    port: u16,
    /// Interface to use.
    #[arg(short = 'd', long = "ib-dev")]
    dev: Option<String>,
    /// Message size (perftest's default per test).
    #[arg(short = 's', long)]
    size: Option<usize>,
    /// Iterations (perftest's default per test).
    #[arg(short = 'n', long)]
    iters: Option<u64>,
    /// Outstanding WRs (bandwidth tests).
    #[arg(short = 't', long = "tx-depth", default_value_t = 128)]
    tx_depth: u32,
    /// Receive queue depth (send tests).
    #[arg(short = 'r', long = "rx-depth", default_value_t = 512)]
    rx_depth: u32,
    /// GID index.
    #[arg(short = 'x', long = "gid-index", default_value_t = 1)]
    gid_idx: u8,
    /// MTU (default: the port's active MTU).
    #[arg(short = 'm', long)]
    mtu: Option<u32>,
    /// Atomic operation (ib_atomic_bw).
    #[arg(short = 'A', long = "atomic_type", value_enum, default_value = "FETCH_AND_ADD")]
    atomic: perftest::AtomicOp,
    /// Accepted for perftest compatibility (urnic reports no CPU frequency warning).
    #[arg(short = 'F', long = "CPU-freq")]
    cpu_freq: bool,
    /// Also print the results as one JSON line.
    #[arg(long)]
    json: bool,
    /// Test impairment: drop this share (0..1) of the RoCE frames we receive.
    #[arg(long, default_value_t = 0.0)]
    drop: f64,
    /// Print the device's counters at the end (retransmissions, NAKs, drops).
    #[arg(long)]
    stats: bool,
}

/// Where `urnic` devices publish counters for `urnic stat`.
const STAT_DIR: &str = "/run/urnic";

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Link {
    Veth,
    Memory,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Datapath {
    Manual,
    Thread,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum XdpMode {
    Auto,
    Native,
    Generic,
}

/// Options of `urnic demo`.
struct DemoOpts<'a> {
    sizes: &'a [usize],
    iters: usize,
    depth: usize,
    link_mtu: u32,
    lat_iters: usize,
    pcap_dir: Option<&'a std::path::Path>,
    link: Link,
    datapath: Datapath,
    xdp_mode: XdpMode,
    pcap: Option<&'a std::path::Path>,
    stats: bool,
    shards: usize,
}

/// Open the two demo devices. The veth pair (if any) must outlive them.
fn demo_devices(o: &DemoOpts) -> Result<(Context, Context, Option<VethPair>, String)> {
    let ncpu = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mode = match (o.datapath, o.shards) {
        (_, n) if n > 1 => DatapathMode::Threads { cores: (0..n).map(|c| c % ncpu).collect(), idle: IdlePolicy::default() },
        (Datapath::Manual, _) => DatapathMode::Manual,
        (Datapath::Thread, _) => DatapathMode::Thread { core: None, idle: IdlePolicy::default() },
    };
    if o.shards == 0 || (o.shards > 1 && o.link == Link::Memory) {
        bail!("--shards must be at least 1, and above 1 only with --link veth (one AF_XDP queue per shard)");
    }
    match o.link {
        Link::Memory => {
            let hub = MemHub::new(1);
            let mut ca = DeviceConfig::memory(&hub, "urnic0", [0x02, 0, 0, 0, 0, 1], [10, 0, 0, 1]);
            let mut cb = DeviceConfig::memory(&hub, "urnic1", [0x02, 0, 0, 0, 0, 2], [10, 0, 0, 2]);
            ca.link_mtu = o.link_mtu;
            cb.link_mtu = o.link_mtu;
            ca.datapath = mode.clone();
            cb.datapath = mode;
            let a = open_device(ca).context("urnic0")?;
            let b = open_device(cb).context("urnic1")?;
            Ok((a, b, None, "in-memory link".into()))
        }
        Link::Veth => {
            let _ = VethPair::sweep_stale();
            let pair = VethPair::create_with_queues("demo", o.link_mtu, o.shards as u32)
                .context("creating two network namespaces joined by veth (run as root)")?;
            let mut xsk = XskConfig::new(&pair.ifname[0]);
            xsk.bind = BindMode::Auto;
            xsk.xdp.mode = match o.xdp_mode {
                XdpMode::Auto => xdp::AttachMode::Auto,
                XdpMode::Native => xdp::AttachMode::Native,
                XdpMode::Generic => xdp::AttachMode::Generic,
            };
            let a = open_af_xdp(Some(&pair.ns[0]), "urnic0", &xsk, mode.clone()).with_context(|| format!("urnic0 in {}", pair.ns[0]))?;
            xsk.ifname = pair.ifname[1].clone();
            let b = open_af_xdp(Some(&pair.ns[1]), "urnic1", &xsk, mode).with_context(|| format!("urnic1 in {}", pair.ns[1]))?;
            let how = a
                .nic()
                .with_port(|p| {
                    p.as_any_mut().and_then(|p| p.downcast_mut::<urnic_datapath::XskPort>()).map(|x| {
                        format!("{:?} XDP, {} AF_XDP", x.xdp_mode(), if x.zero_copy() { "zero-copy" } else { "copy-mode" })
                    })
                })
                .unwrap_or_default();
            let desc = format!("veth {}/{} <-> {}/{}, {how}", pair.ns[0], pair.ifname[0], pair.ns[1], pair.ifname[1]);
            Ok((a, b, Some(pair), desc))
        }
    }
}

fn demo(o: &DemoOpts) -> Result<()> {
    let DemoOpts { sizes, iters, depth, lat_iters, pcap_dir, .. } = *o;
    // Run-to-completion by default: this thread drives both devices'
    // datapaths itself (no datapath threads competing for the two cores),
    // as an embedding would.
    let (a, b, _pair, link_desc) = demo_devices(o)?;
    for ctx in [&a, &b] {
        // Best effort: `urnic stat` in another terminal shows them live.
        let _ = ctx.publish_counters(std::path::Path::new(STAT_DIR));
    }
    if let Some(file) = o.pcap {
        a.nic().set_capture(Some(file)).with_context(|| file.display().to_string())?;
    }
    if let Some(dir) = pcap_dir {
        std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
        for ctx in [&a, &b] {
            let path = dir.join(format!("{}.pcap", ctx.name()));
            ctx.nic().set_capture(Some(&path)).with_context(|| path.display().to_string())?;
        }
    }
    let max = sizes.iter().copied().max().unwrap_or(64).max(8192);
    let buf = (2 * max).div_ceil(4096) * 4096;
    let mut ea = Endpoint::new(&a, buf, depth as u32)?;
    let mut eb = Endpoint::new(&b, buf, depth as u32)?;
    if o.datapath == Datapath::Manual && o.shards == 1 {
        ea.drive = vec![a.clone(), b.clone()];
        eb.drive = vec![a.clone(), b.clone()];
    }
    connect_pair(&ea, &eb)?;
    let mtu = a.query_port(1).context("query_port")?.active_mtu.bytes();

    let how = match (o.datapath, o.shards) {
        (_, n) if n > 1 => format!("{n} shards per device, one pinned polling thread each"),
        (Datapath::Manual, _) => "run-to-completion".to_string(),
        (Datapath::Thread, _) => "a datapath thread per device".to_string(),
    };
    println!(" Link: {link_desc}; {how}");
    banner("RDMA_Write BW Test (urnic)", "urnic0 -> urnic1", mtu, depth);
    println!("{}", bw_header());
    for &size in sizes {
        let r = write_bw(&mut ea, &mut eb, size, iters, depth)?;
        println!("{}", bw_row(r.bytes, r.iters, r.peak_mbs, r.avg_mbs));
    }
    println!("{RULE}");
    banner("Send Latency Test (urnic)", "urnic0 <-> urnic1", mtu, 1);
    println!("{}", lat_header());
    for size in [8usize, 64, 4096] {
        let s = send_lat(&mut ea, &mut eb, size, lat_iters)?;
        println!("{}", lat_row(size, lat_iters, &s));
    }
    println!("{RULE}");
    for ctx in [&a, &b] {
        let _ = ctx.nic().set_capture(None);
        if o.stats {
            print!("{}", ctx.counters());
        }
    }
    Ok(())
}

fn run_pingpong(a: PingpongArgs, rc: bool) -> Result<()> {
    if a.ib_port != 1 {
        bail!("port {} does not exist (urnic devices have port 1)", a.ib_port);
    }
    let _ = (a.sl, a.events);
    let ifname = dev::pick_interface(a.dev.as_deref())?;
    let ctx = dev::open(&ifname, a.drop)?;
    let opts = pingpong::Opts {
        server: a.server,
        port: a.port,
        size: a.size.unwrap_or(if rc { 4096 } else { 2048 }),
        mtu: a.mtu,
        rx_depth: a.rx_depth,
        iters: a.iters,
        gid_idx: a.gid_idx,
        validate: a.chk,
    };
    if rc {
        pingpong::rc(&ctx, &opts)
    } else {
        pingpong::ud(&ctx, &opts)
    }
}

fn run_perf(a: PerfArgs) -> Result<()> {
    let _ = a.cpu_freq;
    let ifname = dev::pick_interface(a.dev.as_deref())?;
    let ctx = dev::open(&ifname, a.drop)?;
    let opts = perftest::Opts {
        test: a.test,
        server: a.server,
        port: a.port,
        size: a.size.unwrap_or(a.test.default_size()),
        iters: a.iters.unwrap_or(a.test.default_iters()),
        tx_depth: a.tx_depth,
        rx_depth: a.rx_depth,
        gid_idx: a.gid_idx,
        mtu: a.mtu,
        atomic: a.atomic,
        json: a.json,
        stats: a.stats,
    };
    perftest::run(&ctx, &opts)
}

fn stat(dir: &std::path::Path, all: bool) -> Result<()> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("{}: no urnic device has published counters here", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "stat"))
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("no urnic device is running (nothing in {})", dir.display());
    }
    for f in files {
        let text = std::fs::read_to_string(&f).with_context(|| f.display().to_string())?;
        println!("# {}", f.display());
        for line in text.lines() {
            if all || !line.ends_with(" 0") {
                println!("{line}");
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Demo { link, datapath, shards, xdp_mode, pcap, stats, sizes, iters, tx_depth, link_mtu, lat_iters, pcap_dir } => demo(&DemoOpts {
            sizes: &sizes,
            iters,
            depth: tx_depth,
            link_mtu,
            lat_iters,
            pcap_dir: pcap_dir.as_deref(),
            link,
            datapath,
            xdp_mode,
            pcap: pcap.as_deref(),
            stats,
            shards,
        }),
        Cmd::Stat { dir, all } => stat(&dir, all),
        Cmd::Devinfo { dev, verbose } => devinfo::run(dev.as_deref(), verbose),
        Cmd::RcPingpong(a) => run_pingpong(a, true),
        Cmd::Perf(a) => run_perf(a),
        Cmd::DcqcnSim { out } => dcqcn_plot::run_all(&out),
        Cmd::Bench { ceiling_only: Some(mtu), .. } => bench::ceiling_only(if mtu == "4096" { 4096 } else { 1024 }),
        Cmd::Bench { runs, report: Some(dir), .. } => bench::report(&dir, runs),
        Cmd::Bench { runs, report: None, .. } => bench::run(runs),
        Cmd::UdPingpong(a) => run_pingpong(a, false),
        // soak reports its errors as text.
        Cmd::Soak(a) => soak::run(&a).map_err(anyhow::Error::msg),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // `:#`: each context, then its cause ("what: why").
            eprintln!("urnic: {e:#}");
            ExitCode::FAILURE
        }
    }
}
