//! The API server's objects as the local cluster's status types
//! (`slipstream_testbed::status`), so that `status -o json` has one schema
//! (docs/status-json.md) on both. Pure, for tests; the fields only the
//! local cluster has (network namespaces, veths, cgroups, log paths, pids)
//! are empty there.

use k8s_openapi::api::core::v1::{ContainerStatus as KContainer, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use slipstream_testbed::status::{
    ContainerStatus, ControlStatus, DatapathStatus, EndpointPort, EndpointStatus, NodeStatus, PodPhase, PodStatus, ProxyStatus,
    ServicePortStatus, ServiceStatus,
};
use std::collections::BTreeMap;

fn ready_condition(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn containers(p: &Pod) -> &[KContainer] {
    p.status.as_ref().and_then(|s| s.container_statuses.as_deref()).unwrap_or(&[])
}

fn container_state(c: &KContainer) -> (&'static str, Option<i32>, Option<String>) {
    let st = c.state.as_ref();
    let last = c.last_state.as_ref().and_then(|l| l.terminated.as_ref()).map(|t| t.exit_code);
    match (st.and_then(|s| s.running.as_ref()), st.and_then(|s| s.terminated.as_ref()), st.and_then(|s| s.waiting.as_ref())) {
        (Some(_), _, _) => ("running", last, None),
        (_, Some(t), _) => ("terminated", Some(t.exit_code), t.reason.clone()),
        (_, _, Some(w)) => ("waiting", last, w.reason.clone()),
        _ => ("waiting", last, None),
    }
}

/// `Deployment/NAME` for a ReplicaSet's pod of a Deployment, else the
/// controller's `Kind/NAME`.
pub fn owner(p: &Pod) -> Option<String> {
    let o = p.metadata.owner_references.as_ref()?.iter().find(|o| o.controller == Some(true))?;
    let hash = p.metadata.labels.as_ref().and_then(|l| l.get("pod-template-hash"));
    match (o.kind.as_str(), hash) {
        ("ReplicaSet", Some(h)) if o.name.ends_with(&format!("-{h}")) => {
            Some(format!("Deployment/{}", &o.name[..o.name.len() - h.len() - 1]))
        }
        _ => Some(format!("{}/{}", o.kind, o.name)),
    }
}

/// A pod as `status` shows it; `namespace_labels` decide whether it is meshed.
pub fn pod(p: &Pod, namespace_labels: &BTreeMap<String, String>) -> PodStatus {
    let labels = p.metadata.labels.clone().unwrap_or_default();
    let status = p.status.as_ref();
    let host_network = p.spec.as_ref().and_then(|s| s.host_network).unwrap_or(false);
    let phase = match (p.metadata.deletion_timestamp.is_some(), status.and_then(|s| s.phase.as_deref())) {
        (true, _) => PodPhase::Terminating,
        (_, Some("Running")) => PodPhase::Running,
        (_, Some("Succeeded")) => PodPhase::Succeeded,
        (_, Some("Failed")) => PodPhase::Failed,
        _ => PodPhase::Pending,
    };
    let ready = ready_condition(p);
    let cs: Vec<ContainerStatus> = containers(p)
        .iter()
        .map(|c| {
            let (state, last_exit_code, _) = container_state(c);
            ContainerStatus {
                name: c.name.clone(),
                state: state.into(),
                pid: None,
                ready: c.ready,
                restarts: u32::try_from(c.restart_count).unwrap_or(0),
                last_exit_code,
                log: String::new(),
            }
        })
        .collect();
    let waiting_reason = containers(p).iter().find_map(|c| container_state(c).2.filter(|_| !c.ready));
    let (reason, message) = match phase {
        PodPhase::Running if ready => (String::new(), String::new()),
        PodPhase::Succeeded => ("Completed".into(), String::new()),
        PodPhase::Failed => (
            status.and_then(|s| s.reason.clone()).unwrap_or_else(|| "Error".into()),
            status.and_then(|s| s.message.clone()).unwrap_or_default(),
        ),
        PodPhase::Pending | PodPhase::Running => {
            (waiting_reason.unwrap_or_else(|| "NotReady".into()), status.and_then(|s| s.message.clone()).unwrap_or_default())
        }
        PodPhase::Terminating => (String::new(), String::new()),
    };
    PodStatus {
        namespace: p.metadata.namespace.clone().unwrap_or_default(),
        name: p.metadata.name.clone().unwrap_or_default(),
        node: super::install::node_of(p).to_string(),
        ip: status.and_then(|s| s.pod_ip.clone()).unwrap_or_default(),
        service_account: p.spec.as_ref().and_then(|s| s.service_account_name.clone()).unwrap_or_else(|| "default".into()),
        meshed: !host_network && slipstream_cni::enrol::is_meshed(namespace_labels, &labels),
        labels,
        phase,
        ready,
        reason,
        message,
        restarts: cs.iter().map(|c| c.restarts).sum(),
        netns: String::new(),
        veth: String::new(),
        cgroup: String::new(),
        owner: owner(p),
        containers: cs,
    }
}

/// One container of an install's pod as a process (`ready` from the kubelet's probe).
pub fn process(p: &Pod, container: &str, serving: usize) -> ProxyStatus {
    let c = containers(p).iter().find(|c| c.name == container).or_else(|| containers(p).first());
    let ready = c.is_some_and(|c| c.ready);
    let reason = match c {
        None => "no container status yet".to_string(),
        Some(_) if ready => String::new(),
        Some(c) => container_state(c).2.unwrap_or_else(|| "readiness probe failing".into()),
    };
    ProxyStatus {
        pid: None,
        restarts: c.map(|c| u32::try_from(c.restart_count).unwrap_or(0)).unwrap_or(0),
        serving,
        log: String::new(),
        ready: Some(ready),
        reason,
    }
}

/// A control plane replica: its pod, the address node proxies reach.
pub fn control(p: &Pod) -> ControlStatus {
    let ip = p.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap_or_default();
    ControlStatus {
        name: p.metadata.name.clone().unwrap_or_default(),
        netns: String::new(),
        address: if ip.is_empty() { String::new() } else { format!("{ip}:{}", slipstream_core::abi::CONTROL_PLANE_PORT) },
        process: process(p, "control", 0),
    }
}

/// The datapath of a node pod: its agent's `SLIPSTREAM_AGENT_DATAPATH`
/// (the chart's `datapath.mode`), nftables by default.
pub fn datapath(node_pod: &Pod) -> DatapathStatus {
    let mode = node_pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| c.name == super::install::AGENT_CONTAINER))
        .and_then(|c| c.env.as_ref())
        .and_then(|env| env.iter().find(|e| e.name == "SLIPSTREAM_AGENT_DATAPATH"))
        .and_then(|e| e.value.clone())
        .unwrap_or_else(|| "nftables".into());
    DatapathStatus { mode, fallback: None }
}

