//! The small-message rate and the CPU cost per frame in `urnic bench`:
//! the 64 B WRITE message rate against the raw AF_XDP ceiling's frames/s,
//! and urnic's user CPU per 4154-byte frame (64 KiB WRITE at MTU 4096)
//! against the mandatory floor measured in the same run.
//!
//! The floor is what any RoCEv2 stack over copy-mode AF_XDP pays in user
//! space per full-MTU frame carried from one device to the other: the ring
//! handling of the raw ceiling (its user CPU per frame, one thread sending
//! and receiving, less its own copy of a prebuilt frame into UMEM), the
//! send side's copy out of the registered region with the ICRC folded in
//! (one fused pass), the receive side's ICRC check (a second pass) and its
//! copy into the registered region. The frames cycle
//! through 4 MiB, as urnic's UMEM (1024 chunks of 4 KiB) does, and the
//! registered regions are the 128 KiB the 64 KiB WRITE measurement uses,
//! so the copies meet the caches as the real ones do.
//!
//! `urnic bench --rate` runs only these rows (quick A/B of datapath
//! changes): per run, the message rate bracketed with its ceiling (urnic,
//! ceiling, ceiling, urnic) for one and two cores, and the CPU row.

use std::time::Instant;

use anyhow::{Context as _, Result};
use rocev2::wire::crc;
use urnic_datapath::netns::VethPair;

use super::metrics::ratio_table;
use super::raw_xdp::{raw_afxdp, raw_afxdp_cpu, write_frame_len, WRITE64_FRAME};
use super::urnic_runs::{urnic_rate, urnic_user_cpu_64k};
use super::{bracketed, veth_pairs, Cores};
use crate::progress::Progress;

/// IB MTU of the CPU row's frames (4154 bytes on the wire).
pub(super) const CPU_MTU: usize = 4096;

/// Data frames of one 64 KiB WRITE at [`CPU_MTU`].
pub(super) const FRAMES_PER_64K: f64 = (65536 / CPU_MTU) as f64;

/// The mandatory user CPU per 4154-byte frame, µs, by part.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct CpuFloor {
    /// The raw ceiling's user CPU per frame (one thread sending and
    /// receiving: both rings' handling, the kicks) less its copy of the
    /// prebuilt frame into UMEM, which a stack replaces by `send`.
    pub(super) rings: f64,
    /// Send: payload copied out of the registered region with the ICRC
    /// folded in (one pass over 4096 bytes, plus the headers' CRC).
    pub(super) send: f64,
    /// Receive: the ICRC check over the whole frame.
    pub(super) check: f64,
    /// Receive: the payload copied into the registered region.
    pub(super) place: f64,
}

impl CpuFloor {
    /// The whole floor, µs per frame.
    pub(super) fn total(&self) -> f64 {
        self.rings + self.send + self.check + self.place
    }

    /// "user CPU per 4154-byte frame U us vs floor F (its parts)", for a
    /// run's line, with urnic's `user` µs per frame.
    pub(super) fn against(&self, user: f64) -> String {
        format!(
            "user CPU per 4154-byte frame {user:.2} us vs floor {:.2} ({:.2} rings + {:.2} send copy+ICRC + {:.2} ICRC check + {:.2} placement)",
            self.total(),
            self.rings,
            self.send,
            self.check,
            self.place
        )
    }
}

/// Bytes the frames of the copy/CRC measurement cycle through (UMEM's
/// 1024 chunks of 4 KiB).
const SPAN: usize = 4 << 20;

/// Bytes of each registered region (the 64 KiB WRITE rig's `2 * 65536`).
const MR: usize = 2 * 65536;

/// Frames timed per part of the copy/CRC measurement (a few ms each).
const PASSES: usize = 20_000;

/// Rounds of the copy/CRC measurement at each of its three moments in the
/// CPU row (before, between and after urnic's two halves), each round
/// timing every part once; per part the fastest of all rounds counts (the
/// host is shared: a timing that another process preempted, or that ran
/// in the host's slow phase, is longer, never shorter, than the work
/// itself). Until 2026-11-27 each part's seven timings ran back to back,
/// and in two of ten full-report runs one part read 12 times its usual
/// cost in all seven (the placement copy 1.20 µs against 0.10): a slow
/// spell of a few hundred ms, which moments seconds apart do not share.
const ROUNDS: usize = 3;

