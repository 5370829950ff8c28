//! The post and poll paths allocate nothing. A counting global allocator
//! counts the heap allocations made by this test's own thread while it posts
//! and polls N work requests over an RC pair on the in-memory hub —
//! receives, SENDs gathered from SGEs, inline SENDs, two-SGE RDMA WRITEs,
//! through the borrowed (`*_ref`) and the owned (`&SendWr`, built once
//! before) calls, polled with `Cq::poll` and `Cq::poll_with` — and expects
//! zero; and the same for whole send queues (`max_send_wr` WRITEs at once,
//! round after round), which use every send WQE box a QP has. The datapath
//! threads are not counted: their work is not the application's post/poll
//! path. A deterministic check, no timing.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use urnic::*;

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

fn count() {
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: forwards every call to the system allocator unchanged; counting
// touches only an atomic and a const-initialised thread-local (no allocation).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count();
        System.alloc(l)
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        count();
        System.alloc_zeroed(l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        count();
        System.realloc(p, l, n)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Poll `cq` (alternating `poll` and `poll_with`) until `n` completions came,
/// all successful; returns nothing that could allocate.
fn drain(cq: &Cq, n: usize, wc: &mut [WorkCompletion; 16]) {
    let mut got = 0;
    let mut turn = false;
    while got < n {
        turn = !turn;
        let k = if turn {
            cq.poll(&mut wc[..]).unwrap()
        } else {
            let mut ok = true;
            let k = cq.poll_with(16, |_, w| ok &= w.status == WcStatus::Success).unwrap();
            assert!(ok, "a completion failed");
            k
        };
        if turn {
            assert!(wc[..k].iter().all(|w| w.status == WcStatus::Success), "a completion failed");
        }
        got += k;
        if k == 0 {
            std::thread::yield_now();
        }
    }
}

/// One round: 3 receives on b; on a a SEND from an SGE, an inline SEND, an
/// owned SEND, a two-SGE WRITE; all signalled; both CQs drained.
fn round(a: &Side, qa: &Qp, b: &Side, qb: &Qp, owned: &SendWr, i: u64, wc: &mut [WorkCompletion; 16]) {
    let rsge = [b.mr.sge(0, 256)];
    for k in 0..3 {
        qb.post_recv_ref(&RecvWrRef { wr_id: i * 8 + k, sgl: &rsge }).unwrap();
    }
    let sge = [a.mr.sge(0, 64)];
    let send = SendWrRef { wr_id: i, op: SendOp::Send, payload: PayloadRef::Sgl(&sge), flags: SendFlags::SIGNALED, ud: None };
    qa.post_send_ref(&send).unwrap();
    let data = [7u8; 8];
    let inline = SendWrRef { payload: PayloadRef::Inline(&data), flags: SendFlags::SIGNALED | SendFlags::INLINE, ..send };
    qa.post_send_ref(&inline).unwrap();
    qa.post_send(owned).unwrap();
    let two = [a.mr.sge(0, 32), a.mr.sge(64, 32)];
    let remote = RemoteAddr { addr: b.mr.addr() + 4096, rkey: b.mr.rkey() };
    let write = SendWrRef { op: SendOp::Write { remote }, payload: PayloadRef::Sgl(&two), ..send };
    qa.post_send_ref(&write).unwrap();
    drain(&a.cq, 4, wc);
    drain(&b.cq, 3, wc);
}

#[test]
fn posting_and_polling_allocate_nothing() {
    let (a, qa, b, qb) = rc_pair(Impairments::default(), 65536);
    let owned = send_wr(99, SendOp::Send, vec![a.mr.sge(128, 16)]);
    let mut wc = [WorkCompletion::default(); 16];
    // Warm-up: first-use allocations of this thread (thread-locals of the
    // libraries underneath) are not per post.
    for i in 0..20 {
        round(&a, &qa, &b, &qb, &owned, i, &mut wc);
    }
    const ROUNDS: u64 = 500;
    COUNTING.with(|c| c.set(true));
    for i in 0..ROUNDS {
        round(&a, &qa, &b, &qb, &owned, 100 + i, &mut wc);
    }
    COUNTING.with(|c| c.set(false));
    let n = ALLOCATIONS.load(Ordering::Relaxed);
    assert_eq!(n, 0, "{n} heap allocations while posting {} WRs and polling their completions", ROUNDS * 7);
    // The counter counts: one Vec on this thread is seen.
    COUNTING.with(|c| c.set(true));
    let v = std::hint::black_box(vec![1u8; 3]);
    COUNTING.with(|c| c.set(false));
    drop(v);
    assert_eq!(ALLOCATIONS.load(Ordering::Relaxed), 1, "the counting allocator missed an allocation");
}

/// Whole send queues at a time: `max_send_wr` WRITEs posted back to back,
/// then all their completions polled, round after round. The WQEs a post
/// fills are boxes that travel to the engine and come back once reaped; the
/// QP makes enough of them up front that a program keeping to
/// `max_send_wr` never waits for one to come back, so not even the first
/// full window allocates on the posting thread.
#[test]
fn full_send_queues_allocate_nothing() {
    let (a, qa, b, _qb) = rc_pair(Impairments::default(), 65536);
    let depth = caps().max_send_wr as u64;
    let mut wc = [WorkCompletion::default(); 16];
    let sge = [a.mr.sge(0, 64)];
    let remote = RemoteAddr { addr: b.mr.addr(), rkey: b.mr.rkey() };
    let write = |i| SendWrRef { wr_id: i, op: SendOp::Write { remote }, payload: PayloadRef::Sgl(&sge), flags: SendFlags::SIGNALED, ud: None };
    // Warm-up: one small round for first-use thread-locals, not a window.
    qa.post_send_ref(&write(0)).unwrap();
    drain(&a.cq, 1, &mut wc);
    const ROUNDS: u64 = 8;
    COUNTING.with(|c| c.set(true));
    for r in 0..ROUNDS {
        for i in 0..depth {
            qa.post_send_ref(&write(r * depth + i)).unwrap();
        }
        drain(&a.cq, depth as usize, &mut wc);
    }
    COUNTING.with(|c| c.set(false));
    let n = ALLOCATIONS.load(Ordering::Relaxed);
    assert_eq!(n, 0, "{n} heap allocations while posting {ROUNDS} full send queues of {depth} WRs");
}
