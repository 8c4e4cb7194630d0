//! The in-process tier: two node proxies in one test process, each serving
//! one pod, with real TLS between them over loopback (docs/testing.md).
//! Pods are addresses in 127.0.0.0/8 and capture is played by the test
//! (`LoopbackFactory`), so these run without root or namespaces and assert
//! what a user sees: bytes, the client's address at the app, identities,
//! exact metrics and access-log fields, refusals, revocation and drain.

use slipstream_core::policy::{Action, Authorization, Clause, Match, Rule, Scope, StringMatch};
use slipstream_core::sync::LockExt;
use slipstream_core::TrustDomain;
use slipstream_core::*;
use slipstream_identity::Ca;
use slipstream_node::config::Config;
use slipstream_node::proxy::{Deps, NodeProxy};
use slipstream_node::sockets::Listener;
use slipstream_node::telemetry::Sink;
use slipstream_node::testing::LoopbackFactory;
use slipstream_proxy::config::{LimitArgs, Limits};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const ECHO_PORT: u16 = 8080;
/// Reads until end of stream, then holds the connection open, silent.
const HOLD_PORT: u16 = 9000;
/// What the echo app says first, so the two directions carry different
/// byte counts.
const GREETING: &[u8] = b"hi\n";

/// Waits for `f` to hold, polling; panics with `what` at the deadline.
async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out after 10s waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A two-node mesh on 127.<net>.0.0/16: the client pod on node1, the echo
/// pod on node2 behind the service `echo` (VIP 127.<net>.9.9:80 -> 8080).
struct Mesh {
    client_ip: IpAddr,
    echo_ip: IpAddr,
    vip: SocketAddr,
    sockets: LoopbackFactory,
    node1: NodeProxy,
    node2: NodeProxy,
    config: MeshConfig,
    /// The source addresses the echo app saw.
    seen: Arc<Mutex<Vec<SocketAddr>>>,
}

fn workload(name: &str, ip: IpAddr, node: &str, service: Option<&str>) -> Workload {
    let mut services = BTreeMap::new();
    if let Some(s) = service {
        services.insert(s.to_string(), vec![Port { service_port: 80, target_port: ECHO_PORT, app_protocol: Default::default() }]);
    }
    Workload {
        uid: format!("test//Pod/default/{name}"),
        name: name.into(),
        namespace: "default".into(),
        addresses: vec![ip],
        tunnel_protocol: TunnelProtocol::Hbone,
        service_account: name.into(),
        node: node.into(),
        workload_name: name.into(),
        canonical_name: name.into(),
        services,
        ..Default::default()
    }
}

fn config(node: &str) -> Config {
    let mut c = Config::defaults("test", node, Limits::derive(4096, &LimitArgs::default()));
    c.admin_addr = "127.0.0.1:0".parse().unwrap();
    c.stats_addr = "127.0.0.1:0".parse().unwrap();
    c.readiness_addr = "127.0.0.1:0".parse().unwrap();
    c.timeouts.drain_grace = Duration::from_millis(300);
    c.timeouts.drain_force = Duration::from_millis(500);
    c
}

async fn proxy(node: &str, ca: &Arc<Ca>, sockets: &LoopbackFactory) -> NodeProxy {
    let deps =
        Deps { sockets: Arc::new(sockets.clone()), ca: ca.clone().into(), sink: Sink::Memory(Mutex::default()), report_served: false };
    let mut p = NodeProxy::new(config(node), deps).await.unwrap();
    p.serve();
    p
}

