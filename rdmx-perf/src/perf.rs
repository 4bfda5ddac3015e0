//! What the NIC-style benchmarks share: command-line parsing, the configuration the tool
//! builds (tool defaults beneath the user's values), the server buffer's pattern, a latency
//! histogram, the waiting policy, the report (a readable table and one JSON object) and the
//! exit statuses.

use rdmx::Config;
use rdmx::config::{PollMode, Settings, Source};
use rdmx::msgr::Connection;
use rdmx::provider::soft::udp_baseline::poll_readable;
use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Defaults the tool puts beneath every user-given value (env, --profile, --set win), with
/// why: two processes on one host cannot both bind 4791, and on loopback one 4K block fits
/// one packet (the library clamps path_mtu per connection to the link's active MTU).
pub const TOOL_DEFAULTS: &[(&str, &str, &str)] = &[
    (
        "soft_port",
        "0",
        "rdmx-perf default: any free port, so server and client can share a host",
    ),
    (
        "path_mtu",
        "4096",
        "rdmx-perf default; clamped per connection to the link's active MTU",
    ),
];

/// Why a subcommand failed, which decides its exit status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fail {
    /// A bad command line or configuration: exit status 2.
    Usage(String),
    /// The run failed (setup, connection, errors during the run): exit status 1.
    Run(String),
}

impl Fail {
    /// Prints the message (prefixed with `who`) and returns the exit status.
    pub fn exit(self, who: &str) -> ExitCode {
        match self {
            Fail::Usage(m) => {
                eprintln!("{who}: {m}");
                ExitCode::from(2)
            }
            Fail::Run(m) => {
                eprintln!("{who}: {m}");
                ExitCode::from(1)
            }
        }
    }
}

/// Exit status 0, or what `r`'s failure says.
pub fn exit_status(r: Result<(), Fail>, who: &str) -> ExitCode {
    r.map_or_else(|f| f.exit(who), |()| ExitCode::SUCCESS)
}

/// Size of the region the server exposes (READ source / WRITE target).
pub const SERVER_REGION: usize = 64 << 20;

/// First byte of a SEND that asks the server for an answer of the same size (send_lat).
pub const PING: u8 = 0x50;
/// First byte of the server's answer.
pub const PONG: u8 = 0x70;
/// Immediate data of the server's "receives posted, go" SEND at the start of a connection.
pub const READY_IMM: u32 = 0x5244_5952; // "RDYR"
/// How long a client waits for it.
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest SEND the server takes (its receives name a buffer this large).
pub const MAX_SEND: usize = 4 << 20;

/// Seed of the server buffer's pattern.
const PATTERN_SEED: u64 = 0x5244_4D58_5045_5246; // "RDMXPERF"

