//! The policies: AuthorizationPolicies (with an index of their selectors),
//! PeerAuthentications, RequestAuthentications with the key sets fetched
//! for them (the waypoints' JWT rules), and network policies, resolved
//! against the pods held.

use super::by_namespace::{ByNamespace, NsState};
use super::selector::SelectorIndex;
use super::workloads::Workloads;
use super::IndexSettings;
use crate::resources::{ResourceKey, Versioned};
use crate::translate::authorization::PolicyInput;
use crate::translate::network_policy::{NetPolicyInput, PodView};
use crate::translate::peer_authentication::PeerAuthnInput;
use crate::translate::request_authentication::{Fetch, KeySource, RequestAuthnInput, Target};
use crate::translate::{selector_matches, Labels};
use slipstream_api::netpol::net_policy_any;
use slipstream_api::TypeUrl;
use slipstream_core::route::JwtRule;
use std::collections::BTreeMap;

/// The policies the index holds.
#[derive(Default)]
pub(super) struct Policies {
    namespaces: ByNamespace<NsPolicies>,
    /// NetworkPolicies and CiliumNetworkPolicies by resource name
    /// (`Kind/namespace/name`). Their selectors can reach any pod of any
    /// namespace, so a change of a pod's labels, addresses, service
    /// account or named ports, or of a namespace's labels, resolves them
    /// all again (a resource whose bytes did not change is not pushed).
    net: BTreeMap<String, NetPolicyInput>,
    /// The JWKS the control plane fetched for RequestAuthentications
    /// (`crate::jwks`), by what was fetched; absent until the first fetch
    /// succeeds (the rule then refuses every token: fail closed).
    jwks: BTreeMap<Fetch, String>,
}

/// One namespace's.
#[derive(Default)]
struct NsPolicies {
    authorization: BTreeMap<String, PolicyInput>,
    by_selector: SelectorIndex,
    peer_authns: BTreeMap<String, PeerAuthnInput>,
    request_authns: BTreeMap<String, RequestAuthnInput>,
}

impl NsState for NsPolicies {
    fn is_empty(&self) -> bool {
        self.authorization.is_empty() && self.peer_authns.is_empty() && self.request_authns.is_empty()
    }
}

static NO_PEER_AUTHNS: BTreeMap<String, PeerAuthnInput> = BTreeMap::new();

impl Policies {
    /// Stores (Some) or forgets (None) an AuthorizationPolicy; the one it
    /// was.
    pub(super) fn set_authorization(&mut self, ns_name: &str, name: &str, new: Option<PolicyInput>) -> Option<PolicyInput> {
        let ns = self.namespaces.ns_mut(ns_name);
        let old = ns.authorization.remove(name);
        if let Some(old) = &old {
            ns.by_selector.remove(name, old.selector.as_ref());
        }
        if let Some(p) = new {
            ns.by_selector.insert(name, p.selector.as_ref());
            ns.authorization.insert(name.to_string(), p);
        }
        self.namespaces.forget_if_empty(ns_name);
        old
    }

    pub(super) fn authorization(&self, ns: &str, name: &str) -> Option<&PolicyInput> {
        self.namespaces.get(ns)?.authorization.get(name)
    }

