//! Istio's traffic management as the waypoint applies it: what a
//! VirtualService adds to a rule (retries, fault injection) and what a
//! DestinationRule says about a service or one of its subsets (load
//! balancing, a bound on requests in flight, outlier detection). Plain
//! data and pure decisions, for table tests; the control plane fills them
//! (`control::translate::virtual_service`, `destination_rule`).

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// One million: fractions are carried as parts per million, exact on the
/// wire (Istio's percentages have at most four decimals: 0.0001 % is 1).
pub const MILLION: u32 = 1_000_000;

/// True for a fraction `per_million` of uniformly random `draw`s.
pub fn chance(per_million: u32, draw: u64) -> bool {
    draw % u64::from(MILLION) < u64::from(per_million)
}

/// VirtualService `retries`: how many more attempts a request gets, and
/// on what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Retry {
    /// Attempts after the first (Istio's `attempts`); 0: no retry.
    pub attempts: u32,
    /// One attempt's bound (`perTryTimeout`); the rule's timeout still
    /// bounds them all.
    #[serde(default)]
    pub per_try_timeout: Option<Duration>,
    #[serde(default)]
    pub on: RetryOn,
}

impl Retry {
    /// Istio's default for a VirtualService route that says nothing:
    /// 2 retries on connect failure, refused stream and 503.
    pub fn istio_default() -> Retry {
        Retry {
            attempts: 2,
            per_try_timeout: None,
            on: RetryOn { connect_failure: true, refused_stream: true, status_codes: vec![503], ..Default::default() },
        }
    }
}

/// Envoy's `retry_on` conditions that Istio's `retryOn` names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct RetryOn {
    /// `5xx`: any 5xx answer, or no answer (connect failure, reset).
    #[serde(default)]
    pub five_xx: bool,
    /// `gateway-error`: 502, 503, 504.
    #[serde(default)]
    pub gateway_error: bool,
    /// `connect-failure`: the tunnel to the endpoint could not be opened.
    #[serde(default)]
    pub connect_failure: bool,
    /// `reset`: the endpoint went away before answering.
    #[serde(default)]
    pub reset: bool,
    /// `refused-stream`: HTTP/2 REFUSED_STREAM (here: the endpoint closed
    /// the connection before taking the request).
    #[serde(default)]
    pub refused_stream: bool,
    /// `retriable-4xx`: 409.
    #[serde(default)]
    pub retriable_4xx: bool,
    /// `retriable-status-codes` and bare codes in `retryOn` (`503`).
    #[serde(default)]
    pub status_codes: Vec<u16>,
}

/// How one attempt went, as retrying reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// The endpoint answered with this status.
    Status(u16),
    /// No tunnel to the endpoint.
    ConnectFailure,
    /// The connection broke before an answer (or the per-try timeout
    /// passed, which Envoy also retries).
    Reset,
}

impl RetryOn {
    /// Whether an attempt that went so is tried again.
    pub fn retries(&self, a: Attempt) -> bool {
        match a {
            Attempt::Status(s) => {
                (self.five_xx && (500..600).contains(&s))
                    || (self.gateway_error && matches!(s, 502..=504))
                    || (self.retriable_4xx && s == 409)
                    || self.status_codes.contains(&s)
            }
            Attempt::ConnectFailure => self.five_xx || self.gateway_error || self.connect_failure || self.refused_stream,
            Attempt::Reset => self.five_xx || self.gateway_error || self.reset,
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == RetryOn::default()
    }
}

/// VirtualService `fault`: delay and abort, each for a fraction of the
/// requests (drawn independently, delay first, as Envoy's fault filter).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Fault {
    #[serde(default)]
    pub delay: Option<FaultDelay>,
    #[serde(default)]
    pub abort: Option<FaultAbort>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultDelay {
    pub per_million: u32,
    pub delay: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultAbort {
    pub per_million: u32,
    /// The status the waypoint answers with (200-599).
    pub status: u16,
}

/// DestinationRule `trafficPolicy` as the waypoint applies it to a
/// service, or to one subset (whose own policy replaces the service's
/// field by field, as Istio merges them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TrafficPolicy {
    #[serde(default)]
    pub lb: LoadBalancer,
    /// The most requests in flight to the service from this waypoint
    /// (`connectionPool`: `http.http2MaxRequests`, or `tcp.maxConnections`
    /// plus `http.http1MaxPendingRequests`); more are answered 503 with
    /// flag `UO`, as Envoy's circuit breaker does. None: unbounded.
    #[serde(default)]
    pub max_requests: Option<u32>,
    #[serde(default)]
    pub outlier: Option<OutlierDetection>,
}

/// `loadBalancer`: how a request's endpoint is chosen among the ready
/// ones. Istio's default is LEAST_REQUEST.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum LoadBalancer {
    /// Two endpoints drawn at random, the one with fewer requests in
    /// flight taken (Envoy's "power of two choices").
    #[default]
    LeastRequest,
    RoundRobin,
    Random,
    /// `consistentHash`: the same key, the same endpoint while the set of
    /// endpoints holds; a request without the key is balanced at random.
    Hash(HashOn),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum HashOn {
    /// `httpHeaderName`, lower-case.
    Header(String),
    /// `httpCookie.name`.
    Cookie(String),
    /// `useSourceIp`.
    SourceIp,
    /// `httpQueryParameterName`.
    Query(String),
}

/// `outlierDetection`: an endpoint that fails this many times in a row is
/// left out for `base_ejection` times the number of its ejections.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutlierDetection {
    /// `consecutive5xxErrors` (any 5xx or no answer); None: off.
    pub consecutive_5xx: Option<u32>,
    /// `consecutiveGatewayErrors` (502, 503, 504 or no answer); None: off.
    pub consecutive_gateway: Option<u32>,
    /// `baseEjectionTime` (Istio's default 30 s).
    pub base_ejection: Duration,
    /// `maxEjectionPercent` (Istio's default 10); at least one endpoint
    /// may always be ejected, as Envoy does.
    pub max_ejection_percent: u32,
}

