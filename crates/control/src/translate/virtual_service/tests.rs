//! Table tests: Istio's samples read as Istio reads them (defaults,
//! host resolution, weights, retries, faults, subsets, traffic
//! policies), and every refusal names its exact field.

use super::*;
use crate::objects::{parse_value, ClusterObject};
use slipstream_core::route::traffic::{FaultAbort, FaultDelay, HashOn};
use slipstream_core::route::{HeaderMatch, QueryMatch};

fn object(kind: &str, spec: &str) -> OpaqueObject {
    let doc = format!(
        "apiVersion: networking.istio.io/v1\nkind: {kind}\nmetadata: {{name: r, namespace: bookinfo, creationTimestamp: \"2024-01-01T00:00:00Z\"}}\nspec: {spec}\n"
    );
    let value: serde_json::Value = serde_yaml::from_str(&doc).unwrap_or_else(|e| panic!("{doc}: {e}"));
    match parse_value(value) {
        Ok(Some(ClusterObject::Opaque(o))) => *o,
        other => panic!("{other:?}"),
    }
}

fn vs(spec: &str) -> Result<VirtualServiceInput, ObjectError> {
    virtual_service(&object("VirtualService", spec), "cluster.local")
}

fn dr(spec: &str) -> Result<DestinationRuleInput, ObjectError> {
    destination_rule(&object("DestinationRule", spec), "cluster.local")
}

fn key(name: &str) -> String {
    format!("bookinfo/{name}.bookinfo.svc.cluster.local")
}

#[test]
fn bookinfo_reviews_jason_to_v2_else_v1() {
    // Istio's samples/bookinfo/networking/virtual-service-reviews-test-v2.yaml.
    let v = vs("{hosts: [reviews], http: [{match: [{headers: {end-user: {exact: jason}}}], route: [{destination: {host: reviews, subset: v2}}]}, {route: [{destination: {host: reviews, subset: v1}}]}]}").unwrap();
    assert_eq!(v.hosts, [key("reviews")]);
    let subset = |svc: &str, name: &str| Subset { name: format!("{svc}#{name}"), workloads: vec![], traffic: None };
    let rules = compile(&v, &subset);
    assert_eq!(rules.len(), 2);
    assert_eq!(rules[0].name, "bookinfo/r.0");
    assert_eq!(rules[0].matches[0].headers, [HeaderMatch { name: "end-user".into(), value: "jason".into() }]);
    assert_eq!(rules[0].matches[0].path, PathMatch::StringPrefix("/".into()), "no uri: every path");
    assert_eq!(rules[0].backends[0].weight, 100, "a lone destination takes everything");
    assert_eq!(rules[0].backends[0].subset.as_ref().unwrap().name, format!("{}#v2", key("reviews")));
    assert_eq!(rules[1].matches[0].path, PathMatch::StringPrefix("/".into()));
    assert_eq!(rules[1].backends[0].port, 0, "no port: the one dialed");
    assert_eq!(rules[1].retry, Some(Retry::istio_default()), "Istio's default retries when the route says none");
}

