//! Registered memory as both providers describe it: what they check before registering (so
//! that soft and verbs refuse the same inputs with the same words), a registration's
//! [`MrInfo`], and the [`Region`] a hello exposes to the peer.

use crate::error::{Error, ErrorKind, Result};
use crate::rc::verbs::access;

/// The access bits rdmx knows (`ibv_access_flags`: LOCAL_WRITE, REMOTE_WRITE, REMOTE_READ,
/// REMOTE_ATOMIC).
pub(crate) const KNOWN_ACCESS: u32 =
    access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ | access::REMOTE_ATOMIC;

/// Checks a registration's arguments: a non-NULL address (unless empty), a range that does
/// not wrap, known access bits, and LOCAL_WRITE with remote write or atomic access (as
/// `ibv_reg_mr(3)` requires).
pub(crate) fn check_region(addr: *const u8, len: usize, access_flags: u32) -> Result<()> {
    if addr.is_null() && len > 0 {
        return Err(Error::new(ErrorKind::InvalidArgument, "addr is NULL"));
    }
    if (addr as u64).checked_add(len as u64).is_none() {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("region {addr:p} + {len} bytes wraps the address space"),
        ));
    }
    if access_flags & !KNOWN_ACCESS != 0 {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "access: unknown bits {:#x}: allowed LOCAL_WRITE (1), REMOTE_WRITE (2), REMOTE_READ (4), REMOTE_ATOMIC (8)",
                access_flags & !KNOWN_ACCESS
            ),
        ));
    }
    if access_flags & (access::REMOTE_WRITE | access::REMOTE_ATOMIC) != 0
        && access_flags & access::LOCAL_WRITE == 0
    {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            "access: REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE (as ibv_reg_mr)",
        ));
    }
    Ok(())
}

/// Memory the sender exposes for one-sided access by the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Region {
    /// Virtual address the peer puts in its RETH.
    pub addr: u64,
    /// Length in bytes; `addr + len` must not overflow.
    pub len: u64,
    /// Remote key the peer puts in its RETH.
    pub rkey: u32,
    /// `ibv_access_flags` bits ([`crate::rc::verbs::access`]: `REMOTE_WRITE`, `REMOTE_READ`, ...).
    pub access: u32,
}

/// A registration's extent and keys, as both providers' region tables report it and as
/// callers get it (`msgr::MrInfo`). [`MrInfo::exposed`] is what a peer learns of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrInfo {
    pub addr: u64,
    pub len: u64,
    pub lkey: u32,
    pub rkey: u32,
    pub access: u32,
}

impl MrInfo {
    /// The region as a peer may access it (no lkey: that one stays local).
    pub fn exposed(&self) -> Region {
        Region {
            addr: self.addr,
            len: self.len,
            rkey: self.rkey,
            access: self.access,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_ibv_reg_mr_refuses() {
        let p = 0x1000 as *const u8;
        assert!(check_region(p, 4096, access::LOCAL_WRITE | access::REMOTE_WRITE).is_ok());
        assert!(check_region(std::ptr::null(), 0, 0).is_ok());
        let msg = |r: Result<()>| r.unwrap_err().message().to_string();
        assert!(msg(check_region(std::ptr::null(), 8, 0)).contains("NULL"));
        assert!(msg(check_region(usize::MAX as *const u8, 2, 0)).contains("wraps"));
        assert!(msg(check_region(p, 8, 0x100)).contains("unknown bits 0x100"));
        assert!(msg(check_region(p, 8, access::REMOTE_WRITE)).contains("require LOCAL_WRITE"));
    }
}
