//! `qp_override`: the operator's QP attributes replace the application's. Ceph hard-codes
//! timeout 18, retry_cnt 7, rnr_retry 7, min_rnr_timer 18 in `ibv_modify_qp` with no option
//! to tune them; with `qp_override=timeout,...` the configured values (profile, `--set`)
//! are applied instead. Each replacement is logged once per QP and attribute
//! ("QP 0x..: timeout 18 -> 14 (qp_override)") and counted (per QP and per device). An
//! attribute the application passes with the configured value already is not a
//! replacement (neither logged nor counted).

use rdmx::config::Settings;
use rdmx::rc::verbs::attr_mask as m;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use super::QpAttr;

/// One replacement: attribute, the application's value, the applied one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Replaced {
    pub name: &'static str,
    bit: u8,
    pub from: u8,
    pub to: u8,
}

/// A QP's override bookkeeping.
#[derive(Debug, Default)]
pub(crate) struct Overrides {
    /// Attributes already logged (bit per attribute).
    logged: AtomicU8,
    count: AtomicU64,
}

/// Replaces, in `attr`, the attributes `mask` carries that `settings.qp_override` lists;
/// returns what changed (to be recorded once the modify succeeded).
pub(crate) fn apply(settings: &Settings, attr: &mut QpAttr, mask: u32) -> Vec<Replaced> {
    let o = settings.qp_override;
    let mut out = Vec::new();
    let fields: [(bool, u32, &'static str, &mut u8, u8); 4] = [
        (
            o.timeout,
            m::TIMEOUT,
            "timeout",
            &mut attr.timeout,
            settings.timeout,
        ),
        (
            o.retry_cnt,
            m::RETRY_CNT,
            "retry_cnt",
            &mut attr.retry_cnt,
            settings.retry_cnt,
        ),
        (
            o.rnr_retry,
            m::RNR_RETRY,
            "rnr_retry",
            &mut attr.rnr_retry,
            settings.rnr_retry,
        ),
        (
            o.min_rnr_timer,
            m::MIN_RNR_TIMER,
            "min_rnr_timer",
            &mut attr.min_rnr_timer,
            settings.min_rnr_timer,
        ),
    ];
    for (bit, (on, mbit, name, field, configured)) in fields.into_iter().enumerate() {
        if on && mask & mbit != 0 && *field != configured {
            out.push(Replaced {
                name,
                bit: 1 << bit,
                from: *field,
                to: configured,
            });
            *field = configured;
        }
    }
    out
}

impl Overrides {
    /// Records applied replacements of QP `qpn`: counted, each attribute logged once.
    /// Returns how many were counted.
    pub(crate) fn record(&self, qpn: u32, replaced: &[Replaced]) -> u64 {
        for r in replaced {
            let before = self.logged.fetch_or(r.bit, Ordering::AcqRel);
            if before & r.bit == 0 {
                log::info!(
                    target: "rdmx::ibv",
                    "QP {qpn:#x}: {} {} -> {} (qp_override)",
                    r.name,
                    r.from,
                    r.to
                );
            }
        }
        let n = replaced.len() as u64;
        self.count.fetch_add(n, Ordering::Relaxed);
        n
    }

    pub(crate) fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdmx::config::Config;

    #[test]
    fn listed_attributes_in_the_mask_take_the_configured_values() {
        let mut c = Config::new();
        c.set("qp_override", "timeout,rnr_retry").unwrap();
        c.set("timeout", "14").unwrap();
        c.set("rnr_retry", "7").unwrap();
        let s = c.settings().unwrap();
        let mut a = QpAttr {
            timeout: 18,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 18,
            ..Default::default()
        };
        // Not in the mask: untouched.
        assert!(apply(&s, &mut a, m::STATE).is_empty());
        let r = apply(&s, &mut a, m::TIMEOUT | m::RETRY_CNT | m::RNR_RETRY);
        // rnr_retry equals the configured value already: not a replacement.
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].name, r[0].from, r[0].to), ("timeout", 18, 14));
        assert_eq!(
            (a.timeout, a.retry_cnt, a.rnr_retry, a.min_rnr_timer),
            (14, 7, 7, 18)
        );
        let o = Overrides::default();
        assert_eq!(o.record(0x12, &r), 1);
        assert_eq!(o.record(0x12, &r), 1);
        assert_eq!(o.count(), 2);
        assert_eq!(o.logged.load(Ordering::Relaxed), 1);
    }
}
