//! The lock-free rings the application and the datapath share, against the
//! obvious alternative measured in the same run: a `Mutex<VecDeque>`.
//!
//! - `send_ring/*`: 128 send WRs pushed into a QP's send ring then taken
//!   out (`QpRings::send`, what `post_send` and the datapath's doorbell
//!   drain do: each WR written into its slot's box), one thread; against
//!   the design it replaced (`arrayqueue_pair`: a free list of boxes and a
//!   ring of filled ones, two crossbeam `ArrayQueue`s, four CASes a WR).
//! - `send_ring_2threads/*`: the same across two threads: a poster thread
//!   posts (retrying while the ring is full) while the measuring thread
//!   drains, through a 128-entry ring.
//! - `cq_ring/*`: 128 completions pushed into a CQ ring (`CqRing::push`,
//!   with its arming check) then polled 16 at a time (`CqRing::poll`), one
//!   thread.
//! - `cq_ring_2threads/*`: a producer thread pushes completions while the
//!   measuring thread polls them, 16 at a time, through a 256-entry ring:
//!   the datapath-to-application hand-off across cores.
//!
//! Throughput is in elements (WRs or completions).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use crossbeam_queue::ArrayQueue;
use rocev2::transport::retired::RetiredCount;
use rocev2::transport::wqe::{PayloadRef, SendWqe, SendWrRef};
use rocev2::transport::wr::{CqId, Payload, SendFlags, SendOp, SendWr, Sge, WorkCompletion};
use urnic_datapath::queues::{CqRing, QpRings, WqBound};

const BATCH: usize = 128;
const CQ_DEPTH: usize = 256;

fn send_wr(i: usize) -> SendWr {
    SendWr {
        wr_id: i as u64,
        op: SendOp::Send,
        payload: Payload::Sgl(vec![Sge { addr: 0x1000 + i as u64 * 64, length: 64, lkey: 7 }]),
        flags: SendFlags::SIGNALED,
        ud: None,
    }
}

fn wc(i: u64) -> WorkCompletion {
    WorkCompletion { wr_id: i, byte_len: 64, qp_num: 17, ..WorkCompletion::default() }
}

/// A mutex-protected deque with a capacity, the baseline for both rings.
struct Locked<T> {
    q: Mutex<VecDeque<T>>,
    cap: usize,
}

impl<T> Locked<T> {
    fn new(cap: usize) -> Locked<T> {
        Locked { q: Mutex::new(VecDeque::with_capacity(cap)), cap }
    }

    fn push(&self, v: T) -> Result<(), T> {
        let mut q = self.q.lock().unwrap();
        if q.len() == self.cap {
            return Err(v);
        }
        q.push_back(v);
        Ok(())
    }

    fn pop(&self) -> Option<T> {
        self.q.lock().unwrap().pop_front()
    }

    /// Take up to `out.len()` at once (one lock), as `CqRing::poll` takes up to
    /// `out.len()`.
    fn poll(&self, out: &mut [T]) -> usize
    where
        T: Copy,
    {
        let mut q = self.q.lock().unwrap();
        let n = out.len().min(q.len());
        for o in out.iter_mut().take(n) {
            *o = q.pop_front().expect("length checked");
        }
        n
    }
}

/// The send ring urnic had before `SendRing`, the baseline: boxes taken from
/// a free list, filled, pushed into a ring; the consumer pops them and gives
/// them back to the free list.
struct ArrayQueuePair {
    send: ArrayQueue<Box<SendWqe>>,
    free: ArrayQueue<Box<SendWqe>>,
}

impl ArrayQueuePair {
    fn new(depth: usize) -> ArrayQueuePair {
        let free = ArrayQueue::new(3 * depth);
        for _ in 0..2 * depth {
            let _ = free.push(Box::new(SendWqe::empty()));
        }
        ArrayQueuePair { send: ArrayQueue::new(depth), free }
    }

    fn push(&self, wr: &SendWrRef<'_>) -> bool {
        let mut b = self.free.pop().unwrap_or_else(|| Box::new(SendWqe::empty()));
        b.fill_from(wr);
        match self.send.push(b) {
            Ok(()) => true,
            Err(b) => {
                let _ = self.free.push(b);
                false
            }
        }
    }

    fn drain(&self, f: &mut dyn FnMut(&SendWqe)) {
        while let Some(b) = self.send.pop() {
            f(&b);
            let _ = self.free.push(b);
        }
    }
}

