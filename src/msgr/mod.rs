//! Connections: the TCP side channel (QP exchange and liveness, as Ceph), and the
//! connection object the C ABI hands out.

mod conn;
mod context;
pub(crate) mod setup;

pub use conn::{Connection, Listener};
pub use context::{Context, MrInfo, OnConnect};
pub use setup::Region;