#[test]
fn weights_faults_retries_and_timeouts() {
    let v = vs(concat!(
        "{hosts: [reviews.bookinfo.svc.cluster.local], http: [{name: canary, ",
        "route: [{destination: {host: reviews, subset: v1, port: {number: 9080}}, weight: 75}, {destination: {host: reviews.bookinfo, subset: v3}, weight: 25}], ",
        "timeout: 1.5s, retries: {attempts: 3, perTryTimeout: 500ms, retryOn: \"5xx,connect-failure,429\"}, ",
        "fault: {delay: {fixedDelay: 7s, percentage: {value: 12.5}}, abort: {httpStatus: 500, percentage: {value: 0.1}}}}]}"
    ))
    .unwrap();
    let r = &v.rules[0];
    assert_eq!(r.name, "bookinfo/r.canary");
    assert_eq!(r.destinations.iter().map(|d| (d.weight, d.port)).collect::<Vec<_>>(), [(75, Some(9080)), (25, None)]);
    assert_eq!(r.destinations[1].service, key("reviews"));
    assert_eq!(r.timeout, Some(Duration::from_millis(1500)));
    let retry = r.retry.as_ref().unwrap();
    assert_eq!((retry.attempts, retry.per_try_timeout), (3, Some(Duration::from_millis(500))));
    assert!(retry.on.five_xx && retry.on.connect_failure && !retry.on.gateway_error);
    assert_eq!(retry.on.status_codes, [429]);
    let f = r.fault.as_ref().unwrap();
    assert_eq!(f.delay, Some(FaultDelay { per_million: 125_000, delay: Duration::from_secs(7) }));
    assert_eq!(f.abort, Some(FaultAbort { per_million: 1_000, status: 500 }));
    // attempts: 0 turns retries off; a fault without percentage is every request.
    let v = vs(
        "{hosts: [ratings], http: [{route: [{destination: {host: ratings}}], retries: {attempts: 0}, fault: {abort: {httpStatus: 503}}}]}",
    )
    .unwrap();
    assert_eq!(v.rules[0].retry, None);
    assert_eq!(v.rules[0].fault.as_ref().unwrap().abort, Some(FaultAbort { per_million: MILLION, status: 503 }));
    // Only attempts: Istio's default conditions.
    let v = vs("{hosts: [ratings], http: [{route: [{destination: {host: ratings}}], retries: {attempts: 5}}]}").unwrap();
    assert_eq!(v.rules[0].retry.as_ref().unwrap().on, Retry::istio_default().on);
}

#[test]
fn matches_each_become_an_entry_in_order() {
    let v = vs(concat!(
        "{hosts: [productpage], http: [",
        "{match: [{uri: {exact: /productpage}}, {uri: {prefix: /static}, port: 9080}, {uri: {prefix: /api/v1/products}, method: {exact: GET}, ignoreUriCase: true, queryParams: {u: {prefix: ab}}}], ",
        "rewrite: {uri: /v2/}, headers: {request: {set: {X-A: \"1\"}, remove: [x-b]}, response: {add: {x-c: \"2\"}}}, ",
        "route: [{destination: {host: productpage}}]},",
        "{match: [{uri: {prefix: /old}}], redirect: {uri: /new, authority: example.com, redirectCode: 308}}]}"
    ))
    .unwrap();
    let rules = compile(&v, &|_: &str, _: &str| Subset::default());
    let paths: Vec<(PathMatch, u16)> = rules.iter().map(|r| (r.matches[0].path.clone(), r.port)).collect();
    assert_eq!(
        paths,
        [
            (PathMatch::Exact("/productpage".into()), 0),
            (PathMatch::StringPrefix("/static".into()), 9080),
            (PathMatch::StringPrefix("/api/v1/products".into()), 0),
            (PathMatch::StringPrefix("/old".into()), 0),
        ],
        "the order written, not by specificity"
    );
    // Under the exact match the rewrite replaces the whole path.
    assert_eq!(rules[0].filters.rewrite.as_ref().unwrap().path, Some(PathRewrite::ReplaceFullPath("/v2/".into())));
    assert_eq!(rules[1].filters.rewrite.as_ref().unwrap().path, Some(PathRewrite::ReplacePrefixMatch("/v2/".into())));
    assert!(rules[2].matches[0].ignore_case);
    assert_eq!(rules[2].matches[0].method.as_deref(), Some("GET"));
    assert_eq!(rules[2].matches[0].query_prefixes, [QueryMatch { name: "u".into(), value: "ab".into() }]);
    assert_eq!(rules[0].filters.request_headers.set, [("x-a".to_string(), "1".to_string())]);
    assert_eq!(rules[0].filters.response_headers.add, [("x-c".to_string(), "2".to_string())]);
    let r = rules[3].filters.redirect.as_ref().unwrap();
    assert_eq!(
        (r.status, r.hostname.as_deref(), r.path.clone()),
        (308, Some("example.com"), Some(PathRewrite::ReplaceFullPath("/new".into())))
    );
}

