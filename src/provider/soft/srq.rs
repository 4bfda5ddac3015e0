//! Shared receive queues: receive WQEs that several QPs draw from. The RC engine has one
//! receive queue per QP; a QP attached to an SRQ ([`SoftQp::attach_verbs`]) moves one WQE
//! from here into its own queue when a packet that needs one arrives and its queue is
//! empty (`rc::Qp::wants_recv_wqe`), so the engine's RNR logic applies unchanged: an
//! empty SRQ means an RNR NAK.
//!
//! The limit event (verbs' SRQ_LIMIT_REACHED): once armed with a non-zero limit, the first
//! time the WQEs queued fall below it the hook runs and the limit is disarmed (0), as
//! `ibv_modify_srq(3)` says.
//!
//! [`SoftQp::attach_verbs`]: super::qp::SoftQp::attach_verbs

use crate::error::{Error, ErrorKind, Result};
use crate::rc::memory::SgeList;
use parking_lot::Mutex;
use smallvec::SmallVec;
use std::collections::VecDeque;
use std::sync::OnceLock;

use super::mr::MrTable;

/// One receive WQE: the caller's cookie (its wr_id) and where to scatter.
pub type SrqWqe = (u64, SgeList);

#[derive(Debug)]
struct State {
    q: VecDeque<SrqWqe>,
    max_wr: u32,
    /// 0 = disarmed.
    limit: u32,
}

/// Runs when the limit is reached (no lock held).
struct LimitHook(Box<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for LimitHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LimitHook")
    }
}

/// A shared receive queue of the soft provider.
#[derive(Debug)]
pub struct SoftSrq {
    state: Mutex<State>,
    max_sge: u32,
    hook: OnceLock<LimitHook>,
}

fn invalid(msg: String) -> Error {
    Error::new(ErrorKind::InvalidArgument, msg)
}

impl SoftSrq {
    /// An SRQ of `max_wr` WQEs of at most `max_sge` SGEs, armed at `limit` (0: not).
    pub fn new(max_wr: u32, max_sge: u32, limit: u32) -> Result<SoftSrq> {
        if max_wr == 0 || max_sge == 0 {
            return Err(invalid(format!(
                "create_srq: max_wr {max_wr} and max_sge {max_sge} must be at least 1"
            )));
        }
        if limit > max_wr {
            return Err(invalid(format!(
                "create_srq: srq_limit {limit} exceeds max_wr {max_wr}"
            )));
        }
        Ok(SoftSrq {
            state: Mutex::new(State {
                q: VecDeque::with_capacity(max_wr.min(4096) as usize),
                max_wr,
                limit,
            }),
            max_sge,
            hook: OnceLock::new(),
        })
    }

    /// What runs when the limit is reached (set once).
    pub fn set_limit_hook(&self, hook: Box<dyn Fn() + Send + Sync>) {
        let _ = self.hook.set(LimitHook(hook));
    }

    /// Posts WQEs in order, holding the regions their SGEs name (`mrs`) until they
    /// complete (or the SRQ is drained). Returns how many were posted and why the next one
    /// was refused: Full with `max_wr` queued, InvalidArgument with too many SGEs.
    pub fn post_recv(&self, mrs: &MrTable, wrs: &[SrqWqe]) -> (usize, Option<Error>) {
        let mut s = self.state.lock();
        for (i, (cookie, sges)) in wrs.iter().enumerate() {
            if s.q.len() >= s.max_wr as usize {
                return (
                    i,
                    Some(Error::new(
                        ErrorKind::Full,
                        format!(
                            "post_srq_recv: shared receive queue full ({} WQEs = max_wr)",
                            s.max_wr
                        ),
                    )),
                );
            }
            if sges.len() > self.max_sge as usize {
                return (
                    i,
                    Some(invalid(format!(
                        "post_srq_recv: {} SGEs exceed max_sge {}",
                        sges.len(),
                        self.max_sge
                    ))),
                );
            }
            let lkeys: SmallVec<[u32; 2]> = sges.iter().map(|s| s.lkey).collect();
            mrs.hold(&lkeys, true);
            s.q.push_back((*cookie, sges.clone()));
        }
        (wrs.len(), None)
    }

