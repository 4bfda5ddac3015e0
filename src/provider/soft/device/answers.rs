//! Verbs programs that answer RDMA WRITEs with RDMA WRITEs and spin on memory between them
//! (`ib_write_lat`): each side's own poll lands the peer's WRITE, with no progress thread
//! woken for it (docs/ibv-device.md, "Applications that land each other's WRITEs").
//!
//! A spinner posts its WRITE and polls its send CQ for the completion, i.e. for the peer's
//! ACK; the peer's WRITE follows right after it. If the peer holds that ACK back until it
//! posts its answer, ACK and WRITE leave in one `sendmmsg`, WRITE first (the engine sends
//! requests before positive ACKs), so the poll that returns the completion has landed the
//! WRITE, and the spinner finds its memory written when it starts spinning. So:
//! - an application pass of a program that lands WRITEs (or was found spinning) holds its
//!   positive ACKs for its answer, as the messenger's passes do (`ACK_HOLD_NS` at most);
//! - a poll that returns completions without a WRITE landed since the last one (the
//!   chain broke: an ACK came alone) hands receiving to the progress thread at once,
//!   waking it if it sleeps without the sockets; one that did land a WRITE takes receiving
//!   back. Only for a program the learner found spinning (`learner.rs`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// What the device knows of a verbs program's WRITE answers (owned by `Shared`).
#[derive(Debug, Default)]
pub(super) struct Answers {
    /// An application pass landed an RDMA WRITE (or READ or atomic request): the program
    /// is the target of one-sided operations it may answer.
    write_target: AtomicBool,
    /// The learner found the program spinning on memory (its take-over; cleared by its
    /// give-back).
    spinner: AtomicBool,
    /// An application pass landed such a packet since the last poll that returned
    /// completions.
    landed: AtomicBool,
    /// Packets that complete nothing here (WRITEs, READ and atomic requests) landed by the
    /// application's passes and by the progress thread's (relaxed counters, for
    /// diagnostics).
    by_app: AtomicU64,
    by_thread: AtomicU64,
}

/// What a poll that returned completions means for who receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterPoll {
    /// Nothing changes (not a spinner).
    Keep,
    /// The peer's WRITE came with the ACK: the application receives.
    App,
    /// The ACK came alone: the thread receives until the chain holds again.
    Thread,
}

impl Answers {
    /// Whether an application pass holds positive ACKs back for the answer.
    #[inline]
    pub fn app_holds(&self) -> bool {
        self.write_target.load(Ordering::Relaxed) || self.spinner.load(Ordering::Relaxed)
    }

    pub fn spinner(&self) -> bool {
        self.spinner.load(Ordering::Relaxed)
    }

    pub fn set_spinner(&self, on: bool) {
        self.spinner.store(on, Ordering::Relaxed);
    }

    /// An application pass landed `silent` packets that complete nothing here.
    #[inline]
    pub fn app_landed(&self, silent: usize) {
        if silent == 0 {
            return;
        }
        if !self.write_target.load(Ordering::Relaxed) {
            self.write_target.store(true, Ordering::Relaxed);
        }
        self.landed.store(true, Ordering::Relaxed);
        self.by_app.fetch_add(silent as u64, Ordering::Relaxed);
    }

    /// A pass of the progress thread landed `silent` such packets.
    #[inline]
    pub fn thread_landed(&self, silent: usize) {
        if silent > 0 {
            self.by_thread.fetch_add(silent as u64, Ordering::Relaxed);
        }
    }

    /// A poll returned completions.
    pub fn after_completions(&self) -> AfterPoll {
        if !self.spinner() {
            return AfterPoll::Keep;
        }
        if self.landed.swap(false, Ordering::Relaxed) {
            AfterPoll::App
        } else {
            AfterPoll::Thread
        }
    }

    /// (packets landed by application passes, by the progress thread).
    pub fn counts(&self) -> (u64, u64) {
        (
            self.by_app.load(Ordering::Relaxed),
            self.by_thread.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spinner_keeps_receiving_while_writes_come_with_the_acks() {
        let a = Answers::default();
        // A program that never landed a WRITE holds nothing and is no spinner.
        assert!(!a.app_holds());
        assert_eq!(a.after_completions(), AfterPoll::Keep);
        // A pass that landed only packets it polls for changes nothing.
        a.app_landed(0);
        assert!(!a.app_holds());
        // It lands a WRITE: it holds its ACKs for the answer, but is no spinner yet.
        a.app_landed(1);
        assert!(a.app_holds());
        assert_eq!(a.after_completions(), AfterPoll::Keep);
        // Found spinning: each poll that returns completions with a WRITE landed since the
        // last such poll keeps receiving in the application; one without hands it over.
        a.set_spinner(true);
        a.app_landed(1);
        assert_eq!(a.after_completions(), AfterPoll::App);
        assert_eq!(a.after_completions(), AfterPoll::Thread);
        a.app_landed(2);
        a.app_landed(1);
        assert_eq!(a.after_completions(), AfterPoll::App);
        // The learner gives back: no longer a spinner; it still holds (a WRITE target).
        a.set_spinner(false);
        assert_eq!(a.after_completions(), AfterPoll::Keep);
        assert!(a.app_holds());
        a.thread_landed(0);
        a.thread_landed(2);
        assert_eq!(a.counts(), (5, 2));
    }
}
