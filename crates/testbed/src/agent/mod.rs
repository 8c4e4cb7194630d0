//! The agent: one background process per cluster that holds the applied
//! objects and makes the machine match them, level-triggered: every tick
//! compares what should run with what runs.
//!
//! It is a set of controllers, each owning its state and one concern:
//! `objects` (the store and its checks, the objects directory),
//! `network` (the fabric and the nodes' namespaces), `datapath` (eBPF or
//! nftables, and its flow events), `control_plane` (the control plane's
//! processes and routes), `node_proxies` (the node proxies and what they
//! are told and report), `kubelet` (the pods; their enrolment on the
//! datapath is `enrol`'s, written to run unchanged in a node agent on
//! Kubernetes) and `waypoints` (waypoint pods' credentials). [`Agent::up`]
//! makes them in order and, when one fails, removes what it made;
//! [`Agent::down`] removes everything, and may run twice.

pub mod api_server;
pub mod control_plane;
pub mod credentials;
pub mod datapath;
pub mod enrol;
pub mod files;
pub mod flows;
pub mod kubelet;
pub mod mesh;
pub mod network;
pub mod node;
pub mod node_proxies;
pub mod objects;
pub mod pods;
pub mod probe;
pub mod services;
pub mod store;
pub mod supervised;
pub mod waypoints;

use crate::ipc::{self, Request, Response};
use crate::names::Paths;
use crate::plan;
use crate::status::{AgentStatus, ClusterStatus, STATUS_VERSION};
use crate::sys::{cgroup, signals};
use std::os::unix::net::UnixListener;
use std::time::Duration;

pub use credentials::{masked_files, validate_ca};

const TICK: Duration = Duration::from_millis(100);

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

/// The running cluster: its controllers.
pub struct Agent {
    paths: Paths,
    objects: objects::Objects,
    network: network::Network,
    datapath: datapath::Datapath,
    control: control_plane::ControlPlane,
    proxies: node_proxies::NodeProxies,
    pods: kubelet::Kubelet,
    waypoints: waypoints::Waypoints,
    /// state.json as last written.
    last_state: String,
    logs: crate::logrotate::Rotation,
    shutdown: bool,
    /// `down` ran.
    removed: bool,
}

/// Runs the agent until SIGTERM or a Shutdown request; removes the cluster
/// on the way out.
pub fn run(cfg: AgentConfig) -> anyhow::Result<()> {
    signals::install_termination_flag();
    let paths = cfg.paths.clone();
    std::fs::create_dir_all(&paths.state_dir)?;
    cgroup::create(&paths.agent_cgroup())?;
    std::fs::write(paths.agent_cgroup().join("cgroup.procs"), std::process::id().to_string())?;
    std::fs::write(paths.agent_pid_file(), std::process::id().to_string())?;

    let mut agent = Agent::up(&cfg)?;
    let listener = match bind_private(&paths.socket()).and_then(|l| l.set_nonblocking(true).map(|()| l)) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("cannot listen on {}: {e}", paths.socket().display());
            agent.down();
            return Err(e.into());
        }
    };
    agent.sync_services();
    agent.persist();
    tracing::info!(cluster = %paths.cluster, nodes = cfg.nodes, "agent ready on {}", paths.socket().display());

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
    let _ = std::fs::remove_file(paths.socket());
    agent.down();
    Ok(())
}

impl Agent {
    /// Makes the cluster: the datapath, the mesh root, the network, the
    /// control plane and the node proxies (which start at the first tick).
    /// On failure everything made so far is removed (`down`) before the
    /// error is returned: no half-made cluster is left.
    pub fn up(cfg: &AgentConfig) -> anyhow::Result<Agent> {
        let mut agent = Agent {
            paths: cfg.paths.clone(),
            objects: Default::default(),
            network: Default::default(),
            datapath: Default::default(),
            control: Default::default(),
            proxies: Default::default(),
            pods: Default::default(),
            waypoints: Default::default(),
            last_state: String::new(),
            logs: Default::default(),
            shutdown: false,
            removed: false,
        };
        match agent.make(cfg) {
            Ok(()) => Ok(agent),
            Err(e) => {
                tracing::error!("{e:#}");
                agent.down();
                Err(e)
            }
        }
    }

