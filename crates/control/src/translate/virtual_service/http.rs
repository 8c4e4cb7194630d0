//! VirtualService `http` routes: matches, destinations, redirects and
//! rewrites, headers, retries, mirrors.

use super::fault::{fault, FaultSpec, PercentSpec};
use super::{creation, duration, int_in, per_million, reader, spec, Reader};
use super::{Destination, VirtualServiceInput, VsRule};
use crate::objects::{Kind, ObjectError, OpaqueObject};
use serde::Deserialize;
use slipstream_core::route::traffic::{Retry, RetryOn};
use slipstream_core::route::{Filters, HeaderMatch, HeaderModifier, PathMatch, PathRewrite, QueryMatch, Redirect, Rewrite, RouteMatch};
use std::collections::BTreeMap;

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct VsSpec {
    #[serde(default)]
    hosts: Vec<String>,
    #[serde(default)]
    gateways: Vec<String>,
    #[serde(default)]
    http: Vec<HttpSpec>,
    #[serde(default)]
    tcp: Vec<serde_json::Value>,
    #[serde(default)]
    tls: Vec<serde_json::Value>,
    #[serde(default)]
    export_to: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct HttpSpec {
    name: Option<String>,
    #[serde(rename = "match", default)]
    matches: Vec<MatchSpec>,
    #[serde(default)]
    route: Vec<RouteDestSpec>,
    redirect: Option<RedirectSpec>,
    rewrite: Option<RewriteSpec>,
    timeout: Option<String>,
    retries: Option<RetriesSpec>,
    fault: Option<FaultSpec>,
    mirror: Option<DestSpec>,
    mirror_percentage: Option<PercentSpec>,
    mirror_percent: Option<u32>,
    #[serde(default)]
    mirrors: Vec<serde_json::Value>,
    headers: Option<HeadersSpec>,
    direct_response: Option<serde_json::Value>,
    delegate: Option<serde_json::Value>,
    cors_policy: Option<serde_json::Value>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct MatchSpec {
    name: Option<String>,
    uri: Option<StringMatchSpec>,
    scheme: Option<StringMatchSpec>,
    method: Option<StringMatchSpec>,
    authority: Option<StringMatchSpec>,
    #[serde(default)]
    headers: BTreeMap<String, StringMatchSpec>,
    port: Option<i64>,
    #[serde(default)]
    source_labels: BTreeMap<String, String>,
    #[serde(default)]
    gateways: Vec<String>,
    #[serde(default)]
    query_params: BTreeMap<String, StringMatchSpec>,
    #[serde(default)]
    ignore_uri_case: bool,
    #[serde(default)]
    without_headers: BTreeMap<String, serde_json::Value>,
    source_namespace: Option<String>,
    stat_prefix: Option<String>,
}

#[derive(Deserialize, Default)]
struct StringMatchSpec {
    exact: Option<String>,
    prefix: Option<String>,
    regex: Option<String>,
}

#[derive(Deserialize)]
struct RouteDestSpec {
    destination: DestSpec,
    weight: Option<i64>,
    headers: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct DestSpec {
    host: String,
    subset: Option<String>,
    port: Option<PortSelectorSpec>,
}

#[derive(Deserialize)]
struct PortSelectorSpec {
    number: Option<i64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RedirectSpec {
    uri: Option<String>,
    authority: Option<String>,
    port: Option<i64>,
    derive_port: Option<String>,
    scheme: Option<String>,
    redirect_code: Option<i64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RewriteSpec {
    uri: Option<String>,
    authority: Option<String>,
    uri_regex_rewrite: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RetriesSpec {
    attempts: Option<i64>,
    per_try_timeout: Option<String>,
    retry_on: Option<String>,
    retry_remote_localities: Option<bool>,
    retry_ignore_previous_hosts: Option<bool>,
    backoff: Option<String>,
}

#[derive(Deserialize, Default)]
struct HeadersSpec {
    request: Option<HeaderOpsSpec>,
    response: Option<HeaderOpsSpec>,
}

#[derive(Deserialize, Default)]
struct HeaderOpsSpec {
    #[serde(default)]
    set: BTreeMap<String, String>,
    #[serde(default)]
    add: BTreeMap<String, String>,
    #[serde(default)]
    remove: Vec<String>,
}

/// Reads a VirtualService. Every error names the field, from `spec.` on.
/// Hosts are resolved in the cluster domain `domain_suffix`.
pub fn virtual_service(o: &OpaqueObject, domain_suffix: &str) -> Result<VirtualServiceInput, ObjectError> {
    let rd = reader(o, Kind::VirtualService, domain_suffix)?;
    let spec: VsSpec = spec(&rd, o)?;
    if spec.hosts.is_empty() {
        return Err(rd.err("spec.hosts", "required: the services this VirtualService routes"));
    }
    for (field, set) in [("tcp", !spec.tcp.is_empty()), ("tls", !spec.tls.is_empty())] {
        if set {
            return Err(rd.unsupported(format!("spec.{field}"), "the waypoint routes HTTP; TCP and TLS pass through to the service"));
        }
    }
    let _ = spec.export_to;
    let hosts =
        spec.hosts.iter().enumerate().map(|(i, h)| rd.service_key(h, &format!("spec.hosts[{i}]"))).collect::<Result<Vec<_>, _>>()?;
    // Istio: without `gateways` a VirtualService is for the mesh; with
    // them, only if one of them is `mesh`.
    let for_mesh = spec.gateways.is_empty() || spec.gateways.iter().any(|g| g == "mesh");
    let mut rules = Vec::new();
    if for_mesh {
        for (i, h) in spec.http.into_iter().enumerate() {
            if let Some(r) = http_rule(&rd, h, i)? {
                rules.push(r);
            }
        }
    } else {
        // Still validated, so a mistake is seen at apply.
        for (i, h) in spec.http.into_iter().enumerate() {
            http_rule(&rd, h, i)?;
        }
    }
    Ok(VirtualServiceInput { namespace: rd.r.namespace.clone(), name: rd.r.name.clone(), creation: creation(o), hosts, rules })
}

fn string_match(rd: &Reader, m: &StringMatchSpec, f: &str) -> Result<(String, bool), ObjectError> {
    if m.regex.is_some() {
        return Err(rd.unsupported(format!("{f}.regex"), "regular expressions; use exact or prefix"));
    }
    match (&m.exact, &m.prefix) {
        (Some(e), None) => Ok((e.clone(), false)),
        (None, Some(p)) => Ok((p.clone(), true)),
        _ => Err(rd.err(f, "exactly one of exact or prefix is required")),
    }
}

/// Returns None for a route that does not apply to the mesh (every match
/// names gateways other than `mesh`).
fn http_rule(rd: &Reader, h: HttpSpec, i: usize) -> Result<Option<VsRule>, ObjectError> {
    let f = format!("spec.http[{i}]");
    for (field, set) in [
        ("directResponse", h.direct_response.is_some()),
        ("delegate", h.delegate.is_some()),
        ("corsPolicy", h.cors_policy.is_some()),
        ("mirrors", !h.mirrors.is_empty()),
    ] {
        if set {
            let why = if field == "mirrors" { "use mirror and mirrorPercentage" } else { "the waypoint does not implement it yet" };
            return Err(rd.unsupported(format!("{f}.{field}"), why));
        }
    }
    let name = format!("{}/{}.{}", rd.r.namespace, rd.r.name, h.name.clone().unwrap_or_else(|| i.to_string()));
    let mut matches = Vec::new();
    let mut for_mesh = h.matches.is_empty();
    for (j, m) in h.matches.into_iter().enumerate() {
        if let Some(found) = route_match(rd, m, &format!("{f}.match[{j}]"))? {
            for_mesh = true;
            matches.push(found);
        }
    }
    if !for_mesh {
        return Ok(None);
    }
    let mut filters = Filters::default();
    if let Some(hs) = h.headers {
        filters.request_headers = header_ops(rd, hs.request, &format!("{f}.headers.request"))?;
        filters.response_headers = header_ops(rd, hs.response, &format!("{f}.headers.response"))?;
    }
    let destinations = destinations(rd, h.route, &f)?;
    if let Some(r) = h.redirect {
        if !destinations.is_empty() {
            return Err(rd.err(format!("{f}.redirect"), "a route takes route or redirect, not both"));
        }
        filters.redirect = Some(redirect(rd, r, &f)?);
    } else if destinations.is_empty() {
        return Err(rd.err(format!("{f}.route"), "required: a route needs destinations or a redirect"));
    }
    if let Some(rw) = h.rewrite {
        if rw.uri_regex_rewrite.is_some() {
            return Err(rd.unsupported(format!("{f}.rewrite.uriRegexRewrite"), "regular expressions; use uri"));
        }
        // The matched prefix is replaced; under an exact match, or none,
        // Envoy's prefix_rewrite replaces what matched: the whole path, or
        // the leading `/` (the default match is the prefix `/`).
        filters.rewrite = Some(Rewrite { hostname: rw.authority, path: rw.uri.map(PathRewrite::ReplacePrefixMatch) });
    }
    let timeout = h.timeout.as_deref().map(|t| duration(|m| rd.err(format!("{f}.timeout"), m), t)).transpose()?.flatten();
    let retry = match h.retries {
        // Istio's default retry policy for a route that says nothing.
        None => Some(Retry::istio_default()),
        Some(r) => retries(rd, r, &format!("{f}.retries"))?,
    };
    let fault = h.fault.map(|fs| fault(rd, fs, &format!("{f}.fault"))).transpose()?;
    let mut mirrors = Vec::new();
    if let Some(m) = h.mirror {
        mirrors.push(destination(rd, m, 0, &format!("{f}.mirror"))?);
        filters.mirror_per_million = match (h.mirror_percentage.and_then(|p| p.value), h.mirror_percent) {
            (Some(v), _) => Some(per_million(rd, v, &format!("{f}.mirrorPercentage.value"))?),
            (None, Some(p)) => Some(per_million(rd, f64::from(p), &format!("{f}.mirrorPercent"))?),
            (None, None) => None,
        };
    }
    Ok(Some(VsRule { name, matches, destinations, mirrors, filters, timeout, retry, fault }))
}

/// One `match` of a route, with its port; None when it names gateways
/// other than `mesh` (checked whether or not it is for the mesh).
fn route_match(rd: &Reader, m: MatchSpec, g: &str) -> Result<Option<(RouteMatch, Option<u16>)>, ObjectError> {
    for (field, set) in [
        ("scheme", m.scheme.is_some()),
        ("authority", m.authority.is_some()),
        ("sourceLabels", !m.source_labels.is_empty()),
        ("withoutHeaders", !m.without_headers.is_empty()),
        ("sourceNamespace", m.source_namespace.is_some()),
    ] {
        if set {
            return Err(rd.unsupported(format!("{g}.{field}"), "the waypoint matches on uri, method, headers, queryParams and port"));
        }
    }
    let _ = (m.name, m.stat_prefix);
    if !m.gateways.is_empty() && !m.gateways.iter().any(|g| g == "mesh") {
        return Ok(None);
    }
    let mut rm = RouteMatch { path: PathMatch::StringPrefix("/".into()), ignore_case: m.ignore_uri_case, ..Default::default() };
    if let Some(u) = &m.uri {
        let (v, prefix) = string_match(rd, u, &format!("{g}.uri"))?;
        if !v.starts_with('/') {
            return Err(rd.err(format!("{g}.uri"), format!("{v:?} must start with /")));
        }
        rm.path = if prefix { PathMatch::StringPrefix(v) } else { PathMatch::Exact(v) };
    }
    if let Some(me) = &m.method {
        let (v, prefix) = string_match(rd, me, &format!("{g}.method"))?;
        if prefix {
            return Err(rd.unsupported(format!("{g}.method.prefix"), "a method is matched exactly"));
        }
        rm.method = Some(v);
    }
    for (k, v) in &m.headers {
        let (value, prefix) = string_match(rd, v, &format!("{g}.headers.{k}"))?;
        let hm = HeaderMatch { name: k.to_ascii_lowercase(), value };
        if prefix {
            rm.header_prefixes.push(hm);
        } else {
            rm.headers.push(hm);
        }
    }
    for (k, v) in &m.query_params {
        let (value, prefix) = string_match(rd, v, &format!("{g}.queryParams.{k}"))?;
        let qm = QueryMatch { name: k.clone(), value };
        if prefix {
            rm.query_prefixes.push(qm);
        } else {
            rm.query.push(qm);
        }
    }
    let port = m.port.map(|p| int_in(rd, p, 1, 65535, &format!("{g}.port")).map(|p| p as u16)).transpose()?;
    Ok(Some((rm, port)))
}

/// A route's destinations, weighted.
fn destinations(rd: &Reader, route: Vec<RouteDestSpec>, f: &str) -> Result<Vec<Destination>, ObjectError> {
    let mut destinations = Vec::new();
    for (j, d) in route.into_iter().enumerate() {
        let g = format!("{f}.route[{j}]");
        if d.headers.is_some() {
            return Err(rd.unsupported(format!("{g}.headers"), "set headers for the whole route in spec.http[].headers"));
        }
        let weight = match d.weight {
            None => None,
            Some(w) => Some(int_in(rd, w, 0, i64::from(u32::MAX), &format!("{g}.weight"))?),
        };
        destinations.push((destination(rd, d.destination, 0, &format!("{g}.destination"))?, weight));
    }
    // Istio: one destination takes everything, whatever its weight; with
    // several, an absent weight is 0 and the weights are relative (they
    // are meant to add up to 100, and are normalized when they do not).
    Ok(match destinations.len() {
        0 => Vec::new(),
        1 => destinations.into_iter().map(|(d, _)| Destination { weight: 100, ..d }).collect(),
        _ => {
            if destinations.iter().all(|(_, w)| w.unwrap_or(0) == 0) {
                return Err(rd.err(format!("{f}.route"), "every weight is 0: no destination would get a request"));
            }
            destinations.into_iter().map(|(d, w)| Destination { weight: w.unwrap_or(0), ..d }).collect()
        }
    })
}

/// A route's `redirect`.
fn redirect(rd: &Reader, r: RedirectSpec, f: &str) -> Result<Redirect, ObjectError> {
    if r.derive_port.is_some() {
        return Err(rd.unsupported(format!("{f}.redirect.derivePort"), "give port, or none to keep the request's"));
    }
    let status = match r.redirect_code.unwrap_or(301) {
        c @ (301 | 302 | 303 | 307 | 308) => c as u16,
        c => return Err(rd.err(format!("{f}.redirect.redirectCode"), format!("{c} is not 301, 302, 303, 307 or 308"))),
    };
    Ok(Redirect {
        scheme: r.scheme,
        hostname: r.authority,
        path: r.uri.map(PathRewrite::ReplaceFullPath),
        port: r.port.map(|p| int_in(rd, p, 1, 65535, &format!("{f}.redirect.port")).map(|p| p as u16)).transpose()?,
        status,
    })
}

fn destination(rd: &Reader, d: DestSpec, weight: u32, f: &str) -> Result<Destination, ObjectError> {
    let service = rd.service_key(&d.host, &format!("{f}.host"))?;
    let port = match d.port.and_then(|p| p.number) {
        None => None,
        Some(p) => Some(int_in(rd, p, 1, 65535, &format!("{f}.port.number"))? as u16),
    };
    if d.subset.as_deref() == Some("") {
        return Err(rd.err(format!("{f}.subset"), "empty"));
    }
    Ok(Destination { service, subset: d.subset, port, weight })
}

fn header_ops(rd: &Reader, h: Option<HeaderOpsSpec>, f: &str) -> Result<HeaderModifier, ObjectError> {
    let Some(h) = h else { return Ok(HeaderModifier::default()) };
    let name = |n: &str, field: String| {
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)) {
            return Err(rd.err(field, format!("{n:?} is not a header name")));
        }
        Ok(n.to_ascii_lowercase())
    };
    Ok(HeaderModifier {
        set: h.set.iter().map(|(k, v)| Ok((name(k, format!("{f}.set.{k}"))?, v.clone()))).collect::<Result<_, ObjectError>>()?,
        add: h.add.iter().map(|(k, v)| Ok((name(k, format!("{f}.add.{k}"))?, v.clone()))).collect::<Result<_, ObjectError>>()?,
        remove: h.remove.iter().enumerate().map(|(i, k)| name(k, format!("{f}.remove[{i}]"))).collect::<Result<_, _>>()?,
    })
}

/// `retries`: `attempts: 0` turns retries off (None).
fn retries(rd: &Reader, r: RetriesSpec, f: &str) -> Result<Option<Retry>, ObjectError> {
    if r.backoff.is_some() {
        return Err(rd.unsupported(format!("{f}.backoff"), "retries are immediate, to another endpoint when there is one"));
    }
    let _ = (r.retry_remote_localities, r.retry_ignore_previous_hosts);
    let attempts = int_in(rd, r.attempts.unwrap_or(0), 0, 100, &format!("{f}.attempts"))?;
    if attempts == 0 {
        return Ok(None);
    }
    let per_try_timeout =
        r.per_try_timeout.as_deref().map(|t| duration(|m| rd.err(format!("{f}.perTryTimeout"), m), t)).transpose()?.flatten();
    let on = match r.retry_on.as_deref() {
        // Istio's default conditions when only attempts are given.
        None | Some("") => Retry::istio_default().on,
        Some(list) => retry_on(rd, list, &format!("{f}.retryOn"))?,
    };
    Ok(Some(Retry { attempts, per_try_timeout, on }))
}

/// Envoy's `x-envoy-retry-on` names, and bare status codes. gRPC
/// conditions (`cancelled`, `unavailable`, ...) are accepted and apply to
/// gRPC answers only, which the waypoint does not retry yet: they are
/// without effect on HTTP, as in Envoy.
fn retry_on(rd: &Reader, list: &str, f: &str) -> Result<RetryOn, ObjectError> {
    let mut on = RetryOn::default();
    for c in list.split(',').map(str::trim).filter(|c| !c.is_empty()) {
        match c {
            "5xx" => on.five_xx = true,
            "gateway-error" => on.gateway_error = true,
            "connect-failure" => on.connect_failure = true,
            "reset" | "reset-before-request" => on.reset = true,
            "refused-stream" => on.refused_stream = true,
            "retriable-4xx" => on.retriable_4xx = true,
            // The codes themselves come as bare numbers in the same list.
            "retriable-status-codes" => {}
            "cancelled" | "deadline-exceeded" | "internal" | "resource-exhausted" | "unavailable" => {}
            code if code.bytes().all(|b| b.is_ascii_digit()) => match code.parse::<u16>() {
                Ok(n) if (100..600).contains(&n) => on.status_codes.push(n),
                _ => return Err(rd.err(f, format!("{code:?} is not an HTTP status"))),
            },
            other => {
                return Err(rd.err(
                    f,
                    format!(
                        "{other:?} is not a retry condition we support (5xx, gateway-error, connect-failure, reset, \
                         refused-stream, retriable-4xx, retriable-status-codes with codes, or gRPC's)"
                    ),
                ))
            }
        }
    }
    Ok(on)
}
