//! The waypoint between two real node proxies, in one test process (the
//! in-process tier of docs/testing.md: pods are 127.0.0.0/8 addresses,
//! real TLS and HBONE on loopback). The client pod on node1 calls the
//! `reviews` service, which is bound to the waypoint: node1 sends the
//! connection to the waypoint, which routes each request 90/10 to
//! reviews-v1 and reviews-v2 on node2, over tunnels of its own.

use futures_util::future::BoxFuture;
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::TokioIo;
use slipstream_core::route::traffic::{
    Fault, FaultAbort, FaultDelay, HashOn, LoadBalancer, OutlierDetection, Retry, RetryOn, TrafficPolicy,
};
use slipstream_core::route::{Backend, Filters, HeaderMatch, PathMatch, RouteMatch, RouteRule, ServiceRoutes};
use slipstream_core::sync::LockExt;
use slipstream_core::TrustDomain;
use slipstream_core::*;
use slipstream_hbone::{CertResolver, Pool, PoolConfig, ResolveError, Server, ServerConfig};
use slipstream_identity::tls::ServerTls;
use slipstream_identity::{Ca, CertManager, CertManagerConfig, LocalCaProvider, WorkloadCert};
use slipstream_node::config::Config;
use slipstream_node::proxy::{Deps, NodeProxy};
use slipstream_node::sockets::Listener;
use slipstream_node::telemetry::Sink;
use slipstream_node::testing::LoopbackFactory;
use slipstream_proxy::config::{LimitArgs, Limits};
use slipstream_waypoint::{Settings, Waypoint};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

const APP_PORT: u16 = 9080;
const GRPC_PORT: u16 = 9090;

fn key(name: &str) -> String {
    format!("default/{name}.default.svc.cluster.local")
}

fn gw(name: &str) -> GatewayAddress {
    GatewayAddress { namespace: "default".into(), hostname: format!("{name}.default.svc.cluster.local"), hbone_mtls_port: 15008 }
}

fn workload(name: &str, ip: IpAddr, node: &str, meshed: bool, services: &[(&str, u16)]) -> Workload {
    Workload {
        uid: format!("test//Pod/default/{name}"),
        name: name.into(),
        namespace: "default".into(),
        addresses: vec![ip],
        tunnel_protocol: if meshed { TunnelProtocol::Hbone } else { TunnelProtocol::None },
        service_account: name.split('-').next().unwrap_or(name).into(),
        node: node.into(),
        workload_name: name.into(),
        services: services
            .iter()
            .map(|(s, p)| (key(s), vec![Port { service_port: *p, target_port: *p, app_protocol: Default::default() }]))
            .collect::<BTreeMap<_, _>>(),
        ..Default::default()
    }
}

fn service(name: &str, vip: IpAddr, port: u16, waypoint: Option<&str>) -> Service {
    Service {
        name: name.into(),
        namespace: "default".into(),
        hostname: format!("{name}.default.svc.cluster.local"),
        addresses: vec![NetworkAddress { network: String::new(), address: vip }],
        ports: vec![Port { service_port: port, target_port: port, app_protocol: Default::default() }],
        subject_alt_names: vec![],
        waypoint: waypoint.map(gw),
    }
}

fn config(node: &str) -> Config {
    let mut c = Config::defaults("test", node, Limits::derive(4096, &LimitArgs::default()));
    c.admin_addr = "127.0.0.1:0".parse().unwrap();
    c.stats_addr = "127.0.0.1:0".parse().unwrap();
    c.readiness_addr = "127.0.0.1:0".parse().unwrap();
    c
}

async fn proxy(node: &str, ca: &Arc<Ca>, sockets: &LoopbackFactory) -> NodeProxy {
    let deps =
        Deps { sockets: Arc::new(sockets.clone()), ca: ca.clone().into(), sink: Sink::Memory(Mutex::default()), report_served: false };
    let mut p = NodeProxy::new(config(node), deps).await.unwrap();
    p.serve();
    p
}

/// The waypoint's own certificate, whatever address a tunnel came to.
impl Mesh {
    fn ip(&self, c: u8, d: u8) -> IpAddr {
        IpAddr::from([127, self.net, c, d])
    }
}

struct OwnCert {
    certs: CertManager,
    id: SpiffeId,
}

impl CertResolver for OwnCert {
    fn resolve(&self, local_ip: IpAddr) -> BoxFuture<'_, Result<Arc<WorkloadCert>, ResolveError>> {
        Box::pin(async move { self.certs.fetch_certificate(&self.id).await.map_err(|source| ResolveError::Fetch { ip: local_ip, source }) })
    }
}

/// Requests that arrived with a mirror's `Host` (`...-shadow`), per test
/// network (the tests of this file run in parallel).
static SHADOWED: Mutex<Vec<(IpAddr, String)>> = Mutex::new(Vec::new());

/// The address of the sink that took each connection (it never answers).
static SINK: Mutex<Vec<IpAddr>> = Mutex::new(Vec::new());

/// The `traceparent` of requests to `/trace...`, per endpoint.
static TRACES: Mutex<Vec<(IpAddr, String)>> = Mutex::new(Vec::new());

/// An app answering every request with its version and the path it got.
async fn app(l: TcpListener, version: &'static str) {
    let local = l.local_addr().unwrap().ip();
    loop {
        let Ok((s, _)) = l.accept().await else { return };
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| async move {
                let host = req.headers().get("host").and_then(|h| h.to_str().ok()).unwrap_or("").to_string();
                if req.uri().path().starts_with("/trace") {
                    let t = req.headers().get("traceparent").and_then(|h| h.to_str().ok()).unwrap_or("").to_string();
                    TRACES.locked().push((local, t));
                }
                if host.contains("-shadow") {
                    SHADOWED.locked().push((local, format!("{host} {}", req.uri().path())));
                }
                // `/headers`: the headers it got, one `name: value` a line.
                let body = if req.uri().path() == "/headers" {
                    req.headers().iter().map(|(k, v)| format!("{k}: {}\n", v.to_str().unwrap_or("?"))).collect()
                } else {
                    format!("{version} {}", req.uri().path())
                };
                // v2 is the bad version: `/flaky...` fails half the time,
                // `/fail-v2...` always.
                let path = req.uri().path();
                let fails = version == "v2" && (path.starts_with("/fail-v2") || (path.starts_with("/flaky") && rand::random::<bool>()));
                let mut resp = hyper::Response::new(Full::new(bytes::Bytes::from(body)));
                if fails {
                    *resp.status_mut() = hyper::StatusCode::SERVICE_UNAVAILABLE;
                }
                Ok::<_, std::convert::Infallible>(resp)
            });
            // HTTP/1.1 or HTTP/2 (prior knowledge), as the waypoint speaks
            // to it what its client spoke.
            let _ = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                .serve_connection(TokioIo::new(s), svc)
                .await;
        });
    }
}

/// A TCP app: says `greeting` first if it has one, then echoes.
async fn tcp_app(l: TcpListener, greeting: Option<&'static [u8]>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        let Ok((mut s, _)) = l.accept().await else { return };
        tokio::spawn(async move {
            if let Some(g) = greeting {
                if s.write_all(g).await.is_err() {
                    return;
                }
            }
            let mut buf = [0u8; 1024];
            while let Ok(n) = s.read(&mut buf).await {
                if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        });
    }
}

struct Mesh {
    net: u8,
    sockets: LoopbackFactory,
    node1: NodeProxy,
    _turn: Turn,
}

async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out after 10s waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn mesh(net: u8) -> (Mesh, NodeProxy, Waypoint, MeshConfig) {
    mesh_with(net, slipstream_waypoint::fair::Fairness::default()).await
}

/// The tests of this file run side by side, except the one that measures
/// latency (`one_client_at_every_bound_does_not_starve_another`), which
/// runs alone: each [`Mesh`] holds this shared, that test exclusively.
static ALONE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// A port where connections are taken and never answered.
const SINK_PORT: u16 = 7100;

/// [`mesh`], with a waypoint of these per-client bounds.
async fn mesh_with(net: u8, fairness: slipstream_waypoint::fair::Fairness) -> (Mesh, NodeProxy, Waypoint, MeshConfig) {
    let turn = Turn::Shared(ALONE.read().await);
    mesh_in_turn(net, fairness, turn).await
}

