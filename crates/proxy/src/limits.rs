//! What one source may hold in the node proxy, and the node-wide budget.
//! The waypoint bounds its peers with the same counters ([`NodeLimits`]
//! derived with its own per-peer defaults, [`RefusalLog`]).
//!
//! The node proxy is shared by every pod of its node: a pod (or a peer
//! address) that opens connections as fast as it can must hit its own bound
//! while the others are served as before. The counting is plain atomics:
//!
//! - [`Slots`]: one counter with a maximum (the node's connection budget).
//! - [`Source`]: what one source holds, one [`Slots`] per [`Kind`], and the
//!   budget it draws on. A local pod's is made once with its listeners (its
//!   `LocalPod` holds it); a peer IP's is looked up in a small map
//!   ([`NodeLimits::peer`]) once per HBONE connection or plaintext
//!   connection, never per stream or byte: the HBONE server carries the
//!   peer's `Source` from the connection's admission to its streams.
//! - [`Taken`]: one slot of a source and its descriptors of the budget, given
//!   back when dropped (16 bytes, no allocation), so a slot is held exactly
//!   as long as what it counts.
//!
//! [`KeyedSlots`] (a counter per key in a map) is for the admin listeners,
//! taken once per admin connection. [`RefusalLog`] keeps the log lines of
//! refusals to a few per second per source.

use slipstream_core::bucket::Rate;
use slipstream_core::log_limit::LogLimiter;
use slipstream_core::sync::LockExt;
use slipstream_hbone::ResponseFlag;
use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// A counter with a maximum.
#[derive(Debug)]
pub struct Slots {
    used: AtomicU32,
    max: u32,
}

/// Holds `n` slots of a [`Slots`] until dropped.
#[derive(Debug)]
pub struct SlotGuard {
    slots: Arc<Slots>,
    n: u32,
}

impl Slots {
    pub fn new(max: u32) -> Arc<Slots> {
        Arc::new(Slots::unshared(max))
    }

    fn unshared(max: u32) -> Slots {
        Slots { used: AtomicU32::new(0), max }
    }

    pub fn max(&self) -> u32 {
        self.max
    }

    pub fn in_use(&self) -> u32 {
        self.used.load(Ordering::Relaxed)
    }

    /// Takes `n` slots, or none if that would go over the maximum. Exact: a
    /// refusal means the slots were all held at that instant.
    fn take(&self, n: u32) -> bool {
        self.used.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |u| u.checked_add(n).filter(|&t| t <= self.max)).is_ok()
    }

    fn give(&self, n: u32) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }

    /// [`Slots::take`], held by a guard.
    pub fn try_acquire(self: &Arc<Self>, n: u32) -> Option<SlotGuard> {
        self.take(n).then(|| SlotGuard { slots: self.clone(), n })
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.slots.give(self.n);
    }
}

/// A counter per key with one maximum for every key; keys at zero leave the
/// map, so it holds only the sources that hold something.
#[derive(Debug)]
pub struct KeyedSlots<K: Eq + Hash + Copy> {
    used: Mutex<HashMap<K, u32>>,
    max: u32,
}

/// Holds one slot of `key` until dropped.
#[derive(Debug)]
pub struct KeyedGuard<K: Eq + Hash + Copy> {
    slots: Arc<KeyedSlots<K>>,
    key: K,
}

impl<K: Eq + Hash + Copy> KeyedSlots<K> {
    pub fn new(max: u32) -> Arc<Self> {
        Arc::new(KeyedSlots { used: Mutex::new(HashMap::new()), max })
    }

    pub fn max(&self) -> u32 {
        self.max
    }

    pub fn in_use(&self, key: K) -> u32 {
        self.used.locked().get(&key).copied().unwrap_or(0)
    }

    /// How many keys hold at least one slot.
    pub fn keys(&self) -> usize {
        self.used.locked().len()
    }

