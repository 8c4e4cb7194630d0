//! The delta xDS server on a real port: TLS from the mesh CA, HTTP/2,
//! gRPC, per-node tokens; clients are tonic's generated client over our
//! own TLS connector, as a proxy would be. Loopback only, no root.

use prost::Message;
use slipstream_api::convert::{address_any, authorization_any, AddressResource};
use slipstream_api::discovery::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use slipstream_api::discovery::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Node, Status as XdsStatus};
use slipstream_api::{string_struct, TypeUrl, NODE_NAME};
use slipstream_control::auth::NodeTokens;
use slipstream_control::resources::{Changes, ResourceKey, Resources, Versioned};
use slipstream_control::serve::{routes, ControlServer, ServeSettings};
use slipstream_control::store::Store;
use slipstream_control::xds::{XdsServer, XdsSettings};
use slipstream_core::policy::{Action, Authorization, Scope};
use slipstream_core::sync::LockExt;
use slipstream_core::TrustDomain;
use slipstream_core::{TunnelProtocol, Workload};
use slipstream_identity::Ca;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

const TOKEN1: &str = "node1-token-0123456789abcdef";
const TOKEN2: &str = "node2-token-0123456789abcdef";
const SAN: &str = slipstream_api::DEFAULT_CONTROL_PLANE_SAN;
const WAIT: Duration = Duration::from_secs(10);

fn workload(name: &str, ip: [u8; 4], node: &str) -> Workload {
    Workload {
        uid: format!("test//Pod/default/{name}"),
        name: name.into(),
        namespace: "default".into(),
        addresses: vec![ip.into()],
        tunnel_protocol: TunnelProtocol::Hbone,
        service_account: name.into(),
        node: node.into(),
        ..Default::default()
    }
}

fn policy(name: &str) -> Authorization {
    Authorization {
        name: name.into(),
        namespace: "default".into(),
        scope: Scope::Namespace,
        action: Action::Deny,
        rules: vec![],
        dry_run: false,
    }
}

/// The index's side, played by the test: a map and the store it publishes to.
struct Index {
    store: Store,
    resources: Resources,
}

impl Index {
    fn new(workloads: &[Workload], policies: &[Authorization]) -> Index {
        let mut resources = Resources::new();
        for w in workloads {
            resources.insert(ResourceKey::new(TypeUrl::Address, &w.uid), wl(w));
        }
        for p in policies {
            resources.insert(ResourceKey::new(TypeUrl::Authorization, &p.key()), Arc::new(Versioned::new(authorization_any(p))));
        }
        Index { store: Store::new(resources.clone()), resources }
    }

    fn upsert(&mut self, w: &Workload) -> u64 {
        let k = ResourceKey::new(TypeUrl::Address, &w.uid);
        self.resources.insert(k.clone(), wl(w));
        self.store.publish(self.resources.clone(), Changes { upserted: vec![k], removed: vec![] })
    }

    fn remove(&mut self, t: TypeUrl, name: &str) -> u64 {
        let k = ResourceKey::new(t, name);
        self.resources.remove(&k);
        self.store.publish(self.resources.clone(), Changes { upserted: vec![], removed: vec![k] })
    }

    fn version(&self, t: TypeUrl, name: &str) -> String {
        self.resources.get(&ResourceKey::new(t, name)).unwrap().version.to_string()
    }
}

fn wl(w: &Workload) -> Arc<Versioned> {
    Arc::new(Versioned::new(address_any(&AddressResource::Workload(w.clone()))))
}

struct Server {
    addr: SocketAddr,
    ca: Arc<Ca>,
    xds: XdsServer,
    stop: Option<oneshot::Sender<()>>,
}

impl Server {
    async fn start(store: Store, settings: ServeSettings) -> Server {
        Server::start_with(store, settings, XdsSettings::default()).await
    }

