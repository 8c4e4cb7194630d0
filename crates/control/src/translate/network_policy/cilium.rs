//! CiliumNetworkPolicy: endpoint selectors, entities, CIDR sets, ports;
//! what we cannot enforce refused by field.

use super::{block, port_spec, protocol, selector, NetPolicyInput, PeerInput, RuleInput};
use super::{CILIUM_NAMESPACE_LABEL, CILIUM_NAMESPACE_LABELS_PREFIX};
use crate::objects::cilium::{CidrRule, CiliumNetworkPolicy, CnpRule, PortRule, Refused};
use crate::objects::{ObjectError, ObjectRef};
use slipstream_core::policy::network::{NetKind, NetPort};
use slipstream_core::policy::Cidr;
use std::net::IpAddr;

fn refuse(v: &Refused, field: &str, what: &str, r: &ObjectRef) -> Result<(), ObjectError> {
    match v {
        Some(_) => Err(ObjectError::new(r, field, format!("not supported: {what}"))),
        None => Ok(()),
    }
}

pub fn cilium_network_policy(p: &CiliumNetworkPolicy, r: &ObjectRef) -> Result<NetPolicyInput, ObjectError> {
    refuse(&p.specs, "specs", "several rules in one policy (use one policy per rule, with spec)", r)?;
    let spec = p.spec.as_ref().ok_or_else(|| ObjectError::new(r, "spec", "required"))?;
    refuse(&spec.node_selector, "spec.nodeSelector", "host policies", r)?;
    let es = spec.endpoint_selector.as_ref().ok_or_else(|| ObjectError::new(r, "spec.endpointSelector", "required"))?;
    let subject = selector(es, "spec.endpointSelector", r, true)?;
    let mut sections = Vec::new();
    for (name, rules, ingress) in [
        ("ingress", &spec.ingress, true),
        ("egress", &spec.egress, false),
        ("ingressDeny", &spec.ingress_deny, true),
        ("egressDeny", &spec.egress_deny, false),
    ] {
        let mut out = Vec::new();
        for (i, rule) in rules.iter().flatten().enumerate() {
            out.push(cilium_rule(rule, &format!("spec.{name}[{i}]"), ingress, name.ends_with("Deny"), r)?);
        }
        sections.push(out);
    }
    let [ingress, egress, ingress_deny, egress_deny]: [Vec<RuleInput>; 4] = sections.try_into().expect("four sections");
    // Default deny per direction: on when the policy has rules of it
    // (allow or deny), unless enableDefaultDeny says otherwise.
    let dd = spec.enable_default_deny.clone().unwrap_or_default();
    let has_in = spec.ingress.is_some() || spec.ingress_deny.is_some();
    let has_out = spec.egress.is_some() || spec.egress_deny.is_some();
    Ok(NetPolicyInput {
        kind: NetKind::CiliumNetworkPolicy,
        namespace: r.namespace.clone(),
        name: r.name.clone(),
        subject,
        isolates_ingress: dd.ingress.unwrap_or(has_in),
        isolates_egress: dd.egress.unwrap_or(has_out),
        ingress,
        egress,
        ingress_deny,
        egress_deny,
    })
}

