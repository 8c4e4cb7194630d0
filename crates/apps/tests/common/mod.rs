//! Helpers shared by the in-process tests: servers on loopback ephemeral
//! ports and a minimal HTTP client that exposes its own socket address.
#![allow(dead_code)] // each test binary uses a different subset

use std::fmt::Display;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};

/// Guards every network wait so a hang fails the test instead of CI.
pub const DEADLINE: Duration = Duration::from_secs(20);

pub async fn loopback_listener() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
    let addr = listener.local_addr().unwrap();
    (listener, addr)
}

/// A loopback address nothing listens on.
pub fn closed_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The client's end of the connection, to compare with what the server saw.
    pub client_addr: SocketAddr,
}

impl Answer {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    pub fn header(&self, name: &str) -> &str {
        self.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
    }
}

pub fn get(path: &str) -> Request<Full<Bytes>> {
    Request::get(path).body(Full::new(Bytes::new())).unwrap()
}

/// One request on a fresh HTTP/1.1 connection.
pub async fn http1(addr: SocketAddr, req: Request<Full<Bytes>>) -> Answer {
    tokio::time::timeout(DEADLINE, async {
        let stream = TcpStream::connect(addr).await.expect("connect");
        let client_addr = stream.local_addr().unwrap();
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.expect("h1 handshake");
        tokio::spawn(conn);
        let mut req = req;
        req.headers_mut().insert(http::header::HOST, addr.to_string().parse().unwrap());
        let resp = send.send_request(req).await.expect("h1 request");
        collect(resp, client_addr).await
    })
    .await
    .expect("HTTP/1.1 request timed out")
}

/// One request on a fresh HTTP/2 prior-knowledge (h2c) connection.
pub async fn http2(addr: SocketAddr, req: Request<Full<Bytes>>) -> Answer {
    tokio::time::timeout(DEADLINE, async {
        let stream = TcpStream::connect(addr).await.expect("connect");
        let client_addr = stream.local_addr().unwrap();
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.expect("h2 handshake");
        tokio::spawn(conn);
        let (mut parts, body) = req.into_parts();
        parts.uri = format!("http://{addr}{}", parts.uri).parse().unwrap();
        parts.version = Version::HTTP_2;
        let resp = send.send_request(Request::from_parts(parts, body)).await.expect("h2 request");
        collect(resp, client_addr).await
    })
    .await
    .expect("HTTP/2 request timed out")
}

async fn collect(resp: http::Response<hyper::body::Incoming>, client_addr: SocketAddr) -> Answer {
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("response body").to_bytes();
    Answer { status: parts.status, version: parts.version, headers: parts.headers, body, client_addr }
}

/// Waits until `done` holds, checking every 20 ms without blocking the
/// runtime. If it still does not after `within`, panics saying what never
/// happened: "timed out after 20s waiting for {what}". For things that
/// happen just after an answer (the access log is written when the server
/// drops the body): tests wait for them instead of sleeping.
pub async fn wait_until_async(what: impl Display, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + within;
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "timed out after {within:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// [`wait_until_async`] for tests without a runtime: blocks the thread.
pub fn wait_until(what: impl Display, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + within;
    while !done() {
        assert!(std::time::Instant::now() < deadline, "timed out after {within:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
