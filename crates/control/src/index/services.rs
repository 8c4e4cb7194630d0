//! Services and EndpointSlices, with the lookups a pod's workload needs:
//! the services whose selector may match its labels, those without a
//! selector (their members come from EndpointSlices), and each service's
//! slices.

use super::by_namespace::{ByNamespace, NsState};
use super::selector::SelectorIndex;
use crate::translate::{Labels, PodInput, ServiceInput, SliceInput, TargetPort};
use slipstream_core::Port;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The services and endpoint slices the index holds.
#[derive(Default)]
pub(super) struct Services {
    namespaces: ByNamespace<NsServices>,
}

/// One namespace's.
#[derive(Default)]
struct NsServices {
    services: BTreeMap<String, ServiceInput>,
    by_selector: SelectorIndex,
    selectorless: BTreeSet<String>,
    slices: HashMap<String, SliceInput>,
    slices_by_service: HashMap<String, BTreeSet<String>>,
}

impl NsState for NsServices {
    fn is_empty(&self) -> bool {
        self.services.is_empty() && self.slices.is_empty()
    }
}

impl Services {
    /// Stores (Some) or forgets (None) the service `ns/name`; the one it
    /// was.
    pub(super) fn set(&mut self, ns_name: &str, name: &str, new: Option<ServiceInput>) -> Option<ServiceInput> {
        let ns = self.namespaces.ns_mut(ns_name);
        let old = ns.services.remove(name);
        if let Some(old) = &old {
            ns.by_selector.remove(name, old.selector.as_ref());
            ns.selectorless.remove(name);
        }
        if let Some(s) = new {
            if s.selector.is_none() {
                ns.selectorless.insert(name.to_string());
            }
            ns.by_selector.insert(name, s.selector.as_ref());
            ns.services.insert(name.to_string(), s);
        }
        self.namespaces.forget_if_empty(ns_name);
        old
    }

    pub(super) fn get(&self, ns: &str, name: &str) -> Option<&ServiceInput> {
        self.namespaces.get(ns)?.services.get(name)
    }

