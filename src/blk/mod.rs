//! Block IO over the messenger: a target serving volumes (`target`), a client (`client`),
//! a multipath client over several of them (`paths`, with the write-ordering rule in
//! `order`), and the protocol they speak (`proto`). Design and measurements: `docs/block.md`.
//!
//! One request message per IO (`proto::MSG_REQ`, a 40-byte front, write data as one data
//! segment) and one reply per request (`proto::MSG_REPLY`, read data as one data segment).
//! Memory volumes also expose their region for one-sided RDMA READ/WRITE by the client
//! (`Mode::Read`), through a plain connection to a second listener of the target.

pub mod client;
pub mod order;
pub mod paths;
pub mod proto;
pub mod target;

pub use client::{BlkClient, BlkCounters, Completion, Mode, Req, VolumeInfo};
pub use paths::{
    BlkPaths, PathCounters, PathEvent, PathEventKind, PathPolicy, PathState, PathStatus,
};
pub use proto::Op;
pub use target::{Target, VolumeSpec};

use crate::config::{Config, Source};

/// The block path's defaults, on keys nobody set: `soft_port = 0` (a target and its
/// clients, each with two contexts, share hosts) and `path_mtu = 4096` (clamped per
/// connection to the link's MTU).
pub fn apply_defaults(cfg: &mut Config) -> crate::error::Result<()> {
    for (k, v) in [("soft_port", "0"), ("path_mtu", "4096")] {
        if cfg.source(k)? == Source::Default {
            cfg.set(k, v)?;
        }
    }
    Ok(())
}

/// The one-sided path's polling before sleeping: `poll_mode`/`polling_us` as they are
/// (adaptive, 1000 us by default), as `rdmx-perf read_bw` polls: the target's CPU is not in
/// that loop (the provider's progress thread answers READs), and a client that slept
/// after each empty poll fell from 65-116K to 14-20K IOPS.
pub(crate) fn one_sided_spin(cfg: &Config) -> crate::error::Result<Option<std::time::Duration>> {
    use crate::config::settings::PollMode;
    let s = cfg.settings()?;
    Ok(match s.poll_mode {
        PollMode::Busy => None,
        PollMode::Event => Some(std::time::Duration::ZERO),
        PollMode::Adaptive => Some(std::time::Duration::from_micros(u64::from(s.polling_us))),
    })
}
