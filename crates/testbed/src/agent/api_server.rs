//! The agent as API server and kubelet: the Kubernetes objects it would
//! hold for its state, written one file per object into the directory the
//! control plane's `dir` source watches.
//!
//! `cluster_objects` is pure over the agent's state: Namespaces and
//! ServiceAccounts (with each namespace's `default`, as Kubernetes creates
//! it), Services with the VIP the agent assigned as `clusterIP`, Pods as
//! the kubelet reports them (node, service account, owner, container
//! ports; status with IP, host IP, phase and the Ready condition), and the
//! mesh kinds as applied. Deployments are not written: the control plane
//! reads pods, which carry their ReplicaSet owner as Kubernetes would.
//! `sync_dir` is the only I/O.

use super::node::Node;
use super::pods::PodRuntime;
use super::services::Vips;
use super::store::Store;
use k8s_openapi::api::core::v1 as k8s;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use slipstream_k8s::{KeptObject, Labels, Object};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};

/// The kept kinds the control plane reads (section 5 of the protocols).
pub const MESH_KINDS: &[&str] = &[
    "AuthorizationPolicy",
    "PeerAuthentication",
    "RequestAuthentication",
    "NetworkPolicy",
    "CiliumNetworkPolicy",
    "Gateway",
    "HTTPRoute",
    "GRPCRoute",
    "VirtualService",
    "DestinationRule",
    "LocalRateLimitPolicy",
];

/// One object as the API server would serve it.
#[derive(Debug, Clone, PartialEq)]
pub enum KubeObject {
    Namespace(Box<k8s::Namespace>),
    ServiceAccount(Box<k8s::ServiceAccount>),
    Service(Box<k8s::Service>),
    Pod(Box<k8s::Pod>),
    /// A mesh kind, as applied.
    Mesh(Box<KeptObject>),
}

impl KubeObject {
    pub fn kind(&self) -> &str {
        match self {
            KubeObject::Namespace(_) => "Namespace",
            KubeObject::ServiceAccount(_) => "ServiceAccount",
            KubeObject::Service(_) => "Service",
            KubeObject::Pod(_) => "Pod",
            KubeObject::Mesh(k) => &k.kind,
        }
    }

    /// Namespace and name (the namespace is empty for a Namespace).
    pub fn name(&self) -> (&str, &str) {
        fn of(m: &ObjectMeta) -> (&str, &str) {
            (m.namespace.as_deref().unwrap_or(""), m.name.as_deref().unwrap_or(""))
        }
        match self {
            KubeObject::Namespace(o) => ("", o.metadata.name.as_deref().unwrap_or("")),
            KubeObject::ServiceAccount(o) => of(&o.metadata),
            KubeObject::Service(o) => of(&o.metadata),
            KubeObject::Pod(o) => of(&o.metadata),
            KubeObject::Mesh(k) => (&k.metadata.namespace, &k.metadata.name),
        }
    }

    /// Its file under the directory: `<kind>/<namespace>/<name>.yaml`, or
    /// `<kind>/<name>.yaml` for a Namespace. None for a name that could
    /// leave the directory (validation never lets one through).
    pub fn file(&self) -> Option<PathBuf> {
        let (ns, name) = self.name();
        let safe = |s: &str| !s.is_empty() && !s.starts_with('.') && !s.contains('/') && !s.contains('\0');
        if !safe(name) || !safe(self.kind()) || !(ns.is_empty() || safe(ns)) {
            return None;
        }
        let mut p = PathBuf::from(self.kind());
        if !ns.is_empty() {
            p.push(ns);
        }
        p.push(format!("{name}.yaml"));
        Some(p)
    }

    pub fn to_yaml(&self) -> Result<String, serde_yaml::Error> {
        match self {
            KubeObject::Namespace(o) => serde_yaml::to_string(o),
            KubeObject::ServiceAccount(o) => serde_yaml::to_string(o),
            KubeObject::Service(o) => serde_yaml::to_string(o),
            KubeObject::Pod(o) => serde_yaml::to_string(o),
            KubeObject::Mesh(o) => serde_yaml::to_string(o),
        }
    }
}

