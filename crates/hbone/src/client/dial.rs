//! Opening one HBONE connection: source certificate, TCP, TLS, HTTP/2.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{ready, Context, Poll};

use futures_util::future::BoxFuture;
use rustls_pki_types::ServerName;
use slipstream_core::SpiffeId;
use slipstream_identity::tls::{client_config, identity_mismatch};
use slipstream_identity::{CertManager, FetchError, WorkloadCert};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use super::request::PoolKey;
use crate::chunk::Chunk;
use crate::coalesce::Coalesce;
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

pub(crate) type H2Connection = h2::client::Connection<TlsTap<Coalesce<TlsStream<TcpStream>>>, Chunk>;

/// The first TLS error seen on a connection. h2 keeps only the kind and
/// text of transport errors, so without this a TLS alert (e.g. the server
/// rejecting our client certificate, which TLS 1.3 reports only after our
/// side finished the handshake) would surface as a generic HTTP/2 error.
pub(crate) type TlsErrorSlot = Arc<OnceLock<rustls::Error>>;

/// Dials `key.dst()` and completes the TLS and HTTP/2 handshakes.
pub(crate) async fn dial(
    key: &PoolKey,
    certs: &dyn CertSource,
    connector: &dyn Connector,
    h2: &H2Config,
) -> Result<(h2::client::SendRequest<Chunk>, H2Connection, TlsErrorSlot), HboneError> {
    let addr = key.dst();
    let cert = certs
        .fetch(key.src_identity())
        .await
        .map_err(|source| HboneError::Certificate { identity: key.src_identity().clone(), source: Arc::new(source) })?;
    // The peer's certificate is checked against the roots that came with
    // our own certificate (the CA's current bundle).
    let config = client_config(&cert, cert.roots(), key.dst_identities()).map_err(|e| HboneError::Tls { addr, source: Arc::new(e) })?;

    let tcp = connector.connect(addr, key.src_ip()).await.map_err(|e| HboneError::Connect { addr, source: Arc::new(e) })?;

    // SNI is disabled and the verifier ignores the name: it only has to be
    // syntactically valid.
    let tls =
        TlsConnector::from(config).connect(ServerName::IpAddress(addr.ip().into()), tcp).await.map_err(|e| {
            match identity_mismatch(&e) {
                Some(mismatch) => HboneError::IdentityMismatch { addr, mismatch: Arc::new(mismatch.clone()) },
                None => HboneError::Tls { addr, source: Arc::new(e) },
            }
        })?;

    let tls_error = TlsErrorSlot::default();
    let tapped = TlsTap { inner: Coalesce::new(tls), error: tls_error.clone() };
    let (send, connection) = h2.client_builder().handshake(tapped).await.map_err(|e| HboneError::from_h2(e, addr, tls_error.get()))?;
    Ok((send, connection, tls_error))
}

/// Passes I/O through, remembering the first `rustls::Error`.
pub(crate) struct TlsTap<S> {
    inner: S,
    error: TlsErrorSlot,
}

impl<S> TlsTap<S> {
    fn note<T>(&self, result: io::Result<T>) -> io::Result<T> {
        if let Err(e) = &result {
            if let Some(tls) = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                let _ = self.error.set(tls.clone());
            }
        }
        result
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for TlsTap<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let result = ready!(Pin::new(&mut this.inner).poll_read(cx, buf));
        Poll::Ready(this.note(result))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for TlsTap<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = ready!(Pin::new(&mut this.inner).poll_write(cx, buf));
        Poll::Ready(this.note(result))
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = ready!(Pin::new(&mut this.inner).poll_write_vectored(cx, bufs));
        Poll::Ready(this.note(result))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let result = ready!(Pin::new(&mut this.inner).poll_flush(cx));
        Poll::Ready(this.note(result))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let result = ready!(Pin::new(&mut this.inner).poll_shutdown(cx));
        Poll::Ready(this.note(result))
    }
}
