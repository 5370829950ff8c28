//! urnic's XDP program and its loader.
//!
//! The program (`src/bpf/urnic.bpf.c`, compiled by clang through
//! libbpf-cargo at build time and embedded here) sends RoCEv2 — UDP to port
//! 4791 (configurable) addressed to one of our IPs — to the AF_XDP socket of
//! the queue it arrived on, through an XSKMAP; ARP, ICMP, neighbour
//! discovery and all other traffic pass to the kernel. It counts every
//! decision per reason ([`XdpCounters`]) and can impair our traffic for tests
//! ([`Impairments`]: loss, bit corruption and ECN CE marking by probability,
//! in the [`Faults`] vocabulary the simulator and the in-memory hub share, or
//! CE marking above a packet rate), since these machines have no netem.
//!
//! [`XdpProgram::attach`] loads the object with libbpf-rs and attaches it to
//! an interface of the calling thread's network namespace through a BPF link:
//! native (driver) mode where the driver supports it, generic (skb) mode
//! otherwise, or as asked. Dropping the [`XdpProgram`] closes the link, which
//! detaches the program from whichever thread or namespace drops it — and
//! the kernel does the same if the process dies, so no program is left
//! behind on an interface.

#![deny(missing_docs)]

use std::fmt;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};

use libbpf_rs::{MapCore, MapFlags, Object, ObjectBuilder, XdpFlags};
pub use rocev2::impair::Faults;

/// The IANA RoCEv2 port.
pub const DEFAULT_UDP_PORT: u16 = 4791;
/// Addresses per family the program matches.
pub const MAX_ADDRS: usize = 8;

static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/urnic.bpf.o"));

/// Which XDP mode to attach in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AttachMode {
    /// Native if the driver supports it, else generic.
    #[default]
    Auto,
    /// Native (driver) mode only.
    Native,
    /// Generic (skb) mode only.
    Generic,
}

/// Test impairments applied to our traffic only, as it arrives (off by
/// default).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Impairments {
    /// Fault probabilities per frame, in the vocabulary the simulator's links
    /// and the in-memory hub share. The program does [`Faults::loss`] (drops
    /// the frame), [`Faults::corrupt`] (flips one random bit of the UDP
    /// payload, the first 8 KiB of it) and [`Faults::ecn_mark`] (marks an
    /// ECN-capable frame CE, IPv4 header checksum fixed). It cannot
    /// duplicate or hold back a frame: a nonzero [`Faults::duplicate`] or
    /// [`Faults::reorder`] is refused ([`XdpError::Config`]).
    pub faults: Faults,
    /// Mark ECN-capable frames CE while our frames arrive faster than this
    /// many packets per second; 0 = off. A phantom queue over all CPUs,
    /// drained at this rate, with a burst tolerance of max(250 µs, one packet
    /// interval): once a rate above the limit has used up the tolerance,
    /// nearly every frame is marked until the rate falls below the limit
    /// (step marking, like a switch queue above its ECN threshold).
    pub ecn_mark_above_pps: u64,
}

impl From<Faults> for Impairments {
    /// `faults`, without rate-triggered marking.
    fn from(faults: Faults) -> Self {
        Impairments { faults, ecn_mark_above_pps: 0 }
    }
}

/// The program's configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct XdpConfig {
    /// UDP destination port of our traffic.
    pub udp_port: u16,
    /// Our IPv4 addresses (none of either family: accept any destination).
    pub ipv4: Vec<[u8; 4]>,
    /// Our IPv6 addresses.
    pub ipv6: Vec<[u8; 16]>,
    /// Attach mode.
    pub mode: AttachMode,
    /// Test impairments.
    pub impairments: Impairments,
}

impl Default for XdpConfig {
    fn default() -> Self {
        XdpConfig { udp_port: DEFAULT_UDP_PORT, ipv4: Vec::new(), ipv6: Vec::new(), mode: AttachMode::Auto, impairments: Impairments::default() }
    }
}

/// The program's counters, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XdpCounters {
    /// Every frame the program ran on.
    pub seen: u64,
    /// Sent to our AF_XDP socket.
    pub redirected: u64,
    /// Passed: not IPv4/IPv6 (ARP...).
    pub pass_not_ip: u64,
    /// Passed: not UDP (ICMP, TCP, ND...).
    pub pass_not_udp: u64,
    /// Passed: UDP to another port (or a non-first fragment).
    pub pass_other_port: u64,
    /// Passed: our port, but not to one of our addresses.
    pub pass_not_ours: u64,
    /// Passed: headers truncated or malformed.
    pub pass_malformed: u64,
    /// Passed: ours, but no socket on this queue.
    pub pass_no_socket: u64,
    /// Dropped by the drop impairment.
    pub impair_dropped: u64,
    /// CE-marked by the ECN impairment.
    pub impair_ce_marked: u64,
    /// Corrupted by the corruption impairment.
    pub impair_corrupted: u64,
}

