//! `rdmx_msgr_*`: the messenger (sessions carrying messages with a type, a small front part
//! and page-aligned data segments; credits; lossless/lossy policies; see
//! `docs/messenger.md`). `rdmx_session_*` (send, close, counters) are in `msgr/session.rs`,
//! `rdmx_msg_*` (received messages, zero-copy data) in `msgr/msg.rs`.
//!
//! Two ways to hear from a messenger, chosen at `rdmx_msgr_new`:
//! - **event records** (no callback given): events queue inside the messenger and the
//!   application drains them with `rdmx_msgr_poll`; with `msgr_threads` >= 1 worker threads
//!   make progress and `rdmx_msgr_event_fd` is readable while events are queued (epoll it);
//!   with `msgr_threads = 0` progress happens inside `rdmx_msgr_poll` only;
//! - **a callback**: `on_event` is called for each event, on the thread documented at
//!   `rdmx_msgr_on_event`.

mod msg;
mod paths;
mod session;

pub use msg::*;
pub use paths::*;
pub use session::*;

use super::boundary::{self, handle, out_ptr};
use super::config::rdmx_config;
use super::context::addr_arg;
use super::mem::{rdmx_chunk, rdmx_mem};
use super::sized::{sized_out, write_sized};
use super::status::rdmx_status;
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::mem::rcache::Handle;
use crate::msgr::messenger::{
    Dispatcher, InMessage, Messenger, PathEvent, Policy, SendId, SessionCounters, SessionId,
    TxChunk,
};
use crate::provider::sys::EventFd;
use crate::rc::verbs::access;
use parking_lot::{Condvar, Mutex};
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::ffi::{CString, c_char, c_void};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::time::Duration;

/// `rdmx_msgr_connect`: the policy of the `msgr_policy` key.
pub const RDMX_POLICY_DEFAULT: u32 = 0;
/// After a transport fault the connecting side reconnects and both sides replay what the
/// other has not acknowledged: each message is delivered exactly once, in order. A reset
/// only if the peer restarted or reconnecting gave up.
pub const RDMX_POLICY_LOSSLESS: u32 = 1;
/// A fault ends the session: unacknowledged sends complete with an error, then a reset.
pub const RDMX_POLICY_LOSSY: u32 = 2;

/// A session is open (`incoming`: accepted by `rdmx_msgr_listen`; `text`: the peer's
/// "IP:PORT"). Not repeated on a lossless reconnect.
pub const RDMX_MSGR_EVENT_CONNECT: u32 = 1;
/// A message (`msg`, owned by the application from now on: `rdmx_msg_free` it).
pub const RDMX_MSGR_EVENT_MESSAGE: u32 = 2;
/// Send `send_id` completed: `status` RDMX_OK when the peer acknowledged it, else it never
/// will (lossy fault, peer reset, reconnect gave up, session closed; `text` says why).
/// Exactly one per accepted send; the memory its segments named is free again.
pub const RDMX_MSGR_EVENT_SEND_COMPLETE: u32 = 3;
/// A session that refused a send with RDMX_FULL has room again.
pub const RDMX_MSGR_EVENT_SEND_READY: u32 = 4;
/// The session ended (lossy fault, peer restart, reconnect gave up): `status` and `text`
/// say why. Not for `rdmx_session_close`. The session id is dead afterwards.
pub const RDMX_MSGR_EVENT_RESET: u32 = 5;

/// One event. Plain data; the caller owns the message in a MESSAGE event.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy)]
pub struct rdmx_msgr_event {
    /// RDMX_MSGR_EVENT_*.
    pub kind: u32,
    /// CONNECT: 1 if this side accepted the session, 0 if it connected.
    pub incoming: u32,
    pub session: u64,
    /// SEND_COMPLETE: the id `rdmx_session_send` returned (1, 2, ... per session).
    pub send_id: u64,
    /// SEND_COMPLETE and RESET: RDMX_OK or why not (RDMX_CLOSED, RDMX_TIMEOUT, ...).
    pub status: rdmx_status,
    /// MESSAGE: the message; the application owns it (free with `rdmx_msg_free`, from any
    /// thread, also after `rdmx_msgr_free`). NULL otherwise.
    pub msg: *mut rdmx_msg,
    /// Never NULL: CONNECT the peer's "IP:PORT"; RESET and failed SEND_COMPLETE the reason;
    /// "" otherwise. Owned by rdmx: valid until the next `rdmx_msgr_poll` on this thread
    /// (event records) or until the callback returns.
    pub text: *const c_char,
}

