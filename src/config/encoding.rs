//! InfiniBand encodings used by QP attributes (rc-transport.md §4.2, §4.4, §6).

/// RNR timer (5-bit code used by `min_rnr_timer` and RNR NAKs) in nanoseconds; `None` for
/// codes above 31. Code 0 is the longest, 655.36 ms.
pub fn rnr_timer_ns(_code: u8) -> Option<u64> {
    None
}

/// Local ACK timeout, 4096 ns x 2^code; `Some(0)` for code 0 (no timer); `None` above 31.
pub fn ack_timeout_ns(_code: u8) -> Option<u64> {
    None
}
