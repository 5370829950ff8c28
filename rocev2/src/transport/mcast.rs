//! UD multicast: which QPs of a device joined which group, and the address
//! rules RoCEv2 uses for groups.
//!
//! RoCEv2 carries IB multicast as IP multicast: a group is a GID that is an
//! IPv4-mapped 224.0.0.0/4 address or an IPv6 ff00::/8 address (kernel
//! `rdma_is_multicast_addr`), frames to it carry BTH DestQP 0xFFFFFF
//! (IBTA's multicast QP number, rxe `IB_MULTICAST_QPN`) and go
//! to the group's multicast MAC (RFC 1112 / RFC 2464, kernel
//! `ip_eth_mc_map` / `ipv6_eth_mc_map`, as `ib_resolve_eth_dmac` does for a
//! multicast AH). A received multicast frame is delivered to every attached
//! QP, each checking it as if addressed to it (rxe `rxe_rcv_mcast_pkt`:
//! `check_type_state` and `check_keys`, Q_Key included, per QP).

use crate::hash::IntMap;
use crate::transport::events::EngineError;

/// BTH DestQP of every multicast packet (IBTA: the multicast QPN, rxe `IB_MULTICAST_QPN`).
pub const MULTICAST_QPN: u32 = 0x00ff_ffff;

/// A GID (16 bytes, IPv4 as IPv4-mapped IPv6).
pub type Gid = [u8; 16];

/// Whether `gid` names a multicast group: ff00::/8, or IPv4-mapped
/// 224.0.0.0/4 (kernel `rdma_is_multicast_addr`).
pub fn is_multicast_gid(gid: &Gid) -> bool {
    if gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff {
        return gid[12] & 0xf0 == 0xe0;
    }
    gid[0] == 0xff
}

/// The Ethernet address of multicast group `gid`: 01:00:5e + the low 23
/// bits of an IPv4 group (RFC 1112 6.4, kernel `ip_eth_mc_map`), 33:33 +
/// the low 32 bits of an IPv6 group (RFC 2464 7, `ipv6_eth_mc_map`).
/// `None` if `gid` is not a group.
pub fn multicast_mac(gid: &Gid) -> Option<[u8; 6]> {
    if !is_multicast_gid(gid) {
        return None;
    }
    if gid[0] == 0xff {
        return Some([0x33, 0x33, gid[12], gid[13], gid[14], gid[15]]);
    }
    Some([0x01, 0x00, 0x5e, gid[13] & 0x7f, gid[14], gid[15]])
}

/// Multicast limits of a device (`ibv_device_attr` `max_mcast_grp`,
/// `max_mcast_qp_attach`, `max_total_mcast_qp_attach`). The defaults are
/// rxe's (`RXE_MAX_MCAST_GRP`, `RXE_MAX_MCAST_QP_ATTACH`,
/// `RXE_MAX_TOT_MCAST_QP_ATTACH`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct McastLimits {
    /// Groups with at least one attached QP, at most.
    pub max_groups: u32,
    /// QPs attached to one group, at most.
    pub max_qps_per_group: u32,
    /// Attachments (QP, group) over all groups, at most. Also bounds the
    /// groups one QP may join.
    pub max_total_attach: u32,
}

impl Default for McastLimits {
    fn default() -> Self {
        McastLimits { max_groups: 8192, max_qps_per_group: 56, max_total_attach: 0x70000 }
    }
}

/// The groups of one engine (or one device) and their members.
#[derive(Debug, Default)]
pub struct McastTable {
    groups: std::collections::HashMap<Gid, Vec<u32>>,
    attached: u32,
    /// Groups per QP (so a destroyed QP leaves all of them).
    by_qp: IntMap<u32, Vec<Gid>>,
}

impl McastTable {
    /// Attach `qpn` to `gid` within `limits`. `Ok(false)`: it already was
    /// (nothing changes, as rxe's `rxe_attach_mcg` and uverbs answer 0).
    /// Errors: not a multicast GID, a limit reached (rxe: `max_mcast_grp`
    /// → ENOMEM, the attach limits → EINVAL; here [`EngineError::McastLimit`]
    /// names the limit).
    pub fn attach(&mut self, qpn: u32, gid: Gid, limits: &McastLimits) -> Result<bool, EngineError> {
        if !is_multicast_gid(&gid) {
            return Err(EngineError::BadValue("not a multicast GID (IPv4-mapped 224.0.0.0/4 or ff00::/8)"));
        }
        let members = self.groups.get(&gid);
        if members.is_some_and(|m| m.contains(&qpn)) {
            return Ok(false);
        }
        if members.is_none() && self.groups.len() >= limits.max_groups as usize {
            return Err(EngineError::McastLimit("max_mcast_grp: no more multicast groups"));
        }
        if self.attached >= limits.max_total_attach {
            return Err(EngineError::McastLimit("max_total_mcast_qp_attach: no more attachments on this device"));
        }
        if members.is_some_and(|m| m.len() >= limits.max_qps_per_group as usize) {
            return Err(EngineError::McastLimit("max_mcast_qp_attach: the group has its most QPs"));
        }
        self.groups.entry(gid).or_default().push(qpn);
        self.by_qp.entry(qpn).or_default().push(gid);
        self.attached += 1;
        Ok(true)
    }

