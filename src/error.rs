//! The crate-wide error: a kind (which maps 1:1 onto a C status code) and a message that
//! names what was wrong, the value given and what is allowed.

use crate::rc::PostError;
use std::borrow::Cow;
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
    /// Authentication failed or is misconfigured: a wrong or missing key, an unknown
    /// entity, a peer that would not authenticate, a keyring others may read; or an
    /// authenticated entity was refused access (a block volume its grants do not cover).
    Auth,
}

/// An error with a human-readable message (what `rdmx_last_error()` returns in C).
///
/// The message is built only when someone asks for it: a fixed text is a `&'static str`,
/// and a refused post carries the engine's typed refusal ([`PostError`]) and formats it on
/// `Display`/`message()`. So a refusal on the hot path (a full send queue) allocates
/// nothing until the C boundary writes it into its reused last-error buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    detail: Detail,
}

/// What an [`Error`] says, formatted lazily.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Detail {
    Text(Cow<'static, str>),
    Post(PostError),
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            detail: Detail::Text(Cow::Owned(message.into())),
        }
    }

    /// An error with a fixed message: no allocation.
    pub const fn fixed(kind: ErrorKind, message: &'static str) -> Self {
        Error {
            kind,
            detail: Detail::Text(Cow::Borrowed(message)),
        }
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message. Borrowed for a text error; formatted (allocated) here for a typed one
    /// such as a refused post: write it with `Display` to avoid the allocation.
    pub fn message(&self) -> Cow<'_, str> {
        match &self.detail {
            Detail::Text(t) => Cow::Borrowed(t),
            Detail::Post(p) => Cow::Owned(p.to_string()),
        }
    }

    /// The engine's typed refusal, if this error is one.
    pub fn post_error(&self) -> Option<&PostError> {
        match &self.detail {
            Detail::Post(p) => Some(p),
            Detail::Text(_) => None,
        }
    }
}

/// A refused post keeps its type (and its kind): converting formats nothing.
impl From<PostError> for Error {
    fn from(e: PostError) -> Self {
        Error {
            kind: e.kind(),
            detail: Detail::Post(e),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.detail {
            Detail::Text(t) => f.write_str(t),
            Detail::Post(p) => fmt::Display::fmt(p, f),
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;
