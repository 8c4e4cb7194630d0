//! One accepted connection after its TLS handshake, as tonic's server
//! takes it: the peer address for `Request::remote_addr`, its slot among
//! the open connections (given back when it closes), and a kill switch
//! (a server that stops closes what its drain did not).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// A slot among the open connections.
pub struct ConnGuard(Arc<AtomicUsize>);

impl ConnGuard {
    /// A slot, unless `max` are taken.
    pub fn try_new(open: &Arc<AtomicUsize>, max: usize) -> Option<ConnGuard> {
        open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)).ok()?;
        Some(ConnGuard(open.clone()))
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

pub struct TlsConn {
    io: tokio_rustls::server::TlsStream<TcpStream>,
    info: TcpConnectInfo,
    /// Completes when the server kills its connections (or is gone).
    killed: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// `killed` completed (it must not be polled again).
    dead: bool,
    _slot: ConnGuard,
}

impl TlsConn {
    pub fn new(
        io: tokio_rustls::server::TlsStream<TcpStream>,
        local: Option<SocketAddr>,
        peer: SocketAddr,
        slot: ConnGuard,
        mut kill: watch::Receiver<bool>,
    ) -> TlsConn {
        let killed = Box::pin(async move {
            let _ = kill.wait_for(|k| *k).await;
        });
        TlsConn { io, info: TcpConnectInfo { local_addr: local, remote_addr: Some(peer) }, killed, dead: false, _slot: slot }
    }

    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if !self.dead && self.killed.as_mut().poll(cx).is_ready() {
            self.dead = true;
        }
        if self.dead {
            return Err(io::Error::new(io::ErrorKind::ConnectionAborted, "the control plane stopped serving"));
        }
        Ok(())
    }
}

impl Connected for TlsConn {
    type ConnectInfo = TcpConnectInfo;
    fn connect_info(&self) -> TcpConnectInfo {
        self.info.clone()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
