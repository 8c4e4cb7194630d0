//! `slipstream control`: one process wiring the parts together. Objects
//! come from the source, go through the index into the store; the :15012
//! port serves delta xDS and the certificate service from it; the monitor
//! port says how it goes.
//!
//! The port opens only once the source has been read whole: a proxy that
//! connected earlier would be told that everything it holds was removed
//! (its initial versions compared with an empty set), which is exactly
//! what a control plane restart must never do.
//!
//! `start` builds the parts in that order: the source (`sources`: a
//! directory or the Kubernetes API, with its authenticator), the
//! controllers beside the index (`controllers`: the gateway controller,
//! the key set fetcher), the monitor port (`progress`), then, once the
//! source has been read whole, the :15012 port (`servers`); its task
//! (`Serving`) then applies every batch until stopped.

mod controllers;
mod progress;
mod replicas;
mod servers;
mod sources;

use crate::auth::{Authenticator, Gate, GateSettings, NodeTokens};
use crate::ca::CaArgs;
use crate::index::{Index, IndexSettings};
use crate::leader::Leadership;
use crate::resources::{Changes, Resources};
use crate::serve::ServeSettings;
use crate::source::ObjectEvent;
use crate::store::Store;
use crate::translate::request_authentication::Fetch;
use crate::xds::XdsSettings;
use anyhow::{bail, Context};
use progress::{lock, Progress};
use servers::{build_servers, Servers};
use slipstream_core::TrustDomain;
use sources::{build_sources, Batch, Sources};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// The waypoints' pods as the index publishes them, `(namespace, pod,
/// service account)`, for the CA.
type WaypointPods = tokio::sync::watch::Receiver<BTreeSet<(String, String, String)>>;

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
    /// Kubernetes: the leader election of the replica that runs the
    /// gateway controller (boxed: it keeps `slipstream`'s command enum
    /// small).
    #[command(flatten)]
    pub leader: Box<crate::leader::LeaderArgs>,
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

/// A task that ends when this is dropped: what `start` spawns ends with the
/// control plane, or with `start` itself when it fails half-way.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
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
    replicas::check(&args)?;
    let node_tokens = args.node_tokens.as_deref().map(NodeTokens::load).transpose()?;

    // The waypoints' pods, as the index publishes them: the CA lets them
    // obtain their own identity.
    let (waypoint_pods, waypoint_pods_rx) = tokio::sync::watch::channel(BTreeSet::new());
    let Sources { mut batches, task: source_task, auth, gateway_client, client } =
        build_sources(&args, node_tokens, waypoint_pods_rx).await?;

    // The CA after the source: a control plane that cannot find its
    // objects generates no root.
    let material = replicas::load_ca(&args, client.as_ref(), &trust_domain).await?;
    let reload = AbortOnDrop(material.watch(Duration::from_secs(5)));
    let roots_task = replicas::publish_roots(&args, client.as_ref(), &material).await?;
    let waypoint_template = controllers::waypoint_template(&args)?;
    // (Set on Kubernetes only.)
    let leader = replicas::leadership(&args, client.as_ref(), gateway_client.is_some() && waypoint_template.is_some());
    let leading = leader.as_ref().map(Leadership::watch);
    let gateway_task = controllers::build_gateway_controller(&args, &material, gateway_client, waypoint_template.as_ref(), leading);

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
    let (mon, monitor_addr, monitor_task) = progress::build_monitor(args.monitor, &store, &progress).await?;

    let mut published = Published { index: &mut index, store: &store, progress: &progress, waypoint_pods: &waypoint_pods };
    published.read_whole(&mut batches).await?;
    let jwks = controllers::build_jwks(&args, &mut index, &store, &progress).await;
    let servers = build_servers(&args, trust_domain, &store, auth, &material, &mon).await?;
    lock(&progress).serving = true;

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let addr = servers.addr;
    let serving = Serving {
        index,
        store,
        progress,
        waypoint_pods,
        batches,
        source_task,
        jwks_wanted: jwks.wanted,
        jwks_rx: jwks.results,
        servers,
        others: vec![Some(monitor_task), Some(reload), gateway_task, Some(jwks.task), roots_task],
        leader,
    };
    let task = tokio::spawn(serving.run(stopped));
    Ok(Running { addr, monitor: monitor_addr, stop: Some(stop), task })
}

