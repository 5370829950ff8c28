//! `urnic perf ...`: perftest-compatible tests (ib_send_bw, ib_write_bw,
//! ib_read_bw, ib_atomic_bw, ib_send_lat, ib_write_lat, ib_read_lat), with
//! perftest's TCP exchange so either side can be perftest on another RoCE
//! device (rxe, ConnectX) or urnic.
//!
//! The exchange, as perftest 6.x does it over TCP port 18515 (checked
//! against captures of ib_*_bw/ib_send_lat between two rxe hosts): the
//! client writes first, the server answers each message.
//! 1. version, 16 bytes (`"6.06"`, NUL-padded);
//! 2. cycle buffer (page size) and cache line size, 4 bytes big-endian each
//!    (both sides take the larger);
//! 3. MTU as the `ibv_mtu` number in ASCII + NUL, 2 bytes (both take the smaller);
//! 4. four "handshakes" of the 108-byte key message
//!    `%04x:%04x:%06x:%06x:%08x:%016llx:` + 16 `%02x:` GID bytes + `%08x:` + NUL
//!    (LID, outstanding reads, QPN, PSN, rkey, vaddr, GID, SRQN): keys, then
//!    three synchronisations around connecting the QPs;
//! 5. the test; for WRITE/READ/ATOMIC bandwidth the server waits in the
//!    fourth handshake, then takes the client's report (size, iters as u64,
//!    peak BW, average BW, message rate as f64, all big-endian) and prints it;
//! 6. a fifth handshake and `"done"` + NUL from both sides.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use urnic::{
    Access, Connect, Context, Cq, Gid, Mr, Mtu, Payload, Qp, QpAttr, QpAttrMask, QpCaps, QpInit, QpState, QpType, RecvWr, RemoteAddr, SendFlags,
    SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
};

use crate::out::outln;
use crate::peer::Peer;
use crate::report::{bw_header, bw_row, lat_header, lat_row, LatStats, RULE};

/// The perftest version we speak (≥ 5.70 is required by perftest 6).
const VERSION: &str = "6.06";
const KEY_MSG: usize = 108;
const PAGE: usize = 4096;
const CACHE_LINE: u32 = 64;

/// Which test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Test {
    /// ib_send_bw.
    SendBw,
    /// ib_write_bw.
    WriteBw,
    /// ib_read_bw.
    ReadBw,
    /// ib_atomic_bw.
    AtomicBw,
    /// ib_send_lat.
    SendLat,
    /// ib_write_lat.
    WriteLat,
    /// ib_read_lat.
    ReadLat,
}

impl Test {
    fn is_bw(self) -> bool {
        matches!(self, Test::SendBw | Test::WriteBw | Test::ReadBw | Test::AtomicBw)
    }

    fn title(self) -> &'static str {
        match self {
            Test::SendBw => "Send BW Test",
            Test::WriteBw => "RDMA_Write BW Test",
            Test::ReadBw => "RDMA_Read BW Test",
            Test::AtomicBw => "Atomic FETCH_AND_ADD BW Test",
            Test::SendLat => "Send Latency Test",
            Test::WriteLat => "RDMA_Write Latency Test",
            Test::ReadLat => "RDMA_Read Latency Test",
        }
    }

    /// perftest's default message size.
    pub fn default_size(self) -> usize {
        match self {
            Test::AtomicBw => 8,
            t if t.is_bw() => 65536,
            _ => 2,
        }
    }

    /// perftest's default iteration count.
    pub fn default_iters(self) -> u64 {
        if self.is_bw() {
            5000
        } else {
            1000
        }
    }
}

/// Atomic operation of ib_atomic_bw (`-A`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AtomicOp {
    /// FETCH_AND_ADD (perftest's default).
    #[value(name = "FETCH_AND_ADD")]
    FetchAndAdd,
    /// CMP_AND_SWAP.
    #[value(name = "CMP_AND_SWAP")]
    CmpAndSwap,
}

/// Options (perftest's names).
#[derive(Clone, Debug)]
pub struct Opts {
    /// The test.
    pub test: Test,
    /// Server to connect to, resolved (`None`: be the server).
    pub server: Option<Peer>,
    /// TCP port.
    pub port: u16,
    /// Message size.
    pub size: usize,
    /// Iterations.
    pub iters: u64,
    /// Outstanding sends (bw).
    pub tx_depth: u32,
    /// Receive depth (send tests).
    pub rx_depth: u32,
    /// GID index (`-x`).
    pub gid_idx: u8,
    /// MTU (`-m`); the port's active MTU if not given.
    pub mtu: Option<u32>,
    /// Atomic type.
    pub atomic: AtomicOp,
    /// Print JSON too.
    pub json: bool,
    /// Print the device's counters at the end (QP included).
    pub stats: bool,
}

