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
}
