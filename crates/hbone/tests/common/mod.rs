//! Fixtures shared by the HBONE integration tests: a CA, a certificate
//! manager, a configurable handler, a server on loopback and a raw h2 client.
//! Every test binary uses a different subset.
#![allow(dead_code)]

use slipstream_core::sync::LockExt;
use std::collections::HashMap;
use std::fmt::Display;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use rustls_pki_types::ServerName;
use slipstream_core::{SpiffeId, TrustDomain};
use slipstream_hbone::drain::{self, DrainTrigger};
use slipstream_hbone::{
    CertResolver, Handler, HandshakeFailure, HboneError, InboundRequest, PlainConnector, Pool, PoolConfig, PoolKey, ResolveError, Server,
    ServerConfig, ServerStats, StreamRecord, Upstream,
};
use slipstream_identity::tls::{client_config, ServerTls};
use slipstream_identity::{Ca, CertManager, CertManagerConfig, LocalCaProvider, WorkloadCert};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;

pub const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// How long a test waits for something that is about to happen (a counter,
/// a record, a connection closing) before it fails.
pub const WAIT: Duration = Duration::from_secs(10);

/// Waits until `done` holds, checking every 10 ms without blocking the
/// runtime. If it still does not after `within`, panics saying what never
/// happened: "timed out after 10s waiting for {what}". Tests use it
/// instead of sleeping whenever they need something to have happened.
pub async fn wait_until_async(what: impl Display, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + within;
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "timed out after {within:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub fn id(sa: &str) -> SpiffeId {
    SpiffeId::new("cluster.local", "default", sa).unwrap()
}

/// A deterministic, position-dependent byte pattern (catches reordering).
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

pub struct Mesh {
    pub ca: Arc<Ca>,
    pub certs: CertManager,
}

impl Mesh {
    pub fn new() -> Self {
        let ca = Arc::new(Ca::generate(&TrustDomain::default()).unwrap());
        let provider = LocalCaProvider::new(ca.clone(), Duration::from_secs(3600));
        let certs = CertManager::new(Arc::new(provider), CertManagerConfig::default());
        Self { ca, certs }
    }

    pub fn server_tls(&self) -> ServerTls {
        ServerTls::new(self.ca.roots(), TrustDomain::default()).unwrap()
    }

    pub fn pool(&self, config: PoolConfig) -> Pool {
        Pool::new(config, Arc::new(self.certs.clone()), Arc::new(PlainConnector))
    }

    pub async fn cert(&self, who: &SpiffeId) -> Arc<WorkloadCert> {
        self.certs.fetch_certificate(who).await.unwrap()
    }
}

pub fn key(src: &SpiffeId, dst: &[SpiffeId], addr: SocketAddr) -> PoolKey {
    PoolKey::new(src.clone(), dst.iter().cloned(), addr, addr.ip())
}

/// Maps destination IPs to workload identities, like the node proxy does.
pub struct TestResolver {
    pub certs: CertManager,
    pub workloads: HashMap<IpAddr, SpiffeId>,
}

impl CertResolver for TestResolver {
    fn resolve(&self, local_ip: IpAddr) -> BoxFuture<'_, Result<Arc<WorkloadCert>, ResolveError>> {
        Box::pin(async move {
            let who = self.workloads.get(&local_ip.to_canonical()).ok_or(ResolveError::NoWorkload(local_ip))?;
            self.certs.fetch_certificate(who).await.map_err(|source| ResolveError::Fetch { ip: local_ip, source })
        })
    }
}

/// What the test handler does for a target port.
#[derive(Clone, Copy, Debug)]
pub enum Behavior {
    /// Echoes everything, half-closes after the peer did.
    Echo,
    /// Sends this many bytes and half-closes first, then counts what arrives.
    Greet(usize),
    /// Never reads nor writes.
    Sink,
    /// Writes as fast as it can, counting into `flood_written`.
    Flood,
    Deny,
    NoWorkload,
    /// Connects to a closed TCP port.
    ConnectRefused,
}

#[derive(Default)]
pub struct TestHandler {
    pub behaviors: Mutex<HashMap<u16, Behavior>>,
    pub requests: Mutex<Vec<InboundRequest>>,
    pub records: Mutex<Vec<StreamRecord>>,
    pub held: Mutex<Vec<DuplexStream>>,
    pub greet_received: Arc<Mutex<Vec<u64>>>,
    /// Connections that ended before their first stream, as the server
    /// reported them (after counting them in its stats).
    pub handshake_failures: Mutex<Vec<HandshakeFailure>>,
    pub flood_written: Arc<AtomicU64>,
    /// A target this proxy serves as a waypoint.
    pub waypoint_for: Mutex<Option<SocketAddr>>,
}

impl TestHandler {
    pub fn set(&self, port: u16, behavior: Behavior) {
        self.behaviors.locked().insert(port, behavior);
    }

    pub fn greet_results(&self) -> Vec<u64> {
        self.greet_received.locked().clone()
    }

    /// Waits until `n` greeting applications read their client to EOF.
    /// The stream's record can come first: the tunnel is done once the
    /// client's EOF is handed to the application, which counts a moment
    /// later.
    pub async fn wait_greet_results(&self, n: usize) -> Vec<u64> {
        wait_until_async(format!("{n} greeting applications to read to EOF"), WAIT, || self.greet_results().len() >= n).await;
        self.greet_results()
    }

    pub fn records(&self) -> Vec<StreamRecord> {
        self.records.locked().clone()
    }

