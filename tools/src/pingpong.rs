//! `urnic rc-pingpong` and `urnic ud-pingpong`: wire-compatible with
//! rdma-core's `ibv_rc_pingpong` and `ibv_ud_pingpong` — the same TCP
//! exchange (`LID:QPN:PSN:GID` as `%04x:%06x:%06x:<32 hex>` + NUL, then
//! `done`), the same QP attributes, the same ping-pong and the same output,
//! so either side can be urnic or rdma-core.

use std::io::{Read, Write};
use std::net::{Ipv6Addr, TcpListener};
use std::time::Instant;

use anyhow::{bail, Context as _, Result};
use urnic::{
    AhAttr, CompChannel, Connect, Context, Cq, Gid, Mr, Mtu, Payload, Qp, QpAttr, QpAttrMask, QpCaps, QpInit, QpState, QpType, RecvWr, SendFlags,
    SendOp, SendWr, Sge, UdDest, WcStatus, WorkCompletion,
};

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
/// `%04x:%06x:%06x:` + 32 hex digits + NUL.
const MSG_LEN: usize = 52;
const UD_QKEY: u32 = 0x1111_1111;
/// Room for the GRH in front of a UD receive.
const GRH: usize = 40;

use crate::out::outln;
use crate::peer::Peer;

/// Options shared by both tools (names as rdma-core's).
#[derive(Clone, Debug)]
pub struct Opts {
    /// Server to connect to, resolved; `None`: be the server.
    pub server: Option<Peer>,
    /// TCP port of the exchange.
    pub port: u16,
    /// Message size.
    pub size: usize,
    /// Path MTU (RC).
    pub mtu: u32,
    /// Receives posted at a time.
    pub rx_depth: u32,
    /// Exchanges.
    pub iters: u32,
    /// GID index (`None`: no GRH — not possible on RoCE, GID index 1 is used).
    pub gid_idx: Option<u8>,
    /// Validate the received buffer (`-c`).
    pub validate: bool,
    /// Sleep on completion events instead of polling (`-e`); the device
    /// must run its own datapath thread.
    pub events: bool,
}

/// Our address as the exchange carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dest {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// QPN.
    pub qpn: u32,
    /// Starting PSN.
    pub psn: u32,
    /// GID.
    pub gid: Gid,
}

impl Dest {
    /// The 52-byte message.
    pub fn to_msg(self) -> [u8; MSG_LEN] {
        let hex: String = self.gid.iter().map(|b| format!("{b:02x}")).collect();
        let s = format!("{:04x}:{:06x}:{:06x}:{hex}", self.lid, self.qpn & 0xff_ffff, self.psn & 0xff_ffff);
        let mut m = [0u8; MSG_LEN];
        m[..s.len()].copy_from_slice(s.as_bytes());
        m
    }

    /// Parse the peer's message (as `sscanf("%x:%x:%x:%s")` + `wire_gid_to_gid`).
    pub fn parse(msg: &[u8]) -> Result<Dest> {
        let text = std::str::from_utf8(msg.split(|&b| b == 0).next().unwrap_or(&[])).context("exchange message is not text")?;
        let mut it = text.splitn(4, ':');
        let mut field = |what: &str| -> Result<u32> {
            let f = it.next().with_context(|| format!("exchange message {text:?} lacks the {what}"))?;
            u32::from_str_radix(f, 16).with_context(|| format!("bad {what} {f:?} in {text:?}"))
        };
        let lid = field("LID")? as u16;
        let qpn = field("QPN")?;
        let psn = field("PSN")?;
        let g = it.next().with_context(|| format!("exchange message {text:?} lacks the GID"))?;
        // ASCII, or slicing at byte offsets below could split a character.
        if g.len() != 32 || !g.is_ascii() {
            bail!("GID {g:?} is not 32 hex digits");
        }
        let mut gid = [0u8; 16];
        for (i, b) in gid.iter_mut().enumerate() {
            *b = u8::from_str_radix(&g[2 * i..2 * i + 2], 16).with_context(|| format!("bad GID {g:?}"))?;
        }
        Ok(Dest { lid, qpn, psn, gid })
    }
}

/// Client side of the exchange: send ours, read theirs, send `done`.
fn client_exchange(server: &Peer, me: &Dest) -> Result<Dest> {
    // A refused connection is retried for a while: the server may still be
    // starting (rdma-core's tool gives up at once; scripts wrap it in a loop).
    let mut s = server.connect()?;
    s.write_all(&me.to_msg()).context("Couldn't send local address")?;
    let mut m = [0u8; MSG_LEN];
    s.read_exact(&mut m).context("Couldn't read remote address")?;
    s.write_all(b"done\0").context("Couldn't write done")?;
    Dest::parse(&m)
}