impl XdpCounters {
    /// Every counter with its name.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
        [
            ("seen", self.seen),
            ("redirected", self.redirected),
            ("pass_not_ip", self.pass_not_ip),
            ("pass_not_udp", self.pass_not_udp),
            ("pass_other_port", self.pass_other_port),
            ("pass_not_ours", self.pass_not_ours),
            ("pass_malformed", self.pass_malformed),
            ("pass_no_socket", self.pass_no_socket),
            ("impair_dropped", self.impair_dropped),
            ("impair_ce_marked", self.impair_ce_marked),
            ("impair_corrupted", self.impair_corrupted),
        ]
        .into_iter()
    }

    fn from_slots(s: &[u64; 11]) -> XdpCounters {
        XdpCounters {
            seen: s[0],
            redirected: s[1],
            pass_not_ip: s[2],
            pass_not_udp: s[3],
            pass_other_port: s[4],
            pass_not_ours: s[5],
            pass_malformed: s[6],
            pass_no_socket: s[7],
            impair_dropped: s[8],
            impair_ce_marked: s[9],
            impair_corrupted: s[10],
        }
    }
}

/// Why loading, attaching or configuring the program failed.
#[derive(Debug)]
pub enum XdpError {
    /// The configuration is invalid.
    Config(String),
    /// libbpf could not open or load the object (verifier, permissions).
    Load(String),
    /// Attaching to the interface failed in every mode tried.
    Attach(String),
    /// A map lookup or update failed.
    Map(String),
    /// No such interface.
    NoInterface(String),
}

impl fmt::Display for XdpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            XdpError::Config(m) => write!(f, "bad XDP configuration: {m}"),
            XdpError::Load(m) => write!(f, "loading the XDP program: {m}"),
            XdpError::Attach(m) => write!(f, "attaching the XDP program: {m}"),
            XdpError::Map(m) => write!(f, "XDP map: {m}"),
            XdpError::NoInterface(m) => write!(f, "no such interface: {m}"),
        }
    }
}

impl std::error::Error for XdpError {}

/// `struct urnic_cfg` of the C program, byte for byte. The C names predate
/// [`Faults`]: `drop_thresh` is [`Faults::loss`], `ce_thresh`
/// [`Faults::ecn_mark`], `ce_above_pps` [`Impairments::ecn_mark_above_pps`].
#[repr(C)]
#[derive(Clone, Copy)]
struct Config {
    udp_port: u16,
    n_ipv4: u16,
    n_ipv6: u16,
    pad0: u16,
    ipv4: [u32; MAX_ADDRS],
    ipv6: [[u8; 16]; MAX_ADDRS],
    drop_thresh: u32,
    corrupt_thresh: u32,
    ce_thresh: u32,
    pad1: u32,
    ce_above_pps: u64,
}

/// Must equal the C `_Static_assert`.
const CONFIG_SIZE: usize = 192;
const _: () = assert!(std::mem::size_of::<Config>() == CONFIG_SIZE);

impl Config {
    fn to_bytes(self) -> [u8; CONFIG_SIZE] {
        let mut b = [0u8; CONFIG_SIZE];
        b[0..2].copy_from_slice(&self.udp_port.to_ne_bytes());
        b[2..4].copy_from_slice(&self.n_ipv4.to_ne_bytes());
        b[4..6].copy_from_slice(&self.n_ipv6.to_ne_bytes());
        for (i, a) in self.ipv4.iter().enumerate() {
            b[8 + 4 * i..12 + 4 * i].copy_from_slice(&a.to_ne_bytes());
        }
        for (i, a) in self.ipv6.iter().enumerate() {
            b[40 + 16 * i..56 + 16 * i].copy_from_slice(a);
        }
        b[168..172].copy_from_slice(&self.drop_thresh.to_ne_bytes());
        b[172..176].copy_from_slice(&self.corrupt_thresh.to_ne_bytes());
        b[176..180].copy_from_slice(&self.ce_thresh.to_ne_bytes());
        b[184..192].copy_from_slice(&self.ce_above_pps.to_ne_bytes());
        b
    }
}

