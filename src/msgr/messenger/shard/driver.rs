//! The driver: a worker thread's loop and the application's `poll`, each running progress
//! passes over a shard (a pass posts what sessions queued, runs the device's progress, then
//! drives each active session's link and machine), then the callbacks of what they found,
//! with no lock held.

use super::*;

impl Core {
    pub(super) fn worker(&self, i: usize) {
        WORKER_OF.with(|w| w.set((self as *const Core as usize, i)));
        // A short slice: on a busy host, woken by its work, it runs at once (`msgr::spin`).
        if let Some(slice) = self.settings.worker_slice
            && let Err(e) = crate::msgr::spin::set_thread_slice(slice)
        {
            log::debug!(target: "rdmx::msgr", "messenger worker {i}: time slice of {slice:?} refused: {e}");
        }
        let mut spin = Spinner::new(self.settings.spin);
        while !self.stopping.load(Ordering::Acquire) {
            let ev = self.pass(i);
            let n = ev.len();
            self.dispatch(ev);
            if n > 0 {
                spin.work();
                continue;
            }
            // Nothing happened: poll on for the spin budget (`poll_mode`/`polling_us`,
            // not while the thread waits for a CPU), then sleep on the connections' event fds.
            if self.poll_again(&mut spin, Instant::now()) {
                std::hint::spin_loop();
            } else {
                self.sleep(i, MAX_SLEEP);
                spin.slept();
            }
        }
        WORKER_OF.with(|w| w.set((0, 0)));
    }

    /// After an empty pass at `now`: whether to poll again rather than sleep (see
    /// `Spinner`).
    pub(super) fn poll_again(&self, spin: &mut Spinner, now: Instant) -> bool {
        if spin.poll_again(now) {
            return true;
        }
        let backoffs = spin.take_backoffs();
        if backoffs > 0 {
            self.spin_backoffs.fetch_add(backoffs, Ordering::Relaxed);
        }
        false
    }

    /// Whether this thread is the worker of shard `i` of this messenger.
    pub(super) fn on_worker_of(&self, i: usize) -> bool {
        WORKER_OF.with(Cell::get) == (self as *const Core as usize, i)
    }

    pub fn poll(&self, timeout: Duration) -> Result<usize> {
        if self.settings.threads > 0 {
            return Err(Error::fixed(
                ErrorKind::InvalidArgument,
                "poll: the messenger runs worker threads (msgr_threads > 0)",
            ));
        }
        if IN_CALLBACK.with(Cell::get) {
            return Err(Error::fixed(
                ErrorKind::Busy,
                "poll: called from inside a messenger callback",
            ));
        }
        let end = Instant::now() + timeout;
        // Polls for the spin budget (`poll_mode`/`polling_us`, not while the thread
        // waits for a CPU) before sleeping; the budget runs across calls (a caller polling with
        // a zero timeout spins through it too). A second thread polling meanwhile keeps
        // its own state rather than wait for the lock.
        let mut shared = self.poll_spin.try_lock();
        let mut own;
        let spin: &mut Spinner = match shared.as_deref_mut() {
            Some(s) => s,
            None => {
                own = Spinner::new(self.settings.spin);
                &mut own
            }
        };
        loop {
            let ev = self.pass(0);
            let n = self.dispatch(ev);
            if n > 0 {
                spin.work();
                return Ok(n);
            }
            let t = Instant::now();
            let left = end.saturating_duration_since(t);
            if left.is_zero() {
                return Ok(0);
            }
            if self.poll_again(spin, t) {
                std::hint::spin_loop();
                continue;
            }
            self.sleep(0, left.min(MAX_SLEEP));
            spin.slept();
        }
    }

    /// Runs the callbacks for `ev`, with no lock held. Returns how many ran.
    pub(super) fn dispatch(&self, mut ev: Vec<Event>) -> usize {
        let n = self.run_callbacks(&mut ev);
        // The emptied list serves this thread's next pass.
        if ev.capacity() <= SPARE_EVENTS_MAX {
            ev.clear();
            SPARE_EVENTS.set(ev);
        }
        n
    }

