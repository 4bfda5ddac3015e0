//! From both hellos to the parameters the local QP is brought to RTR/RTS with, and what
//! this side offers: its path MTU (capped by the route's link) and a random start PSN.

use std::hash::{BuildHasher, RandomState};
use std::io;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::time::Instant;

use super::*;
use crate::error::{Error, ErrorKind, Result};
use crate::provider::mtu;
use crate::provider::types::Remote;

/// The parameters the local QP is brought to RTR/RTS with, from both hellos.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// The smaller of the two MTUs: both ends of an RC connection must use the same one.
    pub path_mtu: u32,
    /// Mine, at most the peer's `max_dest_rd_atomic`.
    pub max_rd_atomic: u8,
    /// Mine, as offered.
    pub max_dest_rd_atomic: u8,
    /// My PSN: where my requester starts.
    pub sq_psn: u32,
    /// The peer's PSN: what my responder expects first.
    pub rq_psn: u32,
    /// The peer's QP number.
    pub dest_qpn: u32,
    /// Where to send RoCEv2 packets for the peer.
    pub peer_udp: SocketAddr,
    /// The UDP source port the peer's RC packets come from, if its hello said.
    pub peer_src_port: Option<u16>,
    /// Memory the peer exposes.
    pub peer_regions: Vec<Region>,
    /// Receive credits the peer grants.
    pub peer_credits: u32,
}

impl Negotiated {
    /// What the provider's `connect` takes (the QP's part of the negotiation).
    pub fn remote(&self) -> Remote {
        Remote {
            dest_qpn: self.dest_qpn,
            peer_udp: self.peer_udp,
            peer_src_port: self.peer_src_port,
            sq_psn: self.sq_psn,
            rq_psn: self.rq_psn,
            path_mtu: self.path_mtu,
            max_rd_atomic: self.max_rd_atomic,
            max_dest_rd_atomic: self.max_dest_rd_atomic,
        }
    }
}

/// A random 24-bit start PSN.
///
/// Random start PSNs (as `ibv_rc_pingpong` and Ceph use) make it unlikely that late packets
/// of an earlier QP with the same number fall into the new QP's PSN window.
pub fn random_psn() -> u32 {
    match crate::provider::sys::try_random_u32() {
        Ok(v) => v & MASK_24,
        // Neither getrandom(2) nor /dev/urandom (the error is logged there): a PSN needs to
        // be unpredictable across QPs, not secret, so std's per-process random hash keys
        // are enough.
        Err(_) => RandomState::new().hash_one(Instant::now()) as u32 & MASK_24,
    }
}

/// Where to send UDP packets for a peer that advertised `advertised`: its own IP, unless it
/// is unspecified (a soft provider bound to `0.0.0.0`/`::` does not know which of its
/// addresses the peer can reach), then the IP the TCP connection came from.
///
/// The TCP IP is canonicalized first, so a dual-stack listener's `::ffff:a.b.c.d` becomes
/// plain IPv4 and matches an IPv4-only UDP socket.
pub fn peer_udp_addr(advertised: SocketAddr, peer_tcp_ip: IpAddr) -> SocketAddr {
    if advertised.ip().is_unspecified() {
        SocketAddr::new(peer_tcp_ip.to_canonical(), advertised.port())
    } else {
        advertised
    }
}

/// Computes what my QP is configured with from my hello, the peer's and the IP its TCP
/// connection came from.
///
/// - `path_mtu`: the smaller MTU, since both ends must agree and each supports only up to its
///   own.
/// - `max_rd_atomic`: min(mine, the peer's `max_dest_rd_atomic`). The IBTA expects an
///   initiator's depth (READs/atomics it has outstanding) to be at most the responder's
///   resources for them, as the CM's initiator_depth/responder_resources exchange enforces.
///   A responder that runs out may NAK Invalid Request (QP to error); rxe instead recycles its
///   oldest saved resource, so a retried READ whose resource was recycled is silently dropped.
///   A result of 0 means the peer accepts no READs or atomics at all.
/// - `max_dest_rd_atomic`: mine as offered; it sizes my responder's resources, and the peer
///   caps its own initiator depth by it.
/// - `peer_udp`: see [`peer_udp_addr`].
///
/// Errors: [`ErrorKind::InvalidArgument`] when `mine` is invalid, [`ErrorKind::Conflict`] when
/// the major versions differ (a decoded peer hello cannot, but a hand-built one can), and
/// [`ErrorKind::Parse`] when `peer` is otherwise invalid (it came off the wire).
pub fn negotiate(mine: &Hello, peer: &Hello, peer_tcp_ip: IpAddr) -> Result<Negotiated> {
    mine.validate()?;
    let (my_major, peer_major) = (mine.version >> 8, peer.version >> 8);
    if my_major != peer_major {
        return Err(Error::new(
            ErrorKind::Conflict,
            format!(
                "incompatible protocol versions: mine {}.{}, peer's {}.{}; the major versions \
                 must match",
                my_major, mine.version as u8, peer_major, peer.version as u8
            ),
        ));
    }
    peer.check()
        .map_err(|m| Error::new(ErrorKind::Parse, format!("peer's {m}")))?;
    check_interop(mine, peer)?;
    Ok(Negotiated {
        path_mtu: mine.path_mtu.min(peer.path_mtu),
        max_rd_atomic: mine.max_rd_atomic.min(peer.max_dest_rd_atomic),
        max_dest_rd_atomic: mine.max_dest_rd_atomic,
        sq_psn: mine.psn,
        rq_psn: peer.psn,
        dest_qpn: peer.qpn,
        peer_udp: peer_udp_addr(peer.udp, peer_tcp_ip),
        peer_src_port: peer.src_port,
        peer_regions: peer.regions.clone(),
        peer_credits: peer.credits,
    })
}

