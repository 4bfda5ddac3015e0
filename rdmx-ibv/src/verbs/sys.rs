//! A non-blocking pipe of fixed-size records: what libibverbs reads completion channel
//! events and async events from (it `read()`s whole records from the read end).

use rdmx::error::{Error, ErrorKind, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A pipe whose read end is handed to the application (via libibverbs) and whose write
/// end the provider writes records to, never blocking.
#[derive(Debug)]
pub(crate) struct RecordPipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl RecordPipe {
    /// A pipe, both ends close-on-exec, the write end non-blocking (the read end blocks
    /// unless the application sets O_NONBLOCK, as with a kernel channel fd).
    pub(crate) fn new() -> Result<RecordPipe> {
        todo!()
    }

    /// The read end.
    pub(crate) fn read_fd(&self) -> RawFd {
        self.read.as_raw_fd()
    }

    /// Writes one record whole (records are at most PIPE_BUF bytes, so a write is atomic).
    /// False when the pipe is full (nothing written).
    pub(crate) fn write_record(&self, rec: &[u8]) -> bool {
        let _ = (rec, &self.write);
        todo!()
    }
}

#[allow(dead_code)]
fn os_error(what: &str) -> Error {
    Error::new(
        ErrorKind::Io,
        format!("{what}: {}", std::io::Error::last_os_error()),
    )
}

#[allow(dead_code)]
unsafe fn owned(fd: RawFd) -> OwnedFd {
    // SAFETY: the caller passes a fresh descriptor it owns.
    unsafe { OwnedFd::from_raw_fd(fd) }
}
