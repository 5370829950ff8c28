//! Devices and contexts: `ibv_get_device_list`, `ibv_open_device`,
//! `ibv_query_device`, `ibv_query_port`, `ibv_query_gid`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use rocev2::transport::attr::{AddressVector, Mtu};
use rocev2::transport::engine::{AsyncEvent, Engine, EngineConfig};
use rocev2::transport::memory::MemoryTable;
use urnic_datapath::neigh::Neighbours;
use urnic_datapath::xsk::XskError;
use urnic_datapath::{IdlePolicy, Impairments, MemHub, Nic, Port, Runner, XskConfig, XskPort};

use crate::error::{Error, ErrorKind, Result};

/// A 16-byte GID (an IPv6 address; IPv4 is IPv4-mapped).
pub type Gid = [u8; 16];

/// Neighbour resolution: the MAC a peer GID is at (ARP/ND on a real link).
pub type Resolver = Box<dyn Fn(&Gid) -> Option<[u8; 6]> + Send + Sync>;

/// How frames leave and enter the device.
pub enum PortConfig {
    /// An in-memory hub shared with other devices of this process.
    Memory {
        /// The hub.
        hub: Arc<MemHub>,
        /// Impairments on frames this device sends.
        impairments: Impairments,
    },
    /// Any other ports (the AF_XDP ports of `urnic-datapath`, or your own),
    /// with a function resolving a peer GID to its MAC. One port per shard:
    /// all on the same link (queues of one interface); with
    /// [`DatapathMode::Threads`] there must be one per core.
    Custom {
        /// The ports, one per shard (at least one).
        ports: Vec<Box<dyn Port>>,
        /// Neighbour resolution (ARP/ND).
        resolve: Resolver,
    },
}

/// Who runs the datapath.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DatapathMode {
    /// A datapath thread, pinned to `core` if given (polls every shard).
    Thread {
        /// Core to pin to.
        core: Option<usize>,
        /// What the thread does when idle.
        idle: IdlePolicy,
    },
    /// One datapath thread per core, pinned, each owning one shard of the
    /// QPs (and one port: for AF_XDP, one queue of the interface).
    Threads {
        /// Cores to pin to, one per shard.
        cores: Vec<usize>,
        /// What the threads do when idle.
        idle: IdlePolicy,
    },
    /// The application calls [`Context::poll`] from its own loop
    /// (run-to-completion embedding). Nothing moves between calls: frames
    /// wait in the socket, timers wait, and an ACK that a poll held back
    /// for the application's reply (see `Nic::poll_shard`) leaves with the
    /// next call, or when the device is closed.
    Manual,
}

/// Everything needed to open a device.
pub struct DeviceConfig {
    /// Device name (`urnic0`).
    pub name: String,
    /// The port.
    pub port: PortConfig,
    /// Port MAC address.
    pub mac: [u8; 6],
    /// IPv4 address (gives the IPv4-mapped RoCEv2 GID at index 1).
    pub ipv4: Option<[u8; 4]>,
    /// IPv6 addresses (further GIDs).
    pub ipv6: Vec<[u8; 16]>,
    /// Link (netdev) MTU; the active IB MTU follows it as in rxe (1500 → 1024).
    pub link_mtu: u32,
    /// The datapath.
    pub datapath: DatapathMode,
    /// First QPN handed out.
    pub first_qpn: u32,
    /// Limits.
    pub limits: DeviceLimits,
    /// DCQCN congestion control (`enabled: false` switches the reaction
    /// point off for the whole device; `Qp::set_congestion_control` per QP).
    pub dcqcn: rocev2::transport::dcqcn::DcqcnParams,
    /// The interface (index, in the namespace the device is opened in)
    /// on which the host joins the groups QPs attach to (IGMP / MLD);
    /// `None`: no host membership (in-memory ports).
    pub mcast_ifindex: Option<u32>,
}

impl DeviceConfig {
    /// A device on an in-memory hub with the given MAC and IPv4 address,
    /// MTU 1500, its own datapath thread, default limits.
    pub fn memory(hub: &Arc<MemHub>, name: &str, mac: [u8; 6], ipv4: [u8; 4]) -> DeviceConfig {
        DeviceConfig {
            name: name.to_string(),
            port: PortConfig::Memory { hub: hub.clone(), impairments: Impairments::default() },
            mac,
            ipv4: Some(ipv4),
            ipv6: Vec::new(),
            link_mtu: 1500,
            datapath: DatapathMode::Thread { core: None, idle: IdlePolicy::default() },
            first_qpn: 0x11,
            limits: DeviceLimits::default(),
            dcqcn: Default::default(),
            mcast_ifindex: None,
        }
    }
}

