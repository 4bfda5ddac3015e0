//! A context: the validated settings, the chosen provider's device, and registered memory.

use crate::config::{Config, Settings};
use crate::error::{Error, ErrorKind, Result};
use crate::mem::Registrar;
use crate::mem::pool::Pool;
use crate::mem::rcache::{RegCache, RegCacheOptions};
use crate::provider::ready::DeviceReadiness;
use crate::provider::types::{PortCounters, ProgressStats};
use crate::provider::{self, Device};
use std::net::IpAddr;
use std::sync::Arc;

/// Runs on every new connection (accepted or initiated) after its QP is ready to receive
/// and before the peer is told so: the place to post the first receives.
pub type OnConnect = Arc<dyn Fn(&super::Connection) -> Result<()> + Send + Sync>;

/// Decides which of this side's exposed regions a peer's hello carries, by the peer's
/// authenticated entity (None with `auth = none`): see [`Context::set_region_filter`].
pub type RegionFilter = Arc<dyn Fn(Option<&str>, &super::Region) -> bool + Send + Sync>;

/// What listeners and connections share.
pub(crate) struct Shared {
    pub settings: Settings,
    pub dev: Device,
    pub provider: provider::Kind,
    /// Why this provider (logged at creation; `provider=auto`'s reasoning).
    pub provider_reason: String,
    /// Whether hellos carry the device's regions with remote access (default: yes, what
    /// plain one-sided peers use). Off, a peer learns a region only from the application
    /// (e.g. rdmx-target's Open reply, after access control).
    pub hello_regions: std::sync::atomic::AtomicBool,
    pub on_connect: parking_lot::RwLock<Option<OnConnect>>,
    /// Registrations of caller buffers (`rcache_entries`).
    pub rcache: RegCache,
    /// Side-channel authentication (`auth*` keys) and handshake bounds.
    pub auth: Arc<super::auth::AuthConfig>,
    /// Which exposed regions each peer is told of (None: all).
    pub region_filter: parking_lot::RwLock<Option<RegionFilter>>,
    /// Message limits this side's hellos advertise (set by a messenger on its context).
    pub hello_limits: parking_lot::RwLock<Option<super::setup::MsgLimitsWire>>,
    /// The messenger's memory is reached remotely only through per-QP windows
    /// (`msgr_scoped_rkeys` on a device that binds them): its pools and the buffers it
    /// sends from are registered without remote rights.
    pub scoped_rkeys: bool,
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

/// A registered memory region, as handed to callers (provider-neutral).
pub use crate::provider::region::MrInfo;

impl Context {
    /// Validates `config`, chooses the provider and opens its device.
    pub fn new(config: &Config) -> Result<Context> {
        let settings = config.settings()?;
        let auth = Arc::new(super::auth::AuthConfig::from_config(config)?);
        let (dev, provider, provider_reason) = provider::open(&settings)?;
        // No merging (either provider): a merged region would stay valid over a
        // neighbour's buffer after that buffer was invalidated and unmapped, and regions
        // with remote access are offered to peers.
        let mut opts = RegCacheOptions::new(settings.rcache_entries as usize);
        opts.merge = false;
        let scoped_rkeys = config.get_bool("msgr_scoped_rkeys")? && scoped_on(&dev);
        let registrar: Arc<dyn Registrar> = dev.registrar();
        let rcache = RegCache::with_options(registrar, opts)?;
        Ok(Context {
            shared: Arc::new(Shared {
                settings,
                dev,
                provider,
                provider_reason,
                hello_regions: std::sync::atomic::AtomicBool::new(true),
                on_connect: parking_lot::RwLock::new(None),
                rcache,
                auth,
                region_filter: parking_lot::RwLock::new(None),
                hello_limits: parking_lot::RwLock::new(None),
                scoped_rkeys,
            }),
        })
    }

    /// Whether a messenger on this context exposes its memory to a peer only through
    /// memory windows bound to that peer's QP (`msgr_scoped_rkeys`, on the soft provider
    /// and on a verbs device with type-2 windows): see docs/security.md.
    pub fn scoped_rkeys(&self) -> bool {
        self.shared.scoped_rkeys
    }

