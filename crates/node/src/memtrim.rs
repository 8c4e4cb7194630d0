//! Gives the memory of closed connections back to the kernel, so the node
//! proxy's resident size follows its open connections down after a burst
//! (docs/benchmarks.md, R1). The decision is pure; the caller does the trim.

use std::time::Duration;

/// How often the closed-connection count is checked (an atomic load).
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// Trim once at least this many connections closed since the last trim: a
/// few hundred kilobytes of freed state, worth a pass over the heap (which
/// costs about a millisecond), while a steady trickle of closes never does.
pub const CLOSED_THRESHOLD: u64 = 1000;

#[derive(Debug, Default)]
pub struct Trimmer {
    closed_at_last_trim: u64,
}

impl Trimmer {
    /// Whether to trim now, given the total of connections closed so far.
    pub fn due(&mut self, closed_total: u64) -> bool {
        if closed_total.saturating_sub(self.closed_at_last_trim) >= CLOSED_THRESHOLD {
            self.closed_at_last_trim = closed_total;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_after_a_burst_of_closes_not_a_trickle() {
        let mut t = Trimmer::default();
        assert!(!t.due(0));
        assert!(!t.due(999));
        assert!(t.due(1000));
        assert!(!t.due(1500), "counted from the last trim");
        assert!(t.due(10_000));
        assert!(!t.due(10_000));
    }
}
