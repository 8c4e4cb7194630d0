//! What the waypoints route by: HTTPRoutes and GRPCRoutes, VirtualServices,
//! DestinationRules and LocalRateLimitPolicies, with the lookups that pick
//! the ones a service gets.

use super::by_namespace::{ByNamespace, NsState};
use crate::translate::http_route::HttpRouteInput;
use crate::translate::rate_limit::{RateLimitInput, Target};
use crate::translate::virtual_service::{DestinationRuleInput, VirtualServiceInput};
use slipstream_core::route::{LimitScope, RateLimit, RouteRule};
use std::collections::BTreeMap;

/// The routing objects the index holds.
#[derive(Default)]
pub(super) struct Routes {
    namespaces: ByNamespace<NsRoutes>,
}

/// One namespace's.
#[derive(Default)]
struct NsRoutes {
    /// HTTPRoutes by name, GRPCRoutes by [`grpc_key`].
    http_routes: BTreeMap<String, HttpRouteInput>,
    virtual_services: BTreeMap<String, VirtualServiceInput>,
    destination_rules: BTreeMap<String, DestinationRuleInput>,
    rate_limits: BTreeMap<String, RateLimitInput>,
}

impl NsState for NsRoutes {
    fn is_empty(&self) -> bool {
        self.http_routes.is_empty() && self.virtual_services.is_empty() && self.destination_rules.is_empty() && self.rate_limits.is_empty()
    }
}

/// Where a GRPCRoute is kept among the HTTPRoutes (a `/` is in no name).
pub(super) fn grpc_key(name: &str) -> String {
    format!("grpc/{name}")
}

/// Stores (Some) or forgets (None) `name` in `map`; whether it changed.
fn replace<T: PartialEq>(map: &mut BTreeMap<String, T>, name: &str, new: Option<T>) -> bool {
    match new {
        Some(v) => {
            let changed = map.get(name) != Some(&v);
            map.insert(name.to_string(), v);
            changed
        }
        None => map.remove(name).is_some(),
    }
}

impl Routes {
    /// Stores (Some) or forgets (None) an HTTPRoute (or a GRPCRoute under
    /// [`grpc_key`]); the one it was.
    pub(super) fn set_http_route(&mut self, ns_name: &str, key: &str, new: Option<HttpRouteInput>) -> Option<HttpRouteInput> {
        let ns = self.namespaces.ns_mut(ns_name);
        let old = ns.http_routes.remove(key);
        if let Some(h) = new {
            ns.http_routes.insert(key.to_string(), h);
        }
        self.namespaces.forget_if_empty(ns_name);
        old
    }

    /// Stores (Some) or forgets (None) a VirtualService; whether it changed.
    pub(super) fn set_virtual_service(&mut self, ns_name: &str, name: &str, new: Option<VirtualServiceInput>) -> bool {
        let changed = replace(&mut self.namespaces.ns_mut(ns_name).virtual_services, name, new);
        self.namespaces.forget_if_empty(ns_name);
        changed
    }

    /// Stores (Some) or forgets (None) a DestinationRule; whether it
    /// changed.
    pub(super) fn set_destination_rule(&mut self, ns_name: &str, name: &str, new: Option<DestinationRuleInput>) -> bool {
        let changed = replace(&mut self.namespaces.ns_mut(ns_name).destination_rules, name, new);
        self.namespaces.forget_if_empty(ns_name);
        changed
    }

    /// Stores (Some) or forgets (None) a LocalRateLimitPolicy; whether it
    /// changed.
    pub(super) fn set_rate_limit(&mut self, ns_name: &str, name: &str, new: Option<RateLimitInput>) -> bool {
        let changed = replace(&mut self.namespaces.ns_mut(ns_name).rate_limits, name, new);
        self.namespaces.forget_if_empty(ns_name);
        changed
    }

    /// The HTTPRoutes and GRPCRoutes of a namespace, by key.
    pub(super) fn http_routes(&self, ns: &str) -> Vec<&HttpRouteInput> {
        self.namespaces.get(ns).map(|n| n.http_routes.values().collect()).unwrap_or_default()
    }

    /// Whether a DestinationRule defines subsets (a pod's labels then
    /// decide which it is in).
    pub(super) fn any_subsets(&self) -> bool {
        self.namespaces.values().flat_map(|n| n.destination_rules.values()).any(|d| !d.subsets.is_empty())
    }

    /// The VirtualService for the service of key `service` (namespace
    /// `service_ns`): one in the service's own namespace first, else any;
    /// among several, the oldest, then by `namespace/name` (Istio merges
    /// none for the mesh and takes the oldest).
    pub(super) fn virtual_service_for(&self, service: &str, service_ns: &str) -> Option<&VirtualServiceInput> {
        self.namespaces
            .values()
            .flat_map(|n| n.virtual_services.values())
            .filter(|v| v.hosts.iter().any(|h| h == service) && !v.rules.is_empty())
            .min_by(|a, b| {
                (a.namespace != service_ns, &a.creation, &a.namespace, &a.name).cmp(&(
                    b.namespace != service_ns,
                    &b.creation,
                    &b.namespace,
                    &b.name,
                ))
            })
    }

    /// The DestinationRule for the service of key `service`: by name
    /// before a wildcard, the service's namespace first, then the oldest.
    pub(super) fn destination_rule_for(&self, service: &str) -> Option<&DestinationRuleInput> {
        let service_ns = service.split_once('/').map_or("", |(n, _)| n);
        self.namespaces.values().flat_map(|n| n.destination_rules.values()).filter(|d| d.applies(service) > 0).min_by(|a, b| {
            (std::cmp::Reverse(a.applies(service)), a.namespace != service_ns, &a.creation, &a.namespace, &a.name).cmp(&(
                std::cmp::Reverse(b.applies(service)),
                b.namespace != service_ns,
                &b.creation,
                &b.namespace,
                &b.name,
            ))
        })
    }

    /// The LocalRateLimitPolicies that reach the service `ns/name`: those
    /// naming it, and those naming a route one of its `rules` came from.
    pub(super) fn rate_limits_for(&self, ns: &str, name: &str, rules: &[RouteRule]) -> Vec<RateLimit> {
        let mut out = Vec::new();
        for p in self.namespaces.values().flat_map(|n| n.rate_limits.values()) {
            let whole = p.namespace == ns && p.targets.iter().any(|t| matches!(t, Target::Service(s) if s == name));
            let scope = if whole {
                LimitScope::Service
            } else {
                let (routes, exact) = p.rule_scope();
                let reaches = rules.iter().any(|r| exact.contains(&r.name) || routes.iter().any(|x| r.name.starts_with(x.as_str())));
                if !reaches {
                    continue;
                }
                LimitScope::Rules { routes, rules: exact }
            };
            out.push(RateLimit {
                policy: format!("{}/{}", p.namespace, p.name),
                requests: p.requests,
                interval: p.interval,
                burst: p.burst,
                scope,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests;
