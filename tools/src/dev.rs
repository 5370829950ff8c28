//! Opening a urnic device for the command-line tools: on an interface of the
//! current network namespace, through AF_XDP.

use anyhow::{bail, Context as _};
use urnic::{device_list, open_af_xdp, Context, DatapathMode, IdlePolicy, XskConfig};

/// The prefix of a device's name (`ibv_devices`, `urnic devinfo`): the
/// device on `eth0` is `urnic-eth0`.
pub const DEVICE_PREFIX: &str = "urnic-";

/// The interface `name` stands for: an interface of that name, or the
/// interface of device `urnic-<ifname>` as `urnic devinfo` and
/// `ibv_devices` print it.
pub fn interface_of(name: &str) -> anyhow::Result<String> {
    let list = device_list().context("listing interfaces")?;
    if let Some(d) = list.iter().find(|d| d.ifname == name) {
        return Ok(d.ifname.clone());
    }
    if let Some(d) = name.strip_prefix(DEVICE_PREFIX).and_then(|n| list.iter().find(|d| d.ifname == n)) {
        return Ok(d.ifname.clone());
    }
    let known: Vec<String> = list.iter().map(|d| format!("{DEVICE_PREFIX}{}", d.ifname)).collect();
    if known.is_empty() {
        bail!("IB device '{name}' wasn't found: no Ethernet interface here");
    }
    bail!("IB device '{name}' wasn't found: the devices here are {} (or name the interface)", known.join(", "))
}

/// The interface to use: the one `name` stands for ([`interface_of`]), or
/// the first Ethernet interface that is up and has an IPv4 address.
pub fn pick_interface(name: Option<&str>) -> anyhow::Result<String> {
    if let Some(n) = name {
        return interface_of(n);
    }
    let list = device_list().context("listing interfaces")?;
    list.iter()
        .find(|d| d.link_up && !d.ipv4.is_empty())
        .map(|d| d.ifname.clone())
        .context("no Ethernet interface with an IPv4 address is up here; name one with -d IFNAME")
}

/// Who drives an opened device's datapath.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drive {
    /// The tool's own thread, from its polling loops (`Context::poll`), as
    /// perftest's thread drives a hardware NIC: no second spinning thread
    /// competing for the cores.
    Caller,
    /// A datapath thread of the device, as a NIC runs by itself: for tools
    /// that sleep on completion events (`-e`) instead of polling.
    Thread,
}

/// Open the urnic device on `ifname` (AF_XDP, XDP program attached) and
/// publish its counters for `urnic stat`. `drop` > 0 makes the XDP program
/// drop that share of the RoCE frames we receive (a test impairment, to
/// watch retransmission against a peer).
pub fn open(ifname: &str, drop: f64, drive: Drive) -> anyhow::Result<Context> {
    let mut xsk = XskConfig::new(ifname);
    xsk.xdp.impairments.faults.loss = drop;
    let mode = match drive {
        Drive::Caller => DatapathMode::Manual,
        Drive::Thread => DatapathMode::Thread { core: None, idle: IdlePolicy::default() },
    };
    let ctx = open_af_xdp(None, &format!("{DEVICE_PREFIX}{ifname}"), &xsk, mode).with_context(|| format!("opening a urnic device on {ifname}"))?;
    crate::stat::publish(&ctx);
    Ok(ctx)
}

/// A random 24-bit PSN (like `lrand48() & 0xffffff`).
pub fn random_psn() -> u32 {
    let mut b = [0u8; 4];
    if getrandom(&mut b).is_err() {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(1);
        b = t.to_le_bytes();
    }
    u32::from_le_bytes(b) & 0x00ff_ffff
}

fn getrandom(buf: &mut [u8]) -> std::io::Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")?.read_exact(buf)
}

/// Whether a GID is an IPv4-mapped address (`::ffff:a.b.c.d`).
pub fn is_ipv4_mapped(g: &[u8; 16]) -> bool {
    g[..10].iter().all(|&b| b == 0) && g[10] == 0xff && g[11] == 0xff
}
