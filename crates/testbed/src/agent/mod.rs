//! The agent: one background process per cluster that holds the applied
//! objects and makes the machine match them, level-triggered: every tick
//! compares what should run with what runs.

pub mod api_server;
pub mod datapath;
pub mod flows;
pub mod mesh;
pub mod node;
pub mod nodeproxy;
pub mod pods;
pub mod probe;
pub mod services;
pub mod store;

use crate::ipc::{self, Request, Response};
use crate::names::Paths;
use crate::plan;
use crate::status::{AgentStatus, ClusterStatus, ControlStatus, NodeStatus, ProxyStatus, STATUS_VERSION};
use crate::sys::{cgroup, net, signals};
use node::Node;
use pods::PodRuntime;
use slipstream_k8s::desired_pods;
use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::os::unix::net::UnixListener;
use std::time::{Duration, Instant};
use store::{ClusterFacts, Store};

const TICK: Duration = Duration::from_millis(100);
/// How long a pod may take to stop when deleted (Kubernetes' grace period,
/// capped so that `delete` and `down` stay quick).
const MAX_GRACE: Duration = Duration::from_secs(10);

pub struct AgentConfig {
    pub paths: Paths,
    pub nodes: usize,
    /// Bring-your-own mesh root (certificate and key PEM files); generated
    /// when absent.
    pub ca_cert: Option<std::path::PathBuf>,
    pub ca_key: Option<std::path::PathBuf>,
    /// Control plane replicas (1 to plan::MAX_CONTROL_REPLICAS).
    pub control_replicas: usize,
    /// eBPF or nftables capture (`auto`: eBPF when the kernel can).
    pub datapath: datapath::Mode,
}

pub struct Agent {
    paths: Paths,
    nodes: Vec<Node>,
    store: Store,
    pods: BTreeMap<(String, String), PodRuntime>,
    /// Pods being stopped (a replaced pod may reuse its name meanwhile).
    stopping: Vec<PodRuntime>,
    vips: services::Vips,
    last_rules: Option<String>,
    last_hosts: Option<Vec<plan::HostsEntry>>,
    last_state: String,
    shutdown: bool,
    proxies: Vec<nodeproxy::NodeProxy>,
    /// Control plane replicas, in order.
    controls: Vec<nodeproxy::NodeProxy>,
    /// Per node: the workload uids its proxy reports as served.
    served: BTreeMap<String, BTreeSet<String>>,
    last_mesh: BTreeMap<std::path::PathBuf, String>,
    /// The objects as last written for the control plane, and the counter
    /// written with them (`api_server::GENERATION_FILE`).
    last_objects: Option<String>,
    objects_generation: u64,
    /// The workload tokens file as last written.
    last_workload_tokens: Option<String>,
    /// Waypoint pod addresses the control plane namespaces route back to,
    /// with their node's address.
    control_routes: BTreeMap<std::net::Ipv4Addr, std::net::Ipv4Addr>,
    /// Pods that could not be placed, reported once each (not every tick).
    unplaceable: BTreeSet<(String, String)>,
    /// How pods reach their node proxy (docs/datapath.md).
    capture: datapath::Capture,
    /// The datapath's flow events, named (empty with nftables).
    flows: flows::FlowLog,
    /// When the log files' sizes are next looked at (`crate::logrotate`).
    next_log_check: std::time::Instant,
}