/// The copies and CRC passes of one 4154-byte frame, µs each.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct CopyCrc {
    /// The send copy out of the registered region with the ICRC folded in.
    pub(super) send: f64,
    /// The receive side's ICRC check.
    pub(super) check: f64,
    /// The receive side's copy into the registered region.
    pub(super) place: f64,
    /// The raw ceiling's copy of its prebuilt frame into UMEM.
    pub(super) ceiling_copy: f64,
}

impl CopyCrc {
    /// Each part's lower figure of `self` and `other`.
    pub(super) fn min(self, other: CopyCrc) -> CopyCrc {
        CopyCrc {
            send: self.send.min(other.send),
            check: self.check.min(other.check),
            place: self.place.min(other.place),
            ceiling_copy: self.ceiling_copy.min(other.ceiling_copy),
        }
    }
}

/// The buffers the copies and CRCs are timed over, made once per CPU row
/// (the registered region, UMEM-like frames cycled over [`SPAN`], the
/// placement's destination, the ceiling's prebuilt frame), so that each of
/// the row's moments meets the same memory, its pages already faulted in.
pub(super) struct CopyCrcRig {
    mr: Vec<u8>,
    umem: Vec<u8>,
    dst: Vec<u8>,
    prebuilt: Vec<u8>,
}

impl CopyCrcRig {
    pub(super) fn new() -> CopyCrcRig {
        CopyCrcRig {
            mr: (0..MR).map(|i| (i * 31 + 7) as u8).collect(),
            umem: vec![0u8; SPAN + 8192],
            dst: vec![0u8; MR],
            prebuilt: vec![0x5au8; write_frame_len(CPU_MTU)],
        }
    }

    /// [`CopyCrc`], each part the fastest of `rounds` timings of [`PASSES`]
    /// frames (frames cycled over [`SPAN`]), a round timing each part once.
    pub(super) fn costs(&mut self, rounds: usize) -> CopyCrc {
        let frame = write_frame_len(CPU_MTU);
        let slots = SPAN / 4096;
        let CopyCrcRig { mr, umem, dst, prebuilt } = self;
        // The payload's place in a registered region for UMEM slot `s` (the
        // 64 KiB message's 16 frames, over and over).
        let in_mr = |s: usize| (s % (65536 / CPU_MTU)) * CPU_MTU;
        let mut sink = 0u32;
        let mut time = |f: &mut dyn FnMut(usize) -> u32| {
            let t = Instant::now();
            for i in 0..PASSES {
                sink ^= f(i % slots);
            }
            t.elapsed().as_secs_f64() * 1e6 / PASSES as f64
        };
        let hdr = frame - CPU_MTU - rocev2::wire::ICRC_LEN;
        let zeros = [0u8; crc::SHORT_MAX];
        let mask = [0u8; crc::MASK_HEAD];
        let mut best = CopyCrc { send: f64::INFINITY, check: f64::INFINITY, place: f64::INFINITY, ceiling_copy: f64::INFINITY };
        for _ in 0..rounds.max(1) {
            let send = time(&mut |s| {
                let at = s * 4096;
                // The headers' CRC handed to the copy unreduced, as urnic's send side does.
                let lane = crc::update_masked_lane(!0, &umem[at..at + hdr], &zeros);
                let c = if lane.is_none() { crc::update(!0, &umem[at..at + hdr]) } else { 0 };
                let (src, out) = (&mr[in_mr(s)..in_mr(s) + CPU_MTU], &mut umem[at + hdr..at + hdr + CPU_MTU]);
                match lane {
                    Some(lane) => crc::copy_update_lane(lane, src, out),
                    None => crc::copy_update(c, src, out),
                }
            });
            // The check as the receive side makes it: one masked run where the CPU
            // has the wide kernel (a lower floor than `crc32fast`'s pass there).
            let check = time(&mut |s| {
                let f = &umem[s * 4096..s * 4096 + frame];
                crc::update_masked_head(!0, f, &mask).unwrap_or_else(|| crc::update(!0, f))
            });
            let place = time(&mut |s| {
                let at = s * 4096;
                dst[in_mr(s)..in_mr(s) + CPU_MTU].copy_from_slice(&umem[at + hdr..at + hdr + CPU_MTU]);
                u32::from(dst[in_mr(s)])
            });
            let ceiling_copy = time(&mut |s| {
                let at = s * 4096;
                umem[at..at + frame].copy_from_slice(prebuilt);
                u32::from(umem[at])
            });
            best = best.min(CopyCrc { send, check, place, ceiling_copy });
        }
        std::hint::black_box(sink);
        best
    }
}

