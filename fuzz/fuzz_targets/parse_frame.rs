//! Fuzz the frame parser: any bytes parse or fail with a typed error; a frame
//! that parses re-emits to bytes that parse to the same headers and payload.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rocev2::wire::{parse_frame, parse_l3};

fuzz_target!(|data: &[u8]| {
    let _ = parse_l3(data);
    if let Ok(p) = parse_frame(data) {
        let mut out = vec![0u8; p.repr.frame_len(p.payload.len())];
        let n = p.repr.emit(p.payload, &mut out).expect("a parsed frame re-emits");
        let q = parse_frame(&out[..n]).expect("a re-emitted frame parses");
        // pad count and lengths are recomputed on emit; everything else is kept
        let mut want = p.repr;
        want.transport.bth.pad_count = q.repr.transport.bth.pad_count;
        want.udp.length = q.repr.udp.length;
        if let (rocev2::wire::IpRepr::V4(a), rocev2::wire::IpRepr::V4(b)) = (&mut want.ip, &q.repr.ip) {
            a.payload_len = b.payload_len;
        }
        if let (rocev2::wire::IpRepr::V6(a), rocev2::wire::IpRepr::V6(b)) = (&mut want.ip, &q.repr.ip) {
            a.payload_len = b.payload_len;
        }
        assert_eq!(q.repr, want);
        assert_eq!(q.payload, p.payload);
    }
});
