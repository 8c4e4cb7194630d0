//! Names and paths of everything a cluster creates. Cleanup finds resources
//! by these names alone, so it works without any state file.

use std::fmt;
use std::path::{Path, PathBuf};

/// A cluster's name: `[a-z0-9-]{1,20}`. No dots, so that `<cluster>.` is an
/// unambiguous prefix of every network namespace the cluster owns.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClusterName(String);

impl ClusterName {
    pub fn new(s: &str) -> Result<Self, String> {
        let ok = !s.is_empty()
            && s.len() <= 20
            && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !s.starts_with('-');
        if ok {
            Ok(ClusterName(s.to_string()))
        } else {
            Err(format!("invalid cluster name {s:?}: use 1 to 20 lower-case letters, digits and '-', not starting with '-'"))
        }
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ClusterName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

pub const DEFAULT_CLUSTER: &str = "slipstream";

/// The directory every cluster keeps its state under: `$SLIPSTREAM_RUN_DIR`,
/// else `/run/slipstream`.
pub fn run_dir() -> PathBuf {
    std::env::var_os("SLIPSTREAM_RUN_DIR").map(PathBuf::from).unwrap_or_else(|| "/run/slipstream".into())
}

/// Every location a cluster uses on the machine.
#[derive(Debug, Clone)]
pub struct Paths {
    pub cluster: ClusterName,
    /// `/run/slipstream/<cluster>`: state, socket, logs.
    pub state_dir: PathBuf,
    /// `<cgroup2>/slipstream/<cluster>`.
    pub cgroup_root: PathBuf,
    /// `/sys/fs/bpf/slipstream/<cluster>`.
    pub bpf_dir: PathBuf,
}

impl Paths {
    /// The cluster's paths, its cgroup root under `cgroup2` (the cgroup v2
    /// mount, found by `sys::cgroup::cgroup2_mount`).
    pub fn new(cluster: ClusterName, cgroup2: &Path) -> Self {
        let run = run_dir();
        let cg = cgroup2;
        Paths {
            state_dir: run.join(cluster.as_str()),
            cgroup_root: cg.join("slipstream").join(cluster.as_str()),
            bpf_dir: PathBuf::from("/sys/fs/bpf/slipstream").join(cluster.as_str()),
            cluster,
        }
    }
    pub fn socket(&self) -> PathBuf {
        self.state_dir.join("agent.sock")
    }
    pub fn state_file(&self) -> PathBuf {
        self.state_dir.join("state.json")
    }
    pub fn agent_pid_file(&self) -> PathBuf {
        self.state_dir.join("agent.pid")
    }
    pub fn agent_log(&self) -> PathBuf {
        self.state_dir.join("agent.log")
    }
    pub fn pod_dir(&self, ns: &str, pod: &str) -> PathBuf {
        self.state_dir.join("pods").join(ns).join(pod)
    }
    pub fn container_log(&self, ns: &str, pod: &str, container: &str) -> PathBuf {
        self.pod_dir(ns, pod).join(format!("{container}.log"))
    }
    pub fn pod_cgroup(&self, ns: &str, pod: &str) -> PathBuf {
        self.cgroup_root.join("pods").join(format!("{ns}.{pod}"))
    }
    pub fn node_proxy_cgroup(&self, node: &str) -> PathBuf {
        self.cgroup_root.join("nodes").join(node)
    }
    pub fn node_proxy_log(&self, node: &str) -> PathBuf {
        self.state_dir.join("nodes").join(format!("{node}.log"))
    }
    /// Configuration the agent writes for the node proxies.
    pub fn mesh_dir(&self) -> PathBuf {
        self.state_dir.join("mesh")
    }
    /// The objects the agent holds, as Kubernetes would serve them: the
    /// control plane's `dir` source.
    pub fn objects_dir(&self) -> PathBuf {
        self.state_dir.join("objects")
    }
    /// The control plane's own files: node tokens, logs.
    pub fn control_dir(&self) -> PathBuf {
        self.state_dir.join("control")
    }
    /// Every node's token (readable by root only): what the control plane
    /// checks callers against.
    /// The waypoint pods' tokens (the control plane's `--workload-tokens`).
    pub fn workload_tokens_file(&self) -> PathBuf {
        self.control_dir().join("workload-tokens.json")
    }
    pub fn node_tokens_file(&self) -> PathBuf {
        self.control_dir().join("node-tokens.json")
    }
    /// One node's token, given to its node proxy.
    pub fn node_token_file(&self, node: &str) -> PathBuf {
        self.state_dir.join("nodes").join(format!("{node}.token"))
    }
    pub fn control_log(&self, replica: usize) -> PathBuf {
        self.control_dir().join(format!("control{replica}.log"))
    }
    pub fn control_cgroup(&self, replica: usize) -> PathBuf {
        self.cgroup_root.join("control").join(format!("control{replica}"))
    }
    pub fn ca_dir(&self) -> PathBuf {
        self.state_dir.join("ca")
    }
    /// Where the agent records the path of the operator's `--ca-key` (which
    /// it copied into `ca_dir`), so that every pod process, including
    /// `exec`'s, gets that file covered.
    pub fn operator_key_record(&self) -> PathBuf {
        self.ca_dir().join("operator-key-path")
    }
    pub fn agent_cgroup(&self) -> PathBuf {
        self.cgroup_root.join("agent")
    }
    pub fn netns_prefix(&self) -> String {
        format!("{}.", self.cluster)
    }
    pub fn fabric_netns(&self) -> String {
        format!("{}.fabric", self.cluster)
    }
    /// Control plane replica N (1-based), on the fabric like a node.
    pub fn control_netns(&self, replica: usize) -> String {
        format!("{}.control{replica}", self.cluster)
    }
    pub fn node_netns(&self, node: &str) -> String {
        format!("{}.node.{node}", self.cluster)
    }
    /// Pod namespaces: `<cluster>.pod.<ns>.<pod>`; both parts are DNS labels
    /// of at most 63 characters, so the name stays far below NAME_MAX.
    pub fn pod_netns(&self, ns: &str, pod: &str) -> String {
        format!("{}.pod.{ns}.{pod}", self.cluster)
    }
}

pub fn netns_path(name: &str) -> PathBuf {
    Path::new("/run/netns").join(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_names() {
        assert!(ClusterName::new("slipstream").is_ok());
        assert!(ClusterName::new("t-1").is_ok());
        assert!(ClusterName::new("a.b").is_err(), "dots would make netns prefixes ambiguous");
        assert!(ClusterName::new("").is_err());
        assert!(ClusterName::new("-x").is_err());
        assert!(ClusterName::new(&"a".repeat(21)).is_err());
    }
}
