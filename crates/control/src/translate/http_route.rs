//! Gateway API HTTPRoute, as the waypoint takes it (docs/waypoint.md,
//! "Configuration"): [`http_route`] reads one object into an
//! [`HttpRouteInput`] (Gateway API's defaults applied, every feature we do
//! not carry refused by name), and [`compile`] turns the routes that name a
//! Service as their parent into that service's
//! [`ServiceRoutes`](slipstream_core::route::ServiceRoutes), in precedence
//! order. Pure, for table tests.
//!
//! Unknown fields are not refused here (that is the strict validation
//! layer's job); known fields we cannot honour are: RegularExpression
//! matches, ExtensionRef and CORS filters, `sessionPersistence`, `retry`,
//! mirroring a fraction of requests, backendRef filters, backends and
//! parents of kinds other than Service (and Gateway, for parents).

use crate::objects::{Kind, ObjectError, ObjectRef, OpaqueObject};
use serde::Deserialize;
use slipstream_core::route::{
    sort_rules, Backend, Filters, HeaderMatch, HeaderModifier, PathMatch, PathRewrite, QueryMatch, Redirect, Rewrite, RouteMatch,
    RouteRule, RuleOrigin, ServiceRoutes,
};
use std::time::Duration;

/// The API group of Gateway API kinds (a parentRef's default).
pub const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";
/// The most a backendRef's `weight` may be (Gateway API's limit).
pub const MAX_WEIGHT: u32 = 1_000_000;

/// One HTTPRoute as the index keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRouteInput {
    pub namespace: String,
    pub name: String,
    /// `metadata.creationTimestamp` as Kubernetes writes it
    /// (`2024-01-02T03:04:05Z`): precedence's first tie-break.
    pub creation: Option<String>,
    /// parentRefs to a Service (group `""`, kind `Service`): the mesh
    /// (GAMMA) attachment the waypoint serves.
    pub parents: Vec<ServiceParent>,
    /// parentRefs to a Gateway, (namespace, name): kept, not acted on.
    pub gateway_parents: Vec<(String, String)>,
    pub hostnames: Vec<String>,
    pub rules: Vec<RuleInput>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceParent {
    /// The route's own when the parentRef names none.
    pub namespace: String,
    pub name: String,
    /// None: every port of the service.
    pub port: Option<u16>,
}

/// One rule, its matches, filters and timeouts already in the model's
/// types; backends (and mirrors) still by Service name, which [`compile`]
/// resolves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleInput {
    /// Never empty: a rule without matches has Gateway API's default,
    /// `PathPrefix /`.
    pub matches: Vec<RouteMatch>,
    /// `mirrors` is empty here; see [`RuleInput::mirrors`].
    pub filters: Filters,
    /// `RequestMirror` filters, by Service name.
    pub mirrors: Vec<BackendRef>,
    pub backends: Vec<BackendRef>,
    /// `timeouts.request`; `0s` is None.
    pub timeout: Option<Duration>,
    /// `timeouts.backendRequest`; `0s` is None.
    pub backend_timeout: Option<Duration>,
}

/// A backendRef to a Service, by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendRef {
    /// The route's own when the backendRef names none.
    pub namespace: String,
    pub name: String,
    /// None: the parent's port (or, under a parent without one, the port
    /// the request was addressed to).
    pub port: Option<u16>,
    /// 1 when unset.
    pub weight: u32,
}

impl BackendRef {
    /// The workload API's key of the Service it names, in the cluster
    /// domain `domain_suffix`.
    pub fn service_key(&self, domain_suffix: &str) -> String {
        format!("{ns}/{name}.{ns}.svc.{domain_suffix}", ns = self.namespace, name = self.name)
    }
}

