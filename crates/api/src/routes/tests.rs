use super::*;
use slipstream_core::route::traffic::{Fault, FaultAbort, FaultDelay, HashOn, LoadBalancer, OutlierDetection, Retry, RetryOn};
use slipstream_core::route::{
    Backend, Filters, HeaderMatch, HeaderModifier, PathMatch, PathRewrite, QueryMatch, Redirect, Rewrite, RouteMatch, RouteRule, Subset,
};

// A fixture: one resource with every field set, written out in full.
#[allow(clippy::too_many_lines)]
fn sample() -> ServiceRoutes {
    let b = |s: &str, port, weight| Backend { service: format!("bookinfo/{s}.bookinfo.svc.cluster.local"), port, weight, subset: None };
    let v3 = Backend {
        subset: Some(Subset {
            name: "v3".into(),
            workloads: vec!["c//Pod/bookinfo/reviews-v3-0".into()],
            traffic: Some(TrafficPolicy { lb: LoadBalancer::Hash(HashOn::Cookie("user".into())), ..Default::default() }),
        }),
        ..b("reviews", 9080, 5)
    };
    ServiceRoutes {
        service: "bookinfo/reviews.bookinfo.svc.cluster.local".into(),
        rules: vec![
            RouteRule {
                name: "bookinfo/reviews.0".into(),
                port: 9080,
                matches: vec![RouteMatch {
                    path: PathMatch::Exact("/reviews/1".into()),
                    headers: vec![HeaderMatch { name: "end-user".into(), value: "jason".into() }],
                    query: vec![QueryMatch { name: "v".into(), value: "2".into() }],
                    method: Some("GET".into()),
                    header_prefixes: vec![HeaderMatch { name: "x-p".into(), value: "ab".into() }],
                    query_prefixes: vec![QueryMatch { name: "q".into(), value: "1".into() }],
                    ignore_case: true,
                }],
                backends: vec![b("reviews-v1", 9080, 90), b("reviews-v2", 0, 10), v3],
                filters: Filters {
                    request_headers: HeaderModifier {
                        set: vec![("x-a".into(), "1".into())],
                        add: vec![("x-b".into(), "2".into())],
                        remove: vec!["x-c".into()],
                    },
                    response_headers: HeaderModifier { remove: vec!["server".into()], ..Default::default() },
                    redirect: None,
                    rewrite: Some(Rewrite {
                        hostname: Some("reviews.internal".into()),
                        path: Some(PathRewrite::ReplacePrefixMatch("/v2".into())),
                    }),
                    mirrors: vec![b("shadow", 9080, 0)],
                    mirror_per_million: Some(250_000),
                },
                timeout: Some(Duration::from_millis(10_500)),
                backend_timeout: Some(Duration::from_nanos(1)),
                retry: Some(Retry {
                    attempts: 3,
                    per_try_timeout: Some(Duration::from_secs(2)),
                    on: RetryOn { five_xx: true, reset: true, status_codes: vec![429], ..Default::default() },
                }),
                fault: Some(Fault {
                    delay: Some(FaultDelay { per_million: 100_000, delay: Duration::from_secs(5) }),
                    abort: Some(FaultAbort { per_million: 1, status: 500 }),
                }),
            },
            RouteRule {
                name: "bookinfo/old.1".into(),
                port: 0,
                matches: vec![RouteMatch { path: PathMatch::StringPrefix("/old".into()), ..Default::default() }],
                backends: vec![],
                filters: Filters {
                    redirect: Some(Redirect {
                        scheme: Some("https".into()),
                        hostname: Some("example.com".into()),
                        path: Some(PathRewrite::ReplaceFullPath("/new".into())),
                        port: Some(8443),
                        status: 301,
                    }),
                    ..Default::default()
                },
                timeout: None,
                backend_timeout: None,
                retry: None,
                fault: None,
            },
            RouteRule { name: "bookinfo/any.0".into(), ..Default::default() },
        ],
        policies: vec![{
            use slipstream_core::policy::l7::*;
            use slipstream_core::policy::{Action, Cidr, StringMatch};
            let ex = |s: &str| StringMatch::Exact(s.into());
            L7Policy {
                namespace: "bookinfo".into(),
                name: "reviews-get".into(),
                action: Action::Deny,
                dry_run: true,
                workloads: Some(vec!["c//Pod/bookinfo/a".into(), "c//Pod/bookinfo/b".into()]),
                pods: Some(vec!["c//Pod/bookinfo/c".into()]),
                rules: vec![L7Rule {
                    from: vec![L7Source {
                        principals: vec![ex("cluster.local/ns/bookinfo/sa/productpage")],
                        not_principals: vec![StringMatch::Presence],
                        namespaces: vec![StringMatch::Prefix("book".into())],
                        not_namespaces: vec![StringMatch::Suffix("x".into())],
                        ip_blocks: vec![Cidr { address: "10.0.0.0".parse().unwrap(), length: 8 }],
                        not_ip_blocks: vec![Cidr { address: "fd00::".parse().unwrap(), length: 64 }],
                        remote_ip_blocks: vec![Cidr { address: "192.0.2.0".parse().unwrap(), length: 24 }],
                        not_remote_ip_blocks: vec![Cidr { address: "192.0.2.7".parse().unwrap(), length: 32 }],
                        request_principals: vec![ex("https://issuer.example/alice")],
                        not_request_principals: vec![StringMatch::Presence],
                    }],
                    to: vec![L7Operation {
                        hosts: vec![ex("reviews")],
                        not_hosts: vec![ex("x")],
                        methods: vec![ex("GET")],
                        not_methods: vec![ex("POST")],
                        paths: vec![StringMatch::Prefix("/r".into())],
                        not_paths: vec![ex("/admin")],
                        ports: vec![9080],
                        not_ports: vec![1],
                    }],
                    when: vec![
                        L7Condition { key: ConditionKey::RequestHeader("x-user".into()), values: vec![ex("a")], not_values: vec![] },
                        L7Condition { key: ConditionKey::SourceIp, values: vec![ex("10.0.0.0/8")], not_values: vec![] },
                        L7Condition { key: ConditionKey::RemoteIp, values: vec![ex("192.0.2.0/24")], not_values: vec![] },
                        L7Condition { key: ConditionKey::DestinationPort, values: vec![], not_values: vec![ex("1")] },
                        L7Condition { key: ConditionKey::RequestPrincipal, values: vec![ex("a/b")], not_values: vec![] },
                        L7Condition { key: ConditionKey::RequestAudiences, values: vec![ex("web")], not_values: vec![] },
                        L7Condition { key: ConditionKey::RequestPresenter, values: vec![], not_values: vec![ex("cli")] },
                        L7Condition {
                            key: ConditionKey::RequestClaim(vec!["org".into(), "unit".into()]),
                            values: vec![ex("payments")],
                            not_values: vec![],
                        },
                    ],
                }],
            }
        }],
        traffic: TrafficPolicy {
            lb: LoadBalancer::RoundRobin,
            max_requests: Some(3),
            outlier: Some(OutlierDetection {
                consecutive_5xx: Some(2),
                consecutive_gateway: None,
                base_ejection: Duration::from_secs(30),
                max_ejection_percent: 50,
            }),
        },
        source: "VirtualService".into(),
        limits: vec![
            RateLimit {
                policy: "bookinfo/all".into(),
                requests: 10,
                interval: Duration::from_secs(1),
                burst: 20,
                scope: LimitScope::Service,
            },
            RateLimit {
                policy: "bookinfo/some".into(),
                requests: 1,
                interval: Duration::from_secs(3600),
                burst: 1,
                scope: LimitScope::Rules { routes: vec!["bookinfo/reviews.".into()], rules: vec!["bookinfo/vs.jason".into()] },
            },
        ],
        jwt_rules: vec![slipstream_core::route::JwtRule {
            policy: "bookinfo/jwt".into(),
            issuer: "https://issuer.example".into(),
            audiences: vec!["reviews".into()],
            jwks: r#"{"keys":[]}"#.into(),
            from_headers: vec![slipstream_core::route::JwtHeader { name: "x-token".into(), prefix: "Bearer ".into() }],
            from_params: vec!["t".into()],
            from_cookies: vec!["session".into()],
            output_payload_to_header: Some("x-payload".into()),
            forward_original_token: true,
            output_claim_to_headers: vec![("x-user".into(), "sub".into())],
            space_delimited_claims: vec!["roles".into()],
        }],
    }
}

