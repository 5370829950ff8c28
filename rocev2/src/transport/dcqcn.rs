//! DCQCN congestion control: the notification point (NP) and the reaction
//! point (RP), sans-IO, driven by explicit `now`.
//!
//! DCQCN (Zhu et al., "Congestion Control for Large-Scale RDMA Deployments",
//! SIGCOMM 2015) is what ConnectX NICs run:
//! - a switch (the congestion point) marks ECN-capable packets CE when its
//!   queue grows (RED: never below Kmin, always above Kmax, with probability
//!   rising to Pmax in between);
//! - the receiver's NP answers CE-marked packets of a QP with a CNP (BTH
//!   opcode 0x81) to the sending QP, at most one per QP per
//!   `np_min_time_between_cnps`;
//! - the sender's RP keeps a per-QP rate limiter: a CNP cuts the current
//!   rate by α/2 (α estimates how congested the path is); without CNPs the
//!   rate recovers towards the target (fast recovery), then raises the target
//!   additively and then hyper-additively, driven by a timer and a byte
//!   counter.
//!
//! Parameter names and defaults are the vendor knobs of ConnectX-4 and
//! later (NVIDIA "DCQCN parameters": `rpg_*`, `dce_tcp_*`, `min_time_between_cnps`,
//! `cnp_dscp`), in the units documented there, except `np_min_time_between_cnps`
//! whose default here is 50 µs.

use core::time::Duration;

use crate::time::Instant;

/// DCQCN parameters (vendor names; rates in Mb/s as the vendor documents them).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DcqcnParams {
    /// Whether the RP limits the rate at all (DCQCN off: CNPs are only counted).
    pub enabled: bool,
    /// Line rate of the port, Mb/s (the rate a QP starts at and never exceeds).
    pub line_rate_mbps: f64,
    /// `rpg_time_reset`: rate-increase timer period, µs (default 300).
    pub rpg_time_reset_us: u64,
    /// `rpg_byte_reset`: bytes sent between byte-counter rate increases (default 32767).
    pub rpg_byte_reset: u64,
    /// `rpg_threshold`: increase events before additive increase (F, default 1).
    pub rpg_threshold: u32,
    /// `rpg_ai_rate`: additive increase, Mb/s (default 5).
    pub rpg_ai_rate_mbps: f64,
    /// `rpg_hai_rate`: hyper increase, Mb/s (default 50).
    pub rpg_hai_rate_mbps: f64,
    /// `rpg_min_rate`: the rate never goes below this, Mb/s (default 1).
    pub rpg_min_rate_mbps: f64,
    /// `rpg_min_dec_fac`: one cut keeps at least this percentage of the rate (default 50).
    pub rpg_min_dec_fac: u32,
    /// `rpg_gd`: rate cut = rate · α / 2^rpg_gd with α in 1/1024 units (default 11: α/2).
    pub rpg_gd: u32,
    /// `dce_tcp_g`: α update weight, x/1024 (default 1019).
    pub dce_tcp_g: u32,
    /// `dce_tcp_rtt`: α update period, µs (default 1).
    pub dce_tcp_rtt_us: u64,
    /// `initial_alpha_value`: α at the first CNP, x/1024 (default 1023).
    pub initial_alpha_value: u32,
    /// `rate_reduce_monitor_period`: at most one cut per this many µs (default 4).
    pub rate_reduce_monitor_period_us: u64,
    /// `clamp_tgt_rate`: a cut also sets the target to the current rate (default false:
    /// the target is set to the rate before the cut).
    pub clamp_tgt_rate: bool,
    /// NP: at most one CNP per QP per this many µs (50).
    pub np_min_time_between_cnps_us: u64,
    /// NP: DSCP of the CNPs we send (`cnp_dscp`, default 48).
    pub cnp_dscp: u8,
}

impl Default for DcqcnParams {
    fn default() -> Self {
        DcqcnParams {
            enabled: true,
            line_rate_mbps: 10_000.0,
            rpg_time_reset_us: 300,
            rpg_byte_reset: 32767,
            rpg_threshold: 1,
            rpg_ai_rate_mbps: 5.0,
            rpg_hai_rate_mbps: 50.0,
            rpg_min_rate_mbps: 1.0,
            rpg_min_dec_fac: 50,
            rpg_gd: 11,
            dce_tcp_g: 1019,
            dce_tcp_rtt_us: 1,
            initial_alpha_value: 1023,
            rate_reduce_monitor_period_us: 4,
            clamp_tgt_rate: false,
            np_min_time_between_cnps_us: 50,
            cnp_dscp: 48,
        }
    }
}

