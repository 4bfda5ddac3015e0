//! Per-session state of the target and the dispatcher: which handles a session opened
//! (with its entity's access and its own one-sided registration), its reply backlog and
//! the requests set aside while it is over a quota. Everything here is dropped when the
//! session ends.

use super::serve::{Served, errno_reply};
use super::{Access, BufsOut, Inner, IoBuf};
use crate::error::{Error, ErrorKind};
use crate::msgr::MrInfo;
use crate::msgr::messenger::{Dispatcher, InMessage, Messenger, OutMessage, SendId, SessionId};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::blk::proto::{MSG_REQ, Reply, ReqHdr};

/// Refusals of one session logged at warn; the rest are counted (and logged at debug).
const REFUSALS_LOGGED: u64 = 5;

/// A volume a session opened.
#[derive(Debug, Clone, Copy)]
pub(super) struct Opened {
    pub vol: u32,
    pub access: Access,
    /// The session's one-sided registration of a memory volume (its rkey is told to this
    /// session only), deregistered when the session ends.
    pub mr: Option<MrInfo>,
}

/// A reply waiting for the session's credits.
pub(super) struct Pending {
    msg: OutMessage,
    buf: Option<IoBuf>,
    counted: bool,
}

pub(super) struct Sess {
    /// The authenticated entity (`None`: auth = none), looked up once.
    pub entity: Option<String>,
    pub peer: Option<SocketAddr>,
    pub opened: Vec<Opened>,
    backlog: VecDeque<Pending>,
    deferred: VecDeque<InMessage>,
    deferred_bytes: usize,
    /// Reply buffers held (in flight or in the backlog).
    held: usize,
    refusals: u64,
    stall_logged: bool,
    /// The target paused the client's requests (`Messenger::pause_receive`) while the
    /// session is over a quota.
    paused: bool,
    closing: bool,
}

impl Sess {
    fn new(entity: Option<String>, peer: Option<SocketAddr>) -> Sess {
        Sess {
            entity,
            peer,
            opened: Vec::new(),
            backlog: VecDeque::new(),
            deferred: VecDeque::new(),
            deferred_bytes: 0,
            held: 0,
            refusals: 0,
            stall_logged: false,
            paused: false,
            closing: false,
        }
    }

    pub fn entity_text(&self) -> &str {
        self.entity.as_deref().unwrap_or("none (auth off)")
    }

    pub fn peer_text(&self) -> String {
        self.peer
            .map_or_else(|| "peer unknown".to_string(), |p| p.to_string())
    }
}

/// The session's authenticated entity (None with auth = none, which access control
/// treats as such).
fn session_entity(m: &Messenger, s: SessionId) -> Option<String> {
    m.session_entity(s)
}

fn msg_bytes(msg: &InMessage) -> usize {
    msg.front.len() + msg.data.iter().map(|d| d.len()).sum::<usize>()
}

impl Inner {
    /// The state of session `s` (made on its first sight if `on_connect` was not seen).
    fn session(&self, m: &Messenger, s: SessionId, peer: Option<SocketAddr>) -> Arc<Mutex<Sess>> {
        if let Some(x) = self.sessions.lock().get(&s) {
            return Arc::clone(x);
        }
        let peer = peer.or_else(|| m.session_info(s).ok().and_then(|i| i.peer));
        let sess = Sess::new(session_entity(m, s), peer);
        log::info!(
            "rdmx-target: session {s:?} from {}: entity {}",
            sess.peer_text(),
            sess.entity_text()
        );
        self.stats.sessions.fetch_add(1, Ordering::Relaxed);
        Arc::clone(
            self.sessions
                .lock()
                .entry(s)
                .or_insert_with(|| Arc::new(Mutex::new(sess))),
        )
    }

    /// Counts a refused request and logs the first few of each session at warn.
    pub(super) fn refused(&self, s: SessionId, g: &mut Sess, what: &str) {
        self.stats.access_denied.fetch_add(1, Ordering::Relaxed);
        g.refusals += 1;
        if g.refusals <= REFUSALS_LOGGED {
            log::warn!(
                "rdmx-target: session {s:?} ({}, entity {}): refused: {what}{}",
                g.peer_text(),
                g.entity_text(),
                if g.refusals == REFUSALS_LOGGED {
                    " (further refusals of this session counted, logged at debug)"
                } else {
                    ""
                }
            );
        } else {
            log::debug!("rdmx-target: session {s:?}: refused: {what}");
        }
    }

    fn stalled(&self, g: &Sess) -> bool {
        g.backlog.len() >= self.limits.max_backlog || g.held >= self.limits.session_bufs
    }

