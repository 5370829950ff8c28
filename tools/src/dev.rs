//! Opening a urnic device for the command-line tools: on an interface of the
//! current network namespace, through AF_XDP.

use anyhow::Context as _;
use urnic::{device_list, open_af_xdp, Context, DatapathMode, IdlePolicy, XskConfig};

/// The interface to use: `name`, or the first Ethernet interface that is up
/// and has an IPv4 address.
pub fn pick_interface(name: Option<&str>) -> anyhow::Result<String> {
    if let Some(n) = name {
        return Ok(n.to_string());
    }
    let list = device_list().context("listing interfaces")?;
    list.iter()
        .find(|d| d.link_up && !d.ipv4.is_empty())
        .map(|d| d.ifname.clone())
        .context("no Ethernet interface with an IPv4 address is up here; name one with -d IFNAME")
}

/// Open the urnic device on `ifname` (AF_XDP, XDP program attached) in
/// run-to-completion mode: the tool's own thread drives the datapath from
/// its polling loops (`Context::poll`), as perftest's thread drives a
/// hardware NIC — no second spinning thread competing for the cores.
/// `drop` > 0 makes the XDP program drop that share of the RoCE frames we
/// receive (a test impairment, to watch retransmission against a peer).
pub fn open(ifname: &str, drop: f64) -> anyhow::Result<Context> {
    let _ = IdlePolicy::default();
    let mut xsk = XskConfig::new(ifname);
    xsk.xdp.impairments.drop_prob = drop;
    open_af_xdp(None, &format!("urnic-{ifname}"), &xsk, DatapathMode::Manual)
        .with_context(|| format!("opening a urnic device on {ifname} (needs root)"))
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
