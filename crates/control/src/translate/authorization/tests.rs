//! Table tests: an AuthorizationPolicy's spec in, the rules a node proxy
//! gets out (written in the model's JSON form), or the error.

use super::*;
use crate::objects::{parse_value, ClusterObject};
use slipstream_core::policy::Rule;
use slipstream_core::policy::StringMatch;

fn policy(ns: &str, spec: &str, annotations: &str) -> Result<PolicyInput, String> {
    let y = format!(
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: p, namespace: {ns}, annotations: {{{annotations}}}}}\nspec: {spec}\n"
    );
    let v: serde_json::Value = serde_json::to_value(serde_yaml::from_str::<serde_yaml::Value>(&y).unwrap()).unwrap();
    let Some(ClusterObject::AuthorizationPolicy(p)) = parse_value(v).map_err(|e| e.to_string())? else { panic!("not a policy") };
    let r = ObjectRef::new(crate::objects::Kind::AuthorizationPolicy, ns, "p");
    translate(&p, &r, "istio-system").map_err(|e| e.to_string())
}

fn rules(json: serde_json::Value) -> Vec<Rule> {
    serde_json::from_value(json).unwrap()
}

/// (spec, the rules wanted)
#[test]
fn rules_at_l4() {
    use serde_json::json;
    // A rule that cannot apply keeps its place, so later ones keep their index.
    let never = serde_json::to_value(Rule::never()).unwrap();
    let cases: Vec<(&str, serde_json::Value)> = vec![
        // No rules: an ALLOW policy that matches nothing (denies all).
        ("{}", json!([])),
        ("{action: ALLOW, rules: []}", json!([])),
        // An empty rule matches everything.
        ("{rules: [{}]}", json!([{"clauses": []}])),
        (
            "{rules: [{from: [{source: {principals: [cluster.local/ns/a/sa/b, '*/sa/c'], namespaces: ['*']}}, {source: {notNamespaces: [x]}}]}]}",
            json!([{"clauses": [{"matches": [
                {"principals": [{"exact": "cluster.local/ns/a/sa/b"}, {"suffix": "/sa/c"}], "namespaces": ["presence"]},
                {"not_namespaces": [{"exact": "x"}]}
            ]}]}]),
        ),
        (
            "{rules: [{from: [{source: {ipBlocks: [10.0.0.0/8, 192.168.1.7]}}], to: [{operation: {ports: ['8080'], notPorts: ['9000']}}]}]}",
            json!([{"clauses": [
                {"matches": [{"source_ips": [{"address": "10.0.0.0", "length": 8}, {"address": "192.168.1.7", "length": 32}]}]},
                {"matches": [{"destination_ports": [8080], "not_destination_ports": [9000]}]}
            ]}]),
        ),
        // ipBlocks and remoteIpBlocks are both the peer: their intersection.
        (
            "{rules: [{from: [{source: {ipBlocks: [10.0.0.0/8, 172.16.0.0/12], remoteIpBlocks: [10.1.0.0/16], notRemoteIpBlocks: [10.1.2.0/24], notIpBlocks: [10.1.3.4]}}]}]}",
            json!([{"clauses": [{"matches": [{
                "source_ips": [{"address": "10.1.0.0", "length": 16}],
                "not_source_ips": [{"address": "10.1.3.4", "length": 32}, {"address": "10.1.2.0", "length": 24}]
            }]}]}]),
        ),
        // Disjoint: that source never matches; the rule with it alone never does.
        ("{rules: [{from: [{source: {ipBlocks: [10.0.0.0/8], remoteIpBlocks: [192.168.0.0/16]}}]}, {}]}", json!([never, {"clauses": []}])),
        (
            "{rules: [{when: [{key: source.ip, values: [10.0.0.1]}, {key: remote.ip, notValues: [10.0.0.2]}, {key: destination.port, values: ['80']}, {key: source.namespace, values: [demo]}, {key: source.principal, notValues: ['*/sa/x']}, {key: destination.ip, values: [10.96.0.10]}]}]}",
            json!([{"clauses": [
                {"matches": [{"source_ips": [{"address": "10.0.0.1", "length": 32}]}]},
                {"matches": [{"not_source_ips": [{"address": "10.0.0.2", "length": 32}]}]},
                {"matches": [{"destination_ports": [80]}]},
                {"matches": [{"namespaces": [{"exact": "demo"}]}]},
                {"matches": [{"not_principals": [{"suffix": "/sa/x"}]}]},
                {"matches": [{"destination_ips": [{"address": "10.96.0.10", "length": 32}]}]}
            ]}]),
        ),
        // ALLOW rules needing L7 are dropped (can only allow less) ...
        ("{rules: [{to: [{operation: {methods: [GET]}}]}, {from: [{source: {namespaces: [a]}}]}]}", json!([never, {"clauses": [{"matches": [{"namespaces": [{"exact": "a"}]}]}]}])),
        ("{rules: [{from: [{source: {requestPrincipals: ['*']}}]}]}", json!([never])),
        ("{rules: [{when: [{key: 'request.headers[x-user]', values: [admin]}]}]}", json!([never])),
        // ... DENY rules keep their L4 parts, the L7 parts taken as matching.
        (
            "{action: DENY, rules: [{from: [{source: {namespaces: [a], requestPrincipals: ['*']}}], to: [{operation: {methods: [GET], ports: ['80']}}], when: [{key: 'request.auth.claims[iss]', values: [x]}]}]}",
            json!([{"clauses": [
                {"matches": [{"namespaces": [{"exact": "a"}]}]},
                {"matches": [{"destination_ports": [80]}]}
            ]}]),
        ),
        // Nothing L4 left: the DENY rule matches every connection (fail closed).
        ("{action: DENY, rules: [{to: [{operation: {paths: [/admin]}}]}]}", json!([{"clauses": []}])),
        // One source that always holds makes the whole `from` hold.
        ("{action: DENY, rules: [{from: [{source: {namespaces: [a]}}, {source: {requestPrincipals: ['*']}}], to: [{operation: {ports: ['22']}}]}]}", json!([{"clauses": [{"matches": [{"destination_ports": [22]}]}]}])),
    ];
    for (spec, want) in cases {
        let got = policy("demo", spec, "").unwrap_or_else(|e| panic!("{spec}: {e}"));
        assert_eq!(got.policy.expect("a policy").rules, rules(want), "{spec}");
    }
}

