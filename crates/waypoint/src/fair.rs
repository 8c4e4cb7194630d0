//! What one client (a peer address: a pod) may hold of the waypoint that
//! every bound service shares, besides its streams (`proxy::limits`, taken
//! in `handler`): mirrored copies in flight, its share of the bodies held
//! to be replayed, and a cool-down after connections it broke on purpose
//! (HTTP/2 rapid resets, CONTINUATION floods and the like, which h2 ends
//! with a GOAWAY: the client would otherwise just open the next one).
//! Settings in [`Fairness`] (flags in `run`; docs/waypoint.md,
//! "Fairness"). Plain data and counters; the decisions are table-tested.

use slipstream_core::sync::LockExt;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What all requests together may hold in memory to replay, in KiB
/// (64 MiB): past it a request is sent once, without mirror or retry, so
/// that clients sending many large bodies at once cannot make the waypoint
/// hold them all.
pub const REPLAY_BUDGET_KIB: usize = 64 * 1024;

/// The bounds of one client. `Default` is the documented defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fairness {
    /// Streams (tunnels: HTTP connections and TCP connections alike) one
    /// client holds at once; None: the node proxy's derivation from the
    /// open-files limit (a quarter of the budget, at most 4 096).
    pub client_streams: Option<u32>,
    /// Mirrored copies of one client's requests in flight; past it a copy
    /// is not sent (the request itself is).
    pub client_mirrors: u32,
    /// The part of the replay budget (bodies held for retries and mirrors,
    /// 64 MiB in all) one client may hold, in KiB.
    pub client_replay_kib: u32,
    /// A request body that sends nothing for this long before its answer
    /// came is ended with 408.
    pub request_body_timeout: Duration,
    /// A connection passed through as TCP that carries nothing either way
    /// for this long is closed (Envoy's tcp_proxy `idle_timeout`).
    pub tcp_idle_timeout: Duration,
    /// Concurrent requests on one HTTP/2 connection.
    pub h2_max_streams: u32,
    /// Connections a client may break on purpose (see the module's text)
    /// within `strike_window` before it is refused new ones for
    /// `cool_down`.
    pub strikes: u32,
    pub strike_window: Duration,
    pub cool_down: Duration,
}

impl Default for Fairness {
    fn default() -> Self {
        Fairness {
            client_streams: None,
            client_mirrors: 16,
            client_replay_kib: REPLAY_BUDGET_KIB as u32 / 4,
            request_body_timeout: Duration::from_secs(60),
            tcp_idle_timeout: Duration::from_secs(3600),
            h2_max_streams: 100,
            strikes: 3,
            strike_window: Duration::from_secs(10),
            cool_down: Duration::from_secs(10),
        }
    }
}

/// Amounts held per client, each under the same maximum.
pub struct Shares {
    held: Mutex<HashMap<IpAddr, u32>>,
    max: u32,
}

/// Holds `amount` of a client's share until dropped.
pub struct Share {
    shares: Arc<Shares>,
    client: IpAddr,
    amount: u32,
}

impl Shares {
    pub fn new(max: u32) -> Arc<Shares> {
        Arc::new(Shares { held: Mutex::new(HashMap::new()), max })
    }

    /// `amount` more for `client`, if that keeps it within the maximum.
    pub fn take(self: &Arc<Self>, client: IpAddr, amount: u32) -> Option<Share> {
        let mut m = self.held.locked();
        let n = m.entry(client).or_insert(0);
        if n.saturating_add(amount) > self.max {
            if *n == 0 {
                m.remove(&client);
            }
            return None;
        }
        *n += amount;
        Some(Share { shares: self.clone(), client, amount })
    }

    pub fn held(&self, client: IpAddr) -> u32 {
        self.held.locked().get(&client).copied().unwrap_or(0)
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut m = self.shares.held.locked();
        if let Some(n) = m.get_mut(&self.client) {
            *n = n.saturating_sub(self.amount);
            if *n == 0 {
                m.remove(&self.client);
            }
        }
    }
}

/// One client's broken connections: when the window began, how many in
/// it, and until when it is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Record {
    window: Instant,
    count: u32,
    until: Option<Instant>,
}

