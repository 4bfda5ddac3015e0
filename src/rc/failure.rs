//! Why a QP's requester gave up: the figures behind RETRY_EXC_ERR and RNR_RETRY_EXC_ERR, so
//! a driver can tell the user what happened in their terms (how many retries over how
//! long, with which knobs) instead of only a status code.

use super::verbs::WcStatus;

/// What ended a QP with a retry-exhausted error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    /// `RetryExcErr` or `RnrRetryExcErr`.
    pub status: WcStatus,
    /// When the QP gave up (engine clock, ns).
    pub at_ns: u64,
    /// Time from the last progress (ACK, response or first transmission of the unanswered
    /// request) to giving up, ns.
    pub silent_ns: u64,
    /// ACK timer expiries since the last progress.
    pub ack_timeouts: u32,
    /// Retries used since the last progress (go-back-N for RETRY_EXC_ERR, RNR NAKs
    /// answered for RNR_RETRY_EXC_ERR).
    pub retries: u32,
    /// The QP's knobs in force.
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    /// RNR_RETRY_EXC_ERR: the RNR timer code the peer asked for in its last RNR NAK (the
    /// peer's min_rnr_timer); otherwise 0.
    pub peer_rnr_timer: u8,
}
