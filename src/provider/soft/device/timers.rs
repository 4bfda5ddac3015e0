//! The device's timers: every QP publishes its engine's earliest deadline in a
//! [`TimerCell`] (no lock to read it), and the device keeps a min-heap of them
//! ([`DeviceTimers`]) so a progress pass pops only the QPs that are due and the progress
//! thread sleeps until the earliest one.

use parking_lot::Mutex;
use smallvec::SmallVec;
use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::super::sys::EventFd;
use crate::error::Result;

/// Most stale heap entries one pass repairs at the top (see [`DeviceTimers::settle`]).
const SETTLE_MAX: usize = 64;

/// Timer heap entries reserved when a device opens (16 bytes each). Entries are live QP
/// deadlines plus stale ones waiting to be popped (lazy deletion), a few per busy QP.
const TIMER_HEAP_RESERVE: usize = 1024;

/// One QP's timer as the device sees it: the engine's earliest deadline, published by the
/// QP whenever its engine is touched, so reading it needs no lock, and where the QP stands
/// in the device's timer heap. Shared by the QP and its heap entries (which never keep the
/// QP itself alive).
#[derive(Debug)]
pub(crate) struct TimerCell {
    pub(super) qpn: u32,
    /// The engine's earliest deadline (device clock ns; u64::MAX: none). Written under the
    /// QP's lock, so in order.
    deadline: AtomicU64,
    /// The earliest entry of this QP in the heap (u64::MAX: none), written under the heap
    /// lock. `queued <= deadline` whenever the QP has a deadline, except for a QP a pass
    /// took from the heap and is about to drive (which publishes again).
    queued: AtomicU64,
}

impl TimerCell {
    pub fn new(qpn: u32) -> TimerCell {
        TimerCell {
            qpn,
            deadline: AtomicU64::new(u64::MAX),
            queued: AtomicU64::new(u64::MAX),
        }
    }

    /// The published deadline.
    pub fn deadline(&self) -> Option<u64> {
        let d = self.deadline.load(Ordering::Acquire);
        (d != u64::MAX).then_some(d)
    }

    /// Publishes the engine's deadline `d` (called under the QP's lock after anything
    /// touched its engine). The device's heap is told only when `d` comes before the QP's
    /// entry there: a deadline that moves later (every ACK) costs an atomic store; the
    /// heap learns it when the old entry comes due. `timers`: None for a QP outside a
    /// device (unit tests).
    #[inline]
    pub fn publish(self: &Arc<Self>, d: Option<u64>, timers: Option<&Arc<DeviceTimers>>) {
        let d = d.unwrap_or(u64::MAX);
        // SeqCst store then load here, SeqCst store of `queued` then load of `deadline` in
        // `take_due`: one of the two sides sees the other's write, so a deadline is never
        // left without an entry at or before it.
        if self.deadline.load(Ordering::Relaxed) != d {
            self.deadline.store(d, Ordering::SeqCst);
        }
        if d < self.queued.load(Ordering::SeqCst)
            && let Some(t) = timers
        {
            t.arm(self, d);
        }
    }
}

/// A heap entry: `cell`'s QP had a deadline at `at` when it was pushed (it may have moved
/// later since: checked when the entry comes to the top).
struct Entry {
    at: u64,
    cell: Arc<TimerCell>,
}

impl PartialEq for Entry {
    fn eq(&self, o: &Entry) -> bool {
        self.cmp(o) == CmpOrdering::Equal
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Entry) -> Option<CmpOrdering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    /// Reversed: `BinaryHeap` is a max-heap, the earliest deadline must be on top.
    fn cmp(&self, o: &Entry) -> CmpOrdering {
        (o.at, o.cell.qpn).cmp(&(self.at, self.cell.qpn))
    }
}

/// The device's timers: a min-heap of (deadline, QP) with lazy deletion, fed by QPs whose
/// deadline came earlier than their entry, so a progress pass pops only due entries and the
/// progress thread sleeps until the heap's minimum. Idle QPs cost a pass nothing.
pub(crate) struct DeviceTimers {
    heap: Mutex<BinaryHeap<Entry>>,
    /// The heap's minimum (u64::MAX: empty), written under the heap lock: the earliest
    /// armed timer, when a pass is due (stall accounting). It may be early (a QP's deadline
    /// moved later since its entry was pushed), never late; a pass that drove QPs repairs
    /// it ([`DeviceTimers::settle`]).
    min: AtomicU64,
    /// When the progress thread will wake next (ns on the device clock).
    pub(super) planned_wake: AtomicU64,
    /// Wakes the progress thread.
    pub(super) wake: EventFd,
}

impl std::fmt::Debug for DeviceTimers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceTimers")
            .field("entries", &self.heap.lock().len())
            .field("min", &self.min.load(Ordering::Relaxed))
            .finish()
    }
}

impl DeviceTimers {
    pub(super) fn new() -> Result<DeviceTimers> {
        Ok(DeviceTimers {
            // Room for the entries of a busy device up front: `arm` runs on the posting
            // thread, and a heap that grows there allocates on the data path (seen once in
            // alloc_free under load 14: a refused post pushed the heap past 32 entries).
            heap: Mutex::new(BinaryHeap::with_capacity(TIMER_HEAP_RESERVE)),
            min: AtomicU64::new(u64::MAX),
            planned_wake: AtomicU64::new(0),
            wake: EventFd::new()?,
        })
    }

    /// The earliest armed timer (u64::MAX: none); possibly early, never late.
    pub(super) fn min(&self) -> u64 {
        self.min.load(Ordering::Acquire)
    }

    fn store_min(&self, heap: &BinaryHeap<Entry>) {
        let m = heap.peek().map_or(u64::MAX, |e| e.at);
        self.min.store(m, Ordering::Release);
    }

