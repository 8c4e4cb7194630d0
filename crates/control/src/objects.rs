//! The objects the control plane reads, as Kubernetes serves them: the
//! Kubernetes API's own types (k8s-openapi) for the built-in kinds, and our
//! serde types for the mesh kinds of docs/protocols.md section 5. Both
//! sources (the Kubernetes API and a directory of manifests) produce these,
//! so the index cannot tell them apart.
//!
//! Parsing takes YAML or JSON text (several documents, `kind: List`
//! flattened) and checks each object the way the index will
//! ([`ClusterObject::validate`]), so a source can refuse a bad object before
//! it reaches the index. Every error names the kind, the namespace/name and
//! the field ([`ObjectError`]).

pub mod cilium;

pub use cilium::CiliumNetworkPolicy;
use k8s_openapi::api::core::v1 as core_v1;
use k8s_openapi::api::discovery::v1 as discovery_v1;
use k8s_openapi::api::networking::v1 as networking_v1;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// The API group of our own kinds (`LocalRateLimitPolicy`).
pub const SLIPSTREAM_GROUP: &str = "slipstream.io";

/// The kinds the control plane reads. The index acts on the first seven;
/// the others are kept whole for the waypoint and datapath work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Namespace,
    ServiceAccount,
    Pod,
    Service,
    EndpointSlice,
    AuthorizationPolicy,
    PeerAuthentication,
    RequestAuthentication,
    NetworkPolicy,
    CiliumNetworkPolicy,
    Gateway,
    HTTPRoute,
    GRPCRoute,
    VirtualService,
    DestinationRule,
    LocalRateLimitPolicy,
    /// Only the root namespace's `istio` (MeshConfig) is read.
    ConfigMap,
}

