//! `rdmx_log_set_callback`: route rdmx's log lines into the host daemon's log.

use super::boundary;
use super::status::rdmx_status;
use crate::error::{Error, ErrorKind};
use log::{Level, LevelFilter};
use std::ffi::{CString, c_char, c_void};

/// Log levels, most severe first. A level filter passes its own and all more severe lines.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rdmx_log_level {
    RDMX_LOG_OFF = 0,
    RDMX_LOG_ERROR = 1,
    RDMX_LOG_WARN = 2,
    RDMX_LOG_INFO = 3,
    RDMX_LOG_DEBUG = 4,
    RDMX_LOG_TRACE = 5,
}

/// Receives one log line: `message` is NUL-terminated, borrowed for the duration of the
/// call only. May be called from any rdmx thread. Must not call `rdmx_log_set_callback`.
#[allow(non_camel_case_types)]
pub type rdmx_log_callback = Option<
    unsafe extern "C" fn(user_data: *mut c_void, level: rdmx_log_level, message: *const c_char),
>;

/// The user's pointer, handed back to the callback untouched.
struct UserData(*mut c_void);

impl UserData {
    // A method (not `.0`) so closures capture the whole Send/Sync wrapper.
    fn ptr(&self) -> *mut c_void {
        self.0
    }
}
// SAFETY: rdmx never dereferences the pointer; the caller of rdmx_log_set_callback promises
// (header docs) that its callback may be invoked from any thread with it.
unsafe impl Send for UserData {}
// SAFETY: as above; rdmx only copies the pointer value.
unsafe impl Sync for UserData {}

fn level_of(l: Level) -> rdmx_log_level {
    match l {
        Level::Error => rdmx_log_level::RDMX_LOG_ERROR,
        Level::Warn => rdmx_log_level::RDMX_LOG_WARN,
        Level::Info => rdmx_log_level::RDMX_LOG_INFO,
        Level::Debug => rdmx_log_level::RDMX_LOG_DEBUG,
        Level::Trace => rdmx_log_level::RDMX_LOG_TRACE,
    }
}

/// Sends rdmx's log lines at `level` (an `rdmx_log_level`, 0..5) and more severe to
/// `callback(user_data, level, message)`. A NULL callback restores the default sink,
/// stderr, with the given level. Default before any call: warnings and errors to stderr.
/// `user_data` is passed back untouched and must stay valid while the callback is set;
/// the callback may run on any thread. RDMX_INVALID_ARGUMENT for a level outside 0..5.
#[unsafe(no_mangle)]
pub extern "C" fn rdmx_log_set_callback(
    callback: rdmx_log_callback,
    level: i32,
    user_data: *mut c_void,
) -> rdmx_status {
    boundary::call("rdmx_log_set_callback", || {
        let filter = match level {
            0 => LevelFilter::Off,
            1 => LevelFilter::Error,
            2 => LevelFilter::Warn,
            3 => LevelFilter::Info,
            4 => LevelFilter::Debug,
            5 => LevelFilter::Trace,
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!("level: invalid value {level}: allowed 0 (off) .. 5 (trace)"),
                ));
            }
        };
        let sink: Option<crate::logging::Sink> = callback.map(|cb| {
            let user = UserData(user_data);
            let sink: crate::logging::Sink = Box::new(move |lvl: Level, msg: &str| {
                let c = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
                // SAFETY: `cb` is the caller's function pointer with the documented
                // signature; `c` outlives the call; the user pointer is handed back untouched.
                unsafe { cb(user.ptr(), level_of(lvl), c.as_ptr()) };
            });
            sink
        });
        crate::logging::set_sink(sink, filter);
        Ok(())
    })
}
