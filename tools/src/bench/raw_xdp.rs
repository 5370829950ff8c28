//! The raw AF_XDP baselines of `urnic bench`: the ceiling (MTU-sized RoCE
//! frames from one AF_XDP socket to the other through the XDP program,
//! doing nothing else; one thread or a sender and a receiver) and the
//! ping-pong (one frame of an 8-byte SEND's length bounced between the two
//! sockets). Frames are built with `rocev2::wire`'s emitters (valid ICRC).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use rocev2::wire::{BthRepr, EthernetRepr, FrameRepr, IpRepr, Ipv4Repr, Opcode, TransportRepr, UdpRepr, ROCEV2_UDP_PORT};
use urnic::XskConfig;
use urnic_datapath::netns::{in_netns, VethPair};
use urnic_datapath::{Port, XskPort};

use super::metrics::{cpu_self, UserClock};
use super::Cores;
use crate::perf::SpinDeadline;

/// A RoCE frame of `frame_len` bytes (a WRITE MIDDLE to a QPN nobody has,
/// valid ICRC) from end 0 to end 1 of `pair`.
fn raw_frame(pair: &VethPair, frame_len: usize) -> Result<Vec<u8>> {
    raw_frame_from(pair, 0, frame_len)
}

/// [`raw_frame`] sent from veth end `from` (0 or 1) to the other.
fn raw_frame_from(pair: &VethPair, from: usize, frame_len: usize) -> Result<Vec<u8>> {
    let (from, to) = if from == 0 { (0, 1) } else { (1, 0) };
    let repr = roce_repr(Opcode::RC_WRITE_MIDDLE, (pair.mac[from], pair.mac[to]), (pair.ipv4[from], pair.ipv4[to]));
    // Headers and ICRC take what the payload does not.
    let payload = frame_len.checked_sub(repr.frame_len(0)).context("raw frame shorter than its headers")?;
    let mut f = vec![0u8; repr.frame_len(payload)];
    repr.emit(&vec![0x5a; payload], &mut f).context("emitting the raw frame")?;
    Ok(f)
}

/// The headers of an `opcode` packet from `macs.0`/`ips.0` to `macs.1`/`ips.1`
/// (IPv4, ECT(0), to QPN 0x77 with PSN 1); `emit` fills in the lengths and
/// the ICRC.
fn roce_repr(opcode: Opcode, macs: ([u8; 6], [u8; 6]), ips: ([u8; 4], [u8; 4])) -> FrameRepr {
    FrameRepr {
        eth: EthernetRepr { dst: macs.1, src: macs.0, vlan: None, ethertype: 0x0800 },
        ip: IpRepr::V4(Ipv4Repr { src: ips.0, dst: ips.1, dscp: 0, ecn: 2, ident: 0, dont_frag: true, ttl: 64, protocol: 17, payload_len: 0 }),
        udp: UdpRepr { src_port: 50000, dst_port: ROCEV2_UDP_PORT, length: 0, checksum: 0 },
        transport: TransportRepr::bth_only(BthRepr::new(opcode, 0x77, rocev2::Psn::new(1))),
    }
}

/// Queue a copy of `frame` on `port` (no kick); whether it was queued.
fn queue_copy(port: &mut XskPort, frame: &[u8]) -> bool {
    let fill = &mut |buf: &mut [u8]| {
        let n = frame.len().min(buf.len());
        buf[..n].copy_from_slice(&frame[..n]);
        Some(n)
    };
    matches!(port.transmit_with(fill), Ok(true))
}

/// Push up to 64 copies of `frame` into `tx` and kick it; frames queued.
fn blast(tx: &mut XskPort, frame: &[u8]) -> u64 {
    let mut sent = 0;
    while sent < 64 && queue_copy(tx, frame) {
        sent += 1;
    }
    let _ = tx.flush();
    sent
}

/// Raw AF_XDP sockets on both veth ends (0, 1), with the XDP program.
fn raw_ports(pair: &VethPair) -> Result<(XskPort, XskPort)> {
    let open = |end: usize| {
        let ifname = pair.ifname[end].clone();
        let what = format!("raw AF_XDP socket on {} in {}", pair.ifname[end], pair.ns[end]);
        in_netns(Some(&pair.ns[end]), move || XskPort::open(&XskConfig::new(&ifname))).context(what.clone())?.context(what)
    };
    Ok((open(0)?, open(1)?))
}

