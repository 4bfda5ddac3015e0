//! The connection manager across two network namespaces joined by a veth pair (each
//! side under `rdmx-ibv exec` with its namespace's address): rping, ucmatose, udaddy,
//! `ib_send_bw -R`, a killed peer (DISCONNECTED on the survivor, bounded), and a
//! connect to an address nobody has (UNREACHABLE, bounded). The namespaces and the veth
//! are named after this test and its pid, and removed at the end.
//!
//! Needs root (skipped, saying so, otherwise) and `ip` (iproute2).

mod ibv_support;

use ibv_support::*;
use std::time::{Duration, Instant};

/// Namespaces a (10.232.1.1) and b (10.232.1.2) joined by a veth.
fn veth_pair() -> netns::VethPair {
    netns::VethPair::new("cm", "cm", "10.232.1", None).expect("namespaces and veth (root)")
}

const IP_A: &str = "10.232.1.1";
const IP_B: &str = "10.232.1.2";
/// In the subnet, held by nobody.
const IP_NOBODY: &str = "10.232.1.3";

const LIMIT: Duration = Duration::from_secs(90);

fn cm_pair(
    name: &str,
    p: &netns::VethPair,
    srv: &[&str],
    cli: &[&str],
    port: u16,
) -> (String, String) {
    let dir = scratch(name);
    let mut s = spawn_in(&dir, &format!("{name}-server"), Some(&p.a), IP_A, &[], srv);
    wait_listening(port, &mut s);
    let mut c = spawn_in(&dir, &format!("{name}-client"), Some(&p.b), IP_B, &[], cli);
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

#[test]
fn cm_programs_across_a_veth() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        require::missing(
            require::NETNS,
            "the connection manager across a veth",
            "network namespaces and a veth pair need root",
        );
        return;
    }
    require_tool("ip");
    skip_unless_platform!();
    for t in ["rping", "ucmatose", "udaddy", "ib_send_bw"] {
        require_tool(t);
    }
    let exe = cm::cm_events_exe("cm_events-veth-build");
    let e = exe.to_str().unwrap();
    let p = veth_pair();

    let (_, co) = cm_pair(
        "cm-veth-rping",
        &p,
        &["rping", "-s", "-a", IP_A, "-p", "7174"],
        &["rping", "-c", "-a", IP_A, "-p", "7174", "-v", "-C", "1000"],
        7174,
    );
    assert_eq!(
        co.lines()
            .filter(|l| l.starts_with("ping data: rdma-ping-"))
            .count(),
        1000,
        "{co}"
    );

    let (so, co) = cm_pair(
        "cm-veth-ucmatose",
        &p,
        &[
            "ucmatose", "-b", IP_A, "-p", "7471", "-c", "2", "-C", "20", "-S", "4096",
        ],
        &[
            "ucmatose", "-s", IP_A, "-p", "7471", "-c", "2", "-C", "20", "-S", "4096",
        ],
        7471,
    );
    for o in [&so, &co] {
        assert!(o.contains("return status 0"), "{o}");
    }

    let (so, co) = cm_pair(
        "cm-veth-udaddy",
        &p,
        &["udaddy", "-b", IP_A, "-c", "2", "-C", "10"],
        &["udaddy", "-s", IP_A, "-c", "2", "-C", "10"],
        7174,
    );
    for o in [&so, &co] {
        assert!(o.contains("return status 0"), "{o}");
    }

    let srv = [
        "ib_send_bw",
        "-d",
        "rdmx0",
        "-R",
        "-x",
        "0",
        "-F",
        "-n",
        "200",
        "-p",
        "18515",
    ];
    let mut cli = srv.to_vec();
    cli.push(IP_A);
    let (_, co) = cm_pair("cm-veth-send-bw", &p, &srv, &cli, 18515);
    assert!(co.contains("#bytes"), "{co}");

    // A killed client: the server's DISCONNECTED, bounded.
    let dir = scratch("cm-veth-killed");
    let mut s = spawn_in(
        &dir,
        "server",
        Some(&p.a),
        IP_A,
        &[],
        &[e, "server", IP_A, "20002", "accept", "s"],
    );
    wait_listening(20002, &mut s);
    let mut c = spawn_in(
        &dir,
        "client",
        Some(&p.b),
        IP_B,
        &[],
        &[e, "client", IP_A, "20002", "c", "RDMA_CM_EVENT_ESTABLISHED"],
    );
    c.wait_for_output("CONNECTED", LIMIT);
    s.wait_for_output("RDMA_CM_EVENT_ESTABLISHED", LIMIT);
    let killed = Instant::now();
    // SAFETY: kill(2) on our own child (ip netns exec and exec keep the program's pid).
    unsafe { libc::kill(c.child.id() as i32, libc::SIGKILL) };
    let _ = c.child.wait();
    let st = s.wait(Duration::from_secs(30));
    let so = s.output();
    assert!(st.success(), "{so}");
    assert_eq!(
        cm::events(&so).last(),
        Some(&"RDMA_CM_EVENT_DISCONNECTED status=0 len=0 pdata="),
        "{so}"
    );
    assert!(
        killed.elapsed() < Duration::from_secs(10),
        "{:?}",
        killed.elapsed()
    );

    // Nobody has the address: UNREACHABLE (no neighbour answers), within the bounded
    // connect wait.
    let mut c = spawn_in(
        &dir,
        "nobody",
        Some(&p.b),
        IP_B,
        &[],
        &[
            e,
            "client",
            IP_NOBODY,
            "20003",
            "c",
            "RDMA_CM_EVENT_UNREACHABLE",
        ],
    );
    let st = c.wait(Duration::from_secs(40));
    let co = c.output();
    assert!(st.success(), "{co}");
    let last = cm::events(&co).last().copied().unwrap_or_default();
    assert!(
        last.starts_with("RDMA_CM_EVENT_UNREACHABLE status=-"),
        "{co}"
    );
}