/// A node, with its node proxy (`serving`: the pods it holds listeners for, when known).
pub fn node(n: &Node, node_pod: Option<&Pod>, serving: usize) -> NodeStatus {
    let ip = n
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
        .map(|a| a.address.clone())
        .unwrap_or_default();
    NodeStatus {
        name: n.metadata.name.clone().unwrap_or_default(),
        netns: String::new(),
        ip,
        pod_cidr: n.spec.as_ref().and_then(|s| s.pod_cidr.clone()).unwrap_or_default(),
        proxy: node_pod.map(|p| process(p, super::install::PROXY_CONTAINER, serving)),
        datapath: node_pod.map(datapath),
    }
}

/// A Service, with the ready endpoints of its EndpointSlices.
pub fn service(s: &Service, slices: &[EndpointSlice]) -> ServiceStatus {
    let (ns, name) = (s.metadata.namespace.clone().unwrap_or_default(), s.metadata.name.clone().unwrap_or_default());
    let spec = s.spec.clone().unwrap_or_default();
    let ports: Vec<ServicePortStatus> = spec
        .ports
        .unwrap_or_default()
        .into_iter()
        .map(|p| ServicePortStatus {
            target_port: match &p.target_port {
                Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(i)) => i.to_string(),
                Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s)) => s.clone(),
                None => p.port.to_string(),
            },
            name: p.name.unwrap_or_default(),
            port: u16::try_from(p.port).unwrap_or(0),
            protocol: p.protocol.unwrap_or_else(|| "TCP".into()),
        })
        .collect();
    let mut endpoints = Vec::new();
    let mine = slices.iter().filter(|e| {
        e.metadata.namespace.as_deref() == Some(ns.as_str())
            && e.metadata.labels.as_ref().and_then(|l| l.get("kubernetes.io/service-name")) == Some(&name)
    });
    for slice in mine {
        for e in slice.endpoints.iter().filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false)) {
            let eports = ports
                .iter()
                .filter_map(|sp| {
                    let found = slice.ports.as_ref()?.iter().find(|p| p.name.as_deref().unwrap_or("") == sp.name)?;
                    Some(EndpointPort { port: sp.port, target_port: u16::try_from(found.port?).ok()? })
                })
                .collect();
            endpoints.push(EndpointStatus {
                pod: e.target_ref.as_ref().and_then(|t| t.name.clone()).unwrap_or_default(),
                ip: e.addresses.first().cloned().unwrap_or_default(),
                node: e.node_name.clone().unwrap_or_default(),
                ports: eports,
            });
        }
    }
    endpoints.sort_by(|a, b| a.pod.cmp(&b.pod));
    ServiceStatus { namespace: ns, name, vip: spec.cluster_ip.unwrap_or_else(|| "None".into()), ports, endpoints }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod_of(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn pods() {
        let ambient: BTreeMap<String, String> = [("istio.io/dataplane-mode".to_string(), "ambient".to_string())].into();
        let running = pod_of(json!({
            "metadata": {"name": "reviews-v1-7c4465f68d-7whcl", "namespace": "bookinfo", "labels": {"app": "reviews", "pod-template-hash": "7c4465f68d"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "reviews-v1-7c4465f68d", "uid": "u", "controller": true}]},
            "spec": {"nodeName": "worker-2", "serviceAccountName": "bookinfo-reviews", "containers": []},
            "status": {"phase": "Running", "podIP": "10.78.2.3", "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "reviews", "ready": true, "restartCount": 1, "image": "i", "imageID": "",
                    "state": {"running": {}}, "lastState": {"terminated": {"exitCode": 137}}}]}
        }));
        let p = pod(&running, &ambient);
        assert_eq!((p.phase, p.ready, p.meshed, p.restarts), (PodPhase::Running, true, true, 1));
        assert_eq!(p.owner.as_deref(), Some("Deployment/reviews-v1"));
        assert_eq!((p.node.as_str(), p.ip.as_str(), p.service_account.as_str()), ("worker-2", "10.78.2.3", "bookinfo-reviews"));
        assert_eq!(p.containers[0].last_exit_code, Some(137));
        assert!(p.reason.is_empty());
        // Not meshed: the namespace is not ambient; host network pods never are.
        assert!(!pod(&running, &BTreeMap::new()).meshed);
        let crashing = pod_of(json!({
            "metadata": {"name": "x", "namespace": "bookinfo", "labels": {"istio.io/dataplane-mode": "none"}},
            "spec": {"containers": []},
            "status": {"phase": "Running", "containerStatuses": [{"name": "x", "ready": false, "restartCount": 3, "image": "i", "imageID": "",
                "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}
        }));
        let p = pod(&crashing, &ambient);
        assert_eq!((p.reason.as_str(), p.containers[0].state.as_str(), p.meshed), ("CrashLoopBackOff", "waiting", false));
        let gone = pod_of(json!({"metadata": {"name": "y", "deletionTimestamp": "2026-01-01T00:00:00Z"}, "spec": {"containers": []}}));
        assert_eq!(pod(&gone, &ambient).phase, PodPhase::Terminating);
    }

    #[test]
    fn services_and_their_ready_endpoints() {
        let svc: Service = serde_json::from_value(json!({"metadata": {"name": "reviews", "namespace": "bookinfo"},
            "spec": {"clusterIP": "10.96.0.7", "ports": [{"name": "http", "port": 9080, "targetPort": 9080}]}}))
        .unwrap();
        let slice: EndpointSlice = serde_json::from_value(json!({"metadata": {"name": "reviews-abc", "namespace": "bookinfo",
            "labels": {"kubernetes.io/service-name": "reviews"}}, "addressType": "IPv4", "ports": [{"name": "http", "port": 9080}],
            "endpoints": [{"addresses": ["10.78.2.3"], "nodeName": "worker-2", "targetRef": {"name": "reviews-v1-x"}, "conditions": {"ready": true}},
                          {"addresses": ["10.78.1.5"], "targetRef": {"name": "reviews-v2-y"}, "conditions": {"ready": false}}]})).unwrap();
        let s = service(&svc, &[slice]);
        assert_eq!((s.vip.as_str(), s.ports[0].target_port.as_str()), ("10.96.0.7", "9080"));
        assert_eq!(s.endpoints.len(), 1, "only ready endpoints");
        assert_eq!(s.endpoints[0].ports, vec![EndpointPort { port: 9080, target_port: 9080 }]);
    }

    #[test]
    fn install_processes() {
        let node_pod = pod_of(json!({"metadata": {"name": "slipstream-node-a"}, "spec": {"nodeName": "worker-1",
            "containers": [{"name": "agent", "env": [{"name": "SLIPSTREAM_AGENT_DATAPATH", "value": "nftables"}]}, {"name": "proxy"}]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "agent", "ready": true, "restartCount": 0, "image": "i", "imageID": "", "state": {"running": {}}},
                {"name": "proxy", "ready": false, "restartCount": 2, "image": "i", "imageID": "", "state": {"running": {}}}]}}));
        let n: Node = serde_json::from_value(json!({"metadata": {"name": "worker-1"}, "spec": {"podCIDR": "10.78.1.0/24"},
            "status": {"addresses": [{"type": "Hostname", "address": "w"}, {"type": "InternalIP", "address": "10.77.0.3"}]}}))
        .unwrap();
        let s = node(&n, Some(&node_pod), 4);
        assert_eq!((s.ip.as_str(), s.pod_cidr.as_str()), ("10.77.0.3", "10.78.1.0/24"));
        let proxy = s.proxy.unwrap();
        assert_eq!((proxy.ready, proxy.restarts, proxy.serving, proxy.reason.as_str()), (Some(false), 2, 4, "readiness probe failing"));
        assert_eq!(s.datapath.unwrap().mode, "nftables");
    }
}
