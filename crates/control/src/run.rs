//! `slipstream control`: one process wiring the parts together. Objects
//! come from the source, go through the index into the store; the :15012
//! port serves delta xDS and the certificate service from it; the monitor
//! port says how it goes.
//!
//! The port opens only once the source has been read whole: a proxy that
//! connected earlier would be told that everything it holds was removed
//! (its initial versions compared with an empty set), which is exactly
//! what a control plane restart must never do.

use crate::auth::{Authenticator, Gate, GateSettings, NodeTokens};
use crate::ca::{CaArgs, CaMaterial, CaService, ResourcePlacement, ResourceSource, ReviewPolicy, TokenReviewAuthenticator};
use crate::gateway::controller::{ControllerSettings, Mirror};
use crate::gateway::render::DeploySettings;
use crate::index::{Index, IndexSettings};
use crate::monitor::{self, MonitorSource};
use crate::objects::{self, Kind, ObjectRef};
use crate::resources::{Changes, Resources};
use crate::serve::{self, ControlServer, ServeSettings};
use crate::source::dir::DirSource;
use crate::source::kube::{self as kube_source, RawEvent};
use crate::source::ObjectEvent;
use crate::store::Store;
use crate::syncz::{ProxySync, Syncz, TypeSync};
use crate::xds::{XdsServer, XdsSettings};
use anyhow::{bail, Context};
use slipstream_core::sync::LockExt;
use slipstream_core::TrustDomain;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Where objects come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceArg {
    Kubernetes,
    Dir(PathBuf),
}

impl std::str::FromStr for SourceArg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "kubernetes" | "k8s" => Ok(SourceArg::Kubernetes),
            _ => match s.strip_prefix("dir:") {
                Some(p) if !p.is_empty() => Ok(SourceArg::Dir(PathBuf::from(p))),
                _ => Err(format!("{s:?}: expected `kubernetes` or `dir:PATH`")),
            },
        }
    }
}

