//! Memory windows, provider-neutral: what the messenger's scoped rkeys
//! (`msgr/messenger/scope.rs`, issue 27) bind over the memory one peer may reach. The soft
//! provider binds them in its window table (`soft/window.rs`), the verbs provider with
//! `IBV_WR_BIND_MW` / `IBV_WR_LOCAL_INV` on the peer's QP (`verbs/window.rs`);
//! [`super::Device::windows`] gives a QP's.

use crate::error::Result;

/// The windows of one QP's peer.
pub trait QpWindows: Send + Sync + std::fmt::Debug {
    /// Binds a window over `[addr, addr + len)` of the region `lkey` with `rights`
    /// (REMOTE_READ and/or REMOTE_WRITE) for this QP's peer; returns its rkey, valid only
    /// in requests that arrive on this QP, within that range, until
    /// [`QpWindows::invalidate`]. It is bound before any WR posted on the QP after this call
    /// runs (the soft provider binds at once; verbs posts the bind on the QP's send queue).
    fn bind(&self, lkey: u32, addr: u64, len: u64, rights: u32) -> Result<u32>;

    /// Ends window `rkey`: when this returns, no access through it is in progress or can
    /// start, so the memory may go to another session. Unknown keys are ignored.
    fn invalidate(&self, rkey: u32);
}
