//! What stands between port 15012 and the authenticator, for both
//! services on it: at most so many authentications under way at once (a
//! caller over it waits a little, then is told to retry), and a short
//! memory of refused tokens, so that a pod sending the same bad token in a
//! loop costs one TokenReview, not one per attempt.
//!
//! Refused tokens are remembered by a keyed hash, never as themselves;
//! only refusals are remembered ("the token was refused"), not failures
//! to ask ("could not be checked"), which the caller should retry.

use super::{AuthError, Authenticator, Caller};
use futures_util::future::BoxFuture;
use slipstream_core::sync::LockExt;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, PartialEq)]
pub struct GateSettings {
    /// Authentications under way at once, over all callers.
    pub max_in_flight: usize,
    /// How long a call waits for a free slot before it is refused with
    /// UNAVAILABLE (the caller retries with back-off).
    pub queue_timeout: Duration,
    /// How long a refused token is refused again without asking.
    pub refused_for: Duration,
    /// Refused tokens remembered at most.
    pub refused_entries: usize,
}

impl Default for GateSettings {
    fn default() -> Self {
        GateSettings {
            max_in_flight: 64,
            queue_timeout: Duration::from_secs(5),
            refused_for: Duration::from_secs(10),
            refused_entries: 4096,
        }
    }
}

pub struct Gate {
    inner: Arc<dyn Authenticator>,
    settings: GateSettings,
    slots: tokio::sync::Semaphore,
    hasher: RandomState,
    /// Keyed hash of a refused token: until when, and why.
    refused: Mutex<HashMap<u64, (Instant, AuthError)>>,
}

impl Gate {
    pub fn new(inner: Arc<dyn Authenticator>, settings: GateSettings) -> Gate {
        let slots = tokio::sync::Semaphore::new(settings.max_in_flight.max(1));
        Gate { inner, settings, slots, hasher: RandomState::new(), refused: Mutex::default() }
    }

    fn key(&self, md: &tonic::metadata::MetadataMap) -> Option<u64> {
        let v = md.get("authorization")?;
        Some(self.hasher.hash_one(v.as_bytes()))
    }

    fn refused_before(&self, key: u64, now: Instant) -> Option<AuthError> {
        let refused = self.refused.locked();
        refused.get(&key).filter(|(until, _)| *until > now).map(|(_, e)| e.clone())
    }

    fn remember_refusal(&self, key: u64, e: &AuthError, now: Instant) {
        let mut refused = self.refused.locked();
        if refused.len() >= self.settings.refused_entries {
            refused.retain(|_, (until, _)| *until > now);
            if refused.len() >= self.settings.refused_entries {
                // Still full: forget the oldest half rather than grow.
                let mut untils: Vec<Instant> = refused.values().map(|(u, _)| *u).collect();
                untils.sort();
                let cut = untils[untils.len() / 2];
                refused.retain(|_, (until, _)| *until > cut);
            }
        }
        refused.insert(key, (now + self.settings.refused_for, e.clone()));
    }

    async fn check(&self, md: &tonic::metadata::MetadataMap) -> Result<Caller, AuthError> {
        let key = self.key(md);
        if let Some(e) = key.and_then(|k| self.refused_before(k, Instant::now())) {
            return Err(e);
        }
        let _slot = match tokio::time::timeout(self.settings.queue_timeout, self.slots.acquire()).await {
            Ok(Ok(slot)) => slot,
            Ok(Err(_)) => return Err(AuthError::Unavailable("shutting down".into())),
            Err(_) => {
                return Err(AuthError::Unavailable(format!(
                    "{} authentications already under way; retry later",
                    self.settings.max_in_flight
                )))
            }
        };
        let r = self.inner.authenticate(md).await;
        if let (Err(e @ (AuthError::Rejected(_) | AuthError::Malformed(_))), Some(k)) = (&r, key) {
            self.remember_refusal(k, e, Instant::now());
        }
        r
    }
}