/// The event callback. Which thread: with `msgr_threads = 0`, inside `rdmx_msgr_poll` on
/// its caller's thread; with `msgr_threads = N` each session belongs to one of N worker
/// threads and every event of that session comes on it, in order (CONNECT, then messages in
/// sequence order and send completions in send order, at most one RESET last), so one
/// session's events never run concurrently.
///
/// What may be called from it: every rdmx call on this messenger (send, close, counters,
/// chunk/mem calls, `rdmx_msg_*`) except `rdmx_msgr_poll` (RDMX_BUSY) and `rdmx_msgr_free`
/// (refused). No lock is held while it runs. `ev` and `ev->text` are valid for the call;
/// `ev->msg` is the application's to free. Do not block long: it holds up every session of
/// its thread.
#[allow(non_camel_case_types)]
pub type rdmx_msgr_on_event = Option<
    unsafe extern "C" fn(user_data: *mut c_void, m: *mut rdmx_msgr, ev: *const rdmx_msgr_event),
>;

/// A messenger: listens, connects, carries many sessions. Opaque; create with
/// `rdmx_msgr_new`, free with `rdmx_msgr_free`. Thread-safe: every call may be made from
/// any thread at once, except `rdmx_msgr_free`.
#[allow(non_camel_case_types)]
pub struct rdmx_msgr {
    inner: Messenger,
    shared: Arc<Shared>,
}

/// What happened, as the dispatcher was told (converted to a record when handed out).
enum Ev {
    Connect(SessionId, SocketAddr, bool),
    Message(SessionId, InMessage),
    SendDone(SessionId, SendId, Result<()>),
    Ready(SessionId),
    Reset(SessionId, Error),
}

/// The C caller's callback and pointer.
struct Callback {
    f: unsafe extern "C" fn(*mut c_void, *mut rdmx_msgr, *const rdmx_msgr_event),
    user: *mut c_void,
}

// SAFETY: rdmx never dereferences `user`; the header tells the caller that the callback
// runs on worker threads (or the polling thread) with this pointer.
unsafe impl Send for Callback {}
// SAFETY: as above; the pointer value is only copied.
unsafe impl Sync for Callback {}

/// State shared by the handle and the dispatcher the messenger calls.
struct Shared {
    callback: Option<Callback>,
    queue: Mutex<VecDeque<Ev>>,
    ready: Condvar,
    efd: EventFd,
    /// The C handle, for the callback's `m` argument (set right after it is boxed).
    handle: AtomicPtr<rdmx_msgr>,
    /// Chunks lent by `rdmx_msgr_chunk_get`, by address.
    chunks: Mutex<HashMap<usize, TxChunk>>,
    /// Registrations from `rdmx_msgr_mem_reg`, by id.
    mems: Mutex<(u64, HashMap<u64, Handle>)>,
    /// Path events for `rdmx_msgr_next_path_event` (the last `PATH_EVENTS_KEPT`).
    path_events: Mutex<VecDeque<paths::PathRecord>>,
}

thread_local! {
    /// Set while this thread runs the application's event callback.
    static IN_CALLBACK: Cell<bool> = const { Cell::new(false) };
    /// The `text` strings of the records the last `rdmx_msgr_poll` on this thread returned.
    static POLL_TEXT: RefCell<Vec<CString>> = const { RefCell::new(Vec::new()) };
}

fn c_text(s: String) -> CString {
    CString::new(s.replace('\0', "\\0")).unwrap_or_default()
}

/// A record for `ev` (its text in `text`, which must outlive the record's use).
fn record(ev: Ev, text: &mut Option<CString>) -> rdmx_msgr_event {
    let mut r = rdmx_msgr_event {
        kind: 0,
        incoming: 0,
        session: 0,
        send_id: 0,
        status: rdmx_status::RDMX_OK,
        msg: std::ptr::null_mut(),
        text: c"".as_ptr(),
    };
    match ev {
        Ev::Connect(s, peer, incoming) => {
            r.kind = RDMX_MSGR_EVENT_CONNECT;
            r.session = s.0;
            r.incoming = u32::from(incoming);
            *text = Some(c_text(peer.to_string()));
        }
        Ev::Message(s, m) => {
            r.kind = RDMX_MSGR_EVENT_MESSAGE;
            r.session = s.0;
            r.msg = Box::into_raw(Box::new(rdmx_msg::from(m)));
        }
        Ev::SendDone(s, id, res) => {
            r.kind = RDMX_MSGR_EVENT_SEND_COMPLETE;
            r.session = s.0;
            r.send_id = id;
            if let Err(e) = res {
                r.status = e.kind().into();
                *text = Some(c_text(e.to_string()));
            }
        }
        Ev::Ready(s) => {
            r.kind = RDMX_MSGR_EVENT_SEND_READY;
            r.session = s.0;
        }
        Ev::Reset(s, e) => {
            r.kind = RDMX_MSGR_EVENT_RESET;
            r.session = s.0;
            r.status = e.kind().into();
            *text = Some(c_text(e.to_string()));
        }
    }
    if let Some(t) = text {
        r.text = t.as_ptr();
    }
    r
}

