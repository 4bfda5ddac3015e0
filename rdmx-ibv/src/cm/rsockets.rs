//! librdmacm's rsockets (`rsocket`, `rsend`, ...): not provided. They answer ENOSYS
//! instead of running librdmacm's own, whose internal calls (through its PLT) would
//! reach this library's `rdma_*` functions with librdmacm's private structures in mind.
//! No rsocket is ever handed out, so every call fails the same way. The parameters are
//! not declared: the C caller passes them, the callee ignores them (the C calling
//! convention lets it).

use crate::glue::set_errno;
use std::ffi::c_int;

macro_rules! enosys {
    ($ret:ty, $err:expr; $($name:ident),* $(,)?) => {
        $(
            #[doc = concat!("`", stringify!($name), "`: ENOSYS (rsockets are not provided).")]
            #[unsafe(no_mangle)]
            pub extern "C" fn $name() -> $ret {
                set_errno(libc::ENOSYS);
                $err
            }
        )*
    };
}

enosys!(c_int, -1;
    rsocket, rbind, rlisten, raccept, rconnect, rshutdown, rclose, rpoll, rselect,
    rgetpeername, rgetsockname, rsetsockopt, rgetsockopt, rfcntl, riounmap,
);
enosys!(isize, -1;
    rrecv, rrecvfrom, rrecvmsg, rsend, rsendto, rsendmsg, rread, rreadv, rwrite, rwritev,
);
enosys!(libc::off_t, -1; riomap);
enosys!(usize, 0; riowrite);
