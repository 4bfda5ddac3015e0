//! The application's dispatcher, called so that a panic in one of its callbacks cannot
//! kill the thread that called it.
//!
//! Callbacks run on the shard workers (or the caller of `poll`). Unwinding out of one would
//! end a worker silently: its sessions would never progress again, with no error anywhere.
//! Each callback runs under `catch_unwind`; a panic is counted
//! ([`MsgrStats::dispatcher_panics`](super::MsgrStats::dispatcher_panics)), logged at error
//! level, and its session is ended (the caller resets it: the peer sees it closed, this
//! side gets `on_reset`), since the application lost whatever the callback was handling.

use super::types::{Dispatcher, SessionId};
use crate::error::{Error, ErrorKind};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

pub(super) struct GuardedDispatcher {
    inner: Arc<dyn Dispatcher>,
    panics: AtomicU64,
}

impl GuardedDispatcher {
    pub(super) fn new(inner: Arc<dyn Dispatcher>) -> GuardedDispatcher {
        GuardedDispatcher {
            inner,
            panics: AtomicU64::new(0),
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
