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

    // ---- responder (responder.rs) ----
    /// Responder: positive ACKs queued (coalesced ACKs count once; re-ACKs of duplicates included).
    pub resp_acks_sent: u64,
    /// Responder: PSN sequence error NAKs sent.
    pub resp_naks_psn_seq_sent: u64,
    /// Responder: invalid request NAKs sent.
    pub resp_naks_inv_req_sent: u64,
    /// Responder: remote access error NAKs sent.
    pub resp_naks_rem_access_sent: u64,
    /// Responder: remote operational error NAKs sent.
    pub resp_naks_rem_op_sent: u64,
    /// Responder: RNR NAKs sent (no receive WQE posted).
    pub resp_rnr_naks_sent: u64,
    /// Responder: ACKs of whole SENDs/WRITEs held for the QP's next request
    /// frame (the application's reply), to leave behind it.
    pub resp_acks_held: u64,
    /// Responder: held ACKs whose deadline passed before a request frame
    /// came (sent alone).
    pub resp_acks_hold_expired: u64,
    /// Responder: RDMA READ response packets sent (replays included).
    pub resp_read_responses_sent: u64,
    /// Responder: atomic ACKs sent (replays included).
    pub resp_atomic_acks_sent: u64,
    /// Responder: duplicate requests received (PSN behind the expected PSN).
    pub resp_duplicates: u64,
    /// Responder: duplicate READ requests answered from a saved resource.
    pub resp_read_replays: u64,
    /// Responder: duplicate atomics answered with the saved original value.
    pub resp_atomic_replays: u64,
    /// Responder: duplicate READ/atomic with no matching resource (or not a
    /// subset of it), dropped silently.
    pub resp_dup_no_resource_dropped: u64,
    /// Responder: packets ahead of the expected PSN dropped silently after the
    /// one PSN sequence error NAK (or the RNR NAK).
    pub resp_out_of_seq_dropped: u64,
    /// Responder: request packets dropped because the QP's responder is in error.
    pub resp_dropped_in_error: u64,
    /// Responder: packets whose opcode is not a request of this QP's service, dropped.
    pub resp_bad_opcode_dropped: u64,
    /// Responder: responses not queued because the response queue was full
    /// (the requester's retry recovers them).
    pub resp_responses_dropped: u64,
    /// Responder: messages completed (MSN increments: SEND, WRITE, READ, atomic).
    pub resp_messages: u64,
    /// Responder: bytes placed into receive buffers and RDMA WRITE targets.
    pub resp_bytes_placed: u64,
    /// UC responder: packets dropped (PSN gap, missing FIRST, no WQE, bad rkey, length).
    pub resp_uc_dropped: u64,
    /// UD responder: packets dropped for a Q_Key mismatch.
    pub resp_ud_qkey_dropped: u64,
    /// UD responder: packets dropped because no receive WQE was posted.
    pub resp_ud_no_wqe_dropped: u64,
    /// UD responder: packets dropped because they exceed the path MTU or the
    /// posted buffer (GRH + payload).
    pub resp_ud_len_dropped: u64,
    /// Requester: ACKs received.
    pub req_acks_received: u64,
    /// Requester: ACKs that acknowledged nothing new.
    pub req_duplicate_acks: u64,
    /// Requester: responses for PSNs never sent (ignored).
    pub req_ghost_responses: u64,
    /// Requester: responses for PSNs no longer outstanding (older than the
    /// oldest unacknowledged PSN, or nothing outstanding): duplicates or
    /// forgeries, ignored.
    pub req_stale_responses: u64,
    /// Requester: PSN sequence error NAKs repeating a retry already under
    /// way (ignored; they do not use up retry_cnt).
    pub req_duplicate_naks: u64,
    /// Requester: RNR NAKs received.
    pub req_rnr_naks_received: u64,
    /// Requester: PSN sequence error NAKs received.
    pub req_naks_seq_received: u64,
    /// Requester: invalid request / remote access / remote operational NAKs received.
    pub req_naks_error_received: u64,
    /// Requester: malformed or unexpected responses.
    pub req_bad_responses: u64,
    /// Requester: go-back-N restarts (NAK, timeout, lost READ response).
    pub req_retransmits: u64,
    /// Requester: local ACK timeouts.
    pub req_timeouts: u64,
    /// DCQCN notification point: CE-marked packets received.
    pub np_ce_received: u64,
    /// DCQCN notification point: CNPs sent to the peer QP.
    pub np_cnps_sent: u64,
    /// DCQCN reaction point: CNPs received.
    pub rp_cnps_received: u64,
}

impl QpStats {
    /// Every counter with its name, for display (`urnic stat`).
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
        [
            ("tx_packets", self.tx_packets),
            ("tx_bytes", self.tx_bytes),
            ("rx_packets", self.rx_packets),
            ("rx_bytes", self.rx_bytes),
            ("resp_acks_sent", self.resp_acks_sent),
            ("resp_naks_psn_seq_sent", self.resp_naks_psn_seq_sent),
            ("resp_naks_inv_req_sent", self.resp_naks_inv_req_sent),
            ("resp_naks_rem_access_sent", self.resp_naks_rem_access_sent),
            ("resp_naks_rem_op_sent", self.resp_naks_rem_op_sent),
            ("resp_rnr_naks_sent", self.resp_rnr_naks_sent),
            ("resp_acks_held", self.resp_acks_held),
            ("resp_acks_hold_expired", self.resp_acks_hold_expired),
            ("resp_read_responses_sent", self.resp_read_responses_sent),
            ("resp_atomic_acks_sent", self.resp_atomic_acks_sent),
            ("resp_duplicates", self.resp_duplicates),
            ("resp_read_replays", self.resp_read_replays),
            ("resp_atomic_replays", self.resp_atomic_replays),
            ("resp_dup_no_resource_dropped", self.resp_dup_no_resource_dropped),
            ("resp_out_of_seq_dropped", self.resp_out_of_seq_dropped),
            ("resp_dropped_in_error", self.resp_dropped_in_error),
            ("resp_bad_opcode_dropped", self.resp_bad_opcode_dropped),
            ("resp_responses_dropped", self.resp_responses_dropped),
            ("resp_messages", self.resp_messages),
            ("resp_bytes_placed", self.resp_bytes_placed),
            ("resp_uc_dropped", self.resp_uc_dropped),
            ("resp_ud_qkey_dropped", self.resp_ud_qkey_dropped),
            ("resp_ud_no_wqe_dropped", self.resp_ud_no_wqe_dropped),
            ("resp_ud_len_dropped", self.resp_ud_len_dropped),
            ("req_acks_received", self.req_acks_received),
            ("req_duplicate_acks", self.req_duplicate_acks),
            ("req_ghost_responses", self.req_ghost_responses),
            ("req_stale_responses", self.req_stale_responses),
            ("req_duplicate_naks", self.req_duplicate_naks),
            ("req_rnr_naks_received", self.req_rnr_naks_received),
            ("req_naks_seq_received", self.req_naks_seq_received),
            ("req_naks_error_received", self.req_naks_error_received),
            ("req_bad_responses", self.req_bad_responses),
            ("req_retransmits", self.req_retransmits),
            ("req_timeouts", self.req_timeouts),
            ("np_ce_received", self.np_ce_received),
            ("np_cnps_sent", self.np_cnps_sent),
            ("rp_cnps_received", self.rp_cnps_received),
        ]
        .into_iter()
    }
}
