//! Unmodified libibverbs programs on the device `rdmx0`, through `rdmx-ibv exec`:
//! `ibv_devices`, `ibv_devinfo -v`, `ibv_rc_pingpong` (with and without completion
//! events), perftest's `ib_send_bw`, `ib_write_bw`, `ib_read_bw`, `ib_send_lat`,
//! `ib_read_lat`, and a perftest server killed mid-run (the client gets an error
//! completion and exits). Server and client are two processes, each with its own
//! loopback address (127.0.0.x: its own UDP 4791 and GID).
//!
//! Every process runs under a deadline and is killed past it (the test then fails).
//! Tests run one at a time (a lock): the machine is shared and timing matters to RC.
//! The programs come from Debian's ibverbs-utils and perftest (scripts/install-deps.sh);
//! their absence fails the tests. The tests are skipped, saying so, only when the
//! launcher cannot make a mount namespace at all (neither root nor user namespaces).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static SERIAL: Mutex<()> = Mutex::new(());

fn launcher() -> &'static str {
    env!("CARGO_BIN_EXE_rdmx-ibv")
}

fn scratch(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("ibv_programs")
        .join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn require_tool(tool: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "{tool} is not installed (Debian packages ibverbs-utils and perftest: run \
         scripts/install-deps.sh)"
    );
}

/// None when namespaces work; Some(reason) when the platform cannot run the launcher.
fn platform_cannot() -> Option<String> {
    let out = Command::new(launcher())
        .args(["exec", "--ip", "127.0.0.1", "--", "true"])
        .output()
        .expect("running rdmx-ibv");
    if out.status.success() {
        return None;
    }
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        err.contains("cannot make a private mount namespace"),
        "rdmx-ibv exec -- true failed for another reason: {err}"
    );
    Some(err)
}

macro_rules! skip_unless_platform {
    () => {
        if let Some(why) = platform_cannot() {
            eprintln!("SKIPPED (the platform cannot run rdmx-ibv exec): {why}");
            return;
        }
    };
}

/// A program under `rdmx-ibv exec --ip ip`, output to files in `dir`.
struct Proc {
    name: String,
    child: Child,
    out: PathBuf,
    err: PathBuf,
}

fn spawn(dir: &Path, name: &str, ip: &str, sets: &[&str], cmd: &[&str]) -> Proc {
    let out = dir.join(format!("{name}.out"));
    let err = dir.join(format!("{name}.err"));
    let mut c = Command::new(launcher());
    c.args(["exec", "--ip", ip]);
    for s in sets {
        c.args(["--set", s]);
    }
    c.arg("--").args(cmd);
    c.stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap());
    let child = c.spawn().expect("spawning rdmx-ibv exec");
    Proc {
        name: name.into(),
        child,
        out,
        err,
    }
}

impl Proc {
    fn output(&self) -> String {
        let mut s = String::new();
        for p in [&self.out, &self.err] {
            if let Ok(mut f) = std::fs::File::open(p) {
                let _ = f.read_to_string(&mut s);
            }
        }
        s
    }

