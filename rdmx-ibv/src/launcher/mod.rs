//! `rdmx-ibv exec --ip ADDR [--set KEY=VALUE]... [--profile NAME] -- CMD [ARGS...]`:
//! runs CMD so that libibverbs finds the device `rdmx0` of this crate's provider, on the
//! soft transport at ADDR.
//!
//! 1. Checks the installed libibverbs exports the private ABI the provider is built for
//!    (`verbs_register_driver_34@IBVERBS_PRIVATE_34`) and the rdmx configuration CMD will
//!    see (`RDMX_SOFT_ADDR`, `--set`, `--profile`, `RDMX_*` already in the environment).
//! 2. Enters a private mount namespace ([`ns`]): as root `unshare(CLONE_NEWNS)`, otherwise
//!    a user namespace mapping the caller's own uid and gid (like `unshare -Urm`, without
//!    becoming root inside), mounts are made slaves of the host's, and `/dev` is replaced
//!    by a tmpfs rebuilt from bind mounts of the host's `/dev` entries, plus
//!    `/dev/infiniband/uverbs0` (a bind of `/dev/full`) and the runtime directory
//!    `/dev/rdmx-ibv` ([`sysfs`]: the fake sysfs tree, the provider link). The host's
//!    `/dev` and `/etc` are not modified; the runtime directory disappears with the
//!    namespace.
//! 3. Sets `SYSFS_PATH`, `RDMAV_DRIVERS`, `LD_PRELOAD` and the `RDMX_*` variables and
//!    executes CMD (the process keeps its pid).

pub mod env;
pub mod ns;
pub mod sysfs;

use std::ffi::{CString, OsString};
use std::net::IpAddr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Where the runtime directory appears inside the namespace.
pub const RUNTIME_DIR: &str = "/dev/rdmx-ibv";
/// The ibdev name of the device.
pub const IBDEV: &str = "rdmx0";
/// The provider file name as cargo builds it.
pub const PROVIDER_FILE: &str = "librdmx_ibv.so";

pub const USAGE: &str = "\
usage: rdmx-ibv exec --ip ADDR [--set KEY=VALUE]... [--profile NAME] -- CMD [ARGS...]

Runs CMD (an unmodified libibverbs program: ibv_devinfo, ibv_rc_pingpong, perftest,
a Ceph daemon) with the verbs device rdmx0: rdmx's soft RoCEv2 RC transport over UDP
port 4791 on ADDR, as a libibverbs provider.

  --ip ADDR          the address the device receives on (UDP 4791) and whose RoCEv2
                     GID is GID index 0 (IPv4-mapped ::ffff:a.b.c.d for IPv4). Each
                     process needs its own address (127.0.0.2, 127.0.0.3, ... or an
                     address of a network namespace).
  --set KEY=VALUE    an rdmx configuration value for CMD (passed as RDMX_<KEY>=VALUE;
                     e.g. --set qp_override=timeout,retry_cnt --set retry_cnt=3).
                     Repeatable. Checked before CMD runs.
  --profile NAME     an rdmx configuration profile (RDMX_PROFILE).
  -h, --help         this text.

What it does: checks that the installed libibverbs has the private provider ABI the
provider is built for (IBVERBS_PRIVATE_34); enters a private mount namespace (as root, or
unprivileged through a user namespace); there, replaces /dev by a tmpfs rebuilt from bind
mounts of the host's /dev plus /dev/infiniband/uverbs0 (a bind of /dev/full) and
/dev/rdmx-ibv (a fake sysfs tree describing rdmx0, and the provider as
librdmx-rdmav34.so); sets SYSFS_PATH, RDMAV_DRIVERS, LD_PRELOAD (the provider also
supplies ibv_create_comp_channel and librdmacm's functions: rping, ucmatose, perftest -R
and other RDMA connection manager programs run) and RDMX_SOFT_ADDR; and executes CMD.
The host's /dev and /etc are not modified. Without root and without user namespaces it
stops with an error.

