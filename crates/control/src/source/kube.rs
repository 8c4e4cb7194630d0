//! The `kubernetes` source: kube-rs watchers on the API server, one per
//! kind, each turned into the same raw documents the `dir` source reads,
//! so both go through one parser into the same k8s-openapi objects.
//!
//! Level-triggered: a watcher that (re)lists (at start, and whenever its
//! watch expires or breaks) ends the listing with [`RawEvent::Relisted`],
//! naming every object of the kind that exists; whatever the consumer holds
//! of that kind beyond them was deleted while nobody watched.
//!
//! The mesh kinds are custom resources: a cluster may not have their CRDs
//! (yet). When the API server's discovery does not list a kind (or a list
//! of it answers 404, its CRD deleted), the watcher reports
//! [`RawEvent::Absent`] (no object of it can exist, so there is nothing to
//! wait for) and asks discovery again every [`ABSENT_RETRY`]: a CRD
//! installed later is picked up within that, without a restart. Other
//! failures are retried with kube-rs's back-off (up to 30 s) and said
//! once per outage, not at every retry.

use futures_util::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{watcher, WatchStreamExt};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::sync::mpsc;

/// How often discovery is asked again for a kind the API server does not
/// serve: how long a CRD installed while the control plane runs goes
/// unnoticed. Discovery is served from memory.
pub const ABSENT_RETRY: Duration = Duration::from_secs(5);

/// A kind the control plane watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    /// Served only once a CRD defines it, or readable only with a
    /// permission the operator may not have given: the control plane
    /// serves without it rather than wait for it.
    pub custom: bool,
    /// Only this one object of the root namespace (the `istio`
    /// ConfigMap), not every object of the kind in the cluster.
    pub root_only: Option<&'static str>,
}

/// Everything the index reads (docs/protocols.md section 5 for the mesh kinds).
pub const KINDS: &[Kind] = &[
    Kind { group: "", version: "v1", kind: "Namespace", plural: "namespaces", custom: false, root_only: None },
    Kind { group: "", version: "v1", kind: "Pod", plural: "pods", custom: false, root_only: None },
    Kind { group: "", version: "v1", kind: "Service", plural: "services", custom: false, root_only: None },
    Kind { group: "", version: "v1", kind: "ServiceAccount", plural: "serviceaccounts", custom: false, root_only: None },
    Kind { group: "discovery.k8s.io", version: "v1", kind: "EndpointSlice", plural: "endpointslices", custom: false, root_only: None },
    Kind {
        group: "security.istio.io",
        version: "v1",
        kind: "AuthorizationPolicy",
        plural: "authorizationpolicies",
        custom: true,
        root_only: None,
    },
    Kind {
        group: "security.istio.io",
        version: "v1",
        kind: "PeerAuthentication",
        plural: "peerauthentications",
        custom: true,
        root_only: None,
    },
    Kind {
        group: "security.istio.io",
        version: "v1",
        kind: "RequestAuthentication",
        plural: "requestauthentications",
        custom: true,
        root_only: None,
    },
    Kind { group: "networking.k8s.io", version: "v1", kind: "NetworkPolicy", plural: "networkpolicies", custom: false, root_only: None },
    Kind { group: "cilium.io", version: "v2", kind: "CiliumNetworkPolicy", plural: "ciliumnetworkpolicies", custom: true, root_only: None },
    Kind { group: "gateway.networking.k8s.io", version: "v1", kind: "Gateway", plural: "gateways", custom: true, root_only: None },
    Kind { group: "gateway.networking.k8s.io", version: "v1", kind: "HTTPRoute", plural: "httproutes", custom: true, root_only: None },
    Kind { group: "gateway.networking.k8s.io", version: "v1", kind: "GRPCRoute", plural: "grpcroutes", custom: true, root_only: None },
    Kind { group: "networking.istio.io", version: "v1", kind: "VirtualService", plural: "virtualservices", custom: true, root_only: None },
    Kind {
        group: "networking.istio.io",
        version: "v1",
        kind: "DestinationRule",
        plural: "destinationrules",
        custom: true,
        root_only: None,
    },
    Kind {
        group: "slipstream.io",
        version: "v1alpha1",
        kind: "LocalRateLimitPolicy",
        plural: "localratelimitpolicies",
        custom: true,
        root_only: None,
    },
    // MeshConfig: the `mesh` key of the root namespace's `istio` ConfigMap.
    // Without it (or without the permission to read it) Istio's defaults.
    Kind {
        group: "",
        version: "v1",
        kind: "ConfigMap",
        plural: "configmaps",
        custom: true,
        root_only: Some(crate::translate::mesh_config::CONFIG_MAP),
    },
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
    /// The API server does not serve `kind` (its discovery does not list
    /// it, or a list of it answered 404: its CRD is not installed). Sent
    /// once per outage.
    Absent {
        kind: &'static str,
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
        None => match kube::Config::infer().await {
            Ok(c) => c,
            Err(e) => {
                let home_config = std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".kube/config"));
                let something_given = std::env::var_os("KUBECONFIG").is_some()
                    || std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
                    || home_config.is_some_and(|p| p.exists());
                if something_given {
                    return Err(anyhow::Error::new(e).context("finding the Kubernetes API"));
                }
                anyhow::bail!(
                    "no Kubernetes API to watch: not running in a pod, and no kubeconfig (--kubeconfig, KUBECONFIG or ~/.kube/config). \
                     Give one, or take objects from a directory of manifests with --source dir:PATH"
                )
            }
        },
    };
    kube::Client::try_from(config).context("building the Kubernetes client")
}

