//! The panic boundary, the thread-local last-error message, and the pointer/string
//! conversions every entry point needs. Keeping them here means each entry point is a few
//! lines of argument checks and one call into the crate.

use super::status::rdmx_status;
use crate::error::{Error, ErrorKind, Result};
use std::cell::RefCell;
use std::ffi::{CStr, c_char};
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};

thread_local! {
    /// The last error's text and its NUL; empty means "" (the last fallible call
    /// succeeded). Cleared by truncation and rewritten in place, so that once it has grown
    /// to fit the messages a thread sees, clearing it on every call and setting it on a
    /// refusal allocate nothing.
    static LAST_ERROR: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

pub(super) fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|e| {
        let e = e.borrow();
        if e.is_empty() {
            c"".as_ptr()
        } else {
            e.as_ptr().cast()
        }
    })
}

/// Clears the last error: no allocation, no formatting.
fn clear_last_error() {
    LAST_ERROR.with(|e| e.borrow_mut().clear());
}

/// Writes text into the last-error buffer, replacing interior NULs (which a C string
/// cannot hold) by `\0` rather than losing the text after them.
struct NulEscaping<'a>(&'a mut Vec<u8>);

impl fmt::Write for NulEscaping<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for (i, part) in s.split('\0').enumerate() {
            if i > 0 {
                self.0.extend_from_slice(b"\\0");
            }
            self.0.extend_from_slice(part.as_bytes());
        }
        Ok(())
    }
}

/// Sets the last error to the formatted `args`, in place (allocates only to grow the
/// buffer).
pub(super) fn set_last_error_fmt(args: fmt::Arguments<'_>) {
    LAST_ERROR.with(|e| {
        let mut buf = e.borrow_mut();
        buf.clear();
        // Writing into a Vec cannot fail; a Display impl that errs leaves what it wrote.
        let _ = fmt::Write::write_fmt(&mut NulEscaping(&mut buf), args);
        buf.push(0);
    });
}

pub(super) fn set_last_error(msg: &str) {
    set_last_error_fmt(format_args!("{msg}"));
}

/// Runs `f` for the C entry point `name`: clears the last error, catches panics, and turns
/// an `Err` into its status with "name: message" as the last error.
pub(super) fn call(name: &str, f: impl FnOnce() -> Result<()>) -> rdmx_status {
    crate::logging::init();
    clear_last_error();
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => rdmx_status::RDMX_OK,
        Ok(Err(e)) => {
            log::debug!(target: "rdmx::ffi", "{name} failed: {e}");
            // Formatted once, straight into the reused buffer.
            set_last_error_fmt(format_args!("{name}: {e}"));
            e.kind().into()
        }
        Err(payload) => {
            set_last_error_fmt(format_args!(
                "{name}: internal panic: {}",
                crate::logging::panic_message(&*payload)
            ));
            rdmx_status::RDMX_PANIC
        }
    }
}

/// Runs an infallible entry point that returns a plain value, with `on_panic` returned if
/// rdmx panics (the value says so in the API docs, e.g. UINT64_MAX).
pub(super) fn call_value<T>(name: &str, on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(payload) => {
            set_last_error_fmt(format_args!(
                "{name}: internal panic: {}",
                crate::logging::panic_message(&*payload)
            ));
            on_panic
        }
    }
}

fn null(what: &str) -> Error {
    Error::new(ErrorKind::InvalidArgument, format!("{what} is NULL"))
}

/// A shared reference to the object behind a handle, or an error naming the NULL argument.
///
/// # Safety
/// `p` must be NULL or a handle rdmx handed out and that has not been freed.
pub(super) unsafe fn handle<'a, T>(p: *const T, what: &str) -> Result<&'a T> {
    // SAFETY: per this function's contract, a non-NULL `p` points to a live T.
    unsafe { p.as_ref() }.ok_or_else(|| null(what))
}

/// A mutable reference to the object behind a handle.
///
/// # Safety
/// As `handle`, and no other reference to the object may be live (C callers must not use
/// one handle from two threads at once, as documented in the header).
pub(super) unsafe fn handle_mut<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T> {
    // SAFETY: per this function's contract, a non-NULL `p` points to a live, unaliased T.
    unsafe { p.as_mut() }.ok_or_else(|| null(what))
}

/// An out-parameter pointer, or `out is NULL` (RDMX_INVALID_ARGUMENT).
pub(super) fn out_ptr<T>(p: *mut T) -> Result<*mut T> {
    if p.is_null() { Err(null("out")) } else { Ok(p) }
}

/// A borrowed UTF-8 string from a C string argument.
///
/// # Safety
/// `p` must be NULL or point to a NUL-terminated string valid for the call's duration.
pub(super) unsafe fn str_arg<'a>(p: *const c_char, what: &str) -> Result<&'a str> {
    if p.is_null() {
        return Err(null(what));
    }
    // SAFETY: non-NULL and NUL-terminated per this function's contract.
    let c = unsafe { CStr::from_ptr(p) };
    c.to_str().map_err(|_| {
        Error::new(
            ErrorKind::InvalidArgument,
            format!("{what} is not valid UTF-8"),
        )
    })
}

