//! `ibv_get_cq_event` (interposed, like the channel functions of `channel.rs`).
//!
//! On one of our channels, a thread about to block in libibverbs' read(2) of the channel's
//! pipe sleeps instead on the pipe *and* the device's receiving sockets, and when a
//! datagram comes it receives it itself: the pass that lands it writes the very record the
//! thread waits for. Otherwise the provider's progress thread wakes for the datagram and
//! then wakes this thread through the pipe, two wake-ups per message where one does
//! (`ibv_rc_pingpong -e`; docs/ibv-device.md, "Waiting in ibv_get_cq_event"). While the
//! thread sleeps there the progress thread leaves the sockets alone (`app_watch`) and
//! still runs the timers.
//!
//! libibverbs' own function (`ibv_get_cq_event@IBVERBS_1.1`, the default version; the 1.0
//! one is a compatibility wrapper for pre-1.1 structures) then reads the record (it is there, so its read returns at
//! once) and runs the provider's `cq_event` op, so what the caller gets is unchanged. A
//! non-blocking channel fd gets one pass of progress and libibverbs' answer (EAGAIN if
//! still nothing). Programs that wait on the fd themselves (epoll, as Ceph and UCX do) and
//! call this only once it is readable are not affected.

use super::channel::{lookup, next_versioned};
use super::context::device_of;
use super::{guard, set_errno};
use rdma_sys::{ibv_comp_channel, ibv_cq};
use rdmx::config::settings::{PollMode, Settings};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Calls on our channels whose record came while the thread polled (`poll_mode`).
pub static SPUN: AtomicU64 = AtomicU64::new(0);
/// Calls on our channels that found no record, polled and then slept.
pub static WAITS: AtomicU64 = AtomicU64::new(0);
/// Of those, the ones whose thread received (ran a pass after a datagram woke it) before
/// its record came: the wake-up the progress thread would otherwise have paid.
pub static WAITS_RECEIVED: AtomicU64 = AtomicU64::new(0);

type GetFn =
    unsafe extern "C" fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int;

/// How long the thread watches the sockets for a datagram before it leaves receiving to
/// the progress thread and blocks in libibverbs' read(2). While a thread watches, the
/// progress thread looks every handover interval (up to 1 ms) instead of sleeping on the
/// sockets: right while messages flow, wasteful for a program idle for minutes (the
/// messenger's idle workers stop watching after the same 100 ms, `WATCH_AFTER`).
const WATCH_FOR: Duration = Duration::from_millis(100);

fn pollin(fd: std::os::fd::RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// `ibv_get_cq_event` (interposed).
///
/// # Safety
/// As libibverbs' function: `channel` is a live completion channel, `cq` and `cq_context`
/// point to writable pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    // Looked up once: a dlvsym per event would be a symbol search on the wait path.
    static NEXT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let next = *NEXT.get_or_init(|| next_versioned(c"ibv_get_cq_event", c"IBVERBS_1.1") as usize)
        as *mut c_void;
    if next.is_null() {
        set_errno(libc::ENOSYS);
        return -1;
    }
    if !channel.is_null() && lookup(channel).is_some() {
        // SAFETY: one of our channels, live (the caller's contract).
        let waited = guard("ibv_get_cq_event", Ok(()), || unsafe {
            wait_for_record(channel)
        });
        if let Err(e) = waited {
            set_errno(e);
            return -1;
        }
    }
    // SAFETY: libibverbs' function of this exact signature (IBVERBS_1.1), with the
    // caller's arguments.
    unsafe { std::mem::transmute::<*mut c_void, GetFn>(next)(channel, cq, cq_context) }
}

/// How long a waiting thread polls before it sleeps: `poll_mode` = adaptive polls
/// `polling_us` (capped at 1 ms, as the device's inline handover time), event not at all,
/// busy until the record comes (an hour, bounded all the same).
fn spin_budget(s: &Settings) -> Duration {
    match s.poll_mode {
        PollMode::Event => Duration::ZERO,
        PollMode::Adaptive => Duration::from_micros(u64::from(s.polling_us).min(1000)),
        PollMode::Busy => Duration::from_secs(3600),
    }
}

/// Returns once the channel's pipe is readable (a record, or its end), receiving on the
/// caller's thread meanwhile, or when no datagram came for [`WATCH_FOR`] (libibverbs'
/// read then blocks, the progress thread receiving); `Err(errno)` for a signal (EINTR, as
/// libibverbs' read) or a failed poll(2). Returns at once where the caller cannot receive
/// (progress=thread, no QP yet) or the fd is non-blocking (after one pass of progress).
///
/// # Safety
/// `channel` is one of our channels, live.
unsafe fn wait_for_record(channel: *mut ibv_comp_channel) -> Result<(), c_int> {
    // SAFETY: a live channel (the caller's contract); its context is live with it.
    let (fd, ctx) = unsafe { ((*channel).fd, (*channel).context) };
    // SAFETY: as above.
    let dev = unsafe { device_of(ctx) }?;
    let soft = &dev.soft;
    // SAFETY: fcntl F_GETFL on the channel's own fd; no pointers.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(4);
    let mut rx = Vec::with_capacity(3);
    let mut waited = false;
    let mut received = false;
    let spin = spin_budget(dev.settings());
    let count = |waited: bool, received: bool| {
        if waited {
            WAITS.fetch_add(1, Ordering::Relaxed);
        }
        if received {
            WAITS_RECEIVED.fetch_add(1, Ordering::Relaxed);
        }
    };
    loop {
        fds.clear();
        fds.push(pollin(fd));
        // SAFETY: poll(2) with timeout 0 on one valid pollfd.
        if unsafe { libc::poll(fds.as_mut_ptr(), 1, 0) } > 0 {
            count(waited, received);
            return Ok(());
        }
        if flags >= 0 && flags & libc::O_NONBLOCK != 0 {
            soft.progress_inline();
            return Ok(());
        }
        // Poll first, as `poll_mode` says: a thread that sleeps at once pays a wake-up per
        // message, which on these VMs (an idle vCPU halts) costs more than the message.
        if !waited && !spin.is_zero() {
            let end = std::time::Instant::now() + spin;
            loop {
                soft.progress_inline();
                // SAFETY: poll(2) with timeout 0 on one valid pollfd.
                if unsafe { libc::poll(fds.as_mut_ptr(), 1, 0) } > 0 {
                    SPUN.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                if std::time::Instant::now() >= end {
                    break;
                }
            }
        }
        rx.clear();
        soft.rx_fds(&mut rx);
        if rx.is_empty() {
            return Ok(());
        }
        fds.extend(rx.iter().map(|&f| pollin(f)));
        waited = true;
        soft.app_watch_events(true);
        // SAFETY: `fds` is a valid array of pollfd of the length given.
        let n = unsafe {
            libc::poll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                WATCH_FOR.as_millis() as c_int,
            )
        };
        let err = std::io::Error::last_os_error();
        soft.app_watch_events(false);
        if n < 0 {
            count(waited, received);
            return Err(err.raw_os_error().unwrap_or(libc::EIO));
        }
        // Nothing came for `WATCH_FOR` (n == 0), or the record did.
        if n == 0 || fds[0].revents != 0 {
            count(waited, received);
            return Ok(());
        }
        if fds[1..].iter().any(|p| p.revents != 0) {
            // The pass lands what came; an event it raises is on the pipe at the next look.
            soft.progress_inline();
            received = true;
        }
    }
}
