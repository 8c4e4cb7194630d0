//! Connections that never become tunnels, and CONNECTs the server refuses
//! on its own: the handler hears of each exactly once, with a reason from
//! a fixed set, and the client hears why it was refused.

mod common;

use slipstream_core::sync::LockExt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures_util::future::BoxFuture;
use slipstream_core::{SpiffeId, TrustDomain};
use slipstream_hbone::drain;
use slipstream_hbone::{
    Admission, AdmissionRefused, CertSource, ConnectRequest, Handler, HandshakeFailure, HandshakeFailureKind, HboneError, InboundRequest,
    Permit, PoolConfig, ResponseFlag, Server, ServerConfig, StreamRecord, Upstream,
};
use slipstream_identity::{Ca, FetchError, WorkloadCert};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Echoes, refuses port 1 as "no workload", and records what it is told.
#[derive(Default)]
struct Recorder {
    failures: Mutex<Vec<HandshakeFailure>>,
    records: Mutex<Vec<StreamRecord>>,
    /// Admits at most this many handshakes at once (0: any number).
    max_handshakes: usize,
    handshakes: Arc<AtomicUsize>,
}

/// Counts a handshake in progress until dropped.
struct Pending(Arc<AtomicUsize>);

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Handler for Recorder {
    fn connect<'a>(&'a self, request: &'a InboundRequest) -> BoxFuture<'a, Result<Box<dyn Upstream>, HboneError>> {
        Box::pin(async move {
            if request.target.port() == 1 {
                return Err(HboneError::NoWorkload(request.target));
            }
            let (ours, theirs) = tokio::io::duplex(1024);
            tokio::spawn(async move {
                let (mut r, mut w) = tokio::io::split(theirs);
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
            Ok(Box::new(ours) as Box<dyn Upstream>)
        })
    }

    fn on_stream_end(&self, record: &StreamRecord) {
        self.records.locked().push(record.clone());
    }

    fn on_handshake_failure(&self, failure: &HandshakeFailure) {
        self.failures.locked().push(failure.clone());
    }

    fn admit(&self, _peer: SocketAddr, _local: SocketAddr) -> Result<Admission, AdmissionRefused> {
        if self.max_handshakes > 0 && self.handshakes.fetch_add(1, Ordering::SeqCst) >= self.max_handshakes {
            self.handshakes.fetch_sub(1, Ordering::SeqCst);
            return Err(AdmissionRefused { kind: HandshakeFailureKind::PeerHandshakeLimit, detail: "too many".into() });
        }
        let pending: Option<Permit> = (self.max_handshakes > 0).then(|| Box::new(Pending(self.handshakes.clone())) as Permit);
        Ok(Admission { handshake: pending, ..Admission::default() })
    }
}

impl Recorder {
    async fn wait_failures(&self, n: usize) -> Vec<HandshakeFailure> {
        wait_until_async(format!("{n} failed handshakes reported"), WAIT, || self.failures.locked().len() >= n).await;
        self.failures.locked().clone()
    }

    async fn wait_records(&self, n: usize) -> Vec<StreamRecord> {
        wait_until_async(format!("{n} stream records"), WAIT, || self.records.locked().len() >= n).await;
        self.records.locked().clone()
    }

    /// Waits until `n` handshakes hold an admission slot.
    async fn wait_handshakes(&self, n: usize, what: &str, within: Duration) {
        wait_until_async(what, within, || self.handshakes.load(Ordering::SeqCst) == n).await;
    }
}

async fn serve(mesh: &Mesh, who: &SpiffeId, config: ServerConfig) -> (SocketAddr, Arc<Recorder>, drain::DrainTrigger) {
    serve_with(mesh, who, config, Recorder::default()).await
}

async fn serve_with(
    mesh: &Mesh,
    who: &SpiffeId,
    config: ServerConfig,
    recorder: Recorder,
) -> (SocketAddr, Arc<Recorder>, drain::DrainTrigger) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let recorder = Arc::new(recorder);
    let resolver = TestResolver { certs: mesh.certs.clone(), workloads: [(LOCALHOST, who.clone())].into_iter().collect() };
    let server = Server::new(listener, mesh.server_tls(), Arc::new(resolver), recorder.clone(), config);
    let addr = server.local_addr().unwrap();
    let (trigger, watch) = drain::channel();
    tokio::spawn(server.serve(watch));
    (addr, recorder, trigger)
}

/// Sends `bytes` on plain TCP and reads what comes back until the server
/// closes.
async fn raw(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut back = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut back)).await.expect("the server closes");
    back
}

