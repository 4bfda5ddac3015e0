//! The invariants on messages: every send is delivered at most once, in order, to the
//! session it was sent to; a send that completes `Ok` was delivered (exactly once); each
//! send completes once; a send whose fate is unknown is reported (`Err`), never silently
//! dropped; what a restarted process held dies with it.

use rustc_hash::FxHashMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    Pending,
    Ok,
    Err,
    /// Its sender's process restarted before it completed.
    Died,
}

#[derive(Debug, Clone)]
pub struct Sent {
    /// The sending machine's session id and the message's sequence number.
    pub from: u64,
    pub seq: u64,
    pub fate: Fate,
    pub delivered: u32,
}

#[derive(Default)]
pub struct Ledger {
    pub sent: Vec<Sent>,
    by_key: FxHashMap<(u64, u64), usize>,
    /// Receiving session id -> the last sequence number it delivered.
    last: FxHashMap<u64, u64>,
}

impl Ledger {
    /// A send was accepted: returns the message id its frames carry.
    pub fn on_send(&mut self, from: u64, seq: u64) -> u64 {
        let id = self.sent.len();
        self.sent.push(Sent {
            from,
            seq,
            fate: Fate::Pending,
            delivered: 0,
        });
        self.by_key.insert((from, seq), id);
        id as u64
    }

    /// Session `to` (whose peer is session `peer`) delivered its message `seq`, which
    /// carried message id `body`.
    /// `lossy`: sequence numbers may skip what a failed path lost (its sender reported
    /// those sends in doubt); still in order.
    pub fn on_deliver(
        &mut self,
        to: u64,
        peer: u64,
        seq: u64,
        body: u64,
        lossy: bool,
    ) -> Result<(), String> {
        let Some(s) = self.sent.get_mut(body as usize) else {
            return Err(format!(
                "session {to:#x} delivered an unknown message {body}"
            ));
        };
        if s.from != peer || s.seq != seq {
            return Err(format!(
                "session {to:#x} (peer {peer:#x}) delivered seq {seq} carrying message {body}, \
                 sent by {:#x} as seq {}",
                s.from, s.seq
            ));
        }
        s.delivered += 1;
        if s.delivered > 1 {
            return Err(format!("message {body} (seq {seq}) delivered twice"));
        }
        let last = self.last.entry(to).or_insert(0);
        if seq != *last + 1 && !(lossy && seq > *last) {
            return Err(format!(
                "session {to:#x} delivered seq {seq} after {}: out of order",
                *last
            ));
        }
        *last = seq;
        Ok(())
    }

    /// Session `from`'s send `seq` completed.
    pub fn on_done(&mut self, from: u64, seq: u64, ok: bool) -> Result<(), String> {
        let Some(&id) = self.by_key.get(&(from, seq)) else {
            return Err(format!("completion of an unknown send {from:#x}/{seq}"));
        };
        let s = &mut self.sent[id];
        if s.fate != Fate::Pending {
            return Err(format!(
                "send {from:#x}/{seq} completed twice ({:?})",
                s.fate
            ));
        }
        if ok && s.delivered != 1 {
            return Err(format!(
                "send {from:#x}/{seq} completed Ok but was delivered {} times",
                s.delivered
            ));
        }
        s.fate = if ok { Fate::Ok } else { Fate::Err };
        Ok(())
    }

    /// The process holding session `from` died: its pending sends die with it.
    pub fn died(&mut self, from: u64) {
        for s in self.sent.iter_mut().filter(|s| s.from == from) {
            if s.fate == Fate::Pending {
                s.fate = Fate::Died;
            }
        }
    }

    pub fn pending(&self) -> usize {
        self.sent.iter().filter(|s| s.fate == Fate::Pending).count()
    }

    pub fn count(&self, f: Fate) -> usize {
        self.sent.iter().filter(|s| s.fate == f).count()
    }
}
