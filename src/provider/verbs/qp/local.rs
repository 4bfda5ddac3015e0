//! Memory window binds and local invalidates on a verbs QP, for the messenger's scoped
//! rkeys (`provider/verbs/window.rs`): `IBV_WR_BIND_MW` posted on the QP of the peer the
//! window is for, before the SEND that advertises its rkey (the send queue executes in
//! order: the window is bound before the peer can learn the key), and `IBV_WR_LOCAL_INV`
//! waited for until its completion, so that the caller returns the memory to its pool
//! only when no access through the window can follow.
//!
//! Both take send-queue slots like the messenger's own WRs (marked `local`); their
//! completions never reach the messenger: `convert` drops them (a failed bind moves the
//! QP to ERR, which the messenger learns from its own WRs' flushes). While an
//! invalidation waits, the CQs are polled into the stash, which the messenger's next
//! poll returns first, in order.

use super::{CHAIN, EMPTY_WC, VerbsQp, errno_error};
use crate::error::{Error, ErrorKind, Result};
use crate::rc::verbs::send_flags;
use rdma_sys as ib;
use std::time::{Duration, Instant};

/// `IBV_WR_LOCAL_INV`, `IBV_WR_BIND_MW` (`enum ibv_wr_opcode`).
const WR_LOCAL_INV: u32 = 7;
const WR_BIND_MW: u32 = 8;
/// [`super::Slot::local`] of a bind and of an invalidate.
pub(super) const BIND: u8 = 1;
pub(super) const INV: u8 = 2;
/// Longest an invalidation is waited for; past it the window is deallocated instead
/// (which ends it too: `ibv_dealloc_mw` of a bound window).
const INV_WAIT: Duration = Duration::from_secs(5);

impl VerbsQp {
    /// Posts `IBV_WR_BIND_MW` of the type-2 window `mw` with key `rkey` over `[addr, addr
    /// + len)` of `mr` with `rights` (unsignaled unless the signal interval asks).
    pub(crate) fn post_bind_mw(
        &self,
        mw: *mut ib::ibv_mw,
        rkey: u32,
        mr: *mut ib::ibv_mr,
        addr: u64,
        len: u64,
        rights: u32,
    ) -> Result<()> {
        // SAFETY: ibv_send_wr is plain C data; all-zero is valid.
        let mut w: ib::ibv_send_wr = unsafe { std::mem::zeroed() };
        w.opcode = WR_BIND_MW;
        w.bind_mw_tso_union.bind_mw = ib::bind_mw_t {
            mw,
            rkey,
            bind_info: ib::ibv_mw_bind_info {
                mr,
                addr,
                length: len,
                mw_access_flags: rights,
            },
        };
        self.post_local_wr(w, BIND).map(|_| ())
    }

    /// Posts `IBV_WR_LOCAL_INV` of `rkey` and waits (bounded) until it completes; true when
    /// it succeeded (the window is unbound and may be bound again), false otherwise (the
    /// QP is in error, or the wait ran out): the caller then deallocates the window.
    pub(crate) fn invalidate_sync(&self, rkey: u32) -> bool {
        // SAFETY: plain C data.
        let mut w: ib::ibv_send_wr = unsafe { std::mem::zeroed() };
        w.opcode = WR_LOCAL_INV;
        w.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
        let seq = match self.post_local_wr(w, INV) {
            Ok(s) => s,
            Err(e) => {
                log::debug!(target: "rdmx::verbs", "QP {:#x}: LOCAL_INV of {rkey:#x} not posted: {e}", self.qpn);
                return false;
            }
        };
        let start = Instant::now();
        loop {
            if let Some(ok) = self.local_result(seq) {
                return ok;
            }
            if start.elapsed() > INV_WAIT {
                log::warn!(
                    target: "rdmx::verbs",
                    "QP {:#x}: LOCAL_INV of window {rkey:#x} did not complete within {INV_WAIT:?}: the window is deallocated instead",
                    self.qpn
                );
                return false;
            }
            self.stash_more();
            std::thread::yield_now();
        }
    }

    /// Posts one local WR of `kind` in its own chain (an invalidate is signaled: its
    /// waiter needs the completion); its send-queue sequence number.
    fn post_local_wr(&self, mut w: ib::ibv_send_wr, kind: u8) -> Result<u64> {
        let signal = kind == INV;
        let mut sq = self.sq.lock();
        if sq.room() == 0 {
            return Err(Error::new(
                ErrorKind::Full,
                format!(
                    "memory window: the send queue is full ({} WRs outstanding)",
                    sq.cap()
                ),
            ));
        }
        let signaled = signal || sq.run + 1 >= self.knobs.signal_interval;
        let run = sq.run;
        sq.run = if signaled { 0 } else { sq.run + 1 };
        let seq = sq.tail;
        let slot = sq.slot(seq);
        slot.cookie = 0;
        slot.opcode = None;
        slot.local = kind;
        slot.caller_signaled = false;
        slot.lkeys.clear();
        sq.tail += 1;
        w.wr_id = seq;
        w.send_flags = if signaled { send_flags::SIGNALED } else { 0 };
        let mut bad: *mut ib::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: a live QP; one WR with no SGE, alive for the call (the provider copies
        // it); the window and region pointers are live objects of this QP's PD.
        let rc = unsafe { ib::ibv_post_send(self.raw.qp, &mut w, &mut bad) };
        if rc != 0 {
            sq.tail = seq;
            sq.run = run;
            sq.slot(seq).local = 0;
            return Err(errno_error("ibv_post_send (memory window)", rc));
        }
        Ok(seq)
    }

    /// The outcome of local WR `seq` once its completion was taken (None before).
    fn local_result(&self, seq: u64) -> Option<bool> {
        let mut r = self.local_done.lock();
        if let Some(i) = r.iter().position(|&(s, _)| s == seq) {
            return Some(r.swap_remove(i).1);
        }
        // Retired without a completion of its own (cannot happen: it is signaled), or by
        // a reset of the ring (the QP is gone): not known to have succeeded.
        (self.sq.lock().head > seq).then_some(false)
    }

    /// Polls the CQs into the stash (beyond its usual bound: the messenger is not polling
    /// while its thread waits here), so a local completion is seen.
    fn stash_more(&self) {
        let mut st = self.stash.lock();
        let mut tmp = [EMPTY_WC; CHAIN];
        let k = self.poll_cqs(&mut tmp);
        st.extend_from_slice(&tmp[..k]);
        if !st.is_empty() {
            self.wake.signal();
        }
    }
}
