//! The receive side's fused placement and ICRC check of an RDMA WRITE's
//! continuation (`responder/placed.rs`, `wire::parse_frame_deferring`).
//!
//! - the wire layer: which frames come with their ICRC left to the receiver,
//!   and `IcrcCheck::place` against `verify` and `parse_frame` over good
//!   frames and frames with one bit flipped anywhere;
//! - the engine: continuations are placed with their check; one with a bad
//!   ICRC changes nothing but the bad-ICRC counter and bytes in the part of
//!   the WRITE not yet written, and the retransmission completes the WRITE;
//!   every refusal (PSN ahead, P_Key, no WRITE in progress) with a bad ICRC
//!   is counted as a bad ICRC and never answered, with a good one it is
//!   answered as before.

use rocev2::psn::Psn;
use rocev2::sim::pair::{Dir, Pair, PairConfig};
use rocev2::sim::rc::{HostAddr, RcParams};
use rocev2::transport::attr::{Mtu, QpState};
use rocev2::transport::events::WireErrorKind;
use rocev2::transport::path::PathHeaders;
use rocev2::transport::wr::*;
use rocev2::wire::{crc, parse_frame, parse_frame_deferring, AckSyndrome, BthRepr, NakCode, Opcode, RethRepr, TransportRepr, WireError};
use std::time::Duration;

const BUF: usize = 256 * 1024;

/// A frame with a correct ICRC from host 1 to host 2 (IPv4 or IPv6).
fn frame(ipv6: bool, t: TransportRepr, payload: &[u8]) -> Vec<u8> {
    let host = |n| if ipv6 { HostAddr::ipv6(n) } else { HostAddr::ipv4(n) };
    let mut buf = vec![0u8; 9000];
    let n = PathHeaders::new(&host(1).path_to(&host(2)), 0xc000).frame(t).emit(payload, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

fn noise(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32).map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 13) as u8).collect()
}

fn bth(op: Opcode) -> TransportRepr {
    TransportRepr::bth_only(BthRepr::new(op, 0x40, Psn::new(77)))
}

/// The deferred check of a frame: `None` if the parse checked it itself.
fn deferred(f: &[u8]) -> Option<bool> {
    parse_frame_deferring(f, |_, check| check.map(|c| c.verify().is_ok())).unwrap()
}

#[test]
fn only_rc_write_continuations_the_fused_kernel_takes_are_left_to_the_receiver() {
    if !crc::place_available() {
        eprintln!("this CPU has no AVX-512BW/VPCLMULQDQ: every frame is checked by the parse, nothing is deferred");
    }
    let wide = crc::place_available();
    let big = noise(1024, 1);
    for ipv6 in [false, true] {
        assert_eq!(deferred(&frame(ipv6, bth(Opcode::RC_WRITE_MIDDLE), &big)), wide.then_some(true));
        assert_eq!(deferred(&frame(ipv6, bth(Opcode::RC_WRITE_LAST), &big[..crc::PLACE_MIN])), wide.then_some(true));
        assert_eq!(deferred(&frame(ipv6, bth(Opcode::RC_WRITE_LAST), &big[..crc::PLACE_MIN - 1])), None, "shorter than the kernel takes");
        let reth = Some(RethRepr { va: 0x1000, rkey: 7, dma_len: 1024 });
        let first = TransportRepr { reth, ..bth(Opcode::RC_WRITE_FIRST) };
        let only = TransportRepr { reth, ..bth(Opcode::RC_WRITE_ONLY) };
        let last_imm = TransportRepr { immediate: Some(5), ..bth(Opcode::RC_WRITE_LAST_IMM) };
        for t in [first, only, last_imm, bth(Opcode::UC_WRITE_MIDDLE), bth(Opcode::RC_SEND_MIDDLE)] {
            assert_eq!(deferred(&frame(ipv6, t, &big)), None, "{:?}", t.bth.opcode);
        }
    }
}

