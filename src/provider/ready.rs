//! Readiness: how a thread that drives many connections (a messenger shard, a block client)
//! learns which of them may have work without polling each, and what it sleeps on. Both
//! providers implement it, each saying what it can do; the messenger's parking
//! (`msgr/messenger/park.rs`) and sleeping use nothing else of the provider.
//!
//! | | soft | verbs |
//! |---|---|---|
//! | first-completion hook | yes: runs when a completion lands in an empty CQ | no (`false`): only a poll or the completion channel tells, so such a link is polled every pass and never parked |
//! | `may_have_completions` | a lock-free look at the CQs | always `true` |
//! | `arm` / `event_fd` | the CQs' eventfd | `ibv_req_notify_cq` on both CQs, the completion channel (and the stash wakeup) in one epoll fd |
//! | `disarm` | takes the arming back | nothing: an arming cannot be taken back, its event simply comes |
//! | who receives | the host: the caller while it polls, else the progress thread | the NIC: the device-side calls are no-ops |

use std::os::fd::RawFd;
use std::sync::Arc;

/// Run when a completion may be waiting: on whichever thread added it, with no provider
/// lock held; it must be quick and must not poll.
pub(crate) type Hook = Arc<dyn Fn() + Send + Sync>;

/// A device's part: who receives when the host must, and what a caller may sleep on besides
/// its QPs' event fds.
pub(crate) trait DeviceReadiness {
    /// The caller's threads poll and answer what they receive (`true`; off by default): a
    /// device that receives on the host holds its positive ACKs for the answer and keeps
    /// its own thread out of the pollers' way (soft: `SoftDevice::set_app_driven`).
    fn set_caller_driven(&self, on: bool);

    /// The fds a caller may sleep on besides its QPs' event fds, and then receive with its
    /// next poll (soft, progress=inline: the receiving sockets, then the device's wake fd).
    /// None where the device receives by itself.
    fn wait_fds(&self, out: &mut Vec<RawFd>);

    /// A caller starts (`true`) or stops (`false`) sleeping on [`Self::wait_fds`].
    fn caller_watches(&self, on: bool);

    /// The caller stops polling and will sleep on its QPs' event fds: the device receives
    /// for it from now on (soft: the progress thread takes over at once).
    fn caller_stops_polling(&self);
}

/// A connection's part (its QP and CQs).
pub(crate) trait QpReadiness {
    /// Whether a poll may find completions, without a lock; `true` where only a poll tells.
    fn may_have_completions(&self) -> bool;

    /// Runs `hook` when a completion lands in one of this QP's empty CQs. False where that
    /// cannot be told (or a hook is set already): such a QP must be polled every time.
    fn on_first_completion(&self, hook: Hook) -> bool;

    /// Requests an event on [`Self::event_fd`] at the next completion, or at once if some
    /// are queued (`ibv_req_notify_cq`), without telling the device the caller stops
    /// polling (see [`DeviceReadiness::caller_stops_polling`]).
    fn arm(&self);

    /// Takes back an [`Self::arm`] that has not fired, where the provider can.
    fn disarm(&self);

    /// The fd that becomes readable after [`Self::arm`].
    fn event_fd(&self) -> RawFd;

    /// Consumes the event after it fired (before arming again).
    fn clear_event(&self);
}
