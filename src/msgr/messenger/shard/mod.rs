//! The messenger's core: sessions spread over shards, each driven by one thread (a worker,
//! or the caller of `poll`); progress passes; connection attempts on helper threads; the
//! accept path; callback dispatch outside every lock. One job per file:
//!
//! - `mod.rs` (here): the [`Core`] and its shards' state, start and shutdown, links made
//!   from connections;
//! - `api.rs`: what [`Messenger`](super::Messenger) calls: listen, connect, send, close,
//!   session info, fault injection;
//! - `driver.rs`: the worker loop, `poll`, a progress pass over a shard, callback dispatch;
//! - `sleep.rs`: an idle thread's sleep on its links, sockets, wake fd and listener;
//! - `connect.rs`: outgoing connection attempts (helper threads) becoming links;
//! - `accept.rs`: accepted connections waiting for their hello (admission, deadline);
//! - `peers.rs`: an accepted hello matched to its session by the peer's session id and
//!   incarnation (resume, new session, a restarted peer's sessions reset);
//! - `stats.rs`: the messenger-wide figures.
//!
//! Locks (docs/locking.md): a shard's state, then (inside it) a session's submit gate, the
//! listener, the peer index and the hook's table. `send` takes no shard's state, only its
//! session's gate (`submit.rs`). Callbacks run with no lock held, so they may call back
//! into the messenger.
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::msgr::spin::Spinner;
use crate::msgr::{ConnectCancel, Connection, Context, Listener};
use crate::provider::sys::{EventFd, random_u64};
use parking_lot::{Mutex, RwLock};
use rustc_hash::FxHashMap;
use smallvec::SmallVec;
use std::cell::Cell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::admit::Admission;
use super::buffers::Buffers;
use super::credits::Credits;
use super::link::{Link, LinkEvent, RecvSlot};
use super::machine::{HelloId, MAX_PATHS, Machine, Rules, Shape};
use super::park::{PARK_AFTER, Parking, ReadyList};
use super::session::{CLOSE_DRAIN, Event, OutMsg, Session};
use super::settings::{MsgrSettings, adjust};
use super::submit::Gate;
use super::types::*;
use super::wire::{self, FRONT_MAX, Header, Kind, MAX_SEGS, PAYLOAD_MAX, flags};
use super::{Messenger, Owner};

mod accept;
mod api;
mod connect;
mod driver;
mod peers;
mod sleep;
mod stats;

/// Completions taken per link per pass (fairness between sessions).
const POLL_BUDGET: usize = 256;
/// An accepted connection must say hello within this.
const HELLO_DEADLINE: Duration = Duration::from_secs(10);
/// Longest sleep of an idle thread (timers are checked at least this often).
const MAX_SLEEP: Duration = Duration::from_millis(10);
/// How often a busy shard 0 looks for new connections (an idle one wakes on them).
const ACCEPT_EVERY: Duration = Duration::from_millis(1);
/// A thread sleeps on the receiving sockets itself (see [`Core::sleep`]) within this of
/// its shard's last event; after it, the provider's progress thread watches them again
/// (while a thread watches, the progress thread looks every millisecond instead of
/// sleeping: fine while traffic flows, wasteful for an idle process).
const WATCH_AFTER: Duration = Duration::from_millis(100);

thread_local! {
    /// Set while this thread runs a callback of some messenger.
    static IN_CALLBACK: Cell<bool> = const { Cell::new(false) };
    /// The shard this thread drives as a worker (its core's address and the shard index;
    /// 0 when none): a send from it needs no wake-up, its next pass takes the message.
    static WORKER_OF: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
    /// Receives the on-connect hook posted on this thread, by the connection's event fd.
    /// The hook runs on the thread that called connect or accept, so that thread takes
    /// them back when the call returns, whether it succeeded or not (a setup that failed
    /// after the hook dropped its connection: the chunks are free again).
    static HOOKED: std::cell::RefCell<Vec<(RawFd, Vec<RecvSlot>)>> =
        const { std::cell::RefCell::new(Vec::new()) };
    /// The event list of this thread's last dispatch, emptied, for its next pass (a pass
    /// with messages otherwise grows a new one by doublings).
    static SPARE_EVENTS: Cell<Vec<Event>> = const { Cell::new(Vec::new()) };
}

/// The largest event list kept for reuse (a burst's list is freed).
const SPARE_EVENTS_MAX: usize = 1024;

