//! `rdmx_config_*`: a key/value configuration handle (see `src/config.rs` for the keys).

use super::boundary::{self, handle, handle_mut, str_arg, write_str};
use super::status::rdmx_status;
use crate::config::Config;
use std::ffi::c_char;
use std::path::Path;

/// An rdmx configuration: every knob with its effective value and where it came from.
/// Opaque; create with `rdmx_config_new`, free with `rdmx_config_free`. Not thread-safe:
/// do not use one config from two threads at once.
#[allow(non_camel_case_types)]
pub struct rdmx_config {
    inner: Config,
}

impl rdmx_config {
    /// The Rust configuration behind the handle (for other FFI modules).
    #[allow(dead_code)]
    pub(crate) fn config(&self) -> &Config {
        &self.inner
    }
}

/// Creates a configuration holding the defaults overlaid with any `RDMX_<KEY>` environment
/// variables (e.g. `RDMX_RNR_RETRY=2`). On success `*out` receives a new config that the
/// caller owns and frees with `rdmx_config_free`; on failure `*out` is set to NULL (an
/// invalid or unknown `RDMX_` variable fails with the variable named in the message).
///
/// # Safety
/// `out` must be NULL or a valid place to store a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_config_new(out: *mut *mut rdmx_config) -> rdmx_status {
    boundary::call("rdmx_config_new", || {
        boundary::out_ptr(out)?;
        // SAFETY: `out` is non-NULL and writable per the contract.
        unsafe { out.write(std::ptr::null_mut()) };
        let cfg = Box::new(rdmx_config {
            inner: Config::from_env()?,
        });
        // SAFETY: as above.
        unsafe { out.write(Box::into_raw(cfg)) };
        Ok(())
    })
}

/// Frees a configuration. NULL is a no-op.
///
/// # Safety
/// `cfg` must be NULL or a config from `rdmx_config_new` not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_config_free(cfg: *mut rdmx_config) {
    boundary::call_value("rdmx_config_free", (), || {
        if !cfg.is_null() {
            // SAFETY: per the contract `cfg` came from Box::into_raw in rdmx_config_new and
            // ownership comes back here exactly once.
            drop(unsafe { Box::from_raw(cfg) });
        }
    })
}

/// Sets `key` to `value` (both NUL-terminated; keys are case-insensitive, spaces and
/// underscores alike; Ceph `ms_async_rdma_*` names are accepted where they map). An
/// explicit set wins over the profile, the config file and the environment whatever the
/// order of calls. On failure nothing changes: RDMX_UNKNOWN_KEY (with a suggestion) or
/// RDMX_INVALID_VALUE (naming the key, the value and what is allowed).
///
/// # Safety
/// `cfg` must be NULL or a live config; `key`/`value` NULL or NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_config_set(
    cfg: *mut rdmx_config,
    key: *const c_char,
    value: *const c_char,
) -> rdmx_status {
    boundary::call("rdmx_config_set", || {
        // SAFETY: forwarded contract of this function.
        let cfg = unsafe { handle_mut(cfg, "cfg") }?;
        // SAFETY: forwarded contract.
        let key = unsafe { str_arg(key, "key") }?;
        // SAFETY: forwarded contract.
        let value = unsafe { str_arg(value, "value") }?;
        cfg.inner.set(key, value)
    })
}

/// Writes the effective value of `key` into `buf` (NUL-terminated), snprintf-style:
/// `*out_len` (if not NULL) receives the value's length without the NUL; `buf == NULL`
/// with `len == 0` only queries the length; a short buffer gives RDMX_BUFFER_TOO_SMALL.
///
/// # Safety
/// `cfg` NULL or live; `key` NULL or NUL-terminated; `buf` NULL or writable for `len`
/// bytes; `out_len` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_config_get(
    cfg: *const rdmx_config,
    key: *const c_char,
    buf: *mut c_char,
    len: usize,
    out_len: *mut usize,
) -> rdmx_status {
    boundary::call("rdmx_config_get", || {
        // SAFETY: forwarded contract.
        let cfg = unsafe { handle(cfg, "cfg") }?;
        // SAFETY: forwarded contract.
        let key = unsafe { str_arg(key, "key") }?;
        let value = cfg.inner.get(key)?;
        // SAFETY: forwarded contract.
        unsafe { write_str(&value, buf, len, out_len) }
    })
}

/// Loads a ceph.conf-like file: `key = value` lines, `#`/`;` comments, `[section]` headers
/// (keys outside any section and in `[global]` and `[rdmx]` apply; other sections are
/// skipped). File values rank above the profile and below the environment and explicit
/// sets. All or nothing: on RDMX_PARSE_ERROR / RDMX_INVALID_VALUE / RDMX_UNKNOWN_KEY (the
/// message names file and line) or RDMX_IO_ERROR nothing is applied.
///
/// # Safety
/// `cfg` NULL or live; `path` NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_config_load_file(
    cfg: *mut rdmx_config,
    path: *const c_char,
) -> rdmx_status {
    boundary::call("rdmx_config_load_file", || {
        // SAFETY: forwarded contract.
        let cfg = unsafe { handle_mut(cfg, "cfg") }?;
        // SAFETY: forwarded contract.
        let path = unsafe { str_arg(path, "path") }?;
        cfg.inner.load_file(Path::new(path))
    })
}

/// Checks the rules between keys (e.g. a completion queue smaller than the work requests
/// that complete on it). Keys are checked alone when set; these rules are checked here,
/// and again wherever a config is used, so keys can be set in any order.
/// RDMX_CONFLICT names the keys and values.
///
/// # Safety
/// `cfg` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_config_validate(cfg: *const rdmx_config) -> rdmx_status {
    boundary::call("rdmx_config_validate", || {
        // SAFETY: forwarded contract.
        unsafe { handle(cfg, "cfg") }?.inner.validate()
    })
}

/// Writes every effective `key = value` line with where the value came from
/// (`# default`, `# profile ...`, `# file ...`, `# env`, `# set`) into `buf`,
/// with the same buffer rules as `rdmx_config_get`.
///
/// # Safety
/// As `rdmx_config_get`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_config_dump(
    cfg: *const rdmx_config,
    buf: *mut c_char,
    len: usize,
    out_len: *mut usize,
) -> rdmx_status {
    boundary::call("rdmx_config_dump", || {
        // SAFETY: forwarded contract.
        let cfg = unsafe { handle(cfg, "cfg") }?;
        // SAFETY: forwarded contract.
        unsafe { write_str(&cfg.inner.dump(), buf, len, out_len) }
    })
}
