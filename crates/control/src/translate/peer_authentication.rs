//! PeerAuthentication, resolved per workload and converted the way the
//! local cluster's agent converts it today (`testbed::agent::mesh::
//! peer_authentication`), so that node proxies see the same policies
//! whether they read the agent's files or this control plane:
//!
//! - the effective mode of a workload is its workload-selector policy's
//!   (one with a non-empty `matchLabels` in its namespace), else its
//!   namespace's (no selector), else the mesh's (no selector, root
//!   namespace), else PERMISSIVE; UNSET inherits from the next level;
//! - port-level modes (workload policies only) override for their port;
//! - a workload with plaintext refused on some port gets one DENY policy
//!   `istio_converted_strict_<pod>` in its namespace, scoped to it
//!   (WORKLOAD_SELECTOR), that matches connections without a peer identity
//!   on those ports.
//!
//! When several policies of one level apply, the oldest wins (creation
//! time, then name), as in Istio; the agent takes the first applied.

use super::{selector_matches, Labels};
use crate::objects::PeerAuthentication;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use slipstream_core::policy::{Action, Authorization, Clause, Match, Rule, Scope, StringMatch};
use slipstream_k8s::istio::{MtlsMode, PeerAuthenticationSpec};

/// What the index keeps of one PeerAuthentication.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerAuthnInput {
    pub created: Option<Time>,
    pub spec: PeerAuthenticationSpec,
}

impl PeerAuthnInput {
    /// The labels it selects workloads by; None for a namespace- or
    /// mesh-wide policy.
    pub fn selector(&self) -> Option<&Labels> {
        self.spec.selector.as_ref().map(|s| &s.match_labels).filter(|l| !l.is_empty())
    }

    /// Namespace- or mesh-wide: no selector at all. (A selector with empty
    /// `matchLabels` selects nothing, as in the agent.)
    pub fn is_wide(&self) -> bool {
        self.spec.selector.is_none()
    }
}

pub fn input(p: &PeerAuthentication) -> PeerAuthnInput {
    PeerAuthnInput { created: p.metadata.creation_timestamp.clone(), spec: p.spec.clone() }
}

pub fn policy_name(pod: &str) -> String {
    format!("istio_converted_strict_{pod}")
}

/// The oldest of `candidates` (creation time, then name).
fn oldest<'a>(candidates: impl Iterator<Item = (&'a String, &'a PeerAuthnInput)>) -> Option<&'a PeerAuthnInput> {
    candidates.min_by(|a, b| (&a.1.created, a.0).cmp(&(&b.1.created, b.0))).map(|(_, p)| p)
}

/// The converted policy for one workload, if its effective mode refuses
/// plaintext on any port. `namespace` and `root` are the policies of the
/// workload's namespace and of the root namespace, by name.
pub fn for_pod<'a>(
    namespace: impl Iterator<Item = (&'a String, &'a PeerAuthnInput)> + Clone,
    root: impl Iterator<Item = (&'a String, &'a PeerAuthnInput)>,
    ns: &str,
    pod: &str,
    labels: &Labels,
) -> Option<Authorization> {
    let selected = oldest(namespace.clone().filter(|(_, p)| p.selector().is_some_and(|s| selector_matches(s, labels))));
    let ns_wide = oldest(namespace.filter(|(_, p)| p.is_wide()));
    let mesh = oldest(root.filter(|(_, p)| p.is_wide()));
    let inherit = |m: MtlsMode, parent: MtlsMode| if m == MtlsMode::Unset { parent } else { m };
    let mesh_mode = inherit(mesh.map(|p| p.spec.mode()).unwrap_or(MtlsMode::Unset), MtlsMode::Permissive);
    let ns_mode = inherit(ns_wide.map(|p| p.spec.mode()).unwrap_or(MtlsMode::Unset), mesh_mode);
    let base = inherit(selected.map(|p| p.spec.mode()).unwrap_or(MtlsMode::Unset), ns_mode);
    let ports: Vec<(u16, MtlsMode)> =
        selected.map(|p| p.spec.port_modes()).unwrap_or_default().into_iter().map(|(p, m)| (p, inherit(m, base))).collect();
    let mut m = Match { not_principals: vec![StringMatch::Presence], ..Default::default() };
    if base == MtlsMode::Strict {
        m.not_destination_ports = ports.iter().filter(|(_, md)| *md != MtlsMode::Strict).map(|(p, _)| *p).collect();
    } else {
        m.destination_ports = ports.iter().filter(|(_, md)| *md == MtlsMode::Strict).map(|(p, _)| *p).collect();
        if m.destination_ports.is_empty() {
            return None;
        }
    }
    Some(Authorization {
        name: policy_name(pod),
        namespace: ns.to_string(),
        scope: Scope::WorkloadSelector,
        action: Action::Deny,
        rules: vec![Rule { clauses: vec![Clause { matches: vec![m] }] }],
        dry_run: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn pa(spec: serde_json::Value, age: i64) -> PeerAuthnInput {
        let created = chrono_free_time(age);
        PeerAuthnInput { created: Some(created), spec: serde_json::from_value(spec).unwrap() }
    }

    /// A creation time `age` seconds after an arbitrary instant.
    fn chrono_free_time(age: i64) -> Time {
        serde_json::from_value(serde_json::json!(format!("2025-01-01T00:00:{:02}Z", age))).unwrap()
    }

    fn app(v: &str) -> Labels {
        [("app".to_string(), v.to_string())].into()
    }

    fn resolve(ns: &BTreeMap<String, PeerAuthnInput>, root: &BTreeMap<String, PeerAuthnInput>, labels: &Labels) -> Option<Match> {
        for_pod(ns.iter(), root.iter(), "demo", "p", labels).map(|a| a.rules[0].clauses[0].matches[0].clone())
    }

    #[test]
    fn levels_and_ports() {
        let none = BTreeMap::new();
        let strict_ns: BTreeMap<String, PeerAuthnInput> =
            [("default".into(), pa(serde_json::json!({"mtls": {"mode": "STRICT"}}), 0))].into();
        assert_eq!(resolve(&none, &none, &app("echo")), None, "permissive by default");
        let m = resolve(&strict_ns, &none, &app("echo")).unwrap();
        assert_eq!((m.not_principals, m.not_destination_ports), (vec![StringMatch::Presence], vec![]));
        assert!(resolve(&none, &strict_ns, &app("echo")).is_some(), "mesh-wide STRICT");
        let mut ns = strict_ns.clone();
        ns.insert(
            "echo".into(),
            pa(serde_json::json!({"selector": {"matchLabels": {"app": "echo"}}, "mtls": {"mode": "PERMISSIVE"}, "portLevelMtls": {"9000": {"mode": "STRICT"}}}), 1),
        );
        assert_eq!(resolve(&ns, &none, &app("echo")).unwrap().destination_ports, vec![9000]);
        assert!(resolve(&ns, &none, &app("web")).unwrap().destination_ports.is_empty(), "others keep the namespace's STRICT");
        // Two workload policies: the oldest decides.
        ns.insert("aaa-newer".into(), pa(serde_json::json!({"selector": {"matchLabels": {"app": "echo"}}, "mtls": {"mode": "STRICT"}}), 5));
        assert_eq!(resolve(&ns, &none, &app("echo")).unwrap().destination_ports, vec![9000]);
    }
}
