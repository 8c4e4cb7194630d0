//! The mesh's one log limiter: per key (a call site, a source, a caller) a
//! burst of lines, then a steady rate ([`crate::bucket`]); what is over is
//! counted, never lost: the count goes with the next line of that key let
//! through, or, once the key's flood has ended, to [`LogLimiter::ended_floods`].
//! The process logs, the node proxy's and the waypoint's refusal lines per
//! source and the certificate service's per caller all use it. Pure: time
//! is passed in, so tests need no clock.

use crate::bucket::{Rate, TokenBucket};
use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::time::Instant;

/// What to do with one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Allow, after saying that this many lines of the same key were
    /// suppressed since the last one let through.
    AllowAfterSuppressed(u64),
    Suppress,
}

impl Decision {
    /// Whether the line is written.
    pub fn allows(self) -> bool {
        !matches!(self, Decision::Suppress)
    }
}

#[derive(Debug)]
struct Key {
    bucket: TokenBucket,
    suppressed: u64,
    seen: Instant,
}

/// A token bucket per key, and the lines each suppressed.
#[derive(Debug)]
pub struct LogLimiter<K> {
    rate: Rate,
    max_keys: usize,
    keys: HashMap<K, Key>,
    /// The keys with suppressed lines not yet reported: the only ones
    /// [`LogLimiter::ended_floods`] looks at.
    suppressing: HashSet<K>,
    /// Suppressed lines of keys forgotten to make room before their count
    /// was reported.
    untracked: u64,
}

impl<K: Hash + Eq + Clone> LogLimiter<K> {
    /// `rate` per key, at most `max_keys` keys remembered (quiet ones are
    /// forgotten first: forgetting them changes nothing).
    pub fn new(rate: Rate, max_keys: usize) -> Self {
        LogLimiter { rate, max_keys: max_keys.max(1), keys: HashMap::new(), suppressing: HashSet::new(), untracked: 0 }
    }

