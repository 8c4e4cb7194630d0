//! The wire contract as code (docs/protocols.md sections 3 and 4): the
//! messages and gRPC services of the ambient workload API, delta xDS and
//! Istio's certificate service, generated from `proto/` at build time, and
//! the conversions between those messages and the mesh model of
//! `slipstream-core`.
//!
//! Conversions from the wire validate what the model cannot represent and
//! name the field that was wrong ([`ConvertError`]); the node proxy NACKs a
//! resource that does not convert. Conversions to the wire are total.
#![forbid(unsafe_code)]

pub mod convert;
pub mod mesh;
pub mod netpol;
pub mod routes;

/// `envoy.service.discovery.v3`: the delta aggregated discovery service.
pub mod discovery {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("envoy.service.discovery.v3");
}

/// `istio.workload`: `Address` resources (workloads and services).
pub mod workload {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("istio.workload");
}

/// `istio.security`: `Authorization` resources.
pub mod security {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("istio.security");
}

/// `slipstream.policy`: network-policy resources (our own type).
pub mod netpolicy {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("slipstream.policy");
}

/// `slipstream.route.v1`: the waypoint's routes (our own type).
pub mod route {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("slipstream.route.v1");
}

/// `slipstream.mesh.v1`: mesh-wide settings for waypoints (our own type).
pub mod meshpb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("slipstream.mesh.v1");
}

/// `istio.v1.auth`: the certificate service.
pub mod ca {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("istio.v1.auth");
}

pub use convert::ConvertError;

/// Type URL of workload and service resources.
pub const ADDRESS_TYPE_URL: &str = "type.googleapis.com/istio.workload.Address";
/// Type URL of authorization resources.
pub const AUTHORIZATION_TYPE_URL: &str = "type.googleapis.com/istio.security.Authorization";

/// Type URL of network-policy resources (Slipstream's own).
pub const NETWORK_POLICY_TYPE_URL: &str = "type.googleapis.com/slipstream.policy.NetworkPolicy";
/// Type URL of the waypoint's routes, one resource per service (Slipstream's own).
pub const ROUTE_TYPE_URL: &str = "type.googleapis.com/slipstream.route.v1.ServiceRoutes";
/// Type URL of the mesh-wide settings for waypoints, one resource named
/// [`MESH_RESOURCE`] (Slipstream's own).
pub const MESH_TYPE_URL: &str = "type.googleapis.com/slipstream.mesh.v1.MeshSettings";
/// The name of the one mesh-settings resource.
pub const MESH_RESOURCE: &str = "mesh";

/// The resource types served: the workload API's two, the network
/// policies, and the waypoints' routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TypeUrl {
    Address,
    Authorization,
    NetworkPolicy,
    Route,
    Mesh,
}

impl TypeUrl {
    pub const ALL: [TypeUrl; 5] = [TypeUrl::Address, TypeUrl::Authorization, TypeUrl::NetworkPolicy, TypeUrl::Route, TypeUrl::Mesh];
    /// What a node proxy subscribes to (ztunnel's two, and ours).
    pub const NODE: [TypeUrl; 3] = [TypeUrl::Address, TypeUrl::Authorization, TypeUrl::NetworkPolicy];
    /// What a waypoint subscribes to.
    pub const WAYPOINT: [TypeUrl; 4] = [TypeUrl::Address, TypeUrl::Authorization, TypeUrl::Route, TypeUrl::Mesh];

    pub fn as_str(self) -> &'static str {
        match self {
            TypeUrl::Address => ADDRESS_TYPE_URL,
            TypeUrl::Authorization => AUTHORIZATION_TYPE_URL,
            TypeUrl::NetworkPolicy => NETWORK_POLICY_TYPE_URL,
            TypeUrl::Route => ROUTE_TYPE_URL,
            TypeUrl::Mesh => MESH_TYPE_URL,
        }
    }

    pub fn parse(s: &str) -> Option<TypeUrl> {
        TypeUrl::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// The short name people read in logs and `proxy-status`.
    pub fn short(self) -> &'static str {
        match self {
            TypeUrl::Address => "Address",
            TypeUrl::Authorization => "Authorization",
            TypeUrl::NetworkPolicy => "NetworkPolicy",
            TypeUrl::Route => "Route",
            TypeUrl::Mesh => "Mesh",
        }
    }
}

impl std::fmt::Display for TypeUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.short())
    }
}

/// The metadata key a node proxy sets on a certificate request to ask for
/// one of its pods' identities (section 3).
pub const IMPERSONATED_IDENTITY: &str = "ImpersonatedIdentity";
/// The node proxy's node name in its xDS node metadata (section 4).
pub const NODE_NAME: &str = "NODE_NAME";
/// The name clients verify the control plane's certificate against, unless
/// configured otherwise.
pub const DEFAULT_CONTROL_PLANE_SAN: &str = "istiod.istio-system.svc";
/// The control plane's port: delta xDS and the certificate service, TLS.
pub const CONTROL_PLANE_PORT: u16 = slipstream_core::abi::CONTROL_PLANE_PORT;

/// A `google.protobuf.Struct` holding string values.
pub fn string_struct<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> prost_types::Struct {
    prost_types::Struct {
        fields: pairs
            .into_iter()
            .map(|(k, v)| (k.to_string(), prost_types::Value { kind: Some(prost_types::value::Kind::StringValue(v.to_string())) }))
            .collect(),
    }
}

/// A string value of a `google.protobuf.Struct`, if it is one.
pub fn struct_string<'a>(s: Option<&'a prost_types::Struct>, key: &str) -> Option<&'a str> {
    match s?.fields.get(key)?.kind.as_ref()? {
        prost_types::value::Kind::StringValue(v) => Some(v.as_str()),
        _ => None,
    }
}
