//! S1, pod start, on the cluster: pods created one after the other in a
//! scenario's namespace, each timed from its create request to its first
//! answer (`podstart` says how), each deleted and gone before the next.

use super::cluster::KubeCluster;
use super::{objects, podstart};
use crate::cluster::{interrupted, Interrupted};
use crate::figures::Outcome;
use anyhow::{anyhow, bail};
use std::time::{Duration, Instant, UNIX_EPOCH};

/// How long one pod may take to be answered and stop.
const POD_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a deleted pod may take to be gone.
const GONE_TIMEOUT: Duration = Duration::from_secs(60);

/// One repetition: `pods` pods in `ns` on `node`. Err only when
/// interrupted or when the cluster cannot be reached; a pod that fails is
/// left out of the figures with a warning.
pub fn run(cluster: &KubeCluster, ns: &str, node: &str, rep: u32, pods: u32) -> anyhow::Result<Outcome> {
    let (mut times, mut failures, mut unanswered) = (Vec::new(), Vec::new(), 0);
    for n in 1..=pods {
        if interrupted() {
            return Err(Interrupted.into());
        }
        let pod = objects::pod_start(ns, node, rep, n);
        let name = objects::pod_start_name(rep, n);
        match one(cluster, ns, &name, &pod) {
            Ok((t, a)) => {
                times.push(t);
                unanswered += a;
            }
            Err(e) if e.is::<Interrupted>() => {
                let _ = cluster.delete_pod(ns, &name, None);
                return Err(e);
            }
            Err(e) => failures.push(format!("{name}: {e:#}")),
        }
        cluster.delete_pod(ns, &name, Some(GONE_TIMEOUT))?;
    }
    podstart::outcome(&times, &failures, unanswered).map_err(|e| anyhow!(e))
}

/// One pod: its times and the requests that went unanswered first.
fn one(cluster: &KubeCluster, ns: &str, name: &str, pod: &serde_json::Value) -> anyhow::Result<(podstart::PodTimes, u32)> {
    let created = cluster.create_timed(pod)?;
    let t0 = Instant::now();
    loop {
        let phase = cluster.pod(ns, name)?.and_then(|p| p.status).and_then(|s| s.phase).unwrap_or_default();
        match phase.as_str() {
            "Succeeded" => break,
            "Failed" => bail!("the pod failed: {}", cluster.log_with_timestamps(ns, name).unwrap_or_default().trim()),
            _ if interrupted() => return Err(Interrupted.into()),
            _ if t0.elapsed() > POD_TIMEOUT => bail!("not answered within {}s (phase {phase:?})", POD_TIMEOUT.as_secs()),
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    let log = cluster.log_with_timestamps(ns, name)?;
    let answer = podstart::first_answer(&log).map_err(|e| anyhow!(e))?;
    let created_ns = created.duration_since(UNIX_EPOCH)?.as_nanos() as i128;
    let ms = |at: i128| (at - created_ns) as f64 / 1e6;
    Ok((podstart::PodTimes { answered_ms: ms(answer.at_ns), started_ms: answer.started_ns.map(ms) }, answer.failed_attempts))
}