impl Shared {
    fn deliver(&self, ev: Ev) {
        match &self.callback {
            Some(cb) => {
                let mut text = None;
                let r = record(ev, &mut text);
                let m = self.handle.load(Ordering::Acquire);
                let was = IN_CALLBACK.with(|c| c.replace(true));
                // SAFETY: the caller's function pointer with the documented signature; `r`
                // and its text live for the call; `m` is the live handle (rdmx_msgr_free
                // stops the workers before freeing it and is refused from callbacks).
                unsafe { (cb.f)(cb.user, m, &r) };
                IN_CALLBACK.with(|c| c.set(was));
            }
            None => {
                let mut q = self.queue.lock();
                q.push_back(ev);
                if q.len() == 1 {
                    self.efd.signal();
                }
                drop(q);
                self.ready.notify_one();
            }
        }
    }
}

/// The messenger's view of the C application.
struct FfiDispatcher(Arc<Shared>);

impl Dispatcher for FfiDispatcher {
    fn on_connect(&self, _m: &Messenger, s: SessionId, peer: SocketAddr, incoming: bool) {
        self.0.deliver(Ev::Connect(s, peer, incoming));
    }

    fn on_message(&self, _m: &Messenger, s: SessionId, msg: InMessage) {
        self.0.deliver(Ev::Message(s, msg));
    }

    fn on_send_complete(&self, _m: &Messenger, s: SessionId, id: SendId, status: Result<()>) {
        self.0.deliver(Ev::SendDone(s, id, status));
    }

    fn on_send_ready(&self, _m: &Messenger, s: SessionId) {
        self.0.deliver(Ev::Ready(s));
    }

    fn on_reset(&self, _m: &Messenger, s: SessionId, why: &Error) {
        self.0.deliver(Ev::Reset(s, why.clone()));
    }

    fn on_path(&self, _m: &Messenger, s: SessionId, path: usize, ev: &PathEvent) {
        let mut q = self.0.path_events.lock();
        if q.len() >= paths::PATH_EVENTS_KEPT {
            q.pop_front();
        }
        q.push_back(paths::PathRecord {
            session: s,
            path,
            event: ev.clone(),
            at: std::time::Instant::now(),
        });
    }
}

impl rdmx_msgr {
    fn shutdown(&mut self) {
        // Workers stop (a running callback finishes first); no event is delivered after.
        self.inner.core.shutdown();
        let handles: Vec<Handle> = self.shared.mems.lock().1.drain().map(|(_, h)| h).collect();
        for h in handles {
            let _ = self.inner.core.context().rcache().put(h);
        }
        self.shared.chunks.lock().clear();
        // Queued messages give their chunks back.
        self.shared.queue.lock().clear();
    }
}

impl Drop for rdmx_msgr {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Creates a messenger from `cfg` (NULL: defaults and `RDMX_*` environment variables): the
/// transport keys and the `msgr_*` keys (`msgr_threads`, `msgr_policy`, queue bounds,
/// windows, keepalive, reconnect backoff; `rdmx_config_dump` lists them). It has its own
/// context (provider, pools). With `on_event` NULL, events are queued for `rdmx_msgr_poll`;
/// else `on_event(user_data, m, ev)` is called for each (see `rdmx_msgr_on_event` for the
/// thread). `user_data` must stay valid until `rdmx_msgr_free` returns. Worker threads
/// (`msgr_threads` of at least 1) start here. `*out` receives a messenger the caller owns (NULL
/// on failure).
///
/// # Safety
/// `cfg` NULL or a live config; `out` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_msgr_new(
    cfg: *const rdmx_config,
    on_event: rdmx_msgr_on_event,
    user_data: *mut c_void,
    out: *mut *mut rdmx_msgr,
) -> rdmx_status {
    boundary::call("rdmx_msgr_new", || {
        let out = out_ptr(out)?;
        // SAFETY: `out` checked non-NULL and writable per the contract.
        unsafe { out.write(std::ptr::null_mut()) };
        let owned;
        // SAFETY: forwarded contract; NULL means "no config given".
        let config = match unsafe { cfg.as_ref() } {
            Some(c) => c.config(),
            None => {
                owned = Config::from_env()?;
                &owned
            }
        };
        let shared = Arc::new(Shared {
            callback: on_event.map(|f| Callback { f, user: user_data }),
            queue: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
            efd: EventFd::new()?,
            handle: AtomicPtr::new(std::ptr::null_mut()),
            chunks: Mutex::new(HashMap::new()),
            mems: Mutex::new((0, HashMap::new())),
            path_events: Mutex::new(VecDeque::new()),
        });
        let inner = Messenger::new(config, Arc::new(FfiDispatcher(Arc::clone(&shared))))?;
        let handle_slot = Arc::clone(&shared);
        let p = Box::into_raw(Box::new(rdmx_msgr { inner, shared }));
        handle_slot.handle.store(p, Ordering::Release);
        // SAFETY: as above.
        unsafe { out.write(p) };
        Ok(())
    })
}

