//! The device: a soft provider device on this process's address (config `soft_addr`, UDP
//! `soft_port` = 4791, RoCEv2's), its limits as `ibv_device_attr`/`ibv_port_attr` report
//! them, its GID, and its async event pipe.

use rdmx::config::Settings;
use rdmx::error::Result;
use rdmx::provider::soft::device::SoftDevice;
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::sync::Arc;

use super::events::AsyncEvents;

/// What `ibv_query_device` reports (the fields of `struct ibv_device_attr`), honest limits
/// of the soft provider and the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    /// "rdmx <version>".
    pub fw_ver: String,
    /// EUI-64 derived from the device's IP address (stable for an address).
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: u32,
    pub max_qp_wr: u32,
    /// `enum ibv_device_cap_flags` bits (RC_RNR_NAK_GEN, SRQ_RESIZE, ...).
    pub device_cap_flags: u32,
    pub max_sge: u32,
    pub max_sge_rd: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_pd: u32,
    pub max_qp_rd_atom: u32,
    pub max_ee_rd_atom: u32,
    pub max_res_rd_atom: u32,
    pub max_qp_init_rd_atom: u32,
    pub max_ee_init_rd_atom: u32,
    /// `enum ibv_atomic_cap`: 0 = IBV_ATOMIC_NONE (the RC engine has no atomics).
    pub atomic_cap: u32,
    pub max_ee: u32,
    pub max_rdd: u32,
    pub max_mw: u32,
    pub max_raw_ipv6_qp: u32,
    pub max_raw_ethy_qp: u32,
    pub max_mcast_grp: u32,
    pub max_mcast_qp_attach: u32,
    pub max_total_mcast_qp_attach: u32,
    pub max_ah: u32,
    pub max_fmr: u32,
    pub max_map_per_fmr: u32,
    pub max_srq: u32,
    pub max_srq_wr: u32,
    pub max_srq_sge: u32,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

/// What `ibv_query_port` reports (the fields of `struct ibv_port_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortAttr {
    /// `enum ibv_port_state`: 4 = ACTIVE.
    pub state: u32,
    /// `enum ibv_mtu` (1 = 256 .. 5 = 4096).
    pub max_mtu: u32,
    /// `enum ibv_mtu`: the largest IB MTU whose packets fit the link of the device's address.
    pub active_mtu: u32,
    pub gid_tbl_len: i32,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    /// `active_width`: 1 = 1x.
    pub active_width: u8,
    /// `active_speed`: IB encoding, see the doc of [`Device::query_port`].
    pub active_speed: u8,
    /// 5 = LinkUp.
    pub phys_state: u8,
    /// `IBV_LINK_LAYER_ETHERNET` = 2.
    pub link_layer: u8,
}

/// Device-wide counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// QPs alive.
    pub qps: u64,
    /// QP attributes replaced by `qp_override` (all QPs, ever).
    pub qp_overrides: u64,
    /// Async events queued.
    pub async_events: u64,
    /// Async events lost because the application did not read its async fd.
    pub async_events_dropped: u64,
}

/// One opened soft device (`ibv_open_device`).
pub struct Device {
    pub(crate) soft: SoftDevice,
    pub(crate) events: AsyncEvents,
    pub(crate) ip: IpAddr,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("ip", &self.ip).finish()
    }
}

impl Device {
    /// Opens a soft device on this process's address (`soft_addr`; 127.0.0.1 when unset,
    /// with a log line: the GID needs one address) and UDP `soft_port`, with the progress
    /// thread that serves the passive side of READ/WRITE without application calls
    /// (`progress=inline` hands receiving to it when the application stops polling;
    /// `progress=thread` always receives there).
    pub fn open(settings: &Settings) -> Result<Arc<Device>> {
        let _ = settings;
        todo!()
    }

    /// The configuration the device was opened with.
    pub fn settings(&self) -> &Settings {
        self.soft.settings()
    }

    /// The address the device receives on (GID index 0).
    pub fn ip(&self) -> IpAddr {
        self.ip
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> DeviceAttr {
        todo!()
    }

    /// `ibv_query_port`: port 1 only (InvalidArgument otherwise). ACTIVE, Ethernet link
    /// layer, max MTU 4096, active MTU from the link of the device's address (loopback:
    /// 4096; a 1500-byte link: 1024), one GID, one P_Key. Width 1x, speed 25 Gb/s
    /// (`active_speed` 32 = EDR): a plausible figure, the soft transport has no line rate.
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        let _ = port;
        todo!()
    }

    /// GID `index` of port 1: index 0 is the RoCEv2 GID of the device's address
    /// (IPv4-mapped `::ffff:a.b.c.d`, or the IPv6 address); other indexes InvalidArgument.
    pub fn gid(&self, index: u32) -> Result<[u8; 16]> {
        let _ = index;
        todo!()
    }

    /// The async event fd (`ibv_context.async_fd`): `ib_uverbs_async_event_desc` records.
    pub fn async_fd(&self) -> RawFd {
        self.events.fd()
    }

    /// The async event queue (the glue needs only [`Device::async_fd`]).
    pub fn events(&self) -> &AsyncEvents {
        &self.events
    }

    /// Device-wide counters.
    pub fn stats(&self) -> DeviceStats {
        todo!()
    }
}
