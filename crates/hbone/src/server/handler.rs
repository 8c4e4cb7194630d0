//! What the node proxy plugs into the server: certificate choice by
//! destination IP, and what to do with a validated CONNECT.

use std::any::Any;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use http::{HeaderMap, StatusCode};
use slipstream_core::SpiffeId;
use slipstream_identity::{FetchError, WorkloadCert};
use tokio::io::{AsyncRead, AsyncWrite};

use super::handshake::{HandshakeFailure, HandshakeFailureKind};
use crate::copy::CopyStats;
use crate::error::HboneError;

/// Why no certificate is available for a destination IP.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ResolveError {
    #[error("no local workload has address {0}")]
    NoWorkload(IpAddr),
    #[error("certificate for the workload at {ip}: {source}")]
    Fetch {
        ip: IpAddr,
        #[source]
        source: FetchError,
    },
}

/// Chooses the certificate the server presents: the one of the workload
/// that owns the connection's original destination IP (docs/protocols.md
/// section 2: the destination workload's own certificate, never a node
/// identity).
pub trait CertResolver: Send + Sync + 'static {
    fn resolve(&self, local_ip: IpAddr) -> BoxFuture<'_, Result<Arc<WorkloadCert>, ResolveError>>;
}

/// The application side of a tunnel.
pub trait Upstream: AsyncRead + AsyncWrite + Send + Unpin + 'static {
    /// Ready when the proxy wants the tunnel closed now (a policy change
    /// denies it, a drain reached its deadline). Polled with the copy, so
    /// it works whatever the copy is waiting for. Never, by default.
    fn poll_close(&mut self, _cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        std::task::Poll::Pending
    }

    /// How the copy ended, told once before the upstream is dropped: a
    /// clean end (`Ok`), an error on either side, or `Err` after
    /// [`Upstream::poll_close`] asked for it.
    fn finished(&mut self, _result: &Result<(), HboneError>) {}

    /// Where the copy's bulk buffer (what the upstream sends into the
    /// tunnel) takes its memory from; None: no bound but its size.
    fn buffer_budget(&self) -> Option<std::sync::Arc<dyn crate::copy::BufferBudget>> {
        None
    }

    /// Instead of being copied to: the handler serves the tunnel itself
    /// (a protocol server on it, as the waypoint's HTTP server does), one
    /// copy and one task hop fewer for every byte. Asked once, right after
    /// [`Handler::connect`] returned and the 200 went out; the upstream is
    /// then dropped unread, and the stream's record counts no bytes (the
    /// server in place counts its own). None by default.
    fn serve_in_place(&mut self) -> Option<InPlace> {
        None
    }
}

/// A tunnel's server in place ([`Upstream::serve_in_place`]): handed the
/// tunnel, it runs until the tunnel is done.
pub type InPlace = Box<dyn FnOnce(crate::stream::TunnelStream) -> BoxFuture<'static, ()> + Send>;

impl Upstream for tokio::net::TcpStream {}
impl Upstream for tokio::io::DuplexStream {}
impl<T: Upstream + ?Sized> Upstream for Box<T> {
    fn poll_close(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        (**self).poll_close(cx)
    }
    fn finished(&mut self, result: &Result<(), HboneError>) {
        (**self).finished(result)
    }
    fn serve_in_place(&mut self) -> Option<InPlace> {
        (**self).serve_in_place()
    }
}

/// A CONNECT that passed the protocol checks.
#[derive(Debug, Clone)]
pub struct InboundRequest {
    /// The verified client identity (first SPIFFE SAN of its certificate).
    pub peer_identity: SpiffeId,
    /// The TCP peer of the tunnel (the source node proxy or waypoint).
    pub peer_addr: SocketAddr,
    /// The tunnel's local address: the original destination `<ip>:15008`.
    pub tunnel_local: SocketAddr,
    /// The `:authority`.
    pub target: SocketAddr,
    /// All request headers (`baggage`, `forwarded`, `traceparent`, ...).
    pub headers: HeaderMap,
    /// What [`Handler::admit`] returned as [`Admission::context`] for this
    /// stream's connection.
    pub context: Option<ConnectionContext>,
}

