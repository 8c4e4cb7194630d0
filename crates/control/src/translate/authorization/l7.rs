//! A policy bound to a waypoint with `targetRef(s)`: its targets and its
//! rules with every attribute Istio has at L7, for the waypoint.

use super::values::{check_service_accounts_alone, cidrs, ports, service_accounts, strings};
use super::{claim_path, L7Bound};
use crate::objects::{AuthorizationPolicy, AuthorizationPolicySpec, Condition, ObjectError, ObjectRef, Operation, Source};
use slipstream_core::policy::l7::*;
use slipstream_core::policy::Action;

/// A targeted policy's L7 form: its targets (a Service or a Gateway of its
/// own namespace, as Istio allows) and its rules with every attribute.
pub(super) fn l7_bound(p: &AuthorizationPolicy, r: &ObjectRef, action: Action) -> Result<L7Bound, ObjectError> {
    let (services, gateways) = targets(&p.spec, r)?;
    let mut rules = Vec::new();
    for (i, rule) in p.spec.rules.iter().enumerate() {
        let path = format!("spec.rules[{i}]");
        let mut from = Vec::new();
        for (j, f) in rule.from.iter().enumerate() {
            let field = format!("{path}.from[{j}].source");
            let s = f.source.as_ref().ok_or_else(|| ObjectError::new(r, &field, "required"))?;
            from.push(source(s, &field, r)?);
        }
        let mut to = Vec::new();
        for (j, t) in rule.to.iter().enumerate() {
            let field = format!("{path}.to[{j}].operation");
            let o = t.operation.as_ref().ok_or_else(|| ObjectError::new(r, &field, "required"))?;
            to.push(operation(o, &field, r)?);
        }
        let mut when = Vec::new();
        for (j, c) in rule.when.iter().enumerate() {
            when.push(condition(c, &format!("{path}.when[{j}]"), r)?);
        }
        rules.push(L7Rule { from, to, when });
    }
    let dry_run = p.metadata.annotations.as_ref().and_then(|a| a.get(crate::translate::DRY_RUN_ANNOTATION)).is_some_and(|v| v == "true");
    Ok(L7Bound {
        services,
        gateways,
        policy: L7Policy { namespace: r.namespace.clone(), name: r.name.clone(), action, dry_run, rules, workloads: None, pods: None },
    })
}

/// The Services and Gateways a policy targets.
fn targets(spec: &AuthorizationPolicySpec, r: &ObjectRef) -> Result<(Vec<String>, Vec<String>), ObjectError> {
    let mut services = Vec::new();
    let mut gateways = Vec::new();
    let refs: Vec<(String, &crate::objects::PolicyTargetReference)> = match &spec.target_ref {
        Some(t) => vec![("spec.targetRef".to_string(), t)],
        None => spec.target_refs.iter().enumerate().map(|(i, t)| (format!("spec.targetRefs[{i}]"), t)).collect(),
    };
    for (field, t) in refs {
        if !t.namespace.is_empty() && t.namespace != r.namespace {
            return Err(ObjectError::new(r, format!("{field}.namespace"), "must be the policy's own namespace"));
        }
        match (t.group.as_str(), t.kind.as_str()) {
            ("" | "core", "Service") => services.push(t.name.clone()),
            ("gateway.networking.k8s.io", "Gateway") => gateways.push(t.name.clone()),
            ("gateway.networking.k8s.io", "GatewayClass") => {
                return Err(ObjectError::new(r, format!("{field}.kind"), "GatewayClass targets are not supported; target the Gateway"))
            }
            (g, k) => {
                return Err(ObjectError::new(
                    r,
                    format!("{field}.kind"),
                    format!("{k:?} (group {g:?}) is not a target a waypoint enforces: use a Service, or a Gateway of class istio-waypoint"),
                ))
            }
        }
    }
    Ok((services, gateways))
}

