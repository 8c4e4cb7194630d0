//! Creating the TCP socket to the peer proxy. The node proxy brings its own
//! connector (bound to the source pod's IP, marked, or opened inside the
//! pod's network namespace); tests and simple setups use [`PlainConnector`].

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};

use futures_util::future::BoxFuture;
use tokio::net::TcpStream;

/// Opens the TCP connection for a tunnel to `dst` on behalf of a workload
/// whose address is `src_ip`.
pub trait Connector: Send + Sync + 'static {
    fn connect(&self, dst: SocketAddr, src_ip: IpAddr) -> BoxFuture<'static, io::Result<TcpStream>>;
}

impl<F, Fut> Connector for F
where
    F: Fn(SocketAddr, IpAddr) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = io::Result<TcpStream>> + Send + 'static,
{
    fn connect(&self, dst: SocketAddr, src_ip: IpAddr) -> BoxFuture<'static, io::Result<TcpStream>> {
        Box::pin(self(dst, src_ip))
    }
}

/// An ordinary `connect()` from the host's own address. `src_ip` is ignored:
/// binding to a pod's address needs privileges the node proxy's own
/// connector has.
#[derive(Debug, Clone, Copy, Default)]
pub struct PlainConnector;

impl Connector for PlainConnector {
    fn connect(&self, dst: SocketAddr, _src_ip: IpAddr) -> BoxFuture<'static, io::Result<TcpStream>> {
        Box::pin(async move {
            let stream = TcpStream::connect(dst).await?;
            // Tunnels carry interactive traffic too; h2 already batches frames.
            stream.set_nodelay(true)?;
            Ok(stream)
        })
    }
}