/// A probability as the program's threshold on a random u32 (`p` checked
/// to be in `0..=1`).
fn threshold(p: f64) -> u32 {
    (p * f64::from(u32::MAX)).round() as u32
}

/// The program's thresholds for loss, corruption and CE marking, in the
/// order of `Config`; faults it cannot apply are refused.
fn thresholds(f: &Faults) -> Result<[u32; 3], XdpError> {
    f.check().map_err(|e| XdpError::Config(e.to_string()))?;
    if f.duplicate > 0.0 || f.reorder > 0.0 {
        return Err(XdpError::Config(format!(
            "the XDP program cannot duplicate or reorder frames (duplicate {}, reorder {})",
            f.duplicate, f.reorder
        )));
    }
    Ok([threshold(f.loss), threshold(f.corrupt), threshold(f.ecn_mark)])
}

fn build_config(udp_port: u16, ipv4: &[[u8; 4]], ipv6: &[[u8; 16]], imp: &Impairments) -> Result<Config, XdpError> {
    if ipv4.len() > MAX_ADDRS || ipv6.len() > MAX_ADDRS {
        return Err(XdpError::Config(format!("{} IPv4 and {} IPv6 addresses: at most {MAX_ADDRS} of each", ipv4.len(), ipv6.len())));
    }
    if udp_port == 0 {
        return Err(XdpError::Config("UDP port 0".into()));
    }
    let [drop_thresh, corrupt_thresh, ce_thresh] = thresholds(&imp.faults)?;
    let mut c = Config {
        udp_port,
        n_ipv4: ipv4.len() as u16,
        n_ipv6: ipv6.len() as u16,
        pad0: 0,
        ipv4: [0; MAX_ADDRS],
        ipv6: [[0; 16]; MAX_ADDRS],
        drop_thresh,
        corrupt_thresh,
        ce_thresh,
        pad1: 0,
        ce_above_pps: imp.ecn_mark_above_pps,
    };
    for (d, s) in c.ipv4.iter_mut().zip(ipv4) {
        // Network order in memory, as the program compares with the header.
        *d = u32::from_ne_bytes(*s);
    }
    for (d, s) in c.ipv6.iter_mut().zip(ipv6) {
        *d = *s;
    }
    Ok(c)
}

/// The interface index of `name` in the calling thread's network namespace.
pub fn ifindex_of(name: &str) -> Result<u32, XdpError> {
    let c = std::ffi::CString::new(name).map_err(|_| XdpError::NoInterface(format!("{name:?} contains a NUL byte")))?;
    // SAFETY: `c` is NUL-terminated.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        let os = std::io::Error::last_os_error();
        return Err(XdpError::NoInterface(format!("{name:?} in the calling thread's network namespace ({os})")));
    }
    Ok(i)
}

/// The loaded, attached program. Detached on drop.
pub struct XdpProgram {
    obj: Object,
    ifindex: u32,
    mode: AttachMode,
    /// The BPF link holding the attachment (closing it detaches).
    link: Option<OwnedFd>,
    cfg: std::sync::Mutex<Config>,
}

impl XdpProgram {
    /// Load the program, configure it and attach it to `ifindex` (of the
    /// calling thread's network namespace).
    pub fn attach(ifindex: u32, cfg: &XdpConfig) -> Result<XdpProgram, XdpError> {
        let config = build_config(cfg.udp_port, &cfg.ipv4, &cfg.ipv6, &cfg.impairments)?;
        let open = ObjectBuilder::default().open_memory(OBJECT).map_err(|e| XdpError::Load(e.to_string()))?;
        let obj = open.load().map_err(|e| XdpError::Load(format!("{e} (root, or CAP_BPF + CAP_NET_ADMIN, needed)")))?;
        let mut prog = XdpProgram { obj, ifindex, mode: AttachMode::Auto, link: None, cfg: std::sync::Mutex::new(config) };
        prog.write_config(&config)?;
        let modes: &[AttachMode] = match cfg.mode {
            AttachMode::Auto => &[AttachMode::Native, AttachMode::Generic],
            AttachMode::Native => &[AttachMode::Native],
            AttachMode::Generic => &[AttachMode::Generic],
        };
        let mut errors = Vec::new();
        for &m in modes {
            match prog.link_create(m) {
                Ok(link) => {
                    prog.mode = m;
                    prog.link = Some(link);
                    return Ok(prog);
                }
                Err(e) => errors.push(format!("{m:?}: {e}")),
            }
        }
        Err(XdpError::Attach(format!("ifindex {ifindex}: {}", errors.join("; "))))
    }