/// Frees a messenger. NULL is a no-op. Stops the worker threads (waiting for a running
/// callback to return; no event is delivered afterwards), closes every session (no events,
/// sends never complete), frees queued events, returns lent chunks and releases
/// `rdmx_msgr_mem_reg` registrations. Messages the application holds stay valid:
/// `rdmx_msg_free` them afterwards (the pools go when the last one is freed). Refused
/// (logged, nothing freed) from inside an event callback.
///
/// # Safety
/// `m` NULL or from `rdmx_msgr_new`, not freed before, no other call on it running or
/// made afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_msgr_free(m: *mut rdmx_msgr) {
    boundary::call_value("rdmx_msgr_free", (), || {
        if m.is_null() {
            return;
        }
        if IN_CALLBACK.with(Cell::get) {
            let msg = "rdmx_msgr_free: called from an event callback: refused, nothing freed";
            log::error!(target: "rdmx::ffi", "{msg}");
            boundary::set_last_error(msg);
            return;
        }
        // SAFETY: ownership returns here exactly once, per the contract.
        drop(unsafe { Box::from_raw(m) });
    })
}

/// Listens on `addr` ("IP:PORT", port 0 = any free port) for sessions; `*port` (if not
/// NULL) receives the bound TCP port. Accepted sessions come as CONNECT events with
/// `incoming` = 1. One listener per messenger (a second call: RDMX_INVALID_ARGUMENT).
///
/// # Safety
/// `m` NULL or live; `addr` NULL or NUL-terminated; `port` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_msgr_listen(
    m: *mut rdmx_msgr,
    addr: *const c_char,
    port: *mut u16,
) -> rdmx_status {
    boundary::call("rdmx_msgr_listen", || {
        // SAFETY: forwarded contract.
        let m = unsafe { handle(m, "msgr") }?;
        // SAFETY: forwarded contract.
        let addr = unsafe { addr_arg(addr) }?;
        let a = m.inner.listen(addr)?;
        if !port.is_null() {
            // SAFETY: non-NULL and writable per the contract.
            unsafe { port.write(a.port()) };
        }
        Ok(())
    })
}

/// Opens a session to the messenger listening at `addr` ("HOST:PORT") with `policy`
/// (RDMX_POLICY_*); `*session` receives its id at once and the connection is made in the
/// background: a CONNECT event when it is open (a lossy session that cannot connect ends
/// with a RESET; a lossless one retries with backoff). Sends made meanwhile wait, within
/// the queue bounds.
///
/// # Safety
/// `m` NULL or live; `addr` NULL or NUL-terminated; `session` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_msgr_connect(
    m: *mut rdmx_msgr,
    addr: *const c_char,
    policy: u32,
    session: *mut u64,
) -> rdmx_status {
    boundary::call("rdmx_msgr_connect", || {
        let session = out_ptr(session)?;
        // SAFETY: forwarded contract.
        let m = unsafe { handle(m, "msgr") }?;
        // SAFETY: forwarded contract.
        let addr = unsafe { addr_arg(addr) }?;
        let policy = policy_arg(m, policy)?;
        let s = m.inner.connect(addr, policy)?;
        // SAFETY: checked non-NULL, writable per the contract.
        unsafe { session.write(s.0) };
        Ok(())
    })
}

/// A `policy` argument (RDMX_POLICY_*).
fn policy_arg(m: &rdmx_msgr, policy: u32) -> Result<Policy> {
    Ok(match policy {
        RDMX_POLICY_DEFAULT => m.inner.settings().policy,
        RDMX_POLICY_LOSSLESS => Policy::Lossless,
        RDMX_POLICY_LOSSY => Policy::Lossy,
        p => {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "policy {p}: expected RDMX_POLICY_DEFAULT (0), RDMX_POLICY_LOSSLESS (1) or RDMX_POLICY_LOSSY (2)"
                ),
            ));
        }
    })
}

fn ms(timeout_ms: i32) -> Duration {
    if timeout_ms < 0 {
        // "Forever", bounded: a caller loops anyway (0 events is not an error).
        Duration::from_secs(3600)
    } else {
        Duration::from_millis(timeout_ms as u64)
    }
}