/// Word `w` (bytes 8w..8w+8, little endian) of the server region's pattern.
#[inline]
pub fn pattern_word(w: u64) -> u64 {
    (w ^ PATTERN_SEED).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The pattern byte at region offset `off`.
#[inline]
pub fn pattern_byte(off: u64) -> u8 {
    pattern_word(off / 8).to_le_bytes()[(off % 8) as usize]
}

/// Fills `buf` with the pattern of region offsets `base..base + buf.len()`.
pub fn fill_pattern(buf: &mut [u8], base: u64) {
    if base % 8 == 0 {
        let total = buf.len();
        let mut chunks = buf.chunks_exact_mut(8);
        for (i, c) in (&mut chunks).enumerate() {
            c.copy_from_slice(&pattern_word(base / 8 + i as u64).to_le_bytes());
        }
        let done = total - chunks.into_remainder().len();
        for (i, b) in buf[done..].iter_mut().enumerate() {
            *b = pattern_byte(base + (done + i) as u64);
        }
    } else {
        for (i, b) in buf.iter_mut().enumerate() {
            *b = pattern_byte(base + i as u64);
        }
    }
}

/// The index of the first byte of `buf` that differs from the pattern at `base`, if any.
pub fn check_pattern(buf: &[u8], base: u64) -> Option<usize> {
    if base % 8 == 0 {
        let chunks = buf.chunks_exact(8);
        let done = buf.len() - chunks.remainder().len();
        let bad = chunks
            .enumerate()
            .any(|(i, c)| c != pattern_word(base / 8 + i as u64).to_le_bytes());
        if !bad {
            return buf[done..]
                .iter()
                .enumerate()
                .position(|(i, &b)| b != pattern_byte(base + (done + i) as u64))
                .map(|i| done + i);
        }
    }
    buf.iter()
        .enumerate()
        .position(|(i, &b)| b != pattern_byte(base + i as u64))
}

/// xorshift64* for offsets.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Builds the configuration: `RDMX_*` environment, `--profile`, `--set`, and beneath all of
/// them the tool defaults (see [`apply_tool_defaults`]). `extra` adds tool defaults of the
/// caller: (key, value, what asks for it, as in messages: "--qd 512").
pub fn build_config(
    profile: Option<&str>,
    sets: &[(String, String)],
    extra: &[(&str, String, String)],
) -> Result<Config, String> {
    let mut cfg = Config::from_env().map_err(|e| format!("environment: {e}"))?;
    if let Some(p) = profile {
        cfg.set("profile", p)
            .map_err(|e| format!("--profile {p}: {e}"))?;
    }
    for (k, v) in sets {
        cfg.set(k, v).map_err(|e| format!("--set {k}={v}: {e}"))?;
    }
    apply_tool_defaults(&mut cfg, extra)?;
    cfg.validate().map_err(|e| format!("configuration: {e}"))?;
    Ok(cfg)
}

/// Sets the tool defaults ([`TOOL_DEFAULTS`], then `extra`) on every key nobody else set;
/// returns the keys it set, with why.
pub fn apply_tool_defaults(
    cfg: &mut Config,
    extra: &[(&str, String, String)],
) -> Result<Vec<(String, String)>, String> {
    let defaults = TOOL_DEFAULTS
        .iter()
        .map(|&(k, v, why)| (k, v.to_string(), why.to_string()))
        .chain(extra.iter().map(|(k, v, why)| (*k, v.clone(), why.clone())));
    let mut applied = Vec::new();
    for (k, v, why) in defaults {
        if cfg.source(k).map_err(|e| e.to_string())? == Source::Default {
            cfg.set_from(k, &v, Source::File)
                .map_err(|e| format!("{why} sets {k}={v}: {e}"))?;
            applied.push((k.to_string(), why));
        }
    }
    Ok(applied)
}

/// Parses `--set KEY=VALUE`.
pub fn parse_set(kv: &str) -> Result<(String, String), String> {
    kv.split_once('=')
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .ok_or_else(|| format!("expects KEY=VALUE, got '{kv}'"))
}

/// Parses a number with an optional K/M/G (binary) suffix.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1 << 10),
        Some((i, 'm' | 'M')) => (&t[..i], 1 << 20),
        Some((i, 'g' | 'G')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("'{s}' is not a size (bytes, or with a K/M/G suffix)"))
}

/// A monotonic clock in ns since `start`.
#[derive(Debug, Clone, Copy)]
pub struct Clock(Instant);

impl Clock {
    pub fn new() -> Clock {
        Clock(Instant::now())
    }
    #[inline]
    pub fn now(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
}

/// Log-linear latency histogram in ns: exact below 128 ns, then 128 buckets per power of
/// two (under 0.8% relative error).
#[derive(Debug, Clone)]
pub struct Histogram {
    buckets: Vec<u64>,
    count: u64,
    sum: u128,
    min: u64,
    max: u64,
}

const SUB_BITS: u32 = 7;
const SUB: u64 = 1 << SUB_BITS;

impl Histogram {
    pub fn new() -> Histogram {
        Histogram {
            buckets: vec![0; (SUB * (64 - SUB_BITS as u64)) as usize],
            count: 0,
            sum: 0,
            min: u64::MAX,
            max: 0,
        }
    }

