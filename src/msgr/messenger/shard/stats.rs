//! The messenger-wide figures: pools, sessions, and the totals of every session's counters
//! (those of ended sessions are added up as they go).

use super::*;

impl Core {
    pub fn stats(&self) -> MsgrStats {
        let mut totals = *self.totals.lock();
        let mut sessions = 0;
        let mut pending = 0;
        let (mut active, mut missed) = (0, 0);
        for s in &self.shards {
            let st = s.st.lock();
            sessions += st.sessions.len();
            pending += st.pending.len();
            active += st.sessions.values().filter(|s| s.active).count();
            missed += st.park.missed_wakes;
            for sess in st.sessions.values() {
                add_counters(&mut totals, &sess.m.counters);
                // Refusals at the gate the pass has not counted yet.
                totals.full_refusals += sess.gate.pending().1;
            }
        }
        let hs = self
            .listener
            .lock()
            .as_ref()
            .map(Listener::counters)
            .unwrap_or_default();
        MsgrStats {
            auth_failures: hs.auth_failures,
            handshake_refusals: hs.refused,
            handshake_timeouts: hs.timed_out,
            session_refusals: self.admit.refusals.load(Ordering::Relaxed),
            path_join_refusals: self.admit.join_refusals.load(Ordering::Relaxed),
            sessions,
            pending_connections: pending,
            data_pool: self.bufs.data.stats(),
            header_pool: self.bufs.slots.stats(),
            copy_chunks_in_use: self.bufs.copy_in_use(),
            malformed: self.malformed.load(Ordering::Relaxed),
            spin_backoffs: self.spin_backoffs.load(Ordering::Relaxed),
            active_sessions: active,
            missed_wakes: missed,
            totals,
            dispatcher_panics: self.dispatcher.panics(),
            worker_panics: self.dispatcher.worker_panics(),
        }
    }

    pub(super) fn add_totals(&self, s: &Session) {
        let mut t = self.totals.lock();
        add_counters(&mut t, &s.m.counters);
    }
}

fn add_counters(t: &mut SessionCounters, c: &SessionCounters) {
    t.msgs_sent += c.msgs_sent;
    t.msgs_received += c.msgs_received;
    t.bytes_sent += c.bytes_sent;
    t.bytes_received += c.bytes_received;
    t.replays += c.replays;
    t.reconnects += c.reconnects;
    t.faults += c.faults;
    t.malformed += c.malformed;
    t.credit_stalls += c.credit_stalls;
    t.full_refusals += c.full_refusals;
    t.copied_bytes += c.copied_bytes;
    t.read_segments += c.read_segments;
    t.eager_segments += c.eager_segments;
    t.written_segments += c.written_segments;
    t.remote_writes += c.remote_writes;
    t.remote_write_bytes += c.remote_write_bytes;
    t.keepalives_sent += c.keepalives_sent;
    t.rnr_naks += c.rnr_naks;
    t.duplicates_dropped += c.duplicates_dropped;
    t.send_completions += c.send_completions;
    t.imm_sent += c.imm_sent;
    t.imm_received += c.imm_received;
    t.partial_posts += c.partial_posts;
    t.oversized += c.oversized;
}
