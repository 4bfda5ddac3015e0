//! `Mode::Read`: reads and writes as one-sided RDMA READ/WRITE between the caller's buffer
//! and the volume's region, on a connection of its own: connecting it, preparing and
//! posting batches of work requests, reaping their completions, and waiting on it.

use rustc_hash::FxHashMap as HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::super::proto::{INFO_ONE_SIDED, INFO_READ_ONLY, Info, Op};
use super::{BlkClient, Completion, Req};
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::mem::rcache::Handle;
use crate::msgr::{Connection, Context};
use crate::provider::types::{SendReq, Wc};
use crate::rc::memory::Sge;
use crate::rc::verbs::{WcStatus, WrOpcode, access, send_flags};

/// A one-sided request prepared for a batched post.
pub(super) struct Prepared {
    /// None: failed locally (`errno`).
    wr: Option<SendReq>,
    cookie: u64,
    len: u32,
    handle: Option<Handle>,
    errno: i32,
}

/// One-sided access to a memory volume.
pub(super) struct OneSided {
    pub(super) ctx: Context,
    pub(super) conn: Connection,
    region_addr: u64,
    rkey: u32,
    /// The target granted this session read access only (`INFO_READ_ONLY`).
    read_only: bool,
    /// WR cookie -> (request cookie, len, registration of the caller's buffer).
    pub(super) inflight: HashMap<u64, (u64, u32, Handle)>,
    next: u64,
    wcs: Vec<Wc>,
}