    fn make(&mut self, cfg: &AgentConfig) -> anyhow::Result<()> {
        use anyhow::Context;
        self.datapath = datapath::Datapath::start(cfg.datapath, &self.paths)?;
        credentials::ensure_ca(&self.paths, cfg.ca_cert.as_deref(), cfg.ca_key.as_deref()).context("cannot set up the mesh CA")?;
        self.create_network(cfg.nodes, cfg.control_replicas).context("cannot create the cluster network")
    }

    fn create_network(&mut self, count: usize, control_replicas: usize) -> anyhow::Result<()> {
        anyhow::ensure!((1..=plan::MAX_NODES).contains(&count), "--nodes must be between 1 and {}", plan::MAX_NODES);
        anyhow::ensure!(
            (1..=plan::MAX_CONTROL_REPLICAS).contains(&control_replicas),
            "--control-replicas must be between 1 and {}",
            plan::MAX_CONTROL_REPLICAS
        );
        let fabric = self.network.create_fabric(&self.paths)?;
        let names: Vec<String> = (1..=count).map(plan::node_name).collect();
        credentials::write_node_tokens(&self.paths, &names)?;
        // The control plane first: node proxies connect to it as they start.
        for r in 1..=control_replicas {
            self.control.add(&self.paths, &fabric, r)?;
        }
        let ebpf = self.datapath.capture.is_ebpf();
        for i in 1..=count {
            let node = self.network.add_node(&self.paths, &fabric, i)?;
            self.proxies.add(&self.paths, node, control_replicas, ebpf);
        }
        self.network.route_nodes()?;
        tracing::info!("network ready: {} node(s) on fabric {fabric}", count);
        Ok(())
    }

    /// Removes the cluster: stops the node proxies and the control plane,
    /// stops every pod gracefully, then deletes the namespaces, the pods'
    /// cgroups and the datapath's pins. A second call does nothing.
    pub fn down(&mut self) {
        if std::mem::replace(&mut self.removed, true) {
            return;
        }
        // Proxies first: their sockets inside pod namespaces would otherwise
        // keep those namespaces (and their veths) alive after deletion.
        self.proxies.stop();
        self.control.stop();
        self.pods.stop_all(&mut self.datapath.capture);
        self.network.remove_nodes();
        self.control.remove_netns();
        self.network.remove_fabric();
        let _ = cgroup::remove_tree(&self.paths.cgroup_root.join("pods"));
        // Every program, link and map of the cluster goes with its pins.
        datapath::Datapath::remove(&self.paths);
        tracing::info!("cluster {} removed", self.paths.cluster);
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
        let names = self.network.names();
        match req {
            Request::Status => Response::Status { status: Box::new(self.status()) },
            Request::Flows { after } => {
                self.drain_flows();
                Response::Flows { flows: self.datapath.flows.after(after), datapath: self.datapath.capture.name().into() }
            }
            Request::Shutdown => {
                self.shutdown = true;
                Response::Done { lines: vec![format!("cluster {} stopping", self.paths.cluster)] }
            }
            Request::Apply { objects } => {
                let planned = self.objects.store.plan_apply(objects, &self.objects.facts(&names));
                self.commit("apply", planned)
            }
            Request::Objects => Response::Objects {
                items: api_server::api_view(&self.objects.store, &self.pods.all(), &self.network.nodes, &self.objects.vips),
            },
            Request::Label { kind, namespace, name, changes, overwrite, annotate } => {
                let key = slipstream_k8s::ObjectKey { kind, namespace, name };
                let planned = self.objects.store.plan_label(&key, &changes, overwrite, annotate, &self.objects.facts(&names));
                self.commit(if annotate { "annotate" } else { "label" }, planned)
            }
            Request::Restart { namespace, name } => {
                let at = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
                let planned = self.objects.store.plan_restart(&namespace, &name, &at);
                self.commit("rollout", planned)
            }
            Request::Delete { keys, ignore_not_found } => {
                let planned = self.objects.store.plan_delete(&keys, ignore_not_found);
                self.commit("delete", planned)
            }
        }
    }

