//! The messenger's public types: session handles, messages (what goes out, what comes in),
//! the callbacks and the counters.

use crate::error::{Error, ErrorKind};
use crate::mem::pool::{Chunk, Pool};
use smallvec::SmallVec;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use super::Messenger;

/// What a session does after a transport fault (Ceph's policy names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// The connecting side reconnects with backoff on a new connection; both sides replay
    /// what the other has not acknowledged; each message is delivered exactly once, in
    /// order. The application sees `on_reset` only when the peer restarted (a new session
    /// identity) or reconnecting gave up (`msgr_reconnect_timeout_ms`/`_attempts`).
    Lossless,
    /// A fault ends the session: every unacknowledged send completes with an error, then
    /// `on_reset`.
    Lossy,
}

/// A session, as this messenger names it. Copyable; stays valid (refused with `Closed`)
/// after the session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u64);

/// A sent message, as `on_send_complete` names it: the session's sequence number of the
/// message (1, 2, ... per session, in send order).
pub type SendId = u64;

/// How a session with several paths ([`Messenger::connect_paths`]) uses them
/// (docs/failover.md). Non-exhaustive: a later policy is a new variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PathPolicy {
    /// All traffic on one path (the active one, the lowest-index path that is up); the
    /// others stay connected and idle (keepalives only), so that a switch costs no
    /// handshake. For two NIC ports or two switches: no reordering cost, the second link
    /// only carries traffic when the first fails.
    #[default]
    Standby,
    /// Every joined path carries data: each message goes on the path with the fewest
    /// unacknowledged messages (that has a credit). For two NIC ports whose bandwidth is
    /// wanted together (spread the load), or paths of equal cost. The receiver holds a
    /// message that arrives ahead of one still on another path and delivers in order
    /// (the hold is bounded by the sender's `msgr_send_queue_msgs`, and takes receive
    /// buffers from the data pool while it lasts). When a path fails, a lossless session
    /// sends again, on the others, only what went on it (exactly once, in order); a lossy
    /// one reports those sends in doubt and the receiver skips their numbers. Immediate
    /// messages (`OutMessage::immediate`) are refused (`InvalidArgument`): they carry no
    /// sequence number to order them across paths.
    Active,
}

/// What a path of a session is doing now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathState {
    /// No connection (failed, or not tried yet): retried with backoff
    /// (`msgr_reconnect_min_ms` doubling to `_max_ms`, without giving up while the session
    /// lives on another path).
    Down,
    /// A connection attempt or the path-join handshake is under way.
    Connecting,
    /// Connected and joined to the session, idle (keepalives only).
    Standby,
    /// The path the session's traffic goes on (with `PathPolicy::Active`: every joined
    /// path).
    Active,
}

/// What happened to a path (the dispatcher's `on_path`; a log line each: warn for
/// `Down`, info for the others).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathEvent {
    /// The path failed (or a join on it was refused): why.
    Down(Error),
    /// The path joined the session (standby).
    Up,
    /// The session's traffic moved to this path (a failover, or a failback to a preferred
    /// path that rejoined).
    Active,
}

/// Per-path counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathCounters {
    /// Messages (first sends and replays) and their bytes sent on this path.
    pub msgs_sent: u64,
    pub bytes_sent: u64,
    /// Faults of this path's connections (error completion, side-channel EOF, keepalive
    /// loss, refused post, a refused join).
    pub faults: u64,
    /// Times the session's traffic moved to this path.
    pub switches: u64,
}

/// One path of a session ([`Messenger::paths`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathInfo {
    /// Its index (0 = the most preferred; failback moves back to the lowest index up).
    pub index: usize,
    /// The address it connects to (connecting side; None on the accepting side).
    pub remote: Option<String>,
    pub state: PathState,
    pub counters: PathCounters,
    /// The last fault's reason, and how long ago it was.
    pub last_fault: Option<Error>,
    pub since_last_fault: Option<std::time::Duration>,
    /// Removed by `remove_path` (its index is not reused).
    pub removed: bool,
}

