//! UD multicast at the verbs level: `ibv_attach_mcast` / `ibv_detach_mcast`
//! ([`Qp::attach_mcast`], [`Qp::detach_mcast`]) and the host's membership.
//!
//! The engine delivers a group's frames to its attached QPs; the kernel
//! must still let the group's frames in on a NIC with a multicast filter and
//! tell the switches (IGMP / MLD), as rxe does through `dev_mc_add` and
//! RDMA-CM through `ip_mc_inc_group`. urnic asks the kernel for it with a
//! UDP socket joined to the group (`IP_ADD_MEMBERSHIP` / `IPV6_JOIN_GROUP`
//! on the device's interface) for as long as a QP of the device is
//! attached (the sockets: `host_groups.rs`).

use crate::device::Gid;
use crate::error::{Error, ErrorKind, Result};
use crate::qp::Qp;

impl Qp {
    /// `ibv_attach_mcast`: this UD QP joins multicast group `gid` (an
    /// IPv4-mapped 224.0.0.0/4 GID, `::ffff:239.1.2.3`, or an ff00::/8
    /// one). Every frame to the group reaching the device is then also
    /// delivered to this QP (its own completion; its Q_Key must match the
    /// datagram's), including the device's own sends to the group. The
    /// first attachment of the device to a group joins it on the host
    /// (IGMP / MLD). Attaching twice is a no-op, as on rxe.
    ///
    /// Errors: `InvalidArgument` for a non-UD QP, a GID that is not a group,
    /// or a full group (`max_mcast_qp_attach`) or device
    /// (`max_total_mcast_qp_attach`) (rxe: EINVAL); `NoResources` at
    /// `max_mcast_grp` groups (rxe: ENOMEM); the kernel's error if the
    /// host could not join (nothing is attached then).
    ///
    /// ```
    /// use urnic::*;
    ///
    /// # fn main() -> urnic::Result<()> {
    /// let hub = MemHub::new(1);
    /// let a = open_device(DeviceConfig::memory(&hub, "urnic0", [2, 0, 0, 0, 0, 1], [10, 0, 0, 1]))?;
    /// let b = open_device(DeviceConfig::memory(&hub, "urnic1", [2, 0, 0, 0, 0, 2], [10, 0, 0, 2]))?;
    /// let cap = QpCaps { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 64 };
    /// let ud = |ctx: &Context, cq: &Cq, pd: &Pd| -> urnic::Result<Qp> {
    ///     let qp = pd.create_qp(&QpInit { qp_type: QpType::Ud, send_cq: cq, recv_cq: cq, srq: None, cap, sq_sig_all: true })?;
    ///     let mut at = QpAttr { qp_state: QpState::Init, qkey: 0x1234, ..QpAttr::default() };
    ///     qp.modify(&at, QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY)?;
    ///     at.qp_state = QpState::Rtr;
    ///     qp.modify(&at, QpAttrMask::STATE)?;
    ///     at.qp_state = QpState::Rts;
    ///     qp.modify(&at, QpAttrMask::STATE | QpAttrMask::SQ_PSN)?;
    ///     Ok(qp)
    /// };
    /// let (pd_a, pd_b) = (a.alloc_pd()?, b.alloc_pd()?);
    /// let (cq_a, cq_b) = (a.create_cq(8, None)?, b.create_cq(8, None)?);
    /// let (sender, member) = (ud(&a, &cq_a, &pd_a)?, ud(&b, &cq_b, &pd_b)?);
    ///
    /// // The group 239.1.2.3 as a GID; the member joins it.
    /// let group: Gid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 1, 2, 3];
    /// member.attach_mcast(&group)?;
    /// let mr = pd_b.alloc_mr(4096, Access::LOCAL_WRITE)?;
    /// member.post_recv(&RecvWr { wr_id: 1, sgl: vec![mr.sge(0, 4096)] })?;
    ///
    /// // Send to the group: an AH on its GID (its MAC follows from it), QPN 0xFFFFFF.
    /// let ah = pd_a.create_ah(&AhAttr { dgid: group, sgid_index: 1, port_num: 1, ..AhAttr::default() })?;
    /// let to_group = UdDest { av: *ah.address_vector(), remote_qpn: 0xff_ffff, remote_qkey: 0x1234 };
    /// let payload = Payload::Inline(b"to all".to_vec());
    /// sender.post_send(&SendWr { wr_id: 9, op: SendOp::Send, payload, flags: SendFlags::SIGNALED | SendFlags::INLINE, ud: Some(to_group) })?;
    ///
    /// let mut wc = [WorkCompletion::default(); 1];
    /// while cq_b.poll(&mut wc)? == 0 {}
    /// assert_eq!((wc[0].status, wc[0].src_qp, wc[0].byte_len), (WcStatus::Success, sender.qp_num(), 40 + 6));
    /// assert_eq!(mr.read_vec(40, 6)?, b"to all");
    /// member.detach_mcast(&group)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn attach_mcast(&self, gid: &Gid) -> Result<()> {
        let inner = &self.pd().ctx.inner;
        let mut host = inner.host_groups.lock().unwrap_or_else(|e| e.into_inner());
        let new = inner.nic.attach_mcast(self.qp_num(), *gid).map_err(|e| Error::engine("attach_mcast", e))?;
        if new {
            if let Some(h) = host.as_mut() {
                if let Err(e) = h.join(gid) {
                    let _ = inner.nic.detach_mcast(self.qp_num(), gid);
                    return Err(Error::with_source(
                        ErrorKind::Io,
                        format!("attach_mcast: the host could not join {}: {e}", crate::gid_to_string(gid)),
                        e,
                    ));
                }
            }
            tracing::debug!(device = %inner.name, qpn = self.qp_num(), group = %crate::gid_to_string(gid), "multicast attach");
        }
        Ok(())
    }

    /// `ibv_detach_mcast`: this QP leaves group `gid`; no frame to the group
    /// is delivered to it once this returns. The device's last member
    /// leaving leaves the group on the host. `InvalidArgument` if the QP is
    /// not attached to `gid` (rxe: EINVAL).
    pub fn detach_mcast(&self, gid: &Gid) -> Result<()> {
        let inner = &self.pd().ctx.inner;
        let mut host = inner.host_groups.lock().unwrap_or_else(|e| e.into_inner());
        inner.nic.detach_mcast(self.qp_num(), gid).map_err(|e| Error::engine("detach_mcast", e))?;
        tracing::debug!(device = %inner.name, qpn = self.qp_num(), group = %crate::gid_to_string(gid), "multicast detach");
        if inner.nic.mcast_members(gid) == 0 {
            if let Some(h) = host.as_mut() {
                h.leave(gid);
            }
        }
        Ok(())
    }

    /// The groups this QP is attached to.
    pub fn mcast_groups(&self) -> Vec<Gid> {
        self.pd().ctx.inner.nic.mcast_groups_of(self.qp_num())
    }

    /// Leave every group (the QP is being destroyed).
    pub(crate) fn detach_all_mcast(&self) {
        for g in self.mcast_groups() {
            let _ = self.detach_mcast(&g);
        }
    }
}