/// Event records: waits up to `timeout_ms` (0: not at all, -1: until something happens)
/// for events, moves up to `max` of them into `out` and stores how many in `*n` (0 is not
/// an error; events beyond `max` stay queued). With `msgr_threads = 0` this call also makes
/// the progress (connects, accepts, sends, receives, timers): call it often (keepalives
/// and reconnects happen only inside it). The records' `text` stays valid until the next
/// `rdmx_msgr_poll` on this thread.
///
/// Callback mode: with `msgr_threads = 0` makes progress and runs the callbacks on this
/// thread (`*n` = how many ran; `out` unused, may be NULL); with worker threads
/// RDMX_INVALID_ARGUMENT. From inside a callback: RDMX_BUSY.
///
/// # Safety
/// `m` NULL or live; `out` valid for `max` records (NULL if 0); `n` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_msgr_poll(
    m: *mut rdmx_msgr,
    timeout_ms: i32,
    out: *mut rdmx_msgr_event,
    max: usize,
    n: *mut usize,
) -> rdmx_status {
    boundary::call("rdmx_msgr_poll", || {
        // SAFETY: forwarded contract.
        let m = unsafe { handle(m, "msgr") }?;
        if IN_CALLBACK.with(Cell::get) {
            return Err(Error::fixed(
                ErrorKind::Busy,
                "called from inside an event callback",
            ));
        }
        let workers = m.inner.settings().threads > 0;
        let sh = &m.shared;
        let count = if sh.callback.is_some() {
            if workers {
                return Err(Error::fixed(
                    ErrorKind::InvalidArgument,
                    "callback mode with msgr_threads > 0: the worker threads run the callbacks",
                ));
            }
            m.inner.poll(ms(timeout_ms))?
        } else {
            if max > 0 && out.is_null() {
                return Err(Error::fixed(
                    ErrorKind::InvalidArgument,
                    "out is NULL with max > 0",
                ));
            }
            if !workers {
                let wait = if sh.queue.lock().is_empty() {
                    ms(timeout_ms)
                } else {
                    Duration::ZERO
                };
                m.inner.poll(wait)?;
            }
            let mut q = sh.queue.lock();
            if workers && q.is_empty() && timeout_ms != 0 {
                let _ = sh.ready.wait_for(&mut q, ms(timeout_ms));
            }
            let k = q.len().min(max);
            let evs: Vec<Ev> = q.drain(..k).collect();
            if q.is_empty() {
                sh.efd.clear();
            }
            drop(q);
            POLL_TEXT.with(|t| {
                let mut t = t.borrow_mut();
                t.clear();
                for (i, ev) in evs.into_iter().enumerate() {
                    let mut text = None;
                    let r = record(ev, &mut text);
                    // SAFETY: `out` is valid for `max` >= `k` records per the contract.
                    unsafe { out.add(i).write(r) };
                    // The CString's buffer does not move when the Vec grows.
                    t.extend(text);
                }
            });
            k
        };
        if !n.is_null() {
            // SAFETY: non-NULL and writable per the contract.
            unsafe { n.write(count) };
        }
        Ok(())
    })
}

/// An fd for epoll/poll: readable while event records are queued (event-record mode; with
/// worker threads they queue events as they come). Drain with `rdmx_msgr_poll`
/// (timeout 0) until it returns fewer than `max`; the fd is reset when the queue empties.
/// With `msgr_threads = 0` nothing happens between `rdmx_msgr_poll` calls, so wait on the
/// fd with a timeout of at most `msgr_keepalive_ms`. -1 for a NULL messenger. Owned by the
/// messenger: do not close it.
///
/// # Safety
/// `m` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_msgr_event_fd(m: *const rdmx_msgr) -> i32 {
    boundary::call_value("rdmx_msgr_event_fd", -1, || {
        // SAFETY: forwarded contract.
        unsafe { m.as_ref() }.map_or(-1, |m| m.shared.efd.raw_fd())
    })
}

/// The UDP port the messenger's RDMA traffic uses (the soft provider's RoCEv2 port, chosen
/// by the kernel when `soft_port` is 0, or the verbs device's): what a firewall rule or a
/// fault injection must name. 0 for a NULL messenger.
///
/// # Safety
/// `m` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_msgr_udp_port(m: *const rdmx_msgr) -> u16 {
    boundary::call_value("rdmx_msgr_udp_port", 0, || {
        // SAFETY: forwarded contract.
        unsafe { m.as_ref() }.map_or(0, |m| m.inner.udp_port())
    })
}