#[test]
fn route_round_trip() {
    let s = sample();
    assert_eq!(routes_from_any(&routes_any(&s)).unwrap(), s);
    assert_eq!(ServiceRoutes::try_from(pb::ServiceRoutes::from(&s)).unwrap(), s);
}

#[test]
fn route_refusals_name_the_field() {
    type Edit = Box<dyn Fn(&mut pb::ServiceRoutes)>;
    let cases: Vec<(Edit, &str)> = vec![
        (Box::new(|m| m.service.clear()), "service"),
        (Box::new(|m| m.policies[0].rules[0].from[0].principals[0].kind = None), "policies[0].rules[0].from[0].principals[0]"),
        (Box::new(|m| m.policies[0].rules[0].from[0].ip_blocks[0].length = 33), "policies[0].rules[0].from[0].ip_blocks[0].length"),
        (Box::new(|m| m.policies[0].rules[0].to[0].ports[0] = 70_000), "policies[0].rules[0].to[0].ports[0]"),
        (Box::new(|m| m.policies[0].rules[0].when[0].key = None), "policies[0].rules[0].when[0].key"),
        (Box::new(|m| m.rules[1].port = 70_000), "rules[1].port"),
        (Box::new(|m| m.rules[0].matches[0].path = None), "rules[0].matches[0].path"),
        (Box::new(|m| m.rules[0].matches[0].path = Some(pb::PathMatch { kind: None })), "rules[0].matches[0].path"),
        (Box::new(|m| m.rules[0].matches[0].headers[0].name = "End-User".into()), "rules[0].matches[0].headers[0].name"),
        (Box::new(|m| m.rules[0].matches[0].query[0].name.clear()), "rules[0].matches[0].query[0].name"),
        (Box::new(|m| m.rules[0].backends[1].service.clear()), "rules[0].backends[1].service"),
        (Box::new(|m| m.rules[0].backends[0].port = 65_536), "rules[0].backends[0].port"),
        (
            Box::new(|m| m.rules[0].filters.as_mut().unwrap().request_headers.as_mut().unwrap().add[0].name = "X-B".into()),
            "rules[0].filters.request_headers.add[0].name",
        ),
        (
            Box::new(|m| m.rules[0].filters.as_mut().unwrap().response_headers.as_mut().unwrap().remove[0].clear()),
            "rules[0].filters.response_headers.remove[0]",
        ),
        (Box::new(|m| m.rules[0].filters.as_mut().unwrap().mirrors[0].service.clear()), "rules[0].filters.mirrors[0].service"),
        (
            Box::new(|m| m.rules[0].filters.as_mut().unwrap().rewrite.as_mut().unwrap().path = Some(pb::PathRewrite { kind: None })),
            "rules[0].filters.rewrite.path",
        ),
        (Box::new(|m| m.rules[1].filters.as_mut().unwrap().redirect.as_mut().unwrap().status = 307), "rules[1].filters.redirect.status"),
        (Box::new(|m| m.rules[1].filters.as_mut().unwrap().redirect.as_mut().unwrap().port = Some(0)), "rules[1].filters.redirect.port"),
        (
            Box::new(|m| m.rules[1].filters.as_mut().unwrap().redirect.as_mut().unwrap().port = Some(65_536)),
            "rules[1].filters.redirect.port",
        ),
        (Box::new(|m| m.rules[0].timeout.as_mut().unwrap().seconds = -1), "rules[0].timeout"),
        (Box::new(|m| m.rules[0].backend_timeout.as_mut().unwrap().nanos = 1_000_000_000), "rules[0].backend_timeout.nanos"),
    ];
    for (edit, field) in cases {
        let mut m = pb::ServiceRoutes::from(&sample());
        edit(&mut m);
        let e = ServiceRoutes::try_from(m).unwrap_err();
        assert_eq!(e.field, field, "{e}");
    }
    let wrong = prost_types::Any { type_url: crate::NETWORK_POLICY_TYPE_URL.into(), value: vec![] };
    assert_eq!(routes_from_any(&wrong).unwrap_err().field, "resource.type_url");
}