impl KubeObject {
    /// As JSON, with `apiVersion` and `kind`.
    pub fn to_json(&self) -> serde_json::Value {
        let v = match self {
            KubeObject::Namespace(o) => serde_json::to_value(o),
            KubeObject::ServiceAccount(o) => serde_json::to_value(o),
            KubeObject::Service(o) => serde_json::to_value(o),
            KubeObject::Pod(o) => serde_json::to_value(o),
            KubeObject::Mesh(o) => serde_json::to_value(o),
        };
        v.unwrap_or_default()
    }
}

/// What `get` shows: every object as the API server would serve it, the
/// written ones of [`cluster_objects`] and also Deployments (with their
/// replica counts) and the kept kinds the control plane does not read.
pub fn api_view(store: &Store, pods: &[&PodRuntime], nodes: &[Node], vips: &Vips) -> Vec<serde_json::Value> {
    let mut out: Vec<serde_json::Value> = cluster_objects(store, pods, nodes, vips).iter().map(KubeObject::to_json).collect();
    for o in store.objects() {
        match o {
            Object::Deployment(d) => {
                let m = &d.metadata;
                let mine: Vec<&&PodRuntime> =
                    pods.iter().filter(|p| p.inst.namespace == m.namespace && p.inst.owner.as_deref() == Some(m.name.as_str())).collect();
                let hash = slipstream_k8s::expand::template_hash(&d.spec.template.metadata, &d.spec.template.spec);
                let ready = mine.iter().filter(|p| p.ready()).count();
                let updated = mine.iter().filter(|p| p.inst.spec_hash == hash).count();
                let available = mine.iter().filter(|p| p.ready() && p.inst.spec_hash == hash).count();
                out.push(serde_json::json!({
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "metadata": m,
                    "spec": {
                        "replicas": d.spec.replicas(),
                        "selector": d.spec.selector,
                        "template": d.spec.template,
                    },
                    "status": {
                        "replicas": mine.len(),
                        "readyReplicas": ready,
                        "updatedReplicas": updated,
                        "availableReplicas": available,
                    },
                }));
            }
            Object::Kept(k) if !MESH_KINDS.contains(&k.kind.as_str()) => out.push(serde_json::to_value(k).unwrap_or_default()),
            _ => {}
        }
    }
    // What the gateway controller writes (the local cluster's DNS domain
    // is always the default).
    slipstream_control::gateway::status::add(&mut out, slipstream_control::translate::DEFAULT_DOMAIN_SUFFIX);
    out
}

fn meta(ns: Option<&str>, name: &str, labels: &Labels, annotations: &Labels) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: ns.map(str::to_string),
        labels: (!labels.is_empty()).then(|| labels.clone()),
        annotations: (!annotations.is_empty()).then(|| annotations.clone()),
        ..Default::default()
    }
}

/// Every object the agent holds, in a stable order.
pub fn cluster_objects(store: &Store, pods: &[&PodRuntime], nodes: &[Node], vips: &Vips) -> Vec<KubeObject> {
    let mut out = Vec::new();
    let mut accounts: BTreeSet<(String, String)> = BTreeSet::new();
    for o in store.objects() {
        let m = o.metadata();
        match o {
            Object::Namespace(_) => {
                out.push(KubeObject::Namespace(Box::new(k8s::Namespace {
                    metadata: meta(None, &m.name, &m.labels, &m.annotations),
                    ..Default::default()
                })));
                accounts.insert((m.name.clone(), "default".into()));
            }
            Object::ServiceAccount(_) => {
                accounts.insert((m.namespace.clone(), m.name.clone()));
            }
            Object::Service(s) => out.push(KubeObject::Service(Box::new(service(s, vips)))),
            Object::Kept(k) if MESH_KINDS.contains(&k.kind.as_str()) || slipstream_k8s::is_mesh_config(k) => {
                out.push(KubeObject::Mesh(Box::new(k.clone())))
            }
            _ => {}
        }
    }
    for (ns, name) in accounts {
        out.push(KubeObject::ServiceAccount(Box::new(k8s::ServiceAccount {
            metadata: meta(Some(&ns), &name, &Labels::new(), &Labels::new()),
            ..Default::default()
        })));
    }
    let mut pods: Vec<&&PodRuntime> = pods.iter().collect();
    pods.sort_by(|a, b| (&a.inst.namespace, &a.inst.name).cmp(&(&b.inst.namespace, &b.inst.name)));
    out.extend(pods.into_iter().map(|p| KubeObject::Pod(Box::new(pod(p, nodes)))));
    out
}

