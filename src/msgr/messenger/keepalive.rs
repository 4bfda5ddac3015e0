//! Liveness and reconnect timing: when to send a keepalive, when a silent peer counts as
//! dead, and the backoff between reconnect attempts (with its bounds).

use std::time::{Duration, Instant};

/// Keepalive state of one link: the last time anything was sent and heard, and the last
/// probe.
#[derive(Debug, Clone, Copy)]
pub struct Liveness {
    pub last_sent: Instant,
    pub last_heard: Instant,
    /// The last keepalive sent (a probe limits itself to one per `probe`).
    pub last_ping: Instant,
    /// The last message (data, not a control frame) sent.
    pub last_msg: Instant,
}

/// When keepalives go: every `interval` of silence from this side, and (a probe) every
/// `probe` while this side sent a message since it last heard the peer and the peer stays
/// silent.
/// Why the probe: a request this side sent is acknowledged by the transport at once, and
/// the answer may then never arrive (a link down at both ends: the peer's retries fail,
/// and its side channel's EOF cannot cross either); with nothing unacknowledged here,
/// nothing here retries, and only the next keepalive, `interval` later, would find out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PingRule {
    pub interval: Option<Duration>,
    pub probe: Option<Duration>,
}

impl Liveness {
    pub fn new(now: Instant) -> Liveness {
        Liveness {
            last_sent: now,
            last_heard: now,
            last_ping: now,
            last_msg: now,
        }
    }

    /// A keepalive is due: nothing was sent for the interval, or a probe is due (see
    /// [`PingRule`]).
    pub fn ping_due(&self, now: Instant, r: PingRule) -> bool {
        r.interval
            .is_some_and(|i| now.saturating_duration_since(self.last_sent) >= i)
            || self.probe_at(r).is_some_and(|t| now >= t)
    }

    /// When a probe is due, if this side sent a message since it last heard the peer
    /// (control frames do not count: an idle receiver's last acknowledgement would make
    /// it probe for ever).
    fn probe_at(&self, r: PingRule) -> Option<Instant> {
        let p = r.probe.filter(|_| r.interval.is_some())?;
        (self.last_msg > self.last_heard).then(|| self.last_heard.max(self.last_ping) + p)
    }

    /// A keepalive went at `now`.
    pub fn pinged(&mut self, now: Instant) {
        self.last_sent = now;
        self.last_ping = now;
    }

    /// The peer is presumed dead: nothing heard for `timeout` (only checked with
    /// keepalive on: without it an idle peer sends nothing).
    pub fn dead(&self, now: Instant, interval: Option<Duration>, timeout: Duration) -> bool {
        interval.is_some() && now.saturating_duration_since(self.last_heard) >= timeout
    }

    /// The first time `ping_due` or `dead` can hold (None: never, keepalive off): a pass
    /// that skips an idle session compares one instant instead of both durations.
    pub fn next_due(&self, r: PingRule, timeout: Duration) -> Option<Instant> {
        let i = r.interval?;
        let mut ping = self.last_sent.checked_add(i)?;
        if let Some(t) = self.probe_at(r) {
            ping = ping.min(t);
        }
        Some(match self.last_heard.checked_add(timeout) {
            Some(dead) => ping.min(dead),
            None => ping,
        })
    }
}

/// Reconnect attempts of one session: exponential backoff from `min` to `max`, giving up
/// after `timeout` since the fault or `attempts` failures (0 = no count limit).
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub since: Instant,
    pub failures: u32,
    pub next_at: Instant,
    min: Duration,
    max: Duration,
    timeout: Duration,
    attempts: u32,
}

impl Backoff {
    /// The first attempt goes at once: the fault may have been a one-off.
    pub fn new(
        now: Instant,
        min: Duration,
        max: Duration,
        timeout: Duration,
        attempts: u32,
    ) -> Backoff {
        Backoff {
            since: now,
            failures: 0,
            next_at: now,
            min,
            max,
            timeout,
            attempts,
        }
    }

    /// An attempt failed: schedules the next one, or returns false when out of budget.
    pub fn failed(&mut self, now: Instant) -> bool {
        self.failures += 1;
        if self.exhausted(now) {
            return false;
        }
        let shift = self.failures.saturating_sub(1).min(20);
        let delay = self.min.saturating_mul(1 << shift).min(self.max);
        self.next_at = now + delay;
        true
    }

