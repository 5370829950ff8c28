//! One direction of a UD QP pair under soak: SENDs of random length up to
//! the path MTU, each carrying its sequence number and a pattern. Loss is
//! allowed (counted); a message that arrives twice, out of order, altered or
//! from the wrong QP is a failure.

use std::collections::HashMap;
use std::time::Instant;

use urnic::{Access, Mr, Payload, Pd, Qp, RecvWr, SendFlags, SendOp, SendWr, UdDest, WcOpcode, WcStatus, WorkCompletion};

use super::pattern::{self, Rng};
use super::Totals;

/// Bytes of the GRH in front of every UD receive.
pub const GRH: usize = 40;
/// Sequence number (8) and flow id (4) lead every message.
const HDR: usize = 12;
/// Receives per SEND in flight: a UD sender's SEND completes when it leaves,
/// so a burst can outrun the reposting of receives; with this many, UD loss
/// is the impairments' (`resp_ud_no_wqe_dropped` counts the rest).
pub const RECV_PER_SEND: usize = 16;
/// Stream ids of UD flows, apart from the RC flows'.
const STREAM_BASE: u64 = 1 << 32;

/// One direction of a UD pair.
pub struct UdFlow {
    /// Index among the UD flows.
    pub id: usize,
    /// The pair.
    pub pair: usize,
    /// The sending side (0 or 1).
    pub send_side: usize,
    local: Mr,
    remote: Mr,
    mtu: usize,
    depth: usize,
    recv_depth: usize,
    dest: UdDest,
    sender_qpn: u32,
    sender_ipv4: Option<[u8; 4]>,
    pending: HashMap<u64, usize>,
    scratch: Vec<u8>,
    stage_free: Vec<usize>,
    next_wr: u64,
    next_seq: u64,
    last_seq: Option<u64>,
    recvs: HashMap<u64, usize>,
    next_recv: u64,
    /// Messages whose send completed.
    pub sent: u64,
    /// Messages received intact.
    pub received: u64,
    /// When a send completion last arrived (or the flow last went idle).
    pub last_progress: Instant,
}

/// The length of message `seq` of a stream: 12 bytes of header up to the MTU.
fn msg_len(mtu: usize, stream: u64, seed: u64, seq: u64) -> usize {
    HDR + (pattern::mix(pattern::key(seed, stream, seq)) % (mtu - HDR + 1) as u64) as usize
}

fn fail<T>(flow: usize, qpn: u32, what: String) -> Result<T, String> {
    Err(format!("UD flow {flow} (QP {qpn:#x}): {what}"))
}

