//! The memory-region bookkeeping both providers keep: a registration's extent, keys and
//! access with the count of work requests in flight that name it ([`Registration`]), and
//! the table of registrations by lkey ([`Regions`]): lookup, the deregistration rule (not
//! while work requests name the region: a NIC would DMA into freed memory), the holds
//! posts and completions take, and the regions a handshake exposes.
//!
//! What stays with each provider: how keys are made (the soft provider draws random ones
//! and also looks regions up by rkey; a NIC returns them from `ibv_reg_mr`), the lock
//! around the table (the soft one also guards the page pins and is read recursively, see
//! `soft/mr.rs`), and the provider's own state per region, `P` (soft: the memory windows
//! bound in it; verbs: its `ibv_mr`).

use crate::error::{Error, ErrorKind, Result};
use crate::mem::MrKeys;
use crate::rc::verbs::access;
use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

/// One registration: what both providers keep, and the provider's own state (`own`).
#[derive(Debug)]
pub struct Registration<P> {
    pub addr: u64,
    pub len: u64,
    pub access: u32,
    pub lkey: u32,
    pub rkey: u32,
    /// Work requests in flight that name this region through an SGE.
    inflight: AtomicU32,
    /// The provider's own state for the region.
    pub(crate) own: P,
}

impl<P> Registration<P> {
    /// A registration of `[addr, addr + len)` with `access` and its keys; no work request
    /// names it yet.
    pub(crate) fn new(addr: u64, len: u64, access: u32, lkey: u32, rkey: u32, own: P) -> Self {
        Registration {
            addr,
            len,
            access,
            lkey,
            rkey,
            inflight: AtomicU32::new(0),
            own,
        }
    }

    /// The keys a registrar returns.
    pub(crate) fn keys(&self) -> MrKeys {
        MrKeys {
            lkey: self.lkey,
            rkey: self.rkey,
        }
    }

    /// Work requests in flight that name the region now.
    pub(crate) fn in_flight(&self) -> u32 {
        self.inflight.load(Ordering::Acquire)
    }

    /// Whether `[addr, addr + len)` lies inside the region (false when it wraps).
    pub(crate) fn covers(&self, addr: u64, len: u64) -> bool {
        addr.checked_add(len)
            .is_some_and(|end| addr >= self.addr && end <= self.addr + self.len)
    }
}

/// The registrations of one device by lkey. Not locked: each provider keeps it under its
/// own lock.
#[derive(Debug)]
pub(crate) struct Regions<P> {
    by_lkey: HashMap<u32, Arc<Registration<P>>>,
}

impl<P> Default for Regions<P> {
    fn default() -> Self {
        Regions {
            by_lkey: HashMap::default(),
        }
    }
}

impl<P> Regions<P> {
    pub fn insert(&mut self, r: Arc<Registration<P>>) {
        self.by_lkey.insert(r.lkey, r);
    }

    pub fn get(&self, lkey: u32) -> Option<&Arc<Registration<P>>> {
        self.by_lkey.get(&lkey)
    }

    pub fn contains(&self, lkey: u32) -> bool {
        self.by_lkey.contains_key(&lkey)
    }

    pub fn remove(&mut self, lkey: u32) -> Option<Arc<Registration<P>>> {
        self.by_lkey.remove(&lkey)
    }

    /// Every registration, taken out of the table (the verbs provider's drop).
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    pub fn drain(&mut self) -> impl Iterator<Item = Arc<Registration<P>>> + '_ {
        self.by_lkey.drain().map(|(_, r)| r)
    }

    /// The region with `lkey`; InvalidArgument when there is none.
    pub fn find(&self, lkey: u32) -> Result<&Arc<Registration<P>>> {
        self.by_lkey.get(&lkey).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("no memory region with lkey {lkey:#x}"),
            )
        })
    }

    /// The region with `lkey` if it may be deregistered: InvalidArgument when there is
    /// none, `Busy` while work requests name it.
    pub fn idle(&self, lkey: u32) -> Result<&Arc<Registration<P>>> {
        let r = self.find(lkey)?;
        let n = r.in_flight();
        if n > 0 {
            return Err(Error::new(
                ErrorKind::Busy,
                format!(
                    "memory region lkey {lkey:#x} is named by {n} work request(s) in flight: poll their completions first"
                ),
            ));
        }
        Ok(r)
    }

    /// Marks the regions of `lkeys` as named by one more (`up`) or one fewer work request.
    /// Unknown keys are skipped (a work request naming one fails on its own).
    pub fn hold(&self, lkeys: &[u32], up: bool) {
        for k in lkeys {
            if let Some(r) = self.by_lkey.get(k) {
                if up {
                    r.inflight.fetch_add(1, Ordering::AcqRel);
                } else {
                    r.inflight.fetch_sub(1, Ordering::AcqRel);
                }
            }
        }
    }

    /// Regions with remote access (READ or WRITE), by address: what a handshake lists.
    pub fn exposed(&self) -> Vec<Arc<Registration<P>>> {
        let mut v: Vec<_> = self
            .by_lkey
            .values()
            .filter(|r| r.access & (access::REMOTE_READ | access::REMOTE_WRITE) != 0)
            .cloned()
            .collect();
        v.sort_by_key(|r| r.addr);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Regions<()> {
        let mut t = Regions::default();
        t.insert(Arc::new(Registration::new(
            0x2000,
            64,
            access::REMOTE_READ,
            7,
            70,
            (),
        )));
        t.insert(Arc::new(Registration::new(
            0x1000,
            64,
            access::LOCAL_WRITE,
            8,
            80,
            (),
        )));
        t.insert(Arc::new(Registration::new(
            0x0800,
            64,
            access::LOCAL_WRITE | access::REMOTE_WRITE,
            9,
            90,
            (),
        )));
        t
    }

    #[test]
    fn a_region_named_by_work_requests_is_busy_until_they_complete() {
        let t = table();
        assert_eq!(t.find(5).unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!(t.idle(5).unwrap_err().kind(), ErrorKind::InvalidArgument);
        t.hold(&[7, 7, 5], true);
        assert_eq!(t.get(7).unwrap().in_flight(), 2);
        let e = t.idle(7).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Busy);
        assert!(e.message().contains("named by 2 work request(s)"), "{e}");
        t.hold(&[7, 7], false);
        assert_eq!(t.idle(7).unwrap().rkey, 70);
    }

    #[test]
    fn exposed_lists_remote_regions_by_address_and_covers_checks_ranges() {
        let mut t = table();
        let v: Vec<u32> = t.exposed().iter().map(|r| r.lkey).collect();
        assert_eq!(v, [9, 7]);
        let r = t.get(8).unwrap();
        assert!(r.covers(0x1000, 64) && r.covers(0x1010, 0));
        assert!(!r.covers(0x1001, 64) && !r.covers(0x0fff, 1));
        assert!(!r.covers(u64::MAX, 2), "a wrapping range");
        assert_eq!((r.keys().lkey, r.keys().rkey), (8, 80));
        assert!(t.remove(8).is_some() && !t.contains(8));
        assert_eq!(t.drain().count(), 2);
        assert!(t.exposed().is_empty());
    }
}
