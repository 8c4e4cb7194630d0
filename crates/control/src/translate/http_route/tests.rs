//! Table tests: each refusal names its exact field, Gateway API's defaults
//! are applied, and compiling orders and resolves the rules.

use super::*;
use crate::objects::{parse_value, ClusterObject};
use slipstream_core::route::{HeaderMatch, HeaderModifier, QueryMatch, Redirect, Rewrite};

fn object(meta: &str, spec: &str) -> OpaqueObject {
    let doc = format!("apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {meta}\nspec: {spec}\n");
    let value: serde_json::Value = serde_yaml::from_str(&doc).unwrap_or_else(|e| panic!("{doc}: {e}"));
    match parse_value(value) {
        Ok(Some(ClusterObject::Opaque(o))) => *o,
        other => panic!("{other:?}"),
    }
}

fn read(spec: &str) -> Result<HttpRouteInput, ObjectError> {
    http_route(&object("{name: r, namespace: demo, creationTimestamp: \"2024-01-01T00:00:00Z\"}", spec))
}

fn reader() -> Reader {
    Reader { r: ObjectRef::new(Kind::HTTPRoute, "demo", "r") }
}

// a table of malformed routes, one case and its expected field each.
#[allow(clippy::too_many_lines)]
#[test]
fn refusals_name_the_field() {
    let cases = [
        (
            "{rules: [{matches: [{path: {type: PathPrefix, value: /a}}, {path: {type: RegularExpression, value: \"/a.*\"}}]}]}",
            "spec.rules[0].matches[1].path.type",
            "RegularExpression is not supported; use Exact or PathPrefix",
        ),
        (
            "{rules: [{matches: [{headers: [{type: RegularExpression, name: x-user, value: \"j.*\"}]}]}]}",
            "spec.rules[0].matches[0].headers[0].type",
            "RegularExpression is not supported; use Exact",
        ),
        (
            "{rules: [{matches: [{queryParams: [{name: a, value: b}, {type: RegularExpression, name: v, value: \"[0-9]\"}]}]}]}",
            "spec.rules[0].matches[0].queryParams[1].type",
            "RegularExpression is not supported; use Exact",
        ),
        ("{rules: [{matches: [{path: {type: Glob, value: /a}}]}]}", "spec.rules[0].matches[0].path.type", "\"Glob\" is not a path match type"),
        ("{rules: [{matches: [{path: {value: api}}]}]}", "spec.rules[0].matches[0].path.value", "must be an absolute path"),
        ("{rules: [{matches: [{path: {value: /a//b}}]}]}", "spec.rules[0].matches[0].path.value", "must not contain \"//\""),
        ("{rules: [{matches: [{method: FETCH}]}]}", "spec.rules[0].matches[0].method", "\"FETCH\" is not one of GET"),
        (
            "{rules: [{filters: [{type: ExtensionRef, extensionRef: {group: example.com, kind: Filter, name: f}}]}]}",
            "spec.rules[0].filters[0].type",
            "ExtensionRef filters are not supported",
        ),
        ("{rules: [{filters: [{type: CORS, cors: {}}]}]}", "spec.rules[0].filters[0].type", "CORS filters (experimental) are not supported"),
        ("{rules: [{filters: [{type: Magic}]}]}", "spec.rules[0].filters[0].type", "\"Magic\" is not a filter type"),
        (
            "{rules: [{sessionPersistence: {sessionName: s, type: Cookie}}]}",
            "spec.rules[0].sessionPersistence",
            "session persistence is not supported",
        ),
        ("{rules: [{}, {retry: {attempts: 3}}]}", "spec.rules[1].retry", "retries (experimental) are not supported"),
        (
            "{rules: [{backendRefs: [{group: multicluster.x-k8s.io, kind: ServiceImport, name: reviews, port: 9080}]}]}",
            "spec.rules[0].backendRefs[0].kind",
            "a backend of kind ServiceImport (group \"multicluster.x-k8s.io\") is not supported",
        ),
        (
            "{rules: [{backendRefs: [{name: a, port: 80}, {name: b, port: 80, filters: [{type: RequestHeaderModifier}]}]}]}",
            "spec.rules[0].backendRefs[1].filters",
            "backendRef filters are not supported",
        ),
        ("{rules: [{backendRefs: [{name: a, port: 80, weight: 1000001}]}]}", "spec.rules[0].backendRefs[0].weight", "is not a weight"),
        ("{rules: [{backendRefs: [{name: a, port: 0}]}]}", "spec.rules[0].backendRefs[0].port", "0 is not a port"),
        (
            "{rules: [{filters: [{type: RequestMirror, requestMirror: {backendRef: {kind: ServiceImport, group: multicluster.x-k8s.io, name: m}}}]}]}",
            "spec.rules[0].filters[0].requestMirror.backendRef.kind",
            "a backend of kind ServiceImport",
        ),
        (
            "{rules: [{filters: [{type: RequestMirror, requestMirror: {backendRef: {name: m, port: 80}, percent: 10}}]}]}",
            "spec.rules[0].filters[0].requestMirror.percent",
            "mirroring a part of the requests is not supported",
        ),
        (
            "{rules: [{filters: [{type: RequestMirror, requestMirror: {backendRef: {name: m, port: 80}, fraction: {numerator: 1}}}]}]}",
            "spec.rules[0].filters[0].requestMirror.fraction",
            "mirroring a part",
        ),
        (
            "{rules: [{filters: [{type: RequestHeaderModifier}]}]}",
            "spec.rules[0].filters[0].requestHeaderModifier",
            "required by the filter's type",
        ),
        (
            "{rules: [{filters: [{type: RequestHeaderModifier, requestHeaderModifier: {}}, {type: RequestHeaderModifier, requestHeaderModifier: {}}]}]}",
            "spec.rules[0].filters[1].type",
            "a rule takes one RequestHeaderModifier filter",
        ),
        (
            "{rules: [{filters: [{type: RequestRedirect, requestRedirect: {statusCode: 307}}]}]}",
            "spec.rules[0].filters[0].requestRedirect.statusCode",
            "307 is not supported; use 301 or 302",
        ),
        (
            "{rules: [{filters: [{type: RequestRedirect, requestRedirect: {scheme: ftp}}]}]}",
            "spec.rules[0].filters[0].requestRedirect.scheme",
            "\"ftp\" is not http or https",
        ),
        (
            "{rules: [{filters: [{type: RequestRedirect, requestRedirect: {port: 70000}}]}]}",
            "spec.rules[0].filters[0].requestRedirect.port",
            "70000 is not a port",
        ),
        (
            "{rules: [{filters: [{type: RequestRedirect, requestRedirect: {}}], backendRefs: [{name: a, port: 80}]}]}",
            "spec.rules[0].backendRefs",
            "takes no backendRefs",
        ),
        (
            "{rules: [{filters: [{type: RequestRedirect, requestRedirect: {}}, {type: URLRewrite, urlRewrite: {}}]}]}",
            "spec.rules[0].filters",
            "RequestRedirect or URLRewrite, not both",
        ),
        (
            "{rules: [{filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplaceSome}}}]}]}",
            "spec.rules[0].filters[0].urlRewrite.path.type",
            "\"ReplaceSome\" is not one of ReplaceFullPath, ReplacePrefixMatch",
        ),
        (
            "{rules: [{filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplaceFullPath}}}]}]}",
            "spec.rules[0].filters[0].urlRewrite.path.replaceFullPath",
            "required by type ReplaceFullPath",
        ),
        (
            "{rules: [{matches: [{path: {type: Exact, value: /a}}], filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /b}}}]}]}",
            "spec.rules[0].matches",
            "exactly one match, of type PathPrefix",
        ),
        (
            "{rules: [{matches: [{path: {value: /a}}, {path: {value: /c}}], filters: [{type: RequestRedirect, requestRedirect: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /b}}}]}]}",
            "spec.rules[0].matches",
            "exactly one match",
        ),
        ("{rules: [{timeouts: {request: \"10\"}}]}", "spec.rules[0].timeouts.request", "\"10\" is not a duration"),
        ("{rules: [{timeouts: {request: 1d}}]}", "spec.rules[0].timeouts.request", "is not a duration"),
        ("{rules: [{timeouts: {backendRequest: 123456s}}]}", "spec.rules[0].timeouts.backendRequest", "is not a duration"),
        ("{rules: [{timeouts: {request: 1s, backendRequest: 2s}}]}", "spec.rules[0].timeouts.backendRequest", "is longer than timeouts.request"),
        (
            "{parentRefs: [{group: multicluster.x-k8s.io, kind: ServiceImport, name: reviews}]}",
            "spec.parentRefs[0].kind",
            "a parent of kind ServiceImport (group \"multicluster.x-k8s.io\") is not supported",
        ),
        (
            "{parentRefs: [{name: gw}, {group: \"\", kind: Service, name: reviews, sectionName: http}]}",
            "spec.parentRefs[1].sectionName",
            "not supported for a Service parent",
        ),
        ("{parentRefs: [{group: \"\", kind: Service, name: reviews, port: 0}]}", "spec.parentRefs[0].port", "0 is not a port (1-65535)"),
        // Type errors come with their path too (serde_path_to_error).
        ("{rules: [{backendRefs: [{name: a, port: x}]}]}", "spec.rules[0].backendRefs[0].port", "invalid type: string \"x\""),
        ("{parentRefs: [{kind: Service}]}", "spec.parentRefs[0]", "missing field `name`"),
        ("text", "spec", "invalid type: string \"text\""),
    ];
    for (spec, field, message) in cases {
        let e = read(spec).expect_err(spec);
        assert_eq!((e.kind.as_str(), e.namespace.as_str(), e.name.as_str()), ("HTTPRoute", "demo", "r"), "{spec}");
        assert_eq!(e.field, field, "{spec}: {e}");
        assert!(e.message.contains(message), "{spec}: {e}");
    }
}

