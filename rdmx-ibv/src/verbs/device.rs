//! The device: a soft provider device on this process's address (config `soft_addr`, UDP
//! `soft_port` = 4791, RoCEv2's), its limits as `ibv_device_attr`/`ibv_port_attr` report
//! them, its GID, and its async event pipe.

use rdmx::config::Settings;
use rdmx::error::{Error, ErrorKind, Result};
use rdmx::provider::soft::device::SoftDevice;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::events::AsyncEvents;

/// What `ibv_query_device` reports (the fields of `struct ibv_device_attr`), honest limits
/// of the soft provider and the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    /// "rdmx <version>".
    pub fw_ver: String,
    /// Derived from the device's IP address (stable for an address), in host order
    /// (`ibv_device_attr.node_guid` is `__be64`: the glue stores `to_be()`).
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
    /// Shared with the QPs' and SRQs' hooks (which must not keep the device alive).
    pub(crate) events: Arc<AsyncEvents>,
    pub(crate) ip: IpAddr,
    pub(crate) qps: AtomicU64,
    pub(crate) overrides: AtomicU64,
    /// Address handles alive (at most `limits::MAX_AH`).
    pub(crate) ahs: AtomicU64,
}

/// `vendor_id` of `ibv_query_device`: rxe's (see [`Device::query_device`]).
pub const VENDOR_ID: u32 = 0x00ff_ffff;

