//! `urnic ucmatose`: rdmacm-utils' ucmatose on urnic's Rust CM API
//! (`urnic::cm`), so the peer may be Debian's ucmatose on rxe or a ConnectX.
//!
//! The exchange is ucmatose's: the server listens (TCP port space, port 7471
//! by default) and accepts `-c` connections, each with `-C` receives of
//! `-S` bytes posted first; once all are established it sends `-C` messages
//! on each, waits for their completions and for the client's `-C` replies,
//! then disconnects them all. The client connects `-c` times, waits for the
//! server's messages, replies with as many, and answers the server's
//! disconnects.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use urnic::cm::{CmChannel, CmEvent, CmId, ConnParam, PortSpace};
use urnic::{Access, Context, Cq, Mr, Pd, Qp, QpCaps, QpInit, QpType, RecvWr, SendFlags, SendOp, SendWr, WorkCompletion};

use crate::out::outln;

/// ucmatose's options.
#[derive(clap::Args, Debug)]
pub struct CmatoseArgs {
    /// Server address: run as the client (without: the server).
    #[arg(short = 's')]
    pub server: Option<String>,
    /// Bind address (the server's listening address; picks the interface).
    #[arg(short = 'b')]
    pub bind: Option<String>,
    /// Connections.
    #[arg(short = 'c', default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=512))]
    pub connections: u32,
    /// Messages each way per connection.
    #[arg(short = 'C', default_value_t = 10, value_parser = clap::value_parser!(u32).range(0..=4096))]
    pub count: u32,
    /// Message size in bytes.
    #[arg(short = 'S', default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=(1 << 20)))]
    pub size: u32,
    /// Port.
    #[arg(short = 'p', default_value_t = 7471)]
    pub port: u16,
    /// Device (`urnic-IFNAME`) or interface; default: the interface with the
    /// bind address, else the first one up with an IPv4 address.
    #[arg(short = 'd', long = "ib-dev")]
    pub dev: Option<String>,
}

/// One connection's resources (ucmatose's `cmatest_node`).
struct Node {
    id: CmId,
    qp: Qp,
    send_cq: Cq,
    recv_cq: Cq,
    mr: Mr,
    connected: bool,
    disconnected: bool,
}

/// How long to wait for the peer at any one step before giving up.
const PATIENCE: Duration = Duration::from_secs(60);
/// How long a server waits for its first (or next) connect request.
const LISTEN_PATIENCE: Duration = Duration::from_secs(900);

