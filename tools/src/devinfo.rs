//! `urnic devinfo`: what `ibv_devinfo` shows, for the interfaces of this
//! network namespace a urnic device can be opened on (without opening one).

use anyhow::{bail, Context as _};
use urnic::{device_list, link_local_gid, Mtu};

use crate::dev::DEVICE_PREFIX;
use crate::out::outln;

/// EUI-64 node GUID from a MAC, formatted like ibv_devinfo (`xxxx:xxxx:xxxx:xxxx`).
fn guid(mac: [u8; 6]) -> String {
    let g = [mac[0] ^ 2, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]];
    g.chunks(2).map(|c| format!("{:02x}{:02x}", c[0], c[1])).collect::<Vec<_>>().join(":")
}

/// What an AF_XDP port carries on an interface of `mtu`: all of it with
/// multi-buffer (frames chained over up to four 4 KiB UMEM frames).
fn port_mtu(mtu: u32) -> u32 {
    mtu.min(4 * (4096 - 256) - 18)
}

/// Print the device list (all, or `only`: a device name as printed,
/// `urnic-<ifname>`, or the interface's name).
pub fn run(only: Option<&str>, verbose: bool) -> anyhow::Result<()> {
    let list = device_list().context("listing interfaces")?;
    let list: Vec<_> = match only {
        Some(n) => {
            let ifname = crate::dev::interface_of(n)?;
            list.into_iter().filter(|d| d.ifname == ifname).collect()
        }
        None => list,
    };
    if list.is_empty() {
        bail!("No IB devices found (no Ethernet interface here)");
    }
    for d in list {
        let mtu = port_mtu(d.mtu);
        let active = Mtu::for_netdev_mtu(mtu).map(|m| m.bytes()).unwrap_or(0);
        outln!("hca_id:\t{DEVICE_PREFIX}{}", d.ifname)?;
        outln!("\ttransport:\t\t\tInfiniBand (0)")?;
        outln!("\tfw_ver:\t\t\t\t{}", env!("CARGO_PKG_VERSION"))?;
        outln!("\tnode_guid:\t\t\t{}", guid(d.mac))?;
        outln!("\tsys_image_guid:\t\t\t{}", guid(d.mac))?;
        outln!("\tvendor_id:\t\t\t0x0000")?;
        outln!("\tvendor_part_id:\t\t\t0")?;
        outln!("\thw_ver:\t\t\t\t0x0")?;
        outln!("\tphys_port_cnt:\t\t\t1")?;
        outln!("\t\tport:\t1")?;
        outln!("\t\t\tstate:\t\t\t{}", if d.link_up { "PORT_ACTIVE (4)" } else { "PORT_DOWN (1)" })?;
        outln!("\t\t\tmax_mtu:\t\t4096 (5)")?;
        outln!("\t\t\tactive_mtu:\t\t{active} ({})", Mtu::from_bytes(active).map(|m| m as u8).unwrap_or(0))?;
        outln!("\t\t\tsm_lid:\t\t\t0")?;
        outln!("\t\t\tport_lid:\t\t0")?;
        outln!("\t\t\tport_lmc:\t\t0x00")?;
        outln!("\t\t\tlink_layer:\t\tEthernet")?;
        if verbose {
            let ll = link_local_gid(d.mac);
            let mut gids = vec![ll];
            gids.extend(d.ipv4.first().map(|a| a.to_ipv6_mapped().octets()));
            gids.extend(d.ipv6.iter().map(|a| a.octets()).filter(|g| *g != ll));
            for (i, g) in gids.iter().enumerate() {
                let hex: Vec<String> = g.chunks(2).map(|c| format!("{:02x}{:02x}", c[0], c[1])).collect();
                outln!("\t\t\tGID[{i:3}]:\t\t{}, RoCE v2", hex.join(":"))?;
            }
            outln!("\t\t\tnetdev:\t\t\t{} (mtu {}, AF_XDP carries {mtu})", d.ifname, d.mtu)?;
        }
        outln!()?;
    }
    Ok(())
}
