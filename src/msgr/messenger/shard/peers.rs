//! An accepted link's hello matched to a session: by the peer's session id (resume, or a
//! new session within the admission bounds) and by the connecting messenger's incarnation
//! (another incarnation at a known address restarted: its old sessions are reset).

use super::*;

impl Core {
    /// An accepted link said hello: resume its session, or make a new one.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attach_incoming(
        &self,
        shard: usize,
        st: &mut ShardState,
        mut link: Link,
        credits: Credits,
        h: &Header,
        now: Instant,
        ev: &mut Vec<Event>,
    ) {
        // The connecting messenger's identity: another incarnation at the address of a
        // known one means it restarted (two live processes cannot listen on one address):
        // the sessions of the old one are reset here, at once, not after the reconnect
        // timeout, and before the new session's on_connect.
        let auth_entity = link.conn.peer_entity().map(str::to_string);
        let ip = link.conn.peer().ip();
        let known = self.by_peer.lock().get(&h.aux).copied();
        if let Some(id) = known
            && st.sessions.contains_key(&id)
            && !self.admit.may_resume(id, auth_entity.as_deref(), ip)
        {
            if h.has(flags::JOIN) {
                self.admit.refuse_join();
            }
            // A link naming another entity's session: it gets nothing of it, and its
            // incarnation resets nobody.
            return;
        }
        let entity = (h.seq != 0 && h.msg_type != 0)
            .then(|| (SocketAddr::new(link.conn.peer().ip(), h.msg_type), h.seq));
        if let Some((addr, inc)) = entity {
            let prev = self
                .entities
                .lock()
                .insert((addr, auth_entity.clone()), inc);
            if prev.is_some_and(|p| p != inc) {
                self.restarts.fetch_add(1, Ordering::AcqRel);
                self.tell_incarnations(st, now, ev);
                for (j, other) in self.shards.iter().enumerate() {
                    if j != shard {
                        other.wake.signal();
                    }
                }
            }
        }
        let open = |id: &u64| {
            st.sessions
                .get(id)
                .is_some_and(|s| s.m.state != SessionState::Closed)
        };
        if h.has(flags::JOIN) {
            // Another path of an open session (the entity check above holds for it too).
            let Some(id) = known.filter(|id| open(id)) else {
                self.admit.refuse_join();
                let _ = link.send_bare(&mut Header::new(Kind::Hello));
                st.closing.push((link, now + CLOSE_DRAIN));
                return;
            };
            let g = &mut *st;
            let Some(sess) = g.sessions.get_mut(&id) else {
                return;
            };
            if !join_mac_ok(sess, &link, h) {
                self.admit.refuse_join();
                log::warn!(
                    target: "rdmx::msgr",
                    "messenger: refused a path-join of session {id:#x} from {}: its MAC is \
                     wrong (not the session's peer)",
                    link.conn.peer()
                );
                let _ = link.send_bare(&mut Header::new(Kind::Hello));
                g.closing.push((link, now + CLOSE_DRAIN));
                return;
            }
            self.hook_link(&mut link, id);
            let lid = sess.m.join_link(now, credits, h);
            sess.standby.push((lid, link));
            sess.exec(now, ev, &mut g.closing);
            sess.flush_standby(now, ev, &mut g.closing);
            sess.sync_gate(ev);
            g.park.wake(&mut g.sessions, id);
            return;
        }
        let id = match known {
            // (One that ended and is not removed yet stays ended: its peer is told so.)
            Some(id) if open(&id) => id,
            _ if h.aux2 != 0 || h.aux == 0 => {
                // The peer resumes a session we do not have (we restarted, or it ended
                // here): say so (hello with no identity) and let the link go.
                let _ = link.send_bare(&mut Header::new(Kind::Hello));
                st.closing.push((link, now + CLOSE_DRAIN));
                return;
            }
            _ => {
                // A new session lives on the shard that accepted it.
                let id = self.new_id(shard);
                if !self.admit.try_session(id, auth_entity.as_deref(), ip) {
                    // Over a bound: said as for an unknown session (the peer resets it).
                    let _ = link.send_bare(&mut Header::new(Kind::Hello));
                    st.closing.push((link, now + CLOSE_DRAIN));
                    return;
                }
                let policy = if h.has(flags::LOSSY) {
                    Policy::Lossy
                } else {
                    Policy::Lossless
                };
                let mut s = Session::new(Machine::new(self.rules, id, policy, true, now));
                s.peer = Some(link.conn.peer());
                self.insert_session(st, s);
                self.by_peer.lock().insert(h.aux, id);
                id
            }
        };
        let g = &mut *st;
        let Some(sess) = g.sessions.get_mut(&id) else {
            return;
        };
        if entity.is_some() {
            sess.m.peer_entity = entity;
        }
        // The peer reconnected before this side noticed the old link died: the machine
        // faults it (`accept_link`), the link goes now.
        if let Some((_, mut old)) = sess.link.take() {
            sess.m.counters.rnr_naks += old.take_rnr();
            drop(old);
        }
        // A resuming hello: the connecting side has no other path up (the machine closes
        // their links in `accept_link`).
        self.hook_link(&mut link, id);
        let lid = sess.m.accept_link(now, credits, h);
        sess.link = Some((lid, link));
        sess.note_path_secret();
        sess.note_peer_limits();
        sess.exec(now, ev, &mut g.closing);
        sess.flush(now, ev, &mut g.closing);
        // Its hello may have acknowledged sends (room for a refused one).
        sess.sync_gate(ev);
        // A parked session whose peer reconnected first.
        g.park.wake(&mut g.sessions, id);
    }

    /// Tells this shard's accepted sessions the latest incarnation at their peer
    /// messenger's address: the machine of a session whose peer was succeeded by another
    /// incarnation resets it (it restarted: what it had not acknowledged is lost).
    pub(super) fn tell_incarnations(&self, st: &mut ShardState, now: Instant, ev: &mut Vec<Event>) {
        st.restarts_seen = self.restarts.load(Ordering::Acquire);
        let latest = self.entities.lock();
        let g = &mut *st;
        for sess in g.sessions.values_mut() {
            let Some((addr, _)) = sess.m.peer_entity else {
                continue;
            };
            let Some(&inc) = latest.get(&(addr, self.admit.entity(sess.id()))) else {
                continue;
            };
            if sess.m.on_peer_incarnation(addr, inc) {
                sess.exec(now, ev, &mut g.closing);
            }
        }
    }
}

/// Whether path-join hello `h` on `link` carries the session's MAC: with auth (the link
/// has a handshake secret), the session must have a path secret and the MAC must verify
/// (`auth::pathjoin`); without auth there is nothing to check (docs/security.md).
fn join_mac_ok(sess: &Session, link: &Link, h: &Header) -> bool {
    use crate::msgr::auth::pathjoin::{Role, verify};
    match (sess.path_secret.as_deref(), link.conn.binding()) {
        (_, None) => true,
        (Some(s), Some(b)) => verify(s, Role::Join, h.aux, h.aux2, h.ack, b, h.aux3),
        (None, Some(_)) => false,
    }
}
