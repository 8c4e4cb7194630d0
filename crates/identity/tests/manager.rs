//! CertManager: shared fetches, half-life renewal, failure handling, dump.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::{wait_until_async, WAIT};
use futures_util::future::BoxFuture;
use slipstream_core::{SpiffeId, TrustDomain};
use slipstream_identity::{Ca, CertManager, CertManagerConfig, CertStatus, CertificateProvider, FetchError, LocalCaProvider, WorkloadCert};

fn id(s: &str) -> SpiffeId {
    s.parse().unwrap()
}

/// Wraps the local CA: counts fetches, can be slowed down or made to fail.
struct CountingProvider {
    inner: LocalCaProvider,
    fetches: AtomicUsize,
    delay: Duration,
    fail: std::sync::atomic::AtomicBool,
}

impl CountingProvider {
    fn new(validity: Duration, delay: Duration) -> Arc<Self> {
        let ca = Arc::new(Ca::generate(&TrustDomain::default()).unwrap());
        Arc::new(Self { inner: LocalCaProvider::new(ca, validity), fetches: AtomicUsize::new(0), delay, fail: Default::default() })
    }
}

/// The time left until `t` (zero if it has passed).
fn until(t: SystemTime) -> Duration {
    t.duration_since(SystemTime::now()).unwrap_or_default()
}

#[derive(Debug, thiserror::Error)]
#[error("CA unreachable")]
struct Unreachable;

impl CertificateProvider for CountingProvider {
    fn fetch<'a>(&'a self, id: &'a SpiffeId) -> BoxFuture<'a, Result<WorkloadCert, FetchError>> {
        Box::pin(async move {
            self.fetches.fetch_add(1, Ordering::SeqCst);
            // Not synchronization: a slow CA, so that concurrent requests
            // arrive while a fetch is in flight.
            tokio::time::sleep(self.delay).await;
            if self.fail.load(Ordering::SeqCst) {
                return Err(FetchError::Provider(Arc::new(Unreachable)));
            }
            self.inner.fetch(id).await
        })
    }
}

