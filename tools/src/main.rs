//! `urnic`: the command-line tool.

mod perf;
mod report;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use urnic::{open_device, DatapathMode, DeviceConfig, MemHub};

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
    /// Two urnic devices in this process, joined by an in-memory link, moving
    /// RDMA traffic: WRITE bandwidth and SEND latency, perftest-style.
    Demo {
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
}

fn demo(sizes: &[usize], iters: usize, depth: usize, link_mtu: u32, lat_iters: usize, pcap_dir: Option<&std::path::Path>) -> Result<(), String> {
    let hub = MemHub::new(1);
    let mut ca = DeviceConfig::memory(&hub, "urnic0", [0x02, 0, 0, 0, 0, 1], [10, 0, 0, 1]);
    let mut cb = DeviceConfig::memory(&hub, "urnic1", [0x02, 0, 0, 0, 0, 2], [10, 0, 0, 2]);
    ca.link_mtu = link_mtu;
    cb.link_mtu = link_mtu;
    // Run-to-completion: this thread drives both devices' datapaths itself
    // (no datapath threads competing for the cores), as an embedding would.
    ca.datapath = DatapathMode::Manual;
    cb.datapath = DatapathMode::Manual;
    let a = open_device(ca).map_err(|e| e.to_string())?;
    let b = open_device(cb).map_err(|e| e.to_string())?;
    if let Some(dir) = pcap_dir {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for ctx in [&a, &b] {
            let path = dir.join(format!("{}.pcap", ctx.name()));
            ctx.nic().set_capture(Some(&path)).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    let max = sizes.iter().copied().max().unwrap_or(64).max(8192);
    let buf = (2 * max).div_ceil(4096) * 4096;
    let mut ea = Endpoint::new(&a, buf, depth as u32)?;
    let mut eb = Endpoint::new(&b, buf, depth as u32)?;
    ea.drive = vec![a.clone(), b.clone()];
    eb.drive = vec![a.clone(), b.clone()];
    connect_pair(&ea, &eb)?;
    let mtu = a.query_port(1).map_err(|e| e.to_string())?.active_mtu.bytes();

    banner("RDMA_Write BW Test (urnic, in-memory link, run-to-completion)", "urnic0 -> urnic1", mtu, depth);
    println!("{}", bw_header());
    for &size in sizes {
        let r = write_bw(&mut ea, &mut eb, size, iters, depth)?;
        println!("{}", bw_row(r.bytes, r.iters, r.peak_mbs, r.avg_mbs));
    }
    println!("{RULE}");
    banner("Send Latency Test (urnic, in-memory link, run-to-completion)", "urnic0 <-> urnic1", mtu, 1);
    println!("{}", lat_header());
    for size in [8usize, 64, 4096] {
        let s = send_lat(&mut ea, &mut eb, size, lat_iters)?;
        println!("{}", lat_row(size, lat_iters, &s));
    }
    println!("{RULE}");
    for ctx in [&a, &b] {
        let _ = ctx.nic().set_capture(None);
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Demo { sizes, iters, tx_depth, link_mtu, lat_iters, pcap_dir } => {
            demo(&sizes, iters, tx_depth, link_mtu, lat_iters, pcap_dir.as_deref())
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("urnic: {e}");
            ExitCode::FAILURE
        }
    }
}
