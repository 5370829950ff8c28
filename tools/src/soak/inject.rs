//! The hostile injector: a thread sending forged RoCEv2 frames at a steady
//! rate through raw AF_PACKET sockets at the soak's devices, aimed at the
//! live RC QPs (their current PSNs, published by the soak loop). The frames
//! come from `rocev2::sim::forge`: every class a third host can send that a
//! receiver following the issue-14 rules refuses or counts without effect
//! (stranger requests, responses and CNPs, rxe `check_addr`; stale and
//! far-ahead spoofed requests, IBTA C9-105; stale and ghost spoofed
//! responses), with correct ICRCs. The classes a receiver cannot tell from
//! its peer (`Attack::model_safe() == false`, `Expect::Accepted`) are left
//! out: they change what happens, by design of an unauthenticated transport.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rocev2::psn::Psn;
use rocev2::sim::forge::{forge, Attack, Expect, Station, VictimView};
use urnic_datapath::raw::RawSender;

use super::pattern::Rng;

/// The attack classes the injector uses: those named in `only` (names as
/// `Attack::name`, or prefixes of them such as `stale_`), all when empty.
pub fn classes(only: &[String]) -> Result<Vec<Attack>, String> {
    let all = safe_classes();
    if only.is_empty() {
        return Ok(all);
    }
    let mut v = Vec::new();
    for n in only {
        let m: Vec<Attack> = all.iter().copied().filter(|a| a.name().starts_with(n.as_str())).collect();
        if m.is_empty() {
            let names: Vec<&str> = all.iter().map(|a| a.name()).collect();
            return Err(format!("no attack class {n:?}; the classes are {}", names.join(", ")));
        }
        v.extend(m.into_iter().filter(|a| !v.contains(a)).collect::<Vec<_>>());
    }
    Ok(v)
}

fn safe_classes() -> Vec<Attack> {
    Attack::ALL
        .iter()
        .copied()
        // SeqNakCopy needs the victim's oldest unacknowledged PSN at the
        // moment the peer's own sequence NAK passes, which the soak does not see.
        .filter(|a| a.model_safe() && a.expect() != Expect::Accepted && *a != Attack::SeqNakCopy)
        .collect()
}

/// The counters that should count `a` at the victim: several when each
/// goes up, one `a|b` label when either does. A frame to an address the
/// device does not have never reaches the engine: the XDP program passes it
/// to the kernel (`xdp_pass_not_ours`).
pub fn counters_of(a: Attack) -> Vec<String> {
    if a == Attack::MisaddressedWrite {
        return vec!["xdp_pass_not_ours".into()];
    }
    match a.expect() {
        Expect::Counted(list) => list.iter().map(|c| c.name().to_string()).collect(),
        Expect::OneOf(list) => vec![list.iter().map(|c| c.name()).collect::<Vec<_>>().join("|")],
        Expect::Accepted => Vec::new(),
    }
}

/// An address on the link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Addr {
    /// MAC.
    pub mac: [u8; 6],
    /// IPv4.
    pub ipv4: [u8; 4],
}

impl Addr {
    fn station(&self) -> Station {
        Station { mac: self.mac, ip: IpAddr::from(self.ipv4) }
    }
}

/// A live RC QP to aim at, as the soak loop last saw it.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    /// Device (0 or 1) the QP is on; its peer is on the other one.
    pub dev: usize,
    /// The QP.
    pub qpn: u32,
    /// Its peer QP.
    pub peer_qpn: u32,
    /// Next PSN it sends.
    pub sq_psn: u32,
    /// Next PSN it expects.
    pub rq_psn: u32,
    /// R_Key of the memory its peer WRITEs, READs and updates (as a sniffer of the traffic knows it).
    pub rkey: u32,
    /// An address in that memory.
    pub va: u64,
}

/// Frames sent per class, and send errors.
pub struct Counts {
    /// The classes, in the order of `sent`.
    pub classes: Vec<Attack>,
    sent: Vec<AtomicU64>,
    /// Frames the raw socket did not take (counted, not retried).
    pub errors: AtomicU64,
    /// Frames forge refused to build (none expected).
    pub forge_errors: AtomicU64,
}

impl Counts {
    fn new(classes: Vec<Attack>) -> Counts {
        let sent = classes.iter().map(|_| AtomicU64::new(0)).collect();
        Counts { classes, sent, errors: AtomicU64::new(0), forge_errors: AtomicU64::new(0) }
    }