/// A session's life stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionState {
    /// Connecting (first time), or the session handshake is under way.
    Connecting,
    /// Connected and handshaken: messages flow.
    Open,
    /// Lossless, after a fault: the connecting side retries with backoff, the accepting side
    /// waits for it; sends queue (within the bounds).
    Reconnecting,
    /// Ended (lossy fault, peer reset, reconnect gave up, or `close_session`).
    Closed,
}

/// A data segment handed to [`Messenger::send`].
pub enum Payload {
    /// A chunk of this messenger's pool ([`Messenger::alloc_chunk`]): no copy, no
    /// registration; the messenger owns it until the send completes and returns it to the
    /// pool then.
    Chunk(TxChunk),
    /// A received segment sent on as it is (an echo or a forward): no copy.
    Received(RxSeg),
    /// Caller memory registered through the registration cache (`rcache`): no copy, no
    /// registration per message once cached. Build with [`Payload::registered`].
    Registered(Registered),
    /// Unregistered caller memory copied once into pool chunks during the `send` call
    /// (counted in [`SessionCounters::copied_bytes`]), like `Copy` without the caller's
    /// `Vec` (the C ABI's unregistered segments). Build with [`Payload::copy_from`].
    CopyFrom(Registered),
    /// Unregistered bytes: copied once into pool chunks at send (counted in
    /// [`SessionCounters::copied_bytes`]).
    Copy(Vec<u8>),
}

/// Caller memory for [`Payload::Registered`].
#[derive(Debug, Clone, Copy)]
pub struct Registered {
    pub(crate) addr: usize,
    pub(crate) len: usize,
}

impl Payload {
    /// Caller memory `[ptr, ptr + len)`, registered (or found registered) through the
    /// registration cache when it is sent.
    ///
    /// # Safety
    /// The memory must stay valid, mapped and unmodified until the send completes
    /// (`on_send_complete` for it ran, with any status).
    pub unsafe fn registered(ptr: *const u8, len: usize) -> Payload {
        Payload::Registered(Registered {
            addr: ptr as usize,
            len,
        })
    }

    /// Caller memory `[ptr, ptr + len)` copied into pool chunks by [`Messenger::send`].
    ///
    /// # Safety
    /// The memory must be valid for reads for the duration of the `send` call (only).
    pub unsafe fn copy_from(ptr: *const u8, len: usize) -> Payload {
        Payload::CopyFrom(Registered {
            addr: ptr as usize,
            len,
        })
    }

    /// The segment's length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Payload::Chunk(c) => c.len,
            Payload::Received(r) => r.len,
            Payload::Registered(r) | Payload::CopyFrom(r) => r.len,
            Payload::Copy(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Payload::Chunk(c) => write!(f, "Chunk({} B)", c.len),
            Payload::Received(r) => write!(f, "Received({} B)", r.len),
            Payload::Registered(r) => write!(f, "Registered({:#x}, {} B)", r.addr, r.len),
            Payload::Copy(v) => write!(f, "Copy({} B)", v.len()),
            Payload::CopyFrom(r) => write!(f, "CopyFrom({:#x}, {} B)", r.addr, r.len),
        }
    }
}

/// An RDMA WRITE of `data` into the peer's memory at `addr` (registered by the peer with
/// remote write access under `rkey`), posted on the session's connection before the
/// message's SEND ([`OutMessage::with_write`]). RC delivers in order: when the peer's
/// messenger delivers the message, the bytes are in place.
#[derive(Debug)]
pub struct RemoteWrite {
    /// The source bytes (any payload kind; held until the message is acknowledged).
    pub data: Payload,
    /// The peer's address and rkey (as the peer told us, e.g. in a request).
    pub addr: u64,
    pub rkey: u32,
}

