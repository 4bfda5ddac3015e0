//! Address handles (`ibv_create_ah`): the destination of UD sends. On RoCEv2 an AH is its
//! GRH: the destination GID names the peer's IP (IPv4-mapped -> IPv4), as the AV of an RC
//! QP at RTR does, and the peer's soft device receives on that IP at the configured
//! `soft_port` (4791), so the AH resolves to that UDP address once, at creation.

use rdmx::error::{Error, ErrorKind, Result};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::device::limits::MAX_AH;
use super::pd::Pd;
use super::qp::{AhAttr, gid_to_ip};

/// An address handle.
#[derive(Debug)]
pub struct Ah {
    pd: Arc<Pd>,
    attr: AhAttr,
    dest: SocketAddr,
    dead: AtomicBool,
}

fn invalid(msg: String) -> Error {
    Error::new(ErrorKind::InvalidArgument, msg)
}

impl Ah {
    /// Checks `attr` as a RoCE device does and resolves it: a GRH is required (`is_global`;
    /// RoCE has no LIDs), `sgid_index` 0 (the GID table's one entry), port 1, and a
    /// destination GID of the device's address family (InvalidArgument otherwise).
    pub fn new(pd: &Arc<Pd>, attr: &AhAttr) -> Result<Arc<Ah>> {
        pd.check_alive()?;
        if !attr.is_global {
            return Err(invalid(
                "create_ah: is_global 0: a RoCE address handle needs a GRH (dgid, sgid_index)"
                    .into(),
            ));
        }
        if attr.sgid_index != 0 {
            return Err(invalid(format!(
                "create_ah: grh.sgid_index {}: the GID table has one entry (0)",
                attr.sgid_index
            )));
        }
        if attr.port_num > 1 {
            return Err(invalid(format!(
                "create_ah: port_num {}: the device has one port (1)",
                attr.port_num
            )));
        }
        let dev = &pd.dev;
        let ip = gid_to_ip(&attr.dgid);
        if ip.is_ipv4() != dev.ip.is_ipv4() || ip.is_unspecified() || ip.is_multicast() {
            return Err(invalid(format!(
                "create_ah: dgid {ip} is not a unicast address of the device's family ({})",
                dev.ip
            )));
        }
        if dev.ahs.fetch_add(1, Ordering::AcqRel) >= u64::from(MAX_AH) {
            dev.ahs.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::new(
                ErrorKind::ResourceLimit,
                format!("create_ah: {MAX_AH} address handles alive (max_ah)"),
            ));
        }
        pd.users.fetch_add(1, Ordering::AcqRel);
        Ok(Arc::new(Ah {
            pd: Arc::clone(pd),
            attr: *attr,
            dest: SocketAddr::new(ip, super::peer_port::default_port(dev, ip)),
            dead: AtomicBool::new(false),
        }))
    }

    /// The UDP address UD sends through this AH go to.
    pub fn dest(&self) -> SocketAddr {
        self.dest
    }

    /// The attributes it was created with.
    pub fn attr(&self) -> AhAttr {
        self.attr
    }

    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    pub(crate) fn check_alive(&self) -> Result<()> {
        if self.dead.load(Ordering::Acquire) {
            return Err(invalid("address handle already destroyed".into()));
        }
        Ok(())
    }

    /// `ibv_destroy_ah` (WRs already posted with it are sent: a UD post sends at once).
    pub fn destroy(&self) -> Result<()> {
        if self.dead.swap(true, Ordering::AcqRel) {
            return Err(invalid("address handle already destroyed".into()));
        }
        self.release();
        Ok(())
    }

    /// What a live AH holds: a use of its PD and a slot of the device's `max_ah`.
    fn release(&self) {
        self.pd.users.fetch_sub(1, Ordering::AcqRel);
        self.pd.dev.ahs.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for Ah {
    fn drop(&mut self) {
        if !self.dead.swap(true, Ordering::AcqRel) {
            self.release();
        }
    }
}
