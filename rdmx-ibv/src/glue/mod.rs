//! The provider libibverbs loads: `librdmx_ibv.so`, found as `<dir>/librdmx-rdmav34.so`
//! through `RDMAV_DRIVERS=<dir>/librdmx` (the launcher makes the link). Its constructor
//! registers [`DEVICE_OPS`] with `verbs_register_driver_34`; libibverbs then matches the
//! sysfs device `rdmx0` by name, and every verbs call on it lands in one of the ops of
//! [`context`] and [`objects`], which translate between libibverbs' structures and the
//! [`crate::verbs`] objects. [`channel`] replaces `ibv_create_comp_channel` and
//! `ibv_destroy_comp_channel`, which are not provider ops, when the library is preloaded.
//!
//! Every `extern "C"` function runs its body under [`guard`]: a panic is caught, logged,
//! and returned as the op's error (EIO / NULL), never unwound into C.

pub mod ah;
pub mod channel;
pub mod context;
pub mod cq_event;
mod mw;
pub mod objects;
mod qp_ex;
mod retire;

use crate::abi::{self, verbs_device_ops, verbs_match_ent};
use rdmx::error::{Error, ErrorKind};
use std::ffi::c_int;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// The ibdev name prefix this provider claims (the launcher names the device `rdmx0`).
pub const IBDEV_PREFIX: &str = "rdmx";

static MATCH_TABLE: [verbs_match_ent; 1] = [verbs_match_ent {
    driver_data: std::ptr::null_mut(),
    u: 0,
    vendor: 0,
    device: 0,
    kind: abi::VERBS_MATCH_SENTINEL,
}];

/// What the provider registers. Matching is by ibdev name (`match_device`): the device
/// has no modalias, like every device of a fake sysfs tree.
pub static DEVICE_OPS: verbs_device_ops = verbs_device_ops {
    name: c"rdmx".as_ptr(),
    match_min_abi_version: 1,
    match_max_abi_version: 1,
    match_table: MATCH_TABLE.as_ptr(),
    static_providers: std::ptr::null(),
    match_device: Some(context::match_device),
    alloc_context: Some(context::alloc_context),
    import_context: None,
    alloc_device: Some(context::alloc_device),
    uninit_device: Some(context::uninit_device),
};

/// Runs `f`; a panic is caught and logged, and `on_panic` returned instead.
pub(crate) fn guard<R>(op: &str, on_panic: R, f: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(e) => {
            let what = e
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| e.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            log::error!("rdmx-ibv: panic in {op} (refused with an error): {what}");
            set_errno(libc::EIO);
            on_panic
        }
    }
}

/// errno for an rdmx error, as verbs returns it.
pub(crate) fn errno_of(e: &Error) -> c_int {
    match e.kind() {
        ErrorKind::InvalidArgument
        | ErrorKind::InvalidValue
        | ErrorKind::UnknownKey
        | ErrorKind::Conflict
        | ErrorKind::Parse
        | ErrorKind::BufferTooSmall => libc::EINVAL,
        ErrorKind::Busy => libc::EBUSY,
        ErrorKind::Full | ErrorKind::ResourceLimit => libc::ENOMEM,
        ErrorKind::Unsupported => libc::EOPNOTSUPP,
        ErrorKind::Closed => libc::ENOTCONN,
        ErrorKind::Timeout => libc::ETIMEDOUT,
        ErrorKind::Auth => libc::EACCES,
        ErrorKind::Io | ErrorKind::Panic => libc::EIO,
    }
}

pub(crate) fn set_errno(v: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = v };
}

/// Logs `e` at debug level (verbs reports errors by number; the text helps the operator)
/// and returns its errno.
pub(crate) fn fail(op: &str, e: &Error) -> c_int {
    log::debug!("rdmx-ibv: {op}: {e}");
    errno_of(e)
}

/// As [`fail`] for a refused post, logged as a warning at most once a second: a refused
/// post is an error the application rarely expects (Ceph asserts on it), and the text says
/// which limit refused it.
pub(crate) fn fail_post(op: &str, e: &Error) -> c_int {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST_S: AtomicU64 = AtomicU64::new(0);
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if LAST_S.swap(now_s, Ordering::Relaxed) != now_s {
        log::warn!("rdmx-ibv: {op} refused: {e}");
    } else {
        log::debug!("rdmx-ibv: {op} refused: {e}");
    }
    errno_of(e)
}

/// The constructor: registers the provider when this code runs as a shared object
/// (libibverbs' `dlopen` of `librdmx-rdmav34.so`, or `LD_PRELOAD`), not when the crate is
/// linked into the launcher or a test program.
extern "C" fn register() {
    guard("register", (), || {
        if !in_shared_object() {
            return;
        }
        // SAFETY: DEVICE_OPS is a static that lives as long as the library (which
        // libibverbs never unloads); the function is what IBVERBS_PRIVATE_34 exports.
        unsafe { abi::verbs_register_driver_34(&DEVICE_OPS) };
    })
}

#[used]
#[unsafe(link_section = ".init_array")]
static REGISTER: extern "C" fn() = register;

/// Whether this code is in a shared object (name ending in `.so`), by `dladdr` of a
/// function of it.
fn in_shared_object() -> bool {
    let mut info: libc::Dl_info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only reads the loader's tables and fills `info`.
    let ok = unsafe { libc::dladdr(register as *const libc::c_void, &mut info) };
    if ok == 0 || info.dli_fname.is_null() {
        return false;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    name.to_bytes().ends_with(b".so")
}