/// Starts one watcher per kind; events arrive on `tx` until it is closed.
/// `root_namespace` holds the objects of the kinds read there only.
pub fn spawn(client: kube::Client, tx: mpsc::Sender<RawEvent>, root_namespace: &str) -> Vec<tokio::task::JoinHandle<()>> {
    KINDS.iter().map(|k| tokio::spawn(watch_kind(client.clone(), *k, tx.clone(), root_namespace.to_string()))).collect()
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

/// True when the API server answered that it does not serve the resource.
fn is_absent(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::InitialListFailed(kube::Error::Api(s)) if s.code == 404)
}

/// The control plane's account may not list the kind (403): e.g. the
/// MeshConfig ConfigMap of a root namespace the install was not given a
/// Role in. Treated as absent and asked again every [`FORBIDDEN_RETRY`],
/// not at the watcher's back-off, whose every attempt kube logs.
fn forbidden(e: &watcher::Error) -> Option<String> {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s)) | watcher::Error::WatchStartFailed(kube::Error::Api(s)) if s.code == 403 => {
            Some(s.message.clone())
        }
        _ => None,
    }
}

/// How often a kind the account may not list is tried again.
pub const FORBIDDEN_RETRY: Duration = Duration::from_secs(60);

/// Says once that `k` may not be read (and that it is treated as absent),
/// then waits [`FORBIDDEN_RETRY`]; false when the consumer is gone.
async fn wait_forbidden(k: &Kind, why: &str, refused: &mut bool, tx: &mpsc::Sender<RawEvent>) -> bool {
    if !*refused {
        tracing::warn!(
            kind = k.kind,
            "not permitted to read {} ({}): {why}; treated as absent{}, asked again every {FORBIDDEN_RETRY:?}",
            k.plural,
            k.api_version(),
            if k.root_only.is_some() { " (Istio's defaults apply)" } else { "" }
        );
        *refused = true;
        if tx.send(RawEvent::Absent { kind: k.kind }).await.is_err() {
            return false;
        }
    }
    tokio::select! {
        _ = tokio::time::sleep(FORBIDDEN_RETRY) => true,
        _ = tx.closed() => false,
    }
}

/// Whether the API server's discovery lists the kind. Asked instead of
/// listing the kind itself while it is absent: a list of a resource that
/// is not served answers a bare "404 page not found", which kube's client
/// logs as a warning at every attempt.
async fn served(client: &kube::Client, k: &Kind) -> Result<bool, kube::Error> {
    if k.group.is_empty() {
        return Ok(true);
    }
    let groups = client.list_api_groups().await?;
    let group = groups.groups.iter().find(|g| g.name == k.group);
    if !group.is_some_and(|g| g.versions.iter().any(|v| v.version == k.version)) {
        return Ok(false);
    }
    let resources = client.list_api_group_resources(&k.api_version()).await?;
    Ok(resources.resources.iter().any(|r| r.name == k.plural))
}

/// What a watcher has met so far, for its log lines and its relists.
struct WatchState<'a> {
    failing: bool,
    absent: bool,
    refused: bool,
    /// The keys of the list under way (between Init and InitDone).
    listing: &'a mut Option<BTreeSet<(String, String)>>,
}