/// Takes the receives the hook posted on this thread: those of `conn` (if any), the rest
/// (of connections that failed their setup) released.
fn take_hooked(bufs: &Buffers, conn: Option<&Connection>) -> Option<Vec<RecvSlot>> {
    let all = HOOKED.with(|h| std::mem::take(&mut *h.borrow_mut()));
    let mut mine = None;
    for (fd, slots) in all {
        if mine.is_none() && conn.is_some_and(|c| c.event_fd() == fd) {
            mine = Some(slots);
        } else {
            release_slots(bufs, slots);
        }
    }
    mine
}

/// An accepted link waiting for its hello, with its credits (the session machine takes
/// them over with the link: `Machine::accept_link`).
struct Pending {
    link: Link,
    credits: Credits,
    deadline: Instant,
}

#[derive(Default)]
struct ShardState {
    /// By our session id (FxHash: looked up per pass; the ids are ours, not a peer's).
    sessions: FxHashMap<u64, Session>,
    pending: Vec<Pending>,
    closing: Vec<(Link, Instant)>,
    /// Accepted links whose hello names a session of this shard (moved from another).
    incoming: Vec<(Link, Credits, Header)>,
    /// Events made outside a pass (close_session, a send to a session that just ended).
    queued: Vec<Event>,
    /// Shard 0: when the next pass looks for accepted connections (None: now). A look
    /// costs an accept(2) that fails, so a busy pass looks every [`ACCEPT_EVERY`]; the
    /// sleep watches the listener and asks for a look when it fires.
    next_accept: Option<Instant>,
    /// The value of [`Core::restarts`] this shard last told its sessions of.
    restarts_seen: u64,
    /// Which sessions a pass looks at (the others are parked).
    park: Parking,
    /// Scratch of a pass, kept to be reused: the ids taken from [`Shard::submitted`], and
    /// what a link's poll found.
    submitted_ids: Vec<u64>,
    link_events: Vec<LinkEvent>,
}

struct Shard {
    /// Held by the pass for its whole run, and by the calls that change sessions (connect,
    /// close, info): never by `send`.
    st: Mutex<ShardState>,
    /// The submit gates of this shard's sessions, by session id: `send` looks its session
    /// up here (a read lock held for the lookup only), never in `st`. Written with `st`
    /// held, when a session is added or removed.
    gates: RwLock<FxHashMap<u64, Arc<Gate>>>,
    /// Sessions with sends at their gate since the pass last looked (a leaf lock, held for
    /// a push or a swap).
    submitted: Mutex<Vec<u64>>,
    /// Wakes the shard's thread.
    wake: EventFd,
    /// When a pass of this shard last found something to do (ns since the core's epoch).
    last_event: AtomicU64,
    /// Parked sessions whose link had a completion (fed by their CQs' hooks).
    ready: Arc<ReadyList>,
}

pub(crate) struct Core {
    settings: MsgrSettings,
    /// What the session machines read of the settings.
    rules: Rules,
    ctx: Context,
    bufs: Arc<Buffers>,
    dispatcher: super::guard::GuardedDispatcher,
    shards: Vec<Shard>,
    listener: Mutex<Option<Listener>>,
    /// Accepting side: the peer's session id -> ours.
    by_peer: Mutex<HashMap<u64, u64>>,
    /// This messenger's incarnation (random, non-zero), sent in the connecting side's
    /// hello with the port it listens on: together with the IP the acceptor sees, the
    /// messenger's identity across restarts (Ceph's entity address + nonce).
    incarnation: u64,
    /// Accepting side: a connecting messenger's address (IP, listening port) and
    /// authenticated entity -> the incarnation that last said hello from it. The entity is
    /// part of the key, so only a peer holding that entity's key can reset its sessions.
    entities: Mutex<HashMap<(SocketAddr, Option<String>), u64>>,
    /// Bounds on pending links and sessions; the entity of each session.
    admit: Admission,
    /// Tests only ([`Core::connect_claiming`]): session id -> the peer id its hellos claim.
    claims: Mutex<HashMap<u64, u64>>,
    /// Bumped when a newer incarnation appeared at an address: every shard then tells
    /// its sessions ([`Core::tell_incarnations`]; the machines of the older one's reset).
    restarts: AtomicU64,
    owner: OnceLock<Weak<Owner>>,
    me: OnceLock<Weak<Core>>,
    stopping: AtomicBool,
    workers: Mutex<Vec<JoinHandle<()>>>,
    /// Connection attempts running on helper threads (lossless reconnects, first
    /// connects): cancelled and joined at shutdown, so that no thread keeps the core (and
    /// its context, pools and provider thread) alive after the messenger is gone.
    attempts: Mutex<Vec<(Arc<ConnectCancel>, JoinHandle<()>)>>,
    totals: Mutex<SessionCounters>,
    malformed: AtomicU64,
    /// Spins given up because the polling thread was waiting for a CPU (`msgr::spin`).
    spin_backoffs: AtomicU64,
    /// The polling state of `poll` (the application's thread, msgr_threads = 0).
    poll_spin: Mutex<Spinner>,
    next_shard: AtomicUsize,
    epoch: Instant,
    /// Tests only: runs twice in every pass, with the shard's state locked (`tests.rs`: a
    /// pass held up there must not hold up `send`).
    #[cfg(test)]
    pass_hook: Mutex<Option<PassHook>>,
}

