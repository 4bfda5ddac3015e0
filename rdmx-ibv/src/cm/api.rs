//! librdmacm's public functions (`rdma/rdma_cma.h`, `rdma/rdma_verbs.h`), exported by
//! the preloaded provider so that they take the application's calls before
//! `librdmacm.so.1`'s (see the module documentation of [`super`]).
//!
//! Return conventions are librdmacm's: 0, or -1 with errno; constructors NULL with
//! errno. Every body runs under [`guard`] (a panic is refused with EIO).

use super::chan::{Chan, EventBox, Fixup, errno, release};
use super::conn::{self, REJ_CONSUMER_DEFINED, REJ_PDATA, REP_PDATA, SIDR_REJECT, SIDR_REP_PDATA};
use super::dev::{self, Dev};
use super::id::{
    self, EV_CONNECT_ERROR, EV_CONNECT_REQUEST, EV_ESTABLISHED, EV_REJECTED, Id, PS_IB, PS_IPOIB,
    PS_TCP, PS_UDP, QPT_RC, QPT_UD, State, Wait,
};
use super::qp::{self, RDMA_UDP_QKEY};
use super::wire::{Kind, Msg};
use crate::glue::{guard, set_errno};
use parking_lot::Mutex;
use rdma_sys::{
    ibv_context, ibv_pd, ibv_qp_attr, ibv_qp_init_attr, ibv_qp_init_attr_ex, ibv_srq_init_attr,
    ibv_srq_init_attr_ex, rdma_addrinfo, rdma_cm_event, rdma_cm_id, rdma_conn_param,
    rdma_event_channel,
};
use std::collections::HashSet;
use std::ffi::{c_char, c_int, c_void};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

const RDMA_MAX_RESP_RES: u8 = 0xff;
const RDMA_MAX_INIT_DEPTH: u8 = 0xff;
const RAI_PASSIVE: c_int = 1;

fn fail(e: c_int) -> c_int {
    set_errno(e);
    -1
}

fn res(r: Result<(), c_int>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

/// Events handed to the application and not yet acknowledged.
fn delivered() -> &'static Mutex<HashSet<usize>> {
    static D: OnceLock<Mutex<HashSet<usize>>> = OnceLock::new();
    D.get_or_init(|| Mutex::new(HashSet::new()))
}

fn lookup(p: *mut rdma_cm_id) -> Result<Arc<Id>, c_int> {
    Id::lookup(p).ok_or(libc::EINVAL)
}

/// A PSN for a new connection (24 bits, different per connection).
pub(crate) fn new_psn() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let x = t ^ N.fetch_add(0x9e37_79b9, Ordering::Relaxed) ^ std::process::id().rotate_left(13);
    x.wrapping_mul(0x85eb_ca6b) >> 8
}

fn qp_type_of(ps: u32) -> Result<u32, c_int> {
    match ps {
        PS_TCP | PS_IB => Ok(QPT_RC),
        PS_UDP | PS_IPOIB => Ok(QPT_UD),
        _ => Err(libc::EINVAL),
    }
}

// ---- event channels and events ----

#[unsafe(no_mangle)]
pub extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    guard(
        "rdma_create_event_channel",
        std::ptr::null_mut(),
        || match Chan::create() {
            Ok((p, _)) => p,
            Err(e) => {
                set_errno(e);
                std::ptr::null_mut()
            }
        },
    )
}

/// # Safety
/// `channel` is one of ours (anything else is refused... as far as it is not freed).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    guard("rdma_destroy_event_channel", (), || {
        let _ = Chan::destroy(channel);
    })
}

/// Waits for the next event of `chan` and applies what librdmacm does in
/// `rdma_get_cm_event` before handing it out.
fn next_event(chan: &Chan) -> Result<*mut rdma_cm_event, c_int> {
    let mut e = chan.next()?;
    match e.fixup {
        Fixup::None => {}
        Fixup::QpToErr => {
            // SAFETY: the event keeps the id's box alive.
            qp::to_err(unsafe { (*e.id.public()).qp });
        }
        Fixup::ConnResponse => {
            // SAFETY: as above.
            let qp_ = unsafe { (*e.id.public()).qp };
            if !qp_.is_null() {
                let r = dev::dev().and_then(|d| qp::connect(&e.id, d, qp_));
                let mut st = e.id.st.lock();
                match r {
                    Ok(()) => {
                        if st.state == State::RepRcvd {
                            let _ = conn::send(&st, &Msg::new(Kind::Rtu));
                            st.state = State::Connected;
                        }
                        e.ev.event = EV_ESTABLISHED;
                    }
                    Err(err) => {
                        qp::to_err(qp_);
                        let mut rej = Msg::new(Kind::Rej);
                        rej.status = REJ_CONSUMER_DEFINED;
                        let _ = conn::send(&st, &rej);
                        st.state = State::Done;
                        if let Some(s) = st.sock.take() {
                            let _ = s.shutdown(std::net::Shutdown::Both);
                        }
                        e.ev.event = EV_CONNECT_ERROR;
                        e.ev.status = -err;
                    }
                }
            }
        }
    }
    let p = Box::into_raw(e);
    delivered().lock().insert(p as usize);
    Ok(p as *mut rdma_cm_event)
}

