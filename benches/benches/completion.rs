//! The completion path: from the responder's answers arriving at the
//! requester to the application holding the work completions. Timed: the
//! requester engine handling the ACK (or READ response) frames (completer:
//! PSN checks, retiring WRs, READ data placement), taking each completion
//! out of the engine, pushing it into the CQ ring the datapath shares with
//! the application (`CqRing::push`, with its arming check) and polling the
//! ring 16 at a time as `ibv_poll_cq` would. Requests and answers are made
//! untimed before each sample. WRITE and SEND, 64 B.
//!
//! Throughput is in completions.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rocev2::transport::attr::Mtu;
use rocev2::transport::wr::WorkCompletion;
use urnic_benches::{drain_completions, engine_pair, now, BenchPair, Frames, Kind, SEND_CQ};
use urnic_datapath::queues::CqRing;

const BATCH: usize = 128;

fn completion(c: &mut Criterion) {
    let mut g = c.benchmark_group("completion");
    g.measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::Elements(BATCH as u64));
    let size = 64;
    // READ is left out: at most `max_rd_atomic` READs are outstanding, so a
    // batch does not complete from one round of answers (the READ response
    // responses' generation is in the `responder` suite).
    for kind in [Kind::Write, Kind::Send] {
        let mut p = engine_pair(Mtu::Mtu1024, BATCH * size as usize, 256);
        let mut requests = Frames::with_capacity(BATCH);
        let mut answers = Frames::with_capacity(BATCH);
        let mut scratch = Frames::with_capacity(256);
        let cq = CqRing::new(SEND_CQ, 2 * BATCH, None);
        let mut wcs = [WorkCompletion::default(); 16];
        g.bench_function(BenchmarkId::new(kind.name(), format!("{size}B")), |bch| {
            bch.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    p.post(kind, BATCH, size);
                    requests.clear();
                    requests.transmit_all(&mut p.a.engine, now());
                    requests.deliver(&mut p.b.engine, now());
                    answers.clear();
                    answers.transmit_all(&mut p.b.engine, now());
                    let t = std::time::Instant::now();
                    answers.deliver(&mut p.a.engine, now());
                    let mut polled = 0;
                    while let Some(c) = p.a.engine.poll_completion() {
                        cq.push(c.wc, c.solicited);
                    }
                    loop {
                        let k = cq.poll(&mut wcs);
                        if k == 0 {
                            break;
                        }
                        polled += k;
                    }
                    total += t.elapsed();
                    assert_eq!(polled, BATCH);
                    p.settle(&mut scratch);
                    drain_completions(&mut p.b.engine);
                }
                total
            })
        });
    }
    g.finish();
}

criterion_group!(benches, completion);
criterion_main!(benches);
