//! The L7 policies (`L7Policy`), both ways.

use super::{err, ConvertError};
use crate::route as pb;
use slipstream_core::policy::l7::*;
use slipstream_core::policy::{Action, Cidr, StringMatch};

fn sm(m: &StringMatch) -> pb::StringMatch {
    use pb::string_match::Kind;
    pb::StringMatch {
        kind: Some(match m {
            StringMatch::Exact(s) => Kind::Exact(s.clone()),
            StringMatch::Prefix(s) => Kind::Prefix(s.clone()),
            StringMatch::Suffix(s) => Kind::Suffix(s.clone()),
            StringMatch::Presence => Kind::Presence(true),
        }),
    }
}

fn sms(v: &[StringMatch]) -> Vec<pb::StringMatch> {
    v.iter().map(sm).collect()
}

fn cidr(c: &Cidr) -> pb::Cidr {
    pb::Cidr { address: crate::convert::ip_bytes(c.address), length: c.length.into() }
}

pub(super) fn policy(p: &L7Policy) -> pb::L7Policy {
    pb::L7Policy {
        namespace: p.namespace.clone(),
        name: p.name.clone(),
        deny: p.action == Action::Deny,
        dry_run: p.dry_run,
        per_workload: p.workloads.is_some(),
        workloads: p.workloads.clone().unwrap_or_default(),
        per_pod: p.pods.is_some(),
        pods: p.pods.clone().unwrap_or_default(),
        rules: p
            .rules
            .iter()
            .map(|r| pb::L7Rule {
                from: r
                    .from
                    .iter()
                    .map(|s| pb::L7Source {
                        principals: sms(&s.principals),
                        not_principals: sms(&s.not_principals),
                        namespaces: sms(&s.namespaces),
                        not_namespaces: sms(&s.not_namespaces),
                        ip_blocks: s.ip_blocks.iter().map(cidr).collect(),
                        not_ip_blocks: s.not_ip_blocks.iter().map(cidr).collect(),
                        remote_ip_blocks: s.remote_ip_blocks.iter().map(cidr).collect(),
                        not_remote_ip_blocks: s.not_remote_ip_blocks.iter().map(cidr).collect(),
                        request_principals: sms(&s.request_principals),
                        not_request_principals: sms(&s.not_request_principals),
                    })
                    .collect(),
                to: r
                    .to
                    .iter()
                    .map(|o| pb::L7Operation {
                        hosts: sms(&o.hosts),
                        not_hosts: sms(&o.not_hosts),
                        methods: sms(&o.methods),
                        not_methods: sms(&o.not_methods),
                        paths: sms(&o.paths),
                        not_paths: sms(&o.not_paths),
                        ports: o.ports.iter().map(|p| u32::from(*p)).collect(),
                        not_ports: o.not_ports.iter().map(|p| u32::from(*p)).collect(),
                    })
                    .collect(),
                when: r
                    .when
                    .iter()
                    .map(|c| {
                        use pb::l7_condition::Key;
                        pb::L7Condition {
                            key: Some(match &c.key {
                                ConditionKey::RequestHeader(h) => Key::RequestHeader(h.clone()),
                                ConditionKey::SourceIp => Key::SourceIp(true),
                                ConditionKey::RemoteIp => Key::RemoteIp(true),
                                ConditionKey::RequestPrincipal => Key::RequestPrincipal(true),
                                ConditionKey::RequestAudiences => Key::RequestAudiences(true),
                                ConditionKey::RequestPresenter => Key::RequestPresenter(true),
                                ConditionKey::RequestClaim(path) => Key::RequestClaim(pb::ClaimPath { path: path.clone() }),
                                ConditionKey::SourceNamespace => Key::SourceNamespace(true),
                                ConditionKey::SourcePrincipal => Key::SourcePrincipal(true),
                                ConditionKey::DestinationPort => Key::DestinationPort(true),
                            }),
                            values: sms(&c.values),
                            not_values: sms(&c.not_values),
                        }
                    })
                    .collect(),
            })
            .collect(),
    }
}

fn sm_from(m: &pb::StringMatch, field: &str) -> Result<StringMatch, ConvertError> {
    use pb::string_match::Kind;
    match &m.kind {
        Some(Kind::Exact(s)) => Ok(StringMatch::Exact(s.clone())),
        Some(Kind::Prefix(s)) => Ok(StringMatch::Prefix(s.clone())),
        Some(Kind::Suffix(s)) => Ok(StringMatch::Suffix(s.clone())),
        Some(Kind::Presence(true)) => Ok(StringMatch::Presence),
        _ => Err(err(field, "a string match needs exact, prefix, suffix or presence")),
    }
}

fn sms_from(v: &[pb::StringMatch], field: &str) -> Result<Vec<StringMatch>, ConvertError> {
    v.iter().enumerate().map(|(i, m)| sm_from(m, &format!("{field}[{i}]"))).collect()
}

