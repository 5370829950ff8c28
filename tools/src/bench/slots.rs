//! The 64 KiB WRITE rows: urnic and the raw AF_XDP ceiling taking turns in
//! short slots, each on a veth pair of its own made alike in the same run.
//!
//! The host's speed is not steady (see `latency`: its vCPU flips between a
//! fast and a slow phase every 5 ms to over a second, and the veth path, the
//! kernel's copies and the XDP program all swing with it). Measured one after
//! the other, a second each, urnic and the ceiling saw different mixes of the
//! two phases, and a row's ratio moved by up to ±4% between runs with neither
//! side changed. Here they alternate every [`SLOT_SECS`] for [`SLOT_PAIRS`]
//! pairs, in the order urnic, ceiling, ceiling, urnic, ... (a steady drift
//! cancels within each four slots), so both sides sample the same stretch of
//! the host's time. Each side runs alone in its slots: urnic's second thread
//! (two cores) is stopped while the ceiling runs, and the ceiling's sender
//! while urnic runs. Both are warmed once before the first slot.

use anyhow::{Context as _, Result};
use urnic_datapath::netns::VethPair;

use super::metrics::cpu_self;
use super::raw_xdp::{write_frame_len, Ceiling};
use super::urnic_runs::{rig, warm_up, Write64k, WARMUP};
use super::Cores;
use crate::perf::{bw, BwOp};

/// Length of one slot, seconds.
pub(super) const SLOT_SECS: f64 = 0.1;

/// Slots per side: two seconds of each.
pub(super) const SLOT_PAIRS: usize = 20;

/// 64 KiB WRITEs for about one slot at the warm-up's rate `bytes_per_s`
/// (50..4,000: a rate read wrong by a stall still gives a slot of useful
/// length).
fn writes_per_slot(bytes_per_s: f64) -> usize {
    let n = bytes_per_s * SLOT_SECS / 65536.0;
    if n.is_finite() {
        (n as usize).clamp(50, 4_000)
    } else {
        50
    }
}

/// Whether slot pair `k` runs urnic first: urnic, ceiling | ceiling, urnic | ...
fn urnic_first(k: usize) -> bool {
    k.is_multiple_of(2)
}

/// urnic's 64 KiB WRITE bandwidth on `urnic_pair` and the raw ceiling's
/// frames per second on `raw_pair` (IB MTU `mtu`'s frames), in alternating
/// slots; urnic's devices are tagged `tag`0/1.
pub(super) fn write_64k(urnic_pair: &VethPair, raw_pair: &VethPair, mtu: usize, cores: Cores, tag: &str) -> Result<(Write64k, f64)> {
    let what = || format!("{}: 64 KiB WRITE, MTU {mtu}", cores.label());
    let mut ceiling = Ceiling::open(raw_pair, write_frame_len(mtu)).with_context(what)?;
    let mut rig = rig(urnic_pair, cores, 2 * 65536, tag).with_context(what)?;
    let per_slot = writes_per_slot(warm_up(&mut rig, 65536).with_context(what)?);
    rig.pause();
    ceiling.slot(cores, WARMUP.as_secs_f64());
    let (mut urnic_bytes, mut urnic_secs, mut cpu) = (0.0, 0.0, 0.0);
    let (mut frames, mut raw_secs) = (0u64, 0.0);
    for k in 0..SLOT_PAIRS {
        for urnic_turn in [urnic_first(k), !urnic_first(k)] {
            if urnic_turn {
                rig.resume();
                let cpu0 = cpu_self();
                let r = bw(&mut rig.ea, &mut rig.eb, BwOp::Write, 65536, per_slot, 128).with_context(what)?;
                cpu += cpu_self() - cpu0;
                rig.pause();
                let bytes = (65536 * per_slot) as f64;
                urnic_bytes += bytes;
                urnic_secs += bytes / (r.avg_mbs * 1e6);
            } else {
                let (n, secs) = ceiling.slot(cores, SLOT_SECS);
                frames += n;
                raw_secs += secs;
            }
        }
    }
    let urnic = Write64k { mbs: urnic_bytes / urnic_secs / 1e6, cpu_per_gb: cpu / (urnic_bytes / 1e9) };
    Ok((urnic, frames as f64 / raw_secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_follows_the_warm_up_rate() {
        // 1.7 GB/s for 0.1 s: about 2,590 WRITEs; 0.7 GB/s: about 1,070.
        assert_eq!(writes_per_slot(1.7e9), 2_593);
        assert_eq!(writes_per_slot(0.7e9), 1_068);
        // A stalled warm-up or a nonsense rate still gives a usable slot.
        assert_eq!(writes_per_slot(1e6), 50);
        assert_eq!(writes_per_slot(1e12), 4_000);
        assert_eq!(writes_per_slot(f64::NAN), 50);
        assert_eq!(writes_per_slot(f64::INFINITY), 50);
    }

    #[test]
    fn the_turns_go_urnic_ceiling_ceiling_urnic() {
        let order: Vec<bool> = (0..4).flat_map(|k| [urnic_first(k), !urnic_first(k)]).collect();
        assert_eq!(order, [true, false, false, true, true, false, false, true]);
    }
}
