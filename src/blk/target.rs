//! The block target: serves named volumes (memory or file) to block clients over the
//! messenger, and exposes memory volumes for one-sided RDMA READ/WRITE on a second
//! listener.
//!
//! Where the bytes go (no bounce copy on the target):
//! - write: the data arrives in messenger pool chunks (page-aligned 4 KiB); a file volume
//!   writes them with one `pwritev` (O_DIRECT) straight from the chunks; a memory volume
//!   copies them into its region (the one copy a memory store makes).
//! - read, file volume: a 4 KiB read is `pread` (O_DIRECT) into a messenger pool chunk
//!   sent as the reply's data (eager: the SEND's second SGE); a larger one is read into a
//!   1 MiB IO buffer registered once in the messenger's registration cache and sent from
//!   there (`Payload::Registered`), the buffer reused once the client acknowledged it.
//! - read, memory volume: the reply's data is the region's slice itself (registered once).
//! - a read whose request names the client's buffer (`proto::REQ_PLACE`, what
//!   `BlkClient` sends) gets its data, from the same sources, by RDMA WRITE into that
//!   buffer right before the reply (`OutMessage::with_write`), not in the reply.
//!
//! Requests are served synchronously on the messenger's thread (`msgr_threads`, default 1
//! for the target): a file volume's IO blocks that thread while the disk works.

mod acl;
mod serve;
mod session;

pub use acl::{Access, Acl, AllowSpec, ENTITY_MAX, check_entity};

use crate::config::{Config, Source};
use crate::error::{Error, ErrorKind, Result};
use crate::mem::rcache::Handle;
use crate::msgr::messenger::{Messenger, SendId, SessionId};
use crate::msgr::{Connection, Context, Listener};
use crate::rc::verbs::{QpState, access};
use parking_lot::Mutex;
use rustc_hash::FxHashMap as HashMap;
use std::fs::File;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use super::proto::{BLOCK, NAME_MAX};
use session::{Disp, Sess};

/// A volume to serve: `NAME=mem:SIZE` or `NAME=file:PATH` on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeSpec {
    pub name: String,
    pub kind: VolumeKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeKind {
    /// A zero-filled memory volume of this many bytes (a multiple of 4 KiB).
    Mem(u64),
    /// A file or block device, opened with O_DIRECT (buffered, with a warning, where the
    /// file system refuses O_DIRECT); its size rounded down to 4 KiB.
    File(String),
}

/// Parses "64M", "1G", "4096", "16K" (binary units).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mul) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1u64 << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
        (i, 't' | 'T') => (&s[..i], 1 << 40),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mul)
}

impl std::str::FromStr for VolumeSpec {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<VolumeSpec, String> {
        let bad = || format!("volume '{s}': expected NAME=mem:SIZE or NAME=file:PATH");
        let (name, rest) = s.split_once('=').ok_or_else(bad)?;
        if name.is_empty() || name.len() > NAME_MAX {
            return Err(format!(
                "volume '{s}': the name must be 1..{NAME_MAX} bytes"
            ));
        }
        let kind = if let Some(size) = rest.strip_prefix("mem:") {
            let n = parse_size(size)
                .ok_or_else(|| format!("volume '{s}': size '{size}' is not a size (e.g. 64M)"))?;
            if n == 0 || n % u64::from(BLOCK) != 0 {
                return Err(format!(
                    "volume '{s}': size {n} must be a positive multiple of {BLOCK}"
                ));
            }
            VolumeKind::Mem(n)
        } else if let Some(path) = rest.strip_prefix("file:") {
            if path.is_empty() {
                return Err(bad());
            }
            VolumeKind::File(path.to_string())
        } else {
            return Err(bad());
        };
        Ok(VolumeSpec {
            name: name.to_string(),
            kind,
        })
    }
}

