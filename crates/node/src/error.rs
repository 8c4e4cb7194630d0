//! Every refusal or failure of the node proxy's data path, as one type.
//!
//! Each variant knows what the edge must report: its response flag (metrics
//! and access log), the HTTP status an HBONE server answers with, the side
//! at fault, and whether its log line is limited per source (refusals a pod
//! or peer can repeat on purpose). The same condition is the same variant
//! whichever listener saw it, and the one place that closes a connection
//! ([`crate::telemetry::ConnRecord::close`]) writes the metric and the
//! access-log line from it.

use crate::selfcall::SelfCall;
use http::StatusCode;
use slipstream_hbone::{Fault, HboneError, ResponseFlag};
use slipstream_proxy::denial::Denial;
use slipstream_proxy::limits::OverLimit;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ProxyError {
    /// The connection would loop back into the proxy (see `selfcall`).
    #[error("{0}")]
    SelfCall(SelfCall),
    /// The source holds as many of `what` as it may.
    #[error("source limit: already {limit} {what} (the most one source may hold)")]
    SourceLimit { what: &'static str, limit: u32 },
    /// The node's descriptor budget is spent: refused whoever asks.
    #[error("the node proxy's connection budget ({0} descriptors) is spent")]
    Overload(u32),
    /// A captured connection the kernel gave no original destination for.
    #[error("captured connection without an original destination: {0}")]
    NoOriginalDestination(Arc<io::Error>),
    #[error("service {service} has no healthy endpoint for port {port}")]
    NoEndpoints { service: Arc<str>, port: u16 },
    /// The destination (`bound`: a service hostname or a pod's address) is
    /// bound to `waypoint`, which the mesh does not know or which has no
    /// ready endpoint: refused rather than sent around it.
    #[error("{bound} is bound to waypoint {waypoint}, which {why}: refused (traffic never goes around its waypoint)")]
    NoWaypoint { bound: Arc<str>, waypoint: Arc<str>, why: &'static str },
    /// Outbound: the source pod is not in the mesh configuration, so it
    /// has no identity to open a tunnel with.
    #[error("source {0} is not a workload of the mesh configuration: no identity to open a tunnel with")]
    UnknownSource(SocketAddr),
    /// Inbound: the destination is not a workload this proxy serves.
    #[error("no local workload has address {0}")]
    NoWorkload(SocketAddr),
    /// A policy refused it (network policy, authorization policy, or
    /// STRICT mTLS for plaintext).
    #[error("denied by {0}")]
    Denied(Arc<Denial>),
    /// TCP connect to the next hop failed (or timed out).
    #[error("connect to {addr}: {source}")]
    Connect { addr: SocketAddr, source: Arc<io::Error> },
    /// The HBONE client or server failed; the HBONE error knows its flag.
    #[error(transparent)]
    Hbone(HboneError),
    /// Bytes stopped flowing with an I/O error after the connection was up.
    #[error("connection terminated: {0}")]
    Terminated(Arc<io::Error>),
    /// A policy change denies this open connection: closed.
    #[error("closed after a policy change: {0}")]
    Revoked(Arc<str>),
    /// Still open at the drain deadline: closed.
    #[error("closed at the drain deadline")]
    Drained,
    /// The task carrying the connection ended without closing its record
    /// (it panicked or was aborted).
    #[error("connection task ended without closing the connection")]
    Aborted,
}

// Every `Result` on the data path carries this: keep it small.
const _: () = assert!(std::mem::size_of::<ProxyError>() <= 72);

impl ProxyError {
    pub fn connect(addr: SocketAddr, e: io::Error) -> Self {
        Self::Connect { addr, source: Arc::new(e) }
    }

    pub fn terminated(e: io::Error) -> Self {
        Self::Terminated(Arc::new(e))
    }

    pub fn flag(&self) -> ResponseFlag {
        match self {
            Self::SelfCall(_) => ResponseFlag::SelfCall,
            Self::SourceLimit { .. } => ResponseFlag::SourceLimit,
            Self::Overload(_) => ResponseFlag::Overload,
            Self::NoOriginalDestination(_) => ResponseFlag::ProtocolError,
            Self::NoEndpoints { .. } | Self::NoWorkload(_) | Self::Connect { .. } => ResponseFlag::Connect,
            Self::NoWaypoint { .. } => ResponseFlag::NoWaypoint,
            Self::UnknownSource(_) => ResponseFlag::IdentityError,
            Self::Denied(_) | Self::Revoked(_) => ResponseFlag::Deny,
            Self::Hbone(e) => e.flag(),
            Self::Terminated(_) | Self::Drained | Self::Aborted => ResponseFlag::ConnectionTerminated,
        }
    }

    /// What an HBONE server answers when this stops a CONNECT.
    pub fn response_code(&self) -> StatusCode {
        match self {
            Self::Denied(_) | Self::Revoked(_) => StatusCode::UNAUTHORIZED,
            Self::Hbone(e) => e.response_code(),
            _ => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    pub fn fault(&self) -> Fault {
        match self {
            Self::SelfCall(_) | Self::SourceLimit { .. } | Self::NoWorkload(_) | Self::Denied(_) | Self::Revoked(_) => Fault::Downstream,
            Self::Overload(_) | Self::NoOriginalDestination(_) | Self::UnknownSource(_) | Self::Drained | Self::Aborted => Fault::Local,
            Self::NoEndpoints { .. } | Self::NoWaypoint { .. } | Self::Connect { .. } | Self::Terminated(_) => Fault::Upstream,
            Self::Hbone(e) => e.fault(),
        }
    }

    /// Whether the log line of this refusal is limited per source: a pod or
    /// peer can repeat it as fast as it likes (the metrics count every one).
    pub fn limited_per_source(&self) -> bool {
        matches!(self, Self::SelfCall(_) | Self::SourceLimit { .. } | Self::Overload(_))
    }

    /// The HBONE error an HBONE server answers the peer with.
    pub fn into_hbone(self, peer: IpAddr) -> HboneError {
        match self {
            Self::Hbone(e) => e,
            Self::Denied(d) => HboneError::Denied(d.text.clone()),
            Self::Revoked(why) => HboneError::Denied(why),
            Self::SourceLimit { what, limit } => HboneError::SourceLimit { peer, what, limit },
            Self::Overload(n) => HboneError::Overloaded(n),
            Self::NoWorkload(a) => HboneError::NoWorkload(a),
            Self::Connect { addr, source } => HboneError::Connect { addr, source },
            Self::SelfCall(s) => HboneError::ProxyPort(s.addr().port()),
            other => HboneError::Io(Arc::new(io::Error::other(other.to_string()))),
        }
    }
}

impl From<HboneError> for ProxyError {
    fn from(e: HboneError) -> Self {
        Self::Hbone(e)
    }
}

impl From<OverLimit> for ProxyError {
    fn from(o: OverLimit) -> Self {
        match o.flag {
            ResponseFlag::Overload => Self::Overload(o.limit),
            _ => Self::SourceLimit { what: o.what, limit: o.limit },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_knows_its_answer() {
        let addr: SocketAddr = "10.244.2.2:8080".parse().unwrap();
        let io = || io::Error::from(io::ErrorKind::ConnectionRefused);
        // (error, flag, status, fault, limited per source)
        let rows: Vec<(ProxyError, &str, u16, Fault, bool)> = vec![
            (ProxyError::SelfCall(SelfCall::Loopback(addr)), "SELF_CALL", 503, Fault::Downstream, true),
            (ProxyError::SourceLimit { what: "open outbound connections", limit: 3 }, "SOURCE_LIMIT", 503, Fault::Downstream, true),
            (ProxyError::Overload(10), "OVERLOAD", 503, Fault::Local, true),
            (ProxyError::NoOriginalDestination(Arc::new(io())), "PROTOCOL_ERROR", 503, Fault::Local, false),
            (ProxyError::NoEndpoints { service: "echo".into(), port: 80 }, "CONNECT", 503, Fault::Upstream, false),
            (ProxyError::NoWorkload(addr), "CONNECT", 503, Fault::Downstream, false),
            (
                ProxyError::NoWaypoint { bound: "reviews".into(), waypoint: "bookinfo/waypoint".into(), why: "does not exist" },
                "NO_WAYPOINT",
                503,
                Fault::Upstream,
                false,
            ),
            (ProxyError::UnknownSource(addr), "IDENTITY_ERROR", 503, Fault::Local, false),
            (ProxyError::Denied(Denial::other("no ALLOW policy matched")), "DENY", 401, Fault::Downstream, false),
            (ProxyError::connect(addr, io()), "CONNECT", 503, Fault::Upstream, false),
            (ProxyError::Hbone(HboneError::Status(StatusCode::UNAUTHORIZED)), "DENY", 401, Fault::Upstream, false),
            (ProxyError::terminated(io()), "CONNECTION_TERMINATED", 503, Fault::Upstream, false),
            (ProxyError::Revoked("denied by default/deny".into()), "DENY", 401, Fault::Downstream, false),
            (ProxyError::Drained, "CONNECTION_TERMINATED", 503, Fault::Local, false),
            (ProxyError::Aborted, "CONNECTION_TERMINATED", 503, Fault::Local, false),
        ];
        for (e, flag, status, fault, limited) in rows {
            assert_eq!(
                (e.flag().as_str(), e.response_code().as_u16(), e.fault(), e.limited_per_source()),
                (flag, status, fault, limited),
                "{e}"
            );
        }
    }

    #[test]
    fn limits_become_the_same_errors_everywhere() {
        let over = OverLimit { flag: ResponseFlag::SourceLimit, what: "open HBONE streams", limit: 7 };
        let e = ProxyError::from(over);
        assert_eq!(e.to_string(), "source limit: already 7 open HBONE streams (the most one source may hold)");
        let h = e.into_hbone("10.0.0.1".parse().unwrap());
        assert_eq!((h.flag(), h.response_code()), (ResponseFlag::SourceLimit, StatusCode::SERVICE_UNAVAILABLE));
        let budget = OverLimit { flag: ResponseFlag::Overload, what: "", limit: 9 };
        assert_eq!(ProxyError::from(budget).flag(), ResponseFlag::Overload);
        assert_eq!(
            ProxyError::Denied(Denial::other("x")).into_hbone("10.0.0.1".parse().unwrap()).response_code(),
            StatusCode::UNAUTHORIZED
        );
    }
}
