//! Typed values for the layers below config: what `Config::settings()` returns.

use super::encoding::{self, Mtu};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    /// verbs if a device exists, else soft.
    Auto,
    /// The in-process RC engine over UDP.
    Soft,
    /// rdma-core verbs (real NIC or kernel soft-RoCE).
    Verbs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hugepages {
    /// hugetlb, else THP, else plain pages.
    Auto,
    /// Huge pages required.
    On,
    /// Plain pages.
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollMode {
    Busy,
    Event,
    Adaptive,
}

/// Who drives the soft provider's engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// A progress thread receives, runs timers and sends responses.
    Thread,
    /// The caller's poll drives the engine; a thread only runs timers nobody polled for.
    Inline,
}

/// Which QP attributes the configuration imposes on verbs applications (`qp_override`):
/// the configured `timeout`, `retry_cnt`, `rnr_retry`, `min_rnr_timer` replace what they
/// pass to `ibv_modify_qp`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpOverride {
    pub timeout: bool,
    pub retry_cnt: bool,
    pub rnr_retry: bool,
    pub min_rnr_timer: bool,
}

impl QpOverride {
    /// From the canonical value ("timeout,rnr_retry"); unknown words are ignored (the
    /// value was validated).
    pub fn from_list(list: &str) -> QpOverride {
        let has = |w: &str| list.split(',').any(|x| x == w);
        QpOverride {
            timeout: has("timeout"),
            retry_cnt: has("retry_cnt"),
            rnr_retry: has("rnr_retry"),
            min_rnr_timer: has("min_rnr_timer"),
        }
    }

    /// Whether any attribute is overridden.
    pub fn any(&self) -> bool {
        self.timeout || self.retry_cnt || self.rnr_retry || self.min_rnr_timer
    }
}

/// The completion queues a QP uses, with sizes resolved (auto = 2 x the WRs sharing a CQ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CqLayout {
    Separate { send: u32, recv: u32 },
    Shared { size: u32 },
}

/// The factor auto-sized CQs get over the WRs that complete on them (seed: 1.5-2x).
pub const AUTO_CQ_FACTOR: u32 = 2;

impl CqLayout {
    /// Resolves configured CQ sizes (0 = auto). Under `separate = false` the shared CQ is
    /// sized by `send_cq_size` and `recv_cq_size` is ignored (validate() insists it is 0).
    pub fn resolve(
        separate: bool,
        send_cq_size: u32,
        recv_cq_size: u32,
        max_send_wr: u32,
        max_recv_wr: u32,
    ) -> CqLayout {
        let auto = |configured: u32, wrs: u32| match configured {
            0 => wrs.saturating_mul(AUTO_CQ_FACTOR),
            n => n,
        };
        if separate {
            CqLayout::Separate {
                send: auto(send_cq_size, max_send_wr),
                recv: auto(recv_cq_size, max_recv_wr),
            }
        } else {
            CqLayout::Shared {
                size: auto(send_cq_size, max_send_wr.saturating_add(max_recv_wr)),
            }
        }
    }
}

/// Every key as a typed value. Values are as configured (0 = auto stays 0); the methods
/// resolve the auto values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub provider: Provider,
    /// Empty = the first device.
    pub device: String,
    pub port: u8,
    pub gid_index: u8,
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
    /// 0 = auto; see [`Settings::cq_layout`].
    pub send_cq_size: u32,
    /// 0 = auto; see [`Settings::cq_layout`].
    pub recv_cq_size: u32,
    pub separate_cqs: bool,
    pub signal_interval: u32,
    pub post_batch: u32,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    /// Attributes of verbs applications' QPs replaced by the values above.
    pub qp_override: QpOverride,
    pub path_mtu: Mtu,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub sl: u8,
    pub traffic_class: u8,
    pub chunk_size: u32,
    pub pool_chunks: u32,
    pub hugepages: Hugepages,
    pub rcache_entries: u32,
    pub poll_mode: PollMode,
    pub polling_us: u32,
    pub poll_batch: u32,
    /// 0 = auto; see [`Settings::effective_credits`].
    pub credits: u32,
    pub soft_port: u16,
    /// The address the soft provider's UDP port binds; `None` = every address.
    pub soft_addr: Option<std::net::IpAddr>,
    /// Outgoing packets the soft provider drops on purpose, in parts per billion.
    pub soft_drop_ppb: u32,
    /// UDP GSO for runs of equal-length packets (`soft_gso`).
    pub soft_gso: bool,
    /// Registrations pin their pages within RLIMIT_MEMLOCK (`soft_pin`).
    pub soft_pin: bool,
    pub progress: Progress,
    /// rdmx-ibv: empty `ibv_poll_cq` calls in a row on a thread before each further one
    /// yields the core (`poll_yield_after`; 0 = never).
    pub poll_yield_after: u32,
    /// `None` when `profile = none`.
    pub profile: Option<&'static str>,
}

/// rnr_retry = 7 means retry forever.
pub const RNR_RETRY_INFINITE: u8 = 7;

impl Settings {
    /// The CQs with auto sizes resolved.
    pub fn cq_layout(&self) -> CqLayout {
        CqLayout::resolve(
            self.separate_cqs,
            self.send_cq_size,
            self.recv_cq_size,
            self.max_send_wr,
            self.max_recv_wr,
        )
    }

    /// Credits with auto (0) resolved to max_recv_wr: one credit per posted receive.
    pub fn effective_credits(&self) -> u32 {
        match self.credits {
            0 => self.max_recv_wr,
            n => n,
        }
    }

    /// The local ACK timeout in ns; `None` when timeout = 0 (no timer).
    pub fn ack_timeout_ns(&self) -> Option<u64> {
        encoding::ack_timeout_ns(self.timeout).filter(|&ns| ns > 0)
    }

    /// The RNR timer this side advertises in its RNR NAKs, in ns.
    pub fn min_rnr_timer_ns(&self) -> u64 {
        encoding::rnr_timer_ns(self.min_rnr_timer).unwrap_or(0)
    }

    /// Whether RNR NAKs are retried forever (rnr_retry = 7).
    pub fn rnr_retry_infinite(&self) -> bool {
        self.rnr_retry == RNR_RETRY_INFINITE
    }
}