impl DeviceConfig {
    /// A device on a real interface through AF_XDP: attaches urnic's XDP
    /// program and opens the socket on `xsk.ifname` **in the calling
    /// thread's network namespace**; MAC, MTU and GIDs come from the
    /// interface, peers' MACs from the kernel's neighbour table (ARP/ND
    /// triggered when missing). See [`open_af_xdp`] to open one inside a
    /// named namespace.
    pub fn af_xdp(name: &str, xsk: &XskConfig) -> Result<DeviceConfig> {
        DeviceConfig::af_xdp_queues(name, xsk, &[xsk.queue])
    }

    /// [`DeviceConfig::af_xdp`] with one AF_XDP socket (and shard) per
    /// interface queue in `queues`, for [`DatapathMode::Threads`] with as
    /// many cores (`ethtool -L` / veth `numrxqueues` give the interface its
    /// queues).
    pub fn af_xdp_queues(name: &str, xsk: &XskConfig, queues: &[u32]) -> Result<DeviceConfig> {
        if queues.is_empty() {
            return Err(Error::invalid("at least one queue"));
        }
        let ports = XskPort::open_queues(xsk, queues).map_err(xsk_error)?;
        let iface = ports[0].interface().clone();
        let link_mtu = urnic_datapath::Port::info(&ports[0]).mtu;
        let neigh = Neighbours::new(iface.index, std::time::Duration::from_secs(3))?;
        let resolve: Resolver = Box::new(move |gid: &Gid| neigh.resolve(gid_ip(gid)));
        let ll = link_local_gid(iface.mac);
        Ok(DeviceConfig {
            name: name.to_string(),
            port: PortConfig::Custom { ports: ports.into_iter().map(|p| Box::new(p) as Box<dyn Port>).collect(), resolve },
            mac: iface.mac,
            ipv4: iface.ipv4.first().map(|a| a.octets()),
            ipv6: iface.ipv6.iter().map(|a| a.octets()).filter(|g| *g != ll).collect(),
            link_mtu,
            datapath: DatapathMode::Thread { core: None, idle: IdlePolicy::default() },
            first_qpn: fresh_first_qpn(),
            limits: DeviceLimits::default(),
            dcqcn: Default::default(),
            mcast_ifindex: Some(iface.index),
        })
    }
}

/// Where a device on a real interface starts numbering QPs: a fresh place
/// for every open, as an HCA's QPN space moves on across processes. Peers
/// keep a closed connection's QPN in timewait (Linux's CM: a REQ naming
/// that QPN from that address is stale, REJ 10, until timewait ends), so a
/// program run twice must not start from 0x11 both times. Std's
/// per-process random keys; below 0x800000, far from the 24-bit wrap.
fn fresh_first_qpn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    0x11 + (h.finish() % 0x7f_0000) as u32
}

/// The verbs error for an AF_XDP port that would not open, with the
/// `XskError` as its source: another device holding the interface (the
/// message names its PID) or a foreign XDP program on it is `EBUSY`,
/// missing privileges `EPERM`, a failed system call its own errno.
fn xsk_error(e: XskError) -> Error {
    let kind = match &e {
        XskError::Permission(_) => ErrorKind::PermissionDenied,
        XskError::InUse { .. } | XskError::ForeignXdp { .. } => ErrorKind::Busy,
        XskError::Config(_) => ErrorKind::InvalidArgument,
        XskError::Interface { .. } => ErrorKind::NotFound,
        XskError::Io { source, .. } | XskError::Bind { source: Some(source), .. }
            if matches!(source.raw_os_error(), Some(libc::EPERM | libc::EACCES)) =>
        {
            ErrorKind::PermissionDenied
        }
        XskError::Bind { source: Some(source), .. } if source.raw_os_error() == Some(libc::EBUSY) => ErrorKind::Busy,
        _ => ErrorKind::Io,
    };
    Error::with_source(kind, e.to_string(), e)
}