/// The floor from the raw ceiling's user CPU µs per frame and the copies
/// and CRCs.
fn cpu_floor(ceiling: f64, c: CopyCrc) -> CpuFloor {
    CpuFloor { rings: (ceiling - c.ceiling_copy).max(0.0), send: c.send, check: c.check, place: c.place }
}

/// The CPU row of one run on `pair9k` (a 9000-byte veth), over about
/// `2 * secs`: urnic's user CPU µs per 4154-byte frame (1 core, 64 KiB
/// WRITEs, two halves of `secs / 2` around the floor, so that the host's
/// drift meets both alike) and the floor (its ring handling measured for
/// `secs`; its copies and CRCs timed before, between and after the halves).
pub(super) fn cpu_row(pair9k: &VethPair, secs: f64) -> Result<(f64, CpuFloor)> {
    let mut rig = CopyCrcRig::new();
    let c0 = rig.costs(ROUNDS);
    let a = urnic_user_cpu_64k(pair9k, secs / 2.0)?;
    let ceiling = raw_afxdp_cpu(pair9k, write_frame_len(CPU_MTU), secs, true)?.user_per_frame.context("the raw ceiling's user CPU")?? * 1e6;
    let c1 = rig.costs(ROUNDS);
    let b = urnic_user_cpu_64k(pair9k, secs / 2.0)?;
    let c2 = rig.costs(ROUNDS);
    Ok(((a + b) / 2.0 / FRAMES_PER_64K * 1e6, cpu_floor(ceiling, c0.min(c1).min(c2))))
}

/// What one `--rate` run measured.
#[derive(Clone, Copy, Debug, Default)]
struct RateRun {
    /// `[cores]` (urnic 64 B WRITE messages/s, raw ceiling 138-byte frames/s).
    rate: [(f64, f64); 2],
    /// 1 core, CPU seconds (user + system) per message / per ceiling frame:
    /// the rates each would reach with a core to itself, which the other
    /// processes of a shared host do not bend as they bend the wall clock.
    cpu_per: (f64, f64),
    /// urnic's user CPU per 4154-byte frame, 1 core, µs.
    user_per_frame: f64,
    floor: CpuFloor,
}

