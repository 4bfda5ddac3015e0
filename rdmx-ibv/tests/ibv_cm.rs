//! The RDMA connection manager on rdmx0: unmodified librdmacm programs under
//! `rdmx-ibv exec` (rping, ucmatose, udaddy, rdma_server/rdma_client from rdmacm-utils;
//! perftest's `-R`), each pair on its own 127.0.44.x addresses and a free port, every
//! process under a deadline; and `tests/c/cm_events.c` (cc -Wall -Wextra -Werror) for
//! the events rxe gives: a REJECTED carrying the passive side's private data (status
//! 28, consumer reject, 148 bytes as the IB REJ), a connect with no listener (REJECTED,
//! status 8), private data both ways on an accepted connection, a disconnect from
//! either side, and a peer killed while connected (DISCONNECTED on the other side,
//! bounded).

mod ibv_support;

use ibv_support::*;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(60);

/// A port nobody listens on at `ip` now.
fn free_port(ip: &str) -> u16 {
    std::net::TcpListener::bind((ip, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A server command, then (once its rdma_cm port listens) a client command; both must
/// exit 0 within [`LIMIT`]. Returns (server output, client output).
fn cm_pair(
    name: &str,
    srv: (Option<&str>, &str, &[&str]),
    cli: (Option<&str>, &str, &[&str]),
    port: u16,
) -> (String, String) {
    cm_pair_with(name, &[], srv, cli, port)
}

/// As [`cm_pair`], both sides with the configuration `sets` (`--set K=V`).
fn cm_pair_with(
    name: &str,
    sets: &[&str],
    srv: (Option<&str>, &str, &[&str]),
    cli: (Option<&str>, &str, &[&str]),
    port: u16,
) -> (String, String) {
    let dir = scratch(name);
    let mut s = spawn_in(&dir, &format!("{name}-server"), srv.0, srv.1, sets, srv.2);
    wait_listening(port, &mut s);
    let mut c = spawn_in(&dir, &format!("{name}-client"), cli.0, cli.1, sets, cli.2);
    let cst = c.wait(LIMIT);
    let sst = s.wait(LIMIT);
    let (so, co) = (s.output(), c.output());
    assert!(
        cst.success(),
        "{name} client: {cst}\n--- client\n{co}\n--- server\n{so}"
    );
    assert!(
        sst.success(),
        "{name} server: {sst}\n--- server\n{so}\n--- client\n{co}"
    );
    (so, co)
}

fn rping(
    name: &str,
    srv: (Option<&str>, &str),
    cli: (Option<&str>, &str),
    port: u16,
    extra: &[&str],
) {
    require_tool("rping");
    let p = port.to_string();
    let mut s = vec!["rping", "-s", "-a", srv.1, "-p", &p];
    s.extend_from_slice(extra);
    let mut c = vec!["rping", "-c", "-a", srv.1, "-p", &p, "-v", "-C", "1000"];
    c.extend_from_slice(extra);
    let (_, co) = cm_pair(name, (srv.0, srv.1, &s), (cli.0, cli.1, &c), port);
    let pings = co
        .lines()
        .filter(|l| l.starts_with("ping data: rdma-ping-"))
        .count();
    assert_eq!(pings, 1000, "rping client:\n{co}");
    assert!(co.contains("rdma-ping-999: "), "{co}");
}

fn ucmatose(name: &str, srv: (Option<&str>, &str), cli: (Option<&str>, &str), port: u16) {
    require_tool("ucmatose");
    let p = port.to_string();
    let (so, co) = cm_pair(
        name,
        (
            srv.0,
            srv.1,
            &[
                "ucmatose", "-b", srv.1, "-p", &p, "-c", "3", "-C", "20", "-S", "4096",
            ],
        ),
        (
            cli.0,
            cli.1,
            &[
                "ucmatose", "-s", srv.1, "-p", &p, "-c", "3", "-C", "20", "-S", "4096",
            ],
        ),
        port,
    );
    for o in [&so, &co] {
        assert!(
            o.contains("data transfers complete") && o.contains("return status 0"),
            "{o}"
        );
    }
}

/// udaddy (v44) has no port option (`-p` is the port space): it uses 7174, on the
/// test's own address.
fn udaddy(name: &str, srv: (Option<&str>, &str), cli: (Option<&str>, &str)) {
    require_tool("udaddy");
    let (so, co) = cm_pair(
        name,
        (
            srv.0,
            srv.1,
            &["udaddy", "-b", srv.1, "-c", "2", "-C", "10"],
        ),
        (
            cli.0,
            cli.1,
            &["udaddy", "-s", srv.1, "-c", "2", "-C", "10"],
        ),
        7174,
    );
    for o in [&so, &co] {
        assert!(
            o.contains("data transfers complete") && o.contains("return status 0"),
            "{o}"
        );
    }
}

fn perftest_rdma_cm(
    name: &str,
    tool: &str,
    mode: &str,
    srv: (Option<&str>, &str),
    cli: (Option<&str>, &str),
    port: u16,
) {
    require_tool(tool);
    let p = port.to_string();
    let base = [
        tool, "-d", "rdmx0", mode, "-x", "0", "-F", "-n", "200", "-p", &p,
    ];
    let mut c: Vec<&str> = base.to_vec();
    c.push(srv.1);
    let (so, co) = cm_pair(name, (srv.0, srv.1, &base), (cli.0, cli.1, &c), port);
    for o in [&so, &co] {
        assert!(
            o.contains("#bytes") && o.contains("65536"),
            "{tool} {mode}:\n{o}"
        );
    }
}

#[test]
fn rping_loopback() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    skip_unless_platform!();
    let (s, c) = ("127.0.44.1", "127.0.44.2");
    rping("cm-rping", (None, s), (None, c), free_port(s), &[]);
}

/// `rping -q`: the program creates its QP itself and moves it with `rdma_init_qp_attr`;
/// the active side finishes with `rdma_establish` after CONNECT_RESPONSE.
#[test]
fn rping_own_qp_loopback() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    skip_unless_platform!();
    let (s, c) = ("127.0.44.3", "127.0.44.4");
    rping("cm-rping-q", (None, s), (None, c), free_port(s), &["-q"]);
}

#[test]
fn ucmatose_loopback() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    skip_unless_platform!();
    let (s, c) = ("127.0.44.5", "127.0.44.6");
    ucmatose("cm-ucmatose", (None, s), (None, c), free_port(s));
}

