//! Completion channels. `ibv_create_comp_channel` and `ibv_destroy_comp_channel` are not
//! provider ops: libibverbs writes a kernel command to the device fd for them. With the
//! provider preloaded (`LD_PRELOAD`, as `rdmx-ibv exec` does), these two exported
//! functions take the application's calls instead: on an rdmx context they make a
//! [`crate::verbs::CompChannel`] (a pipe; `ibv_get_cq_event`/`ibv_ack_cq_events` work
//! unchanged on it), on any other context they call libibverbs' own
//! (`dlvsym(RTLD_NEXT, name, "IBVERBS_1.0")`).
//!
//! The definitions are unversioned: rustc gives a cdylib its own (anonymous) version
//! script, which a second script with an `IBVERBS_1.0` node cannot be combined with; the
//! dynamic loader binds a versioned reference (`ibv_create_comp_channel@IBVERBS_1.0`) to
//! an unversioned definition of an earlier object in the search order, which a preloaded
//! library is. `tests/ibv_programs.rs` checks the interposition with `ibv_rc_pingpong -e`.
//!
//! Without the preload the device fd is a bind of `/dev/full` (see the launcher), so
//! libibverbs' own `ibv_create_comp_channel` fails (ENOSPC) instead of handing out a
//! garbage fd.

use super::context::is_ours;
use super::guard;
use crate::verbs::CompChannel;
use parking_lot::Mutex;
use rdma_sys::{ibv_comp_channel, ibv_context};
use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::{Arc, OnceLock};

/// A channel as handed out: the `struct ibv_comp_channel` first.
#[repr(C)]
struct ChannelObj {
    ch: ibv_comp_channel,
    inner: Arc<CompChannel>,
}

/// Channels of ours, by the address of their `struct ibv_comp_channel`.
fn channels() -> &'static Mutex<HashMap<usize, Arc<CompChannel>>> {
    static CHANNELS: OnceLock<Mutex<HashMap<usize, Arc<CompChannel>>>> = OnceLock::new();
    CHANNELS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Our channel behind `ch`, if it is one of ours.
pub(crate) fn lookup(ch: *mut ibv_comp_channel) -> Option<Arc<CompChannel>> {
    channels().lock().get(&(ch as usize)).cloned()
}

type CreateFn = unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_comp_channel;
type DestroyFn = unsafe extern "C" fn(*mut ibv_comp_channel) -> c_int;

/// libibverbs' definition of `name@IBVERBS_1.0`, the next one after ours.
fn next_symbol(name: &std::ffi::CStr) -> *mut libc::c_void {
    next_versioned(name, c"IBVERBS_1.0")
}

/// libibverbs' definition of `name@version`, the next one after ours (the version a
/// program built today links: `ibv_get_cq_event` has a 1.0 compatibility definition for
/// the pre-1.1 structures and its default at IBVERBS_1.1).
pub(crate) fn next_versioned(name: &std::ffi::CStr, version: &std::ffi::CStr) -> *mut libc::c_void {
    // SAFETY: dlvsym with RTLD_NEXT and NUL-terminated strings.
    unsafe { libc::dlvsym(libc::RTLD_NEXT, name.as_ptr(), version.as_ptr()) }
}

/// `ibv_create_comp_channel` (interposed).
///
/// # Safety
/// `context` is NULL or a live context, as for libibverbs' function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    guard("ibv_create_comp_channel", std::ptr::null_mut(), || {
        if context.is_null() {
            super::set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: a live context (the caller's contract).
        if !unsafe { is_ours(context) } {
            let f = next_symbol(c"ibv_create_comp_channel");
            if f.is_null() {
                super::set_errno(libc::ENOSYS);
                return std::ptr::null_mut();
            }
            // SAFETY: libibverbs' function of this exact signature (IBVERBS_1.0).
            return unsafe { std::mem::transmute::<*mut libc::c_void, CreateFn>(f)(context) };
        }
        let inner = match CompChannel::new() {
            Ok(c) => c,
            Err(e) => {
                super::set_errno(super::fail("ibv_create_comp_channel", &e));
                return std::ptr::null_mut();
            }
        };
        let obj = Box::new(ChannelObj {
            ch: ibv_comp_channel {
                context,
                fd: inner.fd(),
                refcnt: 0,
            },
            inner: inner.clone(),
        });
        let p = Box::into_raw(obj).cast::<ibv_comp_channel>();
        channels().lock().insert(p as usize, inner);
        p
    })
}

/// `ibv_destroy_comp_channel` (interposed): EBUSY while CQs use the channel.
///
/// # Safety
/// `channel` is NULL or a live channel, as for libibverbs' function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    guard("ibv_destroy_comp_channel", libc::EIO, || {
        if channel.is_null() {
            return libc::EINVAL;
        }
        if lookup(channel).is_none() {
            let f = next_symbol(c"ibv_destroy_comp_channel");
            if f.is_null() {
                return libc::ENOSYS;
            }
            // SAFETY: libibverbs' function of this exact signature (IBVERBS_1.0), on a
            // channel it made.
            return unsafe { std::mem::transmute::<*mut libc::c_void, DestroyFn>(f)(channel) };
        }
        // SAFETY: one of ours: ch.context is the live context it was made on; its mutex
        // guards refcnt (libibverbs' ibv_create_cq/ibv_destroy_cq change it under it).
        unsafe {
            let ctx = (*channel).context;
            let mutex = std::ptr::addr_of_mut!((*ctx).mutex).cast::<libc::pthread_mutex_t>();
            libc::pthread_mutex_lock(mutex);
            let busy = (*channel).refcnt != 0;
            let ret = if busy {
                libc::EBUSY
            } else {
                let inner = channels().lock().remove(&(channel as usize));
                match inner.map(|c| c.destroy()) {
                    Some(Err(e)) => {
                        // Still ours: put it back.
                        if let Some(c) = lookup_obj(channel) {
                            channels().lock().insert(channel as usize, c);
                        }
                        super::fail("ibv_destroy_comp_channel", &e)
                    }
                    _ => {
                        drop(Box::from_raw(channel.cast::<ChannelObj>()));
                        0
                    }
                }
            };
            libc::pthread_mutex_unlock(mutex);
            ret
        }
    })
}

/// The channel object's own `Arc` (to re-register it after a refused destroy).
///
/// # Safety
/// `channel` is one of ours, not freed.
unsafe fn lookup_obj(channel: *mut ibv_comp_channel) -> Option<Arc<CompChannel>> {
    // SAFETY: per the contract.
    Some(unsafe { (*channel.cast::<ChannelObj>()).inner.clone() })
}
