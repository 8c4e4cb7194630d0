use super::*;
use crate::agent::mesh;
use crate::agent::services::allocate_vips;
use crate::agent::store::ClusterFacts;
use crate::plan;
use slipstream_control::index::{Index, IndexSettings};
use slipstream_control::source::dir::DirSource;
use slipstream_control::source::ObjectEvent;
use slipstream_k8s::{desired_pods, load_str, Source};
use std::collections::BTreeSet;
use std::net::Ipv4Addr;

const CLUSTER: &str = "parity";

/// Two nodes; a meshed namespace with a Deployment of two replicas behind
/// a Service with a named target port, a headless Service, a STRICT
/// PeerAuthentication with a port-level exception for one workload, an
/// AuthorizationPolicy; a pod that opts out, one in a plain namespace.
const CLUSTER_YAML: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: demo, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: web, namespace: demo}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: demo}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web, version: v1}}
    spec:
      serviceAccountName: web
      containers: [{name: c, command: [sleep, infinity], ports: [{name: http, containerPort: 8080}, {name: dns, containerPort: 5353, protocol: UDP}]}]
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: http}, {name: dns, port: 53, targetPort: dns}, {name: metrics, port: 9090}]
---
apiVersion: v1
kind: Service
metadata: {name: web-headless, namespace: demo}
spec: {clusterIP: None, selector: {app: web}, ports: [{port: 8080}]}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: demo, labels: {app: client}}
spec: {nodeName: node2, containers: [{name: c, command: [sleep, infinity]}]}
---
apiVersion: v1
kind: Pod
metadata: {name: outside, namespace: demo, labels: {app: outside, istio.io/dataplane-mode: none}}
spec: {containers: [{name: c, command: [sleep, infinity]}]}
---
apiVersion: v1
kind: Pod
metadata: {name: plain, namespace: default, labels: {app: plain}}
spec: {containers: [{name: c, command: [sleep, infinity]}]}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: demo}
spec: {mtls: {mode: STRICT}}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: web, namespace: demo}
spec: {selector: {matchLabels: {app: web}}, portLevelMtls: {"9090": {mode: PERMISSIVE}}}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-evil, namespace: demo}
spec: {action: DENY, rules: [{from: [{source: {namespaces: [evil]}}]}]}
"#;

struct State {
    store: Store,
    pods: Vec<PodRuntime>,
    nodes: Vec<Node>,
    vips: Vips,
}

/// The agent's state for `CLUSTER_YAML` as `kubelet::Kubelet::reconcile` builds it,
/// without sandboxes (no root needed): pods placed and addressed by the
/// same planning functions, meshed-ness decided at creation as the agent
/// does. Runtime pods have no containers here (those are private to
/// `pods.rs` and need processes); such a pod reads as ready, and one
/// marked terminating as not ready.
fn state() -> State {
    let objs = load_str(CLUSTER_YAML, &Source("t".into())).unwrap().into_iter().map(|l| l.object).collect();
    let nodes: Vec<Node> =
        (1..=2).map(|i| Node { name: plan::node_name(i), index: i, netns: format!("n{i}"), ip: plan::node_ip(i) }).collect();
    let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
    let mut vips = Vips::new();
    let (store, _) = Store::new().plan_apply(objs, &ClusterFacts { nodes: &names, vips: &vips }).unwrap();
    allocate_vips(&store, &mut vips);
    let mut pods = Vec::new();
    let mut used = BTreeSet::new();
    for inst in desired_pods(store.objects()) {
        let loads: Vec<usize> = nodes.iter().map(|n| pods.iter().filter(|p: &&PodRuntime| p.node == n.index).count()).collect();
        let node = &nodes[plan::place(&names, &loads, inst.spec.node_name.as_deref()).unwrap()];
        let ip: Ipv4Addr = plan::next_pod_ip(node.index, &used).unwrap();
        used.insert(ip);
        let meshed = mesh::is_meshed(&mesh::namespace_labels(&store, &inst.namespace), &inst.labels);
        pods.push(PodRuntime {
            node: node.index,
            ip,
            netns: String::new(),
            cgroup: PathBuf::new(),
            dir: PathBuf::new(),
            containers: Vec::new(),
            // The client is being stopped: not ready.
            kill_at: (inst.name == "client").then(std::time::Instant::now),
            sandbox_error: None,
            meshed,
            captured: meshed,
            workload_token: None,
            extra_env: Vec::new(),
            inst,
        });
    }
    State { store, pods, nodes, vips }
}

fn index_of(events: impl IntoIterator<Item = ObjectEvent>) -> Index {
    let mut ix = Index::new(IndexSettings { cluster_id: CLUSTER.into(), ..Default::default() });
    for e in events {
        let r = e.object_ref();
        ix.apply(e).unwrap_or_else(|e| panic!("{r}: {e}"));
    }
    ix
}

