//! One inbound CONNECT stream: validate in docs/protocols.md order, ask the
//! handler for the upstream, answer, copy, record.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Poll};

use futures_util::future::{self, Either, FutureExt};
use h2::server::SendResponse;
use h2::RecvStream;
use http::request::Parts;
use http::{Method, Request, Response, StatusCode};
use slipstream_core::SpiffeId;
use tokio::time::Instant;

use super::handler::{ConnectionContext, Handler, InboundRequest, StreamRecord, Upstream};
use super::stats::ServerStats;
use crate::authority::parse_authority;
use crate::chunk::Chunk;
use crate::copy::{self, CopyStats};
use crate::error::HboneError;
use crate::stream::TunnelStream;

/// What every stream of one connection shares.
pub(crate) struct ConnContext {
    pub peer_identity: SpiffeId,
    pub peer_addr: SocketAddr,
    pub tunnel_local: SocketAddr,
    pub handler: Arc<dyn Handler>,
    pub stats: Arc<ServerStats>,
    pub proxy_ports: Arc<[u16]>,
    /// What the handler's admission gave this connection.
    pub context: Option<ConnectionContext>,
}

/// Serves one CONNECT stream to its end.
///
/// Built from combinators, not as an `async fn`: the future is the task's
/// allocation for the whole life of a tunnel, and an async fn keeps its
/// arguments (the request and its headers, the response handle) and every
/// moved-from local in its state. Here the opening runs boxed and is freed
/// once the tunnel is up; what stays is the copy and what the record needs
/// (see the size test in this module).
pub(crate) fn serve_stream(
    ctx: Arc<ConnContext>,
    request: Request<RecvStream>,
    respond: SendResponse<Chunk>,
) -> impl Future<Output = ()> + Send + 'static {
    let start = Instant::now();
    ctx.stats.stream();
    Box::pin(open(ctx.clone(), request, respond, start)).then(move |opened| {
        let Some((target, tunnel, mut upstream)) = opened else {
            return Either::Right(Either::Left(future::ready(())));
        };
        if let Some(serve) = upstream.serve_in_place() {
            drop(upstream);
            let served = serve(tunnel).map(move |()| {
                ctx.stats.tunnel_finished(0, 0, false);
                let outcome = Outcome { status: StatusCode::OK, bytes: CopyStats::default(), result: Ok(()), reached_handler: true };
                finish(&ctx, Some(target), outcome, start);
            });
            return Either::Right(Either::Right(served));
        }
        let budget = upstream.buffer_budget();
        let mut copy = copy::bidirectional_within(tunnel, upstream, budget);
        // The upstream may ask for the tunnel to close whatever the copy
        // waits for (a stalled peer, a half-closed side): raced here.
        Either::Left(future::poll_fn(move |cx| {
            let (bytes, result) = match copy.other_mut().poll_close(cx) {
                Poll::Ready(()) => (copy.stats(), Err(HboneError::io(std::io::ErrorKind::ConnectionAborted.into()))),
                Poll::Pending => ready!(Pin::new(&mut copy).poll(cx)),
            };
            copy.other_mut().finished(&result);
            ctx.stats.tunnel_finished(bytes.from_tunnel, bytes.to_tunnel, result.is_err());
            let outcome = Outcome { status: StatusCode::OK, bytes, result, reached_handler: true };
            finish(&ctx, Some(target), outcome, start);
            Poll::Ready(())
        }))
    })
}

/// Validates, asks the handler to connect, answers 200. `None` when the
/// stream was refused or failed (already answered and recorded).
async fn open(
    ctx: Arc<ConnContext>,
    request: Request<RecvStream>,
    mut respond: SendResponse<Chunk>,
    start: Instant,
) -> Option<(SocketAddr, TunnelStream, Box<dyn Upstream>)> {
    let ctx = &*ctx;
    let (parts, body) = request.into_parts();

    let target = match validate(&parts, ctx) {
        Ok(target) => target,
        Err((target, err)) => {
            refuse(ctx, &mut respond, target, err, start, false);
            return None;
        }
    };

    let inbound = InboundRequest {
        peer_identity: ctx.peer_identity.clone(),
        peer_addr: ctx.peer_addr,
        tunnel_local: ctx.tunnel_local,
        target,
        headers: parts.headers,
        context: ctx.context.clone(),
    };
    let upstream = match ctx.handler.connect(&inbound).await {
        Ok(upstream) => upstream,
        Err(err) => {
            refuse(ctx, &mut respond, Some(target), err, start, true);
            return None;
        }
    };

    // Only now that the application accepted: 200, then bytes.
    let send = match respond.send_response(status_only(StatusCode::OK), false) {
        Ok(send) => send,
        Err(e) => {
            // The peer reset the stream while we were connecting.
            let err = HboneError::H2(Arc::new(e));
            let outcome = Outcome { status: StatusCode::OK, bytes: CopyStats::default(), result: Err(err), reached_handler: true };
            finish(ctx, Some(target), outcome, start);
            return None;
        }
    };
    ctx.stats.answered(StatusCode::OK);
    Some((target, TunnelStream::new(send, body, None), upstream))
}