    pub fn exhausted(&self, now: Instant) -> bool {
        (self.attempts > 0 && self.failures >= self.attempts)
            || now.saturating_duration_since(self.since) >= self.timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `next_due` is the first instant `ping_due` or `dead` holds.
    #[test]
    fn next_due_is_the_earlier_of_ping_and_dead() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut l = Liveness::new(t0);
        assert_eq!(
            l.next_due(every(None), ms(100)),
            None,
            "keepalive off: never"
        );
        assert_eq!(l.next_due(every(Some(ms(10))), ms(100)), Some(t0 + ms(10)));
        l.last_sent = t0 + ms(200);
        let due = l.next_due(every(Some(ms(10))), ms(100)).unwrap();
        assert_eq!(due, t0 + ms(100), "heard nothing for the timeout first");
        assert!(!l.dead(due - ms(1), Some(ms(10)), ms(100)));
        assert!(l.dead(due, Some(ms(10)), ms(100)));
        l.last_heard = t0 + ms(200);
        let due = l.next_due(every(Some(ms(10))), ms(100)).unwrap();
        assert!(
            !l.ping_due(due - ms(1), every(Some(ms(10)))) && l.ping_due(due, every(Some(ms(10))))
        );
    }

    #[test]
    fn backoff_doubles_to_the_cap_and_gives_up() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut b = Backoff::new(t0, ms(10), ms(40), ms(1000), 4);
        assert_eq!(b.next_at, t0);
        assert!(b.failed(t0));
        assert_eq!(b.next_at, t0 + ms(10));
        assert!(b.failed(t0));
        assert_eq!(b.next_at, t0 + ms(20));
        assert!(b.failed(t0));
        assert_eq!(b.next_at, t0 + ms(40));
        assert!(!b.failed(t0)); // the fourth failure ends it
        let mut b = Backoff::new(t0, ms(10), ms(40), ms(100), 0);
        assert!(b.failed(t0 + ms(50)));
        assert!(!b.failed(t0 + ms(100)));
    }

    fn every(i: Option<Duration>) -> PingRule {
        PingRule {
            interval: i,
            probe: None,
        }
    }

    #[test]
    fn keepalive_and_death() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let l = Liveness::new(t0);
        assert!(!l.ping_due(t0 + ms(5), every(Some(ms(10)))));
        assert!(l.ping_due(t0 + ms(10), every(Some(ms(10)))));
        assert!(!l.ping_due(t0 + ms(10_000), every(None)));
        assert!(l.dead(t0 + ms(50), Some(ms(10)), ms(50)));
        assert!(!l.dead(t0 + ms(50), None, ms(50)));
    }

    /// A message sent and nothing heard since: a probe goes after `probe`, then one per
    /// `probe` while the peer stays silent; hearing from it, or having sent no message
    /// since, stops it. Control frames (an idle receiver's last acknowledgement) do not
    /// start one.
    #[test]
    fn a_probe_follows_a_message_the_peer_never_answers() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let r = PingRule {
            interval: Some(ms(1000)),
            probe: Some(ms(30)),
        };
        let mut l = Liveness::new(t0);
        l.last_sent = t0 + ms(5); // an acknowledgement: no probe
        assert!(!l.ping_due(t0 + ms(100), r));
        assert_eq!(l.next_due(r, ms(5000)), Some(t0 + ms(1005)));
        l.last_msg = t0 + ms(5); // a message
        assert_eq!(l.next_due(r, ms(5000)), Some(t0 + ms(30)));
        assert!(!l.ping_due(t0 + ms(29), r) && l.ping_due(t0 + ms(30), r));
        l.pinged(t0 + ms(30));
        assert!(!l.ping_due(t0 + ms(59), r) && l.ping_due(t0 + ms(60), r));
        l.last_heard = t0 + ms(40); // the peer answered
        assert!(!l.ping_due(t0 + ms(100), r));
        assert!(
            !l.ping_due(t0 + ms(100), every(Some(ms(1000)))),
            "no probe without one set"
        );
        let off = PingRule {
            interval: None,
            probe: Some(ms(30)),
        };
        l.last_msg = t0 + ms(50);
        assert!(
            !l.ping_due(t0 + ms(500), off),
            "keepalive off: no probe either"
        );
    }
}
