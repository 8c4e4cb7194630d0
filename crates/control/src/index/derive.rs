//! The workload API's resources, read from the views: a pod's workload
//! (with its services, policies and waypoint) and converted
//! PeerAuthentication, a service's address, an AuthorizationPolicy as node
//! proxies get it.

use super::policies::Policies;
use super::routes::Routes;
use super::services::Services;
use super::waypoints::{self, Waypoints};
use super::workloads::Workloads;
use super::IndexSettings;
use crate::resources::Versioned;
use crate::translate::authorization::PolicyInput;
use crate::translate::peer_authentication;
use crate::translate::waypoint::{self as wp, Traffic, Waypoint};
use crate::translate::{self, selector_matches, Labels, PodInput, ServiceInput};
use slipstream_api::convert::to_any;
use slipstream_api::{workload as wl, TypeUrl};
use slipstream_core::policy::Authorization;
use slipstream_core::{GatewayAddress, NetworkAddress, Port, Service, TunnelProtocol, Workload, WorkloadStatus};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The index's views, read-only, and the waypoints as binding sees them.
pub(super) struct Views<'a> {
    pub(super) settings: &'a IndexSettings,
    pub(super) workloads: &'a Workloads,
    pub(super) services: &'a Services,
    pub(super) policies: &'a Policies,
    pub(super) routes: &'a Routes,
    pub(super) waypoints: &'a Waypoints,
    pub(super) mesh: Option<&'a slipstream_core::mesh::MeshSettings>,
    /// Every waypoint (`Waypoints::list`).
    pub(super) list: Vec<Waypoint>,
}

