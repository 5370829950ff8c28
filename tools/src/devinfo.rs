//! `urnic devinfo`: what `ibv_devinfo` shows, for the interfaces of this
//! network namespace a urnic device can be opened on (without opening one).

use anyhow::{bail, Context as _};
use urnic::{device_list, link_local_gid, Mtu};

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

/// Print the device list (all, or `only`).
pub fn run(only: Option<&str>, verbose: bool) -> anyhow::Result<()> {
    let list = device_list().context("listing interfaces")?;
    let list: Vec<_> = list.into_iter().filter(|d| only.is_none_or(|n| d.ifname == n)).collect();
    if list.is_empty() {
        match only {
            Some(n) => bail!("IB device '{n}' wasn't found (no Ethernet interface of that name here)"),
            None => bail!("No IB devices found (no Ethernet interface here)"),
        }
    }
    for d in list {
        let mtu = port_mtu(d.mtu);
        let active = Mtu::for_netdev_mtu(mtu).map(|m| m.bytes()).unwrap_or(0);
        println!("hca_id:\turnic-{}", d.ifname);
        println!("\ttransport:\t\t\tInfiniBand (0)");
        println!("\tfw_ver:\t\t\t\t{}", env!("CARGO_PKG_VERSION"));
        println!("\tnode_guid:\t\t\t{}", guid(d.mac));
        println!("\tsys_image_guid:\t\t\t{}", guid(d.mac));
        println!("\tvendor_id:\t\t\t0x0000");
        println!("\tvendor_part_id:\t\t\t0");
        println!("\thw_ver:\t\t\t\t0x0");
        println!("\tphys_port_cnt:\t\t\t1");
        println!("\t\tport:\t1");
        println!("\t\t\tstate:\t\t\t{}", if d.link_up { "PORT_ACTIVE (4)" } else { "PORT_DOWN (1)" });
        println!("\t\t\tmax_mtu:\t\t4096 (5)");
        println!("\t\t\tactive_mtu:\t\t{active} ({})", Mtu::from_bytes(active).map(|m| m as u8).unwrap_or(0));
        println!("\t\t\tsm_lid:\t\t\t0");
        println!("\t\t\tport_lid:\t\t0");
        println!("\t\t\tport_lmc:\t\t0x00");
        println!("\t\t\tlink_layer:\t\tEthernet");
        if verbose {
            let ll = link_local_gid(d.mac);
            let mut gids = vec![ll];
            gids.extend(d.ipv4.first().map(|a| a.to_ipv6_mapped().octets()));
            gids.extend(d.ipv6.iter().map(|a| a.octets()).filter(|g| *g != ll));
            for (i, g) in gids.iter().enumerate() {
                let hex: Vec<String> = g.chunks(2).map(|c| format!("{:02x}{:02x}", c[0], c[1])).collect();
                println!("\t\t\tGID[{i:3}]:\t\t{}, RoCE v2", hex.join(":"));
            }
            println!("\t\t\tnetdev:\t\t\t{} (mtu {}, AF_XDP carries {mtu})", d.ifname, d.mtu);
        }
        println!();
    }
    Ok(())
}
