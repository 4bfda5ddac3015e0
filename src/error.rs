//! The crate-wide error: a kind (which maps 1:1 onto a C status code) and a message that
//! names what was wrong, the value given and what is allowed.

use std::fmt;

/// What went wrong, coarsely. Each kind is one `rdmx_status` code in the C ABI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A NULL pointer, a non-UTF-8 string or an argument outside its domain.
    InvalidArgument,
    /// A configuration key that rdmx does not know.
    UnknownKey,
    /// A known key with a value outside its range or of the wrong form.
    InvalidValue,
    /// Values that are fine alone but not together (e.g. a CQ smaller than its WRs).
    Conflict,
    /// A malformed line in a configuration file.
    Parse,
    /// An operating-system error (file not found, permission, ...).
    Io,
    /// The caller's buffer is too small for the result.
    BufferTooSmall,
    /// A panic was caught at the C ABI boundary.
    Panic,
    /// The resource is in use (e.g. a memory region named by work requests in flight).
    Busy,
    /// The connection is closed or its peer is gone.
    Closed,
    /// A deadline passed (connect, accept, handshake).
    Timeout,
    /// Not available here (e.g. the verbs provider on a host without RDMA devices).
    Unsupported,
    /// A queue or pool is full; retry after completions free room.
    Full,
    /// A system resource limit would be exceeded (e.g. RLIMIT_MEMLOCK for pinned memory).
    ResourceLimit,
}

/// An error with a human-readable message (what `rdmx_last_error()` returns in C).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
        }
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;
