//! An idle thread's sleep: on its links' event fds, the context's receiving sockets (soft,
//! progress=inline), its shard's wake fd and (shard 0) the listener, until one fires or a
//! timer may be due.

use super::*;

impl Core {
    /// Sleeps until a completion, a wake-up or `max`.
    ///
    /// With the soft provider's progress=inline, the thread also sleeps on the context's
    /// receiving sockets and receives itself when it wakes (its next pass polls a link,
    /// which drives the device): a request wakes this thread only, not the provider's
    /// progress thread first and this one through a completion event.
    pub(super) fn sleep(&self, i: usize, max: Duration) {
        let shard = &self.shards[i];
        let mut fds = Vec::new();
        let mut rx = Vec::new();
        // The sessions whose links were armed (the others are quiet: see below).
        let mut armed: Vec<u64> = Vec::new();
        let now = Instant::now();
        {
            let st = shard.st.lock();
            if !st.queued.is_empty()
                || !st.incoming.is_empty()
                || !shard.ready.is_empty()
                || !shard.submitted.lock().is_empty()
            {
                return;
            }
            let since = Duration::from_nanos(
                (self.epoch.elapsed().as_nanos() as u64)
                    .saturating_sub(shard.last_event.load(Ordering::Relaxed)),
            );
            let recent = since < WATCH_AFTER;
            // Only with a link to poll: its poll is what receives. Before the looks at
            // the CQs below: the device's wake fd among them then covers what its progress
            // thread completes after them.
            if recent && (!st.pending.is_empty() || st.sessions.values().any(|s| s.link.is_some()))
            {
                self.ctx.rx_fds(&mut rx);
            }
            // With this thread on the receiving sockets, a quiet session's link needs no
            // arming: what its peer sends wakes the thread through them, and what the
            // provider's own thread completes meanwhile (a due timer, a side-channel event)
            // through the device's wake fd. 1,000 idle sessions made every sleep arm,
            // poll(2) and disarm 1,000 event fds. Parked sessions are quiet; a keepalive
            // coming due waits for the end of the sleep (at most `MAX_SLEEP`).
            let watching = !rx.is_empty();
            let ids: Vec<u64> = if watching {
                st.park.active.clone()
            } else {
                st.sessions.keys().copied().collect()
            };
            let links = ids
                .iter()
                .filter_map(|id| {
                    let s = st.sessions.get(id)?;
                    if watching && s.quiet(now) {
                        return None;
                    }
                    let l = s.link()?;
                    armed.push(*id);
                    Some(l)
                })
                .chain(st.pending.iter().map(|p| &p.link));
            for l in links {
                if !watching {
                    l.conn.req_notify();
                } else {
                    l.conn.arm();
                }
                fds.push(libc::pollfd {
                    fd: l.conn.event_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
        }
        for &fd in &rx {
            fds.push(libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
        }
        let wake_at = fds.len();
        fds.push(libc::pollfd {
            fd: shard.wake.raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        let links = fds.len();
        if i == 0
            && let Some(l) = self.listener.lock().as_ref()
        {
            for fd in l.wait_fds() {
                fds.push(libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
        }
        let ms = max.as_millis().clamp(1, 1000) as libc::c_int;
        let watch = !rx.is_empty();
        if watch {
            self.ctx.app_watch(true);
        }
        // SAFETY: `fds` is a valid array of pollfd of the length given.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if watch {
            self.ctx.app_watch(false);
        }
        // Only what fired needs reading (a read(2) each): usually just the sockets did.
        if fds[wake_at].revents != 0 {
            shard.wake.clear();
        }
        let fired: SmallVec<[RawFd; 4]> = fds[..wake_at - rx.len()]
            .iter()
            .filter(|p| p.revents != 0)
            .map(|p| p.fd)
            .collect();
        let accept = fds[links..].iter().any(|p| p.revents != 0);
        if wake_at == rx.len() && !accept {
            return; // no link was armed, no connection is waiting
        }
        let mut st = shard.st.lock();
        if accept {
            st.next_accept = None;
        }
        let links = armed
            .iter()
            .filter_map(|id| st.sessions.get(id)?.link())
            .chain(st.pending.iter().map(|p| &p.link));
        for l in links {
            if fired.contains(&l.conn.event_fd()) {
                l.conn.clear_event();
            } else {
                // Woken by something else (usually the sockets): this thread polls the
                // link next, and an arming left in place would fire on its own completions
                // (an eventfd write, then a wakeup of the next sleep for nothing).
                l.conn.disarm();
            }
        }
    }
}
