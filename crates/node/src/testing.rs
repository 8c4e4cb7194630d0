//! The in-process test tier's sockets: every pod is an address of its own in
//! 127.0.0.0/8, its three listeners bind there (`<pod IP>:15001`, `:15006`,
//! `:15008`), and there is no capture: a test that plays a pod's app
//! connects to the pod's listener with [`LoopbackFactory::connect_captured`]
//! and says which original destination capture would have recorded. No
//! root, no namespaces: the inbound and outbound paths, real TLS included,
//! run in one test process.

use crate::sockets::{connect, listen_on, Listener, OriginalDst, PodSockets, SocketFactory};
use futures_util::future::BoxFuture;
use slipstream_core::abi::{HBONE_PORT, INBOUND_PLAINTEXT_PORT, OUTBOUND_PORT};
use slipstream_core::sync::LockExt;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// Original destinations by the client's address, as capture would record.
type Redirects = Arc<Mutex<HashMap<SocketAddr, SocketAddr>>>;

#[derive(Debug, Clone, Default)]
pub struct LoopbackFactory {
    redirects: Redirects,
}

impl LoopbackFactory {
    /// Connects from `pod_ip` (its app) to the pod's `which` listener as if
    /// capture had redirected a connection to `original_dst` there.
    pub async fn connect_captured(&self, pod_ip: IpAddr, which: Listener, original_dst: SocketAddr) -> io::Result<TcpStream> {
        let s = TcpSocket::new_v4()?;
        s.bind(SocketAddr::new(pod_ip, 0))?;
        self.redirects.locked().insert(s.local_addr()?, original_dst);
        s.connect(SocketAddr::new(pod_ip, port(which))).await
    }

    /// Connects from `src_ip` (an app outside the mesh, or a peer) to a
    /// pod's plaintext listener, as capture would for `original_dst`.
    pub async fn connect_plaintext(&self, src_ip: IpAddr, pod_ip: IpAddr, original_dst: SocketAddr) -> io::Result<TcpStream> {
        let s = TcpSocket::new_v4()?;
        s.bind(SocketAddr::new(src_ip, 0))?;
        self.redirects.locked().insert(s.local_addr()?, original_dst);
        s.connect(SocketAddr::new(pod_ip, INBOUND_PLAINTEXT_PORT)).await
    }
}

fn port(which: Listener) -> u16 {
    match which {
        Listener::Outbound => OUTBOUND_PORT,
        Listener::Plaintext => INBOUND_PLAINTEXT_PORT,
        Listener::Hbone => HBONE_PORT,
    }
}

impl SocketFactory for LoopbackFactory {
    fn for_pod(&self, _netns: &Path, ip: IpAddr) -> io::Result<Arc<dyn PodSockets>> {
        if !ip.is_loopback() {
            return Err(io::Error::other(format!("the loopback tier needs pods on 127.0.0.0/8, not {ip}")));
        }
        Ok(Arc::new(LoopbackPod { ip, redirects: self.redirects.clone() }))
    }
}

struct LoopbackPod {
    ip: IpAddr,
    redirects: Redirects,
}

fn tcp() -> io::Result<Socket> {
    let s = Socket::new(Domain::IPV4, Type::STREAM.nonblocking(), Some(Protocol::TCP))?;
    s.set_tcp_nodelay(true)?;
    Ok(s)
}

/// A socket bound to `src` (any 127.0.0.0/8 address is local: no
/// IP_TRANSPARENT needed to appear as another pod).
fn bound(src: IpAddr) -> io::Result<Socket> {
    let s = tcp()?;
    s.bind(&SockAddr::from(SocketAddr::new(src, 0)))?;
    Ok(s)
}

impl PodSockets for LoopbackPod {
    fn listen(&self, which: Listener) -> io::Result<TcpListener> {
        let addr = SocketAddr::new(self.ip, port(which));
        listen_on(tcp()?, addr)
    }

    fn connect_marked(&self, dst: SocketAddr, timeout: Duration) -> BoxFuture<'static, io::Result<TcpStream>> {
        let s = bound(self.ip);
        Box::pin(async move { connect(s?, dst, timeout).await })
    }

    fn connect_transparent(&self, src: IpAddr, dst: SocketAddr, timeout: Duration) -> BoxFuture<'static, io::Result<TcpStream>> {
        let s = bound(src);
        Box::pin(async move { connect(s?, dst, timeout).await })
    }

    fn loopback_is_local(&self) -> bool {
        false
    }

    fn original_dst(&self, s: &TcpStream) -> io::Result<OriginalDst> {
        let peer = s.peer_addr()?;
        self.redirects
            .locked()
            .remove(&peer)
            .map(Into::into)
            .ok_or_else(|| io::Error::other(format!("the test told no original destination for {peer}")))
    }
}