/// Device limits (the soft provider's, honest): see [`Device::query_device`].
pub(crate) mod limits {
    /// Each QP binds its own UDP source port in 0xC000-0xFFFF.
    pub const MAX_QP: u32 = 16384;
    /// As the config's `max_send_wr`/`max_recv_wr` range.
    pub const MAX_QP_WR: u32 = 32768;
    /// As the config's `max_send_sge` range.
    pub const MAX_SGE: u32 = 32;
    pub const MAX_CQ: u32 = 65536;
    /// As the config's CQ size range.
    pub const MAX_CQE: u32 = 4_194_304;
    pub const MAX_MR: u32 = 1 << 20;
    pub const MAX_PD: u32 = 65536;
    /// READs in flight per QP (the engine keeps max_rd_atomic in a u8; rxe says 128).
    pub const MAX_RD_ATOM: u32 = 128;
    pub const MAX_SRQ: u32 = 65536;
    /// Address handles alive at once (each is a resolved UDP address; the bound keeps a
    /// program that leaks them from growing without limit). rxe: 0x7fff-ish by pool size.
    pub const MAX_AH: u32 = 65536;
    /// Largest inline payload of a send WR (as the config's `max_inline_data` range).
    pub const MAX_INLINE: u32 = 1024;
    /// A message is at most 2^31 bytes (the engine's limit).
    pub const MAX_MSG: u32 = 1 << 31;
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
        let ip = match settings.soft_addr {
            Some(ip) if !ip.is_unspecified() => ip.to_canonical(),
            _ => {
                log::info!(target: "rdmx::ibv", "soft_addr is not set: the device uses 127.0.0.1 (rdmx-ibv exec --ip ADDR sets it)");
                IpAddr::V4(Ipv4Addr::LOCALHOST)
            }
        };
        let soft = SoftDevice::open(settings, &[ip])?;
        log::info!(target: "rdmx::ibv", "rdmx0 on {} (progress={:?})", soft.udp_addr(), settings.progress);
        let dev = Arc::new(Device {
            soft,
            events: Arc::new(AsyncEvents::new()?),
            ip,
            qps: AtomicU64::new(0),
            overrides: AtomicU64::new(0),
            ahs: AtomicU64::new(0),
        });
        super::stats::device_opened(&dev);
        Ok(dev)
    }

    /// The soft device underneath.
    pub fn soft(&self) -> &SoftDevice {
        &self.soft
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
        use limits::*;
        let guid = self.node_guid();
        DeviceAttr {
            fw_ver: format!("rdmx {}", env!("CARGO_PKG_VERSION")),
            node_guid: guid,
            sys_image_guid: guid,
            // As rxe (RXE_MAX_MR_SIZE = -1ull): no size limit of the device's own. What
            // bounds a registration is RLIMIT_MEMLOCK, at ibv_reg_mr, as the kernel's
            // ib_umem_get applies it (lifted by CAP_IPC_LOCK; soft_pin=false: nothing is
            // pinned). Reporting the limit here made Ceph refuse any MR above it even where
            // the registration would have succeeded.
            max_mr_size: u64::MAX,
            // As rxe: any page size from 4 KiB up.
            page_size_cap: 0xFFFF_F000,
            // rxe's (RXE_VENDOR_ID, rxe_param.h): a software device's placeholder that is
            // no PCI vendor's ID or IEEE OUI, so no vendor-specific path (mlx5, efa, irdma
            // checks in rdma-core's tests, perftest's device table) takes rdmx0 for
            // hardware; 0 made rdma-core's query_device tests fail ("vendor_id != 0").
            vendor_id: VENDOR_ID,
            vendor_part_id: 0,
            hw_ver: 0,
            max_qp: MAX_QP,
            max_qp_wr: MAX_QP_WR,
            // RC_RNR_NAK_GEN | SRQ_RESIZE | CURR_QP_STATE_MOD | MEM_WINDOW |
            // MEM_MGT_EXTENSIONS | MEM_WINDOW_TYPE_2B (as rxe: type-1 and type-2 windows,
            // `verbs/mw.rs`, local and remote invalidation: IBV_WR_LOCAL_INV and
            // IBV_WR_SEND_WITH_INV; there is no fast registration in userspace verbs).
            device_cap_flags: (1 << 12) | (1 << 13) | (1 << 7) | (1 << 17) | (1 << 21) | (1 << 24),
            max_sge: MAX_SGE,
            max_sge_rd: MAX_SGE,
            max_cq: MAX_CQ,
            max_cqe: MAX_CQE,
            max_mr: MAX_MR,
            max_pd: MAX_PD,
            max_qp_rd_atom: MAX_RD_ATOM,
            max_ee_rd_atom: 0,
            max_res_rd_atom: MAX_RD_ATOM * MAX_QP,
            max_qp_init_rd_atom: MAX_RD_ATOM,
            max_ee_init_rd_atom: 0,
            atomic_cap: 0,
            max_ee: 0,
            max_rdd: 0,
            max_mw: rdmx::provider::soft::window::MAX_WINDOWS as u32,
            max_raw_ipv6_qp: 0,
            max_raw_ethy_qp: 0,
            max_mcast_grp: 0,
            max_mcast_qp_attach: 0,
            max_total_mcast_qp_attach: 0,
            max_ah: MAX_AH,
            max_fmr: 0,
            max_map_per_fmr: 0,
            max_srq: MAX_SRQ,
            max_srq_wr: MAX_QP_WR,
            max_srq_sge: MAX_SGE,
            max_pkeys: 1,
            local_ca_ack_delay: 15,
            phys_port_cnt: 1,
        }
    }

    /// 0x02 (locally administered) 'r' 'x', then the IPv4 address; IPv6: its last 5
    /// bytes. Distinct for distinct 127.0.0.x processes.
    fn node_guid(&self) -> u64 {
        let tail: [u8; 5] = match self.ip {
            IpAddr::V4(a) => {
                let o = a.octets();
                [0, o[0], o[1], o[2], o[3]]
            }
            IpAddr::V6(a) => {
                let o = a.octets();
                [o[11], o[12], o[13], o[14], o[15]]
            }
        };
        let b = [
            0x02, b'r', b'x', tail[0], tail[1], tail[2], tail[3], tail[4],
        ];
        u64::from_be_bytes(b)
    }

    /// `ibv_query_port`: port 1 only (InvalidArgument otherwise). ACTIVE, Ethernet link
    /// layer, max MTU 4096, active MTU from the link of the device's address (loopback:
    /// 4096; a 1500-byte link: 1024), one GID, one P_Key. Width 1x, speed 25 Gb/s
    /// (`active_speed` 32 = EDR): a plausible figure, the soft transport has no line rate.
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        check_port(port)?;
        Ok(PortAttr {
            state: 4,
            max_mtu: 5,
            active_mtu: super::qp::mtu_to_ibv(self.soft.port_active_mtu()),
            gid_tbl_len: 1,
            port_cap_flags: 0,
            max_msg_sz: limits::MAX_MSG,
            bad_pkey_cntr: 0,
            qkey_viol_cntr: 0,
            pkey_tbl_len: 1,
            lid: 0,
            sm_lid: 0,
            lmc: 0,
            max_vl_num: 1,
            sm_sl: 0,
            subnet_timeout: 0,
            init_type_reply: 0,
            active_width: 1,
            active_speed: 32,
            phys_state: 5,
            link_layer: 2,
        })
    }

    /// GID `index` of port 1: index 0 is the RoCEv2 GID of the device's address
    /// (IPv4-mapped `::ffff:a.b.c.d`, or the IPv6 address); other indexes InvalidArgument.
    pub fn gid(&self, index: u32) -> Result<[u8; 16]> {
        if index != 0 {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("query_gid: index {index}: the GID table has one entry (0)"),
            ));
        }
        Ok(match self.ip {
            IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
            IpAddr::V6(a) => a.octets(),
        })
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
        DeviceStats {
            qps: self.qps.load(Ordering::Relaxed),
            qp_overrides: self.overrides.load(Ordering::Relaxed),
            async_events: self.events.raised(),
            async_events_dropped: self.events.dropped(),
        }
    }
}

/// Port numbers: the device has port 1 only.
pub(crate) fn check_port(port: u8) -> Result<()> {
    if port != 1 {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("port {port}: the device has one port (1)"),
        ));
    }
    Ok(())
}
