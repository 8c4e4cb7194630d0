//! Workloads and services as the node proxy sees them. Field names follow
//! `istio.workload` so that converting from the wire (`TryFrom<proto::...>`)
//! is a field-by-field copy.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::IpAddr;

/// One definition, in `spiffe`; named here too because the workload API
/// reads an empty `trust_domain` as this one.
pub use crate::spiffe::DEFAULT_TRUST_DOMAIN;
/// Istio's root namespace: its policies apply mesh-wide.
pub const ROOT_NAMESPACE: &str = "istio-system";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TunnelProtocol {
    /// Not meshed: traffic to it passes through in plaintext.
    #[default]
    None,
    Hbone,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum WorkloadStatus {
    #[default]
    Healthy,
    Unhealthy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum WorkloadType {
    #[default]
    Deployment,
    Cronjob,
    Pod,
    Job,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Port {
    pub service_port: u16,
    pub target_port: u16,
    /// The port's declared protocol (the Service port's `appProtocol`, or
    /// its name's prefix, as Istio reads them): a waypoint handles a port
    /// declared HTTP, HTTP/2 or gRPC as HTTP whatever its clients send.
    #[serde(default)]
    pub app_protocol: AppProtocol,
}

/// `istio.workload.AppProtocol`, with its numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, PartialOrd, Ord, Hash)]
pub enum AppProtocol {
    /// Not declared: the waypoint looks at what the client sends.
    #[default]
    Unknown = 0,
    Http11 = 1,
    Http2 = 2,
    Grpc = 3,
    Tcp = 4,
    Tls = 5,
}

impl AppProtocol {
    /// HTTP in any version: handled as HTTP, never passed through as TCP.
    pub fn is_http(self) -> bool {
        matches!(self, AppProtocol::Http11 | AppProtocol::Http2 | AppProtocol::Grpc)
    }

    /// As Istio reads a Service port (`appProtocol`, which wins, else the
    /// name: the whole name or its prefix before `-`, case-insensitive);
    /// None for a protocol the workload API has no value for (UDP, Mongo,
    /// Redis, ...), which is not HTTP.
    pub fn of_port(app_protocol: Option<&str>, name: Option<&str>) -> AppProtocol {
        let named = |s: &str| -> Option<AppProtocol> {
            Some(match s.to_ascii_lowercase().as_str() {
                "http" | "http1" | "http/1.1" | "kubernetes.io/ws" | "kubernetes.io/wss" => AppProtocol::Http11,
                "http2" | "h2" | "h2c" | "kubernetes.io/h2c" | "grpc-web" => AppProtocol::Http2,
                "grpc" => AppProtocol::Grpc,
                "tcp" => AppProtocol::Tcp,
                "tls" | "https" => AppProtocol::Tls,
                _ => return None,
            })
        };
        if let Some(p) = app_protocol.filter(|p| !p.is_empty()) {
            return named(p).unwrap_or(AppProtocol::Unknown);
        }
        let name = name.unwrap_or_default();
        named(name).or_else(|| named(name.split_once('-').map_or("", |(p, _)| p))).unwrap_or(AppProtocol::Unknown)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Workload {
    /// Resource name: `<cluster>//Pod/<namespace>/<name>` as Istio forms it.
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub addresses: Vec<IpAddr>,
    #[serde(default)]
    pub network: String,
    #[serde(default)]
    pub tunnel_protocol: TunnelProtocol,
    /// Empty means cluster.local.
    #[serde(default)]
    pub trust_domain: String,
    /// Empty means `default`.
    #[serde(default)]
    pub service_account: String,
    #[serde(default)]
    pub node: String,
    #[serde(default)]
    pub canonical_name: String,
    #[serde(default)]
    pub canonical_revision: String,
    #[serde(default)]
    pub workload_type: WorkloadType,
    #[serde(default)]
    pub workload_name: String,
    /// `namespace/hostname` of each service selecting it, with the ports
    /// resolved for this workload.
    #[serde(default)]
    pub services: BTreeMap<String, Vec<Port>>,
    #[serde(default)]
    pub authorization_policies: Vec<String>,
    #[serde(default)]
    pub status: WorkloadStatus,
    #[serde(default)]
    pub cluster_id: String,
    /// Load-balancing weight; 0 is read as the default, 1.
    #[serde(default)]
    pub capacity: u32,
    /// The waypoint that traffic addressed to this pod's own IP goes
    /// through (docs/waypoint.md, "Binding").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waypoint: Option<GatewayAddress>,
}

impl Workload {
    pub fn trust_domain(&self) -> &str {
        if self.trust_domain.is_empty() {
            DEFAULT_TRUST_DOMAIN
        } else {
            &self.trust_domain
        }
    }
    pub fn service_account(&self) -> &str {
        if self.service_account.is_empty() {
            "default"
        } else {
            &self.service_account
        }
    }
    /// `spiffe://<td>/ns/<ns>/sa/<sa>`.
    pub fn spiffe_id(&self) -> String {
        format!("spiffe://{}/ns/{}/sa/{}", self.trust_domain(), self.namespace, self.service_account())
    }
    pub fn capacity(&self) -> u32 {
        self.capacity.max(1)
    }
    pub fn meshed(&self) -> bool {
        self.tunnel_protocol == TunnelProtocol::Hbone
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkAddress {
    #[serde(default)]
    pub network: String,
    pub address: IpAddr,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Service {
    pub name: String,
    pub namespace: String,
    /// `name.namespace.svc.cluster.local`.
    pub hostname: String,
    pub addresses: Vec<NetworkAddress>,
    pub ports: Vec<Port>,
    #[serde(default)]
    pub subject_alt_names: Vec<String>,
    /// The waypoint that traffic addressed to this service goes through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waypoint: Option<GatewayAddress>,
}

/// Where a waypoint is: the hostname of its Service (the workload API's
/// `GatewayAddress` with a `NamespacedHostname`, the only form the control
/// plane writes) and its HBONE port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Hash, PartialOrd, Ord)]
pub struct GatewayAddress {
    pub namespace: String,
    /// `name.namespace.svc.cluster.local`.
    pub hostname: String,
    pub hbone_mtls_port: u16,
}

impl GatewayAddress {
    /// The key of the waypoint's Service in the workload API.
    pub fn service_key(&self) -> String {
        format!("{}/{}", self.namespace, self.hostname)
    }
}

impl Service {
    /// Resource name in the workload API: `namespace/hostname`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.hostname)
    }
}

/// A pod of this node and the network namespace it lives in: what the CNI
/// plugin hands the node proxy in Kubernetes (ztunnel's in-pod protocol).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRegistration {
    pub uid: String,
    /// Path of the network namespace (`/run/netns/<name>`).
    pub netns: String,
    /// The pod's address, from its CNI result, when the control plane may
    /// not know it yet: on Kubernetes a pod is registered before its
    /// sandbox exists for the API server, so the proxy opens its listeners
    /// on this address and the pod's first connection waits for its
    /// workload (and certificate). Absent in the local cluster, whose
    /// control plane always knows the pod first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<std::net::IpAddr>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct NodePods {
    pub pods: Vec<PodRegistration>,
}

/// What the node proxy reports back: the pods it serves (listeners open).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Served {
    pub uids: Vec<String>,
}
