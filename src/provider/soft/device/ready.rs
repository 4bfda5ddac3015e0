//! The soft device's readiness (`crate::provider::ready`): the host receives, so who does
//! it (the caller while it polls or sleeps on the sockets, else the progress thread) is the
//! device's to arrange. The methods under their own names say how.

use super::SoftDevice;
use crate::provider::ready::DeviceReadiness;
use std::os::fd::RawFd;

impl DeviceReadiness for SoftDevice {
    /// [`SoftDevice::set_app_driven`].
    fn set_caller_driven(&self, on: bool) {
        self.set_app_driven(on);
    }

    /// [`SoftDevice::rx_fds`]: the receiving sockets (progress=inline), then the wake fd.
    fn wait_fds(&self, out: &mut Vec<RawFd>) {
        self.rx_fds(out);
    }

    /// [`SoftDevice::app_watch`].
    fn caller_watches(&self, on: bool) {
        self.app_watch(on);
    }

    /// [`SoftDevice::app_sleeping`]: the progress thread takes over receiving at once.
    fn caller_stops_polling(&self) {
        self.app_sleeping();
    }
}