/// A soft side and a verbs side speak the same RoCEv2 on the wire, so they interoperate
/// when every packet reaches its receiver: a verbs QP (a NIC) sends only to UDP port 4791,
/// so the soft side must listen there (`soft_port = 4791`, the default). Otherwise both
/// sides refuse, each saying what to change, rather than connect and time out.
fn check_interop(mine: &Hello, peer: &Hello) -> Result<()> {
    let my_roce = mine.flags & FLAG_ROCE != 0;
    let peer_roce = peer.flags & FLAG_ROCE != 0;
    if my_roce && !peer_roce && peer.udp.port() != ROCEV2_PORT {
        return Err(Error::new(
            ErrorKind::Conflict,
            format!(
                "provider mismatch: the peer runs the soft provider on UDP port {}, this side \
                 runs provider=verbs, whose device sends RoCEv2 to port {ROCEV2_PORT} only: set \
                 soft_port={ROCEV2_PORT} on the peer (its default), or provider=soft here",
                peer.udp.port()
            ),
        ));
    }
    if !my_roce && peer_roce && mine.udp.port() != ROCEV2_PORT {
        return Err(Error::new(
            ErrorKind::Conflict,
            format!(
                "provider mismatch: the peer runs provider=verbs, whose device sends RoCEv2 to \
                 UDP port {ROCEV2_PORT} only, but this soft provider listens on port {}: set \
                 soft_port={ROCEV2_PORT} here (the default), or provider=soft on the peer",
                mine.udp.port()
            ),
        ));
    }
    Ok(())
}

/// The path MTU this side offers in its hello on the side channel `stream`: the configured
/// `path_mtu`, capped by the active MTU of the link that routes to the peer (see
/// [`crate::provider::mtu`]), as a NIC's port caps a QP at its active MTU.
///
/// The link MTU is the route's (`IP_MTU`/`IPV6_MTU`) of the connected TCP socket: the soft
/// provider advertises a wildcard UDP address, so RoCE packets go to the IP the side channel
/// connects (the same route), and the socket lives in the connection's network namespace
/// whichever thread asks. Should the socket have no route cached, a UDP probe socket
/// connected to the peer's IP answers instead.
///
/// A configured value above the active one is clamped, with an info line naming the
/// configured value, the link MTU, the route and the value used; not refused, since the
/// configuration is per library and the link per connection. Both sides offer their own
/// value and [`negotiate`] takes the smaller, so a link that differs at each end is covered.
///
/// Errors: [`ErrorKind::Unsupported`] when the link cannot carry 256-byte packets,
/// [`ErrorKind::Io`] when neither the socket nor the probe yields the route's MTU.
pub fn offered_path_mtu(stream: &TcpStream, configured: u32) -> Result<mtu::PathMtu> {
    let side = |e: io::Error| Error::new(ErrorKind::Io, format!("side channel: {e}"));
    let peer = stream.peer_addr().map_err(side)?;
    let local = stream.local_addr().map_err(side)?;
    let peer_ip = peer.ip().to_canonical();
    let ipv6 = peer_ip.is_ipv6();
    let (link, local_ip) = match mtu::route_mtu_of(stream.as_fd(), local.is_ipv6()) {
        Ok(m) => (m, local.ip()),
        Err(first) => mtu::route_mtu(peer_ip).map_err(|e| {
            Error::new(
                ErrorKind::Io,
                format!(
                    "path MTU: the route to {peer_ip}: no MTU from the side channel ({first}) \
                     nor from a UDP probe ({e})"
                ),
            )
        })?,
    };
    let route = mtu::describe_route(peer_ip, local_ip);
    let p = mtu::choose(configured, link, ipv6, &route)?;
    if p.clamped() {
        log::info!(
            target: "rdmx::msgr",
            "path_mtu {configured} (configured) clamped to {} for the route {route}: link MTU \
             {link}, and {configured}-byte packets need {} bytes with {} UDP and RoCE headers",
            p.offered,
            mtu::frame_len(configured, ipv6),
            if ipv6 { "IPv6," } else { "IPv4," }
        );
    }
    Ok(p)
}
