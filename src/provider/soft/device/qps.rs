//! RC QPs of the device: creation under a fresh random QP number (never replacing a live
//! QP), destruction, and the number picking itself.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::super::cq::Cq;
use super::super::qp::{SoftQp, TxOptions};
use super::super::sys;
use super::SoftDevice;
use crate::error::{Error, ErrorKind, Result};
use crate::rc::QpCaps;

impl SoftDevice {
    /// Creates a QP (RESET) whose packets leave from `local_ip`, with its CQs.
    pub fn create_qp(
        &self,
        caps: QpCaps,
        local_ip: IpAddr,
        send_cq: Arc<Cq>,
        recv_cq: Arc<Cq>,
    ) -> Result<Arc<SoftQp>> {
        let ip = local_ip.to_canonical();
        let Some(port) = self.shared.port_for(ip) else {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "soft provider: no {} UDP port on this device (the host refused to bind one)",
                    if ip.is_ipv4() { "IPv4" } else { "IPv6" }
                ),
            ));
        };
        let shared = &self.shared;
        let qp = self.add_qp(
            &mut |qpn| {
                let qp = SoftQp::new(
                    qpn,
                    caps,
                    ip,
                    Arc::clone(&send_cq),
                    Arc::clone(&recv_cq),
                    TxOptions {
                        drop_ppb: shared.settings.soft_drop_ppb,
                        gso: shared.settings.soft_gso,
                    },
                    Arc::clone(&shared.stats.log),
                )?;
                qp.attach_timers(Arc::clone(&shared.timers));
                Ok(qp)
            },
            &mut sys::try_random_u32,
        )?;
        self.shared.ports[port].qps.fetch_add(1, Ordering::AcqRel);
        // The progress thread may be asleep without watching this port yet.
        self.shared.timers.wake.signal();
        Ok(qp)
    }

    /// Registers the QP `make` builds for a fresh QP number ([`pick_qpn`], from `draw`).
    /// The number is picked under the read lock and the QP (which binds its UDP port) is
    /// built outside any lock, then inserted only if its number is still free: a live QP
    /// is never replaced, and a racing `create_qp` that took the number makes this one
    /// pick again.
    pub(super) fn add_qp(
        &self,
        make: &mut dyn FnMut(u32) -> Result<SoftQp>,
        draw: &mut dyn FnMut() -> Result<u32>,
    ) -> Result<Arc<SoftQp>> {
        for _ in 0..QPN_RACES {
            let qpn = {
                let qps = self.shared.qps.read();
                pick_qpn(&|q| qps.contains_key(&q) || self.shared.is_ud_qpn(q), draw)?
            };
            let qp = Arc::new(make(qpn)?);
            let mut qps = self.shared.qps.write();
            if !self.shared.is_ud_qpn(qpn)
                && let std::collections::hash_map::Entry::Vacant(v) = qps.entry(qpn)
            {
                v.insert(Arc::clone(&qp));
                return Ok(qp);
            }
            log::debug!(target: "rdmx::soft", "QP {qpn:#x}: taken meanwhile; picking again");
        }
        Err(Error::new(
            ErrorKind::Busy,
            format!("soft provider: no free QP number after {QPN_RACES} races with other QPs"),
        ))
    }

    /// Forgets a QP (after it was drained): its packets are dropped from now on. ACKs it
    /// still held go first.
    pub fn destroy_qp(&self, qpn: u32) {
        let qp = self.shared.qps.read().get(&qpn).cloned();
        if let Some(qp) = qp {
            self.send_held_acks(&qp);
        }
        if let Some(qp) = self.shared.qps.write().remove(&qpn)
            && let Some(port) = self.shared.port_for(qp.local_udp().ip())
        {
            self.shared.ports[port].qps.fetch_sub(1, Ordering::AcqRel);
        }
        let mut w = self.shared.watches.lock();
        w.retain(|fd, q| {
            if *q == qpn {
                self.shared.watch_set.remove(*fd);
            }
            *q != qpn
        });
    }
}

/// QP numbers are 24 bits.
pub(super) const QPN_MASK: u32 = 0x00FF_FFFF;
/// Random QP numbers [`pick_qpn`] draws before it scans for a free one.
const QPN_DRAWS: usize = 32;
/// Times `add_qp` picks again when another `create_qp` took its number meanwhile.
pub(super) const QPN_RACES: usize = 8;

/// Whether `qpn` may name a new QP: 0 (SMI) and 1 (GSI) are reserved by IB, and 0xFFFFFF
/// is the multicast QP number.
pub(super) fn qpn_assignable(qpn: u32) -> bool {
    qpn > 1 && qpn < QPN_MASK
}

/// A number for a new QP: a random 24-bit value from `draw` (kernel randomness), so one
/// connection's QP number says nothing about the next one's, skipping reserved numbers and
/// live ones (`is_live`), so a live QP is never replaced. After [`QPN_DRAWS`] draws that
/// all hit (a nearly full table) it scans from a random point; [`ErrorKind::Full`] when
/// every number is taken. Errors of `draw` are passed on.
pub(super) fn pick_qpn(
    is_live: &dyn Fn(u32) -> bool,
    draw: &mut dyn FnMut() -> Result<u32>,
) -> Result<u32> {
    for _ in 0..QPN_DRAWS {
        let qpn = draw()? & QPN_MASK;
        if qpn_assignable(qpn) && !is_live(qpn) {
            return Ok(qpn);
        }
    }
    let start = draw()?;
    (0..=QPN_MASK)
        .map(|i| start.wrapping_add(i) & QPN_MASK)
        .find(|&q| qpn_assignable(q) && !is_live(q))
        .ok_or_else(|| {
            Error::new(
                ErrorKind::Full,
                format!(
                    "soft provider: every QP number is in use ({} QPs)",
                    QPN_MASK - 2
                ),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nearly_full_table_scans_and_a_full_one_says_so() {
        // Every draw hits a live number: the scan finds the one free number.
        let free = 0x12_3456;
        let mut always_live = || Ok(free + 1);
        assert_eq!(pick_qpn(&|q| q != free, &mut always_live).unwrap(), free);
        // The scan wraps past 0xFFFFFF and skips the reserved numbers.
        let mut high = || Ok(QPN_MASK);
        assert_eq!(pick_qpn(&|q| q > 2, &mut high).unwrap(), 2);
        let e = pick_qpn(&|_| true, &mut always_live).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Full);
        assert!(e.message().contains("every QP number is in use"), "{e}");
    }
}
