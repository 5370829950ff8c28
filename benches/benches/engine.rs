//! Messages per second through two transport engines joined in memory by the
//! simulator's ideal links: no I/O, no impairments, no clocks. Each iteration
//! posts a batch of signaled WRs (and, for SEND, the matching receives), runs
//! the two engines until the network is idle and polls every completion, so
//! the figure covers the whole path: requester segmentation and framing
//! (ICRC included), parsing and ICRC check, responder placement, ACKs,
//! completer and completions.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

use rocev2::psn::Psn;
use rocev2::sim::pair::{NetworkPair, Pair, PairConfig};
use rocev2::sim::rc::RcParams;
use rocev2::sim::{LinkConfig, RunOutcome};
use rocev2::transport::attr::{Mtu, QpCaps};
use rocev2::transport::memory::Access;
use rocev2::transport::wr::{CqId, Payload, RecvWr, SendFlags, SendOp, SendWr, WcStatus};

/// WRs posted per iteration (the send queue holds them all).
const BATCH: usize = 128;

/// Hosts 10.0.0.1 and .2 with one RC QP each (first PSNs 100 and 200, no
/// remote atomics) and a `buf_len`-byte buffer each, in a network with an
/// ideal 1 µs link each way.
fn pair(mtu: Mtu, buf_len: usize) -> NetworkPair {
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mut cfg = PairConfig { buf_len, mr_access: access, ..PairConfig::default() };
    cfg.qp.send_cq = CqId(0);
    cfg.qp.recv_cq = CqId(1);
    cfg.qp.cap = QpCaps { max_send_wr: 4 * BATCH as u32, max_recv_wr: 4 * BATCH as u32, ..QpCaps::default() };
    cfg.params = [100, 200].map(|psn| RcParams { mtu, sq_psn: Psn::new(psn), access, ..RcParams::default() });
    Pair::new(&cfg).expect("connect").into_network(LinkConfig::ideal(Duration::from_micros(1)), 1)
}

/// Run until idle and count the completions on `node` (all must be successes).
fn finish(p: &mut NetworkPair, node: usize) -> usize {
    let deadline = p.net.now() + Duration::from_secs(1);
    assert_eq!(p.net.run_until(deadline), RunOutcome::Idle);
    let mut n = 0;
    while let Some(c) = p.net.node_mut(p.nodes[node]).poll_completion() {
        assert_eq!(c.wc.status, WcStatus::Success);
        n += 1;
    }
    n
}

fn write_64(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine_pair");
    g.throughput(Throughput::Elements(BATCH as u64));
    g.measurement_time(Duration::from_secs(5));
    let size = 64u32;
    let mut p = pair(Mtu::Mtu1024, 1 << 20);
    g.bench_function(BenchmarkId::new("rdma_write", "64B"), |bch| {
        bch.iter(|| {
            for i in 0..BATCH {
                let off = (i * size as usize) % (1 << 19);
                let wr = SendWr {
                    wr_id: i as u64,
                    op: SendOp::Write { remote: p.mr[1].remote(off) },
                    payload: Payload::Sgl(vec![p.mr[0].sge(off, size)]),
                    flags: SendFlags::SIGNALED,
                    ud: None,
                };
                p.net.node_mut(p.nodes[0]).post_send(p.qpn[0], wr).expect("post_send");
            }
            assert_eq!(finish(&mut p, 0), BATCH);
        })
    });
    g.finish();
}

fn send_4k(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine_pair");
    g.throughput(Throughput::Elements(BATCH as u64));
    g.measurement_time(Duration::from_secs(5));
    let size = 4096u32;
    for mtu in [Mtu::Mtu1024, Mtu::Mtu4096] {
        let mut p = pair(mtu, 2 * BATCH * size as usize);
        g.bench_function(BenchmarkId::new("send", format!("4KiB_mtu{}", mtu.bytes())), |bch| {
            bch.iter(|| {
                for i in 0..BATCH {
                    let off = i * size as usize;
                    let rwr = RecvWr { wr_id: i as u64, sgl: vec![p.mr[1].sge(off, size)] };
                    p.net.node_mut(p.nodes[1]).post_recv(p.qpn[1], rwr).expect("post_recv");
                    let wr = SendWr {
                        wr_id: i as u64,
                        op: SendOp::Send,
                        payload: Payload::Sgl(vec![p.mr[0].sge(off, size)]),
                        flags: SendFlags::SIGNALED,
                        ud: None,
                    };
                    p.net.node_mut(p.nodes[0]).post_send(p.qpn[0], wr).expect("post_send");
                }
                assert_eq!(finish(&mut p, 0), BATCH);
                assert_eq!(finish(&mut p, 1), BATCH);
            })
        });
    }
    g.finish();
}

criterion_group!(benches, write_64, send_4k);
criterion_main!(benches);
