use super::*;
use crate::objects::{parse_value, ClusterObject};

const JWKS: &str = r#"{"keys":[{"kty":"RSA","kid":"k1","n":"AQAB","e":"AQAB"}]}"#;

fn read(spec: &str) -> Result<RequestAuthnInput, ObjectError> {
    let doc =
        format!("apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {{name: jwt, namespace: shop}}\nspec: {spec}\n");
    let value: serde_json::Value = serde_yaml::from_str(&doc).unwrap();
    match parse_value(value) {
        Ok(Some(ClusterObject::Opaque(o))) => request_authentication(&o, "cluster.local"),
        other => panic!("{other:?}"),
    }
}

fn with_rule(rule: &str) -> String {
    format!("{{targetRefs: [{{kind: Service, name: web}}], jwtRules: [{rule}]}}")
}

#[test]
fn a_targeted_policy_and_its_rules() {
    let spec = format!(
        "{{targetRefs: [{{kind: Service, name: web}}, {{group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}}], jwtRules: [{{issuer: https://issuer.example, audiences: [shop], jwks: '{JWKS}', fromHeaders: [{{name: X-Token, prefix: 'Bearer '}}], outputClaimToHeaders: [{{header: X-Sub, claim: sub}}], outputPayloadToHeader: X-Payload, forwardOriginalToken: true, spaceDelimitedClaims: [roles]}}, {{issuer: https://other.example, jwksUri: 'http://keys.auth.svc.cluster.local/jwks', timeout: 2s}}]}}"
    );
    let p = read(&spec).unwrap();
    assert_eq!(p.targets, vec![Target::Service("web".into()), Target::Gateway("waypoint".into())]);
    assert_eq!(p.inert, None);
    let r0 = &p.rules[0];
    assert_eq!(r0.keys, KeySource::Inline);
    assert_eq!(r0.rule.policy, "shop/jwt");
    assert_eq!(r0.rule.jwks, JWKS);
    assert_eq!(r0.rule.from_headers, vec![JwtHeader { name: "x-token".into(), prefix: "Bearer ".into() }], "header names lower-cased");
    assert_eq!(r0.rule.output_claim_to_headers, vec![("x-sub".to_string(), "sub".to_string())]);
    assert_eq!(r0.rule.output_payload_to_header.as_deref(), Some("x-payload"));
    assert!(r0.rule.forward_original_token);
    let r1 = &p.rules[1];
    let fetch = Fetch {
        url: "http://keys.auth.svc.cluster.local/jwks".into(),
        namespace: "auth".into(),
        service: "keys".into(),
        port: 80,
        tls: false,
        timeout: Duration::from_secs(2),
    };
    assert_eq!(r1.keys, KeySource::Uri(fetch));
    assert_eq!(r1.rule.jwks, "", "filled in by the index once fetched");
}

#[test]
fn a_jwks_uri_names_a_service_of_this_cluster() {
    let f = |uri: &str| read(&with_rule(&format!("{{issuer: a, jwksUri: '{uri}'}}"))).map(|p| p.rules[0].keys.fetch().unwrap());
    let k = f("https://keys.auth.svc:8443/.well-known/jwks.json").unwrap();
    assert_eq!((k.namespace.as_str(), k.service.as_str(), k.port, k.tls), ("auth", "keys", 8443, true));
    assert_eq!(f("http://Keys.Auth.svc.cluster.local./jwks").unwrap().port, 80);
    // The proto's own spelling is read too.
    let p = read(&with_rule("{issuer: a, jwks_uri: 'http://keys.auth.svc/jwks'}")).unwrap();
    assert_eq!(p.rules[0].keys.fetch().unwrap().service, "keys");
    for outside in [
        "https://www.googleapis.com/oauth2/v3/certs",
        "http://169.254.169.254/latest",
        "http://keys.auth/jwks",
        "http://keys.auth.svc.other.domain/jwks",
        "http://10.96.0.10/jwks",
    ] {
        let e = f(outside).unwrap_err();
        assert_eq!(e.field, "spec.jwtRules[0].jwksUri", "{outside}");
        assert!(e.message.contains("inside the cluster only"), "{outside}: {e}");
    }
}

#[test]
fn selector_bound_and_namespace_wide_policies_are_accepted_and_inert() {
    let p = read(&format!("{{selector: {{matchLabels: {{app: web}}}}, jwtRules: [{{issuer: a, jwks: '{JWKS}'}}]}}")).unwrap();
    assert!(p.targets.is_empty());
    assert!(p.inert.as_deref().is_some_and(|m| m.starts_with("spec.selector")), "{:?}", p.inert);
    let p = read(&format!("{{jwtRules: [{{issuer: a, jwks: '{JWKS}'}}]}}")).unwrap();
    assert!(p.inert.as_deref().is_some_and(|m| m.contains("namespace-wide")), "{:?}", p.inert);
    // Still checked whole: a bad rule is refused even when inert.
    let e = read("{selector: {matchLabels: {app: web}}, jwtRules: [{issuer: a, jwks: '{}'}]}").unwrap_err();
    assert_eq!(e.field, "spec.jwtRules[0].jwks");
}

