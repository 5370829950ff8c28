//! Every frame of every reference capture (real rxe traffic): RoCE frames
//! parse, their ICRC verifies (through `parse_frame` and independently through
//! `icrc::of_frame`), and re-emitting them from their `Repr` gives identical
//! bytes; ARP and TCP frames are refused with the right typed error. The
//! hardware CNP vectors parse and re-emit too, and the captured UDP source
//! ports are the ones our `sport` functions compute.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use rocev2::wire::{icrc, parse_frame, parse_l3, peek_dest_qpn, peek_opcode, sport, IpRepr, Opcode, ParsedFrame, Service, WireError};

fn captures() -> Vec<PathBuf> {
    let dir = common::shared_dir().join("pcaps");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pcap"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 8, "expected the 8 reference captures in {}", dir.display());
    files
}

#[derive(Default, Debug)]
struct Counts {
    roce: usize,
    arp: usize,
    tcp: usize,
}

#[test]
fn every_captured_frame_roundtrips() {
    let mut total = Counts::default();
    let mut opcodes = BTreeSet::new();
    let mut per_file = BTreeMap::new();
    for path in captures() {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let mut c = Counts::default();
        for rec in common::pcap::read(&path).unwrap() {
            let f = &rec.data;
            let at = format!("{name}#{}", rec.index);
            match parse_frame(f) {
                Ok(p) => {
                    // independent ICRC check: recompute from the bytes, compare with the stored value
                    let stored = u32::from_le_bytes(f[f.len() - 4..].try_into().unwrap());
                    assert_eq!(icrc::of_frame(f), Ok(stored), "{at}");
                    assert_eq!(p.icrc, stored, "{at}");
                    opcodes.insert(p.repr.transport.bth.opcode.0);
                    // the shard steering peek agrees with the full parse
                    assert_eq!(peek_dest_qpn(f), Some(p.repr.transport.bth.dest_qp), "{at}");
                    assert_eq!(peek_opcode(f), Some(p.repr.transport.bth.opcode), "{at}");
                    // re-emit, copying the payload in ...
                    let mut out = vec![0u8; f.len()];
                    let n = p.repr.emit(p.payload, &mut out).unwrap();
                    assert_eq!(&out[..n], &f[..], "{at} re-emits differently");
                    // ... and gathering it in place, as the transport does
                    let mut out2 = vec![0xa5u8; f.len() + 16];
                    let n2 = p.repr.emit_with(p.payload.len(), &mut out2, |dst| dst.copy_from_slice(p.payload)).unwrap();
                    assert_eq!(&out2[..n2], &f[..], "{at} emit_with differs");
                    assert_eq!(p.repr.frame_len(p.payload.len()), f.len(), "{at}");
                    c.roce += 1;
                }
                Err(WireError::NotIp { ethertype: 0x0806 }) => c.arp += 1,
                Err(WireError::NotUdp { protocol: 6 }) => c.tcp += 1,
                Err(e) => panic!("{at}: unexpected {e} ({e:?})"),
            }
        }
        total.roce += c.roce;
        total.arp += c.arp;
        total.tcp += c.tcp;
        per_file.insert(name, c);
    }
    eprintln!("{per_file:#?}");
    // The reference captures hold 897 RoCE frames (counted with tshark when they were made).
    assert_eq!(total.roce, 897, "{per_file:?}");
    assert_eq!(total.arp, 16, "every capture starts with ARP: {per_file:?}");
    assert_eq!(total.tcp, 402, "the tools' TCP exchanges: {per_file:?}");
    assert!(per_file.values().all(|c| c.roce > 0 && c.arp > 0));
    // SEND, WRITE, READ request/responses, ACK, atomics (ACK, CMP_SWAP, FETCH_ADD), UD SEND
    for op in [0x00, 0x01, 0x02, 0x04, 0x06, 0x07, 0x08, 0x0a, 0x0c, 0x0d, 0x0e, 0x0f, 0x10, 0x11, 0x12, 0x13, 0x14, 0x64] {
        assert!(opcodes.contains(&op), "no {:?} in the captures", Opcode(op));
    }
}

/// Each RoCE frame of a capture, parsed.
fn roce_frames(name: &str, mut each: impl FnMut(usize, &ParsedFrame)) -> usize {
    let mut n = 0;
    for rec in common::pcap::read(&common::shared_dir().join("pcaps").join(name)).unwrap() {
        if let Ok(p) = parse_frame(&rec.data) {
            each(rec.index, &p);
            n += 1;
        }
    }
    n
}