#[derive(clap::Args, Debug, Clone)]
pub struct ControlArgs {
    /// Where objects come from: `kubernetes` (the API server: --kubeconfig,
    /// else KUBECONFIG or ~/.kube/config, else the in-cluster service
    /// account) or `dir:PATH` (a directory of manifests, watched; the local
    /// cluster's agent keeps one).
    #[arg(long, default_value = "kubernetes")]
    pub source: SourceArg,
    /// The kubeconfig of a `kubernetes` source (default: KUBECONFIG, then
    /// ~/.kube/config, then the in-cluster service account).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// How often a `dir:` source is checked for changes when nothing wakes
    /// it: changes wake it at once (inotify); this is the safety net.
    #[arg(long, default_value = "200ms", value_parser = slipstream_core::duration::parse_flag)]
    pub dir_interval: Duration,
    /// Delta xDS and the certificate service, over TLS.
    #[arg(long, default_value = "0.0.0.0:15012")]
    pub listen: SocketAddr,
    /// /ready, /debug/syncz, /debug/resources (keep it on loopback).
    #[arg(long, default_value = "127.0.0.1:15014")]
    pub monitor: SocketAddr,
    /// Connections one address may hold open on --listen (0: no bound). A
    /// node proxy holds one or two; raise it when node proxies reach the
    /// control plane through one NAT address.
    #[arg(long, default_value_t = ServeSettings::default().max_connections_per_peer)]
    pub max_connections_per_peer: usize,
    /// Full pushes (responses of 256 KiB or more) in flight at once over
    /// every xDS stream; the others wait their turn. Each holds its slot
    /// until its proxy answers it (at most 5 s), so memory stays bounded
    /// when every node proxy connects at once, e.g. after a restart of
    /// the control plane (0: no bound).
    #[arg(long, default_value_t = XdsSettings::default().large_responses_in_flight)]
    pub full_pushes_in_flight: usize,
    /// Names in the serving certificate (clients verify the first by default).
    #[arg(long = "server-name", default_value = slipstream_api::DEFAULT_CONTROL_PLANE_SAN, value_delimiter = ',')]
    pub server_names: Vec<String>,
    /// This cluster's id: workload uids are `<id>//Pod/<ns>/<name>`.
    #[arg(long, env = "CLUSTER_ID", default_value = "Kubernetes")]
    pub cluster_id: String,
    /// The mesh's trust domain: identities are `spiffe://<it>/ns/<ns>/sa/<sa>`,
    /// and the CA signs no other.
    #[arg(long, default_value = slipstream_core::DEFAULT_TRUST_DOMAIN)]
    pub trust_domain: String,
    /// Policies of this namespace apply mesh-wide.
    #[arg(long, default_value = slipstream_core::ROOT_NAMESPACE)]
    pub root_namespace: String,
    /// The cluster's DNS domain (istiod's `--domain`, the kubelet's
    /// `clusterDomain`): Services are `<name>.<namespace>.svc.<it>` in the
    /// workload API, and a VirtualService or DestinationRule host may be
    /// written that way.
    #[arg(long, env = "SLIPSTREAM_CONTROL_DOMAIN_SUFFIX", default_value = crate::translate::DEFAULT_DOMAIN_SUFFIX, value_parser = parse_domain_suffix)]
    pub domain_suffix: String,
    /// The certificate service: the CA material, lifetimes, and which
    /// Kubernetes tokens are node proxies'.
    #[command(flatten)]
    pub ca: CaArgs,
    /// The local cluster's per-node tokens (JSON: node name to token).
    /// Without it, callers are checked with TokenReview (Kubernetes).
    #[arg(long)]
    pub node_tokens: Option<PathBuf>,
    /// With --node-tokens: the local cluster's per-pod tokens of its
    /// waypoints (JSON: token to namespace, service account, node, pod),
    /// read again when the file changes. Each may obtain only its own
    /// identity.
    #[arg(long, requires = "node_tokens")]
    pub workload_tokens: Option<PathBuf>,
    /// Kubernetes: the gateway controller. For each Gateway of class
    /// `istio-waypoint` it applies a ServiceAccount, a Deployment and a
    /// Service owned by the Gateway, and it writes the Gateway's status
    /// and the Services' `istio.io/WaypointBound` (docs/waypoint.md). Turn
    /// it off where another controller (or none) deploys waypoints.
    #[arg(long, env = "SLIPSTREAM_CONTROL_GATEWAY_CONTROLLER", default_value_t = true, action = clap::ArgAction::Set)]
    pub gateway_controller: bool,
    /// The image of the waypoints the gateway controller deploys (it runs
    /// `slipstream waypoint`).
    #[arg(long, env = "SLIPSTREAM_CONTROL_WAYPOINT_IMAGE", default_value = DEFAULT_WAYPOINT_IMAGE)]
    pub waypoint_image: String,
    /// `host:port` by which deployed waypoints reach this control plane
    /// (its Service).
    #[arg(long, env = "SLIPSTREAM_CONTROL_WAYPOINT_CONTROL_PLANE", default_value = "istiod.istio-system.svc:15012")]
    pub waypoint_control_plane: String,
    /// How often the gateway controller applies everything again even if
    /// nothing changed (a made object deleted by hand comes back within
    /// it). At least 5s.
    #[arg(long, default_value = "60s", value_parser = parse_resync)]
    pub gateway_resync: Duration,
    /// How often the JWKS of a RequestAuthentication's `jwksUri` (a Service
    /// of the cluster) is fetched again; a failed fetch is retried sooner,
    /// and the last good key set stays in force.
    #[arg(long, default_value = "20m", value_parser = slipstream_core::duration::parse_flag)]
    pub jwks_refresh: Duration,
    /// Let a `jwksUri` whose Service has a loopback address be fetched
    /// (tests). Off: a tenant's RequestAuthentication cannot make the
    /// control plane call itself or its node; link-local (cloud metadata)
    /// addresses are never fetched.
    #[arg(long)]
    pub jwks_fetch_loopback: bool,
}

/// The waypoint image by default: this build's.
pub const DEFAULT_WAYPOINT_IMAGE: &str = concat!("ghcr.io/slipstream-mesh/slipstream:", env!("CARGO_PKG_VERSION"));

/// What the monitor shows, kept by the loops.
#[derive(Default)]
struct Progress {
    /// None until the source has been read whole.
    synced: Option<Instant>,
    serving: bool,
    objects_generation: u64,
    generation: u64,
    invalid: usize,
}

struct Monitor {
    progress: Arc<Mutex<Progress>>,
    store: Store,
    xds: Mutex<Option<XdsServer>>,
    replica: String,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.locked()
}

