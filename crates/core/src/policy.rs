//! Authorization as the ambient workload API carries it
//! (`istio.security.Authorization`, shared/PROTOCOLS.md section 4), and its
//! evaluation. Pure: the node proxy calls `check` on every inbound
//! connection; the kernel datapath may only deny what this denies.

use serde::{Deserialize, Serialize};
use std::net::IpAddr;

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
}

impl Match {
    fn is_empty(&self) -> bool {
        *self == Match::default()
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
    fn matches(&self, c: &ConnAttrs) -> bool {
        let set: Vec<&Match> = self.matches.iter().filter(|m| !m.is_empty()).collect();
        set.is_empty() || set.iter().any(|m| m.matches(c))
    }
}

impl Authorization {
    /// Rules are ORed, clauses of a rule ANDed; no rule matches nothing.
    pub fn matches(&self, c: &ConnAttrs) -> bool {
        self.rules.iter().any(|r| r.clauses.iter().all(|cl| cl.matches(c)))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Denied, naming the policy that decided (or the missing ALLOW).
    Deny(String),
}

/// Evaluates the applicable policies: denied if any DENY matches; else, if
/// any ALLOW applies, one must match; with none, allowed. Dry-run policies
/// are reported through `dry_run_hits` and never decide.
pub fn check<'p>(policies: impl IntoIterator<Item = &'p Authorization>, c: &ConnAttrs, dry_run_hits: &mut Vec<String>) -> Decision {
    let mut allows = 0;
    let mut allowed = false;
    for p in policies {
        let m = p.matches(c);
        if p.dry_run {
            if m {
                dry_run_hits.push(p.key());
            }
            continue;
        }
        match p.action {
            Action::Deny if m => return Decision::Deny(format!("denied by {}", p.key())),
            Action::Deny => {}
            Action::Allow => {
                allows += 1;
                allowed |= m;
            }
        }
    }
    if allows > 0 && !allowed {
        return Decision::Deny("no ALLOW policy matched".into());
    }
    Decision::Allow
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
        assert!(matches!(check([&strict()], &conn(None, 8080), &mut d), Decision::Deny(_)));
        assert_eq!(check([&strict()], &conn(Some("cluster.local/ns/default/sa/client"), 8080), &mut d), Decision::Allow);
    }

    #[test]
    fn port_level_exception() {
        let mut p = strict();
        p.rules[0].clauses[0].matches[0].not_destination_ports = vec![9000];
        let mut d = vec![];
        assert!(matches!(check([&p], &conn(None, 8080), &mut d), Decision::Deny(_)));
        assert_eq!(check([&p], &conn(None, 9000), &mut d), Decision::Allow);
    }

    #[test]
    fn allow_semantics() {
        let allow_client = policy(
            Action::Allow,
            Match { principals: vec![StringMatch::Exact("cluster.local/ns/default/sa/client".into())], ..Default::default() },
        );
        let mut d = vec![];
        assert_eq!(check([&allow_client], &conn(Some("cluster.local/ns/default/sa/client"), 1), &mut d), Decision::Allow);
        assert_eq!(
            check([&allow_client], &conn(Some("cluster.local/ns/default/sa/other"), 1), &mut d),
            Decision::Deny("no ALLOW policy matched".into())
        );
        // No rules: an ALLOW policy that matches nothing denies all.
        let empty = Authorization { action: Action::Allow, ..Default::default() };
        assert!(matches!(check([&empty], &conn(Some("x"), 1), &mut d), Decision::Deny(_)));
        // An empty rule (no clauses) matches everything.
        let all = Authorization { action: Action::Allow, rules: vec![Rule::default()], ..Default::default() };
        assert_eq!(check([&all], &conn(None, 1), &mut d), Decision::Allow);
        // No policy: allowed.
        assert_eq!(check([], &conn(None, 1), &mut d), Decision::Allow);
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
        assert!(matches!(check([&deny], &conn(Some("cluster.local/ns/prod/sa/a"), 8080), &mut d), Decision::Deny(_)));
        assert_eq!(check([&deny], &conn(Some("cluster.local/ns/prod/sa/a"), 9090), &mut d), Decision::Allow, "fields are ANDed");
        assert_eq!(check([&deny], &conn(Some("cluster.local/ns/dev/sa/a"), 8080), &mut d), Decision::Allow);
    }

    #[test]
    fn dry_run_never_decides() {
        let mut p = strict();
        p.dry_run = true;
        let mut d = vec![];
        assert_eq!(check([&p], &conn(None, 1), &mut d), Decision::Allow);
        assert_eq!(d, vec!["default/p"]);
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
