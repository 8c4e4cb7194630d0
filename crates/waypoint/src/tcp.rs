//! What is not HTTP passes through as TCP: to an endpoint of the service
//! (or the pod addressed), after the source's egress network policies,
//! with one access-log line when it closes.

use crate::flag::Flag;
use crate::peer::Peer;
use crate::plan::Target;
use crate::Shared;
use slipstream_core::MeshState;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A stream whose first bytes were already read (to sniff the protocol):
/// they are read again first.
pub struct Prefixed<T> {
    prefix: Vec<u8>,
    at: usize,
    inner: T,
}

impl<T> Prefixed<T> {
    pub fn new(prefix: Vec<u8>, inner: T) -> Self {
        Prefixed { prefix, at: 0, inner }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Prefixed<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.at < this.prefix.len() {
            let n = (this.prefix.len() - this.at).min(buf.remaining());
            buf.put_slice(&this.prefix[this.at..this.at + n]);
            this.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Prefixed<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// A stream whose reads and writes are recorded as activity: the idle
/// timeout of a connection passed through reads it.
pub struct Active<T> {
    inner: T,
    activity: Arc<crate::fair::BodyActivity>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Active<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.activity.touch();
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Active<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        r
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The endpoint a TCP connection to `target` goes to, or why none.
pub fn endpoint(state: &MeshState, target: &Target, draw: u64) -> Result<(SocketAddr, Arc<slipstream_core::MeshWorkload>), String> {
    match target {
        Target::Workload { workload, port } => Ok((SocketAddr::new(workload.address(), *port), workload.clone())),
        Target::Service { service, port } => {
            let eps = state.endpoints(service, *port);
            let ep = MeshState::pick(&eps, draw)
                .ok_or_else(|| format!("service {} has no ready endpoint for port {port}", service.hostname()))?;
            Ok((SocketAddr::new(ep.workload.address(), ep.target_port), ep.workload.clone()))
        }
    }
}

/// Whether a TCP connection from `peer` to `target`, sent to `ep`
/// (workload `w`), may go on under the configuration now: the policies
/// bound to the service (or the waypoint's own, for a pod), the source's
/// egress network policies, the endpoint's own policies, each at L4 (an
/// HTTP attribute fails closed). The refusal's text, if not.
fn allowed(shared: &Shared, target: &Target, peer: &Peer, ep: SocketAddr, w: &slipstream_core::MeshWorkload) -> Result<(), String> {
    let state = shared.mesh.load_full();
    let service_routes = shared.routes_of(target);
    let verdict = crate::plan::authorize(service_routes.as_deref(), target, shared.caller(peer), None);
    if !verdict.allowed {
        return Err(verdict.by.map(|b| format!("denied by AuthorizationPolicy {}/{}", b.namespace, b.name)).unwrap_or_default());
    }
    if let Err(d) = shared.source_egress(&state, peer, ep) {
        return Err(d.to_string());
    }
    // The endpoint's own policies, at L4 semantics (as for the service's).
    shared.authorize_endpoint(&state, w, ep, shared.caller(peer), None, "-").map_err(|by| {
        by.map(|b| format!("denied by the endpoint's policy {b}")).unwrap_or_else(|| "denied by the endpoint's policies".into())
    })
}

pub async fn passthrough<T: AsyncRead + AsyncWrite + Unpin>(shared: Arc<Shared>, target: &Target, peer: &Peer, mut client: T) {
    let start = Instant::now();
    let state = shared.mesh.load_full();
    let log = |flag: Flag, upstream: &str, dst: &str, sent: u64, received: u64, error: &str| {
        tracing::info!(
            target: slipstream_core::ACCESS_LOG_TARGET,
            protocol = "tcp",
            target = %target.name(),
            flags = flag.as_str(),
            upstream = upstream,
            bytes_sent = sent,
            bytes_received = received,
            duration_ms = start.elapsed().as_millis() as u64,
            src = %peer.identity,
            dst = dst,
            error = error,
            "connection"
        );
    };
    let (ep, w) = match endpoint(&state, target, rand::random()) {
        Ok(e) => e,
        Err(why) => return log(Flag::NoHealthyUpstream, "-", "-", 0, 0, &why),
    };
    let dst = w.identity().to_string();
    if let Err(why) = allowed(&shared, target, peer, ep, &w) {
        return log(Flag::Rbac, &ep.to_string(), &dst, 0, 0, &why);
    }
    let mut upstream = match shared.connector.open(ep).await {
        Ok(s) => s,
        Err(e) => return log(Flag::UpstreamConnectFailure, &ep.to_string(), &dst, 0, 0, &e.to_string()),
    };
    // Decided again at every configuration change: a policy that denies
    // the connection now closes it, as the node proxies do.
    let mut changes = shared.generation.subscribe();
    changes.mark_unchanged();
    // Closed once it carries nothing either way for the idle timeout: an
    // idle connection holds one of its client's streams.
    let activity = crate::fair::BodyActivity::new();
    let idle = shared.settings.fairness.tcp_idle_timeout;
    let mut client = Active { inner: &mut client, activity: activity.clone() };
    let copy = tokio::io::copy_bidirectional(&mut client, &mut upstream);
    tokio::pin!(copy);
    loop {
        tokio::select! {
            r = &mut copy => {
                return match r {
                    Ok((up, down)) => log(Flag::None, &ep.to_string(), &dst, up, down, "-"),
                    Err(e) => log(Flag::None, &ep.to_string(), &dst, 0, 0, &e.to_string()),
                };
            }
            () = activity.stalled(idle) => {
                return log(Flag::None, &ep.to_string(), &dst, 0, 0, &format!("closed: idle for {idle:?}"));
            }
            Ok(()) = changes.changed() => {
                if let Err(why) = allowed(&shared, target, peer, ep, &w) {
                    return log(Flag::Rbac, &ep.to_string(), &dst, 0, 0, &format!("closed: the configuration changed and {why}"));
                }
            }
        }
    }
}
