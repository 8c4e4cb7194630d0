//! Configuration from files, reloaded when they change. A file that does not
//! parse is reported (naming the file and the reason) and ignored: the proxy
//! keeps serving with its last good configuration.

use slipstream_core::{MeshConfig, MeshState, NodePods};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::watch;

#[derive(Clone)]
pub struct Snapshot {
    pub mesh: Arc<MeshState>,
    pub config: Arc<MeshConfig>,
    pub pods: Arc<NodePods>,
}

pub struct Watcher {
    workloads: PathBuf,
    pods: PathBuf,
    seen: (Option<SystemTime>, Option<SystemTime>),
    current: Snapshot,
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

fn load<T: serde::de::DeserializeOwned>(p: &Path) -> Result<T, String> {
    let text = std::fs::read_to_string(p).map_err(|e| format!("{}: cannot read: {e}", p.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: invalid: {e}", p.display()))
}

impl Watcher {
    pub fn new(workloads: PathBuf, pods: PathBuf) -> Self {
        let empty = MeshConfig::default();
        Watcher {
            workloads,
            pods,
            seen: (None, None),
            current: Snapshot { mesh: Arc::new(MeshState::new(&empty)), config: Arc::new(empty), pods: Arc::new(NodePods::default()) },
        }
    }

    /// Reloads what changed; Some(new snapshot) when anything did.
    pub fn poll(&mut self) -> Option<Snapshot> {
        let (w, p) = (mtime(&self.workloads), mtime(&self.pods));
        let mut changed = false;
        if w.is_some() && w != self.seen.0 {
            match load::<MeshConfig>(&self.workloads) {
                Ok(cfg) => {
                    let counts = |c: &MeshConfig| (c.workloads.len(), c.services.len(), c.policies.len());
                    // Readiness flips rewrite the file often; say so only when the shape changes.
                    if counts(&cfg) != counts(&self.current.config) {
                        tracing::info!(
                            workloads = cfg.workloads.len(),
                            services = cfg.services.len(),
                            policies = cfg.policies.len(),
                            "mesh configuration loaded"
                        );
                    } else {
                        tracing::debug!("mesh configuration reloaded");
                    }
                    self.current.mesh = Arc::new(MeshState::new(&cfg));
                    self.current.config = Arc::new(cfg);
                    changed = true;
                }
                Err(e) => tracing::error!("keeping the last good configuration: {e}"),
            }
            self.seen.0 = w;
        }
        if p.is_some() && p != self.seen.1 {
            match load::<NodePods>(&self.pods) {
                Ok(pods) => {
                    self.current.pods = Arc::new(pods);
                    changed = true;
                }
                Err(e) => tracing::error!("keeping the last good pod list: {e}"),
            }
            self.seen.1 = p;
        }
        changed.then(|| self.current.clone())
    }

    pub fn current(&self) -> Snapshot {
        self.current.clone()
    }

    /// Polls forever, publishing each new snapshot.
    pub async fn run(mut self, tx: watch::Sender<Snapshot>, every: Duration) {
        loop {
            if let Some(s) = self.poll() {
                let _ = tx.send(s);
            }
            tokio::time::sleep(every).await;
        }
    }
}
