//! The `kubernetes` source: kube-rs watchers on the API server, one per
//! kind, each turned into the same raw documents the `dir` source reads,
//! so both go through one parser into the same k8s-openapi objects.
//!
//! Level-triggered: a watcher that (re)lists (at start, and whenever its
//! watch expires or breaks) ends the listing with [`RawEvent::Relisted`],
//! naming every object of the kind that exists; whatever the consumer holds
//! of that kind beyond them was deleted while nobody watched. A kind whose
//! resource is missing (the Istio CRDs not installed) is retried with
//! back-off and said once, not at every retry.

use futures_util::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{watcher, WatchStreamExt};
use std::collections::BTreeSet;
use tokio::sync::mpsc;

/// A kind the control plane watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
}

/// Everything the index reads (shared/PROTOCOLS.md section 5 for the mesh kinds).
pub const KINDS: &[Kind] = &[
    Kind { group: "", version: "v1", kind: "Namespace", plural: "namespaces" },
    Kind { group: "", version: "v1", kind: "Pod", plural: "pods" },
    Kind { group: "", version: "v1", kind: "Service", plural: "services" },
    Kind { group: "", version: "v1", kind: "ServiceAccount", plural: "serviceaccounts" },
    Kind { group: "discovery.k8s.io", version: "v1", kind: "EndpointSlice", plural: "endpointslices" },
    Kind { group: "security.istio.io", version: "v1", kind: "AuthorizationPolicy", plural: "authorizationpolicies" },
    Kind { group: "security.istio.io", version: "v1", kind: "PeerAuthentication", plural: "peerauthentications" },
];

impl Kind {
    fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

/// What a watcher saw.
#[derive(Debug, Clone, PartialEq)]
pub enum RawEvent {
    /// An object as the API server serves it (JSON with apiVersion and kind).
    Apply(serde_json::Value),
    Delete {
        kind: &'static str,
        namespace: String,
        name: String,
    },
    /// A (re)list of `kind` ended: these (namespace, name) exist; any other
    /// object of the kind the consumer holds is gone.
    Relisted {
        kind: &'static str,
        present: BTreeSet<(String, String)>,
    },
}

/// Connects with the usual rules: `--kubeconfig`, else `KUBECONFIG` or
/// `~/.kube/config`, else the in-cluster service account.
pub async fn client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    use anyhow::Context;
    let config = match kubeconfig {
        Some(p) => {
            let kc = kube::config::Kubeconfig::read_from(p).with_context(|| format!("reading the kubeconfig {}", p.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .with_context(|| format!("using the kubeconfig {}", p.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("finding the Kubernetes API (no --kubeconfig, KUBECONFIG, ~/.kube/config or in-cluster service account)")?,
    };
    kube::Client::try_from(config).context("building the Kubernetes client")
}

/// Starts one watcher per kind; events arrive on `tx` until it is closed.
pub fn spawn(client: kube::Client, tx: mpsc::Sender<RawEvent>) -> Vec<tokio::task::JoinHandle<()>> {
    KINDS.iter().map(|k| tokio::spawn(watch_kind(client.clone(), *k, tx.clone()))).collect()
}

fn key(o: &DynamicObject) -> (String, String) {
    (o.metadata.namespace.clone().unwrap_or_default(), o.metadata.name.clone().unwrap_or_default())
}

fn to_json(k: &Kind, o: DynamicObject) -> serde_json::Value {
    let mut v = serde_json::to_value(&o).unwrap_or_default();
    // Watch events of a DynamicObject may lack apiVersion/kind; the parser
    // needs them.
    if let Some(m) = v.as_object_mut() {
        m.insert("apiVersion".into(), k.api_version().into());
        m.insert("kind".into(), k.kind.into());
    }
    v
}

async fn watch_kind(client: kube::Client, k: Kind, tx: mpsc::Sender<RawEvent>) {
    let gvk = GroupVersionKind::gvk(k.group, k.version, k.kind);
    let ar = ApiResource::from_gvk_with_plural(&gvk, k.plural);
    let api: Api<DynamicObject> = Api::all_with(client, &ar);
    let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
    let mut listing: Option<BTreeSet<(String, String)>> = None;
    let mut failing = false;
    while let Some(ev) = stream.next().await {
        let out = match ev {
            Ok(watcher::Event::Init) => {
                listing = Some(BTreeSet::new());
                None
            }
            Ok(watcher::Event::InitApply(o)) => {
                if let Some(l) = listing.as_mut() {
                    l.insert(key(&o));
                }
                Some(RawEvent::Apply(to_json(&k, o)))
            }
            Ok(watcher::Event::InitDone) => {
                if failing {
                    tracing::info!(kind = k.kind, "watching again");
                    failing = false;
                }
                Some(RawEvent::Relisted { kind: k.kind, present: listing.take().unwrap_or_default() })
            }
            Ok(watcher::Event::Apply(o)) => Some(RawEvent::Apply(to_json(&k, o))),
            Ok(watcher::Event::Delete(o)) => {
                let (namespace, name) = key(&o);
                Some(RawEvent::Delete { kind: k.kind, namespace, name })
            }
            Err(e) => {
                // Said once per outage; the back-off retries meanwhile.
                if !failing {
                    tracing::warn!(kind = k.kind, "cannot watch {} ({}): {e}; retrying with back-off", k.plural, k.api_version());
                    failing = true;
                }
                None
            }
        };
        if let Some(ev) = out {
            if tx.send(ev).await.is_err() {
                return;
            }
        }
    }
}