/// Open an AF_XDP device on `xsk.ifname` inside network namespace `netns`
/// (as made by `ip netns add`; `None`: the caller's), with `datapath`.
/// The device works from any thread afterwards.
///
/// One device per interface: while it is open, opening another on the same
/// interface of the same namespace, from this process or any other, fails
/// with [`ErrorKind::Busy`] (`EBUSY`) and a message naming the holder's PID
/// (`interface veth0 is in use by urnic process 1234 (...)`), and so does an
/// interface with another XDP program attached. Without root (or
/// `CAP_NET_ADMIN`, `CAP_NET_RAW` and `CAP_BPF`) it fails with
/// [`ErrorKind::PermissionDenied`] (`EPERM`).
///
/// With [`DatapathMode::Threads`] the device gets one shard per core, on
/// queues `0..cores.len()` of the interface.
pub fn open_af_xdp(netns: Option<&str>, name: &str, xsk: &XskConfig, datapath: DatapathMode) -> Result<Context> {
    let name = name.to_string();
    let xsk = xsk.clone();
    let queues: Vec<u32> = match &datapath {
        DatapathMode::Threads { cores, .. } => (0..cores.len() as u32).collect(),
        _ => vec![xsk.queue],
    };
    urnic_datapath::netns::in_netns(netns, move || {
        let mut cfg = DeviceConfig::af_xdp_queues(&name, &xsk, &queues)?;
        cfg.datapath = datapath;
        open_device(cfg)
    })?
}

/// Device limits (reported by `query_device`, enforced by the verbs layer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    /// QPs.
    pub max_qp: u32,
    /// WRs per queue.
    pub max_qp_wr: u32,
    /// SGEs per WR.
    pub max_sge: u32,
    /// CQs.
    pub max_cq: u32,
    /// CQEs per CQ.
    pub max_cqe: u32,
    /// Largest MR.
    pub max_mr_size: u64,
    /// Outstanding READ/ATOMIC per QP as responder.
    pub max_qp_rd_atom: u32,
    /// Outstanding READ/ATOMIC per QP as requester.
    pub max_qp_init_rd_atom: u32,
    /// SRQs.
    pub max_srq: u32,
    /// WRs per SRQ.
    pub max_srq_wr: u32,
    /// Inline bytes per send WR.
    pub max_inline_data: u32,
    /// Largest message.
    pub max_msg_size: u32,
    /// Multicast groups (`max_mcast_grp`).
    pub max_mcast_grp: u32,
    /// QPs attached to one group (`max_mcast_qp_attach`).
    pub max_mcast_qp_attach: u32,
    /// Attachments over all groups (`max_total_mcast_qp_attach`).
    pub max_total_mcast_qp_attach: u32,
}

impl DeviceLimits {
    /// The multicast limits for the engines and the NIC.
    pub fn mcast(&self) -> rocev2::transport::mcast::McastLimits {
        rocev2::transport::mcast::McastLimits {
            max_groups: self.max_mcast_grp,
            max_qps_per_group: self.max_mcast_qp_attach,
            max_total_attach: self.max_total_mcast_qp_attach,
        }
    }
}

impl Default for DeviceLimits {
    fn default() -> Self {
        // rxe's limits (rxe_param.h; ibv_devinfo -v on rxe): rd_atom 128, inline 400, message 8 MiB;
        // queue sizes are ours.
        DeviceLimits {
            max_qp: 4096,
            max_qp_wr: 16_384,
            max_sge: 32,
            max_cq: 4096,
            max_cqe: 1 << 20,
            max_mr_size: 1 << 40,
            max_qp_rd_atom: 128,
            max_qp_init_rd_atom: 128,
            max_srq: 1024,
            max_srq_wr: 16_384,
            max_inline_data: 400,
            max_msg_size: 8 << 20,
            // rxe_param.h: RXE_MAX_MCAST_GRP, RXE_MAX_MCAST_QP_ATTACH, RXE_MAX_TOT_MCAST_QP_ATTACH.
            max_mcast_grp: 8192,
            max_mcast_qp_attach: 56,
            max_total_mcast_qp_attach: 0x70000,
        }
    }
}

