//! The CM agent in a seeded lossy network (loss, duplication, reordering by
//! jitter larger than the response timeout), in virtual time: two agents,
//! several connections and SIDR exchanges at once, consumers that accept
//! late (MRA), reject, or disconnect from either side, both at once too.
//!
//! Checked on every seed: every connect ends exactly once (established on
//! both sides, rejected, or timed out), every established connection is
//! disconnected exactly once on each side and leaves timewait, every SIDR
//! request is answered or times out exactly once, and when the network is
//! quiet no id is left: no half-open state outlives its timeout.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rocev2::cm::msg::{reason, sidr_status};
use rocev2::cm::{AcceptParams, Cm, CmConfig, CmEvent, CmId, ConnectParams, Gid, PortSpace, Transmit, Waited};
use rocev2::Instant;

const GID_A: Gid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1];
const GID_B: Gid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2];

fn config(guid: u64) -> CmConfig {
    CmConfig {
        local_ca_guid: guid,
        response_timeout: 10, // 4.2 ms
        max_retries: 15,
        mra_service_timeout: 14, // 67 ms
        timewait: Duration::from_millis(50),
        max_ids: 64,
    }
}

fn connect_params(qpn: u32, service_id: u64) -> ConnectParams {
    ConnectParams { starting_psn: qpn * 7, private_data: vec![qpn as u8; 40], ..ConnectParams::rc(service_id, GID_A, GID_B, qpn) }
}

struct Link {
    loss: f64,
    dup: f64,
    jitter_ns: u64,
}

/// MADs in flight: (arrival, sequence) → (to B?, MAD).
struct Net {
    flight: BTreeMap<(Instant, u64), (bool, Transmit)>,
    seq: u64,
}

impl Net {
    fn send(&mut self, rng: &mut ChaCha8Rng, link: &Link, now: Instant, to_b: bool, t: Transmit) {
        if rng.gen_bool(link.loss) {
            return;
        }
        let copies = if rng.gen_bool(link.dup) { 2 } else { 1 };
        for _ in 0..copies {
            let at = now + Duration::from_nanos(20_000 + rng.gen_range(0..=link.jitter_ns));
            self.seq += 1;
            self.flight.insert((at, self.seq), (to_b, t.clone()));
        }
    }
}

#[derive(Default, Debug)]
struct Outcomes {
    /// Per id: the events in order.
    events: HashMap<CmId, Vec<&'static str>>,
}

impl Outcomes {
    fn record(&mut self, ev: &CmEvent) -> CmId {
        let (id, name) = match ev {
            CmEvent::ConnectRequest { id, .. } => (*id, "request"),
            CmEvent::ConnectReply { id, .. } => (*id, "reply"),
            CmEvent::Established { id } => (*id, "established"),
            CmEvent::Rejected { id, .. } => (*id, "rejected"),
            CmEvent::TimedOut { id, .. } => (*id, "timed out"),
            CmEvent::Disconnected { id } => (*id, "disconnected"),
            CmEvent::TimewaitExit { id } => (*id, "timewait exit"),
            CmEvent::SidrRequest { id, .. } => (*id, "sidr request"),
            CmEvent::SidrReply { id, .. } => (*id, "sidr reply"),
        };
        self.events.entry(id).or_default().push(name);
        id
    }
}

/// What one seed did, for the totals.
#[derive(Default, Debug)]
struct Tally {
    established: usize,
    rejected: usize,
    timed_out: usize,
    sidr_answered: usize,
    mads: u64,
    retransmits: u64,
    duplicates: u64,
}