/// Runs the agent until SIGTERM or a Shutdown request; removes the cluster
/// on the way out.
pub fn run(cfg: AgentConfig) -> anyhow::Result<()> {
    signals::install_termination_flag();
    let paths = cfg.paths;
    std::fs::create_dir_all(&paths.state_dir)?;
    cgroup::create(&paths.agent_cgroup())?;
    std::fs::write(paths.agent_cgroup().join("cgroup.procs"), std::process::id().to_string())?;
    std::fs::write(paths.agent_pid_file(), std::process::id().to_string())?;

    let mut agent = Agent {
        nodes: Vec::new(),
        store: Store::new(),
        pods: BTreeMap::new(),
        stopping: Vec::new(),
        vips: BTreeMap::new(),
        last_rules: None,
        last_hosts: None,
        last_state: String::new(),
        shutdown: false,
        proxies: Vec::new(),
        controls: Vec::new(),
        served: BTreeMap::new(),
        last_mesh: BTreeMap::new(),
        last_objects: None,
        last_workload_tokens: None,
        control_routes: BTreeMap::new(),
        objects_generation: 0,
        unplaceable: BTreeSet::new(),
        capture: datapath::Capture::Nftables { fallback: None },
        flows: flows::FlowLog::default(),
        next_log_check: std::time::Instant::now(),
        paths,
    };
    match datapath::Capture::choose(cfg.datapath, &agent.paths) {
        Ok(c) => {
            if c.is_ebpf() {
                match flows::FlowLog::start(&agent.paths.bpf_dir) {
                    Ok(f) => agent.flows = f,
                    Err(e) => tracing::warn!("flow events will not be recorded (`slipstream observe` shows none): {e}"),
                }
            }
            agent.capture = c;
        }
        Err(e) => {
            tracing::error!("{e:#}");
            agent.teardown();
            return Err(e);
        }
    }
    if let Err(e) = ensure_ca(&agent.paths, cfg.ca_cert.as_deref(), cfg.ca_key.as_deref()) {
        tracing::error!("cannot set up the mesh CA: {e:#}");
        agent.teardown();
        return Err(e);
    }
    if let Err(e) = agent.create_network(cfg.nodes, cfg.control_replicas) {
        tracing::error!("cannot create the cluster network: {e:#}");
        agent.teardown();
        return Err(e);
    }
    let listener = bind_private(&agent.paths.socket())?;
    listener.set_nonblocking(true)?;
    agent.sync_services();
    agent.persist();
    tracing::info!(cluster = %agent.paths.cluster, nodes = cfg.nodes, "agent ready on {}", agent.paths.socket().display());

    while !agent.shutdown && !signals::terminate_requested() {
        loop {
            match listener.accept() {
                Ok((conn, _)) => agent.serve(conn),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    break;
                }
            }
        }
        agent.tick();
        std::thread::sleep(TICK);
    }
    tracing::info!("shutting down");
    drop(listener);
    let _ = std::fs::remove_file(agent.paths.socket());
    agent.teardown();
    Ok(())
}

impl Agent {
    fn create_network(&mut self, count: usize, control_replicas: usize) -> anyhow::Result<()> {
        anyhow::ensure!((1..=plan::MAX_NODES).contains(&count), "--nodes must be between 1 and {}", plan::MAX_NODES);
        anyhow::ensure!(
            (1..=plan::MAX_CONTROL_REPLICAS).contains(&control_replicas),
            "--control-replicas must be between 1 and {}",
            plan::MAX_CONTROL_REPLICAS
        );
        let fabric = self.paths.fabric_netns();
        net::create_fabric(&fabric)?;
        let names: Vec<String> = (1..=count).map(plan::node_name).collect();
        write_node_tokens(&self.paths, &names)?;
        // The control plane first: node proxies connect to it as they start.
        for r in 1..=control_replicas {
            let netns = self.paths.control_netns(r);
            net::create_node(&fabric, &netns, &format!("control{r}"), plan::control_ip(r))?;
            self.controls.push(nodeproxy::NodeProxy::new(nodeproxy::control_spec(&self.paths, r)));
        }
        for i in 1..=count {
            let name = plan::node_name(i);
            let netns = self.paths.node_netns(&name);
            net::create_node(&fabric, &netns, &name, plan::node_ip(i))?;
            net::apply_nft(&netns, &plan::nft_ruleset(&[]))?;
            let node = Node { name, index: i, netns, ip: plan::node_ip(i) };
            let ebpf = self.capture.is_ebpf();
            self.proxies.push(nodeproxy::NodeProxy::new(nodeproxy::node_proxy_spec(&self.paths, &node, control_replicas, ebpf)));
            self.nodes.push(node);
        }
        for a in &self.nodes {
            for b in &self.nodes {
                if a.index != b.index {
                    net::route_to_node(&a.netns, &plan::format_cidr(plan::pod_cidr(b.index)), b.ip)?;
                }
            }
        }
        tracing::info!("network ready: {} node(s) on fabric {fabric}", count);
        Ok(())
    }

    fn serve(&mut self, conn: std::os::unix::net::UnixStream) {
        let _ = conn.set_nonblocking(false);
        let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
        let resp = match ipc::read_request(&conn) {
            Ok(req) => self.handle(req),
            Err(e) => Response::Rejected { errors: vec![format!("bad request: {e}")] },
        };
        if let Err(e) = ipc::write_response(&conn, &resp) {
            tracing::warn!("answering a client failed: {e}");
        }
    }