// a table of defaults, one line each.
#[allow(clippy::too_many_lines)]
#[test]
fn gateway_api_defaults() {
    // No rules at all: the CRD's default rule, matching every request.
    let r = read("{parentRefs: [{group: \"\", kind: Service, name: reviews}]}").unwrap();
    assert_eq!(r.creation.as_deref(), Some("2024-01-01T00:00:00Z"));
    assert_eq!(r.parents, [ServiceParent { namespace: "demo".into(), name: "reviews".into(), port: None }]);
    assert_eq!(r.rules.len(), 1);
    assert_eq!(r.rules[0].matches, [RouteMatch::default()]);
    assert!(r.rules[0].backends.is_empty());
    assert_eq!(read("{rules: []}").unwrap().rules, [], "an explicit empty list is no rules");
    assert_eq!(read("null").unwrap().rules.len(), 1);

    let r = read(
        r#"{
          parentRefs: [{name: ingress}, {name: other-gw, namespace: infra, sectionName: https},
                       {group: "", kind: Service, name: reviews, namespace: bookinfo, port: 9080}],
          hostnames: [reviews.example.com],
          rules: [
            {name: ignored, unknownField: 1, backendRefs: [{name: v1, port: 9080}, {name: v2, namespace: canary, weight: 0}]},
            {matches: [{}, {path: {value: /api}}, {path: {type: Exact}},
                       {headers: [{name: X-User, value: a}, {name: x-user, value: b}, {type: Exact, name: X-Team, value: c}],
                        queryParams: [{name: v, value: "1"}, {name: V, value: "2"}, {name: v, value: "3"}], method: GET}],
             filters: [
               {type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: X-A, value: "1"}], add: [{name: x-b, value: "2"}], remove: [X-C]}},
               {type: ResponseHeaderModifier, responseHeaderModifier: {remove: [server]}},
               {type: URLRewrite, urlRewrite: {hostname: internal, path: {type: ReplacePrefixMatch, replacePrefixMatch: ""}}},
               {type: RequestMirror, requestMirror: {backendRef: {name: shadow, port: 8080}}},
               {type: RequestMirror, requestMirror: {backendRef: {name: shadow2, namespace: other}}}],
             timeouts: {request: 1h2m, backendRequest: 500ms}},
            {filters: [{type: RequestRedirect, requestRedirect: {scheme: https, port: 8443, path: {type: ReplaceFullPath, replaceFullPath: /new}}}],
             timeouts: {request: 0s}}
          ]}"#,
    );
    let e = r.expect_err("two filters on one rule with several matches and a ReplacePrefixMatch");
    assert_eq!(e.field, "spec.rules[1].matches");

    let r = read(
        r#"{
          parentRefs: [{name: ingress}, {name: other-gw, namespace: infra, sectionName: https},
                       {group: "", kind: Service, name: reviews, namespace: bookinfo, port: 9080}],
          hostnames: [reviews.example.com],
          rules: [
            {name: ignored, unknownField: 1, backendRefs: [{name: v1, port: 9080}, {name: v2, namespace: canary, weight: 0}]},
            {matches: [{}, {path: {value: /api}}, {path: {type: Exact}},
                       {headers: [{name: X-User, value: a}, {name: x-user, value: b}, {type: Exact, name: X-Team, value: c}],
                        queryParams: [{name: v, value: "1"}, {name: V, value: "2"}, {name: v, value: "3"}], method: GET}],
             filters: [
               {type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: X-A, value: "1"}], add: [{name: x-b, value: "2"}], remove: [X-C]}},
               {type: ResponseHeaderModifier, responseHeaderModifier: {remove: [server]}},
               {type: URLRewrite, urlRewrite: {hostname: internal, path: {type: ReplaceFullPath, replaceFullPath: /v2}}},
               {type: RequestMirror, requestMirror: {backendRef: {name: shadow, port: 8080}}},
               {type: RequestMirror, requestMirror: {backendRef: {name: shadow2, namespace: other}}}],
             timeouts: {request: 1h2m, backendRequest: 500ms}},
            {filters: [{type: RequestRedirect, requestRedirect: {scheme: https, port: 8443, path: {type: ReplacePrefixMatch, replacePrefixMatch: ""}}}],
             timeouts: {request: 0s}}
          ]}"#,
    )
    .unwrap();
    assert_eq!(r.gateway_parents, [("demo".to_string(), "ingress".to_string()), ("infra".into(), "other-gw".into())]);
    assert_eq!(r.parents, [ServiceParent { namespace: "bookinfo".into(), name: "reviews".into(), port: Some(9080) }]);
    assert_eq!(r.hostnames, ["reviews.example.com"]);

    let r0 = &r.rules[0];
    assert_eq!(r0.matches, [RouteMatch::default()], "a rule without matches gets PathPrefix /");
    assert_eq!(
        r0.backends,
        [
            BackendRef { namespace: "demo".into(), name: "v1".into(), port: Some(9080), weight: 1 },
            BackendRef { namespace: "canary".into(), name: "v2".into(), port: None, weight: 0 },
        ]
    );
    assert_eq!((r0.timeout, r0.backend_timeout), (None, None));

    let r1 = &r.rules[1];
    assert_eq!(r1.matches[0], RouteMatch::default(), "a match without path is PathPrefix /");
    assert_eq!(r1.matches[1].path, PathMatch::Prefix("/api".into()), "the path type defaults to PathPrefix");
    assert_eq!(r1.matches[2].path, PathMatch::Exact("/".into()), "the path value defaults to /");
    assert_eq!(
        r1.matches[3],
        RouteMatch {
            path: PathMatch::default(),
            headers: vec![
                HeaderMatch { name: "x-user".into(), value: "a".into() },
                HeaderMatch { name: "x-team".into(), value: "c".into() },
            ],
            query: vec![QueryMatch { name: "v".into(), value: "1".into() }, QueryMatch { name: "V".into(), value: "2".into() }],
            method: Some("GET".into()),
            ..Default::default()
        },
        "header names lower-cased, the first of equivalent names counts; query names are case-sensitive"
    );
    assert_eq!(
        r1.filters,
        Filters {
            request_headers: HeaderModifier {
                set: vec![("x-a".into(), "1".into())],
                add: vec![("x-b".into(), "2".into())],
                remove: vec!["x-c".into()]
            },
            response_headers: HeaderModifier { remove: vec!["server".into()], ..Default::default() },
            redirect: None,
            rewrite: Some(Rewrite { hostname: Some("internal".into()), path: Some(PathRewrite::ReplaceFullPath("/v2".into())) }),
            mirrors: vec![],
            mirror_per_million: None,
        }
    );
    assert_eq!(
        r1.mirrors,
        [
            BackendRef { namespace: "demo".into(), name: "shadow".into(), port: Some(8080), weight: 1 },
            BackendRef { namespace: "other".into(), name: "shadow2".into(), port: None, weight: 1 },
        ]
    );
    assert_eq!((r1.timeout, r1.backend_timeout), (Some(Duration::from_secs(3720)), Some(Duration::from_millis(500))));

    let r2 = &r.rules[2];
    assert_eq!(
        r2.filters.redirect,
        Some(Redirect {
            scheme: Some("https".into()),
            hostname: None,
            path: Some(PathRewrite::ReplacePrefixMatch(String::new())),
            port: Some(8443),
            status: 302,
        }),
        "302 by default; an empty replacement prefix is allowed"
    );
    assert_eq!(r2.timeout, None, "0s is no timeout");
}

