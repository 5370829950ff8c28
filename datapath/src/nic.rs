//! The NIC: one engine, one port, the queues it shares with applications,
//! and the poll loop that moves everything along.
//!
//! `Nic::poll` is one run-to-completion iteration: ring doorbells (WRs posted
//! by applications go into the engine), receive frames, fire due timers,
//! transmit, deliver completions. A datapath thread calls it in a loop
//! ([`crate::runner`]); an embedding application may call it itself.
//!
//! Locks: the engine sits behind a mutex that only the poller and control
//! operations (create/modify/destroy) take. Posting and polling from
//! application threads never take it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Instant as StdInstant;

use crossbeam_queue::ArrayQueue;
use rocev2::transport::attr::SrqId;
use rocev2::transport::engine::{AsyncEvent, Engine, EngineError};
use rocev2::transport::wr::{Completion, CqId, WcOpcode, WcStatus};
use rocev2::Instant;

use crate::port::{Port, PortInfo};
use crate::queues::{CqRing, QpRings, SrqRing};

/// Frames received per poll iteration at most.
const RX_BUDGET: usize = 64;
/// Frames sent per poll iteration at most.
const TX_BUDGET: usize = 64;

/// What the poller met that was not the engine's business: counted here.
#[derive(Debug, Default)]
pub struct NicStats {
    /// Poll iterations.
    pub polls: AtomicU64,
    /// Frames received from the port.
    pub rx_frames: AtomicU64,
    /// Frames handed to the port.
    pub tx_frames: AtomicU64,
    /// Completions delivered to CQ rings.
    pub completions: AtomicU64,
    /// Completions for a CQ that no longer exists (dropped, counted).
    pub completions_orphaned: AtomicU64,
    /// CQ overruns.
    pub cq_overruns: AtomicU64,
    /// Port errors on transmit or receive.
    pub port_errors: AtomicU64,
    /// Capture-file write failures (capture is switched off after one).
    pub capture_errors: AtomicU64,
    /// WRs the engine refused after the application's post had returned
    /// (completed with an error status, never lost).
    pub posts_refused: AtomicU64,
}

impl NicStats {
    /// Every counter with its name.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        [
            ("polls", g(&self.polls)),
            ("rx_frames", g(&self.rx_frames)),
            ("tx_frames", g(&self.tx_frames)),
            ("completions", g(&self.completions)),
            ("completions_orphaned", g(&self.completions_orphaned)),
            ("cq_overruns", g(&self.cq_overruns)),
            ("port_errors", g(&self.port_errors)),
            ("capture_errors", g(&self.capture_errors)),
            ("posts_refused", g(&self.posts_refused)),
        ]
        .into_iter()
    }
}

enum Doorbell {
    Qp(u32),
    Srq(SrqId),
}

/// One urnic NIC instance.
pub struct Nic {
    engine: Mutex<Engine>,
    port: Mutex<Box<dyn Port>>,
    info: PortInfo,
    qps: RwLock<HashMap<u32, Arc<QpRings>>>,
    srqs: RwLock<HashMap<SrqId, Arc<SrqRing>>>,
    sweep: AtomicBool,
    cqs: RwLock<HashMap<CqId, Arc<CqRing>>>,
    doorbells: ArrayQueue<Doorbell>,
    events: ArrayQueue<AsyncEvent>,
    epoch: StdInstant,
    link_up: AtomicBool,
    capture: Mutex<Option<crate::capture::PcapWriter>>,
    /// Counters.
    pub stats: NicStats,
}

