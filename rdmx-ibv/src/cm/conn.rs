//! The connection threads: a listener's accept loop, the active side's connect, and one
//! reader per connection that turns the peer's messages (and its silence or its going
//! away) into events. Every wait is bounded: TCP connect [`CONNECT_TIMEOUT`], the
//! answer to a REQ and the RTU after a REP [`REPLY_TIMEOUT`], the DREP [`DREP_TIMEOUT`];
//! an idle connection whose peer host vanished fails by TCP keepalive and
//! `TCP_USER_TIMEOUT` within [`DEAD_PEER_TIMEOUT`]. A peer *process* that dies closes
//! its sockets, which its peer sees at once, as a kernel CM peer sees the DREQ or REJ
//! the kernel sends for a dying process's ids.

use super::chan::Fixup;
use super::dev::{self, Dev};
use super::id::{
    self, EV_CONNECT_REQUEST, EV_CONNECT_RESPONSE, EV_DISCONNECTED, EV_ESTABLISHED, EV_REJECTED,
    EV_UNREACHABLE, Id, PS_IB, St, State, Wait,
};
use super::wire::{Kind, Msg};
use rdma_sys::rdma_cm_event;
use std::ffi::c_int;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
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
pub fn send(st: &St, m: &Msg) -> Result<(), c_int> {
    let Some(s) = st.sock.as_ref() else {
        return Err(libc::ENOTCONN);
    };
    (&**s)
        .write_all(&m.encode())
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
}