/// Server side: read theirs, bring our QP up (`connect`), send ours, read `done`.
fn server_exchange(port: u16, me: &Dest, connect: impl FnOnce(&Dest) -> Result<()>) -> Result<Dest> {
    let l = TcpListener::bind(("0.0.0.0", port)).with_context(|| format!("Couldn't listen to port {port}"))?;
    let (mut s, _) = l.accept().context("accept() failed")?;
    let mut m = [0u8; MSG_LEN];
    s.read_exact(&mut m).context("Couldn't read remote address")?;
    let rem = Dest::parse(&m)?;
    connect(&rem)?;
    s.write_all(&me.to_msg()).context("Couldn't send local address")?;
    let mut done = [0u8; 5];
    s.read_exact(&mut done).context("Couldn't read done")?;
    Ok(rem)
}

fn gid_str(g: &Gid) -> String {
    Ipv6Addr::from(*g).to_string()
}

struct Ctx {
    ctx: Context,
    qp: Qp,
    cq: Cq,
    mr: Mr,
    pd: urnic::Pd,
    /// The completion channel of `-e` (as pp_init_ctx's `ibv_create_comp_channel`).
    channel: Option<CompChannel>,
}

impl Ctx {
    fn new(ctx: &Context, qp_type: QpType, buf: usize, rx_depth: u32, max_inline: u32, events: bool) -> Result<Ctx> {
        let channel = if events { Some(ctx.create_comp_channel().context("Couldn't create completion channel")?) } else { None };
        let pd = ctx.alloc_pd().context("Couldn't allocate PD")?;
        let cq = ctx.create_cq(rx_depth + 1, channel.as_ref()).context("Couldn't create CQ")?;
        let mut mr = pd.alloc_mr(buf, urnic::Access::LOCAL_WRITE).context("Couldn't register MR")?;
        mr.fill_at(0, buf, 0x7b).context("Couldn't fill the MR")?;
        let qp = pd
            .create_qp(&QpInit {
                qp_type,
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                cap: QpCaps { max_send_wr: 1, max_recv_wr: rx_depth, max_send_sge: 1, max_recv_sge: 1, max_inline_data: max_inline },
                sq_sig_all: false,
            })
            .context("Couldn't create QP")?;
        if channel.is_some() {
            // Armed before anything is posted, as rdma-core's pingpongs do
            // right after creating the CQ: a completion that lands before
            // the loop starts (the client's first send, the server's first
            // receive) must raise an event, or the loop sleeps forever.
            cq.req_notify(false);
        }
        Ok(Ctx { ctx: ctx.clone(), qp, cq, mr, pd, channel })
    }

    fn post_recvs(&self, n: u32, sge: Sge) -> u32 {
        (0..n).take_while(|_| self.qp.post_recv(&RecvWr { wr_id: RECV_WRID, sgl: vec![sge] }).is_ok()).count() as u32
    }
}

/// The ping-pong loop of both tools (rdma-core's `pending` logic).
fn run_loop(c: &Ctx, opts: &Opts, recv_sge: Sge, post_send: &dyn Fn() -> Result<()>, mut routs: u32, is_client: bool) -> Result<()> {
    let mut pending = RECV_WRID;
    if is_client {
        post_send()?;
        pending |= SEND_WRID;
    }
    let (mut scnt, mut rcnt) = (0u32, 0u32);
    let start = Instant::now();
    let mut wc = [WorkCompletion::default(); 2];
    // -e: the CQ was armed at creation; each wakeup re-arms it, then polls
    // (as rdma-core's loop: ibv_get_cq_event, ibv_req_notify_cq,
    // ibv_poll_cq). A completion that lands between the last poll and the
    // re-arm is not lost: arming after taking the event and polling after
    // arming finds it.
    let mut events = 0u64;
    while rcnt < opts.iters || scnt < opts.iters {
        let n = match &c.channel {
            Some(ch) => {
                let id = ch.get_cq_event().context("Failed to get cq_event")?;
                if id != c.cq.id() {
                    bail!("CQ event for unknown CQ {id}");
                }
                events += 1;
                c.cq.req_notify(false);
                c.cq.poll(&mut wc).context("poll CQ failed")?
            }
            None => {
                c.ctx.poll();
                c.cq.poll(&mut wc).context("poll CQ failed")?
            }
        };
        for w in &wc[..n] {
            if w.status != WcStatus::Success {
                bail!("Failed status {:?} for wr_id {}", w.status, w.wr_id);
            }
            match w.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    routs -= 1;
                    if routs <= 1 {
                        routs += c.post_recvs(opts.rx_depth - routs, recv_sge);
                        if routs < opts.rx_depth {
                            bail!("Couldn't post receive ({routs})");
                        }
                    }
                    rcnt += 1;
                }
                other => bail!("Completion for unknown wr_id {other}"),
            }
            pending &= !w.wr_id;
            if scnt < opts.iters && pending == 0 {
                post_send()?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
        if n == 0 && c.channel.is_none() {
            std::hint::spin_loop();
        }
    }
    let usec = start.elapsed().as_secs_f64() * 1e6;
    let bytes = opts.size as u64 * u64::from(opts.iters) * 2;
    outln!("{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec", usec / 1e6, bytes as f64 * 8.0 / usec)?;
    outln!("{} iters in {:.2} seconds = {:.2} usec/iter", opts.iters, usec / 1e6, usec / f64::from(opts.iters))?;
    if c.channel.is_some() {
        tracing::debug!(events, "slept on completion events");
    }
    Ok(())
}

