//! Opening a verbs device: selection (`device` name, or the first device with an active
//! `port`), the port and its RoCEv2 GID (`gid_index`, type checked), the device limits the
//! configuration must fit, and the protection domain every QP and MR of a context uses.

use crate::config::Settings;
use crate::error::{Error, ErrorKind, Result};
use rdma_sys as ib;
use std::ffi::CStr;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;

/// `IBV_LINK_LAYER_ETHERNET` (an anonymous enum in verbs.h, which bindgen skips; the
/// layout test checks the value against the header).
pub const LINK_LAYER_ETHERNET: u8 = 2;

/// The UDP destination port of RoCEv2 (IANA): a NIC sends every RC packet there.
pub const ROCEV2_PORT: u16 = 4791;

/// What the device can do, from `ibv_query_device`: the limits a configuration is checked
/// against (a NIC refuses a QP or CQ above them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_qp_wr: u32,
    pub max_sge: u32,
    pub max_cqe: u32,
    /// Incoming READs/atomics a QP may have outstanding as responder (max_dest_rd_atomic).
    pub max_qp_rd_atom: u8,
    /// READs/atomics a QP may have outstanding as initiator (max_rd_atomic).
    pub max_qp_init_rd_atom: u8,
    /// The device binds type-2 memory windows (`max_mw` > 0 and MEM_WINDOW_TYPE_2A or
    /// 2B in `device_cap_flags`): the messenger's scoped rkeys work on it.
    pub mw_type2: bool,
}

/// The device context and the protection domain, released when the last user (device,
/// memory table, QP) is gone: pools may outlive their context, and their arenas are
/// deregistered against this PD.
#[derive(Debug)]
pub struct Pd {
    pub(crate) ctx: *mut ib::ibv_context,
    pub(crate) pd: *mut ib::ibv_pd,
}

// SAFETY: libibverbs objects may be used from any thread (the library locks internally
// where a provider needs it); the pointers are owned by this value and freed once, in Drop.
unsafe impl Send for Pd {}
// SAFETY: as above; every verb called through a shared `Pd` is thread-safe in libibverbs.
unsafe impl Sync for Pd {}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: `pd` and `ctx` came from ibv_alloc_pd/ibv_open_device and are released
        // once, here, after every QP, CQ and MR made from them (those hold an Arc<Pd>).
        unsafe {
            ib::ibv_dealloc_pd(self.pd);
            ib::ibv_close_device(self.ctx);
        }
    }
}

/// An opened verbs device with its chosen port and GID.
#[derive(Debug)]
pub struct Opened {
    pub pd: Arc<Pd>,
    pub name: String,
    pub port: u8,
    pub gid_index: u8,
    /// The GID as an address (RoCEv2 GIDs are IP addresses; IPv4 ones are v4-mapped).
    pub gid: Ipv6Addr,
    /// The port's active MTU in bytes (256..4096).
    pub active_mtu: u32,
    pub limits: Limits,
}

impl Opened {
    /// The GID as the IP address a peer's RoCEv2 packets go to (IPv4 for v4-mapped GIDs).
    pub fn ip(&self) -> IpAddr {
        IpAddr::V6(self.gid).to_canonical()
    }

    /// One line for logs and `provider=auto`'s reason.
    pub fn describe(&self) -> String {
        format!(
            "device {} port {} GID[{}] {} (RoCE v2), active MTU {}",
            self.name,
            self.port,
            self.gid_index,
            self.ip(),
            self.active_mtu
        )
    }
}

fn os_err(what: &str) -> Error {
    let e = std::io::Error::last_os_error();
    Error::new(ErrorKind::Io, format!("verbs: {what}: {e}"))
}

/// IB MTU enum value -> bytes (0 for an unknown value).
pub fn mtu_bytes(m: u32) -> u32 {
    match m {
        1..=5 => 128 << m,
        _ => 0,
    }
}

