//! QPs of connection ids: `rdma_create_qp(_ex)`, `rdma_init_qp_attr`, and the moves to
//! RTR and RTS from the exchanged QPN, PSN, GID and MTU, all through libibverbs' public
//! calls on the rdmx0 context (so the QP is the application's ordinary verbs QP).
//!
//! The attributes are the kernel CM's (`cma_ib_init_qp_attr`, `cm_init_qp_*_attr`):
//! INIT with P_Key index 0, port 1 and no remote access before a peer is known, then
//! REMOTE_WRITE (+ REMOTE_READ and REMOTE_ATOMIC with responder resources); RTR with the
//! peer's QPN and PSN, the smaller MTU of both ports, `max_dest_rd_atomic` the
//! negotiated responder resources and `min_rnr_timer` 0; RTS with our PSN, the REQ's
//! retry count and RNR retry count, `max_rd_atomic` the negotiated initiator depth and a
//! local ACK timeout of 14 (67 ms). UD QPs get Q_Key `RDMA_UDP_QKEY` and go to RTS at
//! creation, as librdmacm's `ucma_init_ud_qp`.

use super::dev::Dev;
use super::id::{Id, QPT_UD, St};
use rdma_sys::{
    ibv_comp_channel, ibv_cq, ibv_qp, ibv_qp_attr, ibv_qp_init_attr, ibv_qp_init_attr_ex,
    rdma_cm_id,
};
use std::ffi::c_int;

pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

// enum ibv_qp_attr_mask
pub const M_STATE: c_int = 1;
pub const M_ACCESS_FLAGS: c_int = 1 << 3;
pub const M_PKEY_INDEX: c_int = 1 << 4;
pub const M_PORT: c_int = 1 << 5;
pub const M_QKEY: c_int = 1 << 6;
pub const M_AV: c_int = 1 << 7;
pub const M_PATH_MTU: c_int = 1 << 8;
pub const M_TIMEOUT: c_int = 1 << 9;
pub const M_RETRY_CNT: c_int = 1 << 10;
pub const M_RNR_RETRY: c_int = 1 << 11;
pub const M_RQ_PSN: c_int = 1 << 12;
pub const M_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const M_MIN_RNR_TIMER: c_int = 1 << 15;
pub const M_SQ_PSN: c_int = 1 << 16;
pub const M_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const M_DEST_QPN: c_int = 1 << 20;

// enum ibv_qp_state
pub const QPS_INIT: u32 = 1;
pub const QPS_RTR: u32 = 2;
pub const QPS_RTS: u32 = 3;
pub const QPS_ERR: u32 = 6;

const ACCESS_REMOTE_WRITE: u32 = 1 << 1;
const ACCESS_REMOTE_READ: u32 = 1 << 2;
const ACCESS_REMOTE_ATOMIC: u32 = 1 << 3;

/// The local ACK timeout of connected QPs (4.096 us * 2^14 = 67 ms).
pub const ACK_TIMEOUT: u8 = 14;
const IBV_QP_INIT_ATTR_PD: u32 = 1;
const IBV_QP_INIT_ATTR_CREATE_FLAGS: u32 = 1 << 3;

/// `rdma_init_qp_attr` for `state` (`attr.qp_state` on entry): the attributes and mask
/// the kernel CM would give at this point of the connection.
pub fn init_attr(id: &Id, st: &St, dev: &Dev, state: u32) -> Result<(ibv_qp_attr, c_int), c_int> {
    // SAFETY: plain C data for which zero is valid.
    let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
    a.qp_state = state;
    let ud = id.qp_type == QPT_UD;
    let mask = match state {
        QPS_INIT => {
            a.pkey_index = 0;
            a.port_num = 1;
            if ud {
                a.qkey = RDMA_UDP_QKEY;
                M_STATE | M_PKEY_INDEX | M_PORT | M_QKEY
            } else {
                if st.peer.is_some() {
                    a.qp_access_flags = ACCESS_REMOTE_WRITE;
                    if st.resp_res > 0 {
                        a.qp_access_flags |= ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC;
                    }
                }
                M_STATE | M_ACCESS_FLAGS | M_PKEY_INDEX | M_PORT
            }
        }
        QPS_RTR if ud => M_STATE,
        QPS_RTR => {
            let Some(p) = st.peer.as_ref() else {
                return Err(libc::EINVAL);
            };
            a.path_mtu = dev.mtu.min(p.mtu).max(1) as u32;
            a.dest_qp_num = p.qpn;
            a.rq_psn = p.psn;
            a.max_dest_rd_atomic = st.resp_res;
            a.min_rnr_timer = 0;
            a.ah_attr.is_global = 1;
            a.ah_attr.port_num = 1;
            a.ah_attr.grh.dgid.raw = p.gid;
            a.ah_attr.grh.sgid_index = 0;
            a.ah_attr.grh.hop_limit = 64;
            M_STATE
                | M_AV
                | M_PATH_MTU
                | M_DEST_QPN
                | M_RQ_PSN
                | M_MAX_DEST_RD_ATOMIC
                | M_MIN_RNR_TIMER
        }
        QPS_RTS if ud => {
            a.sq_psn = 0;
            M_STATE | M_SQ_PSN
        }
        QPS_RTS => {
            if st.peer.is_none() {
                return Err(libc::EINVAL);
            }
            a.sq_psn = st.psn;
            a.timeout = st.ack_timeout.unwrap_or(ACK_TIMEOUT);
            a.retry_cnt = st.retry.min(7);
            a.rnr_retry = st.rnr_retry.min(7);
            a.max_rd_atomic = st.init_depth;
            M_STATE | M_TIMEOUT | M_RETRY_CNT | M_RNR_RETRY | M_SQ_PSN | M_MAX_QP_RD_ATOMIC
        }
        _ => return Err(libc::EINVAL),
    };
    Ok((a, mask))
}

