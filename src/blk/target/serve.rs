//! Serving one request of a session: access checks (the handle opened on this session,
//! the entity's grant), then the volume's IO. Sending the reply is `session.rs`'s job.

use super::session::{Opened, Sess};
use super::{Access, Inner, IoBuf, Mapping, Store, Volume};
use crate::error::{Error, ErrorKind, Result};
use crate::msgr::messenger::{InMessage, Messenger, OutMessage, Payload, RxSeg, SessionId};
use crate::rc::verbs::access;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

use crate::blk::proto::{
    self, BLOCK, INFO_ONE_SIDED, INFO_READ_ONLY, Info, MAX_IO, MSG_REPLY, Op, Reply, ReqHdr,
};

/// What serving a request produced.
pub(super) enum Served {
    /// The reply, and what it holds until the client acknowledged it: an IO buffer, or
    /// (`counted` without a buffer) a pool chunk; either counts against the session's quota.
    Reply {
        msg: OutMessage,
        buf: Option<IoBuf>,
        counted: bool,
    },
    /// A large file read found every IO buffer in use: the request waits, unserved.
    WaitBuf(InMessage),
}

pub(super) fn errno_reply(op: u8, req_id: u64, errno: i32) -> OutMessage {
    OutMessage::new(
        MSG_REPLY,
        Reply {
            op,
            status: errno as u32,
            req_id,
            len: 0,
            info: None,
        }
        .encode(),
    )
}

fn plain(msg: OutMessage) -> Served {
    Served::Reply {
        msg,
        buf: None,
        counted: false,
    }
}

impl Inner {
    /// The volume's description for a session that opened it: a memory volume's region and
    /// rkey are the session's own registration (none without read access).
    fn info(&self, o: &Opened) -> Option<Info> {
        let v = self.volumes.get(o.vol as usize)?;
        let (region_addr, region_rkey, mut flags) = match (&v.store, &o.mr) {
            (Store::Mem { .. }, Some(mr)) => (mr.addr, mr.rkey, INFO_ONE_SIDED),
            _ => (0, 0, 0),
        };
        if !o.access.may_write() {
            flags |= INFO_READ_ONLY;
        }
        Some(Info {
            vol: o.vol,
            block_size: BLOCK,
            size: v.size,
            region_addr,
            region_rkey,
            rdma_port: if flags & INFO_ONE_SIDED != 0 {
                self.rdma_port
            } else {
                0
            },
            flags,
        })
    }

    /// A one-sided registration of a memory volume for one session: READ for every grant,
    /// WRITE only for read-write ones. `None` when the target has no one-sided side.
    fn register_one_sided(&self, v: &Volume, a: Access) -> Result<Option<crate::msgr::MrInfo>> {
        let Store::Mem { map, .. } = &v.store else {
            return Ok(None);
        };
        let raw = self.raw_ctx.lock();
        let Some(ctx) = raw.as_ref() else {
            return Ok(None);
        };
        let acc = access::LOCAL_WRITE
            | access::REMOTE_READ
            | if a.may_write() {
                access::REMOTE_WRITE
            } else {
                0
            };
        // SAFETY: the mapping lives in the volume, which outlives the registration: it is
        // deregistered when the session ends or the target stops (`end_session`), and the
        // one-sided context is dropped before the volumes otherwise.
        unsafe { ctx.register(map.ptr, map.len, acc) }.map(Some)
    }

