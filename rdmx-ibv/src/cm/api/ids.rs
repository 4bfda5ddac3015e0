//! Ids: create, destroy, bind, resolve (address and route), listen, migrate,
//! `rdma_init_qp_attr`.

use super::*;

pub(super) fn create_id(
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

pub(super) fn destroy_id(cm: *mut rdma_cm_id) -> Result<(), c_int> {
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
pub(super) fn bind(id: &Arc<Id>, a: SocketAddr, reuse: bool) -> Result<(), c_int> {
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
pub(super) fn routable(dst: SocketAddr) -> Result<(), c_int> {
    let s = std::net::UdpSocket::bind(if dst.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
    s.connect(dst)
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EHOSTUNREACH))
}

pub(super) fn resolve_addr(
    id: &Arc<Id>,
    src: Option<SocketAddr>,
    dst: SocketAddr,
) -> Result<(), c_int> {
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
