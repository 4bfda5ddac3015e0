//! Per-QP counters: what an operator watches to find a bad cable or a starving receiver
//! (the seed's retrans_cnt, out_of_seq, packet_errors).

/// Monotonic per-QP counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    /// Request packets sent again by go-back-N.
    pub retransmits: u64,
    pub seq_naks_sent: u64,
    pub seq_naks_received: u64,
    pub rnr_naks_sent: u64,
    pub rnr_naks_received: u64,
    /// Local ACK timer expiries with packets outstanding (each starts a retry, or ends
    /// the WR with RETRY_EXC_ERR when none are left).
    pub ack_timeouts: u64,
    /// Request packets behind the expected PSN (re-ACKed or replayed, never re-delivered).
    pub duplicates_received: u64,
    /// Request packets ahead of the expected PSN, dropped (go-back-N).
    pub out_of_sequence: u64,
    /// Packets whose ICRC did not match (counted by whoever checks the ICRC).
    pub icrc_errors: u64,
    /// Packets that did not parse or did not belong here.
    pub malformed: u64,
    /// Duplicate READ requests that queued no replay of their own (docs/rc-transport.md
    /// §5.4): the READ's responses were still queued (the stream is rewound to the
    /// duplicate's PSN if that is earlier), or `max_dest_rd_atomic` replays already were.
    /// A flood of duplicates costs a counter, not memory.
    pub dropped_duplicate_reads: u64,
    /// New READ requests refused because `max_dest_rd_atomic` READs still had responses
    /// to send (the peer ignored its `max_rd_atomic`): NAK Invalid Request, QP to ERR (§5.5).
    pub rd_atomic_exceeded: u64,
    // Work-request level, counted by the provider seam (`provider::dev`) on both providers,
    // the engine leaves them at zero. On verbs they are the only figures a connection has:
    // a NIC's packet counters are per port (`hw_counters`), not per QP.
    /// Send-queue WRs the provider accepted (SEND, SEND_IMM, RDMA WRITE(_IMM), READ).
    pub wr_send_posted: u64,
    /// Receive WRs the provider accepted.
    pub wr_recv_posted: u64,
    /// Payload bytes of the accepted SEND and SEND_IMM WRs.
    pub send_bytes_posted: u64,
    /// Payload bytes of the accepted RDMA WRITE and WRITE_IMM WRs.
    pub write_bytes_posted: u64,
    /// Bytes the accepted RDMA READ WRs asked for.
    pub read_bytes_posted: u64,
    /// Completions handed to the caller by `poll` (every status).
    pub completions: u64,
    /// Those completions by status: `wc_status[s]` counts `ibv_wc_status` value `s`
    /// (0 success, 5 flushed, 10 remote access error, 12 retry exceeded, ...).
    pub wc_status: [u64; WC_STATUS_COUNT],
    /// Bytes delivered by successful receive completions (`byte_len`).
    pub recv_bytes: u64,
    /// Async events the device reported about this connection's QP or CQs (verbs:
    /// QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR, CQ_ERR, COMM_EST, path migration, ...; the
    /// soft provider raises none).
    pub async_events: u64,
}

/// Entries of [`Counters::wc_status`]: `ibv_wc_status` values 0..=21.
pub const WC_STATUS_COUNT: usize = 22;
