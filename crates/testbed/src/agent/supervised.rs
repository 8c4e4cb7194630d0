//! The agent's own processes, supervised like Kubernetes' pods: one node
//! proxy per node (a DaemonSet's pod) and each control plane replica (a
//! Deployment's). Each is restarted with back-off when it exits, runs in
//! its network namespace and its own cgroup, and is probed like a pod:
//! HTTP GET inside its namespace (node proxy `127.0.0.1:15021/healthz/ready`,
//! control plane `127.0.0.1:15014/ready`) every 2 s (1 s timeout) from a
//! background thread, so the agent's loop never waits on it. A process that
//! stops answering (alive but stuck) is killed after 3 failures in a row
//! and restarted.

use super::node::Node;
use super::probe::{http_ready, ProbeError};
use crate::names::{netns_path, Paths};
use crate::sys::{netns, spawn};
use slipstream_core::sync::LockExt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const PROBE_PERIOD: Duration = Duration::from_secs(2);
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Failures in a row that get a proxy that was ready killed.
pub const FAILURE_THRESHOLD: u32 = 3;
/// The same for a proxy that has not been ready yet (start-up allowance).
pub const STARTUP_FAILURE_THRESHOLD: u32 = 15;
const BACKOFF_START: Duration = Duration::from_millis(500);
/// A proxy that ran this long before exiting restarts without back-off.
const BACKOFF_RESET: Duration = Duration::from_secs(60);

/// What the probes say about one proxy process (pure; reset per process).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    pub ready: bool,
    /// Why it is not ready, for `status`.
    pub reason: String,
    failures: u32,
    was_ready: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Keep,
    /// Kill the process (it is alive but not serving), for this reason.
    Kill(String),
}

impl Readiness {
    /// A process just started; `previous` says why the last one was killed.
    pub fn starting(previous: Option<&str>) -> Self {
        let reason = match previous {
            Some(p) => format!("starting (the previous process was killed: {p})"),
            None => "starting".to_string(),
        };
        Readiness { ready: false, reason, failures: 0, was_ready: false }
    }

    /// One probe's result. A proxy that answers "not ready" is alive (it
    /// says why: a pod's listeners or certificate, the configuration):
    /// shown, never killed for it. Only a proxy that does not answer is.
    pub fn record(&mut self, result: Result<(), ProbeError>) -> Verdict {
        match result {
            Ok(()) => {
                *self = Readiness { ready: true, reason: String::new(), failures: 0, was_ready: true };
                Verdict::Keep
            }
            Err(ProbeError::NotReady { message, .. }) => {
                self.ready = false;
                self.failures = 0;
                self.reason = format!("not ready: {message}");
                Verdict::Keep
            }
            Err(e) => {
                self.failures += 1;
                self.ready = false;
                let n = self.failures;
                let what = format!("readiness probe failed {n} time{}: {e}", if n == 1 { "" } else { "s" });
                let threshold = if self.was_ready { FAILURE_THRESHOLD } else { STARTUP_FAILURE_THRESHOLD };
                self.reason = if self.was_ready { what.clone() } else { format!("not ready yet: {what}") };
                if n >= threshold {
                    Verdict::Kill(what)
                } else {
                    Verdict::Keep
                }
            }
        }
    }
}

/// Shared between the agent and the probe thread of one node.
#[derive(Default)]
struct ProbeShared {
    /// The pid to probe (None: no process running).
    target: Mutex<Option<i32>>,
    /// Results not yet read by the agent: (pid probed, result).
    results: Mutex<Vec<(i32, Result<(), ProbeError>)>>,
    stop: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.locked()
}

fn probe_loop(shared: Arc<ProbeShared>, netns: PathBuf, addr: SocketAddr, path: &'static str) {
    while !shared.stop.load(Ordering::Relaxed) {
        let deadline = Instant::now() + PROBE_PERIOD;
        while Instant::now() < deadline && !shared.stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
        }
        let Some(pid) = *lock(&shared.target) else { continue };
        let result = match netns::in_netns(&netns, move || http_ready(addr, path, PROBE_TIMEOUT)) {
            Ok(r) => r,
            Err(e) => Err(ProbeError::NoAnswer(format!("cannot enter the node's network namespace: {e}"))),
        };
        lock(&shared.results).push((pid, result));
    }
}

