//! Tunnels over real loopback TCP and real TLS: bytes, half-close, what the
//! server sees, flow control.

mod common;

use slipstream_core::sync::LockExt;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use http::StatusCode;
use slipstream_hbone::headers::{Baggage, Forwarded, TraceParent, WorkloadKind};
use slipstream_hbone::{ConnectRequest, PoolConfig, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

const TEN_MIB: usize = 10 * 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_with_client_half_close_first() {
    let mesh = Mesh::new();
    let (client, server_id) = (id("sleep"), id("httpbin"));
    let server = start_server(&mesh, &server_id, ServerConfig::default()).await;
    let pool = mesh.pool(PoolConfig::default());
    let k = key(&client, std::slice::from_ref(&server_id), server.addr);

    for (i, size) in [1usize, TEN_MIB].into_iter().enumerate() {
        let tunnel = pool.connect(&k, ConnectRequest::new(SocketAddr::new(LOCALHOST, 8080))).await.unwrap();
        let (mut rx, mut tx) = tunnel.into_split();
        let data = pattern(size, i as u8);
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            tx.write_all(&sent).await.unwrap();
            // Half-close: the echo server sees EOF, echoes the rest and
            // closes its side; our read side stays open until then.
            tx.shutdown().await.unwrap();
            tx
        });
        let echoed = read_all(&mut rx).await.unwrap();
        assert_eq!(echoed.len(), size);
        assert!(echoed == data, "echo of {size} bytes is intact");
        drop(writer.await.unwrap());
    }

    let records = server.handler.wait_records(2).await;
    for (record, size) in records.iter().zip([1u64, TEN_MIB as u64]) {
        assert_eq!(record.status, StatusCode::OK);
        assert!(record.result.is_ok(), "{:?}", record.result);
        assert_eq!(record.bytes.from_tunnel, size);
        assert_eq!(record.bytes.to_tunnel, size);
        assert_eq!(record.peer_identity, client);
    }
    let stats = server.stats.snapshot();
    assert_eq!(stats.status_200, 2);
    assert_eq!(stats.bytes_from_peer, 1 + TEN_MIB as u64);
    assert_eq!(stats.connections_accepted, 1, "both tunnels shared one connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_with_server_half_close_first() {
    let mesh = Mesh::new();
    let (client, server_id) = (id("sleep"), id("httpbin"));
    let server = start_server(&mesh, &server_id, ServerConfig::default()).await;
    let pool = mesh.pool(PoolConfig::default());
    let k = key(&client, std::slice::from_ref(&server_id), server.addr);

    for (port, size) in [(9001u16, 1usize), (9002, TEN_MIB)] {
        server.handler.set(port, Behavior::Greet(size));
        let mut tunnel = pool.connect(&k, ConnectRequest::new(SocketAddr::new(LOCALHOST, port))).await.unwrap();
        // The application speaks first and half-closes: we read to EOF
        // while our own write side is still open...
        let greeting = read_all(&mut tunnel).await.unwrap();
        assert!(greeting == pattern(size, 7), "greeting of {size} bytes intact");
        // ...and can still send, then half-close ourselves.
        tunnel.write_all(&pattern(size, 9)).await.unwrap();
        tunnel.shutdown().await.unwrap();
        let mut rest = Vec::new();
        assert_eq!(tunnel.read_to_end(&mut rest).await.unwrap(), 0);
    }
    let records = server.handler.wait_records(2).await;
    assert!(records.iter().all(|r| r.result.is_ok()));
    let mut got = server.handler.wait_greet_results(2).await;
    got.sort();
    assert_eq!(got, vec![1, TEN_MIB as u64]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_sees_identity_target_and_headers() {
    let mesh = Mesh::new();
    let (client, server_id) = (id("productpage"), id("reviews"));
    let server = start_server(&mesh, &server_id, ServerConfig::default()).await;
    let pool = mesh.pool(PoolConfig::default());

    let trace = TraceParent::random();
    let baggage = Baggage {
        cluster_name: "Kubernetes".into(),
        namespace: "default".into(),
        workload: Some((WorkloadKind::Deployment, "productpage-v1".into())),
        service_name: "productpage".into(),
        service_version: "v1".into(),
    };
    let app = SocketAddr::new(LOCALHOST, 43210);
    let forwarded = Forwarded::new(app, Some("reviews.default.svc.cluster.local".into()));
    let target = SocketAddr::new(LOCALHOST, 9080);
    let request = ConnectRequest::new(target).with_baggage(&baggage).with_forwarded(&forwarded).with_traceparent(trace);
    let mut tunnel = pool.connect(&key(&client, std::slice::from_ref(&server_id), server.addr), request).await.unwrap();
    tunnel.shutdown().await.unwrap();
    read_all(&mut tunnel).await.unwrap();

    let seen = server.handler.requests.locked()[0].clone();
    assert_eq!(seen.peer_identity, client);
    assert_eq!(seen.peer_addr.ip(), LOCALHOST);
    assert_eq!(seen.tunnel_local, server.addr);
    assert_eq!(seen.target, target);
    let h = &seen.headers;
    assert_eq!(h["traceparent"], trace.to_string());
    assert_eq!(h["forwarded"], "for=\"127.0.0.1:43210\";host=reviews.default.svc.cluster.local");
    assert_eq!(Baggage::parse(h["baggage"].to_str().unwrap()), baggage);
    assert_eq!(h.len(), 3, "no other headers: {h:?}");
}

/// The pool against a bare h2 server: what arrives on the wire. h2's server
/// turns the pseudo-headers into the request and refuses a CONNECT that has
/// `:scheme`, `:path` or (unless enabled, as here) `:protocol`, so a request
/// seen with method CONNECT, an authority and no scheme/path carried exactly
/// `:method` and `:authority`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_carries_only_method_and_authority() {
    let mesh = Mesh::new();
    let (client, server_id) = (id("sleep"), id("httpbin"));
    let server_cert = mesh.cert(&server_id).await;
    let config = mesh.server_tls().config_for(&server_cert).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen_tx, seen_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let tls = TlsAcceptor::from(config).accept(tcp).await.unwrap();
        let mut conn = h2::server::handshake(tls).await.unwrap();
        let (request, mut respond) = conn.accept().await.unwrap().unwrap();
        let _ = seen_tx.send(request.into_parts().0);
        let _send = respond.send_response(http::Response::new(()), false).unwrap();
        while conn.accept().await.is_some() {}
    });

    let pool = mesh.pool(PoolConfig::default());
    let target: SocketAddr = "[fd00::1]:8080".parse().unwrap();
    let _tunnel = pool.connect(&key(&client, &[server_id], addr), ConnectRequest::new(target).with_fresh_traceparent()).await.unwrap();
    let parts = seen_rx.await.unwrap();
    assert_eq!(parts.method, http::Method::CONNECT);
    assert_eq!(parts.uri.scheme(), None, ":scheme absent");
    assert_eq!(parts.uri.path_and_query(), None, ":path absent");
    assert_eq!(parts.uri.authority().unwrap().as_str(), "[fd00::1]:8080");
    assert_eq!(parts.version, http::Version::HTTP_2);
    assert!(parts.extensions.get::<h2::ext::Protocol>().is_none(), "no :protocol");
    let names: Vec<_> = parts.headers.keys().map(|k| k.as_str()).collect();
    assert_eq!(names, vec!["traceparent"], "no host or other header");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_tunnel() {
    let mesh = Mesh::new();
    let (client, server_id) = (id("sleep"), id("httpbin"));
    let v6: std::net::IpAddr = "::1".parse().unwrap();
    let server = start_server_on(&mesh, "[::1]:0".parse().unwrap(), &[(v6, server_id.clone())], ServerConfig::default()).await;
    let pool = mesh.pool(PoolConfig::default());
    let target = SocketAddr::new(v6, 8080);
    let mut tunnel = pool.connect(&key(&client, &[server_id], server.addr), ConnectRequest::new(target)).await.unwrap();
    tunnel.write_all(b"hello over v6").await.unwrap();
    tunnel.shutdown().await.unwrap();
    assert_eq!(read_all(&mut tunnel).await.unwrap(), b"hello over v6");
    assert_eq!(server.handler.requests.locked()[0].target, target);
}

