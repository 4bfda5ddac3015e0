//! The private mount namespace CMD runs in.
//!
//! libibverbs opens `/dev/infiniband/uverbs0` (a compiled-in path) and checks its
//! major:minor against sysfs' `dev`. The host has no `/dev/infiniband`, and creating one
//! would modify the host's `/dev`, so the namespace gets its own `/dev`: a tmpfs holding
//! bind mounts of every entry of the host's `/dev` (directories recursively: `pts`, `shm`,
//! ...; symbolic links copied), plus `infiniband/uverbs0` (a bind of `/dev/full`: any
//! kernel command libibverbs would still write fails with ENOSPC instead of "succeeding"
//! on `/dev/null`) and the runtime directory `rdmx-ibv/`. The host's entries are reached
//! through a descriptor of the old `/dev` (`/proc/self/fd/N/...`) after the tmpfs covers
//! it, so no scratch directory is needed on the host.
//!
//! Root: `unshare(CLONE_NEWNS)`. Otherwise (or when that is refused): a user namespace
//! with the caller's uid and gid mapped to themselves, which owns the new mount
//! namespace; the capabilities it grants last until CMD is executed, so CMD runs with its
//! ordinary identity. All mounts become slaves of the host's first (host changes still
//! propagate in, ours never out).
//!
//! Done with libc calls rather than `unshare(1)`: the launcher must run code inside the
//! namespace before CMD (the binds, the tree), which with `unshare(1)` would take a second
//! program or a shell script.

use super::sysfs::Tree;
use std::ffi::CString;
use std::net::IpAddr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap_or_default()
}

fn os_err(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

fn mount(
    src: &Path,
    dst: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<(), String> {
    let s = cstr(src);
    let d = cstr(dst);
    let t = fstype.map(|t| CString::new(t).unwrap_or_default());
    let o = data.map(|o| CString::new(o).unwrap_or_default());
    // SAFETY: NUL-terminated strings (or NULL) that outlive the call.
    let r = unsafe {
        libc::mount(
            s.as_ptr(),
            d.as_ptr(),
            t.as_ref().map_or(std::ptr::null(), |t| t.as_ptr()),
            flags,
            o.as_ref().map_or(std::ptr::null(), |o| o.as_ptr().cast()),
        )
    };
    if r != 0 {
        return Err(os_err(&format!(
            "mount {} on {}",
            src.display(),
            dst.display()
        )));
    }
    Ok(())
}

fn write_proc(path: &str, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("writing {path:?} ({text:?}): {e}"))
}

/// Unshares the mount namespace (as root) or a user and mount namespace.
fn unshare_mounts() -> Result<&'static str, String> {
    // SAFETY: plain syscalls on this (single-threaded) process.
    let (uid, gid, euid) = unsafe { (libc::getuid(), libc::getgid(), libc::geteuid()) };
    let mut root_err = None;
    if euid == 0 {
        // SAFETY: unshare on the calling thread of a single-threaded process.
        if unsafe { libc::unshare(libc::CLONE_NEWNS) } == 0 {
            return Ok("root");
        }
        root_err = Some(std::io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) } != 0 {
        let user_err = std::io::Error::last_os_error();
        let root = match root_err {
            Some(e) => format!("unshare(CLONE_NEWNS) as root failed ({e})"),
            None => "not root (unshare(CLONE_NEWNS) needs CAP_SYS_ADMIN)".into(),
        };
        return Err(format!(
            "cannot make a private mount namespace: {root}, and user namespaces are not \
             available (unshare(CLONE_NEWUSER): {user_err}; see \
             /proc/sys/user/max_user_namespaces and, on Debian/Ubuntu, \
             kernel.unprivileged_userns_clone / kernel.apparmor_restrict_unprivileged_userns). \
             Run rdmx-ibv exec as root or enable unprivileged user namespaces."
        ));
    }
    write_proc("/proc/self/setgroups", "deny")?;
    write_proc("/proc/self/uid_map", &format!("{uid} {uid} 1\n"))?;
    write_proc("/proc/self/gid_map", &format!("{gid} {gid} 1\n"))?;
    Ok("user namespace")
}

