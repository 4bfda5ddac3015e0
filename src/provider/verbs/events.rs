//! The device's async events (`ibv_get_async_event` / `ibv_ack_async_event` on the
//! context's `async_fd`, made non-blocking): read by the device's watcher thread as soon
//! as the fd is readable, each one acknowledged at once (after its object's identity was
//! copied), then acted on: an error event about a connection's QP or CQ fails that QP and
//! becomes its connection's failure note; a device-wide error fails every QP; every event
//! is counted (per connection, and per device) and logged.
//!
//! rdma-sys declares `struct ibv_async_event` with a Rust enum for `event_type`, which a
//! value the enum lacks (a newer libibverbs) would make undefined behaviour: the struct is
//! read here as [`RawEvent`], an integer in its place (`layout` checks it against C).

use rdma_sys as ib;

/// `struct ibv_async_event` with `event_type` as an integer.
#[repr(C)]
pub(crate) struct RawEvent {
    pub element: Element,
    pub event_type: u32,
}

/// The union `element`: `struct ibv_cq *`, `ibv_qp *`, `ibv_srq *`, `ibv_wq *` (all
/// pointers: one member here) or `int port_num`, by event type.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) union Element {
    pub ptr: *mut libc::c_void,
    pub port_num: libc::c_int,
}

/// `enum ibv_event_type` (verbs.h).
pub(crate) mod kind {
    pub const CQ_ERR: u32 = 0;
    pub const QP_FATAL: u32 = 1;
    pub const QP_REQ_ERR: u32 = 2;
    pub const QP_ACCESS_ERR: u32 = 3;
    pub const COMM_EST: u32 = 4;
    pub const SQ_DRAINED: u32 = 5;
    pub const PATH_MIG: u32 = 6;
    pub const PATH_MIG_ERR: u32 = 7;
    pub const DEVICE_FATAL: u32 = 8;
    pub const PORT_ACTIVE: u32 = 9;
    pub const PORT_ERR: u32 = 10;
    pub const LID_CHANGE: u32 = 11;
    pub const PKEY_CHANGE: u32 = 12;
    pub const SM_CHANGE: u32 = 13;
    pub const SRQ_ERR: u32 = 14;
    pub const SRQ_LIMIT_REACHED: u32 = 15;
    pub const QP_LAST_WQE_REACHED: u32 = 16;
    pub const CLIENT_REREGISTER: u32 = 17;
    pub const GID_CHANGE: u32 = 18;
    pub const WQ_FATAL: u32 = 19;
}

/// What an event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Subject {
    /// A QP (`element.qp`, with its `qp_num` read before the ack).
    Qp { qp: usize, qpn: u32 },
    /// A CQ (`element.cq`).
    Cq(usize),
    /// A port (`element.port_num`).
    Port(u8),
    /// The device, an SRQ or a WQ (rdmx makes neither SRQs nor WQs).
    Other,
}

/// An event read and acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Event {
    pub kind: u32,
    pub subject: Subject,
}

/// The event's name (verbs' `ibv_event_type_str` without its lower case).
pub(crate) fn name(k: u32) -> &'static str {
    use kind::*;
    match k {
        CQ_ERR => "CQ_ERR",
        QP_FATAL => "QP_FATAL",
        QP_REQ_ERR => "QP_REQ_ERR",
        QP_ACCESS_ERR => "QP_ACCESS_ERR",
        COMM_EST => "COMM_EST",
        SQ_DRAINED => "SQ_DRAINED",
        PATH_MIG => "PATH_MIG",
        PATH_MIG_ERR => "PATH_MIG_ERR",
        DEVICE_FATAL => "DEVICE_FATAL",
        PORT_ACTIVE => "PORT_ACTIVE",
        PORT_ERR => "PORT_ERR",
        LID_CHANGE => "LID_CHANGE",
        PKEY_CHANGE => "PKEY_CHANGE",
        SM_CHANGE => "SM_CHANGE",
        SRQ_ERR => "SRQ_ERR",
        SRQ_LIMIT_REACHED => "SRQ_LIMIT_REACHED",
        QP_LAST_WQE_REACHED => "QP_LAST_WQE_REACHED",
        CLIENT_REREGISTER => "CLIENT_REREGISTER",
        GID_CHANGE => "GID_CHANGE",
        WQ_FATAL => "WQ_FATAL",
        _ => "unknown event",
    }
}

/// For an event that means the QP is in the error state (or its path is gone): why, in
/// words. None for informational events.
pub(crate) fn qp_error(k: u32) -> Option<&'static str> {
    use kind::*;
    match k {
        QP_FATAL => Some(
            "the device moved the QP to the error state by itself (a NAK from the peer such \
             as a remote access or invalid request error, an error on the peer's QP, a local \
             work queue error)",
        ),
        QP_REQ_ERR => {
            Some("the responder saw an invalid request (a transport or opcode error from the peer)")
        }
        QP_ACCESS_ERR => Some(
            "the responder saw a local access violation (a peer's READ or WRITE outside what \
             this side registered or exposed)",
        ),
        CQ_ERR => Some("a completion queue overran (cq_size too small for the WRs in flight)"),
        PATH_MIG_ERR => Some("path migration failed: no alternate path to the peer"),
        DEVICE_FATAL => Some("the device reported a fatal error (reset, firmware fault)"),
        _ => None,
    }
}

/// Reads the next event of `ctx` (whose `async_fd` is non-blocking), copies what it is
/// about and acknowledges it; None when none is queued (EAGAIN) or the read failed.
pub(crate) fn next(ctx: *mut ib::ibv_context) -> Option<Event> {
    let mut ev = RawEvent {
        element: Element {
            ptr: std::ptr::null_mut(),
        },
        event_type: 0,
    };
    // SAFETY: `ctx` is an open context; `ev` has the layout of `struct ibv_async_event`
    // (checked by `layout`), which the call fills in.
    let rc = unsafe { ib::ibv_get_async_event(ctx, (&raw mut ev).cast()) };
    if rc != 0 {
        return None;
    }
    use kind::*;
    let subject = match ev.event_type {
        QP_FATAL | QP_REQ_ERR | QP_ACCESS_ERR | COMM_EST | SQ_DRAINED | PATH_MIG
        | PATH_MIG_ERR | QP_LAST_WQE_REACHED => {
            // SAFETY: a QP event's element is the `struct ibv_qp *` member.
            let qp = unsafe { ev.element.ptr }.cast::<ib::ibv_qp>();
            // SAFETY: for QP events `element.qp` is the QP, which stays allocated until
            // the event is acknowledged (below): libibverbs makes ibv_destroy_qp wait.
            let qpn = if qp.is_null() { 0 } else { unsafe { (*qp).qp_num } };
            Subject::Qp {
                qp: qp as usize,
                qpn,
            }
        }
        // SAFETY: a CQ event's element is the `struct ibv_cq *` member.
        CQ_ERR => Subject::Cq(unsafe { ev.element.ptr } as usize),
        PORT_ACTIVE | PORT_ERR | LID_CHANGE | PKEY_CHANGE | SM_CHANGE | CLIENT_REREGISTER
        // SAFETY: a port event's element is `port_num`.
        | GID_CHANGE => Subject::Port(u8::try_from(unsafe { ev.element.port_num }).unwrap_or(0)),
        _ => Subject::Other,
    };
    // SAFETY: an event ibv_get_async_event returned, acknowledged once.
    unsafe { ib::ibv_ack_async_event((&raw mut ev).cast()) };
    Some(Event {
        kind: ev.event_type,
        subject,
    })
}
