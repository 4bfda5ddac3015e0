//! Verbs-shaped device API and its providers. `provider=auto` picks verbs when the host has
//! an RDMA device and soft otherwise; the choice is logged and queryable.

pub mod soft;

use crate::config::{Provider, Settings};
use crate::error::{Error, ErrorKind, Result};

/// The provider a context runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Soft,
    Verbs,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Soft => "soft",
            Kind::Verbs => "verbs",
        }
    }
}

/// RDMA devices libibverbs sees (0 without the `verbs` feature), and why none if so.
fn verbs_devices() -> (usize, String) {
    #[cfg(feature = "verbs")]
    {
        let d = crate::verbs_probe::describe();
        (crate::verbs_probe::device_count().unwrap_or(0), d)
    }
    #[cfg(not(feature = "verbs"))]
    {
        (0, "verbs: built without the verbs feature".to_string())
    }
}

/// Chooses the provider for `settings`. The verbs data path is not implemented yet, so
/// `provider=verbs` is refused with a message saying so, and `auto` picks verbs only when
/// it could run.
pub fn choose(settings: &Settings) -> Result<Kind> {
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
