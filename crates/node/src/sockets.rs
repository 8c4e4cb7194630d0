//! Socket creation, behind one small trait: the node proxy's one seam to the
//! kernel. [`NetnsSockets`] is the real one (sockets inside the pod's
//! network namespace, marked or transparent, the original destination of a
//! captured connection; needs root). [`crate::testing::LoopbackFactory`] is
//! the in-process test tier's: plain loopback sockets, original
//! destinations told by the test, no root.

use crate::sys::netns::Netns;
use futures_util::future::BoxFuture;
use slipstream_core::abi::{HBONE_PORT, INBOUND_PLAINTEXT_PORT, INPOD_MARK, OUTBOUND_PORT, PROXY_MARK};
use socket2::{Domain, SockAddr};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// The three listeners the proxy opens for each pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// Captured outbound connections: `127.0.0.1:15001` in the pod.
    Outbound,
    /// Captured plaintext inbound: `0.0.0.0:15006` in the pod.
    Plaintext,
    /// HBONE: `<pod IP>:15008` in the pod.
    Hbone,
}

/// Sockets of one pod.
pub trait PodSockets: Send + Sync + 'static {
    /// A listener of the pod. Fails at once on a port conflict, so the pod
    /// is not reported as served.
    fn listen(&self, which: Listener) -> io::Result<TcpListener>;
    /// A connection from the pod's own address that capture lets through.
    fn connect_marked(&self, dst: SocketAddr, timeout: Duration) -> BoxFuture<'static, io::Result<TcpStream>>;
    /// A connection to the pod's app that appears to come from `src`.
    fn connect_transparent(&self, src: IpAddr, dst: SocketAddr, timeout: Duration) -> BoxFuture<'static, io::Result<TcpStream>>;
    /// The destination a captured connection was addressed to, and the
    /// endpoint the datapath chose when it was a service.
    fn original_dst(&self, s: &TcpStream) -> io::Result<OriginalDst>;
    /// Whether a loopback destination is local to the pod (always, except
    /// in the in-process test tier, whose pods live in 127.0.0.0/8).
    fn loopback_is_local(&self) -> bool {
        true
    }
}

/// Makes the sockets of each pod.
pub trait SocketFactory: Send + Sync + 'static {
    fn for_pod(&self, netns: &Path, ip: IpAddr) -> io::Result<Arc<dyn PodSockets>>;
}

/// Sockets inside pods' network namespaces (in-pod mode, as ztunnel's).
/// With the eBPF datapath, `ebpf` holds its maps: where captured
/// connections were going, and where inbound capture finds the listener.
#[derive(Debug, Clone, Default)]
pub struct NetnsFactory {
    pub ebpf: Option<Arc<slipstream_ebpf::NodeMaps>>,
}

impl SocketFactory for NetnsFactory {
    fn for_pod(&self, netns: &Path, ip: IpAddr) -> io::Result<Arc<dyn PodSockets>> {
        Ok(Arc::new(NetnsSockets { netns: Netns::open(netns)?, ip, ebpf: self.ebpf.clone(), netns_cookie: Default::default() }))
    }
}

#[derive(Debug)]
pub struct NetnsSockets {
    netns: Netns,
    ip: IpAddr,
    ebpf: Option<Arc<slipstream_ebpf::NodeMaps>>,
    /// The cookie of the pod's network namespace, the key its captured
    /// connections are filed under: constant, so asked once (of the
    /// outbound listener), not once per connection.
    netns_cookie: std::sync::OnceLock<u64>,
}

impl NetnsSockets {
    fn socket(&self, addr: &SocketAddr) -> io::Result<socket2::Socket> {
        self.netns.tcp_socket(if addr.is_ipv4() { Domain::IPV4 } else { Domain::IPV6 })
    }
}

