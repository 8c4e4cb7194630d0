//! The waypoint's HTTP client towards endpoints: hyper's connection-level
//! client (`hyper::client::conn`) over [`Connector`]'s tunnels, with a
//! keep-alive pool of our own.
//!
//! Why not hyper-util's pooled client (docs/architecture.md): per request
//! it hashed a URI key, raced the checkout against a lazy connect, rebuilt
//! the URI in origin form and spawned a task to put the connection back;
//! about 6 % of the waypoint's CPU at the benchmark's load. This pool is
//! keyed by the endpoint's address, takes the most recently used idle
//! connection, and puts an HTTP/1.1 connection back when the response's
//! body has ended, in the task that read it.
//!
//! - HTTP/1.1: one request at a time per connection; idle connections
//!   per endpoint, most recent first. A connection whose response was not
//!   read to its end is not reused (hyper closes it).
//! - HTTP/2 (prior knowledge): one connection per endpoint, shared by all
//!   requests; opened once however many requests ask for it at the same
//!   time.
//! - At most [`MAX_IDLE_PER_ENDPOINT`] HTTP/1.1 connections wait idle per
//!   endpoint: a burst of requests (a client's, through a pod's 4 096
//!   streams) does not leave that many descriptors and tunnels held for
//!   the idle timeout; past it, a connection is closed when its exchange
//!   ends.
//! - Idle connections are closed after the idle timeout by a sweep (every
//!   timeout); an HTTP/1.1 one also by the next request to its endpoint.
//!   An HTTP/2 connection idles from the last request handed to it; one
//!   closed by the sweep still finishes the streams it carries.
//! - A request refused by a reused connection before it was sent (the
//!   endpoint closed it meanwhile) is sent again on another: nothing of it
//!   reached the endpoint.

use crate::upstream::{BoxError, Connector};
use bytes::Bytes;
use http::header::HOST;
use http::{Request, Response, Uri, Version};
use http_body_util::combinators::BoxBody;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use slipstream_core::sync::LockExt;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// Idle HTTP/1.1 connections kept per endpoint (Envoy bounds a cluster's
/// connections at 1 024 by default).
pub const MAX_IDLE_PER_ENDPOINT: usize = 256;

/// What the waypoint sends upstream.
pub type ReqBody = BoxBody<Bytes, hyper::Error>;

/// Why a request got no answer from the endpoint.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No connection could be made (Envoy's flag `UF`): nothing was sent.
    #[error("connecting to {addr}: {source}")]
    Connect { addr: SocketAddr, source: BoxError },
    /// The connection failed or was reset during the exchange (`UC`).
    #[error("exchange with {addr}: {source}")]
    Exchange { addr: SocketAddr, source: hyper::Error },
}

impl SendError {
    /// The endpoint was never reached: a connect failure to retry on
    /// (`retryOn: connect-failure`) and to flag `UF`.
    pub fn is_connect(&self) -> bool {
        matches!(self, SendError::Connect { .. })
    }
}

struct Idle {
    sender: http1::SendRequest<ReqBody>,
    since: Instant,
}

/// One endpoint's HTTP/2 connection: made once, by whichever request
/// came first.
struct H2Slot {
    sender: tokio::sync::OnceCell<http2::SendRequest<ReqBody>>,
    /// Made, or last handed out: the sweep closes it when idle too long
    /// (one still connecting is not idle).
    used: Mutex<Instant>,
}

#[derive(Default)]
struct Idles {
    h1: HashMap<SocketAddr, Vec<Idle>>,
    h2: HashMap<SocketAddr, Arc<H2Slot>>,
    /// A sweep task runs (started by the first connection pooled).
    sweeping: bool,
}

struct Inner {
    idle_timeout: Duration,
    max_idle: usize,
    idles: Mutex<Idles>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Idles> {
        self.idles.locked()
    }

