//! The waypoint's side towards the endpoints: hyper's pooled HTTP client
//! over a connector of ours that opens an HBONE tunnel to a meshed
//! endpoint's node proxy (expecting the endpoint's own identity) or a
//! plain TCP connection to an endpoint outside the mesh. The client keeps
//! idle connections per endpoint (`<ip>:<port>` in the request URI), so
//! each request picks its endpoint and is never pinned to the connection
//! a previous request used.

use arc_swap::ArcSwap;
use futures_util::future::BoxFuture;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use slipstream_core::abi::hbone_addr;
use slipstream_core::{MeshState, SpiffeId};
use slipstream_hbone::{ConnectRequest, Pool, PoolKey, TunnelStream};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Opens the transport for one upstream HTTP connection.
#[derive(Clone)]
pub struct Connector {
    pub(crate) pool: Pool,
    pub(crate) identity: Arc<SpiffeId>,
    pub(crate) own_ip: IpAddr,
    pub(crate) mesh: Arc<ArcSwap<MeshState>>,
}

/// The error a failed connect reports (hyper wraps it).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<http::Uri> for Connector {
    type Response = Io;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Io, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let addr: SocketAddr = uri
                .authority()
                .and_then(|a| a.as_str().parse().ok())
                .ok_or_else(|| io::Error::other(format!("{uri}: the upstream is named by address")))?;
            Ok(Io(TokioIo::new(this.open(addr).await?)))
        })
    }
}

impl Connector {
    /// A connection to the endpoint `addr`: an HBONE tunnel to its node
    /// proxy expecting its identity when it is meshed, plain TCP when not.
    pub async fn open(&self, addr: SocketAddr) -> Result<Stream, BoxError> {
        let state = self.mesh.load_full();
        match state.workload_by_ip(addr.ip()) {
            Some(w) if w.meshed() => {
                let expected: SpiffeId = w.identity().clone();
                let key = PoolKey::new((*self.identity).clone(), [expected], hbone_addr(w.address()), self.own_ip);
                let tunnel = self.pool.connect(&key, ConnectRequest::new(addr)).await?;
                Ok(Stream::Tunnel(Box::new(tunnel)))
            }
            _ => {
                let tcp = TcpStream::connect(addr).await?;
                tcp.set_nodelay(true)?;
                Ok(Stream::Tcp(tcp))
            }
        }
    }
}

/// A tunnel or a plain connection.
pub enum Stream {
    Tunnel(Box<TunnelStream>),
    Tcp(TcpStream),
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tunnel(t) => Pin::new(t.as_mut()).poll_read(cx, buf),
            Stream::Tcp(t) => Pin::new(t).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tunnel(t) => Pin::new(t.as_mut()).poll_write(cx, buf),
            Stream::Tcp(t) => Pin::new(t).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tunnel(t) => Pin::new(t.as_mut()).poll_flush(cx),
            Stream::Tcp(t) => Pin::new(t).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tunnel(t) => Pin::new(t.as_mut()).poll_shutdown(cx),
            Stream::Tcp(t) => Pin::new(t).poll_shutdown(cx),
        }
    }
}

/// What hyper's client reads and writes.
pub struct Io(TokioIo<Stream>);

impl Connection for Io {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl hyper::rt::Read for Io {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: hyper::rt::ReadBufCursor<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Io {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}
