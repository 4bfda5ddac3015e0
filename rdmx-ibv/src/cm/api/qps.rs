//! `rdma_create_qp(_ex)`, `rdma_destroy_qp`, SRQs of ids.

use super::*;

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