/// Enters the namespace and builds `/dev` (with `/dev/infiniband/uverbs0` and the runtime
/// directory holding the sysfs tree for `ip` and the provider link to `provider`).
pub fn enter(ip: IpAddr, provider: &Path) -> Result<(), String> {
    let how = unshare_mounts()?;
    let ctx = |e: String| format!("{e} (in a private mount namespace, {how})");
    mount(
        Path::new("none"),
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_SLAVE,
        None,
    )
    .map_err(ctx)?;

    // The host's /dev, reachable after the tmpfs covers it.
    let dev = Path::new("/dev");
    let entries: Vec<(std::ffi::OsString, std::fs::Metadata)> = std::fs::read_dir(dev)
        .map_err(|e| ctx(format!("reading /dev: {e}")))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            std::fs::symlink_metadata(e.path())
                .ok()
                .map(|m| (e.file_name(), m))
        })
        .collect();
    // SAFETY: open of a constant path; the descriptor is closed below.
    let old = unsafe {
        libc::open(
            c"/dev".as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if old < 0 {
        return Err(ctx(os_err("open /dev")));
    }
    let res = build_dev(old, &entries, ip, provider).map_err(ctx);
    // SAFETY: our descriptor, closed once.
    unsafe { libc::close(old) };
    res
}

fn build_dev(
    old: libc::c_int,
    entries: &[(std::ffi::OsString, std::fs::Metadata)],
    ip: IpAddr,
    provider: &Path,
) -> Result<(), String> {
    let dev = Path::new("/dev");
    let old_path = |name: &std::ffi::OsStr| Path::new(&format!("/proc/self/fd/{old}")).join(name);
    mount(
        Path::new("rdmx-ibv-dev"),
        dev,
        Some("tmpfs"),
        libc::MS_NOSUID,
        Some("mode=755,size=16m"),
    )?;
    let mut failed = Vec::new();
    for (name, meta) in entries {
        if name == "infiniband" || name == "rdmx-ibv" {
            continue;
        }
        let src = old_path(name);
        let dst = dev.join(name);
        let ft = meta.file_type();
        let r = if ft.is_symlink() {
            std::fs::read_link(&src)
                .and_then(|t| std::os::unix::fs::symlink(t, &dst))
                .map_err(|e| e.to_string())
        } else if ft.is_dir() {
            std::fs::create_dir(&dst)
                .map_err(|e| e.to_string())
                .and_then(|_| mount(&src, &dst, None, libc::MS_BIND | libc::MS_REC, None))
        } else {
            std::fs::File::create(&dst)
                .map_err(|e| e.to_string())
                .and_then(|_| mount(&src, &dst, None, libc::MS_BIND, None))
        };
        if let Err(e) = r {
            failed.push(format!("{}: {e}", dst.display()));
        }
    }
    if !failed.is_empty() {
        eprintln!(
            "rdmx-ibv: {} entries of the host's /dev are missing in the namespace: {}",
            failed.len(),
            failed.join("; ")
        );
    }

    let ib = dev.join("infiniband");
    std::fs::create_dir(&ib).map_err(|e| format!("mkdir {}: {e}", ib.display()))?;
    let uverbs = ib.join("uverbs0");
    std::fs::File::create(&uverbs).map_err(|e| format!("creating {}: {e}", uverbs.display()))?;
    mount(
        &old_path("full".as_ref()),
        &uverbs,
        None,
        libc::MS_BIND,
        None,
    )?;
    let meta = std::fs::metadata(&uverbs).map_err(|e| format!("{}: {e}", uverbs.display()))?;
    if !meta.file_type().is_char_device() {
        return Err(format!("{} is not a character device", uverbs.display()));
    }
    let rdev = meta.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));

    let runtime = Path::new(super::RUNTIME_DIR);
    std::fs::create_dir(runtime).map_err(|e| format!("mkdir {}: {e}", runtime.display()))?;
    Tree::with_dev(ip, (major, minor))
        .write(&runtime.join("sys"))
        .map_err(|e| format!("writing the sysfs tree in {}: {e}", runtime.display()))?;
    let link = runtime.join(format!("librdmx{}", crate::abi::PROVIDER_SUFFIX));
    std::os::unix::fs::symlink(provider, &link)
        .map_err(|e| format!("linking {} to {}: {e}", link.display(), provider.display()))?;
    Ok(())
}