/// A destination application that never reads: the client's writes must
/// stall at about one stream window instead of piling up in the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_reader_on_server_blocks_the_client_writer() {
    let mesh = Mesh::new();
    let (client, server_id) = (id("sleep"), id("httpbin"));
    let server = start_server(&mesh, &server_id, ServerConfig::default()).await;
    server.handler.set(7000, Behavior::Sink);
    let pool = mesh.pool(PoolConfig::default());
    let mut tunnel =
        pool.connect(&key(&client, &[server_id], server.addr), ConnectRequest::new(SocketAddr::new(LOCALHOST, 7000))).await.unwrap();

    let chunk = vec![1u8; 1024 * 1024];
    let mut written = 0usize;
    let attempt = tokio::time::timeout(Duration::from_secs(2), async {
        while written < 64 * 1024 * 1024 {
            written += tunnel.write(&chunk).await.unwrap();
        }
    })
    .await;
    assert!(attempt.is_err(), "the writer must block, it wrote {written} bytes");
    // One 4 MiB stream window, plus what sits in the copy loop and the
    // application's socket buffer.
    assert!(written >= 1024 * 1024, "made progress: {written}");
    assert!(written <= 6 * 1024 * 1024, "bounded by flow control: {written}");
}

/// A client that never reads: the server's copy from the application must
/// stall instead of buffering the flood.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_reader_on_client_blocks_the_application() {
    let mesh = Mesh::new();
    let (client, server_id) = (id("sleep"), id("httpbin"));
    let server = start_server(&mesh, &server_id, ServerConfig::default()).await;
    server.handler.set(7001, Behavior::Flood);
    let pool = mesh.pool(PoolConfig::default());
    let tunnel =
        pool.connect(&key(&client, &[server_id], server.addr), ConnectRequest::new(SocketAddr::new(LOCALHOST, 7001))).await.unwrap();
    // The flood fills every window and buffer, then its writes stop: wait
    // until it has not moved for 500 ms (without flow control it never stops).
    let written = || server.handler.flood_written.load(Ordering::Relaxed);
    let mut last = (written(), tokio::time::Instant::now());
    wait_until_async("the flooding application to be held back", WAIT, || {
        let now = written();
        if now != last.0 {
            last = (now, tokio::time::Instant::now());
        }
        now > 0 && last.1.elapsed() >= Duration::from_millis(500)
    })
    .await;
    let first = written();
    // Not synchronization: the window in which a blocked application must
    // NOT write anything more.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let second = written();
    assert_eq!(first, second, "the application is blocked");
    assert!(first >= 1024 * 1024, "made progress: {first}");
    assert!(first <= 8 * 1024 * 1024, "bounded by flow control: {first}");
    drop(tunnel);
}