// ---- the object, as written ----

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Spec {
    #[serde(default)]
    parent_refs: Vec<ParentRefSpec>,
    #[serde(default)]
    hostnames: Vec<String>,
    /// None (absent) takes Gateway API's default, one rule matching every
    /// request; an explicit empty list is no rules.
    #[serde(default)]
    rules: Option<Vec<RuleSpec>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ParentRefSpec {
    group: Option<String>,
    kind: Option<String>,
    namespace: Option<String>,
    name: String,
    section_name: Option<String>,
    port: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RuleSpec {
    #[serde(default)]
    matches: Vec<MatchSpec>,
    #[serde(default)]
    filters: Vec<FilterSpec>,
    #[serde(default)]
    backend_refs: Vec<BackendRefSpec>,
    timeouts: Option<TimeoutsSpec>,
    retry: Option<serde_json::Value>,
    session_persistence: Option<serde_json::Value>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct MatchSpec {
    path: Option<PathSpec>,
    #[serde(default)]
    headers: Vec<NameMatchSpec>,
    #[serde(default)]
    query_params: Vec<NameMatchSpec>,
    method: Option<String>,
}

#[derive(Deserialize)]
struct PathSpec {
    #[serde(rename = "type")]
    kind: Option<String>,
    value: Option<String>,
}

#[derive(Deserialize)]
struct NameMatchSpec {
    #[serde(rename = "type")]
    kind: Option<String>,
    name: String,
    value: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FilterSpec {
    #[serde(rename = "type")]
    kind: String,
    request_header_modifier: Option<HeaderFilterSpec>,
    response_header_modifier: Option<HeaderFilterSpec>,
    request_redirect: Option<RedirectSpec>,
    #[serde(rename = "urlRewrite")]
    url_rewrite: Option<RewriteSpec>,
    request_mirror: Option<MirrorSpec>,
}

#[derive(Deserialize, Default)]
struct HeaderFilterSpec {
    #[serde(default)]
    set: Vec<NameValue>,
    #[serde(default)]
    add: Vec<NameValue>,
    #[serde(default)]
    remove: Vec<String>,
}

#[derive(Deserialize)]
struct NameValue {
    name: String,
    value: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RedirectSpec {
    scheme: Option<String>,
    hostname: Option<String>,
    path: Option<PathModifierSpec>,
    port: Option<i64>,
    status_code: Option<i64>,
}

#[derive(Deserialize)]
struct RewriteSpec {
    hostname: Option<String>,
    path: Option<PathModifierSpec>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PathModifierSpec {
    #[serde(rename = "type")]
    kind: String,
    replace_full_path: Option<String>,
    replace_prefix_match: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MirrorSpec {
    backend_ref: ObjectRefSpec,
    percent: Option<serde_json::Value>,
    fraction: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct ObjectRefSpec {
    group: Option<String>,
    kind: Option<String>,
    name: String,
    namespace: Option<String>,
    port: Option<i64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BackendRefSpec {
    group: Option<String>,
    kind: Option<String>,
    name: String,
    namespace: Option<String>,
    port: Option<i64>,
    weight: Option<i64>,
    #[serde(default)]
    filters: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TimeoutsSpec {
    request: Option<String>,
    backend_request: Option<String>,
}

// ---- reading ----

/// The route being read: its reference (for errors) and namespace (for
/// the references that default to it).
struct Reader {
    r: ObjectRef,
}

impl Reader {
    fn err(&self, field: impl Into<String>, message: impl Into<String>) -> ObjectError {
        ObjectError::new(&self.r, field, message)
    }

    fn port(&self, v: i64, field: &str) -> Result<u16, ObjectError> {
        u16::try_from(v).ok().filter(|p| *p > 0).ok_or_else(|| self.err(field, format!("{v} is not a port (1-65535)")))
    }

    fn namespace(&self, ns: Option<String>) -> String {
        ns.filter(|n| !n.is_empty()).unwrap_or_else(|| self.r.namespace.clone())
    }
}

/// Reads an HTTPRoute (`rest` is everything but metadata). Every error
/// names the field, from `spec.` on.
pub fn http_route(o: &OpaqueObject) -> Result<HttpRouteInput, ObjectError> {
    let rd = Reader { r: ObjectRef::new(o.kind, o.metadata.namespace.as_deref().unwrap_or(""), o.metadata.name.as_deref().unwrap_or("")) };
    if o.kind != Kind::HTTPRoute {
        return Err(rd.err("kind", format!("expected HTTPRoute, got {}", o.kind)));
    }
    let spec = parse_spec(&rd, o.rest.get("spec"))?;
    from_spec(rd, o, spec)
}

fn parse_spec(rd: &Reader, v: Option<&serde_json::Value>) -> Result<Spec, ObjectError> {
    Ok(match v {
        None | Some(serde_json::Value::Null) => Spec::default(),
        Some(v) => serde_path_to_error::deserialize(v).map_err(|e| {
            let path = e.path().to_string();
            let field = if path == "." { "spec".to_string() } else { format!("spec.{path}") };
            rd.err(field, e.into_inner().to_string())
        })?,
    })
}

fn from_spec(rd: Reader, o: &OpaqueObject, spec: Spec) -> Result<HttpRouteInput, ObjectError> {
    let mut parents = Vec::new();
    let mut gateway_parents = Vec::new();
    for (i, p) in spec.parent_refs.into_iter().enumerate() {
        let f = format!("spec.parentRefs[{i}]");
        let group = p.group.unwrap_or_else(|| GATEWAY_GROUP.into());
        let kind = p.kind.unwrap_or_else(|| "Gateway".into());
        let port = p.port.map(|v| rd.port(v, &format!("{f}.port"))).transpose()?;
        match (group.as_str(), kind.as_str()) {
            ("", "Service") => {
                if p.section_name.is_some() {
                    return Err(rd.err(format!("{f}.sectionName"), "not supported for a Service parent; name the service port with `port`"));
                }
                parents.push(ServiceParent { namespace: rd.namespace(p.namespace), name: p.name, port });
            }
            (GATEWAY_GROUP, "Gateway") => gateway_parents.push((rd.namespace(p.namespace), p.name)),
            _ => {
                return Err(rd.err(
                    format!("{f}.kind"),
                    format!("a parent of kind {kind} (group {group:?}) is not supported; use a Service (group \"\") or a Gateway"),
                ))
            }
        }
    }
    let rules = match spec.rules {
        // The CRD's default: one rule, matching every request.
        None => vec![rule(&rd, RuleSpec::default(), 0)?],
        Some(rules) => rules.into_iter().enumerate().map(|(i, r)| rule(&rd, r, i)).collect::<Result<_, _>>()?,
    };
    Ok(HttpRouteInput {
        namespace: rd.r.namespace.clone(),
        name: rd.r.name.clone(),
        creation: o.metadata.creation_timestamp.as_ref().map(|t| t.0.to_rfc3339_opts(k8s_openapi::chrono::SecondsFormat::Secs, true)),
        parents,
        gateway_parents,
        hostnames: spec.hostnames,
        rules,
    })
}

fn rule(rd: &Reader, r: RuleSpec, i: usize) -> Result<RuleInput, ObjectError> {
    let f = format!("spec.rules[{i}]");
    if r.retry.is_some() {
        return Err(rd.err(format!("{f}.retry"), "retries (experimental) are not supported"));
    }
    if r.session_persistence.is_some() {
        return Err(rd.err(format!("{f}.sessionPersistence"), "session persistence is not supported"));
    }
    let mut matches =
        r.matches.into_iter().enumerate().map(|(j, m)| route_match(rd, m, &format!("{f}.matches[{j}]"))).collect::<Result<Vec<_>, _>>()?;
    if matches.is_empty() {
        matches.push(RouteMatch::default());
    }
    let mut backends = Vec::new();
    for (j, b) in r.backend_refs.into_iter().enumerate() {
        let bf = format!("{f}.backendRefs[{j}]");
        if !b.filters.is_empty() {
            return Err(rd.err(format!("{bf}.filters"), "backendRef filters are not supported; put the filters on the rule"));
        }
        let weight = match b.weight {
            None => 1,
            Some(w) => u32::try_from(w)
                .ok()
                .filter(|w| *w <= MAX_WEIGHT)
                .ok_or_else(|| rd.err(format!("{bf}.weight"), format!("{w} is not a weight (0-{MAX_WEIGHT})")))?,
        };
        let target = ObjectRefSpec { group: b.group, kind: b.kind, name: b.name, namespace: b.namespace, port: b.port };
        backends.push(service_ref(rd, target, weight, &bf)?);
    }
    let (filters, mirrors) = filters(rd, r.filters, &f)?;
    if filters.redirect.is_some() && !backends.is_empty() {
        return Err(rd.err(format!("{f}.backendRefs"), "a rule with a RequestRedirect filter answers itself and takes no backendRefs"));
    }
    let prefix_rewrite = [filters.redirect.as_ref().and_then(|r| r.path.as_ref()), filters.rewrite.as_ref().and_then(|r| r.path.as_ref())]
        .into_iter()
        .flatten()
        .any(|p| matches!(p, PathRewrite::ReplacePrefixMatch(_)));
    if prefix_rewrite && !matches!(matches.as_slice(), [RouteMatch { path: PathMatch::Prefix(_), .. }]) {
        return Err(rd.err(format!("{f}.matches"), "ReplacePrefixMatch needs the rule to have exactly one match, of type PathPrefix"));
    }
    let (mut timeout, mut backend_timeout) = (None, None);
    if let Some(t) = r.timeouts {
        timeout = t.request.as_deref().map(|d| duration(rd, d, &format!("{f}.timeouts.request"))).transpose()?.flatten();
        backend_timeout =
            t.backend_request.as_deref().map(|d| duration(rd, d, &format!("{f}.timeouts.backendRequest"))).transpose()?.flatten();
        if let (Some(req), Some(be)) = (timeout, backend_timeout) {
            if be > req {
                return Err(rd.err(format!("{f}.timeouts.backendRequest"), "is longer than timeouts.request"));
            }
        }
    }
    Ok(RuleInput { matches, filters, mirrors, backends, timeout, backend_timeout })
}

/// A path of a match or a redirect/rewrite: absolute, and without what
/// Gateway API's validation forbids (`//`, `/./`, `/../`, `%2f`, `#`, a
/// final `/.` or `/..`).
fn check_path(rd: &Reader, value: &str, field: &str) -> Result<(), ObjectError> {
    if !value.starts_with('/') {
        return Err(rd.err(field, format!("{value:?} must be an absolute path (start with /)")));
    }
    for bad in ["//", "/./", "/../", "%2f", "%2F", "#"] {
        if value.contains(bad) {
            return Err(rd.err(field, format!("{value:?} must not contain {bad:?}")));
        }
    }
    if value.ends_with("/.") || value.ends_with("/..") {
        return Err(rd.err(field, format!("{value:?} must not end with /. or /..")));
    }
    Ok(())
}

/// A match type other than Exact (the default): RegularExpression is
/// refused by name, anything else as unknown.
fn exact_only(rd: &Reader, kind: Option<&str>, field: &str) -> Result<(), ObjectError> {
    match kind {
        None | Some("Exact") => Ok(()),
        Some("RegularExpression") => Err(rd.err(field, "RegularExpression is not supported; use Exact")),
        Some(other) => Err(rd.err(field, format!("{other:?} is not a match type; use Exact"))),
    }
}

const METHODS: [&str; 9] = ["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"];

fn route_match(rd: &Reader, m: MatchSpec, f: &str) -> Result<RouteMatch, ObjectError> {
    let path = match m.path {
        None => PathMatch::default(),
        Some(p) => {
            let value = p.value.unwrap_or_else(|| "/".into());
            let kind = p.kind.as_deref().unwrap_or("PathPrefix");
            match kind {
                "Exact" | "PathPrefix" => check_path(rd, &value, &format!("{f}.path.value"))?,
                "RegularExpression" => {
                    return Err(rd.err(format!("{f}.path.type"), "RegularExpression is not supported; use Exact or PathPrefix"))
                }
                other => {
                    return Err(rd.err(format!("{f}.path.type"), format!("{other:?} is not a path match type; use Exact or PathPrefix")))
                }
            }
            if kind == "Exact" {
                PathMatch::Exact(value)
            } else {
                PathMatch::Prefix(value)
            }
        }
    };
    // Gateway API: of entries with equivalent names only the first counts
    // (header names are case-insensitive, query parameter names are not).
    let mut headers: Vec<HeaderMatch> = Vec::new();
    for (k, h) in m.headers.into_iter().enumerate() {
        exact_only(rd, h.kind.as_deref(), &format!("{f}.headers[{k}].type"))?;
        if h.name.is_empty() {
            return Err(rd.err(format!("{f}.headers[{k}].name"), "required"));
        }
        let name = h.name.to_ascii_lowercase();
        if !headers.iter().any(|x| x.name == name) {
            headers.push(HeaderMatch { name, value: h.value });
        }
    }
    let mut query: Vec<QueryMatch> = Vec::new();
    for (k, q) in m.query_params.into_iter().enumerate() {
        exact_only(rd, q.kind.as_deref(), &format!("{f}.queryParams[{k}].type"))?;
        if q.name.is_empty() {
            return Err(rd.err(format!("{f}.queryParams[{k}].name"), "required"));
        }
        if !query.iter().any(|x| x.name == q.name) {
            query.push(QueryMatch { name: q.name, value: q.value });
        }
    }
    if let Some(method) = &m.method {
        if !METHODS.contains(&method.as_str()) {
            return Err(rd.err(format!("{f}.method"), format!("{method:?} is not one of {}", METHODS.join(", "))));
        }
    }
    Ok(RouteMatch { path, headers, query, method: m.method, ..Default::default() })
}

/// A reference to a Service (a backendRef or a mirror's): any other kind,
/// ServiceImport included, is refused naming `kind`.
fn service_ref(rd: &Reader, b: ObjectRefSpec, weight: u32, f: &str) -> Result<BackendRef, ObjectError> {
    let group = b.group.unwrap_or_default();
    let kind = b.kind.unwrap_or_else(|| "Service".into());
    if !group.is_empty() || kind != "Service" {
        return Err(
            rd.err(format!("{f}.kind"), format!("a backend of kind {kind} (group {group:?}) is not supported; use a Service (group \"\")"))
        );
    }
    if b.name.is_empty() {
        return Err(rd.err(format!("{f}.name"), "required"));
    }
    let port = b.port.map(|v| rd.port(v, &format!("{f}.port"))).transpose()?;
    Ok(BackendRef { namespace: rd.namespace(b.namespace), name: b.name, port, weight })
}

fn header_modifier(rd: &Reader, h: Option<HeaderFilterSpec>, f: &str) -> Result<HeaderModifier, ObjectError> {
    let Some(h) = h else { return Err(rd.err(f, "required by the filter's type")) };
    let pairs = |list: Vec<NameValue>, what: &str| -> Result<Vec<(String, String)>, ObjectError> {
        list.into_iter()
            .enumerate()
            .map(|(k, nv)| {
                if nv.name.is_empty() {
                    return Err(rd.err(format!("{f}.{what}[{k}].name"), "required"));
                }
                Ok((nv.name.to_ascii_lowercase(), nv.value))
            })
            .collect()
    };
    let remove = h
        .remove
        .into_iter()
        .enumerate()
        .map(|(k, n)| if n.is_empty() { Err(rd.err(format!("{f}.remove[{k}]"), "empty")) } else { Ok(n.to_ascii_lowercase()) })
        .collect::<Result<_, _>>()?;
    Ok(HeaderModifier { set: pairs(h.set, "set")?, add: pairs(h.add, "add")?, remove })
}

fn path_modifier(rd: &Reader, p: Option<PathModifierSpec>, f: &str) -> Result<Option<PathRewrite>, ObjectError> {
    let Some(p) = p else { return Ok(None) };
    let (value, field, rewrite): (Option<String>, &str, fn(String) -> PathRewrite) = match p.kind.as_str() {
        "ReplaceFullPath" => (p.replace_full_path, "replaceFullPath", PathRewrite::ReplaceFullPath),
        "ReplacePrefixMatch" => (p.replace_prefix_match, "replacePrefixMatch", PathRewrite::ReplacePrefixMatch),
        other => return Err(rd.err(format!("{f}.type"), format!("{other:?} is not one of ReplaceFullPath, ReplacePrefixMatch"))),
    };
    let Some(value) = value else { return Err(rd.err(format!("{f}.{field}"), format!("required by type {}", p.kind))) };
    // An empty replacement prefix is allowed (it strips the prefix).
    if !(value.is_empty() && field == "replacePrefixMatch") {
        check_path(rd, &value, &format!("{f}.{field}"))?;
    }
    Ok(Some(rewrite(value)))
}

fn filters(rd: &Reader, list: Vec<FilterSpec>, rule: &str) -> Result<(Filters, Vec<BackendRef>), ObjectError> {
    let mut out = Filters::default();
    let mut mirrors = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    for (k, fl) in list.into_iter().enumerate() {
        let f = format!("{rule}.filters[{k}]");
        if fl.kind != "RequestMirror" && seen.contains(&fl.kind) {
            return Err(rd.err(format!("{f}.type"), format!("a rule takes one {} filter", fl.kind)));
        }
        seen.push(fl.kind.clone());
        match fl.kind.as_str() {
            "RequestHeaderModifier" => {
                out.request_headers = header_modifier(rd, fl.request_header_modifier, &format!("{f}.requestHeaderModifier"))?
            }
            "ResponseHeaderModifier" => {
                out.response_headers = header_modifier(rd, fl.response_header_modifier, &format!("{f}.responseHeaderModifier"))?
            }
            "RequestRedirect" => {
                let rf = format!("{f}.requestRedirect");
                let Some(r) = fl.request_redirect else { return Err(rd.err(rf, "required by the filter's type")) };
                let scheme = match r.scheme.as_deref() {
                    None | Some("http") | Some("https") => r.scheme,
                    Some(other) => return Err(rd.err(format!("{rf}.scheme"), format!("{other:?} is not http or https"))),
                };
                let status = match r.status_code {
                    None => 302,
                    Some(s @ (301 | 302)) => s as u16,
                    Some(other) => return Err(rd.err(format!("{rf}.statusCode"), format!("{other} is not supported; use 301 or 302"))),
                };
                out.redirect = Some(Redirect {
                    scheme,
                    hostname: r.hostname,
                    path: path_modifier(rd, r.path, &format!("{rf}.path"))?,
                    port: r.port.map(|p| rd.port(p, &format!("{rf}.port"))).transpose()?,
                    status,
                });
            }
            "URLRewrite" => {
                let rf = format!("{f}.urlRewrite");
                let Some(r) = fl.url_rewrite else { return Err(rd.err(rf, "required by the filter's type")) };
                out.rewrite = Some(Rewrite { hostname: r.hostname, path: path_modifier(rd, r.path, &format!("{rf}.path"))? });
            }
            "RequestMirror" => {
                let mf = format!("{f}.requestMirror");
                let Some(m) = fl.request_mirror else { return Err(rd.err(mf, "required by the filter's type")) };
                for (set, name) in [(m.percent.is_some(), "percent"), (m.fraction.is_some(), "fraction")] {
                    if set {
                        return Err(
                            rd.err(format!("{mf}.{name}"), "mirroring a part of the requests is not supported; every request is mirrored")
                        );
                    }
                }
                mirrors.push(service_ref(rd, m.backend_ref, 1, &format!("{mf}.backendRef"))?);
            }
            "ExtensionRef" => return Err(rd.err(format!("{f}.type"), "ExtensionRef filters are not supported")),
            "CORS" => return Err(rd.err(format!("{f}.type"), "CORS filters (experimental) are not supported")),
            other => return Err(rd.err(format!("{f}.type"), format!("{other:?} is not a filter type we support"))),
        }
    }
    if out.redirect.is_some() && out.rewrite.is_some() {
        return Err(rd.err(format!("{rule}.filters"), "a rule takes RequestRedirect or URLRewrite, not both"));
    }
    Ok((out, mirrors))
}

/// A Gateway API duration (GEP-2257): one to four pairs of a number of up
/// to five digits and a unit, `h`, `m`, `s` or `ms` (`10s`, `1h30m`,
/// `500ms`). `0s` (any zero) means no timeout: None.
fn duration(rd: &Reader, s: &str, field: &str) -> Result<Option<Duration>, ObjectError> {
    let d = slipstream_core::duration::parse_gateway_api(s).map_err(|e| rd.err(field, e))?;
    Ok((!d.is_zero()).then_some(d))
}

mod grpc;
pub use grpc::grpc_route;

// ---- compiling ----

/// The routes of one Service (`service_namespace`/`service_name`, whose
/// hostname is `hostname`) for its waypoint: every rule of every route in
/// the service's namespace that names it as a parent, for the parent's
/// port (0: every port), in Gateway API precedence
/// ([`slipstream_core::route::sort_rules`]: one entry per match). Backends
/// are resolved to `namespace/<name>.<namespace>.svc.<domain_suffix>` keys;
/// a backend without a port takes its parent's.
///
/// Routes in other namespaces that name the service are left out: Istio
/// applies such a route only to callers in the route's own namespace, and
/// one `ServiceRoutes` per service cannot say who the caller is, so taking
/// them would impose one namespace's routes on every caller.
pub fn compile(
    routes: &[&HttpRouteInput],
    service_namespace: &str,
    service_name: &str,
    hostname: &str,
    domain_suffix: &str,
) -> ServiceRoutes {
    let mut rules = Vec::new();
    for route in routes.iter().filter(|r| r.namespace == service_namespace) {
        let mut ports: Vec<Option<u16>> =
            route.parents.iter().filter(|p| p.namespace == service_namespace && p.name == service_name).map(|p| p.port).collect();
        // A parentRef without a port already covers every port.
        if ports.contains(&None) {
            ports = vec![None];
        }
        ports.sort_unstable();
        ports.dedup();
        let origin = RuleOrigin { creation: route.creation.clone(), route: format!("{}/{}", route.namespace, route.name) };
        for port in ports {
            for (i, r) in route.rules.iter().enumerate() {
                let resolve = |b: &BackendRef| Backend {
                    service: b.service_key(domain_suffix),
                    port: b.port.or(port).unwrap_or(0),
                    weight: b.weight,
                    subset: None,
                };
                let rule = RouteRule {
                    name: format!("{}/{}.{i}", route.namespace, route.name),
                    port: port.unwrap_or(0),
                    matches: r.matches.clone(),
                    backends: r.backends.iter().map(resolve).collect(),
                    filters: Filters { mirrors: r.mirrors.iter().map(resolve).collect(), ..r.filters.clone() },
                    timeout: r.timeout,
                    backend_timeout: r.backend_timeout,
                    retry: None,
                    fault: None,
                };
                rules.push((rule, origin.clone()));
            }
        }
    }
    let rules = sort_rules(rules);
    let source = if rules.is_empty() { "" } else { "HTTPRoute" };
    ServiceRoutes { service: format!("{service_namespace}/{hostname}"), rules, source: source.into(), ..Default::default() }
}

#[cfg(test)]
mod tests;