impl UdFlow {
    /// Allocate staging at the sender and receive buffers at the receiver.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: usize,
        pair: usize,
        send_side: usize,
        send_pd: &Pd,
        recv_pd: &Pd,
        mtu: usize,
        depth: usize,
        dest: UdDest,
        sender_qpn: u32,
        sender_ipv4: Option<[u8; 4]>,
    ) -> Result<UdFlow, String> {
        let recv_depth = RECV_PER_SEND * depth;
        let local = send_pd.alloc_mr(depth * mtu, Access::LOCAL_WRITE).map_err(|e| format!("UD staging MR: {e}"))?;
        let mut remote = recv_pd.alloc_mr(recv_depth * (GRH + mtu), Access::LOCAL_WRITE).map_err(|e| format!("UD receive MR: {e}"))?;
        let n = remote.len();
        remote.fill_at(0, n, 0x5a).map_err(|e| format!("UD receive MR: {e}"))?;
        Ok(UdFlow {
            id,
            pair,
            send_side,
            local,
            remote,
            mtu,
            depth,
            recv_depth,
            dest,
            sender_qpn,
            sender_ipv4,
            pending: HashMap::new(),
            scratch: vec![0u8; GRH + mtu],
            stage_free: (0..depth).rev().collect(),
            next_wr: 1,
            next_seq: 0,
            last_seq: None,
            recvs: HashMap::new(),
            next_recv: 1,
            sent: 0,
            received: 0,
            last_progress: Instant::now(),
        })
    }

    /// Sends posted and not completed.
    pub fn outstanding(&self) -> usize {
        self.pending.len()
    }

    fn stream(&self) -> u64 {
        STREAM_BASE + self.id as u64
    }

    fn len_of(&self, seed: u64, seq: u64) -> usize {
        msg_len(self.mtu, self.stream(), seed, seq)
    }

    fn post_recv(&mut self, rq: &Qp, buf: usize) -> Result<(), String> {
        let wr_id = self.next_recv;
        self.next_recv += 1;
        let at = buf * (GRH + self.mtu);
        let wr = RecvWr { wr_id, sgl: vec![self.remote.sge(at, (GRH + self.mtu) as u32)] };
        match rq.post_recv(&wr) {
            Ok(()) => {
                self.recvs.insert(wr_id, buf);
                Ok(())
            }
            Err(e) => fail(self.id, rq.qp_num(), format!("post_recv: {e}")),
        }
    }

    /// Fill the receiver's queue.
    pub fn post_initial_recvs(&mut self, rq: &Qp) -> Result<(), String> {
        for b in 0..self.recv_depth {
            self.post_recv(rq, b)?;
        }
        Ok(())
    }

    /// Post SENDs on `sq` until `depth` are in flight.
    pub fn top_up(&mut self, sq: &Qp, _rng: &mut Rng, seed: u64) -> Result<(), String> {
        if self.pending.is_empty() {
            self.last_progress = Instant::now();
        }
        while self.pending.len() < self.depth {
            let Some(stage) = self.stage_free.pop() else { break };
            let seq = self.next_seq;
            let len = self.len_of(seed, seq);
            let base = stage * self.mtu;
            let id = self.id as u32;
            let k = pattern::key(seed, self.stream(), seq);
            let m = &mut self.scratch[..len];
            m[..8].copy_from_slice(&seq.to_le_bytes());
            m[8..12].copy_from_slice(&id.to_le_bytes());
            pattern::fill(&mut m[HDR..], k);
            if let Err(e) = self.local.write_at(base, m) {
                return fail(self.id, sq.qp_num(), format!("staging: {e}"));
            }
            let wr_id = self.next_wr;
            let wr = SendWr {
                wr_id,
                op: SendOp::Send,
                payload: Payload::Sgl(vec![self.local.sge(base, len as u32)]),
                flags: SendFlags::SIGNALED,
                ud: Some(self.dest),
            };
            if let Err(e) = sq.post_send(&wr) {
                return fail(self.id, sq.qp_num(), format!("post_send (wr_id {wr_id}): {e}"));
            }
            self.next_wr += 1;
            self.next_seq += 1;
            self.pending.insert(wr_id, stage);
        }
        Ok(())
    }

    /// A send completion of the sender QP.
    pub fn on_send_wc(&mut self, qpn: u32, wc: &WorkCompletion, tot: &mut Totals) -> Result<(), String> {
        let Some(stage) = self.pending.remove(&wc.wr_id) else {
            return fail(self.id, qpn, format!("completion for wr_id {} which is not outstanding (duplicate or unknown): {wc:?}", wc.wr_id));
        };
        tot.send_wcs += 1;
        self.last_progress = Instant::now();
        if wc.status != WcStatus::Success || wc.opcode != WcOpcode::Send {
            return fail(self.id, qpn, format!("UD SEND wr_id {} completed as {:?} {:?}", wc.wr_id, wc.opcode, wc.status));
        }
        self.sent += 1;
        self.stage_free.push(stage);
        Ok(())
    }

    /// A receive completion of the receiver QP `rq`.
    pub fn on_recv_wc(&mut self, rq: &Qp, wc: &WorkCompletion, seed: u64, tot: &mut Totals) -> Result<(), String> {
        let qpn = rq.qp_num();
        let Some(buf) = self.recvs.remove(&wc.wr_id) else {
            return fail(self.id, qpn, format!("receive completion for wr_id {} which is not posted (duplicate or unknown): {wc:?}", wc.wr_id));
        };
        tot.recv_wcs += 1;
        if wc.status != WcStatus::Success || wc.opcode != WcOpcode::Recv {
            return fail(self.id, qpn, format!("UD receive wr_id {} completed as {:?} {:?}", wc.wr_id, wc.opcode, wc.status));
        }
        if wc.src_qp != self.sender_qpn || !wc.grh || (wc.byte_len as usize) < GRH + HDR {
            return fail(
                self.id,
                qpn,
                format!("UD receive from QP {:#x} (sender is {:#x}), GRH {}, {} bytes", wc.src_qp, self.sender_qpn, wc.grh, wc.byte_len),
            );
        }
        let at = buf * (GRH + self.mtu);
        if wc.byte_len as usize > GRH + self.mtu {
            return fail(self.id, qpn, format!("UD receive of {} bytes into a {}-byte buffer", wc.byte_len, GRH + self.mtu));
        }
        let (stream, mtu) = (self.stream(), self.mtu);
        let m = &mut self.scratch[..wc.byte_len as usize];
        if let Err(e) = self.remote.read_at(at, m) {
            return fail(self.id, qpn, format!("reading receive buffer: {e}"));
        }
        let m = &*m;
        // rxe's GRH for IPv4: 20 reserved bytes, then the IPv4 header (source at 12..16).
        if let Some(ip) = self.sender_ipv4 {
            if m[20 + 12..20 + 16] != ip {
                return fail(self.id, qpn, format!("UD receive whose GRH source is {:?}, not the sender {ip:?}", &m[32..36]));
            }
        }
        let data = &m[GRH..];
        let mut s = [0u8; 8];
        s.copy_from_slice(&data[..8]);
        let seq = u64::from_le_bytes(s);
        let mut f = [0u8; 4];
        f.copy_from_slice(&data[8..12]);
        if u32::from_le_bytes(f) != self.id as u32 || seq >= self.next_seq {
            return fail(
                self.id,
                qpn,
                format!("UD message with header seq {seq} flow {} (next seq to send is {})", u32::from_le_bytes(f), self.next_seq),
            );
        }
        if let Some(last) = self.last_seq {
            if seq <= last {
                return fail(self.id, qpn, format!("UD message {seq} arrived after {last}: duplicated or reordered"));
            }
        }
        let want = msg_len(mtu, stream, seed, seq);
        if data.len() != want {
            return fail(self.id, qpn, format!("UD message {seq}: {} bytes, sent {want}", data.len()));
        }
        if let Some(off) = pattern::check(&data[HDR..], pattern::key(seed, stream, seq)) {
            return fail(self.id, qpn, format!("UD message {seq} of {want} bytes: byte {} differs", HDR + off));
        }
        self.last_seq = Some(seq);
        self.received += 1;
        tot.verified_bytes += want as u64;
        tot.verified_msgs += 1;
        tot.ud_received += 1;
        self.post_recv(rq, buf)
    }

    /// Messages sent and never received (so far).
    pub fn lost(&self) -> u64 {
        self.sent.saturating_sub(self.received)
    }
}
