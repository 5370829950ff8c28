//! Inputs the `parse_frame` fuzz target (fuzz/) found, kept as regression tests.

use rocev2::wire::{icrc, parse_frame, AckSyndrome, CnpPacket, Ipv4Packet, Opcode};

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// fuzz crash-6120524e: the ConnectX-4 Lx CNP with bytes set in its 16
/// reserved bytes and its PSN (and the ICRC resealed). A17.9.3 reserved
/// bytes are ignored on receipt, so it parses to the same repr as the CNP
/// without them; emit writes zeros there, so the re-emitted frame is that CNP
/// byte for byte, not the input.
#[test]
fn cnp_with_nonzero_reserved_bytes() {
    let original = hex("e41d2dab2bc27cfe90643b32080045c2003c718c4000401191610a0011010a001201000012b7002800008100ffff40000118000000000000000000000000000000000000000082fd002a");
    let mut f = hex("e41d2dab2bc27cfe90643b32080045c2003c718c4000401191610a0011010a001201000012b7002800008100ffff40000118000001000000000000080000000000000000000082fd002a");
    // as found, the stale ICRC is refused
    assert!(matches!(parse_frame(&f), Err(rocev2::wire::WireError::BadIcrc { .. })));
    icrc::fill_frame(&mut f).unwrap();
    let p = parse_frame(&f).unwrap();
    assert_eq!(p.repr.transport.bth.opcode, Opcode::CNP);
    assert_ne!(CnpPacket::new_unchecked(&f[54..]).reserved(), [0; 16]);
    // the input also has PSN 0x000100; otherwise it is the original CNP
    let mut want = original.clone();
    want[52] = 0x01;
    icrc::fill_frame(&mut want).unwrap();
    assert_eq!(p.repr, parse_frame(&want).unwrap().repr);
    assert_eq!(p.repr.transport.bth.psn.value(), 0x100);
    let mut out = vec![0u8; f.len()];
    p.repr.emit(p.payload, &mut out).unwrap();
    assert_eq!(out, want);
}

/// fuzz crash-b78e2e37: a READ RESPONSE ONLY (read_bw.pcap) whose AETH
/// syndrome byte had bit 7 set (0xa4). It decoded as RNR NAK timer 4 and
/// re-emitted as 0x24; bit 7 is reserved, so the syndrome is now
/// `Reserved(0xa4)` and the frame re-emits byte for byte.
#[test]
fn aeth_syndrome_with_reserved_bit_7_roundtrips() {
    let mut f = hex("5254006300015254006300020800450000949fd24000401185be0a6300020a630001dc4312b7008000001000ffff0000d1553bfb5e08a48c1484b012a63221bbdb7194163ec53380de59c82dceeb43a0407e9b9f873f2b9bc4dcad6a0ecf25ea40b9007e7e33fe5c8cc78a5bb2cdfbf34c9692d3d6bd6e9a991b04a8ea29922ae392a961c6a7be526e48ad2115a814613fa6341563a2affdbeb3a5a8dc37d3bf71ef");
    Ipv4Packet::new_unchecked(&mut f[14..]).fill_checksum();
    icrc::fill_frame(&mut f).unwrap();
    let p = parse_frame(&f).unwrap();
    assert_eq!(p.repr.transport.bth.opcode, Opcode::RC_READ_RESPONSE_ONLY);
    assert_eq!(p.repr.transport.aeth.unwrap().syndrome, AckSyndrome::Reserved(0xa4));
    let mut out = vec![0u8; f.len()];
    p.repr.emit(p.payload, &mut out).unwrap();
    assert_eq!(out, f);
}

/// fuzz crash-a0545e6a: a UC WRITE LAST with immediate, pad count 1, whose
/// pad byte is not zero. Pad bytes carry nothing (IBTA 9.2) and are not
/// checked on receipt; emit writes zeros. The frame parses, and re-emits to
/// the same repr and payload with a zero pad byte.
#[test]
fn nonzero_pad_bytes_are_ignored() {
    let mut f = hex("5254006300015254006300020800450000949fd24000401185be0a6300020a630001dc4312b70080000029109fd24000401185be0a0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000303a20414748494a4b4c4d4e4f505152535455565758595a5b5c5d5f5e606162636465666768696a6b6c6d6e6f707172737475767778797a4142ef");
    Ipv4Packet::new_unchecked(&mut f[14..]).fill_checksum();
    icrc::fill_frame(&mut f).unwrap();
    let p = parse_frame(&f).unwrap();
    assert_eq!((p.repr.transport.bth.opcode, p.repr.transport.bth.pad_count), (Opcode::UC_WRITE_LAST_IMM, 1));
    let pad_at = f.len() - 4 - 1;
    assert_ne!(f[pad_at], 0);
    assert_eq!(*p.payload.last().unwrap(), f[pad_at - 1]);
    let mut out = vec![0u8; f.len()];
    p.repr.emit(p.payload, &mut out).unwrap();
    assert_eq!(out[pad_at], 0);
    assert_eq!(&out[..pad_at], &f[..pad_at]);
    let q = parse_frame(&out).unwrap();
    assert_eq!((q.repr, q.payload), (p.repr, p.payload));
}
