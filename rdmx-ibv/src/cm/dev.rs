//! The device the connection manager binds ids to, and socket-address helpers.
//!
//! librdmacm opens every verbs device once per process and gives each id the context of
//! the device owning its address. Under `rdmx-ibv exec` there is one device, rdmx0, with
//! one GID (index 0): the RoCEv2 GID of the process's address. Its context is opened at
//! the first call that needs it and stays open for the life of the process, as
//! librdmacm's do.

use rdma_sys::{ibv_context, ibv_device_attr, ibv_gid, ibv_pd, ibv_port_attr};
use std::ffi::{CStr, c_int};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::OnceLock;

/// What the connection manager needs of rdmx0.
pub struct Dev {
    pub ctx: *mut ibv_context,
    pub gid: [u8; 16],
    /// The address of GID 0 (IPv4-mapped GIDs as IPv4).
    pub ip: IpAddr,
    /// The port's active MTU (`enum ibv_mtu`).
    pub mtu: u8,
    /// `max_qp_rd_atom` / `max_qp_init_rd_atom`: librdmacm's `max_responder_resources`
    /// and `max_initiator_depth`.
    pub max_resp_res: u8,
    pub max_init_depth: u8,
    /// The PD librdmacm gives every id bound to the device (`cma_dev->pd`): `id->pd`
    /// for `rdma_create_qp`/`rdma_create_ep` without a PD of the program's.
    pub pd: *mut ibv_pd,
    /// The UDP port rdmx0's QPs receive on (told to peers: `verbs::peer_port`).
    pub udp_port: u16,
}

// SAFETY: the context pointer is only handed to libibverbs, whose calls are thread-safe.
unsafe impl Send for Dev {}
// SAFETY: as above; the other fields are plain data.
unsafe impl Sync for Dev {}

/// rdmx0 of this process, opened once; an errno when there is none.
pub fn dev() -> Result<&'static Dev, c_int> {
    static DEV: OnceLock<Result<Dev, c_int>> = OnceLock::new();
    DEV.get_or_init(open).as_ref().map_err(|e| *e)
}

fn open() -> Result<Dev, c_int> {
    let mut n: c_int = 0;
    // SAFETY: libibverbs call with a valid out-pointer; the list is freed below.
    let list = unsafe { rdma_sys::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(libc::ENODEV);
    }
    let mut ctx: *mut ibv_context = std::ptr::null_mut();
    for i in 0..n.max(0) as usize {
        // SAFETY: the list holds n valid device pointers.
        let d = unsafe { *list.add(i) };
        // SAFETY: d is a listed device; the name is a NUL-terminated string it owns.
        let name = unsafe { CStr::from_ptr(rdma_sys::ibv_get_device_name(d)) };
        if name
            .to_bytes()
            .starts_with(crate::glue::IBDEV_PREFIX.as_bytes())
        {
            // SAFETY: d is a listed device.
            ctx = unsafe { rdma_sys::ibv_open_device(d) };
            break;
        }
    }
    // SAFETY: the list came from ibv_get_device_list; opened contexts stay valid.
    unsafe { rdma_sys::ibv_free_device_list(list) };
    if ctx.is_null() {
        return Err(libc::ENODEV);
    }
    // SAFETY: zeroed C structures filled by libibverbs for the open context.
    let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { rdma_sys::ibv_query_gid(ctx, 1, 0, &mut gid) } != 0 {
        return Err(libc::ENODEV);
    }
    // SAFETY: as above.
    let mut port: ibv_port_attr = unsafe { std::mem::zeroed() };
    // SAFETY: as above (the exported ibv_query_port@IBVERBS_1.1 fills the v44 layout).
    if unsafe { rdma_sys::ibv_query_port(ctx, 1, &mut port as *mut _ as *mut _) } != 0 {
        return Err(libc::ENODEV);
    }
    // SAFETY: as above.
    let mut da: ibv_device_attr = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { rdma_sys::ibv_query_device(ctx, &mut da) } != 0 {
        return Err(libc::ENODEV);
    }
    // SAFETY: as above.
    let pd = unsafe { rdma_sys::ibv_alloc_pd(ctx) };
    if pd.is_null() {
        return Err(libc::ENOMEM);
    }
    // SAFETY: ibv_gid is a union of a 16-byte array and two u64.
    let raw = unsafe { gid.raw };
    // SAFETY: ctx is an open rdmx0 context.
    let udp_port = unsafe { crate::glue::context::device_of(ctx) }
        .map(|d| crate::verbs::peer_port::own_port(&d, gid_ip(&raw)))
        .unwrap_or(0);
    Ok(Dev {
        ctx,
        gid: raw,
        ip: gid_ip(&raw),
        mtu: port.active_mtu as u8,
        max_resp_res: da.max_qp_rd_atom.clamp(0, 255) as u8,
        max_init_depth: da.max_qp_init_rd_atom.clamp(0, 255) as u8,
        pd,
        udp_port,
    })
}

