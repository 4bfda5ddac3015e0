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

use crate::config::{Config, Source};
use crate::error::{Error, ErrorKind, Result};
use crate::mem::rcache::Handle;
use crate::msgr::messenger::{
    Dispatcher, InMessage, Messenger, OutMessage, Payload, RxSeg, SendId, SessionId,
};
use crate::msgr::{Connection, Context, Listener};
use crate::rc::verbs::{QpState, access};
use parking_lot::Mutex;
use rustc_hash::FxHashMap as HashMap;
use std::collections::VecDeque;
use std::fs::File;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use super::proto::{
    self, BLOCK, INFO_ONE_SIDED, Info, MAX_IO, MSG_REPLY, MSG_REQ, NAME_MAX, Op, Reply, ReqHdr,
};

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
        /// from it); dropped before the mapping (field order).
        _msgr_reg: Handle,
        map: Mapping,
        /// Its key in the one-sided context (exposed to clients).
        rkey: u32,
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
}

struct Inner {
    volumes: Vec<Volume>,
    /// Replies refused with `Full`, sent on `on_send_ready`.
    backlog: Mutex<HashMap<SessionId, VecDeque<OutMessage>>>,
    /// IO buffers in flight (until the client acknowledged the reply) and free ones.
    bufs_out: Mutex<HashMap<(SessionId, SendId), IoBuf>>,
    bufs_free: Mutex<Vec<IoBuf>>,
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
    pub fn start(config: &Config, listen: &str, specs: &[VolumeSpec]) -> Result<Target> {
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
        // The one-sided side: its own context; every region registered with remote access
        // is exposed to every connection of it.
        let (raw_ctx, raw_listener) = if need_raw {
            let ctx = Context::new(&cfg)?;
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
        let mut volumes = Vec::with_capacity(specs.len());
        for s in specs {
            let (size, store) = match &s.kind {
                VolumeKind::Mem(n) => {
                    let len = usize::try_from(*n)
                        .map_err(|_| Error::new(ErrorKind::InvalidArgument, "volume too large"))?;
                    let map = Mapping::new(len)?;
                    // SAFETY: the mapping lives in the volume, which outlives both
                    // registrations (the messenger and the raw context are dropped first,
                    // see `Drop for Target`).
                    let msgr_reg = unsafe {
                        msgr.context().rcache().get(
                            map.ptr,
                            len,
                            access::LOCAL_WRITE | access::REMOTE_READ,
                        )
                    }?;
                    let raw = raw_ctx.as_ref().ok_or_else(|| {
                        Error::new(ErrorKind::InvalidArgument, "no one-sided context")
                    })?;
                    // SAFETY: as above.
                    let mr = unsafe {
                        raw.register(
                            map.ptr,
                            len,
                            access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE,
                        )
                    }?;
                    (
                        *n,
                        Store::Mem {
                            _msgr_reg: msgr_reg,
                            map,
                            rkey: mr.rkey,
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
            volumes,
            backlog: Mutex::new(HashMap::default()),
            bufs_out: Mutex::new(HashMap::default()),
            bufs_free: Mutex::new(Vec::new()),
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
        self.inner.backlog.lock().clear();
        *self.inner.msgr_ctx.lock() = None;
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

struct Disp {
    inner: Arc<Mutex<Option<Arc<Inner>>>>,
}

impl Disp {
    fn inner(&self) -> Option<Arc<Inner>> {
        self.inner.lock().clone()
    }
}

fn errno_reply(op: u8, req_id: u64, errno: i32) -> OutMessage {
    OutMessage::new(
        MSG_REPLY,
        Reply {
            op,
            status: errno as u32,
            req_id,
            len: 0,
            info: None,
        }
        .encode(),
    )
}

impl Inner {
    fn info(&self, vol: u32) -> Option<Info> {
        let v = self.volumes.get(vol as usize)?;
        let (region_addr, region_rkey, flags) = match &v.store {
            Store::Mem { map, rkey, .. } => (map.ptr as u64, *rkey, INFO_ONE_SIDED),
            Store::File { .. } => (0, 0, 0),
        };
        Some(Info {
            vol,
            block_size: BLOCK,
            size: v.size,
            region_addr,
            region_rkey,
            rdma_port: if flags != 0 { self.rdma_port } else { 0 },
            flags,
        })
    }

    /// Serves one request: the reply and, for a large file read, the IO buffer to keep
    /// until the reply is acknowledged.
    fn serve(&self, m: &Messenger, msg: InMessage) -> (OutMessage, Option<IoBuf>) {
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let hdr = match ReqHdr::decode(&msg.front) {
            Ok(h) => h,
            Err(id) => return (errno_reply(0, id.unwrap_or(0), libc::EPROTO), None),
        };
        let op = hdr.op;
        let fail = |e: i32| (errno_reply(op, hdr.req_id, e), None);
        let Some(o) = Op::from_u8(op) else {
            return fail(libc::EOPNOTSUPP);
        };
        if o == Op::Open {
            let name = &hdr.name;
            return match self.volumes.iter().position(|v| v.name.as_bytes() == name) {
                Some(i) => (
                    OutMessage::new(
                        MSG_REPLY,
                        Reply {
                            op,
                            status: 0,
                            req_id: hdr.req_id,
                            len: 0,
                            info: self.info(i as u32),
                        }
                        .encode(),
                    ),
                    None,
                ),
                None => fail(libc::ENOENT),
            };
        }
        if (hdr.place.is_some() || hdr.imm_reply) && o != Op::Read
            || hdr.imm_reply && hdr.place.is_none()
        {
            return fail(libc::EINVAL);
        }
        let Some(vol) = self.volumes.get(hdr.vol as usize) else {
            return fail(libc::ENODEV);
        };
        let ok = |len: u32| Reply {
            op,
            status: 0,
            req_id: hdr.req_id,
            len,
            info: None,
        };
        match o {
            Op::Open => fail(libc::EINVAL),
            Op::Query => (
                OutMessage::new(
                    MSG_REPLY,
                    Reply {
                        info: self.info(hdr.vol),
                        ..ok(0)
                    }
                    .encode(),
                ),
                None,
            ),
            Op::Flush => {
                if let Store::File { file } = &vol.store
                    && let Err(e) = file.sync_data()
                {
                    return fail(e.raw_os_error().unwrap_or(libc::EIO));
                }
                (OutMessage::new(MSG_REPLY, ok(0).encode()), None)
            }
            Op::Write => {
                if let Some(e) = proto::check_range(vol.size, hdr.offset, hdr.len) {
                    return fail(e as i32);
                }
                let mut msg = msg;
                let seg = match msg.data.pop() {
                    Some(s) if msg.data.is_empty() && s.len() == hdr.len as usize => s,
                    _ => return fail(libc::EINVAL),
                };
                if let Err(e) = write_seg(vol, hdr.offset, &seg) {
                    return fail(e);
                }
                drop(seg);
                self.stats
                    .bytes_written
                    .fetch_add(u64::from(hdr.len), Ordering::Relaxed);
                (OutMessage::new(MSG_REPLY, ok(hdr.len).encode()), None)
            }
            Op::Read => {
                if let Some(e) = proto::check_range(vol.size, hdr.offset, hdr.len) {
                    return fail(e as i32);
                }
                let len = hdr.len as usize;
                let (payload, buf) = match &vol.store {
                    Store::Mem { map, .. } => {
                        // SAFETY: in range (checked); the region stays mapped and
                        // registered as long as the target (the messenger is closed
                        // before the volume goes, see `Drop for Target`).
                        let p = unsafe { map.ptr.add(hdr.offset as usize) };
                        // SAFETY: as above; "unmodified until sent" is the client's
                        // business as for any disk (a write racing a read of the same
                        // block returns either).
                        (unsafe { Payload::registered(p, len) }, None)
                    }
                    Store::File { file } => {
                        if len <= BLOCK as usize {
                            let mut c = match m.alloc_chunk() {
                                Ok(c) => c,
                                Err(_) => return fail(libc::EAGAIN),
                            };
                            if let Err(e) =
                                pread_full(file, &mut c.as_mut_slice()[..len], hdr.offset)
                            {
                                return fail(e);
                            }
                            c.set_len(len);
                            (Payload::Chunk(c), None)
                        } else {
                            let mut b = match self.take_buf() {
                                Ok(b) => b,
                                Err(_) => return fail(libc::ENOMEM),
                            };
                            // SAFETY: the buffer is ours (out of the free list), MAX_IO long.
                            let s = unsafe { std::slice::from_raw_parts_mut(b.map.ptr, len) };
                            if let Err(e) = pread_full(file, s, hdr.offset) {
                                self.bufs_free.lock().push(b);
                                return fail(e);
                            }
                            // SAFETY: the buffer is kept in `bufs_out` until the send
                            // completed, and is registered for its whole life.
                            let p = unsafe { Payload::registered(b.map.ptr, len) };
                            let _ = &mut b;
                            (p, Some(b))
                        }
                    }
                };
                self.stats
                    .bytes_read
                    .fetch_add(u64::from(hdr.len), Ordering::Relaxed);
                let reply = match hdr.place {
                    // Asked for: the WRITE WITH IMMEDIATE is the whole answer (the value
                    // names the request), one packet for 4 KiB and no reply SEND.
                    Some((addr, rkey)) if hdr.imm_reply => {
                        self.stats.placed_reads.fetch_add(1, Ordering::Relaxed);
                        self.stats.imm_replies.fetch_add(1, Ordering::Relaxed);
                        OutMessage::immediate(hdr.req_id as u32).with_write(payload, addr, rkey)
                    }
                    // Into the client's buffer: one RDMA WRITE right before the reply's
                    // SEND (a bad address or rkey is the client QP's access error: the
                    // session faults and ends on both sides, nothing else).
                    Some((addr, rkey)) => {
                        self.stats.placed_reads.fetch_add(1, Ordering::Relaxed);
                        OutMessage::new(MSG_REPLY, ok(hdr.len).encode())
                            .with_write(payload, addr, rkey)
                    }
                    None => OutMessage::new(MSG_REPLY, ok(hdr.len).encode()).with(payload),
                };
                (reply, buf)
            }
        }
    }

    fn take_buf(&self) -> Result<IoBuf> {
        if let Some(b) = self.bufs_free.lock().pop() {
            return Ok(b);
        }
        let map = Mapping::new(MAX_IO as usize)?;
        let ctx = self
            .msgr_ctx
            .lock()
            .clone()
            .ok_or_else(|| Error::new(ErrorKind::Closed, "rdmx-target: stopping"))?;
        // SAFETY: the mapping lives in the IoBuf with its handle; the handle is dropped
        // (put back) before the mapping is unmapped (field order).
        let reg = unsafe {
            ctx.rcache()
                .get(map.ptr, map.len, access::LOCAL_WRITE | access::REMOTE_READ)
        }?;
        Ok(IoBuf { _reg: reg, map })
    }

    fn send(&self, m: &Messenger, s: SessionId, msg: OutMessage, buf: Option<IoBuf>) {
        let mut backlog = self.backlog.lock();
        if let Some(q) = backlog.get_mut(&s)
            && !q.is_empty()
        {
            // Replies keep their order behind those waiting. A waiting large read keeps
            // its buffer in the message's payload pointer: not supported, send the copy.
            if let Some(b) = buf {
                q.push_back(copy_out(msg, &b));
                self.bufs_free.lock().push(b);
            } else {
                q.push_back(msg);
            }
            return;
        }
        match m.send(s, msg) {
            Ok(id) => {
                if let Some(b) = buf {
                    self.bufs_out.lock().insert((s, id), b);
                }
            }
            Err(r) if r.kind() == ErrorKind::Full => {
                let msg = match &buf {
                    Some(b) => copy_out(*r.msg, b),
                    None => *r.msg,
                };
                if let Some(b) = buf {
                    self.bufs_free.lock().push(b);
                }
                backlog.entry(s).or_default().push_back(msg);
            }
            Err(r) => {
                log::debug!("rdmx-target: reply to {s:?} dropped: {}", r.error);
                if let Some(b) = buf {
                    self.bufs_free.lock().push(b);
                }
            }
        }
    }

    fn flush_backlog(&self, m: &Messenger, s: SessionId) {
        let mut backlog = self.backlog.lock();
        let Some(q) = backlog.get_mut(&s) else {
            return;
        };
        while let Some(msg) = q.pop_front() {
            match m.send(s, msg) {
                Ok(_) => {}
                Err(r) if r.kind() == ErrorKind::Full => {
                    q.push_front(*r.msg);
                    return;
                }
                Err(_) => {
                    q.clear();
                    break;
                }
            }
        }
        backlog.remove(&s);
    }
}

/// A large read's reply that must wait: its data copied out of the IO buffer (rare: only
/// when the client's session is full).
fn copy_out(mut msg: OutMessage, b: &IoBuf) -> OutMessage {
    let copy = |len: usize| {
        // SAFETY: the buffer is ours and at least `len` (<= MAX_IO) long.
        Payload::Copy(unsafe { std::slice::from_raw_parts(b.map.ptr, len) }.to_vec())
    };
    if let Some(w) = msg.writes.first_mut() {
        w.data = copy(w.data.len());
    } else if let Some(d) = msg.data.first_mut() {
        *d = copy(d.len());
    }
    msg
}

fn pread_full(file: &File, buf: &mut [u8], offset: u64) -> std::result::Result<(), i32> {
    use std::os::unix::fs::FileExt;
    match file.read_exact_at(buf, offset) {
        Ok(()) => Ok(()),
        Err(e) => Err(e.raw_os_error().unwrap_or(libc::EIO)),
    }
}

fn write_seg(vol: &Volume, offset: u64, seg: &RxSeg) -> std::result::Result<(), i32> {
    match &vol.store {
        Store::Mem { map, .. } => {
            let mut at = offset as usize;
            for c in seg.chunks() {
                // SAFETY: `offset + seg.len()` is within the region (checked by the caller).
                unsafe { std::ptr::copy_nonoverlapping(c.as_ptr(), map.ptr.add(at), c.len()) };
                at += c.len();
            }
            Ok(())
        }
        Store::File { file } => {
            let iov: Vec<libc::iovec> = seg
                .chunks()
                .map(|c| libc::iovec {
                    iov_base: c.as_ptr() as *mut libc::c_void,
                    iov_len: c.len(),
                })
                .collect();
            let total: usize = iov.iter().map(|v| v.iov_len).sum();
            // SAFETY: every iovec names a chunk of `seg`, alive across the call; the
            // kernel only reads them.
            let n = unsafe {
                libc::pwritev(
                    file.as_raw_fd(),
                    iov.as_ptr(),
                    iov.len() as i32,
                    offset as libc::off_t,
                )
            };
            if n < 0 {
                return Err(std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO));
            }
            if n as usize != total {
                return Err(libc::EIO);
            }
            Ok(())
        }
    }
}

impl Dispatcher for Disp {
    fn on_message(&self, m: &Messenger, s: SessionId, msg: InMessage) {
        let Some(inner) = self.inner() else {
            return;
        };
        if msg.msg_type != MSG_REQ {
            inner.stats.errors.fetch_add(1, Ordering::Relaxed);
            let id = ReqHdr::decode(&msg.front).map_or_else(|e| e.unwrap_or(0), |h| h.req_id);
            inner.send(m, s, errno_reply(0, id, libc::EPROTO), None);
            return;
        }
        let (reply, buf) = inner.serve(m, msg);
        if Reply::decode(&reply.front).is_some_and(|r| r.status != 0) {
            inner.stats.errors.fetch_add(1, Ordering::Relaxed);
        }
        inner.send(m, s, reply, buf);
    }

    fn on_send_complete(
        &self,
        _m: &Messenger,
        s: SessionId,
        id: SendId,
        _status: crate::error::Result<()>,
    ) {
        let Some(inner) = self.inner() else {
            return;
        };
        let b = inner.bufs_out.lock().remove(&(s, id));
        if let Some(b) = b {
            inner.bufs_free.lock().push(b);
        }
    }

    fn on_send_ready(&self, m: &Messenger, s: SessionId) {
        if let Some(inner) = self.inner() {
            inner.flush_backlog(m, s);
        }
    }

    fn on_reset(&self, _m: &Messenger, s: SessionId, why: &Error) {
        if let Some(inner) = self.inner() {
            inner.stats.resets.fetch_add(1, Ordering::Relaxed);
            inner.backlog.lock().remove(&s);
            log::info!("rdmx-target: client session {s:?} ended: {why}");
        }
    }
}
