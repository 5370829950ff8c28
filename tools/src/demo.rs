//! `urnic demo`: two urnic devices moving RDMA traffic, WRITE bandwidth and
//! SEND latency, perftest-style: each in its own network namespace joined
//! by veth through AF_XDP, or joined in memory.

use anyhow::{bail, Context as _, Result};
use urnic::{open_af_xdp, open_device, xdp, BindMode, Context, DatapathMode, DeviceConfig, IdlePolicy, MemHub, XskConfig};
use urnic_datapath::netns::VethPair;

use crate::out::outln;
use crate::perf::{banner, connect_pair, send_lat, write_bw, Endpoint};
use crate::perftest::PERFTEST_MB;
use crate::report::{bw_header, bw_row, lat_header, lat_row, RULE};

/// How the two devices are joined.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Link {
    /// Two network namespaces, veth, AF_XDP, the XDP program (root).
    Veth,
    /// In memory (no privileges).
    Memory,
}

/// Who runs the datapaths.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Datapath {
    /// This thread, for both devices (run-to-completion).
    Manual,
    /// One polling thread per device.
    Thread,
}

/// XDP attach mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum XdpMode {
    /// Native if the driver can, else generic.
    Auto,
    /// Driver mode.
    Native,
    /// Generic (SKB) mode.
    Generic,
}

/// Options of `urnic demo` (as its command line, validated there).
#[allow(missing_docs)]
pub struct DemoOpts<'a> {
    pub sizes: &'a [usize],
    pub iters: usize,
    pub depth: usize,
    pub link_mtu: u32,
    pub lat_iters: usize,
    pub lat_sizes: &'a [usize],
    pub pcap_dir: Option<&'a std::path::Path>,
    pub link: Link,
    pub datapath: Datapath,
    pub xdp_mode: XdpMode,
    pub pcap: Option<&'a std::path::Path>,
    pub stats: bool,
    pub shards: usize,
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
                    p.as_any_mut()
                        .and_then(|p| p.downcast_mut::<urnic_datapath::XskPort>())
                        .map(|x| format!("{:?} XDP, {} AF_XDP", x.xdp_mode(), if x.zero_copy() { "zero-copy" } else { "copy-mode" }))
                })
                .unwrap_or_default();
            let desc = format!("veth {}/{} <-> {}/{}, {how}", pair.ns[0], pair.ifname[0], pair.ns[1], pair.ifname[1]);
            Ok((a, b, Some(pair), desc))
        }
    }
}

/// Run the demo.
pub fn run(o: &DemoOpts) -> Result<()> {
    let DemoOpts { sizes, iters, depth, lat_iters, lat_sizes, pcap_dir, .. } = *o;
    // Run-to-completion by default: this thread drives both devices'
    // datapaths itself (no datapath threads competing for the two cores),
    // as an embedding would.
    let (a, b, _pair, link_desc) = demo_devices(o)?;
    for ctx in [&a, &b] {
        // `urnic stat` in another terminal shows them live.
        crate::stat::publish(ctx);
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
    let max = sizes.iter().chain(lat_sizes).copied().max().unwrap_or(64).max(8192);
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
    outln!(" Link: {link_desc}; {how}")?;
    banner("RDMA_Write BW Test (urnic)", "urnic0 -> urnic1", mtu, depth)?;
    outln!("{}", bw_header())?;
    for &size in sizes {
        let r = write_bw(&mut ea, &mut eb, size, iters, depth)?;
        // perftest's columns: MB of 2^20 bytes, millions of messages a second.
        let mib = |mbs: f64| mbs * 1e6 / PERFTEST_MB;
        let mpps = if r.bytes == 0 { 0.0 } else { r.avg_mbs / r.bytes as f64 };
        outln!("{}", bw_row(r.bytes, r.iters, mib(r.peak_mbs), mib(r.avg_mbs), mpps))?;
    }
    outln!("{RULE}")?;
    banner("Send Latency Test (urnic)", "urnic0 <-> urnic1", mtu, 1)?;
    outln!("{}", lat_header())?;
    for &size in lat_sizes {
        let s = send_lat(&mut ea, &mut eb, size, lat_iters)?;
        outln!("{}", lat_row(size, lat_iters, &s))?;
    }
    outln!("{RULE}")?;
    for ctx in [&a, &b] {
        let _ = ctx.nic().set_capture(None);
        if o.stats {
            crate::out::text(&ctx.counters().to_string())?;
        }
    }
    Ok(())
}
