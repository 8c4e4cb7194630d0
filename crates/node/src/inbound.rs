//! Inbound: HBONE on `<pod IP>:15008` (the HBONE server checks the protocol;
//! this module picks the certificate, decides and connects to the app) and
//! plaintext on :15006 from outside the mesh. [`plan`] decides once over one
//! mesh snapshot (pure: table tests, no sockets); the handlers carry it out.
//! Either way the app sees the client pod's IP as the source address.

use crate::error::ProxyError;
use crate::selfcall::{self_call, Side};
use crate::sockets::reset;
use crate::state::{LocalPod, Shared};
use crate::telemetry::{AppSide, ConnInfo, ConnRecord, Metered, Reporter, SrcIdentity};
use futures_util::future::BoxFuture;
use slipstream_core::{MeshState, MeshWorkload, SpiffeId};
use slipstream_hbone::{
    Admission, AdmissionRefused, CertResolver, Handler, HandshakeFailure, HandshakeFailureKind, HboneError, InboundRequest, ResolveError,
    ResponseFlag, StreamRecord, Upstream,
};
use slipstream_identity::WorkloadCert;
use slipstream_proxy::authz;
use slipstream_proxy::authz::AuthzKey;
use slipstream_proxy::limits::{Kind, Source};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use tokio::net::TcpStream;

/// An inbound connection, as the planner sees it.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The local pod whose listener took the connection.
    pub pod_uid: &'a str,
    pub pod_ip: IpAddr,
    /// The verified peer identity; None for plaintext.
    pub peer: Option<&'a SpiffeId>,
    pub src_addr: SocketAddr,
    /// The target: the CONNECT authority, or the original destination.
    pub dst: SocketAddr,
    /// HBONE only: the tunnel's local address, `<pod IP>:15008`.
    pub tunnel_local: Option<SocketAddr>,
    /// The `forwarded` header (the service the client addressed).
    pub forwarded: Option<&'a str>,
}

/// Where an allowed connection goes.
#[derive(Debug, Clone)]
pub struct Target {
    /// The app's address.
    pub app: SocketAddr,
    /// The source address the app sees (the client's).
    pub src_ip: IpAddr,
    /// What a policy change re-decides the open connection from.
    pub authz: AuthzKey,
}

/// One decision: the connection's telemetry, and where it goes or why not.
#[derive(Debug, Clone)]
pub struct Plan {
    pub info: ConnInfo,
    pub target: Result<Target, ProxyError>,
    /// Dry-run policies that matched (logged, never deciding).
    pub dry_run: Vec<String>,
}

pub fn plan(state: &MeshState, req: &Request<'_>) -> Plan {
    let info = describe(state, req);
    let (target, dry_run) = decide(state, req, info.dst.as_ref());
    Plan { info, target, dry_run }
}

/// What the connection's telemetry says: lookups only, no decision. The
/// handlers record with it before they take the source's slots, so a
/// source over its limits costs no policy evaluation.
pub fn describe(state: &MeshState, req: &Request<'_>) -> ConnInfo {
    let service = req.forwarded.and_then(forwarded_host).and_then(|h| state.service_by_hostname(h));
    let src = state.workload_by_ip(req.src_addr.ip());
    ConnInfo {
        reporter: Reporter::Destination,
        src_addr: req.src_addr,
        src_id: SrcIdentity::verified(req.peer, src.as_ref()),
        src,
        dst_addr: req.tunnel_local.unwrap_or(req.dst),
        hbone_addr: req.tunnel_local.map(|_| req.dst),
        dst: state.workload(req.pod_uid),
        service,
        mutual_tls: req.peer.is_some(),
    }
}

