//! The UDP port of a peer's RoCEv2 receiver. Normally every rdmx process receives on
//! `soft_port` (4791, RoCEv2's), so a GID (an IP) is enough to reach a QP, as on a NIC.
//! With `soft_port = 0` (any free port: several processes sharing one address, as
//! rdma-core's connection-manager tests fork them) a GID is not enough; the connection
//! manager then tells this table which port the peer's QP listens on (its REQ/REP carry
//! it), and RTR (RC) and UD sends look the peer up here. Without an entry: `soft_port`,
//! or with `soft_port = 0` this device's own port (the peer is in this process).

use super::device::Device;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

/// At most this many peers are remembered (the oldest connection's entry goes first).
const MAX: usize = 4096;

struct Table {
    ports: HashMap<(IpAddr, u32), u16>,
    order: std::collections::VecDeque<(IpAddr, u32)>,
}

static USED: AtomicBool = AtomicBool::new(false);

fn table() -> &'static Mutex<Table> {
    static T: OnceLock<Mutex<Table>> = OnceLock::new();
    T.get_or_init(|| {
        Mutex::new(Table {
            ports: HashMap::new(),
            order: std::collections::VecDeque::new(),
        })
    })
}

/// The connection manager learnt that QP `qpn` at `ip` receives on UDP `port`.
pub fn learn(ip: IpAddr, qpn: u32, port: u16) {
    if port == 0 {
        return;
    }
    let key = (ip.to_canonical(), qpn & 0xff_ffff);
    let mut t = table().lock();
    if t.ports.insert(key, port).is_none() {
        t.order.push_back(key);
        if t.order.len() > MAX
            && let Some(old) = t.order.pop_front()
        {
            t.ports.remove(&old);
        }
    }
    USED.store(true, Ordering::Release);
}

fn lookup(ip: IpAddr, qpn: u32) -> Option<u16> {
    if !USED.load(Ordering::Acquire) {
        return None;
    }
    table()
        .lock()
        .ports
        .get(&(ip.to_canonical(), qpn & 0xff_ffff))
        .copied()
}

/// The port of a peer nothing was learnt about.
pub fn default_port(dev: &Device, ip: IpAddr) -> u16 {
    match dev.settings().soft_port {
        0 => dev.soft.udp_addr_for(ip).map_or(0, |a| a.port()),
        p => p,
    }
}

/// Where QP `qpn` at `ip` receives.
pub fn peer(dev: &Device, ip: IpAddr, qpn: u32) -> SocketAddr {
    SocketAddr::new(ip, lookup(ip, qpn).unwrap_or_else(|| default_port(dev, ip)))
}

/// A UD destination (`ah_dest`, from the AH) for QP `qpn`: the learnt port if any.
pub fn ud_dest(ah_dest: SocketAddr, qpn: u32) -> SocketAddr {
    match lookup(ah_dest.ip(), qpn) {
        Some(p) => SocketAddr::new(ah_dest.ip(), p),
        None => ah_dest,
    }
}

/// This device's receiving port for peers of `ip`'s family (what the connection manager
/// tells its peers).
pub fn own_port(dev: &Device, ip: IpAddr) -> u16 {
    dev.soft.udp_addr_for(ip).map_or(0, |a| a.port())
}
