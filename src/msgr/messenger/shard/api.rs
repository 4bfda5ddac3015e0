//! What [`Messenger`](crate::msgr::Messenger) calls on the core: listen, connect, send (its
//! checks, the payload prepared on the caller's thread), close, session info, fault injection.

use super::*;

impl Core {
    pub fn listen(&self, addr: &str) -> Result<SocketAddr> {
        let mut g = self.listener.lock();
        if g.is_some() {
            return Err(Error::fixed(
                ErrorKind::InvalidArgument,
                "messenger: already listening (one listener per messenger)",
            ));
        }
        let l = self.ctx.listen(addr)?;
        let a = l.local_addr();
        *g = Some(l);
        Ok(a)
    }

    /// [`Core::connect`] whose hellos claim `claimed` as this side's session id (a
    /// takeover attempt: tests of the accepting side's entity check).
    pub fn connect_claiming(&self, addr: &str, policy: Policy, claimed: u64) -> Result<SessionId> {
        let s = self.connect(addr, policy)?;
        self.claims.lock().insert(s.0, claimed);
        Ok(s)
    }

    pub fn connect(&self, addr: &str, policy: Policy) -> Result<SessionId> {
        self.connect_paths(&[addr], policy, PathPolicy::Standby)
    }

    /// A session to one peer over several paths (`addrs[0]` preferred): see
    /// [`crate::msgr::Messenger::connect_paths`].
    pub fn connect_paths(
        &self,
        addrs: &[&str],
        policy: Policy,
        path_policy: PathPolicy,
    ) -> Result<SessionId> {
        if self.stopping.load(Ordering::Acquire) {
            return Err(Error::fixed(ErrorKind::Closed, "messenger: shut down"));
        }
        if addrs.is_empty() || addrs.len() > MAX_PATHS {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "connect: {} addresses (a session has 1 to {MAX_PATHS} paths)",
                    addrs.len()
                ),
            ));
        }
        // Refuse a malformed address now rather than on the helper thread.
        let peer = check_addr(addrs[0])?;
        for a in &addrs[1..] {
            check_addr(a)?;
        }
        let shard = self.next_shard.fetch_add(1, Ordering::Relaxed) % self.shards.len();
        let id = self.new_id(shard);
        let now = Instant::now();
        let mut m = Machine::new(self.rules, id, policy, false, now);
        m.set_active(path_policy == PathPolicy::Active);
        for _ in 1..addrs.len() {
            m.add_path(now);
        }
        let mut s = Session::new(m);
        s.gate.set_active(path_policy == PathPolicy::Active);
        s.addrs = addrs.iter().map(|a| a.to_string()).collect();
        s.peer = Some(peer);
        {
            let mut st = self.shards[shard].st.lock();
            let st = &mut *st;
            self.insert_session(st, s);
            st.park.wake(&mut st.sessions, id);
        }
        self.shards[shard].wake.signal();
        Ok(SessionId(id))
    }

    /// Adds a path to session `s` (connecting side): its index.
    pub fn add_path(&self, s: SessionId, addr: &str) -> Result<usize> {
        check_addr(addr)?;
        self.with_session(s, "add_path", |sess| {
            if sess.m.incoming {
                return Err(Error::fixed(
                    ErrorKind::InvalidArgument,
                    "add_path: the connecting side adds paths (this side accepted the session)",
                ));
            }
            if sess.m.path_count() >= MAX_PATHS {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!("add_path: the session has {MAX_PATHS} paths already"),
                ));
            }
            let i = sess.m.add_path(Instant::now());
            sess.addrs.push(addr.to_string());
            Ok(i)
        })
    }

    /// Removes path `index` of session `s` (connecting side).
    pub fn remove_path(&self, s: SessionId, index: usize) -> Result<()> {
        self.with_session(s, "remove_path", |sess| {
            if sess.m.incoming {
                return Err(Error::fixed(
                    ErrorKind::InvalidArgument,
                    "remove_path: the connecting side removes paths (this side accepted the \
                     session)",
                ));
            }
            sess.m.remove_path(Instant::now(), index)
        })
    }

    /// The paths of session `s`, with their state and counters.
    pub fn paths(&self, s: SessionId) -> Result<Vec<PathInfo>> {
        let shard = self.shard_of(s.0).ok_or_else(|| closed("paths"))?;
        let st = shard.st.lock();
        st.sessions
            .get(&s.0)
            .map(|sess| sess.paths(Instant::now()))
            .ok_or_else(|| Error::fixed(ErrorKind::InvalidArgument, "paths: no such session"))
    }

    /// Runs `f` on session `s` under its shard's lock, then its actions; wakes the shard.
    fn with_session<T>(
        &self,
        s: SessionId,
        what: &'static str,
        f: impl FnOnce(&mut Session) -> Result<T>,
    ) -> Result<T> {
        let shard = self.shard_of(s.0).ok_or_else(|| closed(what))?;
        let mut st = shard.st.lock();
        let g = &mut *st;
        let sess = g.sessions.get_mut(&s.0).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("{what}: no such session"),
            )
        })?;
        let r = f(sess);
        let mut ev = Vec::new();
        sess.exec(Instant::now(), &mut ev, &mut g.closing);
        g.queued.extend(ev);
        g.park.wake(&mut g.sessions, s.0);
        drop(st);
        shard.wake.signal();
        r
    }

    pub fn send(&self, s: SessionId, msg: OutMessage) -> std::result::Result<SendId, Refused> {
        let refuse = |error: Error, msg: OutMessage| Refused {
            error,
            msg: Box::new(msg),
        };
        let Some(shard) = self.shard_of(s.0) else {
            return Err(refuse(closed("send"), msg));
        };
        if let Err(e) = self.check_shape(&msg) {
            return Err(refuse(e, msg));
        }
        let bytes = (msg.front.len()
            + msg.data.iter().map(Payload::len).sum::<usize>()
            + msg.writes.iter().map(|w| w.data.len()).sum::<usize>()) as u64;
        // The session's gate (`submit.rs`), not the shard's state: a pass may be running.
        let Some(gate) = shard.gates.read().get(&s.0).map(Arc::clone) else {
            return Err(refuse(closed("send"), msg));
        };
        let data_len = (
            msg.data.len(),
            msg.data.iter().map(|p| p.len() as u64).sum::<u64>(),
        );
        // The machine's checks before the payload is prepared (closed, WRITEs on a lossless
        // session, the send-queue bound) and the peer's advertised limits; `submit` checks
        // again after.
        let first = Shape {
            msg_type: msg.msg_type,
            imm: msg.imm,
            bytes,
            writes: msg.writes.len() as u32,
            ..Shape::default()
        };
        if let Err(e) = gate.admit(&self.rules, &first, data_len) {
            return Err(refuse(e, msg));
        }
        // Copies and registrations with no lock held.
        let OutMessage {
            msg_type,
            front,
            data,
            writes: wr_in,
            imm,
        } = msg;
        // A refused message goes back as it came (its payloads are released).
        let back = |front| OutMessage {
            imm,
            ..OutMessage::new(msg_type, front)
        };
        let mut segs = Vec::with_capacity(data.len());
        let mut copied = 0;
        for p in data {
            match self.bufs.prepare(p) {
                Ok((seg, c)) => {
                    copied += c;
                    segs.push(seg);
                }
                Err(e) => {
                    // The payloads prepared so far are released with `segs`.
                    return Err(refuse(e, back(front)));
                }
            }
        }
        let mut writes = Vec::with_capacity(wr_in.len());
        for w in wr_in {
            match self.bufs.prepare(w.data) {
                Ok((seg, c)) => {
                    copied += c;
                    writes.push(crate::msgr::messenger::link::TxWrite {
                        seg,
                        addr: w.addr,
                        rkey: w.rkey,
                    });
                }
                Err(e) => {
                    return Err(refuse(e, back(front)));
                }
            }
        }
        let max_sge = self.max_sge();
        let need =
            usize::from(imm.is_none()) + writes.iter().map(|w| w.wrs(max_sge)).sum::<usize>();
        if need > self.settings.max_send_wr as usize / 2 {
            return Err(refuse(
                Error::new(
                    ErrorKind::InvalidArgument,
                    format!(
                        "send: the message's RDMA WRITEs take {} work requests; at most {} \
                         (half of max_send_wr): fewer or registered (one-part) sources",
                        need - usize::from(imm.is_none()),
                        self.settings.max_send_wr as usize / 2 - 1
                    ),
                ),
                back(front),
            ));
        }
        let out = OutMsg {
            front,
            segs,
            writes,
        };
        let shape = out.shape(msg_type, imm, bytes, self.settings.eager_max, max_sge);
        // Checked again at the gate: another thread's send may have filled the queue
        // meanwhile (or the session ended).
        let (seq, list) = match gate.submit(&self.rules, out, shape, data_len, copied) {
            Ok(r) => r,
            Err((out, e)) => return Err(refuse(e, back(out.front))),
        };
        // The first send since the pass last took the gate puts the session on the shard's
        // list (the pass wakes it and takes its sends) and wakes the shard's thread, unless
        // this is that thread (its next pass takes it) or the application polls.
        if list {
            shard.submitted.lock().push(s.0);
            if self.settings.threads > 0 && !self.on_worker_of((s.0 & 0xff) as usize) {
                shard.wake.signal();
            }
        }
        Ok(seq)
    }

    /// Refuses what the wire cannot carry, before anything is consumed.
    pub(super) fn check_shape(&self, msg: &OutMessage) -> Result<()> {
        match msg.imm {
            None if msg.msg_type == MSG_TYPE_IMM => {
                return Err(Error::fixed(
                    ErrorKind::InvalidArgument,
                    "send: message type 0xffff is reserved for immediate messages \
                     (OutMessage::immediate)",
                ));
            }
            Some(_)
                if msg.msg_type != MSG_TYPE_IMM
                    || !msg.front.is_empty()
                    || !msg.data.is_empty()
                    || msg.writes.is_empty() =>
            {
                return Err(Error::fixed(
                    ErrorKind::InvalidArgument,
                    "send: an immediate message has no front and no data segments, and at \
                     least one RDMA WRITE (its value rides on the last)",
                ));
            }
            _ => {}
        }
        if msg.writes.len() > wire::MAX_WRITES {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "send: {} RDMA WRITEs before one message; at most {}",
                    msg.writes.len(),
                    wire::MAX_WRITES
                ),
            ));
        }
        if msg.front.len() > FRONT_MAX || msg.data.len() > MAX_SEGS {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "send: front of {} bytes and {} segments; at most {FRONT_MAX} and {MAX_SEGS}",
                    msg.front.len(),
                    msg.data.len()
                ),
            ));
        }
        let bytes: u64 = msg.data.iter().map(|p| p.len() as u64).sum();
        self.settings.limits.check_send(msg.data.len(), bytes)?;
        let mut block = msg.front.len().next_multiple_of(8);
        for p in &msg.data {
            let parts = match p {
                Payload::Chunk(_) | Payload::Registered(_) => 1,
                Payload::Received(r) => crate::msgr::messenger::buffers::runs(&r.chunks),
                Payload::Copy(_) | Payload::CopyFrom(_) if p.len() <= PAYLOAD_MAX => 1,
                Payload::Copy(_) | Payload::CopyFrom(_) => p.len().div_ceil(64 << 10),
            };
            block += wire::SEG_ENTRY + wire::PART_ENTRY * parts;
        }
        if block > PAYLOAD_MAX {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "send: the message's descriptors take {block} bytes; at most {PAYLOAD_MAX} \
                     (fewer segments, or registered memory: one descriptor per segment)"
                ),
            ));
        }
        Ok(())
    }

    pub fn alloc_chunk(&self) -> Result<TxChunk> {
        self.bufs.alloc()
    }

    /// Ends every session of shard `i` with `e` (its worker panicked: `guard.rs`).
    pub(super) fn end_shard_sessions(&self, i: usize, e: &Error) {
        let ids: Vec<u64> = self.shards[i].st.lock().sessions.keys().copied().collect();
        for id in ids {
            let _ = self.close_with(SessionId(id), Some(e.clone()));
        }
    }

    pub fn close_session(&self, s: SessionId) -> Result<()> {
        self.close_with(s, None)
    }

    /// Closes session `s`: the peer is told (Bye), held sends fail; with `reset`, ended
    /// for that error (`on_reset`) instead of closed by the application.
    pub(super) fn close_with(&self, s: SessionId, reset: Option<Error>) -> Result<()> {
        let shard = self.shard_of(s.0).ok_or_else(|| closed("close_session"))?;
        let mut st = shard.st.lock();
        let mut ev = Vec::new();
        // The sends waiting at its gate go to the machine, which fails them with the rest.
        let mut sess = self
            .remove_session(&mut st, s.0, &mut ev)
            .ok_or_else(|| closed("close_session"))?;
        match reset {
            Some(e) => sess.m.close_for(e),
            None => sess.m.close(),
        }
        sess.exec(Instant::now(), &mut ev, &mut st.closing);
        sess.link = None;
        sess.standby.clear();
        st.queued.extend(ev);
        self.forget(&sess);
        drop(st);
        shard.wake.signal();
        Ok(())
    }

    pub fn pause_receive(&self, s: SessionId, paused: bool) -> Result<()> {
        let shard = self.shard_of(s.0).ok_or_else(|| closed("pause_receive"))?;
        {
            let mut st = shard.st.lock();
            let st = &mut *st;
            let sess = st
                .sessions
                .get_mut(&s.0)
                .ok_or_else(|| closed("pause_receive"))?;
            if sess.m.receive_paused() == paused {
                return Ok(());
            }
            sess.m.set_receive_paused(paused);
            // A parked session is looked at again so that a resume reposts the window
            // and announces it without waiting for the peer's next frame.
            st.park.wake(&mut st.sessions, s.0);
        }
        shard.wake.signal();
        Ok(())
    }

    pub fn session_info(&self, s: SessionId) -> Result<SessionInfo> {
        let shard = self.shard_of(s.0).ok_or_else(|| closed("session_info"))?;
        let st = shard.st.lock();
        st.sessions.get(&s.0).map(Session::info).ok_or_else(|| {
            Error::fixed(ErrorKind::InvalidArgument, "session_info: no such session")
        })
    }

    pub fn sessions(&self) -> Vec<SessionId> {
        let mut v = Vec::new();
        for s in &self.shards {
            v.extend(s.st.lock().sessions.keys().map(|&id| SessionId(id)));
        }
        v
    }

    /// Reads `auth_keyring` again (key rotation): see
    /// [`crate::msgr::auth::AuthConfig::reload_keyring`].
    pub fn reload_keyring(&self) -> Result<()> {
        self.ctx.shared.auth.reload_keyring()
    }

    /// The authenticated entity of session `s`'s peer (None with `auth = none`, or for
    /// an unknown session).
    pub fn session_entity(&self, s: SessionId) -> Option<String> {
        self.admit.entity(s.0)
    }

    pub fn settings(&self) -> &MsgrSettings {
        &self.settings
    }

    /// The messenger's context (the C ABI registers caller memory in its cache).
    pub(crate) fn context(&self) -> &Context {
        &self.ctx
    }

    pub fn inject_fault(&self, s: SessionId, fault: Fault) -> Result<()> {
        let shard = self.shard_of(s.0).ok_or_else(|| closed("inject_fault"))?;
        let mut st = shard.st.lock();
        let link = st
            .sessions
            .get_mut(&s.0)
            .and_then(|s| s.link.as_mut().map(|(_, l)| l))
            .ok_or_else(|| Error::fixed(ErrorKind::Closed, "inject_fault: no connection now"))?;
        match fault {
            Fault::SideChannelClose => link.conn.inject_side_channel_close(),
            Fault::QpError => link.conn.inject_qp_error(),
            Fault::PartialPosts { posts } => link.inject_partial = posts,
        }
        Ok(())
    }

    pub fn udp_port(&self) -> u16 {
        self.ctx.udp_addr().port()
    }
}

/// A connect address: HOST:PORT that resolves.
fn check_addr(addr: &str) -> Result<SocketAddr> {
    std::net::ToSocketAddrs::to_socket_addrs(addr)
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("connect: address '{addr}' (expected HOST:PORT)"),
            )
        })
}
