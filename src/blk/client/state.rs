//! The requests in flight and what became of them, shared by the caller's thread and the
//! messenger's callbacks under one lock: finishing a request once both its reply and its
//! acknowledgement are in, failing them all when the session ends.

use parking_lot::Mutex;
use rustc_hash::FxHashMap as HashMap;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};

use super::super::proto::{Op, Reply};
use super::{BlkCounters, Completion};
use crate::error::ErrorKind;
use crate::mem::rcache::Handle;
use crate::msgr::messenger::{Messenger, SendId};
use crate::provider::sys::EventFd;

pub(super) struct Pending {
    pub(super) cookie: u64,
    pub(super) op: Op,
    pub(super) buf: usize,
    pub(super) len: u32,
    /// A read's buffer registration (remote write), named in the request: put back when
    /// the request finishes (the target writes no more after its reply, and nothing after
    /// the session ended: its connection is gone by then).
    pub(super) reg: Option<Handle>,
    /// The reply's status, once it arrived.
    pub(super) replied: Option<i32>,
    /// The request's message was acknowledged (or failed): the messenger no longer reads
    /// the caller's buffer.
    pub(super) acked: bool,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) inflight: HashMap<u64, Pending>,
    pub(super) by_send: HashMap<SendId, u64>,
    pub(super) done: VecDeque<Completion>,
    /// Replies to control requests (open, query) by request id.
    pub(super) control: HashMap<u64, Reply>,
    /// Why the session ended, and the kind callers get (Auth when the handshake was
    /// refused for the key, Closed otherwise).
    pub(super) dead: Option<(ErrorKind, String)>,
    pub(super) connected: bool,
    /// Registrations of finished requests, put back after the lock is released.
    pub(super) to_put: Vec<Handle>,
    pub(super) counters: BlkCounters,
    /// The newest request id sent: an immediate reply names its request by the low 32
    /// bits, and the ids in flight span far less than 2^32.
    pub(super) last_id: u64,
    /// Cookies of requests that completed with `-EIO` because the session ended before
    /// the target answered them (not an error the target reported): what a multipath
    /// client re-issues on another path (`take_session_failed`). Bounded by the requests
    /// in flight when the session ended (later submissions are refused).
    pub(super) session_failed: rustc_hash::FxHashSet<u64>,
}

pub(super) struct Shared {
    pub(super) st: Mutex<State>,
    /// Signalled when a completion is queued by a worker thread.
    pub(super) efd: EventFd,
    /// The messenger runs worker threads: completions are signalled on `efd`. A
    /// caller-driven client queues them on the caller's own thread, inside `poll`, and
    /// saves the write (and the read that resets it) per completion.
    pub(super) signal: AtomicBool,
}

impl Shared {
    pub(super) fn finish(&self, st: &mut State, req_id: u64) {
        let Some(p) = st.inflight.get(&req_id) else {
            return;
        };
        if let (Some(status), true) = (p.replied, p.acked) {
            let len = if status == 0 { p.len } else { 0 };
            st.done.push_back(Completion {
                cookie: p.cookie,
                status,
                len,
            });
            if let Some(h) = st.inflight.remove(&req_id).and_then(|p| p.reg) {
                st.to_put.push(h);
            }
            if self.signal.load(Ordering::Relaxed) {
                self.efd.signal();
            }
        }
    }

    pub(super) fn fail_all(&self, st: &mut State, kind: ErrorKind, why: String) {
        let ids: Vec<u64> = st.inflight.keys().copied().collect();
        for id in ids {
            if let Some(p) = st.inflight.get_mut(&id) {
                if p.replied.is_none() {
                    p.replied = Some(-libc::EIO);
                    let cookie = p.cookie;
                    st.session_failed.insert(cookie);
                }
                p.acked = true;
            }
            self.finish(st, id);
        }
        st.dead.get_or_insert((kind, why));
    }
}

/// Puts back the registrations finished requests left (outside the state's lock).
pub(super) fn put_back(m: &Messenger, st: &mut State) {
    if st.to_put.is_empty() {
        return;
    }
    let hs = std::mem::take(&mut st.to_put);
    for h in hs {
        let _ = m.context().rcache().put(h);
    }
}