impl OutlierDetection {
    /// Whether an answer of `status` (None: no answer) counts as a
    /// failure for the 5xx and the gateway counters.
    pub fn failure(status: Option<u16>) -> (bool, bool) {
        match status {
            None => (true, true),
            Some(s) => ((500..600).contains(&s), matches!(s, 502..=504)),
        }
    }

    /// How many of `total` endpoints may be ejected at once.
    pub fn max_ejected(&self, total: usize) -> usize {
        (total * self.max_ejection_percent.min(100) as usize / 100).max(1)
    }
}

/// The endpoint for one request, by index into `candidates` (the ready
/// endpoints the rule allows, in a stable order), or None when there are
/// none. Pure: the caller passes what the policy reads.
///
/// - `in_flight(i)`: requests in flight to candidate i (LEAST_REQUEST);
/// - `rr`: a counter incremented per request (ROUND_ROBIN);
/// - `key`: the hash of the request's key, if it has one (consistent
///   hash, by rendezvous hashing over `ids`: removing an endpoint moves
///   only the keys it had);
/// - `draws`: uniform random numbers.
pub fn pick(
    lb: &LoadBalancer,
    ids: &[u64],
    in_flight: impl Fn(usize) -> usize,
    rr: u64,
    key: Option<u64>,
    draws: [u64; 2],
) -> Option<usize> {
    let n = ids.len();
    if n == 0 {
        return None;
    }
    Some(match lb {
        LoadBalancer::RoundRobin => (rr % n as u64) as usize,
        LoadBalancer::Random => (draws[0] % n as u64) as usize,
        LoadBalancer::LeastRequest => {
            let a = (draws[0] % n as u64) as usize;
            let b = (draws[1] % n as u64) as usize;
            if in_flight(b) < in_flight(a) {
                b
            } else {
                a
            }
        }
        LoadBalancer::Hash(_) => match key {
            Some(k) => (0..n).max_by_key(|&i| mix(ids[i] ^ k)).expect("n > 0"),
            None => (draws[0] % n as u64) as usize,
        },
    })
}

