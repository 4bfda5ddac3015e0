//! Generates `include/rdmx.h` (cbindgen, from src/ffi/) and the pkg-config file `rdmx.pc`
//! next to the built library (target/<profile>/pkgconfig/rdmx.pc).

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

/// Native libraries a program linking librdmx.a needs: std's own (what rustc prints for
/// `--print native-static-libs` on linux-gnu) plus libibverbs/librdmacm with the `verbs`
/// feature. ffi-tests/check-pc.sh compares this list with rustc's.
fn native_libs() -> Vec<&'static str> {
    let mut libs = Vec::new();
    if env::var_os("CARGO_FEATURE_VERBS").is_some() {
        libs.extend(["-libverbs", "-lrdmacm"]);
    }
    libs.extend([
        "-lgcc_s",
        "-lutil",
        "-lrt",
        "-lpthread",
        "-lm",
        "-ldl",
        "-lc",
    ]);
    libs
}

fn write_if_changed(path: &Path, text: &str) {
    if fs::read_to_string(path).ok().as_deref() != Some(text) {
        fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }
}

fn main() {
    let crate_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    println!("cargo:rerun-if-changed=src/ffi");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-changed=build.rs");

    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .expect("cbindgen.toml must parse");
    // Only src/ffi/ is the C ABI: parsing from its root keeps every other `#[repr]` type of
    // the crate (wire opcodes, verbs enums) out of the header.
    let header = cbindgen::Builder::new()
        .with_src(crate_dir.join("src/ffi/mod.rs"))
        .with_config(config)
        .generate()
        .expect("cbindgen could not generate include/rdmx.h");
    let mut bytes = Vec::new();
    header.write(&mut bytes);
    let text = String::from_utf8(bytes).expect("header is UTF-8");
    fs::create_dir_all(crate_dir.join("include")).expect("create include/");
    write_if_changed(&crate_dir.join("include/rdmx.h"), &text);

    // OUT_DIR is target/<profile>/build/rdmx-<hash>/out: the library lands three levels up.
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let Some(lib_dir) = out_dir.ancestors().nth(3) else {
        return;
    };
    let pc_dir = lib_dir.join("pkgconfig");
    fs::create_dir_all(&pc_dir).expect("create pkgconfig dir");
    let libs = native_libs().join(" ");
    let pc = format!(
        "prefix={prefix}\nincludedir=${{prefix}}/include\nlibdir={libdir}\n\n\
         Name: rdmx\nDescription: RDMA messenger transport for storage daemons\n\
         Version: {version}\nCflags: -I${{includedir}}\n\
         Libs: -L${{libdir}} -lrdmx {libs}\nLibs.private: {libs}\n",
        prefix = crate_dir.display(),
        libdir = lib_dir.display(),
        version = env::var("CARGO_PKG_VERSION").expect("CARGO_PKG_VERSION"),
    );
    write_if_changed(&pc_dir.join("rdmx.pc"), &pc);
}