/// What to run and how to probe it.
#[derive(Debug, Clone)]
pub struct ProcSpec {
    /// For logs: "node proxy", "control plane".
    pub what: &'static str,
    /// node1, control1.
    pub name: String,
    /// Network namespace name.
    pub netns: String,
    pub argv: Vec<String>,
    /// Environment variables with this prefix pass through from the agent
    /// (`SLIPSTREAM_NODE_X=... slipstream up` configures every node proxy).
    pub env_prefix: &'static str,
    /// Set for the process (after those passed through).
    pub env: Vec<(String, String)>,
    pub cgroup: PathBuf,
    pub log: PathBuf,
    pub probe_addr: SocketAddr,
    pub probe_path: &'static str,
}

fn exe() -> String {
    std::env::current_exe().map(|e| e.display().to_string()).unwrap_or_else(|_| "slipstream".into())
}

/// A node's proxy: its pods come from the agent's files (the CNI role), its
/// mesh and certificates from the control plane.
pub fn node_proxy_spec(paths: &Paths, node: &Node, control_replicas: usize, ebpf: bool) -> ProcSpec {
    let control: Vec<String> = (1..=control_replicas).map(|r| crate::plan::control_addr(r).to_string()).collect();
    let datapath: Vec<String> = if ebpf {
        vec![
            "--datapath".into(),
            "ebpf".into(),
            "--bpf-dir".into(),
            paths.bpf_dir.display().to_string(),
            "--datapath-index".into(),
            node.index.to_string(),
        ]
    } else {
        Vec::new()
    };
    ProcSpec {
        what: "node proxy",
        name: node.name.clone(),
        netns: node.netns.clone(),
        argv: vec![
            exe(),
            "--cluster".into(),
            paths.cluster.to_string(),
            "node".into(),
            "--node".into(),
            node.name.clone(),
            "--config-dir".into(),
            paths.mesh_dir().display().to_string(),
            "--control-plane".into(),
            control.join(","),
            "--control-plane-root".into(),
            paths.ca_dir().join("root-cert.pem").display().to_string(),
            "--token-file".into(),
            paths.node_token_file(&node.name).display().to_string(),
            // The CNI's part: the network policies of pods outside the mesh.
            "--netpol-kernel".into(),
        ]
        .into_iter()
        .chain(datapath)
        .collect(),
        env_prefix: "SLIPSTREAM_NODE_",
        // What a ztunnel pod learns from the downward API: its xDS node id
        // is `ztunnel~<ip>~<pod>.<namespace>~...`.
        env: vec![
            ("INSTANCE_IP".into(), node.ip.to_string()),
            ("POD_NAME".into(), format!("slipstream-node-{}", node.name)),
            ("POD_NAMESPACE".into(), "slipstream-system".into()),
        ],
        cgroup: paths.node_proxy_cgroup(&node.name),
        log: paths.node_proxy_log(&node.name),
        probe_addr: SocketAddr::from(([127, 0, 0, 1], slipstream_core::READINESS_PORT)),
        probe_path: "/healthz/ready",
    }
}

/// Control plane replica `replica`: the agent's objects in (a directory it
/// keeps), delta xDS and certificates out on :15012.
pub fn control_spec(paths: &Paths, replica: usize) -> ProcSpec {
    ProcSpec {
        what: "control plane",
        name: format!("control{replica}"),
        netns: paths.control_netns(replica),
        argv: vec![
            exe(),
            "--cluster".into(),
            paths.cluster.to_string(),
            "control".into(),
            "--source".into(),
            format!("dir:{}", paths.objects_dir().display()),
            "--cluster-id".into(),
            paths.cluster.to_string(),
            "--listen".into(),
            format!("0.0.0.0:{}", slipstream_core::abi::CONTROL_PLANE_PORT),
            "--ca-cert".into(),
            paths.ca_dir().join("root-cert.pem").display().to_string(),
            "--ca-key".into(),
            paths.ca_dir().join("root-key.pem").display().to_string(),
            "--node-tokens".into(),
            paths.node_tokens_file().display().to_string(),
            "--workload-tokens".into(),
            paths.workload_tokens_file().display().to_string(),
        ],
        env_prefix: "SLIPSTREAM_CONTROL_",
        env: vec![("POD_NAME".into(), format!("control{replica}"))],
        cgroup: paths.control_cgroup(replica),
        log: paths.control_log(replica),
        probe_addr: SocketAddr::from(([127, 0, 0, 1], slipstream_core::abi::CONTROL_MONITOR_PORT)),
        probe_path: "/ready",
    }
}

