//! The verbs provider's readiness (`crate::provider::ready`). The NIC receives by itself,
//! so the device's part is empty. A QP's part is its completion channel: `arm` is
//! `ibv_req_notify_cq` on both CQs, the event fd the epoll fd over the channel and the
//! stash wakeup. There is no first-completion hook: a NIC writes a CQE without the host,
//! and only a poll or an armed channel's event tells; so a messenger session on verbs is
//! never parked (its link is polled every pass) and sleeps on the armed channel. An
//! arming cannot be taken back (`disarm` does nothing): its event simply comes.

use super::VerbsDevice;
use super::qp::VerbsQp;
use crate::provider::ready::{DeviceReadiness, Hook, QpReadiness};
use std::os::fd::RawFd;

impl DeviceReadiness for VerbsDevice {
    fn set_caller_driven(&self, _on: bool) {}

    fn wait_fds(&self, _out: &mut Vec<RawFd>) {}

    fn caller_watches(&self, _on: bool) {}

    fn caller_stops_polling(&self) {}
}

impl QpReadiness for VerbsQp {
    fn may_have_completions(&self) -> bool {
        true
    }

    fn on_first_completion(&self, _hook: Hook) -> bool {
        false
    }

    fn arm(&self) {
        self.req_notify();
    }

    fn disarm(&self) {}

    fn event_fd(&self) -> RawFd {
        VerbsQp::event_fd(self)
    }

    fn clear_event(&self) {
        VerbsQp::clear_event(self);
    }
}