/// An anonymous mapping (page-aligned), unmapped when dropped.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory; who reads and writes it is ruled by the protocol
// (concurrent IO to the same blocks is the client's business, as on a disk).
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(len: usize) -> Result<Mapping> {
        // SAFETY: an anonymous private mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::new(
                ErrorKind::ResourceLimit,
                format!("mmap {len} bytes: {}", std::io::Error::last_os_error()),
            ));
        }
        Ok(Mapping { ptr: p.cast(), len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping this value owns, once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

enum Store {
    Mem {
        /// The registration of the whole region in the messenger's cache (reads are sent
        /// from it); put back when the target stops, while that cache still exists (else
        /// it warns of a region still named), and in any case before the mapping goes.
        msgr_reg: Mutex<Option<Handle>>,
        map: Mapping,
    },
    File {
        file: File,
    },
}

struct Volume {
    name: String,
    size: u64,
    store: Store,
}

/// An IO buffer for file reads larger than one chunk: 1 MiB, registered once.
struct IoBuf {
    /// Put back before the mapping goes (field order).
    _reg: Handle,
    map: Mapping,
}

/// Counters of a target.
#[derive(Debug, Default)]
pub struct TargetStats {
    pub requests: AtomicU64,
    /// Requests answered with an error status.
    pub errors: AtomicU64,
    pub bytes_read: AtomicU64,
    /// Reads whose data went into the client's buffer by RDMA WRITE (the request named
    /// it), not in the reply.
    pub placed_reads: AtomicU64,
    /// Of those, answered by an immediate message (the client asked: `REQ_IMM_REPLY`).
    pub imm_replies: AtomicU64,
    pub bytes_written: AtomicU64,
    /// Clients (sessions) that ended by a fault (reset), e.g. a client killed mid-IO.
    pub resets: AtomicU64,
    /// One-sided connections accepted.
    pub one_sided_conns: AtomicU64,
    /// Sessions accepted (each logged at info with its peer and entity).
    pub sessions: AtomicU64,
    /// Requests refused by access control: `EACCES` (a volume or an operation the
    /// session's entity is not granted) and `EBADF` (a handle this session did not open).
    pub access_denied: AtomicU64,
    /// Requests set aside unserved because their session was over a quota (its reply
    /// backlog at `max_backlog`, or `session_bufs` reply buffers held); served once it
    /// drains.
    pub deferred: AtomicU64,
    /// Times a session went over a quota (each logged once, at warn).
    pub quota_stalls: AtomicU64,
    /// Sessions closed because they kept sending with `max_deferred` requests set aside.
    pub quota_closes: AtomicU64,
    /// Large file reads that waited for an IO buffer (all `io_bufs` in use).
    pub io_buf_waits: AtomicU64,
}

/// Bounds on what one session (and all together) can make the target hold. A session
/// over `max_backlog` or `session_bufs` stalls: the target pauses its requests
/// (`Messenger::pause_receive`: the client's sends wait in its own queue), sets aside
/// unserved (no IO, no allocation) the few already on the wire, and serves them and
/// resumes once its replies drain. `max_deferred` is a safety net (a session over it is
/// closed) that flow control keeps out of reach. Flags of `rdmx-target`; the defaults fit a client at queue depth 256 of 1 MiB
/// file reads per session with room, and bound a target to ~`io_bufs` MiB of IO buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Replies waiting for the session's credits (the messenger refused them `Full`).
    pub max_backlog: usize,
    /// Reply buffers (pool chunks of 4 KiB file reads, 1 MiB IO buffers of larger ones)
    /// a session holds until its client acknowledges the replies.
    pub session_bufs: usize,
    /// Requests set aside while the session is stalled (at most its receive window once
    /// paused); one more closes the session.
    pub max_deferred: usize,
    /// Bytes (fronts and write data, which hold messenger pool chunks) of the requests
    /// set aside; more closes the session.
    pub max_deferred_bytes: usize,
    /// 1 MiB IO buffers of the whole target.
    pub io_bufs: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_backlog: 1024,
            session_bufs: 64,
            max_deferred: 4096,
            max_deferred_bytes: 32 << 20,
            io_bufs: 256,
        }
    }
}

impl Limits {
    /// Every limit at least 1.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("max-backlog", self.max_backlog),
            ("session-bufs", self.session_bufs),
            ("max-deferred", self.max_deferred),
            ("max-deferred-bytes", self.max_deferred_bytes),
            ("io-bufs", self.io_bufs),
        ] {
            if v == 0 {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!("rdmx-target: --{name} must be at least 1"),
                ));
            }
        }
        Ok(())
    }
}