/// A QP's rings and the count of WQEs retired that bounds its send queue,
/// which the drain below advances as the engine does once it reaps them.
struct SendQueue {
    rings: QpRings,
    retired: Arc<RetiredCount>,
}

impl SendQueue {
    fn new(depth: usize) -> SendQueue {
        let send = WqBound::unshared(depth);
        let retired = send.retired.clone();
        SendQueue { rings: QpRings::new(1, CqId(0), CqId(1), send, WqBound::unshared(1)), retired }
    }
}

fn drain_send_ring(q: &SendQueue, f: &mut dyn FnMut(&SendWqe)) {
    let mut c = q.rings.send.consumer().expect("one consumer");
    let mut n = 0;
    while let Some(b) = c.pop() {
        f(&b);
        c.recycle(b);
        n += 1;
    }
    q.retired.add(n);
}

fn send_ring(c: &mut Criterion) {
    let mut g = c.benchmark_group("send_ring");
    g.measurement_time(Duration::from_secs(2));
    g.throughput(Throughput::Elements(BATCH as u64));
    // The send ring: each post writes its WR into a slot's box in place; the
    // consumer takes the boxes out and hands spares back, as the engine does
    // once the WQEs are reaped.
    let wrs: Vec<SendWr> = (0..BATCH).map(send_wr).collect();
    let q = SendQueue::new(BATCH);
    g.bench_function(BenchmarkId::new("sendring", BATCH), |b| {
        b.iter(|| {
            for wr in &wrs {
                assert!(q.rings.push_send(&wr.borrowed()));
            }
            drain_send_ring(&q, &mut |w| {
                black_box(w);
            });
        })
    });
    let pair = ArrayQueuePair::new(BATCH);
    g.bench_function(BenchmarkId::new("arrayqueue_pair", BATCH), |b| {
        b.iter(|| {
            for wr in &wrs {
                assert!(pair.push(&wr.borrowed()));
            }
            pair.drain(&mut |w| {
                black_box(w);
            });
        })
    });
    // The mutex baseline moves boxes, each filled as a post fills its slot.
    let mut boxes: Vec<Box<SendWqe>> = wrs.iter().map(|w| Box::new(SendWqe::from(&w.borrowed()))).collect();
    let locked = Locked::new(BATCH);
    g.bench_function(BenchmarkId::new("mutex_vecdeque", BATCH), |b| {
        b.iter(|| {
            for wr in &wrs {
                let mut b = boxes.pop().expect("one box per WR");
                b.fill_from(&wr.borrowed());
                assert!(locked.push(b).is_ok());
            }
            while let Some(b) = locked.pop() {
                boxes.push(black_box(b));
            }
        })
    });
    g.finish();
}

fn cq_ring(c: &mut Criterion) {
    let mut g = c.benchmark_group("cq_ring");
    g.measurement_time(Duration::from_secs(2));
    g.throughput(Throughput::Elements(BATCH as u64));
    let mut out = [WorkCompletion::default(); 16];
    let ring = CqRing::new(CqId(0), CQ_DEPTH, None);
    g.bench_function(BenchmarkId::new("cqring", BATCH), |b| {
        b.iter(|| {
            for i in 0..BATCH as u64 {
                assert!(ring.push(wc(i), false));
            }
            let mut got = 0;
            while got < BATCH {
                got += ring.poll(&mut out);
            }
            black_box(&out);
        })
    });
    let locked = Locked::new(CQ_DEPTH);
    g.bench_function(BenchmarkId::new("mutex_vecdeque", BATCH), |b| {
        b.iter(|| {
            for i in 0..BATCH as u64 {
                assert!(locked.push(wc(i)).is_ok());
            }
            let mut got = 0;
            while got < BATCH {
                got += locked.poll(&mut out);
            }
            black_box(&out);
        })
    });
    g.finish();
}

