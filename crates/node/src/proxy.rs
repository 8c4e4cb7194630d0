//! Wiring: the node proxy as one value ([`NodeProxy`]) that tests build
//! in-process with their own sockets, CA and log sink, and [`run`], the
//! process's main loop: the mesh from the control plane's delta xDS stream
//! (`--control-plane`) or from the configuration files, the node's pods
//! from `pods.json` (the CNI role) either way.

use crate::admin;
use crate::config::Config;
use crate::inpod::InPod;
use crate::sockets::{NetnsFactory, SocketFactory};
use crate::source::FileSource;
use crate::state::{LocalPods, Shared};
use crate::telemetry::{Sink, Telemetry};
use anyhow::Context;
use arc_swap::ArcSwap;
use slipstream_api::TypeUrl;
use slipstream_core::sync::LockExt;
use slipstream_core::TrustDomain;
use slipstream_core::{ApplyReport, Change, MeshConfig, MeshIndex, NodePods, Workload};
use slipstream_hbone::Pool;
use slipstream_identity::tls::ServerTls;
use slipstream_identity::{CertManager, SharedTrust};
use slipstream_proxy::authz;
use slipstream_proxy::certs::{NodeCa, TrustedCerts};
use slipstream_proxy::control::ControlChannel;
use slipstream_proxy::xds;
use std::net::SocketAddr;
use std::sync::Arc;

/// What a test replaces: how sockets are made, the CA, where access-log
/// lines go.
pub struct Deps {
    pub sockets: Arc<dyn SocketFactory>,
    /// A local CA (`Arc<Ca>` converts) or the control plane's.
    pub ca: NodeCa,
    pub sink: Sink,
    /// Writes `<config_dir>/<node>/served.json` for the local cluster.
    pub report_served: bool,
}

pub struct NodeProxy {
    shared: Arc<Shared>,
    index: MeshIndex,
    pods: NodePods,
    inpod: InPod,
    admin: Option<admin::Listeners>,
    addrs: (SocketAddr, SocketAddr, SocketAddr),
    trust: SharedTrust,
    /// The node's kernel path for the pods outside the mesh (None: not
    /// this proxy's job, `--netpol-kernel` off).
    netpol: Option<crate::netpol::Kernel>,
    /// The eBPF datapath's maps (None: nftables capture).
    datapath: Option<Arc<slipstream_ebpf::NodeMaps>>,
    /// This node's numbering of identities for the kernel's policy maps.
    identities: Option<slipstream_ebpf::kernel_policy::Identities>,
    /// The rule texts of what was last written to the policy map (the
    /// kernel's drops name them, `kernel_drops`).
    kernel_rules: crate::kernel_drops::Rules,
    /// This node's pods given their registration's address (the control
    /// plane published them without one), and that address.
    filled: std::collections::HashMap<String, std::net::IpAddr>,
}

