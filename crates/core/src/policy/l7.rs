//! Authorization at L7, at a waypoint: AuthorizationPolicies bound with
//! `targetRefs` to a Service or to the waypoint's Gateway, with Istio's
//! request attributes (methods, paths, hosts, ports, request headers) as
//! well as the connection's (principals, namespaces, source addresses).
//! Istio's semantics: a matching DENY policy denies; otherwise, if ALLOW
//! policies apply, one of them must match; with none, the request is
//! allowed. Pure: the waypoint asks with one request's attributes.
//!
//! A connection the waypoint passes through as TCP has no request: as
//! Istio does for TCP, an HTTP attribute (host, method, path, request
//! header) makes an ALLOW rule match nothing (it can only allow less) and
//! is left out of a DENY rule (it can only deny more).

use super::{Action, Cidr, PolicyKind, PolicyRule, StringMatch};
use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// One policy as the waypoint enforces it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct L7Policy {
    pub namespace: String,
    pub name: String,
    pub action: Action,
    /// `istio.io/dry-run`: logged, never enforced.
    #[serde(default)]
    pub dry_run: bool,
    /// Its rules in manifest order (a denial names `spec.rules[i]`).
    pub rules: Vec<L7Rule>,
    /// None: bound to the service (targetRefs), evaluated on every request
    /// to it. Some: a selector-bound (or namespace-wide) policy of the
    /// workloads whose traffic passes the waypoint, evaluated only on the
    /// requests sent to one of these workload UIDs (sorted), with the
    /// original client, as a sidecar would have (docs/waypoint.md, "Policy").
    #[serde(default)]
    pub workloads: Option<Vec<String>>,
    /// Only in a waypoint's own routes (the requests addressed to a pod
    /// bound to it): Some for a Service's policy, evaluated (with the
    /// Gateway's) on the requests addressed to one of these pods (UIDs,
    /// sorted) of that Service; None for the Gateway's policies, on every
    /// such request (docs/waypoint.md, "Policy").
    #[serde(default)]
    pub pods: Option<Vec<String>>,
}

/// `from` (any source), `to` (any operation), `when` (every condition);
/// an empty list holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct L7Rule {
    #[serde(default)]
    pub from: Vec<L7Source>,
    #[serde(default)]
    pub to: Vec<L7Operation>,
    #[serde(default)]
    pub when: Vec<L7Condition>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct L7Source {
    /// Without `spiffe://` (`cluster.local/ns/default/sa/sleep`).
    #[serde(default)]
    pub principals: Vec<StringMatch>,
    #[serde(default)]
    pub not_principals: Vec<StringMatch>,
    #[serde(default)]
    pub namespaces: Vec<StringMatch>,
    #[serde(default)]
    pub not_namespaces: Vec<StringMatch>,
    #[serde(default)]
    pub ip_blocks: Vec<Cidr>,
    #[serde(default)]
    pub not_ip_blocks: Vec<Cidr>,
    /// `remoteIpBlocks`: [`L7Request::remote_ip`].
    #[serde(default)]
    pub remote_ip_blocks: Vec<Cidr>,
    #[serde(default)]
    pub not_remote_ip_blocks: Vec<Cidr>,
    /// `requestPrincipals`: the request's JWT `<iss>/<sub>`
    /// ([`RequestAuth::principal`]); HTTP only.
    #[serde(default)]
    pub request_principals: Vec<StringMatch>,
    #[serde(default)]
    pub not_request_principals: Vec<StringMatch>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct L7Operation {
    #[serde(default)]
    pub hosts: Vec<StringMatch>,
    #[serde(default)]
    pub not_hosts: Vec<StringMatch>,
    #[serde(default)]
    pub methods: Vec<StringMatch>,
    #[serde(default)]
    pub not_methods: Vec<StringMatch>,
    #[serde(default)]
    pub paths: Vec<StringMatch>,
    #[serde(default)]
    pub not_paths: Vec<StringMatch>,
    #[serde(default)]
    pub ports: Vec<u16>,
    #[serde(default)]
    pub not_ports: Vec<u16>,
}

/// A `when` condition on a request header (`request.headers[name]`, the
/// name lower-case) or on the connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct L7Condition {
    pub key: ConditionKey,
    #[serde(default)]
    pub values: Vec<StringMatch>,
    #[serde(default)]
    pub not_values: Vec<StringMatch>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConditionKey {
    RequestHeader(String),
    SourceIp,
    /// `remote.ip`: [`L7Request::remote_ip`].
    RemoteIp,
    SourceNamespace,
    SourcePrincipal,
    DestinationPort,
    /// `request.auth.principal`: `<iss>/<sub>` of the request's JWT.
    RequestPrincipal,
    /// `request.auth.audiences`: its `aud`, any of them.
    RequestAudiences,
    /// `request.auth.presenter`: its `azp`.
    RequestPresenter,
    /// `request.auth.claims[a][b]...`: a claim, nested by path; a string,
    /// or a list of strings any of which may match.
    RequestClaim(Vec<String>),
}

impl ConditionKey {
    /// Read only from an HTTP request.
    fn is_http(&self) -> bool {
        matches!(
            self,
            ConditionKey::RequestHeader(_)
                | ConditionKey::RequestPrincipal
                | ConditionKey::RequestAudiences
                | ConditionKey::RequestPresenter
                | ConditionKey::RequestClaim(_)
        )
    }
}

/// What RequestAuthentication established of a request: the JWT it carried
/// was valid (signature, issuer, audience, time).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestAuth {
    /// `<iss>/<sub>`.
    pub principal: String,
    pub audiences: Vec<String>,
    /// `azp`.
    pub presenter: Option<String>,
    /// The payload; space-delimited claims (`scope`, `permission` and the
    /// rule's `spaceDelimitedClaims`) already split into lists.
    pub claims: serde_json::Map<String, serde_json::Value>,
}

