//! QP1, the GSI QP, as the engine runs it: CM MADs in and out of the
//! [`Cm`] agent (IBTA 13.5.1; on RoCEv2 QP1 stays and QP0 does not exist).
//!
//! The agent speaks GIDs; this side turns them into frames. A peer's MAC is
//! learned from the frames its MADs arrive in (so a REP, REJ or DREP goes
//! back where the REQ or DREQ came from) or given by the caller before a
//! connect ([`Gsi::set_peer_mac`], from the neighbour table, as
//! `rdma_resolve_addr` does). A MAD for a GID with no known MAC is dropped
//! and counted (`tx_no_mac`); the agent's retransmission covers a MAC
//! learned later.

use std::collections::HashMap;

use crate::cm::{gsi, Cm, Gid};
use crate::transport::attr::AddressVector;
use crate::transport::path::PathHeaders;
use crate::wire::{MacAddr, ParsedFrame, VlanTag};
use crate::{Instant, Psn};

/// Peers whose MACs are remembered at most (a flood of MADs from many
/// addresses replaces entries rather than growing the table).
const MAX_PEERS: usize = 4096;

/// QP1's counters (the agent's own are in [`crate::cm::CmStats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GsiStats {
    /// Frames to QP1 handed to the agent.
    pub rx_mads: u64,
    /// Frames to QP1 refused before the agent (opcode, Q_Key, source QP, length).
    pub rx_bad: u64,
    /// Frames sent from QP1.
    pub tx_mads: u64,
    /// MADs dropped for want of the peer's MAC.
    pub tx_no_mac: u64,
}

/// QP1 of one device.
#[derive(Debug)]
pub struct Gsi {
    /// The CM agent.
    pub cm: Cm,
    mac: MacAddr,
    vlan: Option<VlanTag>,
    peers: HashMap<Gid, MacAddr>,
    psn: u32,
    ident: u16,
    stats: GsiStats,
}

impl Gsi {
    /// QP1 on a port with MAC `mac` (and 802.1Q tag `vlan`), running `cm`.
    pub fn new(cm: Cm, mac: MacAddr, vlan: Option<VlanTag>) -> Gsi {
        Gsi { cm, mac, vlan, peers: HashMap::new(), psn: 0, ident: 0, stats: GsiStats::default() }
    }

    /// The counters.
    pub fn stats(&self) -> GsiStats {
        self.stats
    }

    /// Where MADs to `gid` go.
    pub fn set_peer_mac(&mut self, gid: Gid, mac: MacAddr) {
        if self.peers.len() >= MAX_PEERS && !self.peers.contains_key(&gid) {
            if let Some(k) = self.peers.keys().next().copied() {
                self.peers.remove(&k);
            }
        }
        self.peers.insert(gid, mac);
    }

    /// A frame to QP1 (the engine has checked the P_Key).
    pub fn handle_frame(&mut self, now: Instant, p: &ParsedFrame<'_>) {
        let Ok(mad) = gsi::mad(&p.repr.transport, p.payload) else {
            self.stats.rx_bad += 1;
            return;
        };
        self.stats.rx_mads += 1;
        let (src, dst) = (p.repr.ip.src_gid(), p.repr.ip.dst_gid());
        // Learn the MAC only from a MAD the agent accepts: a stranger's
        // forged source address must not redirect a peer's replies.
        if self.cm.handle_mad(now, src, dst, mad).is_ok() || !self.peers.contains_key(&src) {
            self.set_peer_mac(src, p.repr.eth.src);
        }
    }

    /// The next frame QP1 sends, written into `buf`; its length.
    pub fn poll_transmit(&mut self, buf: &mut [u8]) -> Option<usize> {
        loop {
            let t = self.cm.poll_transmit()?;
            let Some(&dmac) = self.peers.get(&t.dst_gid) else {
                self.stats.tx_no_mac += 1;
                continue;
            };
            let av = AddressVector {
                dmac,
                smac: self.mac,
                vlan: self.vlan,
                sgid: t.src_gid,
                dgid: t.dst_gid,
                traffic_class: 0,
                hop_limit: 64,
                flow_label: 0,
                udp_sport: None,
            };
            let mut path = PathHeaders::new(&av, gsi::GSI_UDP_SPORT);
            path.set_ident(self.ident);
            let psn = Psn::new(self.psn);
            let Ok(len) = path.emit_with(gsi::transport(psn), t.mad.len(), buf, |b| b.copy_from_slice(&t.mad)) else {
                // A buffer too small for one MAD frame: the caller's bug; drop.
                self.stats.tx_no_mac += 1;
                continue;
            };
            self.psn = (self.psn + 1) & 0x00ff_ffff;
            self.ident = self.ident.wrapping_add(1);
            self.stats.tx_mads += 1;
            return Some(len);
        }
    }
}
