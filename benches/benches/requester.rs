//! Requester packet generation: posting signaled WRs on one engine and
//! pulling every frame they make out of `poll_transmit` (segmentation,
//! header emit, payload gather from registered memory, ICRC). Only that is
//! timed; delivering the frames to the peer, its ACKs and the completions
//! happen untimed between samples, so every sample starts from an idle,
//! connected QP.
//!
//! Throughput is in payload bytes. `write/*`, `send/*`: the data frames;
//! `read/*`: the READ request frames only (the data comes back in
//! responses, measured by the `responder` suite).

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use urnic_benches::{batch, case_label, drain_completions, engine_pair, now, BenchPair, Frames, Kind, CASES};

fn requester(c: &mut Criterion) {
    let mut g = c.benchmark_group("requester");
    g.measurement_time(Duration::from_secs(3));
    for &(kind, size, mtu) in CASES {
        let n = batch(size);
        let mut p = engine_pair(mtu, n * size as usize, 256);
        let mut frames = Frames::with_capacity(n * (size as usize / mtu.bytes() as usize + 1));
        let mut scratch = Frames::with_capacity(256);
        g.throughput(Throughput::Bytes((n * size as usize) as u64));
        g.bench_function(BenchmarkId::new(kind.name(), case_label(size, mtu)), |bch| {
            bch.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let wrs: Vec<_> = (0..n).map(|i| p.wr(kind, i, size)).collect();
                    if kind == Kind::Send {
                        p.post_recvs(n, size);
                    }
                    frames.clear();
                    let t = std::time::Instant::now();
                    for wr in wrs {
                        p.a.engine.post_send(p.a.qpn, wr).expect("post_send");
                    }
                    frames.transmit_all(&mut p.a.engine, now());
                    total += t.elapsed();
                    frames.deliver(&mut p.b.engine, now());
                    p.settle(&mut scratch);
                    assert_eq!(drain_completions(&mut p.a.engine), n);
                    drain_completions(&mut p.b.engine);
                }
                total
            })
        });
    }
    g.finish();
}

criterion_group!(benches, requester);
criterion_main!(benches);
