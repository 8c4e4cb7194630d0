//! Opening one HBONE connection: source certificate, TCP, TLS, HTTP/2.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use rustls_pki_types::ServerName;
use slipstream_identity::tls::{client_config, identity_mismatch};
use slipstream_identity::{CertManager, FetchError, SpiffeId, WorkloadCert};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use super::request::PoolKey;
use crate::connector::Connector;
use crate::error::HboneError;
use crate::h2config::H2Config;

/// Where the pool gets the source workload's certificate.
pub trait CertSource: Send + Sync + 'static {
    fn fetch<'a>(&'a self, id: &'a SpiffeId) -> BoxFuture<'a, Result<Arc<WorkloadCert>, FetchError>>;
}

impl CertSource for CertManager {
    fn fetch<'a>(&'a self, id: &'a SpiffeId) -> BoxFuture<'a, Result<Arc<WorkloadCert>, FetchError>> {
        Box::pin(self.fetch_certificate(id))
    }
}

pub(crate) type H2Connection = h2::client::Connection<TlsStream<TcpStream>, Bytes>;

/// Dials `key.dst()` and completes the TLS and HTTP/2 handshakes.
pub(crate) async fn dial(
    key: &PoolKey,
    certs: &dyn CertSource,
    connector: &dyn Connector,
    h2: &H2Config,
) -> Result<(h2::client::SendRequest<Bytes>, H2Connection), HboneError> {
    let addr = key.dst();
    let cert = certs
        .fetch(key.src_identity())
        .await
        .map_err(|source| HboneError::Certificate {
            identity: key.src_identity().clone(),
            source,
        })?;
    // The peer's certificate is checked against the roots that came with
    // our own certificate (the CA's current bundle).
    let config = client_config(&cert, cert.roots(), key.dst_identities()).map_err(|e| HboneError::Tls {
        addr,
        source: Arc::new(e),
    })?;

    let tcp = connector
        .connect(addr, key.src_ip())
        .await
        .map_err(|e| HboneError::Connect {
            addr,
            source: Arc::new(e),
        })?;

    // SNI is disabled and the verifier ignores the name: it only has to be
    // syntactically valid.
    let tls = TlsConnector::from(config)
        .connect(ServerName::IpAddress(addr.ip().into()), tcp)
        .await
        .map_err(|e| match identity_mismatch(&e) {
            Some(mismatch) => HboneError::IdentityMismatch {
                addr,
                mismatch: mismatch.clone(),
            },
            None => HboneError::Tls {
                addr,
                source: Arc::new(e),
            },
        })?;

    h2.client_builder()
        .handshake(tls)
        .await
        .map_err(|e| HboneError::from_h2(e, addr))
}
