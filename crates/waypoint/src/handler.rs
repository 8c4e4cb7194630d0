//! The HBONE side: which tunnels the waypoint accepts (those for a
//! service or pod bound to it, from a verified peer), and serving HTTP on
//! each one.

use crate::peer::Peer;
use crate::plan::{self, Target};
use crate::Shared;
use futures_util::future::BoxFuture;
use hyper_util::rt::{TokioExecutor, TokioIo};
use slipstream_hbone::drain::Stage;
use slipstream_hbone::{
    Admission, AdmissionRefused, Handler, HandshakeFailureKind, HboneError, InPlace, InboundRequest, ResponseFlag, Upstream,
};
use std::net::SocketAddr;
use std::sync::Arc;

/// Streams an HTTP/2 client may reset before the waypoint has served them,
/// at once (h2's default, stated).
const H2_PENDING_RESETS: usize = 20;
/// Streams the waypoint may reset for the client's errors on one HTTP/2
/// connection before it closes it (hyper's default, stated).
const H2_ERROR_RESETS: usize = 1024;
/// The largest header block (HTTP/2: all its CONTINUATION frames) a
/// request may have.
const MAX_HEADER_LIST: u32 = 64 * 1024;

/// How long a client may take to send a request's headers.
const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

pub struct WaypointHandler {
    pub(crate) shared: Arc<Shared>,
}

impl Handler for WaypointHandler {
    fn connect<'a>(&'a self, request: &'a InboundRequest) -> BoxFuture<'a, Result<Box<dyn Upstream>, HboneError>> {
        Box::pin(async move {
            // A client that broke connections on purpose (rapid resets,
            // CONTINUATION floods) waits out its cool-down before the next:
            // refused first, at the least cost, with `retry-after`, so its
            // node proxy refuses it there until then.
            let now = std::time::Instant::now();
            if let Some(until) = self.shared.strikes.cooling(request.peer_addr.ip(), now) {
                let ip = request.peer_addr.ip();
                let left = until.saturating_duration_since(now);
                if self.shared.refusals.check(&ip, now) == slipstream_proxy::limits::LogDecision::Log {
                    tracing::warn!(peer = %ip, identity = %request.peer_identity, "stream refused: cooling down for {left:?} after connections it broke on purpose");
                }
                return Err(HboneError::CoolingDown { peer: ip, secs: left.as_secs().max(1) as u32 });
            }
            let state = self.shared.mesh.load_full();
            let target = plan::target(&state, &self.shared.me, request.target).map_err(|e| {
                tracing::info!(peer = %request.peer_identity, target = %request.target, "tunnel refused: {e}");
                HboneError::NoWorkload(request.target)
            })?;
            // The peer's streams across all its tunnels, held for as long
            // as this one lasts: one pod holds at most its share of the
            // waypoint every bound service shares, however its node proxy
            // pools them.
            let source = match request.context.clone().map(Arc::downcast::<slipstream_proxy::limits::Source>) {
                Some(Ok(source)) => source,
                _ => self.shared.limits.peer(request.peer_addr.ip()),
            };
            let held = source.take(slipstream_proxy::limits::Kind::PeerStreams, 0).map_err(|over| {
                let ip = request.peer_addr.ip();
                let now = std::time::Instant::now();
                for (quiet, n) in self.shared.refusals.summaries(now) {
                    tracing::warn!(peer = %quiet, "{n} more streams refused over the peer's bound");
                }
                if let n @ 1.. = self.shared.refusals.take_untracked() {
                    tracing::warn!("{n} more refusals of peers no longer tracked not logged (too many peers at once)");
                }
                if self.shared.refusals.check(&ip, now) == slipstream_proxy::limits::LogDecision::Log {
                    tracing::warn!(peer = %ip, identity = %request.peer_identity, target = %request.target, "stream refused: {over}");
                }
                HboneError::SourceLimit { peer: ip, what: over.what, limit: over.limit }
            })?;
            let peer = Peer { identity: request.peer_identity.clone(), addr: request.peer_addr };
            let shared = self.shared.clone();
            let serve: InPlace = Box::new(move |tunnel| {
                Box::pin(async move {
                    serve(shared, tunnel, target, peer).await;
                    drop(held);
                })
            });
            Ok(Box::new(InPlaceServer(Some(serve))) as Box<dyn Upstream>)
        })
    }