impl Kind {
    pub const ALL: [Kind; 17] = [
        Kind::Namespace,
        Kind::ServiceAccount,
        Kind::Pod,
        Kind::Service,
        Kind::EndpointSlice,
        Kind::AuthorizationPolicy,
        Kind::PeerAuthentication,
        Kind::RequestAuthentication,
        Kind::NetworkPolicy,
        Kind::CiliumNetworkPolicy,
        Kind::Gateway,
        Kind::HTTPRoute,
        Kind::GRPCRoute,
        Kind::VirtualService,
        Kind::DestinationRule,
        Kind::LocalRateLimitPolicy,
        Kind::ConfigMap,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Namespace => "Namespace",
            Kind::ServiceAccount => "ServiceAccount",
            Kind::Pod => "Pod",
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::AuthorizationPolicy => "AuthorizationPolicy",
            Kind::PeerAuthentication => "PeerAuthentication",
            Kind::RequestAuthentication => "RequestAuthentication",
            Kind::NetworkPolicy => "NetworkPolicy",
            Kind::CiliumNetworkPolicy => "CiliumNetworkPolicy",
            Kind::Gateway => "Gateway",
            Kind::HTTPRoute => "HTTPRoute",
            Kind::GRPCRoute => "GRPCRoute",
            Kind::VirtualService => "VirtualService",
            Kind::DestinationRule => "DestinationRule",
            Kind::LocalRateLimitPolicy => "LocalRateLimitPolicy",
            Kind::ConfigMap => "ConfigMap",
        }
    }

    /// The API group of the kind (empty for the core group).
    pub fn group(self) -> &'static str {
        match self {
            Kind::Namespace | Kind::ServiceAccount | Kind::Pod | Kind::Service | Kind::ConfigMap => "",
            Kind::EndpointSlice => "discovery.k8s.io",
            Kind::AuthorizationPolicy | Kind::PeerAuthentication | Kind::RequestAuthentication => "security.istio.io",
            Kind::NetworkPolicy => "networking.k8s.io",
            Kind::CiliumNetworkPolicy => "cilium.io",
            Kind::Gateway | Kind::HTTPRoute | Kind::GRPCRoute => "gateway.networking.k8s.io",
            Kind::VirtualService | Kind::DestinationRule => "networking.istio.io",
            Kind::LocalRateLimitPolicy => SLIPSTREAM_GROUP,
        }
    }

    /// The versions we read: the built-in kinds' types are of one version;
    /// the custom kinds are read in any version of their group (the fields
    /// we use are the same in Istio's `v1beta1` and `v1`).
    fn accepts_version(self, version: &str) -> bool {
        match self {
            Kind::Namespace | Kind::ServiceAccount | Kind::Pod | Kind::Service | Kind::EndpointSlice | Kind::ConfigMap => version == "v1",
            _ => !version.is_empty(),
        }
    }

    /// The kind named by `apiVersion` and `kind`, if the control plane reads it.
    pub fn from_type(api_version: &str, kind: &str) -> Option<Kind> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        Kind::ALL.into_iter().find(|k| k.as_str() == kind && k.group() == group && k.accepts_version(version))
    }

    pub fn is_cluster_scoped(self) -> bool {
        self == Kind::Namespace
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Identifies an object: kind, namespace (empty for cluster-scoped kinds)
/// and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectRef {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

impl ObjectRef {
    pub fn new(kind: Kind, namespace: &str, name: &str) -> Self {
        ObjectRef { kind, namespace: if kind.is_cluster_scoped() { String::new() } else { namespace.to_string() }, name: name.to_string() }
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.name)
        } else {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// An object that cannot be taken: which one (as far as it could be read),
/// which field, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ObjectError {
    /// `Pod`, or what the document said its kind was (empty if it did not).
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// Path of the field (`spec.ports[1].port`); empty for the whole object.
    pub field: String,
    pub message: String,
}

impl ObjectError {
    pub fn new(r: &ObjectRef, field: impl Into<String>, message: impl Into<String>) -> Self {
        ObjectError {
            kind: r.kind.to_string(),
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            field: field.into(),
            message: message.into(),
        }
    }

    /// `Kind namespace/name` as far as known.
    pub fn object(&self) -> String {
        match (self.kind.is_empty(), self.namespace.is_empty(), self.name.is_empty()) {
            (true, _, true) => String::new(),
            (_, true, _) => format!("{} {}", self.kind, self.name).trim().to_string(),
            _ => format!("{} {}/{}", self.kind, self.namespace, self.name).trim().to_string(),
        }
    }
}

impl fmt::Display for ObjectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let object = self.object();
        if !object.is_empty() {
            write!(f, "{object}: ")?;
        }
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.message)
    }
}

// ---- mesh kinds ----

