//! Connections: the TCP side channel (QP exchange and liveness, as Ceph), and the
//! connection object the C ABI hands out.

pub mod conn;
pub mod context;
pub mod messenger;
pub mod setup;

pub use conn::{Connection, Listener};
pub use context::{Context, OnConnect};
pub use messenger::{Messenger, Policy, SessionId};
