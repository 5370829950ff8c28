//! One vocabulary for the faults a test puts on frames.
//!
//! [`Faults`] are per-frame fault probabilities with one meaning wherever
//! frames are impaired:
//!
//! - the simulator's virtual links (`sim::LinkConfig::faults`, feature `sim`),
//!   applied to the frames a link carries;
//! - the datapath's in-memory hub (`urnic_datapath::Impairments::faults`),
//!   applied to the frames a port sends;
//! - urnic's XDP program (`urnic_xdp::Impairments::faults`), applied to our
//!   RoCEv2 frames as they arrive. The program can lose, corrupt and
//!   ECN-mark a frame but not duplicate or delay one: it refuses a nonzero
//!   [`Faults::duplicate`] or [`Faults::reorder`] with a configuration error
//!   rather than ignore it.
//!
//! What is specific to one backend (the simulator's delay and serializer,
//! the hub's rate limiter, the XDP program's rate-triggered ECN marking)
//! lives next to the `Faults` in that backend's own configuration.

use core::fmt;

/// Fault probabilities, per frame, each in `0.0..=1.0` (0: never, 1: every
/// frame). [`Faults::NONE`] (also the default) is a perfect link.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Faults {
    /// Probability that a frame is lost.
    pub loss: f64,
    /// Probability that a frame is delivered twice.
    pub duplicate: f64,
    /// Probability that a frame is held back so that frames sent after it
    /// overtake it. How long is the backend's: the simulator's link delays it
    /// by up to `LinkConfig::reorder_max`, the in-memory hub delivers it
    /// after the port's next frame.
    pub reorder: f64,
    /// Probability that one random bit after the Ethernet header is flipped
    /// (the XDP program flips one in the UDP payload), so that the IPv4
    /// header checksum or the ICRC has to catch it.
    pub corrupt: f64,
    /// Probability that an ECN-capable (ECT) RoCEv2 frame is marked
    /// Congestion Experienced, as a switch above its marking threshold would
    /// ([`crate::wire::FrameView::mark_ce`]); a frame that is not ECN-capable,
    /// or not valid RoCEv2, is left alone.
    pub ecn_mark: f64,
}

/// A fault probability outside `0.0..=1.0` (or NaN).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FaultsError {
    /// The field's name (`"loss"`, `"duplicate"`, ...).
    pub fault: &'static str,
    /// The value given.
    pub value: f64,
}

impl fmt::Display for FaultsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} probability {} is outside 0..=1", self.fault, self.value)
    }
}

impl std::error::Error for FaultsError {}

impl Faults {
    /// No faults.
    pub const NONE: Faults = Faults { loss: 0.0, duplicate: 0.0, reorder: 0.0, corrupt: 0.0, ecn_mark: 0.0 };

    /// Each fault by its field name, in declaration order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, f64)> {
        [("loss", self.loss), ("duplicate", self.duplicate), ("reorder", self.reorder), ("corrupt", self.corrupt), ("ecn_mark", self.ecn_mark)]
            .into_iter()
    }

    /// Whether every probability is in `0.0..=1.0`; the first that is not
    /// (NaN included) is the error.
    pub fn check(&self) -> Result<(), FaultsError> {
        match self.iter().find(|&(_, p)| !(0.0..=1.0).contains(&p)) {
            Some((fault, value)) => Err(FaultsError { fault, value }),
            None => Ok(()),
        }
    }

    /// Whether no fault can happen (every probability zero or below).
    pub fn is_none(&self) -> bool {
        self.iter().all(|(_, p)| p <= 0.0 || p.is_nan())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_names_the_first_bad_probability() {
        assert_eq!(Faults::NONE, Faults::default());
        assert!(Faults::NONE.check().is_ok() && Faults::NONE.is_none());
        let all = Faults { loss: 1.0, duplicate: 1.0, reorder: 1.0, corrupt: 1.0, ecn_mark: 1.0 };
        assert!(all.check().is_ok() && !all.is_none());
        let e = Faults { corrupt: 1.5, ecn_mark: -1.0, ..Faults::NONE }.check().unwrap_err();
        assert_eq!(e, FaultsError { fault: "corrupt", value: 1.5 });
        assert_eq!(e.to_string(), "corrupt probability 1.5 is outside 0..=1");
        let e = Faults { ecn_mark: f64::NAN, ..Faults::NONE }.check().unwrap_err();
        assert_eq!(e.fault, "ecn_mark");
        assert!(Faults { reorder: -0.5, ..Faults::NONE }.check().is_err());
        let names: Vec<_> = Faults::NONE.iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["loss", "duplicate", "reorder", "corrupt", "ecn_mark"]);
    }
}