/// # Safety
/// `channel` and `event` are valid pointers (librdmacm's contract).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    guard("rdma_get_cm_event", -1, || {
        if event.is_null() {
            return fail(libc::EINVAL);
        }
        let Some(chan) = Chan::lookup(channel) else {
            if Chan::was_destroyed(channel) {
                super::chan::wait_forever();
            }
            return fail(libc::EINVAL);
        };
        match next_event(&chan) {
            Ok(p) => {
                // SAFETY: the caller's out-pointer.
                unsafe { *event = p };
                0
            }
            Err(e) => fail(e),
        }
    })
}

fn ack(event: *mut rdma_cm_event) -> Result<(), c_int> {
    if !delivered().lock().remove(&(event as usize)) {
        return Err(libc::EINVAL);
    }
    // SAFETY: a delivered event is a box handed out by next_event, acknowledged once.
    release(unsafe { Box::from_raw(event as *mut EventBox) });
    Ok(())
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    guard("rdma_ack_cm_event", -1, || res(ack(event)))
}

/// librdmacm's `ucma_complete`: a synchronous id waits for the event of the operation
/// just started and turns its status into the return value.
fn complete(id: &Arc<Id>) -> Result<(), c_int> {
    let (sync, chan) = {
        let st = id.st.lock();
        (st.sync, st.chan.clone())
    };
    if !sync {
        return Ok(());
    }
    let cm = id.public();
    // SAFETY: the application's live id (it called us with it).
    unsafe {
        if !(*cm).event.is_null() {
            let _ = ack((*cm).event);
            (*cm).event = std::ptr::null_mut();
        }
    }
    let ev = next_event(&chan)?;
    // SAFETY: as above; ev is a delivered event.
    unsafe {
        (*cm).event = ev;
        let (kind, status) = ((*ev).event, (*ev).status);
        if status != 0 {
            return Err(if kind == EV_REJECTED {
                libc::ECONNREFUSED
            } else if status < 0 {
                -status
            } else {
                status
            });
        }
    }
    Ok(())
}

// ---- ids ----

fn create_id(
    channel: *mut rdma_event_channel,
    context: *mut c_void,
    ps: u32,
    qp_type: u32,
) -> Result<*mut rdma_cm_id, c_int> {
    let (chan_ptr, chan, sync) = if channel.is_null() {
        let (p, c) = Chan::create()?;
        (p, c, true)
    } else {
        (channel, Chan::lookup(channel).ok_or(libc::EINVAL)?, false)
    };
    let (cm, _) = Id::create(chan_ptr, chan, sync, context, ps, qp_type);
    Ok(cm)
}

/// # Safety
/// `id` is a valid out-pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: u32,
) -> c_int {
    guard("rdma_create_id", -1, || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        match qp_type_of(ps).and_then(|t| create_id(channel, context, ps, t)) {
            Ok(cm) => {
                // SAFETY: the caller's out-pointer.
                unsafe { *id = cm };
                0
            }
            Err(e) => fail(e),
        }
    })
}

fn destroy_id(cm: *mut rdma_cm_id) -> Result<(), c_int> {
    let id = lookup(cm)?;
    let (sync, chan_ptr) = {
        let st = id.st.lock();
        (st.sync, st.chan_ptr)
    };
    // SAFETY: the application's live id.
    unsafe {
        if !(*cm).event.is_null() {
            let _ = ack((*cm).event);
            (*cm).event = std::ptr::null_mut();
        }
    }
    let mut todo = id.destroy();
    while let Some(child) = todo.pop() {
        let (csync, cptr) = {
            let st = child.st.lock();
            (st.sync, st.chan_ptr)
        };
        todo.extend(child.destroy());
        if csync {
            let _ = Chan::destroy(cptr);
        }
    }
    if sync {
        let _ = Chan::destroy(chan_ptr);
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    guard("rdma_destroy_id", -1, || res(destroy_id(id)))
}

/// Binds the id's socket (an address of rdmx0's, or the wildcard, which binds rdmx0's
/// address: the only one with an RDMA device).
fn bind(id: &Arc<Id>, a: SocketAddr, reuse: bool) -> Result<(), c_int> {
    let d = dev::dev()?;
    let wildcard = a.ip().is_unspecified();
    if !wildcard && !dev::names_device(a.ip(), d.ip) {
        return Err(libc::ENODEV);
    }
    let mut st = id.st.lock();
    if st.state != State::Idle {
        return Err(libc::EINVAL);
    }
    // The wildcard binds rdmx0's address: the only one with the device.
    let ip = if wildcard { d.ip } else { a.ip() };
    let fd = conn::bind_socket(SocketAddr::new(ip, a.port()), reuse)?;
    let actual = conn::local_addr(&fd).ok_or(libc::EINVAL)?;
    let shown = if wildcard {
        SocketAddr::new(a.ip(), actual.port())
    } else {
        actual
    };
    // SAFETY: the application's live id box; written under the id's lock.
    unsafe {
        let b = &mut *id.boxed();
        dev::to_c(shown, &mut b.id.route.addr.src_addr_union.src_storage);
        if !wildcard {
            b.id.verbs = d.ctx;
            b.id.port_num = 1;
            if b.id.pd.is_null() {
                b.id.pd = d.pd;
            }
            b.id.route.addr.addr.ibaddr.sgid.raw = d.gid;
            b.id.route.addr.addr.ibaddr.pkey = 0xffffu16.to_be();
        }
    }
    st.bound_fd = Some(fd);
    st.local = Some(actual);
    st.state = State::Bound;
    Ok(())
}

/// # Safety
/// `addr` is a valid socket address.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    guard("rdma_bind_addr", -1, || {
        let r = (|| {
            let id = lookup(id)?;
            // SAFETY: the caller's promise.
            let a = unsafe { dev::from_c(addr) }.ok_or(libc::EAFNOSUPPORT)?;
            bind(&id, a, true)
        })();
        res(r)
    })
}

