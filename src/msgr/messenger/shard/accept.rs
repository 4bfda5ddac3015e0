//! The accepting side's admission: connections whose setup finished are taken from the
//! listener (within the pending bound) and wait, as links, for their hello until a deadline;
//! a hello hands the link to the session it names (`peers.rs`), on its shard.

use super::*;

impl Core {
    /// Takes the connections whose setup finished (non-blocking). Whether it found any.
    pub(super) fn accept_new(&self, st: &mut ShardState, now: Instant) -> bool {
        let g = self.listener.lock();
        let Some(l) = g.as_ref() else { return false };
        let mut found = false;
        for _ in 0..16 {
            let r = l.try_accept();
            let slots = take_hooked(&self.bufs, r.as_ref().ok().and_then(Option::as_ref));
            match r {
                Ok(None) => break,
                Ok(Some(conn)) => {
                    found = true;
                    let Some(slots) = slots else { continue };
                    if !self.admit.try_pending(conn.peer()) {
                        drop(conn);
                        release_slots(&self.bufs, slots);
                        continue;
                    }
                    let (link, credits) = self.link_from(conn, slots);
                    st.pending.push(Pending {
                        link,
                        credits,
                        deadline: now + HELLO_DEADLINE,
                    });
                }
                Err(e) => {
                    log::debug!(target: "rdmx::msgr", "messenger: accept: {e}");
                    found = true; // others may have ended too: look again next pass
                    break;
                }
            }
        }
        found
    }

    /// Accepted links waiting for their hello.
    pub(super) fn drive_pending(
        &self,
        shard: usize,
        st: &mut ShardState,
        now: Instant,
        ev: &mut Vec<Event>,
        moves: &mut Vec<(usize, Link, Credits, Header)>,
    ) {
        let pending = std::mem::take(&mut st.pending);
        // The shard's scratch list of link events, given back at the end.
        let mut out = std::mem::take(&mut st.link_events);
        for mut p in pending {
            let polled = p.link.poll(POLL_BUDGET, POLL_BUDGET, &mut out);
            let mut hello = None;
            for e in out.drain(..) {
                if !matches!(e, LinkEvent::ReadDone) {
                    p.credits.on_receive();
                }
                match e {
                    LinkEvent::Recv(r) if hello.is_none() && r.h.kind() == Some(Kind::Hello) => {
                        p.credits.on_grant(r.h.credits);
                        hello = Some(r.h);
                    }
                    LinkEvent::Recv(_) | LinkEvent::Imm(_) => {
                        self.malformed.fetch_add(1, Ordering::Relaxed);
                        self.discard(e);
                    }
                    LinkEvent::ReadDone => {}
                }
            }
            if let Some(h) = hello {
                self.admit.pending_done();
                let owner = self.by_peer.lock().get(&h.aux).copied();
                match owner {
                    Some(id) if (id & 0xff) as usize != shard => {
                        moves.push(((id & 0xff) as usize, p.link, p.credits, h));
                    }
                    _ => self.attach_incoming(shard, st, p.link, p.credits, &h, now, ev),
                }
                continue;
            }
            if polled.is_err() || now >= p.deadline {
                if let Err(e) = polled
                    && e.kind() == ErrorKind::InvalidValue
                {
                    self.malformed.fetch_add(1, Ordering::Relaxed);
                }
                self.admit.pending_done();
                continue; // dropped: closes the connection
            }
            if let Ok(n) = p.link.replenish(p.credits.deficit()) {
                p.credits.on_posted(n);
            }
            st.pending.push(p);
        }
        st.link_events = out;
    }

    /// Returns the payload chunk of an event nobody will handle.
    pub(super) fn discard(&self, e: LinkEvent) {
        if let LinkEvent::Recv(r) = e
            && let Some(c) = r.data
        {
            let _ = self.bufs.data.put(c);
        }
    }
}