/// Where each batch of events goes: the index, then the store that
/// publishes its resources, the progress the monitor shows and the
/// waypoints' pods the CA reads.
struct Published<'a> {
    index: &'a mut Index,
    store: &'a Store,
    progress: &'a Mutex<Progress>,
    waypoint_pods: &'a tokio::sync::watch::Sender<BTreeSet<(String, String, String)>>,
}

impl Published<'_> {
    /// Applies a batch and publishes what it changed.
    fn apply(&mut self, b: Batch, origin: &str) -> (u64, usize) {
        let (changes, invalid) = apply_batch(self.index, b.events, origin);
        self.waypoint_pods.send_if_modified(|held| replace_if_changed(held, self.index.waypoint_pods()));
        let n = changes.upserted.len() + changes.removed.len();
        let generation = self.store.publish(self.index.resources().clone(), changes);
        let mut p = lock(self.progress);
        p.invalid += invalid;
        p.objects_generation = b.objects_generation;
        p.generation = generation;
        (generation, n)
    }

    /// Reads the source whole before serving.
    async fn read_whole(&mut self, batches: &mut mpsc::Receiver<Batch>) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            let Some(b) = batches.recv().await else { bail!("the object source ended") };
            let synced = b.synced;
            self.apply(b, "initial");
            if synced {
                lock(self.progress).synced = Some(Instant::now());
                break;
            }
        }
        let published = self.store.current();
        tracing::info!(
            addresses = published.count(slipstream_api::TypeUrl::Address),
            authorizations = published.count(slipstream_api::TypeUrl::Authorization),
            took = ?started.elapsed(),
            "objects read"
        );
        Ok(())
    }
}

/// The control plane once it serves: the loop of `start`'s task.
struct Serving {
    index: Index,
    store: Store,
    progress: Arc<Mutex<Progress>>,
    waypoint_pods: tokio::sync::watch::Sender<BTreeSet<(String, String, String)>>,
    batches: mpsc::Receiver<Batch>,
    source_task: Option<JoinHandle<()>>,
    jwks_wanted: tokio::sync::watch::Sender<BTreeMap<Fetch, Result<SocketAddr, String>>>,
    jwks_rx: mpsc::Receiver<(Fetch, Option<String>)>,
    servers: Servers,
    /// The monitor, the CA's reload, the gateway controller, the key set
    /// fetcher and the roots' publisher: they end with the loop, after the
    /// port.
    others: Vec<Option<AbortOnDrop>>,
    /// The leader election: the Lease is given up once the gateway
    /// controller has stopped (with `others`).
    leader: Option<Leadership>,
}

impl Serving {
    /// Applies batches and fetched key sets until stopped, the source
    /// ends or the port stops serving; then stops the rest.
    async fn run(mut self, mut stopped: tokio::sync::oneshot::Receiver<()>) -> anyhow::Result<()> {
        let result = loop {
            tokio::select! {
                b = self.batches.recv() => {
                    let Some(b) = b else { break Err(anyhow::anyhow!("the object source ended")) };
                    let mut published =
                        Published { index: &mut self.index, store: &self.store, progress: &self.progress, waypoint_pods: &self.waypoint_pods };
                    let (generation, n) = published.apply(b, "update");
                    if n > 0 {
                        tracing::debug!(generation, resources = n, "published");
                    }
                    self.jwks_wanted.send_if_modified(|held| replace_if_changed(held, self.index.jwks_fetches()));
                }
                Some((f, jwks)) = self.jwks_rx.recv() => {
                    let changes = self.index.set_jwks(&f, jwks);
                    let generation = self.store.publish(self.index.resources().clone(), changes);
                    lock(&self.progress).generation = generation;
                }
                _ = &mut stopped => break Ok(()),
                // The port stopped serving on its own: nothing reaches
                // the proxies any more, so the control plane ends (and
                // its supervisor starts it again) rather than lingering.
                r = &mut self.servers.serving => {
                    let why = match r {
                        Ok(Ok(())) => anyhow::anyhow!("the control plane port stopped serving"),
                        Ok(Err(e)) => e,
                        Err(e) => anyhow::anyhow!("the control plane port's task failed: {e}"),
                    };
                    self.servers.serving = tokio::spawn(async { Ok(()) });
                    break Err(why);
                }
            }
        };
        // The source stops (a kubernetes source's watchers end with it).
        drop(self.batches);
        if let Some(t) = self.source_task {
            let _ = t.await;
        }
        self.servers.xds.close_streams();
        let _ = self.servers.stop.send(());
        let _ = self.servers.serving.await;
        drop(self.others);
        if let Some(l) = self.leader {
            l.release().await;
        }
        result
    }
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
}
