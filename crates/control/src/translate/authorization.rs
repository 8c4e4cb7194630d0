//! AuthorizationPolicy to the workload API's `Authorization`, at L4
//! (docs/protocols.md section 5). A node proxy sees connections, not
//! requests, so:
//!
//! - scope: a selector makes the policy WORKLOAD_SELECTOR (listed by the
//!   workloads it selects; in the root namespace, workloads of every
//!   namespace); otherwise it is GLOBAL in the root namespace and
//!   NAMESPACE elsewhere. A policy bound with `targetRef(s)` is a
//!   waypoint's, not a node proxy's: no Authorization resource; its L7
//!   form ([`L7Bound`], every attribute Istio has at L7) goes to the
//!   waypoint with the routes of the services it applies to.
//! - action: ALLOW and DENY; AUDIT never changes a verdict, so nothing is
//!   sent; CUSTOM (external authorization) is refused with an error.
//! - a rule that needs L7 attributes (request principals, hosts, methods,
//!   paths, `request.*` conditions): in an ALLOW policy the rule is
//!   dropped (it can only allow less; [`Rule::never`] keeps its place, so
//!   denials name rules by their index in the manifest); in a DENY policy it is kept with its
//!   L7 parts taken as matching (it can only deny more: fail closed).
//! - `remoteIpBlocks` and `remote.ip` are the peer address, like `ipBlocks`
//!   and `source.ip` (no forwarded header is trusted at L4).
//!
//! The shape of the result: each rule has one clause for `from` (a match
//! per source, ORed), one for `to` (a match per operation) and one per
//! `when` condition; clauses are ANDed.
//!
//! Issue 14 refines this translation; keep it self-contained here.

use super::Labels;
use crate::objects::{AuthorizationPolicy, Condition, ObjectError, ObjectRef, Operation, PolicyAction, RuleSpec, Source};
use slipstream_core::policy::{Action, Authorization, Clause, Match, Rule, Scope};
use values::{check_service_accounts_alone, check_values, cidrs, intersect, ports, service_accounts, strings};

mod l7;
use l7::l7_bound;
mod values;

/// What the index keeps of one AuthorizationPolicy.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyInput {
    /// The labels it selects workloads by (scope WORKLOAD_SELECTOR).
    pub selector: Option<Labels>,
    /// The resource node proxies get; None when they have nothing to
    /// enforce (AUDIT, or bound to a waypoint or gateway).
    pub policy: Option<Authorization>,
    /// Bound with targetRefs: what the waypoint enforces, and on what.
    pub l7: Option<L7Bound>,
    /// A selector-bound or namespace-wide policy: its rules with every
    /// attribute, for a waypoint in front of the workloads it selects,
    /// and the indexes of the rules that need L7 attributes (the index
    /// rewrites them for the node proxies when such a waypoint exists:
    /// docs/waypoint.md, "Policy: one engine, both layers").
    pub selected_l7: Option<(slipstream_core::policy::l7::L7Policy, Vec<usize>)>,
}

/// A policy a waypoint enforces.
#[derive(Debug, Clone, PartialEq)]
pub struct L7Bound {
    /// Services of the policy's namespace it names.
    pub services: Vec<String>,
    /// Waypoint Gateways of the policy's namespace it names: every service
    /// bound to them.
    pub gateways: Vec<String>,
    pub policy: slipstream_core::policy::l7::L7Policy,
}

/// One part of a rule after translation.
enum Part {
    /// Holds for every connection (what is left of it needs L7 and was
    /// taken as matching).
    Always,
    /// Holds for no connection.
    Never,
    Match(Box<Match>),
}

/// Keys of `when` conditions a node proxy can evaluate, and those it
/// cannot (L7, or TLS details it does not see).
const L4_KEYS: &[&str] =
    &["source.ip", "remote.ip", "source.namespace", "source.principal", "source.serviceAccount", "destination.ip", "destination.port"];
const L7_KEY_PREFIXES: &[&str] = &["request.", "connection.sni", "experimental.", "source.user"];

