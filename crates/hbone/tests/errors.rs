//! Refusals and failures: each answer code, identity and TLS failures,
//! garbage on the port, oversized headers, keepalive.

mod common;

use slipstream_core::sync::LockExt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use futures_util::future::BoxFuture;
use http::{Method, Request, StatusCode};
use slipstream_core::{SpiffeId, TrustDomain};
use slipstream_hbone::{CertSource, ConnectRequest, H2Config, HboneError, PlainConnector, Pool, PoolConfig, ResponseFlag, ServerConfig};
use slipstream_identity::{Ca, FetchError, WorkloadCert};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn status_of(pool: &Pool, k: &slipstream_hbone::PoolKey, target: SocketAddr) -> HboneError {
    pool.connect(k, ConnectRequest::new(target)).await.expect_err("the CONNECT must be refused")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_refusal_has_its_code() {
    let mesh = Mesh::new();
    let (client, server_id) = (id("sleep"), id("httpbin"));
    let server = start_server(&mesh, &server_id, ServerConfig::default()).await;
    server.handler.set(1001, Behavior::Deny);
    server.handler.set(1002, Behavior::NoWorkload);
    server.handler.set(1003, Behavior::ConnectRefused);
    let pool = mesh.pool(PoolConfig::default());
    let k = key(&client, std::slice::from_ref(&server_id), server.addr);
    let at = |ip: &str, port: u16| SocketAddr::new(ip.parse().unwrap(), port);

    let cases = [
        // The authority names another IP than the tunnel arrived on.
        (at("127.0.0.2", 8080), StatusCode::BAD_REQUEST, ResponseFlag::ProtocolError),
        // The proxy's own ports.
        (at("127.0.0.1", 15008), StatusCode::SERVICE_UNAVAILABLE, ResponseFlag::Connect),
        (at("127.0.0.1", 15001), StatusCode::SERVICE_UNAVAILABLE, ResponseFlag::Connect),
        // The handler's answers.
        (at("127.0.0.1", 1001), StatusCode::UNAUTHORIZED, ResponseFlag::Deny),
        (at("127.0.0.1", 1002), StatusCode::SERVICE_UNAVAILABLE, ResponseFlag::Connect),
        (at("127.0.0.1", 1003), StatusCode::SERVICE_UNAVAILABLE, ResponseFlag::Connect),
    ];
    for (target, code, flag) in cases {
        let err = status_of(&pool, &k, target).await;
        match &err {
            HboneError::Status(got) => assert_eq!(*got, code, "{target}"),
            other => panic!("{target}: expected status {code}, got {other}"),
        }
        assert_eq!(err.flag(), flag, "{target}");
    }
    // Refusals reach the handler only from the check that needs it.
    let asked: Vec<u16> = server.handler.requests.locked().iter().map(|r| r.target.port()).collect();
    assert_eq!(asked, vec![1001, 1002, 1003]);

    let stats = server.stats.snapshot();
    assert_eq!(stats.status_400, 1);
    assert_eq!(stats.status_401, 1);
    assert_eq!(stats.status_503, 4);
    assert_eq!(stats.status_200, 0);
    assert_eq!(stats.connections_accepted, 1, "refusals do not break the connection");

    let records = server.handler.wait_records(6).await;
    let denied = records.iter().find(|r| r.status == StatusCode::UNAUTHORIZED).unwrap();
    assert!(matches!(denied.result, Err(HboneError::Denied(_))));
    assert_eq!(denied.peer_identity, client);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waypoint_accepts_a_foreign_authority() {
    let mesh = Mesh::new();
    let (client, waypoint) = (id("sleep"), id("waypoint"));
    let server = start_server(&mesh, &waypoint, ServerConfig::default()).await;
    let vip: SocketAddr = "10.96.0.10:80".parse().unwrap();
    *server.handler.waypoint_for.locked() = Some(vip);
    let pool = mesh.pool(PoolConfig::default());
    let mut tunnel = pool.connect(&key(&client, &[waypoint], server.addr), ConnectRequest::new(vip)).await.unwrap();
    tunnel.shutdown().await.unwrap();
    read_all(&mut tunnel).await.unwrap();
    assert_eq!(server.handler.requests.locked()[0].target, vip);
}

/// Requests the pool never sends, through a bare h2 client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_400_with_end_stream() {
    let mesh = Mesh::new();
    let (client, server_id) = (id("sleep"), id("httpbin"));
    let server = start_server(&mesh, &server_id, ServerConfig::default()).await;
    let mut h2 = raw_h2(&mesh, &client, server.addr, &server_id).await;

    // Not CONNECT.
    let get = Request::builder().method(Method::GET).uri(format!("https://{}/", server.addr)).body(()).unwrap();
    h2 = h2.ready().await.unwrap();
    let (response, _body) = h2.send_request(get, true).unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert!(response.body().is_end_stream(), "HEADERS carried END_STREAM");
    // The server's SETTINGS arrived by now: it allows 200 concurrent streams.
    assert_eq!(h2.current_max_send_streams(), 200);

    // CONNECT to a host name instead of an address.
    let by_name = Request::builder().method(Method::CONNECT).uri("example.com:80").body(()).unwrap();
    h2 = h2.ready().await.unwrap();
    let (response, _body) = h2.send_request(by_name, false).unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert!(response.body().is_end_stream());

    // A CONNECT without a port.
    let no_port = Request::builder().method(Method::CONNECT).uri("127.0.0.1").body(()).unwrap();
    h2 = h2.ready().await.unwrap();
    let (response, _body) = h2.send_request(no_port, false).unwrap();
    assert_eq!(response.await.unwrap().status(), StatusCode::BAD_REQUEST);

    assert_eq!(server.stats.snapshot().status_400, 3);
    assert!(server.handler.requests.locked().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_server_identity_is_an_identity_error() {
    let mesh = Mesh::new();
    let (client, server_id) = (id("sleep"), id("httpbin"));
    let server = start_server(&mesh, &server_id, ServerConfig::default()).await;
    let pool = mesh.pool(PoolConfig::default());
    let expected = id("reviews");
    let err = pool
        .connect(&key(&client, std::slice::from_ref(&expected), server.addr), ConnectRequest::new(SocketAddr::new(LOCALHOST, 80)))
        .await
        .unwrap_err();
    match &err {
        HboneError::IdentityMismatch { mismatch, .. } => {
            assert_eq!(mismatch.expected, vec![expected]);
            assert_eq!(mismatch.presented, vec![server_id]);
        }
        other => panic!("expected an identity mismatch, got {other}"),
    }
    assert_eq!(err.flag(), ResponseFlag::IdentityError);
    assert_eq!(pool.connection_count(), 0);
}

/// Presents a certificate from a foreign CA while trusting the mesh roots,
/// so only the server can refuse.
struct ForeignCerts {
    cert: Arc<WorkloadCert>,
}

impl CertSource for ForeignCerts {
    fn fetch<'a>(&'a self, _id: &'a SpiffeId) -> BoxFuture<'a, Result<Arc<WorkloadCert>, FetchError>> {
        Box::pin(async move { Ok(self.cert.clone()) })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificate_from_another_ca_is_rejected() {
    let mesh = Mesh::new();
    let (client, server_id) = (id("sleep"), id("httpbin"));
    let server = start_server(&mesh, &server_id, ServerConfig::default()).await;

    let other = Ca::generate(&TrustDomain::default()).unwrap();
    let stranger = other.issue(&client, Duration::from_secs(600)).unwrap();
    let cert = WorkloadCert::new(stranger.chain().to_vec(), mesh.ca.roots().clone(), stranger.key().clone()).unwrap();
    let pool = Pool::new(PoolConfig::default(), Arc::new(ForeignCerts { cert: Arc::new(cert) }), Arc::new(PlainConnector));
    let err =
        pool.connect(&key(&client, &[server_id], server.addr), ConnectRequest::new(SocketAddr::new(LOCALHOST, 80))).await.unwrap_err();
    assert!(matches!(err, HboneError::Tls { .. }), "got {err}");
    assert_eq!(err.flag(), ResponseFlag::TlsFailure);
    server.handler.wait_handshake_failures(1).await;
    let stats = server.stats.snapshot();
    assert_eq!(stats.tls_failures, 1);
    assert_eq!(stats.streams, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_local_workload_refuses_the_handshake() {
    let mesh = Mesh::new();
    let client = id("sleep");
    // The server's only workload lives on another address.
    let server =
        start_server_on(&mesh, "127.0.0.1:0".parse().unwrap(), &[("127.0.0.9".parse().unwrap(), id("elsewhere"))], ServerConfig::default())
            .await;
    let pool = mesh.pool(PoolConfig::default());
    let err =
        pool.connect(&key(&client, &[id("httpbin")], server.addr), ConnectRequest::new(SocketAddr::new(LOCALHOST, 80))).await.unwrap_err();
    assert!(matches!(err, HboneError::Tls { .. }), "got {err}");
    server.handler.wait_handshake_failures(1).await;
    let stats = server.stats.snapshot();
    assert_eq!(stats.refused_no_workload, 1);
    assert_eq!(stats.tls_failures, 0, "counted as a refusal, not a failure");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_plain_tcp_are_dropped_and_the_server_keeps_serving() {
    let mesh = Mesh::new();
    let (client, server_id) = (id("sleep"), id("httpbin"));
    let config = ServerConfig { handshake_timeout: Duration::from_millis(500), ..Default::default() };
    let server = start_server(&mesh, &server_id, config).await;

    // Plain HTTP/1.1.
    let mut tcp = TcpStream::connect(server.addr).await.unwrap();
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), tcp.read_to_end(&mut buf)).await.expect("closed promptly");
    assert!(!buf.starts_with(b"HTTP/"), "never answered in plaintext");

    // Random bytes.
    let mut tcp = TcpStream::connect(server.addr).await.unwrap();
    tcp.write_all(&pattern(4096, 3)).await.unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(2), tcp.read_to_end(&mut Vec::new())).await.expect("closed promptly");

    // Connect and close at once; connect and say nothing.
    drop(TcpStream::connect(server.addr).await.unwrap());
    let mut silent = TcpStream::connect(server.addr).await.unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(2), silent.read_to_end(&mut Vec::new()))
        .await
        .expect("a silent client is dropped after the handshake timeout");

    // The HTTP/2 preface in plaintext (h2c prior knowledge) is refused too.
    let mut h2c = TcpStream::connect(server.addr).await.unwrap();
    h2c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(2), h2c.read_to_end(&mut Vec::new())).await.expect("closed promptly");

    server.handler.wait_handshake_failures(5).await;
    assert_eq!(server.stats.snapshot().tls_failures, 5);

    // Still serving.
    let pool = mesh.pool(PoolConfig::default());
    let mut tunnel =
        pool.connect(&key(&client, &[server_id], server.addr), ConnectRequest::new(SocketAddr::new(LOCALHOST, 80))).await.unwrap();
    tunnel.write_all(b"still here").await.unwrap();
    tunnel.shutdown().await.unwrap();
    assert_eq!(read_all(&mut tunnel).await.unwrap(), b"still here");
}

/// The server takes a request header list of up to 64 KiB, as ztunnel does:
/// 60 KiB reaches the handler whole; over 64 KiB, h2 itself answers 431
/// before the request reaches our checks, and the connection lives on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_lists_up_to_64_kib_are_accepted_and_larger_ones_refused_cleanly() {
    let mesh = Mesh::new();
    let (client, server_id) = (id("sleep"), id("httpbin"));
    let server = start_server(&mesh, &server_id, ServerConfig::default()).await;
    let pool = mesh.pool(PoolConfig::default());
    let k = key(&client, &[server_id], server.addr);
    let padding = http::HeaderName::from_static("x-padding");
    let padded = |bytes: usize| {
        let value = http::HeaderValue::from_str(&"x".repeat(bytes)).unwrap();
        ConnectRequest::new(SocketAddr::new(LOCALHOST, 80)).with_header(padding.clone(), value)
    };

    // 60 KiB of one header, plus the rest of the request: under the limit.
    let mut tunnel = pool.connect(&k, padded(60 * 1024)).await.expect("a 60 KiB header list is accepted");
    tunnel.write_all(b"through").await.unwrap();
    tunnel.shutdown().await.unwrap();
    assert_eq!(read_all(&mut tunnel).await.unwrap(), b"through");
    {
        let requests = server.handler.requests.locked();
        assert_eq!(requests.len(), 1);
        assert_eq!(requests[0].headers[&padding].len(), 60 * 1024, "the header arrives whole");
    }

    // A 64 KiB value alone puts the list over 64 KiB (each field also
    // counts its name and 32 bytes).
    let err = pool.connect(&k, padded(64 * 1024)).await.unwrap_err();
    assert!(matches!(err, HboneError::Status(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)), "got {err}");
    assert_eq!(server.handler.requests.locked().len(), 1, "the refused request never reached the handler");

    // The connection survives and serves the next tunnel.
    let mut tunnel = pool.connect(&k, ConnectRequest::new(SocketAddr::new(LOCALHOST, 80))).await.unwrap();
    tunnel.shutdown().await.unwrap();
    read_all(&mut tunnel).await.unwrap();
    let stats = server.stats.snapshot();
    assert_eq!(stats.connections_accepted, 1);
    assert_eq!(stats.protocol_errors, 0);
}

/// Four times over the limit, h2 ends the whole connection with GOAWAY
/// ENHANCE_YOUR_CALM (a header list too large to decode, or, when the block
/// came in 16 KiB frames before our SETTINGS reached the client, too many
/// CONTINUATION frames); the server counts a protocol error. The client
/// may still be writing the block then, and see a broken pipe instead of
/// the GOAWAY.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_lists_far_over_the_limit_end_the_connection() {
    let mesh = Mesh::new();
    let (client, server_id) = (id("sleep"), id("httpbin"));
    let server = start_server(&mesh, &server_id, ServerConfig::default()).await;
    let pool = mesh.pool(PoolConfig::default());
    let k = key(&client, &[server_id], server.addr);
    let value = http::HeaderValue::from_str(&"a".repeat(260 * 1024)).unwrap();
    let request = ConnectRequest::new(SocketAddr::new(LOCALHOST, 80)).with_header(http::HeaderName::from_static("x-padding"), value);
    let err = pool.connect(&k, request).await.unwrap_err();
    match &err {
        HboneError::H2(e) => assert!(matches!(e.reason(), Some(h2::Reason::ENHANCE_YOUR_CALM) | None), "got {err}"),
        other => panic!("expected the connection to end, got {other}"),
    }
    assert_eq!(err.flag(), ResponseFlag::ProtocolError);
    assert!(server.handler.requests.locked().is_empty());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while server.stats.snapshot().protocol_errors == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(server.stats.snapshot().protocol_errors, 1);
}

fn fast_keepalive() -> H2Config {
    H2Config { keepalive_interval: Duration::from_millis(100), keepalive_timeout: Duration::from_millis(300), ..Default::default() }
}

/// A client that completes TLS and the HTTP/2 preface, then never reads:
/// its PING answers never come, and the server drops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_drops_a_peer_that_does_not_answer_pings() {
    let mesh = Mesh::new();
    let (client, server_id) = (id("sleep"), id("httpbin"));
    let config = ServerConfig { h2: fast_keepalive(), ..Default::default() };
    let server = start_server(&mesh, &server_id, config).await;

    let cert = mesh.cert(&client).await;
    let tls_config = slipstream_identity::tls::client_config(&cert, cert.roots(), &[server_id]).unwrap();
    let tcp = TcpStream::connect(server.addr).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(tls_config)
        .connect(rustls_pki_types::ServerName::IpAddress(server.addr.ip().into()), tcp)
        .await
        .unwrap();
    tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
    tls.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap(); // empty SETTINGS
    tls.flush().await.unwrap();

    // Within 1 s: a PING every 100 ms, 300 ms to answer it.
    wait_until_async("the server to give up on the unanswered PINGs", Duration::from_secs(1), || {
        server.stats.snapshot().keepalive_timeouts >= 1
    })
    .await;
    assert_eq!(server.stats.snapshot().keepalive_timeouts, 1);
    // Everything the server sent, then the end.
    let closed = tokio::time::timeout(Duration::from_secs(2), tls.read_to_end(&mut Vec::new())).await;
    assert!(closed.is_ok(), "connection closed by the server");
}