fn service(s: &slipstream_k8s::Service, vips: &Vips) -> k8s::Service {
    let m = &s.metadata;
    let cluster_ip = if s.spec.is_headless() {
        Some("None".to_string())
    } else {
        vips.get(&(m.namespace.clone(), m.name.clone())).map(|v| v.to_string())
    };
    k8s::Service {
        metadata: meta(Some(&m.namespace), &m.name, &m.labels, &m.annotations),
        spec: Some(k8s::ServiceSpec {
            selector: s.spec.selector.clone(),
            cluster_ips: cluster_ip.clone().map(|ip| vec![ip]),
            cluster_ip,
            type_: Some(s.spec.type_.clone().unwrap_or_else(|| "ClusterIP".into())),
            ports: Some(
                s.spec
                    .ports
                    .iter()
                    .map(|p| k8s::ServicePort {
                        name: p.name.clone(),
                        port: p.port as i32,
                        target_port: Some(match p.target() {
                            slipstream_k8s::IntOrString::Int(n) => IntOrString::Int(n as i32),
                            slipstream_k8s::IntOrString::Str(n) => IntOrString::String(n),
                        }),
                        protocol: Some(p.protocol.to_string()),
                        app_protocol: p.app_protocol.clone(),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        status: None,
    }
}

/// Kubernetes' phase from the agent's view of the containers: a pod whose
/// sandbox failed never got further than Pending (and has no address).
fn phase(p: &PodRuntime) -> &'static str {
    if p.sandbox_error.is_some() {
        return "Pending";
    }
    if !p.containers.is_empty() && p.containers.iter().all(|c| c.done) {
        return if p.containers.iter().all(|c| c.last_exit == Some(0)) { "Succeeded" } else { "Failed" };
    }
    if p.containers.iter().any(|c| c.running()) {
        "Running"
    } else {
        "Pending"
    }
}

fn condition(type_: &str, ok: bool) -> k8s::PodCondition {
    k8s::PodCondition { type_: type_.into(), status: if ok { "True" } else { "False" }.into(), ..Default::default() }
}

fn pod(p: &PodRuntime, nodes: &[Node]) -> k8s::Pod {
    let inst = &p.inst;
    let node = nodes.iter().find(|n| n.index == p.node);
    let mut metadata = meta(Some(&inst.namespace), &inst.name, &inst.labels, &inst.annotations);
    if let Some(deployment) = &inst.owner {
        // A Deployment's pods belong to its ReplicaSet `<deployment>-<pod-template-hash>`.
        let rs = match inst.labels.get("pod-template-hash") {
            Some(h) => format!("{deployment}-{h}"),
            None => deployment.clone(),
        };
        metadata.owner_references = Some(vec![OwnerReference {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            uid: format!("{}/{rs}", inst.namespace),
            name: rs,
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
    }
    let ready = p.ready();
    let addressed = p.sandbox_error.is_none();
    let host_ip = node.map(|n| n.ip.to_string());
    k8s::Pod {
        metadata,
        spec: Some(k8s::PodSpec {
            node_name: node.map(|n| n.name.clone()),
            service_account_name: Some(inst.spec.service_account().to_string()),
            restart_policy: Some(format!("{:?}", inst.spec.restart_policy())),
            containers: inst
                .spec
                .containers
                .iter()
                .map(|c| k8s::Container {
                    name: c.name.clone(),
                    image: c.image.clone(),
                    ports: (!c.ports.is_empty()).then(|| {
                        c.ports
                            .iter()
                            .map(|cp| k8s::ContainerPort {
                                name: cp.name.clone(),
                                container_port: cp.container_port as i32,
                                protocol: Some(cp.protocol.to_string()),
                                ..Default::default()
                            })
                            .collect()
                    }),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }),
        status: Some(k8s::PodStatus {
            phase: Some(phase(p).into()),
            message: p.sandbox_error.clone(),
            host_ip: host_ip.clone(),
            host_ips: host_ip.map(|ip| vec![k8s::HostIP { ip }]),
            pod_ip: addressed.then(|| p.ip.to_string()),
            pod_ips: addressed.then(|| vec![k8s::PodIP { ip: p.ip.to_string() }]),
            conditions: Some(vec![
                condition("PodScheduled", true),
                condition("Initialized", addressed),
                condition("ContainersReady", ready),
                condition("Ready", ready),
            ]),
            container_statuses: Some(
                p.containers
                    .iter()
                    .map(|c| k8s::ContainerStatus {
                        name: c.spec.name.clone(),
                        image: c.spec.image.clone().unwrap_or_default(),
                        ready: c.ready && c.running(),
                        restart_count: c.restarts as i32,
                        started: Some(c.running()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
    }
}

/// Written into the objects directory after every change (hidden: the
/// directory source does not read it as a manifest): a counter the control
/// plane reports back once it has taken in everything written before it,
/// so that `slipstream apply` can wait for the proxies to acknowledge the
/// change it made.
pub const GENERATION_FILE: &str = ".generation";

/// What `sync_dir` did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Report {
    pub written: usize,
    pub unchanged: usize,
    pub removed: usize,
}

impl Report {
    pub fn changed(&self) -> bool {
        self.written + self.removed > 0
    }
}

/// Makes `dir` hold exactly `objects`, one file each: rewrites only files
/// whose content changed (a temporary file renamed over the old one, so a
/// reader never sees half a file), removes the files of objects that are
/// gone and the directories they leave empty. It compares with what is on
/// disk rather than with a memory of past writes, so it is right after an
/// agent restart too.
pub fn sync_dir(dir: &Path, objects: &[KubeObject]) -> io::Result<Report> {
    let mut wanted: BTreeMap<PathBuf, String> = BTreeMap::new();
    for o in objects {
        let Some(rel) = o.file() else {
            tracing::warn!(kind = o.kind(), "not written: a name that is not a file name ({:?})", o.name());
            continue;
        };
        let text = o.to_yaml().map_err(io::Error::other)?;
        wanted.insert(dir.join(rel), text);
    }
    let mut report = Report::default();
    for (path, text) in &wanted {
        if std::fs::read_to_string(path).is_ok_and(|old| old == *text) {
            report.unchanged += 1;
            continue;
        }
        write_atomic(path, text)?;
        report.written += 1;
    }
    if dir.exists() {
        report.removed = remove_others(dir, &wanted)?;
    }
    Ok(report)
}

fn write_atomic(path: &Path, text: &str) -> io::Result<()> {
    let parent = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("object");
    // Hidden: the control plane's directory source never reads it.
    let tmp = parent.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// Removes every file under `dir` that is not wanted (stale temporary
/// files included) and the directories left empty; how many objects' files
/// went.
fn remove_others(dir: &Path, wanted: &BTreeMap<PathBuf, String>) -> io::Result<usize> {
    let mut removed = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            removed += remove_others(&path, wanted)?;
            // Fails (and stays) unless empty.
            let _ = std::fs::remove_dir(&path);
        } else if !wanted.contains_key(&path) && path != dir.join(GENERATION_FILE) {
            std::fs::remove_file(&path)?;
            if path.extension().is_some_and(|e| e == "yaml") && !entry.file_name().to_string_lossy().starts_with('.') {
                removed += 1;
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests;
