//! CPU and memory of the mesh processes: every cgroup under
//! `<cgroup2>/slipstream/<cluster>/nodes/` (one node proxy per node), and
//! the waypoints' pods (`pods/<ns>.waypoint-...`: the waypoint process and
//! its pod's two small supervisors, pod-init and PID 1). CPU
//! from the cgroup's `cpu.stat`; memory from `/proc/<pid>/status` (VmHWM
//! reset by writing 5 to `clear_refs`), since hybrid cgroup layouts have no
//! memory controller in v2.

use crate::results::{ProcSample, ProcUsage};
use slipstream_testbed::sys::cgroup;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct MeshProcess {
    /// `node proxy node1`.
    pub name: String,
    pub cgroup: PathBuf,
}

/// The mesh processes of a cluster, by cgroup, in name order. Add new kinds
/// of mesh process (waypoints, control plane) here.
pub fn discover(cgroup_root: &Path) -> Vec<MeshProcess> {
    let mut out: Vec<MeshProcess> = std::fs::read_dir(cgroup_root.join("nodes"))
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
                .map(|e| MeshProcess { name: format!("node proxy {}", e.file_name().to_string_lossy()), cgroup: e.path() })
                .collect()
        })
        .unwrap_or_default();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    let mut waypoints: Vec<MeshProcess> = std::fs::read_dir(cgroup_root.join("pods"))
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().to_string();
                    let (ns, pod) = name.split_once('.')?;
                    pod.starts_with(&format!("{}-", crate::manifests::WAYPOINT))
                        .then(|| MeshProcess { name: format!("waypoint {ns}/{pod}"), cgroup: e.path() })
                })
                .collect()
        })
        .unwrap_or_default();
    waypoints.sort_by(|a, b| a.name.cmp(&b.name));
    out.extend(waypoints);
    out
}

/// Fails when a mesh process cannot be measured.
pub fn check(procs: &[MeshProcess]) -> Result<(), String> {
    if procs.is_empty() {
        return Err("no mesh process found (no node proxy cgroup)".into());
    }
    for p in procs {
        if cgroup::cpu_usage(&p.cgroup).is_none() {
            return Err(format!("cannot read CPU usage of the {}: no usage_usec in {}", p.name, p.cgroup.join("cpu.stat").display()));
        }
        if pids(p).is_empty() {
            return Err(format!("the {} is not running (cgroup {} is empty)", p.name, p.cgroup.display()));
        }
    }
    Ok(())
}

/// A `kB` field of /proc/<pid>/status (`VmHWM:   16080 kB`).
pub fn status_kb(status: &str, field: &str) -> Option<u64> {
    status.lines().find_map(|l| {
        let v = l.strip_prefix(field)?.strip_prefix(':')?;
        v.trim().trim_end_matches("kB").trim().parse().ok()
    })
}

fn mb(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

fn pids(p: &MeshProcess) -> Vec<i32> {
    let mut v = cgroup::pids_recursive(&p.cgroup);
    v.sort_unstable();
    v
}

/// Sum of a status field over the pids, in MB (2^20 bytes).
fn memory(pids: &[i32], field: &str) -> f64 {
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .filter_map(|s| status_kb(&s, field))
        .map(mb)
        .sum()
}

pub struct Before {
    cpu: Vec<Option<Duration>>,
    pids: Vec<Vec<i32>>,
}

/// Starts measuring: resets every mesh process's peak RSS, reads its CPU.
pub fn begin(procs: &[MeshProcess]) -> Before {
    let pids: Vec<Vec<i32>> = procs.iter().map(pids).collect();
    for pid in pids.iter().flatten() {
        // Resets VmHWM to the current RSS (Linux 4.0+).
        let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
    }
    Before { cpu: procs.iter().map(|p| cgroup::cpu_usage(&p.cgroup)).collect(), pids }
}

pub fn end(procs: &[MeshProcess], before: &Before) -> Vec<ProcUsage> {
    procs
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let now = pids(p);
            let cpu = match (before.cpu.get(i).copied().flatten(), cgroup::cpu_usage(&p.cgroup)) {
                (Some(a), Some(b)) => b.saturating_sub(a).as_secs_f64(),
                // `check` made sure cpu.stat exists; a proxy restart recreates nothing.
                _ => 0.0,
            };
            ProcUsage {
                process: p.name.clone(),
                restarted: before.pids.get(i) != Some(&now),
                peak_rss_mb: memory(&now, "VmHWM"),
                rss_mb: memory(&now, "VmRSS"),
                cpu_s: cpu,
                pids: now,
            }
        })
        .collect()
}

