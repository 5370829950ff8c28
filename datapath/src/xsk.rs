//! The AF_XDP port: frames in and out of a real interface through an AF_XDP
//! socket (xsk-rs) fed by urnic's XDP program (`urnic-xdp`).
//!
//! One UMEM per port, split between the fill ring (receive buffers lent to
//! the kernel) and a free list of transmit buffers. Receive is batched:
//! descriptors are taken from the RX ring, handed up, and given straight back
//! to the fill ring. Transmit builds each frame in place in UMEM; `flush`
//! publishes the batch on the TX ring and kicks the kernel only when it asks
//! for it (`XDP_USE_NEED_WAKEUP`). Completed TX buffers return to the free
//! list. Must be created inside the interface's network namespace
//! ([`crate::netns::in_netns`]); usable from any thread after that.

use std::cell::Cell;
use std::num::NonZeroU32;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use urnic_xdp::{AttachMode, Impairments, XdpConfig, XdpCounters, XdpError, XdpProgram};
use xsk_rs::config::{BindFlags, FrameSize, LibxdpFlags, QueueSize, SocketConfig, UmemConfig};
use xsk_rs::{CompQueue, FillQueue, FrameDesc, RxQueue, Socket, TxQueue, Umem};

use crate::netdev::Interface;
use crate::port::{Port, PortError, PortInfo};
use crate::reassembly::{spread_tail, Held, Piece, Reassembly};

pub mod claim;

/// How often [`XskPort`] asks the kernel whether the link is up.
const LINK_CHECK_EVERY: Duration = Duration::from_millis(100);

/// The longest RoCEv2 frame: a 4096-byte payload (the largest IB MTU) with
/// Ethernet + 802.1Q, IPv6, UDP, BTH, the largest extension headers (RETH +
/// immediate data, 20 bytes; an AtomicETH, 28, carries no payload) and the
/// ICRC.
const MAX_ROCE_FRAME: usize = 4096 + 14 + 4 + 40 + 8 + 12 + 20 + 4;

/// Bytes `range` (UMEM addresses) of the UMEM mapping `(base, len)` from
/// `XskPort::umem_area` (its exposed start address and length); `None` if
/// the range does not lie in the mapping.
///
/// # Safety
/// The port's `umem` must be alive for as long as the slice is used, and
/// every chunk `range` touches must be ours for that long: received and not
/// yet given back to the fill ring, or free for transmit (not on the TX
/// ring, not lent to the kernel). The kernel writes chunks it owns at any
/// time; no slice may cover them.
unsafe fn umem_span<'a>((base, len): (usize, usize), range: Range<usize>) -> Option<&'a mut [u8]> {
    if range.start > range.end || range.end > len {
        return None;
    }
    let start = std::ptr::with_exposed_provenance_mut::<u8>(base).wrapping_add(range.start);
    // SAFETY: `range` lies in the UMEM mapping (checked), which is alive, and
    // covers only chunks we own (see the contract): nothing else reads or
    // writes them while the slice lives.
    Some(unsafe { std::slice::from_raw_parts_mut(start, range.len()) })
}

/// `XDP_MAX_TX_SKB_BUDGET` (linux/if_xdp.h, Linux 6.17): how many TX
/// descriptors one copy-mode wakeup sends at most. The kernel's default is
/// 32 (`TX_BATCH_SIZE` in net/xdp/xsk.c), so a poll's batch of 64 frames
/// took two `sendto` kicks (the first answers EAGAIN).
const XDP_MAX_TX_SKB_BUDGET: libc::c_int = 9;

/// Let one copy-mode wakeup of the socket `fd` send as many frames as its
/// TX ring of `ring` entries holds (`XDP_MAX_TX_SKB_BUDGET`; the kernel
/// accepts 32 up to the ring's size), so a batch leaves in one `sendto`
/// instead of one per 32 frames. Returns the budget set, or `None` where
/// the kernel predates the option (`ENOPROTOOPT`): then `flush` kicks again
/// while a kick makes progress, as before.
fn set_tx_budget(fd: std::os::fd::RawFd, ring: u32) -> Option<u32> {
    let budget: u32 = ring;
    // SAFETY: setsockopt reads exactly size_of::<u32>() bytes from `budget`.
    let r = unsafe {
        libc::setsockopt(fd, libc::SOL_XDP, XDP_MAX_TX_SKB_BUDGET, (&budget as *const u32).cast(), std::mem::size_of::<u32>() as libc::socklen_t)
    };
    if r == 0 {
        return Some(budget);
    }
    tracing::debug!(budget, "XDP_MAX_TX_SKB_BUDGET not set ({}): one kick sends 32 frames", std::io::Error::last_os_error());
    None
}

/// Whether every chunk (of `1 << shift` bytes: the port's chunks are 2048
/// or 4096 bytes, so a shift does what a division did) that `range` touches
/// is one that `held` (UMEM addresses within chunks) points into.
fn chunks_held(range: &Range<usize>, shift: u32, held: impl Iterator<Item = usize> + Clone) -> bool {
    if range.is_empty() {
        return true;
    }
    (range.start >> shift..=(range.end - 1) >> shift).all(|c| held.clone().any(|a| a >> shift == c))
}

/// The chunks of the multi-buffer frame in hand during one receive call:
/// its pieces received in this call, which go back to the fill ring only at
/// its end. The reassembly reaches the UMEM only through this, so no slice
/// covers a chunk the kernel owns.
struct FrameChunks<'a> {
    area: (usize, usize),
    /// log2 of the chunk size.
    shift: u32,
    /// The descriptors of the frame's pieces consumed in this call.
    held: &'a [FrameDesc],
}