/// The outcome of one CONNECT stream, for metrics and access logs.
#[derive(Debug, Clone)]
pub struct StreamRecord {
    pub peer_identity: SpiffeId,
    pub peer_addr: SocketAddr,
    pub tunnel_local: SocketAddr,
    /// `None` when the authority could not be parsed.
    pub target: Option<SocketAddr>,
    /// The status answered to the peer.
    pub status: StatusCode,
    pub bytes: CopyStats,
    pub duration: Duration,
    /// `Err` for refused streams and for tunnels that broke.
    pub result: Result<(), HboneError>,
    /// Whether [`Handler::connect`] ran for this stream. When it did, the
    /// handler has seen the stream (and may have recorded it); when it did
    /// not, the server refused it on its own checks (400, or 503 for a
    /// proxy port) and this record is the handler's only news of it.
    pub reached_handler: bool,
}

/// Something held while it lives (a slot in a limiter): dropping it
/// releases what it holds.
pub type Permit = Box<dyn Send + Sync>;

/// Something the handler found out once per connection and wants back
/// with each of its streams (the node proxy: the peer's limit counters,
/// so a stream costs no lookup). `Arc::downcast` recovers its type.
pub type ConnectionContext = std::sync::Arc<dyn Any + Send + Sync>;

/// What [`Handler::admit`] lets a new connection hold: `handshake` until
/// its TLS and HTTP/2 handshakes are over, `connection` until it closes;
/// `context` is handed to every stream of the connection in
/// [`InboundRequest::context`]. `window` is where the connection's
/// receive window comes from: what the peer may send before we read it
/// is memory we hold. The full window (`H2Config::connection_window`) is
/// taken from it for the connection's life; when it refuses, the
/// connection gets the smallest (`H2Config::min_connection_window`),
/// slower, and never refused for it. None: always the full window.
#[derive(Default)]
pub struct Admission {
    pub handshake: Option<Permit>,
    pub connection: Option<Permit>,
    pub context: Option<ConnectionContext>,
    pub window: Option<std::sync::Arc<dyn crate::copy::BufferBudget>>,
}

/// Why [`Handler::admit`] refused a connection: one of the limit kinds of
/// [`HandshakeFailureKind`], and words for the log line.
#[derive(Debug, Clone)]
pub struct AdmissionRefused {
    pub kind: HandshakeFailureKind,
    pub detail: String,
}

/// Decides what a validated CONNECT connects to.
pub trait Handler: Send + Sync + 'static {
    /// Connects to the application, or refuses: [`HboneError::NoWorkload`],
    /// [`HboneError::UnknownPort`] or [`HboneError::ProxyPort`] (503),
    /// [`HboneError::Denied`] (401), [`HboneError::Connect`] (503). The
    /// server answers 200 only after this returned the upstream.
    fn connect<'a>(&'a self, request: &'a InboundRequest) -> BoxFuture<'a, Result<Box<dyn Upstream>, HboneError>>;

    /// Whether this proxy accepts tunnels for `target` although it is not
    /// the address the tunnel arrived on: true for a waypoint serving that
    /// target.
    fn accepts_foreign_target(&self, _tunnel_local: SocketAddr, _target: SocketAddr) -> bool {
        false
    }

    /// Called for every accepted TCP connection before anything is read
    /// from it, so a peer over its limits costs no handshake. A refused
    /// connection is closed at once (reset) and reported through
    /// [`Handler::on_handshake_failure`] with the refusal's kind.
    fn admit(&self, _peer_addr: SocketAddr, _local_addr: SocketAddr) -> Result<Admission, AdmissionRefused> {
        Ok(Admission::default())
    }

    /// Called once per stream when it is finished or refused.
    fn on_stream_end(&self, _record: &StreamRecord) {}

    /// Called once per inbound connection that ended before it could carry
    /// a stream: not TLS, a rejected certificate, a timeout, no HTTP/2.
    fn on_handshake_failure(&self, _failure: &HandshakeFailure) {}
}