    /// As the node proxy's HBONE port: a peer address holds a bounded
    /// number of connections, handshakes and (in `connect`) streams, and
    /// the process a bounded number of descriptors; a connection over its
    /// bound is reset before TLS, a stream answered 503 with `SourceLimit`.
    fn admit(&self, peer_addr: SocketAddr, _local: SocketAddr) -> Result<Admission, AdmissionRefused> {
        use slipstream_proxy::limits::Kind;
        let peer = self.shared.limits.peer(peer_addr.ip());
        let refused = |over: slipstream_proxy::limits::OverLimit, kind| {
            let kind = if over.flag == ResponseFlag::Overload { HandshakeFailureKind::Overload } else { kind };
            AdmissionRefused { kind, detail: over.to_string() }
        };
        let conn = peer.take(Kind::PeerConnections, 1).map_err(|o| refused(o, HandshakeFailureKind::PeerConnectionLimit))?;
        let handshake = peer.take(Kind::PeerHandshakes, 0).map_err(|o| refused(o, HandshakeFailureKind::PeerHandshakeLimit))?;
        // The peer's counters, found once and handed to every stream.
        Ok(Admission { handshake: Some(Box::new(handshake)), connection: Some(Box::new(conn)), context: Some(peer), window: None })
    }

    fn accepts_foreign_target(&self, _tunnel_local: SocketAddr, target: SocketAddr) -> bool {
        plan::target(&self.shared.mesh.load(), &self.shared.me, target).is_ok()
    }
}

/// The waypoint serves HTTP on the tunnel itself (no copy into a pipe):
/// the HBONE server takes [`Upstream::serve_in_place`] and never reads or
/// writes this.
struct InPlaceServer(Option<InPlace>);

impl Upstream for InPlaceServer {
    fn serve_in_place(&mut self) -> Option<InPlace> {
        self.0.take()
    }
}

impl tokio::io::AsyncRead for InPlaceServer {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        _: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Err(std::io::ErrorKind::Unsupported.into()))
    }
}

