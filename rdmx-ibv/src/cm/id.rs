//! Connection identifiers (`struct rdma_cm_id`) and their state.
//!
//! An id handed out is a `Box<IdBox>` whose first member is the public structure (the
//! program reads `verbs`, `qp`, `route`, `context`, `event`, the CQs directly); its path
//! record follows (`route.path_rec` points at it). The state machine behind it is an
//! [`Id`] (shared with the id's connection thread and the events naming it). The box is
//! freed when the id is destroyed *and* no event naming it is queued or unacknowledged,
//! so a program that destroys an id before acknowledging its event reads no freed memory
//! (librdmacm makes `rdma_destroy_id` wait for the acknowledgement instead).

use super::chan::{Chan, EventBox, Fixup, PDATA_ROOM, release};
use super::wire::Msg;
use parking_lot::Mutex;
use rdma_sys::{ibv_qp_init_attr, ibv_sa_path_rec, rdma_cm_event, rdma_cm_id, rdma_event_channel};
use std::collections::HashMap;
use std::ffi::c_void;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

// enum rdma_cm_event_type
pub const EV_ADDR_RESOLVED: u32 = 0;
pub const EV_ADDR_ERROR: u32 = 1;
pub const EV_ROUTE_RESOLVED: u32 = 2;
pub const EV_CONNECT_REQUEST: u32 = 4;
pub const EV_CONNECT_RESPONSE: u32 = 5;
pub const EV_CONNECT_ERROR: u32 = 6;
pub const EV_UNREACHABLE: u32 = 7;
pub const EV_REJECTED: u32 = 8;
pub const EV_ESTABLISHED: u32 = 9;
pub const EV_DISCONNECTED: u32 = 10;

// enum rdma_port_space
pub const PS_IPOIB: u32 = 0x0002;
pub const PS_TCP: u32 = 0x0106;
pub const PS_UDP: u32 = 0x0111;
pub const PS_IB: u32 = 0x013f;

// enum ibv_qp_type
pub const QPT_RC: u32 = 2;
pub const QPT_UD: u32 = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Idle,
    Bound,
    AddrResolved,
    RouteResolved,
    Listening,
    /// Active: REQ (or SIDR_REQ) on its way, no answer yet.
    Connecting,
    /// Active without a QP of `rdma_create_qp`: REP reported as CONNECT_RESPONSE,
    /// waiting for `rdma_establish`.
    RepRcvd,
    /// Passive: CONNECT_REQUEST reported, not yet accepted or rejected.
    ReqRcvd,
    /// Passive: REP sent, waiting for the RTU.
    Accepted,
    Connected,
    /// DREQ sent, waiting for the DREP.
    Disconnecting,
    Disconnected,
    /// Rejected, unreachable or failed: nothing more happens on this id.
    Done,
}

/// What a deadline ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    Rep,
    Rtu,
    Drep,
}

#[repr(C)]
pub struct IdBox {
    pub id: rdma_cm_id,
    pub path: ibv_sa_path_rec,
}

pub struct St {
    pub chan: Arc<Chan>,
    pub chan_ptr: *mut rdma_event_channel,
    /// Created without a channel: operations wait for their own event.
    pub sync: bool,
    pub state: State,
    pub sock: Option<Arc<TcpStream>>,
    pub listener: Option<Arc<TcpListener>>,
    /// Bound (`rdma_bind_addr`, `rdma_resolve_addr`), not yet listening or connecting.
    pub bound_fd: Option<OwnedFd>,
    pub local: Option<SocketAddr>,
    pub remote: Option<SocketAddr>,
    /// The peer's REQ (passive) or REP (active).
    pub peer: Option<Msg>,
    /// Our first send PSN.
    pub psn: u32,
    /// Negotiated as librdmacm does (`id_priv->responder_resources/initiator_depth`).
    pub resp_res: u8,
    pub init_depth: u8,
    pub retry: u8,
    pub rnr_retry: u8,
    pub deadline: Option<(Instant, Wait)>,
    /// `rdma_create_ep` of a listener: the QP each `rdma_get_request` creates.
    pub ep_qp_attr: Option<ibv_qp_init_attr>,
    /// `RDMA_OPTION_ID_ACK_TIMEOUT`: the local ACK timeout at RTS instead of the default.
    pub ack_timeout: Option<u8>,
}

// SAFETY: the raw pointers name objects that live while the id does; they are only used
// under the id's lock or by the application's own calls.
unsafe impl Send for St {}

pub struct Id {
    public: AtomicUsize,
    pub ps: u32,
    pub qp_type: u32,
    pub st: Mutex<St>,
    refs: AtomicUsize,
    destroyed: AtomicBool,
    freed: AtomicBool,
}

fn registry() -> &'static Mutex<HashMap<usize, Arc<Id>>> {
    static R: OnceLock<Mutex<HashMap<usize, Arc<Id>>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