impl<'a> FrameChunks<'a> {
    /// # Safety
    /// `area` is the port's live UMEM mapping, chunks of `chunk` bytes (a
    /// power of two, as the port's configuration check requires), and the
    /// chunks `held` point into are ours (received, not given back) for as
    /// long as the value lives, with no other slice over them meanwhile.
    unsafe fn new(area: (usize, usize), chunk: usize, held: &'a [FrameDesc]) -> Self {
        debug_assert!(chunk.is_power_of_two());
        FrameChunks { area, shift: chunk.trailing_zeros(), held }
    }
}

impl Held for FrameChunks<'_> {
    fn bytes(&mut self, range: Range<usize>) -> Option<&mut [u8]> {
        if !chunks_held(&range, self.shift, self.held.iter().map(|d| d.addr())) {
            return None;
        }
        // SAFETY: every chunk of `range` is one `held` points into, ours for
        // this value's life (the contract of `new`), inside the live UMEM
        // (`umem_span` checks the bounds). The slice borrows `self`
        // mutably, so two never coexist.
        unsafe { umem_span(self.area, range) }
    }
}

/// How the AF_XDP socket binds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BindMode {
    /// Zero-copy if the driver supports it, else copy.
    #[default]
    Auto,
    /// Copy mode (works everywhere, veth included).
    Copy,
    /// Zero-copy only (fails where the driver cannot).
    ZeroCopy,
}

/// AF_XDP port configuration.
#[derive(Clone, Debug)]
pub struct XskConfig {
    /// Interface name in the current network namespace.
    pub ifname: String,
    /// RX/TX queue of the interface to bind to.
    pub queue: u32,
    /// UMEM frames (half lent to the kernel for receive, half for transmit).
    pub frame_count: u32,
    /// UMEM frame size (power of two, 2048 or 4096). Linux 6.18 refuses a
    /// larger chunk even in a huge-page UMEM (EINVAL at registration), so a
    /// frame longer than a chunk's data area travels as a multi-buffer chain.
    pub frame_size: u32,
    /// Entries in each of the RX, TX, fill and completion rings (power of two).
    pub ring_size: u32,
    /// Copy or zero-copy.
    pub bind: BindMode,
    /// Ask the kernel to tell us when it needs a wakeup syscall.
    pub need_wakeup: bool,
    /// Carry frames larger than one UMEM frame as chains of frames (AF_XDP
    /// multi-buffer, `XDP_USE_SG`) when the interface MTU needs it; falls
    /// back to clamping the MTU where the kernel or driver cannot.
    pub multi_buffer: bool,
    /// Back the UMEM with huge pages.
    pub huge_pages: bool,
    /// The XDP program's configuration (UDP port, attach mode, impairments);
    /// our addresses are filled in from the interface.
    pub xdp: XdpConfig,
}

impl XskConfig {
    /// Defaults for interface `ifname`: queue 0, 1024 frames of 4 KiB,
    /// rings of 512, automatic copy/zero-copy and XDP mode.
    ///
    /// The frames cycle through the rings, so the UMEM's size is the
    /// working set every frame's bytes pass through: 4 MiB stays in cache
    /// where 16 MiB (4096 frames) did not. Measured on veth, one core, same
    /// runs: 64 KiB WRITE 0.78 of the raw AF_XDP ceiling vs 0.65, 64 B
    /// message rate 0.78 vs 0.68 (the raw ceiling itself gains at 4 KiB
    /// frames). 512 receive buffers hold eight polls' worth of transmit
    /// budget, or four at MTU 4096 where a frame takes two.
    pub fn new(ifname: &str) -> XskConfig {
        XskConfig {
            ifname: ifname.to_string(),
            queue: 0,
            frame_count: 1024,
            frame_size: 4096,
            ring_size: 512,
            bind: BindMode::Auto,
            need_wakeup: true,
            multi_buffer: true,
            huge_pages: false,
            xdp: XdpConfig::default(),
        }
    }
}

/// Why an AF_XDP port could not be opened (or reconfigured).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum XskError {
    /// A bad configuration value (frame or ring size, interface name, ...).
    #[error("{0}")]
    Config(String),
    /// The interface does not exist here or cannot carry RoCEv2.
    #[error("interface {ifname}: {reason}")]
    Interface {
        /// The interface.
        ifname: String,
        /// What is wrong with it.
        reason: String,
        /// The failed lookup, if one failed.
        #[source]
        source: Option<std::io::Error>,
    },
    /// The calling thread lacks a privilege the open needs (`EPERM`).
    #[error("{0}")]
    Permission(String),
    /// Another urnic device holds the interface (`EBUSY`): one of another
    /// process, or of this one ([`claim`]).
    #[error("interface {ifname} is in use by urnic {} ({holder})", match pid { Some(p) => format!("process {p}"), None => "process (PID not visible here)".to_string() })]
    InUse {
        /// The interface.
        ifname: String,
        /// The holder's PID, when it can be seen from here.
        pid: Option<u32>,
        /// Who the holder is (its command line) or how it holds it.
        holder: String,
    },
    /// An XDP program that is not urnic's is attached to the interface
    /// (`EBUSY`: the kernel would refuse urnic's).
    #[error("interface {ifname} has an XDP program attached that is not urnic's ({program}); detach it first (ip link set dev {ifname} xdp off)")]
    ForeignXdp {
        /// The interface.
        ifname: String,
        /// The program: name, id, and the processes holding it.
        program: String,
    },
    /// A system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Loading, attaching or configuring the XDP program failed.
    #[error("XDP program on {ifname}: {source}")]
    Xdp {
        /// The interface.
        ifname: String,
        /// What failed.
        #[source]
        source: XdpError,
    },
    /// Binding the AF_XDP socket failed in every mode tried.
    #[error("AF_XDP socket on {ifname} queue {queue}: {tried}")]
    Bind {
        /// The interface.
        ifname: String,
        /// The queue.
        queue: u32,
        /// Each mode tried and why it failed.
        tried: String,
        /// The OS error of the last attempt.
        #[source]
        source: Option<std::io::Error>,
    },
    /// Setting up the socket's UMEM or rings failed.
    #[error("{what}: {source}")]
    Setup {
        /// What was being set up.
        what: &'static str,
        /// Why it failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl XskError {
    /// The errno this failure amounts to: the OS's where a system call
    /// failed, `EPERM` for missing privileges, `EBUSY` for an interface held
    /// by another device or program, `EINVAL` for a bad configuration,
    /// `ENODEV` for an unusable interface, else `EIO`.
    pub fn errno(&self) -> i32 {
        match self {
            XskError::Config(_) => libc::EINVAL,
            XskError::Interface { source, .. } => source.as_ref().and_then(|e| e.raw_os_error()).unwrap_or(libc::ENODEV),
            XskError::Permission(_) => libc::EPERM,
            XskError::InUse { .. } | XskError::ForeignXdp { .. } => libc::EBUSY,
            XskError::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            XskError::Bind { source, .. } => source.as_ref().and_then(|e| e.raw_os_error()).unwrap_or(libc::EIO),
            XskError::Xdp { .. } | XskError::Setup { .. } => libc::EIO,
        }
    }
}