impl MonitorSource for Monitor {
    fn ready(&self) -> Result<(), String> {
        let p = lock(&self.progress);
        match (p.synced, p.serving) {
            (None, _) => Err("the object source has not been read whole yet".into()),
            (Some(_), false) => Err("the control plane port is not serving yet".into()),
            _ => Ok(()),
        }
    }

    fn syncz(&self) -> serde_json::Value {
        let (objects_generation, generation) = {
            let p = lock(&self.progress);
            (p.objects_generation, p.generation)
        };
        let published = self.store.current();
        let proxies = match &*lock(&self.xds) {
            Some(x) => x
                .registry()
                .proxies()
                .into_iter()
                .map(|p| ProxySync {
                    node: p.node,
                    id: p.id,
                    caller: p.caller,
                    peer: p.peer,
                    connected_secs: p.connected_secs,
                    acked_generation: p.acked_generation,
                    types: p
                        .types
                        .into_iter()
                        .map(|t| TypeSync {
                            type_name: t.type_name,
                            sent_nonce: t.sent_nonce,
                            acked_nonce: t.acked_nonce,
                            resources: t.resources,
                            nacks: t.nacks,
                            last_nack: t.last_nack,
                            last_nack_generation: t.last_nack_generation,
                            in_sync: t.in_sync,
                        })
                        .collect(),
                })
                .collect(),
            None => Vec::new(),
        };
        let resources =
            slipstream_api::TypeUrl::ALL.iter().map(|t| (t.short().to_string(), published.count(*t))).collect::<BTreeMap<_, _>>();
        serde_json::to_value(Syncz { replica: self.replica.clone(), objects_generation, generation, resources, proxies })
            .unwrap_or_default()
    }

    fn resources(&self) -> serde_json::Value {
        let published = self.store.current();
        let counts: BTreeMap<&str, usize> = slipstream_api::TypeUrl::ALL.iter().map(|t| (t.short(), published.count(*t))).collect();
        serde_json::json!({"generation": published.generation, "counts": counts, "invalidObjects": lock(&self.progress).invalid})
    }
}

/// The store's current resources, for the CA's placement checks.
struct StoreResources(Store);

impl ResourceSource for StoreResources {
    fn resources(&self) -> Resources {
        self.0.current().resources.clone()
    }
}

/// Applies a batch of events; the changes of all of them.
fn apply_batch(index: &mut Index, events: Vec<ObjectEvent>, origin: &str) -> (Changes, usize) {
    let mut all = Changes::default();
    let mut invalid = 0;
    for ev in events {
        let what = ev.object_ref();
        match index.apply(ev) {
            Ok(c) => {
                all.upserted.extend(c.upserted);
                all.removed.extend(c.removed);
            }
            Err(e) => {
                invalid += 1;
                tracing::error!(source = origin, object = %what, "refused, its last good version stays in force: {e}");
            }
        }
    }
    // A key both upserted and then removed (or the reverse) within one
    // batch: the store sends what the map holds at publication.
    all.upserted.sort();
    all.upserted.dedup();
    all.removed.sort();
    all.removed.dedup();
    (all, invalid)
}

/// The `.generation` counter the local cluster's agent writes with its objects.
fn read_marker(dir: &std::path::Path) -> u64 {
    std::fs::read_to_string(dir.join(".generation")).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0)
}

/// A task that ends when this is dropped: what `start` spawns ends with the
/// control plane, or with `start` itself when it fails half-way.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A batch of events from a source, with the objects generation they cover.
struct Batch {
    events: Vec<ObjectEvent>,
    objects_generation: u64,
    /// The source has now been read whole at least once.
    synced: bool,
}

fn dir_source(root: PathBuf, every: Duration) -> mpsc::Receiver<Batch> {
    let (tx, rx) = mpsc::channel(4);
    let mut dir = DirSource::new(root.clone());
    std::thread::Builder::new()
        .name("dir-source".into())
        .spawn(move || {
            let mut was_there = true;
            loop {
                // The marker first: every file written before it is then
                // included in this poll.
                let objects_generation = read_marker(&root);
                let events = dir.poll().into_iter().map(|(e, _)| e).collect();
                // A directory that is not there (a wrong path, not created
                // yet, removed) says nothing: never that every object is
                // gone, or proxies would be told that everything they hold
                // was removed. Said once each time it goes or comes back.
                let there = root.is_dir();
                match (was_there, there) {
                    (true, false) => tracing::warn!(
                        dir = %root.display(),
                        "the object directory does not exist; serving what was read before, if anything (not serving until it was read once)"
                    ),
                    (false, true) => tracing::info!(dir = %root.display(), "the object directory is there again"),
                    _ => {}
                }
                was_there = there;
                if tx.blocking_send(Batch { events, objects_generation, synced: there }).is_err() {
                    return;
                }
                // Until a file changes (inotify), or `every` at the latest.
                dir.wait(every);
            }
        })
        .expect("spawning the directory source");
    rx
}