#[test]
fn durations() {
    let rd = reader();
    let ok = [
        ("10s", Some(Duration::from_secs(10))),
        ("500ms", Some(Duration::from_millis(500))),
        ("1h2m", Some(Duration::from_secs(3720))),
        ("1h30m10s500ms", Some(Duration::from_millis(5_410_500))),
        ("1m1ms", Some(Duration::from_millis(60_001))),
        ("99999h", Some(Duration::from_secs(99_999 * 3600))),
        ("0s", None),
        ("0h0ms", None),
    ];
    for (s, want) in ok {
        assert_eq!(duration(&rd, s, "f").unwrap(), want, "{s}");
    }
    for bad in ["", "10", "s", "1d", "-1s", "1.5s", "123456s", "1h1m1s1ms1h", "10 s", "1us"] {
        assert!(duration(&rd, bad, "f").is_err(), "{bad:?}");
    }
}

fn route(ns: &str, name: &str, created: Option<&str>, spec: &str) -> HttpRouteInput {
    let meta = match created {
        Some(c) => format!("{{name: {name}, namespace: {ns}, creationTimestamp: \"{c}\"}}"),
        None => format!("{{name: {name}, namespace: {ns}}}"),
    };
    http_route(&object(&meta, spec)).unwrap()
}

/// (name, port, the match's path, backends as `key:port/weight`).
fn summary(s: &ServiceRoutes) -> Vec<(String, u16, String, Vec<String>)> {
    s.rules
        .iter()
        .map(|r| {
            assert_eq!(r.matches.len(), 1, "one match per entry");
            let path = match &r.matches[0].path {
                PathMatch::Exact(p) => format!("={p}"),
                PathMatch::Prefix(p) | PathMatch::StringPrefix(p) => p.clone(),
            };
            let backends = r.backends.iter().map(|b| format!("{}:{}/{}", b.service, b.port, b.weight)).collect();
            (r.name.clone(), r.port, path, backends)
        })
        .collect()
}

