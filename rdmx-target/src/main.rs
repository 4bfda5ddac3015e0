//! `rdmx-target --listen ADDR:PORT --volume NAME=mem:SIZE|file:PATH [--volume ...]
//! [--keyring FILE] [--entity NAME] [--allow VOLUME=ENTITY:rw|ro[,...]]...
//! [--max-backlog N] [--session-bufs N]
//! [--max-deferred N] [--max-deferred-bytes SIZE] [--io-bufs N] [--set KEY=VALUE]...
//! [--profile NAME]`: serves block volumes until killed (SIGTERM / SIGINT end it).
//! `RDMX_LOG` (off, error, warn, info, debug, trace; default warn) sets what it logs on
//! stderr: info shows a line per session and per volume opened, warn every refusal.
//! Protocol and design: `docs/block.md`.

use clap::Parser;
use rdmx::blk::target::{AllowSpec, Limits, Target, TargetOptions, VolumeSpec, parse_size};
use rdmx::config::Config;
use std::io::Write;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(
    name = "rdmx-target",
    about = "Serves block volumes (memory or file) over the rdmx messenger",
    long_about = "Serves block volumes over the rdmx messenger: 4 KiB-aligned read, write \
                  (up to 1 MiB), flush and query. Memory volumes are also exposed for \
                  one-sided RDMA READ/WRITE (clients' mode=read). Prints one line \
                  'rdmx-target listening on ADDR (...)' once it serves."
)]
struct Args {
    /// Where to accept block clients (port 0 = any free port).
    #[arg(long, value_name = "ADDR:PORT")]
    listen: String,
    /// A volume: NAME=mem:SIZE (e.g. vol0=mem:64M) or NAME=file:PATH (O_DIRECT). Repeatable.
    #[arg(
        long = "volume",
        value_name = "NAME=mem:SIZE|file:PATH",
        required = true
    )]
    volumes: Vec<VolumeSpec>,
    /// A Ceph-style keyring ([client.NAME] key = BASE64; mode 600 or stricter) with the
    /// keys of the entities that may connect: clients must authenticate (auth = required).
    /// The same as `--set auth_keyring=FILE`; see docs/security.md.
    #[arg(long, value_name = "FILE")]
    keyring: Option<String>,
    /// The name this target gives itself in the handshake (auth_entity; default
    /// client.admin).
    #[arg(long, value_name = "NAME")]
    entity: Option<String>,
    /// Who may open a volume: VOLUME=ENTITY:rw|ro[,ENTITY:rw|ro...] (e.g.
    /// v0=client.a:rw,client.b:ro). Repeatable. Without any, every peer may open every
    /// volume read-write (a warning says so); with any, only the entities granted may, and
    /// a session without an authenticated entity (auth = none) may open nothing.
    #[arg(long = "allow", value_name = "VOLUME=ENTITY:rw|ro[,...]")]
    allow: Vec<AllowSpec>,
    /// Replies a session may have waiting for its credits before its requests wait.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_backlog)]
    max_backlog: usize,
    /// Reply buffers (pool chunks, 1 MiB IO buffers) a session may hold unacknowledged
    /// before its requests wait.
    #[arg(long, value_name = "N", default_value_t = Limits::default().session_bufs)]
    session_bufs: usize,
    /// Requests a stalled session may have waiting; one more closes it.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_deferred)]
    max_deferred: usize,
    /// Bytes (with write data) a stalled session may have waiting; more closes it.
    #[arg(long, value_name = "SIZE", value_parser = parse_bytes, default_value = "32M")]
    max_deferred_bytes: usize,
    /// 1 MiB IO buffers (large file reads) of the whole target.
    #[arg(long, value_name = "N", default_value_t = Limits::default().io_bufs)]
    io_bufs: usize,
    /// An rdmx configuration key (transport or msgr_*). Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_set)]
    sets: Vec<(String, String)>,
    /// A configuration profile (e.g. ceph-after).
    #[arg(long, value_name = "NAME")]
    profile: Option<String>,
}

fn parse_bytes(v: &str) -> Result<usize, String> {
    parse_size(v)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| format!("'{v}' is not a size (e.g. 32M)"))
}

fn parse_set(v: &str) -> Result<(String, String), String> {
    let (k, val) = v
        .split_once('=')
        .ok_or_else(|| format!("expects KEY=VALUE, got '{v}'"))?;
    Ok((k.trim().to_string(), val.trim().to_string()))
}

fn config(a: &Args) -> Result<Config, String> {
    let mut cfg = Config::from_env().map_err(|e| format!("environment: {e}"))?;
    if let Some(p) = &a.profile {
        cfg.set("profile", p)
            .map_err(|e| format!("--profile {p}: {e}"))?;
    }
    if let Some(k) = &a.keyring {
        cfg.set("auth_keyring", k)
            .map_err(|e| format!("--keyring {k}: {e}"))?;
    }
    if let Some(e) = &a.entity {
        cfg.set("auth_entity", e)
            .map_err(|err| format!("--entity {e}: {err}"))?;
    }
    for (k, v) in &a.sets {
        cfg.set(k, v).map_err(|e| format!("--set {k}={v}: {e}"))?;
    }
    cfg.validate().map_err(|e| format!("configuration: {e}"))?;
    Ok(cfg)
}

static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_signal(_: i32) {
    STOP.store(true, std::sync::atomic::Ordering::Relaxed);
}

fn main() {
    // The library's log lines on stderr, at the level RDMX_LOG names (default warn).
    rdmx::logging::init();
    let a = Args::parse();
    let cfg = match config(&a) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rdmx-target: {e}");
            std::process::exit(2);
        }
    };
    let opts = TargetOptions {
        allow: a.allow.clone(),
        limits: Limits {
            max_backlog: a.max_backlog,
            session_bufs: a.session_bufs,
            max_deferred: a.max_deferred,
            max_deferred_bytes: a.max_deferred_bytes,
            io_bufs: a.io_bufs,
        },
    };
    let t = match Target::start_with(&cfg, &a.listen, &a.volumes, &opts) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("rdmx-target: {e}");
            std::process::exit(1);
        }
    };
    let vols: Vec<String> = t
        .volumes()
        .iter()
        .map(|(n, s)| format!("{n} {} MiB", s >> 20))
        .collect();
    println!(
        "rdmx-target listening on {} (one-sided {}; volumes: {})",
        t.addr(),
        t.rdma_addr()
            .map_or_else(|| "none".to_string(), |a| a.to_string()),
        vols.join(", ")
    );
    let _ = std::io::stdout().flush();
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: installs an async-signal-safe handler (one atomic store).
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
    while !STOP.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let s = t.stats();
    let n = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "rdmx-target: stopping: {} sessions, {} requests, {} error replies, {} clients reset, \
         {} refused by access control, {} set aside over quota ({} stalls, {} sessions closed)",
        n(&s.sessions),
        n(&s.requests),
        n(&s.errors),
        n(&s.resets),
        n(&s.access_denied),
        n(&s.deferred),
        n(&s.quota_stalls),
        n(&s.quota_closes)
    );
}
