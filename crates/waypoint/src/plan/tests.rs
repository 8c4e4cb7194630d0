//! `target` and `decide` as tables over one small mesh: reviews (v1, v2)
//! and ratings bound to the waypoint `bookinfo/waypoint`, details not.

use super::*;
use slipstream_core::route::{Backend, Filters, PathRewrite, Redirect, Rewrite, RouteMatch};
use slipstream_core::*;
use std::collections::BTreeMap;

const WP: &str = "waypoint.bookinfo.svc.cluster.local";

fn me() -> Me {
    Me { namespace: "bookinfo".into(), name: "waypoint".into() }
}

fn gw() -> GatewayAddress {
    GatewayAddress { namespace: "bookinfo".into(), hostname: WP.into(), hbone_mtls_port: 15008 }
}

fn key(name: &str) -> String {
    format!("bookinfo/{name}.bookinfo.svc.cluster.local")
}

fn pod(name: &str, ip: &str, service: &str, bound: bool) -> Workload {
    let ports = vec![Port { service_port: 9080, target_port: 9080, app_protocol: Default::default() }];
    let mut services = BTreeMap::from([(key(service), ports.clone())]);
    if name.starts_with("reviews") {
        services.insert(key("reviews"), ports);
    }
    Workload {
        uid: format!("c//Pod/bookinfo/{name}"),
        name: name.into(),
        namespace: "bookinfo".into(),
        addresses: vec![ip.parse().unwrap()],
        tunnel_protocol: TunnelProtocol::Hbone,
        services,
        waypoint: bound.then(gw),
        ..Default::default()
    }
}

fn svc(name: &str, vip: &str, bound: bool) -> Service {
    Service {
        name: name.into(),
        namespace: "bookinfo".into(),
        hostname: format!("{name}.bookinfo.svc.cluster.local"),
        addresses: vec![NetworkAddress { network: String::new(), address: vip.parse().unwrap() }],
        ports: vec![Port { service_port: 9080, target_port: 9080, app_protocol: Default::default() }],
        subject_alt_names: vec![],
        waypoint: bound.then(gw),
    }
}

fn state() -> Arc<MeshState> {
    let cfg = MeshConfig {
        workloads: vec![
            pod("reviews-v1", "10.244.1.1", "reviews-v1", false),
            pod("reviews-v2", "10.244.1.2", "reviews-v2", false),
            pod("ratings", "10.244.1.3", "ratings", true),
            pod("details", "10.244.1.4", "details", false),
        ],
        services: vec![
            svc("reviews", "10.96.0.1", true),
            svc("reviews-v1", "10.96.0.2", false),
            svc("reviews-v2", "10.96.0.3", false),
            svc("ratings", "10.96.0.4", true),
            svc("details", "10.96.0.5", false),
            svc("empty", "10.96.0.6", true),
            Service { waypoint: Some(GatewayAddress { hbone_mtls_port: 0, ..gw() }), ..svc("refused", "10.96.0.7", false) },
        ],
        ..Default::default()
    };
    let (s, errors) = MeshState::from_config(&cfg);
    assert!(errors.is_empty(), "{errors:?}");
    s
}

fn rule(name: &str, matches: Vec<RouteMatch>, backends: &[(&str, u32)], filters: Filters) -> RouteRule {
    RouteRule {
        name: name.into(),
        port: 0,
        matches,
        backends: backends.iter().map(|(s, w)| Backend { service: key(s), port: 9080, weight: *w, subset: None }).collect(),
        filters,
        ..Default::default()
    }
}

