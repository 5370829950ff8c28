//! Property tests of the wire layer: parse(emit(x)) == x for random valid
//! frames of every known opcode; random and mutated bytes never panic.

use proptest::prelude::*;
use rocev2::psn::Psn;
use rocev2::wire::*;

fn opcode() -> impl Strategy<Value = Opcode> {
    (0u8..=255).prop_map(Opcode).prop_filter("known", |o| o.is_known())
}

fn transport(op: Opcode) -> impl Strategy<Value = TransportRepr> {
    let l = op.layout().unwrap();
    (
        (any::<bool>(), any::<bool>(), any::<u16>(), any::<bool>(), any::<bool>(), 0u8..64, 0u32..1 << 24, any::<bool>(), 0u8..128, 0u32..1 << 24),
        (any::<u32>(), any::<u8>(), 0u32..1 << 24),
        (any::<u64>(), any::<u32>(), any::<u32>()),
        (any::<u64>(), any::<u32>(), any::<u64>(), any::<u64>()),
        (any::<u8>(), 0u32..1 << 24, any::<u64>(), any::<u32>(), any::<u32>()),
    )
        .prop_map(move |(b, d, r, a, m)| TransportRepr {
            bth: BthRepr {
                opcode: op,
                solicited: b.0,
                mig_req: b.1,
                pad_count: 0,
                tver: 0,
                pkey: b.2,
                fecn: b.3,
                becn: b.4,
                resv6: b.5,
                dest_qp: b.6,
                ack_req: b.7,
                resv7: b.8,
                psn: Psn::new(b.9),
            },
            deth: l.deth.then_some(DethRepr { qkey: d.0, resv8: d.1, src_qp: d.2 }),
            reth: l.reth.then_some(RethRepr { va: r.0, rkey: r.1, dma_len: r.2 }),
            atomic_eth: l.atomic_eth.then_some(AtomicEthRepr { va: a.0, rkey: a.1, swap_add: a.2, compare: a.3 }),
            aeth: l.aeth.then_some(AethRepr { syndrome: rocev2::wire::AckSyndrome::from_byte(m.0), msn: m.1 }),
            atomic_ack: l.atomic_ack_eth.then_some(m.2),
            immediate: l.immdt.then_some(m.3),
            invalidate_rkey: l.ieth.then_some(m.4),
        })
}