    /// A request arrives: served now, or set aside while the session is over a quota.
    /// True: the session went over `max_deferred` and must be closed.
    fn arrive(&self, m: &Messenger, s: SessionId, g: &mut Sess, msg: InMessage) -> bool {
        if g.closing {
            return false;
        }
        if !g.deferred.is_empty() || self.stalled(g) {
            if !g.stall_logged && self.stalled(g) {
                g.stall_logged = true;
                self.stats.quota_stalls.fetch_add(1, Ordering::Relaxed);
                log::warn!(
                    "rdmx-target: session {s:?} ({}, entity {}) over its quota ({} replies \
                     waiting for credits, max {}; {} reply buffers held, max {}): its requests \
                     wait until it drains (its requests are paused)",
                    g.peer_text(),
                    g.entity_text(),
                    g.backlog.len(),
                    self.limits.max_backlog,
                    g.held,
                    self.limits.session_bufs
                );
            }
            if !g.paused && self.stalled(g) {
                // Flow control, not buffering: the client's next requests wait in its own
                // send queue (`Full` there), so a consumer that never drains its replies
                // stalls itself and costs the target nothing more. What was already on the
                // wire (at most its credits) is set aside below.
                g.paused = m.pause_receive(s, true).is_ok();
            }
            let bytes = msg_bytes(&msg);
            if g.deferred.len() >= self.limits.max_deferred
                || g.deferred_bytes + bytes > self.limits.max_deferred_bytes
            {
                g.closing = true;
                return true;
            }
            self.stats.deferred.fetch_add(1, Ordering::Relaxed);
            g.deferred_bytes += bytes;
            g.deferred.push_back(msg);
            return false;
        }
        self.handle(m, s, g, msg);
        false
    }

    /// Serves one request and sends (or queues) its reply; a read that must wait for an IO
    /// buffer goes back to the front of the session's set-aside requests.
    fn handle(&self, m: &Messenger, s: SessionId, g: &mut Sess, msg: InMessage) {
        if msg.msg_type != MSG_REQ {
            self.stats.errors.fetch_add(1, Ordering::Relaxed);
            let id = ReqHdr::decode(&msg.front).map_or_else(|e| e.unwrap_or(0), |h| h.req_id);
            self.send(
                m,
                s,
                g,
                Pending {
                    msg: errno_reply(0, id, libc::EPROTO),
                    buf: None,
                    counted: false,
                },
            );
            return;
        }
        match self.serve(m, s, g, msg) {
            Served::Reply { msg, buf, counted } => {
                if Reply::decode(&msg.front).is_some_and(|r| r.status != 0) {
                    self.stats.errors.fetch_add(1, Ordering::Relaxed);
                }
                if counted {
                    g.held += 1;
                }
                self.send(m, s, g, Pending { msg, buf, counted });
            }
            Served::WaitBuf(msg) => {
                g.deferred_bytes += msg_bytes(&msg);
                g.deferred.push_front(msg);
                let mut w = self.buf_waiters.lock();
                if !w.contains(&s) {
                    w.push(s);
                }
            }
        }
    }

    fn send(&self, m: &Messenger, s: SessionId, g: &mut Sess, p: Pending) {
        if !g.backlog.is_empty() {
            // Replies keep their order behind those waiting; a large read keeps its IO
            // buffer with it (no copy).
            g.backlog.push_back(p);
            return;
        }
        let Pending { msg, buf, counted } = p;
        match self.send_held(m, s, msg, counted) {
            Ok(Some((mut out, id))) => {
                out.insert((s, id), buf);
            }
            Ok(None) => {}
            Err(r) if r.kind() == ErrorKind::Full => g.backlog.push_back(Pending {
                msg: *r.msg,
                buf,
                counted,
            }),
            Err(r) => {
                log::debug!("rdmx-target: reply to {s:?} dropped: {}", r.error);
                self.release(g, buf, counted);
            }
        }
    }