impl From<XskError> for std::io::Error {
    /// An `io::Error` with the errno's kind, carrying the `XskError`.
    fn from(e: XskError) -> Self {
        let kind = std::io::Error::from_raw_os_error(e.errno()).kind();
        std::io::Error::new(kind, e)
    }
}

/// What the port did, for `urnic stat`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XskStats {
    /// Frames received.
    pub rx_frames: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Frames sent.
    pub tx_frames: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Frames the engine wanted to send while every TX buffer was in flight.
    pub tx_no_buffer: u64,
    /// Wakeup syscalls made.
    pub wakeups: u64,
    /// Kicks repeated at once because the kernel sent one batch and more
    /// descriptors waited (EAGAIN with progress).
    pub tx_kicks_again: u64,
    /// Multi-buffer frames longer than the port carries (dropped).
    pub rx_multibuffer_dropped: u64,
    /// Multi-buffer frames handed up where they lay (pieces in adjacent
    /// chunks); the others were copied together.
    pub rx_in_place: u64,
    /// Multi-buffer frames built in place across two adjacent chunks; the
    /// others were built in a scratch buffer and copied out.
    pub tx_in_place: u64,
}

/// A port on an AF_XDP socket.
pub struct XskPort {
    info: PortInfo,
    iface: Interface,
    umem: Umem,
    fill: FillQueue,
    comp: CompQueue,
    tx: TxQueue,
    rx: RxQueue,
    /// TX buffers not in flight.
    free: Vec<FrameDesc>,
    /// Frames written, not yet on the TX ring.
    pending: Vec<FrameDesc>,
    /// Scratch for RX and completion batches.
    scratch: Vec<FrameDesc>,
    /// RX buffers waiting for room in the fill ring.
    refill: Vec<FrameDesc>,
    /// Frames on the TX ring the kernel has not completed yet. In copy mode
    /// one wakeup sends a bounded batch (`set_tx_budget`): until this is 0 the
    /// poller keeps kicking, or frames would sit in the ring until the next
    /// transmission (a retransmission timeout, for the last of a burst).
    in_flight: usize,
    frame_len: usize,
    /// Bound with XDP_USE_SG: frames may span several UMEM frames.
    sg: bool,
    /// Largest frame the port carries.
    max_frame: usize,
    /// UMEM chunk size (`XskConfig::frame_size`).
    chunk: usize,
    /// Where the UMEM mapping starts (an exposed address) and its length.
    umem_area: (usize, usize),
    /// The multi-buffer frame being received.
    reassembly: Reassembly,
    /// Where the engine builds a frame that may need several UMEM frames.
    scratch_tx: Vec<u8>,
    zero_copy: bool,
    /// The link's state when last asked, and when (the poller's clock).
    link: Cell<(bool, Option<rocev2::Instant>)>,
    stats: XskStats,
    // Dropped after the socket queues (field order): the last port of an
    // interface to go detaches the program.
    prog: std::sync::Arc<XdpProgram>,
    queue: u32,
    reports_program: bool,
    /// The interface's lock, shared by the ports of one open; released
    /// when the last goes, after the program is detached (field order).
    _lock: std::sync::Arc<claim::InterfaceLock>,
}

fn setup<E: std::error::Error + Send + Sync + 'static>(what: &'static str) -> impl FnOnce(E) -> XskError {
    move |e| XskError::Setup { what, source: Box::new(e) }
}

/// libbpf (loading and inspecting XDP programs) prints its messages to
/// stderr unless told otherwise: lines such as `libbpf: Kernel error
/// message: ...` ahead of urnic's own error, which already says what failed
/// and why. They go to `tracing` instead (target `libbpf`): libbpf's
/// warnings at debug level, its information and debug output at trace
/// level, so `urnic -v` (or `RUST_LOG=libbpf=debug`) shows them and nothing
/// reaches stderr raw. Set once per process, before the first use.
fn route_libbpf_messages() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Debug, libbpf_message)));
    });
}

fn libbpf_message(level: libbpf_rs::PrintLevel, msg: String) {
    let msg = msg.trim_end();
    let msg = msg.strip_prefix("libbpf: ").unwrap_or(msg);
    match level {
        libbpf_rs::PrintLevel::Warn => tracing::debug!(target: "libbpf", "{msg}"),
        _ => tracing::trace!(target: "libbpf", "{msg}"),
    }
}

impl XskPort {
    /// Attach the XDP program to `cfg.ifname` and open an AF_XDP socket on
    /// `cfg.queue`, in the calling thread's network namespace.
    pub fn open(cfg: &XskConfig) -> Result<XskPort, XskError> {
        let mut v = XskPort::open_queues(cfg, &[cfg.queue])?;
        v.pop().ok_or_else(|| XskError::Config("no queue opened".into()))
    }