fn run(seed: u64, link: &Link) -> Tally {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut a = Cm::with_seed(config(0xA), seed ^ 0xA);
    let mut b = Cm::with_seed(config(0xB), seed ^ 0xB);
    let service = PortSpace::Tcp.service_id(7174);
    let udp_service = PortSpace::Udp.service_id(7174);
    b.listen(service, 16).unwrap();
    b.listen(udp_service, 16).unwrap();
    let mut net = Net { flight: BTreeMap::new(), seq: 0 };
    let mut now = Instant::from_nanos(1_000_000);
    let (mut ea, mut eb) = (Outcomes::default(), Outcomes::default());

    // Connections: QPN → active id; one to a service nobody listens on.
    let n = rng.gen_range(1..=6u32);
    let mut active: HashMap<CmId, u32> = HashMap::new();
    for i in 0..n {
        let sid = if i == 0 && rng.gen_bool(0.2) { PortSpace::Tcp.service_id(1) } else { service };
        let id = a.connect(now, &connect_params(0x100 + i, sid)).unwrap();
        active.insert(id, 0x100 + i);
    }
    let sidrs: Vec<CmId> = (0..rng.gen_range(0..=2)).map(|_| a.sidr_request(now, udp_service, GID_A, GID_B, &[1, 2, 3]).unwrap()).collect();

    // Consumer plans: B accepts after a delay (sometimes longer than the
    // response timeout: the REQ is retransmitted and B sends an MRA) or
    // rejects; established connections are disconnected later by A, B or both.
    let mut b_todo: BTreeMap<(Instant, CmId), &'static str> = BTreeMap::new();
    let mut a_todo: BTreeMap<(Instant, CmId), &'static str> = BTreeMap::new();
    let mut b_qpn: HashMap<CmId, u32> = HashMap::new();
    // Who disconnects each connection: 0 A, 1 B, 2 both (at nearby times).
    let plan: HashMap<u32, u8> = (0..n).map(|i| (0x100 + i, rng.gen_range(0..3))).collect();
    let end = now + Duration::from_secs(120);
    loop {
        // Drain outputs.
        while let Some(t) = a.poll_transmit() {
            net.send(&mut rng, link, now, true, t);
        }
        while let Some(t) = b.poll_transmit() {
            net.send(&mut rng, link, now, false, t);
        }
        while let Some(ev) = a.poll_event() {
            let id = ea.record(&ev);
            match ev {
                CmEvent::ConnectReply { .. } => {
                    a.ready_to_use(now, id, &[9]).unwrap();
                }
                CmEvent::Established { .. } if plan[&active[&id]] != 1 => {
                    let when = now + Duration::from_millis(rng.gen_range(0..40));
                    a_todo.insert((when, id), "disconnect");
                }
                CmEvent::Disconnected { .. } => {
                    // The peer's DREQ (or our DREP): answer (a no-op after ours).
                    a.disconnect(now, id, &[]).unwrap();
                }
                _ => {}
            }
        }
        while let Some(ev) = b.poll_event() {
            let id = eb.record(&ev);
            match ev {
                CmEvent::ConnectRequest { req, .. } => {
                    assert_eq!(&req.private_data[..40], &[req.local_qpn as u8; 40][..], "private data travels");
                    b_qpn.insert(id, req.local_qpn);
                    let when = now + Duration::from_millis(if rng.gen_bool(0.3) { rng.gen_range(5..60) } else { 0 });
                    b_todo.insert((when, id), if rng.gen_bool(0.15) { "reject" } else { "accept" });
                }
                CmEvent::SidrRequest { req, .. } => {
                    assert_eq!(&req.private_data[..3], &[1, 2, 3]);
                    b.sidr_reply(now, id, sidr_status::SUCCESS, 0x777, 0x0123_4567, &[]).unwrap();
                }
                // B disconnects some connections itself, at times A's own
                // DREQ is on its way too.
                CmEvent::Established { .. } if plan[&b_qpn[&id]] != 0 => {
                    let when = now + Duration::from_millis(rng.gen_range(0..40));
                    b_todo.insert((when, id), "disconnect");
                }
                CmEvent::Disconnected { .. } => {
                    b.disconnect(now, id, &[]).unwrap();
                }
                _ => {}
            }
        }
        // Next thing to happen.
        let next = [
            net.flight.keys().next().map(|k| k.0),
            a.next_timeout(),
            b.next_timeout(),
            a_todo.keys().next().map(|k| k.0),
            b_todo.keys().next().map(|k| k.0),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(t) = next else { break };
        assert!(t <= end, "seed {seed}: still busy after 120 s of virtual time");
        now = now.max(t);
        if let Some(e) = net.flight.first_entry() {
            if e.key().0 <= now {
                let (to_b, t) = e.remove();
                let _ = if to_b { b.handle_mad(now, t.src_gid, t.dst_gid, &t.mad) } else { a.handle_mad(now, t.src_gid, t.dst_gid, &t.mad) };
                continue;
            }
        }
        if let Some(e) = b_todo.first_entry() {
            if e.key().0 <= now {
                let ((_, id), what) = e.remove_entry();
                match what {
                    "accept" => {
                        let p = AcceptParams {
                            qpn: b_qpn[&id] + 0x1000,
                            starting_psn: 5,
                            responder_resources: 1,
                            initiator_depth: 1,
                            target_ack_delay: 15,
                            rnr_retry_count: 7,
                            srq: false,
                            private_data: vec![7; 20],
                        };
                        // The REQ may have been given up by then (REJ timeout).
                        let _ = b.accept(now, id, &p);
                    }
                    "reject" => {
                        let _ = b.reject(now, id, b"go away");
                    }
                    _ => {
                        let _ = b.disconnect(now, id, &[]);
                    }
                }
                continue;
            }
        }
        if let Some(e) = a_todo.first_entry() {
            if e.key().0 <= now {
                let ((_, id), _) = e.remove_entry();
                let _ = a.disconnect(now, id, &[]);
                continue;
            }
        }
        a.handle_timeout(now);
        b.handle_timeout(now);
    }

    // Nothing is left: every exchange ended and every timewait ran out.
    assert_eq!((a.live_ids(), b.live_ids()), (0, 0), "seed {seed}: ids left over");

    let mut tally = Tally::default();
    for (&id, &qpn) in &active {
        let evs = &ea.events[&id];
        match evs.as_slice() {
            ["reply", "established", rest @ ..] => {
                assert_eq!(rest, ["disconnected", "timewait exit"], "seed {seed}: A's connection {qpn:#x}: {evs:?}");
                tally.established += 1;
                // B holds the same connection, established and released once.
                let bid = b_qpn.iter().find(|(_, &q)| q == qpn).map(|(&id, _)| id).expect("B saw the REQ");
                let all: Vec<_> = b_qpn.iter().filter(|(_, &q)| q == qpn).map(|(id, _)| (*id, eb.events[id].clone())).collect();
                assert_eq!(all.len(), 1, "seed {seed}: {all:?}");
                assert_eq!(eb.events[&bid], ["request", "established", "disconnected", "timewait exit"], "seed {seed}: B's side of {qpn:#x}");
            }
            ["rejected"] => tally.rejected += 1,
            ["timed out"] => tally.timed_out += 1,
            other => panic!("seed {seed}: A's connection {qpn:#x} saw {other:?}"),
        }
    }
    for id in sidrs {
        match ea.events[&id].as_slice() {
            ["sidr reply"] => tally.sidr_answered += 1,
            ["timed out"] => {}
            other => panic!("seed {seed}: SIDR {id:#x} saw {other:?}"),
        }
    }
    // Each of B's requests ends once: established (matched above), rejected
    // by A's timeout REJ, timed out waiting for the RTU, or rejected by B.
    for (id, evs) in &eb.events {
        assert!(
            matches!(
                evs.as_slice(),
                ["request"]
                    | ["request", "rejected"]
                    | ["request", "timed out"]
                    | ["request", "established", "disconnected", "timewait exit"]
                    | ["sidr request"]
            ),
            "seed {seed}: B's {id:#x} saw {evs:?}"
        );
    }
    let (sa, sb) = (a.stats(), b.stats());
    tally.mads = sa.tx_mads + sb.tx_mads;
    tally.retransmits = sa.tx_retransmits + sb.tx_retransmits;
    tally.duplicates = sa.rx_duplicates + sb.rx_duplicates;
    tally
}

fn seeds() -> u64 {
    std::env::var("URNIC_CM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(300)
}

#[test]
fn lossless_link_establishes_every_accepted_connection() {
    let link = Link { loss: 0.0, dup: 0.0, jitter_ns: 0 };
    let mut t = Tally::default();
    for seed in 0..seeds() {
        let r = run(seed, &link);
        assert_eq!(r.timed_out, 0, "seed {seed}: a timeout on a lossless link");
        t.established += r.established;
        t.rejected += r.rejected;
    }
    assert!(t.established > 0 && t.rejected > 0, "{t:?}");
}

#[test]
fn lossy_duplicating_reordering_link() {
    let link = Link { loss: 0.2, dup: 0.1, jitter_ns: 8_000_000 };
    let mut t = Tally::default();
    for seed in 0..seeds() {
        let r = run(seed, &link);
        t.established += r.established;
        t.rejected += r.rejected;
        t.timed_out += r.timed_out;
        t.sidr_answered += r.sidr_answered;
        t.retransmits += r.retransmits;
        t.mads += r.mads;
        t.duplicates += r.duplicates;
    }
    // The impairments were exercised, and most connections still made it.
    assert!(t.retransmits > 100 && t.duplicates > 100, "{t:?}");
    assert!(t.established > 5 * t.timed_out, "{t:?}");
    assert!(t.sidr_answered > 0, "{t:?}");
    eprintln!("{t:?}");
}

#[test]
fn dead_peer_times_out_and_leaves_nothing() {
    let mut a = Cm::with_seed(config(0xA), 1);
    let mut now = Instant::from_nanos(1);
    let id = a.connect(now, &connect_params(0x10, PortSpace::Tcp.service_id(1))).unwrap();
    let mut reqs = 0;
    while let Some(t) = a.next_timeout() {
        while a.poll_transmit().is_some() {
            reqs += 1;
        }
        now = t;
        a.handle_timeout(now);
    }
    // The REQ and 15 retries, then a REJ "timeout" for the passive side.
    let last = a.poll_transmit().expect("REJ timeout");
    let rej = rocev2::cm::CmMad::parse(&last.mad).unwrap();
    let rocev2::cm::CmMessage::Rej(rej) = rej.msg else { panic!("expected REJ") };
    assert_eq!(rej.reason, reason::TIMEOUT);
    assert_eq!(reqs, 16);
    assert_eq!(a.poll_event(), Some(CmEvent::TimedOut { id, waited: Waited::Rep }));
    assert_eq!(a.live_ids(), 0);
    assert_eq!(a.stats().timeouts, 1);
}
