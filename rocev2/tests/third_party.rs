//! Frames built by urnic are read by two independent RoCEv2 parsers, scapy
//! (`scapy.contrib.roce`, which also recomputes the ICRC) and tshark, with
//! the same field values. The readers must be installed (deploy/deps.sh);
//! a missing reader fails the test loudly.

mod common;

use std::process::Command;

use rocev2::psn::Psn;
use rocev2::wire::*;

fn frames() -> Vec<(FrameRepr, Vec<u8>)> {
    let mut out = Vec::new();
    let mut k = 0u32;
    for byte in 0..=255u8 {
        let op = Opcode(byte);
        let Some(layout) = op.layout() else { continue };
        for v6 in [false, true] {
            k += 1;
            let payload: Vec<u8> = if layout.payload { (0..(k as usize * 37) % 300).map(|i| i as u8).collect() } else { Vec::new() };
            let ip = if v6 {
                let mut s = [0u8; 16];
                s[0] = 0xfd;
                s[15] = 1;
                let mut d = s;
                d[15] = 2;
                IpRepr::V6(Ipv6Repr { src: s, dst: d, traffic_class: 2, flow_label: k, next_header: 17, hop_limit: 64, payload_len: 0 })
            } else {
                IpRepr::V4(Ipv4Repr {
                    src: [10, 0, 0, 1],
                    dst: [10, 0, 0, 2],
                    dscp: 26,
                    ecn: 2,
                    ident: k as u16,
                    dont_frag: true,
                    ttl: 64,
                    protocol: 17,
                    payload_len: 0,
                })
            };
            let repr = FrameRepr {
                eth: EthernetRepr { dst: [2, 0, 0, 0, 0, 2], src: [2, 0, 0, 0, 0, 1], vlan: None, ethertype: if v6 { 0x86dd } else { 0x0800 } },
                ip,
                udp: UdpRepr { src_port: sport::rc_sport(k, 0x11), dst_port: ROCEV2_UDP_PORT, length: 0, checksum: 0 },
                transport: TransportRepr {
                    bth: BthRepr {
                        solicited: k.is_multiple_of(3),
                        becn: op == Opcode::CNP,
                        ack_req: k.is_multiple_of(2),
                        ..BthRepr::new(op, 0x100 + k, Psn::new(0xff_fff0 + k))
                    },
                    deth: layout.deth.then_some(DethRepr { qkey: 0x1111_1111, resv8: 0, src_qp: 0x20 + k }),
                    reth: layout.reth.then_some(RethRepr { va: 0x7f00_0000_1000 + u64::from(k), rkey: 0xabc0 + k, dma_len: 4096 + k }),
                    atomic_eth: layout.atomic_eth.then_some(AtomicEthRepr { va: 0x1000, rkey: 0x55, swap_add: 7, compare: 9 }),
                    aeth: layout.aeth.then_some(AethRepr { syndrome: AckSyndrome::Ack { credits: 31 }, msn: k }),
                    atomic_ack: layout.atomic_ack_eth.then_some(42),
                    immediate: layout.immdt.then_some(0xdead_beef),
                    invalidate_rkey: layout.ieth.then_some(0x1234),
                },
            };
            out.push((repr, payload));
        }
    }
    out
}

fn run(reader: &str, pcap: &std::path::Path) -> Vec<serde_like::Obj> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/third_party_check.py");
    let out = Command::new("python3").arg(&script).arg(reader).arg(pcap).output().expect("python3 must be installed (deploy/deps.sh)");
    assert_ne!(out.status.code(), Some(2), "{reader} is not installed — run deploy/deps.sh: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{reader} rejected frames:\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
    text.lines().map(serde_like::parse).collect()
}

/// A tiny reader of the flat JSON objects the script prints (ints, null, bools).
mod serde_like {
    use std::collections::HashMap;
    pub type Obj = HashMap<String, Option<i64>>;
    pub fn parse(line: &str) -> Obj {
        let body = line.trim().trim_start_matches('{').trim_end_matches('}');
        body.split(", ")
            .map(|kv| {
                let (k, v) = kv.split_once(": ").expect("key: value");
                let v = match v {
                    "null" => None,
                    "true" => Some(1),
                    "false" => Some(0),
                    n => Some(n.parse::<i64>().unwrap_or_else(|_| panic!("not an int: {n}"))),
                };
                (k.trim_matches('"').to_string(), v)
            })
            .collect()
    }
}

#[test]
fn scapy_and_tshark_read_what_we_send() {
    let frames = frames();
    let bytes: Vec<Vec<u8>> = frames
        .iter()
        .map(|(r, p)| {
            let mut b = vec![0u8; r.frame_len(p.len())];
            r.emit(p, &mut b).unwrap();
            b
        })
        .collect();
    let dir = std::env::temp_dir().join(format!("urnic-third-party-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("urnic_frames.pcap");
    common::pcap::write(&pcap, &bytes).unwrap();

    let scapy = run("scapy", &pcap);
    let tshark = run("tshark", &pcap);
    assert_eq!(scapy.len(), frames.len());
    assert_eq!(tshark.len(), frames.len());
    for (i, ((repr, _), (s, t))) in frames.iter().zip(scapy.iter().zip(&tshark)).enumerate() {
        let bth = &repr.transport.bth;
        let want = |k: &str| -> Option<i64> {
            Some(match k {
                "opcode" => i64::from(bth.opcode.0),
                "dest_qp" => i64::from(bth.dest_qp),
                "psn" => i64::from(bth.psn.value()),
                "ack_req" => i64::from(bth.ack_req),
                "pkey" => i64::from(bth.pkey),
                _ => unreachable!(),
            })
        };
        for k in ["opcode", "dest_qp", "psn", "ack_req", "pkey"] {
            assert_eq!(s[k], want(k), "scapy {k} of frame {i} ({:?})", bth.opcode);
            assert_eq!(t[k], want(k), "tshark {k} of frame {i} ({:?})", bth.opcode);
        }
        let pad = (4 - frames[i].1.len() % 4) % 4;
        assert_eq!(s["pad"], Some(pad as i64), "scapy pad of frame {i}");
        assert_eq!(s["icrc_stored"], s["icrc_computed"], "scapy ICRC of frame {i} ({:?})", bth.opcode);
        if let Some(reth) = repr.transport.reth {
            assert_eq!(t["reth_va"], Some(reth.va as i64));
            assert_eq!(t["reth_rkey"], Some(i64::from(reth.rkey)));
            assert_eq!(t["reth_len"], Some(i64::from(reth.dma_len)));
        }
        if let Some(deth) = repr.transport.deth {
            assert_eq!(t["deth_qkey"], Some(i64::from(deth.qkey)));
            assert_eq!(t["deth_src_qp"], Some(i64::from(deth.src_qp)));
        }
        if let Some(aeth) = repr.transport.aeth {
            assert_eq!(t["aeth_msn"], Some(i64::from(aeth.msn)), "tshark MSN of frame {i}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
