//! The HBONE server: the node proxy's port 15008.

mod connection;
mod handler;
mod handshake;
mod inbound;
mod stats;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use slipstream_identity::tls::ServerTls;
use tokio::net::TcpListener;

pub use handler::{
    Admission, AdmissionRefused, CertResolver, ConnectionContext, Handler, InPlace, InboundRequest, Permit, ResolveError, StreamRecord,
    Upstream,
};
pub use handshake::{HandshakeFailure, HandshakeFailureKind};
pub use stats::{ServerStats, StatsSnapshot};

use crate::drain::DrainWatch;
use crate::h2config::H2Config;

/// How long a [`Handler`] should give the application to accept the
/// upstream connection before answering 503 (docs/protocols.md section 2).
pub const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Server behaviour. Defaults follow docs/protocols.md section 2.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub h2: H2Config,
    /// SETTINGS_MAX_CONCURRENT_STREAMS advertised to clients.
    pub max_concurrent_streams: u32,
    /// Budget for choosing the certificate and the TLS and HTTP/2
    /// handshakes; slow or silent clients are dropped after it.
    pub handshake_timeout: Duration,
    /// Target ports refused with 503: by default the proxy's in-pod
    /// listeners (`slipstream_core::PROXY_PORTS`: 15001, 15006, 15008, as
    /// docs/protocols.md section 2 lists them). The admin ports are not among
    /// them: they listen in the node's namespace, so `<pod IP>:15020`
    /// reaches the pod's app, not the proxy.
    pub proxy_ports: Vec<u16>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            h2: H2Config::default(),
            max_concurrent_streams: 200,
            handshake_timeout: Duration::from_secs(10),
            proxy_ports: slipstream_core::PROXY_PORTS.to_vec(),
        }
    }
}

pub(crate) struct Shared {
    tls: ServerTls,
    certs: Arc<dyn CertResolver>,
    handler: Arc<dyn Handler>,
    config: ServerConfig,
    stats: Arc<ServerStats>,
}

/// Accepts HBONE connections on a listener the caller bound (so a port
/// conflict fails at start-up, before anything serves).
pub struct Server {
    listener: TcpListener,
    shared: Shared,
}

impl Server {
    /// `tls` carries the roots and trust domain client certificates must
    /// match; `certs` picks the certificate per destination IP; `handler`
    /// decides what each CONNECT reaches.
    pub fn new(
        listener: TcpListener,
        tls: ServerTls,
        certs: Arc<dyn CertResolver>,
        handler: Arc<dyn Handler>,
        config: ServerConfig,
    ) -> Self {
        Self { listener, shared: Shared { tls, certs, handler, config, stats: Arc::default() } }
    }

    /// Counts into `stats` instead of counters of its own: a proxy with one
    /// server per workload reports them together.
    pub fn with_stats(mut self, stats: Arc<ServerStats>) -> Self {
        self.shared.stats = stats;
        self
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn stats(&self) -> Arc<ServerStats> {
        self.shared.stats.clone()
    }

    /// Serves until `drain` fires: then stops accepting (the listener is
    /// closed), sends GOAWAY on every connection, lets open streams finish
    /// until the drain deadline and closes what is left. Returns once the
    /// listener is closed; the drain trigger resolves when every connection
    /// is gone.
    pub async fn serve(self, drain: DrainWatch) {
        let shared = Arc::new(self.shared);
        loop {
            tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok((tcp, peer)) => {
                        let (shared, drain) = (shared.clone(), drain.clone());
                        crate::shard::spawn_accepted(tcp, move |tcp| connection::serve_connection(tcp, peer, shared, drain));
                    }
                    Err(e) => {
                        // Typically out of file descriptors: back off briefly
                        // rather than spin.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                _ = drain.signaled() => break,
            }
        }
        tracing::info!("HBONE server draining: listener closed");
    }
}
