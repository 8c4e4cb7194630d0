//! The waypoint's routes (`slipstream.route.v1.ServiceRoutes`) to and from
//! the model's [`ServiceRoutes`]. To the wire: total. From the wire: a
//! field the model cannot take is an error naming it
//! (`rules[0].matches[1].path`), so the waypoint NACKs the resource.

use crate::convert::ConvertError;
use crate::route as pb;
use prost::Message;
use slipstream_core::route::traffic::{
    Fault, FaultAbort, FaultDelay, HashOn, LoadBalancer, OutlierDetection, Retry, RetryOn, TrafficPolicy,
};
use slipstream_core::route::{
    Backend, Filters, HeaderMatch, HeaderModifier, JwtHeader, JwtRule, LimitScope, PathMatch, PathRewrite, QueryMatch, RateLimit, Redirect,
    Rewrite, RouteMatch, RouteRule, ServiceRoutes, Subset,
};
use std::time::Duration;

fn err(field: impl Into<String>, message: impl Into<String>) -> ConvertError {
    ConvertError { field: field.into(), message: message.into() }
}

// ---- to the wire ----

fn duration(d: Duration) -> prost_types::Duration {
    // `as_secs` beyond i64 is 292 billion years; saturate rather than fail.
    prost_types::Duration { seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX), nanos: d.subsec_nanos() as i32 }
}

fn backend(b: &Backend) -> pb::Backend {
    pb::Backend {
        service: b.service.clone(),
        port: b.port.into(),
        weight: b.weight,
        subset: b.subset.as_ref().map(|s| pb::Subset {
            name: s.name.clone(),
            workloads: s.workloads.clone(),
            traffic: s.traffic.as_ref().map(traffic_policy),
        }),
    }
}

fn traffic_policy(t: &TrafficPolicy) -> pb::TrafficPolicy {
    use pb::load_balancer::Kind;
    pb::TrafficPolicy {
        lb: Some(pb::LoadBalancer {
            kind: Some(match &t.lb {
                LoadBalancer::LeastRequest => Kind::LeastRequest(true),
                LoadBalancer::RoundRobin => Kind::RoundRobin(true),
                LoadBalancer::Random => Kind::Random(true),
                LoadBalancer::Hash(HashOn::Header(h)) => Kind::HashHeader(h.clone()),
                LoadBalancer::Hash(HashOn::Cookie(c)) => Kind::HashCookie(c.clone()),
                LoadBalancer::Hash(HashOn::SourceIp) => Kind::HashSourceIp(true),
                LoadBalancer::Hash(HashOn::Query(q)) => Kind::HashQuery(q.clone()),
            }),
        }),
        max_requests: t.max_requests,
        outlier: t.outlier.as_ref().map(|o| pb::OutlierDetection {
            consecutive_5xx: o.consecutive_5xx,
            consecutive_gateway: o.consecutive_gateway,
            base_ejection: Some(duration(o.base_ejection)),
            max_ejection_percent: o.max_ejection_percent,
        }),
    }
}

fn retry(r: &Retry) -> pb::Retry {
    pb::Retry {
        attempts: r.attempts,
        per_try_timeout: r.per_try_timeout.map(duration),
        five_xx: r.on.five_xx,
        gateway_error: r.on.gateway_error,
        connect_failure: r.on.connect_failure,
        reset: r.on.reset,
        refused_stream: r.on.refused_stream,
        retriable_4xx: r.on.retriable_4xx,
        status_codes: r.on.status_codes.iter().map(|c| u32::from(*c)).collect(),
    }
}

fn fault(f: &Fault) -> pb::Fault {
    pb::Fault {
        delay: f.delay.as_ref().map(|d| pb::FaultDelay { per_million: d.per_million, delay: Some(duration(d.delay)) }),
        abort: f.abort.as_ref().map(|a| pb::FaultAbort { per_million: a.per_million, status: a.status.into() }),
    }
}

fn path_rewrite(p: &PathRewrite) -> pb::PathRewrite {
    pb::PathRewrite {
        kind: Some(match p {
            PathRewrite::ReplaceFullPath(s) => pb::path_rewrite::Kind::ReplaceFullPath(s.clone()),
            PathRewrite::ReplacePrefixMatch(s) => pb::path_rewrite::Kind::ReplacePrefixMatch(s.clone()),
        }),
    }
}

fn headers(pairs: &[(String, String)]) -> Vec<pb::Header> {
    pairs.iter().map(|(name, value)| pb::Header { name: name.clone(), value: value.clone() }).collect()
}

fn modifier(m: &HeaderModifier) -> Option<pb::HeaderModifier> {
    (!m.is_empty()).then(|| pb::HeaderModifier { set: headers(&m.set), add: headers(&m.add), remove: m.remove.clone() })
}

fn route_match(m: &RouteMatch) -> pb::RouteMatch {
    pb::RouteMatch {
        path: Some(pb::PathMatch {
            kind: Some(match &m.path {
                PathMatch::Exact(p) => pb::path_match::Kind::Exact(p.clone()),
                PathMatch::Prefix(p) => pb::path_match::Kind::Prefix(p.clone()),
                PathMatch::StringPrefix(p) => pb::path_match::Kind::StringPrefix(p.clone()),
            }),
        }),
        headers: m.headers.iter().map(|h| pb::HeaderMatch { name: h.name.clone(), value: h.value.clone() }).collect(),
        query: m.query.iter().map(|q| pb::QueryMatch { name: q.name.clone(), value: q.value.clone() }).collect(),
        method: m.method.clone(),
        header_prefixes: m.header_prefixes.iter().map(|h| pb::HeaderMatch { name: h.name.clone(), value: h.value.clone() }).collect(),
        query_prefixes: m.query_prefixes.iter().map(|q| pb::QueryMatch { name: q.name.clone(), value: q.value.clone() }).collect(),
        ignore_case: m.ignore_case,
    }
}