    /// Attach the XDP program to `cfg.ifname` once and open one AF_XDP
    /// socket (with its own UMEM) per queue in `queues`: one port per shard.
    ///
    /// The interface must be free: the ports hold its lock
    /// ([`claim::InterfaceLock`]) for as long as any of them lives, and a
    /// second open, by this process or another, fails with
    /// [`XskError::InUse`] naming the holder's PID; an XDP program other
    /// than urnic's on it fails with [`XskError::ForeignXdp`]; missing
    /// privileges fail with [`XskError::Permission`].
    pub fn open_queues(cfg: &XskConfig, queues: &[u32]) -> Result<Vec<XskPort>, XskError> {
        route_libbpf_messages();
        let iface =
            Interface::query(&cfg.ifname).map_err(|e| XskError::Interface { ifname: cfg.ifname.clone(), reason: e.to_string(), source: Some(e) })?;
        if !cfg.frame_size.is_power_of_two() || !(2048..=4096).contains(&cfg.frame_size) {
            return Err(XskError::Config(format!("frame_size {} must be 2048 or 4096", cfg.frame_size)));
        }
        if cfg.frame_count < 64 || !cfg.ring_size.is_power_of_two() || cfg.ring_size < 64 {
            return Err(XskError::Config(format!(
                "frame_count {} must be at least 64 and ring_size {} a power of two of at least 64",
                cfg.frame_count, cfg.ring_size
            )));
        }
        let mut xdp = cfg.xdp.clone();
        xdp.ipv4 = iface.ipv4.iter().map(|a| a.octets()).collect();
        xdp.ipv6 = iface.ipv6.iter().map(|a| a.octets()).collect();
        if xdp.ipv4.is_empty() && xdp.ipv6.is_empty() {
            return Err(XskError::Interface {
                ifname: iface.name.clone(),
                reason: "no IP address: RoCEv2 needs one (it is the GID)".into(),
                source: None,
            });
        }
        claim::check_privileges(&iface.name)?;
        let lock = std::sync::Arc::new(claim::InterfaceLock::acquire(&iface.name)?);
        claim::check_no_xdp_program(&iface.name, iface.index)?;
        let prog = std::sync::Arc::new(XdpProgram::attach(iface.index, &xdp).map_err(|source| XskError::Xdp { ifname: iface.name.clone(), source })?);
        tracing::debug!(ifname = %iface.name, mode = ?prog.mode(), udp_port = xdp.udp_port, "XDP program attached");
        let mut ports = queues.iter().map(|&q| XskPort::open_socket(cfg, q, &iface, prog.clone(), lock.clone())).collect::<Result<Vec<_>, _>>()?;
        // The program's counters are per interface: one port reports them.
        for p in ports.iter_mut().skip(1) {
            p.reports_program = false;
        }
        Ok(ports)
    }