/// Waits for the client of the stream to `port` to say it has done `what`.
async fn heard(client: &mut tokio::sync::mpsc::UnboundedReceiver<&'static str>, port: u16, what: &'static str) {
    let got =
        tokio::time::timeout(WAIT, client.recv()).await.unwrap_or_else(|_| panic!("port {port}: the client never said it had {what}"));
    assert_eq!(got, Some(what), "port {port}");
}

/// How the client reads the ways a peer can end a stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resets_read_as_eof_or_error_by_reason() {
    let mesh = Mesh::new();
    let (client, server_id) = (id("sleep"), id("httpbin"));
    let server_cert = mesh.cert(&server_id).await;
    let config = mesh.server_tls().config_for(&server_cert).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // The client tells the server when it has read "hi" and when it has
    // read to the end; one stream at a time.
    let (client_says, server_hears) = tokio::sync::mpsc::unbounded_channel::<&'static str>();
    let server_hears = std::sync::Arc::new(tokio::sync::Mutex::new(server_hears));
    // A bare h2 server: answers 200, sends "hi", then ends the stream the
    // way the target port says.
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let tls = TlsAcceptor::from(config).accept(tcp).await.unwrap();
        let mut conn = h2::server::handshake(tls).await.unwrap();
        while let Some(Ok((request, mut respond))) = conn.accept().await {
            let port = request.uri().port_u16().unwrap();
            let client = server_hears.clone();
            tokio::spawn(async move {
                let mut client = client.lock().await;
                let mut send = respond.send_response(http::Response::new(()), false).unwrap();
                send.send_data(bytes::Bytes::from_static(b"hi"), port == 4).unwrap();
                // The DATA frame must be out before the reset discards queues.
                heard(&mut client, port, "read hi").await;
                match port {
                    1 => send.send_reset(h2::Reason::NO_ERROR),
                    2 => send.send_reset(h2::Reason::CANCEL),
                    3 => send.send_reset(h2::Reason::INTERNAL_ERROR),
                    _ => {} // 4: END_STREAM was on the DATA frame
                }
                // The stream stays until the client has seen how it ended.
                heard(&mut client, port, "read to the end").await;
                drop(request);
            });
        }
    });

    let pool = mesh.pool(PoolConfig::default());
    let k = key(&client, &[server_id], addr);
    for (port, eof) in [(1u16, true), (2, true), (3, false), (4, true)] {
        let mut tunnel = pool.connect(&k, ConnectRequest::new(SocketAddr::new(LOCALHOST, port))).await.unwrap();
        let mut hi = [0u8; 2];
        tunnel.read_exact(&mut hi).await.unwrap();
        assert_eq!(&hi, b"hi");
        client_says.send("read hi").unwrap();
        let mut rest = Vec::new();
        let end = tokio::time::timeout(Duration::from_secs(5), tunnel.read_to_end(&mut rest)).await.expect("stream ends");
        client_says.send("read to the end").unwrap();
        if eof {
            assert_eq!(end.unwrap(), 0, "port {port}: end of stream");
        } else {
            let err = end.unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "port {port}: {err}");
        }
    }
}

