//! Gives the memory of closed connections back to the kernel, so the node
//! proxy's resident size follows its open connections down after a burst
//! or a bulk transfer (docs/benchmarks.md, R1). The decision is pure; the
//! caller does the trim.

use std::time::{Duration, Instant};

/// How often the closed-connection count is checked (an atomic load).
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// Trim at once when at least this many connections closed since the last
/// trim: megabytes of freed state, worth a pass over the heap (about a
/// millisecond).
pub const CLOSED_THRESHOLD: u64 = 1000;

/// Otherwise trim when any connection closed and the last trim is this old:
/// a finished bulk transfer leaves megabytes of free buffers behind, and a
/// trickle of closes costs at most one trim per period.
pub const LAZY_PERIOD: Duration = Duration::from_secs(30);

#[derive(Debug)]
pub struct Trimmer {
    closed_at_last_trim: u64,
    last_trim: Instant,
}

impl Trimmer {
    pub fn new(now: Instant) -> Trimmer {
        Trimmer { closed_at_last_trim: 0, last_trim: now }
    }

    /// Whether to trim now, given the total of connections closed so far.
    pub fn due(&mut self, closed_total: u64, now: Instant) -> bool {
        let closed = closed_total.saturating_sub(self.closed_at_last_trim);
        let due = closed >= CLOSED_THRESHOLD || (closed > 0 && now.duration_since(self.last_trim) >= LAZY_PERIOD);
        if due {
            self.closed_at_last_trim = closed_total;
            self.last_trim = now;
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_at_once_after_a_burst_of_closes() {
        let t0 = Instant::now();
        let mut t = Trimmer::new(t0);
        assert!(!t.due(0, t0));
        assert!(!t.due(999, t0));
        assert!(t.due(1000, t0));
        assert!(!t.due(1500, t0), "counted from the last trim");
        assert!(t.due(10_000, t0));
        assert!(!t.due(10_000, t0));
    }

    #[test]
    fn trims_lazily_after_a_few_closes_and_never_when_nothing_closed() {
        let t0 = Instant::now();
        let mut t = Trimmer::new(t0);
        assert!(!t.due(0, t0 + LAZY_PERIOD * 10), "nothing closed, nothing to give back");
        assert!(!t.due(1, t0 + LAZY_PERIOD / 2));
        assert!(t.due(1, t0 + LAZY_PERIOD));
        assert!(!t.due(2, t0 + LAZY_PERIOD + Duration::from_secs(1)), "at most one lazy trim per period");
        assert!(t.due(2, t0 + LAZY_PERIOD * 2));
    }
}
