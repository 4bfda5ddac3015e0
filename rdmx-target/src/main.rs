//! `rdmx-target --listen ADDR:PORT --volume NAME=mem:SIZE|file:PATH [--volume ...]
//! [--set KEY=VALUE]... [--profile NAME]`: serves block volumes until killed (SIGTERM /
//! SIGINT end it). Protocol and design: `docs/block.md`.

use clap::Parser;
use rdmx::blk::target::{Target, VolumeSpec};
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
    /// An rdmx configuration key (transport or msgr_*). Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_set)]
    sets: Vec<(String, String)>,
    /// A configuration profile (e.g. ceph-after).
    #[arg(long, value_name = "NAME")]
    profile: Option<String>,
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
    let a = Args::parse();
    let cfg = match config(&a) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rdmx-target: {e}");
            std::process::exit(2);
        }
    };
    let t = match Target::start(&cfg, &a.listen, &a.volumes) {
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
    eprintln!(
        "rdmx-target: stopping: {} requests, {} error replies, {} clients reset",
        s.requests.load(std::sync::atomic::Ordering::Relaxed),
        s.errors.load(std::sync::atomic::Ordering::Relaxed),
        s.resets.load(std::sync::atomic::Ordering::Relaxed)
    );
}