fn mtu_of(bytes: u32) -> Result<Mtu> {
    Mtu::from_bytes(bytes).with_context(|| format!("Invalid MTU {bytes}: 256, 512, 1024, 2048 or 4096"))
}

/// `ibv_rc_pingpong`.
pub fn rc(ctx: &Context, opts: &Opts) -> Result<()> {
    let mtu = mtu_of(opts.mtu)?;
    let page = 4096usize;
    let inline = if opts.size <= 256 { 256 } else { 0 };
    let mut c = Ctx::new(ctx, QpType::Rc, opts.size.max(1), opts.rx_depth, inline, opts.events)?;
    // INIT now, so receives can be posted before the peer is known (pp_init_ctx).
    let init = QpAttr { qp_state: QpState::Init, ..QpAttr::default() };
    c.qp.modify(&init, QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS)
        .context("Failed to modify QP to INIT")?;
    let recv_sge = c.mr.sge(0, opts.size as u32);
    let routs = c.post_recvs(opts.rx_depth, recv_sge);
    if routs < opts.rx_depth {
        bail!("Couldn't post receive ({routs})");
    }
    let gidx = opts.gid_idx.unwrap_or(1);
    let me = Dest { lid: 0, qpn: c.qp.qp_num(), psn: crate::dev::random_psn(), gid: ctx.query_gid(1, u32::from(gidx)).context("can't read sgid")? };
    outln!("  local address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}", me.lid, me.qpn, me.psn, gid_str(&me.gid))?;
    let connect = |rem: &Dest| -> Result<()> {
        let conn = Connect {
            mtu: Some(mtu),
            sgid_index: gidx,
            rd_atomic: 1,
            min_rnr_timer: 12,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            access: urnic::Access::empty(),
            ..Connect::new(rem.qpn, rem.gid, me.psn, rem.psn)
        };
        c.qp.connect(&conn).context("Couldn't connect to remote QP")
    };
    let rem = match &opts.server {
        Some(s) => {
            let rem = client_exchange(s, &me)?;
            connect(&rem)?;
            rem
        }
        None => server_exchange(opts.port, &me, connect)?,
    };
    outln!("  remote address: LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}", rem.lid, rem.qpn, rem.psn, gid_str(&rem.gid))?;
    if opts.server.is_some() && opts.validate {
        for i in (0..opts.size).step_by(page) {
            c.mr.write_at(i, &[0]).context("write_at")?;
        }
    }
    let qp = &c.qp;
    let send_sge = c.mr.sge(0, opts.size as u32);
    let post_send = || -> Result<()> {
        let payload = Payload::Sgl(vec![send_sge]);
        qp.post_send(&SendWr { wr_id: SEND_WRID, op: SendOp::Send, payload, flags: SendFlags::SIGNALED, ud: None }).context("Couldn't post send")
    };
    run_loop(&c, opts, recv_sge, &post_send, routs, opts.server.is_some())?;
    if opts.server.is_none() && opts.validate {
        for i in (0..opts.size).step_by(page) {
            if c.mr.read_vec(i, 1).context("read_at")?[0] != 0 {
                outln!("invalid data in page {}", i / page)?;
            }
        }
    }
    Ok(())
}

