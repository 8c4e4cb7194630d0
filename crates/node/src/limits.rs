//! What one source may hold in the node proxy, and the node-wide budget.
//!
//! The node proxy is shared by every pod of its node: a pod (or a peer
//! address) that opens connections as fast as it can must hit its own bound
//! while the others are served as before. Two pure types do the counting:
//!
//! - [`Slots`]: one counter with a maximum (a local pod's outbound
//!   connections, the node's connection budget). Acquire and release are
//!   one atomic operation each.
//! - [`KeyedSlots`]: a counter per key (a peer IP) in a small map, taken
//!   once per connection or stream, never per byte.
//!
//! Both hand out guards that give the slot back when dropped, so a slot is
//! held exactly as long as what it counts. [`RefusalLog`] keeps the log
//! lines of refusals to a few per second per source.

use crate::metrics::ResponseFlag;
use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
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
        Arc::new(Slots { used: AtomicU32::new(0), max })
    }

    pub fn max(&self) -> u32 {
        self.max
    }

    pub fn in_use(&self) -> u32 {
        self.used.load(Ordering::Relaxed)
    }

    /// Takes `n` slots, or none if that would go over the maximum. Exact: a
    /// refusal means the slots were all held at that instant.
    pub fn try_acquire(self: &Arc<Self>, n: u32) -> Option<SlotGuard> {
        self.used.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |u| u.checked_add(n).filter(|&t| t <= self.max)).ok()?;
        Some(SlotGuard { slots: self.clone(), n })
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.slots.used.fetch_sub(self.n, Ordering::AcqRel);
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
        self.used.lock().expect("slots lock").get(&key).copied().unwrap_or(0)
    }

    /// How many keys hold at least one slot.
    pub fn keys(&self) -> usize {
        self.used.lock().expect("slots lock").len()
    }

    pub fn try_acquire(self: &Arc<Self>, key: K) -> Option<KeyedGuard<K>> {
        let mut m = self.used.lock().expect("slots lock");
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
        let mut m = self.slots.used.lock().expect("slots lock");
        if let Some(n) = m.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.key);
            }
        }
    }
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

#[derive(Debug)]
struct Window {
    start: Instant,
    logged: u32,
    suppressed: u64,
}

/// At most `burst` log lines per source per `period`; the rest are counted
/// and reported by [`RefusalLog::summaries`] as "N more suppressed". The
/// metrics count every refusal; only the lines are limited.
#[derive(Debug)]
pub struct RefusalLog<K: Eq + Hash + Clone> {
    windows: Mutex<HashMap<K, Window>>,
    burst: u32,
    period: Duration,
}

impl<K: Eq + Hash + Clone> RefusalLog<K> {
    pub fn new(burst: u32, period: Duration) -> Self {
        RefusalLog { windows: Mutex::new(HashMap::new()), burst, period }
    }

    /// One refusal of `key` at `now`.
    pub fn check(&self, key: &K, now: Instant) -> LogDecision {
        let mut m = self.windows.lock().expect("refusal log lock");
        let w = match m.get_mut(key) {
            Some(w) => w,
            None => m.entry(key.clone()).or_insert(Window { start: now, logged: 0, suppressed: 0 }),
        };
        if now.duration_since(w.start) >= self.period && w.suppressed == 0 {
            // A new window; one with suppressed lines waits for its summary.
            *w = Window { start: now, logged: 0, suppressed: 0 };
        }
        if w.logged < self.burst {
            w.logged += 1;
            LogDecision::Log
        } else {
            w.suppressed += 1;
            LogDecision::Suppress
        }
    }

    /// The sources whose window ended with lines suppressed, and how many:
    /// each is reported once, and its window starts afresh. Windows that
    /// ended quietly are forgotten. Call it about once per period.
    pub fn summaries(&self, now: Instant) -> Vec<(K, u64)> {
        let mut m = self.windows.lock().expect("refusal log lock");
        let mut out = Vec::new();
        m.retain(|k, w| {
            if now.duration_since(w.start) < self.period {
                return true;
            }
            if w.suppressed > 0 {
                out.push((k.clone(), w.suppressed));
            }
            false
        });
        out
    }
}