/// Where in a pass the test hook runs: at its start (before the sends at the gates are
/// taken), and after its sessions were driven (before the ended ones are removed).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PassStage {
    Start,
    Driven,
}

#[cfg(test)]
type PassHook = Arc<dyn Fn(PassStage, &ShardState) + Send + Sync>;

#[cfg(test)]
mod tests;

fn closed(what: &str) -> Error {
    Error::new(ErrorKind::Closed, format!("{what}: the session is closed"))
}

impl Core {
    pub fn new(config: &Config, dispatcher: Arc<dyn Dispatcher>) -> Result<Arc<Core>> {
        let config = adjust(config)?;
        let settings = MsgrSettings::from_config(&config)?;
        let admit = Admission::from_config(&config)?;
        let ctx = Context::new(&config)?;
        // Answers go from the thread that polled (they carry the RC ACKs of what it
        // received), and that thread receives: the progress thread keeps out of its way.
        ctx.set_app_driven(true);
        // Peers learn what this side accepts in one message (the hello's FLAG_LIMITS) and
        // refuse at their `send` what it would refuse on receipt.
        ctx.set_hello_limits(Some(settings.limits.to_wire()));
        let bufs = Arc::new(Buffers::new(
            &ctx,
            settings.pool_chunks,
            settings.eager_write,
        )?);
        let nshards = settings.threads.max(1);
        let mut shards = Vec::with_capacity(nshards);
        for _ in 0..nshards {
            shards.push(Shard {
                st: Mutex::new(ShardState::default()),
                gates: RwLock::default(),
                submitted: Mutex::default(),
                wake: EventFd::new()?,
                last_event: AtomicU64::new(0),
                ready: Arc::default(),
            });
        }
        {
            let bufs = Arc::clone(&bufs);
            let n = settings.recv_window_min;
            ctx.set_on_connect(Some(Arc::new(move |conn: &Connection| {
                let (slots, err) = Link::post_initial(conn, n, &bufs.data, &bufs.slots);
                HOOKED.with(|h| h.borrow_mut().push((conn.event_fd(), slots)));
                err.map_or(Ok(()), Err)
            })));
        }
        let spin = settings.spin;
        let core = Arc::new(Core {
            rules: Rules::from_settings(&settings),
            settings,
            ctx,
            bufs,
            dispatcher: super::guard::GuardedDispatcher::new(dispatcher),
            shards,
            listener: Mutex::new(None),
            by_peer: Mutex::new(HashMap::new()),
            incarnation: random_u64().max(1),
            entities: Mutex::new(HashMap::new()),
            admit,
            claims: Mutex::new(HashMap::new()),
            restarts: AtomicU64::new(0),
            owner: OnceLock::new(),
            me: OnceLock::new(),
            stopping: AtomicBool::new(false),
            workers: Mutex::new(Vec::new()),
            attempts: Mutex::new(Vec::new()),
            totals: Mutex::new(SessionCounters::default()),
            malformed: AtomicU64::new(0),
            spin_backoffs: AtomicU64::new(0),
            poll_spin: Mutex::new(Spinner::new(spin)),
            next_shard: AtomicUsize::new(0),
            epoch: Instant::now(),
            #[cfg(test)]
            pass_hook: Mutex::new(None),
        });
        let _ = core.me.set(Arc::downgrade(&core));
        Ok(core)
    }

