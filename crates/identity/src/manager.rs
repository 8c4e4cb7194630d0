//! The certificate cache of a node proxy: one certificate per identity,
//! fetched once however many connections ask at the same time, renewed in
//! the background at half-life.

use slipstream_core::sync::LockExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::task::AbortHandle;

use crate::cert::WorkloadCert;
use crate::provider::{CertificateProvider, FetchError};
use crate::spiffe::SpiffeId;

/// Retry and refresh timing.
#[derive(Debug, Clone)]
pub struct CertManagerConfig {
    /// First delay after a failed fetch; doubles on each further failure.
    pub initial_retry: Duration,
    pub max_retry: Duration,
    /// Lower bound between two fetches of one identity, so a provider that
    /// hands out certificates already past half-life cannot cause a busy loop.
    pub min_refresh: Duration,
}

impl Default for CertManagerConfig {
    fn default() -> Self {
        Self { initial_retry: Duration::from_millis(500), max_retry: Duration::from_secs(30), min_refresh: Duration::from_millis(250) }
    }
}

#[derive(Clone, Debug)]
enum CertState {
    Pending,
    Ready(Arc<WorkloadCert>),
    Failed(FetchError),
}

struct Entry {
    state: watch::Receiver<CertState>,
    worker: AbortHandle,
}

/// What the admin endpoint shows about one cached identity. Never the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertSummary {
    pub identity: SpiffeId,
    pub status: CertStatus,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertStatus {
    Pending,
    Ready { serial: String, not_before: SystemTime, not_after: SystemTime, renew_at: SystemTime },
    Failed { error: String },
}

/// Caches and renews workload certificates. Clones share one cache.
/// Must be used inside a Tokio runtime (renewal runs as tasks).
#[derive(Clone)]
pub struct CertManager {
    inner: Arc<Inner>,
}

struct Inner {
    provider: Arc<dyn CertificateProvider>,
    config: CertManagerConfig,
    entries: Mutex<HashMap<SpiffeId, Entry>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let entries = self.entries.get_mut().unwrap_or_else(|e| e.into_inner());
        for entry in entries.values() {
            entry.worker.abort();
        }
    }
}

impl CertManager {
    pub fn new(provider: Arc<dyn CertificateProvider>, config: CertManagerConfig) -> Self {
        Self { inner: Arc::new(Inner { provider, config, entries: Mutex::new(HashMap::new()) }) }
    }

    /// The current certificate for `id`, fetching it on first use. Callers
    /// that arrive while a fetch is under way wait for that same fetch.
    pub async fn fetch_certificate(&self, id: &SpiffeId) -> Result<Arc<WorkloadCert>, FetchError> {
        let mut state = self.subscribe(id);
        loop {
            match &*state.borrow_and_update() {
                CertState::Ready(cert) if cert.is_expired(SystemTime::now()) => return Err(FetchError::Expired(id.clone())),
                CertState::Ready(cert) => return Ok(cert.clone()),
                CertState::Failed(err) => return Err(err.clone()),
                CertState::Pending => {}
            }
            if state.changed().await.is_err() {
                return Err(FetchError::Forgotten(id.clone()));
            }
        }
    }

    /// Stops managing `id` (its last workload left the node).
    pub fn forget(&self, id: &SpiffeId) {
        if let Some(entry) = self.lock().remove(id) {
            entry.worker.abort();
        }
    }

    /// The cached identities and their certificates' public facts, sorted.
    pub fn certificates(&self) -> Vec<CertSummary> {
        let mut out: Vec<CertSummary> = self
            .lock()
            .iter()
            .map(|(id, entry)| CertSummary {
                identity: id.clone(),
                status: match &*entry.state.borrow() {
                    CertState::Pending => CertStatus::Pending,
                    CertState::Ready(cert) => CertStatus::Ready {
                        serial: cert.serial().to_owned(),
                        not_before: cert.not_before(),
                        not_after: cert.not_after(),
                        renew_at: cert.renew_at(),
                    },
                    CertState::Failed(err) => CertStatus::Failed { error: err.to_string() },
                },
            })
            .collect();
        out.sort_by(|a, b| a.identity.cmp(&b.identity));
        out
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SpiffeId, Entry>> {
        // A panic while holding this lock cannot leave the map inconsistent
        // (every mutation is a single insert or remove), so poisoning is ignored.
        self.inner.entries.locked()
    }

    fn subscribe(&self, id: &SpiffeId) -> watch::Receiver<CertState> {
        let mut entries = self.lock();
        if let Some(entry) = entries.get(id) {
            return entry.state.clone();
        }
        let (tx, rx) = watch::channel(CertState::Pending);
        let worker = tokio::spawn(refresh_loop(self.inner.provider.clone(), self.inner.config.clone(), id.clone(), tx)).abort_handle();
        entries.insert(id.clone(), Entry { state: rx.clone(), worker });
        rx
    }
}

impl std::fmt::Debug for CertManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertManager").field("identities", &self.lock().len()).finish_non_exhaustive()
    }
}

/// Fetches `id`, publishes the result, sleeps until half-life, repeats.
/// On failure a still-valid certificate is kept while retrying with backoff.
async fn refresh_loop(provider: Arc<dyn CertificateProvider>, config: CertManagerConfig, id: SpiffeId, state: watch::Sender<CertState>) {
    let mut backoff = config.initial_retry;
    loop {
        let result = provider.fetch(&id).await.and_then(|cert| {
            if cert.identity() == &id {
                Ok(cert)
            } else {
                Err(FetchError::WrongIdentity { expected: id.clone(), got: cert.identity().clone() })
            }
        });
        let now = SystemTime::now();
        let wait = match result {
            Ok(cert) => {
                backoff = config.initial_retry;
                let wait = cert.renew_at().duration_since(now).unwrap_or_default().max(config.min_refresh);
                tracing::debug!(identity = %id, serial = cert.serial(), renew_in = ?wait, "certificate ready");
                state.send_replace(CertState::Ready(Arc::new(cert)));
                wait
            }
            Err(err) => {
                let still_valid = match &*state.borrow() {
                    CertState::Ready(cert) => cert.not_after().duration_since(now).ok(),
                    _ => None,
                };
                let wait = backoff;
                backoff = (backoff * 2).min(config.max_retry);
                match still_valid {
                    Some(left) => {
                        tracing::warn!(identity = %id, error = %err, "certificate renewal failed; keeping the current one");
                        // Retry no later than expiry, when the failure becomes visible.
                        wait.min(left)
                    }
                    None => {
                        tracing::warn!(identity = %id, error = %err, "certificate fetch failed");
                        state.send_replace(CertState::Failed(err));
                        wait
                    }
                }
            }
        };
        tokio::time::sleep(wait).await;
    }
}
