//! The messenger's callbacks for the client's session: replies (by message, or by a placed
//! read's immediate value), send acknowledgements and the session's end, each finishing
//! what it completes in the shared state.

use std::net::SocketAddr;
use std::sync::Arc;

use super::super::proto::{MSG_REPLY, Op, Reply};
use super::state::{Shared, put_back};
use crate::error::{Error, ErrorKind};
use crate::msgr::messenger::{Dispatcher, InMessage, MSG_TYPE_IMM, Messenger, SendId, SessionId};

pub(super) struct Disp {
    pub(super) sh: Arc<Shared>,
}

impl Disp {
    /// A placed read answered by the target's WRITE WITH IMMEDIATE (`REQ_IMM_REPLY`): the
    /// value is the low half of the request id; the data is in the caller's buffer (the
    /// WRITE landed before the messenger delivered this, RC order).
    fn on_imm_reply(&self, m: &Messenger, front: &[u8]) {
        let Ok(tag) = <[u8; 4]>::try_from(front) else {
            return;
        };
        let tag = u64::from(u32::from_le_bytes(tag));
        let mut st = self.sh.st.lock();
        // The newest id with these low bits, not newer than the newest sent.
        let mut id = (st.last_id & !0xffff_ffff) | tag;
        if id > st.last_id {
            id = id.wrapping_sub(1 << 32);
        }
        let Some(p) = st
            .inflight
            .get_mut(&id)
            .filter(|p| p.op == Op::Read && p.reg.is_some() && p.replied.is_none())
        else {
            st.counters.stray_replies += 1;
            return;
        };
        p.replied = Some(0);
        p.acked = true;
        let len = p.len;
        st.counters.placed_reads += 1;
        st.counters.placed_bytes += u64::from(len);
        st.counters.imm_replies += 1;
        self.sh.finish(&mut st, id);
        put_back(m, &mut st);
    }
}

impl Dispatcher for Disp {
    fn on_connect(&self, _m: &Messenger, _s: SessionId, _peer: SocketAddr, _incoming: bool) {
        self.sh.st.lock().connected = true;
    }

    fn on_message(&self, m: &Messenger, _s: SessionId, msg: InMessage) {
        if msg.msg_type == MSG_TYPE_IMM {
            return self.on_imm_reply(m, &msg.front);
        }
        if msg.msg_type != MSG_REPLY {
            return;
        }
        let Some(r) = Reply::decode(&msg.front) else {
            return;
        };
        let mut st = self.sh.st.lock();
        let Some(p) = st.inflight.get_mut(&r.req_id) else {
            if r.op == Op::Open as u8 || r.op == Op::Query as u8 || r.op == 0 {
                st.control.insert(r.req_id, r);
            } else {
                // A reply for a request no longer here (answered twice, or never asked):
                // its data (if any) is not copied anywhere, nothing completes.
                st.counters.stray_replies += 1;
            }
            return;
        };
        let mut status = -(r.status as i32);
        let (mut placed, mut copied) = (0, 0);
        if status == 0 && p.op == Op::Read {
            match msg.data.first() {
                // The target wrote the data into the caller's buffer before this reply
                // (same connection, RC order): nothing to move.
                None if p.reg.is_some() && r.len == p.len => placed = p.len,
                Some(seg) if seg.len() == p.len as usize && r.len == p.len => {
                    // A target that does not place reads: pool chunk -> caller buffer.
                    copied = p.len;
                    let mut at = p.buf;
                    for c in seg.chunks() {
                        // SAFETY: the caller's buffer holds `p.len` bytes and stays valid
                        // until its completion is returned (the `Req` contract).
                        unsafe {
                            std::ptr::copy_nonoverlapping(c.as_ptr(), at as *mut u8, c.len())
                        };
                        at += c.len();
                    }
                }
                _ => status = -libc::EIO,
            }
        }
        p.replied = Some(status);
        // A reply means the target received the request: reads have nothing more to wait
        // for; writes wait for the acknowledgement (their buffer may be replayed until
        // then), which the reply's header normally carried already.
        if p.op != Op::Write {
            p.acked = true;
        }
        if status == 0 && placed > 0 {
            st.counters.placed_reads += 1;
            st.counters.placed_bytes += u64::from(placed);
        }
        if status == 0 && copied > 0 {
            st.counters.copied_reads += 1;
            st.counters.copied_bytes += u64::from(copied);
        }
        self.sh.finish(&mut st, r.req_id);
        put_back(m, &mut st);
    }

    fn on_send_complete(
        &self,
        m: &Messenger,
        _s: SessionId,
        id: SendId,
        status: crate::error::Result<()>,
    ) {
        let mut st = self.sh.st.lock();
        let Some(req_id) = st.by_send.remove(&id) else {
            return;
        };
        let mut lost = None;
        if let Some(p) = st.inflight.get_mut(&req_id) {
            p.acked = true;
            if status.is_err() && p.replied.is_none() {
                p.replied = Some(-libc::EIO);
                lost = Some(p.cookie);
            }
        }
        if let Some(cookie) = lost {
            st.session_failed.insert(cookie);
        }
        self.sh.finish(&mut st, req_id);
        put_back(m, &mut st);
    }

    fn on_reset(&self, m: &Messenger, _s: SessionId, why: &Error) {
        let mut st = self.sh.st.lock();
        // A refused authentication stays an Auth error (RDMX_AUTH): retrying cannot help.
        let kind = if why.kind() == ErrorKind::Auth {
            ErrorKind::Auth
        } else {
            ErrorKind::Closed
        };
        self.sh.fail_all(
            &mut st,
            kind,
            format!("the session to the target ended: {why}"),
        );
        put_back(m, &mut st);
    }
}