Not covered: librdmacm's rsockets (rsocket, rsend, ...), setuid programs (they ignore
SYSFS_PATH and LD_PRELOAD), hosts whose kernel has RDMA netlink (libibverbs then does
not read SYSFS_PATH).
";

/// What `exec` was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecArgs {
    pub ip: IpAddr,
    pub sets: Vec<(String, String)>,
    pub profile: Option<String>,
    pub cmd: Vec<OsString>,
}

/// The outcome of parsing the command line.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    Help,
    Exec(ExecArgs),
}

/// Parses `rdmx-ibv`'s arguments (without the program name).
pub fn parse_args(args: &[OsString]) -> Result<Parsed, String> {
    let mut it = args.iter();
    match it
        .next()
        .map(|a| a.to_string_lossy().into_owned())
        .as_deref()
    {
        None => return Err("missing command (exec)".into()),
        Some("-h" | "--help" | "help") => return Ok(Parsed::Help),
        Some("exec") => {}
        Some(other) => return Err(format!("unknown command {other:?} (expected exec)")),
    }
    let mut ip: Option<IpAddr> = None;
    let mut sets = Vec::new();
    let mut profile = None;
    let rest: Vec<&OsString> = it.collect();
    let mut i = 0;
    let value = |i: &mut usize, name: &str, inline: Option<&str>| -> Result<String, String> {
        if let Some(v) = inline {
            return Ok(v.to_string());
        }
        *i += 1;
        rest.get(*i)
            .map(|v| v.to_string_lossy().into_owned())
            .ok_or_else(|| format!("{name} needs a value"))
    };
    while i < rest.len() {
        let a = rest[i].to_string_lossy().into_owned();
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v)),
            _ => (a.clone(), None),
        };
        match name.as_str() {
            "-h" | "--help" => return Ok(Parsed::Help),
            "--" => {
                let cmd: Vec<OsString> = rest[i + 1..].iter().map(|s| (*s).clone()).collect();
                if cmd.is_empty() {
                    return Err("missing CMD after --".into());
                }
                let Some(ip) = ip else {
                    return Err("--ip ADDR is required".into());
                };
                return Ok(Parsed::Exec(ExecArgs {
                    ip,
                    sets,
                    profile,
                    cmd,
                }));
            }
            "--ip" => {
                let v = value(&mut i, "--ip", inline)?;
                let parsed: IpAddr = v
                    .parse()
                    .map_err(|_| format!("--ip {v:?}: not an IPv4 or IPv6 address"))?;
                if parsed.is_unspecified() || parsed.is_multicast() {
                    return Err(format!("--ip {v}: needs a unicast address of this host"));
                }
                ip = Some(parsed);
            }
            "--set" => {
                let v = value(&mut i, "--set", inline)?;
                let Some((k, val)) = v.split_once('=') else {
                    return Err(format!("--set {v:?}: expected KEY=VALUE"));
                };
                if k.is_empty() {
                    return Err(format!("--set {v:?}: empty KEY"));
                }
                sets.push((k.to_string(), val.to_string()));
            }
            "--profile" => profile = Some(value(&mut i, "--profile", inline)?),
            _ => {
                return Err(format!(
                    "unknown option {a:?} (see --help; CMD goes after --)"
                ));
            }
        }
        i += 1;
    }
    Err("missing -- CMD [ARGS...]".into())
}

/// The `RDMX_*` variables `exec` gives CMD (on top of the environment's).
pub fn rdmx_vars(args: &ExecArgs) -> Vec<(String, String)> {
    use rdmx::config::env::var_name;
    let mut v = vec![(var_name("soft_addr"), args.ip.to_string())];
    if let Some(p) = &args.profile {
        v.push((var_name("profile"), p.clone()));
    }
    for (k, val) in &args.sets {
        v.push((var_name(k), val.clone()));
    }
    v
}

/// Checks the configuration CMD will see: the environment's `RDMX_*` overridden by
/// `exec`'s. Returns the foreign `RDMX_` variables of the environment ([`env`]: the
/// user's own, not a key nor a typo of one), which are left out of the check and passed
/// to CMD untouched.
pub fn check_config(vars: &[(String, String)]) -> Result<Vec<String>, String> {
    check_config_in(std::env::vars_os(), vars)
}

