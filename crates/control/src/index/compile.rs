//! The waypoints' routes resources (`slipstream.route.v1.ServiceRoutes`),
//! read from the views: per service its HTTPRoutes (or VirtualService),
//! DestinationRule, rate limits, the L7 policies and JWT rules a waypoint
//! enforces on it; per waypoint that takes pod traffic, its own.

use super::derive::Views;
use crate::translate::authorization::PolicyInput;
use crate::translate::http_route;
use crate::translate::virtual_service as vs;
use crate::translate::waypoint::Traffic;
use crate::translate::{self, selector_matches, PodInput, ServiceInput};
use slipstream_core::policy::l7::L7Policy;
use slipstream_core::route::{ServiceRoutes, Subset};
use slipstream_core::GatewayAddress;
use std::collections::{BTreeMap, BTreeSet};

/// The routes resource of the service `ns_name/name` (or of a waypoint's
/// own name: see [`waypoint_own_policies`]), None when it has nothing for
/// a waypoint.
pub(super) fn service_routes(v: &Views, ns_name: &str, name: &str, hostname: &str) -> Option<ServiceRoutes> {
    let own = waypoint_own_policies(v, ns_name, name);
    let Some(svc) = v.services.get(ns_name, name) else {
        // A waypoint whose Service is not there (yet): its own routes.
        let jwt_rules = v.policies.jwt_rules_for(ns_name, None, Some((ns_name, name)));
        return (!own.is_empty() || !jwt_rules.is_empty()).then(|| ServiceRoutes {
            service: format!("{ns_name}/{hostname}"),
            policies: own,
            jwt_rules,
            ..Default::default()
        });
    };
    let mut compiled = http_route::compile(&v.routes.http_routes(ns_name), ns_name, name, hostname, &v.settings.domain_suffix);
    let service_key = format!("{ns_name}/{hostname}");
    // HTTPRoutes first (Gateway API is what the waypoint is for); without
    // them, the oldest VirtualService naming the service.
    if compiled.rules.is_empty() {
        if let Some(vsi) = v.routes.virtual_service_for(&service_key, ns_name) {
            compiled.rules = vs::compile(vsi, &|svc: &str, subset_name: &str| subset(v, svc, subset_name));
            compiled.source = "VirtualService".into();
        }
    }
    if let Some(d) = v.routes.destination_rule_for(&service_key) {
        compiled.traffic = vs::TrafficInput::merged(d.traffic.as_ref(), None);
    }
    compiled.limits = v.routes.rate_limits_for(ns_name, name, &compiled.rules);
    // The waypoint in force for this service, (namespace, name).
    let gateway = v
        .waypoint_of(Traffic::Service, ns_name, &svc.labels)
        .filter(|g| g.hbone_mtls_port != 0)
        .map(|g| (g.namespace.clone(), g.hostname.split('.').next().unwrap_or("").to_string()));
    let mut policies = service_policies(v, ns_name, svc, gateway.as_ref());
    policies.extend(own);
    compiled.policies = policies;
    // RequestAuthentications: those naming the service, those naming the
    // waypoint it is bound to, and (for a waypoint's own name: the
    // requests addressed to its pods) those naming that waypoint.
    let mut jwt_rules = v.policies.jwt_rules_for(ns_name, Some(name), gateway.as_ref().map(|(n, g)| (n.as_str(), g.as_str())));
    if v.waypoints.is_waypoint(ns_name, name) && gateway.as_ref().is_none_or(|(n, g)| n != ns_name || g != name) {
        jwt_rules.extend(v.policies.jwt_rules_for(ns_name, None, Some((ns_name, name))));
    }
    compiled.jwt_rules = jwt_rules;
    (!compiled.rules.is_empty()
        || !compiled.policies.is_empty()
        || compiled.traffic != Default::default()
        || !compiled.limits.is_empty()
        || !compiled.jwt_rules.is_empty())
    .then_some(compiled)
}

/// The waypoint's policies on the service `svc`: those naming it, those
/// naming the waypoint `gateway` it is bound to, and (through a waypoint)
/// its pods' own selector-bound ones.
fn service_policies(v: &Views, ns_name: &str, svc: &ServiceInput, gateway: Option<&(String, String)>) -> Vec<L7Policy> {
    let mut policies = Vec::new();
    for (_, p) in v.policies.authorizations(ns_name) {
        if let Some(l7) = p.l7.as_ref().filter(|l7| l7.services.contains(&svc.name)) {
            policies.push(l7.policy.clone());
        }
    }
    let Some((gw_ns, gw)) = gateway else { return policies };
    for l7 in v.policies.authorizations(gw_ns).filter_map(|(_, p)| p.l7.as_ref()) {
        if l7.gateways.contains(gw) && !policies.contains(&l7.policy) {
            policies.push(l7.policy.clone());
        }
    }
    policies.extend(selected_policies_at_waypoint(v, ns_name, svc));
    policies
}

/// The selector-bound and namespace-wide policies a waypoint enforces on
/// requests to `svc`'s pods, each restricted to the pods it selects: all
/// of them (its namespace's and the root's) as soon as one of its
/// namespace's needs L7 for one of those pods, so that the waypoint
/// decides as the pods' own policies would, with the original client.
fn selected_policies_at_waypoint(v: &Views, ns_name: &str, svc: &ServiceInput) -> Vec<L7Policy> {
    let Some(sel) = &svc.selector else { return Vec::new() };
    let pods: Vec<&PodInput> = v.workloads.pods(ns_name).filter(|p| selector_matches(sel, &p.labels)).collect();
    selected_policies_for(v, ns_name, &pods)
}