    /// Serves one request of session `s`.
    pub(super) fn serve(
        &self,
        m: &Messenger,
        s: SessionId,
        g: &mut Sess,
        msg: InMessage,
    ) -> Served {
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let hdr = match ReqHdr::decode(&msg.front) {
            Ok(h) => h,
            Err(id) => return plain(errno_reply(0, id.unwrap_or(0), libc::EPROTO)),
        };
        let op = hdr.op;
        let fail = |e: i32| plain(errno_reply(op, hdr.req_id, e));
        let Some(o) = Op::from_u8(op) else {
            return fail(libc::EOPNOTSUPP);
        };
        if o == Op::Open {
            let Some(i) = self
                .volumes
                .iter()
                .position(|v| v.name.as_bytes() == hdr.name)
            else {
                return fail(libc::ENOENT);
            };
            let v = &self.volumes[i];
            let Some(a) = self.acl.access(&v.name, g.entity.as_deref()) else {
                self.refused(s, g, &format!("open of volume '{}' not granted", v.name));
                return fail(libc::EACCES);
            };
            let vol = i as u32;
            if !g.opened.iter().any(|o| o.vol == vol) {
                let mr = match self.register_one_sided(v, a) {
                    Ok(mr) => mr,
                    Err(e) => {
                        log::warn!("rdmx-target: session {s:?}: one-sided registration: {e}");
                        return fail(libc::ENOMEM);
                    }
                };
                g.opened.push(Opened { vol, access: a, mr });
                log::info!(
                    "rdmx-target: session {s:?} ({}, entity {}) opened volume '{}' {}",
                    g.peer_text(),
                    g.entity_text(),
                    v.name,
                    if a.may_write() {
                        "read-write"
                    } else {
                        "read-only"
                    }
                );
            }
            let opened = g.opened.iter().find(|o| o.vol == vol);
            return plain(OutMessage::new(
                MSG_REPLY,
                Reply {
                    op,
                    status: 0,
                    req_id: hdr.req_id,
                    len: 0,
                    info: opened.and_then(|o| self.info(o)),
                }
                .encode(),
            ));
        }
        if (hdr.place.is_some() || hdr.imm_reply) && o != Op::Read
            || hdr.imm_reply && hdr.place.is_none()
        {
            return fail(libc::EINVAL);
        }
        // A handle is valid only on the session that opened it (unknown handles alike: no
        // answer tells a session which other volumes exist).
        let Some(opened) = g.opened.iter().find(|o| o.vol == hdr.vol).copied() else {
            self.refused(
                s,
                g,
                &format!("handle {} not opened on this session", hdr.vol),
            );
            return fail(libc::EBADF);
        };
        if matches!(o, Op::Write | Op::Flush) && !opened.access.may_write() {
            let name = &self.volumes[opened.vol as usize].name;
            self.refused(s, g, &format!("{o:?} on read-only volume '{name}'"));
            return fail(libc::EACCES);
        }
        let vol = &self.volumes[opened.vol as usize];
        let ok = |len: u32| Reply {
            op,
            status: 0,
            req_id: hdr.req_id,
            len,
            info: None,
        };
        match o {
            Op::Open => fail(libc::EINVAL),
            Op::Query => plain(OutMessage::new(
                MSG_REPLY,
                Reply {
                    info: self.info(&opened),
                    ..ok(0)
                }
                .encode(),
            )),
            Op::Flush => {
                if let Store::File { file } = &vol.store
                    && let Err(e) = file.sync_data()
                {
                    return fail(e.raw_os_error().unwrap_or(libc::EIO));
                }
                plain(OutMessage::new(MSG_REPLY, ok(0).encode()))
            }
            Op::Write => {
                if let Some(e) = proto::check_range(vol.size, hdr.offset, hdr.len) {
                    return fail(e as i32);
                }
                let mut msg = msg;
                let seg = match msg.data.pop() {
                    Some(s) if msg.data.is_empty() && s.len() == hdr.len as usize => s,
                    _ => return fail(libc::EINVAL),
                };
                if let Err(e) = write_seg(vol, hdr.offset, &seg) {
                    return fail(e);
                }
                drop(seg);
                self.stats
                    .bytes_written
                    .fetch_add(u64::from(hdr.len), Ordering::Relaxed);
                plain(OutMessage::new(MSG_REPLY, ok(hdr.len).encode()))
            }
            Op::Read => {
                if let Some(e) = proto::check_range(vol.size, hdr.offset, hdr.len) {
                    return fail(e as i32);
                }
                let len = hdr.len as usize;
                let (payload, buf, counted) = match &vol.store {
                    Store::Mem { map, .. } => {
                        // SAFETY: in range (checked); the region stays mapped and
                        // registered as long as the target (the messenger is closed
                        // before the volume goes, see `Drop for Target`).
                        let p = unsafe { map.ptr.add(hdr.offset as usize) };
                        // SAFETY: as above; "unmodified until sent" is the client's
                        // business as for any disk (a write racing a read of the same
                        // block returns either).
                        (unsafe { Payload::registered(p, len) }, None, false)
                    }
                    Store::File { file } => {
                        if len <= BLOCK as usize {
                            let mut c = match m.alloc_chunk() {
                                Ok(c) => c,
                                Err(_) => return fail(libc::EAGAIN),
                            };
                            if let Err(e) =
                                pread_full(file, &mut c.as_mut_slice()[..len], hdr.offset)
                            {
                                return fail(e);
                            }
                            c.set_len(len);
                            (Payload::Chunk(c), None, true)
                        } else {
                            let b = match self.take_buf() {
                                Ok(Some(b)) => b,
                                Ok(None) => {
                                    self.stats.requests.fetch_sub(1, Ordering::Relaxed);
                                    self.stats.io_buf_waits.fetch_add(1, Ordering::Relaxed);
                                    return Served::WaitBuf(msg);
                                }
                                Err(_) => return fail(libc::ENOMEM),
                            };
                            // SAFETY: the buffer is ours (out of the free list), MAX_IO long.
                            let sl = unsafe { std::slice::from_raw_parts_mut(b.map.ptr, len) };
                            if let Err(e) = pread_full(file, sl, hdr.offset) {
                                self.put_buf(b);
                                return fail(e);
                            }
                            // SAFETY: the buffer stays with the reply (backlog, then
                            // `bufs_out`) until its send completed, registered all along.
                            let p = unsafe { Payload::registered(b.map.ptr, len) };
                            (p, Some(b), true)
                        }
                    }
                };
                self.stats
                    .bytes_read
                    .fetch_add(u64::from(hdr.len), Ordering::Relaxed);
                let reply = match hdr.place {
                    // Asked for: the WRITE WITH IMMEDIATE is the whole answer (the value
                    // names the request), one packet for 4 KiB and no reply SEND.
                    Some((addr, rkey)) if hdr.imm_reply => {
                        self.stats.placed_reads.fetch_add(1, Ordering::Relaxed);
                        self.stats.imm_replies.fetch_add(1, Ordering::Relaxed);
                        OutMessage::immediate(hdr.req_id as u32).with_write(payload, addr, rkey)
                    }
                    // Into the client's buffer: one RDMA WRITE right before the reply's
                    // SEND (a bad address or rkey is the client QP's access error: the
                    // session faults and ends on both sides, nothing else).
                    Some((addr, rkey)) => {
                        self.stats.placed_reads.fetch_add(1, Ordering::Relaxed);
                        OutMessage::new(MSG_REPLY, ok(hdr.len).encode())
                            .with_write(payload, addr, rkey)
                    }
                    None => OutMessage::new(MSG_REPLY, ok(hdr.len).encode()).with(payload),
                };
                Served::Reply {
                    msg: reply,
                    buf,
                    counted,
                }
            }
        }
    }