/// [`check_config`] over the environment `environ`.
pub fn check_config_in(
    environ: impl IntoIterator<Item = (OsString, OsString)>,
    vars: &[(String, String)],
) -> Result<Vec<String>, String> {
    let (ours, foreign) = env::split(environ).map_err(|e| format!("rdmx configuration: {e}"))?;
    let mut all: Vec<(String, String)> = ours
        .into_iter()
        .filter(|(k, _)| !vars.iter().any(|(n, _)| n == k))
        .collect();
    all.extend(vars.iter().cloned());
    rdmx::config::Config::from_env_vars(all)
        .and_then(|c| c.settings())
        .map(|_| foreign)
        .map_err(|e| format!("rdmx configuration: {e}"))
}

/// The provider library: next to the executable (cargo's target directory), or in
/// `../lib/rdmx-ibv/` or `../lib/` of it (an install).
pub fn find_provider() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own executable: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    provider_for(dir).ok_or_else(|| {
        format!(
            "the provider {PROVIDER_FILE} is not next to {} (build it: cargo build -p rdmx-ibv)",
            exe.display()
        )
    })
}

/// The provider for a launcher in `dir` (see [`find_provider`]), canonical; None if there
/// is none.
pub fn provider_for(dir: &Path) -> Option<PathBuf> {
    // In cargo's target directory, `cargo test -p rdmx-ibv` rebuilds deps/librdmx_ibv.so
    // but leaves the copy next to the binary as the last `cargo build` made it: the newer
    // of the two is the provider of this build.
    let next_to = dir.join(PROVIDER_FILE);
    let in_deps = dir.join("deps").join(PROVIDER_FILE);
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let first = match (mtime(&next_to), mtime(&in_deps)) {
        (Some(a), Some(b)) if b > a => in_deps,
        _ => next_to,
    };
    [
        first,
        dir.join("../lib/rdmx-ibv").join(PROVIDER_FILE),
        dir.join("../lib").join(PROVIDER_FILE),
        // Tests and examples live one level down in cargo's target directory.
        dir.join("..").join(PROVIDER_FILE),
    ]
    .into_iter()
    .find(|c| c.is_file())
    .and_then(|c| c.canonicalize().ok())
}

/// Runs `exec`: prepares everything and executes CMD; returns only on failure.
pub fn exec(args: &ExecArgs) -> String {
    if let Err(e) = crate::abi::private_abi_available() {
        return e;
    }
    let vars = rdmx_vars(args);
    match check_config(&vars) {
        Ok(foreign) => {
            for name in foreign {
                eprintln!(
                    "rdmx-ibv: {name} is not an rdmx configuration variable (nor close to one): passed to CMD, not applied"
                );
            }
        }
        Err(e) => return e,
    }
    let provider = match find_provider() {
        Ok(p) => p,
        Err(e) => return e,
    };
    if let Err(e) = ns::enter(args.ip, &provider) {
        return e;
    }
    let runtime = Path::new(RUNTIME_DIR);
    let link = runtime.join(format!("librdmx{}", crate::abi::PROVIDER_SUFFIX));
    // SAFETY (of the environment changes below): single-threaded here (the launcher
    // starts no threads), and execvp follows at once.
    let mut env: Vec<(OsString, OsString)> = vec![
        ("SYSFS_PATH".into(), runtime.join("sys").into_os_string()),
        (
            "RDMAV_DRIVERS".into(),
            runtime.join("librdmx").into_os_string(),
        ),
    ];
    let mut preload = link.clone().into_os_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    env.push(("LD_PRELOAD".into(), preload));
    for (k, v) in vars {
        env.push((k.into(), v.into()));
    }
    for (k, v) in &env {
        // SAFETY: see above: no other thread exists to read the environment.
        unsafe { std::env::set_var(k, v) };
    }
    exec_cmd(&args.cmd)
}

