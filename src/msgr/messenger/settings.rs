//! The messenger's knobs (`msgr_*` in `config/keys.rs`), read from a [`Config`].

use crate::config::{Config, Source};
use crate::error::{Error, ErrorKind, Result};
use std::time::Duration;

use super::types::Policy;
use super::wire::{MAX_SEG_LEN, MAX_SEGS, PAYLOAD_MAX};

/// How large a message may be: its data bytes (all segments) and its segment count
/// (`msgr_max_message_bytes`, `msgr_max_segments`). Checked on send (the application gets
/// `InvalidArgument`) and on receive, before anything is allocated for the message (the
/// peer's message is refused, counted as oversized, and the session ends: a lossless one
/// would only replay it on the next connection).
///
/// These are the values a session's hello should advertise so that the sender refuses
/// at `send` what the receiver would refuse (see `docs/messenger.md`, "Message limits").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsgLimits {
    pub max_message_bytes: u64,
    pub max_segments: usize,
}

impl MsgLimits {
    /// The wire's own bounds: [`MAX_SEGS`] segments of at most [`MAX_SEG_LEN`] bytes.
    pub const WIRE: MsgLimits = MsgLimits {
        max_message_bytes: (MAX_SEGS * MAX_SEG_LEN) as u64,
        max_segments: MAX_SEGS,
    };

    /// As a hello advertises them (`setup::FLAG_LIMITS`).
    pub fn to_wire(self) -> crate::msgr::setup::MsgLimitsWire {
        crate::msgr::setup::MsgLimitsWire {
            max_message_bytes: self.max_message_bytes,
            max_segments: self.max_segments.min(usize::from(u16::MAX)) as u16,
        }
    }

    /// A peer's advertised limits.
    pub fn from_wire(w: crate::msgr::setup::MsgLimitsWire) -> MsgLimits {
        MsgLimits {
            max_message_bytes: w.max_message_bytes,
            max_segments: usize::from(w.max_segments),
        }
    }

    /// The tighter of two limits (this side's and the peer's advertised ones).
    pub fn min(self, other: MsgLimits) -> MsgLimits {
        MsgLimits {
            max_message_bytes: self.max_message_bytes.min(other.max_message_bytes),
            max_segments: self.max_segments.min(other.max_segments),
        }
    }

    /// Whether a message of `segs` data segments totalling `bytes` is within the limits;
    /// the error names what broke which key.
    fn check(&self, segs: usize, bytes: u64) -> std::result::Result<(), String> {
        if segs > self.max_segments {
            return Err(format!(
                "{segs} data segments; at most {} (msgr_max_segments)",
                self.max_segments
            ));
        }
        if bytes > self.max_message_bytes {
            return Err(format!(
                "{bytes} data bytes; at most {} (msgr_max_message_bytes)",
                self.max_message_bytes
            ));
        }
        Ok(())
    }

    /// A message the application sends: `InvalidArgument` when it is too large.
    pub fn check_send(&self, segs: usize, bytes: u64) -> Result<()> {
        self.check(segs, bytes).map_err(|why| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("send: a message of {why}"),
            )
        })
    }

    /// A message the peer announced: `ResourceLimit` when it is too large (the session
    /// ends: see [`MsgLimits`]).
    pub fn check_recv(&self, segs: usize, bytes: u64) -> Result<()> {
        self.check(segs, bytes).map_err(|why| {
            Error::new(
                ErrorKind::ResourceLimit,
                format!("the peer sent a message of {why} on this side: refused, session ended"),
            )
        })
    }
}

/// The `msgr_*` settings, typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MsgrSettings {
    pub policy: Policy,
    pub threads: usize,
    /// None = no keepalive.
    pub keepalive: Option<Duration>,
    /// A keepalive this long after a message the peer has not answered (the transport's
    /// retry budget, (retry_cnt + 1) x 4.096 us x 2^timeout, at least 10 ms; None with
    /// keepalive off, `timeout` 0 (infinite) or a budget not below the keepalive).
    pub probe: Option<Duration>,
    pub keepalive_timeout: Duration,
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
    pub reconnect_timeout: Duration,
    /// 0 = no limit.
    pub reconnect_attempts: u32,
    pub send_queue_msgs: usize,
    pub send_queue_bytes: u64,
    pub recv_window: u32,
    pub recv_window_min: u32,
    pub pool_chunks: u32,
    pub eager_max: usize,
    /// Eager data as an RDMA WRITE into the receiver's granted chunk + a short SEND.
    pub eager_write: bool,
    /// Failback to a preferred path that rejoined (`msgr_path_failback`).
    pub path_failback: bool,
    /// Messages a session takes from its link per pass (`msgr_rx_batch`; 0 = no limit but
    /// the pass's fairness budget).
    pub rx_batch: usize,
    /// From the transport keys: receives a connection can hold, SGEs per send WR, WRs.
    pub max_recv_wr: u32,
    pub max_send_wr: u32,
    pub max_send_sge: u32,
    /// The largest message sent or received ([`MsgLimits`]).
    pub limits: MsgLimits,
    /// How long a progress loop keeps polling after its last event before it sleeps on
    /// the event fds (`poll_mode` busy: None = never sleeps; event: zero; adaptive:
    /// `polling_us`).
    pub spin: Option<Duration>,
    /// The time slice a worker thread asks the kernel for (`msgr_worker_slice_us`; None:
    /// the kernel's default): see `msgr::spin::set_thread_slice`.
    pub worker_slice: Option<Duration>,
}

