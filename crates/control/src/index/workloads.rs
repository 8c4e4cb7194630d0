//! Namespaces, pods and service accounts, with the lookups events need:
//! pods per namespace by label pair and by address, so that a selector or
//! an EndpointSlice finds its pods without a scan of the namespace.

use super::by_namespace::{ByNamespace, NsState};
use crate::translate::{selector_matches, Labels, NamespaceInput, PodInput, SliceInput};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

/// The namespaces and pods the index holds.
#[derive(Default)]
pub(super) struct Workloads {
    namespaces: ByNamespace<NsWorkloads>,
}

/// One namespace's.
#[derive(Default)]
struct NsWorkloads {
    /// None until the Namespace object is seen (objects may come first).
    namespace: Option<NamespaceInput>,
    pods: HashMap<String, PodInput>,
    pods_by_label: HashMap<(String, String), HashSet<String>>,
    pods_by_ip: HashMap<IpAddr, BTreeSet<String>>,
    service_accounts: BTreeSet<String>,
}

impl NsState for NsWorkloads {
    fn is_empty(&self) -> bool {
        self.namespace.is_none() && self.pods.is_empty() && self.service_accounts.is_empty()
    }
}

static NO_LABELS: Labels = Labels::new();

impl Workloads {
    /// Sets the Namespace object; whether its labels changed (or it is
    /// new).
    pub(super) fn set_namespace(&mut self, name: &str, n: NamespaceInput) -> bool {
        let ns = self.namespaces.ns_mut(name);
        let changed = ns.namespace.as_ref().is_none_or(|old| old.labels != n.labels);
        ns.namespace = Some(n);
        changed
    }

    /// Forgets the Namespace object (not its pods); whether it had labels.
    pub(super) fn remove_namespace(&mut self, name: &str) -> bool {
        let Some(ns) = self.namespaces.get_mut(name) else { return false };
        let had_labels = ns.namespace.take().is_some_and(|n| !n.labels.is_empty());
        self.namespaces.forget_if_empty(name);
        had_labels
    }

    /// A namespace's labels (none until its object is seen).
    pub(super) fn labels(&self, ns: &str) -> &Labels {
        self.namespaces.get(ns).and_then(|n| n.namespace.as_ref()).map_or(&NO_LABELS, |n| &n.labels)
    }

    pub(super) fn add_service_account(&mut self, ns: &str, name: &str) {
        self.namespaces.ns_mut(ns).service_accounts.insert(name.to_string());
    }

    pub(super) fn remove_service_account(&mut self, ns: &str, name: &str) {
        if let Some(n) = self.namespaces.get_mut(ns) {
            n.service_accounts.remove(name);
        }
        self.namespaces.forget_if_empty(ns);
    }

    /// Stores a pod; the one it replaces.
    pub(super) fn upsert_pod(&mut self, p: PodInput) -> Option<PodInput> {
        let ns = self.namespaces.ns_mut(&p.namespace);
        let old = ns.remove_pod(&p.name);
        for kv in &p.labels {
            ns.pods_by_label.entry((kv.0.clone(), kv.1.clone())).or_default().insert(p.name.clone());
        }
        for ip in &p.ips {
            ns.pods_by_ip.entry(*ip).or_default().insert(p.name.clone());
        }
        ns.pods.insert(p.name.clone(), p);
        old
    }

    /// Forgets a pod; the one it was.
    pub(super) fn remove_pod(&mut self, ns: &str, name: &str) -> Option<PodInput> {
        let old = self.namespaces.get_mut(ns)?.remove_pod(name);
        self.namespaces.forget_if_empty(ns);
        old
    }

    pub(super) fn pod(&self, ns: &str, name: &str) -> Option<&PodInput> {
        self.namespaces.get(ns)?.pods.get(name)
    }

