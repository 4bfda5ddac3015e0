//! The messenger: addressed sessions over RC connections, with messages made of a type, a
//! small front part and page-aligned data segments; credit flow control; lossless
//! (reconnect + replay, exactly once in order) and lossy policies; keepalive; the caller's
//! `poll` or worker threads driving progress and calling the application back.
//!
//! It uses only [`Context`](super::Context), [`Connection`](super::Connection) and the
//! memory pools: it does not know which provider it runs on. Design, wire format and
//! measurements: `docs/messenger.md`.
//!
//! One job per file: `wire` (the header), `credits` (flow control), `session` (a session
//! as the shard drives it: its machine, its link, receiving), `keepalive` (liveness and
//! reconnect backoff),
//! `link` (one live connection: posted receives, the send queue, READs), `buffers` (pools
//! and payload preparation), `shard/` (the driver, one job per file: progress passes and
//! worker threads, sleeping, connecting, accepting, the public calls, stats), `submit`
//! (the per-session gate where `send` queues for the next pass without waiting for it),
//! `settings` (the `msgr_*` knobs), `types` (the public types), `machine` (every rule of a
//! session: sequence numbers, acknowledgements, replay, credits, keepalive, faults,
//! reconnects, close, as a sans-IO state machine with its seeded simulator;
//! `docs/messenger-machine.md`).

mod admit;
mod buffers;
mod credits;
mod guard;
mod keepalive;
mod link;
// The session machine drives every session (`session.rs`, `shard.rs`).
pub(crate) mod machine;
mod park;
mod scope;
mod session;
mod settings;
mod shard;
mod submit;
mod types;
pub mod wire;

pub use machine::is_in_doubt;
pub use settings::MsgrSettings;
pub use types::{
    Dispatcher, Fault, InMessage, MSG_TYPE_IMM, MsgrStats, OutMessage, PathCounters, PathEvent,
    PathInfo, PathPolicy, PathState, Payload, Policy, Refused, Registered, RemoteWrite, RxSeg,
    SendId, SessionCounters, SessionId, SessionInfo, SessionState, TxChunk,
};

use crate::config::Config;
use crate::error::Result;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use shard::Core;

/// A messenger: owns a [`Context`](super::Context), listens, connects, and carries many
/// sessions. Cheap to clone (a handle); every method takes `&self` and may be called from
/// any thread, including from inside a [`Dispatcher`] callback (see there for what is
/// refused). When the last handle the application holds is dropped, the messenger shuts
/// down: worker threads stop, every session's connection is closed (no callbacks run),
/// and the pools are freed once the application dropped its received segments.
#[derive(Clone)]
pub struct Messenger {
    pub(crate) core: Arc<Core>,
    /// Shuts the core down when the last application handle goes.
    _owner: Arc<Owner>,
}

pub(crate) struct Owner(Arc<Core>);

impl Drop for Owner {
    fn drop(&mut self) {
        self.0.shutdown();
    }
}

impl std::fmt::Debug for Messenger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Messenger").finish_non_exhaustive()
    }
}

impl Messenger {
    /// A messenger with its own context (`config`: the transport keys and the `msgr_*`
    /// keys) calling `dispatcher` back. With `msgr_threads` > 0 the worker threads start
    /// here. The messenger needs 2 receive SGEs (header slot + data chunk): a configured
    /// `max_recv_sge` of 1 is raised to 2; a default `max_send_sge` is raised to 16 (READs
    /// into 16 chunks at once).
    pub fn new(config: &Config, dispatcher: Arc<dyn Dispatcher>) -> Result<Messenger> {
        let core = Core::new(config, dispatcher)?;
        let owner = Arc::new(Owner(Arc::clone(&core)));
        core.start(&owner)?;
        Ok(Messenger {
            _owner: owner,
            core,
        })
    }

    /// Listens on `addr` ("IP:PORT", port 0 = any) and returns the bound address. Accepted
    /// connections become sessions when their peer's session handshake arrives
    /// (`on_connect` with `incoming = true`), or resume an existing one (lossless
    /// reconnect). One listener per messenger.
    pub fn listen(&self, addr: &str) -> Result<SocketAddr> {
        self.core.listen(addr)
    }

    /// Opens a session to the messenger listening at `addr` with `policy`. Returns at once;
    /// the connection is made in the background (`on_connect` when it is open). Messages
    /// sent meanwhile wait (within the queue bounds). A lossless session retries the first
    /// connection with backoff too; a lossy one ends with `on_reset` if it fails.
    pub fn connect(&self, addr: &str, policy: Policy) -> Result<SessionId> {
        self.core.connect(addr, policy)
    }