impl RequestAuth {
    /// The strings a claim path holds: a string, or the strings of a list.
    pub fn claim(&self, path: &[String]) -> Vec<&str> {
        let Some((first, rest)) = path.split_first() else { return Vec::new() };
        let mut v = self.claims.get(first);
        for p in rest {
            v = v.and_then(|x| x.get(p));
        }
        match v {
            Some(serde_json::Value::String(s)) => vec![s.as_str()],
            Some(serde_json::Value::Array(a)) => a.iter().filter_map(serde_json::Value::as_str).collect(),
            _ => Vec::new(),
        }
    }
}

/// One request as the policies see it.
#[derive(Debug, Clone, Copy)]
pub struct L7Request<'a> {
    /// The caller's verified identity, without `spiffe://`.
    pub principal: Option<&'a str>,
    pub namespace: Option<&'a str>,
    /// The peer's address (`ipBlocks`, `source.ip`).
    pub source_ip: IpAddr,
    /// The client's address as `X-Forwarded-For` gives it past the trusted
    /// proxies (MeshConfig's `numTrustedProxies`), else the peer's
    /// (`remoteIpBlocks`, `remote.ip`): [`remote_ip`].
    pub remote_ip: IpAddr,
    pub method: &'a str,
    pub path: &'a str,
    /// `Host` or `:authority`.
    pub host: &'a str,
    pub port: u16,
    /// Lower-case names.
    pub headers: &'a [(&'a str, &'a str)],
    /// False for a connection passed through as TCP (no request).
    pub http: bool,
    /// What the request's JWT established; None without a valid one.
    pub auth: Option<&'a RequestAuth>,
}

fn any(ms: &[StringMatch], v: Option<&str>) -> bool {
    ms.iter().any(|m| m.matches(v))
}

/// A list that must hold if it is not empty, and its negation.
fn list(yes: &[StringMatch], no: &[StringMatch], v: Option<&str>) -> bool {
    (yes.is_empty() || any(yes, v)) && (no.is_empty() || !any(no, v))
}

impl L7Source {
    fn has_http(&self) -> bool {
        !(self.request_principals.is_empty() && self.not_request_principals.is_empty())
    }