impl NodeProxy {
    /// Binds the admin listeners (a port conflict fails here, before
    /// anything serves) and builds the shared state.
    pub async fn new(config: Config, deps: Deps) -> anyhow::Result<NodeProxy> {
        let admin = admin::bind(&config).await?;
        let addrs = admin.addrs();
        let trust_domain = TrustDomain::new(&config.trust_domain)?;
        // One trust for the node, followed by the server and the pool at
        // each handshake (root rotation: see `certs`).
        let (provider, trust) = deps.ca.provider(config.certs.validity);
        let server_tls = ServerTls::following(&trust, trust_domain).context("building the TLS server configuration")?;
        let certs = CertManager::new(provider, config.cert_manager_config());
        let pods = LocalPods::default();
        let pool_certs = Arc::new(TrustedCerts::new(certs.clone(), trust.clone()));
        let pool = Pool::new(config.pool_config(), pool_certs, Arc::new(pods.connector(config.pool.connect_timeout)));
        let shared = Arc::new(Shared {
            telemetry: Arc::new(Telemetry::with_sink(config.json_access_log, config.limits.refusal_log_burst, deps.sink)),
            limits: slipstream_proxy::limits::NodeLimits::new(&config.limits),
            hold_offs: Default::default(),
            mesh: ArcSwap::from_pointee(Default::default()),
            config,
            certs,
            server_tls,
            pool,
            pods,
            sockets: deps.sockets,
            readiness: Default::default(),
        });
        let _ = shared.telemetry.metrics.buffers.set(shared.limits.buffers.clone());
        let inpod = InPod::new(shared.clone(), deps.report_served);
        let netpol = shared.config.netpol_kernel.then(crate::netpol::Kernel::default);
        Ok(NodeProxy {
            shared,
            index: MeshIndex::default(),
            pods: NodePods::default(),
            inpod,
            admin: Some(admin),
            addrs,
            trust,
            netpol,
            datapath: None,
            identities: None,
            kernel_rules: Default::default(),
            filled: Default::default(),
        })
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The roots this node trusts now.
    pub fn trust(&self) -> &SharedTrust {
        &self.trust
    }

    /// The admin, stats and readiness addresses actually bound.
    pub fn admin_addrs(&self) -> (SocketAddr, SocketAddr, SocketAddr) {
        self.addrs
    }

    /// Starts serving the admin ports and the background chores.
    pub fn serve(&mut self) {
        if let Some(l) = self.admin.take() {
            admin::serve(l, self.shared.clone());
        }
        tokio::spawn(trim_memory(self.shared.clone()));
        tokio::spawn(summarise_refusals(self.shared.telemetry.clone()));
    }

    /// A new mesh configuration (state of the world): applied as upserts and
    /// removals; a new snapshot is published if anything changed, and open
    /// connections the new policies deny are closed.
    pub fn apply_mesh(&mut self, cfg: &MeshConfig) -> ApplyReport {
        let mut report = self.index.apply_config(cfg);
        report.updated += self.fill_local_addresses().iter().filter(|c| matches!(c, Change::Added | Change::Updated)).count();
        for e in &report.errors {
            tracing::error!("configuration refused, the previous version is kept: {e}");
        }
        let first = !self.shared.readiness.locked().config_loaded;
        if report.changed() || first {
            let (w, s, p) = self.index.snapshot().counts();
            let msg = "mesh configuration applied";
            if report.added + report.removed > 0 || first {
                tracing::info!(
                    workloads = w,
                    services = s,
                    policies = p,
                    added = report.added,
                    updated = report.updated,
                    removed = report.removed,
                    "{msg}"
                );
            } else {
                tracing::debug!(updated = report.updated, "{msg}");
            }
            self.shared.mesh.store(self.index.snapshot());
            self.shared.readiness.locked().config_loaded = true;
            self.revoke();
            self.apply_kernel_netpol();
        }
        report
    }

    /// One delta from the control plane: removals, then upserts, each
    /// resource validated by the index (a refused one keeps its previous
    /// version and is in the report's errors). Until the first response of
    /// every type has arrived nothing is published, so the data path never
    /// decides over workloads without their policies; after that, one
    /// snapshot per delta that changed something, and open connections the
    /// new state denies are closed.
    pub fn apply_delta(&mut self, d: &xds::Delta) -> ApplyReport {
        let mut report = ApplyReport::default();
        let mut count = |c: Change| match c {
            Change::Added => report.added += 1,
            Change::Updated => report.updated += 1,
            Change::Removed => report.removed += 1,
            Change::Unchanged | Change::Absent => report.unchanged += 1,
        };
        for name in &d.removals {
            count(match d.type_url {
                // An Address name is a workload uid or a service key.
                TypeUrl::Address => match self.index.remove_workload(name) {
                    Change::Absent => self.index.remove_service(name),
                    c => c,
                },
                TypeUrl::Authorization => self.index.remove_policy(name),
                TypeUrl::NetworkPolicy => self.index.remove_net_policy(name),
                // Never subscribed to by a node proxy.
                TypeUrl::Route | TypeUrl::Mesh => Change::Absent,
            });
        }
        let mut errors = Vec::new();
        for u in &d.upserts {
            let r = match u.clone() {
                xds::Upsert::Workload(w) => {
                    // The control plane's own address replaces the one given.
                    if !w.addresses.is_empty() {
                        self.filled.remove(&w.uid);
                    }
                    self.index.upsert_workload(w)
                }
                xds::Upsert::Service(s) => self.index.upsert_service(s),
                xds::Upsert::Policy(p) => self.index.upsert_policy(p),
                xds::Upsert::NetPolicy(p) => self.index.upsert_net_policy(p),
                xds::Upsert::Routes(_) | xds::Upsert::Mesh(_) => Ok(Change::Unchanged),
            };
            match r {
                Ok(c) => count(c),
                Err(e) => errors.push(e),
            }
        }
        for c in self.fill_local_addresses() {
            count(c);
        }
        // The xDS client logs the refusals with its NACK.
        report.errors = errors;
        let loaded = self.shared.readiness.locked().config_loaded;
        if !loaded && !d.complete {
            return report;
        }
        if report.changed() || d.complete {
            let (w, s, p) = self.index.snapshot().counts();
            let msg = if d.complete { "mesh configuration received from the control plane" } else { "mesh configuration changed" };
            if report.added + report.removed > 0 || d.complete {
                tracing::info!(
                    r#type = %d.type_url,
                    workloads = w,
                    services = s,
                    policies = p,
                    added = report.added,
                    updated = report.updated,
                    removed = report.removed,
                    "{msg}"
                );
            } else {
                tracing::debug!(r#type = %d.type_url, updated = report.updated, "{msg}");
            }
            self.shared.mesh.store(self.index.snapshot());
            self.shared.readiness.locked().config_loaded = true;
            self.revoke();
            self.apply_kernel_netpol();
        }
        report
    }

    /// Applies one update from the xDS client, tells it what was refused
    /// (it NACKs those), and opens or drains pods' listeners if the mesh
    /// changed what this node serves.
    pub async fn apply_update(&mut self, u: xds::Update) {
        let report = self.apply_delta(&u.delta);
        let complete = u.delta.complete;
        let refused =
            report.errors.iter().map(|e| xds::Refusal { name: e.name.clone(), reason: format!("{}: {}", e.field, e.message) }).collect();
        u.done(refused);
        if report.changed() || complete {
            self.reconcile().await;
        }
    }

    /// The network policies of this node's pods outside the mesh, into the
    /// node's kernel path.
    /// On the eBPF datapath the policy map goes first, so that no pod the
    /// nftables table leaves to the programs is left to neither.
    fn apply_kernel_netpol(&mut self) {
        let left = self.apply_kernel_policy();
        if let Some(k) = &mut self.netpol {
            // A policy map not brought up to date leaves every pod to
            // nftables too (both enforce; neither is skipped), and so does
            // a pod with a pair the map cannot decide exactly.
            let on_datapath = match (&self.datapath, left) {
                (Some(m), Some(left)) => m.pods_on_datapath().into_iter().filter(|a| !left.contains(a)).collect(),
                _ => Default::default(),
            };
            k.apply(crate::netpol::plan(&self.index.snapshot(), &self.shared.config.node, &on_datapath));
        }
    }

    /// Uses the eBPF datapath's maps: its policy map is kept equal to what
    /// the engine compiles for this node's pods, and its drop counters are
    /// exported.
    pub fn use_datapath(&mut self, maps: Arc<slipstream_ebpf::NodeMaps>) {
        let _ = self.shared.telemetry.metrics.datapath.set(maps.clone());
        self.datapath = Some(maps);
        self.apply_kernel_netpol();
    }

    /// The kernel's share of policy: what the engine decides for this
    /// node's pods as sources, written to the policy map (docs/datapath.md).
    /// Returns the pods the map could not decide exactly (for the nftables
    /// table), or None when it was not written.
    fn apply_kernel_policy(&mut self) -> Option<std::collections::BTreeSet<std::net::Ipv4Addr>> {
        let Some(maps) = &self.datapath else { return None };
        let snap = self.index.snapshot();
        let node = &self.shared.config.node;
        let ids = self.identities.get_or_insert_with(|| maps.prior_identities());
        let compiled = slipstream_ebpf::kernel_policy::compile(&snap, node, maps.node_index(), ids);
        match maps.sync_policy(&compiled) {
            Ok(s) if s.written + s.removed + s.addresses > 0 => tracing::info!(
                entries = s.total,
                written = s.written,
                removed = s.removed,
                addresses = s.addresses,
                identities = compiled.classes,
                left_to_the_proxy = compiled.skipped_pairs,
                "kernel policy map updated"
            ),
            Ok(_) => {}
            Err(e) => {
                tracing::error!("kernel policy map not updated (the node proxy and nftables still decide every connection): {e}");
                return None;
            }
        }
        *self.kernel_rules.locked() = Arc::new(compiled.rules);
        Some(compiled.left_to_nftables)
    }

    /// Policy changes apply to open connections too.
    fn revoke(&self) {
        let snap = self.shared.snapshot();
        let mut closed = 0;
        for pod in self.shared.pods.all() {
            closed += pod.conns.revoke(|k| authz::recheck(&snap, &pod.uid, k).map_err(|d| d.text.clone()));
        }
        if closed > 0 {
            tracing::info!(closed, "open connections closed after a policy change");
        }
    }

    /// This node's pods (what the CNI plugin reports in Kubernetes).
    pub fn apply_pods(&mut self, pods: NodePods) {
        self.pods = pods;
        let filled = self.fill_local_addresses();
        if filled.iter().any(|c| matches!(c, Change::Added | Change::Updated | Change::Removed))
            && self.shared.readiness.locked().config_loaded
        {
            self.shared.mesh.store(self.index.snapshot());
            self.apply_kernel_netpol();
        }
    }

    /// This node's own pods that the control plane published before the
    /// API knew their address (it publishes a pod once scheduled) get the
    /// address the CNI reported in their registration: the pod is named,
    /// its certificate asked for and its first connection carried without
    /// waiting for the kubelet to report the address. Pods of other nodes
    /// stay off the data path until the control plane has their address.
    fn fill_local_addresses(&mut self) -> Vec<Change> {
        let node = &self.shared.config.node;
        let mut changes = Vec::new();
        let registered: std::collections::HashMap<&str, std::net::IpAddr> =
            self.pods.pods.iter().filter_map(|r| r.ip.map(|ip| (r.uid.as_str(), ip))).collect();
        // An address given earlier that its registration no longer carries
        // (the pod went, or has another sandbox) is taken back while the
        // control plane has none: no address names the wrong pod.
        let mut stale = Vec::new();
        for (uid, ip) in &self.filled {
            if registered.get(uid.as_str()) == Some(ip) {
                continue;
            }
            stale.push(uid.clone());
            let snap = self.index.snapshot();
            let Some(w) = snap.workload(uid).filter(|w| w.addresses == [*ip]) else { continue };
            if let Ok(c) = self.index.upsert_workload(Workload { addresses: vec![], ..w.workload().clone() }) {
                tracing::debug!(%uid, %ip, "the pod's registration no longer carries the address it was given: taken back");
                changes.push(c);
            }
        }
        for uid in stale {
            self.filled.remove(&uid);
        }
        for (uid, ip) in registered {
            let Some(w) = self.index.unaddressed(uid) else { continue };
            if w.node != *node {
                continue;
            }
            match self.index.fill_address(uid, ip) {
                Ok(c) => {
                    tracing::debug!(%uid, %ip, "pod named by the address its CNI reported (the API has none yet)");
                    self.filled.insert(uid.to_string(), ip);
                    changes.push(c);
                }
                Err(e) => tracing::warn!(%uid, "the pod's workload is refused: {e}"),
            }
        }
        changes
    }

    /// Opens listeners for new pods, drains removed ones.
    pub async fn reconcile(&mut self) {
        let snap = self.shared.snapshot();
        self.inpod.reconcile(&self.pods, &snap).await;
    }

    pub fn has_failures(&self) -> bool {
        self.inpod.has_failures()
    }

    /// Stops accepting, lets connections finish within the grace period,
    /// closes the rest, and returns.
    pub async fn drain(mut self) {
        self.inpod.drain_all().await;
    }
}

/// Opens the datapath's pinned maps, waiting up to `e.wait` for them (the
/// node agent beside this proxy may pin them a moment after it starts).
async fn open_maps(e: &crate::config::EbpfSettings) -> Result<slipstream_ebpf::NodeMaps, slipstream_ebpf::node::Error> {
    let deadline = tokio::time::Instant::now() + e.wait;
    let mut said = false;
    loop {
        match slipstream_ebpf::NodeMaps::open(&e.bpf_dir, e.node_index) {
            Ok(m) => return Ok(m),
            Err(err) if tokio::time::Instant::now() >= deadline => return Err(err),
            Err(err) => {
                if !said {
                    tracing::info!(dir = %e.bpf_dir.display(), "waiting for the datapath's maps (the node agent pins them): {err}");
                    said = true;
                }
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
    }
}

/// The `slipstream node` process, until SIGTERM or Ctrl-C, then a drain.
/// The mesh comes from the control plane when one is configured (delta
/// xDS), else from `workloads.json`; the node's pods come from
/// `pods.json` either way (the CNI role).
pub async fn run(config: Config) -> anyhow::Result<()> {
    // With a control plane, certificates and the mesh come from it over
    // one channel, and the signing key is never read here; without, the
    // local CA in --ca-dir signs and the files describe the mesh.
    let control = config.control.clone().map(ControlChannel::new).transpose().context("the control plane channel")?;
    let ca = config.node_ca(control.as_ref())?;
    let mut source = FileSource::new(config.workloads_file(), config.pods_file());
    let mut updates = match (&config.control, &control) {
        (Some(settings), Some(channel)) => {
            let channel = channel.clone();
            let (client, updates) = xds::XdsClient::new(channel, &config.node_info(), xds::Backoff::default());
            tokio::spawn(client.run());
            tracing::info!(addresses = ?settings.addresses, san = %settings.san, "mesh configuration from the control plane (delta xDS)");
            Some(updates)
        }
        _ => None,
    };
    let every = config.timeouts.poll_interval;
    let datapath = match &config.ebpf {
        Some(e) => {
            let maps = open_maps(e).await.with_context(|| {
                format!(
                    "--datapath ebpf: the datapath's maps under {} (does the CNI, `slipstream up` or the node agent, run it?)",
                    e.bpf_dir.display()
                )
            })?;
            tracing::info!(dir = %e.bpf_dir.display(), node_index = e.node_index, "eBPF datapath: capture by the connect4/sockops/tc programs the CNI attached, kernel policy map kept by this proxy");
            Some(Arc::new(maps))
        }
        None => None,
    };
    let deps = Deps { sockets: Arc::new(NetnsFactory { ebpf: datapath.clone() }), ca, sink: Sink::Stdout, report_served: true };
    let mut proxy = NodeProxy::new(config, deps).await?;
    if let Some(maps) = datapath {
        proxy.use_datapath(maps);
    }
    if let Some(e) = proxy.shared.config.ebpf.as_ref().filter(|e| e.log_drops) {
        let shared = proxy.shared.clone();
        crate::kernel_drops::start(&e.bpf_dir, shared.telemetry.clone(), move || shared.snapshot(), proxy.kernel_rules.clone())?;
        tracing::info!("the datapath's drops are written to the access log (--datapath-drops-log)");
    }
    proxy.serve();
    let l = &proxy.shared.config.limits;
    // Raised to the hard limit when the configuration was built.
    tracing::info!("open-file limit (RLIMIT_NOFILE): {}", l.open_files);
    tracing::info!(
        budget = l.connection_budget,
        per_pod = l.pod_connections,
        pod_pending = l.pod_pending,
        peer_connections = l.peer_connections,
        peer_handshakes = l.peer_handshakes,
        peer_streams = l.peer_streams,
        peer_plaintext = l.peer_plaintext,
        "connection limits (see /config_dump)"
    );
    tracing::info!(
        bytes = l.buffer_budget,
        cgroup_memory_limit = crate::sys::cgroup::memory_limit().map_or_else(|| "none".to_owned(), |m| m.to_string()),
        "buffer budget (docs/node-proxy.md, \"Memory: the buffer budget\")"
    );
    tracing::info!(node = %proxy.shared.config.node, "node proxy started");

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    // A new pod list is read as soon as it is written (a pod's CNI ADD
    // waits for this proxy's listeners); the poll stays as the fallback.
    let mut watch = watch_pods(&proxy.shared.config.pods_file());
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut retry_at = tokio::time::Instant::now();
    let mut failed = None;
    loop {
        let u = source.poll();
        let changed = u.pods.is_some() || (updates.is_none() && u.mesh.is_some());
        if let Some(cfg) = u.mesh.filter(|_| updates.is_none()) {
            proxy.apply_mesh(&cfg);
        }
        if let Some(pods) = u.pods {
            proxy.apply_pods(pods);
        }
        // Retry pods whose listeners failed once a second, even without a change.
        let retry = proxy.has_failures() && tokio::time::Instant::now() >= retry_at;
        if changed || retry {
            proxy.reconcile().await;
            retry_at = tokio::time::Instant::now() + std::time::Duration::from_secs(1);
        }
        tokio::select! {
            _ = tick.tick() => {}
            r = pods_changed(watch.as_ref()) => if let Err(e) = r {
                tracing::warn!("watching the pod list's directory: {e} (read every {every:?} instead)");
                watch = None;
            },
            u = next_update(&mut updates) => match u {
                Some(u) => proxy.apply_update(u).await,
                None => { failed = Some(anyhow::anyhow!("the control plane client stopped")); break }
            },
            _ = term.recv() => { tracing::info!("SIGTERM: stopping"); break }
            _ = tokio::signal::ctrl_c() => { tracing::info!("interrupted: stopping"); break }
        }
    }
    proxy.drain().await;
    failed.map_or(Ok(()), Err)
}

/// A watch of the directory of the pod list (made if missing: the agent
/// may write its first list after this proxy starts); None, and polling
/// only, where inotify is refused.
fn watch_pods(pods_file: &std::path::Path) -> Option<slipstream_proxy::sys::dirwatch::DirWatch> {
    let dir = pods_file.parent()?;
    let _ = std::fs::create_dir_all(dir);
    slipstream_proxy::sys::dirwatch::DirWatch::new(dir)
        .map_err(|e| tracing::warn!(dir = %dir.display(), "cannot watch the pod list's directory (read every poll instead): {e}"))
        .ok()
}

async fn pods_changed(watch: Option<&slipstream_proxy::sys::dirwatch::DirWatch>) -> std::io::Result<()> {
    match watch {
        Some(w) => w.changed().await,
        None => std::future::pending().await,
    }
}

/// The next update from the xDS client; never, without one.
async fn next_update(updates: &mut Option<tokio::sync::mpsc::Receiver<xds::Update>>) -> Option<xds::Update> {
    match updates {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Says, once a second, how many refusal lines each source had suppressed.
async fn summarise_refusals(telemetry: Arc<Telemetry>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tick.tick().await;
        telemetry.summarise_refusals();
    }
}

/// Returns the heap of closed connections to the kernel (see memtrim).
async fn trim_memory(shared: Arc<Shared>) {
    let mut trimmer = crate::memtrim::Trimmer::new(std::time::Instant::now());
    let mut tick = tokio::time::interval(crate::memtrim::CHECK_EVERY);
    loop {
        tick.tick().await;
        if trimmer.due(shared.telemetry.metrics.closed_total(), std::time::Instant::now()) {
            let released = slipstream_proxy::sys::mem::release_free_heap();
            tracing::debug!(released, "trimmed the heap after closed connections");
        }
    }
}
