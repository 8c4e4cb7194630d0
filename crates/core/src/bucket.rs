//! The mesh's one token bucket: the waypoint's local rate limits, the
//! certificate service's per-caller bounds and the log limiters all draw
//! from it. Pure: time is passed in, so tests need no clock.

use std::time::{Duration, Instant};

/// A bucket's shape: `burst` tokens at once, refilled at `per_second`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub burst: f64,
    pub per_second: f64,
}

impl Rate {
    /// `requests` per `interval`, at most `burst` at once (the shape of
    /// Envoy's and Istio's local rate limit).
    pub fn per(requests: u32, interval: Duration, burst: u32) -> Rate {
        Rate { burst: f64::from(burst), per_second: f64::from(requests) / interval.as_secs_f64().max(1e-9) }
    }

    /// How long a bucket of this shape takes to refill from empty.
    pub fn refill_time(&self) -> Duration {
        if self.per_second <= 0.0 {
            return Duration::MAX;
        }
        Duration::from_secs_f64((self.burst / self.per_second).min(1e9))
    }
}

/// The tokens a bucket holds as of an instant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenBucket {
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// Full at `now`.
    pub fn full(rate: Rate, now: Instant) -> TokenBucket {
        TokenBucket { tokens: rate.burst, at: now }
    }

    fn refill(&mut self, rate: Rate, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate.per_second).min(rate.burst);
        self.at = now.max(self.at);
    }

    /// Takes a token at `now`; or, when there is none, how long until there
    /// is one (`Duration::MAX` for a bucket that never refills).
    pub fn take(&mut self, rate: Rate, now: Instant) -> Result<(), Duration> {
        self.refill(rate, now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        if rate.per_second <= 0.0 {
            return Err(Duration::MAX);
        }
        Err(Duration::from_secs_f64((1.0 - self.tokens) / rate.per_second))
    }

    /// Whether a token is there at `now`, without taking it.
    pub fn has_token(&mut self, rate: Rate, now: Instant) -> bool {
        self.refill(rate, now);
        self.tokens >= 1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_gives_its_burst_then_refills_at_its_rate() {
        let t0 = Instant::now();
        let rate = Rate::per(2, Duration::from_secs(1), 3);
        let mut b = TokenBucket::full(rate, t0);
        let take = |b: &mut TokenBucket, ms: u64| b.take(rate, t0 + Duration::from_millis(ms));
        assert_eq!((take(&mut b, 0), take(&mut b, 0), take(&mut b, 0)), (Ok(()), Ok(()), Ok(())));
        // Empty: the next token in 1/2 s.
        assert_eq!(take(&mut b, 0), Err(Duration::from_millis(500)));
        assert_eq!(take(&mut b, 250), Err(Duration::from_millis(250)));
        assert!(!b.has_token(rate, t0 + Duration::from_millis(400)));
        assert!(b.has_token(rate, t0 + Duration::from_millis(500)), "looking takes nothing");
        assert_eq!(take(&mut b, 500), Ok(()));
        // Idle for long: never more than the burst.
        let got = (0..5).filter(|_| take(&mut b, 60_000).is_ok()).count();
        assert_eq!(got, 3);
        // A clock that goes back refills nothing and takes nothing away.
        assert!(take(&mut b, 1_000).is_err());
    }

    #[test]
    fn a_bucket_that_never_refills_says_so() {
        let t0 = Instant::now();
        let rate = Rate { burst: 1.0, per_second: 0.0 };
        let mut b = TokenBucket::full(rate, t0);
        assert_eq!(b.take(rate, t0), Ok(()));
        assert_eq!(b.take(rate, t0 + Duration::from_secs(3600)), Err(Duration::MAX));
        assert_eq!(rate.refill_time(), Duration::MAX);
        assert_eq!(Rate { burst: 4.0, per_second: 2.0 }.refill_time(), Duration::from_secs(2));
    }
}
