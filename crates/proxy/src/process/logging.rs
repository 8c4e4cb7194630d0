//! Logging for the long-running processes (`slipstream node`, `waypoint`,
//! `control`, and the local cluster's `agent`): tracing to stderr, with
//! repeated lines rate-limited per call site.
//!
//! Each call site (one `tracing::warn!(...)` in the source) may emit a burst
//! of lines, then a few per second; what is over that is dropped, and the
//! next line let through from that call site (or the first log line of any
//! call site once its flood has ended) is preceded by one line saying how
//! many were suppressed. A loop that fails the same way for every pod every
//! tick thus writes a few lines a second, not tens of thousands.
//!
//! Lines with the target [`slipstream_core::PER_SOURCE_LOG_TARGET`] are let
//! through: their emitter limits them per source (the node proxy's refusal
//! lines), and one call site shared by every source would let a flooding
//! source hide the others' lines.
//!
//! The decision is the pure [`RateLimiter`] (unit-tested with a fake clock);
//! [`RateLimitLayer`] is the thin tracing layer around it. Its cost per
//! event is one map lookup under the lock; looking for floods that ended
//! walks only the call sites that are suppressing, at most every
//! [`SWEEP_EVERY`].

use slipstream_core::bucket::Rate;
pub use slipstream_core::log_limit::Decision;
use slipstream_core::log_limit::LogLimiter;
use slipstream_core::sync::LockExt;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tracing::{Event, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// Target of the summary lines (never rate-limited themselves).
pub const SUMMARY_TARGET: &str = "slipstream::log_limit";

/// How often the layer looks for floods that ended.
pub const SWEEP_EVERY: Duration = Duration::from_millis(200);

/// Whether the call-site limiter leaves lines of `target` alone.
fn exempt(target: &str) -> bool {
    target == SUMMARY_TARGET || target == slipstream_core::PER_SOURCE_LOG_TARGET || target == slipstream_core::ACCESS_LOG_TARGET
}

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Lines a call site may emit at once.
    pub burst: u32,
    /// Lines per second it may emit after the burst.
    pub per_second: f64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { burst: 10, per_second: 5.0 }
    }
}

impl Limits {
    fn rate(&self) -> Rate {
        Rate { burst: f64::from(self.burst), per_second: self.per_second }
    }
}

/// Call sites a process has are few and fixed: never a reason to forget.
const MAX_CALL_SITES: usize = 1 << 16;

/// The call sites' limiter ([`LogLimiter`]), and when it last looked for
/// floods that ended.
#[derive(Debug)]
pub struct RateLimiter<K> {
    limiter: LogLimiter<K>,
    next_sweep: Option<Instant>,
}

impl<K: Hash + Eq + Clone> RateLimiter<K> {
    pub fn new(limits: Limits) -> Self {
        RateLimiter { limiter: LogLimiter::new(limits.rate(), MAX_CALL_SITES), next_sweep: None }
    }

    /// Whether it is time to look for ended floods (then not again for
    /// [`SWEEP_EVERY`]); false at once while no key is suppressing.
    pub fn sweep_due(&mut self, now: Instant) -> bool {
        if !self.limiter.is_suppressing() || self.next_sweep.is_some_and(|t| now < t) {
            return false;
        }
        self.next_sweep = Some(now + SWEEP_EVERY);
        true
    }

    /// Whether a line of `key` at `now` is written.
    pub fn decide(&mut self, key: &K, now: Instant) -> Decision {
        self.limiter.decide(key, now)
    }

    /// Keys whose flood has ended, with how many lines they suppressed.
    pub fn ended_floods(&mut self, now: Instant) -> Vec<(K, u64)> {
        self.limiter.ended_floods(now)
    }
}

/// A call site, compared by identity.
#[derive(Clone, Copy)]
struct Site(&'static Metadata<'static>);

impl PartialEq for Site {
    fn eq(&self, o: &Self) -> bool {
        std::ptr::eq(self.0, o.0)
    }
}
impl Eq for Site {}
impl Hash for Site {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        (self.0 as *const Metadata<'static>).hash(h)
    }
}

