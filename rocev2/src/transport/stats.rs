//! Counters. Each field is a plain count; the datapath exposes them.

/// Per-QP counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpStats {
    /// Packets sent (all kinds, retransmissions included).
    pub tx_packets: u64,
    /// Bytes of frames sent.
    pub tx_bytes: u64,
    /// Packets accepted for this QP.
    pub rx_packets: u64,
    /// Bytes of frames accepted for this QP.
    pub rx_bytes: u64,
}
