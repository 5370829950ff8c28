//! Wire-layer benchmarks: ICRC throughput against a byte-at-a-time table
//! CRC-32 (the baseline, measured in the same run), and parse+verify per frame.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rocev2::psn::Psn;
use rocev2::wire::{icrc, parse_frame, *};

/// The classic byte-at-a-time reflected CRC-32 (what a naive ICRC does).
struct TableCrc([u32; 256]);

impl TableCrc {
    fn new() -> TableCrc {
        let mut t = [0u32; 256];
        for (i, e) in t.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 { 0xedb8_8320 ^ (c >> 1) } else { c >> 1 };
            }
            *e = c;
        }
        TableCrc(t)
    }
    fn crc(&self, data: &[u8]) -> u32 {
        let mut c = !0u32;
        for &b in data {
            c = self.0[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8);
        }
        !c
    }
}

fn frame(payload: usize) -> Vec<u8> {
    let repr = FrameRepr {
        eth: EthernetRepr { dst: [2, 0, 0, 0, 0, 2], src: [2, 0, 0, 0, 0, 1], vlan: None, ethertype: 0x0800 },
        ip: IpRepr::V4(Ipv4Repr { src: [10, 0, 0, 1], dst: [10, 0, 0, 2], dscp: 0, ecn: 2, ident: 1, dont_frag: true, ttl: 64, protocol: 17, payload_len: 0 }),
        udp: UdpRepr { src_port: 0xc000, dst_port: ROCEV2_UDP_PORT, length: 0, checksum: 0 },
        transport: TransportRepr {
            bth: BthRepr { opcode: Opcode::RC_SEND_MIDDLE, solicited: false, mig_req: false, pad_count: 0, tver: 0, pkey: 0xffff, fecn: false, becn: false, resv6: 0, dest_qp: 0x11, ack_req: false, resv7: 0, psn: Psn::new(1) },
            deth: None,
            reth: None,
            atomic_eth: None,
            aeth: None,
            atomic_ack: None,
            immediate: None,
            invalidate_rkey: None,
        },
    };
    let data: Vec<u8> = (0..payload).map(|i| i as u8).collect();
    let mut buf = vec![0u8; repr.frame_len(payload)];
    repr.emit(&data, &mut buf).unwrap();
    buf
}

fn bench_icrc(c: &mut Criterion) {
    let table = TableCrc::new();
    let mut g = c.benchmark_group("icrc");
    // frame sizes 64 B, 1 KiB, 4 KiB (payload = size - 58 bytes of headers/ICRC)
    for size in [64usize, 1024, 4096] {
        // payload a multiple of 4 (no pad), so the frame is `size` or 2 bytes less
        let f = frame((size - 58) & !3);
        assert!(f.len() <= size && f.len() + 4 > size);
        let l3 = &f[14..];
        let end = l3.len() - 4;
        g.throughput(Throughput::Bytes(f.len() as u64));
        g.bench_with_input(BenchmarkId::new("urnic_crc32fast", size), &l3, |b, l3| {
            b.iter(|| icrc::compute(black_box(l3), 20, end).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("baseline_table", size), &l3, |b, l3| b.iter(|| table.crc(black_box(&l3[..end]))));
    }
    g.finish();
}

fn bench_parse(c: &mut Criterion) {
    let mut g = c.benchmark_group("parse_frame");
    for size in [64usize, 4096] {
        let f = frame((size - 58) & !3);
        g.throughput(Throughput::Elements(1));
        g.bench_with_input(BenchmarkId::from_parameter(size), &f, |b, f| b.iter(|| parse_frame(black_box(f)).unwrap().payload.len()));
    }
    g.finish();
}

criterion_group!(benches, bench_icrc, bench_parse);
criterion_main!(benches);
