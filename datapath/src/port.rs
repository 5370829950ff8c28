//! The port interface: how whole Ethernet frames enter and leave an engine.
//!
//! Implemented by the in-memory port ([`crate::memport`]) and, on real links,
//! by the AF_XDP port. A port hands out transmit buffers so the engine can
//! build frames in place (for AF_XDP, straight into UMEM).

/// What a port is attached to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// The port's MAC address.
    pub mac: [u8; 6],
    /// The link MTU (bytes of IP packet).
    pub mtu: u32,
}

/// Why a port operation failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PortError {
    /// No transmit buffer is free right now; try again after the next poll.
    #[error("no free transmit buffer")]
    TxFull,
    /// The frame does not fit the port's frame size.
    #[error("frame of {len} bytes exceeds the port's {max}")]
    FrameTooLarge {
        /// Frame length.
        len: usize,
        /// Largest frame the port carries.
        max: usize,
    },
    /// The port is gone (its hub or device was closed).
    #[error("port closed")]
    Closed,
    /// An operating-system error.
    #[error("I/O error: {0}")]
    Io(String),
}

/// A source and sink of Ethernet frames.
pub trait Port: Send {
    /// Addresses of the port.
    fn info(&self) -> PortInfo;

    /// Offer a transmit buffer to `fill`, which writes one frame at its start
    /// and returns its length, or `None` to send nothing. Returns whether a
    /// frame was queued.
    fn transmit_with(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> Result<bool, PortError>;

    /// Hand up to `budget` received frames to `handler`. Returns how many.
    fn receive(&mut self, budget: usize, handler: &mut dyn FnMut(&[u8])) -> Result<usize, PortError>;

    /// Whether the link is up (carrier), asked by the poller once per
    /// iteration with the clock it read for that iteration (`now`: a
    /// monotonic clock, the poller's epoch), so a port that has to ask the
    /// kernel can ask only now and then without reading a clock of its own.
    /// Default: always.
    fn link_up(&self, now: rocev2::Instant) -> bool {
        let _ = now;
        true
    }

    /// Push queued transmissions out (a syscall kick for AF_XDP). Default: nothing.
    fn flush(&mut self) -> Result<(), PortError> {
        Ok(())
    }

    /// Whether queued transmissions still wait for the kernel (the poller
    /// keeps calling [`Port::flush`] while they do). Default: no.
    fn tx_pending(&self) -> bool {
        false
    }

    /// Whether received frames wait to be taken, looked at without a
    /// syscall and without taking any: what a datapath thread standing back
    /// watches (`runner`). Default: not known, so no.
    fn rx_pending(&mut self) -> bool {
        false
    }

    /// Port-specific counters (name, value) for `urnic stat`. Default: none.
    fn counters(&self) -> Vec<(String, u64)> {
        Vec::new()
    }

    /// The concrete port, for port-specific controls (the AF_XDP port's
    /// impairments, say). Default: not offered.
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        None
    }
}
