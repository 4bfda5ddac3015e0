//! Completion queues: bounded FIFOs of work completions, with `req_notify` semantics on a
//! completion channel (an eventfd a daemon can put in its epoll set).

use crate::rc::{WcOpcode, WcStatus};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::sys::EventFd;

/// A work completion as the provider reports it: the caller's cookie instead of the
/// engine's internal WR id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wc {
    pub cookie: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    pub byte_len: u32,
    pub imm: Option<u32>,
    pub qp_num: u32,
}

/// One completion queue.
#[derive(Debug)]
pub struct Cq {
    q: Mutex<VecDeque<Wc>>,
    cap: usize,
    channel: Arc<EventFd>,
    armed: AtomicBool,
    overflows: AtomicU64,
}

impl Cq {
    /// A CQ of `cap` entries that signals `channel` when armed.
    pub fn new(cap: usize, channel: Arc<EventFd>) -> Cq {
        Cq {
            q: Mutex::new(VecDeque::with_capacity(cap.min(1 << 16))),
            cap: cap.max(1),
            channel,
            armed: AtomicBool::new(false),
            overflows: AtomicU64::new(0),
        }
    }

    /// Adds a completion. A full CQ drops it and counts an overflow (config validation
    /// sizes CQs so that this cannot happen: the cliff the seed warns about).
    pub fn push(&self, wc: Wc) {
        {
            let mut q = self.q.lock();
            if q.len() >= self.cap {
                self.overflows.fetch_add(1, Ordering::Relaxed);
                log::error!(target: "rdmx::cq", "completion queue overflow ({} entries): completion {wc:?} lost", self.cap);
                return;
            }
            q.push_back(wc);
        }
        if self.armed.swap(false, Ordering::AcqRel) {
            self.channel.signal();
        }
    }

    /// Moves up to `out.len()` completions into `out`; returns how many.
    pub fn poll(&self, out: &mut [Wc]) -> usize {
        let mut q = self.q.lock();
        let n = out.len().min(q.len());
        for (slot, wc) in out.iter_mut().zip(q.drain(..n)) {
            *slot = wc;
        }
        n
    }

    /// Arms the channel: the next completion added signals it (`ibv_req_notify_cq`). If
    /// completions are already queued it signals at once, so a waiter cannot miss them.
    pub fn req_notify(&self) {
        self.armed.store(true, Ordering::Release);
        if !self.q.lock().is_empty() && self.armed.swap(false, Ordering::AcqRel) {
            self.channel.signal();
        }
    }

    /// Signals the channel regardless of arming (a QP failed: waiters must look).
    pub fn wake_waiters(&self) {
        self.channel.signal();
    }

    pub fn len(&self) -> usize {
        self.q.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn overflows(&self) -> u64 {
        self.overflows.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::soft::sys::poll_readable;
    use std::time::Duration;

    fn wc(cookie: u64) -> Wc {
        Wc {
            cookie,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            byte_len: 0,
            imm: None,
            qp_num: 1,
        }
    }

    #[test]
    fn fifo_bounded_and_notifies_once_armed() {
        let ch = Arc::new(EventFd::new().unwrap());
        let cq = Cq::new(2, Arc::clone(&ch));
        let mut ready = Vec::new();
        cq.push(wc(1));
        poll_readable(&[ch.raw_fd()], Duration::ZERO, &mut ready).unwrap();
        assert!(ready.is_empty(), "not armed: no signal");
        cq.req_notify(); // already non-empty: signals at once
        poll_readable(&[ch.raw_fd()], Duration::ZERO, &mut ready).unwrap();
        assert_eq!(ready, vec![0]);
        ch.clear();
        cq.push(wc(2));
        cq.push(wc(3)); // overflow
        assert_eq!(cq.overflows(), 1);
        let mut out = [wc(0); 4];
        assert_eq!(cq.poll(&mut out), 2);
        assert_eq!((out[0].cookie, out[1].cookie), (1, 2));
        cq.req_notify();
        cq.push(wc(4));
        poll_readable(&[ch.raw_fd()], Duration::ZERO, &mut ready).unwrap();
        assert_eq!(ready, vec![0]);
    }
}
