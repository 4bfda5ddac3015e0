//! The messenger's core: sessions spread over shards, each driven by one thread (a worker,
//! or the caller of `poll`); progress passes; connection attempts on helper threads; the
//! accept path; callback dispatch outside every lock.
//!
//! Locks: a shard's state, then (inside it) the listener, the peer index and the hook's
//! table. Callbacks run with no lock held, so they may call back into the messenger.

use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::msgr::spin::Spinner;
use crate::msgr::{ConnectCancel, Connection, Context, Listener};
use parking_lot::Mutex;
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
use super::machine::{HelloId, Machine, Rules, Shape};
use super::park::{PARK_AFTER, Parking, ReadyList};
use super::session::{CLOSE_DRAIN, Event, OutMsg, Session};
use super::settings::MsgLimits;
use super::settings::{MsgrSettings, adjust};
use super::types::*;
use super::wire::{self, FRONT_MAX, Header, Kind, MAX_SEGS, PAYLOAD_MAX, flags};
use super::{Messenger, Owner};

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
    /// By our session id (FxHash: looked up per send; the ids are ours, not a peer's).
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
}

struct Shard {
    st: Mutex<ShardState>,
    wake: Wake,
    /// When a pass of this shard last found something to do (ns since the core's epoch).
    last_event: AtomicU64,
    /// Parked sessions whose link had a completion (fed by their CQs' hooks).
    ready: Arc<ReadyList>,
}

/// An eventfd that wakes a shard's thread.
struct Wake(RawFd);

impl Wake {
    fn new() -> Result<Wake> {
        // SAFETY: eventfd(2) with valid flags; the fd is owned by the returned value.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::new(
                ErrorKind::Io,
                format!("messenger: eventfd: {}", std::io::Error::last_os_error()),
            ));
        }
        Ok(Wake(fd))
    }

    fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our eventfd.
        let _ = unsafe { libc::write(self.0, (&one as *const u64).cast(), 8) };
    }

    fn clear(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64 from our non-blocking eventfd.
        let _ = unsafe { libc::read(self.0, (&mut v as *mut u64).cast(), 8) };
    }
}

impl Drop for Wake {
    fn drop(&mut self) {
        // SAFETY: closes the fd this value owns, once.
        unsafe { libc::close(self.0) };
    }
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
}