/// `security.istio.io` AuthorizationPolicy. Unknown spec fields are
/// refused rather than ignored: a field we do not know may narrow what the
/// policy allows, and ignoring it would allow more than its author meant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthorizationPolicy {
    pub api_version: String,
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: AuthorizationPolicySpec,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuthorizationPolicySpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<WorkloadSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_ref: Option<PolicyTargetReference>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub target_refs: Vec<PolicyTargetReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<PolicyAction>,
    /// Only with CUSTOM, which we refuse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<RuleSpec>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PolicyAction {
    Allow,
    Deny,
    Audit,
    Custom,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkloadSelector {
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicyTargetReference {
    #[serde(default)]
    pub group: String,
    pub kind: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from: Vec<RuleFrom>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub to: Vec<RuleTo>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub when: Vec<Condition>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RuleFrom {
    #[serde(default)]
    pub source: Option<Source>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Source {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub principals: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_principals: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub request_principals: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_request_principals: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_namespaces: Vec<String>,
    /// `<namespace>/<serviceaccount>`, or a bare name in the policy's
    /// namespace (Istio 1.25 and later).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_accounts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_service_accounts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_blocks: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_ip_blocks: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remote_ip_blocks: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_remote_ip_blocks: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RuleTo {
    #[serde(default)]
    pub operation: Option<Operation>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Operation {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_ports: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_methods: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_paths: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Condition {
    pub key: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_values: Vec<String>,
}

/// `security.istio.io` PeerAuthentication; the spec is the local cluster's
/// own type (`slipstream_k8s::istio`), checked by the same function, so
/// the agent and the control plane accept exactly the same objects.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PeerAuthentication {
    pub api_version: String,
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: slipstream_k8s::istio::PeerAuthenticationSpec,
}

/// A kind the index does not act on yet (NetworkPolicy, Gateway, ...):
/// kept whole so later work has it.
#[derive(Debug, Clone, PartialEq)]
pub struct OpaqueObject {
    pub api_version: String,
    pub kind: Kind,
    pub metadata: ObjectMeta,
    /// Everything but `apiVersion`, `kind` and `metadata`.
    pub rest: serde_json::Map<String, serde_json::Value>,
}

/// One object of the cluster. The large Kubernetes types are boxed so that
/// a vector of objects does not pay a Pod's size for every Namespace.
#[derive(Debug, Clone, PartialEq)]
pub enum ClusterObject {
    Namespace(Box<core_v1::Namespace>),
    ServiceAccount(Box<core_v1::ServiceAccount>),
    Pod(Box<core_v1::Pod>),
    Service(Box<core_v1::Service>),
    EndpointSlice(Box<discovery_v1::EndpointSlice>),
    AuthorizationPolicy(Box<AuthorizationPolicy>),
    PeerAuthentication(Box<PeerAuthentication>),
    NetworkPolicy(Box<networking_v1::NetworkPolicy>),
    CiliumNetworkPolicy(Box<CiliumNetworkPolicy>),
    Opaque(Box<OpaqueObject>),
}

impl ClusterObject {
    pub fn kind(&self) -> Kind {
        match self {
            ClusterObject::Namespace(_) => Kind::Namespace,
            ClusterObject::ServiceAccount(_) => Kind::ServiceAccount,
            ClusterObject::Pod(_) => Kind::Pod,
            ClusterObject::Service(_) => Kind::Service,
            ClusterObject::EndpointSlice(_) => Kind::EndpointSlice,
            ClusterObject::AuthorizationPolicy(_) => Kind::AuthorizationPolicy,
            ClusterObject::PeerAuthentication(_) => Kind::PeerAuthentication,
            ClusterObject::NetworkPolicy(_) => Kind::NetworkPolicy,
            ClusterObject::CiliumNetworkPolicy(_) => Kind::CiliumNetworkPolicy,
            ClusterObject::Opaque(o) => o.kind,
        }
    }

    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            ClusterObject::Namespace(o) => &o.metadata,
            ClusterObject::ServiceAccount(o) => &o.metadata,
            ClusterObject::Pod(o) => &o.metadata,
            ClusterObject::Service(o) => &o.metadata,
            ClusterObject::EndpointSlice(o) => &o.metadata,
            ClusterObject::AuthorizationPolicy(o) => &o.metadata,
            ClusterObject::PeerAuthentication(o) => &o.metadata,
            ClusterObject::NetworkPolicy(o) => &o.metadata,
            ClusterObject::CiliumNetworkPolicy(o) => &o.metadata,
            ClusterObject::Opaque(o) => &o.metadata,
        }
    }

    pub fn object_ref(&self) -> ObjectRef {
        let m = self.metadata();
        ObjectRef::new(self.kind(), m.namespace.as_deref().unwrap_or(""), m.name.as_deref().unwrap_or(""))
    }
}

// ---- parsing ----

/// One object from its JSON form; `None` for a kind the control plane does
/// not read. Not validated (see [`ClusterObject::validate`]).
pub fn parse_value(mut value: serde_json::Value) -> Result<Option<ClusterObject>, ObjectError> {
    let str_at = |v: &serde_json::Value, path: &[&str]| {
        let mut cur = v;
        for p in path {
            cur = cur.get(p)?;
        }
        cur.as_str().map(str::to_string)
    };
    let kind_name = str_at(&value, &["kind"]).unwrap_or_default();
    let api_version = str_at(&value, &["apiVersion"]).unwrap_or_default();
    let name = str_at(&value, &["metadata", "name"]).unwrap_or_default();
    let mut err = ObjectError { kind: kind_name.clone(), namespace: String::new(), name, field: String::new(), message: String::new() };
    if !value.is_object() {
        err.message = "a manifest must be a mapping with apiVersion, kind and metadata".into();
        return Err(err);
    }
    for (field, v) in [("apiVersion", &api_version), ("kind", &kind_name)] {
        if v.is_empty() {
            err.field = field.into();
            err.message = "required (a non-empty string)".into();
            return Err(err);
        }
    }
    let Some(kind) = Kind::from_type(&api_version, &kind_name) else {
        tracing::debug!(api_version, kind = kind_name, "skipping a kind the control plane does not read");
        return Ok(None);
    };
    if !kind.is_cluster_scoped() {
        // As the API server does for a namespaced object without one.
        let meta = value.as_object_mut().and_then(|o| o.get_mut("metadata")).and_then(|m| m.as_object_mut());
        match meta {
            Some(m) => {
                if m.get("namespace").and_then(|n| n.as_str()).is_none_or(str::is_empty) {
                    m.insert("namespace".into(), "default".into());
                }
            }
            None => {
                err.field = "metadata".into();
                err.message = "required".into();
                return Err(err);
            }
        }
    }
    err.namespace = if kind.is_cluster_scoped() { String::new() } else { str_at(&value, &["metadata", "namespace"]).unwrap_or_default() };
    let object = match kind {
        Kind::Namespace => ClusterObject::Namespace(typed(value, &err)?),
        Kind::ServiceAccount => ClusterObject::ServiceAccount(typed(value, &err)?),
        Kind::Pod => ClusterObject::Pod(typed(value, &err)?),
        Kind::Service => ClusterObject::Service(typed(value, &err)?),
        Kind::EndpointSlice => ClusterObject::EndpointSlice(typed(value, &err)?),
        Kind::AuthorizationPolicy => ClusterObject::AuthorizationPolicy(typed(value, &err)?),
        Kind::NetworkPolicy => ClusterObject::NetworkPolicy(typed(value, &err)?),
        Kind::CiliumNetworkPolicy => ClusterObject::CiliumNetworkPolicy(typed(value, &err)?),
        Kind::PeerAuthentication => {
            // The local cluster's checks of the spec (port keys, selector),
            // with the same messages `slipstream apply` gives.
            let kept = slipstream_k8s::KeptObject {
                api_version: api_version.clone(),
                kind: kind_name.clone(),
                metadata: Default::default(),
                spec: value.get("spec").cloned().unwrap_or(serde_json::Value::Null),
                data: None,
            };
            let spec = slipstream_k8s::istio::peer_authentication(&kept).map_err(|fes| {
                let mut e = err.clone();
                e.field = fes.iter().map(|f| f.field.as_str()).collect::<Vec<_>>().join(", ");
                e.message = fes.iter().map(|f| f.message.as_str()).collect::<Vec<_>>().join("; ");
                e
            })?;
            let mut pa: Box<PeerAuthentication> = typed(value, &err)?;
            pa.spec = spec;
            ClusterObject::PeerAuthentication(pa)
        }
        _ => {
            let mut rest = match value {
                serde_json::Value::Object(m) => m,
                _ => Default::default(),
            };
            rest.remove("apiVersion");
            rest.remove("kind");
            let meta = rest.remove("metadata").unwrap_or_default();
            let metadata = typed::<ObjectMeta>(meta, &err).map_err(|mut e| {
                e.field = format!("metadata.{}", e.field).trim_end_matches('.').to_string();
                e
            })?;
            ClusterObject::Opaque(Box::new(OpaqueObject { api_version, kind, metadata: *metadata, rest }))
        }
    };
    Ok(Some(object))
}

fn typed<T: serde::de::DeserializeOwned>(value: serde_json::Value, err: &ObjectError) -> Result<Box<T>, ObjectError> {
    serde_path_to_error::deserialize(value).map(Box::new).map_err(|e| {
        let mut out = err.clone();
        out.field = e.path().to_string();
        if out.field == "." {
            out.field.clear();
        }
        out.message = e.into_inner().to_string();
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::parse_manifests;

    #[test]
    fn kinds_from_types() {
        assert_eq!(Kind::from_type("v1", "Pod"), Some(Kind::Pod));
        assert_eq!(Kind::from_type("discovery.k8s.io/v1", "EndpointSlice"), Some(Kind::EndpointSlice));
        assert_eq!(Kind::from_type("security.istio.io/v1beta1", "AuthorizationPolicy"), Some(Kind::AuthorizationPolicy));
        assert_eq!(Kind::from_type("gateway.networking.k8s.io/v1", "HTTPRoute"), Some(Kind::HTTPRoute));
        assert_eq!(Kind::from_type("apps/v1", "Deployment"), None);
        assert_eq!(Kind::from_type("v2", "Pod"), None);
        assert_eq!(Kind::from_type("v1", "AuthorizationPolicy"), None, "wrong group");
    }

    #[test]
    fn documents_lists_and_defaults() {
        let y = r#"
apiVersion: v1
kind: Namespace
metadata: {name: demo, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: skipped}
---
{"apiVersion": "v1", "kind": "List", "items": [
  {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "web"}},
  {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "np", "namespace": "demo"}, "spec": {"podSelector": {}}}
]}
"#;
        let objs = parse_manifests(y).unwrap();
        let refs: Vec<String> = objs.iter().map(|o| o.object_ref().to_string()).collect();
        assert_eq!(refs, ["Namespace demo", "ServiceAccount default/web", "NetworkPolicy demo/np"]);
    }

    #[test]
    fn errors_name_object_and_field() {
        let cases = [
            (
                "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: demo}\nspec: {containers: [{name: c, ports: [{containerPort: x}]}]}\n",
                "Pod demo/p: spec.containers[0].ports[0].containerPort: invalid type: string \"x\", expected i32",
            ),
            (
                "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: demo}\nspec: {containers: []}\nstatus: {podIP: not-an-ip}\n",
                "Pod demo/p: status.podIP: \"not-an-ip\" is not an IP address",
            ),
            (
                "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec: {ports: [{port: 70000}]}\n",
                "Service default/s: spec.ports[0].port: 70000 is not a port (1-65535)",
            ),
            (
                "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: ext, namespace: demo}\nspec: {action: CUSTOM, provider: {name: opa}}\n",
                "AuthorizationPolicy demo/ext: spec.action: CUSTOM (external authorization) is not supported",
            ),
            (
                "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: a, namespace: demo}\nspec: {rules: [{from: [{source: {principal: [x]}}]}]}\n",
                "AuthorizationPolicy demo/a: spec.rules[0].from[0].source.principal: unknown field `principal`",
            ),
            (
                "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: pa, namespace: demo}\nspec: {mtls: {mode: STRICTEST}}\n",
                "PeerAuthentication demo/pa: spec.mtls.mode: unknown variant `STRICTEST`",
            ),
            ("kind: Pod\nmetadata: {name: p}\n", "Pod p: apiVersion: required (a non-empty string)"),
            ("a: [", "(document 1): not valid YAML"),
        ];
        for (y, want) in cases {
            let e = parse_manifests(y).unwrap_err();
            assert_eq!(e.len(), 1, "{e:?}");
            assert!(e[0].to_string().starts_with(want), "got {}\nwant {want}", e[0]);
        }
    }
}