    fn open_socket(
        cfg: &XskConfig,
        queue: u32,
        iface: &Interface,
        prog: std::sync::Arc<XdpProgram>,
        lock: std::sync::Arc<claim::InterfaceLock>,
    ) -> Result<XskPort, XskError> {
        let iface = iface.clone();

        let ring = QueueSize::new(cfg.ring_size).map_err(setup("ring size"))?;
        let umem_cfg = UmemConfig::builder()
            .frame_size(FrameSize::new(cfg.frame_size).map_err(setup("frame size"))?)
            .fill_queue_size(ring)
            .comp_queue_size(ring)
            .build()
            .map_err(setup("UMEM config"))?;
        let frame_len = umem_cfg.mtu() as usize;
        let count = NonZeroU32::new(cfg.frame_count).ok_or_else(|| XskError::Config("frame_count must not be 0".into()))?;
        let (umem, mut frames) = Umem::new(umem_cfg, count, cfg.huge_pages).map_err(setup("UMEM"))?;
        let ifname: xsk_rs::config::Interface = cfg.ifname.parse().map_err(setup("interface name"))?;

        let modes: &[bool] = match cfg.bind {
            BindMode::Auto => &[true, false],
            BindMode::ZeroCopy => &[true],
            BindMode::Copy => &[false],
        };
        // Multi-buffer only where a frame can outgrow one UMEM frame.
        let want_sg = cfg.multi_buffer && iface.mtu as usize + 18 > frame_len;
        let tries: Vec<(bool, bool)> = modes.iter().flat_map(|&zc| if want_sg { vec![(zc, true), (zc, false)] } else { vec![(zc, false)] }).collect();
        let mut tried = Vec::new();
        let mut last_os = None;
        let mut opened = None;
        // A socket just closed on this queue keeps it busy until the
        // kernel's deferred release of its buffer pool has run (a
        // workqueue item): bind says EBUSY meanwhile. Retry that for a while.
        let busy_until = Instant::now() + Duration::from_secs(3);
        'bind: loop {
            let mut busy = false;
            tried.clear();
            for &(zc, sg) in &tries {
                let mut flags = if zc { BindFlags::XDP_ZEROCOPY } else { BindFlags::XDP_COPY };
                if cfg.need_wakeup {
                    flags |= BindFlags::XDP_USE_NEED_WAKEUP;
                }
                if sg {
                    flags |= BindFlags::XDP_USE_SG;
                }
                let sock_cfg = SocketConfig::builder()
                    .rx_queue_size(ring)
                    .tx_queue_size(ring)
                    .libxdp_flags(LibxdpFlags::XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD)
                    .bind_flags(flags)
                    .build();
                // SAFETY: the UMEM is not shared with another socket on this
                // (interface, queue); INHIBIT_PROG_LOAD is set.
                match unsafe { Socket::new(sock_cfg, &umem, &ifname, queue) } {
                    Ok(q) => {
                        opened = Some((q, (zc, sg)));
                        break 'bind;
                    }
                    Err(e) => {
                        let os = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<std::io::Error>());
                        busy |= os.and_then(|o| o.raw_os_error()) == Some(libc::EBUSY);
                        let why = os.map_or(String::new(), |o| format!(" ({o})"));
                        tried.push(format!("{} mode{}: {e}{why}", if zc { "zero-copy" } else { "copy" }, if sg { ", multi-buffer" } else { "" }));
                        last_os = os.and_then(|o| o.raw_os_error()).map(std::io::Error::from_raw_os_error);
                    }
                }
            }
            if !busy || Instant::now() >= busy_until {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let ((tx, rx, fq_cq), (zero_copy, sg)) =
            opened.ok_or_else(|| XskError::Bind { ifname: cfg.ifname.clone(), queue, tried: tried.join("; "), source: last_os })?;
        let (mut fill, comp) = fq_cq.ok_or_else(|| XskError::Bind {
            ifname: cfg.ifname.clone(),
            queue,
            tried: "the socket came without fill/completion rings".into(),
            source: None,
        })?;
        prog.register_socket(queue, rx.fd().as_raw_fd()).map_err(|source| XskError::Xdp { ifname: cfg.ifname.clone(), source })?;
        let tx_budget = if zero_copy { None } else { set_tx_budget(tx.fd().as_raw_fd(), cfg.ring_size) };

        // The UMEM is one mapping: frame 0's data pointer minus its address
        // is where it starts.
        let umem_area = {
            let mut d = frames[0];
            // SAFETY: frame 0 belongs to `umem` and is not in use yet.
            let p = unsafe { umem.data_mut(&mut d) }.contents_mut().as_mut_ptr();
            (p.wrapping_sub(d.addr()).expose_provenance(), frames.len() * cfg.frame_size as usize)
        };
        // Half the frames (at most the ring) for receive, the rest for transmit.
        let n_rx = (frames.len() / 2).min(cfg.ring_size as usize);
        let free = frames.split_off(n_rx);
        // SAFETY: these frames belong to `umem` and are not in use elsewhere.
        let put = unsafe { fill.produce(&frames) };
        let refill = frames.split_off(put);

        // With multi-buffer a frame may span chunks (up to 4 of them).
        let max_frame = if sg { (iface.mtu as usize + 18).min(4 * frame_len) } else { frame_len };
        let mtu = iface.mtu.min((max_frame - 18) as u32);
        tracing::debug!(
            ifname = %cfg.ifname,
            queue,
            zero_copy,
            multi_buffer = sg,
            umem_frames = umem_area.1 / cfg.frame_size as usize,
            frame_size = cfg.frame_size,
            umem_bytes = umem_area.1,
            ring = cfg.ring_size,
            rx_frames = n_rx,
            mtu,
            ?tx_budget,
            "AF_XDP socket bound"
        );
        Ok(XskPort {
            info: PortInfo { mac: iface.mac, mtu },
            iface,
            umem,
            fill,
            comp,
            tx,
            rx,
            free,
            pending: Vec::with_capacity(256),
            scratch: vec![FrameDesc::default(); 256],
            refill,
            in_flight: 0,
            frame_len,
            sg,
            max_frame,
            chunk: cfg.frame_size as usize,
            umem_area,
            reassembly: Reassembly::default(),
            scratch_tx: if sg { vec![0u8; max_frame] } else { Vec::new() },
            zero_copy,
            link: Cell::new((true, None)),
            stats: XskStats::default(),
            prog,
            queue,
            reports_program: true,
            _lock: lock,
        })
    }

    /// The interface this port is on (addresses as found at open).
    pub fn interface(&self) -> &Interface {
        &self.iface
    }

    /// The interface queue this port's socket is bound to.
    pub fn queue(&self) -> u32 {
        self.queue
    }

    /// Whether the socket is bound zero-copy.
    pub fn zero_copy(&self) -> bool {
        self.zero_copy
    }

    /// The XDP program's attach mode (native or generic).
    pub fn xdp_mode(&self) -> AttachMode {
        self.prog.mode()
    }

    /// The XDP program's counters.
    pub fn xdp_counters(&self) -> Option<XdpCounters> {
        self.prog.counters().ok()
    }

    /// Change the XDP program's test impairments on the live port.
    pub fn set_impairments(&self, imp: &Impairments) -> Result<(), XskError> {
        self.prog.set_impairments(imp).map_err(|source| XskError::Xdp { ifname: self.iface.name.clone(), source })
    }

    /// Port counters.
    pub fn stats(&self) -> XskStats {
        self.stats
    }

    /// Take finished transmissions back into the free list.
    fn reclaim(&mut self) {
        loop {
            // SAFETY: completed descriptors are ours again.
            let n = unsafe { self.comp.consume(&mut self.scratch) };
            if n == 0 {
                break;
            }
            self.free.extend_from_slice(&self.scratch[..n]);
            self.in_flight = self.in_flight.saturating_sub(n);
            if n < self.scratch.len() {
                break;
            }
        }
    }