#[test]
fn udaddy_loopback() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    skip_unless_platform!();
    let (s, c) = ("127.0.44.7", "127.0.44.8");
    udaddy("cm-udaddy", (None, s), (None, c));
}

/// perftest's `-R` (the test's QPs connected by rdma_cm) and `-z` (the parameter exchange
/// over an rdma_cm connection, the test's QPs moved by perftest).
#[test]
fn perftest_send_and_read_bw_over_rdma_cm() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    skip_unless_platform!();
    let (s, c) = ("127.0.44.9", "127.0.44.10");
    for (name, tool, mode) in [
        ("cm-send-bw", "ib_send_bw", "-R"),
        ("cm-read-bw", "ib_read_bw", "-R"),
        ("cm-write-bw-z", "ib_write_bw", "-z"),
    ] {
        perftest_rdma_cm(name, tool, mode, (None, s), (None, c), free_port(s));
    }
}

/// The synchronous endpoint API (`rdma_getaddrinfo`, `rdma_create_ep`,
/// `rdma_get_request`, ids without a channel).
#[test]
fn rdma_server_and_client_endpoints() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    skip_unless_platform!();
    require_tool("rdma_server");
    let (s, c) = ("127.0.44.11", "127.0.44.12");
    let port = free_port(s);
    let p = port.to_string();
    let (so, co) = cm_pair(
        "cm-endpoints",
        (None, s, &["rdma_server", "-s", s, "-p", &p]),
        (None, c, &["rdma_client", "-s", s, "-p", &p]),
        port,
    );
    assert!(so.contains("rdma_server: end 0"), "{so}");
    assert!(co.contains("rdma_client: end 0"), "{co}");
}