/// The node-wide counters, built from [`crate::config::Limits`].
pub struct NodeLimits {
    /// Descriptors held by proxied connections, all sources together.
    pub budget: Arc<Slots>,
    /// Inbound, per peer IP: open HBONE connections on :15008.
    pub peer_connections: Arc<KeyedSlots<IpAddr>>,
    /// Inbound, per peer IP: handshakes in progress on :15008.
    pub peer_handshakes: Arc<KeyedSlots<IpAddr>>,
    /// Inbound, per peer IP: open CONNECT streams across its tunnels.
    pub peer_streams: Arc<KeyedSlots<IpAddr>>,
    /// Inbound, per peer IP: open plaintext connections on :15006.
    pub peer_plaintext: Arc<KeyedSlots<IpAddr>>,
    /// Per local pod, handed to each [`PodLimits`].
    pod_connections: u32,
    pod_pending: u32,
}

/// One local pod's outbound counters (its `LocalPod` holds them), with the
/// node's budget they draw on.
#[derive(Debug)]
pub struct PodLimits {
    /// Open outbound connections, set-up ones included.
    pub open: Arc<Slots>,
    /// Outbound connections still being set up.
    pub pending: Arc<Slots>,
    budget: Arc<Slots>,
}

impl NodeLimits {
    pub fn new(l: &crate::config::Limits) -> Self {
        NodeLimits {
            budget: Slots::new(l.connection_budget),
            peer_connections: KeyedSlots::new(l.peer_connections),
            peer_handshakes: KeyedSlots::new(l.peer_handshakes),
            peer_streams: KeyedSlots::new(l.peer_streams),
            peer_plaintext: KeyedSlots::new(l.peer_plaintext),
            pod_connections: l.pod_connections,
            pod_pending: l.pod_pending,
        }
    }