/// Takes a chunk of the messenger's data pool (4 KiB, page-aligned, registered) to fill
/// and send as an RDMX_SEG_CHUNK segment without copy or registration. The messenger owns
/// it again once a send accepted it (it returns to the pool when the send completes);
/// give back an unsent one with `rdmx_msgr_chunk_put`. RDMX_FULL when the pool
/// (`msgr_pool_chunks`) is exhausted.
///
/// # Safety
/// `m` NULL or live; `out` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_msgr_chunk_get(
    m: *mut rdmx_msgr,
    out: *mut rdmx_chunk,
) -> rdmx_status {
    boundary::call("rdmx_msgr_chunk_get", || {
        let out = out_ptr(out)?;
        // SAFETY: forwarded contract.
        let m = unsafe { handle(m, "msgr") }?;
        let c = m.inner.alloc_chunk()?;
        let Some(ch) = c.chunk.as_ref() else {
            return Err(Error::fixed(ErrorKind::Full, "the pool gave no chunk"));
        };
        let v = rdmx_chunk {
            addr: ch.addr.cast(),
            length: ch.len as u64,
            lkey: ch.lkey,
            rkey: ch.rkey,
        };
        m.shared.chunks.lock().insert(ch.addr as usize, c);
        // SAFETY: `out` checked non-NULL and writable.
        unsafe { out.write(v) };
        Ok(())
    })
}

/// Gives back an unsent chunk from `rdmx_msgr_chunk_get` by its address. Not a lent
/// chunk (never lent, already sent or given back): RDMX_INVALID_ARGUMENT, nothing changes.
///
/// # Safety
/// `m` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_msgr_chunk_put(
    m: *mut rdmx_msgr,
    addr: *const c_void,
) -> rdmx_status {
    boundary::call("rdmx_msgr_chunk_put", || {
        // SAFETY: forwarded contract.
        let m = unsafe { handle(m, "msgr") }?;
        let c = m.shared.chunks.lock().remove(&(addr as usize));
        match c {
            Some(c) => {
                drop(c);
                Ok(())
            }
            None => Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "{addr:p} is not a chunk lent by rdmx_msgr_chunk_get (sent or given back already?)"
                ),
            )),
        }
    })
}

/// Registers `[addr, addr + len)` in the messenger's registration cache (pinning it) so
/// that RDMX_SEG_MEM segments in it are sent without copy and without a registration per
/// message. `*out` carries the registered region (maybe larger: whole pages) and its id.
/// Release with `rdmx_msgr_mem_dereg`; before unmapping the memory, let the sends naming
/// it complete, dereg, then `rdmx_msgr_mem_invalidate`. RDMX_RESOURCE_LIMIT when
/// RLIMIT_MEMLOCK refuses the pinning.
///
/// # Safety
/// `m` NULL or live; `addr` valid for `len` bytes until invalidated as above; `out` NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_msgr_mem_reg(
    m: *mut rdmx_msgr,
    addr: *mut c_void,
    len: usize,
    out: *mut rdmx_mem,
) -> rdmx_status {
    boundary::call("rdmx_msgr_mem_reg", || {
        let out = out_ptr(out)?;
        // SAFETY: forwarded contract.
        let m = unsafe { handle(m, "msgr") }?;
        // The rights the messenger asks for when it sends from registered memory, so the
        // send finds this registration in the cache.
        let rights = access::LOCAL_WRITE | access::REMOTE_READ;
        // SAFETY: the caller promises the memory contract stated above.
        let h = unsafe {
            m.inner
                .core
                .context()
                .rcache()
                .get(addr.cast(), len, rights)
        }?;
        let mut g = m.shared.mems.lock();
        g.0 += 1;
        let id = g.0;
        let v = rdmx_mem {
            addr: h.addr() as u64,
            length: h.len() as u64,
            lkey: h.lkey(),
            rkey: h.rkey(),
            id,
        };
        g.1.insert(id, h);
        drop(g);
        // SAFETY: `out` checked non-NULL and writable.
        unsafe { out.write(v) };
        Ok(())
    })
}

/// Releases a registration from `rdmx_msgr_mem_reg` (it stays cached until evicted or
/// invalidated). Released twice or never issued: RDMX_INVALID_ARGUMENT.
///
/// # Safety
/// `m` NULL or live; `mem` NULL or a live `rdmx_mem`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_msgr_mem_dereg(
    m: *mut rdmx_msgr,
    mem: *const rdmx_mem,
) -> rdmx_status {
    boundary::call("rdmx_msgr_mem_dereg", || {
        // SAFETY: forwarded contract.
        let m = unsafe { handle(m, "msgr") }?;
        // SAFETY: forwarded contract.
        let mem = unsafe { handle(mem, "mem") }?;
        let h = m.shared.mems.lock().1.remove(&mem.id).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "mem id {}: not a live registration of this messenger (released twice?)",
                    mem.id
                ),
            )
        })?;
        m.inner.core.context().rcache().put(h)
    })
}

/// Drops every cached registration overlapping `[addr, addr + len)` (call it before
/// unmapping memory that was sent from; see `rdmx_msgr_mem_reg`).
///
/// # Safety
/// `m` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_msgr_mem_invalidate(
    m: *mut rdmx_msgr,
    addr: *const c_void,
    len: usize,
) -> rdmx_status {
    boundary::call("rdmx_msgr_mem_invalidate", || {
        // SAFETY: forwarded contract.
        let m = unsafe { handle(m, "msgr") }?;
        m.inner.core.context().rcache().invalidate(addr.cast(), len);
        Ok(())
    })
}