#[test]
fn scope_action_and_binding() {
    let p = policy("demo", "{}", "").unwrap();
    assert_eq!((p.selector.is_none(), p.policy.as_ref().map(|p| (p.scope, p.action))), (true, Some((Scope::Namespace, Action::Allow))));
    let p = policy("istio-system", "{action: DENY}", "").unwrap();
    assert_eq!(p.policy.map(|p| (p.scope, p.action)), Some((Scope::Global, Action::Deny)));
    let p = policy("istio-system", "{selector: {matchLabels: {app: a}}}", "").unwrap();
    assert_eq!(p.selector, Some([("app".to_string(), "a".to_string())].into()));
    assert_eq!(p.policy.map(|p| p.scope), Some(Scope::WorkloadSelector));
    // An empty selector selects the whole namespace.
    assert_eq!(policy("demo", "{selector: {matchLabels: {}}}", "").unwrap().policy.map(|p| p.scope), Some(Scope::Namespace));
    // AUDIT and waypoint-bound policies give node proxies nothing.
    assert_eq!(
        policy("demo", "{action: AUDIT, rules: [{}]}", "").unwrap(),
        PolicyInput { selector: None, policy: None, l7: None, selected_l7: None }
    );
    let p = policy("demo", "{targetRefs: [{kind: Service, group: '', name: web}], rules: [{to: [{operation: {methods: [GET]}}]}]}", "")
        .unwrap();
    assert_eq!((p.selector, p.policy), (None, None));
    let l7 = p.l7.expect("the waypoint's form");
    assert_eq!((l7.services, l7.gateways), (vec!["web".to_string()], vec![]));
    assert_eq!(l7.policy.rules[0].to[0].methods, vec![StringMatch::Exact("GET".into())]);
    let p = policy("demo", "{}", "istio.io/dry-run: 'true'").unwrap();
    assert!(p.policy.unwrap().dry_run);
}

