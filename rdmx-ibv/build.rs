//! Build-time guard of libibverbs' private provider ABI, and the provider's link flags.
//!
//! The provider (`librdmx_ibv.so`, loaded by libibverbs as `librdmx-rdmav34.so`) is written
//! for `IBVERBS_PRIVATE_34` (see `src/abi/mod.rs`). When the installed `libibverbs.so.1`
//! does not export `verbs_register_driver_34@IBVERBS_PRIVATE_34` the build stops here with
//! a message saying so. `-z defs` makes every import of the provider resolve at link time,
//! so the private imports carry their version and a libibverbs of another private ABI
//! refuses to load the provider ("version `IBVERBS_PRIVATE_34' not found") instead of
//! calling into it.

use std::path::PathBuf;
use std::process::Command;

const SYMBOL: &str = "verbs_register_driver_34";
const VERSION: &str = "IBVERBS_PRIVATE_34";

fn libibverbs() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Ok(out) = Command::new("pkg-config")
        .args(["--variable=libdir", "libibverbs"])
        .output()
    {
        if out.status.success() {
            let d = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if !d.is_empty() {
                dirs.push(d.into());
            }
        }
    }
    for d in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
    ] {
        dirs.push(d.into());
    }
    dirs.into_iter()
        .map(|d| d.join("libibverbs.so.1"))
        .find(|p| p.exists())
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");

    // The provider must not have undefined symbols left for load time.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,defs");

    let Some(lib) = libibverbs() else {
        panic!(
            "rdmx-ibv: libibverbs.so.1 not found (pkg-config libibverbs, /usr/lib*): \
             install libibverbs-dev (scripts/install-deps.sh)"
        );
    };
    println!("cargo:rerun-if-changed={}", lib.display());
    let out = match Command::new("objdump").arg("-T").arg(&lib).output() {
        Ok(out) if out.status.success() => out,
        Ok(out) => panic!(
            "rdmx-ibv: objdump -T {} failed: {}",
            lib.display(),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => {
            // The load-time guard (versioned imports) still holds; say that this one
            // could not run.
            println!(
                "cargo:warning=rdmx-ibv: objdump not available ({e}): the private ABI of {} \
                 was not checked at build time (binutils)",
                lib.display()
            );
            return;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let exported = text.lines().any(|l| {
        let mut words = l.split_whitespace().rev();
        words.next() == Some(SYMBOL) && words.next() == Some(VERSION)
    });
    if !exported {
        let found: Vec<&str> = text
            .lines()
            .filter_map(|l| l.split_whitespace().rev().nth(1))
            .filter(|v| v.starts_with("IBVERBS_PRIVATE_"))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        panic!(
            "rdmx-ibv: {} does not export {SYMBOL}@{VERSION}: the installed libibverbs has \
             private ABI {:?}, the provider is written for {VERSION} (rdma-core v35..v56). \
             Check src/abi/mod.rs against that rdma-core's infiniband/driver.h before \
             changing the ABI number.",
            lib.display(),
            found
        );
    }
}