/// How long the initial read waits for custom kinds that are neither
/// listed nor known to be absent (their watch fails otherwise: RBAC, a
/// broken conversion webhook) before serving without them.
const CUSTOM_KINDS_WAIT: Duration = Duration::from_secs(15);

/// Which kinds have been read whole: the source counts as read once every
/// built-in kind has listed and every custom kind has listed or is not
/// served (its CRD not installed); a custom kind still failing after
/// [`CUSTOM_KINDS_WAIT`] is given up on, with a warning. Built-in kinds are
/// never given up on: serving without pods would tell every proxy that
/// reconnects that its workloads were removed.
#[derive(Default)]
struct InitialRead {
    done: BTreeSet<&'static str>,
    warned: bool,
}

impl InitialRead {
    fn listed(&mut self, kind: &'static str) {
        self.done.insert(kind);
    }

    fn complete(&mut self, waited: Duration) -> bool {
        let missing = |custom: bool| -> Vec<&'static str> {
            kube_source::KINDS.iter().filter(|k| k.custom == custom && !self.done.contains(k.kind)).map(|k| k.kind).collect()
        };
        let (builtin, custom) = (missing(false), missing(true));
        if waited < CUSTOM_KINDS_WAIT || self.warned {
            return builtin.is_empty() && (custom.is_empty() || self.warned);
        }
        self.warned = true;
        if !builtin.is_empty() {
            tracing::warn!(
                "not serving yet: {} not listed after {CUSTOM_KINDS_WAIT:?} (see the watch errors above){}",
                builtin.join(", "),
                if custom.is_empty() { String::new() } else { format!("; nor {}", custom.join(", ")) }
            );
            return false;
        }
        if !custom.is_empty() {
            tracing::warn!(
                "serving without {}: not listed after {CUSTOM_KINDS_WAIT:?} (see the watch errors above); they are added when their watch succeeds",
                custom.join(", ")
            );
        }
        true
    }
}

/// The kubernetes source as batches, and its task: it ends, with every
/// watcher and its connection to the API server, once the receiver is
/// dropped.
fn kube_batches(client: kube::Client, mirror: Option<Arc<Mirror>>, root_namespace: &str) -> (mpsc::Receiver<Batch>, JoinHandle<()>) {
    let (raw_tx, raw_rx) = mpsc::channel(1024);
    let watchers = kube_source::spawn(client, raw_tx, root_namespace);
    let (tx, rx) = mpsc::channel(4);
    let task = tokio::spawn(async move {
        kube_read(raw_rx, tx, mirror).await;
        for w in &watchers {
            w.abort();
        }
        for w in watchers {
            let _ = w.await;
        }
    });
    (rx, task)
}

