//! The two encoding helpers: RNR timer and local ACK timeout codes to nanoseconds.

use super::boundary;
use crate::config::encoding;

/// The RNR timer for a 5-bit `min_rnr_timer` code, in nanoseconds (code 0 is the longest,
/// 655.36 ms; code 12 is 0.64 ms). UINT64_MAX for codes above 31.
#[unsafe(no_mangle)]
pub extern "C" fn rdmx_rnr_timer_ns(code: u8) -> u64 {
    boundary::call_value("rdmx_rnr_timer_ns", u64::MAX, || {
        encoding::rnr_timer_ns(code).unwrap_or(u64::MAX)
    })
}

/// The local ACK timeout for a `timeout` code: 4096 x 2^code nanoseconds; 0 for code 0
/// (no ACK timer at all); UINT64_MAX for codes above 31.
#[unsafe(no_mangle)]
pub extern "C" fn rdmx_ack_timeout_ns(code: u8) -> u64 {
    boundary::call_value("rdmx_ack_timeout_ns", u64::MAX, || {
        encoding::ack_timeout_ns(code).unwrap_or(u64::MAX)
    })
}
