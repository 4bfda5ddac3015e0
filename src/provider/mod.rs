//! Verbs-shaped device API and its providers. `provider=auto` picks verbs when the host has
//! an RDMA device and soft otherwise; the choice is logged and queryable.

pub(crate) mod dev;
mod layering;
pub(crate) mod mr_table;
pub(crate) mod mtu;
pub(crate) mod ready;
pub(crate) mod region;
pub mod soft;
pub(crate) mod sys;
pub mod types;
#[cfg(feature = "verbs")]
pub(crate) mod verbs;
pub(crate) mod windows;
pub(crate) mod wr_stats;

pub use mr_table::Registration;
pub use region::{MrInfo, Region};
/// The completion channel a CQ signals (`ibv_comp_channel`): an eventfd, readable after
/// `req_notify` once a completion arrives; the one public piece of the OS layer.
pub use sys::EventFd;
pub use types::{PortCounters, ProgressStats, Remote, SendReq, Wc};

use crate::config::{Provider, Settings};
use crate::error::{Error, Result};
pub(crate) use dev::Device;
use soft::device::SoftDevice;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The provider a context runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Soft,
    Verbs,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Soft => "soft",
            Kind::Verbs => "verbs",
        }
    }
}

/// RDMA devices libibverbs sees (0 without the `verbs` feature), and why none if so.
fn verbs_devices() -> (usize, String) {
    #[cfg(feature = "verbs")]
    let n = crate::verbs_probe::device_count().unwrap_or(0);
    #[cfg(not(feature = "verbs"))]
    let n = 0;
    (n, describe_verbs())
}

/// What libibverbs sees on this host, in one line: how many RDMA devices it lists, or why
/// none (the reason `provider=auto` logs with its choice). Built without the `verbs`
/// feature, it says so. For diagnostics (`rdmx-perf config` prints it).
pub fn describe_verbs() -> String {
    #[cfg(feature = "verbs")]
    {
        crate::verbs_probe::describe()
    }
    #[cfg(not(feature = "verbs"))]
    {
        "verbs: built without the verbs feature".to_string()
    }
}

/// The provider a configuration gets on this host, and why: `provider=auto` opens the
/// verbs device (and closes it again) to see whether it is usable. For diagnostics
/// (`rdmx-perf config`); a context reports its own choice
/// (`Context::provider_reason`).
pub fn resolve(settings: &Settings) -> Result<(&'static str, String)> {
    open(settings).map(|(_, k, why)| (k.name(), why))
}

/// Chooses the provider for `settings` and opens its device. `provider=verbs` opens the
/// verbs device or fails saying why; `auto` picks verbs when a device opens with a usable
/// port and RoCEv2 GID, soft otherwise. Returns the device, the kind and the reason (also
/// logged).
pub(crate) fn open(settings: &Settings) -> Result<(Device, Kind, String)> {
    let (dev, kind, why) = match settings.provider {
        Provider::Soft => (
            open_soft(settings)?,
            Kind::Soft,
            "provider=soft configured".to_string(),
        ),
        Provider::Verbs => {
            let (d, why) = open_verbs(settings).map_err(|e| {
                Error::new(
                    e.kind(),
                    format!(
                        "provider=verbs: {} (use provider=soft or auto)",
                        e.message()
                    ),
                )
            })?;
            (d, Kind::Verbs, format!("provider=verbs configured: {why}"))
        }
        Provider::Auto => {
            let (n, probe) = verbs_devices();
            if n == 0 {
                (
                    open_soft(settings)?,
                    Kind::Soft,
                    format!("provider=auto: {probe}"),
                )
            } else {
                match open_verbs(settings) {
                    Ok((d, why)) => (d, Kind::Verbs, format!("provider=auto: {why}")),
                    Err(e) => (
                        open_soft(settings)?,
                        Kind::Soft,
                        format!("provider=auto: {probe}, but none usable: {}", e.message()),
                    ),
                }
            }
        }
    };
    log::info!(target: "rdmx::provider", "provider={} chosen ({why})", kind.name());
    Ok((dev, kind, why))
}

fn open_soft(settings: &Settings) -> Result<Device> {
    // One receiving port per family; IPv6 only where the host has it. With soft_addr,
    // that address only (and so its family only).
    let any = [
        IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    ];
    let one = settings.soft_addr.map(|ip| [ip.to_canonical()]);
    Ok(Device::Soft(SoftDevice::open(
        settings,
        one.as_ref().map_or(&any[..], |a| &a[..]),
    )?))
}

#[cfg(feature = "verbs")]
fn open_verbs(settings: &Settings) -> Result<(Device, String)> {
    let d = verbs::VerbsDevice::open(settings)?;
    let why = d.describe();
    Ok((Device::Verbs(Box::new(d)), why))
}

#[cfg(not(feature = "verbs"))]
fn open_verbs(_settings: &Settings) -> Result<(Device, String)> {
    Err(Error::new(
        crate::error::ErrorKind::Unsupported,
        "built without the verbs feature",
    ))
}