fn cilium_rule(rule: &CnpRule, path: &str, ingress: bool, deny: bool, r: &ObjectRef) -> Result<RuleInput, ObjectError> {
    let (from, wrong) = if ingress { ("from", "to") } else { ("to", "from") };
    for (v, f, what) in [
        (&rule.from_requires, "fromRequires", "requirements"),
        (&rule.to_requires, "toRequires", "requirements"),
        (&rule.to_fqdns, "toFQDNs", "DNS-based peers"),
        (&rule.to_services, "toServices", "service peers"),
        (&rule.to_groups, "toGroups", "cloud group peers"),
        (&rule.from_groups, "fromGroups", "cloud group peers"),
        (&rule.from_nodes, "fromNodes", "node peers"),
        (&rule.to_nodes, "toNodes", "node peers"),
        (&rule.icmps, "icmps", "ICMP rules (the mesh decides TCP connections)"),
        (&rule.authentication, "authentication", "Cilium mutual authentication (the mesh authenticates with its own mTLS)"),
    ] {
        refuse(v, &format!("{path}.{f}"), what, r)?;
    }
    let (eps, cidrs, sets, entities) = if ingress {
        (&rule.from_endpoints, &rule.from_cidr, &rule.from_cidr_set, &rule.from_entities)
    } else {
        (&rule.to_endpoints, &rule.to_cidr, &rule.to_cidr_set, &rule.to_entities)
    };
    let (w_eps, w_cidrs, w_sets, w_entities) = if ingress {
        (&rule.to_endpoints, &rule.to_cidr, &rule.to_cidr_set, &rule.to_entities)
    } else {
        (&rule.from_endpoints, &rule.from_cidr, &rule.from_cidr_set, &rule.from_entities)
    };
    for (present, f) in
        [(w_eps.is_some(), "Endpoints"), (w_cidrs.is_some(), "CIDR"), (w_sets.is_some(), "CIDRSet"), (w_entities.is_some(), "Entities")]
    {
        if present {
            let section = if ingress { "an ingress" } else { "an egress" };
            return Err(ObjectError::new(r, format!("{path}.{wrong}{f}"), format!("not valid in {section} rule (use {from}{f})")));
        }
    }
    let l3 = eps.is_some() || cidrs.is_some() || sets.is_some() || entities.is_some();
    let mut peers = Vec::new();
    for (i, s) in eps.iter().flatten().enumerate() {
        let sel = selector(s, &format!("{path}.{from}Endpoints[{i}]"), r, true)?;
        let any_namespace = sel.keys().any(|k| k == CILIUM_NAMESPACE_LABEL || k.starts_with(CILIUM_NAMESPACE_LABELS_PREFIX));
        peers.push(PeerInput::Endpoints { selector: sel, any_namespace });
    }
    for (i, c) in cidrs.iter().flatten().enumerate() {
        peers.push(block(c, &[], &format!("{path}.{from}CIDR[{i}]"), r).map_err(|mut e| {
            e.field = format!("{path}.{from}CIDR[{i}]");
            e
        })?);
    }
    for (i, s) in sets.iter().flatten().enumerate() {
        peers.push(cidr_set(s, &format!("{path}.{from}CIDRSet[{i}]"), r)?);
    }
    for (i, e) in entities.iter().flatten().enumerate() {
        let f = format!("{path}.{from}Entities[{i}]");
        match e.as_str() {
            "all" => {
                peers.push(PeerInput::Block { cidr: Cidr { address: IpAddr::from([0u8; 4]), length: 0 }, except: vec![] });
                peers.push(PeerInput::Block { cidr: Cidr { address: IpAddr::from([0u8; 16]), length: 0 }, except: vec![] });
            }
            "cluster" => peers.push(PeerInput::AllPods),
            "world" => peers.push(PeerInput::World),
            other => return Err(ObjectError::new(r, f, format!("not supported: entity {other:?} (all, cluster and world are)"))),
        }
    }
    let mut ports = Vec::new();
    let mut any_ports = false;
    for (i, pr) in rule.to_ports.iter().flatten().enumerate() {
        let f = format!("{path}.toPorts[{i}]");
        port_rule_refusals(pr, &f, deny, r)?;
        match pr.ports.as_deref() {
            None | Some([]) => any_ports = true,
            Some(ps) => {
                for (j, p) in ps.iter().enumerate() {
                    let pf = format!("{f}.ports[{j}]");
                    let protocol = protocol(p.protocol.as_deref(), &format!("{pf}.protocol"), r, true)?;
                    ports.push(NetPort { protocol, port: port_spec(p.port.as_deref(), p.end_port, &pf, r)? });
                }
            }
        }
    }
    let ports = if rule.to_ports.is_none() || any_ports { None } else { Some(ports) };
    // No L3 selector: with toPorts, every peer on those ports; without
    // anything, the rule selects nothing (`ingress: [{}]` is default deny).
    let peers = match (l3, rule.to_ports.is_some()) {
        (true, _) => Some(peers),
        (false, true) => None,
        (false, false) => Some(Vec::new()),
    };
    Ok(RuleInput { path: path.to_string(), peers, ports })
}

fn port_rule_refusals(pr: &PortRule, f: &str, deny: bool, r: &ObjectRef) -> Result<(), ObjectError> {
    let l7 = "L7 rules in a CiliumNetworkPolicy (use an AuthorizationPolicy on a waypoint)";
    refuse(&pr.rules, &format!("{f}.rules"), l7, r)?;
    refuse(&pr.server_names, &format!("{f}.serverNames"), "TLS SNI rules", r)?;
    refuse(&pr.terminating_tls, &format!("{f}.terminatingTLS"), "TLS interception", r)?;
    refuse(&pr.originating_tls, &format!("{f}.originatingTLS"), "TLS interception", r)?;
    refuse(&pr.listener, &format!("{f}.listener"), "Envoy listeners", r)?;
    let _ = deny;
    Ok(())
}

fn cidr_set(s: &CidrRule, f: &str, r: &ObjectRef) -> Result<PeerInput, ObjectError> {
    refuse(&s.cidr_group_ref, &format!("{f}.cidrGroupRef"), "CiliumCIDRGroup references", r)?;
    refuse(&s.cidr_group_selector, &format!("{f}.cidrGroupSelector"), "CiliumCIDRGroup selectors", r)?;
    let cidr = s.cidr.as_deref().ok_or_else(|| ObjectError::new(r, format!("{f}.cidr"), "required"))?;
    block(cidr, s.except.as_deref().unwrap_or(&[]), f, r)
}
