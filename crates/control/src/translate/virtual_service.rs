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
use slipstream_core::route::traffic::{Fault, LoadBalancer, OutlierDetection, Retry, TrafficPolicy, MILLION};
use slipstream_core::route::{Backend, Filters, PathMatch, PathRewrite, Rewrite, RouteMatch, RouteRule, Subset};
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

mod fault;
mod http;
mod traffic;

pub use http::virtual_service;
pub use traffic::destination_rule;

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
