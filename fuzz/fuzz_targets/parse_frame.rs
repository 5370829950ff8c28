//! Fuzz the frame parser: any bytes parse or fail with a typed error (never
//! a panic), every entry point agrees on what is valid, and a frame that
//! parses re-emits to a frame that parses to the same headers and payload
//! and, when nothing was dropped on the way (IPv4 options, the reserved IPv4
//! flag, Ethernet padding, a CNP's reserved bytes, pad bytes), to the same
//! bytes.
//!
//! Each input is checked twice: as given, and "sealed" (IPv4 header checksum
//! and ICRC recomputed), so that mutations get past those two checks and
//! reach the layout checks and the round trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rocev2::wire::{icrc, parse_frame, parse_l3, CnpPacket, EthernetFrame, FrameView, IpRepr, Ipv4Packet, Opcode};

fuzz_target!(|data: &[u8]| {
    check(data);
    let mut sealed = data.to_vec();
    seal(&mut sealed);
    check(&sealed);
});

/// Recompute the IPv4 header checksum and the ICRC where the frame is
/// well-formed enough to locate them.
fn seal(f: &mut [u8]) {
    if let Ok(mut eth) = EthernetFrame::new_checked(&mut *f) {
        if eth.ethertype() == 0x0800 {
            Ipv4Packet::new_unchecked(eth.payload_mut()).fill_checksum();
        }
    }
    let _ = icrc::fill_frame(f);
}

fn check(data: &[u8]) {
    let _ = parse_l3(data);
    let _ = icrc::of_l3(data);
    let _ = icrc::of_frame(data);
    let view = FrameView::new_checked(data);
    let p = match parse_frame(data) {
        Ok(p) => p,
        Err(e) => {
            assert_eq!(view.err(), Some(e), "FrameView and parse_frame disagree");
            return;
        }
    };
    let v = view.expect("FrameView accepts what parse_frame accepts");
    assert_eq!(v.payload(), p.payload);
    assert_eq!(v.icrc(), p.icrc);
    let eth = p.repr.eth.header_len();
    assert_eq!(icrc::of_frame(data), Ok(p.icrc));
    assert_eq!(parse_l3(&data[eth..]).map(|l| (l.ip, l.udp, l.transport, l.payload)), Ok((p.repr.ip, p.repr.udp, p.repr.transport, p.payload)));

    let n = p.repr.frame_len(p.payload.len());
    let mut out = vec![0u8; n];
    assert_eq!(p.repr.emit(p.payload, &mut out), Ok(n), "a parsed frame re-emits");
    let q = parse_frame(&out).expect("a re-emitted frame parses");
    assert_eq!(q.repr, p.repr);
    assert_eq!(q.payload, p.payload);

    let (ip_len, plain_ip) = match p.repr.ip {
        // IHL 5 and the reserved flag clear: emit writes exactly these
        IpRepr::V4(_) => (20, data[eth] & 0x0f == 5 && data[eth + 6] & 0x80 == 0),
        IpRepr::V6(_) => (40, true),
    };
    // A CNP's 16 reserved bytes are ignored on receipt and emitted as zeros.
    let cnp_reserved_zero = p.repr.transport.bth.opcode != Opcode::CNP || {
        let at = eth + ip_len + 8 + 12;
        CnpPacket::new_unchecked(&data[at..]).reserved() == [0; 16]
    };
    // Pad bytes likewise (IBTA 9.2: their content carries nothing).
    let pad_at = p.payload.as_ptr() as usize - data.as_ptr() as usize + p.payload.len();
    let pad = usize::from(p.repr.transport.bth.pad_count);
    let pad_zero = data[pad_at..pad_at + pad].iter().all(|&b| b == 0);
    if plain_ip && cnp_reserved_zero && pad_zero && data.len() == n {
        let (mut a, mut b) = (data.to_vec(), out);
        if let IpRepr::V4(_) = p.repr.ip {
            // 0x0000 and 0xffff both verify as a checksum (one's complement zero)
            a[eth + 10..eth + 12].fill(0);
            b[eth + 10..eth + 12].fill(0);
        }
        assert_eq!(a, b, "re-emission changed bytes");
    }
}
