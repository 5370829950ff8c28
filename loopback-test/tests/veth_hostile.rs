//! A live urnic device over veth takes fire from a raw sender in the peer
//! namespace — malformed, truncated, bad-ICRC, unknown-opcode, wrong-QPN,
//! wrong-rkey and random frames — while real RC traffic runs between the
//! two devices. The traffic completes with correct data, nothing panics,
//! real traffic alone counts no bad frame, and every injected frame is
//! counted exactly once under its reason.
//!
//! Each volley is confirmed counted before the next goes out, so the counts
//! are exact (a frame lost on the way, or counted under another reason,
//! fails the test) and the volleys do not overrun the receiver's rings.

#[path = "../../verbs-api/tests/common.rs"]
mod common;
mod veth;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::*;
use rand::{Rng, SeedableRng};
use rocev2::psn::Psn;
use rocev2::sim::forge::{self, Attack, ReqOp, Station, VictimView};
use rocev2::transport::engine::WireErrorKind;
use rocev2::wire::internet_checksum;
use rocev2::wire::{icrc, parse_frame};
use urnic::*;
use urnic_datapath::raw::RawSender;

/// Engine counters real traffic moves; every other one must hold exactly
/// what was injected.
const ENGINE_TRAFFIC: [&str; 3] = ["rx_frames", "rx_icrc_at_placement", "tx_frames"];

fn drop_counters(ctx: &Context) -> BTreeMap<String, u64> {
    ctx.engine_stats().iter().filter(|(k, _)| !ENGINE_TRAFFIC.contains(&k.as_str())).collect()
}

fn bad_key(kind: WireErrorKind) -> String {
    format!("rx_drop_{}", kind.name())
}

/// Volleys of hostile frames.
const N: u64 = 200;