impl Id {
    /// A new id on `chan`, registered; its public structure is zeroed but for the
    /// channel, context, port space and QP type.
    pub fn create(
        chan_ptr: *mut rdma_event_channel,
        chan: Arc<Chan>,
        sync: bool,
        context: *mut c_void,
        ps: u32,
        qp_type: u32,
    ) -> (*mut rdma_cm_id, Arc<Id>) {
        // SAFETY: both structures are plain C data for which zero is valid.
        let mut b: Box<IdBox> = Box::new(unsafe { std::mem::zeroed() });
        b.id.channel = chan_ptr;
        b.id.context = context;
        b.id.ps = ps;
        b.id.qp_type = qp_type;
        let p = Box::into_raw(b);
        let id = Arc::new(Id {
            public: AtomicUsize::new(p as usize),
            ps,
            qp_type,
            st: Mutex::new(St {
                chan,
                chan_ptr,
                sync,
                state: State::Idle,
                sock: None,
                listener: None,
                bound_fd: None,
                local: None,
                remote: None,
                peer: None,
                psn: 0,
                resp_res: 0,
                init_depth: 0,
                retry: 7,
                rnr_retry: 7,
                deadline: None,
                ep_qp_attr: None,
                ack_timeout: None,
            }),
            refs: AtomicUsize::new(0),
            destroyed: AtomicBool::new(false),
            freed: AtomicBool::new(false),
        });
        registry().lock().insert(p as usize, id.clone());
        (p as *mut rdma_cm_id, id)
    }

    pub fn lookup(p: *mut rdma_cm_id) -> Option<Arc<Id>> {
        registry().lock().get(&(p as usize)).cloned()
    }

    /// The public structure. Valid until the id is destroyed and its events are done.
    pub fn public(&self) -> *mut rdma_cm_id {
        self.public.load(Ordering::Relaxed) as *mut rdma_cm_id
    }

    pub fn boxed(&self) -> *mut IdBox {
        self.public() as *mut IdBox
    }

    pub fn is_destroyed(&self) -> bool {
        self.destroyed.load(Ordering::Acquire)
    }

    pub fn unref(&self) {
        self.refs.fetch_sub(1, Ordering::AcqRel);
        self.maybe_free();
    }

    fn maybe_free(&self) {
        if self.destroyed.load(Ordering::Acquire)
            && self.refs.load(Ordering::Acquire) == 0
            && !self.freed.swap(true, Ordering::AcqRel)
        {
            // SAFETY: the box came from Id::create and is freed once (`freed`); no
            // event names it any more and the application destroyed it.
            drop(unsafe { Box::from_raw(self.boxed()) });
        }
    }

    /// Destroys the id: no event is posted for it any more, its sockets are shut (the
    /// peer sees the id go, as a kernel CM peer sees the DREQ or REJ a destroyed id
    /// sends), its unread events (and connection requests of a listener) are withdrawn.
    /// Returns the ids of withdrawn connection requests, which the caller destroys too.
    pub fn destroy(self: &Arc<Id>) -> Vec<Arc<Id>> {
        registry().lock().remove(&(self.public() as usize));
        let chan = {
            let mut st = self.st.lock();
            self.destroyed.store(true, Ordering::Release);
            st.state = State::Done;
            if let Some(s) = st.sock.take() {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            if let Some(l) = st.listener.take() {
                use std::os::fd::AsRawFd;
                // SAFETY: shutdown of our own listening socket wakes its accept thread.
                unsafe { libc::shutdown(l.as_raw_fd(), libc::SHUT_RDWR) };
            }
            st.bound_fd = None;
            st.chan.clone()
        };
        let me = Arc::as_ptr(self);
        let withdrawn = chan.withdraw(|e| {
            Arc::as_ptr(&e.id) == me || e.listen.as_ref().is_some_and(|l| Arc::as_ptr(l) == me)
        });
        let mut children = Vec::new();
        for e in withdrawn {
            if e.ev.event == EV_CONNECT_REQUEST && !Arc::ptr_eq(&e.id, self) {
                children.push(e.id.clone());
            }
            release(e);
        }
        self.maybe_free();
        children
    }
}

/// Posts an event for `id` on its channel (the caller holds `id`'s lock as `st`); none
/// once the id is destroyed. `fill` sets the parameters; private data goes into the
/// event's own buffer, reported with length `pdata_len` (the IB CM sizes, as the kernel
/// reports them), zero-padded.
#[allow(clippy::too_many_arguments)]
pub fn post(
    id: &Arc<Id>,
    st: &St,
    listen: Option<Arc<Id>>,
    event: u32,
    status: i32,
    pdata: &[u8],
    pdata_len: usize,
    fixup: Fixup,
    fill: impl FnOnce(&mut rdma_cm_event),
) {
    if id.is_destroyed() {
        return;
    }
    let mut e: Box<EventBox> = Box::new(EventBox {
        // SAFETY: plain C data for which zero is valid.
        ev: unsafe { std::mem::zeroed() },
        pdata: [0; PDATA_ROOM],
        id: id.clone(),
        listen: listen.clone(),
        fixup,
    });
    let n = pdata.len().min(PDATA_ROOM);
    e.pdata[..n].copy_from_slice(&pdata[..n]);
    e.ev.id = id.public();
    e.ev.listen_id = listen.as_ref().map_or(std::ptr::null_mut(), |l| l.public());
    e.ev.event = event;
    e.ev.status = status;
    fill(&mut e.ev);
    let len = pdata_len.min(PDATA_ROOM);
    // conn and ud both start with the private data pointer and length; the pointer is
    // to the box's own buffer (on the heap, it does not move).
    if len > 0 {
        e.ev.param.conn.private_data = e.pdata.as_ptr().cast();
        e.ev.param.conn.private_data_len = len as u8;
    } else {
        e.ev.param.conn.private_data = std::ptr::null();
        e.ev.param.conn.private_data_len = 0;
    }
    id.refs.fetch_add(1, Ordering::AcqRel);
    if let Some(l) = &listen {
        l.refs.fetch_add(1, Ordering::AcqRel);
    }
    st.chan.post(e);
}
