//! The messenger's registered memory and the preparation of outgoing data.
//!
//! Three pools, all carved from 2 MiB arenas registered once:
//! - `data`: 4 KiB chunks, local write (and, only without `msgr_scoped_rkeys`, remote
//!   read, + remote write with `msgr_eager_write`, for the granted receive chunks): receive
//!   payload areas (and so the received segments handed to the application), rendezvous
//!   READ targets, descriptor blocks, `alloc_chunk`, copies of small unregistered segments;
//! - `slots`: 512-byte header slots, local write: one per posted receive and per SEND;
//! - `copy`: 64 KiB chunks for copies of large unregistered segments (fewer descriptors:
//!   a 4 MiB copy is 64 parts), made on first use.
//!
//! With `msgr_scoped_rkeys` no registration here has a remote right: a peer reaches a
//! chunk only through a memory window bound to its own QP (`scope.rs`).
//!
//! Preparing a payload turns it into parts (address, length, lkey, rkey) plus an owner that
//! keeps the memory alive and releases it when the message is acknowledged (or fails).

use crate::error::{Error, ErrorKind, Result};
use crate::mem::pool::{Chunk, Pool};
use crate::mem::rcache::Handle;
use crate::msgr::Context;
use crate::rc::verbs::access;
use parking_lot::Mutex;
use smallvec::SmallVec;
use std::sync::Arc;

use super::scope::Windows;
use super::types::{Payload, RxSeg, TxChunk};
use super::wire::{MAX_SEG_LEN, PAYLOAD_MAX, Part, SLOT};

const COPY_CHUNK: usize = 64 << 10;

/// The pools.
pub struct Buffers {
    pub data: Arc<Pool>,
    pub slots: Arc<Pool>,
    copy: Mutex<Option<Arc<Pool>>>,
    ctx: Context,
    pool_chunks: u32,
}

impl Buffers {
    /// `remote_write`: peers may RDMA WRITE eager data into the receive chunks they were
    /// granted (`msgr_eager_write`), so the data pool is registered with remote write.
    /// With scoped rkeys (`Context::scoped_rkeys`) the pools take no remote right at all:
    /// windows give each peer what it may reach.
    pub fn new(ctx: &Context, pool_chunks: u32, remote_write: bool) -> Result<Buffers> {
        let mut rights = ctx.send_access();
        if remote_write && !ctx.scoped_rkeys() {
            rights |= access::REMOTE_WRITE;
        }
        let data = ctx.pool(PAYLOAD_MAX, pool_chunks, rights)?;
        // A header slot per posted receive and per SEND in flight: as many as data chunks
        // covers every case (each receive also holds a data chunk).
        let slots = ctx.pool(SLOT, pool_chunks, access::LOCAL_WRITE)?;
        Ok(Buffers {
            data: Arc::new(data),
            slots: Arc::new(slots),
            copy: Mutex::new(None),
            ctx: ctx.clone(),
            pool_chunks,
        })
    }

    fn copy_pool(&self) -> Result<Arc<Pool>> {
        let mut g = self.copy.lock();
        if let Some(p) = &*g {
            return Ok(Arc::clone(p));
        }
        let cap = ((self.pool_chunks as usize * PAYLOAD_MAX) / COPY_CHUNK).max(64) as u32;
        let p = Arc::new(self.ctx.pool(COPY_CHUNK, cap, self.ctx.send_access())?);
        *g = Some(Arc::clone(&p));
        Ok(p)
    }

    /// Chunks of the copy pool in use (0 before its first use).
    pub fn copy_in_use(&self) -> u32 {
        self.copy
            .lock()
            .as_ref()
            .map_or(0, |p| p.stats().chunks_in_use)
    }

    pub fn alloc(&self) -> Result<TxChunk> {
        let chunk = self.data.get()?;
        Ok(TxChunk {
            len: chunk.len,
            chunk: Some(chunk),
            pool: Arc::clone(&self.data),
        })
    }

