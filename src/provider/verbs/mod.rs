//! The verbs provider: rdmx on libibverbs (rdma-sys), for RoCEv2 NICs (ConnectX, E810),
//! kernel soft-RoCE, and rdmx's own libibverbs device (`rdmx-ibv`, which is how CI runs
//! this code: rdmx (verbs) -> libibverbs -> rdmx0 -> the soft provider).
//!
//! - [`device`]: device/port/GID selection, limits, PD;
//! - [`mr`]: `ibv_reg_mr` registrations (pools register each arena once);
//! - [`qp`]: a connection's channel, CQs and RC QP, post chains, batched polling;
//! - [`events`]: the device's async events;
//! - [`window`]: type-2 memory windows for the messenger's scoped rkeys (`qp/local.rs`
//!   posts their binds and invalidations);
//! - here: [`VerbsDevice`] and its watcher thread: side channels (TCP EOF -> QP to ERR, as
//!   the soft provider's progress thread does) and the async event fd.
//!
//! The data-path verbs `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and
//! `ibv_req_notify_cq` are `static inline` in verbs.h (calls through `context->ops`):
//! rdma-sys reimplements them in Rust over its bindgen of the installed headers, so no
//! bindgen of our own is needed; `layout` (tests) checks the structures rdma-sys writes by
//! hand (`ibv_wc`, `ibv_send_wr`, `ibv_ah_attr`, ...) and the ops offsets against a C probe
//! built on the installed headers.

pub mod device;
pub(crate) mod events;
#[cfg(test)]
mod layout;
pub mod mr;
pub mod qp;
mod ready;
pub mod window;

use crate::config::Settings;
use crate::error::{Error, ErrorKind, Result};
use crate::provider::sys::EventFd;
use device::{Opened, Pd};
use events::{Event, Subject, kind};
use mr::VerbsMrs;
use parking_lot::Mutex;
use qp::VerbsQp;
use rustc_hash::FxHashMap as HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

pub use device::ROCEV2_PORT;

/// An opened verbs device: PD, memory table, side-channel watcher.
#[derive(Debug)]
pub struct VerbsDevice {
    opened: Opened,
    mrs: Arc<VerbsMrs>,
    /// The device's type-2 memory windows (None: it has none), for scoped rkeys.
    windows: Option<Arc<window::VerbsWindows>>,
    watch: Watcher,
    settings: Settings,
}

impl VerbsDevice {
    pub fn open(s: &Settings) -> Result<VerbsDevice> {
        let opened = device::open(s)?;
        let mw = opened.limits.mw_type2;
        let mrs = Arc::new(VerbsMrs::new(Arc::clone(&opened.pd), mw));
        let windows = mw.then(|| {
            Arc::new(window::VerbsWindows::new(
                Arc::clone(&opened.pd),
                Arc::clone(&mrs),
            ))
        });
        let watch = Watcher::start(Arc::clone(&opened.pd), opened.port, opened.name.clone())?;
        Ok(VerbsDevice {
            opened,
            mrs,
            windows,
            watch,
            settings: s.clone(),
        })
    }

    /// The device's memory windows (None when it has no type-2 windows).
    pub fn windows(&self) -> Option<Arc<window::VerbsWindows>> {
        self.windows.clone()
    }

    pub fn describe(&self) -> String {
        self.opened.describe()
    }

    pub fn mrs(&self) -> &VerbsMrs {
        &self.mrs
    }

    pub fn mrs_arc(&self) -> Arc<VerbsMrs> {
        Arc::clone(&self.mrs)
    }

    /// Where peers' packets go: the GID's address, RoCEv2's port.
    pub fn endpoint(&self) -> SocketAddr {
        SocketAddr::new(self.opened.ip(), ROCEV2_PORT)
    }

    pub fn active_mtu(&self) -> u32 {
        self.opened.active_mtu
    }

    /// The rd_atomic values this side offers: the config's, capped by the device (with a
    /// log line, once per context).
    pub fn rd_atomic_offer(&self) -> (u8, u8) {
        let s = &self.settings;
        let l = &self.opened.limits;
        let rd = s.max_rd_atomic.min(l.max_qp_init_rd_atom);
        let dest = s.max_dest_rd_atomic.min(l.max_qp_rd_atom);
        if (rd, dest) != (s.max_rd_atomic, s.max_dest_rd_atomic) {
            log::info!(target: "rdmx::verbs", "max_rd_atomic {} / max_dest_rd_atomic {} (configured) capped to {rd} / {dest} by device {} (max_qp_init_rd_atom {}, max_qp_rd_atom {})", s.max_rd_atomic, s.max_dest_rd_atomic, self.opened.name, l.max_qp_init_rd_atom, l.max_qp_rd_atom);
        }
        (rd, dest)
    }