/// `ibv_modify_qp`, as an errno.
pub(crate) fn modify(qp: *mut ibv_qp, mut a: ibv_qp_attr, mask: c_int) -> Result<(), c_int> {
    // SAFETY: qp is the id's live QP; a is a complete attribute structure.
    match unsafe { rdma_sys::ibv_modify_qp(qp, &mut a, mask) } {
        0 => Ok(()),
        e => Err(e),
    }
}

/// Moves `qp` through `states` with the id's attributes.
pub(crate) fn walk(id: &Id, dev: &Dev, qp: *mut ibv_qp, states: &[u32]) -> Result<(), c_int> {
    for &s in states {
        let (a, m) = init_attr(id, &id.st.lock(), dev, s)?;
        modify(qp, a, m)?;
    }
    Ok(())
}

/// The connected QP to RTR and RTS (librdmacm's `ucma_modify_qp_rtr`/`_rts`: INIT again
/// first, which sets the access flags now that the peer is known).
pub(crate) fn connect(id: &Id, dev: &Dev, qp: *mut ibv_qp) -> Result<(), c_int> {
    walk(id, dev, qp, &[QPS_INIT, QPS_RTR, QPS_RTS])
}

pub(crate) fn to_err(qp: *mut ibv_qp) {
    if qp.is_null() {
        return;
    }
    // SAFETY: plain C data for which zero is valid.
    let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
    a.qp_state = QPS_ERR;
    let _ = modify(qp, a, M_STATE);
}

/// `rdma_create_qp_ex`.
///
/// # Safety
/// `cm` is the live public structure of `id`; `attr` a valid attribute structure.
pub unsafe fn create(
    id: &Id,
    dev: &Dev,
    cm: *mut rdma_cm_id,
    attr: &mut ibv_qp_init_attr_ex,
) -> Result<(), c_int> {
    // SAFETY: the caller's promise.
    let c = unsafe { &mut *cm };
    if !c.qp.is_null() || c.verbs.is_null() {
        return Err(libc::EINVAL);
    }
    if attr.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || attr.pd.is_null() {
        attr.comp_mask |= IBV_QP_INIT_ATTR_PD;
        attr.pd = c.pd;
    // SAFETY: a PD given by the application is live.
    } else if unsafe { (*attr.pd).context } != c.verbs {
        return Err(libc::EINVAL);
    }
    if attr.pd.is_null() {
        return Err(libc::EINVAL);
    }
    if attr.comp_mask & !(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS) != 0
        || attr.create_flags != 0
    {
        // What the provider's create_qp_ex refuses too (XRCD, TSO, RSS, send ops).
        return Err(libc::EOPNOTSUPP);
    }
    if (!c.recv_cq.is_null() && !attr.recv_cq.is_null() && c.recv_cq != attr.recv_cq)
        || (!c.send_cq.is_null() && !attr.send_cq.is_null() && c.send_cq != attr.send_cq)
    {
        return Err(libc::EINVAL);
    }
    let send_size = if attr.send_cq.is_null() && c.send_cq.is_null() {
        attr.cap.max_send_wr
    } else {
        0
    };
    let recv_size = if attr.recv_cq.is_null() && c.recv_cq.is_null() {
        attr.cap.max_recv_wr
    } else {
        0
    };
    // SAFETY: as above.
    unsafe { create_cqs(c, send_size, recv_size)? };
    if attr.send_cq.is_null() {
        attr.send_cq = c.send_cq;
    }
    if attr.recv_cq.is_null() {
        attr.recv_cq = c.recv_cq;
    }
    if !c.srq.is_null() && attr.srq.is_null() {
        attr.srq = c.srq;
    }
    let mut ia = ibv_qp_init_attr {
        qp_context: attr.qp_context,
        send_cq: attr.send_cq,
        recv_cq: attr.recv_cq,
        srq: attr.srq,
        cap: attr.cap,
        qp_type: attr.qp_type,
        sq_sig_all: attr.sq_sig_all,
    };
    // SAFETY: a live PD and a complete attribute structure.
    let qp = unsafe { rdma_sys::ibv_create_qp(attr.pd, &mut ia) };
    if qp.is_null() {
        let e = super::chan::errno();
        // SAFETY: as above.
        unsafe { destroy_cqs(c) };
        return Err(e);
    }
    attr.cap = ia.cap;
    let states: &[u32] = if id.qp_type == QPT_UD {
        &[QPS_INIT, QPS_RTR, QPS_RTS]
    } else {
        &[QPS_INIT]
    };
    // A connected QP before its peer is known gets INIT without remote access; a
    // passive id's QP (made after the REQ) gets the access flags at once.
    let first = walk(id, dev, qp, states);
    if let Err(e) = first {
        // SAFETY: the QP just made, not handed out.
        unsafe {
            rdma_sys::ibv_destroy_qp(qp);
            destroy_cqs(c);
        }
        return Err(e);
    }
    // SAFETY: a live QP.
    c.pd = unsafe { (*qp).pd };
    c.qp = qp;
    Ok(())
}