/// What a target enforces besides its volumes: access control and bounds.
#[derive(Debug, Clone, Default)]
pub struct TargetOptions {
    /// `--allow` grants; empty: every session may open every volume (see [`acl`]).
    pub allow: Vec<AllowSpec>,
    pub limits: Limits,
}

/// Reply buffers in flight by (session, send).
type BufsOut = HashMap<(SessionId, SendId), Option<IoBuf>>;

struct Inner {
    /// The one-sided context: per-session registrations of memory volumes are made in it
    /// (taken out when the target stops).
    raw_ctx: Mutex<Option<Context>>,
    volumes: Vec<Volume>,
    acl: Acl,
    limits: Limits,
    /// Per-session state (handles opened, entity, backlog, requests set aside).
    sessions: Mutex<HashMap<SessionId, Arc<Mutex<Sess>>>>,
    /// Reply buffers in flight (until the client acknowledged the reply): an IO buffer, or
    /// `None` for a pool chunk the messenger owns (counted against the session's quota).
    bufs_out: Mutex<BufsOut>,
    bufs_free: Mutex<Vec<IoBuf>>,
    /// IO buffers created (at most `limits.io_bufs`).
    bufs_made: AtomicUsize,
    /// Sessions with a read waiting for an IO buffer.
    buf_waiters: Mutex<Vec<SessionId>>,
    /// One-sided registrations of ended sessions still named by a work request, retried.
    retired_mrs: Mutex<Vec<u32>>,
    msgr_ctx: Mutex<Option<Context>>,
    rdma_port: u16,
    stats: TargetStats,
}

/// A running target. Dropping it stops it.
pub struct Target {
    msgr: Messenger,
    /// Dropped before the volumes (`inner`): its registrations name their memory.
    _raw_ctx: Option<Context>,
    inner: Arc<Inner>,
    addr: SocketAddr,
    rdma_addr: Option<SocketAddr>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
    /// The thread driving the messenger (caller-driven mode, the default).
    poller: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("addr", &self.addr)
            .field("rdma_addr", &self.rdma_addr)
            .finish_non_exhaustive()
    }
}

fn open_file(path: &str) -> Result<(File, u64)> {
    use std::os::unix::fs::OpenOptionsExt;
    let direct = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path);
    let file = match direct {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            log::warn!("rdmx-target: {path}: O_DIRECT refused by the file system; buffered IO");
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .map_err(|e| Error::new(ErrorKind::Io, format!("open {path}: {e}")))?
        }
        Err(e) => return Err(Error::new(ErrorKind::Io, format!("open {path}: {e}"))),
    };
    // SAFETY: lseek on an fd we own; SEEK_END works for files and block devices alike.
    let end = unsafe { libc::lseek(file.as_raw_fd(), 0, libc::SEEK_END) };
    if end < 0 {
        return Err(Error::new(
            ErrorKind::Io,
            format!("size of {path}: {}", std::io::Error::last_os_error()),
        ));
    }
    let size = end as u64 / u64::from(BLOCK) * u64::from(BLOCK);
    if size == 0 {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("volume file {path} is smaller than one block ({BLOCK} bytes)"),
        ));
    }
    Ok((file, size))
}

impl Target {
    /// Starts a target listening on `listen` ("IP:PORT") for the volumes `specs`.
    /// `config` carries the transport and `msgr_*` keys; `msgr_threads` left at its default
    /// becomes 1 here (the target needs a thread to serve). Memory volumes are also exposed
    /// on a second listener (same IP, a free port, told to clients in the open reply).
    /// Every session may open every volume (no access control) with the default limits:
    /// see [`Target::start_with`].
    pub fn start(config: &Config, listen: &str, specs: &[VolumeSpec]) -> Result<Target> {
        Target::start_with(config, listen, specs, &TargetOptions::default())
    }

