//! DCQCN in virtual time (rocev2::sim::dcqcn): senders with reaction points
//! into one RED/ECN-marking bottleneck, the receiver's notification point
//! returning CNPs. What the DCQCN paper reports, checked numerically:
//! flows converge to a fair share, the queue stays bounded near Kmin..Kmax,
//! incast is absorbed, and a joining or leaving flow is accommodated.

use std::time::Duration;

use rocev2::sim::dcqcn::{run, FlowSpec, Scenario};

/// Jain's fairness index of `x` (1 = perfectly fair).
fn jain(x: &[f64]) -> f64 {
    let s: f64 = x.iter().sum();
    let q: f64 = x.iter().map(|v| v * v).sum();
    s * s / (x.len() as f64 * q)
}

#[test]
fn two_flows_share_the_bottleneck_within_ten_percent_with_a_bounded_queue() {
    let sc = Scenario::incast(2);
    let out = run(&sc);
    let g = out.mean_goodput(30_000.0, 60_000.0);
    let total: f64 = g.iter().sum();
    let fair = total / 2.0;
    for (i, v) in g.iter().enumerate() {
        assert!((v - fair).abs() <= 0.10 * fair, "flow {i}: {v:.0} Mb/s vs fair share {fair:.0}: {g:?}");
    }
    assert!(total > 0.75 * sc.link_mbps, "the bottleneck stays busy: {total:.0} Mb/s");
    let (qmax, qmean) = out.queue_stats(30_000.0, 60_000.0);
    assert!(qmax < 2 * sc.red.kmax, "queue peaked at {qmax} B");
    assert!(qmean > sc.red.kmin as f64 / 2.0, "the queue is used (near Kmin..Kmax), mean {qmean:.0} B");
    assert!(qmean < sc.red.kmax as f64, "mean queue {qmean:.0} B");
    assert_eq!(out.drops, 0, "DCQCN keeps the buffer from overflowing");
    assert!(out.cnps > 0);
}

#[test]
fn incast_of_2_4_8_16_flows_is_absorbed_fairly() {
    for n in [2usize, 4, 8, 16] {
        let sc = Scenario::incast(n);
        let out = run(&sc);
        let g = out.mean_goodput(30_000.0, 60_000.0);
        let total: f64 = g.iter().sum();
        let j = jain(&g);
        let (qmax, _) = out.queue_stats(20_000.0, 60_000.0);
        assert!(total > 0.70 * sc.link_mbps, "{n}-to-1: bottleneck {total:.0} Mb/s");
        assert!(j > 0.95, "{n}-to-1: Jain index {j:.3} over {g:?}");
        assert!(qmax < 3 * sc.red.kmax, "{n}-to-1: queue peaked at {qmax} B after the start");
        assert_eq!(out.drops, 0, "{n}-to-1: drops");
    }
}

#[test]
fn a_flow_joining_and_leaving_is_accommodated() {
    let mut sc = Scenario::incast(2);
    sc.duration = Duration::from_millis(120);
    sc.flows =
        vec![FlowSpec { start: Duration::ZERO, stop: None }, FlowSpec { start: Duration::from_millis(30), stop: Some(Duration::from_millis(80)) }];
    let out = run(&sc);
    // Alone: the first flow takes the link.
    let alone = out.mean_goodput(10_000.0, 30_000.0);
    assert!(alone[0] > 0.8 * sc.link_mbps, "{alone:?}");
    // Together: a fair share each.
    let both = out.mean_goodput(55_000.0, 80_000.0);
    let fair = both.iter().sum::<f64>() / 2.0;
    assert!(both.iter().all(|v| (v - fair).abs() <= 0.15 * fair), "{both:?}");
    // After the second leaves, the first recovers the link.
    let after = out.mean_goodput(105_000.0, 120_000.0);
    assert!(after[0] > 0.75 * sc.link_mbps, "{after:?}");
    assert_eq!(after[1], 0.0);
}

#[test]
fn without_dcqcn_the_queue_overflows() {
    let mut sc = Scenario::incast(4);
    sc.params.enabled = false;
    sc.buffer = 2 << 20;
    let out = run(&sc);
    assert!(out.drops > 0, "4 line-rate senders into one link must overflow a 2 MiB buffer");
    let mut on = Scenario::incast(4);
    on.buffer = 2 << 20;
    let with = run(&on);
    assert_eq!(with.drops, 0);
}