#[test]
fn compile_orders_and_resolves() {
    const OLD: Option<&str> = Some("2024-01-01T00:00:00Z");
    const NEW: Option<&str> = Some("2024-06-01T00:00:00Z");
    let parent = "{group: \"\", kind: Service, name: reviews}";
    let parent_9080 = "{group: \"\", kind: Service, name: reviews, port: 9080}";
    let canary = route(
        "bookinfo",
        "canary",
        NEW,
        &format!(
            "{{parentRefs: [{parent_9080}], rules: [
               {{matches: [{{path: {{type: Exact, value: /health}}}}, {{path: {{value: /}}}}],
                backendRefs: [{{name: reviews-v1, weight: 90}}, {{name: reviews-v2, weight: 10}}],
                filters: [{{type: RequestMirror, requestMirror: {{backendRef: {{name: shadow}}}}}}]}}]}}"
        ),
    );
    let api = route(
        "bookinfo",
        "api",
        OLD,
        &format!(
            "{{parentRefs: [{parent}, {parent_9080}], rules: [
               {{matches: [{{path: {{value: /api}}}}], backendRefs: [{{name: api, port: 8080}}]}},
               {{matches: [{{path: {{value: /api}}, method: POST}}], backendRefs: [{{name: api-writer}}]}}]}}"
        ),
    );
    // Same specificity as `api`'s first rule, newer: ranks after it.
    let api_new = route(
        "bookinfo",
        "api-new",
        NEW,
        &format!("{{parentRefs: [{parent}], rules: [{{matches: [{{path: {{value: /api/}}}}], backendRefs: [{{name: other, port: 1}}]}}]}}"),
    );
    // Same specificity and time as `api-new`: "bookinfo/a-api" sorts first.
    let a_api = route(
        "bookinfo",
        "a-api",
        NEW,
        &format!("{{parentRefs: [{parent}], rules: [{{matches: [{{path: {{value: /api}}}}], backendRefs: [{{name: a, port: 2}}]}}]}}"),
    );
    let elsewhere = route(
        "other",
        "consumer",
        OLD,
        "{parentRefs: [{group: \"\", kind: Service, name: reviews, namespace: bookinfo}], rules: [{matches: [{path: {type: Exact, value: /x}}]}]}",
    );
    let ratings = route(
        "bookinfo",
        "ratings",
        OLD,
        "{parentRefs: [{group: \"\", kind: Service, name: ratings}], rules: [{matches: [{path: {type: Exact, value: /x}}]}]}",
    );
    let gateway_only =
        route("bookinfo", "ingress", OLD, "{parentRefs: [{name: gw}], rules: [{matches: [{path: {type: Exact, value: /y}}]}]}");
    let routes = [&canary, &api, &api_new, &a_api, &elsewhere, &ratings, &gateway_only];
    let compiled = compile(&routes, "bookinfo", "reviews", "reviews.bookinfo.svc.cluster.local", "cluster.local");
    assert_eq!(compiled.service, "bookinfo/reviews.bookinfo.svc.cluster.local");
    let key = |name: &str| format!("bookinfo/{name}.bookinfo.svc.cluster.local");
    let s = |v: &[String]| v.to_vec();
    let want: Vec<(String, u16, String, Vec<String>)> = vec![
        (
            "bookinfo/canary.0".into(),
            9080,
            "=/health".into(),
            s(&[format!("{}:9080/90", key("reviews-v1")), format!("{}:9080/10", key("reviews-v2"))]),
        ),
        ("bookinfo/api.1".into(), 0, "/api".into(), s(&[format!("{}:0/1", key("api-writer"))])),
        ("bookinfo/api.0".into(), 0, "/api".into(), s(&[format!("{}:8080/1", key("api"))])),
        ("bookinfo/a-api.0".into(), 0, "/api".into(), s(&[format!("{}:2/1", key("a"))])),
        ("bookinfo/api-new.0".into(), 0, "/api/".into(), s(&[format!("{}:1/1", key("other"))])),
        (
            "bookinfo/canary.0".into(),
            9080,
            "/".into(),
            s(&[format!("{}:9080/90", key("reviews-v1")), format!("{}:9080/10", key("reviews-v2"))]),
        ),
    ];
    assert_eq!(summary(&compiled), want);
    // The mirror's port defaults to its parent's too.
    assert_eq!(compiled.rules[0].filters.mirrors, [Backend { service: key("shadow"), port: 9080, weight: 1, subset: None }]);

    // `api` named reviews twice (every port, and 9080): once is enough.
    assert_eq!(compiled.rules.iter().filter(|r| r.name == "bookinfo/api.0").count(), 1);

    // The routes of another service, of none, and of a service nobody routes.
    let ratings = compile(&routes, "bookinfo", "ratings", "ratings.bookinfo.svc.cluster.local", "cluster.local");
    assert_eq!(summary(&ratings), vec![("bookinfo/ratings.0".to_string(), 0, "=/x".to_string(), vec![])]);
    assert_eq!(compile(&routes, "bookinfo", "details", "details.bookinfo.svc.cluster.local", "cluster.local").rules, []);
    // A route in another namespace never binds (see `compile`).
    assert_eq!(compile(&[&elsewhere], "bookinfo", "reviews", "reviews.bookinfo.svc.cluster.local", "cluster.local").rules, []);
}

