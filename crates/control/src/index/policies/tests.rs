//! The policies view: which AuthorizationPolicies select a pod, the JWT
//! rules of what RequestAuthentications target, network policies resolved
//! against the pods.

use super::*;
use crate::index::testing::{input, pod};
use crate::translate::Input;

fn authz(ns: &str, name: &str, spec: &str) -> PolicyInput {
    let y =
        format!("apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {spec}\n");
    match input(&y) {
        Input::AuthorizationPolicy(p) => *p,
        other => panic!("{other:?}"),
    }
}

fn request_authn(ns: &str, name: &str, spec: &str) -> RequestAuthnInput {
    let y = format!(
        "apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {spec}\n"
    );
    match input(&y) {
        Input::RequestAuthentication(a) => *a,
        other => panic!("{other:?}"),
    }
}

#[test]
fn policies_select_pods_by_their_selector_only() {
    let mut p = Policies::default();
    p.set_authorization("a", "web", Some(authz("a", "web", "{selector: {matchLabels: {app: web}}, rules: [{}]}")));
    p.set_authorization("a", "web-v1", Some(authz("a", "web-v1", "{selector: {matchLabels: {app: web, version: v1}}, rules: [{}]}")));
    p.set_authorization("a", "wide", Some(authz("a", "wide", "{rules: [{}]}")));
    p.set_authorization("a", "audit", Some(authz("a", "audit", "{selector: {matchLabels: {app: web}}, action: AUDIT, rules: [{}]}")));
    let cases: &[(&str, &str, &[&str])] =
        &[("a", "app: web", &["web"]), ("a", "app: web, version: v1", &["web", "web-v1"]), ("a", "app: db", &[]), ("b", "app: web", &[])];
    for (ns, labels, want) in cases {
        let pod = pod(ns, "p", labels, "10.0.0.1");
        let mut got: Vec<&str> = p.selecting(ns, &pod.labels).map(String::as_str).collect();
        got.sort_unstable();
        assert_eq!(got, *want, "{ns} {labels}");
    }
    assert_eq!(p.all_authorizations().count(), 4);
    assert!(p.set_authorization("a", "web", None).is_some());
    assert!(p.authorization("a", "web").is_none());
}

/// A service, a waypoint (namespace, name), the rules expected.
type Case = (Option<&'static str>, Option<(&'static str, &'static str)>, &'static [&'static str]);

#[test]
fn jwt_rules_are_those_targeting_the_service_or_its_waypoint_with_fetched_keys() {
    const JWKS: &str = r#"{"keys":[{"kty":"RSA","kid":"k","n":"AQAB","e":"AQAB"}]}"#;
    let mut p = Policies::default();
    let uri = "http://keys.auth.svc.cluster.local/jwks";
    p.set_request_authn(
        "a",
        "svc",
        request_authn(
            "a",
            "svc",
            &format!("{{targetRefs: [{{kind: Service, name: reviews}}], jwtRules: [{{issuer: b, jwks: '{JWKS}'}}]}}"),
        ),
    );
    p.set_request_authn(
        "a",
        "gw",
        request_authn("a", "gw", &format!("{{targetRefs: [{{group: gateway.networking.k8s.io, kind: Gateway, name: wp}}], jwtRules: [{{issuer: a, jwksUri: '{uri}'}}]}}")),
    );
    let rules = |p: &Policies, service: Option<&str>, gateway: Option<(&str, &str)>| {
        p.jwt_rules_for("a", service, gateway)
            .into_iter()
            .map(|r| {
                format!(
                    "{} {} {}",
                    r.policy,
                    r.issuer,
                    if r.jwks.is_empty() {
                        "none"
                    } else if r.jwks == JWKS {
                        "keys"
                    } else {
                        "other"
                    }
                )
            })
            .collect::<Vec<_>>()
    };
    let cases: &[Case] = &[
        (Some("reviews"), None, &["a/svc b keys"]),
        (Some("ratings"), None, &[]),
        (Some("reviews"), Some(("a", "wp")), &["a/gw a none", "a/svc b keys"]),
        (None, Some(("b", "wp")), &[]),
    ];
    for (service, gateway, want) in cases {
        assert_eq!(rules(&p, *service, *gateway), *want, "{service:?} {gateway:?}");
    }
    let fetches: Vec<Fetch> = p.fetches().collect();
    assert_eq!(fetches.len(), 1);
    assert!(p.set_jwks(&fetches[0], Some(JWKS.into())));
    assert!(!p.set_jwks(&fetches[0], Some(JWKS.into())), "the same keys again");
    assert_eq!(rules(&p, None, Some(("a", "wp"))), ["a/gw a keys"]);
    p.retain_jwks(|_| false);
    assert_eq!(rules(&p, None, Some(("a", "wp"))), ["a/gw a none"]);
    assert!(p.remove_request_authn("a", "gw"));
    assert!(!p.remove_request_authn("a", "gw"));
}

#[test]
fn network_policies_resolve_against_the_pods_with_addresses() {
    let y = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny, namespace: a}\nspec: {podSelector: {matchLabels: {app: web}}, policyTypes: [Ingress]}\n";
    let Input::NetworkPolicy(np) = input(y) else { panic!() };
    let mut p = Policies::default();
    assert!(p.set_net("NetworkPolicy/a/deny", Some(np)));
    let mut w = Workloads::default();
    w.upsert_pod(pod("a", "web-1", "app: web", "10.0.0.1"));
    w.upsert_pod(pod("a", "db-1", "app: db", "10.0.0.2"));
    let settings = IndexSettings::default();
    let got = p.resolve_net(vec!["NetworkPolicy/a/deny".into(), "NetworkPolicy/a/gone".into()], &w, &settings);
    assert_eq!(got.len(), 2);
    let resolved = slipstream_api::netpol::net_policy_from_any(&got[0].1.as_ref().unwrap().body).unwrap();
    assert_eq!(resolved.selected, ["Kubernetes//Pod/a/web-1"]);
    assert!(got[1].1.is_none(), "a policy no longer held is removed");
    assert!(p.resolve_net(Vec::new(), &w, &settings).is_empty());
}
