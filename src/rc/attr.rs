//! QP attributes and the state transitions `modify` allows, with the attribute masks verbs
//! requires for RC (docs/rc-transport.md §4.1, ibv_modify_qp(3)). If any attribute or the mask
//! is invalid nothing is modified.

use super::verbs::{QpState, attr_mask as m};
use crate::error::{Error, ErrorKind, Result};

/// The attributes `modify` reads; which ones count is said by the mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    pub qp_state: QpState,
    pub qp_access_flags: u32,
    pub pkey_index: u16,
    pub port_num: u8,
    /// Path MTU in payload bytes: 256, 512, 1024, 2048 or 4096.
    pub path_mtu: u32,
    pub dest_qp_num: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
}

impl Default for QpAttr {
    fn default() -> Self {
        QpAttr {
            qp_state: QpState::Reset,
            qp_access_flags: 0,
            pkey_index: 0,
            port_num: 1,
            path_mtu: 1024,
            dest_qp_num: 0,
            rq_psn: 0,
            sq_psn: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            max_rd_atomic: 0,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
        }
    }
}

const INIT_REQ: u32 = m::STATE | m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS;
const RTR_REQ: u32 = m::STATE
    | m::AV
    | m::PATH_MTU
    | m::DEST_QPN
    | m::RQ_PSN
    | m::MAX_DEST_RD_ATOMIC
    | m::MIN_RNR_TIMER;
const RTS_REQ: u32 =
    m::STATE | m::SQ_PSN | m::MAX_QP_RD_ATOMIC | m::RETRY_CNT | m::RNR_RETRY | m::TIMEOUT;
/// Attributes an RTS->RTS modify may change (timers and retry counts).
const RTS_OPT: u32 = m::STATE | m::TIMEOUT | m::RETRY_CNT | m::RNR_RETRY | m::MIN_RNR_TIMER;

const MASK_NAMES: &[(u32, &str)] = &[
    (m::STATE, "STATE"),
    (m::ACCESS_FLAGS, "ACCESS_FLAGS"),
    (m::PKEY_INDEX, "PKEY_INDEX"),
    (m::PORT, "PORT"),
    (m::AV, "AV"),
    (m::PATH_MTU, "PATH_MTU"),
    (m::TIMEOUT, "TIMEOUT"),
    (m::RETRY_CNT, "RETRY_CNT"),
    (m::RNR_RETRY, "RNR_RETRY"),
    (m::RQ_PSN, "RQ_PSN"),
    (m::MAX_QP_RD_ATOMIC, "MAX_QP_RD_ATOMIC"),
    (m::MIN_RNR_TIMER, "MIN_RNR_TIMER"),
    (m::SQ_PSN, "SQ_PSN"),
    (m::MAX_DEST_RD_ATOMIC, "MAX_DEST_RD_ATOMIC"),
    (m::DEST_QPN, "DEST_QPN"),
];

fn names(mask: u32) -> String {
    let v: Vec<&str> = MASK_NAMES
        .iter()
        .filter(|(b, _)| mask & b != 0)
        .map(|(_, n)| *n)
        .collect();
    if mask & !MASK_NAMES.iter().fold(0, |a, (b, _)| a | b) != 0 {
        format!("{} and unknown bits", v.join("|"))
    } else {
        v.join("|")
    }
}

fn invalid(msg: String) -> Error {
    Error::new(ErrorKind::InvalidValue, msg)
}