    pub fn create_qp(&self) -> Result<Arc<VerbsQp>> {
        let qp = VerbsQp::create(
            &self.opened.pd,
            &self.mrs,
            &self.settings,
            self.opened.port,
            self.opened.gid_index,
            self.opened.active_mtu,
            &self.opened.limits,
        )
        .map(Arc::new)?;
        self.watch.register(&qp);
        Ok(qp)
    }

    /// Async events the device reported (every kind, about any object or port).
    pub fn async_events(&self) -> u64 {
        self.watch.shared.async_events.load(Ordering::Relaxed)
    }

    /// Watches a connection's TCP side channel: on EOF the QP goes to ERR (flushing every
    /// outstanding WR) and further posts are refused.
    pub fn watch(&self, fd: RawFd, qp: &Arc<VerbsQp>) {
        self.watch.add(fd, Arc::downgrade(qp));
    }

    pub fn unwatch(&self, fd: RawFd) {
        self.watch.remove(fd);
    }

    /// Forgets a closing QP: async events no longer reach it, so (once unwatched) nothing
    /// but its connection takes it, and dropping the connection destroys it at once.
    pub fn forget(&self, qp: &Arc<VerbsQp>) {
        let p = Arc::as_ptr(qp);
        ALL_QPS
            .lock()
            .retain(|w| w.strong_count() > 0 && w.as_ptr() != p);
    }
}

/// Every verbs QP of the process, for async events (which name a `struct ibv_qp *` or
/// `ibv_cq *`). Process-wide rather than per context: a kernel device queues an event on
/// the async fd of the context owning the object, but rdmx-ibv (one soft device per
/// process) gives all of a process's contexts one event queue, so a context's reader may
/// take another context's event; looked up here, it still reaches its QP.
static ALL_QPS: Mutex<Vec<Weak<VerbsQp>>> = Mutex::new(Vec::new());

/// The epoll token of the stop eventfd and of the device's async event fd.
const STOP: u64 = u64::MAX;
const ASYNC: u64 = u64::MAX - 1;

/// A thread waiting on the side channels (epoll, EPOLLRDHUP: the peer's FIN or RST) and
/// on the device's async event fd.
#[derive(Debug)]
struct Watcher {
    shared: Arc<WatchShared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Debug)]
struct WatchShared {
    epoll: OwnedFd,
    stop_fd: EventFd,
    stop: AtomicBool,
    qps: Mutex<HashMap<RawFd, Weak<VerbsQp>>>,
    /// The context whose async fd is read (kept open while the thread runs).
    pd: Arc<Pd>,
    port: u8,
    name: String,
    async_events: AtomicU64,
}

impl Watcher {
    fn start(pd: Arc<Pd>, port: u8, name: String) -> Result<Watcher> {
        // SAFETY: plain syscall.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(Error::new(
                ErrorKind::Io,
                format!("verbs: epoll_create1: {}", std::io::Error::last_os_error()),
            ));
        }
        // SAFETY: a fresh fd we own.
        let epoll = unsafe { OwnedFd::from_raw_fd(ep) };
        let stop_fd = EventFd::new()?;
        // The async event fd, non-blocking: ibv_get_async_event then fails with EAGAIN
        // instead of sleeping once the queued events are read.
        // SAFETY: the context is open (held by `pd`); async_fd is its field.
        let async_fd = unsafe { (*pd.ctx).async_fd };
        // SAFETY: fcntl on a valid fd with integer arguments.
        let fl = unsafe { libc::fcntl(async_fd, libc::F_GETFL) };
        // SAFETY: as above.
        if fl < 0 || unsafe { libc::fcntl(async_fd, libc::F_SETFL, fl | libc::O_NONBLOCK) } < 0 {
            return Err(Error::new(
                ErrorKind::Io,
                format!(
                    "verbs: async event fd: fcntl O_NONBLOCK: {}",
                    std::io::Error::last_os_error()
                ),
            ));
        }
        for (fd, token) in [(stop_fd.raw_fd(), STOP), (async_fd, ASYNC)] {
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: token,
            };
            // SAFETY: valid fds and a live event struct.
            if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
                return Err(Error::new(
                    ErrorKind::Io,
                    format!("verbs: epoll_ctl: {}", std::io::Error::last_os_error()),
                ));
            }
        }
        let shared = Arc::new(WatchShared {
            epoll,
            stop_fd,
            stop: AtomicBool::new(false),
            qps: Mutex::new(HashMap::default()),
            pd,
            port,
            name,
            async_events: AtomicU64::new(0),
        });
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("rdmx-verbs-watch".into())
            .spawn(move || watch_loop(&s))
            .map_err(|e| Error::new(ErrorKind::Io, format!("verbs: watcher thread: {e}")))?;
        Ok(Watcher {
            shared,
            thread: Some(thread),
        })
    }

    /// A new QP: async events about it (or its CQs) reach it.
    fn register(&self, qp: &Arc<VerbsQp>) {
        let mut all = ALL_QPS.lock();
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(qp));
    }

    fn add(&self, fd: RawFd, qp: Weak<VerbsQp>) {
        self.shared.qps.lock().insert(fd, qp);
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLRDHUP | libc::EPOLLHUP | libc::EPOLLERR) as u32,
            u64: fd as u64,
        };
        // SAFETY: valid epoll fd; `fd` is the caller's open socket; live event struct.
        unsafe {
            libc::epoll_ctl(
                self.shared.epoll.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                fd,
                &mut ev,
            )
        };
    }

    fn remove(&self, fd: RawFd) {
        if self.shared.qps.lock().remove(&fd).is_some() {
            // SAFETY: valid epoll fd; removing an fd it may hold.
            unsafe {
                libc::epoll_ctl(
                    self.shared.epoll.as_raw_fd(),
                    libc::EPOLL_CTL_DEL,
                    fd,
                    std::ptr::null_mut(),
                )
            };
        }
    }
}

