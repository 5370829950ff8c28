//! Devices and contexts: `ibv_get_device_list`, `ibv_open_device`, queries
//! of device, port, GIDs and P_Keys, asynchronous events.
//!
//! One device per eligible Ethernet interface of the process's network
//! namespace (up, with an IPv4 or IPv6 address), named `urnic-<ifname>` as
//! `urnic devinfo` prints it; `URNIC_DEVICES=eth0,urnic-eth1` narrows the
//! list. Opening one attaches urnic's XDP program, opens the AF_XDP socket
//! and starts the datapath inside this process (`URNIC_CORES=2` or `2,3`
//! pins its thread or threads).

use std::collections::HashMap;
use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::ptr;
use std::sync::Mutex;

use crate::ctx::{uctx, UContext, VERBS_ABI_IS_EXTENDED};
use crate::ffi::*;
use crate::{copy_cstr, errno_of, guard, lock, null_err, set_errno};

/// `struct ibv_device` and the interface behind it. Never freed: a device
/// stays valid for the life of the process, as libibverbs keeps its device
/// objects while contexts may point at them.
#[repr(C)]
pub(crate) struct UDevice {
    pub(crate) dev: ibv_device,
    pub(crate) ifname: String,
    pub(crate) ifindex: u32,
    /// Node GUID, big-endian (EUI-64 of the MAC), as `ibv_get_device_guid` returns it.
    pub(crate) guid_be: u64,
}

struct DevicePtr(*mut UDevice);
// SAFETY: the devices are leaked, immutable after creation, and only read.
unsafe impl Send for DevicePtr {}

static DEVICES: Mutex<Vec<DevicePtr>> = Mutex::new(Vec::new());

fn eui64_be(mac: [u8; 6]) -> u64 {
    let b = [mac[0] ^ 2, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]];
    u64::from_ne_bytes(b)
}

/// The device of `ifname`, created on first sight.
fn device_for(info: &urnic::DeviceInfo) -> *mut UDevice {
    let mut devs = lock(&DEVICES);
    if let Some(d) = devs.iter().find(|d| {
        // SAFETY: leaked devices live forever.
        unsafe { (*d.0).ifname == info.ifname }
    }) {
        return d.0;
    }
    let mut dev = ibv_device { node_type: IBV_NODE_CA, transport_type: IBV_TRANSPORT_IB, ..Default::default() };
    let name = format!("urnic-{}", info.ifname);
    copy_cstr(&mut dev.name, &name);
    copy_cstr(&mut dev.dev_name, &format!("uverbs-urnic-{}", info.ifname));
    copy_cstr(&mut dev.dev_path, &format!("/sys/class/infiniband_verbs/uverbs-urnic-{}", info.ifname));
    copy_cstr(&mut dev.ibdev_path, &format!("/sys/class/infiniband/{name}"));
    let d = Box::into_raw(Box::new(UDevice { dev, ifname: info.ifname.clone(), ifindex: info.ifindex, guid_be: eui64_be(info.mac) }));
    devs.push(DevicePtr(d));
    d
}

