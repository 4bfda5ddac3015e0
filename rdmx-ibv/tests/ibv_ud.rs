//! Unmodified libibverbs programs over UD QPs on `rdmx0`, through `rdmx-ibv exec`:
//! `ibv_ud_pingpong` (address handles from the GID, 40-byte GRH buffers) and perftest's
//! `ib_send_bw -c UD` (every size up to the MTU) and `ib_send_lat -c UD`. Each pair of
//! processes uses its own loopback addresses and TCP port; every process runs under a
//! deadline (the test fails past it). And `ffi-tests/ibv_ud.c`, the C API's view: AH
//! refusals, the completion fields and GRH bytes, the MTU refusal, multicast EOPNOTSUPP. UD loses what finds no receive posted, so the
//! programs' own flow (ping-pong; perftest's receive depth) is what keeps them whole.

mod ibv_support;

use ibv_support::*;
use std::time::Duration;

#[test]
fn ibv_ud_pingpong() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require_tool("ibv_ud_pingpong");
    skip_unless_platform!();
    let (s, c) = pair(
        "ud_pingpong",
        "127.0.73.2",
        "127.0.73.3",
        &[
            "ibv_ud_pingpong",
            "-d",
            "rdmx0",
            "-g",
            "0",
            "-p",
            "18661",
            "-n",
            "200",
        ],
        Duration::from_secs(60),
    );
    for out in [&s, &c] {
        assert!(out.contains("200 iters in"), "{out}");
    }
    // Each side printed the peer's GID: the AH was made from it.
    assert!(c.contains("GID ::ffff:127.0.73.2"), "{c}");
}

fn perftest_ud(tool: &str, port: &str, extra: &[&str], srv: &str, cli: &str) -> (String, String) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require_tool(tool);
    if let Some(why) = platform_cannot() {
        require::missing(require::USERNS, "running programs under rdmx-ibv exec", why);
        return (String::new(), String::new());
    }
    let mut cmd = vec![tool, "-d", "rdmx0", "-x", "0", "-F", "-c", "UD", "-p", port];
    cmd.extend_from_slice(extra);
    pair(tool, srv, cli, &cmd, Duration::from_secs(90))
}

#[test]
fn perftest_send_bw_ud_every_size_up_to_the_mtu() {
    let (s, c) = perftest_ud(
        "ib_send_bw",
        "18662",
        &["-a", "-n", "100"],
        "127.0.73.4",
        "127.0.73.5",
    );
    if c.is_empty() {
        return;
    }
    assert!(c.contains("Connection type : UD"), "{c}");
    // perftest caps UD messages at the port MTU: 2 .. 4096 bytes, each a result row.
    for size in ["2 ", "64 ", "1024 ", "4096 "] {
        assert!(
            c.lines().any(|l| l.trim_start().starts_with(size)),
            "no row for {size}bytes:\n{c}"
        );
    }
    assert!(
        !c.lines().any(|l| l.trim_start().starts_with("8192 ")),
        "{c}"
    );
    assert!(s.contains("#bytes"), "{s}");
}

#[test]
fn perftest_send_lat_ud() {
    let (_, c) = perftest_ud(
        "ib_send_lat",
        "18663",
        &["-n", "200"],
        "127.0.73.6",
        "127.0.73.7",
    );
    if c.is_empty() {
        return;
    }
    assert!(c.contains("Connection type : UD"), "{c}");
    assert!(c.contains("t_typical"), "{c}");
}

#[test]
fn the_c_api_sees_ud_completions_the_mtu_refusal_and_no_multicast() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require_tool("cc");
    skip_unless_platform!();
    let bin = build_c(
        "ibv_ud_c",
        "../ffi-tests/ibv_ud.c",
        "c11",
        &["-pedantic"],
        &["-libverbs"],
    );
    let dir = bin.parent().unwrap();
    let out = run_alone(dir, "ibv_ud", "127.0.73.8", &[bin.to_str().unwrap()]);
    assert!(out.contains("ibv_ud: all passed (MTU 4096)"), "{out}");
}

/// UCX's UCP layer over `ud_verbs` alone (its wireup and data on UD QPs): needs the GRH
/// area, `src_qp`, and the RoCEv2/IPv4 packet type UCX reads from `wc.sl`
/// (`verbs::qp::ud::roce_v2_sl`); with rc_verbs too, rendezvous goes over RC.
#[test]
fn ucx_perftest_tag_bw_over_ud_verbs() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require_tool("ucx_perftest");
    skip_unless_platform!();
    for (tls, port, size, srv, cli) in [
        ("ud_verbs,self", "18664", "8", "127.0.73.10", "127.0.73.11"),
        (
            "rc_verbs,ud_verbs,self",
            "18665",
            "65536",
            "127.0.73.12",
            "127.0.73.13",
        ),
    ] {
        let tls = format!("UCX_TLS={tls}");
        let (_, c) = pair(
            "ucx_tag_bw",
            srv,
            cli,
            &[
                "env",
                &tls,
                "UCX_NET_DEVICES=rdmx0:1",
                "ucx_perftest",
                "-p",
                port,
                "-t",
                "tag_bw",
                "-n",
                "2000",
                "-s",
                size,
            ],
            Duration::from_secs(90),
        );
        assert!(c.contains("Final:"), "{tls}:\n{c}");
    }
}
