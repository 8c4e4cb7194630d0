//! One error type for the HBONE data path. Each variant knows the HTTP status
//! an HBONE server answers with, the response flag the access log and
//! metrics carry, and which side was at fault, so the places that answer,
//! log and count cannot disagree.

use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::StatusCode;
use slipstream_core::SpiffeId;
use slipstream_identity::tls::IdentityMismatch;
use slipstream_identity::FetchError;

/// The `response_flags` label value (docs/protocols.md section 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResponseFlag {
    /// `-`: no failure.
    None,
    /// Authorization denied the connection.
    Deny,
    /// The next hop could not be reached (TCP connect, or the peer's 503).
    Connect,
    TlsFailure,
    /// The peer's certificate named none of the expected identities.
    IdentityError,
    Timeout,
    /// The peer spoke HTTP/2 or HBONE wrongly (or asked wrongly: 400).
    ProtocolError,
    /// An established tunnel broke mid-stream.
    ConnectionTerminated,
    /// The connection would loop back into the node proxy itself (its own
    /// listener or port, a loopback or local destination): refused.
    SelfCall,
    /// The source (a local pod, or a peer address) holds as many
    /// connections, handshakes or streams as it may: refused.
    SourceLimit,
    /// The node proxy's own connection budget (from its open-file limit) is
    /// spent: refused, whoever asks.
    Overload,
    /// The destination is bound to a waypoint that does not exist or has
    /// no ready endpoint: refused, never sent around it (Istio fails open
    /// here; docs/waypoint.md, "Fail closed").
    NoWaypoint,
}

impl ResponseFlag {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "-",
            Self::Deny => "DENY",
            Self::Connect => "CONNECT",
            Self::TlsFailure => "TLS_FAILURE",
            Self::IdentityError => "IDENTITY_ERROR",
            Self::Timeout => "TIMEOUT",
            Self::ProtocolError => "PROTOCOL_ERROR",
            Self::ConnectionTerminated => "CONNECTION_TERMINATED",
            Self::SelfCall => "SELF_CALL",
            Self::SourceLimit => "SOURCE_LIMIT",
            Self::Overload => "OVERLOAD",
            Self::NoWaypoint => "NO_WAYPOINT",
        }
    }
}

impl fmt::Display for ResponseFlag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which side caused a failure, from the point of view of the proxy that
/// reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The side we connect to (the peer proxy, or the application).
    Upstream,
    /// The side that connected to us (it asked for something wrong or forbidden).
    Downstream,
    /// This proxy (e.g. it has no certificate to present).
    Local,
}

/// What timed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeoutStage {
    /// TCP, TLS and HTTP/2 handshakes towards the peer.
    Connect,
    /// Waiting for the peer's answer to CONNECT.
    Response,
    /// The peer stopped answering HTTP/2 PINGs.
    Keepalive,
    /// An inbound TLS or HTTP/2 handshake.
    Handshake,
}

impl fmt::Display for TimeoutStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Connect => "connecting to the peer",
            Self::Response => "waiting for the CONNECT response",
            Self::Keepalive => "waiting for a PING answer",
            Self::Handshake => "in the inbound handshake",
        })
    }
}