fn filters(f: &Filters) -> pb::Filters {
    pb::Filters {
        request_headers: modifier(&f.request_headers),
        response_headers: modifier(&f.response_headers),
        redirect: f.redirect.as_ref().map(|r| pb::Redirect {
            scheme: r.scheme.clone(),
            hostname: r.hostname.clone(),
            path: r.path.as_ref().map(path_rewrite),
            port: r.port.map(u32::from),
            status: r.status.into(),
        }),
        rewrite: f.rewrite.as_ref().map(|r| pb::Rewrite { hostname: r.hostname.clone(), path: r.path.as_ref().map(path_rewrite) }),
        mirrors: f.mirrors.iter().map(backend).collect(),
        mirror_per_million: f.mirror_per_million,
    }
}

impl From<&RouteRule> for pb::RouteRule {
    fn from(r: &RouteRule) -> Self {
        pb::RouteRule {
            name: r.name.clone(),
            port: r.port.into(),
            matches: r.matches.iter().map(route_match).collect(),
            backends: r.backends.iter().map(backend).collect(),
            filters: Some(filters(&r.filters)),
            timeout: r.timeout.map(duration),
            backend_timeout: r.backend_timeout.map(duration),
            retry: r.retry.as_ref().map(retry),
            fault: r.fault.as_ref().map(fault),
        }
    }
}

impl From<&ServiceRoutes> for pb::ServiceRoutes {
    fn from(s: &ServiceRoutes) -> Self {
        pb::ServiceRoutes {
            service: s.service.clone(),
            rules: s.rules.iter().map(pb::RouteRule::from).collect(),
            policies: s.policies.iter().map(l7::policy).collect(),
            traffic: (s.traffic != TrafficPolicy::default()).then(|| traffic_policy(&s.traffic)),
            source: s.source.clone(),
            limits: s
                .limits
                .iter()
                .map(|l| {
                    let (routes, rules) = match &l.scope {
                        LimitScope::Service => (vec![], vec![]),
                        LimitScope::Rules { routes, rules } => (routes.clone(), rules.clone()),
                    };
                    pb::RateLimit {
                        policy: l.policy.clone(),
                        requests: l.requests,
                        interval: Some(duration(l.interval)),
                        burst: l.burst,
                        routes,
                        rules,
                    }
                })
                .collect(),
            jwt_rules: s
                .jwt_rules
                .iter()
                .map(|j| pb::JwtRule {
                    policy: j.policy.clone(),
                    issuer: j.issuer.clone(),
                    audiences: j.audiences.clone(),
                    jwks: j.jwks.clone(),
                    from_headers: j.from_headers.iter().map(|h| pb::JwtHeader { name: h.name.clone(), prefix: h.prefix.clone() }).collect(),
                    from_params: j.from_params.clone(),
                    from_cookies: j.from_cookies.clone(),
                    output_payload_to_header: j.output_payload_to_header.clone().unwrap_or_default(),
                    forward_original_token: j.forward_original_token,
                    output_claim_to_headers: j
                        .output_claim_to_headers
                        .iter()
                        .map(|(header, claim)| pb::ClaimToHeader { header: header.clone(), claim: claim.clone() })
                        .collect(),
                    space_delimited_claims: j.space_delimited_claims.clone(),
                })
                .collect(),
        }
    }
}

/// The L7 policies, both ways.
mod l7 {
    use super::{err, ConvertError};
    use crate::route as pb;
    use slipstream_core::policy::l7::*;
    use slipstream_core::policy::{Action, Cidr, StringMatch};

    fn sm(m: &StringMatch) -> pb::StringMatch {
        use pb::string_match::Kind;
        pb::StringMatch {
            kind: Some(match m {
                StringMatch::Exact(s) => Kind::Exact(s.clone()),
                StringMatch::Prefix(s) => Kind::Prefix(s.clone()),
                StringMatch::Suffix(s) => Kind::Suffix(s.clone()),
                StringMatch::Presence => Kind::Presence(true),
            }),
        }
    }

    fn sms(v: &[StringMatch]) -> Vec<pb::StringMatch> {
        v.iter().map(sm).collect()
    }

    fn cidr(c: &Cidr) -> pb::Cidr {
        pb::Cidr { address: crate::convert::ip_bytes(c.address), length: c.length.into() }
    }

