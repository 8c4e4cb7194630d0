//! The waypoints: Gateways of class `istio-waypoint` (other Gateways are
//! only counted), which pods are a waypoint's, and what an object is bound
//! to.

use super::by_namespace::{ByNamespace, NsState};
use super::workloads::Workloads;
use super::IndexSettings;
use crate::gateway::{genuine, render};
use crate::translate::waypoint::{self as wp, AllowedNamespaces, Binding, GatewayInput, Traffic, TrafficType, Waypoint};
use crate::translate::{Labels, PodInput};
use slipstream_core::GatewayAddress;
use std::collections::{BTreeMap, BTreeSet};

/// The Gateways the index holds.
#[derive(Default)]
pub(super) struct Waypoints {
    namespaces: ByNamespace<NsGateways>,
}

/// One namespace's.
#[derive(Default)]
struct NsGateways {
    /// Gateways of class `istio-waypoint`, by name.
    waypoints: BTreeMap<String, (TrafficType, AllowedNamespaces)>,
    /// Other Gateways (kept so the namespace is not forgotten).
    others: BTreeSet<String>,
}

impl NsState for NsGateways {
    fn is_empty(&self) -> bool {
        self.waypoints.is_empty() && self.others.is_empty()
    }
}

impl Waypoints {
    /// Stores a Gateway; whether it changed what binding reads (a Gateway
    /// written again unchanged, its status on Kubernetes, changes
    /// nothing).
    pub(super) fn set(&mut self, ns_name: &str, name: &str, g: GatewayInput) -> bool {
        let ns = self.namespaces.ns_mut(ns_name);
        let was = ns.waypoints.remove(name);
        ns.others.remove(name);
        let now = match g {
            GatewayInput::Waypoint { takes, allowed } => Some((takes, allowed)),
            GatewayInput::Other => {
                ns.others.insert(name.to_string());
                None
            }
        };
        let changed = was != now;
        if let Some(w) = now {
            ns.waypoints.insert(name.to_string(), w);
        }
        changed
    }

    /// Forgets a Gateway; whether it was a waypoint.
    pub(super) fn remove(&mut self, ns_name: &str, name: &str) -> bool {
        let Some(ns) = self.namespaces.get_mut(ns_name) else { return false };
        ns.others.remove(name);
        let was = ns.waypoints.remove(name).is_some();
        self.namespaces.forget_if_empty(ns_name);
        was
    }

    /// Whether there is any waypoint.
    pub(super) fn any(&self) -> bool {
        self.namespaces.values().any(|n| !n.waypoints.is_empty())
    }

    /// Whether `ns/name` is a waypoint Gateway.
    pub(super) fn is_waypoint(&self, ns: &str, name: &str) -> bool {
        self.namespaces.get(ns).is_some_and(|n| n.waypoints.contains_key(name))
    }

    /// Whether `ns/name` is a waypoint that takes `traffic`.
    pub(super) fn takes(&self, ns: &str, name: &str, traffic: Traffic) -> bool {
        self.namespaces.get(ns).and_then(|n| n.waypoints.get(name)).is_some_and(|(takes, _)| takes.takes(traffic))
    }