    /// [`Target::start`] with access control (`opts.allow`) and bounds (`opts.limits`).
    pub fn start_with(
        config: &Config,
        listen: &str,
        specs: &[VolumeSpec],
        opts: &TargetOptions,
    ) -> Result<Target> {
        if specs.is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "rdmx-target: no volume (give --volume NAME=mem:SIZE|file:PATH)",
            ));
        }
        for (i, a) in specs.iter().enumerate() {
            if specs[..i].iter().any(|b| b.name == a.name) {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!("rdmx-target: volume '{}' given twice", a.name),
                ));
            }
        }
        opts.limits.validate()?;
        let names: Vec<&str> = specs.iter().map(|v| v.name.as_str()).collect();
        let acl = Acl::new(&opts.allow, &names)
            .map_err(|e| Error::new(ErrorKind::InvalidArgument, format!("rdmx-target: {e}")))?;
        if acl.is_open() {
            log::warn!(
                "rdmx-target: no --allow given: every peer that reaches the listener may open, \
                 read and write every volume"
            );
        } else {
            for v in acl.unreachable(&names) {
                log::warn!("rdmx-target: volume '{v}': no --allow names it, nobody can open it");
            }
        }
        let mut cfg = config.clone();
        super::apply_defaults(&mut cfg)?;
        // Left at its default, the messenger is driven by the target's own thread, which
        // polls for `polling_us` (poll_mode adaptive) before it sleeps: a worker thread
        // sleeps at once when a pass finds nothing, and on two shared cores every
        // request then pays a wake-up.
        let own_loop = cfg.source("msgr_threads")? == Source::Default;
        if own_loop {
            cfg.set("msgr_threads", "0")?;
        }
        let listen_ip = std::net::ToSocketAddrs::to_socket_addrs(listen)
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidArgument,
                    format!("listen address '{listen}': expected IP:PORT"),
                )
            })?;
        let need_raw = specs.iter().any(|s| matches!(s.kind, VolumeKind::Mem(_)));
        // The one-sided side: its own context. Its hellos carry no region: a session that
        // may read a memory volume gets a registration of its own (its rkey) in the Open
        // reply, deregistered when the session ends.
        let (raw_ctx, raw_listener) = if need_raw {
            let ctx = Context::new(&cfg)?;
            ctx.set_hello_regions(false);
            let ip = listen_ip.ip();
            let l = ctx.listen(&SocketAddr::new(ip, 0).to_string())?;
            (Some(ctx), Some(l))
        } else {
            (None, None)
        };
        let rdma_port = raw_listener.as_ref().map_or(0, |l| l.local_addr().port());
        let rdma_addr = raw_listener.as_ref().map(Listener::local_addr);
        // The messenger comes first (its context registers the regions); the dispatcher
        // reaches the volumes through `Inner`, set right after.
        let slot: Arc<Mutex<Option<Arc<Inner>>>> = Arc::new(Mutex::new(None));
        let disp = Arc::new(Disp {
            inner: Arc::clone(&slot),
        });
        let msgr = Messenger::new(&cfg, disp)?;
        // The messenger's hellos carry no region either (the memory volumes are registered
        // in its context for reads sent by rendezvous, the pool for eager data).
        msgr.context().set_hello_regions(false);
        let mut volumes = Vec::with_capacity(specs.len());
        for s in specs {
            let (size, store) = match &s.kind {
                VolumeKind::Mem(n) => {
                    let len = usize::try_from(*n)
                        .map_err(|_| Error::new(ErrorKind::InvalidArgument, "volume too large"))?;
                    let map = Mapping::new(len)?;
                    // What the messenger sends from (`send_access`): no remote right with
                    // scoped rkeys, where each read reply's reader gets a window over only
                    // its blocks, on its own QP, until it acknowledges the reply.
                    let mctx = msgr.context();
                    // SAFETY: the mapping lives in the volume, which outlives both
                    // registrations (the messenger and the raw context are dropped first,
                    // see `Drop for Target`).
                    let msgr_reg = unsafe { mctx.rcache().get(map.ptr, len, mctx.send_access()) }?;
                    // The one-sided context pins the region once, with no remote access (this
                    // registration's rkey opens nothing): the sessions' own registrations
                    // then only count the pinned pages instead of pinning (soft: mlock) and
                    // unpinning the whole volume at every open and close.
                    if let Some(raw) = raw_ctx.as_ref() {
                        // SAFETY: as above: the mapping outlives the one-sided context's use.
                        unsafe { raw.register(map.ptr, len, access::LOCAL_WRITE) }?;
                    }
                    (
                        *n,
                        Store::Mem {
                            msgr_reg: Mutex::new(Some(msgr_reg)),
                            map,
                        },
                    )
                }
                VolumeKind::File(path) => {
                    let (file, size) = open_file(path)?;
                    (size, Store::File { file })
                }
            };
            volumes.push(Volume {
                name: s.name.clone(),
                size,
                store,
            });
        }
        let inner = Arc::new(Inner {
            raw_ctx: Mutex::new(raw_ctx.clone()),
            volumes,
            acl,
            limits: opts.limits,
            sessions: Mutex::new(HashMap::default()),
            bufs_out: Mutex::new(HashMap::default()),
            bufs_free: Mutex::new(Vec::new()),
            bufs_made: AtomicUsize::new(0),
            buf_waiters: Mutex::new(Vec::new()),
            retired_mrs: Mutex::new(Vec::new()),
            msgr_ctx: Mutex::new(Some(msgr.context().clone())),
            rdma_port,
            stats: TargetStats::default(),
        });
        *slot.lock() = Some(Arc::clone(&inner));
        let addr = msgr.listen(listen)?;
        let stop = Arc::new(AtomicBool::new(false));
        let poller = if own_loop {
            let stop = Arc::clone(&stop);
            let m = msgr.clone();
            Some(
                std::thread::Builder::new()
                    .name("rdmx-target".into())
                    .spawn(move || serve_loop(&m, &stop))
                    .map_err(|e| Error::new(ErrorKind::Io, format!("thread: {e}")))?,
            )
        } else {
            None
        };
        let acceptor = match raw_listener {
            Some(l) => {
                let stop = Arc::clone(&stop);
                let inner = Arc::clone(&inner);
                Some(
                    std::thread::Builder::new()
                        .name("rdmx-target-1s".into())
                        .spawn(move || accept_loop(l, &stop, &inner))
                        .map_err(|e| Error::new(ErrorKind::Io, format!("thread: {e}")))?,
                )
            }
            None => None,
        };
        Ok(Target {
            msgr,
            inner,
            addr,
            rdma_addr,
            stop,
            acceptor,
            poller,
            _raw_ctx: raw_ctx,
        })
    }

    /// The messenger's listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The one-sided listener's address (memory volumes only).
    pub fn rdma_addr(&self) -> Option<SocketAddr> {
        self.rdma_addr
    }

    /// Name and size of each volume.
    pub fn volumes(&self) -> Vec<(String, u64)> {
        self.inner
            .volumes
            .iter()
            .map(|v| (v.name.clone(), v.size))
            .collect()
    }

    pub fn stats(&self) -> &TargetStats {
        &self.inner.stats
    }

    /// The messenger (sessions, pool figures).
    pub fn messenger(&self) -> &Messenger {
        &self.msgr
    }

    /// Sessions the target keeps state for (handles opened, backlog): dropped when a
    /// session ends.
    pub fn session_states(&self) -> usize {
        self.inner.sessions.lock().len()
    }

    /// 1 MiB IO buffers made so far (at most `Limits::io_bufs`).
    pub fn io_buffers_made(&self) -> usize {
        self.inner.bufs_made.load(Ordering::Relaxed)
    }

    /// IO buffers (1 MiB, for large file reads) handed out and not yet back.
    pub fn io_buffers_out(&self) -> usize {
        self.inner.bufs_out.lock().len()
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.acceptor.take() {
            let _ = h.join();
        }
        if let Some(h) = self.poller.take() {
            let _ = h.join();
        }
        for s in self.msgr.sessions() {
            let _ = self.msgr.close_session(s);
        }
        let sessions: Vec<_> = self.inner.sessions.lock().drain().collect();
        for (_, sess) in sessions {
            self.inner.end_session(&mut sess.lock());
        }
        // Registrations in the messenger's cache go back before the messenger (a field
        // dropped after this body) drops the cache: the volumes' regions and the idle IO
        // buffers (those in flight stay: a work request may still name them).
        let rcache = self.msgr.context().rcache();
        for v in &self.inner.volumes {
            if let Store::Mem { msgr_reg, .. } = &v.store
                && let Some(h) = msgr_reg.lock().take()
            {
                let _ = rcache.put(h);
            }
        }
        for b in self.inner.bufs_free.lock().drain(..) {
            let IoBuf { _reg, map } = b;
            let _ = rcache.put(_reg);
            drop(map);
        }
        *self.inner.msgr_ctx.lock() = None;
        *self.inner.raw_ctx.lock() = None;
    }
}