/// The checks of docs/protocols.md section 2 that need no handler, in order:
/// method, authority syntax, authority IP vs. the tunnel's IP, proxy ports.
/// On failure also returns the target if it was parsed, for the record.
fn validate(parts: &Parts, ctx: &ConnContext) -> Result<SocketAddr, (Option<SocketAddr>, HboneError)> {
    if parts.method != Method::CONNECT {
        return Err((None, HboneError::BadRequest("method is not CONNECT")));
    }
    // A plain CONNECT has only :method and :authority; h2 already rejects
    // :scheme/:path on CONNECT, this keeps the contract explicit.
    if parts.uri.scheme().is_some() || parts.uri.path_and_query().is_some() {
        return Err((None, HboneError::BadRequest("CONNECT with :scheme or :path")));
    }
    let target = parts
        .uri
        .authority()
        .and_then(|a| parse_authority(a.as_str()))
        .ok_or((None, HboneError::BadRequest("authority is not <ip>:<port>")))?;
    // A dual-stack listener may see IPv4 destinations as IPv4-mapped IPv6.
    let tunnel_ip = ctx.tunnel_local.ip().to_canonical();
    if target.ip().to_canonical() != tunnel_ip && !ctx.handler.accepts_foreign_target(ctx.tunnel_local, target) {
        return Err((Some(target), HboneError::AuthorityMismatch { authority: target, tunnel: tunnel_ip }));
    }
    // Tunnelling into the proxy's own ports would loop or bypass policy.
    if ctx.proxy_ports.contains(&target.port()) {
        return Err((Some(target), HboneError::ProxyPort(target.port())));
    }
    Ok(target)
}

fn refuse(
    ctx: &ConnContext,
    respond: &mut SendResponse<Chunk>,
    target: Option<SocketAddr>,
    err: HboneError,
    start: Instant,
    reached_handler: bool,
) {
    let status = err.response_code();
    tracing::debug!(peer = %ctx.peer_identity, ?target, %status, error = %err, "CONNECT refused");
    // HEADERS with END_STREAM; fails only if the peer already reset.
    let mut response = status_only(status);
    if let Some(secs) = err.retry_after() {
        response.headers_mut().insert(http::header::RETRY_AFTER, http::HeaderValue::from(secs));
    }
    let _ = respond.send_response(response, true);
    ctx.stats.answered(status);
    let outcome = Outcome { status, bytes: CopyStats::default(), result: Err(err), reached_handler };
    finish(ctx, target, outcome, start);
}

/// How a stream ended, for its record.
struct Outcome {
    status: StatusCode,
    bytes: CopyStats,
    result: Result<(), HboneError>,
    reached_handler: bool,
}

fn finish(ctx: &ConnContext, target: Option<SocketAddr>, outcome: Outcome, start: Instant) {
    ctx.handler.on_stream_end(&StreamRecord {
        peer_identity: ctx.peer_identity.clone(),
        peer_addr: ctx.peer_addr,
        tunnel_local: ctx.tunnel_local,
        target,
        status: outcome.status,
        bytes: outcome.bytes,
        duration: start.elapsed(),
        result: outcome.result,
        reached_handler: outcome.reached_handler,
    });
}

fn status_only(status: StatusCode) -> Response<()> {
    let mut response = Response::new(());
    *response.status_mut() = status;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size_of_future<A, B, C, F>(_: fn(A, B, C) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    #[test]
    fn the_future_of_an_open_tunnel_stays_small() {
        // 10k open tunnels hold 10k of these (an async fn was 896 bytes).
        let size = size_of_future(serve_stream);
        println!("serve_stream: {size} bytes");
        assert!(size <= 384, "{size} bytes");
    }
}