    /// Attach through a BPF link (`BPF_LINK_CREATE`, `BPF_XDP`) in mode `m`.
    fn link_create(&self, m: AttachMode) -> Result<OwnedFd, XdpError> {
        let prog =
            self.obj.progs().find(|p| p.name() == "urnic_xdp").ok_or_else(|| XdpError::Load("program urnic_xdp missing from the object".into()))?;
        // SAFETY: the options struct is plain data; zeroed is its default.
        let mut opts: libbpf_rs::libbpf_sys::bpf_link_create_opts = unsafe { std::mem::zeroed() };
        opts.sz = std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_link_create_opts>() as _;
        opts.flags = flags(m).bits();
        // SAFETY: a valid program fd, the interface index as target, and
        // options of the size we declare.
        let fd =
            unsafe { libbpf_rs::libbpf_sys::bpf_link_create(prog.as_fd().as_raw_fd(), self.ifindex as i32, libbpf_rs::libbpf_sys::BPF_XDP, &opts) };
        if fd < 0 {
            return Err(XdpError::Attach(std::io::Error::from_raw_os_error(-fd).to_string()));
        }
        // SAFETY: a fresh link fd that we own.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn map(&self, name: &str) -> Result<libbpf_rs::Map<'_>, XdpError> {
        self.obj.maps().find(|m| m.name() == name).ok_or_else(|| XdpError::Map(format!("map {name} missing from the object")))
    }

    /// Restart the ecn_mark_above_pps rate meter (after its limit changed).
    fn reset_rate_meter(&self) -> Result<(), XdpError> {
        self.map("rate")?.update(&0u32.to_ne_bytes(), &0u64.to_ne_bytes(), MapFlags::ANY).map_err(|e| XdpError::Map(format!("rate: {e}")))
    }

    fn write_config(&self, c: &Config) -> Result<(), XdpError> {
        self.map("config")?.update(&0u32.to_ne_bytes(), &c.to_bytes(), MapFlags::ANY).map_err(|e| XdpError::Map(format!("config: {e}")))
    }

    /// The mode the program is attached in (native or generic).
    pub fn mode(&self) -> AttachMode {
        self.mode
    }

    /// The interface it is attached to.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// Steer our frames arriving on `queue` to the AF_XDP socket `fd`.
    pub fn register_socket(&self, queue: u32, fd: RawFd) -> Result<(), XdpError> {
        self.map("xsks")?
            .update(&queue.to_ne_bytes(), &(fd as u32).to_ne_bytes(), MapFlags::ANY)
            .map_err(|e| XdpError::Map(format!("xsks[{queue}] = fd {fd}: {e}")))
    }

    /// Stop steering frames of `queue` to a socket (they pass to the kernel).
    pub fn unregister_socket(&self, queue: u32) -> Result<(), XdpError> {
        self.map("xsks")?.delete(&queue.to_ne_bytes()).map_err(|e| XdpError::Map(format!("xsks[{queue}]: {e}")))
    }

    /// Change the impairments of the running program.
    pub fn set_impairments(&self, imp: &Impairments) -> Result<(), XdpError> {
        let mut cur = self.cfg.lock().unwrap_or_else(|e| e.into_inner());
        let [drop_thresh, corrupt_thresh, ce_thresh] = thresholds(&imp.faults)?;
        let next = Config { drop_thresh, corrupt_thresh, ce_thresh, ce_above_pps: imp.ecn_mark_above_pps, ..*cur };
        self.write_config(&next)?;
        if next.ce_above_pps != cur.ce_above_pps {
            self.reset_rate_meter()?;
        }
        *cur = next;
        Ok(())
    }

    /// Change the addresses the program treats as ours.
    pub fn set_addresses(&self, ipv4: &[[u8; 4]], ipv6: &[[u8; 16]]) -> Result<(), XdpError> {
        let mut cur = self.cfg.lock().unwrap_or_else(|e| e.into_inner());
        let a = build_config(cur.udp_port, ipv4, ipv6, &Impairments::default())?;
        let next = Config { n_ipv4: a.n_ipv4, n_ipv6: a.n_ipv6, ipv4: a.ipv4, ipv6: a.ipv6, ..*cur };
        self.write_config(&next)?;
        *cur = next;
        Ok(())
    }

