//! Table tests of the translation: a manifest in, the input or the error.

use super::*;
use crate::objects::{parse_value, ClusterObject, Kind};

fn input(kind: &str, spec: &str) -> Result<NetPolicyInput, String> {
    let api = if kind == "NetworkPolicy" { "networking.k8s.io/v1" } else { "cilium.io/v2" };
    let y = format!("apiVersion: {api}\nkind: {kind}\nmetadata: {{name: p, namespace: demo}}\nspec: {spec}\n");
    let v: serde_json::Value = serde_json::to_value(serde_yaml::from_str::<serde_yaml::Value>(&y).unwrap()).unwrap();
    let o = parse_value(v).map_err(|e| e.to_string())?.expect("a kind the control plane reads");
    match crate::translate::input(&o).map_err(|e| e.to_string())? {
        crate::translate::Input::NetworkPolicy(p) => Ok(p),
        other => panic!("not a network policy: {other:?} from {:?}", matches!(o, ClusterObject::NetworkPolicy(_))),
    }
}

#[test]
fn refusals_name_the_field() {
    let cases = [
        ("NetworkPolicy", "{podSelector: {}, ingress: [{from: [{}]}]}", "spec.ingress[0].from[0]"),
        (
            "NetworkPolicy",
            "{podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8}, podSelector: {}}]}]}",
            "spec.ingress[0].from[0].ipBlock",
        ),
        (
            "NetworkPolicy",
            "{podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8, except: [192.168.0.0/16]}}]}]}",
            "spec.ingress[0].from[0].ipBlock.except[0]",
        ),
        ("NetworkPolicy", "{podSelector: {}, ingress: [{ports: [{port: 80, endPort: 79}]}]}", "spec.ingress[0].ports[0].endPort"),
        ("NetworkPolicy", "{podSelector: {}, ingress: [{ports: [{port: http, endPort: 90}]}]}", "spec.ingress[0].ports[0].endPort"),
        ("NetworkPolicy", "{podSelector: {}, policyTypes: [Inbound]}", "spec.policyTypes[0]"),
        ("NetworkPolicy", "{podSelector: {matchExpressions: [{key: a, operator: In}]}}", "spec.podSelector.matchExpressions[0].values"),
        (
            "CiliumNetworkPolicy",
            "{endpointSelector: {}, ingress: [{toPorts: [{ports: [{port: '80'}], rules: {http: [{method: GET}]}}]}]}",
            "spec.ingress[0].toPorts[0].rules",
        ),
        ("CiliumNetworkPolicy", "{endpointSelector: {}, egress: [{toFQDNs: [{matchName: example.com}]}]}", "spec.egress[0].toFQDNs"),
        ("CiliumNetworkPolicy", "{endpointSelector: {}, ingress: [{toEndpoints: [{}]}]}", "spec.ingress[0].toEndpoints"),
        ("CiliumNetworkPolicy", "{endpointSelector: {}, ingress: [{fromEntities: [host]}]}", "spec.ingress[0].fromEntities[0]"),
        ("CiliumNetworkPolicy", "{ingress: [{}]}", "spec.endpointSelector"),
        ("CiliumNetworkPolicy", "{endpointSelector: {}, ingress: [{fromWhatever: [{}]}]}", "spec.ingress[0].fromWhatever"),
    ];
    for (kind, spec, field) in cases {
        let e = input(kind, spec).expect_err(spec);
        assert!(e.contains(&format!(" {field}:")) || e.contains(&format!("{field}:")), "{spec}: {e} (wanted field {field})");
    }
}

#[test]
fn kubernetes_policy_types_default() {
    let p = input("NetworkPolicy", "{podSelector: {}}").unwrap();
    assert_eq!((p.isolates_ingress, p.isolates_egress), (true, false));
    let p = input("NetworkPolicy", "{podSelector: {}, egress: [{}]}").unwrap();
    assert_eq!((p.isolates_ingress, p.isolates_egress), (true, true));
    let p = input("NetworkPolicy", "{podSelector: {}, policyTypes: [Egress]}").unwrap();
    assert_eq!((p.isolates_ingress, p.isolates_egress), (false, true));
    // Cilium: a direction with rules (allow or deny) isolates, unless told not to.
    let p = input("CiliumNetworkPolicy", "{endpointSelector: {}, ingressDeny: [{fromEntities: [world]}]}").unwrap();
    assert_eq!((p.isolates_ingress, p.isolates_egress), (true, false));
    let p = input("CiliumNetworkPolicy", "{endpointSelector: {}, ingress: [{}], enableDefaultDeny: {ingress: false}}").unwrap();
    assert!(!p.isolates_ingress);
    let _ = Kind::NetworkPolicy;
}
