//! Telemetry of the node proxy: Istio's L4 metrics (`metrics`), one
//! access-log line per connection (`accesslog`), and the connection record
//! that writes both from one outcome (`record`).

pub mod accesslog;
pub mod metrics;
pub mod record;

pub use accesslog::AccessLogEntry;
pub use metrics::{Metrics, Reporter};
pub use record::{AppSide, ConnInfo, ConnRecord, Metered, SrcIdentity};

use slipstream_core::sync::LockExt;
use slipstream_proxy::limits::{LogDecision, RefusalLog};
use std::time::{Duration, Instant};

/// The target of refusal lines and their summaries: limited per source
/// here, so the per-call-site log limiter lets them through.
pub const REFUSAL_TARGET: &str = slipstream_core::PER_SOURCE_LOG_TARGET;

pub struct Telemetry {
    pub metrics: Metrics,
    pub json_log: bool,
    /// Refusals (self-calls, limits) log a few lines per source and
    /// second; the metrics count every one.
    pub refusal_log: RefusalLog<String>,
    /// Where access-log lines go (standard output, or a test's buffer).
    sink: Sink,
}

/// Where access-log lines are written.
pub enum Sink {
    Stdout,
    /// Kept in memory: the in-process tests read them back.
    Memory(std::sync::Mutex<Vec<String>>),
}

impl Telemetry {
    pub fn with_sink(json_log: bool, refusal_log_burst: u32, sink: Sink) -> Telemetry {
        Telemetry { metrics: Metrics::default(), json_log, refusal_log: RefusalLog::new(refusal_log_burst, Duration::from_secs(1)), sink }
    }

    pub fn log(&self, e: &AccessLogEntry) {
        let line = e.render(self.json_log);
        match &self.sink {
            Sink::Stdout => println!("{line}"),
            Sink::Memory(m) => m.locked().push(line),
        }
    }

    /// The lines written so far (the in-memory sink only).
    pub fn lines(&self) -> Vec<String> {
        match &self.sink {
            Sink::Stdout => Vec::new(),
            Sink::Memory(m) => m.locked().clone(),
        }
    }

    /// Whether a refusal from `source` gets its log lines now.
    pub fn log_refusal(&self, source: &str) -> bool {
        self.refusal_log.check(source, Instant::now()) == LogDecision::Log
    }

    /// One WARN line per source whose refusal lines were suppressed in
    /// the last second, saying how many; call it every second.
    pub fn summarise_refusals(&self) {
        for (source, n) in self.refusal_log.summaries(Instant::now()) {
            tracing::warn!(target: REFUSAL_TARGET, %source, suppressed = n, "{n} more refusals of this source not logged (log lines are limited per source; the metrics count every one)");
        }
        match self.refusal_log.take_untracked() {
            0 => {}
            n => {
                tracing::warn!(target: REFUSAL_TARGET, suppressed = n, "{n} more refusals of sources no longer tracked not logged (too many sources at once; the metrics count every one)")
            }
        }
    }
}
