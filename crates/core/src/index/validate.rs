//! Each resource checked once, where it enters the index: what the data
//! path relies on (identities parse, keys have their parts, ports are
//! set), the refusal naming the resource and the field.

use super::*;

/// `namespace/hostname`, both parts present.
pub(super) fn is_service_key(key: &str) -> bool {
    matches!(key.split_once('/'), Some((ns, host)) if !ns.is_empty() && !host.is_empty() && !host.contains('/'))
}

/// The workload field an identity error is about.
pub(super) fn identity_field(e: &SpiffeIdError) -> &'static str {
    match e {
        SpiffeIdError::EmptyPart { what, .. } | SpiffeIdError::InvalidCharacter { what, .. } => match *what {
            "trust domain" => "trust_domain",
            "namespace" => "namespace",
            _ => "service_account",
        },
        _ => "trust_domain",
    }
}

pub(super) fn validate_workload(w: Workload) -> Result<MeshWorkload, ResourceError> {
    let name = if w.uid.is_empty() { format!("{}/{}", w.namespace, w.name) } else { w.uid.clone() };
    let err =
        |field: &str, message: String| ResourceError { kind: ResourceKind::Workload, name: name.clone(), field: field.into(), message };
    if w.uid.is_empty() {
        return Err(err("uid", "is empty".into()));
    }
    if w.namespace.is_empty() {
        return Err(err("namespace", "is empty".into()));
    }
    if w.addresses.is_empty() {
        return Err(err("addresses", "is empty: the data path could not reach the workload".into()));
    }
    let identity =
        SpiffeId::new(w.trust_domain(), &w.namespace, w.service_account()).map_err(|e| err(identity_field(&e), e.to_string()))?;
    for (key, ports) in &w.services {
        if !is_service_key(key) {
            return Err(err(&format!("services[{key:?}]"), "the key is not of the form namespace/hostname".into()));
        }
        // target_port 0 is allowed: "not resolved for this workload"
        // (Istio's meaning). Such an entry is never an endpoint.
        if let Some(i) = ports.iter().position(|p| p.service_port == 0) {
            return Err(err(&format!("services[{key:?}][{i}].service_port"), "is 0".into()));
        }
    }
    Ok(MeshWorkload::new(w, identity))
}

pub(super) fn validate_service(s: Service) -> Result<MeshService, ResourceError> {
    let err = |field: String, message: String| ResourceError { kind: ResourceKind::Service, name: s.key(), field, message };
    if s.namespace.is_empty() {
        return Err(err("namespace".into(), "is empty".into()));
    }
    if s.hostname.is_empty() {
        return Err(err("hostname".into(), "is empty".into()));
    }
    let mut seen = std::collections::HashMap::new();
    for (i, p) in s.ports.iter().enumerate() {
        // target_port 0: "not resolved" (named target port), see above.
        if p.service_port == 0 {
            return Err(err(format!("ports[{i}].service_port"), "is 0".into()));
        }
        if let Some(first) = seen.insert(p.service_port, i) {
            return Err(err(format!("ports[{i}].service_port"), format!("{} is also ports[{first}]'s", p.service_port)));
        }
    }
    let mut sans = Vec::with_capacity(s.subject_alt_names.len());
    for (i, san) in s.subject_alt_names.iter().enumerate() {
        sans.push(san.parse::<SpiffeId>().map_err(|e| err(format!("subject_alt_names[{i}]"), e.to_string()))?);
    }
    Ok(MeshService::new(s, sans))
}

pub(super) fn validate_net_policy(p: &NetPolicy) -> Result<(), ResourceError> {
    let err = |field: &str, message: &str| ResourceError {
        kind: ResourceKind::NetPolicy,
        name: p.key(),
        field: field.into(),
        message: message.into(),
    };
    if p.name.is_empty() {
        return Err(err("name", "is empty"));
    }
    if p.namespace.is_empty() {
        return Err(err("namespace", "is empty"));
    }
    let all = [("ingress", &p.ingress), ("egress", &p.egress), ("ingress_deny", &p.ingress_deny), ("egress_deny", &p.egress_deny)];
    for (field, rules) in all {
        for (i, r) in rules.iter().enumerate() {
            for (j, port) in r.ports.iter().flatten().enumerate() {
                if let crate::policy::network::PortSpec::Range { port, end } = port.port {
                    if end < port {
                        return Err(err(&format!("{field}[{i}].ports[{j}].end"), "is below the port"));
                    }
                }
            }
            for (j, peer) in r.peers.iter().flatten().enumerate() {
                if let crate::policy::network::NetPeer::Addresses(a) = peer {
                    if !a.is_sorted() {
                        return Err(err(&format!("{field}[{i}].peers[{j}]"), "addresses are not sorted"));
                    }
                }
            }
        }
    }
    Ok(())
}

pub(super) fn validate_policy(p: &Authorization) -> Result<(), ResourceError> {
    let err = |field: &str| ResourceError { kind: ResourceKind::Policy, name: p.key(), field: field.into(), message: "is empty".into() };
    if p.name.is_empty() {
        return Err(err("name"));
    }
    if p.namespace.is_empty() {
        return Err(err("namespace"));
    }
    Ok(())
}