/// A test's turn: alongside the others, or alone.
#[allow(dead_code)]
enum Turn {
    Shared(tokio::sync::RwLockReadGuard<'static, ()>),
    Alone(tokio::sync::RwLockWriteGuard<'static, ()>),
}

async fn mesh_in_turn(net: u8, fairness: slipstream_waypoint::fair::Fairness, turn: Turn) -> (Mesh, NodeProxy, Waypoint, MeshConfig) {
    let ip = |c: u8, d: u8| IpAddr::from([127, net, c, d]);
    let ca = Arc::new(Ca::generate(&TrustDomain::default()).unwrap());
    let sockets = LoopbackFactory::default();
    let (mut node1, mut node2) = (proxy("node1", &ca, &sockets).await, proxy("node2", &ca, &sockets).await);
    let wp_ip = ip(5, 1);
    let cfg = MeshConfig {
        workloads: vec![
            workload("client", ip(1, 1), "node1", true, &[]),
            workload("attacker", ip(1, 2), "node1", true, &[]),
            workload(
                "reviews-v1",
                ip(2, 1),
                "node2",
                true,
                &[("reviews", APP_PORT), ("reviews-v1", APP_PORT), ("echo", 7000), ("grpc", GRPC_PORT), ("sink", SINK_PORT)],
            ),
            workload(
                "reviews-v2",
                ip(2, 2),
                "node2",
                true,
                &[("reviews", APP_PORT), ("reviews-v2", APP_PORT), ("greeter", 7001), ("grpc", GRPC_PORT)],
            ),
            workload("waypoint", wp_ip, "node2", false, &[("waypoint", 15008)]),
        ],
        services: vec![
            service("reviews", ip(9, 1), APP_PORT, Some("waypoint")),
            service("reviews-v1", ip(9, 2), APP_PORT, None),
            service("reviews-v2", ip(9, 3), APP_PORT, None),
            service("waypoint", ip(9, 5), 15008, None),
            service("lost", ip(9, 6), APP_PORT, Some("gone")),
            service("echo", ip(9, 7), 7000, Some("waypoint")),
            service("greeter", ip(9, 8), 7001, Some("waypoint")),
            service("grpc", ip(9, 9), GRPC_PORT, Some("waypoint")),
            service("sink", ip(9, 10), SINK_PORT, None),
        ],
        ..Default::default()
    };
    assert!(node1.apply_mesh(&cfg).errors.is_empty());
    assert!(node2.apply_mesh(&cfg).errors.is_empty());
    tokio::spawn(app(TcpListener::bind(SocketAddr::new(ip(2, 1), APP_PORT)).await.unwrap(), "v1"));
    tokio::spawn(app(TcpListener::bind(SocketAddr::new(ip(2, 2), APP_PORT)).await.unwrap(), "v2"));
    tokio::spawn(tcp_app(TcpListener::bind(SocketAddr::new(ip(2, 1), 7000)).await.unwrap(), None));
    for (d, version) in [(1, "v1"), (2, "v2")] {
        tokio::spawn(grpc_app(TcpListener::bind(SocketAddr::new(ip(2, d), GRPC_PORT)).await.unwrap(), version));
    }
    tokio::spawn(tcp_app(TcpListener::bind(SocketAddr::new(ip(2, 2), 7001)).await.unwrap(), Some(b"hello\n")));
    let sink = TcpListener::bind(SocketAddr::new(ip(2, 1), SINK_PORT)).await.unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = sink.accept().await {
            SINK.locked().push(s.local_addr().unwrap().ip());
            held.push(s);
        }
    });
    let pods = |names: &[&str]| NodePods {
        pods: names.iter().map(|n| PodRegistration { uid: format!("test//Pod/default/{n}"), netns: String::new(), ip: None }).collect(),
    };
    node1.apply_pods(pods(&["client", "attacker"]));
    node2.apply_pods(pods(&["reviews-v1", "reviews-v2"]));
    node1.reconcile().await;
    node2.reconcile().await;
    let (n1, n2) = (node1.shared().clone(), node2.shared().clone());
    wait_for("both proxies ready", || n1.ready().is_ok() && n2.ready().is_ok()).await;

    // The waypoint: its own certificate from the mesh's CA, its HBONE
    // server on its pod's address, the same mesh configuration.
    let id: SpiffeId = "spiffe://cluster.local/ns/default/sa/waypoint".parse().unwrap();
    let certs = CertManager::new(Arc::new(LocalCaProvider::new(ca.clone(), Duration::from_secs(3600))), CertManagerConfig::default());
    let pool = Pool::new(PoolConfig::default(), Arc::new(certs.clone()), Arc::new(slipstream_hbone::PlainConnector));
    let settings = Settings {
        namespace: "default".into(),
        name: "waypoint".into(),
        own_ip: wp_ip,
        identity: id.clone(),
        idle_timeout: Duration::from_secs(30),
        fairness,
    };
    let wp = Waypoint::new(settings, pool);
    let (state, errors) = MeshState::from_config(&cfg);
    assert!(errors.is_empty(), "{errors:?}");
    wp.set_mesh(state);
    let tls = ServerTls::new(ca.roots(), TrustDomain::default()).unwrap();
    let listener = TcpListener::bind(SocketAddr::new(wp_ip, 15008)).await.unwrap();
    let server = Server::new(listener, tls, Arc::new(OwnCert { certs, id }), wp.handler(), ServerConfig::default());
    // The server follows the waypoint's own drain, as `slipstream waypoint`
    // wires it (run.rs).
    tokio::spawn(server.serve(wp.drain().watch()));
    (Mesh { net, sockets, node1, _turn: turn }, node2, wp, cfg)
}

/// GETs `path` `n` times on one keep-alive connection from the client pod
/// to `dst` (captured by node1); the answers' bodies.
async fn get(m: &Mesh, dst: SocketAddr, path: &str, n: usize) -> Vec<String> {
    get_with(m, dst, path, n, &[]).await.into_iter().map(|(a, _)| a).collect()
}

