//! Endpoints: `rdma_create_ep`, `rdma_destroy_ep`, `rdma_get_request` (synchronous
//! ids).

use super::*;

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
