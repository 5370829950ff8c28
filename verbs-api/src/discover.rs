//! `ibv_get_device_list` for urnic: the Ethernet interfaces of this network
//! namespace a urnic device can attach to, with the facts a device needs
//! (MAC, MTU, link state, IP addresses → GIDs).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

use crate::error::{Error, ErrorKind, Result};

/// A network interface a urnic device can be opened on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Interface name (`eth0`, `veth1`, ...).
    pub ifname: String,
    /// Interface index.
    pub ifindex: u32,
    /// MAC address.
    pub mac: [u8; 6],
    /// Link MTU.
    pub mtu: u32,
    /// Carrier up.
    pub link_up: bool,
    /// IPv4 addresses.
    pub ipv4: Vec<Ipv4Addr>,
    /// IPv6 addresses.
    pub ipv6: Vec<Ipv6Addr>,
}

fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// List the Ethernet interfaces (ARPHRD_ETHER, loopback excluded) of the
/// current network namespace, with their addresses.
pub fn device_list() -> Result<Vec<DeviceInfo>> {
    let mut out = Vec::new();
    let dir = std::fs::read_dir("/sys/class/net").map_err(|e| Error::new(ErrorKind::Io, format!("/sys/class/net: {e}")))?;
    for entry in dir.flatten() {
        let path = entry.path();
        let ifname = entry.file_name().to_string_lossy().into_owned();
        // type 1 = ARPHRD_ETHER
        if read_trim(&path.join("type")).as_deref() != Some("1") {
            continue;
        }
        let Some(mac) = read_trim(&path.join("address")).and_then(|m| parse_mac(&m)) else { continue };
        let mtu = read_trim(&path.join("mtu")).and_then(|m| m.parse().ok()).unwrap_or(1500);
        let ifindex = read_trim(&path.join("ifindex")).and_then(|m| m.parse().ok()).unwrap_or(0);
        let link_up = read_trim(&path.join("operstate")).is_some_and(|s| s == "up" || s == "unknown");
        out.push(DeviceInfo { ifname, ifindex, mac, mtu, link_up, ipv4: Vec::new(), ipv6: Vec::new() });
    }
    add_addresses(&mut out)?;
    out.sort_by(|a, b| a.ifname.cmp(&b.ifname));
    Ok(out)
}

/// Attach each address of the namespace to its device (the walk over
/// getifaddrs is the datapath's, shared with `Interface::query`).
fn add_addresses(devs: &mut [DeviceInfo]) -> Result<()> {
    for (name, addr) in urnic_datapath::netdev::addresses()? {
        let Some(dev) = devs.iter_mut().find(|d| d.ifname == name) else { continue };
        match addr {
            IpAddr::V4(v4) => dev.ipv4.push(v4),
            IpAddr::V6(v6) => dev.ipv6.push(v6),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_parsing() {
        assert_eq!(parse_mac("52:54:00:63:00:01"), Some([0x52, 0x54, 0, 0x63, 0, 1]));
        assert_eq!(parse_mac("52:54:00:63:00"), None);
        assert_eq!(parse_mac("52:54:00:63:00:01:02"), None);
        assert_eq!(parse_mac("zz:54:00:63:00:01"), None);
    }

    #[test]
    fn lists_this_namespaces_interfaces_with_their_sysfs_facts() {
        let list = device_list().unwrap();
        for d in &list {
            let sys = Path::new("/sys/class/net").join(&d.ifname);
            assert_eq!(read_trim(&sys.join("mtu")).unwrap().parse::<u32>().unwrap(), d.mtu);
            assert_eq!(parse_mac(&read_trim(&sys.join("address")).unwrap()).unwrap(), d.mac);
            assert_ne!(d.ifname, "lo");
            // The same addresses, in the same order, as the datapath finds
            // for the interface when a device opens on it.
            let iface = urnic_datapath::netdev::Interface::query(&d.ifname).unwrap();
            assert_eq!((&d.ipv4, &d.ipv6, d.ifindex), (&iface.ipv4, &iface.ipv6, iface.index), "{}", d.ifname);
        }
    }
}