    /// The counters, summed over CPUs.
    pub fn counters(&self) -> Result<XdpCounters, XdpError> {
        let map = self.map("counters")?;
        let mut slots = [0u64; 11];
        for (i, slot) in slots.iter_mut().enumerate() {
            let per_cpu = map
                .lookup_percpu(&(i as u32).to_ne_bytes(), MapFlags::ANY)
                .map_err(|e| XdpError::Map(format!("counters[{i}]: {e}")))?
                .unwrap_or_default();
            *slot = per_cpu.iter().filter_map(|v| v.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok())).map(u64::from_ne_bytes).sum();
        }
        Ok(XdpCounters::from_slots(&slots))
    }
}

impl Drop for XdpProgram {
    /// Detach from the interface (from whichever thread or namespace drops
    /// it): `BPF_LINK_DETACH` first, so that the program goes even if a copy
    /// of the link fd lives on somewhere, then close the link. Errors are
    /// ignored (the interface may be gone already).
    fn drop(&mut self) {
        if let Some(link) = self.link.take() {
            // SAFETY: `link` is an open BPF link fd owned by us.
            unsafe {
                libbpf_rs::libbpf_sys::bpf_link_detach(link.as_raw_fd());
            }
            drop(link);
        }
    }
}

fn flags(m: AttachMode) -> XdpFlags {
    match m {
        AttachMode::Native => XdpFlags::DRV_MODE,
        AttachMode::Generic => XdpFlags::SKB_MODE,
        AttachMode::Auto => XdpFlags::NONE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_layout_matches_the_c_struct() {
        let c = build_config(4791, &[[10, 0, 0, 1]], &[[0xfe; 16]], &Faults { loss: 1.0, ..Faults::NONE }.into()).unwrap();
        let b = c.to_bytes();
        assert_eq!(u16::from_ne_bytes([b[0], b[1]]), 4791);
        assert_eq!(&b[8..12], &[10, 0, 0, 1], "IPv4 addresses in network order");
        assert_eq!(&b[40..56], &[0xfe; 16]);
        assert_eq!(u32::from_ne_bytes(b[168..172].try_into().unwrap()), u32::MAX);
        // Size as the C `_Static_assert`, offsets as clang lays the struct out.
        assert_eq!(std::mem::size_of::<Config>(), CONFIG_SIZE);
        assert_eq!(std::mem::offset_of!(Config, ipv4), 8);
        assert_eq!(std::mem::offset_of!(Config, ipv6), 40);
        assert_eq!(std::mem::offset_of!(Config, drop_thresh), 168);
        assert_eq!(std::mem::offset_of!(Config, ce_above_pps), 184);
    }

    #[test]
    fn bad_configurations_are_refused_with_reasons() {
        let imp = Impairments::from(Faults { loss: 1.5, ..Faults::NONE });
        let e = build_config(4791, &[], &[], &imp).err().unwrap().to_string();
        assert!(e.contains("loss probability 1.5"), "{e}");
        for f in [Faults { duplicate: 0.1, ..Faults::NONE }, Faults { reorder: 1.0, ..Faults::NONE }] {
            let e = build_config(4791, &[], &[], &f.into()).err().unwrap().to_string();
            assert!(e.contains("cannot duplicate or reorder"), "{e}");
        }
        let e = build_config(4791, &[[1, 2, 3, 4]; 9], &[], &Impairments::default()).err().unwrap().to_string();
        assert!(e.contains("at most 8"), "{e}");
        let e = build_config(0, &[], &[], &Impairments::default()).err().unwrap().to_string();
        assert!(e.contains("port 0"), "{e}");
        let imp = Impairments::from(Faults { ecn_mark: f64::NAN, ..Faults::NONE });
        assert!(build_config(4791, &[], &[], &imp).is_err());
        let c = build_config(4791, &[], &[], &Impairments { faults: Faults { corrupt: 1.0, ecn_mark: 0.5, ..Faults::NONE }, ecn_mark_above_pps: 7 })
            .unwrap();
        assert_eq!((c.drop_thresh, c.corrupt_thresh, c.ce_thresh, c.ce_above_pps), (0, u32::MAX, threshold(0.5), 7));
    }

    #[test]
    fn counters_have_one_name_each() {
        let c = XdpCounters::from_slots(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
        let v: Vec<_> = c.iter().collect();
        assert_eq!(v.len(), 11);
        assert_eq!(v[0], ("seen", 1));
        assert_eq!(v[10], ("impair_corrupted", 11));
    }
}
