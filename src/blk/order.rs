//! The write-ordering rule of the multipath block client ([`super::paths::BlkPaths`]), as
//! a sans-IO tracker: it sees submissions and completions, never a path.
//!
//! **The rule.** A write that was re-issued on another path (its first path failed before
//! it completed, so it is *in doubt*: it may or may not have landed) must never land after
//! a newer write to an overlapping range that was acknowledged meanwhile; otherwise the
//! acknowledged newer data would be overwritten by older data (lost) and, read back, the
//! older data would reappear (resurrected).
//!
//! **How it is enforced.** At most one write per overlapping byte range is outstanding at
//! any time: a write that overlaps an outstanding write (sent, re-issued, or waiting for a
//! path) is *held* until that write has completed (acknowledged, or failed to the caller
//! after `io_fail_timeout`), and held writes are released in submission order. An in-doubt
//! write stays outstanding through its re-issue, so a newer overlapping write cannot be
//! sent, let alone acknowledged, before the re-issued one completed. The failed path
//! cannot land the old copy later: the client re-issues only after the path's session
//! ended (its QP is in error, so nothing it posted is retransmitted; a lossy session is
//! never replayed), and the target executes a request only when its messenger delivers
//! it on a live session (synchronously, on the messenger's thread). The remaining window
//! is a request the old target had already received and was still executing after the
//! client detected the failure, re-issued, and completed a newer write elsewhere: a disk
//! stalled for longer than the detection time (docs/failover.md).
//!
//! Cost: overlapping writes in flight at once are serialized. Block users do not issue
//! them (the kernel block layer gives them no order either; file systems and fio's verify
//! never do); reads and flushes are never held.

use std::collections::{BTreeMap, VecDeque};

/// Whether a write may be sent now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// No outstanding write overlaps it: send it.
    Go,
    /// It overlaps an outstanding (or an earlier held) write: wait for
    /// [`WriteOrder::complete`] to release it.
    Held,
}

/// Outstanding and held writes by byte range. Outstanding writes never overlap each other
/// (that is the invariant the tracker keeps), so they are kept by start offset.
#[derive(Debug, Default)]
pub struct WriteOrder {
    /// start -> (end, id) of every outstanding write (disjoint ranges).
    out: BTreeMap<u64, (u64, u64)>,
    /// id -> start, to find an outstanding write by id.
    by_id: BTreeMap<u64, u64>,
    /// Held writes in submission order: (id, start, end).
    held: VecDeque<(u64, u64, u64)>,
}

fn overlaps(a0: u64, a1: u64, b0: u64, b1: u64) -> bool {
    a0 < b1 && b0 < a1
}

impl WriteOrder {
    pub fn new() -> WriteOrder {
        WriteOrder::default()
    }

    /// The outstanding write overlapping `[start, end)`, if any.
    fn outstanding_overlap(&self, start: u64, end: u64) -> Option<u64> {
        // Disjoint ranges: only the last one starting before `end` can overlap.
        let (&s, &(e, id)) = self.out.range(..end).next_back()?;
        overlaps(s, e, start, end).then_some(id)
    }

    /// A new write `id` of `len` bytes at `offset` (ids increase with submission order).
    pub fn submit(&mut self, id: u64, offset: u64, len: u64) -> Admit {
        let (start, end) = (offset, offset.saturating_add(len.max(1)));
        let behind_held = self
            .held
            .iter()
            .any(|&(_, s, e)| overlaps(s, e, start, end));
        if behind_held || self.outstanding_overlap(start, end).is_some() {
            self.held.push_back((id, start, end));
            return Admit::Held;
        }
        self.out.insert(start, (end, id));
        self.by_id.insert(id, start);
        Admit::Go
    }

    /// Write `id` completed (acknowledged, or failed to the caller): returns the held
    /// writes that may be sent now, in submission order. An unknown id (a read, or a write
    /// never admitted) releases nothing new.
    pub fn complete(&mut self, id: u64) -> Vec<u64> {
        if let Some(start) = self.by_id.remove(&id) {
            self.out.remove(&start);
        } else if let Some(i) = self.held.iter().position(|h| h.0 == id) {
            // Failed while still held (io_fail_timeout): it never went out.
            self.held.remove(i);
        }
        let mut released = Vec::new();
        let mut still: VecDeque<(u64, u64, u64)> = VecDeque::with_capacity(self.held.len());
        for (hid, s, e) in std::mem::take(&mut self.held) {
            let blocked = still.iter().any(|&(_, s2, e2)| overlaps(s, e, s2, e2))
                || self.outstanding_overlap(s, e).is_some();
            if blocked {
                still.push_back((hid, s, e));
            } else {
                self.out.insert(s, (e, hid));
                self.by_id.insert(hid, s);
                released.push(hid);
            }
        }
        self.held = still;
        released
    }

    /// Writes outstanding (admitted, not completed).
    pub fn outstanding(&self) -> usize {
        self.out.len()
    }

    /// Writes held behind an overlapping one.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: u64 = 4096;

    #[test]
    fn disjoint_writes_all_go() {
        let mut o = WriteOrder::new();
        assert_eq!(o.submit(1, 0, K), Admit::Go);
        assert_eq!(o.submit(2, K, K), Admit::Go);
        assert_eq!(o.submit(3, 3 * K, 2 * K), Admit::Go);
        assert_eq!(o.outstanding(), 3);
        assert_eq!(o.held(), 0);
    }

