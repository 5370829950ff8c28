//! One test per `WireError` variant: a frame that is wrong in exactly one way
//! is refused with the error naming that problem (earlier checks are kept
//! passing by fixing the IPv4 header checksum and the ICRC after each edit).

use rocev2::psn::Psn;
use rocev2::wire::*;

const ETH: usize = 14;
const UDP: usize = ETH + 20;
const BTH: usize = UDP + 8;

fn repr(op: Opcode) -> FrameRepr {
    let l = op.layout().expect("known opcode");
    FrameRepr {
        eth: EthernetRepr { dst: [2, 0, 0, 0, 0, 2], src: [2, 0, 0, 0, 0, 1], vlan: None, ethertype: 0x0800 },
        ip: IpRepr::V4(Ipv4Repr {
            src: [10, 0, 0, 1],
            dst: [10, 0, 0, 2],
            dscp: 0,
            ecn: 2,
            ident: 1,
            dont_frag: true,
            ttl: 64,
            protocol: 17,
            payload_len: 0,
        }),
        udp: UdpRepr { src_port: 49441, dst_port: ROCEV2_UDP_PORT, length: 0, checksum: 0 },
        transport: TransportRepr {
            bth: BthRepr { ack_req: true, ..BthRepr::new(op, 0x11, Psn::new(7)) },
            deth: l.deth.then_some(DethRepr { qkey: 0x1111_1111, resv8: 0, src_qp: 0x11 }),
            reth: l.reth.then_some(RethRepr { va: 0x1000, rkey: 0x42, dma_len: 8 }),
            atomic_eth: None,
            aeth: l.aeth.then_some(AethRepr { syndrome: AckSyndrome::Ack { credits: 31 }, msn: 1 }),
            atomic_ack: None,
            immediate: None,
            invalidate_rkey: None,
        },
    }
}

fn frame(op: Opcode, payload: &[u8]) -> Vec<u8> {
    let r = repr(op);
    let mut f = vec![0u8; r.frame_len(payload.len())];
    r.emit(payload, &mut f).unwrap();
    assert!(parse_frame(&f).is_ok());
    f
}

/// Re-seal an edited IPv4 frame: header checksum, then ICRC.
fn reseal(f: &mut [u8]) {
    Ipv4Packet::new_unchecked(&mut f[ETH..]).fill_checksum();
    icrc::fill_frame(f).unwrap();
}

fn ip(f: &mut [u8]) -> Ipv4Packet<&mut [u8]> {
    Ipv4Packet::new_unchecked(&mut f[ETH..])
}

fn udp(f: &mut [u8]) -> UdpPacket<&mut [u8]> {
    UdpPacket::new_unchecked(&mut f[UDP..])
}

fn bth(f: &mut [u8]) -> BthPacket<&mut [u8]> {
    BthPacket::new_unchecked(&mut f[BTH..])
}

/// Shorten the IP packet (and UDP datagram) to `udp_payload` bytes after the UDP header.
fn shrink(f: &mut Vec<u8>, udp_payload: usize) {
    f.truncate(BTH + udp_payload);
    ip(f).set_total_len((20 + 8 + udp_payload) as u16);
    udp(f).set_len((8 + udp_payload) as u16);
    Ipv4Packet::new_unchecked(&mut f[ETH..]).fill_checksum();
}

#[test]
fn truncated_names_the_header() {
    let good = frame(Opcode::RC_SEND_ONLY, b"abcd");
    assert_eq!(parse_frame(&good[..13]), Err(WireError::Truncated(Header::Ethernet)));
    let mut tagged = good[..17].to_vec();
    tagged[12..14].copy_from_slice(&[0x81, 0x00]);
    assert_eq!(parse_frame(&tagged), Err(WireError::Truncated(Header::Vlan)));
    assert_eq!(parse_frame(&good[..ETH + 19]), Err(WireError::Truncated(Header::Ipv4)));
    assert_eq!(parse_frame(&good[..ETH]), Err(WireError::Truncated(Header::Ipv4)));
    let mut v6 = good[..ETH + 39].to_vec();
    v6[12..14].copy_from_slice(&[0x86, 0xdd]);
    v6[ETH] = 0x60;
    assert_eq!(parse_frame(&v6), Err(WireError::Truncated(Header::Ipv6)));
    assert_eq!(parse_l3(&[]), Err(WireError::Truncated(Header::Ipv4)));

    // the IP packet ends inside the UDP header
    let mut f = good.clone();
    f.truncate(UDP + 4);
    ip(&mut f).set_total_len(24);
    reseal_ip_only(&mut f);
    assert_eq!(parse_frame(&f), Err(WireError::Truncated(Header::Udp)));

    // UDP payload shorter than a BTH
    let mut f = good.clone();
    shrink(&mut f, 11);
    assert_eq!(parse_frame(&f), Err(WireError::Truncated(Header::Bth)));
    // a BTH but no room for the ICRC
    let mut f = good.clone();
    shrink(&mut f, 15);
    assert_eq!(parse_frame(&f), Err(WireError::Truncated(Header::Icrc)));
    // WRITE ONLY needs a 16-byte RETH; only 8 bytes follow the BTH
    let mut f = frame(Opcode::RC_SEND_ONLY, &[1; 8]);
    bth(&mut f).set_opcode(Opcode::RC_WRITE_ONLY);
    bth(&mut f).set_pad_count(0);
    assert_eq!(parse_frame(&f), Err(WireError::Truncated(Header::ExtHeaders)));
    // CMP_SWAP's AtomicETH is 28 bytes
    let mut f = frame(Opcode::RC_READ_REQUEST, &[]);
    bth(&mut f).set_opcode(Opcode::RC_CMP_SWAP);
    assert_eq!(parse_frame(&f), Err(WireError::Truncated(Header::ExtHeaders)));
}

