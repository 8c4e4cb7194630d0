//! The policy engine: pure, no I/O. Two layers decide a connection and
//! both must allow it (docs/authorization.md):
//!
//! - the network-policy layer ([`network`]): Kubernetes NetworkPolicy and
//!   CiliumNetworkPolicy, for every pod, at both ends (egress of the source,
//!   ingress of the destination);
//! - the Istio layer (this module): AuthorizationPolicy and the policies
//!   converted from PeerAuthentication, in the ambient workload API's shape
//!   (`istio.security.Authorization`, docs/protocols.md section 4), for
//!   meshed destinations only.
//!
//! Every answer names what decided it (kind, namespace/name, rule). The
//! node proxy, `slipstream policy check` and the kernel datapath (which may
//! only deny what this denies) all ask this module.

pub mod l7;
pub mod network;

use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::IpAddr;

/// The kinds of policy a decision can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PolicyKind {
    AuthorizationPolicy,
    PeerAuthentication,
    NetworkPolicy,
    CiliumNetworkPolicy,
}

impl PolicyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::AuthorizationPolicy => "AuthorizationPolicy",
            PolicyKind::PeerAuthentication => "PeerAuthentication",
            PolicyKind::NetworkPolicy => "NetworkPolicy",
            PolicyKind::CiliumNetworkPolicy => "CiliumNetworkPolicy",
        }
    }
}

/// A policy, and the rule of it that decided (`spec.rules[2]`,
/// `spec.ingress[0]`, `spec.ingressDeny[1]`); no rule when the policy
/// decided as a whole (an ALLOW policy none of whose rules matched).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PolicyRule {
    pub kind: PolicyKind,
    pub namespace: String,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
}

impl PolicyRule {
    pub fn new(kind: PolicyKind, namespace: &str, name: &str, rule: Option<String>) -> PolicyRule {
        PolicyRule { kind, namespace: namespace.to_string(), name: name.to_string(), rule }
    }
}

impl fmt::Display for PolicyRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.kind.as_str(), self.namespace, self.name)?;
        if let Some(r) = &self.rule {
            write!(f, " {r}")?;
        }
        Ok(())
    }
}

/// Why a layer answered as it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// No policy of this layer applies: allowed.
    NoPolicy,
    /// The layer does not govern this connection (the Istio layer and a
    /// destination outside the mesh): allowed.
    NotApplicable,
    /// An allow rule matched.
    AllowRule,
    /// Only DENY policies apply and none matched: allowed.
    NoRuleMatched,
    /// A deny rule matched.
    DenyRule,
    /// Allow policies apply (or the pod is isolated) and none matched.
    NoAllowMatched,
}

/// One layer's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerVerdict {
    pub allowed: bool,
    pub reason: Reason,
    /// The rule that decided, for `AllowRule` and `DenyRule`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<PolicyRule>,
    /// For `NoAllowMatched`: the policies that required an allow (the
    /// first [`MAX_CANDIDATES`]; `more_candidates` counts the rest).
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub candidates: Vec<PolicyRule>,
    #[serde(skip_serializing_if = "is_zero", default)]
    pub more_candidates: usize,
}

