//! Inbound: HBONE on `<pod IP>:15008` (the server checks the protocol; this
//! module picks the certificate and connects to the app) and plaintext on
//! :15006 from outside the mesh. Either way the app sees the client pod's
//! IP as the source address.

use crate::conn::{ConnInfo, ConnRecord};
use crate::inpod::LocalPod;
use crate::limits::{Kind, Source};
use crate::metrics::{Reporter, ResponseFlag};
use crate::proxy::Shared;
use crate::selfcall::{self_call, Side};
use crate::sockets::{original_dst, reset};
use futures_util::future::BoxFuture;
use slipstream_hbone::{
    Admission, AdmissionRefused, CertResolver, Handler, HandshakeFailureKind, HboneError, InboundRequest, ResolveError, Upstream,
};
use slipstream_identity::{SpiffeId, WorkloadCert};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The server presents the destination workload's own certificate.
pub struct Certs(pub Arc<Shared>);

impl CertResolver for Certs {
    fn resolve(&self, local_ip: IpAddr) -> BoxFuture<'_, Result<Arc<WorkloadCert>, ResolveError>> {
        Box::pin(async move {
            let w = self
                .0
                .pods
                .get(local_ip)
                .and_then(|p| self.0.snapshot.borrow().mesh.workload(&p.uid))
                .ok_or(ResolveError::NoWorkload(local_ip))?;
            let id = workload_id(&self.0, &w).map_err(|_| ResolveError::NoWorkload(local_ip))?;
            self.0.certs.fetch_certificate(&id).await.map_err(|source| ResolveError::Fetch { ip: local_ip, source })
        })
    }
}

pub fn workload_id(shared: &Shared, w: &slipstream_core::Workload) -> Result<SpiffeId, slipstream_identity::SpiffeIdError> {
    let _ = shared;
    w.spiffe_id().parse()
}

pub struct HboneHandler {
    pub shared: Arc<Shared>,
    pub pod: LocalPod,
}

impl Handler for HboneHandler {
    fn connect<'a>(&'a self, req: &'a InboundRequest) -> BoxFuture<'a, Result<Box<dyn Upstream>, HboneError>> {
        Box::pin(async move {
            let snap = self.shared.snapshot.borrow().clone();
            let dst = snap.mesh.workload(&self.pod.uid);
            let src = snap.mesh.workload_by_ip(req.peer_addr.ip());
            let service = addressed_service(&snap.mesh, &req.headers);
            let info = ConnInfo {
                reporter: Reporter::Destination,
                src_addr: req.peer_addr,
                src,
                src_identity: req.peer_identity.to_string(),
                dst_addr: req.target,
                hbone_addr: Some(req.tunnel_local),
                dst: dst.clone(),
                dst_identity: dst.as_ref().map(|w| w.spiffe_id()).unwrap_or_default(),
                service,
                mutual_tls: true,
            };
            let record = ConnRecord::open(info, self.shared.telemetry.clone());
            // The peer's streams across all its tunnels, and one descriptor
            // (the app socket) of the node's budget: atomics on the peer's
            // counters found when its connection was admitted.
            let peer = match req.context.clone().map(Arc::downcast::<Source>) {
                Some(Ok(peer)) => peer,
                _ => self.shared.limits.peer(req.peer_addr.ip()),
            };
            let record = match peer.take(Kind::PeerStreams, 1) {
                Ok(held) => record.holding(held),
                Err(over) => {
                    let e = match over.flag {
                        ResponseFlag::Overload => HboneError::Overloaded(over.limit),
                        _ => HboneError::SourceLimit { peer: req.peer_addr.ip(), what: over.what, limit: over.limit },
                    };
                    record.refuse(over.flag, e.to_string(), &req.peer_addr.ip().to_canonical().to_string());
                    return Err(e);
                }
            };
            if dst.is_none() {
                let e = HboneError::NoWorkload(req.target);
                record.close(0, 0, Some((e.flag(), e.to_string())));
                return Err(e);
            }
            let principal = req.peer_identity.principal();
            if let Err(why) = crate::authz::authorize(&self.shared, &self.pod.uid, Some(&principal), req.peer_addr, req.target) {
                let e = HboneError::denied(why);
                record.close(0, 0, Some((ResponseFlag::Deny, e.to_string())));
                return Err(e);
            }
            match self.pod.sockets.connect_transparent(req.peer_addr.ip(), req.target, self.shared.config.connect_timeout).await {
                Ok(s) => {
                    let m =
                        Metered::new(s, record).tracked(&self.shared, &self.pod.uid, Some(principal.clone()), req.peer_addr, req.target);
                    Ok(Box::new(m) as Box<dyn Upstream>)
                }
                Err(e) => {
                    let err = HboneError::Connect { addr: req.target, source: Arc::new(e) };
                    record.close(0, 0, Some((err.flag(), err.to_string())));
                    Err(err)
                }
            }
        })
    }

    fn on_stream_end(&self, record: &slipstream_hbone::StreamRecord) {
        crate::refusals::record_refused_stream(&self.shared, &self.pod, record);
    }

    fn on_handshake_failure(&self, failure: &slipstream_hbone::HandshakeFailure) {
        crate::refusals::record_handshake_failure(&self.shared, failure);
    }

