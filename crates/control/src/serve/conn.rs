//! One accepted connection after its TLS handshake, as tonic's server
//! takes it: the peer address (see [`peer_of`]), its slot among the open
//! connections (given back when it closes), a deadline for its first
//! authenticated call, and a kill switch (a server that stops closes what
//! its drain did not).

use crate::peer::ConnInfo;
use slipstream_core::sync::LockExt;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Open connections, in all and per peer address.
#[derive(Debug, Default)]
pub struct Slots {
    total: usize,
    per_peer: HashMap<IpAddr, usize>,
}

/// Why a connection got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    Total,
    Peer,
}

/// A slot among the open connections, given back on drop.
pub struct ConnGuard {
    slots: Arc<Mutex<Slots>>,
    peer: IpAddr,
}

impl ConnGuard {
    /// A slot, unless `max_total` are taken, or `max_per_peer` by `peer`
    /// (0: no bound per peer).
    pub fn try_new(slots: &Arc<Mutex<Slots>>, peer: IpAddr, max_total: usize, max_per_peer: usize) -> Result<ConnGuard, Full> {
        let mut s = slots.locked();
        if s.total >= max_total {
            return Err(Full::Total);
        }
        let mine = s.per_peer.entry(peer).or_default();
        if max_per_peer > 0 && *mine >= max_per_peer {
            return Err(Full::Peer);
        }
        *mine += 1;
        s.total += 1;
        Ok(ConnGuard { slots: slots.clone(), peer })
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        let mut s = self.slots.locked();
        s.total -= 1;
        if let Some(n) = s.per_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                s.per_peer.remove(&self.peer);
            }
        }
    }
}

pub struct TlsConn {
    io: tokio_rustls::server::TlsStream<TcpStream>,
    info: ConnInfo,
    /// Until a call on it has authenticated: when the connection is closed
    /// if none has (a pod that connects and waits holds no slot for long).
    auth_deadline: Option<(Pin<Box<tokio::time::Sleep>>, Duration)>,
    /// Completes when the server kills its connections (or is gone).
    killed: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// Why it is closed, once it is (`killed` must not be polled again).
    dead: Option<String>,
    _slot: ConnGuard,
}

impl TlsConn {
    pub fn new(
        io: tokio_rustls::server::TlsStream<TcpStream>,
        local: Option<SocketAddr>,
        peer: SocketAddr,
        slot: ConnGuard,
        mut kill: watch::Receiver<bool>,
        auth_timeout: Duration,
    ) -> TlsConn {
        let killed = Box::pin(async move {
            let _ = kill.wait_for(|k| *k).await;
        });
        let info = ConnInfo::new(TcpConnectInfo { local_addr: local, remote_addr: Some(peer) });
        let auth_deadline = Some((Box::pin(tokio::time::sleep(auth_timeout)), auth_timeout));
        TlsConn { io, info, auth_deadline, killed, dead: None, _slot: slot }
    }

    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if self.dead.is_none() && self.killed.as_mut().poll(cx).is_ready() {
            self.dead = Some("the control plane stopped serving".into());
        }
        if self.info.is_authenticated() {
            self.auth_deadline = None;
        }
        if let Some((deadline, after)) = &mut self.auth_deadline {
            if self.dead.is_none() && deadline.as_mut().poll(cx).is_ready() {
                tracing::debug!(peer = ?self.info.tcp.remote_addr, "control plane port: closing a connection with no authenticated call after {after:?}");
                self.dead = Some(format!("no authenticated call within {after:?}"));
            }
        }
        match &self.dead {
            Some(why) => Err(io::Error::new(io::ErrorKind::ConnectionAborted, why.clone())),
            None => Ok(()),
        }
    }
}

impl Connected for TlsConn {
    type ConnectInfo = ConnInfo;
    fn connect_info(&self) -> ConnInfo {
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
