//! Every frame of every reference capture (real rxe traffic) parses, its ICRC
//! verifies, and re-emitting it from its `Repr` gives identical bytes; the
//! hardware CNP vectors do too.

mod common;

use rocev2::wire::{parse_frame, parse_l3, sport, IpRepr, Opcode, WireError};

fn is_roce_udp(f: &[u8]) -> bool {
    // IPv4, UDP, dst 4791 (the reference captures have no VLAN tags)
    f.len() > 38 && f[12..14] == [0x08, 0x00] && f[23] == 17 && f[36..38] == 4791u16.to_be_bytes()
}

#[test]
fn every_captured_frame_roundtrips() {
    let dir = common::shared_dir().join("pcaps");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "pcap")).collect();
    files.sort();
    assert!(files.len() >= 8, "expected the 8 reference captures in {}", dir.display());
    let mut roce = 0;
    let mut other = 0;
    let mut opcodes = std::collections::BTreeSet::new();
    for path in &files {
        for rec in common::pcap::read(path).unwrap() {
            let f = &rec.data;
            if !is_roce_udp(f) {
                // ARP, TCP: refused with a typed error, never a panic.
                let e = parse_frame(f).unwrap_err();
                assert!(matches!(e, WireError::NotIp { .. } | WireError::NotUdp { .. } | WireError::NotRoce { .. }), "{}#{}: {e:?}", path.display(), rec.index);
                other += 1;
                continue;
            }
            let p = parse_frame(f).unwrap_or_else(|e| panic!("{}#{}: {e}", path.display(), rec.index));
            opcodes.insert(p.repr.transport.bth.opcode.0);
            let mut out = vec![0u8; f.len()];
            let n = p.repr.emit(p.payload, &mut out).unwrap();
            assert_eq!(&out[..n], &f[..], "{}#{} re-emits differently", path.display(), rec.index);
            roce += 1;
        }
    }
    assert_eq!(roce, 897, "PROTOCOL.md: 897 RoCE frames in the reference captures");
    assert!(other > 0);
    // SEND, WRITE, READ request/responses, ACK, atomics (ACK, CMP_SWAP, FETCH_ADD), UD SEND
    for op in [0x00, 0x02, 0x04, 0x06, 0x07, 0x08, 0x0a, 0x0c, 0x0d, 0x0e, 0x0f, 0x10, 0x11, 0x12, 0x13, 0x14, 0x64] {
        assert!(opcodes.contains(&op), "no {:?} in the captures", Opcode(op));
    }
}

#[test]
fn captured_source_ports_match_linux() {
    let dir = common::shared_dir().join("pcaps");
    let check = |name: &str, want: &dyn Fn(&rocev2::wire::ParsedFrame) -> u16| {
        let mut n = 0;
        for rec in common::pcap::read(&dir.join(name)).unwrap() {
            if !is_roce_udp(&rec.data) {
                continue;
            }
            let p = parse_frame(&rec.data).unwrap();
            assert_eq!(p.repr.udp.src_port, want(&p), "{name}#{}", rec.index);
            n += 1;
        }
        assert!(n > 0);
    };
    // RC: rc_pingpong has two runs, QPN 0x11<->0x11 and 0x12<->0x12 (both ends
    // got the same QPN), so the local QPN equals DestQP.
    check("rc_pingpong.pcap", &|p| {
        let q = p.repr.transport.bth.dest_qp;
        sport::rc_sport(q, q)
    });
    // UD: the sender's source QP hashes into the port.
    check("ud_pingpong.pcap", &|p| sport::ud_sport(p.repr.transport.deth.unwrap().src_qp));
}

#[test]
fn hardware_cnp_vectors() {
    let text = std::fs::read_to_string(common::shared_dir().join("vectors/cnp_vectors.txt")).unwrap();
    let mut seen = 0;
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let mut it = line.split_whitespace();
        let (name, kind, hex) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
        let bytes: Vec<u8> = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
        let icrc = u32::from_le_bytes(bytes[bytes.len() - 4..].try_into().unwrap());
        match kind {
            "ethernet" => {
                let p = parse_frame(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(p.repr.transport.bth.opcode, Opcode::CNP);
                assert!(p.repr.transport.bth.becn);
                assert_eq!(p.icrc, icrc);
                let mut out = vec![0u8; bytes.len()];
                p.repr.emit(p.payload, &mut out).unwrap();
                assert_eq!(out, bytes, "{name}: our emit differs");
            }
            "ipv4" => {
                let p = parse_l3(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(p.transport.bth.opcode, Opcode::CNP);
                assert_eq!(p.icrc, icrc);
                assert!(matches!(p.ip, IpRepr::V4(v) if v.dscp == 0x89 >> 2));
            }
            k => panic!("unknown vector kind {k}"),
        }
        seen += 1;
    }
    assert_eq!(seen, 2);
}