/// A message to send: a type, a small front part (copied), data segments, and RDMA WRITEs
/// into the peer's memory that go before it.
#[derive(Debug, Default)]
pub struct OutMessage {
    /// The application's message type (carried as is).
    pub msg_type: u16,
    /// Small, copied into the header slot (or the descriptor chunk); at most
    /// [`super::wire::FRONT_MAX`] bytes.
    pub front: Vec<u8>,
    /// Zero or more data segments (at most [`super::wire::MAX_SEGS`]), each up to 16 MiB.
    pub data: Vec<Payload>,
    /// RDMA WRITEs into the peer's memory (at most [`super::wire::MAX_WRITES`], each up to
    /// 16 MiB), posted in order on the same connection before the message's SEND (a batch
    /// of messages posts its WRITEs first, then its SENDs: a WRITE has landed when its own
    /// message is delivered, and may land before an earlier message of the batch is);
    /// their source memory is held until the message is acknowledged (or fails), like
    /// `data`. Lossy sessions only: a lossless session refuses such a message with
    /// `InvalidArgument` (a replay on a new connection would not re-post the WRITEs). A
    /// WRITE the peer refuses (bad rkey or address) is an error completion here and a QP
    /// error there: the session faults (lossy: both sides reset).
    pub writes: Vec<RemoteWrite>,
    /// An immediate message ([`OutMessage::immediate`]): this 32-bit value is the whole
    /// message, carried by its last RDMA WRITE (WRITE WITH IMMEDIATE) instead of a SEND.
    pub imm: Option<u32>,
}

/// The message type an immediate message ([`OutMessage::immediate`]) is delivered with
/// (its front is the value, 4 bytes little-endian); reserved: `send` refuses other
/// messages of this type.
pub const MSG_TYPE_IMM: u16 = 0xFFFF;

impl OutMessage {
    pub fn new(msg_type: u16, front: Vec<u8>) -> OutMessage {
        OutMessage {
            msg_type,
            front,
            data: Vec::new(),
            writes: Vec::new(),
            imm: None,
        }
    }

    /// An immediate message: the 32-bit `value` rides on the last work request of the
    /// message's RDMA WRITEs (add at least one with [`OutMessage::with_write`]) as an RDMA
    /// WRITE WITH IMMEDIATE, so that data + notice are one packet for a 4 KiB WRITE, and no
    /// SEND, header slot or header parse is spent on it. The peer's messenger delivers it
    /// in order with the other messages, as type [`MSG_TYPE_IMM`] with `value` as its
    /// 4-byte front (little-endian), once the WRITEs have landed. It consumes a receive
    /// and a sequence number like any message, but carries no acknowledgement or credits
    /// (explicit ACK messages do, at most every other pass under load). No front, no data
    /// segments; lossy sessions only (as any message with WRITEs). Send it only to a peer
    /// that asked for it (a peer older than this does not know the completion).
    pub fn immediate(value: u32) -> OutMessage {
        OutMessage {
            msg_type: MSG_TYPE_IMM,
            imm: Some(value),
            ..OutMessage::default()
        }
    }

    /// Adds an RDMA WRITE of `data` to the peer's `addr`/`rkey` before the message (see
    /// [`OutMessage::writes`]).
    pub fn with_write(mut self, data: Payload, addr: u64, rkey: u32) -> OutMessage {
        self.writes.push(RemoteWrite { data, addr, rkey });
        self
    }

    /// Appends a data segment.
    pub fn with(mut self, p: Payload) -> OutMessage {
        self.data.push(p);
        self
    }
}

/// A received message. Dropping it releases its data chunks to the pool.
#[derive(Debug)]
pub struct InMessage {
    pub msg_type: u16,
    /// The session sequence number (1, 2, ... in delivery order).
    pub seq: u64,
    /// The front part (a copy).
    pub front: Vec<u8>,
    /// The data segments, each in pool chunks (page-aligned 4 KiB chunks, no copy made by
    /// the messenger); take them out to keep them past the message.
    pub data: Vec<RxSeg>,
}

/// A chunk of the messenger's pool lent to the application to fill and send
/// ([`Messenger::alloc_chunk`]); dropped unsent, it goes back to the pool.
pub struct TxChunk {
    pub(crate) chunk: Option<Chunk>,
    pub(crate) pool: Arc<Pool>,
    /// Bytes of the chunk that are sent (starts at the chunk size; lower it with
    /// [`TxChunk::set_len`]).
    pub(crate) len: usize,
}

