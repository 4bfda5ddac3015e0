//! rdmx-perf: perftest-like benchmark tool for rdmx.
//!
//! Subcommands:
//! - `config` prints the effective configuration (with where each value came from), the IB
//!   encoding tables and what the verbs probe found.
//! - `engine_bench` runs two RC engines in one process exchanging RDMA READs through an
//!   in-memory link, next to a bare copy loop, and prints both rates and their ratio
//!   (see `engine_bench.rs`).
//!
//! - `server` serves the NIC-style tests until killed (`server.rs`); `read_bw`, `write_bw`,
//!   `send_bw`, `read_lat` and `send_lat` run them against it (`client.rs`).
//! - `udp_server` / `udp_read`: the bare UDP baseline with the same batching and no
//!   reliability, which read_bw is compared with (`udp_baseline.rs`).

mod client;
mod engine_bench;
mod perf;
mod reg_bench;
mod server;
mod udp_baseline;

use rdmx::Config;
use rdmx::config::encoding::{ack_timeout_ns, rnr_timer_ns};
use std::process::ExitCode;

const USAGE: &str = "usage: rdmx-perf config [--profile NAME] [--set KEY=VALUE]... [--file PATH]";

fn fmt_ns(ns: u64) -> String {
    match ns {
        0 => "none".to_string(),
        n if n >= 1_000_000_000 => format!("{:.3} s", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.3} ms", n as f64 / 1e6),
        n => format!("{:.3} us", n as f64 / 1e3),
    }
}

fn tables() -> String {
    let mut s = String::from("code  min_rnr_timer (RNR NAK wait)  timeout (local ACK timer)\n");
    for code in 0..32u8 {
        let rnr = rnr_timer_ns(code).map_or("?".to_string(), fmt_ns);
        let ack = ack_timeout_ns(code).map_or("?".to_string(), fmt_ns);
        s.push_str(&format!("{code:>4}  {rnr:>28}  {ack:>25}\n"));
    }
    s
}

fn all_usage() -> String {
    format!(
        "{USAGE}\n{}\n{}\n{}\n{}\n{}",
        engine_bench::USAGE,
        server::USAGE,
        client::USAGE,
        udp_baseline::SERVER_USAGE,
        udp_baseline::CLIENT_USAGE
    )
}

fn run(args: &[String]) -> Result<(), String> {
    let Some((cmd, rest)) = args.split_first() else {
        return Err(all_usage());
    };
    if cmd != "config" {
        return Err(format!("unknown subcommand '{cmd}'\n{}", all_usage()));
    }
    let mut cfg = Config::from_env().map_err(|e| e.to_string())?;
    let mut it = rest.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
        };
        match flag.as_str() {
            "--profile" => cfg.set("profile", &value()?),
            "--file" => cfg.load_file(std::path::Path::new(&value()?)),
            "--set" => {
                let kv = value()?;
                let (k, v) = kv
                    .split_once('=')
                    .ok_or_else(|| format!("--set expects KEY=VALUE, got '{kv}'"))?;
                cfg.set(k, v)
            }
            other => return Err(format!("unknown option '{other}'\n{USAGE}")),
        }
        .map_err(|e| e.to_string())?;
    }
    cfg.validate().map_err(|e| e.to_string())?;
    println!("# rdmx {} effective configuration", rdmx::VERSION);
    print!("{}", cfg.dump());
    println!();
    println!("# IB encodings (rc-transport.md 4.2, 4.4)");
    print!("{}", tables());
    #[cfg(feature = "verbs")]
    println!("\n# {}", rdmx::verbs_probe::describe());
    Ok(())
}

/// Exit status of a subcommand that only returns on failure (servers) or with `Result`.
fn report(r: Result<(), String>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rdmx-perf: {e}");
            ExitCode::from(2)
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let first = args.first().map(String::as_str);
    match first {
        Some("engine_bench") => return engine_bench::main(&args[1..]),
        Some("reg_bench") => return reg_bench::main(&args[1..]),
        Some("server") => return report(server::main(&args[1..])),
        Some("udp_server") => return report(udp_baseline::server(&args[1..])),
        Some("udp_read") => return udp_baseline::client(&args[1..]),
        Some(t) if client::TESTS.contains(&t) => return client::main(t, &args[1..]),
        _ => {}
    }
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rdmx-perf: {e}");
            ExitCode::from(2)
        }
    }
}
