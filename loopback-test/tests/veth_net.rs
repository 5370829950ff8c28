//! What a device learns from and does on a real interface: neighbour
//! resolution through the kernel (ARP and ND triggered on demand), the GID
//! table and MTU from the interface and RC over IPv6 GIDs.

#[path = "../../verbs-api/tests/common.rs"]
mod common;
mod veth;

use std::net::IpAddr;
use std::time::Duration;

use common::*;
use urnic::*;
use urnic_datapath::neigh::Neighbours;
use urnic_datapath::netdev::Interface;
use urnic_datapath::netns::{in_netns, VethPair};

#[test]
fn neighbours_are_resolved_through_arp_and_nd() {
    veth::require_root();
    let pair = VethPair::create("nb", 1500).unwrap();
    let (v4, v6, peer_mac) = (IpAddr::from(pair.ipv4[1]), IpAddr::from(pair.ipv6[1]), pair.mac[1]);
    // The peer's link-local address (its GID 0): answered once DAD is done.
    let ll = IpAddr::from(link_local_gid(peer_mac));
    pair.wait_link_local(Duration::from_secs(60)).unwrap();
    let r = in_netns(Some(&pair.ns[0]), move || {
        let iface = Interface::query("u0").unwrap();
        let n = Neighbours::new(iface.index, Duration::from_secs(3)).unwrap();
        let before = n.lookup(v4).unwrap();
        let got4 = n.resolve(v4);
        let got6 = n.resolve(v6);
        let got_ll = n.resolve(ll);
        let table = n.dump().unwrap();
        // Nobody has this address: resolution gives up after the timeout.
        let short = Neighbours::new(iface.index, Duration::from_millis(300)).unwrap();
        let none = short.resolve(IpAddr::from([10, 99, 0, 99]));
        // The same link-local address is another host on another link: a
        // resolver for lo finds no entry for it.
        // (lo is interface 1 in every namespace.)
        let lo = Neighbours::new(1, Duration::from_millis(300)).unwrap();
        let other_link = (lo.lookup(ll).unwrap(), lo.dump().unwrap());
        (iface, before, got4, got6, got_ll, table, none, other_link)
    })
    .unwrap();
    let (iface, before, got4, got6, got_ll, table, none, other_link) = r;
    assert_eq!(iface.mac, pair.mac[0]);
    assert_eq!(iface.mtu, 1500);
    assert!(iface.ipv4.contains(&pair.ipv4[0].into()));
    assert!(iface.ipv6.contains(&pair.ipv6[0].into()));
    assert_eq!(before, None, "a fresh namespace has no neighbour entry");
    assert_eq!(got4, Some(peer_mac), "ARP");
    assert_eq!(got6, Some(peer_mac), "neighbour discovery");
    assert_eq!(got_ll, Some(peer_mac), "neighbour discovery for a link-local address, scoped to u0");
    assert!(table.iter().any(|e| e.ip == v4 && e.usable_mac() == Some(peer_mac)), "{table:?}");
    assert!(table.iter().any(|e| e.ip == ll && e.ifindex == iface.index && e.usable_mac() == Some(peer_mac)), "{table:?}");
    assert_eq!(none, None);
    assert_eq!(other_link, (None, Vec::new()), "u0's entries are not lo's");
}

#[test]
fn gid_table_mtu_and_rc_over_ipv6() {
    veth::require_root();
    let (pair, ca, cb) = veth::pair(Impairments::default(), 4200);
    // GID 0: link-local from the MAC; 1: IPv4-mapped; then the IPv6 addresses.
    assert_eq!(ca.query_gid(1, 0).unwrap(), link_local_gid(pair.mac[0]));
    let v4 = ca.query_gid(1, 1).unwrap();
    assert_eq!(&v4[12..], &pair.ipv4[0]);
    let idx6 = ca.gids().iter().position(|g| *g == pair.ipv6[0]).expect("fd75::1 in the GID table") as u8;
    let port = ca.query_port(1).unwrap();
    // 4200-byte frames span two 4 KiB UMEM frames (AF_XDP multi-buffer):
    // the port carries the interface MTU and the IB MTU follows (rxe's rule).
    assert_eq!(port.link_mtu, 4200);
    assert_eq!(port.active_mtu, Mtu::Mtu4096);
    assert_eq!(port.state, PortState::Active);

    let pcap = std::env::temp_dir().join(format!("urnic-ipv6-{}.pcap", std::process::id()));
    cb.nic().set_capture(Some(&pcap)).unwrap();
    let mut a = side(&ca, 1 << 20);
    let b = side(&cb, 1 << 20);
    let qa = rc_qp(&a, None);
    let qb = rc_qp(&b, None);
    let c = |remote: &Qp, gid: [u8; 16], l, r| Connect { sgid_index: idx6, ..Connect::new(remote.qp_num(), gid, l, r) };
    qa.connect(&c(&qb, pair.ipv6[1], 5, 9)).unwrap();
    qb.connect(&c(&qa, pair.ipv6[0], 9, 5)).unwrap();
    fill(&mut a.mr, 0, 300_000, 3);
    let remote = RemoteAddr { addr: b.mr.addr(), rkey: b.mr.rkey() };
    qa.post_send(&send_wr(1, SendOp::Write { remote }, vec![a.mr.sge(0, 300_000)])).unwrap();
    qa.post_send(&send_wr(2, SendOp::Read { remote }, vec![a.mr.sge(400_000, 300_000)])).unwrap();
    let done = wait(&a.cq, 2);
    assert!(done.iter().all(|c| c.status == WcStatus::Success), "{done:?}");
    assert_eq!(bytes(&b.mr, 0..300_000), &expected(300_000, 3)[..]);
    assert_eq!(bytes(&a.mr, 400_000..700_000), &expected(300_000, 3)[..]);
    // The two-chunk frames were built and joined where they lay
    // (datapath::reassembly) on both sides: a sent the WRITE and b received
    // it, b sent the READ responses and a received them.
    for (who, ctx) in [("a", &ca), ("b", &cb)] {
        let all = ctx.counters();
        let c = all.port;
        let get = |k: &str| c.iter().find(|(n, _)| n == k).map_or(0, |(_, v)| *v);
        assert!(get("xsk_rx_in_place") > 60, "{who}: {c:?}");
        // The port hands up frames, not descriptors: the poll loop counts
        // as many as the socket received.
        let polled = all.datapath.iter().find(|(n, _)| n == "rx_frames").map_or(0, |(_, v)| *v);
        assert_eq!(polled, get("xsk_rx_frames"), "{who}");
        assert!(get("xsk_tx_in_place") > 60, "{who}: {c:?}");
        assert_eq!(get("xsk_rx_multibuffer_dropped"), 0, "{who}");
    }
    // It went over IPv6: every RoCE frame b saw (captured) is IPv6, and the
    // XDP program redirected them.
    cb.nic().set_capture(None).unwrap();
    let frames = urnic_datapath::capture::read_frames(&pcap).unwrap();
    let _ = std::fs::remove_file(&pcap);
    for frame in &frames {
        assert_eq!(&frame[12..14], &[0x86, 0xdd], "an IPv4 frame in an IPv6 connection");
        assert!(rocev2::wire::parse_frame(frame).is_ok());
    }
    let v6 = frames.len();
    assert!(v6 > 70, "{v6} frames captured");
    let k = cb.counters();
    assert!(k.get("xdp_redirected").unwrap_or(0) >= 70, "{k}");
}
