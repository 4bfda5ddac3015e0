//! Event channels and events.
//!
//! `struct rdma_event_channel` is `{ int fd; }`, and programs poll that fd, make it
//! non-blocking and read events with `rdma_get_cm_event`. Here the fd is one end of a
//! socket pair: every queued event puts one byte into it, so the fd is readable exactly
//! while events wait (poll/epoll work), and `rdma_get_cm_event` blocks or answers EAGAIN
//! as the application set the fd (its `recv` honours `O_NONBLOCK`). The events
//! themselves wait in a queue beside it.

use super::id::Id;
use parking_lot::Mutex;
use rdma_sys::{rdma_cm_event, rdma_event_channel};
use std::collections::{HashMap, VecDeque};
use std::ffi::c_int;
use std::sync::{Arc, OnceLock};

/// Room for private data in an event: librdmacm's `RDMA_MAX_PRIVATE_DATA`.
pub const PDATA_ROOM: usize = 256;

/// What `rdma_get_cm_event` still does to an event before the application sees it (as
/// librdmacm does in the same call).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fixup {
    None,
    /// A REP arrived: with a QP made by `rdma_create_qp`, move it to RTR and RTS, send
    /// the RTU and report ESTABLISHED; without one, report CONNECT_RESPONSE.
    ConnResponse,
    /// A REJ arrived: move the QP (if any) to ERR.
    QpToErr,
}

/// An event as handed out: the public structure first.
#[repr(C)]
pub struct EventBox {
    pub ev: rdma_cm_event,
    pub pdata: [u8; PDATA_ROOM],
    pub id: Arc<Id>,
    pub listen: Option<Arc<Id>>,
    pub fixup: Fixup,
}

pub struct Chan {
    /// The application's end (`channel->fd`).
    pub rd: c_int,
    wr: c_int,
    q: Mutex<Queue>,
}

struct Queue {
    events: VecDeque<usize>,
    closed: bool,
}

/// A channel as handed out: the public structure first.
#[repr(C)]
pub struct ChanBox {
    pub ch: rdma_event_channel,
    pub inner: Arc<Chan>,
}

fn registry() -> &'static Mutex<HashMap<usize, Arc<Chan>>> {
    static R: OnceLock<Mutex<HashMap<usize, Arc<Chan>>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