fn ms(c: &Config, key: &str) -> Result<Duration> {
    Ok(Duration::from_millis(c.get_u64(key)?))
}

/// The probe interval (`MsgrSettings::probe`): the retry budget of a link's QP.
fn probe_after(c: &Config, keepalive: Duration) -> Result<Option<Duration>> {
    let timeout = c.get_u64("timeout")?;
    if keepalive.is_zero() || timeout == 0 {
        return Ok(None);
    }
    let tries = c.get_u64("retry_cnt")? + 1;
    let budget = Duration::from_nanos(tries * (4096u64 << timeout.min(31)));
    let probe = budget.max(Duration::from_millis(10));
    Ok((probe < keepalive).then_some(probe))
}

impl MsgrSettings {
    /// Reads and cross-checks the messenger keys of `c` (after [`adjust`] made the
    /// transport keys fit).
    pub fn from_config(c: &Config) -> Result<MsgrSettings> {
        let keepalive = ms(c, "msgr_keepalive_ms")?;
        let mut s = MsgrSettings {
            policy: match c.get("msgr_policy")?.as_str() {
                "lossy" => Policy::Lossy,
                _ => Policy::Lossless,
            },
            threads: c.get_u64("msgr_threads")? as usize,
            keepalive: (!keepalive.is_zero()).then_some(keepalive),
            probe: probe_after(c, keepalive)?,
            keepalive_timeout: ms(c, "msgr_keepalive_timeout_ms")?,
            reconnect_min: ms(c, "msgr_reconnect_min_ms")?,
            reconnect_max: ms(c, "msgr_reconnect_max_ms")?,
            reconnect_timeout: ms(c, "msgr_reconnect_timeout_ms")?,
            reconnect_attempts: c.get_u64("msgr_reconnect_attempts")? as u32,
            send_queue_msgs: c.get_u64("msgr_send_queue_msgs")? as usize,
            send_queue_bytes: c.get_u64("msgr_send_queue_bytes")?,
            recv_window: c.get_u64("msgr_recv_window")? as u32,
            recv_window_min: c.get_u64("msgr_recv_window_min")? as u32,
            pool_chunks: c.get_u64("msgr_pool_chunks")? as u32,
            eager_max: c.get_u64("msgr_eager_max")? as usize,
            eager_write: c.get_bool("msgr_eager_write")?,
            path_failback: c.get_bool("msgr_path_failback")?,
            rx_batch: match c.get_u64("msgr_rx_batch")? {
                0 => usize::MAX,
                n => n as usize,
            },
            max_recv_wr: c.get_u64("max_recv_wr")? as u32,
            max_send_wr: c.get_u64("max_send_wr")? as u32,
            max_send_sge: c.get_u64("max_send_sge")? as u32,
            spin: spin(c)?,
            worker_slice: match c.get_u64("msgr_worker_slice_us")? {
                0 => None,
                us => Some(Duration::from_micros(us)),
            },
            limits: MsgLimits {
                max_message_bytes: c.get_u64("msgr_max_message_bytes")?,
                max_segments: c.get_u64("msgr_max_segments")? as usize,
            },
        };
        let mut broken = Vec::new();
        // A received message's segments are READ into the data pool and held until it is
        // delivered: one larger than half the pool could wait for ever (or starve every
        // other session of receives). An explicit value over that is refused; the default
        // is lowered to it.
        let half_pool = u64::from(s.pool_chunks) * PAYLOAD_MAX as u64 / 2;
        if s.limits.max_message_bytes > half_pool {
            if c.source("msgr_max_message_bytes")? == Source::Default {
                s.limits.max_message_bytes = half_pool;
            } else {
                broken.push(format!(
                    "msgr_max_message_bytes ({}) must not exceed half the data pool ({half_pool} \
                     = msgr_pool_chunks {} x 4 KiB / 2): received messages are READ into it",
                    s.limits.max_message_bytes, s.pool_chunks
                ));
            }
        }
        if s.recv_window_min > s.recv_window {
            broken.push(format!(
                "msgr_recv_window_min ({}) must not exceed msgr_recv_window ({})",
                s.recv_window_min, s.recv_window
            ));
        }
        if s.recv_window > s.max_recv_wr {
            broken.push(format!(
                "msgr_recv_window ({}) must not exceed max_recv_wr ({}): each credit is a posted receive",
                s.recv_window, s.max_recv_wr
            ));
        }
        if s.max_send_wr < 8 {
            broken.push(format!(
                "max_send_wr ({}) must be at least 8 for the messenger",
                s.max_send_wr
            ));
        }
        if s.reconnect_min > s.reconnect_max {
            broken.push(format!(
                "msgr_reconnect_min_ms ({:?}) must not exceed msgr_reconnect_max_ms ({:?})",
                s.reconnect_min, s.reconnect_max
            ));
        }
        if let Some(k) = s.keepalive
            && k >= s.keepalive_timeout
        {
            broken.push(format!(
                "msgr_keepalive_ms ({k:?}) must be below msgr_keepalive_timeout_ms ({:?})",
                s.keepalive_timeout
            ));
        }
        if broken.is_empty() {
            Ok(s)
        } else {
            Err(Error::new(ErrorKind::Conflict, broken.join("; ")))
        }
    }
}

