//! Addresses: `sockaddr` conversions, which urnic interface owns an
//! address or routes to one, `rdma_getaddrinfo`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::raw::{c_char, c_int};
use std::ptr;

use super::fail;
use crate::cmffi::*;
use crate::ffi::*;
use crate::guard;

/// A C `sockaddr` (AF_INET / AF_INET6) as a Rust address.
pub(crate) unsafe fn sa_to_std(sa: *const sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    match c_int::from((*sa).sa_family) {
        libc::AF_INET => {
            let s = &*(sa as *const libc::sockaddr_in);
            Some(SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)), u16::from_be(s.sin_port))))
        }
        libc::AF_INET6 => {
            let s = &*(sa as *const libc::sockaddr_in6);
            Some(SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(s.sin6_addr.s6_addr), u16::from_be(s.sin6_port), s.sin6_flowinfo, s.sin6_scope_id)))
        }
        _ => None,
    }
}

/// Write `a` into the `sockaddr_storage`-sized area at `out`; its length.
pub(crate) unsafe fn std_to_sa(a: SocketAddr, out: *mut sockaddr) -> usize {
    match a {
        SocketAddr::V4(v4) => {
            let s = out as *mut libc::sockaddr_in;
            ptr::write_bytes(s, 0, 1);
            (*s).sin_family = libc::AF_INET as u16;
            (*s).sin_port = v4.port().to_be();
            (*s).sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let s = out as *mut libc::sockaddr_in6;
            ptr::write_bytes(s, 0, 1);
            (*s).sin6_family = libc::AF_INET6 as u16;
            (*s).sin6_port = v6.port().to_be();
            (*s).sin6_addr.s6_addr = v6.ip().octets();
            (*s).sin6_flowinfo = v6.flowinfo();
            (*s).sin6_scope_id = v6.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    }
}

/// The interfaces urnic offers as devices (as `ibv_get_device_list` lists
/// them) and their addresses.
pub(crate) fn eligible() -> Vec<urnic::DeviceInfo> {
    let Ok(list) = urnic::device_list() else { return vec![] };
    let wanted = |n: &str| match std::env::var("URNIC_DEVICES") {
        Ok(l) if !l.trim().is_empty() => l.split(',').map(str::trim).any(|w| w == n || w.strip_prefix("urnic-") == Some(n)),
        _ => true,
    };
    list.into_iter().filter(|d| d.link_up && (!d.ipv4.is_empty() || !d.ipv6.is_empty()) && wanted(&d.ifname)).collect()
}

fn has_ip(d: &urnic::DeviceInfo, ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => d.ipv4.contains(&v4),
        IpAddr::V6(v6) => d.ipv6.contains(&v6),
    }
}

/// The interface holding local address `ip` (ENODEV if none of urnic's).
pub(crate) fn ifname_of_local(ip: IpAddr) -> Result<String, c_int> {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    };
    eligible().into_iter().find(|d| has_ip(d, ip)).map(|d| d.ifname).ok_or(libc::EADDRNOTAVAIL)
}