    /// `cell`'s QP has a deadline at `d`, earlier than its entry: pushes one, and wakes the
    /// progress thread if it planned to sleep past `d` (timers fire whether or not the
    /// application polls).
    #[cold]
    fn arm(&self, cell: &Arc<TimerCell>, d: u64) {
        {
            let mut heap = self.heap.lock();
            if d >= cell.queued.load(Ordering::SeqCst) {
                return; // another thread pushed it meanwhile
            }
            cell.queued.store(d, Ordering::SeqCst);
            heap.push(Entry {
                at: d,
                cell: Arc::clone(cell),
            });
            if d < self.min.load(Ordering::Relaxed) {
                self.min.store(d, Ordering::Release);
            }
        }
        self.wake_by(d);
    }

    /// Wakes the progress thread if it planned to sleep past `d`.
    pub(super) fn wake_by(&self, d: u64) {
        if d < self.planned_wake.load(Ordering::Acquire) {
            self.planned_wake.store(d, Ordering::Release);
            self.wake.signal();
        }
    }

    /// Pops the entries due at `now`: a QP whose deadline is due goes to `due` (and leaves
    /// the heap: driving it publishes its next deadline); one whose deadline moved later
    /// is pushed again at it; stale entries are dropped. Nothing is locked when nothing is
    /// due.
    pub(super) fn take_due(&self, now: u64, due: &mut SmallVec<[Arc<TimerCell>; 4]>) {
        if self.min() > now {
            return;
        }
        let mut heap = self.heap.lock();
        while heap.peek().is_some_and(|e| e.at <= now) {
            let Some(e) = heap.pop() else { break };
            let cell = e.cell;
            if cell.queued.load(Ordering::SeqCst) != e.at {
                continue; // a duplicate: the QP's entry is another one
            }
            cell.queued.store(u64::MAX, Ordering::SeqCst);
            let d = cell.deadline.load(Ordering::SeqCst);
            if d <= now {
                due.push(cell);
            } else if d != u64::MAX {
                cell.queued.store(d, Ordering::SeqCst);
                heap.push(Entry { at: d, cell });
            }
        }
        self.store_min(&heap);
    }

    /// Makes the heap's top exact (its QP's deadline is the entry's), so `min` is the
    /// earliest deadline of any QP: entries whose QP's deadline moved later are pushed
    /// again at it, duplicates dropped (at most [`SETTLE_MAX`]). Run by a pass that drove
    /// QPs (their deadlines moved). Returns the minimum.
    pub(super) fn settle(&self) -> u64 {
        let mut heap = self.heap.lock();
        for _ in 0..SETTLE_MAX {
            let Some(top) = heap.peek() else { break };
            let cell = &top.cell;
            let at = top.at;
            if cell.queued.load(Ordering::SeqCst) != at {
                heap.pop();
                continue;
            }
            let d = cell.deadline.load(Ordering::SeqCst);
            if d == at {
                break;
            }
            // The deadline moved (later, or earlier by a QP that is about to push it).
            let Some(e) = heap.pop() else { break };
            e.cell.queued.store(d, Ordering::SeqCst);
            if d != u64::MAX {
                heap.push(Entry {
                    at: d,
                    cell: e.cell,
                });
            }
        }
        self.store_min(&heap);
        self.min()
    }

    /// Entries in the heap (QPs with a deadline, plus stale entries not yet dropped).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.heap.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timer_heap_pops_only_due_qps_and_follows_moved_deadlines() {
        let t = Arc::new(DeviceTimers::new().unwrap());
        let cells: Vec<Arc<TimerCell>> = (0..1000).map(|q| Arc::new(TimerCell::new(q))).collect();
        // 998 idle QPs (no deadline) cost nothing: not in the heap.
        for c in &cells {
            c.publish(None, Some(&t));
        }
        assert_eq!((t.len(), t.min()), (0, u64::MAX));
        let (a, b) = (&cells[7], &cells[500]);
        a.publish(Some(1_000), Some(&t));
        b.publish(Some(5_000), Some(&t));
        assert_eq!((t.len(), t.min()), (2, 1_000));
        let mut due = SmallVec::new();
        t.take_due(999, &mut due);
        assert!(due.is_empty());
        // `a`'s deadline moves later (an ACK): no heap work, the entry is found stale when
        // due and pushed again at the new deadline.
        a.publish(Some(2_000), Some(&t));
        assert_eq!((t.len(), t.min()), (2, 1_000));
        t.take_due(1_500, &mut due);
        assert!(due.is_empty());
        assert_eq!((t.len(), t.min()), (2, 2_000));
        // Earlier again: pushed at once; the later entry is a duplicate, dropped.
        a.publish(Some(1_800), Some(&t));
        assert_eq!((t.len(), t.min()), (3, 1_800));
        t.take_due(2_000, &mut due);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].qpn, 7);
        assert_eq!((t.len(), t.min()), (1, 5_000));
        // Driving the due QP publishes its next deadline (its entry left the heap).
        a.publish(Some(9_000), Some(&t));
        assert_eq!((t.len(), t.min()), (2, 5_000));
        // `b` moved later: settle makes the minimum exact without waiting for it.
        b.publish(Some(20_000), Some(&t));
        assert_eq!(t.settle(), 9_000);
        // A deadline cleared (ACKed, QP in ERR): the entry leaves at settle.
        a.publish(None, Some(&t));
        assert_eq!(t.settle(), 20_000);
        due.clear();
        t.take_due(u64::MAX - 1, &mut due);
        assert_eq!(due.len(), 1);
        assert_eq!((t.len(), t.min()), (0, u64::MAX));
    }
}