#[tokio::test]
async fn concurrent_requests_share_one_fetch() {
    let provider = CountingProvider::new(Duration::from_secs(3600), Duration::from_millis(100));
    let manager = CertManager::new(provider.clone(), CertManagerConfig::default());
    let who = id("spiffe://cluster.local/ns/default/sa/sleep");
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let m = manager.clone();
            let w = who.clone();
            tokio::spawn(async move { m.fetch_certificate(&w).await.unwrap() })
        })
        .collect();
    let mut serials = Vec::new();
    for t in tasks {
        serials.push(t.await.unwrap().serial().to_owned());
    }
    assert_eq!(provider.fetches.load(Ordering::SeqCst), 1);
    serials.dedup();
    assert_eq!(serials.len(), 1, "everyone got the same certificate");

    // A different identity is a different fetch; the first stays cached.
    let other = manager.fetch_certificate(&id("spiffe://cluster.local/ns/default/sa/other")).await.unwrap();
    assert_eq!(other.identity().service_account(), "other");
    manager.fetch_certificate(&who).await.unwrap();
    assert_eq!(provider.fetches.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn renews_at_half_life() {
    // 4 s lifetime; notBefore is backdated by a tenth (0.4 s), so half-life
    // falls about 1.8 s after issue.
    let provider = CountingProvider::new(Duration::from_secs(4), Duration::ZERO);
    let manager = CertManager::new(provider.clone(), CertManagerConfig::default());
    let who = id("spiffe://cluster.local/ns/default/sa/sleep");
    let first = manager.fetch_certificate(&who).await.unwrap();
    assert!(!first.should_renew(SystemTime::now()));

    // Renewed by 0.7 s past half-life at the latest.
    wait_until_async("the certificate to be renewed in the background", until(first.renew_at() + Duration::from_millis(700)), || {
        manager.certificates().iter().any(|c| matches!(&c.status, CertStatus::Ready { serial, .. } if serial != first.serial()))
    })
    .await;
    let second = manager.fetch_certificate(&who).await.unwrap();
    assert_ne!(second.serial(), first.serial(), "renewed in the background");
    assert_eq!(provider.fetches.load(Ordering::SeqCst), 2);
    // The old one was still valid when replaced.
    assert!(first.not_after() > second.not_before());
}

#[tokio::test]
async fn failure_is_shared_and_retried() {
    let provider = CountingProvider::new(Duration::from_secs(3600), Duration::from_millis(50));
    provider.fail.store(true, Ordering::SeqCst);
    let config = CertManagerConfig { initial_retry: Duration::from_millis(100), ..Default::default() };
    let manager = CertManager::new(provider.clone(), config);
    let who = id("spiffe://cluster.local/ns/default/sa/sleep");
    let (a, b) = tokio::join!(manager.fetch_certificate(&who), manager.fetch_certificate(&who));
    assert!(matches!(a, Err(FetchError::Provider(_))));
    assert!(matches!(b, Err(FetchError::Provider(_))));
    assert_eq!(provider.fetches.load(Ordering::SeqCst), 1);
    match &manager.certificates()[0].status {
        CertStatus::Failed { error } => assert!(error.contains("CA unreachable")),
        other => panic!("{other:?}"),
    }

    provider.fail.store(false, Ordering::SeqCst);
    // Retried within 0.4 s (the first retry comes after 100 ms).
    wait_until_async("a retry to fetch the certificate", Duration::from_millis(400), || {
        matches!(manager.certificates()[0].status, CertStatus::Ready { .. })
    })
    .await;
    let cert = manager.fetch_certificate(&who).await.unwrap();
    assert_eq!(cert.identity(), &who);
}

#[tokio::test]
async fn renewal_failure_keeps_the_valid_certificate() {
    let provider = CountingProvider::new(Duration::from_secs(3), Duration::ZERO);
    let config = CertManagerConfig { initial_retry: Duration::from_millis(100), ..Default::default() };
    let manager = CertManager::new(provider.clone(), config);
    let who = id("spiffe://cluster.local/ns/default/sa/sleep");
    let first = manager.fetch_certificate(&who).await.unwrap();
    provider.fail.store(true, Ordering::SeqCst);
    let fetches = || provider.fetches.load(Ordering::SeqCst);
    wait_until_async("a renewal attempt by 0.3 s past half-life", until(first.renew_at() + Duration::from_millis(300)), || fetches() >= 2)
        .await;
    // A third fetch is the retry: the failed renewal was handled by then.
    wait_until_async("a retry after the failed renewal", WAIT, || fetches() >= 3).await;
    assert!(provider.fetches.load(Ordering::SeqCst) >= 2, "renewal was attempted");
    let still = manager.fetch_certificate(&who).await.unwrap();
    assert_eq!(still.serial(), first.serial());
}

#[tokio::test]
async fn dump_lists_identity_expiry_serial_but_never_keys() {
    let provider = CountingProvider::new(Duration::from_secs(3600), Duration::ZERO);
    let manager = CertManager::new(provider, CertManagerConfig::default());
    let b = id("spiffe://cluster.local/ns/b/sa/b");
    let a = id("spiffe://cluster.local/ns/a/sa/a");
    let cert_b = manager.fetch_certificate(&b).await.unwrap();
    manager.fetch_certificate(&a).await.unwrap();
    let dump = manager.certificates();
    assert_eq!(dump.len(), 2);
    assert_eq!(dump[0].identity, a);
    assert_eq!(dump[1].identity, b);
    match &dump[1].status {
        CertStatus::Ready { serial, not_after, .. } => {
            assert_eq!(serial, cert_b.serial());
            assert_eq!(*not_after, cert_b.not_after());
        }
        other => panic!("{other:?}"),
    }
    let text = format!("{dump:?}");
    assert!(!text.contains("PRIVATE") && !text.contains(&cert_b.key().to_pem()[40..80]));

    manager.forget(&a);
    assert_eq!(manager.certificates().len(), 1);
}
