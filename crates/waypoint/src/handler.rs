//! The HBONE side: which tunnels the waypoint accepts (those for a
//! service or pod bound to it, from a verified peer), and serving HTTP on
//! each one.

use crate::plan::{self, Target};
use crate::Shared;
use futures_util::future::BoxFuture;
use hyper_util::rt::{TokioExecutor, TokioIo};
use slipstream_core::SpiffeId;
use slipstream_hbone::{Handler, HboneError, InboundRequest, Upstream};
use std::net::SocketAddr;
use std::sync::Arc;

/// How much each direction of a tunnel buffers between the HBONE copy and
/// the HTTP server.
const TUNNEL_BUFFER: usize = 64 << 10;

pub struct WaypointHandler {
    pub(crate) shared: Arc<Shared>,
}

/// The caller of one tunnel, for every request on it.
#[derive(Debug, Clone)]
pub struct Peer {
    pub identity: SpiffeId,
    pub addr: SocketAddr,
}

impl Handler for WaypointHandler {
    fn connect<'a>(&'a self, request: &'a InboundRequest) -> BoxFuture<'a, Result<Box<dyn Upstream>, HboneError>> {
        Box::pin(async move {
            let state = self.shared.mesh.load_full();
            let target = plan::target(&state, &self.shared.me, request.target).map_err(|e| {
                tracing::info!(peer = %request.peer_identity, target = %request.target, "tunnel refused: {e}");
                HboneError::NoWorkload(request.target)
            })?;
            let peer = Peer { identity: request.peer_identity.clone(), addr: request.peer_addr };
            let (ours, theirs) = tokio::io::duplex(TUNNEL_BUFFER);
            tokio::spawn(serve(self.shared.clone(), TokioIo::new(theirs), target, peer));
            Ok(Box::new(ours) as Box<dyn Upstream>)
        })
    }

    fn accepts_foreign_target(&self, _tunnel_local: SocketAddr, target: SocketAddr) -> bool {
        plan::target(&self.shared.mesh.load(), &self.shared.me, target).is_ok()
    }
}

/// HTTP/1.1 or HTTP/2 (prior knowledge) on one tunnel, request by request.
async fn serve(shared: Arc<Shared>, io: TokioIo<tokio::io::DuplexStream>, target: Target, peer: Peer) {
    let target = Arc::new(target);
    let service = hyper::service::service_fn(move |req| crate::proxy::handle(shared.clone(), target.clone(), peer.clone(), req));
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    if let Err(e) = builder.serve_connection(io, service).await {
        tracing::debug!("tunnel's HTTP connection ended: {e}");
    }
}