/// Whether `pid` is a pod sandbox's init (`slipstream pod-init ...`).
fn is_pod_init(pid: i32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.split(|b| *b == 0).nth(1) == Some(b"pod-init"))
}

/// Open file descriptors of every mesh process.
pub fn fd_counts(procs: &[MeshProcess]) -> Vec<usize> {
    procs
        .iter()
        .map(|p| pids(p).iter().map(|pid| std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)).sum())
        .collect()
}

/// Whether every count is back within `slack` of where it was.
pub fn drained(before: &[usize], now: &[usize], slack: usize) -> bool {
    before.len() == now.len() && before.iter().zip(now).all(|(b, n)| *n <= b + slack)
}

/// Waits until the mesh processes have closed what they opened since
/// `before` for R1's `held` connections, so that the next step does not pay
/// for their teardown: every count back within 64 of `before`, or within
/// `held / 10` and unchanged for a second (a proxy may keep a few new
/// descriptors, such as pooled tunnels). The time it took, or None after
/// `timeout` or when `stop()`.
pub fn wait_drained(procs: &[MeshProcess], before: &[usize], held: usize, timeout: Duration, stop: &dyn Fn() -> bool) -> Option<Duration> {
    const POLL: Duration = Duration::from_millis(200);
    let t0 = std::time::Instant::now();
    let (mut last, mut stable) = (Vec::new(), 0);
    loop {
        let now = fd_counts(procs);
        stable = if now == last { stable + 1 } else { 0 };
        if drained(before, &now, 64) || (stable >= 5 && drained(before, &now, held / 10)) {
            return Some(t0.elapsed());
        }
        last = now;
        if t0.elapsed() > timeout || stop() {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

/// Current resident memory of every mesh process.
pub fn sample(procs: &[MeshProcess]) -> Vec<ProcSample> {
    procs
        .iter()
        .map(|p| {
            let pids = pids(p);
            if !crate::results::is_waypoint(&p.name) {
                return ProcSample {
                    process: p.name.clone(),
                    rss_mb: memory(&pids, "VmRSS"),
                    anon_mb: Some(memory(&pids, "RssAnon")),
                    pod_rss_mb: None,
                    pids,
                };
            }
            // A waypoint's cgroup is its pod: the waypoint and the
            // sandbox's pod-init processes (what a pause container is
            // to Kubernetes, which leaves it out of a container's memory).
            let own: Vec<i32> = pids.iter().copied().filter(|pid| !is_pod_init(*pid)).collect();
            ProcSample {
                process: p.name.clone(),
                rss_mb: memory(&own, "VmRSS"),
                anon_mb: Some(memory(&own, "RssAnon")),
                pod_rss_mb: Some(memory(&pids, "VmRSS")),
                pids,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_status_fields() {
        let s = "Name:\tslipstream\nVmPeak:\t  1000 kB\nVmHWM:\t   16080 kB\nVmRSS:\t   14412 kB\n";
        assert_eq!(status_kb(s, "VmHWM"), Some(16080));
        assert_eq!(status_kb(s, "VmRSS"), Some(14412));
        assert_eq!(status_kb(s, "VmSwap"), None);
        assert_eq!(status_kb("VmRSSx:\t1 kB\n", "VmRSS"), None);
        assert!((mb(16080) - 15.703125).abs() < 1e-9);
    }

    #[test]
    fn drained_within_slack() {
        assert!(drained(&[100, 120], &[164, 100], 64));
        assert!(!drained(&[100, 120], &[165, 100], 64));
        assert!(!drained(&[100], &[100, 100], 64));
    }

    #[test]
    fn discovers_node_cgroups_in_order() {
        let d = tempfile::tempdir().unwrap();
        for n in ["node2", "node1"] {
            std::fs::create_dir_all(d.path().join("nodes").join(n)).unwrap();
        }
        std::fs::write(d.path().join("nodes/cgroup.procs"), "").unwrap();
        let names: Vec<String> = discover(d.path()).into_iter().map(|p| p.name).collect();
        assert_eq!(names, ["node proxy node1", "node proxy node2"]);
        assert!(discover(&d.path().join("missing")).is_empty());
    }
}
