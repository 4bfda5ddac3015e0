//! rdmx logs through the `log` crate. A daemon can route those lines into its own log with a
//! sink (from C: `rdmx_log_set_callback`); without one, warnings and errors go to stderr.
//!
//! If the host program (a Rust one) already installed a `log` logger, rdmx leaves it alone
//! and its lines go there.

use log::{LevelFilter, Log, Metadata, Record};
use parking_lot::RwLock;
use std::cell::Cell;
use std::sync::{Arc, Once};

/// Receives every log line rdmx emits at or above the configured level.
pub type Sink = Box<dyn Fn(log::Level, &str) + Send + Sync>;

/// A sink as kept: shared, so it can be called outside the lock.
type SharedSink = Arc<dyn Fn(log::Level, &str) + Send + Sync>;

struct RdmxLogger {
    /// Cloned out of the lock before it is called: a sink may log, or replace the sink,
    /// from inside without deadlocking.
    sink: RwLock<Option<SharedSink>>,
}

thread_local! {
    /// Set while this thread runs the sink: a line the sink itself causes goes to stderr
    /// instead of recursing into it.
    static IN_SINK: Cell<bool> = const { Cell::new(false) };
}

static LOGGER: RdmxLogger = RdmxLogger {
    sink: RwLock::new(None),
};
static INIT: Once = Once::new();

impl Log for RdmxLogger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let line = format!("{}: {}", record.target(), record.args());
        let sink = self.sink.read().clone();
        match sink {
            Some(sink) if !IN_SINK.with(Cell::get) => {
                IN_SINK.with(|c| c.set(true));
                // A panicking sink must not leave the flag set (the FFI boundary catches
                // the panic and the thread goes on).
                struct Reset;
                impl Drop for Reset {
                    fn drop(&mut self) {
                        IN_SINK.with(|c| c.set(false));
                    }
                }
                let _reset = Reset;
                sink(record.level(), &line);
            }
            _ => eprintln!("rdmx {} {}", record.level(), line),
        }
    }

    fn flush(&self) {}
}

/// The level named by `RDMX_LOG` (off, error, warn, info, debug, trace), else warn.
fn level_from_env() -> LevelFilter {
    std::env::var("RDMX_LOG")
        .ok()
        .and_then(|v| v.trim().parse::<LevelFilter>().ok())
        .unwrap_or(LevelFilter::Warn)
}

/// Installs rdmx's logger (once) with the level from `RDMX_LOG`, by default warnings and
/// errors. Called by every C entry point; harmless to call again.
pub fn init() {
    INIT.call_once(|| {
        if log::set_logger(&LOGGER).is_ok() {
            log::set_max_level(level_from_env());
        }
    });
}

/// Routes log lines to `sink` (None: back to stderr) and sets the level filter.
pub fn set_sink(sink: Option<Sink>, level: LevelFilter) {
    init();
    *LOGGER.sink.write() = sink.map(Arc::from);
    log::set_max_level(level);
}

/// The text of a caught panic's payload (`panic!` with a literal or a format), for the
/// error line that reports it.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// The sink is process-wide: these tests take turns.
    static SERIAL: Mutex<()> = Mutex::new(());

    #[test]
    fn sink_receives_lines_at_or_above_level() {
        let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = Arc::clone(&seen);
        set_sink(
            Some(Box::new(move |lvl, msg| {
                s2.lock().unwrap().push((lvl, msg.to_string()))
            })),
            LevelFilter::Info,
        );
        log::info!(target: "rdmx::test", "hello {}", 42);
        log::debug!(target: "rdmx::test", "filtered out");
        set_sink(None, LevelFilter::Warn);
        log::info!(target: "rdmx::test", "after reset, filtered");
        let seen = seen.lock().unwrap();
        assert_eq!(
            *seen,
            vec![(log::Level::Info, "rdmx::test: hello 42".to_string())]
        );
    }

    #[test]
    fn a_sink_that_logs_or_replaces_the_sink_does_not_deadlock() {
        let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let seen = Arc::new(Mutex::new(Vec::new()));
            let s2 = Arc::clone(&seen);
            set_sink(
                Some(Box::new(move |_, msg| {
                    s2.lock().unwrap().push(msg.to_string());
                    // Logging from inside the sink: goes to stderr, no recursion.
                    log::warn!(target: "rdmx::test", "from inside the sink");
                    // Replacing the sink from inside: takes the write lock.
                    if msg.contains("replace") {
                        set_sink(None, LevelFilter::Warn);
                    }
                })),
                LevelFilter::Info,
            );
            log::warn!(target: "rdmx::test", "first");
            log::warn!(target: "rdmx::test", "replace");
            log::warn!(target: "rdmx::test", "after: to stderr");
            let got = seen.lock().unwrap().clone();
            let _ = tx.send(got);
        });
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("logging from a sink deadlocked");
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(
            got[0].ends_with("first") && got[1].ends_with("replace"),
            "{got:?}"
        );
    }
}