fn node(ctx: &Context, pd: &Pd, count: u32, size: u32) -> anyhow::Result<(Qp, Cq, Cq, Mr)> {
    let cqe = count.max(1);
    let send_cq = ctx.create_cq(cqe, None)?;
    let recv_cq = ctx.create_cq(cqe, None)?;
    let cap = QpCaps { max_send_wr: cqe, max_recv_wr: cqe, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let qp = pd.create_qp(&QpInit { qp_type: QpType::Rc, send_cq: &send_cq, recv_cq: &recv_cq, srq: None, cap, sq_sig_all: true })?;
    let mr = pd.alloc_mr(size as usize, Access::LOCAL_WRITE)?;
    CmChannel::init_qp(&qp)?;
    for i in 0..count {
        qp.post_recv(&RecvWr { wr_id: u64::from(i), sgl: vec![mr.sge(0, size)] })?;
    }
    Ok((qp, send_cq, recv_cq, mr))
}

fn post_sends(n: &Node, count: u32, size: u32) -> anyhow::Result<()> {
    for i in 0..count {
        let wr = SendWr {
            wr_id: u64::from(i),
            op: SendOp::Send,
            payload: urnic::Payload::Sgl(vec![n.mr.sge(0, size)]),
            flags: SendFlags::SIGNALED,
            ud: None,
        };
        n.qp.post_send(&wr)?;
    }
    Ok(())
}

/// Take `count` completions from `cq`, all successful.
fn poll(ctx: &Context, cq: &Cq, count: u32, what: &str) -> anyhow::Result<()> {
    let mut wc = vec![WorkCompletion::default(); 8];
    let (mut done, deadline) = (0, Instant::now() + PATIENCE);
    while done < count {
        ctx.poll();
        let k = cq.poll(&mut wc)?;
        for w in &wc[..k] {
            if w.status != urnic::WcStatus::Success {
                bail!("{what}: completion with status {:?}", w.status);
            }
        }
        done += k as u32;
        if k == 0 && Instant::now() > deadline {
            bail!("{what}: {done} of {count} completions after {} s", PATIENCE.as_secs());
        }
    }
    Ok(())
}

/// Drive the datapath until it has nothing left to do: the last DREPs
/// leave before the process does.
fn drain(ctx: &Context) {
    for _ in 0..1000 {
        if ctx.poll() == 0 {
            return;
        }
    }
}

/// The next CM event, driving the datapath meanwhile.
fn event(ctx: &Context, ch: &CmChannel, patience: Duration) -> anyhow::Result<CmEvent> {
    let deadline = Instant::now() + patience;
    loop {
        ctx.poll();
        if let Some(ev) = ch.get_event(Some(Duration::from_millis(1)))? {
            return Ok(ev);
        }
        if Instant::now() > deadline {
            bail!("no CM event from the peer within {} s", patience.as_secs());
        }
    }
}

fn resolve(host: &str, port: u16) -> anyhow::Result<SocketAddr> {
    (host, port).to_socket_addrs().with_context(|| format!("resolving {host}"))?.next().with_context(|| format!("{host} has no address"))
}

/// The interface whose device answers for `addr`.
fn interface_with(addr: IpAddr) -> anyhow::Result<String> {
    let list = urnic::device_list().context("listing interfaces")?;
    list.iter()
        .find(|d| d.ipv4.iter().any(|a| IpAddr::V4(*a) == addr) || d.ipv6.iter().any(|a| IpAddr::V6(*a) == addr))
        .map(|d| d.ifname.clone())
        .with_context(|| format!("no interface here has the address {addr}"))
}

pub fn run(a: &CmatoseArgs) -> anyhow::Result<()> {
    let ifname = match (&a.dev, &a.bind) {
        (Some(d), _) => crate::dev::interface_of(d)?,
        (None, Some(b)) => interface_with(resolve(b, a.port)?.ip())?,
        (None, None) => crate::dev::pick_interface(None)?,
    };
    let ctx = crate::dev::open(&ifname, 0.0, crate::dev::Drive::Caller)?;
    let ch = CmChannel::new(&ctx)?;
    let pd = ctx.alloc_pd()?;
    match &a.server {
        Some(s) => client(&ctx, &ch, &pd, a, resolve(s, a.port)?),
        None => server(&ctx, &ch, &pd, a),
    }
}

fn server(ctx: &Context, ch: &CmChannel, pd: &Pd, a: &CmatoseArgs) -> anyhow::Result<()> {
    outln!("cmatose: starting server")?;
    ch.listen(PortSpace::Tcp, a.port, a.connections as usize)?;
    let mut nodes: Vec<Node> = Vec::new();
    while nodes.iter().filter(|n| n.connected).count() < a.connections as usize {
        // A server waits for its clients as long as they take to come.
        match event(ctx, ch, LISTEN_PATIENCE)? {
            CmEvent::ConnectRequest(req) => {
                if nodes.len() == a.connections as usize {
                    outln!("cmatose: failing connection request")?;
                    ch.reject(req.id, &[])?;
                    continue;
                }
                let (qp, send_cq, recv_cq, mr) = node(ctx, pd, a.count, a.size)?;
                ch.accept(&req, &qp, &ConnParam::default())?;
                nodes.push(Node { id: req.id, qp, send_cq, recv_cq, mr, connected: false, disconnected: false });
            }
            CmEvent::Established { id } => {
                if let Some(n) = nodes.iter_mut().find(|n| n.id == id) {
                    n.connected = true;
                }
            }
            other => bail!("cmatose: event: {other:?}"),
        }
    }
    if a.count > 0 {
        outln!("initiating data transfers")?;
        for n in &nodes {
            post_sends(n, a.count, a.size)?;
        }
        outln!("completing sends")?;
        for n in &nodes {
            poll(ctx, &n.send_cq, a.count, "sends")?;
        }
        outln!("receiving data transfers")?;
        for n in &nodes {
            poll(ctx, &n.recv_cq, a.count, "receives")?;
        }
        outln!("data transfers complete")?;
    }
    outln!("cmatose: disconnecting")?;
    for n in &nodes {
        ch.disconnect(n.id, Some(&n.qp))?;
    }
    while nodes.iter().any(|n| !n.disconnected) {
        match event(ctx, ch, PATIENCE)? {
            CmEvent::Disconnected { id } => {
                if let Some(n) = nodes.iter_mut().find(|n| n.id == id) {
                    n.disconnected = true;
                }
            }
            CmEvent::TimewaitExit { .. } => {}
            other => bail!("cmatose: event while disconnecting: {other:?}"),
        }
    }
    drain(ctx);
    outln!("disconnected")?;
    outln!("test complete")?;
    Ok(())
}

fn client(ctx: &Context, ch: &CmChannel, pd: &Pd, a: &CmatoseArgs, dst: SocketAddr) -> anyhow::Result<()> {
    outln!("cmatose: starting client")?;
    outln!("cmatose: connecting")?;
    let mut nodes: Vec<Node> = Vec::new();
    for _ in 0..a.connections {
        let (qp, send_cq, recv_cq, mr) = node(ctx, pd, a.count, a.size)?;
        let param = ConnParam { retry_count: 5, ..ConnParam::default() };
        let id = ch.connect(&qp, dst, &param)?;
        nodes.push(Node { id, qp, send_cq, recv_cq, mr, connected: false, disconnected: false });
    }
    while nodes.iter().any(|n| !n.connected) {
        match event(ctx, ch, PATIENCE)? {
            CmEvent::ConnectResponse(rep) => {
                let n = nodes.iter().find(|n| n.id == rep.id).context("a response for an id we did not make")?;
                ch.complete_connect(&rep, &n.qp)?;
            }
            CmEvent::Established { id } => {
                if let Some(n) = nodes.iter_mut().find(|n| n.id == id) {
                    n.connected = true;
                }
            }
            other => bail!("cmatose: event: {other:?}"),
        }
    }
    if a.count > 0 {
        outln!("receiving data transfers")?;
        for n in &nodes {
            poll(ctx, &n.recv_cq, a.count, "receives")?;
        }
        outln!("sending replies")?;
        for n in &nodes {
            post_sends(n, a.count, a.size)?;
        }
        outln!("data transfers complete")?;
    }
    while nodes.iter().any(|n| !n.disconnected) {
        match event(ctx, ch, PATIENCE)? {
            CmEvent::Disconnected { id } => {
                if let Some(n) = nodes.iter_mut().find(|n| n.id == id) {
                    // The replies completed before the server disconnected
                    // (it received them all); take their completions.
                    poll(ctx, &n.send_cq, a.count, "replies")?;
                    ch.disconnect(id, Some(&n.qp))?;
                    n.disconnected = true;
                }
            }
            other => bail!("cmatose: event while waiting for the disconnect: {other:?}"),
        }
    }
    drain(ctx);
    outln!("test complete")?;
    Ok(())
}
