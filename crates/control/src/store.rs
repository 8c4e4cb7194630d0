//! The publication point between the index (one writer) and every xDS
//! stream (many readers).
//!
//! The index hands over each new [`Resources`] map with the [`Changes`]
//! that produced it; the store numbers it (its generation) and publishes
//! an immutable [`Published`] through a `tokio::sync::watch`. A stream
//! that wakes up looks at the newest publication only (publications it
//! slept through coalesce) and asks it what changed since the generation
//! it last handled: [`Published::changed_since`] answers from a bounded
//! log of recent changes, or says the log no longer reaches that far
//! back, and the stream then compares what it sent with the whole map
//! (cheap too: the maps are persistent and share what did not change).
//!
//! Nothing here knows about streams, nonces or proxies: `xds` reads it,
//! and `xds::Registry` answers "has every connected proxy acknowledged
//! generation N".

use crate::resources::{Changes, ResourceKey, Resources};
use slipstream_api::TypeUrl;
use std::collections::BTreeSet;
use std::sync::Arc;
use tokio::sync::watch;

/// How much history a publication carries: the log is cut to at most this
/// many generations, and to at most this many changed keys in total (one
/// huge change costs what many small ones do). A stream further behind
/// compares maps instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogLimits {
    pub generations: usize,
    pub keys: usize,
}

impl Default for LogLimits {
    fn default() -> Self {
        LogLimits { generations: 1024, keys: 16 * 1024 }
    }
}

/// One generation's changes.
#[derive(Debug)]
struct LogEntry {
    generation: u64,
    keys: Vec<ResourceKey>,
}

/// Every resource at one generation, and how recent generations got here.
#[derive(Debug, Clone)]
pub struct Published {
    /// Numbers publications that changed something, from 0 (what the
    /// store was created with). Local to this process: versions, not
    /// generations, are what replicas agree on.
    pub generation: u64,
    pub resources: Resources,
    /// Oldest first, contiguous generations ending at `generation`.
    log: imbl::Vector<Arc<LogEntry>>,
    log_keys: usize,
    /// Resources of each type, kept as changes arrive.
    counts: [usize; 5],
}

fn type_index(t: TypeUrl) -> usize {
    match t {
        TypeUrl::Address => 0,
        TypeUrl::Authorization => 1,
        TypeUrl::NetworkPolicy => 2,
        TypeUrl::Route => 3,
        TypeUrl::Mesh => 4,
    }
}

impl Published {
    /// The keys upserted or removed after generation `since`, up to this
    /// one; None when the log no longer reaches back to `since` (the
    /// caller then compares whole maps).
    pub fn changed_since(&self, since: u64) -> Option<BTreeSet<&ResourceKey>> {
        if since >= self.generation {
            return Some(BTreeSet::new());
        }
        let oldest = self.log.front()?.generation;
        // Entries are contiguous: the log covers (oldest - 1, generation].
        if since + 1 < oldest {
            return None;
        }
        Some(self.log.iter().filter(|e| e.generation > since).flat_map(|e| e.keys.iter()).collect())
    }

    /// How many resources of one type there are.
    pub fn count(&self, t: TypeUrl) -> usize {
        self.counts[type_index(t)]
    }
}

/// The writer's handle; clones share the one publication.
#[derive(Clone)]
pub struct Store {
    tx: Arc<watch::Sender<Arc<Published>>>,
    limits: LogLimits,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = self.current();
        f.debug_struct("Store").field("generation", &p.generation).field("resources", &p.resources.len()).finish()
    }
}

impl Store {
    /// Generation 0 holds `resources` (often empty: the index publishes
    /// its first full set as generation 1).
    pub fn new(resources: Resources) -> Store {
        Store::with_limits(resources, LogLimits::default())
    }

    pub fn with_limits(resources: Resources, limits: LogLimits) -> Store {
        let mut counts = [0; 5];
        for k in resources.keys() {
            counts[type_index(k.type_url)] += 1;
        }
        let first = Published { generation: 0, resources, log: imbl::Vector::new(), log_keys: 0, counts };
        Store { tx: Arc::new(watch::Sender::new(Arc::new(first))), limits }
    }

