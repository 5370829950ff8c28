//! An 8-byte SEND ping-pong between two engines over the simulator's ideal
//! link, in virtual time: the engines' own work per round trip, for
//! callgrind, with the held ACK's timing as on a real link (valgrind's
//! slowdown does not stretch virtual time, so a held ACK waits for its
//! reply as it does natively, where over the memory link under valgrind
//! every hold expires first).
//!
//! `cargo run --release -p rocev2 --example sim_ping_pong -- ROUNDS ONE_WAY_NS`
//! (defaults 4000 and 5000: about the one-way time over veth). Per round
//! trip: the difference of two runs' instruction counts over the
//! difference of their rounds (the set-up cancels).

use std::time::Duration;

use rocev2::psn::Psn;
use rocev2::sim::pair::{Pair, PairConfig};
use rocev2::sim::rc::RcParams;
use rocev2::sim::{LinkConfig, RunOutcome};
use rocev2::transport::wr::*;

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<u64>().expect("a number"));
    let rounds = args.next().unwrap_or(4000);
    let one_way = Duration::from_nanos(args.next().unwrap_or(5000));
    let params = |sq_psn| RcParams { sq_psn: Psn::new(sq_psn), ..RcParams::default() };
    let cfg = PairConfig { params: [params(100), params(5000)], ..PairConfig::default() };
    let p = Pair::new(&cfg).expect("a connected pair");
    let mut net = p.into_network(LinkConfig::ideal(one_way), 1);
    let sge = [net.mr[0].sge(512, 8), net.mr[1].sge(512, 8)];
    let qpn = net.qpn;
    let send = |id, sge| SendWr { wr_id: id, op: SendOp::Send, payload: Payload::Sgl(vec![sge]), flags: SendFlags::SIGNALED, ud: None };
    for (i, &q) in qpn.iter().enumerate() {
        let recv = RecvWr { wr_id: 0, sgl: vec![net.mr[i].sge(0, 64)] };
        net.engine(i).post_recv(q, recv).expect("post_recv");
    }
    net.engine(0).post_send(qpn[0], send(0, sge[0])).expect("post_send");
    let mut sends = [1u64, 0];
    let mut received = [0u64; 2];
    let end = net.net.now() + Duration::from_secs(3600);
    loop {
        let mut posted = false;
        for i in 0..2 {
            while let Some(c) = net.engine(i).poll_completion() {
                assert_eq!(c.wc.status, WcStatus::Success, "{:?}", c.wc);
                if c.wc.opcode != WcOpcode::Recv {
                    continue;
                }
                received[i] += 1;
                // A answers B's pong with the next ping, B each ping with a pong.
                if sends[i] < rounds {
                    let recv = RecvWr { wr_id: 0, sgl: vec![net.mr[i].sge(0, 64)] };
                    net.engine(i).post_recv(qpn[i], recv).expect("post_recv");
                    net.engine(i).post_send(qpn[i], send(sends[i], sge[i])).expect("post_send");
                    sends[i] += 1;
                    posted = true;
                }
            }
        }
        let out = net.net.step(end);
        // A transmit pass at once, as the datapath's poll runs its
        // `poll_transmit` right after the frames it received, before the
        // application sees their completions (the step's own pass comes
        // after the application's posts).
        net.net.transmit();
        let idle = matches!(out, Some(RunOutcome::Idle)) && !posted;
        if idle || matches!(out, Some(RunOutcome::Deadline | RunOutcome::Stalled | RunOutcome::Stopped)) {
            break;
        }
    }
    assert_eq!(received, [rounds, rounds], "every ping and pong arrived");
    let s = net.engine(1).qp_stats(qpn[1]).expect("B's QP");
    println!("{rounds} round trips, {:?} one way; B: {} ACKs held, {} expired", one_way, s.resp_acks_held, s.resp_acks_hold_expired);
}