/// Whether the host has a route to `dst` (a UDP socket's connect asks the routing table).
fn routable(dst: SocketAddr) -> Result<(), c_int> {
    let s = std::net::UdpSocket::bind(if dst.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
    s.connect(dst)
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EHOSTUNREACH))
}

fn resolve_addr(id: &Arc<Id>, src: Option<SocketAddr>, dst: SocketAddr) -> Result<(), c_int> {
    let d = dev::dev()?;
    if id.st.lock().state == State::Idle {
        let a = src.unwrap_or(SocketAddr::new(d.ip, 0));
        bind(id, SocketAddr::new(a.ip(), a.port()), false)?;
    }
    let mut st = id.st.lock();
    if st.state != State::Bound {
        return Err(libc::EINVAL);
    }
    let dst_ip = dst.ip().to_canonical();
    let dst = SocketAddr::new(dst_ip, dst.port());
    let family_ok = dst_ip.is_ipv4() == d.ip.is_ipv4();
    let route = if family_ok {
        routable(dst)
    } else {
        Err(libc::EAFNOSUPPORT)
    };
    if let Err(e) = route {
        id::post(
            id,
            &st,
            None,
            id::EV_ADDR_ERROR,
            -e,
            &[],
            0,
            Fixup::None,
            |_| {},
        );
        drop(st);
        return complete(id);
    }
    // SAFETY: the application's live id box; written under the id's lock.
    unsafe {
        let b = &mut *id.boxed();
        conn::fill_route(b, d, st.local, Some(dst));
        b.id.route.path_rec = std::ptr::null_mut();
        b.id.route.num_paths = 0;
    }
    st.remote = Some(dst);
    st.state = State::AddrResolved;
    id::post(
        id,
        &st,
        None,
        id::EV_ADDR_RESOLVED,
        0,
        &[],
        0,
        Fixup::None,
        |_| {},
    );
    drop(st);
    complete(id)
}