    /// Takes the oldest WQE (its regions stay held: the taker releases them when it
    /// completes). Runs the limit hook if this took the queue below an armed limit.
    pub fn take(&self) -> Option<SrqWqe> {
        let (wqe, fire) = {
            let mut s = self.state.lock();
            let wqe = s.q.pop_front()?;
            let fire = s.limit > 0 && (s.q.len() as u32) < s.limit;
            if fire {
                s.limit = 0;
            }
            (wqe, fire)
        };
        if fire && let Some(h) = self.hook.get() {
            (h.0)();
        }
        Some(wqe)
    }

    /// `ibv_modify_srq`: a new `max_wr` (not below the WQEs queued) and/or limit (at most
    /// `max_wr`; 0 disarms). All or nothing. Arming at a limit the queue is already
    /// below fires at once, as a NIC's SRQ does on its next check.
    pub fn modify(&self, max_wr: Option<u32>, limit: Option<u32>) -> Result<()> {
        let fire = {
            let mut s = self.state.lock();
            let new_max = max_wr.unwrap_or(s.max_wr);
            let new_limit = limit.unwrap_or(s.limit);
            if new_max == 0 || (new_max as usize) < s.q.len() {
                return Err(invalid(format!(
                    "modify_srq: max_wr {new_max} is below the {} WQEs queued (or 0)",
                    s.q.len()
                )));
            }
            if new_limit > new_max {
                return Err(invalid(format!(
                    "modify_srq: srq_limit {new_limit} exceeds max_wr {new_max}"
                )));
            }
            s.max_wr = new_max;
            s.limit = new_limit;
            let fire = limit.is_some() && new_limit > 0 && (s.q.len() as u32) < new_limit;
            if fire {
                s.limit = 0;
            }
            fire
        };
        if fire && let Some(h) = self.hook.get() {
            (h.0)();
        }
        Ok(())
    }

    /// (max_wr, max_sge, limit).
    pub fn attr(&self) -> (u32, u32, u32) {
        let s = self.state.lock();
        (s.max_wr, self.max_sge, s.limit)
    }

    /// WQEs queued.
    pub fn len(&self) -> usize {
        self.state.lock().q.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every queued WQE (destroy), releasing the regions they held.
    pub fn drain(&self, mrs: &MrTable) {
        let drained: Vec<SrqWqe> = self.state.lock().q.drain(..).collect();
        for (_, sges) in drained {
            let lkeys: SmallVec<[u32; 2]> = sges.iter().map(|s| s.lkey).collect();
            mrs.hold(&lkeys, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn bounded_fifo_with_a_one_shot_limit_event() {
        let mrs = MrTable::default();
        let srq = SoftSrq::new(4, 1, 2).unwrap();
        let fired = Arc::new(AtomicU32::new(0));
        let f = Arc::clone(&fired);
        srq.set_limit_hook(Box::new(move || {
            f.fetch_add(1, Ordering::Relaxed);
        }));
        let wrs: Vec<SrqWqe> = (0..5).map(|i| (i, SgeList::new())).collect();
        let (n, e) = srq.post_recv(&mrs, &wrs);
        assert_eq!((n, e.map(|e| e.kind())), (4, Some(ErrorKind::Full)));
        assert_eq!(srq.take().unwrap().0, 0);
        assert_eq!(srq.take().unwrap().0, 1);
        assert_eq!(fired.load(Ordering::Relaxed), 0, "2 left: not below 2");
        assert_eq!(srq.take().unwrap().0, 2);
        assert_eq!(fired.load(Ordering::Relaxed), 1);
        assert_eq!(srq.attr().2, 0, "disarmed");
        srq.take();
        assert!(srq.take().is_none());
        assert_eq!(fired.load(Ordering::Relaxed), 1, "once per arming");
        // Re-arming below the queued count fires at once.
        srq.modify(None, Some(1)).unwrap();
        assert_eq!(fired.load(Ordering::Relaxed), 2);
        let e = srq.modify(Some(2), Some(3)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        let big: Vec<SrqWqe> = vec![(
            9,
            SgeList::from_vec(vec![
                crate::rc::Sge {
                    addr: 0,
                    length: 0,
                    lkey: 0
                };
                2
            ]),
        )];
        let (n, e) = srq.post_recv(&mrs, &big);
        assert_eq!(
            (n, e.map(|e| e.kind())),
            (0, Some(ErrorKind::InvalidArgument))
        );
    }
}
