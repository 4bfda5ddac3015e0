//! Opening a volume (connect, the Open request, and in `Mode::Read` the one-sided
//! connection), the control requests (open, query) and their wait, and long-lived buffer
//! registration.

use parking_lot::Mutex;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::super::proto::{INFO_ONE_SIDED, MSG_REQ, Op, Reply, ReqHdr};
use super::replies::Disp;
use super::state::{Shared, State};
use super::{BlkClient, Mode, VolumeInfo};
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::msgr::messenger::{Messenger, OutMessage, Policy};
use crate::provider::sys::EventFd;
use crate::rc::verbs::access;

fn resolve(addr: &str) -> Result<SocketAddr> {
    addr.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("target address '{addr}': expected HOST:PORT"),
            )
        })
}

impl BlkClient {
    /// Connects to the target at `addr` ("HOST:PORT") and opens `volume`, within
    /// `timeout`. `config`: transport and `msgr_*` keys (`msgr_threads` 0, the default,
    /// means [`BlkClient::poll`] drives everything on the caller's thread).
    pub fn open(
        config: &Config,
        addr: &str,
        volume: &str,
        mode: Mode,
        timeout: Duration,
    ) -> Result<BlkClient> {
        let target = resolve(addr)?;
        if volume.is_empty() || volume.len() > super::super::proto::NAME_MAX {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("volume name '{volume}': must be 1..255 bytes"),
            ));
        }
        let efd = EventFd::new()?;
        let sh = Arc::new(Shared {
            st: Mutex::new(State::default()),
            efd,
            signal: AtomicBool::new(false),
        });
        let mut cfg = config.clone();
        super::super::apply_defaults(&mut cfg)?;
        let config = &cfg;
        let msgr = Messenger::new(
            config,
            Arc::new(Disp {
                sh: Arc::clone(&sh),
            }),
        )?;
        let caller_driven = msgr.settings().threads == 0;
        sh.signal.store(!caller_driven, Ordering::Relaxed);
        let spin_one = super::super::one_sided_spin(config)?;
        let session = msgr.connect(&target.to_string(), Policy::Lossy)?;
        let mut c = BlkClient {
            msgr,
            session,
            sh,
            vol: 0,
            info: VolumeInfo {
                size: 0,
                block_size: 0,
                one_sided: false,
            },
            mode,
            caller_driven,
            spin_one,
            last_msgr: Mutex::new(Instant::now()),
            next_id: 1,
            one: None,
            pinned: Vec::new(),
        };
        let deadline = Instant::now() + timeout;
        let r = c.control(Op::Open, volume.as_bytes(), deadline)?;
        if r.status != 0 {
            let e = std::io::Error::from_raw_os_error(r.status as i32);
            // EACCES: the target's access control grants this entity nothing on the
            // volume (or, with auth = none, the target grants only named entities).
            let (kind, why) = match r.status as i32 {
                libc::ENOENT => (ErrorKind::InvalidArgument, ""),
                libc::EACCES => (
                    ErrorKind::Auth,
                    " (the target's --allow grants this entity no access to it)",
                ),
                _ => (ErrorKind::Io, ""),
            };
            return Err(Error::new(
                kind,
                format!("open volume '{volume}' on {target}: {e}{why}"),
            ));
        }
        let info = r.info.unwrap_or_default();
        c.vol = info.vol;
        c.info = VolumeInfo {
            size: info.size,
            block_size: info.block_size,
            one_sided: info.flags & INFO_ONE_SIDED != 0,
        };
        if mode == Mode::Read {
            c.one = Some(Mutex::new(Self::one_sided(
                config, target, &info, deadline,
            )?));
        }
        Ok(c)
    }

    /// Sends a control request and waits for its reply.
    fn control(&mut self, op: Op, name: &[u8], deadline: Instant) -> Result<Reply> {
        let id = self.next_id;
        self.next_id += 1;
        let hdr = ReqHdr {
            op: op as u8,
            vol: self.vol,
            req_id: id,
            offset: 0,
            len: 0,
            place: None,
            imm_reply: false,
            name: name.to_vec(),
        };
        self.msgr
            .send(self.session, OutMessage::new(MSG_REQ, hdr.encode()))
            .map_err(|r| r.error)?;
        loop {
            {
                let mut st = self.sh.st.lock();
                if let Some(r) = st.control.remove(&id) {
                    return Ok(r);
                }
                if let Some((kind, why)) = &st.dead {
                    return Err(Error::new(*kind, why.clone()));
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!("no answer from the target to {op:?} in time"),
                ));
            }
            self.wait(left.min(Duration::from_millis(10)))?;
        }
    }

    /// Registers `[ptr, ptr + len)` for the client's lifetime in the messenger's cache
    /// and, in `Mode::Read`, the one-sided context's: requests inside it are cache hits.
    ///
    /// # Safety
    /// The memory must stay mapped until the client is dropped.
    pub unsafe fn register(&mut self, ptr: *mut u8, len: usize) -> Result<()> {
        // In rpc mode reads name their buffers for the target's WRITE: the area serves
        // reads and writes (fio's buffers), so it is pinned with remote write as well as
        // remote read, and every request inside it is a cache hit. Pinned with remote read
        // only, each read re-registered its pages with remote write, and fio's 4 KiB
        // buffers, not page-aligned (fio aligns them only with direct=1), share pages
        // with their neighbours: each registration retired the neighbours' (an mlock, an
        // munlock and a getrandom for the rkey on 3 reads in 4, measured with strace).
        let acc = access::LOCAL_WRITE
            | access::REMOTE_READ
            | if self.mode == Mode::Rpc {
                access::REMOTE_WRITE
            } else {
                0
            };
        // SAFETY: this function's contract (mapped until the client is dropped, which puts
        // the handle back first).
        let h = unsafe { self.msgr.context().rcache().get(ptr, len, acc) }?;
        self.pinned.push((h, false));
        if let Some(one) = &self.one {
            let o = one.lock();
            // SAFETY: as above.
            let h = unsafe { o.ctx.rcache().get(ptr, len, access::LOCAL_WRITE) }?;
            drop(o);
            self.pinned.push((h, true));
        }
        Ok(())
    }

    /// Queries the volume's size and block size again.
    pub fn query(&mut self, timeout: Duration) -> Result<VolumeInfo> {
        let r = self.control(Op::Query, &[], Instant::now() + timeout)?;
        if r.status != 0 {
            return Err(Error::new(
                ErrorKind::Io,
                format!(
                    "query: {}",
                    std::io::Error::from_raw_os_error(r.status as i32)
                ),
            ));
        }
        let i = r.info.unwrap_or_default();
        Ok(VolumeInfo {
            size: i.size,
            block_size: i.block_size,
            one_sided: i.flags & INFO_ONE_SIDED != 0,
        })
    }
}
