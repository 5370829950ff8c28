//! DCQCN in virtual time: senders with reaction points, one bottleneck
//! switch queue marking ECN with RED (Kmin, Kmax, Pmax), a receiver whose
//! notification point returns CNPs. Packet-level, stepped in fixed ticks, no
//! clocks and no I/O — the same `ReactionPoint`/`NotificationPoint` the
//! engine uses.

use std::collections::VecDeque;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::time::Instant;
use crate::transport::dcqcn::{DcqcnParams, NotificationPoint, ReactionPoint};

/// The congestion point: RED marking on the instantaneous queue.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Red {
    /// No marking at or below this many queued bytes.
    pub kmin: usize,
    /// Every packet marked above this many queued bytes.
    pub kmax: usize,
    /// Marking probability just below `kmax`.
    pub pmax: f64,
}

impl Red {
    /// The marking probability at `queued` bytes.
    pub fn probability(&self, queued: usize) -> f64 {
        if queued <= self.kmin {
            0.0
        } else if queued >= self.kmax {
            1.0
        } else {
            self.pmax * (queued - self.kmin) as f64 / (self.kmax - self.kmin) as f64
        }
    }
}

/// One flow: when it sends.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FlowSpec {
    /// Starts sending.
    pub start: Duration,
    /// Stops (None: till the end).
    pub stop: Option<Duration>,
}

/// The scenario.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Bottleneck rate, Mb/s (senders' line rate is the same).
    pub link_mbps: f64,
    /// Frame size on the wire, bytes.
    pub packet: usize,
    /// One-way delay sender→switch and switch→receiver.
    pub hop_delay: Duration,
    /// Delay of a CNP back to the sender.
    pub cnp_delay: Duration,
    /// Switch buffer (tail drop past it), bytes.
    pub buffer: usize,
    /// Marking.
    pub red: Red,
    /// DCQCN parameters of every flow.
    pub params: DcqcnParams,
    /// The flows.
    pub flows: Vec<FlowSpec>,
    /// Simulated time.
    pub duration: Duration,
    /// Time step.
    pub tick: Duration,
    /// Sampling period of the time series.
    pub sample: Duration,
    /// Seed of the marking decisions.
    pub seed: u64,
}

impl Scenario {
    /// `n` flows at 10 Gb/s into one 10 Gb/s bottleneck, all from t = 0,
    /// with the DCQCN paper's marking (Kmin 5 KB, Kmax 200 KB, Pmax 1%) and
    /// reaction point settings ([`DcqcnParams::paper`]), a 16 MB buffer.
    pub fn incast(n: usize) -> Scenario {
        let link = 10_000.0;
        Scenario {
            link_mbps: link,
            packet: 1078,
            hop_delay: Duration::from_micros(2),
            cnp_delay: Duration::from_micros(4),
            buffer: 16 << 20,
            red: Red { kmin: 5_000, kmax: 200_000, pmax: 0.01 },
            params: DcqcnParams::paper(link),
            flows: vec![FlowSpec { start: Duration::ZERO, stop: None }; n],
            duration: Duration::from_millis(60),
            tick: Duration::from_nanos(100),
            sample: Duration::from_micros(100),
            seed: 1,
        }
    }
}

/// One sample of the time series.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Time, µs.
    pub t_us: f64,
    /// Each flow's RP rate, Mb/s (0 while the flow is not sending).
    pub rate_mbps: Vec<f64>,
    /// Each flow's delivered throughput over the last sample period, Mb/s.
    pub goodput_mbps: Vec<f64>,
    /// Bytes queued at the bottleneck.
    pub queue: usize,
}

/// What a run produced.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// The time series.
    pub samples: Vec<Sample>,
    /// Packets dropped at the full buffer.
    pub drops: u64,
    /// Packets marked CE.
    pub marked: u64,
    /// CNPs sent by the receiver.
    pub cnps: u64,
    /// Packets delivered.
    pub delivered: u64,
}

impl Outcome {
    /// Mean goodput of each flow over samples with `t` in `[from, to)` µs.
    pub fn mean_goodput(&self, from_us: f64, to_us: f64) -> Vec<f64> {
        let s: Vec<&Sample> = self.samples.iter().filter(|s| s.t_us >= from_us && s.t_us < to_us).collect();
        let n = s.first().map_or(0, |x| x.goodput_mbps.len());
        (0..n).map(|i| s.iter().map(|x| x.goodput_mbps[i]).sum::<f64>() / s.len().max(1) as f64).collect()
    }