fn watch_loop(s: &WatchShared) {
    let mut events = [libc::epoll_event { events: 0, u64: 0 }; 16];
    while !s.stop.load(Ordering::Acquire) {
        // SAFETY: valid epoll fd; `events` has room for 16 entries.
        let n = unsafe { libc::epoll_wait(s.epoll.as_raw_fd(), events.as_mut_ptr(), 16, 1000) };
        for ev in events.iter().take(n.max(0) as usize) {
            if ev.u64 == STOP {
                continue;
            }
            if ev.u64 == ASYNC {
                read_async_events(s);
                continue;
            }
            let fd = ev.u64 as RawFd;
            let qp = s.qps.lock().remove(&fd);
            if let Some(qp) = qp {
                // SAFETY: valid epoll fd; the socket is still open (its connection
                // unwatches before closing it, under the same lock we just took).
                unsafe {
                    libc::epoll_ctl(
                        s.epoll.as_raw_fd(),
                        libc::EPOLL_CTL_DEL,
                        fd,
                        std::ptr::null_mut(),
                    )
                };
                if let Some(qp) = qp.upgrade() {
                    log::info!(target: "rdmx::verbs", "QP {:#x}: side channel closed by the peer: QP to ERR", qp.qpn());
                    qp.set_peer_gone();
                }
            }
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.stop_fd.signal();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads every queued async event (each acknowledged as it is read) and acts on it.
fn read_async_events(s: &WatchShared) {
    // Bounded per wakeup: a device raising events without end cannot starve the side
    // channels (the fd stays readable, so the next epoll_wait returns at once).
    for _ in 0..256 {
        let Some(e) = events::next(s.pd.ctx) else {
            return;
        };
        s.async_events.fetch_add(1, Ordering::Relaxed);
        on_async_event(s, e);
    }
}

fn live_qps() -> Vec<Arc<VerbsQp>> {
    ALL_QPS.lock().iter().filter_map(Weak::upgrade).collect()
}

fn on_async_event(s: &WatchShared, e: Event) {
    let what = events::name(e.kind);
    let error = events::qp_error(e.kind);
    match e.subject {
        Subject::Qp { qp, qpn } => {
            match live_qps()
                .into_iter()
                .find(|q| q.raw_qp() == qp && q.qpn() == qpn)
            {
                Some(q) => q.async_event(what, error),
                None => {
                    log::info!(target: "rdmx::verbs", "{}: async event {what} on QP {qpn:#x}, which no live connection has", s.name)
                }
            }
        }
        Subject::Cq(cq) => match live_qps().into_iter().find(|q| {
            let (a, b) = q.raw_cqs();
            a == cq || b == cq
        }) {
            Some(q) => q.async_event(what, error),
            None => {
                log::info!(target: "rdmx::verbs", "{}: async event {what} on a CQ no live connection has", s.name)
            }
        },
        Subject::Port(p) => match e.kind {
            kind::PORT_ERR if p == s.port => {
                log::warn!(target: "rdmx::verbs", "{}: port {p} is down (PORT_ERR): its connections' requests go unanswered and end with RETRY_EXC_ERR unless the port is back within (retry_cnt + 1) x timeout", s.name)
            }
            kind::PORT_ACTIVE if p == s.port => {
                log::info!(target: "rdmx::verbs", "{}: port {p} is active again (PORT_ACTIVE)", s.name)
            }
            _ => log::info!(target: "rdmx::verbs", "{}: async event {what} on port {p}", s.name),
        },
        Subject::Other if e.kind == kind::DEVICE_FATAL => {
            let qps: Vec<_> = live_qps()
                .into_iter()
                .filter(|q| q.ctx() == s.pd.ctx as usize)
                .collect();
            log::error!(target: "rdmx::verbs", "{}: DEVICE_FATAL: every connection ({}) fails; the context must be recreated", s.name, qps.len());
            for q in qps {
                q.async_event(what, error);
            }
        }
        Subject::Other => {
            log::info!(target: "rdmx::verbs", "{}: async event {what} ({})", s.name, e.kind)
        }
    }
}