    fn handle(&mut self, req: Request) -> Response {
        match req {
            Request::Status => Response::Status { status: Box::new(self.status()) },
            Request::Flows { after } => {
                self.drain_flows();
                Response::Flows { flows: self.flows.after(after), datapath: self.capture.name().into() }
            }
            Request::Shutdown => {
                self.shutdown = true;
                Response::Done { lines: vec![format!("cluster {} stopping", self.paths.cluster)] }
            }
            Request::Apply { objects } => {
                let names: Vec<String> = self.nodes.iter().map(|n| n.name.clone()).collect();
                let planned = self.store.plan_apply(objects, &ClusterFacts { nodes: &names, vips: &self.vips });
                self.commit("apply", planned)
            }
            Request::Objects => {
                let pods: Vec<&PodRuntime> = self.pods.values().chain(self.stopping.iter()).collect();
                Response::Objects { items: api_server::api_view(&self.store, &pods, &self.nodes, &self.vips) }
            }
            Request::Label { kind, namespace, name, changes, overwrite, annotate } => {
                let names: Vec<String> = self.nodes.iter().map(|n| n.name.clone()).collect();
                let key = slipstream_k8s::ObjectKey { kind, namespace, name };
                let planned = self.store.plan_label(&key, &changes, overwrite, annotate, &ClusterFacts { nodes: &names, vips: &self.vips });
                self.commit(if annotate { "annotate" } else { "label" }, planned)
            }
            Request::Restart { namespace, name } => {
                let at = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
                let planned = self.store.plan_restart(&namespace, &name, &at);
                self.commit("rollout", planned)
            }
            Request::Delete { keys, ignore_not_found } => {
                let planned = self.store.plan_delete(&keys, ignore_not_found);
                self.commit("delete", planned)
            }
        }
    }

    /// Takes a planned store (every change of a request checked at once)
    /// or answers its errors, changing nothing.
    fn commit(&mut self, verb: &str, planned: Result<(Store, Vec<String>), Vec<String>>) -> Response {
        match planned {
            Ok((store, lines)) => {
                for l in &lines {
                    tracing::info!("{verb}: {l}");
                }
                self.store = store;
                self.reconcile();
                // Written before the answer: the caller's next `status`
                // reports the generation that holds it.
                self.sync_objects();
                Response::Done { lines }
            }
            Err(errors) => Response::Rejected { errors },
        }
    }

    /// Makes the set of pods match the store: stops pods no longer wanted
    /// (or whose spec changed), creates the missing ones.
    fn reconcile(&mut self) {
        let desired = desired_pods(self.store.objects());
        self.unplaceable.retain(|k| desired.iter().any(|p| p.namespace == k.0 && p.name == k.1));
        let wanted: BTreeMap<(String, String), &slipstream_k8s::PodInstance> =
            desired.iter().map(|p| ((p.namespace.clone(), p.name.clone()), p)).collect();
        // A Deployment's pods of an older template stay until every pod of
        // its current template is ready (a rolling update with all the new
        // pods surged at once): a restarted waypoint or app keeps serving.
        let ready = |ns: &str, name: &str| self.pods.get(&(ns.to_string(), name.to_string())).is_some_and(|p| p.ready());
        let stale: Vec<(String, String)> = self
            .pods
            .iter()
            .filter(|(k, p)| wanted.get(*k).is_none_or(|w| w.spec_hash != p.inst.spec_hash))
            .filter(|(_, p)| !plan::rollout_holds(&p.inst, &desired, ready))
            .map(|(k, _)| k.clone())
            .collect();
        for k in stale {
            if let Some(mut p) = self.pods.remove(&k) {
                p.stop(MAX_GRACE);
                self.stopping.push(p);
            }
        }
        let names: Vec<String> = self.nodes.iter().map(|n| n.name.clone()).collect();
        for inst in desired {
            let key = (inst.namespace.clone(), inst.name.clone());
            // A pod replaced under the same name waits for the old one.
            if self.pods.contains_key(&key) || self.stopping.iter().any(|p| p.inst.namespace == key.0 && p.inst.name == key.1) {
                continue;
            }
            let loads: Vec<usize> = self.nodes.iter().map(|n| self.pods.values().filter(|p| p.node == n.index).count()).collect();
            let Ok(pos) = plan::place(&names, &loads, inst.spec.node_name.as_deref()) else { continue };
            let node = &self.nodes[pos];
            let used: BTreeSet<Ipv4Addr> = self.pods.values().chain(self.stopping.iter()).map(|p| p.ip).collect();
            let Some(ip) = plan::next_pod_ip(node.index, &used) else {
                // Retried every tick: said once per pod.
                if self.unplaceable.insert(key.clone()) {
                    tracing::error!(node = %node.name, "no pod address left for {}/{}; it waits until one is free", key.0, key.1);
                }
                continue;
            };
            self.unplaceable.remove(&key);
            let ns_labels = mesh::namespace_labels(&self.store, &inst.namespace);
            let meshed = mesh::is_meshed(&ns_labels, &inst.labels);
            let nft = mesh::wants_nftables(&ns_labels, &inst.labels);
            // Provenance, not labels: a pod of the Deployment the agent made
            // for a Gateway (users cannot apply one that says it is).
            let waypoint = inst.owner.as_deref().is_some_and(|d| self.store.made_for_waypoint(&inst.namespace, d));
            let mut pod = PodRuntime::create(&self.paths, inst, node, ip, meshed, nft, &mut self.capture);
            if waypoint {
                let token = random_token();
                pod.extra_env = self.waypoint_env(&token);
                pod.workload_token = Some(token);
            }
            self.pods.insert(key, pod);
        }
        self.sync_services();
    }