    /// Transmit a frame that may need more than one UMEM frame: built in
    /// place across two adjacent free chunks when the free list offers them
    /// (the usual case: chunks come back from the kernel in the order they
    /// were taken), else in the scratch buffer and spread over as many UMEM
    /// frames as it needs (XDP_PKT_CONTD on all but the last).
    fn transmit_chained(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> Result<bool, PortError> {
        let need = self.max_frame.div_ceil(self.frame_len);
        if self.free.len() < need {
            self.reclaim();
        }
        if self.free.len() < need {
            self.stats.tx_no_buffer += 1;
            self.flush()?;
            return Ok(false);
        }
        // Two chunks, the second right after the first: the frame is built
        // from the first one's data area on into the second chunk, then its
        // tail moves up over the second chunk's headroom (`spread_tail`).
        // Two 4 KiB chunks' data areas hold 7680 bytes: every RoCE frame
        // fits (`MAX_ROCE_FRAME`), so the buffer need not be the link's MTU.
        let k = self.free.len();
        let (a, b) = (self.free[k - 1], self.free[k - 2]);
        let (lo, hi) = if a.addr() < b.addr() { (a, b) } else { (b, a) };
        // A power of two (the configuration check): a mask, not a division.
        let head = lo.addr() & (self.chunk - 1);
        let room = (2 * self.frame_len).min(self.max_frame);
        // From `lo`'s data area to the end of `hi`, the chunk after it: the
        // frame and its tail moved up by `head` fit when a chunk is its
        // headroom plus its data area (as xsk-rs lays them out).
        let span = lo.addr()..lo.addr() - head + 2 * self.chunk;
        if hi.addr() == lo.addr() + self.chunk && 2 * self.frame_len >= self.max_frame.min(MAX_ROCE_FRAME) && room + head <= span.len() {
            // SAFETY: `span` lies in the two free chunks `lo` and `hi` (not in
            // flight, not lent to the kernel), ours until pushed on the TX
            // ring below; the UMEM lives as long as the port.
            let Some(two) = (unsafe { umem_span(self.umem_area, span) }) else { return Ok(false) };
            let Some(n) = fill(&mut two[..room]).filter(|&n| n > 0 && n <= room) else { return Ok(false) };
            let (first, second) = spread_tail(two, 0, n, self.frame_len, head);
            self.free.truncate(k - 2);
            let mut lo = lo;
            // SAFETY: `lo` is a free frame of our UMEM; only its length is set.
            unsafe { self.umem.data_mut(&mut lo) }.cursor().set_pos(first);
            lo.set_options(if second > 0 { 1 } else { 0 });
            self.pending.push(lo);
            if second > 0 {
                let mut hi = hi;
                // SAFETY: as for `lo`.
                unsafe { self.umem.data_mut(&mut hi) }.cursor().set_pos(second);
                hi.set_options(0);
                self.pending.push(hi);
            } else {
                self.free.push(hi);
            }
            self.stats.tx_in_place += 1;
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += n as u64;
            if self.pending.len() >= 64 {
                self.flush()?;
            }
            return Ok(true);
        }
        let max = self.max_frame;
        let Some(n) = fill(&mut self.scratch_tx[..max]).filter(|&n| n > 0 && n <= max) else { return Ok(false) };
        let pieces = n.div_ceil(self.frame_len);
        for k in 0..pieces {
            let Some(mut desc) = self.free.pop() else { return Err(PortError::TxFull) };
            let chunk = &self.scratch_tx[k * self.frame_len..n.min((k + 1) * self.frame_len)];
            // SAFETY: `desc` is a frame of our UMEM that is not in flight.
            let mut data = unsafe { self.umem.data_mut(&mut desc) };
            let mut cursor = data.cursor();
            cursor.set_pos(0);
            std::io::Write::write_all(&mut cursor, chunk).map_err(|e| PortError::Io(e.to_string()))?;
            desc.set_options(if k + 1 < pieces { 1 } else { 0 });
            self.pending.push(desc);
        }
        self.stats.tx_frames += 1;
        self.stats.tx_bytes += n as u64;
        if self.pending.len() >= 64 {
            self.flush()?;
        }
        Ok(true)
    }

    fn give_back(&mut self) {
        if self.refill.is_empty() {
            return;
        }
        // SAFETY: frames of `umem` that nobody else uses.
        let put = unsafe { self.fill.produce(&self.refill) };
        self.refill.drain(..put);
    }
}

impl Port for XskPort {
    fn info(&self) -> PortInfo {
        self.info
    }

