//! A pod at run time: its sandbox (network namespace, veth, cgroup, files)
//! and its containers, supervised with restart policy, back-off and
//! readiness probes.

use crate::names::{netns_path, Paths};
use crate::status::{ContainerStatus, PodPhase, PodStatus};
use crate::sys::{cgroup, net, netns, spawn};
use slipstream_k8s::{Container, ContainerSecurity, IntOrString, PodInstance, PodSpec, RestartPolicy};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

const BACKOFF_START: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A container that ran this long before exiting restarts without back-off.
const BACKOFF_RESET: Duration = Duration::from_secs(60);
/// Without a readiness probe, a container counts as ready once it has run
/// this long: a command that fails at once is reported as crashing instead
/// of slipping through as "ready" for a few milliseconds.
const MIN_READY: Duration = Duration::from_millis(500);

use super::datapath::Capture;
use super::enrol;
use super::node::Node;

pub struct PodRuntime {
    pub inst: PodInstance,
    pub node: usize,
    pub ip: Ipv4Addr,
    pub netns: String,
    pub cgroup: PathBuf,
    pub dir: PathBuf,
    pub containers: Vec<ContainerRuntime>,
    /// Set when the pod is being stopped: SIGKILL at this instant.
    pub kill_at: Option<Instant>,
    pub sandbox_error: Option<String>,
    /// Carried by the node proxy (capture installed before containers start).
    pub meshed: bool,
    /// Its capture is on (as `meshed`, except while a running pod joins or
    /// leaves the mesh: `agent::enrol`).
    pub captured: bool,
    /// A waypoint's pod: its credential for the control plane (the
    /// kubelet's projected token), and the environment that tells it where
    /// the control plane is (see `waypoints::env`).
    pub workload_token: Option<String>,
    pub extra_env: Vec<(String, String)>,
}

/// Where the agent records what a container runs as, for `exec`, which
/// runs commands the same way (as `kubectl exec` does).
pub fn security_file(pod_dir: &Path, container: &str) -> PathBuf {
    pod_dir.join(format!("{container}.security.json"))
}

pub struct ContainerRuntime {
    pub spec: Container,
    /// From the pod's and the container's securityContext.
    pub security: ContainerSecurity,
    confinement: spawn::Confinement,
    child: Option<Child>,
    pub restarts: u32,
    pub last_exit: Option<i32>,
    /// Terminated and not to be restarted.
    pub done: bool,
    next_start: Option<Instant>,
    backoff: Duration,
    started_at: Option<Instant>,
    pub ready: bool,
    probe_at: Instant,
    probe_failures: u32,
    pub start_error: Option<String>,
}

impl ContainerRuntime {
    fn new(spec: Container, pod: &PodSpec) -> Self {
        let security = slipstream_k8s::security::of_container(pod, &spec);
        ContainerRuntime {
            confinement: spawn::confinement(&security),
            security,
            spec,
            child: None,
            restarts: 0,
            last_exit: None,
            done: false,
            next_start: Some(Instant::now()),
            backoff: BACKOFF_START,
            started_at: None,
            ready: false,
            probe_at: Instant::now(),
            probe_failures: 0,
            start_error: None,
        }
    }
    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }
    pub fn running(&self) -> bool {
        self.child.is_some()
    }
}

impl PodRuntime {
    /// Creates the sandbox. On error the partial sandbox is removed and the
    /// error kept, so the pod shows as Failed with the reason.
    pub fn create(
        paths: &Paths,
        inst: PodInstance,
        node: &Node,
        ip: Ipv4Addr,
        meshed: bool,
        nftables: bool,
        capture: &mut Capture,
    ) -> PodRuntime {
        let netns_name = paths.pod_netns(&inst.namespace, &inst.name);
        let mut pod = PodRuntime {
            cgroup: paths.pod_cgroup(&inst.namespace, &inst.name),
            dir: paths.pod_dir(&inst.namespace, &inst.name),
            containers: inst.spec.containers.iter().map(|c| ContainerRuntime::new(c.clone(), &inst.spec)).collect(),
            inst,
            node: node.index,
            ip,
            netns: netns_name,
            kill_at: None,
            sandbox_error: None,
            meshed,
            captured: meshed,
            workload_token: None,
            extra_env: Vec::new(),
        };
        if let Err(e) = pod.create_sandbox(node, nftables, capture) {
            tracing::error!(pod = %pod.key(), "sandbox failed: {e}");
            enrol::release(capture, &pod.enrol_ref(nftables));
            let _ = net::delete_pod_network(&pod.netns);
            let _ = cgroup::remove_tree(&pod.cgroup);
            pod.sandbox_error = Some(e);
        } else {
            tracing::info!(pod = %pod.key(), node = %node.name, ip = %ip, "sandbox created");
        }
        pod
    }