    /// What a waypoint pod is told, as the kubelet would mount a projected
    /// token and istiod's address: where the control plane is, the mesh
    /// root, its token. In the environment, which only its own PID
    /// namespace (and root on the machine) can read: a pod's /run and /tmp
    /// are its own, so no file could carry it there.
    fn waypoint_env(&self, token: &str) -> Vec<(String, String)> {
        let control: Vec<String> = (1..=self.controls.len().max(1)).map(|r| plan::control_addr(r).to_string()).collect();
        let root = std::fs::read_to_string(self.paths.ca_dir().join("root-cert.pem")).unwrap_or_default();
        vec![
            ("SLIPSTREAM_WAYPOINT_CONTROL_PLANE".into(), control.join(",")),
            ("SLIPSTREAM_WAYPOINT_ROOT_PEM".into(), root),
            ("SLIPSTREAM_WAYPOINT_TOKEN".into(), token.to_string()),
            ("SLIPSTREAM_WAYPOINT_CLUSTER_ID".into(), self.paths.cluster.to_string()),
        ]
    }

    /// The workload tokens file the control plane reads: one entry per
    /// waypoint pod alive (rewritten only when it changes).
    fn sync_workload_tokens(&mut self) {
        let mut all = BTreeMap::new();
        for p in self.pods.values() {
            let Some(t) = &p.workload_token else { continue };
            let node = self.nodes.get(p.node - 1).map(|n| n.name.clone()).unwrap_or_default();
            all.insert(
                t.clone(),
                serde_json::json!({"namespace": p.inst.namespace, "service_account": p.inst.spec.service_account(), "node": node, "pod": p.inst.name}),
            );
        }
        let text = serde_json::to_string_pretty(&all).unwrap_or_default();
        if self.last_workload_tokens.as_deref() != Some(text.as_str()) {
            match write_private(&self.paths.workload_tokens_file(), &text) {
                Ok(()) => self.last_workload_tokens = Some(text),
                Err(e) => tracing::error!("writing the workload tokens: {e}"),
            }
        }
        // Pods cannot reach the control plane: its namespaces have no route
        // back to the pod network. A waypoint pod, which must, gets one
        // (its own address only), and loses it when it goes.
        let wanted: BTreeMap<std::net::Ipv4Addr, std::net::Ipv4Addr> = self
            .pods
            .values()
            .filter(|p| p.workload_token.is_some())
            .filter_map(|p| Some((p.ip, self.nodes.get(p.node - 1)?.ip)))
            .collect();
        if wanted == self.control_routes {
            return;
        }
        for r in 1..=self.controls.len() {
            let netns = self.paths.control_netns(r);
            for ip in self.control_routes.keys().filter(|ip| !wanted.contains_key(ip)) {
                if let Err(e) = crate::sys::net::del_route(&netns, &format!("{ip}/32")) {
                    tracing::warn!("removing the control plane's route to waypoint pod {ip}: {e}");
                }
            }
            for (ip, via) in &wanted {
                if let Err(e) = crate::sys::net::route_to_node(&netns, &format!("{ip}/32"), *via) {
                    tracing::warn!("routing the control plane to waypoint pod {ip}: {e}");
                }
            }
        }
        self.control_routes = wanted;
    }

