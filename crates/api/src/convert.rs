//! Between the wire messages and the mesh model. To the wire: total. From
//! the wire: every field the model cannot carry faithfully is an error that
//! names it, so a resource is either taken as it means or refused (NACKed),
//! never half understood.

use crate::{security as sec, workload as wl};
use prost::Message;
use slipstream_core::policy::{Action, Authorization, Cidr, Clause, Match, Rule, Scope, StringMatch};
use slipstream_core::{GatewayAddress, NetworkAddress, Port, Service, TunnelProtocol, Workload, WorkloadStatus, WorkloadType};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A wire message the model cannot take: which field, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ConvertError {
    /// Path of the field in the message (`workload.addresses[1]`).
    pub field: String,
    pub message: String,
}

fn err(field: impl Into<String>, message: impl Into<String>) -> ConvertError {
    ConvertError { field: field.into(), message: message.into() }
}

/// The payload of an `istio.workload.Address` resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressResource {
    Workload(Workload),
    Service(Service),
}

impl AddressResource {
    /// Resource name: a workload's uid, a service's `namespace/hostname`.
    pub fn name(&self) -> String {
        match self {
            AddressResource::Workload(w) => w.uid.clone(),
            AddressResource::Service(s) => s.key(),
        }
    }
}

pub fn ip_bytes(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v) => v.octets().to_vec(),
        IpAddr::V6(v) => v.octets().to_vec(),
    }
}

pub fn ip_from_bytes(b: &[u8], field: &str) -> Result<IpAddr, ConvertError> {
    match b.len() {
        4 => Ok(IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))),
        16 => {
            let mut a = [0u8; 16];
            a.copy_from_slice(b);
            Ok(IpAddr::V6(Ipv6Addr::from(a)))
        }
        n => Err(err(field, format!("an address is 4 or 16 bytes, this one is {n}"))),
    }
}

fn port16(v: u32, field: &str) -> Result<u16, ConvertError> {
    u16::try_from(v).map_err(|_| err(field, format!("{v} is not a port (0-65535)")))
}

fn port_to_wire(p: &Port) -> wl::Port {
    wl::Port { service_port: p.service_port.into(), target_port: p.target_port.into(), app_protocol: p.app_protocol as i32 }
}

fn port_from_wire(p: &wl::Port, field: &str) -> Result<Port, ConvertError> {
    use slipstream_core::AppProtocol;
    // An unknown value (a newer control plane's) is read as undeclared:
    // the waypoint then looks at what the client sends, and applies L7
    // rules fail-closed to what is not HTTP.
    let app_protocol = match p.app_protocol {
        1 => AppProtocol::Http11,
        2 => AppProtocol::Http2,
        3 => AppProtocol::Grpc,
        4 => AppProtocol::Tcp,
        5 => AppProtocol::Tls,
        _ => AppProtocol::Unknown,
    };
    Ok(Port {
        service_port: port16(p.service_port, &format!("{field}.service_port"))?,
        target_port: port16(p.target_port, &format!("{field}.target_port"))?,
        app_protocol,
    })
}

// ---- workloads ----

impl From<&Workload> for wl::Workload {
    fn from(w: &Workload) -> Self {
        wl::Workload {
            uid: w.uid.clone(),
            name: w.name.clone(),
            namespace: w.namespace.clone(),
            addresses: w.addresses.iter().map(|a| ip_bytes(*a)).collect(),
            network: w.network.clone(),
            tunnel_protocol: match w.tunnel_protocol {
                TunnelProtocol::None => wl::TunnelProtocol::None,
                TunnelProtocol::Hbone => wl::TunnelProtocol::Hbone,
            } as i32,
            trust_domain: w.trust_domain.clone(),
            service_account: w.service_account.clone(),
            node: w.node.clone(),
            canonical_name: w.canonical_name.clone(),
            canonical_revision: w.canonical_revision.clone(),
            workload_type: match w.workload_type {
                WorkloadType::Deployment => wl::WorkloadType::Deployment,
                WorkloadType::Cronjob => wl::WorkloadType::Cronjob,
                WorkloadType::Pod => wl::WorkloadType::Pod,
                WorkloadType::Job => wl::WorkloadType::Job,
            } as i32,
            workload_name: w.workload_name.clone(),
            services: w
                .services
                .iter()
                .map(|(k, ports)| (k.clone(), wl::PortList { ports: ports.iter().map(port_to_wire).collect() }))
                .collect(),
            authorization_policies: w.authorization_policies.clone(),
            status: match w.status {
                WorkloadStatus::Healthy => wl::WorkloadStatus::Healthy,
                WorkloadStatus::Unhealthy => wl::WorkloadStatus::Unhealthy,
            } as i32,
            cluster_id: w.cluster_id.clone(),
            capacity: (w.capacity != 0).then_some(w.capacity),
            waypoint: w.waypoint.as_ref().map(gateway_to_wire),
            ..Default::default()
        }
    }
}

