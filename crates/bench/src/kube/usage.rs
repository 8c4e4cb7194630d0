//! CPU and memory of the mesh's containers on Kubernetes, from the
//! kubelet's stats summary (`/api/v1/nodes/<node>/proxy/stats/summary`,
//! through the API server): the node proxies (container `proxy` of the
//! DaemonSet's pods) and the waypoints of the bench's namespaces. Pure:
//! parsing and the usage between two samples; the runner fetches them.
//!
//! The kubelet refreshes these figures on its own schedule (about every 10
//! to 15 s), each with the time it was taken: CPU is the counter's
//! difference between a sample from before a step and one taken after it
//! ended, memory the working set of the samples seen meanwhile.

use super::podstart::parse_rfc3339_ns;
use crate::results::{ProcSample, ProcUsage};
use serde_json::Value;
use std::collections::BTreeMap;

/// The DaemonSet whose `proxy` containers are the node proxies.
pub const NODE_POD_PREFIX: &str = "slipstream-node-";
pub const PROXY_CONTAINER: &str = "proxy";
/// A waypoint's pod is named after its Gateway (`waypoint-<hash>-<id>`).
pub const WAYPOINT_POD_PREFIX: &str = "waypoint-";

/// One mesh container at one kubelet sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// `node proxy worker-1`, `waypoint bench-l7/waypoint-...`.
    pub process: String,
    /// Its pod's name: a new name is a new pod (a restart).
    pub pod: String,
    pub cpu_ns: u64,
    /// When the kubelet read the CPU counter (ns since the epoch).
    pub cpu_at_ns: i128,
    pub working_set_mb: f64,
    pub anon_mb: f64,
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// The mesh containers of one node's summary: the node proxy (pods of
/// `install_ns` named after the DaemonSet) and waypoints of the namespaces
/// in `bench_ns`.
pub fn parse(summary: &Value, install_ns: &str, bench_ns: &[&str]) -> Vec<Sample> {
    let node = summary["node"]["nodeName"].as_str().unwrap_or("?");
    let mut out = Vec::new();
    for pod in summary["pods"].as_array().into_iter().flatten() {
        let (ns, name) = (pod["podRef"]["namespace"].as_str().unwrap_or(""), pod["podRef"]["name"].as_str().unwrap_or(""));
        let process = if ns == install_ns && name.starts_with(NODE_POD_PREFIX) {
            format!("node proxy {node}")
        } else if bench_ns.contains(&ns) && name.starts_with(WAYPOINT_POD_PREFIX) {
            format!("waypoint {ns}/{name}")
        } else {
            continue;
        };
        let is_proxy = process.starts_with("node proxy ");
        for c in pod["containers"].as_array().into_iter().flatten() {
            if is_proxy && c["name"] != PROXY_CONTAINER {
                continue;
            }
            let (Some(cpu_ns), Some(at)) =
                (c["cpu"]["usageCoreNanoSeconds"].as_u64(), c["cpu"]["time"].as_str().and_then(parse_rfc3339_ns))
            else {
                continue;
            };
            out.push(Sample {
                process: process.clone(),
                pod: name.to_string(),
                cpu_ns,
                cpu_at_ns: at,
                working_set_mb: mb(c["memory"]["workingSetBytes"].as_u64().unwrap_or(0)),
                anon_mb: mb(c["memory"]["rssBytes"].as_u64().unwrap_or(0)),
            });
        }
    }
    out
}

/// Whether every container of `now` was sampled by the kubelet after
/// `after_ns` (so that its counter covers a step that ended then).
pub fn all_after(now: &[Sample], after_ns: i128) -> bool {
    !now.is_empty() && now.iter().all(|s| s.cpu_at_ns > after_ns)
}

/// What each mesh container used between `before` and `after`, with the
/// largest working set among `seen` (the samples taken meanwhile, `after`
/// among them). A container whose pod changed or whose counter went back
/// restarted: its figures are partial.
pub fn usage(before: &[Sample], seen: &[Sample], after: &[Sample]) -> Vec<ProcUsage> {
    let mut peak: BTreeMap<&str, f64> = BTreeMap::new();
    for s in seen.iter().chain(after) {
        let p = peak.entry(s.process.as_str()).or_insert(0.0);
        *p = p.max(s.working_set_mb);
    }
    after
        .iter()
        .map(|a| {
            let b = before.iter().find(|b| b.process == a.process);
            let restarted = b.is_none_or_changed(a);
            ProcUsage {
                process: a.process.clone(),
                pids: vec![],
                cpu_s: b.filter(|_| !restarted).map(|b| (a.cpu_ns - b.cpu_ns) as f64 / 1e9).unwrap_or(0.0),
                peak_rss_mb: peak.get(a.process.as_str()).copied().unwrap_or(a.working_set_mb),
                rss_mb: a.working_set_mb,
                restarted,
            }
        })
        .collect()
}