/// `ibv_ud_pingpong`.
pub fn ud(ctx: &Context, opts: &Opts) -> Result<()> {
    let active = ctx.query_port(1).context("Couldn't get port info")?.active_mtu.bytes() as usize;
    if opts.size > active {
        bail!("Requested size larger than port MTU ({active})");
    }
    let page = 4096usize;
    let mut c = Ctx::new(ctx, QpType::Ud, opts.size + GRH, opts.rx_depth, 0, opts.events)?;
    // INIT with the Q_Key, receives, RTR, RTS with our PSN (as pp_init_ctx + pp_connect_ctx).
    let mut at = QpAttr { qp_state: QpState::Init, qkey: UD_QKEY, ..QpAttr::default() };
    c.qp.modify(&at, QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY).context("Failed to modify QP to INIT")?;
    let recv_sge = c.mr.sge(0, (opts.size + GRH) as u32);
    let routs = c.post_recvs(opts.rx_depth, recv_sge);
    if routs < opts.rx_depth {
        bail!("Couldn't post receive ({routs})");
    }
    let gidx = opts.gid_idx.unwrap_or(1);
    let psn = crate::dev::random_psn();
    at.qp_state = QpState::Rtr;
    c.qp.modify(&at, QpAttrMask::STATE).context("Failed to modify QP to RTR")?;
    at.qp_state = QpState::Rts;
    at.sq_psn = urnic::Psn::new(psn);
    c.qp.modify(&at, QpAttrMask::STATE | QpAttrMask::SQ_PSN).context("Failed to modify QP to RTS")?;
    let me = Dest { lid: 0, qpn: c.qp.qp_num(), psn, gid: ctx.query_gid(1, u32::from(gidx)).context("can't read sgid")? };
    // (sic: rdma-core prints a colon before the GID here)
    outln!("  local address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}: GID {}", me.lid, me.qpn, me.psn, gid_str(&me.gid))?;
    let pd_ah = |rem: &Dest| -> Result<urnic::Ah> {
        c.pd.create_ah(&AhAttr { dgid: rem.gid, sgid_index: gidx, hop_limit: 1, port_num: 1, ..AhAttr::default() }).context("Failed to create AH")
    };
    let mut ah = None;
    let rem = match &opts.server {
        Some(s) => {
            let rem = client_exchange(s, &me)?;
            ah = Some(pd_ah(&rem)?);
            rem
        }
        None => server_exchange(opts.port, &me, |rem| {
            ah = Some(pd_ah(rem)?);
            Ok(())
        })?,
    };
    let ah = ah.context("no address handle")?;
    outln!("  remote address: LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}", rem.lid, rem.qpn, rem.psn, gid_str(&rem.gid))?;
    if opts.server.is_some() && opts.validate {
        for i in (0..opts.size).step_by(page) {
            c.mr.write_at(i + GRH, &[0]).context("write_at")?;
        }
    }
    let qp = &c.qp;
    let send_sge = c.mr.sge(GRH, opts.size as u32);
    let dest = UdDest { av: *ah.address_vector(), remote_qpn: rem.qpn, remote_qkey: UD_QKEY };
    let post_send = || -> Result<()> {
        qp.post_send(&SendWr {
            wr_id: SEND_WRID,
            op: SendOp::Send,
            payload: Payload::Sgl(vec![send_sge]),
            flags: SendFlags::SIGNALED,
            ud: Some(dest),
        })
        .context("Couldn't post send")
    };
    run_loop(&c, opts, recv_sge, &post_send, routs, opts.server.is_some())?;
    if opts.server.is_none() && opts.validate {
        for i in (0..opts.size).step_by(page) {
            if c.mr.read_vec(i + GRH, 1).context("read_at")?[0] != 0 {
                outln!("invalid data in page {}", i / page)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exchange_message_matches_rdma_core() {
        // From the reference capture (rc_pingpong.pcap): 52 bytes, NUL-terminated.
        let d = Dest { lid: 0, qpn: 0x11, psn: 0xb18d67, gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 99, 0, 2] };
        let m = d.to_msg();
        assert_eq!(&m[..51], b"0000:000011:b18d67:00000000000000000000ffff0a630002");
        assert_eq!(m[51], 0);
        assert_eq!(Dest::parse(&m).unwrap(), d);
        assert!(Dest::parse(b"0000:000011\0").is_err());
        assert!(Dest::parse(b"zz:1:2:00000000000000000000ffff0a630002\0").is_err());
        assert!(Dest::parse(b"0000:000011:b18d67:00ff\0").is_err());
        // 32 bytes, but not 32 characters: refused, not sliced mid-character.
        assert!(Dest::parse("0000:000011:b18d67:0\u{e9}000000000000000000ffff0a63000\0".as_bytes()).is_err());
    }
}