/// Everything that can fail on an HBONE tunnel, client or server side.
/// Cheap to clone, so one failed dial can be reported to every waiter.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HboneError {
    // ----- dialing -----
    #[error("TCP connect to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: Arc<io::Error>,
    },
    #[error("TLS with {addr}: {source}")]
    Tls {
        addr: SocketAddr,
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
    #[error("TLS with {addr}: {mismatch}")]
    IdentityMismatch { addr: SocketAddr, mismatch: Arc<IdentityMismatch> },
    #[error("no certificate for {identity}: {source}")]
    Certificate {
        identity: SpiffeId,
        #[source]
        source: Arc<FetchError>,
    },
    #[error("timed out {0}")]
    Timeout(TimeoutStage),
    #[error("HTTP/2: {0}")]
    H2(Arc<h2::Error>),
    /// The peer answered the CONNECT with this non-200 status.
    #[error("the peer answered {0}")]
    Status(StatusCode),

    // ----- answering a CONNECT (server side) -----
    #[error("bad request: {0}")]
    BadRequest(&'static str),
    #[error("authority {authority} does not belong to the tunnel destination {tunnel}")]
    AuthorityMismatch { authority: SocketAddr, tunnel: IpAddr },
    #[error("no local workload has address {0}")]
    NoWorkload(SocketAddr),
    #[error("workload at {0} does not serve that port")]
    UnknownPort(SocketAddr),
    #[error("port {0} is one of the node proxy's own ports")]
    ProxyPort(u16),
    #[error("denied by authorization policy: {0}")]
    Denied(Arc<str>),
    /// The peer holds as many of something as it may (`what` names it,
    /// e.g. "open streams").
    #[error("source limit: peer {peer} already holds {limit} {what}")]
    SourceLimit { peer: IpAddr, what: &'static str, limit: u32 },
    /// The peer is refused new streams for `secs` more seconds (it broke
    /// connections on purpose): answered 503 with `retry-after`, which the
    /// peer's proxy honours for that source.
    #[error("source {peer} is cooling down for {secs}s")]
    CoolingDown { peer: IpAddr, secs: u32 },
    /// The peer answered `status` with `retry-after: secs`: this source is
    /// to hold off for that long.
    #[error("the peer refused the stream ({status}) and asked this source to hold off for {secs}s")]
    RetryAfter { status: StatusCode, secs: u32 },
    #[error("the node proxy's connection budget ({0}) is spent")]
    Overloaded(u32),

    // ----- after the tunnel is up -----
    #[error("tunnel I/O: {0}")]
    Io(Arc<io::Error>),
}

// Every `Result` of the data path carries this type: keep it small.
const _: () = assert!(std::mem::size_of::<HboneError>() <= 64);

impl HboneError {
    pub fn io(e: io::Error) -> Self {
        Self::Io(Arc::new(e))
    }

    pub fn denied(reason: impl Into<Arc<str>>) -> Self {
        Self::Denied(reason.into())
    }

    /// The status an HBONE server answers when this error stops a CONNECT
    /// (docs/protocols.md section 2), or the status the peer answered.
    pub fn response_code(&self) -> StatusCode {
        match self {
            Self::Status(code) | Self::RetryAfter { status: code, .. } => *code,
            Self::BadRequest(_) | Self::AuthorityMismatch { .. } => StatusCode::BAD_REQUEST,
            Self::Denied(_) => StatusCode::UNAUTHORIZED,
            // No such workload or port, a proxy port, or the app refused /
            // did not answer in time: all "service unavailable" to the peer.
            Self::NoWorkload(_)
            | Self::UnknownPort(_)
            | Self::ProxyPort(_)
            | Self::SourceLimit { .. }
            | Self::CoolingDown { .. }
            | Self::Overloaded(_)
            | Self::Connect { .. }
            | Self::Timeout(_)
            | Self::Tls { .. }
            | Self::IdentityMismatch { .. }
            | Self::Certificate { .. }
            | Self::H2(_)
            | Self::Io(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    pub fn flag(&self) -> ResponseFlag {
        match self {
            Self::Connect { .. } | Self::NoWorkload(_) | Self::UnknownPort(_) | Self::ProxyPort(_) => ResponseFlag::Connect,
            Self::Tls { .. } | Self::Certificate { .. } => ResponseFlag::TlsFailure,
            Self::IdentityMismatch { .. } => ResponseFlag::IdentityError,
            Self::Timeout(_) => ResponseFlag::Timeout,
            Self::Denied(_) => ResponseFlag::Deny,
            Self::SourceLimit { .. } | Self::CoolingDown { .. } | Self::RetryAfter { .. } => ResponseFlag::SourceLimit,
            Self::Overloaded(_) => ResponseFlag::Overload,
            Self::Status(code) => match *code {
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => ResponseFlag::Deny,
                StatusCode::SERVICE_UNAVAILABLE | StatusCode::BAD_GATEWAY => ResponseFlag::Connect,
                StatusCode::GATEWAY_TIMEOUT => ResponseFlag::Timeout,
                _ => ResponseFlag::ProtocolError,
            },
            Self::H2(_) | Self::BadRequest(_) | Self::AuthorityMismatch { .. } => ResponseFlag::ProtocolError,
            Self::Io(_) => ResponseFlag::ConnectionTerminated,
        }
    }

    /// How long the source is to hold off, when the answer says so.
    pub fn retry_after(&self) -> Option<u32> {
        match self {
            Self::CoolingDown { secs, .. } | Self::RetryAfter { secs, .. } => Some(*secs),
            _ => None,
        }
    }

    pub fn fault(&self) -> Fault {
        match self {
            Self::Certificate { .. } | Self::Overloaded(_) => Fault::Local,
            Self::BadRequest(_)
            | Self::AuthorityMismatch { .. }
            | Self::NoWorkload(_)
            | Self::UnknownPort(_)
            | Self::ProxyPort(_)
            | Self::SourceLimit { .. }
            | Self::CoolingDown { .. }
            | Self::RetryAfter { .. }
            | Self::Denied(_) => Fault::Downstream,
            Self::Connect { .. }
            | Self::Tls { .. }
            | Self::IdentityMismatch { .. }
            | Self::Timeout(_)
            | Self::H2(_)
            | Self::Status(_)
            | Self::Io(_) => Fault::Upstream,
        }
    }

    /// Classifies an HTTP/2 error. `tls_error` is the TLS failure recorded
    /// on the connection, if any: then the HTTP/2 error is only its echo
    /// (for example the alert a server sends after rejecting our client
    /// certificate, which in TLS 1.3 arrives after our handshake finished).
    pub(crate) fn from_h2(err: h2::Error, addr: SocketAddr, tls_error: Option<&rustls::Error>) -> Self {
        match tls_error {
            Some(tls) => Self::Tls { addr, source: Arc::new(tls.clone()) },
            None => Self::H2(Arc::new(err)),
        }
    }

    /// Whether a CONNECT that failed this way was certainly not seen by the
    /// peer's application, so it may be retried on another connection.
    pub(crate) fn is_retryable(&self) -> bool {
        match self {
            // A graceful GOAWAY (NO_ERROR: the peer drains) refuses streams
            // for a reason another connection does not share. An error
            // GOAWAY (the peer found this request abusive, e.g. headers far
            // over its limit) would only repeat on the next connection.
            Self::H2(e) => (e.is_go_away() && e.reason() == Some(h2::Reason::NO_ERROR)) || e.reason() == Some(h2::Reason::REFUSED_STREAM),
            _ => false,
        }
    }
}