impl Authenticator for Gate {
    fn authenticate<'a>(&'a self, md: &'a tonic::metadata::MetadataMap) -> BoxFuture<'a, Result<Caller, AuthError>> {
        Box::pin(self.check(md))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Counts calls; "good" is node1's token, "slow" waits until released,
    /// "down" cannot be checked, anything else is refused.
    struct Counting {
        calls: AtomicUsize,
        release: tokio::sync::Notify,
    }

    impl Authenticator for Counting {
        fn authenticate<'a>(&'a self, md: &'a tonic::metadata::MetadataMap) -> BoxFuture<'a, Result<Caller, AuthError>> {
            Box::pin(async move {
                self.calls.fetch_add(1, Ordering::SeqCst);
                match super::super::bearer(md)? {
                    "good" => Ok(Caller { node: "node1".into(), subject: "t".into(), identity: None }),
                    "slow" => {
                        self.release.notified().await;
                        Ok(Caller { node: "node1".into(), subject: "t".into(), identity: None })
                    }
                    "down" => Err(AuthError::Unavailable("the API server is away".into())),
                    _ => Err(AuthError::Rejected("not a token of any node of this cluster".into())),
                }
            })
        }
    }

    fn md(token: &str) -> tonic::metadata::MetadataMap {
        let mut m = tonic::metadata::MetadataMap::new();
        m.insert("authorization", format!("Bearer {token}").parse().unwrap());
        m
    }

    fn gate(settings: GateSettings) -> (Arc<Counting>, Gate) {
        let inner = Arc::new(Counting { calls: AtomicUsize::new(0), release: tokio::sync::Notify::new() });
        (inner.clone(), Gate::new(inner, settings))
    }

    #[tokio::test]
    async fn a_refused_token_is_refused_again_without_asking_until_it_is_forgotten() {
        let (inner, g) = gate(GateSettings { refused_for: Duration::from_millis(200), ..Default::default() });
        for _ in 0..5 {
            assert!(matches!(g.authenticate(&md("bogus")).await, Err(AuthError::Rejected(_))));
        }
        assert_eq!(inner.calls.load(Ordering::SeqCst), 1, "asked once for five attempts");
        // Other tokens are not affected, and good ones are asked every time
        // (the authenticator keeps its own cache of answers).
        g.authenticate(&md("good")).await.unwrap();
        g.authenticate(&md("good")).await.unwrap();
        assert_eq!(inner.calls.load(Ordering::SeqCst), 3);
        // Failures to ask are not remembered: the caller retries.
        for _ in 0..2 {
            assert!(matches!(g.authenticate(&md("down")).await, Err(AuthError::Unavailable(_))));
        }
        assert_eq!(inner.calls.load(Ordering::SeqCst), 5);
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(g.authenticate(&md("bogus")).await.is_err());
        assert_eq!(inner.calls.load(Ordering::SeqCst), 6, "asked again once forgotten");
        assert!(!format!("{:?}", g.refused.locked()).contains("bogus"), "tokens are not kept");
    }

    #[tokio::test]
    async fn the_memory_of_refusals_is_bounded() {
        let (_, g) = gate(GateSettings { refused_entries: 8, ..Default::default() });
        for i in 0..100 {
            let _ = g.authenticate(&md(&format!("bogus-{i}"))).await;
        }
        assert!(g.refused.locked().len() <= 8);
    }

    #[tokio::test]
    async fn over_the_bound_a_caller_waits_then_is_told_to_retry() {
        let (inner, g) = gate(GateSettings { max_in_flight: 1, queue_timeout: Duration::from_millis(100), ..Default::default() });
        let g = Arc::new(g);
        let slow = tokio::spawn({
            let g = g.clone();
            async move { g.authenticate(&md("slow")).await }
        });
        while inner.calls.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        let e = g.authenticate(&md("good")).await.unwrap_err();
        assert!(matches!(&e, AuthError::Unavailable(m) if m.contains("retry")), "{e:?}");
        inner.release.notify_one();
        slow.await.unwrap().unwrap();
        g.authenticate(&md("good")).await.unwrap();
    }
}
