//! Responder: handing a batch of request frames to an engine and pulling
//! out what it answers. For WRITE and SEND that is parse + ICRC check, PSN
//! and access checks, placement into registered memory (SEND: into the
//! posted receive buffers, plus the receive completions) and the ACKs; for
//! READ it is the request checks plus generating the response frames (read
//! from registered memory, ICRC). The request frames are made untimed
//! before each sample, the ACKs and responses are delivered untimed after.
//!
//! Throughput is in payload bytes.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use urnic_benches::{batch, case_label, drain_completions, engine_pair, now, BenchPair, Frames, Kind, CASES};

fn responder(c: &mut Criterion) {
    let mut g = c.benchmark_group("responder");
    g.measurement_time(Duration::from_secs(3));
    for &(kind, size, mtu) in CASES {
        let n = batch(size);
        let frames_per_msg = size as usize / mtu.bytes() as usize + 1;
        let mut p = engine_pair(mtu, n * size as usize, 256);
        let mut requests = Frames::with_capacity(n * frames_per_msg);
        let mut answers = Frames::with_capacity(n * frames_per_msg);
        let mut scratch = Frames::with_capacity(256);
        g.throughput(Throughput::Bytes((n * size as usize) as u64));
        g.bench_function(BenchmarkId::new(kind.name(), case_label(size, mtu)), |bch| {
            bch.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    p.post(kind, n, size);
                    requests.clear();
                    requests.transmit_all(&mut p.a.engine, now());
                    answers.clear();
                    let t = std::time::Instant::now();
                    requests.deliver(&mut p.b.engine, now());
                    answers.transmit_all(&mut p.b.engine, now());
                    let received = drain_completions(&mut p.b.engine);
                    total += t.elapsed();
                    assert_eq!(received, if kind == Kind::Send { n } else { 0 });
                    answers.deliver(&mut p.a.engine, now());
                    p.settle(&mut scratch);
                    assert_eq!(drain_completions(&mut p.a.engine), n);
                }
                total
            })
        });
    }
    g.finish();
}

criterion_group!(benches, responder);
criterion_main!(benches);