fn cm_events_pair(
    name: &str,
    exe: &Path,
    srv: (Option<&str>, &str),
    cli: (Option<&str>, &str),
    mode: &str,
    expect: &str,
) -> (String, String) {
    let port = free_port_for(srv);
    let p = port.to_string();
    let e = exe.to_str().unwrap();
    cm_pair(
        name,
        (
            srv.0,
            srv.1,
            &[e, "server", srv.1, &p, mode, "server-private-data"],
        ),
        (
            cli.0,
            cli.1,
            &[e, "client", srv.1, &p, "client-private-data", expect],
        ),
        port,
    )
}

/// A free port for a listener at `srv` (in a namespace any port is free: it is new).
fn free_port_for(srv: (Option<&str>, &str)) -> u16 {
    match srv.0 {
        None => free_port(srv.1),
        Some(_) => free_port("127.0.0.1"),
    }
}

#[test]
fn reject_carries_private_data() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    skip_unless_platform!();
    let exe = cm::cm_events_exe("cm_events-build");
    let (so, co) = cm_events_pair(
        "cm-reject",
        &exe,
        (None, "127.0.44.13"),
        (None, "127.0.44.14"),
        "reject",
        "RDMA_CM_EVENT_REJECTED",
    );
    // The REQ's private data reaches the listener (56 bytes: the IB REQ's 92 less the
    // CMA header, zero-padded, as the kernel reports it).
    assert_eq!(
        cm::events(&so),
        ["RDMA_CM_EVENT_CONNECT_REQUEST status=0 len=56 pdata=client-private-data"],
        "{so}"
    );
    // The reject's private data reaches the client with IB CM reason 28 (consumer
    // defined) and the REJ's 148 bytes.
    assert_eq!(
        cm::events(&co),
        [
            "RDMA_CM_EVENT_ADDR_RESOLVED status=0 len=0 pdata=",
            "RDMA_CM_EVENT_ROUTE_RESOLVED status=0 len=0 pdata=",
            "RDMA_CM_EVENT_REJECTED status=28 len=148 pdata=server-private-data",
        ],
        "{co}"
    );
}

#[test]
fn no_listener_is_rejected() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    skip_unless_platform!();
    let exe = cm::cm_events_exe("cm_events-build");
    let dir = scratch("cm-no-listener");
    let port = free_port("127.0.44.15").to_string();
    let mut c = spawn(
        &dir,
        "client",
        "127.0.44.16",
        &[],
        &[
            exe.to_str().unwrap(),
            "client",
            "127.0.44.15",
            &port,
            "x",
            "RDMA_CM_EVENT_REJECTED",
        ],
    );
    let st = c.wait(LIMIT);
    let out = c.output();
    assert!(st.success(), "{out}");
    // IB CM reason 8, invalid service ID: what rxe's peer answers for a port nobody
    // listens on.
    assert!(
        cm::events(&out).contains(&"RDMA_CM_EVENT_REJECTED status=8 len=148 pdata="),
        "{out}"
    );
}