/// Receive up to `budget` frames on `port`; how many were `len` bytes long
/// (whole frames as handed up, not the descriptors they took: at 4154 bytes
/// a frame spans two UMEM chunks, and counting chunks once doubled the
/// ceiling). Frames of other lengths (IPv6 neighbour discovery) are passed over.
fn received_of_len(port: &mut XskPort, budget: usize, len: usize) -> u64 {
    count_received(port, budget, len, |_| {})
}

/// [`received_of_len`], reading every byte of each frame once (a sum of
/// its 8-byte words): what any receiver that uses its data pays at least.
fn read_received_of_len(port: &mut XskPort, budget: usize, len: usize) -> u64 {
    count_received(port, budget, len, |f| {
        std::hint::black_box(word_sum(f));
    })
}

/// Receive up to `budget` frames on `port`, handing each to `each`; how many
/// were `len` bytes long.
#[inline(always)]
fn count_received(port: &mut XskPort, budget: usize, len: usize, mut each: impl FnMut(&[u8])) -> u64 {
    let mut n = 0u64;
    let _ = port.receive(budget, &mut |f| {
        each(f);
        n += u64::from(f.len() == len);
    });
    n
}

/// The wrapping sum of `bytes`' little-endian 8-byte words (a tail shorter
/// than a word is left out).
fn word_sum(bytes: &[u8]) -> u64 {
    bytes.chunks_exact(8).map(|w| u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]])).fold(0, u64::wrapping_add)
}

/// The raw AF_XDP ceiling: frames per second delivered from one AF_XDP
/// socket to the other through the same XDP program, `frame_len`-byte RoCE
/// frames; one thread doing both (`Cores::One`) or a sender and a receiver.
pub(super) fn raw_afxdp(pair: &VethPair, frame_len: usize, cores: Cores, secs: f64) -> Result<f64> {
    raw_afxdp_with(pair, frame_len, cores, secs, received_of_len)
}

/// [`raw_afxdp`] with two cores, its receiver reading every byte of each
/// frame once ([`word_sum`]). The plain ceiling's receiver touches no
/// payload; urnic's reads it all (the ICRC check, the placement copy), and
/// so does any receiver that uses its data. On a host where the cores' cache
/// traffic is sometimes slow, this ceiling falls with urnic and the plain
/// one does not (perf-notes, "The two-core slow mode is the host's").
pub(super) fn raw_afxdp_reading(pair: &VethPair, frame_len: usize, secs: f64) -> Result<f64> {
    raw_afxdp_with(pair, frame_len, Cores::Two, secs, read_received_of_len)
}

/// The ceiling's body; `receive(port, budget, len)` takes what arrived and
/// counts the `len`-byte frames.
fn raw_afxdp_with(pair: &VethPair, frame_len: usize, cores: Cores, secs: f64, receive: fn(&mut XskPort, usize, usize) -> u64) -> Result<f64> {
    let frame = raw_frame(pair, frame_len)?;
    let (mut tx, mut rx) = raw_ports(pair)?;
    let len = frame.len();
    let count = move |rx: &mut XskPort| receive(rx, 256, len);
    match cores {
        Cores::One => Ok(one_thread(&mut tx, &mut rx, &frame, secs, false).pps),
        Cores::Two => {
            let stop = Arc::new(AtomicBool::new(false));
            let s2 = stop.clone();
            let sender = std::thread::spawn(move || {
                while !s2.load(Ordering::Relaxed) {
                    blast(&mut tx, &frame);
                }
            });
            let warm = Instant::now() + Duration::from_millis(200);
            while Instant::now() < warm {
                count(&mut rx);
            }
            let (start, mut got) = (Instant::now(), 0u64);
            while start.elapsed().as_secs_f64() < secs {
                got += count(&mut rx);
            }
            let pps = got as f64 / start.elapsed().as_secs_f64();
            stop.store(true, Ordering::Relaxed);
            let _ = sender.join();
            Ok(pps)
        }
    }
}

/// What the one-thread ceiling measured.
pub(super) struct OneThread {
    /// Frames per second (wall clock).
    pub(super) pps: f64,
    /// User CPU seconds per frame, exact ([`UserClock`]: an error if the
    /// thread was switched out in every lap), if asked for (timing the
    /// kicks adds two clock reads to each: not while the rate is what
    /// counts).
    pub(super) user_per_frame: Option<Result<f64>>,
    /// CPU seconds (user + system) per frame: the rate the thread would
    /// reach on a core of its own, whatever else the host runs.
    pub(super) cpu_per_frame: f64,
}

