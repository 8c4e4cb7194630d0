//! The certificate service on a loopback port with TLS, for tests of its
//! clients (the node proxy's `caclient`) and of the service itself, until
//! it is mounted on the control plane's :15012 listener. The server's
//! certificate is issued by the mesh CA for
//! [`DEFAULT_CONTROL_PLANE_SAN`](slipstream_api::DEFAULT_CONTROL_PLANE_SAN),
//! as a node proxy expects.

use super::CaService;
use slipstream_identity::Ca;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// A served instance; the server stops when this is dropped.
pub struct Served {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves `service` on 127.0.0.1 (an ephemeral port) over TLS 1.3 with a
/// serving certificate from `ca`.
pub async fn serve_tls(service: CaService, ca: &Ca) -> std::io::Result<Served> {
    let (chain, key) =
        ca.issue_server_cert(&[slipstream_api::DEFAULT_CONTROL_PLANE_SAN], Duration::from_secs(3600)).map_err(std::io::Error::other)?;
    let mut tls = rustls::ServerConfig::builder_with_provider(slipstream_identity::tls::provider())
        .with_protocol_versions(slipstream_identity::tls::PROTOCOL_VERSIONS)
        .map_err(std::io::Error::other)?
        .with_no_client_auth()
        .with_single_cert(chain, key.to_der())
        .map_err(std::io::Error::other)?;
    tls.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let incoming = async_stream(listener, acceptor);
    let task = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder().add_service(service.into_server()).serve_with_incoming(incoming).await;
    });
    Ok(Served { addr, task })
}

/// Accepted TLS connections, as a stream; a failed handshake is skipped.
fn async_stream(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
) -> impl futures_util::Stream<Item = std::io::Result<TlsConn>> + Send + 'static {
    futures_util::stream::unfold((listener, acceptor), |(listener, acceptor)| async move {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(x) => x,
                Err(e) => return Some((Err(e), (listener, acceptor))),
            };
            let local = tcp.local_addr().ok();
            if let Ok(tls) = acceptor.accept(tcp).await {
                return Some((
                    Ok(TlsConn { tls, info: TcpConnectInfo { local_addr: local, remote_addr: Some(peer) } }),
                    (listener, acceptor),
                ));
            }
        }
    })
}

/// A TLS connection that tells tonic its peer's address.
pub struct TlsConn {
    tls: tokio_rustls::server::TlsStream<TcpStream>,
    info: TcpConnectInfo,
}

impl Connected for TlsConn {
    type ConnectInfo = TcpConnectInfo;
    fn connect_info(&self) -> TcpConnectInfo {
        self.info.clone()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tls).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tls).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tls).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tls).poll_shutdown(cx)
    }
}