    fn tick(&mut self) {
        self.drain_flows();
        self.reconcile();
        for c in &mut self.controls {
            c.tick();
        }
        for proxy in &mut self.proxies {
            proxy.tick();
        }
        self.read_served();
        self.sync_enrolment();
        let mut changed = false;
        let cluster = self.paths.cluster.to_string();
        for p in self.pods.values_mut() {
            let node = &self.nodes[p.node - 1].name;
            let uid = mesh::workload_uid(&cluster, &p.inst.namespace, &p.inst.name);
            let may_start = !p.meshed || self.served.get(node).is_some_and(|s| s.contains(&uid));
            changed |= p.tick(&self.paths, &self.nodes, may_start);
        }
        let before = self.stopping.len();
        self.progress_stopping();
        if changed || before != self.stopping.len() {
            self.sync_services();
        }
        self.sync_workload_tokens();
        self.sync_mesh();
        self.persist();
        self.rotate_logs();
    }

    /// Rotates the cluster's logs that grew past 10 MiB (`crate::logrotate`).
    fn rotate_logs(&mut self) {
        let now = std::time::Instant::now();
        if now < self.next_log_check {
            return;
        }
        self.next_log_check = now + crate::logrotate::CHECK_EVERY;
        let mut logs = Vec::new();
        crate::logrotate::logs_under(&self.paths.state_dir, 3, &mut logs);
        for log in logs {
            match crate::logrotate::rotate_if_large(&log, crate::logrotate::MAX_BYTES, crate::logrotate::KEEP) {
                Ok(true) => tracing::info!(log = %log.display(), "log rotated: copied to .1 and emptied (10 MiB reached; 4 copies kept)"),
                Ok(false) => {}
                Err(e) => tracing::warn!(log = %log.display(), "rotating the log: {e}"),
            }
        }
    }

    /// Istio ambient's enrolment of pods that already run: a label change
    /// (on the namespace or the pod) that meshes one enrols it without a
    /// restart, the node proxy first (it serves the pod), then its capture;
    /// one that takes it out switches its capture off first, then the node
    /// proxy drains it. Connections open at that moment keep their path.
    fn sync_enrolment(&mut self) {
        let cluster = self.paths.cluster.to_string();
        for p in self.pods.values_mut() {
            if p.sandbox_error.is_some() || p.terminating() || p.workload_token.is_some() {
                continue;
            }
            let ns_labels = mesh::namespace_labels(&self.store, &p.inst.namespace);
            let want = mesh::is_meshed(&ns_labels, &p.inst.labels);
            let nft = mesh::wants_nftables(&ns_labels, &p.inst.labels);
            let node = &self.nodes[p.node - 1];
            let uid = mesh::workload_uid(&cluster, &p.inst.namespace, &p.inst.name);
            let served = self.served.get(&node.name).is_some_and(|s| s.contains(&uid));
            let key = p.datapath_key();
            if want && !p.meshed {
                tracing::info!(pod = %p.key(), "enrolling in the mesh (its labels now say ambient): the node proxy first, then capture");
                p.meshed = true;
            } else if want && !p.captured && served {
                match self.capture.set_meshed(&key, &p.netns, p.ip, node, true, nft) {
                    Ok(()) => {
                        p.captured = true;
                        tracing::info!(pod = %p.key(), "enrolled in the mesh without a restart: its new connections are captured");
                    }
                    Err(e) => tracing::warn!(pod = %p.key(), "enrolling in the mesh: {e} (retried)"),
                }
            } else if !want && p.captured {
                match self.capture.set_meshed(&key, &p.netns, p.ip, node, false, nft) {
                    Ok(()) => {
                        p.captured = false;
                        p.meshed = false;
                        tracing::info!(pod = %p.key(), "left the mesh without a restart: capture off, the node proxy lets it go");
                    }
                    Err(e) => tracing::warn!(pod = %p.key(), "leaving the mesh: {e} (retried)"),
                }
            } else if !want && p.meshed {
                p.meshed = false;
            }
        }
    }

    /// Writes the node proxies' configuration when it changed (atomically).
    /// What the control plane and the node proxies read: every object, as
    /// the API server would serve it (the control plane's `dir` source), and
    /// each node's meshed pods (the CNI role). Writes only what changed.
    fn sync_mesh(&mut self) {
        self.sync_objects();
        let pods: Vec<&PodRuntime> = self.pods.values().collect();
        let cluster = self.paths.cluster.to_string();
        let mut files = Vec::new();
        for n in &self.nodes {
            files.push((
                self.paths.mesh_dir().join(&n.name).join("pods.json"),
                serde_json::to_string_pretty(&mesh::node_pods(&cluster, n.index, &pods)),
            ));
        }
        for (path, text) in files {
            let Ok(text) = text else { continue };
            if self.last_mesh.get(&path) == Some(&text) {
                continue;
            }
            if let Err(e) = write_atomic(&path, &text) {
                tracing::error!("cannot write {}: {e}", path.display());
                continue;
            }
            self.last_mesh.insert(path, text);
        }
    }