/// # Safety
/// `src` is NULL or, like `dst`, a valid socket address.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    guard("rdma_resolve_addr", -1, || {
        let r = (|| {
            let id = lookup(id)?;
            // SAFETY: the caller's promise.
            let src = unsafe { dev::from_c(src) };
            // SAFETY: the caller's promise.
            let dst = unsafe { dev::from_c(dst) }.ok_or(libc::EAFNOSUPPORT)?;
            resolve_addr(&id, src, dst)
        })();
        res(r)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    guard("rdma_resolve_route", -1, || {
        let r = (|| {
            let id = lookup(id)?;
            let d = dev::dev()?;
            let mut st = id.st.lock();
            if st.state != State::AddrResolved {
                return Err(libc::EINVAL);
            }
            // SAFETY: the application's live id box; written under the id's lock.
            conn::fill_path(unsafe { &mut *id.boxed() }, d, st.remote);
            st.state = State::RouteResolved;
            id::post(
                &id,
                &st,
                None,
                id::EV_ROUTE_RESOLVED,
                0,
                &[],
                0,
                Fixup::None,
                |_| {},
            );
            drop(st);
            complete(&id)
        })();
        res(r)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    guard("rdma_listen", -1, || {
        let r = (|| {
            let id = lookup(id)?;
            if id.st.lock().state == State::Idle {
                let any: IpAddr = if dev::dev()?.ip.is_ipv4() {
                    IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
                } else {
                    IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
                };
                bind(&id, SocketAddr::new(any, 0), true)?;
            }
            let mut st = id.st.lock();
            if st.state != State::Bound {
                return Err(libc::EINVAL);
            }
            let fd = st.bound_fd.take().ok_or(libc::EINVAL)?;
            st.listener = Some(conn::listen(&id, fd, backlog)?);
            st.state = State::Listening;
            Ok(())
        })();
        res(r)
    })
}

/// librdmacm's `ucma_valid_param`.
fn valid_param(
    id: &Id,
    cm: &rdma_cm_id,
    d: &Dev,
    p: Option<&rdma_conn_param>,
) -> Result<(), c_int> {
    if id.ps != PS_TCP {
        return Ok(());
    }
    let Some(p) = p else {
        return if cm.qp.is_null() {
            Err(libc::EINVAL)
        } else {
            Ok(())
        };
    };
    if (p.responder_resources != RDMA_MAX_RESP_RES && p.responder_resources > d.max_resp_res)
        || (p.initiator_depth != RDMA_MAX_INIT_DEPTH && p.initiator_depth > d.max_init_depth)
    {
        return Err(libc::EINVAL);
    }
    Ok(())
}

/// The private data of a connection parameter structure.
///
/// # Safety
/// `p`'s private data pointer is valid for its length.
unsafe fn pdata(p: Option<&rdma_conn_param>) -> Vec<u8> {
    match p {
        Some(p) if !p.private_data.is_null() && p.private_data_len > 0 => {
            // SAFETY: the caller's promise.
            unsafe {
                std::slice::from_raw_parts(p.private_data as *const u8, p.private_data_len as usize)
            }
            .to_vec()
        }
        _ => Vec::new(),
    }
}

fn connect(cmp: *mut rdma_cm_id, p: Option<&rdma_conn_param>) -> Result<(), c_int> {
    let id = lookup(cmp)?;
    let d = dev::dev()?;
    // SAFETY: the application's live id.
    let cm = unsafe { &*cmp };
    valid_param(&id, cm, d, p)?;
    let ud = id.qp_type == QPT_UD;
    // SAFETY: librdmacm's contract for private data.
    let pd = unsafe { pdata(p) };
    if pd.len() > conn::req_room(id.ps, ud) {
        return Err(libc::EINVAL);
    }
    let mut st = id.st.lock();
    if st.state != State::RouteResolved {
        return Err(libc::EINVAL);
    }
    let dst = st.remote.ok_or(libc::EINVAL)?;
    st.init_depth = match p {
        Some(p) if p.initiator_depth != RDMA_MAX_INIT_DEPTH => p.initiator_depth,
        _ => d.max_init_depth,
    };
    st.resp_res = match p {
        Some(p) if p.responder_resources != RDMA_MAX_RESP_RES => p.responder_resources,
        _ => d.max_resp_res,
    };
    let (qpn, srq) = if !cm.qp.is_null() {
        // SAFETY: the id's live QP.
        unsafe { ((*cm.qp).qp_num, u8::from(!(*cm.qp).srq.is_null())) }
    } else {
        p.map_or((0, 0), |p| (p.qp_num, p.srq))
    };
    st.psn = new_psn();
    st.retry = p.map_or(7, |p| p.retry_count);
    st.rnr_retry = p.map_or(7, |p| p.rnr_retry_count);
    let mut m = Msg::new(if ud { Kind::SidrReq } else { Kind::Req });
    m.qpn = qpn & 0xff_ffff;
    m.psn = st.psn;
    m.gid = d.gid;
    m.mtu = d.mtu;
    m.udp_port = d.udp_port;
    m.responder_resources = st.resp_res;
    m.initiator_depth = st.init_depth;
    m.flow_control = p.map_or(0, |p| p.flow_control);
    m.retry_count = st.retry;
    m.rnr_retry_count = st.rnr_retry;
    m.srq = srq;
    m.pdata = pd;
    let fd = st.bound_fd.take().ok_or(libc::EINVAL)?;
    st.state = State::Connecting;
    drop(st);
    conn::connect(&id, fd, dst, m)?;
    complete(&id)
}

/// # Safety
/// `conn_param` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_connect(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    guard("rdma_connect", -1, || {
        // SAFETY: the caller's promise.
        let p = unsafe { conn_param.as_ref() };
        res(connect(id, p))
    })
}

fn accept(cmp: *mut rdma_cm_id, p: Option<&rdma_conn_param>) -> Result<(), c_int> {
    let id = lookup(cmp)?;
    let d = dev::dev()?;
    // SAFETY: the application's live id.
    let cm = unsafe { &*cmp };
    valid_param(&id, cm, d, p)?;
    // SAFETY: librdmacm's contract for private data.
    let pd = unsafe { pdata(p) };
    let (qpn, srq) = if !cm.qp.is_null() {
        // SAFETY: the id's live QP.
        unsafe { ((*cm.qp).qp_num, u8::from(!(*cm.qp).srq.is_null())) }
    } else {
        let p = p.ok_or(libc::EINVAL)?;
        (p.qp_num, p.srq)
    };
    if id.qp_type == QPT_UD {
        if pd.len() > SIDR_REP_PDATA {
            return Err(libc::EINVAL);
        }
        let mut st = id.st.lock();
        if st.state != State::ReqRcvd {
            return Err(libc::EINVAL);
        }
        let mut m = Msg::new(Kind::SidrRep);
        m.qpn = qpn & 0xff_ffff;
        m.qkey = RDMA_UDP_QKEY;
        m.gid = d.gid;
        m.udp_port = d.udp_port;
        m.pdata = pd;
        conn::send(&st, &m)?;
        st.state = State::Done;
        drop(st);
        // SAFETY: the application's live id.
        unsafe {
            if st_sync(&id) && !(*cmp).event.is_null() {
                let _ = ack((*cmp).event);
                (*cmp).event = std::ptr::null_mut();
            }
        }
        return Ok(());
    }
    if pd.len() > REP_PDATA {
        return Err(libc::EINVAL);
    }
    {
        let mut st = id.st.lock();
        if st.state != State::ReqRcvd {
            return Err(libc::EINVAL);
        }
        st.init_depth = match p {
            Some(p) if p.initiator_depth != RDMA_MAX_INIT_DEPTH => p.initiator_depth,
            _ => st.init_depth.min(d.max_init_depth),
        };
        st.resp_res = match p {
            Some(p) if p.responder_resources != RDMA_MAX_RESP_RES => p.responder_resources,
            _ => st.resp_res.min(d.max_resp_res),
        };
    }
    if !cm.qp.is_null() {
        qp::connect(&id, d, cm.qp)?;
    }
    let mut st = id.st.lock();
    if st.state != State::ReqRcvd {
        qp::to_err(cm.qp);
        return Err(libc::EINVAL);
    }
    let mut m = Msg::new(Kind::Rep);
    m.qpn = qpn & 0xff_ffff;
    m.psn = st.psn;
    m.gid = d.gid;
    m.mtu = d.mtu;
    m.udp_port = d.udp_port;
    m.responder_resources = st.resp_res;
    m.initiator_depth = st.init_depth;
    m.flow_control = p.map_or(0, |p| p.flow_control);
    m.rnr_retry_count = p.map_or(7, |p| p.rnr_retry_count);
    m.srq = srq;
    m.pdata = pd;
    if let Err(e) = conn::send(&st, &m) {
        qp::to_err(cm.qp);
        return Err(e);
    }
    st.state = State::Accepted;
    st.deadline = Some((Instant::now() + conn::REPLY_TIMEOUT, Wait::Rtu));
    drop(st);
    complete(&id)
}