impl DcqcnParams {
    /// The settings of the DCQCN paper's evaluation (Zhu et al. 2015,
    /// section 5: g = 1/256, α and rate timers 55 µs, byte counter 10 MB,
    /// F = 5, R_AI 40 Mb/s, R_HAI 10x that, CNPs at most every 50 µs),
    /// scaled to `line_rate_mbps`. The simulations run with these.
    pub fn paper(line_rate_mbps: f64) -> DcqcnParams {
        DcqcnParams {
            line_rate_mbps,
            rpg_time_reset_us: 55,
            rpg_byte_reset: 10 << 20,
            rpg_threshold: 5,
            rpg_ai_rate_mbps: 40.0 * line_rate_mbps / 40_000.0,
            rpg_hai_rate_mbps: 400.0 * line_rate_mbps / 40_000.0,
            dce_tcp_g: 1020,
            dce_tcp_rtt_us: 55,
            np_min_time_between_cnps_us: 50,
            ..DcqcnParams::default()
        }
    }
}

/// Counters of one reaction point.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RpStats {
    /// CNPs received.
    pub cnps: u64,
    /// Rate cuts made.
    pub cuts: u64,
    /// CNPs within `rate_reduce_monitor_period` of the last cut (no cut).
    pub cnps_ignored: u64,
    /// Rate increase events (timer or byte counter).
    pub increases: u64,
}

/// The reaction point of one QP: a rate limiter paced per packet.
#[derive(Clone, Debug)]
pub struct ReactionPoint {
    p: DcqcnParams,
    /// Current rate Rc, Mb/s.
    rc: f64,
    /// Target rate Rt, Mb/s.
    rt: f64,
    /// α in [0, 1].
    alpha: f64,
    /// Whether the limiter is engaged (after the first CNP, until the rate
    /// is back at line rate).
    limited: bool,
    cnp_in_period: bool,
    next_alpha_update: Option<Instant>,
    last_cut: Option<Instant>,
    next_timer: Option<Instant>,
    bytes: u64,
    timer_stage: u32,
    byte_stage: u32,
    /// Earliest departure of the next packet (pacing).
    next_send: Instant,
    /// Counters.
    pub stats: RpStats,
}

impl ReactionPoint {
    /// A reaction point at line rate.
    pub fn new(p: DcqcnParams) -> ReactionPoint {
        ReactionPoint {
            p,
            rc: p.line_rate_mbps,
            rt: p.line_rate_mbps,
            alpha: f64::from(p.initial_alpha_value) / 1024.0,
            limited: false,
            cnp_in_period: false,
            next_alpha_update: None,
            last_cut: None,
            next_timer: None,
            bytes: 0,
            timer_stage: 0,
            byte_stage: 0,
            next_send: Instant::ZERO,
            stats: RpStats::default(),
        }
    }

    /// Current rate, Mb/s.
    pub fn rate_mbps(&self) -> f64 {
        self.rc
    }

    /// Target rate, Mb/s.
    pub fn target_mbps(&self) -> f64 {
        self.rt
    }

    /// α.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// Whether the limiter is engaged.
    pub fn is_limited(&self) -> bool {
        self.limited
    }

    /// The parameters.
    pub fn params(&self) -> &DcqcnParams {
        &self.p
    }

    /// A CNP for this QP arrived (DCQCN RP, "rate decrease").
    pub fn on_cnp(&mut self, now: Instant) {
        self.stats.cnps += 1;
        if !self.p.enabled {
            return;
        }
        self.catch_up_alpha(now);
        self.cnp_in_period = true;
        let monitor = Duration::from_micros(self.p.rate_reduce_monitor_period_us);
        if self.last_cut.is_some_and(|t| now < t + monitor) {
            self.stats.cnps_ignored += 1;
            return;
        }
        if !self.limited {
            // First CNP of an episode: α starts at initial_alpha_value.
            self.limited = true;
            self.alpha = f64::from(self.p.initial_alpha_value) / 1024.0;
            self.next_alpha_update = Some(now + Duration::from_micros(self.p.dce_tcp_rtt_us.max(1)));
        }
        self.last_cut = Some(now);
        self.stats.cuts += 1;
        // Rt ← Rc (or clamp), Rc ← Rc·(1 − α/2^(rpg_gd−10)), bounded by rpg_min_dec_fac.
        let old = self.rc;
        if self.p.clamp_tgt_rate || self.rt > old {
            self.rt = old;
        }
        let cut = self.alpha * 1024.0 / f64::from(1u32 << self.p.rpg_gd.min(31));
        let keep = (1.0 - cut).max(f64::from(self.p.rpg_min_dec_fac.min(100)) / 100.0);
        self.rc = (old * keep).max(self.p.rpg_min_rate_mbps);
        // α grows on a CNP: α ← g·α + (1 − g).
        let g = f64::from(self.p.dce_tcp_g) / 1024.0;
        self.alpha = (g * self.alpha + (1.0 - g)).min(1.0);
        // The increase machinery restarts.
        self.bytes = 0;
        self.timer_stage = 0;
        self.byte_stage = 0;
        self.next_timer = Some(now + Duration::from_micros(self.p.rpg_time_reset_us));
    }