    fn sync_objects(&mut self) {
        let pods: Vec<&PodRuntime> = self.pods.values().collect();
        let objs = api_server::cluster_objects(&self.store, &pods, &self.nodes, &self.vips);
        let text: String = objs.iter().filter_map(|o| o.to_yaml().ok()).collect::<Vec<_>>().join("---\n");
        if self.last_objects.as_deref() == Some(text.as_str()) {
            return;
        }
        let dir = self.paths.objects_dir();
        match api_server::sync_dir(&dir, &objs) {
            Ok(report) => {
                if report.changed() || self.objects_generation == 0 {
                    self.objects_generation += 1;
                    if let Err(e) = write_atomic(&dir.join(api_server::GENERATION_FILE), &format!("{}\n", self.objects_generation)) {
                        tracing::error!("cannot write {}: {e}", dir.join(api_server::GENERATION_FILE).display());
                    }
                    tracing::debug!(
                        written = report.written,
                        removed = report.removed,
                        generation = self.objects_generation,
                        "objects written"
                    );
                }
                self.last_objects = Some(text);
            }
            Err(e) => tracing::error!("cannot write the objects into {}: {e}", dir.display()),
        }
    }

    fn read_served(&mut self) {
        for n in &self.nodes {
            let path = self.paths.mesh_dir().join(&n.name).join("served.json");
            let served: slipstream_core::Served =
                std::fs::read_to_string(&path).ok().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default();
            self.served.insert(n.name.clone(), served.uids.into_iter().collect());
        }
    }

    /// Brings VIPs, nftables rules and hosts files in step with the store
    /// and pod readiness. Writes only what changed.
    fn sync_services(&mut self) {
        services::allocate_vips(&self.store, &mut self.vips);
        let pods: Vec<&PodRuntime> = self.pods.values().collect();
        let view = services::view(&self.store, &pods, &self.nodes, &self.vips);
        let rules = plan::nft_ruleset(&view.rules);
        if self.last_rules.as_deref() != Some(rules.as_str()) {
            // The same services for the eBPF datapath's connect-time
            // balancer (pods outside the mesh go to its choice; meshed
            // pods' node proxies get it with the address dialed).
            if let datapath::Capture::Ebpf(dp) = &mut self.capture {
                let lb: Vec<_> = view
                    .rules
                    .iter()
                    .filter(|r| r.protocol == slipstream_k8s::Protocol::TCP)
                    .map(|r| slipstream_ebpf::ServiceLb { vip: r.vip, port: r.port, endpoints: r.endpoints.clone() })
                    .collect();
                if let Err(e) = dp.set_services(&lb) {
                    tracing::error!("connect-time load balancing not updated (nftables DNAT still serves): {e}");
                }
            }
            let mut ok = true;
            for n in &self.nodes {
                if let Err(e) = net::apply_nft(&n.netns, &rules) {
                    tracing::error!(node = %n.name, "service rules not applied: {e}");
                    ok = false;
                }
            }
            if ok {
                self.last_rules = Some(rules);
            }
        }
        let hosts_changed = self.last_hosts.as_ref().map(|h| format!("{h:?}")) != Some(format!("{:?}", view.hosts));
        for p in self.pods.values() {
            if p.sandbox_error.is_some() {
                continue;
            }
            // Rewrite in place: the file is bind-mounted by inode into the
            // pod's processes, so it must never be replaced by a rename.
            if hosts_changed || !p.hosts_path().exists() {
                let text = plan::hosts_file(&p.inst.namespace, &p.inst.name, p.ip, &view.hosts);
                if let Err(e) = std::fs::write(p.hosts_path(), text) {
                    tracing::warn!(pod = %p.key(), "cannot write hosts: {e}");
                }
            }
            if !p.resolv_path().exists() {
                let _ = std::fs::write(p.resolv_path(), plan::resolv_conf(&p.inst.namespace));
            }
        }
        self.last_hosts = Some(view.hosts);
    }