fn gateway_to_wire(g: &GatewayAddress) -> wl::GatewayAddress {
    wl::GatewayAddress {
        destination: Some(wl::gateway_address::Destination::Hostname(wl::NamespacedHostname {
            namespace: g.namespace.clone(),
            hostname: g.hostname.clone(),
        })),
        hbone_mtls_port: u32::from(g.hbone_mtls_port),
    }
}

/// A waypoint named by hostname. Istio may also name one by address (a
/// waypoint outside the cluster's services); refused, naming the field,
/// rather than taken without its waypoint, which would let traffic skip
/// the waypoint's policy.
fn gateway_from_wire(g: &wl::GatewayAddress, field: &str) -> Result<GatewayAddress, ConvertError> {
    let hbone_mtls_port = port16(g.hbone_mtls_port, &format!("{field}.hbone_mtls_port"))?;
    match &g.destination {
        Some(wl::gateway_address::Destination::Hostname(h)) => {
            if h.hostname.is_empty() || h.namespace.is_empty() {
                return Err(err(format!("{field}.hostname"), "a waypoint needs both a namespace and a hostname"));
            }
            Ok(GatewayAddress { namespace: h.namespace.clone(), hostname: h.hostname.clone(), hbone_mtls_port })
        }
        Some(wl::gateway_address::Destination::Address(_)) => {
            Err(err(format!("{field}.address"), "a waypoint named by address is not supported; name its Service by hostname"))
        }
        None => Err(err(field, "a waypoint without a destination")),
    }
}

impl TryFrom<wl::Workload> for Workload {
    type Error = ConvertError;
    fn try_from(w: wl::Workload) -> Result<Self, ConvertError> {
        let addresses = w
            .addresses
            .iter()
            .enumerate()
            .map(|(i, a)| ip_from_bytes(a, &format!("workload.addresses[{i}]")))
            .collect::<Result<Vec<_>, _>>()?;
        let tunnel_protocol = match wl::TunnelProtocol::try_from(w.tunnel_protocol) {
            Ok(wl::TunnelProtocol::None) => TunnelProtocol::None,
            Ok(wl::TunnelProtocol::Hbone) => TunnelProtocol::Hbone,
            Ok(wl::TunnelProtocol::LegacyIstioMtls) => {
                return Err(err("workload.tunnel_protocol", "LEGACY_ISTIO_MTLS (sidecars) is not supported"))
            }
            Err(_) => return Err(err("workload.tunnel_protocol", format!("unknown value {}", w.tunnel_protocol))),
        };
        let workload_type = match wl::WorkloadType::try_from(w.workload_type) {
            Ok(wl::WorkloadType::Deployment) => WorkloadType::Deployment,
            Ok(wl::WorkloadType::Cronjob) => WorkloadType::Cronjob,
            Ok(wl::WorkloadType::Pod) => WorkloadType::Pod,
            Ok(wl::WorkloadType::Job) => WorkloadType::Job,
            Err(_) => return Err(err("workload.workload_type", format!("unknown value {}", w.workload_type))),
        };
        let status = match wl::WorkloadStatus::try_from(w.status) {
            Ok(wl::WorkloadStatus::Healthy) => WorkloadStatus::Healthy,
            Ok(wl::WorkloadStatus::Unhealthy) => WorkloadStatus::Unhealthy,
            Err(_) => return Err(err("workload.status", format!("unknown value {}", w.status))),
        };
        if w.application_tunnel.as_ref().is_some_and(|t| t.protocol != 0) {
            return Err(err("workload.application_tunnel", "application tunnels (PROXY protocol to the app) are not supported"));
        }
        if w.network_gateway.is_some() {
            return Err(err("workload.network_gateway", "multi-network gateways are not supported"));
        }
        let waypoint = w.waypoint.as_ref().map(|g| gateway_from_wire(g, "workload.waypoint")).transpose()?;
        let mut services = BTreeMap::new();
        for (k, pl) in w.services {
            let field = format!("workload.services[{k}]");
            let ports = pl
                .ports
                .iter()
                .enumerate()
                .map(|(i, p)| port_from_wire(p, &format!("{field}.ports[{i}]")))
                .collect::<Result<Vec<_>, _>>()?;
            services.insert(k, ports);
        }
        Ok(Workload {
            uid: w.uid,
            name: w.name,
            namespace: w.namespace,
            addresses,
            network: w.network,
            tunnel_protocol,
            trust_domain: w.trust_domain,
            service_account: w.service_account,
            node: w.node,
            canonical_name: w.canonical_name,
            canonical_revision: w.canonical_revision,
            workload_type,
            workload_name: w.workload_name,
            services,
            authorization_policies: w.authorization_policies,
            status,
            cluster_id: w.cluster_id,
            capacity: w.capacity.unwrap_or(1),
            waypoint,
        })
    }
}