    /// `m.send`; for a reply that holds a buffer, with `bufs_out` locked across the send
    /// so that the send's completion (on another messenger thread with `msgr_threads` > 1)
    /// cannot look for the entry before it is made.
    fn send_held<'a>(
        &'a self,
        m: &Messenger,
        s: SessionId,
        msg: OutMessage,
        counted: bool,
    ) -> std::result::Result<
        Option<(parking_lot::MutexGuard<'a, BufsOut>, SendId)>,
        crate::msgr::messenger::Refused,
    > {
        if !counted {
            return m.send(s, msg).map(|_| None);
        }
        let out = self.bufs_out.lock();
        m.send(s, msg).map(|id| Some((out, id)))
    }

    /// A reply's buffer is back (sent and acknowledged, or dropped).
    fn release(&self, g: &mut Sess, buf: Option<IoBuf>, counted: bool) {
        if let Some(b) = buf {
            self.put_buf(b);
        }
        if counted {
            g.held = g.held.saturating_sub(1);
        }
    }

    /// Sends what waits in the backlog, then serves the requests set aside while the
    /// session stays within its quotas.
    fn drain(&self, m: &Messenger, s: SessionId, g: &mut Sess) {
        if g.closing {
            return;
        }
        while let Some(p) = g.backlog.pop_front() {
            let Pending { msg, buf, counted } = p;
            match self.send_held(m, s, msg, counted) {
                Ok(Some((mut out, id))) => {
                    out.insert((s, id), buf);
                }
                Ok(None) => {}
                Err(r) if r.kind() == ErrorKind::Full => {
                    g.backlog.push_front(Pending {
                        msg: *r.msg,
                        buf,
                        counted,
                    });
                    return;
                }
                Err(_) => self.release(g, buf, counted),
            }
        }
        while !self.stalled(g) {
            let Some(msg) = g.deferred.pop_front() else {
                break;
            };
            g.deferred_bytes = g.deferred_bytes.saturating_sub(msg_bytes(&msg));
            let before = g.deferred.len();
            self.handle(m, s, g, msg);
            if g.deferred.len() > before {
                return; // waits for an IO buffer
            }
        }
        if !self.stalled(g) {
            g.stall_logged = false;
            if g.paused && g.deferred.is_empty() {
                g.paused = false;
                let _ = m.pause_receive(s, false);
            }
        }
    }

    /// Frees what an ended session held: queued replies (and their IO buffers), requests
    /// set aside, its one-sided registrations.
    pub(super) fn end_session(&self, g: &mut Sess) {
        g.closing = true;
        for p in std::mem::take(&mut g.backlog) {
            if let Some(b) = p.buf {
                self.put_buf(b);
            }
        }
        g.deferred.clear();
        g.deferred_bytes = 0;
        let lkeys: Vec<u32> = g
            .opened
            .drain(..)
            .filter_map(|o| o.mr.map(|r| r.lkey))
            .collect();
        let raw = self.raw_ctx.lock().clone();
        let mut retired = self.retired_mrs.lock();
        retired.extend(lkeys);
        if let Some(ctx) = raw {
            // Busy while a work request names it (a READ in flight): retried at the next end.
            retired.retain(|&k| ctx.deregister(k).is_err());
        } else {
            retired.clear();
        }
    }

    fn wake_buf_waiters(&self, m: &Messenger) {
        let waiters = std::mem::take(&mut *self.buf_waiters.lock());
        for w in waiters {
            let sess = self.sessions.lock().get(&w).cloned();
            if let Some(sess) = sess {
                self.drain(m, w, &mut sess.lock());
            }
        }
    }

    fn close_over_quota(&self, m: &Messenger, s: SessionId) {
        self.stats.quota_closes.fetch_add(1, Ordering::Relaxed);
        let sess = self.sessions.lock().remove(&s);
        if let Some(sess) = sess {
            let mut g = sess.lock();
            log::warn!(
                "rdmx-target: session {s:?} ({}, entity {}) closed: it kept sending with {} \
                 requests ({} bytes) set aside (max {} / {} bytes)",
                g.peer_text(),
                g.entity_text(),
                g.deferred.len(),
                g.deferred_bytes,
                self.limits.max_deferred,
                self.limits.max_deferred_bytes
            );
            self.end_session(&mut g);
        }
        let _ = m.close_session(s);
        self.wake_buf_waiters(m);
    }
}

pub(super) struct Disp {
    pub inner: Arc<Mutex<Option<Arc<Inner>>>>,
}

impl Disp {
    fn inner(&self) -> Option<Arc<Inner>> {
        self.inner.lock().clone()
    }
}

impl Dispatcher for Disp {
    fn on_connect(&self, m: &Messenger, s: SessionId, peer: SocketAddr, _incoming: bool) {
        if let Some(inner) = self.inner() {
            inner.session(m, s, Some(peer));
        }
    }

    fn on_message(&self, m: &Messenger, s: SessionId, msg: InMessage) {
        let Some(inner) = self.inner() else {
            return;
        };
        let sess = inner.session(m, s, None);
        let close = inner.arrive(m, s, &mut sess.lock(), msg);
        if close {
            inner.close_over_quota(m, s);
        }
    }

    fn on_send_complete(
        &self,
        m: &Messenger,
        s: SessionId,
        id: SendId,
        _status: crate::error::Result<()>,
    ) {
        let Some(inner) = self.inner() else {
            return;
        };
        let Some(buf) = inner.bufs_out.lock().remove(&(s, id)) else {
            return;
        };
        let had_buf = buf.is_some();
        let sess = inner.sessions.lock().get(&s).cloned();
        match sess {
            Some(sess) => {
                let mut g = sess.lock();
                inner.release(&mut g, buf, true);
                inner.drain(m, s, &mut g);
            }
            None => {
                if let Some(b) = buf {
                    inner.put_buf(b);
                }
            }
        }
        if had_buf {
            inner.wake_buf_waiters(m);
        }
    }

    fn on_send_ready(&self, m: &Messenger, s: SessionId) {
        if let Some(inner) = self.inner() {
            let sess = inner.sessions.lock().get(&s).cloned();
            if let Some(sess) = sess {
                inner.drain(m, s, &mut sess.lock());
            }
        }
    }

    fn on_reset(&self, m: &Messenger, s: SessionId, why: &Error) {
        if let Some(inner) = self.inner() {
            inner.stats.resets.fetch_add(1, Ordering::Relaxed);
            let sess = inner.sessions.lock().remove(&s);
            if let Some(sess) = sess {
                let mut g = sess.lock();
                log::info!(
                    "rdmx-target: session {s:?} ({}, entity {}) ended: {why}",
                    g.peer_text(),
                    g.entity_text()
                );
                inner.end_session(&mut g);
            }
            inner.wake_buf_waiters(m);
        }
    }
}