/// The clients that broke connections on purpose, and which of them are
/// cooling down.
pub struct Strikes {
    records: Mutex<HashMap<IpAddr, Record>>,
    strikes: u32,
    window: Duration,
    cool_down: Duration,
}

/// What a strike did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Struck {
    /// Counted; the client is still served.
    Counted(u32),
    /// The client reached the bound: refused until then.
    CoolingDown(Instant),
}

/// The most clients remembered; past it the expired records go first.
const MAX_RECORDS: usize = 65_536;

impl Strikes {
    pub fn new(f: &Fairness) -> Strikes {
        Strikes { records: Mutex::new(HashMap::new()), strikes: f.strikes.max(1), window: f.strike_window, cool_down: f.cool_down }
    }

    /// `client` broke a connection at `now`.
    pub fn strike(&self, client: IpAddr, now: Instant) -> Struck {
        let mut m = self.records.locked();
        if m.len() >= MAX_RECORDS && !m.contains_key(&client) {
            // Room for the new client, so that whoever fills the records
            // cannot turn cool-downs off for everyone after: a record
            // whose window ended, else one not cooling down (its strikes
            // start again), found by one scan that stops at the first.
            let window = self.window;
            let cooling = |r: &Record| r.until.is_some_and(|u| u > now);
            let victim = m
                .iter()
                .find(|(_, r)| now.duration_since(r.window) >= window && !cooling(r))
                .or_else(|| m.iter().find(|(_, r)| !cooling(r)))
                .map(|(k, _)| *k);
            match victim {
                Some(k) => {
                    m.remove(&k);
                }
                // Every record is a client cooling down: this one's strike
                // is bounded per connection by h2 alone until one ends.
                None => return Struck::Counted(1),
            }
        }
        let r = m.entry(client).or_insert(Record { window: now, count: 0, until: None });
        if now.duration_since(r.window) >= self.window {
            *r = Record { window: now, count: 0, until: r.until.filter(|u| *u > now) };
        }
        r.count += 1;
        if r.count >= self.strikes {
            let until = now + self.cool_down;
            *r = Record { window: now, count: 0, until: Some(until) };
            return Struck::CoolingDown(until);
        }
        Struck::Counted(r.count)
    }

    /// Whether `client` is refused new connections at `now`.
    pub fn cooling(&self, client: IpAddr, now: Instant) -> Option<Instant> {
        let m = self.records.locked();
        m.get(&client).and_then(|r| r.until).filter(|u| *u > now)
    }
}

/// Whether an HTTP connection's end was the client's doing on purpose:
/// h2 ended it with a GOAWAY for a protocol abuse (too many resets,
/// CONTINUATION frames past the header limit, a header block too large,
/// frames that break the protocol), rather than a client that went away.
pub fn broken_on_purpose(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(h2) = err.downcast_ref::<h2::Error>() {
            return h2.is_go_away()
                && !h2.is_remote()
                && matches!(
                    h2.reason(),
                    Some(
                        h2::Reason::ENHANCE_YOUR_CALM
                            | h2::Reason::PROTOCOL_ERROR
                            | h2::Reason::COMPRESSION_ERROR
                            | h2::Reason::FRAME_SIZE_ERROR
                            | h2::Reason::FLOW_CONTROL_ERROR
                    )
                );
        }
        cur = err.source();
    }
    false
}

/// When a request's body (or a connection passed through) last carried
/// something, and whether it has ended: what the request-body and idle
/// timeouts read.
pub struct BodyActivity {
    base: Instant,
    /// Milliseconds since `base`.
    last: std::sync::atomic::AtomicU64,
    done: std::sync::atomic::AtomicBool,
}

impl BodyActivity {
    pub fn new() -> Arc<BodyActivity> {
        Arc::new(BodyActivity {
            base: Instant::now(),
            last: std::sync::atomic::AtomicU64::new(0),
            done: std::sync::atomic::AtomicBool::new(false),
        })
    }

