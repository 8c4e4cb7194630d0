//! From one object to what the index keeps of it: validated once here,
//! then held in small typed inputs ([`PodInput`], [`ServiceInput`], ...)
//! so the index never looks at a Kubernetes type again. Pure and per
//! object: whatever needs several objects (which services select a pod,
//! which policies apply) is the index's work.
//!
//! Waypoints: Gateways of class `istio-waypoint` become
//! [`Input::Gateway`]; the index resolves each service's and pod's
//! `istio.io/use-waypoint` against them ([`waypoint::bind`]) and fills the
//! workload API's `waypoint` fields.

pub mod authorization;
pub mod http_route;
pub mod mesh_config;
pub mod network_policy;
pub mod peer_authentication;
pub mod rate_limit;
pub mod request_authentication;
pub mod virtual_service;
pub mod waypoint;

use crate::objects::{parse_value, ClusterObject, ObjectError, ObjectRef};
use k8s_openapi::api::core::v1 as core_v1;
use k8s_openapi::api::discovery::v1 as discovery_v1;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Deserialize;
use slipstream_core::WorkloadType;
use std::collections::BTreeMap;
use std::net::IpAddr;

pub type Labels = BTreeMap<String, String>;

/// The label Istio users put on namespaces and pods to mesh them.
pub const DATAPLANE_MODE: &str = "istio.io/dataplane-mode";
/// The label that binds a namespace, service or pod to a waypoint.
pub const USE_WAYPOINT: &str = "istio.io/use-waypoint";
/// Marks an AuthorizationPolicy as dry-run (logged, never enforced).
pub const DRY_RUN_ANNOTATION: &str = "istio.io/dry-run";
/// The label an EndpointSlice names its Service with.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Meshed when the pod says `ambient`, or its namespace does and the pod
/// does not opt out with `none` (the local cluster's agent uses the same
/// rule when it installs capture).
pub fn is_meshed(namespace_labels: &Labels, pod_labels: &Labels) -> bool {
    match pod_labels.get(DATAPLANE_MODE).map(String::as_str) {
        Some("none") => false,
        Some("ambient") => true,
        _ => namespace_labels.get(DATAPLANE_MODE).map(String::as_str) == Some("ambient"),
    }
}