/// Per-session counters (`rdmx_session_get_counters`), also summed over every session of a
/// messenger (`rdmx_msgr_get_totals`).
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default)]
pub struct rdmx_session_counters {
    /// Set by the caller to `sizeof` this struct before the call; rdmx fills at most that
    /// many bytes and writes back how many it filled (see "Structs that grow" at the top of
    /// this header). The order of the fields is frozen: new fields are only added at the end.
    pub struct_size: usize,
    pub msgs_sent: u64,
    pub msgs_received: u64,
    /// Front and data bytes of the messages sent / delivered.
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Messages sent again on a new connection (lossless).
    pub replays: u64,
    /// Connections after the first one (lossless).
    pub reconnects: u64,
    /// Transport faults seen (side-channel EOF, error completion, keepalive timeout,
    /// malformed header).
    pub faults: u64,
    /// Malformed headers received (each also a fault).
    pub malformed: u64,
    /// Times a message had to wait for credits.
    pub credit_stalls: u64,
    /// Sends refused with RDMX_FULL.
    pub full_refusals: u64,
    /// Bytes copied because they came from unregistered memory (RDMX_SEG_COPY).
    pub copied_bytes: u64,
    /// Data segments moved by RDMA READ (rendezvous) / in the SEND (eager).
    pub read_segments: u64,
    pub eager_segments: u64,
    pub keepalives_sent: u64,
    /// Receiver-not-ready NAKs of the session's connections: 0 in steady state.
    pub rnr_naks: u64,
    /// Messages received again after a reconnect and dropped (already delivered).
    pub duplicates_dropped: u64,
    /// Of the eager segments received, those the sender RDMA WROTE into a chunk this side
    /// granted (`msgr_eager_write`).
    pub written_segments: u64,
    /// Send-queue completions polled: one per batch of sends posted together (only the
    /// batch's last work request is signaled) and one per rendezvous READ.
    pub send_completions: u64,
    /// Immediate messages (RDMA WRITE WITH IMMEDIATE, no SEND) sent and received; the
    /// block target answers placed reads with them when the client asks.
    pub imm_sent: u64,
    pub imm_received: u64,
    /// Posts the connection's send queue took only part of (or none of): the rest went on
    /// a later pass, in order.
    pub partial_posts: u64,
    /// The peer's messages refused for breaking this side's `msgr_max_message_bytes` /
    /// `msgr_max_segments` (each ended the session).
    pub oversized: u64,
}

impl From<&SessionCounters> for rdmx_session_counters {
    fn from(c: &SessionCounters) -> Self {
        rdmx_session_counters {
            struct_size: 0,
            msgs_sent: c.msgs_sent,
            msgs_received: c.msgs_received,
            bytes_sent: c.bytes_sent,
            bytes_received: c.bytes_received,
            replays: c.replays,
            reconnects: c.reconnects,
            faults: c.faults,
            malformed: c.malformed,
            credit_stalls: c.credit_stalls,
            full_refusals: c.full_refusals,
            copied_bytes: c.copied_bytes,
            read_segments: c.read_segments,
            eager_segments: c.eager_segments,
            keepalives_sent: c.keepalives_sent,
            rnr_naks: c.rnr_naks,
            duplicates_dropped: c.duplicates_dropped,
            written_segments: c.written_segments,
            send_completions: c.send_completions,
            imm_sent: c.imm_sent,
            imm_received: c.imm_received,
            partial_posts: c.partial_posts,
            oversized: c.oversized,
        }
    }
}