fn st_sync(id: &Id) -> bool {
    id.st.lock().sync
}

/// # Safety
/// `conn_param` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_accept(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    guard("rdma_accept", -1, || {
        // SAFETY: the caller's promise.
        let p = unsafe { conn_param.as_ref() };
        res(accept(id, p))
    })
}

fn reject(cmp: *mut rdma_cm_id, pdata: &[u8]) -> Result<(), c_int> {
    let id = lookup(cmp)?;
    let ud = id.qp_type == QPT_UD;
    if pdata.len() > if ud { SIDR_REP_PDATA } else { REJ_PDATA } {
        return Err(libc::EINVAL);
    }
    let mut st = id.st.lock();
    if !matches!(st.state, State::ReqRcvd | State::RepRcvd) {
        return Err(libc::EINVAL);
    }
    let mut m = Msg::new(if ud { Kind::SidrRep } else { Kind::Rej });
    m.status = if ud {
        SIDR_REJECT
    } else {
        REJ_CONSUMER_DEFINED
    };
    m.pdata = pdata.to_vec();
    let r = conn::send(&st, &m);
    st.state = State::Done;
    if let Some(s) = st.sock.take() {
        let _ = s.shutdown(std::net::Shutdown::Write);
    }
    r
}

/// # Safety
/// `private_data` is valid for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    len: u8,
) -> c_int {
    guard("rdma_reject", -1, || {
        let pd = if private_data.is_null() || len == 0 {
            &[][..]
        } else {
            // SAFETY: the caller's promise.
            unsafe { std::slice::from_raw_parts(private_data as *const u8, len as usize) }
        };
        res(reject(id, pd))
    })
}

/// # Safety
/// `id` is NULL or a live id of ours (anything else is refused).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    guard("rdma_establish", -1, || {
        let r = (|| {
            let id_ = lookup(id)?;
            // SAFETY: the application's live id.
            if !unsafe { (*id).qp }.is_null() {
                return Err(libc::EINVAL);
            }
            let mut st = id_.st.lock();
            if st.state != State::RepRcvd {
                return Err(libc::EINVAL);
            }
            conn::send(&st, &Msg::new(Kind::Rtu))?;
            st.state = State::Connected;
            Ok(())
        })();
        res(r)
    })
}

/// # Safety
/// `id` is NULL or a live id of ours (anything else is refused).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    guard("rdma_disconnect", -1, || {
        let r = (|| {
            let id_ = lookup(id)?;
            // SAFETY: the application's live id.
            qp::to_err(unsafe { (*id).qp });
            let mut st = id_.st.lock();
            match st.state {
                State::Connected | State::Accepted | State::RepRcvd => {
                    let _ = conn::send(&st, &Msg::new(Kind::Dreq));
                    st.state = State::Disconnecting;
                    st.deadline = Some((Instant::now() + conn::DREP_TIMEOUT, Wait::Drep));
                    drop(st);
                    complete(&id_)
                }
                State::Disconnecting
                | State::Disconnected
                | State::Done
                | State::ReqRcvd
                | State::Connecting => Ok(()),
                _ => Err(libc::EINVAL),
            }
        })();
        res(r)
    })
}