#[test]
fn placing_checks_the_icrc_as_the_parse_does_for_flipped_bits() {
    if !crc::place_available() {
        eprintln!("this CPU has no AVX-512BW/VPCLMULQDQ: nothing is deferred, nothing to place");
        return;
    }
    let mut frames = 0;
    for ipv6 in [false, true] {
        for (op, len) in [
            (Opcode::RC_WRITE_MIDDLE, 1024),
            (Opcode::RC_WRITE_MIDDLE, 4096),
            (Opcode::RC_WRITE_MIDDLE, 256),
            (Opcode::RC_WRITE_LAST, 256),
            (Opcode::RC_WRITE_LAST, 257),
            (Opcode::RC_WRITE_LAST, 470),
            (Opcode::RC_WRITE_LAST, 513),
            (Opcode::RC_WRITE_LAST, 1021),
            (Opcode::RC_WRITE_LAST, 2047),
            (Opcode::RC_WRITE_LAST, 4095),
        ] {
            let payload = noise(len, len as u32);
            let good = frame(ipv6, bth(op), &payload);
            // Bits of the IP packet from the IP header on (the Ethernet
            // header is not covered), one at a time, every 7th (every 61st
            // in frames over 1 KiB): at a masked field the ICRC still
            // holds, anywhere else it fails, and the fused check must say
            // what the parse says.
            let step = if len > 1024 { 61 } else { 7 };
            for bit in (14 * 8..good.len() * 8).step_by(step) {
                let mut f = good.clone();
                f[bit / 8] ^= 1 << (bit % 8);
                let parsed = parse_frame(&f).map(|_| ());
                let mut dst = vec![0xa5u8; len + 32];
                let fused = parse_frame_deferring(&f, |p, check| {
                    let check = check?;
                    assert_eq!(check.payload_len(), p.payload.len());
                    assert!(check.payload_len() <= len);
                    // SAFETY: `dst` has room for the payload and is not the frame.
                    let placed = check.judge(unsafe { check.place(dst.as_mut_ptr()) }.expect("the parse defers only frames the kernel takes"));
                    assert_eq!(&dst[..p.payload.len()], p.payload, "bit {bit}: the payload lands as it is in the frame");
                    assert!(dst[p.payload.len()..].iter().all(|&b| b == 0xa5), "bit {bit}: nothing after it");
                    assert_eq!(placed.is_ok(), check.verify().is_ok(), "bit {bit}: place and verify agree");
                    Some(placed)
                });
                match (parsed, fused) {
                    // A header the parse refuses before the ICRC (an IPv4
                    // checksum, a length): the same refusal.
                    (Err(e), Err(g)) => assert_eq!(e, g, "bit {bit}"),
                    (Ok(()), Ok(Some(placed))) => assert!(placed.is_ok(), "bit {bit}"),
                    (Err(WireError::BadIcrc { .. }), Ok(Some(placed))) => {
                        assert!(matches!(placed, Err(WireError::BadIcrc { .. })), "bit {bit}: the fused check finds the bad ICRC")
                    }
                    // The flipped bit made it another opcode or length: the
                    // parse decides as it does for any frame.
                    (parsed, Ok(None)) => assert_eq!(parsed, parse_frame(&f).map(|_| ()), "bit {bit}"),
                    (parsed, fused) => panic!("bit {bit}: the parse says {parsed:?}, the deferring parse {fused:?}"),
                }
                frames += 1;
            }
            // The frame as sent: placed, good.
            let mut dst = vec![0u8; len];
            // SAFETY: `dst` has room for the payload and is not the frame.
            let ok = parse_frame_deferring(&good, |_, c| c.unwrap().judge(unsafe { c.unwrap().place(dst.as_mut_ptr()) }.unwrap())).unwrap();
            assert_eq!((ok, &dst[..]), (Ok(()), &payload[..]));
        }
    }
    assert!(frames > 10_000);
}

// ---------------------------------------------------------------- engine

/// Hosts 1 (QPN 0x11) and 2 (0x40), RC, MTU `mtu`, first PSNs 100 and 5000,
/// IPv4.
fn pair(mtu: Mtu) -> Pair {
    pair_on(mtu, false)
}

/// [`pair`] on IPv4 or IPv6.
fn pair_on(mtu: Mtu, ipv6: bool) -> Pair {
    let host = |n| if ipv6 { HostAddr::ipv6(n) } else { HostAddr::ipv4(n) };
    let mut cfg = PairConfig { hosts: [host(1), host(2)], buf_len: BUF, ..PairConfig::default() };
    cfg.engines[0].first_qpn = 0x11;
    cfg.engines[1].first_qpn = 0x40;
    cfg.params = [100, 5000].map(|psn| RcParams { mtu, sq_psn: Psn::new(psn), retry_cnt: 7, ..RcParams::default() });
    Pair::new(&cfg).unwrap()
}

fn pattern(p: &mut Pair, len: usize, seed: u8) {
    for (i, b) in p.a.mem_mut()[..len].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(13).wrapping_add(seed);
    }
}

