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
use slipstream_core::route::{sort_rules, Backend, Filters, PathMatch, PathRewrite, RouteMatch, RouteRule, RuleOrigin, ServiceRoutes};
use std::time::Duration;

mod filters;
mod matches;

use filters::{filters, FilterSpec};
use matches::{route_match, MatchSpec};

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