    pub(crate) fn touch(&self) {
        let ms = self.base.elapsed().as_millis() as u64;
        self.last.store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// Resolves once the body has sent nothing for `timeout` without
    /// having ended; never if it ends first.
    pub async fn stalled(&self, timeout: Duration) {
        use std::sync::atomic::Ordering;
        loop {
            if self.done.load(Ordering::Relaxed) {
                return std::future::pending().await;
            }
            let last = self.base + Duration::from_millis(self.last.load(Ordering::Relaxed));
            let idle = last.elapsed();
            if idle >= timeout {
                return;
            }
            tokio::time::sleep(timeout - idle).await;
        }
    }
}

/// A request body that records its activity in a [`BodyActivity`].
pub struct Watched<B> {
    inner: B,
    activity: Arc<BodyActivity>,
}

impl<B: hyper::body::Body> Watched<B> {
    pub fn new(inner: B, activity: Arc<BodyActivity>) -> Self {
        if inner.is_end_stream() {
            activity.done.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        Watched { inner, activity }
    }
}

impl<B: hyper::body::Body + Unpin> hyper::body::Body for Watched<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<B::Data>, B::Error>>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        match &r {
            std::task::Poll::Ready(Some(Ok(_))) => {
                self.activity.touch();
                if self.inner.is_end_stream() {
                    self.activity.done.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            }
            std::task::Poll::Ready(_) => self.activity.done.store(true, std::sync::atomic::Ordering::Relaxed),
            std::task::Poll::Pending => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_per_client_and_given_back() {
        let s = Shares::new(3);
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let one = s.take(a, 2).unwrap();
        assert!(s.take(a, 2).is_none(), "over a's share");
        let _b = s.take(b, 3).expect("b has its own share");
        let two = s.take(a, 1).unwrap();
        assert_eq!(s.held(a), 3);
        drop((one, two));
        assert_eq!(s.held(a), 0);
        assert!(s.take(a, 3).is_some());
        assert!(s.take(a, 4).is_none(), "never more than the maximum at once");
    }

    #[test]
    fn strikes_within_the_window_cool_a_client_down_then_it_is_served_again() {
        let f = Fairness { strikes: 3, strike_window: Duration::from_secs(10), cool_down: Duration::from_secs(10), ..Default::default() };
        let s = Strikes::new(&f);
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let t0 = Instant::now();
        assert_eq!(s.strike(a, t0), Struck::Counted(1));
        // Outside the window: counting starts again.
        assert_eq!(s.strike(a, t0 + Duration::from_secs(11)), Struck::Counted(1));
        assert_eq!(s.strike(a, t0 + Duration::from_secs(12)), Struck::Counted(2));
        assert_eq!(s.strike(b, t0 + Duration::from_secs(12)), Struck::Counted(1), "per client");
        let until = t0 + Duration::from_secs(23);
        assert_eq!(s.strike(a, t0 + Duration::from_secs(13)), Struck::CoolingDown(until));
        assert_eq!(s.cooling(a, t0 + Duration::from_secs(14)), Some(until));
        assert_eq!(s.cooling(b, t0 + Duration::from_secs(14)), None);
        assert_eq!(s.cooling(a, until), None, "served again once it has cooled down");
    }

    /// Review finding: once the records were full, a new client's strikes
    /// were counted nowhere, so whoever filled them turned cool-downs off
    /// for every new address. Now a record not cooling down makes room.
    #[test]
    fn a_client_new_to_full_records_is_still_cooled_down() {
        let f = Fairness { strikes: 2, strike_window: Duration::from_secs(10), cool_down: Duration::from_secs(10), ..Default::default() };
        let s = Strikes::new(&f);
        let t0 = Instant::now();
        for i in 0..MAX_RECORDS as u32 {
            s.strike(IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i)), t0);
        }
        assert_eq!(s.records.locked().len(), MAX_RECORDS);
        let late: IpAddr = "192.0.2.1".parse().unwrap();
        assert_eq!(s.strike(late, t0 + Duration::from_secs(1)), Struck::Counted(1));
        assert!(matches!(s.strike(late, t0 + Duration::from_secs(1)), Struck::CoolingDown(_)), "its second strike cools it down");
        assert!(s.cooling(late, t0 + Duration::from_secs(2)).is_some());
        assert_eq!(s.records.locked().len(), MAX_RECORDS, "still bounded");
    }
}