    pub fn try_acquire(self: &Arc<Self>, key: K) -> Option<KeyedGuard<K>> {
        let mut m = self.used.locked();
        let n = m.entry(key).or_insert(0);
        if *n >= self.max {
            if *n == 0 {
                m.remove(&key);
            }
            return None;
        }
        *n += 1;
        drop(m);
        Some(KeyedGuard { slots: self.clone(), key })
    }
}

impl<K: Eq + Hash + Copy> Drop for KeyedGuard<K> {
    fn drop(&mut self) {
        let mut m = self.slots.used.locked();
        if let Some(n) = m.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.key);
            }
        }
    }
}

/// What a source holds: each kind has its own bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A local pod's open outbound connections, set-up ones included.
    PodOpen,
    /// A local pod's outbound connections still being set up.
    PodPending,
    /// A peer IP's open HBONE connections on :15008.
    PeerConnections,
    /// A peer IP's TLS and HTTP/2 handshakes in progress on :15008.
    PeerHandshakes,
    /// A peer IP's open CONNECT streams, across all its tunnels.
    PeerStreams,
    /// A peer IP's open plaintext connections on :15006.
    PeerPlaintext,
}

const KINDS: usize = 6;

impl Kind {
    /// What the source holds too many of, for the log line.
    pub fn what(self) -> &'static str {
        match self {
            Kind::PodOpen => "open outbound connections",
            Kind::PodPending => "outbound connections in set-up",
            Kind::PeerConnections => "open HBONE connections",
            Kind::PeerHandshakes => "HBONE handshakes in progress",
            Kind::PeerStreams => "open HBONE streams",
            Kind::PeerPlaintext => "open plaintext connections",
        }
    }
}

/// One source (a local pod, or a peer IP): a counter per [`Kind`] and the
/// node's budget it draws on. A peer's leaves the node's map when the last
/// thing it holds is given back.
#[derive(Debug)]
pub struct Source {
    slots: [Slots; KINDS],
    budget: Arc<Slots>,
    /// Bytes this source's connections hold of the node's buffer budget.
    buffered: std::sync::atomic::AtomicU64,
    buffers: Arc<Buffers>,
    /// Peers only: the map it is in, to leave it when dropped.
    registry: Option<(IpAddr, Weak<PeerMap>)>,
}

type PeerMap = Mutex<HashMap<IpAddr, Weak<Source>>>;

/// One slot of a source and `descriptors` of the node's budget, given back
/// when dropped. Keeps its source alive: counts never restart while held.
#[derive(Debug)]
pub struct Taken {
    source: Arc<Source>,
    kind: Kind,
    descriptors: u32,
}

impl Source {
    pub fn in_use(&self, kind: Kind) -> u32 {
        self.slots[kind as usize].in_use()
    }

    pub fn max(&self, kind: Kind) -> u32 {
        self.slots[kind as usize].max()
    }

    /// One slot of `kind` and `descriptors` of the budget, or neither: over
    /// the source's bound it is SOURCE_LIMIT, over the budget OVERLOAD. Two
    /// atomic operations when under both.
    pub fn take(self: &Arc<Self>, kind: Kind, descriptors: u32) -> Result<Taken, OverLimit> {
        let own = &self.slots[kind as usize];
        if !own.take(1) {
            return Err(OverLimit { flag: ResponseFlag::SourceLimit, what: kind.what(), limit: own.max() });
        }
        if descriptors > 0 && !self.budget.take(descriptors) {
            own.give(1);
            return Err(over_budget(&self.budget));
        }
        Ok(Taken { source: self.clone(), kind, descriptors })
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        self.source.slots[self.kind as usize].give(1);
        if self.descriptors > 0 {
            self.source.budget.give(self.descriptors);
        }
    }
}

impl Drop for Source {
    fn drop(&mut self) {
        let Some((ip, map)) = &self.registry else { return };
        let Some(map) = map.upgrade() else { return };
        let mut m = map.locked();
        // A newer source of the same peer may have replaced this one.
        if m.get(ip).is_some_and(|w| w.strong_count() == 0) {
            m.remove(ip);
        }
    }
}