/// Bytes -> IB MTU enum value (the largest not above `bytes`, at least 256).
pub fn mtu_enum(bytes: u32) -> u32 {
    match bytes {
        4096.. => ib::ibv_mtu::IBV_MTU_4096,
        2048.. => ib::ibv_mtu::IBV_MTU_2048,
        1024.. => ib::ibv_mtu::IBV_MTU_1024,
        512.. => ib::ibv_mtu::IBV_MTU_512,
        _ => ib::ibv_mtu::IBV_MTU_256,
    }
}

/// The device list, released on drop.
struct DeviceList {
    list: *mut *mut ib::ibv_device,
    n: usize,
}

impl DeviceList {
    fn get() -> Result<DeviceList> {
        let mut n: libc::c_int = 0;
        // SAFETY: `n` is a valid out-pointer for the call; the list is freed in Drop.
        let list = unsafe { ib::ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(os_err("no RDMA devices (ibv_get_device_list)"));
        }
        Ok(DeviceList {
            list,
            n: usize::try_from(n).unwrap_or(0),
        })
    }

    fn devices(&self) -> impl Iterator<Item = *mut ib::ibv_device> + '_ {
        // SAFETY: the list holds `n` valid device pointers while `self` lives.
        (0..self.n).map(|i| unsafe { *self.list.add(i) })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: `list` came from ibv_get_device_list and is freed once; devices opened
        // from it stay valid (libibverbs keeps them referenced by their contexts).
        unsafe { ib::ibv_free_device_list(self.list) };
    }
}

fn dev_name(d: *mut ib::ibv_device) -> String {
    // SAFETY: `d` is a live device of the list; its name is a NUL-terminated string.
    unsafe { CStr::from_ptr(ib::ibv_get_device_name(d)) }
        .to_string_lossy()
        .into_owned()
}

/// An open device context, closed on drop unless handed to a [`Pd`].
struct Ctx(*mut ib::ibv_context);

impl Drop for Ctx {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: opened by ibv_open_device, closed once.
            unsafe { ib::ibv_close_device(self.0) };
        }
    }
}

fn query_port(ctx: *mut ib::ibv_context, port: u8) -> Result<ib::ibv_port_attr> {
    // SAFETY: ibv_port_attr is plain data: all-zero is a valid value.
    let mut attr: ib::ibv_port_attr = unsafe { std::mem::zeroed() };
    // SAFETY: `ctx` is open; `attr` is a live out-struct of the installed headers' size
    // (rdma-sys is bindgen of those headers), which is what the provider's op is told.
    let rc = unsafe { ib::___ibv_query_port(ctx, port, &mut attr) };
    if rc != 0 {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "verbs: port {port}: ibv_query_port: {}",
                std::io::Error::from_raw_os_error(rc)
            ),
        ));
    }
    Ok(attr)
}

