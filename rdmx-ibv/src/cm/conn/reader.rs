//! One reader per connection: the peer's messages, its going away and the deadlines
//! of the waits, turned into events.

use super::*;

/// Reads what is there (up to one tick): Ok(true) got bytes, Ok(false) nothing yet,
/// Err on EOF or error.
pub(super) fn read_some(s: &TcpStream, buf: &mut Vec<u8>) -> Result<bool, ()> {
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
pub(super) fn learn_port(m: &Msg) {
    if m.qpn != 0 {
        crate::verbs::peer_port::learn(dev::gid_ip(&m.gid), m.qpn, m.udp_port);
    }
}

/// Reads the connection's messages until it ends or the id is done.
pub(super) fn reader(id: Arc<Id>, s: Arc<TcpStream>) {
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
pub(super) fn conn_from(m: &Msg) -> impl FnOnce(&mut rdma_cm_event) + '_ {
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
pub(super) fn on_message(id: &Arc<Id>, m: Msg) -> bool {
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
            post_bare(id, &st, EV_DISCONNECTED, 0, Fixup::None);
            true
        }
        (State::Disconnecting, Kind::Drep) => {
            st.state = State::Disconnected;
            st.deadline = None;
            post_bare(id, &st, EV_DISCONNECTED, 0, Fixup::None);
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
pub(super) fn on_gone(id: &Arc<Id>) {
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
            post_bare(id, &st, EV_DISCONNECTED, 0, Fixup::None);
        }
        _ => {}
    }
    st.sock = None;
}

/// A tick without bytes: ends a wait whose deadline passed; false when done.
pub(super) fn on_tick(id: &Arc<Id>) -> bool {
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
            post_bare(id, &st, EV_UNREACHABLE, -libc::ETIMEDOUT, Fixup::QpToErr);
        }
        // No DREP: DISCONNECTED all the same (the kernel's DREQ timeout).
        Wait::Drep => {
            st.state = State::Disconnected;
            post_bare(id, &st, EV_DISCONNECTED, -libc::ETIMEDOUT, Fixup::None);
        }
    }
    if let Some(s) = st.sock.take() {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    false
}
