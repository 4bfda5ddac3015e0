//! Statistics and counter structs that can grow without breaking callers built against an
//! older header.
//!
//! Each such struct starts with `size_t struct_size`. The caller sets it to `sizeof` the
//! struct it was compiled with; rdmx fills at most that many bytes (its own struct may be
//! larger: a newer library) and writes back how many it filled (a smaller number: an older
//! library, whose struct ends earlier; the fields past it were not written). Fields are
//! only ever added at the end, so an older struct is a prefix of a newer one.
//!
//! Why this scheme: the structs are plain data read field by field (the fio engine, the
//! examples and daemons print them), which rustls-ffi's opaque handles with one accessor
//! per figure would turn into dozens of entry points; verbs' `comp_mask` marks which
//! optional *input* fields are valid and says nothing about how far an output may be
//! written. A leading size is the smallest scheme that covers both directions (old caller
//! with a new library, new caller with an old one), as Win32's `cbSize` does.

use super::boundary::out_ptr;
use crate::error::{Error, ErrorKind, Result};
use std::mem::size_of;

/// A `#[repr(C)]` output struct whose first field is `struct_size: usize`.
///
/// # Safety
/// Implementors are `#[repr(C)]` with `struct_size: usize` at offset 0 (the
/// [`sized_out!`](crate::ffi::sized) macro checks it at compile time).
pub(super) unsafe trait SizedOut: Copy {
    fn set_struct_size(&mut self, n: usize);
}

/// Implements [`SizedOut`] for each struct, checking `struct_size` is at offset 0.
macro_rules! sized_out {
    ($($t:ty),+ $(,)?) => {$(
        const _: () = assert!(std::mem::offset_of!($t, struct_size) == 0);
        // SAFETY: repr(C) with `struct_size: usize` at offset 0 (asserted above).
        unsafe impl $crate::ffi::sized::SizedOut for $t {
            fn set_struct_size(&mut self, n: usize) {
                self.struct_size = n;
            }
        }
    )+};
}
pub(super) use sized_out;

/// Writes `v` to `out`: at most `out->struct_size` bytes, then `struct_size` = the bytes
/// written. RDMX_INVALID_ARGUMENT for a NULL `out` or a `struct_size` too small to hold
/// itself (0: the caller did not set it).
///
/// # Safety
/// `out` NULL or valid for reads of a `usize` and writes of `out->struct_size` bytes (up
/// to `size_of::<T>()`).
pub(super) unsafe fn write_sized<T: SizedOut>(out: *mut T, mut v: T) -> Result<()> {
    let out = out_ptr(out)?;
    // SAFETY: `out` is non-NULL and, per the contract, its first field is a readable usize.
    let asked = unsafe { out.cast::<usize>().read_unaligned() };
    if asked < size_of::<usize>() {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "struct_size is {asked}: set it to sizeof the struct before the call \
                 (this library's is {})",
                size_of::<T>()
            ),
        ));
    }
    let n = asked.min(size_of::<T>());
    v.set_struct_size(n);
    // SAFETY: `v` is a live T of size_of::<T>() >= n bytes; `out` is writable for `asked`
    // >= n bytes per the contract; the two do not overlap (`v` is a local).
    unsafe {
        std::ptr::copy_nonoverlapping(std::ptr::from_ref(&v).cast::<u8>(), out.cast::<u8>(), n)
    };
    Ok(())
}