/// MSRV 1.80: no `Option::is_none_or`.
trait Changed {
    fn is_none_or_changed(&self, now: &Sample) -> bool;
}

impl Changed for Option<&Sample> {
    fn is_none_or_changed(&self, now: &Sample) -> bool {
        match self {
            Some(b) => b.pod != now.pod || b.cpu_ns > now.cpu_ns,
            None => true,
        }
    }
}

/// The idle memory of every mesh container, as the report shows it.
pub fn idle(samples: &[Sample]) -> Vec<ProcSample> {
    samples
        .iter()
        .map(|s| ProcSample {
            process: s.process.clone(),
            pids: vec![],
            rss_mb: s.working_set_mb,
            anon_mb: Some(s.anon_mb),
            pod_rss_mb: None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn summary(node: &str, cpu: u64, time: &str) -> Value {
        let c = |name: &str, cpu: u64| {
            json!({"name": name, "cpu": {"time": time, "usageCoreNanoSeconds": cpu},
                   "memory": {"time": time, "workingSetBytes": 4 * 1024 * 1024, "rssBytes": 1024 * 1024}})
        };
        json!({"node": {"nodeName": node}, "pods": [
            {"podRef": {"namespace": "slipstream-system", "name": "slipstream-node-abcde"}, "containers": [c("agent", 9), c("proxy", cpu)]},
            {"podRef": {"namespace": "slipstream-system", "name": "slipstream-control-1"}, "containers": [c("control", 5)]},
            {"podRef": {"namespace": "bench-l7", "name": "waypoint-5d64-x"}, "containers": [c("istio-proxy", 2 * cpu)]},
            {"podRef": {"namespace": "bookinfo", "name": "waypoint-9-y"}, "containers": [c("istio-proxy", 1)]},
            {"podRef": {"namespace": "bench-l7", "name": "server"}, "containers": [c("fortio", 1)]}
        ]})
    }

    #[test]
    fn picks_the_node_proxy_and_the_bench_waypoints() {
        let s = parse(&summary("worker-1", 1_000_000_000, "2026-11-28T10:38:16Z"), "slipstream-system", &["bench-l7"]);
        let names: Vec<&str> = s.iter().map(|x| x.process.as_str()).collect();
        assert_eq!(names, ["node proxy worker-1", "waypoint bench-l7/waypoint-5d64-x"]);
        assert_eq!((s[0].cpu_ns, s[0].working_set_mb, s[0].anon_mb), (1_000_000_000, 4.0, 1.0));
        assert!(parse(&json!({}), "slipstream-system", &[]).is_empty());
    }

    #[test]
    fn usage_between_two_samples() {
        let before = parse(&summary("worker-1", 1_000_000_000, "2026-11-28T10:38:16Z"), "slipstream-system", &["bench-l7"]);
        let after = parse(&summary("worker-1", 3_500_000_000, "2026-11-28T10:38:33Z"), "slipstream-system", &["bench-l7"]);
        let end = parse_rfc3339_ns("2026-11-28T10:38:30Z").unwrap();
        assert!(all_after(&after, end));
        assert!(!all_after(&before, end));
        assert!(!all_after(&[], end));
        let mut seen = after.clone();
        seen[0].working_set_mb = 9.0;
        let u = usage(&before, &seen, &after);
        assert_eq!(u.len(), 2);
        assert_eq!((u[0].cpu_s, u[0].peak_rss_mb, u[0].rss_mb, u[0].restarted), (2.5, 9.0, 4.0, false));
        assert_eq!(u[1].cpu_s, 5.0);
        // A new pod is a restart: no CPU figure from two processes.
        let mut moved = after.clone();
        moved[0].pod = "slipstream-node-zzzzz".into();
        let u = usage(&before, &[], &moved);
        assert!(u[0].restarted);
        assert_eq!(u[0].cpu_s, 0.0);
        assert!(usage(&[], &[], &after).iter().all(|p| p.restarted), "nothing before it");
    }

    #[test]
    fn idle_memory_is_the_working_set_with_its_anonymous_part() {
        let s = parse(&summary("worker-2", 1, "2026-11-28T10:38:16Z"), "slipstream-system", &[]);
        let i = idle(&s);
        assert_eq!(i.len(), 1);
        assert_eq!((i[0].process.as_str(), i[0].rss_mb, i[0].anon_mb), ("node proxy worker-2", 4.0, Some(1.0)));
    }
}
