//! The accept loop every app serves HTTP with.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

use super::access_log::{AccessLog, RequestLine};
use super::Body;
use crate::net::canonical;

/// The two ends of the TCP connection a request arrived on, as the server's
/// socket saw them (IPv4-mapped addresses shown as plain IPv4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnInfo {
    /// The client's address: with the mesh, this must be the client pod's IP.
    pub peer: SocketAddr,
    /// The address the client connected to.
    pub local: SocketAddr,
}

/// Pause after a failed `accept` (typically EMFILE) so that a full file
/// table does not turn the loop into a busy spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Serves `handler` on every connection accepted from `listener`, speaking
/// HTTP/1.1 or HTTP/2 prior knowledge depending on the connection preface.
/// Runs until dropped; connections already accepted keep running in their own
/// tasks. A malformed request only ends its own connection.
pub(crate) async fn serve<H, F>(listener: TcpListener, log: AccessLog, handler: H)
where
    H: Fn(Request<Incoming>, ConnInfo) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // The timer enables hyper's 30 s header-read timeout, so an idle or
    // trickling client cannot pin a connection task forever.
    builder.http1().timer(TokioTimer::new()).keep_alive(true);
    builder.http2().timer(TokioTimer::new());
    let builder = Arc::new(builder);

    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                tracing::warn!("accept failed: {err}");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let local = match stream.local_addr() {
            Ok(local) => local,
            Err(err) => {
                tracing::debug!(%peer, "connection lost before it was served: {err}");
                continue;
            }
        };
        // Small request/response exchanges must not wait for Nagle.
        let _ = stream.set_nodelay(true);
        let conn = ConnInfo { peer: canonical(peer), local: canonical(local) };
        let (builder, handler, log) = (builder.clone(), handler.clone(), log.clone());
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let line = RequestLine::of(conn.peer, &req);
                let answer = handler(req, conn);
                let log = log.clone();
                async move { Ok::<_, Infallible>(log.wrap(line, answer.await)) }
            });
            if let Err(err) = builder.serve_connection(TokioIo::new(stream), service).await {
                tracing::debug!(peer = %conn.peer, "connection ended with an error: {err}");
            }
        });
    }
}
