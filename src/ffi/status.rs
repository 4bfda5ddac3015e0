//! `rdmx_status`, `rdmx_status_str`, `rdmx_last_error`, `rdmx_version`.

use super::boundary;
use crate::error::ErrorKind;
use std::ffi::c_char;

/// Result of every fallible rdmx call. 0 is success; on any other value
/// `rdmx_last_error()` holds a message naming what was wrong.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rdmx_status {
    RDMX_OK = 0,
    /// A NULL handle or pointer, a string that is not UTF-8, or an argument out of domain.
    RDMX_INVALID_ARGUMENT = 1,
    /// A configuration key rdmx does not know (the message suggests the closest one).
    RDMX_UNKNOWN_KEY = 2,
    /// A value outside the key's range or of the wrong form.
    RDMX_INVALID_VALUE = 3,
    /// Values valid alone but not together (e.g. a CQ smaller than the WRs using it).
    RDMX_CONFLICT = 4,
    /// A malformed configuration file line (the message gives file and line).
    RDMX_PARSE_ERROR = 5,
    /// An operating-system error (the message carries the OS text).
    RDMX_IO_ERROR = 6,
    /// The caller's buffer is too small; the needed length was stored in `*out_len`.
    RDMX_BUFFER_TOO_SMALL = 7,
    /// rdmx panicked; the call was abandoned without unwinding into C.
    RDMX_PANIC = 8,
    /// In use: e.g. deregistering memory that work requests in flight still name.
    RDMX_BUSY = 9,
    /// The connection is closed or its peer is gone.
    RDMX_CLOSED = 10,
    /// A deadline passed (connect, accept, handshake).
    RDMX_TIMEOUT = 11,
    /// Not available here (e.g. provider=verbs without an RDMA device).
    RDMX_UNSUPPORTED = 12,
    /// A queue is full (e.g. more WRs than max_send_wr outstanding); poll, then retry.
    RDMX_FULL = 13,
    /// A system limit would be exceeded (e.g. RLIMIT_MEMLOCK: `ulimit -l`).
    RDMX_RESOURCE_LIMIT = 14,
    /// Authentication failed (wrong or missing key, unknown entity, a peer that would not
    /// authenticate) or its configuration is unusable (a keyring others may read); also
    /// access refused to an authenticated entity (`rdmx_blk_open` of a volume the
    /// target's `--allow` does not grant it).
    RDMX_AUTH = 15,
}

impl From<ErrorKind> for rdmx_status {
    fn from(kind: ErrorKind) -> Self {
        match kind {
            ErrorKind::InvalidArgument => rdmx_status::RDMX_INVALID_ARGUMENT,
            ErrorKind::UnknownKey => rdmx_status::RDMX_UNKNOWN_KEY,
            ErrorKind::InvalidValue => rdmx_status::RDMX_INVALID_VALUE,
            ErrorKind::Conflict => rdmx_status::RDMX_CONFLICT,
            ErrorKind::Parse => rdmx_status::RDMX_PARSE_ERROR,
            ErrorKind::Io => rdmx_status::RDMX_IO_ERROR,
            ErrorKind::BufferTooSmall => rdmx_status::RDMX_BUFFER_TOO_SMALL,
            ErrorKind::Panic => rdmx_status::RDMX_PANIC,
            ErrorKind::Busy => rdmx_status::RDMX_BUSY,
            ErrorKind::Closed => rdmx_status::RDMX_CLOSED,
            ErrorKind::Timeout => rdmx_status::RDMX_TIMEOUT,
            ErrorKind::Unsupported => rdmx_status::RDMX_UNSUPPORTED,
            ErrorKind::Full => rdmx_status::RDMX_FULL,
            ErrorKind::ResourceLimit => rdmx_status::RDMX_RESOURCE_LIMIT,
            ErrorKind::Auth => rdmx_status::RDMX_AUTH,
        }
    }
}