/// The GID type from sysfs (`<ibdev>/ports/<port>/gid_attrs/types/<index>`), which is
/// what libibverbs' own `ibv_query_gid_type` reads: "RoCE v2", "IB/RoCE v1".
fn gid_type(dev: *mut ib::ibv_device, port: u8, index: u8) -> std::result::Result<String, String> {
    // SAFETY: `dev` is a live device; ibdev_path is a NUL-terminated array in it.
    let path = unsafe { CStr::from_ptr((*dev).ibdev_path.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    let f = format!("{path}/ports/{port}/gid_attrs/types/{index}");
    std::fs::read_to_string(&f)
        .map(|s| s.trim().to_string())
        .map_err(|e| format!("{f}: {e}"))
}

/// Opens the device the settings name (or the first with `port` active), checks port,
/// GID and limits, and allocates the PD.
pub fn open(s: &Settings) -> Result<Opened> {
    let list = DeviceList::get()?;
    let names: Vec<String> = list.devices().map(dev_name).collect();
    if names.is_empty() {
        return Err(Error::new(
            ErrorKind::Unsupported,
            "verbs: no RDMA devices (ibv_get_device_list lists none)",
        ));
    }
    let mut why_not = Vec::new();
    let mut chosen = None;
    for (d, name) in list.devices().zip(&names) {
        if !s.device.is_empty() && *name != s.device {
            continue;
        }
        // SAFETY: `d` is a live device of the list.
        let ctx = Ctx(unsafe { ib::ibv_open_device(d) });
        if ctx.0.is_null() {
            why_not.push(format!(
                "{name}: ibv_open_device: {}",
                std::io::Error::last_os_error()
            ));
            continue;
        }
        match query_port(ctx.0, s.port) {
            Ok(a) if a.state == ib::ibv_port_state::IBV_PORT_ACTIVE => {
                chosen = Some((d, name.clone(), ctx, a));
                break;
            }
            Ok(a) => why_not.push(format!(
                "{name}: port {} is not active (state {})",
                s.port, a.state
            )),
            Err(e) => why_not.push(format!("{name}: {}", e.message())),
        }
    }
    let Some((dev, name, ctx, port)) = chosen else {
        let which = if s.device.is_empty() {
            format!("no device has port {} active", s.port)
        } else if !names.contains(&s.device) {
            format!("device={:?} not found", s.device)
        } else {
            format!("device {} unusable", s.device)
        };
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "verbs: {which} (devices: {}{}{})",
                names.join(", "),
                if why_not.is_empty() { "" } else { "; " },
                why_not.join("; ")
            ),
        ));
    };
    if port.link_layer != LINK_LAYER_ETHERNET {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "verbs: {name} port {}: link layer {} is not Ethernet: rdmx speaks RoCEv2 only \
                 (InfiniBand fabrics need LIDs and a subnet manager)",
                s.port, port.link_layer
            ),
        ));
    }
    if i32::from(s.gid_index) >= port.gid_tbl_len {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "verbs: gid_index={}: {name} port {} has {} GID entries",
                s.gid_index, s.port, port.gid_tbl_len
            ),
        ));
    }
    // SAFETY: ibv_gid is plain data.
    let mut gid: ib::ibv_gid = unsafe { std::mem::zeroed() };
    // SAFETY: the context is open; `gid` is a live out-parameter of the C type's layout.
    let rc = unsafe { ib::ibv_query_gid(ctx.0, s.port, i32::from(s.gid_index), &mut gid) };
    if rc != 0 {
        return Err(os_err(&format!(
            "{name} port {} gid_index={}: ibv_query_gid",
            s.port, s.gid_index
        )));
    }
    // SAFETY: every bit pattern is a valid [u8; 16].
    let raw = unsafe { gid.raw };
    let gid_addr = Ipv6Addr::from(raw);
    if raw == [0u8; 16] {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "verbs: {name} port {} GID[{}] is empty (no address on the port's netdev for \
                 that index): choose another gid_index (show_gids lists them)",
                s.port, s.gid_index
            ),
        ));
    }
    match gid_type(dev, s.port, s.gid_index) {
        Ok(t) if t == "RoCE v2" => {}
        Ok(t) => {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "verbs: {name} port {} GID[{}] {gid_addr} is of type {t:?}, not \"RoCE v2\": \
                     rdmx speaks RoCEv2 only; choose the RoCE v2 entry of the same address \
                     (usually the next index; show_gids lists them)",
                    s.port, s.gid_index
                ),
            ));
        }
        Err(e) => {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "verbs: {name} port {} GID[{}]: cannot read its type ({e}); rdmx needs a \
                     RoCE v2 GID",
                    s.port, s.gid_index
                ),
            ));
        }
    }
    // SAFETY: ibv_device_attr is plain data.
    let mut da: ib::ibv_device_attr = unsafe { std::mem::zeroed() };
    // SAFETY: open context, live out-struct.
    if unsafe { ib::ibv_query_device(ctx.0, &mut da) } != 0 {
        return Err(os_err(&format!("{name}: ibv_query_device")));
    }
    let clamp8 = |v: i32| u8::try_from(v.max(0)).unwrap_or(u8::MAX);
    let limits = Limits {
        max_qp_wr: da.max_qp_wr.max(0) as u32,
        max_sge: da.max_sge.max(0) as u32,
        max_cqe: da.max_cqe.max(0) as u32,
        max_qp_rd_atom: clamp8(da.max_qp_rd_atom),
        max_qp_init_rd_atom: clamp8(da.max_qp_init_rd_atom),
        mw_type2: da.max_mw > 0
            && da.device_cap_flags
                & (ib::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2A.0
                    | ib::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B.0)
                != 0,
    };
    check_limits(s, &name, &limits)?;
    // SAFETY: open context.
    let pd = unsafe { ib::ibv_alloc_pd(ctx.0) };
    if pd.is_null() {
        return Err(os_err(&format!("{name}: ibv_alloc_pd")));
    }
    let raw_ctx = ctx.0;
    std::mem::forget(ctx);
    let opened = Opened {
        pd: Arc::new(Pd { ctx: raw_ctx, pd }),
        name,
        port: s.port,
        gid_index: s.gid_index,
        gid: gid_addr,
        active_mtu: mtu_bytes(port.active_mtu),
        limits,
    };
    log::info!(target: "rdmx::verbs", "verbs: opened {}; limits {:?}", opened.describe(), limits);
    Ok(opened)
}