impl TxChunk {
    /// The chunk's bytes (the whole chunk, whatever `len` is).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match &self.chunk {
            // SAFETY: the chunk is out of the pool and owned by this handle, so nobody else
            // reads or writes it; `self.pool` keeps its arena mapped.
            Some(c) => unsafe { std::slice::from_raw_parts_mut(c.addr, c.len) },
            None => &mut [],
        }
    }

    /// Sends only the first `len` bytes (at most the chunk size).
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.capacity());
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.chunk.as_ref().map_or(0, |c| c.len)
    }

    pub(crate) fn take(&mut self) -> Option<Chunk> {
        self.chunk.take()
    }
}

impl fmt::Debug for TxChunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TxChunk({} of {} B)", self.len, self.capacity())
    }
}

impl Drop for TxChunk {
    fn drop(&mut self) {
        if let Some(c) = self.chunk.take() {
            let _ = self.pool.put(c);
        }
    }
}

/// A received data segment: `len` bytes in page-aligned pool chunks (4 KiB each, filled in
/// order; the last may be partly used). Dropping it (or [`RxSeg::release`]) returns the
/// chunks to the pool. `Send`: it may be released on any thread.
pub struct RxSeg {
    pub(crate) chunks: SmallVec<[Chunk; 1]>,
    pub(crate) pool: Arc<Pool>,
    pub(crate) len: usize,
}

impl RxSeg {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes of each chunk in order (each page-aligned; all but the last are full).
    pub fn chunks(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let size = self.chunks.first().map_or(1, |c| c.len);
        self.chunks.iter().enumerate().map(move |(i, c)| {
            let n = self.len.saturating_sub(i * size).min(c.len);
            // SAFETY: the chunk is out of the pool and owned by this segment (nobody writes
            // it any more: the READ or receive that filled it completed); `self.pool` keeps
            // its arena mapped.
            unsafe { std::slice::from_raw_parts(c.addr, n) }
        })
    }

    /// The segment's bytes when it lies in one chunk (every segment of up to 4 KiB).
    pub fn as_slice(&self) -> Option<&[u8]> {
        if self.chunks.len() == 1 {
            self.chunks().next()
        } else if self.len == 0 {
            Some(&[])
        } else {
            None
        }
    }

    /// The address of the first byte (page-aligned), for the application's own IO.
    pub fn as_ptr(&self) -> *const u8 {
        self.chunks
            .first()
            .map_or(std::ptr::null(), |c| c.addr.cast_const())
    }

    /// A copy of the bytes (tests, small segments).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len);
        for c in self.chunks() {
            v.extend_from_slice(c);
        }
        v
    }

    /// Returns the chunks to the pool now (same as dropping).
    pub fn release(self) {}
}

impl fmt::Debug for RxSeg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RxSeg({} B in {} chunks)", self.len, self.chunks.len())
    }
}

impl Drop for RxSeg {
    fn drop(&mut self) {
        for c in self.chunks.drain(..) {
            let _ = self.pool.put(c);
        }
    }
}

/// A send that was refused; the message is handed back untouched.
#[derive(Debug)]
pub struct Refused {
    /// `Full` (the session's queue bound: retry after `on_send_ready` or completions),
    /// `Closed` (the session ended), `InvalidArgument` (front or segments too large, a
    /// registration failed), `ResourceLimit`.
    pub error: Error,
    pub msg: Box<OutMessage>,
}