    /// The most recently used live idle HTTP/1.1 connection to `addr`.
    /// Connections below an expired one are older: all are dropped.
    fn take_h1(&self, addr: SocketAddr, now: Instant) -> Option<http1::SendRequest<ReqBody>> {
        let mut idles = self.lock();
        let list = idles.h1.get_mut(&addr)?;
        while let Some(idle) = list.pop() {
            if now.saturating_duration_since(idle.since) >= self.idle_timeout {
                list.clear();
                break;
            }
            if idle.sender.is_ready() {
                return Some(idle.sender);
            }
        }
        None
    }

    /// Puts a connection whose exchange is over back, once it can take
    /// the next request.
    fn put_h1(self: &Arc<Self>, addr: SocketAddr, mut sender: http1::SendRequest<ReqBody>) {
        if sender.is_ready() {
            self.insert_h1(addr, sender);
            return;
        }
        if sender.is_closed() {
            return;
        }
        // Still sending the request's body (the endpoint answered first):
        // back when that is done, or closed if it takes longer than an
        // idle connection may live.
        let inner = Arc::downgrade(self);
        let wait = self.idle_timeout;
        tokio::spawn(async move {
            if let Ok(Ok(())) = tokio::time::timeout(wait, sender.ready()).await {
                if let Some(inner) = inner.upgrade() {
                    inner.insert_h1(addr, sender);
                }
            }
        });
    }

    fn insert_h1(self: &Arc<Self>, addr: SocketAddr, sender: http1::SendRequest<ReqBody>) {
        let mut idles = self.lock();
        let list = idles.h1.entry(addr).or_default();
        if list.len() >= self.max_idle {
            // Full: this one closes (dropped after the lock).
            drop(idles);
            drop(sender);
            return;
        }
        list.push(Idle { sender, since: Instant::now() });
        self.start_sweep(&mut idles);
    }

    /// One task per pool closes what idled too long, every idle timeout;
    /// it ends with the pool.
    fn start_sweep(self: &Arc<Self>, idles: &mut Idles) {
        if idles.sweeping {
            return;
        }
        idles.sweeping = true;
        let inner: Weak<Inner> = Arc::downgrade(self);
        let every = self.idle_timeout.max(Duration::from_millis(100));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(inner) = inner.upgrade() else { return };
                inner.sweep(Instant::now());
            }
        });
    }

    /// Drops idle connections older than the timeout, and endpoints left
    /// with none.
    fn sweep(&self, now: Instant) {
        let timeout = self.idle_timeout;
        // Dropped after the lock: a sender's drop wakes its connection.
        let mut closed = Vec::new();
        {
            let mut idles = self.lock();
            idles.h1.retain(|_, list| {
                let fresh = list.iter().position(|i| now.saturating_duration_since(i.since) < timeout).unwrap_or(list.len());
                closed.extend(list.drain(..fresh).map(|i| i.sender));
                !list.is_empty()
            });
            idles.h2.retain(|_, slot| {
                let used = *slot.used.locked();
                let live = slot.sender.get().map_or(true, |s| !s.is_closed());
                live && now.saturating_duration_since(used) < timeout
            });
        }
        drop(closed);
    }
}

/// The pooled client (cheap to clone: one pool).
#[derive(Clone)]
pub struct Clients {
    connector: Connector,
    inner: Arc<Inner>,
}

impl Clients {
    pub fn new(connector: Connector, idle_timeout: Duration) -> Clients {
        Clients::with_max_idle(connector, idle_timeout, MAX_IDLE_PER_ENDPOINT)
    }

    fn with_max_idle(connector: Connector, idle_timeout: Duration, max_idle: usize) -> Clients {
        Clients { connector, inner: Arc::new(Inner { idle_timeout, max_idle, idles: Mutex::default() }) }
    }

