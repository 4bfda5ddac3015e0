//! The C ABI. Conventions (as rustls-ffi): one prefix `rdmx_`, names `rdmx_<object>_<verb>`,
//! opaque handles with `_new`/`_free` pairs (`_free(NULL)` is a no-op), a `rdmx_status`
//! return (0 = OK) with the message of the last failure in `rdmx_last_error()`, NULL
//! arguments reported as `RDMX_INVALID_ARGUMENT`, and a panic boundary around every entry
//! point. This layer holds no logic of its own: it converts and calls into the crate.

pub mod blk;
mod boundary;
pub mod config;
pub mod conn;
pub mod context;
pub mod encoding;
#[cfg(test)]
mod frozen;
pub mod log;
pub mod mem;
pub mod msgr;
mod sized;
pub mod status;

pub use status::rdmx_status;