    /// Publishes the resources after one change and returns their
    /// generation. Empty `changes` publish nothing and return the current
    /// generation: every stream already holds it.
    ///
    /// `resources` must be the previous map with exactly `changes`
    /// applied: streams send only the keys named here.
    pub fn publish(&self, resources: Resources, changes: Changes) -> u64 {
        if changes.is_empty() {
            return self.tx.borrow().generation;
        }
        let limits = self.limits;
        let mut generation = 0;
        self.tx.send_modify(|current| {
            let mut keys = changes.upserted;
            keys.extend(changes.removed);
            keys.sort();
            keys.dedup();
            let mut counts = current.counts;
            for k in &keys {
                let (was, is) = (current.resources.contains_key(k), resources.contains_key(k));
                let n = &mut counts[type_index(k.type_url)];
                *n = (*n + usize::from(is)).saturating_sub(usize::from(was));
            }
            let mut log = current.log.clone();
            let mut log_keys = current.log_keys + keys.len();
            generation = current.generation + 1;
            log.push_back(Arc::new(LogEntry { generation, keys }));
            while log.len() > limits.generations || (log_keys > limits.keys && log.len() > 1) {
                if let Some(old) = log.pop_front() {
                    log_keys -= old.keys.len();
                }
            }
            *current = Arc::new(Published { generation, resources, log, log_keys, counts });
        });
        generation
    }

    /// The newest publication.
    pub fn current(&self) -> Arc<Published> {
        self.tx.borrow().clone()
    }

    /// Wakes on every publication; the newest is `borrow()`ed.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Published>> {
        self.tx.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Versioned;

    fn key(name: &str) -> ResourceKey {
        ResourceKey::new(TypeUrl::Address, name)
    }

    fn with(r: &Resources, name: &str, body: &[u8]) -> Resources {
        let any = prost_types::Any { type_url: TypeUrl::Address.as_str().into(), value: body.to_vec() };
        r.update(key(name), Arc::new(Versioned::new(any)))
    }

    fn upsert(name: &str) -> Changes {
        Changes { upserted: vec![key(name)], removed: vec![] }
    }

    #[test]
    fn generations_and_what_changed_since() {
        let store = Store::new(Resources::new());
        assert_eq!(store.current().generation, 0);
        let r1 = with(&Resources::new(), "a", b"1");
        assert_eq!(store.publish(r1.clone(), upsert("a")), 1);
        let r2 = with(&r1, "b", b"1");
        assert_eq!(store.publish(r2.clone(), upsert("b")), 2);
        assert_eq!(store.publish(r2.clone(), Changes::default()), 2, "nothing changed, nothing published");
        let r3 = r2.without(&key("a"));
        assert_eq!(store.publish(r3, Changes { upserted: vec![], removed: vec![key("a")] }), 3);

        let p = store.current();
        let names = |since| p.changed_since(since).map(|s| s.into_iter().map(|k| k.name.to_string()).collect::<Vec<_>>());
        assert_eq!(names(0), Some(vec!["a".to_string(), "b".to_string()]));
        assert_eq!(names(1), Some(vec!["a".to_string(), "b".to_string()]));
        assert_eq!(names(2), Some(vec!["a".to_string()]));
        assert_eq!(names(3), Some(vec![]));
        assert_eq!(p.count(TypeUrl::Address), 1);
        assert_eq!(p.count(TypeUrl::Authorization), 0);
    }

    #[test]
    fn the_log_is_bounded_and_says_when_it_no_longer_reaches_back() {
        let store = Store::with_limits(Resources::new(), LogLimits { generations: 3, keys: 100 });
        let mut r = Resources::new();
        for i in 0..5 {
            r = with(&r, &format!("w{i}"), b"x");
            store.publish(r.clone(), upsert(&format!("w{i}")));
        }
        let p = store.current();
        assert_eq!(p.generation, 5);
        assert!(p.changed_since(2).is_some(), "generations 3..=5 are held");
        assert_eq!(p.changed_since(2).unwrap().len(), 3);
        assert!(p.changed_since(1).is_none(), "generation 2 fell out");

        // Bounded by keys too: one big change pushes out the older ones.
        let store = Store::with_limits(Resources::new(), LogLimits { generations: 100, keys: 4 });
        store.publish(with(&Resources::new(), "a", b"x"), upsert("a"));
        let big = Changes { upserted: (0..4).map(|i| key(&format!("k{i}"))).collect(), removed: vec![] };
        store.publish(Resources::new(), big);
        let p = store.current();
        assert!(p.changed_since(1).is_some());
        assert!(p.changed_since(0).is_none());
        // A single change larger than the bound is still kept whole.
        let huge = Changes { upserted: (0..10).map(|i| key(&format!("h{i}"))).collect(), removed: vec![] };
        store.publish(Resources::new(), huge);
        assert_eq!(store.current().changed_since(2).map(|s| s.len()), Some(10));
    }

    #[tokio::test]
    async fn readers_see_the_newest_publication() {
        let store = Store::new(Resources::new());
        let mut rx = store.subscribe();
        let r = with(&Resources::new(), "a", b"1");
        store.publish(r.clone(), upsert("a"));
        store.publish(with(&r, "a", b"2"), upsert("a"));
        rx.changed().await.unwrap();
        assert_eq!(rx.borrow_and_update().generation, 2, "publications a reader slept through coalesce");
    }
}