/// The control plane's index, fed with the agent's objects through the
/// files and the directory source, gives the node proxies the workloads,
/// services and converted policies the cluster means: named target ports
/// resolved per pod, readiness, nodes, STRICT per pod.
#[test]
fn the_index_of_the_agent_objects_is_what_the_cluster_means() {
    let s = state();
    let pods: Vec<&PodRuntime> = s.pods.iter().collect();
    let objects = cluster_objects(&s.store, &pods, &s.nodes, &s.vips);
    let d = tempfile::tempdir().unwrap();
    sync_dir(d.path(), &objects).unwrap();
    let mut src = DirSource::new(d.path());
    let events: Vec<ObjectEvent> = src.poll().into_iter().map(|(e, _)| e).collect();
    assert!(src.errors().is_empty(), "{:?}", src.errors());
    let got = index_of(events).mesh_config();

    assert_eq!(got.workloads.len(), 5);
    let web = got.workloads.iter().find(|w| w.workload_name == "web").unwrap();
    let ports: Vec<(u16, u16)> = web.services["demo/web.demo.svc.cluster.local"].iter().map(|p| (p.service_port, p.target_port)).collect();
    // `http` resolved by name; `dns` is UDP in the container and TCP in the
    // service, so this pod does not serve it.
    assert_eq!(ports, [(80, 8080), (9090, 9090)]);
    let converted: Vec<_> = got.policies.iter().filter(|p| p.name.starts_with("istio_converted_strict_")).collect();
    assert_eq!(converted.len(), 3, "web (x2) and client are meshed and STRICT");
    // And the AuthorizationPolicy.
    assert_eq!(got.policies.len(), converted.len() + 1);
    assert!(got.workloads.iter().any(|w| w.status == slipstream_core::WorkloadStatus::Unhealthy));
    assert_eq!(BTreeSet::from_iter(got.workloads.iter().map(|w| w.node.as_str())), BTreeSet::from(["node1", "node2"]));
}

#[test]
fn pods_as_kubernetes_reports_them() {
    let s = state();
    let pods: Vec<&PodRuntime> = s.pods.iter().collect();
    let objects = cluster_objects(&s.store, &pods, &s.nodes, &s.vips);
    let files: Vec<String> = objects.iter().map(|o| o.file().unwrap().display().to_string()).collect();
    for f in [
        "Namespace/demo.yaml",
        "ServiceAccount/demo/default.yaml",
        "ServiceAccount/demo/web.yaml",
        "Service/demo/web.yaml",
        "Pod/demo/client.yaml",
        "PeerAuthentication/demo/web.yaml",
        "AuthorizationPolicy/demo/deny-evil.yaml",
    ] {
        assert!(files.contains(&f.to_string()), "{f} in {files:?}");
    }
    assert!(!files.iter().any(|f| f.starts_with("Deployment")));
    let web = objects
        .iter()
        .find_map(|o| match o {
            KubeObject::Pod(p) if p.metadata.labels.as_ref().is_some_and(|l| l.get("app").is_some_and(|a| a == "web")) => Some(p),
            _ => None,
        })
        .unwrap();
    let owner = &web.metadata.owner_references.as_ref().unwrap()[0];
    let hash = &web.metadata.labels.as_ref().unwrap()["pod-template-hash"];
    assert_eq!((owner.kind.as_str(), owner.name.clone()), ("ReplicaSet", format!("web-{hash}")));
    let status = web.status.as_ref().unwrap();
    assert_eq!(status.pod_ip, status.pod_ips.as_ref().map(|v| v[0].ip.clone()));
    assert!(status.host_ip.as_deref().is_some_and(|ip| ip.starts_with("172.18.0.")));
    let ready = status.conditions.as_ref().unwrap().iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(ready.status, "True");
    let svc = objects
        .iter()
        .find_map(|o| match o {
            KubeObject::Service(s) if s.metadata.name.as_deref() == Some("web") => Some(s),
            _ => None,
        })
        .unwrap();
    let vip = s.vips[&("demo".to_string(), "web".to_string())].to_string();
    assert_eq!(svc.spec.as_ref().unwrap().cluster_ip.as_deref(), Some(vip.as_str()));
}

#[test]
fn sync_dir_writes_changes_only_and_removes_the_rest() {
    let s = state();
    let pods: Vec<&PodRuntime> = s.pods.iter().collect();
    let objects = cluster_objects(&s.store, &pods, &s.nodes, &s.vips);
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    let first = sync_dir(root, &objects).unwrap();
    assert_eq!(first, Report { written: objects.len(), unchanged: 0, removed: 0 });
    std::fs::write(root.join("Pod/demo/.stale.yaml.tmp"), "half").unwrap();
    assert_eq!(sync_dir(root, &objects).unwrap(), Report { written: 0, unchanged: objects.len(), removed: 0 });
    assert!(!root.join("Pod/demo/.stale.yaml.tmp").exists(), "leftover temporary files go");
    // One pod changes, the namespace `default`'s only pod goes.
    let mut fewer: Vec<KubeObject> = objects.iter().filter(|o| o.name() != ("default", "plain")).cloned().collect();
    for o in &mut fewer {
        if let KubeObject::Pod(p) = o {
            if p.metadata.name.as_deref() == Some("client") {
                p.status.as_mut().unwrap().phase = Some("Running".into());
            }
        }
    }
    let inode = |rel: &str| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(root.join(rel)).unwrap());
    let before = inode("Pod/demo/outside.yaml");
    assert_eq!(sync_dir(root, &fewer).unwrap(), Report { written: 1, unchanged: fewer.len() - 1, removed: 1 });
    assert_eq!(inode("Pod/demo/outside.yaml"), before, "unchanged files are not rewritten");
    assert!(!root.join("Pod/default").exists(), "emptied directories go");
    assert!(std::fs::read_to_string(root.join("Pod/demo/client.yaml")).unwrap().contains("phase: Running"));
    // Nothing at all: an empty tree.
    assert_eq!(sync_dir(root, &[]).unwrap().removed, fewer.len());
    assert_eq!(std::fs::read_dir(root).unwrap().count(), 0);
}
