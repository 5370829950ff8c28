//! UD multicast at the verbs level: `ibv_attach_mcast` / `ibv_detach_mcast`
//! ([`Qp::attach_mcast`], [`Qp::detach_mcast`]) and the host's membership.
//!
//! The engine delivers a group's frames to its attached QPs; the kernel
//! must still let the group's frames in on a NIC with a multicast filter and
//! tell the switches (IGMP / MLD), as rxe does through `dev_mc_add` and
//! RDMA-CM through `ip_mc_inc_group`. urnic asks the kernel for it with a
//! UDP socket joined to the group (`IP_ADD_MEMBERSHIP` / `IPV6_JOIN_GROUP`
//! on the device's interface) for as long as a QP of the device is
//! attached. The socket is made in the network namespace the device was
//! opened in, whichever thread attaches.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::net::{Ipv6Addr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;

use rocev2::transport::attr::AddressVector;

use crate::device::Gid;
use crate::error::{Error, ErrorKind, Result};
use crate::qp::Qp;

/// The host side of a device's groups: UDP sockets holding the
/// memberships, several groups per socket (the kernel allows
/// `igmp_max_memberships`, 20 by default, per IPv4 socket; a full socket
/// answers ENOBUFS and the next group goes to a new one).
pub(crate) struct HostGroups {
    ifindex: u32,
    /// The namespace the device was opened in.
    netns: File,
    /// Sockets (closed once they hold no group) and how many groups each holds.
    sockets: Vec<Option<(UdpSocket, usize)>>,
    /// Group → index of the socket holding it.
    joined: HashMap<Gid, usize>,
}

impl HostGroups {
    /// Memberships on interface `ifindex` of the calling thread's namespace.
    pub(crate) fn new(ifindex: u32) -> io::Result<HostGroups> {
        Ok(HostGroups { ifindex, netns: File::open("/proc/thread-self/ns/net")?, sockets: Vec::new(), joined: HashMap::new() })
    }

    /// Join `gid` on the interface (no-op if joined).
    pub(crate) fn join(&mut self, gid: &Gid) -> io::Result<()> {
        if self.joined.contains_key(gid) {
            return Ok(());
        }
        let v4 = AddressVector::is_ipv4_mapped(gid);
        for (i, slot) in self.sockets.iter_mut().enumerate() {
            let Some((sock, n)) = slot else { continue };
            if is_v4(sock) != v4 {
                continue;
            }
            match membership(sock, self.ifindex, gid, true) {
                Ok(()) => {
                    *n += 1;
                    self.joined.insert(*gid, i);
                    return Ok(());
                }
                // This socket holds as many groups as the kernel allows.
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => continue,
                Err(e) => return Err(e),
            }
        }
        let sock = self.new_socket(v4)?;
        membership(&sock, self.ifindex, gid, true)?;
        let i = match self.sockets.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.sockets.push(None);
                self.sockets.len() - 1
            }
        };
        self.sockets[i] = Some((sock, 1));
        self.joined.insert(*gid, i);
        Ok(())
    }

    /// Leave `gid` (IGMP / MLD leave); a socket left without a group closes.
    pub(crate) fn leave(&mut self, gid: &Gid) {
        let Some(i) = self.joined.remove(gid) else { return };
        let Some(Some((sock, n))) = self.sockets.get_mut(i) else { return };
        if let Err(e) = membership(sock, self.ifindex, gid, false) {
            tracing::debug!(group = %crate::gid_to_string(gid), error = %e, "leaving a multicast group on the host");
        }
        *n -= 1;
        if *n == 0 {
            self.sockets[i] = None;
        }
    }

    /// A UDP socket of the family in the device's namespace, whichever
    /// thread asks: another namespace's caller has a thread of our own
    /// enter the device's and make it there (a socket keeps its namespace).
    fn new_socket(&self, v4: bool) -> io::Result<UdpSocket> {
        let here = std::fs::metadata("/proc/thread-self/ns/net")?;
        let ours = self.netns.metadata()?;
        if (here.dev(), here.ino()) == (ours.dev(), ours.ino()) {
            return udp_socket(v4);
        }
        let fd = self.netns.as_fd().try_clone_to_owned()?;
        std::thread::scope(|s| {
            s.spawn(move || {
                // SAFETY: a valid namespace fd; setns affects only this thread.
                if unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                udp_socket(v4)
            })
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the namespace thread panicked")))
        })
    }
}

fn is_v4(s: &UdpSocket) -> bool {
    s.local_addr().map(|a| a.is_ipv4()).unwrap_or(false)
}

/// An unbound-port UDP socket of the family (it receives nothing: the XDP
/// program steers the group's RoCE frames to urnic before the stack).
fn udp_socket(v4: bool) -> io::Result<UdpSocket> {
    UdpSocket::bind(if v4 { "0.0.0.0:0" } else { "[::]:0" })
}

/// Join (`add`) or leave group `gid` on interface `ifindex` through `sock`:
/// `IP_ADD_MEMBERSHIP` / `IP_DROP_MEMBERSHIP` with an `ip_mreqn`, or
/// `IPV6_JOIN_GROUP` / `IPV6_LEAVE_GROUP`.
fn membership(sock: &UdpSocket, ifindex: u32, gid: &Gid, add: bool) -> io::Result<()> {
    if AddressVector::is_ipv4_mapped(gid) {
        let mreq = libc::ip_mreqn {
            imr_multiaddr: libc::in_addr { s_addr: u32::from_ne_bytes([gid[12], gid[13], gid[14], gid[15]]) },
            imr_address: libc::in_addr { s_addr: 0 },
            imr_ifindex: ifindex as i32,
        };
        let opt = if add { libc::IP_ADD_MEMBERSHIP } else { libc::IP_DROP_MEMBERSHIP };
        // SAFETY: a valid socket and a correctly sized ip_mreqn.
        let r = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::IPPROTO_IP,
                opt,
                (&mreq as *const libc::ip_mreqn).cast(),
                std::mem::size_of::<libc::ip_mreqn>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    } else if add {
        sock.join_multicast_v6(&Ipv6Addr::from(*gid), ifindex)
    } else {
        sock.leave_multicast_v6(&Ipv6Addr::from(*gid), ifindex)
    }
}

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
