//! Per-caller bounds of the certificate service: how many requests a node
//! proxy may make (a token bucket), how many may be under way at once, and
//! how many refusal lines it may cause in the log. One node proxy, broken
//! or hostile, cannot starve the others or flood the log.
//!
//! Pure counters behind one lock; time is passed in, so the tests need no
//! clock.

use slipstream_core::sync::LockExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

pub use slipstream_core::bucket::Rate;
use slipstream_core::bucket::TokenBucket;
use slipstream_core::log_limit::{Decision, LogLimiter};

/// The bounds, per caller (a node, or for unauthenticated calls the peer
/// address).
#[derive(Debug, Clone, PartialEq)]
pub struct CallerLimits {
    /// Certificate requests: a node proxy starting with a full node asks
    /// for every pod's identity at once, then one per identity per
    /// half-life.
    pub requests: Rate,
    /// Requests of one caller being served at the same time.
    pub in_flight: usize,
    /// Refusal lines in the log; the rest are counted and the count is
    /// reported with the next line that is written.
    pub refusal_logs: Rate,
    /// Callers remembered at most; idle ones are forgotten first.
    pub max_callers: usize,
}

impl Default for CallerLimits {
    fn default() -> Self {
        CallerLimits {
            // 256 at once covers a node's pods (Kubernetes' default maximum
            // is 110) twice over; 32 a second is a full node's worth every
            // few seconds.
            requests: Rate { burst: 256.0, per_second: 32.0 },
            in_flight: 32,
            refusal_logs: Rate { burst: 5.0, per_second: 0.1 },
            max_callers: 16_384,
        }
    }
}

/// Why a request was not admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Limited {
    #[error("too many certificate requests from {0}; retry later")]
    Rate(String),
    #[error("too many certificate requests from {0} under way at once; retry later")]
    InFlight(String),
}

#[derive(Debug)]
struct Entry {
    requests: TokenBucket,
    in_flight: usize,
    seen: Instant,
}

/// The per-caller state. Clones share it.
#[derive(Debug, Clone)]
pub struct Limits {
    config: CallerLimits,
    callers: Arc<Mutex<HashMap<String, Entry>>>,
    /// Refusal lines per caller (the one log limiter).
    logs: Arc<Mutex<LogLimiter<String>>>,
}

/// One admitted request; dropping it frees its in-flight slot.
#[derive(Debug)]
pub struct Permit {
    callers: Arc<Mutex<HashMap<String, Entry>>>,
    key: String,
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(e) = lock(&self.callers).get_mut(&self.key) {
            e.in_flight = e.in_flight.saturating_sub(1);
        }
    }
}

/// What to do with one refusal line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogDecision {
    /// Write it, saying how many were left out since the last one.
    Write {
        suppressed: u64,
    },
    Suppress,
}

fn lock(m: &Mutex<HashMap<String, Entry>>) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
    // Every mutation is a few field updates that cannot panic halfway.
    m.locked()
}

impl Limits {
    pub fn new(config: CallerLimits) -> Limits {
        let logs = Arc::new(Mutex::new(LogLimiter::new(config.refusal_logs, config.max_callers)));
        Limits { config, callers: Arc::default(), logs }
    }

    pub fn config(&self) -> &CallerLimits {
        &self.config
    }