    /// The access a messenger on this context needs on memory it sends from
    /// ([`super::messenger::Payload::registered`], a pool): LOCAL_WRITE, plus REMOTE_READ
    /// unless its rkeys are scoped (the peer then READs through a window bound for it).
    /// An application that registers such memory ahead (rdmx-target's memory volumes)
    /// asks for exactly this.
    pub fn send_access(&self) -> u32 {
        use crate::rc::verbs::access;
        if self.shared.scoped_rkeys {
            access::LOCAL_WRITE
        } else {
            access::LOCAL_WRITE | access::REMOTE_READ
        }
    }

    /// Whether the hellos of this context's later connections carry its regions with remote
    /// access (on by default). Off, peers learn no region, rkey or pool in the handshake:
    /// the application tells each peer what it may reach (rdmx-target does, per session).
    pub fn set_hello_regions(&self, on: bool) {
        self.shared
            .hello_regions
            .store(on, std::sync::atomic::Ordering::Release);
    }

    /// The regions a hello of this context carries: those with remote access, or none
    /// (`set_hello_regions(false)`).
    pub(crate) fn hello_regions(&self) -> Vec<super::Region> {
        if self
            .shared
            .hello_regions
            .load(std::sync::atomic::Ordering::Acquire)
        {
            self.shared.dev.exposed()
        } else {
            Vec::new()
        }
    }

    /// Sets (or clears) the message limits the hellos of this context's later connections
    /// advertise (`FLAG_LIMITS`); a messenger sets its own (`msgr_max_message_bytes`,
    /// `msgr_max_segments`) so that its peers refuse at `send` what it would refuse.
    pub fn set_hello_limits(&self, limits: Option<super::setup::MsgLimitsWire>) {
        *self.shared.hello_limits.write() = limits;
    }

    /// Sets (or clears) the hook run on every new connection before the peer may send:
    /// post the first receives there, so the peer's first SENDs are not RNR-NAKed.
    pub fn set_on_connect(&self, hook: Option<OnConnect>) {
        *self.shared.on_connect.write() = hook;
    }

    /// Sets (or clears) which of the regions registered with remote access a connection's
    /// hello tells its peer of: `filter(peer_entity, region)` runs in every set-up, after
    /// the peer authenticated, and a region it refuses is not named to that peer (its
    /// rkey and address are not sent). Without a filter every exposed region is sent. An
    /// application grants one-sided access per entity with it (a volume's region only to
    /// the entities allowed to read it); a peer's hello is only ever sent after
    /// authentication (with `auth = required`).
    pub fn set_region_filter(&self, filter: Option<RegionFilter>) {
        *self.shared.region_filter.write() = filter;
    }

    /// "soft" or "verbs".
    pub fn provider(&self) -> &'static str {
        self.shared.provider.name()
    }

    /// Why the context runs on its provider: `provider=auto`'s reasoning (the verbs
    /// device and GID it opened, or why none was usable), or the configured choice.
    pub fn provider_reason(&self) -> &str {
        &self.shared.provider_reason
    }

    pub fn settings(&self) -> &Settings {
        &self.shared.settings
    }

    /// The soft device's UDP address (verbs: the GID's address and RoCEv2's port 4791).
    pub fn udp_addr(&self) -> std::net::SocketAddr {
        self.shared.dev.udp_addr()
    }

    /// The soft provider's UDP address for peers of `ip`'s family, if it has a port for
    /// that family (IPv6 only where the host has it).
    pub fn udp_addr_for(&self, ip: IpAddr) -> Option<std::net::SocketAddr> {
        self.shared.dev.udp_addr_for(ip)
    }

    /// Registers `[addr, addr + len)`; see `provider::soft::mr` and
    /// `provider::verbs::mr` for the rules.
    ///
    /// # Safety
    /// The memory must stay valid and mapped until `deregister` succeeds, and must not be
    /// modified while a send that names it is outstanding.
    pub unsafe fn register(&self, addr: *mut u8, len: usize, access: u32) -> Result<MrInfo> {
        // SAFETY: this function's contract is the table's (valid until deregistered).
        unsafe { self.shared.dev.register(addr, len, access) }
    }