    fn status(&self) -> ClusterStatus {
        let pods: Vec<&PodRuntime> = self.pods.values().collect();
        let view = services::view(&self.store, &pods, &self.nodes, &self.vips);
        let mut pod_status: Vec<_> = self.pods.values().chain(self.stopping.iter()).map(|p| p.status(&self.paths, &self.nodes)).collect();
        pod_status.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        ClusterStatus {
            version: STATUS_VERSION,
            cluster: self.paths.cluster.to_string(),
            agent: AgentStatus { pid: std::process::id() as i32, running: true },
            control: self
                .controls
                .iter()
                .enumerate()
                .map(|(i, c)| ControlStatus {
                    name: c.node.clone(),
                    netns: self.paths.control_netns(i + 1),
                    address: plan::control_addr(i + 1).to_string(),
                    process: ProxyStatus {
                        pid: c.pid(),
                        restarts: c.restarts,
                        serving: 0,
                        log: self.paths.control_log(i + 1).display().to_string(),
                        ready: Some(c.ready()),
                        reason: if c.ready() { String::new() } else { c.reason() },
                    },
                })
                .collect(),
            nodes: self
                .nodes
                .iter()
                .zip(&self.proxies)
                .map(|(n, proxy)| NodeStatus {
                    name: n.name.clone(),
                    netns: n.netns.clone(),
                    ip: n.ip.to_string(),
                    pod_cidr: plan::format_cidr(plan::pod_cidr(n.index)),
                    proxy: Some(ProxyStatus {
                        pid: proxy.pid(),
                        restarts: proxy.restarts,
                        serving: self.served.get(&n.name).map(|s| s.len()).unwrap_or(0),
                        log: self.paths.node_proxy_log(&n.name).display().to_string(),
                        ready: Some(proxy.ready()),
                        reason: if proxy.ready() { String::new() } else { proxy.reason() },
                    }),
                    datapath: Some(crate::status::DatapathStatus {
                        mode: self.capture.name().into(),
                        fallback: self.capture.fallback().map(str::to_string),
                    }),
                })
                .collect(),
            pods: pod_status,
            services: view.status,
            objects_generation: self.objects_generation,
            other_objects: self.store.kept_objects(),
        }
    }

    /// Writes state.json when it changed (atomically: write, then rename).
    fn persist(&mut self) {
        let Ok(text) = serde_json::to_string_pretty(&self.status()) else { return };
        if text == self.last_state {
            return;
        }
        let tmp = self.paths.state_file().with_extension("json.tmp");
        if std::fs::write(&tmp, &text).and_then(|_| std::fs::rename(&tmp, self.paths.state_file())).is_ok() {
            self.last_state = text;
        }
    }

    /// Stops every pod gracefully, then removes the network and cgroups.
    fn teardown(&mut self) {
        // Proxies first: their sockets inside pod namespaces would otherwise
        // keep those namespaces (and their veths) alive after deletion.
        for proxy in &mut self.proxies {
            proxy.stop();
        }
        for c in &mut self.controls {
            c.stop();
        }
        for (_, mut p) in std::mem::take(&mut self.pods) {
            p.stop(MAX_GRACE);
            self.stopping.push(p);
        }
        let deadline = Instant::now() + MAX_GRACE + Duration::from_secs(5);
        while !self.stopping.is_empty() && Instant::now() < deadline {
            self.progress_stopping();
            std::thread::sleep(Duration::from_millis(50));
        }
        for n in &self.nodes {
            let _ = net::del_netns(&n.netns);
        }
        for r in 1..=self.controls.len() {
            let _ = net::del_netns(&self.paths.control_netns(r));
        }
        let _ = net::del_netns(&self.paths.fabric_netns());
        let _ = cgroup::remove_tree(&self.paths.cgroup_root.join("pods"));
        // Every program, link and map of the cluster goes with its pins.
        if let Err(e) = slipstream_ebpf::remove_all(&self.paths.bpf_dir) {
            tracing::warn!("cannot remove {}: {e}", self.paths.bpf_dir.display());
        }
        tracing::info!("cluster {} removed", self.paths.cluster);
    }

    /// Names the flow events read since the last call from the pods now
    /// known (so a pod deleted later still shows by name).
    fn drain_flows(&mut self) {
        // Every tick: the pod table is only read when there is something
        // to name.
        let events = self.flows.take();
        if events.is_empty() {
            return;
        }
        let pods: Vec<flows::PodName> = self
            .pods
            .values()
            .chain(self.stopping.iter())
            .map(|p| flows::PodName {
                ip: p.ip,
                namespace: p.inst.namespace.clone(),
                name: p.inst.name.clone(),
                identity: if p.meshed {
                    format!(
                        "spiffe://{}/ns/{}/sa/{}",
                        slipstream_core::DEFAULT_TRUST_DOMAIN,
                        p.inst.namespace,
                        p.inst.spec.service_account()
                    )
                } else {
                    String::new()
                },
                service: false,
            })
            .chain(self.vips.iter().map(|((namespace, name), ip)| flows::PodName {
                ip: *ip,
                namespace: namespace.clone(),
                name: name.clone(),
                identity: String::new(),
                service: true,
            }))
            .collect();
        let nodes: Vec<String> = self.nodes.iter().map(|n| n.name.clone()).collect();
        self.flows.record(events, &pods, &nodes);
    }

