//! The multipath block client: one volume opened over several paths (addresses), each its
//! own [`BlkClient`] and so its own messenger session: two `rdmx-target` processes that
//! export the same file volume, or one target listening on two addresses (two NIC ports,
//! two subnets). Design, knobs and numbers: docs/failover.md.
//!
//! - **Policies** (`blk_path_policy`): `standby` (the default) sends every IO on one path,
//!   the first listed that is up, and keeps the others connected and idle; `active`
//!   sends each IO on the up path with the fewest IOs outstanding.
//! - **Failover**: when a path's session ends (side-channel EOF, RETRY_EXC_ERR or another
//!   QP error, keepalive loss: what makes [`BlkClient`] fail its IO with `-EIO`), the IOs
//!   that were in flight on it are re-issued on a surviving path, with no error to the
//!   caller. Writes obey the ordering rule of [`super::order`].
//! - **Rejoin**: a failed path is reconnected in a background thread, after
//!   `blk_path_retry_min_ms`, doubling up to `blk_path_retry_max_ms`; with `blk_failback`
//!   (standby) new IO moves back to a rejoined path listed before the active one.
//! - **Errors**: an IO fails (`-EIO`) only when no path has answered for
//!   `io_fail_timeout_ms` since it was submitted; a path still holding it is torn down
//!   first (its connection closed), so nothing writes the caller's buffer afterwards.
//!
//! Per-path state and counters: [`BlkPaths::path_status`]; path events:
//! [`BlkPaths::take_events`], and a log line each.

use super::client::{BlkClient, BlkCounters, Completion, Mode, Req, VolumeInfo};
use super::order::{Admit, WriteOrder};
use super::proto::Op;
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use rustc_hash::FxHashMap as HashMap;
use std::collections::VecDeque;
use std::net::ToSocketAddrs;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most paths one client opens.
pub const MAX_PATHS: usize = 16;
/// Most IOs a client holds (submitted, not yet returned by `poll`): `submit` takes fewer
/// beyond it.
const MAX_IOS: usize = 65_536;
/// After the first path opened, how long `open` still waits for the others before it
/// returns (they keep connecting in the background).
const OPEN_GRACE: Duration = Duration::from_millis(200);

/// How IO is spread over the paths that are up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathPolicy {
    /// All IO on one path (the first listed that is up); the others idle and connected.
    Standby,
    /// Each IO on the up path with the fewest IOs outstanding.
    Active,
}

impl std::str::FromStr for PathPolicy {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<PathPolicy, String> {
        match s {
            "standby" => Ok(PathPolicy::Standby),
            "active" => Ok(PathPolicy::Active),
            _ => Err(format!("path policy '{s}': expected standby or active")),
        }
    }
}

/// A path's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathState {
    /// Its session is open and its volume open: IO may go there.
    Up,
    /// Failed (or never opened); reconnected after its backoff.
    Down,
    /// A (re)connect attempt is under way.
    Connecting,
}

/// One path's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathCounters {
    /// IOs sent on this path (first sends and re-issues).
    pub issued: u64,
    /// Of those, re-issues of IOs whose earlier path failed.
    pub reissued: u64,
    /// IOs in flight on this path when it failed (re-issued elsewhere, or failed after
    /// `io_fail_timeout_ms`).
    pub failed_over: u64,
    /// Times the path went down.
    pub failures: u64,
    /// Times it came back up after a failure.
    pub rejoins: u64,
    /// Reconnect attempts that failed.
    pub connect_errors: u64,
}

/// A path as [`BlkPaths::path_status`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathStatus {
    /// The address as given ("HOST:PORT").
    pub addr: String,
    pub state: PathState,
    /// The path new IO goes to (standby policy); every up path with `active`.
    pub active: bool,
    /// IOs in flight on it now.
    pub inflight: usize,
    pub counters: PathCounters,
    /// At its last failure: how long it had gone without a successful completion while
    /// it had IO in flight (about the detection time under load), if it had IO in flight.
    pub last_detect: Option<Duration>,
    /// Why it last failed or last failed to reconnect.
    pub last_error: Option<String>,
}