/// The IP address a RoCEv2 GID stands for.
pub fn gid_ip(gid: &[u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(*gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// The RoCEv2 GID of an IP address.
pub fn ip_gid(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// A socket address from C (`AF_INET`, `AF_INET6`); None for NULL or another family.
///
/// # Safety
/// `sa` is NULL or points to a socket address of its family's size.
pub unsafe fn from_c(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller's promise; the family decides how much is read.
    unsafe {
        match (*sa).sa_family as c_int {
            libc::AF_INET => {
                let s = &*(sa as *const libc::sockaddr_in);
                Some(SocketAddr::new(
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr))),
                    u16::from_be(s.sin_port),
                ))
            }
            libc::AF_INET6 => {
                let s = &*(sa as *const libc::sockaddr_in6);
                Some(SocketAddr::new(
                    IpAddr::V6(Ipv6Addr::from(s.sin6_addr.s6_addr)),
                    u16::from_be(s.sin6_port),
                ))
            }
            _ => None,
        }
    }
}

/// Writes `a` as a C socket address into `out` (a `sockaddr_storage`'s room).
pub fn to_c(a: SocketAddr, out: &mut libc::sockaddr_storage) {
    // SAFETY: sockaddr_storage is plain data, large enough for both families.
    unsafe {
        *out = std::mem::zeroed();
        match a {
            SocketAddr::V4(v4) => {
                let s = &mut *(out as *mut _ as *mut libc::sockaddr_in);
                s.sin_family = libc::AF_INET as _;
                s.sin_port = v4.port().to_be();
                s.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            }
            SocketAddr::V6(v6) => {
                let s = &mut *(out as *mut _ as *mut libc::sockaddr_in6);
                s.sin6_family = libc::AF_INET6 as _;
                s.sin6_port = v6.port().to_be();
                s.sin6_addr.s6_addr = v6.ip().octets();
                s.sin6_scope_id = v6.scope_id();
            }
        }
    }
}

/// The C size of a socket address of `a`'s family.
pub fn c_len(a: SocketAddr) -> libc::socklen_t {
    (match a {
        SocketAddr::V4(_) => std::mem::size_of::<libc::sockaddr_in>(),
        SocketAddr::V6(_) => std::mem::size_of::<libc::sockaddr_in6>(),
    }) as libc::socklen_t
}

/// Whether two addresses are the same IP (an IPv4-mapped IPv6 address equals its IPv4).
pub fn same_ip(a: IpAddr, b: IpAddr) -> bool {
    a.to_canonical() == b.to_canonical()
}

/// Whether `ip` may name rdmx0: its own address, or another address of the network
/// interface holding it (rxe's GID table lists every address of its netdev; rdmx0's has
/// one GID, and a program binding another address of that interface, as rdma-core's
/// tests bind the interface's first address, still means this device). Loopback
/// addresses all belong to `lo`.
pub fn names_device(ip: IpAddr, dev_ip: IpAddr) -> bool {
    if same_ip(ip, dev_ip) {
        return true;
    }
    let (ip, dev_ip) = (ip.to_canonical(), dev_ip.to_canonical());
    if ip.is_loopback() && dev_ip.is_loopback() {
        return true;
    }
    let ifs = interfaces();
    let holder = |a: IpAddr| {
        ifs.iter()
            .find(|(_, net, len)| in_prefix(a, *net, *len))
            .map(|(name, _, _)| name.clone())
    };
    matches!((holder(ip), holder(dev_ip)), (Some(a), Some(b)) if a == b)
}

fn in_prefix(a: IpAddr, net: IpAddr, len: u32) -> bool {
    match (a, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let m = if len == 0 {
                0
            } else {
                u32::MAX << (32 - len.min(32))
            };
            u32::from(a) & m == u32::from(n) & m
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let m = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len.min(128))
            };
            u128::from(a) & m == u128::from(n) & m
        }
        _ => false,
    }
}

/// (interface, address, prefix length) of every address of the host (this namespace).
fn interfaces() -> Vec<(String, IpAddr, u32)> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs with a valid out-pointer; the list is freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut p = head;
    while !p.is_null() {
        // SAFETY: p walks the list getifaddrs returned.
        let i = unsafe { &*p };
        // SAFETY: ifa_addr/ifa_netmask are NULL or socket addresses of their family.
        if let (Some(a), Some(m)) = unsafe { (from_c(i.ifa_addr), from_c(i.ifa_netmask)) } {
            let len = match m.ip() {
                IpAddr::V4(v) => u32::from(v).count_ones(),
                IpAddr::V6(v) => u128::from(v).count_ones(),
            };
            // SAFETY: ifa_name is a NUL-terminated string of the list.
            let name = unsafe { CStr::from_ptr(i.ifa_name) }
                .to_string_lossy()
                .into_owned();
            out.push((name, a.ip(), len));
        }
        p = i.ifa_next;
    }
    // SAFETY: the list came from getifaddrs.
    unsafe { libc::freeifaddrs(head) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gids_and_c_addresses_round_trip() {
        let ip: IpAddr = "127.0.0.9".parse().unwrap();
        assert_eq!(gid_ip(&ip_gid(ip)), ip);
        let v6: IpAddr = "fd00::5".parse().unwrap();
        assert_eq!(gid_ip(&ip_gid(v6)), v6);
        for a in ["127.0.0.9:7174", "[fd00::5]:18515"] {
            let a: SocketAddr = a.parse().unwrap();
            // SAFETY: plain data.
            let mut s: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            to_c(a, &mut s);
            // SAFETY: s holds a socket address of a's family.
            assert_eq!(unsafe { from_c(&s as *const _ as *const _) }, Some(a));
        }
    }
}