    /// Waits up to `limit`; past it kills the process and fails.
    fn wait(&mut self, limit: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "{} did not finish within {limit:?}; output:\n{}",
                    self.name,
                    self.output()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the output contains `text` (bounded).
    fn wait_for_output(&mut self, text: &str, limit: Duration) {
        let start = Instant::now();
        while start.elapsed() < limit {
            if self.output().contains(text) {
                return;
            }
            if let Some(st) = self.child.try_wait().unwrap() {
                panic!(
                    "{} exited ({st}) before printing {text:?}:\n{}",
                    self.name,
                    self.output()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        panic!(
            "{} did not print {text:?} within {limit:?}:\n{}",
            self.name,
            self.output()
        );
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn run_alone(dir: &Path, name: &str, ip: &str, cmd: &[&str]) -> String {
    let mut p = spawn(dir, name, ip, &[], cmd);
    let st = p.wait(Duration::from_secs(30));
    let out = p.output();
    assert!(st.success(), "{name}: {st}\n{out}");
    out
}

/// Server on `srv_ip`, then client on `cli_ip` (given `srv_ip` as its last argument);
/// both must succeed. Returns (server output, client output).
fn pair(name: &str, srv_ip: &str, cli_ip: &str, cmd: &[&str], limit: Duration) -> (String, String) {
    let dir = scratch(name);
    let mut srv = spawn(&dir, &format!("{name}-server"), srv_ip, &[], cmd);
    // The server listens for the TCP exchange once it has set up its device; give it a
    // moment, the client retries its connect for a while anyway? (perftest does not,
    // ibv_rc_pingpong does not): wait until the server's TCP port is open.
    let port = port_of(cmd);
    wait_listening(port, &mut srv);
    let mut cli_cmd: Vec<&str> = cmd.to_vec();
    cli_cmd.push(srv_ip);
    let mut cli = spawn(&dir, &format!("{name}-client"), cli_ip, &[], &cli_cmd);
    let cst = cli.wait(limit);
    let sst = srv.wait(limit);
    let (so, co) = (srv.output(), cli.output());
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

fn port_of(cmd: &[&str]) -> u16 {
    let i = cmd
        .iter()
        .position(|a| *a == "-p")
        .expect("tests pass -p PORT");
    cmd[i + 1].parse().unwrap()
}

/// Waits (bounded) until something listens on TCP `port` (reading /proc/net/tcp: no
/// probe connection, which a one-shot server would take for its client).
fn wait_listening(port: u16, srv: &mut Proc) {
    let needle = format!(":{port:04X} 00000000:0000 0A");
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default()
            + &std::fs::read_to_string("/proc/net/tcp6").unwrap_or_default();
        if tcp.lines().any(|l| l.contains(&needle)) {
            return;
        }
        if let Some(st) = srv.child.try_wait().unwrap() {
            panic!(
                "{} exited ({st}) before listening:\n{}",
                srv.name,
                srv.output()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!(
        "{} did not listen on TCP {port} within 20 s:\n{}",
        srv.name,
        srv.output()
    );
}

#[test]
fn ibv_devices_and_devinfo_show_rdmx0() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require_tool("ibv_devinfo");
    skip_unless_platform!();
    let dir = scratch("devinfo");
    let out = run_alone(&dir, "ibv_devices", "127.0.0.2", &["ibv_devices"]);
    assert!(out.contains("rdmx0"), "{out}");
    assert!(
        out.contains("027278007f000002"),
        "node GUID from the address: {out}"
    );

    let out = run_alone(&dir, "ibv_devinfo", "127.0.0.2", &["ibv_devinfo", "-v"]);
    for want in [
        "hca_id:\trdmx0",
        "PORT_ACTIVE",
        "link_layer:\t\tEthernet",
        "GID[  0]:\t\t::ffff:127.0.0.2, RoCE v2",
    ] {
        assert!(out.contains(want), "ibv_devinfo -v lacks {want:?}:\n{out}");
    }
}

#[test]
fn launcher_help_and_errors() {
    let out = Command::new(launcher())
        .args(["exec", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("rdmx-ibv exec --ip ADDR [--set KEY=VALUE]... [--profile NAME] -- CMD"));
    let out = Command::new(launcher())
        .args(["exec", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--ip ADDR is required"));
    // A configuration error is reported before anything runs.
    let out = Command::new(launcher())
        .args([
            "exec",
            "--ip",
            "127.0.0.2",
            "--set",
            "no_such_key=1",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("rdmx configuration"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn host_dev_is_untouched() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    skip_unless_platform!();
    let before: Vec<_> = std::fs::read_dir("/dev")
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let dir = scratch("hostdev");
    let out = run_alone(
        &dir,
        "ls",
        "127.0.0.2",
        &[
            "sh",
            "-c",
            "ls -l /dev/infiniband/uverbs0 /dev/rdmx-ibv/ && echo $LD_PRELOAD $RDMX_SOFT_ADDR",
        ],
    );
    assert!(out.contains("librdmx-rdmav34.so"), "{out}");
    assert!(out.contains("127.0.0.2"), "{out}");
    assert!(!Path::new("/dev/rdmx-ibv").exists());
    let after: Vec<_> = std::fs::read_dir("/dev")
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(before.len(), after.len(), "the host's /dev changed");
}

/// The unprivileged path: a user namespace (run as `nobody` when the tests run as root).
#[test]
fn unprivileged_user_namespace() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require_tool("ibv_devinfo");
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        // The other tests already run unprivileged.
        skip_unless_platform!();
        return;
    }
    require_tool("setpriv");
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            launcher(),
        ])
        .args([
            "exec",
            "--ip",
            "127.0.0.2",
            "--",
            "sh",
            "-c",
            "id -u; ibv_devinfo",
        ])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && text.contains("cannot make a private mount namespace") {
        eprintln!("SKIPPED (no unprivileged user namespaces here): {text}");
        return;
    }
    assert!(out.status.success(), "{text}");
    assert!(text.starts_with("65534\n"), "CMD keeps its uid: {text}");
    assert!(text.contains("PORT_ACTIVE"), "{text}");
}

#[test]
fn ibv_rc_pingpong() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require_tool("ibv_rc_pingpong");
    skip_unless_platform!();
    let (_, c) = pair(
        "rc_pingpong",
        "127.0.0.2",
        "127.0.0.3",
        &[
            "ibv_rc_pingpong",
            "-d",
            "rdmx0",
            "-g",
            "0",
            "-p",
            "18611",
            "-n",
            "200",
        ],
        Duration::from_secs(60),
    );
    assert!(c.contains("200 iters in"), "{c}");
}

#[test]
fn ibv_rc_pingpong_events() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require_tool("ibv_rc_pingpong");
    skip_unless_platform!();
    let (_, c) = pair(
        "rc_pingpong_e",
        "127.0.0.4",
        "127.0.0.5",
        &[
            "ibv_rc_pingpong",
            "-d",
            "rdmx0",
            "-g",
            "0",
            "-p",
            "18612",
            "-n",
            "200",
            "-e",
        ],
        Duration::from_secs(60),
    );
    assert!(c.contains("200 iters in"), "{c}");
}

fn perftest(tool: &str, port: &str, extra: &[&str], srv: &str, cli: &str) -> String {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require_tool(tool);
    if let Some(why) = platform_cannot() {
        eprintln!("SKIPPED (the platform cannot run rdmx-ibv exec): {why}");
        return String::new();
    }
    let mut cmd = vec![tool, "-d", "rdmx0", "-x", "0", "-F", "-p", port];
    cmd.extend_from_slice(extra);
    let (_, c) = pair(tool, srv, cli, &cmd, Duration::from_secs(90));
    c
}

fn assert_results(tool: &str, out: &str) {
    if out.is_empty() {
        return; // skipped
    }
    assert!(out.contains("#bytes"), "{tool}: no result table:\n{out}");
}

#[test]
fn perftest_send_bw() {
    let o = perftest(
        "ib_send_bw",
        "18621",
        &["-n", "200", "-s", "65536"],
        "127.0.0.6",
        "127.0.0.7",
    );
    assert_results("ib_send_bw", &o);
}

#[test]
fn perftest_write_bw() {
    let o = perftest(
        "ib_write_bw",
        "18622",
        &["-n", "200", "-s", "65536"],
        "127.0.0.8",
        "127.0.0.9",
    );
    assert_results("ib_write_bw", &o);
}

#[test]
fn perftest_read_bw() {
    let o = perftest(
        "ib_read_bw",
        "18623",
        &["-n", "200", "-s", "65536"],
        "127.0.0.10",
        "127.0.0.11",
    );
    assert_results("ib_read_bw", &o);
}

#[test]
fn perftest_send_lat() {
    let o = perftest(
        "ib_send_lat",
        "18624",
        &["-n", "200"],
        "127.0.0.12",
        "127.0.0.13",
    );
    assert_results("ib_send_lat", &o);
}

#[test]
fn perftest_read_lat() {
    let o = perftest(
        "ib_read_lat",
        "18625",
        &["-n", "200"],
        "127.0.0.14",
        "127.0.0.15",
    );
    assert_results("ib_read_lat", &o);
}

/// The server dies mid-run: the client's WRITEs go unanswered, retry_cnt runs out, the
/// client gets an error completion (IBV_WC_RETRY_EXC_ERR = 12) and exits (no hang).
#[test]
fn perftest_server_killed_midrun() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require_tool("ib_write_bw");
    skip_unless_platform!();
    let dir = scratch("killed");
    let cmd = [
        "ib_write_bw",
        "-d",
        "rdmx0",
        "-x",
        "0",
        "-F",
        "-p",
        "18626",
        "-D",
        "20",
        "-s",
        "4096",
    ];
    let mut srv = spawn(&dir, "server", "127.0.0.16", &[], &cmd);
    wait_listening(18626, &mut srv);
    // Line-buffered output (stdbuf, coreutils): the result header marks the start of the
    // measured WRITEs.
    let mut cli_cmd = vec!["stdbuf", "-oL"];
    cli_cmd.extend_from_slice(&cmd);
    cli_cmd.push("127.0.0.16");
    let mut cli = spawn(&dir, "client", "127.0.0.17", &[], &cli_cmd);
    cli.wait_for_output("#bytes", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(500));
    let killed_at = Instant::now();
    srv.child.kill().unwrap();
    let _ = srv.child.wait();
    // perftest's QPs: timeout 14 (67 ms), retry_cnt 7: about 0.5 s of retries.
    let st = cli.wait(Duration::from_secs(15));
    let out = cli.output();
    assert!(!st.success(), "the client must fail: {st}\n{out}");
    assert!(
        out.contains("status 12") || out.contains("RETRY_EXC") || out.contains("retry"),
        "no retry-exceeded error completion reported:\n{out}"
    );
    eprintln!(
        "client exited {:?} after the kill: {st}",
        killed_at.elapsed()
    );
}
