//! RDMA-CM's IP conventions on top of the IB CM (IBTA Vol 1 Annex A11,
//! "RDMA IP CM Service"): service IDs made of a port space and a port, and
//! the 36-byte IP header at the start of the REQ's (and SIDR_REQ's) private
//! data. Linux's `cma.c` and librdmacm follow the annex; `../pcaps/rping.pcap`
//! shows it on the wire (service ID 0x0000000001061c06: TCP port space, port 7174).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::error::MadError;

/// Bytes of the RDMA-CM IP header (Annex A11.6.1: `cma_hdr`).
pub const CMA_HDR_LEN: usize = 36;

/// The Q_Key of RDMA-CM's UDP port space (librdmacm `RDMA_UDP_QKEY`): UD ids
/// resolved by SIDR and multicast groups use it.
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// The service ID's prefix above the port space (Annex A11.2: zero).
const PS_MASK: u64 = 0xFFFF_FFFF_0000_0000;

/// The flow label RDMA-CM gives a RoCE connection's path (Linux
/// `cma_get_roce_udp_flow_label`): `(src_port * 31 + dst_port) & 0xFFFFF`,
/// from the active side's source port and the service's port. It travels
/// in the REQ's primary path and picks the RC data's UDP source port
/// ([`crate::wire::sport::flow_label_to_sport`]).
pub const fn roce_flow_label(src_port: u16, dst_port: u16) -> u32 {
    (src_port as u32).wrapping_mul(31).wrapping_add(dst_port as u32) & 0xF_FFFF
}

/// RDMA-CM port spaces (librdmacm `enum rdma_port_space`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PortSpace {
    /// `RDMA_PS_TCP` (0x0106): reliable connections.
    Tcp,
    /// `RDMA_PS_UDP` (0x0111): UD, resolved with SIDR.
    Udp,
    /// `RDMA_PS_IB` (0x013F): any QP type.
    Ib,
    /// `RDMA_PS_IPOIB` (0x0002).
    Ipoib,
}

impl PortSpace {
    /// The `rdma_port_space` value.
    pub const fn value(self) -> u16 {
        match self {
            PortSpace::Tcp => 0x0106,
            PortSpace::Udp => 0x0111,
            PortSpace::Ib => 0x013F,
            PortSpace::Ipoib => 0x0002,
        }
    }

    /// From an `rdma_port_space` value.
    pub const fn from_value(v: u16) -> Option<PortSpace> {
        match v {
            0x0106 => Some(PortSpace::Tcp),
            0x0111 => Some(PortSpace::Udp),
            0x013F => Some(PortSpace::Ib),
            0x0002 => Some(PortSpace::Ipoib),
            _ => None,
        }
    }

    /// The service ID for `port` in this space (Annex A11.2: 0x0000000001 PS PORT).
    pub const fn service_id(self, port: u16) -> u64 {
        (self.value() as u64) << 16 | port as u64
    }

    /// Whether the REQ/SIDR_REQ private data of this space starts with the IP
    /// header (librdmacm `cma_user_data_offset`: not in the IB space).
    pub const fn has_ip_header(self) -> bool {
        !matches!(self, PortSpace::Ib)
    }

    /// The port space and port of an RDMA-CM service ID, if it is one.
    pub fn from_service_id(sid: u64) -> Option<(PortSpace, u16)> {
        if sid & PS_MASK != 0 {
            return None;
        }
        Some((PortSpace::from_value((sid >> 16) as u16)?, sid as u16))
    }
}

/// The RDMA-CM IP header (Annex A11.6.1): who is connecting to what.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmaHeader {
    /// The active side's source port.
    pub src_port: u16,
    /// The active side's address.
    pub src: IpAddr,
    /// The address it connects to.
    pub dst: IpAddr,
}

impl CmaHeader {
    /// Parse the header at the start of `private_data`. Version must be 0
    /// (A11.6.1: MajV 0, MinV 0) and IP version 4 or 6 with both addresses of it.
    pub fn parse(private_data: &[u8]) -> Result<CmaHeader, MadError> {
        let b = private_data.get(..CMA_HDR_LEN).ok_or(MadError::Field("RDMA-CM IP header length"))?;
        if b[0] != 0 {
            return Err(MadError::Field("RDMA-CM IP header version"));
        }
        let addr = |off: usize, v6: bool| -> IpAddr {
            if v6 {
                let mut a = [0u8; 16];
                a.copy_from_slice(&b[off..off + 16]);
                IpAddr::V6(Ipv6Addr::from(a))
            } else {
                // `union cma_ip_addr`: IPv4 in the last 4 bytes of the 16.
                IpAddr::V4(Ipv4Addr::new(b[off + 12], b[off + 13], b[off + 14], b[off + 15]))
            }
        };
        let v6 = match b[1] >> 4 {
            4 => false,
            6 => true,
            _ => return Err(MadError::Field("RDMA-CM IP version")),
        };
        Ok(CmaHeader { src_port: u16::from_be_bytes([b[2], b[3]]), src: addr(4, v6), dst: addr(20, v6) })
    }

    /// The 36 header bytes. Mixed address families are written as IPv6
    /// (an IPv4 address as `::ffff:a.b.c.d`).
    pub fn emit(&self) -> [u8; CMA_HDR_LEN] {
        let mut b = [0u8; CMA_HDR_LEN];
        let v4 = match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => Some((s, d)),
            _ => None,
        };
        match v4 {
            Some((s, d)) => {
                b[1] = 4 << 4;
                b[16..20].copy_from_slice(&s.octets());
                b[32..36].copy_from_slice(&d.octets());
            }
            None => {
                b[1] = 6 << 4;
                b[4..20].copy_from_slice(&to_v6(self.src).octets());
                b[20..36].copy_from_slice(&to_v6(self.dst).octets());
            }
        }
        b[2..4].copy_from_slice(&self.src_port.to_be_bytes());
        b
    }
}

fn to_v6(a: IpAddr) -> Ipv6Addr {
    match a {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_ids_as_the_annex_and_linux_make_them() {
        assert_eq!(PortSpace::Tcp.service_id(7174), 0x0000_0000_0106_1c06);
        assert_eq!(PortSpace::Udp.service_id(7174), 0x0000_0000_0111_1c06);
        assert_eq!(PortSpace::Ib.service_id(1), 0x0000_0000_013F_0001);
        for ps in [PortSpace::Tcp, PortSpace::Udp, PortSpace::Ib] {
            assert_eq!(PortSpace::from_service_id(ps.service_id(4791)), Some((ps, 4791)));
        }
        assert_eq!(PortSpace::from_service_id(0x0000_0001_0106_1c06), None);
        assert_eq!(PortSpace::from_service_id(0x0000_0000_0107_1c06), None);
    }

    #[test]
    fn header_round_trips_and_refuses_bad_versions() {
        let h = CmaHeader { src_port: 0x8423, src: "10.99.0.2".parse().unwrap(), dst: "10.99.0.1".parse().unwrap() };
        let b = h.emit();
        assert_eq!(CmaHeader::parse(&b), Ok(h));
        let h6 = CmaHeader { src_port: 1, src: "fd00::2".parse().unwrap(), dst: "fd00::1".parse().unwrap() };
        assert_eq!(CmaHeader::parse(&h6.emit()), Ok(h6));
        assert!(CmaHeader::parse(&b[..35]).is_err());
        let mut bad = b;
        bad[0] = 1;
        assert!(CmaHeader::parse(&bad).is_err());
        bad = b;
        bad[1] = 5 << 4;
        assert!(CmaHeader::parse(&bad).is_err());
    }
}