    fn index(v: u64) -> usize {
        if v < SUB {
            return v as usize;
        }
        let e = 63 - u64::from(v.leading_zeros()); // >= SUB_BITS
        let m = v >> (e - u64::from(SUB_BITS)); // in [SUB, 2 SUB)
        (SUB * (e - u64::from(SUB_BITS) + 1) + (m - SUB)) as usize
    }

    /// The middle of bucket `i`.
    fn value(i: usize) -> u64 {
        let i = i as u64;
        if i < SUB {
            return i;
        }
        let e = i / SUB + u64::from(SUB_BITS) - 1;
        let m = i % SUB + SUB;
        let shift = e - u64::from(SUB_BITS);
        (m << shift) + ((1u64 << shift) >> 1)
    }

    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.buckets[Self::index(ns)] += 1;
        self.count += 1;
        self.sum += u128::from(ns);
        self.min = self.min.min(ns);
        self.max = self.max.max(ns);
    }

    /// The `p`-quantile (0..=1) in ns; 0 when empty.
    pub fn quantile(&self, p: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((p * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0;
        for (i, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Self::value(i).clamp(self.min, self.max);
            }
        }
        self.max
    }

    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum as f64 / self.count as f64
        }
    }

    pub fn max(&self) -> u64 {
        if self.count == 0 { 0 } else { self.max }
    }

    /// How many values were recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn min(&self) -> u64 {
        if self.count == 0 { 0 } else { self.min }
    }
}

/// How a loop waits when a poll found nothing, as `poll_mode` says: spin (busy), sleep on
/// the completion channel (event), or spin `polling_us` then sleep (adaptive). With
/// progress=inline the caller's poll drives the engine while it spins; once it sleeps,
/// `req_notify` hands receiving to the device's progress thread until it polls again.
#[derive(Debug)]
pub struct Waiter {
    spin_ns: Option<u64>,
    idle_since: Option<u64>,
    ready: Vec<usize>,
    empty_polls: u32,
}

impl Waiter {
    pub fn new(s: &Settings) -> Waiter {
        let spin_ns = match s.poll_mode {
            PollMode::Busy => None,
            PollMode::Event => Some(0),
            PollMode::Adaptive => Some(u64::from(s.polling_us) * 1000),
        };
        Waiter {
            spin_ns,
            idle_since: None,
            ready: Vec::with_capacity(1),
            empty_polls: 0,
        }
    }

    /// A poll found work.
    #[inline]
    pub fn busy(&mut self) {
        self.idle_since = None;
        self.empty_polls = 0;
    }