/// The configuration against the device's limits: a NIC refuses a QP or CQ above them, so
/// say which knob and which limit before any connection is tried.
pub fn check_limits(s: &Settings, name: &str, l: &Limits) -> Result<()> {
    let mut over = Vec::new();
    let mut check = |key: &str, v: u32, limit: u32, lname: &str| {
        if v > limit {
            over.push(format!("{key}={v} exceeds {lname}={limit}"));
        }
    };
    check("max_send_wr", s.max_send_wr, l.max_qp_wr, "max_qp_wr");
    check("max_recv_wr", s.max_recv_wr, l.max_qp_wr, "max_qp_wr");
    check("max_send_sge", s.max_send_sge, l.max_sge, "max_sge");
    check("max_recv_sge", s.max_recv_sge, l.max_sge, "max_sge");
    match s.cq_layout() {
        crate::config::CqLayout::Separate { send, recv } => {
            check("send_cq_size", send, l.max_cqe, "max_cqe");
            check("recv_cq_size", recv, l.max_cqe, "max_cqe");
        }
        crate::config::CqLayout::Shared { size } => {
            check("send_cq_size (shared CQ)", size, l.max_cqe, "max_cqe")
        }
    }
    if over.is_empty() {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("verbs: device {name}: {}", over.join("; ")),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_conversions() {
        for (e, b) in [(1, 256), (2, 512), (3, 1024), (4, 2048), (5, 4096)] {
            assert_eq!(mtu_bytes(e), b);
            assert_eq!(mtu_enum(b), e);
        }
        assert_eq!(mtu_bytes(0), 0);
        assert_eq!(mtu_enum(1500), ib::ibv_mtu::IBV_MTU_1024);
    }

    #[test]
    fn limits_name_the_knob_and_the_limit() {
        let mut c = crate::config::Config::new();
        c.set("max_send_wr", "4096").unwrap();
        c.set("max_send_sge", "8").unwrap();
        let s = c.settings().unwrap();
        let l = Limits {
            max_qp_wr: 1024,
            max_sge: 4,
            max_cqe: 1 << 20,
            max_qp_rd_atom: 16,
            max_qp_init_rd_atom: 16,
            mw_type2: false,
        };
        let e = check_limits(&s, "mlx5_0", &l).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(
            e.message()
                .contains("max_send_wr=4096 exceeds max_qp_wr=1024"),
            "{e}"
        );
        assert!(
            e.message().contains("max_send_sge=8 exceeds max_sge=4"),
            "{e}"
        );
        let l2 = Limits {
            max_qp_wr: 1 << 15,
            max_sge: 30,
            ..l
        };
        check_limits(&s, "mlx5_0", &l2).unwrap();
    }
}