    /// Sends `req` to the endpoint `addr`: HTTP/2 when the request is
    /// HTTP/2, else HTTP/1.1. `req`'s URI is its path and query, and its
    /// `Host` header the authority (HTTP/2 sends it as `:authority`).
    pub async fn send(&self, addr: SocketAddr, req: Request<ReqBody>) -> Result<Response<UpstreamBody>, SendError> {
        if req.version() == Version::HTTP_2 {
            self.send_h2(addr, req).await
        } else {
            self.send_h1(addr, req).await
        }
    }

    async fn send_h1(&self, addr: SocketAddr, mut req: Request<ReqBody>) -> Result<Response<UpstreamBody>, SendError> {
        loop {
            let (mut sender, reused) = match self.inner.take_h1(addr, Instant::now()) {
                Some(s) => (s, true),
                None => (self.connect_h1(addr).await?, false),
            };
            match sender.try_send_request(req).await {
                Ok(resp) => {
                    let (parts, body) = resp.into_parts();
                    let mut body = UpstreamBody { inner: body, back: Some(Back { inner: self.inner.clone(), addr, sender }) };
                    // No body (HEAD, 204, 304, empty): done already.
                    if body.inner.is_end_stream() {
                        body.give_back();
                    }
                    return Ok(Response::from_parts(parts, body));
                }
                Err(mut e) => match e.take_message() {
                    // The endpoint had closed this idle connection: the
                    // request is untouched, try the next.
                    Some(r) if reused => {
                        tracing::debug!(upstream = %addr, "pooled connection closed; sending on another");
                        req = r;
                    }
                    _ => return Err(SendError::Exchange { addr, source: e.into_error() }),
                },
            }
        }
    }

    async fn connect_h1(&self, addr: SocketAddr) -> Result<http1::SendRequest<ReqBody>, SendError> {
        let stream = self.connector.open(addr).await.map_err(|source| SendError::Connect { addr, source })?;
        let (sender, conn) =
            http1::Builder::new().handshake(TokioIo::new(stream)).await.map_err(|e| SendError::Connect { addr, source: Box::new(e) })?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(upstream = %addr, "upstream HTTP/1.1 connection ended: {e}");
            }
        });
        Ok(sender)
    }

    async fn send_h2(&self, addr: SocketAddr, mut req: Request<ReqBody>) -> Result<Response<UpstreamBody>, SendError> {
        // HTTP/2 names the authority in the URI (`:authority`), not in
        // `Host`; the endpoint's address when there is no usable Host.
        let host = req.headers_mut().remove(HOST);
        let authority = host.as_ref().and_then(|h| h.to_str().ok()).and_then(|h| h.parse::<http::uri::Authority>().ok());
        let authority = authority.unwrap_or_else(|| http::uri::Authority::try_from(addr.to_string()).expect("an address is an authority"));
        let mut parts = std::mem::take(req.uri_mut()).into_parts();
        parts.scheme = Some(http::uri::Scheme::HTTP);
        parts.authority = Some(authority);
        if parts.path_and_query.is_none() {
            parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
        }
        // Scheme, authority and path are all set: this cannot fail.
        *req.uri_mut() = Uri::from_parts(parts).map_err(|e| SendError::Connect { addr, source: Box::new(e) })?;
        loop {
            let (slot, reused) = self.h2_slot(addr);
            let mut sender = match slot.sender.get_or_try_init(|| self.connect_h2(addr)).await {
                Ok(s) if !s.is_closed() => s.clone(),
                Ok(_) => {
                    // Closed (GOAWAY, reset): made anew, once. One closed
                    // as soon as it was made is the endpoint's answer, not
                    // a reason to connect again and again.
                    self.drop_h2_slot(addr, &slot);
                    if reused {
                        continue;
                    }
                    return Err(SendError::Connect { addr, source: "the endpoint closed the connection as soon as it was made".into() });
                }
                Err(e) => {
                    self.drop_h2_slot(addr, &slot);
                    return Err(e);
                }
            };
            *slot.used.locked() = Instant::now();
            match sender.try_send_request(req).await {
                Ok(resp) => {
                    let (parts, body) = resp.into_parts();
                    return Ok(Response::from_parts(parts, UpstreamBody { inner: body, back: None }));
                }
                Err(mut e) => match e.take_message() {
                    Some(r) if reused => {
                        self.drop_h2_slot(addr, &slot);
                        req = r;
                    }
                    _ => return Err(SendError::Exchange { addr, source: e.into_error() }),
                },
            }
        }
    }

    /// The endpoint's HTTP/2 slot, and whether it was there already.
    fn h2_slot(&self, addr: SocketAddr) -> (Arc<H2Slot>, bool) {
        let mut idles = self.inner.lock();
        if let Some(s) = idles.h2.get(&addr) {
            return (s.clone(), true);
        }
        let slot = Arc::new(H2Slot { sender: tokio::sync::OnceCell::new(), used: Mutex::new(Instant::now()) });
        idles.h2.insert(addr, slot.clone());
        self.inner.start_sweep(&mut idles);
        (slot, false)
    }

    fn drop_h2_slot(&self, addr: SocketAddr, slot: &Arc<H2Slot>) {
        let mut idles = self.inner.lock();
        if idles.h2.get(&addr).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            idles.h2.remove(&addr);
        }
    }

    async fn connect_h2(&self, addr: SocketAddr) -> Result<http2::SendRequest<ReqBody>, SendError> {
        let stream = self.connector.open(addr).await.map_err(|source| SendError::Connect { addr, source })?;
        let (sender, conn) = http2::Builder::new(TokioExecutor::new())
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| SendError::Connect { addr, source: Box::new(e) })?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(upstream = %addr, "upstream HTTP/2 connection ended: {e}");
            }
        });
        Ok(sender)
    }
}