/// One side's keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keys {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// Outstanding RDMA READ/ATOMIC the side accepts.
    pub out_reads: u16,
    /// QPN.
    pub qpn: u32,
    /// PSN.
    pub psn: u32,
    /// rkey of the buffer.
    pub rkey: u32,
    /// Address the peer targets.
    pub vaddr: u64,
    /// GID.
    pub gid: Gid,
    /// SRQ number (0).
    pub srqn: u32,
}

impl Keys {
    /// The 108-byte message.
    pub fn to_msg(self) -> [u8; KEY_MSG] {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid,
            self.out_reads,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff,
            self.rkey,
            self.vaddr
        );
        for b in self.gid {
            s.push_str(&format!("{b:02x}:"));
        }
        s.push_str(&format!("{:08x}:", self.srqn));
        let mut m = [0u8; KEY_MSG];
        m[..s.len()].copy_from_slice(s.as_bytes());
        m
    }

    /// Parse a peer's message.
    pub fn parse(m: &[u8]) -> Result<Keys> {
        let text = std::str::from_utf8(m.split(|&b| b == 0).next().unwrap_or(&[])).context("key message is not text")?;
        let f: Vec<&str> = text.split(':').collect();
        if f.len() < 23 {
            bail!("key message {text:?} has {} fields, not 23", f.len());
        }
        let hex = |i: usize| u64::from_str_radix(f[i], 16).with_context(|| format!("field {i} {:?} of {text:?} is not hex", f[i]));
        let mut gid = [0u8; 16];
        for (k, g) in gid.iter_mut().enumerate() {
            *g = hex(6 + k)? as u8;
        }
        Ok(Keys {
            lid: hex(0)? as u16,
            out_reads: hex(1)? as u16,
            qpn: hex(2)? as u32,
            psn: hex(3)? as u32,
            rkey: hex(4)? as u32,
            vaddr: hex(5)?,
            gid,
            srqn: hex(22)? as u32,
        })
    }
}

/// The TCP side channel. While it waits for the peer it keeps driving the
/// device's datapath (run-to-completion: nobody else does).
struct Channel {
    s: TcpStream,
    client: bool,
    ctx: Context,
}