/// A budget that counts what it lends, refusing past `cap`.
struct Counting {
    cap: u64,
    used: std::sync::atomic::AtomicU64,
    peak: std::sync::atomic::AtomicU64,
    asked: std::sync::atomic::AtomicU64,
}

impl slipstream_hbone::copy::BufferBudget for Counting {
    fn take(&self, bytes: usize) -> bool {
        self.asked.fetch_add(1, Ordering::Relaxed);
        let now = self.used.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64;
        if now > self.cap {
            self.used.fetch_sub(bytes as u64, Ordering::Relaxed);
            return false;
        }
        self.peak.fetch_max(now, Ordering::Relaxed);
        true
    }
    fn give(&self, bytes: usize) {
        let before = self.used.fetch_sub(bytes as u64, Ordering::Relaxed);
        assert!(before >= bytes as u64, "gave back {bytes} bytes of {before} lent");
    }
}

/// 10 MiB from an application socket through a copy within `budget`, to
/// the echo target and back; the bytes compared.
async fn echo_within(budget: Arc<Counting>) {
    let mesh = Mesh::new();
    let (client, server_id) = (id("sleep"), id("httpbin"));
    let server = start_server(&mesh, &server_id, ServerConfig::default()).await;
    let pool = mesh.pool(PoolConfig::default());
    let tunnel =
        pool.connect(&key(&client, &[server_id], server.addr), ConnectRequest::new(SocketAddr::new(LOCALHOST, 8080))).await.unwrap();
    let listener = TcpListener::bind((LOCALHOST, 0)).await.unwrap();
    let app = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
    let (proxied, _) = listener.accept().await.unwrap();
    let b: Arc<dyn slipstream_hbone::copy::BufferBudget> = budget.clone();
    let copy = tokio::spawn(slipstream_hbone::copy::bidirectional_within(tunnel, proxied, Some(b)));
    let data = pattern(TEN_MIB, 3);
    let (mut rx, mut tx) = app.into_split();
    let sent = data.clone();
    let writer = tokio::spawn(async move {
        tx.write_all(&sent).await.unwrap();
        tx.shutdown().await.unwrap();
    });
    let echoed = read_all(&mut rx).await.unwrap();
    writer.await.unwrap();
    assert!(echoed == data, "the echo is intact ({} of {} bytes)", echoed.len(), data.len());
    let (stats, result) = tokio::time::timeout(WAIT, copy).await.expect("the copy ends").unwrap();
    result.unwrap();
    assert_eq!((stats.to_tunnel, stats.from_tunnel), (TEN_MIB as u64, TEN_MIB as u64));
    // What h2 still held is given back once it is written out.
    wait_until_async("every byte lent to be given back", WAIT, || budget.used.load(Ordering::Relaxed) == 0).await;
}

/// What a copy reads and h2 has not yet written out is lent by the budget,
/// bulk buffers included, and all of it comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_within_a_budget_gives_back_all_it_took() {
    let budget = Arc::new(Counting { cap: u64::MAX, used: Default::default(), peak: Default::default(), asked: Default::default() });
    echo_within(budget.clone()).await;
    let peak = budget.peak.load(Ordering::Relaxed);
    assert!(peak > 16 * 1024, "bulk reads were lent their buffers: peak {peak}");
}

/// A budget that lends nothing slows a copy to one small chunk in flight
/// at a time, and never stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_its_budget_refuses_still_moves_every_byte() {
    let budget = Arc::new(Counting { cap: 0, used: Default::default(), peak: Default::default(), asked: Default::default() });
    echo_within(budget.clone()).await;
    assert!(budget.asked.load(Ordering::Relaxed) > 0, "the budget was asked");
    assert_eq!(budget.peak.load(Ordering::Relaxed), 0);
}