    /// Waits until `n` stream records arrived (they are written when the
    /// server side of a stream finishes, slightly after the client's).
    pub async fn wait_records(&self, n: usize) -> Vec<StreamRecord> {
        wait_until_async(format!("the server to record {n} streams"), WAIT, || self.records().len() >= n).await;
        self.records()
    }

    pub fn handshake_failures(&self) -> Vec<HandshakeFailure> {
        self.handshake_failures.locked().clone()
    }

    /// Waits until the server reported `n` connections that failed before
    /// their first stream. It reports each once it is done with it, so its
    /// stats about those connections are final then.
    pub async fn wait_handshake_failures(&self, n: usize) -> Vec<HandshakeFailure> {
        wait_until_async(format!("the server to report {n} failed handshakes"), WAIT, || self.handshake_failures().len() >= n).await;
        self.handshake_failures()
    }
}

const DUPLEX: usize = 64 * 1024;

impl Handler for TestHandler {
    fn connect<'a>(&'a self, request: &'a InboundRequest) -> BoxFuture<'a, Result<Box<dyn Upstream>, HboneError>> {
        Box::pin(async move {
            self.requests.locked().push(request.clone());
            let behavior = self.behaviors.locked().get(&request.target.port()).copied().unwrap_or(Behavior::Echo);
            let (ours, theirs) = tokio::io::duplex(DUPLEX);
            match behavior {
                Behavior::Echo => {
                    tokio::spawn(async move {
                        let (mut r, mut w) = tokio::io::split(theirs);
                        let _ = tokio::io::copy(&mut r, &mut w).await;
                        let _ = w.shutdown().await;
                    });
                }
                Behavior::Greet(n) => {
                    let received = self.greet_received.clone();
                    tokio::spawn(async move {
                        let (mut r, mut w) = tokio::io::split(theirs);
                        w.write_all(&pattern(n, 7)).await.unwrap();
                        w.shutdown().await.unwrap();
                        let mut sink = Vec::new();
                        let got = r.read_to_end(&mut sink).await.unwrap();
                        received.locked().push(got as u64);
                        assert_eq!(sink, pattern(got, 9), "client bytes arrive intact");
                    });
                }
                Behavior::Sink => self.held.locked().push(theirs),
                Behavior::Flood => {
                    let written = self.flood_written.clone();
                    tokio::spawn(async move {
                        let mut theirs = theirs;
                        let chunk = vec![0x5a; 64 * 1024];
                        while theirs.write_all(&chunk).await.is_ok() {
                            written.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                        }
                    });
                }
                Behavior::Deny => return Err(HboneError::denied("test policy")),
                Behavior::NoWorkload => return Err(HboneError::NoWorkload(request.target)),
                Behavior::ConnectRefused => {
                    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
                    let addr = closed.local_addr().unwrap();
                    drop(closed);
                    let e = TcpStream::connect(addr).await.unwrap_err();
                    return Err(HboneError::Connect { addr, source: Arc::new(e) });
                }
            }
            Ok(Box::new(ours) as Box<dyn Upstream>)
        })
    }

    fn accepts_foreign_target(&self, _tunnel_local: SocketAddr, target: SocketAddr) -> bool {
        *self.waypoint_for.locked() == Some(target)
    }

    fn on_stream_end(&self, record: &StreamRecord) {
        self.records.locked().push(record.clone());
    }

    fn on_handshake_failure(&self, failure: &HandshakeFailure) {
        self.handshake_failures.locked().push(failure.clone());
    }
}

pub struct TestServer {
    pub addr: SocketAddr,
    pub stats: Arc<ServerStats>,
    pub handler: Arc<TestHandler>,
    pub drain: Option<DrainTrigger>,
    pub task: JoinHandle<()>,
}

/// Starts a server on `bind` whose local workloads are `workloads`.
pub async fn start_server_on(mesh: &Mesh, bind: SocketAddr, workloads: &[(IpAddr, SpiffeId)], config: ServerConfig) -> TestServer {
    let listener = TcpListener::bind(bind).await.unwrap();
    let handler = Arc::new(TestHandler::default());
    let resolver = TestResolver { certs: mesh.certs.clone(), workloads: workloads.iter().cloned().collect() };
    let server = Server::new(listener, mesh.server_tls(), Arc::new(resolver), handler.clone(), config);
    let addr = server.local_addr().unwrap();
    let stats = server.stats();
    let (trigger, watch) = drain::channel();
    let task = tokio::spawn(server.serve(watch));
    TestServer { addr, stats, handler, drain: Some(trigger), task }
}

/// A server on 127.0.0.1 whose only workload is `who`.
pub async fn start_server(mesh: &Mesh, who: &SpiffeId, config: ServerConfig) -> TestServer {
    start_server_on(mesh, "127.0.0.1:0".parse().unwrap(), &[(LOCALHOST, who.clone())], config).await
}

/// A bare h2 client over our TLS configuration, for requests the pool
/// would never send.
pub async fn raw_h2(mesh: &Mesh, client: &SpiffeId, server: SocketAddr, expected: &SpiffeId) -> h2::client::SendRequest<Bytes> {
    let cert = mesh.cert(client).await;
    let config = client_config(&cert, cert.roots(), std::slice::from_ref(expected)).unwrap();
    let tcp = TcpStream::connect(server).await.unwrap();
    let tls = TlsConnector::from(config).connect(ServerName::IpAddress(server.ip().into()), tcp).await.unwrap();
    let (send, connection) = h2::client::handshake(tls).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    send
}

/// Reads until EOF, with a time limit.
pub async fn read_all<R: tokio::io::AsyncRead + Unpin>(r: &mut R) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), r.read_to_end(&mut out)).await.expect("read_to_end timed out")?;
    Ok(out)
}
