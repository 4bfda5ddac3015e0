//! Async events: `struct ib_uverbs_async_event_desc { u64 element; u32 event_type; u32
//! reserved; }` records (16 bytes, native endian) written to a pipe whose read end is the
//! context's `async_fd`; libibverbs' `ibv_get_async_event` reads exactly that and turns
//! `element` back into the `struct ibv_qp *`/`ibv_cq *`/`ibv_srq *` (the object's handle).

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};

use super::sys::RecordPipe;
use rdmx::error::Result;

/// `enum ibv_event_type` values (verbs.h).
pub mod event_type {
    pub const CQ_ERR: u32 = 0;
    pub const QP_FATAL: u32 = 1;
    pub const QP_REQ_ERR: u32 = 2;
    pub const QP_ACCESS_ERR: u32 = 3;
    pub const COMM_EST: u32 = 4;
    pub const SQ_DRAINED: u32 = 5;
    pub const DEVICE_FATAL: u32 = 8;
    pub const PORT_ACTIVE: u32 = 9;
    pub const PORT_ERR: u32 = 10;
    pub const SRQ_ERR: u32 = 14;
    pub const SRQ_LIMIT_REACHED: u32 = 15;
    pub const QP_LAST_WQE_REACHED: u32 = 16;
}

/// Size of one `struct ib_uverbs_async_event_desc`.
pub const ASYNC_EVENT_LEN: usize = 16;

/// Encodes one `struct ib_uverbs_async_event_desc`.
pub fn encode(element: u64, event_type: u32) -> [u8; ASYNC_EVENT_LEN] {
    let mut b = [0u8; ASYNC_EVENT_LEN];
    b[..8].copy_from_slice(&element.to_ne_bytes());
    b[8..12].copy_from_slice(&event_type.to_ne_bytes());
    b
}

/// The device's async event queue (a pipe). Bounded: when the application does not read
/// and the pipe fills, further events are counted and logged (first one, then every
/// 1024th), never blocking the engine thread that raises them.
#[derive(Debug)]
pub struct AsyncEvents {
    pipe: RecordPipe,
    raised: AtomicU64,
    dropped: AtomicU64,
}

impl AsyncEvents {
    pub(crate) fn new() -> Result<AsyncEvents> {
        Ok(AsyncEvents {
            pipe: RecordPipe::new()?,
            raised: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        })
    }

    /// The read end (`ibv_context.async_fd`).
    pub fn fd(&self) -> RawFd {
        self.pipe.read_fd()
    }

    /// Queues event `event_type` about the object with `handle`; false if it was dropped.
    pub fn raise(&self, handle: u64, event_type: u32) -> bool {
        if self.pipe.write_record(&encode(handle, event_type)) {
            self.raised.fetch_add(1, Ordering::Relaxed);
            log::debug!(target: "rdmx::ibv", "async event {event_type} on {handle:#x}");
            return true;
        }
        let n = self.dropped.fetch_add(1, Ordering::Relaxed);
        if n % 1024 == 0 {
            log::warn!(
                target: "rdmx::ibv",
                "async event {event_type} on {handle:#x} dropped: the application does not read its async fd (pipe full; {} dropped so far)",
                n + 1
            );
        }
        false
    }

    /// Events queued so far.
    pub fn raised(&self) -> u64 {
        self.raised.load(Ordering::Relaxed)
    }

    /// Events lost because the pipe was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// The event records written about one object (a QP, an SRQ, or a CQ's completion
/// channel records), stopped at its destroy.
///
/// libibverbs turns each record back into the object's pointer for the application, which
/// acknowledges it later (`ibv_ack_async_event`, `ibv_ack_cq_events` count into the
/// object's own `events_completed`). A kernel makes destroy wait for those acks and purges
/// unread records; a pipe cannot be purged, so the glue keeps the object's memory until the
/// acks reach [`EventTally::written`] (see `glue::objects`). `close` and `emit` share a lock,
/// so no record is written after `close` returns.
#[derive(Debug, Default)]
pub struct EventTally {
    /// (closed, records written).
    state: parking_lot::Mutex<(bool, u64)>,
}

impl EventTally {
    /// Runs `write` (which returns whether a record went out) unless closed; counts it.
    pub fn emit(&self, write: impl FnOnce() -> bool) {
        let mut s = self.state.lock();
        if !s.0 && write() {
            s.1 += 1;
        }
    }

    /// Stops further records; returns how many were written.
    pub fn close(&self) -> u64 {
        let mut s = self.state.lock();
        s.0 = true;
        s.1
    }

    /// Records written so far.
    pub fn written(&self) -> u64 {
        self.state.lock().1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tally_counts_written_records_and_stops_at_close() {
        let t = EventTally::default();
        t.emit(|| true);
        t.emit(|| false); // pipe full: not counted
        t.emit(|| true);
        assert_eq!(t.written(), 2);
        assert_eq!(t.close(), 2);
        let mut ran = false;
        t.emit(|| {
            ran = true;
            true
        });
        assert!(!ran, "no record after close");
        assert_eq!(t.written(), 2);
    }
}
