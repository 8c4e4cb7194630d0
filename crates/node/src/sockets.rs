//! Socket creation for one pod, behind one small type: listeners, marked
//! outbound connections (never captured), transparent inbound connections
//! (the app sees the client's address).

use crate::sys::netns::Netns;
use socket2::{Domain, SockAddr};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// Mark on the proxy's own outbound sockets: the pod's capture rules skip it.
pub const PROXY_MARK: u32 = 0x539;
/// Mark on transparent inbound sockets; replies are routed back to us.
pub const INPOD_MARK: u32 = 0x111;

#[derive(Debug, Clone)]
pub struct PodSockets {
    netns: Arc<Netns>,
}

impl PodSockets {
    pub fn new(netns: Netns) -> Self {
        PodSockets { netns: Arc::new(netns) }
    }

    pub fn netns_path(&self) -> &str {
        &self.netns.path
    }

    fn socket(&self, addr: &SocketAddr) -> io::Result<socket2::Socket> {
        self.netns.tcp_socket(if addr.is_ipv4() { Domain::IPV4 } else { Domain::IPV6 })
    }

    /// A listener inside the pod. Fails at once on a port conflict, so the
    /// pod is not reported as served.
    ///
    /// TCP_NODELAY is set here once: Linux copies it to every connection
    /// the listener accepts. The proxy relays bytes as they arrive, and
    /// Nagle would hold a small write back until the last one is acked.
    pub fn listen(&self, addr: SocketAddr) -> io::Result<TcpListener> {
        let s = self.socket(&addr)?;
        s.set_reuse_address(true)?;
        s.set_tcp_nodelay(true)?;
        s.bind(&SockAddr::from(addr))?;
        s.listen(1024)?;
        TcpListener::from_std(s.into())
    }

    /// A connection from the pod's own address that capture lets through.
    pub async fn connect_marked(&self, dst: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
        let s = self.socket(&dst)?;
        s.set_mark(PROXY_MARK)?;
        s.set_tcp_nodelay(true)?;
        connect(s, dst, timeout).await
    }

    /// A connection to the app that appears to come from `src` (the client
    /// pod's IP), through IP_TRANSPARENT.
    pub async fn connect_transparent(&self, src: IpAddr, dst: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
        let s = self.socket(&dst)?;
        s.set_mark(INPOD_MARK)?;
        if dst.is_ipv4() {
            s.set_ip_transparent_v4(true)?;
        } else {
            s.set_ip_transparent_v6(true)?;
        }
        s.set_tcp_nodelay(true)?;
        // The port is chosen at connect() by the 4-tuple, not at bind().
        crate::sys::sockopt::set_bind_address_no_port(&s)?;
        s.bind(&SockAddr::from(SocketAddr::new(src, 0)))?;
        connect(s, dst, timeout).await
    }
}

async fn connect(s: socket2::Socket, dst: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let std: std::net::TcpStream = s.into();
    let sock = TcpSocket::from_std_stream(std);
    match tokio::time::timeout(timeout, sock.connect(dst)).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, format!("connect to {dst} timed out after {timeout:?}"))),
    }
}

/// The destination a captured connection was addressed to (SO_ORIGINAL_DST).
pub fn original_dst(s: &TcpStream) -> io::Result<SocketAddr> {
    let sock = socket2::SockRef::from(s);
    let a = if s.local_addr()?.is_ipv4() { sock.original_dst_v4()? } else { sock.original_dst_v6()? };
    a.as_socket().ok_or_else(|| io::Error::other("original destination is not an IP address"))
}

/// Makes the close of `s` a reset (SO_LINGER 0), so the client fails at
/// once instead of seeing a clean end of stream it could mistake for an
/// empty answer. Takes effect when `s` is dropped.
pub fn reset(s: &TcpStream) {
    let _ = s.set_zero_linger();
}