    async fn start_with(store: Store, settings: ServeSettings, xds_settings: XdsSettings) -> Server {
        let ca = Arc::new(Ca::generate(&TrustDomain::default()).unwrap());
        let tokens = NodeTokens::new(BTreeMap::from([("node1".into(), TOKEN1.into()), ("node2".into(), TOKEN2.into())]));
        let xds = XdsServer::with_settings(store, Arc::new(tokens), xds_settings);
        let server = ControlServer::bind(ServeSettings { addr: "127.0.0.1:0".parse().unwrap(), ..settings }, ca.clone()).await.unwrap();
        let addr = server.local_addr();
        let (stop, stopped) = oneshot::channel::<()>();
        let closer = xds.clone();
        tokio::spawn(server.serve(routes(&xds), async move {
            let _ = stopped.await;
            closer.close_streams();
        }));
        Server { addr, ca, xds, stop: Some(stop) }
    }

    async fn channel(&self) -> Channel {
        self.counted_channel(Arc::default()).await
    }

    /// A channel that counts the connections it makes in `made`.
    async fn counted_channel(&self, made: Arc<std::sync::atomic::AtomicUsize>) -> Channel {
        let mut tls = rustls::ClientConfig::builder_with_provider(slipstream_identity::tls::provider())
            .with_protocol_versions(slipstream_identity::tls::PROTOCOL_VERSIONS)
            .unwrap()
            .with_root_certificates(self.ca.roots().root_store())
            .with_no_client_auth();
        tls.alpn_protocols = vec![b"h2".to_vec()];
        let tls = tokio_rustls::TlsConnector::from(Arc::new(tls));
        let addr = self.addr;
        tonic::transport::Endpoint::from_shared(format!("https://{SAN}"))
            .unwrap()
            .connect_with_connector(tower::service_fn(move |_| {
                let tls = tls.clone();
                made.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async move {
                    let tcp = TcpStream::connect(addr).await?;
                    let s = tls.connect(rustls_pki_types::ServerName::try_from(SAN).unwrap(), tcp).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
                }
            }))
            .await
            .unwrap()
    }

    /// A stream for `node_name` with `token`, its first requests sent.
    async fn open(&self, token: &str, node_name: &str, first: Vec<DeltaDiscoveryRequest>) -> Result<Client, tonic::Status> {
        let (tx, rx) = mpsc::channel(16);
        for (i, mut r) in first.into_iter().enumerate() {
            if i == 0 {
                r.node = Some(node(node_name));
            }
            tx.send(r).await.unwrap();
        }
        let mut req = tonic::Request::new(ReceiverStream::new(rx));
        req.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
        let resp = AggregatedDiscoveryServiceClient::new(self.channel().await).delta_aggregated_resources(req).await?;
        Ok(Client { tx, rx: resp.into_inner() })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

fn node(name: &str) -> Node {
    Node {
        id: format!("ztunnel~127.0.0.1~ztunnel-{name}.istio-system~istio-system.svc.cluster.local"),
        metadata: Some(string_struct([(NODE_NAME, name)])),
        ..Default::default()
    }
}

fn subscribe(t: TypeUrl) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest { type_url: t.as_str().into(), ..Default::default() }
}

fn both() -> Vec<DeltaDiscoveryRequest> {
    vec![subscribe(TypeUrl::Address), subscribe(TypeUrl::Authorization)]
}

struct Client {
    tx: mpsc::Sender<DeltaDiscoveryRequest>,
    rx: tonic::Streaming<DeltaDiscoveryResponse>,
}

impl Client {
    async fn recv(&mut self) -> DeltaDiscoveryResponse {
        tokio::time::timeout(WAIT, self.rx.message()).await.expect("a response in time").expect("no error").expect("the stream is open")
    }

    /// The first response of each type, by type.
    async fn initial(&mut self) -> BTreeMap<TypeUrl, DeltaDiscoveryResponse> {
        let mut out = BTreeMap::new();
        while out.len() < 2 {
            let r = self.recv().await;
            out.insert(TypeUrl::parse(&r.type_url).unwrap(), r);
        }
        out
    }

    async fn ack(&self, r: &DeltaDiscoveryResponse) {
        self.tx
            .send(DeltaDiscoveryRequest { type_url: r.type_url.clone(), response_nonce: r.nonce.clone(), ..Default::default() })
            .await
            .unwrap();
    }

