//! The connecting side: a session without a link runs its machine's timers, starts the
//! connection attempt the machine asks for on a helper thread, and turns a finished one into
//! its link (the hello goes at once).

use super::*;
use crate::msgr::messenger::session::Attempt;

impl Core {
    /// A session without a link: the machine's timers (a reconnect attempt due, the
    /// accepting side's give-up), the attempt it asked for started, and one under way
    /// looked at: its connection becomes the session's link, and the hello goes on it.
    pub(super) fn connect_step(
        &self,
        sess: &mut Session,
        now: Instant,
        ev: &mut Vec<Event>,
        closing: &mut Vec<(Link, Instant)>,
    ) {
        sess.m.handle_timeout(now);
        sess.exec(now, ev, closing);
        for path in std::mem::take(&mut sess.want_connect) {
            if let Some(addr) = sess.addrs.get(path).cloned() {
                let rx = self.spawn_attempt(addr, sess.id());
                sess.attempts.push((path, rx));
            }
        }
        let mut k = 0;
        while k < sess.attempts.len() {
            let r = match sess.attempts[k].1.try_recv() {
                Err(mpsc::TryRecvError::Empty) => {
                    k += 1;
                    continue;
                }
                Err(mpsc::TryRecvError::Disconnected) => Err(closed("connect")),
                Ok(r) => r,
            };
            let (path, _) = sess.attempts.swap_remove(k);
            self.attempt_done(sess, path, r, now, ev, closing);
        }
    }

    /// A connection attempt of path `path` ended: its connection becomes a link of the
    /// session (the hello, or a path-join, goes at once), or the machine hears it failed.
    fn attempt_done(
        &self,
        sess: &mut Session,
        path: usize,
        r: Result<(Connection, Vec<RecvSlot>)>,
        now: Instant,
        ev: &mut Vec<Event>,
        closing: &mut Vec<(Link, Instant)>,
    ) {
        if sess.m.state == SessionState::Closed {
            if let Ok((conn, slots)) = r {
                drop(conn);
                release_slots(&self.bufs, slots);
            }
            return;
        }
        let (conn, slots) = match r {
            Ok(c) => c,
            Err(e) => {
                log::debug!(target: "rdmx::msgr", "session {:#x}: connect attempt (path {path}) failed: {e}", sess.id());
                sess.m.attempt_failed(now, path, e);
                sess.exec(now, ev, closing);
                return;
            }
        };
        if sess.m.is_join_attempt(path) && !conn.peer_takes_paths() {
            // An older peer would take the join for a resume and drop the active link.
            drop(conn);
            release_slots(&self.bufs, slots);
            let e = Error::fixed(
                ErrorKind::Unsupported,
                "the peer's messenger does not take path-joins (protocol before 1.4)",
            );
            sess.m.attempt_failed(now, path, e);
            sess.exec(now, ev, closing);
            return;
        }
        self.admit.set_outgoing(sess.id(), conn.peer_entity());
        let (mut link, credits) = self.link_from(conn, slots);
        self.hook_link(&mut link, sess.id());
        let id = HelloId {
            claimed: self.claims.lock().get(&sess.id()).copied(),
            incarnation: self.incarnation,
            port: self
                .listener
                .lock()
                .as_ref()
                .map_or(0, |l| l.local_addr().port()),
        };
        let lid = sess.m.link_up(now, path, credits, id);
        if sess.m.link().is_some_and(|l| l.lid == lid) {
            sess.link = Some((lid, link));
            sess.note_peer_limits();
        } else {
            sess.standby.push((lid, link));
        }
        // The hello goes at once (a link that cannot take it is a failed attempt: the
        // machine's fault before the hello's answer).
        sess.exec(now, ev, closing);
        sess.flush(now, ev, closing);
        sess.flush_standby(now, ev, closing);
    }

    /// Connects on a helper thread (setup blocks up to the handshake timeout).
    pub(super) fn spawn_attempt(&self, addr: String, id: u64) -> Attempt {
        let (tx, rx) = mpsc::channel();
        let me = self.me.get().and_then(Weak::upgrade);
        let timeout = self.settings.reconnect_timeout.min(Duration::from_secs(10));
        let cancel = match ConnectCancel::new() {
            Ok(c) => Arc::new(c),
            Err(e) => {
                let (tx2, rx2) = mpsc::channel();
                let _ = tx2.send(Err(e));
                return rx2;
            }
        };
        let theirs = Arc::clone(&cancel);
        let spawned = std::thread::Builder::new()
            .name("rdmx-msgr-connect".into())
            .spawn(move || {
                let Some(core) = me else { return };
                let r = core.ctx.connect_cancellable(&addr, timeout, &theirs);
                let slots = take_hooked(&core.bufs, r.as_ref().ok());
                let r = r.and_then(|conn| {
                    slots.map(|s| (conn, s)).ok_or_else(|| {
                        Error::fixed(ErrorKind::Closed, "connect: no receives were posted")
                    })
                });
                if let Err(std::sync::mpsc::SendError(Ok((conn, slots)))) = tx.send(r) {
                    drop(conn);
                    release_slots(&core.bufs, slots);
                }
                if let Some(s) = core.shard_of(id) {
                    s.wake.signal();
                }
            });
        let Ok(handle) = spawned else {
            let (tx2, rx2) = mpsc::channel();
            let _ = tx2.send(Err(Error::fixed(ErrorKind::Io, "connect: no thread")));
            return rx2;
        };
        let mut attempts = self.attempts.lock();
        attempts.retain(|(_, h)| !h.is_finished());
        attempts.push((cancel, handle));
        if self.stopping.load(Ordering::Acquire) {
            // Shutdown began meanwhile and may have looked at the list already.
            for (c, _) in attempts.iter() {
                c.cancel();
            }
        }
        rx
    }
}
