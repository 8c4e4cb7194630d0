//! The echo app in-process on loopback: HTTP/1.1, HTTP/2, the raw TCP echo,
//! and robustness against bad input.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{get, http1, http2, loopback_listener, wait_until_async, DEADLINE};
use http::{Request, StatusCode, Version};
use http_body_util::Full;
use slipstream_apps::{serve_echo_http, serve_echo_tcp, AccessLog, EchoConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn start_http(access_log: AccessLog) -> SocketAddr {
    let (listener, addr) = loopback_listener().await;
    tokio::spawn(serve_echo_http(
        listener,
        EchoConfig { name: "echo-test".into(), access_log, hello_version: Some("v7".into()), text: None },
    ));
    addr
}

async fn start_tcp() -> SocketAddr {
    let (listener, addr) = loopback_listener().await;
    tokio::spawn(serve_echo_tcp(listener));
    addr
}

#[tokio::test]
async fn size_returns_exactly_that_many_bytes() {
    let addr = start_http(AccessLog::Off).await;
    for size in [0usize, 1, 1024, 1_048_576] {
        let answer = http1(addr, get(&format!("/echo?size={size}"))).await;
        assert_eq!(answer.status, StatusCode::OK, "size={size}");
        assert_eq!(answer.body.len(), size, "size={size}");
        assert_eq!(answer.header("content-length"), size.to_string(), "size={size}");
    }
    // fortio's load client POSTs too.
    let post = Request::post("/echo?size=1024").body(Full::new(Bytes::from_static(b"ignored"))).unwrap();
    assert_eq!(http1(addr, post).await.body.len(), 1024);
}

#[tokio::test]
async fn size_over_the_cap_and_bad_values_are_400_with_a_reason() {
    let addr = start_http(AccessLog::Off).await;
    for query in ["size=10485761", "size=lots", "status=42", "delay=1fortnight", "delay=11s"] {
        let answer = http1(addr, get(&format!("/echo?{query}"))).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{query}");
        let text = answer.text();
        assert_eq!(text.trim_end().lines().count(), 1, "{query}: one-line reason, got {text:?}");
    }
    assert!(http1(addr, get("/echo?size=10485761")).await.text().contains("cap"));
}

#[tokio::test]
async fn status_and_delay_are_honoured() {
    let addr = start_http(AccessLog::Off).await;
    let answer = http1(addr, get("/echo?status=503&size=10")).await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.body.len(), 10);

    let started = Instant::now();
    let answer = http1(addr, get("/echo?delay=200ms")).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(started.elapsed() >= Duration::from_millis(200), "answered after {:?}", started.elapsed());
}

#[tokio::test]
async fn without_size_the_body_is_echoed() {
    let addr = start_http(AccessLog::Off).await;
    let body: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let req = Request::post("/echo").header("content-type", "application/x-test").body(Full::new(Bytes::from(body.clone()))).unwrap();
    let answer = http1(addr, req).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.header("content-type"), "application/x-test");
    assert!(answer.body == body, "echoed body differs");

    let req = Request::put("/echo").body(Full::new(Bytes::from_static(b"over h2"))).unwrap();
    assert_eq!(&http2(addr, req).await.body[..], b"over h2");
}

#[tokio::test]
async fn headers_show_the_real_peer_address_and_custom_headers() {
    let addr = start_http(AccessLog::Off).await;
    let req = Request::get("/headers?x=1")
        .header("x-custom", "hello")
        .header("x-multi", "a")
        .header("x-multi", "b")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let answer = http1(addr, req).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(answer.text().contains("\n  \""), "pretty-printed");
    let doc = answer.json();
    assert_eq!(doc["client_addr"], answer.client_addr.to_string());
    assert_eq!(doc["local_addr"], addr.to_string());
    assert_eq!(doc["server"], "echo-test");
    assert_eq!(doc["method"], "GET");
    assert_eq!(doc["path"], "/headers");
    assert_eq!(doc["version"], "HTTP/1.1");
    assert_eq!(doc["headers"]["x-custom"], "hello");
    assert_eq!(doc["headers"]["x-multi"], serde_json::json!(["a", "b"]));
    assert_eq!(answer.header("x-served-by"), "echo-test");
}

