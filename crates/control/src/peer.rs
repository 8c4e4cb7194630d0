//! What the control plane knows of a caller's connection, for the
//! services served on it (delta xDS, the certificate service): its
//! addresses, and whether a call on it has authenticated. The serving
//! side (`serve`) puts it on each connection; the services read it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tonic::transport::server::TcpConnectInfo;

/// What tonic puts in every request's extensions for a connection of
/// ours: its addresses, and the flag a service sets once a call on it
/// has authenticated ([`authenticated`]).
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub tcp: TcpConnectInfo,
    authenticated: Arc<AtomicBool>,
}

impl ConnInfo {
    /// A new connection's, not authenticated yet.
    pub fn new(tcp: TcpConnectInfo) -> ConnInfo {
        ConnInfo { tcp, authenticated: Arc::new(AtomicBool::new(false)) }
    }

    /// Whether a call on it has authenticated.
    pub fn is_authenticated(&self) -> bool {
        self.authenticated.load(Ordering::Acquire)
    }
}

/// The peer of a request: from our connections, or from tonic's own
/// (`Request::remote_addr`) when the service is served some other way.
pub fn peer_of<T>(req: &tonic::Request<T>) -> Option<SocketAddr> {
    req.extensions().get::<ConnInfo>().and_then(|c| c.tcp.remote_addr).or_else(|| req.remote_addr())
}

/// Marks the request's connection as used by an authenticated caller: it
/// is no longer closed at its authentication deadline.
pub fn authenticated<T>(req: &tonic::Request<T>) {
    if let Some(c) = req.extensions().get::<ConnInfo>() {
        c.authenticated.store(true, Ordering::Release);
    }
}