/// The one-thread ceiling on open sockets: a 200 ms warm-up, then `secs`
/// of sending and receiving.
fn one_thread(tx: &mut XskPort, rx: &mut XskPort, frame: &[u8], secs: f64, time_user: bool) -> OneThread {
    let len = frame.len();
    let warm = Instant::now() + Duration::from_millis(200);
    while Instant::now() < warm {
        blast(tx, frame);
        received_of_len(rx, 256, len);
    }
    let (start, mut clock, cpu0, mut got) = (Instant::now(), time_user.then(UserClock::start), cpu_self(), 0u64);
    let mut lap = (Instant::now(), 0u64);
    while start.elapsed().as_secs_f64() < secs {
        blast(tx, frame);
        let n = received_of_len(rx, 256, len);
        got += n;
        lap.1 += n;
        // Laps of about 10 ms for the user CPU (see `UserClock`).
        if let Some(c) = clock.as_mut().filter(|_| lap.0.elapsed() >= Duration::from_millis(10)) {
            c.lap(lap.1 as f64);
            lap = (Instant::now(), 0);
        }
    }
    let (elapsed, cpu) = (start.elapsed().as_secs_f64(), cpu_self() - cpu0);
    let n = got.max(1) as f64;
    OneThread { pps: got as f64 / elapsed, user_per_frame: clock.map(|c| c.per_unit()), cpu_per_frame: cpu / n }
}

/// The one-thread raw ceiling of `frame_len`-byte frames for `secs`, with
/// its CPU per frame, and with `time_user` its user CPU per frame too (the
/// ring handling any AF_XDP stack pays: `rate`'s CPU floor).
pub(super) fn raw_afxdp_cpu(pair: &VethPair, frame_len: usize, secs: f64, time_user: bool) -> Result<OneThread> {
    let frame = raw_frame(pair, frame_len)?;
    let (mut tx, mut rx) = raw_ports(pair)?;
    Ok(one_thread(&mut tx, &mut rx, &frame, secs, time_user))
}

/// Frame length of an 8-byte SEND ONLY: Ethernet, IPv4, UDP, BTH, payload, ICRC.
pub(super) const SEND8_FRAME: usize = 14 + 20 + 8 + 12 + 8 + 4;

/// Queue `frame` on `port` and kick it; whether it was queued.
fn send_one(port: &mut XskPort, frame: &[u8]) -> bool {
    send_frames(port, &[frame])
}

/// Queue `frames` on `port` in order and kick them together; whether all
/// were queued.
fn send_frames(port: &mut XskPort, frames: &[&[u8]]) -> bool {
    let queued = frames.iter().all(|f| queue_copy(port, f));
    let _ = port.flush();
    queued
}

/// Receive up to `budget` frames on `port`: how many were `lens[0]` and
/// how many `lens[1]` bytes long.
fn received_of_lens(port: &mut XskPort, budget: usize, lens: [usize; 2]) -> [u64; 2] {
    let mut n = [0u64; 2];
    let _ = port.receive(budget, &mut |f| {
        for k in 0..2 {
            n[k] += u64::from(f.len() == lens[k]);
        }
    });
    n
}

/// The raw AF_XDP ping-pong: one frame of urnic's 8-byte SEND length
/// bounced between the two AF_XDP sockets through the same XDP program,
/// nothing else: the latency floor any AF_XDP stack has here.
///
/// The raw ping-pong one round trip at a time: socket A sends the ping and
/// waits for the pong; the echo end B answers from the same thread inside
/// [`RawPingPong::round`], or, once [`RawPingPong::split_echo`] has handed
/// it out, from whichever thread polls the [`RawEcho`].
///
/// With an ACK (`round(true)`), a frame of an RC ACK's length goes before
/// the ping in the same kick, and the echo answers in kind: two frames each
/// way, as an RC SEND ping-pong moves them (the reply and the ACK of the
/// peer's message, in one kick) — the floor for a reliable transport over
/// AF_XDP here, beside the one-frame floor.
pub(super) struct RawPingPong {
    a: XskPort,
    echo: Option<RawEcho>,
    ping: Vec<u8>,
    ack: Vec<u8>,
}

/// The echo end of the raw ping-pong: answers every ping with a pong, with
/// an ACK-length frame before it if one came with the ping.
pub(super) struct RawEcho {
    port: XskPort,
    pong: Vec<u8>,
    ack: Vec<u8>,
    /// An ACK-length frame arrived and the pong has not gone yet.
    acked: bool,
}