    fn matches(&self, r: &L7Request, deny: bool) -> bool {
        // Without a request (TCP passed through), an HTTP attribute makes
        // an ALLOW source match nothing and is left out of a DENY one.
        if !r.http && self.has_http() && !deny {
            return false;
        }
        let ip = |cs: &[Cidr], a: IpAddr| cs.iter().any(|c| c.contains(a));
        let principal = r.auth.map(|a| a.principal.as_str());
        (!r.http || list(&self.request_principals, &self.not_request_principals, principal))
            && list(&self.principals, &self.not_principals, r.principal)
            && list(&self.namespaces, &self.not_namespaces, r.namespace)
            && (self.ip_blocks.is_empty() || ip(&self.ip_blocks, r.source_ip))
            && (self.not_ip_blocks.is_empty() || !ip(&self.not_ip_blocks, r.source_ip))
            && (self.remote_ip_blocks.is_empty() || ip(&self.remote_ip_blocks, r.remote_ip))
            && (self.not_remote_ip_blocks.is_empty() || !ip(&self.not_remote_ip_blocks, r.remote_ip))
    }
}

/// The client's address a request gives, for `remote.ip`: with
/// `trusted` proxies in front of the mesh (MeshConfig's
/// `numTrustedProxies`), the `trusted`-th address from the right of
/// `X-Forwarded-For` (each of those proxies added the address it was
/// called from); with none, or when the header holds fewer or
/// unreadable addresses, the peer's. As Envoy does with
/// `use_remote_address` (Istio's gateways): a client inside the mesh
/// cannot choose its own `remote.ip` by writing the header.
pub fn remote_ip(xff: &[&str], peer: IpAddr, trusted: u32) -> IpAddr {
    if trusted == 0 {
        return peer;
    }
    let entries: Vec<&str> = xff.iter().flat_map(|v| v.split(',')).map(str::trim).filter(|e| !e.is_empty()).collect();
    let Some(at) = entries.len().checked_sub(trusted as usize) else { return peer };
    let e = entries[at];
    // `for` values may carry a port (`1.2.3.4:5678`, `[::1]:80`).
    let host = e.strip_prefix('[').and_then(|r| r.split_once(']')).map(|(h, _)| h).unwrap_or(e);
    host.parse().or_else(|_| host.rsplit_once(':').map_or(Err(()), |(h, _)| h.parse().map_err(|_| ()))).unwrap_or(peer)
}

/// `hosts` against the request's authority (`Host` or `:authority`):
/// without case (as Istio), a pattern without a port also matches the
/// authority with one, and a trailing dot after the host name (the
/// absolute form, `example.com.`) is ignored on both sides, so that
/// `example.com.` is `example.com` to an ALLOW and to a DENY alike (Envoy
/// compares the raw authority: a DENY of `example.com` would miss
/// `example.com.`).
fn host_matches(ms: &[StringMatch], host: &str) -> bool {
    let host = host.to_ascii_lowercase();
    let (name, port) =
        match host.rsplit_once(':').filter(|(h, p)| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()) && !h.ends_with(':')) {
            Some((h, p)) => (h, Some(p)),
            None => (host.as_str(), None),
        };
    let name = name.strip_suffix('.').unwrap_or(name);
    let with_port = port.map(|p| format!("{name}:{p}"));
    let undot = |e: &str| -> String {
        let e = e.to_ascii_lowercase();
        match e.rsplit_once(':').filter(|(_, p)| p.chars().all(|c| c.is_ascii_digit()) || *p == "*") {
            Some((h, p)) => format!("{}:{p}", h.strip_suffix('.').unwrap_or(h)),
            None => e.strip_suffix('.').map(str::to_string).unwrap_or(e),
        }
    };
    ms.iter().any(|m| {
        let m = match m {
            StringMatch::Exact(e) => StringMatch::Exact(undot(e)),
            StringMatch::Prefix(e) => StringMatch::Prefix(e.to_ascii_lowercase()),
            StringMatch::Suffix(e) => StringMatch::Suffix(undot(e)),
            StringMatch::Presence => StringMatch::Presence,
        };
        with_port.as_deref().is_some_and(|h| m.matches(Some(h))) || m.matches(Some(name))
    })
}

impl L7Operation {
    fn has_http(&self) -> bool {
        !(self.hosts.is_empty()
            && self.not_hosts.is_empty()
            && self.methods.is_empty()
            && self.not_methods.is_empty()
            && self.paths.is_empty()
            && self.not_paths.is_empty())
    }