pub fn translate(p: &AuthorizationPolicy, r: &ObjectRef, root_namespace: &str) -> Result<PolicyInput, ObjectError> {
    let spec = &p.spec;
    let err = |field: &str, message: &str| ObjectError::new(r, field, message);
    let action = match spec.action {
        None | Some(PolicyAction::Allow) => Some(Action::Allow),
        Some(PolicyAction::Deny) => Some(Action::Deny),
        Some(PolicyAction::Audit) => None,
        Some(PolicyAction::Custom) => return Err(err("spec.action", "CUSTOM (external authorization) is not supported")),
    };
    if spec.provider.is_some() {
        return Err(err("spec.provider", "only valid with action CUSTOM, which is not supported"));
    }
    let targeted = spec.target_ref.is_some() || !spec.target_refs.is_empty();
    if targeted && spec.selector.is_some() {
        return Err(err("spec.selector", "cannot be set together with spec.targetRef or spec.targetRefs"));
    }
    if spec.target_ref.is_some() && !spec.target_refs.is_empty() {
        return Err(err("spec.targetRef", "cannot be set together with spec.targetRefs"));
    }
    // Every rule is checked, whatever the action, so an error shows now
    // rather than when someone switches AUDIT to DENY.
    let mut rules = Vec::new();
    for (i, rule) in spec.rules.iter().enumerate() {
        check_values(rule, &format!("spec.rules[{i}]"), r)?;
        rules.push(translate_rule(rule, &format!("spec.rules[{i}]"), action.unwrap_or(Action::Allow), r)?);
    }
    let selector = spec.selector.as_ref().map(|s| s.match_labels.clone()).filter(|l| !l.is_empty());
    if targeted {
        let l7 = match action {
            Some(action) => Some(l7_bound(p, r, action)?),
            None => None,
        };
        return Ok(PolicyInput { selector: None, policy: None, l7, selected_l7: None });
    }
    let Some(action) = action else {
        return Ok(PolicyInput { selector: None, policy: None, l7: None, selected_l7: None });
    };
    let scope = match (&selector, r.namespace == root_namespace) {
        (Some(_), _) => Scope::WorkloadSelector,
        (None, true) => Scope::Global,
        (None, false) => Scope::Namespace,
    };
    let dry_run = p.metadata.annotations.as_ref().and_then(|a| a.get(super::DRY_RUN_ANNOTATION)).is_some_and(|v| v == "true");
    let policy = Authorization { name: r.name.clone(), namespace: r.namespace.clone(), scope, action, rules, dry_run };
    let l7_rules: Vec<usize> = spec
        .rules
        .iter()
        .enumerate()
        .filter(|(i, rule)| matches!(translate_rule_l7(rule, &format!("spec.rules[{i}]"), action, r), Ok((_, true))))
        .map(|(i, _)| i)
        .collect();
    // None when the waypoint cannot evaluate some attribute of it (such as
    // `destination.ip`): then no policy of those workloads moves to a
    // waypoint, and the node proxies keep the L4 fail-safe meaning.
    let selected_l7 = l7_bound(p, r, action).ok().map(|b| (b.policy, l7_rules));
    Ok(PolicyInput { selector, policy: Some(policy), l7: None, selected_l7 })
}

/// One rule; [`Rule::never`] in its place when it is dropped (an ALLOW
/// rule needing L7) or can never match, so later rules keep their index.
fn translate_rule(rule: &RuleSpec, path: &str, action: Action, r: &ObjectRef) -> Result<Rule, ObjectError> {
    translate_rule_l7(rule, path, action, r).map(|(rule, _)| rule)
}