/// Every pair of `selector` is in `labels`.
pub fn selector_matches(selector: &Labels, labels: &Labels) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// One object as the index keeps it.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    Namespace(NamespaceInput),
    ServiceAccount,
    Pod(PodInput),
    Service(ServiceInput),
    EndpointSlice(SliceInput),
    AuthorizationPolicy(Box<authorization::PolicyInput>),
    PeerAuthentication(peer_authentication::PeerAuthnInput),
    NetworkPolicy(network_policy::NetPolicyInput),
    Gateway(waypoint::GatewayInput),
    HttpRoute(Box<http_route::HttpRouteInput>),
    /// A GRPCRoute, read as the HTTPRoute it means on the wire.
    GrpcRoute(Box<http_route::HttpRouteInput>),
    VirtualService(Box<virtual_service::VirtualServiceInput>),
    DestinationRule(Box<virtual_service::DestinationRuleInput>),
    RateLimit(Box<rate_limit::RateLimitInput>),
    RequestAuthentication(Box<request_authentication::RequestAuthnInput>),
    /// The root namespace's `istio` ConfigMap: the mesh's settings.
    MeshConfig(slipstream_core::mesh::MeshSettings),
    /// A kind kept for later work; it changes no resource yet.
    Opaque,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct NamespaceInput {
    pub labels: Labels,
    pub use_waypoint: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PodInput {
    pub name: String,
    pub namespace: String,
    pub labels: Labels,
    /// `status.podIPs` (or `status.podIP`); empty until the pod has one
    /// (a scheduled pod is published without one, `index::derive`).
    pub ips: Vec<IpAddr>,
    pub node: String,
    /// `default` when the spec names none.
    pub service_account: String,
    /// The `Ready` condition is `True`.
    pub ready: bool,
    /// `Succeeded` or `Failed`: its address may already be someone else's.
    pub terminal: bool,
    /// Deleted, waiting for its containers to stop.
    pub terminating: bool,
    /// On the node's network: never captured, never meshed.
    pub host_network: bool,
    pub workload_type: WorkloadType,
    pub workload_name: String,
    pub container_ports: Vec<ContainerPort>,
    pub use_waypoint: Option<String>,
    /// The spec, as the API serves it, of a pod labelled with a waypoint
    /// Gateway's name: compared with the Gateway's rendered template
    /// before the pod is treated as the waypoint
    /// (`crate::gateway::genuine`). None for every other pod.
    pub waypoint_spec: Option<std::sync::Arc<serde_json::Value>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerPort {
    pub name: Option<String>,
    pub protocol: String,
    pub port: u16,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServiceInput {
    pub name: String,
    pub namespace: String,
    /// None: the service has no selector (or an empty one) and its members
    /// come from EndpointSlices.
    pub selector: Option<Labels>,
    /// `spec.clusterIPs` (or `spec.clusterIP`); empty for headless services.
    pub addresses: Vec<IpAddr>,
    pub ports: Vec<ServicePortInput>,
    pub use_waypoint: Option<String>,
    /// Its labels (the waypoint binding reads them).
    pub labels: Labels,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePortInput {
    pub name: Option<String>,
    pub protocol: String,
    pub port: u16,
    pub target: TargetPort,
    /// Its declared protocol (`appProtocol`, else the name's prefix).
    pub app_protocol: slipstream_core::AppProtocol,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetPort {
    Number(u16),
    /// Resolved per pod against its containers' ports.
    Named(String),
}

impl ServicePortInput {
    /// The target port on one pod (the rule of the local cluster's
    /// `plan::resolve_target_port`): a named port is the first container
    /// port of that name and protocol; none found means the pod does not
    /// serve this port.
    pub fn target_on(&self, pod: &PodInput) -> Option<u16> {
        match &self.target {
            TargetPort::Number(n) => Some(*n),
            TargetPort::Named(name) => {
                pod.container_ports.iter().find(|c| c.name.as_deref() == Some(name) && c.protocol == self.protocol).map(|c| c.port)
            }
        }
    }

    /// The port the service resource carries: named ports are 0 there.
    pub fn wire_target(&self) -> u16 {
        match self.target {
            TargetPort::Number(n) => n,
            TargetPort::Named(_) => 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct SliceInput {
    /// The service it belongs to (label `kubernetes.io/service-name`).
    pub service: Option<String>,
    pub ports: Vec<SlicePort>,
    pub endpoints: Vec<SliceEndpoint>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlicePort {
    pub name: Option<String>,
    pub protocol: String,
    pub port: u16,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct SliceEndpoint {
    pub addresses: Vec<IpAddr>,
    /// `targetRef` when it is a Pod of the slice's namespace.
    pub pod: Option<String>,
}

/// Validates `o` and turns it into what the index keeps. `root_namespace`
/// decides whether an AuthorizationPolicy is mesh-wide.
pub fn input(o: &ClusterObject) -> Result<Input, ObjectError> {
    input_with_root(o, slipstream_core::ROOT_NAMESPACE, DEFAULT_DOMAIN_SUFFIX)
}

/// Every Service's hostname is `<name>.<namespace>.svc.<this>` unless the
/// control plane is told otherwise (`--domain-suffix`, istiod's `--domain`).
pub const DEFAULT_DOMAIN_SUFFIX: &str = "cluster.local";

/// As [`input`], for a mesh whose root namespace and cluster domain are
/// these (a VirtualService's `hosts` may name `name.ns.svc.<domain>`).
pub fn input_with_root(o: &ClusterObject, root_namespace: &str, domain_suffix: &str) -> Result<Input, ObjectError> {
    let r = o.object_ref();
    if r.name.is_empty() {
        return Err(ObjectError::new(&r, "metadata.name", "required"));
    }
    if !r.kind.is_cluster_scoped() && r.namespace.is_empty() {
        return Err(ObjectError::new(&r, "metadata.namespace", "required"));
    }
    Ok(match o {
        ClusterObject::Namespace(n) => Input::Namespace(namespace(n)),
        ClusterObject::ServiceAccount(_) => Input::ServiceAccount,
        ClusterObject::Pod(p) => Input::Pod(pod(p, &r)?),
        ClusterObject::Service(s) => Input::Service(service(s, &r)?),
        ClusterObject::EndpointSlice(s) => Input::EndpointSlice(slice(s, &r)?),
        ClusterObject::AuthorizationPolicy(p) => Input::AuthorizationPolicy(Box::new(authorization::translate(p, &r, root_namespace)?)),
        ClusterObject::PeerAuthentication(p) => Input::PeerAuthentication(peer_authentication::input(p)),
        ClusterObject::NetworkPolicy(p) => Input::NetworkPolicy(network_policy::network_policy(p, &r)?),
        ClusterObject::CiliumNetworkPolicy(p) => Input::NetworkPolicy(network_policy::cilium_network_policy(p, &r)?),
        ClusterObject::Opaque(o) if o.kind == crate::objects::Kind::Gateway => Input::Gateway(waypoint::gateway(o)?),
        ClusterObject::Opaque(o) if o.kind == crate::objects::Kind::HTTPRoute => Input::HttpRoute(Box::new(http_route::http_route(o)?)),
        ClusterObject::Opaque(o) if o.kind == crate::objects::Kind::GRPCRoute => Input::GrpcRoute(Box::new(http_route::grpc_route(o)?)),
        ClusterObject::Opaque(o) if o.kind == crate::objects::Kind::VirtualService => {
            Input::VirtualService(Box::new(virtual_service::virtual_service(o, domain_suffix)?))
        }
        ClusterObject::Opaque(o) if o.kind == crate::objects::Kind::DestinationRule => {
            Input::DestinationRule(Box::new(virtual_service::destination_rule(o, domain_suffix)?))
        }
        ClusterObject::Opaque(o) if o.kind == crate::objects::Kind::ConfigMap => {
            if mesh_config::is_mesh_config(&r, root_namespace) {
                Input::MeshConfig(mesh_config::mesh_settings(o, &r)?)
            } else {
                Input::Opaque
            }
        }
        ClusterObject::Opaque(o) if o.kind == crate::objects::Kind::LocalRateLimitPolicy => {
            Input::RateLimit(Box::new(rate_limit::rate_limit(o)?))
        }
        ClusterObject::Opaque(o) if o.kind == crate::objects::Kind::RequestAuthentication => {
            Input::RequestAuthentication(Box::new(request_authentication::request_authentication(o, domain_suffix)?))
        }
        ClusterObject::Opaque(_) => Input::Opaque,
    })
}

fn labels_of(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Labels {
    m.labels.clone().unwrap_or_default()
}

/// The label the API server puts on every namespace (Kubernetes 1.21 and
/// later), which policies select namespaces by: set here too, so that a
/// directory of manifests (the local cluster) means what it means on a
/// cluster.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

fn namespace(n: &core_v1::Namespace) -> NamespaceInput {
    let mut labels = labels_of(&n.metadata);
    if let Some(name) = &n.metadata.name {
        labels.insert(NAMESPACE_NAME_LABEL.into(), name.clone());
    }
    NamespaceInput { use_waypoint: labels.get(USE_WAYPOINT).cloned(), labels }
}

fn parse_ip(s: &str, r: &ObjectRef, field: &str) -> Result<IpAddr, ObjectError> {
    s.parse().map_err(|_| ObjectError::new(r, field, format!("{s:?} is not an IP address")))
}

fn port_number(v: i32, r: &ObjectRef, field: &str) -> Result<u16, ObjectError> {
    u16::try_from(v).ok().filter(|p| *p > 0).ok_or_else(|| ObjectError::new(r, field, format!("{v} is not a port (1-65535)")))
}

fn protocol(p: &Option<String>) -> String {
    p.clone().unwrap_or_else(|| "TCP".into())
}

/// Addresses from the plural field, checked against the singular one that
/// Kubernetes keeps equal to its first entry.
fn addresses<'a>(
    single: Option<&'a str>,
    plural: impl Iterator<Item = &'a str>,
    r: &ObjectRef,
    single_field: &str,
    plural_field: &str,
) -> Result<Vec<IpAddr>, ObjectError> {
    let single = single.filter(|s| !s.is_empty()).map(|s| parse_ip(s, r, single_field)).transpose()?;
    let plural =
        plural.enumerate().map(|(i, s)| parse_ip(s, r, &format!("{plural_field}[{i}]"))).collect::<Result<Vec<IpAddr>, ObjectError>>()?;
    match (single, plural.first()) {
        (Some(s), Some(first)) if s != *first => Err(ObjectError::new(
            r,
            plural_field,
            format!("the first address ({first}) must be {single_field} ({s}), as Kubernetes keeps them"),
        )),
        (Some(s), None) => Ok(vec![s]),
        _ => Ok(plural),
    }
}

fn pod(p: &core_v1::Pod, r: &ObjectRef) -> Result<PodInput, ObjectError> {
    let labels = labels_of(&p.metadata);
    let spec = p.spec.clone().unwrap_or_default();
    let status = p.status.clone().unwrap_or_default();
    let ips =
        addresses(status.pod_ip.as_deref(), status.pod_ips.iter().flatten().map(|i| i.ip.as_str()), r, "status.podIP", "status.podIPs")?;
    let mut container_ports = Vec::new();
    for (ci, c) in spec.containers.iter().enumerate() {
        for (pi, cp) in c.ports.iter().flatten().enumerate() {
            let port = port_number(cp.container_port, r, &format!("spec.containers[{ci}].ports[{pi}].containerPort"))?;
            container_ports.push(ContainerPort { name: cp.name.clone().filter(|n| !n.is_empty()), protocol: protocol(&cp.protocol), port });
        }
    }
    let ready = status.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True");
    let phase = status.phase.as_deref().unwrap_or("");
    let (workload_type, workload_name) = owner(&p.metadata, &labels, &r.name);
    Ok(PodInput {
        name: r.name.clone(),
        namespace: r.namespace.clone(),
        ips,
        node: spec.node_name.clone().unwrap_or_default(),
        service_account: spec
            .service_account_name
            .clone()
            .or(spec.service_account.clone())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "default".into()),
        ready,
        terminal: matches!(phase, "Succeeded" | "Failed"),
        terminating: p.metadata.deletion_timestamp.is_some(),
        host_network: spec.host_network == Some(true),
        workload_type,
        workload_name,
        container_ports,
        use_waypoint: labels.get(USE_WAYPOINT).cloned(),
        waypoint_spec: labels
            .contains_key(waypoint::GATEWAY_NAME_LABEL)
            .then(|| serde_json::to_value(&spec).map(std::sync::Arc::new).ok())
            .flatten(),
        labels,
    })
}

/// The workload a pod belongs to, from its controller: a ReplicaSet is its
/// Deployment's (the `pod-template-hash` suffix removed), a Job is a Job
/// (a CronJob's Jobs cannot be told from the pod alone), other controllers
/// (StatefulSet, DaemonSet) keep their name with the type POD, as Istio
/// reports them; a pod without one is itself.
fn owner(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, labels: &Labels, pod: &str) -> (WorkloadType, String) {
    let owners = m.owner_references.as_deref().unwrap_or(&[]);
    let Some(o) = owners.iter().find(|o| o.controller == Some(true)).or(owners.first()) else {
        return (WorkloadType::Pod, pod.to_string());
    };
    match o.kind.as_str() {
        "ReplicaSet" => {
            let name = labels
                .get("pod-template-hash")
                .and_then(|h| o.name.strip_suffix(h.as_str())?.strip_suffix('-'))
                .unwrap_or(&o.name)
                .to_string();
            (WorkloadType::Deployment, name)
        }
        "Deployment" => (WorkloadType::Deployment, o.name.clone()),
        "Job" => (WorkloadType::Job, o.name.clone()),
        "CronJob" => (WorkloadType::Cronjob, o.name.clone()),
        _ => (WorkloadType::Pod, o.name.clone()),
    }
}

fn service(s: &core_v1::Service, r: &ObjectRef) -> Result<ServiceInput, ObjectError> {
    let spec = s.spec.clone().unwrap_or_default();
    let none = |v: &&str| !v.is_empty() && *v != "None";
    let headless = spec.cluster_ip.as_deref() == Some("None");
    let addresses = if headless {
        Vec::new()
    } else {
        addresses(
            spec.cluster_ip.as_deref().filter(none),
            spec.cluster_ips.iter().flatten().map(String::as_str).filter(none),
            r,
            "spec.clusterIP",
            "spec.clusterIPs",
        )?
    };
    let mut ports = Vec::new();
    for (i, p) in spec.ports.iter().flatten().enumerate() {
        let port = port_number(p.port, r, &format!("spec.ports[{i}].port"))?;
        let target = match &p.target_port {
            None => TargetPort::Number(port),
            Some(IntOrString::Int(t)) => TargetPort::Number(port_number(*t, r, &format!("spec.ports[{i}].targetPort"))?),
            Some(IntOrString::String(n)) if n.is_empty() => {
                return Err(ObjectError::new(r, format!("spec.ports[{i}].targetPort"), "an empty port name"))
            }
            Some(IntOrString::String(n)) => match n.parse::<i32>() {
                // Kubernetes reads a number given as a string as that number.
                Ok(t) => TargetPort::Number(port_number(t, r, &format!("spec.ports[{i}].targetPort"))?),
                Err(_) => TargetPort::Named(n.clone()),
            },
        };
        let name = p.name.clone().filter(|n| !n.is_empty());
        // UDP and SCTP are never HTTP, whatever the name says.
        let app_protocol = match p.protocol.as_deref() {
            None | Some("TCP") => slipstream_core::AppProtocol::of_port(p.app_protocol.as_deref(), name.as_deref()),
            Some(_) => slipstream_core::AppProtocol::Unknown,
        };
        ports.push(ServicePortInput { name, protocol: protocol(&p.protocol), port, target, app_protocol });
    }
    let labels = labels_of(&s.metadata);
    Ok(ServiceInput {
        name: r.name.clone(),
        namespace: r.namespace.clone(),
        // An empty selector is stored by the API server as none.
        selector: spec.selector.clone().filter(|s| !s.is_empty()),
        addresses,
        ports,
        use_waypoint: labels.get(USE_WAYPOINT).cloned(),
        labels,
    })
}

fn slice(s: &discovery_v1::EndpointSlice, r: &ObjectRef) -> Result<SliceInput, ObjectError> {
    let ip_type = match s.address_type.as_str() {
        "IPv4" | "IPv6" => true,
        "FQDN" => false,
        other => return Err(ObjectError::new(r, "addressType", format!("{other:?} is not one of IPv4, IPv6, FQDN"))),
    };
    let mut ports = Vec::new();
    for (i, p) in s.ports.iter().flatten().enumerate() {
        // A port without a number means "all ports": nothing to map.
        let Some(n) = p.port else { continue };
        ports.push(SlicePort {
            name: p.name.clone().filter(|n| !n.is_empty()),
            protocol: protocol(&p.protocol),
            port: port_number(n, r, &format!("ports[{i}].port"))?,
        });
    }
    let mut endpoints = Vec::new();
    for (i, e) in s.endpoints.iter().enumerate() {
        let addresses = if ip_type {
            e.addresses
                .iter()
                .enumerate()
                .map(|(j, a)| parse_ip(a, r, &format!("endpoints[{i}].addresses[{j}]")))
                .collect::<Result<Vec<_>, _>>()?
        } else {
            Vec::new()
        };
        let pod = e
            .target_ref
            .as_ref()
            .filter(|t| t.kind.as_deref() == Some("Pod") && t.namespace.as_deref().is_none_or(|n| n == r.namespace))
            .and_then(|t| t.name.clone());
        endpoints.push(SliceEndpoint { addresses, pod });
    }
    let service = s.metadata.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL)).cloned();
    Ok(SliceInput { service, ports, endpoints })
}

/// Checks an object as the index would take it: an object that passes
/// is applied; one that fails changes nothing.
pub fn validate(o: &ClusterObject) -> Result<(), ObjectError> {
    input(o).map(drop)
}

/// Every object of `text` (YAML or JSON; several documents; `kind: List`
/// flattened), each parsed and validated, or every error found. Documents
/// of kinds the control plane does not read (Deployments, ConfigMaps, ...)
/// are skipped. A namespaced object without `metadata.namespace` is in
/// `default`, as `kubectl apply` would put it.
pub fn parse_manifests(text: &str) -> Result<Vec<ClusterObject>, Vec<ObjectError>> {
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let whole = |message: String| ObjectError {
            kind: String::new(),
            namespace: String::new(),
            name: format!("(document {})", i + 1),
            field: String::new(),
            message,
        };
        let value = match serde_yaml::Value::deserialize(doc) {
            Ok(v) => v,
            Err(e) => {
                errors.push(whole(format!("not valid YAML: {e}")));
                // A YAML stream cannot be resynchronised after a syntax error.
                break;
            }
        };
        if value.is_null() {
            continue;
        }
        let value = match serde_json::to_value(&value) {
            Ok(v) => v,
            Err(e) => {
                errors.push(whole(format!("cannot be represented as JSON: {e}")));
                continue;
            }
        };
        let items = match value.get("kind").and_then(|k| k.as_str()) {
            Some("List") => match value.get("items").and_then(|i| i.as_array()) {
                Some(items) => items.clone(),
                None => {
                    errors.push(whole("a List needs an `items` array".into()));
                    continue;
                }
            },
            _ => vec![value],
        };
        for item in items {
            match parse_value(item) {
                Ok(Some(o)) => match validate(&o) {
                    Ok(()) => out.push(o),
                    Err(e) => errors.push(e),
                },
                Ok(None) => {}
                Err(e) => errors.push(e),
            }
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::parse_value;

    fn pod_input(extra: serde_json::Value) -> Result<PodInput, ObjectError> {
        let mut v =
            serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-7d4f9c8b6d-x2x9z", "namespace": "demo"}});
        merge(&mut v, extra);
        let o = parse_value(v).unwrap().unwrap();
        match input(&o)? {
            Input::Pod(p) => Ok(p),
            other => panic!("{other:?}"),
        }
    }

    fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    #[test]
    fn owners_to_workload_type_and_name() {
        let owned = |kind: &str, name: &str| {
            serde_json::json!({"metadata": {"labels": {"pod-template-hash": "7d4f9c8b6d"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": "u", "controller": true}]}})
        };
        let cases = [
            (owned("ReplicaSet", "web-7d4f9c8b6d"), WorkloadType::Deployment, "web"),
            (owned("ReplicaSet", "standalone"), WorkloadType::Deployment, "standalone"),
            (owned("Job", "backup-28999"), WorkloadType::Job, "backup-28999"),
            (owned("CronJob", "backup"), WorkloadType::Cronjob, "backup"),
            (owned("StatefulSet", "db"), WorkloadType::Pod, "db"),
            (serde_json::json!({}), WorkloadType::Pod, "web-7d4f9c8b6d-x2x9z"),
        ];
        for (extra, t, name) in cases {
            let p = pod_input(extra.clone()).unwrap();
            assert_eq!((p.workload_type, p.workload_name.as_str()), (t, name), "{extra}");
        }
    }

    #[test]
    fn pod_status_fields() {
        let p = pod_input(serde_json::json!({
            "spec": {"nodeName": "node1", "serviceAccountName": "web", "containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]},
            "status": {"phase": "Running", "podIP": "10.244.1.2", "podIPs": [{"ip": "10.244.1.2"}, {"ip": "fd00::2"}],
                "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        assert_eq!(p.ips, vec!["10.244.1.2".parse::<IpAddr>().unwrap(), "fd00::2".parse().unwrap()]);
        assert_eq!((p.node.as_str(), p.service_account.as_str(), p.ready, p.terminal), ("node1", "web", true, false));
        assert_eq!(p.container_ports, vec![ContainerPort { name: Some("http".into()), protocol: "TCP".into(), port: 8080 }]);
        let p =
            pod_input(serde_json::json!({"status": {"phase": "Succeeded", "conditions": [{"type": "Ready", "status": "False"}]}})).unwrap();
        assert!(p.ips.is_empty() && !p.ready && p.terminal);
        assert_eq!(p.service_account, "default");
        let e = pod_input(serde_json::json!({"status": {"podIP": "10.244.1.2", "podIPs": [{"ip": "10.244.1.3"}]}})).unwrap_err();
        assert_eq!(e.to_string(), "Pod demo/web-7d4f9c8b6d-x2x9z: status.podIPs: the first address (10.244.1.3) must be status.podIP (10.244.1.2), as Kubernetes keeps them");
        let e = pod_input(serde_json::json!({"spec": {"containers": [{"name": "c", "ports": [{"containerPort": 0}]}]}})).unwrap_err();
        assert_eq!(e.field, "spec.containers[0].ports[0].containerPort");
    }
}
