//! The waypoint's log lines (one access-log line per request) gathered per
//! pass of the runtime's scheduler and written to stderr together.
//!
//! A `write(2)` per request was 3 to 5 % of the waypoint's CPU under load
//! (docs/waypoint.md, "Where the time goes"). A line is appended to a buffer and the
//! [`flusher`] task is notified; it yields once, so the other requests
//! answered in the same pass add theirs, then writes the buffer in one call.
//! Nothing waits for a timer: a line reaches the pod's log a few
//! microseconds after the request it describes, before its answer's bytes
//! have left the waypoint's socket (they are gathered the same way,
//! `hbone::coalesce`).
//!
//! Lines are written at once when no flusher runs (before the runtime
//! starts, after it stops), for warnings and errors, and when 64 KiB are
//! waiting. [`flush`] writes what is left; the `slipstream waypoint` command
//! calls it on exit and from its panic hook.

use slipstream_core::sync::LockExt;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use tokio::sync::Notify;
use tracing::{Level, Metadata};
use tracing_subscriber::fmt::MakeWriter;

/// Written at once past this much.
const HIGH_WATER: usize = 64 * 1024;

static BUFFER: Mutex<Vec<u8>> = Mutex::new(Vec::new());
static WAITING: Notify = Notify::const_new();
static FLUSHER: AtomicBool = AtomicBool::new(false);

fn buffer() -> MutexGuard<'static, Vec<u8>> {
    BUFFER.locked()
}

/// Writes every gathered line to stderr.
pub fn flush() {
    let mut b = buffer();
    if !b.is_empty() {
        // Nowhere to report a failed write of the log itself.
        let _ = std::io::stderr().write_all(&b);
        b.clear();
        if b.capacity() > HIGH_WATER * 2 {
            *b = Vec::new();
        }
    }
}

/// The task that writes the gathered lines once per scheduler pass; runs
/// until the runtime stops (then lines are written at once again).
pub async fn flusher() {
    struct Running;
    impl Drop for Running {
        fn drop(&mut self) {
            FLUSHER.store(false, Ordering::Release);
            flush();
        }
    }
    FLUSHER.store(true, Ordering::Release);
    let _running = Running;
    loop {
        WAITING.notified().await;
        tokio::task::yield_now().await;
        flush();
    }
}

/// Appends one line (an access-log line written without `tracing`'s
/// formatter, [`crate::accesslog`]) as an `info` line is: it waits for the
/// flusher's pass, or is written at once when no flusher runs or the
/// buffer is full.
pub fn append(write: impl FnOnce(&mut Vec<u8>)) {
    let full = {
        let mut b = buffer();
        write(&mut b);
        b.len() >= HIGH_WATER
    };
    line_done(full);
}

/// After a line went into the buffer: written at once when `now` (a
/// warning, a full buffer) or when no flusher runs, else left for the
/// flusher's pass.
fn line_done(now: bool) {
    if now || !FLUSHER.load(Ordering::Acquire) {
        flush();
    } else {
        WAITING.notify_one();
    }
}

/// The `MakeWriter` of the waypoint's log.
#[derive(Debug, Clone, Copy, Default)]
pub struct Writer;

/// One line being written.
pub struct Line {
    at_once: bool,
    /// The buffer reached [`HIGH_WATER`] with it.
    full: bool,
}

impl Write for Line {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let mut b = buffer();
        b.extend_from_slice(data);
        self.full |= b.len() >= HIGH_WATER;
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        line_done(self.at_once || self.full);
    }
}

impl<'a> MakeWriter<'a> for Writer {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        Line { at_once: false, full: false }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> Line {
        Line { at_once: *meta.level() <= Level::WARN, full: false }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_are_written_at_once_info_waits_for_the_pass() {
        // The buffer is process-wide: this is the only test touching it.
        let (info, warn) = (event(Level::INFO), event(Level::WARN));
        FLUSHER.store(true, Ordering::Release);
        {
            let mut l = Writer.make_writer_for(&info);
            l.write_all(b"a line\n").unwrap();
        }
        assert_eq!(&buffer()[..], b"a line\n", "kept for the flusher");
        {
            let mut l = Writer.make_writer_for(&warn);
            l.write_all(b"a warning\n").unwrap();
        }
        assert!(buffer().is_empty(), "a warning writes everything gathered");
        FLUSHER.store(false, Ordering::Release);
        {
            let mut l = Writer.make_writer_for(&info);
            l.write_all(b"no flusher\n").unwrap();
        }
        assert!(buffer().is_empty(), "without a flusher lines are written at once");
    }

    fn event(level: Level) -> Metadata<'static> {
        let fields = tracing::field::FieldSet::new(&[], tracing::callsite::Identifier(&CS));
        Metadata::new("event", "t", level, None, None, None, fields, tracing::metadata::Kind::EVENT)
    }

    struct Cs;
    impl tracing::callsite::Callsite for Cs {
        fn set_interest(&self, _: tracing::subscriber::Interest) {}
        fn metadata(&self) -> &tracing::Metadata<'_> {
            unreachable!()
        }
    }
    static CS: Cs = Cs;
}
