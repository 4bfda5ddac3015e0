//! The hand-written private ABI (`src/abi/mod.rs`) against C: every size and offset in
//! `rdmx_ibv::abi::LAYOUT` is compared with what a C probe compiled against rdma-core's
//! `infiniband/driver.h` prints.
//!
//! `driver.h` is not installed by libibverbs-dev. The rdma-core v55 sources vendored by
//! the `ibverbs-sys` crate (a never-built dev-dependency of this package, so cargo fetches
//! them) are configured with cmake (generated headers: `config.h`, `kernel-abi/`) in
//! cargo's per-test scratch directory; nothing is copied into the repository. The probe
//! sees the installed public headers (`/usr/include/infiniband/*.h`, the library's own,
//! v44 on Debian 12) before v55's, so structures that embed public ones (`verbs_qp`
//! embeds `ibv_qp_ex`, which v55 grew) get the installed library's layout. The private
//! structures themselves are the same in v44 and v55 (`driver.h` differs only in
//! `ibv_cmd_*` prototypes between the two tags), and `IBVERBS_PABI_VERSION` is 34 in both.

use std::path::{Path, PathBuf};
use std::process::Command;

fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({:?}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The vendored rdma-core of `ibverbs-sys` 0.3.2+55.0 (through `cargo metadata`, which
/// also downloads it when missing).
fn rdma_core_src() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let json = run(
        Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--manifest-path"])
            .arg(&manifest),
        "cargo metadata",
    );
    let key = "\"manifest_path\":\"";
    let path = json
        .match_indices(key)
        .map(|(i, _)| {
            let rest = &json[i + key.len()..];
            &rest[..rest.find('"').unwrap_or(0)]
        })
        .find(|p| p.contains("/ibverbs-sys-0.3.2"))
        .expect("ibverbs-sys 0.3.2 is not in cargo metadata (rdmx-ibv's dev-dependencies)");
    let src = Path::new(path).parent().unwrap().join("vendor/rdma-core");
    assert!(
        src.join("libibverbs/driver.h").is_file(),
        "{} has no libibverbs/driver.h",
        src.display()
    );
    src
}

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Configures rdma-core in `build` (once) and generates the kernel ABI headers.
fn configure(src: &Path, build: &Path) {
    assert!(
        have("cmake"),
        "cmake is needed for the ABI layout check (scripts/install-deps.sh installs it)"
    );
    if !build.join("CMakeCache.txt").is_file() {
        std::fs::create_dir_all(build).unwrap();
        let mut c = Command::new("cmake");
        if have("ninja") {
            c.args(["-G", "Ninja"]);
        }
        c.current_dir(build)
            .args([
                "-DNO_MAN_PAGES=1",
                "-DNO_PYVERBS=1",
                "-DCMAKE_INSTALL_PREFIX=/usr",
            ])
            .arg(src);
        run(&mut c, "cmake configure of rdma-core");
    }
    run(
        Command::new("cmake")
            .arg("--build")
            .arg(build)
            .args(["--target", "kern-abi"]),
        "generating rdma-core's kernel-abi headers",
    );
}

fn probe_source() -> String {
    let mut s = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/driver.h>\n\
         int main(void) {\n  printf(\"IBVERBS_PABI_VERSION - %d\\n\", IBVERBS_PABI_VERSION);\n",
    );
    for (ty, field, _) in rdmx_ibv::abi::LAYOUT {
        match field {
            None => s.push_str(&format!(
                "  printf(\"{ty} - %zu\\n\", sizeof(struct {ty}));\n"
            )),
            Some(f) => s.push_str(&format!(
                "  printf(\"{ty} {f} %zu\\n\", offsetof(struct {ty}, {f}));\n"
            )),
        }
    }
    s.push_str("  return 0;\n}\n");
    s
}

#[test]
fn private_abi_layout_matches_driver_h() {
    let src = rdma_core_src();
    let scratch = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("abi_layout");
    let build = scratch.join("rdma-core-build");
    configure(&src, &build);

    // The installed public headers first (the library's own), then v55's build tree.
    let overlay = scratch.join("installed-include/infiniband");
    std::fs::create_dir_all(&overlay).unwrap();
    for e in std::fs::read_dir("/usr/include/infiniband").expect("libibverbs-dev headers") {
        let e = e.unwrap();
        let link = overlay.join(e.file_name());
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(e.path(), &link).unwrap();
    }
    let c = scratch.join("probe.c");
    std::fs::write(&c, probe_source()).unwrap();
    let exe = scratch.join("probe");
    run(
        Command::new("cc")
            .arg("-std=gnu11")
            .arg(format!("-I{}", overlay.parent().unwrap().display()))
            .arg(format!("-I{}", build.join("include").display()))
            .arg("-o")
            .arg(&exe)
            .arg(&c),
        "compiling the layout probe",
    );
    let out = run(&mut Command::new(&exe), "the layout probe");

    let mut c_facts = std::collections::HashMap::new();
    for line in out.lines() {
        let mut w = line.split_whitespace();
        let (ty, f, v) = (w.next().unwrap(), w.next().unwrap(), w.next().unwrap());
        c_facts.insert((ty.to_string(), f.to_string()), v.parse::<usize>().unwrap());
    }
    assert_eq!(
        c_facts[&("IBVERBS_PABI_VERSION".to_string(), "-".to_string())],
        rdmx_ibv::abi::PABI_VERSION as usize,
        "rdma-core's private ABI number"
    );
    let mut bad = Vec::new();
    for (ty, field, rust) in rdmx_ibv::abi::LAYOUT {
        let key = (ty.to_string(), field.unwrap_or("-").to_string());
        let c = c_facts[&key];
        if c != *rust {
            bad.push(format!(
                "{ty}{}: C {c}, Rust {rust}",
                field
                    .map(|f| format!(".{f}"))
                    .unwrap_or_else(|| " size".into())
            ));
        }
    }
    assert!(bad.is_empty(), "layout mismatches:\n{}", bad.join("\n"));
    assert!(
        rdmx_ibv::abi::LAYOUT.len() > 100,
        "the table covers what the glue uses"
    );
}

/// The provider imports the private functions with their version (the load-time guard)
/// and links with `-z defs`.
#[test]
fn provider_imports_are_versioned() {
    // The provider of this build, where the launcher finds it.
    let lib = rdmx_ibv::launcher::provider_for(
        Path::new(env!("CARGO_BIN_EXE_rdmx-ibv")).parent().unwrap(),
    )
    .expect("librdmx_ibv.so next to the rdmx-ibv binary (cargo build -p rdmx-ibv)");
    let t = run(Command::new("objdump").arg("-T").arg(&lib), "objdump -T");
    for sym in [
        "verbs_register_driver_34",
        "_verbs_init_and_alloc_context",
        "verbs_set_ops",
        "verbs_uninit_context",
    ] {
        assert!(
            t.lines().any(|l| l.contains("*UND*")
                && l.contains("(IBVERBS_PRIVATE_34)")
                && l.ends_with(sym)),
            "{sym} is not imported as {sym}@IBVERBS_PRIVATE_34:\n{t}"
        );
    }
    // The exported replacements of the two non-provider verbs, and the waiting one.
    for sym in [
        "ibv_create_comp_channel",
        "ibv_destroy_comp_channel",
        "ibv_get_cq_event",
    ] {
        assert!(
            t.lines().any(|l| l.contains(" .text") && l.ends_with(sym)),
            "{sym} is not exported"
        );
    }
    // And the installed library has the ABI (what the launcher checks with dlvsym).
    rdmx_ibv::abi::private_abi_available().unwrap();
}