/// Where an HTTP/1.1 connection goes back when its response has ended.
struct Back {
    inner: Arc<Inner>,
    addr: SocketAddr,
    sender: http1::SendRequest<ReqBody>,
}

/// A response's body from an endpoint. Read to its end, it puts its
/// HTTP/1.1 connection back in the pool; dropped before, the connection
/// is closed (the rest of the body is never read).
pub struct UpstreamBody {
    inner: Incoming,
    back: Option<Back>,
}

impl UpstreamBody {
    fn give_back(&mut self) {
        if let Some(b) = self.back.take() {
            b.inner.put_h1(b.addr, b.sender);
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let frame = std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx));
        match &frame {
            None => this.give_back(),
            Some(Ok(_)) if this.inner.is_end_stream() => this.give_back(),
            Some(Ok(_)) => {}
            Some(Err(_)) => this.back = None,
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        // A writer that stops once the length is reached never polls for
        // the end.
        if self.inner.is_end_stream() {
            self.give_back();
        }
    }
}

#[cfg(test)]
mod tests {
    //! Real connections on loopback to endpoints outside the mesh (plain
    //! TCP: the connector's other path is the in-process tests' business).
    use super::*;
    use arc_swap::ArcSwap;
    use http_body_util::{BodyExt, Empty, Full};
    use slipstream_core::TrustDomain;
    use slipstream_core::{MeshState, SpiffeId};
    use slipstream_hbone::{Pool, PoolConfig};
    use slipstream_identity::{Ca, CertManager, CertManagerConfig, LocalCaProvider};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    fn clients(idle_timeout: Duration) -> Clients {
        clients_keeping(idle_timeout, MAX_IDLE_PER_ENDPOINT)
    }

    /// At most `max_idle` idle connections per endpoint.
    fn clients_keeping(idle_timeout: Duration, max_idle: usize) -> Clients {
        let ca = Arc::new(Ca::generate(&TrustDomain::default()).unwrap());
        let certs = CertManager::new(Arc::new(LocalCaProvider::new(ca, Duration::from_secs(3600))), CertManagerConfig::default());
        let pool = Pool::new(PoolConfig::default(), Arc::new(certs), Arc::new(slipstream_hbone::PlainConnector));
        let connector = Connector {
            pool,
            identity: Arc::new("spiffe://cluster.local/ns/default/sa/waypoint".parse::<SpiffeId>().unwrap()),
            own_ip: "127.0.0.1".parse().unwrap(),
            mesh: Arc::new(ArcSwap::from_pointee(MeshState::default())),
        };
        Clients::with_max_idle(connector, idle_timeout, max_idle)
    }

