//! Completions: `poll` hands them to the caller, and `wait` drives progress while none is
//! ready (the messenger's poll in caller-driven mode, the completion eventfd with worker
//! threads, the one-sided connection in `Mode::Read`).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{BlkClient, Completion};
use crate::error::Result;

impl BlkClient {
    /// Drives progress for up to `timeout` while nothing is ready: the messenger's `poll`
    /// (caller-driven mode) polls for its spin budget, then sleeps.
    pub(super) fn wait(&self, timeout: Duration) -> Result<()> {
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
}
