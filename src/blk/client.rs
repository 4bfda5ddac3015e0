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
//!
//! One job per file under `client/`: `open.rs` (opening, control requests,
//! registration), `submit.rs` (submission; the rpc path), `one_sided.rs` (the one-sided
//! path), `replies.rs` (the messenger's callbacks), `state.rs` (requests in flight),
//! `poll.rs` (completions and waiting). This file: the public types and the client.

use crate::mem::rcache::Handle;
use crate::msgr::messenger::{Messenger, SessionId};
use parking_lot::Mutex;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::proto::Op;

mod one_sided;
mod open;
mod poll;
mod replies;
mod state;
mod submit;

use one_sided::OneSided;
use state::Shared;

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

impl BlkClient {
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