/// Drops events over the limit of their call site (for every layer) and
/// writes the summary lines.
pub struct RateLimitLayer {
    limiter: Mutex<RateLimiter<Site>>,
}

impl RateLimitLayer {
    pub fn new(limits: Limits) -> Self {
        RateLimitLayer { limiter: Mutex::new(RateLimiter::new(limits)) }
    }
}

fn summary(site: &'static Metadata<'static>, n: u64) {
    tracing::warn!(
        target: SUMMARY_TARGET,
        "suppressed {n} repeated log line(s) from {}:{} ({})",
        site.file().unwrap_or("?"),
        site.line().unwrap_or(0),
        site.target()
    );
}

impl<S: Subscriber> Layer<S> for RateLimitLayer {
    fn event_enabled(&self, event: &Event<'_>, _ctx: Context<'_, S>) -> bool {
        let meta = event.metadata();
        if exempt(meta.target()) {
            return true;
        }
        let now = Instant::now();
        let (decision, ended) = {
            let mut l = self.limiter.locked();
            let site = Site(meta);
            let d = l.decide(&site, now);
            let ended = if l.sweep_due(now) { l.ended_floods(now) } else { Vec::new() };
            (d, ended)
        };
        // Emitted with the lock released: the summary is an event too.
        for (s, n) in ended {
            summary(s.0, n);
        }
        match decision {
            Decision::Allow => true,
            Decision::AllowAfterSuppressed(n) => {
                summary(meta, n);
                true
            }
            Decision::Suppress => false,
        }
    }
}

/// Installs the global subscriber: `SLIPSTREAM_LOG` (an EnvFilter, default
/// `info`), plain text to stderr, repeated lines rate-limited.
pub fn init() {
    init_with_writer(std::io::stderr);
}

/// [`init`], the lines written by `writer` (the waypoint's, which gathers
/// them per scheduler pass).
pub fn init_with_writer<W>(writer: W)
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::EnvFilter::try_from_env("SLIPSTREAM_LOG").unwrap_or_else(|_| "info".into());
    tracing_subscriber::registry()
        .with(filter)
        .with(RateLimitLayer::new(Limits::default()))
        .with(tracing_subscriber::fmt::layer().with_ansi(false).with_writer(writer))
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn only_suppressing_keys_are_swept_and_not_on_every_event() {
        let t0 = Instant::now();
        let mut l = RateLimiter::new(Limits { burst: 1, per_second: 1.0 });
        // Many quiet call sites: none is ever looked at by a sweep.
        for k in 0..10_000u32 {
            assert_eq!(l.decide(&k, t0), Decision::Allow);
        }
        assert!(!l.sweep_due(t0), "nothing suppressing: no sweep");
        assert_eq!(l.decide(&7, t0), Decision::Suppress);
        // (offset in ms, sweep due?): at most one sweep per SWEEP_EVERY.
        for (at, due) in [(0, true), (50, false), (199, false), (200, true), (300, false), (400, true)] {
            assert_eq!(l.sweep_due(t0 + ms(at)), due, "at {at} ms");
        }
        assert!(l.ended_floods(t0 + ms(500)).is_empty(), "no token back yet");
        assert_eq!(l.ended_floods(t0 + ms(1000)), vec![(7, 1)]);
        assert!(!l.sweep_due(t0 + ms(5000)), "reported once, then nothing to sweep");
        // A line let through after its flood reports it and leaves the set.
        l.decide(&8, t0 + ms(5000));
        assert_eq!(l.decide(&8, t0 + ms(5000)), Decision::Suppress);
        assert_eq!(l.decide(&8, t0 + ms(6000)), Decision::AllowAfterSuppressed(1));
        assert!(!l.sweep_due(t0 + ms(9000)));
    }

    #[test]
    fn per_source_lines_and_summaries_pass_the_call_site_limit() {
        assert!(exempt(SUMMARY_TARGET));
        assert!(exempt(slipstream_core::PER_SOURCE_LOG_TARGET));
        assert!(exempt(slipstream_core::ACCESS_LOG_TARGET));
        assert!(!exempt("slipstream_node::conn"));
    }
}