impl RawEcho {
    /// Answer the pings that have arrived (one pong each).
    pub(super) fn poll(&mut self) {
        let [pings, acks] = received_of_lens(&mut self.port, 64, [self.pong.len(), self.ack.len()]);
        self.acked |= acks > 0;
        for _ in 0..pings {
            if std::mem::take(&mut self.acked) {
                send_frames(&mut self.port, &[&self.ack, &self.pong]);
            } else {
                send_one(&mut self.port, &self.pong);
            }
        }
    }
}

impl RawPingPong {
    /// Raw sockets on both ends of `pair`, frames of [`SEND8_FRAME`] bytes.
    pub(super) fn new(pair: &VethPair) -> Result<RawPingPong> {
        let (ping, pong) = (raw_frame_from(pair, 0, SEND8_FRAME)?, raw_frame_from(pair, 1, SEND8_FRAME)?);
        let (ack_a, ack_b) = (raw_frame_from(pair, 0, ACK_FRAME)?, raw_frame_from(pair, 1, ACK_FRAME)?);
        let (a, port) = raw_ports(pair)?;
        Ok(RawPingPong { a, echo: Some(RawEcho { port, pong, ack: ack_b, acked: false }), ping, ack: ack_a })
    }

    /// Hand the echo end to another thread (None if already handed out).
    pub(super) fn split_echo(&mut self) -> Option<RawEcho> {
        self.echo.take()
    }

    /// One round trip (2 s at most for each answer), `with_ack`: two
    /// frames each way.
    pub(super) fn round(&mut self, with_ack: bool) -> Result<()> {
        let sent = if with_ack { send_frames(&mut self.a, &[&self.ack, &self.ping]) } else { send_one(&mut self.a, &self.ping) };
        if !sent {
            bail!("raw AF_XDP ping-pong: no transmit buffer");
        }
        let (len, mut deadline) = (self.ping.len(), SpinDeadline::new(Instant::now() + Duration::from_secs(2)));
        while received_of_lens(&mut self.a, 64, [len, 0])[0] == 0 {
            if let Some(echo) = &mut self.echo {
                echo.poll();
            }
            if deadline.passed() {
                bail!("raw AF_XDP ping-pong: no answer in 2 s");
            }
        }
        Ok(())
    }
}

/// Frame length of one full-MTU WRITE MIDDLE/LAST packet: Ethernet, IPv4,
/// UDP, BTH, payload, ICRC.
pub(super) fn write_frame_len(mtu: usize) -> usize {
    14 + 20 + 8 + 12 + mtu + 4
}

/// Frame length of a bare RC ACK: Ethernet, IPv4, UDP, BTH, AETH, ICRC.
pub(super) const ACK_FRAME: usize = 14 + 20 + 8 + 12 + 4 + 4;

/// Frame length of a one-packet 64-byte WRITE ONLY (with its RETH).
pub(super) const WRITE64_FRAME: usize = 14 + 20 + 8 + 12 + 16 + 64 + 4;

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes of an `opcode` frame carrying `payload` bytes, as the wire layer lays it out.
    fn wire_len(opcode: Opcode, payload: usize) -> usize {
        roce_repr(opcode, ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]), ([10, 0, 0, 1], [10, 0, 0, 2])).frame_len(payload)
    }

    #[test]
    fn frame_lengths_match_the_wire_layer() {
        assert_eq!(write_frame_len(1024), 1082);
        assert_eq!(write_frame_len(1024), wire_len(Opcode::RC_WRITE_MIDDLE, 1024));
        assert_eq!(write_frame_len(4096), wire_len(Opcode::RC_WRITE_LAST, 4096));
        assert_eq!(WRITE64_FRAME, 138);
        assert_eq!(WRITE64_FRAME, wire_len(Opcode::RC_WRITE_ONLY, 64));
        assert_eq!(SEND8_FRAME, wire_len(Opcode::RC_SEND_ONLY, 8));
    }

    #[test]
    fn the_reading_receiver_sums_every_whole_word() {
        assert_eq!(word_sum(&[]), 0);
        // A tail shorter than a word is left out.
        assert_eq!(word_sum(&[1, 0, 0, 0, 0, 0, 0, 0, 9]), 1);
        let mut frame = vec![0u8; write_frame_len(4096)];
        frame[0] = 1;
        frame[4096] = 2;
        frame[4152] = 3; // 4154 bytes: the last whole word starts at 4144
        assert_eq!(word_sum(&frame), 3);
        let max = [0xff; 16];
        assert_eq!(word_sum(&max), u64::MAX.wrapping_add(u64::MAX), "wrapping");
    }
}