    fn transmit_with(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> Result<bool, PortError> {
        if self.sg {
            return self.transmit_chained(fill);
        }
        if self.free.is_empty() {
            self.reclaim();
        }
        let Some(mut desc) = self.free.pop() else {
            self.stats.tx_no_buffer += 1;
            // Nothing free: push out what is pending so buffers come back.
            self.flush()?;
            return Ok(false);
        };
        let frame_len = self.frame_len;
        // SAFETY: `desc` is a frame of our UMEM that is not in flight.
        let mut data = unsafe { self.umem.data_mut(&mut desc) };
        let cap = {
            let mut cursor = data.cursor();
            let cap = cursor.buf_len().min(frame_len);
            cursor.set_pos(cap);
            cap
        };
        let written = fill(&mut data.contents_mut()[..cap]);
        match written {
            Some(n) if n > 0 && n <= cap => {
                data.cursor().set_pos(n);
                self.stats.tx_frames += 1;
                self.stats.tx_bytes += n as u64;
                self.pending.push(desc);
                if self.pending.len() >= 64 {
                    self.flush()?;
                }
                Ok(true)
            }
            _ => {
                self.free.push(desc);
                Ok(false)
            }
        }
    }

    /// Up to `budget` frames, however many descriptors they take: a
    /// multi-buffer frame's pieces count as one (counting descriptors let a
    /// receiver at IB MTU 4096 take half as many frames per poll as its
    /// peer sent). The descriptors go back to the fill ring at the end.
    fn receive(&mut self, budget: usize, handler: &mut dyn FnMut(&[u8])) -> Result<usize, PortError> {
        self.give_back();
        let cap = self.scratch.len();
        let (mut taken, mut frames) = (0, 0);
        // Index in `scratch` of the first piece, in this call, of the frame
        // being reassembled (one that began in an earlier call continues
        // from index 0).
        let mut frame_first = 0;
        while frames < budget && taken < cap {
            let want = (budget - frames).min(cap - taken);
            // SAFETY: received descriptors belong to our UMEM.
            let got = unsafe { self.rx.consume(&mut self.scratch[taken..taken + want]) };
            for i in taken..taken + got {
                let desc = self.scratch[i];
                // SAFETY: the kernel handed this frame to us; nobody writes it
                // until we return it to the fill ring below.
                let data = unsafe { self.umem.data(&desc) };
                if desc.has_more_frames() || self.reassembly.active() {
                    // A multi-buffer frame (see `reassembly`).
                    let piece_len = data.len();
                    if !self.reassembly.active() {
                        frame_first = i;
                    }
                    // SAFETY: `scratch[frame_first..=i]` are this frame's
                    // pieces so far, this one included, which the kernel
                    // handed us in this call and gets back only at its end
                    // (`refill` below), after `umem` is gone. `data` is not
                    // used from here on.
                    let mut umem = unsafe { FrameChunks::new(self.umem_area, self.chunk, &self.scratch[frame_first..=i]) };
                    match self.reassembly.push(&mut umem, desc.addr(), piece_len, desc.has_more_frames(), self.chunk, self.max_frame) {
                        Piece::Pending | Piece::Skipped => {}
                        Piece::TooLong | Piece::Unheld => self.stats.rx_multibuffer_dropped += 1,
                        Piece::InPlace(range) => match umem.bytes(range) {
                            Some(frame) => {
                                self.stats.rx_in_place += 1;
                                self.stats.rx_frames += 1;
                                self.stats.rx_bytes += frame.len() as u64;
                                frames += 1;
                                handler(frame);
                            }
                            // Cannot happen: the reassembly joins held chunks only.
                            None => self.stats.rx_multibuffer_dropped += 1,
                        },
                        Piece::Copied => {
                            let frame = self.reassembly.copied();
                            self.stats.rx_frames += 1;
                            self.stats.rx_bytes += frame.len() as u64;
                            frames += 1;
                            handler(frame);
                        }
                    }
                } else {
                    self.stats.rx_frames += 1;
                    self.stats.rx_bytes += data.len() as u64;
                    frames += 1;
                    handler(data.contents());
                }
            }
            taken += got;
            if got < want {
                break;
            }
        }
        if self.reassembly.active() {
            // A frame goes on in the next call, but its chunks go back to
            // the kernel now: keep a copy of its pieces so far, before.
            // SAFETY: the frame's pieces in this call, still ours: they go
            // back to the fill ring just below, after `umem` is gone.
            let mut umem = unsafe { FrameChunks::new(self.umem_area, self.chunk, &self.scratch[frame_first.min(taken)..taken]) };
            self.reassembly.detach(&mut umem);
        }
        self.refill.extend_from_slice(&self.scratch[..taken]);
        self.give_back();
        if self.fill.needs_wakeup() {
            self.stats.wakeups += 1;
            let _ = crate::kernel_time::syscall(|| self.fill.wakeup(self.rx.fd_mut(), 0));
        }
        Ok(frames)
    }

    fn flush(&mut self) -> Result<(), PortError> {
        if !self.pending.is_empty() {
            // SAFETY: pending frames are written and ours until completed.
            let n = unsafe { self.tx.produce(&self.pending) };
            self.pending.drain(..n);
            self.in_flight += n;
        }
        // In copy mode one kick sends at most the socket's TX budget (the
        // ring's size where the kernel has XDP_MAX_TX_SKB_BUDGET, else 32)
        // and says EAGAIN when more wait; it also says EAGAIN when the
        // completion ring is full. Either way, take back what
        // completed and kick again while that makes progress, rather than
        // leave the rest for the next poll (one more round through the
        // peer first). Zero-copy kicks complete later, so they stop at one.
        while self.in_flight > 0 && self.tx.needs_wakeup() {
            self.stats.wakeups += 1;
            match crate::kernel_time::syscall(|| self.tx.wakeup()) {
                Ok(()) => break,
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                    let before = self.in_flight;
                    self.reclaim();
                    if self.in_flight >= before {
                        break;
                    }
                    self.stats.tx_kicks_again += 1;
                }
                // EBUSY/ENOBUFS/ENETDOWN: the kernel is busy or the link
                // down; try next time.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY) | Some(libc::ENOBUFS) | Some(libc::ENETDOWN)) => break,
                Err(e) => return Err(PortError::Io(e.to_string())),
            }
        }
        self.reclaim();
        Ok(())
    }

    fn tx_pending(&self) -> bool {
        !self.pending.is_empty() || self.in_flight > 0
    }

    fn rx_pending(&mut self) -> bool {
        // The RX ring's producer position, read from the shared ring.
        self.rx.nb_avail_exact() > 0
    }

    fn counters(&self) -> Vec<(String, u64)> {
        let s = self.stats;
        let mut v = vec![
            ("xsk_rx_frames".to_string(), s.rx_frames),
            ("xsk_rx_bytes".to_string(), s.rx_bytes),
            ("xsk_tx_frames".to_string(), s.tx_frames),
            ("xsk_tx_bytes".to_string(), s.tx_bytes),
            ("xsk_tx_no_buffer".to_string(), s.tx_no_buffer),
            ("xsk_wakeups".to_string(), s.wakeups),
            ("xsk_tx_kicks_again".to_string(), s.tx_kicks_again),
            ("xsk_rx_multibuffer_dropped".to_string(), s.rx_multibuffer_dropped),
            ("xsk_rx_in_place".to_string(), s.rx_in_place),
            ("xsk_tx_in_place".to_string(), s.tx_in_place),
        ];
        if let Ok(st) = self.rx.fd().xdp_statistics() {
            v.push(("xsk_rx_dropped".to_string(), st.rx_dropped()));
            v.push(("xsk_rx_ring_full".to_string(), st.rx_ring_full()));
            v.push(("xsk_rx_invalid_descs".to_string(), st.rx_invalid_descs()));
            v.push(("xsk_tx_invalid_descs".to_string(), st.tx_invalid_descs()));
            v.push(("xsk_rx_fill_ring_empty".to_string(), st.rx_fill_ring_empty_descs()));
        }
        if let Some(c) = self.xdp_counters().filter(|_| self.reports_program) {
            v.extend(c.iter().map(|(k, n)| (format!("xdp_{k}"), n)));
        }
        v
    }

    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }

