//! What the device counts and reports: how well it kept listening (stalls left out of the
//! engine clock, panics caught in the progress thread, takeovers of receiving) and the
//! datagrams its ports dropped before a QP saw them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::super::diagnose::StallLog;
use super::{PortCounters, ProgressStats, SoftDevice};

/// How well the device kept listening (see [`ProgressStats`]).
#[derive(Default)]
pub(super) struct StatCounters {
    pub(super) stalls: AtomicU64,
    /// Panics caught in the progress thread (see `progress_thread`).
    pub(super) progress_panics: AtomicU64,
    /// Times the progress thread learned that the application waits without polling and
    /// took over receiving (`thread_rx`; an arming is not counted).
    pub(super) takeovers: AtomicU64,
    pub(super) max_stall_ns: AtomicU64,
    pub(super) timers_deferred: AtomicU64,
    /// The latest stalls, for failure reports (shared with the QPs).
    pub(super) log: Arc<StallLog>,
    /// Datagrams dropped before a QP's engine saw them.
    pub(super) port: PortCells,
}

/// The counters behind [`PortCounters`] (relaxed: bumped per dropped datagram by the
/// receiving thread, read whenever asked).
#[derive(Default)]
pub(super) struct PortCells {
    pub(super) unknown_qpn: AtomicU64,
    pub(super) wrong_source: AtomicU64,
    pub(super) bad_icrc: AtomicU64,
    pub(super) malformed: AtomicU64,
}

impl SoftDevice {
    /// How well the device kept listening (stalls left out of the engine clock).
    pub fn progress_stats(&self) -> ProgressStats {
        let s = &self.shared;
        ProgressStats {
            stalls: s.stats.stalls.load(Ordering::Relaxed),
            stalled_ns: s.stalled_ns.load(Ordering::Relaxed),
            max_stall_ns: s.stats.max_stall_ns.load(Ordering::Relaxed),
            timers_deferred: s.stats.timers_deferred.load(Ordering::Relaxed),
            progress_panics: s.stats.progress_panics.load(Ordering::Relaxed),
        }
    }

    /// Datagrams dropped on the device's UDP ports before reaching a QP (all families).
    pub fn port_counters(&self) -> PortCounters {
        let c = &self.shared.stats.port;
        let (truncated, kernel_drops) = self.shared.ports.iter().fold((0, 0), |(t, k), p| {
            (t + p.sock.truncated_drops(), k + p.sock.kernel_drops())
        });
        PortCounters {
            unknown_qpn: c.unknown_qpn.load(Ordering::Relaxed),
            wrong_source: c.wrong_source.load(Ordering::Relaxed),
            bad_icrc: c.bad_icrc.load(Ordering::Relaxed),
            malformed: c.malformed.load(Ordering::Relaxed),
            truncated,
            kernel_drops,
            async_events: 0,
        }
    }

    /// Kernel receive-queue drops on the device's UDP port (SO_RXQ_OVFL).
    pub fn kernel_drops(&self) -> u64 {
        self.shared
            .ports
            .iter()
            .map(|p| p.sock.kernel_drops())
            .sum()
    }

    /// Whether the progress thread has learned that the application waits without
    /// polling (and so receives for it): a look for tests and diagnostics.
    pub fn thread_receives(&self) -> bool {
        self.shared.thread_rx.load(Ordering::Relaxed)
    }

    /// How many times the progress thread learned from the traffic that the application
    /// waits without polling (an RDMA WRITE or READ left queued at two looks in a row) and
    /// took over receiving; armings are not counted. A look for tests and diagnostics: a
    /// polling program should never see it move.
    pub fn thread_takeovers(&self) -> u64 {
        self.shared.stats.takeovers.load(Ordering::Relaxed)
    }

    /// Of a verbs program's (progress=inline, not app-driven) received packets that
    /// complete nothing here (RDMA WRITEs, READ and atomic requests): (those its own polls
    /// landed, those the progress thread landed). See `device/answers.rs`; a look for tests
    /// and diagnostics.
    pub fn writes_landed(&self) -> (u64, u64) {
        self.shared.answers.counts()
    }
}
