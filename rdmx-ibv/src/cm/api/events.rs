//! Event channels and events: `rdma_create_event_channel`, `rdma_get_cm_event`,
//! `rdma_ack_cm_event`, and the synchronous ids' wait.

use super::*;

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
pub(super) fn next_event(chan: &Chan) -> Result<*mut rdma_cm_event, c_int> {
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
                crate::cm::chan::wait_forever();
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

pub(super) fn ack(event: *mut rdma_cm_event) -> Result<(), c_int> {
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
pub(super) fn complete(id: &Arc<Id>) -> Result<(), c_int> {
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
