//! `urnic`: the command-line tool.

mod bench;
mod cmatose;
mod dcqcn_plot;
mod demo;
mod dev;
mod devinfo;
mod exec;
mod logging;
mod out;
mod peer;
mod perf;
mod perftest;
mod pingpong;
mod plot;
mod progress;
mod report;
mod signals;
mod soak;
mod stat;

use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};

use crate::demo::{Datapath, Link, XdpMode};
use crate::peer::Peer;

#[derive(Parser)]
#[command(
    name = "urnic",
    version,
    about = "urnic, a userspace RoCEv2 NIC: tools",
    after_help = "Diagnostics: -v (debug) or -vv (trace) before the command, or RUST_LOG (e.g. RUST_LOG=urnic_datapath=debug)."
)]
struct Cli {
    /// More diagnostics on stderr: device open, neighbour resolution, QP
    /// state changes, retransmissions and NAKs (-v), everything (-vv).
    /// RUST_LOG overrides.
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    cmd: Cmd,
}

/// A message size: 1 byte to urnic's largest message (rxe's 8 MiB).
fn message_size(s: &str) -> std::result::Result<usize, String> {
    let max = urnic::DeviceLimits::default().max_msg_size;
    let v: u64 = s.trim().parse().map_err(|e| format!("{e}"))?;
    if v == 0 || v > u64::from(max) {
        return Err(format!("a message is 1 to {max} bytes (the largest message of a urnic device)"));
    }
    Ok(v as usize)
}

/// A probability, 0 to 1.
fn probability(s: &str) -> std::result::Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err("expected a probability from 0 to 1".into()),
    }
}

