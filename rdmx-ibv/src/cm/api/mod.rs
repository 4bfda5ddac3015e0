//! librdmacm's public functions (`rdma/rdma_cma.h`, `rdma/rdma_verbs.h`), exported by
//! the preloaded provider so that they take the application's calls before
//! `librdmacm.so.1`'s (see the module documentation of [`super`]).
//!
//! Return conventions are librdmacm's: 0, or -1 with errno; constructors NULL with
//! errno. Every body runs under [`guard`] (a panic is refused with EIO).
//!
//! One file per group: `events` (channels, events, the synchronous ids' wait), `ids`
//! (create, bind, resolve, listen, migrate, `rdma_init_qp_attr`), `connect` (connect,
//! accept, reject, establish, disconnect), `qps` (QPs and SRQs of ids), `endpoints`
//! (`rdma_create_ep`, `rdma_get_request`), `misc` (options, ports, devices, event
//! names), `refused` (multicast, ECE). Helpers shared by them are here.

use super::chan::{Chan, EventBox, Fixup, errno, release};
use super::conn::{self, REJ_CONSUMER_DEFINED, REJ_PDATA, REP_PDATA, SIDR_REJECT, SIDR_REP_PDATA};
use super::dev::{self, Dev};
use super::id::{
    self, EV_CONNECT_ERROR, EV_CONNECT_REQUEST, EV_ESTABLISHED, EV_REJECTED, Id, PS_IB, PS_IPOIB,
    PS_TCP, PS_UDP, QPT_RC, QPT_UD, State, Wait,
};
use super::qp::{self, RDMA_UDP_QKEY};
use super::wire::{Kind, Msg};
use crate::glue::{guard, set_errno};
use parking_lot::Mutex;
use rdma_sys::{
    ibv_context, ibv_pd, ibv_qp_attr, ibv_qp_init_attr, ibv_qp_init_attr_ex, ibv_srq_init_attr,
    ibv_srq_init_attr_ex, rdma_addrinfo, rdma_cm_event, rdma_cm_id, rdma_conn_param,
    rdma_event_channel,
};
use std::collections::HashSet;
use std::ffi::{c_char, c_int, c_void};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

const RDMA_MAX_RESP_RES: u8 = 0xff;
const RDMA_MAX_INIT_DEPTH: u8 = 0xff;
const RAI_PASSIVE: c_int = 1;

fn fail(e: c_int) -> c_int {
    set_errno(e);
    -1
}

fn res(r: Result<(), c_int>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

/// Events handed to the application and not yet acknowledged.
fn delivered() -> &'static Mutex<HashSet<usize>> {
    static D: OnceLock<Mutex<HashSet<usize>>> = OnceLock::new();
    D.get_or_init(|| Mutex::new(HashSet::new()))
}

fn lookup(p: *mut rdma_cm_id) -> Result<Arc<Id>, c_int> {
    Id::lookup(p).ok_or(libc::EINVAL)
}

/// A PSN for a new connection (24 bits, different per connection).
pub(crate) fn new_psn() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let x = t ^ N.fetch_add(0x9e37_79b9, Ordering::Relaxed) ^ std::process::id().rotate_left(13);
    x.wrapping_mul(0x85eb_ca6b) >> 8
}

fn qp_type_of(ps: u32) -> Result<u32, c_int> {
    match ps {
        PS_TCP | PS_IB => Ok(QPT_RC),
        PS_UDP | PS_IPOIB => Ok(QPT_UD),
        _ => Err(libc::EINVAL),
    }
}

mod connect;
mod endpoints;
mod events;
mod ids;
mod misc;
mod qps;
mod refused;

use events::*;
use ids::*;
use qps::*;