    /// Detach `qpn` from `gid`; an error if it was not attached (rxe
    /// `rxe_detach_mcg` and uverbs: EINVAL). The last member leaving
    /// removes the group.
    pub fn detach(&mut self, qpn: u32, gid: &Gid) -> Result<(), EngineError> {
        let members = self.groups.get_mut(gid).ok_or(EngineError::BadValue("the QP is not attached to this multicast group"))?;
        let i = members.iter().position(|&q| q == qpn).ok_or(EngineError::BadValue("the QP is not attached to this multicast group"))?;
        members.remove(i);
        if members.is_empty() {
            self.groups.remove(gid);
        }
        if let Some(g) = self.by_qp.get_mut(&qpn) {
            g.retain(|x| x != gid);
            if g.is_empty() {
                self.by_qp.remove(&qpn);
            }
        }
        self.attached -= 1;
        Ok(())
    }

    /// Detach `qpn` from every group (the QP is destroyed).
    pub fn detach_all(&mut self, qpn: u32) {
        for gid in self.by_qp.get(&qpn).cloned().unwrap_or_default() {
            let _ = self.detach(qpn, &gid);
        }
    }

    /// The QPs attached to `gid`, in attach order.
    pub fn members(&self, gid: &Gid) -> &[u32] {
        self.groups.get(gid).map_or(&[], Vec::as_slice)
    }

    /// The groups `qpn` is attached to.
    pub fn groups_of(&self, qpn: u32) -> &[Gid] {
        self.by_qp.get(&qpn).map_or(&[], Vec::as_slice)
    }

    /// Groups with at least one member.
    pub fn group_count(&self) -> usize {
        self.groups.len()
    }

    /// Attachments over all groups.
    pub fn attach_count(&self) -> u32 {
        self.attached
    }

    /// Take `gid`'s member list out (delivery), to be put back with
    /// [`McastTable::restore`].
    pub(crate) fn take(&mut self, gid: &Gid) -> Option<Vec<u32>> {
        self.groups.get_mut(gid).map(std::mem::take)
    }

    /// Put back what [`McastTable::take`] took.
    pub(crate) fn restore(&mut self, gid: &Gid, members: Vec<u32>) {
        if let Some(m) = self.groups.get_mut(gid) {
            *m = members;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(a: [u8; 4]) -> Gid {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&a);
        g
    }

    #[test]
    fn group_addresses_and_macs() {
        assert!(is_multicast_gid(&v4([224, 0, 0, 1])));
        assert!(is_multicast_gid(&v4([239, 255, 255, 255])));
        assert!(!is_multicast_gid(&v4([10, 0, 0, 1])));
        assert!(!is_multicast_gid(&v4([240, 0, 0, 1])));
        let mut v6 = [0u8; 16];
        v6[0] = 0xff;
        v6[1] = 0x0e;
        v6[12..].copy_from_slice(&[0x81, 2, 3, 4]);
        assert!(is_multicast_gid(&v6));
        assert!(!is_multicast_gid(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]));
        // RFC 1112: the high bit of the low 24 is dropped.
        assert_eq!(multicast_mac(&v4([239, 129, 2, 3])), Some([0x01, 0x00, 0x5e, 0x01, 2, 3]));
        assert_eq!(multicast_mac(&v6), Some([0x33, 0x33, 0x81, 2, 3, 4]));
        assert_eq!(multicast_mac(&v4([10, 0, 0, 1])), None);
    }

    #[test]
    fn attach_detach_and_limits() {
        let limits = McastLimits { max_groups: 2, max_qps_per_group: 2, max_total_attach: 3 };
        let (a, b, c) = (v4([239, 0, 0, 1]), v4([239, 0, 0, 2]), v4([239, 0, 0, 3]));
        let mut t = McastTable::default();
        assert_eq!(t.attach(0x11, a, &limits), Ok(true));
        assert_eq!(t.attach(0x11, a, &limits), Ok(false), "a second attach changes nothing");
        assert_eq!(t.attach(0x12, a, &limits), Ok(true));
        assert!(matches!(t.attach(0x13, a, &limits), Err(EngineError::McastLimit(m)) if m.starts_with("max_mcast_qp_attach")));
        assert_eq!(t.attach(0x11, b, &limits), Ok(true));
        assert!(matches!(t.attach(0x11, c, &limits), Err(EngineError::McastLimit(m)) if m.starts_with("max_mcast_grp")));
        assert!(matches!(t.attach(0x12, b, &limits), Err(EngineError::McastLimit(m)) if m.starts_with("max_total")));
        assert!(matches!(t.attach(0x11, v4([10, 0, 0, 1]), &limits), Err(EngineError::BadValue(_))));
        assert_eq!(t.members(&a), &[0x11, 0x12]);
        assert_eq!(t.groups_of(0x11), &[a, b]);
        assert!(t.detach(0x13, &a).is_err());
        assert!(t.detach(0x11, &c).is_err());
        t.detach(0x11, &a).unwrap();
        assert!(t.detach(0x11, &a).is_err(), "detached once only");
        t.detach_all(0x11);
        assert_eq!((t.group_count(), t.attach_count()), (1, 1));
        t.detach(0x12, &a).unwrap();
        assert_eq!((t.group_count(), t.attach_count()), (0, 0));
        assert!(t.members(&a).is_empty());
    }
}
