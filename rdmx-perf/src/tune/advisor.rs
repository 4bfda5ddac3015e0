//! The timer advisor's arithmetic: from what was measured on a path (the wait for an answer
//! under the user's queue depth, the round trip, the responder's stalls, RNR NAKs, loss) to
//! `timeout`, `retry_cnt`, `rnr_retry` and `min_rnr_timer`, each with its reasoning, and the
//! two consequences of a timer set: how long a dead peer takes to be declared dead, and how
//! many packets a timeout that fires too early sends twice. Pure functions of their inputs
//! (measuring is `path.rs`), so the rules are tested on literal numbers.

use rdmx::config::encoding::{ack_timeout_ns, rnr_timer_ns};

/// Progress passes later than this count as stalls (the soft device's threshold): the
/// stall model below starts there.
pub const STALL_THRESHOLD_NS: u64 = 200_000;
/// A timeout at least this many times the longest silence seen (a margin for what a short
/// measurement did not see).
pub const MARGIN: f64 = 2.0;
/// Spurious retransmissions the recommended timeout may cost, as a fraction of packets.
pub const SPURIOUS_TARGET: f64 = 1e-5;
/// Probability the recommended retry_cnt may leave for a live path to be declared dead
/// (every try of one packet lost or timed out spuriously).
pub const FALSE_DEATH_TARGET: f64 = 1e-12;
/// Largest timeout code recommended: 20 = 4.3 s per try. A path slower than that has a
/// problem no timer fixes.
pub const MAX_TIMEOUT_CODE: u8 = 20;

/// What was measured on the path, in ns and counts.
#[derive(Debug, Clone, PartialEq)]
pub struct Path {
    /// Round trip of one READ at a time (read_lat): p50, p99, p99.99, max.
    pub rtt_ns: [u64; 4],
    /// Post-to-completion of a READ at the user's queue depth (read_bw): p50, p99, p99.99,
    /// max (reported; a READ queued behind others waits before its request is even sent).
    pub wait_ns: [u64; 4],
    /// Silences in that run: time without any completion while READs were outstanding,
    /// p50, p99, p99.99, max. An RC requester's ACK timer restarts on every answer, so a
    /// timeout fires spuriously when a silence outlasts it.
    pub gap_ns: [u64; 4],
    /// Silences measured (one per completion batch).
    pub gaps: u64,
    /// The user's queue depth.
    pub qd: u64,
    /// Request packets one timeout resends (go-back-N): the READs on the wire,
    /// min(qd, max_rd_atomic).
    pub resent_per_timeout: u64,
    /// READs completed in that run, and per second.
    pub ops: u64,
    pub ops_per_sec: f64,
    /// Seconds the stalls were counted over.
    pub seconds: f64,
    /// The responder's (server's) stalls: count, total, longest.
    pub server_stalls: u64,
    pub server_stalled_ns: u64,
    pub server_max_stall_ns: u64,
    /// The requester's own stalls (left out of its timers; reported, not used).
    pub client_stalls: u64,
    pub client_stalled_ns: u64,
    pub client_max_stall_ns: u64,
    /// RNR NAKs the client received in a send_bw at the user's queue depth, and the SENDs.
    pub rnr_naks: u64,
    pub sends: u64,
    /// How the RNR probe ended, if with an error.
    pub rnr_note: Option<String>,
    /// Whether the provider counts packets, NAKs and stalls per connection (soft). On
    /// verbs they stay zero (a NIC counts per port), so RNR NAKs, loss and stalls above
    /// are unknown, not zero.
    pub counted: bool,
    /// Packets lost or reordered (sequence NAKs, kernel drops), and packets sent.
    pub lost: u64,
    pub tx_packets: u64,
}

