//! Wire-layer benchmarks.
//!
//! - `icrc/*`: the RoCEv2 ICRC over 64 B, 1 KiB and 4 KiB frames (Throughput
//!   in frame bytes), urnic's one-pass `crc32fast` routine against a plain
//!   byte-at-a-time table CRC-32 written here as the baseline, in the same
//!   run. Both compute the same ICRC (checked before measuring).
//! - `crc_short/*`: `crc::update` on the short runs a frame's ICRC is made
//!   of (masked headers, small payloads: 16 to 128 bytes; urnic's own
//!   one-lane carry-less-multiply kernel, up to 127 bytes) against a `crc32fast::Hasher` per
//!   call, as `crc::update` did before, in the same run (same result, checked).
//! - `icrc_headers/*`: the CRC of a WRITE's masked headers (IPv4, UDP, BTH,
//!   RETH: 56 bytes) as `icrc::headers` computes it, the fields masked in
//!   the loaded lanes, against the same headers copied to a stack buffer,
//!   masked there with byte stores and then hashed (what it did before), in
//!   the same run (same result, checked).
//! - `parse_frame/*`: full parse + ICRC verify per frame, 64 B and 4 KiB.
//! - `emit_with/*`: header emit + payload gather + ICRC per frame.
//!
//! Frame sizes: a RoCEv2 frame over untagged Ethernet is always 2 mod 4 bytes
//! long (14-byte Ethernet header, everything after it 4-byte aligned), so
//! "64 B" is a 62-byte frame, "1 KiB" 1022 and "4 KiB" 4094.

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

    /// Continue a raw (un-complemented) CRC register over `data`.
    #[inline]
    fn update(&self, mut c: u32, data: &[u8]) -> u32 {
        for &b in data {
            c = self.0[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8);
        }
        c
    }

    /// The same ICRC as `icrc::compute` for an IPv4 packet with a 20-byte
    /// header: masked header copies, then the rest byte by byte.
    fn icrc_v4(&self, l3: &[u8], end: usize) -> u32 {
        let mut hdr = [0u8; 40];
        hdr.copy_from_slice(&l3[..40]);
        hdr[1] = 0xff; // TOS
        hdr[8] = 0xff; // TTL
        hdr[10] = 0xff; // IPv4 checksum
        hdr[11] = 0xff;
        hdr[26] = 0xff; // UDP checksum
        hdr[27] = 0xff;
        hdr[32] = 0xff; // BTH byte 4
        let c = self.update(icrc::LRH_STATE, &hdr);
        !self.update(c, &l3[40..end])
    }
}

fn frame(payload: usize) -> Vec<u8> {
    let repr = repr();
    let data: Vec<u8> = (0..payload).map(|i| i as u8).collect();
    let mut buf = vec![0u8; repr.frame_len(payload)];
    repr.emit(&data, &mut buf).unwrap();
    buf
}

fn repr() -> FrameRepr {
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
        udp: UdpRepr { src_port: 0xc000, dst_port: ROCEV2_UDP_PORT, length: 0, checksum: 0 },
        transport: TransportRepr::bth_only(BthRepr::new(Opcode::RC_SEND_MIDDLE, 0x11, Psn::new(1))),
    }
}

/// 58 bytes of Ethernet/IPv4/UDP/BTH headers and ICRC around the payload.
const OVERHEAD: usize = 58;

fn report_cpu() {
    #[cfg(target_arch = "x86_64")]
    eprintln!(
        "CPU: pclmulqdq={} sse4.1={} avx2={} avx512f={} vpclmulqdq={} (crc32fast picks its carry-less-multiply kernel from these at run time)",
        is_x86_feature_detected!("pclmulqdq"),
        is_x86_feature_detected!("sse4.1"),
        is_x86_feature_detected!("avx2"),
        is_x86_feature_detected!("avx512f"),
        is_x86_feature_detected!("vpclmulqdq"),
    );
}

fn bench_icrc(c: &mut Criterion) {
    report_cpu();
    let table = TableCrc::new();
    let mut g = c.benchmark_group("icrc");
    for size in [64usize, 1024, 4096] {
        let f = frame(size - OVERHEAD - 2);
        assert_eq!(f.len(), size - 2);
        let l3 = &f[14..];
        let end = l3.len() - 4;
        let stored = u32::from_le_bytes(l3[end..].try_into().unwrap());
        assert_eq!(icrc::compute(l3, 20, end), Ok(stored));
        assert_eq!(table.icrc_v4(l3, end), stored, "the baseline computes the same ICRC");
        g.throughput(Throughput::Bytes(f.len() as u64));
        g.bench_with_input(BenchmarkId::new("crc32fast", size), &l3, |b, l3| b.iter(|| icrc::compute(black_box(l3), 20, end).unwrap()));
        // The two runs `compute` took before the wide kernel's masked run
        // (masked headers, then the rest): its gain, in the same run.
        assert_eq!(icrc::headers(l3, 20, 40).map(|c| crc::update(c, &l3[40..end])), Ok(stored));
        g.bench_with_input(BenchmarkId::new("two_runs", size), &l3, |b, l3| {
            b.iter(|| crc::update(icrc::headers(black_box(l3), 20, 40).unwrap(), &black_box(l3)[40..end]))
        });
        g.bench_with_input(BenchmarkId::new("baseline_table", size), &l3, |b, l3| b.iter(|| table.icrc_v4(black_box(l3), end)));
    }
    g.finish();
}