/// Where the connection goes or why not (self-call, unknown pod, policy),
/// and the dry-run policies that matched. `dst` is the pod's workload.
pub fn decide(state: &MeshState, req: &Request<'_>, dst: Option<&Arc<MeshWorkload>>) -> (Result<Target, ProxyError>, Vec<String>) {
    // The same rule as outbound: an in-pod listener's port would loop.
    if let Some(why) = self_call(Side::Inbound, req.dst, std::slice::from_ref(&req.pod_ip)) {
        return (Err(ProxyError::SelfCall(why)), Vec::new());
    }
    let Some(w) = dst else { return (Err(ProxyError::NoWorkload(req.dst)), Vec::new()) };
    let verdict = authz::authorize(state, w, authz::Conn { peer: req.peer, src: req.src_addr, dst: req.dst });
    // PeerAuthentication STRICT arrives as a DENY policy on connections
    // without a peer identity, which is what plaintext is.
    let target = match verdict.result {
        Ok(()) => Ok(Target {
            app: req.dst,
            src_ip: req.src_addr.ip(),
            authz: AuthzKey { peer: req.peer.cloned(), src: req.src_addr, dst: req.dst, outbound: false },
        }),
        Err(why) if req.peer.is_some() => Err(ProxyError::Denied(why)),
        Err(why) => Err(ProxyError::Denied(Arc::new(slipstream_proxy::denial::Denial {
            text: format!("plaintext refused: {}", why.text).into(),
            ..(*why).clone()
        }))),
    };
    (target, verdict.dry_run)
}

/// The host of a `forwarded` header's `host=` (the source proxy adds it
/// when the app dialed a service).
fn forwarded_host(f: &str) -> Option<&str> {
    f.split(';').find_map(|p| p.trim().strip_prefix("host=")).map(|h| h.trim_matches('"'))
}

fn log_dry_run(dry_run: &[String], info: &ConnInfo) {
    for policy in dry_run {
        tracing::info!(%policy, src = %info.src_addr, dst = ?info.hbone_addr.unwrap_or(info.dst_addr), "dry-run policy matched");
    }
}

/// The server presents the destination workload's own certificate.
pub struct Certs(pub Arc<Shared>);

impl CertResolver for Certs {
    fn resolve(&self, local_ip: IpAddr) -> BoxFuture<'_, Result<Arc<WorkloadCert>, ResolveError>> {
        Box::pin(async move {
            let w = self.0.pods.get(local_ip).and_then(|p| self.0.snapshot().workload(&p.uid)).ok_or(ResolveError::NoWorkload(local_ip))?;
            self.0.certs.fetch_certificate(w.identity()).await.map_err(|source| ResolveError::Fetch { ip: local_ip, source })
        })
    }
}

pub struct HboneHandler {
    pub shared: Arc<Shared>,
    pub pod: LocalPod,
}

impl Handler for HboneHandler {
    fn connect<'a>(&'a self, req: &'a InboundRequest) -> BoxFuture<'a, Result<Box<dyn Upstream>, HboneError>> {
        Box::pin(async move {
            let snap = self.shared.snapshot();
            let forwarded = req.headers.get("forwarded").and_then(|v| v.to_str().ok());
            let r = Request {
                pod_uid: &self.pod.uid,
                pod_ip: self.pod.ip,
                peer: Some(&req.peer_identity),
                src_addr: req.peer_addr,
                dst: req.target,
                tunnel_local: Some(req.tunnel_local),
                forwarded,
            };
            let info = describe(&snap, &r);
            let dst = info.dst.clone();
            let record = ConnRecord::open(info, self.shared.telemetry.clone());
            // The peer's streams across all its tunnels: atomics on the
            // counters found when its connection was admitted. Taken before
            // the decision, so a peer over its bound costs no policy check.
            let peer = match req.context.clone().map(Arc::downcast::<Source>) {
                Some(Ok(peer)) => peer,
                _ => self.shared.limits.peer(req.peer_addr.ip()),
            };
            let record = match peer.take(Kind::PeerStreams, 1) {
                Ok(held) => record.holding(held),
                Err(over) => return Err(refuse(record, over.into(), req.peer_addr.ip())),
            };
            let (target, dry_run) = decide(&snap, &r, dst.as_ref());
            log_dry_run(&dry_run, record.info());
            match target {
                Ok(t) => match connect_app(&self.shared, &self.pod, &snap, record, t).await {
                    Ok(m) => Ok(Box::new(m) as Box<dyn Upstream>),
                    Err(e) => Err(e.into_hbone(req.peer_addr.ip())),
                },
                Err(e) => Err(refuse(record, e, req.peer_addr.ip())),
            }
        })
    }