    /// A namespace's pods, in no order.
    pub(super) fn pods<'a>(&'a self, ns: &str) -> impl Iterator<Item = &'a PodInput> + 'a {
        self.namespaces.get(ns).into_iter().flat_map(|n| n.pods.values())
    }

    /// Every pod, `(namespace, pod)`.
    pub(super) fn all_pods(&self) -> impl Iterator<Item = (&String, &PodInput)> {
        self.namespaces.iter().flat_map(|(n, ns)| ns.pods.values().map(move |p| (n, p)))
    }

    /// The namespaces that have pods or objects of their own here.
    pub(super) fn namespaces(&self) -> impl Iterator<Item = &String> {
        self.namespaces.keys()
    }

    /// The pods of `ns` labelled `key: value`.
    pub(super) fn labelled<'a>(&'a self, ns: &str, key: &str, value: &str) -> impl Iterator<Item = &'a PodInput> + 'a {
        let ns = self.namespaces.get(ns);
        let names = ns.and_then(|n| n.pods_by_label.get(&(key.to_string(), value.to_string())));
        names.into_iter().flatten().filter_map(move |name| ns?.pods.get(name))
    }

    /// The pods of `ns` that `selector` matches, from the shortest posting
    /// list of its pairs.
    pub(super) fn pods_matching(&self, ns: &str, selector: &Labels, out: &mut BTreeSet<String>) {
        let Some(ns) = self.namespaces.get(ns) else { return };
        if selector.is_empty() {
            out.extend(ns.pods.keys().cloned());
            return;
        }
        let lists: Option<Vec<&HashSet<String>>> = selector.iter().map(|(k, v)| ns.pods_by_label.get(&(k.clone(), v.clone()))).collect();
        let Some(shortest) = lists.and_then(|l| l.into_iter().min_by_key(|s| s.len())) else { return };
        out.extend(shortest.iter().filter(|n| ns.pods.get(*n).is_some_and(|p| selector_matches(selector, &p.labels))).cloned());
    }

    /// The pods of `ns` an EndpointSlice names (by target or address).
    pub(super) fn pods_in_slice(&self, ns: &str, s: &SliceInput, out: &mut BTreeSet<String>) {
        let Some(ns) = self.namespaces.get(ns) else { return };
        for e in &s.endpoints {
            out.extend(e.pod.iter().filter(|p| ns.pods.contains_key(*p)).cloned());
            for ip in &e.addresses {
                out.extend(ns.pods_by_ip.get(ip).into_iter().flatten().cloned());
            }
        }
    }
}

impl NsWorkloads {
    fn remove_pod(&mut self, name: &str) -> Option<PodInput> {
        let p = self.pods.remove(name)?;
        for kv in &p.labels {
            let k = (kv.0.clone(), kv.1.clone());
            if let Some(set) = self.pods_by_label.get_mut(&k) {
                set.remove(name);
                if set.is_empty() {
                    self.pods_by_label.remove(&k);
                }
            }
        }
        for ip in &p.ips {
            if let Some(set) = self.pods_by_ip.get_mut(ip) {
                set.remove(name);
                if set.is_empty() {
                    self.pods_by_ip.remove(ip);
                }
            }
        }
        Some(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::testing::{pod, slice};

    fn held() -> Workloads {
        let mut w = Workloads::default();
        w.upsert_pod(pod("a", "web-1", "app: web, version: v1", "10.0.0.1"));
        w.upsert_pod(pod("a", "web-2", "app: web, version: v2", "10.0.0.2"));
        w.upsert_pod(pod("a", "db-1", "app: db", "10.0.0.3"));
        w.upsert_pod(pod("b", "web-1", "app: web", "10.0.1.1"));
        w
    }

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// A namespace, a selector, the pods expected.
    type Case = (&'static str, &'static [(&'static str, &'static str)], &'static [&'static str]);

    #[test]
    fn selectors_find_the_pods_of_their_namespace() {
        let w = held();
        let cases: &[Case] = &[
            ("a", &[("app", "web")], &["web-1", "web-2"]),
            ("a", &[("app", "web"), ("version", "v2")], &["web-2"]),
            ("a", &[("app", "web"), ("version", "v3")], &[]),
            ("a", &[], &["db-1", "web-1", "web-2"]),
            ("b", &[("app", "web")], &["web-1"]),
            ("c", &[], &[]),
        ];
        for (ns, sel, want) in cases {
            let mut out = BTreeSet::new();
            w.pods_matching(ns, &labels(sel), &mut out);
            assert_eq!(out.iter().map(String::as_str).collect::<Vec<_>>(), *want, "{ns} {sel:?}");
        }
    }

    #[test]
    fn slices_name_pods_by_target_or_address() {
        let mut w = held();
        let cases = [
            (slice("a", "s", "svc", "web-1", "10.0.0.9"), vec!["web-1"]),
            (slice("a", "s", "svc", "gone", "10.0.0.3"), vec!["db-1"]),
            (slice("a", "s", "svc", "gone", "10.0.0.9"), vec![]),
        ];
        for (s, want) in &cases {
            let mut out = BTreeSet::new();
            w.pods_in_slice("a", s, &mut out);
            assert_eq!(out.iter().map(String::as_str).collect::<Vec<_>>(), *want, "{s:?}");
        }
        // A pod's old address is forgotten when it moves.
        w.upsert_pod(pod("a", "db-1", "app: db", "10.0.0.7"));
        let mut out = BTreeSet::new();
        w.pods_in_slice("a", &cases[1].0, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn a_namespace_is_forgotten_once_empty_and_labels_report_changes() {
        let mut w = held();
        assert!(w.set_namespace("c", NamespaceInput { labels: labels(&[("x", "1")]), use_waypoint: None }));
        assert!(!w.set_namespace("c", NamespaceInput { labels: labels(&[("x", "1")]), use_waypoint: None }));
        assert_eq!(w.labels("c"), &labels(&[("x", "1")]));
        assert!(w.remove_namespace("c"));
        assert_eq!(w.labels("c"), &Labels::new());
        assert!(w.remove_pod("b", "web-1").is_some());
        assert_eq!(w.namespaces().collect::<Vec<_>>(), ["a"]);
        assert_eq!(w.labelled("a", "app", "web").count(), 2);
    }
}