/// Drives the messenger: `poll` keeps polling while there is work and for the spin budget
/// after the last of it (`poll_mode`/`polling_us`, backing off on a busy host; see
/// `msgr::spin`), then sleeps until the next arrival.
fn serve_loop(m: &Messenger, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        if let Err(e) = m.poll(Duration::from_millis(20)) {
            log::error!("rdmx-target: poll: {e}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Accepts one-sided connections and keeps them until their peer leaves. The soft
/// provider's progress thread answers their READs/WRITEs (`req_notify` hands receiving to
/// it, as nobody polls these connections).
fn accept_loop(l: Listener, stop: &AtomicBool, inner: &Inner) {
    let mut conns: Vec<Connection> = Vec::new();
    while !stop.load(Ordering::Acquire) {
        match l.accept(Some(Duration::from_millis(100))) {
            Ok(c) => {
                c.req_notify();
                inner.stats.one_sided_conns.fetch_add(1, Ordering::Relaxed);
                conns.push(c);
            }
            Err(e) if e.kind() == ErrorKind::Timeout => {}
            Err(e) => {
                log::debug!("rdmx-target: one-sided accept: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        conns.retain(|c| c.qp_state() != QpState::Err);
    }
}

/// Access control with an entity on the session. The entity comes from the side channel's
/// authentication (`session::session_entity`); here it is set on the target's state for
/// the session, as that lookup would, so that every decision runs through `serve`.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::blk::proto::{INFO_ONE_SIDED, INFO_READ_ONLY, MSG_REQ, Op, Reply, ReqHdr};
    use crate::msgr::messenger::{Dispatcher, InMessage, OutMessage, Payload, Policy};
    use std::time::Instant;

    struct Sink(Mutex<Vec<InMessage>>);
    impl Dispatcher for Sink {
        fn on_message(&self, _m: &Messenger, _s: SessionId, msg: InMessage) {
            self.0.lock().push(msg);
        }
    }

    fn call(m: &Messenger, s: SessionId, sink: &Sink, h: ReqHdr, data: bool) -> Reply {
        let id = h.req_id;
        let mut msg = OutMessage::new(MSG_REQ, h.encode());
        if data {
            msg = msg.with(Payload::Copy(vec![7; 4096]));
        }
        m.send(s, msg).unwrap();
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(r) = sink
                .0
                .lock()
                .iter()
                .filter_map(|x| Reply::decode(&x.front))
                .find(|r| r.req_id == id)
            {
                return r;
            }
            assert!(Instant::now() < end, "no reply to {id}");
            m.poll(Duration::from_millis(20)).unwrap();
        }
    }

    fn req(op: Op, vol: u32, id: u64, name: &[u8]) -> ReqHdr {
        ReqHdr {
            op: op as u8,
            vol,
            req_id: id,
            offset: 0,
            len: if matches!(op, Op::Read | Op::Write) {
                4096
            } else {
                0
            },
            place: None,
            imm_reply: false,
            name: name.to_vec(),
        }
    }

    /// A session of `entity` to `t`: its messenger, id and inbox.
    fn session_as(t: &Target, entity: &str) -> (Messenger, SessionId, Arc<Sink>) {
        let sink = Arc::new(Sink(Mutex::new(Vec::new())));
        let mut c = Config::new();
        crate::blk::apply_defaults(&mut c).unwrap();
        let m = Messenger::new(&c, sink.clone()).unwrap();
        let known: Vec<SessionId> = t.inner.sessions.lock().keys().copied().collect();
        let s = m.connect(&t.addr().to_string(), Policy::Lossy).unwrap();
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let new = t
                .inner
                .sessions
                .lock()
                .iter()
                .find(|(k, _)| !known.contains(k))
                .map(|(_, v)| Arc::clone(v));
            if let Some(sess) = new {
                sess.lock().entity = Some(entity.to_string());
                return (m, s, sink);
            }
            assert!(Instant::now() < end, "the target never saw the session");
            m.poll(Duration::from_millis(10)).unwrap();
        }
    }

    #[test]
    fn grants_rule_open_read_write_flush_and_one_sided_access() {
        let opts = TargetOptions {
            allow: vec![
                "v0=client.a:rw,client.b:ro".parse().unwrap(),
                "secret=client.a:ro".parse().unwrap(),
            ],
            limits: Limits::default(),
        };
        let specs: Vec<VolumeSpec> = ["v0=mem:1M", "secret=mem:1M"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let t = Target::start_with(&Config::new(), "127.0.0.1:0", &specs, &opts).unwrap();
        let eacces = libc::EACCES as u32;
        // client.b: v0 read-only, secret not at all.
        let (mb, sb, kb) = session_as(&t, "client.b");
        let r = call(&mb, sb, &kb, req(Op::Open, 0, 1, b"v0"), false);
        let ib = r.info.unwrap();
        assert_eq!(r.status, 0);
        assert_eq!(ib.flags, INFO_ONE_SIDED | INFO_READ_ONLY);
        assert_eq!(
            call(&mb, sb, &kb, req(Op::Read, 0, 2, b""), false).status,
            0
        );
        assert_eq!(
            call(&mb, sb, &kb, req(Op::Write, 0, 3, b""), true).status,
            eacces
        );
        assert_eq!(
            call(&mb, sb, &kb, req(Op::Flush, 0, 4, b""), false).status,
            eacces
        );
        assert_eq!(
            call(&mb, sb, &kb, req(Op::Query, 0, 5, b""), false).status,
            0
        );
        assert_eq!(
            call(&mb, sb, &kb, req(Op::Open, 0, 6, b"secret"), false).status,
            eacces
        );
        // Not opened (refused), so its handle is not valid either.
        assert_eq!(
            call(&mb, sb, &kb, req(Op::Read, 1, 7, b""), false).status,
            libc::EBADF as u32
        );
        // client.a: v0 read-write, secret read-only.
        let (ma, sa, ka) = session_as(&t, "client.a");
        let ia = call(&ma, sa, &ka, req(Op::Open, 0, 1, b"v0"), false)
            .info
            .unwrap();
        assert_eq!(ia.flags, INFO_ONE_SIDED);
        assert_eq!(
            call(&ma, sa, &ka, req(Op::Write, 0, 2, b""), true).status,
            0
        );
        assert_eq!(
            call(&ma, sa, &ka, req(Op::Flush, 0, 3, b""), false).status,
            0
        );
        let is = call(&ma, sa, &ka, req(Op::Open, 0, 4, b"secret"), false)
            .info
            .unwrap();
        assert_eq!(is.flags, INFO_ONE_SIDED | INFO_READ_ONLY);
        assert_eq!(
            call(&ma, sa, &ka, req(Op::Write, 1, 5, b""), true).status,
            eacces
        );
        // An entity with no grant: nothing.
        let (mc, sc, kc) = session_as(&t, "client.c");
        assert_eq!(
            call(&mc, sc, &kc, req(Op::Open, 0, 1, b"v0"), false).status,
            eacces
        );
        // The one-sided registrations carry the grant: read-only sessions get no REMOTE_WRITE.
        let acc = |rkey: u32| {
            let sessions: Vec<_> = t.inner.sessions.lock().values().cloned().collect();
            sessions
                .iter()
                .find_map(|s| {
                    s.lock()
                        .opened
                        .iter()
                        .find(|o| o.mr.is_some_and(|m| m.rkey == rkey))
                        .and_then(|o| o.mr)
                })
                .unwrap()
                .access
        };
        assert_eq!(acc(ib.region_rkey) & access::REMOTE_WRITE, 0);
        assert_eq!(acc(is.region_rkey) & access::REMOTE_WRITE, 0);
        assert_ne!(acc(ia.region_rkey) & access::REMOTE_WRITE, 0);
        assert_ne!(acc(ib.region_rkey) & access::REMOTE_READ, 0);
        assert!(t.stats().access_denied.load(Ordering::Relaxed) >= 6);
    }
}