fn routes() -> ServiceRoutes {
    let header = RouteMatch { headers: vec![route::HeaderMatch { name: "end-user".into(), value: "jason".into() }], ..Default::default() };
    let prefix = |p: &str| RouteMatch { path: route::PathMatch::Prefix(p.into()), ..Default::default() };
    ServiceRoutes {
        service: key("reviews"),
        rules: vec![
            rule("bookinfo/jason.0", vec![header], &[("reviews-v2", 1)], Filters::default()),
            rule(
                "bookinfo/old.0",
                vec![prefix("/old")],
                &[],
                Filters {
                    redirect: Some(Redirect {
                        path: Some(PathRewrite::ReplacePrefixMatch("/new".into())),
                        status: 301,
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ),
            rule(
                "bookinfo/api.0",
                vec![prefix("/api/v1")],
                &[("reviews-v1", 1)],
                Filters {
                    rewrite: Some(Rewrite { path: Some(PathRewrite::ReplacePrefixMatch("/v1".into())), hostname: Some("internal".into()) }),
                    ..Default::default()
                },
            ),
            rule("bookinfo/broken.0", vec![prefix("/broken")], &[("gone", 1)], Filters::default()),
            rule("bookinfo/split.0", vec![prefix("/reviews")], &[("reviews-v1", 90), ("reviews-v2", 10)], Filters::default()),
            {
                // A backend without a port: the port the client dialed.
                let mut r = rule("bookinfo/any-port.0", vec![prefix("/any")], &[("reviews-v2", 1)], Filters::default());
                r.backends[0].port = 0;
                r
            },
        ],
        ..Default::default()
    }
}

#[test]
fn only_what_is_bound_to_this_waypoint_is_served() {
    let s = state();
    let t = |a: &str| target(&s, &me(), a.parse().unwrap()).map(|t| t.name());
    assert_eq!(t("10.96.0.1:9080"), Ok("reviews.bookinfo.svc.cluster.local".into()));
    assert_eq!(t("10.244.1.3:9080"), Ok("bookinfo/ratings".into()), "a pod bound for workload traffic");
    assert_eq!(t("10.96.0.5:9080"), Err(NotServed::NotBound { what: "service details.bookinfo.svc.cluster.local".into() }));
    assert_eq!(t("10.244.1.4:9080"), Err(NotServed::NotBound { what: "pod bookinfo/details".into() }));
    assert!(matches!(t("192.0.2.1:80"), Err(NotServed::Unknown(_))));
    // Named with port 0: a binding the control plane refused.
    assert_eq!(t("10.96.0.7:9080"), Err(NotServed::NotBound { what: "service refused.bookinfo.svc.cluster.local".into() }));
    let other = Me { namespace: "bookinfo".into(), name: "other".into() };
    assert!(target(&s, &other, "10.96.0.1:9080".parse().unwrap()).is_err(), "another waypoint's service");
    // Its name in another cluster domain is still its name; a longer name
    // or another namespace is not.
    assert!(me().named("waypoint.bookinfo.svc.corp.example"));
    assert!(!me().named("waypoint.bookinfo.svc."));
    assert!(!me().named("waypoint2.bookinfo.svc.cluster.local"));
    assert!(!me().named("waypoint.bookinfo2.svc.cluster.local"));
    assert!(!me().named("waypoint.bookinfo.cluster.local"));
}

/// (method, path, query, headers, draw) -> what happens, as text.
fn run(s: &MeshState, r: Option<&ServiceRoutes>, dialed: &str, path: &str, headers: &[(&str, &str)], draw: u64) -> String {
    let t = target(s, &me(), dialed.parse().unwrap()).unwrap();
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    let req = Req { view: RequestView { method: "GET", path, query, headers }, host: "reviews:9080", draw_backend: draw };
    let d = decide(s, r, &|_: &str| Default::default(), &t, &req);
    let rule = d.rule.map(|r| r.name.as_str()).unwrap_or("-");
    match d.action {
        Action::Forward(f) => format!(
            "{rule} -> {} {}{}",
            f.candidates.iter().map(|e| e.workload.name.as_str()).collect::<Vec<_>>().join("|"),
            f.path_and_query,
            f.host.map(|h| format!(" host={h}")).unwrap_or_default()
        ),
        Action::Redirect { status, location } => format!("{rule} -> {status} {location}"),
        Action::Respond { status, flag, .. } => format!("{rule} -> {status} {flag}"),
    }
}

#[test]
fn requests_take_the_first_matching_rule_and_its_weighted_backend() {
    let s = state();
    let r = routes();
    // (dialed, path, headers, draw, what happens)
    type Row<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str)>, u64, &'a str);
    let rows: Vec<Row> = vec![
        ("10.96.0.1:9080", "/reviews/1", vec![], 0, "bookinfo/split.0 -> reviews-v1 /reviews/1"),
        ("10.96.0.1:9080", "/reviews/1", vec![], 89, "bookinfo/split.0 -> reviews-v1 /reviews/1"),
        ("10.96.0.1:9080", "/reviews/1", vec![], 90, "bookinfo/split.0 -> reviews-v2 /reviews/1"),
        ("10.96.0.1:9080", "/reviews/1", vec![], 99, "bookinfo/split.0 -> reviews-v2 /reviews/1"),
        ("10.96.0.1:9080", "/reviews/1?x=1", vec![], 0, "bookinfo/split.0 -> reviews-v1 /reviews/1?x=1"),
        // A header match wins where it is listed first.
        ("10.96.0.1:9080", "/reviews/1", vec![("end-user", "jason")], 0, "bookinfo/jason.0 -> reviews-v2 /reviews/1"),
        // Filters: redirect, rewrite.
        ("10.96.0.1:9080", "/old/x?y=1", vec![], 0, "bookinfo/old.0 -> 301 http://reviews:9080/new/x?y=1"),
        ("10.96.0.1:9080", "/api/v1/r", vec![], 0, "bookinfo/api.0 -> reviews-v1 /v1/r host=internal"),
        // Gateway API: no rule matches, 404; a backend that does not exist, 500.
        ("10.96.0.1:9080", "/other", vec![], 0, "- -> 404 NR"),
        ("10.96.0.1:9080", "/broken", vec![], 0, "bookinfo/broken.0 -> 500 NR"),
        ("10.96.0.1:9080", "/any", vec![], 0, "bookinfo/any-port.0 -> reviews-v2 /any"),
        // A pod addressed directly is its own endpoint.
        ("10.244.1.3:9080", "/ratings/0", vec![], 0, "- -> ratings /ratings/0"),
    ];
    for (i, (dialed, path, headers, draw, want)) in rows.into_iter().enumerate() {
        assert_eq!(run(&s, Some(&r), dialed, path, &headers, draw), want, "row {i}: {path} {headers:?} draw {draw}");
    }
    // Without routes, or with routes for another port: the service itself.
    assert_eq!(run(&s, None, "10.96.0.1:9080", "/x", &[], 0), "- -> reviews-v1|reviews-v2 /x", "reviews' own endpoints");
    assert_eq!(run(&s, None, "10.96.0.4:9080", "/r", &[], 0), "- -> ratings /r");
    let mut other_port = routes();
    other_port.rules.iter_mut().for_each(|r| r.port = 9999);
    assert_eq!(run(&s, Some(&other_port), "10.96.0.4:9080", "/r", &[], 0), "- -> ratings /r");
    // A bound service with no endpoint: 503.
    assert_eq!(run(&s, None, "10.96.0.6:9080", "/", &[], 0), "- -> 503 UH");
}

#[test]
fn subsets_timeouts_retries_and_the_backends_traffic_policy() {
    use slipstream_core::route::traffic::{Fault, FaultAbort, LoadBalancer, Retry, TrafficPolicy};
    use slipstream_core::route::Subset;
    let s = state();
    let t = target(&s, &me(), "10.96.0.1:9080".parse().unwrap()).unwrap();
    let subset = |name: &str, uids: &[&str], lb: Option<LoadBalancer>| Subset {
        name: name.into(),
        workloads: uids.iter().map(|u| format!("c//Pod/bookinfo/{u}")).collect(),
        traffic: lb.map(|lb| TrafficPolicy { lb, ..Default::default() }),
    };
    let mut r = rule("bookinfo/vs.0", vec![], &[("reviews", 1)], Filters::default());
    r.timeout = Some(Duration::from_secs(3));
    r.retry = Some(Retry { per_try_timeout: Some(Duration::from_secs(1)), ..Retry::istio_default() });
    r.fault = Some(Fault { delay: None, abort: Some(FaultAbort { per_million: 1, status: 418 }) });
    let routes_with = |sub: Option<Subset>| {
        let mut r = r.clone();
        r.backends[0].subset = sub;
        ServiceRoutes { service: key("reviews"), rules: vec![r], ..Default::default() }
    };
    let rr = |svc: &str| {
        if svc == key("reviews") {
            TrafficPolicy { lb: LoadBalancer::RoundRobin, ..Default::default() }
        } else {
            TrafficPolicy::default()
        }
    };
    let req = Req { view: RequestView { method: "GET", path: "/r", query: "", headers: &[] }, host: "reviews:9080", draw_backend: 0 };
    let forward = |routes: &ServiceRoutes| match decide(&s, Some(routes), &rr, &t, &req).action {
        Action::Forward(f) => Ok(*f),
        Action::Respond { status, detail, .. } => Err((status, detail)),
        other => panic!("{other:?}"),
    };
    // No subset: every endpoint of reviews, its own policy.
    let f = forward(&routes_with(None)).unwrap();
    assert_eq!(f.candidates.len(), 2);
    assert_eq!((f.pool.as_str(), &f.traffic.lb), (key("reviews").as_str(), &LoadBalancer::RoundRobin));
    assert_eq!((f.timeout, f.attempt_timeout), (Some(Duration::from_secs(3)), Some(Duration::from_secs(1))));
    assert_eq!(f.retry.as_ref().unwrap().attempts, 2);
    assert_eq!(f.fault.as_ref().unwrap().abort.as_ref().unwrap().status, 418);
    // A subset: only its workloads, and its own policy when it has one.
    let f = forward(&routes_with(Some(subset("v2", &["reviews-v2"], Some(LoadBalancer::Random))))).unwrap();
    assert_eq!(f.candidates.iter().map(|e| e.workload.name.as_str()).collect::<Vec<_>>(), ["reviews-v2"]);
    assert_eq!((f.pool, f.traffic.lb), (format!("{}#v2", key("reviews")), LoadBalancer::Random));
    let f = forward(&routes_with(Some(subset("v1", &["reviews-v1"], None)))).unwrap();
    assert_eq!(f.traffic.lb, LoadBalancer::RoundRobin, "a subset without a policy has its service's");
    // A subset that selects nothing (or that no rule defines): 503, naming it.
    let (status, detail) = forward(&routes_with(Some(subset("v9", &[], None)))).unwrap_err();
    assert_eq!(status, 503);
    assert!(detail.contains("subset v9 of service reviews"), "{detail}");
}

#[test]
fn which_policies_a_request_meets_by_how_it_was_addressed() {
    use slipstream_core::policy::l7::{L7Operation, L7Policy, L7Rule};
    use slipstream_core::policy::{Action, StringMatch};
    let s = state();
    let deny = |name: &str, path: &str, workloads: Option<&[&str]>, pods: Option<&[&str]>| L7Policy {
        namespace: "bookinfo".into(),
        name: name.into(),
        action: Action::Deny,
        rules: vec![L7Rule {
            to: vec![L7Operation { paths: vec![StringMatch::Exact(path.into())], ..Default::default() }],
            ..Default::default()
        }],
        workloads: workloads.map(|w| w.iter().map(|s| s.to_string()).collect()),
        pods: pods.map(|w| w.iter().map(|s| s.to_string()).collect()),
        ..Default::default()
    };
    // The waypoint's own routes: its Gateway's policy, ratings' Service
    // policy for the ratings pod, a selector-bound one (the endpoint's).
    let own = ServiceRoutes {
        service: format!("bookinfo/{WP}"),
        policies: vec![
            deny("gateway", "/gateway", None, None),
            deny("service", "/service", None, Some(&["c//Pod/bookinfo/ratings"])),
            deny("selector", "/selector", Some(&["c//Pod/bookinfo/ratings"]), None),
        ],
        ..Default::default()
    };
    assert!(me().is_own_routes(&own.service) && !me().is_own_routes(&key("ratings")));
    let pod = target(&s, &me(), "10.244.1.3:9080".parse().unwrap()).unwrap();
    let peer: slipstream_core::SpiffeId = "spiffe://cluster.local/ns/bookinfo/sa/productpage".parse().unwrap();
    let denied = |target: &Target, routes: &ServiceRoutes, path: &str| {
        let view = RequestView { method: "GET", path, query: "", headers: &[] };
        let caller = Caller { identity: &peer, addr: "10.244.9.9".parse().unwrap(), trusted_proxies: 0, auth: None };
        !authorize(Some(routes), target, caller, Some((&view, "x"))).allowed
    };
    assert!(denied(&pod, &own, "/gateway"), "the Gateway's policy holds for a pod addressed directly");
    assert!(denied(&pod, &own, "/service"), "so does its Service's, for its own pods");
    assert!(!denied(&pod, &own, "/selector"), "the endpoint's own policy is the endpoint's check (authorize_endpoint)");
    let other = Target::Workload { workload: s.workload_by_ip("10.244.1.1".parse().unwrap()).unwrap(), port: 9080 };
    assert!(denied(&other, &own, "/gateway") && !denied(&other, &own, "/service"), "another pod: the Gateway's only");
    let svc = target(&s, &me(), "10.96.0.4:9080".parse().unwrap()).unwrap();
    let svc_routes = ServiceRoutes { service: key("ratings"), policies: own.policies.clone(), ..Default::default() };
    assert!(
        denied(&svc, &svc_routes, "/gateway") && !denied(&svc, &svc_routes, "/service"),
        "pod-only copies do not apply to the Service's requests"
    );
}

#[test]
fn a_port_is_handled_as_it_is_declared_whatever_the_client_sends() {
    let declared = |p: AppProtocol| {
        let mut s = svc("reviews", "10.96.0.1", true);
        s.ports[0].app_protocol = p;
        let mut w = pod("reviews-v1", "10.244.1.1", "reviews-v1", false);
        for ports in w.services.values_mut() {
            ports[0].app_protocol = p;
        }
        let (st, e) = MeshState::from_config(&MeshConfig { workloads: vec![w], services: vec![s], ..Default::default() });
        assert!(e.is_empty(), "{e:?}");
        let svc = Target::Service { service: st.service("bookinfo/reviews.bookinfo.svc.cluster.local").unwrap(), port: 9080 };
        let pod = Target::Workload { workload: st.workload_by_ip("10.244.1.1".parse().unwrap()).unwrap(), port: 9080 };
        let other_port = Target::Workload { workload: st.workload_by_ip("10.244.1.1".parse().unwrap()).unwrap(), port: 7 };
        (handling(&svc), handling(&pod), handling(&other_port))
    };
    assert_eq!(declared(AppProtocol::Http11), (Handling::Http, Handling::Http, Handling::Sniff));
    assert_eq!(declared(AppProtocol::Http2), (Handling::Http, Handling::Http, Handling::Sniff));
    assert_eq!(declared(AppProtocol::Grpc), (Handling::Http, Handling::Http, Handling::Sniff));
    assert_eq!(declared(AppProtocol::Tcp), (Handling::Tcp, Handling::Tcp, Handling::Sniff));
    assert_eq!(declared(AppProtocol::Tls), (Handling::Tcp, Handling::Tcp, Handling::Sniff));
    assert_eq!(declared(AppProtocol::Unknown), (Handling::Sniff, Handling::Sniff, Handling::Sniff));
    // As Istio reads a Service port: appProtocol first, else the name.
    for (app, name, want) in [
        (Some("http"), Some("tcp-x"), AppProtocol::Http11),
        (Some("kubernetes.io/h2c"), None, AppProtocol::Http2),
        (Some("GRPC"), None, AppProtocol::Grpc),
        (Some("mongo"), Some("http"), AppProtocol::Unknown),
        (None, Some("http-web"), AppProtocol::Http11),
        (None, Some("http2"), AppProtocol::Http2),
        (None, Some("grpc-api"), AppProtocol::Grpc),
        (None, Some("tcp-echo"), AppProtocol::Tcp),
        (None, Some("https"), AppProtocol::Tls),
        (None, Some("httpx"), AppProtocol::Unknown),
        (None, Some("web"), AppProtocol::Unknown),
        (None, None, AppProtocol::Unknown),
    ] {
        assert_eq!(AppProtocol::of_port(app, name), want, "{app:?} {name:?}");
    }
}
