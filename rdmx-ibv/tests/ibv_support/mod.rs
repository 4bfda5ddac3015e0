//! What the rdmx-ibv end-to-end tests share: running programs under `rdmx-ibv exec`
//! (optionally inside a network namespace) with deadlines, server/client pairs, and the
//! platform check.

#![allow(dead_code)]

pub mod cm;
pub mod netns;
#[path = "../../../tests/require/mod.rs"]
pub mod require;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub static SERIAL: Mutex<()> = Mutex::new(());

pub fn launcher() -> &'static str {
    env!("CARGO_BIN_EXE_rdmx-ibv")
}

pub fn scratch(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("ibv_programs")
        .join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Compiles the C program `src` (a path relative to rdmx-ibv's manifest directory) with
/// `cc -std=STD -g -O1 -Wall -Wextra -Werror` plus `flags`, linked with `libs`, into
/// the scratch directory `name` (cleared); returns the executable.
pub fn build_c(name: &str, src: &str, std: &str, flags: &[&str], libs: &[&str]) -> PathBuf {
    require_tool("cc");
    let exe = scratch(name).join(name);
    let cc = Command::new("cc")
        .arg(format!("-std={std}"))
        .args(["-g", "-O1", "-Wall", "-Wextra", "-Werror"])
        .args(flags)
        .arg("-o")
        .arg(&exe)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join(src))
        .args(libs)
        .output()
        .unwrap();
    assert!(
        cc.status.success(),
        "cc {src}: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    exe
}

pub fn require_tool(tool: &str) {
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
pub fn platform_cannot() -> Option<String> {
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

#[macro_export]
macro_rules! skip_unless_platform {
    () => {
        if let Some(why) = $crate::ibv_support::platform_cannot() {
            $crate::ibv_support::require::missing(
                $crate::ibv_support::require::USERNS,
                "running programs under rdmx-ibv exec",
                why,
            );
            return;
        }
    };
}

/// A program under `rdmx-ibv exec --ip ip`, output to files in `dir`.
pub struct Proc {
    pub name: String,
    pub child: Child,
    pub out: PathBuf,
    pub err: PathBuf,
}

pub fn spawn(dir: &Path, name: &str, ip: &str, sets: &[&str], cmd: &[&str]) -> Proc {
    spawn_in(dir, name, None, ip, sets, cmd)
}

/// As [`spawn`], inside network namespace `netns` (`ip netns exec`, which executes
/// without forking: the pid is the program's).
pub fn spawn_in(
    dir: &Path,
    name: &str,
    netns: Option<&str>,
    ip: &str,
    sets: &[&str],
    cmd: &[&str],
) -> Proc {
    spawn_env(dir, name, netns, ip, sets, &[], cmd)
}

/// As [`spawn_in`], with `envs` added to the program's environment.
pub fn spawn_env(
    dir: &Path,
    name: &str,
    netns: Option<&str>,
    ip: &str,
    sets: &[&str],
    envs: &[(&str, &str)],
    cmd: &[&str],
) -> Proc {
    let out = dir.join(format!("{name}.out"));
    let err = dir.join(format!("{name}.err"));
    let mut c = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, launcher()]);
            c
        }
        None => Command::new(launcher()),
    };
    c.args(["exec", "--ip", ip]);
    for s in sets {
        c.args(["--set", s]);
    }
    c.arg("--").args(cmd);
    c.envs(envs.iter().copied());
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
    pub fn output(&self) -> String {
        let mut s = String::new();
        for p in [&self.out, &self.err] {
            if let Ok(mut f) = std::fs::File::open(p) {
                let _ = f.read_to_string(&mut s);
            }
        }
        s
    }

    /// Waits up to `limit`; past it kills the process and fails.
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
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
    pub fn wait_for_output(&mut self, text: &str, limit: Duration) {
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

pub fn run_alone(dir: &Path, name: &str, ip: &str, cmd: &[&str]) -> String {
    let mut p = spawn(dir, name, ip, &[], cmd);
    let st = p.wait(Duration::from_secs(30));
    let out = p.output();
    assert!(st.success(), "{name}: {st}\n{out}");
    out
}

/// Server on `srv_ip`, then client on `cli_ip` (given `srv_ip` as its last argument);
/// both must succeed. Returns (server output, client output).
pub fn pair(
    name: &str,
    srv_ip: &str,
    cli_ip: &str,
    cmd: &[&str],
    limit: Duration,
) -> (String, String) {
    pair_in(name, (None, srv_ip), (None, cli_ip), cmd, limit)
}

/// As [`pair`], each side in its network namespace (or this one).
pub fn pair_in(
    name: &str,
    srv: (Option<&str>, &str),
    cli: (Option<&str>, &str),
    cmd: &[&str],
    limit: Duration,
) -> (String, String) {
    pair_env(name, srv, cli, &[], cmd, limit)
}

/// As [`pair_in`], with `envs` added to both programs' environment.
pub fn pair_env(
    name: &str,
    srv: (Option<&str>, &str),
    cli: (Option<&str>, &str),
    envs: &[(&str, &str)],
    cmd: &[&str],
    limit: Duration,
) -> (String, String) {
    let dir = scratch(name);
    let mut s = spawn_env(
        &dir,
        &format!("{name}-server"),
        srv.0,
        srv.1,
        &[],
        envs,
        cmd,
    );
    // perftest and ibv_rc_pingpong clients do not retry their TCP connect: wait until the
    // server listens.
    wait_listening(port_of(cmd), &mut s);
    let mut cli_cmd: Vec<&str> = cmd.to_vec();
    cli_cmd.push(srv.1);
    let mut c = spawn_env(
        &dir,
        &format!("{name}-client"),
        cli.0,
        cli.1,
        &[],
        envs,
        &cli_cmd,
    );
    let cst = c.wait(limit);
    let sst = s.wait(limit);
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

pub fn port_of(cmd: &[&str]) -> u16 {
    let i = cmd
        .iter()
        .position(|a| *a == "-p")
        .expect("tests pass -p PORT");
    cmd[i + 1].parse().unwrap()
}

/// Waits (bounded) until something listens on TCP `port` (reading /proc/net/tcp: no
/// probe connection, which a one-shot server would take for its client).
pub fn wait_listening(port: u16, srv: &mut Proc) {
    let needle = format!(":{port:04X} 00000000:0000 0A");
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        // The server's own network namespace (/proc/PID/net).
        let pid = srv.child.id();
        let tcp = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default()
            + &std::fs::read_to_string(format!("/proc/{pid}/net/tcp6")).unwrap_or_default();
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
