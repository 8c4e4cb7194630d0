//! The connection to the control plane (docs/protocols.md sections 3 and
//! 4): one gRPC channel over TLS that the workload API stream (`xds`) and
//! the certificate client (`caclient`) share.
//!
//! The channel verifies the control plane's certificate against the mesh
//! root and the name in [`ControlSettings::san`] (the root file is read
//! again for each new connection, so a rotated root is picked up; a file
//! that does not parse keeps the roots last read), and every call carries
//! `authorization: Bearer <token>` (read from the token file at each call,
//! so a rotated token is picked up) and `clusterid`. With several
//! addresses (control plane replicas), each new connection tries them in
//! turn from the one after the last that answered: when a replica goes
//! away, the next connection goes to another.

use serde::Serialize;
use slipstream_core::sync::LockExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Where the control plane is and how to trust and authenticate to it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ControlSettings {
    /// `host:port` of each replica.
    pub addresses: Vec<String>,
    /// The name its certificate must carry.
    pub san: String,
    /// PEM file of the mesh root(s) the control plane's certificate chains
    /// to (public: no key).
    pub root_cert: PathBuf,
    /// File holding this node's bearer token.
    #[serde(skip)]
    pub token_file: PathBuf,
    /// `clusterid` metadata.
    pub cluster_id: String,
    #[serde(serialize_with = "crate::config::as_secs")]
    pub connect_timeout: Duration,
}

/// Calling the control plane failed before any answer.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("reading the control plane's root certificate {path}: {reason}")]
    Root { path: PathBuf, reason: String },
    #[error("reading the token file {path}: {reason}")]
    Token { path: PathBuf, reason: String },
    #[error("invalid control plane name {0:?}")]
    Name(String),
    #[error("no control plane address configured")]
    NoAddress,
}

/// The shared channel and what every call adds to it.
#[derive(Clone)]
pub struct ControlChannel {
    channel: tonic::transport::Channel,
    settings: Arc<ControlSettings>,
}

impl ControlChannel {
    /// Builds the channel; nothing connects until the first call.
    pub fn new(settings: ControlSettings) -> Result<ControlChannel, ControlError> {
        if settings.addresses.is_empty() {
            return Err(ControlError::NoAddress);
        }
        let roots = Roots::load(&settings.root_cert)?;
        let server_name =
            rustls_pki_types::ServerName::try_from(settings.san.clone()).map_err(|_| ControlError::Name(settings.san.clone()))?;
        let connector = Connector {
            roots: Arc::new(std::sync::Mutex::new(roots)),
            server_name,
            addresses: Arc::new(settings.addresses.clone()),
            next: Arc::new(AtomicUsize::new(0)),
            timeout: settings.connect_timeout,
        };
        // The URI is only for HTTP/2's :authority; the connector decides
        // where to connect.
        let endpoint = tonic::transport::Endpoint::from_shared(format!("https://{}", settings.san))
            .map_err(|_| ControlError::Name(settings.san.clone()))?
            .connect_timeout(settings.connect_timeout)
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(10));
        let channel = endpoint.connect_with_connector_lazy(connector);
        Ok(ControlChannel { channel, settings: Arc::new(settings) })
    }

    pub fn channel(&self) -> tonic::transport::Channel {
        self.channel.clone()
    }

    pub fn settings(&self) -> &ControlSettings {
        &self.settings
    }

    /// A request with the caller's credentials in its metadata.
    pub fn request<T>(&self, msg: T) -> Result<tonic::Request<T>, ControlError> {
        let mut req = tonic::Request::new(msg);
        self.authorize(req.metadata_mut())?;
        Ok(req)
    }

    /// Adds `authorization` and `clusterid`.
    pub fn authorize(&self, md: &mut tonic::metadata::MetadataMap) -> Result<(), ControlError> {
        let path = &self.settings.token_file;
        let token = std::fs::read_to_string(path).map_err(|e| ControlError::Token { path: path.clone(), reason: e.to_string() })?;
        let value = format!("Bearer {}", token.trim())
            .parse()
            .map_err(|_| ControlError::Token { path: path.clone(), reason: "not a valid header value".into() })?;
        md.insert("authorization", value);
        if let Ok(v) = self.settings.cluster_id.parse() {
            md.insert("clusterid", v);
        }
        Ok(())
    }
}