    /// The services of a namespace, by name.
    pub(super) fn of<'a>(&'a self, ns: &str) -> impl Iterator<Item = &'a ServiceInput> + 'a {
        self.namespaces.get(ns).into_iter().flat_map(|n| n.services.values())
    }

    /// The names of a namespace's services.
    pub(super) fn names<'a>(&'a self, ns: &str) -> impl Iterator<Item = &'a String> + 'a {
        self.namespaces.get(ns).into_iter().flat_map(|n| n.services.keys())
    }

    /// Every service, `(namespace, name)`.
    pub(super) fn all(&self) -> impl Iterator<Item = (String, String)> + '_ {
        self.namespaces.iter().flat_map(|(n, ns)| ns.services.keys().map(move |s| (n.clone(), s.clone())))
    }

    /// The services of `ns` that may have a pod with `labels`: those whose
    /// selector may match (checked in full by the caller) and those
    /// without a selector.
    pub(super) fn candidates<'a>(&'a self, ns: &str, labels: &'a Labels) -> BTreeSet<&'a String> {
        let Some(ns) = self.namespaces.get(ns) else { return BTreeSet::new() };
        let mut out: BTreeSet<&String> = ns.by_selector.candidates(labels).collect();
        out.extend(ns.selectorless.iter());
        out
    }

    /// Stores (Some) or forgets (None) an EndpointSlice; the one it was.
    pub(super) fn set_slice(&mut self, ns_name: &str, name: &str, new: Option<SliceInput>) -> Option<SliceInput> {
        let ns = self.namespaces.ns_mut(ns_name);
        let old = ns.slices.remove(name);
        if let Some(svc) = old.as_ref().and_then(|s| s.service.as_ref()) {
            if let Some(set) = ns.slices_by_service.get_mut(svc) {
                set.remove(name);
                if set.is_empty() {
                    ns.slices_by_service.remove(svc);
                }
            }
        }
        if let Some(s) = new {
            if let Some(svc) = &s.service {
                ns.slices_by_service.entry(svc.clone()).or_default().insert(name.to_string());
            }
            ns.slices.insert(name.to_string(), s);
        }
        self.namespaces.forget_if_empty(ns_name);
        old
    }

    /// The EndpointSlices of the service `ns/service`.
    pub(super) fn slices_of<'a>(&'a self, ns: &str, service: &str) -> impl Iterator<Item = &'a SliceInput> + 'a {
        let ns = self.namespaces.get(ns);
        let names = ns.and_then(|n| n.slices_by_service.get(service));
        names.into_iter().flatten().filter_map(move |name| ns?.slices.get(name))
    }

    /// The ports of a service without selector on one pod, if one of its
    /// EndpointSlices names the pod: each service port maps to the slice
    /// port of the same name and protocol (a number target port stands
    /// when the slice has none).
    pub(super) fn slice_ports(&self, s: &ServiceInput, pod: &PodInput) -> Option<Vec<Port>> {
        let ns = self.namespaces.get(&s.namespace)?;
        let names = ns.slices_by_service.get(&s.name)?;
        let slice = names.iter().filter_map(|n| ns.slices.get(n)).find(|sl| {
            sl.endpoints.iter().any(|e| e.pod.as_deref() == Some(pod.name.as_str()) || e.addresses.iter().any(|a| pod.ips.contains(a)))
        })?;
        Some(
            s.ports
                .iter()
                .filter_map(|p| {
                    let from_slice = slice.ports.iter().find(|sp| sp.name == p.name && sp.protocol == p.protocol).map(|sp| sp.port);
                    let target = from_slice.or(match p.target {
                        TargetPort::Number(n) => Some(n),
                        TargetPort::Named(_) => None,
                    })?;
                    Some(Port { service_port: p.port, target_port: target, app_protocol: p.app_protocol })
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::testing::{pod, service, slice};

    #[test]
    fn candidates_are_selecting_services_and_those_without_selector() {
        let mut s = Services::default();
        s.set("a", "web", Some(service("a", "web", "app: web")));
        s.set("a", "db", Some(service("a", "db", "app: db")));
        s.set("a", "ext", Some(service("a", "ext", "")));
        s.set("b", "web", Some(service("b", "web", "app: web")));
        let cases: &[(&str, &str, &[&str])] =
            &[("a", "app: web", &["ext", "web"]), ("a", "app: other", &["ext"]), ("b", "app: web", &["web"]), ("c", "app: web", &[])];
        for (ns, labels, want) in cases {
            let p = pod(ns, "p", labels, "10.0.0.1");
            let got: Vec<&str> = s.candidates(ns, &p.labels).into_iter().map(String::as_str).collect();
            assert_eq!(got, *want, "{ns} {labels}");
        }
        assert!(s.set("a", "ext", None).is_some());
        assert_eq!(s.candidates("a", &Labels::new()).len(), 0);
        assert_eq!(s.all().count(), 3);
    }

    #[test]
    fn a_selectorless_service_takes_its_ports_from_the_slice_naming_the_pod() {
        let mut s = Services::default();
        let ext = service("a", "ext", "");
        s.set("a", "ext", Some(ext.clone()));
        s.set_slice("a", "ext-1", Some(slice("a", "ext-1", "ext", "p1", "10.0.0.1")));
        let cases = [
            (pod("a", "p1", "x: y", "10.9.9.9"), Some(9090)),
            (pod("a", "p2", "x: y", "10.0.0.1"), Some(9090)),
            (pod("a", "p3", "x: y", "10.0.0.3"), None),
        ];
        for (p, want) in &cases {
            let got = s.slice_ports(&ext, p).map(|ports| ports.iter().map(|p| p.target_port).collect::<Vec<_>>());
            assert_eq!(got, want.map(|t| vec![t]), "{}", p.name);
        }
        assert_eq!(s.slices_of("a", "ext").count(), 1);
        assert!(s.set_slice("a", "ext-1", None).is_some());
        assert_eq!(s.slices_of("a", "ext").count(), 0);
    }
}