/// As [`get`], with request headers; each answer with how long it took.
async fn get_with(m: &Mesh, dst: SocketAddr, path: &str, n: usize, headers: &[(&str, &str)]) -> Vec<(String, Duration)> {
    let s = m.sockets.connect_captured(m.ip(1, 1), Listener::Outbound, dst).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s)).await.unwrap();
    tokio::spawn(conn);
    let mut out = Vec::new();
    for _ in 0..n {
        let mut req = hyper::Request::get(path).header("host", "reviews:9080");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Empty::<bytes::Bytes>::new()).unwrap();
        let began = Instant::now();
        send.ready().await.unwrap_or_else(|e| panic!("{e}: node1 says {:?}", m.node1.shared().telemetry.lines()));
        let resp = tokio::time::timeout(Duration::from_secs(10), send.send_request(req))
            .await
            .expect("answered in time")
            .unwrap_or_else(|e| panic!("{e}: node1 says {:?}", m.node1.shared().telemetry.lines()));
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        out.push((format!("{status} {}", String::from_utf8_lossy(&body)), began.elapsed()));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_service_is_routed_by_the_waypoint_request_by_request() {
    let (m, _node2, wp, cfg) = mesh(91).await;
    let ip = |c, d| m.ip(c, d);
    // No routes: the service's own endpoints, both versions.
    let plain = get(&m, SocketAddr::new(ip(9, 1), APP_PORT), "/reviews/0", 40).await;
    assert!(plain.iter().all(|b| b == "200 v1 /reviews/0" || b == "200 v2 /reviews/0"), "{plain:?}");
    assert!(plain.iter().any(|b| b.contains("v1")) && plain.iter().any(|b| b.contains("v2")), "both endpoints: {plain:?}");

    // The canary: 90/10 between the two versions' services, on one
    // client connection (the waypoint decides per request).
    let rule = RouteRule {
        name: "default/reviews.0".into(),
        backends: vec![
            Backend { service: key("reviews-v1"), port: APP_PORT, weight: 90, subset: None },
            Backend { service: key("reviews-v2"), port: APP_PORT, weight: 10, subset: None },
        ],
        filters: Filters::default(),
        ..Default::default()
    };
    wp.set_routes([ServiceRoutes { service: key("reviews"), rules: vec![rule], ..Default::default() }]);
    let n = 1000;
    let answers = get(&m, SocketAddr::new(ip(9, 1), APP_PORT), "/reviews/1", n).await;
    let v2 = answers.iter().filter(|b| *b == "200 v2 /reviews/1").count();
    let v1 = answers.iter().filter(|b| *b == "200 v1 /reviews/1").count();
    assert_eq!(v1 + v2, n, "every answer from one of the two versions: {:?}", answers.iter().find(|b| !b.starts_with("200 v")));
    // Binomial(1000, 0.1): mean 100, standard deviation 9.5; 5 of them either way.
    assert!((52..=148).contains(&v2), "v2 took {v2} of {n}");

    // The client's egress network policy allows reviews-v1 only: its node
    // proxy cannot know the endpoint of a request, so the waypoint applies
    // it, on each request's endpoint.
    let mut isolated = cfg.clone();
    isolated.net_policies.push(policy::network::NetPolicy {
        namespace: "default".into(),
        name: "client-egress".into(),
        selected: vec!["test//Pod/default/client".into()],
        isolates_egress: true,
        egress: vec![policy::network::NetRule {
            peers: Some(vec![policy::network::NetPeer::Addresses(vec![ip(2, 1)])]),
            ports: None,
            path: "spec.egress[0]".into(),
        }],
        ..Default::default()
    });
    let (state, errors) = MeshState::from_config(&isolated);
    assert!(errors.is_empty(), "{errors:?}");
    wp.set_mesh(state);
    let answers = get(&m, SocketAddr::new(ip(9, 1), APP_PORT), "/reviews/1", 200).await;
    let denied = answers.iter().filter(|b| b.starts_with("403 ")).count();
    assert!(answers.iter().all(|b| b == "200 v1 /reviews/1" || b.starts_with("403 ")), "{answers:?}");
    assert!(denied > 0, "some requests drew v2 and were refused: {answers:?}");
    assert!(answers.iter().any(|b| b.starts_with("403 ") && b.contains("client-egress")), "{answers:?}");
    // A tunnel from an address the waypoint knows no workload of that
    // identity at (here: the client left its configuration): its egress
    // policies cannot be decided, and its namespace has one, so every
    // request is refused rather than let out unchecked (issue 36, item 9).
    let mut unknown = isolated.clone();
    unknown.workloads.retain(|w| w.name != "client");
    unknown.net_policies[0].selected.clear();
    let (state, errors) = MeshState::from_config(&unknown);
    assert!(errors.is_empty(), "{errors:?}");
    wp.set_mesh(state);
    let answers = get(&m, SocketAddr::new(ip(9, 1), APP_PORT), "/reviews/1", 10).await;
    assert!(answers.iter().all(|b| b.starts_with("403 ") && b.contains("egress policies cannot be decided")), "{answers:?}");
    // Without a network policy restricting egress there: served.
    unknown.net_policies.clear();
    let (state, _) = MeshState::from_config(&unknown);
    wp.set_mesh(state);
    let answers = get(&m, SocketAddr::new(ip(9, 1), APP_PORT), "/reviews/1", 10).await;
    assert!(answers.iter().all(|b| b.starts_with("200 ")), "{answers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_bound_to_a_missing_waypoint_is_refused_never_sent_around_it() {
    let (m, _node2, _wp, _cfg) = mesh(92).await;
    let ip = |c, d| m.ip(c, d);
    let dst = SocketAddr::new(ip(9, 6), APP_PORT);
    let s = m.sockets.connect_captured(ip(1, 1), Listener::Outbound, dst).await;
    if let Ok(s) = s {
        let handshake = hyper::client::conn::http1::handshake::<_, Empty<bytes::Bytes>>(TokioIo::new(s)).await;
        if let Ok((mut send, conn)) = handshake {
            tokio::spawn(conn);
            let req = hyper::Request::get("/").body(Empty::new()).unwrap();
            assert!(send.send_request(req).await.is_err(), "no answer through a missing waypoint");
        }
    }
    wait_for("the refusal logged", || m.node1.shared().telemetry.lines().iter().any(|l| l.contains("NO_WAYPOINT"))).await;
    let line = m.node1.shared().telemetry.lines().into_iter().find(|l| l.contains("NO_WAYPOINT")).unwrap();
    assert!(line.contains("lost.default.svc.cluster.local is bound to waypoint default/gone, which does not exist"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_is_not_http_passes_through_the_waypoint_as_tcp() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (m, _node2, _wp, _cfg) = mesh(93).await;
    let ip = |c, d| m.ip(c, d);
    // The client speaks first, not HTTP: passed through to an endpoint.
    let mut s = m.sockets.connect_captured(ip(1, 1), Listener::Outbound, SocketAddr::new(ip(9, 7), 7000)).await.unwrap();
    s.write_all(b"\x00binary ping").await.unwrap();
    let mut got = [0u8; 12];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut got)).await.expect("echoed in time").unwrap();
    assert_eq!(&got, b"\x00binary ping");
    // The server speaks first: the waypoint stops waiting for the client.
    let mut s = m.sockets.connect_captured(ip(1, 1), Listener::Outbound, SocketAddr::new(ip(9, 8), 7001)).await.unwrap();
    let mut hello = [0u8; 6];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut hello)).await.expect("greeted in time").unwrap();
    assert_eq!(&hello, b"hello\n");
    s.write_all(b"abc").await.unwrap();
    let mut back = [0u8; 3];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut back)).await.expect("echoed in time").unwrap();
    assert_eq!(&back, b"abc");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_and_identity_headers_stop_at_the_waypoint() {
    let (m, _node2, _wp, _cfg) = mesh(105).await;
    let forged = [
        ("x-forwarded-client-cert", "By=spiffe://cluster.local/ns/default/sa/admin"),
        ("x-slipstream-peer", "spiffe://cluster.local/ns/default/sa/admin"),
        ("forwarded", "for=10.0.0.1"),
        ("keep-alive", "timeout=5"),
        ("proxy-connection", "keep-alive"),
        ("te", "gzip"),
        ("connection", "keep-alive, x-named-hop"),
        ("x-named-hop", "1"),
        ("x-request-id", "abc-123"),
        ("x-kept", "yes"),
    ];
    let mut answers = get_with(&m, SocketAddr::new(m.ip(9, 1), APP_PORT), "/headers", 4, &forged).await;
    // A second Host: the endpoint gets one, the one the waypoint routed by.
    let twice: Vec<(&str, &str)> = forged.iter().copied().chain([("host", "admin.internal:80")]).collect();
    answers.extend(get_with(&m, SocketAddr::new(m.ip(9, 1), APP_PORT), "/headers", 2, &twice).await);
    for (a, _) in &answers {
        let lines: Vec<&str> = a.strip_prefix("200 ").unwrap_or_else(|| panic!("{a}")).lines().collect();
        let names: Vec<&str> = lines.iter().filter_map(|l| l.split_once(": ").map(|(k, _)| k)).collect();
        for dropped in ["x-forwarded-client-cert", "x-slipstream-peer", "forwarded", "keep-alive", "proxy-connection", "te", "x-named-hop"]
        {
            assert!(!names.contains(&dropped), "{dropped} reached the endpoint: {lines:?}");
        }
        assert!(lines.contains(&"x-kept: yes"), "{lines:?}");
        assert!(lines.contains(&"x-request-id: abc-123"), "the caller's request id is kept: {lines:?}");
        assert_eq!(lines.iter().filter(|l| l.starts_with("host: ")).collect::<Vec<_>>(), [&"host: reviews:9080"], "{lines:?}");
        let trace = lines.iter().find_map(|l| l.strip_prefix("traceparent: ")).unwrap_or_else(|| panic!("a trace is started: {lines:?}"));
        assert!(slipstream_waypoint::trace::parse(trace).is_some(), "{trace}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_gets_a_copy_of_every_request_and_its_answer_is_dropped() {
    let (m, _node2, wp, _cfg) = mesh(94).await;
    let ip = |c, d| m.ip(c, d);
    let rule = RouteRule {
        name: "default/reviews.0".into(),
        backends: vec![Backend { service: key("reviews-v1"), port: APP_PORT, weight: 1, subset: None }],
        filters: Filters {
            mirrors: vec![Backend { service: key("reviews-v2"), port: APP_PORT, weight: 1, subset: None }],
            ..Default::default()
        },
        ..Default::default()
    };
    wp.set_routes([ServiceRoutes { service: key("reviews"), rules: vec![rule], ..Default::default() }]);
    let answers = get(&m, SocketAddr::new(ip(9, 1), APP_PORT), "/reviews/7", 20).await;
    assert!(answers.iter().all(|a| a == "200 v1 /reviews/7"), "the answers are the backend's only: {answers:?}");
    let v2 = ip(2, 2);
    wait_for("20 copies at the mirror", || SHADOWED.locked().iter().filter(|(a, _)| *a == v2).count() == 20).await;
    assert!(SHADOWED.locked().iter().filter(|(a, _)| *a == v2).all(|(_, r)| r == "reviews-shadow:9080 /reviews/7"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_address_holds_a_bounded_share_of_the_waypoint() {
    use slipstream_hbone::{Handler, HandshakeFailureKind};
    let (m, _node2, wp, _cfg) = mesh(95).await;
    let h = wp.handler();
    let local: SocketAddr = SocketAddr::new(m.ip(5, 1), 15008);
    let hostile: SocketAddr = SocketAddr::new(m.ip(1, 66), 40000);
    // Admissions held, as open connections would hold them, until refused.
    let mut held = Vec::new();
    let refused = loop {
        match h.admit(hostile, local) {
            Ok(a) => held.push(a),
            Err(r) => break r,
        }
        assert!(held.len() < 100_000, "no bound on one peer's connections");
    };
    assert!(
        matches!(refused.kind, HandshakeFailureKind::PeerHandshakeLimit | HandshakeFailureKind::PeerConnectionLimit),
        "{:?}: {}",
        refused.kind,
        refused.detail
    );
    // Another pod is served meanwhile, and the hostile one again once its
    // connections are gone.
    assert!(h.admit(SocketAddr::new(m.ip(1, 1), 40001), local).is_ok());
    drop(held);
    assert!(h.admit(hostile, local).is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_address_holds_a_bounded_number_of_streams_over_all_its_tunnels() {
    use slipstream_hbone::{Handler, HboneError, InboundRequest};
    let (m, _node2, wp, _cfg) = mesh(104).await;
    let h = wp.handler();
    let local: SocketAddr = SocketAddr::new(m.ip(5, 1), 15008);
    let request = |peer: SocketAddr, context| InboundRequest {
        peer_identity: "spiffe://cluster.local/ns/default/sa/productpage".parse().unwrap(),
        peer_addr: peer,
        tunnel_local: local,
        target: SocketAddr::new(m.ip(9, 1), APP_PORT),
        headers: Default::default(),
        context,
    };
    // Streams from one address, spread over two of its connections (as a
    // node proxy's pool spreads them), held open until one is refused.
    let hostile = SocketAddr::new(m.ip(1, 66), 40000);
    let tunnels: Vec<_> = (0..2).map(|_| h.admit(hostile, local).expect("a connection").context).collect();
    let mut held = Vec::new();
    let refused = loop {
        match h.connect(&request(hostile, tunnels[held.len() % 2].clone())).await {
            Ok(up) => held.push(up),
            Err(e) => break e,
        }
        assert!(held.len() < 100_000, "no bound on one peer's streams");
    };
    assert!(matches!(refused, HboneError::SourceLimit { what: "open HBONE streams", .. }), "{refused}");
    let bound = held.len();
    // The bound the waypoint derives from this process's open-files limit.
    let soft = slipstream_proxy::sys::rlimit::current().unwrap().soft;
    assert_eq!(bound as u32, Limits::derive(soft, &LimitArgs::default()).peer_streams, "held up to the peer's bound, no further");
    // Another address is served meanwhile; the hostile one again once its
    // streams end.
    let other = SocketAddr::new(m.ip(1, 1), 40001);
    assert!(h.connect(&request(other, None)).await.is_ok(), "another pod is not starved");
    held.truncate(bound - 1);
    assert!(h.connect(&request(hostile, tunnels[0].clone())).await.is_ok(), "one stream ended, one more may open");
}

/// A rule for `reviews` (Istio's VirtualService, as the control plane
/// compiles it): every request, to `backends` (service, subset).
fn vs_rule(backends: &[(&str, Option<&str>, u32)]) -> RouteRule {
    let subset = |name: &str| slipstream_core::route::Subset {
        name: name.into(),
        workloads: vec![format!("test//Pod/default/reviews-{name}")],
        traffic: None,
    };
    RouteRule {
        name: "default/reviews.0".into(),
        matches: vec![RouteMatch { path: PathMatch::StringPrefix("/".into()), ..Default::default() }],
        backends: backends
            .iter()
            .map(|(s, sub, w)| Backend { service: key(s), port: APP_PORT, weight: *w, subset: sub.map(subset) })
            .collect(),
        retry: Some(Retry::istio_default()),
        ..Default::default()
    }
}

fn count(answers: &[(String, Duration)], prefix: &str) -> usize {
    answers.iter().filter(|(a, _)| a.starts_with(prefix)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_match_takes_its_subset_and_everything_else_the_default() {
    let (m, _node2, wp, _cfg) = mesh(96).await;
    let vip = SocketAddr::new(m.ip(9, 1), APP_PORT);
    // bookinfo's "jason sees v2": a header match first, the default after.
    let mut jason = vs_rule(&[("reviews", Some("v2"), 100)]);
    jason.matches[0].headers = vec![HeaderMatch { name: "end-user".into(), value: "jason".into() }];
    let rest = vs_rule(&[("reviews", Some("v1"), 100)]);
    wp.set_routes([ServiceRoutes { service: key("reviews"), rules: vec![jason, rest], ..Default::default() }]);
    let j = get_with(&m, vip, "/reviews/1", 50, &[("end-user", "jason")]).await;
    assert_eq!(count(&j, "200 v2 /reviews/1"), 50, "{j:?}");
    let o = get_with(&m, vip, "/reviews/1", 50, &[("end-user", "ann")]).await;
    assert_eq!(count(&o, "200 v1 /reviews/1"), 50, "{o:?}");
    // Istio's request metrics count exactly, by destination workload.
    let text = wp.metrics().render();
    let requests = |workload: &str| {
        text.lines()
            .filter(|l| l.starts_with("istio_requests_total{") && l.contains(&format!("destination_workload=\"{workload}\"")))
            .map(|l| {
                assert!(
                    l.contains("reporter=\"waypoint\"") && l.contains("response_code=\"200\"") && l.contains("source_workload=\"client\""),
                    "{l}"
                );
                assert!(l.contains("destination_service=\"reviews.default.svc.cluster.local\""), "{l}");
                l.rsplit(' ').next().unwrap().parse::<u64>().unwrap()
            })
            .sum::<u64>()
    };
    assert_eq!((requests("reviews-v2"), requests("reviews-v1")), (50, 50), "{text}");
    let bytes =
        text.lines().find(|l| l.starts_with("istio_response_bytes_sum{") && l.contains("destination_workload=\"reviews-v2\"")).unwrap();
    assert!(bytes.ends_with(&format!(" {}.0", 50 * "v2 /reviews/1".len())), "every body byte counted: {bytes}");
    // Trace context: continued when the client sends one, started when not.
    let given = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    get_with(&m, vip, "/trace/a", 1, &[("traceparent", given)]).await;
    get_with(&m, vip, "/trace/b", 1, &[]).await;
    let seen: Vec<String> =
        TRACES.locked().iter().filter(|(ip, _)| matches!(ip, IpAddr::V4(v) if v.octets()[1] == 96)).map(|(_, t)| t.clone()).collect();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(
        seen[0].starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-") && !seen[0].contains("00f067aa0ba902b7"),
        "the same trace, the waypoint's span: {seen:?}"
    );
    assert!(slipstream_waypoint::trace::parse(&seen[1]).is_some() && !seen[1].contains("4bf92f35"), "a new trace: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_hide_a_pod_that_fails_half_of_its_requests() {
    let (m, _node2, wp, _cfg) = mesh(97).await;
    let vip = SocketAddr::new(m.ip(9, 1), APP_PORT);
    let n = 200;
    // No retries: about a quarter fail (half the requests reach v2, which
    // fails half of them). P(none of 200 fails) is 0.75^200.
    let mut once = vs_rule(&[("reviews", None, 100)]);
    once.retry = None;
    wp.set_routes([ServiceRoutes { service: key("reviews"), rules: vec![once], ..Default::default() }]);
    let a = get_with(&m, vip, "/flaky", n, &[]).await;
    let failed = count(&a, "503");
    assert!(failed > 10, "without retries {failed} of {n} failed: v2 should fail some");
    // retries: {attempts: 3, retryOn: 5xx}: a retry goes to another
    // endpoint (v1, which never fails), so none fails.
    let mut retried = vs_rule(&[("reviews", None, 100)]);
    retried.retry = Some(Retry { attempts: 3, per_try_timeout: None, on: RetryOn { five_xx: true, ..Default::default() } });
    wp.set_routes([ServiceRoutes { service: key("reviews"), rules: vec![retried], ..Default::default() }]);
    let a = get_with(&m, vip, "/flaky", n, &[]).await;
    assert_eq!(count(&a, "200"), n, "every request answered: {:?}", a.iter().filter(|(x, _)| !x.starts_with("200")).collect::<Vec<_>>());
    assert!(count(&a, "200 v2") > 10, "v2 still serves the requests it does not fail");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_delay_and_abort_their_percentages() {
    let (m, _node2, wp, _cfg) = mesh(98).await;
    let vip = SocketAddr::new(m.ip(9, 1), APP_PORT);
    let n = 1000u32;
    // abort: {httpStatus: 500, percentage: {value: 30}}: binomial(1000,
    // 0.3) is 300 +- 14.5; the bounds are 5 standard deviations.
    let mut r = vs_rule(&[("reviews", Some("v1"), 100)]);
    r.fault = Some(Fault { delay: None, abort: Some(FaultAbort { per_million: 300_000, status: 500 }) });
    wp.set_routes([ServiceRoutes { service: key("reviews"), rules: vec![r], ..Default::default() }]);
    let a = get_with(&m, vip, "/ratings", n as usize, &[]).await;
    let aborted = count(&a, "500 fault filter abort");
    assert!((228..=372).contains(&aborted), "{aborted} of {n} aborted, expected 300 +- 72");
    assert_eq!(aborted + count(&a, "200 v1 /ratings"), n as usize, "every other request reached v1");
    // delay: {fixedDelay: 100ms, percentage: {value: 20}} over 200
    // requests: 40 +- 5.7 delayed, each by at least 100 ms.
    let mut r = vs_rule(&[("reviews", Some("v1"), 100)]);
    r.fault = Some(Fault { delay: Some(FaultDelay { per_million: 200_000, delay: Duration::from_millis(100) }), abort: None });
    wp.set_routes([ServiceRoutes { service: key("reviews"), rules: vec![r], ..Default::default() }]);
    let a = get_with(&m, vip, "/ratings", 200, &[]).await;
    assert_eq!(count(&a, "200 v1 /ratings"), 200);
    let delayed = a.iter().filter(|(_, d)| *d >= Duration::from_millis(100)).count();
    assert!((12..=68).contains(&delayed), "{delayed} of 200 delayed, expected 40 +- 28");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destination_rule_load_balancing_and_outlier_detection() {
    let (m, _node2, wp, _cfg) = mesh(99).await;
    let vip = SocketAddr::new(m.ip(9, 1), APP_PORT);
    let mut plain = vs_rule(&[("reviews", None, 100)]);
    plain.retry = None;
    let with =
        |traffic: TrafficPolicy| ServiceRoutes { service: key("reviews"), rules: vec![plain.clone()], traffic, ..Default::default() };
    // ROUND_ROBIN: strictly alternating.
    wp.set_routes([with(TrafficPolicy { lb: LoadBalancer::RoundRobin, ..Default::default() })]);
    let a = get_with(&m, vip, "/r", 20, &[]).await;
    let versions: Vec<&str> = a.iter().map(|(x, _)| &x[4..6]).collect();
    assert!(versions.windows(2).all(|w| w[0] != w[1]), "{versions:?}");
    // consistentHash on a header: one user, one endpoint.
    wp.set_routes([with(TrafficPolicy { lb: LoadBalancer::Hash(HashOn::Header("x-user".into())), ..Default::default() })]);
    for user in ["ann", "bob", "cy", "dee"] {
        let a = get_with(&m, vip, "/r", 10, &[("x-user", user)]).await;
        let first = a[0].0.clone();
        assert!(a.iter().all(|(x, _)| *x == first), "{user}: {a:?}");
    }
    // outlierDetection {consecutive5xxErrors: 2, maxEjectionPercent: 100}:
    // v2, which always fails /fail-v2, is ejected after its second
    // failure; the rest go to v1.
    let od = OutlierDetection {
        consecutive_5xx: Some(2),
        consecutive_gateway: None,
        base_ejection: Duration::from_secs(60),
        max_ejection_percent: 100,
    };
    wp.set_routes([with(TrafficPolicy { lb: LoadBalancer::RoundRobin, outlier: Some(od), ..Default::default() })]);
    let a = get_with(&m, vip, "/fail-v2", 40, &[]).await;
    assert_eq!(count(&a, "503"), 2, "{a:?}");
    assert!(a[10..].iter().all(|(x, _)| x == "200 v1 /fail-v2"), "{a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_rate_limit_answers_429_with_retry_after_once_its_bucket_is_empty() {
    use slipstream_core::route::{LimitScope, RateLimit};
    let (m, _node2, wp, _cfg) = mesh(100).await;
    let vip = SocketAddr::new(m.ip(9, 1), APP_PORT);
    let mut jason = vs_rule(&[("reviews", Some("v2"), 100)]);
    jason.name = "default/reviews.jason".into();
    jason.matches[0].headers = vec![HeaderMatch { name: "end-user".into(), value: "jason".into() }];
    let rest = vs_rule(&[("reviews", Some("v1"), 100)]);
    // 5 per hour for jason's route: the bucket does not refill during the test.
    let limit = RateLimit {
        policy: "default/jason".into(),
        requests: 5,
        interval: Duration::from_secs(3600),
        burst: 5,
        scope: LimitScope::Rules { routes: vec![], rules: vec!["default/reviews.jason".into()] },
    };
    wp.set_routes([ServiceRoutes { service: key("reviews"), rules: vec![jason, rest], limits: vec![limit], ..Default::default() }]);
    let j = get_with(&m, vip, "/reviews/1", 12, &[("end-user", "jason")]).await;
    assert_eq!(count(&j, "200 v2"), 5, "{j:?}");
    assert_eq!(count(&j, "429 local_rate_limited"), 7, "{j:?}");
    // Other routes are not limited.
    let o = get_with(&m, vip, "/reviews/1", 12, &[]).await;
    assert_eq!(count(&o, "200 v1"), 12, "{o:?}");
    // retry-after: the seconds until a token is back (720 s at 5 per hour).
    let s = m.sockets.connect_captured(m.ip(1, 1), Listener::Outbound, vip).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s)).await.unwrap();
    tokio::spawn(conn);
    let req =
        hyper::Request::get("/x").header("host", "reviews:9080").header("end-user", "jason").body(Empty::<bytes::Bytes>::new()).unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 429);
    let after: u64 = resp.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((700..=720).contains(&after), "retry-after {after}");
    let text = wp.metrics().render();
    assert!(
        text.lines().any(|l| l.starts_with("istio_requests_total{")
            && l.contains("response_code=\"429\"")
            && l.contains("response_flags=\"RL\"")
            && l.ends_with(" 8")),
        "{text}"
    );
}

/// A gRPC app (the certificate service's definition, for its generated
/// code): answers CreateCertificate with its version and the request's
/// `csr`, and `INVALID_ARGUMENT` when the csr is `bad`.
struct GrpcApp(&'static str);

#[tonic::async_trait]
impl slipstream_api::ca::istio_certificate_service_server::IstioCertificateService for GrpcApp {
    async fn create_certificate(
        &self,
        request: tonic::Request<slipstream_api::ca::IstioCertificateRequest>,
    ) -> Result<tonic::Response<slipstream_api::ca::IstioCertificateResponse>, tonic::Status> {
        let csr = request.into_inner().csr;
        if csr == "bad" {
            return Err(tonic::Status::invalid_argument("bad csr"));
        }
        Ok(tonic::Response::new(slipstream_api::ca::IstioCertificateResponse { cert_chain: vec![self.0.to_string(), csr] }))
    }
}

async fn grpc_app(l: TcpListener, version: &'static str) {
    let incoming = futures_util::stream::unfold(l, |l| async move { Some((l.accept().await.map(|(s, _)| s), l)) });
    let svc = slipstream_api::ca::istio_certificate_service_server::IstioCertificateServiceServer::new(GrpcApp(version));
    let _ = tonic::transport::Server::builder().add_service(svc).serve_with_incoming(incoming).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_goes_through_the_waypoint_call_by_call() {
    use slipstream_api::ca::istio_certificate_service_client::IstioCertificateServiceClient;
    use slipstream_api::ca::IstioCertificateRequest;
    let (m, _node2, wp, _cfg) = mesh(101).await;
    let vip = SocketAddr::new(m.ip(9, 9), GRPC_PORT);
    // One HTTP/2 connection from the client pod, captured by node1.
    let sockets = m.sockets.clone();
    let client_ip = m.ip(1, 1);
    let channel = tonic::transport::Endpoint::from_static("http://grpc.default.svc.cluster.local:9090")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let sockets = sockets.clone();
            async move { sockets.connect_captured(client_ip, Listener::Outbound, vip).await.map(TokioIo::new) }
        }))
        .await
        .unwrap();
    let mut client = IstioCertificateServiceClient::new(channel);
    let mut by = std::collections::BTreeMap::<String, usize>::new();
    for i in 0..40 {
        let csr = format!("csr-{i}");
        let r = client.create_certificate(IstioCertificateRequest { csr: csr.clone(), ..Default::default() }).await.unwrap().into_inner();
        assert_eq!(r.cert_chain[1], csr);
        *by.entry(r.cert_chain[0].clone()).or_default() += 1;
    }
    // Calls on one HTTP/2 connection are balanced one by one.
    assert!(by.get("v1").is_some_and(|n| *n > 3) && by.get("v2").is_some_and(|n| *n > 3), "{by:?}");
    // A GRPCRoute's method match, as the control plane compiles it (the
    // exact path /<service>/<method>), to v2 only.
    let mut by_method = vs_rule(&[("grpc", Some("v2"), 1)]);
    by_method.matches[0].path = PathMatch::Exact("/istio.v1.auth.IstioCertificateService/CreateCertificate".into());
    by_method.backends[0].port = GRPC_PORT;
    by_method.backends[0].subset.as_mut().unwrap().workloads = vec!["test//Pod/default/reviews-v2".into()];
    wp.set_routes([ServiceRoutes { service: key("grpc"), rules: vec![by_method], ..Default::default() }]);
    for i in 0..10 {
        let r =
            client.create_certificate(IstioCertificateRequest { csr: format!("m-{i}"), ..Default::default() }).await.unwrap().into_inner();
        assert_eq!(r.cert_chain[0], "v2");
    }
    wp.set_routes([]);
    // A gRPC error comes back as the app's status, in trailers.
    let e = client.create_certificate(IstioCertificateRequest { csr: "bad".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!((e.code(), e.message()), (tonic::Code::InvalidArgument, "bad csr"));
    let text = wp.metrics().render();
    let grpc: u64 = text
        .lines()
        .filter(|l| l.starts_with("istio_requests_total{") && l.contains("request_protocol=\"grpc\""))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(grpc, 51, "{text}");
    assert!(text.lines().any(|l| l.starts_with("istio_requests_total{") && l.contains("grpc_response_status=\"3\"")), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pods_own_policies_hold_at_the_waypoint_when_it_is_reached_by_its_address() {
    use slipstream_core::policy::l7::{L7Operation, L7Policy, L7Rule};
    use slipstream_core::policy::{Action, StringMatch};
    let (mut m, mut node2, wp, mut cfg) = mesh(102).await;
    // reviews-v1 is bound to the waypoint for its own address too.
    let v1 = cfg.workloads.iter_mut().find(|w| w.name == "reviews-v1").unwrap();
    v1.waypoint = Some(gw("waypoint"));
    assert!(m.node1.apply_mesh(&cfg).errors.is_empty());
    assert!(node2.apply_mesh(&cfg).errors.is_empty());
    let (state, errors) = MeshState::from_config(&cfg);
    assert!(errors.is_empty(), "{errors:?}");
    wp.set_mesh(state);
    // Its selector-bound policy, carried by its service's routes: no GET of /secret.
    let deny = L7Policy {
        namespace: "default".into(),
        name: "no-secret".into(),
        action: Action::Deny,
        dry_run: false,
        rules: vec![L7Rule {
            to: vec![L7Operation { paths: vec![StringMatch::Exact("/secret".into())], ..Default::default() }],
            ..Default::default()
        }],
        workloads: Some(vec!["test//Pod/default/reviews-v1".into()]),
        pods: None,
    };
    wp.set_routes([ServiceRoutes { service: key("reviews"), policies: vec![deny], ..Default::default() }]);
    let pod = SocketAddr::new(m.ip(2, 1), APP_PORT);
    let by_address = get(&m, pod, "/secret", 3).await;
    assert!(by_address.iter().all(|a| a == "403 RBAC: access denied\n"), "by the pod's address: {by_address:?}");
    assert_eq!(get(&m, pod, "/open", 2).await, ["200 v1 /open", "200 v1 /open"]);
    // Through the service: v1 refuses, v2 (not selected) answers.
    let via_service = get(&m, SocketAddr::new(m.ip(9, 1), APP_PORT), "/secret", 40).await;
    assert!(via_service.iter().all(|a| a == "403 RBAC: access denied\n" || a == "200 v2 /secret"), "{via_service:?}");
    assert!(via_service.iter().any(|a| a == "200 v2 /secret"), "{via_service:?}");
}

/// A graceful stop, stage by stage: while `Closing`, requests are still
/// served (on open and on new connections) but each HTTP/1 answer closes
/// its connection and an HTTP/2 client is sent GOAWAY; at `Closed` an idle
/// HTTP/1 connection is closed too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_waypoint_moves_clients_between_requests() {
    let (m, _node2, wp, _cfg) = mesh(103).await;
    let dst = SocketAddr::new(m.ip(9, 1), APP_PORT);
    let h1 = || async {
        let s = m.sockets.connect_captured(m.ip(1, 1), Listener::Outbound, dst).await.unwrap();
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s)).await.unwrap();
        (send, tokio::spawn(conn))
    };
    let req = || hyper::Request::get("/reviews/0").header("host", "reviews:9080").body(Empty::<bytes::Bytes>::new()).unwrap();
    let (mut busy, busy_conn) = h1().await;
    let (mut idle, idle_conn) = h1().await;
    let r = busy.send_request(req()).await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("connection").is_none(), "serving: keep-alive");
    r.into_body().collect().await.unwrap();
    let r = idle.send_request(req()).await.unwrap();
    r.into_body().collect().await.unwrap();
    // HTTP/2 (prior knowledge) to the gRPC servers, one call before the
    // drain (an unknown method: answered by the server, grpc-status 12).
    let grpc = SocketAddr::new(m.ip(9, 9), GRPC_PORT);
    let s = m.sockets.connect_captured(m.ip(1, 1), Listener::Outbound, grpc).await.unwrap();
    let (mut h2, h2_conn) = hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), TokioIo::new(s)).await.unwrap();
    let h2_conn = tokio::spawn(h2_conn);
    let call = hyper::Request::post("http://grpc:9090/nothing.Here/Call")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Empty::<bytes::Bytes>::new())
        .unwrap();
    let r = h2.send_request(call).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers().get("grpc-status").map(|v| v.as_bytes()), Some(&b"12"[..]), "{:?}", r.headers());
    r.into_body().collect().await.unwrap();

    wp.drain().close();
    // HTTP/2: GOAWAY, the connection ends without a request failing.
    tokio::time::timeout(Duration::from_secs(5), h2_conn).await.expect("GOAWAY ends the HTTP/2 connection").unwrap().unwrap();
    // HTTP/1: answered, with `connection: close`, then closed.
    busy.ready().await.unwrap();
    let r = busy.send_request(req()).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers().get("connection").map(|v| v.as_bytes()), Some(&b"close"[..]));
    r.into_body().collect().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), busy_conn).await.expect("the connection closes after its answer").unwrap().unwrap();
    // A new connection is still served, the same way.
    let (mut late, late_conn) = h1().await;
    let r = late.send_request(req()).await.unwrap();
    assert_eq!((r.status().as_u16(), r.headers().get("connection").map(|v| v.as_bytes().to_vec())), (200, Some(b"close".to_vec())));
    r.into_body().collect().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), late_conn).await.expect("closed after its answer").unwrap().unwrap();
    // The idle connection stays open until the drain's end.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!idle_conn.is_finished(), "an idle connection is not closed while Closing (its next request may be on the way)");
    let hbone = SocketAddr::new(m.ip(5, 1), 15008);
    let listening = move || std::net::TcpStream::connect_timeout(&hbone, Duration::from_millis(200)).is_ok();
    assert!(listening(), "the HBONE listener stays open while Closing");
    wp.drain().shut(Duration::from_secs(5));
    tokio::time::timeout(Duration::from_secs(5), idle_conn).await.expect("closed at Closed").unwrap().unwrap();
    // The HBONE server follows the same drain: its listener closes at Closed.
    wait_for("the HBONE listener to close", || !listening()).await;
    // Never back: a stage once reached stays.
    assert!(!wp.drain().close());
    // Nothing new is served after Closed: the client's node proxy finds the
    // waypoint's listener closed and the new connection fails.
    if let Ok(s) = m.sockets.connect_captured(m.ip(1, 1), Listener::Outbound, dst).await {
        let (mut after, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s)).await.unwrap();
        tokio::spawn(conn);
        assert!(after.send_request(req()).await.is_err(), "a request after Closed was served");
    }
}