/// Push `n` completions from a second thread into `push` (spinning while
/// full) while this thread polls them with `poll`; the time until the last
/// one is polled.
fn two_threads<R: Send + Sync + 'static>(
    ring: &Arc<R>,
    n: u64,
    push: fn(&R, WorkCompletion) -> bool,
    poll: fn(&R, &mut [WorkCompletion]) -> usize,
) -> Duration {
    let producer = {
        let ring = Arc::clone(ring);
        std::thread::spawn(move || {
            for i in 0..n {
                while !push(&ring, wc(i)) {
                    std::hint::spin_loop();
                }
            }
        })
    };
    let t = std::time::Instant::now();
    let mut out = [WorkCompletion::default(); 16];
    let mut got = 0u64;
    let mut next = 0u64;
    while got < n {
        let k = poll(ring, &mut out);
        for w in &out[..k] {
            assert_eq!(w.wr_id, next, "completions out of order");
            next += 1;
        }
        got += k as u64;
        if k == 0 {
            std::hint::spin_loop();
        }
    }
    let elapsed = t.elapsed();
    producer.join().expect("producer");
    elapsed
}

/// `iters` batches through `run(n)` (a thread spawned for `n` elements,
/// the time it reports), one spawn per 64 batches: the spawn amortised.
fn in_spawns(iters: u64, mut run: impl FnMut(u64) -> Duration) -> Duration {
    const PER_SPAWN: u64 = 64;
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let k = left.min(PER_SPAWN);
        total += run(k * BATCH as u64);
        left -= k;
    }
    total
}

fn cq_ring_two_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("cq_ring_2threads");
    g.measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::Elements(BATCH as u64));
    let ring = Arc::new(CqRing::new(CqId(0), CQ_DEPTH, None));
    g.bench_function(BenchmarkId::new("cqring", BATCH), |b| {
        b.iter_custom(|iters| {
            // A full ring refuses the push (and records an overrun the
            // producer then retries past); the datapath never retries,
            // which is what CQ sizing is for.
            in_spawns(iters, |n| two_threads(&ring, n, |r, w| r.len() < r.capacity() && r.push(w, false), |r, o| r.poll(o)))
        })
    });
    let locked = Arc::new(Locked::new(CQ_DEPTH));
    g.bench_function(BenchmarkId::new("mutex_vecdeque", BATCH), |b| {
        b.iter_custom(|iters| in_spawns(iters, |n| two_threads(&locked, n, |r, w| r.push(w).is_ok(), |r, o| r.poll(o))))
    });
    g.finish();
}

/// Take every WR posted so far, handing each to the callback.
type Drain<R> = fn(&R, &mut dyn FnMut(&SendWqe));

/// Post `n` send WRs from a second thread (retrying while the ring is full)
/// while this thread drains them; the time until the last one is taken.
fn send_two_threads<R: Send + Sync + 'static>(ring: &Arc<R>, n: u64, post: fn(&R, &SendWrRef<'_>) -> bool, drain: Drain<R>) -> Duration {
    let poster = {
        let ring = Arc::clone(ring);
        std::thread::spawn(move || {
            for i in 0..n {
                // As `send_wr`, without its allocation.
                let sge = [Sge { addr: 0x1000 + i * 64, length: 64, lkey: 7 }];
                let wr = SendWrRef { wr_id: i, op: SendOp::Send, payload: PayloadRef::Sgl(&sge), flags: SendFlags::SIGNALED, ud: None };
                while !post(&ring, &wr) {
                    std::hint::spin_loop();
                }
            }
        })
    };
    let t = std::time::Instant::now();
    let mut next = 0u64;
    while next < n {
        drain(ring, &mut |w| {
            assert_eq!(w.wr_id, next, "WRs out of order");
            next += 1;
        });
    }
    let elapsed = t.elapsed();
    poster.join().expect("poster");
    elapsed
}

fn send_ring_two_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("send_ring_2threads");
    g.measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::Elements(BATCH as u64));
    let q = Arc::new(SendQueue::new(BATCH));
    g.bench_function(BenchmarkId::new("sendring", BATCH), |b| {
        b.iter_custom(|iters| in_spawns(iters, |n| send_two_threads(&q, n, |q, w| q.rings.push_send(w), drain_send_ring)))
    });
    let pair = Arc::new(ArrayQueuePair::new(BATCH));
    g.bench_function(BenchmarkId::new("arrayqueue_pair", BATCH), |b| {
        b.iter_custom(|iters| in_spawns(iters, |n| send_two_threads(&pair, n, |r, w| r.push(w), |r, f| r.drain(f))))
    });
    g.finish();
}

criterion_group!(benches, send_ring, send_ring_two_threads, cq_ring, cq_ring_two_threads);
criterion_main!(benches);
