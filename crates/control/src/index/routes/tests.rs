//! Which VirtualService, DestinationRule and rate limits a service gets.

use super::*;
use crate::index::testing::input;
use crate::translate::Input;

fn dr(ns: &str, name: &str, host: &str, created: &str) -> DestinationRuleInput {
    let y = format!(
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: {name}, namespace: {ns}, creationTimestamp: '{created}'}}\nspec: {{host: '{host}', subsets: [{{name: v1, labels: {{version: v1}}}}]}}\n"
    );
    match input(&y) {
        Input::DestinationRule(d) => *d,
        other => panic!("{other:?}"),
    }
}

fn vs(ns: &str, name: &str, host: &str, created: &str) -> VirtualServiceInput {
    let y = format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: {name}, namespace: {ns}, creationTimestamp: '{created}'}}\nspec: {{hosts: ['{host}'], http: [{{route: [{{destination: {{host: '{host}'}}}}]}}]}}\n"
    );
    match input(&y) {
        Input::VirtualService(v) => *v,
        other => panic!("{other:?}"),
    }
}

fn limit(ns: &str, name: &str, service: &str) -> RateLimitInput {
    let y = format!(
        "apiVersion: slipstream.io/v1alpha1\nkind: LocalRateLimitPolicy\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {{targetRefs: [{{kind: Service, name: {service}}}], limit: {{requests: 10, interval: 1s}}}}\n"
    );
    match input(&y) {
        Input::RateLimit(l) => *l,
        other => panic!("{other:?}"),
    }
}

const REVIEWS: &str = "bookinfo/reviews.bookinfo.svc.cluster.local";

/// The rules held (namespace, name, host, creation), the one chosen.
type Case = (&'static [(&'static str, &'static str, &'static str, &'static str)], Option<&'static str>);

#[test]
fn a_destination_rule_by_name_beats_a_wildcard_then_the_own_namespace_then_the_oldest() {
    let cases: &[Case] = &[
        (&[], None),
        (&[("other", "a", "ratings.bookinfo.svc.cluster.local", "2024-01-01T00:00:00Z")], None),
        (
            &[
                ("bookinfo", "wild", "*.bookinfo.svc.cluster.local", "2020-01-01T00:00:00Z"),
                ("other", "named", "reviews.bookinfo.svc.cluster.local", "2024-01-01T00:00:00Z"),
            ],
            Some("other/named"),
        ),
        (
            &[
                ("other", "old", "reviews.bookinfo.svc.cluster.local", "2020-01-01T00:00:00Z"),
                ("bookinfo", "own", "reviews.bookinfo.svc.cluster.local", "2024-01-01T00:00:00Z"),
            ],
            Some("bookinfo/own"),
        ),
        (
            &[
                ("bookinfo", "new", "reviews.bookinfo.svc.cluster.local", "2024-01-01T00:00:00Z"),
                ("bookinfo", "old", "reviews.bookinfo.svc.cluster.local", "2020-01-01T00:00:00Z"),
            ],
            Some("bookinfo/old"),
        ),
    ];
    for (rules, want) in cases {
        let mut r = Routes::default();
        for (ns, name, host, created) in *rules {
            assert!(r.set_destination_rule(ns, name, Some(dr(ns, name, host, created))));
        }
        let got = r.destination_rule_for(REVIEWS).map(|d| format!("{}/{}", d.namespace, d.name));
        assert_eq!(got.as_deref(), *want, "{rules:?}");
        assert_eq!(r.any_subsets(), !rules.is_empty());
    }
}

#[test]
fn a_virtual_service_of_the_own_namespace_beats_an_older_one_elsewhere() {
    let mut r = Routes::default();
    let host = "reviews.bookinfo.svc.cluster.local";
    r.set_virtual_service("other", "old", Some(vs("other", "old", host, "2020-01-01T00:00:00Z")));
    assert_eq!(r.virtual_service_for(REVIEWS, "bookinfo").map(|v| v.name.as_str()), Some("old"));
    r.set_virtual_service("bookinfo", "own", Some(vs("bookinfo", "own", host, "2024-01-01T00:00:00Z")));
    assert_eq!(r.virtual_service_for(REVIEWS, "bookinfo").map(|v| v.name.as_str()), Some("own"));
    assert!(!r.set_virtual_service("bookinfo", "own", Some(vs("bookinfo", "own", host, "2024-01-01T00:00:00Z"))), "unchanged");
    assert!(r.set_virtual_service("bookinfo", "own", None));
    assert!(!r.set_virtual_service("bookinfo", "own", None), "already gone");
    assert_eq!(r.virtual_service_for(REVIEWS, "bookinfo").map(|v| v.name.as_str()), Some("old"));
}

#[test]
fn a_rate_limit_naming_a_service_reaches_that_service_only() {
    let mut r = Routes::default();
    r.set_rate_limit("bookinfo", "reviews", Some(limit("bookinfo", "reviews", "reviews")));
    let cases = [("bookinfo", "reviews", 1), ("bookinfo", "ratings", 0), ("other", "reviews", 0)];
    for (ns, name, want) in cases {
        let got = r.rate_limits_for(ns, name, &[]);
        assert_eq!(got.len(), want, "{ns}/{name}");
        assert!(got.iter().all(|l| l.policy == "bookinfo/reviews" && l.scope == LimitScope::Service));
    }
}

#[test]
fn grpc_routes_are_kept_apart_from_http_routes_of_the_same_name() {
    assert_eq!(grpc_key("echo"), "grpc/echo");
    assert_ne!(grpc_key("echo"), "echo");
}
