//! Bodies sent more than once: held whole for a retry or a mirror, within
//! the waypoint's replay budget and the client's share of it, and the
//! mirrored copies themselves.

use crate::body::{full, ReqBody};
use crate::call::Call;
use bytes::Bytes;
use http::header::{HeaderValue, HOST};
use http::{HeaderMap, Request};
use http_body_util::BodyExt;
use slipstream_core::route::Backend;

/// The largest body held in memory to be sent more than once (to a
/// mirror, or again on a retry). A request with a larger (or streamed)
/// body is forwarded once, without mirror or retry, and the access log
/// says so.
pub const REPLAY_BODY_LIMIT: u64 = 1 << 20;

/// How long a mirrored request may take: its answer is dropped anyway,
/// and what it holds (its body) must not outlive a slow mirror for long.
const MIRROR_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// The budget a replayed body is held under: the permit of the whole
/// waypoint's and the client's own share.
pub type Held = (tokio::sync::OwnedSemaphorePermit, crate::fair::Share);

/// Why a body could not be read whole to be replayed.
pub enum NotHeld {
    /// Too large, streamed, or over a budget: sent once as it comes.
    Stream(Box<ReqBody>),
    /// The client stopped sending it (the request-body timeout).
    Stalled,
}

/// `kib` of the replay budget for `client`: its own share first (one
/// client cannot hold the budget every client's retries and mirrors draw
/// on), then the whole waypoint's. Ok(None) for an empty body.
fn take_budget(call: &Call<'_>, kib: u32) -> Result<Option<Held>, ()> {
    if kib == 0 {
        return Ok(None);
    }
    let shared = call.shared;
    let share = shared.replay_shares.take(call.peer.addr.ip(), kib).ok_or(())?;
    let permit = shared.replay_budget.clone().try_acquire_many_owned(kib).map_err(|_| ())?;
    Ok(Some((permit, share)))
}

/// The body, read whole when it is at most [`REPLAY_BODY_LIMIT`], its
/// length is known (or it is already complete) and the replay budget has
/// room for it (what it holds of the budget given with it, to be kept
/// until the request is done); otherwise given back.
pub async fn hold(call: &Call<'_>, headers: &HeaderMap, body: ReqBody) -> Result<(Bytes, Option<Held>), NotHeld> {
    let length = headers.get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let chunked = headers.contains_key(http::header::TRANSFER_ENCODING);
    let small = match length {
        Some(n) => n <= REPLAY_BODY_LIMIT,
        None => !chunked && hyper::body::Body::is_end_stream(&body),
    };
    if !small {
        return Err(NotHeld::Stream(Box::new(body)));
    }
    let kib = length.unwrap_or(0).div_ceil(1024) as u32;
    let Ok(permit) = take_budget(call, kib) else { return Err(NotHeld::Stream(Box::new(body))) };
    let collect = http_body_util::Limited::new(body, REPLAY_BODY_LIMIT as usize).collect();
    let bytes = tokio::select! {
        r = collect => match r {
            Ok(c) => c.to_bytes(),
            // The client broke off: nothing to forward either.
            Err(_) => Bytes::new(),
        },
        () = call.activity.stalled(call.shared.settings.fairness.request_body_timeout) => return Err(NotHeld::Stalled),
    };
    Ok((bytes, permit))
}

/// `Host` as Envoy writes it for a mirror: the name suffixed `-shadow`.
fn shadow_host(host: &str) -> String {
    match host.rsplit_once(':') {
        Some((name, port)) => format!("{name}-shadow:{port}"),
        None => format!("{host}-shadow"),
    }
}

/// RequestMirror: a copy of the request to each mirror backend (one of its
/// endpoints, of its subset if it names one), `Host` suffixed `-shadow` as
/// Envoy does, its answer discarded. Each copy takes its body's share of
/// the replay budget until it is done (at most [`MIRROR_TIMEOUT`]): a slow
/// mirror cannot make the waypoint hold more than the budget; past it, the
/// copy is not sent.
pub fn mirror(call: &Call<'_>, mirrors: &[Backend], parts: &http::request::Parts, path_and_query: &str, bytes: &Bytes) {
    let (shared, state, peer) = (call.shared, call.state, call.peer);
    for m in mirrors {
        let Some(svc) = state.service(&m.service) else { continue };
        let mut eps = state.endpoints(&svc, m.port);
        if let Some(s) = &m.subset {
            eps.retain(|e| s.workloads.binary_search(&e.workload.uid).is_ok());
        }
        let Some(ep) = slipstream_core::MeshState::pick(&eps, rand::random()) else { continue };
        let addr = std::net::SocketAddr::new(ep.workload.address(), ep.target_port);
        // A copy is a request to that endpoint too: its own policies and
        // the source's egress decide it, as for the original.
        if shared.source_egress(state, peer, addr).is_err()
            || shared.authorize_endpoint(state, &ep.workload, addr, call.caller, Some((&call.view, call.host)), "-").is_err()
        {
            continue;
        }
        let Ok(uri) = http::Uri::try_from(path_and_query) else { continue };
        // The client's own bound of copies in flight, then its share of
        // the bodies held and the whole waypoint's.
        let client = peer.addr.ip();
        let Some(copy) = shared.mirror_shares.take(client, 1) else {
            tracing::debug!(peer = %client, "mirror not sent: the client has its bound of copies in flight");
            continue;
        };
        let Ok(permit) = take_budget(call, (bytes.len() as u64).div_ceil(1024) as u32) else { continue };
        let mut req = Request::new(full(bytes.clone()));
        *req.method_mut() = parts.method.clone();
        *req.uri_mut() = uri;
        *req.version_mut() = parts.version;
        *req.headers_mut() = parts.headers.clone();
        if let Some(h) = parts.headers.get(HOST).and_then(|v| v.to_str().ok()) {
            if let Ok(v) = HeaderValue::try_from(shadow_host(h)) {
                req.headers_mut().insert(HOST, v);
            }
        }
        let client = shared.client.clone();
        tokio::spawn(async move {
            let _held = (permit, copy);
            let _ = tokio::time::timeout(MIRROR_TIMEOUT, async move {
                if let Ok(resp) = client.send(addr, req).await {
                    let _ = resp.into_body().collect().await;
                }
            })
            .await;
        });
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_mirrors_host_is_the_shadow_of_the_requests() {
        for (host, shadow) in [("reviews", "reviews-shadow"), ("reviews:9080", "reviews-shadow:9080"), ("", "-shadow")] {
            assert_eq!(super::shadow_host(host), shadow);
        }
    }
}