    fn matches(&self, r: &L7Request, deny: bool) -> bool {
        if !r.http && self.has_http() {
            if !deny {
                return false;
            }
            let ports_only = L7Operation { ports: self.ports.clone(), not_ports: self.not_ports.clone(), ..Default::default() };
            return ports_only.matches(r, deny);
        }
        (self.hosts.is_empty() || host_matches(&self.hosts, r.host))
            && (self.not_hosts.is_empty() || !host_matches(&self.not_hosts, r.host))
            && list(&self.methods, &self.not_methods, Some(r.method))
            && list(&self.paths, &self.not_paths, Some(r.path))
            && (self.ports.is_empty() || self.ports.contains(&r.port))
            && (self.not_ports.is_empty() || !self.not_ports.contains(&r.port))
    }
}

impl L7Condition {
    fn matches(&self, r: &L7Request, deny: bool) -> bool {
        if !r.http && self.key.is_http() {
            return deny;
        }
        let port = r.port.to_string();
        let address = if self.key == ConditionKey::RemoteIp { r.remote_ip } else { r.source_ip };
        let ip = address.to_string();
        let v: Option<String> = match &self.key {
            ConditionKey::RequestHeader(h) => {
                let values: Vec<&str> = r.headers.iter().filter(|(k, _)| k == h).map(|(_, v)| *v).collect();
                (!values.is_empty()).then(|| values.join(","))
            }
            ConditionKey::SourceIp | ConditionKey::RemoteIp => Some(ip),
            ConditionKey::SourceNamespace => r.namespace.map(str::to_string),
            ConditionKey::SourcePrincipal => r.principal.map(str::to_string),
            ConditionKey::DestinationPort => Some(port),
            ConditionKey::RequestPrincipal => r.auth.map(|a| a.principal.clone()),
            ConditionKey::RequestPresenter => r.auth.and_then(|a| a.presenter.clone()),
            // Lists: a value matches when one element does.
            ConditionKey::RequestAudiences | ConditionKey::RequestClaim(_) => {
                let values: Vec<&str> = match (&self.key, r.auth) {
                    (ConditionKey::RequestAudiences, Some(a)) => a.audiences.iter().map(String::as_str).collect(),
                    (ConditionKey::RequestClaim(path), Some(a)) => a.claim(path),
                    _ => Vec::new(),
                };
                let any_of = |ms: &[StringMatch]| values.iter().any(|v| any(ms, Some(v)));
                return (self.values.is_empty() || any_of(&self.values)) && (self.not_values.is_empty() || !any_of(&self.not_values));
            }
        };
        let v = v.as_deref();
        if matches!(self.key, ConditionKey::SourceIp | ConditionKey::RemoteIp) {
            // Address conditions are blocks.
            let blocks = |ms: &[StringMatch]| {
                ms.iter().any(|m| match m {
                    StringMatch::Exact(s) => parse_block(s).is_some_and(|c| c.contains(address)),
                    _ => false,
                })
            };
            return (self.values.is_empty() || blocks(&self.values)) && (self.not_values.is_empty() || !blocks(&self.not_values));
        }
        list(&self.values, &self.not_values, v)
    }
}

/// `10.0.0.0/8` or `10.1.2.3`.
pub fn parse_block(s: &str) -> Option<Cidr> {
    let (a, l) = match s.split_once('/') {
        Some((a, l)) => (a.parse::<IpAddr>().ok()?, Some(l.parse::<u8>().ok()?)),
        None => (s.parse::<IpAddr>().ok()?, None),
    };
    let max = if a.is_ipv4() { 32 } else { 128 };
    let length = l.unwrap_or(max);
    (length <= max).then_some(Cidr { address: a, length })
}

impl L7Rule {
    fn matches(&self, r: &L7Request, deny: bool) -> bool {
        (self.from.is_empty() || self.from.iter().any(|s| s.matches(r, deny)))
            && (self.to.is_empty() || self.to.iter().any(|o| o.matches(r, deny)))
            && self.when.iter().all(|c| c.matches(r, deny))
    }
}