impl Channel {
    fn open(ctx: &Context, server: Option<&Peer>, port: u16) -> Result<Channel> {
        let (s, client) = match server {
            Some(peer) => (peer.connect()?, true),
            None => {
                let l = TcpListener::bind(("0.0.0.0", port)).with_context(|| format!("Couldn't listen to port {port}"))?;
                (l.accept().context("accept failed")?.0, false)
            }
        };
        s.set_nonblocking(true).context("socket")?;
        let _ = s.set_nodelay(true);
        Ok(Channel { s, client, ctx: ctx.clone() })
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        let mut got = 0;
        let mut idle = 0u32;
        while got < buf.len() {
            match self.s.read(&mut buf[got..]) {
                Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if self.ctx.poll() == 0 {
                        idle += 1;
                        if idle > 1000 {
                            std::thread::yield_now();
                        }
                    } else {
                        idle = 0;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        let mut put = 0;
        while put < buf.len() {
            match self.s.write(&buf[put..]) {
                Ok(n) => put += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    self.ctx.poll();
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Exchange equal-sized messages: the client writes first.
    /// The other side, by role.
    fn peer_name(&self) -> &'static str {
        if self.client {
            "server"
        } else {
            "client"
        }
    }

    fn xchg(&mut self, mine: &[u8]) -> Result<Vec<u8>> {
        let mut theirs = vec![0u8; mine.len()];
        let r = if self.client {
            self.write_all(mine).and_then(|()| self.read_exact(&mut theirs))
        } else {
            self.read_exact(&mut theirs).and_then(|()| self.write_all(mine))
        };
        r.map_err(|e| {
            let gone = matches!(e.kind(), std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe);
            let err = anyhow::Error::new(e);
            let err = if gone { err.context(format!("the {} left (it failed, or ran a different test, -s or -n)", self.peer_name())) } else { err };
            err.context("Failed to exchange data between server and clients")
        })?;
        Ok(theirs)
    }

    /// Whether the peer is still in the test (a non-blocking peek at the
    /// socket).
    fn peer_state(&self) -> Result<PeerState> {
        let mut b = [0u8; 1];
        match self.s.peek(&mut b) {
            Ok(0) => Ok(PeerState::Closed),
            Ok(_) => Ok(PeerState::Ahead),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) => Ok(PeerState::Testing),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(PeerState::Closed),
            Err(e) => Err(e).context(format!("the connection to the {} failed during the test", self.peer_name())),
        }
    }
}

/// Where the peer is, seen from the TCP connection during the test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PeerState {
    /// Nothing to read: still testing.
    Testing,
    /// Closed the connection: it failed, or ended (ib_write_lat ends
    /// without a closing exchange, possibly just before our last ACK
    /// arrives).
    Closed,
    /// Sent its next exchange message: it finished the test while this
    /// side still waits for completions (it ran fewer iterations, unless
    /// this side has done them all and waits for its last ACK).
    Ahead,
}

/// How long the test may go without a completion (or, for ib_write_lat,
/// an arriving WRITE) before this side gives up on the peer.
const STALL: Duration = Duration::from_secs(30);

/// Waiting for the RDMA test's completions: fails when the peer moved on
/// to the next exchange (it ran fewer iterations), when it closed the
/// connection and nothing completed for [`CLOSED_GRACE`] since, or when
/// nothing completes for [`STALL`] (a peer that ran fewer iterations may
/// wait silently in the closing exchange). The socket is looked at every
/// 1024 idle polls.
struct Watch<'a> {
    ch: &'a Channel,
    idle: u32,
    last: Instant,
    closed_at: Option<Instant>,
}

/// How long completions may still arrive after the peer closed the
/// connection (its last ACKs travel apart from its TCP FIN).
const CLOSED_GRACE: Duration = Duration::from_secs(2);

impl<'a> Watch<'a> {
    fn new(ch: &'a Channel) -> Watch<'a> {
        Watch { ch, idle: 0, last: Instant::now(), closed_at: None }
    }

    /// Something completed.
    fn progress(&mut self) {
        self.idle = 0;
        self.last = Instant::now();
    }

    /// A poll found nothing, after `done` of `iters` iterations.
    fn idle(&mut self, done: u64, iters: u64) -> Result<()> {
        self.idle = self.idle.wrapping_add(1);
        if self.idle & 1023 != 0 {
            return Ok(());
        }
        let peer = self.ch.peer_name();
        match self.ch.peer_state()? {
            // Every iteration done here: the peer may rightly be in the
            // closing exchange while our last SEND's completion (its ACK,
            // which it may hold for a reply that never comes, up to
            // `EngineConfig::ack_hold`) is still on its way.
            PeerState::Ahead if done >= iters => {}
            PeerState::Ahead => {
                bail!("the {peer} finished the test after {done} of our {iters} iterations (both sides must run the same -n)")
            }
            PeerState::Closed => {
                let at = *self.closed_at.get_or_insert_with(Instant::now);
                if at.elapsed() > CLOSED_GRACE && self.last.elapsed() > CLOSED_GRACE {
                    bail!("the {peer} left during the test after {done} of our {iters} iterations (it failed, or ran a different -n)");
                }
            }
            PeerState::Testing => {}
        }
        if self.last.elapsed() > STALL {
            bail!(
                "nothing completed for {} s after {done} of {iters} iterations: the {peer} is gone or ran fewer (both sides must run the same -n)",
                STALL.as_secs()
            );
        }
        Ok(())
    }
}

impl Channel {
    fn hand_shake(&mut self, mine: &Keys) -> Result<Keys> {
        Keys::parse(&self.xchg(&mine.to_msg())?)
    }

    fn close(mut self, mine: &Keys) -> Result<()> {
        self.hand_shake(mine)?;
        self.write_all(b"done\0").context("Couldn't write to socket")?;
        Ok(())
    }
}

/// The client's bandwidth report, as exchanged.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BwReport {
    /// Message size.
    pub size: u64,
    /// Iterations.
    pub iters: u64,
    /// Peak bandwidth, perftest's MB/s ([`PERFTEST_MB`]).
    pub peak: f64,
    /// Average bandwidth, perftest's MB/s.
    pub avg: f64,
    /// Million messages per second.
    pub msg_rate: f64,
}

/// Bytes in perftest's "MB" of its `BW peak[MB/sec]` and `BW
/// average[MB/sec]` columns: 2^20 (perftest_parameters.c, print_report_bw:
/// `format_factor` 0x100000 unless --report_gbits), so that urnic's figures
/// read as perftest's do, whichever side prints them. Its message rate is
/// in 10^6 messages per second.
pub(crate) const PERFTEST_MB: f64 = 1_048_576.0;

struct Res {
    ctx: Context,
    qp: Qp,
    cq: Cq,
    mr: Mr,
    /// Size of each half of the buffer (perftest's BUFF_SIZE).
    half: usize,
}

/// Run one perftest-compatible test on `ctx`.
pub fn run(ctx: &Context, o: &Opts) -> Result<()> {
    if o.test == Test::AtomicBw && o.size != 8 {
        bail!("atomic operations are 8 bytes (-s 8)");
    }
    let port_attr = ctx.query_port(1).context("query_port")?;
    let mut ch = Channel::open(ctx, o.server.as_ref(), o.port)?;
    let is_client = ch.client;

    // 1-3: version, system data, MTU.
    let mut v = [0u8; 16];
    v[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
    let rv = ch.xchg(&v)?;
    let rem_version = String::from_utf8_lossy(rv.split(|&b| b == 0).next().unwrap_or(&[])).into_owned();
    if rem_version.parse::<f64>().map_or(true, |x| x < 5.70) {
        bail!("the peer's perftest version {rem_version:?} is older than 5.70 (not compatible)");
    }
    let cycle = u32::from_be_bytes(ch.xchg(&(PAGE as u32).to_be_bytes())?.try_into().unwrap_or([0; 4])).max(PAGE as u32) as usize;
    let _cache = u32::from_be_bytes(ch.xchg(&CACHE_LINE.to_be_bytes())?.try_into().unwrap_or([0; 4])).max(CACHE_LINE);
    let want_mtu = match o.mtu {
        Some(b) => Mtu::from_bytes(b).with_context(|| format!("Invalid MTU {b}"))?,
        None => port_attr.active_mtu,
    };
    let mine = [b'0' + want_mtu as u8, 0];
    let theirs = ch.xchg(&mine)?;
    let rem_mtu = (theirs[0] as char).to_digit(10).and_then(|d| Mtu::from_ibv(d as u8));
    let mtu = match rem_mtu {
        Some(r) if (r as u8) < (want_mtu as u8) => r,
        _ => want_mtu,
    };

    // Resources: two halves of BUFF_SIZE; the peer targets the second.
    let half = o.size.max(cycle);
    let r = resources(ctx, o, half)?;
    let reads = matches!(o.test, Test::ReadBw | Test::AtomicBw | Test::ReadLat);
    let my = Keys {
        lid: 0,
        out_reads: if reads { 128 } else { 1 },
        qpn: r.qp.qp_num(),
        psn: crate::dev::random_psn(),
        rkey: if matches!(o.test, Test::SendBw | Test::SendLat) { 0 } else { r.mr.rkey() },
        vaddr: r.mr.addr() + half as u64,
        gid: ctx.query_gid(1, u32::from(o.gid_idx)).context("query_gid")?,
        srqn: 0,
    };
    banner(o, mtu, &port_attr)?;
    let rem = ch.hand_shake(&my)?;
    if crate::dev::is_ipv4_mapped(&my.gid) != crate::dev::is_ipv4_mapped(&rem.gid) {
        bail!("the two sides use GIDs of different types (IPv4 vs IPv6): use matching -x");
    }
    let rd = rem.out_reads.clamp(1, 128) as u8;
    r.qp.connect(&Connect {
        mtu: Some(mtu),
        sgid_index: o.gid_idx,
        rd_atomic: rd,
        min_rnr_timer: 12,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        access: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        ..Connect::new(rem.qpn, rem.gid, my.psn, rem.psn)
    })
    .context("Failed to modify QP to RTR/RTS")?;
    print_keys("local", &my)?;
    ch.hand_shake(&my)?;
    print_keys("remote", &rem)?;
    ch.hand_shake(&my)?;

    // Receives for the SEND tests, before the last synchronisation.
    let recv_sge = r.mr.sge(half, o.size.max(1) as u32);
    let mut routs = 0u32;
    let needs_recv = match o.test {
        Test::SendBw => !is_client,
        Test::SendLat => true,
        _ => false,
    };
    if needs_recv {
        let n = o.rx_depth.min(o.iters.min(u64::from(u32::MAX)) as u32).max(1);
        for _ in 0..n {
            r.qp.post_recv(&RecvWr { wr_id: 0, sgl: vec![recv_sge] }).context("Couldn't post receive")?;
            routs += 1;
        }
    }
    let result = if o.test.is_bw() {
        bw_test(o, &r, &mut ch, &my, &rem, is_client, recv_sge, routs, cycle)?
    } else {
        ch.hand_shake(&my)?;
        lat_test(o, &r, &ch, &rem, is_client, recv_sge, half)?
    };
    // ib_write_lat ends after the test, without the closing handshake.
    if o.test != Test::WriteLat {
        ch.close(&my)?;
    }
    if o.stats {
        crate::out::text(&ctx.counters().to_string())?;
    }
    if o.json {
        outln!("{result}")?;
    }
    Ok(())
}

fn resources(ctx: &Context, o: &Opts, half: usize) -> Result<Res> {
    let pd = ctx.alloc_pd().context("Couldn't allocate PD")?;
    let depth = o.tx_depth.max(o.rx_depth).max(16);
    let cq = ctx.create_cq(2 * depth + 16, None).context("Couldn't create CQ")?;
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let mut mr = pd.alloc_mr(2 * half, access).context("Couldn't register MR")?;
    // perftest fills its buffer with random bytes; a fixed pattern lets the
    // data be checked where the test allows.
    let pattern: Vec<u8> = (0..mr.len()).map(|i| (i % 251) as u8).collect();
    mr.write_at(0, &pattern).context("Couldn't fill the MR")?;
    let qp = pd
        .create_qp(&QpInit {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCaps { max_send_wr: depth, max_recv_wr: depth, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 },
            sq_sig_all: false,
        })
        .context("Couldn't create QP")?;
    let init = QpAttr { qp_state: QpState::Init, qp_access_flags: access, ..QpAttr::default() };
    qp.modify(&init, QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS)
        .context("Failed to modify QP to INIT")?;
    Ok(Res { ctx: ctx.clone(), qp, cq, mr, half })
}

fn banner(o: &Opts, mtu: Mtu, port: &urnic::PortAttr) -> Result<()> {
    outln!("{RULE}")?;
    outln!("                    {}", o.test.title())?;
    outln!(" Dual-port       : OFF\t\tDevice         : urnic")?;
    outln!(" Number of qps   : 1\t\tTransport type : IB")?;
    outln!(" Connection type : RC\t\tUsing SRQ      : OFF")?;
    outln!(" PCIe relax order: OFF")?;
    if o.test.is_bw() {
        outln!(" TX depth        : {}", o.tx_depth)?;
    }
    if matches!(o.test, Test::SendBw | Test::SendLat) {
        outln!(" RX depth        : {}", o.rx_depth)?;
    }
    outln!(" Mtu             : {}[B]", mtu.bytes())?;
    outln!(" Link type       : Ethernet")?;
    outln!(" GID index       : {}", o.gid_idx)?;
    outln!(" Max inline data : 0[B]")?;
    outln!(" rdma_cm QPs\t : OFF")?;
    outln!(" Data ex. method : Ethernet")?;
    let _ = port;
    outln!("{RULE}")
}

fn print_keys(side: &str, k: &Keys) -> Result<()> {
    let gid: Vec<String> = k.gid.iter().map(|b| format!("{b:02}")).collect();
    outln!(" {side} address: LID {:#06x} QPN {:#08x} PSN {:#08x} RKey {:#010x} VAddr {:#018x}", k.lid, k.qpn, k.psn, k.rkey, k.vaddr)?;
    outln!(" GID: {}", gid.join(":"))
}

/// Drive the datapath one step (run-to-completion), then poll the CQ.
fn poll(r: &Res, wc: &mut [WorkCompletion]) -> Result<usize> {
    r.ctx.poll();
    let n = r.cq.poll(wc).context("poll CQ")?;
    if let Some(bad) = wc[..n].iter().find(|w| w.status != WcStatus::Success) {
        bail!(
            " Completion with error at {}:\n Failed status {:?}: wr_id {} opcode {:?}",
            if bad.opcode == WcOpcode::Recv { "server" } else { "client" },
            bad.status,
            bad.wr_id,
            bad.opcode
        );
    }
    Ok(n)
}

#[allow(clippy::too_many_arguments)]
fn bw_test(
    o: &Opts,
    r: &Res,
    ch: &mut Channel,
    my: &Keys,
    rem: &Keys,
    is_client: bool,
    recv_sge: urnic::Sge,
    mut routs: u32,
    cycle: usize,
) -> Result<String> {
    // WRITE/READ/ATOMIC: the server only waits (in the handshake) and then
    // prints the client's report. SEND: the server receives.
    if !is_client && o.test != Test::SendBw {
        ch.hand_shake(my)?;
        let rep = xchg_report(ch, &BwReport::default())?;
        outln!("{}", bw_header())?;
        outln!("{}", bw_row(rep.size as usize, rep.iters as usize, rep.peak, rep.avg, rep.msg_rate))?;
        outln!("{RULE}")?;
        return Ok(json_bw(o, &rep));
    }
    if o.test == Test::SendBw {
        ch.hand_shake(my)?;
    }
    let mut wc = vec![WorkCompletion::default(); 64];
    let (size, iters) = (o.size, o.iters);
    let start = Instant::now();
    let mut peak: f64 = 0.0;
    if !is_client {
        // SEND server: count receives, keep the queue full.
        let mut rcnt = 0u64;
        let mut window = (Instant::now(), 0u64);
        let mut watch = Watch::new(ch);
        while rcnt < iters {
            let n = poll(r, &mut wc)?;
            if n == 0 {
                watch.idle(rcnt, iters)?;
            } else {
                watch.progress();
            }
            for _ in 0..n {
                rcnt += 1;
                routs -= 1;
                if rcnt + u64::from(routs) < iters {
                    r.qp.post_recv(&RecvWr { wr_id: 0, sgl: vec![recv_sge] }).context("Couldn't post receive")?;
                    routs += 1;
                }
            }
            window.1 += n as u64;
            if window.1 >= 100 {
                peak = peak.max((window.1 * size as u64) as f64 / window.0.elapsed().as_secs_f64() / PERFTEST_MB);
                window = (Instant::now(), 0);
            }
        }
    } else {
        let depth = u64::from(o.tx_depth.max(1));
        let cq_mod = crate::perf::perftest_cq_mod(size, depth as usize) as u64;
        let (mut posted, mut done) = (0u64, 0u64);
        let mut window = (Instant::now(), 0u64);
        let mut off = 0usize;
        let mut watch = Watch::new(ch);
        while done < iters {
            while posted < iters && posted - done < depth {
                let remote = RemoteAddr { addr: rem.vaddr + off as u64, rkey: rem.rkey };
                // Cycle through the peer's buffer as perftest does.
                if size <= cycle / 2 {
                    off = (off + size) % cycle;
                }
                let local = r.mr.sge(0, size as u32);
                let op = match o.test {
                    Test::SendBw => SendOp::Send,
                    Test::WriteBw => SendOp::Write { remote },
                    Test::ReadBw => SendOp::Read { remote: RemoteAddr { addr: rem.vaddr, rkey: rem.rkey } },
                    _ => match o.atomic {
                        AtomicOp::FetchAndAdd => SendOp::FetchAdd { remote: RemoteAddr { addr: rem.vaddr, rkey: rem.rkey }, add: 1 },
                        AtomicOp::CmpAndSwap => SendOp::CmpSwap { remote: RemoteAddr { addr: rem.vaddr, rkey: rem.rkey }, compare: 0, swap: 0 },
                    },
                };
                let local = if matches!(o.test, Test::ReadBw) { r.mr.sge(r.half, size as u32) } else { local };
                posted += 1;
                // Signal every cq_mod-th WR (and the last): one completion
                // stands for the unsignaled ones before it.
                let signaled = posted % cq_mod == 0 || posted == iters;
                let flags = if signaled { SendFlags::SIGNALED } else { SendFlags::empty() };
                r.qp.post_send(&SendWr { wr_id: posted, op, payload: Payload::Sgl(vec![local]), flags, ud: None }).context("Couldn't post send")?;
            }
            let n = poll(r, &mut wc)?;
            if n == 0 {
                watch.idle(done, iters)?;
            } else {
                watch.progress();
            }
            for w in &wc[..n] {
                let newly = w.wr_id - done;
                done = w.wr_id;
                window.1 += newly;
            }
            if window.1 >= depth {
                peak = peak.max((window.1 * size as u64) as f64 / window.0.elapsed().as_secs_f64() / PERFTEST_MB);
                window = (Instant::now(), 0);
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let avg = (iters * size as u64) as f64 / secs / PERFTEST_MB;
    let rep = BwReport { size: size as u64, iters, peak: peak.max(avg), avg, msg_rate: iters as f64 / secs / 1e6 };
    outln!("{}", bw_header())?;
    outln!("{}", bw_row(size, iters as usize, rep.peak, rep.avg, rep.msg_rate))?;
    outln!("{RULE}")?;
    if is_client && o.test != Test::SendBw {
        ch.hand_shake(my)?;
        xchg_report(ch, &rep)?;
    }
    Ok(json_bw(o, &rep))
}

fn xchg_report(ch: &mut Channel, mine: &BwReport) -> Result<BwReport> {
    let u = |ch: &mut Channel, v: u64| -> Result<u64> { Ok(u64::from_be_bytes(ch.xchg(&v.to_be_bytes())?.try_into().unwrap_or([0; 8]))) };
    let f = |ch: &mut Channel, v: f64| -> Result<f64> {
        Ok(f64::from_bits(u64::from_be_bytes(ch.xchg(&v.to_bits().to_be_bytes())?.try_into().unwrap_or([0; 8]))))
    };
    Ok(BwReport {
        size: u(ch, mine.size)?,
        iters: u(ch, mine.iters)?,
        peak: f(ch, mine.peak)?,
        avg: f(ch, mine.avg)?,
        msg_rate: f(ch, mine.msg_rate)?,
    })
}

fn json_bw(o: &Opts, r: &BwReport) -> String {
    format!(
        "{{\"test\": \"{:?}\", \"bytes\": {}, \"iterations\": {}, \"bw_peak_mbs\": {:.2}, \"bw_avg_mbs\": {:.2}, \"msg_rate_mpps\": {:.6}}}",
        o.test, r.size, r.iters, r.peak, r.avg, r.msg_rate
    )
}

#[allow(clippy::too_many_arguments)]
fn lat_test(o: &Opts, r: &Res, ch: &Channel, rem: &Keys, is_client: bool, recv_sge: urnic::Sge, half: usize) -> Result<String> {
    let size = o.size;
    let iters = o.iters as usize;
    let mut wc = vec![WorkCompletion::default(); 8];
    let mut samples: Vec<f64> = Vec::with_capacity(iters);
    // Iterations done so far, for the failure message.
    let done = std::cell::Cell::new(0u64);
    let wait = |want: &dyn Fn(&WorkCompletion) -> bool, wc: &mut [WorkCompletion]| -> Result<()> {
        let mut watch = Watch::new(ch);
        loop {
            let n = poll(r, wc)?;
            if wc[..n].iter().any(want) {
                return Ok(());
            }
            watch.idle(done.get(), o.iters)?;
        }
    };
    let send = |flags| SendWr { wr_id: 1, op: SendOp::Send, payload: Payload::Sgl(vec![r.mr.sge(0, size as u32)]), flags, ud: None };
    match o.test {
        Test::SendLat => {
            // Ping-pong: the client sends first, the server answers each
            // receive. As perftest's run_iter_lat_send with its latency
            // default tx depth 1 (so CQ moderation 1: every SEND signalled),
            // each side waits for its SEND's completion, i.e. the peer's
            // ACK, before it polls for the next receive: an iteration ends
            // when both the peer's message and the ACK of our own are in.
            // The one CQ holds both kinds; they are counted as they come.
            let (mut sends, mut recvs) = (0u64, 0u64);
            let mut wait_for = |want_sends: u64, want_recvs: u64, wc: &mut [WorkCompletion]| -> Result<()> {
                let mut watch = Watch::new(ch);
                while sends < want_sends || recvs < want_recvs {
                    let n = poll(r, wc)?;
                    for w in &wc[..n] {
                        match w.opcode {
                            WcOpcode::Recv => recvs += 1,
                            WcOpcode::Send => sends += 1,
                            _ => {}
                        }
                    }
                    if n == 0 {
                        watch.idle(done.get(), o.iters)?;
                    }
                }
                Ok(())
            };
            let mut t = Instant::now();
            for i in 1..=iters as u64 {
                if is_client {
                    r.qp.post_send(&send(SendFlags::SIGNALED)).context("Couldn't post send")?;
                    wait_for(i, i, &mut wc)?;
                } else {
                    wait_for(i - 1, i, &mut wc)?;
                }
                r.qp.post_recv(&RecvWr { wr_id: 0, sgl: vec![recv_sge] }).context("Couldn't post receive")?;
                if !is_client {
                    r.qp.post_send(&send(SendFlags::SIGNALED)).context("Couldn't post send")?;
                }
                // Both sides measure, from one ping to the next.
                let now = Instant::now();
                samples.push(now.duration_since(t).as_secs_f64() * 1e6 / 2.0);
                t = now;
                done.set(done.get() + 1);
            }
            // The server's last SEND completes too before it reports.
            if !is_client {
                wait_for(iters as u64, iters as u64, &mut wc)?;
            }
        }
        Test::WriteLat => {
            // Each side writes `size` bytes whose last byte counts the
            // iterations into the peer's buffer and spins on its own.
            let poll_at = half + size - 1;
            let base = r.mr.as_ptr();
            let post_ptr = r.mr.as_ptr().wrapping_add(size - 1);
            let mut t = Instant::now();
            let (mut scnt, mut rcnt) = (0u64, 0u64);
            while scnt < iters as u64 || rcnt < iters as u64 {
                if rcnt < iters as u64 && (is_client || scnt >= 1) {
                    rcnt += 1;
                    done.set(rcnt - 1);
                    let mut watch = Watch::new(ch);
                    // SAFETY: `poll_at` is inside the registered buffer; the
                    // datapath writes it concurrently, hence the volatile read.
                    while unsafe { std::ptr::read_volatile(base.add(poll_at)) } != rcnt as u8 {
                        if r.ctx.poll() == 0 {
                            watch.idle(rcnt - 1, o.iters)?;
                        }
                    }
                }
                if scnt < iters as u64 {
                    scnt += 1;
                    // SAFETY: inside our buffer; nothing else writes the send half.
                    unsafe { std::ptr::write_volatile(post_ptr, scnt as u8) };
                    let remote = RemoteAddr { addr: rem.vaddr, rkey: rem.rkey };
                    r.qp.post_send(&SendWr {
                        wr_id: 1,
                        op: SendOp::Write { remote },
                        payload: Payload::Sgl(vec![r.mr.sge(0, size as u32)]),
                        flags: SendFlags::SIGNALED,
                        ud: None,
                    })
                    .context("Couldn't post send")?;
                    wait(&|w| w.opcode == WcOpcode::RdmaWrite, &mut wc)?;
                }
                if rcnt > 0 {
                    let now = Instant::now();
                    samples.push(now.duration_since(t).as_secs_f64() * 1e6 / 2.0);
                    t = now;
                }
            }
        }
        Test::ReadLat => {
            if is_client {
                for _ in 0..iters {
                    let t = Instant::now();
                    let remote = RemoteAddr { addr: rem.vaddr, rkey: rem.rkey };
                    r.qp.post_send(&SendWr {
                        wr_id: 1,
                        op: SendOp::Read { remote },
                        payload: Payload::Sgl(vec![r.mr.sge(0, size as u32)]),
                        flags: SendFlags::SIGNALED,
                        ud: None,
                    })
                    .context("Couldn't post send")?;
                    wait(&|w| w.opcode == WcOpcode::RdmaRead, &mut wc)?;
                    samples.push(t.elapsed().as_secs_f64() * 1e6);
                    done.set(done.get() + 1);
                }
            }
        }
        _ => unreachable!("bandwidth tests take the other path"),
    }
    if samples.is_empty() {
        return Ok(String::new());
    }
    let s = LatStats::from_samples(&mut samples).context("no samples")?;
    outln!("{}", lat_header())?;
    outln!("{}", lat_row(size, iters, &s))?;
    outln!("{RULE}")?;
    Ok(format!(
        "{{\"test\": \"{:?}\", \"bytes\": {size}, \"iterations\": {iters}, \"t_min_us\": {:.2}, \"t_typical_us\": {:.2}, \
         \"t_avg_us\": {:.2}, \"t_p99_us\": {:.2}, \"t_p999_us\": {:.2}, \"t_max_us\": {:.2}}}",
        o.test, s.min, s.typical, s.avg, s.p99, s.p999, s.max
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_message_matches_the_capture() {
        // write_bw.pcap, the client's keys.
        let want = "0000:0001:000011:b563dd:00000233:000055f79ea1f000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:63:00:02:00000000:";
        let k = Keys::parse(want.as_bytes()).unwrap();
        assert_eq!((k.out_reads, k.qpn, k.psn, k.rkey, k.vaddr), (1, 0x11, 0xb563dd, 0x233, 0x55f7_9ea1_f000));
        assert_eq!(&k.gid[10..], &[0xff, 0xff, 10, 99, 0, 2]);
        let m = k.to_msg();
        assert_eq!(&m[..want.len()], want.as_bytes());
        assert!(m[want.len()..].iter().all(|&b| b == 0));
        assert_eq!(m.len(), 108);
        assert!(Keys::parse(b"0000:0001").is_err());
        assert!(Keys::parse(&[0xff; 108]).is_err());
    }
}