// ---- services ----

impl From<&Service> for wl::Service {
    fn from(s: &Service) -> Self {
        wl::Service {
            name: s.name.clone(),
            namespace: s.namespace.clone(),
            hostname: s.hostname.clone(),
            addresses: s
                .addresses
                .iter()
                .map(|a| wl::NetworkAddress { network: a.network.clone(), address: ip_bytes(a.address), length: None })
                .collect(),
            ports: s.ports.iter().map(port_to_wire).collect(),
            subject_alt_names: s.subject_alt_names.clone(),
            waypoint: s.waypoint.as_ref().map(gateway_to_wire),
            ..Default::default()
        }
    }
}

impl TryFrom<wl::Service> for Service {
    type Error = ConvertError;
    fn try_from(s: wl::Service) -> Result<Self, ConvertError> {
        // Weighted waypoints (Istio's waypoint migration) would be taken
        // without their waypoint: refused, naming the field.
        if !s.weighted_waypoints.is_empty() {
            return Err(err("service.weighted_waypoints", "weighted waypoints are not supported; name one waypoint in `waypoint`"));
        }
        let waypoint = s.waypoint.as_ref().map(|g| gateway_from_wire(g, "service.waypoint")).transpose()?;
        let addresses = s
            .addresses
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let field = format!("service.addresses[{i}]");
                if a.length.is_some_and(|l| l != if a.address.len() == 4 { 32 } else { 128 }) {
                    return Err(err(format!("{field}.length"), "address ranges are not supported for services"));
                }
                Ok(NetworkAddress { network: a.network.clone(), address: ip_from_bytes(&a.address, &format!("{field}.address"))? })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let ports =
            s.ports.iter().enumerate().map(|(i, p)| port_from_wire(p, &format!("service.ports[{i}]"))).collect::<Result<Vec<_>, _>>()?;
        Ok(Service {
            name: s.name,
            namespace: s.namespace,
            hostname: s.hostname,
            addresses,
            ports,
            subject_alt_names: s.subject_alt_names,
            waypoint,
        })
    }
}

impl From<&AddressResource> for wl::Address {
    fn from(a: &AddressResource) -> Self {
        wl::Address {
            r#type: Some(match a {
                AddressResource::Workload(w) => wl::address::Type::Workload(w.into()),
                AddressResource::Service(s) => wl::address::Type::Service(s.into()),
            }),
        }
    }
}

impl TryFrom<wl::Address> for AddressResource {
    type Error = ConvertError;
    fn try_from(a: wl::Address) -> Result<Self, ConvertError> {
        match a.r#type {
            Some(wl::address::Type::Workload(w)) => Ok(AddressResource::Workload(w.try_into()?)),
            Some(wl::address::Type::Service(s)) => Ok(AddressResource::Service(s.try_into()?)),
            None => Err(err("address.type", "neither a workload nor a service")),
        }
    }
}

// ---- authorization ----

fn string_match_to_wire(m: &StringMatch) -> sec::StringMatch {
    use sec::string_match::MatchType;
    sec::StringMatch {
        match_type: Some(match m {
            StringMatch::Exact(v) => MatchType::Exact(v.clone()),
            StringMatch::Prefix(v) => MatchType::Prefix(v.clone()),
            StringMatch::Suffix(v) => MatchType::Suffix(v.clone()),
            StringMatch::Presence => MatchType::Presence(()),
        }),
    }
}