/// Whether `URNIC_DEVICES` (if set) names this interface or its device.
fn wanted(ifname: &str) -> bool {
    match std::env::var("URNIC_DEVICES") {
        Ok(list) if !list.trim().is_empty() => list.split(',').map(str::trim).any(|n| n == ifname || n.strip_prefix("urnic-") == Some(ifname)),
        _ => true,
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    guard("ibv_get_device_list", ptr::null_mut(), || {
        let list = match urnic::device_list() {
            Ok(l) => l,
            Err(e) => return null_err(errno_of(&e)),
        };
        let devs: Vec<*mut UDevice> =
            list.iter().filter(|d| d.link_up && (!d.ipv4.is_empty() || !d.ipv6.is_empty()) && wanted(&d.ifname)).map(device_for).collect();
        // SAFETY: calloc of n+1 pointers; checked for NULL.
        let arr = libc::calloc(devs.len() + 1, std::mem::size_of::<*mut ibv_device>()) as *mut *mut ibv_device;
        if arr.is_null() {
            return null_err(libc::ENOMEM);
        }
        for (i, d) in devs.iter().enumerate() {
            // SAFETY: `arr` has n+1 slots; `ibv_device` is the first field of `UDevice`.
            *arr.add(i) = *d as *mut ibv_device;
        }
        if !num_devices.is_null() {
            *num_devices = devs.len() as c_int;
        }
        arr
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // The devices themselves stay (contexts may still use them).
    libc::free(list as *mut c_void);
}

/// The urnic device behind `dev`, if it is one of ours.
pub(crate) unsafe fn udevice(dev: *mut ibv_device) -> Option<&'static UDevice> {
    if dev.is_null() {
        return None;
    }
    let devs = lock(&DEVICES);
    devs.iter().find(|d| d.0 as *mut ibv_device == dev).map(|d| &*d.0)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(dev: *mut ibv_device) -> *const c_char {
    match udevice(dev) {
        Some(d) => d.dev.name.as_ptr(),
        None => null_err::<c_char>(libc::EINVAL),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(dev: *mut ibv_device) -> u64 {
    udevice(dev).map_or(0, |d| d.guid_be)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(dev: *mut ibv_device) -> c_int {
    udevice(dev).map_or(-1, |d| d.ifindex as c_int)
}

fn cores_from_env() -> Result<urnic::DatapathMode, String> {
    let idle = urnic::IdlePolicy::default();
    let Ok(v) = std::env::var("URNIC_CORES") else { return Ok(urnic::DatapathMode::Thread { core: None, idle }) };
    let cores: Result<Vec<usize>, _> = v.split(',').map(|c| c.trim().parse::<usize>()).collect();
    match cores {
        Ok(c) if c.len() == 1 => Ok(urnic::DatapathMode::Thread { core: Some(c[0]), idle }),
        Ok(c) if !c.is_empty() => Ok(urnic::DatapathMode::Threads { cores: c, idle }),
        _ => Err(format!("URNIC_CORES={v:?}: expected core numbers, e.g. 2 or 2,3")),
    }
}

/// What `urnic exec` (or the user) asks of every device a program opens,
/// through the environment: `URNIC_PCAP=FILE` captures its frames (a second
/// device of the same process gets `FILE.<device>`), `URNIC_DROP=P` makes
/// the XDP program drop that share of received RoCE frames (a test
/// impairment), `URNIC_STATS=DIR` publishes live counters there for
/// `urnic stat` (default `/run/urnic`; `URNIC_STATS=0` turns it off).
struct ExecEnv {
    pcap: Option<std::path::PathBuf>,
    drop: f64,
    stats: Option<std::path::PathBuf>,
}

static OPENED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

impl ExecEnv {
    fn read() -> Result<ExecEnv, String> {
        let drop = match std::env::var("URNIC_DROP") {
            Ok(v) => match v.trim().parse::<f64>() {
                Ok(p) if (0.0..=1.0).contains(&p) => p,
                _ => return Err(format!("URNIC_DROP={v:?}: expected a probability from 0 to 1")),
            },
            Err(_) => 0.0,
        };
        let stats = match std::env::var("URNIC_STATS") {
            Ok(v) if v == "0" => None,
            Ok(v) if !v.is_empty() => Some(v.into()),
            _ => Some("/run/urnic".into()),
        };
        let pcap = std::env::var_os("URNIC_PCAP").filter(|v| !v.is_empty()).map(std::path::PathBuf::from);
        Ok(ExecEnv { pcap, drop, stats })
    }

    fn apply(&self, ctx: &urnic::Context, name: &str) -> Result<(), String> {
        if let Some(dir) = &self.stats {
            // Live counters are a convenience: a read-only /run does not
            // stop the program.
            let _ = ctx.publish_counters(dir);
        }
        if let Some(file) = &self.pcap {
            let nth = OPENED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let path = if nth == 0 { file.clone() } else { std::path::PathBuf::from(format!("{}.{name}", file.display())) };
            ctx.nic().set_capture(Some(&path)).map_err(|e| format!("URNIC_PCAP {}: {e}", path.display()))?;
        }
        Ok(())
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    guard("ibv_open_device", ptr::null_mut(), || {
        let Some(d) = udevice(dev) else { return null_err(libc::EINVAL) };
        let mode = match cores_from_env() {
            Ok(m) => m,
            Err(msg) => {
                eprintln!("urnic: {msg}");
                return null_err(libc::EINVAL);
            }
        };
        let name = CStr::from_ptr(d.dev.name.as_ptr()).to_string_lossy().into_owned();
        let mut xsk = urnic::XskConfig::new(&d.ifname);
        let env = match ExecEnv::read() {
            Ok(e) => e,
            Err(msg) => {
                eprintln!("urnic: {msg}");
                return null_err(libc::EINVAL);
            }
        };
        xsk.xdp.impairments.faults.loss = env.drop;
        if let Some(ctx) = crate::ctx::share_open(&d.ifname) {
            return context_for(dev, ctx);
        }
        let ctx = match urnic::open_af_xdp(None, &name, &xsk, mode) {
            Ok(c) => c,
            Err(e) => {
                let errno = if libc::geteuid() != 0 { libc::EPERM } else { errno_of(&e) };
                if errno == libc::EPERM {
                    eprintln!("urnic: opening {name} needs root (CAP_NET_ADMIN, CAP_BPF, CAP_IPC_LOCK): {e}");
                } else {
                    eprintln!("urnic: opening {name}: {e}");
                }
                return null_err(errno);
            }
        };
        if let Err(msg) = env.apply(&ctx, &name) {
            eprintln!("urnic: {msg}");
            return null_err(libc::EINVAL);
        }
        crate::ctx::record_open(&d.ifname, &ctx);
        context_for(dev, ctx)
    })
}

/// The `ibv_context` (a new `verbs_context`) over an open urnic context.
unsafe fn context_for(dev: *mut ibv_device, ctx: urnic::Context) -> *mut ibv_context {
    let async_fd = ctx.async_event_fd();
    let mut vctx: verbs_context = std::mem::zeroed();
    vctx.sz = std::mem::size_of::<verbs_context>();
    vctx.query_port = Some(vctx_query_port);
    let c = &mut vctx.context;
    c.device = dev;
    c.cmd_fd = -1;
    c.async_fd = async_fd;
    c.num_comp_vectors = 1;
    c.abi_compat = VERBS_ABI_IS_EXTENDED;
    libc::pthread_mutex_init(&mut c.mutex as *mut _ as *mut libc::pthread_mutex_t, ptr::null());
    crate::cq::install_ops(&mut c.ops);
    crate::qp::install_ops(&mut c.ops);
    crate::mr::install_ops(&mut c.ops);
    let u = Box::into_raw(Box::new(UContext {
        vctx,
        ctx,
        async_fd,
        qps: Mutex::new(HashMap::new()),
        srqs: Mutex::new(HashMap::new()),
        held: Default::default(),
    }));
    &mut (*u).vctx.context
}

#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(ctx: *mut ibv_context) -> c_int {
    guard("ibv_close_device", -1, || {
        let Some(u) = uctx(ctx) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if u.held.load(std::sync::atomic::Ordering::Acquire) {
            // RDMA-CM's own context (a program closing `rdma_cm_id.verbs`,
            // as perftest -R does on cleanup): it stays open for RDMA-CM.
            return 0;
        }
        if let Some(d) = udevice((*ctx).device) {
            crate::ctx::release_open(&d.ifname);
        }
        let off = std::mem::offset_of!(verbs_context, context);
        drop(Box::from_raw((ctx as *mut u8).sub(off) as *mut UContext));
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(ctx: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int {
    guard("ibv_query_device", libc::EIO, || {
        let (Some(u), false) = (uctx(ctx), attr.is_null()) else { return libc::EINVAL };
        let d = u.ctx.query_device();
        let l = d.limits;
        let a = &mut *attr;
        *a = ibv_device_attr::default();
        copy_cstr(&mut a.fw_ver, env!("CARGO_PKG_VERSION"));
        a.node_guid = d.node_guid.to_be();
        a.sys_image_guid = d.node_guid.to_be();
        a.max_mr_size = l.max_mr_size;
        a.page_size_cap = 0xffff_f000;
        // As rxe: no vendor (0xFFFFFF), part 0; perftest then treats the
        // device as generic and uses the classic post-send API.
        a.vendor_id = 0x00ff_ffff;
        a.vendor_part_id = 0;
        a.hw_ver = 0;
        a.max_qp = l.max_qp as c_int;
        a.max_qp_wr = l.max_qp_wr as c_int;
        a.device_cap_flags = (IBV_DEVICE_RC_RNR_NAK_GEN
            | IBV_DEVICE_PORT_ACTIVE_EVENT
            | IBV_DEVICE_SYS_IMAGE_GUID
            | IBV_DEVICE_MEM_WINDOW
            | IBV_DEVICE_MEM_WINDOW_TYPE_2B) as _;
        a.max_sge = l.max_sge as c_int;
        a.max_sge_rd = l.max_sge as c_int;
        a.max_cq = l.max_cq as c_int;
        a.max_cqe = l.max_cqe as c_int;
        a.max_mr = 0x00ff_ffff;
        a.max_pd = 0x00ff_ffff;
        a.max_qp_rd_atom = l.max_qp_rd_atom as c_int;
        a.max_res_rd_atom = (l.max_qp_rd_atom * l.max_qp) as c_int;
        a.max_qp_init_rd_atom = l.max_qp_init_rd_atom as c_int;
        a.atomic_cap = if d.atomic_cap_hca { IBV_ATOMIC_HCA } else { IBV_ATOMIC_NONE };
        a.max_mw = 0x00ff_ffff;
        a.max_ah = 0x00ff_ffff;
        a.max_srq = l.max_srq as c_int;
        a.max_srq_wr = l.max_srq_wr as c_int;
        a.max_srq_sge = l.max_sge as c_int;
        a.max_mcast_grp = l.max_mcast_grp as c_int;
        a.max_mcast_qp_attach = l.max_mcast_qp_attach as c_int;
        a.max_total_mcast_qp_attach = l.max_total_mcast_qp_attach as c_int;
        a.max_pkeys = 1;
        a.local_ca_ack_delay = 15;
        a.phys_port_cnt = d.phys_port_cnt;
        0
    })
}

/// The full `ibv_port_attr` of port 1.
unsafe fn port_attr(u: &UContext, port: u8) -> Result<ibv_port_attr, c_int> {
    let p = u.ctx.query_port(port).map_err(|e| errno_of(&e))?;
    let mtu = |m: urnic::Mtu| m as u32 as ibv_mtu;
    Ok(ibv_port_attr {
        state: if p.state == urnic::PortState::Active { IBV_PORT_ACTIVE } else { IBV_PORT_DOWN },
        max_mtu: mtu(p.max_mtu),
        active_mtu: mtu(p.active_mtu),
        gid_tbl_len: p.gid_tbl_len as c_int,
        port_cap_flags: IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS,
        max_msg_sz: u.ctx.query_device().limits.max_msg_size,
        pkey_tbl_len: 1,
        max_vl_num: 1,
        active_width: 1,                                                     // 1X
        active_speed: 32,                                                    // as rxe on Ethernet (EDR in IB terms)
        phys_state: if p.state == urnic::PortState::Active { 5 } else { 3 }, // LinkUp / Disabled
        link_layer: IBV_LINK_LAYER_ETHERNET as u8,
        ..Default::default()
    })
}

/// `sizeof(struct _compat_ibv_port_attr)`: rdma-core defines that struct in
/// verbs.c, not in the installed header (bindgen sees an opaque, zero-sized
/// type), as `ibv_port_attr` up to and including `flags`, 4-byte aligned.
const COMPAT_PORT_ATTR_SIZE: usize = (std::mem::offset_of!(ibv_port_attr, flags) + 1).next_multiple_of(4);

#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(ctx: *mut ibv_context, port: u8, attr: *mut _compat_ibv_port_attr) -> c_int {
    guard("ibv_query_port", libc::EIO, || {
        let (Some(u), false) = (uctx(ctx), attr.is_null()) else { return libc::EINVAL };
        match port_attr(u, port) {
            Ok(full) => {
                // The compat struct is the leading part of the full one, as
                // rdma-core's __lib_query_port copies it.
                ptr::copy_nonoverlapping(&full as *const _ as *const u8, attr as *mut u8, COMPAT_PORT_ATTR_SIZE);
                0
            }
            Err(e) => e,
        }
    })
}

/// `verbs_context.query_port`: the inline `ibv_query_port` of verbs.h.
unsafe extern "C" fn vctx_query_port(ctx: *mut ibv_context, port: u8, attr: *mut ibv_port_attr, len: usize) -> c_int {
    guard("ibv_query_port", libc::EIO, || {
        let (Some(u), false) = (uctx(ctx), attr.is_null()) else { return libc::EINVAL };
        match port_attr(u, port) {
            Ok(full) => {
                let n = len.min(std::mem::size_of::<ibv_port_attr>());
                ptr::copy_nonoverlapping(&full as *const _ as *const u8, attr as *mut u8, n);
                0
            }
            Err(e) => e,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(ctx: *mut ibv_context, port: u8, index: c_int, gid: *mut ibv_gid) -> c_int {
    guard("ibv_query_gid", -1, || {
        let (Some(u), false) = (uctx(ctx), gid.is_null()) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        match u.ctx.query_gid(port, index.max(-1) as u32) {
            Ok(g) if index >= 0 => {
                (*gid).raw = g;
                0
            }
            _ => {
                set_errno(libc::EINVAL);
                -1
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    ctx: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    guard("ibv_query_gid_ex", libc::EIO, || {
        let (Some(u), false) = (uctx(ctx), entry.is_null()) else { return libc::EINVAL };
        if flags != 0 || entry_size < std::mem::size_of::<ibv_gid_entry>() || port > 255 {
            return libc::EINVAL;
        }
        match u.ctx.query_gid(port as u8, index) {
            Ok(g) => {
                let e = &mut *entry;
                e.gid.raw = g;
                e.gid_index = index;
                e.port_num = port;
                e.gid_type = IBV_GID_TYPE_ROCE_V2;
                e.ndev_ifindex = udevice((*ctx).device).map_or(0, |d| d.ifindex);
                0
            }
            // The kernel's rdma_get_gid_attr: a port or index outside the
            // table is EINVAL (ENODATA is for an empty entry inside it, and
            // urnic's table has none).
            Err(_) => libc::EINVAL,
        }
    })
}

/// `enum ibv_gid_type_sysfs` of rdma-core's driver.h (not an installed
/// header): 0 = IB / RoCE v1, 1 = RoCE v2.
const IBV_GID_TYPE_SYSFS_ROCE_V2: u32 = 1;

/// `ibv_query_gid_type` (IBVERBS_PRIVATE_34, imported by ibv_devinfo):
/// every urnic GID is a RoCEv2 GID.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(ctx: *mut ibv_context, port: u8, index: u32, ty: *mut u32) -> c_int {
    guard("ibv_query_gid_type", -1, || {
        let (Some(u), false) = (uctx(ctx), ty.is_null()) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if u.ctx.query_gid(port, index).is_err() {
            set_errno(libc::EINVAL);
            return -1;
        }
        *ty = IBV_GID_TYPE_SYSFS_ROCE_V2;
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(ctx: *mut ibv_context, port: u8, index: c_int, pkey: *mut u16) -> c_int {
    guard("ibv_query_pkey", -1, || {
        let ok = uctx(ctx).is_some_and(|u| u.ctx.query_port(port).is_ok());
        if !ok || index != 0 || pkey.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        *pkey = 0xffffu16.to_be();
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(ctx: *mut ibv_context, port: u8, pkey: u16) -> c_int {
    let ok = uctx(ctx).is_some_and(|u| u.ctx.query_port(port).is_ok());
    // One P_Key, the default partition (full or limited membership).
    if ok && u16::from_be(pkey) & 0x7fff == 0x7fff {
        0
    } else {
        set_errno(libc::ENOENT);
        -1
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(ctx: *mut ibv_context, event: *mut ibv_async_event) -> c_int {
    guard("ibv_get_async_event", -1, || {
        let (Some(u), false) = (uctx(ctx), event.is_null()) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        loop {
            if let Some(ev) = u.ctx.poll_async_event() {
                if fill_event(u, ev, &mut *event) {
                    return 0;
                }
                continue;
            }
            // Block on the event fd as libibverbs blocks on the kernel's: one
            // read, so a signal without SA_RESTART ends the wait with EINTR.
            let mut buf = 0u64;
            let n = libc::read(u.async_fd, &mut buf as *mut u64 as *mut c_void, 8);
            if n < 0 {
                set_errno(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO));
                return -1;
            }
        }
    })
}

/// Translate an urnic event; false if its object is gone (skip it).
unsafe fn fill_event(u: &UContext, ev: urnic::AsyncEvent, out: &mut ibv_async_event) -> bool {
    use urnic::AsyncEvent as E;
    let qp = |n: u32| lock(&u.qps).get(&n).copied();
    match ev {
        E::QpFatal(n) | E::SqDrained(n) => {
            let Some(q) = qp(n) else { return false };
            out.element.qp = q as *mut ibv_qp;
            out.event_type = if matches!(ev, E::QpFatal(_)) { IBV_EVENT_QP_FATAL } else { IBV_EVENT_SQ_DRAINED };
        }
        E::SrqLimitReached(id) => {
            let Some(s) = lock(&u.srqs).get(&id.0).copied() else { return false };
            out.element.srq = s as *mut ibv_srq;
            out.event_type = IBV_EVENT_SRQ_LIMIT_REACHED;
        }
        E::PortActive | E::PortError => {
            out.element.port_num = 1;
            out.event_type = if ev == E::PortActive { IBV_EVENT_PORT_ACTIVE } else { IBV_EVENT_PORT_ERR };
        }
    }
    true
}

#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(_event: *mut ibv_async_event) {
    // Nothing waits for acknowledgements: destroying an object never blocks.
}

/// `ibv_fork_init`: urnic's memory is never remapped by fork (no kernel
/// DMA mappings to protect), so there is nothing to set up.
#[no_mangle]
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}

#[no_mangle]
pub extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

#[no_mangle]
pub extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// `ibv_read_sysfs_file`: read `dir/file` as libibverbs does (the trailing
/// newline dropped). urnic devices have no sysfs nodes of their own, so for
/// their paths this fails as a missing file does.
#[no_mangle]
pub unsafe extern "C" fn ibv_read_sysfs_file(dir: *const c_char, file: *const c_char, buf: *mut c_char, size: usize) -> c_int {
    if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    let path = format!("{}/{}", CStr::from_ptr(dir).to_string_lossy(), CStr::from_ptr(file).to_string_lossy());
    match std::fs::read(&path) {
        Ok(mut data) => {
            if data.last() == Some(&b'\n') {
                data.pop();
            }
            let n = data.len().min(size - 1);
            ptr::copy_nonoverlapping(data.as_ptr(), buf as *mut u8, n);
            *buf.add(n) = 0;
            n as c_int
        }
        Err(e) => {
            set_errno(e.raw_os_error().unwrap_or(libc::ENOENT));
            -1
        }
    }
}

static SYSFS: &[u8] = b"/sys\0";

#[no_mangle]
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    SYSFS.as_ptr() as *const c_char
}

/// `ibv_resolve_eth_l2_from_gid`: the peer's MAC for `attr`'s GID from the
/// kernel's neighbour table (no VLAN).
#[no_mangle]
pub unsafe extern "C" fn ibv_resolve_eth_l2_from_gid(ctx: *mut ibv_context, attr: *mut ibv_ah_attr, eth_mac: *mut u8, vid: *mut u16) -> c_int {
    guard("ibv_resolve_eth_l2_from_gid", -1, || {
        let (Some(u), false, false) = (uctx(ctx), attr.is_null(), eth_mac.is_null()) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        match u.ctx.resolve_mac(&(*attr).grh.dgid.raw) {
            Ok(mac) => {
                ptr::copy_nonoverlapping(mac.as_ptr(), eth_mac, 6);
                if !vid.is_null() {
                    *vid = 0xffff; // no VLAN
                }
                0
            }
            Err(e) => {
                set_errno(errno_of(&e));
                -1
            }
        }
    })
}
