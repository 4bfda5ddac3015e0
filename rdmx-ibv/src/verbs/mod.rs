//! Verbs objects on the soft provider (device, PD, MR, CQ, completion channel, SRQ, RC QP),
//! with libibverbs semantics, independent of libibverbs' private ABI.
//!
//! Every object libibverbs hands to an application lives in memory the provider glue
//! allocates (`struct ibv_cq`, `struct verbs_qp`, ...). So each object here carries an
//! opaque `handle: u64` given at creation (the glue passes the address of its ibv struct),
//! and everything reported back to libibverbs names that handle: completion channel
//! records (`struct ib_uverbs_comp_event_desc`) and async events
//! (`struct ib_uverbs_async_event_desc`).
//!
//! Numbers are verbs' (`/usr/include/infiniband/verbs.h`): statuses, opcodes, states,
//! masks and flags are the `enum ibv_*` values, so the glue copies them.
//!
//! Errors are [`rdmx::error::Error`]s; the glue maps [`ErrorKind`] to errno
//! (InvalidArgument/InvalidValue -> EINVAL, Busy -> EBUSY, Full -> ENOMEM, Unsupported ->
//! EOPNOTSUPP/EINVAL, ResourceLimit -> ENOMEM, Io -> EIO). Nothing here panics on bad input.
//!
//! Destroying: the `destroy()` methods check verbs' EBUSY rules (a CQ used by a QP, a PD
//! with MRs/QPs/SRQs, ...) and release the object's resources; the glue then drops its
//! `Arc`. An object used after `destroy()` refuses with InvalidArgument.

pub mod ah;
pub mod cq;
pub mod device;
pub mod events;
pub mod mw;
pub mod pd;
pub mod peer_port;
pub mod qp;
pub mod spin;
pub mod srq;
pub mod stats;
mod sys;

pub use ah::Ah;
pub use cq::{CompChannel, Cq, WorkCompletion};
pub use device::{Device, DeviceAttr, DeviceStats, PortAttr};
pub use events::event_type;
pub use mw::{BindMr, BindWr, LocalOp, MW_TYPE_1, MW_TYPE_2, Mw};
pub use pd::{Mr, Pd};
pub use qp::{
    AhAttr, InitAttr, QPT_UD, Qp, QpAttr, QpCap, RecvWr, SendWr, UdQp, UdSendWr, mtu_from_ibv,
    mtu_to_ibv,
};
pub use rdmx::error::{Error, ErrorKind, Result};
pub use rdmx::rc::verbs::{access, attr_mask, send_flags, wc_flags};
pub use rdmx::rc::{QpState, Sge, SgeList, WcOpcode, WcStatus, WrOpcode};
pub use srq::{Srq, SrqAttr, srq_attr_mask};

/// `IBV_QPT_RC` (UD: [`QPT_UD`]).
pub const QPT_RC: u32 = 2;