    /// `bytes` left on the wire at `now` (pacing and the byte counter).
    pub fn on_sent(&mut self, now: Instant, bytes: usize) {
        if !self.limited {
            return;
        }
        // Mb/s is bits per µs: the packet occupies bytes·8/rate µs.
        let start = if self.next_send > now { self.next_send } else { now };
        self.next_send = start + Duration::from_nanos((bytes as f64 * 8.0 * 1000.0 / self.rc) as u64);
        self.bytes += bytes as u64;
        if self.bytes >= self.p.rpg_byte_reset {
            self.bytes = 0;
            self.byte_stage += 1;
            self.increase();
        }
    }

    /// Whether a packet may leave at `now`.
    pub fn may_send(&self, now: Instant) -> bool {
        !self.limited || now >= self.next_send
    }

    /// When the RP next needs `handle_timeout` (its rate-increase timer) or
    /// lets a paced packet go (if that is after `now`).
    pub fn next_event(&self, now: Instant) -> Option<Instant> {
        if !self.limited {
            return None;
        }
        let mut t = self.next_timer;
        if self.next_send > now {
            t = Some(t.map_or(self.next_send, |x| x.min(self.next_send)));
        }
        t
    }

    /// Apply the α updates of every `dce_tcp_rtt` period that ended by
    /// `now` (lazily, so no timer fires every microsecond): up once if a CNP
    /// came in the first of them, down (×g) for each of the others.
    fn catch_up_alpha(&mut self, now: Instant) {
        let Some(t) = self.next_alpha_update else { return };
        if t > now {
            return;
        }
        let period = self.p.dce_tcp_rtt_us.max(1) * 1000;
        let g = f64::from(self.p.dce_tcp_g) / 1024.0;
        let periods = (now.as_nanos() - t.as_nanos()) / period + 1;
        let mut k = periods;
        if self.cnp_in_period {
            self.alpha = g * self.alpha + (1.0 - g);
            self.cnp_in_period = false;
            k -= 1;
        }
        self.alpha *= g.powf(k.min(1 << 20) as f64);
        self.next_alpha_update = Some(Instant::from_nanos(t.as_nanos() + periods * period));
    }

    /// Fire due timers (the rate-increase timer; α catches up).
    pub fn handle_timeout(&mut self, now: Instant) {
        if !self.limited {
            return;
        }
        self.catch_up_alpha(now);
        let reset = Duration::from_micros(self.p.rpg_time_reset_us);
        while let Some(t) = self.next_timer.filter(|&t| t <= now) {
            self.timer_stage += 1;
            self.increase();
            self.next_timer = if self.limited { Some(t + reset) } else { None };
        }
    }

    /// One rate-increase event (timer or byte counter).
    fn increase(&mut self) {
        self.stats.increases += 1;
        let f = self.p.rpg_threshold;
        let (t, b) = (self.timer_stage, self.byte_stage);
        if t.max(b) < f {
            // Fast recovery: towards the target.
        } else if t.min(b) > f {
            // Hyper increase.
            let i = f64::from(t.min(b) - f);
            self.rt += i * self.p.rpg_hai_rate_mbps;
        } else {
            // Additive increase.
            self.rt += self.p.rpg_ai_rate_mbps;
        }
        self.rt = self.rt.min(self.p.line_rate_mbps);
        self.rc = ((self.rt + self.rc) / 2.0).min(self.p.line_rate_mbps);
        if self.rc >= self.p.line_rate_mbps * 0.999 {
            // Back at line rate: the limiter disengages.
            self.rc = self.p.line_rate_mbps;
            self.rt = self.p.line_rate_mbps;
            self.limited = false;
            self.next_timer = None;
            self.next_alpha_update = None;
        }
    }
}