/// One request of `version` (1 or 2) on a fresh connection from the client
/// pod to `dst`: its status and its body, or the gRPC status for gRPC.
async fn one(m: &Mesh, dst: SocketAddr, path: &str, h2: bool, body: Option<Vec<u8>>) -> (u16, String) {
    let s = m.sockets.connect_captured(m.ip(1, 1), Listener::Outbound, dst).await.unwrap();
    let grpc = body.is_some();
    let mut req = hyper::Request::post(path).header("host", "reviews:9080");
    if grpc {
        req = req.header("content-type", "application/grpc").header("te", "trailers");
    }
    let req = req.body(Full::new(bytes::Bytes::from(body.unwrap_or_default()))).unwrap();
    let resp = if h2 {
        let (mut send, conn) = hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), TokioIo::new(s)).await.unwrap();
        tokio::spawn(conn);
        send.send_request(req).await.unwrap()
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s)).await.unwrap();
        tokio::spawn(conn);
        send.send_request(req).await.unwrap()
    };
    let status = resp.status().as_u16();
    // A trailers-only gRPC answer carries its status in the headers.
    let in_headers = resp.headers().get("grpc-status").and_then(|v| v.to_str().ok()).map(str::to_string);
    let collected = resp.into_body().collect().await.unwrap();
    if grpc {
        let in_trailers = collected.trailers().and_then(|t| t.get("grpc-status")).and_then(|v| v.to_str().ok()).map(str::to_string);
        return (status, format!("grpc-status {}", in_trailers.or(in_headers).unwrap_or_else(|| "?".into())));
    }
    (status, String::from_utf8_lossy(&collected.to_bytes()).trim_start_matches("v1 ").trim_start_matches("v2 ").to_string())
}

