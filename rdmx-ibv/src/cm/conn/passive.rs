//! The passive side: `rdma_listen`'s accept loop, and each accepted connection's REQ
//! turned into a new id and a CONNECT_REQUEST.

use super::*;

/// `rdma_listen`: the bound socket listens; a thread accepts.
pub fn listen(id: &Arc<Id>, fd: OwnedFd, backlog: c_int) -> Result<Arc<TcpListener>, c_int> {
    // SAFETY: listen(2) on our bound socket.
    if unsafe { libc::listen(fd.as_raw_fd(), backlog.max(1)) } != 0 {
        return Err(crate::cm::chan::errno());
    }
    let l = Arc::new(TcpListener::from(fd));
    let (lid, ll) = (id.clone(), l.clone());
    std::thread::Builder::new()
        .name("rdmx-cm-listen".into())
        .spawn(move || accept_loop(lid, ll))
        .map_err(|_| libc::ENOMEM)?;
    Ok(l)
}

pub(super) fn accept_loop(lid: Arc<Id>, l: Arc<TcpListener>) {
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
pub(super) fn passive(lid: Arc<Id>, s: TcpStream) {
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
        match crate::cm::chan::Chan::create() {
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
        st.psn = crate::cm::api::new_psn();
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