impl Mesh {
    async fn new(net: u8) -> Mesh {
        let ip = |c: u8, d: u8| IpAddr::from([127, net, c, d]);
        let (client_ip, echo_ip) = (ip(1, 1), ip(2, 1));
        let vip = SocketAddr::new(ip(9, 9), 80);
        let ca = Arc::new(Ca::generate(&TrustDomain::default()).unwrap());
        let sockets = LoopbackFactory::default();
        let (node1, node2) = (proxy("node1", &ca, &sockets).await, proxy("node2", &ca, &sockets).await);
        let svc_key = "default/echo.default.svc.cluster.local";
        let config = MeshConfig {
            workloads: vec![workload("client", client_ip, "node1", None), workload("echo", echo_ip, "node2", Some(svc_key))],
            services: vec![Service {
                name: "echo".into(),
                namespace: "default".into(),
                hostname: "echo.default.svc.cluster.local".into(),
                addresses: vec![NetworkAddress { network: String::new(), address: vip.ip() }],
                ports: vec![Port { service_port: 80, target_port: ECHO_PORT, app_protocol: Default::default() }],
                subject_alt_names: vec![],
                waypoint: None,
            }],
            policies: vec![],
            net_policies: vec![],
        };
        let seen = Arc::new(Mutex::new(Vec::new()));
        let app = TcpListener::bind(SocketAddr::new(echo_ip, ECHO_PORT)).await.unwrap();
        tokio::spawn(echo(app, seen.clone()));
        tokio::spawn(hold(TcpListener::bind(SocketAddr::new(echo_ip, HOLD_PORT)).await.unwrap()));
        let mut m = Mesh { client_ip, echo_ip, vip, sockets, node1, node2, config, seen };
        m.apply().await;
        let pods = |name: &str| NodePods {
            pods: vec![PodRegistration { uid: format!("test//Pod/default/{name}"), netns: String::new(), ip: None }],
        };
        m.node1.apply_pods(pods("client"));
        m.node2.apply_pods(pods("echo"));
        m.node1.reconcile().await;
        m.node2.reconcile().await;
        let (n1, n2) = (m.node1.shared().clone(), m.node2.shared().clone());
        wait_for("both proxies ready (listeners bound, certificates issued)", || n1.ready().is_ok() && n2.ready().is_ok()).await;
        m
    }

    async fn apply(&mut self) {
        assert!(self.node1.apply_mesh(&self.config).errors.is_empty());
        assert!(self.node2.apply_mesh(&self.config).errors.is_empty());
    }

    /// The client app's connection to the echo service, captured by node1,
    /// its greeting read.
    async fn connect(&self, dst: SocketAddr) -> TcpStream {
        let mut c = self.sockets.connect_captured(self.client_ip, Listener::Outbound, dst).await.unwrap();
        let mut hi = [0u8; GREETING.len()];
        tokio::time::timeout(Duration::from_secs(10), c.read_exact(&mut hi)).await.expect("greeting in time").unwrap();
        assert_eq!(hi, GREETING);
        c
    }

    /// A connection the proxy is expected to refuse: its reset may arrive
    /// before `connect` returns, or at the first read. Either way no byte
    /// comes back.
    async fn refused(&self, dst: SocketAddr) {
        let Ok(mut c) = self.sockets.connect_captured(self.client_ip, Listener::Outbound, dst).await else { return };
        let mut rest = Vec::new();
        let r = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut rest)).await.expect("refused in time");
        assert!(rest.is_empty() || r.is_err(), "a refused connection carried {} bytes", rest.len());
    }

    fn log(&self, node: u8) -> Vec<String> {
        let n = if node == 1 { &self.node1 } else { &self.node2 };
        n.shared().telemetry.lines()
    }

    fn metrics(&self, node: u8) -> String {
        let n = if node == 1 { &self.node1 } else { &self.node2 };
        n.shared().telemetry.metrics.render()
    }
}