impl WatchState<'_> {
    /// One watcher event: Ok(what to send, if anything), or Err when the
    /// watcher must end: the kind is not served (None) or reading it is
    /// forbidden (why).
    fn on_event(
        &mut self,
        k: &Kind,
        ev: Result<watcher::Event<DynamicObject>, watcher::Error>,
    ) -> Result<Option<RawEvent>, Option<String>> {
        Ok(match ev {
            Ok(watcher::Event::Init) => {
                *self.listing = Some(BTreeSet::new());
                None
            }
            Ok(watcher::Event::InitApply(o)) => {
                if let Some(l) = self.listing.as_mut() {
                    l.insert(key(&o));
                }
                Some(RawEvent::Apply(to_json(k, o)))
            }
            Ok(watcher::Event::InitDone) => {
                if self.absent {
                    tracing::info!(kind = k.kind, "the API server serves {} ({}) now: watching", k.plural, k.api_version());
                } else if self.failing {
                    tracing::info!(kind = k.kind, "watching again");
                }
                (self.failing, self.absent, self.refused) = (false, false, false);
                Some(RawEvent::Relisted { kind: k.kind, present: self.listing.take().unwrap_or_default() })
            }
            Ok(watcher::Event::Apply(o)) => Some(RawEvent::Apply(to_json(k, o))),
            Ok(watcher::Event::Delete(o)) => {
                let (namespace, name) = key(&o);
                Some(RawEvent::Delete { kind: k.kind, namespace, name })
            }
            Err(e) if is_absent(&e) => return Err(None),
            Err(e) if forbidden(&e).is_some() => return Err(forbidden(&e)),
            Err(e) => {
                // Said once per outage; the back-off retries meanwhile.
                if !self.failing {
                    tracing::warn!(kind = k.kind, "cannot watch {} ({}): {e}; retrying with back-off", k.plural, k.api_version());
                    self.failing = true;
                }
                None
            }
        })
    }
}

async fn watch_kind(client: kube::Client, k: Kind, tx: mpsc::Sender<RawEvent>, root_namespace: String) {
    let gvk = GroupVersionKind::gvk(k.group, k.version, k.kind);
    let ar = ApiResource::from_gvk_with_plural(&gvk, k.plural);
    let (api, config): (Api<DynamicObject>, watcher::Config) = match k.root_only {
        None => (Api::all_with(client.clone(), &ar), watcher::Config::default()),
        Some(name) => (
            Api::namespaced_with(client.clone(), &root_namespace, &ar),
            watcher::Config::default().fields(&format!("metadata.name={name}")),
        ),
    };
    let mut failing = false;
    let mut absent = false;
    let mut refused = false;
    // Each pass is one watcher, started once discovery lists the kind (custom
    // kinds; built-in ones are always served). A pass ends when the kind
    // turns out not to be served (its CRD deleted); discovery is then asked
    // every ABSENT_RETRY (the watcher's own back-off would grow to 30 s).
    loop {
        // A discovery failure is left to the watcher to meet and report.
        let not_served = (k.custom || absent) && matches!(served(&client, &k).await, Ok(false));
        let mut forbidden_now = None;
        if !not_served {
            let mut stream = std::pin::pin!(watcher(api.clone(), config.clone()).default_backoff());
            let mut listing: Option<BTreeSet<(String, String)>> = None;
            while let Some(ev) = stream.next().await {
                let mut state = WatchState { failing, absent, refused, listing: &mut listing };
                let out = state.on_event(&k, ev);
                (failing, absent, refused) = (state.failing, state.absent, state.refused);
                match out {
                    Ok(Some(ev)) => {
                        if tx.send(ev).await.is_err() {
                            return;
                        }
                    }
                    Ok(None) => {}
                    Err(why) => {
                        forbidden_now = why;
                        break;
                    }
                }
            }
        }
        if let Some(why) = forbidden_now {
            if !wait_forbidden(&k, &why, &mut refused, &tx).await {
                return;
            }
            continue;
        }
        refused = false;
        if !absent {
            tracing::warn!(
                kind = k.kind,
                "the API server does not serve {} ({}){}; watching for it",
                k.plural,
                k.api_version(),
                if k.custom { ": is its CRD installed?" } else { "" }
            );
            (failing, absent) = (false, true);
            if tx.send(RawEvent::Absent { kind: k.kind }).await.is_err() {
                return;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(ABSENT_RETRY) => {}
            _ = tx.closed() => return,
        }
    }
}