    /// Runs the callbacks of `ev` (taking them out), with no lock held.
    pub(super) fn run_callbacks(&self, ev: &mut Vec<Event>) -> usize {
        if ev.is_empty() {
            return 0;
        }
        let Some(owner) = self.owner.get().and_then(Weak::upgrade) else {
            return 0; // shutting down: nobody to call
        };
        let m = Messenger {
            core: Arc::clone(&owner.0),
            _owner: owner,
        };
        let d = &self.dispatcher;
        let n = ev.len();
        let was = IN_CALLBACK.with(|c| c.replace(true));
        // A callback that panicked ends its session (guard.rs), after the others ran.
        let mut panicked = Vec::new();
        for e in ev.drain(..) {
            let p = match e {
                Event::Connect(s, peer, incoming) => d.call(s, "on_connect", |d| {
                    d.on_connect(&m, s, peer, incoming);
                }),
                Event::Message(s, msg) => d.call(s, "on_message", |d| d.on_message(&m, s, msg)),
                Event::SendDone(s, id, r) => d.call(s, "on_send_complete", |d| {
                    d.on_send_complete(&m, s, id, r);
                }),
                Event::Ready(s) => d.call(s, "on_send_ready", |d| d.on_send_ready(&m, s)),
                Event::Reset(s, why) => d.call(s, "on_reset", |d| d.on_reset(&m, s, &why)),
                Event::Path(s, i, pe) => d.call(s, "on_path", |d| d.on_path(&m, s, i, &pe)),
            };
            panicked.extend(p);
        }
        IN_CALLBACK.with(|c| c.set(was));
        for (s, e) in panicked {
            // Gone already (the panic was in its on_reset, or it was closed): nothing to end.
            let _ = self.close_with(s, Some(e));
        }
        n
    }

