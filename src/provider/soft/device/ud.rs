//! The device's side of UD QPs (`super::super::ud`): their table, creation and destruction,
//! and the receive dispatch `receive_from` calls for a DestQP that names no RC QP. Kept in
//! a child module of `device` (it reaches the device's private state) so that `device.rs`
//! only gains the hooks.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use parking_lot::RwLock;
use rustc_hash::FxHashMap as HashMap;

use super::super::cq::Cq;
use super::super::mr::MemView;
use super::super::srq::SoftSrq;
use super::super::sys;
use super::super::ud::{UdCaps, UdQp};
use super::super::udp::RxDatagram;
use super::qps::{QPN_RACES, pick_qpn};
use super::{Shared, SoftDevice};
use crate::error::{Error, ErrorKind, Result};

/// The device's UD QPs by number (QP numbers are unique across RC and UD QPs).
pub(super) type UdTable = RwLock<HashMap<u32, Arc<UdQp>>>;

impl SoftDevice {
    /// Creates a UD QP (RESET) whose packets leave from `local_ip`; messages are limited
    /// to the port's active MTU. Its number is unique among the device's RC and UD QPs.
    pub fn create_ud_qp(
        &self,
        caps: UdCaps,
        local_ip: IpAddr,
        send_cq: Arc<Cq>,
        recv_cq: Arc<Cq>,
        srq: Option<Arc<SoftSrq>>,
    ) -> Result<Arc<UdQp>> {
        let ip = local_ip.to_canonical();
        let Some(port) = self.shared.port_for(ip) else {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "soft provider: no {} UDP port on this device",
                    if ip.is_ipv4() { "IPv4" } else { "IPv6" }
                ),
            ));
        };
        let mtu = self.port_active_mtu();
        let s = &self.shared;
        for _ in 0..QPN_RACES {
            let qpn = {
                let rc = s.qps.read();
                let ud = s.ud_qps.read();
                pick_qpn(
                    &|q| rc.contains_key(&q) || ud.contains_key(&q),
                    &mut sys::try_random_u32,
                )?
            };
            let qp = Arc::new(UdQp::new(
                qpn,
                caps,
                mtu,
                ip,
                Arc::clone(&send_cq),
                Arc::clone(&recv_cq),
                srq.clone(),
            )?);
            {
                // The RC table's write lock orders this against an RC QP taking the number.
                let rc = s.qps.write();
                let mut ud = s.ud_qps.write();
                if !rc.contains_key(&qpn) && !ud.contains_key(&qpn) {
                    ud.insert(qpn, Arc::clone(&qp));
                    s.ports[port].qps.fetch_add(1, Ordering::AcqRel);
                    drop((rc, ud));
                    // The progress thread may be asleep without watching this port yet.
                    s.timers.wake.signal();
                    return Ok(qp);
                }
            }
        }
        Err(Error::new(
            ErrorKind::Busy,
            format!("soft provider: no free QP number after {QPN_RACES} races with other QPs"),
        ))
    }

    /// The UD QP `qpn` leaves the device: its packets are dropped (unknown QPN) from now on.
    pub fn destroy_ud_qp(&self, qpn: u32) {
        let s = &self.shared;
        if let Some(qp) = s.ud_qps.write().remove(&qpn)
            && let Some(port) = s.port_for(qp.local_udp().ip())
        {
            s.ports[port].qps.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Shared {
    /// True if `qpn` is a UD QP of this device (for the RC table's number picking).
    pub(super) fn is_ud_qpn(&self, qpn: u32) -> bool {
        self.ud_qps.read().contains_key(&qpn)
    }

    /// A received datagram whose DestQP names no RC QP: a UD QP by that number takes it
    /// (true; its own counters say what became of it), else false.
    pub(super) fn receive_ud(&self, view: &mut MemView<'_>, qpn: u32, d: &RxDatagram<'_>) -> bool {
        let Some(qp) = self.ud_qps.read().get(&qpn).cloned() else {
            return false;
        };
        qp.receive(&self.mrs, view, d.src, d.dst, d.data);
        true
    }
}
