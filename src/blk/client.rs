//! The block client: opens a volume on a target, submits batches of read/write/flush
//! requests into caller buffers, and reports completions by cookie.
//!
//! Two modes:
//! - [`Mode::Rpc`]: every IO is a request message and a reply. Write data goes from the
//!   caller's buffer (registered through the messenger's registration cache: no copy).
//!   A read's request names the caller's buffer (address and rkey, registered in the same
//!   cache with local + remote write access, read buffers only), and the target RDMA
//!   WRITEs the data there right before its reply, on the same connection: when the
//!   reply arrives the data is in place (RC ordering). No copy in rdmx (a target that
//!   answers with the data in the reply instead is still served, by one copy, counted in
//!   [`BlkCounters::copied_bytes`]).
//! - [`Mode::Read`] (memory volumes): reads and writes are one-sided RDMA READ/WRITE
//!   between the caller's buffer (registered through the one-sided context's cache) and
//!   the volume's region: no copy anywhere, no target CPU. Flush and query still go
//!   through the target.
//!
//! Sessions are lossy: a target that dies fails every IO in flight with `EIO` at once (its
//! side channel closes), and later submissions are refused with `Closed`.

use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::mem::rcache::Handle;
use crate::msgr::messenger::{
    Dispatcher, InMessage, MSG_TYPE_IMM, Messenger, OutMessage, Payload, Policy, SendId, SessionId,
};
use crate::msgr::{Connection, Context};
use crate::provider::sys::EventFd;
use crate::provider::types::{SendReq, Wc};
use crate::rc::memory::Sge;
use crate::rc::verbs::{WcStatus, WrOpcode, access, send_flags};
use parking_lot::Mutex;
use rustc_hash::FxHashMap as HashMap;
use std::collections::VecDeque;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::proto::{
    INFO_ONE_SIDED, INFO_READ_ONLY, Info, MAX_IO, MSG_REPLY, MSG_REQ, Op, Reply, ReqHdr,
};

/// How reads and writes travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Through the target: request + reply messages.
    Rpc,
    /// One-sided RDMA READ/WRITE on the volume's region (memory volumes).
    Read,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Mode, String> {
        match s {
            "rpc" => Ok(Mode::Rpc),
            "read" => Ok(Mode::Read),
            _ => Err(format!("mode '{s}': expected rpc or read")),
        }
    }
}

/// One IO request. `buf` is the caller's memory: `len` bytes written from it or read into
/// it; it must stay valid until the request's completion is returned by [`BlkClient::poll`].
#[derive(Debug, Clone, Copy)]
pub struct Req {
    pub op: Op,
    pub offset: u64,
    pub len: u32,
    pub buf: *mut u8,
    pub cookie: u64,
}

/// One finished request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub cookie: u64,
    /// 0, or a negative errno (`-EIO` when the target is gone, `-EINVAL`/`-ERANGE` for a
    /// misaligned or out-of-range request, ...).
    pub status: i32,
    /// Bytes transferred (the request's length on success).
    pub len: u32,
}

/// A volume's size and block size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeInfo {
    pub size: u64,
    pub block_size: u32,
    /// Its region is open to one-sided READ/WRITE (`Mode::Read` works).
    pub one_sided: bool,
}

struct Pending {
    cookie: u64,
    op: Op,
    buf: usize,
    len: u32,
    /// A read's buffer registration (remote write), named in the request: put back when
    /// the request finishes (the target writes no more after its reply, and nothing after
    /// the session ended: its connection is gone by then).
    reg: Option<Handle>,
    /// The reply's status, once it arrived.
    replied: Option<i32>,
    /// The request's message was acknowledged (or failed): the messenger no longer reads
    /// the caller's buffer.
    acked: bool,
}

#[derive(Default)]
struct State {
    inflight: HashMap<u64, Pending>,
    by_send: HashMap<SendId, u64>,
    done: VecDeque<Completion>,
    /// Replies to control requests (open, query) by request id.
    control: HashMap<u64, Reply>,
    /// Why the session ended, and the kind callers get (Auth when the handshake was
    /// refused for the key, Closed otherwise).
    dead: Option<(ErrorKind, String)>,
    connected: bool,
    /// Registrations of finished requests, put back after the lock is released.
    to_put: Vec<Handle>,
    counters: BlkCounters,
    /// The newest request id sent: an immediate reply names its request by the low 32
    /// bits, and the ids in flight span far less than 2^32.
    last_id: u64,
    /// Cookies of requests that completed with `-EIO` because the session ended before
    /// the target answered them (not an error the target reported): what a multipath
    /// client re-issues on another path (`take_session_failed`). Bounded by the requests
    /// in flight when the session ended (later submissions are refused).
    session_failed: rustc_hash::FxHashSet<u64>,
}