fn random_u64() -> u64 {
    let mut v = 0u64;
    // SAFETY: getrandom writes at most 8 bytes into a valid u64.
    let n = unsafe { libc::getrandom((&mut v as *mut u64).cast(), 8, 0) };
    if n != 8 {
        // Not secret, only distinct: time and address entropy will do.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        v = t ^ (&v as *const u64 as u64).rotate_left(32) ^ u64::from(std::process::id());
    }
    v
}

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
                wake: Wake::new()?,
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
                .spawn(move || core.worker(i))
                .map_err(|e| Error::new(ErrorKind::Io, format!("messenger: worker thread: {e}")))?;
            workers.push(h);
        }
        Ok(())
    }

    fn worker(&self, i: usize) {
        WORKER_OF.with(|w| w.set((self as *const Core as usize, i)));
        let mut spin = Spinner::new(self.settings.spin);
        while !self.stopping.load(Ordering::Acquire) {
            let ev = self.pass(i);
            let n = ev.len();
            self.dispatch(ev);
            if n > 0 {
                spin.work();
                continue;
            }
            // Nothing happened: poll on for the spin budget (`poll_mode`/`polling_us`,
            // not while the thread waits for a CPU), then sleep on the connections' event fds.
            if self.poll_again(&mut spin, Instant::now()) {
                std::hint::spin_loop();
            } else {
                self.sleep(i, MAX_SLEEP);
                spin.slept();
            }
        }
        WORKER_OF.with(|w| w.set((0, 0)));
    }

    /// After an empty pass at `now`: whether to poll again rather than sleep (see
    /// `Spinner`).
    fn poll_again(&self, spin: &mut Spinner, now: Instant) -> bool {
        if spin.poll_again(now) {
            return true;
        }
        let backoffs = spin.take_backoffs();
        if backoffs > 0 {
            self.spin_backoffs.fetch_add(backoffs, Ordering::Relaxed);
        }
        false
    }

    /// Whether this thread is the worker of shard `i` of this messenger.
    fn on_worker_of(&self, i: usize) -> bool {
        WORKER_OF.with(Cell::get) == (self as *const Core as usize, i)
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
            for (_, mut sess) in st.sessions.drain() {
                sess.link = None;
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

    fn add_totals(&self, s: &Session) {
        let mut t = self.totals.lock();
        add_counters(&mut t, &s.m.counters);
    }

    fn shard_of(&self, id: u64) -> Option<&Shard> {
        self.shards.get((id & 0xff) as usize)
    }

    fn new_id(&self, shard: usize) -> u64 {
        loop {
            let id = (random_u64() << 8) | shard as u64;
            if id >> 8 != 0 {
                return id;
            }
        }
    }

    pub fn listen(&self, addr: &str) -> Result<SocketAddr> {
        let mut g = self.listener.lock();
        if g.is_some() {
            return Err(Error::fixed(
                ErrorKind::InvalidArgument,
                "messenger: already listening (one listener per messenger)",
            ));
        }
        let l = self.ctx.listen(addr)?;
        let a = l.local_addr();
        *g = Some(l);
        Ok(a)
    }

    /// [`Core::connect`] whose hellos claim `claimed` as this side's session id (a
    /// takeover attempt: tests of the accepting side's entity check).
    pub fn connect_claiming(&self, addr: &str, policy: Policy, claimed: u64) -> Result<SessionId> {
        let s = self.connect(addr, policy)?;
        self.claims.lock().insert(s.0, claimed);
        Ok(s)
    }

    pub fn connect(&self, addr: &str, policy: Policy) -> Result<SessionId> {
        if self.stopping.load(Ordering::Acquire) {
            return Err(Error::fixed(ErrorKind::Closed, "messenger: shut down"));
        }
        // Refuse a malformed address now rather than on the helper thread.
        let peer = std::net::ToSocketAddrs::to_socket_addrs(addr)
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidArgument,
                    format!("connect: address '{addr}' (expected HOST:PORT)"),
                )
            })?;
        let shard = self.next_shard.fetch_add(1, Ordering::Relaxed) % self.shards.len();
        let id = self.new_id(shard);
        let m = Machine::new(self.rules, id, policy, false, Instant::now());
        let mut s = Session::new(m);
        s.addr = Some(addr.to_string());
        s.peer = Some(peer);
        {
            let mut st = self.shards[shard].st.lock();
            let st = &mut *st;
            st.sessions.insert(id, s);
            st.park.wake(&mut st.sessions, id);
        }
        self.shards[shard].wake.signal();
        Ok(SessionId(id))
    }

    /// SGEs per send work request (as `Link::new` takes them).
    fn max_sge(&self) -> usize {
        (self.settings.max_send_sge as usize).max(2)
    }

    pub fn send(&self, s: SessionId, msg: OutMessage) -> std::result::Result<SendId, Refused> {
        let refuse = |error: Error, msg: OutMessage| Refused {
            error,
            msg: Box::new(msg),
        };
        let Some(shard) = self.shard_of(s.0) else {
            return Err(refuse(closed("send"), msg));
        };
        if let Err(e) = self.check_shape(&msg) {
            return Err(refuse(e, msg));
        }
        let bytes = (msg.front.len()
            + msg.data.iter().map(Payload::len).sum::<usize>()
            + msg.writes.iter().map(|w| w.data.len()).sum::<usize>()) as u64;
        {
            let mut st = shard.st.lock();
            let Some(sess) = st.sessions.get_mut(&s.0) else {
                return Err(refuse(closed("send"), msg));
            };
            // The machine's checks before the payload is prepared (closed, WRITEs on a
            // lossless session, the send-queue bound); `enqueue` checks again after.
            let first = Shape {
                msg_type: msg.msg_type,
                imm: msg.imm,
                bytes,
                writes: msg.writes.len() as u32,
                ..Shape::default()
            };
            if let Err(e) = sess.m.admit(&first) {
                return Err(refuse(e, msg));
            }
            // The peer's advertised limits (its hello on the current or the last link):
            // what it would refuse, and end the session for, is refused here.
            if let Some(l) = sess.link().and_then(|l| l.conn.peer_limits()) {
                sess.peer_limits = Some(MsgLimits::from_wire(l));
            }
            if let Some(peer) = sess.peer_limits {
                let bytes: u64 = msg.data.iter().map(|p| p.len() as u64).sum();
                if let Err(e) = peer.check_send(msg.data.len(), bytes) {
                    let e = Error::new(
                        e.kind(),
                        format!("{} (the peer's advertised limit)", e.message()),
                    );
                    return Err(refuse(e, msg));
                }
            }
        }
        // Copies and registrations outside the lock.
        let OutMessage {
            msg_type,
            front,
            data,
            writes: wr_in,
            imm,
        } = msg;
        // A refused message goes back as it came (its payloads are released).
        let back = |front| OutMessage {
            imm,
            ..OutMessage::new(msg_type, front)
        };
        let mut segs = Vec::with_capacity(data.len());
        let mut copied = 0;
        for p in data {
            match self.bufs.prepare(p) {
                Ok((seg, c)) => {
                    copied += c;
                    segs.push(seg);
                }
                Err(e) => {
                    // The payloads prepared so far are released with `segs`.
                    return Err(refuse(e, back(front)));
                }
            }
        }
        let mut writes = Vec::with_capacity(wr_in.len());
        for w in wr_in {
            match self.bufs.prepare(w.data) {
                Ok((seg, c)) => {
                    copied += c;
                    writes.push(super::link::TxWrite {
                        seg,
                        addr: w.addr,
                        rkey: w.rkey,
                    });
                }
                Err(e) => {
                    return Err(refuse(e, back(front)));
                }
            }
        }
        let max_sge = self.max_sge();
        let need =
            usize::from(imm.is_none()) + writes.iter().map(|w| w.wrs(max_sge)).sum::<usize>();
        if need > self.settings.max_send_wr as usize / 2 {
            return Err(refuse(
                Error::new(
                    ErrorKind::InvalidArgument,
                    format!(
                        "send: the message's RDMA WRITEs take {} work requests; at most {} \
                         (half of max_send_wr): fewer or registered (one-part) sources",
                        need - usize::from(imm.is_none()),
                        self.settings.max_send_wr as usize / 2 - 1
                    ),
                ),
                back(front),
            ));
        }
        let out = OutMsg {
            front,
            segs,
            writes,
        };
        let shape = out.shape(msg_type, imm, bytes, self.settings.eager_max, max_sge);
        let mut st = shard.st.lock();
        let Some(sess) = st.sessions.get_mut(&s.0) else {
            return Err(refuse(closed("send"), back(out.front)));
        };
        // Checked again under this lock: another thread's send may have filled the queue
        // meanwhile (or the session ended).
        let seq = match sess.m.enqueue(out, shape) {
            Ok(seq) => seq,
            Err((out, e)) => return Err(refuse(e, back(out.front))),
        };
        sess.m.counters.copied_bytes += copied;
        let g = &mut *st;
        g.park.wake(&mut g.sessions, s.0);
        drop(st);
        if self.settings.threads > 0 && !self.on_worker_of((s.0 & 0xff) as usize) {
            shard.wake.signal();
        }
        Ok(seq)
    }

    /// Refuses what the wire cannot carry, before anything is consumed.
    fn check_shape(&self, msg: &OutMessage) -> Result<()> {
        match msg.imm {
            None if msg.msg_type == MSG_TYPE_IMM => {
                return Err(Error::fixed(
                    ErrorKind::InvalidArgument,
                    "send: message type 0xffff is reserved for immediate messages \
                     (OutMessage::immediate)",
                ));
            }
            Some(_)
                if msg.msg_type != MSG_TYPE_IMM
                    || !msg.front.is_empty()
                    || !msg.data.is_empty()
                    || msg.writes.is_empty() =>
            {
                return Err(Error::fixed(
                    ErrorKind::InvalidArgument,
                    "send: an immediate message has no front and no data segments, and at \
                     least one RDMA WRITE (its value rides on the last)",
                ));
            }
            _ => {}
        }
        if msg.writes.len() > wire::MAX_WRITES {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "send: {} RDMA WRITEs before one message; at most {}",
                    msg.writes.len(),
                    wire::MAX_WRITES
                ),
            ));
        }
        if msg.front.len() > FRONT_MAX || msg.data.len() > MAX_SEGS {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "send: front of {} bytes and {} segments; at most {FRONT_MAX} and {MAX_SEGS}",
                    msg.front.len(),
                    msg.data.len()
                ),
            ));
        }
        let bytes: u64 = msg.data.iter().map(|p| p.len() as u64).sum();
        self.settings.limits.check_send(msg.data.len(), bytes)?;
        let mut block = msg.front.len().next_multiple_of(8);
        for p in &msg.data {
            let parts = match p {
                Payload::Chunk(_) | Payload::Registered(_) => 1,
                Payload::Received(r) => super::buffers::runs(&r.chunks),
                Payload::Copy(_) | Payload::CopyFrom(_) if p.len() <= PAYLOAD_MAX => 1,
                Payload::Copy(_) | Payload::CopyFrom(_) => p.len().div_ceil(64 << 10),
            };
            block += wire::SEG_ENTRY + wire::PART_ENTRY * parts;
        }
        if block > PAYLOAD_MAX {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "send: the message's descriptors take {block} bytes; at most {PAYLOAD_MAX} \
                     (fewer segments, or registered memory: one descriptor per segment)"
                ),
            ));
        }
        Ok(())
    }

    pub fn alloc_chunk(&self) -> Result<TxChunk> {
        self.bufs.alloc()
    }

    pub fn poll(&self, timeout: Duration) -> Result<usize> {
        if self.settings.threads > 0 {
            return Err(Error::fixed(
                ErrorKind::InvalidArgument,
                "poll: the messenger runs worker threads (msgr_threads > 0)",
            ));
        }
        if IN_CALLBACK.with(Cell::get) {
            return Err(Error::fixed(
                ErrorKind::Busy,
                "poll: called from inside a messenger callback",
            ));
        }
        let end = Instant::now() + timeout;
        // Polls for the spin budget (`poll_mode`/`polling_us`, not while the thread
        // waits for a CPU) before sleeping; the budget runs across calls (a caller polling with
        // a zero timeout spins through it too). A second thread polling meanwhile keeps
        // its own state rather than wait for the lock.
        let mut shared = self.poll_spin.try_lock();
        let mut own;
        let spin: &mut Spinner = match shared.as_deref_mut() {
            Some(s) => s,
            None => {
                own = Spinner::new(self.settings.spin);
                &mut own
            }
        };
        loop {
            let ev = self.pass(0);
            let n = self.dispatch(ev);
            if n > 0 {
                spin.work();
                return Ok(n);
            }
            let t = Instant::now();
            let left = end.saturating_duration_since(t);
            if left.is_zero() {
                return Ok(0);
            }
            if self.poll_again(spin, t) {
                std::hint::spin_loop();
                continue;
            }
            self.sleep(0, left.min(MAX_SLEEP));
            spin.slept();
        }
    }

    /// Sleeps until a completion, a wake-up or `max`.
    ///
    /// With the soft provider's progress=inline, the thread also sleeps on the context's
    /// receiving sockets and receives itself when it wakes (its next pass polls a link,
    /// which drives the device): a request wakes this thread only, not the provider's
    /// progress thread first and this one through a completion event.
    fn sleep(&self, i: usize, max: Duration) {
        let shard = &self.shards[i];
        let mut fds = Vec::new();
        let mut rx = Vec::new();
        // The sessions whose links were armed (the others are quiet: see below).
        let mut armed: Vec<u64> = Vec::new();
        let now = Instant::now();
        {
            let st = shard.st.lock();
            if !st.queued.is_empty() || !st.incoming.is_empty() || !shard.ready.is_empty() {
                return;
            }
            let since = Duration::from_nanos(
                (self.epoch.elapsed().as_nanos() as u64)
                    .saturating_sub(shard.last_event.load(Ordering::Relaxed)),
            );
            let recent = since < WATCH_AFTER;
            // Only with a link to poll: its poll is what receives. Before the looks at
            // the CQs below: the device's wake fd among them then covers what its progress
            // thread completes after them.
            if recent && (!st.pending.is_empty() || st.sessions.values().any(|s| s.link.is_some()))
            {
                self.ctx.rx_fds(&mut rx);
            }
            // With this thread on the receiving sockets, a quiet session's link needs no
            // arming: what its peer sends wakes the thread through them, and what the
            // provider's own thread completes meanwhile (a due timer, a side-channel event)
            // through the device's wake fd. 1,000 idle sessions made every sleep arm,
            // poll(2) and disarm 1,000 event fds. Parked sessions are quiet; a keepalive
            // coming due waits for the end of the sleep (at most `MAX_SLEEP`).
            let watching = !rx.is_empty();
            let ids: Vec<u64> = if watching {
                st.park.active.clone()
            } else {
                st.sessions.keys().copied().collect()
            };
            let links = ids
                .iter()
                .filter_map(|id| {
                    let s = st.sessions.get(id)?;
                    if watching && s.quiet(now) {
                        return None;
                    }
                    let l = s.link()?;
                    armed.push(*id);
                    Some(l)
                })
                .chain(st.pending.iter().map(|p| &p.link));
            for l in links {
                if !watching {
                    l.conn.req_notify();
                } else {
                    l.conn.arm();
                }
                fds.push(libc::pollfd {
                    fd: l.conn.event_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
        }
        for &fd in &rx {
            fds.push(libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
        }
        let wake_at = fds.len();
        fds.push(libc::pollfd {
            fd: shard.wake.0,
            events: libc::POLLIN,
            revents: 0,
        });
        let links = fds.len();
        if i == 0
            && let Some(l) = self.listener.lock().as_ref()
        {
            for fd in l.wait_fds() {
                fds.push(libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
        }
        let ms = max.as_millis().clamp(1, 1000) as libc::c_int;
        let watch = !rx.is_empty();
        if watch {
            self.ctx.app_watch(true);
        }
        // SAFETY: `fds` is a valid array of pollfd of the length given.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if watch {
            self.ctx.app_watch(false);
        }
        // Only what fired needs reading (a read(2) each): usually just the sockets did.
        if fds[wake_at].revents != 0 {
            shard.wake.clear();
        }
        let fired: SmallVec<[RawFd; 4]> = fds[..wake_at - rx.len()]
            .iter()
            .filter(|p| p.revents != 0)
            .map(|p| p.fd)
            .collect();
        let accept = fds[links..].iter().any(|p| p.revents != 0);
        if wake_at == rx.len() && !accept {
            return; // no link was armed, no connection is waiting
        }
        let mut st = shard.st.lock();
        if accept {
            st.next_accept = None;
        }
        let links = armed
            .iter()
            .filter_map(|id| st.sessions.get(id)?.link())
            .chain(st.pending.iter().map(|p| &p.link));
        for l in links {
            if fired.contains(&l.conn.event_fd()) {
                l.conn.clear_event();
            } else {
                // Woken by something else (usually the sockets): this thread polls the
                // link next, and an arming left in place would fire on its own completions
                // (an eventfd write, then a wakeup of the next sleep for nothing).
                l.conn.disarm();
            }
        }
    }

    /// Runs the callbacks for `ev`, with no lock held. Returns how many ran.
    fn dispatch(&self, mut ev: Vec<Event>) -> usize {
        let n = self.run_callbacks(&mut ev);
        // The emptied list serves this thread's next pass.
        if ev.capacity() <= SPARE_EVENTS_MAX {
            ev.clear();
            SPARE_EVENTS.set(ev);
        }
        n
    }

    /// Runs the callbacks of `ev` (taking them out), with no lock held.
    fn run_callbacks(&self, ev: &mut Vec<Event>) -> usize {
        if ev.is_empty() {
            return 0;
        }
        let Some(owner) = self.owner.get().and_then(Weak::upgrade) else {
            return 0; // shutting down: nobody to call
        };
        let m = Messenger {
            core: Arc::clone(&owner.0),
            _owner: owner,
        };
        let d = &self.dispatcher;
        let n = ev.len();
        let was = IN_CALLBACK.with(|c| c.replace(true));
        // A callback that panicked ends its session (guard.rs), after the others ran.
        let mut panicked = Vec::new();
        for e in ev.drain(..) {
            let p = match e {
                Event::Connect(s, peer, incoming) => d.call(s, "on_connect", |d| {
                    d.on_connect(&m, s, peer, incoming);
                }),
                Event::Message(s, msg) => d.call(s, "on_message", |d| d.on_message(&m, s, msg)),
                Event::SendDone(s, id, r) => d.call(s, "on_send_complete", |d| {
                    d.on_send_complete(&m, s, id, r);
                }),
                Event::Ready(s) => d.call(s, "on_send_ready", |d| d.on_send_ready(&m, s)),
                Event::Reset(s, why) => d.call(s, "on_reset", |d| d.on_reset(&m, s, &why)),
            };
            panicked.extend(p);
        }
        IN_CALLBACK.with(|c| c.set(was));
        for (s, e) in panicked {
            // Gone already (the panic was in its on_reset, or it was closed): nothing to end.
            let _ = self.close_with(s, Some(e));
        }
        n
    }

    /// One progress pass over shard `i`: returns the events to dispatch.
    fn pass(&self, i: usize) -> Vec<Event> {
        let now = Instant::now();
        let shard = &self.shards[i];
        let mut moves: Vec<(usize, Link, Credits, Header)> = Vec::new();
        let mut st = shard.st.lock();
        let mut ev = std::mem::take(&mut st.queued);
        if ev.capacity() == 0 {
            ev = SPARE_EVENTS.take();
        }
        if i == 0 && st.next_accept.is_none_or(|t| now >= t) {
            let found = self.accept_new(&mut st, now);
            st.next_accept = (!found).then(|| now + ACCEPT_EVERY);
        }
        // Answers queued since the last pass (sent from its callbacks) go first: the
        // provider may hold the ACKs of the requests they answer (soft, progress=inline),
        // and then one post sends both. Then one progress pass of the device for every
        // link (one receive call, not one per session), then each link's completions.
        {
            let g = &mut *st;
            for id in &g.park.active {
                if let Some(sess) = g.sessions.get_mut(id) {
                    self.send_queued(sess, now, &mut ev, &mut g.closing);
                }
            }
        }
        self.ctx.progress();
        // After the device's pass: the parked sessions it completed work for join this one.
        {
            let g = &mut *st;
            g.park.wake_due(&mut g.sessions, &shard.ready, now);
        }
        self.drive_pending(i, &mut st, now, &mut ev, &mut moves);
        for (link, credits, h) in std::mem::take(&mut st.incoming) {
            self.attach_incoming(i, &mut st, link, credits, &h, now, &mut ev);
        }
        if self.restarts.load(Ordering::Acquire) != st.restarts_seen {
            self.tell_incarnations(&mut st, now, &mut ev);
            let g = &mut *st;
            g.park.wake_all(&mut g.sessions);
        }
        let mut ended = false;
        let g = &mut *st;
        let mut k = 0;
        while k < g.park.active.len() {
            let id = g.park.active[k];
            let Some(sess) = g.sessions.get_mut(&id) else {
                g.park.active.swap_remove(k); // closed by close_session
                continue;
            };
            if !sess.quiet(now) {
                sess.quiet_since = None;
                self.drive_session(sess, now, &mut ev, &mut g.closing);
            } else if sess.link().is_some_and(|l| l.parkable) {
                // Quiet for PARK_AFTER: passes skip it until a completion, its keepalive
                // or a call wakes it.
                let since = *sess.quiet_since.get_or_insert(now);
                if now.saturating_duration_since(since) >= PARK_AFTER {
                    sess.quiet_since = None;
                    g.park.park(k, sess);
                    continue;
                }
            }
            ended |= sess.m.state == SessionState::Closed;
            k += 1;
        }
        if ended {
            let gone: Vec<u64> = st
                .sessions
                .iter()
                .filter(|(_, s)| s.m.state == SessionState::Closed)
                .map(|(&id, _)| id)
                .collect();
            for id in gone {
                if let Some(sess) = st.sessions.remove(&id) {
                    self.forget(&sess);
                }
            }
        }
        st.closing.retain_mut(|(l, until)| {
            now < *until && l.sq_room() < self.settings.max_send_wr as usize && {
                let mut sink = Vec::new();
                l.poll(POLL_BUDGET, POLL_BUDGET, &mut sink).is_ok()
            }
        });
        drop(st);
        if !ev.is_empty() {
            shard
                .last_event
                .store(self.epoch.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        for (to, link, credits, h) in moves {
            let Some(target) = self.shards.get(to) else {
                continue;
            };
            target.st.lock().incoming.push((link, credits, h));
            target.wake.signal();
        }
        ev
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

    /// Takes the connections whose setup finished (non-blocking). Whether it found any.
    fn accept_new(&self, st: &mut ShardState, now: Instant) -> bool {
        let g = self.listener.lock();
        let Some(l) = g.as_ref() else { return false };
        let mut found = false;
        for _ in 0..16 {
            let r = l.try_accept();
            let slots = take_hooked(&self.bufs, r.as_ref().ok().and_then(Option::as_ref));
            match r {
                Ok(None) => break,
                Ok(Some(conn)) => {
                    found = true;
                    let Some(slots) = slots else { continue };
                    if !self.admit.try_pending(conn.peer()) {
                        drop(conn);
                        release_slots(&self.bufs, slots);
                        continue;
                    }
                    let (link, credits) = self.link_from(conn, slots);
                    st.pending.push(Pending {
                        link,
                        credits,
                        deadline: now + HELLO_DEADLINE,
                    });
                }
                Err(e) => {
                    log::debug!(target: "rdmx::msgr", "messenger: accept: {e}");
                    found = true; // others may have ended too: look again next pass
                    break;
                }
            }
        }
        found
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

    /// Accepted links waiting for their hello.
    fn drive_pending(
        &self,
        shard: usize,
        st: &mut ShardState,
        now: Instant,
        ev: &mut Vec<Event>,
        moves: &mut Vec<(usize, Link, Credits, Header)>,
    ) {
        let pending = std::mem::take(&mut st.pending);
        for mut p in pending {
            let mut out = Vec::new();
            let polled = p.link.poll(POLL_BUDGET, POLL_BUDGET, &mut out);
            let mut hello = None;
            for e in out {
                if !matches!(e, LinkEvent::ReadDone) {
                    p.credits.on_receive();
                }
                match e {
                    LinkEvent::Recv(r) if hello.is_none() && r.h.kind() == Some(Kind::Hello) => {
                        p.credits.on_grant(r.h.credits);
                        hello = Some(r.h);
                    }
                    LinkEvent::Recv(_) | LinkEvent::Imm(_) => {
                        self.malformed.fetch_add(1, Ordering::Relaxed);
                        self.discard(e);
                    }
                    LinkEvent::ReadDone => {}
                }
            }
            if let Some(h) = hello {
                self.admit.pending_done();
                let owner = self.by_peer.lock().get(&h.aux).copied();
                match owner {
                    Some(id) if (id & 0xff) as usize != shard => {
                        moves.push(((id & 0xff) as usize, p.link, p.credits, h));
                    }
                    _ => self.attach_incoming(shard, st, p.link, p.credits, &h, now, ev),
                }
                continue;
            }
            if polled.is_err() || now >= p.deadline {
                if let Err(e) = polled
                    && e.kind() == ErrorKind::InvalidValue
                {
                    self.malformed.fetch_add(1, Ordering::Relaxed);
                }
                self.admit.pending_done();
                continue; // dropped: closes the connection
            }
            if let Ok(n) = p.link.replenish(p.credits.deficit()) {
                p.credits.on_posted(n);
            }
            st.pending.push(p);
        }
    }

    /// Returns the payload chunk of an event nobody will handle.
    fn discard(&self, e: LinkEvent) {
        if let LinkEvent::Recv(r) = e
            && let Some(c) = r.data
        {
            let _ = self.bufs.data.put(c);
        }
    }

    /// An accepted link said hello: resume its session, or make a new one.
    #[allow(clippy::too_many_arguments)]
    fn attach_incoming(
        &self,
        shard: usize,
        st: &mut ShardState,
        mut link: Link,
        credits: Credits,
        h: &Header,
        now: Instant,
        ev: &mut Vec<Event>,
    ) {
        // The connecting messenger's identity: another incarnation at the address of a
        // known one means it restarted (two live processes cannot listen on one address):
        // the sessions of the old one are reset here, at once, not after the reconnect
        // timeout, and before the new session's on_connect.
        let auth_entity = link.conn.peer_entity().map(str::to_string);
        let ip = link.conn.peer().ip();
        let known = self.by_peer.lock().get(&h.aux).copied();
        if let Some(id) = known
            && st.sessions.contains_key(&id)
            && !self.admit.may_resume(id, auth_entity.as_deref(), ip)
        {
            // A link naming another entity's session: it gets nothing of it, and its
            // incarnation resets nobody.
            return;
        }
        let entity = (h.seq != 0 && h.msg_type != 0)
            .then(|| (SocketAddr::new(link.conn.peer().ip(), h.msg_type), h.seq));
        if let Some((addr, inc)) = entity {
            let prev = self
                .entities
                .lock()
                .insert((addr, auth_entity.clone()), inc);
            if prev.is_some_and(|p| p != inc) {
                self.restarts.fetch_add(1, Ordering::AcqRel);
                self.tell_incarnations(st, now, ev);
                for (j, other) in self.shards.iter().enumerate() {
                    if j != shard {
                        other.wake.signal();
                    }
                }
            }
        }
        let open = |id: &u64| {
            st.sessions
                .get(id)
                .is_some_and(|s| s.m.state != SessionState::Closed)
        };
        let id = match known {
            // (One that ended and is not removed yet stays ended: its peer is told so.)
            Some(id) if open(&id) => id,
            _ if h.aux2 != 0 || h.aux == 0 => {
                // The peer resumes a session we do not have (we restarted, or it ended
                // here): say so (hello with no identity) and let the link go.
                let _ = link.send_bare(&mut Header::new(Kind::Hello));
                st.closing.push((link, now + CLOSE_DRAIN));
                return;
            }
            _ => {
                // A new session lives on the shard that accepted it.
                let id = self.new_id(shard);
                if !self.admit.try_session(id, auth_entity.as_deref(), ip) {
                    // Over a bound: said as for an unknown session (the peer resets it).
                    let _ = link.send_bare(&mut Header::new(Kind::Hello));
                    st.closing.push((link, now + CLOSE_DRAIN));
                    return;
                }
                let policy = if h.has(flags::LOSSY) {
                    Policy::Lossy
                } else {
                    Policy::Lossless
                };
                let mut s = Session::new(Machine::new(self.rules, id, policy, true, now));
                s.peer = Some(link.conn.peer());
                st.sessions.insert(id, s);
                self.by_peer.lock().insert(h.aux, id);
                id
            }
        };
        let g = &mut *st;
        let Some(sess) = g.sessions.get_mut(&id) else {
            return;
        };
        if entity.is_some() {
            sess.m.peer_entity = entity;
        }
        // The peer reconnected before this side noticed the old link died: the machine
        // faults it (`accept_link`), the link goes now.
        if let Some((_, mut old)) = sess.link.take() {
            sess.m.counters.rnr_naks += old.take_rnr();
            drop(old);
        }
        self.hook_link(&mut link, id);
        let lid = sess.m.accept_link(now, credits, h);
        sess.link = Some((lid, link));
        sess.exec(now, ev, &mut g.closing);
        sess.flush(now, ev, &mut g.closing);
        // A parked session whose peer reconnected first.
        g.park.wake(&mut g.sessions, id);
    }

    /// Tells this shard's accepted sessions the latest incarnation at their peer
    /// messenger's address: the machine of a session whose peer was succeeded by another
    /// incarnation resets it (it restarted: what it had not acknowledged is lost).
    fn tell_incarnations(&self, st: &mut ShardState, now: Instant, ev: &mut Vec<Event>) {
        st.restarts_seen = self.restarts.load(Ordering::Acquire);
        let latest = self.entities.lock();
        let g = &mut *st;
        for sess in g.sessions.values_mut() {
            let Some((addr, _)) = sess.m.peer_entity else {
                continue;
            };
            let Some(&inc) = latest.get(&(addr, self.admit.entity(sess.id()))) else {
                continue;
            };
            if sess.m.on_peer_incarnation(addr, inc) {
                sess.exec(now, ev, &mut g.closing);
            }
        }
    }

    /// The first step of a session's pass, before the device's progress pass: without a
    /// link, its timers and connection attempt; with one, the messages queued since the
    /// last pass go out (with what else the pass has to do).
    fn send_queued(
        &self,
        sess: &mut Session,
        now: Instant,
        ev: &mut Vec<Event>,
        closing: &mut Vec<(Link, Instant)>,
    ) {
        if sess.m.state == SessionState::Closed {
            return;
        }
        if sess.link.is_none() {
            self.connect_step(sess, now, ev, closing);
        }
        if sess.link.is_none() || sess.m.queued() == 0 {
            return;
        }
        sess.step(now, &self.bufs.data, ev, closing);
    }

    /// The rest of a session's pass, after the device's progress pass: its link's
    /// completions fed to the machine, then the protocol steps.
    fn drive_session(
        &self,
        sess: &mut Session,
        now: Instant,
        ev: &mut Vec<Event>,
        closing: &mut Vec<(Link, Instant)>,
    ) {
        if sess.m.state == SessionState::Closed {
            return;
        }
        let Some((lid, link)) = sess.link.as_mut() else {
            return;
        };
        let lid = *lid;
        let mut out = Vec::new();
        if let Err(e) = link.poll(POLL_BUDGET, self.settings.rx_batch, &mut out) {
            // The link faults: what came with it is stale to the machine (dropped here,
            // replayed by the peer).
            sess.m.on_link_error(now, lid, e);
        }
        for e in out {
            sess.on_link_event(now, lid, e, &self.settings, &self.bufs.data);
        }
        sess.exec(now, ev, closing);
        sess.step(now, &self.bufs.data, ev, closing);
    }

    /// A session without a link: the machine's timers (a reconnect attempt due, the
    /// accepting side's give-up), the attempt it asked for started, and one under way
    /// looked at: its connection becomes the session's link, and the hello goes on it.
    fn connect_step(
        &self,
        sess: &mut Session,
        now: Instant,
        ev: &mut Vec<Event>,
        closing: &mut Vec<(Link, Instant)>,
    ) {
        sess.m.handle_timeout(now);
        sess.exec(now, ev, closing);
        if std::mem::take(&mut sess.want_connect)
            && let Some(addr) = sess.addr.clone()
        {
            sess.attempt = Some(self.spawn_attempt(addr, sess.id()));
        }
        let Some(rx) = &sess.attempt else { return };
        let r = match rx.try_recv() {
            Err(mpsc::TryRecvError::Empty) => return,
            Err(mpsc::TryRecvError::Disconnected) => Err(closed("connect")),
            Ok(r) => r,
        };
        sess.attempt = None;
        if sess.m.state == SessionState::Closed {
            if let Ok((conn, slots)) = r {
                drop(conn);
                release_slots(&self.bufs, slots);
            }
            return;
        }
        let (conn, slots) = match r {
            Ok(c) => c,
            Err(e) => {
                log::debug!(target: "rdmx::msgr", "session {:#x}: connect attempt failed: {e}", sess.id());
                sess.m.attempt_failed(now, e);
                sess.exec(now, ev, closing);
                return;
            }
        };
        self.admit.set_outgoing(sess.id(), conn.peer_entity());
        let (mut link, credits) = self.link_from(conn, slots);
        self.hook_link(&mut link, sess.id());
        let id = HelloId {
            claimed: self.claims.lock().get(&sess.id()).copied(),
            incarnation: self.incarnation,
            port: self
                .listener
                .lock()
                .as_ref()
                .map_or(0, |l| l.local_addr().port()),
        };
        let lid = sess.m.link_up(now, credits, id);
        sess.link = Some((lid, link));
        // The hello goes at once (a link that cannot take it is a failed attempt: the
        // machine's fault before the hello's answer).
        sess.exec(now, ev, closing);
        sess.flush(now, ev, closing);
    }

    /// Connects on a helper thread (setup blocks up to the handshake timeout).
    fn spawn_attempt(&self, addr: String, id: u64) -> super::session::Attempt {
        let (tx, rx) = mpsc::channel();
        let me = self.me.get().and_then(Weak::upgrade);
        let timeout = self.settings.reconnect_timeout.min(Duration::from_secs(10));
        let cancel = match ConnectCancel::new() {
            Ok(c) => Arc::new(c),
            Err(e) => {
                let (tx2, rx2) = mpsc::channel();
                let _ = tx2.send(Err(e));
                return rx2;
            }
        };
        let theirs = Arc::clone(&cancel);
        let spawned = std::thread::Builder::new()
            .name("rdmx-msgr-connect".into())
            .spawn(move || {
                let Some(core) = me else { return };
                let r = core.ctx.connect_cancellable(&addr, timeout, &theirs);
                let slots = take_hooked(&core.bufs, r.as_ref().ok());
                let r = r.and_then(|conn| {
                    slots.map(|s| (conn, s)).ok_or_else(|| {
                        Error::fixed(ErrorKind::Closed, "connect: no receives were posted")
                    })
                });
                if let Err(std::sync::mpsc::SendError(Ok((conn, slots)))) = tx.send(r) {
                    drop(conn);
                    release_slots(&core.bufs, slots);
                }
                if let Some(s) = core.shard_of(id) {
                    s.wake.signal();
                }
            });
        let Ok(handle) = spawned else {
            let (tx2, rx2) = mpsc::channel();
            let _ = tx2.send(Err(Error::fixed(ErrorKind::Io, "connect: no thread")));
            return rx2;
        };
        let mut attempts = self.attempts.lock();
        attempts.retain(|(_, h)| !h.is_finished());
        attempts.push((cancel, handle));
        if self.stopping.load(Ordering::Acquire) {
            // Shutdown began meanwhile and may have looked at the list already.
            for (c, _) in attempts.iter() {
                c.cancel();
            }
        }
        rx
    }

    pub fn close_session(&self, s: SessionId) -> Result<()> {
        self.close_with(s, None)
    }

    /// Closes session `s`: the peer is told (Bye), held sends fail; with `reset`, ended
    /// for that error (`on_reset`) instead of closed by the application.
    fn close_with(&self, s: SessionId, reset: Option<Error>) -> Result<()> {
        let shard = self.shard_of(s.0).ok_or_else(|| closed("close_session"))?;
        let mut st = shard.st.lock();
        let mut sess = st
            .sessions
            .remove(&s.0)
            .ok_or_else(|| closed("close_session"))?;
        match reset {
            Some(e) => sess.m.close_for(e),
            None => sess.m.close(),
        }
        let mut ev = Vec::new();
        sess.exec(Instant::now(), &mut ev, &mut st.closing);
        sess.link = None;
        st.queued.extend(ev);
        self.forget(&sess);
        drop(st);
        shard.wake.signal();
        Ok(())
    }

    pub fn session_info(&self, s: SessionId) -> Result<SessionInfo> {
        let shard = self.shard_of(s.0).ok_or_else(|| closed("session_info"))?;
        let st = shard.st.lock();
        st.sessions.get(&s.0).map(Session::info).ok_or_else(|| {
            Error::fixed(ErrorKind::InvalidArgument, "session_info: no such session")
        })
    }

    pub fn sessions(&self) -> Vec<SessionId> {
        let mut v = Vec::new();
        for s in &self.shards {
            v.extend(s.st.lock().sessions.keys().map(|&id| SessionId(id)));
        }
        v
    }

    /// Reads `auth_keyring` again (key rotation): see
    /// [`crate::msgr::auth::AuthConfig::reload_keyring`].
    pub fn reload_keyring(&self) -> Result<()> {
        self.ctx.shared.auth.reload_keyring()
    }

    /// The authenticated entity of session `s`'s peer (None with `auth = none`, or for
    /// an unknown session).
    pub fn session_entity(&self, s: SessionId) -> Option<String> {
        self.admit.entity(s.0)
    }

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
        }
    }

    pub fn settings(&self) -> &MsgrSettings {
        &self.settings
    }

    /// The messenger's context (the C ABI registers caller memory in its cache).
    pub(crate) fn context(&self) -> &Context {
        &self.ctx
    }

    pub fn inject_fault(&self, s: SessionId, fault: Fault) -> Result<()> {
        let shard = self.shard_of(s.0).ok_or_else(|| closed("inject_fault"))?;
        let mut st = shard.st.lock();
        let link = st
            .sessions
            .get_mut(&s.0)
            .and_then(|s| s.link.as_mut().map(|(_, l)| l))
            .ok_or_else(|| Error::fixed(ErrorKind::Closed, "inject_fault: no connection now"))?;
        match fault {
            Fault::SideChannelClose => link.conn.inject_side_channel_close(),
            Fault::QpError => link.conn.inject_qp_error(),
            Fault::PartialPosts { posts } => link.inject_partial = posts,
        }
        Ok(())
    }

    pub fn udp_port(&self) -> u16 {
        self.ctx.udp_addr().port()
    }
}

fn release_slots(bufs: &Buffers, slots: Vec<RecvSlot>) {
    for s in slots {
        let _ = bufs.slots.put(s.hdr);
        let _ = bufs.data.put(s.data);
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
