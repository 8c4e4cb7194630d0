//! What must hold before a run starts, each failing with what to do about
//! it: root, the load tools on the pods' PATH, no cluster named `bench`,
//! enough file descriptors for the held connections.

use anyhow::{bail, Context};
use slipstream_testbed::{sweep, Paths};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

/// The fortio version BENCHMARKS.md pins.
pub const FORTIO_VERSION: &str = "1.63.0";

pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0")))
        .unwrap_or(false)
}

pub fn require_root() -> anyhow::Result<()> {
    if !is_root() {
        bail!("`slipstream bench` needs root (it builds a local cluster of network namespaces); run it with sudo");
    }
    Ok(())
}

/// `name` in one of the `:`-separated directories.
pub fn find_in(path: &str, name: &str) -> Option<PathBuf> {
    path.split(':').filter(|d| !d.is_empty()).map(|d| PathBuf::from(d).join(name)).find(|p| p.is_file())
}

/// `iperf 3.12 (cJSON 1.7.15)` -> `3.12`
pub fn iperf_version(first_line: &str) -> Option<String> {
    let mut w = first_line.split_whitespace();
    (w.next()? == "iperf").then(|| w.next().map(String::from)).flatten()
}

fn output(tool: &PathBuf, args: &[&str]) -> String {
    Command::new(tool)
        .args(args)
        .output()
        .map(|o| format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
        .unwrap_or_default()
}

/// Finds fortio and iperf3 where the pods will look for them, and their
/// versions. Warns when fortio is not the pinned version.
pub fn tools() -> anyhow::Result<BTreeMap<String, String>> {
    let path = slipstream_testbed::sys::spawn::pod_path();
    let mut found = BTreeMap::new();
    for (name, how) in [
        ("fortio", format!("it installs fortio v{FORTIO_VERSION} with `go install`, as BENCHMARKS.md says")),
        ("iperf3", "it installs iperf3 from Debian".to_string()),
    ] {
        let Some(tool) = find_in(&path, name) else {
            bail!("{name} not found: run scripts/setup.sh ({how}); searched the pods' PATH {path}");
        };
        let version = match name {
            "fortio" => output(&tool, &["version"]).lines().next().unwrap_or("").trim().to_string(),
            _ => output(&tool, &["--version"]).lines().next().and_then(iperf_version).unwrap_or_default(),
        };
        if version.is_empty() {
            bail!("{} does not run (no version): reinstall it with scripts/setup.sh", tool.display());
        }
        if name == "fortio" && version != FORTIO_VERSION {
            eprintln!("warning: fortio {version} found at {}; BENCHMARKS.md pins {FORTIO_VERSION}", tool.display());
        }
        found.insert(name.to_string(), version);
    }
    Ok(found)
}

pub fn cluster_free(paths: &Paths) -> anyhow::Result<()> {
    if let Some(pid) = sweep::find(paths).agent {
        let c = paths.cluster.as_str();
        bail!(
            "a cluster named {c:?} is already running (agent pid {pid}): another benchmark may be in progress; \
             if not, remove it with `slipstream --cluster {c} down`"
        );
    }
    Ok(())
}

/// File descriptors the busiest process of the cluster may need to hold
/// `connections` through the mesh: a node proxy can use two per proxied
/// connection, plus its listeners, tunnels and files.
pub fn nofile_needed(connections: usize) -> u64 {
    2 * connections as u64 + 4096
}

/// Raises RLIMIT_NOFILE to at least `need`: the hard limit too when the
/// bench may (CAP_SYS_RESOURCE), else the soft limit to the hard one, with
/// a warning. The cluster started afterwards inherits it: the node proxies
/// (which raise their soft limit to the hard one) and the servers hold the
/// connections. Returns the limit in force.
pub fn raise_nofile(need: u64) -> anyhow::Result<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let cur = getrlimit(Resource::Nofile);
    let soft = cur.current.unwrap_or(u64::MAX);
    let hard = cur.maximum.unwrap_or(u64::MAX);
    if soft >= need && hard >= need {
        return Ok(soft);
    }
    let wanted = Rlimit { current: Some(need.max(soft)), maximum: Some(hard.max(need)) };
    if setrlimit(Resource::Nofile, wanted).is_ok() {
        return Ok(need.max(soft));
    }
    setrlimit(Resource::Nofile, Rlimit { current: Some(hard), maximum: Some(hard) })
        .with_context(|| format!("raising the open-file limit from {soft} to {hard}"))?;
    eprintln!(
        "warning: the open-file limit is capped at {hard} here (no CAP_SYS_RESOURCE to raise it to {need}): \
         a process that needs two descriptors per held connection cannot hold them all"
    );
    Ok(hard)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_lookup() {
        assert_eq!(iperf_version("iperf 3.12 (cJSON 1.7.15)").as_deref(), Some("3.12"));
        assert_eq!(iperf_version("something else"), None);
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("fortio"), "").unwrap();
        let path = format!("/nonexistent::{}", d.path().display());
        assert_eq!(find_in(&path, "fortio"), Some(d.path().join("fortio")));
        assert_eq!(find_in(&path, "iperf3"), None);
        assert_eq!(nofile_needed(10_000), 24_096);
    }
}