/// Messenger-wide figures.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default)]
pub struct rdmx_msgr_stats {
    /// Set by the caller to `sizeof` this struct before the call; rdmx fills at most that
    /// many bytes and writes back how many it filled (see "Structs that grow" at the top of
    /// this header). The order of the fields is frozen: new fields are only added at the end.
    pub struct_size: usize,
    /// Sessions not closed; accepted connections not handshaken yet.
    pub sessions: u64,
    pub pending_connections: u64,
    /// The 4 KiB data pool: chunks in use (posted receives, queued and unacknowledged
    /// sends, lent chunks, received data the application holds), carved, and the bound.
    pub data_chunks_in_use: u32,
    pub data_chunks_total: u32,
    pub data_chunks_cap: u32,
    /// Header slots in use (one per posted receive and SEND in flight).
    pub header_slots_in_use: u32,
    /// 64 KiB chunks in use for copies of large unregistered segments.
    pub copy_chunks_in_use: u32,
    /// Event records queued for `rdmx_msgr_poll`.
    pub events_queued: u32,
    /// Chunks lent by `rdmx_msgr_chunk_get` and not sent or given back.
    pub chunks_lent: u32,
    /// Live `rdmx_msgr_mem_reg` registrations.
    pub mem_registrations: u32,
    /// Malformed headers on connections that were not (yet) a session's.
    pub malformed: u64,
    /// Times a progress loop slept at once instead of polling because its thread had been
    /// waiting for a CPU (a host with busy cores; see the `poll_mode` and `polling_us` keys).
    pub spin_backoffs: u64,
    /// Sessions the progress passes look at now; the others are parked (idle: open,
    /// nothing to do; a completion, their keepalive or a call wakes them).
    pub active_sessions: u64,
    /// Parked sessions found with work by the periodic look instead of being woken (0
    /// unless a wake was missed; each cost up to 100 ms).
    pub missed_wakes: u64,
    /// The listener's peers that failed authentication (wrong key, unknown entity, no or
    /// unwanted authentication, replay, reflection).
    pub auth_failures: u64,
    /// Connections refused at a handshake bound (`handshake_max`, `handshake_per_source`)
    /// or for a malformed auth frame.
    pub handshake_refusals: u64,
    /// Connections dropped for not sending an auth frame within `handshake_first_bytes_ms`.
    pub handshake_timeouts: u64,
    /// Links and sessions refused by `msgr_max_pending_links`, `msgr_max_sessions`,
    /// `msgr_max_sessions_per_entity`, or for resuming another entity's session.
    pub session_refusals: u64,
    /// Messenger callbacks that panicked inside rdmx (a C callback cannot panic; rdmx's
    /// side of the call can, on a bug): each was caught (the worker thread lives on),
    /// logged at error level, and ended its session (RDMX_MSGR_EVENT_RESET). 0 normally.
    pub dispatcher_panics: u64,
    /// Worker threads whose loop panicked outside the callbacks (a bug in rdmx): each was
    /// caught, logged at error level, reset the sessions of its shard
    /// (RDMX_MSGR_EVENT_RESET), and the worker went on. 0 normally.
    pub worker_panics: u64,
}

/// The messenger's figures: pools (to check they are back at their baseline), sessions,
/// handshakes (the sessions' summed counters: `rdmx_msgr_get_totals`).
///
/// # Safety
/// `m` NULL or live; `out` NULL, or its `struct_size` set and writable for that many bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_msgr_get_stats(
    m: *const rdmx_msgr,
    out: *mut rdmx_msgr_stats,
) -> rdmx_status {
    boundary::call("rdmx_msgr_get_stats", || {
        // SAFETY: forwarded contract.
        let m = unsafe { handle(m, "msgr") }?;
        let s = m.inner.stats();
        let v = rdmx_msgr_stats {
            struct_size: 0,
            sessions: s.sessions as u64,
            pending_connections: s.pending_connections as u64,
            data_chunks_in_use: s.data_pool.chunks_in_use,
            data_chunks_total: s.data_pool.chunks_total,
            data_chunks_cap: s.data_pool.chunks_cap,
            header_slots_in_use: s.header_pool.chunks_in_use,
            copy_chunks_in_use: s.copy_chunks_in_use,
            events_queued: m.shared.queue.lock().len() as u32,
            chunks_lent: m.shared.chunks.lock().len() as u32,
            mem_registrations: m.shared.mems.lock().1.len() as u32,
            malformed: s.malformed,
            spin_backoffs: s.spin_backoffs,
            active_sessions: s.active_sessions as u64,
            missed_wakes: s.missed_wakes,
            auth_failures: s.auth_failures,
            handshake_refusals: s.handshake_refusals,
            handshake_timeouts: s.handshake_timeouts,
            session_refusals: s.session_refusals,
            dispatcher_panics: s.dispatcher_panics,
            worker_panics: s.worker_panics,
        };
        // SAFETY: `out` is NULL or writable for its `struct_size` bytes per the contract.
        unsafe { write_sized(out, v) }?;
        Ok(())
    })
}

/// The counters of every session the messenger ever made (closed ones included), summed.
///
/// # Safety
/// `m` NULL or live; `out` NULL, or its `struct_size` set and writable for that many bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_msgr_get_totals(
    m: *const rdmx_msgr,
    out: *mut rdmx_session_counters,
) -> rdmx_status {
    boundary::call("rdmx_msgr_get_totals", || {
        // SAFETY: forwarded contract.
        let m = unsafe { handle(m, "msgr") }?;
        let v = (&m.inner.stats().totals).into();
        // SAFETY: `out` is NULL or writable for its `struct_size` bytes per the contract.
        unsafe { write_sized(out, v) }
    })
}

sized_out!(rdmx_session_counters, rdmx_msgr_stats);
