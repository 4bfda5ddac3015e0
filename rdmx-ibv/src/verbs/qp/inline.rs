//! Inline sends: IBV_SEND_INLINE data is copied at post time (the application may reuse
//! its buffer at once), into a per-QP arena the engine reaches like any registered memory:
//! `max_send_wr + 1` slots of `max_inline_data` bytes, registered under an lkey of its own.
//!
//! Why `+ 1` slots and one inline WR per engine post: the engine completes send WRs in
//! order and holds at most `max_send_wr` of them, so when every WR before the `n`th has
//! been posted, WR `n - (max_send_wr + 1)` has completed and its slot (`n mod
//! (max_send_wr + 1)`) is free. `Qp::post_send` therefore writes an inline WR's slot only
//! after the WRs before it were accepted (retransmissions read the slot until the WR
//! completes).

use rdmx::error::{Error, ErrorKind, Result};
use rdmx::provider::soft::mr::MrTable;
use rdmx::rc::Sge;

/// The arena of one QP.
#[derive(Debug)]
pub(crate) struct InlineArena {
    buf: Box<[u8]>,
    slot: usize,
    slots: u64,
    lkey: u32,
}

impl InlineArena {
    /// Registers `(max_send_wr + 1) x max_inline` bytes in `mrs`.
    pub(crate) fn new(mrs: &MrTable, max_send_wr: u32, max_inline: u32) -> Result<InlineArena> {
        let slots = u64::from(max_send_wr) + 1;
        let mut buf = vec![0u8; slots as usize * max_inline as usize].into_boxed_slice();
        // SAFETY: `buf` is owned by the arena and freed only after `deregister` succeeded
        // (`release`, called by the QP's teardown once the QP left the device and its
        // engine was reset, so nothing reads the slots any more).
        let r = unsafe { mrs.register(buf.as_mut_ptr(), buf.len(), 0) }?;
        Ok(InlineArena {
            buf,
            slot: max_inline as usize,
            slots,
            lkey: r.lkey,
        })
    }

    /// Copies the bytes `sges` name into the slot of the WR with sequence number `seq` and
    /// returns the SGE that names them there.
    ///
    /// # Safety
    /// Each SGE's `[addr, addr + length)` is readable for the duration of the call.
    pub(crate) unsafe fn fill(&mut self, seq: u64, sges: &[Sge]) -> Result<Sge> {
        let total: u64 = sges.iter().map(|s| u64::from(s.length)).sum();
        if total > self.slot as u64 {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "post_send: {total} bytes of inline data exceed max_inline_data {}",
                    self.slot
                ),
            ));
        }
        let start = (seq % self.slots) as usize * self.slot;
        let mut at = start;
        for s in sges {
            let len = s.length as usize;
            if len == 0 {
                continue;
            }
            // SAFETY: the caller guarantees the range is readable for this call; the
            // destination is inside our slot (checked total above).
            let src = unsafe { std::slice::from_raw_parts(s.addr as *const u8, len) };
            self.buf[at..at + len].copy_from_slice(src);
            at += len;
        }
        Ok(Sge {
            addr: self.buf[start..].as_ptr() as u64,
            length: total as u32,
            lkey: self.lkey,
        })
    }

    /// Deregisters and frees the arena (the QP no longer reads it). If the table refuses
    /// (a WR still holds it: a bug), the memory is leaked rather than freed under the
    /// engine, and logged.
    pub(crate) fn release(self, mrs: &MrTable) {
        if let Err(e) = mrs.deregister(self.lkey) {
            log::error!(target: "rdmx::ibv", "inline arena kept (leaked): {e}");
            Box::leak(self.buf);
        }
    }
}