/// What happened to a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathEventKind {
    /// Its session ended (or did not answer for `io_fail_timeout_ms`); the reason.
    Down(String),
    /// It (re)opened the volume.
    Up,
    /// New IO goes to it now (standby policy: failover or failback).
    Active,
}

/// A path event, in the order they happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathEvent {
    /// The path's index in the list given to `open`.
    pub path: usize,
    pub kind: PathEventKind,
    pub at: Instant,
}

/// Client-wide failover counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathsCounters {
    /// IOs re-issued on another path after theirs failed (all paths).
    pub reissued: u64,
    /// Writes held behind an overlapping outstanding write (the ordering rule).
    pub held_writes: u64,
    /// IOs failed with `-EIO` because no path answered for `io_fail_timeout_ms`.
    pub io_timeouts: u64,
}

/// An IO accepted and not yet returned.
struct Io {
    op: Op,
    offset: u64,
    len: u32,
    buf: usize,
    cookie: u64,
    submitted: Instant,
    /// The path it is in flight on; None while it waits (for a path, or held).
    path: Option<usize>,
    reissues: u32,
}

type Opening = (Receiver<Result<BlkClient>>, JoinHandle<()>);

struct Path {
    addr: String,
    client: Option<BlkClient>,
    state: PathState,
    counters: PathCounters,
    opening: Option<Opening>,
    next_try: Instant,
    backoff: Duration,
    last_error: Option<String>,
    last_detect: Option<Duration>,
    /// Our IOs in flight on it.
    outstanding: usize,
    /// When it last completed an IO successfully, or came up.
    last_ok: Instant,
    /// IOs its client failed as in doubt (session ended) since it came up, and how long it
    /// had then gone without a successful completion (at the first of them): reported when
    /// the path is declared down.
    lost: usize,
    lost_after: Option<Duration>,
    /// Completions taken from its client while waiting, not yet processed.
    got: Vec<Completion>,
}

/// A block client over several paths to one volume (rpc mode). One thread submits and
/// polls, as with [`BlkClient`].
pub struct BlkPaths {
    paths: Vec<Path>,
    cfg: Config,
    volume: String,
    open_timeout: Duration,
    policy: PathPolicy,
    failback: bool,
    io_fail_timeout: Duration,
    retry_min: Duration,
    retry_max: Duration,
    info: VolumeInfo,
    ios: HashMap<u64, Io>,
    order: WriteOrder,
    /// IOs ready to send, in order (re-issues first).
    ready: VecDeque<u64>,
    done: VecDeque<Completion>,
    next_id: u64,
    /// When a path last answered (a completion that was not its session's end, or a path
    /// that came up).
    last_answer: Instant,
    /// Standby: the path new IO goes to.
    active: Option<usize>,
    /// Areas `register`ed, registered again on each path that (re)joins.
    regions: Vec<(usize, usize)>,
    events: VecDeque<PathEvent>,
    counters: PathsCounters,
    /// Block counters of path clients already dropped.
    retired: BlkCounters,
}

impl std::fmt::Debug for BlkPaths {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlkPaths")
            .field(
                "paths",
                &self.paths.iter().map(|p| &p.addr).collect::<Vec<_>>(),
            )
            .field("policy", &self.policy)
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

fn spawn_open(cfg: &Config, addr: &str, volume: &str, timeout: Duration) -> Result<Opening> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (cfg, addr, volume) = (cfg.clone(), addr.to_string(), volume.to_string());
    let h = std::thread::Builder::new()
        .name("rdmx-blk-path".into())
        .spawn(move || {
            let r = BlkClient::open(&cfg, &addr, &volume, Mode::Rpc, timeout);
            // The client may be gone (dropped while this opened): the result with it.
            let _ = tx.send(r);
        })
        .map_err(|e| Error::new(ErrorKind::Io, format!("spawn a path thread: {e}")))?;
    Ok((rx, h))
}