fn reseal_ip_only(f: &mut [u8]) {
    Ipv4Packet::new_unchecked(&mut f[ETH..]).fill_checksum();
}

#[test]
fn not_ip_and_version_mismatch() {
    let good = frame(Opcode::RC_SEND_ONLY, b"abcd");
    let mut f = good.clone();
    f[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    assert_eq!(parse_frame(&f), Err(WireError::NotIp { ethertype: 0x0806 }));
    f[12..14].copy_from_slice(&0x88a8u16.to_be_bytes()); // QinQ outer tag: not handled
    assert_eq!(parse_frame(&f), Err(WireError::NotIp { ethertype: 0x88a8 }));
    // EtherType says IPv6, the header is IPv4 (and the other way round)
    let mut f = good.clone();
    f[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
    assert_eq!(parse_frame(&f), Err(WireError::BadIpVersion(4)));
    let mut f = good.clone();
    f[ETH] = 0x65;
    assert_eq!(parse_frame(&f), Err(WireError::BadIpVersion(6)));
    assert_eq!(parse_l3(&[0x55; 64]), Err(WireError::BadIpVersion(5)));
}

#[test]
fn ipv4_header_errors() {
    let good = frame(Opcode::RC_SEND_ONLY, b"abcd");
    let mut f = good.clone();
    f[ETH] = 0x44;
    assert_eq!(parse_frame(&f), Err(WireError::BadIhl(4)));
    // total length beyond the frame, and shorter than the header
    let mut f = good.clone();
    let t = ip(&mut f).total_len();
    ip(&mut f).set_total_len(t + 1);
    reseal_ip_only(&mut f);
    assert_eq!(parse_frame(&f), Err(WireError::BadIpLength));
    ip(&mut f).set_total_len(19);
    reseal_ip_only(&mut f);
    assert_eq!(parse_frame(&f), Err(WireError::BadIpLength));
    // TTL changed without fixing the checksum
    let mut f = good.clone();
    ip(&mut f).set_ttl(63);
    assert_eq!(parse_frame(&f), Err(WireError::BadIpv4Checksum));
    // fragments: MF, or a non-zero offset
    let mut f = good.clone();
    ip(&mut f).set_flags_frag(false, true, 0);
    reseal(&mut f);
    assert_eq!(parse_frame(&f), Err(WireError::Fragmented));
    ip(&mut f).set_flags_frag(false, false, 3);
    reseal(&mut f);
    assert_eq!(parse_frame(&f), Err(WireError::Fragmented));
    // not UDP
    let mut f = good.clone();
    ip(&mut f).set_protocol(6);
    reseal_ip_only(&mut f);
    assert_eq!(parse_frame(&f), Err(WireError::NotUdp { protocol: 6 }));
}

#[test]
fn ipv4_options_are_accepted_and_covered_by_the_icrc() {
    // Insert 4 bytes of options (NOP NOP NOP EOL) after the fixed header.
    let good = frame(Opcode::RC_SEND_ONLY, b"abcd");
    let mut f = good[..UDP].to_vec();
    f.extend_from_slice(&[1, 1, 1, 0]);
    f.extend_from_slice(&good[UDP..]);
    f[ETH] = 0x46;
    let t = ip(&mut f).total_len();
    ip(&mut f).set_total_len(t + 4);
    reseal(&mut f);
    let p = parse_frame(&f).unwrap();
    assert_eq!(p.payload, b"abcd");
    assert_eq!(p.repr, parse_frame(&good).unwrap().repr);
    // the options are covered: changing one is an ICRC error
    f[UDP + 1] = 7;
    reseal_ip_only(&mut f);
    assert!(matches!(parse_frame(&f), Err(WireError::BadIcrc { .. })));
}

#[test]
fn udp_errors() {
    let good = frame(Opcode::RC_SEND_ONLY, b"abcd");
    let mut f = good.clone();
    let l = udp(&mut f).len();
    udp(&mut f).set_len(l - 4);
    assert_eq!(parse_frame(&f), Err(WireError::BadUdpLength));
    udp(&mut f).set_len(l + 1);
    assert_eq!(parse_frame(&f), Err(WireError::BadUdpLength));
    udp(&mut f).set_len(7);
    assert_eq!(parse_frame(&f), Err(WireError::BadUdpLength));
    let mut f = good.clone();
    udp(&mut f).set_dst_port(4792);
    assert_eq!(parse_frame(&f), Err(WireError::NotRoce { dst_port: 4792 }));
    // the UDP checksum is masked by the ICRC and not verified (RoCEv2 over IPv4 sends 0)
    let mut f = good.clone();
    udp(&mut f).set_checksum(0x1234);
    assert_eq!(parse_frame(&f).unwrap().repr.udp.checksum, 0x1234);
}

#[test]
fn transport_errors() {
    let good = frame(Opcode::RC_SEND_ONLY, b"abcd");
    for op in [0x15u8, 0x18, 0x1c, 0x2c, 0x40, 0x60, 0x66, 0x80, 0x82, 0xc0, 0xff] {
        let mut f = good.clone();
        bth(&mut f).set_opcode(Opcode(op));
        assert_eq!(parse_frame(&f), Err(WireError::UnknownOpcode(op)), "{op:#x}");
    }
    let mut f = good.clone();
    bth(&mut f).set_tver(1);
    assert_eq!(parse_frame(&f), Err(WireError::BadTver(1)));

    // pad count larger than the payload area
    let mut f = frame(Opcode::RC_SEND_ONLY, b"ab");
    assert_eq!(BthPacket::new_unchecked(&f[BTH..]).pad_count(), 2);
    let mut g = f.clone();
    shrink_keep_icrc(&mut g, 2);
    bth(&mut g).set_pad_count(3);
    assert_eq!(parse_frame(&g), Err(WireError::BadPad { pad: 3 }));
    // pad count that does not make payload + pad a multiple of 4 (IBTA 9.2):
    // 2 payload bytes + 2 pad bytes re-labelled as pad 1 (payload 3) or pad 3 (payload 1) is
    // fine, but dropping a byte of the payload area is not
    let mut h = f.clone();
    bth(&mut h).set_pad_count(1);
    reseal(&mut h);
    assert_eq!(parse_frame(&h).unwrap().payload.len(), 3);
    let mut h = f.clone();
    shrink_keep_icrc(&mut h, 1);
    assert_eq!(parse_frame(&h), Err(WireError::BadPad { pad: 2 }));
    // pad on an opcode without payload
    let mut a = frame(Opcode::RC_ACK, &[]);
    bth(&mut a).set_pad_count(1);
    assert_eq!(parse_frame(&a), Err(WireError::BadPad { pad: 1 }));
    // bytes after an ACK's AETH
    let mut a = frame(Opcode::RC_ACK, &[]);
    insert_before_icrc(&mut a, &[0u8; 4]);
    assert_eq!(parse_frame(&a), Err(WireError::UnexpectedPayload));
    // a READ request carries no payload either
    let mut r = frame(Opcode::RC_READ_REQUEST, &[]);
    insert_before_icrc(&mut r, &[9u8; 8]);
    assert_eq!(parse_frame(&r), Err(WireError::UnexpectedPayload));

    // the ICRC: expected is what the bytes compute to, found what is stored
    bth(&mut f).set_psn(Psn::new(8));
    let stored = u32::from_le_bytes(f[f.len() - 4..].try_into().unwrap());
    let expected = icrc::of_frame(&f).unwrap();
    assert_ne!(expected, stored);
    assert_eq!(parse_frame(&f), Err(WireError::BadIcrc { expected, found: stored }));
}

/// Remove the payload area but keep pad count and a valid ICRC.
fn shrink_keep_icrc(f: &mut Vec<u8>, drop: usize) {
    let at = f.len() - 4 - drop;
    f.drain(at..at + drop);
    add_len(f, -(drop as i32));
    reseal(f);
}

/// Insert `bytes` just before the ICRC, fixing the lengths and the ICRC.
fn insert_before_icrc(f: &mut Vec<u8>, bytes: &[u8]) {
    let at = f.len() - 4;
    f.splice(at..at, bytes.iter().copied());
    add_len(f, bytes.len() as i32);
    reseal(f);
}

/// Change the IPv4 total length and the UDP length by `d`.
fn add_len(f: &mut [u8], d: i32) {
    let mut p = ip(f);
    let t = i32::from(p.total_len());
    p.set_total_len((t + d) as u16);
    let mut u = udp(f);
    let l = i32::from(u.len());
    u.set_len((l + d) as u16);
}

#[test]
fn variant_fields_are_masked_by_the_icrc() {
    // IBTA A17.3.3: TOS, TTL, IPv4 checksum, UDP checksum and BTH byte 4 are
    // not covered, so rewriting them (ECN marking, TTL decrement) keeps the ICRC.
    let mut f = frame(Opcode::RC_SEND_ONLY, b"abcd");
    ip(&mut f).set_ecn(3);
    ip(&mut f).set_dscp(46);
    ip(&mut f).set_ttl(1);
    reseal_ip_only(&mut f);
    udp(&mut f).set_checksum(0xabcd);
    bth(&mut f).set_fecn(true);
    bth(&mut f).set_becn(true);
    bth(&mut f).set_resv6(0x3f);
    assert!(parse_frame(&f).is_ok());
    // ... but every other header bit is covered
    for (off, bit) in [(ETH + 4, 1u8), (ETH + 12, 0x80), (UDP, 1), (BTH + 2, 1), (BTH + 8, 0x01), (BTH + 11, 1)] {
        let mut g = f.clone();
        g[off] ^= bit;
        reseal_ip_only(&mut g);
        assert!(matches!(parse_frame(&g), Err(WireError::BadIcrc { .. })), "byte {off}");
    }
}

#[test]
fn ethernet_padding_is_ignored() {
    let mut f = frame(Opcode::RC_ACK, &[]);
    let n = f.len();
    f.extend_from_slice(&[0; 8]);
    let p = parse_frame(&f).unwrap();
    let mut out = vec![0u8; n];
    assert_eq!(p.repr.emit(p.payload, &mut out), Ok(n));
    assert_eq!(out, &f[..n]);
}

#[test]
fn emit_errors() {
    let r = repr(Opcode::RC_SEND_ONLY);
    let n = r.frame_len(5);
    assert_eq!(r.emit(b"hello", &mut vec![0u8; n - 1]), Err(WireError::BufferTooSmall));
    assert_eq!(r.emit(b"hello", &mut vec![0u8; n]), Ok(n));
    let mut big = vec![0u8; 70_000];
    // 65_536 payload bytes cannot be described by any length field
    assert_eq!(r.emit_with(65_536, &mut big, |_| {}), Err(WireError::FieldOverflow));
    // the UDP (and IPv4 total) length would overflow 16 bits
    assert_eq!(r.emit_with(65_500, &mut big, |_| {}), Err(WireError::FieldOverflow));
    // absurd lengths are refused, not overflowed
    assert_eq!(r.emit_with(usize::MAX, &mut big, |_| unreachable!()), Err(WireError::FieldOverflow));
    assert_eq!(r.frame_len(usize::MAX), usize::MAX);
    assert_eq!(repr(Opcode::RC_ACK).emit(b"x", &mut big), Err(WireError::UnexpectedPayload));
    let mut unknown = r;
    unknown.transport.bth.opcode = Opcode(0x15);
    assert_eq!(unknown.emit(&[], &mut big), Err(WireError::UnknownOpcode(0x15)));
    assert_eq!(unknown.frame_len(0), 0);
}

#[test]
fn every_error_displays_what_is_wrong() {
    let all = [
        WireError::Truncated(Header::Icrc),
        WireError::BufferTooSmall,
        WireError::NotIp { ethertype: 0x0806 },
        WireError::BadIpVersion(5),
        WireError::BadIhl(4),
        WireError::BadIpLength,
        WireError::BadIpv4Checksum,
        WireError::Fragmented,
        WireError::NotUdp { protocol: 6 },
        WireError::BadUdpLength,
        WireError::NotRoce { dst_port: 53 },
        WireError::UnknownOpcode(0x15),
        WireError::BadTver(1),
        WireError::BadPad { pad: 3 },
        WireError::UnexpectedPayload,
        WireError::BadIcrc { expected: 1, found: 2 },
        WireError::FieldOverflow,
    ];
    let mut seen = std::collections::HashSet::new();
    for e in all {
        let s = e.to_string();
        assert!(seen.insert(s.clone()), "{s}");
    }
    assert!(WireError::Truncated(Header::Icrc).to_string().contains("Icrc"));
    assert!(WireError::NotIp { ethertype: 0x0806 }.to_string().contains("0x0806"));
    assert!(WireError::BadIcrc { expected: 0xabc, found: 0xdef }.to_string().contains("0x00000abc"));
}