#[tokio::test]
async fn not_tls_is_named_and_answered_with_an_alert() {
    let mesh = Mesh::new();
    let (addr, rec, _drain) = serve(&mesh, &id("server"), ServerConfig::default()).await;

    let back = raw(addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(back.first(), Some(&0x15), "a TLS alert record: {back:?}");
    let back = raw(addr, &[0, 1, 2, 3]).await;
    assert_eq!(back.first(), Some(&0x15), "{back:?}");
    drop(TcpStream::connect(addr).await.unwrap());

    let f = rec.wait_failures(3).await;
    assert_eq!(f.len(), 3, "{f:#?}");
    assert_eq!(f[0].kind, HandshakeFailureKind::NotTls);
    assert!(f[0].detail.contains("plaintext HTTP"), "{}", f[0].detail);
    assert_eq!(f[1].kind, HandshakeFailureKind::NotTls);
    assert!(f[1].detail.contains("00 01 02 03"), "{}", f[1].detail);
    assert_eq!(f[2].kind, HandshakeFailureKind::Closed);
    assert!(f.iter().all(|f| f.local_addr == addr && f.peer_addr.ip() == LOCALHOST));
}

#[tokio::test]
async fn a_silent_client_is_dropped_after_the_handshake_budget() {
    let mesh = Mesh::new();
    let config = ServerConfig { handshake_timeout: Duration::from_millis(200), ..ServerConfig::default() };
    let (addr, rec, _drain) = serve(&mesh, &id("server"), config).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut buf = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await.unwrap().unwrap_or(0);
    assert_eq!(n, 0, "closed");
    let f = rec.wait_failures(1).await;
    assert_eq!(f[0].kind, HandshakeFailureKind::Timeout, "{f:#?}");
}

#[tokio::test]
async fn admission_is_asked_before_the_handshake_and_held_until_it_ends() {
    let mesh = Mesh::new();
    let recorder = Recorder { max_handshakes: 1, ..Recorder::default() };
    let (addr, rec, _drain) = serve_with(&mesh, &id("server"), ServerConfig::default(), recorder).await;
    // A silent client holds the one handshake slot.
    let silent = TcpStream::connect(addr).await.unwrap();
    rec.wait_handshakes(1, "the silent client admitted", Duration::from_secs(5)).await;
    // The next is closed at once, before any TLS, and reported once.
    let mut refused = TcpStream::connect(addr).await.unwrap();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(2), refused.read(&mut buf)).await.expect("closed at once").unwrap_or(0);
    assert_eq!(n, 0, "nothing sent, not even a TLS alert");
    let f = rec.wait_failures(1).await;
    assert_eq!((f.len(), f[0].kind, f[0].kind.as_str()), (1, HandshakeFailureKind::PeerHandshakeLimit, "peer_handshake_limit"));
    // The slot comes back when the silent client leaves.
    drop(silent);
    rec.wait_handshakes(0, "the silent client's slot given back when it closed", Duration::from_secs(5)).await;
    let back = raw(addr, b"GET / HTTP/1.1\r\n\r\n").await;
    assert_eq!(back.first(), Some(&0x15), "admitted again: it gets the TLS alert {back:?}");
    let f = rec.wait_failures(3).await;
    assert_eq!(f.iter().filter(|f| f.kind == HandshakeFailureKind::PeerHandshakeLimit).count(), 1, "{f:#?}");
    // (A refused handshake keeps its slot while it lingers to let the
    // client read the alert, up to 1 s.)
    rec.wait_handshakes(0, "every slot given back", Duration::from_secs(3)).await;
}

/// Presents one certificate whatever identity is asked for.
struct Fixed(Arc<WorkloadCert>);

impl CertSource for Fixed {
    fn fetch<'a>(&'a self, _id: &'a SpiffeId) -> BoxFuture<'a, Result<Arc<WorkloadCert>, FetchError>> {
        let c = self.0.clone();
        Box::pin(async move { Ok(c) })
    }
}

/// A client certificate for `who` from `ca`, checking servers against the
/// mesh's roots.
fn foreign_pool(mesh: &Mesh, ca: &Ca, who: &SpiffeId) -> slipstream_hbone::Pool {
    let issued = ca.issue(who, Duration::from_secs(600)).unwrap();
    let cert = WorkloadCert::new(issued.chain().to_vec(), mesh.ca.roots().clone(), issued.key().clone()).unwrap();
    slipstream_hbone::Pool::new(PoolConfig::default(), Arc::new(Fixed(Arc::new(cert))), Arc::new(slipstream_hbone::PlainConnector))
}