/// What the client moved and how (rpc mode).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlkCounters {
    /// Reads whose data the target wrote into the caller's buffer (RDMA WRITE before the
    /// reply): no copy.
    pub placed_reads: u64,
    pub placed_bytes: u64,
    /// Reads whose data came in the reply instead (a target that does not place) and was
    /// copied into the caller's buffer, and those bytes: the copies rdmx made on reads.
    pub copied_reads: u64,
    pub copied_bytes: u64,
    /// Replies that named no request in flight (already finished, or never sent):
    /// ignored.
    pub stray_replies: u64,
    /// Of the placed reads, those the target answered by the WRITE's immediate value
    /// alone (`REQ_IMM_REPLY`, asked for every placed read): no reply message.
    pub imm_replies: u64,
}

struct Shared {
    st: Mutex<State>,
    /// Signalled when a completion is queued by a worker thread.
    efd: EventFd,
    /// The messenger runs worker threads: completions are signalled on `efd`. A
    /// caller-driven client queues them on the caller's own thread, inside `poll`, and
    /// saves the write (and the read that resets it) per completion.
    signal: AtomicBool,
}

impl Shared {
    fn finish(&self, st: &mut State, req_id: u64) {
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

    fn fail_all(&self, st: &mut State, kind: ErrorKind, why: String) {
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

struct Disp {
    sh: Arc<Shared>,
}

/// Puts back the registrations finished requests left (outside the state's lock).
fn put_back(m: &Messenger, st: &mut State) {
    if st.to_put.is_empty() {
        return;
    }
    let hs = std::mem::take(&mut st.to_put);
    for h in hs {
        let _ = m.context().rcache().put(h);
    }
}

impl Disp {
    /// A placed read answered by the target's WRITE WITH IMMEDIATE (`REQ_IMM_REPLY`): the
    /// value is the low half of the request id; the data is in the caller's buffer (the
    /// WRITE landed before the messenger delivered this, RC order).
    fn on_imm_reply(&self, m: &Messenger, front: &[u8]) {
        let Ok(tag) = <[u8; 4]>::try_from(front) else {
            return;
        };
        let tag = u64::from(u32::from_le_bytes(tag));
        let mut st = self.sh.st.lock();
        // The newest id with these low bits, not newer than the newest sent.
        let mut id = (st.last_id & !0xffff_ffff) | tag;
        if id > st.last_id {
            id = id.wrapping_sub(1 << 32);
        }
        let Some(p) = st
            .inflight
            .get_mut(&id)
            .filter(|p| p.op == Op::Read && p.reg.is_some() && p.replied.is_none())
        else {
            st.counters.stray_replies += 1;
            return;
        };
        p.replied = Some(0);
        p.acked = true;
        let len = p.len;
        st.counters.placed_reads += 1;
        st.counters.placed_bytes += u64::from(len);
        st.counters.imm_replies += 1;
        self.sh.finish(&mut st, id);
        put_back(m, &mut st);
    }
}

impl Dispatcher for Disp {
    fn on_connect(&self, _m: &Messenger, _s: SessionId, _peer: SocketAddr, _incoming: bool) {
        self.sh.st.lock().connected = true;
    }

    fn on_message(&self, m: &Messenger, _s: SessionId, msg: InMessage) {
        if msg.msg_type == MSG_TYPE_IMM {
            return self.on_imm_reply(m, &msg.front);
        }
        if msg.msg_type != MSG_REPLY {
            return;
        }
        let Some(r) = Reply::decode(&msg.front) else {
            return;
        };
        let mut st = self.sh.st.lock();
        let Some(p) = st.inflight.get_mut(&r.req_id) else {
            if r.op == Op::Open as u8 || r.op == Op::Query as u8 || r.op == 0 {
                st.control.insert(r.req_id, r);
            } else {
                // A reply for a request no longer here (answered twice, or never asked):
                // its data (if any) is not copied anywhere, nothing completes.
                st.counters.stray_replies += 1;
            }
            return;
        };
        let mut status = -(r.status as i32);
        let (mut placed, mut copied) = (0, 0);
        if status == 0 && p.op == Op::Read {
            match msg.data.first() {
                // The target wrote the data into the caller's buffer before this reply
                // (same connection, RC order): nothing to move.
                None if p.reg.is_some() && r.len == p.len => placed = p.len,
                Some(seg) if seg.len() == p.len as usize && r.len == p.len => {
                    // A target that does not place reads: pool chunk -> caller buffer.
                    copied = p.len;
                    let mut at = p.buf;
                    for c in seg.chunks() {
                        // SAFETY: the caller's buffer holds `p.len` bytes and stays valid
                        // until its completion is returned (the `Req` contract).
                        unsafe {
                            std::ptr::copy_nonoverlapping(c.as_ptr(), at as *mut u8, c.len())
                        };
                        at += c.len();
                    }
                }
                _ => status = -libc::EIO,
            }
        }
        p.replied = Some(status);
        // A reply means the target received the request: reads have nothing more to wait
        // for; writes wait for the acknowledgement (their buffer may be replayed until
        // then), which the reply's header normally carried already.
        if p.op != Op::Write {
            p.acked = true;
        }
        if status == 0 && placed > 0 {
            st.counters.placed_reads += 1;
            st.counters.placed_bytes += u64::from(placed);
        }
        if status == 0 && copied > 0 {
            st.counters.copied_reads += 1;
            st.counters.copied_bytes += u64::from(copied);
        }
        self.sh.finish(&mut st, r.req_id);
        put_back(m, &mut st);
    }

    fn on_send_complete(
        &self,
        m: &Messenger,
        _s: SessionId,
        id: SendId,
        status: crate::error::Result<()>,
    ) {
        let mut st = self.sh.st.lock();
        let Some(req_id) = st.by_send.remove(&id) else {
            return;
        };
        let mut lost = None;
        if let Some(p) = st.inflight.get_mut(&req_id) {
            p.acked = true;
            if status.is_err() && p.replied.is_none() {
                p.replied = Some(-libc::EIO);
                lost = Some(p.cookie);
            }
        }
        if let Some(cookie) = lost {
            st.session_failed.insert(cookie);
        }
        self.sh.finish(&mut st, req_id);
        put_back(m, &mut st);
    }

    fn on_reset(&self, m: &Messenger, _s: SessionId, why: &Error) {
        let mut st = self.sh.st.lock();
        // A refused authentication stays an Auth error (RDMX_AUTH): retrying cannot help.
        let kind = if why.kind() == ErrorKind::Auth {
            ErrorKind::Auth
        } else {
            ErrorKind::Closed
        };
        self.sh.fail_all(
            &mut st,
            kind,
            format!("the session to the target ended: {why}"),
        );
        put_back(m, &mut st);
    }
}

/// A one-sided request prepared for a batched post.
struct Prepared {
    /// None: failed locally (`errno`).
    wr: Option<SendReq>,
    cookie: u64,
    len: u32,
    handle: Option<Handle>,
    errno: i32,
}

/// One-sided access to a memory volume.
struct OneSided {
    ctx: Context,
    conn: Connection,
    region_addr: u64,
    rkey: u32,
    /// The target granted this session read access only (`INFO_READ_ONLY`).
    read_only: bool,
    /// WR cookie -> (request cookie, len, registration of the caller's buffer).
    inflight: HashMap<u64, (u64, u32, Handle)>,
    next: u64,
    wcs: Vec<Wc>,
}

/// A block client: one session (and in `Mode::Read` one RC connection) to a target, one
/// open volume. Not `Sync`-shared by design: one thread submits and polls (fio's model);
/// with `msgr_threads` > 0 the messenger's thread runs the callbacks.
pub struct BlkClient {
    msgr: Messenger,
    session: SessionId,
    sh: Arc<Shared>,
    vol: u32,
    info: VolumeInfo,
    mode: Mode,
    caller_driven: bool,
    /// One-sided mode's polling before sleeping (None: never sleep), from
    /// `poll_mode`/`polling_us` (rpc mode: the messenger's `poll` polls for its budget).
    spin_one: Option<Duration>,
    /// When the messenger last ran a pass (one-sided mode polls it about every ms, for
    /// keepalives and flushes).
    last_msgr: Mutex<Instant>,
    next_id: u64,
    one: Option<Mutex<OneSided>>,
    /// Long-lived registrations (`register`), put back on drop.
    pinned: Vec<(Handle, bool)>,
}

impl std::fmt::Debug for BlkClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlkClient")
            .field("session", &self.session)
            .field("info", &self.info)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

fn resolve(addr: &str) -> Result<SocketAddr> {
    addr.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("target address '{addr}': expected HOST:PORT"),
            )
        })
}