    fn create_sandbox(&self, node: &Node, nftables: bool, capture: &mut Capture) -> Result<(), String> {
        std::fs::create_dir_all(&self.dir).map_err(|e| format!("cannot create {}: {e}", self.dir.display()))?;
        cgroup::create(&self.cgroup).map_err(|e| format!("cannot create cgroup {}: {e}", self.cgroup.display()))?;
        for c in &self.containers {
            let path = security_file(&self.dir, &c.spec.name);
            let text = serde_json::to_string(&c.security).expect("security settings serialize");
            std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
        net::create_pod_network(&node.netns, &self.netns, self.ip).map_err(|e| e.to_string())?;
        // Before any container runs: a meshed app never sends a byte
        // outside the mesh (if the proxy is not there, it fails closed),
        // and on the eBPF datapath every pod's connect() meets policy.
        enrol::add(capture, &self.enrol_ref(nftables), self.meshed)
    }

    /// The pod as the enrolment controller sees it (`nftables`: it stays
    /// on nftables capture).
    pub fn enrol_ref(&self, nftables: bool) -> enrol::PodRef {
        enrol::PodRef {
            name: self.key(),
            key: self.datapath_key(),
            netns: self.netns.clone(),
            ip: self.ip,
            node: self.node as u16,
            nftables,
        }
    }

    /// The pod's name on the datapath (its pinned links' directory).
    pub fn datapath_key(&self) -> String {
        super::datapath::pod_key(&self.inst.namespace, &self.inst.name)
    }

    pub fn key(&self) -> String {
        format!("{}/{}", self.inst.namespace, self.inst.name)
    }

    pub fn hosts_path(&self) -> PathBuf {
        self.dir.join("hosts")
    }
    pub fn resolv_path(&self) -> PathBuf {
        self.dir.join("resolv.conf")
    }

    pub fn terminating(&self) -> bool {
        self.kill_at.is_some()
    }

    /// Begins a graceful stop: SIGTERM now, SIGKILL after the grace period.
    pub fn stop(&mut self, max_grace: Duration) {
        if self.kill_at.is_some() {
            return;
        }
        let grace = Duration::from_secs(self.inst.spec.grace_period_secs()).min(max_grace);
        tracing::info!(pod = %self.key(), "stopping (grace {grace:?})");
        self.kill_at = Some(Instant::now() + grace);
        cgroup::signal_tree(&self.cgroup, crate::sys::signals::Signal::TERM);
    }

    /// Drives a terminating pod; true once it is fully gone. Its datapath
    /// goes once its processes are gone and before its network namespace
    /// (a tc link is detached while its device still exists).
    pub fn progress_stop(&mut self, capture: &mut Capture) -> bool {
        let Some(kill_at) = self.kill_at else { return false };
        self.reap();
        let empty = cgroup::pids_recursive(&self.cgroup).is_empty();
        if !empty && Instant::now() < kill_at {
            return false;
        }
        if let Err(e) = cgroup::kill_tree(&self.cgroup, Duration::from_secs(5)) {
            tracing::warn!(pod = %self.key(), "{e}");
        }
        for c in &mut self.containers {
            if let Some(mut ch) = c.child.take() {
                let _ = ch.wait();
            }
        }
        enrol::release(capture, &self.enrol_ref(false));
        if let Err(e) = net::delete_pod_network(&self.netns) {
            tracing::warn!(pod = %self.key(), "{e}");
        }
        if let Err(e) = cgroup::remove_tree(&self.cgroup) {
            tracing::warn!(pod = %self.key(), "{e}");
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        tracing::info!(pod = %self.key(), "deleted");
        true
    }

    /// Collects exited containers and decides their restart.
    fn reap(&mut self) {
        let policy = self.inst.spec.restart_policy();
        let terminating = self.terminating();
        let key = self.key();
        for c in &mut self.containers {
            let Some(child) = c.child.as_mut() else { continue };
            let Ok(Some(status)) = child.try_wait() else { continue };
            let code = crate::sys::signals::exit_code(status);
            c.child = None;
            c.ready = false;
            c.last_exit = Some(code);
            let ran = c.started_at.map(|t| t.elapsed()).unwrap_or_default();
            if terminating {
                continue;
            }
            let restart = match policy {
                RestartPolicy::Always => true,
                RestartPolicy::OnFailure => code != 0,
                RestartPolicy::Never => false,
            };
            if restart {
                c.backoff = if ran >= BACKOFF_RESET || c.restarts == 0 { BACKOFF_START } else { (c.backoff * 2).min(BACKOFF_MAX) };
                c.next_start = Some(Instant::now() + c.backoff);
                tracing::warn!(pod = %key, container = %c.spec.name, code, "container exited; restarting in {:?}", c.backoff);
            } else {
                c.done = true;
                tracing::info!(pod = %key, container = %c.spec.name, code, "container exited");
            }
        }
    }

    /// One supervision step: reap, (re)start, probe. True if readiness changed.
    /// `may_start` is false while a meshed pod's node proxy does not serve it yet.
    pub fn tick(&mut self, paths: &Paths, nodes: &[Node], may_start: bool) -> bool {
        if self.sandbox_error.is_some() || self.terminating() {
            return false;
        }
        let before: Vec<bool> = self.containers.iter().map(|c| c.ready).collect();
        self.reap();
        let now = Instant::now();
        for i in 0..self.containers.len() {
            let due = self.containers[i].next_start.is_some_and(|t| t <= now);
            if self.containers[i].child.is_none() && !self.containers[i].done && due && may_start {
                self.start_container(i, paths, nodes);
            }
        }
        for i in 0..self.containers.len() {
            self.probe(i, paths);
        }
        before != self.containers.iter().map(|c| c.ready).collect::<Vec<_>>()
    }

    fn start_container(&mut self, i: usize, paths: &Paths, nodes: &[Node]) {
        let env = self.env_for(i, nodes);
        let c = &self.containers[i];
        // No command: a well-known sample image runs as the built-in
        // application it stands for (validation refused any other).
        let argv = match (c.spec.command.is_empty(), c.spec.image.as_deref()) {
            (true, Some(image)) => slipstream_k8s::images::builtin(image, &c.spec.args).map(|b| b.argv).unwrap_or_default(),
            _ => c.spec.command.iter().chain(&c.spec.args).cloned().collect(),
        };
        let spec = spawn::SandboxSpec {
            argv,
            env,
            // As a container runtime with an image that sets no WORKDIR.
            cwd: Some(c.spec.working_dir.as_ref().map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/"))),
            netns: netns_path(&self.netns),
            cgroup: self.cgroup.clone(),
            hostname: self.inst.name.clone(),
            hosts: Some(self.hosts_path()),
            resolv: Some(self.resolv_path()),
            log: Some(paths.container_log(&self.inst.namespace, &self.inst.name, &c.spec.name)),
            new_session: true,
            private_mounts: true,
            masked_files: super::credentials::masked_files(paths),
            cgroup_signaller: Some(std::process::id() as i32),
        };
        let key = self.key();
        let c = &mut self.containers[i];
        if c.last_exit.is_some() || c.start_error.is_some() {
            c.restarts += 1;
        }
        c.next_start = None;
        match spawn::spawn_confined(&spec, &c.confinement, spawn::PidNamespace::New) {
            Ok(child) => {
                tracing::info!(pod = %key, container = %c.spec.name, pid = child.id(), "container started");
                c.child = Some(child);
                c.started_at = Some(Instant::now());
                c.start_error = None;
                c.probe_failures = 0;
                let delay = c.spec.readiness_probe.as_ref().and_then(|p| p.initial_delay_seconds).unwrap_or(0);
                c.probe_at = Instant::now() + Duration::from_secs(delay.max(0) as u64);
            }
            Err(e) => {
                tracing::error!(pod = %key, container = %c.spec.name, "{e}");
                c.start_error = Some(e.to_string());
                c.last_exit = Some(127);
                c.backoff = if c.restarts == 0 { BACKOFF_START } else { (c.backoff * 2).min(BACKOFF_MAX) };
                c.next_start = Some(Instant::now() + c.backoff);
            }
        }
    }

    /// Environment of a container: PATH and HOSTNAME, then its own `env`
    /// with downward-API references resolved.
    fn env_for(&self, i: usize, nodes: &[Node]) -> Vec<(String, String)> {
        let node = nodes.iter().find(|n| n.index == self.node);
        let mut env = vec![("PATH".to_string(), spawn::pod_path()), ("HOSTNAME".to_string(), self.inst.name.clone())];
        // Root keeps the agent's HOME; another user gets "/", as the kubelet
        // gives a user the image's /etc/passwd does not know.
        match std::env::var("HOME") {
            Ok(home) if self.containers[i].security.uid == 0 => env.push(("HOME".into(), home)),
            _ => env.push(("HOME".into(), "/".into())),
        }
        for e in &self.containers[i].spec.env {
            let v = match (&e.value, e.value_from.as_ref().and_then(|v| v.field_ref.as_ref())) {
                (_, Some(fr)) => match fr.field_path.as_str() {
                    "metadata.name" => self.inst.name.clone(),
                    "metadata.namespace" => self.inst.namespace.clone(),
                    "status.podIP" => self.ip.to_string(),
                    "status.hostIP" => node.map(|n| n.ip.to_string()).unwrap_or_default(),
                    "spec.nodeName" => node.map(|n| n.name.clone()).unwrap_or_default(),
                    "spec.serviceAccountName" => self.inst.spec.service_account().to_string(),
                    _ => String::new(),
                },
                (Some(v), None) => v.clone(),
                (None, None) => String::new(),
            };
            env.retain(|(k, _)| k != &e.name);
            env.push((e.name.clone(), v));
        }
        for (k, v) in &self.extra_env {
            env.retain(|(x, _)| x != k);
            env.push((k.clone(), v.clone()));
        }
        env
    }

    fn probe(&mut self, i: usize, paths: &Paths) {
        let ip = self.ip;
        let netns = netns_path(&self.netns);
        let (cgroup, hostname, hosts, resolv) = (self.cgroup.clone(), self.inst.name.clone(), self.hosts_path(), self.resolv_path());
        let sandbox = |argv| spawn::SandboxSpec {
            argv,
            env: vec![("PATH".into(), spawn::pod_path())],
            cwd: None,
            netns: netns.clone(),
            cgroup,
            hostname,
            hosts: Some(hosts),
            resolv: Some(resolv),
            log: Some(PathBuf::from("/dev/null")),
            new_session: true,
            private_mounts: true,
            masked_files: super::credentials::masked_files(paths),
            cgroup_signaller: Some(std::process::id() as i32),
        };
        let c = &mut self.containers[i];
        let Some(pid) = c.pid() else { return };
        let Some(probe) = c.spec.readiness_probe.clone() else {
            c.ready = c.started_at.is_some_and(|t| t.elapsed() >= MIN_READY);
            return;
        };
        if Instant::now() < c.probe_at {
            return;
        }
        let period = probe.period_seconds.filter(|p| *p > 0).unwrap_or(1) as u64;
        // Probe quickly until first ready, then at the configured period.
        c.probe_at = Instant::now() + if c.ready { Duration::from_secs(period) } else { Duration::from_millis(200) };
        let timeout = Duration::from_secs(probe.timeout_seconds.filter(|t| *t > 0).unwrap_or(1) as u64);
        let port_of = |p: &IntOrString| match p {
            IntOrString::Int(n) => *n as u16,
            IntOrString::Str(name) => {
                c.spec.ports.iter().find(|x| x.name.as_deref() == Some(name)).map(|x| x.container_port as u16).unwrap_or(0)
            }
        };
        let ok = if let Some(t) = &probe.tcp_socket {
            let addr = SocketAddr::from((ip, port_of(&t.port)));
            netns::in_netns(&netns, move || TcpStream::connect_timeout(&addr, timeout).is_ok()).unwrap_or(false)
        } else if let Some(h) = &probe.http_get {
            let addr = SocketAddr::from((ip, port_of(&h.port)));
            let path = h.path.clone().unwrap_or_else(|| "/".into());
            netns::in_netns(&netns, move || super::probe::http_ready(addr, &path, timeout).is_ok()).unwrap_or(false)
        } else if let Some(e) = &probe.exec {
            exec_probe(&sandbox(e.command.clone()), &c.confinement, pid, timeout)
        } else {
            false
        };
        if ok {
            c.probe_failures = 0;
            c.ready = true;
        } else {
            c.probe_failures += 1;
            if c.probe_failures >= probe.failure_threshold.filter(|t| *t > 0).unwrap_or(3) as u32 || !c.ready {
                c.ready = false;
            }
        }
    }

    pub fn ready(&self) -> bool {
        self.sandbox_error.is_none() && !self.terminating() && self.containers.iter().all(|c| c.running() && c.ready)
    }

    pub fn status(&self, paths: &Paths, nodes: &[Node]) -> PodStatus {
        let (phase, reason, message) = self.phase();
        PodStatus {
            namespace: self.inst.namespace.clone(),
            name: self.inst.name.clone(),
            node: nodes.iter().find(|n| n.index == self.node).map(|n| n.name.clone()).unwrap_or_default(),
            ip: self.ip.to_string(),
            service_account: self.inst.spec.service_account().to_string(),
            labels: self.inst.labels.clone(),
            phase,
            ready: self.ready(),
            reason,
            message,
            restarts: self.containers.iter().map(|c| c.restarts).sum(),
            netns: self.netns.clone(),
            veth: crate::plan::pod_veth(self.ip),
            cgroup: self.cgroup.display().to_string(),
            owner: self.inst.owner.as_ref().map(|o| format!("Deployment/{o}")),
            meshed: self.meshed,
            containers: self
                .containers
                .iter()
                .map(|c| ContainerStatus {
                    name: c.spec.name.clone(),
                    state: if c.running() {
                        "running"
                    } else if c.done {
                        "terminated"
                    } else {
                        "waiting"
                    }
                    .into(),
                    pid: c.pid(),
                    ready: c.ready && c.running(),
                    restarts: c.restarts,
                    last_exit_code: c.last_exit,
                    log: paths.container_log(&self.inst.namespace, &self.inst.name, &c.spec.name).display().to_string(),
                })
                .collect(),
        }
    }

    /// Phase, reason and message, in Kubernetes' vocabulary.
    fn phase(&self) -> (PodPhase, String, String) {
        if let Some(e) = &self.sandbox_error {
            return (PodPhase::Failed, "SandboxError".into(), e.clone());
        }
        if self.terminating() {
            return (PodPhase::Terminating, String::new(), String::new());
        }
        if let Some(c) = self.containers.iter().find(|c| c.start_error.is_some() && !c.running()) {
            return (
                PodPhase::Pending,
                "StartError".into(),
                format!("container {}: {}", c.spec.name, c.start_error.as_deref().unwrap_or("")),
            );
        }
        if let Some(c) = self.containers.iter().find(|c| !c.running() && !c.done && c.last_exit.is_some()) {
            return (
                PodPhase::Running,
                "CrashLoopBackOff".into(),
                format!("container {} exited with code {} (restarts: {})", c.spec.name, c.last_exit.unwrap_or(0), c.restarts),
            );
        }
        if self.containers.iter().all(|c| c.done) {
            let failed = self.containers.iter().find(|c| c.last_exit != Some(0));
            return match failed {
                Some(c) => {
                    (PodPhase::Failed, "Error".into(), format!("container {} exited with code {}", c.spec.name, c.last_exit.unwrap_or(0)))
                }
                None => (PodPhase::Succeeded, "Completed".into(), String::new()),
            };
        }
        if self.containers.iter().any(|c| c.running()) {
            let not_ready: Vec<&str> = self.containers.iter().filter(|c| !c.ready).map(|c| c.spec.name.as_str()).collect();
            if not_ready.is_empty() {
                return (PodPhase::Running, String::new(), String::new());
            }
            return (PodPhase::Running, "NotReady".into(), format!("readiness probe not yet passing: {}", not_ready.join(", ")));
        }
        if self.meshed && self.containers.iter().all(|c| c.restarts == 0 && c.last_exit.is_none()) {
            return (PodPhase::Pending, "WaitingForNodeProxy".into(), "the node proxy has not opened this pod's listeners yet".into());
        }
        (PodPhase::Pending, "ContainerCreating".into(), String::new())
    }
}

/// Runs an exec probe in the pod, in the PID namespace of the container
/// whose pod-init is `pid`; success is exit code 0 within the timeout.
fn exec_probe(spec: &spawn::SandboxSpec, confinement: &spawn::Confinement, pid: i32, timeout: Duration) -> bool {
    let Ok(mut child) = spawn::spawn_confined(spec, confinement, spawn::PidNamespace::JoinContainer(pid)) else { return false };
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return st.success(),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
        }
    }
}