    /// Takes a planned store (every change of a request checked at once)
    /// or answers its errors, changing nothing.
    fn commit(&mut self, verb: &str, planned: objects::Planned) -> Response {
        match self.objects.take(verb, planned) {
            Ok(lines) => {
                self.reconcile();
                // Written before the answer: the caller's next `status`
                // reports the generation that holds it.
                self.objects.write(&self.paths, &self.pods.running(), &self.network.nodes);
                Response::Done { lines }
            }
            Err(errors) => Response::Rejected { errors },
        }
    }

    /// Makes the set of pods match the store, then the services.
    fn reconcile(&mut self) {
        let (paths, control) = (&self.paths, &self.control);
        let waypoint = || waypoints::credentials(paths, &control.addresses());
        self.pods.reconcile(&self.paths, &self.objects.store, &self.network.nodes, &mut self.datapath.capture, &waypoint);
        self.sync_services();
    }

    fn tick(&mut self) {
        self.drain_flows();
        self.reconcile();
        self.control.tick();
        self.proxies.tick(&self.paths, &self.network.nodes);
        let cluster = self.paths.cluster.to_string();
        let (proxies, nodes) = (&self.proxies, &self.network.nodes);
        let served = |p: &pods::PodRuntime| {
            let uid = mesh::workload_uid(&cluster, &p.inst.namespace, &p.inst.name);
            proxies.serves(&nodes[p.node - 1].name, &uid)
        };
        self.pods.sync_enrolment(&self.objects.store, &mut self.datapath.capture, &served);
        let changed = self.pods.tick(&self.paths, nodes, &served);
        let gone = self.pods.progress_stopping(&mut self.datapath.capture);
        if changed || gone {
            self.sync_services();
        }
        let routes = self.waypoints.sync(&self.paths, &self.pods.running(), &self.network.nodes);
        self.control.route_waypoints(routes);
        // What the control plane and the node proxies read: every object,
        // as the API server would serve it, and each node's meshed pods.
        self.objects.write(&self.paths, &self.pods.running(), &self.network.nodes);
        self.proxies.write_pods(&self.paths, &self.network.nodes, &self.pods.running());
        self.persist();
        self.logs.tick(&self.paths.state_dir);
    }

    /// Brings VIPs, nftables rules (and the eBPF balancer) and hosts files
    /// in step with the store and pod readiness. Writes only what changed.
    fn sync_services(&mut self) {
        self.objects.allocate_vips();
        let view = services::view(&self.objects.store, &self.pods.running(), &self.network.nodes, &self.objects.vips);
        let rules = plan::nft_ruleset(&view.rules);
        if self.network.rules_changed(&rules) {
            self.datapath.set_services(&view.rules);
            self.network.apply_rules(rules);
        }
        self.pods.write_name_files(view.hosts);
    }

    fn status(&self) -> ClusterStatus {
        let view = services::view(&self.objects.store, &self.pods.running(), &self.network.nodes, &self.objects.vips);
        ClusterStatus {
            version: STATUS_VERSION,
            cluster: self.paths.cluster.to_string(),
            agent: AgentStatus { pid: std::process::id() as i32, running: true },
            control: self.control.status(&self.paths),
            nodes: self.proxies.status(&self.paths, &self.network.nodes, &self.datapath.status()),
            pods: self.pods.status(&self.paths, &self.network.nodes),
            services: view.status,
            objects_generation: self.objects.generation,
            other_objects: self.objects.store.kept_objects(),
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

    /// Names the flow events read since the last call from the pods and
    /// services now known (so a pod deleted later still shows by name).
    fn drain_flows(&mut self) {
        let (pods, vips, nodes) = (&self.pods, &self.objects.vips, &self.network.nodes);
        self.datapath.drain_flows(|| {
            let mut names = pods.flow_names();
            names.extend(vips.iter().map(|((namespace, name), ip)| flows::PodName {
                ip: *ip,
                namespace: namespace.clone(),
                name: name.clone(),
                identity: String::new(),
                service: true,
            }));
            (names, nodes.iter().map(|n| n.name.clone()).collect())
        });
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
