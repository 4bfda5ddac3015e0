//! What rdmx0 does not do: multicast (ENOSYS) and ECE (EOPNOTSUPP).

use super::*;

/// Multicast: rdmx0's UD QPs have no multicast (`ibv_attach_mcast` is EOPNOTSUPP), so
/// joining a group answers ENOSYS.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_join_multicast(
    _id: *mut rdma_cm_id,
    _addr: *mut libc::sockaddr,
    _context: *mut c_void,
) -> c_int {
    fail(libc::ENOSYS)
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_join_multicast_ex(
    _id: *mut rdma_cm_id,
    _attr: *mut c_void,
    _context: *mut c_void,
) -> c_int {
    fail(libc::ENOSYS)
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_leave_multicast(_id: *mut rdma_cm_id, _addr: *mut libc::sockaddr) -> c_int {
    fail(libc::ENOSYS)
}

/// ECE (enhanced connection establishment): vendor options rdmx0 has none of; rxe
/// answers EOPNOTSUPP (`ibv_set_ece`/`ibv_query_ece`).
#[unsafe(no_mangle)]
pub extern "C" fn rdma_set_local_ece(_id: *mut rdma_cm_id, _ece: *mut c_void) -> c_int {
    fail(libc::EOPNOTSUPP)
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_get_remote_ece(_id: *mut rdma_cm_id, _ece: *mut c_void) -> c_int {
    fail(libc::EOPNOTSUPP)
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_reject_ece(_id: *mut rdma_cm_id, _pdata: *const c_void, _len: u8) -> c_int {
    fail(libc::EOPNOTSUPP)
}
