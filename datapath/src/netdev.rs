//! Facts about a network interface, read with ioctl and getifaddrs in the
//! calling thread's network namespace (sysfs would show the namespace `/sys`
//! was mounted in, which after `setns(2)` is not ours).

use std::ffi::{CStr, CString};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// An Ethernet interface and its addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    /// Name (`veth0`).
    pub name: String,
    /// Interface index.
    pub index: u32,
    /// MAC address.
    pub mac: [u8; 6],
    /// Link MTU (bytes of IP packet).
    pub mtu: u32,
    /// IPv4 addresses.
    pub ipv4: Vec<Ipv4Addr>,
    /// IPv6 addresses (link-local included).
    pub ipv6: Vec<Ipv6Addr>,
}

/// A datagram socket for interface ioctls.
fn ioctl_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the fd is owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn ifreq_for(name: &str) -> io::Result<libc::ifreq> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("bad interface name {name:?}")));
    }
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    Ok(req)
}

fn ioctl(sock: &OwnedFd, name: &str, request: libc::Ioctl, req: &mut libc::ifreq) -> io::Result<()> {
    // SAFETY: `req` is a valid ifreq for the SIOCGIF* requests used here.
    if unsafe { libc::ioctl(sock.as_raw_fd(), request, req as *mut libc::ifreq) } != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("interface {name}: {e}")));
    }
    Ok(())
}

/// Whether `name` is up with carrier (IFF_UP and IFF_RUNNING).
pub fn link_up(name: &str) -> io::Result<bool> {
    let sock = ioctl_socket()?;
    let mut req = ifreq_for(name)?;
    ioctl(&sock, name, libc::SIOCGIFFLAGS, &mut req)?;
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
    let flags = i32::from(unsafe { req.ifr_ifru.ifru_flags });
    Ok(flags & libc::IFF_UP != 0 && flags & libc::IFF_RUNNING != 0)
}

impl Interface {
    /// Look up `name` in the calling thread's network namespace.
    pub fn query(name: &str) -> io::Result<Interface> {
        let sock = ioctl_socket()?;
        let cname = CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in interface name"))?;
        // SAFETY: cname is NUL-terminated.
        let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if index == 0 {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("no interface named {name} in this network namespace")));
        }
        let mut req = ifreq_for(name)?;
        ioctl(&sock, name, libc::SIOCGIFHWADDR, &mut req)?;
        // SAFETY: SIOCGIFHWADDR filled the hwaddr member.
        let hw = unsafe { req.ifr_ifru.ifru_hwaddr };
        if hw.sa_family != libc::ARPHRD_ETHER {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("interface {name} is not Ethernet (ARPHRD {})", hw.sa_family)));
        }
        let mut mac = [0u8; 6];
        for (m, b) in mac.iter_mut().zip(hw.sa_data.iter()) {
            *m = *b as u8;
        }
        let mut req = ifreq_for(name)?;
        ioctl(&sock, name, libc::SIOCGIFMTU, &mut req)?;
        // SAFETY: SIOCGIFMTU filled the mtu member.
        let mtu = unsafe { req.ifr_ifru.ifru_mtu } as u32;
        let mut iface = Interface { name: name.to_string(), index, mac, mtu, ipv4: Vec::new(), ipv6: Vec::new() };
        iface.read_addresses()?;
        Ok(iface)
    }

    fn read_addresses(&mut self) -> io::Result<()> {
        for (name, addr) in addresses()? {
            if name != self.name {
                continue;
            }
            match addr {
                IpAddr::V4(v4) => self.ipv4.push(v4),
                IpAddr::V6(v6) => self.ipv6.push(v6),
            }
        }
        Ok(())
    }
}

/// Every IPv4 and IPv6 address of the calling thread's network namespace
/// with the name of its interface, in getifaddrs(3) order (link-local IPv6
/// addresses included).
pub fn addresses() -> io::Result<Vec<(String, IpAddr)>> {
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into `ifap`; freed below.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = ifap;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_addr is non-null; the family says which sockaddr it is.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let addr = if family == libc::AF_INET {
            // SAFETY: AF_INET addresses are sockaddr_in.
            let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
            IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
        } else if family == libc::AF_INET6 {
            // SAFETY: AF_INET6 addresses are sockaddr_in6.
            let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
            IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
        } else {
            continue;
        };
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
        out.push((name, addr));
    }
    // SAFETY: frees the list getifaddrs allocated; no node is used after this.
    unsafe { libc::freeifaddrs(ifap) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_not_ethernet_and_missing_names_are_errors() {
        assert!(Interface::query("lo").is_err());
        let e = Interface::query("urnic-none0").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(Interface::query("").is_err());
        assert!(Interface::query("a-name-far-too-long-for-linux").is_err());
    }

    #[test]
    fn addresses_name_interfaces_of_this_namespace() {
        for (name, addr) in addresses().unwrap() {
            let cname = CString::new(name.as_str()).unwrap();
            // SAFETY: cname is NUL-terminated.
            assert_ne!(unsafe { libc::if_nametoindex(cname.as_ptr()) }, 0, "{name} ({addr}) is no interface");
            if name == "lo" {
                assert!(addr.is_loopback(), "{addr} on lo");
            }
        }
    }
}