    /// The failover case: write 1 is in doubt (its path failed) and re-issued; write 2 to
    /// the same block must not go out (and so cannot be acknowledged) until the re-issued
    /// write 1 completed.
    #[test]
    fn a_write_overlapping_an_in_doubt_write_waits_for_its_reissue() {
        let mut o = WriteOrder::new();
        assert_eq!(o.submit(1, 8 * K, K), Admit::Go);
        // Path fails; write 1 stays outstanding while it is re-issued.
        assert_eq!(o.submit(2, 8 * K, K), Admit::Held);
        // A read-like unknown id or an unrelated completion releases nothing.
        assert_eq!(o.complete(99), Vec::<u64>::new());
        assert_eq!(o.held(), 1);
        // The re-issued write 1 completes: write 2 goes.
        assert_eq!(o.complete(1), vec![2]);
        assert_eq!(o.outstanding(), 1);
        assert_eq!(o.complete(2), Vec::<u64>::new());
        assert_eq!(o.outstanding(), 0);
    }

    #[test]
    fn partial_overlaps_count_and_touching_ranges_do_not() {
        let mut o = WriteOrder::new();
        assert_eq!(o.submit(1, 4 * K, 4 * K), Admit::Go); // [16K, 32K)
        assert_eq!(o.submit(2, 6 * K, K), Admit::Held); // inside it
        assert_eq!(o.submit(3, 3 * K, 2 * K), Admit::Held); // overlaps its head
        assert_eq!(o.submit(4, 8 * K, K), Admit::Go); // touches its end only
        assert_eq!(o.submit(5, 2 * K, K), Admit::Go); // touches held 3's start only
        assert_eq!(o.submit(6, 5 * K, K), Admit::Held); // inside 1, touching 2 and 3
        // Write 1 done: 2, 3 and 6 only touch each other and 4, 5: all go, in order.
        assert_eq!(o.complete(1), vec![2, 3, 6]);
        for id in [2, 3, 4, 5, 6] {
            assert_eq!(o.complete(id), Vec::<u64>::new());
        }
        assert_eq!((o.outstanding(), o.held()), (0, 0));
    }

    /// Held writes that overlap each other leave in submission order, one at a time.
    #[test]
    fn held_writes_keep_submission_order() {
        let mut o = WriteOrder::new();
        assert_eq!(o.submit(1, 0, K), Admit::Go);
        assert_eq!(o.submit(2, 0, K), Admit::Held);
        assert_eq!(o.submit(3, 0, 2 * K), Admit::Held);
        // Disjoint from 1 but overlapping held 3: held too (else it would pass 3).
        assert_eq!(o.submit(4, K, K), Admit::Held);
        // Disjoint from everything: goes past the held ones.
        assert_eq!(o.submit(5, 10 * K, K), Admit::Go);
        assert_eq!(o.complete(1), vec![2]);
        assert_eq!(o.complete(2), vec![3]);
        assert_eq!(o.complete(3), vec![4]);
        assert_eq!(o.complete(4), Vec::<u64>::new());
        assert_eq!(o.complete(5), Vec::<u64>::new());
        assert_eq!((o.outstanding(), o.held()), (0, 0));
    }

    /// A held write that fails to the caller (io_fail_timeout) leaves the queue without
    /// releasing anything it did not block.
    #[test]
    fn a_held_write_that_fails_leaves_the_queue() {
        let mut o = WriteOrder::new();
        assert_eq!(o.submit(1, 0, K), Admit::Go);
        assert_eq!(o.submit(2, 0, K), Admit::Held);
        assert_eq!(o.submit(3, 0, K), Admit::Held);
        assert_eq!(o.complete(2), Vec::<u64>::new());
        assert_eq!(o.complete(1), vec![3]);
        assert_eq!(o.complete(3), Vec::<u64>::new());
        assert_eq!((o.outstanding(), o.held()), (0, 0));
    }

    #[test]
    fn a_zero_length_write_still_orders_against_its_offset() {
        let mut o = WriteOrder::new();
        assert_eq!(o.submit(1, 5 * K, 0), Admit::Go);
        assert_eq!(o.submit(2, 5 * K, K), Admit::Held);
        assert_eq!(o.complete(1), vec![2]);
    }

    /// A literal failover trace: QD 4, writes to blocks 0..3, path fails with all four in
    /// flight, the application submits new writes to blocks 1 and 5 meanwhile; only block
    /// 5 goes before the re-issues complete.
    #[test]
    fn a_failover_trace() {
        let mut o = WriteOrder::new();
        for b in 0..4 {
            assert_eq!(o.submit(b + 1, b * K, K), Admit::Go);
        }
        // Path A fails: 1..=4 are in doubt and re-issued on path B (still outstanding).
        assert_eq!(o.submit(5, K, K), Admit::Held);
        assert_eq!(o.submit(6, 5 * K, K), Admit::Go);
        // Re-issues complete on B in any order.
        assert_eq!(o.complete(4), Vec::<u64>::new());
        assert_eq!(o.complete(1), Vec::<u64>::new());
        assert_eq!(o.complete(2), vec![5]);
        assert_eq!(o.complete(3), Vec::<u64>::new());
        assert_eq!(o.complete(6), Vec::<u64>::new());
        assert_eq!(o.complete(5), Vec::<u64>::new());
        assert_eq!((o.outstanding(), o.held()), (0, 0));
    }
}