    /// Opens a session to one peer over several paths: `addrs` are addresses of the same
    /// messenger (two NIC ports, two subnets; 1 to 16, `addrs[0]` preferred). The first
    /// path that answers carries the session; the others join it (a path-join hello bound
    /// to the session: docs/security.md) and stay idle with `PathPolicy::Standby`. When
    /// the active path fails the traffic moves to the lowest-index path up without a new
    /// session: a lossless session replays what the peer has not acknowledged (exactly
    /// once, in order), a lossy one completes those sends with an "in doubt" error and
    /// goes on. A failed path is retried with the `msgr_reconnect_*` backoff and rejoins;
    /// with `msgr_path_failback` (default) the traffic moves back to a preferred path.
    /// Only when no path is up does the session reconnect (lossless) or end (lossy), as
    /// with one path. `Dispatcher::on_path` reports each path going down, joining, or
    /// becoming the active one. With `PathPolicy::Active` every joined path carries
    /// data (each message on the one with the fewest unacknowledged), and a failed path's
    /// unacknowledged messages go again on the others (lossless) or are reported in doubt
    /// (lossy); see [`PathPolicy`]. docs/failover.md.
    pub fn connect_paths(
        &self,
        addrs: &[&str],
        policy: Policy,
        path_policy: PathPolicy,
    ) -> Result<SessionId> {
        self.core.connect_paths(addrs, policy, path_policy)
    }

    /// Adds a path to session `s` (the side that connected it): returns its index. It is
    /// connected and joins at once if the session is open.
    pub fn add_path(&self, s: SessionId, addr: &str) -> Result<usize> {
        self.core.add_path(s, addr)
    }

    /// Removes path `index` of session `s` (the side that connected it): its connection
    /// closes; if it was the active path the traffic moves as on its failure. The last
    /// path cannot be removed (`InvalidArgument`: close the session).
    pub fn remove_path(&self, s: SessionId, index: usize) -> Result<()> {
        self.core.remove_path(s, index)
    }

    /// The paths of session `s`: address, state and counters (the accepting side lists
    /// the paths the peer joined, without addresses).
    pub fn paths(&self, s: SessionId) -> Result<Vec<PathInfo>> {
        self.core.paths(s)
    }

    /// Queues `msg` on session `s` and returns its [`SendId`]; `on_send_complete` reports
    /// when the peer acknowledged it. Refused (message handed back) with `Full` when the
    /// session holds `msgr_send_queue_msgs` messages or `msgr_send_queue_bytes` data bytes
    /// (queued + unacknowledged; `on_send_ready` tells when there is room), `Closed` when
    /// the session ended, `InvalidArgument` for a message that breaks the limits. Payloads
    /// are prepared here (copies made, registrations looked up) on the caller's thread;
    /// the message goes out on the next progress pass (at once in worker mode).
    pub fn send(&self, s: SessionId, msg: OutMessage) -> std::result::Result<SendId, Refused> {
        self.core.send(s, msg)
    }

    /// A chunk of the messenger's data pool (4 KiB, page-aligned, registered) to fill and
    /// send as [`Payload::Chunk`]. `Full` when the pool is exhausted.
    pub fn alloc_chunk(&self) -> Result<TxChunk> {
        self.core.alloc_chunk()
    }

    /// Caller-driven progress (`msgr_threads = 0`): accepts, polls every connection,
    /// posts receives and sends, runs timers (keepalive, reconnect), then runs the
    /// callbacks of what happened, on this thread. Returns the number of callbacks run.
    /// Waits up to `timeout` for something to happen when nothing did (zero: never
    /// waits). `InvalidArgument` in worker mode; `Busy` from inside a callback.
    pub fn poll(&self, timeout: Duration) -> Result<usize> {
        self.core.poll(timeout)
    }

    /// Ends a session now: its connection is closed, queued and unacknowledged sends
    /// complete with `Closed` (callbacks run on the session's thread, or in the next
    /// `poll`), no `on_reset`. The peer sees a fault (lossy: it resets; lossless: it
    /// waits for a reconnect that does not come and resets after the timeout).
    pub fn close_session(&self, s: SessionId) -> Result<()> {
        self.core.close_session(s)
    }