impl Refused {
    pub fn kind(&self) -> ErrorKind {
        self.error.kind()
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

/// The application's callbacks.
///
/// **Which thread.** With `msgr_threads = 0` every callback runs inside
/// [`Messenger::poll`], on the caller's thread. With `msgr_threads = N` each session is
/// owned by one of N worker threads and every callback for it runs on that thread (so the
/// callbacks of one session never run concurrently, and arrive in order: on_connect, then
/// messages in sequence order, send completions in send order, then at most one on_reset).
///
/// **What may be called from a callback.** Everything on the messenger except
/// `poll` (refused with `Busy` when called from a callback of this messenger) and dropping
/// the last `Messenger` handle: no internal lock is held while a callback runs, so
/// `send`, `close_session`, `alloc_chunk`, counters, and dropping or releasing received
/// segments are safe and do not deadlock. A callback should not block for long: it holds up
/// every session of its thread.
pub trait Dispatcher: Send + Sync + 'static {
    /// A session is open: after `connect` (`incoming = false`) or for a new peer session
    /// accepted by `listen` (`incoming = true`). Not called again on a lossless reconnect.
    fn on_connect(&self, _m: &Messenger, _s: SessionId, _peer: SocketAddr, _incoming: bool) {}

    /// A message, delivered once, in order per session. The application owns it (drop it
    /// or its segments to release the chunks).
    fn on_message(&self, m: &Messenger, s: SessionId, msg: InMessage);

    /// The peer acknowledged message `id` (`Ok`), or it never will (`Err`: lossy fault,
    /// peer reset, reconnect gave up, session closed). Every accepted send gets exactly one.
    fn on_send_complete(
        &self,
        _m: &Messenger,
        _s: SessionId,
        _id: SendId,
        _status: crate::error::Result<()>,
    ) {
    }

    /// A session that refused a send with `Full` has room again.
    fn on_send_ready(&self, _m: &Messenger, _s: SessionId) {}

    /// The session ended because of a fault (lossy), a peer restart, or a reconnect that
    /// gave up. Not called for `close_session`. The session's id is dead afterwards.
    fn on_reset(&self, _m: &Messenger, _s: SessionId, _why: &Error) {}

    /// A path of the session went down, joined, or became the active one
    /// ([`Messenger::connect_paths`]). The session itself carries on: only when no path
    /// is up does it reconnect (lossless) or end (lossy), as with one path.
    fn on_path(&self, _m: &Messenger, _s: SessionId, _path: usize, _ev: &PathEvent) {}
}

/// Per-session counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionCounters {
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
    /// malformed header from the peer).
    pub faults: u64,
    /// Malformed headers received (each also a fault).
    pub malformed: u64,
    /// Times a message had to wait for credits.
    pub credit_stalls: u64,
    /// Sends refused with `Full`.
    pub full_refusals: u64,
    /// Bytes copied because they came from unregistered memory (`Payload::Copy`).
    pub copied_bytes: u64,
    /// Data segments moved by RDMA READ (rendezvous) / eagerly in the SEND.
    pub read_segments: u64,
    pub eager_segments: u64,
    /// Of the eager segments received, those the sender RDMA WROTE into the chunk this
    /// side granted (`msgr_eager_write`); the others came in the SEND.
    pub written_segments: u64,
    /// RDMA WRITEs posted into the peer's memory ([`OutMessage::writes`]) and their bytes.
    pub remote_writes: u64,
    pub remote_write_bytes: u64,
    pub keepalives_sent: u64,
    /// Receiver-not-ready NAKs of this session's connections (sent + received): 0 in steady
    /// state, since a sender never goes beyond its credits.
    pub rnr_naks: u64,
    /// Messages received again after a reconnect and dropped (already delivered).
    pub duplicates_dropped: u64,
    /// Send-queue completions the session's links polled: one per batch of SENDs and
    /// WRITEs posted together (only a batch's last work request is signaled), plus one per
    /// rendezvous READ; far fewer than `msgs_sent` under load.
    pub send_completions: u64,
    /// Immediate messages ([`OutMessage::immediate`]) sent and received (also counted in
    /// `msgs_sent` / `msgs_received`).
    pub imm_sent: u64,
    pub imm_received: u64,
    /// Posts the connection's send queue took only part of, or none of (full): the rest
    /// was posted on a later pass, in order.
    pub partial_posts: u64,
    /// Messages from the peer refused for breaking this side's limits
    /// (`msgr_max_message_bytes`, `msgr_max_segments`): each ended the session.
    pub oversized: u64,
}