/// Accept with private data both ways; the server disconnects: both sides get
/// DISCONNECTED, the client's `rdma_disconnect` after it succeeds.
#[test]
fn accept_and_disconnect() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    skip_unless_platform!();
    let exe = cm::cm_events_exe("cm_events-build");
    let (so, co) = cm_events_pair(
        "cm-disconnect",
        &exe,
        (None, "127.0.44.17"),
        (None, "127.0.44.18"),
        "accept-disconnect",
        "RDMA_CM_EVENT_ESTABLISHED",
    );
    assert_eq!(
        cm::events(&so),
        [
            "RDMA_CM_EVENT_CONNECT_REQUEST status=0 len=56 pdata=client-private-data",
            "RDMA_CM_EVENT_ESTABLISHED status=0 len=0 pdata=",
            "RDMA_CM_EVENT_DISCONNECTED status=0 len=0 pdata=",
        ],
        "{so}"
    );
    assert_eq!(
        cm::events(&co),
        [
            "RDMA_CM_EVENT_ADDR_RESOLVED status=0 len=0 pdata=",
            "RDMA_CM_EVENT_ROUTE_RESOLVED status=0 len=0 pdata=",
            "RDMA_CM_EVENT_ESTABLISHED status=0 len=196 pdata=server-private-data",
            "RDMA_CM_EVENT_DISCONNECTED status=0 len=0 pdata=",
        ],
        "{co}"
    );
}

/// A connected peer is killed (SIGKILL): the other side gets DISCONNECTED, within a
/// bound (the kernel of the dead process closes its connection at once; 10 s allowed).
fn killed_peer(tag: &str, srv: (Option<&str>, &str), cli: (Option<&str>, &str), kill_server: bool) {
    let exe = cm::cm_events_exe("cm_events-build");
    let e = exe.to_str().unwrap();
    let dir = scratch(&format!("cm-killed-{tag}"));
    let port = free_port_for(srv);
    let p = port.to_string();
    let mut s = spawn_in(
        &dir,
        "server",
        srv.0,
        srv.1,
        &[],
        &[e, "server", srv.1, &p, "accept", "s"],
    );
    wait_listening(port, &mut s);
    let mut c = spawn_in(
        &dir,
        "client",
        cli.0,
        cli.1,
        &[],
        &[e, "client", srv.1, &p, "c", "RDMA_CM_EVENT_ESTABLISHED"],
    );
    c.wait_for_output("CONNECTED", LIMIT);
    s.wait_for_output("RDMA_CM_EVENT_ESTABLISHED", LIMIT);
    let (victim, survivor) = if kill_server {
        (&mut s, &mut c)
    } else {
        (&mut c, &mut s)
    };
    let killed = Instant::now();
    // SAFETY: kill(2) on our own child (exec keeps the program's pid).
    unsafe { libc::kill(victim.child.id() as i32, libc::SIGKILL) };
    let _ = victim.child.wait();
    let st = survivor.wait(Duration::from_secs(30));
    let took = killed.elapsed();
    let out = survivor.output();
    assert!(st.success(), "{tag}: the survivor failed: {st}\n{out}");
    assert_eq!(
        cm::events(&out).last(),
        Some(&"RDMA_CM_EVENT_DISCONNECTED status=0 len=0 pdata="),
        "{out}"
    );
    assert!(took < Duration::from_secs(10), "DISCONNECTED took {took:?}");
}

#[test]
fn killed_client_disconnects_server() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    skip_unless_platform!();
    killed_peer(
        "client",
        (None, "127.0.44.19"),
        (None, "127.0.44.20"),
        false,
    );
}

#[test]
fn killed_server_disconnects_client() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    skip_unless_platform!();
    killed_peer("server", (None, "127.0.44.21"), (None, "127.0.44.22"), true);
}