#[test]
fn gateways_other_than_mesh_do_not_apply_to_the_waypoint() {
    let v = vs("{hosts: [productpage], gateways: [bookinfo-gateway], http: [{route: [{destination: {host: productpage}}]}]}").unwrap();
    assert!(v.rules.is_empty());
    let v =
        vs("{hosts: [productpage], gateways: [bookinfo-gateway, mesh], http: [{route: [{destination: {host: productpage}}]}]}").unwrap();
    assert_eq!(v.rules.len(), 1);
    let v =
        vs("{hosts: [p], http: [{match: [{gateways: [gw], uri: {prefix: /a}}, {uri: {prefix: /b}}], route: [{destination: {host: p}}]}]}")
            .unwrap();
    assert_eq!(v.rules[0].matches.len(), 1, "the match for another gateway is left out");
}

#[test]
fn mirrors_take_a_percentage() {
    let v = vs("{hosts: [httpbin], http: [{route: [{destination: {host: httpbin, subset: v1}}], mirror: {host: httpbin, subset: v2}, mirrorPercentage: {value: 50.0}}]}")
        .unwrap();
    let rules = compile(&v, &|s: &str, n: &str| Subset { name: format!("{s}#{n}"), ..Default::default() });
    assert_eq!(rules[0].filters.mirrors.len(), 1);
    assert_eq!(rules[0].filters.mirrors[0].subset.as_ref().unwrap().name, format!("{}#v2", key("httpbin")));
    assert_eq!(rules[0].filters.mirror_per_million, Some(500_000));
}