/// The notification point of one QP: rate-limits CNPs.
#[derive(Clone, Copy, Debug, Default)]
pub struct NotificationPoint {
    last_cnp: Option<Instant>,
    /// CE-marked packets seen.
    pub ce_packets: u64,
    /// CNPs decided.
    pub cnps_sent: u64,
}

impl NotificationPoint {
    /// A CE-marked packet of this QP arrived: whether to send a CNP now.
    pub fn on_ce(&mut self, now: Instant, min_interval: Duration) -> bool {
        self.ce_packets += 1;
        if self.last_cnp.is_some_and(|t| now < t + min_interval) {
            return false;
        }
        self.last_cnp = Some(now);
        self.cnps_sent += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Instant {
        Instant::from_nanos(n * 1000)
    }

    #[test]
    fn first_cnp_halves_the_rate_and_sets_the_target() {
        let mut rp = ReactionPoint::new(DcqcnParams { line_rate_mbps: 1000.0, ..DcqcnParams::default() });
        assert!(rp.may_send(us(0)));
        rp.on_cnp(us(10));
        // α = 1023/1024: cut ≈ α/2, bounded by min_dec_fac 50%.
        assert!((rp.rate_mbps() - 500.0).abs() < 1.0, "{}", rp.rate_mbps());
        assert_eq!(rp.target_mbps(), 1000.0);
        assert!(rp.is_limited());
        // A second CNP within the 4 µs monitor period is ignored.
        rp.on_cnp(us(12));
        assert_eq!(rp.stats.cnps_ignored, 1);
        rp.on_cnp(us(15));
        assert!(rp.rate_mbps() < 260.0);
        // The target drops to the rate before the cut.
        assert!((rp.target_mbps() - 500.0).abs() < 1.0, "{}", rp.target_mbps());
    }

    #[test]
    fn pacing_spaces_packets_at_the_current_rate() {
        let mut rp = ReactionPoint::new(DcqcnParams { line_rate_mbps: 1000.0, ..DcqcnParams::default() });
        rp.on_cnp(us(0));
        let rate = rp.rate_mbps(); // ~500 Mb/s: 1000 bytes = 16 µs
        rp.on_sent(us(0), 1000);
        assert!(!rp.may_send(us(1)));
        let gap_us = 8000.0 / rate;
        assert!(rp.may_send(Instant::from_nanos((gap_us * 1000.0) as u64 + 1)));
        assert!(rp.next_event(us(1)).is_some());
    }

    #[test]
    fn without_cnps_the_rate_recovers_to_line_rate_and_disengages() {
        let p = DcqcnParams { line_rate_mbps: 1000.0, ..DcqcnParams::default() };
        let mut rp = ReactionPoint::new(p);
        rp.on_cnp(us(0));
        let mut now = us(0);
        let mut rates = Vec::new();
        for _ in 0..2000 {
            now += Duration::from_micros(50);
            rp.handle_timeout(now);
            rates.push(rp.rate_mbps());
            if !rp.is_limited() {
                break;
            }
        }
        assert!(!rp.is_limited(), "still limited at {} Mb/s", rp.rate_mbps());
        assert!(rates.windows(2).all(|w| w[1] >= w[0] - 1e-9), "recovery is monotonic");
        // α decays without CNPs.
        assert!(rp.alpha() < 0.5);
    }

    #[test]
    fn the_rate_never_goes_below_the_minimum() {
        let p = DcqcnParams { line_rate_mbps: 100.0, rpg_min_rate_mbps: 10.0, ..DcqcnParams::default() };
        let mut rp = ReactionPoint::new(p);
        for i in 0..100 {
            rp.on_cnp(us(i * 10));
        }
        assert_eq!(rp.rate_mbps(), 10.0);
    }

    #[test]
    fn disabled_rp_counts_cnps_but_never_limits() {
        let mut rp = ReactionPoint::new(DcqcnParams { enabled: false, ..DcqcnParams::default() });
        rp.on_cnp(us(1));
        assert_eq!(rp.stats.cnps, 1);
        assert!(!rp.is_limited());
        assert!(rp.may_send(us(1)));
    }

    #[test]
    fn np_sends_at_most_one_cnp_per_interval() {
        let mut np = NotificationPoint::default();
        let gap = Duration::from_micros(50);
        assert!(np.on_ce(us(0), gap));
        assert!(!np.on_ce(us(10), gap));
        assert!(!np.on_ce(us(49), gap));
        assert!(np.on_ce(us(50), gap));
        assert_eq!((np.ce_packets, np.cnps_sent), (4, 2));
    }
}