/// The pool's side: a server that accepts HTTP/2 but never answers PINGs
/// (nor anything else) makes the connection drop and the CONNECT fail fast.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_drops_a_peer_that_does_not_answer_pings() {
    let mesh = Mesh::new();
    let (client, server_id) = (id("sleep"), id("httpbin"));
    let server_cert = mesh.cert(&server_id).await;
    let config = mesh.server_tls().config_for(&server_cert).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut tls = tokio_rustls::TlsAcceptor::from(config).accept(tcp).await.unwrap();
        tls.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
        let mut sink = vec![0u8; 65536];
        // Read and ignore everything, answer nothing.
        while tls.read(&mut sink).await.is_ok_and(|n| n > 0) {}
    });

    let pool = mesh.pool(PoolConfig { h2: fast_keepalive(), response_timeout: Duration::from_secs(30), ..Default::default() });
    let started = tokio::time::Instant::now();
    let err = pool.connect(&key(&client, &[server_id], addr), ConnectRequest::new(SocketAddr::new(LOCALHOST, 80))).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(3), "failed by keepalive, not by the response timeout");
    assert!(!matches!(err, HboneError::Timeout(_)), "got {err}");
    wait_until_async("the pool to drop the dead connection", WAIT, || pool.connection_count() == 0).await;
    assert_eq!(pool.connection_count(), 0);
}

#[test]
fn error_classes() {
    let io = || Arc::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
    let addr: SocketAddr = "10.0.0.1:15008".parse().unwrap();
    let connect = HboneError::Connect { addr, source: io() };
    assert_eq!(connect.flag().as_str(), "CONNECT");
    assert_eq!(connect.response_code(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(HboneError::denied("x").response_code(), StatusCode::UNAUTHORIZED);
    assert_eq!(HboneError::denied("x").flag().as_str(), "DENY");
    assert_eq!(HboneError::BadRequest("x").response_code(), StatusCode::BAD_REQUEST);
    assert_eq!(HboneError::ProxyPort(15008).response_code(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(HboneError::Status(StatusCode::UNAUTHORIZED).flag(), ResponseFlag::Deny);
    assert_eq!(HboneError::Status(StatusCode::SERVICE_UNAVAILABLE).flag(), ResponseFlag::Connect);
    assert_eq!(ResponseFlag::None.as_str(), "-");
    let _ = Bytes::new();
}
