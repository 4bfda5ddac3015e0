//! The device's receiving UDP ports (one per IP family): which addresses peers send to,
//! which port serves an address's family, and the MTU of the link or route behind them.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::AtomicUsize;

use super::super::mtu;
use super::super::udp::UdpPort;
use super::{Shared, SoftDevice};
use crate::error::{Error, ErrorKind, Result};

/// A receiving UDP port (one per IP family) and how many QPs of its family exist: a port
/// without QPs is not polled, so an unused family costs no syscalls.
pub(super) struct RxPort {
    pub(super) sock: UdpPort,
    pub(super) qps: AtomicUsize,
}

impl SoftDevice {
    /// The UDP address peers send to: the first port's (IPv4 unless the device was opened
    /// for IPv6 only).
    pub fn udp_addr(&self) -> SocketAddr {
        self.shared.ports[0].sock.local_addr()
    }

    /// The UDP address peers of this family send to, if the device has a port for it.
    pub fn udp_addr_for(&self, ip: IpAddr) -> Option<SocketAddr> {
        self.shared
            .port_for(ip)
            .map(|i| self.shared.ports[i].sock.local_addr())
    }

    /// Every receiving UDP address (one per family).
    pub fn udp_addrs(&self) -> Vec<SocketAddr> {
        self.shared
            .ports
            .iter()
            .map(|p| p.sock.local_addr())
            .collect()
    }

    /// The active MTU (IB MTU bytes, 256..4096) of the link that holds the device's first
    /// address, as a NIC port reports it: the interface that has the address (its MTU in
    /// `/sys/class/net`), else the route to the address itself (loopback: 4096). 1024 when
    /// neither says (the smallest common link, 1500 bytes).
    pub fn port_active_mtu(&self) -> u32 {
        let ip = self.udp_addr().ip();
        let v6 = ip.to_canonical().is_ipv6();
        let link = mtu::interface_of(ip)
            .and_then(|dev| std::fs::read_to_string(format!("/sys/class/net/{dev}/mtu")).ok())
            .and_then(|t| t.trim().parse::<u32>().ok())
            .or_else(|| mtu::route_mtu(ip).ok().map(|(m, _)| m));
        link.and_then(|l| mtu::active_mtu(l, v6)).unwrap_or(1024)
    }

    /// The active MTU (IB MTU bytes) of the route to `peer`: what a connection to it may
    /// use at most. Unsupported when the link cannot carry even 256-byte packets; Io when
    /// there is no route.
    pub fn route_active_mtu(&self, peer: IpAddr) -> Result<u32> {
        let (link, local) = mtu::route_mtu(peer)
            .map_err(|e| Error::new(ErrorKind::Io, format!("path MTU: no route to {peer}: {e}")))?;
        let route = mtu::describe_route(peer, local);
        mtu::choose(4096, link, peer.to_canonical().is_ipv6(), &route).map(|p| p.active)
    }
}

impl Shared {
    /// Index of the receiving port for `ip`'s family.
    pub(super) fn port_for(&self, ip: IpAddr) -> Option<usize> {
        let v4 = ip.to_canonical().is_ipv4();
        self.ports
            .iter()
            .position(|p| p.sock.local_addr().is_ipv4() == v4)
    }
}
