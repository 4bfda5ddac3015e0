//! Side channels the device watches: a TCP connection per QP whose EOF means the peer is
//! gone (the QP goes to ERR and flushes), as one epoll set the progress thread polls.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::super::sys;
use super::{Shared, SoftDevice};
use crate::error::{Error, ErrorKind, Result};

impl SoftDevice {
    /// Watches a TCP side channel: when its peer closes, the QP goes to ERR (flushing
    /// every outstanding WR) and its CQ channel is signaled.
    pub fn watch(&self, fd: RawFd, qpn: u32) {
        let mut w = self.shared.watches.lock();
        w.insert(fd, qpn);
        self.shared.watch_set.add(fd);
    }

    pub fn unwatch(&self, fd: RawFd) {
        let mut w = self.shared.watches.lock();
        if w.remove(&fd).is_some() {
            self.shared.watch_set.remove(fd);
        }
    }
}

impl Shared {
    /// Side channels among `fds` that poll reported readable: a closed one means the peer
    /// is gone.
    pub(super) fn check_watches(&self, fds: &[RawFd]) {
        let dead: Vec<(RawFd, u32)> = {
            let mut w = self.watches.lock();
            let dead: Vec<(RawFd, u32)> = fds
                .iter()
                .filter(|fd| w.contains_key(fd) && sys::peer_closed(**fd))
                .map(|fd| (*fd, w[fd]))
                .collect();
            // No longer watched (dead, or unwatched meanwhile): out of the epoll set, which
            // would otherwise report it again at once.
            for fd in fds {
                if !w.contains_key(fd) {
                    self.watch_set.remove(*fd);
                }
            }
            for (fd, _) in &dead {
                w.remove(fd);
                self.watch_set.remove(*fd);
            }
            dead
        };
        for (_, qpn) in dead {
            if let Some(qp) = self.qps.read().get(&qpn).cloned() {
                log::info!(target: "rdmx::soft", "QP {qpn:#x}: peer closed the side channel; flushing");
                qp.fail(&self.mrs, self.now());
                qp.send_cq.wake_waiters();
            }
        }
    }
}

/// The watched TCP side channels as one epoll set (readable or hung up), so the progress
/// thread polls one fd however many connections there are.
pub(super) struct WatchSet(OwnedFd);

impl WatchSet {
    pub(super) fn new() -> Result<WatchSet> {
        // SAFETY: epoll_create1 takes no pointers; a valid fd is returned or -1.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(Error::new(
                ErrorKind::Io,
                format!("epoll_create1: {}", std::io::Error::last_os_error()),
            ));
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        Ok(WatchSet(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    pub(super) fn raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd) -> std::io::Result<()> {
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
            u64: fd as u64,
        };
        // SAFETY: `ev` lives for the call; the kernel copies it (and ignores it for DEL).
        if unsafe { libc::epoll_ctl(self.raw_fd(), op, fd, &mut ev) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    pub(super) fn add(&self, fd: RawFd) {
        let r = match self.ctl(libc::EPOLL_CTL_ADD, fd) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => self.ctl(libc::EPOLL_CTL_MOD, fd),
            r => r,
        };
        if let Err(e) = r {
            log::warn!(target: "rdmx::soft", "side channel fd {fd}: cannot watch: {e}");
        }
    }

    /// Stops watching `fd` (already gone from the set if it was closed: ignored).
    pub(super) fn remove(&self, fd: RawFd) {
        let _ = self.ctl(libc::EPOLL_CTL_DEL, fd);
    }

    /// The watched fds that are ready now, into `out` (`events`: the caller's buffer).
    pub(super) fn ready(&self, events: &mut [libc::epoll_event], out: &mut Vec<RawFd>) {
        // SAFETY: `events` is a live buffer of `events.len()` entries the kernel fills;
        // timeout 0 does not block.
        let n = unsafe {
            libc::epoll_wait(
                self.raw_fd(),
                events.as_mut_ptr(),
                events.len().min(i32::MAX as usize) as i32,
                0,
            )
        };
        for e in events.iter().take(n.max(0) as usize) {
            out.push(e.u64 as RawFd);
        }
    }
}