    /// Called once the owner exists: records it and starts the workers.
    pub(super) fn start(self: &Arc<Core>, owner: &Arc<Owner>) -> Result<()> {
        let _ = self.owner.set(Arc::downgrade(owner));
        if self.settings.threads == 0 {
            return Ok(());
        }
        let mut workers = self.workers.lock();
        for i in 0..self.settings.threads {
            let core = Arc::clone(self);
            let h = std::thread::Builder::new()
                .name(format!("rdmx-msgr-{i}"))
                .spawn(move || {
                    let fault = |e: &Error| core.end_shard_sessions(i, e);
                    core.dispatcher.keep_running(i, || core.worker(i), fault)
                })
                .map_err(|e| Error::new(ErrorKind::Io, format!("messenger: worker thread: {e}")))?;
            workers.push(h);
        }
        Ok(())
    }

    pub fn shutdown(&self) {
        self.stopping.store(true, Ordering::Release);
        for s in &self.shards {
            s.wake.signal();
        }
        let me = std::thread::current().id();
        for h in self.workers.lock().drain(..) {
            if h.thread().id() != me {
                let _ = h.join();
            }
        }
        // Cancelled attempts end at once (their connect or handshake is woken).
        let attempts: Vec<_> = self.attempts.lock().drain(..).collect();
        for (cancel, _) in &attempts {
            cancel.cancel();
        }
        for (_, h) in attempts {
            if h.thread().id() != me {
                let _ = h.join();
            }
        }
        for s in &self.shards {
            let mut st = s.st.lock();
            s.gates.write().clear();
            for (_, mut sess) in st.sessions.drain() {
                // No callbacks run now: what waited at the gate is released with it.
                let mut ev = Vec::new();
                sess.close_gate(&mut ev);
                sess.link = None;
                sess.standby.clear();
                self.add_totals(&sess);
            }
            st.pending.clear();
            st.closing.clear();
            st.incoming.clear();
            st.queued.clear();
        }
        *self.listener.lock() = None;
        self.ctx.set_on_connect(None);
    }

    fn shard_of(&self, id: u64) -> Option<&Shard> {
        self.shards.get((id & 0xff) as usize)
    }

    /// Adds session `s` to its shard, whose state `st` the caller holds locked: sends find
    /// it from now on.
    fn insert_session(&self, st: &mut ShardState, s: Session) {
        let id = s.id();
        if let Some(shard) = self.shard_of(id) {
            shard.gates.write().insert(id, Arc::clone(&s.gate));
        }
        st.sessions.insert(id, s);
    }

    /// Takes session `id` out of its shard (state `st` locked): sends find it no more; its
    /// gate is closed into `ev` (see `Session::close_gate`).
    fn remove_session(&self, st: &mut ShardState, id: u64, ev: &mut Vec<Event>) -> Option<Session> {
        if let Some(shard) = self.shard_of(id) {
            shard.gates.write().remove(&id);
        }
        let mut sess = st.sessions.remove(&id)?;
        sess.close_gate(ev);
        Some(sess)
    }

    fn new_id(&self, shard: usize) -> u64 {
        loop {
            let id = (random_u64() << 8) | shard as u64;
            if id >> 8 != 0 {
                return id;
            }
        }
    }

    /// SGEs per send work request (as `Link::new` takes them).
    fn max_sge(&self) -> usize {
        (self.settings.max_send_sge as usize).max(2)
    }

    /// A link over an accepted or made connection, and its credits (the receives the
    /// on-connect hook posted).
    fn link_from(&self, conn: Connection, slots: Vec<RecvSlot>) -> (Link, Credits) {
        let s = &self.settings;
        let credits = self.rules.credits(slots.len() as u32);
        let mut link = Link::new(
            conn,
            slots,
            Arc::clone(&self.bufs.data),
            Arc::clone(&self.bufs.slots),
            s.max_send_wr as usize,
            s.max_send_sge as usize,
        );
        link.eager_write = s.eager_write;
        (link, credits)
    }

    /// Session `id`'s new link tells its shard when a completion lands in its empty CQs
    /// (`park.rs`): the session may then be parked while quiet.
    fn hook_link(&self, link: &mut Link, id: u64) {
        if let Some(shard) = self.shard_of(id) {
            link.parkable = link.conn.on_first_completion(shard.ready.hook(id));
        }
    }

    fn forget(&self, sess: &Session) {
        if sess.m.incoming && sess.m.peer_id != 0 {
            self.by_peer.lock().remove(&sess.m.peer_id);
        }
        self.admit.forget(sess.id());
        self.add_totals(sess);
    }
}

fn release_slots(bufs: &Buffers, slots: Vec<RecvSlot>) {
    for s in slots {
        let _ = bufs.slots.put(s.hdr);
        let _ = bufs.data.put(s.data);
    }
}
