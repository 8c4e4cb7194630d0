//! Choosing the endpoint of each attempt, and what the waypoint remembers
//! to do it: requests in flight per endpoint and per pool (LEAST_REQUEST,
//! the DestinationRule's bound), a round-robin counter, and outlier
//! detection's failure counts and ejections. The choice itself is
//! `slipstream_core::route::traffic::pick` (pure); the ejection rule is
//! [`Outlier::record`] (pure, over plain data); this module holds the
//! state between requests.
//!
//! Bounded: one entry per pool (service, or service and subset, that the
//! routes name) and, in it, per endpoint the pool had; endpoints that left
//! are dropped when the pool is next used.

use crate::plan::Forward;
use slipstream_core::route::traffic::{hash_bytes, pick, OutlierDetection};
use slipstream_core::sync::LockExt;
use slipstream_core::Endpoint;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One endpoint's outlier state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outlier {
    pub consecutive_5xx: u32,
    pub consecutive_gateway: u32,
    /// Until when it is left out.
    pub ejected_until: Option<Instant>,
    /// How many times it was ejected (the ejection lasts that many times
    /// the base).
    pub ejections: u32,
}

impl Outlier {
    pub fn is_ejected(&self, now: Instant) -> bool {
        self.ejected_until.is_some_and(|u| u > now)
    }

    /// After an answer of `status` (None: none came): counts, and ejects
    /// when a count reaches its bound and fewer than `may_eject` endpoints
    /// are ejected already. Returns whether it was ejected now.
    pub fn record(&mut self, o: &OutlierDetection, status: Option<u16>, now: Instant, ejected_now: usize, may_eject: usize) -> bool {
        let (five, gateway) = OutlierDetection::failure(status);
        self.consecutive_5xx = if five { self.consecutive_5xx + 1 } else { 0 };
        self.consecutive_gateway = if gateway { self.consecutive_gateway + 1 } else { 0 };
        if self.is_ejected(now) {
            return false;
        }
        let tripped = o.consecutive_5xx.is_some_and(|n| self.consecutive_5xx >= n)
            || o.consecutive_gateway.is_some_and(|n| self.consecutive_gateway >= n);
        if !tripped || ejected_now >= may_eject {
            return false;
        }
        self.ejections = self.ejections.saturating_add(1);
        self.ejected_until = Some(now + o.base_ejection * self.ejections.min(1000));
        self.consecutive_5xx = 0;
        self.consecutive_gateway = 0;
        true
    }
}

#[derive(Default)]
struct EndpointState {
    in_flight: usize,
    outlier: Outlier,
}

#[derive(Default)]
struct PoolState {
    rr: u64,
    in_flight: u32,
    endpoints: HashMap<SocketAddr, EndpointState>,
}

/// What every request of the waypoint shares to balance.
#[derive(Default)]
pub struct Balancer {
    pools: Mutex<HashMap<String, PoolState>>,
}

/// A request in flight to an endpoint: counted until [`Balancer::finish`].
#[must_use]
pub struct Slot {
    pub endpoint: Endpoint,
    pub addr: SocketAddr,
}

/// Why no slot was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoSlot {
    /// The pool's requests in flight are at the DestinationRule's bound
    /// (Envoy's flag `UO`, upstream overflow).
    Overflow(u32),
}

fn addr(e: &Endpoint) -> SocketAddr {
    SocketAddr::new(e.workload.address(), e.target_port)
}

/// The hash key of a request for consistent hashing, if it has one.
pub fn hash_key(
    lb: &slipstream_core::route::traffic::LoadBalancer,
    headers: &[(&str, &str)],
    query: &str,
    source: std::net::IpAddr,
) -> Option<u64> {
    use slipstream_core::route::traffic::{HashOn, LoadBalancer};
    let LoadBalancer::Hash(on) = lb else { return None };
    match on {
        HashOn::Header(name) => headers.iter().find(|(k, _)| k == name).map(|(_, v)| hash_bytes(v.as_bytes())),
        HashOn::Cookie(name) => headers.iter().filter(|(k, _)| *k == "cookie").flat_map(|(_, v)| v.split(';')).find_map(|c| {
            let (k, v) = c.trim().split_once('=')?;
            (k == name).then(|| hash_bytes(v.as_bytes()))
        }),
        HashOn::SourceIp => Some(hash_bytes(source.to_string().as_bytes())),
        HashOn::Query(name) => query.split('&').find_map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (k == name).then(|| hash_bytes(v.as_bytes()))
        }),
    }
}

