//! A listening messenger's admission bounds and the entity of each session: caps on
//! accepted links waiting for their session hello (`msgr_max_pending_links`), on accepted
//! sessions (`msgr_max_sessions`) and on sessions per entity
//! (`msgr_max_sessions_per_entity`; the authenticated entity, or the peer's IP address with
//! `auth = none`), and the check that binds a session to the entity that opened it: a link
//! that names a known session (its peer id travels in clear) is attached to it only when it
//! authenticated as the same entity, so a session cannot be taken over without its key.
//! Every refusal is counted and logged (rate-limited).

use crate::config::Config;
use crate::error::Result;
use crate::msgr::auth::gate::LogLimit;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

#[derive(Debug, Default)]
struct State {
    /// Accepted sessions now.
    sessions: usize,
    /// Accepted sessions per entity key.
    per_entity: HashMap<String, usize>,
    /// Session id -> (its entity key if accepted, its authenticated peer entity).
    of: HashMap<u64, (Option<String>, Option<String>)>,
}

#[derive(Debug)]
pub(super) struct Admission {
    max_pending: usize,
    max_sessions: usize,
    max_per_entity: usize,
    state: Mutex<State>,
    pending: AtomicUsize,
    /// Links and sessions refused by a bound or a takeover check.
    pub refusals: AtomicU64,
    /// Path-join hellos refused: naming no open session, or another entity's.
    pub join_refusals: AtomicU64,
    log: Mutex<LogLimit>,
}

/// The counting key of a peer: its authenticated entity, else its IP address.
fn key_of(entity: Option<&str>, ip: IpAddr) -> String {
    match entity {
        Some(e) => format!("entity {e}"),
        None => format!("address {}", ip.to_canonical()),
    }
}

impl Admission {
    pub fn from_config(c: &Config) -> Result<Admission> {
        Ok(Admission {
            max_pending: c.get_u64("msgr_max_pending_links")? as usize,
            max_sessions: c.get_u64("msgr_max_sessions")? as usize,
            max_per_entity: c.get_u64("msgr_max_sessions_per_entity")? as usize,
            state: Mutex::default(),
            pending: AtomicUsize::new(0),
            refusals: AtomicU64::new(0),
            join_refusals: AtomicU64::new(0),
            log: Mutex::new(LogLimit::new()),
        })
    }

    fn refuse(&self, line: String) {
        self.refusals.fetch_add(1, Ordering::Relaxed);
        if let Some(suppressed) = self.log.lock().allow(Instant::now()) {
            if suppressed > 0 {
                log::warn!(target: "rdmx::msgr", "messenger: {line} ({suppressed} similar lines suppressed)");
            } else {
                log::warn!(target: "rdmx::msgr", "messenger: {line}");
            }
        }
    }

    /// Takes a pending-link place, or refuses (counted, logged) at the cap.
    pub fn try_pending(&self, peer: std::net::SocketAddr) -> bool {
        let n = self.pending.fetch_add(1, Ordering::AcqRel);
        if n >= self.max_pending {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            self.refuse(format!(
                "closed the link from {peer}: {n} accepted links wait for their session hello \
                 (msgr_max_pending_links)"
            ));
            return false;
        }
        true
    }

    /// A pending link left the pending list (attached, moved or dropped).
    pub fn pending_done(&self) {
        let _ = self
            .pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// Admits a new accepted session `id` from `entity` (authenticated) at `ip`, or says
    /// why not (counted, logged).
    pub fn try_session(&self, id: u64, entity: Option<&str>, ip: IpAddr) -> bool {
        let key = key_of(entity, ip);
        let mut st = self.state.lock();
        let of_key = st.per_entity.get(&key).copied().unwrap_or(0);
        let why = if st.sessions >= self.max_sessions {
            format!("{} sessions (msgr_max_sessions)", st.sessions)
        } else if of_key >= self.max_per_entity {
            format!("{of_key} sessions of {key} (msgr_max_sessions_per_entity)")
        } else {
            st.sessions += 1;
            *st.per_entity.entry(key.clone()).or_default() += 1;
            st.of.insert(id, (Some(key), entity.map(str::to_string)));
            return true;
        };
        drop(st);
        self.refuse(format!("refused a new session from {ip} ({key}): {why}"));
        false
    }

    /// Records the peer entity of a session this side connected.
    pub fn set_outgoing(&self, id: u64, entity: Option<&str>) {
        self.state
            .lock()
            .of
            .insert(id, (None, entity.map(str::to_string)));
    }

    /// Whether a link authenticated as `entity` may resume session `id` (the same entity
    /// that opened it); counted and logged when not.
    pub fn may_resume(&self, id: u64, entity: Option<&str>, ip: IpAddr) -> bool {
        let st = self.state.lock();
        let owner = st.of.get(&id).and_then(|(_, e)| e.clone());
        if owner.as_deref() == entity {
            return true;
        }
        drop(st);
        self.refuse(format!(
            "refused a link from {ip} resuming session {id:#x}: it authenticated as {}, the \
             session belongs to {} (a takeover attempt, or a key shared by two entities)",
            entity.unwrap_or("(nobody)"),
            owner.as_deref().unwrap_or("(nobody)")
        ));
        false
    }

    /// A path-join hello was refused (counted; an entity mismatch is logged by
    /// [`Admission::may_resume`] already).
    pub fn refuse_join(&self) {
        self.join_refusals.fetch_add(1, Ordering::Relaxed);
    }

    /// The authenticated peer entity of session `id`.
    pub fn entity(&self, id: u64) -> Option<String> {
        self.state.lock().of.get(&id).and_then(|(_, e)| e.clone())
    }

    /// Session `id` is gone.
    pub fn forget(&self, id: u64) {
        let mut st = self.state.lock();
        if let Some((Some(key), _)) = st.of.remove(&id) {
            st.sessions = st.sessions.saturating_sub(1);
            if let Some(n) = st.per_entity.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    st.per_entity.remove(&key);
                }
            }
        }
    }
}
