//! One 4 KiB block request, submitted and waited for (bounded): shared by the block tests
//! (`tests/blk_target_security.rs`, `rdmx-target/tests/target_bin.rs`).

use rdmx::blk::proto::Op;
use rdmx::blk::{BlkClient, Req};
use std::time::{Duration, Instant};

/// `op` on 4 KiB at offset 0 through `c`, waited for at most `timeout`; its status.
pub fn io_4k(c: &mut BlkClient, op: Op, buf: &mut [u8], timeout: Duration) -> i32 {
    let req = Req {
        op,
        offset: 0,
        len: 4096,
        buf: buf.as_mut_ptr(),
        cookie: 1,
    };
    // SAFETY: `buf` outlives the request, which is waited for below.
    assert_eq!(unsafe { c.submit(&[req]) }.unwrap(), 1);
    let mut out = Vec::new();
    let end = Instant::now() + timeout;
    while out.is_empty() {
        assert!(
            Instant::now() < end,
            "a request did not complete within {timeout:?}"
        );
        c.poll(&mut out, 1, 1, Duration::from_millis(100)).unwrap();
    }
    out[0].status
}