impl tokio::io::AsyncWrite for InPlaceServer {
    fn poll_write(self: std::pin::Pin<&mut Self>, _: &mut std::task::Context<'_>, _: &[u8]) -> std::task::Poll<std::io::Result<usize>> {
        std::task::Poll::Ready(Err(std::io::ErrorKind::Unsupported.into()))
    }
    fn poll_flush(self: std::pin::Pin<&mut Self>, _: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: std::pin::Pin<&mut Self>, _: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// Says why an HTTP connection ended in error: what did not parse as HTTP
/// (answered 400 by hyper) or a client that did not send its headers in
/// time is logged, at most a few lines per peer per 10 s; an ordinary end
/// (the client went away) is not.
fn not_http(shared: &Shared, target: &Target, peer: &Peer, e: &(dyn std::error::Error + 'static)) {
    let now = std::time::Instant::now();
    if crate::fair::broken_on_purpose(e) {
        let struck = shared.strikes.strike(peer.addr.ip(), now);
        if shared.refusals.check(&peer.addr.ip(), now) == slipstream_proxy::limits::LogDecision::Log {
            let then = match struck {
                crate::fair::Struck::Counted(n) => format!("strike {n} of {}", shared.settings.fairness.strikes),
                crate::fair::Struck::CoolingDown(_) => {
                    format!("its new connections are refused for {:?}", shared.settings.fairness.cool_down)
                }
            };
            tracing::warn!(
                target: slipstream_core::ACCESS_LOG_TARGET,
                protocol = "http",
                target = %target.name(),
                src = %peer.identity,
                peer = %peer.addr,
                error = %e,
                "connection closed: the client broke HTTP/2 on purpose (resets, CONTINUATION or header floods); {then}"
            );
        }
        return;
    }
    let Some(h) = e.downcast_ref::<hyper::Error>() else {
        tracing::debug!("tunnel's HTTP connection ended: {e}");
        return;
    };
    let why = if h.is_parse() || h.is_parse_status() {
        "not HTTP, on a port declared HTTP (or undeclared and sniffed as HTTP): answered 400"
    } else if h.is_timeout() {
        "headers not sent in time: closed"
    } else {
        tracing::debug!("tunnel's HTTP connection ended: {e}");
        return;
    };
    for (quiet, n) in shared.refusals.summaries(now) {
        tracing::info!(target: slipstream_core::ACCESS_LOG_TARGET, peer = %quiet, "{n} more connections refused as not HTTP or too slow");
    }
    if shared.refusals.check(&peer.addr.ip(), now) == slipstream_proxy::limits::LogDecision::Log {
        tracing::info!(
            target: slipstream_core::ACCESS_LOG_TARGET,
            protocol = "http",
            target = %target.name(),
            src = %peer.identity,
            peer = %peer.addr,
            error = %e,
            "connection refused: {why}"
        );
    }
}

/// How long the waypoint waits for a client's first bytes before it takes
/// the connection for a protocol where the server speaks first (TCP).
const SNIFF_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(300);

/// HTTP/1.1 or HTTP/2 (prior knowledge) on one tunnel, request by request;
/// anything else passed through as TCP (`crate::sniff`).
async fn serve(shared: Arc<Shared>, mut io: slipstream_hbone::TunnelStream, target: Target, peer: Peer) {
    use crate::sniff::{sniff, Sniffed, MAX_SNIFF};
    use tokio::io::AsyncReadExt;
    let handling = plan::handling(&target);
    let mut first = Vec::with_capacity(MAX_SNIFF);
    let deadline = tokio::time::Instant::now() + SNIFF_TIMEOUT;
    // A port declared HTTP is HTTP whatever the client sends first (a
    // leading CRLF, a lowercase method, a slow first byte, TLS): only what
    // tells HTTP/2 from HTTP/1.1 is read ahead. One declared TCP is TCP.
    let http = loop {
        let seen = sniff(&first);
        match (handling, seen) {
            (plan::Handling::Tcp, _) => break false,
            (plan::Handling::Sniff, Sniffed::Http) => break true,
            (plan::Handling::Sniff, Sniffed::Tcp) => break false,
            (plan::Handling::Http, _) if !crate::sniff::H2_PREFACE.starts_with(&first) || first.len() >= crate::sniff::H2_PREFACE.len() => {
                break true
            }
            _ => {}
        }
        let mut buf = [0u8; MAX_SNIFF];
        let want = MAX_SNIFF - first.len();
        match tokio::time::timeout_at(deadline, io.read(&mut buf[..want])).await {
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(n)) => first.extend_from_slice(&buf[..n]),
            // Declared HTTP: HTTP/1.1, whose header timeout then applies.
            Err(_) if handling == plan::Handling::Http => break true,
            // The server speaks first, or a client this slow is not HTTP.
            Err(_) => break false,
        }
    };
    let h2 = first.starts_with(crate::sniff::H2_PREFACE);
    let io = crate::tcp::Prefixed::new(first, io);
    if !http {
        return crate::tcp::passthrough(shared, &target, &peer, io).await;
    }
    let io = TokioIo::new(io);
    let target = Arc::new(target);
    let mut stage = shared.drain.watch();
    let (log_shared, log_target, log_peer) = (shared.clone(), target.clone(), peer.clone());
    let service = hyper::service::service_fn(move |req| crate::proxy::handle(shared.clone(), target.clone(), peer.clone(), req));
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    // A client that never finishes its headers does not hold the tunnel.
    builder.http1().timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
    // HTTP/2: bounded per connection, stated rather than left to hyper's
    // defaults (docs/waypoint.md, "Fairness"): concurrent requests, resets
    // of streams not yet served (rapid reset), streams reset for errors,
    // and the header block, CONTINUATION frames included. h2 ends a
    // connection past them with GOAWAY ENHANCE_YOUR_CALM, which counts as
    // a strike against the client (`not_http`).
    builder
        .http2()
        .timer(hyper_util::rt::TokioTimer::new())
        .max_concurrent_streams(log_shared.settings.fairness.h2_max_streams)
        .max_pending_accept_reset_streams(H2_PENDING_RESETS)
        .max_local_error_reset_streams(Some(H2_ERROR_RESETS))
        .max_header_list_size(MAX_HEADER_LIST);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    // A tunnel that opens during a drain sees its stage at once.
    stage.mark_changed();
    let mut shut = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    not_http(&log_shared, &log_target, &log_peer, e.as_ref());
                }
                return;
            }
            Some(now) = stage.changed(), if !shut => {
                // HTTP/2: GOAWAY at once (the client opens its next streams
                // elsewhere, open ones finish). HTTP/1: each answer closes
                // its connection (`proxy::handle`) until idle ones are
                // closed too, at the end of the drain.
                if now == Stage::Closed || (h2 && now >= Stage::Closing) {
                    conn.as_mut().graceful_shutdown();
                    shut = true;
                }
            }
        }
    }
}