#[tokio::test]
async fn http2_prior_knowledge_works_on_the_same_port() {
    let addr = start_http(AccessLog::Off).await;
    let answer = http2(addr, get("/echo?size=1024")).await;
    assert_eq!(answer.version, Version::HTTP_2);
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.body.len(), 1024);

    let answer = http2(addr, Request::get("/headers").header("x-custom", "h2").body(Full::new(Bytes::new())).unwrap()).await;
    let doc = answer.json();
    assert_eq!(doc["version"], "HTTP/2.0");
    assert_eq!(doc["client_addr"], answer.client_addr.to_string());
    assert_eq!(doc["headers"]["x-custom"], "h2");
}

#[tokio::test]
async fn keep_alive_serves_several_requests_on_one_connection() {
    let addr = start_http(AccessLog::Off).await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let requests = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\nGET /echo?size=3 HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";
    stream.write_all(requests).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(DEADLINE, stream.read_to_end(&mut raw)).await.unwrap().unwrap();
    let raw = String::from_utf8_lossy(&raw);
    assert_eq!(raw.matches("HTTP/1.1 200 OK").count(), 2, "{raw}");
    assert!(raw.contains("\r\n\r\nok\n"), "first answer is the health check: {raw}");
    assert!(raw.contains("content-length: 3\r\n") && raw.ends_with("\r\n\r\nsli"), "second is 3 payload bytes: {raw}");
}