impl BlkClient {
    /// Connects to the target at `addr` ("HOST:PORT") and opens `volume`, within
    /// `timeout`. `config`: transport and `msgr_*` keys (`msgr_threads` 0, the default,
    /// means [`BlkClient::poll`] drives everything on the caller's thread).
    pub fn open(
        config: &Config,
        addr: &str,
        volume: &str,
        mode: Mode,
        timeout: Duration,
    ) -> Result<BlkClient> {
        let target = resolve(addr)?;
        if volume.is_empty() || volume.len() > super::proto::NAME_MAX {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("volume name '{volume}': must be 1..255 bytes"),
            ));
        }
        let efd = EventFd::new()?;
        let sh = Arc::new(Shared {
            st: Mutex::new(State::default()),
            efd,
            signal: AtomicBool::new(false),
        });
        let mut cfg = config.clone();
        super::apply_defaults(&mut cfg)?;
        let config = &cfg;
        let msgr = Messenger::new(
            config,
            Arc::new(Disp {
                sh: Arc::clone(&sh),
            }),
        )?;
        let caller_driven = msgr.settings().threads == 0;
        sh.signal.store(!caller_driven, Ordering::Relaxed);
        let spin_one = super::one_sided_spin(config)?;
        let session = msgr.connect(&target.to_string(), Policy::Lossy)?;
        let mut c = BlkClient {
            msgr,
            session,
            sh,
            vol: 0,
            info: VolumeInfo {
                size: 0,
                block_size: 0,
                one_sided: false,
            },
            mode,
            caller_driven,
            spin_one,
            last_msgr: Mutex::new(Instant::now()),
            next_id: 1,
            one: None,
            pinned: Vec::new(),
        };
        let deadline = Instant::now() + timeout;
        let r = c.control(Op::Open, volume.as_bytes(), deadline)?;
        if r.status != 0 {
            let e = std::io::Error::from_raw_os_error(r.status as i32);
            // EACCES: the target's access control grants this entity nothing on the
            // volume (or, with auth = none, the target grants only named entities).
            let (kind, why) = match r.status as i32 {
                libc::ENOENT => (ErrorKind::InvalidArgument, ""),
                libc::EACCES => (
                    ErrorKind::Auth,
                    " (the target's --allow grants this entity no access to it)",
                ),
                _ => (ErrorKind::Io, ""),
            };
            return Err(Error::new(
                kind,
                format!("open volume '{volume}' on {target}: {e}{why}"),
            ));
        }
        let info = r.info.unwrap_or_default();
        c.vol = info.vol;
        c.info = VolumeInfo {
            size: info.size,
            block_size: info.block_size,
            one_sided: info.flags & INFO_ONE_SIDED != 0,
        };
        if mode == Mode::Read {
            c.one = Some(Mutex::new(Self::one_sided(
                config, target, &info, deadline,
            )?));
        }
        Ok(c)
    }

    fn one_sided(
        config: &Config,
        target: SocketAddr,
        info: &Info,
        deadline: Instant,
    ) -> Result<OneSided> {
        if info.flags & INFO_ONE_SIDED == 0 || info.rdma_port == 0 {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "mode=read needs a memory volume (this one is a file: use mode=rpc)",
            ));
        }
        let ctx = Context::new(config)?;
        let addr = SocketAddr::new(target.ip(), info.rdma_port);
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(100));
        let conn = ctx.connect(&addr.to_string(), left)?;
        // The region and its rkey come from the Open reply (this session's own
        // registration): the target's one-sided hello discloses no region.
        if info.region_rkey == 0 || info.region_addr == 0 {
            return Err(Error::new(
                ErrorKind::Io,
                "the target's Open reply names no one-sided region for this volume",
            ));
        }
        let wcs = vec![
            Wc {
                cookie: 0,
                status: WcStatus::Success,
                opcode: crate::rc::verbs::WcOpcode::Send,
                byte_len: 0,
                imm: None,
                qp_num: 0,
                src_qp: None,
            };
            64
        ];
        Ok(OneSided {
            ctx,
            conn,
            region_addr: info.region_addr,
            rkey: info.region_rkey,
            read_only: info.flags & INFO_READ_ONLY != 0,
            inflight: HashMap::default(),
            next: 1,
            wcs,
        })
    }

    /// Sends a control request and waits for its reply.
    fn control(&mut self, op: Op, name: &[u8], deadline: Instant) -> Result<Reply> {
        let id = self.next_id;
        self.next_id += 1;
        let hdr = ReqHdr {
            op: op as u8,
            vol: self.vol,
            req_id: id,
            offset: 0,
            len: 0,
            place: None,
            imm_reply: false,
            name: name.to_vec(),
        };
        self.msgr
            .send(self.session, OutMessage::new(MSG_REQ, hdr.encode()))
            .map_err(|r| r.error)?;
        loop {
            {
                let mut st = self.sh.st.lock();
                if let Some(r) = st.control.remove(&id) {
                    return Ok(r);
                }
                if let Some((kind, why)) = &st.dead {
                    return Err(Error::new(*kind, why.clone()));
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!("no answer from the target to {op:?} in time"),
                ));
            }
            self.wait(left.min(Duration::from_millis(10)))?;
        }
    }

    /// Registers `[ptr, ptr + len)` for the client's lifetime in the messenger's cache
    /// and, in `Mode::Read`, the one-sided context's: requests inside it are cache hits.
    ///
    /// # Safety
    /// The memory must stay mapped until the client is dropped.
    pub unsafe fn register(&mut self, ptr: *mut u8, len: usize) -> Result<()> {
        // In rpc mode reads name their buffers for the target's WRITE: the area serves
        // reads and writes (fio's buffers), so it is pinned with remote write as well as
        // remote read, and every request inside it is a cache hit. Pinned with remote read
        // only, each read re-registered its pages with remote write, and fio's 4 KiB
        // buffers, not page-aligned (fio aligns them only with direct=1), share pages
        // with their neighbours: each registration retired the neighbours' (an mlock, an
        // munlock and a getrandom for the rkey on 3 reads in 4, measured with strace).
        let acc = access::LOCAL_WRITE
            | access::REMOTE_READ
            | if self.mode == Mode::Rpc {
                access::REMOTE_WRITE
            } else {
                0
            };
        // SAFETY: this function's contract (mapped until the client is dropped, which puts
        // the handle back first).
        let h = unsafe { self.msgr.context().rcache().get(ptr, len, acc) }?;
        self.pinned.push((h, false));
        if let Some(one) = &self.one {
            let o = one.lock();
            // SAFETY: as above.
            let h = unsafe { o.ctx.rcache().get(ptr, len, access::LOCAL_WRITE) }?;
            drop(o);
            self.pinned.push((h, true));
        }
        Ok(())
    }

    /// Queries the volume's size and block size again.
    pub fn query(&mut self, timeout: Duration) -> Result<VolumeInfo> {
        let r = self.control(Op::Query, &[], Instant::now() + timeout)?;
        if r.status != 0 {
            return Err(Error::new(
                ErrorKind::Io,
                format!(
                    "query: {}",
                    std::io::Error::from_raw_os_error(r.status as i32)
                ),
            ));
        }
        let i = r.info.unwrap_or_default();
        Ok(VolumeInfo {
            size: i.size,
            block_size: i.block_size,
            one_sided: i.flags & INFO_ONE_SIDED != 0,
        })
    }

    pub fn info(&self) -> VolumeInfo {
        self.info
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Requests in flight.
    pub fn inflight(&self) -> usize {
        let n = self.sh.st.lock().inflight.len();
        n + self.one.as_ref().map_or(0, |o| o.lock().inflight.len())
    }

    /// The eventfd that becomes readable when completions are ready, with worker threads
    /// (`msgr_threads` above 0, rpc mode). In caller-driven mode nothing happens between
    /// calls of [`BlkClient::poll`]: wait in `poll` instead.
    pub fn event_fd(&self) -> RawFd {
        self.sh.efd.raw_fd()
    }

    /// Submits `reqs` in order and returns how many were accepted: fewer when a queue is
    /// full (poll, then submit the rest). A request the client can tell is wrong (length
    /// 0 or above 1 MiB, NULL buffer) is accepted and completes with `-EINVAL`; range and
    /// alignment are the target's to judge (it answers `-EINVAL`/`-ERANGE`). `Closed` once
    /// the target is gone.
    ///
    /// # Safety
    /// Each request's `buf` must be valid for `len` bytes (writable for reads) and stay so,
    /// untouched by the caller, until its completion was returned by `poll` or the client
    /// was dropped (a read's buffer is open to the target's RDMA WRITE until then: dropping
    /// the client closes its connection before it returns).
    pub unsafe fn submit(&mut self, reqs: &[Req]) -> Result<usize> {
        let mut n = 0;
        let mut batch: Vec<Prepared> = Vec::new();
        for r in reqs {
            {
                let st = self.sh.st.lock();
                if let Some((kind, why)) = &st.dead {
                    if n > 0 {
                        return Ok(n);
                    }
                    return Err(Error::new(*kind, why.clone()));
                }
            }
            let bad = matches!(r.op, Op::Read | Op::Write)
                && (r.len == 0 || r.len > MAX_IO || r.buf.is_null());
            if bad || matches!(r.op, Op::Open | Op::Query) {
                if !batch.is_empty() {
                    // Keep completions in order of acceptance: post what waits first.
                    let want = batch.len();
                    let k = self.post_one_sided(&mut batch)?;
                    n += k;
                    if k < want {
                        return Ok(n);
                    }
                }
                let mut st = self.sh.st.lock();
                st.done.push_back(Completion {
                    cookie: r.cookie,
                    status: -libc::EINVAL,
                    len: 0,
                });
                n += 1;
                continue;
            }
            if self.one.is_some() && r.op != Op::Flush {
                // One-sided: prepared here, posted as one batch (one post, one doorbell).
                match self.prepare_one_sided(r, &mut batch) {
                    Ok(()) => {}
                    Err(e) => {
                        let k = self.post_one_sided(&mut batch)?;
                        return if n + k > 0 { Ok(n + k) } else { Err(e) };
                    }
                }
                continue;
            }
            if !batch.is_empty() {
                let want = batch.len();
                let k = self.post_one_sided(&mut batch)?;
                n += k;
                if k < want {
                    return Ok(n);
                }
            }
            if !self.submit_rpc(r)? {
                return Ok(n);
            }
            n += 1;
        }
        n += self.post_one_sided(&mut batch)?;
        Ok(n)
    }

    fn submit_rpc(&mut self, r: &Req) -> Result<bool> {
        let id = self.next_id;
        // A read names its buffer for the target's RDMA WRITE: registered with local +
        // remote write (read buffers only; writes ask for remote read), a cache hit after
        // the first use (or within a `register`ed area, upgraded once).
        let reg = if r.op == Op::Read {
            // SAFETY: `submit`'s contract keeps the buffer mapped until its completion;
            // the handle is put back when the request finishes (before the completion is
            // returned) or when the client is dropped.
            Some(unsafe {
                self.msgr.context().rcache().get(
                    r.buf,
                    r.len as usize,
                    access::LOCAL_WRITE | access::REMOTE_WRITE,
                )
            }?)
        } else {
            None
        };
        let hdr = ReqHdr {
            op: r.op as u8,
            vol: self.vol,
            req_id: id,
            offset: r.offset,
            len: if r.op == Op::Flush { 0 } else { r.len },
            place: reg.as_ref().map(|h| (r.buf as u64, h.rkey())),
            imm_reply: reg.is_some(),
            name: Vec::new(),
        };
        let mut msg = OutMessage::new(MSG_REQ, hdr.encode());
        if r.op == Op::Write {
            // SAFETY: `submit`'s contract: valid and untouched until the completion, which
            // waits for the send's acknowledgement.
            msg = msg.with(unsafe { Payload::registered(r.buf, r.len as usize) });
        }
        // Held across `send` so that a worker thread's callbacks for this request find it.
        let mut st = self.sh.st.lock();
        st.last_id = id;
        st.inflight.insert(
            id,
            Pending {
                cookie: r.cookie,
                op: r.op,
                buf: r.buf as usize,
                len: hdr.len,
                reg,
                replied: None,
                acked: false,
            },
        );
        match self.msgr.send(self.session, msg) {
            Ok(sid) => {
                st.by_send.insert(sid, id);
                self.next_id += 1;
                Ok(true)
            }
            Err(e) => {
                if let Some(h) = st.inflight.remove(&id).and_then(|p| p.reg) {
                    let _ = self.msgr.context().rcache().put(h);
                }
                match e.kind() {
                    ErrorKind::Full => Ok(false),
                    _ => Err(e.error),
                }
            }
        }
    }

    /// Checks and registers a one-sided request and adds its work request to `batch`; a
    /// request out of range completes at once (`-ERANGE`, counted in the batch as taken).
    fn prepare_one_sided(&mut self, r: &Req, batch: &mut Vec<Prepared>) -> Result<()> {
        let Some(one) = &self.one else {
            return Err(Error::new(ErrorKind::InvalidArgument, "not one-sided"));
        };
        if let Some(e) = super::proto::check_range(self.info.size, r.offset, r.len) {
            batch.push(Prepared {
                wr: None,
                cookie: r.cookie,
                len: r.len,
                handle: None,
                errno: e as i32,
            });
            return Ok(());
        }
        let o = one.lock();
        if r.op == Op::Write && o.read_only {
            // The session's rkey allows RDMA READ only: a WRITE would be the QP's remote
            // access error (the connection lost); refused here as the target would.
            batch.push(Prepared {
                wr: None,
                cookie: r.cookie,
                len: r.len,
                handle: None,
                errno: libc::EACCES,
            });
            return Ok(());
        }
        let acc = if r.op == Op::Read {
            access::LOCAL_WRITE
        } else {
            0
        };
        // SAFETY: `submit`'s contract keeps the buffer mapped until the completion; the
        // handle is put back then.
        let h = unsafe { o.ctx.rcache().get(r.buf, r.len as usize, acc) }?;
        let (addr, rkey) = (o.region_addr, o.rkey);
        drop(o);
        batch.push(Prepared {
            wr: Some(SendReq {
                cookie: 0,
                opcode: if r.op == Op::Read {
                    WrOpcode::RdmaRead
                } else {
                    WrOpcode::RdmaWrite
                },
                flags: send_flags::SIGNALED,
                sges: smallvec::smallvec![Sge {
                    addr: r.buf as u64,
                    length: r.len,
                    lkey: h.lkey(),
                }],
                remote_addr: addr + r.offset,
                rkey,
                imm: 0,
            }),
            cookie: r.cookie,
            len: r.len,
            handle: Some(h),
            errno: 0,
        });
        Ok(())
    }

    /// Posts `batch` (in order) with one `post_send`; returns how many requests were
    /// taken (the rest are released: the caller submits them again).
    fn post_one_sided(&mut self, batch: &mut Vec<Prepared>) -> Result<usize> {
        if batch.is_empty() {
            return Ok(0);
        }
        let Some(one) = &self.one else {
            batch.clear();
            return Ok(0);
        };
        let mut o = one.lock();
        let mut wrs: Vec<SendReq> = Vec::with_capacity(batch.len());
        let mut next = o.next;
        for p in batch.iter_mut() {
            if let Some(w) = &mut p.wr {
                w.cookie = next;
                next += 1;
                wrs.push(w.clone());
            }
        }
        let posted = if wrs.is_empty() {
            Ok(0)
        } else {
            match o.conn.post_send(&wrs) {
                Ok(k) => Ok(k),
                Err(e) if e.kind() == ErrorKind::Full => Ok(0),
                Err(e) => Err(e),
            }
        };
        let posted = match posted {
            Ok(k) => k,
            Err(e) => {
                for p in batch.drain(..) {
                    if let Some(h) = p.handle {
                        let _ = o.ctx.rcache().put(h);
                    }
                }
                return Err(e);
            }
        };
        // Taken: every request up to the last posted WR, and local failures before the
        // first refused WR.
        let mut taken = 0;
        let mut wr_i = 0;
        let mut refused = false;
        let mut local = Vec::new();
        for p in batch.drain(..) {
            match (p.wr, p.handle) {
                (Some(w), Some(h)) if !refused && wr_i < posted => {
                    wr_i += 1;
                    o.inflight.insert(w.cookie, (p.cookie, p.len, h));
                    taken += 1;
                }
                (None, _) if !refused && (wr_i < posted || posted == wrs.len()) => {
                    local.push(Completion {
                        cookie: p.cookie,
                        status: -p.errno,
                        len: 0,
                    });
                    taken += 1;
                }
                (_, h) => {
                    // Refused (queue full) and everything after it: given back.
                    refused = true;
                    if let Some(h) = h {
                        let _ = o.ctx.rcache().put(h);
                    }
                }
            }
        }
        o.next = next;
        drop(o);
        if !local.is_empty() {
            self.sh.st.lock().done.extend(local);
        }
        Ok(taken)
    }

    /// Reaps the one-sided connection's completions into the done queue.
    fn reap_one_sided(&self) -> usize {
        let Some(one) = &self.one else {
            return 0;
        };
        let mut o = one.lock();
        let mut wcs = std::mem::take(&mut o.wcs);
        let n = o.conn.poll(&mut wcs);
        let mut out = Vec::with_capacity(n);
        for wc in &wcs[..n] {
            if let Some((cookie, len, h)) = o.inflight.remove(&wc.cookie) {
                let _ = o.ctx.rcache().put(h);
                let ok = wc.status == WcStatus::Success;
                out.push(Completion {
                    cookie,
                    status: if ok { 0 } else { -libc::EIO },
                    len: if ok { len } else { 0 },
                });
            }
        }
        o.wcs = wcs;
        if n == 0 && !o.inflight.is_empty() && o.conn.qp_state() == crate::rc::verbs::QpState::Err {
            // Gone without flushing what was posted (should not happen): fail the rest.
            let all: Vec<(u64, u32, Handle)> = o.inflight.drain().map(|(_, v)| v).collect();
            for (cookie, _, h) in all {
                let _ = o.ctx.rcache().put(h);
                out.push(Completion {
                    cookie,
                    status: -libc::EIO,
                    len: 0,
                });
            }
        }
        drop(o);
        let k = out.len();
        if k > 0 {
            self.sh.st.lock().done.extend(out);
        }
        k
    }

    /// Drives progress for up to `timeout` while nothing is ready: the messenger's `poll`
    /// (caller-driven mode) polls for its spin budget, then sleeps.
    fn wait(&self, timeout: Duration) -> Result<()> {
        if self.one.is_some() {
            return self.wait_one_sided(timeout);
        }
        let got = self.reap_one_sided();
        if self.caller_driven {
            let t = if got > 0 || self.one.is_some() {
                Duration::ZERO
            } else {
                timeout
            };
            self.msgr.poll(t)?;
        }
        if got > 0 || !self.sh.st.lock().done.is_empty() {
            return Ok(());
        }
        if let Some(one) = &self.one {
            // Sleep on the connection's completion fd briefly (the messenger is polled
            // again on the next round).
            let o = one.lock();
            if o.inflight.is_empty() {
                drop(o);
                if self.caller_driven {
                    self.msgr.poll(timeout.min(Duration::from_millis(1)))?;
                } else {
                    std::thread::sleep(timeout.min(Duration::from_micros(200)));
                }
                return Ok(());
            }
            o.conn.req_notify();
            let fd = o.conn.event_fd();
            drop(o);
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = timeout.as_millis().clamp(0, 1) as i32;
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut p, 1, ms) };
            if let Some(one) = &self.one {
                one.lock().conn.clear_event();
            }
        } else if !self.caller_driven {
            let mut p = libc::pollfd {
                fd: self.sh.efd.raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut p, 1, ms) };
        }
        Ok(())
    }

    /// `wait` for one-sided mode: polls the connection for the spin budget (the messenger
    /// too when a flush is in flight, and about every millisecond for its keepalives),
    /// then sleeps on the connection's completion fd for up to 1 ms.
    fn wait_one_sided(&self, timeout: Duration) -> Result<()> {
        let Some(one) = &self.one else {
            return Ok(());
        };
        let start = Instant::now();
        let budget = self.spin_one.map_or(timeout, |s| s.min(timeout));
        loop {
            let got = self.reap_one_sided();
            let rpc_waiting = !self.sh.st.lock().inflight.is_empty();
            let due = self.last_msgr.lock().elapsed() >= Duration::from_millis(1);
            if self.caller_driven && (rpc_waiting || due) {
                self.msgr.poll(Duration::ZERO)?;
                *self.last_msgr.lock() = Instant::now();
            }
            if got > 0 || !self.sh.st.lock().done.is_empty() {
                return Ok(());
            }
            if start.elapsed() >= budget {
                break;
            }
            std::hint::spin_loop();
        }
        if self.spin_one.is_none() || timeout.is_zero() {
            return Ok(());
        }
        let o = one.lock();
        o.conn.req_notify();
        let fd = o.conn.event_fd();
        drop(o);
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = (timeout.saturating_sub(start.elapsed()).as_millis()).clamp(0, 1) as i32;
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, ms) };
        one.lock().conn.clear_event();
        Ok(())
    }

    /// Moves up to `max` completions into `out` (appended), waiting up to `timeout` for at
    /// least `min` of them (`min` 0: never waits). Returns how many were appended.
    pub fn poll(
        &self,
        out: &mut Vec<Completion>,
        min: usize,
        max: usize,
        timeout: Duration,
    ) -> Result<usize> {
        let deadline = Instant::now() + timeout;
        let mut n = 0;
        loop {
            {
                let mut st = self.sh.st.lock();
                while n < max {
                    let Some(c) = st.done.pop_front() else {
                        break;
                    };
                    out.push(c);
                    n += 1;
                }
                if st.done.is_empty() && self.sh.signal.load(Ordering::Relaxed) {
                    self.sh.efd.clear();
                }
            }
            if n >= min.min(max) && (n > 0 || min == 0) {
                if n == 0 {
                    // min == 0: one pass of progress, no wait.
                    self.wait(Duration::ZERO)?;
                    let mut st = self.sh.st.lock();
                    while n < max {
                        let Some(c) = st.done.pop_front() else {
                            break;
                        };
                        out.push(c);
                        n += 1;
                    }
                }
                return Ok(n);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(n);
            }
            self.wait(left)?;
        }
    }

    /// How reads moved (rpc mode): placed by the target's WRITE or copied.
    pub fn counters(&self) -> BlkCounters {
        self.sh.st.lock().counters
    }

    /// Whether the completion of `cookie` (already returned by `poll`, status `-EIO`) came
    /// from the session's end rather than from the target: the request may or may not
    /// have been executed (in doubt). Answers once per such completion.
    pub fn take_session_failed(&self, cookie: u64) -> bool {
        self.sh.st.lock().session_failed.remove(&cookie)
    }

    /// Whether the target is gone (every later submission is refused).
    pub fn is_closed(&self) -> bool {
        self.sh.st.lock().dead.is_some()
    }

    /// The messenger (counters).
    pub fn messenger(&self) -> &Messenger {
        &self.msgr
    }

    /// The session (counters through `messenger().session_info`).
    pub fn session(&self) -> SessionId {
        self.session
    }
}

impl Drop for BlkClient {
    fn drop(&mut self) {
        let _ = self.msgr.close_session(self.session);
        // The session's connection is closed: nothing writes the read buffers any more.
        let hs: Vec<Handle> = {
            let mut st = self.sh.st.lock();
            let mut hs = std::mem::take(&mut st.to_put);
            hs.extend(st.inflight.values_mut().filter_map(|p| p.reg.take()));
            hs
        };
        for h in hs {
            let _ = self.msgr.context().rcache().put(h);
        }
        let pinned = std::mem::take(&mut self.pinned);
        for (h, one_sided) in pinned {
            if one_sided {
                if let Some(one) = &self.one {
                    let _ = one.lock().ctx.rcache().put(h);
                }
            } else {
                let _ = self.msgr.context().rcache().put(h);
            }
        }
        if let Some(one) = self.one.take() {
            let mut o = one.into_inner();
            o.conn.close();
            let hs: Vec<Handle> = o.inflight.drain().map(|(_, (_, _, h))| h).collect();
            for h in hs {
                let _ = o.ctx.rcache().put(h);
            }
        }
    }
}