/// Our address that the kernel's routing table picks to reach `dst` (a
/// connected UDP socket sends nothing) and its interface.
pub(crate) fn route_to(dst: IpAddr) -> Result<(IpAddr, String), c_int> {
    let bind: SocketAddr = match dst {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let s = std::net::UdpSocket::bind(bind).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
    s.connect((dst, 4791)).map_err(|e| e.raw_os_error().unwrap_or(libc::ENETUNREACH))?;
    let local = s.local_addr().map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?.ip();
    let ifname = ifname_of_local(local).map_err(|_| libc::ENODEV)?;
    Ok((local, ifname))
}

/// One address from `getaddrinfo` (numeric or a host name); the EAI code
/// on failure.
unsafe fn lookup(node: *const c_char, service: *const c_char, passive: bool, numeric: bool, family: c_int) -> Result<Vec<SocketAddr>, c_int> {
    let mut hints: libc::addrinfo = std::mem::zeroed();
    hints.ai_family = family;
    hints.ai_socktype = libc::SOCK_STREAM;
    hints.ai_flags = (if passive { libc::AI_PASSIVE } else { 0 }) | (if numeric { libc::AI_NUMERICHOST } else { 0 });
    let mut res: *mut libc::addrinfo = ptr::null_mut();
    let rc = libc::getaddrinfo(node, service, &hints, &mut res);
    if rc != 0 {
        return Err(rc);
    }
    let mut out = vec![];
    let mut p = res;
    while !p.is_null() {
        if let Some(a) = sa_to_std((*p).ai_addr as *const sockaddr) {
            if !out.contains(&a) {
                out.push(a);
            }
        }
        p = (*p).ai_next;
    }
    libc::freeaddrinfo(res);
    out.first().copied().map(|a| vec![a]).ok_or(libc::EAI_NONAME)
}

unsafe fn sa_box(a: SocketAddr) -> (*mut sockaddr, socklen_t) {
    let p = libc::calloc(1, std::mem::size_of::<libc::sockaddr_storage>()) as *mut sockaddr;
    let len = std::mem::size_of::<libc::sockaddr_storage>();
    let n = if p.is_null() { 0 } else { std_to_sa(a, p) };
    let _ = len;
    (p, n as socklen_t)
}

/// `rdma_getaddrinfo` (0, or getaddrinfo's EAI_* code as librdmacm
/// returns it): `node`/`service` (host names or numeric) as
/// librdmacm resolves them for RDMA_PS_TCP/UDP/IB: with RAI_PASSIVE the
/// result's source address (the wildcard if `node` is NULL), else the
/// destination plus the source address that routes to it.
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard("rdma_getaddrinfo", -1, || {
        if res.is_null() {
            return fail(libc::EINVAL);
        }
        let h = if hints.is_null() { rdma_addrinfo::default() } else { *hints };
        let passive = h.ai_flags as u32 & RAI_PASSIVE != 0;
        let numeric = h.ai_flags as u32 & RAI_NUMERICHOST != 0;
        let ps = if h.ai_port_space != 0 { h.ai_port_space } else { RDMA_PS_TCP as c_int };
        let qp_type = if h.ai_qp_type != 0 {
            h.ai_qp_type
        } else if ps == RDMA_PS_UDP as c_int {
            IBV_QPT_UD as c_int
        } else {
            IBV_QPT_RC as c_int
        };
        let family = if h.ai_family != 0 { h.ai_family } else { libc::AF_UNSPEC };
        // As librdmacm: getaddrinfo's EAI_* code is the answer (programs
        // print gai_strerror of it).
        let addr = match lookup(node, service, passive, numeric, family) {
            Ok(v) => v[0],
            Err(eai) => return eai,
        };
        let ai = libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()) as *mut rdma_addrinfo;
        if ai.is_null() {
            return fail(libc::ENOMEM);
        }
        let a = &mut *ai;
        a.ai_flags = h.ai_flags;
        a.ai_family = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
        a.ai_qp_type = qp_type;
        a.ai_port_space = ps;
        if passive {
            let (p, n) = sa_box(addr);
            a.ai_src_addr = p;
            a.ai_src_len = n;
        } else {
            let (p, n) = sa_box(addr);
            a.ai_dst_addr = p;
            a.ai_dst_len = n;
            // The source that routes there, if one of urnic's devices has it
            // (librdmacm asks the kernel the same; without, no source).
            let src =
                if !h.ai_src_addr.is_null() { sa_to_std(h.ai_src_addr) } else { route_to(addr.ip()).ok().map(|(ip, _)| SocketAddr::new(ip, 0)) };
            if let Some(s) = src {
                let (p, n) = sa_box(s);
                a.ai_src_addr = p;
                a.ai_src_len = n;
            }
        }
        *res = ai;
        0
    })
}

/// `rdma_freeaddrinfo`.
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    let mut p = res;
    while !p.is_null() {
        let next = (*p).ai_next;
        libc::free((*p).ai_src_addr.cast());
        libc::free((*p).ai_dst_addr.cast());
        libc::free((*p).ai_src_canonname.cast());
        libc::free((*p).ai_dst_canonname.cast());
        libc::free((*p).ai_route);
        libc::free((*p).ai_connect);
        libc::free(p.cast());
        p = next;
    }
}
