//! rdmx-perf: perftest-like benchmark tool for rdmx.
//!
//! Subcommands (the table [`SUBCOMMANDS`] is what `--help` lists and what runs):
//! - `server` serves the NIC-style tests until killed (`server.rs`); `read_bw`, `write_bw`,
//!   `send_bw`, `read_lat` and `send_lat` run them against it (`client.rs`); `msg_bw`,
//!   `rpc_bw` and `rpc_lat` run through the messenger (`msgr_bench.rs`).
//! - `udp_server` / `udp_read`: the bare UDP baseline with the same batching and no
//!   reliability, which read_bw is compared with (`udp_baseline.rs`).
//! - `engine_bench` runs two RC engines in one process exchanging RDMA READs through an
//!   in-memory link, next to a bare copy loop, and prints both rates and their ratio
//!   (`engine_bench.rs`).
//! - `reg_bench`: what registering a 4K buffer costs, per IO, pooled and cached
//!   (`reg_bench.rs`).
//! - `tune` sweeps the knobs of the seed article's tuning table against a server and
//!   recommends the four RC timers for the path it measured (`tune/`).
//! - `config` prints the configuration the benchmarks use (with where each value came from,
//!   each knob's allowed values and meaning), the IB encoding tables and what the verbs
//!   probe found.
//!
//! Exit status, every subcommand: 0 success, 1 the run failed, 2 usage error; `--help`,
//! `-h` and `help` print to stdout and exit 0. Options are parsed with clap (`cli.rs`, set
//! up to keep these conventions and messages), JSON is written with serde_json.

mod cli;
mod client;
mod engine_bench;
mod msgr_bench;
mod perf;
mod reg_bench;
mod server;
mod tune;
mod udp_baseline;

use perf::{Fail, apply_tool_defaults, exit_status};
use rdmx::Config;
use rdmx::config::encoding::{ack_timeout_ns, rnr_timer_ns};
use rdmx::config::{KEYS, Source};
use std::io::Write;
use std::process::ExitCode;

/// A subcommand: its name, one line on what it does, its usage line, its `--help` text and
/// how it runs.
struct Subcommand {
    name: &'static str,
    what: &'static str,
    usage: &'static str,
    help: &'static str,
    run: fn(&[String]) -> ExitCode,
}