    fn on_stream_end(&self, record: &StreamRecord) {
        record_refused_stream(&self.shared, &self.pod, record);
    }

    fn on_handshake_failure(&self, failure: &HandshakeFailure) {
        record_handshake_failure(&self.shared, failure);
    }

    /// A new TCP connection on :15008, before its handshake: the peer's
    /// open connections (with one descriptor of the node's budget) and
    /// pending handshakes. The peer's counters are looked up here, once, and
    /// carried to every stream of the connection.
    fn admit(&self, peer_addr: SocketAddr, _local: SocketAddr) -> Result<Admission, AdmissionRefused> {
        let peer = self.shared.limits.peer(peer_addr.ip());
        let refused = |over: slipstream_proxy::limits::OverLimit, kind| {
            let kind = if over.flag == ResponseFlag::Overload { HandshakeFailureKind::Overload } else { kind };
            AdmissionRefused { kind, detail: over.to_string() }
        };
        let conn = peer.take(Kind::PeerConnections, 1).map_err(|o| refused(o, HandshakeFailureKind::PeerConnectionLimit))?;
        let handshake = peer.take(Kind::PeerHandshakes, 0).map_err(|o| refused(o, HandshakeFailureKind::PeerHandshakeLimit))?;
        let window: Arc<dyn slipstream_hbone::copy::BufferBudget> = peer.clone();
        Ok(Admission { handshake: Some(Box::new(handshake)), connection: Some(Box::new(conn)), context: Some(peer), window: Some(window) })
    }
}

/// Closes `record` with `e` and gives the HBONE server its answer.
fn refuse(record: ConnRecord, e: ProxyError, peer: IpAddr) -> HboneError {
    let answer = e.clone().into_hbone(peer);
    record.close(Err(e));
    answer
}

/// Connects to the app with the client's address. The connection joins the
/// pod's open ones first, so a policy change or a drain reaches it even
/// while it connects; if the mesh changed since `snap` was planned over, it
/// is decided again.
async fn connect_app(
    shared: &Shared,
    pod: &LocalPod,
    snap: &Arc<MeshState>,
    record: ConnRecord,
    t: Target,
) -> Result<Metered<TcpStream>, ProxyError> {
    let record = record.registered(pod.conns.register(Some(t.authz.clone())));
    let now = shared.snapshot();
    if !Arc::ptr_eq(snap, &now) {
        let c = authz::Conn { peer: t.authz.peer.as_ref(), src: t.authz.src, dst: t.authz.dst };
        if let Err(why) = authz::authorize_uid(&now, &pod.uid, c).result {
            let e = ProxyError::Denied(why);
            record.close(Err(e.clone()));
            return Err(e);
        }
    }
    match pod.sockets.connect_transparent(t.src_ip, t.app, shared.config.timeouts.upstream_connect).await {
        Ok(s) => Ok(Metered::new(s, record, AppSide::Server).within(pod.limits.clone())),
        Err(e) => {
            let e = ProxyError::connect(t.app, e);
            record.close(Err(e.clone()));
            Err(e)
        }
    }
}