#[test]
fn virtual_service_refusals_name_the_field() {
    let cases = [
        ("{http: []}", "spec.hosts", "required"),
        ("{hosts: [\"*.example.com\"], http: []}", "spec.hosts[0]", "not a Kubernetes service"),
        ("{hosts: [www.example.com], http: []}", "spec.hosts[0]", "ServiceEntry"),
        ("{hosts: [a], tcp: [{route: []}]}", "spec.tcp", "not supported"),
        (
            "{hosts: [a], http: [{match: [{uri: {regex: \"/a.*\"}}], route: [{destination: {host: a}}]}]}",
            "spec.http[0].match[0].uri.regex",
            "regular expressions",
        ),
        (
            "{hosts: [a], http: [{match: [{uri: {exact: a}}], route: [{destination: {host: a}}]}]}",
            "spec.http[0].match[0].uri",
            "must start with /",
        ),
        (
            "{hosts: [a], http: [{match: [{sourceLabels: {app: x}}], route: [{destination: {host: a}}]}]}",
            "spec.http[0].match[0].sourceLabels",
            "not supported",
        ),
        (
            "{hosts: [a], http: [{match: [{headers: {x: {}}}], route: [{destination: {host: a}}]}]}",
            "spec.http[0].match[0].headers.x",
            "exactly one of exact or prefix",
        ),
        (
            "{hosts: [a], http: [{route: [{destination: {host: a}}, {destination: {host: b}, weight: 0}]}]}",
            "spec.http[0].route",
            "every weight is 0",
        ),
        ("{hosts: [a], http: [{route: [{destination: {host: a}, weight: -1}]}]}", "spec.http[0].route[0].weight", "between"),
        (
            "{hosts: [a], http: [{route: [{destination: {host: a, port: {number: 70000}}}]}]}",
            "spec.http[0].route[0].destination.port.number",
            "between 1 and 65535",
        ),
        (
            "{hosts: [a], http: [{route: [{destination: {host: a}, headers: {request: {set: {a: b}}}}]}]}",
            "spec.http[0].route[0].headers",
            "not supported",
        ),
        ("{hosts: [a], http: [{}]}", "spec.http[0].route", "required"),
        ("{hosts: [a], http: [{route: [{destination: {host: a}}], redirect: {uri: /x}}]}", "spec.http[0].redirect", "not both"),
        ("{hosts: [a], http: [{redirect: {uri: /x, redirectCode: 200}}]}", "spec.http[0].redirect.redirectCode", "not 301"),
        ("{hosts: [a], http: [{route: [{destination: {host: a}}], timeout: 10}]}", "spec.http[0].timeout", "invalid type"),
        ("{hosts: [a], http: [{route: [{destination: {host: a}}], timeout: 10x}]}", "spec.http[0].timeout", "not a duration"),
        (
            "{hosts: [a], http: [{route: [{destination: {host: a}}], retries: {attempts: 2, retryOn: \"5xx,bogus\"}}]}",
            "spec.http[0].retries.retryOn",
            "\"bogus\"",
        ),
        (
            "{hosts: [a], http: [{route: [{destination: {host: a}}], retries: {attempts: 2, backoff: 1s}}]}",
            "spec.http[0].retries.backoff",
            "not supported",
        ),
        ("{hosts: [a], http: [{route: [{destination: {host: a}}], fault: {}}]}", "spec.http[0].fault", "a delay or an abort"),
        (
            "{hosts: [a], http: [{route: [{destination: {host: a}}], fault: {abort: {httpStatus: 700}}}]}",
            "spec.http[0].fault.abort.httpStatus",
            "between 200 and 599",
        ),
        (
            "{hosts: [a], http: [{route: [{destination: {host: a}}], fault: {abort: {grpcStatus: UNAVAILABLE}}}]}",
            "spec.http[0].fault.abort.grpcStatus",
            "not supported",
        ),
        (
            "{hosts: [a], http: [{route: [{destination: {host: a}}], fault: {delay: {fixedDelay: 1s, percentage: {value: 101}}}}]}",
            "spec.http[0].fault.delay.percentage.value",
            "between 0 and 100",
        ),
        (
            "{hosts: [a], http: [{route: [{destination: {host: a}}], fault: {delay: {percentage: {value: 1}}}}]}",
            "spec.http[0].fault.delay.fixedDelay",
            "required",
        ),
        ("{hosts: [a], http: [{directResponse: {status: 200}}]}", "spec.http[0].directResponse", "not supported"),
        (
            "{hosts: [a], http: [{route: [{destination: {host: a}}], rewrite: {uriRegexRewrite: {match: a, rewrite: b}}}]}",
            "spec.http[0].rewrite.uriRegexRewrite",
            "regular",
        ),
        ("{hosts: [a], http: [{route: [{destination: {host: a, subset: \"\"}}]}]}", "spec.http[0].route[0].destination.subset", "empty"),
    ];
    for (spec, field, message) in cases {
        let e = vs(spec).expect_err(spec);
        assert_eq!(e.field, field, "{spec}: {e}");
        assert!(e.message.contains(message), "{spec}: {e}");
        assert_eq!((e.kind.as_str(), e.namespace.as_str(), e.name.as_str()), ("VirtualService", "bookinfo", "r"), "{spec}");
    }
}