/// A static, NUL-terminated name for a status code, e.g. "RDMX_INVALID_VALUE";
/// "RDMX_UNKNOWN_STATUS" for values that are not an `rdmx_status`. Never NULL; do not free.
/// Takes an `int` so that any value a C caller passes is defined behaviour.
#[unsafe(no_mangle)]
pub extern "C" fn rdmx_status_str(status: i32) -> *const c_char {
    let s: &'static [u8] = match status {
        0 => b"RDMX_OK\0",
        1 => b"RDMX_INVALID_ARGUMENT\0",
        2 => b"RDMX_UNKNOWN_KEY\0",
        3 => b"RDMX_INVALID_VALUE\0",
        4 => b"RDMX_CONFLICT\0",
        5 => b"RDMX_PARSE_ERROR\0",
        6 => b"RDMX_IO_ERROR\0",
        7 => b"RDMX_BUFFER_TOO_SMALL\0",
        8 => b"RDMX_PANIC\0",
        9 => b"RDMX_BUSY\0",
        10 => b"RDMX_CLOSED\0",
        11 => b"RDMX_TIMEOUT\0",
        12 => b"RDMX_UNSUPPORTED\0",
        13 => b"RDMX_FULL\0",
        14 => b"RDMX_RESOURCE_LIMIT\0",
        15 => b"RDMX_AUTH\0",
        _ => b"RDMX_UNKNOWN_STATUS\0",
    };
    s.as_ptr().cast()
}

/// The message of the last failed rdmx call on this thread ("" if the last fallible call
/// succeeded). Never NULL. Owned by rdmx: valid until the next rdmx call on this thread;
/// copy it if you need it longer. Do not free.
#[unsafe(no_mangle)]
pub extern "C" fn rdmx_last_error() -> *const c_char {
    boundary::last_error_ptr()
}

/// The library version, e.g. "0.1.0". Static, never NULL; do not free.
#[unsafe(no_mangle)]
pub extern "C" fn rdmx_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn s(p: *const c_char) -> String {
        // SAFETY: the functions under test return static NUL-terminated strings.
        unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_string()
    }

    #[test]
    fn status_names_match_enum_values() {
        for (st, name) in [
            (rdmx_status::RDMX_OK, "RDMX_OK"),
            (rdmx_status::RDMX_INVALID_ARGUMENT, "RDMX_INVALID_ARGUMENT"),
            (rdmx_status::RDMX_UNKNOWN_KEY, "RDMX_UNKNOWN_KEY"),
            (rdmx_status::RDMX_INVALID_VALUE, "RDMX_INVALID_VALUE"),
            (rdmx_status::RDMX_CONFLICT, "RDMX_CONFLICT"),
            (rdmx_status::RDMX_PARSE_ERROR, "RDMX_PARSE_ERROR"),
            (rdmx_status::RDMX_IO_ERROR, "RDMX_IO_ERROR"),
            (rdmx_status::RDMX_BUFFER_TOO_SMALL, "RDMX_BUFFER_TOO_SMALL"),
            (rdmx_status::RDMX_PANIC, "RDMX_PANIC"),
            (rdmx_status::RDMX_BUSY, "RDMX_BUSY"),
            (rdmx_status::RDMX_CLOSED, "RDMX_CLOSED"),
            (rdmx_status::RDMX_TIMEOUT, "RDMX_TIMEOUT"),
            (rdmx_status::RDMX_UNSUPPORTED, "RDMX_UNSUPPORTED"),
            (rdmx_status::RDMX_FULL, "RDMX_FULL"),
            (rdmx_status::RDMX_RESOURCE_LIMIT, "RDMX_RESOURCE_LIMIT"),
            (rdmx_status::RDMX_AUTH, "RDMX_AUTH"),
        ] {
            assert_eq!(s(rdmx_status_str(st as i32)), name);
        }
        assert_eq!(s(rdmx_status_str(-1)), "RDMX_UNKNOWN_STATUS");
        assert_eq!(s(rdmx_status_str(16)), "RDMX_UNKNOWN_STATUS");
    }

    #[test]
    fn version_is_the_crate_version() {
        assert_eq!(s(rdmx_version()), env!("CARGO_PKG_VERSION"));
    }
}
