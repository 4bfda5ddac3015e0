//! The RDMA connection manager on rdmx0: librdmacm's API, in the provider.
//!
//! librdmacm (`librdmacm.so.1`) drives the kernel's `/dev/infiniband/rdma_cm` (the ucma
//! ABI), which a kernel without RDMA does not have, and it has no plugin point. So the
//! provider library, which `rdmx-ibv exec` already preloads (for the completion
//! channels), also defines librdmacm's public functions: the dynamic loader binds the
//! program's `rdma_*@RDMACM_1.x` references to these unversioned definitions of an
//! earlier object (as for `ibv_create_comp_channel`), and `librdmacm.so.1`, still loaded
//! as the program's dependency, is never called (its functions do nothing at load time).
//! Every exported function of librdmacm is defined here (the rsockets family answers
//! ENOSYS, [`rsockets`]); see `docs/ibv-device.md` ("Connection manager").
//!
//! - [`api`]: the exported functions, librdmacm's return conventions.
//! - [`chan`]: event channels (a socket pair: the fd is readable while events wait) and
//!   events.
//! - [`id`]: `struct rdma_cm_id` and the connection state machine.
//! - [`conn`]: the threads that listen, connect and read the peer's messages, with
//!   bounded waits.
//! - [`wire`]: the messages (REQ, REP, RTU, REJ, DREQ, DREP, SIDR_REQ, SIDR_REP) on a TCP
//!   connection to the listener's address and rdma_cm port.
//! - [`qp`]: `rdma_create_qp` and the QP attributes of each step.
//! - [`dev`]: the rdmx0 context ids are bound to; socket addresses.
//! - [`addrinfo`]: the system resolver behind `rdma_getaddrinfo`.
//! - [`rsockets`]: the rsockets family, which answers ENOSYS.

pub mod addrinfo;
pub mod api;
pub mod chan;
pub mod conn;
pub mod dev;
pub mod id;
pub mod qp;
pub mod rsockets;
pub mod wire;

// The public structures programs read directly, as librdmacm 44's headers lay them out
// (taken from `offsetof` on `rdma/rdma_cma.h`; `tests/ibv_cm.rs`
// public_layouts_match_the_headers compares every field the provider uses with a C
// probe of the installed headers at test time).
const _: () = {
    use rdma_sys::{rdma_cm_event, rdma_cm_id, rdma_conn_param, rdma_ud_param};
    use std::mem::{offset_of, size_of};
    assert!(size_of::<rdma_cm_id>() == 416);
    assert!(offset_of!(rdma_cm_id, route) == 32);
    assert!(offset_of!(rdma_cm_id, ps) == 344);
    assert!(offset_of!(rdma_cm_id, port_num) == 348);
    assert!(offset_of!(rdma_cm_id, event) == 352);
    assert!(offset_of!(rdma_cm_id, pd) == 400);
    assert!(offset_of!(rdma_cm_id, qp_type) == 408);
    assert!(size_of::<rdma_cm_event>() == 80);
    assert!(offset_of!(rdma_cm_event, event) == 16);
    assert!(offset_of!(rdma_cm_event, status) == 20);
    assert!(offset_of!(rdma_cm_event, param) == 24);
    assert!(size_of::<rdma_conn_param>() == 24);
    assert!(offset_of!(rdma_conn_param, qp_num) == 16);
    assert!(size_of::<rdma_ud_param>() == 56);
    assert!(offset_of!(rdma_ud_param, ah_attr) == 16);
    assert!(offset_of!(rdma_ud_param, qp_num) == 48);
    assert!(offset_of!(rdma_ud_param, qkey) == 52);
};
