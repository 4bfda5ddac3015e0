//! A context: the validated settings, the chosen provider's device, and registered memory.

use crate::config::{Config, Settings};
use crate::error::{Error, ErrorKind, Result};
use crate::provider::{self, soft::device::SoftDevice};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

/// Runs on every new connection (accepted or initiated) after its QP is ready to receive
/// and before the peer is told so: the place to post the first receives.
pub type OnConnect = Arc<dyn Fn(&super::Connection) -> Result<()> + Send + Sync>;

/// What listeners and connections share.
pub(crate) struct Shared {
    pub settings: Settings,
    pub dev: SoftDevice,
    pub provider: provider::Kind,
    pub on_connect: parking_lot::RwLock<Option<OnConnect>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("provider", &self.provider)
            .field("dev", &self.dev)
            .finish()
    }
}

/// An rdmx context. Cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct Context {
    pub(crate) shared: Arc<Shared>,
}

/// A registered memory region, as handed to callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrInfo {
    pub addr: u64,
    pub len: u64,
    pub lkey: u32,
    pub rkey: u32,
    pub access: u32,
}

impl Context {
    /// Validates `config`, chooses the provider and opens its device.
    pub fn new(config: &Config) -> Result<Context> {
        let settings = config.settings()?;
        let provider = provider::choose(&settings)?;
        // IPv4 for now: the soft provider's ICRC and sockets are IPv4-only (IPv6 is a later step).
        let dev = SoftDevice::open(&settings, IpAddr::V4(Ipv4Addr::UNSPECIFIED))?;
        Ok(Context {
            shared: Arc::new(Shared {
                settings,
                dev,
                provider,
                on_connect: parking_lot::RwLock::new(None),
            }),
        })
    }

    /// Sets (or clears) the hook run on every new connection before the peer may send:
    /// post the first receives there, so the peer's first SENDs are not RNR-NAKed.
    pub fn set_on_connect(&self, hook: Option<OnConnect>) {
        *self.shared.on_connect.write() = hook;
    }

    /// "soft" or "verbs".
    pub fn provider(&self) -> &'static str {
        self.shared.provider.name()
    }

    pub fn settings(&self) -> &Settings {
        &self.shared.settings
    }

    /// The soft device's UDP address.
    pub fn udp_addr(&self) -> std::net::SocketAddr {
        self.shared.dev.udp_addr()
    }

    /// Registers `[addr, addr + len)`; see `provider::soft::mr` for the rules.
    ///
    /// # Safety
    /// The memory must stay valid and mapped until `deregister` succeeds, and must not be
    /// modified while a send that names it is outstanding.
    pub unsafe fn register(&self, addr: *mut u8, len: usize, access: u32) -> Result<MrInfo> {
        let r = self.shared.dev.mrs().register(addr, len, access)?;
        Ok(MrInfo {
            addr: r.addr,
            len: r.len,
            lkey: r.lkey,
            rkey: r.rkey,
            access: r.access,
        })
    }

    /// Deregisters the region with `lkey`; `Busy` while work requests name it.
    pub fn deregister(&self, lkey: u32) -> Result<()> {
        self.shared.dev.mrs().deregister(lkey)
    }

    /// Kernel drops on the device's UDP receive queue.
    pub fn kernel_drops(&self) -> u64 {
        self.shared.dev.kernel_drops()
    }
}

pub(crate) fn closed(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Closed, msg)
}