#[test]
fn captured_source_ports_match_linux() {
    // RC (rdma_get_udp_sport with no flow label: rdma_calc_flow_label of the
    // two QPNs). In every capture but rping both ends' QPs got the same
    // number (0x11, 0x12, 0x13: fresh guests), so DestQP is both QPNs.
    let mut rc = 0;
    let mut seen = BTreeSet::new();
    for name in ["atomic_bw.pcap", "rc_pingpong.pcap", "rc_pingpong_mtu4096.pcap", "read_bw.pcap", "send_lat.pcap", "write_bw.pcap"] {
        rc += roce_frames(name, |i, p| {
            let q = p.repr.transport.bth.dest_qp;
            assert_eq!(p.repr.transport.bth.opcode.service(), Service::Rc, "{name}#{i}");
            assert_eq!(p.repr.udp.src_port, sport::rc_sport(q, q), "{name}#{i}");
            seen.insert(p.repr.udp.src_port);
        });
    }
    assert!(rc > 800);
    // rxe-peer README: QPN 0x11<->0x11 gives 49441; 0x12 and 0x13 give these.
    assert_eq!(seen, BTreeSet::from([49441, 49476, 49513]));

    // UD: 0xC000 + hash_32(source QPN, 14); QPN 0x11 → 57236.
    let n = roce_frames("ud_pingpong.pcap", |i, p| {
        let src_qp = p.repr.transport.deth.expect("UD has a DETH").src_qp;
        assert_eq!(src_qp, 0x11);
        assert_eq!(p.repr.udp.src_port, sport::ud_sport(src_qp), "ud_pingpong#{i}");
        assert_eq!(p.repr.udp.src_port, 57236);
    });
    assert_eq!(n, 6);
}

/// rping: CM MADs from QP1 use 0xC000 + hash_32(1, 14) = 55410; the RC
/// connection takes its flow label from the CM REQ (RDMA-CM sets it, rxe
/// calls rdma_get_udp_sport with it), so its port is
/// `flow_label_to_sport(REQ primary flow label)`, not the QPN-derived one.
#[test]
fn rping_ports_come_from_qp1_and_the_cm_flow_label() {
    let mut req_flow_label = None;
    let mut mads = 0;
    let mut rc_ports = BTreeSet::new();
    roce_frames("rping.pcap", |i, p| {
        let t = &p.repr.transport;
        if t.bth.opcode == Opcode::UD_SEND_ONLY {
            let deth = t.deth.unwrap();
            assert_eq!((deth.src_qp, deth.qkey, t.bth.dest_qp), (1, 0x8001_0000, 1), "rping#{i}");
            assert_eq!(p.repr.udp.src_port, sport::ud_sport(1), "rping#{i}");
            assert_eq!(p.repr.udp.src_port, 55410);
            // MAD header: base version, class 0x07 (CM), class version, method; attribute ID at 16.
            let mad = p.payload;
            assert_eq!(mad[1], 0x07, "rping#{i}: a CM MAD");
            if u16::from_be_bytes([mad[16], mad[17]]) == 0x0010 {
                // ConnectRequest (IBTA 12.6.5): the Primary Flow Label is the
                // top 20 bits of the word at message offset 88 (MAD data starts at 24).
                let w = u32::from_be_bytes(mad[24 + 88..24 + 92].try_into().unwrap());
                req_flow_label = Some(w >> 12);
            }
            mads += 1;
        } else {
            rc_ports.insert(p.repr.udp.src_port);
        }
    });
    assert_eq!(mads, 5, "REQ, REP, RTU, DREQ, DREP");
    let fl = req_flow_label.expect("a CM REQ in rping.pcap");
    assert_eq!(rc_ports, BTreeSet::from([sport::flow_label_to_sport(fl)]));
    assert_ne!(sport::flow_label_to_sport(fl), sport::rc_sport(0x11, 0x11));
}