    pub fn for_pod(&self) -> Arc<PodLimits> {
        Arc::new(PodLimits { open: Slots::new(self.pod_connections), pending: Slots::new(self.pod_pending), budget: self.budget.clone() })
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

/// What a connection holds while it lives: its source's slot and its
/// share of the node's budget, released when its record is dropped. Small
/// on purpose (16 bytes): every open connection's future carries one.
#[derive(Debug, Default)]
pub enum Held {
    #[default]
    Nothing,
    /// One open outbound connection of a pod and one descriptor of the
    /// budget, in one pointer (no allocation).
    Pod(PodGuard),
    /// A peer's slot and `n` descriptors (inbound, which allocates anyway).
    Peer(Box<(KeyedGuard<IpAddr>, SlotGuard)>),
}

/// One open outbound connection of a pod and one descriptor of the node's
/// budget; both released on drop.
#[derive(Debug)]
pub struct PodGuard(Arc<PodLimits>);

impl Drop for PodGuard {
    fn drop(&mut self) {
        self.0.open.used.fetch_sub(1, Ordering::AcqRel);
        self.0.budget.used.fetch_sub(1, Ordering::AcqRel);
    }
}

fn over(flag: ResponseFlag, what: &'static str, limit: u32) -> OverLimit {
    OverLimit { flag, what, limit }
}

impl NodeLimits {
    /// `descriptors` of the node budget.
    pub fn take_budget(&self, descriptors: u32) -> Result<SlotGuard, OverLimit> {
        take_budget(&self.budget, descriptors)
    }

    /// A new inbound connection or stream from `peer`, counted in `slots`,
    /// with `descriptors` of the budget.
    pub fn inbound(&self, slots: &Arc<KeyedSlots<IpAddr>>, what: &'static str, peer: IpAddr, descriptors: u32) -> Result<Held, OverLimit> {
        let g = slots.try_acquire(peer.to_canonical()).ok_or_else(|| over(ResponseFlag::SourceLimit, what, slots.max()))?;
        Ok(Held::Peer(Box::new((g, self.take_budget(descriptors)?))))
    }
}

fn take_budget(budget: &Arc<Slots>, descriptors: u32) -> Result<SlotGuard, OverLimit> {
    budget.try_acquire(descriptors).ok_or_else(|| over(ResponseFlag::Overload, "", budget.max()))
}

impl PodLimits {
    /// A new outbound connection of this pod: its open slot and one
    /// descriptor of the budget (two atomic operations).
    pub fn outbound(self: &Arc<Self>) -> Result<Held, OverLimit> {
        let open = self.open.try_acquire(1).ok_or_else(|| over(ResponseFlag::SourceLimit, "open outbound connections", self.open.max()))?;
        let budget = take_budget(&self.budget, 1)?;
        // Both now owned by one guard.
        std::mem::forget(open);
        std::mem::forget(budget);
        Ok(Held::Pod(PodGuard(self.clone())))
    }

    /// One outbound connection in set-up, until the guard is dropped.
    pub fn pending(&self) -> Result<SlotGuard, OverLimit> {
        self.pending.try_acquire(1).ok_or_else(|| over(ResponseFlag::SourceLimit, "outbound connections in set-up", self.pending.max()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(log.summaries(at(500)).is_empty(), "nothing before the window ends");
        let mut s = log.summaries(at(1000));
        s.sort();
        assert_eq!(s, vec![("pod-a", 7)], "7 suppressed, reported once; pod-b had none");
        assert!(log.summaries(at(3000)).is_empty());
        assert_eq!(log.check(&"pod-a", at(3000)), LogDecision::Log, "a fresh window");
        // A window with suppressed lines keeps counting until summarised.
        for i in 0..5 {
            log.check(&"pod-c", at(4000 + i));
        }
        log.check(&"pod-c", at(5500));
        assert_eq!(log.summaries(at(5600)), vec![("pod-c", 3)]);
    }

    fn limits(budget: u32, pod: u32, pending: u32, peer: u32) -> NodeLimits {
        let a = crate::config::LimitArgs {
            connection_budget: Some(budget),
            pod_connections: Some(pod),
            pod_pending: Some(pending),
            peer_streams: Some(peer),
            ..Default::default()
        };
        NodeLimits::new(&crate::config::Limits::derive(20_000, &a))
    }

    #[test]
    fn a_pod_at_its_limit_leaves_the_others_served() {
        let node = limits(10, 3, 2, 3);
        let (a, b) = (node.for_pod(), node.for_pod());
        let held_a: Vec<Held> = (0..3).map(|_| a.outbound().unwrap()).collect();
        let e = a.outbound().unwrap_err();
        assert_eq!((e.flag, e.limit), (ResponseFlag::SourceLimit, 3));
        assert_eq!(e.to_string(), "source limit: already 3 open outbound connections (the most one source may hold)");
        assert_eq!((a.open.in_use(), node.budget.in_use()), (3, 3), "a refusal takes nothing");
        let held_b: Vec<Held> = (0..3).map(|_| b.outbound().unwrap()).collect();
        assert_eq!(node.budget.in_use(), 6);
        drop(held_a);
        assert_eq!((a.open.in_use(), b.open.in_use(), node.budget.in_use()), (0, 3, 3), "released with the guard");
        drop(held_b);
        // Pending is its own bound.
        let p = (a.pending().unwrap(), a.pending().unwrap());
        assert_eq!(a.pending().unwrap_err().what, "outbound connections in set-up");
        drop(p);
        assert!(a.pending().is_ok());
    }

    #[test]
    fn the_node_budget_bounds_every_source_together() {
        let node = limits(4, 3, 3, 3);
        let (a, b) = (node.for_pod(), node.for_pod());
        let peer: IpAddr = "10.0.0.9".parse().unwrap();
        let _a = (a.outbound().unwrap(), a.outbound().unwrap());
        let plain = node.inbound(&node.peer_plaintext, "open plaintext connections", peer, 2).unwrap();
        let e = b.outbound().unwrap_err();
        assert_eq!(e.flag, ResponseFlag::Overload, "the budget, not b's own limit");
        assert_eq!(b.open.in_use(), 0, "b's slot was given back");
        assert_eq!(node.peer_streams.in_use(peer), 0);
        let e = node.inbound(&node.peer_streams, "open HBONE streams", peer, 1).unwrap_err();
        assert_eq!(e.flag, ResponseFlag::Overload);
        assert_eq!(node.peer_streams.in_use(peer), 0, "the peer's slot was given back");
        drop(plain);
        assert!(b.outbound().is_ok());
        assert_eq!(std::mem::size_of::<Held>(), 16);
    }
}
