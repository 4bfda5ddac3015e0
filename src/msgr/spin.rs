//! Polling before sleeping, that steps aside on a busy host.
//!
//! A progress loop that keeps polling for a while after its last event answers the next one
//! without a wake-up: measured on an idle host, a messenger server that polls 50 us gave
//! rpc_lat p50 24.6-28.4 us where one that sleeps at once gives 32.6-38.5 us. But on a host
//! whose cores are all busy, a polling thread is time-sliced with the other runnable ones
//! and holds the core its peer needs: spinning 1 ms gave rpc_bw 5-14K ops/s against 26-36K
//! sleeping at once (load 4-6 on 2 cores). A [`Spinner`] polls for its budget, but when two
//! consecutive empty polls lie further apart than [`PREEMPTED`] and the kernel counted an
//! involuntary context switch of the thread since the spin began, the thread was preempted
//! while it polled (not merely slow: a pass over 1,000 sessions takes ~1 ms): it then
//! sleeps at once for [`BACKOFF`] before it polls again.

use std::time::{Duration, Instant};

/// A gap between two empty polls that only preemption explains (an empty poll takes a few
/// microseconds; a time slice on a busy host is a millisecond or more).
pub(crate) const PREEMPTED: Duration = Duration::from_micros(200);
/// How long a preempted spinner sleeps at once before it polls again.
pub(crate) const BACKOFF: Duration = Duration::from_millis(100);

/// The polling state of one progress loop.
#[derive(Debug)]
pub(crate) struct Spinner {
    /// How long to poll after the last event: None = always (`poll_mode=busy`: the caller
    /// asked for it, no backing off), zero = sleep at once.
    budget: Option<Duration>,
    /// The first empty poll since the last event or sleep.
    idle_since: Option<Instant>,
    /// The previous empty poll.
    last: Option<Instant>,
    /// Sleeping at once until then (preempted while polling).
    off_until: Option<Instant>,
    /// Slept since the last work: no polling until there is some.
    spent: bool,
    /// The thread's involuntary context switches when the spin started.
    switches: u64,
    preemptions: u64,
}

impl Spinner {
    pub(crate) fn new(budget: Option<Duration>) -> Spinner {
        Spinner {
            budget,
            idle_since: None,
            last: None,
            off_until: None,
            spent: false,
            switches: 0,
            preemptions: 0,
        }
    }

    /// The loop found work: the next empty poll starts a new spin.
    #[inline]
    pub(crate) fn work(&mut self) {
        self.idle_since = None;
        self.last = None;
        self.spent = false;
    }

    /// The loop slept: no more polling until it finds work again (a wake-up for a timer
    /// alone does not start a spin).
    pub(crate) fn slept(&mut self) {
        self.work();
        self.spent = true;
    }

    /// After an empty poll at `now`: whether to poll again (false: sleep, then `slept`).
    pub(crate) fn poll_again(&mut self, now: Instant) -> bool {
        self.poll_again_with(now, involuntary_switches)
    }

    /// `poll_again` with the thread's involuntary context-switch count read by `switches`
    /// (read when a spin starts and after a long gap only).
    fn poll_again_with(&mut self, now: Instant, switches: impl Fn() -> u64) -> bool {
        let Some(budget) = self.budget else {
            return true;
        };
        if budget.is_zero() || self.spent || self.off_until.is_some_and(|t| now < t) {
            return false;
        }
        let Some(since) = self.idle_since else {
            self.idle_since = Some(now);
            self.last = Some(now);
            self.switches = switches();
            return true;
        };
        // A long gap since the previous empty poll: preempted, or a slow pass (one over
        // many sessions takes ~1 ms); the kernel's count of involuntary switches tells.
        if self
            .last
            .is_some_and(|prev| now.saturating_duration_since(prev) > PREEMPTED)
            && switches() != self.switches
        {
            self.preemptions += 1;
            self.off_until = Some(now + BACKOFF);
            self.work();
            return false;
        }
        if now.saturating_duration_since(since) < budget {
            self.last = Some(now);
            true
        } else {
            self.work();
            false
        }
    }

