//! `rdma_getaddrinfo`/`rdma_freeaddrinfo`: the system resolver's answer in librdmacm's
//! structure (`ucma_getaddrinfo`: the first result; passive results carry the source,
//! active ones the destination; QP type and port space from the hints or the socket
//! type). AF_IB and `RAI_SA` (path records from an SA) have no meaning on RoCE:
//! EOPNOTSUPP, as librdmacm without an IB SA.

use super::id::{PS_TCP, PS_UDP, QPT_RC, QPT_UD};
use crate::glue::{guard, set_errno};
use rdma_sys::rdma_addrinfo;
use std::ffi::{c_char, c_int};

const RAI_PASSIVE: c_int = 1;
const RAI_NUMERICHOST: c_int = 2;
const RAI_SA: c_int = 0x10;
const RAI_FAMILY: c_int = 8;
const AF_IB: c_int = 27;

/// Copies a socket address into malloc'd memory (freed by rdma_freeaddrinfo).
fn copy_addr(src: *const libc::sockaddr, len: libc::socklen_t) -> *mut libc::sockaddr {
    if src.is_null() || len == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: malloc of len bytes, filled from the source of that length.
    unsafe {
        let p = libc::malloc(len as usize) as *mut libc::sockaddr;
        if !p.is_null() {
            std::ptr::copy_nonoverlapping(src as *const u8, p as *mut u8, len as usize);
        }
        p
    }
}

/// # Safety
/// `node`/`service` NULL or C strings; `hints` NULL or valid; `res` valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard("rdma_getaddrinfo", -1, || {
        if (node.is_null() && service.is_null() && hints.is_null()) || res.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: the caller's promise.
        let h: rdma_addrinfo = if hints.is_null() {
            // SAFETY: plain C data for which zero is valid.
            unsafe { std::mem::zeroed() }
        } else {
            // SAFETY: as above.
            unsafe { std::ptr::read(hints) }
        };
        if h.ai_flags & RAI_SA != 0 || (h.ai_flags & RAI_FAMILY != 0 && h.ai_family == AF_IB) {
            set_errno(libc::EOPNOTSUPP);
            return -1;
        }
        // SAFETY: calloc of one structure, freed by rdma_freeaddrinfo.
        let rai =
            unsafe { libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()) } as *mut rdma_addrinfo;
        if rai.is_null() {
            set_errno(libc::ENOMEM);
            return -1;
        }
        // SAFETY: rai is ours, zeroed.
        let r = unsafe { &mut *rai };
        if !node.is_null() || !service.is_null() {
            // SAFETY: plain C data for which zero is valid.
            let mut ah: libc::addrinfo = unsafe { std::mem::zeroed() };
            ah.ai_family = h.ai_family;
            if h.ai_flags & RAI_PASSIVE != 0 {
                ah.ai_flags |= libc::AI_PASSIVE;
            }
            if h.ai_flags & RAI_NUMERICHOST != 0 {
                ah.ai_flags |= libc::AI_NUMERICHOST;
            }
            ah.ai_socktype = match (h.ai_qp_type as u32, h.ai_port_space as u32) {
                (QPT_RC, _) | (0, PS_TCP) => libc::SOCK_STREAM,
                (QPT_UD, _) | (0, PS_UDP) => libc::SOCK_DGRAM,
                _ => 0,
            };
            let mut ai: *mut libc::addrinfo = std::ptr::null_mut();
            // SAFETY: getaddrinfo with the caller's strings and our hints.
            let ret = unsafe { libc::getaddrinfo(node, service, &ah, &mut ai) };
            if ret != 0 {
                // SAFETY: rai is ours.
                unsafe { rdma_freeaddrinfo(rai) };
                return ret;
            }
            // SAFETY: getaddrinfo returned at least one result.
            let a = unsafe { &*ai };
            r.ai_qp_type = if h.ai_qp_type != 0 {
                h.ai_qp_type
            } else if a.ai_socktype == libc::SOCK_DGRAM {
                QPT_UD as c_int
            } else {
                QPT_RC as c_int
            };
            r.ai_port_space = if h.ai_port_space != 0 {
                h.ai_port_space
            } else if a.ai_protocol == libc::IPPROTO_UDP {
                PS_UDP as c_int
            } else {
                PS_TCP as c_int
            };
            r.ai_family = a.ai_family;
            if a.ai_flags & libc::AI_PASSIVE != 0 {
                r.ai_flags = RAI_PASSIVE;
                r.ai_src_addr = copy_addr(a.ai_addr, a.ai_addrlen);
                r.ai_src_len = a.ai_addrlen;
            } else {
                r.ai_dst_addr = copy_addr(a.ai_addr, a.ai_addrlen);
                r.ai_dst_len = a.ai_addrlen;
            }
            // SAFETY: the list getaddrinfo returned.
            unsafe { libc::freeaddrinfo(ai) };
        } else {
            r.ai_flags = h.ai_flags;
            r.ai_family = h.ai_family;
            r.ai_qp_type = h.ai_qp_type;
            r.ai_port_space = h.ai_port_space;
            if h.ai_dst_len != 0 {
                r.ai_dst_addr = copy_addr(h.ai_dst_addr, h.ai_dst_len);
                r.ai_dst_len = h.ai_dst_len;
            }
        }
        if r.ai_src_len == 0 && h.ai_src_len != 0 {
            r.ai_src_addr = copy_addr(h.ai_src_addr, h.ai_src_len);
            r.ai_src_len = h.ai_src_len;
        }
        // SAFETY: the caller's out-pointer.
        unsafe { *res = rai };
        0
    })
}

/// # Safety
/// `res` is NULL or came from rdma_getaddrinfo.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    guard("rdma_freeaddrinfo", (), || {
        let mut p = res;
        while !p.is_null() {
            // SAFETY: a list of calloc'd structures with malloc'd members.
            unsafe {
                let r = &*p;
                let next = r.ai_next;
                libc::free(r.ai_connect);
                libc::free(r.ai_route);
                libc::free(r.ai_src_canonname.cast());
                libc::free(r.ai_dst_canonname.cast());
                libc::free(r.ai_src_addr.cast());
                libc::free(r.ai_dst_addr.cast());
                libc::free(p.cast());
                p = next;
            }
        }
    })
}
