//! The files the agent shares with the node proxy in its run directory
//! (a hostPath both containers mount): `<node>/pods.json`, the pods the
//! proxy must serve, written by the agent; `<node>/served.json`, the pods
//! whose listeners are bound, written by the proxy.

use slipstream_core::{NodePods, Served};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

pub fn pods_file(run_dir: &Path, node: &str) -> PathBuf {
    run_dir.join(node).join("pods.json")
}

pub fn served_file(run_dir: &Path, node: &str) -> PathBuf {
    run_dir.join(node).join("served.json")
}

/// Writes the pod list atomically (the proxy never reads half a file).
pub fn write_pods(run_dir: &Path, node: &str, pods: &NodePods) -> std::io::Result<()> {
    let path = pods_file(run_dir, node);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(pods)?)?;
    std::fs::rename(&tmp, &path)
}

/// The pods the last agent registered (an agent that restarts adopts them).
pub fn read_pods(run_dir: &Path, node: &str) -> NodePods {
    std::fs::read(pods_file(run_dir, node)).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default()
}

/// The workload uids the proxy reports served (none when it has not yet).
pub fn read_served(run_dir: &Path, node: &str) -> BTreeSet<String> {
    std::fs::read(served_file(run_dir, node))
        .ok()
        .and_then(|b| serde_json::from_slice::<Served>(&b).ok())
        .map(|s| s.uids.into_iter().collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use slipstream_core::PodRegistration;

    #[test]
    fn pods_round_trip_and_missing_files_are_empty() {
        let d = tempfile::tempdir().unwrap();
        assert!(read_pods(d.path(), "n1").pods.is_empty());
        assert!(read_served(d.path(), "n1").is_empty());
        let pods = NodePods {
            pods: vec![PodRegistration {
                uid: "K//Pod/a/b".into(),
                netns: "/var/run/netns/cni-1".into(),
                ip: Some("10.0.0.5".parse().unwrap()),
            }],
        };
        write_pods(d.path(), "n1", &pods).unwrap();
        assert_eq!(read_pods(d.path(), "n1"), pods);
        std::fs::write(served_file(d.path(), "n1"), r#"{"uids":["K//Pod/a/b"]}"#).unwrap();
        assert!(read_served(d.path(), "n1").contains("K//Pod/a/b"));
    }
}