/// The roots the control plane's certificate is checked against, as last
/// read from their file, and the TLS connector built from them.
struct Roots {
    path: PathBuf,
    pem: Vec<u8>,
    tls: tokio_rustls::TlsConnector,
}

impl Roots {
    fn load(path: &std::path::Path) -> Result<Roots, ControlError> {
        let pem = std::fs::read(path).map_err(|e| ControlError::Root { path: path.into(), reason: e.to_string() })?;
        let tls = Self::connector(&pem).map_err(|reason| ControlError::Root { path: path.into(), reason })?;
        Ok(Roots { path: path.into(), pem, tls })
    }

    fn connector(pem: &[u8]) -> Result<tokio_rustls::TlsConnector, String> {
        let roots = slipstream_identity::TrustBundle::from_pem(std::str::from_utf8(pem).map_err(|_| "not PEM text".to_string())?)
            .map_err(|e| e.to_string())?;
        let mut tls = rustls::ClientConfig::builder_with_provider(slipstream_identity::tls::provider())
            .with_protocol_versions(slipstream_identity::tls::PROTOCOL_VERSIONS)
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots.root_store())
            .with_no_client_auth();
        tls.alpn_protocols = vec![b"h2".to_vec()];
        Ok(tokio_rustls::TlsConnector::from(Arc::new(tls)))
    }

    /// The connector for a new connection: from the file as it is now if
    /// it changed and parses, else the last good one.
    fn current(&mut self) -> tokio_rustls::TlsConnector {
        match std::fs::read(&self.path) {
            Ok(pem) if pem != self.pem => match Self::connector(&pem) {
                Ok(tls) => {
                    tracing::info!(path = %self.path.display(), "the control plane's root certificates changed; new connections use them");
                    self.pem = pem;
                    self.tls = tls;
                }
                Err(e) => {
                    tracing::warn!(path = %self.path.display(), "the control plane's root certificates are unreadable ({e}); keeping those read before");
                    // Complained about once per content.
                    self.pem = pem;
                }
            },
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(path = %self.path.display(), "cannot read the control plane's root certificates ({e}); keeping those read before")
            }
        }
        self.tls.clone()
    }
}

#[derive(Clone)]
struct Connector {
    roots: Arc<std::sync::Mutex<Roots>>,
    server_name: rustls_pki_types::ServerName<'static>,
    addresses: Arc<Vec<String>>,
    next: Arc<AtomicUsize>,
    timeout: Duration,
}

impl tower::Service<http::Uri> for Connector {
    type Response = hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;
    type Error = std::io::Error;
    type Future = futures_util::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let n = this.addresses.len();
            let start = this.next.load(Ordering::Relaxed);
            let mut last = None;
            for i in 0..n {
                let idx = (start + i) % n;
                let addr = &this.addresses[idx];
                match tokio::time::timeout(this.timeout, this.connect(addr)).await {
                    Ok(Ok(s)) => {
                        if i > 0 || last.is_some() {
                            tracing::info!(address = %addr, "connected to the control plane");
                        }
                        // Next time, start after this one only if it fails.
                        this.next.store(idx, Ordering::Relaxed);
                        return Ok(hyper_util::rt::TokioIo::new(s));
                    }
                    // Per attempt, so debug: the callers (the xDS and
                    // certificate clients) say when the control plane
                    // goes away and comes back.
                    Ok(Err(e)) => {
                        tracing::debug!(address = %addr, "control plane unreachable: {e}");
                        last = Some(e);
                    }
                    Err(_) => {
                        tracing::debug!(address = %addr, "control plane did not answer within {:?}", this.timeout);
                        last = Some(std::io::Error::new(std::io::ErrorKind::TimedOut, format!("{addr}: connect timed out")));
                    }
                }
            }
            // Every replica failed: start with the next one next time.
            this.next.store((start + 1) % n, Ordering::Relaxed);
            Err(last.unwrap_or_else(|| std::io::Error::other("no control plane address")))
        })
    }
}

impl Connector {
    async fn connect(&self, addr: &str) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let tls = self.roots.locked().current();
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let _ = tcp.set_nodelay(true);
        tls.connect(self.server_name.clone(), tcp).await
    }
}