fn over_budget(budget: &Slots) -> OverLimit {
    OverLimit { flag: ResponseFlag::Overload, what: "", limit: budget.max() }
}

/// Whether to write a refusal's log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogDecision {
    /// Write it.
    Log,
    /// Over this source's lines for the current second: count it in the
    /// summary instead.
    Suppress,
}

/// Where a peer (a waypoint) asked one of this node's pods to hold off
/// (HBONE 503 with `retry-after`: the pod broke connections on purpose):
/// until then that pod's connections to that peer are refused here, and
/// cost the peer nothing. Bounded: at most [`HoldOffs::MAX`] entries, the
/// expired ones dropped first; a peer's request is honoured for at most
/// [`HoldOffs::LONGEST`].
#[derive(Debug, Default)]
pub struct HoldOffs {
    until: Mutex<HashMap<(IpAddr, SocketAddr), Instant>>,
}

impl HoldOffs {
    pub const MAX: usize = 16_384;
    pub const LONGEST: Duration = Duration::from_secs(60);

    /// `src` is to hold off `dst` for `secs` from `now`.
    pub fn hold(&self, src: IpAddr, dst: SocketAddr, secs: u32, now: Instant) {
        let until = now + Duration::from_secs(u64::from(secs)).min(Self::LONGEST);
        let mut m = self.until.locked();
        if m.len() >= Self::MAX {
            m.retain(|_, u| *u > now);
            if m.len() >= Self::MAX {
                return;
            }
        }
        m.insert((src, dst), until);
    }

    /// Until when `src` holds off `dst`, if it does at `now`.
    pub fn holding(&self, src: IpAddr, dst: SocketAddr, now: Instant) -> Option<Instant> {
        let mut m = self.until.locked();
        match m.get(&(src, dst)) {
            Some(u) if *u > now => Some(*u),
            Some(_) => {
                m.remove(&(src, dst));
                None
            }
            None => None,
        }
    }
}

/// At most `burst` log lines per source at once and `burst` per `period`
/// after that (the one log limiter, `slipstream_core::log_limit`); the
/// rest are counted and reported by [`RefusalLog::summaries`] as "N more
/// suppressed". The metrics count every refusal; only the lines are
/// limited.
#[derive(Debug)]
pub struct RefusalLog<K: Eq + Hash + Clone> {
    limiter: Mutex<LogLimiter<K>>,
}

/// Sources remembered at most (quiet ones are forgotten first).
const MAX_LOGGED_SOURCES: usize = 1 << 16;

impl<K: Eq + Hash + Clone> RefusalLog<K> {
    pub fn new(burst: u32, period: Duration) -> Self {
        let rate = Rate { burst: f64::from(burst), per_second: f64::from(burst) / period.as_secs_f64().max(1e-3) };
        RefusalLog { limiter: Mutex::new(LogLimiter::new(rate, MAX_LOGGED_SOURCES)) }
    }

    /// One refusal of `key` at `now` (the key is copied only for a source
    /// not yet remembered).
    pub fn check<Q>(&self, key: &Q, now: Instant) -> LogDecision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // The counts stay with the sources until `summaries` reports them.
        if self.limiter.locked().allows(key, now) {
            LogDecision::Log
        } else {
            LogDecision::Suppress
        }
    }

    /// The sources whose flood of refusals ended, and how many lines each
    /// had suppressed: each count is reported once. Call it about once per
    /// period.
    pub fn summaries(&self, now: Instant) -> Vec<(K, u64)> {
        self.limiter.locked().ended_floods(now)
    }

    /// Suppressed lines of sources forgotten (to make room for others)
    /// before their count was reported, since the last call.
    pub fn take_untracked(&self) -> u64 {
        self.limiter.locked().take_untracked()
    }
}