/// Turns the watchers' events into batches of objects until `tx` closes.
/// The gateway controller's `mirror`, if any, sees every event first.
async fn kube_read(mut raw_rx: mpsc::Receiver<RawEvent>, tx: mpsc::Sender<Batch>, mirror: Option<Arc<Mirror>>) {
    let mut known: BTreeMap<&'static str, BTreeSet<(String, String)>> = BTreeMap::new();
    let mut initial = InitialRead::default();
    let started = tokio::time::Instant::now();
    let mut synced = false;
    loop {
        // Until the source is read whole, wake up at the deadline even
        // if nothing arrives: kinds that fail send nothing.
        let first = tokio::select! {
            ev = raw_rx.recv() => match ev {
                Some(ev) => Some(ev),
                None => return,
            },
            _ = tokio::time::sleep_until(started + CUSTOM_KINDS_WAIT), if !synced && !initial.warned => None,
            _ = tx.closed() => return,
        };
        let mut raw: Vec<RawEvent> = first.into_iter().collect();
        while let Ok(more) = raw_rx.try_recv() {
            raw.push(more);
            if raw.len() >= 4096 {
                break;
            }
        }
        let mut events = Vec::new();
        for ev in raw {
            if let Some(m) = &mirror {
                m.observe(&ev);
            }
            match ev {
                RawEvent::Apply(v) => match objects::parse_value(v) {
                    Ok(Some(o)) => {
                        let r = o.object_ref();
                        known.entry(r.kind.as_str()).or_default().insert((r.namespace.clone(), r.name.clone()));
                        events.push(ObjectEvent::Upsert(o));
                    }
                    Ok(None) => {}
                    Err(e) => tracing::error!("refused, its last good version stays in force: {e}"),
                },
                RawEvent::Delete { kind, namespace, name } => {
                    if let Some(k) = Kind::ALL.into_iter().find(|k| k.as_str() == kind) {
                        known.entry(k.as_str()).or_default().remove(&(namespace.clone(), name.clone()));
                        events.push(ObjectEvent::Delete(ObjectRef::new(k, &namespace, &name)));
                    }
                }
                RawEvent::Relisted { kind, present } => {
                    initial.listed(kind);
                    if let Some(k) = Kind::ALL.into_iter().find(|k| k.as_str() == kind) {
                        let held = known.entry(k.as_str()).or_default();
                        for (ns, name) in held.difference(&present).cloned().collect::<Vec<_>>() {
                            held.remove(&(ns.clone(), name.clone()));
                            events.push(ObjectEvent::Delete(ObjectRef::new(k, &ns, &name)));
                        }
                    }
                }
                // Nothing of the kind can exist, so there is nothing to
                // wait for. What is held of it stays: a CRD's objects
                // are deleted (and their deletions watched) before the
                // CRD goes, so a 404 while holding some is an API
                // server's passing state, not a deletion.
                RawEvent::Absent { kind } => initial.listed(kind),
            }
        }
        synced = synced || initial.complete(started.elapsed());
        if tx.send(Batch { events, objects_generation: 0, synced }).await.is_err() {
            return;
        }
    }
}

/// A control plane serving in this process.
pub struct Running {
    /// Where :15012 and the monitor port are bound.
    pub addr: SocketAddr,
    pub monitor: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Running {
    /// Ends every stream, lets connections finish briefly, and returns.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.task.await.context("the control plane task")?
    }
}

/// `slipstream control`: serves until SIGTERM or Ctrl-C.
pub async fn run(args: ControlArgs) -> anyhow::Result<()> {
    let mut running = start(args).await?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = &mut running.task => return r.context("the control plane task")?,
        _ = term.recv() => tracing::info!("SIGTERM: stopping"),
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted: stopping"),
    }
    running.stop().await
}

/// `--gateway-resync`: a duration of at least 5 s.
fn parse_resync(s: &str) -> Result<Duration, String> {
    let d = slipstream_core::duration::parse_flag(s)?;
    if d < Duration::from_secs(5) {
        return Err(format!("{s}: at least 5s (each resync applies every waypoint's objects again)"));
    }
    Ok(d)
}

/// A DNS domain of lowercase labels (letters, digits, `-`, not at either
/// end of a label), without a leading or trailing dot.
fn parse_domain_suffix(s: &str) -> Result<String, String> {
    let ok_label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if s.len() <= 253 && s.split('.').all(ok_label) {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is not a DNS domain (lowercase labels of letters, digits and '-', separated by dots, like cluster.local)"))
    }
}

fn replace_if_changed<T: PartialEq>(held: &mut T, now: T) -> bool {
    if *held == now {
        return false;
    }
    *held = now;
    true
}

