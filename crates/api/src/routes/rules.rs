//! Route rules (matches, filters, backends, timeouts), both ways.

use super::traffic::{fault, fault_from, retry, retry_from, traffic_from, traffic_policy};
use super::{duration, duration_from, err, lower_name, per_million, port16, ConvertError};
use crate::route as pb;
use slipstream_core::route::{
    Backend, Filters, HeaderMatch, HeaderModifier, PathMatch, PathRewrite, QueryMatch, Redirect, Rewrite, RouteMatch, RouteRule, Subset,
};

// ---- to the wire ----

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

// ---- from the wire ----

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

pub(super) fn rule_from(r: &pb::RouteRule, field: &str) -> Result<RouteRule, ConvertError> {
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