/// Every subcommand, in the order `--help` lists them.
const SUBCOMMANDS: &[Subcommand] = &[
    Subcommand {
        name: "server",
        what: "serve the client tests below until killed",
        usage: server::USAGE,
        help: server::HELP,
        run: |a| exit_status(server::main(a), "rdmx-perf: server"),
    },
    Subcommand {
        name: "read_bw",
        what: "RDMA READ bandwidth against a server",
        usage: client::USAGE,
        help: client::HELP,
        run: |a| client::main("read_bw", a),
    },
    Subcommand {
        name: "write_bw",
        what: "RDMA WRITE bandwidth against a server",
        usage: client::USAGE,
        help: client::HELP,
        run: |a| client::main("write_bw", a),
    },
    Subcommand {
        name: "send_bw",
        what: "SEND bandwidth against a server",
        usage: client::USAGE,
        help: client::HELP,
        run: |a| client::main("send_bw", a),
    },
    Subcommand {
        name: "read_lat",
        what: "RDMA READ latency (one at a time)",
        usage: client::USAGE,
        help: client::HELP,
        run: |a| client::main("read_lat", a),
    },
    Subcommand {
        name: "send_lat",
        what: "SEND round-trip latency (one ping at a time)",
        usage: client::USAGE,
        help: client::HELP,
        run: |a| client::main("send_lat", a),
    },
    Subcommand {
        name: "msg_bw",
        what: "one-way messenger messages of --size data, --qd unacknowledged",
        usage: msgr_bench::USAGE,
        help: msgr_bench::HELP,
        run: |a| msgr_bench::main("msg_bw", a),
    },
    Subcommand {
        name: "rpc_bw",
        what: "messenger requests answered with --size data, --qd outstanding",
        usage: msgr_bench::USAGE,
        help: msgr_bench::HELP,
        run: |a| msgr_bench::main("rpc_bw", a),
    },
    Subcommand {
        name: "rpc_lat",
        what: "messenger request/reply latency (one at a time)",
        usage: msgr_bench::USAGE,
        help: msgr_bench::HELP,
        run: |a| msgr_bench::main("rpc_lat", a),
    },
    Subcommand {
        name: "udp_server",
        what: "the UDP baseline's server (no reliability)",
        usage: udp_baseline::SERVER_USAGE,
        help: udp_baseline::SERVER_HELP,
        run: |a| exit_status(udp_baseline::server(a), "rdmx-perf: udp_server"),
    },
    Subcommand {
        name: "udp_read",
        what: "the UDP baseline's client, what read_bw is compared with",
        usage: udp_baseline::CLIENT_USAGE,
        help: udp_baseline::CLIENT_HELP,
        run: udp_baseline::client,
    },
    Subcommand {
        name: "engine_bench",
        what: "two RC engines in one process vs a bare copy of the same blocks",
        usage: engine_bench::USAGE,
        help: engine_bench::HELP,
        run: engine_bench::main,
    },
    Subcommand {
        name: "reg_bench",
        what: "4K registration cost: per IO vs pooled chunk vs registration-cache hit",
        usage: reg_bench::USAGE,
        help: reg_bench::HELP,
        run: reg_bench::main,
    },
    Subcommand {
        name: "tune",
        what: "the seed's tuning table against a server, and the RC timer advisor",
        usage: tune::USAGE,
        help: tune::HELP,
        run: tune::main,
    },
    Subcommand {
        name: "config",
        what: "the configuration the benchmarks use, each knob's range and meaning",
        usage: CONFIG_USAGE,
        help: CONFIG_HELP,
        run: |a| exit_status(config(a), "rdmx-perf: config"),
    },
];

const CONFIG_USAGE: &str =
    "usage: rdmx-perf config [--server] [--profile NAME] [--set KEY=VALUE]... [--file PATH]";

const CONFIG_HELP: &str = "\
Prints the configuration a client test (with --server: the server) runs with: every knob as
`key = value  # source`, where source is default, profile NAME, file PATH:LINE, env RDMX_KEY,
set, or an rdmx-perf default (which fills a key nobody else set), then the knob's allowed
values and meaning; then the IB encodings of min_rnr_timer and timeout. The knob lines load
back as a file (--file).

options:
  --server          the server's values (it adds max_recv_wr = 4096)
  --profile NAME    a configuration profile (e.g. ceph-after)
  --set KEY=VALUE   a knob; repeatable; applied in order with --profile and --file
  --file PATH       a ceph.conf-like file ([global] / [rdmx] sections, key = value)

exit status: 0 printed, 2 usage or configuration error.";

/// The overview `rdmx-perf --help` prints.
fn overview() -> String {
    let mut s = String::from(
        "rdmx-perf: perftest-like benchmarks for rdmx\n\n\
         usage: rdmx-perf SUBCOMMAND [OPTIONS]\n       \
         rdmx-perf SUBCOMMAND --help   (that subcommand's options)\n       \
         rdmx-perf help [SUBCOMMAND]\n\nsubcommands:\n",
    );
    let width = SUBCOMMANDS.iter().map(|c| c.name.len()).max().unwrap_or(0);
    for c in SUBCOMMANDS {
        s.push_str(&format!("  {:<width$}  {}\n", c.name, c.what));
    }
    s.push_str(&format!(
        "  {:<width$}  this text, or a subcommand's options\n\n",
        "help"
    ));
    let mut usages: Vec<&str> = SUBCOMMANDS.iter().map(|c| c.usage).collect();
    usages.dedup();
    for u in usages {
        s.push_str(u);
        s.push('\n');
    }
    s.push_str("\nexit status: 0 success, 1 the run failed, 2 usage error\n");
    s
}