impl L7Policy {
    /// The index of the first rule that matches (a policy without rules
    /// matches nothing, as Istio reads it: an ALLOW without rules allows
    /// nothing, a DENY without rules denies nothing).
    pub fn matching_rule(&self, r: &L7Request) -> Option<usize> {
        self.rules.iter().position(|rule| rule.matches(r, self.action == Action::Deny))
    }

    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The answer, and which policy decided it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct L7Verdict {
    pub allowed: bool,
    /// The DENY rule that matched, the ALLOW rule that allowed, or (denied
    /// for want of an allow) the first ALLOW policy; None when no policy
    /// applies.
    pub by: Option<PolicyRule>,
    /// Dry-run policies that would have denied.
    pub dry_run_denials: Vec<PolicyRule>,
}

fn rule_of(p: &L7Policy, i: Option<usize>) -> PolicyRule {
    PolicyRule::new(PolicyKind::AuthorizationPolicy, &p.namespace, &p.name, i.map(|i| format!("spec.rules[{i}]")))
}

/// Istio's order: DENY first, then ALLOW.
pub fn evaluate<'p>(policies: impl IntoIterator<Item = &'p L7Policy> + Clone, r: &L7Request) -> L7Verdict {
    let mut dry_run_denials = Vec::new();
    for p in policies.clone().into_iter().filter(|p| p.action == Action::Deny) {
        if let Some(i) = p.matching_rule(r) {
            if p.dry_run {
                dry_run_denials.push(rule_of(p, Some(i)));
                continue;
            }
            return L7Verdict { allowed: false, by: Some(rule_of(p, Some(i))), dry_run_denials };
        }
    }
    let allows: Vec<&L7Policy> = policies.into_iter().filter(|p| p.action == Action::Allow && !p.dry_run).collect();
    if allows.is_empty() {
        return L7Verdict { allowed: true, by: None, dry_run_denials };
    }
    for p in &allows {
        if let Some(i) = p.matching_rule(r) {
            return L7Verdict { allowed: true, by: Some(rule_of(p, Some(i))), dry_run_denials };
        }
    }
    L7Verdict { allowed: false, by: Some(rule_of(allows[0], None)), dry_run_denials }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exact(s: &str) -> StringMatch {
        StringMatch::Exact(s.into())
    }

    fn req<'a>(principal: &'a str, method: &'a str, path: &'a str, headers: &'a [(&'a str, &'a str)]) -> L7Request<'a> {
        L7Request {
            principal: Some(principal),
            namespace: principal.split('/').nth(2),
            source_ip: "10.244.1.5".parse().unwrap(),
            remote_ip: "10.244.1.5".parse().unwrap(),
            method,
            path,
            host: "billing-service.production:8080",
            port: 8080,
            headers,
            http: true,
            auth: None,
        }
    }

    /// The seed policy: frontend may only GET /api/v1/invoices on billing.
    fn billing() -> L7Policy {
        L7Policy {
            namespace: "production".into(),
            name: "billing-l7".into(),
            action: Action::Allow,
            dry_run: false,
            workloads: None,
            pods: None,
            rules: vec![L7Rule {
                from: vec![L7Source { principals: vec![exact("cluster.local/ns/production/sa/frontend")], ..Default::default() }],
                to: vec![L7Operation {
                    methods: vec![exact("GET")],
                    paths: vec![exact("/api/v1/invoices"), StringMatch::Prefix("/api/v1/invoices/".into())],
                    ..Default::default()
                }],
                when: vec![],
            }],
        }
    }

    #[test]
    fn istio_semantics_deny_first_then_one_allow_must_match() {
        let fe = "cluster.local/ns/production/sa/frontend";
        let legacy = "cluster.local/ns/production/sa/legacy-service";
        let none: Vec<(&str, &str)> = vec![];
        let p = [billing()];
        let allowed = |r: &L7Request| evaluate(p.iter(), r).allowed;
        assert!(allowed(&req(fe, "GET", "/api/v1/invoices", &none)));
        assert!(allowed(&req(fe, "GET", "/api/v1/invoices/42", &none)));
        assert!(!allowed(&req(fe, "POST", "/api/v1/invoices", &none)));
        assert!(!allowed(&req(fe, "GET", "/api/v1/admin", &none)));
        assert!(!allowed(&req(legacy, "GET", "/api/v1/invoices", &none)));
        let v = evaluate(p.iter(), &req(fe, "POST", "/api/v1/invoices", &none));
        assert_eq!(v.by.unwrap().name, "billing-l7", "the denial names the policy that required an allow");
        // No policy: allowed.
        assert!(evaluate(std::iter::empty::<&L7Policy>(), &req(legacy, "DELETE", "/", &none)).allowed);
        // A DENY on a header wins over the ALLOW.
        let deny = L7Policy {
            name: "no-debug".into(),
            namespace: "production".into(),
            action: Action::Deny,
            rules: vec![L7Rule {
                when: vec![L7Condition {
                    key: ConditionKey::RequestHeader("x-debug".into()),
                    values: vec![StringMatch::Presence],
                    not_values: vec![],
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let both = [billing(), deny.clone()];
        let debug = vec![("x-debug", "1")];
        let v = evaluate(both.iter(), &req(fe, "GET", "/api/v1/invoices", &debug));
        assert!(!v.allowed);
        assert_eq!(v.by.unwrap().rule.as_deref(), Some("spec.rules[0]"));
        assert!(evaluate(both.iter(), &req(fe, "GET", "/api/v1/invoices", &none)).allowed);
        // A dry-run DENY is reported, not enforced.
        let dry = [billing(), L7Policy { dry_run: true, ..deny }];
        let v = evaluate(dry.iter(), &req(fe, "GET", "/api/v1/invoices", &debug));
        assert!(v.allowed && v.dry_run_denials.len() == 1);
    }

    #[test]
    fn a_trailing_dot_after_the_host_name_is_the_same_host_to_allow_and_deny() {
        let policy = |action: Action, host: &str| L7Policy {
            namespace: "shop".into(),
            name: "hosts".into(),
            action,
            rules: vec![L7Rule { to: vec![L7Operation { hosts: vec![exact(host)], ..Default::default() }], ..Default::default() }],
            ..Default::default()
        };
        let none: [(&str, &str); 0] = [];
        let at = |h: &'static str| L7Request { host: h, ..req("cluster.local/ns/shop/sa/client", "GET", "/", &none) };
        for host in ["admin.example.com", "admin.example.com.", "ADMIN.Example.COM.", "admin.example.com.:8080", "admin.example.com:8080"] {
            for pattern in ["admin.example.com", "admin.example.com."] {
                assert!(!evaluate([policy(Action::Deny, pattern)].iter(), &at(host)).allowed, "DENY {pattern} holds for {host}");
                assert!(evaluate([policy(Action::Allow, pattern)].iter(), &at(host)).allowed, "ALLOW {pattern} lets {host} in");
            }
        }
        for host in ["admin.example.com..", "xadmin.example.com", "admin.example.co"] {
            assert!(evaluate([policy(Action::Deny, "admin.example.com")].iter(), &at(host)).allowed, "{host} is another host");
        }
        // A pattern with a port matches only that port.
        assert!(!evaluate([policy(Action::Allow, "admin.example.com:9090")].iter(), &at("admin.example.com.:8080")).allowed);
        assert!(evaluate([policy(Action::Allow, "admin.example.com.:8080")].iter(), &at("admin.example.com:8080")).allowed);
    }

    #[test]
    fn remote_ip_is_the_peers_unless_proxies_in_front_of_the_mesh_are_trusted() {
        let peer: IpAddr = "10.244.1.5".parse().unwrap();
        let xff = ["203.0.113.9, 198.51.100.7", "192.0.2.1"];
        assert_eq!(remote_ip(&xff, peer, 0), peer, "no proxy trusted: what a client writes is not its address");
        assert_eq!(remote_ip(&xff, peer, 1), "192.0.2.1".parse::<IpAddr>().unwrap());
        assert_eq!(remote_ip(&xff, peer, 2), "198.51.100.7".parse::<IpAddr>().unwrap());
        assert_eq!(remote_ip(&xff, peer, 3), "203.0.113.9".parse::<IpAddr>().unwrap());
        assert_eq!(remote_ip(&xff, peer, 4), peer, "fewer addresses than trusted proxies");
        assert_eq!(remote_ip(&["unknown"], peer, 1), peer, "not an address");
        assert_eq!(remote_ip(&["[2001:db8::1]:443"], peer, 1), "2001:db8::1".parse::<IpAddr>().unwrap());
        assert_eq!(remote_ip(&["192.0.2.4:1234"], peer, 1), "192.0.2.4".parse::<IpAddr>().unwrap());
        // remoteIpBlocks and remote.ip read it; ipBlocks and source.ip the peer.
        let none: [(&str, &str); 0] = [];
        let r = L7Request { remote_ip: "192.0.2.1".parse().unwrap(), ..req("cluster.local/ns/shop/sa/client", "GET", "/", &none) };
        let src = |s: L7Source| s.matches(&r, false);
        assert!(src(L7Source { remote_ip_blocks: vec![parse_block("192.0.2.0/24").unwrap()], ..Default::default() }));
        assert!(!src(L7Source { ip_blocks: vec![parse_block("192.0.2.0/24").unwrap()], ..Default::default() }));
        assert!(!src(L7Source { not_remote_ip_blocks: vec![parse_block("192.0.2.1").unwrap()], ..Default::default() }));
        let cond = |key| L7Condition { key, values: vec![exact("192.0.2.0/24")], not_values: vec![] }.matches(&r, false);
        assert!(cond(ConditionKey::RemoteIp) && !cond(ConditionKey::SourceIp));
    }

    #[test]
    fn hosts_ports_sources_and_conditions() {
        let none: Vec<(&str, &str)> = vec![];
        let r = req("cluster.local/ns/production/sa/frontend", "GET", "/x", &none);
        let op = |o: L7Operation| L7Rule { to: vec![o], ..Default::default() }.matches(&r, false);
        assert!(op(L7Operation { hosts: vec![exact("billing-service.production")], ..Default::default() }), "a host without port");
        assert!(op(L7Operation { hosts: vec![exact("BILLING-SERVICE.production:8080")], ..Default::default() }), "case");
        assert!(op(L7Operation { hosts: vec![StringMatch::Prefix("billing".into())], ..Default::default() }));
        assert!(!op(L7Operation { not_hosts: vec![StringMatch::Suffix(".production".into())], ..Default::default() }));
        assert!(op(L7Operation { ports: vec![8080], ..Default::default() }));
        assert!(!op(L7Operation { not_ports: vec![8080], ..Default::default() }));
        assert!(op(L7Operation { not_methods: vec![exact("POST")], ..Default::default() }));
        let src = |s: L7Source| L7Rule { from: vec![s], ..Default::default() }.matches(&r, false);
        assert!(src(L7Source { namespaces: vec![exact("production")], ..Default::default() }));
        assert!(!src(L7Source { not_namespaces: vec![exact("production")], ..Default::default() }));
        assert!(src(L7Source { ip_blocks: vec![parse_block("10.244.0.0/16").unwrap()], ..Default::default() }));
        assert!(!src(L7Source { not_ip_blocks: vec![parse_block("10.244.1.5").unwrap()], ..Default::default() }));
        let cond = |key, values: Vec<StringMatch>| {
            L7Rule { when: vec![L7Condition { key, values, not_values: vec![] }], ..Default::default() }.matches(&r, false)
        };
        assert!(cond(ConditionKey::SourceIp, vec![exact("10.244.1.0/24")]));
        assert!(!cond(ConditionKey::SourceIp, vec![exact("10.0.0.0/24")]));
        assert!(cond(ConditionKey::DestinationPort, vec![exact("8080")]));
        assert!(cond(ConditionKey::SourceNamespace, vec![exact("production")]));
        assert!(!cond(ConditionKey::RequestHeader("x-user".into()), vec![StringMatch::Presence]), "absent header");
    }

    #[test]
    fn tcp_passed_through_allows_less_and_denies_more() {
        let none: Vec<(&str, &str)> = vec![];
        let fe = "cluster.local/ns/production/sa/frontend";
        let tcp = L7Request { http: false, method: "", path: "", host: "", ..req(fe, "GET", "/api/v1/invoices", &none) };
        // The ALLOW on GET /api/v1/invoices cannot allow a TCP connection.
        assert!(!evaluate([billing()].iter(), &tcp).allowed);
        // A DENY on a path from frontend denies its TCP connections.
        let deny = L7Policy {
            name: "no-admin".into(),
            action: Action::Deny,
            rules: vec![L7Rule {
                from: vec![L7Source { principals: vec![exact(fe)], ..Default::default() }],
                to: vec![L7Operation { paths: vec![exact("/admin")], ports: vec![8080], ..Default::default() }],
                when: vec![],
            }],
            ..Default::default()
        };
        assert!(!evaluate([deny.clone()].iter(), &tcp).allowed);
        assert!(evaluate([deny].iter(), &L7Request { port: 9090, ..tcp }).allowed, "its port part still holds");
    }
}