    async fn nack(&self, r: &DeltaDiscoveryResponse, why: &str) {
        self.tx
            .send(DeltaDiscoveryRequest {
                type_url: r.type_url.clone(),
                response_nonce: r.nonce.clone(),
                error_detail: Some(XdsStatus { code: 3, message: why.into(), details: vec![] }),
                ..Default::default()
            })
            .await
            .unwrap();
    }

    /// Nothing more arrives for a while.
    async fn quiet(&mut self) {
        if let Ok(m) = tokio::time::timeout(Duration::from_millis(300), self.rx.message()).await {
            panic!("expected nothing more, got {m:?}");
        }
    }
}

fn names(r: &DeltaDiscoveryResponse) -> Vec<String> {
    r.resources.iter().map(|r| r.name.clone()).collect()
}

fn uid(name: &str) -> String {
    format!("test//Pod/default/{name}")
}

fn fixture() -> (Vec<Workload>, Vec<Authorization>) {
    (vec![workload("a", [10, 0, 0, 1], "node1"), workload("b", [10, 0, 0, 2], "node2")], vec![policy("deny")])
}

async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wildcard_push_then_each_change_reaches_each_proxy_as_one_resource() {
    let (ws, ps) = fixture();
    let mut index = Index::new(&ws, &ps);
    let server = Server::start(index.store.clone(), ServeSettings::default()).await;
    let mut c1 = server.open(TOKEN1, "node1", both()).await.unwrap();
    let mut c2 = server.open(TOKEN2, "node2", both()).await.unwrap();
    for c in [&mut c1, &mut c2] {
        let first = c.initial().await;
        assert_eq!(names(&first[&TypeUrl::Address]), [uid("a"), uid("b")]);
        assert_eq!(names(&first[&TypeUrl::Authorization]), ["default/deny"]);
        let w = &first[&TypeUrl::Address].resources[0];
        assert_eq!(w.version, index.version(TypeUrl::Address, &uid("a")));
        let body = slipstream_api::workload::Address::decode(w.resource.as_ref().unwrap().value.as_slice()).unwrap();
        assert!(matches!(body.r#type, Some(slipstream_api::workload::address::Type::Workload(ref w)) if w.name == "a"));
        for r in first.values() {
            c.ack(r).await;
        }
    }

    // One changed workload: one response, one resource, to each proxy.
    let mut a = ws[0].clone();
    a.addresses = vec![[10, 0, 0, 9].into()];
    let generation = index.upsert(&a);
    for c in [&mut c1, &mut c2] {
        let r = c.recv().await;
        assert_eq!(r.type_url, TypeUrl::Address.as_str());
        assert_eq!(names(&r), [uid("a")]);
        assert!(r.removed_resources.is_empty());
        c.ack(&r).await;
        c.quiet().await;
    }
    server.xds.registry().wait_acked(generation, WAIT).await.expect("both ACKed");

    // A removal: removed_resources, nothing else.
    index.remove(TypeUrl::Authorization, "default/deny");
    for c in [&mut c1, &mut c2] {
        let r = c.recv().await;
        assert_eq!(r.type_url, TypeUrl::Authorization.as_str());
        assert!(r.resources.is_empty());
        assert_eq!(r.removed_resources, ["default/deny"]);
        c.ack(&r).await;
    }

    // What proxy-status reads.
    let reg = server.xds.registry().clone();
    wait_for("both in sync", || reg.proxies().iter().all(|p| p.in_sync() && p.acked_generation == 2)).await;
    let status = serde_json::to_value(reg.proxies()).unwrap();
    let p1 = status.as_array().unwrap().iter().find(|p| p["node"] == "node1").unwrap();
    assert_eq!(p1["caller"], "node-token:node1");
    assert!(p1["id"].as_str().unwrap().starts_with("ztunnel~127.0.0.1~"));
    assert!(p1["peer"].as_str().unwrap().starts_with("127.0.0.1:"));
    assert_eq!(p1["ackedGeneration"], 2);
    let types = p1["types"].as_array().unwrap();
    assert_eq!(types[0]["type"], "Address");
    assert_eq!(types[0]["resources"], 2);
    assert_eq!(types[0]["inSync"], true);
    assert_eq!(types[1]["type"], "Authorization");
    assert_eq!(types[1]["resources"], 0);
    assert_eq!(types[1]["sentNonce"], types[1]["ackedNonce"]);
}

/// Log lines, captured.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.locked().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.locked()).into_owned()
    }
}

// One thread: the log subscriber set for the test sees the stream tasks too.
#[tokio::test(flavor = "current_thread")]
async fn a_nack_is_logged_and_not_resent_until_the_resource_changes() {
    let lines = Lines::default();
    let writer = lines.clone();
    let _log = tracing::subscriber::set_default(
        tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).with_max_level(tracing::Level::INFO).finish(),
    );
    let (ws, ps) = fixture();
    let mut index = Index::new(&ws, &ps);
    let server = Server::start(index.store.clone(), ServeSettings::default()).await;
    let mut c = server.open(TOKEN1, "node1", both()).await.unwrap();
    for r in c.initial().await.values() {
        c.ack(r).await;
    }
    let mut a = ws[0].clone();
    a.canonical_revision = "refused".into();
    index.upsert(&a);
    let r = c.recv().await;
    assert_eq!(names(&r), [uid("a")]);
    c.nack(&r, "workload test//Pod/default/a: addresses: refused by the test").await;
    let reg = server.xds.registry().clone();
    wait_for("the NACK recorded", || reg.proxies().first().is_some_and(|p| p.types[0].nacks == 1)).await;
    let p = &reg.proxies()[0];
    assert_eq!(p.types[0].last_nack, "workload test//Pod/default/a: addresses: refused by the test");
    assert!(!p.in_sync());
    let log = lines.text();
    let line = log.lines().find(|l| l.contains("NACK")).unwrap_or_else(|| panic!("no NACK line in {log}"));
    for want in ["node1", "Address", &r.nonce, "refused by the test"] {
        assert!(line.contains(want), "{want:?} not in {line}");
    }