/// One of the agent's own processes (a node proxy, a control plane
/// replica), restarted with back-off and probed for readiness.
pub struct Supervised {
    pub node: String,
    spec: ProcSpec,
    child: Option<Child>,
    pub restarts: u32,
    next_start: Instant,
    backoff: Duration,
    started: bool,
    started_at: Instant,
    readiness: Readiness,
    /// Why the agent killed the last process, until a new one is ready.
    killed_because: Option<String>,
    probe: Arc<ProbeShared>,
}

impl Supervised {
    pub fn new(spec: ProcSpec) -> Self {
        let probe = Arc::new(ProbeShared::default());
        let (shared, ns, addr, path) = (probe.clone(), netns_path(&spec.netns), spec.probe_addr, spec.probe_path);
        let spawned = std::thread::Builder::new().name(format!("probe-{}", spec.name)).spawn(move || probe_loop(shared, ns, addr, path));
        if let Err(e) = spawned {
            tracing::error!(name = %spec.name, "cannot start the {}'s readiness probe: {e}", spec.what);
        }
        Supervised {
            node: spec.name.clone(),
            spec,
            child: None,
            restarts: 0,
            next_start: Instant::now(),
            backoff: BACKOFF_START,
            started: false,
            started_at: Instant::now(),
            readiness: Readiness::starting(None),
            killed_because: None,
            probe,
        }
    }

    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    pub fn ready(&self) -> bool {
        self.child.is_some() && self.readiness.ready
    }

    /// Why the proxy is not ready (empty when it is).
    pub fn reason(&self) -> String {
        match (&self.child, &self.killed_because) {
            (Some(_), _) => self.readiness.reason.clone(),
            (None, Some(k)) => format!("restarting: {k}"),
            (None, None) if self.started => "not running: restarting".into(),
            (None, None) => "not started yet".into(),
        }
    }

    pub fn tick(&mut self) {
        let results = std::mem::take(&mut *lock(&self.probe.results));
        for (pid, result) in results {
            if Some(pid) != self.pid() {
                continue;
            }
            if let Verdict::Kill(reason) = self.readiness.record(result) {
                tracing::warn!(name = %self.node, pid, "{} is alive but not serving ({reason}); killing it to restart it", self.spec.what);
                if let Some(c) = self.child.as_mut() {
                    let _ = c.kill();
                }
                self.killed_because = Some(reason);
            }
        }
        if let Some(c) = self.child.as_mut() {
            if let Ok(Some(st)) = c.try_wait() {
                if self.started_at.elapsed() >= BACKOFF_RESET {
                    self.backoff = BACKOFF_START;
                }
                tracing::warn!(name = %self.node, "{} exited ({st}); restarting in {:?}", self.spec.what, self.backoff);
                self.child = None;
                *lock(&self.probe.target) = None;
                self.next_start = Instant::now() + self.backoff;
                self.backoff = (self.backoff * 2).min(Duration::from_secs(10));
            }
        }
        if self.child.is_none() && Instant::now() >= self.next_start {
            self.start();
        }
        if self.readiness.ready {
            self.killed_because = None;
        }
    }