#[test]
fn errors_name_the_field() {
    let cases = [
        (
            "{action: CUSTOM, provider: {name: ext}}",
            "AuthorizationPolicy demo/p: spec.action: CUSTOM (external authorization) is not supported",
        ),
        ("{provider: {name: ext}}", "AuthorizationPolicy demo/p: spec.provider: only valid with action CUSTOM, which is not supported"),
        (
            "{rules: [{to: [{operation: {ports: ['80', http]}}]}]}",
            "AuthorizationPolicy demo/p: spec.rules[0].to[0].operation.ports[1]: \"http\" is not a port (1-65535)",
        ),
        (
            "{rules: [{}, {from: [{source: {ipBlocks: [10.0.0.0/33]}}]}]}",
            "AuthorizationPolicy demo/p: spec.rules[1].from[0].source.ipBlocks[0]: \"10.0.0.0/33\" is not an address or address block",
        ),
        (
            "{rules: [{when: [{key: source.color, values: [red]}]}]}",
            "AuthorizationPolicy demo/p: spec.rules[0].when[0].key: unknown key \"source.color\"",
        ),
        ("{rules: [{when: [{key: source.ip}]}]}", "AuthorizationPolicy demo/p: spec.rules[0].when[0]: needs values or notValues"),
        ("{rules: [{from: [{source: {}}]}]}", "AuthorizationPolicy demo/p: spec.rules[0].from[0].source: must set at least one field"),
        ("{rules: [{from: [{}]}]}", "AuthorizationPolicy demo/p: spec.rules[0].from[0].source: required"),
        (
            "{selector: {matchLabels: {a: b}}, targetRefs: [{kind: Service, name: s}]}",
            "AuthorizationPolicy demo/p: spec.selector: cannot be set together with spec.targetRef or spec.targetRefs",
        ),
        ("{action: audit}", "AuthorizationPolicy demo/p: spec.action: unknown variant `audit`"),
        // AUDIT policies are checked too.
        (
            "{action: AUDIT, rules: [{to: [{operation: {ports: ['0']}}]}]}",
            "AuthorizationPolicy demo/p: spec.rules[0].to[0].operation.ports[0]: \"0\" is not a port (1-65535)",
        ),
    ];
    for (spec, want) in cases {
        let e = policy("demo", spec, "").unwrap_err();
        assert!(e.starts_with(want), "{spec}:\n got {e}\nwant {want}");
    }
}

