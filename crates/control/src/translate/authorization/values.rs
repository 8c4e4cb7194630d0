//! The values of a policy's rules as Istio reads them: service accounts,
//! string forms, address blocks, ports, and what its validation refuses.

use crate::objects::{ObjectError, ObjectRef, RuleSpec, Source};
use slipstream_core::policy::{Cidr, StringMatch};
use std::net::IpAddr;

/// `serviceAccounts` (or `notServiceAccounts`, or the values of a
/// `source.serviceAccount` condition) as Istio reads them: at most 16, each
/// `<namespace>/<serviceaccount>` or a bare name in the policy's namespace,
/// no wildcard, at most 320 characters, dots literal. Each is the peer
/// principal of that account in any trust domain (what Istio's regex
/// matches): the suffix `/ns/<namespace>/sa/<serviceaccount>`.
pub(super) fn service_accounts(v: &[String], field: &str, r: &ObjectRef) -> Result<Vec<StringMatch>, ObjectError> {
    if v.len() > 16 {
        return Err(ObjectError::new(r, field, format!("at most 16 service accounts, not {}", v.len())));
    }
    v.iter()
        .enumerate()
        .map(|(i, s)| {
            let f = format!("{field}[{i}]");
            if s.contains('*') {
                return Err(ObjectError::new(r, f, format!("{s:?}: no wildcard is allowed in a service account")));
            }
            if s.len() > 320 {
                return Err(ObjectError::new(r, f, "longer than 320 characters"));
            }
            let (ns, sa) = match s.split_once('/') {
                Some((ns, sa)) => (ns, sa),
                None => (r.namespace.as_str(), s.as_str()),
            };
            if ns.is_empty() || sa.is_empty() || sa.contains('/') {
                return Err(ObjectError::new(r, f, format!("{s:?}: expected <namespace>/<serviceaccount> or <serviceaccount>")));
            }
            Ok(StringMatch::Suffix(format!("/ns/{ns}/sa/{sa}")))
        })
        .collect()
}

/// Istio refuses `serviceAccounts` together with `principals` or
/// `namespaces` (either form) in one source.
pub(super) fn check_service_accounts_alone(s: &Source, field: &str, r: &ObjectRef) -> Result<(), ObjectError> {
    let accounts = !s.service_accounts.is_empty() || !s.not_service_accounts.is_empty();
    let identities = !s.principals.is_empty() || !s.not_principals.is_empty() || !s.namespaces.is_empty() || !s.not_namespaces.is_empty();
    if accounts && identities {
        let which = if s.service_accounts.is_empty() { "notServiceAccounts" } else { "serviceAccounts" };
        return Err(ObjectError::new(
            r,
            format!("{field}.{which}"),
            "cannot be set with principals, notPrincipals, namespaces or notNamespaces",
        ));
    }
    Ok(())
}

/// Istio's string forms: `*` any value, `*x` suffix, `x*` prefix, else exact.
pub(super) fn string_match(s: &str) -> StringMatch {
    if s == "*" {
        StringMatch::Presence
    } else if let Some(x) = s.strip_prefix('*') {
        StringMatch::Suffix(x.to_string())
    } else if let Some(x) = s.strip_suffix('*') {
        StringMatch::Prefix(x.to_string())
    } else {
        StringMatch::Exact(s.to_string())
    }
}

/// What Istio's validation refuses in a rule's lists, refused the same
/// way: an empty value (it would match nothing, or with `not`, everything),
/// and in `paths` and `notPaths` Envoy's URI templates (`{*}`, `{**}`),
/// which we do not evaluate: read literally, a DENY of `/admin/{**}`
/// would deny nothing.
pub(super) fn check_values(rule: &RuleSpec, path: &str, r: &ObjectRef) -> Result<(), ObjectError> {
    let empty = |v: &[String], field: String| match v.iter().position(String::is_empty) {
        Some(i) => Err(ObjectError::new(r, format!("{field}[{i}]"), "must not be empty")),
        None => Ok(()),
    };
    for (j, f) in rule.from.iter().enumerate() {
        let Some(s) = &f.source else { continue };
        let field = |n: &str| format!("{path}.from[{j}].source.{n}");
        for (n, v) in [
            ("principals", &s.principals),
            ("notPrincipals", &s.not_principals),
            ("requestPrincipals", &s.request_principals),
            ("notRequestPrincipals", &s.not_request_principals),
            ("namespaces", &s.namespaces),
            ("notNamespaces", &s.not_namespaces),
            ("ipBlocks", &s.ip_blocks),
            ("notIpBlocks", &s.not_ip_blocks),
            ("remoteIpBlocks", &s.remote_ip_blocks),
            ("notRemoteIpBlocks", &s.not_remote_ip_blocks),
        ] {
            empty(v, field(n))?;
        }
    }
    for (j, t) in rule.to.iter().enumerate() {
        let Some(o) = &t.operation else { continue };
        let field = |n: &str| format!("{path}.to[{j}].operation.{n}");
        for (n, v) in [
            ("hosts", &o.hosts),
            ("notHosts", &o.not_hosts),
            ("methods", &o.methods),
            ("notMethods", &o.not_methods),
            ("paths", &o.paths),
            ("notPaths", &o.not_paths),
            ("ports", &o.ports),
            ("notPorts", &o.not_ports),
        ] {
            empty(v, field(n))?;
        }
        for (n, v) in [("paths", &o.paths), ("notPaths", &o.not_paths)] {
            if let Some(i) = v.iter().position(|p| p.contains('{') || p.contains('}')) {
                return Err(ObjectError::new(
                    r,
                    format!("{}[{i}]", field(n)),
                    format!("{:?}: URI templates ({{*}}, {{**}}) are not supported; use a prefix (`/admin/*`) or exact paths", v[i]),
                ));
            }
        }
    }
    Ok(())
}

pub(super) fn strings(v: &[String]) -> Vec<StringMatch> {
    v.iter().map(|s| string_match(s)).collect()
}

pub(super) fn cidrs(v: &[String], field: &str, r: &ObjectRef) -> Result<Vec<Cidr>, ObjectError> {
    v.iter()
        .enumerate()
        .map(|(i, s)| {
            parse_cidr(s).ok_or_else(|| ObjectError::new(r, format!("{field}[{i}]"), format!("{s:?} is not an address or address block")))
        })
        .collect()
}

pub(super) fn parse_cidr(s: &str) -> Option<Cidr> {
    let (addr, len) = match s.split_once('/') {
        Some((a, l)) => (a.parse::<IpAddr>().ok()?, Some(l.parse::<u8>().ok()?)),
        None => (s.parse::<IpAddr>().ok()?, None),
    };
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let length = len.unwrap_or(max);
    (length <= max).then_some(Cidr { address: addr, length })
}

/// The blocks in both lists: for two blocks, the smaller one if it lies in
/// the other, else nothing.
pub(super) fn intersect(a: &[Cidr], b: &[Cidr]) -> Vec<Cidr> {
    let mut out = Vec::new();
    for x in a {
        for y in b {
            if x.length <= y.length && x.contains(y.address) {
                out.push(*y);
            } else if y.length <= x.length && y.contains(x.address) {
                out.push(*x);
            }
        }
    }
    out
}

pub(super) fn ports(v: &[String], field: &str, r: &ObjectRef) -> Result<Vec<u16>, ObjectError> {
    v.iter()
        .enumerate()
        .map(|(i, s)| {
            s.parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| ObjectError::new(r, format!("{field}[{i}]"), format!("{s:?} is not a port (1-65535)")))
        })
        .collect()
}
