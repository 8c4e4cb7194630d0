//! The cluster as `slipstream up` and `down` see it. [`Cluster::up`] makes
//! one (it refuses a live one, clears a dead one's leftovers, starts the
//! agent and waits until it answers) and, when that fails or is
//! interrupted, removes what it made itself; [`Cluster::down`] removes a
//! cluster by name, gracefully through its agent when it lives, then by
//! sweeping (`sweep`), whatever is left; running it twice is harmless.
//! The agent's own controllers are `agent`'s.

use crate::agent::datapath::Mode;
use crate::ipc::{self, Request};
use crate::names::Paths;
use crate::sweep;
use crate::sys::{signals, spawn};
use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

/// How long the agent may take to build the network and answer.
const AGENT_START: Duration = Duration::from_secs(60);
/// How long a graceful stop through the agent may take.
const AGENT_STOP: Duration = Duration::from_secs(30);

/// What `up` builds.
#[derive(Debug, Clone)]
pub struct Spec {
    pub nodes: usize,
    pub control_replicas: usize,
    pub datapath: Mode,
    /// The operator's mesh root, when given (checked by the caller).
    pub ca_cert: Option<PathBuf>,
    pub ca_key: Option<PathBuf>,
    /// The `slipstream` binary that runs the agent.
    pub program: PathBuf,
}

/// How `up` and `down` talk to the operator and learn of an interruption.
pub struct Io<'a> {
    /// Raised by SIGINT, SIGTERM or SIGHUP: `up` stops and rolls back.
    pub interrupted: &'a dyn Fn() -> bool,
    /// A line of progress (stdout).
    pub say: &'a dyn Fn(&str),
    /// A line about an interruption and its roll-back (stderr).
    pub warn: &'a dyn Fn(&str),
}

/// Why `up` made no cluster. Every variant leaves nothing behind, but
/// `Interrupted`, whose roll-back said what it could not remove.
#[derive(Debug, thiserror::Error)]
pub enum UpError {
    #[error(
        "cluster {cluster:?} is already running (agent pid {pid}); change it with `slipstream apply -f FILE`, or remove it with `slipstream down` first"
    )]
    Running { cluster: String, pid: i32 },
    /// Its agent died (kill -9, crash) but its pods and node proxies run
    /// on: sweeping would kill workloads nobody asked to stop.
    #[error(
        "cluster {cluster:?} has no agent, but its workloads are still running without it ({processes} process(es) in its pods and node proxies); \
         nothing was changed. See them with `slipstream status` (the agent's last recorded state); remove them with \
         `slipstream down`, then run `slipstream up` again"
    )]
    Orphaned { cluster: String, processes: usize },
    #[error("cannot remove the leftovers:\n{}", .0.join("\n"))]
    Leftovers(Vec<String>),
    #[error("interrupted before the cluster was created; nothing was changed")]
    InterruptedBeforeCreating,
    /// Interrupted while the agent came up: rolled back (see `Io::warn`).
    #[error("interrupted")]
    Interrupted,
    #[error("the cluster agent exited ({status}) while creating the cluster; nothing was left behind. Its log:\n{log}")]
    AgentExited { status: String, log: String },
    #[error("the cluster agent did not come up within 60 s; see the log above")]
    AgentTimeout,
    #[error("{0:#}")]
    Other(#[from] anyhow::Error),
}

/// What `down` removed.
#[derive(Debug, PartialEq, Eq)]
pub enum Removed {
    /// There was nothing of the cluster.
    Nothing,
    /// What there was (`Leftovers::describe`).
    Cluster(String),
}

/// `down` could not remove all of the cluster.
#[derive(Debug, thiserror::Error)]
#[error("some of cluster {cluster:?} could not be removed ({left}):\n{}", .problems.join("\n"))]
pub struct DownError {
    pub cluster: String,
    pub left: String,
    pub problems: Vec<String>,
}

/// A cluster `up` made, its agent running.
pub struct Cluster {
    paths: Paths,
    agent: Child,
}

impl Cluster {
    /// Makes the cluster: refuses a live one (or one whose workloads run
    /// without their agent), clears a dead one's leftovers, starts the
    /// agent and waits until it has built the network and answers. On
    /// failure or interruption what it made is removed.
    pub fn up(paths: &Paths, spec: &Spec, io: &Io) -> Result<Cluster, UpError> {
        let cluster = paths.cluster.to_string();
        let left = sweep::find(paths);
        if let Some(pid) = left.agent {
            return Err(UpError::Running { cluster, pid });
        }
        if !left.processes.is_empty() {
            return Err(UpError::Orphaned { cluster, processes: left.processes.len() });
        }
        if !left.is_empty() {
            (io.say)(&format!("removing leftovers of cluster {cluster:?} that did not shut down cleanly: {}", left.describe()));
            let problems = sweep::sweep(paths);
            if !problems.is_empty() {
                return Err(UpError::Leftovers(problems));
            }
        }
        (io.say)(&format!("creating cluster {cluster:?}: {} node(s)", spec.nodes));
        let agent = start_agent(paths, spec, io)?;
        let mut made = Cluster { paths: paths.clone(), agent };
        made.wait_ready(io)?;
        Ok(made)
    }