/// How many policies a denial for want of an allow names.
pub const MAX_CANDIDATES: usize = 8;

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl LayerVerdict {
    pub fn no_policy() -> LayerVerdict {
        LayerVerdict { allowed: true, reason: Reason::NoPolicy, by: None, candidates: Vec::new(), more_candidates: 0 }
    }
    pub fn not_applicable() -> LayerVerdict {
        LayerVerdict { allowed: true, reason: Reason::NotApplicable, by: None, candidates: Vec::new(), more_candidates: 0 }
    }
    pub fn decided(allowed: bool, reason: Reason, by: PolicyRule) -> LayerVerdict {
        LayerVerdict { allowed, reason, by: Some(by), candidates: Vec::new(), more_candidates: 0 }
    }
    /// Denied: policies required an allow and none matched.
    pub fn no_allow_matched(total: usize, first: impl Iterator<Item = PolicyRule>) -> LayerVerdict {
        let candidates: Vec<PolicyRule> = first.take(MAX_CANDIDATES).collect();
        let more_candidates = total - candidates.len();
        LayerVerdict { allowed: false, reason: Reason::NoAllowMatched, by: None, candidates, more_candidates }
    }

    /// One line for logs: `denied by AuthorizationPolicy prod/deny-legacy
    /// spec.rules[0]`, `no ALLOW matched (NetworkPolicy prod/a, ...)`.
    pub fn explain(&self) -> String {
        match (&self.reason, &self.by) {
            (Reason::NoPolicy, _) => "no policy applies".into(),
            (Reason::NoRuleMatched, _) => "no DENY rule matched and no ALLOW policy applies".into(),
            (Reason::NotApplicable, _) => "not governed (destination outside the mesh)".into(),
            (Reason::AllowRule, Some(by)) => format!("allowed by {by}"),
            (Reason::DenyRule, Some(by)) => format!("denied by {by}"),
            (Reason::NoAllowMatched, _) => {
                let mut names: Vec<String> = self.candidates.iter().map(|c| c.to_string()).collect();
                if self.more_candidates > 0 {
                    names.push(format!("and {} more", self.more_candidates));
                }
                format!("no allow rule matched ({})", names.join(", "))
            }
            (r, None) => format!("{r:?}"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Scope {
    /// Applies to every workload (policies of the root namespace).
    #[default]
    Global,
    /// Applies to the workloads of the policy's namespace.
    Namespace,
    /// Applies to the workloads that list it in `authorization_policies`.
    WorkloadSelector,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Action {
    #[default]
    Allow,
    Deny,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StringMatch {
    Exact(String),
    Prefix(String),
    Suffix(String),
    /// Any value, as long as there is one.
    Presence,
}

impl StringMatch {
    fn matches(&self, v: Option<&str>) -> bool {
        match (self, v) {
            (_, None) => false,
            (StringMatch::Exact(e), Some(v)) => e == v,
            (StringMatch::Prefix(p), Some(v)) => v.starts_with(p.as_str()),
            (StringMatch::Suffix(s), Some(v)) => v.ends_with(s.as_str()),
            (StringMatch::Presence, Some(_)) => true,
        }
    }
}

/// An address block (`address/length`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cidr {
    pub address: IpAddr,
    pub length: u8,
}

impl Cidr {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.address, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => prefix_eq(&n.octets(), &a.octets(), self.length.min(32)),
            (IpAddr::V6(n), IpAddr::V6(a)) => prefix_eq(&n.octets(), &a.octets(), self.length.min(128)),
            _ => false,
        }
    }
}

fn prefix_eq(a: &[u8], b: &[u8], bits: u8) -> bool {
    let full = (bits / 8) as usize;
    if a[..full] != b[..full] {
        return false;
    }
    let rem = bits % 8;
    rem == 0 || (a[full] ^ b[full]) >> (8 - rem) == 0
}

/// Inside one match, different fields are ANDed and the values of one field
/// are ORed. A match with no field set is skipped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct Match {
    pub namespaces: Vec<StringMatch>,
    pub not_namespaces: Vec<StringMatch>,
    /// Principals without `spiffe://` (`cluster.local/ns/default/sa/sleep`).
    pub principals: Vec<StringMatch>,
    pub not_principals: Vec<StringMatch>,
    pub source_ips: Vec<Cidr>,
    pub not_source_ips: Vec<Cidr>,
    pub destination_ips: Vec<Cidr>,
    pub not_destination_ips: Vec<Cidr>,
    pub destination_ports: Vec<u16>,
    pub not_destination_ports: Vec<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Clause {
    pub matches: Vec<Match>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Rule {
    pub clauses: Vec<Clause>,
}

impl Rule {
    /// A rule that matches no connection: it holds the place of a rule of
    /// the manifest that cannot apply here (an ALLOW rule that needs L7,
    /// `ipBlocks` and `remoteIpBlocks` that do not meet), so that the rules
    /// that follow keep their index (`spec.rules[i]`) in explanations. In
    /// the workload API's own terms (any source address, and none), so any
    /// consumer of it reads it the same way.
    pub fn never() -> Rule {
        let all = vec![Cidr { address: IpAddr::from([0u8; 4]), length: 0 }, Cidr { address: IpAddr::from([0u8; 16]), length: 0 }];
        Rule { clauses: vec![Clause { matches: vec![Match { source_ips: all.clone(), not_source_ips: all, ..Default::default() }] }] }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Authorization {
    pub name: String,
    pub namespace: String,
    #[serde(default)]
    pub scope: Scope,
    #[serde(default)]
    pub action: Action,
    #[serde(default)]
    pub rules: Vec<Rule>,
    #[serde(default)]
    pub dry_run: bool,
}

impl Authorization {
    /// Resource name in the workload API: `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// What an inbound connection looks like to policy.
#[derive(Debug, Clone)]
pub struct ConnAttrs<'a> {
    /// Verified peer principal without `spiffe://`; None for plaintext.
    pub principal: Option<&'a str>,
    /// Namespace of the verified identity; None for plaintext.
    pub namespace: Option<&'a str>,
    pub source_ip: IpAddr,
    pub destination_ip: IpAddr,
    pub destination_port: u16,
    /// What a request adds, where there is one (the waypoint). None at L4:
    /// the translation has already settled every rule that needs it
    /// (docs/authorization.md, "L7 fields at L4").
    pub request: Option<&'a RequestAttrs>,
}

/// The L7 attributes of one request, for the waypoint's rules (methods,
/// paths, hosts, request principals, `request.*` conditions). Designed now
/// so the engine's input does not change shape then; nothing at L4 reads
/// it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestAttrs {
    pub method: String,
    pub host: String,
    pub path: String,
    /// `iss/sub` of a validated JWT.
    pub request_principal: Option<String>,
    /// Lower-case names.
    pub headers: Vec<(String, String)>,
}

impl Match {
    fn is_empty(&self) -> bool {
        self.namespaces.is_empty()
            && self.not_namespaces.is_empty()
            && self.principals.is_empty()
            && self.not_principals.is_empty()
            && self.source_ips.is_empty()
            && self.not_source_ips.is_empty()
            && self.destination_ips.is_empty()
            && self.not_destination_ips.is_empty()
            && self.destination_ports.is_empty()
            && self.not_destination_ports.is_empty()
    }

    fn matches(&self, c: &ConnAttrs) -> bool {
        let any_str = |ms: &[StringMatch], v: Option<&str>| ms.iter().any(|m| m.matches(v));
        let any_ip = |cs: &[Cidr], ip: IpAddr| cs.iter().any(|n| n.contains(ip));
        (self.namespaces.is_empty() || any_str(&self.namespaces, c.namespace))
            && (self.not_namespaces.is_empty() || !any_str(&self.not_namespaces, c.namespace))
            && (self.principals.is_empty() || any_str(&self.principals, c.principal))
            && (self.not_principals.is_empty() || !any_str(&self.not_principals, c.principal))
            && (self.source_ips.is_empty() || any_ip(&self.source_ips, c.source_ip))
            && (self.not_source_ips.is_empty() || !any_ip(&self.not_source_ips, c.source_ip))
            && (self.destination_ips.is_empty() || any_ip(&self.destination_ips, c.destination_ip))
            && (self.not_destination_ips.is_empty() || !any_ip(&self.not_destination_ips, c.destination_ip))
            && (self.destination_ports.is_empty() || self.destination_ports.contains(&c.destination_port))
            && (self.not_destination_ports.is_empty() || !self.not_destination_ports.contains(&c.destination_port))
    }
}

impl Clause {
    /// Any of its matches; a clause whose matches are all empty holds.
    fn matches(&self, c: &ConnAttrs) -> bool {
        let mut any_set = false;
        for m in &self.matches {
            if m.is_empty() {
                continue;
            }
            if m.matches(c) {
                return true;
            }
            any_set = true;
        }
        !any_set
    }
}

impl Authorization {
    /// Rules are ORed, clauses of a rule ANDed; no rule matches nothing.
    pub fn matches(&self, c: &ConnAttrs) -> bool {
        self.rules.iter().any(|r| r.clauses.iter().all(|cl| cl.matches(c)))
    }
}

/// The prefix of the policies converted from PeerAuthentication.
pub const CONVERTED_PEER_AUTHN_PREFIX: &str = "istio_converted_";

impl Authorization {
    fn kind(&self) -> PolicyKind {
        if self.name.starts_with(CONVERTED_PEER_AUTHN_PREFIX) {
            PolicyKind::PeerAuthentication
        } else {
            PolicyKind::AuthorizationPolicy
        }
    }

    fn rule_ref(&self, rule: Option<usize>) -> PolicyRule {
        PolicyRule::new(self.kind(), &self.namespace, &self.name, rule.map(|i| format!("spec.rules[{i}]")))
    }

    /// The index of the first rule that matches.
    fn matching_rule(&self, c: &ConnAttrs) -> Option<usize> {
        self.rules.iter().position(|r| r.clauses.iter().all(|cl| cl.matches(c)))
    }
}

/// The Istio layer: denied if a DENY policy matches; else, if any ALLOW
/// policy applies, one must match; with none, allowed. Dry-run policies
/// never decide; those that would have matched go to `dry_run_hits`. When
/// several rules could decide, the answer names the first in the order
/// given (`MeshState::policies_for` gives them by key).
pub fn evaluate<'p>(
    policies: impl IntoIterator<Item = &'p Authorization>,
    c: &ConnAttrs,
    dry_run_hits: &mut Vec<PolicyRule>,
) -> LayerVerdict {
    let mut allows: Vec<&Authorization> = Vec::new();
    let mut allowed_by = None;
    let mut any = false;
    for p in policies {
        let m = p.matching_rule(c);
        if p.dry_run {
            if let Some(i) = m {
                dry_run_hits.push(p.rule_ref(Some(i)));
            }
            continue;
        }
        any = true;
        match (p.action, m) {
            (Action::Deny, Some(i)) => return LayerVerdict::decided(false, Reason::DenyRule, p.rule_ref(Some(i))),
            (Action::Deny, None) => {}
            (Action::Allow, Some(i)) => {
                allowed_by.get_or_insert_with(|| p.rule_ref(Some(i)));
            }
            (Action::Allow, None) => allows.push(p),
        }
    }
    match allowed_by {
        Some(by) => LayerVerdict::decided(true, Reason::AllowRule, by),
        None if !allows.is_empty() => LayerVerdict::no_allow_matched(allows.len(), allows.iter().map(|p| p.rule_ref(None))),
        None if any => LayerVerdict { reason: Reason::NoRuleMatched, ..LayerVerdict::no_policy() },
        None => LayerVerdict::no_policy(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(principal: Option<&str>, port: u16) -> ConnAttrs<'_> {
        ConnAttrs {
            principal,
            namespace: principal.map(|p| p.split('/').nth(2).unwrap_or("")),
            source_ip: "10.244.1.2".parse().unwrap(),
            destination_ip: "10.244.2.2".parse().unwrap(),
            destination_port: port,
            request: None,
        }
    }

    fn policy(action: Action, m: Match) -> Authorization {
        Authorization {
            name: "p".into(),
            namespace: "default".into(),
            action,
            rules: vec![Rule { clauses: vec![Clause { matches: vec![m] }] }],
            ..Default::default()
        }
    }

    fn strict() -> Authorization {
        policy(Action::Deny, Match { not_principals: vec![StringMatch::Presence], ..Default::default() })
    }

    #[test]
    fn strict_mtls_denies_plaintext_only() {
        let mut d = vec![];
        let v = evaluate([&strict()], &conn(None, 8080), &mut d);
        assert_eq!((v.allowed, v.reason), (false, Reason::DenyRule));
        assert_eq!(v.by.unwrap().to_string(), "AuthorizationPolicy default/p spec.rules[0]");
        assert!(evaluate([&strict()], &conn(Some("cluster.local/ns/default/sa/client"), 8080), &mut d).allowed);
    }

    #[test]
    fn port_level_exception() {
        let mut p = strict();
        p.rules[0].clauses[0].matches[0].not_destination_ports = vec![9000];
        let mut d = vec![];
        assert!(!evaluate([&p], &conn(None, 8080), &mut d).allowed);
        assert!(evaluate([&p], &conn(None, 9000), &mut d).allowed);
    }

    #[test]
    fn allow_semantics() {
        let allow_client = policy(
            Action::Allow,
            Match { principals: vec![StringMatch::Exact("cluster.local/ns/default/sa/client".into())], ..Default::default() },
        );
        let mut d = vec![];
        assert_eq!(evaluate([&allow_client], &conn(Some("cluster.local/ns/default/sa/client"), 1), &mut d).reason, Reason::AllowRule);
        let v = evaluate([&allow_client], &conn(Some("cluster.local/ns/default/sa/other"), 1), &mut d);
        assert_eq!((v.allowed, v.reason), (false, Reason::NoAllowMatched));
        assert_eq!(v.explain(), "no allow rule matched (AuthorizationPolicy default/p)");
        // No rules: an ALLOW policy that matches nothing denies all.
        let empty = Authorization { action: Action::Allow, ..Default::default() };
        assert!(!evaluate([&empty], &conn(Some("x"), 1), &mut d).allowed);
        // An empty rule (no clauses) matches everything.
        let all = Authorization { action: Action::Allow, rules: vec![Rule::default()], ..Default::default() };
        assert!(evaluate([&all], &conn(None, 1), &mut d).allowed);
        // No policy: allowed.
        assert_eq!(evaluate([], &conn(None, 1), &mut d), LayerVerdict::no_policy());
    }

    #[test]
    fn fields_and_values() {
        let m = Match {
            namespaces: vec![StringMatch::Exact("default".into()), StringMatch::Exact("prod".into())],
            destination_ports: vec![8080],
            ..Default::default()
        };
        let deny = policy(Action::Deny, m);
        let mut d = vec![];
        assert!(!evaluate([&deny], &conn(Some("cluster.local/ns/prod/sa/a"), 8080), &mut d).allowed);
        assert!(evaluate([&deny], &conn(Some("cluster.local/ns/prod/sa/a"), 9090), &mut d).allowed, "fields are ANDed");
        assert!(evaluate([&deny], &conn(Some("cluster.local/ns/dev/sa/a"), 8080), &mut d).allowed);
    }

    #[test]
    fn dry_run_never_decides() {
        let mut p = strict();
        p.dry_run = true;
        let mut d = vec![];
        assert!(evaluate([&p], &conn(None, 1), &mut d).allowed);
        assert_eq!(d, vec![PolicyRule::new(PolicyKind::AuthorizationPolicy, "default", "p", Some("spec.rules[0]".into()))]);
    }

    #[test]
    fn cidrs() {
        let c = Cidr { address: "10.244.0.0".parse().unwrap(), length: 16 };
        assert!(c.contains("10.244.7.1".parse().unwrap()));
        assert!(!c.contains("10.245.0.1".parse().unwrap()));
        assert!(Cidr { address: "10.0.0.0".parse().unwrap(), length: 0 }.contains("192.0.2.1".parse().unwrap()));
        assert!(Cidr { address: "10.244.1.128".parse().unwrap(), length: 25 }.contains("10.244.1.200".parse().unwrap()));
        assert!(!Cidr { address: "10.244.1.128".parse().unwrap(), length: 25 }.contains("10.244.1.100".parse().unwrap()));
    }
}