    /// Frames of class index `i` sent so far.
    pub fn sent(&self, i: usize) -> u64 {
        self.sent.get(i).map(|a| a.load(Ordering::Relaxed)).unwrap_or(0)
    }

    /// All frames sent so far.
    pub fn total(&self) -> u64 {
        (0..self.sent.len()).map(|i| self.sent(i)).sum()
    }
}

/// The running injector. Stopped and joined on drop.
pub struct Injector {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
    /// What it sent.
    pub counts: Arc<Counts>,
}

/// Where the injector's frames leave from and whom they reach.
pub struct Launcher {
    /// The raw sender (an AF_PACKET socket on the attacker's interface).
    pub tx: RawSender,
    /// Device indexes this socket's link reaches.
    pub reaches: Vec<usize>,
}

impl Injector {
    /// Start sending `rate` frames per second through `launchers` at the
    /// QPs in `targets` (refreshed by the caller while it runs), as `attacker`.
    pub fn start(
        launchers: Vec<Launcher>,
        devs: [Addr; 2],
        attacker: Addr,
        targets: Arc<Mutex<Vec<Target>>>,
        rate: u64,
        seed: u64,
        classes: Vec<Attack>,
    ) -> std::io::Result<Injector> {
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(Counts::new(classes));
        let (stop2, counts2) = (stop.clone(), counts.clone());
        let handle = std::thread::Builder::new().name("soak-injector".into()).spawn(move || {
            let mut rng = Rng::new(seed ^ 0x1bad_c0de);
            let start = Instant::now();
            let mut sent = 0u64;
            let mut frame = Vec::with_capacity(2048);
            let n = counts2.classes.len() as u64;
            while !stop2.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(1));
                let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
                let list: Vec<Target> = targets.lock().map(|t| t.clone()).unwrap_or_default();
                if list.is_empty() || n == 0 {
                    sent = due;
                    continue;
                }
                while sent < due && !stop2.load(Ordering::Relaxed) {
                    sent += 1;
                    let t = list[rng.below(list.len() as u64) as usize];
                    let ci = rng.below(n) as usize;
                    let Some(l) = launchers.iter().find(|l| l.reaches.contains(&t.dev)) else { continue };
                    let view = VictimView {
                        victim: devs[t.dev].station(),
                        peer: devs[1 - t.dev].station(),
                        qpn: t.qpn,
                        peer_qpn: t.peer_qpn,
                        rq_psn: Psn::new(t.rq_psn),
                        sq_psn: Psn::new(t.sq_psn),
                        una: Psn::new(t.sq_psn),
                        rkey: t.rkey,
                        va: t.va,
                    };
                    frame.clear();
                    if forge(counts2.classes[ci], &view, &attacker.station(), rng.next_u64(), &mut frame).is_err() {
                        counts2.forge_errors.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    // The Ethernet source is the sending interface's own MAC, also
                    // when the IP source spoofs the peer: a learning bridge would
                    // otherwise move the peer's MAC to the injector's port and
                    // black-hole the real traffic (MAC spoofing, a different attack
                    // from the transport's). The ICRC does not cover Ethernet.
                    if frame.len() >= 12 {
                        frame[6..12].copy_from_slice(&l.tx.mac());
                    }
                    if l.tx.send(&frame).is_ok() {
                        counts2.sent[ci].fetch_add(1, Ordering::Relaxed);
                    } else {
                        counts2.errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })?;
        Ok(Injector { stop, handle: Some(handle), counts })
    }

    /// Stop and join the thread.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Injector {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_used_is_refused_by_rule_and_has_a_counter() {
        let c = classes(&[]).unwrap();
        assert!(c.len() >= 30, "{c:?}");
        assert_eq!(classes(&["stranger_cnp".into()]).unwrap(), vec![Attack::StrangerCnp]);
        assert!(classes(&["stale_".into()]).unwrap().len() >= 10);
        assert!(classes(&["nonsense".into()]).is_err());
        for a in &c {
            assert!(a.model_safe(), "{a}");
            assert!(!counters_of(*a).is_empty(), "{a}");
        }
        assert!(!c.contains(&Attack::PeerWriteInWindow) && !c.contains(&Attack::PeerErrorNakOutstanding) && !c.contains(&Attack::PeerCnp));
        assert_eq!(counters_of(Attack::StrangerCnp), vec!["rx_wrong_peer".to_string()]);
        assert_eq!(counters_of(Attack::MisaddressedWrite), vec!["xdp_pass_not_ours".to_string()]);
    }
}