#[test]
fn targeted_policies_keep_every_l7_attribute_for_the_waypoint() {
    use slipstream_core::policy::l7::ConditionKey;
    let p = policy(
        "production",
        concat!(
            "{targetRefs: [{kind: Gateway, group: gateway.networking.k8s.io, name: waypoint}, {kind: Service, group: '', name: billing}], ",
            "action: DENY, rules: [{from: [{source: {principals: [cluster.local/ns/production/sa/legacy], ipBlocks: [10.0.0.0/8]}}], ",
            "to: [{operation: {paths: ['/api/*', '*/admin'], hosts: ['billing*'], ports: ['8080']}}], ",
            "when: [{key: 'request.headers[X-User]', values: [alice]}, {key: source.ip, notValues: [10.1.0.0/16]}]}]}"
        ),
        "",
    )
    .unwrap();
    let l7 = p.l7.unwrap();
    assert_eq!((l7.gateways, l7.services), (vec!["waypoint".to_string()], vec!["billing".to_string()]));
    let r = &l7.policy.rules[0];
    assert_eq!(l7.policy.action, Action::Deny);
    assert_eq!(r.to[0].paths, vec![StringMatch::Prefix("/api/".into()), StringMatch::Suffix("/admin".into())]);
    assert_eq!(r.to[0].ports, vec![8080]);
    assert_eq!(r.when[0].key, ConditionKey::RequestHeader("x-user".into()));
    assert_eq!(r.when[1].key, ConditionKey::SourceIp);
    assert_eq!(r.from[0].ip_blocks.len(), 1);
    // At the waypoint ipBlocks read the peer, remoteIpBlocks the address
    // X-Forwarded-For gives past the trusted proxies: kept apart.
    let both = |blocks: &str| {
        let spec = format!("{{targetRefs: [{{kind: Service, group: '', name: x}}], rules: [{{from: [{{source: {blocks}}}]}}]}}");
        policy("production", &spec, "").unwrap().l7.unwrap().policy.rules[0].from[0].clone()
    };
    let s = both("{ipBlocks: [10.0.0.0/8], remoteIpBlocks: [192.168.0.0/16], notRemoteIpBlocks: [192.168.1.0/24]}");
    assert_eq!((s.ip_blocks[0].length, s.remote_ip_blocks[0].length, s.not_remote_ip_blocks[0].length), (8, 16, 24));
    // The request's JWT (RequestAuthentication): its principal and claims.
    let p = policy(
        "production",
        "{targetRefs: [{kind: Service, group: '', name: x}], rules: [{from: [{source: {requestPrincipals: ['*'], notRequestPrincipals: ['evil/*']}}], when: [{key: 'request.auth.claims[org][unit]', values: [pay]}, {key: request.auth.audiences, values: [web]}]}]}",
        "",
    )
    .unwrap()
    .l7
    .unwrap()
    .policy;
    assert_eq!(p.rules[0].from[0].request_principals, [StringMatch::Presence]);
    assert_eq!(p.rules[0].from[0].not_request_principals, [StringMatch::Prefix("evil/".into())]);
    assert_eq!(p.rules[0].when[0].key, ConditionKey::RequestClaim(vec!["org".into(), "unit".into()]));
    assert_eq!(p.rules[0].when[1].key, ConditionKey::RequestAudiences);
    // Refusals name the field.
    let cases = [
        ("{targetRefs: [{kind: Deployment, group: apps, name: x}]}", "spec.targetRefs[0].kind"),
        ("{targetRefs: [{kind: Service, group: '', name: x, namespace: other}]}", "spec.targetRefs[0].namespace"),
        (
            "{targetRefs: [{kind: Service, group: '', name: x}], rules: [{when: [{key: 'request.auth.claims[]', values: [a]}]}]}",
            "spec.rules[0].when[0].key",
        ),
        (
            "{targetRefs: [{kind: Service, group: '', name: x}], rules: [{when: [{key: 'request.auth.claims[a', values: [a]}]}]}",
            "spec.rules[0].when[0].key",
        ),
        (
            "{targetRefs: [{kind: Service, group: '', name: x}], action: DENY, rules: [{to: [{operation: {paths: ['/a', '/admin/{**}']}}]}]}",
            "spec.rules[0].to[0].operation.paths[1]",
        ),
        ("{selector: {matchLabels: {app: a}}, rules: [{to: [{operation: {notPaths: ['/{*}/x']}}]}]}", "spec.rules[0].to[0].operation.notPaths[0]"),
        ("{rules: [{from: [{source: {principals: ['']}}]}]}", "spec.rules[0].from[0].source.principals[0]"),
        ("{rules: [{to: [{operation: {methods: [GET, '']}}]}]}", "spec.rules[0].to[0].operation.methods[1]"),
        (
            "{targetRefs: [{kind: Service, group: '', name: x}], rules: [{when: [{key: source.ip, values: [nope]}]}]}",
            "spec.rules[0].when[0].values[0]",
        ),
    ];
    for (spec, field) in cases {
        let e = policy("production", spec, "").unwrap_err();
        assert!(e.contains(&format!(": {field}: ")), "{spec}: {e}");
    }
}

#[test]
fn rules_with_l7_attributes_at_l4_are_named_for_the_apply_warning() {
    let l7 = |spec: &str| {
        let y = format!(
            "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: p, namespace: production}}\nspec: {spec}\n"
        );
        let v: serde_json::Value = serde_json::to_value(serde_yaml::from_str::<serde_yaml::Value>(&y).unwrap()).unwrap();
        let Some(ClusterObject::AuthorizationPolicy(p)) = parse_value(v).unwrap() else { panic!("not a policy") };
        l7_rules_at_l4(&p, &ObjectRef::new(crate::objects::Kind::AuthorizationPolicy, "production", "p"))
    };
    // The seed policy written for sidecars: frontend may only GET /api/v1/invoices.
    let seed = "{selector: {matchLabels: {app: billing}}, rules: [{from: [{source: {principals: [cluster.local/ns/production/sa/frontend]}}], to: [{operation: {methods: [GET], paths: [/api/v1/invoices]}}]}, {from: [{source: {namespaces: [ops]}}]}]}";
    assert_eq!(l7(seed), ["spec.rules[0]"]);
    assert_eq!(l7(&seed.replace("}, rules:", "}, action: DENY, rules:")), ["spec.rules[0]"]);
    assert_eq!(l7("{rules: [{when: [{key: 'request.headers[x-user]', values: [a]}]}]}"), ["spec.rules[0]"], "namespace-wide too");
    assert!(l7("{selector: {matchLabels: {app: billing}}, rules: [{to: [{operation: {ports: ['8080']}}]}]}").is_empty(), "L4 only");
    assert!(
        l7("{targetRefs: [{kind: Service, group: '', name: billing}], rules: [{to: [{operation: {methods: [GET]}}]}]}").is_empty(),
        "the waypoint enforces a targeted policy whole"
    );
}

