//! Messages per second through two transport engines joined in memory by the
//! simulator's ideal links: no I/O, no impairments, no clocks. Each iteration
//! posts a batch of signaled WRs (and, for SEND, the matching receives), runs
//! the two engines until the network is idle and polls every completion, so
//! the figure covers the whole path: requester segmentation and framing
//! (ICRC included), parsing and ICRC check, responder placement, ACKs,
//! completer and completions.

use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

use rocev2::psn::Psn;
use rocev2::sim::rc::{connect_rc, HostAddr, RcParams};
use rocev2::sim::{LinkConfig, Network, NodeId, RunOutcome};
use rocev2::time::Instant;
use rocev2::transport::attr::{Mtu, QpCaps, QpInitAttr, QpType};
use rocev2::transport::engine::{Engine, EngineConfig};
use rocev2::transport::memory::{Access, MemoryTable, PdId};
use rocev2::transport::wr::{CqId, Payload, RecvWr, RemoteAddr, SendFlags, SendOp, SendWr, Sge, WcStatus};

const PD: PdId = PdId(1);
/// WRs posted per iteration (the send queue holds them all).
const BATCH: usize = 128;

struct Pair {
    net: Network<Engine>,
    nodes: [NodeId; 2],
    qpn: [u32; 2],
    /// lkey/rkey of each host's buffer and its IOVA.
    keys: [u32; 2],
    iova: [u64; 2],
    _bufs: [Box<[u64]>; 2],
}

fn pair(mtu: Mtu, buf_len: usize) -> Pair {
    let hosts = [HostAddr::ipv4(1), HostAddr::ipv4(2)];
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mut bufs = [vec![0u64; buf_len / 8].into_boxed_slice(), vec![0u64; buf_len / 8].into_boxed_slice()];
    let mut keys = [0; 2];
    let iova = [0x1000_0000, 0x2000_0000];
    let mut engines = Vec::new();
    for i in 0..2 {
        let table = Arc::new(MemoryTable::new());
        // SAFETY: the buffers live in the returned `Pair`, next to the engines
        // that use them, and are dropped after them (field order).
        let k = unsafe { table.register(PD, bufs[i].as_mut_ptr() as *mut u8, buf_len, iova[i], access) }.expect("register");
        keys[i] = k.lkey;
        engines.push(Engine::new(EngineConfig::default(), table));
    }
    let init = QpInitAttr {
        qp_type: QpType::Rc,
        pd: PD,
        send_cq: CqId(0),
        recv_cq: CqId(1),
        srq: None,
        cap: QpCaps { max_send_wr: 4 * BATCH as u32, max_recv_wr: 4 * BATCH as u32, ..QpCaps::default() },
        sq_sig_all: true,
    };
    let mut eb = engines.pop().unwrap();
    let mut ea = engines.pop().unwrap();
    let qa = ea.create_qp(&init).expect("create_qp");
    let qb = eb.create_qp(&init).expect("create_qp");
    let pa = RcParams { mtu, sq_psn: Psn::new(100), access, ..RcParams::default() };
    let pb = RcParams { mtu, sq_psn: Psn::new(200), access, ..RcParams::default() };
    connect_rc(&mut ea, qa, &hosts[0], &pa, &mut eb, qb, &hosts[1], &pb).expect("connect");
    let mut net = Network::new(Instant::ZERO);
    let a = net.add_node(ea, hosts[0].mac);
    let b = net.add_node(eb, hosts[1].mac);
    net.connect_pair(a, b, LinkConfig::ideal(Duration::from_micros(1)), 1);
    Pair { net, nodes: [a, b], qpn: [qa, qb], keys, iova, _bufs: bufs }
}

/// Run until idle and count the completions on `node` (all must be successes).
fn finish(p: &mut Pair, node: usize) -> usize {
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
                let off = (i as u64 * u64::from(size)) % (1 << 19);
                let wr = SendWr {
                    wr_id: i as u64,
                    op: SendOp::Write { remote: RemoteAddr { addr: p.iova[1] + off, rkey: p.keys[1] } },
                    payload: Payload::Sgl(vec![Sge { addr: p.iova[0] + off, length: size, lkey: p.keys[0] }]),
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
                    let off = i as u64 * u64::from(size);
                    let rwr = RecvWr { wr_id: i as u64, sgl: vec![Sge { addr: p.iova[1] + off, length: size, lkey: p.keys[1] }] };
                    p.net.node_mut(p.nodes[1]).post_recv(p.qpn[1], rwr).expect("post_recv");
                    let wr = SendWr {
                        wr_id: i as u64,
                        op: SendOp::Send,
                        payload: Payload::Sgl(vec![Sge { addr: p.iova[0] + off, length: size, lkey: p.keys[0] }]),
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
