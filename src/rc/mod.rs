//! The Reliable Connected transport as a sans-IO state machine (docs/rc-transport.md §2-§6).
//!
//! Where things are: `qp.rs` (the QP, its inputs and outputs), `requester.rs` (segmentation,
//! PSNs, credits), `completer.rs` (ACK/NAK handling, timers, retries), `responder.rs`
//! (ePSN, RNR, access checks, READ replay), `attr.rs` (modify and its masks), `verbs.rs`
//! (enum values), `memory.rs` (how the engine reaches registered memory).

pub mod attr;
mod completer;
pub mod counters;
mod emit;
pub mod failure;
pub mod memory;
pub(crate) mod packet;
pub mod psn;
pub mod qp;
mod requester;
mod responder;
pub mod vec_memory;
pub mod verbs;
pub mod wr;

pub use attr::QpAttr;
pub use counters::Counters;
pub use emit::TxParts;
pub use failure::Failure;
pub use memory::{Key, MemError, Memory, Sge, SgeList};
pub use qp::{PostError, PostQueue, Qp, QpCaps, max_packet_len};
pub use smallvec::smallvec;
pub use vec_memory::VecMemory;
pub use verbs::{QpState, WcOpcode, WcStatus, WrOpcode};
pub use wr::{Completion, RecvWr, SendWr};
