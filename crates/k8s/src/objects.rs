//! Typed Kubernetes objects, with the field names of the Kubernetes API.
//! These types keep only the fields the local cluster acts on; fields they
//! skip are found by `strict` (against the Kubernetes API's own types): a
//! field Kubernetes knows is reported as ignored, any other is refused.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

pub type Labels = BTreeMap<String, String>;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: Labels,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: Labels,
}

/// Integer or named port (`targetPort: 8080` or `targetPort: http`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum IntOrString {
    Int(i64),
    Str(String),
}

impl fmt::Display for IntOrString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IntOrString::Int(i) => write!(f, "{i}"),
            IntOrString::Str(s) => write!(f, "{s}"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, PartialOrd, Ord, Hash)]
pub enum Protocol {
    #[default]
    TCP,
    UDP,
    SCTP,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::TCP => "TCP",
            Protocol::UDP => "UDP",
            Protocol::SCTP => "SCTP",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Namespace {
    pub metadata: ObjectMeta,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceAccount {
    pub metadata: ObjectMeta,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pod {
    pub metadata: ObjectMeta,
    pub spec: PodSpec,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(default)]
    pub containers: Vec<Container>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// Deprecated alias of serviceAccountName that old manifests still use.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "serviceAccount")]
    pub service_account: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<RestartPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<i64>,
    /// Accepted and warned about: the local cluster has no images or volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_containers: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_network: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<PodSecurityContext>,
}

impl PodSpec {
    /// The effective service account (`default` when unset).
    pub fn service_account(&self) -> &str {
        self.service_account_name.as_deref().or(self.service_account.as_deref()).filter(|s| !s.is_empty()).unwrap_or("default")
    }

    pub fn restart_policy(&self) -> RestartPolicy {
        self.restart_policy.unwrap_or(RestartPolicy::Always)
    }

    /// Seconds between SIGTERM and SIGKILL when a pod stops (Kubernetes
    /// default 30; we keep it but cap the local cluster's wait at 30 s).
    pub fn grace_period_secs(&self) -> u64 {
        self.termination_grace_period_seconds.unwrap_or(30).clamp(0, 30) as u64
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<ContainerPort>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_probe: Option<Probe>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<SecurityContext>,
}

/// `spec.securityContext`: defaults for every container of the pod.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSecurityContext {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_user: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_group: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_non_root: Option<bool>,
    /// Added to the supplementary groups (no volumes are mounted, so it
    /// changes no file ownership).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs_group: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub supplemental_groups: Vec<i64>,
}

/// `containers[].securityContext`: overrides the pod's settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecurityContext {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_user: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_group: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_non_root: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<Capabilities>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_privilege_escalation: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_root_filesystem: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub privileged: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub add: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drop: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvVar {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<EnvVarSource>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvVarSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_ref: Option<FieldRef>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FieldRef {
    pub field_path: String,
}

/// The downward-API fields a pod may read through `env[].valueFrom.fieldRef`.
pub const SUPPORTED_FIELD_REFS: &[&str] =
    &["metadata.name", "metadata.namespace", "status.podIP", "status.hostIP", "spec.nodeName", "spec.serviceAccountName"];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerPort {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub container_port: i64,
    #[serde(default)]
    pub protocol: Protocol,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Probe {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_socket: Option<TcpSocketAction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_get: Option<HttpGetAction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecAction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_delay_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_threshold: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcpSocketAction {
    pub port: IntOrString,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpGetAction {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    pub port: IntOrString,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecAction {
    #[serde(default)]
    pub command: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deployment {
    pub metadata: ObjectMeta,
    pub spec: DeploymentSpec,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i64>,
    #[serde(default)]
    pub selector: LabelSelector,
    pub template: PodTemplateSpec,
}

impl DeploymentSpec {
    pub fn replicas(&self) -> usize {
        self.replicas.unwrap_or(1).max(0) as usize
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: Labels,
    /// Accepted only when empty; expressions are rejected by validation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodTemplateSpec {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: PodSpec,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Service {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ServiceSpec,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    /// None (absent) means "no selector": the service has no endpoints
    /// managed by us, as in Kubernetes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<Labels>,
    #[serde(default)]
    pub ports: Vec<ServicePort>,
    #[serde(default, rename = "clusterIP", skip_serializing_if = "Option::is_none")]
    pub cluster_ip: Option<String>,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
}

impl ServiceSpec {
    pub fn is_headless(&self) -> bool {
        self.cluster_ip.as_deref() == Some("None")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub port: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_port: Option<IntOrString>,
    #[serde(default)]
    pub protocol: Protocol,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_protocol: Option<String>,
}

impl ServicePort {
    pub fn target(&self) -> IntOrString {
        self.target_port.clone().unwrap_or(IntOrString::Int(self.port))
    }
}

/// A kind the local cluster stores and lists but does not act on yet (policy
/// and routing kinds that later parts of the mesh enforce).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeptObject {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: serde_json::Value,
    /// A ConfigMap's `data` (the root namespace's `istio` one holds
    /// MeshConfig, which the control plane reads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
}

/// Externally tagged when serialized (`{"Pod": {...}}`): kept objects carry
/// a `kind` field of their own, so the kind cannot double as the tag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Object {
    Namespace(Namespace),
    ServiceAccount(ServiceAccount),
    Pod(Pod),
    Deployment(Deployment),
    Service(Service),
    Kept(KeptObject),
}

/// Identifies an object: kind, namespace (empty for cluster-scoped) and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ObjectKey {
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.name)
        } else {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

impl Object {
    pub fn kind(&self) -> &str {
        match self {
            Object::Namespace(_) => "Namespace",
            Object::ServiceAccount(_) => "ServiceAccount",
            Object::Pod(_) => "Pod",
            Object::Deployment(_) => "Deployment",
            Object::Service(_) => "Service",
            Object::Kept(k) => &k.kind,
        }
    }

    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            Object::Namespace(o) => &o.metadata,
            Object::ServiceAccount(o) => &o.metadata,
            Object::Pod(o) => &o.metadata,
            Object::Deployment(o) => &o.metadata,
            Object::Service(o) => &o.metadata,
            Object::Kept(o) => &o.metadata,
        }
    }

    pub fn metadata_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Object::Namespace(o) => &mut o.metadata,
            Object::ServiceAccount(o) => &mut o.metadata,
            Object::Pod(o) => &mut o.metadata,
            Object::Deployment(o) => &mut o.metadata,
            Object::Service(o) => &mut o.metadata,
            Object::Kept(o) => &mut o.metadata,
        }
    }

    pub fn is_cluster_scoped(&self) -> bool {
        matches!(self, Object::Namespace(_))
    }

    pub fn key(&self) -> ObjectKey {
        let m = self.metadata();
        ObjectKey {
            kind: self.kind().to_string(),
            namespace: if self.is_cluster_scoped() { String::new() } else { m.namespace.clone() },
            name: m.name.clone(),
        }
    }
}

/// Kinds stored but not acted on by the local cluster yet, with the note
/// shown to the user when one is applied.
pub const KEPT_KINDS: &[(&str, &str, &str)] = &[
    // Enforced at L4 by the node proxies (rules needing L7 attributes:
    // docs/control-plane.md, "Authorization at L4").
    ("security.istio.io", "AuthorizationPolicy", ""),
    ("security.istio.io", "PeerAuthentication", ""),
    // JWT validation at the waypoints of the Services and Gateways it
    // targets (docs/authorization.md, "RequestAuthentication").
    ("security.istio.io", "RequestAuthentication", ""),
    // Enforced by the node proxies (docs/authorization.md).
    ("networking.k8s.io", "NetworkPolicy", ""),
    ("cilium.io", "CiliumNetworkPolicy", ""),
    // Gateways of class istio-waypoint make waypoints; HTTPRoutes with a
    // Service parent route at that service's waypoint (docs/waypoint.md).
    ("gateway.networking.k8s.io", "Gateway", ""),
    ("gateway.networking.k8s.io", "HTTPRoute", ""),
    ("gateway.networking.k8s.io", "GRPCRoute", ""),
    // Routes and traffic policies at the waypoint of the services they
    // name (docs/waypoint.md, "VirtualService and DestinationRule").
    ("networking.istio.io", "VirtualService", ""),
    ("networking.istio.io", "DestinationRule", ""),
    // Our own: a token bucket at the waypoint (docs/waypoint.md).
    ("slipstream.io", "LocalRateLimitPolicy", ""),
    // Stored; the local cluster mounts no volumes. The root namespace's
    // `istio` holds MeshConfig, which the control plane reads
    // (`is_mesh_config`), and is no cause for the warning.
    ("", "ConfigMap", "stored; the local cluster mounts no volumes"),
];

/// The namespace whose `istio` ConfigMap holds MeshConfig (Istio's root
/// namespace; the local cluster's is always this one).
pub const MESH_CONFIG_NAMESPACE: &str = "istio-system";

/// Whether `k` is the ConfigMap MeshConfig comes from (`istio-system/istio`,
/// its `mesh` key): the one ConfigMap the mesh reads.
pub fn is_mesh_config(k: &KeptObject) -> bool {
    k.kind == "ConfigMap" && k.metadata.namespace == MESH_CONFIG_NAMESPACE && k.metadata.name == "istio"
}

/// Whether the mesh acts on this kind (an empty note in `KEPT_KINDS`).
pub fn is_enforced(kind: &str) -> bool {
    KEPT_KINDS.iter().any(|(_, k, n)| *k == kind && n.is_empty())
}

/// The note for a kept kind, if `api_version`/`kind` is one (empty for the
/// kinds the mesh enforces).
pub fn kept_note(api_version: &str, kind: &str) -> Option<&'static str> {
    let group = api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
    KEPT_KINDS.iter().find(|(g, k, _)| *g == group && *k == kind).map(|(_, _, n)| *n)
}