fn find(name: &str) -> Option<&'static Subcommand> {
    SUBCOMMANDS.iter().find(|c| c.name == name)
}

/// Writes `text` to stdout; a closed pipe (`| head`) is not an error.
fn out(text: &str) {
    let mut o = std::io::stdout().lock();
    let _ = o.write_all(text.as_bytes()).and_then(|()| o.flush());
}

fn fmt_ns(ns: u64) -> String {
    match ns {
        0 => "none".to_string(),
        n if n >= 1_000_000_000 => format!("{:.3} s", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.3} ms", n as f64 / 1e6),
        n => format!("{:.3} us", n as f64 / 1e3),
    }
}

fn tables() -> String {
    let mut s = String::from(
        "# IB encodings of the 5-bit codes:\n\
         #   min_rnr_timer: how long a sender waits after an RNR NAK (IBTA Vol 1 Table 45,\n\
         #     section 9.7.5.2.8; code 0 is the longest wait, 655.36 ms)\n\
         #   timeout: the local ACK timer, 4.096 us x 2^code, 0 = wait forever (IBTA Vol 1\n\
         #     section 9.7.6.1.3; the `timeout` attribute of ibv_modify_qp(3))\n\
         code  min_rnr_timer (RNR NAK wait)  timeout (local ACK timer)\n",
    );
    for code in 0..32u8 {
        let rnr = rnr_timer_ns(code).map_or("?".to_string(), fmt_ns);
        let ack = ack_timeout_ns(code).map_or("?".to_string(), fmt_ns);
        s.push_str(&format!("{code:>4}  {rnr:>28}  {ack:>25}\n"));
    }
    s
}

/// `rdmx-perf config`: the configuration a client (or with `--server` the server) uses.
///
/// Parsed by hand, not with clap like the other subcommands: `--profile`, `--file` and
/// `--set` apply in the order given (a later one overrides an earlier one's keys), and
/// clap's derived struct keeps each option's values but not their order among each other.
fn config(args: &[String]) -> Result<(), Fail> {
    let usage = Fail::Usage;
    let mut cfg = Config::from_env().map_err(|e| usage(format!("environment: {e}")))?;
    let mut for_server = false;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| usage(format!("{flag} needs a value\n{CONFIG_USAGE}")))
        };
        let r = match flag.as_str() {
            "--server" => {
                for_server = true;
                Ok(())
            }
            "--profile" => {
                let p = value()?;
                cfg.set("profile", &p)
                    .map_err(|e| format!("--profile {p}: {e}"))
            }
            "--file" => {
                let f = value()?;
                cfg.load_file(std::path::Path::new(&f))
                    .map_err(|e| format!("--file {f}: {e}"))
            }
            "--set" => {
                let (k, v) =
                    perf::parse_set(&value()?).map_err(|e| usage(format!("--set: {e}")))?;
                cfg.set(&k, &v).map_err(|e| format!("--set {k}={v}: {e}"))
            }
            other => return Err(usage(format!("unknown option '{other}'\n{CONFIG_USAGE}"))),
        };
        r.map_err(usage)?;
    }
    let extra = if for_server {
        vec![(
            "max_recv_wr",
            server::SERVER_RECV_WR.to_string(),
            "the rdmx-perf server's default".to_string(),
        )]
    } else {
        Vec::new()
    };
    // The keys the tool itself sets, with what to say about them instead of "file".
    let ours = apply_tool_defaults(&mut cfg, &extra).map_err(usage)?;
    cfg.validate()
        .map_err(|e| usage(format!("configuration: {e}")))?;
    let mut s = format!(
        "# rdmx {}: what {} runs with, given these options and RDMX_* variables\n\
         # sources, lowest first: default, profile, file, env (RDMX_*), set; an rdmx-perf\n\
         # default fills a key none of them set. Below each key: allowed values; meaning.\n",
        rdmx::VERSION,
        if for_server {
            "rdmx-perf server"
        } else {
            "an rdmx-perf client test (for the server: config --server)"
        }
    );
    for line in cfg.dump().lines() {
        let key = line.split(" = ").next().unwrap_or_default();
        let Some(spec) = KEYS.iter().find(|k| k.name == key) else {
            s.push_str(line);
            s.push('\n');
            continue;
        };
        let (setting, comment) = line.split_once("  # ").unwrap_or((line, ""));
        let mut comment = match ours.iter().find(|(k, _)| k == key) {
            Some((_, why)) => why.clone(),
            None => comment.to_string(),
        };
        let unset = cfg.source(key).is_ok_and(|src| src == Source::Default);
        match key {
            "max_send_wr" if unset => comment.push_str(" (clients with --qd N over 256: N)"),
            "max_recv_wr" if unset => comment.push_str(" (rdmx-perf server: 4096)"),
            _ => {}
        }
        s.push_str(&format!(
            "{setting}  # {comment}\n#   {}; {}\n",
            spec.kind.allowed(),
            spec.help
        ));
    }
    s.push('\n');
    s.push_str(&tables());
    s.push_str(&format!("\n# {}\n", rdmx::provider::describe_verbs()));
    // The provider this configuration gets here, and why (provider=auto opens the verbs
    // device to see whether it is usable).
    match cfg.settings().and_then(|st| rdmx::provider::resolve(&st)) {
        Ok((name, why)) => s.push_str(&format!("# provider: {name} ({why})\n")),
        Err(e) => s.push_str(&format!("# provider: none ({e})\n")),
    }
    out(&s);
    Ok(())
}