impl Chan {
    /// A new channel, registered, and its public structure.
    pub fn create() -> Result<(*mut rdma_event_channel, Arc<Chan>), c_int> {
        let mut fds = [0 as c_int; 2];
        // SAFETY: socketpair with a valid out-array of two fds.
        let r = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        if r != 0 {
            return Err(errno());
        }
        // The writing end never blocks: a full buffer would mean millions of unread
        // events.
        // SAFETY: fcntl on the fd just made.
        unsafe {
            let fl = libc::fcntl(fds[1], libc::F_GETFL);
            libc::fcntl(fds[1], libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
        let inner = Arc::new(Chan {
            rd: fds[0],
            wr: fds[1],
            q: Mutex::new(Queue {
                events: VecDeque::new(),
                closed: false,
            }),
        });
        let b = Box::into_raw(Box::new(ChanBox {
            ch: rdma_event_channel { fd: fds[0] },
            inner: inner.clone(),
        }));
        registry().lock().insert(b as usize, inner.clone());
        destroyed().lock().remove(&(b as usize));
        Ok((b as *mut rdma_event_channel, inner))
    }

    /// Ours behind `ch`.
    pub fn lookup(ch: *mut rdma_event_channel) -> Option<Arc<Chan>> {
        registry().lock().get(&(ch as usize)).cloned()
    }

    /// Whether `ch` is a channel of ours that was destroyed (and its address not reused).
    pub fn was_destroyed(ch: *mut rdma_event_channel) -> bool {
        destroyed().lock().contains(&(ch as usize))
    }

    /// `rdma_destroy_event_channel`: closes both fds and frees the structure. Events
    /// still queued are dropped; later events for ids still on it go nowhere.
    pub fn destroy(ch: *mut rdma_event_channel) -> Result<(), c_int> {
        let Some(inner) = registry().lock().remove(&(ch as usize)) else {
            return Err(libc::EINVAL);
        };
        let dropped: Vec<usize> = {
            let mut q = inner.q.lock();
            q.closed = true;
            q.events.drain(..).collect()
        };
        for e in dropped {
            // SAFETY: queued events are live boxes owned by the queue.
            release(unsafe { Box::from_raw(e as *mut EventBox) });
        }
        // SAFETY: the fds are ours, closed once (the queue is marked closed).
        unsafe {
            libc::close(inner.rd);
            libc::close(inner.wr);
        }
        {
            let mut d = destroyed().lock();
            if d.len() >= 1024 {
                d.clear();
            }
            d.insert(ch as usize);
        }
        // SAFETY: ch came from Chan::create (it was in the registry).
        drop(unsafe { Box::from_raw(ch as *mut ChanBox) });
        Ok(())
    }

    /// Queues an event (already counted on its ids); false when the channel is closed
    /// (the event is released).
    pub fn post(&self, e: Box<EventBox>) -> bool {
        let mut q = self.q.lock();
        if q.closed {
            drop(q);
            release(e);
            return false;
        }
        q.events.push_back(Box::into_raw(e) as usize);
        // SAFETY: write of one byte from a valid buffer to our own fd.
        unsafe { libc::write(self.wr, [1u8].as_ptr().cast(), 1) };
        true
    }

    /// `rdma_get_cm_event`'s wait: one byte (blocking or not, as the application set
    /// the fd), then the oldest event.
    pub fn next(&self) -> Result<Box<EventBox>, c_int> {
        loop {
            let mut b = 0u8;
            // SAFETY: recv of one byte into a local.
            let n = unsafe { libc::recv(self.rd, (&mut b as *mut u8).cast(), 1, 0) };
            if n <= 0 {
                let e = if n == 0 { libc::EBADF } else { errno() };
                if (e == libc::EBADF) && self.q.lock().closed {
                    // Destroyed under a thread waiting on it.
                    wait_forever();
                }
                return Err(e);
            }
            if let Some(e) = self.q.lock().events.pop_front() {
                // SAFETY: queued events are live boxes owned by the queue.
                return Ok(unsafe { Box::from_raw(e as *mut EventBox) });
            }
            // The event this byte stood for was withdrawn (its id destroyed): wait on.
        }
    }

    /// Withdraws the queued events `pick` selects (their bytes too, as far as they are
    /// still in the socket) and returns them.
    pub fn withdraw(&self, pick: impl Fn(&EventBox) -> bool) -> Vec<Box<EventBox>> {
        let mut out = Vec::new();
        let mut q = self.q.lock();
        q.events.retain(|&e| {
            // SAFETY: queued events are live boxes owned by the queue.
            let eb = unsafe { &*(e as *const EventBox) };
            if pick(eb) {
                out.push(e);
                false
            } else {
                true
            }
        });
        for _ in &out {
            let mut b = 0u8;
            // SAFETY: non-blocking recv of one byte into a local.
            unsafe { libc::recv(self.rd, (&mut b as *mut u8).cast(), 1, libc::MSG_DONTWAIT) };
        }
        drop(q);
        out.into_iter()
            // SAFETY: withdrawn from the queue, so owned here.
            .map(|e| unsafe { Box::from_raw(e as *mut EventBox) })
            .collect()
    }
}

/// An event is done with (acknowledged, withdrawn or dropped): its ids lose a reference.
pub fn release(e: Box<EventBox>) {
    let id = e.id.clone();
    let listen = e.listen.clone();
    drop(e);
    id.unref();
    if let Some(l) = listen {
        l.unref();
    }
}

/// Addresses of destroyed channels (bounded; an address made again by `create` leaves).
fn destroyed() -> &'static Mutex<std::collections::HashSet<usize>> {
    static D: OnceLock<Mutex<std::collections::HashSet<usize>>> = OnceLock::new();
    D.get_or_init(|| Mutex::new(std::collections::HashSet::new()))
}

/// The wait of a thread on a destroyed channel: forever, as a thread blocked in the
/// kernel channel's read stays blocked after another thread closed it. Programs with an
/// event thread (rping) tear the channel down from their main thread while that thread
/// goes back to `rdma_get_cm_event`; an error there makes them exit non-zero.
pub fn wait_forever() -> ! {
    loop {
        std::thread::park();
    }
}

pub fn errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}
