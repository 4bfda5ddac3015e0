//! The fake sysfs tree libibverbs reads when it falls back from netlink to sysfs
//! (`SYSFS_PATH`): the uverbs device `uverbs0` of the ibdev `rdmx0`, its node
//! attributes, and port 1 with one GID (index 0, the RoCEv2 GID of the address) and one
//! P_Key. `ibv_query_gid`, `ibv_query_gid_type` and `ibv_query_pkey` read these files.

use std::net::IpAddr;
use std::path::Path;

/// The files of the tree: (path relative to the sysfs root, content).
#[derive(Debug, Clone)]
pub struct Tree {
    pub files: Vec<(String, String)>,
}

/// The RoCEv2 GID of `ip`: IPv4-mapped (`::ffff:a.b.c.d`) for IPv4, the address itself
/// for IPv6.
pub fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// A GID as sysfs prints it: eight groups of four hex digits.
pub fn gid_text(gid: &[u8; 16]) -> String {
    gid.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// The node GUID shown in sysfs (`ibv_devices`, `ibv_get_device_guid`): the same as
/// `ibv_query_device` reports (`verbs::Device`): 0x02 (locally administered), 'r', 'x',
/// then the IPv4 address (a zero byte first) or the last 5 bytes of the IPv6 address.
pub fn node_guid(ip: IpAddr) -> u64 {
    let tail: [u8; 5] = match ip {
        IpAddr::V4(a) => {
            let o = a.octets();
            [0, o[0], o[1], o[2], o[3]]
        }
        IpAddr::V6(a) => {
            let o = a.octets();
            [o[11], o[12], o[13], o[14], o[15]]
        }
    };
    u64::from_be_bytes([
        0x02, b'r', b'x', tail[0], tail[1], tail[2], tail[3], tail[4],
    ])
}

fn guid_text(guid: u64) -> String {
    let b = guid.to_be_bytes();
    b.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// The network interface holding `ip` (for `gid_attrs/ndevs/0`), if any.
pub fn netdev_of(ip: IpAddr) -> Option<String> {
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills ifap with a list we free below.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return None;
    }
    let mut found = None;
    let mut p = ifap;
    while !p.is_null() {
        // SAFETY: p is a node of the list getifaddrs returned.
        let ifa = unsafe { &*p };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr points to a sockaddr of the family it states.
            let addr = unsafe {
                match i32::from((*ifa.ifa_addr).sa_family) {
                    libc::AF_INET => {
                        let sin = &*ifa.ifa_addr.cast::<libc::sockaddr_in>();
                        Some(IpAddr::from(
                            u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
                        ))
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*ifa.ifa_addr.cast::<libc::sockaddr_in6>();
                        Some(IpAddr::from(sin6.sin6_addr.s6_addr))
                    }
                    _ => None,
                }
            };
            if addr == Some(ip) && !ifa.ifa_name.is_null() {
                // SAFETY: ifa_name is NUL-terminated.
                let n = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
                found = Some(n.to_string_lossy().into_owned());
                break;
            }
        }
        p = ifa.ifa_next;
    }
    // SAFETY: the list from getifaddrs, freed once.
    unsafe { libc::freeifaddrs(ifap) };
    // Every 127/8 address is on lo even when only 127.0.0.1 is configured on it.
    found.or_else(|| ip.is_loopback().then(|| "lo".to_string()))
}

impl Tree {
    /// The tree for a device on `ip` whose uverbs character device is `major:minor`.
    pub fn for_ip(ip: IpAddr) -> Tree {
        Tree::with_dev(ip, (1, 7))
    }

    pub fn with_dev(ip: IpAddr, dev: (u32, u32)) -> Tree {
        let ibdev = super::IBDEV;
        let d = format!("class/infiniband/{ibdev}");
        let p = format!("{d}/ports/1");
        let guid = guid_text(node_guid(ip));
        let mut files = vec![
            // Global uverbs ABI (libibverbs accepts 3..6) and the device's.
            ("class/infiniband_verbs/abi_version".into(), "6".into()),
            ("class/infiniband_verbs/uverbs0/ibdev".into(), ibdev.into()),
            (
                "class/infiniband_verbs/uverbs0/abi_version".into(),
                "1".into(),
            ),
            // Must be the major:minor of /dev/infiniband/uverbs0 (the bind of /dev/full).
            (
                "class/infiniband_verbs/uverbs0/dev".into(),
                format!("{}:{}", dev.0, dev.1),
            ),
            (format!("{d}/node_type"), "1: CA".into()),
            (format!("{d}/node_guid"), guid.clone()),
            (format!("{d}/sys_image_guid"), guid),
            (
                format!("{d}/fw_ver"),
                format!("rdmx {}", env!("CARGO_PKG_VERSION")),
            ),
            (format!("{d}/hca_type"), "rdmx-soft".into()),
            (format!("{d}/hw_rev"), "0".into()),
            (format!("{d}/board_id"), "RDMX_SOFT_ROCEV2".into()),
            (
                format!("{d}/node_desc"),
                format!("rdmx soft RoCEv2 on {ip}"),
            ),
            (format!("{p}/state"), "4: ACTIVE".into()),
            (format!("{p}/phys_state"), "5: LinkUp".into()),
            (format!("{p}/link_layer"), "Ethernet".into()),
            (format!("{p}/rate"), "25 Gb/sec (1X EDR)".into()),
            (format!("{p}/lid"), "0x0".into()),
            (format!("{p}/sm_lid"), "0x0".into()),
            (format!("{p}/lid_mask_count"), "0".into()),
            (format!("{p}/cap_mask"), "0x00010000".into()),
            (format!("{p}/pkeys/0"), "0xffff".into()),
            (format!("{p}/gids/0"), gid_text(&gid_of(ip))),
            (format!("{p}/gid_attrs/types/0"), "RoCE v2".into()),
        ];
        if let Some(n) = netdev_of(ip) {
            files.push((format!("{p}/gid_attrs/ndevs/0"), n));
        }
        Tree { files }
    }

    /// Writes the tree under `root` (directories made as needed).
    pub fn write(&self, root: &Path) -> std::io::Result<()> {
        for (rel, content) in &self.files {
            let path = root.join(rel);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&path, format!("{content}\n"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gid_zero_is_the_rocev2_gid_of_the_address() {
        let ip: IpAddr = "127.0.0.2".parse().unwrap();
        assert_eq!(
            gid_text(&gid_of(ip)),
            "0000:0000:0000:0000:0000:ffff:7f00:0002"
        );
        let t = Tree::for_ip(ip);
        let get = |k: &str| {
            t.files
                .iter()
                .find(|(p, _)| p.ends_with(k))
                .map(|(_, v)| v.clone())
        };
        assert_eq!(
            get("ports/1/gids/0").unwrap(),
            "0000:0000:0000:0000:0000:ffff:7f00:0002"
        );
        assert_eq!(get("gid_attrs/types/0").unwrap(), "RoCE v2");
        assert_eq!(get("gid_attrs/ndevs/0").unwrap(), "lo");
        assert_eq!(get("uverbs0/dev").unwrap(), "1:7");
        assert_ne!(node_guid(ip), node_guid("127.0.0.3".parse().unwrap()));
        let v6: IpAddr = "fd00::1".parse().unwrap();
        assert_eq!(
            gid_text(&gid_of(v6)),
            "fd00:0000:0000:0000:0000:0000:0000:0001"
        );
    }
}
