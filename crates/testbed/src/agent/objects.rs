//! The objects controller: the store (the API server's role: every
//! applied object, checked as a whole against the cluster before it is
//! taken: `store`), the service addresses allocated, and the objects
//! directory the control plane reads, with its generation counter.

use super::api_server;
use super::node::Node;
use super::pods::PodRuntime;
use super::services::{self, Vips};
use super::store::{ClusterFacts, Store};
use crate::names::Paths;

/// A request's planned store and its lines, or every error.
pub type Planned = Result<(Store, Vec<String>), Vec<String>>;

pub struct Objects {
    pub store: Store,
    pub vips: Vips,
    /// The objects as last written for the control plane, and the counter
    /// written with them (`api_server::GENERATION_FILE`).
    last_written: Option<String>,
    pub generation: u64,
}

impl Default for Objects {
    fn default() -> Self {
        Objects { store: Store::new(), vips: Vips::new(), last_written: None, generation: 0 }
    }
}

impl Objects {
    /// What the checks know of the running cluster.
    pub fn facts<'a>(&'a self, nodes: &'a [String]) -> ClusterFacts<'a> {
        ClusterFacts { nodes, vips: &self.vips }
    }

    /// Takes a planned store (every change of a request checked at once):
    /// its lines, logged under `verb`; or its errors, changing nothing.
    pub fn take(&mut self, verb: &str, planned: Planned) -> Result<Vec<String>, Vec<String>> {
        let (store, lines) = planned?;
        for l in &lines {
            tracing::info!("{verb}: {l}");
        }
        self.store = store;
        Ok(lines)
    }

    /// Gives every service that has none its address.
    pub fn allocate_vips(&mut self) {
        services::allocate_vips(&self.store, &mut self.vips);
    }

    /// Writes every object, as the API server would serve it, into the
    /// objects directory (the control plane's `dir` source), and bumps the
    /// generation when that changed anything. Writes only what changed.
    pub fn write(&mut self, paths: &Paths, pods: &[&PodRuntime], nodes: &[Node]) {
        let objs = api_server::cluster_objects(&self.store, pods, nodes, &self.vips);
        let text: String = objs.iter().filter_map(|o| o.to_yaml().ok()).collect::<Vec<_>>().join("---\n");
        if self.last_written.as_deref() == Some(text.as_str()) {
            return;
        }
        let dir = paths.objects_dir();
        match api_server::sync_dir(&dir, &objs) {
            Ok(report) => {
                if report.changed() || self.generation == 0 {
                    self.generation += 1;
                    let file = dir.join(api_server::GENERATION_FILE);
                    if let Err(e) = super::files::write_atomic(&file, &format!("{}\n", self.generation)) {
                        tracing::error!("cannot write {}: {e}", file.display());
                    }
                    tracing::debug!(written = report.written, removed = report.removed, generation = self.generation, "objects written");
                }
                self.last_written = Some(text);
            }
            Err(e) => tracing::error!("cannot write the objects into {}: {e}", dir.display()),
        }
    }
}