    /// A new TCP connection on :15008, before its handshake: the peer's
    /// open connections (with one descriptor of the node's budget) and
    /// pending handshakes. The peer's counters are looked up here, once, and
    /// carried to every stream of the connection.
    fn admit(&self, peer_addr: SocketAddr, _local: SocketAddr) -> Result<Admission, AdmissionRefused> {
        let peer = self.shared.limits.peer(peer_addr.ip());
        let refused = |over: crate::limits::OverLimit, kind| {
            let kind = if over.flag == ResponseFlag::Overload { HandshakeFailureKind::Overload } else { kind };
            AdmissionRefused { kind, detail: over.to_string() }
        };
        let conn = peer.take(Kind::PeerConnections, 1).map_err(|o| refused(o, HandshakeFailureKind::PeerConnectionLimit))?;
        let handshake = peer.take(Kind::PeerHandshakes, 0).map_err(|o| refused(o, HandshakeFailureKind::PeerHandshakeLimit))?;
        Ok(Admission { handshake: Some(Box::new(handshake)), connection: Some(Box::new(conn)), context: Some(peer) })
    }
}

/// Plaintext from outside the mesh to a meshed pod (PeerAuthentication
/// PERMISSIVE, the default): passed to the app with the client's address.
pub async fn handle_plaintext(shared: Arc<Shared>, pod: LocalPod, client: TcpStream, peer: SocketAddr) {
    let Ok(dst) = original_dst(&client) else {
        shared.telemetry.metrics.rejected(ResponseFlag::ProtocolError);
        return;
    };
    let snap = shared.snapshot.borrow().clone();
    let w = snap.mesh.workload(&pod.uid);
    let info = ConnInfo {
        reporter: Reporter::Destination,
        src_addr: peer,
        src: snap.mesh.workload_by_ip(peer.ip()),
        src_identity: String::new(),
        dst_addr: dst,
        hbone_addr: None,
        dst: w.clone(),
        dst_identity: w.as_ref().map(|w| w.spiffe_id()).unwrap_or_default(),
        service: None,
        mutual_tls: false,
    };
    let record = ConnRecord::open(info, shared.telemetry.clone());
    // Refusal lines are limited per source: its name, only when refused.
    let source = || peer.ip().to_canonical().to_string();
    // The same rule as outbound: an in-pod listener's port here would loop.
    if let Some(why) = self_call(Side::Inbound, dst, std::slice::from_ref(&pod.ip)) {
        reset(&client);
        record.refuse(ResponseFlag::SelfCall, why.to_string(), &source());
        return;
    }
    // The peer's plaintext connections; two descriptors (client and app).
    let record = match shared.limits.peer(peer.ip()).take(Kind::PeerPlaintext, 2) {
        Ok(held) => record.holding(held),
        Err(over) => {
            reset(&client);
            record.refuse(over.flag, over.to_string(), &source());
            return;
        }
    };
    // PeerAuthentication STRICT arrives as a DENY policy on connections
    // without a peer identity, which is what plaintext is.
    if let Err(why) = crate::authz::authorize(&shared, &pod.uid, None, peer, dst) {
        reset(&client);
        record.close(0, 0, Some((ResponseFlag::Deny, format!("plaintext refused: {why}"))));
        return;
    }
    match pod.sockets.connect_transparent(peer.ip(), dst, shared.config.connect_timeout).await {
        Ok(app) => {
            let mut app = Metered::new(app, record).tracked(&shared, &pod.uid, None, peer, dst);
            let mut client = client;
            let _ = tokio::io::copy_bidirectional_with_sizes(&mut client, &mut app, 64 * 1024, 64 * 1024).await;
        }
        Err(e) => record.close(0, 0, Some((ResponseFlag::Connect, format!("connect to {dst}: {e}")))),
    }
}

/// The app side of an inbound connection: counts bytes each way and closes
/// the connection's record when dropped (end of stream, error or reset).
pub struct Metered {
    inner: TcpStream,
    to_app: u64,
    from_app: u64,
    failed: Option<String>,
    record: Option<ConnRecord>,
    /// In the open-connection tracker while alive (policy re-evaluation).
    _tracked: Option<crate::tracker::Registration>,
}

impl Metered {
    pub fn new(inner: TcpStream, record: ConnRecord) -> Self {
        Metered { inner, to_app: 0, from_app: 0, failed: None, record: Some(record), _tracked: None }
    }

    /// Registers the connection so a later policy change can close it.
    pub fn tracked(mut self, shared: &Shared, pod_uid: &str, principal: Option<String>, src: SocketAddr, dst: SocketAddr) -> Self {
        self._tracked = Some(shared.tracker.register(&self.inner, pod_uid, principal, src, dst));
        self
    }
    fn note<T>(&mut self, r: &Poll<io::Result<T>>) {
        if let Poll::Ready(Err(e)) = r {
            self.failed.get_or_insert_with(|| e.to_string());
        }
    }
}

impl Drop for Metered {
    fn drop(&mut self) {
        // Leave the tracker before `inner` (a field, dropped after this
        // body) closes the socket: the tracker holds its raw descriptor.
        drop(self._tracked.take());
        if let Some(r) = self.record.take() {
            let failure = self.failed.take().map(|e| (ResponseFlag::ConnectionTerminated, e));
            r.close(self.to_app, self.from_app, failure);
        }
    }
}

impl AsyncRead for Metered {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        self.from_app += (buf.filled().len() - before) as u64;
        self.note(&r);
        r
    }
}

impl AsyncWrite for Metered {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.to_app += n as u64;
        }
        self.note(&r);
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The service the client addressed, from the `forwarded` header's `host=`
/// (the source proxy adds it when the app dialed a service).
fn addressed_service(mesh: &slipstream_core::MeshState, headers: &http::HeaderMap) -> Option<Arc<slipstream_core::Service>> {
    let f = headers.get("forwarded")?.to_str().ok()?;
    let host = f.split(';').find_map(|p| p.trim().strip_prefix("host="))?.trim_matches('"');
    // name.namespace.svc.<domain>
    let ns = host.split('.').nth(1)?;
    mesh.service(&format!("{ns}/{host}"))
}