#[test]
fn destination_rules_resolve_hosts_subsets_and_policies() {
    // Istio's samples/bookinfo/networking/destination-rule-all.yaml, reviews.
    let d = dr("{host: reviews, trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}, subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}, trafficPolicy: {loadBalancer: {simple: ROUND_ROBIN}}}, {name: v3, labels: {version: v3}}]}").unwrap();
    assert_eq!(d.host, key("reviews"));
    assert_eq!(d.applies(&key("reviews")), 2);
    assert_eq!(d.applies(&key("ratings")), 0);
    assert_eq!(d.subsets.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["v1", "v2", "v3"]);
    assert_eq!(d.subsets[1].labels.get("version").map(String::as_str), Some("v2"));
    let base = d.traffic.as_ref();
    assert_eq!(TrafficInput::merged(base, None), TrafficPolicy::default(), "TLS only: the defaults, LEAST_REQUEST");
    assert_eq!(TrafficInput::merged(base, d.subsets[1].traffic.as_ref()).lb, LoadBalancer::RoundRobin);
    // Circuit breaking, as Istio's task writes it.
    let d = dr("{host: httpbin, trafficPolicy: {connectionPool: {tcp: {maxConnections: 1}, http: {http1MaxPendingRequests: 1}}, outlierDetection: {consecutive5xxErrors: 1, interval: 1s, baseEjectionTime: 3m, maxEjectionPercent: 100}}}").unwrap();
    let t = TrafficInput::merged(d.traffic.as_ref(), None);
    assert_eq!(t.max_requests, Some(2));
    assert_eq!(
        t.outlier,
        Some(OutlierDetection {
            consecutive_5xx: Some(1),
            consecutive_gateway: None,
            base_ejection: Duration::from_secs(180),
            max_ejection_percent: 100
        })
    );
    let d = dr("{host: httpbin, trafficPolicy: {connectionPool: {http: {http2MaxRequests: 10}}, loadBalancer: {consistentHash: {httpHeaderName: X-User}}}}").unwrap();
    let t = TrafficInput::merged(d.traffic.as_ref(), None);
    assert_eq!((t.max_requests, t.lb), (Some(10), LoadBalancer::Hash(HashOn::Header("x-user".into()))));
    // A subset's connectionPool replaces the rule's; its absent fields keep the rule's.
    let over = TrafficInput { pool: Some(None), ..Default::default() };
    let merged = TrafficInput::merged(d.traffic.as_ref(), Some(&over));
    assert_eq!((merged.max_requests, merged.lb), (None, LoadBalancer::Hash(HashOn::Header("x-user".into()))));
    // Wildcards.
    let d = dr("{host: \"*.bookinfo.svc.cluster.local\"}").unwrap();
    assert_eq!((d.applies(&key("reviews")), d.applies("other/x.other.svc.cluster.local")), (1, 0));
    assert_eq!(dr("{host: \"*\"}").unwrap().applies(&key("reviews")), 1);
    // Outlier defaults: Envoy's 5 consecutive 5xx, 30 s, 10 %.
    let d = dr("{host: a, trafficPolicy: {outlierDetection: {}}}").unwrap();
    let o = TrafficInput::merged(d.traffic.as_ref(), None).outlier.unwrap();
    assert_eq!((o.consecutive_5xx, o.base_ejection, o.max_ejection_percent), (Some(5), Duration::from_secs(30), 10));
}

