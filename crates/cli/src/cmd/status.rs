use crate::common::{self, Ctx};
use anyhow::bail;
use slipstream_testbed::status::ClusterStatus;

pub fn run(ctx: &Ctx, output: &str) -> anyhow::Result<()> {
    let st = ctx.status()?;
    match output {
        "json" => {
            if !st.agent.running {
                eprintln!("{}", agent_down(&st));
            }
            common::out(&format!("{}\n", serde_json::to_string_pretty(&st)?))
        }
        "table" | "wide" => common::out(&table(&st)),
        other => bail!("unknown output format {other:?}: use table or json"),
    }
}

/// What `status` says when the agent does not answer.
fn agent_down(st: &ClusterStatus) -> String {
    format!(
        "THE CLUSTER AGENT IS NOT RUNNING (pid {} is gone): what follows is its last recorded state, not the live one. \
         Its pods may still be running, unsupervised; remove everything with `slipstream down`.",
        st.agent.pid
    )
}

pub fn columns(rows: &[Vec<String>]) -> String {
    let n = rows.iter().map(|r| r.len()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n).map(|i| rows.iter().map(|r| r.get(i).map(|c| c.len()).unwrap_or(0)).max().unwrap_or(0)).collect();
    let mut s = String::new();
    for r in rows {
        let line: Vec<String> = r.iter().enumerate().map(|(i, c)| format!("{c:<w$}", w = widths[i])).collect();
        s.push_str(line.join("  ").trim_end());
        s.push('\n');
    }
    s
}

/// `ready, pid 12`, `NOT READY (why), pid 12`, `NOT RUNNING (why)`; on
/// Kubernetes (no pids: the kubelet runs the processes) `ready` or
/// `NOT READY (why)`, from the container's readiness.
fn process_state(p: &slipstream_testbed::status::ProxyStatus, kubernetes: bool) -> String {
    if kubernetes {
        return match p.ready {
            Some(true) => "ready".into(),
            _ => format!("NOT READY ({})", if p.reason.is_empty() { "no reason given" } else { &p.reason }),
        };
    }
    match (p.pid, p.ready) {
        (Some(pid), Some(true)) => format!("ready, pid {pid}"),
        (Some(pid), Some(false)) => {
            format!("NOT READY ({}), pid {pid}", if p.reason.is_empty() { "no reason recorded" } else { &p.reason })
        }
        (Some(pid), None) => format!("readiness unknown (not recorded by this agent), pid {pid}"),
        (None, _) => format!("NOT RUNNING ({})", if p.reason.is_empty() { "restarting" } else { &p.reason }),
    }
}

pub fn table(st: &ClusterStatus) -> String {
    render(st, false)
}

/// The table of a Kubernetes install's status (`kube::status`): its
/// processes have no pids, only their containers' readiness.
pub fn table_on_kubernetes(st: &ClusterStatus) -> String {
    render(st, true)
}

fn render(st: &ClusterStatus, kubernetes: bool) -> String {
    let mut s = if st.agent.running {
        format!("cluster {} (agent pid {})\n\n", st.cluster, st.agent.pid)
    } else {
        format!("cluster {}\n{}\n\n", st.cluster, agent_down(st))
    };
    if !st.control.is_empty() {
        let mut rows = vec![["CONTROL PLANE", "ADDRESS", "NETNS", "STATE"].map(String::from).to_vec()];
        for c in &st.control {
            rows.push(vec![
                c.name.clone(),
                c.address.clone(),
                c.netns.clone(),
                format!("{}, {} restart(s)", process_state(&c.process, kubernetes), c.process.restarts),
            ]);
        }
        s.push_str(&columns(&rows));
        s.push('\n');
    }
    let mut rows = vec![["NODE", "IP", "POD CIDR", "NETNS", "DATAPATH", "NODE PROXY"].map(String::from).to_vec()];
    for n in &st.nodes {
        let proxy = match &n.proxy {
            Some(p) => format!("{}, serving {} pod(s), {} restart(s)", process_state(p, kubernetes), p.serving, p.restarts),
            None => "-".into(),
        };
        let datapath = match &n.datapath {
            Some(d) if d.fallback.is_some() => format!("{} (eBPF unavailable: see agent.log)", d.mode),
            Some(d) => d.mode.clone(),
            None => "-".into(),
        };
        rows.push(vec![n.name.clone(), n.ip.clone(), n.pod_cidr.clone(), n.netns.clone(), datapath, proxy]);
    }
    s.push_str(&columns(&rows));
    let mut rows =
        vec![["NAMESPACE", "POD", "READY", "STATUS", "RESTARTS", "NODE", "IP", "MESH", "SERVICE ACCOUNT"].map(String::from).to_vec()];
    for p in &st.pods {
        let ready = p.containers.iter().filter(|c| c.ready).count();
        let status = if p.reason.is_empty() || p.reason == "NotReady" { format!("{:?}", p.phase) } else { p.reason.clone() };
        rows.push(vec![
            p.namespace.clone(),
            p.name.clone(),
            format!("{ready}/{}", p.containers.len()),
            status,
            p.restarts.to_string(),
            p.node.clone(),
            p.ip.clone(),
            if p.meshed { "mTLS".into() } else { "-".into() },
            p.service_account.clone(),
        ]);
    }
    s.push('\n');
    s.push_str(&columns(&rows));
    let mut rows = vec![["NAMESPACE", "SERVICE", "VIP", "PORTS", "ENDPOINTS"].map(String::from).to_vec()];
    for svc in &st.services {
        let ports: Vec<String> = svc.ports.iter().map(|p| format!("{}->{}/{}", p.port, p.target_port, p.protocol)).collect();
        let eps: Vec<String> = svc.endpoints.iter().map(|e| e.ip.clone()).collect();
        rows.push(vec![
            svc.namespace.clone(),
            svc.name.clone(),
            svc.vip.clone(),
            ports.join(","),
            if eps.is_empty() { "<none>".into() } else { eps.join(",") },
        ]);
    }
    s.push('\n');
    s.push_str(&columns(&rows));
    if !st.other_objects.is_empty() {
        s.push_str(&format!("\nstored, not acted on yet: {}\n", st.other_objects.join(", ")));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_proxy(proxy: serde_json::Value) -> ClusterStatus {
        serde_json::from_value(serde_json::json!({
            "version": 1, "cluster": "t", "agent": {"pid": 1, "running": true}, "pods": [], "services": [],
            "nodes": [{"name": "node1", "netns": "t.node.node1", "ip": "10.0.0.1", "podCIDR": "10.244.1.0/24", "proxy": proxy}]
        }))
        .unwrap()
    }

    #[test]
    fn node_proxy_readiness_column() {
        let base = serde_json::json!({"pid": 7, "restarts": 0, "serving": 2, "log": "l"});
        let cases = [
            (serde_json::json!({"ready": true}), "ready, pid 7, serving 2 pod(s), 0 restart(s)"),
            (
                serde_json::json!({"ready": false, "reason": "readiness probe failed 1 time: x"}),
                "NOT READY (readiness probe failed 1 time: x), pid 7",
            ),
            // A state file of an agent that did not probe: no `ready` at all.
            (serde_json::json!({}), "readiness unknown (not recorded by this agent), pid 7"),
            (serde_json::json!({"ready": false}), "NOT READY (no reason recorded), pid 7"),
        ];
        for (extra, want) in cases {
            let mut proxy = base.clone();
            proxy.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            let t = table(&with_proxy(proxy.clone()));
            assert!(t.contains(want) && !t.contains("()"), "{proxy}: {t}");
        }
    }
}