fn exec_cmd(cmd: &[OsString]) -> String {
    let cstrs: Result<Vec<CString>, _> = cmd.iter().map(|a| CString::new(a.as_bytes())).collect();
    let Ok(cstrs) = cstrs else {
        return "CMD contains a NUL byte".into();
    };
    let mut argv: Vec<*const libc::c_char> = cstrs.iter().map(|c| c.as_ptr()).collect();
    argv.push(std::ptr::null());
    // SAFETY: argv is a NULL-terminated array of NUL-terminated strings that outlive the
    // call; execvp returns only on failure.
    unsafe { libc::execvp(argv[0], argv.as_ptr()) };
    let e = std::io::Error::last_os_error();
    format!("cannot execute {}: {e}", cmd[0].to_string_lossy())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn parses_the_command_line() {
        let p = parse_args(&os(&[
            "exec",
            "--ip",
            "127.0.0.2",
            "--set",
            "retry_cnt=3",
            "--set=timeout=10",
            "--profile",
            "ceph",
            "--",
            "ib_send_bw",
            "-x",
            "0",
        ]))
        .unwrap();
        let Parsed::Exec(a) = p else { panic!("{p:?}") };
        assert_eq!(a.ip, "127.0.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(
            a.sets,
            vec![
                ("retry_cnt".into(), "3".into()),
                ("timeout".into(), "10".into())
            ]
        );
        assert_eq!(a.profile.as_deref(), Some("ceph"));
        assert_eq!(a.cmd, os(&["ib_send_bw", "-x", "0"]));
        let vars = rdmx_vars(&a);
        assert!(vars.contains(&("RDMX_SOFT_ADDR".into(), "127.0.0.2".into())));
        assert!(vars.contains(&("RDMX_RETRY_CNT".into(), "3".into())));
        assert!(vars.contains(&("RDMX_PROFILE".into(), "ceph".into())));
    }

    #[test]
    fn refuses_bad_command_lines() {
        for bad in [
            &["exec", "--", "true"][..],
            &["exec", "--ip", "127.0.0.2"],
            &["exec", "--ip", "nope", "--", "true"],
            &["exec", "--ip", "0.0.0.0", "--", "true"],
            &[
                "exec",
                "--ip",
                "127.0.0.2",
                "--set",
                "novalue",
                "--",
                "true",
            ],
            &["exec", "--ip", "127.0.0.2", "--bogus", "--", "true"],
            &["exec", "--ip", "127.0.0.2", "--"],
            &["run"],
            &[],
        ] {
            assert!(parse_args(&os(bad)).is_err(), "{bad:?}");
        }
        assert_eq!(parse_args(&os(&["exec", "--help"])).unwrap(), Parsed::Help);
    }

    #[test]
    fn checks_the_configuration() {
        let addr = [("RDMX_SOFT_ADDR".to_string(), "127.0.0.2".to_string())];
        assert_eq!(check_config_in(Vec::new(), &addr), Ok(vec![]));
        // exec's own --set is never foreign.
        let e =
            check_config_in(Vec::new(), &[("RDMX_NO_SUCH_KEY".into(), "1".into())]).unwrap_err();
        assert!(
            e.contains("NO_SUCH_KEY") || e.contains("no_such_key"),
            "{e}"
        );
        // The user's own RDMX_ variable is left alone and named; a typo of a key stops
        // exec with the suggestion; a bad value of a key too.
        let environ = |k: &str, v: &str| vec![(OsString::from(k), OsString::from(v))];
        assert_eq!(
            check_config_in(environ("RDMX_HOME", "/opt/x"), &addr),
            Ok(vec!["RDMX_HOME".to_string()])
        );
        let e = check_config_in(environ("RDMX_RNR_RETYR", "3"), &addr).unwrap_err();
        assert!(e.contains("did you mean 'RDMX_RNR_RETRY'"), "{e}");
        let e = check_config_in(environ("RDMX_RNR_RETRY", "8"), &addr).unwrap_err();
        assert!(e.contains("RDMX_RNR_RETRY"), "{e}");
        // exec's value wins over the environment's.
        assert!(check_config_in(environ("RDMX_SOFT_ADDR", "nonsense"), &addr).is_ok());
    }
}