/// Two processes on one address (as rdma-core's CM tests fork them): with `soft_port=0`
/// each receives on its own free UDP port, and the REQ/REP (SIDR_REQ/SIDR_REP) tell the
/// peer which (`verbs::peer_port`): RC (rping, RDMA READ/WRITE and SEND) and UD
/// (udaddy) traffic reach the right process.
#[test]
fn two_processes_on_one_address() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    skip_unless_platform!();
    require_tool("rping");
    require_tool("udaddy");
    let a = "127.0.44.23";
    let port = free_port(a);
    let p = port.to_string();
    let (_, co) = cm_pair_with(
        "cm-one-address-rping",
        &["soft_port=0"],
        (None, a, &["rping", "-s", "-a", a, "-p", &p]),
        (
            None,
            a,
            &["rping", "-c", "-a", a, "-p", &p, "-v", "-C", "200"],
        ),
        port,
    );
    assert!(co.contains("rdma-ping-199: "), "{co}");
    let (so, co) = cm_pair_with(
        "cm-one-address-udaddy",
        &["soft_port=0"],
        (None, a, &["udaddy", "-b", a, "-c", "2", "-C", "10"]),
        (None, a, &["udaddy", "-s", a, "-c", "2", "-C", "10"]),
        7174,
    );
    for o in [&so, &co] {
        assert!(o.contains("return status 0"), "{o}");
    }
}

/// The provider defines every function librdmacm.so.1 exports (the rsockets family as
/// ENOSYS): none of librdmacm's own runs under `exec`, where it would find no
/// `/dev/infiniband/rdma_cm`, or (its internal calls go through its PLT, to the
/// provider's) mix its private structures with the provider's ids.
#[test]
fn provider_defines_every_librdmacm_function() {
    require_tool("nm");
    let defined = |path: &str| -> std::collections::BTreeSet<String> {
        let out = Command::new("nm")
            .args(["-D", "--defined-only", path])
            .output()
            .unwrap();
        assert!(out.status.success(), "nm {path}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.split_whitespace().nth(1).is_some_and(|t| t == "T"))
            .filter_map(|l| l.split_whitespace().nth(2))
            .map(|s| s.split('@').next().unwrap().to_string())
            .collect()
    };
    let lib = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
    ]
    .iter()
    .map(|d| format!("{d}/librdmacm.so.1"))
    .find(|p| Path::new(p).exists())
    .expect("librdmacm.so.1 (librdmacm1)");
    let provider = rdmx_ibv::launcher::provider_for(Path::new(launcher()).parent().unwrap())
        .expect("the provider next to the launcher");
    let theirs = defined(&lib);
    let ours = defined(provider.to_str().unwrap());
    assert!(theirs.len() > 60, "{theirs:?}");
    let missing: Vec<_> = theirs.difference(&ours).collect();
    assert!(
        missing.is_empty(),
        "not defined by the provider: {missing:?}"
    );
}

/// rsockets answer ENOSYS (rstream's server fails at `rsocket`, not in librdmacm).
#[test]
fn rsockets_answer_enosys() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    skip_unless_platform!();
    require_tool("rstream");
    let dir = scratch("cm-rsockets");
    let a = "127.0.44.24";
    let port = free_port(a).to_string();
    let mut p = spawn(&dir, "rstream", a, &[], &["rstream", "-s", a, "-p", &port]);
    let st = p.wait(LIMIT);
    let out = p.output();
    assert!(!st.success(), "{out}");
    assert!(
        out.contains("rsocket failed: Function not implemented"),
        "{out}"
    );
}

/// fio's `rdma` ioengine (connection setup through librdmacm, in fio's forked job
/// process): a server (rw=read) and a client writing 8 MiB with RDMA WRITE.
#[test]
fn fio_rdma_ioengine() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    skip_unless_platform!();
    require_tool("fio");
    let (s, c) = ("127.0.44.25", "127.0.44.26");
    let port = free_port(s);
    let p = format!("--port={port}");
    let host = format!("--hostname={s}");
    let (_, co) = cm_pair(
        "cm-fio",
        (
            None,
            s,
            &[
                "fio",
                "--name=server",
                "--ioengine=rdma",
                &p,
                "--bs=64k",
                "--size=8m",
                "--rw=read",
                "--iodepth=1",
            ],
        ),
        (
            None,
            c,
            &[
                "fio",
                "--name=client",
                "--ioengine=rdma",
                &host,
                &p,
                "--verb=write",
                "--bs=64k",
                "--size=8m",
                "--rw=write",
                "--iodepth=16",
            ],
        ),
        port,
    );
    assert!(co.contains("io=8192KiB"), "{co}");
}