/// What a session is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    pub state: SessionState,
    pub policy: Policy,
    /// The peer's address (connecting side: the address given to `connect`).
    pub peer: Option<SocketAddr>,
    /// Whether this side accepted it.
    pub incoming: bool,
    /// This side's session identity and the peer's (0 until the handshake).
    pub local_id: u64,
    pub peer_id: u64,
    /// Messages waiting for credits or a connection / sent and not yet acknowledged.
    pub queued: usize,
    pub unacked: usize,
    /// Credits to send now / receives posted for the peer.
    pub credits: u32,
    pub recv_window: u32,
    /// The application paused the peer's data (`Messenger::pause_receive`).
    pub recv_paused: bool,
    pub counters: SessionCounters,
}

/// Messenger-wide figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MsgrStats {
    /// Sessions not closed.
    pub sessions: usize,
    /// Connections accepted but not handshaken yet.
    pub pending_connections: usize,
    /// The 4 KiB data pool and the header-slot pool.
    pub data_pool: crate::mem::pool::PoolStats,
    pub header_pool: crate::mem::pool::PoolStats,
    /// 64 KiB chunks of the copy pool in use (copies of large unregistered segments).
    pub copy_chunks_in_use: u32,
    /// Malformed headers on connections that were not (yet) a session's.
    pub malformed: u64,
    /// Times a progress loop slept at once instead of polling because its thread had been
    /// waiting for a CPU (a busy host; see `poll_mode`/`polling_us` and `msgr::spin`).
    pub spin_backoffs: u64,
    /// Sessions the progress passes look at now; the others are parked (idle: open,
    /// nothing to do; a completion, their keepalive or a call wakes them).
    pub active_sessions: usize,
    /// Parked sessions found with work by the periodic look instead of being woken (0
    /// unless a wake was missed; each cost up to 100 ms).
    pub missed_wakes: u64,
    /// Counters summed over every session ever made (closed ones included).
    pub totals: SessionCounters,
    /// The listener's peers that failed authentication (wrong key, unknown entity, no or
    /// unwanted authentication, replay, reflection): `src/msgr/auth`.
    pub auth_failures: u64,
    /// Connections the listener refused at a handshake bound (`handshake_max`,
    /// `handshake_per_source`) or for a malformed auth frame.
    pub handshake_refusals: u64,
    /// Connections dropped for not sending an auth frame in time
    /// (`handshake_first_bytes_ms`).
    pub handshake_timeouts: u64,
    /// Links and sessions refused by `msgr_max_pending_links`, `msgr_max_sessions`,
    /// `msgr_max_sessions_per_entity`, or for resuming another entity's session.
    pub session_refusals: u64,
    /// Path-join hellos refused: naming no open session here, or a session of another
    /// entity ([`Messenger::connect_paths`], docs/security.md).
    pub path_join_refusals: u64,
    /// Dispatcher callbacks that panicked: each was caught (the worker lives on), logged
    /// at error level, and ended its session (`on_reset`; the peer sees it closed).
    pub dispatcher_panics: u64,
    /// Shard workers whose loop panicked outside the callbacks (a bug of the messenger):
    /// each was caught, logged at error level, ended the sessions of its shard
    /// (`on_reset`), and the worker went on. 0 normally.
    pub worker_panics: u64,
}

/// A transport fault to inject on a session's current connection (tests, Ceph's
/// `ms_inject_socket_failures`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Shut down the TCP side channel: both sides see EOF and fail their QPs.
    SideChannelClose,
    /// Move this side's QP to ERR (outstanding work flushes), side channel left open.
    QpError,
    /// The next `posts` posts of work requests on this side's connection take only the
    /// first half of their WRs (a single one: none, every other time), as a send queue
    /// with less room would: the rest must go on a later pass
    /// ([`SessionCounters::partial_posts`]).
    PartialPosts { posts: u32 },
}