    /// One progress pass over shard `i`: returns the events to dispatch.
    pub(super) fn pass(&self, i: usize) -> Vec<Event> {
        let now = Instant::now();
        let shard = &self.shards[i];
        let mut moves: Vec<(usize, Link, Credits, Header)> = Vec::new();
        let mut st = shard.st.lock();
        let mut ev = std::mem::take(&mut st.queued);
        if ev.capacity() == 0 {
            ev = SPARE_EVENTS.take();
        }
        if i == 0 && st.next_accept.is_none_or(|t| now >= t) {
            let found = self.accept_new(&mut st, now);
            st.next_accept = (!found).then(|| now + ACCEPT_EVERY);
        }
        #[cfg(test)]
        self.run_pass_hook(PassStage::Start, &st);
        // The sends made since the last pass (`submit.rs`): their sessions wake, and the
        // machines take them, in order.
        {
            let g = &mut *st;
            std::mem::swap(&mut *shard.submitted.lock(), &mut g.submitted_ids);
            for &id in &g.submitted_ids {
                g.park.wake(&mut g.sessions, id);
                if let Some(sess) = g.sessions.get_mut(&id) {
                    sess.take_submitted(&mut ev);
                }
            }
            g.submitted_ids.clear();
        }
        // Answers queued since the last pass (sent from its callbacks) go first: the
        // provider may hold the ACKs of the requests they answer (soft, progress=inline),
        // and then one post sends both. Then one progress pass of the device for every
        // link (one receive call, not one per session), then each link's completions.
        {
            let g = &mut *st;
            for id in &g.park.active {
                if let Some(sess) = g.sessions.get_mut(id) {
                    self.send_queued(sess, now, &mut ev, &mut g.closing);
                }
            }
        }
        self.ctx.progress();
        // After the device's pass: the parked sessions it completed work for join this one.
        {
            let g = &mut *st;
            g.park.wake_due(&mut g.sessions, &shard.ready, now);
        }
        self.drive_pending(i, &mut st, now, &mut ev, &mut moves);
        for (link, credits, h) in std::mem::take(&mut st.incoming) {
            self.attach_incoming(i, &mut st, link, credits, &h, now, &mut ev);
        }
        if self.restarts.load(Ordering::Acquire) != st.restarts_seen {
            self.tell_incarnations(&mut st, now, &mut ev);
            let g = &mut *st;
            g.park.wake_all(&mut g.sessions);
        }
        let mut ended = false;
        let g = &mut *st;
        let mut k = 0;
        while k < g.park.active.len() {
            let id = g.park.active[k];
            let Some(sess) = g.sessions.get_mut(&id) else {
                g.park.active.swap_remove(k); // closed by close_session
                continue;
            };
            if !sess.quiet(now) {
                sess.quiet_since = None;
                self.drive_session(sess, now, &mut ev, &mut g.closing, &mut g.link_events);
            } else if sess.link().is_some_and(|l| l.parkable) {
                // Quiet for PARK_AFTER: passes skip it until a completion, its keepalive
                // or a call wakes it.
                let since = *sess.quiet_since.get_or_insert(now);
                if now.saturating_duration_since(since) >= PARK_AFTER {
                    sess.quiet_since = None;
                    g.park.park(k, sess);
                    continue;
                }
            }
            ended |= sess.m.state == SessionState::Closed;
            k += 1;
        }
        #[cfg(test)]
        self.run_pass_hook(PassStage::Driven, &st);
        if ended {
            let gone: Vec<u64> = st
                .sessions
                .iter()
                .filter(|(_, s)| s.m.state == SessionState::Closed)
                .map(|(&id, _)| id)
                .collect();
            for id in gone {
                // Sends that reached its gate after the machine ended fail before its
                // on_reset; later ones are refused.
                if let Some(sess) = self.remove_session(&mut st, id, &mut ev) {
                    self.forget(&sess);
                }
            }
        }
        let g = &mut *st;
        let sink = &mut g.link_events;
        g.closing.retain_mut(|(l, until)| {
            now < *until && l.sq_room() < self.settings.max_send_wr as usize && {
                // What a closing link still receives is dropped (its chunks go back).
                let ok = l.poll(POLL_BUDGET, POLL_BUDGET, sink).is_ok();
                sink.clear();
                ok
            }
        });
        drop(st);
        if !ev.is_empty() {
            shard
                .last_event
                .store(self.epoch.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        for (to, link, credits, h) in moves {
            let Some(target) = self.shards.get(to) else {
                continue;
            };
            target.st.lock().incoming.push((link, credits, h));
            target.wake.signal();
        }
        ev
    }

    /// The first step of a session's pass, before the device's progress pass: without a
    /// link, its timers and connection attempt; with one, the messages queued since the
    /// last pass go out (with what else the pass has to do).
    pub(super) fn send_queued(
        &self,
        sess: &mut Session,
        now: Instant,
        ev: &mut Vec<Event>,
        closing: &mut Vec<(Link, Instant)>,
    ) {
        if sess.m.state == SessionState::Closed {
            return;
        }
        // Without a link: its timers and attempt; with several paths: theirs too.
        if sess.link.is_none() || sess.m.path_count() > 1 {
            self.connect_step(sess, now, ev, closing);
        }
        if sess.link.is_none() || sess.m.queued() == 0 {
            return;
        }
        sess.step(now, &self.bufs.data, ev, closing);
    }

    /// The rest of a session's pass, after the device's progress pass: its link's
    /// completions fed to the machine, then the protocol steps.
    pub(super) fn drive_session(
        &self,
        sess: &mut Session,
        now: Instant,
        ev: &mut Vec<Event>,
        closing: &mut Vec<(Link, Instant)>,
        out: &mut Vec<LinkEvent>,
    ) {
        if sess.m.state == SessionState::Closed {
            return;
        }
        // The standby paths' links: their completions (keepalives, credits, a switch).
        if !sess.standby.is_empty() {
            let lids: SmallVec<[u64; 4]> = sess.standby.iter().map(|(l, _)| *l).collect();
            for lid in lids {
                let Some((_, link)) = sess.standby.iter_mut().find(|(l, _)| *l == lid) else {
                    continue;
                };
                if let Err(e) = link.poll(POLL_BUDGET, self.settings.rx_batch, out) {
                    sess.m.on_link_error(now, lid, e);
                }
                // Actions after each event: a switch to this link (the accepting side
                // following the peer's) makes it the current one before its next frame.
                for e in out.drain(..) {
                    sess.on_link_event(now, lid, e, &self.settings, &self.bufs.data);
                    sess.exec(now, ev, closing);
                }
            }
        }
        if let Some((lid, link)) = sess.link.as_mut() {
            let lid = *lid;
            // `out` is the shard's scratch (empty between uses): no list per session per
            // pass.
            if let Err(e) = link.poll(POLL_BUDGET, self.settings.rx_batch, out) {
                // The link faults: what came with it is stale to the machine (dropped
                // here, replayed by the peer).
                sess.m.on_link_error(now, lid, e);
            }
            for e in out.drain(..) {
                sess.on_link_event(now, lid, e, &self.settings, &self.bufs.data);
            }
            sess.exec(now, ev, closing);
        }
        if sess.link.is_some() {
            sess.step(now, &self.bufs.data, ev, closing);
        } else {
            sess.step_standby(now, ev, closing);
        }
        // Acknowledgements may have freed room: a send refused at the gate is owed a Ready.
        sess.sync_gate(ev);
    }

    #[cfg(test)]
    fn run_pass_hook(&self, stage: PassStage, st: &ShardState) {
        let hook = self.pass_hook.lock().clone();
        if let Some(hook) = hook {
            hook(stage, st);
        }
    }
}