impl BlkClient {
    pub(super) fn one_sided(
        config: &Config,
        target: SocketAddr,
        info: &Info,
        deadline: Instant,
    ) -> Result<OneSided> {
        if info.flags & INFO_ONE_SIDED == 0 || info.rdma_port == 0 {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "mode=read needs a memory volume (this one is a file: use mode=rpc)",
            ));
        }
        let ctx = Context::new(config)?;
        let addr = SocketAddr::new(target.ip(), info.rdma_port);
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(100));
        let conn = ctx.connect(&addr.to_string(), left)?;
        // The region and its rkey come from the Open reply (this session's own
        // registration): the target's one-sided hello discloses no region.
        if info.region_rkey == 0 || info.region_addr == 0 {
            return Err(Error::new(
                ErrorKind::Io,
                "the target's Open reply names no one-sided region for this volume",
            ));
        }
        let wcs = vec![
            Wc {
                cookie: 0,
                status: WcStatus::Success,
                opcode: crate::rc::verbs::WcOpcode::Send,
                byte_len: 0,
                imm: None,
                qp_num: 0,
                src_qp: None,
            };
            64
        ];
        Ok(OneSided {
            ctx,
            conn,
            region_addr: info.region_addr,
            rkey: info.region_rkey,
            read_only: info.flags & INFO_READ_ONLY != 0,
            inflight: HashMap::default(),
            next: 1,
            wcs,
        })
    }

    /// Checks and registers a one-sided request and adds its work request to `batch`; a
    /// request out of range completes at once (`-ERANGE`, counted in the batch as taken).
    pub(super) fn prepare_one_sided(&mut self, r: &Req, batch: &mut Vec<Prepared>) -> Result<()> {
        let Some(one) = &self.one else {
            return Err(Error::new(ErrorKind::InvalidArgument, "not one-sided"));
        };
        if let Some(e) = super::super::proto::check_range(self.info.size, r.offset, r.len) {
            batch.push(Prepared {
                wr: None,
                cookie: r.cookie,
                len: r.len,
                handle: None,
                errno: e as i32,
            });
            return Ok(());
        }
        let o = one.lock();
        if r.op == Op::Write && o.read_only {
            // The session's rkey allows RDMA READ only: a WRITE would be the QP's remote
            // access error (the connection lost); refused here as the target would.
            batch.push(Prepared {
                wr: None,
                cookie: r.cookie,
                len: r.len,
                handle: None,
                errno: libc::EACCES,
            });
            return Ok(());
        }
        let acc = if r.op == Op::Read {
            access::LOCAL_WRITE
        } else {
            0
        };
        // SAFETY: `submit`'s contract keeps the buffer mapped until the completion; the
        // handle is put back then.
        let h = unsafe { o.ctx.rcache().get(r.buf, r.len as usize, acc) }?;
        let (addr, rkey) = (o.region_addr, o.rkey);
        drop(o);
        batch.push(Prepared {
            wr: Some(SendReq {
                cookie: 0,
                opcode: if r.op == Op::Read {
                    WrOpcode::RdmaRead
                } else {
                    WrOpcode::RdmaWrite
                },
                flags: send_flags::SIGNALED,
                sges: smallvec::smallvec![Sge {
                    addr: r.buf as u64,
                    length: r.len,
                    lkey: h.lkey(),
                }],
                remote_addr: addr + r.offset,
                rkey,
                imm: 0,
            }),
            cookie: r.cookie,
            len: r.len,
            handle: Some(h),
            errno: 0,
        });
        Ok(())
    }

    /// Posts `batch` (in order) with one `post_send`; returns how many requests were
    /// taken (the rest are released: the caller submits them again).
    pub(super) fn post_one_sided(&mut self, batch: &mut Vec<Prepared>) -> Result<usize> {
        if batch.is_empty() {
            return Ok(0);
        }
        let Some(one) = &self.one else {
            batch.clear();
            return Ok(0);
        };
        let mut o = one.lock();
        let mut wrs: Vec<SendReq> = Vec::with_capacity(batch.len());
        let mut next = o.next;
        for p in batch.iter_mut() {
            if let Some(w) = &mut p.wr {
                w.cookie = next;
                next += 1;
                wrs.push(w.clone());
            }
        }
        let posted = if wrs.is_empty() {
            Ok(0)
        } else {
            match o.conn.post_send(&wrs) {
                Ok(k) => Ok(k),
                Err(e) if e.kind() == ErrorKind::Full => Ok(0),
                Err(e) => Err(e),
            }
        };
        let posted = match posted {
            Ok(k) => k,
            Err(e) => {
                for p in batch.drain(..) {
                    if let Some(h) = p.handle {
                        let _ = o.ctx.rcache().put(h);
                    }
                }
                return Err(e);
            }
        };
        // Taken: every request up to the last posted WR, and local failures before the
        // first refused WR.
        let mut taken = 0;
        let mut wr_i = 0;
        let mut refused = false;
        let mut local = Vec::new();
        for p in batch.drain(..) {
            match (p.wr, p.handle) {
                (Some(w), Some(h)) if !refused && wr_i < posted => {
                    wr_i += 1;
                    o.inflight.insert(w.cookie, (p.cookie, p.len, h));
                    taken += 1;
                }
                (None, _) if !refused && (wr_i < posted || posted == wrs.len()) => {
                    local.push(Completion {
                        cookie: p.cookie,
                        status: -p.errno,
                        len: 0,
                    });
                    taken += 1;
                }
                (_, h) => {
                    // Refused (queue full) and everything after it: given back.
                    refused = true;
                    if let Some(h) = h {
                        let _ = o.ctx.rcache().put(h);
                    }
                }
            }
        }
        o.next = next;
        drop(o);
        if !local.is_empty() {
            self.sh.st.lock().done.extend(local);
        }
        Ok(taken)
    }

    /// Reaps the one-sided connection's completions into the done queue.
    pub(super) fn reap_one_sided(&self) -> usize {
        let Some(one) = &self.one else {
            return 0;
        };
        let mut o = one.lock();
        let mut wcs = std::mem::take(&mut o.wcs);
        let n = o.conn.poll(&mut wcs);
        let mut out = Vec::with_capacity(n);
        for wc in &wcs[..n] {
            if let Some((cookie, len, h)) = o.inflight.remove(&wc.cookie) {
                let _ = o.ctx.rcache().put(h);
                let ok = wc.status == WcStatus::Success;
                out.push(Completion {
                    cookie,
                    status: if ok { 0 } else { -libc::EIO },
                    len: if ok { len } else { 0 },
                });
            }
        }
        o.wcs = wcs;
        if n == 0 && !o.inflight.is_empty() && o.conn.qp_state() == crate::rc::verbs::QpState::Err {
            // Gone without flushing what was posted (should not happen): fail the rest.
            let all: Vec<(u64, u32, Handle)> = o.inflight.drain().map(|(_, v)| v).collect();
            for (cookie, _, h) in all {
                let _ = o.ctx.rcache().put(h);
                out.push(Completion {
                    cookie,
                    status: -libc::EIO,
                    len: 0,
                });
            }
        }
        drop(o);
        let k = out.len();
        if k > 0 {
            self.sh.st.lock().done.extend(out);
        }
        k
    }

    /// `wait` for one-sided mode: polls the connection for the spin budget (the messenger
    /// too when a flush is in flight, and about every millisecond for its keepalives),
    /// then sleeps on the connection's completion fd for up to 1 ms.
    pub(super) fn wait_one_sided(&self, timeout: Duration) -> Result<()> {
        let Some(one) = &self.one else {
            return Ok(());
        };
        let start = Instant::now();
        let budget = self.spin_one.map_or(timeout, |s| s.min(timeout));
        loop {
            let got = self.reap_one_sided();
            let rpc_waiting = !self.sh.st.lock().inflight.is_empty();
            let due = self.last_msgr.lock().elapsed() >= Duration::from_millis(1);
            if self.caller_driven && (rpc_waiting || due) {
                self.msgr.poll(Duration::ZERO)?;
                *self.last_msgr.lock() = Instant::now();
            }
            if got > 0 || !self.sh.st.lock().done.is_empty() {
                return Ok(());
            }
            if start.elapsed() >= budget {
                break;
            }
            std::hint::spin_loop();
        }
        if self.spin_one.is_none() || timeout.is_zero() {
            return Ok(());
        }
        let o = one.lock();
        o.conn.req_notify();
        let fd = o.conn.event_fd();
        drop(o);
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = (timeout.saturating_sub(start.elapsed()).as_millis()).clamp(0, 1) as i32;
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, ms) };
        one.lock().conn.clear_event();
        Ok(())
    }
}
