//! Verbs-shaped device API and its providers. `provider=auto` picks verbs when the host has
//! an RDMA device and soft otherwise; the choice is logged and queryable.

pub mod soft;

use crate::config::{Provider, Settings};
use crate::error::{Error, ErrorKind, Result};

/// The provider a context runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Soft,
    // The verbs data path adds `Verbs` here.
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Soft => "soft",
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

/// Chooses the provider for `settings`. The verbs data path is not implemented yet, so
/// `provider=verbs` is refused with a message saying so, and `auto` picks verbs only when
/// it could run.
pub(crate) fn choose(settings: &Settings) -> Result<Kind> {
    let (n, why) = verbs_devices();
    let kind = match settings.provider {
        Provider::Soft => Kind::Soft,
        Provider::Auto => {
            if n > 0 {
                log::warn!(target: "rdmx::provider", "{why}, but the verbs data path is not implemented yet: using soft");
            }
            Kind::Soft
        }
        Provider::Verbs => {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "provider=verbs: the verbs data path is not implemented yet ({why}); use provider=soft or auto"
                ),
            ));
        }
    };
    log::info!(target: "rdmx::provider", "provider={} chosen ({:?} requested; {why})", kind.name(), settings.provider);
    Ok(kind)
}
