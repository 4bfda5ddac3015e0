//! Remote access to the messenger's memory, scoped to one peer (issue 27: buffers that
//! carried one session's data are not readable or writable by another session).
//!
//! With `msgr_scoped_rkeys` (soft provider, and verbs devices with type-2 windows), the
//! pools and the buffers the messenger sends from are registered without any remote right,
//! so their rkeys open nothing. What a peer must reach remotely gets a memory window bound
//! to the local QP of that peer's link, over exactly those bytes (`provider/windows.rs`:
//! the soft provider's window table, or `IBV_WR_BIND_MW` on the verbs QP, posted before
//! the SEND that advertises the rkey):
//! - a rendezvous segment: REMOTE_READ over each part, bound when the message is queued on
//!   a link, invalidated when the peer acknowledges it (it has READ everything by then), or
//!   when the link ends (a replay binds new windows on the next link);
//! - a receive granted for eager writes (`msgr_eager_write`): REMOTE_WRITE over its data
//!   chunk, bound when the grant is announced, invalidated when the receive completes (the
//!   chunk is then this side's to deliver or reuse) or the link ends.
//!
//! Invalidation is synchronous (no access is in progress when it returns: the soft table's
//! reader count, or the verbs `IBV_WR_LOCAL_INV`'s completion, waited for; a window whose
//! QP is gone is deallocated instead), so a chunk is never returned to the pool, and so
//! never handed to another session, while a window over it is bound.

use crate::error::Result;
use crate::mem::pool::Chunk;
use crate::msgr::Connection;
use crate::provider::windows::QpWindows;
use crate::rc::verbs::access;
use smallvec::SmallVec;
use std::sync::Arc;

use super::buffers::TxSeg;

/// Binds windows for the peer of one link (its local QP).
pub struct Scope {
    win: Arc<dyn QpWindows>,
}

impl Scope {
    /// The scope of `conn`'s peer, when its context scopes rkeys (None: the memory's own
    /// rkeys are given out, as registered).
    pub fn for_conn(conn: &Connection) -> Option<Scope> {
        let ctx = conn.context();
        if !ctx.scoped_rkeys() {
            return None;
        }
        Some(Scope {
            win: ctx.shared.dev.windows(conn.provider_qp())?,
        })
    }

    /// Binds a window over a receive's data chunk that the peer may RDMA WRITE (its
    /// grant); returns its rkey. End it with [`Scope::end`].
    pub fn grant(&self, c: &Chunk) -> Result<u32> {
        self.win
            .bind(c.lkey, c.addr_u64(), c.len as u64, access::REMOTE_WRITE)
    }

    /// Ends a window of [`Scope::grant`] (0: none). Returns at once when it was bound;
    /// no remote access through it is in progress then.
    pub fn end(&self, rkey: u32) {
        if rkey != 0 {
            self.win.invalidate(rkey);
        }
    }

    /// Binds a READ window over each part of `seg` and puts its rkey in the part (what the
    /// descriptor block then tells the peer). The windows of an earlier exposure end first.
    pub fn expose(&self, seg: &mut TxSeg) -> Result<()> {
        seg.windows.clear();
        seg.windows.win = Some(Arc::clone(&self.win));
        for (p, &lkey) in seg.parts.iter_mut().zip(&seg.lkeys) {
            let k = self
                .win
                .bind(lkey, p.addr, u64::from(p.len), access::REMOTE_READ)?;
            seg.windows.keys.push(k);
            p.rkey = k;
        }
        Ok(())
    }
}

/// Exposes every segment of a rendezvous message to the link's peer (nothing without a
/// scope: the parts keep the rkeys of their registrations).
pub fn expose_all(scope: Option<&Scope>, segs: &mut [TxSeg]) -> Result<()> {
    if let Some(s) = scope {
        for seg in segs {
            s.expose(seg)?;
        }
    }
    Ok(())
}

/// The windows a prepared segment is exposed through; invalidated when dropped (before
/// the segment's memory is released: `TxSeg` declares it first).
#[derive(Default)]
pub struct Windows {
    win: Option<Arc<dyn QpWindows>>,
    keys: SmallVec<[u32; 2]>,
}

impl Windows {
    /// Ends every window (the link they were bound for is gone, or they are rebound).
    pub fn clear(&mut self) {
        if let Some(w) = &self.win {
            for k in self.keys.drain(..) {
                w.invalidate(k);
            }
        }
    }
}

impl Drop for Windows {
    fn drop(&mut self) {
        self.clear();
    }
}