/// The public librdmacm structures the provider hands out (rdma-sys' bindings) have the
/// installed headers' sizes and offsets (`tests/c/cm_layout.c`, cc -Wall -Wextra -Werror).
#[test]
fn public_layouts_match_the_headers() {
    use rdma_sys::*;
    use std::mem::{offset_of, size_of};
    let exe = build_c("cm_layout", "tests/c/cm_layout.c", "gnu11", &[], &[]);
    let out = Command::new(&exe).output().unwrap();
    let c: std::collections::HashMap<String, usize> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect();
    let rust: &[(&str, usize)] = &[
        ("sizeof rdma_cm_id", size_of::<rdma_cm_id>()),
        ("offsetof rdma_cm_id.verbs", offset_of!(rdma_cm_id, verbs)),
        (
            "offsetof rdma_cm_id.channel",
            offset_of!(rdma_cm_id, channel),
        ),
        (
            "offsetof rdma_cm_id.context",
            offset_of!(rdma_cm_id, context),
        ),
        ("offsetof rdma_cm_id.qp", offset_of!(rdma_cm_id, qp)),
        ("offsetof rdma_cm_id.route", offset_of!(rdma_cm_id, route)),
        ("offsetof rdma_cm_id.ps", offset_of!(rdma_cm_id, ps)),
        (
            "offsetof rdma_cm_id.port_num",
            offset_of!(rdma_cm_id, port_num),
        ),
        ("offsetof rdma_cm_id.event", offset_of!(rdma_cm_id, event)),
        (
            "offsetof rdma_cm_id.send_cq_channel",
            offset_of!(rdma_cm_id, send_cq_channel),
        ),
        (
            "offsetof rdma_cm_id.send_cq",
            offset_of!(rdma_cm_id, send_cq),
        ),
        (
            "offsetof rdma_cm_id.recv_cq_channel",
            offset_of!(rdma_cm_id, recv_cq_channel),
        ),
        (
            "offsetof rdma_cm_id.recv_cq",
            offset_of!(rdma_cm_id, recv_cq),
        ),
        ("offsetof rdma_cm_id.srq", offset_of!(rdma_cm_id, srq)),
        ("offsetof rdma_cm_id.pd", offset_of!(rdma_cm_id, pd)),
        (
            "offsetof rdma_cm_id.qp_type",
            offset_of!(rdma_cm_id, qp_type),
        ),
        ("sizeof rdma_route", size_of::<rdma_route>()),
        (
            "offsetof rdma_route.path_rec",
            offset_of!(rdma_route, path_rec),
        ),
        (
            "offsetof rdma_route.num_paths",
            offset_of!(rdma_route, num_paths),
        ),
        ("sizeof rdma_addr", size_of::<rdma_addr>()),
        (
            "offsetof rdma_addr.dst_addr",
            offset_of!(rdma_addr, dst_addr_union),
        ),
        ("offsetof rdma_addr.addr", offset_of!(rdma_addr, addr)),
        ("sizeof rdma_cm_event", size_of::<rdma_cm_event>()),
        (
            "offsetof rdma_cm_event.listen_id",
            offset_of!(rdma_cm_event, listen_id),
        ),
        (
            "offsetof rdma_cm_event.event",
            offset_of!(rdma_cm_event, event),
        ),
        (
            "offsetof rdma_cm_event.status",
            offset_of!(rdma_cm_event, status),
        ),
        (
            "offsetof rdma_cm_event.param",
            offset_of!(rdma_cm_event, param),
        ),
        ("sizeof rdma_conn_param", size_of::<rdma_conn_param>()),
        (
            "offsetof rdma_conn_param.private_data_len",
            offset_of!(rdma_conn_param, private_data_len),
        ),
        (
            "offsetof rdma_conn_param.responder_resources",
            offset_of!(rdma_conn_param, responder_resources),
        ),
        (
            "offsetof rdma_conn_param.initiator_depth",
            offset_of!(rdma_conn_param, initiator_depth),
        ),
        (
            "offsetof rdma_conn_param.flow_control",
            offset_of!(rdma_conn_param, flow_control),
        ),
        (
            "offsetof rdma_conn_param.retry_count",
            offset_of!(rdma_conn_param, retry_count),
        ),
        (
            "offsetof rdma_conn_param.rnr_retry_count",
            offset_of!(rdma_conn_param, rnr_retry_count),
        ),
        (
            "offsetof rdma_conn_param.srq",
            offset_of!(rdma_conn_param, srq),
        ),
        (
            "offsetof rdma_conn_param.qp_num",
            offset_of!(rdma_conn_param, qp_num),
        ),
        ("sizeof rdma_ud_param", size_of::<rdma_ud_param>()),
        (
            "offsetof rdma_ud_param.private_data_len",
            offset_of!(rdma_ud_param, private_data_len),
        ),
        (
            "offsetof rdma_ud_param.ah_attr",
            offset_of!(rdma_ud_param, ah_attr),
        ),
        (
            "offsetof rdma_ud_param.qp_num",
            offset_of!(rdma_ud_param, qp_num),
        ),
        (
            "offsetof rdma_ud_param.qkey",
            offset_of!(rdma_ud_param, qkey),
        ),
        ("sizeof rdma_addrinfo", size_of::<rdma_addrinfo>()),
        (
            "offsetof rdma_addrinfo.ai_src_addr",
            offset_of!(rdma_addrinfo, ai_src_addr),
        ),
        (
            "offsetof rdma_addrinfo.ai_dst_addr",
            offset_of!(rdma_addrinfo, ai_dst_addr),
        ),
        (
            "offsetof rdma_addrinfo.ai_next",
            offset_of!(rdma_addrinfo, ai_next),
        ),
        ("sizeof rdma_event_channel", size_of::<rdma_event_channel>()),
        ("sizeof ibv_sa_path_rec", size_of::<ibv_sa_path_rec>()),
    ];
    assert_eq!(
        c.len(),
        rust.len(),
        "probe output:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    for (k, v) in rust {
        assert_eq!(c.get(*k), Some(v), "{k}");
    }
}