    fn link_up(&self, now: rocev2::Instant) -> bool {
        // An ioctl per poll would cost more than the poll: ask every 100 ms,
        // timed by the poller's clock (a clock read of our own per poll was
        // half of the idle loop's).
        let (up, at) = self.link.get();
        if at.is_some_and(|t| now.saturating_duration_since(t) < LINK_CHECK_EVERY) {
            return up;
        }
        let up = crate::netdev::link_up(&self.iface.name).unwrap_or(up);
        self.link.set((up, Some(now)));
        up
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_held_only_if_every_chunk_it_touches_is() {
        const C: usize = 4096;
        const S: u32 = C.trailing_zeros();
        // Pieces in chunks 2 and 3 (addresses after the headroom).
        let held = [2 * C + 256, 3 * C + 256];
        let h = || held.iter().copied();
        assert!(chunks_held(&(2 * C + 256..4 * C), S, h()), "both chunks, headroom of the second included");
        assert!(chunks_held(&(3 * C..3 * C + 1), S, h()));
        assert!(chunks_held(&(5 * C..5 * C), S, h()), "an empty range touches nothing");
        assert!(!chunks_held(&(2 * C..4 * C + 1), S, h()), "one byte into chunk 4");
        assert!(!chunks_held(&(C + 4095..2 * C + 10), S, h()), "the last byte of chunk 1");
        assert!(!chunks_held(&(0..10), S, std::iter::empty()));
    }

    /// A 138-byte RoCEv2 frame (a 64 B WRITE ONLY's length: a WRITE
    /// MIDDLE to a QPN nobody has, valid ICRC) from veth end 0 to end 1.
    fn roce_frame(pair: &crate::netns::VethPair) -> Vec<u8> {
        use rocev2::wire::{BthRepr, EthernetRepr, FrameRepr, IpRepr, Ipv4Repr, Opcode, TransportRepr, UdpRepr, ROCEV2_UDP_PORT};
        let (ip0, ip1) = (pair.ipv4[0], pair.ipv4[1]);
        let repr = FrameRepr {
            eth: EthernetRepr { dst: pair.mac[1], src: pair.mac[0], vlan: None, ethertype: 0x0800 },
            ip: IpRepr::V4(Ipv4Repr { src: ip0, dst: ip1, dscp: 0, ecn: 2, ident: 0, dont_frag: true, ttl: 64, protocol: 17, payload_len: 0 }),
            udp: UdpRepr { src_port: 50000, dst_port: ROCEV2_UDP_PORT, length: 0, checksum: 0 },
            transport: TransportRepr::bth_only(BthRepr::new(Opcode::RC_WRITE_MIDDLE, 0x77, rocev2::Psn::new(1))),
        };
        let payload = vec![0x5a; 138 - repr.frame_len(0)];
        let mut f = vec![0u8; repr.frame_len(payload.len())];
        repr.emit(&payload, &mut f).unwrap();
        f
    }

    /// Copy mode on veth: a poll's batch of 64 frames leaves in one kick
    /// (`XDP_MAX_TX_SKB_BUDGET`, the ring's size), not one `sendto` per 32
    /// frames (the kernel's default budget: the first kick says EAGAIN and
    /// the rest waited for another), and all 64 reach the peer's socket.
    #[test]
    fn a_batch_of_frames_leaves_in_one_kick() {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(unsafe { libc::geteuid() }, 0, "this test makes a network namespace and attaches XDP programs: run it as root");
        let _ = crate::netns::VethPair::sweep_stale();
        let pair = crate::netns::VethPair::create("kick", 1500).expect("namespaces and veth");
        let open = |end: usize| {
            let ifname = pair.ifname[end].clone();
            crate::netns::in_netns(Some(&pair.ns[end]), move || {
                let mut cfg = XskConfig::new(&ifname);
                cfg.bind = BindMode::Copy;
                XskPort::open(&cfg)
            })
            .unwrap()
            .unwrap()
        };
        let (mut a, mut b) = (open(0), open(1));
        let frame = roce_frame(&pair);
        let ring = a.tx.nb_free_exact();
        assert!(ring >= 64, "{ring}");
        for _ in 0..64 {
            let queued = a.transmit_with(&mut |buf: &mut [u8]| {
                buf[..frame.len()].copy_from_slice(&frame);
                Some(frame.len())
            });
            assert_eq!(queued, Ok(true));
        }
        a.flush().unwrap();
        let s = a.stats();
        assert_eq!((s.tx_frames, s.wakeups, s.tx_kicks_again), (64, 1, 0), "{s:?}");
        assert_eq!(a.tx.nb_free_exact(), ring, "the kernel took every descriptor of the batch in that kick");
        // The peer's socket gets them all without another kick from `a`
        // (delivered in the kick's softirq, or by ksoftirqd soon after).
        let mut got = 0;
        for _ in 0..100_000 {
            got += b.receive(64, &mut |f| assert_eq!(f, &frame[..])).unwrap();
            if got >= 64 {
                break;
            }
            std::thread::yield_now();
        }
        assert_eq!(got, 64);
    }

    #[test]
    fn umem_spans_stay_inside_the_mapping() {
        let mut m = vec![7u8; 64];
        let area = (m.as_mut_ptr().expose_provenance(), m.len());
        // SAFETY: `m` is alive and nothing else touches it while the spans live.
        unsafe {
            assert_eq!(umem_span(area, 60..64).map(|s| s.len()), Some(4));
            assert!(umem_span(area, 60..65).is_none());
            #[allow(clippy::reversed_empty_ranges)]
            let reversed = umem_span(area, 10..5);
            assert!(reversed.is_none());
        }
    }
}