/// # Safety
/// `channel` is NULL or a channel of ours.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    guard("rdma_migrate_id", -1, || {
        let r = (|| {
            let id_ = lookup(id)?;
            let (new_ptr, new, sync) = if channel.is_null() {
                let (p, c) = Chan::create()?;
                (p, c, true)
            } else {
                (channel, Chan::lookup(channel).ok_or(libc::EINVAL)?, false)
            };
            let mut st = id_.st.lock();
            let me = Arc::as_ptr(&id_);
            let moved = st
                .chan
                .withdraw(|e| Arc::as_ptr(&e.id) == me && e.listen.is_none());
            let (old_ptr, old_sync) = (st.chan_ptr, st.sync);
            st.chan = new.clone();
            st.chan_ptr = new_ptr;
            st.sync = sync;
            // SAFETY: the application's live id; written under the id's lock.
            unsafe { (*id).channel = new_ptr };
            for e in moved {
                new.post(e);
            }
            drop(st);
            if old_sync {
                let _ = Chan::destroy(old_ptr);
            }
            Ok(())
        })();
        res(r)
    })
}

/// # Safety
/// `qp_attr` and `qp_attr_mask` are valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    guard("rdma_init_qp_attr", -1, || {
        let r = (|| {
            let id_ = lookup(id)?;
            if qp_attr.is_null() || qp_attr_mask.is_null() {
                return Err(libc::EINVAL);
            }
            let d = dev::dev()?;
            // SAFETY: the caller's promise.
            let state = unsafe { (*qp_attr).qp_state };
            let (a, m) = qp::init_attr(&id_, &id_.st.lock(), d, state)?;
            // SAFETY: the caller's promise.
            unsafe {
                *qp_attr = a;
                *qp_attr_mask = m;
            }
            Ok(())
        })();
        res(r)
    })
}

// ---- QPs and SRQs ----

/// # Safety
/// `attr` is valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    guard("rdma_create_qp_ex", -1, || {
        let r = (|| {
            let id_ = lookup(id)?;
            let d = dev::dev()?;
            // SAFETY: the caller's promise.
            let attr = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
            // SAFETY: the application's live id.
            unsafe { qp::create(&id_, d, id, attr) }
        })();
        res(r)
    })
}

/// # Safety
/// `qp_init_attr` is valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard("rdma_create_qp", -1, || {
        let r = (|| {
            let id_ = lookup(id)?;
            let d = dev::dev()?;
            // SAFETY: the caller's promise.
            let ia = unsafe { qp_init_attr.as_mut() }.ok_or(libc::EINVAL)?;
            // SAFETY: plain C data for which zero is valid.
            let mut ex: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
            ex.qp_context = ia.qp_context;
            ex.send_cq = ia.send_cq;
            ex.recv_cq = ia.recv_cq;
            ex.srq = ia.srq;
            ex.cap = ia.cap;
            ex.qp_type = ia.qp_type;
            ex.sq_sig_all = ia.sq_sig_all;
            ex.comp_mask = 1; // IBV_QP_INIT_ATTR_PD
            ex.pd = if pd.is_null() {
                // SAFETY: the application's live id.
                unsafe { (*id).pd }
            } else {
                pd
            };
            // SAFETY: as above.
            let r = unsafe { qp::create(&id_, d, id, &mut ex) };
            ia.send_cq = ex.send_cq;
            ia.recv_cq = ex.recv_cq;
            ia.srq = ex.srq;
            ia.cap = ex.cap;
            r
        })();
        res(r)
    })
}

/// # Safety
/// `id` is NULL or a live id of ours (anything else is refused).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    guard("rdma_destroy_qp", (), || {
        if Id::lookup(id).is_none() {
            return;
        }
        // SAFETY: the application's live id; its QP and CQs are live or NULL.
        unsafe {
            let c = &mut *id;
            if !c.qp.is_null() {
                rdma_sys::ibv_destroy_qp(c.qp);
                c.qp = std::ptr::null_mut();
            }
            qp::destroy_cqs(c);
        }
    })
}

/// # Safety
/// `attr` is valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    guard("rdma_create_srq", -1, || {
        if Id::lookup(id).is_none() || attr.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: the application's live id and attributes.
        unsafe {
            let c = &mut *id;
            let pd = if pd.is_null() { c.pd } else { pd };
            if pd.is_null() || c.verbs.is_null() {
                return fail(libc::EINVAL);
            }
            let srq = rdma_sys::ibv_create_srq(pd, attr);
            if srq.is_null() {
                return -1;
            }
            c.pd = pd;
            c.srq = srq;
        }
        0
    })
}

/// # Safety
/// `attr` is valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_srq_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_srq_init_attr_ex,
) -> c_int {
    guard("rdma_create_srq_ex", -1, || {
        if attr.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: the caller's promise.
        let a = unsafe { &mut *attr };
        // Basic SRQs only (IBV_SRQ_INIT_ATTR_PD, TYPE basic): XRC and tag matching are
        // refused as the provider refuses them.
        const PD: u32 = 1;
        const TYPE: u32 = 2;
        if a.comp_mask & !(PD | TYPE) != 0 || (a.comp_mask & TYPE != 0 && a.srq_type != 0) {
            return fail(libc::EOPNOTSUPP);
        }
        let mut basic = ibv_srq_init_attr {
            srq_context: a.srq_context,
            attr: a.attr,
        };
        let pd = if a.comp_mask & PD != 0 {
            a.pd
        } else {
            std::ptr::null_mut()
        };
        // SAFETY: as above.
        let r = unsafe { rdma_create_srq(id, pd, &mut basic) };
        a.attr = basic.attr;
        r
    })
}