/// Reads the source whole, then serves; returns once the port is open.
pub async fn start(args: ControlArgs) -> anyhow::Result<Running> {
    let trust_domain = TrustDomain::new(&args.trust_domain).with_context(|| format!("--trust-domain {:?}", args.trust_domain))?;
    // Refuse a bad combination before anything is created (a generated root, a bound port).
    if matches!(args.source, SourceArg::Dir(_)) && args.node_tokens.is_none() {
        bail!("--source dir: needs --node-tokens (there is no API server to review tokens)");
    }
    let node_tokens = args.node_tokens.as_deref().map(NodeTokens::load).transpose()?;
    let ca_source = args.ca.source()?;

    // The waypoints' pods, as the index publishes them: the CA lets them
    // obtain their own identity.
    let (waypoint_pods, waypoint_pods_rx) = tokio::sync::watch::channel(BTreeSet::new());
    let mut gateway_client = None;
    let (mut batches, source_task, auth): (mpsc::Receiver<Batch>, Option<JoinHandle<()>>, Arc<dyn Authenticator>) = match &args.source {
        SourceArg::Dir(root) => {
            let Some(tokens) = &args.node_tokens else {
                bail!("--source dir: needs --node-tokens (there is no API server to review tokens)")
            };
            tracing::info!(dir = %root.display(), "objects from a directory");
            let workloads = args.workload_tokens.as_deref().map(|p| crate::auth::WorkloadTokens::new(p, &args.trust_domain));
            (
                dir_source(root.clone(), args.dir_interval),
                None,
                Arc::new(crate::auth::LocalTokens { nodes: NodeTokens::load(tokens)?, workloads }),
            )
        }
        SourceArg::Kubernetes => {
            let client = kube_source::client(args.kubeconfig.as_deref()).await?;
            let auth: Arc<dyn Authenticator> = match node_tokens {
                Some(t) => Arc::new(t),
                None => {
                    let policy = ReviewPolicy { trust_domain: args.trust_domain.clone(), ..args.ca.review_policy()? };
                    Arc::new(TokenReviewAuthenticator::new(client.clone(), policy).with_waypoints(waypoint_pods_rx))
                }
            };
            tracing::info!("objects from the Kubernetes API");
            let mirror = args.gateway_controller.then(|| Arc::new(Mirror::default()));
            if let Some(m) = &mirror {
                gateway_client = Some((client.clone(), m.clone()));
            }
            let (batches, task) = kube_batches(client, mirror, &args.root_namespace);
            (batches, Some(task), auth)
        }
    };

    // The CA after the source: a control plane that cannot find its
    // objects generates no root.
    let material = CaMaterial::load(&ca_source, &trust_domain, args.ca.max_cert_validity)?;
    let reload = AbortOnDrop(material.watch(Duration::from_secs(5)));
    // What a waypoint's pods run on Kubernetes (the root is added when
    // rendered: it follows rotations). The index admits as a waypoint's pod
    // only one that runs this, whether or not this replica runs the
    // controller that deploys it.
    let waypoint_template = matches!(args.source, SourceArg::Kubernetes).then(|| -> anyhow::Result<DeploySettings> {
        Ok(DeploySettings {
            image: args.waypoint_image.clone(),
            control_plane: args.waypoint_control_plane.clone(),
            control_plane_san: args.server_names.first().cloned().unwrap_or_else(|| slipstream_api::DEFAULT_CONTROL_PLANE_SAN.into()),
            root_pem: String::new(),
            trust_domain: args.trust_domain.clone(),
            cluster_id: args.cluster_id.clone(),
            // The waypoints' projected tokens are for the audience the CA
            // reviews tokens for.
            audience: args.ca.review_policy()?.audiences.first().cloned().unwrap_or_else(|| "istio-ca".into()),
        })
    });
    let waypoint_template = waypoint_template.transpose()?;
    // (Both are set on Kubernetes only.)
    let gateway_task = gateway_client.zip(waypoint_template.clone()).map(|((client, mirror), template)| {
        let material = material.clone();
        let domain = args.domain_suffix.clone();
        let resync = args.gateway_resync;
        let image = template.image.clone();
        tracing::info!(image = %image, "gateway controller: deploying waypoints, writing Gateway and Service status");
        if image == DEFAULT_WAYPOINT_IMAGE {
            tracing::warn!(
                image = %image,
                "the waypoint image is the default name, which this repository does not publish: build an image with `slipstream` \
                 on its PATH and give it with --waypoint-image, or waypoint pods will not start (their Gateways stay Programmed=False)"
            );
        }
        AbortOnDrop(tokio::spawn(crate::gateway::controller::run(client, mirror, move || ControllerSettings {
            deploy: DeploySettings { root_pem: material.roots().to_pem(), ..template.clone() },
            domain: domain.clone(),
            resync,
        })))
    });

    // Both services authenticate through one gate: bounded, and a token
    // refused a moment ago is refused again without asking.
    let auth: Arc<dyn Authenticator> = Arc::new(Gate::new(auth, GateSettings::default()));

    let mut index = Index::new(IndexSettings {
        cluster_id: args.cluster_id.clone(),
        trust_domain: args.trust_domain.clone(),
        domain_suffix: args.domain_suffix.clone(),
        root_namespace: args.root_namespace.clone(),
        waypoint_template,
    });
    let store = Store::new(Resources::new());
    let progress = Arc::new(Mutex::new(Progress::default()));
    // As istiod: the pod's name from the downward API, else the host name.
    let replica = std::env::var("POD_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_string()))
        .unwrap_or_default();
    let mon = Arc::new(Monitor { progress: progress.clone(), store: store.clone(), xds: Mutex::new(None), replica });
    let monitor_listener =
        tokio::net::TcpListener::bind(args.monitor).await.with_context(|| format!("binding the monitor port {}", args.monitor))?;
    let monitor_addr = monitor_listener.local_addr()?;
    let monitor_task = AbortOnDrop(tokio::spawn(monitor::serve(monitor_listener, mon.clone())));

    // Read the source whole before serving.
    let started = Instant::now();
    loop {
        let Some(b) = batches.recv().await else { bail!("the object source ended") };
        let (changes, invalid) = apply_batch(&mut index, b.events, "initial");
        waypoint_pods.send_if_modified(|held| replace_if_changed(held, index.waypoint_pods()));
        let generation = store.publish(index.resources().clone(), changes);
        let mut p = lock(&progress);
        p.invalid += invalid;
        p.objects_generation = b.objects_generation;
        p.generation = generation;
        if b.synced {
            p.synced = Some(Instant::now());
            break;
        }
    }
    let published = store.current();
    tracing::info!(
        addresses = published.count(slipstream_api::TypeUrl::Address),
        authorizations = published.count(slipstream_api::TypeUrl::Authorization),
        took = ?started.elapsed(),
        "objects read"
    );

    // The key sets of the RequestAuthentications in force, before serving
    // (at most a few seconds: a slow issuer is retried in the background),
    // so a restarted control plane does not serve routes whose rules
    // refuse every token for want of keys it could have had.
    let jwks_settings =
        crate::jwks::FetchSettings { refresh: args.jwks_refresh, allow_loopback: args.jwks_fetch_loopback, ..Default::default() };
    let wanted = index.jwks_fetches();
    let mut held = BTreeMap::new();
    for (f, jwks) in crate::jwks::fetch_all(&wanted, &jwks_settings, Duration::from_secs(5)).await {
        if let Some(j) = jwks {
            held.insert(f.clone(), j.clone());
            let changes = index.set_jwks(&f, Some(j));
            lock(&progress).generation = store.publish(index.resources().clone(), changes);
        }
    }
    let (jwks_wanted, jwks_wanted_rx) = tokio::sync::watch::channel(wanted);
    let (jwks_tx, mut jwks_rx) = mpsc::channel(16);
    let jwks_task = AbortOnDrop(tokio::spawn(crate::jwks::run(jwks_wanted_rx, jwks_tx, jwks_settings, held)));

    let xds_settings = XdsSettings { large_responses_in_flight: args.full_pushes_in_flight, ..Default::default() };
    let xds = XdsServer::with_settings(store.clone(), auth.clone(), xds_settings);
    *lock(&mon.xds) = Some(xds.clone());
    let placement = Arc::new(ResourcePlacement::new(StoreResources(store.clone())));
    let ca_config = args.ca.config(trust_domain.clone());
    let ca = CaService::new(ca_config, auth, placement, material.clone());
    let settings = ServeSettings {
        addr: args.listen,
        names: args.server_names.clone(),
        max_connections_per_peer: args.max_connections_per_peer,
        ..Default::default()
    };
    let server = ControlServer::bind(settings, material.clone()).await?;
    let addr = server.local_addr();
    tracing::info!(%addr, "serving delta xDS and the certificate service");
    let routes = serve::routes(&xds).add_service(ca.into_server());
    let (stop_server, server_stop) = tokio::sync::oneshot::channel::<()>();
    let mut serving = tokio::spawn(server.serve(routes, async move {
        let _ = server_stop.await;
    }));
    lock(&progress).serving = true;

    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let result = loop {
            tokio::select! {
                b = batches.recv() => {
                    let Some(b) = b else { break Err(anyhow::anyhow!("the object source ended")) };
                    let (changes, invalid) = apply_batch(&mut index, b.events, "update");
                    waypoint_pods.send_if_modified(|held| replace_if_changed(held, index.waypoint_pods()));
                    let n = changes.upserted.len() + changes.removed.len();
                    let generation = store.publish(index.resources().clone(), changes);
                    if n > 0 {
                        tracing::debug!(generation, resources = n, "published");
                    }
                    let mut p = lock(&progress);
                    p.invalid += invalid;
                    p.objects_generation = b.objects_generation;
                    p.generation = generation;
                    drop(p);
                    jwks_wanted.send_if_modified(|held| replace_if_changed(held, index.jwks_fetches()));
                }
                Some((f, jwks)) = jwks_rx.recv() => {
                    let changes = index.set_jwks(&f, jwks);
                    let generation = store.publish(index.resources().clone(), changes);
                    lock(&progress).generation = generation;
                }
                _ = &mut stopped => break Ok(()),
                // The port stopped serving on its own: nothing reaches
                // the proxies any more, so the control plane ends (and
                // its supervisor starts it again) rather than lingering.
                r = &mut serving => {
                    let why = match r {
                        Ok(Ok(())) => anyhow::anyhow!("the control plane port stopped serving"),
                        Ok(Err(e)) => e,
                        Err(e) => anyhow::anyhow!("the control plane port's task failed: {e}"),
                    };
                    serving = tokio::spawn(async { Ok(()) });
                    break Err(why);
                }
            }
        };
        // The source stops (a kubernetes source's watchers end with it).
        drop(batches);
        if let Some(t) = source_task {
            let _ = t.await;
        }
        xds.close_streams();
        let _ = stop_server.send(());
        let _ = serving.await;
        drop((monitor_task, reload, gateway_task, jwks_task));
        result
    });
    Ok(Running { addr, monitor: monitor_addr, stop: Some(stop), task })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resync_has_a_floor() {
        assert_eq!(parse_resync("60s"), Ok(Duration::from_secs(60)));
        assert!(parse_resync("0s").unwrap_err().contains("at least 5s"));
    }

    #[test]
    fn domain_suffixes() {
        for ok in ["cluster.local", "corp", "k8s-1.example.com"] {
            assert_eq!(parse_domain_suffix(ok).as_deref(), Ok(ok));
        }
        for bad in ["", ".cluster.local", "cluster.local.", "Cluster.local", "a..b", "-a.b", "a-.b", "a_b.c"] {
            assert!(parse_domain_suffix(bad).is_err(), "{bad:?}");
        }
    }

    fn list(r: &mut InitialRead, custom: bool) {
        for k in kube_source::KINDS.iter().filter(|k| k.custom == custom) {
            r.listed(k.kind);
        }
    }

    #[test]
    fn absent_custom_kinds_are_not_waited_for_and_builtin_kinds_always_are() {
        let early = Duration::from_secs(1);
        let late = CUSTOM_KINDS_WAIT;

        // Built-in kinds listed, the custom ones reported absent: at once.
        let mut r = InitialRead::default();
        list(&mut r, false);
        assert!(!r.complete(early), "custom kinds neither listed nor absent yet");
        list(&mut r, true);
        assert!(r.complete(early));

        // Custom kinds that keep failing: served without them after the wait.
        let mut r = InitialRead::default();
        list(&mut r, false);
        assert!(!r.complete(early));
        assert!(r.complete(late));

        // Built-in kinds that keep failing: never served without them.
        let mut r = InitialRead::default();
        list(&mut r, true);
        assert!(!r.complete(late));
        assert!(!r.complete(late * 10));
        list(&mut r, false);
        assert!(r.complete(late * 10));
    }

    /// The watchers hold the client (and its connections); they end once
    /// the control plane drops its receiver of batches.
    #[tokio::test]
    async fn dropping_the_batches_ends_the_watchers() {
        let alive = Arc::new(());
        let held = alive.clone();
        // An API server that never answers: every watcher waits on it.
        let api = tower::service_fn(move |_: http::Request<kube::client::Body>| {
            let request = held.clone();
            async move {
                let _request = request;
                std::future::pending::<()>().await;
                Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Empty::<bytes::Bytes>::new()))
            }
        });
        let (batches, task) = kube_batches(kube::Client::new(api, "default"), None, "istio-system");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Arc::strong_count(&alive) < 2 + kube_source::KINDS.len() {
            assert!(Instant::now() < deadline, "the watchers did not ask the API server");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(batches);
        tokio::time::timeout(Duration::from_secs(10), task).await.expect("the source ends").unwrap();
        while Arc::strong_count(&alive) > 1 {
            assert!(Instant::now() < deadline, "{} requests or clients left", Arc::strong_count(&alive) - 1);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