#[tokio::test]
async fn rejected_client_certificates_are_named_and_the_client_hears_the_alert() {
    let mesh = Mesh::new();
    let server_id = id("server");
    let (addr, rec, _drain) = serve(&mesh, &server_id, ServerConfig::default()).await;
    let target = SocketAddr::new(LOCALHOST, 80);

    // Another CA, another name: unknown issuer.
    let other_ca = Ca::generate(&TrustDomain::new("other.mesh").unwrap()).unwrap();
    // Another trust domain, signed by our CA.
    let foreign = SpiffeId::new("other.domain", "x", "y").unwrap();
    let cases = [
        (foreign_pool(&mesh, &other_ca, &id("client")), id("client"), HandshakeFailureKind::UntrustedCa),
        (foreign_pool(&mesh, &mesh.ca, &foreign), foreign.clone(), HandshakeFailureKind::TrustDomain),
    ];
    // The answer must not depend on timing (a hasty close after the alert
    // can reset the client's HTTP/2 preface before it reads the alert; on
    // loopback that is rare, across nodes it is not).
    for round in 0..10 {
        for (pool, who, kind) in &cases {
            let k = key(who, std::slice::from_ref(&server_id), addr);
            let err = pool.connect(&k, ConnectRequest::new(target)).await.unwrap_err();
            assert_eq!(err.flag(), ResponseFlag::TlsFailure, "round {round}, {kind:?}: {err}");
            assert!(err.to_string().contains("alert"), "round {round}, {kind:?}: the client hears why: {err}");
        }
    }
    let f = rec.wait_failures(20).await;
    assert_eq!(f.len(), 20);
    assert_eq!(f.iter().filter(|f| f.kind == HandshakeFailureKind::UntrustedCa).count(), 10, "{f:#?}");
    assert_eq!(f.iter().filter(|f| f.kind == HandshakeFailureKind::TrustDomain).count(), 10, "{f:#?}");
    assert!(f.iter().any(|f| f.detail.contains("spiffe://other.domain/ns/x/sa/y")));
}

#[tokio::test]
async fn a_client_expecting_another_identity_aborts_and_the_server_says_so() {
    let mesh = Mesh::new();
    let (addr, rec, _drain) = serve(&mesh, &id("server"), ServerConfig::default()).await;
    let pool = mesh.pool(PoolConfig::default());
    let k = key(&id("client"), &[id("someone-else")], addr);
    let err = pool.connect(&k, ConnectRequest::new(SocketAddr::new(LOCALHOST, 80))).await.unwrap_err();
    assert_eq!(err.flag(), ResponseFlag::IdentityError, "{err}");
    let f = rec.wait_failures(1).await;
    assert_eq!(f[0].kind, HandshakeFailureKind::PeerRejected, "{f:#?}");
}

#[tokio::test]
async fn stream_records_say_whether_the_handler_saw_the_stream() {
    let mesh = Mesh::new();
    let server_id = id("server");
    let (addr, rec, _drain) = serve(&mesh, &server_id, ServerConfig::default()).await;
    let pool = mesh.pool(PoolConfig::default());
    let k = key(&id("client"), std::slice::from_ref(&server_id), addr);
    let connect = |ip: &str, port: u16| pool.connect(&k, ConnectRequest::new(SocketAddr::new(ip.parse().unwrap(), port)));

    // Refused by the server's own checks: 400 (not the tunnel's IP), 503
    // (a proxy port). The handler never ran.
    assert!(matches!(connect("127.0.0.2", 80).await, Err(HboneError::Status(s)) if s == 400));
    assert!(matches!(connect("127.0.0.1", 15008).await, Err(HboneError::Status(s)) if s == 503));
    // Refused by the handler, and accepted by it.
    assert!(matches!(connect("127.0.0.1", 1).await, Err(HboneError::Status(s)) if s == 503));
    let mut t = connect("127.0.0.1", 80).await.unwrap();
    t.write_all(b"x").await.unwrap();
    t.shutdown().await.unwrap();
    assert_eq!(read_all(&mut t).await.unwrap(), b"x");

    let mut r = rec.wait_records(4).await;
    assert_eq!(r.len(), 4);
    r.sort_by_key(|r| (r.target.map(|t| t.port()), r.status.as_u16()));
    let seen: Vec<(u16, u16, bool)> = r.iter().map(|r| (r.target.unwrap().port(), r.status.as_u16(), r.reached_handler)).collect();
    assert_eq!(seen, vec![(1, 503, true), (80, 200, true), (80, 400, false), (15008, 503, false)]);
    assert!(rec.failures.locked().is_empty());
}