/// Istio 1.25's `serviceAccounts` (and `source.serviceAccount`): an
/// account in any trust domain, a bare name in the policy's namespace, no
/// wildcard, at most 16, never with principals or namespaces.
#[test]
fn service_accounts_as_istio_reads_them() {
    use serde_json::json;
    let at_l4 = |spec: &str| policy("shop", spec, "").map(|p| p.policy.unwrap().rules);
    assert_eq!(
        at_l4("{rules: [{from: [{source: {serviceAccounts: [web, other/api.v2], notServiceAccounts: [shop/batch]}}]}]}").unwrap(),
        rules(json!([{"clauses": [{"matches": [{
            "principals": [{"suffix": "/ns/shop/sa/web"}, {"suffix": "/ns/other/sa/api.v2"}],
            "not_principals": [{"suffix": "/ns/shop/sa/batch"}]
        }]}]}]))
    );
    assert_eq!(
        at_l4("{rules: [{when: [{key: source.serviceAccount, values: [web]}]}]}").unwrap(),
        rules(json!([{"clauses": [{"matches": [{"principals": [{"suffix": "/ns/shop/sa/web"}]}]}]}]))
    );
    // The waypoint's form reads them the same way.
    let l7 = policy("shop", "{targetRefs: [{kind: Service, name: web}], rules: [{from: [{source: {serviceAccounts: [web]}}], when: [{key: source.serviceAccount, notValues: [x/y]}]}]}", "")
        .unwrap()
        .l7
        .unwrap()
        .policy;
    assert_eq!(l7.rules[0].from[0].principals, [StringMatch::Suffix("/ns/shop/sa/web".into())]);
    assert_eq!(l7.rules[0].when[0].not_values, [StringMatch::Suffix("/ns/x/sa/y".into())]);
    let seventeen: Vec<String> = (0..17).map(|i| format!("sa{i}")).collect();
    for (spec, field) in [
        ("{rules: [{from: [{source: {serviceAccounts: ['web*']}}]}]}".to_string(), "spec.rules[0].from[0].source.serviceAccounts[0]"),
        ("{rules: [{from: [{source: {serviceAccounts: [a/b/c]}}]}]}".to_string(), "spec.rules[0].from[0].source.serviceAccounts[0]"),
        ("{rules: [{from: [{source: {notServiceAccounts: [/web]}}]}]}".to_string(), "spec.rules[0].from[0].source.notServiceAccounts[0]"),
        (
            "{rules: [{from: [{source: {serviceAccounts: [web], principals: [x]}}]}]}".to_string(),
            "spec.rules[0].from[0].source.serviceAccounts",
        ),
        (
            "{rules: [{from: [{source: {notServiceAccounts: [web], notNamespaces: [x]}}]}]}".to_string(),
            "spec.rules[0].from[0].source.notServiceAccounts",
        ),
        (
            format!("{{rules: [{{from: [{{source: {{serviceAccounts: [{}]}}}}]}}]}}", seventeen.join(", ")),
            "spec.rules[0].from[0].source.serviceAccounts",
        ),
        ("{rules: [{when: [{key: source.serviceAccount, values: ['*']}]}]}".to_string(), "spec.rules[0].when[0].values[0]"),
    ] {
        let e = at_l4(&spec).unwrap_err();
        assert!(e.contains(&format!("AuthorizationPolicy shop/p: {field}:")), "{spec}: {e}");
    }
}