/// The rules (`spec.rules[i]`) of a selector-bound or namespace-wide
/// policy that name L7 attributes: at the node proxies they keep the L4
/// fail-safe meaning (an ALLOW rule matches nothing, a DENY rule denies on
/// its L4 part). `apply` warns about them (docs/waypoint.md, "Policy").
/// Empty for a policy with targetRefs (the waypoint enforces it whole) or
/// one that does not translate.
pub fn l7_rules_at_l4(p: &AuthorizationPolicy, r: &ObjectRef) -> Vec<String> {
    if p.spec.target_ref.is_some() || !p.spec.target_refs.is_empty() {
        return Vec::new();
    }
    let action = match p.spec.action {
        Some(PolicyAction::Deny) => Action::Deny,
        _ => Action::Allow,
    };
    p.spec
        .rules
        .iter()
        .enumerate()
        .filter_map(|(i, rule)| {
            let path = format!("spec.rules[{i}]");
            matches!(translate_rule_l7(rule, &path, action, r), Ok((_, true))).then_some(path)
        })
        .collect()
}

fn translate_rule_l7(rule: &RuleSpec, path: &str, action: Action, r: &ObjectRef) -> Result<(Rule, bool), ObjectError> {
    let mut l7 = false;
    let mut clauses = Vec::new();
    let mut never = false;
    if !rule.from.is_empty() {
        let mut parts = Vec::new();
        for (i, f) in rule.from.iter().enumerate() {
            let field = format!("{path}.from[{i}].source");
            let s = f.source.as_ref().ok_or_else(|| ObjectError::new(r, &field, "required"))?;
            parts.push(source(s, &field, r, &mut l7)?);
        }
        push_or_clause(parts, &mut clauses, &mut never);
    }
    if !rule.to.is_empty() {
        let mut parts = Vec::new();
        for (i, t) in rule.to.iter().enumerate() {
            let field = format!("{path}.to[{i}].operation");
            let o = t.operation.as_ref().ok_or_else(|| ObjectError::new(r, &field, "required"))?;
            parts.push(operation(o, &field, r, &mut l7)?);
        }
        push_or_clause(parts, &mut clauses, &mut never);
    }
    for (i, c) in rule.when.iter().enumerate() {
        let part = condition(c, &format!("{path}.when[{i}]"), r, &mut l7)?;
        push_or_clause(vec![part], &mut clauses, &mut never);
    }
    if never || (l7 && action == Action::Allow) {
        return Ok((Rule::never(), l7));
    }
    Ok((Rule { clauses }, l7))
}

/// Adds the clause that ORs `parts`: none if one of them always holds; a
/// rule that can never match if none of them can.
fn push_or_clause(parts: Vec<Part>, clauses: &mut Vec<Clause>, never: &mut bool) {
    let mut matches = Vec::new();
    for p in parts {
        match p {
            Part::Always => return,
            Part::Never => {}
            Part::Match(m) => matches.push(*m),
        }
    }
    if matches.is_empty() {
        *never = true;
    } else {
        clauses.push(Clause { matches });
    }
}

fn source(s: &Source, field: &str, r: &ObjectRef, l7: &mut bool) -> Result<Part, ObjectError> {
    if *s == Source::default() {
        return Err(ObjectError::new(r, field, "must set at least one field"));
    }
    let needs_l7 = !s.request_principals.is_empty() || !s.not_request_principals.is_empty();
    *l7 |= needs_l7;
    let ip_blocks = cidrs(&s.ip_blocks, &format!("{field}.ipBlocks"), r)?;
    let remote_ip_blocks = cidrs(&s.remote_ip_blocks, &format!("{field}.remoteIpBlocks"), r)?;
    let mut not_source_ips = cidrs(&s.not_ip_blocks, &format!("{field}.notIpBlocks"), r)?;
    not_source_ips.extend(cidrs(&s.not_remote_ip_blocks, &format!("{field}.notRemoteIpBlocks"), r)?);
    // Both are the peer address at L4: it must be in both lists, that is
    // in their intersection (which, for address blocks, is exact).
    let source_ips = match (ip_blocks.is_empty(), remote_ip_blocks.is_empty()) {
        (false, false) => {
            let both = intersect(&ip_blocks, &remote_ip_blocks);
            if both.is_empty() {
                return Ok(Part::Never);
            }
            both
        }
        (false, true) => ip_blocks,
        _ => remote_ip_blocks,
    };
    check_service_accounts_alone(s, field, r)?;
    let mut principals = strings(&s.principals);
    principals.extend(service_accounts(&s.service_accounts, &format!("{field}.serviceAccounts"), r)?);
    let mut not_principals = strings(&s.not_principals);
    not_principals.extend(service_accounts(&s.not_service_accounts, &format!("{field}.notServiceAccounts"), r)?);
    let m = Match {
        principals,
        not_principals,
        namespaces: strings(&s.namespaces),
        not_namespaces: strings(&s.not_namespaces),
        source_ips,
        not_source_ips,
        ..Default::default()
    };
    Ok(if m == Match::default() { Part::Always } else { Part::Match(Box::new(m)) })
}

