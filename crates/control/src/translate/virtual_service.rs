//! Istio `VirtualService` and `DestinationRule`, as the waypoint takes
//! them (docs/waypoint.md, "VirtualService and DestinationRule"):
//! [`virtual_service`] and [`destination_rule`] read one object each into
//! an input (Istio's defaults applied, hosts resolved to service keys,
//! every field we cannot honour refused by name), and [`compile`] turns
//! the VirtualService that applies to a service into its rules, in the
//! order written (Istio takes the first `http` route that matches, not
//! the most specific), with subsets resolved to workloads by the caller.
//! Pure, for table tests.

use crate::objects::{Kind, ObjectError, ObjectRef, OpaqueObject};
use crate::translate::Labels;
use serde::Deserialize;
use slipstream_core::route::traffic::{
    Fault, FaultAbort, FaultDelay, HashOn, LoadBalancer, OutlierDetection, Retry, RetryOn, TrafficPolicy, MILLION,
};
use slipstream_core::route::{
    Backend, Filters, HeaderMatch, HeaderModifier, PathMatch, PathRewrite, QueryMatch, Redirect, Rewrite, RouteMatch, RouteRule, Subset,
};
use std::collections::BTreeMap;
use std::time::Duration;

/// One VirtualService as the index keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtualServiceInput {
    pub namespace: String,
    pub name: String,
    /// `metadata.creationTimestamp` (RFC 3339): the oldest of two
    /// VirtualServices for one host wins, as Istio does for the mesh.
    pub creation: Option<String>,
    /// The service keys (`namespace/name.namespace.svc.cluster.local`) of
    /// `hosts`, resolved against the VirtualService's namespace.
    pub hosts: Vec<String>,
    /// `http`, in order.
    pub rules: Vec<VsRule>,
}

/// One `http` route of a VirtualService.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VsRule {
    /// `namespace/vs.<index>` or `namespace/vs.<route name>`.
    pub name: String,
    /// Each with its port (None: every port); empty: every request.
    pub matches: Vec<(RouteMatch, Option<u16>)>,
    pub destinations: Vec<Destination>,
    pub mirrors: Vec<Destination>,
    /// `mirrors` included: everything but the resolved mirror backends.
    pub filters: Filters,
    pub timeout: Option<Duration>,
    pub retry: Option<Retry>,
    pub fault: Option<Fault>,
}

/// A `destination` (or `mirror`): a service, maybe a subset of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    pub service: String,
    pub subset: Option<String>,
    pub port: Option<u16>,
    pub weight: u32,
}

/// One DestinationRule as the index keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestinationRuleInput {
    pub namespace: String,
    pub name: String,
    pub creation: Option<String>,
    /// The service key of `host`; a wildcard host (`*.ns.svc.cluster.local`)
    /// is kept as written, FQDN, in `wildcard`.
    pub host: String,
    pub wildcard: Option<String>,
    pub traffic: Option<TrafficInput>,
    pub subsets: Vec<SubsetInput>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubsetInput {
    pub name: String,
    pub labels: Labels,
    pub traffic: Option<TrafficInput>,
}

/// A `trafficPolicy` as written: a subset's replaces its rule's field by
/// field ([`TrafficInput::merged`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TrafficInput {
    pub lb: Option<LoadBalancer>,
    /// `connectionPool` given: its bound on requests in flight (None: none).
    pub pool: Option<Option<u32>>,
    pub outlier: Option<OutlierDetection>,
}

impl TrafficInput {
    /// `over`'s fields where it sets them, else `base`'s, else Istio's
    /// defaults.
    pub fn merged(base: Option<&TrafficInput>, over: Option<&TrafficInput>) -> TrafficPolicy {
        let pick = |f: &dyn Fn(&TrafficInput) -> bool| over.filter(|o| f(o)).or(base.filter(|b| f(b)));
        TrafficPolicy {
            lb: pick(&|t| t.lb.is_some()).and_then(|t| t.lb.clone()).unwrap_or_default(),
            max_requests: pick(&|t| t.pool.is_some()).and_then(|t| t.pool).flatten(),
            outlier: pick(&|t| t.outlier.is_some()).and_then(|t| t.outlier.clone()),
        }
    }
}