/// The selector-bound and namespace-wide policies of `pods` (of namespace
/// `ns_name`) that a waypoint in front of them enforces: all of them as
/// soon as one needs L7 for one of those pods.
fn selected_policies_for(v: &Views, ns_name: &str, pods: &[&PodInput]) -> Vec<L7Policy> {
    let root = v.settings.root_namespace.as_str();
    let selects = |p: &PolicyInput, pod: &PodInput| p.selector.as_ref().is_none_or(|s| selector_matches(s, &pod.labels));
    // A namespace (or root) policy the waypoint cannot evaluate (an
    // attribute such as `destination.ip`) keeps them all out: the
    // waypoint then decides by the node proxies' engine, on every policy,
    // at L4 (`Shared::authorize_endpoint`).
    let needs = ns_name != root
        && v.policies.waypoint_can_decide(ns_name, root)
        && v.policies
            .authorizations(ns_name)
            .any(|(_, p)| p.selected_l7.as_ref().is_some_and(|(_, r)| !r.is_empty()) && pods.iter().any(|pod| selects(p, pod)));
    if !needs {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (_, p) in v.policies.authorizations(ns_name).chain(v.policies.authorizations(root)) {
        let Some((l7, _)) = &p.selected_l7 else { continue };
        let mut uids: Vec<String> =
            pods.iter().filter(|pod| selects(p, pod)).map(|pod| v.settings.workload_uid(ns_name, &pod.name)).collect();
        if uids.is_empty() {
            continue;
        }
        uids.sort();
        out.push(L7Policy { workloads: Some(uids), ..l7.clone() });
    }
    out
}

/// What waypoint `ns_name/gw` enforces on requests addressed to a pod
/// bound to it (`istio.io/waypoint-for: workload` or `all`): the policies
/// targeting its Gateway (as Istio), the policies targeting each Service
/// bound to it that selects the pod (stricter than Istio, which applies
/// them only to requests addressed to the Service: no pod under a
/// Service's L7 policy is reachable through the waypoint without it;
/// restricted to those pods, `L7Policy.pods`), and the pods' own
/// selector-bound and namespace-wide policies (as in front of a Service:
/// [`selected_policies_for`]). Empty for anything that is not a waypoint
/// taking workload traffic.
fn waypoint_own_policies(v: &Views, ns_name: &str, gw: &str) -> Vec<L7Policy> {
    if !v.waypoints.takes(ns_name, gw, Traffic::Workload) {
        return Vec::new();
    }
    let hostname = v.settings.hostname(gw, ns_name);
    let is_me = |g: &GatewayAddress| g.hbone_mtls_port != 0 && g.namespace == ns_name && g.hostname == hostname;
    let mut out: Vec<L7Policy> = v
        .policies
        .authorizations(ns_name)
        .filter_map(|(_, p)| p.l7.as_ref())
        .filter(|l7| l7.gateways.iter().any(|g| g == gw))
        .map(|l7| l7.policy.clone())
        .collect();
    for n in v.workloads.namespaces() {
        let ns_labels = v.workloads.labels(n);
        let bound: Vec<&PodInput> = v
            .workloads
            .pods(n)
            .filter(|p| !p.host_network && translate::is_meshed(ns_labels, &p.labels))
            .filter(|p| v.waypoint_of(Traffic::Workload, n, &p.labels).is_some_and(|g| is_me(&g)))
            .collect();
        if bound.is_empty() {
            continue;
        }
        let mut by_policy: BTreeMap<&str, (L7Policy, BTreeSet<String>)> = BTreeMap::new();
        for s in v.services.of(n) {
            let Some(sel) = &s.selector else { continue };
            if !v.waypoint_of(Traffic::Service, n, &s.labels).is_some_and(|g| is_me(&g)) {
                continue;
            }
            let uids: Vec<String> =
                bound.iter().filter(|p| selector_matches(sel, &p.labels)).map(|p| v.settings.workload_uid(n, &p.name)).collect();
            if uids.is_empty() {
                continue;
            }
            for (pname, p) in v.policies.authorizations(n) {
                let Some(l7) = p.l7.as_ref().filter(|l7| l7.services.contains(&s.name)) else { continue };
                by_policy.entry(pname).or_insert_with(|| (l7.policy.clone(), BTreeSet::new())).1.extend(uids.iter().cloned());
            }
        }
        out.extend(by_policy.into_values().map(|(p, uids)| L7Policy { pods: Some(uids.into_iter().collect()), ..p }));
        out.extend(selected_policies_for(v, n, &bound));
    }
    out
}

/// A subset of a service's DestinationRule: the UIDs of the pods of the
/// service's namespace whose labels it selects, and its merged traffic
/// policy. A subset no rule defines selects nothing (the waypoint answers
/// 503, as Envoy does for a missing cluster).
fn subset(v: &Views, service: &str, name: &str) -> Subset {
    let mut out = Subset { name: name.to_string(), ..Default::default() };
    let Some(d) = v.routes.destination_rule_for(service) else { return out };
    let Some(s) = d.subsets.iter().find(|s| s.name == name) else { return out };
    let service_ns = service.split_once('/').map_or("", |(n, _)| n);
    let mut uids: Vec<String> = v
        .workloads
        .pods(service_ns)
        .filter(|p| selector_matches(&s.labels, &p.labels))
        .map(|p| v.settings.workload_uid(service_ns, &p.name))
        .collect();
    uids.sort();
    out.workloads = uids;
    out.traffic = s.traffic.as_ref().map(|t| vs::TrafficInput::merged(d.traffic.as_ref(), Some(t)));
    out
}