/// Issue 36, item 3: the path is normalized as MeshConfig says before the
/// routes, the policies and the app see it, on HTTP/1.1, HTTP/2 and gRPC;
/// rows of Istio's own table (the whole table is `core::path`'s test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_are_normalized_as_meshconfig_says_before_routes_policies_and_the_app() {
    use slipstream_core::mesh::{MeshSettings, PathNormalization as P};
    use slipstream_core::policy::l7::{L7Operation, L7Policy, L7Rule};
    use slipstream_core::policy::{Action, StringMatch};
    let (m, _node2, wp, _cfg) = mesh(107).await;
    let reviews = SocketAddr::new(m.ip(9, 1), APP_PORT);
    let rows: &[(&str, [&str; 4])] = &[
        ("/app/../admin", ["/app/../admin", "/admin", "/admin", "/admin"]),
        ("/app//", ["/app//", "/app//", "/app/", "/app/"]),
        ("/app%2f/", ["/app%2f/", "/app%2f/", "/app%2f/", "/app/"]),
        ("/xyz%30..//abc", ["/xyz%30..//abc", "/xyz0..//abc", "/xyz0../abc", "/xyz0../abc"]),
        ("/app\\admin", ["/app\\admin", "/app/admin", "/app/admin", "/app/admin"]),
        (
            "/%5Capp%2f%5c%2F%2e%2e%2fadmin%5c\\abc",
            [
                "/%5Capp%2f%5c%2F%2e%2e%2fadmin%5c\\abc",
                "/%5Capp%2f%5c%2F..%2fadmin%5c/abc",
                "/%5Capp%2f%5c%2F..%2fadmin%5c/abc",
                "/app/admin/abc",
            ],
        ),
        ("/app#foo", ["/app", "/app", "/app", "/app"]),
    ];
    for (i, mode) in [P::None, P::Base, P::MergeSlashes, P::DecodeAndMergeSlashes].into_iter().enumerate() {
        wp.set_settings(MeshSettings { path_normalization: mode, num_trusted_proxies: 0 });
        for (input, want) in rows {
            for h2 in [false, true] {
                assert_eq!(one(&m, reviews, input, h2, None).await, (200, want[i].to_string()), "{input} in {mode:?}, HTTP/2 {h2}");
            }
        }
    }
    // An encoded NUL is refused before anything reads it.
    wp.set_settings(MeshSettings { path_normalization: P::DecodeAndMergeSlashes, num_trusted_proxies: 0 });
    assert_eq!(one(&m, reviews, "/admin%00", false, None).await.0, 400);
    // A policy written for /admin holds for every spelling of it (BASE,
    // Istio's default); with NONE it is the operator's choice not to.
    let deny = L7Policy {
        namespace: "default".into(),
        name: "no-admin".into(),
        action: Action::Deny,
        rules: vec![L7Rule {
            to: vec![L7Operation { paths: vec![StringMatch::Exact("/admin".into())], ..Default::default() }],
            ..Default::default()
        }],
        ..Default::default()
    };
    wp.set_routes([ServiceRoutes { service: key("reviews"), policies: vec![deny], ..Default::default() }]);
    wp.set_settings(MeshSettings::default());
    for spelling in ["/admin", "/public/../admin", "/public/%2e%2e/admin", "/public/%2E/%2E%2E/admin", "/x\\..\\admin", "/..;/admin"] {
        for h2 in [false, true] {
            assert_eq!(one(&m, reviews, spelling, h2, None).await.0, 403, "{spelling}, HTTP/2 {h2}");
        }
    }
    wp.set_settings(MeshSettings { path_normalization: P::None, num_trusted_proxies: 0 });
    assert_eq!(one(&m, reviews, "/public/../admin", false, None).await, (200, "/public/../admin".into()), "NONE: as it came");
    wp.set_routes([]);
    // gRPC: a method path with a dot segment reaches the method it means.
    wp.set_settings(MeshSettings::default());
    let msg = prost::Message::encode_to_vec(&slipstream_api::ca::IstioCertificateRequest { csr: "x".into(), ..Default::default() });
    let mut frame = vec![0u8];
    frame.extend((msg.len() as u32).to_be_bytes());
    frame.extend(msg);
    let grpc = SocketAddr::new(m.ip(9, 9), GRPC_PORT);
    let path = "/istio.v1.auth.IstioCertificateService/x/../CreateCertificate";
    assert_eq!(one(&m, grpc, path, true, Some(frame.clone())).await, (200, "grpc-status 0".into()), "normalized to the method");
    wp.set_settings(MeshSettings { path_normalization: P::None, num_trusted_proxies: 0 });
    assert_eq!(one(&m, grpc, path, true, Some(frame)).await, (200, "grpc-status 12".into()), "NONE: no such method (UNIMPLEMENTED)");
}

