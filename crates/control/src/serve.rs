//! The control plane's port (15012): TLS with a certificate from the mesh
//! CA, HTTP/2, and the gRPC services on it (delta xDS, and the certificate
//! service next to it).
//!
//! Bind before serve: [`ControlServer::bind`] issues the first serving
//! certificate and binds the port, so a bad CA or a taken port fails
//! startup; [`ControlServer::serve`] then serves the [`Routes`] it is given
//! (build them with [`routes`] and add services with
//! `Routes::add_service`).
//!
//! What one client cannot do to the others: hold more than its share of
//! connections (bounds on open connections, TLS handshakes included, in
//! all and per peer address; over them, new connections are closed at
//! once), stall in the handshake (a deadline), hold a connection without
//! ever authenticating on it (closed at a second deadline unless a call on
//! it authenticated), or speak something else (anything that is not TLS
//! 1.3 with ALPN h2 and then HTTP/2 is closed by rustls or hyper). Dead
//! peers are found by HTTP/2 PINGs. Authentication itself is bounded by
//! the [`crate::auth::Gate`] in front of both services.

mod cert;
mod conn;

pub use cert::ServingCert;

use crate::ca::CaMaterial;
use crate::xds::XdsServer;
use anyhow::Context;
use conn::{ConnGuard, Full, Slots, TlsConn};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::service::Routes;

/// How the port is served.
#[derive(Debug, Clone)]
pub struct ServeSettings {
    pub addr: SocketAddr,
    /// The names in the serving certificate: `istiod.istio-system.svc`
    /// (what clients verify by default) and any others clients use (an
    /// entry that parses as an IP address becomes an IP SAN).
    pub names: Vec<String>,
    /// Lifetime of the serving certificate; renewed at half-life.
    pub cert_validity: Duration,
    /// Open connections, TLS handshakes included.
    pub max_connections: usize,
    /// Open connections from one address (0: no bound). A node proxy uses
    /// one or two; several node proxies behind one NAT need more.
    pub max_connections_per_peer: usize,
    pub handshake_timeout: Duration,
    /// A connection on which no call has authenticated by then is closed.
    pub auth_timeout: Duration,
    /// HTTP/2 streams per connection (a proxy uses one or two).
    pub max_streams_per_connection: u32,
    /// After shutdown: how long connections may take to finish.
    pub drain_timeout: Duration,
}

impl Default for ServeSettings {
    fn default() -> Self {
        ServeSettings {
            addr: SocketAddr::from(([0, 0, 0, 0], slipstream_api::CONTROL_PLANE_PORT)),
            names: vec![slipstream_api::DEFAULT_CONTROL_PLANE_SAN.to_string()],
            cert_validity: Duration::from_secs(24 * 3600),
            max_connections: 4096,
            max_connections_per_peer: 64,
            handshake_timeout: Duration::from_secs(10),
            auth_timeout: Duration::from_secs(30),
            max_streams_per_connection: 16,
            drain_timeout: Duration::from_secs(5),
        }
    }
}

/// The routes of the xDS service; add others (the certificate service)
/// with `Routes::add_service`.
pub fn routes(xds: &XdsServer) -> Routes {
    Routes::new(xds.service())
}

/// The bound port, ready to serve.
pub struct ControlServer {
    listener: TcpListener,
    cert: Arc<ServingCert>,
    settings: ServeSettings,
}

impl ControlServer {
    /// Issues the serving certificate and binds the port.
    /// `ca`: a [`CaMaterial`] (the certificate follows its rotations), or
    /// a fixed `Arc<Ca>`.
    pub async fn bind(settings: ServeSettings, ca: impl Into<CaMaterial>) -> anyhow::Result<ControlServer> {
        let cert = ServingCert::issue(ca.into(), settings.names.clone(), settings.cert_validity)?;
        let listener =
            TcpListener::bind(settings.addr).await.with_context(|| format!("binding the control plane port {}", settings.addr))?;
        Ok(ControlServer { listener, cert, settings })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().unwrap_or(self.settings.addr)
    }