    pub(super) fn policy(p: &L7Policy) -> pb::L7Policy {
        pb::L7Policy {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            deny: p.action == Action::Deny,
            dry_run: p.dry_run,
            per_workload: p.workloads.is_some(),
            workloads: p.workloads.clone().unwrap_or_default(),
            per_pod: p.pods.is_some(),
            pods: p.pods.clone().unwrap_or_default(),
            rules: p
                .rules
                .iter()
                .map(|r| pb::L7Rule {
                    from: r
                        .from
                        .iter()
                        .map(|s| pb::L7Source {
                            principals: sms(&s.principals),
                            not_principals: sms(&s.not_principals),
                            namespaces: sms(&s.namespaces),
                            not_namespaces: sms(&s.not_namespaces),
                            ip_blocks: s.ip_blocks.iter().map(cidr).collect(),
                            not_ip_blocks: s.not_ip_blocks.iter().map(cidr).collect(),
                            remote_ip_blocks: s.remote_ip_blocks.iter().map(cidr).collect(),
                            not_remote_ip_blocks: s.not_remote_ip_blocks.iter().map(cidr).collect(),
                            request_principals: sms(&s.request_principals),
                            not_request_principals: sms(&s.not_request_principals),
                        })
                        .collect(),
                    to: r
                        .to
                        .iter()
                        .map(|o| pb::L7Operation {
                            hosts: sms(&o.hosts),
                            not_hosts: sms(&o.not_hosts),
                            methods: sms(&o.methods),
                            not_methods: sms(&o.not_methods),
                            paths: sms(&o.paths),
                            not_paths: sms(&o.not_paths),
                            ports: o.ports.iter().map(|p| u32::from(*p)).collect(),
                            not_ports: o.not_ports.iter().map(|p| u32::from(*p)).collect(),
                        })
                        .collect(),
                    when: r
                        .when
                        .iter()
                        .map(|c| {
                            use pb::l7_condition::Key;
                            pb::L7Condition {
                                key: Some(match &c.key {
                                    ConditionKey::RequestHeader(h) => Key::RequestHeader(h.clone()),
                                    ConditionKey::SourceIp => Key::SourceIp(true),
                                    ConditionKey::RemoteIp => Key::RemoteIp(true),
                                    ConditionKey::RequestPrincipal => Key::RequestPrincipal(true),
                                    ConditionKey::RequestAudiences => Key::RequestAudiences(true),
                                    ConditionKey::RequestPresenter => Key::RequestPresenter(true),
                                    ConditionKey::RequestClaim(path) => Key::RequestClaim(pb::ClaimPath { path: path.clone() }),
                                    ConditionKey::SourceNamespace => Key::SourceNamespace(true),
                                    ConditionKey::SourcePrincipal => Key::SourcePrincipal(true),
                                    ConditionKey::DestinationPort => Key::DestinationPort(true),
                                }),
                                values: sms(&c.values),
                                not_values: sms(&c.not_values),
                            }
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    fn sm_from(m: &pb::StringMatch, field: &str) -> Result<StringMatch, ConvertError> {
        use pb::string_match::Kind;
        match &m.kind {
            Some(Kind::Exact(s)) => Ok(StringMatch::Exact(s.clone())),
            Some(Kind::Prefix(s)) => Ok(StringMatch::Prefix(s.clone())),
            Some(Kind::Suffix(s)) => Ok(StringMatch::Suffix(s.clone())),
            Some(Kind::Presence(true)) => Ok(StringMatch::Presence),
            _ => Err(err(field, "a string match needs exact, prefix, suffix or presence")),
        }
    }

    fn sms_from(v: &[pb::StringMatch], field: &str) -> Result<Vec<StringMatch>, ConvertError> {
        v.iter().enumerate().map(|(i, m)| sm_from(m, &format!("{field}[{i}]"))).collect()
    }

    fn cidrs_from(v: &[pb::Cidr], field: &str) -> Result<Vec<Cidr>, ConvertError> {
        v.iter()
            .enumerate()
            .map(|(i, c)| {
                let f = format!("{field}[{i}]");
                let address = crate::convert::ip_from_bytes(&c.address, &format!("{f}.address"))?;
                let max = if address.is_ipv4() { 32 } else { 128 };
                let length = u8::try_from(c.length).ok().filter(|l| *l <= max).ok_or_else(|| err(format!("{f}.length"), "too long"))?;
                Ok(Cidr { address, length })
            })
            .collect()
    }

    fn ports_from(v: &[u32], field: &str) -> Result<Vec<u16>, ConvertError> {
        v.iter().enumerate().map(|(i, p)| u16::try_from(*p).map_err(|_| err(format!("{field}[{i}]"), "not a port"))).collect()
    }

    pub(super) fn policy_from(p: &pb::L7Policy, field: &str) -> Result<L7Policy, ConvertError> {
        let mut rules = Vec::new();
        for (i, r) in p.rules.iter().enumerate() {
            let f = format!("{field}.rules[{i}]");
            let mut from = Vec::new();
            for (j, s) in r.from.iter().enumerate() {
                let g = format!("{f}.from[{j}]");
                from.push(L7Source {
                    principals: sms_from(&s.principals, &format!("{g}.principals"))?,
                    not_principals: sms_from(&s.not_principals, &format!("{g}.not_principals"))?,
                    namespaces: sms_from(&s.namespaces, &format!("{g}.namespaces"))?,
                    not_namespaces: sms_from(&s.not_namespaces, &format!("{g}.not_namespaces"))?,
                    ip_blocks: cidrs_from(&s.ip_blocks, &format!("{g}.ip_blocks"))?,
                    not_ip_blocks: cidrs_from(&s.not_ip_blocks, &format!("{g}.not_ip_blocks"))?,
                    remote_ip_blocks: cidrs_from(&s.remote_ip_blocks, &format!("{g}.remote_ip_blocks"))?,
                    not_remote_ip_blocks: cidrs_from(&s.not_remote_ip_blocks, &format!("{g}.not_remote_ip_blocks"))?,
                    request_principals: sms_from(&s.request_principals, &format!("{g}.request_principals"))?,
                    not_request_principals: sms_from(&s.not_request_principals, &format!("{g}.not_request_principals"))?,
                });
            }
            let mut to = Vec::new();
            for (j, o) in r.to.iter().enumerate() {
                let g = format!("{f}.to[{j}]");
                to.push(L7Operation {
                    hosts: sms_from(&o.hosts, &format!("{g}.hosts"))?,
                    not_hosts: sms_from(&o.not_hosts, &format!("{g}.not_hosts"))?,
                    methods: sms_from(&o.methods, &format!("{g}.methods"))?,
                    not_methods: sms_from(&o.not_methods, &format!("{g}.not_methods"))?,
                    paths: sms_from(&o.paths, &format!("{g}.paths"))?,
                    not_paths: sms_from(&o.not_paths, &format!("{g}.not_paths"))?,
                    ports: ports_from(&o.ports, &format!("{g}.ports"))?,
                    not_ports: ports_from(&o.not_ports, &format!("{g}.not_ports"))?,
                });
            }
            let mut when = Vec::new();
            for (j, c) in r.when.iter().enumerate() {
                use pb::l7_condition::Key;
                let g = format!("{f}.when[{j}]");
                let key = match &c.key {
                    Some(Key::RequestHeader(h)) if !h.is_empty() => ConditionKey::RequestHeader(h.to_ascii_lowercase()),
                    Some(Key::SourceIp(true)) => ConditionKey::SourceIp,
                    Some(Key::RemoteIp(true)) => ConditionKey::RemoteIp,
                    Some(Key::RequestPrincipal(true)) => ConditionKey::RequestPrincipal,
                    Some(Key::RequestAudiences(true)) => ConditionKey::RequestAudiences,
                    Some(Key::RequestPresenter(true)) => ConditionKey::RequestPresenter,
                    Some(Key::RequestClaim(c)) if !c.path.is_empty() && c.path.iter().all(|p| !p.is_empty()) => {
                        ConditionKey::RequestClaim(c.path.clone())
                    }
                    Some(Key::SourceNamespace(true)) => ConditionKey::SourceNamespace,
                    Some(Key::SourcePrincipal(true)) => ConditionKey::SourcePrincipal,
                    Some(Key::DestinationPort(true)) => ConditionKey::DestinationPort,
                    _ => return Err(err(format!("{g}.key"), "missing or unknown")),
                };
                when.push(L7Condition {
                    key,
                    values: sms_from(&c.values, &format!("{g}.values"))?,
                    not_values: sms_from(&c.not_values, &format!("{g}.not_values"))?,
                });
            }
            rules.push(L7Rule { from, to, when });
        }
        let sorted = |v: &Vec<String>| {
            let mut w = v.clone();
            w.sort();
            w
        };
        let workloads = p.per_workload.then(|| sorted(&p.workloads));
        let pods = p.per_pod.then(|| sorted(&p.pods));
        Ok(L7Policy {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            action: if p.deny { Action::Deny } else { Action::Allow },
            dry_run: p.dry_run,
            rules,
            workloads,
            pods,
        })
    }
}

// ---- from the wire ----

fn port16(v: u32, field: &str) -> Result<u16, ConvertError> {
    u16::try_from(v).map_err(|_| err(field, format!("{v} is not a port (0-65535)")))
}

fn duration_from(d: Option<&prost_types::Duration>, field: &str) -> Result<Option<Duration>, ConvertError> {
    let Some(d) = d else { return Ok(None) };
    let secs = u64::try_from(d.seconds).map_err(|_| err(field, format!("{}s is negative", d.seconds)))?;
    let nanos = u32::try_from(d.nanos)
        .ok()
        .filter(|n| *n < 1_000_000_000)
        .ok_or_else(|| err(format!("{field}.nanos"), format!("{} is not 0-999999999", d.nanos)))?;
    Ok(Some(Duration::new(secs, nanos)))
}

fn lower_name(name: &str, field: &str) -> Result<String, ConvertError> {
    if name.is_empty() {
        return Err(err(field, "required"));
    }
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(err(field, format!("{name:?} is not lower-case")));
    }
    Ok(name.to_string())
}

fn backend_from(b: &pb::Backend, field: &str) -> Result<Backend, ConvertError> {
    if b.service.is_empty() {
        return Err(err(format!("{field}.service"), "required"));
    }
    let subset = match &b.subset {
        None => None,
        Some(s) => {
            if s.name.is_empty() {
                return Err(err(format!("{field}.subset.name"), "required"));
            }
            Some(Subset {
                name: s.name.clone(),
                workloads: s.workloads.clone(),
                traffic: s.traffic.as_ref().map(|t| traffic_from(t, &format!("{field}.subset.traffic"))).transpose()?,
            })
        }
    };
    Ok(Backend { service: b.service.clone(), port: port16(b.port, &format!("{field}.port"))?, weight: b.weight, subset })
}

fn traffic_from(t: &pb::TrafficPolicy, field: &str) -> Result<TrafficPolicy, ConvertError> {
    use pb::load_balancer::Kind;
    let lb = match t.lb.as_ref().and_then(|l| l.kind.as_ref()) {
        None | Some(Kind::LeastRequest(_)) => LoadBalancer::LeastRequest,
        Some(Kind::RoundRobin(_)) => LoadBalancer::RoundRobin,
        Some(Kind::Random(_)) => LoadBalancer::Random,
        Some(Kind::HashHeader(h)) => LoadBalancer::Hash(HashOn::Header(lower_name(h, &format!("{field}.lb.hash_header"))?)),
        Some(Kind::HashCookie(c)) if !c.is_empty() => LoadBalancer::Hash(HashOn::Cookie(c.clone())),
        Some(Kind::HashCookie(_)) => return Err(err(format!("{field}.lb.hash_cookie"), "required")),
        Some(Kind::HashSourceIp(_)) => LoadBalancer::Hash(HashOn::SourceIp),
        Some(Kind::HashQuery(q)) if !q.is_empty() => LoadBalancer::Hash(HashOn::Query(q.clone())),
        Some(Kind::HashQuery(_)) => return Err(err(format!("{field}.lb.hash_query"), "required")),
    };
    let outlier = match &t.outlier {
        None => None,
        Some(o) => Some(OutlierDetection {
            consecutive_5xx: o.consecutive_5xx,
            consecutive_gateway: o.consecutive_gateway,
            base_ejection: duration_from(o.base_ejection.as_ref(), &format!("{field}.outlier.base_ejection"))?.unwrap_or_default(),
            max_ejection_percent: o.max_ejection_percent.min(100),
        }),
    };
    Ok(TrafficPolicy { lb, max_requests: t.max_requests, outlier })
}

fn per_million(v: u32, field: &str) -> Result<u32, ConvertError> {
    if v > slipstream_core::route::traffic::MILLION {
        return Err(err(field, format!("{v} is more than a million")));
    }
    Ok(v)
}

fn retry_from(r: &pb::Retry, field: &str) -> Result<Retry, ConvertError> {
    Ok(Retry {
        attempts: r.attempts,
        per_try_timeout: duration_from(r.per_try_timeout.as_ref(), &format!("{field}.per_try_timeout"))?,
        on: RetryOn {
            five_xx: r.five_xx,
            gateway_error: r.gateway_error,
            connect_failure: r.connect_failure,
            reset: r.reset,
            refused_stream: r.refused_stream,
            retriable_4xx: r.retriable_4xx,
            status_codes: r
                .status_codes
                .iter()
                .map(|c| {
                    u16::try_from(*c)
                        .ok()
                        .filter(|c| (100..600).contains(c))
                        .ok_or_else(|| err(format!("{field}.status_codes"), format!("{c} is not an HTTP status")))
                })
                .collect::<Result<_, _>>()?,
        },
    })
}

fn fault_from(f: &pb::Fault, field: &str) -> Result<Fault, ConvertError> {
    let delay = match &f.delay {
        None => None,
        Some(d) => Some(FaultDelay {
            per_million: per_million(d.per_million, &format!("{field}.delay.per_million"))?,
            delay: duration_from(d.delay.as_ref(), &format!("{field}.delay.delay"))?
                .ok_or_else(|| err(format!("{field}.delay.delay"), "required"))?,
        }),
    };
    let abort = match &f.abort {
        None => None,
        Some(a) => Some(FaultAbort {
            per_million: per_million(a.per_million, &format!("{field}.abort.per_million"))?,
            status: u16::try_from(a.status)
                .ok()
                .filter(|s| (200..600).contains(s))
                .ok_or_else(|| err(format!("{field}.abort.status"), format!("{} is not an HTTP status 200-599", a.status)))?,
        }),
    };
    Ok(Fault { delay, abort })
}

fn path_rewrite_from(p: &pb::PathRewrite, field: &str) -> Result<PathRewrite, ConvertError> {
    match &p.kind {
        Some(pb::path_rewrite::Kind::ReplaceFullPath(s)) => Ok(PathRewrite::ReplaceFullPath(s.clone())),
        Some(pb::path_rewrite::Kind::ReplacePrefixMatch(s)) => Ok(PathRewrite::ReplacePrefixMatch(s.clone())),
        None => Err(err(field, "has neither replace_full_path nor replace_prefix_match")),
    }
}

fn pairs_from(hs: &[pb::Header], field: &str) -> Result<Vec<(String, String)>, ConvertError> {
    hs.iter().enumerate().map(|(i, h)| Ok((lower_name(&h.name, &format!("{field}[{i}].name"))?, h.value.clone()))).collect()
}

fn modifier_from(m: Option<&pb::HeaderModifier>, field: &str) -> Result<HeaderModifier, ConvertError> {
    let Some(m) = m else { return Ok(HeaderModifier::default()) };
    Ok(HeaderModifier {
        set: pairs_from(&m.set, &format!("{field}.set"))?,
        add: pairs_from(&m.add, &format!("{field}.add"))?,
        remove: m.remove.iter().enumerate().map(|(i, n)| lower_name(n, &format!("{field}.remove[{i}]"))).collect::<Result<_, _>>()?,
    })
}

fn match_from(m: &pb::RouteMatch, field: &str) -> Result<RouteMatch, ConvertError> {
    let path = match m.path.as_ref().and_then(|p| p.kind.as_ref()) {
        Some(pb::path_match::Kind::Exact(p)) => PathMatch::Exact(p.clone()),
        Some(pb::path_match::Kind::Prefix(p)) => PathMatch::Prefix(p.clone()),
        Some(pb::path_match::Kind::StringPrefix(p)) => PathMatch::StringPrefix(p.clone()),
        None => return Err(err(format!("{field}.path"), "required (exact or prefix)")),
    };
    let header_list = |hs: &[pb::HeaderMatch], name: &str| {
        hs.iter()
            .enumerate()
            .map(|(i, h)| Ok(HeaderMatch { name: lower_name(&h.name, &format!("{field}.{name}[{i}].name"))?, value: h.value.clone() }))
            .collect::<Result<Vec<_>, ConvertError>>()
    };
    let query_list = |qs: &[pb::QueryMatch], name: &str| {
        qs.iter()
            .enumerate()
            .map(|(i, q)| {
                if q.name.is_empty() {
                    return Err(err(format!("{field}.{name}[{i}].name"), "required"));
                }
                Ok(QueryMatch { name: q.name.clone(), value: q.value.clone() })
            })
            .collect::<Result<Vec<_>, ConvertError>>()
    };
    Ok(RouteMatch {
        path,
        headers: header_list(&m.headers, "headers")?,
        query: query_list(&m.query, "query")?,
        method: m.method.clone(),
        header_prefixes: header_list(&m.header_prefixes, "header_prefixes")?,
        query_prefixes: query_list(&m.query_prefixes, "query_prefixes")?,
        ignore_case: m.ignore_case,
    })
}

fn filters_from(f: Option<&pb::Filters>, field: &str) -> Result<Filters, ConvertError> {
    let Some(f) = f else { return Ok(Filters::default()) };
    let redirect = match &f.redirect {
        None => None,
        Some(r) => {
            let status = match r.status {
                301 => 301,
                302 => 302,
                other => return Err(err(format!("{field}.redirect.status"), format!("{other} is not 301 or 302"))),
            };
            let port = match r.port {
                None => None,
                Some(0) => return Err(err(format!("{field}.redirect.port"), "0 is not a port")),
                Some(p) => Some(port16(p, &format!("{field}.redirect.port"))?),
            };
            Some(Redirect {
                scheme: r.scheme.clone(),
                hostname: r.hostname.clone(),
                path: r.path.as_ref().map(|p| path_rewrite_from(p, &format!("{field}.redirect.path"))).transpose()?,
                port,
                status,
            })
        }
    };
    let rewrite = f
        .rewrite
        .as_ref()
        .map(|r| {
            Ok::<_, ConvertError>(Rewrite {
                hostname: r.hostname.clone(),
                path: r.path.as_ref().map(|p| path_rewrite_from(p, &format!("{field}.rewrite.path"))).transpose()?,
            })
        })
        .transpose()?;
    Ok(Filters {
        request_headers: modifier_from(f.request_headers.as_ref(), &format!("{field}.request_headers"))?,
        response_headers: modifier_from(f.response_headers.as_ref(), &format!("{field}.response_headers"))?,
        redirect,
        rewrite,
        mirrors: f.mirrors.iter().enumerate().map(|(i, b)| backend_from(b, &format!("{field}.mirrors[{i}]"))).collect::<Result<_, _>>()?,
        mirror_per_million: f.mirror_per_million.map(|v| per_million(v, &format!("{field}.mirror_per_million"))).transpose()?,
    })
}

fn rule_from(r: &pb::RouteRule, field: &str) -> Result<RouteRule, ConvertError> {
    Ok(RouteRule {
        name: r.name.clone(),
        port: port16(r.port, &format!("{field}.port"))?,
        matches: r.matches.iter().enumerate().map(|(i, m)| match_from(m, &format!("{field}.matches[{i}]"))).collect::<Result<_, _>>()?,
        backends: r
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| backend_from(b, &format!("{field}.backends[{i}]")))
            .collect::<Result<_, _>>()?,
        filters: filters_from(r.filters.as_ref(), &format!("{field}.filters"))?,
        timeout: duration_from(r.timeout.as_ref(), &format!("{field}.timeout"))?,
        backend_timeout: duration_from(r.backend_timeout.as_ref(), &format!("{field}.backend_timeout"))?,
        retry: r.retry.as_ref().map(|x| retry_from(x, &format!("{field}.retry"))).transpose()?,
        fault: r.fault.as_ref().map(|x| fault_from(x, &format!("{field}.fault"))).transpose()?,
    })
}

impl TryFrom<pb::ServiceRoutes> for ServiceRoutes {
    type Error = ConvertError;
    fn try_from(s: pb::ServiceRoutes) -> Result<Self, ConvertError> {
        if s.service.is_empty() {
            return Err(err("service", "required"));
        }
        let rules = s.rules.iter().enumerate().map(|(i, r)| rule_from(r, &format!("rules[{i}]"))).collect::<Result<_, _>>()?;
        let policies =
            s.policies.iter().enumerate().map(|(i, p)| l7::policy_from(p, &format!("policies[{i}]"))).collect::<Result<_, _>>()?;
        let traffic = s.traffic.as_ref().map(|t| traffic_from(t, "traffic")).transpose()?.unwrap_or_default();
        let limits = s
            .limits
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let f = format!("limits[{i}]");
                let interval = duration_from(l.interval.as_ref(), &format!("{f}.interval"))?
                    .filter(|d| !d.is_zero())
                    .ok_or_else(|| err(format!("{f}.interval"), "required, more than 0"))?;
                if l.requests == 0 || l.burst == 0 {
                    return Err(err(&f, "requests and burst must be at least 1"));
                }
                let scope = if l.routes.is_empty() && l.rules.is_empty() {
                    LimitScope::Service
                } else {
                    LimitScope::Rules { routes: l.routes.clone(), rules: l.rules.clone() }
                };
                Ok(RateLimit { policy: l.policy.clone(), requests: l.requests, interval, burst: l.burst, scope })
            })
            .collect::<Result<_, ConvertError>>()?;
        let jwt_rules = s
            .jwt_rules
            .iter()
            .map(|j| JwtRule {
                policy: j.policy.clone(),
                issuer: j.issuer.clone(),
                audiences: j.audiences.clone(),
                jwks: j.jwks.clone(),
                from_headers: j
                    .from_headers
                    .iter()
                    .map(|h| JwtHeader { name: h.name.to_ascii_lowercase(), prefix: h.prefix.clone() })
                    .collect(),
                from_params: j.from_params.clone(),
                from_cookies: j.from_cookies.clone(),
                output_payload_to_header: Some(j.output_payload_to_header.to_ascii_lowercase()).filter(|h| !h.is_empty()),
                forward_original_token: j.forward_original_token,
                output_claim_to_headers: j
                    .output_claim_to_headers
                    .iter()
                    .map(|c| (c.header.to_ascii_lowercase(), c.claim.clone()))
                    .collect(),
                space_delimited_claims: j.space_delimited_claims.clone(),
            })
            .collect();
        Ok(ServiceRoutes { service: s.service, rules, policies, traffic, source: s.source, limits, jwt_rules })
    }
}

/// A `ServiceRoutes` resource, named by [`ServiceRoutes::service`].
pub fn routes_any(r: &ServiceRoutes) -> prost_types::Any {
    prost_types::Any { type_url: crate::ROUTE_TYPE_URL.to_string(), value: pb::ServiceRoutes::from(r).encode_to_vec() }
}

/// Unpacks a `ServiceRoutes` resource, checking its type URL.
pub fn routes_from_any(any: &prost_types::Any) -> Result<ServiceRoutes, ConvertError> {
    if any.type_url != crate::ROUTE_TYPE_URL {
        return Err(err("resource.type_url", format!("expected {}, got {}", crate::ROUTE_TYPE_URL, any.type_url)));
    }
    let r = pb::ServiceRoutes::decode(any.value.as_slice()).map_err(|e| err("resource.value", format!("not a ServiceRoutes: {e}")))?;
    r.try_into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ServiceRoutes {
        let b = |s: &str, port, weight| Backend { service: format!("bookinfo/{s}.bookinfo.svc.cluster.local"), port, weight, subset: None };
        let v3 = Backend {
            subset: Some(Subset {
                name: "v3".into(),
                workloads: vec!["c//Pod/bookinfo/reviews-v3-0".into()],
                traffic: Some(TrafficPolicy { lb: LoadBalancer::Hash(HashOn::Cookie("user".into())), ..Default::default() }),
            }),
            ..b("reviews", 9080, 5)
        };
        ServiceRoutes {
            service: "bookinfo/reviews.bookinfo.svc.cluster.local".into(),
            rules: vec![
                RouteRule {
                    name: "bookinfo/reviews.0".into(),
                    port: 9080,
                    matches: vec![RouteMatch {
                        path: PathMatch::Exact("/reviews/1".into()),
                        headers: vec![HeaderMatch { name: "end-user".into(), value: "jason".into() }],
                        query: vec![QueryMatch { name: "v".into(), value: "2".into() }],
                        method: Some("GET".into()),
                        header_prefixes: vec![HeaderMatch { name: "x-p".into(), value: "ab".into() }],
                        query_prefixes: vec![QueryMatch { name: "q".into(), value: "1".into() }],
                        ignore_case: true,
                    }],
                    backends: vec![b("reviews-v1", 9080, 90), b("reviews-v2", 0, 10), v3],
                    filters: Filters {
                        request_headers: HeaderModifier {
                            set: vec![("x-a".into(), "1".into())],
                            add: vec![("x-b".into(), "2".into())],
                            remove: vec!["x-c".into()],
                        },
                        response_headers: HeaderModifier { remove: vec!["server".into()], ..Default::default() },
                        redirect: None,
                        rewrite: Some(Rewrite {
                            hostname: Some("reviews.internal".into()),
                            path: Some(PathRewrite::ReplacePrefixMatch("/v2".into())),
                        }),
                        mirrors: vec![b("shadow", 9080, 0)],
                        mirror_per_million: Some(250_000),
                    },
                    timeout: Some(Duration::from_millis(10_500)),
                    backend_timeout: Some(Duration::from_nanos(1)),
                    retry: Some(Retry {
                        attempts: 3,
                        per_try_timeout: Some(Duration::from_secs(2)),
                        on: RetryOn { five_xx: true, reset: true, status_codes: vec![429], ..Default::default() },
                    }),
                    fault: Some(Fault {
                        delay: Some(FaultDelay { per_million: 100_000, delay: Duration::from_secs(5) }),
                        abort: Some(FaultAbort { per_million: 1, status: 500 }),
                    }),
                },
                RouteRule {
                    name: "bookinfo/old.1".into(),
                    port: 0,
                    matches: vec![RouteMatch { path: PathMatch::StringPrefix("/old".into()), ..Default::default() }],
                    backends: vec![],
                    filters: Filters {
                        redirect: Some(Redirect {
                            scheme: Some("https".into()),
                            hostname: Some("example.com".into()),
                            path: Some(PathRewrite::ReplaceFullPath("/new".into())),
                            port: Some(8443),
                            status: 301,
                        }),
                        ..Default::default()
                    },
                    timeout: None,
                    backend_timeout: None,
                    retry: None,
                    fault: None,
                },
                RouteRule { name: "bookinfo/any.0".into(), ..Default::default() },
            ],
            policies: vec![{
                use slipstream_core::policy::l7::*;
                use slipstream_core::policy::{Action, Cidr, StringMatch};
                let ex = |s: &str| StringMatch::Exact(s.into());
                L7Policy {
                    namespace: "bookinfo".into(),
                    name: "reviews-get".into(),
                    action: Action::Deny,
                    dry_run: true,
                    workloads: Some(vec!["c//Pod/bookinfo/a".into(), "c//Pod/bookinfo/b".into()]),
                    pods: Some(vec!["c//Pod/bookinfo/c".into()]),
                    rules: vec![L7Rule {
                        from: vec![L7Source {
                            principals: vec![ex("cluster.local/ns/bookinfo/sa/productpage")],
                            not_principals: vec![StringMatch::Presence],
                            namespaces: vec![StringMatch::Prefix("book".into())],
                            not_namespaces: vec![StringMatch::Suffix("x".into())],
                            ip_blocks: vec![Cidr { address: "10.0.0.0".parse().unwrap(), length: 8 }],
                            not_ip_blocks: vec![Cidr { address: "fd00::".parse().unwrap(), length: 64 }],
                            remote_ip_blocks: vec![Cidr { address: "192.0.2.0".parse().unwrap(), length: 24 }],
                            not_remote_ip_blocks: vec![Cidr { address: "192.0.2.7".parse().unwrap(), length: 32 }],
                            request_principals: vec![ex("https://issuer.example/alice")],
                            not_request_principals: vec![StringMatch::Presence],
                        }],
                        to: vec![L7Operation {
                            hosts: vec![ex("reviews")],
                            not_hosts: vec![ex("x")],
                            methods: vec![ex("GET")],
                            not_methods: vec![ex("POST")],
                            paths: vec![StringMatch::Prefix("/r".into())],
                            not_paths: vec![ex("/admin")],
                            ports: vec![9080],
                            not_ports: vec![1],
                        }],
                        when: vec![
                            L7Condition { key: ConditionKey::RequestHeader("x-user".into()), values: vec![ex("a")], not_values: vec![] },
                            L7Condition { key: ConditionKey::SourceIp, values: vec![ex("10.0.0.0/8")], not_values: vec![] },
                            L7Condition { key: ConditionKey::RemoteIp, values: vec![ex("192.0.2.0/24")], not_values: vec![] },
                            L7Condition { key: ConditionKey::DestinationPort, values: vec![], not_values: vec![ex("1")] },
                            L7Condition { key: ConditionKey::RequestPrincipal, values: vec![ex("a/b")], not_values: vec![] },
                            L7Condition { key: ConditionKey::RequestAudiences, values: vec![ex("web")], not_values: vec![] },
                            L7Condition { key: ConditionKey::RequestPresenter, values: vec![], not_values: vec![ex("cli")] },
                            L7Condition {
                                key: ConditionKey::RequestClaim(vec!["org".into(), "unit".into()]),
                                values: vec![ex("payments")],
                                not_values: vec![],
                            },
                        ],
                    }],
                }
            }],
            traffic: TrafficPolicy {
                lb: LoadBalancer::RoundRobin,
                max_requests: Some(3),
                outlier: Some(OutlierDetection {
                    consecutive_5xx: Some(2),
                    consecutive_gateway: None,
                    base_ejection: Duration::from_secs(30),
                    max_ejection_percent: 50,
                }),
            },
            source: "VirtualService".into(),
            limits: vec![
                RateLimit {
                    policy: "bookinfo/all".into(),
                    requests: 10,
                    interval: Duration::from_secs(1),
                    burst: 20,
                    scope: LimitScope::Service,
                },
                RateLimit {
                    policy: "bookinfo/some".into(),
                    requests: 1,
                    interval: Duration::from_secs(3600),
                    burst: 1,
                    scope: LimitScope::Rules { routes: vec!["bookinfo/reviews.".into()], rules: vec!["bookinfo/vs.jason".into()] },
                },
            ],
            jwt_rules: vec![slipstream_core::route::JwtRule {
                policy: "bookinfo/jwt".into(),
                issuer: "https://issuer.example".into(),
                audiences: vec!["reviews".into()],
                jwks: r#"{"keys":[]}"#.into(),
                from_headers: vec![slipstream_core::route::JwtHeader { name: "x-token".into(), prefix: "Bearer ".into() }],
                from_params: vec!["t".into()],
                from_cookies: vec!["session".into()],
                output_payload_to_header: Some("x-payload".into()),
                forward_original_token: true,
                output_claim_to_headers: vec![("x-user".into(), "sub".into())],
                space_delimited_claims: vec!["roles".into()],
            }],
        }
    }

    #[test]
    fn route_round_trip() {
        let s = sample();
        assert_eq!(routes_from_any(&routes_any(&s)).unwrap(), s);
        assert_eq!(ServiceRoutes::try_from(pb::ServiceRoutes::from(&s)).unwrap(), s);
    }

    #[test]
    fn route_refusals_name_the_field() {
        type Edit = Box<dyn Fn(&mut pb::ServiceRoutes)>;
        let cases: Vec<(Edit, &str)> = vec![
            (Box::new(|m| m.service.clear()), "service"),
            (Box::new(|m| m.policies[0].rules[0].from[0].principals[0].kind = None), "policies[0].rules[0].from[0].principals[0]"),
            (Box::new(|m| m.policies[0].rules[0].from[0].ip_blocks[0].length = 33), "policies[0].rules[0].from[0].ip_blocks[0].length"),
            (Box::new(|m| m.policies[0].rules[0].to[0].ports[0] = 70_000), "policies[0].rules[0].to[0].ports[0]"),
            (Box::new(|m| m.policies[0].rules[0].when[0].key = None), "policies[0].rules[0].when[0].key"),
            (Box::new(|m| m.rules[1].port = 70_000), "rules[1].port"),
            (Box::new(|m| m.rules[0].matches[0].path = None), "rules[0].matches[0].path"),
            (Box::new(|m| m.rules[0].matches[0].path = Some(pb::PathMatch { kind: None })), "rules[0].matches[0].path"),
            (Box::new(|m| m.rules[0].matches[0].headers[0].name = "End-User".into()), "rules[0].matches[0].headers[0].name"),
            (Box::new(|m| m.rules[0].matches[0].query[0].name.clear()), "rules[0].matches[0].query[0].name"),
            (Box::new(|m| m.rules[0].backends[1].service.clear()), "rules[0].backends[1].service"),
            (Box::new(|m| m.rules[0].backends[0].port = 65_536), "rules[0].backends[0].port"),
            (
                Box::new(|m| m.rules[0].filters.as_mut().unwrap().request_headers.as_mut().unwrap().add[0].name = "X-B".into()),
                "rules[0].filters.request_headers.add[0].name",
            ),
            (
                Box::new(|m| m.rules[0].filters.as_mut().unwrap().response_headers.as_mut().unwrap().remove[0].clear()),
                "rules[0].filters.response_headers.remove[0]",
            ),
            (Box::new(|m| m.rules[0].filters.as_mut().unwrap().mirrors[0].service.clear()), "rules[0].filters.mirrors[0].service"),
            (
                Box::new(|m| m.rules[0].filters.as_mut().unwrap().rewrite.as_mut().unwrap().path = Some(pb::PathRewrite { kind: None })),
                "rules[0].filters.rewrite.path",
            ),
            (
                Box::new(|m| m.rules[1].filters.as_mut().unwrap().redirect.as_mut().unwrap().status = 307),
                "rules[1].filters.redirect.status",
            ),
            (
                Box::new(|m| m.rules[1].filters.as_mut().unwrap().redirect.as_mut().unwrap().port = Some(0)),
                "rules[1].filters.redirect.port",
            ),
            (
                Box::new(|m| m.rules[1].filters.as_mut().unwrap().redirect.as_mut().unwrap().port = Some(65_536)),
                "rules[1].filters.redirect.port",
            ),
            (Box::new(|m| m.rules[0].timeout.as_mut().unwrap().seconds = -1), "rules[0].timeout"),
            (Box::new(|m| m.rules[0].backend_timeout.as_mut().unwrap().nanos = 1_000_000_000), "rules[0].backend_timeout.nanos"),
        ];
        for (edit, field) in cases {
            let mut m = pb::ServiceRoutes::from(&sample());
            edit(&mut m);
            let e = ServiceRoutes::try_from(m).unwrap_err();
            assert_eq!(e.field, field, "{e}");
        }
        let wrong = prost_types::Any { type_url: crate::NETWORK_POLICY_TYPE_URL.into(), value: vec![] };
        assert_eq!(routes_from_any(&wrong).unwrap_err().field, "resource.type_url");
    }
}