/// Work requests outstanding: 1 to a queue's limit.
fn depth(s: &str) -> std::result::Result<u32, String> {
    let max = urnic::DeviceLimits::default().max_qp_wr;
    match s.trim().parse::<u32>() {
        Ok(v) if (1..=max).contains(&v) => Ok(v),
        _ => Err(format!("expected 1 to {max} (work requests a urnic queue holds)")),
    }
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
        /// Message sizes for the bandwidth test (1 B to 8 MiB).
        #[arg(long, value_delimiter = ',', value_parser = message_size, default_values_t = [64usize, 1024, 4096, 65536, 1 << 20])]
        sizes: Vec<usize>,
        /// Messages per size.
        #[arg(short = 'n', long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(1..))]
        iters: u32,
        /// Outstanding WRITEs.
        #[arg(short = 't', long, default_value_t = 128, value_parser = depth)]
        tx_depth: u32,
        /// Link MTU (1500 → IB MTU 1024, 9000 → 4096).
        #[arg(long, default_value_t = 1500)]
        link_mtu: u32,
        /// Ping-pong iterations for the latency test.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
        lat_iters: u32,
        /// Message sizes for the latency test (SEND ping-pong; 1 B to 8 MiB).
        #[arg(long, value_delimiter = ',', value_parser = message_size, default_values_t = [8usize, 64, 4096])]
        lat_sizes: Vec<usize>,
        /// Capture each device's frames into DIR/urnic0.pcap and DIR/urnic1.pcap.
        #[arg(long, value_name = "DIR")]
        pcap_dir: Option<std::path::PathBuf>,
    },
    /// Like ibv_devinfo: the interfaces a urnic device can be opened on, with
    /// port attributes and GID table.
    Devinfo {
        /// Only this device (`urnic-IFNAME`, as listed) or interface.
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
    /// rdmacm-utils' ucmatose on urnic's RDMA-CM (the peer may be ucmatose
    /// on rxe or a ConnectX): connections by address and port through CM
    /// MADs on QP1, messages each way, disconnect.
    Ucmatose(cmatose::CmatoseArgs),
    /// perftest-compatible tests (ib_send_bw, ib_write_bw, ...): the same
    /// TCP exchange and options, so the peer may be perftest on rxe or a
    /// ConnectX, or urnic.
    Perf(PerfArgs),
    /// urnic (one and two cores) against the baselines on the same veth, in
    /// one run: raw AF_XDP frame forwarding, kernel TCP (iperf3, ping-pong),
    /// kernel UDP ping-pong; a markdown table of medians and ratios (root).
    Bench {
        /// Repetitions (medians are reported).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
        runs: u32,
        /// Also sweep WRITE, READ and SEND bandwidth over message sizes at MTU
        /// 1024 and 4096 with one and two cores, and write report.md,
        /// sweep.csv, bandwidth_{write,read,send}.png and latency.png into DIR.
        #[arg(long, value_name = "DIR")]
        report: Option<std::path::PathBuf>,
        /// Only the raw AF_XDP ceiling, for 8 s at this IB MTU's frame size
        /// (1024 on a 1500-byte veth, 4096 on a 9000-byte one; 64: the
        /// 138-byte frame of a 64 B WRITE ONLY, the message rate's ceiling),
        /// one thread sending and receiving: a clean process to profile
        /// against `urnic demo`.
        #[arg(long, value_name = "MTU", conflicts_with = "report", value_parser = ["64", "1024", "4096"])]
        ceiling_only: Option<String>,
        /// Only the C path's rows: Debian's ib_write_bw (64 B message rate,
        /// 64 KiB bandwidth) and ib_send_lat -s 8 on urnic's libibverbs.so.1
        /// (`bash ibverbs-abi/link.sh release`) against `urnic perf` with the
        /// same parameters, bracketed C, Rust, Rust, C; ratios C / Rust.
        #[arg(long, conflicts_with_all = ["report", "ceiling_only"])]
        c_path: bool,
        /// Only the 64 B WRITE message rate against the raw ceiling's
        /// 138-byte frames (1 and 2 cores, bracketed) and the user CPU per
        /// 4154-byte frame against its floor: a quick A/B of datapath changes.
        #[arg(long, conflicts_with_all = ["report", "ceiling_only", "c_path"])]
        rate: bool,
        /// Only 8-byte SEND and WRITE latency interleaved round by round
        /// with the raw AF_XDP ping-pong, in windows labelled by a phase
        /// probe (the host's fast and slow phases), 1 and 2 cores.
        #[arg(long, conflicts_with_all = ["report", "ceiling_only", "c_path", "rate"])]
        latency: bool,
        /// Only the 64 KiB WRITE bandwidth against the raw ceiling (MTU 1024
        /// and 4096, 1 and 2 cores, bracketed) and the user CPU per
        /// 4154-byte frame against its floor: a quick A/B of per-frame changes.
        #[arg(long, conflicts_with_all = ["report", "ceiling_only", "c_path", "rate", "latency"])]
        bandwidth: bool,
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
    /// each device into DIR while it runs: every urnic tool, and programs
    /// using urnic's libibverbs.so.1).
    Stat {
        /// Where devices publish their counters.
        #[arg(long, default_value = stat::STAT_DIR)]
        dir: std::path::PathBuf,
        /// Show zero counters too.
        #[arg(long)]
        all: bool,
    },
    /// Run PROGRAM (an ibverbs program: ibv_devinfo, perftest, qperf, your
    /// own) on urnic: urnic's libibverbs.so.1 first on its library path, so
    /// it finds the `urnic-<ifname>` devices. The program replaces this
    /// process (its signals, its exit code). Its devices publish live
    /// counters for `urnic stat` (into /run/urnic unless --stats names
    /// another directory).
    Exec(exec::ExecArgs),
}

/// Options of `urnic rc-pingpong` / `ud-pingpong` (as rdma-core's tools).
#[derive(clap::Args, Debug)]
struct PingpongArgs {
    /// Server to connect to (none: be the server and wait).
    server: Option<String>,
    /// Listen on / connect to this TCP port.
    #[arg(short = 'p', long, default_value_t = 18515)]
    port: u16,
    /// Device to use: `urnic-IFNAME` as `urnic devinfo` lists it, or the interface.
    #[arg(short = 'd', long = "ib-dev")]
    dev: Option<String>,
    /// Port of the device (only 1).
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// Message size (default 4096 for RC, 2048 for UD).
    #[arg(short = 's', long, value_parser = message_size)]
    size: Option<usize>,
    /// Path MTU (RC).
    #[arg(short = 'm', long, default_value_t = 1024)]
    mtu: u32,
    /// Receives posted at a time.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500, value_parser = depth)]
    rx_depth: u32,
    /// Exchanges.
    #[arg(short = 'n', long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    iters: u32,
    /// Service level (accepted; RoCE carries none without VLAN priority).
    #[arg(short = 'l', long, default_value_t = 0)]
    sl: u8,
    /// Sleep on CQ events (a completion channel) instead of polling; a
    /// datapath thread runs the device meanwhile.
    #[arg(short = 'e', long)]
    events: bool,
    /// Local GID index.
    #[arg(short = 'g', long = "gid-idx")]
    gid_idx: Option<u8>,
    /// Validate the received buffer.
    #[arg(short = 'c', long = "chk")]
    chk: bool,
    /// Test impairment: drop this share (0..1) of the RoCE frames we receive.
    #[arg(long, default_value_t = 0.0, value_parser = probability)]
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
    /// Device to use: `urnic-IFNAME` as `urnic devinfo` lists it, or the interface.
    #[arg(short = 'd', long = "ib-dev")]
    dev: Option<String>,
    /// Message size (perftest's default per test; 1 B to 8 MiB).
    #[arg(short = 's', long, value_parser = message_size)]
    size: Option<usize>,
    /// Iterations (perftest's default per test). Both sides must run the
    /// same number.
    #[arg(short = 'n', long, value_parser = clap::value_parser!(u64).range(1..))]
    iters: Option<u64>,
    /// Outstanding WRs (bandwidth tests).
    #[arg(short = 't', long = "tx-depth", default_value_t = 128, value_parser = depth)]
    tx_depth: u32,
    /// Receive queue depth (send tests).
    #[arg(short = 'r', long = "rx-depth", default_value_t = 512, value_parser = depth)]
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
    #[arg(long, default_value_t = 0.0, value_parser = probability)]
    drop: f64,
    /// Print the device's counters at the end (retransmissions, NAKs, drops).
    #[arg(long)]
    stats: bool,
}

fn run_pingpong(a: PingpongArgs, rc: bool) -> Result<()> {
    if a.ib_port != 1 {
        bail!("port {} does not exist (urnic devices have port 1)", a.ib_port);
    }
    let _ = a.sl;
    // The server's name first: one that does not resolve cannot start to.
    let server = a.server.as_deref().map(|h| Peer::resolve(h, a.port)).transpose()?;
    let ifname = dev::pick_interface(a.dev.as_deref())?;
    // Sleeping on completion events leaves the datapath to a thread of its
    // own, as a NIC runs while rdma-core's tool sleeps.
    let ctx = dev::open(&ifname, a.drop, if a.events { dev::Drive::Thread } else { dev::Drive::Caller })?;
    let opts = pingpong::Opts {
        server,
        port: a.port,
        size: a.size.unwrap_or(if rc { 4096 } else { 2048 }),
        mtu: a.mtu,
        rx_depth: a.rx_depth,
        iters: a.iters,
        gid_idx: a.gid_idx,
        validate: a.chk,
        events: a.events,
    };
    if rc {
        pingpong::rc(&ctx, &opts)
    } else {
        pingpong::ud(&ctx, &opts)
    }
}

fn run_perf(a: PerfArgs) -> Result<()> {
    let _ = a.cpu_freq;
    let server = a.server.as_deref().map(|h| Peer::resolve(h, a.port)).transpose()?;
    let size = a.size.unwrap_or(a.test.default_size());
    if a.test == perftest::Test::AtomicBw && size != 8 {
        bail!("atomic operations are 8 bytes (-s 8)");
    }
    let ifname = dev::pick_interface(a.dev.as_deref())?;
    let ctx = dev::open(&ifname, a.drop, dev::Drive::Caller)?;
    let opts = perftest::Opts {
        test: a.test,
        server,
        port: a.port,
        size,
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

fn run(cmd: Cmd) -> Result<()> {
    match cmd {
        Cmd::Demo { link, datapath, shards, xdp_mode, pcap, stats, sizes, iters, tx_depth, link_mtu, lat_iters, lat_sizes, pcap_dir } => {
            demo::run(&demo::DemoOpts {
                sizes: &sizes,
                iters: iters as usize,
                depth: tx_depth as usize,
                link_mtu,
                lat_iters: lat_iters as usize,
                lat_sizes: &lat_sizes,
                pcap_dir: pcap_dir.as_deref(),
                link,
                datapath,
                xdp_mode,
                pcap: pcap.as_deref(),
                stats,
                shards,
            })
        }
        Cmd::Stat { dir, all } => stat::run(&dir, all),
        Cmd::Devinfo { dev, verbose } => devinfo::run(dev.as_deref(), verbose),
        Cmd::RcPingpong(a) => run_pingpong(a, true),
        Cmd::Perf(a) => run_perf(a),
        Cmd::DcqcnSim { out } => dcqcn_plot::run_all(&out),
        Cmd::Bench { runs, c_path: true, .. } => bench::c_path_only(runs as usize),
        Cmd::Bench { runs, rate: true, .. } => bench::rate_only(runs as usize),
        Cmd::Bench { runs, latency: true, .. } => bench::latency_only(runs as usize),
        Cmd::Bench { runs, bandwidth: true, .. } => bench::bandwidth_only(runs as usize),
        Cmd::Bench { ceiling_only: Some(mtu), .. } => bench::ceiling_only(mtu.parse().unwrap_or(1024)),
        Cmd::Bench { runs, report: Some(dir), .. } => bench::report(&dir, runs as usize),
        Cmd::Bench { runs, report: None, .. } => bench::run(runs as usize),
        Cmd::UdPingpong(a) => run_pingpong(a, false),
        Cmd::Ucmatose(a) => cmatose::run(&a),
        // soak reports its errors as text.
        Cmd::Soak(a) => soak::run(&a).map_err(anyhow::Error::msg),
        Cmd::Exec(a) => exec::run(&a),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.verbose);
    // `exec` hands the signals to the program it becomes; `soak` stops,
    // drains and reports on them itself. Every other command cleans up and
    // exits 130 (SIGINT) or 143 (SIGTERM).
    if !matches!(cli.cmd, Cmd::Exec(_) | Cmd::Soak(_)) {
        if let Err(e) = signals::install() {
            eprintln!("urnic: cannot handle SIGINT/SIGTERM ({e}); an interrupted run may leave namespaces behind");
        }
    }
    let r = run(cli.cmd);
    if r.is_err() && signals::cleaning_up() {
        // The command failed because the signal's cleanup pulled its
        // namespaces away: the signal thread exits with 130/143.
        signals::wait_for_signal_exit();
    }
    // Devices closed with the command; their counter files go now rather
    // than on the publisher's next tick, which this process would not see.
    signals::remove_stat_files();
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if out::is_closed_stdout(&e) => out::die_of_sigpipe(),
        Err(e) => {
            eprintln!("urnic: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// Each context, then its cause ("what: why: why"), leaving out a cause
/// whose text the message before it already carries (a `urnic::Error`
/// message includes its source's text).
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}
