//! Connections: the TCP side channel (QP exchange and liveness, as Ceph), and the
//! connection object the C ABI hands out; the messenger (sessions and messages) on them.

pub mod auth;
mod conn;
mod context;
pub mod messenger;
pub(crate) mod setup;
pub(crate) mod spin;

pub use conn::{ConnectCancel, Connection, Listener};
pub use context::{Context, MrInfo, OnConnect, RegionFilter};
pub use messenger::{Messenger, Policy, SessionId};
pub use setup::Region;
