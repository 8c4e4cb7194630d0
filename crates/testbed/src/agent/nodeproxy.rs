//! One node proxy process per node, supervised like a DaemonSet's pod:
//! restarted with back-off when it exits, in the node's network namespace
//! and its own cgroup, and probed like one: HTTP GET
//! `127.0.0.1:15021/healthz/ready` inside the node's namespace every 2 s
//! (1 s timeout) from a background thread, so the agent's loop never
//! waits on it. A proxy that stops answering (alive but stuck) is killed
//! after 3 failures in a row and restarted.

use super::pods::Node;
use super::probe::{http_ready, ProbeError};
use crate::names::{netns_path, Paths};
use crate::sys::{netns, spawn};
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
const READY_ADDR: ([u8; 4], u16) = ([127, 0, 0, 1], slipstream_core::READINESS_PORT);
const READY_PATH: &str = "/healthz/ready";
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
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn probe_loop(shared: Arc<ProbeShared>, netns: PathBuf) {
    while !shared.stop.load(Ordering::Relaxed) {
        let deadline = Instant::now() + PROBE_PERIOD;
        while Instant::now() < deadline && !shared.stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
        }
        let Some(pid) = *lock(&shared.target) else { continue };
        let result = match netns::in_netns(&netns, || http_ready(SocketAddr::from(READY_ADDR), READY_PATH, PROBE_TIMEOUT)) {
            Ok(r) => r,
            Err(e) => Err(ProbeError::NoAnswer(format!("cannot enter the node's network namespace: {e}"))),
        };
        lock(&shared.results).push((pid, result));
    }
}

pub struct NodeProxy {
    pub node: String,
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

impl NodeProxy {
    pub fn new(node: &Node) -> Self {
        let probe = Arc::new(ProbeShared::default());
        let (shared, ns) = (probe.clone(), netns_path(&node.netns));
        let spawned = std::thread::Builder::new().name(format!("probe-{}", node.name)).spawn(move || probe_loop(shared, ns));
        if let Err(e) = spawned {
            tracing::error!(node = %node.name, "cannot start the node proxy's readiness probe: {e}");
        }
        NodeProxy {
            node: node.name.clone(),
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

    pub fn tick(&mut self, paths: &Paths, node: &Node) {
        let results = std::mem::take(&mut *lock(&self.probe.results));
        for (pid, result) in results {
            if Some(pid) != self.pid() {
                continue;
            }
            if let Verdict::Kill(reason) = self.readiness.record(result) {
                tracing::warn!(node = %self.node, pid, "node proxy is alive but not serving ({reason}); killing it to restart it");
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
                tracing::warn!(node = %self.node, "node proxy exited ({st}); restarting in {:?}", self.backoff);
                self.child = None;
                *lock(&self.probe.target) = None;
                self.next_start = Instant::now() + self.backoff;
                self.backoff = (self.backoff * 2).min(Duration::from_secs(10));
            }
        }
        if self.child.is_none() && Instant::now() >= self.next_start {
            self.start(paths, node);
        }
        if self.readiness.ready {
            self.killed_because = None;
        }
    }

    fn start(&mut self, paths: &Paths, node: &Node) {
        let cgroup = paths.node_proxy_cgroup(&node.name);
        if let Err(e) = std::fs::create_dir_all(&cgroup).and_then(|_| std::fs::create_dir_all(paths.state_dir.join("nodes"))) {
            tracing::error!(node = %node.name, "cannot prepare the node proxy: {e}");
            return;
        }
        let exe = std::env::current_exe().map(|e| e.display().to_string()).unwrap_or_else(|_| "slipstream".into());
        let mut env = vec![("PATH".to_string(), spawn::pod_path())];
        // The node proxy's own settings (SLIPSTREAM_NODE_*) pass through, so
        // `SLIPSTREAM_NODE_X=... slipstream up` configures every node proxy.
        for (k, v) in std::env::vars() {
            if k.starts_with("SLIPSTREAM_NODE_") || ["SLIPSTREAM_LOG", "SLIPSTREAM_ACCESS_LOG", "RUST_LOG", "HOME"].contains(&k.as_str()) {
                env.push((k, v));
            }
        }
        let spec = spawn::SandboxSpec {
            argv: vec![
                exe,
                "--cluster".into(),
                paths.cluster.to_string(),
                "node".into(),
                "--node".into(),
                node.name.clone(),
                "--config-dir".into(),
                paths.mesh_dir().display().to_string(),
                "--ca-dir".into(),
                paths.ca_dir().display().to_string(),
            ],
            env,
            cwd: None,
            netns: netns_path(&node.netns),
            cgroup,
            hostname: node.name.clone(),
            hosts: None,
            resolv: None,
            log: Some(paths.node_proxy_log(&node.name)),
            new_session: true,
            private_mounts: false,
            masked_files: Vec::new(),
            cgroup_signaller: None,
        };
        match spawn::spawn(&spec) {
            Ok(c) => {
                if self.started {
                    self.restarts += 1;
                }
                self.started = true;
                tracing::info!(node = %node.name, pid = c.id(), "node proxy started");
                self.readiness = Readiness::starting(self.killed_because.as_deref());
                self.started_at = Instant::now();
                *lock(&self.probe.target) = Some(c.id() as i32);
                self.child = Some(c);
            }
            Err(e) => {
                tracing::error!(node = %node.name, "cannot start the node proxy: {e}");
                self.next_start = Instant::now() + self.backoff;
            }
        }
    }

    /// Stops the proxy (SIGTERM: it drains), then waits for it.
    pub fn stop(&mut self) {
        self.probe.stop.store(true, Ordering::Relaxed);
        *lock(&self.probe.target) = None;
        if let Some(mut c) = self.child.take() {
            let _ = crate::sys::signals::kill(c.id() as i32, crate::sys::signals::Signal::TERM);
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
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