/// `struct ibv_device_attr`, the fields that matter here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Name.
    pub name: String,
    /// Node GUID (EUI-64 from the MAC).
    pub node_guid: u64,
    /// Limits.
    pub limits: DeviceLimits,
    /// Atomic guarantee: atomics are atomic across all QPs of this device and
    /// with respect to other atomics (`IBV_ATOMIC_HCA`).
    pub atomic_cap_hca: bool,
    /// Physical ports (1).
    pub phys_port_cnt: u8,
}

/// Port state (`enum ibv_port_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortState {
    /// Link down.
    Down,
    /// Active.
    Active,
}

/// `struct ibv_port_attr`, the fields that matter on RoCE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortAttr {
    /// State.
    pub state: PortState,
    /// Largest IB MTU.
    pub max_mtu: Mtu,
    /// IB MTU in use (follows the link MTU).
    pub active_mtu: Mtu,
    /// Entries in the GID table.
    pub gid_tbl_len: u32,
    /// Link MTU in bytes.
    pub link_mtu: u32,
    /// Link layer is Ethernet (RoCE).
    pub link_layer_ethernet: bool,
}

pub(crate) struct DeviceInner {
    pub(crate) name: String,
    pub(crate) nic: Arc<Nic>,
    pub(crate) memory: Arc<MemoryTable>,
    pub(crate) mac: [u8; 6],
    pub(crate) gids: Vec<Gid>,
    pub(crate) link_mtu: u32,
    pub(crate) active_mtu: Mtu,
    pub(crate) limits: DeviceLimits,
    pub(crate) resolve: Resolver,
    /// The host's memberships of the groups QPs attached to (also
    /// serializes attach and detach).
    pub(crate) host_groups: std::sync::Mutex<Option<crate::host_groups::HostGroups>>,
    pub(crate) next_id: AtomicU32,
    pub(crate) qp_count: AtomicU32,
    pub(crate) cq_count: AtomicU32,
    pub(crate) srq_count: AtomicU32,
    /// Regions dropped with windows still bound, waiting to be deregistered.
    /// Declared after `nic` and `memory`: what is left here when the device
    /// closes is freed after the NIC (and with it the datapath) is gone.
    pub(crate) deferred: crate::backing::DeferredDeregs,
    /// The counter files published for this device (removed as it closes).
    pub(crate) counter_files: std::sync::Mutex<Vec<Arc<crate::counter_file::CounterFile>>>,
    // Declared last, but dropped last would be wrong: the runner must stop
    // before the NIC goes away, so `Drop for DeviceInner` stops it first.
    pub(crate) runner: std::sync::Mutex<Vec<Runner>>,
}

impl DeviceInner {
    pub(crate) fn alloc_id(&self) -> u32 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Retry deregistering regions dropped while windows were bound.
    #[inline]
    pub(crate) fn reclaim_deferred(&self) {
        self.deferred.reclaim(&self.memory);
    }

    /// The MAC `gid` is reached at: a group's multicast MAC, this device's
    /// own for one of its own GIDs, else the neighbour table's entry (ARP/ND triggered when
    /// missing). Loopback: the kernel resolves a local address to the
    /// netdev's own MAC (ib_addr.c `rdma_translate_ip`), rxe marks a frame
    /// to that MAC `RXE_LOOPBACK_MASK` (`rxe_prepare`) and loops it back;
    /// the `Nic` delivers frames to our own MAC or addresses inside the
    /// device the same way, never to the port.
    pub(crate) fn resolve_mac(&self, gid: &Gid) -> Result<[u8; 6]> {
        // A group has no neighbour entry: its MAC follows from its address
        // (RFC 1112 / RFC 2464; kernel `ib_resolve_eth_dmac` for a multicast AH).
        if let Some(mac) = rocev2::transport::mcast::multicast_mac(gid) {
            tracing::debug!(device = %self.name, gid = %crate::gid_to_string(gid), mac = %mac_string(mac), "neighbour: multicast group");
            return Ok(mac);
        }
        if self.gids.contains(gid) {
            tracing::debug!(device = %self.name, gid = %crate::gid_to_string(gid), "neighbour: our own GID, looped back inside the device");
            return Ok(self.mac);
        }
        match (self.resolve)(gid) {
            Some(mac) => {
                tracing::debug!(device = %self.name, gid = %crate::gid_to_string(gid), mac = %mac_string(mac), "neighbour resolved");
                Ok(mac)
            }
            None => {
                tracing::debug!(device = %self.name, gid = %crate::gid_to_string(gid), "neighbour not resolved");
                // fe80::/10: neighbour discovery on this interface alone,
                // which needs IPv6 on at both ends (rxe's GID 0 likewise).
                let hint = if gid[0] == 0xfe && gid[1] & 0xc0 == 0x80 {
                    " (a link-local GID: the peer must answer IPv6 neighbour discovery on this link, IPv6 on at both ends)"
                } else {
                    ""
                };
                Err(Error::new(ErrorKind::NotFound, format!("no neighbour entry for GID {}{hint}", crate::gid_to_string(gid))))
            }
        }
    }