/// A 64-bit mixer (splitmix64's finalizer): a fixed, well-spread function
/// of its input, so rendezvous weights are stable across processes.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A stable 64-bit hash of bytes (FNV-1a then [`mix`]): the same key
/// hashes the same in every waypoint replica and across restarts.
pub fn hash_bytes(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in b {
        h ^= u64::from(x);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    mix(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_conditions_follow_envoy() {
        let on = |f: fn(&mut RetryOn)| {
            let mut r = RetryOn::default();
            f(&mut r);
            r
        };
        let cases = [
            (on(|r| r.five_xx = true), Attempt::Status(500), true),
            (on(|r| r.five_xx = true), Attempt::Status(503), true),
            (on(|r| r.five_xx = true), Attempt::Status(404), false),
            (on(|r| r.five_xx = true), Attempt::ConnectFailure, true),
            (on(|r| r.five_xx = true), Attempt::Reset, true),
            (on(|r| r.gateway_error = true), Attempt::Status(500), false),
            (on(|r| r.gateway_error = true), Attempt::Status(502), true),
            (on(|r| r.gateway_error = true), Attempt::Status(504), true),
            (on(|r| r.connect_failure = true), Attempt::ConnectFailure, true),
            (on(|r| r.connect_failure = true), Attempt::Reset, false),
            (on(|r| r.connect_failure = true), Attempt::Status(503), false),
            (on(|r| r.reset = true), Attempt::Reset, true),
            (on(|r| r.retriable_4xx = true), Attempt::Status(409), true),
            (on(|r| r.retriable_4xx = true), Attempt::Status(429), false),
            (on(|r| r.status_codes = vec![429]), Attempt::Status(429), true),
            (RetryOn::default(), Attempt::Status(503), false),
            (RetryOn::default(), Attempt::ConnectFailure, false),
            (Retry::istio_default().on, Attempt::Status(503), true),
            (Retry::istio_default().on, Attempt::Status(500), false),
            (Retry::istio_default().on, Attempt::ConnectFailure, true),
        ];
        for (on, a, want) in cases {
            assert_eq!(on.retries(a), want, "{on:?} on {a:?}");
        }
    }

    #[test]
    fn chance_is_exact_over_a_full_cycle() {
        let hits = (0..u64::from(MILLION)).filter(|d| chance(250_000, *d)).count();
        assert_eq!(hits, 250_000);
        assert!(!chance(0, 0));
        assert!(chance(MILLION, u64::from(MILLION) - 1));
    }

    #[test]
    fn least_request_takes_the_less_loaded_of_two() {
        let ids = [1, 2, 3];
        let load = |i: usize| [5, 0, 9][i];
        assert_eq!(pick(&LoadBalancer::LeastRequest, &ids, load, 0, None, [0, 1]), Some(1));
        assert_eq!(pick(&LoadBalancer::LeastRequest, &ids, load, 0, None, [2, 0]), Some(0));
        // A tie keeps the first draw.
        assert_eq!(pick(&LoadBalancer::LeastRequest, &ids, |_| 0, 0, None, [2, 0]), Some(2));
        assert_eq!(pick(&LoadBalancer::LeastRequest, &[], load, 0, None, [0, 0]), None);
    }

    #[test]
    fn round_robin_cycles_and_random_follows_the_draw() {
        let ids = [10, 20, 30];
        let rr: Vec<_> = (0..6).map(|c| pick(&LoadBalancer::RoundRobin, &ids, |_| 0, c, None, [0, 0]).unwrap()).collect();
        assert_eq!(rr, [0, 1, 2, 0, 1, 2]);
        assert_eq!(pick(&LoadBalancer::Random, &ids, |_| 0, 0, None, [7, 0]), Some(1));
    }

    #[test]
    fn consistent_hash_is_sticky_and_moves_only_the_removed_endpoints_keys() {
        let lb = LoadBalancer::Hash(HashOn::Header("x-user".into()));
        let ids: Vec<u64> = (0..5).map(|i| hash_bytes(format!("pod-{i}").as_bytes())).collect();
        let keys: Vec<u64> = (0..2000).map(|i| hash_bytes(format!("user-{i}").as_bytes())).collect();
        let before: Vec<usize> = keys.iter().map(|k| pick(&lb, &ids, |_| 0, 0, Some(*k), [0, 0]).unwrap()).collect();
        // Sticky: the same key, the same endpoint, whatever the draws.
        for (k, b) in keys.iter().zip(&before) {
            assert_eq!(pick(&lb, &ids, |_| 0, 9, Some(*k), [123, 456]).unwrap(), *b);
        }
        // Spread: each endpoint has a fair share (400 expected of 2000).
        for i in 0..5 {
            let n = before.iter().filter(|b| **b == i).count();
            assert!((300..500).contains(&n), "endpoint {i} has {n} of 2000 keys");
        }
        // Remove endpoint 2: only its keys move.
        let fewer: Vec<u64> = ids.iter().enumerate().filter(|(i, _)| *i != 2).map(|(_, id)| *id).collect();
        for (k, b) in keys.iter().zip(&before) {
            let now = pick(&lb, &fewer, |_| 0, 0, Some(*k), [0, 0]).unwrap();
            let now_id = fewer[now];
            if *b != 2 {
                assert_eq!(now_id, ids[*b], "a key of a remaining endpoint moved");
            }
        }
    }

    #[test]
    fn outlier_ejection_bound_and_failures() {
        let o = OutlierDetection {
            consecutive_5xx: Some(5),
            consecutive_gateway: None,
            base_ejection: Duration::from_secs(30),
            max_ejection_percent: 10,
        };
        assert_eq!(o.max_ejected(2), 1, "at least one");
        assert_eq!(o.max_ejected(30), 3);
        assert_eq!(OutlierDetection::failure(Some(500)), (true, false));
        assert_eq!(OutlierDetection::failure(Some(503)), (true, true));
        assert_eq!(OutlierDetection::failure(None), (true, true));
        assert_eq!(OutlierDetection::failure(Some(404)), (false, false));
    }
}