fn setsockopt(fd: c_int, level: c_int, opt: c_int, v: c_int) {
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
fn tune(s: &TcpStream) {
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
        return Err(super::chan::errno());
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
        return Err(super::chan::errno());
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

/// `rdma_listen`: the bound socket listens; a thread accepts.
pub fn listen(id: &Arc<Id>, fd: OwnedFd, backlog: c_int) -> Result<Arc<TcpListener>, c_int> {
    // SAFETY: listen(2) on our bound socket.
    if unsafe { libc::listen(fd.as_raw_fd(), backlog.max(1)) } != 0 {
        return Err(super::chan::errno());
    }
    let l = Arc::new(TcpListener::from(fd));
    let (lid, ll) = (id.clone(), l.clone());
    std::thread::Builder::new()
        .name("rdmx-cm-listen".into())
        .spawn(move || accept_loop(lid, ll))
        .map_err(|_| libc::ENOMEM)?;
    Ok(l)
}

fn accept_loop(lid: Arc<Id>, l: Arc<TcpListener>) {
    loop {
        match l.accept() {
            Ok((s, _)) => {
                if lid.is_destroyed() {
                    return;
                }
                let lid2 = lid.clone();
                let _ = std::thread::Builder::new()
                    .name("rdmx-cm-conn".into())
                    .spawn(move || passive(lid2, s));
            }
            Err(_) if lid.is_destroyed() => return,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return, // shut down
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// An accepted connection: its REQ makes a new id and a CONNECT_REQUEST on the
/// listener's channel (a sync listener's new id gets a channel of its own, as
/// librdmacm migrates it).
fn passive(lid: Arc<Id>, s: TcpStream) {
    tune(&s);
    let _ = s.set_read_timeout(Some(TICK));
    let deadline = Instant::now() + FIRST_MESSAGE_TIMEOUT;
    let mut buf = Vec::new();
    let req = loop {
        match read_some(&s, &mut buf) {
            Ok(true) => match Msg::take(&mut buf) {
                Ok(Some(m)) => break m,
                Ok(None) => {}
                Err(_) => return,
            },
            Ok(false) => {
                if Instant::now() > deadline || lid.is_destroyed() {
                    return;
                }
            }
            Err(()) => return,
        }
    };
    let ud = lid.qp_type == id::QPT_UD;
    let want = if ud { Kind::SidrReq } else { Kind::Req };
    learn_port(&req);
    let Ok(dev) = dev::dev() else { return };
    let s = Arc::new(s);
    let lst = lid.st.lock();
    if req.kind != want || lst.state != State::Listening || lid.is_destroyed() {
        // No listener of this kind here: as the kernel CM's REJ for an unknown service.
        drop(lst);
        let mut rej = Msg::new(if ud { Kind::SidrRep } else { Kind::Rej });
        rej.status = REJ_INVALID_SERVICE_ID;
        let _ = (&*s).write_all(&rej.encode());
        return;
    }
    // SAFETY: the listener's public structure lives while it is not destroyed (checked
    // under its lock, held).
    let context = unsafe { (*lid.public()).context };
    let (chan_ptr, chan, sync) = if lst.sync {
        match super::chan::Chan::create() {
            Ok((p, c)) => (p, c, true),
            Err(_) => return,
        }
    } else {
        (lst.chan_ptr, lst.chan.clone(), false)
    };
    let (_, nid) = Id::create(chan_ptr, chan, sync, context, lid.ps, lid.qp_type);
    let local = s.local_addr().ok();
    let remote = s.peer_addr().ok();
    // SAFETY: the new id's box, not yet shared with the application.
    unsafe {
        fill_route(&mut *nid.boxed(), dev, local, remote);
    }
    {
        let mut st = nid.st.lock();
        st.state = State::ReqRcvd;
        st.local = local;
        st.remote = remote;
        st.sock = Some(s.clone());
        st.resp_res = req.initiator_depth;
        st.init_depth = req.responder_resources;
        st.retry = req.retry_count;
        st.rnr_retry = req.rnr_retry_count;
        // Chosen now: a program that moves its own QP (rdma_init_qp_attr) before
        // rdma_accept needs the PSN the REP will carry.
        st.psn = super::api::new_psn();
        st.peer = Some(req.clone());
    }
    let room = req_room(lid.ps, ud);
    // Posted on the listener's channel (`lst`), naming the new id and the listener.
    id::post(
        &nid,
        &lst,
        Some(lid.clone()),
        EV_CONNECT_REQUEST,
        0,
        &req.pdata,
        room,
        Fixup::None,
        |ev| {
            if !ud {
                // SAFETY: writing the conn member of the parameter union.
                let c = unsafe { &mut ev.param.conn };
                // Seen from the passive side (ib_cm's cm_format_req_event swaps them).
                c.responder_resources = req.initiator_depth;
                c.initiator_depth = req.responder_resources;
                c.flow_control = req.flow_control;
                c.retry_count = req.retry_count;
                c.rnr_retry_count = req.rnr_retry_count;
                c.srq = req.srq;
                c.qp_num = req.qpn;
            }
        },
    );
    drop(lst);
    reader(nid, s);
}

/// The route of a new id: addresses, GIDs, one path record (RoCE's, from the addresses).
///
/// # Safety
/// `b` is an id box no other thread uses.
pub unsafe fn fill_route(
    b: &mut id::IdBox,
    dev: &Dev,
    local: Option<SocketAddr>,
    remote: Option<SocketAddr>,
) {
    let c = &mut b.id;
    c.verbs = dev.ctx;
    c.port_num = 1;
    if c.pd.is_null() {
        c.pd = dev.pd;
    }
    // SAFETY: writing the storage members of the address unions.
    unsafe {
        if let Some(l) = local {
            dev::to_c(l, &mut c.route.addr.src_addr_union.src_storage);
        }
        if let Some(r) = remote {
            dev::to_c(r, &mut c.route.addr.dst_addr_union.dst_storage);
        }
        let ib = &mut c.route.addr.addr.ibaddr;
        ib.sgid.raw = dev.gid;
        if let Some(r) = remote {
            ib.dgid.raw = dev::ip_gid(r.ip());
        }
        ib.pkey = 0xffffu16.to_be();
    }
    fill_path(b, dev, remote);
}

/// The path record of `rdma_resolve_route` for RoCE: GIDs, P_Key, MTU, hop limit.
pub fn fill_path(b: &mut id::IdBox, dev: &Dev, remote: Option<SocketAddr>) {
    let p = &mut b.path;
    p.sgid.raw = dev.gid;
    if let Some(r) = remote {
        p.dgid.raw = dev::ip_gid(r.ip());
    }
    p.pkey = 0xffffu16.to_be();
    p.hop_limit = 64;
    p.reversible = 1;
    p.numb_path = 1;
    p.mtu_selector = 2; // exactly
    p.mtu = dev.mtu;
    p.rate_selector = 2;
    p.rate = 3; // 10 Gb/s, what the sysfs tree reports
    p.packet_life_time_selector = 2;
    p.packet_life_time = 16; // CMA_IBOE_PACKET_LIFETIME
    b.id.route.path_rec = &mut b.path;
    b.id.route.num_paths = 1;
}

/// `rdma_connect`: connects in a thread (the call returns at once, as librdmacm's), sends
/// the REQ and reads the answer.
pub fn connect(id: &Arc<Id>, fd: OwnedFd, dst: SocketAddr, req: Msg) -> Result<(), c_int> {
    let id2 = id.clone();
    std::thread::Builder::new()
        .name("rdmx-cm-conn".into())
        .spawn(move || active(id2, fd, dst, req))
        .map(|_| ())
        .map_err(|_| libc::ENOMEM)
}

fn active(id: Arc<Id>, fd: OwnedFd, dst: SocketAddr, req: Msg) {
    let r = tcp_connect(&fd, dst);
    let mut st = id.st.lock();
    if id.is_destroyed() || st.state != State::Connecting {
        return;
    }
    if let Err(e) = r {
        st.state = State::Done;
        if e == libc::ECONNREFUSED {
            // Nobody listens on that port: the kernel CM's REJ "invalid service ID".
            id::post(
                &id,
                &st,
                None,
                EV_REJECTED,
                REJ_INVALID_SERVICE_ID as i32,
                &[],
                REJ_PDATA,
                Fixup::QpToErr,
                |_| {},
            );
        } else {
            let status = if e == libc::ETIMEDOUT {
                -libc::ETIMEDOUT
            } else {
                -e
            };
            id::post(
                &id,
                &st,
                None,
                EV_UNREACHABLE,
                status,
                &[],
                0,
                Fixup::None,
                |_| {},
            );
        }
        return;
    }
    let s = Arc::new(TcpStream::from(fd));
    tune(&s);
    st.sock = Some(s.clone());
    st.local = s.local_addr().ok();
    st.deadline = Some((Instant::now() + REPLY_TIMEOUT, Wait::Rep));
    if send(&st, &req).is_err() {
        st.state = State::Done;
        st.sock = None;
        id::post(
            &id,
            &st,
            None,
            EV_UNREACHABLE,
            -libc::ECONNRESET,
            &[],
            0,
            Fixup::None,
            |_| {},
        );
        return;
    }
    drop(st);
    reader(id, s);
}

/// Non-blocking connect with [`CONNECT_TIMEOUT`].
fn tcp_connect(fd: &OwnedFd, dst: SocketAddr) -> Result<(), c_int> {
    let raw = fd.as_raw_fd();
    // SAFETY: fcntl/connect/poll/getsockopt on our own socket with valid buffers.
    unsafe {
        let fl = libc::fcntl(raw, libc::F_GETFL);
        libc::fcntl(raw, libc::F_SETFL, fl | libc::O_NONBLOCK);
        let mut ss: libc::sockaddr_storage = std::mem::zeroed();
        dev::to_c(dst, &mut ss);
        let r = libc::connect(
            raw,
            (&ss as *const libc::sockaddr_storage).cast(),
            dev::c_len(dst),
        );
        let res = if r == 0 {
            Ok(())
        } else {
            let e = super::chan::errno();
            if e != libc::EINPROGRESS {
                Err(e)
            } else {
                let mut p = libc::pollfd {
                    fd: raw,
                    events: libc::POLLOUT,
                    revents: 0,
                };
                let n = libc::poll(&mut p, 1, CONNECT_TIMEOUT.as_millis() as c_int);
                if n == 0 {
                    Err(libc::ETIMEDOUT)
                } else if n < 0 {
                    Err(super::chan::errno())
                } else {
                    let mut err: c_int = 0;
                    let mut len = std::mem::size_of::<c_int>() as libc::socklen_t;
                    libc::getsockopt(
                        raw,
                        libc::SOL_SOCKET,
                        libc::SO_ERROR,
                        (&mut err as *mut c_int).cast(),
                        &mut len,
                    );
                    if err == 0 { Ok(()) } else { Err(err) }
                }
            }
        };
        libc::fcntl(raw, libc::F_SETFL, fl & !libc::O_NONBLOCK);
        res
    }
}

/// Reads what is there (up to one tick): Ok(true) got bytes, Ok(false) nothing yet,
/// Err on EOF or error.
fn read_some(s: &TcpStream, buf: &mut Vec<u8>) -> Result<bool, ()> {
    let mut tmp = [0u8; 512];
    match (&*s).read(&mut tmp) {
        Ok(0) => Err(()),
        Ok(n) => {
            buf.extend_from_slice(&tmp[..n]);
            Ok(true)
        }
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock
                    | std::io::ErrorKind::TimedOut
                    | std::io::ErrorKind::Interrupted
            ) =>
        {
            Ok(false)
        }
        Err(_) => Err(()),
    }
}

/// Remembers where the sender's QP receives (before any QP moves to RTR towards it).
fn learn_port(m: &Msg) {
    if m.qpn != 0 {
        crate::verbs::peer_port::learn(dev::gid_ip(&m.gid), m.qpn, m.udp_port);
    }
}

/// Reads the connection's messages until it ends or the id is done.
fn reader(id: Arc<Id>, s: Arc<TcpStream>) {
    let _ = s.set_read_timeout(Some(TICK));
    let mut buf = Vec::new();
    loop {
        match read_some(&s, &mut buf) {
            Ok(true) => loop {
                match Msg::take(&mut buf) {
                    Ok(Some(m)) => {
                        if !on_message(&id, m) {
                            return;
                        }
                    }
                    Ok(None) => break,
                    Err(_) => {
                        on_gone(&id);
                        return;
                    }
                }
            },
            Ok(false) => {
                if !on_tick(&id) {
                    return;
                }
            }
            Err(()) => {
                on_gone(&id);
                return;
            }
        }
    }
}

/// Connection parameters of an event from a REP.
fn conn_from(m: &Msg) -> impl FnOnce(&mut rdma_cm_event) + '_ {
    move |ev| {
        // SAFETY: writing the conn member of the parameter union.
        let c = unsafe { &mut ev.param.conn };
        // Seen from the active side (ib_cm's cm_format_rep_event swaps them).
        c.responder_resources = m.initiator_depth;
        c.initiator_depth = m.responder_resources;
        c.flow_control = m.flow_control;
        c.retry_count = m.retry_count;
        c.rnr_retry_count = m.rnr_retry_count;
        c.srq = m.srq;
        c.qp_num = m.qpn;
    }
}

/// One message from the peer; false when the connection is done.
fn on_message(id: &Arc<Id>, m: Msg) -> bool {
    if matches!(m.kind, Kind::Rep | Kind::SidrRep) {
        learn_port(&m);
    }
    let mut st = id.st.lock();
    if id.is_destroyed() {
        return false;
    }
    match (st.state, m.kind) {
        (State::Connecting, Kind::Rep) => {
            // librdmacm takes the negotiated values from the REP (`RDMA_MAX_RESP_RES`).
            st.resp_res = m.initiator_depth;
            st.init_depth = m.responder_resources;
            st.rnr_retry = m.rnr_retry_count;
            st.state = State::RepRcvd;
            st.deadline = None;
            st.peer = Some(m.clone());
            id::post(
                id,
                &st,
                None,
                EV_CONNECT_RESPONSE,
                0,
                &m.pdata,
                REP_PDATA,
                Fixup::ConnResponse,
                conn_from(&m),
            );
            true
        }
        (State::Connecting, Kind::SidrRep) => {
            st.state = State::Done;
            st.deadline = None;
            if m.status != 0 {
                id::post(
                    id,
                    &st,
                    None,
                    EV_UNREACHABLE,
                    m.status as i32,
                    &m.pdata,
                    SIDR_REP_PDATA,
                    Fixup::None,
                    |_| {},
                );
            } else {
                id::post(
                    id,
                    &st,
                    None,
                    EV_ESTABLISHED,
                    0,
                    &m.pdata,
                    SIDR_REP_PDATA,
                    Fixup::None,
                    |ev| {
                        // SAFETY: writing the ud member of the parameter union.
                        let u = unsafe { &mut ev.param.ud };
                        u.qp_num = m.qpn;
                        u.qkey = m.qkey;
                        u.ah_attr.is_global = 1;
                        u.ah_attr.port_num = 1;
                        u.ah_attr.grh.dgid.raw = m.gid;
                        u.ah_attr.grh.sgid_index = 0;
                        u.ah_attr.grh.hop_limit = 64;
                    },
                );
            }
            st.sock = None;
            false
        }
        (State::Connecting | State::ReqRcvd | State::Accepted | State::RepRcvd, Kind::Rej) => {
            st.state = State::Done;
            st.deadline = None;
            id::post(
                id,
                &st,
                None,
                EV_REJECTED,
                m.status as i32,
                &m.pdata,
                REJ_PDATA,
                Fixup::QpToErr,
                |_| {},
            );
            st.sock = None;
            false
        }
        (State::Accepted, Kind::Rtu) => {
            st.state = State::Connected;
            st.deadline = None;
            let p = st.peer.clone().unwrap_or_else(|| Msg::new(Kind::Req));
            id::post(
                id,
                &st,
                None,
                EV_ESTABLISHED,
                0,
                &[],
                0,
                Fixup::None,
                move |ev| {
                    // SAFETY: writing the conn member of the parameter union.
                    let c = unsafe { &mut ev.param.conn };
                    c.qp_num = p.qpn;
                    c.srq = p.srq;
                },
            );
            true
        }
        (
            State::Connected | State::Accepted | State::RepRcvd | State::Disconnecting,
            Kind::Dreq,
        ) => {
            let _ = send(&st, &Msg::new(Kind::Drep));
            st.state = State::Disconnected;
            st.deadline = None;
            id::post(
                id,
                &st,
                None,
                EV_DISCONNECTED,
                0,
                &[],
                0,
                Fixup::None,
                |_| {},
            );
            true
        }
        (State::Disconnecting, Kind::Drep) => {
            st.state = State::Disconnected;
            st.deadline = None;
            id::post(
                id,
                &st,
                None,
                EV_DISCONNECTED,
                0,
                &[],
                0,
                Fixup::None,
                |_| {},
            );
            st.sock = None;
            false
        }
        (state, kind) => {
            log::debug!("rdmx cm: {kind:?} in state {state:?} ignored");
            true
        }
    }
}

/// The peer closed the connection (its id destroyed, its process gone) or it failed.
fn on_gone(id: &Arc<Id>) {
    let mut st = id.st.lock();
    if id.is_destroyed() {
        return;
    }
    st.deadline = None;
    match st.state {
        // The kernel CM of a destroyed id sends a REJ (timeout reason from an active id
        // that had sent its REQ, consumer-defined otherwise) or a DREQ once connected.
        State::Connecting | State::RepRcvd | State::Accepted => {
            st.state = State::Done;
            id::post(
                id,
                &st,
                None,
                EV_REJECTED,
                REJ_CONSUMER_DEFINED as i32,
                &[],
                REJ_PDATA,
                Fixup::QpToErr,
                |_| {},
            );
        }
        State::ReqRcvd => {
            st.state = State::Done;
            id::post(
                id,
                &st,
                None,
                EV_REJECTED,
                REJ_TIMEOUT as i32,
                &[],
                REJ_PDATA,
                Fixup::QpToErr,
                |_| {},
            );
        }
        State::Connected | State::Disconnecting => {
            st.state = State::Disconnected;
            id::post(
                id,
                &st,
                None,
                EV_DISCONNECTED,
                0,
                &[],
                0,
                Fixup::None,
                |_| {},
            );
        }
        _ => {}
    }
    st.sock = None;
}

/// A tick without bytes: ends a wait whose deadline passed; false when done.
fn on_tick(id: &Arc<Id>) -> bool {
    let mut st = id.st.lock();
    if id.is_destroyed() || st.sock.is_none() {
        return false;
    }
    let Some((when, what)) = st.deadline else {
        return true;
    };
    if Instant::now() < when {
        return true;
    }
    st.deadline = None;
    match what {
        // No REP, or no RTU: the kernel CM's REQ/REP timeouts report UNREACHABLE.
        Wait::Rep | Wait::Rtu => {
            st.state = State::Done;
            id::post(
                id,
                &st,
                None,
                EV_UNREACHABLE,
                -libc::ETIMEDOUT,
                &[],
                0,
                Fixup::QpToErr,
                |_| {},
            );
        }
        // No DREP: DISCONNECTED all the same (the kernel's DREQ timeout).
        Wait::Drep => {
            st.state = State::Disconnected;
            id::post(
                id,
                &st,
                None,
                EV_DISCONNECTED,
                -libc::ETIMEDOUT,
                &[],
                0,
                Fixup::None,
                |_| {},
            );
        }
    }
    if let Some(s) = st.sock.take() {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    false
}
