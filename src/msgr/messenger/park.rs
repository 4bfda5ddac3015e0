//! Which sessions a shard's pass looks at. A session found quiet (`Session::quiet`) for
//! [`PARK_AFTER`] is parked: passes skip it, at no cost per pass, until something can make it busy again:
//! a completion in one of its link's empty CQs (the CQ's first-completion hook puts its id
//! on the shard's [`ReadyList`], from whichever thread completed it), its keepalive coming
//! due (a timer heap), or a call on it (a send, an incoming link). 1,000 idle sessions
//! cost a pass 1,000 looks before (~40 us); now none.
//!
//! Parking needs one thing of the provider, its readiness (`crate::provider::ready`): a
//! first-completion hook on the link's CQs. A provider that cannot run one (verbs: only a
//! poll or the armed completion channel tells) says so, and the shard never parks that
//! session: its link is polled every pass, as before parking existed.
//!
//! A parked session that is not quiet any more although none of these woke it would wait
//! for nothing: a look over the parked sessions every [`SCAN_EVERY`] wakes it and counts it
//! (`MsgrStats::missed_wakes`, which the tests expect to stay 0).

use super::session::Session;
use crate::provider::ready::Hook;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a session stays quiet before it is parked. A busy session is quiet for a few
/// passes between its requests; parking and waking it each time cost more than the look
/// (rdmx-perf rpc_bw at 32 in flight: -8% when sessions parked at once).
pub const PARK_AFTER: Duration = Duration::from_millis(1);

/// How often the parked sessions are looked at anyway.
pub const SCAN_EVERY: Duration = Duration::from_millis(100);

/// Ids of sessions whose link had a completion land in an empty CQ, filled by the CQs'
/// hooks (any thread), drained by the shard's pass. A leaf lock: the hook runs inside the
/// device's progress pass, which a shard's pass may run with the shard's lock held.
#[derive(Default)]
pub struct ReadyList(Mutex<Vec<u64>>);

impl ReadyList {
    /// The hook for the CQs of session `id`'s link.
    pub fn hook(self: &Arc<Self>, id: u64) -> Hook {
        let me = Arc::clone(self);
        Arc::new(move || me.0.lock().push(id))
    }

    fn take(&self, into: &mut Vec<u64>) {
        let mut g = self.0.lock();
        if !g.is_empty() {
            into.append(&mut g);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.lock().is_empty()
    }
}

/// A shard's active sessions (those a pass looks at) and the keepalive times of the
/// parked ones. Invariant: `active` holds each id whose session has `active` set, once.
#[derive(Default)]
pub struct Parking {
    pub active: Vec<u64>,
    keepalives: BinaryHeap<Reverse<(Instant, u64)>>,
    next_scan: Option<Instant>,
    /// Parked sessions the periodic look found busy (see the module doc).
    pub missed_wakes: u64,
    /// The ids the last drain of the ready list woke (scratch, reused).
    woken: Vec<u64>,
}

impl Parking {
    /// Session `id` is looked at from the next pass on (no-op if it is, or is gone).
    pub fn wake(&mut self, sessions: &mut FxHashMap<u64, Session>, id: u64) {
        if let Some(s) = sessions.get_mut(&id)
            && !s.active
        {
            s.active = true;
            self.active.push(id);
        }
    }

    /// Every session is looked at from the next pass on (after a change a wake does not
    /// name, such as a peer's restart).
    pub fn wake_all(&mut self, sessions: &mut FxHashMap<u64, Session>) {
        for (&id, s) in sessions.iter_mut() {
            if !s.active {
                s.active = true;
                self.active.push(id);
            }
        }
    }

    /// In a pass, after the device's progress: wakes the sessions the CQ hooks named and
    /// those whose keepalive is due; every [`SCAN_EVERY`], any parked session that is not
    /// quiet.
    pub fn wake_due(
        &mut self,
        sessions: &mut FxHashMap<u64, Session>,
        ready: &ReadyList,
        now: Instant,
    ) {
        self.wake_ready(sessions, ready);
        while let Some(&Reverse((t, id))) = self.keepalives.peek() {
            if t > now {
                break;
            }
            self.keepalives.pop();
            if let Some(sess) = sessions.get_mut(&id)
                && sess.keepalive_queued == Some(t)
            {
                sess.keepalive_queued = None;
            }
            self.wake(sessions, id);
        }
        if self.next_scan.is_some_and(|t| now < t) {
            return;
        }
        self.next_scan = Some(now + SCAN_EVERY);
        let mut busy: Vec<u64> = sessions
            .iter()
            .filter(|(_, sess)| !sess.active && !sess.quiet(now))
            .map(|(&id, _)| id)
            .collect();
        if busy.is_empty() {
            return;
        }
        // A completion may have landed since the drain above: its hook ran before its CQ
        // looked non-empty, so its id is in the ready list now. Those were not missed.
        self.wake_ready(sessions, ready);
        busy.retain(|id| !self.woken.contains(id));
        for &id in &busy {
            self.wake(sessions, id);
        }
        for id in busy {
            self.missed_wakes += 1;
            log::warn!(target: "rdmx::msgr", "session {id:#x}: parked with work to do, not woken (found by the periodic look)");
        }
    }

    /// Wakes the sessions on the ready list, and keeps their ids in `woken` until the next
    /// call.
    fn wake_ready(&mut self, sessions: &mut FxHashMap<u64, Session>, ready: &ReadyList) {
        let mut woken = std::mem::take(&mut self.woken);
        woken.clear();
        ready.take(&mut woken);
        for &id in &woken {
            self.wake(sessions, id);
        }
        self.woken = woken;
    }

    /// Takes the session at `active[k]` out of the passes (the caller found it quiet and
    /// its link's CQs hooked): its keepalive, if any, wakes it when due. The heap holds at
    /// most one entry per session and due time, not one per park (a session of one
    /// request at a time parks between requests): an entry due earlier wakes it early, to
    /// park again.
    pub fn park(&mut self, k: usize, sess: &mut Session) {
        sess.active = false;
        self.active.swap_remove(k);
        if let Some(due) = sess.next_keepalive()
            && sess.keepalive_queued.is_none_or(|q| due < q)
        {
            sess.keepalive_queued = Some(due);
            self.keepalives.push(Reverse((due, sess.id())));
        }
    }
}