    /// Turns a payload into parts and an owner. Returns the bytes copied too.
    pub fn prepare(&self, p: Payload) -> Result<(TxSeg, u64)> {
        let len = p.len();
        if len > MAX_SEG_LEN {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("send: a data segment of {len} bytes; at most {MAX_SEG_LEN}"),
            ));
        }
        let mut parts: SmallVec<[Part; 1]> = SmallVec::new();
        let mut lkeys: SmallVec<[u32; 1]> = SmallVec::new();
        // Chunks that follow each other in one region make one part (fewer descriptors).
        let mut push = |c: &Chunk, n: usize| {
            if let (Some(last), Some(&lk)) = (parts.last_mut(), lkeys.last())
                && lk == c.lkey
                && last.rkey == c.rkey
                && last.addr + u64::from(last.len) == c.addr_u64()
                && u64::from(last.len) + n as u64 <= u64::from(u32::MAX)
            {
                last.len += n as u32;
                return;
            }
            parts.push(part(c, n));
            lkeys.push(c.lkey);
        };
        let mut copied = 0;
        let owner = match p {
            Payload::Chunk(mut c) => {
                let Some(chunk) = c.take() else {
                    return Err(Error::fixed(
                        ErrorKind::InvalidArgument,
                        "send: an empty TxChunk",
                    ));
                };
                if c.len > 0 {
                    push(&chunk, c.len);
                }
                Owner::Chunks(vec![chunk], Arc::clone(&c.pool))
            }
            Payload::Received(seg) => {
                let mut left = seg.len;
                for c in &seg.chunks {
                    let n = left.min(c.len);
                    if n > 0 {
                        push(c, n);
                    }
                    left -= n;
                }
                Owner::Rx { _seg: seg }
            }
            Payload::Registered(r) => {
                if r.len == 0 {
                    Owner::None
                } else {
                    // SAFETY: `Payload::registered`'s contract: the caller keeps the memory
                    // mapped and unmodified until the send completed, and follows the
                    // cache's invalidation rule before unmapping it.
                    let h = unsafe {
                        self.ctx
                            .rcache()
                            .get(r.addr as *mut u8, r.len, self.ctx.send_access())
                    }?;
                    let seg = TxSeg {
                        len,
                        parts: smallvec::smallvec![Part {
                            addr: r.addr as u64,
                            len: r.len as u32,
                            rkey: h.rkey(),
                        }],
                        lkeys: smallvec::smallvec![h.lkey()],
                        windows: Windows::default(),
                        _owner: Owner::Rcache(Some(h), self.ctx.clone()),
                    };
                    return Ok((seg, 0));
                }
            }
            p @ (Payload::Copy(_) | Payload::CopyFrom(_)) => {
                let bytes: &[u8] = match &p {
                    Payload::Copy(v) => v,
                    // SAFETY: `Payload::copy_from`'s contract: the memory is readable for the
                    // duration of the `send` call, which is running (prepare is called by it).
                    Payload::CopyFrom(r) if r.len > 0 => unsafe {
                        std::slice::from_raw_parts(r.addr as *const u8, r.len)
                    },
                    _ => &[],
                };
                copied = bytes.len() as u64;
                let pool = if bytes.len() <= PAYLOAD_MAX {
                    Arc::clone(&self.data)
                } else {
                    self.copy_pool()?
                };
                let mut chunks = Vec::new();
                let mut owner_err = None;
                for piece in bytes.chunks(pool.chunk_size()) {
                    match pool.get() {
                        Ok(c) => {
                            // SAFETY: the chunk is ours (just taken from the pool) and
                            // `piece` is at most the chunk size.
                            unsafe {
                                std::ptr::copy_nonoverlapping(piece.as_ptr(), c.addr, piece.len())
                            };
                            push(&c, piece.len());
                            chunks.push(c);
                        }
                        Err(e) => {
                            owner_err = Some(e);
                            break;
                        }
                    }
                }
                let owner = Owner::Chunks(chunks, pool);
                if let Some(e) = owner_err {
                    drop(owner);
                    return Err(e);
                }
                owner
            }
        };
        Ok((
            TxSeg {
                len,
                parts,
                lkeys,
                windows: Windows::default(),
                _owner: owner,
            },
            copied,
        ))
    }
}

/// The parts a received segment makes when sent on (runs of adjacent chunks).
pub fn runs(chunks: &[Chunk]) -> usize {
    let mut n = 0;
    let mut end = None;
    for c in chunks {
        if end != Some((c.addr_u64(), c.rkey)) {
            n += 1;
        }
        end = Some((c.addr_u64() + c.len as u64, c.rkey));
    }
    n
}

fn part(c: &Chunk, len: usize) -> Part {
    Part {
        addr: c.addr_u64(),
        len: len as u32,
        rkey: c.rkey,
    }
}

/// What keeps a prepared segment's memory alive; dropping it releases the memory.
pub enum Owner {
    None,
    Chunks(Vec<Chunk>, Arc<Pool>),
    /// Held only to be dropped (returns the chunks).
    Rx {
        _seg: RxSeg,
    },
    Rcache(Option<Handle>, Context),
}

impl Drop for Owner {
    fn drop(&mut self) {
        match self {
            Owner::Chunks(chunks, pool) => {
                for c in chunks.drain(..) {
                    let _ = pool.put(c);
                }
            }
            Owner::Rcache(h, ctx) => {
                if let Some(h) = h.take() {
                    let _ = ctx.rcache().put(h);
                }
            }
            Owner::None | Owner::Rx { .. } => {}
        }
    }
}

/// A prepared data segment.
pub struct TxSeg {
    pub len: usize,
    /// The memory, in order, with the rkeys the receiver READs with.
    pub parts: SmallVec<[Part; 1]>,
    /// The lkey of each part (for SGEs).
    pub lkeys: SmallVec<[u32; 1]>,
    /// The windows the parts are exposed through to the current link's peer (scoped
    /// rkeys, rendezvous): declared before `_owner`, so they are invalidated before the
    /// memory is released.
    pub windows: Windows,
    /// Released when the segment is dropped (acknowledged or failed).
    pub _owner: Owner,
}

impl TxSeg {
    /// Ends the windows of the link that is gone (a replay exposes the parts again).
    pub fn unexpose(&mut self) {
        self.windows.clear();
    }
}