    /// Resolve `dgid` into a full path from our GID at `sgid_index`.
    pub(crate) fn resolve_path(&self, attr: &crate::AhAttr) -> Result<AddressVector> {
        let sgid = *self
            .gids
            .get(usize::from(attr.sgid_index))
            .ok_or_else(|| Error::invalid(format!("sgid_index {} outside the GID table ({} entries)", attr.sgid_index, self.gids.len())))?;
        let dmac = self.resolve_mac(&attr.dgid)?;
        let v4s = AddressVector::is_ipv4_mapped(&sgid);
        let v4d = AddressVector::is_ipv4_mapped(&attr.dgid);
        if v4s != v4d {
            return Err(Error::invalid("source and destination GIDs are of different IP versions"));
        }
        Ok(AddressVector {
            dmac,
            smac: self.mac,
            vlan: None,
            sgid,
            dgid: attr.dgid,
            traffic_class: attr.traffic_class,
            hop_limit: if attr.hop_limit == 0 { 64 } else { attr.hop_limit },
            flow_label: attr.flow_label,
            udp_sport: None,
        })
    }
}

/// An open device (`struct ibv_context`). Cheap to clone; the device closes
/// when the last handle and every object made from it are gone.
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<DeviceInner>,
}

/// The link-local GID rxe puts at index 0: fe80::/64 with the MAC's EUI-64.
pub fn link_local_gid(mac: [u8; 6]) -> Gid {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[8..].copy_from_slice(&eui64(mac).to_be_bytes());
    g
}

fn eui64(mac: [u8; 6]) -> u64 {
    u64::from_be_bytes([mac[0] ^ 2, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]])
}