    /// Whether a line of `key` at `now` is written (the key is copied only
    /// when it is new); a line let through after a flood carries its count.
    pub fn decide<Q>(&mut self, key: &Q, now: Instant) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.take(key, now, true)
    }

    /// Whether a line of `key` at `now` is written, for callers that write
    /// summaries apart: the count stays with the key until
    /// [`LogLimiter::ended_floods`] reports it.
    pub fn allows<Q>(&mut self, key: &Q, now: Instant) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.take(key, now, false).allows()
    }

    fn take<Q>(&mut self, key: &Q, now: Instant, hand_over: bool) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if !self.keys.contains_key(key) {
            if self.keys.len() >= self.max_keys {
                self.make_room(now);
            }
            self.keys.insert(key.to_owned(), Key { bucket: TokenBucket::full(self.rate, now), suppressed: 0, seen: now });
        }
        let k = self.keys.get_mut(key).expect("inserted above");
        k.seen = now;
        if k.bucket.take(self.rate, now).is_ok() {
            if !hand_over {
                return Decision::Allow;
            }
            match std::mem::take(&mut k.suppressed) {
                0 => Decision::Allow,
                n => {
                    self.suppressing.remove(key);
                    Decision::AllowAfterSuppressed(n)
                }
            }
        } else {
            if k.suppressed == 0 {
                self.suppressing.insert(key.to_owned());
            }
            k.suppressed += 1;
            Decision::Suppress
        }
    }

    /// Keys whose flood has ended (they suppressed lines and would let one
    /// through again), with how many they suppressed; their counts reset.
    /// Looks only at the keys that are suppressing.
    pub fn ended_floods(&mut self, now: Instant) -> Vec<(K, u64)> {
        let rate = self.rate;
        let mut out = Vec::new();
        let keys = &mut self.keys;
        self.suppressing.retain(|k| {
            let Some(state) = keys.get_mut(k) else { return false };
            if state.bucket.has_token(rate, now) {
                out.push((k.clone(), std::mem::take(&mut state.suppressed)));
                return false;
            }
            true
        });
        out
    }

    /// Whether some key has suppressed lines not reported yet.
    pub fn is_suppressing(&self) -> bool {
        !self.suppressing.is_empty()
    }

    /// Suppressed lines of keys forgotten to make room before their count
    /// was reported, since the last call.
    pub fn take_untracked(&mut self) -> u64 {
        std::mem::take(&mut self.untracked)
    }

    /// Keys remembered.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Room for new keys when all `max_keys` are taken: first the keys
    /// whose bucket would be full again and that have nothing to report
    /// (forgetting them changes nothing); if that frees less than an
    /// eighth, the least recently seen eighth goes, their unreported
    /// counts kept in [`LogLimiter::take_untracked`]. An eighth at a time,
    /// so a stream of new keys (a flood from many sources) costs one sweep
    /// per `max_keys / 8` of them, and never stops the limiter from
    /// tracking a new key.
    fn make_room(&mut self, now: Instant) {
        let quiet = self.rate.refill_time();
        let suppressing = &self.suppressing;
        self.keys.retain(|k, s| suppressing.contains(k) || now.saturating_duration_since(s.seen) < quiet);
        let want = self.max_keys - self.max_keys / 8;
        if self.keys.len() <= want && self.keys.len() < self.max_keys {
            return;
        }
        let mut by_age: Vec<(Instant, K)> = self.keys.iter().map(|(k, s)| (s.seen, k.clone())).collect();
        by_age.sort_by_key(|(seen, _)| *seen);
        let excess = self.keys.len().saturating_sub(want).max(1);
        for (_, k) in by_age.into_iter().take(excess) {
            if let Some(gone) = self.keys.remove(&k) {
                self.untracked += gone.suppressed;
            }
            self.suppressing.remove(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn rate(burst: u32, per_second: f64) -> Rate {
        Rate { burst: f64::from(burst), per_second }
    }

    #[test]
    fn burst_then_rate_then_summary() {
        let t0 = Instant::now();
        let mut l = LogLimiter::new(rate(3, 2.0), 100);
        // (offset from t0 in ms, key, expected decision)
        let steps: &[(u64, &str, Decision)] = &[
            (0, "a", Decision::Allow),
            (0, "a", Decision::Allow),
            (0, "a", Decision::Allow),
            (0, "a", Decision::Suppress),
            (10, "a", Decision::Suppress),
            // Another key has its own budget.
            (10, "b", Decision::Allow),
            (400, "a", Decision::Suppress),
            // 500 ms at 2/s: one token back; the line says 3 were dropped.
            (500, "a", Decision::AllowAfterSuppressed(3)),
            (500, "a", Decision::Suppress),
            (1000, "a", Decision::AllowAfterSuppressed(1)),
            (1000, "a", Decision::Suppress),
            // Quiet for long enough: the whole burst is back, never more.
            (60_000, "a", Decision::AllowAfterSuppressed(1)),
            (60_000, "a", Decision::Allow),
            (60_000, "a", Decision::Allow),
            (60_000, "a", Decision::Suppress),
        ];
        for (i, (at, key, want)) in steps.iter().enumerate() {
            assert_eq!(l.decide(*key, t0 + ms(*at)), *want, "step {i}: {key} at {at} ms");
        }
    }

    #[test]
    fn a_flood_that_ends_is_summarised_once() {
        let t0 = Instant::now();
        let mut l = LogLimiter::<&str>::new(rate(2, 1.0), 100);
        for i in 0..1000 {
            l.decide(&"flood", t0 + Duration::from_micros(i));
        }
        // Still within the flood: no token back yet.
        assert!(l.ended_floods(t0 + ms(500)).is_empty());
        assert_eq!(l.ended_floods(t0 + ms(1500)), vec![("flood", 998)]);
        assert!(l.ended_floods(t0 + ms(5000)).is_empty(), "said once");
        assert!(!l.is_suppressing());
        assert_eq!(l.decide(&"flood", t0 + ms(5000)), Decision::Allow);
    }

    #[test]
    fn only_suppressing_keys_are_looked_at() {
        let t0 = Instant::now();
        let mut l = LogLimiter::<u32>::new(rate(1, 1.0), 100_000);
        for k in 0..10_000u32 {
            assert_eq!(l.decide(&k, t0), Decision::Allow);
        }
        assert!(!l.is_suppressing());
        assert_eq!(l.decide(&7, t0), Decision::Suppress);
        assert_eq!(l.suppressing.len(), 1);
        assert!(l.ended_floods(t0 + ms(500)).is_empty(), "no token back yet");
        assert_eq!(l.ended_floods(t0 + ms(1000)), vec![(7, 1)]);
        // A line let through after its flood reports it and leaves the set.
        l.decide(&8, t0 + ms(5000));
        assert_eq!(l.decide(&8, t0 + ms(5000)), Decision::Suppress);
        assert_eq!(l.decide(&8, t0 + ms(6000)), Decision::AllowAfterSuppressed(1));
        assert!(!l.is_suppressing());
    }

    #[test]
    fn a_steady_flood_is_bounded_and_counted() {
        // 35 000 lines a second for 10 s from one key.
        let t0 = Instant::now();
        let mut l = LogLimiter::<u32>::new(rate(10, 5.0), 100);
        let (mut written, mut suppressed, mut lines) = (0u64, 0u64, 0u64);
        for i in 0..350_000u64 {
            lines += 1;
            match l.decide(&0, t0 + Duration::from_micros(i * 1_000_000 / 35_000)) {
                Decision::Allow => written += 1,
                Decision::AllowAfterSuppressed(n) => {
                    written += 1;
                    suppressed += n;
                }
                Decision::Suppress => {}
            }
        }
        let pending: u64 = l.ended_floods(t0 + ms(60_000)).iter().map(|(_, n)| n).sum();
        assert!(written <= 10 + 5 * 10 + 1, "{written} lines written");
        assert_eq!(written + suppressed + pending, lines, "every line written or counted");
    }

    #[test]
    fn keys_are_bounded_quiet_ones_forgotten_first() {
        let t0 = Instant::now();
        let mut l = LogLimiter::<u32>::new(rate(1, 1.0), 2);
        assert!(l.decide(&1, t0).allows());
        assert!(!l.decide(&1, t0).allows(), "1 floods");
        assert!(l.decide(&2, t0 + ms(1)).allows());
        // Full, none quiet: the least recently seen goes (1, with its
        // count kept), and the new key is tracked.
        assert!(l.decide(&3, t0 + ms(2)).allows());
        assert_eq!(l.len(), 2);
        assert_eq!(l.take_untracked(), 1);
        assert!(l.ended_floods(t0 + ms(5000)).is_empty(), "1's count is not said twice");
        // Quiet keys make room first.
        assert!(l.decide(&4, t0 + ms(5000)).allows());
        assert_eq!(l.take_untracked(), 0);
    }

    #[test]
    fn a_flood_of_new_keys_stays_bounded_and_cheap() {
        let t0 = Instant::now();
        let mut l = LogLimiter::<u32>::new(rate(1, 0.001), 1024);
        for k in 0..100_000u32 {
            l.decide(&k, t0);
            l.decide(&k, t0); // each one floods: none is ever quiet
            assert!(l.len() <= 1024);
        }
        // Every suppressed line is either still held or counted.
        let held: u64 = l.keys.values().map(|k| k.suppressed).sum();
        assert_eq!(held + l.take_untracked(), 100_000);
    }

    #[test]
    fn a_caller_that_summarises_apart_gets_each_count_once() {
        let t0 = Instant::now();
        let mut l = LogLimiter::<&str>::new(rate(1, 2.0), 100);
        assert!(l.allows(&"a", t0));
        assert!(!l.allows(&"a", t0));
        assert!(!l.allows(&"a", t0));
        // A line back after half a second: written, its count kept.
        assert!(l.allows(&"a", t0 + ms(500)));
        assert!(!l.allows(&"a", t0 + ms(600)));
        assert_eq!(l.ended_floods(t0 + ms(700)), vec![], "the flood goes on");
        assert_eq!(l.ended_floods(t0 + ms(1500)), vec![("a", 3)]);
        assert!(l.ended_floods(t0 + ms(9000)).is_empty());
    }
}