/// Most path events kept for `take_events`.
const MAX_EVENTS: usize = 1024;

fn push_event(events: &mut VecDeque<PathEvent>, e: PathEvent) {
    if events.len() >= MAX_EVENTS {
        events.pop_front();
    }
    events.push_back(e);
}

fn add_counters(a: &mut BlkCounters, b: BlkCounters) {
    a.placed_reads += b.placed_reads;
    a.placed_bytes += b.placed_bytes;
    a.copied_reads += b.copied_reads;
    a.copied_bytes += b.copied_bytes;
    a.stray_replies += b.stray_replies;
    a.imm_replies += b.imm_replies;
}

fn ms(cfg: &Config, key: &str) -> Result<Duration> {
    Ok(Duration::from_millis(cfg.get_u64(key)?))
}

impl BlkPaths {
    /// Opens `volume` over every address in `addrs` ("HOST:PORT" each), within `timeout`:
    /// returns once every path answered, or once one opened and the others had 200 ms
    /// more (those keep connecting in the background and join when they answer). Fails
    /// when no path opened the volume (the first path's error kind and every path's
    /// reason). `mode` must be [`Mode::Rpc`] (a memory volume's one-sided region lives in
    /// one target). Knobs: `blk_path_policy`, `blk_failback`, `io_fail_timeout_ms`,
    /// `blk_path_retry_min_ms`, `blk_path_retry_max_ms`, and each path client's keys.
    pub fn open<S: AsRef<str>>(
        config: &Config,
        addrs: &[S],
        volume: &str,
        mode: Mode,
        timeout: Duration,
    ) -> Result<BlkPaths> {
        if mode != Mode::Rpc {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "multipath needs mode=rpc (a memory volume's one-sided region is one target's)",
            ));
        }
        if addrs.is_empty() || addrs.len() > MAX_PATHS {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("{} paths: give 1..{MAX_PATHS} addresses", addrs.len()),
            ));
        }
        for a in addrs {
            let a = a.as_ref();
            if !a.to_socket_addrs().is_ok_and(|mut i| i.next().is_some()) {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!("path address '{a}': expected HOST:PORT"),
                ));
            }
        }
        let policy: PathPolicy = config
            .get("blk_path_policy")?
            .parse()
            .map_err(|e: String| Error::new(ErrorKind::InvalidValue, e))?;
        let now = Instant::now();
        let mut paths = Vec::with_capacity(addrs.len());
        for a in addrs {
            let a = a.as_ref();
            paths.push(Path {
                addr: a.to_string(),
                client: None,
                state: PathState::Connecting,
                counters: PathCounters::default(),
                opening: Some(spawn_open(config, a, volume, timeout)?),
                next_try: now,
                backoff: ms(config, "blk_path_retry_min_ms")?,
                last_error: None,
                last_detect: None,
                outstanding: 0,
                last_ok: now,
                lost: 0,
                lost_after: None,
                got: Vec::new(),
            });
        }
        let mut c = BlkPaths {
            paths,
            cfg: config.clone(),
            volume: volume.to_string(),
            open_timeout: timeout,
            policy,
            failback: config.get_bool("blk_failback")?,
            io_fail_timeout: ms(config, "io_fail_timeout_ms")?,
            retry_min: ms(config, "blk_path_retry_min_ms")?,
            retry_max: ms(config, "blk_path_retry_max_ms")?,
            info: VolumeInfo {
                size: 0,
                block_size: 0,
                one_sided: false,
            },
            ios: HashMap::default(),
            order: WriteOrder::new(),
            ready: VecDeque::new(),
            done: VecDeque::new(),
            next_id: 1,
            last_answer: now,
            active: None,
            regions: Vec::new(),
            events: VecDeque::new(),
            counters: PathsCounters::default(),
            retired: BlkCounters::default(),
        };
        let deadline = now + timeout;
        let mut first_up: Option<Instant> = None;
        let mut first_err: Option<Error> = None;
        loop {
            for p in 0..c.paths.len() {
                if let Some(Err(e)) = c.join_path(p)
                    && first_err.is_none()
                {
                    first_err = Some(e);
                }
            }
            let up = c.paths.iter().any(|p| p.state == PathState::Up);
            let pending = c.paths.iter().any(|p| p.opening.is_some());
            if up && first_up.is_none() {
                first_up = Some(Instant::now());
            }
            let grace_over = first_up.is_some_and(|t| t.elapsed() >= OPEN_GRACE);
            if !pending || grace_over || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        if !c.paths.iter().any(|p| p.state == PathState::Up) {
            let why: Vec<String> = c
                .paths
                .iter()
                .map(|p| {
                    format!(
                        "{}: {}",
                        p.addr,
                        p.last_error.as_deref().unwrap_or("no answer in time")
                    )
                })
                .collect();
            let kind = first_err.map_or(ErrorKind::Timeout, |e| e.kind());
            return Err(Error::new(
                kind,
                format!(
                    "open volume '{volume}': no path opened it ({})",
                    why.join("; ")
                ),
            ));
        }
        c.update_active();
        Ok(c)
    }

    /// Takes the result of path `p`'s open attempt if it arrived: Some(Ok) when it came up,
    /// Some(Err) when it failed (the path is Down with its backoff), None while waiting.
    fn join_path(&mut self, p: usize) -> Option<Result<()>> {
        let path = &mut self.paths[p];
        let r = match &path.opening {
            None => return None,
            Some((rx, _)) => match rx.try_recv() {
                Ok(r) => r,
                Err(TryRecvError::Empty) => return None,
                Err(TryRecvError::Disconnected) => Err(Error::new(
                    ErrorKind::Io,
                    "the path's open thread ended without an answer",
                )),
            },
        };
        if let Some((_, h)) = path.opening.take() {
            let _ = h.join();
        }
        let r = r.and_then(|c| self.check_volume(c));
        let now = Instant::now();
        let path = &mut self.paths[p];
        match r {
            Ok(mut client) => {
                for &(ptr, len) in &self.regions {
                    // SAFETY: `register`'s contract: mapped until this client is dropped.
                    if let Err(e) = unsafe { client.register(ptr as *mut u8, len) } {
                        log::warn!(
                            "rdmx blk: path {}: area not pre-registered ({e}): per IO",
                            path.addr
                        );
                    }
                }
                path.client = Some(client);
                self.came_up(p, now);
                Some(Ok(()))
            }
            Err(e) => {
                path.counters.connect_errors += u64::from(path.counters.failures > 0);
                path.state = PathState::Down;
                path.next_try = now + path.backoff;
                path.backoff = (path.backoff * 2).min(self.retry_max);
                path.last_error = Some(e.to_string());
                log::debug!("rdmx blk: path {} did not open: {e}", path.addr);
                Some(Err(e))
            }
        }
    }

    /// A path's client came up: state, counters, event, log.
    fn came_up(&mut self, p: usize, now: Instant) {
        let path = &mut self.paths[p];
        path.state = PathState::Up;
        path.backoff = self.retry_min;
        path.last_ok = now;
        path.lost = 0;
        path.lost_after = None;
        if path.counters.failures > 0 {
            path.counters.rejoins += 1;
            log::warn!("rdmx blk: path {} rejoined", path.addr);
        } else {
            log::info!("rdmx blk: path {} up", path.addr);
        }
        self.last_answer = now;
        push_event(
            &mut self.events,
            PathEvent {
                path: p,
                kind: PathEventKind::Up,
                at: now,
            },
        );
    }

    /// Refuses a path whose volume differs from the first one's (another volume, not the
    /// same data), and takes the first one's geometry.
    fn check_volume(&mut self, c: BlkClient) -> Result<BlkClient> {
        let i = c.info();
        if self.info.size == 0 {
            self.info = i;
            return Ok(c);
        }
        if i.size != self.info.size || i.block_size != self.info.block_size {
            return Err(Error::new(
                ErrorKind::Conflict,
                format!(
                    "volume '{}' is {} bytes in {}-byte blocks there, {} in {} on the first path: not the same volume",
                    self.volume, i.size, i.block_size, self.info.size, self.info.block_size
                ),
            ));
        }
        Ok(c)
    }

    /// Standby: the path new IO goes to is the first up one, or stays where it failed over
    /// to without failback.
    fn update_active(&mut self) {
        if self.policy != PathPolicy::Standby {
            return;
        }
        let first_up = self.paths.iter().position(|p| p.state == PathState::Up);
        let next = match self.active {
            Some(a) if self.paths[a].state == PathState::Up => {
                if self.failback && first_up.is_some_and(|f| f < a) {
                    first_up
                } else {
                    Some(a)
                }
            }
            _ => first_up,
        };
        if next != self.active {
            if let Some(n) = next {
                log::warn!(
                    "rdmx blk: IO to volume '{}' now goes to path {}",
                    self.volume,
                    self.paths[n].addr
                );
                push_event(
                    &mut self.events,
                    PathEvent {
                        path: n,
                        kind: PathEventKind::Active,
                        at: Instant::now(),
                    },
                );
            }
            self.active = next;
        }
    }

    /// The path for the next IO.
    fn pick(&self) -> Option<usize> {
        match self.policy {
            PathPolicy::Standby => self
                .active
                .filter(|&a| self.paths[a].state == PathState::Up),
            PathPolicy::Active => self
                .paths
                .iter()
                .enumerate()
                .filter(|(_, p)| p.state == PathState::Up)
                .min_by_key(|(_, p)| p.outstanding)
                .map(|(i, _)| i),
        }
    }

    /// Sends what is ready, in order, while a path takes it.
    fn pump(&mut self) {
        while let Some(&id) = self.ready.front() {
            let Some(p) = self.pick() else {
                return;
            };
            let Some(io) = self.ios.get(&id) else {
                self.ready.pop_front();
                continue;
            };
            let req = Req {
                op: io.op,
                offset: io.offset,
                len: io.len,
                buf: io.buf as *mut u8,
                cookie: id,
            };
            let Some(client) = self.paths[p].client.as_mut() else {
                self.path_down(p, "no client".into());
                continue;
            };
            // SAFETY: `submit`'s contract (the buffer stays valid until its completion is
            // returned by `poll`, which happens after this path's completion, or after the
            // path's client was dropped).
            match unsafe { client.submit(&[req]) } {
                Ok(1) => {
                    self.ready.pop_front();
                    let io = self.ios.get_mut(&id).expect("looked up above");
                    io.path = Some(p);
                    let path = &mut self.paths[p];
                    path.outstanding += 1;
                    path.counters.issued += 1;
                    if io.reissues > 0 {
                        path.counters.reissued += 1;
                        self.counters.reissued += 1;
                    }
                }
                // Its queue is full: the rest waits for completions.
                Ok(_) => return,
                Err(e) => self.path_down(p, e.to_string()),
            }
        }
    }

    /// Processes one completion from path `p`.
    fn on_completion(&mut self, p: usize, c: Completion, reissue: &mut Vec<u64>) {
        let id = c.cookie;
        let Some(io) = self.ios.get_mut(&id) else {
            return;
        };
        if io.path != Some(p) {
            return;
        }
        io.path = None;
        let path = &mut self.paths[p];
        path.outstanding = path.outstanding.saturating_sub(1);
        let session_ended = c.status < 0
            && path.client.as_ref().is_none_or(|cl| {
                cl.take_session_failed(id) || (c.status == -libc::EIO && cl.is_closed())
            });
        if session_ended {
            io.reissues += 1;
            path.counters.failed_over += 1;
            path.lost += 1;
            path.lost_after
                .get_or_insert_with(|| path.last_ok.elapsed());
            reissue.push(id);
            return;
        }
        let now = Instant::now();
        if c.status == 0 {
            path.last_ok = now;
        }
        self.last_answer = now;
        self.finish(id, c.status, c.len);
    }

    /// Returns IO `id` to the caller with `status`; releases writes it held.
    fn finish(&mut self, id: u64, status: i32, len: u32) {
        let Some(io) = self.ios.remove(&id) else {
            return;
        };
        if io.op == Op::Write {
            let released = self.order.complete(id);
            self.ready.extend(released);
        }
        self.done.push_back(Completion {
            cookie: io.cookie,
            status,
            len: if status == 0 { len } else { 0 },
        });
    }

    /// Re-queues `ids` (in doubt) ahead of everything else, oldest first.
    fn requeue_front(&mut self, mut ids: Vec<u64>) {
        ids.sort_unstable();
        for id in ids.into_iter().rev() {
            self.ready.push_front(id);
        }
    }

    /// Path `p` failed: what its client still holds is processed, the client dropped (its
    /// connection closed: nothing lands from it, nothing writes a buffer afterwards), its
    /// IOs re-queued, and a reconnect scheduled.
    fn path_down(&mut self, p: usize, why: String) {
        if self.paths[p].state != PathState::Up {
            return;
        }
        let mut reissue = Vec::new();
        let mut got = std::mem::take(&mut self.paths[p].got);
        if let Some(c) = &self.paths[p].client {
            let _ = c.poll(&mut got, 0, usize::MAX, Duration::ZERO);
        }
        for c in got {
            self.on_completion(p, c, &mut reissue);
        }
        let now = Instant::now();
        let path = &mut self.paths[p];
        if let Some(c) = path.client.take() {
            add_counters(&mut self.retired, c.counters());
            drop(c);
        }
        // Whatever it held and did not complete is in doubt too.
        for (&id, io) in self.ios.iter_mut() {
            if io.path == Some(p) {
                io.path = None;
                io.reissues += 1;
                path.counters.failed_over += 1;
                reissue.push(id);
            }
        }
        let moved = path.lost + reissue.len();
        path.last_detect = path.lost_after.take().or_else(|| {
            (path.outstanding > 0 || !reissue.is_empty()).then(|| now.duration_since(path.last_ok))
        });
        path.lost = 0;
        path.outstanding = 0;
        path.state = PathState::Down;
        path.counters.failures += 1;
        path.backoff = self.retry_min;
        path.next_try = now + path.backoff;
        path.backoff = (path.backoff * 2).min(self.retry_max);
        path.last_error = Some(why.clone());
        log::warn!(
            "rdmx blk: path {} down ({why}){}; {} IOs re-issued on other paths",
            path.addr,
            path.last_detect
                .map(|d| format!(
                    " after {:.1} ms without a completion",
                    d.as_secs_f64() * 1e3
                ))
                .unwrap_or_default(),
            moved
        );
        push_event(
            &mut self.events,
            PathEvent {
                path: p,
                kind: PathEventKind::Down(why),
                at: now,
            },
        );
        self.requeue_front(reissue);
        self.update_active();
    }

    /// Takes every path's completions; fails the paths whose session ended.
    fn reap(&mut self) {
        let mut reissue = Vec::new();
        for p in 0..self.paths.len() {
            let mut got = std::mem::take(&mut self.paths[p].got);
            let mut failed = None;
            if let Some(c) = &self.paths[p].client
                && let Err(e) = c.poll(&mut got, 0, usize::MAX, Duration::ZERO)
            {
                failed = Some(e.to_string());
            }
            for c in got {
                self.on_completion(p, c, &mut reissue);
            }
            if failed.is_none()
                && let Some(c) = &self.paths[p].client
                && c.is_closed()
            {
                failed = Some("its session to the target ended".into());
            }
            if !reissue.is_empty() {
                self.requeue_front(std::mem::take(&mut reissue));
            }
            if let Some(why) = failed {
                self.path_down(p, why);
            }
        }
    }

    /// Starts reconnects that are due; takes the results of those under way.
    fn reconnect(&mut self) {
        let now = Instant::now();
        for p in 0..self.paths.len() {
            if self.paths[p].opening.is_some() {
                let _ = self.join_path(p);
                continue;
            }
            let path = &mut self.paths[p];
            if path.state != PathState::Down || now < path.next_try {
                continue;
            }
            match spawn_open(&self.cfg, &path.addr, &self.volume, self.open_timeout) {
                Ok(o) => {
                    path.opening = Some(o);
                    path.state = PathState::Connecting;
                }
                Err(e) => {
                    path.next_try = now + path.backoff;
                    path.last_error = Some(e.to_string());
                }
            }
        }
    }

    /// Fails, with `-EIO`, the IOs for which no path has answered for `io_fail_timeout`.
    fn expire(&mut self) {
        let now = Instant::now();
        if self.ios.is_empty() || now.duration_since(self.last_answer) < self.io_fail_timeout {
            return;
        }
        let mut expired: Vec<u64> = self
            .ios
            .iter()
            .filter(|(_, io)| {
                now.duration_since(io.submitted.max(self.last_answer)) >= self.io_fail_timeout
            })
            .map(|(&id, _)| id)
            .collect();
        if expired.is_empty() {
            return;
        }
        expired.sort_unstable();
        // A path still holding one of them has not answered either: closed first, so that
        // nothing lands from it or writes a buffer after the IO failed.
        let holding: Vec<usize> = expired
            .iter()
            .filter_map(|id| self.ios.get(id).and_then(|io| io.path))
            .collect();
        for p in holding {
            let t = self.io_fail_timeout;
            self.path_down(
                p,
                format!("no answer for io_fail_timeout_ms ({} ms)", t.as_millis()),
            );
        }
        log::error!(
            "rdmx blk: volume '{}': {} IOs failed: no path answered for {} ms",
            self.volume,
            expired.len(),
            self.io_fail_timeout.as_millis()
        );
        self.ready.retain(|id| !expired.contains(id));
        for id in expired {
            if self.ios.contains_key(&id) {
                self.counters.io_timeouts += 1;
                self.finish(id, -libc::EIO, 0);
            }
        }
    }

    fn progress(&mut self) {
        self.reap();
        self.reconnect();
        self.update_active();
        self.pump();
        self.expire();
    }

    /// Waits up to `left` for a completion on the busiest path (or sleeps briefly when no
    /// IO is in flight).
    fn wait(&mut self, left: Duration) {
        let busy: Vec<usize> = (0..self.paths.len())
            .filter(|&p| self.paths[p].outstanding > 0 && self.paths[p].client.is_some())
            .collect();
        // One path in flight: wait on it (its messenger's own spin and sleep), in slices
        // so that reconnects and timeouts are seen; several: short slices in turn.
        let slice = if busy.len() > 1 {
            Duration::from_micros(100)
        } else {
            Duration::from_millis(5)
        };
        let t = left.min(slice);
        let Some(&p) = busy.iter().max_by_key(|&&p| self.paths[p].outstanding) else {
            std::thread::sleep(t.min(Duration::from_millis(1)));
            return;
        };
        let mut got = std::mem::take(&mut self.paths[p].got);
        let mut failed = None;
        if let Some(c) = &self.paths[p].client
            && let Err(e) = c.poll(&mut got, 1, usize::MAX, t)
        {
            failed = Some(e.to_string());
        }
        self.paths[p].got = got;
        if let Some(why) = failed {
            self.path_down(p, why);
        }
    }

    /// Accepts `reqs` (fewer only beyond 65,536 IOs held) and sends what it can. An IO
    /// never fails here: it waits for a path, and fails only when no path answered for
    /// `io_fail_timeout_ms`.
    ///
    /// # Safety
    /// As [`BlkClient::submit`]: each buffer valid, and untouched by the caller, until its
    /// completion was returned by `poll` or the client was dropped.
    pub unsafe fn submit(&mut self, reqs: &[Req]) -> Result<usize> {
        let room = MAX_IOS.saturating_sub(self.ios.len());
        let now = Instant::now();
        let take = reqs.len().min(room);
        for r in &reqs[..take] {
            let id = self.next_id;
            self.next_id += 1;
            self.ios.insert(
                id,
                Io {
                    op: r.op,
                    offset: r.offset,
                    len: r.len,
                    buf: r.buf as usize,
                    cookie: r.cookie,
                    submitted: now,
                    path: None,
                    reissues: 0,
                },
            );
            if r.op == Op::Write {
                match self.order.submit(id, r.offset, u64::from(r.len)) {
                    Admit::Go => self.ready.push_back(id),
                    Admit::Held => self.counters.held_writes += 1,
                }
            } else {
                self.ready.push_back(id);
            }
        }
        self.pump();
        Ok(take)
    }

    /// As [`BlkClient::poll`]: up to `max` completions appended to `out`, waiting up to
    /// `timeout` for at least `min`. Drives every path (and the failover) meanwhile.
    pub fn poll(
        &mut self,
        out: &mut Vec<Completion>,
        min: usize,
        max: usize,
        timeout: Duration,
    ) -> Result<usize> {
        let deadline = Instant::now() + timeout;
        let mut n = 0;
        loop {
            self.progress();
            while n < max {
                let Some(c) = self.done.pop_front() else {
                    break;
                };
                out.push(c);
                n += 1;
            }
            if n >= max || min == 0 || n >= min {
                return Ok(n);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(n);
            }
            self.wait(left);
        }
    }

    /// Registers `[ptr, ptr + len)` on every path, now and on each path that (re)joins.
    ///
    /// # Safety
    /// The memory must stay mapped until the client is dropped.
    pub unsafe fn register(&mut self, ptr: *mut u8, len: usize) -> Result<()> {
        for p in &mut self.paths {
            if let Some(c) = &mut p.client {
                // SAFETY: forwarded contract.
                unsafe { c.register(ptr, len) }?;
            }
        }
        self.regions.push((ptr as usize, len));
        Ok(())
    }

    pub fn info(&self) -> VolumeInfo {
        self.info
    }

    /// IOs accepted and not yet returned by `poll`.
    pub fn inflight(&self) -> usize {
        self.ios.len() + self.done.len()
    }

    /// Every path's block counters added up (those of dropped path clients included).
    pub fn counters(&self) -> BlkCounters {
        let mut k = self.retired;
        for p in &self.paths {
            if let Some(c) = &p.client {
                add_counters(&mut k, c.counters());
            }
        }
        k
    }

    /// Client-wide failover counters.
    pub fn failover_counters(&self) -> PathsCounters {
        self.counters
    }

    /// How many paths the client was opened with.
    pub fn path_count(&self) -> usize {
        self.paths.len()
    }

    /// Path `i`'s state and counters (None beyond `path_count`).
    pub fn path_status(&self, i: usize) -> Option<PathStatus> {
        let p = self.paths.get(i)?;
        Some(PathStatus {
            addr: p.addr.clone(),
            state: p.state,
            active: p.state == PathState::Up
                && (self.policy == PathPolicy::Active || self.active == Some(i)),
            inflight: p.outstanding,
            counters: p.counters,
            last_detect: p.last_detect,
            last_error: p.last_error.clone(),
        })
    }

    /// The path events since the last call, oldest first (at most the last 1,024 are
    /// kept).
    pub fn take_events(&mut self) -> Vec<PathEvent> {
        self.events.drain(..).collect()
    }

    /// The oldest path event not taken yet, removed (None: none happened since).
    pub fn next_event(&mut self) -> Option<PathEvent> {
        self.events.pop_front()
    }

    /// The policy in use.
    pub fn policy(&self) -> PathPolicy {
        self.policy
    }
}

impl Drop for BlkPaths {
    fn drop(&mut self) {
        // Clients first: their connections close, nothing writes a buffer afterwards.
        for p in &mut self.paths {
            p.client = None;
        }
        // An open under way ends within its timeout; its client is dropped by its thread
        // (the receiver is gone) or here.
        for p in &mut self.paths {
            if let Some((rx, h)) = p.opening.take() {
                drop(rx);
                let _ = h.join();
            }
        }
    }
}