/// # Safety
/// `id` is NULL or a live id of ours (anything else is refused).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    guard("rdma_destroy_srq", (), || {
        if Id::lookup(id).is_none() {
            return;
        }
        // SAFETY: the application's live id; its SRQ is live or NULL.
        unsafe {
            let c = &mut *id;
            if !c.srq.is_null() {
                rdma_sys::ibv_destroy_srq(c.srq);
                c.srq = std::ptr::null_mut();
            }
        }
    })
}

// ---- endpoints (synchronous ids) ----

/// # Safety
/// `id` and `res` are valid; `qp_init_attr` NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res_: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard("rdma_create_ep", -1, || {
        if id.is_null() || res_.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: the caller's promise.
        let ai = unsafe { &*res_ };
        let ps = ai.ai_port_space as u32;
        let qpt = if ai.ai_qp_type != 0 {
            ai.ai_qp_type as u32
        } else {
            QPT_RC
        };
        let cm = match create_id(std::ptr::null_mut(), std::ptr::null_mut(), ps, qpt) {
            Ok(cm) => cm,
            Err(e) => return fail(e),
        };
        let cmu = cm as usize;
        let undo = move |e: c_int| {
            let _ = destroy_id(cmu as *mut rdma_cm_id);
            fail(e)
        };
        // SAFETY: the caller's promise (addresses of the addrinfo).
        unsafe {
            if ai.ai_flags & RAI_PASSIVE != 0 {
                if rdma_bind_addr(cm, ai.ai_src_addr) != 0 {
                    return undo(errno());
                }
                if let (Some(idr), Some(a)) = (Id::lookup(cm), qp_init_attr.as_ref()) {
                    let mut a = *a;
                    a.qp_type = qpt;
                    idr.st.lock().ep_qp_attr = Some(a);
                }
                (*cm).pd = pd;
                *id = cm;
                return 0;
            }
            if rdma_resolve_addr(cm, ai.ai_src_addr, ai.ai_dst_addr, 2000) != 0 {
                return undo(errno());
            }
            if rdma_resolve_route(cm, 2000) != 0 {
                return undo(errno());
            }
            if !pd.is_null() {
                (*cm).pd = pd;
            }
            if let Some(a) = qp_init_attr.as_mut() {
                a.qp_type = qpt;
                if rdma_create_qp(cm, pd, a) != 0 {
                    return undo(errno());
                }
            }
            *id = cm;
        }
        0
    })
}

/// # Safety
/// `id` is NULL or a live id of ours (anything else is refused).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    guard("rdma_destroy_ep", (), || {
        if Id::lookup(id).is_none() {
            return;
        }
        // SAFETY: a live id of ours (looked up above).
        unsafe {
            rdma_destroy_qp(id);
            rdma_destroy_srq(id);
        }
        let _ = destroy_id(id);
    })
}

/// # Safety
/// `id` is a valid out-pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    guard("rdma_get_request", -1, || {
        let r = (|| {
            let l = lookup(listen)?;
            let (sync, chan, ep) = {
                let st = l.st.lock();
                (st.sync, st.chan.clone(), st.ep_qp_attr)
            };
            if !sync || id.is_null() {
                return Err(libc::EINVAL);
            }
            // SAFETY: the application's live listener.
            unsafe {
                if !(*listen).event.is_null() {
                    let _ = ack((*listen).event);
                    (*listen).event = std::ptr::null_mut();
                }
            }
            let ev = next_event(&chan)?;
            // SAFETY: a delivered event.
            let (kind, status, nid) = unsafe { ((*ev).event, (*ev).status, (*ev).id) };
            let err = if kind == EV_REJECTED {
                Some(libc::ECONNREFUSED)
            } else if status != 0 {
                Some(status.abs())
            } else if kind != EV_CONNECT_REQUEST {
                Some(libc::EINVAL)
            } else {
                None
            };
            if let Some(e) = err {
                // SAFETY: as above.
                unsafe { (*listen).event = ev };
                return Err(e);
            }
            if let Some(mut a) = ep {
                // SAFETY: the new id and the listener's PD.
                if unsafe { rdma_create_qp(nid, (*listen).pd, &mut a) } != 0 {
                    let e = errno();
                    // SAFETY: as above.
                    unsafe { (*listen).event = ev };
                    return Err(e);
                }
            }
            // SAFETY: the caller's out-pointer; the new id is live.
            unsafe {
                *id = nid;
                (*nid).event = ev;
            }
            Ok(())
        })();
        res(r)
    })
}

// ---- options, ports, devices, strings ----