impl Views<'_> {
    /// The waypoint an object of `namespace` with `labels` is bound to
    /// (`waypoints::waypoint_of`).
    pub(super) fn waypoint_of(&self, traffic: Traffic, namespace: &str, labels: &Labels) -> Option<GatewayAddress> {
        waypoints::waypoint_of(self.settings, traffic, namespace, self.workloads.labels(namespace), labels, &self.list)
    }

    /// A service's address resource.
    pub(super) fn service_resource(&self, s: &ServiceInput, hostname: &str) -> Versioned {
        let svc = Service {
            name: s.name.clone(),
            namespace: s.namespace.clone(),
            hostname: hostname.to_string(),
            addresses: s.addresses.iter().map(|a| NetworkAddress { network: String::new(), address: *a }).collect(),
            ports: s
                .ports
                .iter()
                .map(|p| Port { service_port: p.port, target_port: p.wire_target(), app_protocol: p.app_protocol })
                .collect(),
            subject_alt_names: Vec::new(),
            waypoint: self.waypoint_of(Traffic::Service, &s.namespace, &s.labels),
        };
        let msg = wl::Address { r#type: Some(wl::address::Type::Service((&svc).into())) };
        Versioned::new(to_any(TypeUrl::Address, &msg))
    }

    /// Whether a pod labelled as a waypoint's is one (logged when not).
    fn is_waypoint_pod(&self, pod: &PodInput) -> bool {
        let Some(gw) = pod.labels.get(wp::GATEWAY_NAME_LABEL).filter(|gw| self.waypoints.is_waypoint(&pod.namespace, gw)) else {
            return false;
        };
        match self.waypoints.not_waypoint_pod(pod, self.settings) {
            None => true,
            Some(why) => {
                tracing::warn!(
                    pod = %format!("{}/{}", pod.namespace, pod.name),
                    "a pod labelled as waypoint {gw}'s is not one ({why}): it gets no certificate, no configuration and no traffic for the waypoint"
                );
                false
            }
        }
    }

    /// The services a pod is an endpoint of, by key, with their ports on
    /// it.
    fn pod_services(&self, pod: &PodInput, waypoint_pod: bool) -> BTreeMap<String, Vec<Port>> {
        let mut services = BTreeMap::new();
        for name in self.services.candidates(&pod.namespace, &pod.labels) {
            let Some(s) = self.services.get(&pod.namespace, name) else { continue };
            // A waypoint's own Service has only the waypoint's pods as
            // endpoints: a pod that only looks like one is no replica.
            if self.waypoints.is_waypoint(&pod.namespace, &s.name) && !waypoint_pod {
                continue;
            }
            let ports = match &s.selector {
                Some(sel) if selector_matches(sel, &pod.labels) => s
                    .ports
                    .iter()
                    .filter_map(|p| Some(Port { service_port: p.port, target_port: p.target_on(pod)?, app_protocol: p.app_protocol }))
                    .collect(),
                Some(_) => continue,
                None => match self.services.slice_ports(s, pod) {
                    Some(ports) => ports,
                    None => continue,
                },
            };
            services.insert(format!("{}/{}", s.namespace, self.settings.hostname(&s.name, &s.namespace)), ports);
        }
        services
    }

    /// The keys of the policies of a meshed pod: the selector-bound ones
    /// of its namespace and the root's, and its converted
    /// PeerAuthentication, which it returns.
    fn pod_policies(&self, pod: &PodInput, policies: &mut BTreeSet<String>) -> Option<Authorization> {
        let root = &self.settings.root_namespace;
        policies.extend(self.policies.selecting(&pod.namespace, &pod.labels).map(|name| format!("{}/{name}", pod.namespace)));
        if pod.namespace != *root {
            policies.extend(self.policies.selecting(root, &pod.labels).map(|name| format!("{root}/{name}")));
        }
        let converted = peer_authentication::for_pod(
            self.policies.peer_authns(&pod.namespace).iter(),
            self.policies.peer_authns(root).iter(),
            &pod.namespace,
            &pod.name,
            &pod.labels,
        );
        if let Some(c) = &converted {
            policies.insert(c.key());
        }
        converted
    }

    /// A pod's workload and its converted PeerAuthentication policy. None
    /// before it is scheduled, or once it has ended. A scheduled pod whose
    /// address the API does not know yet is published without one: its
    /// node proxy gives it the address its CNI reported, and can ask for
    /// its certificate (the CA places identities on nodes by these
    /// resources), without waiting for the kubelet to report the address
    /// (docs/kubernetes.md, "Pod start"). Every other consumer keeps it off
    /// the data path until it has one.
    pub(super) fn pod_resources(&self, pod: &PodInput) -> (Option<Versioned>, Option<Authorization>) {
        if (pod.ips.is_empty() && (pod.node.is_empty() || pod.host_network)) || pod.terminal {
            return (None, None);
        }
        let meshed = !pod.host_network && translate::is_meshed(self.workloads.labels(&pod.namespace), &pod.labels);
        let services = self.pod_services(pod, self.is_waypoint_pod(pod));
        let mut policies = BTreeSet::new();
        let converted = if meshed { self.pod_policies(pod, &mut policies) } else { None };
        let trust_domain =
            if self.settings.trust_domain == slipstream_core::DEFAULT_TRUST_DOMAIN { "" } else { &self.settings.trust_domain };
        let w = Workload {
            uid: self.settings.workload_uid(&pod.namespace, &pod.name),
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            addresses: pod.ips.clone(),
            network: String::new(),
            tunnel_protocol: if meshed { TunnelProtocol::Hbone } else { TunnelProtocol::None },
            trust_domain: trust_domain.to_string(),
            service_account: pod.service_account.clone(),
            node: pod.node.clone(),
            canonical_name: canonical(&pod.labels, &["service.istio.io/canonical-name", "app.kubernetes.io/name", "app"])
                .unwrap_or_else(|| pod.workload_name.clone()),
            canonical_revision: canonical(&pod.labels, &["service.istio.io/canonical-revision", "app.kubernetes.io/version", "version"])
                .unwrap_or_else(|| "latest".into()),
            workload_type: pod.workload_type,
            workload_name: pod.workload_name.clone(),
            services,
            authorization_policies: policies.into_iter().collect(),
            status: if pod.ready && !pod.terminating { WorkloadStatus::Healthy } else { WorkloadStatus::Unhealthy },
            cluster_id: self.settings.cluster_id.clone(),
            capacity: 1,
            // Only a meshed pod's traffic is captured, so only it can be
            // sent through a waypoint.
            waypoint: if meshed { self.waypoint_of(Traffic::Workload, &pod.namespace, &pod.labels) } else { None },
        };
        let msg = wl::Address { r#type: Some(wl::address::Type::Workload((&w).into())) };
        let mut v = Versioned::new(to_any(TypeUrl::Address, &msg));
        v.node = Some(w.node.as_str().into()).filter(|n: &Arc<str>| !n.is_empty());
        v.identity = Some(w.spiffe_id().into());
        (Some(v), converted)
    }

    /// The resource node proxies get for a policy: as written, with every
    /// waypoint let through (docs/waypoint.md, "Policy"). A waypoint
    /// decides each request or connection it forwards by the destination's
    /// own policies, with the original client (its L7 versions where the
    /// control plane gave them, `compile::selected_policies_for`, else the
    /// node proxies' engine on these very resources), so the destination's
    /// node proxy, which sees the waypoint's identity, must not decide its
    /// identity rules again on the waypoint: an ALLOW gains a rule "from a
    /// waypoint", each DENY rule a clause "not from a waypoint". Nothing
    /// that bypasses the waypoint gains by it: a direct caller is not a
    /// waypoint, and a rule that needs L7 keeps its L4 fail-safe meaning.
    pub(super) fn policy_resource(&self, p: &PolicyInput) -> Option<Authorization> {
        use slipstream_core::policy::{Action, Clause, Match, Rule, StringMatch};
        let mut a = p.policy.clone()?;
        if self.list.is_empty() {
            return Some(a);
        }
        let principals: Vec<StringMatch> = self
            .list
            .iter()
            .map(|w| StringMatch::Exact(format!("{}/ns/{}/sa/{}", self.settings.trust_domain, w.namespace, w.name)))
            .collect();
        match a.action {
            Action::Allow => a.rules.push(Rule { clauses: vec![Clause { matches: vec![Match { principals, ..Default::default() }] }] }),
            Action::Deny => {
                for rule in &mut a.rules {
                    rule.clauses.push(Clause { matches: vec![Match { not_principals: principals.clone(), ..Default::default() }] });
                }
            }
        }
        Some(a)
    }
}

/// The first of `keys` the labels have.
fn canonical(labels: &Labels, keys: &[&str]) -> Option<String> {
    keys.iter().find_map(|k| labels.get(*k).cloned())
}