/// Writes each chunk after its pause on a connection from the client pod
/// to `dst`, then reads until the connection closes or is silent for 1 s.
async fn raw(m: &Mesh, dst: SocketAddr, chunks: &[(&[u8], Duration)]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = m.sockets.connect_captured(m.ip(1, 1), Listener::Outbound, dst).await.unwrap();
    for (bytes, pause) in chunks {
        tokio::time::sleep(*pause).await;
        if s.write_all(bytes).await.is_err() {
            break;
        }
    }
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(1), s.read(&mut buf)).await {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Issue 36, item 4: a port declared HTTP is HTTP whatever the client
/// sends first: every request passes the waypoint's request handling (its
/// `x-request-id` reaches the app) or is answered 400; none is passed
/// through as raw TCP. A port declared TCP is TCP, and a connection passed
/// through is decided again when a policy changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cannot_turn_a_port_declared_http_into_raw_tcp() {
    use slipstream_core::policy::l7::{L7Operation, L7Policy, L7Rule};
    use slipstream_core::policy::Action;
    let (mut m, mut node2, wp, mut cfg) = mesh(106).await;
    // reviews' port is declared HTTP (appProtocol: http, or a name `http-...`).
    for s in cfg.services.iter_mut().filter(|s| s.name == "reviews") {
        s.ports[0].app_protocol = AppProtocol::Http11;
    }
    for s in cfg.services.iter_mut().filter(|s| s.name == "echo") {
        s.ports[0].app_protocol = AppProtocol::Tcp;
    }
    assert!(m.node1.apply_mesh(&cfg).errors.is_empty() && node2.apply_mesh(&cfg).errors.is_empty());
    let (state, errors) = MeshState::from_config(&cfg);
    assert!(errors.is_empty(), "{errors:?}");
    wp.set_mesh(state);
    let reviews = SocketAddr::new(m.ip(9, 1), APP_PORT);
    let now = Duration::ZERO;
    let get = b"GET /headers HTTP/1.1\r\nHost: reviews\r\n\r\n";
    let handled = |out: &str| out.starts_with("HTTP/1.1 200") && out.contains("x-request-id: ");
    type Case<'a> = (&'a str, Vec<(&'a [u8], Duration)>, fn(&str) -> bool);
    let cases: &[Case] = &[
        ("a leading CRLF", vec![(b"\r\n", now), (get, now)], |o| o.starts_with("HTTP/1.1 200") && o.contains("x-request-id: ")),
        ("a lowercase method", vec![(b"get /headers HTTP/1.1\r\nHost: reviews\r\n\r\n", now)], |o| {
            o.starts_with("HTTP/1.1 200") && o.contains("x-request-id: ")
        }),
        ("an extension method", vec![(b"PURGE /headers HTTP/1.1\r\nHost: reviews\r\n\r\n", now)], |o| {
            o.starts_with("HTTP/1.1 200") && o.contains("x-request-id: ")
        }),
        ("one byte, then the rest a second later", vec![(b"G", now), (&get[1..], Duration::from_secs(1))], |o| {
            o.starts_with("HTTP/1.1 200") && o.contains("x-request-id: ")
        }),
        ("a TLS ClientHello", vec![(b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03", now)], |o| o.starts_with("HTTP/1.1 400")),
        (
            "Upgrade: h2c",
            vec![(b"GET /headers HTTP/1.1\r\nHost: reviews\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n", now)],
            |o| o.starts_with("HTTP/1.1 200") && o.contains("x-request-id: ") && !o.to_ascii_lowercase().contains("upgrade"),
        ),
        (
            "Upgrade: websocket, then other bytes",
            vec![(b"GET /headers HTTP/1.1\r\nHost: reviews\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n\x81\x85\x37\xfa\x21\x3d\x7f\x9f\x4d\x51\x58", now)],
            // The bytes after the headers read as a malformed next
            // request: the connection is closed (and logged), never
            // switched to a raw stream to the app.
            |o| !o.contains(" 101 ") && (o.is_empty() || o.contains("x-request-id: ")),
        ),
        ("two pipelined requests", vec![([&get[..], &get[..]].concat().leak(), now)], |o| {
            o.matches("HTTP/1.1 200").count() == 2 && o.matches("x-request-id: ").count() == 2
        }),
        (
            "Content-Length and Transfer-Encoding both",
            vec![(b"POST /headers HTTP/1.1\r\nHost: reviews\r\nContent-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", now)],
            |o| o.starts_with("HTTP/1.1 200") && o.contains("x-request-id: ") && !o.contains("content-length: 40"),
        ),
    ];
    for (what, chunks, ok) in cases {
        let out = raw(&m, reviews, chunks).await;
        assert!(ok(&out), "{what}: {out:?}");
    }
    // An HTTP/2 preface on the HTTP/1 port: HTTP/2, still handled.
    let (status, body) = one(&m, reviews, "/headers", true, None).await;
    assert!(status == 200 && body.contains("x-request-id: "), "{body}");
    assert!(handled(&raw(&m, reviews, &[(get, now)]).await));
    // A port declared TCP is passed through as it came, whatever it looks like.
    let echo = SocketAddr::new(m.ip(9, 7), 7000);
    assert_eq!(raw(&m, echo, &[(get, now)]).await.as_bytes(), get, "echoed, not parsed");
    // A connection passed through is decided again when a policy changes:
    // a DENY of everything on echo closes it.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = m.sockets.connect_captured(m.ip(1, 1), Listener::Outbound, echo).await.unwrap();
    s.write_all(b"ping").await.unwrap();
    let mut back = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut back)).await.expect("echoed").unwrap();
    let deny = L7Policy {
        namespace: "default".into(),
        name: "deny-all".into(),
        action: Action::Deny,
        rules: vec![L7Rule { to: vec![L7Operation { ports: vec![7000], ..Default::default() }], ..Default::default() }],
        ..Default::default()
    };
    wp.set_routes([ServiceRoutes { service: key("echo"), policies: vec![deny], ..Default::default() }]);
    let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut back)).await.expect("closed in time");
    assert!(matches!(n, Ok(0) | Err(_)), "the denied connection is closed: {n:?}");
}