/// A timer set and what it costs on the measured path.
#[derive(Debug, Clone, PartialEq)]
pub struct Timers {
    pub name: String,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    /// (retry_cnt + 1) x 4.096 us x 2^timeout.
    pub detection_ns: u64,
    /// Fraction of packets a too-early ACK timeout sends twice, predicted.
    pub spurious_fraction: f64,
    /// How long a sender waits on an RNR NAK, and how long before it gives up (None: never,
    /// rnr_retry 7).
    pub rnr_wait_ns: u64,
    pub rnr_give_up_ns: Option<u64>,
}

/// The recommendation: the timers and why, one sentence per knob.
#[derive(Debug, Clone, PartialEq)]
pub struct Advice {
    pub timers: Timers,
    pub reasons: Vec<(&'static str, String)>,
}

/// (retry_cnt + 1) x 4.096 us x 2^timeout, ns (timeout 0 = wait forever: u64::MAX).
pub fn detection_ns(timeout: u8, retry_cnt: u8) -> u64 {
    match ack_timeout_ns(timeout) {
        Some(0) | None => u64::MAX,
        Some(t) => t.saturating_mul(u64::from(retry_cnt) + 1),
    }
}

/// P(X > x) from four quantiles (p50, p99, p99.99, max) of `n` samples, interpolated
/// log-linearly between the known points (0.5, 0.01, 1e-4, 1/n) and 0 beyond the max.
pub fn tail_above(q: [u64; 4], n: u64, x: u64) -> f64 {
    if n == 0 {
        return 0.0;
    }
    let last = 1.0 / n as f64;
    let pts = [
        (q[0] as f64, 0.5),
        (q[1] as f64, 0.01),
        (q[2] as f64, 1e-4_f64.max(last)),
        (q[3] as f64, last),
    ];
    let x = x as f64;
    if x >= pts[3].0 {
        return 0.0;
    }
    if x < pts[0].0 {
        return 0.5;
    }
    for w in pts.windows(2) {
        let ((x0, p0), (x1, p1)) = (w[0], w[1]);
        if x < x1 {
            if x1 <= x0 {
                return p1;
            }
            let f = (x - x0) / (x1 - x0);
            return (p0.ln() + f * (p1.ln() - p0.ln())).exp();
        }
    }
    0.0
}

/// P(one responder stall lasts more than x): stalls are at least [`STALL_THRESHOLD_NS`]
/// long, and past it modelled as exponential with the measured mean (the simplest law
/// with the measured mean; it puts weight beyond the longest stall seen, which a short
/// measurement may not have met).
pub fn stall_above(stalls: u64, stalled_ns: u64, x: u64) -> f64 {
    if stalls == 0 {
        return 0.0;
    }
    if x <= STALL_THRESHOLD_NS {
        return 1.0;
    }
    let mean = stalled_ns as f64 / stalls as f64;
    let excess = (mean - STALL_THRESHOLD_NS as f64).max(1.0);
    (-((x - STALL_THRESHOLD_NS) as f64) / excess).exp()
}

/// The fraction of request packets an ACK timeout of `t_ns` sends twice on `p`. Two
/// estimates of how often the path stays silent longer than the timer: the measured
/// silences (their tail above `t_ns`, times how many there were), and the responder's
/// stalls (their rate times the modelled tail). Each such silence fires one timeout, which
/// resends `resent_per_timeout` requests (go-back-N); per READ sent. The larger of the two.
pub fn spurious_fraction(p: &Path, t_ns: u64) -> f64 {
    if t_ns == 0 {
        return 0.0; // no timer, no spurious retransmission (and no detection either)
    }
    let resent = p.resent_per_timeout as f64;
    let from_gaps = if p.ops > 0 {
        p.gaps as f64 * tail_above(p.gap_ns, p.gaps, t_ns) * resent / p.ops as f64
    } else {
        0.0
    };
    let stalls_per_sec = if p.seconds > 0.0 {
        p.server_stalls as f64 / p.seconds
    } else {
        0.0
    };
    let from_stalls = if p.ops_per_sec > 0.0 {
        stalls_per_sec * stall_above(p.server_stalls, p.server_stalled_ns, t_ns) * resent
            / p.ops_per_sec
    } else {
        0.0
    };
    from_gaps.max(from_stalls).min(1.0)
}

/// The longest silence a requester met or may meet: the silences' p99.99 (or their max
/// when there are fewer than 10^4), or the longest responder stall plus a median round
/// trip.
pub fn longest_silence_ns(p: &Path) -> u64 {
    let gap = if p.gaps >= 10_000 {
        p.gap_ns[2]
    } else {
        p.gap_ns[3]
    };
    gap.max(p.server_max_stall_ns.saturating_add(p.rtt_ns[0]))
}

/// The smallest RNR timer code whose wait is at least `ns` (codes 1..=31 in order of
/// wait; 0 is the longest, 655.36 ms, used when nothing shorter suffices).
pub fn rnr_code_at_least(ns: u64) -> u8 {
    (1..=31u8)
        .filter_map(|c| rnr_timer_ns(c).map(|w| (c, w)))
        .filter(|&(_, w)| w >= ns)
        .min_by_key(|&(_, w)| w)
        .map_or(0, |(c, _)| c)
}

/// What a timer set costs on `p`.
pub fn evaluate(
    name: &str,
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    min_rnr_timer: u8,
    p: &Path,
) -> Timers {
    let rnr_wait_ns = rnr_timer_ns(min_rnr_timer).unwrap_or(0);
    Timers {
        name: name.to_string(),
        timeout,
        retry_cnt,
        rnr_retry,
        min_rnr_timer,
        detection_ns: detection_ns(timeout, retry_cnt),
        spurious_fraction: spurious_fraction(p, ack_timeout_ns(timeout).unwrap_or(0)),
        rnr_wait_ns,
        rnr_give_up_ns: (rnr_retry < 7)
            .then(|| rnr_wait_ns.saturating_mul(u64::from(rnr_retry) + 1)),
    }
}

fn ms(ns: u64) -> String {
    format!("{:.3} ms", ns as f64 / 1e6)
}

/// The recommendation for `p`.
pub fn advise(p: &Path) -> Advice {
    let mut reasons = Vec::new();
    // timeout: at least MARGIN x the longest silence, and no more spurious retransmissions
    // than SPURIOUS_TARGET; the smallest code that does both (a longer one only delays the
    // detection of a dead peer).
    let silence = longest_silence_ns(p);
    let need = (silence as f64 * MARGIN) as u64;
    let mut timeout = MAX_TIMEOUT_CODE;
    for t in 1..=MAX_TIMEOUT_CODE {
        let ns = ack_timeout_ns(t).unwrap_or(u64::MAX);
        if ns >= need && spurious_fraction(p, ns) <= SPURIOUS_TARGET {
            timeout = t;
            break;
        }
    }
    let t_ns = ack_timeout_ns(timeout).unwrap_or(0);
    let capped = if ack_timeout_ns(timeout).unwrap_or(0) < need
        || spurious_fraction(p, t_ns) > SPURIOUS_TARGET
    {
        format!(
            " (capped at {MAX_TIMEOUT_CODE}: no shorter code met both; the path itself is the problem)"
        )
    } else {
        String::new()
    };
    reasons.push((
        "timeout",
        format!(
            "{timeout} = {}: the smallest code >= {MARGIN} x the longest silence a requester met \
             or may meet ({}: silences at qd {} (p99.99, or max under 10^4 of them) vs longest \
             responder stall {} + RTT p50 {}) with a predicted spurious-retransmission \
             fraction <= {SPURIOUS_TARGET:e}{capped}",
            ms(t_ns),
            ms(silence),
            p.qd,
            ms(p.server_max_stall_ns),
            ms(p.rtt_ns[0]),
        ),
    ));
    // retry_cnt: each try of one packet fails with probability q (lost, or answered after
    // the timer); the path is declared dead falsely with q^(retry_cnt + 1). Losses and
    // stalls come in bursts, so at least 2 retries whatever the independent bound says.
    let loss = if p.tx_packets > 0 {
        p.lost as f64 / p.tx_packets as f64
    } else {
        0.0
    };
    let q = loss.max(spurious_fraction(p, t_ns)).max(1e-9);
    let retry_cnt = (2..=7u8)
        .find(|&k| q.powi(i32::from(k) + 1) <= FALSE_DEATH_TARGET)
        .unwrap_or(7);
    reasons.push((
        "retry_cnt",
        format!(
            "{retry_cnt}: a try fails with p = {q:.2e} (loss {loss:.2e}, spurious timeout \
             {:.2e}); p^(retry_cnt+1) <= {FALSE_DEATH_TARGET:e}, and at least 2 because \
             losses and stalls come in bursts",
            spurious_fraction(p, t_ns)
        ),
    ));
    // rnr_retry: RNR NAKs in steady state at the user's depth mean the receiver is slow, not
    // dead; giving up turns slowness into connection errors (the Ceph harness' RNR storm).
    // None: a receiver that stops reposting is a fault, report it after a few waits.
    let rnr_rate = if p.sends > 0 {
        p.rnr_naks as f64 / p.sends as f64
    } else {
        0.0
    };
    let rnr_retry = if p.rnr_naks == 0 { 2 } else { 7 };
    reasons.push((
        "rnr_retry",
        if !p.counted {
            "2: RNR NAKs are not counted per connection on this provider (verbs: the NIC \
             counts per port, see its hw_counters rnr_nak_retry_err); 2 is right for a \
             receiver that keeps up: make sure yours does (max_recv_wr, credits)"
                .to_string()
        } else if p.rnr_naks == 0 {
            format!(
                "2: no RNR NAK in {} SENDs at qd {}: the receiver keeps up, so an RNR NAK \
                 means it stopped reposting; report that after 3 waits instead of hanging (7 \
                 retries forever)",
                p.sends, p.qd
            )
        } else {
            format!(
                "7 (forever): {} RNR NAKs in {} SENDs ({rnr_rate:.2e}) at qd {}: the receiver \
                 is slow at this depth, and giving up turns that into connection errors; \
                 better: more receives posted (max_recv_wr) or fewer SENDs in flight",
                p.rnr_naks, p.sends, p.qd
            )
        },
    ));
    // min_rnr_timer: wait about as long as the receiver needs to repost: a round trip
    // (p99), or a typical responder stall when it stalls.
    let mean_stall = p
        .server_stalled_ns
        .checked_div(p.server_stalls)
        .unwrap_or(0);
    let target = p.rtt_ns[1].max(mean_stall);
    let min_rnr_timer = rnr_code_at_least(target);
    reasons.push((
        "min_rnr_timer",
        format!(
            "{min_rnr_timer} = {}: the shortest RNR wait >= what a receiver needs to repost \
             (RTT p99 {}, mean responder stall {})",
            ms(rnr_timer_ns(min_rnr_timer).unwrap_or(0)),
            ms(p.rtt_ns[1]),
            ms(mean_stall)
        ),
    ));
    Advice {
        timers: evaluate(
            "recommended",
            timeout,
            retry_cnt,
            rnr_retry,
            min_rnr_timer,
            p,
        ),
        reasons,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A quiet loopback: 30 us round trips, silences up to 2 ms at qd 32, no stalls.
    fn quiet() -> Path {
        Path {
            rtt_ns: [30_000, 60_000, 150_000, 400_000],
            wait_ns: [200_000, 500_000, 1_000_000, 2_000_000],
            gap_ns: [20_000, 200_000, 1_000_000, 2_000_000],
            gaps: 1_000_000,
            qd: 32,
            resent_per_timeout: 16,
            ops: 1_000_000,
            ops_per_sec: 200_000.0,
            seconds: 5.0,
            server_stalls: 0,
            server_stalled_ns: 0,
            server_max_stall_ns: 0,
            client_stalls: 0,
            client_stalled_ns: 0,
            client_max_stall_ns: 0,
            rnr_naks: 0,
            sends: 1_000_000,
            rnr_note: None,
            counted: true,
            lost: 0,
            tx_packets: 1_000_000,
        }
    }

    /// The busy host of docs/busy-hosts.md: responder away up to 28 ms.
    fn busy() -> Path {
        Path {
            server_stalls: 500,
            server_stalled_ns: 500 * 3_000_000,
            server_max_stall_ns: 28_000_000,
            gap_ns: [50_000, 3_000_000, 20_000_000, 30_000_000],
            ..quiet()
        }
    }

    #[test]
    fn detection_time_is_tries_times_the_ack_timeout() {
        // ceph-after: 8 x 4.194304 ms; ceph-before: 8 x 67.108864 ms.
        assert_eq!(detection_ns(10, 7), 8 * 4_194_304);
        assert_eq!(detection_ns(14, 7), 8 * 67_108_864);
        assert_eq!(detection_ns(1, 0), 8_192);
        assert_eq!(detection_ns(0, 7), u64::MAX, "timeout 0 waits forever");
    }

    #[test]
    fn tail_interpolates_between_the_quantiles() {
        let q = [100, 1_000, 10_000, 100_000];
        assert_eq!(tail_above(q, 1_000_000, 50), 0.5);
        assert!((tail_above(q, 1_000_000, 100) - 0.5).abs() < 1e-12);
        assert!((tail_above(q, 1_000_000, 1_000) - 0.01).abs() < 1e-12);
        // Half way (linear in x) from (1000, 1e-2) to (10000, 1e-4): 1e-3 in log space.
        assert!((tail_above(q, 1_000_000, 5_500) - 1e-3).abs() < 1e-9);
        assert!((tail_above(q, 1_000_000, 10_000) - 1e-4).abs() < 1e-12);
        assert_eq!(tail_above(q, 1_000_000, 100_000), 0.0);
        assert_eq!(tail_above(q, 0, 10), 0.0);
    }

    #[test]
    fn stall_tail_is_exponential_past_the_threshold() {
        assert_eq!(stall_above(0, 0, 1_000_000), 0.0);
        assert_eq!(stall_above(10, 10 * 1_200_000, 100_000), 1.0);
        // mean 1.2 ms: excess 1 ms; 1.2 ms is one mean excess past the 0.2 ms threshold.
        let p = stall_above(10, 10 * 1_200_000, 1_200_000);
        assert!((p - (-1.0f64).exp()).abs() < 1e-12, "{p}");
    }

    #[test]
    fn spurious_fraction_takes_the_larger_source() {
        let b = busy();
        // At ceph-after's 4.194 ms: the silences' tail, log-linear between p99 (3 ms, 1e-2)
        // and p99.99 (20 ms, 1e-4): 7.24e-3 of 10^6 silences, x 16 resent / 10^6 READs =
        // 0.116; stalls: 100/s x exp(-(4.194-0.2)/2.8) x 16 / 200k = 1.92e-3.
        let t = ack_timeout_ns(10).unwrap();
        let from_gaps = tail_above(b.gap_ns, b.gaps, t) * 16.0;
        assert!((from_gaps - 0.1158).abs() < 1e-3, "{from_gaps}");
        let from_stalls = 100.0 * stall_above(500, 500 * 3_000_000, t) * 16.0 / 200_000.0;
        assert!((from_stalls - 1.92e-3).abs() < 1e-5, "{from_stalls}");
        assert_eq!(spurious_fraction(&b, t), from_gaps.max(from_stalls));
        let only_stalls = Path {
            gaps: 0,
            ..b.clone()
        };
        assert_eq!(spurious_fraction(&only_stalls, t), from_stalls);
        // At 67 ms the silences' tail is 0 (past their max) and the stall model small.
        let t14 = ack_timeout_ns(14).unwrap();
        let f = spurious_fraction(&b, t14);
        assert!(f > 0.0 && f < 1e-10, "{f}");
        assert_eq!(spurious_fraction(&quiet(), t14), 0.0);
        assert_eq!(spurious_fraction(&b, 0), 0.0);
    }

    #[test]
    fn rnr_codes_are_the_shortest_wait_that_suffices() {
        assert_eq!(rnr_code_at_least(0), 1); // 0.01 ms
        assert_eq!(rnr_code_at_least(640_000), 12); // exactly 0.64 ms
        assert_eq!(rnr_code_at_least(640_001), 13); // 0.96 ms
        assert_eq!(rnr_code_at_least(500_000_000), 0); // 491.52 ms (31) is too short
        assert_eq!(rnr_code_at_least(491_520_000), 31);
        assert_eq!(rnr_code_at_least(600_000_000), 0); // only 655.36 ms suffices
    }

    #[test]
    fn a_quiet_path_gets_a_short_timeout_a_busy_one_a_long_one() {
        let q = advise(&quiet());
        // Longest silence 1 ms (wait p99.99); 2 ms needed: code 9 = 2.10 ms.
        assert_eq!(q.timers.timeout, 9, "{:?}", q.reasons);
        assert_eq!(q.timers.detection_ns, detection_ns(9, q.timers.retry_cnt));
        assert_eq!(q.timers.retry_cnt, 2, "{:?}", q.reasons);
        assert_eq!(q.timers.rnr_retry, 2);
        // RTT p99 60 us, no stalls: code 5 (0.06 ms).
        assert_eq!(q.timers.min_rnr_timer, 5);
        assert_eq!(q.timers.rnr_give_up_ns, Some(3 * 60_000));
        let b = advise(&busy());
        // Longest silence 28 ms + 30 us; 56.06 ms needed: code 14 = 67 ms, where the stall
        // model predicts 100/s x exp(-(67.1-0.2)/2.8) x 32/200k, far under 1e-5.
        assert_eq!(b.timers.timeout, 14, "{:?}", b.reasons);
        assert!(b.timers.timeout > q.timers.timeout);
        // Mean stall 3 ms: RNR code 17 = 3.84 ms.
        assert_eq!(b.timers.min_rnr_timer, 17);
        assert_eq!(b.reasons.len(), 4);
        assert!(b.reasons[0].1.contains("28.000 ms"), "{}", b.reasons[0].1);
    }

    #[test]
    fn uncounted_rnr_says_so() {
        let p = Path {
            counted: false,
            ..quiet()
        };
        let a = advise(&p);
        assert_eq!(a.timers.rnr_retry, 2);
        assert!(a.reasons[2].1.contains("not counted"), "{}", a.reasons[2].1);
    }

    #[test]
    fn loss_raises_retry_cnt_and_rnr_naks_make_rnr_retry_infinite() {
        let mut p = quiet();
        p.lost = 1_000; // 1e-3 of packets: 1e-3^(k+1) <= 1e-12 needs k >= 3
        p.rnr_naks = 10;
        let a = advise(&p);
        assert_eq!(a.timers.retry_cnt, 3, "{:?}", a.reasons);
        assert_eq!(a.timers.rnr_retry, 7);
        assert_eq!(a.timers.rnr_give_up_ns, None);
        assert!(a.reasons[2].1.starts_with("7 (forever)"));
    }

    #[test]
    fn profiles_are_evaluated_on_the_same_path() {
        let b = busy();
        let after = evaluate("ceph-after", 10, 7, 2, 12, &b);
        let before = evaluate("ceph-before", 14, 7, 7, 0, &b);
        assert_eq!(after.detection_ns, 33_554_432);
        assert_eq!(before.detection_ns, 536_870_912);
        assert!(after.spurious_fraction > before.spurious_fraction);
        assert_eq!(after.rnr_wait_ns, 640_000);
        assert_eq!(after.rnr_give_up_ns, Some(1_920_000));
        assert_eq!(before.rnr_wait_ns, 655_360_000);
        assert_eq!(before.rnr_give_up_ns, None);
    }
}