fn cidrs_from(v: &[pb::Cidr], field: &str) -> Result<Vec<Cidr>, ConvertError> {
    v.iter()
        .enumerate()
        .map(|(i, c)| {
            let f = format!("{field}[{i}]");
            let address = crate::convert::ip_from_bytes(&c.address, &format!("{f}.address"))?;
            let max = if address.is_ipv4() { 32 } else { 128 };
            let length = u8::try_from(c.length).ok().filter(|l| *l <= max).ok_or_else(|| err(format!("{f}.length"), "too long"))?;
            Ok(Cidr { address, length })
        })
        .collect()
}

fn ports_from(v: &[u32], field: &str) -> Result<Vec<u16>, ConvertError> {
    v.iter().enumerate().map(|(i, p)| u16::try_from(*p).map_err(|_| err(format!("{field}[{i}]"), "not a port"))).collect()
}

pub(super) fn policy_from(p: &pb::L7Policy, field: &str) -> Result<L7Policy, ConvertError> {
    let mut rules = Vec::new();
    for (i, r) in p.rules.iter().enumerate() {
        let f = format!("{field}.rules[{i}]");
        let mut from = Vec::new();
        for (j, s) in r.from.iter().enumerate() {
            let g = format!("{f}.from[{j}]");
            from.push(L7Source {
                principals: sms_from(&s.principals, &format!("{g}.principals"))?,
                not_principals: sms_from(&s.not_principals, &format!("{g}.not_principals"))?,
                namespaces: sms_from(&s.namespaces, &format!("{g}.namespaces"))?,
                not_namespaces: sms_from(&s.not_namespaces, &format!("{g}.not_namespaces"))?,
                ip_blocks: cidrs_from(&s.ip_blocks, &format!("{g}.ip_blocks"))?,
                not_ip_blocks: cidrs_from(&s.not_ip_blocks, &format!("{g}.not_ip_blocks"))?,
                remote_ip_blocks: cidrs_from(&s.remote_ip_blocks, &format!("{g}.remote_ip_blocks"))?,
                not_remote_ip_blocks: cidrs_from(&s.not_remote_ip_blocks, &format!("{g}.not_remote_ip_blocks"))?,
                request_principals: sms_from(&s.request_principals, &format!("{g}.request_principals"))?,
                not_request_principals: sms_from(&s.not_request_principals, &format!("{g}.not_request_principals"))?,
            });
        }
        let mut to = Vec::new();
        for (j, o) in r.to.iter().enumerate() {
            let g = format!("{f}.to[{j}]");
            to.push(L7Operation {
                hosts: sms_from(&o.hosts, &format!("{g}.hosts"))?,
                not_hosts: sms_from(&o.not_hosts, &format!("{g}.not_hosts"))?,
                methods: sms_from(&o.methods, &format!("{g}.methods"))?,
                not_methods: sms_from(&o.not_methods, &format!("{g}.not_methods"))?,
                paths: sms_from(&o.paths, &format!("{g}.paths"))?,
                not_paths: sms_from(&o.not_paths, &format!("{g}.not_paths"))?,
                ports: ports_from(&o.ports, &format!("{g}.ports"))?,
                not_ports: ports_from(&o.not_ports, &format!("{g}.not_ports"))?,
            });
        }
        let mut when = Vec::new();
        for (j, c) in r.when.iter().enumerate() {
            use pb::l7_condition::Key;
            let g = format!("{f}.when[{j}]");
            let key = match &c.key {
                Some(Key::RequestHeader(h)) if !h.is_empty() => ConditionKey::RequestHeader(h.to_ascii_lowercase()),
                Some(Key::SourceIp(true)) => ConditionKey::SourceIp,
                Some(Key::RemoteIp(true)) => ConditionKey::RemoteIp,
                Some(Key::RequestPrincipal(true)) => ConditionKey::RequestPrincipal,
                Some(Key::RequestAudiences(true)) => ConditionKey::RequestAudiences,
                Some(Key::RequestPresenter(true)) => ConditionKey::RequestPresenter,
                Some(Key::RequestClaim(c)) if !c.path.is_empty() && c.path.iter().all(|p| !p.is_empty()) => {
                    ConditionKey::RequestClaim(c.path.clone())
                }
                Some(Key::SourceNamespace(true)) => ConditionKey::SourceNamespace,
                Some(Key::SourcePrincipal(true)) => ConditionKey::SourcePrincipal,
                Some(Key::DestinationPort(true)) => ConditionKey::DestinationPort,
                _ => return Err(err(format!("{g}.key"), "missing or unknown")),
            };
            when.push(L7Condition {
                key,
                values: sms_from(&c.values, &format!("{g}.values"))?,
                not_values: sms_from(&c.not_values, &format!("{g}.not_values"))?,
            });
        }
        rules.push(L7Rule { from, to, when });
    }
    let sorted = |v: &Vec<String>| {
        let mut w = v.clone();
        w.sort();
        w
    };
    let workloads = p.per_workload.then(|| sorted(&p.workloads));
    let pods = p.per_pod.then(|| sorted(&p.pods));
    Ok(L7Policy {
        namespace: p.namespace.clone(),
        name: p.name.clone(),
        action: if p.deny { Action::Deny } else { Action::Allow },
        dry_run: p.dry_run,
        rules,
        workloads,
        pods,
    })
}