/// librdmacm's `ucma_create_cqs`: a completion channel and CQ for each direction the
/// application left without one (the CQ's context is the id).
///
/// # Safety
/// `c` is a live id with `verbs` set.
unsafe fn create_cqs(c: &mut rdma_cm_id, send_size: u32, recv_size: u32) -> Result<(), c_int> {
    let one = |size: u32, ch: &mut *mut ibv_comp_channel, cq: &mut *mut ibv_cq| {
        // SAFETY: the id's live context.
        let chan = unsafe { rdma_sys::ibv_create_comp_channel(c.verbs) };
        if chan.is_null() {
            return Err(super::chan::errno());
        }
        *ch = chan;
        // SAFETY: as above.
        let q = unsafe {
            rdma_sys::ibv_create_cq(c.verbs, size as c_int, c as *const _ as *mut _, chan, 0)
        };
        if q.is_null() {
            return Err(super::chan::errno());
        }
        *cq = q;
        Ok(())
    };
    let (mut rch, mut rcq, mut sch, mut scq) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    let mut r = Ok(());
    if recv_size > 0 {
        r = one(recv_size, &mut rch, &mut rcq);
    }
    if r.is_ok() && send_size > 0 {
        r = one(send_size, &mut sch, &mut scq);
    }
    if recv_size > 0 {
        c.recv_cq_channel = rch;
        c.recv_cq = rcq;
    }
    if send_size > 0 {
        c.send_cq_channel = sch;
        c.send_cq = scq;
    }
    if let Err(e) = r {
        // SAFETY: as above.
        unsafe { destroy_cqs(c) };
        return Err(e);
    }
    Ok(())
}

/// librdmacm's `ucma_destroy_cqs`.
///
/// # Safety
/// `c` is a live id; its CQs and channels are live or NULL.
pub unsafe fn destroy_cqs(c: &mut rdma_cm_id) {
    // SAFETY: the caller's promise; each object is destroyed once and cleared.
    unsafe {
        if !c.recv_cq.is_null() {
            rdma_sys::ibv_destroy_cq(c.recv_cq);
            if !c.send_cq.is_null() && c.send_cq != c.recv_cq {
                rdma_sys::ibv_destroy_cq(c.send_cq);
                c.send_cq = std::ptr::null_mut();
            }
            c.recv_cq = std::ptr::null_mut();
        } else if !c.send_cq.is_null() {
            rdma_sys::ibv_destroy_cq(c.send_cq);
            c.send_cq = std::ptr::null_mut();
        }
        if !c.recv_cq_channel.is_null() {
            rdma_sys::ibv_destroy_comp_channel(c.recv_cq_channel);
            if !c.send_cq_channel.is_null() && c.send_cq_channel != c.recv_cq_channel {
                rdma_sys::ibv_destroy_comp_channel(c.send_cq_channel);
                c.send_cq_channel = std::ptr::null_mut();
            }
            c.recv_cq_channel = std::ptr::null_mut();
        } else if !c.send_cq_channel.is_null() {
            rdma_sys::ibv_destroy_comp_channel(c.send_cq_channel);
            c.send_cq_channel = std::ptr::null_mut();
        }
    }
}