/// Open a device (`ibv_open_device`).
pub fn open_device(config: DeviceConfig) -> Result<Context> {
    let DeviceConfig { name, port, mac, ipv4, ipv6, link_mtu, datapath, first_qpn, limits, dcqcn, mcast_ifindex } = config;
    let host_groups = mcast_ifindex.map(crate::host_groups::HostGroups::new).transpose()?;
    let active_mtu =
        Mtu::for_netdev_mtu(link_mtu).ok_or_else(|| Error::invalid(format!("link MTU {link_mtu} is too small for RoCEv2 (needs at least 328)")))?;
    if !(2..=0x00ff_ffff).contains(&first_qpn) {
        return Err(Error::invalid(format!("first_qpn {first_qpn:#x} must be in 2..=0xffffff (0 and 1 are special QPs)")));
    }
    let mut gids = vec![link_local_gid(mac)];
    if let Some(ip) = ipv4 {
        gids.push(AddressVector::ipv4_gid(ip));
    }
    gids.extend(ipv6.iter().copied());

    let (ports, resolve): (Vec<Box<dyn Port>>, Resolver) = match port {
        PortConfig::Memory { hub, impairments } => {
            impairments.faults.check().map_err(|e| Error::invalid(format!("memory port impairments: {e}")))?;
            for g in &gids[1..] {
                hub.publish_address(*g, mac);
            }
            let p = hub.attach(mac, link_mtu, impairments);
            let h = hub.clone();
            (vec![Box::new(p)], Box::new(move |g: &Gid| h.resolve(g)))
        }
        PortConfig::Custom { ports, resolve } => (ports, resolve),
    };
    if ports.is_empty() {
        return Err(Error::invalid("a device needs at least one port"));
    }
    if let DatapathMode::Threads { cores, .. } = &datapath {
        if cores.len() != ports.len() {
            return Err(Error::invalid(format!("{} datapath cores for {} ports: one port (queue) per core", cores.len(), ports.len())));
        }
    }
    let memory = Arc::new(MemoryTable::new());
    let n = ports.len() as u32;
    let shards = ports
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let cfg =
                EngineConfig { first_qpn, max_qps: limits.max_qp, shard: (i as u32, n), dcqcn, mcast: limits.mcast(), ..EngineConfig::default() };
            (Engine::new(cfg, memory.clone()), p)
        })
        .collect();
    tracing::debug!(
        device = %name,
        datapath = ?datapath,
        shards = n,
        link_mtu,
        active_mtu = active_mtu.bytes(),
        gids = ?gids.iter().map(crate::gid_to_string).collect::<Vec<_>>(),
        "device open"
    );
    // Frames to our own GIDs are looped back inside the NIC (`Nic` docs).
    let nic = Arc::new(Nic::sharded(shards, (limits.max_qp + limits.max_srq) as usize).with_local_addresses(&gids).with_mcast_limits(limits.mcast()));
    let runners = match datapath {
        DatapathMode::Thread { core, idle } => vec![Runner::spawn(nic.clone(), core, idle)?],
        DatapathMode::Threads { cores, idle } => {
            cores.iter().enumerate().map(|(i, &c)| Runner::spawn_shard(nic.clone(), i, Some(c), idle)).collect::<std::io::Result<Vec<_>>>()?
        }
        DatapathMode::Manual => Vec::new(),
    };
    Ok(Context {
        inner: Arc::new(DeviceInner {
            name,
            nic,
            memory,
            mac,
            gids,
            link_mtu,
            active_mtu,
            limits,
            resolve,
            host_groups: std::sync::Mutex::new(host_groups),
            next_id: AtomicU32::new(1),
            qp_count: AtomicU32::new(0),
            cq_count: AtomicU32::new(0),
            srq_count: AtomicU32::new(0),
            deferred: Default::default(),
            counter_files: Default::default(),
            runner: std::sync::Mutex::new(runners),
        }),
    })
}

impl Context {
    /// `ibv_query_device`.
    pub fn query_device(&self) -> DeviceAttr {
        DeviceAttr {
            name: self.inner.name.clone(),
            node_guid: eui64(self.inner.mac),
            limits: self.inner.limits,
            atomic_cap_hca: true,
            phys_port_cnt: 1,
        }
    }

    /// `ibv_query_port` (port 1 is the only port).
    pub fn query_port(&self, port_num: u8) -> Result<PortAttr> {
        if port_num != 1 {
            return Err(Error::invalid(format!("port {port_num} does not exist (urnic devices have port 1)")));
        }
        Ok(PortAttr {
            state: if self.inner.nic.link_up() { PortState::Active } else { PortState::Down },
            max_mtu: Mtu::Mtu4096,
            active_mtu: self.inner.active_mtu,
            gid_tbl_len: self.inner.gids.len() as u32,
            link_mtu: self.inner.link_mtu,
            link_layer_ethernet: true,
        })
    }

    /// `ibv_query_gid`.
    pub fn query_gid(&self, port_num: u8, index: u32) -> Result<Gid> {
        self.query_port(port_num)?;
        self.inner
            .gids
            .get(index as usize)
            .copied()
            .ok_or_else(|| Error::invalid(format!("GID index {index} outside the table ({} entries)", self.inner.gids.len())))
    }

    /// The whole GID table.
    pub fn gids(&self) -> &[Gid] {
        &self.inner.gids
    }