fn operation(o: &Operation, field: &str, r: &ObjectRef, l7: &mut bool) -> Result<Part, ObjectError> {
    if *o == Operation::default() {
        return Err(ObjectError::new(r, field, "must set at least one field"));
    }
    *l7 |= !(o.hosts.is_empty()
        && o.not_hosts.is_empty()
        && o.methods.is_empty()
        && o.not_methods.is_empty()
        && o.paths.is_empty()
        && o.not_paths.is_empty());
    let m = Match {
        destination_ports: ports(&o.ports, &format!("{field}.ports"), r)?,
        not_destination_ports: ports(&o.not_ports, &format!("{field}.notPorts"), r)?,
        ..Default::default()
    };
    Ok(if m == Match::default() { Part::Always } else { Part::Match(Box::new(m)) })
}

fn condition(c: &Condition, field: &str, r: &ObjectRef, l7: &mut bool) -> Result<Part, ObjectError> {
    if c.values.is_empty() && c.not_values.is_empty() {
        return Err(ObjectError::new(r, field, "needs values or notValues"));
    }
    let key = c.key.as_str();
    if L7_KEY_PREFIXES.iter().any(|p| key.starts_with(p)) {
        *l7 = true;
        return Ok(Part::Always);
    }
    if !L4_KEYS.contains(&key) {
        return Err(ObjectError::new(r, format!("{field}.key"), format!("unknown key {key:?}")));
    }
    let (vf, nf) = (format!("{field}.values"), format!("{field}.notValues"));
    let mut m = Match::default();
    match key {
        "source.ip" | "remote.ip" => {
            m.source_ips = cidrs(&c.values, &vf, r)?;
            m.not_source_ips = cidrs(&c.not_values, &nf, r)?;
        }
        "destination.ip" => {
            m.destination_ips = cidrs(&c.values, &vf, r)?;
            m.not_destination_ips = cidrs(&c.not_values, &nf, r)?;
        }
        "destination.port" => {
            m.destination_ports = ports(&c.values, &vf, r)?;
            m.not_destination_ports = ports(&c.not_values, &nf, r)?;
        }
        "source.namespace" => {
            m.namespaces = strings(&c.values);
            m.not_namespaces = strings(&c.not_values);
        }
        "source.serviceAccount" => {
            m.principals = service_accounts(&c.values, &vf, r)?;
            m.not_principals = service_accounts(&c.not_values, &nf, r)?;
        }
        _ => {
            m.principals = strings(&c.values);
            m.not_principals = strings(&c.not_values);
        }
    }
    Ok(Part::Match(Box::new(m)))
}

/// The claim path of `request.auth.claims[a][b]...` (a name in brackets
/// may hold dots: `[foo.com/name]` is one claim), if `key` is one.
fn claim_path(key: &str) -> Option<Vec<String>> {
    let mut rest = key.strip_prefix("request.auth.claims")?;
    let mut path = Vec::new();
    while !rest.is_empty() {
        let inner = rest.strip_prefix('[')?;
        let end = inner.find(']')?;
        let name = &inner[..end];
        if name.is_empty() || name.contains('[') {
            return None;
        }
        path.push(name.to_string());
        rest = &inner[end + 1..];
    }
    (!path.is_empty()).then_some(path)
}

#[cfg(test)]
mod tests;