/// One `from` source, `field` its path.
fn source(s: &Source, field: &str, r: &ObjectRef) -> Result<L7Source, ObjectError> {
    // At the waypoint `remoteIpBlocks` read the client's address
    // `X-Forwarded-For` gives past the trusted proxies (MeshConfig
    // `numTrustedProxies`; the peer's without them), `ipBlocks` the
    // peer's.
    check_service_accounts_alone(s, field, r)?;
    let mut principals = strings(&s.principals);
    principals.extend(service_accounts(&s.service_accounts, &format!("{field}.serviceAccounts"), r)?);
    let mut not_principals = strings(&s.not_principals);
    not_principals.extend(service_accounts(&s.not_service_accounts, &format!("{field}.notServiceAccounts"), r)?);
    Ok(L7Source {
        principals,
        not_principals,
        namespaces: strings(&s.namespaces),
        not_namespaces: strings(&s.not_namespaces),
        ip_blocks: cidrs(&s.ip_blocks, &format!("{field}.ipBlocks"), r)?,
        not_ip_blocks: cidrs(&s.not_ip_blocks, &format!("{field}.notIpBlocks"), r)?,
        remote_ip_blocks: cidrs(&s.remote_ip_blocks, &format!("{field}.remoteIpBlocks"), r)?,
        not_remote_ip_blocks: cidrs(&s.not_remote_ip_blocks, &format!("{field}.notRemoteIpBlocks"), r)?,
        // `<iss>/<sub>` of the request's JWT (RequestAuthentication).
        request_principals: strings(&s.request_principals),
        not_request_principals: strings(&s.not_request_principals),
    })
}

/// One `to` operation, `field` its path.
fn operation(o: &Operation, field: &str, r: &ObjectRef) -> Result<L7Operation, ObjectError> {
    Ok(L7Operation {
        hosts: strings(&o.hosts),
        not_hosts: strings(&o.not_hosts),
        methods: strings(&o.methods),
        not_methods: strings(&o.not_methods),
        paths: strings(&o.paths),
        not_paths: strings(&o.not_paths),
        ports: ports(&o.ports, &format!("{field}.ports"), r)?,
        not_ports: ports(&o.not_ports, &format!("{field}.notPorts"), r)?,
    })
}

/// One `when` condition, `field` its path.
fn condition(c: &Condition, field: &str, r: &ObjectRef) -> Result<L7Condition, ObjectError> {
    if c.values.is_empty() && c.not_values.is_empty() {
        return Err(ObjectError::new(r, field, "needs values or notValues"));
    }
    let key = match c.key.as_str() {
        "source.ip" => ConditionKey::SourceIp,
        "remote.ip" => ConditionKey::RemoteIp,
        "source.namespace" => ConditionKey::SourceNamespace,
        "source.principal" | "source.serviceAccount" => ConditionKey::SourcePrincipal,
        "destination.port" => ConditionKey::DestinationPort,
        "request.auth.principal" => ConditionKey::RequestPrincipal,
        "request.auth.audiences" => ConditionKey::RequestAudiences,
        "request.auth.presenter" => ConditionKey::RequestPresenter,
        k => match (k.strip_prefix("request.headers[").and_then(|h| h.strip_suffix(']')), claim_path(k)) {
            (Some(h), _) if !h.is_empty() => ConditionKey::RequestHeader(h.to_ascii_lowercase()),
            (_, Some(path)) => ConditionKey::RequestClaim(path),
            _ => {
                return Err(ObjectError::new(
                    r,
                    format!("{field}.key"),
                    format!(
                        "{k:?} is not supported at the waypoint (request.headers[...], request.auth.principal, request.auth.audiences, \
                         request.auth.presenter, request.auth.claims[...], source.ip, remote.ip, source.namespace, source.principal, \
                         source.serviceAccount, destination.port)"
                    ),
                ))
            }
        },
    };
    if matches!(key, ConditionKey::SourceIp | ConditionKey::RemoteIp) {
        cidrs(&c.values, &format!("{field}.values"), r)?;
        cidrs(&c.not_values, &format!("{field}.notValues"), r)?;
    }
    // An account is its principal in any trust domain.
    if c.key == "source.serviceAccount" {
        let values = service_accounts(&c.values, &format!("{field}.values"), r)?;
        let not_values = service_accounts(&c.not_values, &format!("{field}.notValues"), r)?;
        return Ok(L7Condition { key: ConditionKey::SourcePrincipal, values, not_values });
    }
    Ok(L7Condition { key, values: strings(&c.values), not_values: strings(&c.not_values) })
}
