//! The waypoint's transport towards the endpoints: an HBONE tunnel to a
//! meshed endpoint's node proxy (expecting the endpoint's own identity)
//! or a plain TCP connection to an endpoint outside the mesh. The HTTP
//! client over it ([`crate::client`]) keeps idle connections per
//! endpoint, so each request picks its endpoint and is never pinned to
//! the connection a previous request used.

use arc_swap::ArcSwap;
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

/// Why a connection could not be opened.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

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