    fn entry<'a>(&self, map: &'a mut HashMap<String, Entry>, key: &str, now: Instant) -> &'a mut Entry {
        if !map.contains_key(key) {
            if map.len() >= self.config.max_callers {
                self.forget_idle(map, now);
            }
            map.insert(key.to_string(), Entry { requests: TokenBucket::full(self.config.requests, now), in_flight: 0, seen: now });
        }
        let e = map.get_mut(key).expect("inserted above");
        e.seen = now;
        e
    }

    /// Drops the callers that hold nothing: no request under way, the
    /// bucket would be full again (refusal lines are counted apart). If that
    /// is not enough, the least recently seen idle half goes.
    fn forget_idle(&self, map: &mut HashMap<String, Entry>, now: Instant) {
        let quiet = self.config.requests.refill_time();
        map.retain(|_, e| e.in_flight > 0 || now.saturating_duration_since(e.seen) < quiet);
        if map.len() >= self.config.max_callers {
            let mut idle: Vec<(Instant, String)> = map.iter().filter(|(_, e)| e.in_flight == 0).map(|(k, e)| (e.seen, k.clone())).collect();
            idle.sort();
            for (_, k) in idle.into_iter().take(map.len() / 2 + 1) {
                map.remove(&k);
            }
        }
    }

    /// Admits one request of `caller`, or says which bound it hit.
    pub fn admit(&self, caller: &str, now: Instant) -> Result<Permit, Limited> {
        let mut map = lock(&self.callers);
        let e = self.entry(&mut map, caller, now);
        if e.in_flight >= self.config.in_flight {
            return Err(Limited::InFlight(caller.to_string()));
        }
        if e.requests.take(self.config.requests, now).is_err() {
            return Err(Limited::Rate(caller.to_string()));
        }
        e.in_flight += 1;
        Ok(Permit { callers: self.callers.clone(), key: caller.to_string() })
    }

    /// Whether to log one more refusal of `caller`.
    pub fn log_refusal(&self, caller: &str, now: Instant) -> LogDecision {
        match self.logs.locked().decide(caller, now) {
            Decision::Allow => LogDecision::Write { suppressed: 0 },
            Decision::AllowAfterSuppressed(n) => LogDecision::Write { suppressed: n },
            Decision::Suppress => LogDecision::Suppress,
        }
    }

    /// Callers currently remembered (for tests and the config dump).
    pub fn tracked(&self) -> usize {
        lock(&self.callers).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn limits(burst: f64, per_second: f64, in_flight: usize) -> Limits {
        Limits::new(CallerLimits {
            requests: Rate { burst, per_second },
            in_flight,
            refusal_logs: Rate { burst: 2.0, per_second: 1.0 },
            max_callers: 4,
        })
    }

    #[test]
    fn a_caller_spends_its_own_burst_and_refills() {
        let l = limits(3.0, 1.0, 100);
        let t0 = Instant::now();
        let held: Vec<_> = (0..3).map(|_| l.admit("node1", t0).unwrap()).collect();
        assert_eq!(l.admit("node1", t0).unwrap_err(), Limited::Rate("node1".into()));
        // Another node is not affected.
        assert!(l.admit("node2", t0).is_ok());
        // One token back after a second, not two.
        assert!(l.admit("node1", t0 + Duration::from_secs(1)).is_ok());
        assert!(l.admit("node1", t0 + Duration::from_secs(1)).is_err());
        drop(held);
    }

    #[test]
    fn in_flight_is_bounded_and_released_by_the_permit() {
        let l = limits(100.0, 100.0, 2);
        let t0 = Instant::now();
        let a = l.admit("node1", t0).unwrap();
        let _b = l.admit("node1", t0).unwrap();
        assert_eq!(l.admit("node1", t0).unwrap_err(), Limited::InFlight("node1".into()));
        drop(a);
        assert!(l.admit("node1", t0).is_ok());
        assert_eq!(
            Limited::InFlight("node1".into()).to_string(),
            "too many certificate requests from node1 under way at once; retry later"
        );
    }

    #[test]
    fn refusal_lines_are_rate_limited_and_the_rest_counted() {
        let l = limits(1.0, 1.0, 1);
        let t0 = Instant::now();
        assert_eq!(l.log_refusal("node1", t0), LogDecision::Write { suppressed: 0 });
        assert_eq!(l.log_refusal("node1", t0), LogDecision::Write { suppressed: 0 });
        for _ in 0..1000 {
            assert_eq!(l.log_refusal("node1", t0), LogDecision::Suppress);
        }
        assert_eq!(l.log_refusal("node2", t0), LogDecision::Write { suppressed: 0 });
        assert_eq!(l.log_refusal("node1", t0 + Duration::from_secs(1)), LogDecision::Write { suppressed: 1000 });
    }

    #[test]
    fn memory_is_bounded_by_forgetting_idle_callers() {
        let l = limits(1.0, 1.0, 10);
        let t0 = Instant::now();
        let busy = l.admit("busy", t0).unwrap();
        for i in 0..100 {
            let _ = l.admit(&format!("peer{i}"), t0 + Duration::from_millis(i));
            assert!(l.tracked() <= 4, "{} callers tracked", l.tracked());
        }
        // The caller with a request under way was kept.
        assert!(lock(&l.callers).contains_key("busy"));
        drop(busy);
    }
}