    fn start(&mut self) {
        let spec = &self.spec;
        let prepared = std::fs::create_dir_all(&spec.cgroup).and_then(|_| match spec.log.parent() {
            Some(d) => std::fs::create_dir_all(d),
            None => Ok(()),
        });
        if let Err(e) = prepared {
            tracing::error!(name = %spec.name, "cannot prepare the {}: {e}", spec.what);
            return;
        }
        let mut env = vec![("PATH".to_string(), spawn::pod_path())];
        for (k, v) in std::env::vars() {
            if k.starts_with(spec.env_prefix) || ["SLIPSTREAM_LOG", "SLIPSTREAM_ACCESS_LOG", "RUST_LOG", "HOME"].contains(&k.as_str()) {
                env.push((k, v));
            }
        }
        env.extend(spec.env.iter().cloned());
        let sandbox = spawn::SandboxSpec {
            argv: spec.argv.clone(),
            env,
            cwd: None,
            netns: netns_path(&spec.netns),
            cgroup: spec.cgroup.clone(),
            hostname: spec.name.clone(),
            hosts: None,
            resolv: None,
            log: Some(spec.log.clone()),
            new_session: true,
            private_mounts: false,
            masked_files: Vec::new(),
            cgroup_signaller: None,
        };
        match spawn::spawn(&sandbox) {
            Ok(c) => {
                if self.started {
                    self.restarts += 1;
                }
                self.started = true;
                tracing::info!(name = %spec.name, pid = c.id(), "{} started", spec.what);
                self.readiness = Readiness::starting(self.killed_because.as_deref());
                self.started_at = Instant::now();
                *lock(&self.probe.target) = Some(c.id() as i32);
                self.child = Some(c);
            }
            Err(e) => {
                tracing::error!(name = %spec.name, "cannot start the {}: {e}", spec.what);
                self.next_start = Instant::now() + self.backoff;
            }
        }
    }

    /// Stops the proxy (SIGTERM: it drains), then waits for it.
    pub fn stop(&mut self) {
        self.probe.stop.store(true, Ordering::Relaxed);
        *lock(&self.probe.target) = None;
        if let Some(mut c) = self.child.take() {
            crate::sys::signals::stop_child(&mut c, Duration::from_secs(5));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_from_probe_results() {
        let err = || Err(ProbeError::NoAnswer("no answer from 127.0.0.1:15021/healthz/ready: timed out after 1s".to_string()));
        let mut r = Readiness::starting(None);
        assert_eq!((r.ready, r.reason.as_str()), (false, "starting"));
        // Before the first success failures are allowed for a while (start-up).
        for _ in 1..STARTUP_FAILURE_THRESHOLD {
            assert_eq!(r.record(Err(ProbeError::NoAnswer("connecting to 127.0.0.1:15021: connection refused".into()))), Verdict::Keep);
        }
        assert!(r.reason.starts_with("not ready yet: readiness probe failed 14 times: connecting"), "{}", r.reason);
        assert_eq!(r.record(Ok(())), Verdict::Keep);
        assert!(r.ready && r.reason.is_empty());
        // Once ready: not ready at the first failure, killed at the third.
        assert_eq!(r.record(err()), Verdict::Keep);
        assert!(!r.ready);
        assert_eq!(r.reason, "readiness probe failed 1 time: no answer from 127.0.0.1:15021/healthz/ready: timed out after 1s");
        // A success in between resets the count.
        assert_eq!(r.record(Ok(())), Verdict::Keep);
        assert_eq!(r.record(err()), Verdict::Keep);
        assert_eq!(r.record(err()), Verdict::Keep);
        let v = r.record(err());
        assert_eq!(
            v,
            Verdict::Kill("readiness probe failed 3 times: no answer from 127.0.0.1:15021/healthz/ready: timed out after 1s".into())
        );
        let next = Readiness::starting(Some("readiness probe failed 3 times: x"));
        assert_eq!(next.reason, "starting (the previous process was killed: readiness probe failed 3 times: x)");
        // Answering "not ready" is alive: shown with its reason, never killed.
        let mut r = Readiness::starting(None);
        let not_ready = || Err(ProbeError::NotReady { status: 503, message: "answered HTTP 503: pod x: listeners not bound".into() });
        for _ in 0..STARTUP_FAILURE_THRESHOLD * 2 {
            assert_eq!(r.record(not_ready()), Verdict::Keep);
        }
        assert_eq!((r.ready, r.reason.as_str()), (false, "not ready: answered HTTP 503: pod x: listeners not bound"));
        // Never ready: killed after the start-up allowance.
        let mut r = Readiness::starting(None);
        let verdicts: Vec<Verdict> = (0..STARTUP_FAILURE_THRESHOLD).map(|_| r.record(err())).collect();
        assert!(matches!(verdicts.last(), Some(Verdict::Kill(_))));
        assert!(verdicts[..verdicts.len() - 1].iter().all(|v| *v == Verdict::Keep));
    }
}
