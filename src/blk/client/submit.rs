//! Submission: each request checked and sent down its path, in order. Rpc mode (and
//! flushes in either mode): a request message, write data from the caller's buffer, a
//! read's buffer named for the target's RDMA WRITE. One-sided requests are batched and
//! posted by `one_sided.rs`.

use super::super::proto::{MAX_IO, MSG_REQ, Op, ReqHdr};
use super::one_sided::Prepared;
use super::state::Pending;
use super::{BlkClient, Completion, Req};
use crate::error::{Error, ErrorKind, Result};
use crate::msgr::messenger::{OutMessage, Payload};
use crate::rc::verbs::access;

impl BlkClient {
    /// Submits `reqs` in order and returns how many were accepted: fewer when a queue is
    /// full (poll, then submit the rest). A request the client can tell is wrong (length
    /// 0 or above 1 MiB, NULL buffer) is accepted and completes with `-EINVAL`; range and
    /// alignment are the target's to judge (it answers `-EINVAL`/`-ERANGE`). `Closed` once
    /// the target is gone.
    ///
    /// # Safety
    /// Each request's `buf` must be valid for `len` bytes (writable for reads) and stay so,
    /// untouched by the caller, until its completion was returned by `poll` or the client
    /// was dropped (a read's buffer is open to the target's RDMA WRITE until then: dropping
    /// the client closes its connection before it returns).
    pub unsafe fn submit(&mut self, reqs: &[Req]) -> Result<usize> {
        let mut n = 0;
        let mut batch: Vec<Prepared> = Vec::new();
        for r in reqs {
            {
                let st = self.sh.st.lock();
                if let Some((kind, why)) = &st.dead {
                    if n > 0 {
                        return Ok(n);
                    }
                    return Err(Error::new(*kind, why.clone()));
                }
            }
            let bad = matches!(r.op, Op::Read | Op::Write)
                && (r.len == 0 || r.len > MAX_IO || r.buf.is_null());
            if bad || matches!(r.op, Op::Open | Op::Query) {
                if !batch.is_empty() {
                    // Keep completions in order of acceptance: post what waits first.
                    let want = batch.len();
                    let k = self.post_one_sided(&mut batch)?;
                    n += k;
                    if k < want {
                        return Ok(n);
                    }
                }
                let mut st = self.sh.st.lock();
                st.done.push_back(Completion {
                    cookie: r.cookie,
                    status: -libc::EINVAL,
                    len: 0,
                });
                n += 1;
                continue;
            }
            if self.one.is_some() && r.op != Op::Flush {
                // One-sided: prepared here, posted as one batch (one post, one doorbell).
                match self.prepare_one_sided(r, &mut batch) {
                    Ok(()) => {}
                    Err(e) => {
                        let k = self.post_one_sided(&mut batch)?;
                        return if n + k > 0 { Ok(n + k) } else { Err(e) };
                    }
                }
                continue;
            }
            if !batch.is_empty() {
                let want = batch.len();
                let k = self.post_one_sided(&mut batch)?;
                n += k;
                if k < want {
                    return Ok(n);
                }
            }
            if !self.submit_rpc(r)? {
                return Ok(n);
            }
            n += 1;
        }
        n += self.post_one_sided(&mut batch)?;
        Ok(n)
    }

    fn submit_rpc(&mut self, r: &Req) -> Result<bool> {
        let id = self.next_id;
        // A read names its buffer for the target's RDMA WRITE: registered with local +
        // remote write (read buffers only; writes ask for remote read), a cache hit after
        // the first use (or within a `register`ed area, upgraded once).
        let reg = if r.op == Op::Read {
            // SAFETY: `submit`'s contract keeps the buffer mapped until its completion;
            // the handle is put back when the request finishes (before the completion is
            // returned) or when the client is dropped.
            Some(unsafe {
                self.msgr.context().rcache().get(
                    r.buf,
                    r.len as usize,
                    access::LOCAL_WRITE | access::REMOTE_WRITE,
                )
            }?)
        } else {
            None
        };
        let hdr = ReqHdr {
            op: r.op as u8,
            vol: self.vol,
            req_id: id,
            offset: r.offset,
            len: if r.op == Op::Flush { 0 } else { r.len },
            place: reg.as_ref().map(|h| (r.buf as u64, h.rkey())),
            imm_reply: reg.is_some(),
            name: Vec::new(),
        };
        let mut msg = OutMessage::new(MSG_REQ, hdr.encode());
        if r.op == Op::Write {
            // SAFETY: `submit`'s contract: valid and untouched until the completion, which
            // waits for the send's acknowledgement.
            msg = msg.with(unsafe { Payload::registered(r.buf, r.len as usize) });
        }
        // Held across `send` so that a worker thread's callbacks for this request find it.
        let mut st = self.sh.st.lock();
        st.last_id = id;
        st.inflight.insert(
            id,
            Pending {
                cookie: r.cookie,
                op: r.op,
                buf: r.buf as usize,
                len: hdr.len,
                reg,
                replied: None,
                acked: false,
            },
        );
        match self.msgr.send(self.session, msg) {
            Ok(sid) => {
                st.by_send.insert(sid, id);
                self.next_id += 1;
                Ok(true)
            }
            Err(e) => {
                if let Some(h) = st.inflight.remove(&id).and_then(|p| p.reg) {
                    let _ = self.msgr.context().rcache().put(h);
                }
                match e.kind() {
                    ErrorKind::Full => Ok(false),
                    _ => Err(e.error),
                }
            }
        }
    }
}