    // Another workload changes: only it comes, the refused one is not resent.
    let mut b = ws[1].clone();
    b.canonical_revision = "v2".into();
    index.upsert(&b);
    let r = c.recv().await;
    assert_eq!(names(&r), [uid("b")]);
    c.ack(&r).await;
    c.quiet().await;
    // The refused one changes: it is sent again.
    a.canonical_revision = "fixed".into();
    index.upsert(&a);
    let r = c.recv().await;
    assert_eq!(names(&r), [uid("a")]);
    assert_eq!(r.resources[0].version, index.version(TypeUrl::Address, &uid("a")));
    c.ack(&r).await;
    wait_for("in sync again", || reg.proxies()[0].in_sync()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnecting_proxy_is_sent_only_the_difference() {
    let (ws, ps) = fixture();
    let mut index = Index::new(&ws, &ps);
    let server = Server::start(index.store.clone(), ServeSettings::default()).await;
    let mut c = server.open(TOKEN1, "node1", both()).await.unwrap();
    let first = c.initial().await;
    let held =
        |t: TypeUrl| -> BTreeMap<String, String> { first[&t].resources.iter().map(|r| (r.name.clone(), r.version.clone())).collect() };
    let (addresses, policies) = (held(TypeUrl::Address), held(TypeUrl::Authorization));
    drop(c);
    let reg = server.xds.registry().clone();
    wait_for("the stream is gone", || reg.is_empty()).await;

    // Meanwhile: a changed, b removed, c added; the policy is unchanged.
    let mut a = ws[0].clone();
    a.canonical_name = "changed".into();
    index.upsert(&a);
    index.remove(TypeUrl::Address, &uid("b"));
    index.upsert(&workload("c", [10, 0, 0, 3], "node1"));

    let mut reqs = both();
    reqs[0].initial_resource_versions = addresses;
    reqs[1].initial_resource_versions = policies;
    let mut c = server.open(TOKEN1, "node1", reqs).await.unwrap();
    let again = c.initial().await;
    let r = &again[&TypeUrl::Address];
    assert_eq!(names(r), [uid("a"), uid("c")]);
    assert_eq!(r.removed_resources, [uid("b")]);
    let r = &again[&TypeUrl::Authorization];
    assert!(r.resources.is_empty() && r.removed_resources.is_empty(), "nothing changed: {r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_tokens_and_other_nodes_names_are_refused() {
    let (ws, ps) = fixture();
    let index = Index::new(&ws, &ps);
    let server = Server::start(index.store.clone(), ServeSettings::default()).await;
    let e = server.open("not-a-token-of-this-cluster", "node1", both()).await.err().expect("refused");
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    let e = server.open(TOKEN1, "node2", both()).await.err().expect("refused");
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("node1") && e.message().contains("NODE_NAME=node2"), "{}", e.message());
    // No NODE_NAME at all.
    let (tx, rx) = mpsc::channel(1);
    tx.send(DeltaDiscoveryRequest { node: Some(Node { id: "x".into(), ..Default::default() }), ..subscribe(TypeUrl::Address) })
        .await
        .unwrap();
    let mut req = tonic::Request::new(ReceiverStream::new(rx));
    req.metadata_mut().insert("authorization", format!("Bearer {TOKEN1}").parse().unwrap());
    let e = AggregatedDiscoveryServiceClient::new(server.channel().await).delta_aggregated_resources(req).await.expect_err("refused");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(server.xds.registry().is_empty());
    // The right one works.
    let mut c = server.open(TOKEN1, "node1", both()).await.unwrap();
    c.initial().await;
}

/// Reads until the server closes; panics if it does not within `within`.
async fn closed_by_server(s: &mut (impl tokio::io::AsyncRead + Unpin), within: Duration) {
    let mut buf = [0u8; 4096];
    let r = tokio::time::timeout(within, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(r.is_ok(), "the server did not close the connection within {within:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_plaintext_and_silent_clients_are_closed_and_good_ones_still_served() {
    let (ws, ps) = fixture();
    let index = Index::new(&ws, &ps);
    let settings = ServeSettings { max_connections: 3, handshake_timeout: Duration::from_secs(2), ..Default::default() };
    let server = Server::start(index.store.clone(), settings).await;

    let mut garbage = TcpStream::connect(server.addr).await.unwrap();
    garbage.write_all(&[0xde, 0xad, 0xbe, 0xef].repeat(64)).await.unwrap();
    closed_by_server(&mut garbage, WAIT).await;
    let mut http1 = TcpStream::connect(server.addr).await.unwrap();
    http1.write_all(b"GET /debug/syncz HTTP/1.1\r\nHost: istiod\r\n\r\n").await.unwrap();
    closed_by_server(&mut http1, WAIT).await;

    // Silent clients take slots until the handshake deadline; over the
    // bound, new connections are closed at once.
    let mut silent: Vec<TcpStream> = Vec::new();
    for _ in 0..3 {
        silent.push(TcpStream::connect(server.addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut over = TcpStream::connect(server.addr).await.unwrap();
    // At once: well before the handshake deadline.
    closed_by_server(&mut over, Duration::from_secs(1)).await;
    for s in &mut silent {
        closed_by_server(s, Duration::from_secs(5)).await;
    }

    let mut c = server.open(TOKEN1, "node1", both()).await.unwrap();
    assert_eq!(names(&c.initial().await[&TypeUrl::Address]), [uid("a"), uid("b")]);
}

/// A TLS connection to the server, verified as a proxy would, on which
/// nothing is sent.
async fn tls_only(server: &Server) -> tokio_rustls::client::TlsStream<TcpStream> {
    let mut tls = rustls::ClientConfig::builder_with_provider(slipstream_identity::tls::provider())
        .with_protocol_versions(slipstream_identity::tls::PROTOCOL_VERSIONS)
        .unwrap()
        .with_root_certificates(server.ca.roots().root_store())
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = TcpStream::connect(server.addr).await.unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(tls)).connect(rustls_pki_types::ServerName::try_from(SAN).unwrap(), tcp).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_address_has_its_share_of_connections_and_unauthenticated_ones_are_closed() {
    let (ws, ps) = fixture();
    let mut index = Index::new(&ws, &ps);
    let settings =
        ServeSettings { max_connections: 16, max_connections_per_peer: 3, auth_timeout: Duration::from_millis(500), ..Default::default() };
    let server = Server::start(index.store.clone(), settings).await;

    // An authenticated stream first: it outlives the deadline.
    let mut c = server.open(TOKEN1, "node1", both()).await.unwrap();
    c.initial().await;

    // 127.0.0.1 holds one (the stream's); two more, then it is full: its
    // next connection is closed at once, while another address connects.
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(TcpStream::connect(server.addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut over = TcpStream::connect(server.addr).await.unwrap();
    closed_by_server(&mut over, Duration::from_millis(400)).await;
    let other = tokio::net::TcpSocket::new_v4().unwrap();
    other.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let mut from_other = other.connect(server.addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut probe = [0u8; 1];
    let still_open = tokio::time::timeout(Duration::from_millis(100), from_other.read(&mut probe)).await.is_err();
    assert!(still_open, "another address is not bound by 127.0.0.1's share");
    drop((held, from_other));

    // A connection through TLS on which no call authenticates is closed at
    // the deadline; one with a refused token too.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut idle = tls_only(&server).await;
    let started = std::time::Instant::now();
    closed_by_server(&mut idle, WAIT).await;
    assert!(started.elapsed() >= Duration::from_millis(400), "closed before its deadline: {:?}", started.elapsed());
    // The same for a connection whose only call was refused: the channel
    // has to make a new one for its next call.
    let made = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut ads = AggregatedDiscoveryServiceClient::new(server.counted_channel(made.clone()).await);
    let call = |token: &str| {
        let mut req = tonic::Request::new(ReceiverStream::new(mpsc::channel(1).1));
        req.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
        req
    };
    let e = ads.delta_aggregated_resources(call("not-a-token-of-this-cluster")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    assert_eq!(made.load(std::sync::atomic::Ordering::SeqCst), 1);
    tokio::time::sleep(Duration::from_millis(800)).await;
    // (Authenticated, then refused for ending before its first request.)
    let e = ads.delta_aggregated_resources(call(TOKEN1)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert_eq!(made.load(std::sync::atomic::Ordering::SeqCst), 2, "the refused caller's connection was closed at its deadline");

    // The authenticated stream, past the deadline three times over, still
    // gets changes.
    assert!(tokio::time::timeout(Duration::from_millis(100), c.rx.message()).await.is_err(), "nothing was pending");
    index.upsert(&workload("a", [10, 0, 0, 9], "node1"));
    assert_eq!(names(&c.recv().await), [uid("a")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_waits_for_every_proxy_and_names_the_one_that_did_not_ack() {
    let (ws, ps) = fixture();
    let mut index = Index::new(&ws, &ps);
    let server = Server::start(index.store.clone(), ServeSettings::default()).await;
    let reg = server.xds.registry().clone();
    let mut c1 = server.open(TOKEN1, "node1", both()).await.unwrap();
    let mut c2 = server.open(TOKEN2, "node2", both()).await.unwrap();
    for c in [&mut c1, &mut c2] {
        for r in c.initial().await.values() {
            c.ack(r).await;
        }
    }
    reg.wait_acked(0, WAIT).await.expect("the initial state");

    let mut a = ws[0].clone();
    a.canonical_revision = "v2".into();
    let generation = index.upsert(&a);
    let r1 = c1.recv().await;
    let r2 = c2.recv().await;
    c1.ack(&r1).await;
    let e = reg.wait_acked(generation, Duration::from_millis(500)).await.expect_err("node2 did not ACK");
    assert_eq!(e.report.acked.len(), 1);
    assert_eq!(e.report.acked[0].node, "node1");
    assert_eq!(e.report.pending.len(), 1);
    assert_eq!(e.report.pending[0].0.node, "node2");
    let msg = e.to_string();
    assert!(
        msg.starts_with(&format!(
            "1 of 2 connected proxies did not acknowledge generation {generation} within 500ms: node2 (stream from 127.0.0.1:"
        )),
        "{msg}"
    );

    // node2 answers while someone waits.
    let waiter = {
        let reg = reg.clone();
        tokio::spawn(async move { reg.wait_acked(generation, WAIT).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    c2.ack(&r2).await;
    let report = waiter.await.unwrap().expect("both ACKed");
    assert_eq!(report.acked.len(), 2);
    assert!(report.refused.is_empty() && report.pending.is_empty());

    // A NACK answers too, and is reported as a refusal with its reason.
    a.canonical_revision = "v3".into();
    let generation = index.upsert(&a);
    let r1 = c1.recv().await;
    let r2 = c2.recv().await;
    c1.ack(&r1).await;
    c2.nack(&r2, "no thanks").await;
    let report = reg.wait_acked(generation, WAIT).await.unwrap();
    assert_eq!(report.refused.len(), 1);
    assert_eq!(report.refused[0].0.node, "node2");
    assert!(report.refused[0].1.contains("no thanks"), "{:?}", report.refused);

    // A proxy that goes away stops counting.
    let generation = index.upsert(&workload("z", [10, 0, 0, 26], "node1"));
    let r1 = c1.recv().await;
    c1.ack(&r1).await;
    drop(c2);
    let report = reg.wait_acked(generation, WAIT).await.expect("only node1 is left");
    assert_eq!(report.acked.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutting_down_ends_streams_with_unavailable() {
    let (ws, ps) = fixture();
    let index = Index::new(&ws, &ps);
    let mut server = Server::start(index.store.clone(), ServeSettings::default()).await;
    let mut c = server.open(TOKEN1, "node1", both()).await.unwrap();
    c.initial().await;
    let _ = server.stop.take().unwrap().send(());
    let e = tokio::time::timeout(WAIT, c.rx.message()).await.expect("ended in time").expect_err("an error status");
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    let reg = server.xds.registry().clone();
    wait_for("the stream unregistered", || reg.is_empty()).await;
}

/// Large responses take turns (a hundred proxies connecting together are
/// not a hundred first pushes in memory at once). With one slot and every
/// response counted large: a second proxy's first push waits while the
/// first proxy has not answered its own and goes as soon as it has; a
/// proxy that never answers holds the slot only for the hold time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_responses_take_turns_and_a_silent_proxy_holds_its_turn_only_so_long() {
    let (ws, ps) = fixture();
    let index = Index::new(&ws, &ps);
    let hold = Duration::from_secs(2);
    let xs = XdsSettings { large_responses_in_flight: 1, large_response_bytes: 1, large_response_hold: hold, ..Default::default() };
    let server = Server::start_with(index.store.clone(), ServeSettings::default(), xs).await;

    let mut c1 = server.open(TOKEN1, "node1", both()).await.unwrap();
    let first1 = c1.initial().await;
    assert_eq!(names(&first1[&TypeUrl::Address]).len(), 2);

    // c1 holds the slot: c2 gets nothing yet.
    let mut c2 = server.open(TOKEN2, "node2", both()).await.unwrap();
    c2.quiet().await;
    // c1 answers: c2's turn.
    for r in first1.values() {
        c1.ack(r).await;
    }
    let first2 = c2.initial().await;
    assert_eq!(names(&first2[&TypeUrl::Address]).len(), 2);

    // c2 never answers: c3 waits for the hold time, not forever.
    let waiting = std::time::Instant::now();
    let mut c3 = server.open(TOKEN1, "node1", both()).await.unwrap();
    let first3 = c3.initial().await;
    let waited = waiting.elapsed();
    assert!(waited >= hold - Duration::from_millis(300), "c3 got its first push after {waited:?}, before c2's hold of {hold:?} ran out");
    assert_eq!(first3[&TypeUrl::Address].resources, first2[&TypeUrl::Address].resources, "the same push");
}
