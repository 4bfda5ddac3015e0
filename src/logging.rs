//! rdmx logs through the `log` crate. A daemon can route those lines into its own log with a
//! sink (from C: `rdmx_log_set_callback`); without one, warnings and errors go to stderr.
//!
//! If the host program (a Rust one) already installed a `log` logger, rdmx leaves it alone
//! and its lines go there.

use log::{LevelFilter, Log, Metadata, Record};
use parking_lot::RwLock;
use std::sync::Once;

/// Receives every log line rdmx emits at or above the configured level.
pub type Sink = Box<dyn Fn(log::Level, &str) + Send + Sync>;

struct RdmxLogger {
    sink: RwLock<Option<Sink>>,
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
        match &*self.sink.read() {
            Some(sink) => sink(record.level(), &line),
            None => eprintln!("rdmx {} {}", record.level(), line),
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
    *LOGGER.sink.write() = sink;
    log::set_max_level(level);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn sink_receives_lines_at_or_above_level() {
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
}