impl DestinationRuleInput {
    /// Whether it applies to the service of key `service`
    /// (`ns/name.ns.svc.cluster.local`), and how specifically (2: by
    /// name; 1: by a wildcard).
    pub fn applies(&self, service: &str) -> u8 {
        if self.host == service {
            return 2;
        }
        let fqdn = service.split_once('/').map_or(service, |(_, h)| h);
        match &self.wildcard {
            Some(w) if w == "*" => 1,
            Some(w) => u8::from(w.strip_prefix('*').is_some_and(|suffix| fqdn.ends_with(suffix))),
            None => 0,
        }
    }
}

// ---- the objects, as written ----

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

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FaultSpec {
    delay: Option<DelaySpec>,
    abort: Option<AbortSpec>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DelaySpec {
    fixed_delay: Option<String>,
    exponential_delay: Option<String>,
    percentage: Option<PercentSpec>,
    percent: Option<i64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AbortSpec {
    http_status: Option<i64>,
    grpc_status: Option<String>,
    http2_error: Option<String>,
    percentage: Option<PercentSpec>,
}

#[derive(Deserialize)]
struct PercentSpec {
    value: Option<f64>,
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

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct DrSpec {
    #[serde(default)]
    host: String,
    traffic_policy: Option<TrafficSpec>,
    #[serde(default)]
    subsets: Vec<SubsetSpec>,
    #[serde(default)]
    export_to: Vec<String>,
    workload_selector: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SubsetSpec {
    name: String,
    #[serde(default)]
    labels: Labels,
    traffic_policy: Option<TrafficSpec>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct TrafficSpec {
    load_balancer: Option<LbSpec>,
    connection_pool: Option<PoolSpec>,
    outlier_detection: Option<OutlierSpec>,
    tls: Option<TlsSpec>,
    #[serde(default)]
    port_level_settings: Vec<serde_json::Value>,
    tunnel: Option<serde_json::Value>,
    proxy_protocol: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LbSpec {
    simple: Option<String>,
    consistent_hash: Option<HashSpec>,
    locality_lb_setting: Option<serde_json::Value>,
    warmup_duration_secs: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HashSpec {
    http_header_name: Option<String>,
    http_cookie: Option<CookieSpec>,
    use_source_ip: Option<bool>,
    http_query_parameter_name: Option<String>,
    // The hash function: ours is rendezvous hashing whatever is asked
    // (the same stickiness; docs/waypoint.md).
    ring_hash: Option<serde_json::Value>,
    maglev: Option<serde_json::Value>,
    minimum_ring_size: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct CookieSpec {
    name: String,
    path: Option<String>,
    ttl: Option<String>,
}

#[derive(Deserialize)]
struct PoolSpec {
    tcp: Option<TcpPoolSpec>,
    http: Option<HttpPoolSpec>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TcpPoolSpec {
    max_connections: Option<i64>,
    connect_timeout: Option<String>,
    tcp_keepalive: Option<serde_json::Value>,
    max_connection_duration: Option<String>,
    idle_timeout: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HttpPoolSpec {
    http1_max_pending_requests: Option<i64>,
    http2_max_requests: Option<i64>,
    max_requests_per_connection: Option<i64>,
    max_retries: Option<i64>,
    idle_timeout: Option<String>,
    h2_upgrade_policy: Option<String>,
    use_client_protocol: Option<bool>,
    max_concurrent_streams: Option<i64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct OutlierSpec {
    consecutive_errors: Option<i64>,
    #[serde(rename = "consecutive5xxErrors")]
    consecutive_5xx_errors: Option<i64>,
    consecutive_gateway_errors: Option<i64>,
    consecutive_local_origin_failures: Option<i64>,
    split_external_local_origin_errors: Option<bool>,
    interval: Option<String>,
    base_ejection_time: Option<String>,
    max_ejection_percent: Option<i64>,
    min_health_percent: Option<i64>,
}

#[derive(Deserialize)]
struct TlsSpec {
    mode: Option<String>,
}

// ---- reading ----

struct Reader {
    r: ObjectRef,
    /// The cluster's domain (`cluster.local`).
    domain: String,
}

impl Reader {
    fn err(&self, field: impl Into<String>, message: impl Into<String>) -> ObjectError {
        ObjectError::new(&self.r, field, message)
    }

    fn unsupported(&self, field: impl Into<String>, why: &str) -> ObjectError {
        self.err(field, format!("not supported: {why}"))
    }

    /// A `hosts` entry or a destination's `host` as a service key: a short
    /// name is in the object's namespace; `name.ns`, `name.ns.svc` and the
    /// full name are completed. Anything else is not a service of the
    /// cluster (ServiceEntry hosts are not supported).
    fn service_key(&self, host: &str, field: &str) -> Result<String, ObjectError> {
        let labels: Vec<&str> = host.split('.').collect();
        let bad = || {
            self.err(
                field,
                format!(
                    "{host:?} is not a Kubernetes service (name, name.namespace or name.namespace.svc.{}); \
                     ServiceEntry hosts and wildcards are not supported",
                    self.domain
                ),
            )
        };
        if host.is_empty() || host.contains('*') || labels.iter().any(|l| l.is_empty()) {
            return Err(bad());
        }
        let (name, ns) = match labels.as_slice() {
            [name] => (*name, self.r.namespace.as_str()),
            [name, ns] | [name, ns, "svc"] => (*name, *ns),
            [name, ns, "svc", domain @ ..] if domain.join(".") == self.domain => (*name, *ns),
            _ => return Err(bad()),
        };
        Ok(format!("{ns}/{name}.{ns}.svc.{}", self.domain))
    }
}

fn spec<T: for<'de> Deserialize<'de> + Default>(rd: &Reader, o: &OpaqueObject) -> Result<T, ObjectError> {
    match o.rest.get("spec") {
        None | Some(serde_json::Value::Null) => Ok(T::default()),
        Some(v) => serde_path_to_error::deserialize(v).map_err(|e| {
            let path = e.path().to_string();
            let field = if path == "." { "spec".to_string() } else { format!("spec.{path}") };
            rd.err(field, e.into_inner().to_string())
        }),
    }
}

fn reader(o: &OpaqueObject, kind: Kind, domain: &str) -> Result<Reader, ObjectError> {
    let rd = Reader {
        r: ObjectRef::new(o.kind, o.metadata.namespace.as_deref().unwrap_or(""), o.metadata.name.as_deref().unwrap_or("")),
        domain: domain.to_string(),
    };
    if o.kind != kind {
        return Err(rd.err("kind", format!("expected {kind}, got {}", o.kind)));
    }
    Ok(rd)
}

fn creation(o: &OpaqueObject) -> Option<String> {
    o.metadata.creation_timestamp.as_ref().map(|t| t.0.to_rfc3339_opts(k8s_openapi::chrono::SecondsFormat::Secs, true))
}

/// A duration as Istio's CRDs take it (Go's `time.ParseDuration`: one or
/// more decimal numbers with a unit `h`, `m`, `s`, `ms`, `us` or `ns`,
/// `1.5s`, `1m30s`). Zero is None.
pub fn duration(rd_err: impl Fn(String) -> ObjectError, s: &str) -> Result<Option<Duration>, ObjectError> {
    let d = slipstream_core::duration::parse_go(s).map_err(rd_err)?;
    Ok((!d.is_zero()).then_some(d))
}

/// A percentage (0-100, Istio's `Percent.value`) in parts per million.
fn per_million(rd: &Reader, v: f64, field: &str) -> Result<u32, ObjectError> {
    if !(0.0..=100.0).contains(&v) {
        return Err(rd.err(field, format!("{v} is not a percentage between 0 and 100")));
    }
    Ok(((v * 10_000.0).round() as u32).min(MILLION))
}

fn int_in(rd: &Reader, v: i64, lo: i64, hi: i64, field: &str) -> Result<u32, ObjectError> {
    if v < lo || v > hi {
        return Err(rd.err(field, format!("{v} is not between {lo} and {hi}")));
    }
    Ok(v as u32)
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
        let g = format!("{f}.match[{j}]");
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
            continue;
        }
        for_mesh = true;
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
        matches.push((rm, port));
    }
    if !for_mesh {
        return Ok(None);
    }
    let mut filters = Filters::default();
    if let Some(hs) = h.headers {
        filters.request_headers = header_ops(rd, hs.request, &format!("{f}.headers.request"))?;
        filters.response_headers = header_ops(rd, hs.response, &format!("{f}.headers.response"))?;
    }
    let mut destinations = Vec::new();
    for (j, d) in h.route.into_iter().enumerate() {
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
    let destinations: Vec<Destination> = match destinations.len() {
        0 => Vec::new(),
        1 => destinations.into_iter().map(|(d, _)| Destination { weight: 100, ..d }).collect(),
        _ => {
            if destinations.iter().all(|(_, w)| w.unwrap_or(0) == 0) {
                return Err(rd.err(format!("{f}.route"), "every weight is 0: no destination would get a request"));
            }
            destinations.into_iter().map(|(d, w)| Destination { weight: w.unwrap_or(0), ..d }).collect()
        }
    };
    if let Some(r) = h.redirect {
        if !destinations.is_empty() {
            return Err(rd.err(format!("{f}.redirect"), "a route takes route or redirect, not both"));
        }
        if r.derive_port.is_some() {
            return Err(rd.unsupported(format!("{f}.redirect.derivePort"), "give port, or none to keep the request's"));
        }
        let status = match r.redirect_code.unwrap_or(301) {
            c @ (301 | 302 | 303 | 307 | 308) => c as u16,
            c => return Err(rd.err(format!("{f}.redirect.redirectCode"), format!("{c} is not 301, 302, 303, 307 or 308"))),
        };
        filters.redirect = Some(Redirect {
            scheme: r.scheme,
            hostname: r.authority,
            path: r.uri.map(PathRewrite::ReplaceFullPath),
            port: r.port.map(|p| int_in(rd, p, 1, 65535, &format!("{f}.redirect.port")).map(|p| p as u16)).transpose()?,
            status,
        });
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

fn fault(rd: &Reader, fs: FaultSpec, f: &str) -> Result<Fault, ObjectError> {
    let delay = match fs.delay {
        None => None,
        Some(d) => {
            let g = format!("{f}.delay");
            if d.exponential_delay.is_some() {
                return Err(rd.unsupported(format!("{g}.exponentialDelay"), "use fixedDelay"));
            }
            let Some(fixed) = d.fixed_delay else { return Err(rd.err(format!("{g}.fixedDelay"), "required")) };
            let delay = duration(|m| rd.err(format!("{g}.fixedDelay"), m), &fixed)?
                .ok_or_else(|| rd.err(format!("{g}.fixedDelay"), "must be more than 0"))?;
            let per_million = match (d.percentage.and_then(|p| p.value), d.percent) {
                (Some(v), _) => per_million(rd, v, &format!("{g}.percentage.value"))?,
                (None, Some(p)) => per_million(rd, p as f64, &format!("{g}.percent"))?,
                // Istio: no percentage, every request.
                (None, None) => MILLION,
            };
            Some(FaultDelay { per_million, delay })
        }
    };
    let abort = match fs.abort {
        None => None,
        Some(a) => {
            let g = format!("{f}.abort");
            for (field, set) in [("grpcStatus", a.grpc_status.is_some()), ("http2Error", a.http2_error.is_some())] {
                if set {
                    return Err(rd.unsupported(format!("{g}.{field}"), "abort with httpStatus"));
                }
            }
            let Some(status) = a.http_status else { return Err(rd.err(format!("{g}.httpStatus"), "required")) };
            let status = int_in(rd, status, 200, 599, &format!("{g}.httpStatus"))? as u16;
            let per_million = match a.percentage.and_then(|p| p.value) {
                Some(v) => per_million(rd, v, &format!("{g}.percentage.value"))?,
                None => MILLION,
            };
            Some(FaultAbort { per_million, status })
        }
    };
    if delay.is_none() && abort.is_none() {
        return Err(rd.err(f, "needs a delay or an abort"));
    }
    Ok(Fault { delay, abort })
}

/// Reads a DestinationRule. Every error names the field, from `spec.` on.
/// Its host is resolved in the cluster domain `domain_suffix`.
pub fn destination_rule(o: &OpaqueObject, domain_suffix: &str) -> Result<DestinationRuleInput, ObjectError> {
    let rd = reader(o, Kind::DestinationRule, domain_suffix)?;
    let spec: DrSpec = spec(&rd, o)?;
    if spec.workload_selector.is_some() {
        return Err(rd.unsupported("spec.workloadSelector", "a DestinationRule here applies to every caller of its host"));
    }
    let _ = spec.export_to;
    let (host, wildcard) = if spec.host.is_empty() {
        return Err(rd.err("spec.host", "required: the service this rule is about"));
    } else if spec.host == "*" || spec.host.starts_with("*.") {
        (String::new(), Some(spec.host.clone()))
    } else {
        (rd.service_key(&spec.host, "spec.host")?, None)
    };
    let base = spec.traffic_policy.map(|t| traffic(&rd, t, "spec.trafficPolicy")).transpose()?;
    let mut subsets: Vec<SubsetInput> = Vec::new();
    for (i, s) in spec.subsets.into_iter().enumerate() {
        let f = format!("spec.subsets[{i}]");
        if s.name.is_empty() {
            return Err(rd.err(format!("{f}.name"), "required"));
        }
        if subsets.iter().any(|o| o.name == s.name) {
            return Err(rd.err(format!("{f}.name"), format!("{:?} is named twice", s.name)));
        }
        let t = s.traffic_policy.map(|t| traffic(&rd, t, &format!("{f}.trafficPolicy"))).transpose()?;
        subsets.push(SubsetInput { name: s.name, labels: s.labels, traffic: t });
    }
    Ok(DestinationRuleInput {
        namespace: rd.r.namespace.clone(),
        name: rd.r.name.clone(),
        creation: creation(o),
        host,
        wildcard,
        traffic: base,
        subsets,
    })
}

fn positive(rd: &Reader, v: i64, field: &str) -> Result<u32, ObjectError> {
    int_in(rd, v, 1, i64::from(u32::MAX), field)
}

fn traffic(rd: &Reader, t: TrafficSpec, f: &str) -> Result<TrafficInput, ObjectError> {
    for (field, set) in [
        ("portLevelSettings", !t.port_level_settings.is_empty()),
        ("tunnel", t.tunnel.is_some()),
        ("proxyProtocol", t.proxy_protocol.is_some()),
    ] {
        if set {
            return Err(rd.unsupported(format!("{f}.{field}"), "the waypoint applies a policy to the whole service or subset"));
        }
    }
    if let Some(tls) = &t.tls {
        // In the mesh every hop is mutual TLS with the mesh's identities:
        // ISTIO_MUTUAL is what happens anyway, and DISABLE cannot turn it
        // off. Originating TLS to the app is not supported.
        match tls.mode.as_deref() {
            None | Some("ISTIO_MUTUAL") | Some("DISABLE") => {}
            Some(m) => return Err(rd.unsupported(format!("{f}.tls.mode"), &format!("{m}: the mesh's own mutual TLS is ISTIO_MUTUAL"))),
        }
    }
    let lb = t.load_balancer.map(|l| load_balancer(rd, l, &format!("{f}.loadBalancer"))).transpose()?;
    let pool = match t.connection_pool {
        None => None,
        Some(p) => Some(pool(rd, p, &format!("{f}.connectionPool"))?),
    };
    let outlier = t.outlier_detection.map(|o| outlier(rd, o, &format!("{f}.outlierDetection"))).transpose()?;
    Ok(TrafficInput { lb, pool, outlier })
}

fn load_balancer(rd: &Reader, l: LbSpec, f: &str) -> Result<LoadBalancer, ObjectError> {
    for (field, set) in [("localityLbSetting", l.locality_lb_setting.is_some()), ("warmupDurationSecs", l.warmup_duration_secs.is_some())] {
        if set {
            return Err(rd.unsupported(format!("{f}.{field}"), "endpoints are balanced without locality or warm-up"));
        }
    }
    match (l.simple, l.consistent_hash) {
        (Some(_), Some(_)) => Err(rd.err(f, "simple and consistentHash are exclusive")),
        (Some(s), None) => match s.as_str() {
            "UNSPECIFIED" | "LEAST_REQUEST" | "LEAST_CONN" => Ok(LoadBalancer::LeastRequest),
            "ROUND_ROBIN" => Ok(LoadBalancer::RoundRobin),
            "RANDOM" => Ok(LoadBalancer::Random),
            "PASSTHROUGH" => Err(rd.unsupported(format!("{f}.simple"), "PASSTHROUGH: the waypoint always chooses a mesh endpoint")),
            other => Err(rd.err(format!("{f}.simple"), format!("{other:?} is not ROUND_ROBIN, LEAST_REQUEST or RANDOM"))),
        },
        (None, Some(h)) => {
            let _ = (h.ring_hash, h.maglev, h.minimum_ring_size);
            let g = format!("{f}.consistentHash");
            let keys = [
                h.http_header_name.is_some(),
                h.http_cookie.is_some(),
                h.use_source_ip == Some(true),
                h.http_query_parameter_name.is_some(),
            ];
            if keys.iter().filter(|k| **k).count() != 1 {
                return Err(rd.err(g, "exactly one of httpHeaderName, httpCookie, useSourceIp or httpQueryParameterName is required"));
            }
            if let Some(name) = h.http_header_name {
                return Ok(LoadBalancer::Hash(HashOn::Header(name.to_ascii_lowercase())));
            }
            if let Some(c) = h.http_cookie {
                if c.ttl.is_some() || c.path.is_some() {
                    let field = if c.ttl.is_some() { "ttl" } else { "path" };
                    return Err(rd.unsupported(
                        format!("{g}.httpCookie.{field}"),
                        "the waypoint hashes on a cookie the client sends; it does not set one",
                    ));
                }
                return Ok(LoadBalancer::Hash(HashOn::Cookie(c.name)));
            }
            if let Some(q) = h.http_query_parameter_name {
                return Ok(LoadBalancer::Hash(HashOn::Query(q)));
            }
            Ok(LoadBalancer::Hash(HashOn::SourceIp))
        }
        (None, None) => Ok(LoadBalancer::LeastRequest),
    }
}

/// `connectionPool`: the bound on requests in flight it implies, as
/// Envoy's circuit breakers would let them through: `http2MaxRequests`, or
/// `tcp.maxConnections` connections each with a request plus
/// `http1MaxPendingRequests` waiting.
fn pool(rd: &Reader, p: PoolSpec, f: &str) -> Result<Option<u32>, ObjectError> {
    let mut max_conns = None;
    if let Some(t) = p.tcp {
        for (field, set) in [
            ("connectTimeout", t.connect_timeout.is_some()),
            ("tcpKeepalive", t.tcp_keepalive.is_some()),
            ("maxConnectionDuration", t.max_connection_duration.is_some()),
            ("idleTimeout", t.idle_timeout.is_some()),
        ] {
            if set {
                return Err(rd.unsupported(
                    format!("{f}.tcp.{field}"),
                    "the waypoint's tunnels are the node proxies' (HBONE); only maxConnections applies",
                ));
            }
        }
        max_conns = t.max_connections.map(|v| positive(rd, v, &format!("{f}.tcp.maxConnections"))).transpose()?;
    }
    let (mut pending, mut h2) = (None, None);
    if let Some(h) = p.http {
        for (field, set) in [
            ("maxRequestsPerConnection", h.max_requests_per_connection.is_some()),
            ("maxRetries", h.max_retries.is_some()),
            ("idleTimeout", h.idle_timeout.is_some()),
            ("h2UpgradePolicy", h.h2_upgrade_policy.is_some()),
            ("useClientProtocol", h.use_client_protocol.is_some()),
            ("maxConcurrentStreams", h.max_concurrent_streams.is_some()),
        ] {
            if set {
                return Err(rd.unsupported(
                    format!("{f}.http.{field}"),
                    "the waypoint bounds requests in flight (http2MaxRequests, or tcp.maxConnections plus http1MaxPendingRequests)",
                ));
            }
        }
        pending = h.http1_max_pending_requests.map(|v| positive(rd, v, &format!("{f}.http.http1MaxPendingRequests"))).transpose()?;
        h2 = h.http2_max_requests.map(|v| positive(rd, v, &format!("{f}.http.http2MaxRequests"))).transpose()?;
    }
    Ok(match (h2, max_conns) {
        (Some(n), _) => Some(n),
        (None, Some(c)) => Some(c.saturating_add(pending.unwrap_or(0))),
        (None, None) => pending,
    })
}

fn outlier(rd: &Reader, o: OutlierSpec, f: &str) -> Result<OutlierDetection, ObjectError> {
    for (field, set) in [
        ("consecutiveLocalOriginFailures", o.consecutive_local_origin_failures.is_some()),
        ("splitExternalLocalOriginErrors", o.split_external_local_origin_errors.is_some()),
    ] {
        if set {
            return Err(rd.unsupported(format!("{f}.{field}"), "every failure counts as the endpoint's"));
        }
    }
    // `interval` is how often Envoy sweeps; ejection here happens at the
    // failure that crosses the bound. `minHealthPercent` has no effect
    // either (docs/waypoint.md).
    if let Some(i) = &o.interval {
        duration(|m| rd.err(format!("{f}.interval"), m), i)?;
    }
    let _ = o.min_health_percent;
    let count = |v: Option<i64>, field: &str| v.map(|v| int_in(rd, v, 0, i64::from(u32::MAX), &format!("{f}.{field}"))).transpose();
    // Istio: the deprecated consecutiveErrors counts gateway errors; 0
    // turns a counter off.
    let gateway = count(o.consecutive_gateway_errors, "consecutiveGatewayErrors")?.or(count(o.consecutive_errors, "consecutiveErrors")?);
    let five = count(o.consecutive_5xx_errors, "consecutive5xxErrors")?;
    // Envoy's default when neither is given: 5 consecutive 5xx.
    let (five, gateway) = match (five, gateway) {
        (None, None) => (Some(5), None),
        other => other,
    };
    let base = match &o.base_ejection_time {
        None => Duration::from_secs(30),
        Some(b) => duration(|m| rd.err(format!("{f}.baseEjectionTime"), m), b)?.unwrap_or(Duration::from_secs(30)),
    };
    Ok(OutlierDetection {
        consecutive_5xx: five.filter(|n| *n > 0),
        consecutive_gateway: gateway.filter(|n| *n > 0),
        base_ejection: base,
        max_ejection_percent: o
            .max_ejection_percent
            .map(|v| int_in(rd, v, 0, 100, &format!("{f}.maxEjectionPercent")))
            .transpose()?
            .unwrap_or(10),
    })
}

// ---- compiling ----

/// The rules of `vs` for one service, in the order written (each match
/// its own entry, so a match's port is the entry's), destinations and
/// mirrors resolved with `subset(service key, subset name)`.
pub fn compile(vs: &VirtualServiceInput, subset: &dyn Fn(&str, &str) -> Subset) -> Vec<RouteRule> {
    let backend = |d: &Destination| Backend {
        service: d.service.clone(),
        port: d.port.unwrap_or(0),
        weight: d.weight,
        subset: d.subset.as_deref().map(|s| subset(&d.service, s)),
    };
    let mut out = Vec::new();
    for r in &vs.rules {
        let template = RouteRule {
            name: r.name.clone(),
            port: 0,
            matches: Vec::new(),
            backends: r.destinations.iter().map(backend).collect(),
            filters: Filters { mirrors: r.mirrors.iter().map(backend).collect(), ..r.filters.clone() },
            timeout: r.timeout,
            backend_timeout: None,
            retry: r.retry.clone(),
            fault: r.fault.clone(),
        };
        if r.matches.is_empty() {
            out.push(RouteRule {
                matches: vec![RouteMatch { path: PathMatch::StringPrefix("/".into()), ..Default::default() }],
                ..template
            });
            continue;
        }
        for (m, port) in &r.matches {
            let mut entry = RouteRule { port: port.unwrap_or(0), matches: vec![m.clone()], ..template.clone() };
            // Under an exact match the whole path is what matched.
            if let (PathMatch::Exact(_), Some(Rewrite { path: Some(p @ PathRewrite::ReplacePrefixMatch(_)), .. })) =
                (&m.path, entry.filters.rewrite.as_mut())
            {
                let PathRewrite::ReplacePrefixMatch(v) = p else { unreachable!() };
                *p = PathRewrite::ReplaceFullPath(std::mem::take(v));
            }
            out.push(entry);
        }
    }
    out
}

#[cfg(test)]
mod tests;