#[test]
fn hardware_cnp_vectors() {
    let text = std::fs::read_to_string(common::shared_dir().join("vectors/cnp_vectors.txt")).unwrap();
    let mut seen = 0;
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let mut it = line.split_whitespace();
        let (name, kind, hex) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
        let bytes: Vec<u8> = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
        let stored = u32::from_le_bytes(bytes[bytes.len() - 4..].try_into().unwrap());
        let l3 = match kind {
            "ethernet" => {
                let p = parse_frame(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(icrc::of_frame(&bytes), Ok(stored), "{name}");
                assert!(p.payload.is_empty());
                let mut out = vec![0u8; bytes.len()];
                assert_eq!(p.repr.emit(&[], &mut out), Ok(bytes.len()));
                assert_eq!(out, bytes, "{name}: our emit differs");
                assert_eq!((p.repr.udp.src_port, p.repr.transport.bth.dest_qp), (0, 0x118), "{name}");
                parse_l3(&bytes[14..]).unwrap()
            }
            "ipv4" => {
                let p = parse_l3(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(p.icrc, 0xEF1B_FCDA, "{name}: the CRC value the vector file gives");
                assert!(matches!(p.ip, IpRepr::V4(v) if v.dscp == 0x89 >> 2 && v.ecn == 1 && v.ttl == 0x20));
                assert_eq!((p.udp.src_port, p.transport.bth.dest_qp), (56238, 0xd2), "{name}");
                // our emit of the same headers behind an Ethernet header reproduces the L3 bytes
                let repr = rocev2::wire::FrameRepr {
                    eth: rocev2::wire::EthernetRepr { dst: [0; 6], src: [0; 6], vlan: None, ethertype: 0x0800 },
                    ip: p.ip,
                    udp: p.udp,
                    transport: p.transport,
                };
                let mut out = vec![0u8; 14 + bytes.len()];
                assert_eq!(repr.emit(&[], &mut out), Ok(out.len()));
                assert_eq!(&out[14..], &bytes[..], "{name}: our emit differs");
                p
            }
            k => panic!("unknown vector kind {k}"),
        };
        assert_eq!(icrc::of_l3(if kind == "ethernet" { &bytes[14..] } else { &bytes }), Ok(stored), "{name}");
        assert_eq!(l3.icrc, stored);
        let t = l3.transport;
        assert_eq!(t.bth.opcode, Opcode::CNP, "{name}");
        assert!(t.bth.becn && !t.bth.fecn, "{name}");
        assert_eq!((t.bth.pkey, t.bth.psn.value()), (0xffff, 0), "{name}");
        seen += 1;
    }
    assert_eq!(seen, 2);
}

/// The pcap reader handles both byte orders (the captures are little-endian).
#[test]
fn pcap_reader_reads_both_byte_orders() {
    let frames = vec![vec![1u8, 2, 3], vec![], vec![9u8; 70]];
    let path = std::env::temp_dir().join(format!("urnic-pcap-{}.pcap", std::process::id()));
    common::pcap::write(&path, &frames).unwrap();
    let le = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    // swap every 32-bit header field (and the two 16-bit version fields) to big-endian
    let mut be = le.clone();
    let swap32 = |b: &mut Vec<u8>, o: usize| b[o..o + 4].reverse();
    swap32(&mut be, 0);
    be[4..6].reverse();
    be[6..8].reverse();
    for o in (8..24).step_by(4) {
        swap32(&mut be, o);
    }
    let mut off = 24;
    for f in &frames {
        for k in 0..4 {
            swap32(&mut be, off + 4 * k);
        }
        off += 16 + f.len();
    }
    for image in [&le, &be] {
        let recs = common::pcap::parse(image).unwrap();
        assert_eq!(recs.iter().map(|r| r.data.clone()).collect::<Vec<_>>(), frames);
        assert_eq!(recs[2].ts_nanos, 2_000_000_000);
    }
    assert!(common::pcap::parse(&le[..le.len() - 1]).is_err(), "a truncated record is an error");
    assert!(common::pcap::parse(&[0u8; 24]).is_err(), "bad magic");
}

#[test]
fn qpn_peek_never_panics_on_cut_or_foreign_frames() {
    for path in captures() {
        for rec in common::pcap::read(&path).unwrap() {
            for cut in 0..rec.data.len().min(80) {
                let _ = peek_dest_qpn(&rec.data[..cut]);
                let _ = peek_opcode(&rec.data[..cut]);
            }
        }
    }
    // ARP and IPv4 ICMP: no QPN.
    let mut arp = vec![0u8; 42];
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    assert_eq!(peek_dest_qpn(&arp), None);
    let mut icmp = vec![0u8; 60];
    icmp[12..14].copy_from_slice(&[0x08, 0x00]);
    icmp[14] = 0x45;
    icmp[23] = 1;
    assert_eq!(peek_dest_qpn(&icmp), None);
    assert_eq!(peek_opcode(&icmp), None);
}