    /// Drives stopping pods (each leaves the datapath as it goes).
    fn progress_stopping(&mut self) {
        let capture = &mut self.capture;
        self.stopping.retain_mut(|p| !p.progress_stop(capture));
    }
}

/// Binds the agent's socket at `path`, reachable by root only from the
/// first instant: whoever can connect controls the cluster (and runs pods
/// as root). It is bound inside a new 0700 directory, made 0600, then
/// renamed into place, so no umask and no moment leaves it open to others.
fn bind_private(path: &std::path::Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let dir = path.with_extension("bind");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    let tmp = dir.join("sock");
    let bound = UnixListener::bind(&tmp).and_then(|l| {
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&tmp, path)?;
        Ok(l)
    });
    let _ = std::fs::remove_dir_all(&dir);
    bound
}

/// Files every confined pod process gets covered (see
/// `SandboxSpec::masked_files`): the operator's `--ca-key`, as recorded by
/// the agent that copied it.
pub fn masked_files(paths: &Paths) -> Vec<std::path::PathBuf> {
    match std::fs::read_to_string(paths.operator_key_record()) {
        Ok(p) if !p.trim().is_empty() => vec![std::path::PathBuf::from(p.trim_end_matches('\n'))],
        _ => Vec::new(),
    }
}

fn write_atomic(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// One random token per node (the local cluster's node credentials): each
/// node proxy reads its own; the control plane reads them all. Root only.
/// 32 random bytes in hex.
fn random_token() -> String {
    use rand::RngCore;
    let mut raw = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut raw);
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

fn write_node_tokens(paths: &Paths, nodes: &[String]) -> anyhow::Result<()> {
    let mut all = BTreeMap::new();
    for n in nodes {
        let token = random_token();
        write_private(&paths.node_token_file(n), &token)?;
        all.insert(n.clone(), token);
    }
    write_private(&paths.node_tokens_file(), &serde_json::to_string_pretty(&all)?)?;
    Ok(())
}

/// The mesh root: the operator's (copied in) or a new one.
fn ensure_ca(paths: &Paths, cert: Option<&std::path::Path>, key: Option<&std::path::Path>) -> anyhow::Result<()> {
    let dir = paths.ca_dir();
    std::fs::create_dir_all(&dir)?;
    let (cert_out, key_out) = (dir.join("root-cert.pem"), dir.join("root-key.pem"));
    match (cert, key) {
        (Some(c), Some(k)) => {
            // Validate before use: a bad root is an error now, not at the first connection.
            validate_ca(c, k)?;
            std::fs::copy(c, &cert_out)?;
            std::fs::copy(k, &key_out)?;
            {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&key_out, std::fs::Permissions::from_mode(0o600))?;
            }
            // Pods keep read access to the machine's files: the original key
            // gets covered in every pod process (`masked_files`).
            let original = std::fs::canonicalize(k)?;
            write_private(&paths.operator_key_record(), &format!("{}\n", original.display()))?;
            tracing::info!("mesh root from {} (its key {} is hidden from pods)", c.display(), original.display());
        }
        (None, None) => {
            let td = slipstream_core::TrustDomain::new(slipstream_core::DEFAULT_TRUST_DOMAIN)?;
            let ca = slipstream_identity::Ca::generate(&td)?;
            std::fs::write(&cert_out, ca.cert_pem())?;
            write_private(&key_out, &ca.key_pem())?;
            tracing::info!("generated a mesh root in {}", dir.display());
        }
        _ => anyhow::bail!("--ca-cert and --ca-key go together"),
    }
    Ok(())
}

/// An operator's CA is usable: it loads, signs, is valid now and for at
/// least the lifetime of a workload certificate (one that ends sooner
/// would cut certificates short and stop the mesh within a day).
/// `up` runs this before creating anything, the agent again before use.
pub fn validate_ca(cert: &std::path::Path, key: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context;
    let ca = slipstream_identity::Ca::from_pem_files(cert, key, None)
        .with_context(|| format!("loading the CA from {} and {}", cert.display(), key.display()))?;
    ca.check_lifetime(slipstream_identity::DEFAULT_WORKLOAD_VALIDITY)?;
    Ok(())
}

fn write_private(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    f.write_all(text.as_bytes())
}