fn post_write(p: &mut Pair, id: u64, len: usize) {
    let (remote, sge) = (p.b.remote(0), p.a.sge(0, len as u32));
    let wr = SendWr { wr_id: id, op: SendOp::Write { remote }, payload: Payload::Sgl(vec![sge]), flags: SendFlags::SIGNALED, ud: None };
    p.a.engine.post_send(p.a.qpn, wr).unwrap();
}

fn bad_icrcs(p: &Pair) -> u64 {
    p.b.engine.stats().rx_bad_frame.get(&WireErrorKind::BadIcrc).copied().unwrap_or(0)
}

/// Flip a bit in the payload's last 16 bytes (the fused check's tail).
fn corrupt(f: &[u8]) -> Vec<u8> {
    let mut f = f.to_vec();
    let at = f.len() - 4 - 9;
    f[at] ^= 0x10;
    f
}

/// Frame `f` again with its BTH changed by `edit`, its ICRC made right.
fn with_bth(f: &[u8], edit: impl FnOnce(&mut BthRepr)) -> Vec<u8> {
    let p = parse_frame(f).unwrap();
    let mut repr = p.repr;
    edit(&mut repr.transport.bth);
    let mut out = vec![0u8; repr.frame_len(p.payload.len())];
    let n = repr.emit(p.payload, &mut out).unwrap();
    out.truncate(n);
    out
}

/// What `b` has to send now, parsed.
fn b_sends(p: &mut Pair) -> Vec<TransportRepr> {
    let mut buf = vec![0u8; 9000];
    let mut out = Vec::new();
    while let Some(n) = p.b.engine.poll_transmit(p.now, &mut buf) {
        out.push(parse_frame(&buf[..n]).unwrap().repr.transport);
    }
    out
}

/// A WRITE of `len` bytes posted; only its FIRST delivered, the other data
/// frames kept and returned (the requester has sent them all).
fn first_delivered(p: &mut Pair, len: usize) -> Vec<Vec<u8>> {
    pattern(p, len, 3);
    post_write(p, 1, len);
    let mut seen = 0;
    p.run_filtered(Duration::from_micros(100), |f| {
        if f.dir != Dir::AtoB {
            return true;
        }
        seen += 1;
        seen == 1
    })
}

#[test]
fn write_continuations_are_placed_with_their_icrc_checked() {
    let cases = [
        (Mtu::Mtu1024, 10 * 1024 - 3, 10, false),
        (Mtu::Mtu4096, 64 * 1024, 16, false),
        (Mtu::Mtu512, 4096 + 100, 9, false),
        (Mtu::Mtu4096, 64 * 1024 - 1, 16, true),
    ];
    for (mtu, len, frames, ipv6) in cases {
        let mut p = pair_on(mtu, ipv6);
        pattern(&mut p, len, 9);
        post_write(&mut p, 1, len);
        p.run();
        let c = p.a.completions();
        assert_eq!((c.len(), c[0].status), (1, WcStatus::Success));
        assert_eq!(&p.b.mem()[..len], &p.a.mem()[..len], "{mtu:?} ipv6={ipv6}");
        let s = p.b.engine.stats();
        // Every frame after the FIRST (the LAST only from PLACE_MIN bytes).
        let last = len - (frames - 1) * mtu.bytes() as usize;
        let want = (frames - 2 + usize::from(last >= crc::PLACE_MIN)) as u64;
        assert_eq!(s.rx_icrc_at_placement, if crc::place_available() { want } else { 0 }, "{mtu:?} ipv6={ipv6}");
        assert_eq!(bad_icrcs(&p), 0);
    }
}

