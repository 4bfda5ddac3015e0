//! Spinning on an empty CQ yields the core (`poll_yield_after`).
//!
//! On a NIC, an empty `ibv_poll_cq` reads a cache line: a program may spin on it for as
//! long as it likes. On the soft device the "NIC" is the host's CPU: every receive, ACK and
//! retransmission of this process and of its peers on the same host needs a core, and a
//! thread that spins on an empty CQ holds one. Ceph's RDMA dispatcher spins 1 ms after
//! every completion (`ms_async_rdma_polling_us`), so under load it never stops: on 2 cores
//! its polling thread took 58% of an OSD's CPU while the OSD's op threads waited
//! (docs/ceph-harness.md, run 4). After `poll_yield_after` empty polls in a row, each
//! further empty poll of the thread calls `sched_yield`: a spinner still sees a completion
//! at its next poll, and a runnable thread on its core runs first. A thread that finds
//! completions never yields; on an idle core `sched_yield` returns at once.

use std::cell::Cell;

/// What a thread's polls have found: the empty polls in a row, and the yields so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Spinner {
    empty_in_row: u32,
    yields: u64,
}

impl Spinner {
    /// After a poll that found `found` completions: whether the thread yields now
    /// (`yield_after` 0: never).
    pub fn after_poll(&mut self, found: usize, yield_after: u32) -> bool {
        if found > 0 {
            self.empty_in_row = 0;
            return false;
        }
        self.empty_in_row = self.empty_in_row.saturating_add(1);
        let now = yield_after > 0 && self.empty_in_row > yield_after;
        if now {
            self.yields += 1;
        }
        now
    }

    pub fn yields(&self) -> u64 {
        self.yields
    }
}

thread_local! {
    static SPINNER: Cell<Spinner> = const { Cell::new(Spinner { empty_in_row: 0, yields: 0 }) };
}

/// Called by `Cq::poll` with what it found: yields the core when the thread has spun.
#[inline]
pub(crate) fn after_poll(found: usize, yield_after: u32) {
    if yield_after == 0 {
        return;
    }
    let now = SPINNER.with(|c| {
        let mut s = c.get();
        let now = s.after_poll(found, yield_after);
        c.set(s);
        now
    });
    if now {
        // SAFETY: sched_yield has no preconditions.
        unsafe { libc::sched_yield() };
    }
}

/// The yields of the calling thread's polls so far.
pub fn yields_on_this_thread() -> u64 {
    SPINNER.with(|c| c.get().yields())
}

#[cfg(test)]
mod tests {
    use super::Spinner;

    #[test]
    fn yields_only_after_the_threshold_of_empty_polls_in_a_row() {
        let mut s = Spinner::default();
        let got: Vec<bool> = [0, 0, 0, 0, 0]
            .iter()
            .map(|&n| s.after_poll(n, 3))
            .collect();
        assert_eq!(got, [false, false, false, true, true]);
        // a completion starts the count again
        assert!(!s.after_poll(2, 3));
        assert!(!s.after_poll(0, 3));
        assert_eq!(s.yields(), 2);
    }

    #[test]
    fn zero_never_yields() {
        let mut s = Spinner::default();
        assert!((0..1000).all(|_| !s.after_poll(0, 0)));
        assert_eq!(s.yields(), 0);
    }
}
