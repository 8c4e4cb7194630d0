//! Finding and removing everything a cluster made, by name alone: works
//! after a crash, a `kill -9` of any part, or a half-finished `up`.

use crate::names::Paths;
use crate::sys::{cgroup, net, signals};
use std::time::Duration;

/// What of a cluster exists on this machine right now.
#[derive(Debug, Default)]
pub struct Leftovers {
    pub netns: Vec<String>,
    pub cgroup: bool,
    pub processes: Vec<i32>,
    pub state_dir: bool,
    pub bpf: bool,
    /// The agent's pid when it is alive.
    pub agent: Option<i32>,
}

impl Leftovers {
    pub fn is_empty(&self) -> bool {
        self.netns.is_empty() && !self.cgroup && self.processes.is_empty() && !self.state_dir && !self.bpf
    }

    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.netns.is_empty() {
            parts.push(format!("{} network namespace(s)", self.netns.len()));
        }
        if !self.processes.is_empty() {
            parts.push(format!("{} process(es)", self.processes.len()));
        }
        if self.cgroup {
            parts.push("cgroups".into());
        }
        if self.state_dir {
            parts.push("state directory".into());
        }
        if self.bpf {
            parts.push("pinned BPF objects".into());
        }
        parts.join(", ")
    }
}

pub fn find(paths: &Paths) -> Leftovers {
    let agent = std::fs::read_to_string(paths.agent_pid_file())
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .filter(|pid| signals::alive(*pid) && is_our_agent(*pid, paths));
    Leftovers {
        netns: net::list_netns(&paths.netns_prefix()),
        cgroup: paths.cgroup_root.exists(),
        processes: cgroup::pids_recursive(&paths.cgroup_root),
        state_dir: paths.state_dir.exists(),
        bpf: paths.bpf_dir.exists(),
        agent,
    }
}

/// A pid file can outlive its process and the pid be reused: check that the
/// process really is this cluster's agent.
fn is_our_agent(pid: i32, paths: &Paths) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
    let args: Vec<String> = cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    args.iter().any(|a| a == "agent") && args.iter().any(|a| a == paths.cluster.as_str())
}

/// Removes everything; returns what could not be removed (empty = clean).
pub fn sweep(paths: &Paths) -> Vec<String> {
    let mut problems = Vec::new();
    if let Err(e) = cgroup::kill_tree(&paths.cgroup_root, Duration::from_secs(10)) {
        problems.push(e);
    }
    for ns in net::list_netns(&paths.netns_prefix()) {
        if let Err(e) = net::del_netns(&ns) {
            problems.push(e.to_string());
        }
    }
    if let Err(e) = cgroup::remove_tree_patiently(&paths.cgroup_root, Duration::from_secs(30)) {
        problems.push(e);
    }
    // Remove the per-machine parent too when we were its last cluster.
    if let Some(parent) = paths.cgroup_root.parent() {
        let _ = std::fs::remove_dir(parent);
    }
    for dir in [&paths.bpf_dir, &paths.state_dir] {
        if dir.exists() {
            if let Err(e) = std::fs::remove_dir_all(dir) {
                problems.push(format!("cannot remove {}: {e}", dir.display()));
            }
        }
    }
    if let Some(parent) = paths.bpf_dir.parent() {
        let _ = std::fs::remove_dir(parent);
    }
    if let Some(parent) = paths.state_dir.parent() {
        let _ = std::fs::remove_dir(parent);
    }
    problems
}