/// How long a progress loop polls after its last event before it sleeps: `poll_mode` busy
/// = always (None), event = not at all, adaptive = `polling_us`. Left at their defaults
/// (the transport's adaptive 1000 us) the messenger polls [`DEFAULT_SPIN`] instead. Every
/// adaptive budget backs off while the thread waits for a CPU (`msgr::spin`): measured on 2
/// cores shared with builds (load 4-6), a server worker spinning 1 ms without backing off
/// gave rpc_bw 5-14K ops/s against 26-36K sleeping at once, because a thread that spins is
/// time-sliced with the other runnable ones, while one that sleeps is woken at once.
fn spin(c: &Config) -> Result<Option<Duration>> {
    if c.source("poll_mode")? == Source::Default && c.source("polling_us")? == Source::Default {
        return Ok(Some(DEFAULT_SPIN));
    }
    Ok(match c.get("poll_mode")?.as_str() {
        "busy" => None,
        "event" => Some(Duration::ZERO),
        _ => Some(Duration::from_micros(c.get_u64("polling_us")?)),
    })
}

/// The messenger's polling after its last event when `poll_mode`/`polling_us` are left at
/// their defaults: long enough to catch the next request of a request/reply stream and the
/// next batch of a pipelined one, short enough that an idle messenger costs little.
/// Measured against sleeping at once (`bench/msgr.sh`-style A/B, 2 cores): rpc_lat p50
/// 22-34 vs 32-40 us. 50 us was too short for batches: fio rpc mode (4K randread QD32,
/// fio and rdmx-target both polling this long), 4 alternating rounds: 50 us 81-126K IOPS
/// (median ~110K), 200 us 104-151K (~138K), 1,000 us 115-145K (~127K); `poll_mode=busy` on
/// both 145-150K. Each side sleeps between batches that come more than 50 us apart, and a
/// wake-up costs both (15% of the target's and fio's CPU in the scheduler). rdmx-perf
/// rpc_bw/rpc_lat (whose client always polls) did not move (3 pairs). Under two busy loops
/// the backoff keeps 200 us from collapsing: 53-62K against 56-71K with 50 us.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(200);

/// The transport keys the messenger needs, raised where they were left at their defaults
/// (an explicit value too small is refused by `from_config` or by posting).
pub fn adjust(c: &Config) -> Result<Config> {
    let mut c = c.clone();
    if c.get_u64("max_recv_sge")? < 2 {
        // Header slot + data chunk.
        c.set("max_recv_sge", "2")?;
    }
    if c.source("max_send_sge")? == Source::Default && c.get_u64("max_send_sge")? < 16 {
        // READs of up to 16 chunks (64 KiB) per work request.
        c.set("max_send_sge", "16")?;
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spin_of(kv: &[(&str, &str)]) -> Option<Duration> {
        let mut c = Config::new();
        for (k, v) in kv {
            c.set(k, v).unwrap();
        }
        MsgrSettings::from_config(&adjust(&c).unwrap())
            .unwrap()
            .spin
    }

    #[test]
    fn spins_for_the_configured_budget_or_its_own_default() {
        assert_eq!(
            spin_of(&[]),
            Some(DEFAULT_SPIN),
            "defaults: the messenger's own"
        );
        assert_eq!(spin_of(&[("poll_mode", "busy")]), None);
        assert_eq!(spin_of(&[("poll_mode", "event")]), Some(Duration::ZERO));
        assert_eq!(
            spin_of(&[("polling_us", "250")]),
            Some(Duration::from_micros(250))
        );
        assert_eq!(
            spin_of(&[("poll_mode", "adaptive")]),
            Some(Duration::from_micros(1000))
        );
    }
}