    /// Deregisters the region with `lkey`; `Busy` while work requests name it.
    pub fn deregister(&self, lkey: u32) -> Result<()> {
        self.shared.dev.deregister(lkey)
    }

    /// A pool of `chunk_size` chunks (0 = the config's `chunk_size`), at most `max_chunks`
    /// (0 = `pool_chunks`), registered with `access`, in arenas per `hugepages`.
    pub fn pool(&self, chunk_size: usize, max_chunks: u32, access: u32) -> Result<Pool> {
        let s = &self.shared.settings;
        let size = if chunk_size == 0 {
            s.chunk_size as usize
        } else {
            chunk_size
        };
        let cap = if max_chunks == 0 {
            s.pool_chunks
        } else {
            max_chunks
        };
        Pool::new(self.shared.dev.registrar(), size, cap, access, s.hugepages)
    }

    /// The registration cache for caller buffers.
    /// The receiving sockets a thread may sleep on itself (soft provider, progress=inline;
    /// none otherwise), between `app_watch(true)` and `app_watch(false)`: it then receives
    /// with its next `Connection::poll`, and the progress thread leaves them alone. The
    /// last fd is the device's wake fd, reset by this call: readable once the provider's
    /// own thread ran a pass after it (a due timer, a side-channel event), whose
    /// completions the sockets no longer announce. Call it before looking at the CQs.
    pub fn rx_fds(&self, out: &mut Vec<std::os::fd::RawFd>) {
        self.shared.dev.wait_fds(out);
    }

    /// Soft provider, progress=inline: this caller drives the device from threads that
    /// answer what they receive, as the messenger does (it turns this on; off by default):
    /// its polls hold RC ACKs back so that the answer it posts next carries them (one
    /// `sendmmsg` for both), and the provider's progress thread leaves receiving to it
    /// while it polls (`SoftDevice::set_app_driven`).
    pub fn set_app_driven(&self, on: bool) {
        self.shared.dev.set_caller_driven(on);
    }

    /// One progress pass of the device from this thread, where the settings leave it to
    /// polling callers (soft provider, progress=inline or poll_mode=busy: receives what
    /// is queued, runs due timers; nothing otherwise). [`super::Connection::poll`] runs one
    /// per call; a caller polling many connections runs this once and then
    /// [`super::Connection::poll_cq`] on each.
    pub fn progress(&self) {
        self.shared.dev.progress(&self.shared.settings);
    }

    /// A thread starts (`true`) or stops (`false`) sleeping on [`Context::rx_fds`].
    pub fn app_watch(&self, on: bool) {
        self.shared.dev.caller_watches(on);
    }

    pub fn rcache(&self) -> &RegCache {
        &self.shared.rcache
    }

    /// Kernel drops on the device's UDP receive queue.
    pub fn kernel_drops(&self) -> u64 {
        self.shared.dev.kernel_drops()
    }

    /// Datagrams the device dropped on its UDP ports before any QP processed them: for no
    /// QP of this context, not from the QP's peer, bad ICRC, malformed (cumulative, every
    /// connection of the context together).
    pub fn port_counters(&self) -> PortCounters {
        self.shared.dev.port_counters()
    }

    /// How the device's progress thread fared: stalls on a busy host, and panics it caught
    /// ([`ProgressStats::progress_panics`]). Zeros on verbs (no progress thread).
    pub fn progress_stats(&self) -> ProgressStats {
        self.shared.dev.progress_stats()
    }
}

pub(crate) fn closed(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Closed, msg)
}

/// Whether `dev` binds the memory windows scoped rkeys need; when it does not (a verbs
/// device without type-2 windows), says so once per process: the messenger then gives
/// peers its registrations' rkeys (unscoped), as before issue 27.
fn scoped_on(dev: &crate::provider::Device) -> bool {
    if dev.binds_windows() {
        return true;
    }
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        log::warn!(
            target: "rdmx::msgr",
            "msgr_scoped_rkeys: the RDMA device has no type-2 memory windows (max_mw 0 or no \
             MEM_WINDOW_TYPE_2A/2B): the messenger's pools are exposed through their own \
             rkeys, not per-peer windows (unscoped; see docs/security.md)"
        );
    });
    false
}