    /// Largest and mean queue over samples in `[from, to)` µs.
    pub fn queue_stats(&self, from_us: f64, to_us: f64) -> (usize, f64) {
        let q: Vec<usize> = self.samples.iter().filter(|s| s.t_us >= from_us && s.t_us < to_us).map(|s| s.queue).collect();
        (q.iter().copied().max().unwrap_or(0), q.iter().sum::<usize>() as f64 / q.len().max(1) as f64)
    }
}

struct Flow {
    spec: FlowSpec,
    rp: ReactionPoint,
    np: NotificationPoint,
    nic_free: Instant,
    delivered_bytes: u64,
}

/// Run a scenario.
pub fn run(sc: &Scenario) -> Outcome {
    let mut rng = ChaCha8Rng::seed_from_u64(sc.seed);
    let mut flows: Vec<Flow> = sc
        .flows
        .iter()
        .map(|&spec| Flow { spec, rp: ReactionPoint::new(sc.params), np: NotificationPoint::default(), nic_free: Instant::ZERO, delivered_bytes: 0 })
        .collect();
    let mut to_switch: VecDeque<(Instant, usize)> = VecDeque::new(); // (arrival, flow)
    let mut queue: VecDeque<(usize, bool)> = VecDeque::new(); // (flow, ce)
    let mut queued = 0usize;
    let mut busy_until = Instant::ZERO;
    let mut to_receiver: VecDeque<(Instant, usize, bool)> = VecDeque::new();
    let mut cnps: VecDeque<(Instant, usize)> = VecDeque::new();
    let mut out = Outcome::default();
    let end = Instant::ZERO + sc.duration;
    let pkt_time = |mbps: f64| Duration::from_nanos((sc.packet as f64 * 8.0 * 1000.0 / mbps) as u64);
    let np_gap = Duration::from_micros(sc.params.np_min_time_between_cnps_us);
    let mut next_sample = Instant::ZERO + sc.sample;
    let mut now = Instant::ZERO;
    while now < end {
        // Senders.
        for (i, f) in flows.iter_mut().enumerate() {
            let t = now.saturating_duration_since(Instant::ZERO);
            let active = t >= f.spec.start && f.spec.stop.is_none_or(|s| t < s);
            f.rp.handle_timeout(now);
            if active && f.nic_free <= now && f.rp.may_send(now) {
                f.rp.on_sent(now, sc.packet);
                f.nic_free = now + pkt_time(sc.link_mbps);
                to_switch.push_back((now + sc.hop_delay, i));
            }
        }
        // Switch: enqueue with RED marking, tail drop; serve at link rate.
        while to_switch.front().is_some_and(|&(t, _)| t <= now) {
            let Some((_, i)) = to_switch.pop_front() else { break };
            if queued + sc.packet > sc.buffer {
                out.drops += 1;
                continue;
            }
            let ce = rng.gen::<f64>() < sc.red.probability(queued);
            out.marked += u64::from(ce);
            queue.push_back((i, ce));
            queued += sc.packet;
        }
        if busy_until <= now {
            if let Some((i, ce)) = queue.pop_front() {
                queued -= sc.packet;
                busy_until = now + pkt_time(sc.link_mbps);
                to_receiver.push_back((busy_until + sc.hop_delay, i, ce));
            }
        }
        // Receiver: goodput, NP.
        while to_receiver.front().is_some_and(|&(t, _, _)| t <= now) {
            let Some((_, i, ce)) = to_receiver.pop_front() else { break };
            out.delivered += 1;
            flows[i].delivered_bytes += sc.packet as u64;
            if ce && flows[i].np.on_ce(now, np_gap) {
                out.cnps += 1;
                cnps.push_back((now + sc.cnp_delay, i));
            }
        }
        while cnps.front().is_some_and(|&(t, _)| t <= now) {
            let Some((_, i)) = cnps.pop_front() else { break };
            flows[i].rp.on_cnp(now);
        }
        if now >= next_sample {
            let secs = sc.sample.as_secs_f64();
            let t = now.saturating_duration_since(Instant::ZERO);
            out.samples.push(Sample {
                t_us: t.as_secs_f64() * 1e6,
                rate_mbps: flows
                    .iter()
                    .map(|f| if t >= f.spec.start && f.spec.stop.is_none_or(|s| t < s) { f.rp.rate_mbps() } else { 0.0 })
                    .collect(),
                goodput_mbps: flows.iter_mut().map(|f| std::mem::take(&mut f.delivered_bytes) as f64 * 8.0 / secs / 1e6).collect(),
                queue: queued,
            });
            next_sample += sc.sample;
        }
        now += sc.tick;
    }
    out
}
