//! `struct ibv_qp_attr` and `struct ibv_ah_attr` as the QP layer takes them, and the
//! verbs enum conversions (`enum ibv_mtu`, `enum ibv_qp_state`).

use rdmx::error::{Error, ErrorKind, Result};
use rdmx::rc::QpState;
use std::net::{IpAddr, Ipv6Addr};

use super::QpCap;

/// `struct ibv_ah_attr` with its `struct ibv_global_route` (RoCE: `is_global` is 1 and
/// the GRH fields matter; LIDs do not).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AhAttr {
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: bool,
    pub port_num: u8,
}

/// `struct ibv_qp_attr` (the fields RC uses; the glue copies the others as zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    pub qp_state: QpState,
    pub cur_qp_state: QpState,
    /// `enum ibv_mtu` (1 = 256 .. 5 = 4096).
    pub path_mtu: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub cap: QpCap,
    pub ah_attr: AhAttr,
    pub pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
}

impl Default for QpAttr {
    fn default() -> Self {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: 3,
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: 0,
            qp_access_flags: 0,
            cap: QpCap::default(),
            ah_attr: AhAttr::default(),
            pkey_index: 0,
            en_sqd_async_notify: 0,
            sq_draining: 0,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            port_num: 1,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
        }
    }
}

/// `enum ibv_mtu` -> bytes (1 -> 256 .. 5 -> 4096); InvalidValue otherwise.
pub fn mtu_from_ibv(v: u32) -> Result<u32> {
    match v {
        1..=5 => Ok(128 << v),
        _ => Err(Error::new(
            ErrorKind::InvalidValue,
            format!("path_mtu: invalid value {v}: allowed IBV_MTU_256 (1) .. IBV_MTU_4096 (5)"),
        )),
    }
}

/// Bytes (256..4096, a power of two) -> `enum ibv_mtu`; values between round down, below
/// 256 give 1.
pub fn mtu_to_ibv(bytes: u32) -> u32 {
    (1..=5u32).rev().find(|v| 128 << v <= bytes).unwrap_or(1)
}

/// `enum ibv_qp_state` -> [`QpState`]: SQD (4), SQE (5) and unknown values are refused
/// (Unsupported / InvalidValue).
pub fn qp_state_from_ibv(v: u32) -> Result<QpState> {
    match v {
        0 => Ok(QpState::Reset),
        1 => Ok(QpState::Init),
        2 => Ok(QpState::Rtr),
        3 => Ok(QpState::Rts),
        6 => Ok(QpState::Err),
        4 | 5 => Err(Error::new(
            ErrorKind::Unsupported,
            format!("qp_state {v} (SQD/SQE): the soft provider has no send queue drain states"),
        )),
        _ => Err(Error::new(
            ErrorKind::InvalidValue,
            format!("qp_state: invalid value {v}"),
        )),
    }
}

/// The IP a RoCEv2 GID names: IPv4-mapped (`::ffff:a.b.c.d`) -> IPv4, else IPv6.
pub fn gid_to_ip(gid: &[u8; 16]) -> IpAddr {
    IpAddr::V6(Ipv6Addr::from(*gid)).to_canonical()
}

/// The RoCEv2 GID of an IP (IPv4 -> IPv4-mapped).
pub fn ip_to_gid(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_enums_convert_both_ways() {
        assert_eq!(mtu_from_ibv(1).unwrap(), 256);
        assert_eq!(mtu_from_ibv(5).unwrap(), 4096);
        assert_eq!(mtu_from_ibv(0).unwrap_err().kind(), ErrorKind::InvalidValue);
        assert_eq!(mtu_from_ibv(6).unwrap_err().kind(), ErrorKind::InvalidValue);
        for v in 1..=5 {
            assert_eq!(mtu_to_ibv(mtu_from_ibv(v).unwrap()), v);
        }
        assert_eq!(mtu_to_ibv(1500), 3);
        assert_eq!(mtu_to_ibv(65536), 5);
        assert_eq!(mtu_to_ibv(100), 1);
        assert_eq!(qp_state_from_ibv(6).unwrap(), QpState::Err);
        assert_eq!(
            qp_state_from_ibv(4).unwrap_err().kind(),
            ErrorKind::Unsupported
        );
        assert_eq!(
            qp_state_from_ibv(9).unwrap_err().kind(),
            ErrorKind::InvalidValue
        );
        let ip: IpAddr = "127.0.0.3".parse().unwrap();
        assert_eq!(gid_to_ip(&ip_to_gid(ip)), ip);
        let ip6: IpAddr = "fd00::2".parse().unwrap();
        assert_eq!(gid_to_ip(&ip_to_gid(ip6)), ip6);
    }
}