#[test]
fn refusals_name_the_field() {
    let cases: Vec<(String, &str, &str)> = vec![
        ("{jwtRules: [], extra: 1}".into(), "spec.extra", "unknown field `extra`"),
        (with_rule("{issuer: a, jwks: '{}', bogus: 1}"), "spec.jwtRules[0].bogus", "unknown field `bogus`"),
        (
            format!("{{selector: {{matchLabels: {{app: a}}}}, targetRefs: [{{kind: Service, name: web}}], jwtRules: [{{issuer: a, jwks: '{JWKS}'}}]}}"),
            "spec.selector",
            "together",
        ),
        ("{targetRefs: [{kind: Service, name: web, namespace: other}]}".into(), "spec.targetRefs[0].namespace", "own namespace"),
        ("{targetRefs: [{kind: Deployment, name: web}]}".into(), "spec.targetRefs[0].kind", "not a target"),
        ("{targetRefs: [{group: gateway.networking.k8s.io, kind: GatewayClass, name: w}]}".into(), "spec.targetRefs[0].kind", "GatewayClass"),
        (with_rule("{jwks: 'x'}"), "spec.jwtRules[0].issuer", "required"),
        (with_rule(&format!("{{issuer: a, jwks: '{JWKS}', jwksUri: 'http://k/j'}}")), "spec.jwtRules[0].jwks", "together"),
        (with_rule("{issuer: a, jwksUri: 'http://k/j', jwks_uri: 'http://k/j'}"), "spec.jwtRules[0].jwks_uri", "together"),
        (with_rule("{issuer: a, jwksUri: 'ftp://k.a.svc/j'}"), "spec.jwtRules[0].jwksUri", "http:// or https://"),
        (with_rule("{issuer: a, jwksUri: '/jwks'}"), "spec.jwtRules[0].jwksUri", "http:// or https://"),
        (with_rule("{issuer: 'https://accounts.example'}"), "spec.jwtRules[0].jwksUri", "OpenID configuration"),
        (with_rule("{issuer: a, jwks: 'nope'}"), "spec.jwtRules[0].jwks", "not JSON"),
        (with_rule("{issuer: a, jwks: '{\"keys\": []}'}"), "spec.jwtRules[0].jwks", "no key"),
        (with_rule("{issuer: a, jwks: '{\"keys\": [{\"kty\": \"oct\", \"k\": \"AA\"}]}'}"), "spec.jwtRules[0].jwks", "oct"),
        (with_rule(&format!("{{issuer: a, jwks: '{JWKS}', audiences: ['']}}")), "spec.jwtRules[0].audiences[0]", "empty"),
        (with_rule(&format!("{{issuer: a, jwks: '{JWKS}', fromHeaders: [{{prefix: x}}]}}")), "spec.jwtRules[0].fromHeaders[0].name", "required"),
        (with_rule(&format!("{{issuer: a, jwks: '{JWKS}', fromHeaders: [{{name: 'bad header'}}]}}")), "spec.jwtRules[0].fromHeaders[0].name", "not a header"),
        (with_rule(&format!("{{issuer: a, jwks: '{JWKS}', fromParams: ['']}}")), "spec.jwtRules[0].fromParams[0]", "empty"),
        (with_rule(&format!("{{issuer: a, jwks: '{JWKS}', outputPayloadToHeader: 'x y'}}")), "spec.jwtRules[0].outputPayloadToHeader", "not a header"),
        (
            with_rule(&format!("{{issuer: a, jwks: '{JWKS}', outputClaimToHeaders: [{{header: X-Forwarded-For, claim: sub}}]}}")),
            "spec.jwtRules[0].outputClaimToHeaders[0].header",
            "mesh or HTTP",
        ),
        (
            with_rule(&format!("{{issuer: a, jwks: '{JWKS}', outputPayloadToHeader: Host}}")),
            "spec.jwtRules[0].outputPayloadToHeader",
            "mesh or HTTP",
        ),
        (
            with_rule(&format!("{{issuer: a, jwks: '{JWKS}', outputClaimToHeaders: [{{header: x-a, claim: sub}}, {{header: X-A, claim: iss}}]}}")),
            "spec.jwtRules[0].outputClaimToHeaders[1].header",
            "twice",
        ),
        (with_rule(&format!("{{issuer: a, jwks: '{JWKS}', outputClaimToHeaders: [{{header: x-a}}]}}")), "spec.jwtRules[0].outputClaimToHeaders[0].claim", "required"),
        (with_rule("{issuer: a, jwksUri: 'http://k.a.svc/j', timeout: 0s}"), "spec.jwtRules[0].timeout", "at least 1ms"),
        (with_rule("{issuer: a, jwksUri: 'http://k.a.svc/j', timeout: 10m}"), "spec.jwtRules[0].timeout", "at most"),
        (with_rule("{issuer: a, jwksUri: 'http://k.a.svc/j', timeout: soon}"), "spec.jwtRules[0].timeout", "not a duration"),
    ];
    for (spec, field, message) in cases {
        let e = read(&spec).expect_err(&spec);
        assert_eq!(e.field, field, "{spec}: {e}");
        assert!(e.message.contains(message), "{spec}: {e}");
    }
}