fn bench_crc_short(c: &mut Criterion) {
    let mut g = c.benchmark_group("crc_short");
    let data: Vec<u8> = (0..128u32).map(|i| (i * 37 + 11) as u8).collect();
    let hasher = |crc: u32, d: &[u8]| {
        let mut h = crc32fast::Hasher::new_with_initial(crc);
        h.update(d);
        h.finalize()
    };
    // 40: IPv4 + UDP + BTH masked (a receive check's first run); 56: the
    // same with a RETH (a WRITE's headers); 64 and 80: a 64 B payload, and
    // with its RETH (the receive check's second run); 112: near the longest
    // run the kernel takes; 128: `crc32fast` four-lane fold in both.
    for len in [40usize, 56, 64, 80, 112, 128] {
        let d = &data[..len];
        assert_eq!(crc::update(icrc::LRH_CRC, d), hasher(icrc::LRH_CRC, d));
        g.throughput(Throughput::Elements(1));
        g.bench_with_input(BenchmarkId::new("urnic", len), &d, |b, d| b.iter(|| crc::update(black_box(icrc::LRH_CRC), black_box(d))));
        g.bench_with_input(BenchmarkId::new("crc32fast_hasher", len), &d, |b, d| b.iter(|| hasher(black_box(icrc::LRH_CRC), black_box(d))));
    }
    g.finish();
}

fn bench_icrc_headers(c: &mut Criterion) {
    let mut g = c.benchmark_group("icrc_headers");
    let f = frame(64);
    let l3 = &f[14..];
    let upto = 20 + 8 + 12 + 16;
    let copied = |p: &[u8]| {
        let mut h = [0u8; icrc::HEADERS_MAX];
        h[..upto].copy_from_slice(&p[..upto]);
        for i in [1, 8, 10, 11, 26, 27, 32] {
            h[i] = 0xff;
        }
        crc::update(icrc::LRH_CRC, &h[..upto])
    };
    assert_eq!(icrc::headers(l3, 20, upto), Ok(copied(l3)));
    g.throughput(Throughput::Elements(1));
    g.bench_function("in_place", |b| b.iter(|| icrc::headers(black_box(l3), 20, upto).unwrap()));
    g.bench_function("masked_copy", |b| b.iter(|| copied(black_box(l3))));
    g.finish();
}

fn bench_parse(c: &mut Criterion) {
    let mut g = c.benchmark_group("parse_frame");
    for size in [64usize, 4096] {
        let f = frame(size - OVERHEAD - 2);
        g.throughput(Throughput::Elements(1));
        g.bench_with_input(BenchmarkId::from_parameter(size), &f, |b, f| b.iter(|| parse_frame(black_box(f)).unwrap().payload.len()));
    }
    g.finish();
}

fn bench_emit(c: &mut Criterion) {
    let mut g = c.benchmark_group("emit_with");
    let r = repr();
    // Source and frame laid out as in the datapath: the payload at the start
    // of a page (a registered buffer), the frame 256 bytes into another page
    // (a UMEM frame after its headroom). Two small heap vectors would sit
    // side by side instead, and glibc 2.36's `rep movsb` copy on this AMD
    // CPU runs some 30x slower when the destination lies a few bytes past
    // the source's page offset (measured: 1.4 µs instead of 50 ns for
    // 4 KiB), which is the heap's accident, not the datapath's.
    let mut pages = vec![0u8; 5 * 4096];
    let base = pages.as_ptr().align_offset(4096);
    let (src_pages, dst_pages) = pages[base..base + 4 * 4096].split_at_mut(2 * 4096);
    // 1084 and 4156: a full-MTU payload (1024, 4096 bytes), as a 64 KiB
    // WRITE's middle frames carry.
    for size in [64usize, 1084, 4096, 4156] {
        let len = size - OVERHEAD - 2;
        for (i, b) in src_pages[..len].iter_mut().enumerate() {
            *b = i as u8;
        }
        let p = &src_pages[..len];
        let buf = &mut dst_pages[256..];
        g.throughput(Throughput::Elements(1));
        g.bench_function(BenchmarkId::from_parameter(size), |b| b.iter(|| black_box(&r).emit_with(p.len(), buf, |d| d.copy_from_slice(p)).unwrap()));
        // The same frame with the payload copied and folded into the ICRC in
        // one pass, as requests and READ responses are built: the ratio to
        // the case above is the fused copy's gain, measured in the same run.
        g.bench_function(BenchmarkId::new("fused", size), |b| {
            b.iter(|| black_box(&r).emit_with_crc(p.len(), buf, |d, crc| rocev2::wire::crc::copy_update(crc, p, d)).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, bench_icrc, bench_crc_short, bench_icrc_headers, bench_parse, bench_emit);
criterion_main!(benches);