/// Echoes every connection, noting its source address.
async fn echo(l: TcpListener, seen: Arc<Mutex<Vec<SocketAddr>>>) {
    loop {
        let Ok((mut s, peer)) = l.accept().await else { return };
        seen.locked().push(peer);
        tokio::spawn(async move {
            if s.write_all(GREETING).await.is_err() {
                return;
            }
            let mut buf = [0u8; 4096];
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
    }
}

/// Reads each connection to its end, then keeps it open without a word.
async fn hold(l: TcpListener) {
    loop {
        let Ok((mut s, _)) = l.accept().await else { return };
        tokio::spawn(async move {
            let mut sink = Vec::new();
            let _ = s.read_to_end(&mut sink).await;
            std::future::pending::<()>().await;
            drop(s);
        });
    }
}

/// The value of the one series of `name` whose line contains every `must`.
fn value(metrics: &str, name: &str, must: &[&str]) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && must.iter().all(|m| l.contains(m)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

async fn exchange(s: &mut TcpStream, msg: &[u8]) -> Vec<u8> {
    s.write_all(msg).await.unwrap();
    let mut got = vec![0u8; msg.len()];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut got)).await.expect("echo answered in time").unwrap();
    got
}

fn deny_client(config: &mut MeshConfig) {
    config.policies.push(Authorization {
        name: "deny-client".into(),
        namespace: "default".into(),
        scope: Scope::Namespace,
        action: Action::Deny,
        rules: vec![Rule {
            clauses: vec![Clause {
                matches: vec![Match {
                    principals: vec![StringMatch::Exact("cluster.local/ns/default/sa/client".into())],
                    ..Default::default()
                }],
            }],
        }],
        dry_run: false,
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_identities_metrics_and_logs_across_two_proxies() {
    let m = Mesh::new(81).await;
    let mut c = m.connect(m.vip).await;
    assert_eq!(exchange(&mut c, b"hello").await, b"hello");
    assert_eq!(exchange(&mut c, b"again!").await, b"again!");
    c.shutdown().await.unwrap();
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty());
    drop(c);
    assert_eq!(m.seen.locked().iter().map(|a| a.ip()).collect::<Vec<_>>(), vec![m.client_ip], "the app sees the client pod's address");

    let closed = "istio_tcp_connections_closed_total";
    wait_for("both proxies closed the connection", || {
        value(&m.metrics(1), closed, &["reporter=\"source\""]) == 1 && value(&m.metrics(2), closed, &["reporter=\"destination\""]) == 1
    })
    .await;
    let client_id = "source_principal=\"spiffe://cluster.local/ns/default/sa/client\"";
    let echo_id = "destination_principal=\"spiffe://cluster.local/ns/default/sa/echo\"";
    for node in [1, 2] {
        let text = m.metrics(node);
        let must = [
            client_id,
            echo_id,
            "destination_service=\"echo.default.svc.cluster.local\"",
            "connection_security_policy=\"mutual_tls\"",
            "response_flags=\"-\"",
        ];
        assert_eq!(value(&text, "istio_tcp_connections_opened_total", &must), 1, "node{node}: {text}");
        assert_eq!(value(&text, closed, &must), 1, "node{node}");
        assert_eq!(value(&text, "istio_tcp_received_bytes_total", &must), 11, "node{node}: client to server");
        assert_eq!(value(&text, "istio_tcp_sent_bytes_total", &must), 14, "node{node}: server to client, the greeting too");
    }
    let out = m.log(1);
    assert_eq!(out.len(), 1, "{out:?}");
    let (hbone, target) = (format!("dst.addr={}:15008 ", m.echo_ip), format!("dst.hbone_addr={}:{ECHO_PORT} ", m.echo_ip));
    for want in
        [hbone.as_str(), target.as_str(), "direction=outbound", "bytes_sent=11 bytes_recv=14", "dst.service=echo.default.svc.cluster.local"]
    {
        assert!(out[0].contains(want), "node1 log lacks {want:?}: {}", out[0]);
    }
    assert!(out[0].contains("src.identity=spiffe://cluster.local/ns/default/sa/client dst.addr"), "{}", out[0]);
    assert!(out[0].contains("dst.identity=spiffe://cluster.local/ns/default/sa/echo"), "{}", out[0]);
    let inbound = m.log(2);
    assert_eq!(inbound.len(), 1, "{inbound:?}");
    for want in [hbone.as_str(), target.as_str(), "direction=inbound", "bytes_sent=14 bytes_recv=11", "src.workload=client"] {
        assert!(inbound[0].contains(want), "node2 log lacks {want:?}: {}", inbound[0]);
    }
    assert!(!out[0].contains("flag=") && !inbound[0].contains("flag="), "no failure");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_refused_and_revoked_connections_are_counted_as_such() {
    let mut m = Mesh::new(82).await;
    // Open one connection before the policy exists.
    let mut open = m.connect(m.vip).await;
    assert_eq!(exchange(&mut open, b"before").await, b"before");
    // And one half-closed, whose copy waits only on the tunnel.
    let mut half = m.sockets.connect_captured(m.client_ip, Listener::Outbound, SocketAddr::new(m.echo_ip, HOLD_PORT)).await.unwrap();
    half.shutdown().await.unwrap();
    let n2 = m.node2.shared().clone();
    wait_for("both connections open at node2", || n2.pods.all().iter().map(|p| p.conns.len()).sum::<usize>() == 2).await;

    // The policy change closes it (the destination re-decides it) ...
    deny_client(&mut m.config);
    m.apply().await;
    let mut buf = [0u8; 16];
    let r = tokio::time::timeout(Duration::from_secs(10), open.read(&mut buf)).await.expect("closed after the policy change");
    assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");
    let r = tokio::time::timeout(Duration::from_secs(10), half.read(&mut buf)).await.expect("the half-closed one too");
    assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");
    wait_for("node2 logged both revocations", || m.log(2).iter().filter(|l| l.contains("closed after a policy change")).count() == 2).await;
    let line = m.log(2).into_iter().find(|l| l.contains("closed after a policy change") && l.contains(&format!(":{ECHO_PORT} "))).unwrap();
    assert!(line.contains("flag=DENY") && line.contains("bytes_recv=6"), "{line}");

    // ... and refuses a new one: 401 at node2, DENY on both sides.
    m.refused(m.vip).await;
    wait_for("the refusal counted on both proxies", || {
        value(&m.metrics(1), "istio_tcp_connections_closed_total", &["response_flags=\"DENY\""]) == 1
            && value(&m.metrics(2), "istio_tcp_connections_closed_total", &["response_flags=\"DENY\""]) == 3
    })
    .await;
    assert_eq!(value(&m.metrics(2), "slipstream_hbone_inbound_responses_total", &["code=\"401\""]), 1);
    assert_eq!(m.seen.locked().len(), 1, "the app never saw the denied connection");

    // Unknown service port: refused by node1 before any tunnel.
    m.refused(SocketAddr::new(m.vip.ip(), 81)).await;
    wait_for("CONNECT refusal counted", || {
        value(&m.metrics(1), "istio_tcp_connections_closed_total", &["response_flags=\"CONNECT\""]) == 1
    })
    .await;
    assert!(m.log(1).iter().any(|l| l.contains("has no healthy endpoint for port 81") && l.contains("flag=CONNECT")), "{:?}", m.log(1));

    // A self-call: refused, flagged, the proxy still serves.
    m.refused(SocketAddr::new(m.client_ip, 15001)).await;
    wait_for("SELF_CALL counted", || value(&m.metrics(1), "istio_tcp_connections_closed_total", &["response_flags=\"SELF_CALL\""]) == 1)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_lets_connections_finish_then_closes_the_rest() {
    let m = Mesh::new(83).await;
    let mut held = m.connect(m.vip).await;
    assert_eq!(exchange(&mut held, b"x").await, b"x");
    // One more, half-closed: the copy waits only on the tunnel (the app
    // holds its side open, silent), and the drain must still end it.
    let mut half = m.sockets.connect_captured(m.client_ip, Listener::Outbound, SocketAddr::new(m.echo_ip, HOLD_PORT)).await.unwrap();
    half.write_all(b"bye").await.unwrap();
    half.shutdown().await.unwrap();
    let n2 = m.node2.shared().clone();
    wait_for("the half-closed connection is open at node2", || n2.pods.all().iter().map(|p| p.conns.len()).sum::<usize>() == 2).await;
    let Mesh { node1, node2, .. } = m;
    let shared1 = node1.shared().clone();
    let started = Instant::now();
    // node1 drains: its listener closes, the open connection is cancelled
    // at the end of the 300 ms grace period, and drain returns.
    tokio::time::timeout(Duration::from_secs(5), node1.drain()).await.expect("drain returns");
    assert!(started.elapsed() >= Duration::from_millis(300), "the grace period was given");
    for (what, c) in [("held", &mut held), ("half-closed", &mut half)] {
        let mut buf = [0u8; 4];
        let r = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("the {what} connection was closed"));
        // A reset, not an end of stream the app could take for a complete answer.
        assert_eq!(r.map_err(|e| e.kind()).err(), Some(std::io::ErrorKind::ConnectionReset), "{what}");
    }
    let lines = shared1.telemetry.lines();
    let drained = lines.iter().filter(|l| l.contains("closed at the drain deadline") && l.contains("flag=CONNECTION_TERMINATED")).count();
    assert_eq!(drained, 2, "{lines:?}");
    assert_eq!(value(&shared1.telemetry.metrics.render(), "istio_tcp_connections_closed_total", &[]), 2);
    drop(node2);
}

/// One GET on the readiness port: (status, body).
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

/// On Kubernetes the control plane publishes a scheduled pod before the
/// API knows its address; the pod's own node proxy names it by the address
/// its CNI reported (the registration's), so its certificate is issued and
/// its first connection carried at once, while the other node, which does
/// not know the address yet, still serves it by its certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_published_without_an_address_is_named_by_its_registration() {
    let mut m = Mesh::new(85).await;
    let bare = |w: &Workload| Workload { addresses: vec![], ..w.clone() };
    let client = m.config.workloads[0].clone();
    m.config.workloads[0] = bare(&client);
    let newcomer = Workload { uid: "test//Pod/default/newcomer".into(), name: "newcomer".into(), ..bare(&client) };
    m.config.workloads.push(newcomer);
    m.apply().await;
    // Still named on node1 (its registration has no address): the client
    // registered without one is off the data path on both nodes...
    let (n1, n2) = (m.node1.shared().clone(), m.node2.shared().clone());
    assert!(n1.snapshot().workload_by_ip(m.client_ip).is_none() && n2.snapshot().workload_by_ip(m.client_ip).is_none());
    // ...until node1's registrations carry the CNI's addresses.
    let newcomer_ip: IpAddr = [127, 85, 1, 2].into();
    m.node1.apply_pods(NodePods {
        pods: vec![
            PodRegistration { uid: client.uid.clone(), netns: String::new(), ip: Some(m.client_ip) },
            PodRegistration { uid: "test//Pod/default/newcomer".into(), netns: String::new(), ip: Some(newcomer_ip) },
        ],
    });
    m.node1.reconcile().await;
    let named = n1.snapshot().workload_by_ip(newcomer_ip).map(|w| w.name.clone());
    assert_eq!(named.as_deref(), Some("newcomer"), "named on its own node by the address its CNI gave");
    assert!(n2.snapshot().workload_by_ip(newcomer_ip).is_none(), "the other node has no address for it");
    wait_for("node1 ready: the newcomer's certificate issued", || n1.ready().is_ok()).await;
    let mut c = m.connect(m.vip).await;
    assert_eq!(exchange(&mut c, b"ping").await, b"ping");
    drop(c);
    wait_for("node2 logged the connection with the client's verified identity", || {
        m.log(2).iter().any(|l| l.contains("src.identity=spiffe://cluster.local/ns/default/sa/client"))
    })
    .await;
    // The control plane's own version, with the address, replaces it.
    m.config.workloads[0] = client;
    m.apply().await;
    assert!(n2.snapshot().workload_by_ip(m.client_ip).is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_says_why_until_configuration_listeners_and_certificates_are_there() {
    let ca = Arc::new(Ca::generate(&TrustDomain::default()).unwrap());
    let sockets = LoopbackFactory::default();
    let mut p = proxy("node1", &ca, &sockets).await;
    let (admin, _, ready) = p.admin_addrs();
    assert_eq!(get(ready, "/healthz/ready").await, (503, "the mesh configuration has not arrived yet\n".to_string()));
    let ip: IpAddr = "127.84.1.1".parse().unwrap();
    let cfg =
        MeshConfig { workloads: vec![workload("client", ip, "node1", None)], services: vec![], policies: vec![], net_policies: vec![] };
    p.apply_pods(NodePods { pods: vec![PodRegistration { uid: "test//Pod/default/ghost".into(), netns: String::new(), ip: None }] });
    p.apply_mesh(&cfg);
    p.reconcile().await;
    assert_eq!(get(ready, "/healthz/ready").await, (503, "pod test//Pod/default/ghost: not in the mesh configuration yet\n".to_string()));
    p.apply_pods(NodePods { pods: vec![PodRegistration { uid: "test//Pod/default/client".into(), netns: String::new(), ip: None }] });
    p.reconcile().await;
    let s = p.shared().clone();
    wait_for("ready once the pod's certificate is issued", || s.ready().is_ok()).await;
    assert_eq!(get(ready, "/healthz/ready").await, (200, "ready\n".to_string()));
    // The whole configuration is served back.
    let (code, dump) = get(admin, "/config_dump").await;
    assert_eq!(code, 200);
    let dump: serde_json::Value = serde_json::from_str(&dump).unwrap();
    assert_eq!(dump["config"]["pool"]["max_streams_per_connection"], 100, "{}", dump["config"]);
    assert_eq!(dump["config"]["h2"]["max_header_list_size"], slipstream_hbone::H2Config::default().max_header_list_size);
    assert_eq!(dump["localPods"][0]["uid"], "test//Pod/default/client");
    assert_eq!(dump["workloads"][0]["name"], "client");
}