fn string_match_from_wire(m: &sec::StringMatch, field: &str) -> Result<StringMatch, ConvertError> {
    use sec::string_match::MatchType;
    Ok(match &m.match_type {
        Some(MatchType::Exact(v)) => StringMatch::Exact(v.clone()),
        Some(MatchType::Prefix(v)) => StringMatch::Prefix(v.clone()),
        Some(MatchType::Suffix(v)) => StringMatch::Suffix(v.clone()),
        Some(MatchType::Presence(())) => StringMatch::Presence,
        None => return Err(err(field, "a string match with no kind")),
    })
}

fn cidr_to_wire(c: &Cidr) -> sec::Address {
    sec::Address { address: ip_bytes(c.address), length: c.length.into() }
}

fn cidr_from_wire(a: &sec::Address, field: &str) -> Result<Cidr, ConvertError> {
    let address = ip_from_bytes(&a.address, &format!("{field}.address"))?;
    let max = if address.is_ipv4() { 32 } else { 128 };
    if a.length > max {
        return Err(err(format!("{field}.length"), format!("{} is longer than {max} bits", a.length)));
    }
    Ok(Cidr { address, length: a.length as u8 })
}

/// A service account match is a principal of any trust domain ending in
/// `/ns/<namespace>/sa/<name>`.
fn service_account_principal(s: &sec::ServiceAccountMatch, field: &str) -> Result<StringMatch, ConvertError> {
    if s.namespace.is_empty() || s.service_account.is_empty() {
        return Err(err(field, "namespace and serviceAccount are both required"));
    }
    Ok(StringMatch::Suffix(format!("/ns/{}/sa/{}", s.namespace, s.service_account)))
}

fn match_to_wire(m: &Match) -> sec::Match {
    sec::Match {
        namespaces: m.namespaces.iter().map(string_match_to_wire).collect(),
        not_namespaces: m.not_namespaces.iter().map(string_match_to_wire).collect(),
        principals: m.principals.iter().map(string_match_to_wire).collect(),
        not_principals: m.not_principals.iter().map(string_match_to_wire).collect(),
        source_ips: m.source_ips.iter().map(cidr_to_wire).collect(),
        not_source_ips: m.not_source_ips.iter().map(cidr_to_wire).collect(),
        destination_ips: m.destination_ips.iter().map(cidr_to_wire).collect(),
        not_destination_ips: m.not_destination_ips.iter().map(cidr_to_wire).collect(),
        destination_ports: m.destination_ports.iter().map(|p| u32::from(*p)).collect(),
        not_destination_ports: m.not_destination_ports.iter().map(|p| u32::from(*p)).collect(),
        ..Default::default()
    }
}

fn match_from_wire(m: &sec::Match, field: &str) -> Result<Match, ConvertError> {
    let strs = |v: &[sec::StringMatch], name: &str| {
        v.iter().enumerate().map(|(i, s)| string_match_from_wire(s, &format!("{field}.{name}[{i}]"))).collect::<Result<Vec<_>, _>>()
    };
    let cidrs = |v: &[sec::Address], name: &str| {
        v.iter().enumerate().map(|(i, a)| cidr_from_wire(a, &format!("{field}.{name}[{i}]"))).collect::<Result<Vec<_>, _>>()
    };
    let ports = |v: &[u32], name: &str| {
        v.iter().enumerate().map(|(i, p)| port16(*p, &format!("{field}.{name}[{i}]"))).collect::<Result<Vec<_>, _>>()
    };
    if !m.extensions.is_empty() {
        return Err(err(format!("{field}.extensions"), "match extensions are not supported"));
    }
    let mut principals = strs(&m.principals, "principals")?;
    for (i, s) in m.service_accounts.iter().enumerate() {
        principals.push(service_account_principal(s, &format!("{field}.service_accounts[{i}]"))?);
    }
    let mut not_principals = strs(&m.not_principals, "not_principals")?;
    for (i, s) in m.not_service_accounts.iter().enumerate() {
        not_principals.push(service_account_principal(s, &format!("{field}.not_service_accounts[{i}]"))?);
    }
    Ok(Match {
        namespaces: strs(&m.namespaces, "namespaces")?,
        not_namespaces: strs(&m.not_namespaces, "not_namespaces")?,
        principals,
        not_principals,
        source_ips: cidrs(&m.source_ips, "source_ips")?,
        not_source_ips: cidrs(&m.not_source_ips, "not_source_ips")?,
        destination_ips: cidrs(&m.destination_ips, "destination_ips")?,
        not_destination_ips: cidrs(&m.not_destination_ips, "not_destination_ips")?,
        destination_ports: ports(&m.destination_ports, "destination_ports")?,
        not_destination_ports: ports(&m.not_destination_ports, "not_destination_ports")?,
    })
}