#[test]
fn compiled_routes_select_as_gateway_api_says() {
    use slipstream_core::route::{select, RequestView};
    let r = route(
        "demo",
        "r",
        None,
        "{parentRefs: [{group: \"\", kind: Service, name: web, port: 80}], rules: [
           {matches: [{path: {type: Exact, value: /a}}, {path: {value: /}}], backendRefs: [{name: catchall}]},
           {matches: [{path: {value: /b}}], backendRefs: [{name: b}]}]}",
    );
    let compiled = compile(&[&r], "demo", "web", "web.demo.svc.cluster.local", "cluster.local");
    let headers: Vec<(&str, &str)> = vec![];
    let pick = |path| {
        select(&compiled.rules, 80, &RequestView { method: "GET", path, query: "", headers: &headers })
            .map(|(r, _)| r.backends[0].service.clone())
    };
    assert_eq!(pick("/b/c").as_deref(), Some("demo/b.demo.svc.cluster.local"), "PathPrefix /b outranks the other rule's PathPrefix /");
    assert_eq!(pick("/a").as_deref(), Some("demo/catchall.demo.svc.cluster.local"));
    assert_eq!(pick("/z").as_deref(), Some("demo/catchall.demo.svc.cluster.local"));
    assert_eq!(select(&compiled.rules, 81, &RequestView { method: "GET", path: "/", query: "", headers: &headers }), None, "port 80 only");
}
