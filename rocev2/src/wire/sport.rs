//! UDP source-port entropy, as Linux computes it, so our flows hash like
//! rxe's and ConnectX's (receivers ignore the value).

/// Linux `hash_32(val, bits)`: the golden-ratio multiplicative hash.
/// `bits` is 1..=32 in Linux; here 0 gives 0 and anything above 32 the
/// whole product, so no input panics.
pub const fn hash_32(val: u32, bits: u32) -> u32 {
    let h = val.wrapping_mul(0x61c8_8647);
    match bits {
        0 => 0,
        1..=31 => h >> (32 - bits),
        _ => h,
    }
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

/// Linux `rdma_get_udp_sport(fl, lqpn, rqpn)`: the source port for a path
/// whose GRH flow label is `fl`, or, when `fl` is 0, for the flow label
/// computed from the two QPNs. rxe calls it when an RC/UC QP gets its
/// address vector; RDMA-CM passes a flow label of its own (from the CM
/// ports, carried in the CM REQ), plain verbs apps (ibv_rc_pingpong,
/// perftest) pass 0.
pub const fn udp_sport(fl: u32, lqpn: u32, rqpn: u32) -> u16 {
    let fl = if fl & 0x000f_ffff == 0 { rc_flow_label(lqpn, rqpn) } else { fl & 0x000f_ffff };
    flow_label_to_sport(fl)
}

/// The source port rxe uses on an RC QP between `lqpn` and `rqpn` with no
/// flow label (`udp_sport(0, lqpn, rqpn)`).
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
        // perftest's second and third QPs (write_bw.pcap)
        assert_eq!((rc_sport(0x12, 0x12), rc_sport(0x13, 0x13)), (49476, 49513));
        // rping.pcap: the CM REQ carries flow label 0x1c43, both ends use 56387
        assert_eq!(udp_sport(0x1c43, 0x11, 0x11), 56387);
        assert_eq!(udp_sport(0, 0x11, 0x11), 49441);
    }

    #[test]
    fn helpers_match_linux_definitions() {
        // hash_32(val, bits) = (val * GOLDEN_RATIO_32) >> (32 - bits)
        assert_eq!(hash_32(1, 14), 0x61c8_8647 >> 18);
        assert_eq!(hash_32(0, 14), 0);
        assert_eq!((hash_32(5, 0), hash_32(1, 32), hash_32(1, 40)), (0, 0x61c8_8647, 0x61c8_8647));
        assert!((0..=0xff_ffffu32).step_by(4099).all(|q| ud_sport(q) >= 0xc000));
        // the 64-bit product and both folds matter for large QPNs
        let (a, b) = (0xff_fff0u32, 0xab_cdefu32);
        let v = u64::from(a) * u64::from(b);
        let v = v ^ (v >> 20);
        let v = v ^ (v >> 40);
        assert_eq!(rc_flow_label(a, b), (v & 0xf_ffff) as u32);
        // the low 14 bits XOR the high 6 bits of the 20-bit label
        assert_eq!(flow_label_to_sport(0xfc000), 0xc000 | 0x3f);
        assert_eq!(flow_label_to_sport(0x03fff), 0xffff);
    }
}