    /// Waits for the agent to have built the network and to answer.
    fn wait_ready(&mut self, io: &Io) -> Result<(), UpError> {
        let deadline = Instant::now() + AGENT_START;
        loop {
            if let Ok(Some(st)) = self.agent.try_wait() {
                let log = log_tail(&self.paths.agent_log(), 15);
                sweep::sweep(&self.paths);
                return Err(UpError::AgentExited { status: st.to_string(), log });
            }
            if self.paths.socket().exists() && ipc::call(&self.paths.socket(), &Request::Status, Duration::from_secs(5)).is_ok() {
                return Ok(());
            }
            if (io.interrupted)() {
                self.roll_back_interrupted(io);
                return Err(UpError::Interrupted);
            }
            if Instant::now() > deadline {
                let _ = self.agent.kill();
                let _ = self.agent.wait();
                sweep::sweep(&self.paths);
                return Err(UpError::AgentTimeout);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Interrupted after `up` (while applying or waiting for the pods):
    /// removes the half-built cluster, saying so on `io.warn`.
    pub fn roll_back(mut self, io: &Io) {
        self.roll_back_interrupted(io);
    }

    fn roll_back_interrupted(&mut self, io: &Io) {
        let cluster = self.paths.cluster.as_str();
        (io.warn)(&format!("interrupted: removing the half-built cluster {cluster:?} (press Ctrl-C again to leave it as it is)"));
        // Graceful first (the agent stops pods and removes the network), then by name.
        if ipc::call(&self.paths.socket(), &Request::Shutdown, Duration::from_secs(5)).is_ok() {
            let deadline = Instant::now() + AGENT_STOP;
            while Instant::now() < deadline && !matches!(self.agent.try_wait(), Ok(Some(_))) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = self.agent.kill();
        let _ = self.agent.wait();
        let problems = sweep::sweep(&self.paths);
        let left = sweep::find(&self.paths);
        if problems.is_empty() && left.is_empty() {
            (io.warn)(&format!("cluster {cluster:?} removed: nothing of it is left"));
        } else {
            (io.warn)(&format!(
                "some of cluster {cluster:?} could not be removed ({}): {}; run `slipstream down`",
                left.describe(),
                problems.join("; ")
            ));
        }
    }

    /// Removes the cluster named by `paths`: its agent, when alive, stops
    /// the pods with their grace period and removes the network; then
    /// everything left is swept by name. Harmless when there is nothing.
    pub fn down(paths: &Paths, io: &Io) -> Result<Removed, DownError> {
        let cluster = paths.cluster.to_string();
        let left = sweep::find(paths);
        if left.is_empty() {
            return Ok(Removed::Nothing);
        }
        if let Some(pid) = left.agent {
            (io.say)(&format!("stopping cluster {cluster:?} (agent pid {pid})"));
            if ipc::call(&paths.socket(), &Request::Shutdown, Duration::from_secs(5)).is_ok() {
                let deadline = Instant::now() + AGENT_STOP;
                while signals::alive(pid) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        // Then by name, whatever the agent managed to do.
        let problems = sweep::sweep(paths);
        let after = sweep::find(paths);
        if !problems.is_empty() || !after.is_empty() {
            return Err(DownError { cluster, left: after.describe(), problems });
        }
        Ok(Removed::Cluster(left.describe()))
    }
}

/// Starts `slipstream agent` for the cluster, its output to agent.log.
fn start_agent(paths: &Paths, spec: &Spec, io: &Io) -> Result<Child, UpError> {
    use anyhow::Context;
    std::fs::create_dir_all(&paths.state_dir).with_context(|| format!("creating {}", paths.state_dir.display()))?;
    let mut argv = vec![
        spec.program.display().to_string(),
        "--cluster".into(),
        paths.cluster.to_string(),
        "agent".into(),
        "--nodes".into(),
        spec.nodes.to_string(),
        "--control-replicas".into(),
        spec.control_replicas.to_string(),
        "--datapath".into(),
        spec.datapath.as_str().into(),
    ];
    for (flag, p) in [("--ca-cert", &spec.ca_cert), ("--ca-key", &spec.ca_key)] {
        if let Some(p) = p {
            let abs = std::fs::canonicalize(p).with_context(|| format!("{flag} {}", p.display()))?;
            argv.extend([flag.to_string(), abs.display().to_string()]);
        }
    }
    if (io.interrupted)() {
        return Err(UpError::InterruptedBeforeCreating);
    }
    Ok(spawn::spawn_daemon(&argv, &paths.agent_log()).context("starting the cluster agent")?)
}

/// The last `lines` lines of a log, indented.
pub fn log_tail(path: &std::path::Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let v: Vec<&str> = text.lines().collect();
    v[v.len().saturating_sub(lines)..].iter().map(|l| format!("    {l}")).collect::<Vec<_>>().join("\n")
}