/// Plaintext from outside the mesh to a meshed pod (PeerAuthentication
/// PERMISSIVE, the default): passed to the app with the client's address.
pub async fn handle_plaintext(shared: Arc<Shared>, pod: LocalPod, client: TcpStream, peer: SocketAddr) {
    let dst = match pod.sockets.original_dst(&client) {
        Ok(d) => d.dialed,
        Err(e) => {
            tracing::warn!(pod = %pod.uid, "{}", ProxyError::NoOriginalDestination(Arc::new(e)));
            shared.telemetry.metrics.rejected_because(ResponseFlag::ProtocolError, "no_original_destination");
            return;
        }
    };
    let snap = shared.snapshot();
    let r = Request { pod_uid: &pod.uid, pod_ip: pod.ip, peer: None, src_addr: peer, dst, tunnel_local: None, forwarded: None };
    let info = describe(&snap, &r);
    let dst_workload = info.dst.clone();
    let record = ConnRecord::open(info, shared.telemetry.clone());
    let refuse = |record: ConnRecord, e: ProxyError| {
        reset(&client);
        record.close(Err(e));
    };
    // A self-call is refused before it costs the peer a slot.
    if let Some(why) = self_call(Side::Inbound, dst, std::slice::from_ref(&pod.ip)) {
        return refuse(record, ProxyError::SelfCall(why));
    }
    // The peer's plaintext connections; two descriptors (client and app).
    // Taken before the decision, so a peer over its bound costs no policy check.
    let record = match shared.limits.peer(peer.ip()).take(Kind::PeerPlaintext, 2) {
        Ok(held) => record.holding(held),
        Err(over) => return refuse(record, over.into()),
    };
    let (target, dry_run) = decide(&snap, &r, dst_workload.as_ref());
    log_dry_run(&dry_run, record.info());
    let t = match target {
        Ok(t) => t,
        Err(e) => return refuse(record, e),
    };
    match connect_app(&shared, &pod, &snap, record, t).await {
        Ok(app) => crate::relay::copy_plain(app, client).await,
        Err(_) => reset(&client),
    }
}

/// A CONNECT the server refused before asking the handler (400 for a bad
/// request or an authority that is not the tunnel's, 503 for a proxy port):
/// one connection in the metrics and one access-log line, like the
/// refusals the handler makes itself. Streams the handler saw are its own
/// to record, so they are skipped here.
fn record_refused_stream(shared: &Shared, pod: &LocalPod, r: &StreamRecord) {
    if r.reached_handler {
        return;
    }
    // Refused streams always carry their error.
    let Err(e) = &r.result else { return };
    let snap = shared.snapshot();
    let src = snap.workload_by_ip(r.peer_addr.ip());
    let info = ConnInfo {
        reporter: Reporter::Destination,
        src_addr: r.peer_addr,
        src_id: SrcIdentity::verified(Some(&r.peer_identity), src.as_ref()),
        src,
        dst_addr: r.tunnel_local,
        // No parsable authority: the tunnel's own address is what is known.
        hbone_addr: Some(r.target.unwrap_or(r.tunnel_local)),
        dst: snap.workload(&pod.uid),
        service: None,
        mutual_tls: true,
    };
    ConnRecord::open(info, shared.telemetry.clone()).close(Err(e.clone().into()));
}

/// The response flag a connection refused at the handshake is counted with.
pub fn handshake_flag(kind: HandshakeFailureKind) -> ResponseFlag {
    match kind {
        HandshakeFailureKind::Http2 => ResponseFlag::ProtocolError,
        HandshakeFailureKind::PeerConnectionLimit | HandshakeFailureKind::PeerHandshakeLimit => ResponseFlag::SourceLimit,
        HandshakeFailureKind::Overload => ResponseFlag::Overload,
        _ => ResponseFlag::TlsFailure,
    }
}

/// A connection on :15008 that never carried a stream: not TLS, an
/// untrusted client certificate, a timeout... No workload can be named, so
/// it is counted in `slipstream_rejected_connections_total` by reason, and
/// logged with the peer's address (a few lines per peer and second at
/// most: the rest are summarised, the counter has them all).
fn record_handshake_failure(shared: &Shared, f: &HandshakeFailure) {
    let flag = handshake_flag(f.kind);
    shared.telemetry.metrics.rejected_because(flag, f.kind.as_str());
    if !shared.telemetry.log_refusal(&f.peer_addr.ip().to_canonical().to_string()) {
        return;
    }
    tracing::warn!(target: crate::telemetry::REFUSAL_TARGET, peer = %f.peer_addr, local = %f.local_addr, reason = %f.kind, %flag, "inbound HBONE connection refused: {}", f.detail);
}

#[cfg(test)]
mod tests;
