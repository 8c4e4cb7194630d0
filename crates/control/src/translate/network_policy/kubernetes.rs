//! Kubernetes NetworkPolicy: pod and namespace selectors, address blocks,
//! ports.

use super::{block, port_spec, protocol, selector, NetPolicyInput, PeerInput, RuleInput, Selector};
use crate::objects::{ObjectError, ObjectRef};
use k8s_openapi::api::networking::v1 as np;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use slipstream_core::policy::network::{NetKind, NetPort};

pub fn network_policy(p: &np::NetworkPolicy, r: &ObjectRef) -> Result<NetPolicyInput, ObjectError> {
    let spec = p.spec.clone().unwrap_or_default();
    let subject = selector(&spec.pod_selector, "spec.podSelector", r, false)?;
    // Without policyTypes: Ingress always, Egress if there are egress rules.
    let types = match &spec.policy_types {
        Some(t) => {
            for (i, v) in t.iter().enumerate() {
                if v != "Ingress" && v != "Egress" {
                    return Err(ObjectError::new(r, format!("spec.policyTypes[{i}]"), format!("{v:?} is not Ingress or Egress")));
                }
            }
            (t.iter().any(|v| v == "Ingress"), t.iter().any(|v| v == "Egress"))
        }
        None => (true, spec.egress.as_ref().is_some_and(|e| !e.is_empty())),
    };
    let mut ingress = Vec::new();
    for (i, rule) in spec.ingress.iter().flatten().enumerate() {
        let path = format!("spec.ingress[{i}]");
        let peers = k8s_peers(rule.from.as_deref(), &format!("{path}.from"), r)?;
        let ports = k8s_ports(rule.ports.as_deref(), &format!("{path}.ports"), r)?;
        ingress.push(RuleInput { path, peers, ports });
    }
    let mut egress = Vec::new();
    for (i, rule) in spec.egress.iter().flatten().enumerate() {
        let path = format!("spec.egress[{i}]");
        let peers = k8s_peers(rule.to.as_deref(), &format!("{path}.to"), r)?;
        let ports = k8s_ports(rule.ports.as_deref(), &format!("{path}.ports"), r)?;
        egress.push(RuleInput { path, peers, ports });
    }
    Ok(NetPolicyInput {
        kind: NetKind::NetworkPolicy,
        namespace: r.namespace.clone(),
        name: r.name.clone(),
        subject,
        isolates_ingress: types.0,
        isolates_egress: types.1,
        // Rules of a direction the policy does not isolate do nothing.
        ingress: if types.0 { ingress } else { Vec::new() },
        egress: if types.1 { egress } else { Vec::new() },
        ingress_deny: Vec::new(),
        egress_deny: Vec::new(),
    })
}

fn k8s_peers(peers: Option<&[np::NetworkPolicyPeer]>, field: &str, r: &ObjectRef) -> Result<Option<Vec<PeerInput>>, ObjectError> {
    let Some(peers) = peers.filter(|p| !p.is_empty()) else { return Ok(None) };
    let mut out = Vec::new();
    for (i, p) in peers.iter().enumerate() {
        let f = format!("{field}[{i}]");
        match (&p.ip_block, &p.namespace_selector, &p.pod_selector) {
            (Some(b), None, None) => out.push(block(&b.cidr, b.except.as_deref().unwrap_or(&[]), &format!("{f}.ipBlock"), r)?),
            (Some(_), _, _) => {
                return Err(ObjectError::new(r, format!("{f}.ipBlock"), "cannot be set together with podSelector or namespaceSelector"))
            }
            (None, None, None) => return Err(ObjectError::new(r, &f, "must set podSelector, namespaceSelector or ipBlock")),
            (None, ns, pods) => {
                let namespaces = ns.as_ref().map(|s| selector(s, &format!("{f}.namespaceSelector"), r, false)).transpose()?;
                let pods = match pods {
                    Some(s) => selector(s, &format!("{f}.podSelector"), r, false)?,
                    None => Selector::default(),
                };
                out.push(PeerInput::Pods { namespaces, pods });
            }
        }
    }
    Ok(Some(out))
}

fn k8s_ports(ports: Option<&[np::NetworkPolicyPort]>, field: &str, r: &ObjectRef) -> Result<Option<Vec<NetPort>>, ObjectError> {
    let Some(ports) = ports.filter(|p| !p.is_empty()) else { return Ok(None) };
    let mut out = Vec::new();
    for (i, p) in ports.iter().enumerate() {
        let f = format!("{field}[{i}]");
        let protocol = protocol(p.protocol.as_deref(), &format!("{f}.protocol"), r, false)?;
        let port = match &p.port {
            None => None,
            Some(IntOrString::Int(n)) => Some(n.to_string()),
            Some(IntOrString::String(s)) if s.parse::<i64>().is_ok() => {
                return Err(ObjectError::new(r, format!("{f}.port"), format!("{s:?}: a port number is an integer, a name is not numeric")))
            }
            Some(IntOrString::String(s)) => Some(s.clone()),
        };
        if port.as_deref() == Some("0") {
            return Err(ObjectError::new(r, format!("{f}.port"), "0 is not a port (1-65535)"));
        }
        out.push(NetPort { protocol, port: port_spec(port.as_deref(), p.end_port, &f, r)? });
    }
    Ok(Some(out))
}