#[unsafe(no_mangle)]
pub extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    _optlen: usize,
) -> c_int {
    guard("rdma_set_option", -1, || {
        let Some(idr) = Id::lookup(id) else {
            return fail(libc::EINVAL);
        };
        if optval.is_null() {
            return fail(libc::EINVAL);
        }
        // RDMA_OPTION_ID (0): TOS (0), REUSEADDR (1), AFONLY (2), ACK_TIMEOUT (3);
        // RDMA_OPTION_IB (1): PATH (1). ACK_TIMEOUT (a u8, as the kernel reads it) sets
        // the QP's local ACK timeout at RTS; the others are accepted and have no effect
        // on the soft transport (no ToS, one path, sockets reuse addresses already);
        // anything else is the kernel's ENOSYS.
        match (level, optname) {
            (0, 3) => {
                // SAFETY: the caller's option value (at least one byte).
                let v = unsafe { *(optval as *const u8) };
                if v > 31 {
                    return fail(libc::EINVAL);
                }
                idr.st.lock().ack_timeout = Some(v);
                0
            }
            (0, 0..=2) | (1, 1) => 0,
            _ => fail(libc::ENOSYS),
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_notify(id: *mut rdma_cm_id, _event: c_int) -> c_int {
    guard("rdma_notify", -1, || {
        if Id::lookup(id).is_none() {
            return fail(libc::EINVAL);
        }
        0
    })
}

fn port_of(sa: *const libc::sockaddr) -> u16 {
    // SAFETY: the storage member of an id's route holds a socket address or zeros.
    unsafe { dev::from_c(sa) }.map_or(0, |a| a.port().to_be())
}

/// # Safety
/// `id` is a live id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: the caller's promise.
    guard("rdma_get_src_port", 0, || unsafe {
        port_of(&(*id).route.addr.src_addr_union.src_addr)
    })
}

/// # Safety
/// `id` is a live id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: the caller's promise.
    guard("rdma_get_dst_port", 0, || unsafe {
        port_of(&(*id).route.addr.dst_addr_union.dst_addr)
    })
}

/// # Safety
/// `num_devices` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
    guard("rdma_get_devices", std::ptr::null_mut(), || {
        let ctx = dev::dev().map(|d| d.ctx).ok();
        // SAFETY: calloc of two pointers, freed by rdma_free_devices.
        let list = unsafe { libc::calloc(2, std::mem::size_of::<*mut ibv_context>()) }
            as *mut *mut ibv_context;
        if list.is_null() {
            set_errno(libc::ENOMEM);
            return list;
        }
        // SAFETY: list holds two slots; the caller's out-pointer.
        unsafe {
            if let Some(c) = ctx {
                *list = c;
            }
            if !num_devices.is_null() {
                *num_devices = c_int::from(ctx.is_some());
            }
        }
        list
    })
}

/// # Safety
/// `list` came from rdma_get_devices.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: the caller's promise (calloc'd by rdma_get_devices).
    guard("rdma_free_devices", (), || unsafe {
        libc::free(list.cast())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_event_str(event: u32) -> *const c_char {
    const NAMES: [&std::ffi::CStr; 17] = [
        c"RDMA_CM_EVENT_ADDR_RESOLVED",
        c"RDMA_CM_EVENT_ADDR_ERROR",
        c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        c"RDMA_CM_EVENT_ROUTE_ERROR",
        c"RDMA_CM_EVENT_CONNECT_REQUEST",
        c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        c"RDMA_CM_EVENT_CONNECT_ERROR",
        c"RDMA_CM_EVENT_UNREACHABLE",
        c"RDMA_CM_EVENT_REJECTED",
        c"RDMA_CM_EVENT_ESTABLISHED",
        c"RDMA_CM_EVENT_DISCONNECTED",
        c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        c"RDMA_CM_EVENT_MULTICAST_JOIN",
        c"RDMA_CM_EVENT_MULTICAST_ERROR",
        c"RDMA_CM_EVENT_ADDR_CHANGE",
        c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        c"UNKNOWN EVENT",
    ];
    NAMES[(event as usize).min(16)].as_ptr()
}

// ---- what rdmx0 does not do ----

/// Multicast: rdmx0's UD QPs have no multicast (`ibv_attach_mcast` is EOPNOTSUPP), so
/// joining a group answers ENOSYS.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_join_multicast(
    _id: *mut rdma_cm_id,
    _addr: *mut libc::sockaddr,
    _context: *mut c_void,
) -> c_int {
    fail(libc::ENOSYS)
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_join_multicast_ex(
    _id: *mut rdma_cm_id,
    _attr: *mut c_void,
    _context: *mut c_void,
) -> c_int {
    fail(libc::ENOSYS)
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_leave_multicast(_id: *mut rdma_cm_id, _addr: *mut libc::sockaddr) -> c_int {
    fail(libc::ENOSYS)
}

/// ECE (enhanced connection establishment): vendor options rdmx0 has none of; rxe
/// answers EOPNOTSUPP (`ibv_set_ece`/`ibv_query_ece`).
#[unsafe(no_mangle)]
pub extern "C" fn rdma_set_local_ece(_id: *mut rdma_cm_id, _ece: *mut c_void) -> c_int {
    fail(libc::EOPNOTSUPP)
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_get_remote_ece(_id: *mut rdma_cm_id, _ece: *mut c_void) -> c_int {
    fail(libc::EOPNOTSUPP)
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_reject_ece(_id: *mut rdma_cm_id, _pdata: *const c_void, _len: u8) -> c_int {
    fail(libc::EOPNOTSUPP)
}