impl From<&Authorization> for sec::Authorization {
    fn from(a: &Authorization) -> Self {
        sec::Authorization {
            name: a.name.clone(),
            namespace: a.namespace.clone(),
            scope: match a.scope {
                Scope::Global => sec::Scope::Global,
                Scope::Namespace => sec::Scope::Namespace,
                Scope::WorkloadSelector => sec::Scope::WorkloadSelector,
            } as i32,
            action: match a.action {
                Action::Allow => sec::Action::Allow,
                Action::Deny => sec::Action::Deny,
            } as i32,
            rules: a
                .rules
                .iter()
                .map(|r| sec::Rule {
                    clauses: r.clauses.iter().map(|c| sec::Clause { matches: c.matches.iter().map(match_to_wire).collect() }).collect(),
                })
                .collect(),
            dry_run: a.dry_run,
            extensions: Vec::new(),
        }
    }
}

impl TryFrom<sec::Authorization> for Authorization {
    type Error = ConvertError;
    fn try_from(a: sec::Authorization) -> Result<Self, ConvertError> {
        let scope = match sec::Scope::try_from(a.scope) {
            Ok(sec::Scope::Global) => Scope::Global,
            Ok(sec::Scope::Namespace) => Scope::Namespace,
            Ok(sec::Scope::WorkloadSelector) => Scope::WorkloadSelector,
            Err(_) => return Err(err("authorization.scope", format!("unknown value {}", a.scope))),
        };
        let action = match sec::Action::try_from(a.action) {
            Ok(sec::Action::Allow) => Action::Allow,
            Ok(sec::Action::Deny) => Action::Deny,
            Err(_) => return Err(err("authorization.action", format!("unknown value {}", a.action))),
        };
        if !a.extensions.is_empty() {
            return Err(err("authorization.extensions", "policy extensions are not supported"));
        }
        let mut rules = Vec::with_capacity(a.rules.len());
        for (ri, r) in a.rules.iter().enumerate() {
            let mut clauses = Vec::with_capacity(r.clauses.len());
            for (ci, c) in r.clauses.iter().enumerate() {
                let matches = c
                    .matches
                    .iter()
                    .enumerate()
                    .map(|(mi, m)| match_from_wire(m, &format!("authorization.rules[{ri}].clauses[{ci}].matches[{mi}]")))
                    .collect::<Result<Vec<_>, _>>()?;
                clauses.push(Clause { matches });
            }
            rules.push(Rule { clauses });
        }
        Ok(Authorization { name: a.name, namespace: a.namespace, scope, action, rules, dry_run: a.dry_run })
    }
}

// ---- Any ----

/// Packs a resource for a `Resource.resource` field.
pub fn to_any(t: crate::TypeUrl, msg: &impl Message) -> prost_types::Any {
    prost_types::Any { type_url: t.as_str().to_string(), value: msg.encode_to_vec() }
}

pub fn address_any(a: &AddressResource) -> prost_types::Any {
    to_any(crate::TypeUrl::Address, &wl::Address::from(a))
}

pub fn authorization_any(a: &Authorization) -> prost_types::Any {
    to_any(crate::TypeUrl::Authorization, &sec::Authorization::from(a))
}

/// Unpacks an `Address` resource, checking its type URL.
pub fn address_from_any(any: &prost_types::Any) -> Result<AddressResource, ConvertError> {
    if any.type_url != crate::ADDRESS_TYPE_URL {
        return Err(err("resource.type_url", format!("expected {}, got {}", crate::ADDRESS_TYPE_URL, any.type_url)));
    }
    let a = wl::Address::decode(any.value.as_slice()).map_err(|e| err("resource.value", format!("not an Address: {e}")))?;
    a.try_into()
}

/// Unpacks an `Authorization` resource, checking its type URL.
pub fn authorization_from_any(any: &prost_types::Any) -> Result<Authorization, ConvertError> {
    if any.type_url != crate::AUTHORIZATION_TYPE_URL {
        return Err(err("resource.type_url", format!("expected {}, got {}", crate::AUTHORIZATION_TYPE_URL, any.type_url)));
    }
    let a = sec::Authorization::decode(any.value.as_slice()).map_err(|e| err("resource.value", format!("not an Authorization: {e}")))?;
    a.try_into()
}

#[cfg(test)]
mod tests;
