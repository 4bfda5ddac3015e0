//! What a retry-exhausted failure means, in the user's terms: how many retries over how
//! long, the knobs in force, and the likely causes with this host's evidence (its load
//! and the time its own process was not running).

use crate::config::encoding::{ack_timeout_ns, rnr_timer_ns};
use crate::rc::{Failure, WcStatus};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::net::SocketAddr;

/// Stalls remembered for failure reports.
const RECENT_STALLS: usize = 64;

/// The device's latest stalls (times its process was not running when it was due to act),
/// shared with its QPs so a failure report can say how much of its window the host itself
/// was away.
#[derive(Debug, Default)]
pub struct StallLog {
    /// (engine time the stall ended, its length), oldest first.
    recent: Mutex<VecDeque<(u64, u64)>>,
}

impl StallLog {
    pub fn record(&self, ended_at: u64, len: u64) {
        let mut r = self.recent.lock();
        if r.len() == RECENT_STALLS {
            r.pop_front();
        }
        r.push_back((ended_at, len));
    }

    /// Stalls that ended at or after `since` (engine ns): count and total length.
    pub fn since(&self, since: u64) -> (u64, u64) {
        self.recent
            .lock()
            .iter()
            .filter(|(at, _)| *at >= since)
            .fold((0, 0), |(n, t), (_, len)| (n + 1, t + len))
    }
}

/// What the host looked like when the QP gave up.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HostEvidence {
    /// 1-minute load average (None: not readable).
    pub load1: Option<f64>,
    pub cpus: usize,
    /// Stalls of this process (time left out of the engine clock) within the failure's
    /// window: count and total ns.
    pub stalls: u64,
    pub stalled_ns: u64,
}

impl HostEvidence {
    /// The load average and CPU count now; stall figures are the caller's.
    pub fn sample(stalls: u64, stalled_ns: u64) -> HostEvidence {
        let load1 = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok());
        HostEvidence {
            load1,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            stalls,
            stalled_ns,
        }
    }
}

/// A duration as a person reads it: "4.2 ms", or "8.2 us" below a millisecond.
fn ms(ns: u64) -> String {
    if ns < 1_000_000 {
        format!("{:.1} us", ns as f64 / 1e3)
    } else {
        format!("{:.1} ms", ns as f64 / 1e6)
    }
}

fn host_line(h: &HostEvidence) -> String {
    let load = match h.load1 {
        Some(l) => format!("load average {l:.2} on {} CPUs", h.cpus),
        None => format!("{} CPUs, load average unknown", h.cpus),
    };
    let stalls = if h.stalls > 0 {
        format!(
            "; this process was not running for {} in {} stall(s) during the wait, which was not counted",
            ms(h.stalled_ns),
            h.stalls
        )
    } else {
        String::new()
    };
    format!("{load}{stalls}")
}

/// One message for a retry-exhausted failure of QP `qpn` towards `peer`.
pub fn describe(qpn: u32, peer: Option<SocketAddr>, f: &Failure, h: &HostEvidence) -> String {
    let to = peer.map_or_else(String::new, |p| format!(" to {p}"));
    match f.status {
        WcStatus::RnrRetryExcErr => {
            let wait = rnr_timer_ns(f.peer_rnr_timer).unwrap_or(0);
            format!(
                "QP {qpn:#x}{to}: RNR retry counter exceeded (RNR_RETRY_EXC_ERR): the peer answered \"receiver not ready\" {} time(s) over {} (rnr_retry {}, the peer's min_rnr_timer {} = {} wait). Likely cause: the peer posts receives too slowly for what is sent to it (post receives before the peer sends, size max_recv_wr, or use credits); raise rnr_retry (7 = never give up) if waiting is acceptable",
                f.retries + 1,
                ms(f.silent_ns),
                f.rnr_retry,
                f.peer_rnr_timer,
                ms(wait),
            )
        }
        _ => {
            let t = ack_timeout_ns(f.timeout).unwrap_or(0);
            format!(
                "QP {qpn:#x}{to}: transport retry counter exceeded (RETRY_EXC_ERR): no ACK or response for {} ({} ACK timeout(s), {} retries = retry_cnt {}; timeout {} = {} per try). Likely causes: the peer is gone or the path is down (process killed, link down, firewall, an MTU the link cannot carry); or the peer's host was starved of CPU (a userspace transport answers only when it is scheduled; here: {}). On a busy host raise timeout (14 = 67 ms) or retry_cnt",
                ms(f.silent_ns),
                f.ack_timeouts,
                f.retries,
                f.retry_cnt,
                f.timeout,
                ms(t),
                host_line(h),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(status: WcStatus) -> Failure {
        Failure {
            status,
            at_ns: 100_000_000,
            silent_ns: 37_748_736,
            ack_timeouts: 8,
            retries: 7,
            timeout: 10,
            retry_cnt: 7,
            rnr_retry: 2,
            peer_rnr_timer: 12,
        }
    }

    #[test]
    fn retry_exc_err_says_how_many_retries_over_how_long_and_why() {
        let h = HostEvidence {
            load1: Some(5.25),
            cpus: 2,
            stalls: 3,
            stalled_ns: 12_300_000,
        };
        let m = describe(
            0x12,
            Some("127.0.0.1:4791".parse().unwrap()),
            &failure(WcStatus::RetryExcErr),
            &h,
        );
        for want in [
            "QP 0x12 to 127.0.0.1:4791",
            "RETRY_EXC_ERR",
            "no ACK or response for 37.7 ms",
            "8 ACK timeout(s), 7 retries = retry_cnt 7",
            "timeout 10 = 4.2 ms per try",
            "peer is gone or the path is down",
            "starved of CPU",
            "load average 5.25 on 2 CPUs",
            "not running for 12.3 ms in 3 stall(s)",
        ] {
            assert!(m.contains(want), "missing {want:?} in {m}");
        }
        let quiet = describe(
            1,
            None,
            &Failure {
                timeout: 1,
                silent_ns: 16_500,
                ..failure(WcStatus::RetryExcErr)
            },
            &HostEvidence::default(),
        );
        // Below a millisecond in microseconds, not "0.0 ms".
        assert!(quiet.contains("no ACK or response for 16.5 us"), "{quiet}");
        assert!(quiet.contains("timeout 1 = 8.2 us per try"), "{quiet}");
        assert!(!quiet.contains("stall"), "{quiet}");
        assert!(quiet.contains("load average unknown"), "{quiet}");
    }

    #[test]
    fn rnr_retry_exc_err_names_the_receiver_side() {
        let m = describe(
            7,
            None,
            &Failure {
                retries: 2,
                ack_timeouts: 0,
                ..failure(WcStatus::RnrRetryExcErr)
            },
            &HostEvidence::sample(0, 0),
        );
        assert!(m.contains("RNR_RETRY_EXC_ERR"), "{m}");
        assert!(m.contains("3 time(s)"), "{m}");
        assert!(m.contains("min_rnr_timer 12 = 640.0 us"), "{m}");
    }
}
