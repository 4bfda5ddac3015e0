//! The verbs provider: rdmx on libibverbs (rdma-sys), for RoCEv2 NICs (ConnectX, E810),
//! kernel soft-RoCE, and rdmx's own libibverbs device (`rdmx-ibv`, which is how CI runs
//! this code: rdmx (verbs) -> libibverbs -> rdmx0 -> the soft provider).
//!
//! - [`device`]: device/port/GID selection, limits, PD;
//! - [`mr`]: `ibv_reg_mr` registrations (pools register each arena once);
//! - [`qp`]: a connection's channel, CQs and RC QP, post chains, batched polling;
//! - here: [`VerbsDevice`] and the side-channel watcher (TCP EOF -> QP to ERR, as the
//!   soft provider's progress thread does).
//!
//! The data-path verbs `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and
//! `ibv_req_notify_cq` are `static inline` in verbs.h (calls through `context->ops`):
//! rdma-sys reimplements them in Rust over its bindgen of the installed headers, so no
//! bindgen of our own is needed; `layout` (tests) checks the structures rdma-sys writes by
//! hand (`ibv_wc`, `ibv_send_wr`, `ibv_ah_attr`, ...) and the ops offsets against a C probe
//! built on the installed headers.

pub mod device;
#[cfg(test)]
mod layout;
pub mod mr;
pub mod qp;

use crate::config::Settings;
use crate::error::{Error, ErrorKind, Result};
use crate::provider::soft::sys::EventFd;
use device::Opened;
use mr::VerbsMrs;
use parking_lot::Mutex;
use qp::VerbsQp;
use rustc_hash::FxHashMap as HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

pub use device::ROCEV2_PORT;

/// An opened verbs device: PD, memory table, side-channel watcher.
#[derive(Debug)]
pub struct VerbsDevice {
    opened: Opened,
    mrs: Arc<VerbsMrs>,
    watch: Watcher,
    settings: Settings,
}

impl VerbsDevice {
    pub fn open(s: &Settings) -> Result<VerbsDevice> {
        let opened = device::open(s)?;
        let mrs = Arc::new(VerbsMrs::new(Arc::clone(&opened.pd)));
        Ok(VerbsDevice {
            opened,
            mrs,
            watch: Watcher::start()?,
            settings: s.clone(),
        })
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
        VerbsQp::create(
            &self.opened.pd,
            &self.mrs,
            &self.settings,
            self.opened.port,
            self.opened.gid_index,
            self.opened.active_mtu,
            &self.opened.limits,
        )
        .map(Arc::new)
    }

    /// Watches a connection's TCP side channel: on EOF the QP goes to ERR (flushing every
    /// outstanding WR) and further posts are refused.
    pub fn watch(&self, fd: RawFd, qp: &Arc<VerbsQp>) {
        self.watch.add(fd, Arc::downgrade(qp));
    }

    pub fn unwatch(&self, fd: RawFd) {
        self.watch.remove(fd);
    }
}

/// A thread waiting on the side channels (epoll, EPOLLRDHUP): the peer's FIN or RST.
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
}

impl Watcher {
    fn start() -> Result<Watcher> {
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
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: u64::MAX,
        };
        // SAFETY: valid fds and a live event struct.
        unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, stop_fd.raw_fd(), &mut ev) };
        let shared = Arc::new(WatchShared {
            epoll,
            stop_fd,
            stop: AtomicBool::new(false),
            qps: Mutex::new(HashMap::default()),
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
            if ev.u64 == u64::MAX {
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