    /// The waypoints that take traffic addressed to pods, `(namespace,
    /// name)`: each has routes of its own.
    pub(super) fn taking_workloads(&self) -> impl Iterator<Item = (String, String)> + '_ {
        self.namespaces.iter().flat_map(|(n, ns)| {
            ns.waypoints.iter().filter(|(_, (takes, _))| takes.takes(Traffic::Workload)).map(move |(gw, _)| (n.clone(), gw.clone()))
        })
    }

    /// Every waypoint, as binding sees it. Always ready: binding fills the
    /// waypoint fields whether or not a pod of it is ready (the node
    /// proxy refuses the traffic until one is), so readiness changes no
    /// resource; it is reported, not published.
    pub(super) fn list(&self) -> Vec<Waypoint> {
        let mut out = Vec::new();
        for (n, ns) in &self.namespaces {
            for (name, (takes, allowed)) in &ns.waypoints {
                out.push(Waypoint { name: name.clone(), namespace: n.clone(), takes: *takes, allowed: allowed.clone(), ready: true });
            }
        }
        out
    }

    /// The pods of the waypoints, `(namespace, pod, service account)`,
    /// through the label index: a few lookups per waypoint, not a scan of
    /// the pods (this runs after every batch).
    pub(super) fn pods(&self, workloads: &Workloads, settings: &IndexSettings) -> BTreeSet<(String, String, String)> {
        let mut out = BTreeSet::new();
        for (n, ns) in &self.namespaces {
            for gw in ns.waypoints.keys() {
                for p in workloads.labelled(n, wp::GATEWAY_NAME_LABEL, gw) {
                    if self.not_waypoint_pod(p, settings).is_none() {
                        out.insert((n.clone(), p.name.clone(), gw.clone()));
                    }
                }
            }
        }
        out
    }

    /// Whether a pod labelled as waypoint `gw`'s is one; why not
    /// otherwise. A waypoint's pod is labelled with the Gateway's name,
    /// runs as the Gateway's account (a waypoint runs as its Gateway's
    /// name) and, on Kubernetes, runs the controller's rendered template
    /// (`gateway::genuine`: labels, owners and accounts are written by
    /// whoever creates the pod).
    pub(super) fn not_waypoint_pod(&self, pod: &PodInput, settings: &IndexSettings) -> Option<String> {
        let Some(gw) = pod.labels.get(wp::GATEWAY_NAME_LABEL) else { return Some("it has no gateway-name label".into()) };
        if !self.is_waypoint(&pod.namespace, gw) {
            return Some(format!("there is no waypoint Gateway {gw}"));
        }
        if pod.service_account != *gw {
            return Some(format!("it runs as service account {}, not {gw}", pod.service_account));
        }
        let template = settings.waypoint_template.as_ref()?;
        let Some(spec) = pod.waypoint_spec.as_deref() else { return Some("its spec is unknown".into()) };
        // The mesh root in the template is whatever the root was when the
        // pod was made (a rotation rolls the Deployment): public, and
        // only ever used to verify the control plane at the address the
        // pod dials, which is compared.
        let root = genuine::root_pem(spec).unwrap_or_default();
        let template = render::DeploySettings { root_pem: root.to_string(), ..template.clone() };
        let template = render::pod_template(gw, &template);
        genuine::differs(spec, &template["spec"]).map(|field| format!("its {field} differs from waypoint {gw}'s template"))
    }
}

/// The waypoint an object of namespace `namespace` (labelled
/// `ns_labels`) with `labels` is bound to: named whether or not the
/// binding is in force (fail closed: a binding that was asked for and
/// cannot hold sends the traffic nowhere, never around the waypoint).
pub(super) fn waypoint_of(
    settings: &IndexSettings,
    traffic: Traffic,
    namespace: &str,
    ns_labels: &Labels,
    labels: &Labels,
    waypoints: &[Waypoint],
) -> Option<GatewayAddress> {
    let is_waypoint = labels.contains_key(wp::GATEWAY_NAME_LABEL);
    match wp::bind(traffic, namespace, labels, ns_labels, is_waypoint, waypoints) {
        Binding::None => None,
        Binding::Bound { namespace, name, .. } => {
            Some(GatewayAddress { hostname: settings.hostname(&name, &namespace), namespace, hbone_mtls_port: wp::HBONE_LISTENER_PORT })
        }
        // Asked for and not in force: named, with no port, so no node
        // proxy can reach it (NO_WAYPOINT) and the waypoint does not
        // serve it (it does not exist yet, its listener does not allow
        // the namespace, or it does not take that kind of traffic).
        Binding::Refused { namespace, name, .. } => {
            Some(GatewayAddress { hostname: settings.hostname(&name, &namespace), namespace, hbone_mtls_port: 0 })
        }
    }
}

#[cfg(test)]
mod tests;
