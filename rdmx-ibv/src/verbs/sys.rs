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
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: pipe2 writes two descriptors into the live array we pass.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(Error::new(
                ErrorKind::Io,
                format!("pipe2: {}", std::io::Error::last_os_error()),
            ));
        }
        // SAFETY: both descriptors were just created by pipe2 and are owned by nobody else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: fcntl on a descriptor we own; no pointers.
        let fl = unsafe { libc::fcntl(write.as_raw_fd(), libc::F_GETFL) };
        let set = if fl < 0 {
            -1
        } else {
            // SAFETY: as above.
            unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK) }
        };
        if set < 0 {
            return Err(Error::new(
                ErrorKind::Io,
                format!("fcntl(O_NONBLOCK): {}", std::io::Error::last_os_error()),
            ));
        }
        Ok(RecordPipe { read, write })
    }

    /// The read end.
    pub(crate) fn read_fd(&self) -> RawFd {
        self.read.as_raw_fd()
    }

    /// Writes one record whole (records are at most PIPE_BUF bytes, so a write is atomic:
    /// all or nothing). False when the pipe is full (nothing written).
    pub(crate) fn write_record(&self, rec: &[u8]) -> bool {
        debug_assert!(rec.len() <= libc::PIPE_BUF);
        loop {
            // SAFETY: writes `rec.len()` bytes from a live slice to our own pipe's write end.
            let n = unsafe { libc::write(self.write.as_raw_fd(), rec.as_ptr().cast(), rec.len()) };
            if n == rec.len() as isize {
                return true;
            }
            if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_go_through_whole_and_a_full_pipe_refuses_without_blocking() {
        let p = RecordPipe::new().unwrap();
        assert!(p.write_record(&7u64.to_ne_bytes()));
        let mut buf = [0u8; 8];
        // SAFETY: reads 8 bytes into a live buffer from our pipe's read end.
        let n = unsafe { libc::read(p.read_fd(), buf.as_mut_ptr().cast(), 8) };
        assert_eq!((n, u64::from_ne_bytes(buf)), (8, 7));
        let mut written = 0;
        while p.write_record(&[0u8; 16]) {
            written += 1;
            assert!(written < 1 << 20, "a pipe holds less than 16 MiB");
        }
        assert!(written > 0);
    }
}