#[test]
fn destination_rule_refusals_name_the_field() {
    let cases = [
        ("{}", "spec.host", "required"),
        ("{host: a, workloadSelector: {matchLabels: {a: b}}}", "spec.workloadSelector", "not supported"),
        ("{host: a, subsets: [{name: v1}, {name: v1}]}", "spec.subsets[1].name", "named twice"),
        ("{host: a, trafficPolicy: {loadBalancer: {simple: PASSTHROUGH}}}", "spec.trafficPolicy.loadBalancer.simple", "PASSTHROUGH"),
        ("{host: a, trafficPolicy: {loadBalancer: {simple: FASTEST}}}", "spec.trafficPolicy.loadBalancer.simple", "\"FASTEST\""),
        ("{host: a, trafficPolicy: {loadBalancer: {consistentHash: {}}}}", "spec.trafficPolicy.loadBalancer.consistentHash", "exactly one"),
        (
            "{host: a, trafficPolicy: {loadBalancer: {consistentHash: {httpCookie: {name: u, ttl: 0s}}}}}",
            "spec.trafficPolicy.loadBalancer.consistentHash.httpCookie.ttl",
            "not supported",
        ),
        (
            "{host: a, trafficPolicy: {loadBalancer: {localityLbSetting: {enabled: true}}}}",
            "spec.trafficPolicy.loadBalancer.localityLbSetting",
            "not supported",
        ),
        ("{host: a, trafficPolicy: {tls: {mode: SIMPLE}}}", "spec.trafficPolicy.tls.mode", "ISTIO_MUTUAL"),
        (
            "{host: a, trafficPolicy: {connectionPool: {tcp: {connectTimeout: 1s}}}}",
            "spec.trafficPolicy.connectionPool.tcp.connectTimeout",
            "not supported",
        ),
        (
            "{host: a, trafficPolicy: {connectionPool: {http: {maxRequestsPerConnection: 1}}}}",
            "spec.trafficPolicy.connectionPool.http.maxRequestsPerConnection",
            "not supported",
        ),
        (
            "{host: a, trafficPolicy: {connectionPool: {tcp: {maxConnections: 0}}}}",
            "spec.trafficPolicy.connectionPool.tcp.maxConnections",
            "between 1",
        ),
        (
            "{host: a, trafficPolicy: {outlierDetection: {maxEjectionPercent: 101}}}",
            "spec.trafficPolicy.outlierDetection.maxEjectionPercent",
            "between 0 and 100",
        ),
        (
            "{host: a, trafficPolicy: {outlierDetection: {baseEjectionTime: soon}}}",
            "spec.trafficPolicy.outlierDetection.baseEjectionTime",
            "not a duration",
        ),
        ("{host: a, trafficPolicy: {portLevelSettings: [{port: {number: 80}}]}}", "spec.trafficPolicy.portLevelSettings", "not supported"),
        (
            "{host: a, subsets: [{name: v1, trafficPolicy: {loadBalancer: {simple: NOPE}}}]}",
            "spec.subsets[0].trafficPolicy.loadBalancer.simple",
            "\"NOPE\"",
        ),
        ("{host: www.example.com}", "spec.host", "ServiceEntry"),
    ];
    for (spec, field, message) in cases {
        let e = dr(spec).expect_err(spec);
        assert_eq!(e.field, field, "{spec}: {e}");
        assert!(e.message.contains(message), "{spec}: {e}");
    }
}

#[test]
fn durations_as_go_writes_them() {
    let d = |s: &str| duration(|m| ObjectError::new(&ObjectRef::new(Kind::VirtualService, "a", "b"), "f", m), s);
    assert_eq!(d("10s").unwrap(), Some(Duration::from_secs(10)));
    assert_eq!(d("1.5s").unwrap(), Some(Duration::from_millis(1500)));
    assert_eq!(d("500ms").unwrap(), Some(Duration::from_millis(500)));
    assert_eq!(d("1m30s").unwrap(), Some(Duration::from_secs(90)));
    assert_eq!(d("3m").unwrap(), Some(Duration::from_secs(180)));
    assert_eq!(d("1h").unwrap(), Some(Duration::from_secs(3600)));
    assert_eq!(d("0s").unwrap(), None);
    assert_eq!(d("0").unwrap(), None);
    for bad in ["", "10", "s", "-1s", "1d", "1.2.3s"] {
        assert!(d(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn hosts_are_resolved_in_the_cluster_domain() {
    let corp = |spec: &str| virtual_service(&object("VirtualService", spec), "corp.example");
    let v = corp("{hosts: [reviews.bookinfo.svc.corp.example, ratings], http: [{route: [{destination: {host: reviews.bookinfo.svc}}]}]}")
        .unwrap();
    assert_eq!(v.hosts, ["bookinfo/reviews.bookinfo.svc.corp.example", "bookinfo/ratings.bookinfo.svc.corp.example"]);
    assert_eq!(v.rules[0].destinations[0].service, "bookinfo/reviews.bookinfo.svc.corp.example");
    // Another domain's full name is not a service of this cluster.
    let e = corp("{hosts: [reviews.bookinfo.svc.cluster.local], http: [{route: [{destination: {host: reviews}}]}]}").unwrap_err();
    assert_eq!(e.field, "spec.hosts[0]");
    assert!(e.message.contains("name.namespace.svc.corp.example"), "{e}");
    let d = destination_rule(&object("DestinationRule", "{host: reviews.bookinfo.svc.corp.example}"), "corp.example").unwrap();
    assert_eq!(d.host, "bookinfo/reviews.bookinfo.svc.corp.example");
}
