//! Builds [`Settings`] from effective values (each already validated alone).

use super::encoding::Mtu;
use super::profiles::NO_PROFILE;
use super::settings::{Hugepages, PollMode, Progress, Provider, QpOverride, Settings};
use super::value::Value;
use crate::error::{Error, ErrorKind, Result};

/// Reads effective values by key name.
pub(crate) struct Reader<'a> {
    pub lookup: &'a dyn Fn(&str) -> Option<Value>,
}

impl Reader<'_> {
    fn get(&self, key: &str) -> Result<Value> {
        (self.lookup)(key).ok_or_else(|| internal(key))
    }

    fn uint<T: TryFrom<u64>>(&self, key: &str) -> Result<T> {
        match self.get(key)? {
            Value::Uint(n) => T::try_from(n).map_err(|_| internal(key)),
            _ => Err(internal(key)),
        }
    }

    fn flag(&self, key: &str) -> Result<bool> {
        match self.get(key)? {
            Value::Bool(b) => Ok(b),
            _ => Err(internal(key)),
        }
    }

    fn word(&self, key: &str) -> Result<&'static str> {
        match self.get(key)? {
            Value::Word(w) => Ok(w),
            _ => Err(internal(key)),
        }
    }

    fn text(&self, key: &str) -> Result<String> {
        match self.get(key)? {
            Value::Text(t) => Ok(t),
            _ => Err(internal(key)),
        }
    }

    pub fn settings(&self) -> Result<Settings> {
        Ok(Settings {
            provider: match self.word("provider")? {
                "soft" => Provider::Soft,
                "verbs" => Provider::Verbs,
                _ => Provider::Auto,
            },
            device: self.text("device")?,
            port: self.uint("port")?,
            gid_index: self.uint("gid_index")?,
            max_send_wr: self.uint("max_send_wr")?,
            max_recv_wr: self.uint("max_recv_wr")?,
            max_send_sge: self.uint("max_send_sge")?,
            max_recv_sge: self.uint("max_recv_sge")?,
            max_inline_data: self.uint("max_inline_data")?,
            send_cq_size: self.uint("send_cq_size")?,
            recv_cq_size: self.uint("recv_cq_size")?,
            separate_cqs: self.flag("separate_cqs")?,
            signal_interval: self.uint("signal_interval")?,
            post_batch: self.uint("post_batch")?,
            timeout: self.uint("timeout")?,
            retry_cnt: self.uint("retry_cnt")?,
            rnr_retry: self.uint("rnr_retry")?,
            min_rnr_timer: self.uint("min_rnr_timer")?,
            qp_override: QpOverride::from_list(&self.text("qp_override")?),
            path_mtu: Mtu::from_bytes(self.uint("path_mtu")?)
                .ok_or_else(|| internal("path_mtu"))?,
            max_rd_atomic: self.uint("max_rd_atomic")?,
            max_dest_rd_atomic: self.uint("max_dest_rd_atomic")?,
            sl: self.uint("sl")?,
            traffic_class: self.uint("traffic_class")?,
            chunk_size: self.uint("chunk_size")?,
            pool_chunks: self.uint("pool_chunks")?,
            hugepages: match self.word("hugepages")? {
                "on" => Hugepages::On,
                "off" => Hugepages::Off,
                _ => Hugepages::Auto,
            },
            rcache_entries: self.uint("rcache_entries")?,
            poll_mode: match self.word("poll_mode")? {
                "busy" => PollMode::Busy,
                "event" => PollMode::Event,
                _ => PollMode::Adaptive,
            },
            polling_us: self.uint("polling_us")?,
            poll_batch: self.uint("poll_batch")?,
            credits: self.uint("credits")?,
            soft_port: self.uint("soft_port")?,
            soft_addr: match self.text("soft_addr")?.as_str() {
                "" => None,
                ip => Some(ip.parse().map_err(|_| internal("soft_addr"))?),
            },
            soft_drop_ppb: match self.get("soft_drop_ratio")? {
                Value::Ppb(n) => u32::try_from(n).map_err(|_| internal("soft_drop_ratio"))?,
                _ => return Err(internal("soft_drop_ratio")),
            },
            soft_gso: self.flag("soft_gso")?,
            soft_pin: self.flag("soft_pin")?,
            progress: match self.word("progress")? {
                "inline" => Progress::Inline,
                _ => Progress::Thread,
            },
            poll_yield_after: self.uint("poll_yield_after")?,
            profile: match self.word("profile")? {
                NO_PROFILE => None,
                name => Some(name),
            },
        })
    }
}

/// Unreachable unless the key table and this file disagree; an error, not a panic.
fn internal(key: &str) -> Error {
    Error::new(
        ErrorKind::InvalidValue,
        format!("{key}: internal error: no valid typed value (key table and settings disagree)"),
    )
}