#[test]
fn a_bad_icrc_at_placement_changes_nothing_and_the_retransmission_completes_the_write() {
    let len = 8 * 1024;
    let mut p = pair(Mtu::Mtu1024);
    let rest = first_delivered(&mut p, len);
    assert_eq!(rest.len(), 7, "six MIDDLEs and a LAST kept");
    let (psn, qp_rx, before) = (p.b.rq_psn(), p.b.engine.qp_stats(p.b.qpn).unwrap().rx_packets, p.b.mem()[..len].to_vec());
    let placed = p.b.engine.stats().rx_icrc_at_placement;

    p.b.engine.handle_frame(p.now, &corrupt(&rest[0]));
    assert_eq!(bad_icrcs(&p), 1);
    assert_eq!(p.b.rq_psn(), psn, "the expected PSN did not move");
    assert_eq!(p.b.engine.qp_stats(p.b.qpn).unwrap().rx_packets, qp_rx, "the QP did not see it");
    assert_eq!(p.b.engine.stats().rx_icrc_at_placement, placed);
    assert!(b_sends(&mut p).is_empty(), "no ACK, no NAK");
    // Bytes changed only where the second packet goes.
    for (i, (x, y)) in p.b.mem()[..len].iter().zip(&before).enumerate() {
        assert!(x == y || (1024..2048).contains(&i), "byte {i} changed outside the packet's place");
    }

    // The real packets, as a retransmission brings them: accepted, placed,
    // and the WRITE completes with the right bytes.
    for f in &rest {
        p.b.engine.handle_frame(p.now, f);
    }
    p.run();
    let c = p.a.completions();
    assert_eq!((c.len(), c[0].status), (1, WcStatus::Success));
    assert_eq!(&p.b.mem()[..len], &p.a.mem()[..len]);
    assert_eq!(bad_icrcs(&p), 1);
    if crc::place_available() {
        assert!(p.b.engine.stats().rx_icrc_at_placement >= placed + 7);
    }
}

#[test]
fn a_refused_continuation_with_a_bad_icrc_is_counted_as_one_and_never_answered() {
    let len = 8 * 1024;
    // PSN ahead: with a bad ICRC nothing; with a good one the sequence NAK.
    let mut p = pair(Mtu::Mtu1024);
    let rest = first_delivered(&mut p, len);
    let (psn, before) = (p.b.rq_psn(), p.b.mem()[..len].to_vec());
    p.b.engine.handle_frame(p.now, &corrupt(&rest[1]));
    assert_eq!((bad_icrcs(&p), p.b.rq_psn()), (1, psn));
    assert!(b_sends(&mut p).is_empty(), "a bad ICRC is not answered");
    p.b.engine.handle_frame(p.now, &rest[1]);
    let sent = b_sends(&mut p);
    assert!(
        sent.iter().any(|t| t.aeth.is_some_and(|a| a.syndrome == AckSyndrome::Nak(NakCode::PsnSequenceError))),
        "a good one ahead of the expected PSN gets the sequence NAK: {sent:?}"
    );
    assert_eq!(&p.b.mem()[..len], &before[..], "a refused frame places nothing");

    // P_Key: a bad ICRC is counted as that, not as a wrong P_Key.
    let mut p = pair(Mtu::Mtu1024);
    let rest = first_delivered(&mut p, len);
    let before = p.b.mem()[..len].to_vec();
    let f = with_bth(&rest[0], |b| b.pkey = 0x1234);
    p.b.engine.handle_frame(p.now, &corrupt(&f));
    assert_eq!((bad_icrcs(&p), p.b.engine.stats().rx_bad_pkey), (1, 0));
    p.b.engine.handle_frame(p.now, &f);
    assert_eq!((bad_icrcs(&p), p.b.engine.stats().rx_bad_pkey), (1, 1));
    assert_eq!(p.b.qp_state(), QpState::Rts);
    assert_eq!(&p.b.mem()[..len], &before[..], "a refused frame places nothing");

    // No WRITE in progress (the last one completed): a MIDDLE at the
    // expected PSN is an invalid request that kills the QP; with a bad
    // ICRC it is dropped and the QP lives.
    let mut p = pair(Mtu::Mtu1024);
    let rest = first_delivered(&mut p, len);
    for f in &rest {
        p.b.engine.handle_frame(p.now, f);
    }
    p.run();
    assert_eq!(p.a.completions()[0].status, WcStatus::Success);
    let psn = p.b.rq_psn();
    let stray = with_bth(&rest[0], |b| b.psn = psn);
    p.b.mem_mut()[..len].fill(0);
    p.b.engine.handle_frame(p.now, &corrupt(&stray));
    assert_eq!((bad_icrcs(&p), p.b.qp_state()), (1, QpState::Rts));
    assert!(b_sends(&mut p).is_empty());
    p.b.engine.handle_frame(p.now, &stray);
    let sent = b_sends(&mut p);
    assert!(sent.iter().any(|t| t.aeth.is_some_and(|a| a.syndrome == AckSyndrome::Nak(NakCode::InvalidRequest))), "{sent:?}");
    assert_eq!(p.b.qp_state(), QpState::Err);
    assert!(p.b.mem()[..len].iter().all(|&b| b == 0), "a refused frame places nothing");
}
