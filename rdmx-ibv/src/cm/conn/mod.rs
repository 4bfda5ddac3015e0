//! The connection threads: a listener's accept loop, the active side's connect, and one
//! reader per connection that turns the peer's messages (and its silence or its going
//! away) into events. Every wait is bounded: TCP connect [`CONNECT_TIMEOUT`], the
//! answer to a REQ and the RTU after a REP [`REPLY_TIMEOUT`], the DREP [`DREP_TIMEOUT`];
//! an idle connection whose peer host vanished fails by TCP keepalive and
//! `TCP_USER_TIMEOUT` within [`DEAD_PEER_TIMEOUT`]. A peer *process* that dies closes
//! its sockets, which its peer sees at once, as a kernel CM peer sees the DREQ or REJ
//! the kernel sends for a dying process's ids.

use super::dev::{self, Dev};
use super::id::{
    self, EV_CONNECT_REQUEST, EV_CONNECT_RESPONSE, EV_DISCONNECTED, EV_ESTABLISHED, EV_REJECTED,
    EV_UNREACHABLE, Id, PS_IB, St, State, Wait,
};
use super::wire::{Kind, Msg};
use crate::cm::chan::Fixup;
use rdma_sys::rdma_cm_event;
use std::ffi::c_int;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connect that finds no listener keeps trying before REJECTED ("invalid
/// service ID"). Programs sync over a channel of their own and then listen, racing the
/// peer's connect: perftest `-R` (4.5) does so between its two connections, and its retry
/// of that REJECTED is broken (it reuses the ids it destroyed), so a server descheduled
/// for a few ms on a busy host hung for ever (`ibv_cm_veth`, 4 of 67 runs beside two CPU
/// hogs). A real CM's REQ travels and is answered in microseconds while the passive side
/// calls `rdma_listen`; over TCP a refused connect is final at once, so it is retried.
pub const REFUSED_GRACE: Duration = Duration::from_millis(500);
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(20);
pub const DREP_TIMEOUT: Duration = Duration::from_secs(3);
pub const DEAD_PEER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an accepted TCP connection may take to send its REQ.
const FIRST_MESSAGE_TIMEOUT: Duration = Duration::from_secs(10);
/// The reader's wake-up interval, at which it checks deadlines.
const TICK: Duration = Duration::from_millis(200);

// IB CM reject reasons (IBA 12.6.7.2), as the kernel reports them in `event->status`.
pub const REJ_TIMEOUT: u8 = 1;
pub const REJ_INVALID_SERVICE_ID: u8 = 8;
pub const REJ_CONSUMER_DEFINED: u8 = 28;
/// SIDR_REP status "rejected" (IB_SIDR_REJECT).
pub const SIDR_REJECT: u8 = 2;

// Private data sizes of the IB CM messages: the kernel reports these lengths (the
// data zero-padded), less its 36-byte CMA header in REQ and SIDR_REQ.
pub const REQ_PDATA: usize = 92;
pub const REP_PDATA: usize = 196;
pub const REJ_PDATA: usize = 148;
pub const SIDR_REQ_PDATA: usize = 216;
pub const SIDR_REP_PDATA: usize = 136;
pub const CMA_HDR: usize = 36;

/// The private data a REQ (SIDR_REQ) of port space `ps` may carry.
pub fn req_room(ps: u32, ud: bool) -> usize {
    let full = if ud { SIDR_REQ_PDATA } else { REQ_PDATA };
    if ps == PS_IB { full } else { full - CMA_HDR }
}

/// Sends a message on the id's connection.
/// Posts an event with no private data and no parameters to fill (UNREACHABLE,
/// DISCONNECTED, a timed-out REJECTED, ...).
pub(super) fn post_bare(id: &Arc<Id>, st: &St, event: u32, status: i32, fixup: Fixup) {
    id::post(id, st, None, event, status, &[], 0, fixup, |_| {});
}

pub fn send(st: &St, m: &Msg) -> Result<(), c_int> {
    let Some(s) = st.sock.as_ref() else {
        return Err(libc::ENOTCONN);
    };
    (&**s)
        .write_all(&m.encode())
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
}

pub(super) fn setsockopt(fd: c_int, level: c_int, opt: c_int, v: c_int) {
    // SAFETY: setsockopt with a valid int option value on our own socket.
    unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            (&v as *const c_int).cast(),
            std::mem::size_of::<c_int>() as libc::socklen_t,
        )
    };
}

/// Keepalive and user timeout: a connection to a vanished host fails within
/// [`DEAD_PEER_TIMEOUT`] even while idle.
pub(super) fn tune(s: &TcpStream) {
    let fd = s.as_raw_fd();
    let _ = s.set_nodelay(true);
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 3);
    setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 1);
    setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 5);
    setsockopt(
        fd,
        libc::IPPROTO_TCP,
        libc::TCP_USER_TIMEOUT,
        DEAD_PEER_TIMEOUT.as_millis() as c_int,
    );
}

/// A TCP socket bound to `a` (SO_REUSEADDR for listeners, as the kernel CM lets a port
/// be bound again once its previous id is gone).
pub fn bind_socket(a: SocketAddr, reuse: bool) -> Result<OwnedFd, c_int> {
    let fam = if a.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: socket(2).
    let fd = unsafe { libc::socket(fam, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(crate::cm::chan::errno());
    }
    // SAFETY: fd was just made and is owned here.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    if reuse {
        setsockopt(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1);
    }
    // SAFETY: plain data.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    dev::to_c(a, &mut ss);
    // SAFETY: bind with a socket address of the right length.
    if unsafe {
        libc::bind(
            fd,
            (&ss as *const libc::sockaddr_storage).cast(),
            dev::c_len(a),
        )
    } != 0
    {
        return Err(crate::cm::chan::errno());
    }
    Ok(owned)
}

/// The local address of a socket.
pub fn local_addr(fd: &OwnedFd) -> Option<SocketAddr> {
    // SAFETY: plain data.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: getsockname into a sockaddr_storage of the length given.
    if unsafe {
        libc::getsockname(
            fd.as_raw_fd(),
            (&mut ss as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    } != 0
    {
        return None;
    }
    // SAFETY: the kernel wrote a socket address.
    unsafe { dev::from_c((&ss as *const libc::sockaddr_storage).cast()) }
}

mod active;
mod passive;
mod reader;
mod route;

pub use active::connect;
pub use passive::listen;
use reader::*;
pub use route::{fill_path, fill_route};