/// The dispatcher stays hand-written: it prints our overview and help texts (`--help`
/// anywhere wins over any other argument, valid or not, and exits 0 with the text on
/// stdout), then hands the subcommand's arguments to its parser (clap: `cli.rs`).
fn main() -> ExitCode {
    // The library's log lines on stderr (RDMX_LOG=info shows e.g. path MTU clamps).
    rdmx::logging::init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((cmd, rest)) = args.split_first() else {
        eprint!("{}", overview());
        return ExitCode::from(2);
    };
    let is_help = |a: &String| matches!(a.as_str(), "-h" | "--help");
    if is_help(cmd) || cmd == "help" {
        return match rest.first() {
            None => {
                out(&overview());
                ExitCode::SUCCESS
            }
            Some(name) => match find(name) {
                Some(c) => {
                    out(&format!("{}\n\n{}\n", c.usage, c.help));
                    ExitCode::SUCCESS
                }
                None => Fail::Usage(format!("help: unknown subcommand '{name}'\n{}", overview()))
                    .exit("rdmx-perf"),
            },
        };
    }
    let Some(c) = find(cmd) else {
        return Fail::Usage(format!("unknown subcommand '{cmd}'\n{}", overview()))
            .exit("rdmx-perf");
    };
    if rest.iter().any(is_help) {
        out(&format!("{}\n\n{}\n", c.usage, c.help));
        return ExitCode::SUCCESS;
    }
    (c.run)(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_subcommand_is_listed_once_with_usage_and_help() {
        let o = overview();
        for c in SUBCOMMANDS {
            let listed = o
                .lines()
                .filter(|l| l.split_whitespace().next() == Some(c.name))
                .count();
            assert_eq!(listed, 1, "{} listed {listed} times:\n{o}", c.name);
            assert!(c.usage.starts_with("usage: rdmx-perf "), "{}", c.name);
            assert!(o.contains(c.usage), "{}: usage missing", c.name);
            assert!(!c.help.is_empty(), "{}", c.name);
        }
        for t in ["read_bw", "write_bw", "send_bw", "read_lat", "send_lat"] {
            assert!(find(t).is_some(), "{t} does not run");
        }
    }
}
