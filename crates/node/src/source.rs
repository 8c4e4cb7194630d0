//! The configuration source of the local cluster: two files, reloaded when
//! they change. A file that does not parse is reported (naming the file and
//! the reason) and ignored: the proxy keeps serving with its last good
//! configuration. The mesh file is state-of-the-world; the proxy turns it
//! into upserts and removals by resource name (`MeshIndex::apply_config`),
//! the same incremental path a delta xDS stream takes.

use slipstream_core::{MeshConfig, NodePods};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

pub struct FileSource {
    workloads: PathBuf,
    pods: PathBuf,
    seen: (Option<SystemTime>, Option<SystemTime>),
}

/// What changed since the last poll.
#[derive(Debug, Default)]
pub struct Update {
    pub mesh: Option<MeshConfig>,
    pub pods: Option<NodePods>,
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

fn load<T: serde::de::DeserializeOwned>(p: &Path) -> Result<T, String> {
    let text = std::fs::read_to_string(p).map_err(|e| format!("{}: cannot read: {e}", p.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: invalid: {e}", p.display()))
}

impl FileSource {
    pub fn new(workloads: PathBuf, pods: PathBuf) -> Self {
        FileSource { workloads, pods, seen: (None, None) }
    }

    /// Reloads what changed.
    pub fn poll(&mut self) -> Update {
        let (w, p) = (mtime(&self.workloads), mtime(&self.pods));
        let mut u = Update::default();
        if w.is_some() && w != self.seen.0 {
            match load::<MeshConfig>(&self.workloads) {
                Ok(cfg) => u.mesh = Some(cfg),
                Err(e) => tracing::error!("keeping the last good configuration: {e}"),
            }
            self.seen.0 = w;
        }
        if p.is_some() && p != self.seen.1 {
            match load::<NodePods>(&self.pods) {
                Ok(pods) => u.pods = Some(pods),
                Err(e) => tracing::error!("keeping the last good pod list: {e}"),
            }
            self.seen.1 = p;
        }
        u
    }
}