/// `urnic bench --rate`: the message-rate and CPU rows alone, `n` runs.
pub fn run_only(n: usize) -> Result<()> {
    let p = Progress::new("bench", 7 * n.max(1) as u64);
    let mut all = Vec::new();
    for i in 0..n.max(1) {
        let (pair, pair9k) = veth_pairs("rate")?;
        let mut r = RateRun::default();
        for (k, cores) in [Cores::One, Cores::Two].into_iter().enumerate() {
            let c = cores.label();
            let (mut cpu_u, mut cpu_c) = (Vec::new(), Vec::new());
            r.rate[k] = bracketed(
                || {
                    p.step(format_args!("urnic, {c}: 64 B WRITE message rate"));
                    let (rate, cpu) = urnic_rate(&pair, cores)?;
                    cpu_u.push(cpu);
                    Ok(rate)
                },
                || {
                    p.step(format_args!("raw AF_XDP, {c}: {WRITE64_FRAME}-byte frames"));
                    if cores == Cores::Two {
                        return raw_afxdp(&pair, WRITE64_FRAME, cores, 1.0);
                    }
                    let t = raw_afxdp_cpu(&pair, WRITE64_FRAME, 1.0, false)?;
                    cpu_c.push(t.cpu_per_frame);
                    Ok(t.pps)
                },
            )?;
            if cores == Cores::One {
                let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
                r.cpu_per = (mean(&cpu_u), mean(&cpu_c));
            }
        }
        p.step("urnic, 1 core: user CPU per 4154-byte frame; the floor");
        (r.user_per_frame, r.floor) = cpu_row(&pair9k, 2.0)?;
        p.println(format!(
            "run {}: 64 B WRITE {:.3}/{:.3} Mpps vs raw {:.3}/{:.3} (1/2 cores): {:.2}/{:.2}; CPU per message {:.2} us vs raw {:.2} per frame \
             (1 core): {:.2}; {}: {:.2}",
            i + 1,
            r.rate[0].0 / 1e6,
            r.rate[1].0 / 1e6,
            r.rate[0].1 / 1e6,
            r.rate[1].1 / 1e6,
            r.rate[0].0 / r.rate[0].1,
            r.rate[1].0 / r.rate[1].1,
            r.cpu_per.0 * 1e6,
            r.cpu_per.1 * 1e6,
            r.cpu_per.1 / r.cpu_per.0,
            r.floor.against(r.user_per_frame),
            r.user_per_frame / r.floor.total()
        ));
        all.push(r);
    }
    drop(p);
    let per_run = |f: &dyn Fn(&RateRun) -> f64| all.iter().map(f).collect::<Vec<f64>>();
    let t = ratio_table(
        all.len(),
        [
            ("64 B WRITE message rate / raw ceiling, 1 core", per_run(&|r| r.rate[0].0 / r.rate[0].1), "≥ 0.85"),
            ("64 B WRITE message rate / raw ceiling, 2 cores", per_run(&|r| r.rate[1].0 / r.rate[1].1), "≥ 0.85"),
            ("the same on CPU time: raw CPU per frame / urnic CPU per message, 1 core", per_run(&|r| r.cpu_per.1 / r.cpu_per.0), "(context)"),
            ("user CPU per 4154-byte frame / floor, 1 core", per_run(&|r| r.user_per_frame / r.floor.total()), "≤ 1.25"),
        ],
    );
    crate::out::outln!("{t}")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_adds_its_parts() {
        let f = CpuFloor { rings: 0.4, send: 0.3, check: 0.2, place: 0.1 };
        assert!((f.total() - 1.0).abs() < 1e-12);
        assert_eq!(
            f.against(1.25),
            "user CPU per 4154-byte frame 1.25 us vs floor 1.00 (0.40 rings + 0.30 send copy+ICRC + 0.20 ICRC check + 0.10 placement)"
        );
        assert_eq!(FRAMES_PER_64K, 16.0);
    }

    #[test]
    fn copies_and_crcs_are_measured() {
        let c = CopyCrcRig::new().costs(1);
        assert!(c.send > 0.0 && c.check > 0.0 && c.place > 0.0 && c.ceiling_copy > 0.0, "{c:?}");
        assert!(c.send.is_finite() && c.check.is_finite() && c.place.is_finite() && c.ceiling_copy.is_finite(), "{c:?}");
    }

    #[test]
    fn each_part_of_the_floor_takes_its_fastest_moment() {
        let a = CopyCrc { send: 0.12, check: 0.80, place: 0.10, ceiling_copy: 0.05 };
        let b = CopyCrc { send: 0.13, check: 0.08, place: 1.20, ceiling_copy: 0.06 };
        assert_eq!(a.min(b), CopyCrc { send: 0.12, check: 0.08, place: 0.10, ceiling_copy: 0.05 });
        let f = cpu_floor(0.15, a.min(b));
        assert_eq!(f, CpuFloor { rings: 0.15 - 0.05, send: 0.12, check: 0.08, place: 0.10 });
        // A ceiling whose copy reads more than its whole user time leaves no negative ring share.
        assert_eq!(cpu_floor(0.01, a).rings, 0.0);
    }
}
