//! The agent's views of the API server: its node's pods, every namespace's
//! labels, and its DaemonSet's uninstall mark. Each change wakes the pass.

use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::Api;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;

/// Each namespace's labels, by name.
pub type NamespaceLabels = BTreeMap<String, BTreeMap<String, String>>;

pub struct Views {
    pods: reflector::Store<Pod>,
    namespaces: reflector::Store<Namespace>,
}

impl Views {
    /// The node's pods and each namespace's labels, as last seen.
    pub fn snapshot(&self) -> (Vec<Arc<Pod>>, NamespaceLabels) {
        let labels = self
            .namespaces
            .state()
            .iter()
            .map(|ns| (ns.metadata.name.clone().unwrap_or_default(), ns.metadata.labels.clone().unwrap_or_default()))
            .collect();
        (self.pods.state(), labels)
    }
}

/// Starts the watches; returns once the pods and namespaces are listed.
pub async fn start(
    client: kube::Client,
    node: &str,
    daemonset: Option<(String, String)>,
    wake: Sender<()>,
    marked: Arc<AtomicBool>,
) -> anyhow::Result<Views> {
    let pods = reflect(Api::<Pod>::all(client.clone()), watcher::Config::default().fields(&format!("spec.nodeName={node}")), wake.clone());
    let namespaces = reflect(Api::<Namespace>::all(client.clone()), watcher::Config::default(), wake.clone());
    if let Some((ns, name)) = daemonset {
        let api = Api::<DaemonSet>::namespaced(client, &ns);
        let stream = watcher(api, watcher::Config::default().fields(&format!("metadata.name={name}"))).default_backoff().applied_objects();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(ds) => {
                        let now = super::uninstall::is_marked(&ds);
                        if now && !marked.swap(true, Ordering::SeqCst) {
                            tracing::info!(daemonset = %name, "marked for uninstall: when this agent stops it releases every pod and removes the plugin");
                        }
                        if !now {
                            marked.store(false, Ordering::SeqCst);
                        }
                    }
                    Err(e) => tracing::warn!("watching the DaemonSet {ns}/{name}: {e}"),
                }
            }
        });
    }
    let wait = async {
        pods.wait_until_ready().await?;
        namespaces.wait_until_ready().await
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), wait)
        .await
        .map_err(|_| anyhow::anyhow!("the API server's pods and namespaces were not listed within 60s (see the warnings above)"))??;
    Ok(Views { pods, namespaces })
}

fn reflect<K>(api: Api<K>, config: watcher::Config, wake: Sender<()>) -> reflector::Store<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (reader, writer) = reflector::store();
    let kind = K::kind(&Default::default()).to_string();
    let stream = reflector(writer, watcher(api, config)).default_backoff().touched_objects();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            if let Err(e) = ev {
                tracing::warn!("watching {kind}: {e} (retrying)");
            }
            let _ = wake.send(());
        }
    });
    reader
}