    /// A namespace's AuthorizationPolicies, by name.
    pub(super) fn authorizations<'a>(&'a self, ns: &str) -> impl Iterator<Item = (&'a String, &'a PolicyInput)> + 'a {
        self.namespaces.get(ns).into_iter().flat_map(|n| n.authorization.iter())
    }

    /// Every AuthorizationPolicy, `(namespace, name)`.
    pub(super) fn all_authorizations(&self) -> impl Iterator<Item = (String, String)> + '_ {
        self.namespaces.iter().flat_map(|(n, ns)| ns.authorization.keys().map(move |p| (n.clone(), p.clone())))
    }

    /// The names of the AuthorizationPolicies of `ns` that select a pod
    /// with `labels` and have something for node proxies.
    pub(super) fn selecting<'a>(&'a self, ns: &str, labels: &'a Labels) -> impl Iterator<Item = &'a String> + 'a {
        let ns = self.namespaces.get(ns);
        ns.into_iter().flat_map(move |ns| {
            ns.by_selector.candidates(labels).filter(move |name| {
                ns.authorization
                    .get(*name)
                    .is_some_and(|p| p.policy.is_some() && p.selector.as_ref().is_some_and(|s| selector_matches(s, labels)))
            })
        })
    }

    /// Whether a pod's labels can change what a waypoint decides: some
    /// selector-bound policy has rules that need L7.
    pub(super) fn any_selected_l7_rules(&self) -> bool {
        self.namespaces.values().flat_map(|n| n.authorization.values()).any(|p| p.selected_l7.as_ref().is_some_and(|(_, r)| !r.is_empty()))
    }

    /// Whether a waypoint can evaluate every selector-bound and
    /// namespace-wide policy of `ns_name` (and of the root namespace) at
    /// L7: one it cannot (an attribute such as `destination.ip`) keeps
    /// their L7 versions from it, so that it never decides with a partial
    /// set; it then decides them all with the node proxies' engine.
    pub(super) fn waypoint_can_decide(&self, ns_name: &str, root: &str) -> bool {
        [ns_name, root]
            .iter()
            .filter_map(|n| self.namespaces.get(*n))
            .flat_map(|ns| ns.authorization.values())
            .filter(|p| p.policy.is_some())
            .all(|p| p.selected_l7.is_some())
    }

    /// Stores (Some) or forgets (None) a PeerAuthentication; the one it
    /// was.
    pub(super) fn set_peer_authn(&mut self, ns_name: &str, name: &str, new: Option<PeerAuthnInput>) -> Option<PeerAuthnInput> {
        let ns = self.namespaces.ns_mut(ns_name);
        let old = ns.peer_authns.remove(name);
        if let Some(p) = new {
            ns.peer_authns.insert(name.to_string(), p);
        }
        self.namespaces.forget_if_empty(ns_name);
        old
    }

    /// A namespace's PeerAuthentications, by name.
    pub(super) fn peer_authns(&self, ns: &str) -> &BTreeMap<String, PeerAuthnInput> {
        self.namespaces.get(ns).map_or(&NO_PEER_AUTHNS, |n| &n.peer_authns)
    }

    /// Stores a RequestAuthentication; whether it changed.
    pub(super) fn set_request_authn(&mut self, ns_name: &str, name: &str, a: RequestAuthnInput) -> bool {
        let ns = self.namespaces.ns_mut(ns_name);
        let changed = ns.request_authns.get(name) != Some(&a);
        ns.request_authns.insert(name.to_string(), a);
        changed
    }

    /// Forgets a RequestAuthentication; whether there was one.
    pub(super) fn remove_request_authn(&mut self, ns_name: &str, name: &str) -> bool {
        let Some(ns) = self.namespaces.get_mut(ns_name) else { return false };
        let had = ns.request_authns.remove(name).is_some();
        self.namespaces.forget_if_empty(ns_name);
        had
    }

    /// What the RequestAuthentications that apply somewhere need fetched
    /// (their `jwksUri`).
    pub(super) fn fetches(&self) -> impl Iterator<Item = Fetch> + '_ {
        self.namespaces
            .values()
            .flat_map(|ns| ns.request_authns.values())
            .filter(|a| a.inert.is_none())
            .flat_map(|a| a.rules.iter().filter_map(|r| r.keys.fetch()))
    }

    /// A fetch's result (None: none to be had); whether it changed what
    /// is held.
    pub(super) fn set_jwks(&mut self, fetch: &Fetch, jwks: Option<String>) -> bool {
        match jwks {
            Some(j) => self.jwks.insert(fetch.clone(), j.clone()).as_ref() != Some(&j),
            None => self.jwks.remove(fetch).is_some(),
        }
    }

    /// Forgets the key sets no rule needs any more.
    pub(super) fn retain_jwks(&mut self, wanted: impl Fn(&Fetch) -> bool) {
        self.jwks.retain(|f, _| wanted(f));
    }

    /// The JWT rules of the RequestAuthentications that target the Service
    /// `ns_name/service` or the waypoint Gateway `gateway` (namespace,
    /// name), each with its JWKS (inline, or as fetched: empty until then).
    pub(super) fn jwt_rules_for(&self, ns_name: &str, service: Option<&str>, gateway: Option<(&str, &str)>) -> Vec<JwtRule> {
        let mut out = Vec::new();
        let mut add = |n: &str, pick: &dyn Fn(&Target) -> bool| {
            let Some(ns) = self.namespaces.get(n) else { return };
            for a in ns.request_authns.values().filter(|a| a.targets.iter().any(pick)) {
                for r in &a.rules {
                    let mut rule = r.rule.clone();
                    if r.keys != KeySource::Inline {
                        rule.jwks = r.keys.fetch().and_then(|f| self.jwks.get(&f)).cloned().unwrap_or_default();
                    }
                    out.push(rule);
                }
            }
        };
        if let Some(svc) = service {
            add(ns_name, &|t| matches!(t, Target::Service(s) if s == svc));
        }
        if let Some((gw_ns, gw)) = gateway {
            add(gw_ns, &|t| matches!(t, Target::Gateway(g) if g == gw));
        }
        // As Istio: ordered by issuer (stable: then by policy).
        out.sort_by(|a, b| (&a.issuer, &a.policy).cmp(&(&b.issuer, &b.policy)));
        out
    }

    /// Stores (Some) or forgets (None) a network policy by resource name;
    /// whether its resource must be computed again.
    pub(super) fn set_net(&mut self, key: &str, new: Option<NetPolicyInput>) -> bool {
        match new {
            Some(p) => {
                self.net.insert(key.to_string(), p);
                true
            }
            None => self.net.remove(key).is_some(),
        }
    }

    /// Every network policy's resource name.
    pub(super) fn net_keys(&self) -> impl Iterator<Item = &String> {
        self.net.keys()
    }

    /// The resources of the network policies `keys` (None for one no
    /// longer held), resolved against the pods now held.
    pub(super) fn resolve_net(
        &self,
        keys: Vec<String>,
        workloads: &Workloads,
        settings: &IndexSettings,
    ) -> Vec<(ResourceKey, Option<Versioned>)> {
        if keys.is_empty() {
            return Vec::new();
        }
        let mut views: Vec<PodView> = workloads
            .all_pods()
            .filter(|(_, p)| !(p.ips.is_empty() || p.terminal || p.host_network))
            .map(|(ns_name, p)| PodView {
                uid: settings.workload_uid(ns_name, &p.name),
                namespace: ns_name,
                namespace_labels: workloads.labels(ns_name),
                service_account: &p.service_account,
                labels: &p.labels,
                ips: &p.ips,
                named_ports: p.container_ports.iter().filter_map(|c| Some((c.name.as_deref()?, c.port))).collect(),
            })
            .collect();
        views.sort_by(|a, b| a.uid.cmp(&b.uid));
        keys.into_iter()
            .map(|key| {
                let v = self.net.get(&key).map(|p| Versioned::new(net_policy_any(&p.resolve(&views))));
                (ResourceKey::new(TypeUrl::NetworkPolicy, &key), v)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