/// The node's buffer budget: bytes the connections hold (read and not yet
/// written out, copy buffers, inbound tunnels' receive windows), all
/// sources together, and how many sources hold some. A source (a pod, or
/// a peer) may take more than its fair share (the budget over the sources
/// that hold some, and one more to come) only while a quarter of the
/// budget stays free for the others: so one source at the budget never
/// stops another's connections,
/// which start within the small read every connection has and grow into
/// the budget's free quarter and their own share. A refused grant only
/// keeps a connection on small reads (slower), never ends it.
#[derive(Debug)]
pub struct Buffers {
    budget: u64,
    used: std::sync::atomic::AtomicU64,
    holders: AtomicU32,
}

impl Buffers {
    pub fn new(budget: u64) -> Arc<Buffers> {
        Arc::new(Buffers { budget, used: Default::default(), holders: AtomicU32::new(0) })
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Bytes held now, all sources together.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Whether a source holding `mine` may take `n` more (the decision,
    /// pure: table-tested).
    pub fn allows(budget: u64, used: u64, holders: u32, mine: u64, n: u64) -> bool {
        if used + n > budget {
            return false;
        }
        // The share as if one more source were coming: alone, a source
        // is within half of the budget, and up to three quarters past it.
        let holders = u64::from(holders) + u64::from(mine == 0) + 1;
        let share = budget / holders;
        mine + n <= share || used + n <= budget - budget / 4
    }

    fn take(&self, held: &std::sync::atomic::AtomicU64, n: u64) -> bool {
        let mine = held.load(Ordering::Relaxed);
        if !Self::allows(self.budget, self.used(), self.holders.load(Ordering::Relaxed), mine, n) {
            return false;
        }
        // Committed, then checked against the budget once more (another
        // source may have taken the same bytes meanwhile).
        if self.used.fetch_add(n, Ordering::Relaxed) + n > self.budget {
            self.used.fetch_sub(n, Ordering::Relaxed);
            return false;
        }
        if held.fetch_add(n, Ordering::Relaxed) == 0 {
            self.holders.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    fn give(&self, held: &std::sync::atomic::AtomicU64, n: u64) {
        if held.fetch_sub(n, Ordering::Relaxed) == n {
            self.holders.fetch_sub(1, Ordering::Relaxed);
        }
        self.used.fetch_sub(n, Ordering::Relaxed);
    }
}

impl slipstream_hbone::copy::BufferBudget for Source {
    fn take(&self, bytes: usize) -> bool {
        self.buffers.take(&self.buffered, bytes as u64)
    }
    fn give(&self, bytes: usize) {
        self.buffers.give(&self.buffered, bytes as u64)
    }
}

/// The node-wide counters, built from [`crate::config::Limits`].
pub struct NodeLimits {
    /// Descriptors held by proxied connections, all sources together.
    pub budget: Arc<Slots>,
    /// Bytes the connections hold of the buffer budget, all sources together.
    pub buffers: Arc<Buffers>,
    /// The peers that hold something, by IP.
    peers: Arc<PeerMap>,
    /// The bound of each kind, for new sources.
    max: [u32; KINDS],
}

impl NodeLimits {
    pub fn new(l: &crate::config::Limits) -> Self {
        NodeLimits {
            budget: Slots::new(l.connection_budget),
            buffers: Buffers::new(l.buffer_budget),
            peers: Arc::default(),
            max: [l.pod_connections, l.pod_pending, l.peer_connections, l.peer_handshakes, l.peer_streams, l.peer_plaintext],
        }
    }

    fn source(&self, registry: Option<(IpAddr, Weak<PeerMap>)>) -> Source {
        Source {
            slots: self.max.map(Slots::unshared),
            budget: self.budget.clone(),
            buffered: Default::default(),
            buffers: self.buffers.clone(),
            registry,
        }
    }

    /// A new local pod's counters (its `LocalPod` keeps them).
    pub fn for_pod(&self) -> Arc<Source> {
        Arc::new(self.source(None))
    }

    /// The counters of peer `ip`: one lookup under a lock, taken once per
    /// HBONE connection (its streams reuse it) or plaintext connection.
    pub fn peer(&self, ip: IpAddr) -> Arc<Source> {
        let ip = ip.to_canonical();
        let mut m = self.peers.locked();
        if let Some(s) = m.get(&ip).and_then(Weak::upgrade) {
            return s;
        }
        let s = Arc::new(self.source(Some((ip, Arc::downgrade(&self.peers)))));
        m.insert(ip, Arc::downgrade(&s));
        s
    }

    /// How many peers hold something.
    pub fn peers(&self) -> usize {
        self.peers.locked().len()
    }

    /// `descriptors` of the node budget.
    pub fn take_budget(&self, descriptors: u32) -> Result<SlotGuard, OverLimit> {
        self.budget.try_acquire(descriptors).ok_or_else(|| over_budget(&self.budget))
    }
}

/// Which bound refused a connection: the words of its log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverLimit {
    pub flag: ResponseFlag,
    /// What the source holds too many of ("open outbound connections").
    pub what: &'static str,
    pub limit: u32,
}

impl std::fmt::Display for OverLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.flag {
            ResponseFlag::Overload => write!(f, "the node proxy's connection budget ({} descriptors) is spent", self.limit),
            _ => write!(f, "source limit: already {} {} (the most one source may hold)", self.limit, self.what),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The buffer budget's decision: a source within its fair share takes
    /// up to the whole budget; one past it only while a quarter stays free
    /// for the others.
    #[test]
    fn the_buffer_budget_is_shared_fairly() {
        const B: u64 = 1000;
        let cases = [
            // (used, holders, mine, n, allowed, why)
            (0, 0, 0, 750, true, "alone: up to three quarters"),
            (0, 0, 0, 751, false, "alone: the last quarter stays for others"),
            (700, 1, 700, 50, true, "past its share: up to three quarters"),
            (740, 1, 740, 20, false, "past its share and the three quarters"),
            (740, 1, 0, 20, true, "another source within its share takes from the last quarter"),
            (740, 1, 0, 260, true, "...up to the budget (its share of three is 333)"),
            (740, 1, 0, 261, false, "...never past the budget"),
            (500, 2, 100, 200, true, "within its share (333) and the budget"),
            (990, 2, 495, 20, false, "the budget is spent"),
        ];
        for (used, holders, mine, n, want, why) in cases {
            assert_eq!(Buffers::allows(B, used, holders, mine, n), want, "{why}");
        }
    }

    #[test]
    fn buffer_grants_are_counted_per_source_and_given_back() {
        use slipstream_hbone::copy::BufferBudget;
        let l = NodeLimits::new(&crate::config::Limits {
            buffer_budget: 1 << 20,
            ..crate::config::Limits::derive(20_000, &Default::default())
        });
        let (a, b) = (l.for_pod(), l.for_pod());
        let grant = |s: &Source, n: usize| BufferBudget::take(s, n);
        // One pod takes what it can: three quarters.
        let mut took = 0;
        while grant(&a, 64 << 10) {
            took += 64 << 10;
        }
        assert_eq!(took, 768 << 10);
        // The other still gets its share's worth of the free quarter.
        assert!(grant(&b, 256 << 10), "a second pod is not starved");
        assert!(!grant(&b, 1), "the budget is spent");
        BufferBudget::give(&*a, took);
        BufferBudget::give(&*b, 256 << 10);
        assert_eq!(l.buffers.used(), 0);
        assert!(grant(&a, 768 << 10), "all given back: its three quarters again");
    }

    #[test]
    fn slots_acquire_release_and_refuse_over_the_limit() {
        let s = Slots::new(3);
        let a = s.try_acquire(1).unwrap();
        let b = s.try_acquire(2).unwrap();
        assert_eq!(s.in_use(), 3);
        assert!(s.try_acquire(1).is_none(), "over the limit");
        assert_eq!(s.in_use(), 3, "a refusal takes nothing");
        drop(a);
        assert_eq!(s.in_use(), 2);
        let c = s.try_acquire(1).unwrap();
        assert!(s.try_acquire(2).is_none(), "two do not fit in what is left");
        drop((b, c));
        assert_eq!(s.in_use(), 0);
        assert!(Slots::new(0).try_acquire(1).is_none(), "a zero limit refuses everything");
    }

    #[test]
    fn slots_are_exact_under_contention() {
        let s = Slots::new(1000);
        let got: Vec<usize> = std::thread::scope(|scope| {
            let hs: Vec<_> = (0..4).map(|_| scope.spawn(|| (0..500).filter_map(|_| s.try_acquire(1)).collect::<Vec<_>>())).collect();
            let guards: Vec<Vec<SlotGuard>> = hs.into_iter().map(|h| h.join().unwrap()).collect();
            assert_eq!(s.in_use(), 1000);
            guards.iter().map(Vec::len).collect()
        });
        assert_eq!(got.iter().sum::<usize>(), 1000, "exactly the limit granted: {got:?}");
        assert_eq!(s.in_use(), 0, "every guard gave its slot back");
    }

    #[test]
    fn keyed_slots_are_independent_per_key() {
        let s = KeyedSlots::<IpAddr>::new(2);
        let (x, y): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let cases: &[(IpAddr, bool)] = &[(x, true), (x, true), (x, false), (y, true), (y, true), (y, false), (x, false)];
        let mut held = Vec::new();
        for (i, (key, granted)) in cases.iter().enumerate() {
            let g = s.try_acquire(*key);
            assert_eq!(g.is_some(), *granted, "case {i}: {key}");
            held.extend(g);
        }
        assert_eq!((s.in_use(x), s.in_use(y), s.keys()), (2, 2, 2));
        held.truncate(1);
        assert_eq!((s.in_use(x), s.in_use(y), s.keys()), (1, 0, 1), "released keys leave the map");
        assert!(s.try_acquire(x).is_some());
        drop(held);
        assert_eq!(s.keys(), 0);
        let none = KeyedSlots::<IpAddr>::new(0);
        assert!(none.try_acquire(x).is_none());
        assert_eq!(none.keys(), 0, "a refusal leaves nothing behind");
    }

    #[test]
    fn refusal_log_allows_a_burst_then_summarises() {
        let log = RefusalLog::<&str>::new(3, Duration::from_secs(1));
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let decisions: Vec<LogDecision> = (0..10).map(|i| log.check(&"pod-a", at(i * 10))).collect();
        assert_eq!(decisions.iter().filter(|d| **d == LogDecision::Log).count(), 3);
        assert_eq!(log.check(&"pod-b", at(100)), LogDecision::Log, "another source has its own lines");
        assert!(log.summaries(at(200)).is_empty(), "nothing while the flood lasts (3 a second: no line back yet)");
        let mut s = log.summaries(at(1000));
        s.sort();
        assert_eq!(s, vec![("pod-a", 7)], "7 suppressed, reported once; pod-b had none");
        assert!(log.summaries(at(3000)).is_empty());
        assert_eq!(log.check(&"pod-a", at(3000)), LogDecision::Log, "lines back");
        // A line let through during a flood keeps its count for the
        // summary once the flood ends: nothing lost, nothing said twice.
        for i in 0..5 {
            log.check(&"pod-c", at(4000 + i));
        }
        assert_eq!(log.check(&"pod-c", at(4400)), LogDecision::Log, "one line back after a third of a second");
        assert!(log.summaries(at(4400)).is_empty(), "the line took the token back: the flood is not over");
        assert_eq!(log.summaries(at(5000)), vec![("pod-c", 2)]);
        assert!(log.summaries(at(9000)).is_empty());
    }

    fn limits(budget: u32, pod: u32, pending: u32, peer_streams: u32) -> NodeLimits {
        let a = crate::config::LimitArgs {
            connection_budget: Some(budget),
            pod_connections: Some(pod),
            pod_pending: Some(pending),
            peer_streams: Some(peer_streams),
            ..Default::default()
        };
        NodeLimits::new(&crate::config::Limits::derive(20_000, &a))
    }

    #[test]
    fn a_pod_at_its_limit_leaves_the_others_served() {
        let node = limits(10, 3, 2, 3);
        let (a, b) = (node.for_pod(), node.for_pod());
        let held_a: Vec<Taken> = (0..3).map(|_| a.take(Kind::PodOpen, 1).unwrap()).collect();
        let e = a.take(Kind::PodOpen, 1).unwrap_err();
        assert_eq!((e.flag, e.limit), (ResponseFlag::SourceLimit, 3));
        assert_eq!(e.to_string(), "source limit: already 3 open outbound connections (the most one source may hold)");
        assert_eq!((a.in_use(Kind::PodOpen), node.budget.in_use()), (3, 3), "a refusal takes nothing");
        let held_b: Vec<Taken> = (0..3).map(|_| b.take(Kind::PodOpen, 1).unwrap()).collect();
        assert_eq!(node.budget.in_use(), 6);
        drop(held_a);
        assert_eq!((a.in_use(Kind::PodOpen), b.in_use(Kind::PodOpen), node.budget.in_use()), (0, 3, 3), "released with the guard");
        drop(held_b);
        // Pending is its own bound, and takes none of the budget.
        let p = (a.take(Kind::PodPending, 0).unwrap(), a.take(Kind::PodPending, 0).unwrap());
        assert_eq!(a.take(Kind::PodPending, 0).unwrap_err().what, "outbound connections in set-up");
        assert_eq!(node.budget.in_use(), 0);
        drop(p);
        assert!(a.take(Kind::PodPending, 0).is_ok());
    }

    #[test]
    fn the_node_budget_bounds_every_source_together() {
        let node = limits(4, 3, 3, 3);
        let (a, b) = (node.for_pod(), node.for_pod());
        let peer = node.peer("10.0.0.9".parse().unwrap());
        let _a = (a.take(Kind::PodOpen, 1).unwrap(), a.take(Kind::PodOpen, 1).unwrap());
        let plain = peer.take(Kind::PeerPlaintext, 2).unwrap();
        let e = b.take(Kind::PodOpen, 1).unwrap_err();
        assert_eq!(e.flag, ResponseFlag::Overload, "the budget, not b's own limit");
        assert_eq!(b.in_use(Kind::PodOpen), 0, "b's slot was given back");
        let e = peer.take(Kind::PeerStreams, 1).unwrap_err();
        assert_eq!(e.flag, ResponseFlag::Overload);
        assert_eq!(peer.in_use(Kind::PeerStreams), 0, "the peer's slot was given back");
        drop(plain);
        assert!(b.take(Kind::PodOpen, 1).is_ok());
        assert_eq!(std::mem::size_of::<Taken>(), 16);
        assert_eq!(std::mem::size_of::<Option<Taken>>(), 16);
    }

    #[test]
    fn a_peer_is_one_source_while_it_holds_anything() {
        let node = limits(100, 3, 3, 2);
        let (x, y): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        // Looked up once per connection; the streams reuse what was found.
        let conn = node.peer(x);
        let s1 = conn.take(Kind::PeerStreams, 1).unwrap();
        drop(conn);
        // A second lookup (another tunnel, an IPv4-mapped address) finds the
        // same counters while anything is held: the bound is per peer.
        let again = node.peer("::ffff:10.0.0.1".parse().unwrap());
        let s2 = again.take(Kind::PeerStreams, 1).unwrap();
        assert_eq!(again.take(Kind::PeerStreams, 1).unwrap_err().flag, ResponseFlag::SourceLimit);
        drop(again);
        assert!(node.peer(y).take(Kind::PeerStreams, 1).is_ok(), "another peer has its own");
        assert_eq!(node.peers(), 1, "y held nothing after its stream ended: gone");
        drop((s1, s2));
        assert_eq!(node.peers(), 0, "x left the map with its last slot");
        assert_eq!(node.budget.in_use(), 0);
        assert_eq!(node.peer(x).in_use(Kind::PeerStreams), 0, "fresh counters");
    }
}