#[test]
fn hostile_frames_are_counted_by_reason_while_traffic_completes() {
    veth::require_root();
    let (pair, ca, cb) = veth::pair(Impairments::default(), 1500);
    let mut a = side(&ca, 4 << 20);
    let b = side(&cb, 4 << 20);
    let qa = rc_qp(&a, None);
    let qb = rc_qp(&b, None);
    // perftest's ACK timeout (14: 67 ms): on a loaded two-core machine veth
    // itself drops bursts when the receiving side is descheduled.
    bring_up_with_timeout(&qa, &ca, qb.qp_num(), &cb, 1, 1000, 14);
    bring_up_with_timeout(&qb, &cb, qa.qp_num(), &ca, 1000, 1, 14);
    // The victim: a QP of device b in RTR, connected to device a's address,
    // expecting PSN 500 from a QP that sends nothing.
    let victim = rc_qp(&b, None);
    victim.connect(&Connect::new(0x777, ca.query_gid(1, 1).unwrap(), 9, 500)).unwrap();

    // Real traffic: a WRITE and a SEND per round, every byte checked.
    let round = |a: &mut Side, rounds: u64| {
        let len = 1 + (rounds as usize * 7919) % 200_000;
        fill(&mut a.mr, 0, len, rounds as u8);
        let remote = RemoteAddr { addr: b.mr.addr() + (1 << 20), rkey: b.mr.rkey() };
        qb.post_recv(&RecvWr { wr_id: rounds, sgl: vec![b.mr.sge(0, 1 << 20)] }).unwrap();
        qa.post_send(&send_wr(2 * rounds, SendOp::Write { remote }, vec![a.mr.sge(0, len as u32)])).unwrap();
        qa.post_send(&send_wr(2 * rounds + 1, SendOp::Send, vec![a.mr.sge(0, len as u32)])).unwrap();
        let c = wait(&a.cq, 2);
        assert_eq!(
            c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
            vec![(2 * rounds, WcStatus::Success), (2 * rounds + 1, WcStatus::Success)],
            "round {rounds}, {len} bytes; requester {:?}; responder {:?}; a: {}; b: {}",
            qa.stats(),
            qb.stats(),
            ca.counters(),
            cb.counters()
        );
        let r = wait(&b.cq, 1);
        assert_eq!((r[0].wr_id, r[0].status, r[0].byte_len as usize), (rounds, WcStatus::Success, len));
        assert_eq!(bytes(&b.mr, 0..len), &expected(len, rounds as u8)[..]);
        assert_eq!(bytes(&b.mr, 1 << 20..(1 << 20) + len), &expected(len, rounds as u8)[..]);
    };
    let mut rounds = 0u64;

    // Real traffic alone counts nothing on either device.
    while rounds < 5 {
        round(&mut a, rounds);
        rounds += 1;
    }
    for (name, ctx) in [("a", &ca), ("b", &cb)] {
        let nonzero: Vec<_> = drop_counters(ctx).into_iter().filter(|(_, v)| *v != 0).collect();
        assert!(nonzero.is_empty(), "device {name}: real traffic alone counted {nonzero:?}");
    }

    // Fire at device b from namespace a (raw frames leave u0 and reach u1),
    // from a's own address.
    let tx = RawSender::open_in(Some(&pair.ns[0]), &pair.ifname[0]).expect("raw sender in namespace a");
    let station = |i: usize| Station { mac: pair.mac[i], ip: IpAddr::from(pair.ipv4[i]) };
    let view = |qpn: u32, rq_psn: u32, rkey: u32, va: u64| VictimView {
        victim: station(1),
        peer: station(0),
        qpn,
        peer_qpn: 0x777,
        rq_psn: Psn::new(rq_psn),
        sq_psn: Psn::new(0),
        una: Psn::new(0),
        rkey,
        va,
    };
    // A well-formed SEND to a QPN nobody has.
    let mut good = Vec::new();
    forge::forge(Attack::StrangerRequest(ReqOp::Send), &view(0xab_cdef, 3, 0, 0), &station(0), 1, &mut good).unwrap();
    assert!(parse_frame(&good).is_ok());
    // A WRITE to the victim at its expected PSN, right in every way but the
    // key byte of the rkey (b.mr's index, so no other region can match).
    let mut bad_rkey = Vec::new();
    let v = view(victim.qp_num(), 500, b.mr.rkey() ^ 0xff, b.mr.addr() + (3 << 20));
    forge::forge(Attack::PeerWriteInWindow, &v, &station(0), 2, &mut bad_rkey).unwrap();
    let cb2 = cb.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let shooter = std::thread::spawn(move || -> BTreeMap<String, u64> {
        let mut want: BTreeMap<String, u64> = BTreeMap::new();
        let send = |f: &[u8]| tx.send(f).unwrap_or_else(|e| panic!("raw send of {} bytes: {e}", f.len()));
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x5eed);
        for i in 0..N {
            // Unknown QPN, valid in every other way.
            send(&good);
            count(&mut want, "rx_unknown_qpn".into());
            // Bad ICRC.
            let mut f = good.clone();
            let n = f.len();
            f[n - 1] ^= 0x5a;
            send(&f);
            count(&mut want, bad_key(WireErrorKind::BadIcrc));
            // Truncated: the IP and UDP lengths say less than a BTH + ICRC.
            let mut f = good.clone();
            f.truncate(14 + 20 + 8 + 10);
            set_lengths(&mut f);
            send(&f);
            count(&mut want, bad_key(WireErrorKind::Truncated));
            // Unknown opcode (a reserved RC opcode), ICRC resealed.
            let mut f = good.clone();
            f[14 + 20 + 8] = 0x1f;
            icrc::fill_frame(&mut f).unwrap();
            send(&f);
            count(&mut want, bad_key(WireErrorKind::BadOpcode));
            // Wrong rkey: once (it moves the victim to the error state, as
            // the spec says); counted by the victim's NAK, not as a drop.
            if i == 0 {
                send(&bad_rkey);
            }
            // Random bytes behind valid Ethernet/IPv4/UDP(4791) headers whose
            // lengths fit the frame: the XDP program hands it up and the
            // engine refuses it for what the wire parser finds first.
            let mut f = good.clone();
            let len = rng.gen_range(43..f.len());
            f.truncate(len);
            for byte in &mut f[42..] {
                *byte = rng.gen();
            }
            set_lengths(&mut f);
            let kind = match parse_frame(&f) {
                Err(e) => WireErrorKind::from(e),
                Ok(_) => panic!("volley {i}: random bytes made a valid frame (the seed is fixed: this does not happen)"),
            };
            send(&f);
            count(&mut want, bad_key(kind));
            // Entirely random frames to b's MAC: the XDP program passes them
            // to the kernel (none is IP/UDP/4791 to b's address: fixed seed),
            // so the engine never sees them.
            let mut f: Vec<u8> = (0..rng.gen_range(14..200)).map(|_| rng.gen()).collect();
            f[..6].copy_from_slice(&pair_mac_b(&good));
            send(&f);
            // Wait until the volley is counted.
            let total: u64 = want.values().sum();
            veth::wait_until(
                || format!("volley {i} counted ({total} frames): want {want:?}"),
                || drop_counters(&cb2).values().sum::<u64>(),
                |n| *n >= total,
            );
        }
        stop2.store(true, Ordering::Release);
        want
    });

    // Real traffic while the shooter runs.
    while !stop.load(Ordering::Acquire) || rounds < 25 {
        round(&mut a, rounds);
        rounds += 1;
    }
    let want_b = shooter.join().expect("the raw sender");

    // Exactly what was injected, under its reason, and nothing else on b.
    // On a exactly one frame: the victim's NAK, sent to the QP it is
    // connected to (0x777 on a's address), which does not exist.
    let exactly = |ctx: &Context, counted: &BTreeMap<String, u64>| {
        let mut want = drop_counters(ctx);
        want.values_mut().for_each(|v| *v = 0);
        for (k, n) in counted {
            *want.get_mut(k).unwrap_or_else(|| panic!("no counter {k}")) = *n;
        }
        want
    };
    assert_eq!(drop_counters(&cb), exactly(&cb, &want_b), "device b's drop counters");
    let want_a = BTreeMap::from([("rx_unknown_qpn".to_string(), 1)]);
    assert_eq!(drop_counters(&ca), exactly(&ca, &want_a), "device a's drop counters");
    // The wrong rkey drew one remote access NAK from the victim.
    let v = victim.stats().unwrap();
    assert_eq!(v.resp_naks_rem_access_sent, 1, "{v:?}");
    assert_eq!(v.resp_bytes_placed, 0, "{v:?}");
    assert_eq!(victim.query().unwrap().qp_state, QpState::Err);
    // The real QPs never saw any of it.
    assert_eq!(qa.query().unwrap().qp_state, QpState::Rts);
    assert_eq!(qb.query().unwrap().qp_state, QpState::Rts);
    assert_quiet(&a.cq);
    assert_quiet(&b.cq);
    let xdp = port_counters(&cb);
    assert!(xdp.iter().any(|(k, v)| k == "xdp_redirected" && *v > 0), "{xdp:?}");
    eprintln!("traffic rounds: {rounds}; device b drops: {want_b:?}; port: {xdp:?}");
}

fn count(want: &mut BTreeMap<String, u64>, key: String) {
    *want.entry(key).or_insert(0) += 1;
}

/// The destination MAC of an Ethernet frame.
fn pair_mac_b(f: &[u8]) -> [u8; 6] {
    f[..6].try_into().expect("an Ethernet header")
}

/// Make the IPv4 total length (and header checksum) and the UDP length of
/// an Ethernet/IPv4/UDP frame say its actual length.
fn set_lengths(f: &mut [u8]) {
    let ip_len = (f.len() - 14) as u16;
    f[16..18].copy_from_slice(&ip_len.to_be_bytes());
    f[24..26].copy_from_slice(&[0, 0]);
    let csum = internet_checksum(&f[14..34]);
    f[24..26].copy_from_slice(&csum.to_be_bytes());
    f[38..40].copy_from_slice(&(ip_len - 20).to_be_bytes());
}

fn port_counters(ctx: &Context) -> Vec<(String, u64)> {
    ctx.nic().with_port(|p| p.counters())
}