/// RequestAuthentication at the waypoint, with tokens signed here (ES256):
/// a request with a token must carry a valid one (401, or 403 for another
/// audience); one without goes on with no request identity, which the
/// policy that asks for one refuses; the token and the output headers a
/// client may forge never reach the app as the client wrote them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_tokens_are_verified_and_their_identity_is_what_policies_read() {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    use slipstream_core::policy::l7::{L7Operation, L7Policy, L7Rule, L7Source};
    use slipstream_core::policy::{Action, StringMatch};
    use slipstream_core::route::JwtRule;
    let (m, _node2, wp, _cfg) = mesh(108).await;
    let vip = SocketAddr::new(m.ip(9, 1), APP_PORT);
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let raw = kp.public_key_raw();
    let jwks = serde_json::json!({"keys": [{"kty": "EC", "crv": "P-256", "alg": "ES256", "kid": "k1",
        "x": URL_SAFE_NO_PAD.encode(&raw[1..33]), "y": URL_SAFE_NO_PAD.encode(&raw[33..65])}]});
    let signing = jsonwebtoken::EncodingKey::from_ec_der(&kp.serialize_der());
    let exp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 600;
    let sign = |claims: serde_json::Value| {
        let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
        h.kid = Some("k1".into());
        format!("Bearer {}", jsonwebtoken::encode(&h, &claims, &signing).unwrap())
    };
    let alice = sign(serde_json::json!({"iss": "https://issuer.example", "sub": "alice", "aud": "reviews", "exp": exp}));
    let other_audience = sign(serde_json::json!({"iss": "https://issuer.example", "sub": "alice", "aud": "billing", "exp": exp}));
    let expired = sign(serde_json::json!({"iss": "https://issuer.example", "sub": "alice", "aud": "reviews", "exp": 1000}));
    let rule = JwtRule {
        policy: "default/jwt".into(),
        issuer: "https://issuer.example".into(),
        audiences: vec!["reviews".into()],
        jwks: jwks.to_string(),
        output_claim_to_headers: vec![("x-user".into(), "sub".into())],
        ..Default::default()
    };
    // /private needs a request identity (Istio's idiom: DENY notRequestPrincipals *).
    let require = L7Policy {
        namespace: "default".into(),
        name: "require-jwt".into(),
        action: Action::Deny,
        dry_run: false,
        rules: vec![L7Rule {
            from: vec![L7Source { not_request_principals: vec![StringMatch::Presence], ..Default::default() }],
            to: vec![L7Operation { paths: vec![StringMatch::Exact("/private".into())], ..Default::default() }],
            ..Default::default()
        }],
        workloads: None,
        pods: None,
    };
    wp.set_routes([ServiceRoutes { service: key("reviews"), jwt_rules: vec![rule], policies: vec![require], ..Default::default() }]);
    let status = |a: &[(String, Duration)]| a.iter().map(|(s, _)| s.split(' ').next().unwrap_or("").to_string()).collect::<Vec<_>>();
    // No token: an open path answers, the path that needs one is refused.
    assert_eq!(status(&get_with(&m, vip, "/open", 1, &[]).await), ["200"]);
    assert_eq!(get_with(&m, vip, "/private", 1, &[]).await[0].0, "403 RBAC: access denied\n");
    // A valid token opens it.
    assert_eq!(status(&get_with(&m, vip, "/private", 1, &[("authorization", &alice)]).await), ["200"]);
    // Invalid tokens are refused wherever they go, the open path too.
    for (what, t, code) in
        [("expired", expired.as_str(), "401"), ("garbage", "Bearer a.b.c", "401"), ("another audience", other_audience.as_str(), "403")]
    {
        let a = get_with(&m, vip, "/open", 1, &[("authorization", t)]).await;
        assert_eq!(status(&a), [code], "{what}: {a:?}");
    }
    // The app gets no token, and x-user only as the mesh verified it.
    let forged = get_with(&m, vip, "/headers", 1, &[("x-user", "admin")]).await;
    assert!(forged[0].0.starts_with("200 ") && !forged[0].0.contains("x-user"), "a client's own x-user reached the app: {forged:?}");
    let verified = get_with(&m, vip, "/headers", 1, &[("x-user", "admin"), ("authorization", &alice)]).await;
    assert!(verified[0].0.contains("x-user: alice\n"), "{verified:?}");
    assert!(!verified[0].0.contains("authorization") && !verified[0].0.contains("admin"), "{verified:?}");
    // The raw answer of a refusal says why, as Envoy's filter does.
    let s = m.sockets.connect_captured(m.ip(1, 1), Listener::Outbound, vip).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s)).await.unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::get("/")
        .header("host", "reviews:9080")
        .header("authorization", expired.as_str())
        .body(Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 401);
    assert!(resp.headers().get("www-authenticate").is_some_and(|v| v.to_str().unwrap().starts_with("Bearer")), "{:?}", resp.headers());
}

/// Connections the sink took (it never answers), per test network.
fn sink_accepts(m: &Mesh) -> usize {
    SINK.locked().iter().filter(|a| **a == m.ip(2, 1)).count()
}

/// One HTTP/2 frame.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(9 + payload.len());
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    f.extend_from_slice(&[kind, flags]);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// The client preface and an empty SETTINGS frame.
fn h2_preface() -> Vec<u8> {
    let mut b = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    b.extend(h2_frame(4, 0, 0, &[]));
    b
}

/// `GET /` to reviews:9080, HPACK-encoded (static table, one literal).
fn h2_get() -> Vec<u8> {
    let mut h = vec![0x82, 0x86, 0x84, 0x41, 12];
    h.extend_from_slice(b"reviews:9080");
    h
}

/// One attack connection from the attacker pod to reviews: `bytes`
/// written, then read until the waypoint closes it (or 5 s).
async fn abuse(m: &Mesh, bytes: &[u8]) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = m.sockets.connect_captured(m.ip(1, 2), Listener::Outbound, SocketAddr::new(m.ip(9, 1), APP_PORT)).await else { return };
    let _ = s.write_all(bytes).await;
    let mut buf = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

/// HTTP/2 rapid reset: streams opened and cancelled at once, many per write.
fn rapid_reset() -> Vec<u8> {
    let mut b = h2_preface();
    for i in 0..2000u32 {
        let id = 2 * i + 1;
        b.extend(h2_frame(1, 0x5, id, &h2_get()));
        b.extend(h2_frame(3, 0, id, &8u32.to_be_bytes()));
    }
    b
}

/// A CONTINUATION flood: a header block that never ends (four times the
/// largest the waypoint takes).
fn continuation_flood() -> Vec<u8> {
    let mut b = h2_preface();
    b.extend(h2_frame(1, 0x1, 1, &h2_get()));
    for _ in 0..16 {
        b.extend(h2_frame(9, 0, 1, &[0x40; 16 * 1024]));
    }
    b
}

/// The latencies of `n` GETs from the client pod to reviews, 100 a second
/// on one keep-alive connection; every answer must be a 200.
async fn victim(m: &Mesh, n: usize) -> Vec<Duration> {
    let s = m.sockets.connect_captured(m.ip(1, 1), Listener::Outbound, SocketAddr::new(m.ip(9, 1), APP_PORT)).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s)).await.unwrap();
    tokio::spawn(conn);
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        tick.tick().await;
        let req = hyper::Request::get("/victim").header("host", "reviews:9080").body(Empty::<bytes::Bytes>::new()).unwrap();
        let began = Instant::now();
        send.ready().await.unwrap_or_else(|e| panic!("request {i}: {e}"));
        let resp = tokio::time::timeout(Duration::from_secs(5), send.send_request(req)).await.expect("answered in time").unwrap();
        assert_eq!(resp.status(), 200, "request {i}");
        resp.into_body().collect().await.unwrap();
        out.push(began.elapsed());
    }
    out.sort();
    out
}