    /// Pauses (`true`) or resumes (`false`) the peer's data messages on session `s`: the
    /// flow control a receiver that cannot keep up applies instead of buffering without
    /// bound or closing (Ceph's messenger stops reading a connection whose dispatch
    /// throttle is full for the same reason). While paused this side keeps one receive
    /// posted, so control frames (acknowledgements, keepalives) still flow and nothing
    /// times out; the peer's data stops once the credits it already holds (at most the
    /// receive window) are spent, and its sends wait in its own queue (`Full` at its
    /// `send`). Messages already received are still delivered. Resuming grants the window
    /// again. Idempotent; `Closed` for an unknown session.
    pub fn pause_receive(&self, s: SessionId, paused: bool) -> Result<()> {
        self.core.pause_receive(s, paused)
    }

    /// A session's state and counters. `InvalidArgument` for an unknown id (closed
    /// sessions are forgotten once their last callback ran).
    pub fn session_info(&self, s: SessionId) -> Result<SessionInfo> {
        self.core.session_info(s)
    }

    /// The sessions not closed.
    pub fn sessions(&self) -> Vec<SessionId> {
        self.core.sessions()
    }

    /// Messenger-wide figures (pools, sessions, totals).
    /// The authenticated entity of session `s`'s peer: the connecting client's entity on
    /// a listening messenger (e.g. "client.fio"), the listener's name on a connecting one.
    /// None with `auth = none` or for an unknown session. Applications base access
    /// control on it.
    pub fn session_entity(&self, s: SessionId) -> Option<String> {
        self.core.session_entity(s)
    }

    /// Reads the `auth_keyring` file again (key rotation); handshakes that start
    /// afterwards (new sessions, reconnects) use the new keys. `ErrorKind::Auth` when the
    /// file is unusable now (the old keys stay) or no keyring is configured.
    pub fn reload_keyring(&self) -> Result<()> {
        self.core.reload_keyring()
    }

    /// Test hook: connects like [`Messenger::connect`], but the session's hellos claim
    /// `claimed` as its id (what an attacker who saw a session's id in clear would send
    /// to take it over). Not for applications.
    #[doc(hidden)]
    pub fn connect_claiming(&self, addr: &str, policy: Policy, claimed: u64) -> Result<SessionId> {
        self.core.connect_claiming(addr, policy, claimed)
    }

    /// Whether the hellos of later connections advertise this messenger's message limits
    /// (`msgr_max_message_bytes`, `msgr_max_segments`; on by default), so that peers refuse
    /// at `send` what this side would refuse on receipt. Off, this side behaves as a build
    /// before protocol 1.3 (its limits are still enforced on receipt): for tests of that.
    pub fn advertise_limits(&self, on: bool) {
        let l = on.then(|| self.settings().limits.to_wire());
        self.context().set_hello_limits(l);
    }

    pub fn stats(&self) -> MsgrStats {
        self.core.stats()
    }

    /// The settings in force.
    pub fn settings(&self) -> &MsgrSettings {
        self.core.settings()
    }

    /// Injects a transport fault on the session's current connection (tests). `Closed`
    /// when it has none.
    pub fn inject_fault(&self, s: SessionId, fault: Fault) -> Result<()> {
        self.core.inject_fault(s, fault)
    }

    /// The UDP ports of the context (for fault injection with a UDP black hole).
    pub fn udp_port(&self) -> u16 {
        self.core.udp_port()
    }

    /// Registers `[ptr, ptr + len)` in the messenger's registration cache (pinning it) and
    /// keeps the registration until [`Messenger::mem_dereg`]: sending any slice of it as
    /// [`Payload::Registered`] is then a cache hit, not a registration per message (the
    /// Rust side of `rdmx_msgr_mem_reg`). `ResourceLimit` when RLIMIT_MEMLOCK refuses.
    ///
    /// # Safety
    /// The memory stays valid and mapped until the handle is given back and the sends
    /// naming it completed.
    pub unsafe fn mem_reg(&self, ptr: *mut u8, len: usize) -> Result<crate::mem::rcache::Handle> {
        let rights = crate::rc::verbs::access::LOCAL_WRITE | crate::rc::verbs::access::REMOTE_READ;
        // SAFETY: forwarded contract.
        unsafe { self.core.context().rcache().get(ptr, len, rights) }
    }

    /// Gives back a registration of [`Messenger::mem_reg`] (it stays cached until evicted).
    pub fn mem_dereg(&self, h: crate::mem::rcache::Handle) -> Result<()> {
        self.core.context().rcache().put(h)
    }

    /// The messenger's context (crate-internal): the block target registers its memory
    /// volumes and IO buffers in its registration cache once, so that sending any slice of
    /// them as [`Payload::Registered`] is a cache hit, not a registration per message.
    pub(crate) fn context(&self) -> &super::Context {
        self.core.context()
    }
}