    /// An IO buffer: a free one, else a new one while fewer than `limits.io_bufs` exist
    /// (`None`: all in use).
    fn take_buf(&self) -> Result<Option<IoBuf>> {
        if let Some(b) = self.bufs_free.lock().pop() {
            return Ok(Some(b));
        }
        if self
            .bufs_made
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limits.io_bufs).then_some(n + 1)
            })
            .is_err()
        {
            return Ok(None);
        }
        let made = (|| {
            let map = Mapping::new(MAX_IO as usize)?;
            let ctx = self
                .msgr_ctx
                .lock()
                .clone()
                .ok_or_else(|| Error::new(ErrorKind::Closed, "rdmx-target: stopping"))?;
            // SAFETY: the mapping lives in the IoBuf with its handle; the handle is dropped
            // (put back) before the mapping is unmapped (field order). The buffer serves
            // every session in turn: registered with what the messenger sends from (no
            // remote right with scoped rkeys: each reply's reader gets a window of its own).
            let reg = unsafe { ctx.rcache().get(map.ptr, map.len, ctx.send_access()) }?;
            Ok(IoBuf { _reg: reg, map })
        })();
        if made.is_err() {
            self.bufs_made.fetch_sub(1, Ordering::AcqRel);
        }
        made.map(Some)
    }

    /// Puts an IO buffer back on the free list.
    pub(super) fn put_buf(&self, b: IoBuf) {
        self.bufs_free.lock().push(b);
    }
}

fn pread_full(file: &File, buf: &mut [u8], offset: u64) -> std::result::Result<(), i32> {
    use std::os::unix::fs::FileExt;
    match file.read_exact_at(buf, offset) {
        Ok(()) => Ok(()),
        Err(e) => Err(e.raw_os_error().unwrap_or(libc::EIO)),
    }
}
fn write_seg(vol: &Volume, offset: u64, seg: &RxSeg) -> std::result::Result<(), i32> {
    match &vol.store {
        Store::Mem { map, .. } => {
            let mut at = offset as usize;
            for c in seg.chunks() {
                // SAFETY: `offset + seg.len()` is within the region (checked by the caller).
                unsafe { std::ptr::copy_nonoverlapping(c.as_ptr(), map.ptr.add(at), c.len()) };
                at += c.len();
            }
            Ok(())
        }
        Store::File { file } => {
            let iov: Vec<libc::iovec> = seg
                .chunks()
                .map(|c| libc::iovec {
                    iov_base: c.as_ptr() as *mut libc::c_void,
                    iov_len: c.len(),
                })
                .collect();
            let total: usize = iov.iter().map(|v| v.iov_len).sum();
            // SAFETY: every iovec names a chunk of `seg`, alive across the call; the
            // kernel only reads them.
            let n = unsafe {
                libc::pwritev(
                    file.as_raw_fd(),
                    iov.as_ptr(),
                    iov.len() as i32,
                    offset as libc::off_t,
                )
            };
            if n < 0 {
                return Err(std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO));
            }
            if n as usize != total {
                return Err(libc::EIO);
            }
            Ok(())
        }
    }
}
