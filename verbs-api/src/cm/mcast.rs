//! RDMA-CM's multicast on RoCE (`rdma_join_multicast`): an IP group becomes
//! a multicast GID and the address vector that sends to it; members attach
//! their UD QP to the GID ([`Qp::attach_mcast`], which also joins the group
//! on the host: IGMP / MLD).
//!
//! RoCE has no subnet administrator: the kernel's CMA answers a join
//! locally (`cma_iboe_join_multicast`), and so does this.
//!
//! ```no_run
//! # fn join(ch: &urnic::cm::CmChannel, qp: &urnic::Qp) -> urnic::Result<()> {
//! let g = ch.join_multicast("239.1.2.3".parse().unwrap(), "10.0.0.1".parse().unwrap(), Some(qp))?;
//! // Send to the group: an AH from g.ah, remote QPN g.qpn (0xFFFFFF), Q_Key g.qkey.
//! assert_eq!((g.gid[10..].to_vec(), g.qpn, g.qkey), (vec![0xff, 0xff, 239, 1, 2, 3], 0xff_ffff, 0x0123_4567));
//! ch.leave_multicast(&g, Some(qp))?;
//! # Ok(())
//! # }
//! ```

use std::net::IpAddr;

use super::{gid_of, CmChannel};
use crate::error::{Error, Result};
use crate::qp::{AhAttr, Qp};
use crate::Gid;

/// The destination QPN of a multicast send, 0xFFFFFF (the kernel's
/// `IB_MULTICAST_QPN`, which `cma_make_mc_event` reports as `param.ud.qp_num`).
pub const MCAST_QPN: u32 = rocev2::transport::mcast::MULTICAST_QPN;

/// The hop limit of the group's path on RoCEv2 (the kernel's
/// `IPV6_DEFAULT_HOPLIMIT`, set by `cma_iboe_join_multicast` for IPv4 groups).
const MCAST_HOP_LIMIT: u8 = 64;

/// A joined group as `RDMA_CM_EVENT_MULTICAST_JOIN` describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct McastGroup {
    /// The group's address.
    pub addr: IpAddr,
    /// Its GID: an IPv4 group as `::ffff:a.b.c.d` (the RoCEv2 GID of the
    /// kernel's `cma_iboe_set_mgid`), an IPv6 group as it is.
    pub gid: Gid,
    /// The address vector that sends to the group from our source GID
    /// (`param.ud.ah_attr`: dgid = the group, hop limit 64, SL 0).
    pub ah: AhAttr,
    /// The remote QPN to send to ([`MCAST_QPN`]).
    pub qpn: u32,
    /// The Q_Key of the group: RDMA-CM's UDP port space's
    /// (`RDMA_UDP_QKEY`, the kernel's `cma_set_default_qkey`).
    pub qkey: u32,
}

impl CmChannel {
    /// What joining IP group `group` from local address `src` gives (no QP
    /// attached): `InvalidArgument` unless `group` is an IPv4 (224.0.0.0/4)
    /// or IPv6 (ff00::/8) multicast address; `NotFound` if no GID of the
    /// device is `src` (or, for the wildcard `src`, reaches the group).
    pub fn multicast_group(&self, group: IpAddr, src: IpAddr) -> Result<McastGroup> {
        if !group.is_multicast() {
            return Err(Error::invalid(format!("{group} is not a multicast address (224.0.0.0/4, ff00::/8)")));
        }
        let gid = gid_of(group);
        let sgid_index = if src.is_unspecified() {
            self.sgid_index_for(&gid)?
        } else {
            let want = gid_of(match src {
                IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(src, IpAddr::V4),
                v4 => v4,
            });
            let i = self.ctx.inner.gids.iter().position(|g| *g == want);
            i.map(|i| i as u8).ok_or_else(|| Error::new(crate::ErrorKind::NotFound, format!("{src} is not an address of this device")))?
        };
        Ok(McastGroup {
            addr: group,
            gid,
            ah: AhAttr { dgid: gid, sgid_index, traffic_class: 0, hop_limit: MCAST_HOP_LIMIT, flow_label: 0, port_num: 1 },
            qpn: MCAST_QPN,
            qkey: rocev2::cm::RDMA_UDP_QKEY,
        })
    }

    /// `rdma_join_multicast`: [`CmChannel::multicast_group`], and `qp` (a
    /// UD QP; `None` for a send-only join, or a member without a QP yet)
    /// attached to the group, which the host then joins (IGMP / MLD).
    pub fn join_multicast(&self, group: IpAddr, src: IpAddr, qp: Option<&Qp>) -> Result<McastGroup> {
        let g = self.multicast_group(group, src)?;
        if let Some(qp) = qp {
            qp.attach_mcast(&g.gid)?;
        }
        Ok(g)
    }

    /// `rdma_leave_multicast`: `qp` (the one given to
    /// [`CmChannel::join_multicast`]) detached from the group;
    /// `InvalidArgument` if it is not attached.
    pub fn leave_multicast(&self, group: &McastGroup, qp: Option<&Qp>) -> Result<()> {
        match qp {
            Some(qp) => qp.detach_mcast(&group.gid),
            None => Ok(()),
        }
    }
}
