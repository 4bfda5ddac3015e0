//! The connection: `rdma_connect`, `rdma_accept`, `rdma_reject`, `rdma_establish`,
//! `rdma_disconnect`.

use super::*;

/// librdmacm's `ucma_valid_param`.
pub(super) fn valid_param(
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
pub(super) unsafe fn pdata(p: Option<&rdma_conn_param>) -> Vec<u8> {
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

pub(super) fn connect(cmp: *mut rdma_cm_id, p: Option<&rdma_conn_param>) -> Result<(), c_int> {
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

pub(super) fn accept(cmp: *mut rdma_cm_id, p: Option<&rdma_conn_param>) -> Result<(), c_int> {
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

pub(super) fn st_sync(id: &Id) -> bool {
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

pub(super) fn reject(cmp: *mut rdma_cm_id, pdata: &[u8]) -> Result<(), c_int> {
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