impl PodSockets for NetnsSockets {
    /// TCP_NODELAY is set here once: Linux copies it to every connection
    /// the listener accepts. The proxy relays bytes as they arrive, and
    /// Nagle would hold a small write back until the last one is acked.
    fn listen(&self, which: Listener) -> io::Result<TcpListener> {
        let addr = match which {
            Listener::Outbound => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), OUTBOUND_PORT),
            Listener::Plaintext => SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), INBOUND_PLAINTEXT_PORT),
            Listener::Hbone => SocketAddr::new(self.ip, HBONE_PORT),
        };
        let l = listen_on(self.socket(&addr)?, addr)?;
        if let (Some(_), Listener::Outbound) = (&self.ebpf, which) {
            let _ = self.netns_cookie.set(slipstream_ebpf::sys::netns_cookie(std::os::fd::AsFd::as_fd(&l))?);
        }
        if let (Some(maps), Listener::Plaintext, IpAddr::V4(ip)) = (&self.ebpf, which, self.ip) {
            // Inbound capture (tc ingress, bpf_sk_assign) finds this listener by the pod's
            // address; until it is registered, SYNs wait (dropped, retried).
            maps.register_listener(ip, &l).map_err(|e| io::Error::other(format!("registering the plaintext listener of {ip}: {e}")))?;
        }
        Ok(l)
    }

    fn connect_marked(&self, dst: SocketAddr, timeout: Duration) -> BoxFuture<'static, io::Result<TcpStream>> {
        let s = self.socket(&dst).and_then(|s| {
            s.set_mark(PROXY_MARK)?;
            s.set_tcp_nodelay(true)?;
            Ok(s)
        });
        Box::pin(async move { connect(s?, dst, timeout).await })
    }

    fn connect_transparent(&self, src: IpAddr, dst: SocketAddr, timeout: Duration) -> BoxFuture<'static, io::Result<TcpStream>> {
        let s = self.socket(&dst).and_then(|s| {
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
            Ok(s)
        });
        Box::pin(async move { connect(s?, dst, timeout).await })
    }

    fn original_dst(&self, s: &TcpStream) -> io::Result<OriginalDst> {
        if let Some(maps) = &self.ebpf {
            let local = s.local_addr()?;
            return Ok(if local.port() == OUTBOUND_PORT && local.ip().is_loopback() {
                // Steered at connect(): filed under (namespace, client
                // address and port), so only that client's entry is found.
                let cookie = match self.netns_cookie.get() {
                    Some(c) => *c,
                    None => slipstream_ebpf::sys::netns_cookie(std::os::fd::AsFd::as_fd(s))?,
                };
                let peer = match s.peer_addr()? {
                    std::net::SocketAddr::V4(p) => Some(p),
                    std::net::SocketAddr::V6(p) => p.ip().to_ipv4_mapped().map(|ip| std::net::SocketAddrV4::new(ip, p.port())),
                };
                match peer.and_then(|p| maps.take_original_dst(cookie, p)) {
                    Some(d) => OriginalDst { dialed: d.dialed.into(), endpoint: d.endpoint.map(Into::into) },
                    // Not steered: the app dialed the listener itself (the
                    // self-call check refuses it), unless conntrack knows
                    // better (a pod on nftables capture).
                    None => conntrack_original_dst(s).unwrap_or(local).into(),
                }
            } else if local.port() != INBOUND_PLAINTEXT_PORT {
                // Assigned to the listener at tc ingress: the accepted
                // socket keeps the address the client dialed.
                local.into()
            } else {
                // Redirected by nftables (a pod on nftables capture), or
                // 15006 dialed itself (the self-call check refuses it).
                conntrack_original_dst(s).unwrap_or(local).into()
            });
        }
        conntrack_original_dst(s).map(Into::into)
    }
}

/// Where a captured connection was going.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OriginalDst {
    /// The address the app dialed (a service's, for a service).
    pub dialed: SocketAddr,
    /// The ready endpoint the eBPF datapath chose at connect() when the app
    /// dialed a service; a preference the planner honours if its own view
    /// holds that endpoint ready.
    pub endpoint: Option<SocketAddr>,
}

impl From<SocketAddr> for OriginalDst {
    fn from(dialed: SocketAddr) -> Self {
        OriginalDst { dialed, endpoint: None }
    }
}

/// Accept queue length asked of the kernel (capped by net.core.somaxconn).
const LISTEN_BACKLOG: i32 = 4096;

/// The destination nftables' redirect rewrote (SO_ORIGINAL_DST).
fn conntrack_original_dst(s: &TcpStream) -> io::Result<SocketAddr> {
    let sock = socket2::SockRef::from(s);
    let a = if s.local_addr()?.is_ipv4() { sock.original_dst_v4()? } else { sock.original_dst_v6()? };
    a.as_socket().ok_or_else(|| io::Error::other("original destination is not an IP address"))
}

/// Binds and listens with TCP_NODELAY inherited by accepted connections.
/// The accept queue is as long as the kernel allows (net.core.somaxconn,
/// 4096 by default): a pod's burst of connects waits there instead of
/// having its SYNs dropped and retried a second later.
pub(crate) fn listen_on(s: socket2::Socket, addr: SocketAddr) -> io::Result<TcpListener> {
    s.set_reuse_address(true)?;
    s.set_tcp_nodelay(true)?;
    s.bind(&SockAddr::from(addr))?;
    s.listen(LISTEN_BACKLOG)?;
    TcpListener::from_std(s.into())
}

pub(crate) async fn connect(s: socket2::Socket, dst: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let std: std::net::TcpStream = s.into();
    let sock = TcpSocket::from_std_stream(std);
    match tokio::time::timeout(timeout, sock.connect(dst)).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, format!("connect to {dst} timed out after {timeout:?}"))),
    }
}

/// Makes the close of `s` a reset (SO_LINGER 0), so the client fails at
/// once instead of seeing a clean end of stream it could mistake for an
/// empty answer. Takes effect when `s` is dropped.
pub fn reset(s: &TcpStream) {
    let _ = s.set_zero_linger();
}