/// Lock a mutex, recovering the data if a panicking thread poisoned it.
fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Nic {
    /// A NIC running `engine` on `port`. `max_queues` bounds QPs + SRQs.
    pub fn new(engine: Engine, port: Box<dyn Port>, max_queues: usize) -> Nic {
        let info = port.info();
        Nic {
            engine: Mutex::new(engine),
            port: Mutex::new(port),
            info,
            qps: RwLock::new(HashMap::new()),
            srqs: RwLock::new(HashMap::new()),
            sweep: AtomicBool::new(false),
            cqs: RwLock::new(HashMap::new()),
            doorbells: ArrayQueue::new(max_queues.max(16) * 2),
            events: ArrayQueue::new(1024),
            epoch: StdInstant::now(),
            link_up: AtomicBool::new(true),
            capture: Mutex::new(None),
            stats: NicStats::default(),
        }
    }

    /// The port's addresses.
    pub fn port_info(&self) -> PortInfo {
        self.info
    }

    /// Capture every frame sent and received from now on into a pcap file
    /// at `path` (`--pcap FILE`); `None` stops capturing (and flushes).
    pub fn set_capture(&self, path: Option<&std::path::Path>) -> std::io::Result<()> {
        let w = match path {
            Some(p) => Some(crate::capture::PcapWriter::create(p)?),
            None => None,
        };
        *lock(&self.capture) = w;
        Ok(())
    }

    /// Whether the port's link was up at the last poll.
    pub fn link_up(&self) -> bool {
        self.link_up.load(Ordering::Acquire)
    }

    /// Run `f` with the port locked (port counters and controls).
    pub fn with_port<R>(&self, f: impl FnOnce(&mut dyn Port) -> R) -> R {
        let mut p = lock(&self.port);
        f(&mut **p)
    }

    /// The engine's notion of now.
    pub fn now(&self) -> Instant {
        Instant::from_nanos(self.epoch.elapsed().as_nanos() as u64)
    }

    /// Run `f` with the engine locked (control operations).
    pub fn with_engine<R>(&self, f: impl FnOnce(&mut Engine) -> R) -> R {
        f(&mut lock(&self.engine))
    }

    /// Make a QP's rings visible to the poller.
    pub fn attach_qp(&self, rings: Arc<QpRings>) {
        self.qps.write().unwrap_or_else(|e| e.into_inner()).insert(rings.qpn, rings);
    }

    /// Forget a QP's rings (after the engine destroyed the QP).
    pub fn detach_qp(&self, qpn: u32) {
        self.qps.write().unwrap_or_else(|e| e.into_inner()).remove(&qpn);
    }

    /// Make an SRQ's ring visible to the poller.
    pub fn attach_srq(&self, ring: Arc<SrqRing>) {
        self.srqs.write().unwrap_or_else(|e| e.into_inner()).insert(ring.id, ring);
    }

    /// Forget an SRQ's ring.
    pub fn detach_srq(&self, id: SrqId) {
        self.srqs.write().unwrap_or_else(|e| e.into_inner()).remove(&id);
    }

    /// Make a CQ's ring visible to the poller.
    pub fn attach_cq(&self, ring: Arc<CqRing>) {
        self.cqs.write().unwrap_or_else(|e| e.into_inner()).insert(ring.id, ring);
    }

    /// Forget a CQ's ring.
    pub fn detach_cq(&self, id: CqId) {
        self.cqs.write().unwrap_or_else(|e| e.into_inner()).remove(&id);
    }

    /// Tell the poller that `rings` has new WRs (the doorbell). Lock-free.
    pub fn ring_qp(&self, rings: &QpRings) {
        if !rings.rung.swap(true, Ordering::AcqRel) && self.doorbells.push(Doorbell::Qp(rings.qpn)).is_err() {
            // More queues than the doorbell queue holds: the poller sweeps
            // every queue once instead.
            self.sweep.store(true, Ordering::Release);
        }
    }

    /// Tell the poller that an SRQ has new receive WRs. Lock-free.
    pub fn ring_srq(&self, ring: &SrqRing) {
        if !ring.rung.swap(true, Ordering::AcqRel) && self.doorbells.push(Doorbell::Srq(ring.id)).is_err() {
            self.sweep.store(true, Ordering::Release);
        }
    }

    /// Next asynchronous event, if any (`ibv_get_async_event`, non-blocking).
    pub fn poll_async_event(&self) -> Option<AsyncEvent> {
        self.events.pop()
    }

    /// One poll iteration. Returns how much work it did (0 = idle).
    pub fn poll(&self) -> usize {
        self.stats.polls.fetch_add(1, Ordering::Relaxed);
        let mut engine = lock(&self.engine);
        let mut port = lock(&self.port);
        let mut work = self.ring_doorbells(&mut engine);
        let now = self.now();

        // Link state changes become async events (IBV_EVENT_PORT_ACTIVE/ERR).
        let up = port.link_up();
        if self.link_up.swap(up, Ordering::AcqRel) != up {
            let _ = self.events.push(if up { AsyncEvent::PortActive } else { AsyncEvent::PortError });
            work += 1;
        }

        let mut capture = lock(&self.capture);
        // Receive.
        let rx = {
            let engine = &mut *engine;
            let capture = &mut *capture;
            port.receive(RX_BUDGET, &mut |frame| {
                if let Some(c) = capture.as_mut() {
                    if c.write(frame).is_err() {
                        self.stats.capture_errors.fetch_add(1, Ordering::Relaxed);
                        *capture = None;
                    }
                }
                engine.handle_frame(now, frame)
            })
        };
        match rx {
            Ok(n) => {
                work += n;
                self.stats.rx_frames.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(_) => {
                self.stats.port_errors.fetch_add(1, Ordering::Relaxed);
            }
        }

        // Timers.
        if engine.next_timeout().is_some_and(|t| t <= now) {
            engine.handle_timeout(now);
            work += 1;
        }

        // Transmit.
        let mut sent = 0;
        while sent < TX_BUDGET {
            let engine = &mut *engine;
            let capture = &mut *capture;
            let mut fill = |buf: &mut [u8]| {
                let n = engine.poll_transmit(now, buf)?;
                if let Some(c) = capture.as_mut() {
                    if c.write(&buf[..n]).is_err() {
                        self.stats.capture_errors.fetch_add(1, Ordering::Relaxed);
                        *capture = None;
                    }
                }
                Some(n)
            };
            match port.transmit_with(&mut fill) {
                Ok(true) => sent += 1,
                Ok(false) => break,
                Err(_) => {
                    self.stats.port_errors.fetch_add(1, Ordering::Relaxed);
                    break;
                }
            }
        }
        if sent > 0 && port.flush().is_err() {
            self.stats.port_errors.fetch_add(1, Ordering::Relaxed);
        }
        self.stats.tx_frames.fetch_add(sent as u64, Ordering::Relaxed);
        work += sent;
        drop(port);
        drop(capture);

        // Completions and events.
        while let Some(c) = engine.poll_completion() {
            self.deliver(c);
            work += 1;
        }
        while let Some(ev) = engine.poll_event() {
            let _ = self.events.push(ev);
            work += 1;
        }
        work
    }

    /// Take posted WRs from rung QPs and SRQs into the engine.
    fn ring_doorbells(&self, engine: &mut Engine) -> usize {
        let mut work = 0;
        if self.sweep.swap(false, Ordering::AcqRel) {
            let qps: Vec<_> = self.qps.read().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
            for q in qps {
                work += self.drain_qp(engine, &q);
            }
            let srqs: Vec<_> = self.srqs.read().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
            for r in srqs {
                work += self.drain_srq(engine, &r);
            }
        }
        let n = self.doorbells.len();
        for _ in 0..n {
            let Some(db) = self.doorbells.pop() else { break };
            match db {
                Doorbell::Qp(qpn) => {
                    let rings = self.qps.read().unwrap_or_else(|e| e.into_inner()).get(&qpn).cloned();
                    if let Some(rings) = rings {
                        work += self.drain_qp(engine, &rings);
                    }
                }
                Doorbell::Srq(id) => {
                    let ring = self.srqs.read().unwrap_or_else(|e| e.into_inner()).get(&id).cloned();
                    if let Some(ring) = ring {
                        work += self.drain_srq(engine, &ring);
                    }
                }
            }
        }
        work
    }

    fn drain_qp(&self, engine: &mut Engine, rings: &QpRings) -> usize {
        let mut work = 0;
        rings.rung.store(false, Ordering::Release);
        while let Some(wr) = rings.recv.pop() {
            work += 1;
            let wr_id = wr.wr_id;
            if let Err(e) = engine.post_recv(rings.qpn, wr) {
                self.refuse(rings, wr_id, WcOpcode::Recv, e, true);
            }
        }
        while let Some(wr) = rings.send.pop() {
            work += 1;
            let wr_id = wr.wr_id;
            let opcode = wr.op.wc_opcode();
            if let Err(e) = engine.post_send(rings.qpn, wr) {
                self.refuse(rings, wr_id, opcode, e, false);
            }
        }
        work
    }

    fn drain_srq(&self, engine: &mut Engine, ring: &SrqRing) -> usize {
        let mut work = 0;
        ring.rung.store(false, Ordering::Release);
        while let Some(wr) = ring.recv.pop() {
            work += 1;
            // An SRQ WR has no QP to complete on if the engine refuses it (the
            // verbs layer checks depth and SGE count first); count it.
            if engine.post_srq_recv(ring.id, wr).is_err() {
                self.stats.posts_refused.fetch_add(1, Ordering::Relaxed);
            }
        }
        work
    }

    /// A WR the application posted successfully but the engine refused (the
    /// QP changed state in between): complete it with an error, never drop it.
    fn refuse(&self, rings: &QpRings, wr_id: u64, opcode: WcOpcode, err: EngineError, recv: bool) {
        self.stats.posts_refused.fetch_add(1, Ordering::Relaxed);
        let _ = err;
        let status = WcStatus::LocQpOpErr;
        let cq = if recv { rings.recv_cq } else { rings.send_cq };
        self.deliver(Completion::error(cq, rings.qpn, wr_id, opcode, status));
    }

    fn deliver(&self, c: Completion) {
        let ring = self.cqs.read().unwrap_or_else(|e| e.into_inner()).get(&c.cq).cloned();
        match ring {
            Some(ring) => {
                self.stats.completions.fetch_add(1, Ordering::Relaxed);
                if !ring.push(c.wc, c.solicited) {
                    self.stats.cq_overruns.fetch_add(1, Ordering::Relaxed);
                }
            }
            None => {
                self.stats.completions_orphaned.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