    /// A poll found nothing: spin or sleep (at most `max_sleep`).
    pub fn idle(&mut self, conn: &Connection, now: u64, max_sleep: Duration) {
        let since = *self.idle_since.get_or_insert(now);
        match self.spin_ns {
            Some(spin) if now - since >= spin => {
                conn.req_notify();
                // req_notify signals at once when completions are queued: no lost wakeup.
                let _ = poll_readable(&[conn.event_fd()], max_sleep, &mut self.ready);
                conn.clear_event();
            }
            _ => {
                self.empty_polls += 1;
                if self.empty_polls % 64 == 0 {
                    // Two shared cores: let the progress threads run.
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    }
}

/// A benchmark's results, printed as a table or as one JSON object.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub test: String,
    /// Numeric fields in print order: (name, value, decimals).
    pub nums: Vec<(&'static str, f64, usize)>,
    pub strs: Vec<(&'static str, String)>,
}

impl Report {
    pub fn new(test: &str) -> Report {
        Report {
            test: test.to_string(),
            ..Default::default()
        }
    }

    pub fn num(&mut self, name: &'static str, v: f64, decimals: usize) {
        self.nums.push((name, v, decimals));
    }

    pub fn int(&mut self, name: &'static str, v: u64) {
        self.nums.push((name, v as f64, 0));
    }

    pub fn str(&mut self, name: &'static str, v: impl Into<String>) {
        self.strs.push((name, v.into()));
    }

    /// The string called `name`, if the report has it.
    pub fn get_str(&self, name: &str) -> Option<&str> {
        self.strs.iter().find(|s| s.0 == name).map(|s| s.1.as_str())
    }

    /// The figure called `name`, if the report has it.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.nums.iter().find(|n| n.0 == name).map(|n| n.1)
    }

    /// Bandwidth fields for `ops_per_sec` operations of `size` bytes, in perftest's two units:
    /// `bw_gbit_per_sec` is 10^9 bits/s (perftest's `BW average[Gb/sec]`, with
    /// `--report_gbits`), `bw_mib_per_sec` is 2^20 bytes/s (perftest's `BW average[MB/sec]`,
    /// which divides by 0x100000).
    pub fn bandwidth(&mut self, ops_per_sec: f64, size: u64) {
        let bytes = ops_per_sec * size as f64;
        self.num("bw_gbit_per_sec", bytes * 8.0 / 1e9, 3);
        self.num("bw_mib_per_sec", bytes / f64::from(1u32 << 20), 2);
    }

    /// Latency fields from a histogram (us).
    pub fn latency(&mut self, h: &Histogram) {
        let us = |ns: u64| ns as f64 / 1000.0;
        self.num("lat_min_us", us(h.min()), 2);
        self.num("lat_avg_us", h.mean() / 1000.0, 2);
        self.num("lat_p50_us", us(h.quantile(0.50)), 2);
        self.num("lat_p99_us", us(h.quantile(0.99)), 2);
        self.num("lat_p999_us", us(h.quantile(0.999)), 2);
        self.num("lat_max_us", us(h.max()), 2);
    }

    /// One JSON object (no trailing newline), keys in print order: `test`, the strings,
    /// the figures. A figure with 0 decimals is a JSON integer; others are rounded to their
    /// decimals (serde_json writes the shortest form: 61.70 is `61.7`); not finite: `null`.
    pub fn json(&self) -> String {
        let mut o = serde_json::Map::new();
        o.insert("test".into(), self.test.clone().into());
        for (k, v) in &self.strs {
            o.insert((*k).into(), v.clone().into());
        }
        for &(k, v, d) in &self.nums {
            o.insert(k.into(), json_number(v, d));
        }
        serde_json::Value::Object(o).to_string()
    }

    /// A readable table: the settings line, then the figures in rows of name/value.
    pub fn table(&self) -> String {
        let mut s = format!("# rdmx-perf {}", self.test);
        for (k, v) in &self.strs {
            let _ = write!(s, "  {k}={v}");
        }
        s.push('\n');
        let width = self.nums.iter().map(|n| n.0.len()).max().unwrap_or(0);
        for (k, v, d) in &self.nums {
            let _ = writeln!(s, "  {k:<width$}  {v:>14.d$}");
        }
        s
    }

    /// Prints the table on stdout, or with `json` the JSON object alone on stdout (one line,
    /// for `| jq`) and the table on stderr.
    pub fn print(&self, json: bool) {
        if json {
            eprint!("{}", self.table());
            println!("{}", self.json());
        } else {
            print!("{}", self.table());
        }
    }
}

/// `v` with `decimals` decimals as a JSON value (see [`Report::json`]).
pub fn json_number(v: f64, decimals: usize) -> serde_json::Value {
    // Integers up to 2^53 are exact in an f64.
    const EXACT: f64 = (1u64 << 53) as f64;
    if decimals == 0 && v.fract() == 0.0 && v.abs() <= EXACT {
        return if v >= 0.0 {
            (v as u64).into()
        } else {
            (v as i64).into()
        };
    }
    let scale = 10f64.powi(i32::try_from(decimals).unwrap_or(i32::MAX));
    let rounded = (v * scale).round() / scale;
    // from_f64 is None for NaN and infinities.
    serde_json::Number::from_f64(if rounded.is_finite() { rounded } else { v })
        .map_or(serde_json::Value::Null, serde_json::Value::Number)
}

/// Makes room for pinning `bytes` more (registration pins memory, within RLIMIT_MEMLOCK, as
/// on a NIC): raises the soft limit, and the hard one when permitted (root), like running
/// perftest after `ulimit -l unlimited`. Best effort: without the right to raise it,
/// pinning still works with CAP_IPC_LOCK, and a refused registration says what to do.
pub fn ensure_memlock(bytes: u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 {
        return;
    }
    if r.rlim_cur == libc::RLIM_INFINITY || r.rlim_cur >= bytes {
        return;
    }
    let want = bytes.saturating_add(16 << 20);
    let new = libc::rlimit {
        rlim_cur: want,
        rlim_max: if r.rlim_max == libc::RLIM_INFINITY {
            r.rlim_max
        } else {
            r.rlim_max.max(want)
        },
    };
    // SAFETY: setrlimit reads the struct we pass; failure leaves the limit as it was.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &new) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_fill_and_check_agree_at_any_alignment() {
        for base in [0u64, 8, 13, 4096 - 3] {
            let mut b = vec![0u8; 100];
            fill_pattern(&mut b, base);
            assert_eq!(check_pattern(&b, base), None);
            assert_eq!(b[5], pattern_byte(base + 5));
            b[77] ^= 1;
            assert_eq!(check_pattern(&b, base), Some(77));
            assert!(check_pattern(&b, base + 8).is_some());
        }
    }

    #[test]
    fn histogram_quantiles_are_close() {
        let mut h = Histogram::new();
        for v in 1..=100_000u64 {
            h.record(v * 10);
        }
        let p50 = h.quantile(0.5) as f64;
        assert!((p50 / 500_000.0 - 1.0).abs() < 0.01, "{p50}");
        let p99 = h.quantile(0.99) as f64;
        assert!((p99 / 990_000.0 - 1.0).abs() < 0.01, "{p99}");
        assert_eq!(h.max(), 1_000_000);
        for v in [0u64, 1, 127, 128, 129, 255, 256, 1 << 40, u64::MAX >> 1] {
            let i = Histogram::index(v);
            assert!(i < h.buckets.len());
            let back = Histogram::value(i) as f64;
            assert!(v < 128 && back == v as f64 || (back / v as f64 - 1.0).abs() < 0.01);
        }
    }

    #[test]
    fn json_is_one_object() {
        let mut r = Report::new("read_bw");
        r.str("provider", "soft \"x\"");
        r.num("ops_per_sec", 12.345, 1);
        r.int("errors", 0);
        r.num("lat_max_us", f64::NAN, 2);
        r.num("stalled_ms", 0.0, 1);
        r.str("note", "a\tb\u{1}");
        assert_eq!(
            r.json(),
            r#"{"test":"read_bw","provider":"soft \"x\"","note":"a\tb\u0001","ops_per_sec":12.3,"errors":0,"lat_max_us":null,"stalled_ms":0.0}"#
        );
    }

    #[test]
    fn bandwidth_is_in_perftest_units() {
        let mut r = Report::new("read_bw");
        // 2^20 ops/s of 4096 bytes: 4 GiB/s = 4096 MiB/s = 34.36 Gb/s.
        r.bandwidth(f64::from(1u32 << 20), 4096);
        assert_eq!(
            r.json(),
            r#"{"test":"read_bw","bw_gbit_per_sec":34.36,"bw_mib_per_sec":4096.0}"#
        );
    }

    #[test]
    fn tool_defaults_fill_only_unset_keys_and_say_why() {
        let mut cfg = Config::new();
        cfg.set("path_mtu", "1024").unwrap();
        let extra = [("max_send_wr", "512".to_string(), "--qd 512".to_string())];
        let applied = apply_tool_defaults(&mut cfg, &extra).unwrap();
        let keys: Vec<&str> = applied.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["soft_port", "max_send_wr"]);
        assert_eq!(cfg.get("path_mtu").unwrap(), "1024");
        assert_eq!(cfg.get("max_send_wr").unwrap(), "512");
        let bad = [("max_send_wr", "99999".to_string(), "--qd 99999".to_string())];
        let e = apply_tool_defaults(&mut Config::new(), &bad).unwrap_err();
        assert!(e.starts_with("--qd 99999 sets max_send_wr=99999: "), "{e}");
        assert!(!e.contains("tool default"), "{e}");
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert!(parse_size("x").is_err());
    }
}
