//! The application's dispatcher, called so that a panic in one of its callbacks cannot
//! kill the thread that called it; and the shard workers' loops, kept running through a
//! panic of the messenger's own code.
//!
//! Callbacks run on the shard workers (or the caller of `poll`). Unwinding out of one would
//! end a worker silently: its sessions would never progress again, with no error anywhere.
//! Each callback runs under `catch_unwind`; a panic is counted
//! ([`MsgrStats::dispatcher_panics`](super::MsgrStats::dispatcher_panics)), logged at error
//! level, and its session is ended (the caller resets it: the peer sees it closed, this
//! side gets `on_reset`), since the application lost whatever the callback was handling.
//!
//! A panic outside the callbacks, in a worker's pass (a bug of the messenger), would end the
//! worker just as silently. [`GuardedDispatcher::keep_running`] catches it, counts it
//! ([`MsgrStats::worker_panics`](super::MsgrStats::worker_panics)), logs it at error level,
//! ends every session of the worker's shard (what the pass was doing to them cannot be
//! trusted; each gets `on_reset`, a lossless one reconnects), and runs the loop again.

use super::types::{Dispatcher, SessionId};
use crate::error::{Error, ErrorKind};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Pause before a worker's loop runs again after a panic: a panic that recurs at once
/// (state the faulting did not clear) costs a log line per pause, not a spinning core.
const RESTART_PAUSE: Duration = Duration::from_millis(10);

pub(super) struct GuardedDispatcher {
    inner: Arc<dyn Dispatcher>,
    panics: AtomicU64,
    worker_panics: AtomicU64,
}

impl GuardedDispatcher {
    pub(super) fn new(inner: Arc<dyn Dispatcher>) -> GuardedDispatcher {
        GuardedDispatcher {
            inner,
            panics: AtomicU64::new(0),
            worker_panics: AtomicU64::new(0),
        }
    }

    /// Worker loops that panicked so far (outside the callbacks).
    pub(super) fn worker_panics(&self) -> u64 {
        self.worker_panics.load(Ordering::Relaxed)
    }

    /// Runs worker `i`'s loop `run` until it returns. A panic in it is caught, counted,
    /// logged, `fault` is called with the error to end the shard's sessions with, and
    /// `run` starts again after [`RESTART_PAUSE`].
    pub(super) fn keep_running(
        &self,
        i: usize,
        mut run: impl FnMut(),
        mut fault: impl FnMut(&Error),
    ) {
        loop {
            // AssertUnwindSafe: what the loop holds across the panic is the shard's state,
            // whose sessions `fault` ends; the mutexes (parking_lot) do not poison.
            let Err(payload) = catch_unwind(AssertUnwindSafe(&mut run)) else {
                return;
            };
            self.worker_panics.fetch_add(1, Ordering::Relaxed);
            let why = crate::logging::panic_message(payload.as_ref());
            log::error!(
                target: "rdmx::msgr",
                "messenger worker {i} panicked: {why}; ending its shard's sessions and going on"
            );
            fault(&Error::new(
                ErrorKind::Closed,
                format!("messenger worker {i} panicked: {why}"),
            ));
            std::thread::sleep(RESTART_PAUSE);
        }
    }

    /// Callbacks that panicked so far.
    pub(super) fn panics(&self) -> u64 {
        self.panics.load(Ordering::Relaxed)
    }

    /// Runs `f` (the callback `what` for session `s`) on the dispatcher. If it panics:
    /// counted, logged, and the session with the error to end it with is returned.
    pub(super) fn call(
        &self,
        s: SessionId,
        what: &str,
        f: impl FnOnce(&dyn Dispatcher),
    ) -> Option<(SessionId, Error)> {
        // AssertUnwindSafe: after a panic nothing the callback touched is used again by
        // the messenger but the session, which is ended.
        let payload = catch_unwind(AssertUnwindSafe(|| f(&*self.inner))).err()?;
        self.panics.fetch_add(1, Ordering::Relaxed);
        let why = crate::logging::panic_message(payload.as_ref());
        log::error!(
            target: "rdmx::msgr",
            "session {:#x}: the dispatcher's {what} panicked: {why}; ending the session",
            s.0
        );
        let e = Error::new(
            ErrorKind::Closed,
            format!("the dispatcher's {what} panicked: {why}"),
        );
        Some((s, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msgr::messenger::{InMessage, Messenger};

    struct Quiet;
    impl Dispatcher for Quiet {
        fn on_message(&self, _m: &Messenger, _s: SessionId, _msg: InMessage) {}
    }

    #[test]
    fn a_worker_loop_that_panics_is_counted_faulted_and_run_again() {
        let g = GuardedDispatcher::new(Arc::new(Quiet));
        let mut runs = 0;
        let mut faults = Vec::new();
        g.keep_running(
            3,
            || {
                runs += 1;
                if runs <= 2 {
                    panic!("a pass goes wrong on purpose ({runs})");
                }
            },
            |e| faults.push(e.clone()),
        );
        assert_eq!(runs, 3, "run again after each panic, until it returns");
        assert_eq!(g.worker_panics(), 2);
        assert_eq!(g.panics(), 0, "not a dispatcher panic");
        assert_eq!(faults.len(), 2);
        assert_eq!(faults[0].kind(), ErrorKind::Closed);
        assert!(
            faults[1]
                .message()
                .contains("worker 3 panicked: a pass goes wrong on purpose (2)"),
            "{}",
            faults[1]
        );
    }

    #[test]
    fn a_worker_loop_that_returns_is_not_counted() {
        let g = GuardedDispatcher::new(Arc::new(Quiet));
        let mut faulted = false;
        g.keep_running(0, || {}, |_| faulted = true);
        assert!(!faulted);
        assert_eq!(g.worker_panics(), 0);
    }
}