    /// How often polling was given up because the thread was preempted, since the last
    /// call (for the owner's counter).
    pub(crate) fn take_preemptions(&mut self) -> u64 {
        std::mem::take(&mut self.preemptions)
    }
}

/// The calling thread's involuntary context switches (times it was descheduled while it
/// could run).
fn involuntary_switches() -> u64 {
    // SAFETY: all-zero bytes are a valid rusage, which getrusage fills.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_THREAD on the calling thread into a valid rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) } != 0 {
        return 0;
    }
    ru.ru_nivcsw as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// No involuntary switch, ever.
    fn never() -> u64 {
        0
    }

    #[test]
    fn polls_for_its_budget_then_sleeps() {
        let t0 = Instant::now();
        let mut s = Spinner::new(Some(us(50)));
        let polls: Vec<bool> = (0..8)
            .map(|i| s.poll_again_with(t0 + us(10 * i), never))
            .collect();
        // 0, 10, ..., 40 us into the idle time: poll; 50: sleep.
        assert_eq!(&polls[..6], &[true, true, true, true, true, false]);
        // A wake-up with nothing to do sleeps again; work starts a new spin.
        s.slept();
        assert!(!s.poll_again_with(t0 + us(1000), never));
        s.work();
        assert!(s.poll_again_with(t0 + us(1001), never));
        assert_eq!(s.take_preemptions(), 0);
    }

    #[test]
    fn zero_never_polls_and_none_always_does() {
        let t0 = Instant::now();
        let mut zero = Spinner::new(Some(Duration::ZERO));
        let mut always = Spinner::new(None);
        let n = std::cell::Cell::new(0u64);
        let switching = || {
            n.set(n.get() + 1);
            n.get()
        };
        for i in 0..4 {
            // Gaps far beyond PREEMPTED with a switch each time: busy polling was asked
            // for, it does not back off.
            let now = t0 + Duration::from_millis(10 * i);
            assert!(!zero.poll_again_with(now, switching));
            assert!(always.poll_again_with(now, switching));
        }
        assert_eq!(always.take_preemptions(), 0);
    }

    #[test]
    fn a_preempted_spinner_sleeps_at_once_for_the_backoff() {
        let t0 = Instant::now();
        let mut s = Spinner::new(Some(us(1000)));
        assert!(s.poll_again_with(t0, || 7));
        assert!(s.poll_again_with(t0 + us(5), || 7));
        // The next empty poll comes 2 ms later and the kernel switched the thread out.
        assert!(!s.poll_again_with(t0 + us(2005), || 8));
        assert_eq!(s.take_preemptions(), 1);
        // Within the backoff every empty poll sleeps, even right after work.
        s.work();
        assert!(!s.poll_again_with(t0 + us(3000), || 8));
        assert!(!s.poll_again_with(t0 + us(2005) + BACKOFF - us(1), || 8));
        // After it, polling resumes.
        assert!(s.poll_again_with(t0 + us(2005) + BACKOFF, || 8));
        assert!(s.poll_again_with(t0 + us(2010) + BACKOFF, || 8));
        assert_eq!(s.take_preemptions(), 0);
    }

    #[test]
    fn a_slow_pass_is_not_preemption() {
        let t0 = Instant::now();
        let mut s = Spinner::new(Some(us(5000)));
        assert!(s.poll_again_with(t0, || 3));
        // Passes of 1 ms (many sessions), no involuntary switch: polling goes on to the
        // budget.
        for i in 1..5 {
            assert!(s.poll_again_with(t0 + us(1000 * i), || 3));
        }
        assert!(!s.poll_again_with(t0 + us(5000), || 3));
        assert_eq!(s.take_preemptions(), 0);
    }

    #[test]
    fn a_gap_across_work_or_sleep_is_not_preemption() {
        let t0 = Instant::now();
        let mut s = Spinner::new(Some(us(100)));
        assert!(s.poll_again_with(t0, || 1));
        // Work took 5 ms (callbacks, during which the thread was switched out), then the
        // loop polls empty again: a new spin, with a new baseline.
        s.work();
        assert!(s.poll_again_with(t0 + us(5000), || 2));
        assert!(s.poll_again_with(t0 + us(5010), || 2));
        assert_eq!(s.take_preemptions(), 0);
    }
}