    /// Connections accepted and connections the client closed.
    #[derive(Default)]
    struct Counts {
        accepted: AtomicUsize,
        closed: AtomicUsize,
    }

    /// An HTTP endpoint (HTTP/1.1, or HTTP/2 with prior knowledge) that
    /// answers `/big` with 1 MiB, `/empty` with 204 and anything else
    /// with its request's `:authority` or `Host`.
    async fn endpoint(h2: bool) -> (SocketAddr, Arc<Counts>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let counts = Arc::new(Counts::default());
        let c = counts.clone();
        tokio::spawn(async move {
            loop {
                let (s, _) = l.accept().await.unwrap();
                c.accepted.fetch_add(1, Ordering::SeqCst);
                let c = c.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(|req: Request<Incoming>| async move {
                        let body = match req.uri().path() {
                            "/big" => Bytes::from(vec![b'x'; 1 << 20]),
                            "/empty" => {
                                let mut r = Response::new(Full::new(Bytes::new()));
                                *r.status_mut() = http::StatusCode::NO_CONTENT;
                                return Ok::<_, std::convert::Infallible>(r);
                            }
                            _ => {
                                let host = req.headers().get(HOST).and_then(|h| h.to_str().ok());
                                Bytes::from(req.uri().authority().map(|a| a.to_string()).or(host.map(String::from)).unwrap_or_default())
                            }
                        };
                        Ok(Response::new(Full::new(body)))
                    });
                    let io = TokioIo::new(s);
                    if h2 {
                        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new()).serve_connection(io, svc).await;
                    } else {
                        let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, svc).await;
                    }
                    c.closed.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        (addr, counts)
    }

    fn get(path: &str, version: Version) -> Request<ReqBody> {
        let mut r = Request::new(Empty::new().map_err(|never| match never {}).boxed());
        *r.uri_mut() = Uri::try_from(path).unwrap();
        *r.version_mut() = version;
        r.headers_mut().insert(HOST, http::HeaderValue::from_static("reviews.default.svc.cluster.local:9080"));
        r
    }

    async fn text(c: &Clients, addr: SocketAddr, path: &str, version: Version) -> (u16, String) {
        let resp = c.send(addr, get(path, version)).await.unwrap();
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    async fn wait_for(what: &str, f: impl Fn() -> bool) {
        for _ in 0..200 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("timed out waiting for {what}");
    }

    #[tokio::test]
    async fn http1_requests_one_after_another_share_one_connection() {
        let (addr, counts) = endpoint(false).await;
        let c = clients(Duration::from_secs(30));
        for i in 0..6 {
            // Bodies read to their end, and answers without one.
            let path = if i % 2 == 0 { "/" } else { "/empty" };
            let (status, body) = text(&c, addr, path, Version::HTTP_11).await;
            assert_eq!(status, if i % 2 == 0 { 200 } else { 204 });
            if i % 2 == 0 {
                assert_eq!(body, "reviews.default.svc.cluster.local:9080", "Host is sent as given");
            }
        }
        assert_eq!(counts.accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn http1_requests_at_the_same_time_each_get_a_connection() {
        let (addr, counts) = endpoint(false).await;
        let c = clients(Duration::from_secs(30));
        // Answers held unread: each request needs its own connection.
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(c.send(addr, get("/big", Version::HTTP_11)).await.unwrap());
        }
        assert_eq!(counts.accepted.load(Ordering::SeqCst), 3);
        for r in held {
            assert_eq!(r.into_body().collect().await.unwrap().to_bytes().len(), 1 << 20);
        }
        // All three idle now: the next three reuse them.
        for _ in 0..3 {
            text(&c, addr, "/", Version::HTTP_11).await;
        }
        assert_eq!(counts.accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn past_the_idle_bound_a_connection_closes_when_its_exchange_ends() {
        let (addr, counts) = endpoint(false).await;
        let c = clients_keeping(Duration::from_secs(30), 2);
        // Three at once, then all three done: two wait idle, one closes.
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(c.send(addr, get("/big", Version::HTTP_11)).await.unwrap());
        }
        for r in held {
            r.into_body().collect().await.unwrap();
        }
        wait_for("one connection closed", || counts.closed.load(Ordering::SeqCst) == 1).await;
        for _ in 0..4 {
            text(&c, addr, "/", Version::HTTP_11).await;
        }
        assert_eq!(counts.accepted.load(Ordering::SeqCst), 3, "the two kept are reused");
        assert_eq!(counts.closed.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_answer_left_unread_closes_its_connection_and_is_not_reused() {
        let (addr, counts) = endpoint(false).await;
        let c = clients(Duration::from_secs(30));
        let resp = c.send(addr, get("/big", Version::HTTP_11)).await.unwrap();
        let mut body = resp.into_body();
        let first = body.frame().await.unwrap().unwrap();
        assert!(first.is_data());
        drop(body);
        wait_for("the endpoint to see the connection closed", || counts.closed.load(Ordering::SeqCst) == 1).await;
        let (status, _) = text(&c, addr, "/", Version::HTTP_11).await;
        assert_eq!(status, 200);
        assert_eq!(counts.accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_connection_the_endpoint_closed_while_idle_is_replaced_without_failing_a_request() {
        // Answers one request per connection, then closes it without
        // saying so (no `connection: close`).
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let a = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                a.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
                });
            }
        });
        let c = clients(Duration::from_secs(30));
        for _ in 0..3 {
            assert_eq!(text(&c, addr, "/", Version::HTTP_11).await, (200, "ok".to_string()));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn idle_connections_are_closed_after_the_idle_timeout() {
        let (addr, counts) = endpoint(false).await;
        let (addr2, counts2) = endpoint(true).await;
        let c = clients(Duration::from_millis(200));
        text(&c, addr, "/", Version::HTTP_11).await;
        text(&c, addr2, "/", Version::HTTP_2).await;
        // No further request to either: the sweep closes both.
        wait_for("the idle HTTP/1.1 connection closed", || counts.closed.load(Ordering::SeqCst) == 1).await;
        wait_for("the idle HTTP/2 connection closed", || counts2.closed.load(Ordering::SeqCst) == 1).await;
        // And a request after that opens anew.
        text(&c, addr, "/", Version::HTTP_11).await;
        text(&c, addr2, "/", Version::HTTP_2).await;
        assert_eq!(counts.accepted.load(Ordering::SeqCst), 2);
        assert_eq!(counts2.accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn http2_requests_share_one_connection_and_send_host_as_authority() {
        let (addr, counts) = endpoint(true).await;
        let c = clients(Duration::from_secs(30));
        // Asked for all at once: one connection is made, not ten.
        let answers = futures_util::future::join_all((0..10).map(|_| text(&c, addr, "/", Version::HTTP_2))).await;
        for (status, body) in answers {
            assert_eq!(status, 200);
            assert_eq!(body, "reviews.default.svc.cluster.local:9080");
        }
        assert_eq!(counts.accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_endpoint_that_refuses_connections_is_a_connect_failure() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        let c = clients(Duration::from_secs(30));
        for version in [Version::HTTP_11, Version::HTTP_2] {
            let e = c.send(addr, get("/", version)).await.err().expect("refused");
            assert!(e.is_connect(), "{e}");
            assert!(e.to_string().starts_with(&format!("connecting to {addr}: ")), "{e}");
        }
    }
}