/// A listener that never answers the REQ (a bare TCP socket of the test on the rdma_cm
/// port): the client's wait is bounded, UNREACHABLE with -ETIMEDOUT after the REQ's 20 s
/// (as the kernel CM's REQ timeout), not a hang.
#[test]
fn silent_listener_is_unreachable() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    skip_unless_platform!();
    let exe = cm::cm_events_exe("cm_events-build");
    let dir = scratch("cm-silent");
    let a = "127.0.44.27";
    let silent = std::net::TcpListener::bind((a, 0)).unwrap();
    let port = silent.local_addr().unwrap().port().to_string();
    let start = Instant::now();
    let mut c = spawn(
        &dir,
        "client",
        "127.0.44.28",
        &[],
        &[
            exe.to_str().unwrap(),
            "client",
            a,
            &port,
            "x",
            "RDMA_CM_EVENT_UNREACHABLE",
        ],
    );
    let st = c.wait(LIMIT);
    let took = start.elapsed();
    let out = c.output();
    drop(silent);
    assert!(st.success(), "{out}");
    assert_eq!(
        cm::events(&out).last(),
        Some(&"RDMA_CM_EVENT_UNREACHABLE status=-110 len=0 pdata="),
        "{out}"
    );
    assert!(
        took >= Duration::from_secs(15) && took < Duration::from_secs(45),
        "{took:?}"
    );
}
