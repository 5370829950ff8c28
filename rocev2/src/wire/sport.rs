//! UDP source-port entropy, as Linux computes it, so our flows hash like
//! rxe's and ConnectX's (receivers ignore the value).

/// Linux `hash_32(val, bits)`: the golden-ratio multiplicative hash.
pub const fn hash_32(val: u32, bits: u32) -> u32 {
    val.wrapping_mul(0x61c8_8647) >> (32 - bits)
}

/// Linux `rdma_calc_flow_label(lqpn, rqpn)`: a 20-bit flow label from the
/// two QPNs, the same at both ends of an RC connection.
pub const fn rc_flow_label(lqpn: u32, rqpn: u32) -> u32 {
    let mut fl = (lqpn as u64) * (rqpn as u64);
    fl ^= fl >> 20;
    fl ^= fl >> 40;
    (fl & 0x000f_ffff) as u32
}

/// Linux `rdma_flow_label_to_udp_sport`: fold a 20-bit flow label into the
/// RoCEv2 source-port range 0xC000..=0xFFFF.
pub const fn flow_label_to_sport(fl: u32) -> u16 {
    let lo = fl & 0x3fff;
    let hi = (fl & 0xfc000) >> 14;
    (0xc000 | ((lo ^ hi) & 0x3fff)) as u16
}

/// The source port rxe uses on an RC QP between `lqpn` and `rqpn`.
pub const fn rc_sport(lqpn: u32, rqpn: u32) -> u16 {
    flow_label_to_sport(rc_flow_label(lqpn, rqpn))
}

/// The source port rxe uses for UD QPs and QP1: `0xC000 + hash_32(qpn, 14)`.
pub const fn ud_sport(qpn: u32) -> u16 {
    (0xc000 + hash_32(qpn, 14)) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_captured_ports() {
        // rxe-peer README: RC 0x11<->0x11 → 49441, QP1 → 55410, UD QPN 0x11 → 57236.
        assert_eq!(rc_sport(0x11, 0x11), 49441);
        assert_eq!(ud_sport(1), 55410);
        assert_eq!(ud_sport(0x11), 57236);
        assert_eq!(rc_sport(0x12, 0x34), rc_sport(0x34, 0x12));
    }
}