/// Copies `s` and a NUL into the caller's buffer, snprintf-style. `*out_len` (if not NULL)
/// gets `s.len()` (without the NUL) in every case. A NULL `buf` with `len == 0` is a size
/// query and succeeds; a buffer shorter than `s.len() + 1` fails with BUFFER_TOO_SMALL and
/// holds "" (if it has room for the NUL).
///
/// # Safety
/// `buf` must be NULL or valid for `len` bytes of writes; `out_len` NULL or writable.
pub(super) unsafe fn write_str(
    s: &str,
    buf: *mut c_char,
    len: usize,
    out_len: *mut usize,
) -> Result<()> {
    if !out_len.is_null() {
        // SAFETY: non-NULL and writable per this function's contract.
        unsafe { out_len.write(s.len()) };
    }
    if buf.is_null() {
        return if len == 0 {
            Ok(())
        } else {
            Err(null("buf (with len > 0)"))
        };
    }
    if len < s.len() + 1 {
        if len > 0 {
            // SAFETY: `buf` is valid for at least one byte.
            unsafe { buf.write(0) };
        }
        return Err(Error::new(
            ErrorKind::BufferTooSmall,
            format!("buffer of {len} bytes is too small: {} needed", s.len() + 1),
        ));
    }
    // SAFETY: `buf` is valid for `len >= s.len() + 1` bytes and does not overlap `s` (a Rust
    // string owned by rdmx).
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len());
        buf.add(s.len()).write(0);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last() -> String {
        // SAFETY: last_error_ptr returns a live NUL-terminated thread-local string.
        unsafe { CStr::from_ptr(last_error_ptr()) }
            .to_str()
            .unwrap()
            .to_string()
    }

    #[test]
    fn panic_becomes_status_and_message() {
        let st = call("rdmx_test", || panic!("boom {}", 7));
        assert_eq!(st, rdmx_status::RDMX_PANIC);
        assert_eq!(last(), "rdmx_test: internal panic: boom 7");
        let v = call_value("rdmx_test_value", u64::MAX, || panic!("static"));
        assert_eq!(v, u64::MAX);
        assert_eq!(last(), "rdmx_test_value: internal panic: static");
    }

    #[test]
    fn error_sets_message_and_success_clears_it() {
        let st = call("rdmx_x", || Err(Error::new(ErrorKind::Conflict, "bad mix")));
        assert_eq!(st, rdmx_status::RDMX_CONFLICT);
        assert_eq!(last(), "rdmx_x: bad mix");
        assert_eq!(call("rdmx_x", || Ok(())), rdmx_status::RDMX_OK);
        assert_eq!(last(), "");
        // A typed refusal is formatted here, once, with its kind's status.
        let full = crate::rc::PostError::QueueFull {
            queue: crate::rc::PostQueue::Send,
            outstanding: 4,
            limit: 4,
        };
        let st = call("rdmx_post_send", || Err(full.into()));
        assert_eq!(st, rdmx_status::RDMX_FULL);
        assert_eq!(
            last(),
            "rdmx_post_send: post_send: send queue full (4 WRs outstanding = max_send_wr)"
        );
        // A shorter message after a longer one: the buffer is rewritten, not appended to.
        let st = call("rdmx_x", || Err(Error::fixed(ErrorKind::Busy, "b")));
        assert_eq!(st, rdmx_status::RDMX_BUSY);
        assert_eq!(last(), "rdmx_x: b");
    }

    #[test]
    fn interior_nul_is_escaped_not_truncated() {
        let st = call("rdmx_x", || Err(Error::new(ErrorKind::Parse, "a\0b")));
        assert_eq!(st, rdmx_status::RDMX_PARSE_ERROR);
        assert_eq!(last(), "rdmx_x: a\\0b");
    }

    #[test]
    fn write_str_is_snprintf_like() {
        let mut n = 0usize;
        // SAFETY: NULL buffer with len 0 is the size query; `n` is writable.
        assert!(unsafe { write_str("abc", std::ptr::null_mut(), 0, &mut n) }.is_ok());
        assert_eq!(n, 3);
        let mut small = [b'x' as c_char; 3];
        // SAFETY: `small` is valid for 3 bytes.
        let e = unsafe { write_str("abc", small.as_mut_ptr(), 3, &mut n) }.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::BufferTooSmall);
        assert_eq!(small[0], 0);
        let mut big = [b'x' as c_char; 4];
        // SAFETY: `big` is valid for 4 bytes.
        unsafe { write_str("abc", big.as_mut_ptr(), 4, std::ptr::null_mut()) }.unwrap();
        // SAFETY: write_str NUL-terminated it.
        let s = unsafe { CStr::from_ptr(big.as_ptr()) };
        assert_eq!(s.to_str().unwrap(), "abc");
    }
}