impl Balancer {
    /// The endpoint for the next attempt of a request to `f`, counted in
    /// flight. Endpoints already `tried` by this request and ejected ones
    /// are left out while any other remains (Istio retries on another
    /// host; Envoy ignores ejection when every endpoint is ejected).
    pub fn start(&self, f: &Forward, key: Option<u64>, tried: &[SocketAddr], draws: [u64; 2]) -> Result<Slot, NoSlot> {
        let now = Instant::now();
        let mut pools = self.pools.locked();
        if !pools.contains_key(&f.pool) {
            pools.insert(f.pool.clone(), PoolState::default());
        }
        let pool = pools.get_mut(&f.pool).expect("inserted above");
        if let Some(max) = f.traffic.max_requests {
            if pool.in_flight >= max {
                return Err(NoSlot::Overflow(max));
            }
        }
        if pool.endpoints.len() > f.candidates.len() * 2 + 8 {
            let live: std::collections::HashSet<SocketAddr> = f.candidates.iter().map(addr).collect();
            pool.endpoints.retain(|a, _| live.contains(a));
        }
        let usable = |e: &&Endpoint| pool.endpoints.get(&addr(e)).map_or(true, |s| !s.outlier.is_ejected(now));
        // The common case, nothing tried and nothing ejected, without
        // building candidate lists.
        let all_usable = tried.is_empty() && f.candidates.iter().all(|e| usable(&e));
        let set: Vec<&Endpoint> = if all_usable {
            f.candidates.iter().collect()
        } else {
            let fresh: Vec<&Endpoint> = f.candidates.iter().filter(|e| !tried.contains(&addr(e))).filter(usable).collect();
            if !fresh.is_empty() {
                fresh
            } else {
                let healthy: Vec<&Endpoint> = f.candidates.iter().filter(usable).collect();
                if !healthy.is_empty() {
                    healthy
                } else {
                    f.candidates.iter().collect()
                }
            }
        };
        // Endpoint ids matter only to consistent hashing.
        let ids: Vec<u64> = match &f.traffic.lb {
            slipstream_core::route::traffic::LoadBalancer::Hash(_) => set.iter().map(|e| hash_bytes(e.workload.uid.as_bytes())).collect(),
            _ => vec![0; set.len()],
        };
        let rr = pool.rr;
        pool.rr = pool.rr.wrapping_add(1);
        let load = |i: usize| pool.endpoints.get(&addr(set[i])).map_or(0, |s| s.in_flight);
        let i = pick(&f.traffic.lb, &ids, load, rr, key, draws).expect("candidates are never empty");
        let endpoint = set[i].clone();
        let a = addr(&endpoint);
        pool.in_flight += 1;
        pool.endpoints.entry(a).or_default().in_flight += 1;
        Ok(Slot { endpoint, addr: a })
    }

    /// The attempt in `slot` ended with `status` (None: no answer):
    /// uncounted, and outlier detection told.
    pub fn finish(&self, f: &Forward, slot: Slot, status: Option<u16>) {
        let now = Instant::now();
        let mut pools = self.pools.locked();
        let Some(pool) = pools.get_mut(&f.pool) else { return };
        pool.in_flight = pool.in_flight.saturating_sub(1);
        let ejected_now = pool.endpoints.values().filter(|s| s.outlier.is_ejected(now)).count();
        let Some(ep) = pool.endpoints.get_mut(&slot.addr) else { return };
        ep.in_flight = ep.in_flight.saturating_sub(1);
        if let Some(o) = &f.traffic.outlier {
            let may = o.max_ejected(f.candidates.len());
            if ep.outlier.record(o, status, now, ejected_now, may) {
                tracing::info!(
                    pool = %f.pool,
                    endpoint = %slot.addr,
                    for_s = ep.outlier.ejected_until.map_or(0, |u| u.saturating_duration_since(now).as_secs()),
                    "outlier detection: endpoint ejected after consecutive failures"
                );
            }
        }
    }

    /// Pools held (for tests of the bound).
    pub fn pools(&self) -> usize {
        self.pools.locked().len()
    }
}

/// The time left before `deadline`, if there is one.
pub fn remaining(deadline: Option<Instant>) -> Option<Duration> {
    deadline.map(|d| d.saturating_duration_since(Instant::now()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(five: Option<u32>, gateway: Option<u32>, pct: u32) -> OutlierDetection {
        OutlierDetection {
            consecutive_5xx: five,
            consecutive_gateway: gateway,
            base_ejection: Duration::from_secs(30),
            max_ejection_percent: pct,
        }
    }

    #[test]
    fn ejection_after_consecutive_failures_only() {
        let now = Instant::now();
        let od = o(Some(3), None, 100);
        let mut s = Outlier::default();
        assert!(!s.record(&od, Some(500), now, 0, 1));
        assert!(!s.record(&od, Some(503), now, 0, 1));
        // A success in between starts the count again.
        assert!(!s.record(&od, Some(200), now, 0, 1));
        assert!(!s.record(&od, Some(500), now, 0, 1));
        assert!(!s.record(&od, None, now, 0, 1));
        assert!(s.record(&od, Some(502), now, 0, 1), "third in a row");
        assert!(s.is_ejected(now + Duration::from_secs(29)));
        assert!(!s.is_ejected(now + Duration::from_secs(31)));
        // The second ejection lasts twice as long.
        let later = now + Duration::from_secs(31);
        for _ in 0..2 {
            assert!(!s.record(&od, Some(500), later, 0, 1));
        }
        assert!(s.record(&od, Some(500), later, 0, 1));
        assert!(s.is_ejected(later + Duration::from_secs(59)));
        assert!(!s.is_ejected(later + Duration::from_secs(61)));
    }

    #[test]
    fn gateway_errors_count_separately_and_the_bound_on_ejections_holds() {
        let now = Instant::now();
        let od = o(None, Some(2), 10);
        let mut s = Outlier::default();
        assert!(!s.record(&od, Some(500), now, 0, 1), "500 is not a gateway error");
        assert!(!s.record(&od, Some(500), now, 0, 1));
        assert!(!s.record(&od, Some(503), now, 0, 1));
        // Another endpoint is ejected already and only one may be.
        assert!(!s.record(&od, Some(504), now, 1, 1));
        assert!(!s.is_ejected(now));
        assert!(s.record(&od, Some(504), now, 0, 1));
    }
}