    /// The port MAC.
    pub fn mac(&self) -> [u8; 6] {
        self.inner.mac
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// One datapath iteration, for [`DatapathMode::Manual`]. Returns the work
    /// done (0 = idle). Harmless (but pointless) with a datapath thread.
    pub fn poll(&self) -> usize {
        self.inner.nic.poll()
    }

    /// Drive the datapath from an application thread that is polling for
    /// completions anyway (what the C library's `ibv_poll_cq` does when the
    /// CQ is empty): one iteration of every shard no datapath thread is in
    /// right now, and the datapath threads stand back while the application
    /// keeps driving, so a spinning application and a spinning datapath
    /// thread do not share the cores (urnic_datapath's `DRIVE_WINDOW`
    /// after the last call; arming a CQ, [`Cq::req_notify`](crate::Cq::req_notify),
    /// hands the work back at once). Lock-free for the caller: it never
    /// waits for a datapath thread.
    pub fn drive(&self) -> usize {
        self.inner.nic.drive()
    }

    /// Next asynchronous event, if any (non-blocking `ibv_get_async_event`).
    pub fn poll_async_event(&self) -> Option<AsyncEvent> {
        self.inner.nic.poll_async_event()
    }

    /// A file descriptor that becomes readable when an asynchronous event
    /// is waiting for [`Context::poll_async_event`] (`ibv_context.async_fd`,
    /// for poll/epoll); read it (8 bytes) to clear it.
    pub fn async_event_fd(&self) -> std::os::fd::RawFd {
        self.inner.nic.async_event_fd()
    }

    /// The MAC address a GID is reached at from this device: the kernel's
    /// neighbour table (ARP/ND triggered when missing), or this device's
    /// own MAC for one of its own GIDs.
    pub fn resolve_mac(&self, gid: &Gid) -> Result<[u8; 6]> {
        self.inner.resolve_mac(gid)
    }

    /// Device-wide transport counters: frames received, and frames dropped
    /// before reaching a QP, by reason (bad ICRC, unknown QPN, ...).
    pub fn engine_stats(&self) -> rocev2::transport::engine::EngineStats {
        self.inner.nic.engine_stats()
    }

    /// The underlying NIC (datapath counters in `nic().stats`, engine access for tools).
    pub fn nic(&self) -> &Arc<Nic> {
        &self.inner.nic
    }

    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&self) -> Result<crate::Pd> {
        Ok(crate::Pd::new(self.clone()))
    }

    /// Memory regions dropped while memory windows were still bound to
    /// them, and still registered because of it (after retrying now). Their
    /// memory is held by the device and freed once the windows are unbound,
    /// invalidated or deallocated, or when the device closes. Memory
    /// registered with [`crate::Pd::reg_mr_raw`] must stay valid while its
    /// region is counted here.
    pub fn deferred_deregistrations(&self) -> usize {
        self.inner.reclaim_deferred();
        self.inner.deferred.pending()
    }
}

impl Drop for DeviceInner {
    fn drop(&mut self) {
        // Stop the datapath thread before the NIC and memory go away.
        if let Ok(mut r) = self.runner.lock() {
            r.clear();
        }
        // Regions still registered because windows stay bound: freed after
        // the NIC (field order) if nothing else holds it, else leaked.
        let datapath_gone = Arc::strong_count(&self.nic) == 1 && Arc::weak_count(&self.nic) == 0;
        self.deferred.close(&self.memory, datapath_gone);
        for f in self.counter_files.get_mut().map(std::mem::take).unwrap_or_default() {
            f.remove();
        }
    }
}

/// Format a GID as an IPv6 address string (IPv4-mapped shown as `::ffff:a.b.c.d`).
pub fn gid_to_string(g: &Gid) -> String {
    std::net::Ipv6Addr::from(*g).to_string()
}

/// The IP address a GID stands for, as the neighbour table keys it: IPv4
/// for an IPv4-mapped GID, else the IPv6 address itself, link-local
/// (fe80::/10) ones included (their interface is the device's).
fn gid_ip(gid: &Gid) -> std::net::IpAddr {
    match AddressVector::is_ipv4_mapped(gid) {
        true => std::net::IpAddr::from([gid[12], gid[13], gid[14], gid[15]]),
        false => std::net::IpAddr::from(*gid),
    }
}

/// `aa:bb:cc:dd:ee:ff`.
fn mac_string(m: [u8; 6]) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    #[test]
    fn gids_map_to_the_addresses_neighbours_are_keyed_by() {
        let ll = link_local_gid([0x02, 0x75, 0x72, 0, 0, 2]);
        assert_eq!(gid_ip(&ll), IpAddr::V6("fe80::75:72ff:fe00:2".parse::<Ipv6Addr>().unwrap()), "link-local, unchanged");
        assert_eq!(gid_ip(&AddressVector::ipv4_gid([10, 99, 0, 2])), IpAddr::V4(Ipv4Addr::new(10, 99, 0, 2)));
        let ula = "fd75::2".parse::<Ipv6Addr>().unwrap();
        assert_eq!(gid_ip(&ula.octets()), IpAddr::V6(ula));
    }
}