    pub fn certificate(&self) -> &Arc<ServingCert> {
        &self.cert
    }

    /// Serves `routes` until `shutdown` completes, then lets connections
    /// finish (end the xDS streams first: [`XdsServer::close_streams`]) for
    /// at most the drain timeout and closes the rest. Connections also
    /// close if this future is dropped.
    pub async fn serve(self, routes: Routes, shutdown: impl Future<Output = ()> + Send) -> anyhow::Result<()> {
        let ControlServer { listener, cert, settings } = self;
        let mut tls = rustls::ServerConfig::builder_with_provider(slipstream_identity::tls::provider())
            .with_protocol_versions(slipstream_identity::tls::PROTOCOL_VERSIONS)
            .context("TLS versions")?
            .with_no_client_auth()
            .with_cert_resolver(cert.clone());
        tls.alpn_protocols = vec![slipstream_identity::tls::ALPN_H2.to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));

        // Dropping `kill` (or setting it) closes every connection.
        let (kill, killed) = watch::channel(false);
        let (conns, incoming) = mpsc::channel(16);
        let accept = tokio::spawn(accept_loop(listener, acceptor, conns, killed, settings.clone()));
        let renew = tokio::spawn(cert.renew_loop());
        let _stop = AbortOnDrop(vec![accept, renew]);

        let (fired, on_fire) = oneshot::channel::<()>();
        let signal = async move {
            shutdown.await;
            let _ = fired.send(());
        };
        let server = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)))
            .max_concurrent_streams(Some(settings.max_streams_per_connection))
            .add_routes(routes)
            .serve_with_incoming_shutdown(ReceiverStream::new(incoming), signal);
        tokio::pin!(server);
        let deadline = async {
            match on_fire.await {
                Ok(()) => tokio::time::sleep(settings.drain_timeout).await,
                Err(_) => std::future::pending().await,
            }
        };
        let result = tokio::select! {
            r = &mut server => r,
            _ = deadline => {
                tracing::warn!("closing the connections still open {:?} after shutdown", settings.drain_timeout);
                kill.send_replace(true);
                tokio::time::timeout(Duration::from_secs(1), &mut server).await.unwrap_or(Ok(()))
            }
        };
        result.context("serving the control plane port")
    }
}

struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    conns: mpsc::Sender<std::io::Result<TlsConn>>,
    killed: watch::Receiver<bool>,
    settings: ServeSettings,
) {
    let slots = Arc::new(Mutex::new(Slots::default()));
    let mut refused_logged = tokio::time::Instant::now() - Duration::from_secs(60);
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors, typically: let some close.
                    tracing::warn!("control plane port: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = conns.closed() => return,
        };
        let guard = match ConnGuard::try_new(&slots, peer.ip(), settings.max_connections, settings.max_connections_per_peer) {
            Ok(g) => g,
            Err(full) => {
                if refused_logged.elapsed() >= Duration::from_secs(10) {
                    match full {
                        Full::Total => tracing::warn!(
                            %peer,
                            max = settings.max_connections,
                            "control plane port: connection limit reached, closing new connections"
                        ),
                        Full::Peer => tracing::warn!(
                            %peer,
                            max = settings.max_connections_per_peer,
                            "control plane port: this address holds its most connections, closing its new ones"
                        ),
                    }
                    refused_logged = tokio::time::Instant::now();
                }
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let local = tcp.local_addr().ok();
        let (acceptor, conns, killed, timeout) = (acceptor.clone(), conns.clone(), killed.clone(), settings.handshake_timeout);
        let auth_timeout = settings.auth_timeout;
        tokio::spawn(async move {
            match tokio::time::timeout(timeout, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => {
                    let _ = conns.send(Ok(TlsConn::new(tls, local, peer, guard, killed, auth_timeout))).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, "control plane port: TLS handshake failed: {e}"),
                Err(_) => tracing::debug!(%peer, "control plane port: no TLS handshake within {timeout:?}"),
            }
        });
    }
}