/// Checks a modify from `cur` with `attr`/`mask`; returns the target state.
pub fn check_modify(cur: QpState, attr: &QpAttr, mask: u32) -> Result<QpState> {
    let target = if mask & m::STATE != 0 {
        attr.qp_state
    } else {
        cur
    };
    let (required, allowed) = match (cur, target) {
        (_, QpState::Reset) | (_, QpState::Err) => (m::STATE, m::STATE),
        (QpState::Reset, QpState::Init) | (QpState::Init, QpState::Init) => {
            (if cur == QpState::Reset { INIT_REQ } else { 0 }, INIT_REQ)
        }
        (QpState::Init, QpState::Rtr) => (RTR_REQ, RTR_REQ | m::ACCESS_FLAGS | m::PKEY_INDEX),
        (QpState::Rtr, QpState::Rts) => (RTS_REQ, RTS_REQ | m::MIN_RNR_TIMER | m::ACCESS_FLAGS),
        (QpState::Rts, QpState::Rts) => (0, RTS_OPT | m::ACCESS_FLAGS),
        _ => {
            return Err(invalid(format!(
                "qp_state: transition {cur:?} -> {target:?} is not allowed"
            )));
        }
    };
    let missing = required & !mask;
    if missing != 0 {
        return Err(invalid(format!(
            "attr_mask: {cur:?} -> {target:?} requires {} (missing {})",
            names(required),
            names(missing)
        )));
    }
    let extra = mask & !allowed;
    if extra != 0 {
        return Err(invalid(format!(
            "attr_mask: {} not allowed for {cur:?} -> {target:?}",
            names(extra)
        )));
    }
    let has = |b: u32| mask & b != 0;
    if has(m::PATH_MTU) && ![256, 512, 1024, 2048, 4096].contains(&attr.path_mtu) {
        return Err(invalid(format!(
            "path_mtu: invalid value {}: allowed 256, 512, 1024, 2048, 4096",
            attr.path_mtu
        )));
    }
    for (bit, name, v, max) in [
        (m::TIMEOUT, "timeout", attr.timeout, 31),
        (m::RETRY_CNT, "retry_cnt", attr.retry_cnt, 7),
        (m::RNR_RETRY, "rnr_retry", attr.rnr_retry, 7),
        (m::MIN_RNR_TIMER, "min_rnr_timer", attr.min_rnr_timer, 31),
    ] {
        if has(bit) && v > max {
            return Err(invalid(format!(
                "{name}: invalid value {v}: allowed 0..{max}"
            )));
        }
    }
    for (bit, name, v) in [
        (m::RQ_PSN, "rq_psn", attr.rq_psn),
        (m::SQ_PSN, "sq_psn", attr.sq_psn),
        (m::DEST_QPN, "dest_qp_num", attr.dest_qp_num),
    ] {
        if has(bit) && v > 0x00FF_FFFF {
            return Err(invalid(format!(
                "{name}: invalid value {v}: allowed 0..16777215 (24 bits)"
            )));
        }
    }
    if has(m::PORT) && attr.port_num == 0 {
        return Err(invalid("port_num: invalid value 0: allowed 1..255".into()));
    }
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rc_bringup_requires_the_verbs_masks() {
        let a = QpAttr {
            qp_state: QpState::Init,
            ..Default::default()
        };
        let e = check_modify(QpState::Reset, &a, m::STATE).unwrap_err();
        assert!(
            e.message().contains("missing ACCESS_FLAGS|PKEY_INDEX|PORT"),
            "{e}"
        );
        assert_eq!(
            check_modify(QpState::Reset, &a, INIT_REQ).unwrap(),
            QpState::Init
        );
        let a = QpAttr {
            qp_state: QpState::Rtr,
            ..a
        };
        let e = check_modify(QpState::Init, &a, RTR_REQ & !m::MIN_RNR_TIMER).unwrap_err();
        assert!(e.message().contains("missing MIN_RNR_TIMER"), "{e}");
        assert_eq!(
            check_modify(QpState::Init, &a, RTR_REQ).unwrap(),
            QpState::Rtr
        );
        let bad = QpAttr {
            path_mtu: 1000,
            ..a
        };
        let e = check_modify(QpState::Init, &bad, RTR_REQ).unwrap_err();
        assert!(
            e.message().starts_with("path_mtu: invalid value 1000"),
            "{e}"
        );
        let a = QpAttr {
            qp_state: QpState::Rts,
            retry_cnt: 8,
            ..a
        };
        let e = check_modify(QpState::Rtr, &a, RTS_REQ).unwrap_err();
        assert!(e.message().starts_with("retry_cnt: invalid value 8"), "{e}");
        let a = QpAttr {
            retry_cnt: 7,
            timeout: 32,
            ..a
        };
        let e = check_modify(QpState::Rtr, &a, RTS_REQ).unwrap_err();
        assert!(e.message().starts_with("timeout: invalid value 32"), "{e}");
        let a = QpAttr { timeout: 14, ..a };
        assert_eq!(
            check_modify(QpState::Rtr, &a, RTS_REQ).unwrap(),
            QpState::Rts
        );
        let e = check_modify(QpState::Reset, &a, RTS_REQ).unwrap_err();
        assert!(e.message().contains("Reset -> Rts is not allowed"), "{e}");
        let err = QpAttr {
            qp_state: QpState::Err,
            ..a
        };
        assert_eq!(
            check_modify(QpState::Rts, &err, m::STATE).unwrap(),
            QpState::Err
        );
    }
}