fn frame() -> impl Strategy<Value = (FrameRepr, Vec<u8>)> {
    (
        opcode(),
        any::<bool>(),
        proptest::option::of((0u8..8, any::<bool>(), 0u16..4096)),
        any::<[u8; 12]>(),
        any::<[u8; 32]>(),
        (0u8..64, 0u8..4, any::<u16>(), any::<bool>(), any::<u8>(), 0u32..1 << 20),
        any::<u16>(),
        any::<u16>(),
    )
        .prop_flat_map(|(op, v6, vlan, macs, ips, misc, sport, csum)| {
            let payload =
                if op.layout().unwrap().payload { proptest::collection::vec(any::<u8>(), 0..=4096).boxed() } else { Just(Vec::new()).boxed() };
            (transport(op), payload).prop_map(move |(t, p)| {
                let mut t = t;
                t.bth.pad_count = ((4 - p.len() % 4) % 4) as u8;
                let ulen = (8 + 12 + op.layout().unwrap().ext_len() + p.len() + t.bth.pad_count as usize + 4) as u16;
                let (ethertype, ip) = if v6 {
                    let mut s = [0u8; 16];
                    let mut d = [0u8; 16];
                    s.copy_from_slice(&ips[..16]);
                    d.copy_from_slice(&ips[16..]);
                    (
                        0x86dd,
                        IpRepr::V6(Ipv6Repr {
                            src: s,
                            dst: d,
                            traffic_class: misc.0 << 2 | misc.1,
                            flow_label: misc.5,
                            next_header: 17,
                            hop_limit: misc.4,
                            payload_len: ulen,
                        }),
                    )
                } else {
                    (
                        0x0800,
                        IpRepr::V4(Ipv4Repr {
                            src: [ips[0], ips[1], ips[2], ips[3]],
                            dst: [ips[4], ips[5], ips[6], ips[7]],
                            dscp: misc.0,
                            ecn: misc.1,
                            ident: misc.2,
                            dont_frag: misc.3,
                            ttl: misc.4,
                            protocol: 17,
                            payload_len: ulen,
                        }),
                    )
                };
                let mut dst = [0u8; 6];
                let mut src = [0u8; 6];
                dst.copy_from_slice(&macs[..6]);
                src.copy_from_slice(&macs[6..]);
                let vlan = vlan.map(|(pcp, dei, vid)| VlanTag { pcp, dei, vid });
                let f = FrameRepr {
                    eth: EthernetRepr { dst, src, vlan, ethertype },
                    ip,
                    udp: UdpRepr { src_port: sport, dst_port: ROCEV2_UDP_PORT, length: ulen, checksum: if v6 { csum } else { 0 } },
                    transport: t,
                };
                (f, p)
            })
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn parse_of_emit_is_identity((repr, payload) in frame()) {
        let mut buf = vec![0u8; 9000];
        let n = repr.emit(&payload, &mut buf).unwrap();
        prop_assert_eq!(n, repr.frame_len(payload.len()));
        let p = parse_frame(&buf[..n]).unwrap();
        prop_assert_eq!(p.repr, repr);
        prop_assert_eq!(p.payload, &payload[..]);
    }

    #[test]
    fn emitted_frames_agree_across_entry_points((repr, payload) in frame()) {
        let mut buf = vec![0u8; 9000];
        let n = repr.emit(&payload, &mut buf).unwrap();
        let f = &buf[..n];
        let stored = u32::from_le_bytes(f[n - 4..].try_into().unwrap());
        prop_assert_eq!(icrc::of_frame(f), Ok(stored));
        let eth = repr.eth.header_len();
        prop_assert_eq!(icrc::of_l3(&f[eth..]), Ok(stored));
        let l3 = parse_l3(&f[eth..]).unwrap();
        prop_assert_eq!((l3.ip, l3.udp, l3.transport, l3.payload), (repr.ip, repr.udp, repr.transport, &payload[..]));
        let v = FrameView::new_checked(f).unwrap();
        prop_assert_eq!((v.opcode(), v.dest_qp(), v.psn(), v.payload(), v.icrc()), (repr.transport.bth.opcode, repr.transport.bth.dest_qp, repr.transport.bth.psn, &payload[..], stored));
        // emit_with gathers the same bytes into a dirty buffer
        let mut dirty = vec![0x5au8; n];
        prop_assert_eq!(repr.emit_with(payload.len(), &mut dirty, |d| d.copy_from_slice(&payload)), Ok(n));
        prop_assert_eq!(&dirty[..], f);
        // ... and so does emit_with_crc copying and continuing the ICRC in one pass
        let mut fused = vec![0xa5u8; n];
        prop_assert_eq!(repr.emit_with_crc(payload.len(), &mut fused, |d, crc| rocev2::wire::crc::copy_update(crc, &payload, d)), Ok(n));
        prop_assert_eq!(&fused[..], f);
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = parse_frame(&bytes);
        let _ = parse_l3(&bytes);
        let _ = icrc::of_frame(&bytes);
        let _ = icrc::of_l3(&bytes);
        let _ = FrameView::new_checked(&bytes[..]);
    }

    #[test]
    fn views_never_panic(mut bytes in proptest::collection::vec(any::<u8>(), 0..80), cut in 0usize..80) {
        let b = &bytes[..cut.min(bytes.len())];
        let e = EthernetFrame::new_unchecked(b);
        let _ = (e.check_len(), e.dst_addr(), e.src_addr(), e.vlan(), e.ethertype(), e.header_len(), e.payload());
        let p = Ipv4Packet::new_unchecked(b);
        let _ = (p.check_len(), p.header_len(), p.total_len(), p.verify_checksum(), p.options(), p.payload(), p.src_addr());
        let p = Ipv6Packet::new_unchecked(b);
        let _ = (p.check_len(), p.flow_label(), p.payload(), p.dst_addr());
        let u = UdpPacket::new_unchecked(b);
        let _ = (u.check_len(), u.len(), u.payload());
        let t = BthPacket::new_unchecked(b);
        let _ = (t.check_len(), t.opcode(), t.dest_qp(), t.psn(), t.payload());
        let _ = (AethPacket::new_unchecked(b).syndrome(), AtomicEthPacket::new_unchecked(b).compare(), DethPacket::new_unchecked(b).src_qp());
        let _ = (RethPacket::new_unchecked(b).dma_len(), AtomicAckEthPacket::new_unchecked(b).orig_remote_data(), ImmDtPacket::new_unchecked(b).immediate());
        let _ = (IethPacket::new_unchecked(b).rkey(), CnpPacket::new_unchecked(b).reserved());
        let n = cut.min(bytes.len());
        let m = &mut bytes[..n];
        let mut p = Ipv4Packet::new_unchecked(&mut *m);
        p.set_total_len(60_000);
        p.fill_checksum();
        let _ = p.payload_mut();
        let mut e = EthernetFrame::new_unchecked(&mut *m);
        e.set_vlan(VlanTag { pcp: 1, dei: false, vid: 2 });
        e.set_ethertype(0x0800);
        let _ = e.payload_mut();
        let mut t = BthPacket::new_unchecked(&mut *m);
        t.set_psn(Psn::new(1));
        let _ = t.payload_mut();
        let _ = icrc::fill_frame(m);
        let _ = icrc::fill_l3(m);
    }

    #[test]
    fn mutated_frames_never_panic((repr, payload) in frame(), flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8), cut in any::<usize>()) {
        let mut buf = vec![0u8; 9000];
        let n = repr.emit(&payload, &mut buf).unwrap();
        let mut f = buf[..n].to_vec();
        for (i, x) in flips {
            let i = i % f.len();
            f[i] ^= x;
        }
        let _ = parse_frame(&f[..cut % (f.len() + 1)]);
        // what still parses re-emits to a frame that parses to the same headers
        if let Ok(p) = parse_frame(&f) {
            let mut out = vec![0u8; p.repr.frame_len(p.payload.len())];
            let n = p.repr.emit(p.payload, &mut out).unwrap();
            let q = parse_frame(&out[..n]).unwrap();
            prop_assert_eq!(q.repr, p.repr);
            prop_assert_eq!(q.payload, p.payload);
        }
    }
}