#[tokio::test]
async fn other_endpoints() {
    let addr = start_http(AccessLog::Off).await;
    let health = http1(addr, get("/healthz")).await;
    assert_eq!((health.status, health.text().as_str()), (StatusCode::OK, "ok\n"));
    let index = http1(addr, get("/")).await;
    assert_eq!(index.status, StatusCode::OK);
    assert!(index.text().contains("echo-test") && index.text().contains("/headers"));
    assert_eq!(http1(addr, get("/nope")).await.status, StatusCode::NOT_FOUND);
    let post = Request::post("/healthz").body(Full::new(Bytes::new())).unwrap();
    assert_eq!(http1(addr, post).await.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn every_request_is_logged_with_client_status_and_bytes() {
    let log = AccessLog::memory();
    let addr = start_http(log.clone()).await;
    let answer = http1(addr, get("/echo?size=5&status=201")).await;
    let want = format!("{} \"GET /echo?size=5&status=201 HTTP/1.1\" 201 5", answer.client_addr);
    wait_until_async("the first request's access-log line", DEADLINE, || !log.lines().is_empty()).await;
    assert!(log.lines().contains(&want), "want {want:?}, got {:?}", log.lines());
    let answer = http2(addr, get("/nope")).await;
    let prefix = format!("{} \"GET /nope HTTP/2.0\" 404 ", answer.client_addr);
    wait_until_async("the second request's access-log line", DEADLINE, || log.lines().len() >= 2).await;
    assert!(log.lines().iter().any(|l| l.starts_with(&prefix)), "{:?}", log.lines());
}

#[tokio::test]
async fn garbage_on_the_http_port_does_not_kill_the_server() {
    let addr = start_http(AccessLog::memory()).await;
    let garbage: [&[u8]; 4] = [
        b"\x00\x01\x02\xff\xfe garbage\r\n\r\n",
        b"GET /echo?size=1 HTTP/9.9\r\n\r\n",
        b"GET / HTTP/1.1\r\nbad header line\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
    ];
    for bytes in garbage {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(bytes).await.unwrap();
        let mut sink = Vec::new();
        // The server answers 400 or closes; either way the connection ends.
        let _ = tokio::time::timeout(DEADLINE, stream.read_to_end(&mut sink)).await.expect("server kept a garbage connection open");
    }
    let answer = http1(addr, get("/echo?size=7")).await;
    assert_eq!((answer.status, answer.body.len()), (StatusCode::OK, 7));
}

/// Writes `data`, half-closes, and reads everything back until EOF, with
/// reading and writing concurrent so a large payload cannot deadlock.
async fn tcp_round_trip(addr: SocketAddr, data: Vec<u8>) -> Vec<u8> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let write = tokio::spawn(async move {
        writer.write_all(&data).await.unwrap();
        writer.shutdown().await.unwrap();
        writer // keep the write half alive until reading ends
    });
    let mut echoed = Vec::new();
    reader.read_to_end(&mut echoed).await.unwrap();
    drop(write.await.unwrap());
    echoed
}

#[tokio::test]
async fn tcp_echo_returns_every_byte_and_propagates_half_close() {
    let addr = start_tcp().await;
    let data: Vec<u8> = (0..4 * 1024 * 1024u32).map(|i| (i * 7 % 256) as u8).collect();
    let echoed = tokio::time::timeout(DEADLINE, tcp_round_trip(addr, data.clone())).await.expect("no EOF after half-close");
    assert_eq!(echoed.len(), data.len());
    assert!(echoed == data);

    // Half-close with nothing sent: EOF straight away, and the server's write
    // side is really shut (read_to_end returned, not a reset).
    let echoed = tokio::time::timeout(DEADLINE, tcp_round_trip(addr, Vec::new())).await.unwrap();
    assert!(echoed.is_empty());
}

#[tokio::test]
async fn tcp_echo_serves_200_concurrent_connections() {
    let addr = start_tcp().await;
    // Open all connections before any finishes, so they are really concurrent.
    let mut streams = Vec::new();
    for _ in 0..200 {
        streams.push(TcpStream::connect(addr).await.unwrap());
    }
    let tasks = streams.into_iter().enumerate().map(|(i, mut stream)| async move {
        let data = format!("connection {i};").repeat(500).into_bytes();
        let (mut reader, mut writer) = stream.split();
        let write = async {
            writer.write_all(&data).await.unwrap();
            writer.shutdown().await.unwrap();
        };
        let mut echoed = Vec::new();
        let (_, read) = tokio::join!(write, reader.read_to_end(&mut echoed));
        read.unwrap();
        echoed == data
    });
    let results = tokio::time::timeout(DEADLINE, futures_util::future::join_all(tasks)).await.expect("tcp echo stalled");
    assert_eq!(results.iter().filter(|ok| **ok).count(), 200);
}

#[tokio::test]
async fn default_dual_stack_bind_reports_ipv4_clients_as_ipv4() {
    // `::` is the default --bind; where IPv6 is off it falls back to 0.0.0.0.
    let listener = slipstream_apps::bind_listener("::".parse().unwrap(), 0).await.expect("bind ::");
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(serve_echo_http(
        listener,
        EchoConfig { name: "dual".into(), access_log: AccessLog::Off, hello_version: None, text: None },
    ));
    let answer = http1(([127, 0, 0, 1], port).into(), get("/headers")).await;
    let doc = answer.json();
    assert_eq!(doc["client_addr"], answer.client_addr.to_string(), "not ::ffff:127.0.0.1");
    assert_eq!(doc["local_addr"], format!("127.0.0.1:{port}"));
}

/// The sample images' endpoints (docs/images.md): helloworld's `/hello`,
/// httpbin's `/get`, `/status/CODE`, `/anything`, `/ip`.
#[tokio::test]
async fn helloworld_and_httpbin_endpoints() {
    let addr = start_http(AccessLog::Off).await;
    let hello = http1(addr, get("/hello")).await;
    assert_eq!((hello.status, hello.text()), (StatusCode::OK, "Hello version: v7, instance: echo-test\n".to_string()));
    let got = http1(addr, Request::get("/get?a=1&b=two").header("x-request-id", "r1").body(Full::new(Bytes::new())).unwrap()).await;
    assert_eq!(got.status, StatusCode::OK);
    let v: serde_json::Value = serde_json::from_slice(&got.body).unwrap();
    assert_eq!(v["args"], serde_json::json!({"a": "1", "b": "two"}));
    assert_eq!(v["headers"]["X-Request-Id"], "r1", "{v}");
    assert_eq!(v["origin"], "127.0.0.1");
    for code in [200u16, 418, 503] {
        assert_eq!(http1(addr, get(&format!("/status/{code}"))).await.status.as_u16(), code);
    }
    assert_eq!(http1(addr, get("/status/abc")).await.status, StatusCode::BAD_REQUEST);
    let any = http1(addr, Request::post("/anything/x").body(Full::new(Bytes::from_static(b"b"))).unwrap()).await;
    let v: serde_json::Value = serde_json::from_slice(&any.body).unwrap();
    assert_eq!(v["method"], "POST");
    let ip: serde_json::Value = serde_json::from_slice(&http1(addr, get("/ip")).await.body).unwrap();
    assert_eq!(ip["origin"], "127.0.0.1");
    // Unknown paths still say what exists.
    assert_eq!(http1(addr, get("/nothing")).await.status, StatusCode::NOT_FOUND);
}