fn p99(sorted: &[Duration]) -> Duration {
    sorted[(sorted.len() * 99 / 100).min(sorted.len() - 1)]
}

/// Issue 36, item 6: one client holding its bound of streams with idle TCP
/// connections, its bound of mirrored copies, and breaking HTTP/2 on
/// purpose (rapid resets, CONTINUATION floods) over and over, while a
/// second client sends 100 requests a second: the second sees no error
/// and its p99 stays within twice its unloaded p99; the first is refused
/// past each bound and cooled down after its broken connections.
// one scenario: every bound hit in turn by one client while the other's latencies are measured throughout.
#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_at_every_bound_does_not_starve_another() {
    use slipstream_waypoint::fair::Fairness;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const BOUND: u32 = 48;
    let fairness = Fairness {
        client_streams: Some(BOUND),
        client_mirrors: 4,
        cool_down: Duration::from_secs(3),
        tcp_idle_timeout: Duration::from_secs(30),
        ..Default::default()
    };
    let (m, _node2, wp, _cfg) = mesh_in_turn(109, fairness, Turn::Alone(ALONE.write().await)).await;
    // Requests with `x-mirror` are mirrored to the sink, which never answers.
    let mut mirrored = vs_rule(&[("reviews", Some("v1"), 100)]);
    mirrored.name = "default/reviews.mirror".into();
    mirrored.matches[0].headers = vec![HeaderMatch { name: "x-mirror".into(), value: "1".into() }];
    mirrored.filters.mirrors = vec![Backend { service: key("sink"), port: SINK_PORT, weight: 1, subset: None }];
    wp.set_routes([ServiceRoutes {
        service: key("reviews"),
        rules: vec![mirrored, vs_rule(&[("reviews", Some("v1"), 100)])],
        ..Default::default()
    }]);
    victim(&m, 50).await; // warm: tunnels and pools made
    let unloaded = p99(&victim(&m, 500).await);

    // The attacker's bound of streams, held by idle TCP connections (each
    // echoes once, so it is through); the next one is refused.
    let echo = SocketAddr::new(m.ip(9, 7), 7000);
    let mut idle = Vec::new();
    for i in 0..BOUND {
        let mut s = m.sockets.connect_captured(m.ip(1, 2), Listener::Outbound, echo).await.unwrap();
        s.write_all(b"x").await.unwrap();
        let mut one = [0u8; 1];
        tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut one))
            .await
            .expect("echoed in time")
            .unwrap_or_else(|e| panic!("idle connection {i}: {e}"));
        idle.push(s);
    }
    let mut over = m.sockets.connect_captured(m.ip(1, 2), Listener::Outbound, echo).await.unwrap();
    let _ = over.write_all(b"x").await;
    let mut one = [0u8; 1];
    let refused = tokio::time::timeout(Duration::from_secs(10), over.read_exact(&mut one)).await.expect("refused in time");
    assert!(refused.is_err(), "a stream past the client's bound of {BOUND} went through");
    drop(over);
    // Room for the attacks: a few of its streams back (once the waypoint
    // has seen those connections end).
    idle.truncate(BOUND as usize - 8);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Its bound of mirrored copies: 20 mirrored requests, 4 copies held.
    let before = sink_accepts(&m);
    let a = m.sockets.connect_captured(m.ip(1, 2), Listener::Outbound, SocketAddr::new(m.ip(9, 1), APP_PORT)).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(a)).await.unwrap();
    tokio::spawn(conn);
    for _ in 0..20 {
        let req =
            hyper::Request::get("/m").header("host", "reviews:9080").header("x-mirror", "1").body(Empty::<bytes::Bytes>::new()).unwrap();
        // The connection is kept: wait until hyper has taken back the
        // previous exchange before the next request (else "not ready").
        send.ready().await.unwrap();
        let resp = send.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        resp.into_body().collect().await.unwrap();
    }
    drop(send);
    wait_for("the attacker's 4 copies at the sink", || sink_accepts(&m) == before + 4).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sink_accepts(&m), before + 4, "past its bound of copies, no more are sent");

    // Broken HTTP/2, over and over, while the victim is measured.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let m = Arc::new(m);
    let mut attacks = Vec::new();
    let floods = [Arc::new(rapid_reset()), Arc::new(continuation_flood())];
    for k in 0..4 {
        let (m, stop, bytes) = (m.clone(), stop.clone(), floods[k % 2].clone());
        attacks.push(tokio::spawn(async move {
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                abuse(&m, &bytes).await;
                // Paced (about 1 000 broken connections a second over the
                // four loops): here the attacker shares two threads with
                // the victim, both node proxies and the waypoint, so an
                // unpaced loop would measure this test's own CPU rather
                // than the waypoint's fairness.
                tokio::time::sleep(Duration::from_millis(2)).await;
                n += 1;
            }
            n
        }));
    }
    // Up to three rounds of 500 requests under attack: a sub-millisecond
    // p99 on two shared cores moves by a few hundred microseconds with
    // whatever else the machine does, and one round at 2.06x was seen on a
    // fair waypoint; a starving one (the cool-down off: 2.75x) misses in
    // every round.
    let mut rounds = Vec::new();
    for _ in 0..3 {
        let loaded_p99 = p99(&victim(&m, 500).await);
        rounds.push(loaded_p99);
        if loaded_p99 <= unloaded * 2 {
            break;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut attempts = 0;
    for a in attacks {
        attempts += a.await.unwrap();
    }
    eprintln!("victim p99: unloaded {unloaded:?}, under attack {rounds:?} ({attempts} attack connections)");
    let best = *rounds.iter().min().unwrap();
    assert!(best <= unloaded * 2, "p99 under attack {rounds:?}: more than twice the unloaded {unloaded:?} in every round");
    // The victim's own mirrored request is still copied.
    let s = m.sockets.connect_captured(m.ip(1, 1), Listener::Outbound, SocketAddr::new(m.ip(9, 1), APP_PORT)).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s)).await.unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::get("/m").header("host", "reviews:9080").header("x-mirror", "1").body(Empty::<bytes::Bytes>::new()).unwrap();
    assert_eq!(send.send_request(req).await.unwrap().status(), 200);
    wait_for("the victim's copy at the sink", || sink_accepts(&m) == before + 5).await;
    // The attacker broke connections: it is cooling down, its new ones refused.
    let text = wp.metrics().render();
    drop(idle);
    let refused = {
        let s = m.sockets.connect_captured(m.ip(1, 2), Listener::Outbound, SocketAddr::new(m.ip(9, 1), APP_PORT)).await;
        match s {
            Err(_) => true,
            Ok(s) => match hyper::client::conn::http1::handshake::<_, Empty<bytes::Bytes>>(TokioIo::new(s)).await {
                Err(_) => true,
                Ok((mut send, conn)) => {
                    tokio::spawn(conn);
                    let req = hyper::Request::get("/").header("host", "reviews:9080").body(Empty::new()).unwrap();
                    send.send_request(req).await.map_or(true, |r| r.status() != 200)
                }
            },
        }
    };
    assert!(refused, "the attacker was not cooled down after {attempts} broken connections:\n{text}");
}

/// Issue 36, item 6: a request body that stops coming is ended with 408
/// (it holds no stream or replay budget for ever), and a TCP connection
/// that carries nothing is closed after the idle timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_gets_408_and_an_idle_tcp_connection_is_closed() {
    use slipstream_waypoint::fair::Fairness;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fairness =
        Fairness { request_body_timeout: Duration::from_millis(500), tcp_idle_timeout: Duration::from_secs(1), ..Default::default() };
    let (m, _node2, wp, _cfg) = mesh_with(110, fairness).await;
    // Mirrored requests are read whole first (to be sent twice).
    let mut mirrored = vs_rule(&[("reviews", Some("v1"), 100)]);
    mirrored.filters.mirrors = vec![Backend { service: key("reviews-v2"), port: APP_PORT, weight: 1, subset: None }];
    wp.set_routes([ServiceRoutes { service: key("reviews"), rules: vec![mirrored], ..Default::default() }]);
    let mut s = m.sockets.connect_captured(m.ip(1, 1), Listener::Outbound, SocketAddr::new(m.ip(9, 1), APP_PORT)).await.unwrap();
    let began = Instant::now();
    s.write_all(b"POST /upload HTTP/1.1\r\nhost: reviews:9080\r\ncontent-length: 100\r\n\r\n0123456789").await.unwrap();
    let mut got = vec![0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut got)).await.expect("answered in time").unwrap();
    let head = String::from_utf8_lossy(&got[..n]).to_string();
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
    assert!(began.elapsed() >= Duration::from_millis(500), "not before the timeout: {:?}", began.elapsed());
    // A whole body is served as before.
    let mut s = m.sockets.connect_captured(m.ip(1, 1), Listener::Outbound, SocketAddr::new(m.ip(9, 1), APP_PORT)).await.unwrap();
    s.write_all(b"POST /upload HTTP/1.1\r\nhost: reviews:9080\r\ncontent-length: 10\r\n\r\n0123456789").await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut got)).await.expect("answered in time").unwrap();
    assert!(String::from_utf8_lossy(&got[..n]).starts_with("HTTP/1.1 200"));
    // TCP passed through: echoed while used, closed once idle.
    let mut t = m.sockets.connect_captured(m.ip(1, 1), Listener::Outbound, SocketAddr::new(m.ip(9, 7), 7000)).await.unwrap();
    for _ in 0..3 {
        t.write_all(b"x").await.unwrap();
        let mut one = [0u8; 1];
        tokio::time::timeout(Duration::from_secs(10), t.read_exact(&mut one)).await.expect("echoed in time").unwrap();
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    let idle_from = Instant::now();
    let mut rest = [0u8; 1];
    let r = tokio::time::timeout(Duration::from_secs(10), t.read(&mut rest)).await.expect("closed in time");
    assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");
    let idle = idle_from.elapsed();
    assert!(idle >= Duration::from_millis(300) && idle < Duration::from_secs(5), "closed after {idle:?} idle");
}
